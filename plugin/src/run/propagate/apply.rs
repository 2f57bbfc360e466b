//! The writes of `propagate` on one cluster: creating a new copy (POST: it never merges into an
//! object that appeared meanwhile), server-side apply of a changed copy (field manager
//! `kubectl-helmop`), deleting a copy that must be recreated (uid and resourceVersion
//! preconditions), creating its namespace, and restoring a copy's data keys and labels to
//! exactly the source's.

use std::collections::BTreeMap;

use helmop_core::names::MANAGER;
use helmop_core::plan::{CopyMeta, extra_labels};
use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_core::targeting::NamespaceMetadata;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams, Preconditions};
use kube::core::Request;
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::cluster::api_error;
use crate::cluster::context::Ctx;
use crate::run::observe::Whole;
use crate::run::sources::SourceData;

/// Creates `namespace` with the HelmOps' `namespaceLabels`/`namespaceAnnotations`; someone else
/// creating it first is fine (its metadata is then left alone: docs/fleet-parity.md). Returns
/// whether this call created it.
pub async fn create_namespace(
    ctx: &Ctx,
    client: &Client,
    namespace: &str,
    meta: &NamespaceMetadata,
) -> Result<bool, kube::Error> {
    let non_empty = |m: &BTreeMap<String, String>| (!m.is_empty()).then(|| m.clone());
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(namespace.to_string()),
            labels: non_empty(&meta.labels),
            annotations: non_empty(&meta.annotations),
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
            Ok(true)
        }
        Err(e) if api_error::is_conflict(&e) => Ok(false),
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

/// Creates a new copy with a POST (field manager `kubectl-helmop`). An object that appeared
/// since the cluster was observed makes the server answer 409 AlreadyExists: it is left exactly
/// as it is, and the caller reports a conflict.
pub async fn create_copy(
    ctx: &Ctx,
    client: &Client,
    source: &SourceData,
    namespace: &str,
    meta: &CopyMeta,
) -> Result<Whole, kube::Error> {
    let body = serde_json::to_vec(&source.copy_body(namespace, meta, None))
        .map_err(kube::Error::SerdeError)?;
    let pp = PostParams {
        field_manager: Some(MANAGER.into()),
        ..PostParams::default()
    };
    let written = match source {
        SourceData::Secret(_) => Whole::Secret(post(client, namespace, &pp, body).await?),
        SourceData::ConfigMap(_) => Whole::ConfigMap(post(client, namespace, &pp, body).await?),
    };
    ctx.record_write();
    Ok(written)
}

/// `Api::create` for a body already serialized: the copy's body is written as it is, not turned
/// into a typed object first ([`SourceData::copy_body`]).
async fn post<K>(
    client: &Client,
    namespace: &str,
    pp: &PostParams,
    body: Vec<u8>,
) -> Result<K, kube::Error>
where
    K: Resource<DynamicType = ()> + DeserializeOwned + Clone + std::fmt::Debug,
{
    let request = Request::new(K::url_path(&(), Some(namespace)))
        .create(pp, body)
        .map_err(kube::Error::BuildRequest)?;
    client.request(request).await
}

/// Deletes helmop's copy so it can be created again, only if it is still the object planned
/// against (uid and resourceVersion preconditions).
pub async fn delete_copy(
    ctx: &Ctx,
    client: &Client,
    namespace: &str,
    resource: &ResourceRef,
    uid: &str,
    version: &str,
) -> Result<(), kube::Error> {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: Some(version.to_string()),
        }),
        ..DeleteParams::default()
    };
    let name = &resource.name;
    match resource.kind {
        ResourceKind::Secret => {
            Api::<Secret>::namespaced(client.clone(), namespace)
                .delete(name, &dp)
                .await?;
        }
        ResourceKind::ConfigMap => {
            Api::<ConfigMap>::namespaced(client.clone(), namespace)
                .delete(name, &dp)
                .await?;
        }
    }
    ctx.record_write();
    Ok(())
}

