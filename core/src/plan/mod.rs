//! Propagation planning: desired copies vs observed copies downstream -> actions.
//!
//! Pure: the caller resolves targeting, fetches the live sources (metadata and content hash),
//! lists the copies downstream (name, uid, labels, annotations; never data), and executes the
//! actions. Safety rules:
//!
//! - an object is helmop's only with the managed-by label AND a source annotation; anything else
//!   of the same name is a `Conflict` unless the caller adopts;
//! - objects labelled `fleet.cattle.io/bundledeployment` are never written or pruned;
//! - a copy is pruned only when it is helmop's, lists an owner of OUR upstream id that this run
//!   may release ([`Scope`]), the caller says enumeration was complete, and no owner remains;
//!   owners of other upstream ids (or entries helmop cannot read) are never removed;
//! - `keepResources` is recorded on the copy (`helmop.dev/keep`) when it is written, so a copy
//!   whose last owner lets go is kept even when that HelmOp no longer exists. A later HelmOp
//!   whose source and source-uid match re-adopts a kept copy like any of its own: it adds itself
//!   as owner, and the keep marker then follows the new owners' `keepResources`.
//! - held copies ([`Holds`]: a paused Cluster or HelmOp, a Cluster off its schedule, a HelmOp
//!   Fleet rejects) are frozen: no copy is created or updated for a held HelmOp, and a held
//!   owner is never released, so nothing it owns is pruned. They are reported
//!   [`ActionKind::Held`] with the copy's state.

mod identity;
mod markers;
mod refine;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

pub use identity::{migrate_upstream_ids, take_sources};
pub use refine::{LiveFacts, refine};

pub use markers::{
    CopyMeta, OwnerRef, SourceObject, SourceRef, UpstreamIdError, copy_meta, format_owners,
    parse_owners, validate_upstream_id,
};

use crate::model::Cluster;
use crate::names;
use crate::resource::ResourceRef;
use crate::state::RowState;

/// A HelmOp by namespace and name (its upstream id is the plan's).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HelmOpKey {
    pub namespace: String,
    pub name: String,
}

impl HelmOpKey {
    pub fn new(namespace: &str, name: &str) -> HelmOpKey {
        HelmOpKey {
            namespace: namespace.to_string(),
            name: name.to_string(),
        }
    }
}

impl fmt::Display for HelmOpKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// One HelmOp wanting one resource in one downstream namespace of one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCopy {
    /// The caller's name for the downstream cluster.
    pub cluster: String,
    /// Destination namespace downstream.
    pub namespace: String,
    /// The HelmOp; its namespace is the source namespace upstream.
    pub helmop: HelmOpKey,
    pub resource: ResourceRef,
    /// `keepResources` of the HelmOp or of the matched target.
    pub keep: bool,
}

/// An object found downstream: metadata only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObservedCopy {
    pub cluster: String,
    pub namespace: String,
    pub resource: ResourceRef,
    pub uid: String,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
    /// [`crate::hash::content_hash`] of the object's live content (`type`, `data`,
    /// `binaryData`) with the upstream key, computed in memory by the caller; `None` when only
    /// metadata was read. A helmop copy whose value differs from its own
    /// `helmop.dev/content-hash` was edited downstream (drift).
    pub data_hash: Option<String>,
}

/// The kind of run planning: copies for Fleet Clusters, or for `--target-context`s. Each write
/// records its kind on the copy ([`names::ANN_MADE_BY`]); a run never releases owners of, or
/// deletes, a copy the other kind of run also made: it only takes its own mark off once it no
/// longer wants the copy ([`ActionKind::Handover`]), leaving it to the other kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    #[default]
    Fleet,
    Context,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Fleet => "fleet",
            Mode::Context => "target-context",
        }
    }

    /// How a user reruns this kind of run (for reasons).
    fn how(self) -> &'static str {
        match self {
            Mode::Fleet => "runs without --target-context",
            Mode::Context => "--target-context runs",
        }
    }
}

/// The kinds of run that made `o`, by name (absent marker: Fleet-mode runs only). Names this
/// release does not know are kept: a kind of run it cannot speak for.
pub fn made_by(o: &ObservedCopy) -> BTreeSet<String> {
    match o.annotations.get(names::ANN_MADE_BY) {
        None => BTreeSet::from([Mode::Fleet.name().to_string()]),
        Some(v) => v
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
            .map(String::from)
            .collect(),
    }
}

/// The marker for `modes`; `None` (no annotation) for Fleet-mode only.
fn made_by_marker(modes: &BTreeSet<String>) -> Option<String> {
    if modes.len() == 1 && modes.contains(Mode::Fleet.name()) {
        return None;
    }
    Some(modes.iter().cloned().collect::<Vec<_>>().join(","))
}

/// Whose ownership this run may release.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// Every HelmOp of our upstream id was enumerated (`-A`).
    All,
    /// Only these HelmOps' wishes are fully stated (e.g. `prune NAME`); other owners are left
    /// as they are.
    HelmOps(BTreeSet<HelmOpKey>),
}

