//! `propagate`: copy the downstream resources of HelmOps to the clusters they target.
//!
//! One run ([`propagate_once`]): read (or create) the upstream hash key, enumerate HelmOps,
//! Clusters and targets, read the sources, then per downstream cluster (bounded concurrency,
//! per-cluster deadline) observe the copies' metadata, plan with `helmop_core::plan`, and execute:
//! server-side apply of new and changed copies, nothing at all for unchanged ones, and a
//! `helmop.dev/restamp` on every opted-in workload reading a copy whose content changed.
//! Deleting is `prune`'s job: copies no longer wanted are only reported here.
//!
//! For `--watch` (a loop around this): build the [`Ctx`] once, call [`propagate_once`] with
//! [`crate::runner::Progress::Quiet`] whenever something changed; [`Report::namespaces`] says which namespaces
//! hold the sources to watch, and [`Report::exit_status`] how the run went. A non-leader must not
//! call it without `dry_run: true`.

mod apply;

use std::collections::{BTreeMap, BTreeSet};

use helmop_core::hash::HashKey;
use helmop_core::names;
use helmop_core::plan::{
    Action, ActionKind, PlanInput, UpdateReason, migrate_upstream_ids, plan, take_sources,
};
use helmop_core::resource::ResourceRef;
use serde::Serialize;

pub use apply::annotations_patch;

use crate::api_error;
use crate::clusters::Downstream;
use crate::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::hash_key::{self, KeyOrigin};
use crate::inventory::{Inventory, Problem};
use crate::observe::{self, Observation};
use crate::report::{self, Row};
use crate::scope::Scope;
use crate::sources::{self, Sources};
use crate::workloads;

/// What to propagate and how.
#[derive(Clone, Debug)]
pub struct PropagateOpts {
    pub scope: Scope,
    /// `--adopt`: take over same-named objects helmop does not own.
    pub adopt: bool,
    /// `--dry-run`: plan and report, write nothing (not even the hash key).
    pub dry_run: bool,
}

/// The outcome of one run.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub upstream_id: String,
    pub dry_run: bool,
    /// Where the hash key came from (`created` the first time).
    pub hash_key: KeyOrigin,
    /// One row per copy and cluster, plus one per restamped workload and copy.
    pub rows: Vec<Row>,
    /// HelmOps whose targets could not be evaluated.
    pub problems: Vec<Problem>,
    pub summary: Summary,
    /// Namespaces of the HelmOps involved upstream (where their sources live).
    #[serde(skip)]
    pub namespaces: BTreeSet<String>,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub helmops: usize,
    pub clusters: usize,
    pub unreachable_clusters: usize,
    /// Rows per state.
    pub states: BTreeMap<String, usize>,
    /// Write requests made (applies, patches, namespaces, the hash key); 0 when nothing changed.
    pub writes: u64,
}

impl Report {
    /// 2 when a cluster was unreachable or a write failed, else 1 when a copy was refused
    /// (Conflict), a source is missing or a HelmOp's targets are invalid, else 0.
    pub fn exit_status(&self) -> ExitStatus {
        let has = |s: &str| self.summary.states.contains_key(s);
        if self.summary.unreachable_clusters > 0 || has("Failed") {
            ExitStatus::Partial
        } else if has("Conflict") || has("SourceMissing") || !self.problems.is_empty() {
            ExitStatus::Invalid
        } else {
            ExitStatus::Ok
        }
    }
}

/// One propagation run; see the module documentation.
pub async fn propagate_once(ctx: &Ctx, opts: &PropagateOpts) -> Result<Report, PluginError> {
    let writes_before = ctx.writes();
    let (key, origin) = hash_key::load(&ctx.upstream, !opts.dry_run, || ctx.record_write()).await?;
    let inv = opts.scope.inventory(ctx, false).await?;
    let sources = sources::fetch(ctx, &inv.desired, &key).await?;
    let (mut rows, unreachable) = opts
        .scope
        .rows_per_cluster(
            &inv,
            "propagate",
            |downstream, client| {
                let (inv, sources) = (&inv, &sources);
                async move {
                    let run = ClusterRun {
                        ctx,
                        opts,
                        inv,
                        sources,
                        downstream,
                        client,
                    };
                    run.run().await
                }
            },
            |downstream, reason| unreachable_rows(&inv, downstream, reason),
        )
        .await;
    rows.extend(problem_rows(&inv.problems));
    report::sort(&mut rows);
    Ok(Report {
        upstream_id: ctx.upstream_id.clone(),
        dry_run: opts.dry_run,
        hash_key: origin,
        summary: Summary {
            helmops: inv.helmops.len(),
            clusters: inv.downstreams.len(),
            unreachable_clusters: unreachable,
            states: report::counts(&rows),
            writes: ctx.writes() - writes_before,
        },
        rows,
        problems: inv.problems.clone(),
        namespaces: inv.helmop_namespaces(),
    })
}

