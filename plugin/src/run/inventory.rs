//! Enumeration on the upstream cluster: the selected HelmOps, the downstream clusters, and which
//! copies each HelmOp wants where (core targeting). Any listing error is returned as an error, so
//! nothing downstream is planned from a partial picture; a HelmOp whose targets cannot be
//! evaluated (an invalid selector) is a [`Problem`] that marks the enumeration incomplete.
//!
//! Clusters of other namespaces count where Fleet's `BundleNamespaceMapping`s of a HelmOp's
//! namespace map it (core `mapping`): the mappings are listed with the Clusters, Namespaces only
//! when a mapping can matter, and in one namespace the Clusters and ClusterGroups of every
//! namespace its mappings select. A copy on a Cluster reached through a mapping is wanted exactly
//! while the mapping still selects the HelmOp and the Cluster's namespace; a namespace-scoped run
//! no longer visits a namespace no mapping selects, so only `-A` (which visits every Cluster)
//! sees the copies there as orphans.
//!
//! Wants are never scoped (docs/cluster-identity.md): for `prune`, every HelmOp of the
//! namespace is enumerated whatever HELMOP names (only the deletion set is scoped). Each
//! registration (Fleet Cluster, context) is planned with its own wants only; what other
//! registrations that may reach the same cluster want ([`Inventory::protected`]: the same claimed
//! identity, or an unknown one; with `--target-context`, the Fleet Clusters too) only protects
//! copies from being released, never makes a write.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;

use helmop_core::mapping::Mappings;
use helmop_core::model::{BundleNamespaceMapping, Cluster, ClusterGroup, HelmOp, Policy};
use helmop_core::names;
use helmop_core::plan::{
    DesiredCopy, HelmOpKey, HoldReason, Holds, ObservedCopy, OwnerRef, Scope, parse_owners,
};
use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_core::sharding::Shard;
use helmop_core::targeting::{
    Matcher, NamespaceMetadata, TargetMatch, cluster_helm, cluster_options,
    combine_namespace_metadata, helm_values, namespace_metadata, never_deployed_to, partitions,
};
use helmop_core::validate::fleet::{
    AfterRejection, FleetFacts, after_rejection, helm_secret_to_check, rejection, spec_rejection,
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde::Serialize;

use crate::cluster::api_error;
use crate::cluster::clusters::{self, Downstream, Limits, may_be_same};
use crate::cluster::context::Ctx;
use crate::error::PluginError;
use crate::run::by_cluster::ByCluster;

/// Which HelmOps a command works on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// `HELMOP` (in `-n`/the context's namespace).
    One { namespace: String, name: String },
    /// Every HelmOp of one namespace (no name, no `-A`).
    Namespace(String),
    /// `-A`.
    All,
}

impl Selection {
    /// From a command line: `name` and `-A` are exclusive (clap enforces it).
    pub fn new(name: Option<&str>, all_namespaces: bool, namespace: &str) -> Selection {
        match (name, all_namespaces) {
            (_, true) => Selection::All,
            (Some(name), false) => Selection::One {
                namespace: namespace.to_string(),
                name: name.to_string(),
            },
            (None, false) => Selection::Namespace(namespace.to_string()),
        }
    }

    fn namespace(&self) -> Option<&str> {
        match self {
            Selection::One { namespace, .. } | Selection::Namespace(namespace) => Some(namespace),
            Selection::All => None,
        }
    }
}

/// A HelmOp whose targets could not be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub helmop: String,
    pub message: String,
}

/// The clusters [`Inventory::narrow`] left out, each with its place in the enumeration.
#[derive(Debug, Default)]
pub struct Parked(Vec<(usize, Downstream)>);

/// What the upstream cluster says should exist downstream.
#[derive(Debug)]
pub struct Inventory {
    pub selection: Selection,
    /// Which of the selected HelmOps this run handles; the others are in [`Inventory::elsewhere`].
    pub shard: Shard,
    pub helmops: Vec<HelmOp>,
    pub downstreams: Vec<Downstream>,
    pub desired: Vec<DesiredCopy>,
    pub problems: Vec<Problem>,
    /// Paused Clusters (by downstream key) and HelmOps, and HelmOps Fleet's controller rejects
    /// with no Bundle that still delivers:
    /// their copies are frozen (docs/fleet-parity.md).
    pub holds: Holds,
    /// The HelmOps Fleet's controller rejects, with the reason.
    pub rejected: Vec<Problem>,
    /// The identity every registration of the run claims, by plan key (`None`: unknown), served
    /// or not (the Fleet Clusters of a `--target-context` run).
    pub identities: BTreeMap<String, Option<String>>,
    /// What registrations this run does not serve want (the Fleet Clusters of a
    /// `--target-context` run): protection only, like [`Inventory::protected`].
    pub unserved: Vec<DesiredCopy>,
    /// `--target-context` (empty: the downstreams are Fleet Clusters).
    pub target_contexts: Vec<String>,
    /// The HelmOps listed for the selection that another shard handles ([`Shard`]): never
    /// spoken for here, so their ownership of a copy is left as it is.
    pub elsewhere: BTreeSet<HelmOpKey>,
    /// `(namespace, name)` of every Fleet Cluster's kubeconfig Secret the run read (a change to
    /// one is never a mere source edit: [`crate::run::focus`]).
    pub kubeconfig_secrets: BTreeSet<(String, String)>,
    /// `(namespace, resource)` of every source any HelmOp names, whatever the selection and the
    /// targets: never adopted on the management cluster (set by `propagate --adopt`, see
    /// [`named_sources`]).
    pub named_sources: Vec<(String, ResourceRef)>,
    /// The kinds of copies the run works on: every kind, but in a watcher's run after edits of
    /// sources of one kind ([`crate::run::focus::Focus::kinds`]). What a cluster is planned for
    /// ([`Inventory::desired_on`], [`Inventory::protected`]) leaves the other kinds out, as the
    /// observation of the cluster does.
    pub kinds: Vec<ResourceKind>,
    /// `desired` and `unserved` by cluster, built on first use: both are set by the enumeration
    /// and never changed after it.
    pub(crate) by_cluster: OnceLock<ByCluster>,
}

impl Inventory {
    /// The identity the registration `key` claims; `None` when unknown, or for a registration
    /// this enumeration did not see (one registered since).
    pub fn identity_of(&self, key: &str) -> Option<&str> {
        self.identities.get(key).and_then(|i| i.as_deref())
    }

    /// Whether registrations `a` and `b` may reach one cluster ([`may_be_same`]).
    pub fn may_reach_one(&self, a: &str, b: &str) -> bool {
        a == b || may_be_same(self.identity_of(a), self.identity_of(b))
    }

    /// What other registrations that may reach the cluster of `key` want, keyed `key`: never
    /// released there, never written through `key`'s credentials (core `PlanInput::protected`).
    /// Of the run's [`Inventory::kinds`] only.
    pub fn protected(&self, key: &str) -> Vec<DesiredCopy> {
        let own = self.identity_of(key);
        let as_own = |d: &DesiredCopy| DesiredCopy {
            cluster: key.to_string(),
            ..d.clone()
        };
        let index = self.by_cluster();
        let wants: Vec<&DesiredCopy> = match index.may_reach(key, own) {
            // An unknown identity may be any cluster: every other registration's wants.
            None => self
                .desired
                .iter()
                .chain(&self.unserved)
                .filter(|d| d.cluster != key)
                .collect(),
            Some(keys) => {
                let (desired, unserved) = index.positions(&keys);
                desired
                    .iter()
                    .filter_map(|&i| self.desired.get(i))
                    .chain(unserved.iter().filter_map(|&i| self.unserved.get(i)))
                    .collect()
            }
        };
        wants
            .into_iter()
            .filter(|d| self.kinds.contains(&d.resource.kind))
            .map(as_own)
            .collect()
    }

