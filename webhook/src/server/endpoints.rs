//! The admission endpoints, what decides them ([`Handlers`]) and the deadline a decision must fit in.

use futures::future::BoxFuture;

use crate::admission::Request as AdmissionRequest;
use crate::verdict::Verdict;

tokio::task_local! {
    /// The deadline of the admission being decided, so handlers can fit their own stages into it.
    pub(super) static DEADLINE: tokio::time::Instant;
}

/// The deadline of the admission request the calling task is deciding (`None` outside one, e.g. in
/// unit tests that call a handler directly). A handler that finishes by then answers itself instead
/// of leaving the answer to [`Webhook::undecided`].
pub fn request_deadline() -> Option<tokio::time::Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

pub use crate::endpoint::Webhook;

/// The decision logic behind the endpoints.
pub trait Handlers: Send + Sync + 'static {
    /// Decides one admission request.
    fn review<'a>(&'a self, webhook: Webhook, req: &'a AdmissionRequest) -> BoxFuture<'a, Verdict>;

    /// True once everything needed to answer correctly is loaded (caches synced); drives `/readyz`.
    fn ready(&self) -> bool;
}
