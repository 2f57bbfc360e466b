//! Which workloads the installed webhook configuration sends to the stamping webhook.
//!
//! The shipped `MutatingWebhookConfiguration` leaves `kube-system` and `helmop-system` out (and an
//! operator may leave out more). A workload there is never stamped, whatever its labels say, so a
//! restamp of it is a write that changes nothing: the watcher reads the configuration
//! (`--webhook-configuration`), skips such workloads and says so once per namespace, instead of
//! restamping them and reporting the webhook missing. Without the configuration (not installed,
//! not readable) nothing is skipped.

use std::collections::BTreeMap;

use helmop_core::selector::Selector;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;

/// The resources of the kinds the watcher restamps, as webhook rules name them.
const WORKLOAD_RESOURCES: [&str; 5] = [
    "deployments",
    "statefulsets",
    "daemonsets",
    "cronjobs",
    "rollouts",
];

/// The namespace and object selectors of every webhook of the configuration that is sent UPDATEs
/// of workloads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Coverage {
    entries: Vec<(Selector, Selector)>,
}

impl Coverage {
    /// The coverage of `config`, or why it cannot be read (a selector the API server would not
    /// have accepted: then nothing is skipped).
    pub fn of(config: &MutatingWebhookConfiguration) -> Result<Coverage, String> {
        let mut entries = Vec::new();
        for hook in config.webhooks.iter().flatten() {
            let updates_workloads = hook.rules.iter().flatten().any(|rule| {
                let ops = rule.operations.iter().flatten();
                let resources = rule.resources.iter().flatten();
                ops.clone().any(|o| o == "UPDATE" || o == "*")
                    && resources
                        .clone()
                        .any(|r| r == "*" || WORKLOAD_RESOURCES.contains(&r.as_str()))
            });
            if !updates_workloads {
                continue;
            }
            let compile = |s: Option<&_>| match s {
                Some(s) => Selector::compile(s).map_err(|e| format!("webhook {}: {e}", hook.name)),
                // Absent: every namespace, every object.
                None => Ok(Selector::everything()),
            };
            entries.push((
                compile(hook.namespace_selector.as_ref())?,
                compile(hook.object_selector.as_ref())?,
            ));
        }
        Ok(Coverage { entries })
    }

    /// Whether a workload labelled `workload` (the labels the watcher keeps: its opt-in label) in a
    /// namespace labelled `namespace` is sent to a stamping webhook.
    pub fn sends(
        &self,
        namespace: &BTreeMap<String, String>,
        workload: &BTreeMap<String, String>,
    ) -> bool {
        self.entries
            .iter()
            .any(|(ns, obj)| ns.matches(namespace) && obj.matches(workload))
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    /// The shipped configuration's two workload webhooks (manifests/base/webhooks.yaml).
    fn shipped() -> MutatingWebhookConfiguration {
        let rules = json!([{"apiGroups": ["apps"], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                            "resources": ["deployments", "statefulsets", "daemonsets", "replicasets"]}]);
        let excluded = json!({"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                              "values": ["kube-system", "helmop-system"]});
        serde_json::from_value(json!({
            "metadata": {"name": "helmop-webhook"},
            "webhooks": [
                {"name": "workloads.mutate.helmop.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                 "clientConfig": {}, "rules": rules,
                 "namespaceSelector": {"matchExpressions": [excluded,
                     {"key": "helmop.dev/rollout-on-change", "operator": "In", "values": ["enabled"]}]},
                 "objectSelector": {"matchExpressions": [
                     {"key": "helmop.dev/rollout-on-change", "operator": "NotIn", "values": ["false", "true"]}]}},
                {"name": "opted-in.workloads.mutate.helmop.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                 "clientConfig": {}, "rules": rules,
                 "namespaceSelector": {"matchExpressions": [excluded]},
                 "objectSelector": {"matchExpressions": [
                     {"key": "helmop.dev/rollout-on-change", "operator": "In", "values": ["true"]}]}},
                {"name": "helmops.mutate.helmop.dev", "admissionReviewVersions": ["v1"], "sideEffects": "None",
                 "clientConfig": {}, "rules": [{"apiGroups": ["fleet.cattle.io"], "apiVersions": ["v1alpha1"],
                     "operations": ["CREATE", "UPDATE"], "resources": ["helmops"]}]}
            ]
        }))
        .unwrap()
    }

    #[test]
    fn the_shipped_configuration_leaves_out_kube_system_and_helmop_system() {
        let c = Coverage::of(&shipped()).unwrap();
        assert_eq!(
            c.entries.len(),
            2,
            "the HelmOp webhook is not a workload webhook"
        );
        let name = |n: &str, extra: &[(&str, &str)]| {
            let mut l = labels(extra);
            l.insert("kubernetes.io/metadata.name".into(), n.into());
            l
        };
        let enabled = [("helmop.dev/rollout-on-change", "enabled")];
        let by_label = labels(&[("helmop.dev/rollout-on-change", "true")]);
        assert!(c.sends(&name("apps", &enabled), &labels(&[])));
        assert!(c.sends(&name("apps", &[]), &by_label));
        assert!(!c.sends(&name("kube-system", &enabled), &labels(&[])));
        assert!(!c.sends(&name("helmop-system", &[]), &by_label));
        let opted_out = labels(&[("helmop.dev/rollout-on-change", "false")]);
        assert!(!c.sends(&name("apps", &enabled), &opted_out));
    }
}
