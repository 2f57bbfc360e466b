//! The walk over `spec`: helmop's rules on the fields it reads (their types are the CRD's, see
//! [`super::schema`]), and the collected model the cross-reference rules (duplicates,
//! valuesFrom, helmSecretName) work on.

use super::model::{SpecModel, TargetModel};
use super::resources;
use super::{Ctx, JsonView, Map, Path, field, helm, sorted_entries, targets};
use crate::name_rules as names;

pub(crate) fn check_spec(cx: &mut Ctx, spec: &Map<'_>) -> SpecModel {
    let base = &Path::Root.key("spec");
    check_namespaces(cx, spec, base);
    check_namespace_metadata(cx, spec, base);

    let helm_secret_name = super::string(spec, "helmSecretName")
        .filter(|s| !s.is_empty())
        .map(str::to_string);
    if let Some(name) = &helm_secret_name
        && let Some(problem) = names::dns1123_subdomain_error(name)
    {
        cx.deny(
            &base.key("helmSecretName"),
            format!(
                "helmSecretName {} is not a valid Secret name: it {problem}",
                super::q(name)
            ),
        );
    }

    let helm_path = base.key("helm");
    let root_values_from = match field(spec, "helm") {
        None | Some(JsonView::Null) => {
            // rancher/fleet internal/cmd/controller/helmops/reconciler/helmop_controller.go
            // `validate`: "helm options are empty in the HelmOp's spec".
            cx.deny(
                &helm_path,
                "spec.helm is missing: Fleet rejects a HelmOp without helm options (set repo and chart, an oci:// repo, or a .tgz chart URL)",
            );
            Vec::new()
        }
        Some(JsonView::Object(h)) => helm::check_root_helm(cx, h, &helm_path),
        // A wrong type is the CRD's to report (schema.rs).
        Some(_) => Vec::new(),
    };

    let root_entries = resources::check_list(cx, spec, base, None);

    let mut target_models = Vec::new();
    if let Some(list) = super::array(spec, "targets") {
        let root_helm = field(spec, "helm").and_then(JsonView::as_object);
        let targets_path = base.key("targets");
        for (i, target) in list.iter().enumerate() {
            let path = targets_path.index(i);
            let Some(target) = target.as_object() else {
                continue;
            };
            target_models.push(check_target(cx, target, (&path, i), root_helm, spec));
        }
    }

    if let Some(list) = super::array(spec, "targetRestrictions") {
        warn_customizations(cx, spec, list.len());
        let restrictions_path = base.key("targetRestrictions");
        for (i, restriction) in list.iter().enumerate() {
            if let Some(r) = restriction.as_object() {
                targets::check_criteria(cx, r, &restrictions_path.index(i));
            }
        }
    }

    check_namespace_selector(cx, spec, base);

    if let Some(rollout) = super::object(spec, "rolloutStrategy") {
        check_rollout(cx, rollout, &base.key("rolloutStrategy"));
    }

    SpecModel {
        root_dest: destination(&[spec]),
        root_entries,
        root_values_from,
        targets: target_models,
        helm_secret_name,
    }
}

/// `rolloutStrategy` (`crate::targeting::partitions`): a value Fleet's Bundle controller cannot
/// read fails the Bundle on every cluster as soon as one matches, and a partition without
/// criteria holds no cluster (with partitions, a cluster none holds gets no BundleDeployment).
fn check_rollout(cx: &mut Ctx, rollout: &Map<'_>, path: &Path<'_>) {
    for key in [
        "maxUnavailable",
        "maxUnavailablePartitions",
        "autoPartitionSize",
    ] {
        check_limit(cx, rollout, key, path);
    }
    let Some(list) = super::array(rollout, "partitions") else {
        return;
    };
    let base = path.key("partitions");
    for (i, partition) in list.iter().enumerate() {
        let path = base.index(i);
        let Some(partition) = partition.as_object() else {
            continue;
        };
        check_limit(cx, partition, "maxUnavailable", &path);
        if !targets::check_criteria(cx, partition, &path) {
            cx.warn(
                &path,
                "this partition has no clusterName, clusterSelector, clusterGroup or clusterGroupSelector, so Fleet puts no cluster in it, and a cluster no partition holds never gets a BundleDeployment",
            );
        }
    }
}

/// `allowedTargetNamespaceSelector` at the root: one Fleet's agent cannot compile fails every
/// deployment of the HelmOp (`crate::targeting::namespace_gate`).
fn check_namespace_selector(cx: &mut Ctx, spec: &Map<'_>, base: &Path<'_>) {
    let key = "allowedTargetNamespaceSelector";
    let Some(value) = field(spec, key).filter(|v| !matches!(v, JsonView::Null)) else {
        return;
    };
    let path = base.key(key);
    if let Some(selector) = targets::parse_selector(value)
        && let Err(e) = crate::selector::Selector::compile(&selector)
    {
        cx.deny(
            &path.key(&e.path),
            format!(
                "{}; Fleet's agent cannot compile this selector and copies nothing for this HelmOp on any cluster",
                e.message
            ),
        );
    }
}

