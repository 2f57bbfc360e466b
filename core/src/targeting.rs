//! Which target of a HelmOp a Cluster falls under, and the options that follow for it:
//! Fleet v0.16's semantics (rancher/fleet `internal/cmd/controller/target/matcher` and
//! `internal/cmd/controller/options.Merge`), DESIGN section 2.
//!
//! - Targets are tried in order; the first that matches wins. `doNotDeploy` on that target
//!   skips the cluster (later targets are not consulted).
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
//! - No targets at all means Fleet's default `{name: default, clusterGroup: default}`.
//! - A non-empty `targetRestrictions` is an allow list: the cluster (with the same group) must
//!   also match one restriction. (Fleet additionally treats the leading targets of a bundle with
//!   restrictions as fleet.yaml customizations; HelmOps do not have those, and helmop does not
//!   model that split - `validate` warns about `targetRestrictions` on a HelmOp.)
//! - An invalid selector anywhere in `targets`/`targetRestrictions` makes Fleet fail the whole
//!   HelmOp: [`match_cluster`] returns an error.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::model::{BundleTarget, Cluster, ClusterGroup, HelmOp};
use crate::names::FLEET_DISPLAY_NAME_LABEL;
use crate::resource::ResourceRef;
use crate::selector::{Selector, SelectorError};

/// Where a cluster stands with respect to a HelmOp.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetMatch {
    /// Deploy. `target_index` indexes `spec.targets`; `None` is Fleet's implicit default target.
    Matched { target_index: Option<usize> },
    /// The first matching target says `doNotDeploy: true`.
    DoNotDeploy { target_index: usize },
    /// No target matches.
    NoMatch,
}

impl TargetMatch {
    pub fn is_deployed(&self) -> bool {
        matches!(self, TargetMatch::Matched { .. })
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
    /// No `spec.targets`: the single target is Fleet's implicit default.
    implicit_default: bool,
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
            targets: compiled,
            do_not_deploy: targets.iter().map(BundleTarget::do_not_deploy).collect(),
            restrictions,
            implicit_default,
        })
    }

    /// See [`match_cluster`].
    pub fn match_cluster(&self, cluster: &Cluster, groups: &[ClusterGroup]) -> TargetMatch {
        let view = ClusterView {
            name: cluster.metadata.name.as_deref().unwrap_or_default(),
            labels: labels_of(&cluster.metadata),
        };
        let member_of = cluster_groups_for(cluster, groups);
        let mut group_views: Vec<GroupView<'_>> = member_of
            .iter()
            .map(|g| GroupView {
                name: g.metadata.name.as_deref().unwrap_or_default(),
                labels: labels_of(&g.metadata),
            })
            .collect();
        if group_views.is_empty() {
            // Fleet evaluates a cluster in no group once, with an empty group name and labels.
            group_views.push(GroupView {
                name: "",
                labels: &NO_LABELS,
            });
        }
        let allowed = |group: &GroupView<'_>| {
            self.restrictions.is_empty()
                || self.restrictions.iter().any(|r| r.matches(&view, group))
        };
        for (i, criteria) in self.targets.iter().enumerate() {
            let hit = group_views
                .iter()
                .any(|g| allowed(g) && criteria.matches(&view, g));
            if !hit {
                continue;
            }
            return if self.do_not_deploy[i] {
                TargetMatch::DoNotDeploy { target_index: i }
            } else {
                TargetMatch::Matched {
                    target_index: (!self.implicit_default).then_some(i),
                }
            };
        }
        TargetMatch::NoMatch
    }
}

/// The merged options for a cluster the HelmOp deploys to; `None` unless `m` is `Matched`.
pub fn cluster_options(op: &HelmOp, m: &TargetMatch) -> Option<ClusterOptions> {
    let TargetMatch::Matched { target_index } = *m else {
        return None;
    };
    let spec = &op.spec;
    let target = target_index.and_then(|i| spec.targets().get(i));
    let namespace = target
        .and_then(BundleTarget::namespace)
        .or(spec.namespace())
        .or(target.and_then(BundleTarget::default_namespace))
        .or(spec.default_namespace())
        .unwrap_or("default")
        .to_string();

    let mut resources: Vec<ResourceRef> = Vec::new();
    let entries = spec.downstream_resources().iter().chain(
        target
            .map(BundleTarget::downstream_resources)
            .unwrap_or_default(),
    );
    for r in entries.filter_map(|e| e.to_ref()) {
        if !resources.contains(&r) {
            resources.push(r);
        }
    }
    Some(ClusterOptions {
        namespace,
        resources,
        keep_resources: spec.keep_resources() || target.is_some_and(BundleTarget::keep_resources),
    })
}

#[cfg(test)]
mod tests;
