//! What makes `propagate --watch` run again: watches (never polling) on the upstream cluster's
//! HelmOps, Clusters, ClusterGroups, BundleNamespaceMappings, and the Secrets and ConfigMaps of
//! the namespaces HelmOps live in. Metadata-only watches: a change is all that matters here, the
//! run reads what it needs; except the Clusters, which a watcher's runs read from this watch
//! ([`crate::cluster::cluster_store`]).
//!
//! Not watched: Clusters of namespaces mapped into a namespace-scoped run (they are listed each
//! run, and `--resync` picks up their changes), and Namespace labels (a mapping's
//! `namespaceSelector` is evaluated each run; watching every Namespace would need more RBAC).
//! The BundleNamespaceMapping watch does not count towards readiness: many installations do not
//! serve that kind, and without it there are no mappings to miss.
//!
//! BundleDeployments are watched for two fields only: `status.appliedDeploymentID` and
//! `status.downstreamResourcesGeneration`, which Fleet's agent sets when it applied a deployment and
//! copied the HelmOp's downstream resources itself. The
//! readers of such a copy may then be behind (Helm's re-apply of an unchanged Deployment is no UPDATE),
//! and the run restamps them. Status churn (conditions, resource lists, check-ins) triggers nothing; nor
//! does this watch count towards readiness (Fleet may not be installed).
//!
//! HelmOps, Clusters, ClusterGroups and BundleNamespaceMappings trigger only when what a plan
//! reads of them can have changed: `metadata.generation` (the spec: these kinds have a status
//! subresource, so a status write leaves it alone), labels, annotations, deletion
//! (`plan_fingerprint`), and of a Cluster's status only its schedule fields (`cluster_view`).
//! Fleet rewrites their status all the time (agent check-ins, conditions); those writes start no
//! run. Clusters are watched whole for that; the other kinds by their metadata. Sources trigger on every
//! change (their data is not in the metadata watched).
//!
//! Every watch lists again after a failure, with back-off (`watch::relist`): the Cluster store and
//! the Secret read cache stop serving when their watch fails, and only a listing makes them whole
//! again. A listing after the first may follow missed events, so it triggers a run as well.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use helmop_core::model::{BundleNamespaceMapping, Cluster, ClusterGroup, HelmOp};
use helmop_core::names;
use helmop_core::plan::HelmOpKey;
use helmop_core::resource::{ResourceKind, ResourceRef};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Client;
use kube::core::PartialObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::cluster::cluster_store::{Seen, WatchedCluster};
use crate::cluster::read_cache::ReadCache;
use crate::run::focus::SourceKey;
use crate::run::inventory::Selection;
use crate::run::scope::Scope;

use super::relist::relisting;

/// Why a run is wanted, in words (`Secret team/db changed`), and, for a change of a Secret or
/// ConfigMap that may be a source, which one, or for a changed or new HelmOp, which one (a run
/// may then cover only the clusters they concern, [`crate::run::focus`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Trigger {
    pub why: String,
    pub source: Option<SourceKey>,
    pub helmop: Option<HelmOpKey>,
}

/// The running watches; dropping this stops them.
pub struct Watches {
    tasks: Vec<JoinHandle<()>>,
    interesting: Interesting,
}

impl Watches {
    /// Namespaces a run found HelmOps in (with `-A` their Secrets and ConfigMaps matter).
    pub fn note_namespaces<'a>(&self, namespaces: impl IntoIterator<Item = &'a String>) {
        for ns in namespaces {
            self.interesting.add(ns);
        }
    }
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Namespaces whose Secrets and ConfigMaps matter with `-A`: those holding HelmOps or Clusters
/// (sources and kubeconfig Secrets), as the HelmOp and Cluster watches see them.
#[derive(Clone, Default)]
struct Interesting(Arc<RwLock<BTreeSet<String>>>);

impl Interesting {
    fn add(&self, ns: &str) {
        if let Ok(mut set) = self.0.write()
            && !set.contains(ns)
        {
            set.insert(ns.to_owned());
        }
    }