    /// The wants on `cluster` (plan key) of the run's [`Inventory::kinds`], in enumeration order.
    pub fn desired_on<'a>(&'a self, cluster: &'a str) -> impl Iterator<Item = &'a DesiredCopy> {
        self.every_kind_on(cluster)
            .filter(|d| self.kinds.contains(&d.resource.kind))
    }

    /// The wants on `cluster` (plan key) of every kind, whatever the run works on.
    fn every_kind_on<'a>(&'a self, cluster: &'a str) -> impl Iterator<Item = &'a DesiredCopy> {
        self.by_cluster()
            .desired(cluster)
            .iter()
            .filter_map(|&i| self.desired.get(i))
            .filter(move |d| d.cluster == cluster)
    }

    fn by_cluster(&self) -> &ByCluster {
        self.by_cluster
            .get_or_init(|| ByCluster::new(&self.desired, &self.unserved, |k| self.identity_of(k)))
    }

    /// Leaves out of [`Inventory::downstreams`] the clusters not in `covered` (`None`: none),
    /// for a run over some clusters; [`Inventory::widen`] puts them back.
    pub fn narrow(&mut self, covered: Option<&BTreeSet<String>>) -> Parked {
        let Some(covered) = covered else {
            return Parked::default();
        };
        let mut parked = Parked::default();
        for (i, d) in std::mem::take(&mut self.downstreams)
            .into_iter()
            .enumerate()
        {
            if covered.contains(&d.key) {
                self.downstreams.push(d);
            } else {
                parked.0.push((i, d));
            }
        }
        parked
    }

    /// This inventory as [`enumerate`] made it, after a run that narrowed it: every cluster in
    /// the enumeration's order, every kind, no `--adopt` exclusions.
    pub fn widen(mut self, parked: Parked) -> Inventory {
        let covered = std::mem::take(&mut self.downstreams);
        let total = covered.len() + parked.0.len();
        let mut covered = covered.into_iter();
        let mut parked = parked.0.into_iter().peekable();
        self.downstreams = (0..total)
            .filter_map(|i| match parked.next_if(|(at, _)| *at == i) {
                Some((_, d)) => Some(d),
                None => covered.next(),
            })
            .collect();
        self.kinds = ResourceKind::ALL.to_vec();
        self.named_sources = Vec::new();
        self
    }

    /// HelmOps, Clusters, ClusterGroups and every HelmOp's targets were all enumerated.
    /// (Listing errors never get this far: [`enumerate`] fails instead.)
    pub fn complete(&self) -> bool {
        self.problems.is_empty()
    }

    /// Namespaces of the selected HelmOps (where their sources live).
    pub fn helmop_namespaces(&self) -> BTreeSet<String> {
        self.helmops
            .iter()
            .filter_map(|h| h.metadata.namespace.clone())
            .collect()
    }

    /// Labels and annotations `namespace` gets on `cluster` when helmop creates it: those of
    /// every HelmOp wanting a copy there, in `namespace/name` order, with the keys they
    /// disagree on left unset and named in the second value (docs/fleet-parity.md).
    pub fn namespace_metadata(
        &self,
        cluster: &str,
        namespace: &str,
    ) -> (NamespaceMetadata, Vec<String>) {
        // Every kind's: a namespace made by a run over one kind is the one a full run makes.
        let wanting: BTreeSet<&HelmOpKey> = self
            .every_kind_on(cluster)
            .filter(|d| d.namespace == namespace)
            .map(|d| &d.helmop)
            .collect();
        let metas: Vec<NamespaceMetadata> = wanting
            .into_iter()
            .filter_map(|k| self.helmops.iter().find(|h| key_of(h).as_ref() == Some(k)))
            .map(namespace_metadata)
            .collect();
        combine_namespace_metadata(&metas)
    }

    /// Whose ownership a run may release on a cluster where `observed` was found. For one
    /// namespace this includes owners in that namespace whose HelmOp no longer exists (every
    /// HelmOp there was listed, so they are known to be gone). A shard speaks for its own
    /// HelmOps and for the owners whose HelmOp no longer exists in its selection (any shard may
    /// let go of those: nobody wants them, and the shard that had them may be down), never for
    /// a HelmOp another shard handles (the HelmOp may have moved there a moment ago).
    pub fn scope(&self, upstream_id: &str, observed: &[ObservedCopy]) -> Scope {
        let listed = || -> BTreeSet<HelmOpKey> { self.helmops.iter().filter_map(key_of).collect() };
        let gone_owners = |namespace: Option<&str>| -> BTreeSet<HelmOpKey> {
            let mut keys = BTreeSet::new();
            for o in observed {
                let Some(owners) = o.annotations.get(names::ANN_OWNERS) else {
                    continue;
                };
                for entry in parse_owners(owners) {
                    if let Some(owner) = OwnerRef::parse(&entry)
                        && owner.upstream_id == upstream_id
                        && namespace.is_none_or(|ns| owner.namespace == ns)
                    {
                        let key = HelmOpKey::new(&owner.namespace, &owner.name);
                        if !self.elsewhere.contains(&key) {
                            keys.insert(key);
                        }
                    }
                }
            }
            keys
        };
        match (&self.selection, self.shard_is_every()) {
            (Selection::All, true) => Scope::All,
            (Selection::All, false) => {
                Scope::HelmOps(listed().into_iter().chain(gone_owners(None)).collect())
            }
            (Selection::One { namespace, name }, _) => {
                let key = HelmOpKey::new(namespace, name);
                Scope::HelmOps(if self.elsewhere.contains(&key) {
                    BTreeSet::new()
                } else {
                    BTreeSet::from([key])
                })
            }
            (Selection::Namespace(ns), _) => {
                Scope::HelmOps(listed().into_iter().chain(gone_owners(Some(ns))).collect())
            }
        }
    }

    /// Whether this run handles every HelmOp it lists (no shard filtered any out).
    fn shard_is_every(&self) -> bool {
        self.shard == Shard::Every
    }
}

#[cfg(test)]
impl Inventory {
    /// An inventory of nothing for `selection`; tests set what they need on top.
    pub fn empty(selection: Selection) -> Inventory {
        Inventory {
            selection,
            shard: Shard::Every,
            helmops: Vec::new(),
            downstreams: Vec::new(),
            desired: Vec::new(),
            problems: Vec::new(),
            holds: Holds::default(),
            rejected: Vec::new(),
            identities: BTreeMap::new(),
            unserved: Vec::new(),
            target_contexts: Vec::new(),
            named_sources: Vec::new(),
            elsewhere: BTreeSet::new(),
            kubeconfig_secrets: BTreeSet::new(),
            kinds: ResourceKind::ALL.to_vec(),
            by_cluster: OnceLock::new(),
        }
    }
}

/// For tests: HelmOp `team/HELMOP` wants its Secret `name` copied to namespace `apps` of `cluster`.
#[cfg(test)]
pub fn wanted_secret(cluster: &str, helmop: &str, name: &str) -> DesiredCopy {
    DesiredCopy {
        cluster: cluster.into(),
        namespace: "apps".into(),
        helmop: HelmOpKey::new("team", helmop),
        resource: helmop_core::resource::ResourceRef::secret(name),
        keep: false,
    }
}

