//! Workloads downstream that read helmop's copies: which are opted in to rolling on change, the
//! `helmop.dev/restamp` value the plugin writes on them, and whether their stamp is current.
//!
//! The restamp value records which copy contents the workload was restamped for:
//! `configmap/app=v1:<hex>,secret/db=v1:<hex>` (each copy the workload reads, with the copy's
//! `helmop.dev/content-hash` - a keyed hash, so it reveals nothing). Any new value makes the
//! webhook recompute the pod template's `helmop.dev/config-hash` on the UPDATE.
//!
//! Whether a workload's stamp is current (`status`), per copy it reads:
//! - no `helmop.dev/config-hash` in the pod template: `RolloutPending` (nothing stamped it: the
//!   webhook is not installed, or the workload was admitted before it was);
//! - the restamp value lists the copy with another content hash than the copy has now:
//!   `RolloutPending` (the copy changed after the last restamp: run `propagate` or `rollout`);
//! - otherwise `Current`: restamped for this content, or (copy not listed) stamped by the
//!   webhook when the workload was last admitted, which `propagate` follows with a restamp
//!   whenever it changes a copy.
//!
//! When `propagate` restamps (decided from state, never from what the current run wrote): a
//! workload reading one of helmop's copies is due when its restamp value does not list that
//! copy with the content hash the copy has now - the copy changed since the last restamp, or
//! helmop never recorded it (a run killed between writing a copy and restamping, a workload
//! admitted later, a value written by `rollout`). The restamp of a workload whose stamp is
//! already current changes nothing in its pod template, so it does not roll.
//!
//! Kinds considered: Deployment, StatefulSet, DaemonSet, CronJob (where served). Jobs and bare
//! ReplicaSets are left alone: a Job's template is immutable, and a ReplicaSet does not roll.

use std::collections::{BTreeMap, BTreeSet};

use helmop_core::hash::HashKey;
use helmop_core::names;
use helmop_core::podrefs::{PodRef, pod_refs_from_value};
use helmop_core::resource::ResourceRef;
use helmop_core::rollout::{Decision, opt_in_selector};
use helmop_core::workload::{PodTemplate, WorkloadKind, pod_template};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::json;

use crate::cluster::{api_error, lean_list};

/// The kinds `propagate` restamps and `status` checks.
pub const KINDS: [WorkloadKind; 4] = [
    WorkloadKind::Deployment,
    WorkloadKind::StatefulSet,
    WorkloadKind::DaemonSet,
    WorkloadKind::CronJob,
];

/// An opted-in workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub kind: WorkloadKind,
    pub namespace: String,
    pub name: String,
    /// ConfigMaps and Secrets its pod template reads.
    pub reads: BTreeSet<ResourceRef>,
    /// How it reads each (what the stamp covers), one entry per object.
    pub refs: Vec<PodRef>,
    /// Its `helmop.dev/restamp` annotation.
    pub restamp: Option<String>,
    /// Its pod template's `helmop.dev/config-hash`.
    pub config_hash: Option<String>,
}

impl Workload {
    /// `Deployment/web`.
    pub fn display(&self) -> String {
        format!("{}/{}", self.kind.kind(), self.name)
    }
}

pub use helmop_core::rollout::opted_in;

