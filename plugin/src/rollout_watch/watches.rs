//! The watches of `rollout --watch`, each turning what it sees into the small facts of
//! [`super::index`] before they reach the loop, so no object is held whole beyond its own event:
//! workloads of every stamped kind the server serves (whole: the pod template decides), Secrets
//! and ConfigMaps metadata only (their version and, for helmop's copies, the content hash),
//! Namespaces metadata only (the opt-in label), and the hash key Secret.
//!
//! A watch that fails is retried with kube's default back-off; after a re-list the loop drops
//! what the new listing no longer has ([`Step::Relist`], [`Step::Listed`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use helmop_core::hash::HashKey;
use helmop_core::names;
use helmop_core::podrefs::{PodRef, pod_refs_from_value};
use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_core::workload::{WorkloadKind, pod_template};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{ApiResource, DynamicObject};
use kube::core::PartialObjectMeta;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::coverage::Coverage;
use super::index::{
    ObjectFacts, ObjectKey, Progress, Version, WatcherRecord, WorkloadFacts, WorkloadKey,
};
use super::lean::{LeanWorkload, NamespaceLabels};
use crate::watch::triggers::Synced;

/// One step of one watch.
#[derive(Debug)]
pub enum Step<P, K> {
    /// Added or modified.
    Put(P),
    Delete(K),
    /// A (re-)listing starts: what it does not bring again is gone.
    Relist,
    /// Listed during a (re-)listing.
    Listed(P),
    /// The (re-)listing is complete.
    Done,
}

/// A Namespace's name, opt-in label and every label.
pub type NamespaceFacts = (String, Option<String>, BTreeMap<String, String>);

/// What a watch tells the loop.
#[derive(Debug)]
pub enum Change {
    Workload(
        WorkloadKind,
        Step<(WorkloadKey, WorkloadFacts), WorkloadKey>,
    ),
    Object(ResourceKind, Step<(ObjectKey, ObjectFacts), ObjectKey>),
    /// A Namespace: its name, opt-in label and every label (for [`super::coverage`]).
    Namespace(Step<NamespaceFacts, String>),
    /// The webhook configuration of `--webhook-configuration`: its coverage, `None` when absent, or
    /// why it cannot be read.
    Coverage(Result<Option<Coverage>, String>),
    /// The hash key Secret: its key, or why there is none (absent, malformed).
    HashKey(Result<HashKey, String>),
    /// The hash key's watch listed once (after its [`Change::HashKey`]).
    HashKeyListed,
    /// Another rollout watcher's Lease (see [`super::overlap`]).
    Lease(Step<(String, super::overlap::LeaseFacts), String>),
    /// A watch failed (it is retried); the first failure of a streak only.
    WatchFailed {
        what: String,
        error: String,
    },
}

/// What to watch.
pub struct Scope {
    /// `None`: every namespace.
    pub namespace: Option<String>,
    /// `-l`: only workloads matching it.
    pub selector: Option<String>,
    /// The workload kinds the server serves, with the API resource to reach each.
    pub kinds: Vec<(WorkloadKind, ApiResource)>,
    /// `--hash-key-secret`.
    pub hash_key: (String, String),
    /// `--webhook-configuration` (`None`: not read).
    pub webhook_configuration: Option<String>,
    /// The Lease namespace whose rollout watcher Leases are watched (`None`: not watched).
    pub leases: Option<String>,
}

