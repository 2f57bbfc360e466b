//! AdmissionReview v1 over real HTTPS: round trips, limits, malformed input, routing, failure answers, admin port.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test with its message

mod common;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use base64::Engine;
use common::*;
use helmop_webhook::metrics::Outcome;
use helmop_webhook::{Verdict, Webhook};
use serde_json::json;

const MIB: usize = 1024 * 1024;

struct Setup {
    pki: Pki,
    _volume: SecretVolume,
    server: Running,
}

async fn setup(handlers: Arc<FakeHandlers>) -> Setup {
    let pki = Pki::new();
    let volume = SecretVolume::new(&pki.leaf("webhook"));
    let server = start(options(&volume), handlers).await;
    Setup {
        pki,
        _volume: volume,
        server,
    }
}

#[tokio::test]
async fn mutate_round_trip_echoes_uid_and_base64_patch() {
    let handlers = FakeHandlers::allowing();
    let s = setup(handlers.clone()).await;
    let mut conn = H1::connect(s.server.webhook, &s.pki).await;
    let body = serde_json::to_vec(&review(
        "3b1b6c2e-0d5e-4a6f-9d49-3c0c9f0a1c11",
        Webhook::Workloads,
        false,
    ))
    .unwrap();
    let reply = conn.send("POST", "/mutate/workloads", body).await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(v["response"]["uid"], "3b1b6c2e-0d5e-4a6f-9d49-3c0c9f0a1c11");
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(v["response"]["patchType"], "JSONPatch");
    assert_eq!(v["response"]["warnings"], json!(["stamped"]));
    let patch = base64::engine::general_purpose::STANDARD
        .decode(v["response"]["patch"].as_str().unwrap())
        .unwrap();
    assert_eq!(
        serde_json::from_slice::<json_patch::Patch>(&patch).unwrap(),
        stamp_patch()
    );
    assert!(v["response"].get("status").is_none(), "{v}");

    // Same connection, validating endpoint: no patch even if a handler returned one.
    let body = serde_json::to_vec(&review("uid-2", Webhook::Helmops, false)).unwrap();
    let reply = conn.send("POST", "/validate/helmops", body).await.unwrap();
    assert_eq!(
        reply.json()["response"],
        json!({"uid": "uid-2", "allowed": true})
    );
    assert_eq!(s.server.metrics.requests("workloads", Outcome::Patched), 1);
    assert_eq!(s.server.metrics.requests("helmops", Outcome::Allowed), 1);
}

#[tokio::test]
async fn each_path_reaches_its_handler_and_dry_run_is_passed_on() {
    let handlers = FakeHandlers::allowing();
    let s = setup(handlers.clone()).await;
    let mut conn = H1::connect(s.server.webhook, &s.pki).await;
    for (i, webhook) in Webhook::ALL.into_iter().enumerate() {
        let uid = format!("uid-{i}");
        let body = serde_json::to_vec(&review(&uid, webhook, i == 1)).unwrap();
        assert_eq!(
            conn.send("POST", webhook.path(), body)
                .await
                .unwrap()
                .status,
            200
        );
    }
    let seen = handlers.seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![
            Seen {
                webhook: Webhook::Helmops,
                uid: "uid-0".into(),
                dry_run: false
            },
            Seen {
                webhook: Webhook::References,
                uid: "uid-1".into(),
                dry_run: true
            },
            Seen {
                webhook: Webhook::Workloads,
                uid: "uid-2".into(),
                dry_run: false
            },
        ]
    );
}