    fn contains(&self, ns: &str) -> bool {
        self.0.read().map(|s| s.contains(ns)).unwrap_or(true)
    }
}

/// How many watches have listed once (readiness, [`super::health`]).
#[derive(Debug, Default)]
pub struct Synced {
    total: AtomicUsize,
    done: AtomicUsize,
}

impl Synced {
    pub fn expect(&self, watches: usize) {
        self.total.store(watches, Ordering::Relaxed);
    }

    /// One watch finished its first listing.
    pub fn mark(&self) {
        self.done.fetch_add(1, Ordering::Relaxed);
    }

    /// `(synced, total)`.
    pub fn progress(&self) -> (usize, usize) {
        (
            self.done.load(Ordering::Relaxed),
            self.total.load(Ordering::Relaxed),
        )
    }
}

/// Starts the watches for the HelmOps of `scope` (its selection and shard). Clusters and
/// ClusterGroups matter when the downstream clusters come from Fleet Clusters (not
/// `--target-context`).
pub fn spawn(
    client: &Client,
    scope: &Scope,
    ours: OwnIds,
    reads: Option<Arc<ReadCache>>,
    tx: mpsc::Sender<Trigger>,
    synced: &Arc<Synced>,
) -> Watches {
    let (selection, shard) = (&scope.selection, &scope.shard);
    let fleet = scope.target_contexts.is_empty();
    let interesting = Interesting::default();
    let (namespace, helmop_config) = match selection {
        Selection::One { namespace, name } => (
            Some(namespace.clone()),
            watcher::Config::default().fields(&format!("metadata.name={name}")),
        ),
        Selection::Namespace(ns) => (Some(ns.clone()), watcher::Config::default()),
        Selection::All => (None, watcher::Config::default()),
    };
    // A shard watches its own HelmOps only: one relabelled away is gone from its watch.
    let helmop_config = match shard.label_selector() {
        Some(selector) => helmop_config.labels(&selector),
        None => helmop_config,
    };
    let all = namespace.is_none();
    let mut tasks = vec![watch_kind::<PartialObjectMeta<HelmOp>>(
        api(client, namespace.as_deref()),
        helmop_config,
        Kind {
            label: "HelmOp",
            marks: Marks::Namespace,
            plan_view: meta_view,
            focuses: true,
            keep: None,
            batch: None,
        },
        tx.clone(),
        interesting.clone(),
        synced.clone(),
    )];
    if fleet {
        tasks.push(watch_kind::<WatchedCluster>(
            crate::cluster::kube_api::api_in(client, namespace.as_deref()),
            watcher::Config::default(),
            Kind {
                label: "Cluster",
                marks: Marks::Namespace,
                plan_view: watched_cluster_view,
                focuses: false,
                keep: reads.clone().map(|reads| -> Keep<WatchedCluster> {
                    Box::new(move |seen| reads.clusters().see(seen.map(|c| &c.0)))
                }),
                batch: Some(CLUSTER_BATCH),
            },
            tx.clone(),
            interesting.clone(),
            synced.clone(),
        ));
        tasks.push(watch_kind::<PartialObjectMeta<ClusterGroup>>(
            api(client, namespace.as_deref()),
            watcher::Config::default(),
            Kind {
                label: "ClusterGroup",
                marks: Marks::Nothing,
                plan_view: meta_view,
                focuses: false,
                keep: None,
                batch: None,
            },
            tx.clone(),
            interesting.clone(),
            synced.clone(),
        ));
    }
    // Every Secret and ConfigMap, the labelled ones included: a source may carry helmop's label
    // (a copy from another management cluster, or one made by hand). Only this upstream's own
    // copies (when the upstream is also a downstream) are no reason to run: see `own_copy`.
    let sources = watcher::Config::default();
    let filter = if all { Some(interesting.clone()) } else { None };
    let ours = Arc::new(ours);
    tasks.push(watch_sources::<Secret>(
        api(client, namespace.as_deref()),
        sources.clone(),
        ResourceKind::Secret,
        tx.clone(),
        filter.clone(),
        ours.clone(),
        synced.clone(),
        reads,
    ));
    tasks.push(watch_sources::<ConfigMap>(
        api(client, namespace.as_deref()),
        sources,
        ResourceKind::ConfigMap,
        tx.clone(),
        filter,
        ours,
        synced.clone(),
        None,
    ));
    synced.expect(tasks.len());
    if fleet {
        tasks.push(watch_bundle_deployments(client, selection, tx.clone()));
        tasks.push(watch_kind::<PartialObjectMeta<BundleNamespaceMapping>>(
            api(client, namespace.as_deref()),
            watcher::Config::default(),
            Kind {
                label: "BundleNamespaceMapping",
                marks: Marks::NothingAndMayBeUnserved,
                plan_view: meta_view,
                focuses: false,
                keep: None,
                batch: None,
            },
            tx,
            interesting.clone(),
            Arc::new(Synced::default()),
        ));
    }
    Watches { tasks, interesting }
}

