//! Client certificates judged again after a `--client-ca` change.
//!
//! The handshake checks a caller's certificate once, but the API server keeps its connections alive
//! for as long as it sends on them. Without a second look, a CA removed from `--client-ca` would keep
//! every connection it admitted, indefinitely under steady traffic. So each connection remembers its
//! certificate chain and the CA generation it was accepted under; a request on a connection older than
//! the current generation is served only if the CAs in use now still accept that chain, as a new
//! handshake would. Otherwise it is answered 403 and (HTTP/1.1) the connection closed: the caller's next
//! attempt is a fresh handshake, refused there.
//!
//! The chain is judged once per connection and generation, not per request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::Extension;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::middleware::{AddExtension, Next};
use axum::response::Response;
use axum_server::accept::Accept;
use axum_server::tls_rustls::RustlsAcceptor;
use rustls::pki_types::CertificateDer;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;
use tower_layer::Layer;

use crate::tls::ClientCaVerifier;

/// What a connection was accepted with: its peer's chain and the verdict's generation.
#[derive(Debug)]
struct Peer {
    chain: Vec<CertificateDer<'static>>,
    /// `generation << 1 | trusted` of the last verdict on `chain`.
    verdict: AtomicU64,
}

impl Peer {
    fn new(chain: Vec<CertificateDer<'static>>, generation: u64) -> Peer {
        Peer {
            chain,
            verdict: AtomicU64::new(generation << 1 | 1),
        }
    }

    /// Whether the CAs of `verifier` accept this connection now.
    fn trusted(&self, verifier: &ClientCaVerifier) -> bool {
        let generation = verifier.generation();
        let verdict = self.verdict.load(Ordering::Acquire);
        if verdict >> 1 == generation {
            return verdict & 1 == 1;
        }
        let trusted = verifier.trusts(&self.chain);
        self.verdict
            .store(generation << 1 | u64::from(trusted), Ordering::Release);
        trusted
    }
}

/// The peer of the connection a request came on; absent without `--client-ca`.
#[derive(Clone, Debug)]
pub(crate) struct ConnectionPeer(Option<Arc<Peer>>);

/// The TLS acceptor, recording each connection's [`ConnectionPeer`] for [`refuse_untrusted_peers`].
#[derive(Clone)]
pub(crate) struct PeerAcceptor {
    tls: RustlsAcceptor,
    verifier: Option<Arc<ClientCaVerifier>>,
}

impl PeerAcceptor {
    pub(crate) fn new(tls: RustlsAcceptor, verifier: Option<Arc<ClientCaVerifier>>) -> Self {
        PeerAcceptor { tls, verifier }
    }
}

impl<I, S> Accept<I, S> for PeerAcceptor
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: Send + 'static,
{
    type Stream = TlsStream<I>;
    type Service = AddExtension<S, ConnectionPeer>;
    type Future =
        Pin<Box<dyn Future<Output = std::io::Result<(Self::Stream, Self::Service)>> + Send>>;

    fn accept(&self, stream: I, service: S) -> Self::Future {
        let tls = self.tls.clone();
        // Read before the handshake: a CA swapped during it makes the first request judge again.
        let generation = self.verifier.as_ref().map(|v| v.generation());
        Box::pin(async move {
            let (stream, service) = tls.accept(stream, service).await?;
            let peer = generation.map(|generation| {
                let chain = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .map(<[CertificateDer<'static>]>::to_vec)
                    .unwrap_or_default();
                Arc::new(Peer::new(chain, generation))
            });
            Ok((stream, Extension(ConnectionPeer(peer)).layer(service)))
        })
    }
}

/// Middleware: a request on a connection whose certificate the current client CAs no longer accept
/// gets 403 and, over HTTP/1.1, `Connection: close`.
pub(crate) async fn refuse_untrusted_peers(
    State(verifier): State<Arc<ClientCaVerifier>>,
    request: Request,
    next: Next,
) -> Response {
    let peer = request
        .extensions()
        .get::<ConnectionPeer>()
        .and_then(|p| p.0.clone());
    match peer {
        Some(peer) if !peer.trusted(&verifier) => {
            tracing::warn!(
                "refused a request: its connection's client certificate is not signed by the client CA any more"
            );
            let mut response = super::plain(
                StatusCode::FORBIDDEN,
                "client certificate no longer trusted: --client-ca changed since this connection was made"
                    .to_owned(),
            );
            super::close_after(&mut response, request.version());
            response
        }
        _ => next.run(request).await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::{generate_ca, issue_client_cert};
    use crate::tls::load_client_ca;
    use rustls::pki_types::pem::PemObject;

    #[test]
    fn a_connection_is_judged_once_per_generation() {
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let (old, new) = (generate_ca(now).unwrap(), generate_ca(now).unwrap());
        let client = issue_client_cert(&old, "kube-apiserver", now, 30).unwrap();
        let chain = vec![CertificateDer::from_pem_slice(client.cert.as_bytes()).unwrap()];
        let verifier = ClientCaVerifier::new(load_client_ca(old.cert.as_bytes()).unwrap()).unwrap();
        let peer = Peer::new(chain, verifier.generation());
        assert!(peer.trusted(&verifier));

        verifier
            .store(load_client_ca(new.cert.as_bytes()).unwrap())
            .unwrap();
        assert!(!peer.trusted(&verifier), "a removed CA kept its connection");
        assert_eq!(peer.verdict.load(Ordering::Relaxed), 1 << 1);
        assert!(!peer.trusted(&verifier), "the verdict is kept");

        let both = format!("{}{}", new.cert, old.cert);
        verifier
            .store(load_client_ca(both.as_bytes()).unwrap())
            .unwrap();
        assert!(peer.trusted(&verifier), "judged again under the next CAs");
    }
}
