//! Workload CREATE/UPDATE: stamp `helmop.dev/config-hash` and `helmop.dev/config-refs` into the pod
//! template of opted-in workloads, then hand over to the image stage. Fails open: a lookup error admits
//! the workload unchanged (as far as the stamp goes) with a warning.
//!
//! The stamp is recomputed from the current content on every admission, not only when the
//! `helmop.dev/restamp` annotation changes: a stored stamp is only ever replaced by one describing what
//! the pods would read right now, so any UPDATE (a `kubectl apply`, a restamp) rolls a workload whose
//! configuration moved, and an UPDATE when nothing moved computes the same values and patches nothing.

use std::borrow::Cow;
use std::collections::BTreeMap;

use json_patch::jsonptr::{PointerBuf, Token};
use json_patch::{AddOperation, PatchOperation, RemoveOperation};
use kube::api::ObjectMeta;
use kube::core::admission::Operation;
use serde_json::{Map, Value};

use helmop_core::hash::{
    ANNOTATIONS_LIMIT, Observed, bounded_config_refs, config_refs_budget, config_stamp_v2,
};
use helmop_core::names::{
    ANN_CONFIG_HASH, ANN_CONFIG_REFS, ANN_IMAGE_DIGESTS, LABEL_ROLLOUT_ON_CHANGE,
};
use helmop_core::podrefs::pod_refs_from_value;
use helmop_core::resource::ResourceRef;
pub use helmop_core::rollout::{OptIn, opt_in};
use helmop_core::workload::{PodTemplate, WorkloadKind, pod_template};

use crate::admission::{Object, Request};
use crate::error::Error;
use crate::images::ImageRequest;
use crate::state::{AppState, HashKeyState, ImageMode};
use crate::verdict::Verdict;

/// JSONPatch operations that make the template's annotations hold `desired` (`None` = absent), creating
/// `metadata` and `metadata.annotations` when missing. Empty when they already do, so admitting the output
/// again patches nothing.
pub fn stamp_ops(
    template: &PodTemplate<'_>,
    desired: &[(&str, Option<&str>)],
) -> Vec<PatchOperation> {
    let base = template_pointer(template.kind);
    let wanted: Map<String, Value> = desired
        .iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_string(), Value::String(v.to_string()))))
        .collect();
    let Some(metadata) = template.metadata else {
        if wanted.is_empty() {
            return Vec::new();
        }
        return vec![add(
            pointer(&base, &["metadata"]),
            Value::Object(Map::from_iter([(
                "annotations".to_string(),
                Value::Object(wanted),
            )])),
        )];
    };
    let Some(annotations) = metadata.get("annotations").and_then(Value::as_object) else {
        if wanted.is_empty() {
            return Vec::new();
        }
        return vec![add(
            pointer(&base, &["metadata", "annotations"]),
            Value::Object(wanted),
        )];
    };
    let mut ops = Vec::new();
    for (key, value) in desired {
        let path = pointer(&base, &["metadata", "annotations", key]);
        match (annotations.get(*key), value) {
            (Some(Value::String(current)), Some(value)) if current == value => {}
            // `add` on an existing member replaces it (RFC 6902 4.1).
            (_, Some(value)) => ops.push(add(path, Value::String(value.to_string()))),
            (Some(_), None) => ops.push(PatchOperation::Remove(RemoveOperation { path })),
            (None, None) => {}
        }
    }
    ops
}

fn template_pointer(kind: WorkloadKind) -> PointerBuf {
    PointerBuf::from_tokens(kind.template_path().iter().copied())
}

fn pointer(base: &PointerBuf, tokens: &[&str]) -> PointerBuf {
    let mut p = base.clone();
    for t in tokens {
        // Token::new escapes `~` and `/` (`helmop.dev/config-hash` becomes `helmop.dev~1config-hash`).
        p.push_back(Token::new(*t));
    }
    p
}

fn add(path: PointerBuf, value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation { path, value })
}