/// The metadata of the object at a place, if one is there.
pub async fn read_meta(
    client: &Client,
    namespace: &str,
    resource: &ResourceRef,
) -> Result<Option<ObjectMeta>, kube::Error> {
    let name = &resource.name;
    Ok(match resource.kind {
        ResourceKind::Secret => Api::<Secret>::namespaced(client.clone(), namespace)
            .get_metadata_opt(name)
            .await?
            .map(|m| m.metadata),
        ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client.clone(), namespace)
            .get_metadata_opt(name)
            .await?
            .map(|m| m.metadata),
    })
}

/// The metadata of the object at a place when it is this upstream's copy (its source marker names
/// `upstream_id`), live or being deleted; `None` for anything else, or when it cannot be read.
pub async fn own_copy(
    client: &Client,
    upstream_id: &str,
    namespace: &str,
    resource: &ResourceRef,
) -> Option<ObjectMeta> {
    let meta = read_meta(client, namespace, resource).await.ok()??;
    let ours = meta
        .annotations
        .as_ref()
        .and_then(|a| a.get(helmop_core::names::ANN_SOURCE))
        .and_then(|s| helmop_core::plan::SourceRef::parse(s))
        .is_some_and(|s| s.upstream_id == upstream_id);
    ours.then_some(meta)
}

/// The finalizers holding the object at a place, when it is this upstream's copy being deleted:
/// a create there is answered 409 until it is gone.
pub async fn own_terminating(
    client: &Client,
    upstream_id: &str,
    namespace: &str,
    resource: &ResourceRef,
) -> Option<Vec<String>> {
    let meta = own_copy(client, upstream_id, namespace, resource).await?;
    meta.deletion_timestamp.as_ref()?;
    Some(meta.finalizers.unwrap_or_default())
}

/// Applies the copy to the existing object (ours, or adopted) with force, guarded by uid and
/// resourceVersion. Data keys and labels the copy has and the source does not (left by another
/// field manager, or carried over from a creation) are then removed.
pub async fn write_copy(ctx: &Ctx, client: &Client, w: &Write<'_>) -> Result<Whole, kube::Error> {
    let body = w.source.copy_body(w.namespace, w.meta, w.guard);
    let name = w.source.meta().name.clone().unwrap_or_default();
    let mut params = PatchParams::apply(MANAGER);
    if w.guard.is_some() {
        params = params.force();
    }
    let (want_data, want_binary) = w.source.keys();
    let written = match w.source {
        SourceData::Secret(_) => {
            let api: Api<Secret> = Api::namespaced(client.clone(), w.namespace);
            Whole::Secret(api.patch(&name, &params, &Patch::Apply(&body)).await?)
        }
        SourceData::ConfigMap(_) => {
            let api: Api<ConfigMap> = Api::namespaced(client.clone(), w.namespace);
            Whole::ConfigMap(api.patch(&name, &params, &Patch::Apply(&body)).await?)
        }
    };
    ctx.record_write();
    fn keys<V>(m: &Option<BTreeMap<String, V>>) -> Vec<String> {
        m.iter().flat_map(|m| m.keys().cloned()).collect()
    }
    let (meta, data, binary) = match &written {
        Whole::Secret(out) => (&out.metadata, keys(&out.data), Vec::new()),
        Whole::ConfigMap(out) => (&out.metadata, keys(&out.data), keys(&out.binary_data)),
    };
    let extra_data: Vec<String> = data
        .into_iter()
        .filter(|k| !want_data.contains(k))
        .collect();
    let extra_binary: Vec<String> = binary
        .into_iter()
        .filter(|k| !want_binary.contains(k))
        .collect();
    let annotations = stale_annotations(meta, w.meta);
    let no_labels = BTreeMap::new();
    let labels = extra_labels(meta.labels.as_ref().unwrap_or(&no_labels), &w.meta.labels);
    if extra_data.is_empty()
        && extra_binary.is_empty()
        && labels.is_empty()
        && annotations.is_empty()
    {
        return Ok(written);
    }
    let mut patch = remove_keys_patch(
        meta.uid.as_deref().unwrap_or_default(),
        meta.resource_version.as_deref().unwrap_or_default(),
        &extra_data,
        &extra_binary,
    );
    let nulls = |keys: Vec<String>| -> Value {
        Value::Object(keys.into_iter().map(|k| (k, Value::Null)).collect())
    };
    if !labels.is_empty() {
        patch["metadata"]["labels"] = nulls(labels);
    }
    if !annotations.is_empty() {
        patch["metadata"]["annotations"] = nulls(annotations);
    }
    let params = PatchParams {
        field_manager: Some(MANAGER.into()),
        ..PatchParams::default()
    };
    let written = match w.source {
        SourceData::Secret(_) => Whole::Secret(
            Api::<Secret>::namespaced(client.clone(), w.namespace)
                .patch(&name, &params, &Patch::Merge(&patch))
                .await?,
        ),
        SourceData::ConfigMap(_) => Whole::ConfigMap(
            Api::<ConfigMap>::namespaced(client.clone(), w.namespace)
                .patch(&name, &params, &Patch::Merge(&patch))
                .await?,
        ),
    };
    ctx.record_write();
    Ok(written)
}

