//! `status`: per HelmOp x cluster x resource, where things stand - from hashes and markers, never
//! by reading a copy's data (the one exception: a Fleet-managed copy has no helmop markers, so it
//! is read and hashed in memory to compare it with the source; nothing of it is shown).
//! Plus, per opted-in workload reading one of the copies, whether its stamp is current
//! (`RolloutPending` or `Current`, rule in [`crate::run::workloads`]), and whether the rollout
//! watcher holds it back ([`crate::run::holds`], read from its Events in the namespaces of those
//! rows only).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use helmop_core::fleet_copy::{self, Lookup};
use helmop_core::hash::{HashKey, ObjectData, content_hash};
use helmop_core::names;
use helmop_core::plan::{Action, ActionKind, UpdateReason};
use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_core::state::RowState;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, ListParams};
use serde::Serialize;

use crate::cluster::api_error;
use crate::cluster::clusters::Downstream;
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::output::report::{self, Row};
use crate::run::hash_key::KeyOrigin;
use crate::run::holds::{self, Holds, MAX_EVENTS, WorkloadId};
use crate::run::inventory::{Inventory, Problem};
use crate::run::plan::{
    load_key, observe_and_plan, problem_rows, reported, row, uncopyable_rows, unreachable_rows,
};
use crate::run::scope::Scope;
use crate::run::sources::{self, Sources};
use crate::run::workloads;

#[derive(Clone, Debug)]
pub struct StatusOpts {
    pub scope: Scope,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    pub upstream_id: String,
    /// `ephemeral` when the upstream has no hash key: then no copy can be confirmed in sync.
    pub hash_key: KeyOrigin,
    pub rows: Vec<Row>,
    pub problems: Vec<Problem>,
    /// HelmOps Fleet's controller rejects (their copies are left as they are).
    pub rejected: Vec<Problem>,
    /// Rows per state.
    pub summary: BTreeMap<RowState, usize>,
    pub unreachable_clusters: usize,
    /// What could not be told, one line each: a namespace whose rollout watcher Events could not
    /// be read (its rows show no hold), or were read only in part.
    pub notes: Vec<String>,
}

impl StatusReport {
    /// 2 when a cluster could not be read, 1 when a HelmOp's targets are invalid, else 0
    /// (being out of sync is a state to report, not a failure of `status`; so is a workload the
    /// rollout watcher holds back, and Events that could not be read are a note).
    pub fn exit_status(&self) -> ExitStatus {
        if self.unreachable_clusters > 0 {
            ExitStatus::Partial
        } else if !self.problems.is_empty() || self.summary.contains_key(&RowState::Invalid) {
            ExitStatus::Invalid
        } else {
            ExitStatus::Ok
        }
    }
}

/// Builds the status report (reads only).
pub async fn status(ctx: &Ctx, opts: &StatusOpts) -> Result<StatusReport, PluginError> {
    let (key, origin) = load_key(ctx, false).await?;
    let inv = opts.scope.inventory(ctx, false).await?;
    let sources = sources::fetch(ctx, &inv.desired, &key).await?;
    let (found, unreachable) =
        opts.scope
            .rows_per_cluster(
                &inv,
                "status",
                |downstream, client| {
                    let (inv, sources, key) = (&inv, &sources, &key);
                    async move {
                        cluster_status(ctx, inv, sources, key, downstream, client, origin).await
                    }
                },
                |downstream, reason| {
                    unreachable_rows(&inv, downstream, reason)
                        .into_iter()
                        .map(Found::Row)
                        .collect()
                },
            )
            .await;
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for f in found {
        match f {
            Found::Row(r) => rows.push(r),
            Found::Note(n) => notes.push(n),
        }
    }
    notes.sort();
    rows.extend(problem_rows(&inv.problems));
    rows.extend(problem_rows(&inv.rejected));
    rows.extend(uncopyable_rows(&inv));
    judge_fleet_copies(ctx, &inv, &mut rows).await;
    report::sort(&mut rows);
    Ok(StatusReport {
        upstream_id: ctx.upstream_id.clone(),
        hash_key: origin,
        summary: report::counts(&rows),
        rows,
        problems: inv.problems.clone(),
        rejected: inv.rejected.clone(),
        unreachable_clusters: unreachable.len(),
        notes,
    })
}