/// A workload whose controller stamps its template for it: a Deployment's (or Argo Rollout's) ReplicaSet and
/// a CronJob's Job carry their owner's template, already stamped; re-stamping the copy from newer content
/// would make it differ from its owner's template (the Deployment controller would then no longer recognise
/// its own ReplicaSet). Any other controller (an operator's StatefulSet, a Deployment managed by a custom
/// resource) does not stamp: its workload is stamped like any other.
fn inherits_stamped_template(kind: WorkloadKind, metadata: &ObjectMeta) -> bool {
    let owners: &[(&str, &str)] = match kind {
        // `extensions`: ownerReferences written while a cluster still served extensions/v1beta1
        // Deployments keep that apiVersion.
        WorkloadKind::ReplicaSet => &[
            ("apps", "Deployment"),
            ("extensions", "Deployment"),
            ("argoproj.io", "Rollout"),
        ],
        WorkloadKind::Job => &[("batch", "CronJob")],
        _ => return false,
    };
    metadata
        .owner_references
        .iter()
        .flatten()
        .filter(|o| o.controller == Some(true))
        .any(|o| {
            let group = o.api_version.rsplit_once('/').map_or("", |(g, _)| g);
            owners.contains(&(group, o.kind.as_str()))
        })
}

/// gate -> opt-in -> config stamp -> images: each stage may end the admission with its answer.
pub(super) async fn mutate(state: &AppState, req: &Request) -> Verdict {
    let Some(workload) = gate(req) else {
        return Verdict::allow();
    };
    match opted_in(state, req, &workload).await {
        Ok(true) => {}
        Ok(false) => return Verdict::allow(),
        Err(unreadable) => return unreadable,
    }
    let value = workload.object.value();
    let Some(template) = pod_template(workload.kind, value) else {
        // e.g. an Argo Rollout that points at a Deployment through workloadRef: that Deployment is stamped.
        return Verdict::allow();
    };
    let (mut ops, mut warnings) = config_stamp(state, req, &workload, &template).await;
    let images = image_stage(state, req, &workload, &template, &mut ops).await;
    ops.extend(images.ops);
    warnings.extend(images.warnings);
    Verdict::Allow {
        patch: (!ops.is_empty()).then_some(json_patch::Patch(ops)),
        warnings,
    }
}

/// A workload the stamp applies to, as the gate let it through.
struct Workload<'a> {
    kind: WorkloadKind,
    object: &'a Object,
    namespace: String,
    /// `namespace/name`, for messages.
    name: String,
    /// When the stamp and image stages must be done (what is left of the admission's deadline).
    deadline: Option<tokio::time::Instant>,
}

/// Which requests are stamped at all: CREATE/UPDATE of a workload kind with a pod template that is
/// neither a Job's (immutable on UPDATE), nor being deleted, nor inherited from a stamped owner.
fn gate(req: &Request) -> Option<Workload<'_>> {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return None;
    }
    let kind = match WorkloadKind::from_gvk(&req.kind.group, &req.kind.version, &req.kind.kind) {
        Some(WorkloadKind::Pod) | None => return None,
        Some(kind) => kind,
    };
    // A Job's pod template is immutable: re-stamping on UPDATE would make the API server refuse the update.
    if kind == WorkloadKind::Job && req.operation == Operation::Update {
        return None;
    }
    let object = req.object.as_ref()?;
    if object.metadata.deletion_timestamp.is_some()
        || inherits_stamped_template(kind, &object.metadata)
    {
        return None;
    }
    let namespace = req
        .namespace
        .clone()
        .or_else(|| object.metadata.namespace.clone())
        .unwrap_or_default();
    Some(Workload {
        kind,
        object,
        namespace,
        name: super::object_name(req),
        deadline: super::deadline::current(),
    })
}

/// The opt-in rule ([`helmop_core::rollout`]): the workload's own label, else its namespace's. The
/// namespace is read only when the label does not decide; when it cannot be read, the answer keeps
/// the previous stamp and says why.
async fn opted_in(state: &AppState, req: &Request, w: &Workload<'_>) -> Result<bool, Verdict> {
    let label = w
        .object
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(LABEL_ROLLOUT_ON_CHANGE))
        .map(String::as_str);
    let decision = match helmop_core::rollout::by_workload(label) {
        Some(decided) => decided,
        None => match state.caches().namespace(&w.namespace).await {
            Ok(ns) => {
                let ns_label = ns
                    .as_ref()
                    .and_then(|n| n.labels.get(LABEL_ROLLOUT_ON_CHANGE));
                opt_in(label, ns_label.map(String::as_str))
            }
            Err(error) => {
                tracing::warn!(workload = %w.name, %error, "cannot read the namespace labels; not stamped");
                let kept = keep_previous_stamp(req, w.kind, w.object);
                let warning = format!(
                    "helmop webhook: cannot read the labels of namespace {:?} ({error}); {} {} {}",
                    w.namespace,
                    w.kind,
                    w.name,
                    unstamped_outcome(!kept.is_empty())
                );
                return Err(Verdict::Allow {
                    patch: (!kept.is_empty()).then_some(json_patch::Patch(kept)),
                    warnings: vec![warning],
                });
            }
        },
    };
    Ok(decision.stamps())
}

