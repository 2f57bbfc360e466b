//! `prune`: remove copies no HelmOp wants any more (an entry removed, the destination namespace
//! changed, a cluster untargeted, the HelmOp deleted).
//!
//! Safety, in order:
//! - nothing is looked at downstream unless HelmOps, Clusters, ClusterGroups and every HelmOp's
//!   targets were all enumerated without error; otherwise prune stops with nothing deleted;
//! - only objects with helmop's markers (managed-by label AND source annotation) are candidates,
//!   and only owners of this upstream id within the selection are released (core planner);
//! - a copy still listing other owners only loses ours (`Released`); a copy written for a HelmOp
//!   with `keepResources` loses its owners annotation and stays (`Kept`); a later HelmOp listing
//!   the same source (same source-uid) re-adopts it on its next `propagate`;
//! - before a copy is deleted or its owners rewritten, its markers must check out upstream: its
//!   `helmop.dev/source` names this upstream, and the source object there exists with the uid
//!   in `helmop.dev/source-uid` (metadata only). A look-alike carrying the labels without a
//!   matching source uid is reported `Orphaned` and never touched; so is a real copy whose
//!   source was deleted too (delete such copies by hand);
//! - the wants are listed again after a cluster was observed and before its first write, so a
//!   copy that a HelmOp created or retargeted during the run wants is left alone (`Kept`);
//! - every delete carries uid and resourceVersion preconditions, every owners rewrite the same
//!   guard, so an object replaced or changed since it was read is never touched.
//!
//! - a copy still wanted by some HelmOps loses the owners entries of HelmOps that no longer want
//!   it (`Released`), with the same guard; its content is `propagate`'s business.
//!
//! Sources' data is never read (only their metadata): whether a copy is wanted depends only on
//! HelmOps and targets.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::sync::Mutex;
use tokio::time::Instant;

use helmop_core::names;
use helmop_core::plan::{
    Action, ActionKind, ConflictReason, CopyMeta, DesiredCopy, HeldCopy, HelmOpKey, SourceRef,
    UpdateReason,
};
use helmop_core::resource::ResourceKind;
use helmop_core::state::RowState;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::cluster::api_error;
use crate::cluster::clusters::Downstream;
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::run::inventory::Inventory;
use crate::run::observe::Observation;
use crate::run::plan::{observe_and_plan, row};

/// Live source uids by source (`None`: no such source), shared by the clusters of one run.
type SourceUids = Mutex<BTreeMap<SourceRef, Result<Option<String>, PluginError>>>;
use crate::output::report::{self, Row};
use crate::run::same_cluster::{Done, SameCluster};
use crate::run::scope::Scope;
use crate::run::sources::{self, Sources};

#[derive(Clone, Debug)]
pub struct PruneOpts {
    pub scope: Scope,
    pub dry_run: bool,
}

#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PruneReport {
    pub upstream_id: String,
    pub dry_run: bool,
    /// Copies pruned, released, kept or left orphaned, and clusters that could not be read.
    pub rows: Vec<Row>,
    /// Rows per state.
    pub summary: BTreeMap<RowState, usize>,
    pub unreachable_clusters: usize,
    /// Write requests made (deletes and owner rewrites).
    pub writes: u64,
}

impl PruneReport {
    /// 2 when a cluster could not be read or a delete failed, else 1 when a source was found
    /// where a copy is (`Conflict`), else 0.
    pub fn exit_status(&self) -> ExitStatus {
        if self.unreachable_clusters > 0 || self.summary.contains_key(&RowState::Failed) {
            ExitStatus::Partial
        } else if self.summary.contains_key(&RowState::Conflict) {
            ExitStatus::Invalid
        } else {
            ExitStatus::Ok
        }
    }
}

