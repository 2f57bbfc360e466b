//! A cluster is identified by what it is, not by how it is reached: the UID of its
//! `kube-system` namespace. Shared by the upstream context and the downstream clusters.

use k8s_openapi::api::core::v1::Namespace;
use kube::Api;

/// The namespace whose UID identifies a cluster.
pub const IDENTITY_NAMESPACE: &str = "kube-system";
const IDENTITY_PREFIX: &str = "kube-system:";

/// The plan key of the cluster whose `kube-system` namespace has UID `uid`.
pub fn identity_key(uid: &str) -> String {
    format!("{IDENTITY_PREFIX}{uid}")
}

/// The UID of the cluster's `kube-system` namespace (`get namespaces/kube-system`).
pub async fn kube_system_uid(client: &kube::Client) -> Result<Option<String>, kube::Error> {
    let ns = Api::<Namespace>::all(client.clone())
        .get(IDENTITY_NAMESPACE)
        .await?;
    Ok(ns.metadata.uid.filter(|u| !u.is_empty()))
}