/// The config stamp's operations and warnings; when it cannot be computed in time (or at all), the
/// previous stamp is kept and a warning says why.
async fn config_stamp(
    state: &AppState,
    req: &Request,
    w: &Workload<'_>,
    template: &PodTemplate<'_>,
) -> (Vec<PatchOperation>, Vec<String>) {
    let computed = super::deadline::within(w.deadline, config_ops(state, &w.namespace, template))
        .await
        .unwrap_or(Err(Error::StampDeadline));
    match computed {
        Ok(result) => result,
        Err(warning) => {
            tracing::warn!(workload = %w.name, reason = %warning, "config stamp skipped");
            let kept = keep_previous_stamp(req, w.kind, w.object);
            let outcome = unstamped_outcome(!kept.is_empty());
            (
                kept,
                vec![format!(
                    "helmop webhook: {warning}; {} {} {outcome}",
                    w.kind, w.name
                )],
            )
        }
    }
}

/// Image digests, on the object as the config stamp leaves it, so their operations apply after its
/// `ops` (cleared in the impossible case that they do not apply to the object they were built for).
async fn image_stage(
    state: &AppState,
    req: &Request,
    w: &Workload<'_>,
    template: &PodTemplate<'_>,
    ops: &mut Vec<PatchOperation>,
) -> crate::images::ImageOutcome {
    let value = w.object.value();
    let stamped = if ops.is_empty() {
        Cow::Borrowed(value)
    } else {
        let mut stamped = value.clone();
        match json_patch::patch(&mut stamped, ops) {
            Ok(()) => Cow::Owned(stamped),
            // Cannot happen for operations built against `value`; never admit a patch that does not apply.
            Err(_) => {
                ops.clear();
                Cow::Borrowed(value)
            }
        }
    };
    state
        .images()
        .resolve(ImageRequest {
            namespace: &w.namespace,
            object: stamped.as_ref(),
            old_object: req.old_object.as_ref().map(Object::value),
            template_metadata_pointer: &template.metadata_pointer,
            template_spec_pointer: &template.spec_pointer,
            mode: state.config().image_mode,
            deadline: w.deadline,
            reads: state.caches(),
        })
        .await
}

/// What happens to a workload whose stamp cannot be computed, for its warning.
fn unstamped_outcome(kept: bool) -> &'static str {
    if kept {
        "keeps its previous config stamp until one can be computed"
    } else {
        "admitted without a config stamp"
    }
}

/// On UPDATE, the operations that carry the stored object's stamp over to `object` when no new stamp can
/// be computed (no hash key, a failed lookup): dropping it would roll the workload now, and restamping it
/// later would roll it back, two rollouts without a change of content. Empty on CREATE, when the stored
/// object has no stamp, or when `object` already carries it (e.g. a `kubectl apply` or an annotation).
fn keep_previous_stamp(req: &Request, kind: WorkloadKind, object: &Object) -> Vec<PatchOperation> {
    if req.operation != Operation::Update {
        return Vec::new();
    }
    let Some(old) = req.old_object.as_ref() else {
        return Vec::new();
    };
    let Some(old_template) = pod_template(kind, old.value()) else {
        return Vec::new();
    };
    let Some(hash) = old_template.annotation(ANN_CONFIG_HASH) else {
        return Vec::new();
    };
    let Some(template) = pod_template(kind, object.value()) else {
        return Vec::new();
    };
    let refs = old_template.annotation(ANN_CONFIG_REFS);
    stamp_ops(
        &template,
        &[(ANN_CONFIG_HASH, Some(hash)), (ANN_CONFIG_REFS, refs)],
    )
}