/// `namespace/name` of a HelmOp.
pub fn key_of(h: &HelmOp) -> Option<HelmOpKey> {
    Some(HelmOpKey::new(
        h.metadata.namespace.as_deref()?,
        h.metadata.name.as_deref()?,
    ))
}

/// Lists the selected HelmOps and the clusters, and computes the desired copies.
/// `for_prune`: the wants of every HelmOp of the namespace count, whatever HELMOP names (and a
/// named HelmOp that no longer exists is no error); with `--target-context`, failing to list
/// the Fleet Clusters aborts instead of planning without their wants.
pub async fn enumerate(
    ctx: &Ctx,
    selection: &Selection,
    shard: &Shard,
    target_contexts: &[String],
    for_prune: bool,
    limits: Limits,
) -> Result<Inventory, PluginError> {
    // Clients of clusters this enumeration no longer reaches go with their connections.
    ctx.clients.sweep();
    let mut helmops = list_helmops(ctx, &listing(selection, for_prune), for_prune).await?;
    let elsewhere = other_shards(&mut helmops, shard);
    let (mut holds, rejected) = helmop_holds(ctx, &mut helmops).await?;
    let mut fleet = if target_contexts.is_empty() {
        Some(list_fleet(ctx, selection.namespace(), &helmops, false).await?)
    } else {
        match list_fleet(ctx, selection.namespace(), &helmops, true).await {
            Ok(fleet) => Some(fleet),
            Err(e) if !for_prune => {
                tracing::warn!("{e}; planning without the wants of Fleet Clusters");
                None
            }
            Err(e) => return Err(e),
        }
    };
    // A registration's plan key is its Cluster's name: known before anything is resolved, so the
    // wants are computed once, and a shard resolves only the Clusters they name.
    let mut keys: Vec<String> = fleet
        .iter()
        .flat_map(|f| &f.clusters)
        .map(|c| clusters::fleet_key(&clusters::cluster_name(c)))
        .collect();
    let (fleet_desired, mut problems) = fleet
        .as_ref()
        .map(|fleet| desired_fleet(&helmops, fleet, &keys))
        .unwrap_or_default();
    if let Shard::Id(_) = shard
        && let Some(fleet) = fleet.as_mut()
    {
        keys = within_reach(fleet, keys, &fleet_desired);
    }
    let registered = match &fleet {
        Some(fleet) => clusters::resolve_fleet(ctx, &fleet.clusters, limits).await,
        None => Vec::new(),
    };
    let kubeconfig_secrets = fleet
        .iter()
        .flat_map(|f| &f.clusters)
        .filter_map(|c| clusters::kubeconfig_secret_of(ctx, c).ok())
        .collect();
    let mut identities: BTreeMap<String, Option<String>> = registered
        .iter()
        .map(|d| (d.key.clone(), d.identity.clone()))
        .collect();
    if let Some(fleet) = &fleet {
        hold_clusters(&mut holds, &helmops, fleet, &keys);
        for cluster in &fleet.clusters {
            if let Some(reason) = never_deployed_to(cluster) {
                tracing::warn!(cluster = %clusters::cluster_name(cluster), "no copies there: {reason}");
            }
        }
    }
    let (downstreams, desired, unserved) = if target_contexts.is_empty() {
        (registered, fleet_desired, Vec::new())
    } else {
        let contexts = clusters::resolve_contexts(ctx, target_contexts, limits).await;
        identities.extend(contexts.iter().map(|d| (d.key.clone(), d.identity.clone())));
        let (desired, context_problems) = desired_contexts(&helmops, &contexts);
        for p in context_problems {
            if !problems.iter().any(|q| q.helmop == p.helmop) {
                problems.push(p);
            }
        }
        (contexts, desired, fleet_desired)
    };
    Ok(Inventory {
        selection: selection.clone(),
        shard: shard.clone(),
        helmops,
        downstreams,
        desired,
        problems,
        holds,
        rejected,
        identities,
        unserved,
        target_contexts: target_contexts.to_vec(),
        named_sources: Vec::new(),
        elsewhere,
        kubeconfig_secrets,
        kinds: ResourceKind::ALL.to_vec(),
        by_cluster: OnceLock::new(),
    })
}

/// Keeps only the Clusters where some of `helmops` want a copy now. A shard handles a share of a
/// large fleet's HelmOps; reading every Cluster's kubeconfig, asking every cluster who it is and
/// looking at every cluster's copies would cost each shard the whole fleet. What it gives up: the
/// `Orphaned` rows of its HelmOps' copies on clusters they no longer target (`propagate` only
/// reports those; `status` and `prune`, which see every HelmOp, still find them). The unsharded
/// watcher keeps visiting every Cluster.
/// `keys[i]` is the plan key of `fleet.clusters[i]`; returns the keys of the Clusters kept.
fn within_reach(
    fleet: &mut FleetObjects,
    keys: Vec<String>,
    wanted: &[DesiredCopy],
) -> Vec<String> {
    let wanted: BTreeSet<&str> = wanted.iter().map(|d| d.cluster.as_str()).collect();
    let (clusters, keys): (Vec<Cluster>, Vec<String>) = std::mem::take(&mut fleet.clusters)
        .into_iter()
        .zip(keys)
        .filter(|(_, key)| wanted.contains(key.as_str()))
        .unzip();
    fleet.clusters = clusters;
    keys
}

/// Keeps the HelmOps `shard` handles in `helmops`; returns the keys of the others. Listing
/// every HelmOp of the selection and filtering here (rather than with a label selector) is what
/// tells a HelmOp of another shard from one that is gone ([`Inventory::scope`]).
fn other_shards(helmops: &mut Vec<HelmOp>, shard: &Shard) -> BTreeSet<HelmOpKey> {
    let mut elsewhere = BTreeSet::new();
    helmops.retain(|h| {
        let handled = shard.handles(h.metadata.labels.as_ref());
        if !handled && let Some(key) = key_of(h) {
            elsewhere.insert(key);
        }
        handled
    });
    elsewhere
}

/// Every source every HelmOp of the upstream cluster names (all namespaces, every entry of the
/// root options and of the targets, targeted now or not).
pub async fn named_sources(ctx: &Ctx) -> Result<Vec<(String, ResourceRef)>, PluginError> {
    let helmops = list_helmops(ctx, &Selection::All, false).await?;
    let mut out: Vec<(String, ResourceRef)> = helmops
        .iter()
        .flat_map(|h| {
            let ns = h.metadata.namespace.clone().unwrap_or_default();
            h.named_sources().into_iter().map(move |r| (ns.clone(), r))
        })
        .collect();
    out.sort();
    out.dedup();
    Ok(out)
}

/// What `selection` lists: for prune, every HelmOp of the namespace (the wants are never scoped).
fn listing(selection: &Selection, for_prune: bool) -> Selection {
    match selection {
        Selection::One { namespace, .. } if for_prune => Selection::Namespace(namespace.clone()),
        other => other.clone(),
    }
}

