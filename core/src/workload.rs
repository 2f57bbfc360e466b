//! The workload kinds whose pod templates helmop stamps, and where each keeps its pod template.
//!
//! The webhook routes an admission request on its (group, version, kind) and needs JSON pointers
//! into the object to build a JSONPatch, so both live here next to each other.

use std::fmt;

use serde_json::{Map, Value};

/// A kind of object that carries a pod template (or, for `Pod`, is one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum WorkloadKind {
    Deployment,
    StatefulSet,
    DaemonSet,
    ReplicaSet,
    Job,
    CronJob,
    /// `argoproj.io/v1alpha1` Argo Rollout (only served where Argo Rollouts is installed).
    Rollout,
    Pod,
}

impl WorkloadKind {
    /// Every kind, in a stable order.
    pub const ALL: [WorkloadKind; 8] = [
        WorkloadKind::Deployment,
        WorkloadKind::StatefulSet,
        WorkloadKind::DaemonSet,
        WorkloadKind::ReplicaSet,
        WorkloadKind::Job,
        WorkloadKind::CronJob,
        WorkloadKind::Rollout,
        WorkloadKind::Pod,
    ];

    /// API group; empty for the core group.
    pub fn group(self) -> &'static str {
        match self {
            WorkloadKind::Deployment
            | WorkloadKind::StatefulSet
            | WorkloadKind::DaemonSet
            | WorkloadKind::ReplicaSet => "apps",
            WorkloadKind::Job | WorkloadKind::CronJob => "batch",
            WorkloadKind::Rollout => "argoproj.io",
            WorkloadKind::Pod => "",
        }
    }

    /// The preferred version (the first of [`WorkloadKind::versions`]).
    pub fn version(self) -> &'static str {
        match self {
            WorkloadKind::Rollout => "v1alpha1",
            _ => "v1",
        }
    }

    pub fn kind(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "Deployment",
            WorkloadKind::StatefulSet => "StatefulSet",
            WorkloadKind::DaemonSet => "DaemonSet",
            WorkloadKind::ReplicaSet => "ReplicaSet",
            WorkloadKind::Job => "Job",
            WorkloadKind::CronJob => "CronJob",
            WorkloadKind::Rollout => "Rollout",
            WorkloadKind::Pod => "Pod",
        }
    }

    /// (group, version, kind), the shape of an AdmissionRequest's `kind`.
    pub fn gvk(self) -> (&'static str, &'static str, &'static str) {
        (self.group(), self.version(), self.kind())
    }

    /// Lower-case plural resource name, as webhook rules and RBAC spell it.
    pub fn plural(self) -> &'static str {
        match self {
            WorkloadKind::Deployment => "deployments",
            WorkloadKind::StatefulSet => "statefulsets",
            WorkloadKind::DaemonSet => "daemonsets",
            WorkloadKind::ReplicaSet => "replicasets",
            WorkloadKind::Job => "jobs",
            WorkloadKind::CronJob => "cronjobs",
            WorkloadKind::Rollout => "rollouts",
            WorkloadKind::Pod => "pods",
        }
    }

    /// `apiVersion` as written in manifests (`apps/v1`, `v1`).
    pub fn api_version(self) -> String {
        if self.group().is_empty() {
            self.version().to_string()
        } else {
            format!("{}/{}", self.group(), self.version())
        }
    }

    /// Every version of the kind's group that serves it with the same pod template, newest first:
    /// `batch/v1beta1` CronJobs are the only ones Kubernetes before 1.21 serves, and carry the
    /// template at the same path.
    pub fn versions(self) -> &'static [&'static str] {
        match self {
            WorkloadKind::CronJob => &["v1", "v1beta1"],
            WorkloadKind::Rollout => &["v1alpha1"],
            _ => &["v1"],
        }
    }

    /// Exact match on (group, version, kind), the shape of an AdmissionRequest's `kind`; any of
    /// [`WorkloadKind::versions`].
    pub fn from_gvk(group: &str, version: &str, kind: &str) -> Option<WorkloadKind> {
        Self::ALL
            .into_iter()
            .find(|w| w.group() == group && w.versions().contains(&version) && w.kind() == kind)
    }

    /// Match on a manifest's `apiVersion` and `kind`.
    pub fn from_api_version(api_version: &str, kind: &str) -> Option<WorkloadKind> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        Self::from_gvk(group, version, kind)
    }

    /// Object path of the pod template (the object with `metadata` and `spec`); empty for a Pod,
    /// which is its own template.
    pub fn template_path(self) -> &'static [&'static str] {
        match self {
            WorkloadKind::CronJob => &["spec", "jobTemplate", "spec", "template"],
            WorkloadKind::Pod => &[],
            _ => &["spec", "template"],
        }
    }
}