/// Why a HelmOp's copies on a cluster are frozen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HoldReason {
    /// The Cluster's `spec.paused`.
    ClusterPaused,
    /// The Cluster's status says it is off its schedule ([`Cluster::off_schedule`]).
    ClusterOffSchedule,
    /// The HelmOp's `spec.paused`.
    HelmOpPaused,
    /// Fleet's controller rejects the HelmOp (and keeps its previous Bundle); the reason.
    Invalid(String),
    /// Fleet's agent refuses the destination namespace on this cluster
    /// (`allowedTargetNamespaceSelector`); the reason.
    NamespaceRefused(String),
}

impl HoldReason {
    /// The state of the rows it freezes.
    pub fn state(&self) -> RowState {
        match self {
            HoldReason::ClusterPaused | HoldReason::HelmOpPaused => RowState::Paused,
            HoldReason::ClusterOffSchedule => RowState::OffSchedule,
            HoldReason::Invalid(_) | HoldReason::NamespaceRefused(_) => RowState::Invalid,
        }
    }

    /// Why Fleet deploys nothing new to `cluster` for any Bundle, if it does not: it is paused,
    /// or off its schedule. Fleet's agent skips a BundleDeployment marked either way alike (no
    /// deploy, no cleanup, drift detection cleared) and looks at the pause first (rancher/fleet
    /// v0.16 `agent/controller/bundledeployment_controller.go` `Reconcile`), so a pause wins.
    pub fn of_cluster(cluster: &Cluster) -> Option<HoldReason> {
        if cluster.spec.paused() {
            Some(HoldReason::ClusterPaused)
        } else if cluster.off_schedule() {
            Some(HoldReason::ClusterOffSchedule)
        } else {
            None
        }
    }

    /// What lifts the hold, for reasons.
    fn until(&self) -> &'static str {
        match self {
            HoldReason::Invalid(_) => "the HelmOp is accepted again",
            HoldReason::NamespaceRefused(_) => "the destination namespace is allowed",
            HoldReason::ClusterOffSchedule => "its schedule is active again",
            HoldReason::ClusterPaused | HoldReason::HelmOpPaused => "it is unpaused",
        }
    }
}

impl fmt::Display for HoldReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HoldReason::ClusterPaused => f.write_str("the Cluster is paused"),
            HoldReason::ClusterOffSchedule => f.write_str(
                "the Cluster is off its schedule (status.scheduled without status.activeSchedule)",
            ),
            HoldReason::HelmOpPaused => f.write_str("the HelmOp is paused"),
            HoldReason::Invalid(why) => write!(f, "Fleet rejects the HelmOp: {why}"),
            HoldReason::NamespaceRefused(why) => {
                write!(f, "Fleet's agent refuses the destination namespace: {why}")
            }
        }
    }
}

/// Clusters and HelmOps whose copies are frozen ([`HoldReason`]). A HelmOp's own reason wins
/// over its cluster's (an invalid HelmOp on a paused cluster is reported invalid).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Holds {
    /// Held clusters (paused, or off their schedule): the caller's cluster name -> the
    /// namespaces whose Cluster object for it is held, with why. A Fleet Cluster serves the
    /// HelmOps of its own namespace, so holding it freezes only theirs (the same physical
    /// cluster may be registered, unheld, elsewhere).
    pub clusters: BTreeMap<String, BTreeMap<String, HoldReason>>,
    pub helmops: BTreeMap<HelmOpKey, HoldReason>,
    /// One HelmOp on one cluster (the caller's cluster name).
    pub placements: BTreeMap<(String, HelmOpKey), HoldReason>,
}

impl Holds {
    pub fn is_empty(&self) -> bool {
        self.clusters.is_empty() && self.helmops.is_empty() && self.placements.is_empty()
    }

    /// Records that the Cluster object of `namespace` for `cluster` is paused.
    pub fn pause_cluster(&mut self, cluster: &str, namespace: &str) {
        self.hold_cluster(cluster, namespace, HoldReason::ClusterPaused);
    }

    /// Records that the HelmOps of `namespace` are frozen on `cluster` for `why` (a Cluster
    /// [`HoldReason`]). When two Clusters hold the same namespace there, a pause wins over a
    /// schedule, as in [`HoldReason::of_cluster`].
    pub fn hold_cluster(&mut self, cluster: &str, namespace: &str, why: HoldReason) {
        let held = self.clusters.entry(cluster.to_string()).or_default();
        if held.get(namespace) != Some(&HoldReason::ClusterPaused) {
            held.insert(namespace.to_string(), why);
        }
    }

    /// Why `helmop`'s copies on `cluster` are frozen, if they are.
    pub fn reason(&self, cluster: &str, helmop: &HelmOpKey) -> Option<HoldReason> {
        if let Some(r) = self.helmops.get(helmop) {
            return Some(r.clone());
        }
        if let Some(r) = self.placements.get(&(cluster.to_string(), helmop.clone())) {
            return Some(r.clone());
        }
        self.clusters.get(cluster)?.get(&helmop.namespace).cloned()
    }
}

