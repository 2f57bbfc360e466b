//! The source objects upstream (Secrets and ConfigMaps in the HelmOps' namespaces), their content
//! hashes, and the body of a copy made from one.

use std::collections::{BTreeMap, BTreeSet};

use futures::{StreamExt, TryStreamExt};
use helmop_core::hash::{HashKey, ObjectData, content_hash};
use helmop_core::plan::{CopyMeta, DesiredCopy, SourceObject};
use helmop_core::resource::{ResourceKind, ResourceRef};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::ObjectMeta;
use serde::Serialize;

use crate::cluster::api_error;
use crate::cluster::context::Ctx;
use crate::error::PluginError;

/// A live source object.
#[derive(Clone)]
pub enum SourceData {
    Secret(Secret),
    ConfigMap(ConfigMap),
}

impl std::fmt::Debug for SourceData {
    /// Never the data: sources are often secret.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceData")
            .field("kind", &self.kind())
            .field("name", &self.meta().name)
            .field("namespace", &self.meta().namespace)
            .finish_non_exhaustive()
    }
}

impl SourceData {
    pub fn kind(&self) -> ResourceKind {
        match self {
            SourceData::Secret(_) => ResourceKind::Secret,
            SourceData::ConfigMap(_) => ResourceKind::ConfigMap,
        }
    }

    pub fn meta(&self) -> &ObjectMeta {
        match self {
            SourceData::Secret(s) => &s.metadata,
            SourceData::ConfigMap(c) => &c.metadata,
        }
    }

    pub fn object_data(&self) -> ObjectData<'_> {
        match self {
            SourceData::Secret(s) => ObjectData::from(s),
            SourceData::ConfigMap(c) => ObjectData::from(c),
        }
    }

    /// `helmop.dev/content-hash` of this object with the upstream key.
    pub fn content_hash(&self, key: &HashKey) -> String {
        content_hash(key, self.kind(), &self.object_data())
    }

    /// Keys of `data` and of `binaryData`.
    pub fn keys(&self) -> (BTreeSet<String>, BTreeSet<String>) {
        let d = self.object_data();
        (
            d.data.keys().map(|k| k.to_string()).collect(),
            d.binary_data.keys().map(|k| k.to_string()).collect(),
        )
    }

    /// The server-side-apply body of a copy in `namespace` with `meta`. `guard` (uid,
    /// resourceVersion) makes the server refuse the write if the object is not the one planned
    /// against. Secret `type` is kept; `immutable` is not copied (a copy must stay updatable).
    /// Borrowed from the source, so a write serializes it without building a JSON tree first.
    pub fn copy_body<'a>(
        &'a self,
        namespace: &'a str,
        meta: &'a CopyMeta,
        guard: Option<(&'a str, &'a str)>,
    ) -> CopyBody<'a> {
        let metadata = BodyMeta {
            name: self.meta().name.as_deref().unwrap_or_default(),
            namespace,
            labels: &meta.labels,
            annotations: &meta.annotations,
            uid: guard.map(|(uid, _)| uid),
            resource_version: guard.map(|(_, version)| version),
        };
        match self {
            SourceData::Secret(s) => CopyBody {
                api_version: "v1",
                kind: "Secret",
                metadata,
                type_: Some(s.type_.as_deref().unwrap_or("Opaque")),
                data: s.data.as_ref().map(Data::Bytes),
                binary_data: None,
            },
            SourceData::ConfigMap(c) => CopyBody {
                api_version: "v1",
                kind: "ConfigMap",
                metadata,
                type_: None,
                data: c.data.as_ref().map(Data::Strings),
                binary_data: c.binary_data.as_ref(),
            },
        }
    }
}

/// A copy's body ([`SourceData::copy_body`]).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CopyBody<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: BodyMeta<'a>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    type_: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    data: Option<Data<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    binary_data: Option<&'a BTreeMap<String, ByteString>>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct BodyMeta<'a> {
    name: &'a str,
    namespace: &'a str,
    labels: &'a BTreeMap<String, String>,
    annotations: &'a BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    uid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    resource_version: Option<&'a str>,
}

