//! Whether Fleet's agent has copied the latest downstream resources to a cluster, from what
//! Fleet v0.16.1 records upstream (read in rancher/fleet at tag v0.16.1):
//!
//! - Fleet's bundle controller clones each downstream resource from the HelmOp's namespace into
//!   the cluster's namespace upstream and, when a clone was created or changed, increments the
//!   BundleDeployment's `spec.downstreamResourcesGeneration`
//!   (`internal/cmd/controller/reconciler/bundle_controller.go`, `handleDownstreamObjects`);
//! - the agent copies those clones to the downstream cluster and then sets
//!   `status.downstreamResourcesGeneration` to the spec's
//!   (`internal/cmd/agent/controller/bundledeployment_controller.go`,
//!   `copyResourcesFromUpstream`);
//! - the HelmOp controller records a rejected HelmOp as condition `Accepted` = `False` with the
//!   error as its message, and then updates no Bundle, so no new content is staged
//!   (`internal/cmd/controller/helmops/reconciler/helmop_controller.go`).
//!
//! So the agent is behind while status < spec; when they are equal, the copy is current if it
//! also matches the source (else the controller has not staged the source's change yet).

use serde::Serialize;
use serde_json::Value;

/// Labels Fleet puts on every BundleDeployment (`target.BundleDeploymentLabels`).
pub const BD_BUNDLE_NAME_LABEL: &str = "fleet.cattle.io/bundle-name";
pub const BD_BUNDLE_NAMESPACE_LABEL: &str = "fleet.cattle.io/bundle-namespace";
pub const BD_CLUSTER_LABEL: &str = "fleet.cattle.io/cluster";
pub const BD_CLUSTER_NAMESPACE_LABEL: &str = "fleet.cattle.io/cluster-namespace";

/// Where Fleet's copy stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AgentCopy {
    /// The agent copied the latest staged content and it matches the source.
    Current,
    /// The agent, or Fleet's controller before it, has yet to copy the latest content.
    Pending,
    /// Fleet's controller rejects the HelmOp, so the source's change will not arrive.
    Blocked,
    /// Nothing upstream tells.
    Unknown,
}

impl AgentCopy {
    pub fn as_str(self) -> &'static str {
        match self {
            AgentCopy::Current => "current",
            AgentCopy::Pending => "pending",
            AgentCopy::Blocked => "blocked",
            AgentCopy::Unknown => "unknown",
        }
    }
}

/// What one BundleDeployment says about the copies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Generations {
    /// `namespace/name` of the BundleDeployment.
    pub bundle_deployment: String,
    /// `spec.downstreamResourcesGeneration`: content Fleet's controller staged.
    pub staged: i64,
    /// `status.downstreamResourcesGeneration`: content the agent copied.
    pub copied: i64,
}

/// The BundleDeployment of one HelmOp for one cluster, as far as it could be found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// The cluster is not a Fleet Cluster (a kubeconfig context): no BundleDeployment exists.
    NotFleet,
    /// BundleDeployments could not be listed.
    Failed(String),
    /// None for this cluster.
    Missing,
    Found(Generations),
}

