//! Lists read without `managedFields`. A listed object's field-ownership entries are often the
//! larger part of its metadata, and no list helmop makes reads them (only the answer to its own
//! apply does, in `run::propagate::apply`): decoding them into `ManagedFieldsEntry` values was a
//! twentieth of a watcher's CPU during edits (docs/performance.md, "Lists without
//! managedFields"). They are skipped as the JSON is read; every other field is decoded by its
//! own type, exactly as kube's `Api::list` and `Api::list_metadata` decode it. A list that cannot
//! be decoded is an error naming serde's reason only: unlike kube's own decoding, the answer's
//! text is not logged.

use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{ApiResource, DynamicObject, ListParams, ObjectList, TypeMeta};
use kube::core::Request;
use kube::{Client, Resource};
use serde::de::{self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, de::value::MapAccessDeserializer};
use serde_json::{Map, Value};

const MANAGED_FIELDS: &str = "managedFields";

/// One page of `K`'s metadata (`as=PartialObjectMetadataList`) in `namespace` (all for `None`).
pub async fn metadata_page<K>(
    client: &Client,
    namespace: Option<&str>,
    params: &ListParams,
) -> Result<(Vec<ObjectMeta>, Option<String>), kube::Error>
where
    K: Resource<DynamicType = ()>,
{
    let request = Request::new(K::url_path(&(), namespace))
        .list_metadata(params)
        .map_err(kube::Error::BuildRequest)?;
    metadata_items(&client.request_text(request).await?).map_err(kube::Error::SerdeError)
}

/// A metadata list page's objects and its continue token, read from the server's answer.
pub fn metadata_items(text: &str) -> Result<(Vec<ObjectMeta>, Option<String>), serde_json::Error> {
    let page: ObjectList<Lean> = serde_json::from_str(text)?;
    let items = page.items.into_iter().map(|i| i.metadata).collect();
    Ok((items, page.metadata.continue_))
}

/// Every object of `resource` in `namespace` matching `params`, whole but for `managedFields`.
pub async fn dynamic(
    client: &Client,
    resource: &ApiResource,
    namespace: &str,
    params: &ListParams,
) -> Result<Vec<DynamicObject>, kube::Error> {
    let request = Request::new(DynamicObject::url_path(resource, Some(namespace)))
        .list(params)
        .map_err(kube::Error::BuildRequest)?;
    dynamic_items(&client.request_text(request).await?).map_err(kube::Error::SerdeError)
}

/// A list's objects, read from the server's answer.
pub fn dynamic_items(text: &str) -> Result<Vec<DynamicObject>, serde_json::Error> {
    let page: ObjectList<LeanDynamic> = serde_json::from_str(text)?;
    Ok(page.items.into_iter().map(|i| i.0).collect())
}

/// A listed object's metadata.
#[derive(Clone, Deserialize)]
struct Lean {
    #[serde(deserialize_with = "without_managed_fields")]
    metadata: ObjectMeta,
}

/// `ObjectMeta` as its own decoder reads it, with `managedFields` skipped unread.
pub fn without_managed_fields<'de, D: Deserializer<'de>>(d: D) -> Result<ObjectMeta, D::Error> {
    struct Meta;
    impl<'de> Visitor<'de> for Meta {
        type Value = ObjectMeta;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("object metadata")
        }
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<ObjectMeta, A::Error> {
            ObjectMeta::deserialize(MapAccessDeserializer::new(Skipping(map)))
        }
    }
    d.deserialize_map(Meta)
}

/// A map with its `managedFields` entry passed over.
struct Skipping<A>(A);

impl<'de, A: MapAccess<'de>> MapAccess<'de> for Skipping<A> {
    type Error = A::Error;

    fn next_key_seed<S: DeserializeSeed<'de>>(
        &mut self,
        seed: S,
    ) -> Result<Option<S::Value>, A::Error> {
        loop {
            let Some(key) = self.0.next_key::<Key<'de>>()? else {
                return Ok(None);
            };
            if key.as_str() == MANAGED_FIELDS {
                self.0.next_value::<IgnoredAny>()?;
                continue;
            }
            return match key {
                Key::Borrowed(k) => seed
                    .deserialize(de::value::BorrowedStrDeserializer::new(k))
                    .map(Some),
                Key::Owned(k) => seed
                    .deserialize(de::value::StringDeserializer::new(k))
                    .map(Some),
            };
        }
    }

    fn next_value_seed<S: DeserializeSeed<'de>>(&mut self, seed: S) -> Result<S::Value, A::Error> {
        self.0.next_value_seed(seed)
    }
}

