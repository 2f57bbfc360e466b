//! `fleetsim`: N simulated downstream clusters in one process behind one plain-HTTP listener on 127.0.0.1,
//! each at a path of its own (`http://127.0.0.1:PORT/k8s/clusters/simI`, the way Rancher's proxy addresses
//! downstream clusters), each with its own objects and `kube-system` UID (helmop's cluster identity), serving exactly the calls
//! `kubectl-helmop` makes downstream (see [`super::store`]) and counting every request by verb and resource
//! the way kube-apiserver's `apiserver_request_total` does. Anything else (watches, discovery, other kinds,
//! strategic-merge or JSON patches, subresources) is answered 501 with what was asked, so a new call made by
//! the plugin shows up as a failure rather than as silence. Authentication is not checked.
//!
//! Every successful write is also broadcast ([`Fleet::subscribe`]) with the instant the store took it, so a
//! benchmark times when an object changed on the server itself instead of polling for it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use anyhow::Context;
use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use helmop_tests::ClusterInfo;
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::route::{self, Kind, Target};
use super::store::{ApiError, Store, parse_selector};

/// Requests by (verb, resource), as `apiserver_request_total` counts them (every answer, errors included).
pub type Counts = BTreeMap<(String, String), u64>;

/// Sums the writes of `counts` (verbs that change state).
pub fn writes(counts: &Counts) -> u64 {
    counts
        .iter()
        .filter(|((v, _), _)| route::is_write(v))
        .map(|(_, n)| n)
        .sum()
}

/// A request counter shared by a server and whoever reads its counts.
#[derive(Clone, Default)]
pub struct Counter(Arc<Mutex<Counts>>);

impl Counter {
    pub fn count(&self, verb: &str, resource: &str) {
        let mut counts = self.0.lock().unwrap_or_else(|p| p.into_inner());
        *counts
            .entry((verb.to_owned(), resource.to_owned()))
            .or_insert(0) += 1;
    }