fn api<K>(client: &Client, namespace: Option<&str>) -> Api<PartialObjectMeta<K>>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>,
{
    crate::cluster::kube_api::api_in(client, namespace)
}

fn key<K: Resource>(obj: &K) -> (String, String) {
    (
        obj.meta().namespace.clone().unwrap_or_default(),
        obj.meta().name.clone().unwrap_or_default(),
    )
}

/// Sends without waiting: a full queue already holds triggers that will cause a run, and that run
/// reads the current state, this change included.
fn send(tx: &mpsc::Sender<Trigger>, reason: String) {
    let _ = tx.try_send(Trigger {
        why: reason,
        source: None,
        helmop: None,
    });
}

/// How a watched kind is treated.
struct Kind<K> {
    label: &'static str,
    marks: Marks,
    /// What a plan can read of an object, hashed: an update that leaves it alone (a status
    /// write) starts no run.
    plan_view: fn(&K) -> u64,
    /// A change or creation names the object (a HelmOp): the run may cover only its clusters.
    focuses: bool,
    /// Keeps what the watch sees for the runs (the Clusters, [`crate::cluster::cluster_store`]):
    /// listings, deletions, and the changes `plan_view` sees (what a plan reads: a store keeps
    /// nothing else); called before the event's trigger is sent, so the run it starts sees it.
    keep: Option<Keep<K>>,
    /// Once listed, how long the watch pauses each time it has nothing more to read, so the events
    /// meanwhile are read, decrypted and decoded together ([`CLUSTER_BATCH`]).
    batch: Option<Duration>,
}

/// The pause of the Cluster watch between batches of events. Every Fleet agent checks in on its
/// Cluster (at 1,000 Clusters and one check-in per 15 s, 67 status writes a second), and each event
/// read alone cost a wake-up, a read, a TLS record and a task poll of its own: nearly all of what
/// the watcher spent idle (docs/performance.md, section 6). A change a plan reads (labels, spec,
/// schedule) reaches the runs this much later at most; an edit of a source or a HelmOp does not
/// wait for it.
pub const CLUSTER_BATCH: Duration = Duration::from_millis(250);