impl Inventory {
    /// What the HelmOps want now, every registration's (served or not), for prune's last look
    /// before it deletes: the HelmOps and Fleet's objects are listed again; nothing connects
    /// again, so a Cluster registered since has an unknown identity and what it wants counts on
    /// every cluster ([`Inventory::may_reach_one`]). A HelmOp created or retargeted after the
    /// first listing keeps its copies.
    pub async fn wants_now(&self, ctx: &Ctx) -> Result<Vec<DesiredCopy>, PluginError> {
        let helmops = list_helmops(ctx, &listing(&self.selection, true), true).await?;
        let contexts = !self.target_contexts.is_empty();
        let fleet = list_fleet(ctx, self.selection.namespace(), &helmops, contexts).await?;
        let keys: Vec<String> = fleet
            .clusters
            .iter()
            .map(|c| clusters::fleet_key(&clusters::cluster_name(c)))
            .collect();
        let (mut desired, mut problems) = desired_fleet(&helmops, &fleet, &keys);
        if contexts {
            let (wanted, context_problems) = desired_contexts(&helmops, &self.downstreams);
            desired.extend(wanted);
            problems.extend(context_problems);
        }
        if let Some(p) = problems.first() {
            return Err(PluginError::Upstream(format!(
                "the targets of {} cannot be evaluated now: {}",
                p.helmop, p.message
            )));
        }
        Ok(desired)
    }
}

/// Records the held Clusters: paused, or off their schedule ([`HoldReason::of_cluster`]). Fleet
/// stops every BundleDeployment on such a Cluster, so it freezes the copies of the HelmOps of
/// its own namespace and of every namespace whose BundleNamespaceMappings reach it. (Holds are
/// per namespace: another HelmOp of such a namespace that reaches the same physical cluster
/// through an unheld Cluster is frozen there too.)
fn hold_clusters(holds: &mut Holds, helmops: &[HelmOp], fleet: &FleetObjects, keys: &[String]) {
    let mappings = Mappings::new(&fleet.mappings);
    let reach: Vec<(&str, BTreeSet<String>)> = helmops
        .iter()
        .filter_map(|h| {
            let ns = h.metadata.namespace.as_deref()?;
            Some((ns, mappings.candidate_namespaces(h, &fleet.namespaces)))
        })
        .collect();
    for (cluster, key) in fleet.clusters.iter().zip(keys) {
        let (Some(why), Some(ns)) = (HoldReason::of_cluster(cluster), &cluster.metadata.namespace)
        else {
            continue;
        };
        holds.hold_cluster(key, ns, why.clone());
        for (helmop_ns, candidates) in &reach {
            if candidates.contains(ns) {
                holds.hold_cluster(key, helmop_ns, why.clone());
            }
        }
    }
}

/// Fleet's Bundle, read dynamically: only `spec.helmOpOptions` matters here.
fn bundle_api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("fleet.cattle.io", "v1alpha1", "Bundle"),
        "bundles",
    )
}

/// The holds of the HelmOps themselves: Fleet's controller rejects a HelmOp (reported
/// `Invalid`, and also returned as a [`Problem`] for its row) or it is paused. Looks up what
/// Fleet's checks need (the Policies of each namespace, the `helmSecretName` Secret, a Bundle
/// of the same name); failing to read any of it fails the enumeration.
///
/// A rejected HelmOp whose previous Bundle stays deliverable is planned from that Bundle's
/// spec (its spec is replaced here), as Fleet's Bundle controller keeps serving it; only one
/// without a Bundle, or whose Bundle is refused too, is frozen.
async fn helmop_holds(
    ctx: &Ctx,
    helmops: &mut [HelmOp],
) -> Result<(Holds, Vec<Problem>), PluginError> {
    let mut holds = Holds::default();
    let mut rejected = Vec::new();
    let mut policies: BTreeMap<String, Vec<Policy>> = BTreeMap::new();
    for helmop in helmops.iter_mut() {
        let Some(key) = key_of(helmop) else { continue };
        if !policies.contains_key(&key.namespace) {
            let listed = match list(ctx, Some(&key.namespace), "Policies").await {
                Err(ListError::NoSuchKind(_)) => Vec::new(),
                other => other?,
            };
            policies.insert(key.namespace.clone(), listed);
        }
        let in_ns = policies.get(&key.namespace).map_or(&[][..], Vec::as_slice);
        let bundle = read_bundle(ctx, &key).await?;
        let reason = match spec_rejection(helmop) {
            Some(reason) => Some(reason),
            None => fleet_rejection(ctx, helmop, &key, in_ns, bundle.as_ref()).await?,
        };
        let Some(reason) = reason else {
            if helmop.spec.paused() {
                holds.helmops.insert(key, HoldReason::HelmOpPaused);
            }
            continue;
        };
        let message = match after_rejection(bundle.as_ref(), in_ns) {
            AfterRejection::Follow(spec) => {
                tracing::info!(helmop = %key, %reason, "Fleet rejects the HelmOp; its previous Bundle still delivers");
                helmop.spec = *spec;
                if helmop.spec.paused() {
                    holds.helmops.insert(key.clone(), HoldReason::HelmOpPaused);
                }
                format!(
                    "Fleet rejects this HelmOp: {reason}; Fleet keeps its previous Bundle, so its copies follow that Bundle (its targets and downstream resources), not this spec"
                )
            }
            AfterRejection::NoBundle => {
                tracing::info!(helmop = %key, %reason, "Fleet rejects the HelmOp; no Bundle, its copies are frozen");
                holds
                    .helmops
                    .insert(key.clone(), HoldReason::Invalid(reason.clone()));
                format!(
                    "Fleet rejects this HelmOp: {reason}; it has no Bundle, so it gets no copies and existing ones are left as they are"
                )
            }
            AfterRejection::Frozen(why) => {
                let reason = format!("{reason}; {why}");
                tracing::info!(helmop = %key, %reason, "Fleet rejects the HelmOp and its Bundle; its copies are frozen");
                holds
                    .helmops
                    .insert(key.clone(), HoldReason::Invalid(reason.clone()));
                format!(
                    "Fleet rejects this HelmOp: {reason}; it gets no copies and existing ones are left as they are"
                )
            }
        };
        rejected.push(Problem {
            helmop: key.to_string(),
            message,
        });
    }
    Ok((holds, rejected))
}

/// The Bundle of the HelmOp's name, as JSON (`None`: absent, or Bundles not served because
/// Fleet is not installed).
async fn read_bundle(ctx: &Ctx, key: &HelmOpKey) -> Result<Option<serde_json::Value>, PluginError> {
    let bundles: Api<DynamicObject> =
        Api::namespaced_with(ctx.upstream.clone(), &key.namespace, &bundle_api_resource());
    match bundles.get_opt(&key.name).await {
        Ok(found) => Ok(found.and_then(|b| serde_json::to_value(b).ok())),
        Err(e) if api_error::is_not_found(&e) => Ok(None),
        Err(e) => Err(api_error::upstream(
            &format!(
                "reading Bundle {key} (Fleet refuses a HelmOp whose name a non-HelmOp Bundle holds, and keeps a rejected HelmOp's Bundle)"
            ),
            &e,
        )),
    }
}

/// Looks up the objects Fleet's checks after `validate()` depend on, then asks core.
async fn fleet_rejection(
    ctx: &Ctx,
    helmop: &HelmOp,
    key: &HelmOpKey,
    policies: &[Policy],
    bundle: Option<&serde_json::Value>,
) -> Result<Option<String>, PluginError> {
    let secret = helm_secret_to_check(helmop, policies);
    let secret_exists = match &secret {
        Some(name) => Api::<Secret>::namespaced(ctx.upstream.clone(), &key.namespace)
            .get_metadata_opt(name)
            .await
            .map_err(|e| {
                api_error::upstream(
                    &format!(
                        "reading helmSecretName Secret {}/{name} of HelmOp {key}",
                        key.namespace
                    ),
                    &e,
                )
            })?
            .is_some(),
        None => true,
    };
    let foreign_bundle = bundle.is_some_and(|b| {
        b.pointer("/spec/helmOpOptions")
            .is_none_or(serde_json::Value::is_null)
    });
    let exists = |name: &str| secret.as_deref() != Some(name) || secret_exists;
    let facts = FleetFacts {
        policies,
        foreign_bundle,
        secret_exists: &exists,
    };
    Ok(rejection(helmop, &facts).map(|r| r.reason))
}