/// The state of a frozen copy, for the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeldCopy {
    /// No object there yet (none is created while held).
    Absent,
    /// helmop's copy of the wanted source with its current content.
    Current,
    /// helmop's copy, but the source changed since (or it was edited downstream).
    Outdated,
    /// helmop's copy that no HelmOp wants any more (not pruned while held).
    Unwanted,
    /// An object helmop does not own (it stays untouched either way).
    NotOurs,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanInput {
    pub upstream_id: String,
    pub desired: Vec<DesiredCopy>,
    /// Live sources upstream; a desired copy without one is `SourceMissing`.
    pub sources: Vec<SourceObject>,
    pub observed: Vec<ObservedCopy>,
    pub scope: Scope,
    /// True only after a complete, successful enumeration of HelmOps, Clusters and targets.
    /// When false no owner is ever released and nothing is pruned.
    pub complete: bool,
    /// `--adopt`: take over same-named objects helmop does not own (never Fleet's).
    pub adopt: bool,
    /// Frozen clusters and HelmOps.
    pub holds: Holds,
    /// The kind of run (recorded on every copy it writes).
    pub mode: Mode,
    /// What other registrations that may reach the same cluster want (another Fleet Cluster or
    /// context answering the same identity, or one whose identity is unknown), keyed like
    /// `desired`. Protection only: an owner wanting a copy here is never released, so the copy
    /// is never pruned, but nothing is written for it (each registration's copies travel
    /// through its own credentials; docs/cluster-identity.md).
    pub protected: Vec<DesiredCopy>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Action {
    pub cluster: String,
    pub namespace: String,
    pub resource: ResourceRef,
    /// The HelmOps the row is about: those wanting the copy, or those being released.
    pub helmops: Vec<HelmOpKey>,
    pub kind: ActionKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActionKind {
    /// Apply a new copy of `source` with `meta`.
    Create {
        source: SourceRef,
        meta: CopyMeta,
    },
    /// Apply `meta` (and the source's content) to the existing copy, guarded by `uid`.
    Update {
        source: SourceRef,
        uid: String,
        meta: CopyMeta,
        reasons: Vec<UpdateReason>,
    },
    /// The copy cannot be changed in place (its `type` differs from the source's, or it was made
    /// `immutable`): delete it with a precondition on `uid` and `resource_version`, then create
    /// it anew. Only ever planned for helmop's own copies ([`refine`]).
    Recreate {
        source: SourceRef,
        uid: String,
        resource_version: String,
        meta: CopyMeta,
        reasons: Vec<UpdateReason>,
        why: RecreateReason,
    },
    Unchanged,
    Conflict(ConflictReason),
    /// Fleet copies this object itself; helmop neither writes nor prunes it.
    SkipFleetManaged,
    SourceMissing,
    /// Delete the copy with a precondition on `uid`.
    Prune {
        uid: String,
    },
    /// Other owners remain: set `helmop.dev/owners` to `owners` (uid precondition).
    RemoveOwner {
        uid: String,
        owners: String,
    },
    /// Reported `Kept`. With `rewrite`, remove the `helmop.dev/owners` annotation (uid
    /// precondition); without, nothing to write.
    Keep {
        uid: String,
        rewrite: bool,
    },
    /// helmop's copy, not wanted, but not removable now.
    Orphaned(OrphanReason),
    /// Not wanted by this kind of run, but the other kind made it too: only this kind's mark is
    /// taken off `helmop.dev/made-by` (set to `made_by`, `None` removes it; uid precondition);
    /// owners stay for the other kind to judge.
    Handover {
        uid: String,
        made_by: Option<String>,
    },
    /// Frozen ([`Holds`]): nothing is written. `helmops` are the held ones.
    Held {
        why: HoldReason,
        copy: HeldCopy,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateReason {
    ContentChanged,
    OwnersAdded(Vec<HelmOpKey>),
    OwnersRemoved(Vec<HelmOpKey>),
    /// Labels or annotations carried from the source (or helmop's markers) differ.
    MarkersChanged,
    /// Taken over with `--adopt`.
    Adopted,
    /// The source was deleted and created again (new uid); the copy is helmop's for these
    /// owners, so it follows the new source.
    SourceRecreated,
    /// The copy's data was edited downstream (its live content no longer matches its
    /// `helmop.dev/content-hash`).
    Drifted,
    /// The copy's live content equals the source's, but its `helmop.dev/content-hash` differs:
    /// it was made with another hash key (the upstream key was replaced). Only the annotation
    /// is rewritten.
    HashOutdated,
}

/// Why a copy must be deleted and created again instead of updated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecreateReason {
    /// Kubernetes does not allow changing a Secret's `type`.
    TypeChanged,
    /// The copy was made `immutable` downstream.
    Immutable,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConflictReason {
    /// Same-named object without helmop's managed-by label and source annotation.
    NotManaged,
    /// helmop's copy of another source (other namespace, kind or upstream id).
    SourceMismatch { found: String },
    /// Same source name, but copied from an object with another uid (source recreated).
    SourceUidMismatch { found: Option<String> },
    /// HelmOps in different namespaces copy different sources onto the same object.
    CompetingSources { sources: Vec<String> },
    /// The place is a source itself (the cluster is the upstream cluster): never written,
    /// adopted or pruned, whatever `--adopt` says.
    IsSource,
    /// An object helmop does not own (being adopted) cannot be updated in place, and helmop
    /// never deletes what it does not own.
    CannotUpdate { why: RecreateReason },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OrphanReason {
    /// Not wanted, but enumeration was incomplete, so no owner is released.
    EnumerationIncomplete,
    /// Our copy with no owners and no keep marker (edited by hand?); left for a person.
    NoOwners,
    /// Made by the other kind of run only: that kind prunes it.
    OtherMode(Mode),
}

impl ActionKind {
    /// The action's name in the planner's tests (`Keep` reads `Kept`; a held one reads as its
    /// row state).
    #[cfg(test)]
    pub fn name(&self) -> &'static str {
        match self {
            ActionKind::Create { .. } => "Create",
            ActionKind::Update { .. } => "Update",
            ActionKind::Recreate { .. } => "Recreate",
            ActionKind::Unchanged => "Unchanged",
            ActionKind::Conflict(_) => "Conflict",
            ActionKind::SkipFleetManaged => "FleetManaged",
            ActionKind::SourceMissing => "SourceMissing",
            ActionKind::Prune { .. } => "Prune",
            ActionKind::RemoveOwner { .. } => "RemoveOwner",
            ActionKind::Keep { .. } => "Kept",
            ActionKind::Handover { .. } => "Handover",
            ActionKind::Orphaned(_) => "Orphaned",
            ActionKind::Held { why, .. } => why.state().as_str(),
        }
    }

    /// Whether executing the action writes to the cluster.
    pub fn writes(&self) -> bool {
        match self {
            ActionKind::Create { .. }
            | ActionKind::Update { .. }
            | ActionKind::Recreate { .. }
            | ActionKind::Prune { .. }
            | ActionKind::RemoveOwner { .. } => true,
            ActionKind::Keep { rewrite, .. } => *rewrite,
            ActionKind::Handover { .. } => true,
            _ => false,
        }
    }
}

fn list(keys: &[HelmOpKey]) -> String {
    keys.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

impl fmt::Display for UpdateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            UpdateReason::ContentChanged => f.write_str("source content changed"),
            UpdateReason::OwnersAdded(k) => write!(f, "owners added: {}", list(k)),
            UpdateReason::OwnersRemoved(k) => write!(f, "owners removed: {}", list(k)),
            UpdateReason::MarkersChanged => f.write_str("labels or annotations differ"),
            UpdateReason::Adopted => f.write_str("adopted (--adopt)"),
            UpdateReason::SourceRecreated => {
                f.write_str("the source was recreated; the copy follows it")
            }
            UpdateReason::Drifted => f.write_str("the copy's data was edited downstream"),
            UpdateReason::HashOutdated => f.write_str(
                "the content matches the source, but the copy's hash was made with another hash key",
            ),
        }
    }
}

impl fmt::Display for RecreateReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            RecreateReason::TypeChanged => {
                "the Secret type changed, which Kubernetes cannot update in place; the copy is deleted and created again"
            }
            RecreateReason::Immutable => {
                "the copy is immutable; it is deleted and created again"
            }
        })
    }
}

