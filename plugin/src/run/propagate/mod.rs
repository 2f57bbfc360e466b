//! `propagate`: copy the downstream resources of HelmOps to the clusters they target.
//!
//! One run ([`propagate_once`]): read (or create) the upstream hash key, enumerate HelmOps,
//! Clusters and targets, read the sources, then per downstream cluster (bounded concurrency,
//! per-cluster deadline) observe the copies (content hashed in memory, for drift), plan with
//! `helmop_core::plan`, and execute: a POST for a new copy, server-side apply of a changed one,
//! delete-then-create for one Kubernetes cannot change in place, nothing at all for unchanged
//! ones; then, in a second pass over the clusters once every copy is written, a
//! `helmop.dev/restamp` on every opted-in workload whose restamp record does not list the
//! content its copies have now (decided from state, so a killed run is repaired by the next).
//! Deleting unwanted copies is `prune`'s job: they are only reported here. Rules:
//! docs/copy-lifecycle.md.
//!
//! For `--watch` (a loop around this): build the [`Ctx`] once, call [`propagate_once`] with
//! [`crate::run::runner::Progress::Quiet`] whenever something changed; [`Report::namespaces`] says which namespaces
//! hold the sources to watch, and [`Report::exit_status`] how the run went. A non-leader must not
//! call it without `dry_run: true`.

mod apply;
mod recreate;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Mutex, PoisonError};

use helmop_core::names;
use helmop_core::plan::{Action, ActionKind};
use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_core::state::RowState;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::Resource;
use serde::Serialize;

pub use recreate::{DRAIN as RECREATE_DRAIN, drain as drain_recreates};

use crate::cluster::api_error;
use crate::cluster::clusters::Downstream;
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::output::report::{self, Row};
use crate::run::focus::{self, Focus};
use crate::run::hash_key::KeyOrigin;
use crate::run::inventory::{Inventory, Problem};
use crate::run::kept_inventory::KeptInventory;
use crate::run::observe::{self, NamespaceState, Observation};
use crate::run::plan::{
    load_key, observe_and_plan, observe_cluster, problem_rows, reported, row, uncopyable_rows,
    unreachable_rows,
};
use crate::run::same_cluster::{Done, SameCluster};
use crate::run::scope::Scope;
use crate::run::sources::{self, SourceData, Sources};
use crate::run::workloads;

/// What to propagate and how.
#[derive(Clone, Debug)]
pub struct PropagateOpts {
    pub scope: Scope,
    /// `--adopt`: take over same-named objects helmop does not own.
    pub adopt: bool,
    /// `--dry-run`: plan and report, write nothing (not even the hash key).
    pub dry_run: bool,
    /// `--new-hash-key`: create a new upstream hash key even though copies hashed with a
    /// lost one exist (every such copy's hash annotation is then rewritten).
    pub new_hash_key: bool,
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
    /// HelmOps Fleet's controller rejects (their copies are left as they are).
    pub rejected: Vec<Problem>,
    pub summary: Summary,
    /// Namespaces of the HelmOps involved upstream (where their sources live).
    #[serde(skip)]
    pub namespaces: BTreeSet<String>,
    /// References to the HelmOps of the run by `namespace/name` (for Kubernetes Events).
    #[serde(skip)]
    pub helmop_refs: BTreeMap<String, ObjectReference>,
    /// Every downstream cluster of the run, as rows name them.
    #[serde(skip)]
    pub clusters: Vec<String>,
    /// The clusters of the run that could not be reached, as rows name them.
    #[serde(skip)]
    pub unreachable: Vec<String>,
    /// A watcher's run after source edits only: those sources (it covered the clusters copying
    /// them, [`crate::run::focus`]); absent for a run over every cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub focus: Option<Vec<String>>,
    /// The kinds of copies the run worked on: every kind but after edits of sources of one kind
    /// ([`crate::run::focus::Focus::kinds`]); the rows of its clusters are of these kinds.
    #[serde(skip)]
    pub kinds: Vec<ResourceKind>,
}

#[derive(Clone, Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub helmops: usize,
    pub clusters: usize,
    pub unreachable_clusters: usize,
    /// Rows per state.
    pub states: BTreeMap<RowState, usize>,
    /// Write requests made (applies, patches, namespaces, the hash key); 0 when nothing changed.
    pub writes: u64,
}

impl Report {
    /// 2 when a cluster was unreachable or a write failed, else 1 when a copy was refused
    /// (Conflict), a source is missing, a HelmOp's targets are invalid or it lists a kind
    /// helmop cannot copy, else 0.
    pub fn exit_status(&self) -> ExitStatus {
        let has = |s: RowState| self.summary.states.contains_key(&s);
        if self.summary.unreachable_clusters > 0 || has(RowState::Failed) || has(RowState::Lost) {
            ExitStatus::Partial
        } else if has(RowState::Conflict)
            || has(RowState::SourceMissing)
            || has(RowState::Invalid)
            || !self.problems.is_empty()
        {
            ExitStatus::Invalid
        } else {
            ExitStatus::Ok
        }
    }

    /// Clusters this run reached and wrote everything it had to (no `Unreachable` or `Failed`
    /// row); a refused copy (Conflict) or a missing source is not the cluster's failure.
    pub fn succeeded_clusters(&self) -> Vec<String> {
        let failed: BTreeSet<&str> = self
            .rows
            .iter()
            .filter(|r| {
                matches!(
                    r.state,
                    RowState::Unreachable | RowState::Failed | RowState::Lost
                )
            })
            .map(|r| r.cluster.as_str())
            .collect();
        self.clusters
            .iter()
            .filter(|c| !failed.contains(c.as_str()))
            .cloned()
            .collect()
    }
}