    pub fn counts(&self) -> Counts {
        self.0.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// A write a simulated cluster served, as the store answered it.
#[derive(Debug, Clone)]
pub struct Written {
    /// Index of the cluster in [`Fleet::clusters`].
    pub cluster: usize,
    /// When the store took the write (before the answer went out).
    pub at: Instant,
    pub verb: &'static str,
    pub plural: &'static str,
    pub namespace: Option<String>,
    pub name: String,
    /// The object after the write (the deleted object for a delete).
    pub object: Value,
}

/// Notifications kept for a subscriber that falls behind; beyond that it sees `Lagged`.
const WRITTEN_BACKLOG: usize = 1 << 16;

/// One simulated cluster.
pub struct SimCluster {
    index: usize,
    store: Mutex<Store>,
    pub counter: Counter,
    written: broadcast::Sender<Arc<Written>>,
}

impl SimCluster {
    fn count(&self, verb: &str, resource: &str) {
        self.counter.count(verb, resource);
    }

    /// Tells the subscribers (none outside the watch benchmark, and then nothing is built).
    fn announce(&self, verb: &'static str, kind: &Kind, target: &Target, object: &Value) {
        if self.written.receiver_count() == 0 {
            return;
        }
        let name = object
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .or(target.name.as_deref())
            .unwrap_or_default()
            .to_owned();
        let _ = self.written.send(Arc::new(Written {
            cluster: self.index,
            at: Instant::now(),
            verb,
            plural: kind.plural,
            namespace: target.namespace.clone(),
            name,
            object: object.clone(),
        }));
    }

    pub fn counts(&self) -> Counts {
        self.counter.counts()
    }

    /// Runs `f` on the store (test setup and inspection; not counted as requests).
    pub fn with_store<T>(&self, f: impl FnOnce(&mut Store) -> T) -> T {
        f(&mut self.store.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

/// A running simulated fleet; its listeners stop when it is dropped.
pub struct Fleet {
    pub clusters: Vec<Arc<SimCluster>>,
    pub infos: Vec<ClusterInfo>,
    written: broadcast::Sender<Arc<Written>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    _dir: tempfile::TempDir,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Fleet {
    /// Starts `n` simulated clusters behind one listener, with a kubeconfig file per cluster.
    ///
    /// One listener rather than one per cluster: a listener per cluster plus the connections to it put a
    /// fleet of 10,000 past the 20,000 open files a process may hold here. The clients still see N servers
    /// (N base URLs, N connection pools, N identities); only the port is shared, as behind Rancher's proxy.
    pub async fn start(n: usize) -> anyhow::Result<Fleet> {
        let dir = tempfile::tempdir().context("creating a directory for fleetsim kubeconfigs")?;
        // Distinct per run and per cluster, so two fleets never share a cluster identity.
        let run = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
            ^ u64::from(std::process::id()) << 40;
        let (written, _) = broadcast::channel(WRITTEN_BACKLOG);
        let mut fleet = Fleet {
            clusters: Vec::new(),
            infos: Vec::new(),
            written,
            tasks: Vec::new(),
            _dir: dir,
        };
        for i in 0..n {
            fleet.clusters.push(Arc::new(SimCluster {
                index: i,
                store: Mutex::new(Store::new(
                    run.wrapping_add((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
                )),
                counter: Counter::default(),
                written: fleet.written.clone(),
            }));
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fleetsim listener")?;
        let addr = listener.local_addr()?;
        let app = Router::new()
            .fallback(handle)
            .with_state(Arc::new(fleet.clusters.clone()));
        fleet.tasks.push(tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                eprintln!("fleetsim listener {addr} stopped: {e}");
            }
        }));
        for i in 0..n {
            let name = format!("sim{i}");
            let server = format!("http://{addr}{CLUSTERS_PATH}{name}");
            fleet
                .infos
                .push(write_kubeconfig(fleet._dir.path(), &name, &server)?);
        }
        Ok(fleet)
    }

    /// Every successful write served from now on, by any cluster of the fleet.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Written>> {
        self.written.subscribe()
    }

    /// Requests per cluster since the start.
    pub fn counts(&self) -> Vec<Counts> {
        self.clusters.iter().map(|c| c.counts()).collect()
    }
}

/// Where a simulated cluster's API is, below the listener: `{CLUSTERS_PATH}sim{index}`.
const CLUSTERS_PATH: &str = "/k8s/clusters/";

/// The cluster a request is for and the API path within it: `/k8s/clusters/sim7/api/v1/...` is cluster 7's
/// `/api/v1/...`.
fn cluster_path(path: &str) -> Option<(usize, &str)> {
    let rest = path.strip_prefix(CLUSTERS_PATH)?.strip_prefix("sim")?;
    let (index, api) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((index.parse().ok()?, api))
}

pub fn write_kubeconfig(dir: &Path, name: &str, server: &str) -> anyhow::Result<ClusterInfo> {
    let kubeconfig = dir.join(format!("{name}.kubeconfig"));
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n\
         contexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}\n\
         current-context: {name}\nusers:\n- name: {name}\n  user:\n    token: fleetsim\n"
    );
    std::fs::write(&kubeconfig, yaml)
        .with_context(|| format!("writing {}", kubeconfig.display()))?;
    Ok(ClusterInfo {
        name: name.to_owned(),
        server: server.to_owned(),
        kubeconfig,
        context: name.to_owned(),
        ca_file: PathBuf::new(),
    })
}

fn answer(code: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn error(e: &ApiError) -> Response {
    answer(e.code, &e.status())
}

fn not_implemented(method: &Method, uri: &Uri) -> Response {
    error(&ApiError::new(
        501,
        "NotImplemented",
        format!("fleetsim does not implement {method} {uri}"),
    ))
}

fn query(uri: &Uri) -> BTreeMap<String, String> {
    uri.query()
        .map(|q| url_decode_pairs(q).into_iter().collect())
        .unwrap_or_default()
}

fn url_decode_pairs(q: &str) -> Vec<(String, String)> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The view a client asked for with `Accept: ...;as=PartialObjectMetadata[List]`.
fn metadata_only(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("as=PartialObjectMetadata"))
}

fn partial(item: &Value) -> Value {
    json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata", "metadata": item["metadata"]})
}

fn manager(q: &BTreeMap<String, String>, headers: &HeaderMap) -> String {
    // The API server's default: the user agent up to its first '/'.
    q.get("fieldManager").cloned().unwrap_or_else(|| {
        headers
            .get(header::USER_AGENT)
            .and_then(|v| v.to_str().ok())
            .and_then(|ua| ua.split('/').next())
            .unwrap_or("unknown")
            .to_owned()
    })
}

fn json_body(body: &Bytes) -> Result<Value, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(
            400,
            "BadRequest",
            format!("fleetsim reads JSON bodies only: {e}"),
        )
    })
}