/// Prunes; fails with nothing deleted when the enumeration upstream is incomplete.
pub async fn prune(ctx: &Ctx, opts: &PruneOpts) -> Result<PruneReport, PluginError> {
    let writes_before = ctx.writes();
    let inv = opts.scope.inventory(ctx, true).await?;
    if !inv.complete() {
        let problems: Vec<String> = inv
            .problems
            .iter()
            .map(|p| format!("{}: {}", p.helmop, p.message))
            .collect();
        return Err(PluginError::Upstream(format!(
            "prune aborted, nothing deleted: the targets of some HelmOps cannot be evaluated ({})",
            problems.join("; ")
        )));
    }
    if let Err(why) = &ctx.upstream_cluster {
        return Err(PluginError::Upstream(format!(
            "prune aborted, nothing deleted: {why}; helmop never prunes without knowing which cluster holds the sources"
        )));
    }
    let sources = sources::fetch_metadata(ctx, &inv.desired).await?;
    crate::test_pause::pause("prune-after-list", "upstream").await;
    let uids = SourceUids::default();
    let fresh = FreshWants::default();
    let same = SameCluster::default();
    let (mut rows, unreachable) = opts
        .scope
        .rows_per_cluster(
            &inv,
            "prune",
            |downstream, client| {
                let (inv, sources, uids, fresh, same) = (&inv, &sources, &uids, &fresh, &same);
                async move {
                    let run = PruneRun {
                        ctx,
                        opts,
                        inv,
                        sources,
                        uids,
                        fresh,
                        same,
                        downstream,
                        client,
                    };
                    run.run().await
                }
            },
            |d, reason| {
                vec![Row::about(
                    d.display(),
                    "",
                    RowState::Unreachable,
                    format!("{reason}; nothing pruned there"),
                )]
            },
        )
        .await;
    report::sort(&mut rows);
    Ok(PruneReport {
        upstream_id: ctx.upstream_id.clone(),
        dry_run: opts.dry_run,
        summary: report::counts(&rows),
        rows,
        unreachable_clusters: unreachable.len(),
        writes: ctx.writes() - writes_before,
    })
}

/// One cluster's prune: what every step of it needs, the run's shared state included.
struct PruneRun<'a> {
    ctx: &'a Ctx,
    opts: &'a PruneOpts,
    inv: &'a Inventory,
    sources: &'a Sources,
    /// Live source uids, shared by the clusters of this run.
    uids: &'a SourceUids,
    fresh: &'a FreshWants,
    /// What earlier registrations claiming the same cluster identity pruned or released.
    same: &'a SameCluster,
    downstream: &'a Downstream,
    client: kube::Client,
}

/// What the HelmOps want, listed again after a cluster was observed (see [`FreshWants::get`]).
#[derive(Default)]
struct FreshWants {
    last: Mutex<Option<(Instant, Wants)>>,
}

/// One listing's wants, or why it failed.
type Wants = Result<Arc<Vec<DesiredCopy>>, String>;

impl FreshWants {
    /// The wants as listed after `observed`: a listing started after it is shared by every
    /// cluster observed before that start, so clusters finishing together cost one listing.
    async fn get(&self, ctx: &Ctx, inv: &Inventory, observed: Instant) -> Wants {
        let mut last = self.last.lock().await;
        if let Some((started, wants)) = &*last
            && *started > observed
        {
            return wants.clone();
        }
        let started = Instant::now();
        let wants = inv
            .wants_now(ctx)
            .await
            .map(Arc::new)
            .map_err(|e| e.to_string());
        *last = Some((started, wants.clone()));
        wants
    }
}

