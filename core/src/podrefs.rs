//! Which ConfigMaps and Secrets a pod reads, and which of their keys it can observe.
//!
//! Counted as reads: `configMap`/`secret` volumes (all keys, or the `items` keys), the same inside
//! `projected` volumes, `envFrom` (all keys) and `env[].valueFrom.{configMapKeyRef,secretKeyRef}`
//! (the one key), in containers, init containers and ephemeral containers (the API server refuses
//! ephemeral containers in templates, but a plain Pod may have them).
//!
//! Not counted, because no process in the pod reads them: `imagePullSecrets` (the kubelet uses
//! them to pull), and the credential Secrets of volume plugins (`csi.nodePublishSecretRef`,
//! `cephfs.secretRef`, `rbd.secretRef`, `azureFile.secretName`, `flexVolume.secretRef`, ...),
//! which the node uses to mount. Declared volumes count even when no container mounts them:
//! the kubelet still needs them to start the pod.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Container, EnvFromSource, EnvVar, KeyToPath, PodSpec, Volume};
use serde::Deserialize;
use serde_json::Value;

use crate::resource::{ResourceKind, ResourceRef};

/// The keys of an object a pod can observe.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Keys {
    /// Every key (`envFrom`, whole-object volumes): adding or removing a key is visible too.
    All,
    /// Only these keys (`items`, key refs); other keys may change without the pod noticing.
    Some(BTreeSet<String>),
}

impl Keys {
    /// One key.
    pub fn one(key: impl Into<String>) -> Keys {
        Keys::Some(BTreeSet::from([key.into()]))
    }

    /// What a pod observes through both `self` and `other`.
    pub fn merge(&mut self, other: Keys) {
        match (&mut *self, other) {
            (Keys::All, _) => {}
            (this @ Keys::Some(_), Keys::All) => *this = Keys::All,
            (Keys::Some(mine), Keys::Some(theirs)) => mine.extend(theirs),
        }
    }

    pub fn is_all(&self) -> bool {
        matches!(self, Keys::All)
    }
}

/// One ConfigMap or Secret a pod reads, merged over every place it is referenced.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodRef {
    pub resource: ResourceRef,
    pub keys: Keys,
    /// True only when every reference to the object is optional: one required reference
    /// means the pod cannot start without it.
    pub optional: bool,
}

impl PodRef {
    pub fn new(resource: ResourceRef, keys: Keys, optional: bool) -> PodRef {
        PodRef {
            resource,
            keys,
            optional,
        }
    }
}