type Keep<K> = Box<dyn Fn(Seen<'_, K>) + Send + Sync>;

fn watch_kind<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: Kind<K>,
    tx: mpsc::Sender<Trigger>,
    interesting: Interesting,
    synced: Arc<Synced>,
) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    let Kind {
        label,
        marks,
        plan_view,
        focuses,
        keep,
        batch,
    } = kind;
    let keep = move |seen: Seen<'_, K>| {
        if let Some(keep) = &keep {
            keep(seen);
        }
    };
    tokio::spawn(async move {
        let stream = relisting(api, config);
        let mut stream = std::pin::pin!(stream);
        let mut listed = false;
        let mut failing = false;
        // What each object's plan-relevant metadata was when last seen (one u64 per object),
        // rebuilt by every listing so deleted objects do not linger.
        let mut seen: HashMap<(String, String), u64> = HashMap::new();
        let mut listing: HashMap<(String, String), u64> = HashMap::new();
        let mut in_listing = false;
        loop {
            let event = match stream.next().now_or_never() {
                Some(event) => event,
                None => {
                    // Not while listing: the pages of a list would each wait.
                    if let Some(pause) = batch.filter(|_| listed && !in_listing) {
                        tokio::time::sleep(pause).await;
                    }
                    stream.next().await
                }
            };
            let Some(event) = event else { break };
            match event {
                // A listing: the start-up run covers the first, `InitDone` triggers for later ones.
                Ok(Event::InitApply(obj)) => {
                    if marks == Marks::Namespace {
                        interesting.add(&key(&obj).0);
                    }
                    listing.insert(key(&obj), plan_view(&obj));
                    keep(Seen::Listed(&obj));
                }
                Ok(Event::Apply(obj)) => {
                    let at = key(&obj);
                    let fingerprint = plan_view(&obj);
                    // What is kept is what a plan reads: a status-only write changes nothing of
                    // it but the resourceVersion (at 10,000 Clusters, 667 check-ins a second).
                    if seen.insert(at.clone(), fingerprint) == Some(fingerprint) {
                        tracing::trace!(kind = label, namespace = %at.0, name = %at.1, "status-only change: no run");
                        continue;
                    }
                    keep(Seen::Applied(&obj));
                    let (ns, name) = at;
                    if marks == Marks::Namespace {
                        interesting.add(&ns);
                    }
                    let _ = tx.try_send(Trigger {
                        why: format!("{label} {ns}/{name} changed"),
                        source: None,
                        helmop: focuses.then(|| HelmOpKey::new(&ns, &name)),
                    });
                }
                Ok(Event::Delete(obj)) => {
                    keep(Seen::Deleted(&obj));
                    let (ns, name) = key(&obj);
                    seen.remove(&(ns.clone(), name.clone()));
                    send(&tx, format!("{label} {ns}/{name} deleted"));
                }
                Ok(Event::Init) => {
                    keep(Seen::Listing);
                    listing.clear();
                    in_listing = true;
                }
                Ok(Event::InitDone) => {
                    keep(Seen::ListedAll);
                    in_listing = false;
                    seen = std::mem::take(&mut listing);
                    if listed {
                        send(&tx, format!("{label} watch re-listed"));
                    } else {
                        synced.mark();
                    }
                    listed = true;
                    if failing {
                        tracing::info!(kind = label, "watch reconnected");
                    }
                    failing = false;
                }
                Err(e) => {
                    keep(Seen::Failed);
                    if !failing {
                        if marks == Marks::NothingAndMayBeUnserved && is_not_served(&e) {
                            tracing::debug!(
                                kind = label,
                                "kind not served; watching for it with back-off"
                            );
                        } else {
                            tracing::warn!(kind = label, error = %e, "watch failed; retrying with back-off");
                        }
                    }
                    failing = true;
                }
            }
        }
    })
}

/// The BundleDeployments of the selected HelmOps (labelled with their Bundle, named after the HelmOp),
/// in every namespace: a run when what one's agent reports applied and copied changes ([`applied_id`]).
fn watch_bundle_deployments(
    client: &Client,
    selection: &Selection,
    tx: mpsc::Sender<Trigger>,
) -> JoinHandle<()> {
    use helmop_core::fleet_copy::{BD_BUNDLE_NAME_LABEL, BD_BUNDLE_NAMESPACE_LABEL};
    use kube::api::{ApiResource, DynamicObject};

    let resource = ApiResource {
        group: "fleet.cattle.io".into(),
        version: "v1alpha1".into(),
        api_version: "fleet.cattle.io/v1alpha1".into(),
        kind: "BundleDeployment".into(),
        plural: "bundledeployments".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let config = match selection {
        Selection::One { namespace, name } => watcher::Config::default().labels(&format!(
            "{BD_BUNDLE_NAMESPACE_LABEL}={namespace},{BD_BUNDLE_NAME_LABEL}={name}"
        )),
        Selection::Namespace(ns) => {
            watcher::Config::default().labels(&format!("{BD_BUNDLE_NAMESPACE_LABEL}={ns}"))
        }
        Selection::All => watcher::Config::default().labels(BD_BUNDLE_NAMESPACE_LABEL),
    };
    tokio::spawn(async move {
        let stream = relisting(api, config);
        let mut stream = std::pin::pin!(stream);
        // BundleDeployment (namespace, name) -> its appliedDeploymentID.
        let mut applied: std::collections::HashMap<(String, String), Option<String>> =
            std::collections::HashMap::new();
        let mut failing = false;
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::InitApply(bd)) => {
                    let id = applied_id(&bd);
                    applied.insert(bd_key(&bd), id);
                }
                Ok(Event::Apply(bd)) => {
                    let id = applied_id(&bd);
                    let key = bd_key(&bd);
                    let before = applied.insert(key.clone(), id.clone());
                    if before.is_some_and(|b| b != id) && id.is_some() {
                        send(&tx, format!("BundleDeployment {}/{} applied", key.0, key.1));
                    }
                }
                Ok(Event::Delete(bd)) => {
                    applied.remove(&bd_key(&bd));
                }
                Ok(Event::Init) => applied.clear(),
                Ok(Event::InitDone) => failing = false,
                Err(e) => {
                    if !failing && !is_not_served(&e) {
                        tracing::warn!(kind = "BundleDeployment", error = %e, "watch failed; retrying with back-off");
                    }
                    failing = true;
                }
            }
        }
    })
}

