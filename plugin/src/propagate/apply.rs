//! The writes of `propagate` on one cluster: server-side apply of a copy (field manager
//! `kubectl-helmop`), creating its namespace, and restoring a copy's data to exactly the
//! source's keys.

use std::collections::BTreeMap;

use helmop_core::names::MANAGER;
use helmop_core::plan::CopyMeta;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Map, Value, json};

use crate::api_error;
use crate::context::Ctx;
use crate::sources::SourceData;

/// Whether `namespace` exists (a read, for plans and before creating).
pub async fn namespace_exists(client: &Client, namespace: &str) -> Result<bool, kube::Error> {
    Ok(Api::<Namespace>::all(client.clone())
        .get_metadata_opt(namespace)
        .await?
        .is_some())
}

/// Creates `namespace`; someone else creating it first is fine.
pub async fn create_namespace(
    ctx: &Ctx,
    client: &Client,
    namespace: &str,
) -> Result<(), kube::Error> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_string()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    match Api::<Namespace>::all(client.clone()).create(&pp, &ns).await {
        Ok(_) => {
            ctx.record_write();
            Ok(())
        }
        Err(e) if api_error::is_conflict(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// How a copy is written.
pub struct Write<'a> {
    pub source: &'a SourceData,
    pub namespace: &'a str,
    pub meta: &'a CopyMeta,
    /// `(uid, resourceVersion)` of the object planned against: the server refuses the write if
    /// it is another object or has changed since. `None` for a new copy.
    pub guard: Option<(&'a str, &'a str)>,
}

/// Applies the copy. A new copy is applied without force, so an object someone created in the
/// meantime with other values makes the server report a conflict instead of being taken over;
/// an existing copy (ours, or adopted) is applied with force. Keys in the copy that the source
/// does not have (left by another field manager) are then removed. Returns the writes made.
pub async fn write_copy(ctx: &Ctx, client: &Client, w: &Write<'_>) -> Result<(), kube::Error> {
    let body = w.source.copy_body(w.namespace, w.meta, w.guard);
    let name = w.source.meta().name.clone().unwrap_or_default();
    let mut params = PatchParams::apply(MANAGER);
    if w.guard.is_some() {
        params = params.force();
    }
    let (want_data, want_binary) = w.source.keys();
    let (uid, version, data, binary) = match w.source {
        SourceData::Secret(_) => {
            let api: Api<Secret> = Api::namespaced(client.clone(), w.namespace);
            let out = api.patch(&name, &params, &Patch::Apply(&body)).await?;
            ctx.record_write();
            let keys = out.data.unwrap_or_default().into_keys().collect::<Vec<_>>();
            (
                out.metadata.uid,
                out.metadata.resource_version,
                keys,
                Vec::new(),
            )
        }
        SourceData::ConfigMap(_) => {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), w.namespace);
            let out = api.patch(&name, &params, &Patch::Apply(&body)).await?;
            ctx.record_write();
            (
                out.metadata.uid,
                out.metadata.resource_version,
                out.data.unwrap_or_default().into_keys().collect(),
                out.binary_data.unwrap_or_default().into_keys().collect(),
            )
        }
    };
    let extra_data: Vec<String> = data
        .into_iter()
        .filter(|k| !want_data.contains(k))
        .collect();
    let extra_binary: Vec<String> = binary
        .into_iter()
        .filter(|k| !want_binary.contains(k))
        .collect();
    if extra_data.is_empty() && extra_binary.is_empty() {
        return Ok(());
    }
    let patch = remove_keys_patch(
        uid.as_deref().unwrap_or_default(),
        version.as_deref().unwrap_or_default(),
        &extra_data,
        &extra_binary,
    );
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    match w.source {
        SourceData::Secret(_) => {
            Api::<Secret>::namespaced(client.clone(), w.namespace)
                .patch(&name, &params, &Patch::Merge(&patch))
                .await?;
        }
        SourceData::ConfigMap(_) => {
            Api::<ConfigMap>::namespaced(client.clone(), w.namespace)
                .patch(&name, &params, &Patch::Merge(&patch))
                .await?;
        }
    }
    ctx.record_write();
    Ok(())
}

/// A JSON merge patch deleting keys, guarded by uid and resourceVersion.
fn remove_keys_patch(uid: &str, version: &str, data: &[String], binary: &[String]) -> Value {
    let nulls = |keys: &[String]| -> Map<String, Value> {
        keys.iter().map(|k| (k.clone(), Value::Null)).collect()
    };
    let mut patch = json!({"metadata": {"uid": uid, "resourceVersion": version}});
    if !data.is_empty() {
        patch["data"] = Value::Object(nulls(data));
    }
    if !binary.is_empty() {
        patch["binaryData"] = Value::Object(nulls(binary));
    }
    patch
}

/// A JSON merge patch of annotations (value `None` deletes), guarded by uid and
/// resourceVersion: the server refuses it if the object was replaced or changed since it was
/// read. Used by prune to release owners.
pub fn annotations_patch(uid: &str, version: &str, set: &BTreeMap<&str, Option<String>>) -> Value {
    let annotations: Map<String, Value> = set
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone().map_or(Value::Null, Value::String)))
        .collect();
    json!({"metadata": {"uid": uid, "resourceVersion": version, "annotations": annotations}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patches_are_guarded() {
        assert_eq!(
            remove_keys_patch("u", "7", &["x".into()], &[]),
            json!({"metadata": {"uid": "u", "resourceVersion": "7"}, "data": {"x": null}})
        );
        let set = BTreeMap::from([
            ("helmop.dev/owners", None),
            ("helmop.dev/keep", Some("true".to_string())),
        ]);
        assert_eq!(
            annotations_patch("u", "7", &set),
            json!({"metadata": {"uid": "u", "resourceVersion": "7", "annotations": {
                "helmop.dev/owners": null, "helmop.dev/keep": "true"}}})
        );
    }
}
