//! The existence rule (every listed Secret/ConfigMap exists in the HelmOp's namespace), minus the
//! lookup: what to say about a downstream resource that is absent from the HelmOp's namespace.
//! The webhook (at admission) and `kubectl helmop validate --cluster` (before it) both report
//! missing objects with these words, so a user sees the same finding wherever the check ran.

use super::{Finding, JsonView, field_of};
use crate::names::ANN_ALLOW_MISSING;
use crate::resource::ResourceRef;

/// Whether `helmop` carries `helmop.dev/allow-missing: "true"` (see [`super::allows_missing`]).
pub(super) fn allows_missing(helmop: &JsonView<'_>) -> bool {
    field_of(helmop, "metadata")
        .and_then(|m| field_of(m, "annotations"))
        .and_then(|a| field_of(a, ANN_ALLOW_MISSING))
        .and_then(JsonView::as_str)
        == Some("true")
}

/// The finding for the entry at `path` (e.g. `spec.targets[0].downstreamResources[1]`) whose
/// object `reference` does not exist in `namespace`: a denial that says how to fix it, or, with
/// `allow_missing`, a warning that Fleet cannot copy it yet.
pub fn missing_reference_finding(
    path: &str,
    reference: &ResourceRef,
    namespace: &str,
    allow_missing: bool,
) -> Finding {
    let (kind, name) = (reference.kind, &reference.name);
    if allow_missing {
        Finding::warn(
            path,
            format!(
                "{kind} {name:?} does not exist in namespace {namespace:?} yet; Fleet cannot copy it until it does"
            ),
        )
    } else {
        Finding::deny(
            path,
            format!(
                "{kind} {name:?} does not exist in namespace {namespace:?}; create it first, or annotate the HelmOp \
                 {ANN_ALLOW_MISSING}=true if it is created later"
            ),
        )
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::*;
    use crate::validate::{Severity, allows_missing};

    #[test]
    fn denial_names_the_object_the_namespace_and_the_way_out() {
        let f = missing_reference_finding(
            "spec.downstreamResources[1]",
            &ResourceRef::secret("db"),
            "team",
            false,
        );
        assert_eq!(f.severity, Severity::Deny);
        assert_eq!(
            f.to_string(),
            "spec.downstreamResources[1]: Secret \"db\" does not exist in namespace \"team\"; \
             create it first, or annotate the HelmOp helmop.dev/allow-missing=true if it is created later"
        );
    }

    #[test]
    fn allow_missing_makes_it_a_warning() {
        let f = missing_reference_finding(
            "spec.targets[0].downstreamResources[0]",
            &ResourceRef::config_map("app"),
            "team",
            true,
        );
        assert_eq!(f.severity, Severity::Warn);
        assert_eq!(
            f.to_string(),
            "spec.targets[0].downstreamResources[0]: ConfigMap \"app\" does not exist in namespace \"team\" yet; \
             Fleet cannot copy it until it does"
        );
    }

    #[test]
    fn only_the_string_true_allows_missing() {
        let with = |v: Value| json!({"metadata": {"annotations": {"helmop.dev/allow-missing": v}}});
        assert!(allows_missing(&with(json!("true"))));
        for v in [
            json!("false"),
            json!("True"),
            json!("yes"),
            json!(true),
            json!(null),
        ] {
            assert!(!allows_missing(&with(v.clone())), "{v}");
        }
        assert!(!allows_missing(&json!({"metadata": {}})));
        assert!(!allows_missing(&json!("not an object")));
    }
}
