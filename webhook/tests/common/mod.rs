//! In-process harness for the protocol and TLS tests: rcgen certificates laid out like a Kubernetes Secret
//! volume, a scripted `Handlers`, the real `Server`, and small HTTPS clients.
#![allow(dead_code)] // each test binary uses a different part

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use futures::future::BoxFuture;
use helmop_webhook::admission::Request as AdmissionRequest;
use helmop_webhook::{Handlers, Metrics, ServeOptions, Server, Verdict, Webhook};
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

pub type Behaviour =
    Arc<dyn Fn(Webhook, AdmissionRequest) -> BoxFuture<'static, Verdict> + Send + Sync>;

/// What the fake handlers saw, per request.
#[derive(Debug, Clone, PartialEq)]
pub struct Seen {
    pub webhook: Webhook,
    pub uid: String,
    pub dry_run: bool,
}

pub struct FakeHandlers {
    pub ready: AtomicBool,
    pub behaviour: Behaviour,
    pub seen: Mutex<Vec<Seen>>,
    pub calls: AtomicUsize,
}

impl FakeHandlers {
    pub fn new(behaviour: Behaviour) -> Arc<FakeHandlers> {
        Arc::new(FakeHandlers {
            ready: AtomicBool::new(true),
            behaviour,
            seen: Mutex::new(Vec::new()),
            calls: AtomicUsize::new(0),
        })
    }

    /// Allows everything; mutations get a one-operation patch.
    pub fn allowing() -> Arc<FakeHandlers> {
        Self::new(Arc::new(|webhook, _req| {
            Box::pin(async move {
                match webhook {
                    Webhook::Workloads => Verdict::Allow {
                        patch: Some(stamp_patch()),
                        warnings: vec!["stamped".into()],
                    },
                    _ => Verdict::allow(),
                }
            })
        }))
    }
}

impl Handlers for FakeHandlers {
    fn review<'a>(&'a self, webhook: Webhook, req: &'a AdmissionRequest) -> BoxFuture<'a, Verdict> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.seen.lock().unwrap().push(Seen {
            webhook,
            uid: req.uid.clone(),
            dry_run: req.dry_run,
        });
        (self.behaviour)(webhook, req.clone())
    }

    fn ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

pub fn stamp_patch() -> json_patch::Patch {
    serde_json::from_value(json!([
        {"op": "add", "path": "/spec/template/metadata/annotations/helmop.dev~1config-hash", "value": "v1:0123abcd"}
    ]))
    .unwrap()
}

/// A CA and leaf certificates it signs for `localhost` / 127.0.0.1.
pub struct Pki {
    pub ca_pem: String,
    pub ca_der: CertificateDer<'static>,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

pub struct Leaf {
    pub cert_pem: String,
    pub key_pem: String,
    pub der: CertificateDer<'static>,
}

impl Pki {
    pub fn new() -> Pki {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "helmop test CA");
        let ca = params.self_signed(&key).unwrap();
        Pki {
            ca_pem: ca.pem(),
            ca_der: ca.der().clone(),
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    pub fn leaf(&self, common_name: &str) -> Leaf {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
                .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, common_name);
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Leaf {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
            der: cert.der().clone(),
        }
    }
}

/// A directory laid out the way the kubelet writes Secret volumes: `tls.crt -> ..data/tls.crt`,
/// `..data -> ..<timestamp>`, swapped atomically by renaming a new `..data` symlink over the old one.
pub struct SecretVolume {
    pub dir: tempfile::TempDir,
    generation: usize,
}

impl SecretVolume {
    pub fn new(leaf: &Leaf) -> SecretVolume {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("..data/tls.crt", dir.path().join("tls.crt")).unwrap();
        std::os::unix::fs::symlink("..data/tls.key", dir.path().join("tls.key")).unwrap();
        let mut volume = SecretVolume { dir, generation: 0 };
        volume.swap_in(leaf.cert_pem.as_bytes(), leaf.key_pem.as_bytes());
        volume
    }

    pub fn cert(&self) -> PathBuf {
        self.dir.path().join("tls.crt")
    }

    pub fn key(&self) -> PathBuf {
        self.dir.path().join("tls.key")
    }