/// Rows for the copies wanted on a cluster that could not be worked on (one row for the
/// cluster when none are wanted there, so it is never silently skipped).
pub fn unreachable_rows(inv: &Inventory, downstream: &Downstream, reason: &str) -> Vec<Row> {
    let mut by_place: BTreeMap<(String, ResourceRef), BTreeSet<String>> = BTreeMap::new();
    for d in inv.desired.iter().filter(|d| d.cluster == downstream.key) {
        by_place
            .entry((d.namespace.clone(), d.resource.clone()))
            .or_default()
            .insert(d.helmop.to_string());
    }
    if by_place.is_empty() {
        return vec![Row {
            helmops: Vec::new(),
            cluster: downstream.display(),
            namespace: String::new(),
            kind: String::new(),
            name: String::new(),
            workload: None,
            state: "Unreachable".into(),
            reason: reason.to_string(),
            in_sync: None,
        }];
    }
    by_place
        .into_iter()
        .map(|((namespace, resource), helmops)| Row {
            helmops: helmops.into_iter().collect(),
            cluster: downstream.display(),
            namespace,
            kind: resource.kind.as_str().into(),
            name: resource.name,
            workload: None,
            state: "Unreachable".into(),
            reason: reason.to_string(),
            in_sync: None,
        })
        .collect()
}

/// The places (namespace, resource) where copies are wanted on a cluster.
pub fn wanted_places(inv: &Inventory, cluster: &str) -> BTreeSet<(String, ResourceRef)> {
    inv.desired
        .iter()
        .filter(|d| d.cluster == cluster)
        .map(|d| (d.namespace.clone(), d.resource.clone()))
        .collect()
}

/// Observes a cluster and plans it with the core planner.
pub async fn observe_and_plan(
    ctx: &Ctx,
    inv: &Inventory,
    sources: &Sources,
    cluster: &str,
    client: &kube::Client,
    adopt: bool,
) -> Result<(Observation, Vec<Action>), String> {
    let mut obs = observe_cluster(inv, cluster, client).await?;
    // Copies marked with an earlier id of this upstream are ours (docs/cluster-identity.md).
    migrate_upstream_ids(&mut obs.copies, &ctx.upstream_id, &ctx.upstream_aliases);
    let actions = plan_observed(ctx, inv, sources, cluster, &obs, adopt);
    Ok((obs, actions))
}

/// Lists what is on a cluster where copies are or may be.
pub async fn observe_cluster(
    inv: &Inventory,
    cluster: &str,
    client: &kube::Client,
) -> Result<Observation, String> {
    observe::observe(client, cluster, &wanted_places(inv, cluster))
        .await
        .map_err(|e| format!("cannot list copies: {}", api_error::describe(&e)))
}

/// Plans one cluster with the core planner. On the upstream cluster itself, places that hold
/// sources are refused first (never written, adopted or pruned).
pub fn plan_observed(
    ctx: &Ctx,
    inv: &Inventory,
    sources: &Sources,
    cluster: &str,
    obs: &Observation,
    adopt: bool,
) -> Vec<Action> {
    let mut input = PlanInput {
        upstream_id: ctx.upstream_id.clone(),
        desired: inv
            .desired
            .iter()
            .filter(|d| d.cluster == cluster)
            .cloned()
            .collect(),
        sources: sources.plan.clone(),
        observed: obs.copies.clone(),
        scope: inv.scope(&ctx.upstream_id, &obs.copies),
        complete: inv.complete(),
        adopt,
    };
    let refused = if ctx.upstream_cluster.as_deref() == Ok(cluster) {
        take_sources(&mut input)
    } else {
        Vec::new()
    };
    let mut actions = plan(&input);
    actions.extend(refused);
    actions
}