async fn handle(
    State(clusters): State<Arc<Vec<Arc<SimCluster>>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some((cluster, path)) =
        cluster_path(uri.path()).and_then(|(i, path)| Some((clusters.get(i)?, path)))
    else {
        return error(&ApiError::new(
            404,
            "NotFound",
            format!("fleetsim has no cluster at {}", uri.path()),
        ));
    };
    if method == Method::GET && path == "/version" {
        cluster.count("GET", "version");
        return answer(
            200,
            &json!({"major": "1", "minor": "20", "gitVersion": "v1.20.2-fleetsim"}),
        );
    }
    let Some(target) = route::parse(path) else {
        cluster.count("OTHER", path);
        return not_implemented(&method, &uri);
    };
    let q = query(&uri);
    let content_type = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let watch = q.get("watch").is_some_and(|w| w == "true" || w == "1");
    let verb = route::verb(method.as_str(), &target, content_type, watch);
    cluster.count(verb, &target.plural);
    let Some(kind) = target.kind() else {
        // What a real API server answers for a kind it does not serve (helmop skips e.g. Argo Rollouts).
        if target.group.contains('.') {
            return error(&ApiError::new(
                404,
                "NotFound",
                "the server could not find the requested resource",
            ));
        }
        return not_implemented(&method, &uri);
    };
    let result = {
        let mut store = cluster.store.lock().unwrap_or_else(|p| p.into_inner());
        serve(
            &mut store,
            kind,
            &target,
            verb,
            &q,
            &headers,
            content_type,
            &body,
        )
    };
    match result {
        Ok((code, value)) => {
            if route::is_write(verb) {
                cluster.announce(verb, kind, &target, &value);
            }
            answer(code, &value)
        }
        Err(e) if e.code == 501 => not_implemented(&method, &uri),
        Err(e) => error(&e),
    }
}