/// An int-or-string rollout value Fleet can read (the CRD's `x-kubernetes-int-or-string` is
/// the schema's to check; a string must also be a number or a percentage Fleet parses).
fn check_limit(cx: &mut Ctx, obj: &Map<'_>, key: &str, base: &Path<'_>) {
    if let Some(s) = super::string(obj, key)
        && let Some(e) = crate::targeting::partitions::unreadable_limit(s)
    {
        cx.deny(
            &base.key(key),
            format!(
                "{e}: Fleet's Bundle controller fails the whole Bundle (no BundleDeployment made or updated on any cluster)"
            ),
        );
    }
}

fn check_target(
    cx: &mut Ctx,
    target: &Map<'_>,
    (path, i): (&Path<'_>, usize),
    root_helm: Option<&Map<'_>>,
    root: &Map<'_>,
) -> TargetModel {
    if field(target, "allowedTargetNamespaceSelector").is_some() {
        cx.warn(
            &path.key("allowedTargetNamespaceSelector"),
            "Fleet's options merge ignores a target's allowedTargetNamespaceSelector: only spec.allowedTargetNamespaceSelector restricts the destination namespace",
        );
    }
    let has_criteria = targets::check_criteria(cx, target, path);
    if !has_criteria {
        cx.warn(
            path,
            "this target has no clusterName, clusterSelector, clusterGroup or clusterGroupSelector, so Fleet matches no cluster with it: add one (clusterSelector: {} matches every cluster)",
        );
    }
    check_namespaces(cx, target, path);
    check_namespace_metadata(cx, target, path);
    let values_from = match super::object(target, "helm") {
        Some(h) => helm::check_target_helm(cx, h, &path.key("helm"), root_helm),
        None => Vec::new(),
    };
    let entries = resources::check_list(cx, target, path, Some(i));
    TargetModel {
        dest: destination(&[target, root]),
        entries,
        values_from,
    }
}

/// With restrictions, Fleet treats the leading `targets - restrictions` targets as fleet.yaml
/// customizations (`target/matcher/bundlematch.go`): say so on each, since a HelmOp author
/// usually means them to select clusters.
fn warn_customizations(cx: &mut Ctx, spec: &Map<'_>, restrictions: usize) {
    let targets = field(spec, "targets")
        .and_then(JsonView::as_array)
        .map_or(0, <[JsonView<'_>]>::len);
    if restrictions == 0 || targets <= restrictions {
        return;
    }
    let customizations = targets - restrictions;
    let targets_path = Path::Root.key("spec");
    let targets_path = targets_path.key("targets");
    for i in 0..customizations {
        cx.warn(
            &targets_path.index(i),
            format!(
                "with {restrictions} targetRestrictions Fleet treats the first {customizations} of {targets} targets as customizations: this target never selects a cluster, it only changes the options of (or, with doNotDeploy, skips) clusters a later target selects and a restriction allows"
            ),
        );
    }
}

/// `namespaceLabels`/`namespaceAnnotations`: string maps (the CRD), which Fleet's agent writes
/// on the release namespace. Keys or values the API server refuses make that write, and so the
/// deployment, fail; pod-security labels are ignored by the agent (and by helmop).
fn check_namespace_metadata(cx: &mut Ctx, obj: &Map<'_>, base: &Path<'_>) {
    for key in ["namespaceLabels", "namespaceAnnotations"] {
        let Some(map) = super::object(obj, key) else {
            continue;
        };
        let labels = key == "namespaceLabels";
        let map_path = base.key(key);
        for (k, _) in sorted_entries(map) {
            let path = map_path.key(k);
            let Some(value) = super::string(map, k) else {
                continue;
            };
            let problem = names::qualified_name_error(k)
                .map(|p| format!("key {} {p}", super::q(k)))
                .or_else(|| {
                    labels
                        .then(|| names::label_value_error(value))
                        .flatten()
                        .map(|p| format!("value {} {p}", super::q(value)))
                });
            if let Some(problem) = problem {
                cx.warn(
                    &path,
                    format!("the namespace cannot carry this: its {problem}, so Fleet's agent fails to update the namespace and the deployment fails"),
                );
            } else if labels && k.starts_with(crate::targeting::POD_SECURITY_LABEL_PREFIX) {
                cx.warn(
                    &path,
                    "Fleet's agent never sets pod-security.kubernetes.io/ labels from namespaceLabels (nor does helmop): set them on the namespace itself",
                );
            }
        }
    }
}

/// Fleet's release (and copy) namespace, `namespaces.GetDeploymentNS` over merged options:
/// the first `namespace` set, else the first `defaultNamespace` set (`layers` most specific
/// first, as `options.Merge` lets a target's non-empty value win).
fn destination(layers: &[&Map<'_>]) -> Option<String> {
    ["namespace", "defaultNamespace"].iter().find_map(|key| {
        layers.iter().find_map(|l| {
            field(l, key)
                .and_then(JsonView::as_str)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
        })
    })
}

/// `namespace` and `defaultNamespace` become the destination namespace of the copies, so they
/// must be namespace names.
fn check_namespaces(cx: &mut Ctx, obj: &Map<'_>, base: &Path<'_>) {
    for key in ["namespace", "defaultNamespace"] {
        if let Some(ns) = super::string(obj, key)
            && !ns.is_empty()
            && let Some(problem) = names::dns1123_label_error(ns)
        {
            cx.deny(
                &base.key(key),
                format!(
                    "{key} {} is not a valid namespace name: it {problem}",
                    super::q(ns)
                ),
            );
        }
    }
}
