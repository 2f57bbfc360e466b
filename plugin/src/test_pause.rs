//! TEST-ONLY pause points, so end-to-end tests can act at an exact moment of a run (create an
//! object between observation and write, SIGKILL a run between its copy writes and its
//! restamps). Inert unless the environment variable `HELMOP_TEST_PAUSE` is set to
//! `POINT:FILE`; then, on reaching `POINT` for a cluster, the run prints
//! `helmop-test: paused at POINT on CLUSTER` on stderr and waits until `FILE` exists. Never set
//! it outside tests.
//!
//! Points: `after-plan` (a cluster observed and planned, nothing written yet), `before-restamp`
//! (a cluster's copies written, no workload restamped yet), `before-watches` (`propagate --watch`
//! started and printed its `started` event, its watches not started: not ready yet),
//! `prune-after-list` (prune listed the HelmOps and sources, no cluster observed yet),
//! `prune-after-plan` (a cluster observed and planned by prune, nothing written there yet),
//! `rollout-before-restamp` (the rollout watcher decided a restamp, not sent yet).

use std::path::PathBuf;
use std::time::Duration;

/// The environment variable naming the pause point and the file that releases it.
pub const ENV: &str = "HELMOP_TEST_PAUSE";

/// Waits at `point` (reached while working on `cluster`) when the test hook asks for it;
/// returns at once otherwise.
pub async fn pause(point: &str, cluster: &str) {
    let Some(file) = wanted(point) else {
        return;
    };
    eprintln!("helmop-test: paused at {point} on {cluster}");
    while !file.exists() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn wanted(point: &str) -> Option<PathBuf> {
    let value = std::env::var(ENV).ok()?;
    let (p, file) = value.split_once(':')?;
    (p == point && !file.is_empty()).then(|| PathBuf::from(file))
}