#[tokio::test]
async fn denial_carries_code_message_and_warnings() {
    let handlers = FakeHandlers::new(Arc::new(|_, _| {
        Box::pin(async {
            Verdict::Deny {
                message: "spec.downstreamResources[0]: Secret \"db\" not found in namespace fleet-default".into(),
                code: 403,
                warnings: vec!["duplicate entry".into()],
            }
        })
    }));
    let s = setup(handlers).await;
    let mut conn = H1::connect(s.server.webhook, &s.pki).await;
    let body = serde_json::to_vec(&review("u-deny", Webhook::Helmops, false)).unwrap();
    let v = conn
        .send("POST", "/validate/helmops", body)
        .await
        .unwrap()
        .json();
    assert_eq!(v["response"]["uid"], "u-deny");
    assert_eq!(v["response"]["allowed"], false);
    assert_eq!(v["response"]["status"]["code"], 403);
    assert_eq!(
        v["response"]["status"]["message"],
        "spec.downstreamResources[0]: Secret \"db\" not found in namespace fleet-default"
    );
    assert_eq!(v["response"]["warnings"], json!(["duplicate entry"]));
    assert_eq!(s.server.metrics.requests("helmops", Outcome::Denied), 1);
}

#[tokio::test]
async fn http2_is_negotiated_and_served() {
    let s = setup(FakeHandlers::allowing()).await;
    let body = serde_json::to_vec(&review("u-h2", Webhook::Workloads, false)).unwrap();
    let (alpn, reply) = h2_send(s.server.webhook, &s.pki, "/mutate/workloads", body).await;
    assert_eq!(alpn, "h2");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["response"]["uid"], "u-h2");
}

#[tokio::test]
async fn body_limit_is_7_mib() {
    let handlers = FakeHandlers::allowing();
    let s = setup(handlers.clone()).await;
    let mut conn = H1::connect(s.server.webhook, &s.pki).await;
    for size in [7 * MIB - 1, 7 * MIB] {
        let reply = conn
            .send("POST", "/validate/helmops", review_of_size("u-big", size))
            .await
            .unwrap();
        assert_eq!(reply.status, 200, "{size} bytes: {}", reply.text());
        assert_eq!(reply.json()["response"]["uid"], "u-big");
    }
    let calls = handlers.calls.load(Ordering::SeqCst);

    // Declared length above the limit: refused from the header, before the body is read.
    let body = review_of_size("u-too-big", 7 * MIB + 1);
    let head = format!(
        "POST /validate/helmops HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let reply = raw_exchange(s.server.webhook, &s.pki, head, body.clone(), false).await;
    assert_eq!(reply.status, 413, "{}", reply.text());
    assert!(
        reply.text().contains("7340032 byte limit"),
        "{}",
        reply.text()
    );

    // No declared length (chunked): refused while streaming.
    let head = "POST /mutate/workloads HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
    let reply = raw_exchange(s.server.webhook, &s.pki, head.to_owned(), body, true).await;
    assert_eq!(reply.status, 413, "{}", reply.text());

    assert_eq!(
        handlers.calls.load(Ordering::SeqCst),
        calls,
        "oversized bodies never reach a handler"
    );
    assert_eq!(s.server.metrics.requests("helmops", Outcome::TooLarge), 1);
    assert_eq!(s.server.metrics.requests("workloads", Outcome::TooLarge), 1);
}

/// As a new user tries it: an ordinary client writes the whole 8 MiB body before it reads, so the 413 must still
/// be there when it does (an answer followed by a close with unread data becomes a reset that discards it).
#[tokio::test]
async fn an_ordinary_client_sending_8_mib_reads_its_413() {
    let handlers = FakeHandlers::allowing();
    let s = setup(handlers.clone()).await;
    let body = review_of_size("u-8mib", 8 * MIB);

    let mut conn = H1::connect(s.server.webhook, &s.pki).await;
    let reply = conn
        .send("POST", "/validate/helmops", body.clone())
        .await
        .expect("HTTP/1.1: a response, not a dropped connection");
    assert_eq!(reply.status, 413, "{}", reply.text());
    assert!(
        reply.text().contains("7340032 byte limit"),
        "{}",
        reply.text()
    );
    // The whole body was taken, so the connection stays usable.
    let small = serde_json::to_vec(&review("u-after", Webhook::Helmops, false)).unwrap();
    let reply = conn.send("POST", "/validate/helmops", small).await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());

    let (_, reply) = h2_send(s.server.webhook, &s.pki, "/mutate/workloads", body).await;
    assert_eq!(reply.status, 413, "HTTP/2: {}", reply.text());
    assert!(
        reply.text().contains("7340032 byte limit"),
        "{}",
        reply.text()
    );

    assert_eq!(s.server.metrics.requests("helmops", Outcome::TooLarge), 1);
    assert_eq!(s.server.metrics.requests("workloads", Outcome::TooLarge), 1);
}

