//! A HelmOp as the delete guard's cache holds it: its identity, whether it allows missing objects,
//! and the Secrets and ConfigMaps it lists. Decoded straight from the API server's JSON, one object at
//! a time: `helm.values`, `status`, `managedFields` and every annotation but one are skipped by the
//! parser without being built, so a HelmOp carrying megabytes of dense values costs its list page's
//! bytes while it is read and a few bytes per reference afterwards (a `DynamicObject` first parsed
//! whole and trimmed later peaked at many times the page: 12 HelmOps of 1.4 MB crash-looped the pod).

use std::borrow::Cow;
use std::fmt;

use helmop_core::names::ANN_ALLOW_MISSING;
use helmop_core::resource::ResourceRef;
use helmop_core::validate::downstream_refs;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{ApiResource, ObjectMeta};
use kube::core::DynamicResourceScope;
use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Entries kept per `downstreamResources` list, and targets kept per HelmOp. An admission checks at
/// most [`crate::caps::MAX_REFERENCES`] references, so a HelmOp admitted by this webhook never comes
/// near; what a HelmOp stored around the webhook lists beyond these is not guarded (the bound on what
/// one stored object may cost the cache: at most 256 x 257 entries of two strings while it is read).
pub const MAX_LIST_ENTRIES: usize = crate::caps::MAX_REFERENCES;

/// What the delete guard knows of one HelmOp.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct GuardedHelmOp {
    /// Name, namespace, uid, resourceVersion and deletionTimestamp only.
    pub metadata: ObjectMeta,
    /// `helmop.dev/allow-missing: "true"`: the HelmOp claims names that may not exist yet.
    pub allow_missing: bool,
    /// The distinct well-formed references of `spec.downstreamResources` and
    /// `spec.targets[].downstreamResources` (core's `downstream_refs`), sorted.
    pub refs: Vec<ResourceRef>,
}

impl kube::Resource for GuardedHelmOp {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
    }
    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }
    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }
    fn api_version(dt: &ApiResource) -> Cow<'_, str> {
        dt.api_version.as_str().into()
    }
    fn plural(dt: &ApiResource) -> Cow<'_, str> {
        dt.plural.as_str().into()
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// The `visit_*` methods of the JSON scalars (and `null`) a visitor answers with `$value`, whatever
/// they hold: the shapes the decoders below take as "not what was looked for".
macro_rules! scalars_are {
    ($ty:ty, $value:expr) => {
        fn visit_bool<E>(self, _: bool) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_i64<E>(self, _: i64) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_u64<E>(self, _: u64) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_f64<E>(self, _: f64) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_unit<E>(self) -> Result<$ty, E> {
            Ok($value)
        }
        fn visit_none<E>(self) -> Result<$ty, E> {
            Ok($value)
        }
    };
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Meta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    #[serde(default)]
    annotations: AllowMissing,
}

/// Of all annotations, whether `helmop.dev/allow-missing` is exactly `"true"`; the others (a
/// last-applied copy of the whole object among them) are skipped unbuilt.
#[derive(Default)]
struct AllowMissing(bool);

impl<'de> Deserialize<'de> for AllowMissing {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AllowMissing;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("annotations")
            }
            scalars_are!(AllowMissing, AllowMissing(false));
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<AllowMissing, A::Error> {
                let mut allow = false;
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    if key == ANN_ALLOW_MISSING {
                        allow = map.next_value::<Text>()?.0.as_deref() == Some("true");
                    } else {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                Ok(AllowMissing(allow))
            }
        }
        d.deserialize_any(V)
    }
}

