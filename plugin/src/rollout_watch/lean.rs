//! Workloads as the watcher decodes them: only what decides a stamp ever reaches memory.
//!
//! A workload that is not opted in costs the watcher its key and a few fields, however large its
//! pod template: its `spec` is skipped while the JSON is parsed, never built. Of every workload's
//! metadata only the name, namespace, uid, generation, resourceVersion, deletion time, the opt-in
//! label and `helmop.dev/restamp` are kept; `managedFields`, every other label and annotation
//! (`kubectl.kubernetes.io/last-applied-configuration` among them, which holds a whole object) are
//! skipped while parsing, as unknown fields are.
//!
//! Whether a workload is opted in needs its namespace's label, which the decoder reads from the
//! [`NamespaceLabels`] of the watch it decodes for ([`with_labels`]): `metadata` comes before
//! `spec` in every object the API server writes. Without them (or with `metadata` after `spec`)
//! the spec is kept, which is only slower.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use helmop_core::names;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use kube::api::{ApiResource, ObjectMeta};
use kube::core::DynamicResourceScope;
use serde::Deserialize;
use serde::de::{self, Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::Value;

use crate::cluster::lean_list::Key;

/// The namespaces' opt-in labels, written by the Namespace watch and read by the workload watches,
/// which index what a workload reads only when it is opted in: a workload that is not costs its
/// key and a few fields, whatever its pod template holds. The workload watches start once the
/// Namespaces listed; a namespace opted in later has its workloads read again by the loop.
pub struct NamespaceLabels {
    labels: std::sync::RwLock<std::collections::HashMap<String, Option<String>>>,
    listed: tokio::sync::watch::Sender<bool>,
}

impl NamespaceLabels {
    pub fn new() -> Arc<NamespaceLabels> {
        Arc::new(NamespaceLabels {
            labels: std::sync::RwLock::default(),
            listed: tokio::sync::watch::Sender::new(false),
        })
    }

    pub(super) fn set(&self, name: &str, label: Option<&str>) {
        if let Ok(mut labels) = self.labels.write() {
            labels.insert(name.to_owned(), label.map(str::to_owned));
        }
    }

    /// The Namespaces listed once: the workload watches may start.
    pub(super) fn mark_listed(&self) {
        self.listed.send_replace(true);
    }

    /// The opt-in label of `namespace`, if known.
    pub fn get(&self, namespace: &str) -> Option<String> {
        self.labels.read().ok()?.get(namespace).cloned().flatten()
    }

    pub(super) async fn wait_listed(&self) {
        let mut rx = self.listed.subscribe();
        // Only an error if the sender is gone, which it cannot be while `self` lives.
        let _ = rx.wait_for(|listed| *listed).await;
    }
}

thread_local! {
    /// The namespace labels of the watch being polled on this thread (see [`with_labels`]).
    static LABELS: RefCell<Option<Arc<NamespaceLabels>>> = const { RefCell::new(None) };
}

/// A workload, decoded lean.
#[derive(Clone, Debug, Default)]
pub struct LeanWorkload {
    pub metadata: ObjectMeta,
    /// `spec` (absent when skipped) and `status`.
    pub data: Value,
    /// Whether `spec` was skipped (the workload is not opted in).
    pub skipped_spec: bool,
}

impl Resource for LeanWorkload {
    type DynamicType = ApiResource;
    type Scope = DynamicResourceScope;

    fn group(dt: &ApiResource) -> Cow<'_, str> {
        dt.group.as_str().into()
    }

    fn version(dt: &ApiResource) -> Cow<'_, str> {
        dt.version.as_str().into()
    }

    fn kind(dt: &ApiResource) -> Cow<'_, str> {
        dt.kind.as_str().into()
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

/// The metadata fields kept.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct LeanMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    generation: Option<i64>,
    resource_version: Option<String>,
    deletion_timestamp: Option<Time>,
    #[serde(deserialize_with = "only_opt_in_label")]
    labels: Option<BTreeMap<String, String>>,
    #[serde(deserialize_with = "only_restamp_annotation")]
    annotations: Option<BTreeMap<String, String>>,
}

fn only_opt_in_label<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(OnlyKey(names::LABEL_ROLLOUT_ON_CHANGE))
}

fn only_restamp_annotation<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<BTreeMap<String, String>>, D::Error> {
    d.deserialize_option(OnlyKey(names::ANN_RESTAMP))
}

/// A string map of which one key is kept; the other values are skipped unparsed.
struct OnlyKey(&'static str);

impl<'de> Visitor<'de> for OnlyKey {
    type Value = Option<BTreeMap<String, String>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a map of strings")
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kept = BTreeMap::new();
        while let Some(key) = map.next_key::<Key<'de>>()? {
            if key.as_str() == self.0 {
                kept.insert(key.into_string(), map.next_value::<String>()?);
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(Some(kept))
    }
}

impl<'de> Deserialize<'de> for LeanWorkload {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(WorkloadVisitor)
    }
}

struct WorkloadVisitor;

