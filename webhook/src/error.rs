//! The webhook's error type: what can stop it from starting or serving, and why a workload gets no config
//! stamp (a warning to whoever applied it).

use std::net::SocketAddr;

use helmop_core::podrefs::PodSpecError;
use helmop_core::resource::ResourceRef;
use helmop_images::client::SetupError;
use rustls::pki_types::pem;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("tls: {0}")]
    Tls(String),

    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },

    #[error("{what} server failed: {source}")]
    Serve {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },

    #[error("cannot reach the cluster (in-cluster service account, else KUBECONFIG): {0}")]
    Kube(#[from] kube::Error),

    #[error("cannot start: {0}")]
    Startup(String),

    #[error("{0}")]
    Bootstrap(String),

    #[error("cannot install the signal handler: {0}")]
    Signal(#[source] std::io::Error),

    #[error("cannot start: {0}")]
    Registry(#[from] SetupError),

    /// `--hash-key-secret` and the like: not `NAMESPACE/NAME`.
    #[error("expected NAMESPACE/NAME, got {value:?}")]
    NotNamespacedName { value: String },

    /// `file`: `certificate file`, `key file` or `client CA file`.
    #[error("{file}: {source}")]
    Pem {
        file: &'static str,
        #[source]
        source: pem::Error,
    },
    #[error("{file}: no CERTIFICATE block")]
    NoCertificate { file: &'static str },
    #[error("certificate and key: {0}")]
    KeyMismatch(#[source] rustls::Error),
    #[error("client CA file: {0}")]
    ClientCa(#[source] rustls::Error),

    #[error(transparent)]
    PodSpec(#[from] PodSpecError),
    #[error(
        "the pod template references {count} Secrets and ConfigMaps, more than the {limit} one admission may read"
    )]
    TooManyReferences { count: usize, limit: usize },
    /// The hash key cannot be used yet; the reason names its Secret, never the key.
    #[error("{0}")]
    HashKeyUnavailable(String),
    #[error("cannot read {resource} in namespace {namespace:?}: {source}")]
    ReadReference {
        resource: ResourceRef,
        namespace: String,
        #[source]
        source: kube::Error,
    },
    #[error("the config stamp was not computed before the request deadline")]
    StampDeadline,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
