//! Which ConfigMaps and Secrets a pod reads, and which of their keys it can observe.
//!
//! Counted as reads: `configMap`/`secret` volumes (all keys, or the `items` keys), the same inside
//! `projected` volumes, `envFrom` (all keys) and `env[].valueFrom.{configMapKeyRef,secretKeyRef}`
//! (the one key), in containers, init containers and ephemeral containers (the API server refuses
//! ephemeral containers in templates, but a plain Pod may have them).
//!
//! What each reference reads is what the kubelet reads (`makeEnvironmentVariables` in
//! `pkg/kubelet/kubelet_pods.go` and the configMap/secret/projected volume plugins), kept in
//! [`Reads`]; where kubelet versions differ, helmop follows the newest one, because a missed
//! rollout is worse than an extra one:
//! - a volume without `items` every key of `data` and `binaryData`; with `items` those keys, each
//!   from `data` or else `binaryData`;
//! - `envFrom` only `data`, and every key of it, whatever name the key makes with the source's
//!   `prefix`. From Kubernetes 1.30 on, `makeEnvironmentVariables` sets `prefix + key` for each key
//!   without checking the name (kubernetes/kubernetes#123385, release notes of v1.30; read in
//!   `pkg/kubelet/kubelet_pods.go` of kubernetes/kubernetes master, commit 001a80e9): KEP-4369 left
//!   the name rule to the API server, and the kubelet never looks at the
//!   RelaxedEnvironmentVariableValidation gate. Kubelets 1.20 to 1.29 skip the keys whose
//!   `prefix + key` fails [`is_env_var_name`]: on such nodes a change of such a key rolls pods
//!   that do not see it (docs/stamping.md, "envFrom: the newest kubelet's rule"). For every object
//!   the API server admits this is the same as "read when [`is_relaxed_env_var_name`] accepts
//!   `prefix + key`": keys are held to `IsConfigMapKey` (`[-._a-zA-Z0-9]+`) and prefixes to one of
//!   the two name rules, so `prefix + key` always passes the relaxed one;
//! - a key ref only `data[key]`: a key that exists only in `binaryData` is missing for it.
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

/// Exactly what the kubelet reads of one object for a pod, merged over every reference to it.
/// The object digest covers this view and nothing else (see `hash::reads_digest`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Reads {
    /// A volume without `items`: every key of `data` and `binaryData`.
    pub whole: bool,
    /// The `prefix` of each `envFrom` (`""` without one). Any `envFrom` reads every key of
    /// `data`, whatever the prefix (module docs); the prefixes are kept to describe the reference
    /// (a 1.20-1.29 kubelet would skip keys that fail [`is_env_var_name`] with them).
    pub env_prefixes: BTreeSet<String>,
    /// Volume `items`: these keys, from `data` or else `binaryData`; `true` when a reference
    /// that is not optional needs the key (missing, the volume cannot be set up).
    pub files: BTreeMap<String, bool>,
    /// Key refs: these keys, from `data` only; `true` when a reference that is not optional
    /// needs the key (missing, the container cannot be started).
    pub vars: BTreeMap<String, bool>,
}

/// Kubernetes' strict environment variable name rule, `validation.IsEnvVarName`
/// (`staging/src/k8s.io/apimachinery/pkg/util/validation/validation.go`):
/// `[-._a-zA-Z][-._a-zA-Z0-9]*`, and not `.`, `..` or starting with `..`.
///
/// Kubelets 1.20 to 1.29 import an `envFrom` key only when `prefix + key` passes it, and API
/// servers without RelaxedEnvironmentVariableValidation (before 1.32 by default) hold `env[].name`
/// and `envFrom[].prefix` to it. helmop does not use it to decide what is read (the newest kubelet
/// imports every key, see the module docs); it says which keys older kubelets skip, and every
/// name it accepts [`is_relaxed_env_var_name`] accepts too.
pub fn is_env_var_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    let valid_first = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || matches!(b, b'-' | b'.' | b'_'));
    valid_first
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'))
        && name != "."
        && !name.starts_with("..")
}

