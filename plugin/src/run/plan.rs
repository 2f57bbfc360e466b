//! Planning one downstream cluster, and the rows the cluster-facing runs report, shared by
//! [`propagate`](super::propagate), [`status`](super::status) and [`prune`](super::prune): observe a
//! cluster and plan it with the core planner ([`observe_and_plan`]), the row of an action
//! ([`row`]), the rows of a cluster that could not be worked on, of entries helmop cannot copy and
//! of HelmOps whose targets cannot be evaluated, and the upstream hash key in use ([`load_key`]).

use std::collections::{BTreeMap, BTreeSet};

use helmop_core::hash::HashKey;
use helmop_core::plan::{
    Action, ActionKind, HeldCopy, HelmOpKey, HoldReason, Holds, Mode, PlanInput,
    migrate_upstream_ids, plan, refine, take_sources,
};
use helmop_core::resource::ResourceRef;
use helmop_core::state::RowState;
use helmop_core::targeting::namespace_gate::{NamespaceFacts, namespace_allowed};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::cluster::api_error;
use crate::cluster::clusters::Downstream;
use crate::cluster::context::Ctx;
use crate::error::PluginError;
use crate::output::report::Row;
use crate::run::hash_key::{self, KeyOrigin};
use crate::run::inventory::{Inventory, Problem, key_of};
use crate::run::observe::{self, Observation};
use crate::run::sources::Sources;

/// Rows for the copies wanted on a cluster that could not be worked on (one row for the
/// cluster when none are wanted there, so it is never silently skipped).
pub fn unreachable_rows(inv: &Inventory, downstream: &Downstream, reason: &str) -> Vec<Row> {
    let mut by_place: BTreeMap<(String, ResourceRef), BTreeSet<String>> = BTreeMap::new();
    for d in inv.desired_on(&downstream.key) {
        by_place
            .entry((d.namespace.clone(), d.resource.clone()))
            .or_default()
            .insert(d.helmop.to_string());
    }
    if by_place.is_empty() {
        return vec![Row::about(
            downstream.display(),
            "",
            RowState::Unreachable,
            reason.to_string(),
        )];
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
            state: RowState::Unreachable,
            reason: reason.to_string(),
            in_sync: None,
            fleet_copy: None,
            hold: None,
        })
        .collect()
}

/// The places (namespace, resource) where copies of the run's kinds are wanted on a cluster.
pub fn wanted_places(inv: &Inventory, cluster: &str) -> BTreeSet<(String, ResourceRef)> {
    inv.desired_on(cluster)
        .map(|d| (d.namespace.clone(), d.resource.clone()))
        .collect()
}

/// Observes a cluster and plans it with the core planner. `--adopt` never applies to a
/// registration whose identity is unknown: it may be the management cluster, whose sources are
/// never taken over. `from_kept`: a watcher's kept listings stand in for list requests where they
/// fit ([`crate::cluster::kept_listings`]).
pub async fn observe_and_plan(
    ctx: &Ctx,
    inv: &Inventory,
    sources: &Sources,
    downstream: &Downstream,
    client: &kube::Client,
    adopt: bool,
    from_kept: bool,
) -> Result<(Observation, Vec<Action>), PluginError> {
    let adopt = adopt && downstream.identity.is_some();
    let cluster = downstream.key.as_str();
    let key = sources.key.as_ref();
    let mut obs = observe_cluster(ctx, inv, cluster, client, key, adopt, from_kept).await?;
    // Copies marked with an earlier id of this upstream are ours (docs/cluster-identity.md).
    migrate_upstream_ids(
        &mut obs.copies,
        &ctx.upstream_id,
        &ctx.upstream_aliases,
        &sources.plan,
    );
    let actions = plan_observed(ctx, inv, sources, downstream, &obs, adopt);
    Ok((obs, actions))
}