/// One propagation run over every cluster; see the module documentation.
pub async fn propagate_once(ctx: &Ctx, opts: &PropagateOpts) -> Result<Report, PluginError> {
    propagate_focused(ctx, opts, &Focus::Everything, None).await
}

/// One propagation run over the clusters `focus` covers ([`crate::run::focus::covered`]): there
/// it does all a full run does; the other clusters are not contacted. A watcher passes the
/// inventory it keeps between runs: a run after source edits alone plans from it, and every run
/// leaves its inventory there ([`crate::run::kept_inventory`]).
pub async fn propagate_focused(
    ctx: &Ctx,
    opts: &PropagateOpts,
    focus: &Focus,
    kept: Option<&KeptInventory>,
) -> Result<Report, PluginError> {
    let writes_before = ctx.writes();
    let started = std::time::Instant::now();
    // Where a run's time goes (`HELMOP_LOG=kubectl_helmop=debug`), since its start.
    let lap = |step: &str| {
        let ms = started.elapsed().as_millis() as u64;
        tracing::debug!(step, ms, "run step done");
    };
    let (mut inv, covered) = inventory(ctx, opts, focus, kept).await?;
    lap("inventory");
    let parked = inv.narrow(covered.as_ref());
    if opts.adopt {
        inv.named_sources = never_adopted(ctx, &inv).await?;
    }
    let (mut key, mut origin) = load_key(ctx, false).await?;
    if origin == KeyOrigin::Ephemeral {
        // The dry run refuses exactly as the real run does.
        if !opts.new_hash_key {
            refuse_replacing_the_key(ctx, opts, &inv).await?;
        }
        if !opts.dry_run {
            (key, origin) = load_key(ctx, true).await?;
        }
    }
    // Set after the key check above, which looks for copies of every kind.
    if covered.is_some() {
        inv.kinds = focus.kinds();
    }
    let sources = sources::fetch(ctx, &inv.desired, &key).await?;
    lap("sources");
    // A dry run lists: what it prints is what a run that lists would do.
    let from_kept = covered.is_some() && focus.source_edits_only() && !opts.dry_run;
    let same = SameCluster::default();
    // Two passes: every cluster's copies first, then their readers' restamps. A copy is what an
    // edit is for (a mounted one reaches running pods without a rollout), and its write is about
    // a third of a cluster's requests; in one pass the last cluster's copy waited for every other
    // cluster's restamps as well (docs/decisions.md, "Copies first, and Clusters from the watch").
    let pending: Mutex<HashMap<String, Readers>> = Mutex::default();
    let run = |downstream, client| ClusterRun {
        ctx,
        opts,
        inv: &inv,
        sources: &sources,
        downstream,
        client,
        same: &same,
        from_kept,
    };
    let (mut rows, unreachable) = opts
        .scope
        .rows_per_cluster(
            &inv,
            "propagate",
            |downstream, client| {
                let (run, pending) = (&run, &pending);
                async move {
                    let (rows, readers) = run(downstream, client).write_copies().await?;
                    if !readers.is_empty() {
                        let mut pending = pending.lock().unwrap_or_else(PoisonError::into_inner);
                        pending.insert(downstream.key.clone(), readers);
                    }
                    Ok(rows)
                }
            },
            |downstream, reason| unreachable_rows(&inv, downstream, reason),
        )
        .await;
    lap("copies");
    let pending = pending.into_inner().unwrap_or_else(PoisonError::into_inner);
    if !pending.is_empty() {
        let (restamps, _) = opts
            .scope
            .rows_per_cluster_where(
                &inv,
                "restamping",
                |downstream| pending.contains_key(&downstream.key),
                |downstream, client| {
                    let readers = pending.get(&downstream.key);
                    let run = &run;
                    async move {
                        Ok(match readers {
                            Some(readers) => run(downstream, client).restamp_readers(readers).await,
                            None => Vec::new(),
                        })
                    }
                },
                |downstream, reason| {
                    pending
                        .get(&downstream.key)
                        .map(|readers| readers.unfinished(downstream, reason))
                        .unwrap_or_default()
                },
            )
            .await;
        rows.extend(restamps);
        lap("restamps");
    }
    rows.extend(problem_rows(&inv.problems));
    rows.extend(problem_rows(&inv.rejected));
    rows.extend(uncopyable_rows(&inv));
    report::sort(&mut rows);
    let report = Report {
        upstream_id: ctx.upstream_id.clone(),
        dry_run: opts.dry_run,
        hash_key: origin,
        summary: Summary {
            helmops: inv.helmops.len(),
            clusters: inv.downstreams.len(),
            unreachable_clusters: unreachable.len(),
            states: report::counts(&rows),
            writes: ctx.writes() - writes_before,
        },
        rows,
        problems: inv.problems.clone(),
        rejected: inv.rejected.clone(),
        namespaces: inv.helmop_namespaces(),
        helmop_refs: inv
            .helmops
            .iter()
            .filter_map(|h| {
                Some((
                    crate::run::inventory::key_of(h)?.to_string(),
                    h.object_ref(&()),
                ))
            })
            .collect(),
        clusters: inv.downstreams.iter().map(Downstream::display).collect(),
        unreachable,
        focus: covered.and_then(|_| focus.describe()),
        kinds: inv.kinds.clone(),
    };
    if let Some(kept) = kept {
        kept.keep(inv.widen(parked));
    }
    Ok(report)
}