/// Kubernetes' relaxed environment variable name rule, `validation.IsRelaxedEnvVarName` (same
/// file, since 1.30): not empty, and every character printable ASCII (`' '` to `'~'`, so a space
/// counts; Go's `unicode.IsPrint`) other than `=`. Unlike the strict rule it accepts a leading
/// digit, `.`, `..` and `..x`.
///
/// The API server's rule for `env[].name` and `envFrom[].prefix` with the
/// RelaxedEnvironmentVariableValidation gate (alpha 1.30, beta and on by default 1.32, GA and
/// locked on 1.34). The kubelet checks no name at all since 1.30; every `prefix + key` of an
/// object the API server admits passes this rule, which is why "every key of `data`" and
/// "every key this rule accepts with the prefix" are the same reads.
pub fn is_relaxed_env_var_name(name: &str) -> bool {
    // A non-ASCII character is more than one byte, each >= 0x80: refused like Go's
    // `r > unicode.MaxASCII`.
    !name.is_empty() && name.bytes().all(|b| matches!(b, b' '..=b'~') && b != b'=')
}

impl Reads {
    /// What `keys` reads the way a volume does (all keys, or these keys from either map);
    /// `required` marks the listed keys as needed.
    pub fn volume(keys: &Keys, required: bool) -> Reads {
        match keys {
            Keys::All => Reads {
                whole: true,
                ..Reads::default()
            },
            Keys::Some(keys) => Reads {
                files: keys.iter().map(|k| (k.clone(), required)).collect(),
                ..Reads::default()
            },
        }
    }

    /// True when keys the pod does not name are read too (a whole volume or `envFrom`): adding a
    /// key can change what the pod sees.
    pub fn is_open(&self) -> bool {
        self.whole || !self.env_prefixes.is_empty()
    }

    /// The summary shown in `config-refs` and covered by the config hash: every key when
    /// [`Reads::is_open`], else the named keys.
    pub fn keys(&self) -> Keys {
        if self.is_open() {
            Keys::All
        } else {
            Keys::Some(self.files.keys().chain(self.vars.keys()).cloned().collect())
        }
    }

    /// Whether the pod reads `key` of `data`.
    pub fn reads_data(&self, key: &str) -> bool {
        self.whole
            || self.reads_env()
            || self.files.contains_key(key)
            || self.vars.contains_key(key)
    }

    /// Whether the pod reads `key` of `binaryData`.
    pub fn reads_binary(&self, key: &str) -> bool {
        self.whole || self.files.contains_key(key)
    }

    /// Whether some `envFrom` reads the object: then every key of `data` becomes a variable
    /// (`prefix + key`), whatever the prefix and the key (module docs).
    pub fn reads_env(&self) -> bool {
        !self.env_prefixes.is_empty()
    }

    /// The named keys the pod looks for and does not find, given which keys `data` and
    /// `binaryData` have: `(key, required, only_in_binary)`. A required one stops the pod.
    pub fn unmet(
        &self,
        in_data: impl Fn(&str) -> bool,
        in_binary: impl Fn(&str) -> bool,
    ) -> Vec<(String, bool, bool)> {
        let mut unmet: BTreeMap<String, (bool, bool)> = BTreeMap::new();
        for (key, required) in &self.files {
            if !in_data(key) && !in_binary(key) {
                let e = unmet.entry(key.clone()).or_default();
                e.0 |= *required;
            }
        }
        for (key, required) in &self.vars {
            if !in_data(key) {
                let e = unmet.entry(key.clone()).or_default();
                e.0 |= *required;
                e.1 = in_binary(key);
            }
        }
        unmet
            .into_iter()
            .map(|(k, (required, binary))| (k, required, binary))
            .collect()
    }

    /// What a pod reads through both `self` and `other`.
    pub fn merge(&mut self, other: &Reads) {
        self.whole |= other.whole;
        self.env_prefixes.extend(other.env_prefixes.iter().cloned());
        for (k, r) in &other.files {
            *self.files.entry(k.clone()).or_default() |= *r;
        }
        for (k, r) in &other.vars {
            *self.vars.entry(k.clone()).or_default() |= *r;
        }
    }
}

/// One ConfigMap or Secret a pod reads, merged over every place it is referenced.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct PodRef {
    pub resource: ResourceRef,
    /// What `config-refs` shows and the config hash covers: [`Reads::keys`] of `reads`.
    pub keys: Keys,
    /// True only when every reference to the object is optional: one required reference
    /// means the pod cannot start without it.
    pub optional: bool,
    /// Exactly what the kubelet reads of the object.
    pub reads: Reads,
}