/// A row for an action, in `state`.
pub fn row(downstream: &Downstream, action: &Action, state: &str, reason: String) -> Row {
    Row {
        helmops: action.helmops.iter().map(ToString::to_string).collect(),
        cluster: downstream.display(),
        namespace: action.namespace.clone(),
        kind: action.resource.kind.as_str().into(),
        name: action.resource.name.clone(),
        workload: None,
        state: state.into(),
        reason,
        in_sync: None,
    }
}

struct ClusterRun<'a> {
    ctx: &'a Ctx,
    opts: &'a PropagateOpts,
    inv: &'a Inventory,
    sources: &'a Sources,
    downstream: &'a Downstream,
    client: kube::Client,
}

/// A copy whose content this run wrote, and who wants it.
struct Changed {
    helmops: BTreeSet<String>,
}

impl ClusterRun<'_> {
    async fn run(&self) -> Result<Vec<Row>, String> {
        let (obs, actions) = observe_and_plan(
            self.ctx,
            self.inv,
            self.sources,
            &self.downstream.key,
            &self.client,
            self.opts.adopt,
        )
        .await?;
        let mut rows = Vec::new();
        let mut known_namespaces: BTreeMap<String, bool> = BTreeMap::new();
        let mut changed: BTreeMap<String, BTreeMap<ResourceRef, Changed>> = BTreeMap::new();
        // Content hash of every copy of ours on this cluster after the run, per namespace.
        let mut hashes: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
        for action in &actions {
            let (state, reason, wrote_content) = self
                .execute(action, &obs, &mut known_namespaces, &mut hashes)
                .await;
            if wrote_content {
                changed.entry(action.namespace.clone()).or_default().insert(
                    action.resource.clone(),
                    Changed {
                        helmops: action.helmops.iter().map(ToString::to_string).collect(),
                    },
                );
            }
            rows.push(row(self.downstream, action, state, reason));
        }
        for (namespace, copies) in &changed {
            rows.extend(self.restamp(namespace, copies, hashes.get(namespace)).await);
        }
        Ok(rows)
    }

    /// Carries out one action; returns the row's state and reason, and whether a copy's
    /// content was (or, dry, would be) written.
    async fn execute(
        &self,
        action: &Action,
        obs: &Observation,
        known_namespaces: &mut BTreeMap<String, bool>,
        hashes: &mut BTreeMap<String, BTreeMap<String, String>>,
    ) -> (&'static str, String, bool) {
        let dry = self.opts.dry_run;
        let mut remember = |hash: Option<&String>| {
            if let Some(h) = hash {
                hashes
                    .entry(action.namespace.clone())
                    .or_default()
                    .insert(action.resource.to_string(), h.clone());
            }
        };
        match &action.kind {
            ActionKind::Create { source, meta } => {
                remember(meta.annotations.get(names::ANN_CONTENT_HASH));
                let Some(data) = self.sources.get(&source.namespace, &source.resource) else {
                    return ("Failed", "source vanished while planning".into(), false);
                };
                let exists = match known_namespaces.get(&action.namespace) {
                    Some(e) => *e,
                    None => match apply::namespace_exists(&self.client, &action.namespace).await {
                        Ok(e) => {
                            known_namespaces.insert(action.namespace.clone(), e);
                            e
                        }
                        Err(e) => {
                            return ("Failed", write_error("reading the namespace", &e), false);
                        }
                    },
                };
                let mut reason = action.reason();
                if !exists {
                    reason.push_str(&format!("; namespace {} created", action.namespace));
                }
                if dry {
                    if !exists {
                        reason = reason.replace(" created", " will be created");
                    }
                    return ("Create", reason, true);
                }
                if !exists {
                    if let Err(e) =
                        apply::create_namespace(self.ctx, &self.client, &action.namespace).await
                    {
                        return ("Failed", write_error("creating the namespace", &e), false);
                    }
                    known_namespaces.insert(action.namespace.clone(), true);
                }
                let w = apply::Write {
                    source: data,
                    namespace: &action.namespace,
                    meta,
                    guard: None,
                };
                match apply::write_copy(self.ctx, &self.client, &w).await {
                    Ok(()) => ("Created", reason, true),
                    Err(e) if api_error::is_conflict(&e) => (
                        "Conflict",
                        format!(
                            "an object of this name appeared while copying and differs: {}",
                            api_error::describe(&e)
                        ),
                        false,
                    ),
                    Err(e) => ("Failed", write_error("applying the copy", &e), false),
                }
            }
            ActionKind::Update {
                source,
                uid,
                meta,
                reasons,
            } => {
                remember(meta.annotations.get(names::ANN_CONTENT_HASH));
                let content = reasons
                    .iter()
                    .any(|r| matches!(r, UpdateReason::ContentChanged | UpdateReason::Adopted));
                if dry {
                    return ("Update", action.reason(), content);
                }
                let Some(data) = self.sources.get(&source.namespace, &source.resource) else {
                    return ("Failed", "source vanished while planning".into(), false);
                };
                let version = obs
                    .version(&action.namespace, &action.resource)
                    .unwrap_or_default();
                let w = apply::Write {
                    source: data,
                    namespace: &action.namespace,
                    meta,
                    guard: Some((uid, version)),
                };
                match apply::write_copy(self.ctx, &self.client, &w).await {
                    Ok(()) => ("Updated", action.reason(), content),
                    Err(e) => ("Failed", write_error("applying the copy", &e), false),
                }
            }
            ActionKind::Unchanged => {
                let hash = obs
                    .get(&action.namespace, &action.resource)
                    .and_then(|o| o.annotations.get(names::ANN_CONTENT_HASH));
                remember(hash);
                ("Unchanged", action.reason(), false)
            }
            ActionKind::Conflict(_) => ("Conflict", action.reason(), false),
            ActionKind::SkipFleetManaged => ("FleetManaged", action.reason(), false),
            ActionKind::SourceMissing => ("SourceMissing", action.reason(), false),
            ActionKind::Prune { .. } | ActionKind::RemoveOwner { .. } => (
                "Orphaned",
                format!("{}; `kubectl helmop prune` removes it", action.reason()),
                false,
            ),
            ActionKind::Keep { .. } => ("Kept", action.reason(), false),
            ActionKind::Orphaned(_) => ("Orphaned", action.reason(), false),
        }
    }

    /// Restamps the opted-in workloads of `namespace` that read a copy whose content changed.
    async fn restamp(
        &self,
        namespace: &str,
        changed: &BTreeMap<ResourceRef, Changed>,
        hashes: Option<&BTreeMap<String, String>>,
    ) -> Vec<Row> {
        let base = |kind: &str, name: &str| Row {
            helmops: Vec::new(),
            cluster: self.downstream.display(),
            namespace: namespace.to_string(),
            kind: kind.to_string(),
            name: name.to_string(),
            workload: None,
            state: String::new(),
            reason: String::new(),
            in_sync: None,
        };
        let found = match workloads::list_opted_in(&self.client, namespace).await {
            Ok(w) => w,
            Err(e) => {
                let mut r = base("", "");
                r.state = "Failed".into();
                r.reason = format!(
                    "cannot list workloads to restamp: {}",
                    api_error::describe(&e)
                );
                return vec![r];
            }
        };
        let empty = BTreeMap::new();
        let hashes = hashes.unwrap_or(&empty);
        let mut rows = Vec::new();
        for w in found {
            let reads_changed: Vec<&ResourceRef> = w
                .reads
                .iter()
                .filter(|r| changed.contains_key(*r))
                .collect();
            if reads_changed.is_empty() {
                continue;
            }
            let copies: BTreeMap<String, String> = w
                .reads
                .iter()
                .filter_map(|r| Some((r.to_string(), hashes.get(&r.to_string())?.clone())))
                .collect();
            let value = workloads::restamp_value(&copies);
            if w.restamp.as_deref() == Some(value.as_str()) {
                continue;
            }
            let (state, reason) = if self.opts.dry_run {
                ("Restamp", "reads a copy whose content changes".to_string())
            } else {
                match workloads::restamp(&self.client, &w, &value).await {
                    Ok(after) => {
                        self.ctx.record_write();
                        let stamp = if after.is_none() {
                            format!(
                                "no {} in the pod template: is the helmop webhook installed here?",
                                names::ANN_CONFIG_HASH
                            )
                        } else if after != w.config_hash {
                            "pod template re-stamped".to_string()
                        } else {
                            "pod template stamp unchanged".to_string()
                        };
                        ("Restamped", stamp)
                    }
                    Err(e) => ("Failed", write_error("restamping", &e)),
                }
            };
            for resource in reads_changed {
                let mut r = base(resource.kind.as_str(), &resource.name);
                r.helmops = changed
                    .get(resource)
                    .map(|c| c.helmops.iter().cloned().collect())
                    .unwrap_or_default();
                r.workload = Some(w.display());
                r.state = state.into();
                r.reason = reason.clone();
                rows.push(r);
            }
        }
        rows
    }
}

