//! Which target of a HelmOp a Cluster falls under, and the options that follow for it:
//! Fleet v0.16.1's semantics, read from rancher/fleet `internal/cmd/controller/target/builder.go`
//! (`Targets`), `target/matcher/bundlematch.go` and `options/calculate.go` (`Merge`);
//! docs/fleet-parity.md.
//!
//! - Fleet's HelmOp controller turns `spec.targets` into the Bundle's targets unchanged; none at
//!   all becomes the single target `{name: default, clusterGroup: default}`.
//! - With `targetRestrictions` (R entries) and T targets, the first `T - R` targets are
//!   customizations (Fleet's fleet.yaml `targetCustomizations`, recognised by position): they
//!   never select a cluster. Without restrictions every target is a regular one.
//! - A cluster is selected by the first regular target that matches it while it also matches
//!   some restriction (for the same group); without restrictions the restriction check is
//!   void. `doNotDeploy` on the selecting target skips the cluster.
//! - Customizations are matched against the selected cluster without the restriction check.
//!   `FirstMatch` (the default): the first matching customization *replaces* the selecting
//!   target's options, and its `doNotDeploy` skips the cluster. `AllMatches`: every matching
//!   customization is merged over the selecting target's options in order, and any of them
//!   with `doNotDeploy` skips the cluster.
//! - The options a cluster gets are Fleet's `Merge(root, target options)`: `namespace` and
//!   `defaultNamespace` are replaced by a later non-empty value, `keepResources` is ORed,
//!   `downstreamResources` are merged by `lower(kind)|name` keeping the first position. The
//!   destination namespace is then `namespace`, else `defaultNamespace`, else `default`.
//! - A target's criteria are ANDed: `clusterName` (equal to the Cluster's name or to its
//!   `management.cattle.io/cluster-display-name` label), `clusterSelector` (on the Cluster's
//!   labels), `clusterGroup` (a group's name), `clusterGroupSelector` (a group's own labels).
//!   Empty strings and absent selectors are no criterion; a present selector `{}` matches all.
//!   A target with no criterion matches nothing.
//! - The Cluster's groups are the ClusterGroups of its namespace whose `spec.selector` matches
//!   its labels (groups without a selector, or with an invalid one, contain nothing). The group
//!   criteria must hold for one and the same group. A cluster in no group is tested with an
//!   empty group name and no group labels, so `clusterGroupSelector: {}` still matches it, as
//!   in Fleet.
//! - An invalid selector anywhere in `targets`/`targetRestrictions` makes Fleet fail the whole
//!   HelmOp (`matcher.New` compiles them all first): [`match_cluster`] returns an error.
//! - `namespaceLabels`/`namespaceAnnotations` do not depend on the cluster: Fleet merges the
//!   root ones with those of *every* target, in order ([`namespace_metadata`]).
//! - A Cluster whose name is not a label value (a valid object name of more than 63 characters)
//!   never gets a BundleDeployment, from any Bundle ([`never_deployed_to`]).
//! - `rolloutStrategy.partitions` narrow the matched clusters to those some partition holds,
//!   and an unreadable rollout value fails the whole Bundle ([`partitions`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::model::{BundleTarget, Cluster, ClusterGroup, DownstreamResource, HelmOp, HelmOpSpec};
use crate::names::FLEET_DISPLAY_NAME_LABEL;
use crate::resource::ResourceRef;
use crate::selector::{Selector, SelectorError};

pub mod helm_values;
pub mod namespace_gate;
pub mod partitions;

/// Label Fleet's Bundle controller writes on every BundleDeployment with its Cluster's name.
pub const BUNDLE_DEPLOYMENT_CLUSTER_LABEL: &str = "fleet.cattle.io/cluster";