/// The running watches; dropping this stops them.
pub struct Watches {
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Workloads are listed in pages of this many: a page's JSON is read whole before it is decoded
/// (lean, see [`super::lean`]), so this bounds what a listing holds at once by 20 times the API
/// server's largest object (etcd's 1.5 MiB), whatever a tenant writes; 10,000 workloads take 500
/// list requests.
const WORKLOAD_PAGE: u32 = 20;

/// Starts every watch of `scope`; `synced` counts those that listed once.
pub fn spawn(
    client: &Client,
    scope: &Scope,
    tx: mpsc::Sender<Change>,
    synced: &Arc<Synced>,
) -> Watches {
    let mut tasks = Vec::new();
    let labels = NamespaceLabels::new();
    let workloads = match &scope.selector {
        Some(s) => watcher::Config::default().labels(s),
        None => watcher::Config::default(),
    }
    .page_size(WORKLOAD_PAGE);
    for (kind, resource) in &scope.kinds {
        let api: Api<LeanWorkload> = match &scope.namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, resource),
            None => Api::all_with(client.clone(), resource),
        };
        let kind = *kind;
        let gate = labels.clone();
        let config = workloads.clone();
        let decoding = labels.clone();
        let stream = futures::stream::once(async move {
            gate.wait_listed().await;
            super::lean::with_labels(watcher::watcher(api, config).default_backoff(), decoding)
        })
        .flatten();
        let known = labels.clone();
        let listed = synced.clone();
        tasks.push(forward(
            stream,
            format!("{kind}s"),
            tx.clone(),
            move || listed.mark(),
            move |obj: LeanWorkload| {
                let ns_label = obj
                    .metadata
                    .namespace
                    .as_deref()
                    .and_then(|ns| known.get(ns));
                let unindexed = obj.skipped_spec;
                facts_of(
                    kind,
                    obj.metadata,
                    &obj.data,
                    ns_label.as_deref(),
                    unindexed,
                )
            },
            move |obj: &LeanWorkload| key_of(kind, &obj.metadata),
            move |step| Change::Workload(kind, step),
        ));
    }
    tasks.push(watch_objects::<Secret>(
        client,
        scope,
        ResourceKind::Secret,
        tx.clone(),
        synced,
    ));
    tasks.push(watch_objects::<ConfigMap>(
        client,
        scope,
        ResourceKind::ConfigMap,
        tx.clone(),
        synced,
    ));
    let namespaces = match &scope.namespace {
        Some(ns) => watcher::Config::default().fields(&format!("metadata.name={ns}")),
        None => watcher::Config::default(),
    };
    let api: Api<PartialObjectMeta<Namespace>> = Api::all(client.clone());
    let written = labels.clone();
    let namespaces_listed = {
        let synced = synced.clone();
        let labels = labels.clone();
        move || {
            synced.mark();
            labels.mark_listed();
        }
    };
    tasks.push(forward(
        watcher::watcher(api, namespaces).default_backoff(),
        "namespaces".to_owned(),
        tx.clone(),
        namespaces_listed,
        move |ns: PartialObjectMeta<Namespace>| {
            let name = ns.metadata.name?;
            let labels = ns.metadata.labels.unwrap_or_default();
            let label = labels.get(names::LABEL_ROLLOUT_ON_CHANGE).cloned();
            written.set(&name, label.as_deref());
            Some((name, label, labels))
        },
        |ns: &PartialObjectMeta<Namespace>| ns.metadata.name.clone(),
        Change::Namespace,
    ));
    tasks.push(watch_hash_key(
        client,
        &scope.hash_key,
        tx.clone(),
        synced.clone(),
    ));
    synced.expect(tasks.len());
    // Not counted for `synced`: the watcher works without them (and without the right to read them).
    if let Some(namespace) = &scope.leases {
        tasks.push(watch_leases(client, namespace, tx.clone()));
    }
    if let Some(name) = &scope.webhook_configuration {
        tasks.push(watch_configuration(client, name, tx));
    }
    Watches { tasks }
}

/// How the watch of the rollout watchers' Leases names itself in [`Change::WatchFailed`].
pub const LEASES_WATCH: &str = "rollout watcher Leases";

/// The rollout watchers' Leases of `namespace` (see [`super::overlap`]).
fn watch_leases(client: &Client, namespace: &str, tx: mpsc::Sender<Change>) -> JoinHandle<()> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let config = watcher::Config::default().labels(super::overlap::LABEL);
    forward(
        watcher::watcher(api, config).default_backoff(),
        format!("{LEASES_WATCH} in namespace {namespace}"),
        tx,
        || {},
        |lease: Lease| super::overlap::facts_of(&lease),
        |lease: &Lease| lease.metadata.name.clone(),
        Change::Lease,
    )
}

