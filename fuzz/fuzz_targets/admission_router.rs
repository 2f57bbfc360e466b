//! Arbitrary bodies (and the first byte choosing the endpoint) through the real admission router in-process:
//! decoding, the handler call, encoding, metrics and logging. The only statuses a body may produce are 200
//! (an AdmissionReview echoing the request's uid), 400 (malformed, with a reason) and 413 (too large); never a
//! 5xx and never a panic.
#![no_main]

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use helmop_fuzz::CoreHandlers;
use helmop_webhook::Metrics;
use helmop_webhook::server::{Webhook, router};
use http_body_util::BodyExt;
use libfuzzer_sys::fuzz_target;
use tower::ServiceExt;

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a current-thread runtime")
    })
}

fn app() -> &'static Router {
    static APP: OnceLock<Router> = OnceLock::new();
    APP.get_or_init(|| {
        router(
            Arc::new(CoreHandlers),
            Metrics::new(),
            Duration::from_secs(4),
            helmop_webhook::server::Limits::default(),
        )
    })
}

fuzz_target!(|data: &[u8]| {
    let Some((selector, body)) = data.split_first() else {
        return;
    };
    let webhook = Webhook::ALL[usize::from(*selector) % Webhook::ALL.len()];
    let request = Request::builder()
        .method(Method::POST)
        .uri(webhook.path())
        .header("content-type", "application/json")
        .body(Body::from(body.to_vec()))
        .expect("a valid request");
    runtime().block_on(async {
        let response = app().clone().oneshot(request).await.expect("infallible");
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .expect("a buffered body")
            .to_bytes();
        match status {
            StatusCode::OK => {
                let review: serde_json::Value =
                    serde_json::from_slice(&bytes).expect("200 carries JSON");
                let sent =
                    helmop_webhook::admission::decode(body).expect("200 only for decodable bodies");
                assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
                assert_eq!(review["kind"], "AdmissionReview");
                assert_eq!(review["response"]["uid"], sent.uid.as_str(), "uid echoed");
                assert!(review["response"]["allowed"].is_boolean());
                if review["response"].get("patch").is_some() {
                    assert!(webhook.mutating(), "a validating endpoint sent a patch");
                }
            }
            StatusCode::BAD_REQUEST => {
                assert!(
                    helmop_webhook::admission::decode(body).is_err(),
                    "400 for a decodable body"
                );
                assert!(!bytes.is_empty(), "400 without a reason");
            }
            StatusCode::PAYLOAD_TOO_LARGE => {
                assert!(body.len() > helmop_webhook::admission::MAX_BODY_BYTES);
            }
            other => panic!("status {other} for a {} byte body", body.len()),
        }
    });
});
