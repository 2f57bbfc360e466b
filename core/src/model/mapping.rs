use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

use super::{Extra, default_api_version, fleet_resource};

/// A Fleet `BundleNamespaceMapping`: lets the Bundles of its namespace that `bundleSelector`
/// selects target the Clusters of the namespaces `namespaceSelector` selects. Both selectors sit
/// at the top level of the object (there is no `spec`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleNamespaceMapping {
    #[serde(default = "default_api_version")]
    pub api_version: String,
    #[serde(default = "BundleNamespaceMapping::default_kind")]
    pub kind: String,
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// On the Bundle's labels; absent (or `null`) makes the mapping match nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bundle_selector: Option<LabelSelector>,
    /// On Namespace labels; absent (or `null`) makes the mapping match nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_selector: Option<LabelSelector>,
    #[serde(flatten)]
    pub extra: Extra,
}

fleet_resource!(
    BundleNamespaceMapping,
    "BundleNamespaceMapping",
    "bundlenamespacemappings"
);

impl BundleNamespaceMapping {
    /// A mapping with a name, a namespace and its two selectors (tests, fixtures).
    pub fn new(
        namespace: &str,
        name: &str,
        bundle_selector: Option<LabelSelector>,
        namespace_selector: Option<LabelSelector>,
    ) -> Self {
        BundleNamespaceMapping {
            api_version: default_api_version(),
            kind: Self::default_kind(),
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                ..ObjectMeta::default()
            },
            bundle_selector,
            namespace_selector,
            extra: Extra::new(),
        }
    }
}