/// The HelmOps that want `action`'s copy now, through `cluster` or any registration that may
/// reach the same cluster (`one`), among those it would release (any, for a delete).
fn wanted_again(
    wants: &[DesiredCopy],
    one: impl Fn(&str) -> bool,
    action: &Action,
) -> Vec<HelmOpKey> {
    // `None`: every HelmOp counts (the copy would be deleted, or lose all its owners).
    let releasing = match &action.kind {
        ActionKind::Prune { .. } | ActionKind::Keep { .. } | ActionKind::Handover { .. } => None,
        ActionKind::Update { .. } => released(action),
        _ => Some(action.helmops.clone()),
    };
    let mut out: Vec<HelmOpKey> = wants
        .iter()
        .filter(|d| one(&d.cluster))
        .filter(|d| d.namespace == action.namespace && d.resource == action.resource)
        .filter(|d| releasing.as_ref().is_none_or(|r| r.contains(&d.helmop)))
        .map(|d| d.helmop.clone())
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Why a write `action` planned on `cluster` must not happen after all, given what the HelmOps
/// want now (`Failed` when that could not be listed).
fn held_back(
    wants: &Wants,
    one: impl Fn(&str) -> bool,
    action: &Action,
) -> Option<(RowState, String)> {
    let wants = match wants {
        Ok(wants) => wants,
        Err(why) => {
            let reason = format!("cannot list what HelmOps want now ({why}); left alone");
            return Some((RowState::Failed, reason));
        }
    };
    let again = wanted_again(wants, one, action);
    if again.is_empty() {
        return None;
    }
    let by: Vec<String> = again.iter().map(ToString::to_string).collect();
    let reason = format!(
        "wanted again since the HelmOps were listed, by {}; left alone",
        by.join(", ")
    );
    Some((RowState::Kept, reason))
}

/// Whether `action` would delete a copy or release owners of it.
fn writes(action: &Action) -> bool {
    matches!(
        action.kind,
        ActionKind::Prune { .. }
            | ActionKind::RemoveOwner { .. }
            | ActionKind::Keep { rewrite: true, .. }
            | ActionKind::Handover { .. }
    ) || released(action).is_some()
}

/// The owners a still-wanted copy's planned update releases, if any.
fn released(action: &Action) -> Option<Vec<HelmOpKey>> {
    let ActionKind::Update { reasons, .. } = &action.kind else {
        return None;
    };
    let keys: Vec<HelmOpKey> = reasons
        .iter()
        .flat_map(|r| match r {
            UpdateReason::OwnersRemoved(keys) => keys.clone(),
            _ => Vec::new(),
        })
        .collect();
    (!keys.is_empty()).then_some(keys)
}

impl PruneRun<'_> {
    async fn run(&self) -> Result<Vec<Row>, PluginError> {
        let (inv, downstream) = (self.inv, self.downstream);
        let plan = observe_and_plan(
            self.ctx,
            inv,
            self.sources,
            downstream,
            &self.client,
            false,
            false,
        );
        let (obs, actions) = plan.await?;
        let observed = Instant::now();
        crate::test_pause::pause("prune-after-plan", &self.downstream.display()).await;
        // The first listing may be minutes old by now (a slow cluster before this one): what is
        // deleted or released must still be unwanted by the HelmOps as they are after this
        // cluster was observed. Read once per cluster that has something to write.
        let wants_now = if actions.iter().any(writes) {
            Some(self.fresh.get(self.ctx, self.inv, observed).await)
        } else {
            None
        };
        let mut rows = Vec::new();
        for action in &actions {
            if let Some(row) = self.step(&obs, wants_now.as_ref(), action).await {
                rows.push(row);
            }
        }
        Ok(rows)
    }

    /// One planned action: its row, or `None` when it is not prune's business or was done
    /// through an earlier registration of the same claimed cluster (whose row says so).
    async fn step(
        &self,
        obs: &Observation,
        wants_now: Option<&Wants>,
        action: &Action,
    ) -> Option<Row> {
        let writes = writes(action);
        let identity = self.downstream.identity.as_deref();
        let place = (action.namespace.clone(), action.resource.clone());
        if writes && self.same.place(identity, &place).is_some() {
            return None;
        }
        if writes && let Some((state, reason)) = self.left_alone(obs, wants_now, action).await {
            return Some(row(self.downstream, action, state, reason));
        }
        let (shown, state, reason) = self.execute(obs, action).await?;
        if writes && state != RowState::Failed {
            let by = self.downstream.display();
            self.same.wrote(identity, place, Done { by, state });
        }
        Some(row(self.downstream, &shown, state, reason))
    }

    /// Why the write `action` plans must not happen after all, if it must not: wanted again,
    /// the cluster not proven, or the copy's markers not checking out upstream.
    async fn left_alone(
        &self,
        obs: &Observation,
        wants_now: Option<&Wants>,
        action: &Action,
    ) -> Option<(RowState, String)> {
        let downstream = self.downstream;
        if let Some(wants) = wants_now
            && let Some(held) = held_back(
                wants,
                |c| self.inv.may_reach_one(&downstream.key, c),
                action,
            )
        {
            return Some(held);
        }
        if downstream.identity.is_none() {
            // It may be the management cluster (this may be a source), or reached by another
            // registration of this run deleting the same object: nothing is proven.
            let reason = "the cluster's identity cannot be read (get namespaces/kube-system), so prune deletes and releases nothing through this registration; left alone".to_string();
            return Some((RowState::Orphaned, reason));
        }
        if let Err(why) = self.verify_source(obs, action).await {
            // A source that could not be read is no verdict: the copy may be ours and unwanted,
            // or not ours at all. It is left alone and the run fails (exit 2), so nobody takes
            // "nothing pruned" for "nothing to prune".
            let state = match why {
                PluginError::SourceUnverifiable { .. } => RowState::Failed,
                _ => RowState::Orphaned,
            };
            return Some((state, format!("{why}; left alone")));
        }
        None
    }

    /// Carries out (or, dry, reports) one action: the action to show, its state and reason;
    /// `None` when it is not prune's business.
    async fn execute(
        &self,
        obs: &Observation,
        action: &Action,
    ) -> Option<(Action, RowState, String)> {
        let guard = |uid: &str| Guard {
            uid: uid.to_string(),
            version: obs
                .version(&action.namespace, &action.resource)
                .unwrap_or_default()
                .to_string(),
        };
        let (state, reason) = match &action.kind {
            ActionKind::Prune { uid } => self.delete(action, &guard(uid)).await,
            // Annotation rewrites: the owners left, no owners (kept), or this kind's mark off.
            ActionKind::RemoveOwner { uid, .. }
            | ActionKind::Keep { uid, rewrite: true }
            | ActionKind::Handover { uid, .. } => {
                let (set, done) = letting_go(&action.kind);
                self.rewrite(action, &guard(uid), &set, done, action.reason())
                    .await
            }
            ActionKind::Keep { rewrite: false, .. } => (RowState::Kept, action.reason()),
            ActionKind::Orphaned(_) => (RowState::Orphaned, action.reason()),
            // Not pruned while paused or rejected: say so instead of staying silent.
            ActionKind::Held {
                why,
                copy: HeldCopy::Unwanted,
            } => (why.state(), action.reason()),
            ActionKind::Conflict(ConflictReason::IsSource) => (RowState::Conflict, action.reason()),
            ActionKind::Update { uid, meta, .. } => {
                return self.release(action, &guard(uid), meta).await;
            }
            _ => return None,
        };
        Some((action.clone(), state, reason))
    }

    /// A copy still wanted, whose owners include HelmOps that let go: only the ownership part
    /// of the planned update is prune's (the content is propagate's). `None`: nobody let go.
    async fn release(
        &self,
        action: &Action,
        guard: &Guard,
        meta: &CopyMeta,
    ) -> Option<(Action, RowState, String)> {
        let released = released(action)?;
        let shown = Action {
            helmops: released,
            ..action.clone()
        };
        let why = format!(
            "still wanted by others; releasing {}",
            shown
                .helmops
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        let set = BTreeMap::from([
            (
                names::ANN_OWNERS,
                meta.annotations.get(names::ANN_OWNERS).cloned(),
            ),
            (
                names::ANN_KEEP,
                meta.annotations.get(names::ANN_KEEP).cloned(),
            ),
        ]);
        let done = (RowState::Release, RowState::Released);
        let (state, reason) = self.rewrite(&shown, guard, &set, done, why).await;
        Some((shown, state, reason))
    }

    /// Checks a copy's markers against the live source upstream (see the module documentation).
    async fn verify_source(&self, obs: &Observation, action: &Action) -> Result<(), PluginError> {
        let ctx = self.ctx;
        let copy = obs
            .get(&action.namespace, &action.resource)
            .ok_or(PluginError::CopyNotListed)?;
        let source = copy
            .annotations
            .get(names::ANN_SOURCE)
            .and_then(|s| SourceRef::parse(s))
            .filter(|s| s.upstream_id == ctx.upstream_id)
            .ok_or(PluginError::ForeignSource)?;
        let recorded = copy.annotations.get(names::ANN_SOURCE_UID);
        let live = {
            let mut cache = self.uids.lock().await;
            match cache.get(&source) {
                Some(found) => found.clone(),
                None => {
                    let found = source_uid(ctx, &source).await;
                    cache.insert(source.clone(), found.clone());
                    found
                }
            }
        };
        match live {
            Ok(Some(uid)) if recorded == Some(&uid) => Ok(()),
            Ok(Some(_)) => Err(PluginError::SourceUidMismatch { object: source }),
            Ok(None) => Err(PluginError::SourceGone { object: source }),
            Err(e) => Err(PluginError::SourceUnverifiable {
                object: source,
                problem: Box::new(e),
            }),
        }
    }

    async fn delete(&self, action: &Action, guard: &Guard) -> (RowState, String) {
        if self.opts.dry_run {
            return (RowState::Prune, action.reason());
        }
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: Some(guard.uid.clone()),
                resource_version: Some(guard.version.clone()).filter(|v| !v.is_empty()),
            }),
            ..DeleteParams::default()
        };
        let (client, name) = (&self.client, &action.resource.name);
        let result = match action.resource.kind {
            ResourceKind::Secret => Api::<Secret>::namespaced(client.clone(), &action.namespace)
                .delete(name, &params)
                .await
                .map(|_| ()),
            ResourceKind::ConfigMap => {
                Api::<ConfigMap>::namespaced(client.clone(), &action.namespace)
                    .delete(name, &params)
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => {
                self.ctx.record_write();
                (RowState::Pruned, action.reason())
            }
            Err(e) if api_error::is_not_found(&e) => (RowState::Pruned, "already gone".into()),
            Err(e) => (RowState::Failed, refused("deleting", &e)),
        }
    }

    /// Sets or (with `None`) removes annotations, guarded by uid and resourceVersion; the row
    /// is `dry_state` in a dry run, else `done_state` once written.
    async fn rewrite(
        &self,
        action: &Action,
        guard: &Guard,
        set: &BTreeMap<&str, Option<String>>,
        (dry_state, done_state): (RowState, RowState),
        reason: String,
    ) -> (RowState, String) {
        if self.opts.dry_run {
            return (dry_state, reason);
        }
        let patch = annotations_patch(&guard.uid, &guard.version, set);
        let params = PatchParams {
            field_manager: Some(names::MANAGER.into()),
            ..PatchParams::default()
        };
        let (client, name) = (&self.client, &action.resource.name);
        let result = match action.resource.kind {
            ResourceKind::Secret => Api::<Secret>::namespaced(client.clone(), &action.namespace)
                .patch(name, &params, &Patch::Merge(&patch))
                .await
                .map(|_| ()),
            ResourceKind::ConfigMap => {
                Api::<ConfigMap>::namespaced(client.clone(), &action.namespace)
                    .patch(name, &params, &Patch::Merge(&patch))
                    .await
                    .map(|_| ())
            }
        };
        match result {
            Ok(()) => {
                self.ctx.record_write();
                (done_state, reason)
            }
            Err(e) => (RowState::Failed, refused("rewriting owners", &e)),
        }
    }
}