impl fmt::Display for WorkloadKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind())
    }
}

/// A pod template found inside a workload object, with the JSON pointers a JSONPatch needs.
#[derive(Clone, Debug, PartialEq)]
pub struct PodTemplate<'a> {
    pub kind: WorkloadKind,
    /// Pointer to the template's `metadata` (e.g. `/spec/template/metadata`); the object there
    /// may not exist yet, see [`PodTemplate::metadata`].
    pub metadata_pointer: String,
    /// Pointer to the template's PodSpec (e.g. `/spec/template/spec`).
    pub spec_pointer: String,
    /// The template's `metadata`, when present and an object.
    pub metadata: Option<&'a Map<String, Value>>,
    /// The PodSpec.
    pub spec: &'a Value,
}

impl<'a> PodTemplate<'a> {
    /// The template's annotations, when present and an object.
    pub fn annotations(&self) -> Option<&'a Map<String, Value>> {
        self.metadata?.get("annotations")?.as_object()
    }

    /// The template annotation value of `key`, when present and a string.
    pub fn annotation(&self, key: &str) -> Option<&'a str> {
        self.annotations()?.get(key)?.as_str()
    }

    /// Pointer to the template's annotations map.
    pub fn annotations_pointer(&self) -> String {
        format!("{}/annotations", self.metadata_pointer)
    }

    /// Pointer to one template annotation (`helmop.dev/config-hash` becomes
    /// `.../annotations/helmop.dev~1config-hash`).
    pub fn annotation_pointer(&self, key: &str) -> String {
        format!(
            "{}/{}",
            self.annotations_pointer(),
            escape_pointer_token(key)
        )
    }
}

