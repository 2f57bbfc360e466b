//! helmop's benchmarks and load/soak runs (`helmop-bench`, results in docs/performance.md). A library so
//! the short soak can run as an ordinary test.

pub mod baseline;
pub mod decode;
pub mod fixtures;
pub mod fleet;
pub mod foreign;
pub mod hash;
pub mod hostile;
pub mod load;
pub mod machine;
pub mod memory;
pub mod pki;
pub mod propagate;
pub mod rollout_budget;
pub mod rollout_watch;
pub mod scenarios;
pub mod soak;
pub mod stats;
pub mod watch;
pub mod webhook;