/// The object a write was planned against: it must still be this one, unchanged.
struct Guard {
    uid: String,
    version: String,
}

/// The annotations a copy's owners rewrite sets (`None`: removes), and the row's states dry
/// and done: the owners left, no owners (kept), or this kind's mark off.
fn letting_go(kind: &ActionKind) -> (BTreeMap<&'static str, Option<String>>, (RowState, RowState)) {
    match kind {
        ActionKind::RemoveOwner { owners, .. } => (
            BTreeMap::from([(names::ANN_OWNERS, Some(owners.clone()))]),
            (RowState::Release, RowState::Released),
        ),
        ActionKind::Handover { made_by, .. } => (
            BTreeMap::from([(names::ANN_MADE_BY, made_by.clone())]),
            (RowState::Release, RowState::Released),
        ),
        _ => (
            BTreeMap::from([(names::ANN_OWNERS, None)]),
            (RowState::Kept, RowState::Kept),
        ),
    }
}

/// The uid of a source object upstream (metadata only).
async fn source_uid(ctx: &Ctx, source: &SourceRef) -> Result<Option<String>, PluginError> {
    let name = &source.resource.name;
    let meta = match source.resource.kind {
        ResourceKind::Secret => Api::<Secret>::namespaced(ctx.upstream.clone(), &source.namespace)
            .get_metadata_opt(name)
            .await
            .map(|m| m.map(|m| m.metadata)),
        ResourceKind::ConfigMap => {
            Api::<ConfigMap>::namespaced(ctx.upstream.clone(), &source.namespace)
                .get_metadata_opt(name)
                .await
                .map(|m| m.map(|m| m.metadata))
        }
    };
    meta.map(|m| m.map(|m| m.uid.unwrap_or_default()))
        .map_err(|e| PluginError::Api {
            reason: api_error::describe(&e),
        })
}

