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

/// The three admission endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Webhook {
    /// `POST /validate/helmops`: HelmOp CREATE/UPDATE.
    Helmops,
    /// `POST /validate/references`: Secret/ConfigMap DELETE guard.
    References,
    /// `POST /mutate/workloads`: hash and image stamping.
    Workloads,
}

impl Webhook {
    pub const ALL: [Webhook; 3] = [Webhook::Helmops, Webhook::References, Webhook::Workloads];

    /// The `webhook` label in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Webhook::Helmops => "helmops",
            Webhook::References => "references",
            Webhook::Workloads => "workloads",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Webhook::Helmops => "/validate/helmops",
            Webhook::References => "/validate/references",
            Webhook::Workloads => "/mutate/workloads",
        }
    }

    /// Only the mutating endpoint may send a patch.
    pub fn mutating(self) -> bool {
        self == Webhook::Workloads
    }

    /// The answer when no decision could be made in time (or the handler failed): validation fails closed (the
    /// message says why, the API server shows it), mutation fails open with a warning, matching the
    /// `failurePolicy` of each webhook configuration, so the outcome does not depend on who gave up first.
    pub fn undecided(self, reason: &str) -> Verdict {
        match self {
            Webhook::Workloads => Verdict::allow_with_warnings(vec![format!(
                "helmop webhook: {reason}; admitted without config-hash or image stamping"
            )]),
            Webhook::Helmops | Webhook::References => Verdict::Deny {
                message: format!(
                    "helmop webhook: {reason}; retry, and check the helmop-webhook logs if it persists"
                ),
                code: 500,
                warnings: Vec::new(),
            },
        }
    }
}

/// The decision logic behind the endpoints.
pub trait Handlers: Send + Sync + 'static {
    /// Decides one admission request.
    fn review<'a>(&'a self, webhook: Webhook, req: &'a AdmissionRequest) -> BoxFuture<'a, Verdict>;

    /// True once everything needed to answer correctly is loaded (caches synced); drives `/readyz`.
    fn ready(&self) -> bool;
}