fn watch_objects<K>(
    client: &Client,
    scope: &Scope,
    kind: ResourceKind,
    tx: mpsc::Sender<Change>,
    synced: &Arc<Synced>,
) -> JoinHandle<()>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let api: Api<PartialObjectMeta<K>> =
        crate::cluster::kube_api::api_in(client, scope.namespace.as_deref());
    let stream = watcher::watcher(api, watcher::Config::default()).default_backoff();
    let synced = synced.clone();
    forward(
        stream,
        format!("{kind}s"),
        tx,
        move || synced.mark(),
        move |obj: PartialObjectMeta<K>| {
            let key = object_key(kind, &obj.metadata)?;
            let version = Version {
                uid: obj.metadata.uid.clone()?,
                resource_version: obj.metadata.resource_version.clone()?,
            };
            // Only helmop's own copies: a foreign object's annotation of that name records nothing.
            let ours = obj
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(names::LABEL_MANAGED_BY))
                .is_some_and(|v| v == names::MANAGER);
            // Two annotations are kept; the rest (last-applied-configuration among them, which
            // holds a `kubectl apply`d Secret's data) is dropped with the event.
            let mut annotations = obj.metadata.annotations.unwrap_or_default();
            let content_hash = annotations.remove(names::ANN_CONTENT_HASH).filter(|_| ours);
            let resume = annotations.remove(names::ANN_ROLLOUT_RESUME);
            Some((
                key,
                ObjectFacts {
                    version,
                    content_hash,
                    resume,
                },
            ))
        },
        move |obj: &PartialObjectMeta<K>| object_key(kind, &obj.metadata),
        move |step| Change::Object(kind, step),
    )
}

fn object_key(kind: ResourceKind, meta: &kube::api::ObjectMeta) -> Option<ObjectKey> {
    Some(ObjectKey {
        namespace: meta.namespace.clone()?,
        resource: ResourceRef::new(kind, meta.name.clone()?),
    })
}

fn key_of(kind: WorkloadKind, meta: &kube::api::ObjectMeta) -> Option<WorkloadKey> {
    Some(WorkloadKey {
        kind,
        namespace: meta.namespace.clone()?,
        name: meta.name.clone()?,
    })
}

/// The facts of a workload; `None` for one being deleted (nothing restamps it any more).
///
/// What the pod template reads is indexed only when the workload is opted in, given its
/// namespace's label `namespace_label`, and only up to the caps ([`MAX_WATCHED_KEYS`],
/// [`helmop_core::rollout::MAX_REFERENCES`]): past them the workload is reported, never indexed.
pub fn workload_facts(
    kind: WorkloadKind,
    obj: DynamicObject,
    namespace_label: Option<&str>,
) -> Option<(WorkloadKey, WorkloadFacts)> {
    facts_of(kind, obj.metadata, &obj.data, namespace_label, false)
}

/// [`workload_facts`] of a workload's `metadata` and the rest of it, `data`; `unindexed` when its
/// spec was not decoded ([`super::lean`]).
fn facts_of(
    kind: WorkloadKind,
    metadata: kube::api::ObjectMeta,
    data: &serde_json::Value,
    namespace_label: Option<&str>,
    unindexed: bool,
) -> Option<(WorkloadKey, WorkloadFacts)> {
    if metadata.deletion_timestamp.is_some() {
        return None;
    }
    let key = key_of(kind, &metadata)?;
    let own_label = metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(names::LABEL_ROLLOUT_ON_CHANGE));
    let indexed = !unindexed
        && helmop_core::rollout::opt_in(own_label.map(String::as_str), namespace_label).stamps();
    let template = pod_template(kind, data);
    let refs = match &template {
        Some(_) if !indexed => Ok(Vec::new()),
        Some(t) => pod_refs_from_value(t.spec)
            .map_err(|e| e.to_string())
            .and_then(within_caps),
        // e.g. an Argo Rollout with a workloadRef: the Deployment it names is stamped.
        None => Ok(Vec::new()),
    };
    let stamp = template
        .as_ref()
        .and_then(|t| t.annotation(names::ANN_CONFIG_HASH))
        .map(str::to_owned);
    let progress = Progress {
        generation: metadata.generation.unwrap_or(0),
        state: helmop_core::progress::roll_state(kind, metadata.generation, data),
    };
    let restamp = metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(names::ANN_RESTAMP))
        .map(|v| watcher_record(v))
        .unwrap_or_default();
    let mut labels = metadata.labels.unwrap_or_default();
    Some((
        key,
        WorkloadFacts {
            uid: metadata.uid.unwrap_or_default(),
            label: labels.remove(names::LABEL_ROLLOUT_ON_CHANGE),
            refs,
            stamp,
            restamp,
            progress,
            indexed,
        },
    ))
}