/// Why a PodSpec could not be read.
#[derive(Debug, thiserror::Error)]
#[error("pod spec is not a valid PodSpec: {0}")]
pub struct PodSpecError(#[from] serde_json::Error);

/// Collects references, merging per object; iteration order is `(kind lower-case, name)`, the
/// order `config-refs` prints them in.
#[derive(Default)]
struct Collector {
    refs: BTreeMap<(&'static str, String), PodRef>,
}

impl Collector {
    fn add(&mut self, kind: ResourceKind, name: Option<&str>, keys: Keys, optional: Option<bool>) {
        // An empty name is invalid and would be refused by the API server; nothing to read.
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return;
        };
        let optional = optional.unwrap_or(false);
        self.refs
            .entry((kind.lower(), name.to_string()))
            .and_modify(|r| {
                r.keys.merge(keys.clone());
                r.optional &= optional;
            })
            .or_insert_with(|| PodRef::new(ResourceRef::new(kind, name), keys.clone(), optional));
    }

    fn volume(&mut self, volume: &Volume) {
        if let Some(cm) = &volume.config_map {
            let keys = item_keys(cm.items.as_deref());
            self.add(ResourceKind::ConfigMap, Some(&cm.name), keys, cm.optional);
        }
        if let Some(secret) = &volume.secret {
            let keys = item_keys(secret.items.as_deref());
            self.add(
                ResourceKind::Secret,
                secret.secret_name.as_deref(),
                keys,
                secret.optional,
            );
        }
        let sources = volume.projected.as_ref().and_then(|p| p.sources.as_deref());
        for source in sources.unwrap_or_default() {
            if let Some(cm) = &source.config_map {
                let keys = item_keys(cm.items.as_deref());
                self.add(ResourceKind::ConfigMap, Some(&cm.name), keys, cm.optional);
            }
            if let Some(secret) = &source.secret {
                let keys = item_keys(secret.items.as_deref());
                self.add(
                    ResourceKind::Secret,
                    Some(&secret.name),
                    keys,
                    secret.optional,
                );
            }
        }
    }

    fn container(&mut self, env_from: Option<&[EnvFromSource]>, env: Option<&[EnvVar]>) {
        for source in env_from.unwrap_or_default() {
            if let Some(cm) = &source.config_map_ref {
                self.add(
                    ResourceKind::ConfigMap,
                    Some(&cm.name),
                    Keys::All,
                    cm.optional,
                );
            }
            if let Some(secret) = &source.secret_ref {
                self.add(
                    ResourceKind::Secret,
                    Some(&secret.name),
                    Keys::All,
                    secret.optional,
                );
            }
        }
        for var in env.unwrap_or_default() {
            let Some(from) = &var.value_from else {
                continue;
            };
            if let Some(r) = &from.config_map_key_ref {
                let keys = Keys::one(r.key.as_str());
                self.add(ResourceKind::ConfigMap, Some(&r.name), keys, r.optional);
            }
            if let Some(r) = &from.secret_key_ref {
                let keys = Keys::one(r.key.as_str());
                self.add(ResourceKind::Secret, Some(&r.name), keys, r.optional);
            }
        }
    }
}

fn item_keys(items: Option<&[KeyToPath]>) -> Keys {
    match items {
        // `items: []` behaves like no items: the kubelet projects every key.
        None | Some([]) => Keys::All,
        Some(items) => Keys::Some(items.iter().map(|i| i.key.clone()).collect()),
    }
}

/// Every ConfigMap and Secret `spec` reads, one entry per object, ordered by
/// (lower-case kind, name): ConfigMaps first.
pub fn pod_refs(spec: &PodSpec) -> Vec<PodRef> {
    let mut c = Collector::default();
    for volume in spec.volumes.as_deref().unwrap_or_default() {
        c.volume(volume);
    }
    let containers: Vec<&Container> = spec
        .containers
        .iter()
        .chain(spec.init_containers.as_deref().unwrap_or_default())
        .collect();
    for container in containers {
        c.container(container.env_from.as_deref(), container.env.as_deref());
    }
    for container in spec.ephemeral_containers.as_deref().unwrap_or_default() {
        c.container(container.env_from.as_deref(), container.env.as_deref());
    }
    c.refs.into_values().collect()
}

/// [`pod_refs`] on a PodSpec held as JSON (e.g. [`crate::workload::PodTemplate::spec`]).
/// Unknown fields are ignored; a field of the wrong type is an error, because guessing would
/// risk a stamp that misses a reference.
pub fn pod_refs_from_value(spec: &Value) -> Result<Vec<PodRef>, PodSpecError> {
    let spec = PodSpec::deserialize(spec)?;
    Ok(pod_refs(&spec))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn refs(spec: Value) -> Vec<PodRef> {
        pod_refs_from_value(&spec).unwrap()
    }

    fn some(keys: &[&str]) -> Keys {
        Keys::Some(keys.iter().map(|k| k.to_string()).collect())
    }

    fn cm(name: &str, keys: Keys, optional: bool) -> PodRef {
        PodRef::new(ResourceRef::config_map(name), keys, optional)
    }

    fn secret(name: &str, keys: Keys, optional: bool) -> PodRef {
        PodRef::new(ResourceRef::secret(name), keys, optional)
    }

    #[test]
    fn every_reference_site() {
        let spec = json!({
            "volumes": [
                {"name": "v1", "configMap": {"name": "cm-vol"}},
                {"name": "v2", "configMap": {"name": "cm-items", "items": [
                    {"key": "b", "path": "x"}, {"key": "a", "path": "y"}]}},
                {"name": "v3", "secret": {"secretName": "s-vol", "optional": true}},
                {"name": "v4", "secret": {"secretName": "s-items", "items": [{"key": "k", "path": "k"}]}},
                {"name": "v5", "projected": {"sources": [
                    {"configMap": {"name": "cm-proj", "items": [{"key": "p", "path": "p"}]}},
                    {"secret": {"name": "s-proj"}},
                    {"serviceAccountToken": {"path": "token"}},
                    {"downwardAPI": {"items": []}}
                ]}},
                {"name": "v6", "emptyDir": {}},
                {"name": "v7", "csi": {"driver": "d", "nodePublishSecretRef": {"name": "csi-creds"}}}
            ],
            "imagePullSecrets": [{"name": "regcred"}],
            "initContainers": [{"name": "init", "envFrom": [{"secretRef": {"name": "s-init"}}]}],
            "containers": [{
                "name": "app",
                "envFrom": [{"configMapRef": {"name": "cm-envfrom", "optional": true}, "prefix": "X_"}],
                "env": [
                    {"name": "A", "value": "plain"},
                    {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "cm-key", "key": "kb"}}},
                    {"name": "C", "valueFrom": {"secretKeyRef": {"name": "s-key", "key": "kc", "optional": true}}},
                    {"name": "D", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}
                ]
            }],
            "ephemeralContainers": [{"name": "debug", "env": [
                {"name": "E", "valueFrom": {"secretKeyRef": {"name": "s-eph", "key": "ke"}}}]}]
        });
        assert_eq!(
            refs(spec),
            vec![
                cm("cm-envfrom", Keys::All, true),
                cm("cm-items", some(&["a", "b"]), false),
                cm("cm-key", some(&["kb"]), false),
                cm("cm-proj", some(&["p"]), false),
                cm("cm-vol", Keys::All, false),
                secret("s-eph", some(&["ke"]), false),
                secret("s-init", Keys::All, false),
                secret("s-items", some(&["k"]), false),
                secret("s-key", some(&["kc"]), true),
                secret("s-proj", Keys::All, false),
                secret("s-vol", Keys::All, true),
            ]
        );
    }

    #[test]
    fn merges_keys_and_optionality_per_object() {
        let spec = json!({"containers": [
            {"name": "a", "env": [
                {"name": "X", "valueFrom": {"secretKeyRef": {"name": "db", "key": "user", "optional": true}}},
                {"name": "Y", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password", "optional": true}}}
            ]},
            {"name": "b", "env": [
                {"name": "Z", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "k", "optional": true}}}
            ], "envFrom": [{"configMapRef": {"name": "app"}}]}
        ]});
        assert_eq!(
            refs(spec),
            vec![
                // envFrom widens to all keys and its required reference makes it required.
                cm("app", Keys::All, false),
                secret("db", some(&["password", "user"]), true),
            ]
        );
    }

    #[test]
    fn same_name_different_kind_are_distinct() {
        let spec = json!({"containers": [{"name": "a", "envFrom": [
            {"secretRef": {"name": "x"}}, {"configMapRef": {"name": "x"}}]}]});
        assert_eq!(
            refs(spec),
            vec![cm("x", Keys::All, false), secret("x", Keys::All, false)]
        );
    }

    #[test]
    fn empty_items_means_all_keys_and_empty_names_are_skipped() {
        let spec = json!({
            "volumes": [{"name": "v", "configMap": {"name": "c", "items": []}},
                        {"name": "w", "secret": {}}],
            "containers": [{"name": "a", "envFrom": [{"configMapRef": {"name": ""}}]}]
        });
        assert_eq!(refs(spec), vec![cm("c", Keys::All, false)]);
    }

    #[test]
    fn reads_nothing() {
        assert_eq!(
            refs(json!({"containers": [{"name": "a", "image": "x"}]})),
            vec![]
        );
        assert_eq!(refs(json!({})), vec![]);
    }

    #[test]
    fn wrong_types_are_an_error_not_a_panic() {
        assert!(pod_refs_from_value(&json!({"containers": 5})).is_err());
        assert!(pod_refs_from_value(&json!("spec")).is_err());
        let err = pod_refs_from_value(&json!({"volumes": [{"name": 1}]})).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("pod spec is not a valid PodSpec")
        );
    }

    #[test]
    fn typed_and_json_paths_agree() {
        let spec =
            json!({"containers": [{"name": "a", "envFrom": [{"secretRef": {"name": "s"}}]}]});
        let typed: PodSpec = serde_json::from_value(spec.clone()).unwrap();
        assert_eq!(pod_refs(&typed), refs(spec));
    }

    #[test]
    fn keys_merge_table() {
        let mut k = some(&["a"]);
        k.merge(some(&["b"]));
        assert_eq!(k, some(&["a", "b"]));
        k.merge(Keys::All);
        assert_eq!(k, Keys::All);
        k.merge(some(&["c"]));
        assert_eq!(k, Keys::All);
        assert!(k.is_all());
    }
}