/// The same with curl, as a new user tries it: `--data-binary @file` over HTTP/1.1 and HTTP/2 prints the 413 and
/// its reason, not a connection error.
#[tokio::test]
async fn curl_posting_8_mib_prints_the_413() {
    let s = setup(FakeHandlers::allowing()).await;
    let dir = tempfile::tempdir().unwrap();
    let (body, ca) = (dir.path().join("review.json"), dir.path().join("ca.crt"));
    std::fs::write(&body, review_of_size("u-curl", 8 * MIB)).unwrap();
    std::fs::write(&ca, &s.pki.ca_pem).unwrap();
    for version in ["--http1.1", "--http2"] {
        let out = tokio::process::Command::new("curl")
            .args(["-sS", version, "--cacert"])
            .arg(&ca)
            .args(["-H", "content-type: application/json", "--data-binary"])
            .arg(format!("@{}", body.display()))
            .args(["-w", "\n%{http_code}"])
            .arg(format!(
                "https://localhost:{}/validate/helmops",
                s.server.webhook.port()
            ))
            .output()
            .await
            .expect("curl must be on PATH");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{version}: curl failed: {}{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.ends_with("\n413"), "{version}: {stdout}");
        assert!(stdout.contains("7340032 byte limit"), "{version}: {stdout}");
    }
}

/// Handlers that park every request until `gate` gets permits.
fn parking(gate: Arc<tokio::sync::Semaphore>) -> Arc<FakeHandlers> {
    FakeHandlers::new(Arc::new(move |_, _| {
        let gate = gate.clone();
        Box::pin(async move {
            let _ = gate.acquire().await;
            Verdict::allow()
        })
    }))
}

/// Sends `body` on a fresh connection in the background.
fn send_later(s: &Setup, body: Vec<u8>) -> tokio::task::JoinHandle<Result<Reply, hyper::Error>> {
    let addr = s.server.webhook;
    let config = client_config(&s.pki, &[&rustls::version::TLS13], &[b"http/1.1"]);
    tokio::spawn(async move {
        let mut conn = H1::connect_with(addr, config).await.unwrap();
        conn.send("POST", "/validate/helmops", body).await
    })
}

