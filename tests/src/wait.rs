//! Polling with a deadline: the only way tests wait for the cluster to converge.

use std::future::Future;
use std::time::Duration;

use anyhow::anyhow;
use tokio::time::Instant;

/// A generous default: controllers on a loaded 2-core CI machine can take seconds.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// Calls `probe` until it returns `Ok(Some(value))` and returns that value. `Ok(None)` means
/// "not yet"; an `Err` is retried too (a server may be restarting) and reported if the deadline
/// passes.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    loop {
        match probe().await {
            Ok(Some(value)) => return Ok(value),
            Ok(None) => {}
            Err(e) => last_error = Some(e),
        }
        if Instant::now() >= deadline {
            return Err(match last_error {
                Some(e) => {
                    anyhow!("timed out after {timeout:?} waiting for {what}; last error: {e:#}")
                }
                None => anyhow!("timed out after {timeout:?} waiting for {what}"),
            });
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// [`wait_for`] for a condition without a value.
pub async fn wait_until<F, Fut>(
    what: &str,
    timeout: Duration,
    mut condition: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    wait_for(what, timeout, || {
        let fut = condition();
        async move { Ok(fut.await?.then_some(())) }
    })
    .await
}
