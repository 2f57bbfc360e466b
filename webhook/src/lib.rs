//! `helmop-webhook`: the admission webhook of helmop as a library, so tests and the benchmark can run the real
//! serving stack in-process. `main.rs` only parses the command line and calls [`app::run`].

pub mod admission;
pub mod app;
pub mod bootstrap;
pub mod caps;
pub mod cli;
pub mod config;
pub mod endpoint;
pub mod error;
pub mod handlers;
pub mod images;
pub mod metrics;
pub mod server;
pub mod span_fields;
pub mod state;
pub mod tls;
pub mod verdict;

pub use error::{Error, Result};
pub use metrics::Metrics;
pub use server::{Handlers, ServeOptions, Server, Webhook};
pub use verdict::Verdict;