/// What one cluster adds to the report.
enum Found {
    Row(Row),
    Note(String),
}

/// The state `status` reports for a planned action.
pub fn state_of(action: &Action) -> RowState {
    match &action.kind {
        ActionKind::Create { .. } => RowState::Missing,
        ActionKind::Update { reasons, .. } | ActionKind::Recreate { reasons, .. }
            if reasons.contains(&UpdateReason::Drifted) =>
        {
            RowState::Drifted
        }
        ActionKind::Update { .. } | ActionKind::Recreate { .. } => RowState::Stale,
        ActionKind::Unchanged => RowState::Synced,
        ActionKind::Conflict(_) => RowState::Conflict,
        ActionKind::SkipFleetManaged => RowState::FleetManaged,
        ActionKind::SourceMissing => RowState::SourceMissing,
        ActionKind::Prune { .. } | ActionKind::RemoveOwner { .. } | ActionKind::Orphaned(_) => {
            RowState::Orphaned
        }
        ActionKind::Keep { .. } | ActionKind::Handover { .. } => RowState::Kept,
        ActionKind::Held { why, .. } => why.state(),
    }
}

async fn cluster_status(
    ctx: &Ctx,
    inv: &Inventory,
    sources: &Sources,
    key: &HashKey,
    downstream: &Downstream,
    client: kube::Client,
    origin: KeyOrigin,
) -> Result<Vec<Found>, PluginError> {
    let (obs, actions) =
        observe_and_plan(ctx, inv, sources, downstream, &client, false, false).await?;
    let mut rows = Vec::new();
    // Our copies in sync or stale, per namespace: resource -> (content hash, HelmOps).
    let mut copies: BTreeMap<String, BTreeMap<ResourceRef, (String, Vec<String>)>> =
        BTreeMap::new();
    // Copies Fleet's agent makes, per namespace: resource -> HelmOps.
    let mut fleet: BTreeMap<String, BTreeMap<ResourceRef, Vec<String>>> = BTreeMap::new();
    for action in actions.iter().filter(|a| reported(a)) {
        let state = state_of(action);
        let mut reason = match &action.kind {
            ActionKind::Create { .. } => "no copy yet; run `kubectl helmop propagate`".into(),
            ActionKind::Update { .. } | ActionKind::Recreate { .. } => {
                format!("{}; run `kubectl helmop propagate`", action.reason())
            }
            ActionKind::Prune { .. } | ActionKind::RemoveOwner { .. } => {
                format!("{}; `kubectl helmop prune` removes it", action.reason())
            }
            _ => action.reason(),
        };
        if origin == KeyOrigin::Ephemeral
            && matches!(
                action.kind,
                ActionKind::Update { .. } | ActionKind::Recreate { .. }
            )
        {
            reason.push_str(&format!(
                " (the upstream has no hash key {}/{}, so no copy can be confirmed)",
                names::SYSTEM_NAMESPACE,
                names::HASH_KEY_SECRET
            ));
        }
        let mut r = row(downstream, action, state, reason);
        if matches!(action.kind, ActionKind::SkipFleetManaged) {
            let (in_sync, why) = fleet_copy_in_sync(&client, sources, key, action).await;
            r.in_sync = in_sync;
            r.reason = format!("{}; {why}", r.reason);
            fleet
                .entry(action.namespace.clone())
                .or_default()
                .insert(action.resource.clone(), r.helmops.clone());
        }
        if matches!(
            state,
            RowState::Synced | RowState::Stale | RowState::Drifted
        ) && let Some(hash) = obs
            .get(&action.namespace, &action.resource)
            .and_then(|o| o.annotations.get(names::ANN_CONTENT_HASH))
        {
            copies
                .entry(action.namespace.clone())
                .or_default()
                .insert(action.resource.clone(), (hash.clone(), r.helmops.clone()));
        }
        rows.push(r);
    }
    for (namespace, copies) in &copies {
        let found = workloads::list_opted_in(&client, namespace)
            .await
            .map_err(|e| PluginError::ListWorkloads {
                namespace: namespace.clone(),
                reason: api_error::describe(&e),
            })?;
        for w in found {
            for resource in w.reads.iter().filter(|r| copies.contains_key(*r)) {
                let Some((hash, helmops)) = copies.get(resource) else {
                    continue;
                };
                let (pending, reason) = workloads::stamp_pending(&w, resource, hash);
                let state = if pending {
                    RowState::RolloutPending
                } else {
                    RowState::Current
                };
                rows.push(Row::workload(
                    helmops.clone(),
                    downstream.display(),
                    namespace,
                    resource,
                    w.display(),
                    state,
                    reason,
                ));
            }
        }
    }
    rows.extend(fleet_readers(&client, downstream, &fleet).await?);
    let notes = show_holds(&client, &downstream.display(), &mut rows).await;
    Ok(rows
        .into_iter()
        .map(Found::Row)
        .chain(notes.into_iter().map(Found::Note))
        .collect())
}

