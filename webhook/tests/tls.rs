//! TLS of the admission port: versions, ALPN, no plaintext, certificate rotation through a Secret-volume symlink swap.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test with its message

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use helmop_webhook::Webhook;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn setup() -> (Pki, SecretVolume, Running) {
    let pki = Pki::new();
    let volume = SecretVolume::new(&pki.leaf("webhook-1"));
    let server = start(options(&volume), FakeHandlers::allowing()).await;
    (pki, volume, server)
}

#[tokio::test]
async fn tls_1_2_and_1_3_are_accepted() {
    let (pki, _volume, server) = setup().await;
    for (version, expected) in [
        (&rustls::version::TLS12, rustls::ProtocolVersion::TLSv1_2),
        (&rustls::version::TLS13, rustls::ProtocolVersion::TLSv1_3),
    ] {
        let stream = tls_connect(
            server.webhook,
            client_config(&pki, &[version], &[b"http/1.1"]),
        )
        .await
        .unwrap();
        assert_eq!(stream.get_ref().1.protocol_version(), Some(expected));
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .unwrap();
        tokio::spawn(conn);
        let body = serde_json::to_vec(&review("u", Webhook::Helmops, false)).unwrap();
        let request = hyper::Request::post("/validate/helmops")
            .header("host", "localhost")
            .body(http_body_util::Full::new(axum::body::Bytes::from(body)))
            .unwrap();
        assert_eq!(sender.send_request(request).await.unwrap().status(), 200);
    }
}

/// A TLS 1.1 ClientHello (no `supported_versions` extension, legacy version 3.2), written by hand since rustls
/// clients cannot speak TLS 1.1.
fn tls11_client_hello() -> Vec<u8> {
    let mut body = vec![0x03, 0x02]; // client_version TLS 1.1
    body.extend([0x5a; 32]); // random
    body.push(0); // session id
    let suites: [u16; 6] = [0xc013, 0xc014, 0xc009, 0xc00a, 0x002f, 0x0035];
    body.extend(((suites.len() * 2) as u16).to_be_bytes());
    for s in suites {
        body.extend(s.to_be_bytes());
    }
    body.extend([1, 0]); // compression: null
    // extensions: server_name "localhost", supported_groups, ec_point_formats
    let mut ext = Vec::new();
    let host = b"localhost";
    let mut sni = Vec::new();
    sni.extend(((host.len() + 3) as u16).to_be_bytes());
    sni.push(0);
    sni.extend((host.len() as u16).to_be_bytes());
    sni.extend(host);
    ext.extend(0u16.to_be_bytes());
    ext.extend((sni.len() as u16).to_be_bytes());
    ext.extend(sni);
    ext.extend([0x00, 0x0a, 0x00, 0x04, 0x00, 0x02, 0x00, 0x17]); // supported_groups: secp256r1
    ext.extend([0x00, 0x0b, 0x00, 0x02, 0x01, 0x00]); // ec_point_formats: uncompressed
    // signature_algorithms (rustls wants it before looking at the version): ecdsa_p256_sha256, rsa_pss, rsa_pkcs1
    ext.extend([
        0x00, 0x0d, 0x00, 0x08, 0x00, 0x06, 0x04, 0x03, 0x08, 0x04, 0x04, 0x01,
    ]);
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);

    let mut handshake = vec![0x01]; // ClientHello
    handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend((handshake.len() as u16).to_be_bytes());
    record.extend(handshake);
    record
}

async fn read_until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
            Err(_) => panic!("server kept the connection open: {out:?}"),
        }
    }
}

#[tokio::test]
async fn tls_1_1_is_refused_with_a_protocol_version_alert() {
    let (_pki, _volume, server) = setup().await;
    let mut tcp = TcpStream::connect(server.webhook).await.unwrap();
    tcp.write_all(&tls11_client_hello()).await.unwrap();
    let reply = read_until_closed(&mut tcp).await;
    // One alert record: type 21, fatal (2), protocol_version (70); no ServerHello (handshake record, type 22).
    assert!(reply.len() >= 7, "{reply:?}");
    assert_eq!(reply[0], 0x15, "expected an alert record, got {reply:?}");
    assert_eq!(&reply[5..7], &[2, 70], "{reply:?}");
    assert!(!reply.contains(&0x16), "{reply:?}");
}

