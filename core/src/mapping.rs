//! Which namespaces' Clusters a HelmOp may target: Fleet v0.16's `BundleNamespaceMapping`
//! (rancher/fleet `internal/cmd/controller/target/builder.go` `getNamespacesForBundle` and
//! `target/mapping.go`).
//!
//! - The HelmOp's own namespace is always a candidate.
//! - Only mappings in the HelmOp's namespace count.
//! - A mapping needs both `bundleSelector` and `namespaceSelector`; without either it matches
//!   nothing. `{}` matches everything, as for any label selector.
//! - `bundleSelector` is matched against the labels of the Bundle Fleet's HelmOp controller makes
//!   (`helmops/reconciler/helmop_controller.go` `calculateBundle`): the HelmOp's `spec.labels`
//!   plus `fleet.cattle.io/fleet-helm-name: <HelmOp name>`, which wins over a same-named entry of
//!   `spec.labels`. The HelmOp's own `metadata.labels` never reach the Bundle.
//! - `namespaceSelector` is matched against the labels of every Namespace; each one it selects
//!   is a candidate.
//! - A mapping with a selector Fleet cannot compile is skipped (Fleet logs it and goes on with
//!   the others); [`Mappings::skipped`] says which and why.
//!
//! Which Clusters of a candidate namespace get the HelmOp is then ordinary targeting
//! ([`crate::targeting`]): the ClusterGroups that count are those of the Cluster's own namespace
//! (Fleet's `ClusterGroupsForCluster` lists groups in `cluster.Namespace`).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Namespace;

use crate::model::{BundleNamespaceMapping, HelmOp};
use crate::names::FLEET_HELMOP_LABEL;
use crate::selector::Selector;

/// The labels of the Bundle Fleet makes from `op`.
pub fn bundle_labels(op: &HelmOp) -> BTreeMap<String, String> {
    let mut labels = op.spec.labels.clone().unwrap_or_default();
    labels.insert(
        FLEET_HELMOP_LABEL.to_string(),
        op.metadata.name.clone().unwrap_or_default(),
    );
    labels
}

/// A mapping Fleet skips because one of its selectors does not compile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedMapping {
    /// `namespace/name` of the mapping.
    pub mapping: String,
    /// e.g. `bundleSelector.matchLabels.in valid: ...`
    pub reason: String,
}

struct Compiled {
    namespace: String,
    bundles: Selector,
    namespaces: Selector,
}

/// Mappings compiled once, then asked about any number of HelmOps.
pub struct Mappings {
    compiled: Vec<Compiled>,
    skipped: Vec<SkippedMapping>,
}

impl Mappings {
    pub fn new(mappings: &[BundleNamespaceMapping]) -> Self {
        let mut compiled = Vec::new();
        let mut skipped = Vec::new();
        for m in mappings {
            let (Some(bundles), Some(namespaces)) = (&m.bundle_selector, &m.namespace_selector)
            else {
                continue;
            };
            let namespace = m.metadata.namespace.clone().unwrap_or_default();
            let compile = |sel, field: &str| {
                Selector::compile(sel).map_err(|e| SkippedMapping {
                    mapping: format!(
                        "{namespace}/{}",
                        m.metadata.name.as_deref().unwrap_or_default()
                    ),
                    reason: format!("{field}.{e}"),
                })
            };
            match (
                compile(bundles, "bundleSelector"),
                compile(namespaces, "namespaceSelector"),
            ) {
                (Ok(bundles), Ok(namespaces)) => compiled.push(Compiled {
                    namespace,
                    bundles,
                    namespaces,
                }),
                (Err(e), _) | (_, Err(e)) => skipped.push(e),
            }
        }
        Mappings { compiled, skipped }
    }

    /// Mappings Fleet ignores because a selector is invalid.
    pub fn skipped(&self) -> &[SkippedMapping] {
        &self.skipped
    }

    fn selecting<'a>(&'a self, op: &HelmOp) -> impl Iterator<Item = &'a Compiled> {
        let namespace = op.metadata.namespace.clone().unwrap_or_default();
        let labels = bundle_labels(op);
        self.compiled
            .iter()
            .filter(move |c| c.namespace == namespace && c.bundles.matches(&labels))
    }

    /// Whether some mapping selects `op`, i.e. whether Namespaces must be read to know its
    /// candidates (callers skip listing Namespaces when no HelmOp is mapped).
    pub fn maps(&self, op: &HelmOp) -> bool {
        self.selecting(op).next().is_some()
    }

    /// The namespaces any mapping of `namespace` selects, whatever Bundles it selects: where a
    /// HelmOp of `namespace` may have had copies through a mapping that no longer selects it
    /// (the HelmOp deleted or relabelled). Does not include `namespace` itself.
    pub fn reachable_from(&self, namespace: &str, namespaces: &[Namespace]) -> BTreeSet<String> {
        let here: Vec<&Compiled> = self
            .compiled
            .iter()
            .filter(|c| c.namespace == namespace)
            .collect();
        let none = BTreeMap::new();
        namespaces
            .iter()
            .filter(|ns| {
                let labels = ns.metadata.labels.as_ref().unwrap_or(&none);
                here.iter().any(|c| c.namespaces.matches(labels))
            })
            .filter_map(|ns| ns.metadata.name.clone())
            .filter(|name| name != namespace)
            .collect()
    }

    /// Whether some valid mapping lives in `namespace`.
    pub fn any_in(&self, namespace: &str) -> bool {
        self.compiled.iter().any(|c| c.namespace == namespace)
    }

    /// The namespaces whose Clusters `op` may target: its own, and every Namespace of
    /// `namespaces` that a mapping selecting `op` selects.
    pub fn candidate_namespaces(&self, op: &HelmOp, namespaces: &[Namespace]) -> BTreeSet<String> {
        let mut out = BTreeSet::new();
        if let Some(own) = &op.metadata.namespace {
            out.insert(own.clone());
        }
        let selecting: Vec<&Compiled> = self.selecting(op).collect();
        if selecting.is_empty() {
            return out;
        }
        let none = BTreeMap::new();
        for ns in namespaces {
            let Some(name) = &ns.metadata.name else {
                continue;
            };
            let labels = ns.metadata.labels.as_ref().unwrap_or(&none);
            if selecting.iter().any(|c| c.namespaces.matches(labels)) {
                out.insert(name.clone());
            }
        }
        out
    }
}

/// [`Mappings::candidate_namespaces`] for one HelmOp.
pub fn candidate_namespaces(
    op: &HelmOp,
    mappings: &[BundleNamespaceMapping],
    namespaces: &[Namespace],
) -> BTreeSet<String> {
    Mappings::new(mappings).candidate_namespaces(op, namespaces)
}

#[cfg(test)]
mod tests;