/// Reads the generations of a BundleDeployment (absent fields are 0, as Go's zero value).
pub fn generations(bd: &Value) -> Generations {
    let meta = |key: &str| {
        bd.pointer(&format!("/metadata/{key}"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let int = |ptr: &str| bd.pointer(ptr).and_then(Value::as_i64).unwrap_or(0);
    Generations {
        bundle_deployment: format!("{}/{}", meta("namespace"), meta("name")),
        staged: int("/spec/downstreamResourcesGeneration"),
        copied: int("/status/downstreamResourcesGeneration"),
    }
}

/// The BundleDeployment among `bds` (one HelmOp's) for any of `clusters` (`namespace/name` of
/// Fleet Clusters; other names, such as kubeconfig contexts, are skipped).
pub fn find(bds: &[Value], clusters: &[&str]) -> Lookup {
    let fleet: Vec<(&str, &str)> = clusters
        .iter()
        .filter_map(|c| c.split_once('/'))
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .collect();
    if fleet.is_empty() {
        return Lookup::NotFleet;
    }
    let label = |bd: &Value, key: &str| {
        bd.pointer("/metadata/labels")
            .and_then(|l| l.get(key))
            .and_then(Value::as_str)
            .map(str::to_string)
    };
    bds.iter()
        .find(|bd| {
            fleet.iter().any(|(ns, name)| {
                label(bd, BD_CLUSTER_NAMESPACE_LABEL).as_deref() == Some(ns)
                    && label(bd, BD_CLUSTER_LABEL).as_deref() == Some(name)
            })
        })
        .map_or(Lookup::Missing, |bd| Lookup::Found(generations(bd)))
}

/// The message of a HelmOp's `Accepted` condition when it is `False`.
pub fn rejection(status: Option<&Value>) -> Option<String> {
    let conditions = status?.get("conditions")?.as_array()?;
    let accepted = conditions
        .iter()
        .find(|c| c.get("type").and_then(Value::as_str) == Some("Accepted"))?;
    if accepted.get("status").and_then(Value::as_str) != Some("False") {
        return None;
    }
    let text = |key: &str| {
        accepted
            .get(key)
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
    };
    Some(
        text("message")
            .or_else(|| text("reason"))
            .unwrap_or("no message")
            .to_string(),
    )
}

/// The verdict and its reason, from the BundleDeployment, the HelmOp's rejection (if any) and
/// whether the copy downstream matches the source (`None`: it could not be compared).
pub fn verdict(
    lookup: &Lookup,
    rejected: Option<&str>,
    in_sync: Option<bool>,
) -> (AgentCopy, String) {
    let blocked = |r: &str| {
        format!(
            "Fleet's controller does not accept the HelmOp ({r}), so no new content reaches this cluster"
        )
    };
    match lookup {
        Lookup::NotFleet => (
            AgentCopy::Unknown,
            "not a Fleet Cluster, so no BundleDeployment records what Fleet's agent copied".into(),
        ),
        Lookup::Failed(why) => (
            AgentCopy::Unknown,
            format!("cannot read BundleDeployments upstream: {why}"),
        ),
        Lookup::Missing => match rejected {
            Some(r) if in_sync != Some(true) => (AgentCopy::Blocked, blocked(r)),
            _ => (
                AgentCopy::Unknown,
                "no BundleDeployment of this HelmOp for this cluster upstream, so what Fleet's agent copied cannot be told".into(),
            ),
        },
        Lookup::Found(g) if g.copied < g.staged => (
            AgentCopy::Pending,
            format!(
                "Fleet's agent has not copied the latest content yet (BundleDeployment {} downstreamResourcesGeneration: copied {}, staged {})",
                g.bundle_deployment, g.copied, g.staged
            ),
        ),
        Lookup::Found(g) => match (in_sync, rejected) {
            (Some(true), _) => (
                AgentCopy::Current,
                format!(
                    "Fleet's agent copied the latest content (BundleDeployment {} downstreamResourcesGeneration {})",
                    g.bundle_deployment, g.staged
                ),
            ),
            // Fleet's HelmOp controller leaves the Bundle as it was when it rejects the HelmOp,
            // and the Bundle controller keeps staging source changes for the clusters this
            // BundleDeployment serves: the change is on its way, not blocked.
            (Some(false), Some(r)) => (
                AgentCopy::Pending,
                format!(
                    "Fleet's controller does not accept the HelmOp ({r}), but its Bundle stays and still stages source changes (BundleDeployment {} downstreamResourcesGeneration {}, copied): Fleet's controller has yet to stage the change",
                    g.bundle_deployment, g.staged
                ),
            ),
            (Some(false), None) => (
                AgentCopy::Pending,
                format!(
                    "the source changed after Fleet's controller last staged it (BundleDeployment {} downstreamResourcesGeneration {}, copied): Fleet's controller has yet to stage the change",
                    g.bundle_deployment, g.staged
                ),
            ),
            (None, _) => (
                AgentCopy::Unknown,
                format!(
                    "BundleDeployment {} says Fleet's agent copied generation {}, but the copy could not be compared with the source",
                    g.bundle_deployment, g.staged
                ),
            ),
        },
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn bd(cluster_ns: &str, cluster: &str, staged: Option<i64>, copied: Option<i64>) -> Value {
        let mut v = json!({
            "metadata": {"namespace": "cluster-x", "name": "app", "labels": {
                BD_CLUSTER_NAMESPACE_LABEL: cluster_ns, BD_CLUSTER_LABEL: cluster,
            }},
            "spec": {}, "status": {},
        });
        if let Some(s) = staged {
            v["spec"]["downstreamResourcesGeneration"] = json!(s);
        }
        if let Some(c) = copied {
            v["status"]["downstreamResourcesGeneration"] = json!(c);
        }
        v
    }

    fn found(staged: i64, copied: i64) -> Lookup {
        Lookup::Found(Generations {
            bundle_deployment: "cluster-x/app".into(),
            staged,
            copied,
        })
    }

    #[test]
    fn finds_the_clusters_bundle_deployment() {
        let bds = [
            bd("fleet-a", "one", Some(2), Some(1)),
            bd("fleet-b", "two", None, None),
        ];
        assert_eq!(find(&bds, &["fleet-a/one"]), found(2, 1));
        // Absent generations are Go's zero.
        assert_eq!(find(&bds, &["ctx", "fleet-b/two"]), found(0, 0));
        assert_eq!(find(&bds, &["fleet-a/two"]), Lookup::Missing);
        assert_eq!(find(&bds, &["my-context", "a/b/c", "/x"]), Lookup::NotFleet);
        assert_eq!(find(&[], &["fleet-a/one"]), Lookup::Missing);
    }

    #[test]
    fn rejection_is_accepted_false() {
        let st = |s: &str, m: &str| {
            json!({"conditions": [{"type": "Ready", "status": "False", "message": "x"},
                                  {"type": "Accepted", "status": s, "message": m}]})
        };
        assert_eq!(rejection(Some(&st("True", ""))), None);
        assert_eq!(
            rejection(Some(&st("False", "helm options invalid: x"))),
            Some("helm options invalid: x".into())
        );
        assert_eq!(rejection(Some(&st("False", ""))), Some("no message".into()));
        assert_eq!(rejection(Some(&json!({}))), None);
        assert_eq!(rejection(None), None);
    }

    #[test]
    fn verdicts() {
        let cases = [
            (
                found(3, 2),
                None,
                Some(true),
                AgentCopy::Pending,
                "copied 2, staged 3",
            ),
            (
                found(3, 2),
                Some("bad"),
                Some(false),
                AgentCopy::Pending,
                "not copied",
            ),
            (
                found(3, 3),
                None,
                Some(true),
                AgentCopy::Current,
                "downstreamResourcesGeneration 3",
            ),
            (
                found(3, 3),
                Some("bad"),
                Some(true),
                AgentCopy::Current,
                "latest",
            ),
            (
                found(3, 3),
                None,
                Some(false),
                AgentCopy::Pending,
                "yet to stage",
            ),
            (
                found(3, 3),
                Some("bad"),
                Some(false),
                AgentCopy::Pending,
                "(bad), but its Bundle stays",
            ),
            (
                found(3, 3),
                None,
                None,
                AgentCopy::Unknown,
                "could not be compared",
            ),
            (
                Lookup::Missing,
                Some("bad"),
                Some(false),
                AgentCopy::Blocked,
                "does not accept",
            ),
            (
                Lookup::Missing,
                None,
                Some(false),
                AgentCopy::Unknown,
                "no BundleDeployment",
            ),
            (
                Lookup::NotFleet,
                None,
                Some(true),
                AgentCopy::Unknown,
                "not a Fleet Cluster",
            ),
            (
                Lookup::Failed("forbidden".into()),
                None,
                Some(true),
                AgentCopy::Unknown,
                "cannot read BundleDeployments upstream: forbidden",
            ),
        ];
        for (lookup, rejected, in_sync, want, phrase) in cases {
            let (got, why) = verdict(&lookup, rejected, in_sync);
            assert_eq!(got, want, "{lookup:?} {rejected:?} {in_sync:?}: {why}");
            assert!(why.contains(phrase), "{why}");
        }
    }

    #[test]
    fn serialises_lower_case() {
        for v in [
            AgentCopy::Current,
            AgentCopy::Pending,
            AgentCopy::Blocked,
            AgentCopy::Unknown,
        ] {
            assert_eq!(
                serde_json::to_value(v).unwrap_or_default(),
                json!(v.as_str())
            );
        }
    }
}
