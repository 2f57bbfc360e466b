//! The HTTP client of a downstream cluster: kube's own stack (base URI, retries, authentication,
//! impersonation headers, rustls, timeouts) over a connection pool that keeps at most
//! [`IDLE_PER_CLUSTER`] idle connections per cluster.
//!
//! kube's default pool keeps every connection it ever opened for 90 s. hyper hands a connection
//! back to the pool from a task of its own once a response is read, and a request that finds no
//! idle connection meanwhile opens another, which is kept too: over a few runs each cluster held
//! about four (docs/performance.md, section 6), so a watcher over 10,000 clusters needed 40,000
//! descriptors (and their buffers), twice a process's open-file limit on common hosts. A run talks
//! to one cluster one request at a time, so one idle connection is all the next run reuses. (The
//! exception: observation reads wanted places it did not list up to `READS_AT_ONCE` at a time,
//! which on a cluster where they stand in an existing namespace opens that many connections for
//! the run; the extra ones close when idle. Measured: 7 connections opened per cluster by a watcher
//! over 1,000 fleetsim clusters before its first edit, none during the edits.)
//!
//! Clients whose TLS inputs are the same (trust roots, no client certificate, no fixed server
//! name) share one rustls configuration (`tls_config`). kube builds one per client, each with
//! its own parsed copy of the roots: behind Rancher's proxy every cluster has the same CA, and a
//! kubeconfig without a CA gets the system's (about 140 roots, tens of KiB parsed), which over
//! 10,000 clusters was most of a watcher's memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

/// Idle connections kept per downstream cluster between requests and runs.
pub const IDLE_PER_CLUSTER: usize = 1;

/// How long an idle connection is kept (kube's and hyper's default): long enough to span the runs
/// of a stream of edits, short enough that a quiet watcher holds no downstream connection.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