/// The run's inventory and the clusters it covers (`None`: every one). A run after source edits
/// alone takes the kept inventory when the edits are plain source edits there; any other run,
/// or one with nothing kept, enumerates.
async fn inventory(
    ctx: &Ctx,
    opts: &PropagateOpts,
    focus: &Focus,
    kept: Option<&KeptInventory>,
) -> Result<(Inventory, Option<BTreeSet<String>>), PluginError> {
    if focus.source_edits_only()
        && let Some(inv) = kept.and_then(KeptInventory::take)
        && let Some(covered) = focus::covered(&inv, focus)
    {
        tracing::debug!(clusters = covered.len(), "planned from the kept inventory");
        return Ok((inv, Some(covered)));
    }
    let inv = opts.scope.inventory(ctx, false).await?;
    let covered = focus::covered(&inv, focus);
    Ok((inv, covered))
}

/// The upstream hash key is missing. Creating a new one would silently rewrite the hash of
/// every copy of this upstream (and restamp their readers), so it is refused while any
/// reachable targeted cluster holds such a copy: the user restores the key, or says
/// `--new-hash-key`. (A cluster that cannot be reached now is not known to hold any; its copies
/// are then reported `HashOutdated` when it is back.)
async fn refuse_replacing_the_key(
    ctx: &Ctx,
    opts: &PropagateOpts,
    inv: &Inventory,
) -> Result<(), PluginError> {
    let (found, _) = opts
        .scope
        .rows_per_cluster(
            inv,
            "checking for copies",
            |downstream, client| async move {
                let obs =
                    observe_cluster(ctx, inv, &downstream.key, &client, None, false, false).await?;
                // One entry (the cluster) per such copy.
                Ok(obs
                    .copies
                    .iter()
                    .filter(|o| hashed_copy_of(&ctx.upstream_id, o))
                    .map(|_| downstream.display())
                    .collect::<Vec<_>>())
            },
            |_, _| Vec::new(),
        )
        .await;
    if found.is_empty() {
        return Ok(());
    }
    let clusters: BTreeSet<&str> = found.iter().map(String::as_str).collect();
    Err(PluginError::Upstream(format!(
        "the hash key Secret {}/{} is missing, but {} copies hashed with it exist on {} cluster(s) ({}); \
         restore the Secret from a backup (the copies then stay valid), or run propagate with \
         --new-hash-key to hash every copy anew (rewrites each copy's hash annotation and restamps \
         the workloads reading it)",
        names::SYSTEM_NAMESPACE,
        names::HASH_KEY_SECRET,
        found.len(),
        clusters.len(),
        clusters.into_iter().collect::<Vec<_>>().join(", ")
    )))
}

/// A copy of this upstream carrying a content hash (made with some upstream hash key).
fn hashed_copy_of(upstream_id: &str, o: &helmop_core::plan::ObservedCopy) -> bool {
    o.labels.get(names::LABEL_MANAGED_BY).map(String::as_str) == Some(names::MANAGER)
        && o.annotations.contains_key(names::ANN_CONTENT_HASH)
        && o.annotations
            .get(names::ANN_SOURCE)
            .and_then(|s| helmop_core::plan::SourceRef::parse(s))
            .is_some_and(|s| s.upstream_id == upstream_id)
}

/// With `--adopt`: the places on the management cluster that must never be adopted, every source
/// any HelmOp names ([`crate::run::inventory::named_sources`]), when the run reaches that cluster. A
/// run that cannot tell which cluster is the management cluster (the upstream cluster could not
/// be identified), or cannot list every HelmOp while it reaches it, adopts nothing.
async fn never_adopted(
    ctx: &Ctx,
    inv: &Inventory,
) -> Result<Vec<(String, ResourceRef)>, PluginError> {
    let upstream = match &ctx.upstream_cluster {
        Ok(key) => key,
        Err(why) => {
            return Err(PluginError::Upstream(format!(
                "--adopt refused: {why}, so helmop cannot tell whether a target is the management cluster, whose sources it must never take over; run without --adopt, or give the upstream credentials that may get namespaces/kube-system"
            )));
        }
    };
    if !inv
        .downstreams
        .iter()
        .any(|d| d.identity.as_ref() == Some(upstream))
    {
        return Ok(Vec::new());
    }
    crate::run::inventory::named_sources(ctx).await.map_err(|e| {
        PluginError::Upstream(format!(
            "--adopt refused: the run reaches the management cluster, and the sources of every HelmOp there cannot be listed to protect them: {e}"
        ))
    })
}

struct ClusterRun<'a> {
    ctx: &'a Ctx,
    opts: &'a PropagateOpts,
    inv: &'a Inventory,
    sources: &'a Sources,
    downstream: &'a Downstream,
    client: kube::Client,
    /// What earlier registrations claiming the same cluster identity did this run.
    same: &'a SameCluster,
    /// Plan from the watcher's kept listings first ([`ClusterRun::write_copies`]).
    from_kept: bool,
}

/// One of our copies as it stands after the run (or, dry, would stand): its content hash and
/// the HelmOps wanting it.
struct CopyState {
    hash: String,
    helmops: Vec<String>,
    /// The run saw it exist: it wrote it, or found it in a listing made this run (not one kept).
    seen: bool,
}

/// What a cluster's first pass leaves for its second: every copy of ours there after the writes
/// (or, dry, as they would stand), per namespace that may hold readers. Restamps are decided from
/// this state, not from what the run wrote, so a run killed between the two passes is repaired by
/// the next one.
#[derive(Default)]
struct Readers {
    copies: BTreeMap<String, BTreeMap<ResourceRef, CopyState>>,
    /// Copies the run deleted to recreate and could not create again: their readers are not
    /// restamped (their new pods could not start).
    lost: BTreeMap<String, BTreeSet<ResourceRef>>,
    /// Copies Fleet's agent makes: their readers are decided from live reads.
    fleet: BTreeMap<String, BTreeMap<ResourceRef, Vec<String>>>,
    /// The kinds the run listed on the cluster (every kind but in a run that works on some
    /// only, and not those it planned from a kept listing): an object of those kinds that is not
    /// in `copies` is not a copy of ours.
    listed: Vec<ResourceKind>,
}