/// Why Fleet never creates a BundleDeployment on `cluster`, or `None` when it can: Fleet writes
/// the Cluster's name into [`BUNDLE_DEPLOYMENT_CLUSTER_LABEL`] of each (rancher/fleet
/// `target/target.go` `BundleDeploymentLabels`), so a name that is not a label value fails every
/// create, for every Bundle, whichever target selects it (the other clusters are served).
pub fn never_deployed_to(cluster: &Cluster) -> Option<String> {
    let name = cluster.metadata.name.as_deref()?;
    let problem = crate::name_rules::label_value_error(name)?;
    Some(format!(
        "Fleet writes the Cluster's name into the label {BUNDLE_DEPLOYMENT_CLUSTER_LABEL} of every BundleDeployment, and as a label value it {problem} (has {}): Fleet never deploys anything there",
        name.len()
    ))
}

/// Where a cluster stands with respect to a HelmOp.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TargetMatch {
    /// Deploy. `target_index` indexes `spec.targets` (the regular target that selects the
    /// cluster); `None` is Fleet's implicit default target. `customizations` are the indices of
    /// the customization targets applied, in order (at most one in `FirstMatch` mode).
    Matched {
        target_index: Option<usize>,
        customizations: Vec<usize>,
    },
    /// The selecting target, or a customization applied to it, says `doNotDeploy: true`;
    /// `target_index` is that target.
    DoNotDeploy { target_index: usize },
    /// No target selects the cluster.
    NoMatch,
}

impl TargetMatch {
    pub fn is_deployed(&self) -> bool {
        matches!(self, TargetMatch::Matched { .. })
    }

    /// Selected by `target_index` with no customization applied.
    pub fn selected(target_index: Option<usize>) -> TargetMatch {
        TargetMatch::Matched {
            target_index,
            customizations: Vec::new(),
        }
    }
}

/// A selector in the HelmOp that Fleet cannot compile, so Fleet targets nothing.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{path}.{}: {}", .source.path, .source.message)]
pub struct TargetingError {
    /// e.g. `spec.targets[2].clusterSelector`
    pub path: String,
    pub source: SelectorError,
}

/// The options Fleet would use on one cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterOptions {
    /// Destination namespace of the copies: target/root `namespace`, else target/root
    /// `defaultNamespace`, else `default`.
    pub namespace: String,
    /// Root and target `downstreamResources` merged, de-duplicated by `lower(kind)|name`,
    /// in Fleet's order (root entries first, then new target entries). Entries of other kinds
    /// are left out (validation denies them).
    pub resources: Vec<ResourceRef>,
    /// `keepResources`, root OR target.
    pub keep_resources: bool,
}

/// The criteria of a target or target restriction.
struct Criteria {
    cluster_name: Option<String>,
    cluster_group: Option<String>,
    cluster_selector: Option<Selector>,
    cluster_group_selector: Option<Selector>,
}

impl Criteria {
    fn compile(
        path: String,
        cluster_name: Option<&str>,
        cluster_group: Option<&str>,
        cluster_selector: Option<&LabelSelector>,
        cluster_group_selector: Option<&LabelSelector>,
    ) -> Result<Self, TargetingError> {
        let compile = |sel: Option<&LabelSelector>, field: &str| {
            sel.map(Selector::compile)
                .transpose()
                .map_err(|source| TargetingError {
                    path: format!("{path}.{field}"),
                    source,
                })
        };
        Ok(Criteria {
            cluster_name: cluster_name.filter(|s| !s.is_empty()).map(str::to_string),
            cluster_group: cluster_group.filter(|s| !s.is_empty()).map(str::to_string),
            cluster_selector: compile(cluster_selector, "clusterSelector")?,
            cluster_group_selector: compile(cluster_group_selector, "clusterGroupSelector")?,
        })
    }

    fn is_empty(&self) -> bool {
        self.cluster_name.is_none()
            && self.cluster_group.is_none()
            && self.cluster_selector.is_none()
            && self.cluster_group_selector.is_none()
    }

