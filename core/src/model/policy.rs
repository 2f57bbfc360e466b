use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use super::{Extra, default_api_version, fleet_resource};

/// A Fleet `Policy`: what the GitRepos and HelmOps of its namespace may use. Its fields sit at
/// the top level (no `spec`); only those Fleet's HelmOp controller reads are typed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Policy {
    #[serde(default = "default_api_version")]
    pub api_version: String,
    #[serde(default = "Policy::default_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub require_service_account: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_service_accounts: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub helm_op: Option<HelmOpPolicy>,
    #[serde(flatten)]
    pub extra: Extra,
}

fleet_resource!(Policy, "Policy", "policies");

impl Policy {
    /// A Policy with a name, a namespace and nothing set (tests, fixtures).
    pub fn new(namespace: &str, name: &str) -> Self {
        Policy {
            api_version: default_api_version(),
            kind: Self::default_kind(),
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            ..Policy::default()
        }
    }
}

/// `Policy.helmOp`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HelmOpPolicy {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_service_account: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_helm_secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_helm_secret_names: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_helm_repo_patterns: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_chart_patterns: Option<Vec<String>>,
    #[serde(flatten)]
    pub extra: Extra,
}