fn bd_key(bd: &kube::api::DynamicObject) -> (String, String) {
    (
        bd.metadata.namespace.clone().unwrap_or_default(),
        bd.metadata.name.clone().unwrap_or_default(),
    )
}

/// What Fleet's agent reports when it copied the downstream resources: the deployment it applied
/// and, from Fleet v0.16, the generation of the downstream resources it copied. `None` before either.
fn applied_id(bd: &kube::api::DynamicObject) -> Option<String> {
    let applied = bd
        .data
        .pointer("/status/appliedDeploymentID")
        .and_then(serde_json::Value::as_str);
    let copied = bd
        .data
        .pointer("/status/downstreamResourcesGeneration")
        .and_then(serde_json::Value::as_i64);
    (applied.is_some() || copied.is_some())
        .then(|| format!("{}/{}", applied.unwrap_or(""), copied.unwrap_or(0)))
}

/// What a watched kind's events mean besides a run.
/// What a plan can read of an object's metadata: the generation (its spec), labels, annotations
/// and whether it is being deleted. A status write changes none of them.
fn plan_fingerprint(meta: &kube::api::ObjectMeta) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    hash_meta(meta, &mut h);
    h.finish()
}

fn hash_meta(meta: &kube::api::ObjectMeta, h: &mut impl Hasher) {
    meta.generation.hash(h);
    meta.labels.hash(h);
    meta.annotations.hash(h);
    meta.deletion_timestamp.is_some().hash(h);
}

/// [`plan_fingerprint`] of an object watched by its metadata.
fn meta_view<K: Resource>(obj: &PartialObjectMeta<K>) -> u64 {
    plan_fingerprint(&obj.metadata)
}

/// A Cluster's plan reads its metadata and spec and, of its status, only what Fleet's schedule
/// controller writes: the agents' check-ins (every few seconds on a large fleet) change none of it.
fn cluster_view(cluster: &Cluster) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    hash_meta(&cluster.metadata, &mut h);
    // The same bytes whether the status is absent or holds neither field.
    let status = cluster.status.as_ref();
    status.and_then(|s| s.scheduled).hash(&mut h);
    status.and_then(|s| s.active_schedule).hash(&mut h);
    h.finish()
}

/// [`cluster_view`] of a Cluster as the watch decodes it.
fn watched_cluster_view(cluster: &WatchedCluster) -> u64 {
    cluster_view(&cluster.0)
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Marks {
    /// Its namespaces hold sources or kubeconfig Secrets (HelmOps, Clusters).
    Namespace,
    Nothing,
    /// Nothing, and an API server without the kind is normal (BundleNamespaceMappings).
    NothingAndMayBeUnserved,
}

fn is_not_served(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(e) | watcher::Error::WatchStartFailed(e) => {
            crate::cluster::api_error::is_not_found(e)
        }
        _ => false,
    }
}

