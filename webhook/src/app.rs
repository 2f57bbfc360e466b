//! Production wiring: logging, the cluster client, the live handlers and the server.

use std::sync::Arc;

use futures::future::BoxFuture;

use crate::admission::Request;
use crate::cli::{Cli, LogFormat};
use crate::config::ImageMode;
use crate::error::Result;
use crate::handlers;
use crate::images::registry::RegistrySettings;
use crate::images::{ImageResolver, NoImages, RegistryResolver};
use crate::metrics::Metrics;
use crate::server::{self, Handlers, Server, Webhook};
use crate::state::{AppState, Options};
use crate::verdict::Verdict;

impl Handlers for AppState {
    fn review<'a>(&'a self, webhook: Webhook, req: &'a Request) -> BoxFuture<'a, Verdict> {
        match webhook {
            Webhook::Helmops => Box::pin(handlers::validate_helmop(self, req)),
            Webhook::References => Box::pin(handlers::guard_reference(self, req)),
            Webhook::Workloads => Box::pin(handlers::mutate_workload(self, req)),
        }
    }

    fn ready(&self) -> bool {
        AppState::ready(self)
    }
}

/// Logs to stderr, one JSON object (or text line) per event; `RUST_LOG` filters (default `info`).
pub fn init_tracing(format: LogFormat) {
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    init_tracing_to(format, std::io::stderr, ansi);
}

/// [`init_tracing`] to another writer (the tests read what an admission logs).
pub fn init_tracing_to<W>(format: LogFormat, writer: W, ansi: bool)
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let mut filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // kube's client would log response bodies it cannot parse, Secret data included.
    for directive in helmop_core::text::LOG_DIRECTIVES {
        if let Ok(d) = directive.parse() {
            filter = filter.add_directive(d);
        }
    }
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(writer);
    // A second initialisation (tests) keeps the first subscriber.
    let _ = match format {
        // The innermost span only (an admission's: its uid, kind, namespace and object), not the list.
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .fmt_fields(crate::span_fields::SpanFields)
            .try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// Replaces the default panic message, which would print the payload (an `expect` on a serde error can carry
/// object data), with the location and only literal payloads.
pub fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let message = info
            .payload()
            .downcast_ref::<&'static str>()
            .copied()
            .unwrap_or("(formatted message withheld)");
        tracing::error!(location = %location, message, "panic");
    }));
}

/// Runs the webhook until SIGTERM/SIGINT.
pub async fn run(cli: Cli) -> Result<()> {
    let metrics = Metrics::new();
    let client = kube::Client::try_default().await?;
    let config = cli.config();
    // With `--image-mode off` no resolver exists: annotations may lower the mode, never raise it, so nothing
    // would ever reach a registry. The registry config is still read, so a broken one fails at start.
    let images: Arc<dyn ImageResolver> = if config.image_mode == ImageMode::Off {
        if let Some(path) = &config.registry_config {
            RegistrySettings::load(path)?;
        }
        Arc::new(NoImages)
    } else {
        Arc::new(RegistryResolver::new(&config, &metrics)?)
    };
    let options = Options {
        digest_cache_entries: cli.digest_cache_entries,
        max_live_gets: usize::try_from(cli.max_live_gets).unwrap_or(usize::MAX),
        images,
    };
    let state = AppState::start_with(client, config, &metrics, options).await?;
    let server = Server::bind(cli.serve_options(), Arc::new(state), metrics).await?;
    server.run(server::shutdown_signal().await?).await
}
