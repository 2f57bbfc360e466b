//! The plugin's error type and its exit codes (0 ok, 1 invalid or denied, 2 partial failure, 3
//! upstream unreachable).

use std::fmt;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use helmop_core::model::FLEET_KUBECONFIG_NAMESPACES;
use helmop_core::plan::SourceRef;
use helmop_images::client::SetupError;

use crate::humanize::humanize;
use crate::identity::IDENTITY_NAMESPACE;

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

/// Everything that goes wrong in the plugin: the command's error (its exit code below), a command-line
/// value clap refuses, and the reason a row or a cluster carries (a cluster that cannot be worked on,
/// an input that cannot be read, a copy that cannot be verified). Clone: a reason is kept per cluster
/// and per source, and shown on every row it concerns. No variant holds Secret data.
#[derive(Clone, Debug, thiserror::Error)]
pub enum PluginError {
    #[error("cannot write output: {0}")]
    Output(#[source] Arc<std::io::Error>),
    #[error("cannot encode output: {0}")]
    Encode(#[source] Arc<serde_json::Error>),
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

    #[error("--registry-config: {0}")]
    RegistryConfig(#[source] Arc<SetupError>),
    #[error("{0}")]
    RegistryClient(#[source] Arc<SetupError>),

    // Command-line values; clap prints them after the argument they belong to.
    #[error("empty duration")]
    EmptyDuration,
    #[error("invalid duration {value:?}: {problem}")]
    InvalidDuration {
        value: String,
        problem: DurationProblem,
    },
    #[error("must be greater than 0")]
    NotPositive,
    #[error("{value:?} is not an address: use HOST:PORT, e.g. :8080 or 127.0.0.1:0")]
    InvalidAddr { value: String },

    // `propagate --watch`'s `/readyz`.
    #[error("not ready: leader election not joined yet")]
    ElectionNotJoined,
    #[error("not ready: {synced} of {total} watches synced")]
    WatchesNotSynced { synced: usize, total: usize },

    // The upstream cluster's identity (`prune` refuses to run without it).
    #[error("the upstream cluster was not identified")]
    UpstreamNotIdentified,
    #[error("cannot read namespace {IDENTITY_NAMESPACE} of the upstream cluster: {reason}")]
    UpstreamIdentity { reason: String },
    #[error("namespace {IDENTITY_NAMESPACE} of the upstream cluster has no uid")]
    UpstreamNoUid,

    // Why a downstream cluster cannot be worked on: the reason on its rows.
    #[error("no answer within --cluster-timeout {}", humanize(*timeout))]
    ClusterTimeout { timeout: Duration },
    #[error("cannot identify the cluster (get namespace {IDENTITY_NAMESPACE}): {reason}")]
    Unidentified { reason: String },
    #[error("cannot identify the cluster: namespace {IDENTITY_NAMESPACE} has no uid")]
    NoClusterUid,
    #[error("cannot build a client: {reason}")]
    BuildClient { reason: String },
    #[error("--target-context needs a kubeconfig (none is loaded)")]
    NoKubeconfig,
    #[error("context {name:?} is not in the kubeconfig")]
    UnknownContext { name: String },
    /// A kubeconfig the parser refused, in words that quote none of its content.
    #[error("{0}")]
    InvalidKubeconfig(String),
    #[error("the Cluster has no spec.kubeConfigSecret")]
    NoKubeconfigSecret,
    #[error(
        "kubeConfigSecretNamespace {namespace} is not a namespace Fleet reads kubeconfigs from (the Cluster's own, {}, cluster-*), so Secret {namespace}/{name} was not read; --allow-kubeconfig-namespace {namespace} allows it",
        FLEET_KUBECONFIG_NAMESPACES.join(", ")
    )]
    KubeconfigNamespace { namespace: String, name: String },
    #[error("cannot read kubeconfig Secret {namespace}/{name}: {reason}")]
    ReadKubeconfigSecret {
        namespace: String,
        name: String,
        reason: String,
    },
    /// `looked_up`: the Secret was read and is not there; else it was never read.
    #[error(
        "kubeconfig Secret {namespace}/{name} {}",
        if *looked_up { "not found" } else { "was not read" }
    )]
    KubeconfigSecretAbsent {
        namespace: String,
        name: String,
        looked_up: bool,
    },
    #[error("kubeconfig Secret {namespace}/{name}: {problem}")]
    BadKubeconfigSecret {
        namespace: String,
        name: String,
        problem: Box<PluginError>,
    },
    #[error("no data key `{key}`")]
    NoKubeconfigKey { key: &'static str },
    #[error("data key `{key}` is not UTF-8 text")]
    KubeconfigNotText { key: &'static str },
    #[error("cluster {cluster:?} refers to a CA file; only embedded data is used from a Secret")]
    KubeconfigCaFile { cluster: String },
    #[error("user {user:?} uses {what}; a kubeconfig from a Secret must embed its credentials")]
    KubeconfigLocalCredentials { user: String, what: &'static str },

    // Work on a reachable cluster.
    #[error("cannot list copies: {reason}")]
    ListCopies { reason: String },
    #[error("cannot list workloads in {namespace}: {reason}")]
    ListWorkloads { namespace: String, reason: String },
    /// A write (or the read before it) failed; `changed` when the object changed since it was read.
    #[error("{what}: {}", write_reason(*changed, reason))]
    Write {
        what: &'static str,
        changed: bool,
        reason: String,
    },
    #[error(
        "namespace {namespace} is being deleted and cannot hold new objects; run again once it is gone"
    )]
    NamespaceTerminating { namespace: String },

    // Why `prune` leaves a copy alone: its source cannot be verified.
    #[error("the copy is no longer listed")]
    CopyNotListed,
    #[error("its helmop.dev/source does not name a source of this upstream cluster")]
    ForeignSource,
    #[error("its helmop.dev/source-uid does not match the live source {object}")]
    SourceUidMismatch { object: SourceRef },
    #[error("its source {object} no longer exists upstream, so the copy cannot be verified")]
    SourceGone { object: SourceRef },
    #[error("cannot verify its source {object}: {problem}")]
    SourceUnverifiable {
        object: SourceRef,
        problem: Box<PluginError>,
    },

    /// An API request failed; the reason is `api_error::describe`'s.
    #[error("{reason}")]
    Api { reason: String },
    #[error("cannot read a BundleDeployment: {0}")]
    ReadBundleDeployment(#[source] Arc<serde_json::Error>),

    // `-f` inputs.
    #[error("cannot read stdin: {0}")]
    ReadStdin(#[source] Arc<std::io::Error>),
    #[error("no *.yaml, *.yml or *.json files in this directory")]
    NoManifests,
    #[error("cannot read directory: {0}")]
    ReadDirectory(#[source] Arc<std::io::Error>),
    #[error("cannot read: {0}")]
    ReadFile(#[source] Arc<std::io::Error>),
}

/// What is wrong with a duration (after `invalid duration "...": `).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DurationProblem {
    NoNumber,
    BadNumber(String),
    MissingUnit,
    UnknownUnit(String),
    OutOfRange,
}

impl fmt::Display for DurationProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DurationProblem::NoNumber => f.write_str("expected a number before the unit"),
            DurationProblem::BadNumber(n) => write!(f, "bad number {n:?}"),
            DurationProblem::MissingUnit => f.write_str("missing unit (ms, s, m, h)"),
            DurationProblem::UnknownUnit(u) => write!(f, "unknown unit {u:?}"),
            DurationProblem::OutOfRange => f.write_str("out of range"),
        }
    }
}

fn write_reason(changed: bool, reason: &str) -> String {
    if changed {
        format!("the object changed since it was read; run again ({reason})")
    } else {
        reason.to_owned()
    }
}

impl From<std::io::Error> for PluginError {
    fn from(e: std::io::Error) -> Self {
        PluginError::Output(Arc::new(e))
    }
}

impl From<serde_json::Error> for PluginError {
    fn from(e: serde_json::Error) -> Self {
        PluginError::Encode(Arc::new(e))
    }
}

impl PluginError {
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            PluginError::UpstreamUnreachable(_) => ExitStatus::Unreachable,
            // A cluster's or an input's reason is a row's; should one end a command, the command
            // did not do what was asked.
            _ => ExitStatus::Invalid,
        }
    }
}