/// A string, or `None` for any other JSON value (consumed without being built).
struct Text(Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Text;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            scalars_are!(Text, Text(None));
            fn visit_str<E>(self, s: &str) -> Result<Text, E> {
                Ok(Text(Some(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Text, E> {
                Ok(Text(Some(s)))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Text, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Text, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Text(None))
            }
        }
        d.deserialize_any(V)
    }
}

/// A `downstreamResources` entry: its `kind` and `name` when they are strings, everything else skipped.
/// Not an object: `Junk` (the rules skip it too).
enum Entry {
    Ref {
        kind: Option<String>,
        name: Option<String>,
    },
    Junk,
}

impl Entry {
    fn to_json(&self) -> Value {
        match self {
            Entry::Ref { kind, name } => {
                let mut o = serde_json::Map::new();
                if let Some(k) = kind {
                    o.insert("kind".into(), k.as_str().into());
                }
                if let Some(n) = name {
                    o.insert("name".into(), n.as_str().into());
                }
                Value::Object(o)
            }
            Entry::Junk => Value::Null,
        }
    }
}

impl<'de> Deserialize<'de> for Entry {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Entry;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a downstreamResources entry")
            }
            scalars_are!(Entry, Entry::Junk);
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Entry, A::Error> {
                let (mut kind, mut name) = (None, None);
                while let Some(key) = map.next_key::<Cow<'de, str>>()? {
                    match &*key {
                        "kind" => kind = map.next_value::<Text>()?.0,
                        "name" => name = map.next_value::<Text>()?.0,
                        _ => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                Ok(Entry::Ref { kind, name })
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Entry, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Entry::Junk)
            }
            fn visit_str<E>(self, _: &str) -> Result<Entry, E> {
                Ok(Entry::Junk)
            }
        }
        d.deserialize_any(V)
    }
}

/// The first [`MAX_LIST_ENTRIES`] elements of a list (the rest consumed unbuilt); not a list: none.
struct Capped<T>(Vec<T>);

impl<T> Default for Capped<T> {
    fn default() -> Self {
        Capped(Vec::new())
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Capped<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = Capped<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list")
            }
            scalars_are!(Capped<T>, Capped::default());
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Capped<T>, A::Error> {
                let mut out = Vec::new();
                while out.len() < MAX_LIST_ENTRIES {
                    match seq.next_element::<T>()? {
                        Some(e) => out.push(e),
                        None => return Ok(Capped(out)),
                    }
                }
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Capped(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Capped<T>, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Capped::default())
            }
            fn visit_str<E>(self, _: &str) -> Result<Capped<T>, E> {
                Ok(Capped::default())
            }
        }
        d.deserialize_any(V(std::marker::PhantomData))
    }
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Target {
    #[serde(default)]
    downstream_resources: Capped<Entry>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Spec {
    #[serde(default)]
    downstream_resources: Capped<Entry>,
    #[serde(default)]
    targets: Capped<Target>,
}

#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    metadata: Meta,
    #[serde(default)]
    spec: Option<Spec>,
}