/// The restamp value for the copies (resource -> content hash) a workload reads.
pub fn restamp_value(copies: &BTreeMap<String, String>) -> String {
    copies
        .iter()
        .map(|(r, h)| format!("{r}={h}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The copies a restamp value lists (empty for values written by others, e.g. `rollout`).
pub fn parse_restamp(value: &str) -> BTreeMap<String, String> {
    value
        .split(',')
        .filter_map(|entry| entry.split_once('='))
        .filter(|(r, h)| r.contains('/') && !h.is_empty())
        .map(|(r, h)| (r.to_string(), h.to_string()))
        .collect()
}

/// A restamp `propagate` must write on a workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Due {
    /// The new `helmop.dev/restamp` value.
    pub value: String,
    /// The copies whose current content the old value did not list.
    pub copies: Vec<ResourceRef>,
    pub reason: String,
}

/// Whether `w` must be restamped, given the content hash each of helmop's copies in its
/// namespace has now (`copies`). Entries of the old value for copies not in `copies` (e.g. one
/// whose write failed) are kept as they were.
pub fn restamp_due(w: &Workload, copies: &BTreeMap<ResourceRef, String>) -> Option<Due> {
    let listed = w.restamp.as_deref().map(parse_restamp).unwrap_or_default();
    let stale: Vec<ResourceRef> = w
        .reads
        .iter()
        .filter(|r| {
            copies
                .get(*r)
                .is_some_and(|h| listed.get(&r.to_string()) != Some(h))
        })
        .cloned()
        .collect();
    if stale.is_empty() {
        return None;
    }
    let value: BTreeMap<String, String> = w
        .reads
        .iter()
        .filter_map(|r| {
            let key = r.to_string();
            let hash = copies.get(r).or_else(|| listed.get(&key))?;
            Some((key, hash.clone()))
        })
        .collect();
    Some(Due {
        value: restamp_value(&value),
        copies: stale,
        reason: "its restamp record does not list the copy's current content".into(),
    })
}

/// Whether `w`'s stamp is current for `copy` whose content hash is now `copy_hash`, and why.
pub fn stamp_pending(w: &Workload, copy: &ResourceRef, copy_hash: &str) -> (bool, String) {
    if w.config_hash.is_none() {
        return (
            true,
            format!(
                "the pod template has no {}: is the helmop webhook installed in this cluster?",
                names::ANN_CONFIG_HASH
            ),
        );
    }
    let listed = w.restamp.as_deref().map(parse_restamp).unwrap_or_default();
    match listed.get(&copy.to_string()) {
        Some(h) if h != copy_hash => (
            true,
            format!(
                "{copy} changed after the last restamp; run `kubectl helmop propagate` or `kubectl helmop rollout`"
            ),
        ),
        Some(_) => (false, format!("restamped for the current {copy}")),
        None => (false, "stamped when last admitted".into()),
    }
}

/// Where a reader of a copy helmop did not write (Fleet's agent copies `downstreamResources`
/// itself) stands. Its restamp record cannot say (the copy has no helmop content hash), so its
/// stamp is compared with the one the webhook would write now, from live reads of what it reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LiveState {
    /// Stamped for what its pods read now.
    Current,
    /// An UPDATE now would change its stamp: it has not rolled to what its pods would read.
    Behind,
    /// No stamp at all (the webhook is not installed, or the workload predates it).
    Unstamped,
    /// Behind, but rolling now would start pods that cannot start: these required objects are
    /// missing. It rolls once they exist.
    Missing(Vec<ResourceRef>),
    /// Could not be decided (no hash key readable, a read refused): why.
    Unknown(String),
}

/// [`LiveState`] of `w` against the cluster's hash key `key` (or why there is none).
pub async fn live_state(client: &Client, w: &Workload, key: Result<&HashKey, &str>) -> LiveState {
    if w.config_hash.is_none() {
        return LiveState::Unstamped;
    }
    let key = match key {
        Ok(key) => key,
        Err(why) => return LiveState::Unknown(why.to_owned()),
    };
    match crate::run::live_stamp::decide_now(
        client,
        &w.namespace,
        &w.refs,
        w.config_hash.as_deref(),
        key,
    )
    .await
    {
        Ok(Decision::Due { .. }) => LiveState::Behind,
        Ok(Decision::Missing(missing)) => LiveState::Missing(missing),
        Ok(Decision::Current | Decision::NotStamped(_)) => LiveState::Current,
        Err(e) => LiveState::Unknown(format!(
            "cannot read what it reads: {}",
            api_error::describe(&e)
        )),
    }
}

/// The restamp value `propagate` writes for a reader of Fleet-managed copies: the record of
/// helmop's copies kept as it was (so those are not restamped again), then the time.
pub fn fleet_restamp_value(previous: Option<&str>, now: k8s_openapi::jiff::Timestamp) -> String {
    let mut value = restamp_value(&previous.map(parse_restamp).unwrap_or_default());
    if !value.is_empty() {
        value.push(',');
    }
    value.push_str(&format!("propagate:{now}"));
    value
}

pub fn api_resource(kind: WorkloadKind) -> ApiResource {
    let (group, version, kind_name) = kind.gvk();
    ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: kind.api_version(),
        kind: kind_name.into(),
        plural: kind.plural().into(),
    }
}