/// The config-stamp operations and warnings, or the reason (a warning) why no stamp could be made.
async fn config_ops(
    state: &AppState,
    namespace: &str,
    template: &PodTemplate<'_>,
) -> Result<(Vec<PatchOperation>, Vec<String>), Error> {
    let refs = pod_refs_from_value(template.spec)?;
    if refs.is_empty() {
        // Reads nothing: no stamp (and a stale one from an earlier template goes).
        let ops = stamp_ops(
            template,
            &[(ANN_CONFIG_HASH, None), (ANN_CONFIG_REFS, None)],
        );
        return Ok((ops, Vec::new()));
    }
    crate::caps::workload_references(refs.len())?;
    let (key, generation) = match state.hash_key() {
        HashKeyState::Loaded { key, generation } => (key, generation),
        other => {
            return Err(Error::HashKeyUnavailable(
                other
                    .problem(&state.config().hash_key_secret)
                    .unwrap_or_default(),
            ));
        }
    };
    let lookups = state.observe_all(namespace, &refs, &key, generation).await;
    let mut observed = BTreeMap::new();
    for (r, result) in refs.iter().zip(lookups) {
        match result {
            Ok(observation) => {
                observed.insert(r.resource.clone(), observation);
            }
            Err(source) => {
                return Err(Error::ReadReference {
                    resource: r.resource.clone(),
                    namespace: namespace.to_owned(),
                    source,
                });
            }
        }
    }
    // Always v2: a stored v1 stamp is never kept (keeping it when it matched was an oracle, see
    // docs/webhook-safety.md, "Stamp v2; v1 is retired").
    let stamp = config_stamp_v2(&key, namespace, &refs, |r| {
        match observed.get(&r.resource) {
            Some(Some(observation)) => Observed::Digest(observation.digest),
            _ => Observed::Absent,
        }
    });
    tracing::debug!(namespace, refs = %stamp.config_refs, hash = %stamp.config_hash, "config stamp computed");
    let mut warnings: Vec<String> = stamp
        .missing
        .iter()
        .map(|r| missing_warning(r, namespace))
        .collect();
    for r in &refs {
        if let Some(Some(observation)) = observed.get(&r.resource) {
            warnings.extend(unmet_warnings(&r.resource, namespace, &observation.unmet));
        }
    }
    let others = other_annotation_bytes(template, state.config().image_mode);
    let Some(budget) = config_refs_budget(others, stamp.config_hash.len()) else {
        // Stamping would push the template's annotations over the API server's limit and get a valid
        // workload rejected; its own annotations already leave no room.
        let ops = stamp_ops(
            template,
            &[(ANN_CONFIG_HASH, None), (ANN_CONFIG_REFS, None)],
        );
        warnings.push(format!(
            "the pod template's other annotations leave no room for a config stamp under the API server's \
             {} KiB limit on all annotations; not stamped",
            ANNOTATIONS_LIMIT / 1024
        ));
        return Ok((ops, warnings));
    };
    let config_refs = bounded_config_refs(&stamp.refs, budget);
    if config_refs.len() < stamp.config_refs.len() {
        tracing::debug!(
            namespace,
            full = stamp.config_refs.len(),
            budget,
            "config-refs summarised"
        );
    }
    let ops = stamp_ops(
        template,
        &[
            (ANN_CONFIG_HASH, Some(&stamp.config_hash)),
            (ANN_CONFIG_REFS, Some(&config_refs)),
        ],
    );
    Ok((ops, warnings))
}

/// Bytes the API server counts for the template's annotations other than the stamp's own (key plus
/// value; a value that is not a string counts as its JSON text, though the API server refuses it). In
/// `annotate` image mode the image stage writes `helmop.dev/image-digests` after us: the most it can
/// write is counted instead of what is there now.
fn other_annotation_bytes(template: &PodTemplate<'_>, image_mode: ImageMode) -> usize {
    // Under `pin` a namespace or workload may lower the mode to `annotate`, so the digest annotation
    // is reserved for unless the process mode is `off` (which nothing can raise).
    let annotate = image_mode != ImageMode::Off;
    let present: usize = template
        .annotations()
        .into_iter()
        .flatten()
        .filter(|(k, _)| k.as_str() != ANN_CONFIG_HASH && k.as_str() != ANN_CONFIG_REFS)
        .filter(|(k, _)| !(annotate && k.as_str() == ANN_IMAGE_DIGESTS))
        .map(|(k, v)| k.len() + v.as_str().map_or_else(|| v.to_string().len(), str::len))
        .sum();
    present
        + if annotate {
            image_digests_bound(template)
        } else {
            0
        }
}