/// The most keys of Secrets and ConfigMaps one workload may read by name (`items`, key refs) and
/// still be watched: each costs the watcher its name, and a tenant can write thousands.
pub const MAX_WATCHED_KEYS: usize = 1024;

/// `refs`, or why the watcher does not watch a workload that reads that much.
fn within_caps(refs: Vec<PodRef>) -> Result<Vec<PodRef>, String> {
    let max = helmop_core::rollout::MAX_REFERENCES;
    if refs.len() > max {
        return Err(format!(
            "it reads {} Secrets and ConfigMaps, more than the {max} the webhook stamps",
            refs.len()
        ));
    }
    let keys: usize = refs
        .iter()
        .map(|r| r.reads.files.len() + r.reads.vars.len())
        .sum();
    if keys > MAX_WATCHED_KEYS {
        return Err(format!(
            "it reads {keys} keys of Secrets and ConfigMaps by name, more than the {MAX_WATCHED_KEYS} the rollout watcher indexes"
        ));
    }
    Ok(refs)
}

/// What a `helmop.dev/restamp` value says a watcher did ([`super::act::restamp_record`] writes it).
pub fn watcher_record(value: &str) -> WatcherRecord {
    let mut record = WatcherRecord::default();
    for entry in value.split(',') {
        if let Some(at) = entry.strip_prefix("watch:") {
            record.at = at.parse().ok();
        } else if let Some(seen) = entry.strip_prefix("seen:") {
            record.seen = Some(seen.to_owned());
        } else if let Some(tries) = entry.strip_prefix("tries:")
            && let Some((n, expected)) = tries.split_once('@')
            && let Ok(n) = n.parse()
        {
            record.tries = Some((n, expected.to_owned()));
        }
    }
    record
}

/// Drives one watch stream, converting each object with `facts` (`None`: treat as deleted, keyed
/// by `key`) and sending `wrap`ped steps.
#[allow(clippy::too_many_arguments)]
fn forward<K, P, Q, S>(
    stream: S,
    what: String,
    tx: mpsc::Sender<Change>,
    listed_once: impl Fn() + Send + 'static,
    facts: impl Fn(K) -> Option<P> + Send + 'static,
    key: impl Fn(&K) -> Option<Q> + Send + 'static,
    wrap: impl Fn(Step<P, Q>) -> Change + Send + 'static,
) -> JoinHandle<()>
where
    K: Send + 'static,
    P: Send + 'static,
    Q: Send + 'static,
    S: futures::Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut listed = false;
        let mut failing = false;
        while let Some(event) = stream.next().await {
            let step = match event {
                Ok(Event::Apply(obj)) => {
                    let k = key(&obj);
                    match facts(obj) {
                        Some(p) => Step::Put(p),
                        None => match k {
                            Some(k) => Step::Delete(k),
                            None => continue,
                        },
                    }
                }
                Ok(Event::Delete(obj)) => match key(&obj) {
                    Some(k) => Step::Delete(k),
                    None => continue,
                },
                Ok(Event::Init) => Step::Relist,
                Ok(Event::InitApply(obj)) => match facts(obj) {
                    Some(p) => Step::Listed(p),
                    None => continue,
                },
                Ok(Event::InitDone) => {
                    if !listed {
                        listed_once();
                        listed = true;
                    }
                    if failing {
                        tracing::info!(watch = %what, "watch reconnected");
                    }
                    failing = false;
                    Step::Done
                }
                Err(e) => {
                    if !failing {
                        let error = e.to_string();
                        tracing::warn!(watch = %what, %error, "watch failed; retrying");
                        let _ = tx
                            .send(Change::WatchFailed {
                                what: what.clone(),
                                error,
                            })
                            .await;
                    }
                    failing = true;
                    continue;
                }
            };
            // Every step counts (the index depends on each), so wait for room rather than drop.
            if tx.send(wrap(step)).await.is_err() {
                return;
            }
        }
    })
}