/// Past the in-flight limits (requests, and body bytes held) the answer is a fast 429 with its reason, the
/// requests already in flight are unaffected, and the webhook serves again once they finish.
#[tokio::test]
async fn past_the_in_flight_limits_requests_get_a_fast_429() {
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let handlers = parking(gate.clone());
    let pki = Pki::new();
    let volume = SecretVolume::new(&pki.leaf("webhook"));
    let mut opts = options(&volume);
    opts.limits = helmop_webhook::server::Limits {
        max_in_flight: 2,
        max_body_bytes_in_flight: helmop_webhook::admission::MAX_REVIEW_COST,
    };
    let s = Setup {
        server: start(opts, handlers.clone()).await,
        pki,
        _volume: volume,
    };
    let small = || serde_json::to_vec(&review("u-small", Webhook::Helmops, false)).unwrap();

    // Two requests decided at once: the third is refused at once.
    let parked: Vec<_> = (0..2).map(|_| send_later(&s, small())).collect();
    eventually(Duration::from_secs(10), "two parked requests", || async {
        handlers.calls.load(Ordering::SeqCst) == 2
    })
    .await;
    let started = std::time::Instant::now();
    let mut conn = H1::connect(s.server.webhook, &s.pki).await;
    let reply = conn
        .send("POST", "/validate/helmops", small())
        .await
        .unwrap();
    assert_eq!(reply.status, 429, "{}", reply.text());
    assert!(
        reply
            .text()
            .contains("too many admission requests in flight"),
        "{}",
        reply.text()
    );
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    gate.add_permits(1_000);
    for p in parked {
        assert_eq!(p.await.unwrap().unwrap().status, 200);
    }
    let reply = conn
        .send("POST", "/validate/helmops", small())
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "served again: {}", reply.text());

    // Decoded bytes: one review of 250,000 values (half a MiB of body, 24 MiB decoded) held in a handler
    // leaves no room for a second one; the budget is the smallest allowed (the largest review's cost).
    gate.forget_permits(1_000);
    let calls = handlers.calls.load(Ordering::SeqCst);
    let first = send_later(&s, review_of_values("u-6a", 250_000));
    eventually(
        Duration::from_secs(10),
        "the first big review parked",
        || async { handlers.calls.load(Ordering::SeqCst) == calls + 1 },
    )
    .await;
    let reply = conn
        .send(
            "POST",
            "/validate/helmops",
            review_of_values("u-6b", 250_000),
        )
        .await
        .expect("the refused body was read, so its 429 arrives");
    assert_eq!(reply.status, 429, "{}", reply.text());
    // A body declared at the limit would cost three times its length to decide, which the budget cannot hold
    // now: it is refused at its head, before a byte of it is sent (it would time out waiting for the body if
    // it were let in to be read and refused afterwards).
    let head = format!(
        "POST /validate/helmops HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n",
        helmop_webhook::admission::MAX_BODY_BYTES
    );
    let reply = raw_exchange(s.server.webhook, &s.pki, head, Vec::new(), false).await;
    assert_eq!(reply.status, 429, "refused at its head: {}", reply.text());
    gate.add_permits(1_000);
    assert_eq!(first.await.unwrap().unwrap().status, 200);
    let reply = conn
        .send(
            "POST",
            "/validate/helmops",
            review_of_values("u-6c", 250_000),
        )
        .await
        .unwrap();
    assert_eq!(
        reply.status,
        200,
        "the budget was returned: {}",
        reply.text()
    );
    assert_eq!(s.server.metrics.requests("helmops", Outcome::Busy), 3);
}

