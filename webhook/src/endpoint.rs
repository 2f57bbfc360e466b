//! The admission endpoints: one place names each (its path, its metrics and log label, whether it
//! mutates, how it fails). Adding one is a variant here and its handler in `app.rs`.

use crate::verdict::Verdict;

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