/// Annotations on the copy that helmop no longer writes: any `helmop.dev/` key not in `want`
/// (a stale keep marker, an owners list that became empty), and the keys helmop set when it
/// created the copy with a POST (its field manager's `Update` entry) that it no longer sets
/// (an annotation dropped from the source). Server-side apply removes only what the applier
/// alone owns, so these would otherwise stay. Annotations others added are left alone.
fn stale_annotations(meta: &ObjectMeta, want: &CopyMeta) -> Vec<String> {
    let created: Vec<String> = meta
        .managed_fields
        .iter()
        .flatten()
        .filter(|f| {
            f.manager.as_deref() == Some(MANAGER) && f.operation.as_deref() == Some("Update")
        })
        .filter_map(|f| f.fields_v1.as_ref())
        .filter_map(|f| f.0.pointer("/f:metadata/f:annotations")?.as_object())
        .flat_map(|m| {
            m.keys()
                .filter_map(|k| k.strip_prefix("f:"))
                .map(str::to_string)
        })
        .collect();
    meta.annotations
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .filter(|k| !want.annotations.contains_key(*k))
        .filter(|k| k.starts_with(helmop_core::names::PREFIX) || created.contains(k))
        .cloned()
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_annotations_are_ours_only() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldsV1, ManagedFieldsEntry};
        let entry = |manager: &str, op: &str, keys: &[&str]| ManagedFieldsEntry {
            manager: Some(manager.into()),
            operation: Some(op.into()),
            fields_v1: Some(FieldsV1(json!({"f:metadata": {"f:annotations":
                keys.iter().map(|k| (format!("f:{k}"), json!({}))).collect::<Map<String, Value>>()}}))),
            ..ManagedFieldsEntry::default()
        };
        let meta = ObjectMeta {
            annotations: Some(BTreeMap::from(
                [
                    "helmop.dev/keep",
                    "helmop.dev/source",
                    "from-source",
                    "dropped",
                    "theirs",
                ]
                .map(|k| (k.to_string(), "x".to_string())),
            )),
            managed_fields: Some(vec![
                entry(
                    MANAGER,
                    "Update",
                    &["helmop.dev/keep", "dropped", "from-source"],
                ),
                entry("someone", "Update", &["theirs"]),
            ]),
            ..ObjectMeta::default()
        };
        let want = CopyMeta {
            labels: BTreeMap::new(),
            annotations: BTreeMap::from(
                ["helmop.dev/source", "from-source"].map(|k| (k.to_string(), "x".to_string())),
            ),
        };
        assert_eq!(
            stale_annotations(&meta, &want),
            ["dropped".to_string(), "helmop.dev/keep".to_string()]
        );
    }

    #[test]
    fn patches_are_guarded() {
        assert_eq!(
            remove_keys_patch("u", "7", &["x".into()], &[]),
            json!({"metadata": {"uid": "u", "resourceVersion": "7"}, "data": {"x": null}})
        );
    }
}
