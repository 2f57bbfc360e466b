//! The baseline servers: axum over rustls, same TLS settings as the webhook, reading the whole request body.
//! [`Mode::Bare`] answers a fixed AdmissionReview; [`Mode::Decoding`] also does the least any webhook does,
//! decoding the AdmissionReview with serde_json and encoding its answer (the fixed one, with the request's
//! uid). Whatever the webhook costs beyond these is its own work.

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

/// What a baseline does with each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Reads the body, answers the fixed bytes.
    Bare,
    /// Decodes the AdmissionReview (serde_json), encodes the answer with the request's uid.
    Decoding,
}

/// Starts a baseline answering `answer` on every admission path.
pub async fn start(leaf: &Leaf, answer: Bytes, mode: Mode) -> anyhow::Result<Baseline> {
    let template: Arc<serde_json::Value> = Arc::new(serde_json::from_slice(&answer)?);
    let mut router = Router::new();
    for webhook in Webhook::ALL {
        let (answer, template) = (answer.clone(), template.clone());
        router = router.route(
            webhook.path(),
            post(move |body: Bytes| {
                let (answer, template) = (answer.clone(), template.clone());
                async move {
                    let answer = match mode {
                        Mode::Bare => {
                            std::hint::black_box(body.len());
                            answer
                        }
                        Mode::Decoding => decode_and_answer(&body, &template),
                    };
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

/// The least a webhook does: decode the review, copy its uid into the answer, encode the answer.
fn decode_and_answer(body: &[u8], template: &serde_json::Value) -> Bytes {
    let review: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let mut answer = template.clone();
    answer["response"]["uid"] = review["request"]["uid"].clone();
    Bytes::from(serde_json::to_vec(&answer).unwrap_or_default())
}