/// Lists this upstream's copies on a cluster and what stands where copies are wanted; with the
/// upstream key, also hashes the live content of its copies there in memory (drift,
/// [`observe::observe`]). `from_kept` as for [`observe_and_plan`].
pub async fn observe_cluster(
    ctx: &Ctx,
    inv: &Inventory,
    cluster: &str,
    client: &kube::Client,
    key: Option<&HashKey>,
    adopt: bool,
    from_kept: bool,
) -> Result<Observation, PluginError> {
    let mut upstream_ids = vec![ctx.upstream_id.clone()];
    upstream_ids.extend(ctx.upstream_aliases.iter().cloned());
    let places = wanted_places(inv, cluster);
    let looking = observe::Looking {
        places: &places,
        upstream_ids: &upstream_ids,
        key,
        adopt,
        kept: ctx.reads.as_deref().map(|r| r.hashes()),
        kinds: &inv.kinds,
        listings: ctx.reads.as_deref().map(|r| r.listings()),
        from_kept,
    };
    let mut obs = observe::observe(client, cluster, &looking)
        .await
        .map_err(|e| PluginError::ListCopies {
            reason: api_error::describe(&e),
        })?;
    for namespace in gated_namespaces(inv, cluster) {
        let facts = observe::namespace_facts(client, &namespace)
            .await
            .map_err(|e| PluginError::ListCopies {
                reason: format!(
                    "reading namespace {namespace} (allowedTargetNamespaceSelector): {}",
                    api_error::describe(&e)
                ),
            })?;
        obs.gated.insert(namespace, facts);
    }
    Ok(obs)
}

/// The selectors of the HelmOps that set `allowedTargetNamespaceSelector`.
fn namespace_selectors(inv: &Inventory) -> BTreeMap<HelmOpKey, &LabelSelector> {
    inv.helmops
        .iter()
        .filter_map(|h| {
            Some((
                key_of(h)?,
                h.spec.allowed_target_namespace_selector.as_ref()?,
            ))
        })
        .collect()
}

/// The destination namespaces on `cluster` of HelmOps that set
/// `allowedTargetNamespaceSelector` (at most one per HelmOp and cluster).
fn gated_namespaces(inv: &Inventory, cluster: &str) -> BTreeSet<String> {
    let selectors = namespace_selectors(inv);
    inv.desired_on(cluster)
        .filter(|d| selectors.contains_key(&d.helmop))
        .map(|d| d.namespace.clone())
        .collect()
}

/// Holds for the HelmOps Fleet's agent would not copy for on `cluster`: the destination
/// namespace is missing or does not match their `allowedTargetNamespaceSelector`.
fn namespace_holds(inv: &Inventory, cluster: &str, obs: &Observation) -> Holds {
    let mut holds = inv.holds.clone();
    let selectors = namespace_selectors(inv);
    for d in inv.desired_on(cluster) {
        let Some(selector) = selectors.get(&d.helmop) else {
            continue;
        };
        let facts = obs
            .gated
            .get(&d.namespace)
            .cloned()
            .unwrap_or(NamespaceFacts::Unreadable);
        if let Err(why) = namespace_allowed(Some(selector), &d.namespace, &facts) {
            holds.placements.insert(
                (cluster.to_string(), d.helmop.clone()),
                HoldReason::NamespaceRefused(why),
            );
        }
    }
    holds
}

/// Plans one cluster with the core planner, then decides how each write can really be done
/// (`refine`: an update Kubernetes refuses becomes a recreate or a conflict), so `--dry-run`
/// and the real run agree. On the upstream cluster itself, places that hold sources are refused
/// first (never written, adopted or pruned).
pub fn plan_observed(
    ctx: &Ctx,
    inv: &Inventory,
    sources: &Sources,
    downstream: &Downstream,
    obs: &Observation,
    adopt: bool,
) -> Vec<Action> {
    let cluster = downstream.key.as_str();
    let mut input = PlanInput {
        upstream_id: ctx.upstream_id.clone(),
        desired: inv.desired_on(cluster).cloned().collect(),
        sources: sources.plan.clone(),
        observed: obs.copies.clone(),
        scope: inv.scope(&ctx.upstream_id, &obs.copies),
        complete: inv.complete(),
        adopt,
        holds: namespace_holds(inv, cluster, obs),
        protected: inv.protected(cluster),
        mode: if inv.target_contexts.is_empty() {
            Mode::Fleet
        } else {
            Mode::Context
        },
    };
    let upstream = ctx.upstream_cluster.as_deref().ok();
    let refused = if upstream.is_some() && downstream.identity.as_deref() == upstream {
        take_sources(&mut input, &inv.named_sources)
    } else {
        Vec::new()
    };
    let mut actions: Vec<Action> = plan(&input)
        .into_iter()
        .map(|a| {
            let source_type = match &a.kind {
                ActionKind::Update { source, .. } => {
                    sources.secret_type(&source.namespace, &source.resource)
                }
                _ => None,
            };
            let live = obs.live(&a.namespace, &a.resource);
            refine(a, live, source_type)
        })
        .collect();
    actions.extend(refused);
    actions
}

