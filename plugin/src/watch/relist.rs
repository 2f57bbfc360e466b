//! A watch that lists again after every failure.
//!
//! kube's watcher resumes a failed watch from the last `resourceVersion` it saw, without listing,
//! whenever the API server still has that version (a reset connection, a restarted proxy, an
//! API server answering 5xx for a while). Its consumers here stop trusting what they keep when a
//! watch fails (the Cluster store, the Secret read cache: events may be missing until the watch is
//! back), and only a listing makes them whole again, so a resumed watch would leave them unused for
//! the rest of the process. After a failure this stream therefore drops the watcher and starts a
//! new one, which lists first (`Init` .. `InitDone`), as client-go's informers do. Between attempts
//! it waits kube's default back-off (0.8 s doubling to 30 s, jittered, reset after 120 s without a
//! failure), so an API server that keeps failing costs one list per back-off step.

use std::fmt::Debug;

use futures::{Stream, StreamExt, stream};
use kube::runtime::watcher::{self, DefaultBackoff, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// The events of `watcher(api, config)` up to and including its first error, then those of a
/// new watcher (listing first) after a back-off step, and so on.
pub fn relisting<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    stream::unfold(
        (DefaultBackoff::default(), true),
        move |(mut backoff, first)| {
            let (api, config) = (api.clone(), config.clone());
            async move {
                if !first {
                    // The back-off never ends; its cap is the fallback all the same.
                    let wait = backoff.next().unwrap_or(MAX_WAIT);
                    tokio::time::sleep(wait).await;
                }
                Some((
                    until_failure(watcher::watcher(api, config)),
                    (backoff, false),
                ))
            }
        },
    )
    .flatten()
}

/// kube's default back-off cap.
const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// `events` up to and including the first error. `events` is never polled after its error:
/// kube's watcher retries at once when polled, and a retry that succeeds waits for the next event,
/// which on a quiet kind may never come, while the relisting this ends the attempt for waits
/// behind it.
fn until_failure<T: Send, E: Send>(
    events: impl Stream<Item = Result<T, E>> + Send,
) -> impl Stream<Item = Result<T, E>> + Send {
    stream::unfold(
        (Box::pin(events), false),
        |(mut events, failed)| async move {
            if failed {
                return None;
            }
            let event = events.next().await?;
            let failed = event.is_err();
            Some((event, (events, failed)))
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_failure_ends_the_attempt_after_it_is_delivered() {
        let events = stream::iter([Ok(1), Ok(2), Err("reset"), Ok(3), Err("again")]);
        let seen: Vec<Result<i32, &str>> = until_failure(events).collect().await;
        assert_eq!(seen, [Ok(1), Ok(2), Err("reset")]);
    }

    /// After its error the attempt's stream is not polled again: here it would never answer.
    #[tokio::test]
    async fn the_attempt_is_not_polled_after_its_failure() {
        let events = stream::iter([Ok(1), Err("reset")]).chain(stream::pending());
        let seen = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            until_failure(events).collect::<Vec<Result<i32, &str>>>(),
        )
        .await;
        assert_eq!(
            seen,
            Ok(vec![Ok(1), Err("reset")]),
            "the attempt waited for more"
        );
    }

    #[tokio::test]
    async fn an_attempt_without_failure_is_passed_whole() {
        let events = stream::iter([Ok::<_, &str>(1), Ok(2)]);
        let seen: Vec<_> = until_failure(events).collect().await;
        assert_eq!(seen, [Ok(1), Ok(2)]);
    }
}