/// A review of more JSON values than one admission decodes (dense lists: 2 bytes each, tens of bytes
/// each once parsed) is never decoded: validation is refused and mutation admitted unpatched, each
/// with the reason, and the handler is never called.
#[tokio::test]
async fn a_review_of_too_many_values_is_answered_without_being_decoded() {
    let handlers = FakeHandlers::allowing();
    let s = setup(handlers.clone()).await;
    let mut conn = H1::connect(s.server.webhook, &s.pki).await;
    let too_many = helmop_webhook::admission::MAX_VALUES + 1;
    let reply = conn
        .send(
            "POST",
            "/validate/helmops",
            review_of_values("u-dense", too_many),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let answer: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(answer["response"]["uid"], "u-dense");
    assert_eq!(answer["response"]["allowed"], false);
    let message = answer["response"]["status"]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.contains("more than 262144 JSON values"),
        "{message}"
    );
    let reply = conn
        .send(
            "POST",
            "/mutate/workloads",
            review_of_values("u-dense-2", too_many),
        )
        .await
        .unwrap();
    let answer: serde_json::Value = serde_json::from_slice(&reply.body).unwrap();
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    assert!(answer["response"].get("patch").is_none(), "{answer}");
    assert_eq!(
        handlers.calls.load(Ordering::SeqCst),
        0,
        "the handler was called"
    );
    assert_eq!(s.server.metrics.requests("helmops", Outcome::TooLarge), 1);
    // A review at the bound is decided.
    let reply = conn
        .send(
            "POST",
            "/validate/helmops",
            review_of_values("u-ok", 200_000),
        )
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(handlers.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn malformed_and_wrong_version_reviews_get_400_with_a_reason() {
    let handlers = FakeHandlers::allowing();
    let s = setup(handlers.clone()).await;
    let mut conn = H1::connect(s.server.webhook, &s.pki).await;

    let mut v1beta1 = review("u", Webhook::Helmops, false);
    v1beta1["apiVersion"] = json!("admission.k8s.io/v1beta1");
    let mut no_request = review("u", Webhook::Helmops, false);
    no_request.as_object_mut().unwrap().remove("request");
    let mut no_uid = review("u", Webhook::Helmops, false);
    no_uid["request"].as_object_mut().unwrap().remove("uid");
    let mut secret_in_wrong_type = review("u", Webhook::References, false);
    secret_in_wrong_type["request"]["oldObject"]["metadata"] = json!("TOPSECRET-b64-value");

    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"{\"apiVersion\": ".to_vec(), "body ends early"),
        (b"not json at all".to_vec(), "not valid JSON"),
        (Vec::new(), "body ends early"),
        (
            serde_json::to_vec(&v1beta1).unwrap(),
            "admission.k8s.io/v1beta1",
        ),
        (serde_json::to_vec(&no_request).unwrap(), "no request"),
        (serde_json::to_vec(&no_uid).unwrap(), "missing field `uid`"),
        (
            serde_json::to_vec(&secret_in_wrong_type).unwrap(),
            "wrong type",
        ),
        (b"[1,2,3]".to_vec(), "malformed AdmissionReview"),
        (
            format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)).into_bytes(),
            "malformed AdmissionReview",
        ),
    ];
    for (body, reason) in cases {
        let reply = conn
            .send("POST", "/validate/references", body)
            .await
            .unwrap();
        assert_eq!(reply.status, 400, "{reason}: {}", reply.text());
        assert!(
            reply.text().contains(reason),
            "expected {reason:?} in {:?}",
            reply.text()
        );
        assert!(!reply.text().contains("TOPSECRET"), "{}", reply.text());
    }
    assert_eq!(handlers.calls.load(Ordering::SeqCst), 0);
    assert_eq!(
        s.server.metrics.requests("references", Outcome::BadRequest),
        9
    );
}

#[tokio::test]
async fn unknown_paths_404_wrong_methods_405() {
    let s = setup(FakeHandlers::allowing()).await;
    let mut conn = H1::connect(s.server.webhook, &s.pki).await;
    let body = serde_json::to_vec(&review("u", Webhook::Helmops, false)).unwrap();
    for path in [
        "/",
        "/validate",
        "/validate/helmop",
        "/mutate/workloads/extra",
        "/healthz",
        "/metrics",
    ] {
        let reply = conn.send("POST", path, body.clone()).await.unwrap();
        assert_eq!(reply.status, 404, "{path}");
    }
    for method in ["GET", "PUT", "DELETE", "PATCH"] {
        let reply = conn
            .send(method, "/validate/helmops", Vec::new())
            .await
            .unwrap();
        assert_eq!(reply.status, 405, "{method}");
    }
}