impl fmt::Display for ConflictReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConflictReason::NotManaged => f.write_str(
                "an object of this name exists that helmop did not create; use --adopt to take it over",
            ),
            ConflictReason::SourceMismatch { found } => write!(
                f,
                "the object is helmop's copy of {found}; use --adopt to take it over"
            ),
            ConflictReason::SourceUidMismatch { found } => write!(
                f,
                "the copy was made from an earlier source object (source-uid {}); check the source, then use --adopt to re-copy",
                found.as_deref().unwrap_or("missing")
            ),
            ConflictReason::CompetingSources { sources } => write!(
                f,
                "HelmOps copy different sources onto this object ({}); give them distinct names or namespaces",
                sources.join(", ")
            ),
            ConflictReason::IsSource => f.write_str(
                "this is the source itself: the cluster is the management cluster and this namespace holds the HelmOp's sources; helmop never writes, adopts or prunes a source (target another namespace)",
            ),
            ConflictReason::CannotUpdate { why } => write!(
                f,
                "the object cannot be updated in place ({}) and helmop does not own it; delete it by hand, then run propagate again",
                match why {
                    RecreateReason::TypeChanged => "its Secret type differs from the source's",
                    RecreateReason::Immutable => "it is immutable",
                }
            ),
        }
    }
}

impl fmt::Display for OrphanReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OrphanReason::EnumerationIncomplete => {
                "no longer wanted, but enumeration was incomplete, so it is not removed"
            }
            OrphanReason::NoOwners => {
                "helmop's copy lists no owners and no keep marker; delete it by hand if unused"
            }
            OrphanReason::OtherMode(Mode::Context) => {
                "made by --target-context runs: prune it with the same --target-context flags"
            }
            OrphanReason::OtherMode(Mode::Fleet) => {
                "made by runs without --target-context (for Fleet Clusters): prune it with those"
            }
        })
    }
}

