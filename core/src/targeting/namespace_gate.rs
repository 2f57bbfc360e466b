//! `allowedTargetNamespaceSelector`, as Fleet's agent applies it before it copies anything
//! (rancher/fleet v0.16.1 `internal/cmd/agent/controller/bundledeployment_controller.go`
//! `Reconcile`, before `copyResourcesFromUpstream`): when the HelmOp sets it (even `{}`), the
//! destination namespace must already exist downstream and its labels must match; otherwise the
//! BundleDeployment fails and nothing is copied, and the agent never creates the namespace.
//! Only the HelmOp's root value counts: `options.Merge` never takes a target's.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use crate::selector::Selector;

/// A destination namespace downstream, as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NamespaceFacts {
    Absent,
    /// Present (also while terminating: the agent reads it all the same).
    Present(BTreeMap<String, String>),
    /// The credentials may not read it: the selector cannot be checked.
    Unreadable,
}

/// Whether Fleet's agent copies into `namespace`: `Err` with its reason when it refuses
/// (always `Ok` for a HelmOp without the selector).
pub fn namespace_allowed(
    selector: Option<&LabelSelector>,
    namespace: &str,
    facts: &NamespaceFacts,
) -> Result<(), String> {
    let Some(selector) = selector else {
        return Ok(());
    };
    let labels = match facts {
        NamespaceFacts::Absent => {
            return Err(format!(
                "target namespace {namespace} does not exist on downstream cluster, and with allowedTargetNamespaceSelector set Fleet's agent never creates it"
            ));
        }
        NamespaceFacts::Unreadable => {
            return Err(format!(
                "namespace {namespace} cannot be read with these credentials, so whether it matches allowedTargetNamespaceSelector cannot be told: nothing is copied there"
            ));
        }
        NamespaceFacts::Present(labels) => labels,
    };
    let compiled = Selector::compile(selector)
        .map_err(|e| format!("invalid AllowedTargetNamespaceSelector: {}", e.message))?;
    if compiled.matches(labels) {
        Ok(())
    } else {
        let shown: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        Err(format!(
            "target namespace {namespace} does not match AllowedTargetNamespaceSelector; namespace labels [{}]",
            shown.join(",")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sel(v: serde_json::Value) -> LabelSelector {
        serde_json::from_value(v).unwrap_or_default()
    }

    fn present(pairs: &[(&str, &str)]) -> NamespaceFacts {
        NamespaceFacts::Present(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    #[test]
    fn without_the_selector_anything_goes() {
        assert_eq!(
            namespace_allowed(None, "apps", &NamespaceFacts::Absent),
            Ok(())
        );
    }

    #[test]
    fn an_empty_selector_still_needs_the_namespace() {
        let any = sel(serde_json::json!({}));
        assert!(
            namespace_allowed(Some(&any), "apps", &NamespaceFacts::Absent)
                .is_err_and(|e| e.contains("does not exist") && e.contains("never creates"))
        );
        assert_eq!(namespace_allowed(Some(&any), "apps", &present(&[])), Ok(()));
    }

    #[test]
    fn labels_must_match() {
        let tenant = sel(serde_json::json!({"matchLabels": {"tenant": "a"}}));
        assert_eq!(
            namespace_allowed(Some(&tenant), "apps", &present(&[("tenant", "a")])),
            Ok(())
        );
        assert!(
            namespace_allowed(Some(&tenant), "apps", &present(&[("tenant", "b")]))
                .is_err_and(|e| e.contains("does not match") && e.contains("tenant=b"))
        );
        assert!(
            namespace_allowed(Some(&tenant), "apps", &NamespaceFacts::Unreadable)
                .is_err_and(|e| e.contains("cannot be read"))
        );
        let broken = sel(serde_json::json!({"matchExpressions": [{"key": "a", "operator": "In"}]}));
        assert!(
            namespace_allowed(Some(&broken), "apps", &present(&[]))
                .is_err_and(|e| e.contains("invalid AllowedTargetNamespaceSelector"))
        );
    }
}