/// A Secret's data (base64 in JSON) or a ConfigMap's.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Data<'a> {
    Bytes(&'a BTreeMap<String, ByteString>),
    Strings(&'a BTreeMap<String, String>),
}

/// The live sources the desired copies need.
#[derive(Debug, Default)]
pub struct Sources {
    /// By (HelmOp namespace, resource); absent ones are simply not here.
    pub objects: BTreeMap<(String, ResourceRef), SourceData>,
    /// The same, as the planner reads them.
    pub plan: Vec<SourceObject>,
    /// The upstream hash key the content hashes were made with; `None` for metadata only
    /// ([`fetch_metadata`]). With it, observing a cluster also hashes the copies' live content.
    pub key: Option<HashKey>,
}

impl Sources {
    pub fn get(&self, namespace: &str, resource: &ResourceRef) -> Option<&SourceData> {
        self.objects.get(&(namespace.to_string(), resource.clone()))
    }

    /// The source Secret's `type` (`None` for ConfigMaps and absent sources).
    pub fn secret_type(&self, namespace: &str, resource: &ResourceRef) -> Option<&str> {
        match self.get(namespace, resource)? {
            SourceData::Secret(s) => s.type_.as_deref(),
            SourceData::ConfigMap(_) => None,
        }
    }
}

/// Reads every source the desired copies refer to (once each, a few at a time). A missing
/// source is no error (the planner reports `SourceMissing`); any other failure is.
pub async fn fetch(
    ctx: &Ctx,
    desired: &[DesiredCopy],
    key: &HashKey,
) -> Result<Sources, PluginError> {
    let wanted: BTreeSet<(String, ResourceRef)> = desired
        .iter()
        .map(|d| (d.helmop.namespace.clone(), d.resource.clone()))
        .collect();
    let found: Vec<Option<((String, ResourceRef), SourceData)>> = futures::stream::iter(wanted)
        .map(|(ns, resource)| async move {
            let what = format!("reading source {ns}/{resource}");
            let client = ctx.upstream.clone();
            let got = match resource.kind {
                ResourceKind::Secret => Api::<Secret>::namespaced(client, &ns)
                    .get_opt(&resource.name)
                    .await
                    .map(|o| o.map(SourceData::Secret)),
                ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client, &ns)
                    .get_opt(&resource.name)
                    .await
                    .map(|o| o.map(SourceData::ConfigMap)),
            }
            .map_err(|e| api_error::upstream(&what, &e))?;
            Ok::<_, PluginError>(got.map(|data| ((ns, resource), data)))
        })
        .buffer_unordered(16)
        .try_collect()
        .await?;
    let mut sources = Sources {
        key: Some(key.clone()),
        ..Sources::default()
    };
    for ((ns, resource), data) in found.into_iter().flatten() {
        let meta = data.meta();
        sources.plan.push(SourceObject {
            namespace: ns.clone(),
            resource: resource.clone(),
            uid: meta.uid.clone().unwrap_or_default(),
            content_hash: data.content_hash(key),
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta.annotations.clone().unwrap_or_default(),
        });
        sources.objects.insert((ns, resource), data);
    }
    Ok(sources)
}

/// The sources' metadata only (uid, labels, annotations; the content hash left empty): enough to
/// plan ownership changes without reading any data (prune).
pub async fn fetch_metadata(ctx: &Ctx, desired: &[DesiredCopy]) -> Result<Sources, PluginError> {
    let wanted: BTreeSet<(String, ResourceRef)> = desired
        .iter()
        .map(|d| (d.helmop.namespace.clone(), d.resource.clone()))
        .collect();
    let found: Vec<Option<SourceObject>> = futures::stream::iter(wanted)
        .map(|(ns, resource)| async move {
            let what = format!("reading source {ns}/{resource}");
            let client = ctx.upstream.clone();
            let meta = match resource.kind {
                ResourceKind::Secret => Api::<Secret>::namespaced(client, &ns)
                    .get_metadata_opt(&resource.name)
                    .await
                    .map(|o| o.map(|m| m.metadata)),
                ResourceKind::ConfigMap => Api::<ConfigMap>::namespaced(client, &ns)
                    .get_metadata_opt(&resource.name)
                    .await
                    .map(|o| o.map(|m| m.metadata)),
            }
            .map_err(|e| api_error::upstream(&what, &e))?;
            Ok::<_, PluginError>(meta.map(|meta| SourceObject {
                namespace: ns,
                resource,
                uid: meta.uid.unwrap_or_default(),
                content_hash: String::new(),
                labels: meta.labels.unwrap_or_default(),
                annotations: meta.annotations.unwrap_or_default(),
            }))
        })
        .buffer_unordered(16)
        .try_collect()
        .await?;
    Ok(Sources {
        objects: BTreeMap::new(),
        plan: found.into_iter().flatten().collect(),
        key: None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn secret_copy_body_keeps_type_and_data_and_guards() {
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("db".into()),
                namespace: Some("team".into()),
                ..ObjectMeta::default()
            },
            type_: Some("kubernetes.io/basic-auth".into()),
            data: Some(BTreeMap::from([(
                "password".into(),
                ByteString(b"pw".to_vec()),
            )])),
            immutable: Some(true),
            ..Secret::default()
        };
        let meta = CopyMeta {
            labels: BTreeMap::from([("helmop.dev/managed-by".into(), "kubectl-helmop".into())]),
            annotations: BTreeMap::from([("helmop.dev/owners".into(), "u/team/app".into())]),
        };
        let body = serde_json::to_value(SourceData::Secret(secret).copy_body(
            "apps",
            &meta,
            Some(("uid-1", "42")),
        ))
        .unwrap();
        assert_eq!(
            body,
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {
                    "name": "db", "namespace": "apps", "uid": "uid-1", "resourceVersion": "42",
                    "labels": {"helmop.dev/managed-by": "kubectl-helmop"},
                    "annotations": {"helmop.dev/owners": "u/team/app"},
                },
                "type": "kubernetes.io/basic-auth",
                "data": {"password": "cHc="},
            })
        );
    }

    #[test]
    fn config_map_copy_body_has_both_data_maps() {
        let cm = ConfigMap {
            metadata: ObjectMeta {
                name: Some("app".into()),
                ..ObjectMeta::default()
            },
            data: Some(BTreeMap::from([("a".into(), "1".into())])),
            binary_data: Some(BTreeMap::from([("b".into(), ByteString(vec![0, 1]))])),
            ..ConfigMap::default()
        };
        let source = SourceData::ConfigMap(cm);
        let body =
            serde_json::to_value(source.copy_body("apps", &CopyMeta::default(), None)).unwrap();
        assert!(body.get("type").is_none());
        assert_eq!(body["data"], json!({"a": "1"}));
        assert_eq!(body["binaryData"], json!({"b": "AAE="}));
        assert!(body["metadata"].get("uid").is_none());
        assert_eq!(
            source.keys(),
            (
                BTreeSet::from(["a".to_string()]),
                BTreeSet::from(["b".to_string()])
            )
        );
        assert!(!format!("{source:?}").contains("\"1\""));
    }
}