impl Action {
    /// A one-line reason a user can act on (never any data).
    pub fn reason(&self) -> String {
        match &self.kind {
            ActionKind::Create { .. } => "no copy yet".into(),
            ActionKind::Update { reasons, .. } => reasons
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join("; "),
            ActionKind::Recreate { reasons, why, .. } => reasons
                .iter()
                .map(ToString::to_string)
                .chain([why.to_string()])
                .collect::<Vec<_>>()
                .join("; "),
            ActionKind::Unchanged => "in sync".into(),
            ActionKind::Conflict(r) => r.to_string(),
            ActionKind::SkipFleetManaged => format!(
                "Fleet manages this object (label {}); helmop leaves it alone",
                names::FLEET_BUNDLEDEPLOYMENT_LABEL
            ),
            ActionKind::SourceMissing => format!(
                "source {} not found in the HelmOp's namespace upstream",
                self.resource
            ),
            ActionKind::Prune { .. } => "no HelmOp wants this copy any more".into(),
            ActionKind::RemoveOwner { .. } => {
                format!("still wanted by others; releasing {}", list(&self.helmops))
            }
            ActionKind::Keep { .. } => "kept: copied for a HelmOp with keepResources".into(),
            ActionKind::Orphaned(r) => r.to_string(),
            ActionKind::Handover { made_by, .. } => {
                let other = made_by.as_deref().unwrap_or("fleet");
                let other = if other.contains("target-context") {
                    Mode::Context
                } else {
                    Mode::Fleet
                };
                format!(
                    "no longer wanted by these runs; left to the {} that also made it",
                    other.how()
                )
            }
            ActionKind::Held { why, copy } => {
                let until = why.until();
                let copy = match copy {
                    HeldCopy::Absent => format!("no copy yet; none is created until {until}"),
                    HeldCopy::Current => "the copy is current".to_string(),
                    HeldCopy::Outdated => format!(
                        "the copy is outdated (the source changed or the copy was edited); it is updated once {until}"
                    ),
                    HeldCopy::Unwanted => {
                        format!("the copy is no longer wanted; it is not pruned until {until}")
                    }
                    HeldCopy::NotOurs => "an object helmop does not own is there".to_string(),
                };
                format!("{why}; {copy}")
            }
        }
    }
}

/// Where a copy lives; sorts by (cluster, namespace, lower-case kind, name).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct CopyKey<'a> {
    cluster: &'a str,
    namespace: &'a str,
    kind: &'static str,
    name: &'a str,
}

impl<'a> CopyKey<'a> {
    fn new(cluster: &'a str, namespace: &'a str, resource: &'a ResourceRef) -> Self {
        CopyKey {
            cluster,
            namespace,
            kind: resource.kind.lower(),
            name: &resource.name,
        }
    }
}

fn is_managed(o: &ObservedCopy) -> bool {
    o.labels.get(names::LABEL_MANAGED_BY).map(String::as_str) == Some(names::MANAGER)
        && o.annotations
            .get(names::ANN_SOURCE)
            .is_some_and(|s| !s.is_empty())
}

fn is_fleet_managed(o: &ObservedCopy) -> bool {
    o.labels.contains_key(names::FLEET_BUNDLEDEPLOYMENT_LABEL)
}

fn is_kept(o: &ObservedCopy) -> bool {
    o.annotations.get(names::ANN_KEEP).map(String::as_str) == Some("true")
}

fn owners_of(o: &ObservedCopy) -> BTreeSet<String> {
    o.annotations
        .get(names::ANN_OWNERS)
        .map(|v| parse_owners(v))
        .unwrap_or_default()
}

/// Every label and annotation we would write is there with our value, and no `helmop.dev/`
/// key is there that we would not write (e.g. a stale keep marker). Labels follow the source
/// exactly: a label the copy has and we would not write is a difference too (a label removed
/// from the source, or added downstream), except the reserved prefixes helmop never copies
/// (`kubectl.kubernetes.io/`, Fleet's), which are left to their writers.
fn meta_matches(o: &ObservedCopy, meta: &CopyMeta) -> bool {
    let covers = |have: &BTreeMap<String, String>, want: &BTreeMap<String, String>| {
        want.iter().all(|(k, v)| have.get(k) == Some(v))
            && have
                .keys()
                .filter(|k| k.starts_with(names::PREFIX))
                .all(|k| want.contains_key(k))
    };
    covers(&o.labels, &meta.labels)
        && extra_labels(&o.labels, &meta.labels).is_empty()
        && covers(&o.annotations, &meta.annotations)
}

/// Labels of a copy that helmop would not write and that are not under a reserved prefix:
/// those a write removes so the copy's labels follow the source exactly.
pub fn extra_labels(
    have: &BTreeMap<String, String>,
    want: &BTreeMap<String, String>,
) -> Vec<String> {
    have.keys()
        .filter(|k| !want.contains_key(*k) && !markers::reserved(k))
        .cloned()
        .collect()
}

/// The copy was edited downstream: its live content hash is known and differs from the hash
/// helmop recorded when it wrote the copy.
fn drifted(o: &ObservedCopy) -> bool {
    match (&o.data_hash, o.annotations.get(names::ANN_CONTENT_HASH)) {
        (Some(live), Some(recorded)) => live != recorded,
        (Some(_), None) => true,
        _ => false,
    }
}

struct Planner<'a> {
    input: &'a PlanInput,
    sources: BTreeMap<(&'a str, &'a ResourceRef), &'a SourceObject>,
    /// `(place, HelmOp)` of every protected want ([`PlanInput::protected`]).
    protected: BTreeSet<(CopyKey<'a>, &'a HelmOpKey)>,
}

impl<'a> Planner<'a> {
    fn owner_entry(&self, helmop: &HelmOpKey) -> String {
        OwnerRef::new(&self.input.upstream_id, &helmop.namespace, &helmop.name).to_string()
    }

    /// An owners entry of our upstream id; with its hold on `cluster`, if any.
    fn our_owner(&self, cluster: &str, entry: &str) -> Option<(HelmOpKey, Option<HoldReason>)> {
        let owner = OwnerRef::parse(entry)?;
        if owner.upstream_id != self.input.upstream_id {
            return None;
        }
        let key = HelmOpKey::new(&owner.namespace, &owner.name);
        let hold = self.input.holds.reason(cluster, &key);
        Some((key, hold))
    }