/// The ids this upstream marks its copies with (the current one and earlier ones).
#[derive(Clone, Debug, Default)]
pub struct OwnIds(pub Vec<String>);

/// Whether an object is one of this upstream's own copies: helmop's label and a
/// `helmop.dev/source` naming one of `ours`. Its changes are helmop's own writes (or drift, which
/// the resync repairs), never a reason to run; any other object, labelled or not, may be a source.
pub fn own_copy(meta: &kube::api::ObjectMeta, ours: &OwnIds) -> bool {
    let labelled = meta
        .labels
        .as_ref()
        .and_then(|l| l.get(names::LABEL_MANAGED_BY))
        .is_some_and(|v| v == names::MANAGER);
    labelled
        && meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::ANN_SOURCE))
            .and_then(|s| helmop_core::plan::SourceRef::parse(s))
            .is_some_and(|s| ours.0.contains(&s.upstream_id))
}

#[allow(clippy::too_many_arguments)]
fn watch_sources<K>(
    api: Api<PartialObjectMeta<K>>,
    config: watcher::Config,
    kind: ResourceKind,
    tx: mpsc::Sender<Trigger>,
    filter: Option<Interesting>,
    ours: Arc<OwnIds>,
    synced: Arc<Synced>,
    // The Secret watch keeps the watcher's kept kubeconfig Secrets honest (see `ReadCache`).
    reads: Option<Arc<ReadCache>>,
) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    tokio::spawn(async move {
        let label = kind.as_str();
        let stream = relisting(api, config);
        let mut stream = std::pin::pin!(stream);
        let mut listed = false;
        let mut failing = false;
        let wanted = |obj: &PartialObjectMeta<K>, ns: &str| {
            filter.as_ref().is_none_or(|f| f.contains(ns)) && !own_copy(&obj.metadata, &ours)
        };
        while let Some(event) = stream.next().await {
            match event {
                Ok(Event::Apply(obj)) => {
                    let (ns, name) = key(&obj);
                    if let Some(reads) = &reads {
                        reads.invalidate_secret(&ns, &name);
                    }
                    if wanted(&obj, &ns) {
                        let _ = tx.try_send(Trigger {
                            why: format!("{label} {ns}/{name} changed"),
                            source: Some(SourceKey {
                                resource: ResourceRef::new(kind, name),
                                namespace: ns,
                            }),
                            helmop: None,
                        });
                    }
                }
                Ok(Event::Delete(obj)) => {
                    let (ns, name) = key(&obj);
                    if let Some(reads) = &reads {
                        reads.invalidate_secret(&ns, &name);
                    }
                    if wanted(&obj, &ns) {
                        send(&tx, format!("{label} {ns}/{name} deleted"));
                    }
                }
                // A (re-)list starts: what changed while disconnected is unknown until it is done.
                Ok(Event::Init) => {
                    if let Some(reads) = &reads {
                        reads.set_live(false);
                    }
                }
                Ok(Event::InitDone) => {
                    if let Some(reads) = &reads {
                        reads.set_live(true);
                    }
                    if listed {
                        send(&tx, format!("{label} watch re-listed"));
                    } else {
                        synced.mark();
                    }
                    listed = true;
                    if failing {
                        tracing::info!(kind = label, "watch reconnected");
                    }
                    failing = false;
                }
                Ok(_) => {}
                Err(e) => {
                    if let Some(reads) = &reads {
                        reads.set_live(false);
                    }
                    if !failing {
                        tracing::warn!(kind = label, error = %e, "watch failed; retrying with back-off");
                    }
                    failing = true;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn bd(status: serde_json::Value) -> kube::api::DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "fleet.cattle.io/v1alpha1", "kind": "BundleDeployment",
            "metadata": {"name": "app", "namespace": "c"},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_status_write_leaves_the_plan_fingerprint_alone() {
        let meta = |v: serde_json::Value| -> kube::api::ObjectMeta {
            serde_json::from_value(v).unwrap_or_default()
        };
        let base = json!({"name": "app", "generation": 3, "resourceVersion": "10",
            "labels": {"a": "1"}, "annotations": {"x": "y"}});
        let before = plan_fingerprint(&meta(base.clone()));
        let mut status_write = base.clone();
        status_write["resourceVersion"] = json!("11");
        status_write["managedFields"] =
            json!([{"manager": "fleetcontroller", "subresource": "status"}]);
        assert_eq!(plan_fingerprint(&meta(status_write)), before);
        for change in [
            json!({"generation": 4}),
            json!({"labels": {"a": "2"}}),
            json!({"annotations": {}}),
            json!({"deletionTimestamp": "2026-01-01T00:00:00Z"}),
        ] {
            let mut changed = base.clone();
            for (k, v) in change.as_object().into_iter().flatten() {
                changed[k] = v.clone();
            }
            assert_ne!(plan_fingerprint(&meta(changed)), before, "{change}");
        }
    }

    #[test]
    fn an_agent_check_in_leaves_a_clusters_plan_view_alone() {
        let cluster = |status: serde_json::Value| -> Cluster {
            serde_json::from_value(json!({
                "metadata": {"name": "c", "namespace": "fleet-default", "generation": 2},
                "spec": {},
                "status": status,
            }))
            .unwrap_or_default()
        };
        let never_checked_in: Cluster = serde_json::from_value(json!({
            "metadata": {"name": "c", "namespace": "fleet-default", "generation": 2},
            "spec": {},
        }))
        .unwrap_or_default();
        let before = cluster_view(&never_checked_in);
        let check_in = cluster(json!({"agent": {"lastSeen": "2026-01-01T00:00:15Z"}}));
        assert_eq!(cluster_view(&check_in), before);
        let scheduled = cluster(json!({"scheduled": true, "agent": {"lastSeen": "x"}}));
        assert_ne!(cluster_view(&scheduled), before);
        let active = cluster(json!({"scheduled": true, "activeSchedule": true}));
        assert_ne!(cluster_view(&active), cluster_view(&scheduled));
    }

    #[test]
    fn only_this_upstreams_own_copies_are_ignored() {
        let meta = |labels: serde_json::Value, annotations: serde_json::Value| {
            serde_json::from_value::<kube::api::ObjectMeta>(
                json!({"name": "db", "labels": labels, "annotations": annotations}),
            )
            .unwrap()
        };
        let ours = OwnIds(vec!["up-aaa".into(), "legacy".into()]);
        let label = json!({"helmop.dev/managed-by": "kubectl-helmop"});
        let from = |id: &str| json!({"helmop.dev/source": format!("{id}/team/Secret/db")});
        assert!(own_copy(&meta(label.clone(), from("up-aaa")), &ours));
        assert!(
            own_copy(&meta(label.clone(), from("legacy")), &ours),
            "an earlier id"
        );
        // Another management cluster's copy, used here as a source: watched.
        assert!(!own_copy(&meta(label.clone(), from("up-bbb")), &ours));
        // The label alone (set by hand, or copied over) makes no copy.
        assert!(!own_copy(&meta(label, json!({})), &ours));
        assert!(!own_copy(&meta(json!({}), from("up-aaa")), &ours));
    }

    #[test]
    fn only_what_the_agent_applied_and_copied_counts() {
        let before = applied_id(&bd(
            json!({"appliedDeploymentID": "s-1", "downstreamResourcesGeneration": 1}),
        ));
        // Status churn: conditions, resource lists, check-ins.
        let churn = applied_id(&bd(json!({
            "appliedDeploymentID": "s-1", "downstreamResourcesGeneration": 1,
            "conditions": [{"type": "Ready", "status": "False"}], "resources": [{"name": "x"}],
        })));
        assert_eq!(before, churn);
        let copied = applied_id(&bd(
            json!({"appliedDeploymentID": "s-1", "downstreamResourcesGeneration": 2}),
        ));
        let deployed = applied_id(&bd(
            json!({"appliedDeploymentID": "s-2", "downstreamResourcesGeneration": 1}),
        ));
        assert_ne!(before, copied);
        assert_ne!(before, deployed);
        assert_eq!(applied_id(&bd(json!({}))), None, "nothing applied yet");
    }
}