/// What [`watch_named`] saw of its one object.
enum Named<'a, K> {
    /// Listed, added or modified.
    Present(&'a K),
    /// Deleted, or not there when a listing ended.
    Absent,
    /// The first listing ended (after its `Absent`, if any).
    Listed,
    /// The watch failed (it is retried); the first failure of a streak only.
    Failed(String),
}

/// Drives a watch of the one object `name` of `api`, sending what `on` makes of each step.
fn watch_named<K>(
    api: Api<K>,
    name: &str,
    tx: mpsc::Sender<Change>,
    on: impl Fn(Named<'_, K>) -> Vec<Change> + Send + 'static,
) -> JoinHandle<()>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher::watcher(api, config).default_backoff();
    tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        let mut listed = false;
        let mut found = false;
        let mut failing = false;
        while let Some(event) = stream.next().await {
            let changes = match event {
                Ok(Event::Apply(obj) | Event::InitApply(obj)) => {
                    found = true;
                    on(Named::Present(&obj))
                }
                Ok(Event::Delete(_)) => {
                    found = false;
                    on(Named::Absent)
                }
                Ok(Event::Init) => {
                    found = false;
                    Vec::new()
                }
                Ok(Event::InitDone) => {
                    failing = false;
                    let mut changes = if found { Vec::new() } else { on(Named::Absent) };
                    if !listed {
                        listed = true;
                        changes.extend(on(Named::Listed));
                    }
                    changes
                }
                Err(e) => {
                    let first = !failing;
                    failing = true;
                    if first {
                        on(Named::Failed(e.to_string()))
                    } else {
                        Vec::new()
                    }
                }
            };
            for change in changes {
                if tx.send(change).await.is_err() {
                    return;
                }
            }
        }
    })
}

/// Watches the MutatingWebhookConfiguration `name` and sends its [`Coverage`] at every change.
fn watch_configuration(client: &Client, name: &str, tx: mpsc::Sender<Change>) -> JoinHandle<()> {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let what = format!("the webhook configuration {name}");
    watch_named(api, name, tx, move |seen| match seen {
        Named::Present(c) => vec![Change::Coverage(
            Coverage::of(c)
                .map(Some)
                .map_err(|e| format!("{what}: {e}")),
        )],
        Named::Absent => vec![Change::Coverage(Ok(None))],
        Named::Listed => Vec::new(),
        Named::Failed(e) => vec![Change::Coverage(Err(format!("{what}: {e}")))],
    })
}