impl PodRef {
    /// A reference read the way a volume reads `keys`.
    pub fn new(resource: ResourceRef, keys: Keys, optional: bool) -> PodRef {
        let reads = Reads::volume(&keys, !optional);
        PodRef::with_reads(resource, reads, optional)
    }

    /// A reference that reads `reads`.
    pub fn with_reads(resource: ResourceRef, reads: Reads, optional: bool) -> PodRef {
        PodRef {
            resource,
            keys: reads.keys(),
            optional,
            reads,
        }
    }

    /// What the pod reads through both `self` and `other` (the same object).
    pub fn merge(&mut self, other: &PodRef) {
        self.reads.merge(&other.reads);
        self.keys = self.reads.keys();
        self.optional &= other.optional;
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
    fn add(
        &mut self,
        kind: ResourceKind,
        name: Option<&str>,
        reads: Reads,
        optional: Option<bool>,
    ) {
        // An empty name is invalid and would be refused by the API server; nothing to read.
        let Some(name) = name.filter(|n| !n.is_empty()) else {
            return;
        };
        let optional = optional.unwrap_or(false);
        let new = PodRef::with_reads(ResourceRef::new(kind, name), reads, optional);
        self.refs
            .entry((kind.lower(), name.to_string()))
            .and_modify(|r| r.merge(&new))
            .or_insert(new);
    }

    fn volume(&mut self, volume: &Volume) {
        if let Some(cm) = &volume.config_map {
            let reads = item_reads(cm.items.as_deref(), cm.optional);
            self.add(ResourceKind::ConfigMap, Some(&cm.name), reads, cm.optional);
        }
        if let Some(secret) = &volume.secret {
            let reads = item_reads(secret.items.as_deref(), secret.optional);
            self.add(
                ResourceKind::Secret,
                secret.secret_name.as_deref(),
                reads,
                secret.optional,
            );
        }
        let sources = volume.projected.as_ref().and_then(|p| p.sources.as_deref());
        for source in sources.unwrap_or_default() {
            if let Some(cm) = &source.config_map {
                let reads = item_reads(cm.items.as_deref(), cm.optional);
                self.add(ResourceKind::ConfigMap, Some(&cm.name), reads, cm.optional);
            }
            if let Some(secret) = &source.secret {
                let reads = item_reads(secret.items.as_deref(), secret.optional);
                self.add(
                    ResourceKind::Secret,
                    Some(&secret.name),
                    reads,
                    secret.optional,
                );
            }
        }
    }

    fn container(&mut self, env_from: Option<&[EnvFromSource]>, env: Option<&[EnvVar]>) {
        for source in env_from.unwrap_or_default() {
            let reads = Reads {
                env_prefixes: BTreeSet::from([source.prefix.clone().unwrap_or_default()]),
                ..Reads::default()
            };
            if let Some(cm) = &source.config_map_ref {
                let reads = reads.clone();
                self.add(ResourceKind::ConfigMap, Some(&cm.name), reads, cm.optional);
            }
            if let Some(secret) = &source.secret_ref {
                self.add(
                    ResourceKind::Secret,
                    Some(&secret.name),
                    reads,
                    secret.optional,
                );
            }
        }
        for var in env.unwrap_or_default() {
            let Some(from) = &var.value_from else {
                continue;
            };
            if let Some(r) = &from.config_map_key_ref {
                let reads = var_reads(&r.key, r.optional);
                self.add(ResourceKind::ConfigMap, Some(&r.name), reads, r.optional);
            }
            if let Some(r) = &from.secret_key_ref {
                let reads = var_reads(&r.key, r.optional);
                self.add(ResourceKind::Secret, Some(&r.name), reads, r.optional);
            }
        }
    }
}

fn var_reads(key: &str, optional: Option<bool>) -> Reads {
    Reads {
        vars: BTreeMap::from([(key.to_string(), optional != Some(true))]),
        ..Reads::default()
    }
}

fn item_reads(items: Option<&[KeyToPath]>, optional: Option<bool>) -> Reads {
    Reads::volume(&item_keys(items), optional != Some(true))
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

    /// The summary (resource, keys, optional) of each reference; [`Reads`] are tested on their own.
    fn refs(spec: Value) -> Vec<PodRef> {
        pod_refs_from_value(&spec)
            .unwrap()
            .into_iter()
            .map(|r| PodRef::new(r.resource, r.keys, r.optional))
            .collect()
    }

    fn reads(spec: Value) -> Vec<(String, Reads)> {
        pod_refs_from_value(&spec)
            .unwrap()
            .into_iter()
            .map(|r| (r.resource.to_string(), r.reads))
            .collect()
    }

    fn keyset(keys: &[(&str, bool)]) -> BTreeMap<String, bool> {
        keys.iter().map(|(k, r)| (k.to_string(), *r)).collect()
    }

    #[test]
    fn reads_follow_the_kubelet_per_reference_kind() {
        let spec = json!({
            "volumes": [
                {"name": "v1", "configMap": {"name": "files", "items": [{"key": "a", "path": "a"}]}},
                {"name": "v2", "projected": {"sources": [
                    {"configMap": {"name": "files", "optional": true, "items": [{"key": "b", "path": "b"}]}}]}},
                {"name": "v3", "secret": {"secretName": "whole"}}
            ],
            "containers": [{
                "name": "app",
                "envFrom": [
                    {"configMapRef": {"name": "env"}},
                    {"configMapRef": {"name": "env"}, "prefix": "X_"},
                    {"secretRef": {"name": "whole"}}
                ],
                "env": [
                    {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "env", "key": "k"}}},
                    {"name": "B", "valueFrom": {"configMapKeyRef": {"name": "vars", "key": "k", "optional": true}}},
                    {"name": "C", "valueFrom": {"configMapKeyRef": {"name": "vars", "key": "j"}}}
                ]
            }]
        });
        let env = Reads {
            env_prefixes: ["".to_string(), "X_".to_string()].into(),
            vars: keyset(&[("k", true)]),
            ..Reads::default()
        };
        let files = Reads {
            files: keyset(&[("a", true), ("b", false)]),
            ..Reads::default()
        };
        let vars = Reads {
            vars: keyset(&[("j", true), ("k", false)]),
            ..Reads::default()
        };
        let whole = Reads {
            whole: true,
            env_prefixes: ["".to_string()].into(),
            ..Reads::default()
        };
        assert_eq!(
            reads(spec),
            vec![
                ("configmap/env".to_string(), env.clone()),
                ("configmap/files".to_string(), files.clone()),
                ("configmap/vars".to_string(), vars.clone()),
                ("secret/whole".to_string(), whole.clone()),
            ]
        );
        // envFrom reads data only, and every key of it, whatever the prefix.
        assert!(env.reads_data("GREETING") && env.reads_data("k") && env.reads_data("1st"));
        assert!(!env.reads_binary("GREETING"));
        let plain = Reads {
            env_prefixes: ["".to_string()].into(),
            ..Reads::default()
        };
        assert!(plain.reads_data("1st") && plain.reads_data("a/b") && plain.reads_data(".."));
        assert!(!plain.reads_binary("1st"));
        assert_eq!(plain.keys(), Keys::All);
        // Volume items read both maps; key refs only data.
        assert!(files.reads_binary("a") && files.reads_data("a") && !files.reads_data("c"));
        assert!(!vars.reads_binary("k") && vars.reads_data("k"));
        assert_eq!(vars.keys(), some(&["j", "k"]));
        assert_eq!(whole.keys(), Keys::All);
    }

    #[test]
    fn unmet_keys_follow_the_kubelet() {
        let r = Reads {
            files: keyset(&[("file", true), ("bin", true), ("opt", false)]),
            vars: keyset(&[
                ("var", true),
                ("bin", true),
                ("binvar", true),
                ("optvar", false),
            ]),
            ..Reads::default()
        };
        let data = ["var"];
        let binary = ["bin", "binvar"];
        let unmet = r.unmet(|k| data.contains(&k), |k| binary.contains(&k));
        assert_eq!(
            unmet,
            vec![
                // A key ref does not read binaryData, even when a volume item reads the same key.
                ("bin".to_string(), true, true),
                ("binvar".to_string(), true, true),
                ("file".to_string(), true, false),
                ("opt".to_string(), false, false),
                ("optvar".to_string(), false, false),
            ]
        );
    }

    #[test]
    fn strict_env_var_names_as_kubelets_before_1_30_check_them() {
        for good in [
            "A",
            "a_b",
            "my.env-name",
            "MY_ENV.NAME",
            "MyEnvName1",
            "_x",
            "-x",
            ".x",
        ] {
            assert!(is_env_var_name(good), "{good:?}");
        }
        for bad in ["", "1a", "a b", "a/b", "a=b", ".", "..", "..x", "ü", "a\n"] {
            assert!(!is_env_var_name(bad), "{bad:?}");
        }
    }

    #[test]
    fn relaxed_env_var_names_as_the_api_server_checks_them() {
        // Every printable ASCII character but `=`, the space included; no rule on `.` or `..`.
        let printable: String = (b' '..=b'~')
            .filter(|b| *b != b'=')
            .map(char::from)
            .collect();
        for good in [
            "A",
            "1a",
            "1",
            "a b",
            " ",
            "a/b",
            ".",
            "..",
            "..x",
            "~",
            "Logging:LogLevel:Default",
            printable.as_str(),
        ] {
            assert!(is_relaxed_env_var_name(good), "{good:?}");
        }
        for bad in [
            "", "=", "a=b", "a=", "ü", "aü", "a\n", "\t", "a\u{7f}", "\0", "a\u{a0}",
        ] {
            assert!(!is_relaxed_env_var_name(bad), "{bad:?}");
        }
    }

    fn env_from(prefix: Option<&str>) -> Reads {
        let spec = json!({"containers": [{"name": "a", "envFrom": [
            {"configMapRef": {"name": "app"}, "prefix": prefix}]}]});
        let refs = pod_refs_from_value(&spec).unwrap();
        assert_eq!(refs.len(), 1);
        refs[0].reads.clone()
    }

    #[test]
    fn env_from_reads_every_data_key_as_the_newest_kubelet_does() {
        // Without a prefix a key starting with a digit is read: a 1.30+ kubelet imports it
        // (a 1.20-1.29 kubelet skips it: strict rule).
        let plain = env_from(None);
        assert_eq!(plain.env_prefixes, BTreeSet::from([String::new()]));
        assert!(plain.reads_data("1st-line") && !is_env_var_name("1st-line"));
        for key in ["GREETING", "log.level", "-x", "_x", ".x", "1", "9lives"] {
            assert!(plain.reads_data(key), "{key:?}");
            assert!(!plain.reads_binary(key), "{key:?}");
        }
        // Any prefix: the same keys. A prefix with `=` (which the API server refuses under
        // either rule, so no such pod runs) does not make helmop read less.
        for prefix in ["APP_", "1_", "my app:", ".", "A="] {
            let reads = env_from(Some(prefix));
            assert!(reads.reads_env(), "{prefix:?}");
            for key in ["GREETING", "1st-line", ".x"] {
                assert!(reads.reads_data(key), "{prefix:?} {key:?}");
            }
            assert_eq!(reads.keys(), Keys::All);
        }
        // `prefix: ""` is no prefix.
        assert_eq!(env_from(Some("")), plain);
        // Only envFrom reads so: a key ref or volume item names its keys.
        let keyref = var_reads("k", None);
        assert!(!keyref.reads_env() && !keyref.reads_data("1st-line"));
    }

    proptest::proptest! {
        /// The strict rule's names are a subset of the relaxed rule's.
        #[test]
        fn strict_names_are_relaxed_names(name in "[ -~]{0,12}|[-._a-zA-Z][-._a-zA-Z0-9]{0,12}|\\PC{0,6}") {
            proptest::prop_assert!(!is_env_var_name(&name) || is_relaxed_env_var_name(&name));
        }

        /// For every prefix the API server admits (empty, or relaxed: the strict names are
        /// among them) and every key it admits in a ConfigMap or Secret (`IsConfigMapKey`:
        /// `[-._a-zA-Z0-9]+`), the relaxed rule accepts `prefix + key`: reading every key is
        /// reading the keys that rule accepts.
        #[test]
        fn admitted_prefix_and_key_make_a_relaxed_name(
            prefix in "([ -<>-~]{1,12})?",
            key in "[-._a-zA-Z0-9]{1,20}",
        ) {
            let name = format!("{prefix}{key}");
            proptest::prop_assert!(is_relaxed_env_var_name(&name), "{:?}", name);
        }
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
        assert_eq!(pod_refs(&typed), pod_refs_from_value(&spec).unwrap());
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