    /// An owners entry of our upstream id that this run may release at `at` (never a held
    /// one, nor one another registration of the cluster may want there).
    fn releasable(&self, at: &CopyKey<'_>, entry: &str) -> Option<HelmOpKey> {
        let (key, hold) = self.our_owner(at.cluster, entry)?;
        // Covariance: the set, seen with the shorter lifetimes of `at` and `key`.
        let set: &BTreeSet<(CopyKey<'_>, &HelmOpKey)> = &self.protected;
        let protected = set.contains(&(*at, &key));
        (hold.is_none() && !protected && self.in_scope(&key)).then_some(key)
    }

    /// Records this kind of run on the copy's metadata, besides the kinds in `before`.
    fn mark(&self, meta: &mut CopyMeta, mut before: BTreeSet<String>) {
        before.insert(self.input.mode.name().to_string());
        if let Some(marker) = made_by_marker(&before) {
            meta.annotations.insert(names::ANN_MADE_BY.into(), marker);
        }
    }

    /// Whether the other kind of run made `o` too.
    fn other_kind_made(&self, o: &ObservedCopy) -> bool {
        made_by(o).iter().any(|m| m != self.input.mode.name())
    }

    /// Whether this run speaks for `key` ([`Scope`]).
    fn in_scope(&self, key: &HelmOpKey) -> bool {
        match &self.input.scope {
            Scope::All => true,
            Scope::HelmOps(set) => set.contains(key),
        }
    }

    fn action(
        &self,
        at: &CopyKey<'_>,
        resource: &ResourceRef,
        helmops: Vec<HelmOpKey>,
        kind: ActionKind,
    ) -> Action {
        Action {
            cluster: at.cluster.to_string(),
            namespace: at.namespace.to_string(),
            resource: resource.clone(),
            helmops,
            kind,
        }
    }

    fn desired(
        &self,
        at: &CopyKey<'_>,
        wants: &[&DesiredCopy],
        observed: Option<&ObservedCopy>,
        out: &mut Vec<Action>,
    ) {
        let Some(first) = wants.first() else {
            return;
        };
        let resource = &first.resource;
        let mut by_source: BTreeMap<SourceRef, Vec<&DesiredCopy>> = BTreeMap::new();
        for d in wants {
            let source = SourceRef::new(
                &self.input.upstream_id,
                &d.helmop.namespace,
                d.resource.clone(),
            );
            by_source.entry(source).or_default().push(d);
        }
        let helmops_of = |group: &[&DesiredCopy]| -> Vec<HelmOpKey> {
            let set: BTreeSet<HelmOpKey> = group.iter().map(|d| d.helmop.clone()).collect();
            set.into_iter().collect()
        };
        if observed.is_some_and(is_fleet_managed) {
            out.push(self.action(
                at,
                resource,
                helmops_of(wants),
                ActionKind::SkipFleetManaged,
            ));
            return;
        }
        let mut held: BTreeMap<String, (HoldReason, Vec<&DesiredCopy>)> = BTreeMap::new();
        for d in wants {
            if let Some(why) = self.input.holds.reason(at.cluster, &d.helmop) {
                held.entry(why.to_string())
                    .or_insert_with(|| (why, Vec::new()))
                    .1
                    .push(d);
            }
        }
        for (why, group) in held.into_values() {
            let copy = self.held_copy(group[0], observed);
            out.push(self.action(
                at,
                resource,
                helmops_of(&group),
                ActionKind::Held { why, copy },
            ));
        }
        by_source.retain(|_, group| {
            group.retain(|d| self.input.holds.reason(at.cluster, &d.helmop).is_none());
            !group.is_empty()
        });
        if by_source.len() > 1 {
            let sources: Vec<String> = by_source.keys().map(ToString::to_string).collect();
            let winner = observed
                .filter(|o| is_managed(o))
                .and_then(|o| SourceRef::parse(o.annotations.get(names::ANN_SOURCE)?))
                .filter(|s| by_source.contains_key(s));
            for (source, group) in &by_source {
                if Some(source) == winner.as_ref() {
                    self.one_source(at, source, group, observed, out);
                } else {
                    let reason = ConflictReason::CompetingSources {
                        sources: sources.clone(),
                    };
                    out.push(self.action(
                        at,
                        resource,
                        helmops_of(group),
                        ActionKind::Conflict(reason),
                    ));
                }
            }
            return;
        }
        for (source, group) in &by_source {
            self.one_source(at, source, group, observed, out);
        }
    }

    /// The state of a held HelmOp's copy: helmop's copy of its source, and current or not.
    fn held_copy(&self, want: &DesiredCopy, observed: Option<&ObservedCopy>) -> HeldCopy {
        let Some(o) = observed else {
            return HeldCopy::Absent;
        };
        let source_ref = SourceRef::new(
            &self.input.upstream_id,
            &want.helmop.namespace,
            want.resource.clone(),
        );
        let found = o
            .annotations
            .get(names::ANN_SOURCE)
            .and_then(|s| SourceRef::parse(s));
        if !is_managed(o) || found.as_ref() != Some(&source_ref) {
            return HeldCopy::NotOurs;
        }
        let source = self
            .sources
            .get(&(source_ref.namespace.as_str(), &source_ref.resource));
        let current = source.is_some_and(|s| {
            o.annotations.get(names::ANN_CONTENT_HASH) == Some(&s.content_hash)
                && o.annotations.get(names::ANN_SOURCE_UID) == Some(&s.uid)
        }) && !drifted(o);
        if current {
            HeldCopy::Current
        } else {
            HeldCopy::Outdated
        }
    }

    fn one_source(
        &self,
        at: &CopyKey<'_>,
        source_ref: &SourceRef,
        group: &[&DesiredCopy],
        observed: Option<&ObservedCopy>,
        out: &mut Vec<Action>,
    ) {
        let resource = &source_ref.resource;
        let helmops: Vec<HelmOpKey> = group
            .iter()
            .map(|d| d.helmop.clone())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let wanted: BTreeSet<String> = helmops.iter().map(|h| self.owner_entry(h)).collect();
        let keep = group.iter().any(|d| d.keep);
        let push = |out: &mut Vec<Action>, kind| {
            out.push(self.action(at, resource, helmops.clone(), kind))
        };

        let Some(source) = self
            .sources
            .get(&(source_ref.namespace.as_str(), resource))
            .copied()
        else {
            push(out, ActionKind::SourceMissing);
            return;
        };
        let upstream = &self.input.upstream_id;
        let Some(o) = observed else {
            let mut meta = copy_meta(upstream, source, &wanted, keep);
            self.mark(&mut meta, BTreeSet::new());
            push(
                out,
                ActionKind::Create {
                    source: source_ref.clone(),
                    meta,
                },
            );
            return;
        };

        let adopt = self.input.adopt;
        let mut reasons = Vec::new();
        let found_source = o.annotations.get(names::ANN_SOURCE);
        let existing = if !is_managed(o) {
            if !adopt {
                push(out, ActionKind::Conflict(ConflictReason::NotManaged));
                return;
            }
            reasons.push(UpdateReason::Adopted);
            BTreeSet::new()
        } else if found_source.and_then(|s| SourceRef::parse(s)).as_ref() != Some(source_ref) {
            if !adopt {
                let found = found_source.cloned().unwrap_or_default();
                push(
                    out,
                    ActionKind::Conflict(ConflictReason::SourceMismatch { found }),
                );
                return;
            }
            // The owners listed were owners of another source; they do not carry over.
            reasons.push(UpdateReason::Adopted);
            BTreeSet::new()
        } else {
            let found_uid = o.annotations.get(names::ANN_SOURCE_UID);
            // A copy listing one of these HelmOps (of our upstream) as owner is ours: the source
            // was deleted and recreated (external secret tools do that), so follow it. A copy
            // listing none of them stays a conflict: it may be an impostor.
            let ours = owners_of(o).iter().any(|e| wanted.contains(e));
            if found_uid != Some(&source.uid) && ours {
                reasons.push(UpdateReason::SourceRecreated);
            } else if found_uid != Some(&source.uid) {
                if !adopt {
                    let found = found_uid.cloned();
                    push(
                        out,
                        ActionKind::Conflict(ConflictReason::SourceUidMismatch { found }),
                    );
                    return;
                }
                reasons.push(UpdateReason::Adopted);
            }
            owners_of(o)
        };

        // Owners the other kind of run made the copy for are that kind's to release.
        let adopted = reasons.contains(&UpdateReason::Adopted);
        let shared = !adopted && self.other_kind_made(o);
        let released: Vec<HelmOpKey> = if self.input.complete && !shared {
            existing
                .iter()
                .filter(|e| !wanted.contains(*e))
                .filter_map(|e| self.releasable(at, e))
                .collect()
        } else {
            Vec::new()
        };
        let released_entries: BTreeSet<String> =
            released.iter().map(|h| self.owner_entry(h)).collect();
        let mut owners: BTreeSet<String> =
            existing.difference(&released_entries).cloned().collect();
        owners.extend(wanted.iter().cloned());
        // Someone we cannot ask (another upstream, a HelmOp out of scope, a stale owner) may have
        // wanted the keep marker: keep it while any of them remains.
        let others_remain = owners.iter().any(|e| !wanted.contains(e));
        let keep = keep || (is_kept(o) && others_remain);
        let mut meta = copy_meta(upstream, source, &owners, keep);
        self.mark(
            &mut meta,
            if adopted { BTreeSet::new() } else { made_by(o) },
        );

        // The live content hash (when read) tells a source change from a replaced hash key
        // and from an edit downstream; see [`ObservedCopy::data_hash`].
        let recorded = o.annotations.get(names::ANN_CONTENT_HASH);
        let live_matches = o.data_hash.as_ref() == Some(&source.content_hash);
        let ours = !adopted;
        if recorded != Some(&source.content_hash) {
            reasons.push(if ours && live_matches {
                UpdateReason::HashOutdated
            } else {
                UpdateReason::ContentChanged
            });
        }
        if ours && drifted(o) && !live_matches {
            reasons.push(UpdateReason::Drifted);
        }
        let added: Vec<HelmOpKey> = helmops
            .iter()
            .filter(|h| !existing.contains(&self.owner_entry(h)))
            .cloned()
            .collect();
        if !added.is_empty() {
            reasons.push(UpdateReason::OwnersAdded(added));
        }
        if !released.is_empty() {
            reasons.push(UpdateReason::OwnersRemoved(released));
        }
        if reasons.is_empty() && !meta_matches(o, &meta) {
            reasons.push(UpdateReason::MarkersChanged);
        }
        if reasons.is_empty() {
            push(out, ActionKind::Unchanged);
        } else {
            push(
                out,
                ActionKind::Update {
                    source: source_ref.clone(),
                    uid: o.uid.clone(),
                    meta,
                    reasons,
                },
            );
        }
    }

    fn undesired(&self, at: &CopyKey<'_>, o: &ObservedCopy, out: &mut Vec<Action>) {
        if !is_managed(o) {
            return;
        }
        let existing = owners_of(o);
        let mine: BTreeMap<String, HelmOpKey> = existing
            .iter()
            .filter_map(|e| Some((e.clone(), self.releasable(at, e)?)))
            .collect();
        let helmops: Vec<HelmOpKey> = mine
            .values()
            .cloned()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let push = |out: &mut Vec<Action>, kind| {
            out.push(self.action(at, &o.resource, helmops.clone(), kind))
        };
        if is_fleet_managed(o) {
            if !mine.is_empty() {
                push(out, ActionKind::SkipFleetManaged);
            }
            return;
        }
        if mine.is_empty() {
            let held: BTreeMap<HelmOpKey, HoldReason> = existing
                .iter()
                .filter_map(|e| match self.our_owner(at.cluster, e)? {
                    (key, Some(why)) if self.in_scope(&key) => Some((key, why)),
                    _ => None,
                })
                .collect();
            if let Some(why) = held.values().next().cloned() {
                out.push(self.action(
                    at,
                    &o.resource,
                    held.into_keys().collect(),
                    ActionKind::Held {
                        why,
                        copy: HeldCopy::Unwanted,
                    },
                ));
                return;
            }
            let our_source = o
                .annotations
                .get(names::ANN_SOURCE)
                .and_then(|s| SourceRef::parse(s))
                .is_some_and(|s| s.upstream_id == self.input.upstream_id);
            if self.input.scope == Scope::All && our_source && existing.is_empty() {
                let kind = if is_kept(o) {
                    ActionKind::Keep {
                        uid: o.uid.clone(),
                        rewrite: false,
                    }
                } else {
                    ActionKind::Orphaned(OrphanReason::NoOwners)
                };
                push(out, kind);
            }
            return;
        }
        if !self.input.complete {
            push(
                out,
                ActionKind::Orphaned(OrphanReason::EnumerationIncomplete),
            );
            return;
        }
        let mut modes = made_by(o);
        if self.other_kind_made(o) {
            let kind = if modes.remove(self.input.mode.name()) {
                ActionKind::Handover {
                    uid: o.uid.clone(),
                    made_by: made_by_marker(&modes),
                }
            } else if modes.contains(Mode::Context.name()) {
                ActionKind::Orphaned(OrphanReason::OtherMode(Mode::Context))
            } else {
                ActionKind::Orphaned(OrphanReason::OtherMode(Mode::Fleet))
            };
            push(out, kind);
            return;
        }
        let remaining: BTreeSet<String> = existing
            .into_iter()
            .filter(|e| !mine.contains_key(e))
            .collect();
        let uid = o.uid.clone();
        let kind = if !remaining.is_empty() {
            ActionKind::RemoveOwner {
                uid,
                owners: format_owners(&remaining),
            }
        } else if is_kept(o) {
            ActionKind::Keep { uid, rewrite: true }
        } else {
            ActionKind::Prune { uid }
        };
        push(out, kind);
    }
}

/// Plans every copy in `input`; actions are ordered by (cluster, namespace, lower-case kind,
/// name), and within one copy by source.
pub fn plan(input: &PlanInput) -> Vec<Action> {
    let planner = Planner {
        input,
        sources: input
            .sources
            .iter()
            .map(|s| ((s.namespace.as_str(), &s.resource), s))
            .collect(),
        protected: input
            .protected
            .iter()
            .map(|d| {
                (
                    CopyKey::new(&d.cluster, &d.namespace, &d.resource),
                    &d.helmop,
                )
            })
            .collect(),
    };
    let mut observed: BTreeMap<CopyKey<'_>, &ObservedCopy> = BTreeMap::new();
    for o in &input.observed {
        // The API server allows one object per name; a duplicate is the caller's repeat.
        observed
            .entry(CopyKey::new(&o.cluster, &o.namespace, &o.resource))
            .or_insert(o);
    }
    let mut desired: BTreeMap<CopyKey<'_>, Vec<&DesiredCopy>> = BTreeMap::new();
    for d in &input.desired {
        desired
            .entry(CopyKey::new(&d.cluster, &d.namespace, &d.resource))
            .or_default()
            .push(d);
    }
    let keys: BTreeSet<CopyKey<'_>> = observed.keys().chain(desired.keys()).copied().collect();
    let mut out = Vec::new();
    for at in keys {
        let seen = observed.get(&at).copied();
        match desired.get(&at) {
            Some(wants) => planner.desired(&at, wants, seen, &mut out),
            None => {
                if let Some(o) = seen {
                    planner.undesired(&at, o, &mut out);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests;