/// Reads the rollout watcher's holds in each namespace that has workload rows (one bounded,
/// paged listing of Events per namespace, [`holds::read`]) and puts them on those rows. Never
/// fails: Events that cannot be read are a note.
async fn show_holds(client: &kube::Client, cluster: &str, rows: &mut [Row]) -> Vec<String> {
    let namespaces: BTreeSet<String> = rows
        .iter()
        .filter(|r| r.workload.is_some())
        .map(|r| r.namespace.clone())
        .collect();
    let mut notes = Vec::new();
    for namespace in namespaces {
        let read = holds::read(client, Some(&namespace)).await;
        notes.extend(put_holds(rows, cluster, &namespace, read));
    }
    notes
}

/// Puts each hold found in `namespace` on the rows of the workload it is about; returns the note
/// when the Events could not be read (no row of the namespace then shows a hold) or only in part.
pub fn put_holds(
    rows: &mut [Row],
    cluster: &str,
    namespace: &str,
    read: Result<Holds, String>,
) -> Option<String> {
    let found = match read {
        Ok(found) => found,
        Err(why) => {
            return Some(format!(
                "{cluster}: cannot read the rollout watcher's Events in namespace {namespace}, so no hold is shown there: {why}"
            ));
        }
    };
    for r in rows.iter_mut().filter(|r| r.namespace == namespace) {
        let Some((kind, name)) = r.workload.as_deref().and_then(|w| w.split_once('/')) else {
            continue;
        };
        r.hold = found
            .held
            .get(&WorkloadId::new(namespace, kind, name))
            .cloned();
    }
    (!found.complete).then(|| {
        format!(
            "{cluster}: read only the first {MAX_EVENTS} Events in namespace {namespace}: a hold of the rollout watcher may not be shown"
        )
    })
}

