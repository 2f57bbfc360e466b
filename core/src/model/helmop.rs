use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

use super::{Extra, default_api_version, fleet_resource, non_empty};
use crate::resource::{ResourceKind, ResourceRef};

/// A Fleet `HelmOp`: a Helm chart deployed to the clusters its targets select.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HelmOp {
    #[serde(default = "default_api_version")]
    pub api_version: String,
    #[serde(default = "HelmOp::default_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: HelmOpSpec,
    /// Written by Fleet; helmop only carries it through.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<serde_json::Value>,
    #[serde(flatten)]
    pub extra: Extra,
}

fleet_resource!(HelmOp, "HelmOp", "helmops");

impl HelmOp {
    /// A HelmOp with just a name, a namespace and a spec (tests, fixtures).
    pub fn new(namespace: &str, name: &str, spec: HelmOpSpec) -> Self {
        HelmOp {
            api_version: default_api_version(),
            kind: Self::default_kind(),
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            spec,
            status: None,
            extra: Extra::new(),
        }
    }

    /// Every Secret and ConfigMap the HelmOp names as a source, in its root options or in any
    /// target, whether or not a cluster is targeted now (the places on the management cluster
    /// helmop never writes, adopts or prunes).
    pub fn named_sources(&self) -> Vec<ResourceRef> {
        let mut out: Vec<ResourceRef> = self
            .spec
            .downstream_resources()
            .iter()
            .chain(
                self.spec
                    .targets()
                    .iter()
                    .flat_map(|t| t.downstream_resources()),
            )
            .filter_map(DownstreamResource::to_ref)
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// `HelmOp.spec` (Fleet's `HelmOpSpec`, which embeds `BundleSpec` and its `BundleDeploymentOptions`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HelmOpSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helm: Option<HelmOptions>,
    /// `TargetNamespace`: forces every resource of the release into this namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_namespace: Option<String>,
    /// Secret with the credentials for a private Helm repository.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helm_secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downstream_resources: Option<Vec<DownstreamResource>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_resources: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub targets: Option<Vec<BundleTarget>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_restrictions: Option<Vec<TargetRestriction>>,
    /// `FirstMatch` (Fleet's default) or `AllMatches`: how customizations apply.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_customization_mode: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_annotations: Option<BTreeMap<String, String>>,
    /// Labels Fleet copies to the HelmOp's Bundle (what a `BundleNamespaceMapping` selects on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labels: Option<BTreeMap<String, String>>,
    /// Fleet stops updating the BundleDeployments of a paused HelmOp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused: Option<bool>,
    /// The ServiceAccount the agent deploys as; Fleet Policies can require or restrict it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    /// How Fleet's Bundle controller stages BundleDeployments: partitions decide which
    /// clusters get one at all, and an unreadable value fails the whole Bundle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_strategy: Option<RolloutStrategy>,
    /// When set (even `{}`), Fleet's agent deploys (and copies) only into a destination
    /// namespace that already exists downstream and matches it, and never creates it. Fleet's
    /// options merge reads only this root value, never a target's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_target_namespace_selector: Option<LabelSelector>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `spec.rolloutStrategy` (Fleet's `RolloutStrategy`). The int-or-string fields stay JSON:
/// whether Fleet can read them is the question asked of them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStrategy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable_partitions: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_partition_size: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_partition_threshold: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partitions: Option<Vec<Partition>>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A `spec.rolloutStrategy.partitions[]` entry (Fleet's `Partition`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Partition {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_group_selector: Option<LabelSelector>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl HelmOpSpec {
    pub fn paused(&self) -> bool {
        self.paused.unwrap_or(false)
    }

    pub fn service_account(&self) -> Option<&str> {
        non_empty(&self.service_account)
    }

    pub fn targets(&self) -> &[BundleTarget] {
        self.targets.as_deref().unwrap_or_default()
    }

    pub fn target_restrictions(&self) -> &[TargetRestriction] {
        self.target_restrictions.as_deref().unwrap_or_default()
    }

    pub fn downstream_resources(&self) -> &[DownstreamResource] {
        self.downstream_resources.as_deref().unwrap_or_default()
    }

    pub fn keep_resources(&self) -> bool {
        self.keep_resources.unwrap_or(false)
    }

    pub fn namespace(&self) -> Option<&str> {
        non_empty(&self.namespace)
    }

    pub fn default_namespace(&self) -> Option<&str> {
        non_empty(&self.default_namespace)
    }

    pub fn helm_secret_name(&self) -> Option<&str> {
        non_empty(&self.helm_secret_name)
    }

    /// Fleet compares the mode with `AllMatches` exactly; anything else is `FirstMatch`
    /// (`internal/cmd/controller/target/builder.go`).
    pub fn all_matches(&self) -> bool {
        self.target_customization_mode.as_deref() == Some("AllMatches")
    }
}

/// Helm options (`spec.helm` and `spec.targets[].helm`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HelmOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chart: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values_from: Option<Vec<ValuesFrom>>,
    /// Helm values; Fleet templates them per cluster (`${ }`) unless `disablePreProcess`.
    /// Kept as JSON: any shape must round-trip.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub values: Option<serde_json::Value>,
    /// Fleet's `templateValues`: key -> template whose rendered YAML becomes that value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_values: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disable_pre_process: Option<bool>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl HelmOptions {
    pub fn values_from(&self) -> &[ValuesFrom] {
        self.values_from.as_deref().unwrap_or_default()
    }
}

