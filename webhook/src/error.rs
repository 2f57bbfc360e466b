//! The webhook's error type: what can stop it from starting or serving.

use std::net::SocketAddr;

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
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
