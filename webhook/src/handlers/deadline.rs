//! When a handler's own lookups must stop so that it, not the server's deadline, answers.

use std::time::Duration;

use crate::server::request_deadline;

/// Time kept back from the admission's deadline for assembling and sending the answer: the stages
/// stop this much earlier, so the handler answers itself (keeping what it could not recompute, or
/// admitting a spec-unchanged HelmOp) rather than letting the deadline answer without any patch.
pub(super) const ANSWER_RESERVE: Duration = Duration::from_millis(250);

/// When the stages must be done for an admission due at `request`: the answer reserve earlier, but
/// never before `now` (a late request still gets its stages tried at once, each then falling back to
/// what it can answer without them).
pub(super) fn stages_deadline(
    request: tokio::time::Instant,
    now: tokio::time::Instant,
) -> tokio::time::Instant {
    request
        .checked_sub(ANSWER_RESERVE)
        .unwrap_or(request)
        .max(now)
}

/// The stages deadline of the admission being decided (`None` outside a request: unit tests).
pub(super) fn current() -> Option<tokio::time::Instant> {
    request_deadline().map(|d| stages_deadline(d, tokio::time::Instant::now()))
}

/// `future`, or `None` when the stages deadline comes first.
pub(super) async fn within<F: std::future::Future>(
    deadline: Option<tokio::time::Instant>,
    future: F,
) -> Option<F::Output> {
    match deadline {
        Some(at) => tokio::time::timeout_at(at, future).await.ok(),
        None => Some(future.await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_end_before_the_request_deadline_but_not_before_now() {
        let now = tokio::time::Instant::now();
        let request = now + Duration::from_secs(4);
        assert_eq!(stages_deadline(request, now), request - ANSWER_RESERVE);
        let late = now + ANSWER_RESERVE / 2;
        assert_eq!(stages_deadline(late, now), now);
    }

    #[tokio::test]
    async fn within_gives_up_at_the_deadline() {
        let at = tokio::time::Instant::now() + Duration::from_millis(10);
        let slow = tokio::time::sleep(Duration::from_secs(60));
        assert_eq!(within(Some(at), slow).await, None);
        assert_eq!(within(None, async { 7 }).await, Some(7));
    }
}