    /// Writes a new timestamped directory, re-points `..data` with an atomic rename and removes the old
    /// directory, exactly as the kubelet's AtomicWriter does.
    pub fn swap_in(&mut self, cert: &[u8], key: &[u8]) {
        let root = self.dir.path();
        let previous = std::fs::read_link(root.join("..data")).ok();
        self.generation += 1;
        let name = format!(
            "..2025_01_01_00_00_{:02}.{}",
            self.generation,
            std::process::id()
        );
        std::fs::create_dir(root.join(&name)).unwrap();
        std::fs::write(root.join(&name).join("tls.crt"), cert).unwrap();
        std::fs::write(root.join(&name).join("tls.key"), key).unwrap();
        std::os::unix::fs::symlink(&name, root.join("..data_tmp")).unwrap();
        std::fs::rename(root.join("..data_tmp"), root.join("..data")).unwrap();
        if let Some(previous) = previous {
            std::fs::remove_dir_all(root.join(previous)).unwrap();
        }
    }
}

pub struct Running {
    pub webhook: SocketAddr,
    pub admin: SocketAddr,
    pub metrics: Metrics,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    pub task: tokio::task::JoinHandle<helmop_webhook::Result<()>>,
}

impl Running {
    /// Sends the shutdown signal; `task` then finishes once drained.
    pub fn shutdown(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

pub fn options(volume: &SecretVolume) -> ServeOptions {
    ServeOptions {
        listen: "127.0.0.1:0".parse().unwrap(),
        admin_listen: "127.0.0.1:0".parse().unwrap(),
        tls_cert: volume.cert(),
        tls_key: volume.key(),
        request_timeout: Duration::from_secs(4),
        cert_poll_interval: Duration::from_millis(50),
        shutdown_delay: Duration::ZERO,
        drain_timeout: Duration::from_secs(5),
        handshake_timeout: Duration::from_secs(2),
        header_read_timeout: Duration::from_secs(10),
        client_ca: None,
        limits: helmop_webhook::server::Limits::default(),
    }
}

pub async fn start(options: ServeOptions, handlers: Arc<dyn Handlers>) -> Running {
    let metrics = Metrics::new();
    let server = Server::bind(options, handlers, metrics.clone())
        .await
        .unwrap();
    let (webhook, admin) = (server.webhook_addr(), server.admin_addr());
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(async move {
        let _ = rx.await;
    }));
    Running {
        webhook,
        admin,
        metrics,
        stop: Some(tx),
        task,
    }
}

pub fn client_config(
    pki: &Pki,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// [`client_config`] (TLS 1.2 and 1.3, http/1.1) presenting `leaf` as the client certificate.
pub fn client_config_with_cert(pki: &Pki, leaf: &Leaf) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(pki.ca_der.clone()).unwrap();
    use rustls::pki_types::pem::PemObject;
    let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(leaf.key_pem.as_bytes()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
    .unwrap()
    .with_root_certificates(roots)
    .with_client_auth_cert(vec![leaf.der.clone()], key)
    .unwrap();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(config)
}

pub async fn tls_connect(
    addr: SocketAddr,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = TcpStream::connect(addr).await?;
    TlsConnector::from(config)
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
}

/// The leaf certificate a fresh connection is served.
pub async fn served_cert(addr: SocketAddr, pki: &Pki) -> CertificateDer<'static> {
    let stream = tls_connect(addr, client_config(pki, &[&rustls::version::TLS13], &[]))
        .await
        .unwrap();
    stream.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

/// An HTTP/1.1 keep-alive connection.
pub struct H1 {
    sender: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
}

pub struct Reply {
    pub status: u16,
    pub body: Vec<u8>,
    /// The `Connection` header of an HTTP/1.1 answer (`None` when absent, and for every other protocol).
    pub connection: Option<String>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl H1 {
    pub async fn connect(addr: SocketAddr, pki: &Pki) -> H1 {
        Self::connect_with(
            addr,
            client_config(pki, &[&rustls::version::TLS13], &[b"http/1.1"]),
        )
        .await
        .unwrap()
    }

    /// A connection with `config`; the handshake's outcome as the error.
    pub async fn connect_with(
        addr: SocketAddr,
        config: Arc<rustls::ClientConfig>,
    ) -> Result<H1, String> {
        let stream = tls_connect(addr, config).await.map_err(|e| e.to_string())?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        Ok(H1 { sender })
    }

    pub async fn send(
        &mut self,
        method: &str,
        path: &str,
        body: Vec<u8>,
    ) -> Result<Reply, hyper::Error> {
        self.sender.ready().await?;
        let request = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "localhost")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let response = self.sender.send_request(request).await?;
        let status = response.status().as_u16();
        let connection = response
            .headers()
            .get("connection")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let body = response.into_body().collect().await?.to_bytes().to_vec();
        Ok(Reply {
            status,
            body,
            connection,
        })
    }
}

/// An HTTP/2 connection (ALPN h2).
pub async fn h2_send(addr: SocketAddr, pki: &Pki, path: &str, body: Vec<u8>) -> (String, Reply) {
    let stream = tls_connect(
        addr,
        client_config(pki, &[&rustls::version::TLS13], &[b"h2"]),
    )
    .await
    .unwrap();
    let alpn = String::from_utf8_lossy(stream.get_ref().1.alpn_protocol().unwrap_or_default())
        .into_owned();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = Request::builder()
        .method("POST")
        .uri(format!("https://localhost{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    (
        alpn,
        Reply {
            status,
            body,
            connection: None,
        },
    )
}

/// Sends a request written by hand (for framing the hyper client would not produce, and for responses that come
/// before the body is sent) while reading the response concurrently; write errors are ignored, since the server
/// may answer and close before taking the whole body.
pub async fn raw_exchange(
    addr: SocketAddr,
    pki: &Pki,
    head: String,
    body: Vec<u8>,
    chunked: bool,
) -> Reply {
    let stream = tls_connect(
        addr,
        client_config(pki, &[&rustls::version::TLS13], &[b"http/1.1"]),
    )
    .await
    .unwrap();
    let (mut reader, mut writer) = tokio::io::split(stream);
    let write = tokio::spawn(async move {
        writer.write_all(head.as_bytes()).await?;
        if chunked {
            for chunk in body.chunks(64 * 1024) {
                writer
                    .write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                    .await?;
                writer.write_all(chunk).await?;
                writer.write_all(b"\r\n").await?;
            }
            writer.write_all(b"0\r\n\r\n").await?;
        } else {
            writer.write_all(&body).await?;
        }
        writer.flush().await?;
        Ok::<_, std::io::Error>(writer)
    });
    let mut buf = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    let deadline = Instant::now() + Duration::from_secs(20);
    let reply = loop {
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
            let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
            let length: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().parse().unwrap())
                })
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                break Reply {
                    status,
                    body: buf[end + 4..end + 4 + length].to_vec(),
                    connection: None,
                };
            }
        }
        assert!(
            Instant::now() < deadline,
            "no complete response: {}",
            String::from_utf8_lossy(&buf)
        );
        let n = tokio::time::timeout(Duration::from_secs(20), reader.read(&mut chunk))
            .await
            .unwrap()
            .unwrap();
        assert!(
            n > 0,
            "connection closed before a complete response: {}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    write.abort();
    reply
}

pub async fn admin_get(addr: SocketAddr, path: &str) -> Reply {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = Request::builder()
        .uri(path)
        .header("host", "localhost")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .unwrap()
        .to_bytes()
        .to_vec();
    Reply {
        status,
        body,
        connection: None,
    }
}

/// An AdmissionReview v1 as the API server sends it.
pub fn review(uid: &str, webhook: Webhook, dry_run: bool) -> Value {
    let (group, version, kind, resource, operation, object) = match webhook {
        Webhook::Helmops => (
            "fleet.cattle.io",
            "v1alpha1",
            "HelmOp",
            "helmops",
            "CREATE",
            json!({"apiVersion": "fleet.cattle.io/v1alpha1", "kind": "HelmOp",
                   "metadata": {"name": "app", "namespace": "fleet-default"},
                   "spec": {"helm": {"chart": "app", "repo": "https://charts.example.com", "version": "1.0.0"},
                            "downstreamResources": [{"kind": "Secret", "name": "db"}]}}),
        ),
        Webhook::References => (
            "",
            "v1",
            "Secret",
            "secrets",
            "DELETE",
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "db", "namespace": "fleet-default"},
                   "data": {"password": "aHVudGVyMg=="}}),
        ),
        Webhook::Workloads => (
            "apps",
            "v1",
            "Deployment",
            "deployments",
            "CREATE",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web", "namespace": "fleet-default"},
                   "spec": {"template": {"metadata": {"labels": {"app": "web"}},
                                         "spec": {"containers": [{"name": "web", "image": "nginx"}]}}}}),
        ),
    };
    let (object_key, object) = if operation == "DELETE" {
        ("oldObject", object)
    } else {
        ("object", object)
    };
    let mut request = json!({
        "uid": uid,
        "kind": {"group": group, "version": version, "kind": kind},
        "resource": {"group": group, "version": version, "resource": resource},
        "requestKind": {"group": group, "version": version, "kind": kind},
        "requestResource": {"group": group, "version": version, "resource": resource},
        "name": object["metadata"]["name"],
        "namespace": "fleet-default",
        "operation": operation,
        "userInfo": {"username": "kubernetes-admin", "groups": ["system:masters", "system:authenticated"]},
        "dryRun": dry_run,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
    });
    request[object_key] = object;
    json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request})
}

/// A review padded (inside the object, as a big annotation would be) to exactly `size` bytes.
pub fn review_of_size(uid: &str, size: usize) -> Vec<u8> {
    let mut v = review(uid, Webhook::Helmops, false);
    v["request"]["object"]["metadata"]["annotations"] = json!({"pad": ""});
    let base = serde_json::to_vec(&v).unwrap().len();
    assert!(size >= base, "{size} < {base}");
    v["request"]["object"]["metadata"]["annotations"]["pad"] = json!("x".repeat(size - base));
    let body = serde_json::to_vec(&v).unwrap();
    assert_eq!(body.len(), size);
    body
}

/// A HelmOp review whose `helm.values` hold a dense list of `values` zeros (two bytes each in the body).
pub fn review_of_values(uid: &str, values: usize) -> Vec<u8> {
    let mut v = review(uid, Webhook::Helmops, false);
    v["request"]["object"]["spec"] =
        json!({"helm": {"chart": "app", "values": {"dense": vec![0; values]}}});
    serde_json::to_vec(&v).unwrap()
}

/// Polls `check` until it holds or `timeout` passes.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