fn refused(what: &str, e: &kube::Error) -> String {
    match api_error::code(e) {
        Some(409) | Some(422) => format!(
            "{what}: the object was replaced or changed since it was read, left alone ({})",
            api_error::describe(e)
        ),
        _ => format!("{what}: {}", api_error::describe(e)),
    }
}

/// A JSON merge patch of annotations (value `None` deletes), guarded by uid and
/// resourceVersion: the server refuses it if the object was replaced or changed since it was
/// read. Releases owners.
pub fn annotations_patch(uid: &str, version: &str, set: &BTreeMap<&str, Option<String>>) -> Value {
    let annotations: Map<String, Value> = set
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone().map_or(Value::Null, Value::String)))
        .collect();
    json!({"metadata": {"uid": uid, "resourceVersion": version, "annotations": annotations}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_patches_are_guarded() {
        let set = BTreeMap::from([
            ("helmop.dev/owners", None),
            ("helmop.dev/keep", Some("true".to_string())),
        ]);
        assert_eq!(
            annotations_patch("u", "7", &set),
            json!({"metadata": {"uid": "u", "resourceVersion": "7", "annotations": {
                "helmop.dev/owners": null, "helmop.dev/keep": "true"}}})
        );
    }

    fn report(states: &[RowState], unreachable: usize) -> PruneReport {
        PruneReport {
            upstream_id: "up-1".into(),
            dry_run: false,
            rows: Vec::new(),
            summary: states.iter().map(|s| (*s, 1)).collect(),
            unreachable_clusters: unreachable,
            writes: 0,
        }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(
            report(
                &[
                    RowState::Pruned,
                    RowState::Kept,
                    RowState::Orphaned,
                    RowState::Released
                ],
                0
            )
            .exit_status(),
            ExitStatus::Ok
        );
        assert_eq!(
            report(&[RowState::Pruned, RowState::Failed], 0).exit_status(),
            ExitStatus::Partial
        );
        assert_eq!(
            report(&[RowState::Pruned], 1).exit_status(),
            ExitStatus::Partial
        );
        assert_eq!(
            report(&[RowState::Pruned, RowState::Conflict], 0).exit_status(),
            ExitStatus::Invalid
        );
    }

    #[test]
    fn a_copy_wanted_again_is_only_kept_from_the_helmops_that_want_it_now() {
        use helmop_core::resource::ResourceRef;
        let here = "cluster:team/here".to_string();
        let want = crate::run::inventory::wanted_secret;
        let action = |kind: ActionKind, helmops: &[&str]| Action {
            cluster: here.clone(),
            namespace: "apps".into(),
            resource: ResourceRef::secret("db"),
            helmops: helmops.iter().map(|h| HelmOpKey::new("team", h)).collect(),
            kind,
        };
        let prune = action(ActionKind::Prune { uid: "u".into() }, &["old"]);
        let release = action(
            ActionKind::RemoveOwner {
                uid: "u".into(),
                owners: "up/team/web".into(),
            },
            &["old"],
        );
        let other = "cluster:team/far".to_string();
        // `far` is another cluster, `unknown` may be this one.
        let one = |c: &str| c == here || c == "cluster:team/unknown";
        let wants = [
            want(&here, "new", "db"),
            want(&other, "far", "db"),
            want(&here, "other", "cache"),
        ];
        assert_eq!(
            wanted_again(&wants, one, &prune),
            [HelmOpKey::new("team", "new")],
            "a delete waits for any HelmOp wanting the copy here"
        );
        assert!(
            wanted_again(&wants, one, &release).is_empty(),
            "releasing old is fine while new wants it"
        );
        let wants = [want(&here, "old", "db")];
        assert_eq!(wanted_again(&wants, one, &release).len(), 1);
        // A registration of unknown identity may be this one.
        let wants = [want("cluster:team/unknown", "new", "db")];
        assert_eq!(wanted_again(&wants, one, &prune).len(), 1);
        assert!(wanted_again(&[], one, &prune).is_empty());
    }

    #[test]
    fn registrations_protect_only_what_may_be_their_cluster() {
        use crate::run::inventory::Selection;
        use helmop_core::resource::ResourceRef;
        let want = |cluster: &str, helmop: &str| DesiredCopy {
            cluster: cluster.into(),
            namespace: "apps".into(),
            helmop: HelmOpKey::new("team", helmop),
            resource: ResourceRef::secret("db"),
            keep: false,
        };
        let (a, a2, b, down) = (
            "cluster:team/a",
            "cluster:team/a2",
            "cluster:team/b",
            "cluster:team/down",
        );
        let id = |uid: &str| Some(crate::identity::identity_key(uid));
        let inv = Inventory {
            desired: vec![want(a, "x"), want(a2, "x2"), want(b, "z"), want(down, "y")],
            identities: BTreeMap::from([
                (a.to_string(), id("uid-a")),
                (a2.to_string(), id("uid-a")),
                (b.to_string(), id("uid-b")),
                (down.to_string(), None),
            ]),
            unserved: vec![want("cluster:team/new", "n")],
            ..Inventory::empty(Selection::All)
        };
        let protected = |key: &str| -> Vec<(String, String)> {
            inv.protected(key)
                .into_iter()
                .map(|d| (d.cluster, d.helmop.name))
                .collect()
        };
        let on = |key: &str, names: &[&str]| -> Vec<(String, String)> {
            names
                .iter()
                .map(|n| (key.to_string(), n.to_string()))
                .collect()
        };
        // Same claim, unknown identity, or not seen by this enumeration: protected; another
        // claim: not.
        assert_eq!(protected(a), on(a, &["x2", "y", "n"]));
        assert_eq!(protected(b), on(b, &["y", "n"]));
        // Unknown identity: may be any cluster.
        assert_eq!(protected(down), on(down, &["x", "x2", "z", "n"]));
        assert!(inv.may_reach_one(a, a2) && !inv.may_reach_one(a, b));
        assert!(inv.may_reach_one(b, down) && inv.may_reach_one(b, "cluster:team/new"));
    }

    #[test]
    fn refusals_say_the_object_changed() {
        let mut status =
            kube::core::Status::failure("Precondition failed: UID in precondition", "Conflict");
        status.code = 409;
        let msg = refused("deleting", &kube::Error::Api(Box::new(status)));
        assert!(
            msg.starts_with("deleting: the object was replaced or changed since it was read"),
            "{msg}"
        );
    }
}