/// A map key, borrowed from the input when it holds no escapes.
pub(crate) enum Key<'de> {
    Borrowed(&'de str),
    Owned(String),
}

impl Key<'_> {
    pub(crate) fn as_str(&self) -> &str {
        match self {
            Key::Borrowed(k) => k,
            Key::Owned(k) => k,
        }
    }

    pub(crate) fn into_string(self) -> String {
        match self {
            Key::Borrowed(k) => k.to_owned(),
            Key::Owned(k) => k,
        }
    }
}

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct K;
        impl<'de> Visitor<'de> for K {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key::Borrowed(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v.to_owned()))
            }
            fn visit_string<E: de::Error>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key::Owned(v))
            }
        }
        d.deserialize_str(K)
    }
}

/// A listed object as kube's `DynamicObject` holds it (`apiVersion` and `kind` as its type when
/// both are strings, and out of `data` either way; `metadata`; everything else as `data`),
/// without `managedFields`.
#[derive(Clone)]
struct LeanDynamic(DynamicObject);

impl<'de> Deserialize<'de> for LeanDynamic {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = LeanDynamic;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LeanDynamic, A::Error> {
                let mut metadata = None;
                let mut data = Map::new();
                while let Some(key) = map.next_key::<Key<'de>>()? {
                    if key.as_str() == "metadata" {
                        metadata = Some(map.next_value_seed(MetaSeed)?);
                    } else {
                        let value: Value = map.next_value()?;
                        data.insert(key.into_string(), value);
                    }
                }
                let metadata = metadata.ok_or_else(|| de::Error::missing_field("metadata"))?;
                // kube's flattened type takes both fields out of the data, type or not.
                let types = match (data.remove("apiVersion"), data.remove("kind")) {
                    (Some(Value::String(api_version)), Some(Value::String(kind))) => {
                        Some(TypeMeta { api_version, kind })
                    }
                    _ => None,
                };
                Ok(LeanDynamic(DynamicObject {
                    types,
                    metadata,
                    data: Value::Object(data),
                }))
            }
        }
        d.deserialize_map(Object)
    }
}

struct MetaSeed;

