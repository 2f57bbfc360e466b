//! The plugin's error type and its exit codes (0 ok, 1 invalid or denied, 2 partial failure, 3
//! upstream unreachable).

use std::process::ExitCode;

/// The exit codes: 0 all good, 1 invalid input or denied, 2 partial failure, 3 could not
/// reach the upstream cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitStatus {
    Ok = 0,
    Invalid = 1,
    Partial = 2,
    Unreachable = 3,
}

impl From<ExitStatus> for ExitCode {
    fn from(s: ExitStatus) -> Self {
        ExitCode::from(s as u8)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
    #[error("cannot encode output: {0}")]
    Encode(#[from] serde_json::Error),
    /// A command line that parses but makes no sense (exit 1).
    #[error("{0}")]
    Usage(String),
    /// No usable kubeconfig or in-cluster configuration (exit 1).
    #[error("kubeconfig: {0}")]
    Kubeconfig(String),
    /// The upstream cluster answered but refused or lacks something (exit 1).
    #[error("upstream cluster: {0}")]
    Upstream(String),
    /// The upstream cluster could not be reached (exit 3).
    #[error("cannot reach the upstream cluster: {0}")]
    UpstreamUnreachable(String),
}

impl PluginError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            PluginError::Output(_)
            | PluginError::Encode(_)
            | PluginError::Usage(_)
            | PluginError::Kubeconfig(_)
            | PluginError::Upstream(_) => ExitStatus::Invalid,
            PluginError::UpstreamUnreachable(_) => ExitStatus::Unreachable,
        }
    }
}