fn write_error(what: &str, e: &kube::Error) -> String {
    if api_error::is_conflict(e) {
        format!(
            "{what}: the object changed since it was read; run again ({})",
            api_error::describe(e)
        )
    } else {
        format!("{what}: {}", api_error::describe(e))
    }
}

/// The key in use, for callers that hash (status).
pub async fn load_key(ctx: &Ctx, create: bool) -> Result<(HashKey, KeyOrigin), PluginError> {
    hash_key::load(&ctx.upstream, create, || ctx.record_write()).await
}

/// Rows for HelmOps whose targets cannot be evaluated.
pub fn problem_rows(problems: &[Problem]) -> Vec<Row> {
    problems
        .iter()
        .map(|p| Row {
            helmops: vec![p.helmop.clone()],
            cluster: "-".into(),
            namespace: String::new(),
            kind: String::new(),
            name: String::new(),
            workload: None,
            state: "Invalid".into(),
            reason: p.message.clone(),
            in_sync: None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::inventory::Selection;

    use super::*;

    fn report(states: &[&str], unreachable: usize, problems: usize) -> Report {
        Report {
            upstream_id: "up-1".into(),
            dry_run: false,
            hash_key: KeyOrigin::Existing,
            rows: Vec::new(),
            problems: (0..problems)
                .map(|i| Problem {
                    helmop: format!("ns/op{i}"),
                    message: "bad selector".into(),
                })
                .collect(),
            summary: Summary {
                unreachable_clusters: unreachable,
                states: states.iter().map(|s| (s.to_string(), 1)).collect(),
                ..Summary::default()
            },
            namespaces: BTreeSet::new(),
        }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(
            report(&["Created", "Unchanged", "FleetManaged", "Kept"], 0, 0).exit_status(),
            ExitStatus::Ok
        );
        assert_eq!(
            report(&["Created", "Conflict"], 0, 0).exit_status(),
            ExitStatus::Invalid
        );
        assert_eq!(
            report(&["SourceMissing"], 0, 0).exit_status(),
            ExitStatus::Invalid
        );
        assert_eq!(
            report(&["Created"], 0, 1).exit_status(),
            ExitStatus::Invalid
        );
        assert_eq!(
            report(&["Created", "Conflict"], 1, 0).exit_status(),
            ExitStatus::Partial
        );
        assert_eq!(report(&["Failed"], 0, 0).exit_status(), ExitStatus::Partial);
    }

    #[test]
    fn unreachable_clusters_keep_their_rows() {
        let inv = Inventory {
            selection: Selection::All,
            helmops: Vec::new(),
            downstreams: Vec::new(),
            desired: vec![
                helmop_core::plan::DesiredCopy {
                    cluster: "https://d1".into(),
                    namespace: "apps".into(),
                    helmop: helmop_core::plan::HelmOpKey::new("team", "a"),
                    resource: ResourceRef::secret("db"),
                    keep: false,
                },
                helmop_core::plan::DesiredCopy {
                    cluster: "https://d1".into(),
                    namespace: "apps".into(),
                    helmop: helmop_core::plan::HelmOpKey::new("team", "b"),
                    resource: ResourceRef::secret("db"),
                    keep: false,
                },
            ],
            problems: Vec::new(),
        };
        let d1 = Downstream {
            key: "https://d1".into(),
            names: vec!["team/d1".into()],
            config: Err("down".into()),
        };
        let rows = unreachable_rows(&inv, &d1, "connection refused");
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].helmops, ["team/a", "team/b"]);
        assert_eq!(
            (rows[0].state.as_str(), rows[0].reason.as_str()),
            ("Unreachable", "connection refused")
        );
        let d2 = Downstream {
            key: "https://d2".into(),
            names: vec!["team/d2".into()],
            config: Err("down".into()),
        };
        let rows = unreachable_rows(&inv, &d2, "timeout");
        assert_eq!(
            rows.len(),
            1,
            "a cluster without wanted copies still gets a row"
        );
        assert_eq!(rows[0].cluster, "team/d2");
    }
}