/// Escapes one JSON-pointer reference token (RFC 6901: `~` as `~0`, `/` as `~1`).
pub fn escape_pointer_token(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// The workload kind a manifest declares through `apiVersion` and `kind`, if helmop knows it.
pub fn workload_kind_of(obj: &Value) -> Option<WorkloadKind> {
    let api_version = obj.get("apiVersion")?.as_str()?;
    let kind = obj.get("kind")?.as_str()?;
    WorkloadKind::from_api_version(api_version, kind)
}

/// The pod template of `obj`, read as a `kind`. `None` when the object has no template there
/// (e.g. an Argo Rollout using `workloadRef`, or a half-written object).
pub fn pod_template(kind: WorkloadKind, obj: &Value) -> Option<PodTemplate<'_>> {
    let mut template = obj;
    let mut pointer = String::new();
    for segment in kind.template_path() {
        template = template.get(*segment)?;
        pointer.push('/');
        pointer.push_str(segment);
    }
    let spec = template.get("spec").filter(|s| s.is_object())?;
    let metadata = template.get("metadata").and_then(Value::as_object);
    Some(PodTemplate {
        kind,
        metadata_pointer: format!("{pointer}/metadata"),
        spec_pointer: format!("{pointer}/spec"),
        metadata,
        spec,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn gvk_round_trips_for_every_kind() {
        for kind in WorkloadKind::ALL {
            let (g, v, k) = kind.gvk();
            assert_eq!(WorkloadKind::from_gvk(g, v, k), Some(kind));
            assert_eq!(
                WorkloadKind::from_api_version(&kind.api_version(), kind.kind()),
                Some(kind)
            );
        }
    }

    #[test]
    fn gvk_table() {
        let table = [
            ("apps", "v1", "Deployment", Some(WorkloadKind::Deployment)),
            ("apps", "v1", "StatefulSet", Some(WorkloadKind::StatefulSet)),
            ("apps", "v1", "DaemonSet", Some(WorkloadKind::DaemonSet)),
            ("apps", "v1", "ReplicaSet", Some(WorkloadKind::ReplicaSet)),
            ("batch", "v1", "Job", Some(WorkloadKind::Job)),
            ("batch", "v1", "CronJob", Some(WorkloadKind::CronJob)),
            (
                "argoproj.io",
                "v1alpha1",
                "Rollout",
                Some(WorkloadKind::Rollout),
            ),
            ("", "v1", "Pod", Some(WorkloadKind::Pod)),
            ("batch", "v1beta1", "CronJob", Some(WorkloadKind::CronJob)),
            ("batch", "v1beta1", "Job", None),
            ("apps", "v1beta1", "Deployment", None),
            ("extensions", "v1", "Deployment", None),
            ("apps", "v1", "deployment", None),
            ("", "v1", "Secret", None),
        ];
        for (g, v, k, want) in table {
            assert_eq!(WorkloadKind::from_gvk(g, v, k), want, "{g}/{v} {k}");
        }
        assert_eq!(WorkloadKind::Pod.api_version(), "v1");
        assert_eq!(WorkloadKind::CronJob.api_version(), "batch/v1");
        assert_eq!(WorkloadKind::Rollout.plural(), "rollouts");
    }

    #[test]
    fn finds_templates_and_pointers() {
        let spec = json!({"containers": [{"name": "c", "image": "x"}]});
        let cases = [
            (
                json!({"apiVersion": "apps/v1", "kind": "Deployment",
                       "spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": spec}}}),
                "/spec/template",
            ),
            (
                json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
                       "spec": {"template": {"spec": spec}}}),
                "/spec/template",
            ),
            (
                json!({"apiVersion": "batch/v1", "kind": "CronJob",
                       "spec": {"jobTemplate": {"spec": {"template": {"spec": spec}}}}}),
                "/spec/jobTemplate/spec/template",
            ),
            (
                json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
                       "spec": {"template": {"spec": spec}}}),
                "/spec/template",
            ),
            (json!({"apiVersion": "v1", "kind": "Pod", "spec": spec}), ""),
        ];
        for (obj, prefix) in cases {
            let kind = workload_kind_of(&obj).unwrap();
            let t = pod_template(kind, &obj).unwrap();
            assert_eq!(t.metadata_pointer, format!("{prefix}/metadata"));
            assert_eq!(t.spec_pointer, format!("{prefix}/spec"));
            assert_eq!(t.spec, &spec);
            // The pointer must really address the spec, or the webhook's patch would miss.
            assert_eq!(obj.pointer(&t.spec_pointer), Some(&spec));
        }
    }

    #[test]
    fn missing_template_is_none() {
        let rollout_with_ref = json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout",
            "spec": {"workloadRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"}}});
        assert!(pod_template(WorkloadKind::Rollout, &rollout_with_ref).is_none());
        assert!(pod_template(WorkloadKind::Deployment, &json!({})).is_none());
        assert!(
            pod_template(WorkloadKind::Deployment, &json!({"spec": {"template": 3}})).is_none()
        );
        assert!(pod_template(WorkloadKind::Pod, &json!({"spec": "nope"})).is_none());
        assert!(workload_kind_of(&json!({"apiVersion": 1, "kind": "Pod"})).is_none());
    }

    #[test]
    fn annotation_access_and_pointer_escaping() {
        let obj = json!({"spec": {"template": {"metadata": {"annotations": {
            "helmop.dev/config-hash": "v1:00"}}, "spec": {}}}});
        let t = pod_template(WorkloadKind::Deployment, &obj).unwrap();
        assert_eq!(t.annotation("helmop.dev/config-hash"), Some("v1:00"));
        let ptr = t.annotation_pointer("helmop.dev/config-hash");
        assert_eq!(
            ptr,
            "/spec/template/metadata/annotations/helmop.dev~1config-hash"
        );
        assert_eq!(obj.pointer(&ptr), Some(&json!("v1:00")));
        assert_eq!(escape_pointer_token("a~b/c"), "a~0b~1c");
    }
}