impl<'de> Visitor<'de> for WorkloadVisitor {
    type Value = LeanWorkload;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a workload object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<LeanWorkload, A::Error> {
        let mut meta: Option<LeanMeta> = None;
        let mut data = serde_json::Map::new();
        let mut skipped_spec = false;
        while let Some(key) = map.next_key::<Key<'de>>()? {
            match key.as_str() {
                "metadata" => meta = Some(map.next_value()?),
                "spec" if meta.as_ref().is_some_and(|m| !opted_in(m)) => {
                    map.next_value::<IgnoredAny>()?;
                    skipped_spec = true;
                }
                "spec" | "status" => {
                    data.insert(key.into_string(), map.next_value()?);
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let m = meta.unwrap_or_default();
        Ok(LeanWorkload {
            metadata: ObjectMeta {
                name: m.name,
                namespace: m.namespace,
                uid: m.uid,
                generation: m.generation,
                resource_version: m.resource_version,
                deletion_timestamp: m.deletion_timestamp,
                labels: m.labels,
                annotations: m.annotations,
                ..ObjectMeta::default()
            },
            data: Value::Object(data),
            skipped_spec,
        })
    }
}

/// Whether the workload is opted in, when the namespace labels are known; else true (decode it).
fn opted_in(meta: &LeanMeta) -> bool {
    LABELS.with(|labels| {
        let labels = labels.borrow();
        let Some(labels) = labels.as_ref() else {
            return true;
        };
        let own = meta
            .labels
            .as_ref()
            .and_then(|l| l.get(names::LABEL_ROLLOUT_ON_CHANGE))
            .map(String::as_str);
        let ns = meta.namespace.as_deref().and_then(|ns| labels.get(ns));
        helmop_core::rollout::opt_in(own, ns.as_deref()).stamps()
    })
}

/// `stream`, decoding with `labels` in reach: every poll of it sets them for its thread, where
/// kube decodes the lists and events it reads.
pub fn with_labels<S>(stream: S, labels: Arc<NamespaceLabels>) -> WithLabels<S> {
    WithLabels {
        stream: Box::pin(stream),
        labels,
    }
}

/// See [`with_labels`].
pub struct WithLabels<S> {
    stream: Pin<Box<S>>,
    labels: Arc<NamespaceLabels>,
}

impl<S: futures::Stream> futures::Stream for WithLabels<S> {
    type Item = S::Item;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        let this = self.get_mut();
        let previous = LABELS.with(|l| l.replace(Some(this.labels.clone())));
        let polled = this.stream.as_mut().poll_next(cx);
        LABELS.with(|l| *l.borrow_mut() = previous);
        polled
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn decode(v: &Value, labels: Option<Arc<NamespaceLabels>>) -> LeanWorkload {
        let text = v.to_string();
        let previous = LABELS.with(|l| l.replace(labels));
        let w: LeanWorkload = serde_json::from_str(&text).unwrap();
        LABELS.with(|l| *l.borrow_mut() = previous);
        w
    }

    fn workload(labels: Value) -> Value {
        json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "web", "namespace": "apps", "uid": "u", "generation": 3,
                "resourceVersion": "9", "labels": labels,
                "annotations": {"helmop.dev/restamp": "watch:x",
                    "kubectl.kubernetes.io/last-applied-configuration": "{\"data\":{\"password\":\"hunter2\"}}"},
                "managedFields": [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]},
            "spec": {"replicas": 2, "template": {"spec": {"containers": []}}},
            "status": {"observedGeneration": 3}
        })
    }

    #[test]
    fn only_what_decides_a_stamp_is_kept() {
        let w = decode(
            &workload(json!({"app": "web", "helmop.dev/rollout-on-change": "true"})),
            None,
        );
        assert_eq!(w.metadata.name.as_deref(), Some("web"));
        assert_eq!(w.metadata.generation, Some(3));
        assert_eq!(
            w.metadata.labels,
            Some(BTreeMap::from([(
                "helmop.dev/rollout-on-change".into(),
                "true".into()
            )]))
        );
        let annotations = w.metadata.annotations.unwrap();
        assert_eq!(
            annotations.len(),
            1,
            "last-applied-configuration is never kept"
        );
        assert!(w.metadata.managed_fields.is_none());
        assert_eq!(w.data["spec"]["replicas"], 2);
        assert_eq!(w.data["status"]["observedGeneration"], 3);
        assert!(!w.skipped_spec);
    }

    #[test]
    fn the_spec_of_a_workload_not_opted_in_is_skipped() {
        let labels = NamespaceLabels::new();
        let w = decode(&workload(json!({})), Some(labels.clone()));
        assert!(w.skipped_spec && w.data.get("spec").is_none());
        assert_eq!(
            w.data["status"]["observedGeneration"], 3,
            "the status stays"
        );
        // Opted in by its own label, or by its namespace's.
        let w = decode(
            &workload(json!({"helmop.dev/rollout-on-change": "true"})),
            Some(labels.clone()),
        );
        assert!(!w.skipped_spec);
        labels.set("apps", Some("enabled"));
        assert!(!decode(&workload(json!({})), Some(labels.clone())).skipped_spec);
        let out = json!({"helmop.dev/rollout-on-change": "false"});
        assert!(decode(&workload(out), Some(labels)).skipped_spec);
    }
}