#[allow(clippy::too_many_arguments)]
fn serve(
    store: &mut Store,
    kind: &Kind,
    target: &Target,
    verb: &str,
    q: &BTreeMap<String, String>,
    headers: &HeaderMap,
    content_type: &str,
    body: &Bytes,
) -> Result<(u16, Value), ApiError> {
    let unsupported = || Err(ApiError::new(501, "NotImplemented", "not implemented"));
    if q.get("dryRun").is_some() || q.get("fieldSelector").is_some_and(|s| !s.is_empty()) {
        return unsupported();
    }
    let ns = target.namespace.as_deref();
    let meta_only = metadata_only(headers);
    match (verb, target.name.as_deref()) {
        ("GET", Some(name)) => {
            let item = store.get(kind, ns, name)?;
            Ok((200, if meta_only { partial(&item) } else { item }))
        }
        ("LIST", None) => {
            let selector = parse_selector(q.get("labelSelector").map_or("", String::as_str))?;
            let limit = q.get("limit").and_then(|l| l.parse().ok());
            let page = store.list(
                kind,
                ns,
                &selector,
                limit,
                q.get("continue")
                    .map(String::as_str)
                    .filter(|c| !c.is_empty()),
            )?;
            let mut meta = json!({"resourceVersion": page.resource_version});
            if let Some(token) = page.continue_token {
                meta["continue"] = json!(token);
                meta["remainingItemCount"] = json!(page.remaining);
            }
            let (api_version, list_kind, items) = if meta_only {
                (
                    "meta.k8s.io/v1".to_owned(),
                    "PartialObjectMetadataList".to_owned(),
                    page.items.iter().map(partial).collect(),
                )
            } else {
                (kind.api_version(), format!("{}List", kind.kind), page.items)
            };
            Ok((
                200,
                json!({"apiVersion": api_version, "kind": list_kind, "metadata": meta, "items": items}),
            ))
        }
        ("POST", None) => {
            let out = store.create(kind, ns, json_body(body)?, &manager(q, headers))?;
            Ok((201, out))
        }
        ("APPLY", Some(name)) => {
            let Some(field_manager) = q.get("fieldManager") else {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            };
            let force = q.get("force").is_some_and(|f| f == "true");
            store.apply(kind, ns, name, json_body(body)?, field_manager, force)
        }
        ("PATCH", Some(name)) if content_type.starts_with("application/merge-patch+json") => Ok((
            200,
            store.merge_patch(kind, ns, name, json_body(body)?, &manager(q, headers))?,
        )),
        ("DELETE", Some(name)) if kind.kind == "Secret" || kind.kind == "ConfigMap" => {
            let options = if body.is_empty() {
                json!({})
            } else {
                json_body(body)?
            };
            let uid = options
                .pointer("/preconditions/uid")
                .and_then(Value::as_str);
            let version = options
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str);
            Ok((200, store.delete(kind, ns, name, uid, version)?))
        }
        _ => unsupported(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_query_values() {
        assert_eq!(
            decode("helmop.dev%2Fmanaged-by%3Dkubectl-helmop"),
            "helmop.dev/managed-by=kubectl-helmop"
        );
        assert_eq!(decode("a+b%"), "a b%");
    }

    async fn create_namespace(client: &kube::Client, name: &str) {
        use k8s_openapi::api::core::v1::Namespace;
        use kube::api::{Api, PostParams};
        let ns: Namespace =
            serde_json::from_value(json!({"metadata": {"name": name}})).expect("a namespace");
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .expect("namespace created");
    }

    #[tokio::test]
    async fn announces_each_write_with_the_object_and_nothing_for_reads() {
        use k8s_openapi::api::core::v1::ConfigMap;
        use kube::api::{Api, Patch, PatchParams, PostParams};

        let fleet = Fleet::start(2).await.expect("fleetsim starts");
        let mut written = fleet.subscribe();
        let client = fleet.infos[1].client().await;
        create_namespace(&client, "n").await;
        let cms: Api<ConfigMap> = Api::namespaced(client, "n");
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"k": "1"}}))
                .expect("a ConfigMap");
        let before = Instant::now();
        cms.create(&PostParams::default(), &cm)
            .await
            .expect("ConfigMap created");
        cms.get("c").await.expect("ConfigMap read");
        cms.patch(
            "c",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"k": "2"}})),
        )
        .await
        .expect("ConfigMap patched");
        let mut seen = Vec::new();
        for _ in 0..3 {
            let w = written.recv().await.expect("a write notification");
            seen.push((
                w.cluster,
                w.verb,
                w.plural,
                w.namespace.clone(),
                w.name.clone(),
                w.object.pointer("/data/k").cloned(),
                w.at >= before,
            ));
        }
        assert_eq!(
            seen,
            vec![
                (1, "POST", "namespaces", None, "n".into(), None, false),
                (
                    1,
                    "POST",
                    "configmaps",
                    Some("n".into()),
                    "c".into(),
                    Some(json!("1")),
                    true
                ),
                (
                    1,
                    "PATCH",
                    "configmaps",
                    Some("n".into()),
                    "c".into(),
                    Some(json!("2")),
                    true
                ),
            ]
        );
        // The GET announced nothing.
        assert!(written.try_recv().is_err());
    }

    #[test]
    fn a_path_names_its_cluster_and_the_api_path_within() {
        assert_eq!(
            cluster_path("/k8s/clusters/sim12/api/v1/namespaces"),
            Some((12, "/api/v1/namespaces"))
        );
        assert_eq!(cluster_path("/k8s/clusters/sim3"), Some((3, "")));
        assert_eq!(cluster_path("/k8s/clusters/sim/api"), None);
        assert_eq!(cluster_path("/k8s/clusters/simx1/api"), None);
        assert_eq!(cluster_path("/api/v1/namespaces"), None);
    }

    #[tokio::test]
    async fn clusters_behind_one_listener_keep_their_own_objects() {
        use k8s_openapi::api::core::v1::Namespace;
        use kube::api::Api;

        let fleet = Fleet::start(2).await.expect("fleetsim starts");
        let (zero, one) = (fleet.infos[0].client().await, fleet.infos[1].client().await);
        create_namespace(&one, "n").await;
        for (client, holds) in [(one, true), (zero, false)] {
            let found = Api::<Namespace>::all(client).get_opt("n").await;
            assert_eq!(found.expect("read").is_some(), holds);
        }
        // A cluster the fleet does not have is not found, not served by another.
        let beyond = fleet.infos[1].server.replace("/sim1", "/sim2");
        let client = kube::Client::try_from(kube::Config::new(beyond.parse().expect("a URL")))
            .expect("a client");
        let err = client.apiserver_version().await;
        assert!(
            matches!(&err, Err(kube::Error::Api(s)) if s.code == 404),
            "{err:?}"
        );
    }
}