/// The pod template of a workload as the API server answered it, read in place rather than
/// serialized back into one JSON value per workload: `data` holds every field but the metadata,
/// and every kind listed or restamped here keeps its template under `spec` (a bare Pod, whose
/// template is the object itself, is never one of them).
pub fn template_of(kind: WorkloadKind, obj: &DynamicObject) -> Option<PodTemplate<'_>> {
    pod_template(kind, &obj.data)
}

/// The `helmop.dev/config-hash` the webhook stamped into a workload's pod template.
pub fn config_hash_of(kind: WorkloadKind, obj: &DynamicObject) -> Option<String> {
    template_of(kind, obj)?
        .annotation(names::ANN_CONFIG_HASH)
        .map(str::to_owned)
}

fn to_workload(kind: WorkloadKind, obj: &DynamicObject) -> Option<Workload> {
    let template = template_of(kind, obj)?;
    let refs = pod_refs_from_value(template.spec).ok()?;
    let reads = refs.iter().map(|r| r.resource.clone()).collect();
    Some(Workload {
        kind,
        namespace: obj.metadata.namespace.clone()?,
        name: obj.metadata.name.clone()?,
        reads,
        refs,
        restamp: obj
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::ANN_RESTAMP))
            .cloned(),
        config_hash: template
            .annotation(names::ANN_CONFIG_HASH)
            .map(str::to_string),
    })
}

/// The opted-in workloads of `namespace` (none when the namespace does not exist). Kinds the
/// server does not serve (e.g. batch/v1 CronJob before Kubernetes 1.21) are skipped. The lists
/// select by the opt-in label, so workloads that are not opted in stay on the server (a namespace
/// of many workloads and few opted in costs what the few do).
pub async fn list_opted_in(client: &Client, namespace: &str) -> Result<Vec<Workload>, kube::Error> {
    // Credentials limited to the namespace may not read its Namespace object: then only the
    // workloads' own opt-in labels count (a namespace-wide opt-in cannot be seen).
    let ns_labels = match Api::<Namespace>::all(client.clone())
        .get_opt(namespace)
        .await
    {
        Ok(Some(ns)) => ns.metadata.labels.unwrap_or_default(),
        Ok(None) => return Ok(Vec::new()),
        Err(kube::Error::Api(ae)) if ae.code == 403 => {
            tracing::debug!(
                namespace,
                "the Namespace cannot be read: only workload labels opt in"
            );
            Default::default()
        }
        Err(e) => return Err(e),
    };
    let selector = opt_in_selector(
        ns_labels
            .get(names::LABEL_ROLLOUT_ON_CHANGE)
            .map(String::as_str),
    );
    let params = ListParams::default().labels(&selector);
    let no_labels = BTreeMap::new();
    let mut out = Vec::new();
    for kind in KINDS {
        let items = match lean_list::dynamic(client, &api_resource(kind), namespace, &params).await
        {
            Ok(items) => items,
            Err(e) if api_error::is_not_found(&e) => continue,
            Err(e) => return Err(e),
        };
        for obj in &items {
            // The selector already chose; this keeps the rule where a server applies it loosely.
            let labels = obj.metadata.labels.as_ref().unwrap_or(&no_labels);
            if !opted_in(&ns_labels, labels) {
                continue;
            }
            if let Some(w) = to_workload(kind, obj) {
                out.push(w);
            }
        }
    }
    Ok(out)
}

/// Sets `helmop.dev/restamp` to `value` (JSON merge patch on metadata, field manager
/// `kubectl-helmop`) and returns the pod template's config-hash before and after the server
/// (and its webhooks) handled it.
pub async fn restamp(
    client: &Client,
    w: &Workload,
    value: &str,
) -> Result<Option<String>, kube::Error> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &w.namespace, &api_resource(w.kind));
    let patch = json!({"metadata": {"annotations": {names::ANN_RESTAMP: value}}});
    let params = PatchParams {
        field_manager: Some(names::MANAGER.into()),
        ..PatchParams::default()
    };
    let obj = api.patch(&w.name, &params, &Patch::Merge(&patch)).await?;
    Ok(config_hash_of(w.kind, &obj))
}