    /// Fleet's `ClusterMatcher.Match` for one (cluster, group) pair.
    fn matches(&self, cluster: &ClusterView<'_>, group: &GroupView<'_>) -> bool {
        if self.is_empty() {
            return false;
        }
        if let Some(name) = &self.cluster_name
            && cluster.name != name
            && cluster.labels.get(FLEET_DISPLAY_NAME_LABEL) != Some(name)
        {
            return false;
        }
        if let Some(g) = &self.cluster_group
            && group.name != g
        {
            return false;
        }
        if let Some(sel) = &self.cluster_group_selector
            && !sel.matches(group.labels)
        {
            return false;
        }
        if let Some(sel) = &self.cluster_selector
            && !sel.matches(cluster.labels)
        {
            return false;
        }
        true
    }
}

struct ClusterView<'a> {
    name: &'a str,
    labels: &'a BTreeMap<String, String>,
}

struct GroupView<'a> {
    name: &'a str,
    labels: &'a BTreeMap<String, String>,
}

static NO_LABELS: BTreeMap<String, String> = BTreeMap::new();

fn labels_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> &BTreeMap<String, String> {
    meta.labels.as_ref().unwrap_or(&NO_LABELS)
}

/// The ClusterGroups `cluster` belongs to: same namespace, selector present, valid and matching.
pub fn cluster_groups_for<'g>(
    cluster: &Cluster,
    groups: &'g [ClusterGroup],
) -> Vec<&'g ClusterGroup> {
    let labels = labels_of(&cluster.metadata);
    groups
        .iter()
        .filter(|g| g.metadata.namespace == cluster.metadata.namespace)
        .filter(|g| {
            g.spec
                .selector
                .as_ref()
                .and_then(|s| Selector::compile(s).ok())
                .is_some_and(|s| s.matches(labels))
        })
        .collect()
}

/// The groups a cluster is tested with: those it belongs to, or (in none) one with an empty
/// name and no labels, as Fleet evaluates it.
fn group_views<'g>(cluster: &Cluster, groups: &'g [ClusterGroup]) -> Vec<GroupView<'g>> {
    let mut views: Vec<GroupView<'g>> = cluster_groups_for(cluster, groups)
        .iter()
        .map(|g| GroupView {
            name: g.metadata.name.as_deref().unwrap_or_default(),
            labels: labels_of(&g.metadata),
        })
        .collect();
    if views.is_empty() {
        views.push(GroupView {
            name: "",
            labels: &NO_LABELS,
        });
    }
    views
}

fn default_target() -> BundleTarget {
    BundleTarget {
        name: Some("default".into()),
        cluster_group: Some("default".into()),
        ..BundleTarget::default()
    }
}

/// Decides which target of `op` (if any) covers `cluster`. `groups` may hold ClusterGroups of
/// any namespace; only those of the cluster's namespace count. The caller is responsible for
/// only asking about clusters of the HelmOp's candidate namespaces (its own and those of
/// [`crate::mapping`]). For many clusters, compile once with [`Matcher::new`].
pub fn match_cluster(
    op: &HelmOp,
    cluster: &Cluster,
    groups: &[ClusterGroup],
) -> Result<TargetMatch, TargetingError> {
    Ok(Matcher::new(op)?.match_cluster(cluster, groups))
}

/// A HelmOp's targets and restrictions, compiled once (selectors validated) and then matched
/// against any number of clusters.
pub struct Matcher {
    targets: Vec<Criteria>,
    do_not_deploy: Vec<bool>,
    restrictions: Vec<Criteria>,
    /// The first `customizations` targets are customizations only (Fleet's positional split).
    customizations: usize,
    all_matches: bool,
    /// No `spec.targets`: the single target is Fleet's implicit default.
    implicit_default: bool,
    /// Which targets a cluster can match by its names ([`ByName`]).
    by_name: ByName,
}

/// The targets a cluster can match at all, found without testing every target: a target with a
/// `clusterName` matches only the cluster of that name or display name. A HelmOp that names
/// each of its N clusters in a target of its own otherwise cost N x N comparisons per run (at
/// 10,000 clusters, a tenth of a watcher's CPU; docs/performance.md, "One thread").
#[derive(Default)]
struct ByName {
    /// Targets with a `clusterName`, by that name, each list ascending.
    named: HashMap<String, Vec<usize>>,
    /// Every other target, ascending.
    unnamed: Vec<usize>,
    /// Test only: hand out every one of this many targets, to check the index against a plain
    /// scan.
    #[cfg(test)]
    scan_all: Option<usize>,
}