#[tokio::test]
async fn plaintext_http_gets_no_http_answer() {
    let (_pki, _volume, server) = setup().await;
    let mut tcp = TcpStream::connect(server.webhook).await.unwrap();
    let body = serde_json::to_vec(&review("u", Webhook::Helmops, false)).unwrap();
    let head = format!(
        "POST /validate/helmops HTTP/1.1\r\nhost: localhost\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes()).await.unwrap();
    let _ = tcp.write_all(&body).await;
    let reply = read_until_closed(&mut tcp).await;
    assert!(
        !String::from_utf8_lossy(&reply).contains("HTTP/"),
        "{:?}",
        String::from_utf8_lossy(&reply)
    );
    assert!(!String::from_utf8_lossy(&reply).contains("AdmissionReview"));
}

/// `--client-ca`: the API server's client certificate gets answers; a caller without one, or with one from
/// another CA, is refused in the handshake and a forged review (a kube-system Secret DELETE) gets nothing.
#[tokio::test]
async fn with_a_client_ca_only_its_certificates_get_an_answer() {
    let pki = Pki::new();
    let api_servers = Pki::new();
    let strangers = Pki::new();
    let volume = SecretVolume::new(&pki.leaf("webhook"));
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_file = ca_dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, &api_servers.ca_pem).unwrap();
    let handlers = FakeHandlers::allowing();
    let mut opts = options(&volume);
    opts.client_ca = Some(ca_file);
    let server = start(opts, handlers.clone()).await;

    let mut forged = review("forged", Webhook::References, false);
    forged["request"]["namespace"] = "kube-system".into();
    forged["request"]["oldObject"]["metadata"]["namespace"] = "kube-system".into();
    let forged = serde_json::to_vec(&forged).unwrap();

    let api_server = api_servers.leaf("kube-apiserver");
    let mut conn = H1::connect_with(server.webhook, client_config_with_cert(&pki, &api_server))
        .await
        .unwrap();
    let reply = conn
        .send("POST", "/validate/references", forged.clone())
        .await
        .unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let answered = handlers.calls.load(Ordering::SeqCst);

    let stranger = strangers.leaf("kube-apiserver");
    for (who, config) in [
        (
            "no certificate, TLS 1.3",
            client_config(&pki, &[&rustls::version::TLS13], &[b"http/1.1"]),
        ),
        (
            "no certificate, TLS 1.2",
            client_config(&pki, &[&rustls::version::TLS12], &[b"http/1.1"]),
        ),
        (
            "another CA's certificate",
            client_config_with_cert(&pki, &stranger),
        ),
    ] {
        // TLS 1.2 fails the handshake itself; under TLS 1.3 the client's side completes first and the
        // server's refusal arrives as an alert on the first read. Either way: no HTTP answer.
        let result = match H1::connect_with(server.webhook, config).await {
            Err(e) => Err(e),
            Ok(mut conn) => conn
                .send("POST", "/validate/references", forged.clone())
                .await
                .map(|reply| reply.status)
                .map_err(|e| e.to_string()),
        };
        assert!(result.is_err(), "{who}: answered {result:?}");
    }
    assert_eq!(
        handlers.calls.load(Ordering::SeqCst),
        answered,
        "a refused caller reached a handler"
    );
    assert_eq!(
        server
            .metrics
            .requests("references", helmop_webhook::metrics::Outcome::Allowed),
        1
    );
}

/// A rotated client CA is taken into use without a restart: written as new + old (what the bootstrap
/// writes first), both are accepted; written as new alone, the old one is refused.
#[tokio::test]
async fn a_rotated_client_ca_is_reloaded_add_before_remove() {
    let pki = Pki::new();
    let (old, new) = (Pki::new(), Pki::new());
    let volume = SecretVolume::new(&pki.leaf("webhook"));
    let ca_dir = tempfile::tempdir().unwrap();
    let ca_file = ca_dir.path().join("client-ca.crt");
    std::fs::write(&ca_file, &old.ca_pem).unwrap();
    let handlers = FakeHandlers::allowing();
    let mut opts = options(&volume);
    opts.client_ca = Some(ca_file.clone());
    let server = start(opts, handlers.clone()).await;
    let body = serde_json::to_vec(&review("r", Webhook::Helmops, false)).unwrap();
    let answered = |ca: &Pki| {
        let config = client_config_with_cert(&pki, &ca.leaf("kube-apiserver"));
        let body = body.clone();
        let addr = server.webhook;
        async move {
            match H1::connect_with(addr, config).await {
                Ok(mut conn) => conn
                    .send("POST", "/validate/helmops", body)
                    .await
                    .is_ok_and(|r| r.status == 200),
                Err(_) => false,
            }
        }
    };
    assert!(answered(&old).await && !answered(&new).await);

    std::fs::write(&ca_file, format!("{}{}", new.ca_pem, old.ca_pem)).unwrap();
    eventually(
        Duration::from_secs(10),
        "the new client CA accepted",
        || answered(&new),
    )
    .await;
    assert!(
        answered(&old).await,
        "the old client CA was dropped before it was removed"
    );

    std::fs::write(&ca_file, &new.ca_pem).unwrap();
    eventually(
        Duration::from_secs(10),
        "the old client CA refused",
        || async { !answered(&old).await },
    )
    .await;
    assert!(answered(&new).await);
}