#[tokio::test]
async fn a_panicking_handler_is_answered_per_failure_policy() {
    let handlers = FakeHandlers::new(Arc::new(|_, _| Box::pin(async { panic!("handler bug") })));
    let s = setup(handlers).await;
    let mut conn = H1::connect(s.server.webhook, &s.pki).await;

    let body = serde_json::to_vec(&review("u-p1", Webhook::Helmops, false)).unwrap();
    let v = conn
        .send("POST", "/validate/helmops", body)
        .await
        .unwrap()
        .json();
    assert_eq!(v["response"]["uid"], "u-p1");
    assert_eq!(v["response"]["allowed"], false, "validation fails closed");
    assert_eq!(v["response"]["status"]["code"], 500);

    // The connection survived the panic.
    let body = serde_json::to_vec(&review("u-p2", Webhook::Workloads, false)).unwrap();
    let v = conn
        .send("POST", "/mutate/workloads", body)
        .await
        .unwrap()
        .json();
    assert_eq!(v["response"]["uid"], "u-p2");
    assert_eq!(v["response"]["allowed"], true, "mutation fails open");
    assert!(v["response"].get("patch").is_none());
    assert!(
        v["response"]["warnings"][0]
            .as_str()
            .unwrap()
            .contains("without config-hash"),
        "{v}"
    );

    assert_eq!(s.server.metrics.requests("helmops", Outcome::Panic), 1);
    assert_eq!(s.server.metrics.requests("workloads", Outcome::Panic), 1);
    let metrics = admin_get(s.server.admin, "/metrics").await.text();
    assert!(
        metrics.contains("helmop_webhook_panics_total 2"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_slow_handler_is_cut_off_at_the_request_timeout() {
    let handlers = FakeHandlers::new(Arc::new(|_, _| {
        Box::pin(async {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Verdict::allow()
        })
    }));
    let pki = Pki::new();
    let volume = SecretVolume::new(&pki.leaf("webhook"));
    let mut opts = options(&volume);
    opts.request_timeout = Duration::from_millis(300);
    let server = start(opts, handlers).await;
    let mut conn = H1::connect(server.webhook, &pki).await;
    let started = std::time::Instant::now();
    let body = serde_json::to_vec(&review("u-slow", Webhook::References, false)).unwrap();
    let v = conn
        .send("POST", "/validate/references", body)
        .await
        .unwrap()
        .json();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(v["response"]["uid"], "u-slow");
    assert_eq!(v["response"]["allowed"], false);
    assert!(
        v["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("timed out"),
        "{v}"
    );
    assert_eq!(server.metrics.requests("references", Outcome::Timeout), 1);
}

#[tokio::test]
async fn admin_port_health_readiness_and_metrics() {
    let handlers = FakeHandlers::allowing();
    handlers.ready.store(false, Ordering::SeqCst);
    let s = setup(handlers.clone()).await;

    let health = admin_get(s.server.admin, "/healthz").await;
    assert_eq!((health.status, health.text().as_str()), (200, "ok\n"));
    let ready = admin_get(s.server.admin, "/readyz").await;
    assert_eq!(ready.status, 503, "not ready until the handlers say so");
    assert!(ready.text().contains("caches"), "{}", ready.text());
    handlers.ready.store(true, Ordering::SeqCst);
    assert_eq!(admin_get(s.server.admin, "/readyz").await.status, 200);

    let mut conn = H1::connect(s.server.webhook, &s.pki).await;
    let body = serde_json::to_vec(&review("u-m", Webhook::Workloads, false)).unwrap();
    conn.send("POST", "/mutate/workloads", body).await.unwrap();
    s.server.metrics.set_cache_objects("secrets", 3);
    let metrics = admin_get(s.server.admin, "/metrics").await;
    assert_eq!(metrics.status, 200);
    let text = metrics.text();
    for needle in [
        r#"helmop_webhook_requests_total{webhook="workloads",operation="CREATE",outcome="patched"} 1"#,
        r#"helmop_webhook_request_duration_seconds_count{webhook="workloads"} 1"#,
        r#"helmop_webhook_cache_objects{cache="secrets"} 3"#,
        "helmop_webhook_cert_reloads_total 0",
        "# EOF",
    ] {
        assert!(text.contains(needle), "{needle} missing from\n{text}");
    }
    // The admin port is plain HTTP and has no admission endpoints.
    assert_eq!(
        admin_get(s.server.admin, "/validate/helmops").await.status,
        404
    );
    assert_eq!(admin_get(s.server.admin, "/nope").await.status, 404);
}

#[tokio::test]
async fn graceful_shutdown_finishes_in_flight_requests_and_fails_readiness() {
    let (release_tx, release_rx) = tokio::sync::watch::channel(false);
    let handlers = FakeHandlers::new(Arc::new(move |_, _| {
        let mut rx = release_rx.clone();
        Box::pin(async move {
            let _ = rx.wait_for(|released| *released).await;
            Verdict::allow()
        })
    }));
    let pki = Pki::new();
    let volume = SecretVolume::new(&pki.leaf("webhook"));
    let mut opts = options(&volume);
    opts.shutdown_delay = Duration::from_millis(300);
    let mut server = start(opts, handlers.clone()).await;
    let addr = server.webhook;

    let mut conn = H1::connect(addr, &pki).await;
    let body = serde_json::to_vec(&review("u-inflight", Webhook::Helmops, false)).unwrap();
    let in_flight = tokio::spawn(async move { conn.send("POST", "/validate/helmops", body).await });
    eventually(Duration::from_secs(5), "request in flight", || async {
        handlers.calls.load(Ordering::SeqCst) == 1
    })
    .await;

    server.shutdown();
    eventually(Duration::from_secs(5), "readyz to fail", || async {
        admin_get(server.admin, "/readyz").await.status == 503
    })
    .await;
    // Past the delay, new connections are refused, while the in-flight request is still waiting.
    eventually(Duration::from_secs(5), "listener closed", || async {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
    assert!(!in_flight.is_finished());

    release_tx.send(true).unwrap();
    let reply = in_flight.await.unwrap().unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["response"]["uid"], "u-inflight");
    tokio::time::timeout(Duration::from_secs(5), server.task)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

/// While the shutdown delay runs, kept-alive HTTP/1.1 connections are handed back by the server after their
/// next answer (`Connection: close`), instead of being closed idle under the client when draining starts:
/// the race that made the API server fail an admission with `EOF` during a rolling update.
#[tokio::test]
async fn shutdown_delay_closes_kept_alive_http1_connections_after_their_next_answer() {
    let handlers = FakeHandlers::new(Arc::new(|_, _| Box::pin(async { Verdict::allow() })));
    let pki = Pki::new();
    let volume = SecretVolume::new(&pki.leaf("webhook"));
    let mut opts = options(&volume);
    // Long enough that the test's requests all land inside the delay.
    opts.shutdown_delay = Duration::from_secs(30);
    let mut server = start(opts, handlers.clone()).await;
    let addr = server.webhook;
    let body = || serde_json::to_vec(&review("u-keepalive", Webhook::Helmops, false)).unwrap();

    let mut conn = H1::connect(addr, &pki).await;
    let before = conn
        .send("POST", "/validate/helmops", body())
        .await
        .unwrap();
    assert_eq!(before.status, 200);
    assert_eq!(before.connection, None, "keep-alive before shutdown");

    server.shutdown();
    eventually(Duration::from_secs(5), "readyz to fail", || async {
        admin_get(server.admin, "/readyz").await.status == 503
    })
    .await;
    // Still serving during the delay, on the kept-alive connection, and telling the client to let it go.
    let during = conn
        .send("POST", "/validate/helmops", body())
        .await
        .unwrap();
    assert_eq!(during.status, 200);
    assert_eq!(during.json()["response"]["allowed"], true);
    assert_eq!(during.connection.as_deref(), Some("close"));
    // The server closed that connection after the answer: a further request on it cannot be sent.
    assert!(
        conn.send("POST", "/validate/helmops", body())
            .await
            .is_err()
    );
    // New connections during the delay are served the same way.
    let mut fresh = H1::connect(addr, &pki).await;
    let reply = fresh
        .send("POST", "/validate/helmops", body())
        .await
        .unwrap();
    assert_eq!(reply.status, 200);
    assert_eq!(reply.connection.as_deref(), Some("close"));
    // HTTP/2 has no Connection header (GOAWAY does this job) and is still answered normally.
    let (alpn, h2) = h2_send(addr, &pki, "/validate/helmops", body()).await;
    assert_eq!(alpn, "h2");
    assert_eq!(h2.status, 200);
}