/// The longest `helmop.dev/image-digests` the image stage can write for `template`: one
/// `name=digest` entry per container and init container, each digest at most `sha512:` and 128 hex
/// digits, comma separated.
fn image_digests_bound(template: &PodTemplate<'_>) -> usize {
    const LONGEST_DIGEST: usize = "sha512:".len() + 128;
    let entries: usize = ["containers", "initContainers"]
        .into_iter()
        .filter_map(|field| template.spec.get(field).and_then(Value::as_array))
        .flatten()
        .map(|c| c.get("name").and_then(Value::as_str).map_or(0, str::len) + 1 + LONGEST_DIGEST + 1)
        .sum();
    ANN_IMAGE_DIGESTS.len() + entries
}

fn missing_warning(r: &ResourceRef, namespace: &str) -> String {
    format!(
        "{} {:?} does not exist in namespace {namespace:?}: pods that need it will not start; stamped as absent, \
         so creating it changes the stamp",
        r.kind, r.name
    )
}

/// One warning per object for the keys a required reference names and the kubelet will not find:
/// such pods do not start. Key names only.
fn unmet_warnings(
    r: &ResourceRef,
    namespace: &str,
    unmet: &[(String, bool, bool)],
) -> Option<String> {
    let required: Vec<&(String, bool, bool)> = unmet.iter().filter(|(_, req, _)| *req).collect();
    if required.is_empty() {
        return None;
    }
    let keys: Vec<String> = required
        .iter()
        .map(|(k, _, binary)| {
            if *binary {
                format!("{k:?} (only in binaryData, which key references do not read)")
            } else {
                format!("{k:?}")
            }
        })
        .collect();
    let noun = if keys.len() == 1 { "key" } else { "keys" };
    Some(format!(
        "{} {:?} in namespace {namespace:?} has no {noun} {}: pods that need it will not start",
        r.kind,
        r.name,
        keys.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn deployment(template_metadata: Option<Value>) -> Value {
        let mut template = json!({"spec": {"containers": [{"name": "c", "image": "x"}]}});
        if let Some(m) = template_metadata {
            template["metadata"] = m;
        }
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {"template": template}})
    }

    const STAMP: [(&str, Option<&str>); 2] = [
        ("helmop.dev/config-hash", Some("v1:abc")),
        ("helmop.dev/config-refs", Some("configmap/app")),
    ];

    fn apply(obj: &Value, ops: &[PatchOperation]) -> Value {
        let mut out = obj.clone();
        json_patch::patch(&mut out, ops).unwrap();
        out
    }

    fn ops_for(
        obj: &Value,
        kind: WorkloadKind,
        desired: &[(&str, Option<&str>)],
    ) -> Vec<PatchOperation> {
        stamp_ops(&pod_template(kind, obj).unwrap(), desired)
    }

    #[test]
    fn opt_in_table() {
        let table = [
            (Some("true"), None, OptIn::ByWorkload),
            (Some("true"), Some("enabled"), OptIn::ByWorkload),
            (Some("false"), Some("enabled"), OptIn::OptedOut),
            (Some("false"), None, OptIn::OptedOut),
            (None, Some("enabled"), OptIn::ByNamespace),
            (Some("yes"), Some("enabled"), OptIn::ByNamespace),
            (Some("yes"), None, OptIn::NotOptedIn),
            (None, Some("true"), OptIn::NotOptedIn),
            (None, Some("disabled"), OptIn::NotOptedIn),
            (None, None, OptIn::NotOptedIn),
        ];
        for (workload, namespace, want) in table {
            assert_eq!(
                opt_in(workload, namespace),
                want,
                "{workload:?} {namespace:?}"
            );
        }
        assert!(OptIn::ByWorkload.stamps() && OptIn::ByNamespace.stamps());
        assert!(!OptIn::OptedOut.stamps() && !OptIn::NotOptedIn.stamps());
    }

    #[test]
    fn creates_metadata_when_the_template_has_none() {
        let obj = deployment(None);
        let ops = ops_for(&obj, WorkloadKind::Deployment, &STAMP);
        assert_eq!(
            serde_json::to_value(&ops).unwrap(),
            json!([{"op": "add", "path": "/spec/template/metadata",
                    "value": {"annotations": {"helmop.dev/config-hash": "v1:abc", "helmop.dev/config-refs": "configmap/app"}}}])
        );
        let out = apply(&obj, &ops);
        assert_eq!(
            out["spec"]["template"]["metadata"]["annotations"]["helmop.dev/config-hash"],
            "v1:abc"
        );
    }

    #[test]
    fn creates_annotations_when_absent_and_keeps_labels() {
        let obj = deployment(Some(json!({"labels": {"app": "a"}})));
        let ops = ops_for(&obj, WorkloadKind::Deployment, &STAMP);
        assert_eq!(
            serde_json::to_value(&ops).unwrap(),
            json!([{"op": "add", "path": "/spec/template/metadata/annotations",
                    "value": {"helmop.dev/config-hash": "v1:abc", "helmop.dev/config-refs": "configmap/app"}}])
        );
        let out = apply(&obj, &ops);
        assert_eq!(out["spec"]["template"]["metadata"]["labels"]["app"], "a");
    }

    #[test]
    fn escapes_slashes_and_keeps_other_annotations() {
        let obj = deployment(Some(
            json!({"annotations": {"team": "x", "helmop.dev/config-hash": "v1:old"}}),
        ));
        let ops = ops_for(&obj, WorkloadKind::Deployment, &STAMP);
        assert_eq!(
            serde_json::to_value(&ops).unwrap(),
            json!([
                {"op": "add", "path": "/spec/template/metadata/annotations/helmop.dev~1config-hash", "value": "v1:abc"},
                {"op": "add", "path": "/spec/template/metadata/annotations/helmop.dev~1config-refs", "value": "configmap/app"}
            ])
        );
        let out = apply(&obj, &ops);
        assert_eq!(
            out["spec"]["template"]["metadata"]["annotations"]["team"],
            "x"
        );
        assert_eq!(
            out["spec"]["template"]["metadata"]["annotations"]["helmop.dev/config-hash"],
            "v1:abc"
        );
    }

    #[test]
    fn admitting_the_output_again_patches_nothing() {
        for start in [
            None,
            Some(json!({})),
            Some(json!({"annotations": null})),
            Some(json!({"annotations": {"helmop.dev/config-refs": "secret/old"}})),
        ] {
            let obj = deployment(start.clone());
            let once = apply(&obj, &ops_for(&obj, WorkloadKind::Deployment, &STAMP));
            assert_eq!(
                ops_for(&once, WorkloadKind::Deployment, &STAMP),
                vec![],
                "from {start:?}"
            );
        }
    }

    #[test]
    fn removes_a_stale_stamp_and_only_then() {
        let none = [
            ("helmop.dev/config-hash", None),
            ("helmop.dev/config-refs", None),
        ];
        let obj = deployment(Some(
            json!({"annotations": {"helmop.dev/config-hash": "v1:old", "x": "y"}}),
        ));
        let ops = ops_for(&obj, WorkloadKind::Deployment, &none);
        assert_eq!(
            serde_json::to_value(&ops).unwrap(),
            json!([{"op": "remove", "path": "/spec/template/metadata/annotations/helmop.dev~1config-hash"}])
        );
        let out = apply(&obj, &ops);
        assert_eq!(
            out["spec"]["template"]["metadata"]["annotations"],
            json!({"x": "y"})
        );
        assert_eq!(ops_for(&out, WorkloadKind::Deployment, &none), vec![]);
        assert_eq!(
            ops_for(&deployment(None), WorkloadKind::Deployment, &none),
            vec![]
        );
        assert_eq!(
            ops_for(
                &deployment(Some(json!({}))),
                WorkloadKind::Deployment,
                &none
            ),
            vec![]
        );
    }

    #[test]
    fn cronjob_template_is_nested() {
        let obj = json!({"apiVersion": "batch/v1", "kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {
            "spec": {"containers": []}}}}}});
        let ops = ops_for(&obj, WorkloadKind::CronJob, &STAMP);
        assert_eq!(
            ops[0].path().as_str(),
            "/spec/jobTemplate/spec/template/metadata"
        );
        let out = apply(&obj, &ops);
        assert_eq!(ops_for(&out, WorkloadKind::CronJob, &STAMP), vec![]);
    }

    #[test]
    fn a_non_string_annotation_value_is_replaced() {
        let obj = deployment(Some(json!({"annotations": {"helmop.dev/config-hash": 5}})));
        let ops = ops_for(&obj, WorkloadKind::Deployment, &STAMP[..1]);
        assert_eq!(ops.len(), 1);
        let out = apply(&obj, &ops);
        assert_eq!(
            out["spec"]["template"]["metadata"]["annotations"]["helmop.dev/config-hash"],
            "v1:abc"
        );
    }

    #[test]
    fn annotation_bytes_count_others_and_the_image_stage_to_come() {
        let obj = deployment(Some(json!({"annotations": {
            "team": "blue",
            "helmop.dev/config-hash": "v1:old",
            "helmop.dev/config-refs": "configmap/app",
            "helmop.dev/image-digests": "c=sha256:00"}})));
        let template = pod_template(WorkloadKind::Deployment, &obj).unwrap();
        let digests = "helmop.dev/image-digests".len() + "c=sha256:00".len();
        assert_eq!(
            other_annotation_bytes(&template, ImageMode::Off),
            "team".len() + "blue".len() + digests
        );
        // Container `c`: the longest digest annotation the image stage could write replaces the present one,
        // under `pin` too (an annotation may lower it to `annotate`).
        let bound = "helmop.dev/image-digests".len() + 1 + 1 + 7 + 128 + 1;
        assert_eq!(image_digests_bound(&template), bound);
        for mode in [ImageMode::Annotate, ImageMode::Pin] {
            assert_eq!(
                other_annotation_bytes(&template, mode),
                "team".len() + "blue".len() + bound,
                "{mode:?}"
            );
        }
    }

    #[test]
    fn only_templates_a_controller_stamps_are_skipped() {
        let owned = |api_version: &str, kind: &str, controller: Option<bool>| ObjectMeta {
            owner_references: Some(vec![
                k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
                    api_version: api_version.into(),
                    kind: kind.into(),
                    name: "owner".into(),
                    uid: "u".into(),
                    controller,
                    ..Default::default()
                },
            ]),
            ..Default::default()
        };
        let table = [
            (
                WorkloadKind::ReplicaSet,
                "apps/v1",
                "Deployment",
                Some(true),
                true,
            ),
            (
                WorkloadKind::ReplicaSet,
                "argoproj.io/v1alpha1",
                "Rollout",
                Some(true),
                true,
            ),
            (
                WorkloadKind::ReplicaSet,
                "extensions/v1beta1",
                "Deployment",
                Some(true),
                true,
            ),
            (WorkloadKind::Job, "batch/v1", "CronJob", Some(true), true),
            (
                WorkloadKind::Job,
                "batch/v1beta1",
                "CronJob",
                Some(true),
                true,
            ),
            // Not the controller: the workload's own template.
            (
                WorkloadKind::ReplicaSet,
                "apps/v1",
                "Deployment",
                Some(false),
                false,
            ),
            (
                WorkloadKind::ReplicaSet,
                "apps/v1",
                "Deployment",
                None,
                false,
            ),
            // Operators: their workloads roll like any other.
            (
                WorkloadKind::StatefulSet,
                "db.example.com/v1",
                "Postgres",
                Some(true),
                false,
            ),
            (
                WorkloadKind::Deployment,
                "example.com/v1",
                "App",
                Some(true),
                false,
            ),
            (
                WorkloadKind::DaemonSet,
                "apps/v1",
                "Deployment",
                Some(true),
                false,
            ),
            (
                WorkloadKind::ReplicaSet,
                "example.com/v1",
                "Deployment",
                Some(true),
                false,
            ),
            (
                WorkloadKind::Job,
                "example.com/v1",
                "Pipeline",
                Some(true),
                false,
            ),
            (
                WorkloadKind::CronJob,
                "batch/v1",
                "CronJob",
                Some(true),
                false,
            ),
        ];
        for (kind, api_version, owner, controller, skipped) in table {
            assert_eq!(
                inherits_stamped_template(kind, &owned(api_version, owner, controller)),
                skipped,
                "{kind} owned by {api_version} {owner} (controller {controller:?})"
            );
        }
        assert!(!inherits_stamped_template(
            WorkloadKind::ReplicaSet,
            &ObjectMeta::default()
        ));
    }
}