#[tokio::test]
async fn a_stalled_handshake_is_dropped() {
    let (_pki, _volume, server) = setup().await; // handshake timeout 2 s in the test options
    let mut tcp = TcpStream::connect(server.webhook).await.unwrap();
    let started = std::time::Instant::now();
    let reply = read_until_closed(&mut tcp).await;
    assert!(reply.is_empty());
    assert!(
        started.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn rotation_via_symlink_swap_reaches_new_connections_without_failing_existing_ones() {
    let (pki, mut volume, server) = setup().await;
    let pki = Arc::new(pki);
    let first = served_cert(server.webhook, &pki).await;

    // A steady stream of requests on long-lived keep-alive connections, and on fresh connections.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut workers = Vec::new();
    for worker in 0..4 {
        let (stop, ok, failed) = (stop.clone(), ok.clone(), failed.clone());
        let addr = server.webhook;
        let pki = pki.clone();
        workers.push(tokio::spawn(async move {
            let mut conn = H1::connect(addr, &pki).await;
            let mut i = 0;
            while !stop.load(Ordering::SeqCst) {
                if worker == 3 && i % 10 == 0 {
                    conn = H1::connect(addr, &pki).await; // some churn: new handshakes during the swap
                }
                let uid = format!("w{worker}-{i}");
                let body = serde_json::to_vec(&review(&uid, Webhook::Workloads, false)).unwrap();
                match conn.send("POST", "/mutate/workloads", body).await {
                    Ok(reply)
                        if reply.status == 200
                            && reply.json()["response"]["uid"] == uid.as_str() =>
                    {
                        ok.fetch_add(1, Ordering::SeqCst)
                    }
                    _ => failed.fetch_add(1, Ordering::SeqCst),
                };
                i += 1;
            }
        }));
    }
    eventually(Duration::from_secs(10), "traffic", || async {
        ok.load(Ordering::SeqCst) > 50
    })
    .await;

    let second = pki.leaf("webhook-2");
    volume.swap_in(second.cert_pem.as_bytes(), second.key_pem.as_bytes());
    eventually(
        Duration::from_secs(10),
        "new connections to see the new certificate",
        || async { served_cert(server.webhook, &pki).await == second.der },
    )
    .await;
    assert_ne!(first, second.der);

    // Keep the old connections busy a little longer after the old files are gone.
    let after_swap = ok.load(Ordering::SeqCst);
    eventually(
        Duration::from_secs(10),
        "traffic after the swap",
        || async { ok.load(Ordering::SeqCst) > after_swap + 100 },
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    for w in workers {
        w.await.unwrap();
    }
    assert_eq!(
        failed.load(Ordering::SeqCst),
        0,
        "{} ok",
        ok.load(Ordering::SeqCst)
    );
    assert_eq!(server.metrics.cert_reloads(), 1);
    assert_eq!(server.metrics.cert_reload_failures(), 0);
}

#[tokio::test]
async fn a_bad_new_pair_keeps_the_old_certificate_and_is_reported() {
    let (pki, mut volume, server) = setup().await;
    let first = served_cert(server.webhook, &pki).await;
    let other = pki.leaf("webhook-2");
    let unrelated = pki.leaf("webhook-3");

    // Certificate and key that do not belong together.
    volume.swap_in(other.cert_pem.as_bytes(), unrelated.key_pem.as_bytes());
    eventually(
        Duration::from_secs(10),
        "the failure to be reported",
        || async { server.metrics.cert_reload_failures() == 1 },
    )
    .await;
    assert_eq!(served_cert(server.webhook, &pki).await, first);
    let metrics = admin_get(server.admin, "/metrics").await.text();
    assert!(
        metrics.contains("helmop_webhook_cert_reload_failures_total 1"),
        "{metrics}"
    );

    // Garbage.
    volume.swap_in(
        b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        b"nope",
    );
    eventually(Duration::from_secs(10), "the second failure", || async {
        server.metrics.cert_reload_failures() == 2
    })
    .await;
    assert_eq!(served_cert(server.webhook, &pki).await, first);

    // A good pair recovers.
    volume.swap_in(other.cert_pem.as_bytes(), other.key_pem.as_bytes());
    eventually(Duration::from_secs(10), "the good pair", || async {
        served_cert(server.webhook, &pki).await == other.der
    })
    .await;
    assert_eq!(server.metrics.cert_reloads(), 1);
}
