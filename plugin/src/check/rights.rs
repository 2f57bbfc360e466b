//! What the current user needs on the cluster of the current context to run `propagate`, `prune`
//! and `rollout`: the one list `check` asks the API server about (SelfSubjectAccessReview). It
//! follows the requests those commands make upstream (the readers in `sources`, `inventory`,
//! `clusters`, `identity` and `workloads`; the Events of `observe`); what they write downstream goes
//! through each Cluster's own kubeconfig and is not the current user's to check here.
//! `manifests/propagator/rbac.yaml` and `manifests/rollout-watcher/rbac.yaml` grant a superset
//! (the watches and Leases of `--watch`); a test keeps this list inside them.

/// Where a right is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// In the namespace `check` was given (`-n`), else in every namespace.
    Namespace,
    /// Cluster-scoped resources.
    Cluster,
}

/// One verb on one resource, needed by one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Right {
    pub command: &'static str,
    pub verb: &'static str,
    /// API group; empty for the core group.
    pub group: &'static str,
    pub resource: &'static str,
    /// Only this object (e.g. namespace `kube-system`, read for the upstream's identity).
    pub name: Option<&'static str>,
    pub scope: Scope,
}

const fn ns(
    command: &'static str,
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
) -> Right {
    Right {
        command,
        verb,
        group,
        resource,
        name: None,
        scope: Scope::Namespace,
    }
}

const FLEET: &str = "fleet.cattle.io";

/// Reads both `propagate` and `prune` start with: the HelmOps, the Fleet objects their targets
/// resolve through, the sources, and the upstream's identity.
macro_rules! fleet_reads {
    ($command:literal) => {
        [
            ns($command, "list", FLEET, "helmops"),
            ns($command, "list", FLEET, "clusters"),
            ns($command, "list", FLEET, "clustergroups"),
            ns($command, "list", FLEET, "bundlenamespacemappings"),
            ns($command, "get", "", "secrets"),
            ns($command, "get", "", "configmaps"),
            Right {
                command: $command,
                verb: "list",
                group: "",
                resource: "namespaces",
                name: None,
                scope: Scope::Cluster,
            },
            Right {
                command: $command,
                verb: "get",
                group: "",
                resource: "namespaces",
                name: Some("kube-system"),
                scope: Scope::Cluster,
            },
        ]
    };
}

const PROPAGATE: [Right; 8] = fleet_reads!("propagate");
const PROPAGATE_MORE: [Right; 3] = [
    ns("propagate", "list", FLEET, "policies"),
    ns("propagate", "list", FLEET, "bundles"),
    ns("propagate", "create", "events.k8s.io", "events"),
];
const PRUNE: [Right; 8] = fleet_reads!("prune");
const ROLLOUT: [Right; 9] = [
    ns("rollout", "get", "apps", "deployments"),
    ns("rollout", "patch", "apps", "deployments"),
    ns("rollout", "get", "apps", "statefulsets"),
    ns("rollout", "patch", "apps", "statefulsets"),
    ns("rollout", "get", "apps", "daemonsets"),
    ns("rollout", "patch", "apps", "daemonsets"),
    ns("rollout", "get", "batch", "cronjobs"),
    ns("rollout", "patch", "batch", "cronjobs"),
    // Whether the namespace opts the workload in.
    Right {
        command: "rollout",
        verb: "get",
        group: "",
        resource: "namespaces",
        name: None,
        scope: Scope::Cluster,
    },
];

/// Every right, grouped by command in the order `check` reports them.
pub fn rights() -> Vec<Right> {
    PROPAGATE
        .iter()
        .chain(&PROPAGATE_MORE)
        .chain(&PRUNE)
        .chain(&ROLLOUT)
        .copied()
        .collect()
}

impl Right {
    /// `list fleet.cattle.io/helmops`, `get namespaces/kube-system`.
    pub fn describe(&self) -> String {
        let mut s = format!("{} ", self.verb);
        if !self.group.is_empty() {
            s.push_str(self.group);
            s.push('/');
        }
        s.push_str(self.resource);
        if let Some(name) = self.name {
            s.push('/');
            s.push_str(name);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The (group, resource, verb) triples a manifest's RBAC rules grant.
    fn granted(yaml: &str) -> Vec<(String, String, String)> {
        let mut out = Vec::new();
        for doc in serde_saphyr::from_multiple::<serde_json::Value>(yaml).unwrap_or_default() {
            for rule in doc["rules"].as_array().into_iter().flatten() {
                let list = |key: &str| -> Vec<String> {
                    rule[key]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                };
                for g in list("apiGroups") {
                    for r in list("resources") {
                        for v in list("verbs") {
                            out.push((g.clone(), r.clone(), v.clone()));
                        }
                    }
                }
            }
        }
        out
    }

    #[test]
    fn the_shipped_rbac_grants_every_right() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests");
        let read = |p: &str| std::fs::read_to_string(root.join(p)).unwrap_or_default();
        let propagator = granted(&read("propagator/rbac.yaml"));
        let watcher = granted(&read("rollout-watcher/rbac.yaml"));
        assert!(!propagator.is_empty() && !watcher.is_empty());
        for right in rights() {
            let rbac = if right.command == "rollout" {
                &watcher
            } else {
                &propagator
            };
            // `prune` reads what `propagate` reads, so the propagator's role covers both. RBAC
            // implies no verb from another, so the verb itself must be granted.
            let want = (
                right.group.to_owned(),
                right.resource.to_owned(),
                right.verb.to_owned(),
            );
            assert!(
                rbac.contains(&want),
                "{} for {} not granted by the shipped RBAC",
                right.describe(),
                right.command
            );
        }
    }

    #[test]
    fn described() {
        let all = rights();
        assert!(
            all.iter()
                .any(|r| r.describe() == "list fleet.cattle.io/helmops")
        );
        assert!(
            all.iter()
                .any(|r| r.describe() == "get namespaces/kube-system")
        );
        assert!(all.iter().any(|r| r.describe() == "patch apps/deployments"));
    }
}