/// What Fleet's targeting reads on the upstream cluster.
#[derive(Debug, Default)]
pub struct FleetObjects {
    pub clusters: Vec<Cluster>,
    pub groups: Vec<ClusterGroup>,
    pub mappings: Vec<BundleNamespaceMapping>,
    /// Every Namespace, listed only when a mapping can matter.
    pub namespaces: Vec<Namespace>,
}

/// The Fleet Clusters and ClusterGroups of `namespace` (all for `None`) and of the namespaces
/// the BundleNamespaceMappings there select. With `optional` (`--target-context`,
/// where Fleet need not be installed) a kind that is not served means none. A
/// BundleNamespaceMapping kind that is not served always means no mappings: none can exist.
async fn list_fleet(
    ctx: &Ctx,
    namespace: Option<&str>,
    helmops: &[HelmOp],
    optional: bool,
) -> Result<FleetObjects, PluginError> {
    // A watcher's Cluster watch keeps them (crate::cluster::cluster_store).
    let kept = ctx.reads.as_ref().and_then(|r| r.clusters_of(namespace));
    if let Some(kept) = &kept {
        tracing::debug!(
            clusters = kept.len(),
            "Clusters read from the Cluster watch"
        );
    }
    let mut fleet = FleetObjects {
        clusters: match kept {
            Some(clusters) => clusters,
            None => match list(ctx, namespace, "Clusters").await {
                Err(ListError::NoSuchKind(_)) if optional => return Ok(FleetObjects::default()),
                other => other?,
            },
        },
        groups: match list(ctx, namespace, "ClusterGroups").await {
            Err(ListError::NoSuchKind(_)) if optional => Vec::new(),
            other => other?,
        },
        mappings: match list(ctx, namespace, "BundleNamespaceMappings").await {
            Err(ListError::NoSuchKind(_)) => Vec::new(),
            other => other?,
        },
        namespaces: Vec::new(),
    };
    let mappings = Mappings::new(&fleet.mappings);
    for skipped in mappings.skipped() {
        tracing::warn!(
            mapping = %skipped.mapping,
            reason = %skipped.reason,
            "BundleNamespaceMapping ignored: Fleet cannot compile its selector"
        );
    }
    // With `-A` every Cluster and ClusterGroup is listed already; Namespaces matter only to
    // the candidates of mapped HelmOps. In one namespace, the Clusters of every namespace its
    // mappings select are visited, so copies a mapping no longer wants (HelmOp deleted or
    // relabelled) are seen as orphans there too.
    let needed = match namespace {
        None => helmops.iter().any(|h| mappings.maps(h)),
        Some(own) => mappings.any_in(own),
    };
    if !needed {
        return Ok(fleet);
    }
    let api: Api<Namespace> = Api::all(ctx.upstream.clone());
    fleet.namespaces = list_pages(api, "Namespaces", "").await?;
    let Some(own) = namespace else {
        return Ok(fleet);
    };
    let reachable = mappings.reachable_from(own, &fleet.namespaces);
    for ns in &reachable {
        tracing::debug!(namespace = %ns, "listing Clusters of a mapped namespace");
        let clusters: Vec<Cluster> = list(ctx, Some(ns), "Clusters").await?;
        let groups: Vec<ClusterGroup> = list(ctx, Some(ns), "ClusterGroups").await?;
        fleet.clusters.extend(clusters);
        fleet.groups.extend(groups);
    }
    Ok(fleet)
}

/// A listing that failed: the kind is not served (its CRD is not installed), or otherwise.
enum ListError {
    NoSuchKind(PluginError),
    Other(PluginError),
}

impl From<ListError> for PluginError {
    fn from(e: ListError) -> PluginError {
        match e {
            ListError::NoSuchKind(e) | ListError::Other(e) => e,
        }
    }
}

async fn list_helmops(
    ctx: &Ctx,
    selection: &Selection,
    missing_ok: bool,
) -> Result<Vec<HelmOp>, PluginError> {
    match selection {
        Selection::One { namespace, name } => {
            let api: Api<HelmOp> = Api::namespaced(ctx.upstream.clone(), namespace);
            let found = api.get_opt(name).await.map_err(|e| {
                api_error::upstream(&format!("reading HelmOp {namespace}/{name}"), &e)
            })?;
            match found {
                Some(h) => Ok(vec![h]),
                None if missing_ok => Ok(Vec::new()),
                None => Err(PluginError::Upstream(format!(
                    "HelmOp {namespace}/{name} not found"
                ))),
            }
        }
        _ => Ok(list(ctx, selection.namespace(), "HelmOps").await?),
    }
}

/// Every object of a Fleet kind in `namespace` (all namespaces for `None`), page by page.
async fn list<K>(ctx: &Ctx, namespace: Option<&str>, what: &str) -> Result<Vec<K>, ListError>
where
    K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let api: Api<K> = crate::cluster::kube_api::api_in(&ctx.upstream, namespace);
    let where_ = namespace.map_or(" in all namespaces".to_string(), |ns| format!(" in {ns}"));
    list_pages(api, what, &where_).await
}

/// Every object `api` lists, page by page; `what` and `where_` name them in errors.
async fn list_pages<K>(api: Api<K>, what: &str, where_: &str) -> Result<Vec<K>, ListError>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut out = Vec::new();
    let mut params = ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.map_err(|e| {
            let error = api_error::upstream(&format!("listing {what}{where_}"), &e);
            if api_error::is_not_found(&e) && out.is_empty() {
                ListError::NoSuchKind(error)
            } else {
                ListError::Other(error)
            }
        })?;
        let token = page.metadata.continue_.clone().filter(|t| !t.is_empty());
        out.extend(page.items);
        match token {
            Some(t) => params = params.continue_token(&t),
            None => return Ok(out),
        }
    }
}