impl<'de> Deserialize<'de> for GuardedHelmOp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let wire = Wire::deserialize(d)?;
        let spec = wire.spec.unwrap_or_default();
        // The well-formedness rules stay core's: the kept entries go through `downstream_refs`.
        let list =
            |entries: &Capped<Entry>| Value::Array(entries.0.iter().map(Entry::to_json).collect());
        let targets: Vec<Value> = spec
            .targets
            .0
            .iter()
            .map(|t| json!({"downstreamResources": list(&t.downstream_resources)}))
            .collect();
        let doc = json!({"spec": {"downstreamResources": list(&spec.downstream_resources), "targets": targets}});
        let mut refs: Vec<ResourceRef> =
            downstream_refs(&doc).into_iter().map(|(_, r)| r).collect();
        refs.sort();
        refs.dedup();
        let m = wire.metadata;
        Ok(GuardedHelmOp {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                resource_version: m.resource_version,
                deletion_timestamp: m.deletion_timestamp,
                ..ObjectMeta::default()
            },
            allow_missing: m.annotations.0,
            refs,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn guarded(v: &Value) -> GuardedHelmOp {
        serde_json::from_value(v.clone()).unwrap()
    }

    fn refs_of(v: &Value) -> Vec<ResourceRef> {
        let mut r: Vec<ResourceRef> = downstream_refs(v).into_iter().map(|(_, r)| r).collect();
        r.sort();
        r.dedup();
        r
    }

    #[test]
    fn keeps_identity_references_and_allow_missing_only() {
        let h = json!({
            "apiVersion": "fleet.cattle.io/v1alpha1", "kind": "HelmOp",
            "metadata": {"name": "app", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                         "annotations": {"helmop.dev/allow-missing": "true", "big": "x".repeat(1 << 16)},
                         "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
            "spec": {
                "helm": {"chart": "app", "values": {"big": [0, 0, 0]}},
                "downstreamResources": [{"kind": "Secret", "name": "db"}, {"kind": "Secret", "name": "db"}],
                "targets": [{"clusterName": "a", "helm": {"values": {"y": 1}}},
                            {"downstreamResources": [{"kind": "ConfigMap", "name": "cfg", "extra": {"a": [1]}}]}],
            },
            "status": {"display": {"state": "Ready"}},
        });
        let g = guarded(&h);
        assert_eq!(g.metadata.name.as_deref(), Some("app"));
        assert_eq!(g.metadata.resource_version.as_deref(), Some("7"));
        assert!(g.metadata.annotations.is_none() && g.metadata.managed_fields.is_none());
        assert!(g.allow_missing);
        assert_eq!(
            g.refs,
            vec![ResourceRef::secret("db"), ResourceRef::config_map("cfg")]
        );
        let mut no = h.clone();
        no["metadata"]["annotations"]["helmop.dev/allow-missing"] = json!("yes");
        assert!(!guarded(&no).allow_missing);
    }

    #[test]
    fn lists_are_capped_and_odd_shapes_are_no_references() {
        let many: Vec<Value> = (0..MAX_LIST_ENTRIES + 10)
            .map(|i| json!({"kind": "Secret", "name": format!("s{i}")}))
            .collect();
        let g = guarded(&json!({"spec": {"downstreamResources": many}}));
        assert_eq!(g.refs.len(), MAX_LIST_ENTRIES);
        for odd in [
            json!({"spec": null}),
            json!({"spec": {"targets": "x"}}),
            json!({}),
            json!({"spec": {"downstreamResources": {"a": 1}}}),
        ] {
            assert!(guarded(&odd).refs.is_empty(), "{odd}");
        }
    }

    fn arb_entry() -> impl Strategy<Value = Value> {
        prop_oneof![
            (
                "[a-z]{1,5}",
                prop_oneof![
                    Just("Secret"),
                    Just("ConfigMap"),
                    Just("secret"),
                    Just("Pod")
                ]
            )
                .prop_map(|(name, kind)| json!({"kind": kind, "name": name})),
            Just(json!({"kind": "Secret"})),
            Just(json!({"kind": 1, "name": "a"})),
            Just(json!("junk")),
            Just(json!([1, 2])),
        ]
    }

    proptest! {
        /// The cache's references are exactly what the rules read from the whole object.
        #[test]
        fn references_equal_the_rules_on_the_whole_object(
            root in proptest::collection::vec(arb_entry(), 0..4),
            targets in proptest::collection::vec(proptest::option::of(proptest::collection::vec(arb_entry(), 0..3)), 0..4),
        ) {
            let targets: Vec<Value> = targets
                .into_iter()
                .map(|t| match t {
                    Some(entries) => json!({"clusterName": "c", "downstreamResources": entries, "helm": {"values": {"a": 1}}}),
                    None => json!({"clusterName": "c"}),
                })
                .collect();
            let h = json!({"spec": {"helm": {"values": {"v": 1}}, "downstreamResources": root, "targets": targets}});
            prop_assert_eq!(guarded(&h).refs, refs_of(&h));
        }
    }
}