/// Whether an action gets a row: a HelmOp Fleet rejects has one row of its own saying why, so
/// only the places where it already has a copy are listed besides.
pub fn reported(action: &Action) -> bool {
    !matches!(
        action.kind,
        ActionKind::Held {
            why: HoldReason::Invalid(_),
            copy: HeldCopy::Absent,
        }
    )
}

/// A row for an action, in `state`. A frozen copy says in `inSync` whether it is current.
pub fn row(downstream: &Downstream, action: &Action, state: RowState, reason: String) -> Row {
    let in_sync = match action.kind {
        ActionKind::Held {
            copy: HeldCopy::Current,
            ..
        } => Some(true),
        ActionKind::Held {
            copy: HeldCopy::Outdated | HeldCopy::Absent,
            ..
        } => Some(false),
        _ => None,
    };
    Row {
        helmops: action.helmops.iter().map(ToString::to_string).collect(),
        cluster: downstream.display(),
        namespace: action.namespace.clone(),
        kind: action.resource.kind.as_str().into(),
        name: action.resource.name.clone(),
        workload: None,
        state,
        reason,
        in_sync,
        fleet_copy: None,
        hold: None,
    }
}

/// The key in use, for callers that hash (status).
pub async fn load_key(ctx: &Ctx, create: bool) -> Result<(HashKey, KeyOrigin), PluginError> {
    hash_key::load(&ctx.upstream, create, || ctx.record_write()).await
}

/// One `Invalid` row per `downstreamResources` entry (root or target) whose kind helmop cannot
/// copy (only Secret and ConfigMap, any case): the entry is skipped, never silently. Fleet's
/// agent fails the whole copy on such an entry.
pub fn uncopyable_rows(inv: &Inventory) -> Vec<Row> {
    let mut rows = Vec::new();
    for helmop in &inv.helmops {
        let Some(key) = crate::run::inventory::key_of(helmop) else {
            continue;
        };
        let spec = &helmop.spec;
        let entries = spec
            .downstream_resources()
            .iter()
            .chain(spec.targets().iter().flat_map(|t| t.downstream_resources()));
        let mut seen = BTreeSet::new();
        for e in entries.filter(|e| e.to_ref().is_none()) {
            if !seen.insert((helmop_core::resource::go_to_lower(&e.kind), e.name.clone())) {
                continue;
            }
            rows.push(Row {
                helmops: vec![key.to_string()],
                cluster: "-".into(),
                namespace: String::new(),
                kind: e.kind.clone(),
                name: e.name.clone(),
                workload: None,
                state: RowState::Invalid,
                reason: format!(
                    "downstreamResources entry {{kind: {:?}, name: {:?}}} is skipped: only Secret and ConfigMap can be copied",
                    e.kind, e.name
                ),
                in_sync: None,
                fleet_copy: None,
                hold: None,
            });
        }
    }
    rows
}

/// Rows for HelmOps whose targets cannot be evaluated.
pub fn problem_rows(problems: &[Problem]) -> Vec<Row> {
    problems
        .iter()
        .map(|p| Row {
            helmops: vec![p.helmop.clone()],
            ..Row::about("-".into(), "", RowState::Invalid, p.message.clone())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::run::inventory::Selection;

    use super::*;

    #[test]
    fn unreachable_clusters_keep_their_rows() {
        let inv = Inventory {
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
            ..Inventory::empty(Selection::All)
        };
        let d1 = Downstream {
            key: "https://d1".into(),
            name: "team/d1".into(),
            identity: None,
            client: Err(PluginError::NoKubeconfigSecret),
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
            name: "team/d2".into(),
            identity: None,
            client: Err(PluginError::NoKubeconfigSecret),
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