/// Desired copies from Fleet targeting: each HelmOp against the Clusters of its namespace and
/// of the namespaces mapped to it. `keys[i]` is the downstream key of `fleet.clusters[i]`.
pub fn desired_fleet(
    helmops: &[HelmOp],
    fleet: &FleetObjects,
    keys: &[String],
) -> (Vec<DesiredCopy>, Vec<Problem>) {
    let mut desired = Vec::new();
    let mut problems = Vec::new();
    let mappings = Mappings::new(&fleet.mappings);
    for helmop in helmops {
        let Some(key) = key_of(helmop) else { continue };
        let candidates = mappings.candidate_namespaces(helmop, &fleet.namespaces);
        let reached = fleet.clusters.iter().zip(keys).filter(|(cluster, _)| {
            cluster
                .metadata
                .namespace
                .as_ref()
                .is_some_and(|ns| candidates.contains(ns))
                && never_deployed_to(cluster).is_none()
        });
        let mut matched: Vec<(&Cluster, &String, TargetMatch)> = Vec::new();
        let mut matcher = None;
        let mut failed = None;
        for (cluster, cluster_key) in reached {
            // Compiled at the first cluster reached, as before: no cluster, nothing to fail.
            if matcher.is_none() {
                match Matcher::new(helmop) {
                    Ok(m) => matcher = Some(m),
                    Err(e) => {
                        failed = Some(format!("targets cannot be evaluated: {e}"));
                        break;
                    }
                }
            }
            if let Some(m) = &matcher {
                let m = m.match_cluster(cluster, &fleet.groups);
                if m.is_deployed() {
                    matched.push((cluster, cluster_key, m));
                }
            }
        }
        // Fleet preprocesses every targeted cluster's helm values before anything is deployed
        // (builder.go `Targets`): one failure fails the Bundle on every cluster.
        if failed.is_none() {
            failed = matched.iter().find_map(|(cluster, _, m)| {
                let helm = cluster_helm(helmop, m)?;
                match helm_values::preprocess(cluster, &helm) {
                    helm_values::Outcome::Fails(e) => Some(format!(
                        "Fleet's Bundle controller fails the Bundle on every cluster: cluster {} in namespace {}: {e}",
                        cluster.metadata.name.as_deref().unwrap_or_default(),
                        cluster.metadata.namespace.as_deref().unwrap_or_default()
                    )),
                    // Unknown: outside helmop's evaluator, assumed to render as Fleet would.
                    _ => None,
                }
            });
        }
        let clusters: Vec<&Cluster> = matched.iter().map(|(c, _, _)| *c).collect();
        let gate = match failed {
            Some(message) => Err(message),
            None => partitions::deployable(
                helmop.spec.rollout_strategy.as_ref(),
                &clusters,
                &fleet.groups,
            )
            .map_err(|e| {
                format!("Fleet's Bundle controller fails the Bundle on every cluster: {e}")
            }),
        };
        match gate {
            Err(message) => problems.push(Problem {
                helmop: key.to_string(),
                message,
            }),
            Ok(deploys) => {
                for ((_, cluster_key, m), deploys) in matched.iter().zip(deploys) {
                    if deploys {
                        desired.extend(wants(&key, helmop, m, cluster_key));
                    }
                }
            }
        }
    }
    (desired, problems)
}

/// Desired copies for `--target-context`: every HelmOp targets every context, named like a
/// Cluster without labels: a regular target whose `clusterName` is the context's name selects
/// it (honouring its `doNotDeploy`), else the HelmOp's root options do; customizations
/// (`targetRestrictions`) apply as for a Fleet Cluster.
pub fn desired_contexts(
    helmops: &[HelmOp],
    downstreams: &[Downstream],
) -> (Vec<DesiredCopy>, Vec<Problem>) {
    let mut desired = Vec::new();
    let mut problems = Vec::new();
    for helmop in helmops {
        let Some(key) = key_of(helmop) else { continue };
        let matcher = match Matcher::new(helmop) {
            Ok(m) => m,
            Err(e) => {
                problems.push(Problem {
                    helmop: key.to_string(),
                    message: format!("targets cannot be evaluated: {e}"),
                });
                continue;
            }
        };
        for downstream in downstreams {
            let synthetic = Cluster::new(&key.namespace, &downstream.name, &[]);
            let m = matcher.match_or_root(&synthetic, &[]);
            desired.extend(wants(&key, helmop, &m, &downstream.key));
        }
    }
    (desired, problems)
}