/// One row per opted-in workload reading a copy Fleet's agent makes, and copy: `Current` when its
/// stamp is what the webhook would write now, `RolloutPending` when not (read live, see
/// [`workloads::LiveState`]), `Failed` when that cannot be told.
async fn fleet_readers(
    client: &kube::Client,
    downstream: &Downstream,
    fleet: &BTreeMap<String, BTreeMap<ResourceRef, Vec<String>>>,
) -> Result<Vec<Row>, PluginError> {
    let mut rows = Vec::new();
    if fleet.is_empty() {
        return Ok(rows);
    }
    let key = crate::run::live_stamp::cluster_key(client).await;
    for (namespace, resources) in fleet {
        let found = workloads::list_opted_in(client, namespace)
            .await
            .map_err(|e| PluginError::ListWorkloads {
                namespace: namespace.clone(),
                reason: api_error::describe(&e),
            })?;
        for w in found {
            let read: Vec<&ResourceRef> = w
                .reads
                .iter()
                .filter(|r| resources.contains_key(*r))
                .collect();
            if read.is_empty() {
                continue;
            }
            let live =
                workloads::live_state(client, &w, key.as_ref().map_err(String::as_str)).await;
            let (state, reason) = match live {
                workloads::LiveState::Current => (
                    RowState::Current,
                    "stamped for what its pods read now".to_owned(),
                ),
                workloads::LiveState::Behind => (
                    RowState::RolloutPending,
                    "its stamp is behind what its pods read (the copy changed since it was stamped); the rollout watcher, `kubectl helmop propagate` or `kubectl helmop rollout` restamps it".to_owned(),
                ),
                workloads::LiveState::Unstamped => (
                    RowState::RolloutPending,
                    format!(
                        "the pod template has no {}: is the helmop webhook installed in this cluster?",
                        names::ANN_CONFIG_HASH
                    ),
                ),
                workloads::LiveState::Missing(missing) => (
                    RowState::RolloutPending,
                    format!(
                        "behind what its pods read, but it requires {}, which does not exist: it is restamped once that exists",
                        missing.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
                    ),
                ),
                workloads::LiveState::Unknown(why) => {
                    (RowState::Failed, format!("cannot check its stamp: {why}"))
                }
            };
            for resource in read {
                rows.push(Row::workload(
                    resources.get(resource).cloned().unwrap_or_default(),
                    downstream.display(),
                    namespace,
                    resource,
                    w.display(),
                    state,
                    reason.clone(),
                ));
            }
        }
    }
    Ok(rows)
}

/// Says, per `FleetManaged` row, whether Fleet's agent has copied the latest content, from the
/// HelmOp's BundleDeployment for that cluster and its `Accepted` condition upstream (rule in
/// [`fleet_copy`]). One list of BundleDeployments per HelmOp, only when it has such rows.
async fn judge_fleet_copies(ctx: &Ctx, inv: &Inventory, rows: &mut [Row]) {
    let mut listed: BTreeMap<String, Result<Vec<serde_json::Value>, PluginError>> = BTreeMap::new();
    for r in rows
        .iter_mut()
        .filter(|r| r.state == RowState::FleetManaged && r.workload.is_none())
    {
        let Some(key) = r.helmops.first().cloned() else {
            continue;
        };
        let Some((namespace, name)) = key.split_once('/') else {
            continue;
        };
        if !listed.contains_key(&key) {
            let bds = bundle_deployments(ctx, namespace, name).await;
            listed.insert(key.clone(), bds);
        }
        let clusters: Vec<&str> = r.cluster.split(',').collect();
        let lookup = match listed.get(&key) {
            Some(Ok(bds)) => fleet_copy::find(bds, &clusters),
            Some(Err(why)) => Lookup::Failed(why.to_string()),
            None => continue,
        };
        let rejected = inv
            .helmops
            .iter()
            .find(|h| {
                h.metadata.namespace.as_deref() == Some(namespace)
                    && h.metadata.name.as_deref() == Some(name)
            })
            .and_then(|h| fleet_copy::rejection(h.status.as_ref()));
        let (verdict, why) = fleet_copy::verdict(&lookup, rejected.as_deref(), r.in_sync);
        tracing::debug!(helmop = %key, cluster = %r.cluster, resource = %r.resource(), verdict = verdict.as_str(), "fleet copy");
        r.fleet_copy = Some(verdict);
        r.reason = format!("{why}; {}", r.reason);
    }
}