impl Readers {
    fn is_empty(&self) -> bool {
        self.copies.is_empty() && self.fleet.is_empty()
    }

    /// The rows of a second pass that did not finish: one per namespace whose readers were left.
    fn unfinished(&self, downstream: &Downstream, why: &str) -> Vec<Row> {
        let namespaces: BTreeSet<&String> = self.copies.keys().chain(self.fleet.keys()).collect();
        namespaces
            .into_iter()
            .map(|namespace| {
                Row::about(
                    downstream.display(),
                    namespace,
                    RowState::Failed,
                    format!(
                        "the copies were written, their readers not restamped: {why}; the next run restamps them"
                    ),
                )
            })
            .collect()
    }
}

/// The outcome of one action: the row's state and reason, and the content hash the copy has
/// afterwards (`None` when there is no copy of ours there, or its content is unknown).
struct Outcome {
    state: RowState,
    reason: String,
    hash: Option<String>,
}

impl Outcome {
    fn new(state: RowState, reason: String, hash: Option<&String>) -> Outcome {
        Outcome {
            state,
            reason,
            hash: hash.cloned(),
        }
    }

    fn failed(reason: String) -> Outcome {
        Outcome::new(RowState::Failed, reason, None)
    }
}

impl ClusterRun<'_> {
    /// Whether an earlier registration claiming this one's cluster identity restamped the
    /// workload this run (then it is its business: [`crate::run::same_cluster`]).
    fn restamped_earlier(&self, namespace: &str, workload: &str) -> bool {
        let identity = self.downstream.identity.as_deref();
        self.same
            .restamped_by(identity, namespace, workload)
            .is_some()
    }

    /// The first pass: observes and plans the cluster and writes its copies. Returns the rows
    /// and what the second pass ([`ClusterRun::restamp_readers`]) restamps from.
    ///
    /// With `from_kept` (a watcher's run after source edits alone) it plans from the listing the
    /// watcher kept when every write of that plan is an update, which the API server refuses if
    /// the copy changed or went away since; if any write then fails, the cluster is listed and
    /// planned again, and the copies the first attempt updated keep that row
    /// ([`crate::cluster::kept_listings`]).
    async fn write_copies(&self) -> Result<(Vec<Row>, Readers), PluginError> {
        let mut updated = Vec::new();
        if self.from_kept {
            let (obs, actions) = self.observe_and_plan(true).await?;
            if obs.kept.is_empty() || only_updates(&actions) {
                let (rows, readers) = self.write_planned(&obs, &actions).await;
                if obs.kept.is_empty() {
                    return Ok((rows, readers));
                }
                let cluster = self.downstream.display();
                if !rows.iter().any(|r| r.state == RowState::Failed) {
                    tracing::debug!(%cluster, "planned from the kept listing");
                    return Ok((rows, readers));
                }
                tracing::debug!(%cluster, "a write from the kept listing failed: listing the cluster again");
                updated = rows
                    .into_iter()
                    .filter(|r| r.state == RowState::Updated)
                    .collect();
            }
            if let Some(reads) = self.ctx.reads.as_deref() {
                reads.listings().forget(&self.downstream.key);
            }
        }
        let (obs, actions) = self.observe_and_plan(false).await?;
        let (mut rows, readers) = self.write_planned(&obs, &actions).await;
        for row in rows.iter_mut().filter(|r| r.state == RowState::Unchanged) {
            let same = |r: &&Row| {
                (&r.namespace, &r.kind, &r.name) == (&row.namespace, &row.kind, &row.name)
            };
            if let Some(first) = updated.iter().find(same) {
                *row = first.clone();
            }
        }
        Ok((rows, readers))
    }

    async fn observe_and_plan(
        &self,
        from_kept: bool,
    ) -> Result<(Observation, Vec<Action>), PluginError> {
        let planned = observe_and_plan(
            self.ctx,
            self.inv,
            self.sources,
            self.downstream,
            &self.client,
            self.opts.adopt,
            from_kept,
        )
        .await?;
        crate::test_pause::pause("after-plan", &self.downstream.display()).await;
        Ok(planned)
    }

    /// Carries out a cluster's plan: its rows, and what its readers' restamps go by.
    async fn write_planned(&self, obs: &Observation, actions: &[Action]) -> (Vec<Row>, Readers) {
        let mut rows = Vec::new();
        let mut namespaces = obs.namespaces.clone();
        let mut readers = Readers {
            listed: self
                .inv
                .kinds
                .iter()
                .filter(|k| !obs.kept.contains(k))
                .copied()
                .collect(),
            ..Readers::default()
        };
        for action in actions.iter().filter(|a| reported(a)) {
            if matches!(action.kind, ActionKind::SkipFleetManaged) {
                readers
                    .fleet
                    .entry(action.namespace.clone())
                    .or_default()
                    .insert(
                        action.resource.clone(),
                        action.helmops.iter().map(ToString::to_string).collect(),
                    );
            }
            let identity = self.downstream.identity.as_deref();
            let place = (action.namespace.clone(), action.resource.clone());
            let writes = action.kind.writes();
            // (A place this registration wrote itself, on a first attempt from a kept listing,
            // is planned again like any other.)
            if writes
                && let Some(done) = self.same.place(identity, &place)
                && done.by != self.downstream.display()
            {
                let reason = format!(
                    "left to {} this run, which claims the same cluster identity",
                    done.by
                );
                rows.push(row(self.downstream, action, done.state, reason));
                continue;
            }
            let out = self.execute(action, obs, &mut namespaces).await;
            if out.state == RowState::Lost {
                readers
                    .lost
                    .entry(action.namespace.clone())
                    .or_default()
                    .insert(action.resource.clone());
            }
            if writes && out.state != RowState::Failed {
                let done = Done {
                    by: self.downstream.display(),
                    state: out.state,
                };
                self.same.wrote(identity, place, done);
            }
            if let Some(hash) = out.hash {
                readers
                    .copies
                    .entry(action.namespace.clone())
                    .or_default()
                    .insert(
                        action.resource.clone(),
                        CopyState {
                            hash,
                            helmops: action.helmops.iter().map(ToString::to_string).collect(),
                            seen: !obs.kept.contains(&action.resource.kind)
                                || out.state != RowState::Unchanged,
                        },
                    );
            }
            rows.push(row(self.downstream, action, out.state, out.reason));
        }
        // A namespace this run created (or, dry, would create) held nothing when it was made:
        // no workload in it can have read a copy before this run wrote them.
        readers.copies.retain(|namespace, _| {
            !matches!(
                namespaces.get(namespace),
                Some(NamespaceState::Created | NamespaceState::Absent)
            )
        });
        (rows, readers)
    }

    /// The second pass: restamps the readers of what [`ClusterRun::write_copies`] left.
    async fn restamp_readers(&self, readers: &Readers) -> Vec<Row> {
        crate::test_pause::pause("before-restamp", &self.downstream.display()).await;
        let mut rows = Vec::new();
        let none = BTreeSet::new();
        for (namespace, copies) in &readers.copies {
            let lost = readers.lost.get(namespace).unwrap_or(&none);
            rows.extend(self.restamp(namespace, copies, lost, &readers.listed).await);
        }
        if !readers.fleet.is_empty() {
            let key = crate::run::live_stamp::cluster_key(&self.client).await;
            for (namespace, resources) in &readers.fleet {
                let restamped: BTreeSet<String> = rows
                    .iter()
                    .filter(|r| r.namespace == *namespace)
                    .filter_map(|r| r.workload.clone())
                    .collect();
                let key = key.as_ref().map_err(String::as_str);
                rows.extend(
                    self.restamp_fleet_readers(namespace, resources, key, &restamped)
                        .await,
                );
            }
        }
        let identity = self.downstream.identity.as_deref();
        for r in rows.iter().filter(|r| r.state != RowState::Failed) {
            if let Some(workload) = &r.workload {
                let by = self.downstream.display();
                self.same.restamped(identity, &r.namespace, workload, &by);
            }
        }
        rows
    }

    /// Restamps the opted-in workloads of `namespace` reading a copy Fleet's agent makes whose
    /// stamp is behind what their pods read now (Fleet's agent changed the copy, and Helm's
    /// unchanged Deployment was no UPDATE). Decided from live reads ([`workloads::live_state`]),
    /// so a rerun with nothing changed writes nothing; a workload without any stamp is left
    /// alone (no webhook stamps it: restamping would change nothing, every run).
    async fn restamp_fleet_readers(
        &self,
        namespace: &str,
        resources: &BTreeMap<ResourceRef, Vec<String>>,
        key: Result<&helmop_core::hash::HashKey, &str>,
        skip: &BTreeSet<String>,
    ) -> Vec<Row> {
        let found = match workloads::list_opted_in(&self.client, namespace).await {
            Ok(w) => w,
            Err(e) => {
                tracing::debug!(namespace, error = %api_error::describe(&e), "cannot list the readers of Fleet's copies");
                return Vec::new();
            }
        };
        let mut rows = Vec::new();
        for w in found {
            if skip.contains(&w.display()) || self.restamped_earlier(namespace, &w.display()) {
                continue;
            }
            let read: Vec<&ResourceRef> = w
                .reads
                .iter()
                .filter(|r| resources.contains_key(*r))
                .collect();
            if read.is_empty() {
                continue;
            }
            match workloads::live_state(&self.client, &w, key).await {
                workloads::LiveState::Behind => {}
                workloads::LiveState::Unknown(why) => {
                    tracing::debug!(workload = %w.display(), namespace, why, "not deciding a reader of Fleet's copies");
                    continue;
                }
                workloads::LiveState::Current
                | workloads::LiveState::Unstamped
                | workloads::LiveState::Missing(_) => continue,
            }
            let (state, reason) = if self.opts.dry_run {
                (
                    RowState::Restamp,
                    "its stamp is behind what its pods read (Fleet's agent changed the copy)"
                        .to_owned(),
                )
            } else {
                let value = workloads::fleet_restamp_value(
                    w.restamp.as_deref(),
                    k8s_openapi::jiff::Timestamp::now(),
                );
                match workloads::restamp(&self.client, &w, &value).await {
                    Ok(after) => {
                        self.ctx.record_write();
                        let what = if after != w.config_hash {
                            "pod template re-stamped: Fleet's agent changed the copy"
                        } else {
                            "pod template stamp unchanged"
                        };
                        (RowState::Restamped, what.to_owned())
                    }
                    Err(e) => (RowState::Failed, write_error("restamping", &e).to_string()),
                }
            };
            for resource in read {
                rows.push(Row::workload(
                    resources.get(resource).cloned().unwrap_or_default(),
                    self.downstream.display(),
                    namespace,
                    resource,
                    w.display(),
                    state,
                    reason.clone(),
                ));
            }
        }
        rows
    }

    /// The destination namespace's state, read once per run and cluster (observation may have
    /// read it already).
    async fn namespace(
        &self,
        namespace: &str,
        known: &mut BTreeMap<String, NamespaceState>,
    ) -> Result<NamespaceState, PluginError> {
        if let Some(s) = known.get(namespace) {
            return Ok(*s);
        }
        let s = observe::namespace_state(&self.client, namespace)
            .await
            .map_err(|e| write_error("reading the namespace", &e))?;
        known.insert(namespace.to_string(), s);
        Ok(s)
    }

    /// Makes sure a new object can be created in `namespace`: creates the namespace when
    /// absent (not when dry), refuses a terminating one. Returns the note for the reason.
    async fn prepare_namespace(
        &self,
        namespace: &str,
        known: &mut BTreeMap<String, NamespaceState>,
    ) -> Result<Option<String>, PluginError> {
        match self.namespace(namespace, known).await? {
            NamespaceState::Active | NamespaceState::Created | NamespaceState::Unreadable => {
                Ok(None)
            }
            NamespaceState::Terminating => Err(PluginError::NamespaceTerminating {
                namespace: namespace.to_owned(),
            }),
            NamespaceState::Absent => {
                let (meta, disputed) = self.inv.namespace_metadata(&self.downstream.key, namespace);
                if !self.opts.dry_run {
                    let created = apply::create_namespace(self.ctx, &self.client, namespace, &meta)
                        .await
                        .map_err(|e| write_error("creating the namespace", &e))?;
                    let state = if created {
                        NamespaceState::Created
                    } else {
                        NamespaceState::Active
                    };
                    known.insert(namespace.to_string(), state);
                }
                Ok(Some(namespace_note(namespace, &meta, &disputed)))
            }
        }
    }

    /// Carries out one action. A dry run decides exactly as the real run does (the same
    /// checks, the same reasons) and only skips the writes; its states are the real ones in
    /// the future tense (`Create` for `Created`).
    async fn execute(
        &self,
        action: &Action,
        obs: &Observation,
        namespaces: &mut BTreeMap<String, NamespaceState>,
    ) -> Outcome {
        let dry = self.opts.dry_run;
        let observed_hash = obs
            .get(&action.namespace, &action.resource)
            .and_then(|o| o.annotations.get(names::ANN_CONTENT_HASH));
        match &action.kind {
            ActionKind::Create { source, meta } => {
                let hash = meta.annotations.get(names::ANN_CONTENT_HASH);
                let Some(data) = self.sources.get(&source.namespace, &source.resource) else {
                    return Outcome::failed("source vanished while planning".into());
                };
                let note = match self.prepare_namespace(&action.namespace, namespaces).await {
                    Ok(n) => n,
                    Err(reason) => return Outcome::failed(reason.to_string()),
                };
                let reason = with_note(action.reason(), note);
                if dry {
                    return Outcome::new(RowState::Create, reason, hash);
                }
                self.create(data, action, meta, reason, hash).await
            }
            ActionKind::Update {
                source, uid, meta, ..
            } => {
                let hash = meta.annotations.get(names::ANN_CONTENT_HASH);
                if dry {
                    return Outcome::new(RowState::Update, action.reason(), hash);
                }
                let Some(data) = self.sources.get(&source.namespace, &source.resource) else {
                    return Outcome::failed("source vanished while planning".into());
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
                    Ok(written) => {
                        self.keep_written(written);
                        Outcome::new(RowState::Updated, action.reason(), hash)
                    }
                    Err(e) => Outcome::failed(write_error("applying the copy", &e).to_string()),
                }
            }
            ActionKind::Recreate {
                source,
                uid,
                resource_version,
                meta,
                ..
            } => {
                let hash = meta.annotations.get(names::ANN_CONTENT_HASH);
                let Some(data) = self.sources.get(&source.namespace, &source.resource) else {
                    return Outcome::failed("source vanished while planning".into());
                };
                // Deleting first and then finding the namespace refuses the new object would
                // lose the copy: check before.
                if let Err(reason) = self.prepare_namespace(&action.namespace, namespaces).await {
                    return Outcome::failed(reason.to_string());
                }
                if dry {
                    return Outcome::new(RowState::Recreate, action.reason(), hash);
                }
                let job = recreate::Job {
                    ctx: self.ctx.clone(),
                    client: self.client.clone(),
                    source: data.clone(),
                    namespace: action.namespace.clone(),
                    resource: action.resource.clone(),
                    uid: uid.clone(),
                    version: resource_version.clone(),
                    meta: meta.clone(),
                };
                match recreate::run(job).await {
                    recreate::Recreated::Done => {
                        Outcome::new(RowState::Recreated, action.reason(), hash)
                    }
                    recreate::Recreated::NotDeleted(e) => Outcome::failed(
                        write_error("deleting the copy to recreate it", &e).to_string(),
                    ),
                    recreate::Recreated::Lost(why) => Outcome::new(
                        RowState::Lost,
                        format!(
                            "deleted to be recreated, now missing: creating it again was refused {} times, last: {why}; the next run creates it",
                            recreate::ATTEMPTS
                        ),
                        None,
                    ),
                }
            }
            ActionKind::Unchanged => {
                Outcome::new(RowState::Unchanged, action.reason(), observed_hash)
            }
            ActionKind::Conflict(_) => Outcome::new(RowState::Conflict, action.reason(), None),
            ActionKind::SkipFleetManaged => {
                Outcome::new(RowState::FleetManaged, action.reason(), None)
            }
            ActionKind::SourceMissing => {
                Outcome::new(RowState::SourceMissing, action.reason(), None)
            }
            ActionKind::Prune { .. } | ActionKind::RemoveOwner { .. } => Outcome::new(
                RowState::Orphaned,
                format!("{}; `kubectl helmop prune` removes it", action.reason()),
                None,
            ),
            ActionKind::Keep { .. } | ActionKind::Handover { .. } => {
                Outcome::new(RowState::Kept, action.reason(), None)
            }
            ActionKind::Orphaned(_) => Outcome::new(RowState::Orphaned, action.reason(), None),
            // Frozen: never written, and no hash, so its readers are not restamped either.
            ActionKind::Held { why, .. } => Outcome::new(why.state(), action.reason(), None),
        }
    }

    /// A watcher keeps what a write left, so its next run does not read the copy back
    /// ([`crate::cluster::kept_hashes`]) and may plan from its listing
    /// ([`crate::cluster::kept_listings`]).
    fn keep_written(&self, mut written: observe::Whole) {
        let Some(reads) = self.ctx.reads.as_deref() else {
            return;
        };
        // Neither the listing nor the hash keeps field ownership: it is not copied.
        let (kind, meta) = written.meta_mut();
        meta.managed_fields = None;
        reads.listings().record(&self.downstream.key, kind, meta);
        let Some(key) = self.sources.key.as_ref() else {
            return;
        };
        if let Some((place, taken, live)) = observe::written_hash(key, written) {
            reads
                .hashes()
                .record(&self.downstream.key, place, taken, live);
        }
    }

    /// Creates a copy (POST). An object that appeared since observation is left untouched.
    async fn create(
        &self,
        data: &SourceData,
        action: &Action,
        meta: &helmop_core::plan::CopyMeta,
        reason: String,
        hash: Option<&String>,
    ) -> Outcome {
        match apply::create_copy(self.ctx, &self.client, data, &action.namespace, meta).await {
            Ok(written) => {
                self.keep_written(written);
                Outcome::new(RowState::Created, reason, hash)
            }
            Err(e) if api_error::is_conflict(&e) => {
                let (client, upstream) = (&self.client, &self.ctx.upstream_id);
                match apply::own_copy(client, upstream, &action.namespace, &action.resource).await {
                    Some(meta) if meta.deletion_timestamp.is_some() => Outcome::failed(
                        "helmop's earlier copy of this name is still being deleted (a finalizer holds it); tried again on the next run".into(),
                    ),
                    // Another writer for this upstream (another shard's leader wanting the same
                    // copy for its HelmOp, a one-shot propagate) created it first: the next
                    // run plans against it and adds this run's owners.
                    Some(_) => Outcome::failed(
                        "another run of this upstream (another shard, or a one-shot propagate) created this copy meanwhile; tried again on the next run".into(),
                    ),
                    None => Outcome::new(
                        RowState::Conflict,
                        "an object of this name appeared after the cluster was read; it was left untouched, run again to see whose it is".into(),
                        None,
                    ),
                }
            }
            Err(e) => Outcome::failed(write_error("creating the copy", &e).to_string()),
        }
    }

    /// Restamps the opted-in workloads of `namespace` reading one of our copies whose restamp
    /// record (`helmop.dev/restamp`) does not list the content those copies have now.
    async fn restamp(
        &self,
        namespace: &str,
        copies: &BTreeMap<ResourceRef, CopyState>,
        lost: &BTreeSet<ResourceRef>,
        listed: &[ResourceKind],
    ) -> Vec<Row> {
        let found = match workloads::list_opted_in(&self.client, namespace).await {
            Ok(w) => w,
            Err(e) => {
                let reason = format!(
                    "cannot list workloads to restamp: {}",
                    api_error::describe(&e)
                );
                let cluster = self.downstream.display();
                return vec![Row::about(cluster, namespace, RowState::Failed, reason)];
            }
        };
        let hashes: BTreeMap<ResourceRef, String> = copies
            .iter()
            .map(|(r, c)| (r.clone(), c.hash.clone()))
            .collect();
        let mut rows = Vec::new();
        for w in found {
            if self.restamped_earlier(namespace, &w.display()) {
                continue;
            }
            if let Some(missing) = w.reads.iter().find(|r| lost.contains(*r)) {
                tracing::warn!(workload = %w.display(), namespace, copy = %missing, "not restamped: it reads a copy this run left missing");
                continue;
            }
            let Some(due) = workloads::restamp_due(&w, &hashes) else {
                continue;
            };
            let held = self.unseen_missing(namespace, &w, copies, listed).await;
            let (state, reason) = if let Some(why) = held {
                tracing::warn!(workload = %w.display(), namespace, why, "not restamped");
                let reason = format!(
                    "not restamped: {why}; a run over every kind makes the copies first, then restamps it"
                );
                (RowState::Failed, reason)
            } else if self.opts.dry_run {
                (RowState::Restamp, due.reason.clone())
            } else {
                match workloads::restamp(&self.client, &w, &due.value).await {
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
                        (RowState::Restamped, stamp)
                    }
                    Err(e) => (RowState::Failed, write_error("restamping", &e).to_string()),
                }
            };
            for resource in &due.copies {
                rows.push(Row::workload(
                    copies
                        .get(resource)
                        .map(|c| c.helmops.clone())
                        .unwrap_or_default(),
                    self.downstream.display(),
                    namespace,
                    resource,
                    w.display(),
                    state,
                    reason.clone(),
                ));
            }
        }
        rows
    }

    /// Why restamping `w` could roll it into pods that cannot start, when the run could not see
    /// all it requires: an object it requires that is neither a copy the run saw exist nor
    /// plainly not a copy of ours (of a kind the run listed, and not found there) is read, and
    /// one missing holds the restamp back (a run that listed every kind makes a missing copy
    /// first). A full run never reads here.
    async fn unseen_missing(
        &self,
        namespace: &str,
        w: &workloads::Workload,
        copies: &BTreeMap<ResourceRef, CopyState>,
        listed: &[ResourceKind],
    ) -> Option<String> {
        let unseen =
            w.refs
                .iter()
                .filter(|r| !r.optional)
                .filter(|r| match copies.get(&r.resource) {
                    Some(copy) => !copy.seen,
                    None => !listed.contains(&r.resource.kind),
                });
        for r in unseen {
            match apply::read_meta(&self.client, namespace, &r.resource).await {
                Ok(Some(_)) => {}
                Ok(None) => return Some(format!("it requires {}, which is missing", r.resource)),
                Err(e) => {
                    return Some(format!(
                        "it requires {}, which cannot be read: {}",
                        r.resource,
                        api_error::describe(&e)
                    ));
                }
            }
        }
        None
    }
}