impl ByName {
    fn new(targets: &[Criteria]) -> Self {
        let mut by_name = ByName::default();
        for (i, criteria) in targets.iter().enumerate() {
            match &criteria.cluster_name {
                Some(name) => by_name.named.entry(name.clone()).or_default().push(i),
                None => by_name.unnamed.push(i),
            }
        }
        by_name
    }

    /// The indices of the targets that may match `cluster`, ascending (Fleet's order of trial).
    /// Borrowed when no target names the cluster, the common case of selector targets: nothing
    /// is allocated per cluster then.
    fn candidates(&self, cluster: &ClusterView<'_>) -> Cow<'_, [usize]> {
        #[cfg(test)]
        if let Some(all) = self.scan_all {
            return Cow::Owned((0..all).collect());
        }
        let display = cluster
            .labels
            .get(FLEET_DISPLAY_NAME_LABEL)
            .map(String::as_str)
            .filter(|d| *d != cluster.name);
        let mut named = std::iter::once(cluster.name)
            .chain(display)
            .filter_map(|name| self.named.get(name))
            .peekable();
        if named.peek().is_none() {
            return Cow::Borrowed(&self.unnamed);
        }
        let mut out = self.unnamed.clone();
        for targets in named {
            out.extend_from_slice(targets);
        }
        out.sort_unstable();
        Cow::Owned(out)
    }
}

/// How many leading targets Fleet treats as customizations: `targets - restrictions` when
/// there are restrictions (`determineIsCustomization`), else none. The implicit default
/// target counts as one target.
pub fn customization_count(op: &HelmOp) -> usize {
    let restrictions = op.spec.target_restrictions().len();
    if restrictions == 0 {
        return 0;
    }
    op.spec.targets().len().max(1).saturating_sub(restrictions)
}

impl Matcher {
    /// Compiles every selector like Fleet does up front; one invalid selector fails the HelmOp.
    pub fn new(op: &HelmOp) -> Result<Self, TargetingError> {
        let implicit_default = op.spec.targets().is_empty();
        let defaulted;
        let targets: &[BundleTarget] = if implicit_default {
            defaulted = [default_target()];
            &defaulted
        } else {
            op.spec.targets()
        };
        let compiled = targets
            .iter()
            .enumerate()
            .map(|(i, t)| {
                Criteria::compile(
                    format!("spec.targets[{i}]"),
                    t.cluster_name.as_deref(),
                    t.cluster_group.as_deref(),
                    t.cluster_selector.as_ref(),
                    t.cluster_group_selector.as_ref(),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let restrictions = op
            .spec
            .target_restrictions()
            .iter()
            .enumerate()
            .map(|(i, r)| {
                Criteria::compile(
                    format!("spec.targetRestrictions[{i}]"),
                    r.cluster_name.as_deref(),
                    r.cluster_group.as_deref(),
                    r.cluster_selector.as_ref(),
                    r.cluster_group_selector.as_ref(),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Matcher {
            by_name: ByName::new(&compiled),
            targets: compiled,
            do_not_deploy: targets.iter().map(BundleTarget::do_not_deploy).collect(),
            restrictions,
            customizations: customization_count(op),
            all_matches: op.spec.all_matches(),
            implicit_default,
        })
    }

    /// The same matcher testing every target in turn, as Fleet does: the oracle of [`ByName`].
    #[cfg(test)]
    fn scanning_all(mut self) -> Self {
        self.by_name.scan_all = Some(self.targets.len());
        self
    }

    /// See [`match_cluster`].
    pub fn match_cluster(&self, cluster: &Cluster, groups: &[ClusterGroup]) -> TargetMatch {
        self.decide(cluster, groups, false)
    }

    /// Like [`Matcher::match_cluster`], but the cluster counts as selected by the implicit
    /// root target when no regular target selects it (customizations and `doNotDeploy` still
    /// apply): how `--target-context` treats a kubeconfig context.
    pub fn match_or_root(&self, cluster: &Cluster, groups: &[ClusterGroup]) -> TargetMatch {
        self.decide(cluster, groups, true)
    }

    fn decide(&self, cluster: &Cluster, groups: &[ClusterGroup], or_root: bool) -> TargetMatch {
        let view = ClusterView {
            name: cluster.metadata.name.as_deref().unwrap_or_default(),
            labels: labels_of(&cluster.metadata),
        };
        let group_views = group_views(cluster, groups);
        let hits = |criteria: &Criteria, restricted: bool| {
            group_views.iter().any(|g| {
                criteria.matches(&view, g)
                    && (!restricted
                        || self.restrictions.is_empty()
                        || self.restrictions.iter().any(|r| r.matches(&view, g)))
            })
        };
        let candidates = self.by_name.candidates(&view);
        let selected = candidates
            .iter()
            .copied()
            .filter(|&i| i >= self.customizations)
            .find(|&i| hits(&self.targets[i], true));
        let target_index = match selected {
            Some(i) if self.do_not_deploy[i] => {
                return TargetMatch::DoNotDeploy { target_index: i };
            }
            Some(i) => (!self.implicit_default).then_some(i),
            None if or_root => None,
            None => return TargetMatch::NoMatch,
        };
        let mut matching = candidates
            .iter()
            .copied()
            .take_while(|&i| i < self.customizations)
            .filter(|&i| hits(&self.targets[i], false));
        let customizations: Vec<usize> = if self.all_matches {
            matching.collect()
        } else {
            matching.next().into_iter().collect()
        };
        if let Some(&i) = customizations.iter().find(|&&i| self.do_not_deploy[i]) {
            return TargetMatch::DoNotDeploy { target_index: i };
        }
        TargetMatch::Matched {
            target_index,
            customizations,
        }
    }
}

/// The options one layer of Fleet's `Merge` contributes (root, a target, a customization).
struct Layer<'a> {
    namespace: Option<&'a str>,
    default_namespace: Option<&'a str>,
    resources: &'a [DownstreamResource],
    keep_resources: bool,
}

impl<'a> Layer<'a> {
    fn root(spec: &'a HelmOpSpec) -> Self {
        Layer {
            namespace: spec.namespace(),
            default_namespace: spec.default_namespace(),
            resources: spec.downstream_resources(),
            keep_resources: spec.keep_resources(),
        }
    }

    fn target(t: &'a BundleTarget) -> Self {
        Layer {
            namespace: t.namespace(),
            default_namespace: t.default_namespace(),
            resources: t.downstream_resources(),
            keep_resources: t.keep_resources(),
        }
    }
}

/// The targets whose options Fleet merges over the root ones for a cluster, in order.
/// FirstMatch: the customization replaces the selecting target's options outright;
/// AllMatches: customizations merge over them (builder.go `Targets`).
fn merged_targets<'a>(
    spec: &'a HelmOpSpec,
    target_index: Option<&usize>,
    customizations: &[usize],
) -> Vec<&'a BundleTarget> {
    let target = |i: &usize| spec.targets().get(*i);
    let mut out = Vec::new();
    if customizations.is_empty() || spec.all_matches() {
        out.extend(target_index.and_then(target));
    }
    out.extend(customizations.iter().filter_map(target));
    out
}

/// The helm options Fleet's `options.Merge` gives a cluster the HelmOp deploys to (root, then
/// the merged targets); `None` unless `m` is `Matched`.
pub fn cluster_helm(op: &HelmOp, m: &TargetMatch) -> Option<helm_values::MergedHelm> {
    let TargetMatch::Matched {
        target_index,
        customizations,
    } = m
    else {
        return None;
    };
    let spec = &op.spec;
    let mut merged = helm_values::MergedHelm::default();
    merged.merge(spec.helm.as_ref());
    for t in merged_targets(spec, target_index.as_ref(), customizations) {
        merged.merge(t.helm.as_ref());
    }
    Some(merged)
}

/// The merged options for a cluster the HelmOp deploys to; `None` unless `m` is `Matched`.
pub fn cluster_options(op: &HelmOp, m: &TargetMatch) -> Option<ClusterOptions> {
    let TargetMatch::Matched {
        target_index,
        customizations,
    } = m
    else {
        return None;
    };
    let spec = &op.spec;
    let mut layers = vec![Layer::root(spec)];
    layers.extend(
        merged_targets(spec, target_index.as_ref(), customizations)
            .into_iter()
            .map(Layer::target),
    );

    // A later non-empty value replaces an earlier one (`Merge`).
    let namespace = layers
        .iter()
        .rev()
        .find_map(|l| l.namespace)
        .or_else(|| layers.iter().rev().find_map(|l| l.default_namespace))
        .unwrap_or("default")
        .to_string();
    let mut resources: Vec<ResourceRef> = Vec::new();
    for r in layers
        .iter()
        .flat_map(|l| l.resources)
        .filter_map(|e| e.to_ref())
    {
        if !resources.contains(&r) {
            resources.push(r);
        }
    }
    Some(ClusterOptions {
        namespace,
        resources,
        keep_resources: layers.iter().any(|l| l.keep_resources),
    })
}

/// Labels and annotations for a HelmOp's destination namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NamespaceMetadata {
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

/// Fleet's agent never sets labels of this prefix from a bundle's options (`deployer.go`
/// `addLabelsFromOptions`: a bundle must not change pod-security enforcement).
pub const POD_SECURITY_LABEL_PREFIX: &str = "pod-security.kubernetes.io/";

/// The `namespaceLabels`/`namespaceAnnotations` Fleet gives a HelmOp's BundleDeployments: the
/// root ones, then those of every target in order, later keys winning, whichever target
/// selected the cluster (`target.go` `BundleDeployment`); labels with the pod-security prefix
/// are left out as Fleet's agent leaves them out.
pub fn namespace_metadata(op: &HelmOp) -> NamespaceMetadata {
    let spec = &op.spec;
    let mut out = NamespaceMetadata::default();
    let labels = std::iter::once(&spec.namespace_labels)
        .chain(spec.targets().iter().map(|t| &t.namespace_labels))
        .flatten();
    for map in labels {
        for (k, v) in map {
            if !k.starts_with(POD_SECURITY_LABEL_PREFIX) {
                out.labels.insert(k.clone(), v.clone());
            }
        }
    }
    let annotations = std::iter::once(&spec.namespace_annotations)
        .chain(spec.targets().iter().map(|t| &t.namespace_annotations))
        .flatten();
    for map in annotations {
        out.annotations
            .extend(map.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    out
}

/// Metadata for one namespace wanted by several HelmOps (given in a stable order): the union
/// of theirs, except keys on which two of them disagree, which are left unset (Fleet's agents
/// would overwrite each other there) and named in `conflicts` (`label k`, `annotation k`).
pub fn combine_namespace_metadata<'a>(
    all: impl IntoIterator<Item = &'a NamespaceMetadata>,
) -> (NamespaceMetadata, Vec<String>) {
    fn merge(
        into: &mut BTreeMap<String, String>,
        from: &BTreeMap<String, String>,
        disputed: &mut BTreeSet<String>,
    ) {
        for (k, v) in from {
            match into.get(k) {
                Some(old) if old != v => {
                    disputed.insert(k.clone());
                }
                _ => {
                    into.insert(k.clone(), v.clone());
                }
            }
        }
    }
    let mut out = NamespaceMetadata::default();
    let (mut bad_labels, mut bad_annotations) = (BTreeSet::new(), BTreeSet::new());
    for m in all {
        merge(&mut out.labels, &m.labels, &mut bad_labels);
        merge(&mut out.annotations, &m.annotations, &mut bad_annotations);
    }
    let mut conflicts = Vec::new();
    for k in &bad_labels {
        out.labels.remove(k);
        conflicts.push(format!("label {k}"));
    }
    for k in &bad_annotations {
        out.annotations.remove(k);
        conflicts.push(format!("annotation {k}"));
    }
    (out, conflicts)
}

#[cfg(test)]
mod tests;
