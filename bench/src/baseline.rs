//! The baseline server: bare axum over rustls, same TLS settings as the webhook, reading the whole request
//! body and answering a fixed AdmissionReview. Whatever the webhook costs beyond this is its own work.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::DefaultBodyLimit;
use axum::http::header;
use axum::routing::post;
use helmop_webhook::Webhook;

use crate::pki::Leaf;

/// A running baseline server; stops when dropped.
pub struct Baseline {
    pub addr: SocketAddr,
    handle: axum_server::Handle<SocketAddr>,
}

impl Drop for Baseline {
    fn drop(&mut self) {
        self.handle.shutdown();
    }
}

fn tls_config(leaf: &Leaf) -> anyhow::Result<rustls::ServerConfig> {
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(leaf.key_der.clone().into());
    let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
    .with_no_client_auth()
    .with_single_cert(vec![leaf.der.clone()], key)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// Starts a baseline answering `answer` on every admission path.
pub async fn start(leaf: &Leaf, answer: Bytes) -> anyhow::Result<Baseline> {
    let mut router = Router::new();
    for webhook in Webhook::ALL {
        let answer = answer.clone();
        router = router.route(
            webhook.path(),
            post(move |body: Bytes| {
                let answer = answer.clone();
                async move {
                    std::hint::black_box(body.len());
                    ([(header::CONTENT_TYPE, "application/json")], answer)
                }
            }),
        );
    }
    let router = router.layer(DefaultBodyLimit::max(
        helmop_webhook::admission::MAX_BODY_BYTES,
    ));
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let handle = axum_server::Handle::new();
    let config = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(tls_config(leaf)?));
    let server = axum_server::from_tcp_rustls(listener, config)?.handle(handle.clone());
    tokio::spawn(server.serve(router.into_make_service()));
    Ok(Baseline { addr, handle })
}
