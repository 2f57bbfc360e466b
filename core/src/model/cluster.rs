use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

use super::{Extra, default_api_version, fleet_resource, non_empty};

/// A Fleet `Cluster`: a downstream cluster registered with the management cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cluster {
    #[serde(default = "default_api_version")]
    pub api_version: String,
    #[serde(default = "Cluster::default_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ClusterSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<ClusterStatus>,
    #[serde(flatten)]
    pub extra: Extra,
}

fleet_resource!(Cluster, "Cluster", "clusters");

/// Namespaces besides a Cluster's own that Fleet v0.16 reads kubeconfig Secrets from (with any
/// `cluster-*` namespace): its workspaces and its system and registration namespaces, current
/// and legacy.
pub const FLEET_KUBECONFIG_NAMESPACES: [&str; 6] = [
    "fleet-local",
    "fleet-default",
    "cattle-fleet-system",
    "fleet-system",
    "cattle-fleet-clusters-system",
    "fleet-clusters-system",
];

impl Cluster {
    /// A Cluster with a name, namespace and labels (tests, fixtures).
    pub fn new(namespace: &str, name: &str, labels: &[(&str, &str)]) -> Self {
        Cluster {
            api_version: default_api_version(),
            kind: Self::default_kind(),
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: ClusterSpec::default(),
            status: None,
            extra: Extra::new(),
        }
    }

    /// Whether the Cluster is off its schedule: a Fleet Schedule holds it (`status.scheduled`)
    /// and none of its Schedules is in an active window (`status.activeSchedule` false or
    /// absent). Fleet's target builder then marks every BundleDeployment on it `offSchedule`
    /// and the agent deploys nothing (rancher/fleet v0.16 `target/target.go` `BundleDeployment`,
    /// `agent/controller/bundledeployment_controller.go` `Reconcile`). Only Fleet's schedule
    /// controller writes these fields, through the status subresource.
    pub fn off_schedule(&self) -> bool {
        self.status
            .as_ref()
            .is_some_and(|s| s.scheduled.unwrap_or(false) && !s.active_schedule.unwrap_or(false))
    }

    /// Whether Fleet's import controller reads this Cluster's kubeconfig Secret from `namespace`:
    /// the Cluster's own namespace, Fleet's workspace and system namespaces, or a `cluster-*`
    /// namespace (rancher/fleet v0.16 `allowedKubeConfigSecretNamespace`). Anywhere else Fleet
    /// refuses the Cluster, and so does helmop: a `kubeConfigSecretNamespace` must not let whoever
    /// may write Clusters point helmop at Secrets in namespaces they cannot read.
    pub fn fleet_reads_kubeconfig_from(&self, namespace: &str) -> bool {
        self.metadata.namespace.as_deref() == Some(namespace)
            || FLEET_KUBECONFIG_NAMESPACES.contains(&namespace)
            || namespace.starts_with("cluster-")
    }

    /// Where the kubeconfig Secret lives: `(namespace, name)`. The namespace defaults to the
    /// Cluster's own (Fleet's documented default); `None` when no secret is set.
    pub fn kubeconfig_secret(&self) -> Option<(String, String)> {
        let name = non_empty(&self.spec.kube_config_secret)?;
        let namespace = non_empty(&self.spec.kube_config_secret_namespace)
            .or(self.metadata.namespace.as_deref())
            .unwrap_or_default();
        Some((namespace.to_string(), name.to_string()))
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSpec {
    /// Secret whose data key `value` holds a kubeconfig for the downstream cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_config_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube_config_secret_namespace: Option<String>,
    /// Fleet stops updating every BundleDeployment of a paused Cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// Values a HelmOp's values templates read as `.ClusterValues`. Kept as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_values: Option<serde_json::Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl ClusterSpec {
    pub fn paused(&self) -> bool {
        self.paused.unwrap_or(false)
    }
}

/// The part of a Cluster's status helmop reads: what Fleet's schedule controller writes
/// (rancher/fleet v0.16 `cluster_types.go` `ClusterStatus`). Everything else of the status is
/// kept as read.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The Cluster is matched by a Fleet Schedule: `activeSchedule` then decides whether Fleet
    /// deploys to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled: Option<bool>,
    /// One of its Schedules is in its active window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_schedule: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A Fleet `ClusterGroup`: a named label selector over the Clusters of its namespace.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterGroup {
    #[serde(default = "default_api_version")]
    pub api_version: String,
    #[serde(default = "ClusterGroup::default_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: ClusterGroupSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

fleet_resource!(ClusterGroup, "ClusterGroup", "clustergroups");

impl ClusterGroup {
    /// A ClusterGroup with a name, namespace, its own labels and a selector (tests, fixtures).
    pub fn new(
        namespace: &str,
        name: &str,
        labels: &[(&str, &str)],
        selector: Option<LabelSelector>,
    ) -> Self {
        ClusterGroup {
            api_version: default_api_version(),
            kind: Self::default_kind(),
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..ObjectMeta::default()
            },
            spec: ClusterGroupSpec {
                selector,
                extra: Extra::new(),
            },
            status: None,
            extra: Extra::new(),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterGroupSpec {
    /// `None` selects no cluster; `Some({})` selects every cluster of the namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
    #[serde(flatten)]
    pub extra: Extra,
}