/// `rollout:<RFC 3339 time>`: a value `propagate`'s restamp parser ignores (it lists no copies),
/// different from the previous one even when two restamps fall into the same nanosecond.
pub fn new_restamp_value(now: k8s_openapi::jiff::Timestamp, previous: Option<&str>) -> String {
    let value = format!("rollout:{now}");
    if previous == Some(value.as_str()) {
        format!("{value}-1")
    } else {
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restamp_values_are_new_and_ignored_by_propagate() {
        let t: k8s_openapi::jiff::Timestamp = "2026-01-02T03:04:05.123456789Z".parse().unwrap();
        let v = new_restamp_value(t, None);
        assert_eq!(v, "rollout:2026-01-02T03:04:05.123456789Z");
        assert_ne!(new_restamp_value(t, Some(&v)), v);
        assert!(parse_restamp(&v).is_empty());
    }

    #[test]
    fn fleet_reader_restamps_keep_the_record_of_helmops_copies() {
        let t: k8s_openapi::jiff::Timestamp = "2026-12-02T08:00:00Z".parse().unwrap();
        let v = fleet_restamp_value(Some("secret/db=v1:aa,watch:2026-01-01T00:00:00Z"), t);
        assert_eq!(v, "secret/db=v1:aa,propagate:2026-12-02T08:00:00Z");
        assert_eq!(parse_restamp(&v).len(), 1);
        assert_eq!(
            fleet_restamp_value(None, t),
            "propagate:2026-12-02T08:00:00Z"
        );
    }

    #[test]
    fn restamp_values_round_trip_and_ignore_foreign_values() {
        let copies = BTreeMap::from([
            ("secret/db".to_string(), "v1:aa".to_string()),
            ("configmap/app".to_string(), "v1:bb".to_string()),
        ]);
        let v = restamp_value(&copies);
        assert_eq!(v, "configmap/app=v1:bb,secret/db=v1:aa");
        assert_eq!(parse_restamp(&v), copies);
        assert!(parse_restamp("2026-11-29T16:00:00Z").is_empty());
        assert!(parse_restamp("").is_empty());
    }

    #[test]
    fn restamps_are_due_from_state() {
        let (db, app) = (ResourceRef::secret("db"), ResourceRef::config_map("app"));
        let mut w = Workload {
            kind: WorkloadKind::Deployment,
            namespace: "apps".into(),
            name: "web".into(),
            reads: BTreeSet::from([db.clone(), app.clone()]),
            refs: Vec::new(),
            restamp: None,
            config_hash: Some("v1:stamp".into()),
        };
        let copies = BTreeMap::from([(db.clone(), "v1:new".to_string())]);
        // Never recorded (e.g. the run that changed the copy was killed before restamping).
        let due = restamp_due(&w, &copies).expect("due");
        assert_eq!(due.value, "secret/db=v1:new");
        assert_eq!(due.copies, std::slice::from_ref(&db));
        // Recorded for other content.
        w.restamp = Some("configmap/app=v1:a,secret/db=v1:old".into());
        let due = restamp_due(&w, &copies).expect("due");
        assert_eq!(
            due.value, "configmap/app=v1:a,secret/db=v1:new",
            "entries of copies not known now are kept"
        );
        // Recorded for this content: nothing to do.
        w.restamp = Some(due.value);
        assert_eq!(restamp_due(&w, &copies), None);
        // A workload reading none of our copies is never touched.
        w.reads = BTreeSet::from([ResourceRef::secret("other")]);
        w.restamp = None;
        assert_eq!(restamp_due(&w, &copies), None);
    }

    #[test]
    fn stamp_rule() {
        let db = ResourceRef::secret("db");
        let mut w = Workload {
            kind: WorkloadKind::Deployment,
            namespace: "apps".into(),
            name: "web".into(),
            reads: BTreeSet::from([db.clone()]),
            refs: Vec::new(),
            restamp: None,
            config_hash: None,
        };
        assert!(stamp_pending(&w, &db, "v1:new").0, "unstamped");
        w.config_hash = Some("v1:stamp".into());
        assert!(!stamp_pending(&w, &db, "v1:new").0, "stamped at admission");
        w.restamp = Some("secret/db=v1:old".into());
        assert!(stamp_pending(&w, &db, "v1:new").0, "copy changed since");
        w.restamp = Some("secret/db=v1:new".into());
        assert!(!stamp_pending(&w, &db, "v1:new").0, "restamped for it");
        w.restamp = Some("rollout-1234".into());
        assert!(!stamp_pending(&w, &db, "v1:new").0, "foreign value");
    }
}