/// A client for one downstream cluster. A kubeconfig with a proxy gets kube's own client, which
/// answers for proxies exactly as it always did.
pub fn downstream_client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    let tls = match tls_config(&config)? {
        Some(shared) => hyper_rustls::HttpsConnector::from((http, shared)),
        None => config.rustls_https_connector_with_connector(http)?,
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(tls);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    let pool = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .pool_idle_timeout(IDLE_TIMEOUT)
        .pool_max_idle_per_host(IDLE_PER_CLUSTER)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        // The retry policy judges boxed errors, as in kube's own stack.
        .map_err(tower::BoxError::from)
        .service(pool);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// What decides a shareable rustls configuration: the roots and whether certificates are checked.
type TlsKey = [u8; 32];

/// The rustls configuration of `config` shared with every other client built from the same trust
/// inputs, or `None` when it is the client's own (a client certificate, an `exec` plugin that may
/// hand one, a CA file re-read on rotation, a fixed server name): kube builds those as before.
fn tls_config(config: &kube::Config) -> Result<Option<Arc<rustls::ClientConfig>>, kube::Error> {
    let auth = &config.auth_info;
    let own = auth.client_certificate.is_some()
        || auth.client_certificate_data.is_some()
        || auth.client_key.is_some()
        || auth.client_key_data.is_some()
        || auth.exec.is_some()
        || config.root_cert_file.is_some()
        || config.tls_server_name.is_some();
    if own {
        return Ok(None);
    }
    let key = tls_key(config);
    // Weak: a configuration lives as long as a client uses it, so clusters that come and go
    // leave nothing behind; dead entries are swept whenever one is added.
    static SHARED: Mutex<Option<HashMap<TlsKey, Weak<rustls::ClientConfig>>>> = Mutex::new(None);
    let mut shared = SHARED.lock().unwrap_or_else(|p| p.into_inner());
    let shared = shared.get_or_insert_with(HashMap::new);
    if let Some(found) = shared.get(&key).and_then(Weak::upgrade) {
        return Ok(Some(found));
    }
    let built = Arc::new(config.rustls_client_config()?);
    shared.retain(|_, c| c.strong_count() > 0);
    shared.insert(key, Arc::downgrade(&built));
    Ok(Some(built))
}

fn tls_key(config: &kube::Config) -> TlsKey {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    h.update([u8::from(config.accept_invalid_certs)]);
    // Length-prefixed, so no two lists of roots hash alike by regrouping their bytes.
    for root in config.root_cert.iter().flatten() {
        h.update((root.len() as u64).to_be_bytes());
        h.update(root);
    }
    h.finalize().into()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use hyper_util::rt::TokioIo;

    use super::*;

    /// Connections a plain-HTTP stand-in for an API server accepted, and how many are still open.
    #[derive(Default)]
    struct Conns {
        accepted: AtomicUsize,
        open: AtomicUsize,
    }

    /// Serves `/version` on 127.0.0.1, each response after `delay` (so requests overlap).
    async fn server(delay: Duration) -> (String, Arc<Conns>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let conns = Arc::new(Conns::default());
        let counted = conns.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                counted.accepted.fetch_add(1, Ordering::SeqCst);
                counted.open.fetch_add(1, Ordering::SeqCst);
                let counted = counted.clone();
                tokio::spawn(async move {
                    let answer = hyper::service::service_fn(|_req| async move {
                        tokio::time::sleep(delay).await;
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            r#"{"major":"1","minor":"20","gitVersion":"v1.20.2"}"#.to_owned(),
                        ))
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), answer)
                        .await;
                    counted.open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        (url, conns)
    }

    async fn burst(client: &kube::Client, conns: &Conns) {
        let versions = futures::future::join_all((0..8).map(|_| client.apiserver_version())).await;
        assert!(versions.iter().all(Result::is_ok), "{versions:?}");
        assert_eq!(conns.accepted.load(Ordering::SeqCst), 8);
    }

    #[tokio::test]
    async fn a_burst_leaves_one_idle_connection_per_cluster_where_kube_keeps_all() {
        let delay = Duration::from_millis(50);
        let (url, conns) = server(delay).await;
        let ours = downstream_client(kube::Config::new(url.parse().unwrap())).unwrap();
        // What this replaces, side by side: kube's default pool.
        let (default_url, default_conns) = server(delay).await;
        let default =
            kube::Client::try_from(kube::Config::new(default_url.parse().unwrap())).unwrap();
        tokio::join!(burst(&ours, &conns), burst(&default, &default_conns));

        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while conns.open.load(Ordering::SeqCst) > IDLE_PER_CLUSTER
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert_eq!(conns.open.load(Ordering::SeqCst), IDLE_PER_CLUSTER);
        assert_eq!(default_conns.open.load(Ordering::SeqCst), 8);
        // The one kept is the one the next request uses.
        ours.apiserver_version().await.unwrap();
        assert_eq!(conns.accepted.load(Ordering::SeqCst), 8);
    }
    #[tokio::test]
    async fn a_kubeconfig_proxy_is_answered_by_kube_as_before() {
        let mut config = kube::Config::new("https://10.0.0.1:6443".parse().unwrap());
        config.proxy_url = Some("socks5://127.0.0.1:1080".parse().unwrap());
        let ours = downstream_client(config.clone())
            .map(|_| ())
            .map_err(|e| e.to_string());
        let kube = kube::Client::try_from(config)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(ours, kube);
        assert!(ours.is_err(), "kube is built without proxy support here");
    }

    fn with_ca(ca: &[u8]) -> kube::Config {
        let mut config = kube::Config::new("https://10.0.0.1:6443".parse().unwrap());
        config.root_cert = Some(vec![ca.to_vec()]);
        config
    }

    fn ca() -> Vec<u8> {
        let key = rcgen::KeyPair::generate().unwrap();
        let params = rcgen::CertificateParams::new(vec!["ca".to_owned()]).unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn clients_trusting_the_same_roots_share_one_tls_configuration_and_no_other() {
        let (a, b) = (ca(), ca());
        let first = tls_config(&with_ca(&a)).unwrap().unwrap();
        let again = tls_config(&with_ca(&a)).unwrap().unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        let other = tls_config(&with_ca(&b)).unwrap().unwrap();
        assert!(!Arc::ptr_eq(&first, &other));
        let mut insecure = with_ca(&a);
        insecure.accept_invalid_certs = true;
        assert!(!Arc::ptr_eq(
            &first,
            &tls_config(&insecure).unwrap().unwrap()
        ));
        // A client certificate, an exec plugin or a fixed server name make the configuration the client's own.
        let mut cert = with_ca(&a);
        cert.auth_info.client_certificate_data = Some("cert".to_owned());
        assert!(tls_config(&cert).unwrap().is_none());
        let mut named = with_ca(&a);
        named.tls_server_name = Some("kubernetes".to_owned());
        assert!(tls_config(&named).unwrap().is_none());
        let mut exec = with_ca(&a);
        exec.auth_info.exec = serde_json::from_value(serde_json::json!({
            "apiVersion": "client.authentication.k8s.io/v1", "command": "true"
        }))
        .unwrap();
        assert!(tls_config(&exec).unwrap().is_none());
        // One that no client holds any more is built anew, then shared again.
        drop((first, again));
        assert!(Arc::ptr_eq(
            &tls_config(&with_ca(&a)).unwrap().unwrap(),
            &tls_config(&with_ca(&a)).unwrap().unwrap()
        ));
    }
}
