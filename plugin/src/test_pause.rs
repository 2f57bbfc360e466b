//! TEST-ONLY pause points, so end-to-end tests can act at an exact moment of a run (create an
//! object between observation and write, SIGKILL a run between its copy writes and its
//! restamps). Compiled in only with the cargo feature `test-hooks`, which the end-to-end build
//! enables (`./dev test`) and release builds and images never do: there, [`pause`] does nothing
//! whatever the environment says.
//!
//! With the feature, `HELMOP_TEST_PAUSE=POINT:FILE` arms one point: on reaching `POINT` for a
//! cluster, the run prints `helmop-test: paused at POINT on CLUSTER` on stderr and waits until
//! `FILE` exists. SIGTERM or SIGINT while parked ends the process (exit 143 or 130), as it would
//! a process that is not parked.
//!
//! Points: `after-plan` (a cluster observed and planned, nothing written yet), `before-restamp`
//! (a cluster's copies written, no workload restamped yet), `before-watches` (`propagate --watch`
//! started and printed its `started` event, its watches not started: not ready yet),
//! `prune-after-list` (prune listed the HelmOps and sources, no cluster observed yet),
//! `prune-after-plan` (a cluster observed and planned by prune, nothing written there yet),
//! `rollout-before-restamp` (the rollout watcher decided a restamp, not sent yet).

/// The environment variable naming the pause point and the file that releases it.
#[cfg(feature = "test-hooks")]
pub const ENV: &str = "HELMOP_TEST_PAUSE";

/// Waits at `point` (reached while working on `cluster`) when the test hook asks for it;
/// returns at once otherwise, and always without the `test-hooks` feature.
#[cfg(not(feature = "test-hooks"))]
pub async fn pause(_point: &str, _cluster: &str) {}

/// Waits at `point` (reached while working on `cluster`) when the test hook asks for it;
/// returns at once otherwise.
#[cfg(feature = "test-hooks")]
pub async fn pause(point: &str, cluster: &str) {
    let Some(file) = wanted(point) else {
        return;
    };
    eprintln!("helmop-test: paused at {point} on {cluster}");
    let released = async {
        while !file.exists() {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    tokio::select! {
        () = released => {}
        code = signalled() => std::process::exit(code),
    }
}

/// The exit code of the first SIGTERM (143) or SIGINT (130); never, where they cannot be had.
#[cfg(feature = "test-hooks")]
async fn signalled() -> i32 {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            return tokio::select! {
                _ = term.recv() => 143,
                _ = int.recv() => 130,
            };
        }
    }
    std::future::pending().await
}

#[cfg(feature = "test-hooks")]
fn wanted(point: &str) -> Option<std::path::PathBuf> {
    let value = std::env::var(ENV).ok()?;
    let (p, file) = value.split_once(':')?;
    (p == point && !file.is_empty()).then(|| std::path::PathBuf::from(file))
}
