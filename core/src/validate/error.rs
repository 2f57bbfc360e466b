//! Why a Fleet Policy or a version constraint refuses a value, with the parts that make the message.

use super::q;

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    #[error("serviceAccount is required by Policy but is not set")]
    ServiceAccountRequired,
    /// `field` (`serviceAccount`, `helmSecretName`, `helm repo`, `helm chart`) is outside what the
    /// Policies allow (values or patterns).
    #[error("disallowed {field} {value}: {value} not in allowed set [{}]", allowed.join(" "))]
    Disallowed {
        field: &'static str,
        value: String,
        allowed: Vec<String>,
    },
    /// A target's own `serviceAccount` outside `allowedServiceAccounts`: the Bundle controller
    /// refuses the whole Bundle (`AuthorizeBundle`), although the HelmOp controller accepted it.
    #[error("disallowed serviceAccount {value} in target {target}: {value} not in allowed set [{}]", allowed.join(" "))]
    TargetServiceAccount {
        target: String,
        value: String,
        allowed: Vec<String>,
    },
    /// A Policy pattern is not a regular expression; Fleet fails the check then.
    #[error("disallowed {field} {value}: policy failed to compile regex {pattern:?}: {reason}")]
    PolicyRegex {
        field: &'static str,
        value: String,
        pattern: String,
        reason: String,
    },
    #[error("{} is not a version number or one of x, X, *", q(part))]
    NotAVersionNumber { part: String },
    #[error("version number {part} is too large")]
    VersionNumberTooLarge { part: String },
    #[error("pre-release {} has a numeric identifier with a leading zero", q(pre))]
    LeadingZero { pre: String },
}