/// The BundleDeployments of HelmOp `namespace/name` (labelled with its Bundle, which Fleet names
/// after the HelmOp), in every cluster namespace, as JSON.
async fn bundle_deployments(
    ctx: &Ctx,
    namespace: &str,
    name: &str,
) -> Result<Vec<serde_json::Value>, PluginError> {
    let resource = ApiResource {
        group: "fleet.cattle.io".into(),
        version: "v1alpha1".into(),
        api_version: "fleet.cattle.io/v1alpha1".into(),
        kind: "BundleDeployment".into(),
        plural: "bundledeployments".into(),
    };
    let api: Api<DynamicObject> = Api::all_with(ctx.upstream.clone(), &resource);
    let selector = format!(
        "{}={namespace},{}={name}",
        fleet_copy::BD_BUNDLE_NAMESPACE_LABEL,
        fleet_copy::BD_BUNDLE_NAME_LABEL
    );
    let list = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| PluginError::Api {
            reason: api_error::describe(&e),
        })?;
    list.items
        .iter()
        .map(|o| {
            serde_json::to_value(o).map_err(|e| PluginError::ReadBundleDeployment(Arc::new(e)))
        })
        .collect()
}

/// Reads a Fleet-managed copy and compares its content hash (upstream key, in memory) with the
/// source's. Nothing of the data is kept or shown.
async fn fleet_copy_in_sync(
    client: &kube::Client,
    sources: &Sources,
    key: &HashKey,
    action: &Action,
) -> (Option<bool>, String) {
    let Some(helmop) = action.helmops.first() else {
        return (None, "no HelmOp to compare with".into());
    };
    let Some(source) = sources.get(&helmop.namespace, &action.resource) else {
        return (None, "the source is missing upstream".into());
    };
    let want = source.content_hash(key);
    let name = &action.resource.name;
    let have = match action.resource.kind {
        ResourceKind::Secret => Api::<Secret>::namespaced(client.clone(), &action.namespace)
            .get_opt(name)
            .await
            .map(|o| o.map(|s| content_hash(key, ResourceKind::Secret, &ObjectData::from(&s)))),
        ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), &action.namespace)
            .get_opt(name)
            .await
            .map(|o| o.map(|c| content_hash(key, ResourceKind::ConfigMap, &ObjectData::from(&c)))),
    };
    match have {
        Ok(Some(h)) if h == want => (Some(true), "Fleet's copy matches the source".into()),
        Ok(Some(_)) => (Some(false), "Fleet's copy differs from the source".into()),
        Ok(None) => (None, "Fleet's copy is gone".into()),
        Err(e) => (
            None,
            format!("cannot read Fleet's copy: {}", api_error::describe(&e)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use helmop_core::plan::{ConflictReason, HelmOpKey, OrphanReason};

    use super::*;

    fn action(kind: ActionKind) -> Action {
        Action {
            cluster: "c".into(),
            namespace: "apps".into(),
            resource: ResourceRef::secret("db"),
            helmops: vec![HelmOpKey::new("team", "app")],
            kind,
        }
    }

    fn workload_row(namespace: &str, workload: Option<&str>) -> Row {
        let mut r = Row::workload(
            vec!["team/app".into()],
            "fleet/down1".into(),
            namespace,
            &ResourceRef::secret("db"),
            workload.unwrap_or_default().into(),
            RowState::RolloutPending,
            "behind".into(),
        );
        r.workload = workload.map(str::to_owned);
        r
    }

    fn hold(reason: &str) -> helmop_core::check::Hold {
        helmop_core::check::Hold {
            reason: reason.into(),
            note: format!("{reason} note"),
        }
    }

    #[test]
    fn holds_go_on_the_rows_of_their_workload_only() {
        let mut rows = vec![
            workload_row("apps", Some("Deployment/web")),
            workload_row("apps", Some("Deployment/api")),
            workload_row("apps", None),
            workload_row("other", Some("Deployment/web")),
            workload_row("apps", Some("StatefulSet/web")),
        ];
        let read = Holds {
            held: BTreeMap::from([
                (
                    WorkloadId::new("apps", "Deployment", "web"),
                    hold("RestampHeld"),
                ),
                (
                    WorkloadId::new("apps", "cronjob", "nightly"),
                    hold("RestampBreakerOpen"),
                ),
            ]),
            complete: true,
        };
        assert_eq!(put_holds(&mut rows, "fleet/down1", "apps", Ok(read)), None);
        let held: Vec<Option<&str>> = rows
            .iter()
            .map(|r| r.hold.as_ref().map(|h| h.reason.as_str()))
            .collect();
        assert_eq!(held, [Some("RestampHeld"), None, None, None, None]);
        // Restamped since: read again, the hold is gone.
        let none = Holds {
            held: BTreeMap::new(),
            complete: true,
        };
        assert_eq!(put_holds(&mut rows, "fleet/down1", "apps", Ok(none)), None);
        assert!(rows.iter().all(|r| r.hold.is_none()));
        let json = serde_json::to_value(&rows[0]).unwrap_or_default();
        assert!(json.get("hold").is_none(), "{json}");
    }

    #[test]
    fn unreadable_or_truncated_events_are_a_note_not_an_error() {
        let mut rows = vec![workload_row("apps", Some("Deployment/web"))];
        let note = put_holds(
            &mut rows,
            "fleet/down1",
            "apps",
            Err("events is forbidden: User \"x\" cannot list resource \"events\"".into()),
        );
        let note = note.unwrap_or_default();
        assert!(
            note.starts_with(
                "fleet/down1: cannot read the rollout watcher's Events in namespace apps"
            ) && note.contains("forbidden"),
            "{note}"
        );
        assert!(rows[0].hold.is_none());
        let partial = Holds {
            held: BTreeMap::from([(
                WorkloadId::new("apps", "Deployment", "web"),
                hold("RestampIneffective"),
            )]),
            complete: false,
        };
        let note = put_holds(&mut rows, "fleet/down1", "apps", Ok(partial)).unwrap_or_default();
        assert!(note.contains("first 5000 Events"), "{note}");
        assert_eq!(
            rows[0].hold.as_ref().map(|h| h.label()),
            Some("gave-up"),
            "what was read is shown"
        );
        let json = serde_json::to_value(&rows[0]).unwrap_or_default();
        assert_eq!(
            json["hold"],
            serde_json::json!({"reason": "RestampIneffective", "note": "RestampIneffective note"})
        );
    }

    #[test]
    fn a_hold_does_not_change_the_exit_status() {
        let mut row = workload_row("apps", Some("Deployment/web"));
        row.hold = Some(hold("RestampHeld"));
        let report = StatusReport {
            upstream_id: "up".into(),
            hash_key: KeyOrigin::Existing,
            summary: report::counts(std::slice::from_ref(&row)),
            rows: vec![row],
            problems: Vec::new(),
            rejected: Vec::new(),
            unreachable_clusters: 0,
            notes: vec!["c: cannot read the rollout watcher's Events".into()],
        };
        assert_eq!(report.exit_status(), ExitStatus::Ok);
    }

    #[test]
    fn states_follow_the_plan() {
        let cases = [
            (ActionKind::Unchanged, "Synced"),
            (
                ActionKind::Update {
                    source: helmop_core::plan::SourceRef::new(
                        "u",
                        "team",
                        ResourceRef::secret("db"),
                    ),
                    uid: "u".into(),
                    meta: Default::default(),
                    reasons: vec![UpdateReason::ContentChanged, UpdateReason::Drifted],
                },
                "Drifted",
            ),
            (ActionKind::Conflict(ConflictReason::NotManaged), "Conflict"),
            (ActionKind::SkipFleetManaged, "FleetManaged"),
            (ActionKind::SourceMissing, "SourceMissing"),
            (ActionKind::Prune { uid: "u".into() }, "Orphaned"),
            (
                ActionKind::RemoveOwner {
                    uid: "u".into(),
                    owners: "x".into(),
                },
                "Orphaned",
            ),
            (ActionKind::Orphaned(OrphanReason::NoOwners), "Orphaned"),
            (
                ActionKind::Keep {
                    uid: "u".into(),
                    rewrite: false,
                },
                "Kept",
            ),
        ];
        for (kind, want) in cases {
            assert_eq!(state_of(&action(kind.clone())).as_str(), want, "{kind:?}");
        }
    }
}