fn watch_hash_key(
    client: &Client,
    (namespace, name): &(String, String),
    tx: mpsc::Sender<Change>,
    synced: Arc<Synced>,
) -> JoinHandle<()> {
    let api: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("the hash key Secret {namespace}/{name}");
    watch_named(api, name, tx, move |seen| match seen {
        Named::Present(secret) => vec![Change::HashKey(
            HashKey::from_secret(secret).map_err(|e| format!("{what}: {e}")),
        )],
        Named::Absent => vec![Change::HashKey(Err(format!("{what} does not exist")))],
        Named::Listed => {
            synced.mark();
            vec![Change::HashKeyListed]
        }
        Named::Failed(error) => vec![Change::WatchFailed {
            what: what.clone(),
            error,
        }],
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object(v: serde_json::Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn a_workload_is_kept_as_what_decides_its_stamp() {
        let obj = object(json!({
            "apiVersion": "batch/v1beta1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": "apps", "uid": "u1",
                         "labels": {"helmop.dev/rollout-on-change": "true", "app": "x"},
                         "annotations": {"helmop.dev/restamp": "r1"}},
            "spec": {"schedule": "@daily", "jobTemplate": {"spec": {"template": {
                "metadata": {"annotations": {"helmop.dev/config-hash": "v2:aa"}},
                "spec": {"containers": [{"name": "c", "image": "i",
                    "envFrom": [{"secretRef": {"name": "db"}}]}],
                    "initContainers": [{"name": "i", "image": "i",
                    "env": [{"name": "X", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "k"}}}]}]}
            }}}}
        }));
        let (key, facts) = workload_facts(WorkloadKind::CronJob, obj, None).unwrap();
        assert_eq!(
            facts.progress.state,
            helmop_core::progress::RollState::Complete
        );
        assert_eq!(key.to_string(), "apps/CronJob/nightly");
        assert_eq!(facts.label.as_deref(), Some("true"));
        assert_eq!(facts.stamp.as_deref(), Some("v2:aa"));
        let refs: Vec<String> = facts
            .refs
            .unwrap()
            .iter()
            .map(|r| r.resource.to_string())
            .collect();
        assert_eq!(
            refs,
            vec!["configmap/app", "secret/db"],
            "init containers count"
        );
    }

    #[test]
    fn deleting_and_unreadable_workloads() {
        let deleting = object(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "apps", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"template": {"spec": {"containers": []}}}
        }));
        assert!(workload_facts(WorkloadKind::Deployment, deleting, None).is_none());
        let bad = object(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "apps"},
            "spec": {"template": {"spec": {"containers": "not a list"}}}
        }));
        let (_, facts) = workload_facts(WorkloadKind::Deployment, bad, Some("enabled")).unwrap();
        assert!(facts.refs.is_err());
    }

    #[test]
    fn only_opted_in_workloads_have_what_they_read_indexed_up_to_the_caps() {
        let reading = |n: usize, labels: serde_json::Value| {
            let env: Vec<serde_json::Value> = (0..n)
                .map(|i| json!({"name": format!("V{i}"), "valueFrom": {"secretKeyRef": {"name": "db", "key": format!("k{i}")}}}))
                .collect();
            object(json!({
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "namespace": "apps", "labels": labels},
                "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i", "env": env}]}}}
            }))
        };
        let d = WorkloadKind::Deployment;
        let (_, facts) = workload_facts(d, reading(20_000, json!({})), None).unwrap();
        assert!(
            !facts.indexed && facts.refs == Ok(Vec::new()),
            "not opted in: nothing kept"
        );
        let (_, facts) = workload_facts(d, reading(3, json!({})), Some("enabled")).unwrap();
        assert!(facts.indexed && facts.refs.as_ref().is_ok_and(|r| r.len() == 1));
        let opted_out = json!({"helmop.dev/rollout-on-change": "false"});
        let (_, facts) = workload_facts(d, reading(3, opted_out), Some("enabled")).unwrap();
        assert!(!facts.indexed);
        let (_, facts) =
            workload_facts(d, reading(MAX_WATCHED_KEYS + 1, json!({})), Some("enabled")).unwrap();
        assert!(
            facts
                .refs
                .unwrap_err()
                .contains("more than the 1024 the rollout watcher indexes")
        );
    }

    #[test]
    fn the_watchers_record_is_read_back_from_the_restamp_value() {
        let r =
            watcher_record("secret/db=v1:aa,tries:2@0123456789abcdef,watch:2026-12-02T08:00:00Z");
        assert_eq!(r.tries, Some((2, "0123456789abcdef".to_owned())));
        assert_eq!(
            r.at.map(|t| t.to_string()).as_deref(),
            Some("2026-12-02T08:00:00Z")
        );
        assert_eq!(
            watcher_record("rollout:2026-12-02T08:00:00Z"),
            WatcherRecord::default()
        );
        assert_eq!(watcher_record("tries:x@y,watch:never").tries, None);
    }
}