impl<'de> DeserializeSeed<'de> for MetaSeed {
    type Value = ObjectMeta;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<ObjectMeta, D::Error> {
        without_managed_fields(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Deployment as a list returns it: type, metadata with two managers' entries, spec, status.
    fn deployment(with_type: bool) -> Value {
        let mut d = serde_json::json!({
            "metadata": {
                "name": "web",
                "namespace": "shop",
                "uid": "u-1",
                "resourceVersion": "42",
                "generation": 3,
                "creationTimestamp": "2026-12-05T10:00:00Z",
                "labels": {"app": "web", "helmop.dev/rollout-on-change": "true"},
                "annotations": {"note": "a \"quoted\" value", "k\u{e9}y": "escaped key"},
                "ownerReferences": [{"apiVersion": "v1", "kind": "X", "name": "o", "uid": "u-0"}],
                "finalizers": ["f"],
                "managedFields": [
                    {"manager": "kubectl", "operation": "Apply", "apiVersion": "apps/v1",
                     "fieldsType": "FieldsV1", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
                    {"manager": "kube-controller-manager", "operation": "Update", "apiVersion": "apps/v1",
                     "time": "2026-12-05T10:00:01Z", "fieldsType": "FieldsV1",
                     "fieldsV1": {"f:status": {}}, "subresource": "status"}
                ]
            },
            "spec": {"replicas": 2, "template": {"metadata": {"annotations": {"helmop.dev/config-hash": "h"}}}},
            "status": {"replicas": 2}
        });
        if with_type {
            d["apiVersion"] = "apps/v1".into();
            d["kind"] = "Deployment".into();
        }
        d
    }

    fn list(items: Vec<Value>) -> String {
        serde_json::json!({
            "apiVersion": "apps/v1",
            "kind": "DeploymentList",
            "metadata": {"resourceVersion": "50", "continue": "next"},
            "items": items,
        })
        .to_string()
    }

    #[test]
    fn a_dynamic_list_reads_as_kube_reads_it_but_for_managed_fields() {
        for with_type in [false, true] {
            let text = list(vec![deployment(with_type)]);
            let mut want: ObjectList<DynamicObject> = serde_json::from_str(&text).unwrap();
            let got: ObjectList<LeanDynamic> = serde_json::from_str(&text).unwrap();
            assert!(want.items[0].metadata.managed_fields.is_some());
            want.items[0].metadata.managed_fields = None;
            let got: Vec<DynamicObject> = got.items.into_iter().map(|i| i.0).collect();
            assert_eq!(got, want.items, "with apiVersion and kind: {with_type}");
        }
    }

    #[test]
    fn a_metadata_list_reads_as_kube_reads_it_but_for_managed_fields() {
        let text = list(vec![deployment(true), deployment(false)]);
        let want: ObjectList<
            kube::core::PartialObjectMeta<k8s_openapi::api::apps::v1::Deployment>,
        > = serde_json::from_str(&text).unwrap();
        let got: ObjectList<Lean> = serde_json::from_str(&text).unwrap();
        assert_eq!(got.metadata.continue_.as_deref(), Some("next"));
        assert_eq!(got.items.len(), 2);
        for (got, want) in got.items.iter().zip(&want.items) {
            let mut want = want.metadata.clone();
            assert!(want.managed_fields.is_some());
            want.managed_fields = None;
            assert_eq!(got.metadata, want);
        }
    }

    /// Keys written with escapes are read owned rather than borrowed, and decide the same.
    #[test]
    fn escaped_keys_read_as_plain_ones() {
        let text = r#"{"items": [{"k\u0069nd": "Deployment", "apiVersion": "apps/v1",
            "metadata": {"n\u0061me": "web", "m\u0061nagedFields": [{"manager": "m"}]},
            "sp\u0065c": {"replicas": 1}}]}"#;
        let want: ObjectList<DynamicObject> = serde_json::from_str(text).unwrap();
        let got: ObjectList<LeanDynamic> = serde_json::from_str(text).unwrap();
        let mut want = want.items[0].clone();
        assert!(want.metadata.managed_fields.is_some());
        want.metadata.managed_fields = None;
        assert_eq!(got.items[0].0, want);
        assert_eq!(got.items[0].0.metadata.name.as_deref(), Some("web"));
        let meta: ObjectList<Lean> = serde_json::from_str(text).unwrap();
        assert_eq!(meta.items[0].metadata, want.metadata);
    }

    /// Only one of `apiVersion` and `kind`: no type, and neither in `data`, as kube reads it.
    #[test]
    fn half_a_type_stays_data() {
        for half in [("apiVersion", "apps/v1"), ("kind", "Deployment")] {
            let mut d = deployment(false);
            d[half.0] = half.1.into();
            let text = list(vec![d]);
            let want: ObjectList<DynamicObject> = serde_json::from_str(&text).unwrap();
            let got: ObjectList<LeanDynamic> = serde_json::from_str(&text).unwrap();
            let mut want = want.items[0].clone();
            want.metadata.managed_fields = None;
            assert_eq!(got.items[0].0, want, "{}", half.0);
        }
    }

    #[test]
    fn bad_metadata_is_an_error_not_a_default() {
        for bad in [
            r#"{"items": [{"metadata": {"name": 7}}]}"#,
            r#"{"items": [{"metadata": {"managedFields": [}}]}"#,
            r#"{"items": [{"metadata": []}]}"#,
            r#"{"items": [{"spec": {}}]}"#,
        ] {
            let as_dynamic = serde_json::from_str::<ObjectList<LeanDynamic>>(bad);
            assert!(as_dynamic.is_err(), "{bad}");
            if !bad.contains("spec") {
                assert!(
                    serde_json::from_str::<ObjectList<Lean>>(bad).is_err(),
                    "{bad}"
                );
            }
        }
    }
}