/// One `valuesFrom` entry: Helm values read from a ConfigMap or Secret key.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ValuesFrom {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_key_ref: Option<KeyRef>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// `{name, namespace, key}` of a `valuesFrom` source.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeyRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

/// A `downstreamResources` entry. `kind` stays a raw string: Fleet accepts any case and
/// validation must be able to point at a wrong one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DownstreamResource {
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    #[serde(flatten)]
    pub extra: Extra,
}

impl DownstreamResource {
    pub fn new(kind: &str, name: &str) -> Self {
        DownstreamResource {
            kind: kind.to_string(),
            name: name.to_string(),
            extra: Extra::new(),
        }
    }

    /// The entry as a reference, if its kind is one Fleet copies (any case).
    pub fn to_ref(&self) -> Option<ResourceRef> {
        ResourceKind::parse(&self.kind).map(|kind| ResourceRef::new(kind, self.name.clone()))
    }
}

/// A `spec.targets[]` entry (Fleet's `BundleTarget`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleTarget {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_group_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub do_not_deploy: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helm: Option<HelmOptions>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub downstream_resources: Option<Vec<DownstreamResource>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_resources: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_labels: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_annotations: Option<BTreeMap<String, String>>,
    /// The service account Fleet's agent deploys this target's clusters with; the Bundle
    /// controller checks it against the Policies' `allowedServiceAccounts`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account: Option<String>,
    #[serde(flatten)]
    pub extra: Extra,
}

impl BundleTarget {
    pub fn downstream_resources(&self) -> &[DownstreamResource] {
        self.downstream_resources.as_deref().unwrap_or_default()
    }

    pub fn do_not_deploy(&self) -> bool {
        self.do_not_deploy.unwrap_or(false)
    }

    pub fn keep_resources(&self) -> bool {
        self.keep_resources.unwrap_or(false)
    }

    pub fn namespace(&self) -> Option<&str> {
        non_empty(&self.namespace)
    }

    pub fn default_namespace(&self) -> Option<&str> {
        non_empty(&self.default_namespace)
    }

    pub fn cluster_name(&self) -> Option<&str> {
        non_empty(&self.cluster_name)
    }

    pub fn cluster_group(&self) -> Option<&str> {
        non_empty(&self.cluster_group)
    }
}

/// A `spec.targetRestrictions[]` entry: an allow list of clusters (same criteria as a target).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TargetRestriction {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_group: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_group_selector: Option<LabelSelector>,
    #[serde(flatten)]
    pub extra: Extra,
}
