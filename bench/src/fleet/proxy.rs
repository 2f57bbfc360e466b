//! A counting proxy in front of a real kube-apiserver: plain HTTP on 127.0.0.1, forwarded with the admin
//! client of the cluster, each request counted exactly as the simulated clusters count theirs
//! ([`super::route`]). The equivalence test puts one in front of each real API server so both sides' writes
//! are the plugin's alone, counted the same way (the API server's own metrics also count the
//! controller-manager's writes in new namespaces).

use std::sync::Arc;

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, Request, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use helmop_tests::ClusterInfo;

use super::route;
use super::sim::{Counter, write_kubeconfig};

struct Upstream {
    client: kube::Client,
    counter: Counter,
}

/// A running proxy; stops when dropped.
pub struct Proxy {
    pub info: ClusterInfo,
    pub counter: Counter,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Proxy {
    /// Starts a proxy to `real`; its kubeconfig goes into `dir`.
    pub async fn start(real: &ClusterInfo, dir: &std::path::Path) -> anyhow::Result<Proxy> {
        let counter = Counter::default();
        let upstream = Arc::new(Upstream {
            client: real.client().await,
            counter: counter.clone(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding a proxy listener")?;
        let addr = listener.local_addr()?;
        let app = Router::new().fallback(forward).with_state(upstream);
        let task = tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("proxy {addr} stopped: {e}");
            }
        });
        let info = write_kubeconfig(
            dir,
            &format!("proxy-{}", real.name),
            &format!("http://{addr}"),
        )?;
        Ok(Proxy {
            info,
            counter,
            task,
        })
    }
}

async fn forward(
    State(up): State<Arc<Upstream>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let watch = uri
        .query()
        .is_some_and(|q| q.split('&').any(|p| p == "watch=true" || p == "watch=1"));
    match route::parse(uri.path()) {
        Some(target) => up.counter.count(
            route::verb(method.as_str(), &target, content_type, watch),
            &target.plural,
        ),
        None => up.counter.count("OTHER", uri.path()),
    }
    let path = uri.path_and_query().map_or("/", |p| p.as_str());
    let mut request = Request::builder().method(method).uri(path);
    for name in [header::CONTENT_TYPE, header::ACCEPT, header::USER_AGENT] {
        if let Some(v) = headers.get(&name) {
            request = request.header(name, v);
        }
    }
    let request = match request.body(kube::client::Body::from(body.to_vec())) {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_REQUEST, format!("proxy: {e}")).into_response(),
    };
    let response = match up.client.send(request).await {
        Ok(r) => r,
        Err(e) => return (StatusCode::BAD_GATEWAY, format!("proxy: {e}")).into_response(),
    };
    let (parts, body) = response.into_parts();
    match body.collect_bytes().await {
        Ok(bytes) => {
            let mut out = (parts.status, bytes).into_response();
            if let Some(ct) = parts.headers.get(header::CONTENT_TYPE) {
                out.headers_mut().insert(header::CONTENT_TYPE, ct.clone());
            }
            out
        }
        Err(e) => (StatusCode::BAD_GATEWAY, format!("proxy: {e}")).into_response(),
    }
}
