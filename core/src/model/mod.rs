//! Typed views of the Fleet objects helmop reads: `HelmOp`, `Cluster`, `ClusterGroup` and
//! `BundleNamespaceMapping` (`fleet.cattle.io/v1alpha1`, shapes from Fleet v0.16.1's CRDs).
//!
//! Only the fields helmop acts on are typed. Every struct carries an `extra` map (serde
//! `flatten`) so fields helmop does not know - today's Fleet fields it ignores and tomorrow's
//! new ones - survive a read-modify-write unchanged. Optional scalars stay `Option` (instead of
//! defaulting) for the same reason: an explicit `false` or `[]` is written back as it was read.
//!
//! The types implement [`kube::Resource`], so the plugin and the webhook can use them with
//! `kube::Api<T>` directly.

mod cluster;
mod helmop;
mod mapping;
mod policy;

pub use cluster::{
    Cluster, ClusterGroup, ClusterGroupSpec, ClusterSpec, ClusterStatus,
    FLEET_KUBECONFIG_NAMESPACES,
};
pub use helmop::{
    BundleTarget, DownstreamResource, HelmOp, HelmOpSpec, HelmOptions, KeyRef, Partition,
    RolloutStrategy, TargetRestriction, ValuesFrom,
};
pub use mapping::BundleNamespaceMapping;
pub use policy::{HelmOpPolicy, Policy};

/// Fleet's API group.
pub const FLEET_GROUP: &str = "fleet.cattle.io";
/// Fleet's API version.
pub const FLEET_VERSION: &str = "v1alpha1";
/// `apiVersion` of every Fleet object.
pub const FLEET_API_VERSION: &str = "fleet.cattle.io/v1alpha1";

/// Serde map that keeps fields helmop does not model.
pub type Extra = serde_json::Map<String, serde_json::Value>;

/// Implements [`kube::Resource`] for a namespaced Fleet type with `metadata: ObjectMeta`.
macro_rules! fleet_resource {
    ($ty:ty, $kind:literal, $plural:literal) => {
        impl $ty {
            pub const KIND: &'static str = $kind;
            pub const PLURAL: &'static str = $plural;

            /// `kind` when a document leaves it out (serde's default).
            fn default_kind() -> String {
                Self::KIND.to_string()
            }
        }

        impl kube::Resource for $ty {
            type DynamicType = ();
            type Scope = k8s_openapi::NamespaceResourceScope;

            fn kind(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($kind)
            }
            fn group(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($crate::model::FLEET_GROUP)
            }
            fn version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($crate::model::FLEET_VERSION)
            }
            fn api_version(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($crate::model::FLEET_API_VERSION)
            }
            fn plural(_: &()) -> std::borrow::Cow<'_, str> {
                std::borrow::Cow::Borrowed($plural)
            }
            fn meta(&self) -> &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &self.metadata
            }
            fn meta_mut(
                &mut self,
            ) -> &mut k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                &mut self.metadata
            }
        }
    };
}
pub(crate) use fleet_resource;

pub(crate) fn default_api_version() -> String {
    FLEET_API_VERSION.to_string()
}

/// `""` and absent mean the same to Fleet (Go zero values); this folds both to `None`.
pub(crate) fn non_empty(s: &Option<String>) -> Option<&str> {
    s.as_deref().filter(|s| !s.is_empty())
}

#[cfg(test)]
mod tests;