fn wants(key: &HelmOpKey, helmop: &HelmOp, m: &TargetMatch, cluster: &str) -> Vec<DesiredCopy> {
    let Some(options) = cluster_options(helmop, m) else {
        return Vec::new();
    };
    options
        .resources
        .into_iter()
        .map(|resource| DesiredCopy {
            cluster: cluster.to_string(),
            namespace: options.namespace.clone(),
            helmop: key.clone(),
            resource,
            keep: options.keep_resources,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use helmop_core::model::{BundleTarget, ClusterStatus, DownstreamResource, HelmOpSpec};
    use helmop_core::resource::ResourceRef;
    use helmop_core::sharding::Shard;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

    use super::*;

    fn helmop(ns: &str, name: &str, spec: HelmOpSpec) -> HelmOp {
        HelmOp::new(ns, name, spec)
    }

    fn selector(k: &str, v: &str) -> LabelSelector {
        LabelSelector {
            match_labels: Some(BTreeMap::from([(k.to_string(), v.to_string())])),
            ..LabelSelector::default()
        }
    }

    fn summary(desired: &[DesiredCopy]) -> Vec<String> {
        desired
            .iter()
            .map(|d| {
                format!(
                    "{} {} {} {}{}",
                    d.helmop,
                    d.cluster,
                    d.namespace,
                    d.resource,
                    if d.keep { " keep" } else { "" }
                )
            })
            .collect()
    }

    #[test]
    fn fleet_targets_by_label_and_group_with_per_target_resources() {
        let spec = HelmOpSpec {
            default_namespace: Some("apps".into()),
            downstream_resources: Some(vec![DownstreamResource::new("Secret", "db")]),
            targets: Some(vec![
                BundleTarget {
                    cluster_selector: Some(selector("env", "prod")),
                    namespace: Some("prod-apps".into()),
                    downstream_resources: Some(vec![DownstreamResource::new("configmap", "prod")]),
                    keep_resources: Some(true),
                    ..BundleTarget::default()
                },
                BundleTarget {
                    cluster_group: Some("edge".into()),
                    ..BundleTarget::default()
                },
            ]),
            ..HelmOpSpec::default()
        };
        let ops = [helmop("fleet", "app", spec)];
        let clusters = [
            Cluster::new("fleet", "c1", &[("env", "prod")]),
            Cluster::new("fleet", "c2", &[("tier", "edge")]),
            Cluster::new("fleet", "c3", &[]),
            Cluster::new("other", "c4", &[("env", "prod")]),
        ];
        let keys = ["k1", "k2", "k3", "k4"].map(String::from);
        let groups = [ClusterGroup::new(
            "fleet",
            "edge",
            &[],
            Some(selector("tier", "edge")),
        )];
        let fleet = FleetObjects {
            clusters: clusters.to_vec(),
            groups: groups.to_vec(),
            ..FleetObjects::default()
        };
        let (desired, problems) = desired_fleet(&ops, &fleet, &keys);
        assert!(problems.is_empty());
        assert_eq!(
            summary(&desired),
            [
                "fleet/app k1 prod-apps secret/db keep",
                "fleet/app k1 prod-apps configmap/prod keep",
                "fleet/app k2 apps secret/db",
            ]
        );
    }

    #[test]
    fn mapped_namespaces_add_their_clusters_with_their_own_groups() {
        let spec = HelmOpSpec {
            default_namespace: Some("apps".into()),
            downstream_resources: Some(vec![DownstreamResource::new("Secret", "db")]),
            targets: Some(vec![BundleTarget {
                cluster_group: Some("edge".into()),
                ..BundleTarget::default()
            }]),
            labels: Some(BTreeMap::from([("team".to_string(), "web".to_string())])),
            ..HelmOpSpec::default()
        };
        let ops = [helmop("fleet", "app", spec)];
        let edge = || Some(selector("tier", "edge"));
        let namespace = |name: &str, team: &str| Namespace {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                labels: Some(BTreeMap::from([("fleet".to_string(), team.to_string())])),
                ..Default::default()
            },
            ..Namespace::default()
        };
        let mut fleet = FleetObjects {
            clusters: vec![
                Cluster::new("fleet", "c1", &[("tier", "edge")]),
                Cluster::new("mapped", "c2", &[("tier", "edge")]),
                // Mapped, but its namespace has no `edge` group: the HelmOp's does not count.
                Cluster::new("groupless", "c3", &[("tier", "edge")]),
                Cluster::new("unmapped", "c4", &[("tier", "edge")]),
            ],
            groups: vec![
                ClusterGroup::new("fleet", "edge", &[], edge()),
                ClusterGroup::new("mapped", "edge", &[], edge()),
                ClusterGroup::new("unmapped", "edge", &[], edge()),
            ],
            mappings: Vec::new(),
            namespaces: vec![
                namespace("mapped", "yes"),
                namespace("groupless", "yes"),
                namespace("unmapped", "no"),
            ],
        };
        let keys = ["k1", "k2", "k3", "k4"].map(String::from);
        let (desired, _) = desired_fleet(&ops, &fleet, &keys);
        assert_eq!(summary(&desired), ["fleet/app k1 apps secret/db"]);

        // A mapping elsewhere, or without its namespaceSelector, maps nothing.
        fleet.mappings = vec![
            BundleNamespaceMapping::new(
                "unmapped",
                "m",
                Some(LabelSelector::default()),
                Some(LabelSelector::default()),
            ),
            BundleNamespaceMapping::new("fleet", "half", Some(selector("team", "web")), None),
        ];
        let (desired, _) = desired_fleet(&ops, &fleet, &keys);
        assert_eq!(summary(&desired), ["fleet/app k1 apps secret/db"]);

        fleet.mappings.push(BundleNamespaceMapping::new(
            "fleet",
            "m",
            Some(selector("team", "web")),
            Some(selector("fleet", "yes")),
        ));
        let (desired, problems) = desired_fleet(&ops, &fleet, &keys);
        assert!(problems.is_empty());
        assert_eq!(
            summary(&desired),
            ["fleet/app k1 apps secret/db", "fleet/app k2 apps secret/db"]
        );

        // A paused Cluster of a mapped namespace freezes the HelmOp that reaches it through the
        // mapping, as Fleet pauses every BundleDeployment on it; the unmapped one freezes nothing.
        fleet.clusters[1].spec.paused = Some(true);
        fleet.clusters[3].spec.paused = Some(true);
        let mut holds = Holds::default();
        hold_clusters(&mut holds, &ops, &fleet, &keys);
        let app = HelmOpKey::new("fleet", "app");
        assert_eq!(holds.reason("k2", &app), Some(HoldReason::ClusterPaused));
        assert_eq!(holds.reason("k4", &app), None);
        assert_eq!(holds.reason("k1", &app), None);

        // A Cluster off its schedule is held alike, with its own reason (its own namespace's
        // HelmOps and the mapped one); a schedule that is active holds nothing.
        let status = |active: bool| ClusterStatus {
            scheduled: Some(true),
            active_schedule: Some(active),
            ..ClusterStatus::default()
        };
        fleet.clusters[1].spec.paused = None;
        fleet.clusters[1].status = Some(status(false));
        fleet.clusters[0].status = Some(status(true));
        let mut holds = Holds::default();
        hold_clusters(&mut holds, &ops, &fleet, &keys);
        assert_eq!(
            holds.reason("k2", &app),
            Some(HoldReason::ClusterOffSchedule)
        );
        assert_eq!(
            holds.reason("k2", &HelmOpKey::new("mapped", "x")),
            Some(HoldReason::ClusterOffSchedule)
        );
        assert_eq!(holds.reason("k1", &app), None);
    }

    #[test]
    fn invalid_selector_is_a_problem_not_an_empty_target() {
        let bad = LabelSelector {
            match_labels: Some(BTreeMap::from([("in valid".to_string(), "x".to_string())])),
            ..LabelSelector::default()
        };
        let spec = HelmOpSpec {
            downstream_resources: Some(vec![DownstreamResource::new("Secret", "db")]),
            targets: Some(vec![BundleTarget {
                cluster_selector: Some(bad),
                ..BundleTarget::default()
            }]),
            ..HelmOpSpec::default()
        };
        let ops = [helmop("fleet", "app", spec)];
        let fleet = FleetObjects {
            clusters: vec![Cluster::new("fleet", "c1", &[])],
            ..FleetObjects::default()
        };
        let (desired, problems) = desired_fleet(&ops, &fleet, &["k1".into()]);
        assert!(desired.is_empty());
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].helmop, "fleet/app");
    }

    #[test]
    fn contexts_use_root_options_or_the_named_target() {
        let spec = HelmOpSpec {
            namespace: None,
            default_namespace: Some("apps".into()),
            downstream_resources: Some(vec![DownstreamResource::new("Secret", "db")]),
            targets: Some(vec![
                BundleTarget {
                    cluster_name: Some("east".into()),
                    default_namespace: Some("east-apps".into()),
                    ..BundleTarget::default()
                },
                BundleTarget {
                    cluster_name: Some("west".into()),
                    do_not_deploy: Some(true),
                    ..BundleTarget::default()
                },
            ]),
            ..HelmOpSpec::default()
        };
        let ops = [helmop("team", "app", spec)];
        let ds = |key: &str, name: &str| Downstream {
            key: key.into(),
            name: name.into(),
            identity: None,
            client: Err(PluginError::NoKubeconfigSecret),
        };
        let downstreams = [
            ds("https://e", "east"),
            ds("https://w", "west"),
            ds("https://n", "north"),
        ];
        let (desired, problems) = desired_contexts(&ops, &downstreams);
        assert!(problems.is_empty());
        assert_eq!(
            summary(&desired),
            [
                "team/app https://e east-apps secret/db",
                "team/app https://n apps secret/db"
            ]
        );
    }

    #[test]
    fn namespace_scope_adds_owners_of_deleted_helmops() {
        let inv = Inventory {
            helmops: vec![helmop("team", "live", HelmOpSpec::default())],
            ..Inventory::empty(Selection::Namespace("team".into()))
        };
        let copy = ObservedCopy {
            cluster: "c".into(),
            namespace: "apps".into(),
            resource: ResourceRef::secret("db"),
            uid: "u".into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::from([(
                names::ANN_OWNERS.to_string(),
                "up-1/team/gone,up-2/team/theirs,up-1/other/elsewhere".to_string(),
            )]),
            data_hash: None,
        };
        assert_eq!(
            inv.scope("up-1", &[copy]),
            Scope::HelmOps(BTreeSet::from([
                HelmOpKey::new("team", "gone"),
                HelmOpKey::new("team", "live"),
            ]))
        );
        let all = Inventory {
            selection: Selection::All,
            ..inv
        };
        assert_eq!(all.scope("up-1", &[]), Scope::All);
    }

    #[test]
    fn a_shard_resolves_only_the_clusters_its_helmops_want_copies_on() {
        let spec: HelmOpSpec = serde_json::from_value(serde_json::json!({
            "downstreamResources": [{"kind": "Secret", "name": "db"}],
            "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
        }))
        .expect("a valid spec");
        let mut fleet = FleetObjects {
            clusters: vec![
                Cluster::new("team", "c1", &[("env", "prod")]),
                Cluster::new("other", "c2", &[("env", "prod")]),
                Cluster::new("team", "c3", &[("env", "dev")]),
                Cluster::new("team", "c4", &[("env", "prod")]),
            ],
            ..FleetObjects::default()
        };
        let keys: Vec<String> = fleet
            .clusters
            .iter()
            .map(|c| clusters::fleet_key(&clusters::cluster_name(c)))
            .collect();
        let (wanted, _) = desired_fleet(&[helmop("team", "app", spec)], &fleet, &keys);
        let kept = within_reach(&mut fleet, keys, &wanted);
        let names: Vec<String> = fleet.clusters.iter().map(clusters::cluster_name).collect();
        assert_eq!(names, ["team/c1", "team/c4"]);
        assert_eq!(
            kept,
            ["team/c1", "team/c4"].map(clusters::fleet_key).to_vec()
        );
        within_reach(&mut fleet, kept, &[]);
        assert!(fleet.clusters.is_empty());
    }

    /// A shard speaks for its own HelmOps and for owners that are gone, never for a HelmOp
    /// another shard handles (it may have moved there a moment ago), in every selection.
    #[test]
    fn shards_never_speak_for_another_shards_helmops() {
        let labelled = |ns: &str, name: &str, shard: &str| {
            let mut h = helmop(ns, name, HelmOpSpec::default());
            h.metadata.labels = Some(BTreeMap::from([(
                names::FLEET_SHARD_REF_LABEL.to_string(),
                shard.to_string(),
            )]));
            h
        };
        let mut listed = vec![
            labelled("team", "mine", "a"),
            labelled("team", "theirs", "b"),
            helmop("team", "unsharded", HelmOpSpec::default()),
        ];
        let shard = Shard::Id("a".into());
        let elsewhere = other_shards(&mut listed, &shard);
        assert_eq!(
            elsewhere,
            BTreeSet::from([
                HelmOpKey::new("team", "theirs"),
                HelmOpKey::new("team", "unsharded"),
            ])
        );
        let copy = ObservedCopy {
            cluster: "c".into(),
            namespace: "apps".into(),
            resource: ResourceRef::secret("db"),
            uid: "u".into(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::from([(
                names::ANN_OWNERS.to_string(),
                "up-1/team/mine,up-1/team/theirs,up-1/team/unsharded,up-1/team/gone,up-1/other/gone,up-2/team/x"
                    .to_string(),
            )]),
            data_hash: None,
        };
        let inv = Inventory {
            shard,
            helmops: listed,
            elsewhere,
            ..Inventory::empty(Selection::All)
        };
        let keys = |pairs: &[(&str, &str)]| -> Scope {
            Scope::HelmOps(pairs.iter().map(|(n, h)| HelmOpKey::new(n, h)).collect())
        };
        assert_eq!(
            inv.scope("up-1", std::slice::from_ref(&copy)),
            keys(&[("team", "mine"), ("team", "gone"), ("other", "gone")])
        );
        let ns = Inventory {
            selection: Selection::Namespace("team".into()),
            ..inv
        };
        assert_eq!(
            ns.scope("up-1", std::slice::from_ref(&copy)),
            keys(&[("team", "mine"), ("team", "gone")])
        );
        let one = |name: &str| Inventory {
            shard: ns.shard.clone(),
            elsewhere: ns.elsewhere.clone(),
            ..Inventory::empty(Selection::One {
                namespace: "team".into(),
                name: name.into(),
            })
        };
        assert_eq!(one("theirs").scope("up-1", &[]), keys(&[]));
        assert_eq!(one("gone").scope("up-1", &[]), keys(&[("team", "gone")]));
        // Without a shard filter -A speaks for everyone, as before.
        let every = Inventory {
            shard: Shard::Every,
            elsewhere: BTreeSet::new(),
            kubeconfig_secrets: Default::default(),
            selection: Selection::All,
            ..ns
        };
        assert_eq!(every.scope("up-1", &[copy]), Scope::All);
    }

    #[test]
    fn restricted_fleet_targets_split_customizations() {
        let spec: HelmOpSpec = serde_json::from_value(serde_json::json!({
            "defaultNamespace": "apps",
            "downstreamResources": [{"kind": "Secret", "name": "db"}],
            "targets": [
                {"clusterName": "c1", "namespace": "custom"},
                {"clusterName": "c2", "doNotDeploy": true},
                {"clusterSelector": {}},
            ],
            "targetRestrictions": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
        }))
        .expect("a valid spec");
        let ops = [helmop("fleet", "app", spec)];
        let clusters = [
            Cluster::new("fleet", "c1", &[("env", "prod")]),
            Cluster::new("fleet", "c2", &[("env", "prod")]),
            Cluster::new("fleet", "c3", &[("env", "prod")]),
            Cluster::new("fleet", "c4", &[("env", "dev")]),
        ];
        let keys: Vec<String> = ["k1", "k2", "k3", "k4"].map(String::from).to_vec();
        let fleet = FleetObjects {
            clusters: clusters.to_vec(),
            ..FleetObjects::default()
        };
        let (desired, problems) = desired_fleet(&ops, &fleet, &keys);
        assert!(problems.is_empty());
        assert_eq!(
            summary(&desired),
            [
                "fleet/app k1 custom secret/db",
                "fleet/app k3 apps secret/db"
            ]
        );
    }

    #[test]
    fn a_narrowed_inventory_widens_back_to_the_enumeration() {
        let ds = |key: &str| Downstream {
            key: key.into(),
            name: key.into(),
            identity: None,
            client: Err(PluginError::NoKubeconfigSecret),
        };
        let keys = |inv: &Inventory| -> Vec<String> {
            inv.downstreams.iter().map(|d| d.key.clone()).collect()
        };
        let mut inv = Inventory::empty(Selection::All);
        inv.downstreams = ["a", "b", "c", "d", "e"].map(ds).into();
        let covered = BTreeSet::from(["b".to_string(), "d".to_string(), "e".to_string()]);
        let parked = inv.narrow(Some(&covered));
        assert_eq!(keys(&inv), ["b", "d", "e"]);
        inv.kinds = vec![ResourceKind::ConfigMap];
        inv.named_sources = vec![("team".into(), ResourceRef::new(ResourceKind::Secret, "db"))];
        let inv = inv.widen(parked);
        assert_eq!(keys(&inv), ["a", "b", "c", "d", "e"]);
        assert_eq!(inv.kinds, ResourceKind::ALL);
        assert!(inv.named_sources.is_empty());

        let mut whole = inv;
        let parked = whole.narrow(None);
        assert_eq!(keys(&whole.widen(parked)), ["a", "b", "c", "d", "e"]);
    }

    #[test]
    fn namespace_metadata_of_every_helmop_wanting_the_namespace() {
        let spec = |labels: serde_json::Value| -> HelmOpSpec {
            serde_json::from_value(serde_json::json!({
                "defaultNamespace": "apps",
                "downstreamResources": [{"kind": "Secret", "name": "db"}],
                "namespaceLabels": labels,
                "targets": [{"clusterSelector": {}}],
            }))
            .expect("a valid spec")
        };
        let ops = vec![
            helmop(
                "team",
                "a",
                spec(serde_json::json!({"team": "a", "tier": "web"})),
            ),
            helmop(
                "team",
                "b",
                spec(serde_json::json!({"team": "b", "zone": "eu"})),
            ),
            helmop("team", "c", spec(serde_json::json!({"other": "c"}))),
        ];
        let fleet = FleetObjects {
            clusters: vec![Cluster::new("team", "c1", &[])],
            ..FleetObjects::default()
        };
        // c wants nothing on k1 in apps: it lists no resources.
        let mut ops_ = ops.clone();
        ops_[2].spec.downstream_resources = None;
        let (desired, _) = desired_fleet(&ops_, &fleet, &["k1".into()]);
        let inv = Inventory {
            helmops: ops_,
            desired,
            ..Inventory::empty(Selection::Namespace("team".into()))
        };
        let (meta, disputed) = inv.namespace_metadata("k1", "apps");
        assert_eq!(
            meta.labels,
            BTreeMap::from([
                ("tier".to_string(), "web".to_string()),
                ("zone".to_string(), "eu".to_string()),
            ])
        );
        assert_eq!(disputed, ["label team"]);
        let (meta, disputed) = inv.namespace_metadata("k1", "elsewhere");
        assert_eq!(meta, NamespaceMetadata::default());
        assert!(disputed.is_empty());
    }
}