/// Whether every write of a plan is an update of an existing copy (guarded by its `uid` and
/// `resourceVersion`), so a plan from a kept listing cannot write through what changed since.
fn only_updates(actions: &[Action]) -> bool {
    actions
        .iter()
        .filter(|a| a.kind.writes())
        .all(|a| matches!(a.kind, ActionKind::Update { .. }))
}

/// What creating `namespace` does, the same words for `--dry-run` and the real run: e.g.
/// `creates namespace shop with labels team=a and annotations note=x; leaves label k unset
/// (the HelmOps wanting copies there disagree)`.
fn namespace_note(
    namespace: &str,
    meta: &helmop_core::targeting::NamespaceMetadata,
    disputed: &[String],
) -> String {
    let pairs = |m: &BTreeMap<String, String>| {
        m.iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let mut with = Vec::new();
    if !meta.labels.is_empty() {
        with.push(format!("labels {}", pairs(&meta.labels)));
    }
    if !meta.annotations.is_empty() {
        with.push(format!("annotations {}", pairs(&meta.annotations)));
    }
    let mut note = format!("creates namespace {namespace}");
    if !with.is_empty() {
        note.push_str(&format!(" with {}", with.join(" and ")));
    }
    if !disputed.is_empty() {
        note.push_str(&format!(
            "; leaves {} unset (the HelmOps wanting copies there disagree)",
            disputed.join(", ")
        ));
    }
    note
}

/// `reason` with a note appended (`; note`).
fn with_note(reason: String, note: Option<String>) -> String {
    match note {
        Some(n) => format!("{reason}; {n}"),
        None => reason,
    }
}

fn write_error(what: &'static str, e: &kube::Error) -> PluginError {
    PluginError::Write {
        what,
        changed: api_error::is_conflict(e),
        reason: api_error::describe(e),
    }
}

#[cfg(test)]
mod tests {
    use crate::run::inventory::Selection;

    use super::*;

    fn report(states: &[RowState], unreachable: usize, problems: usize) -> Report {
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
            rejected: Vec::new(),
            summary: Summary {
                unreachable_clusters: unreachable,
                states: states.iter().map(|s| (*s, 1)).collect(),
                ..Summary::default()
            },
            namespaces: BTreeSet::new(),
            helmop_refs: BTreeMap::new(),
            clusters: Vec::new(),
            unreachable: Vec::new(),
            focus: None,
            kinds: ResourceKind::ALL.to_vec(),
        }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(
            report(
                &[
                    RowState::Created,
                    RowState::Unchanged,
                    RowState::FleetManaged,
                    RowState::Kept
                ],
                0,
                0
            )
            .exit_status(),
            ExitStatus::Ok
        );
        assert_eq!(
            report(&[RowState::Created, RowState::Conflict], 0, 0).exit_status(),
            ExitStatus::Invalid
        );
        assert_eq!(
            report(&[RowState::SourceMissing], 0, 0).exit_status(),
            ExitStatus::Invalid
        );
        assert_eq!(
            report(&[RowState::Created], 0, 1).exit_status(),
            ExitStatus::Invalid
        );
        assert_eq!(
            report(&[RowState::Created, RowState::Conflict], 1, 0).exit_status(),
            ExitStatus::Partial
        );
        assert_eq!(
            report(&[RowState::Failed], 0, 0).exit_status(),
            ExitStatus::Partial
        );
    }

    #[test]
    fn uncopyable_kinds_get_a_row_each() {
        use helmop_core::model::{BundleTarget, DownstreamResource, HelmOp, HelmOpSpec};
        let spec = HelmOpSpec {
            downstream_resources: Some(vec![
                DownstreamResource::new("Service", "web"),
                DownstreamResource::new("secret", "db"),
            ]),
            targets: Some(vec![BundleTarget {
                downstream_resources: Some(vec![
                    DownstreamResource::new("service", "web"),
                    DownstreamResource::new("", "blank"),
                ]),
                ..BundleTarget::default()
            }]),
            ..HelmOpSpec::default()
        };
        let inv = Inventory {
            helmops: vec![HelmOp::new("team", "app", spec)],
            ..Inventory::empty(Selection::All)
        };
        let rows = uncopyable_rows(&inv);
        let got: Vec<(&str, &str, &str)> = rows
            .iter()
            .map(|r| (r.kind.as_str(), r.name.as_str(), r.state.as_str()))
            .collect();
        assert_eq!(
            got,
            [("Service", "web", "Invalid"), ("", "blank", "Invalid")]
        );
        assert_eq!(rows[0].helmops, ["team/app"]);
        assert!(rows[0].reason.contains("only Secret and ConfigMap"));
        let mut r = report(&[RowState::Created, RowState::Invalid], 0, 0);
        r.rows = rows;
        assert_eq!(r.exit_status(), ExitStatus::Invalid);
    }
}
