//! Secret/ConfigMap DELETE guard: answered from the HelmOp watch cache, never a per-request LIST.

use kube::core::DynamicObject;
use kube::core::admission::Operation;

use helmop_core::resource::{ResourceKind, ResourceRef};
use helmop_core::validate::downstream_refs;

use super::list_names;
use crate::admission::Request;
use crate::state::{AppState, GuardMode};
use crate::verdict::Verdict;

pub(super) async fn guard(state: &AppState, req: &Request) -> Verdict {
    if req.operation != Operation::Delete || !req.kind.group.is_empty() {
        return Verdict::allow();
    }
    let kind = match req.kind.kind.as_str() {
        "Secret" => ResourceKind::Secret,
        "ConfigMap" => ResourceKind::ConfigMap,
        _ => return Verdict::allow(),
    };
    let Some(namespace) = req.namespace.as_deref().filter(|ns| !ns.is_empty()) else {
        return Verdict::allow();
    };
    let target = ResourceRef::new(kind, req.name.as_str());
    let caches = state.caches();
    // Absent HelmOps (no CRD) are confirmed live: the periodic discovery may not have seen a new CRD yet.
    if !caches.helmops_synced() || (caches.helmops_absent() && !caches.helmops_still_absent().await)
    {
        return Verdict::Deny {
            message: format!(
                "helmop webhook: the HelmOp cache is not loaded yet, so it cannot tell whether a HelmOp lists \
                 {target} in namespace {namespace:?}; retry in a moment"
            ),
            code: 500,
            warnings: Vec::new(),
        };
    }
    // A failed namespace lookup only loses the terminating shortcut; the guard itself still applies.
    let terminating = matches!(caches.namespace(namespace).await, Ok(Some(ns)) if ns.terminating);
    let helmops = caches.helmops_in(namespace);
    let holders = holders(helmops.iter().map(|h| h.as_ref()), &target);
    guard_verdict(
        state.config().guard,
        &target,
        namespace,
        terminating,
        &holders,
    )
}

/// Names (sorted, distinct) of the HelmOps that list `target` at the root or in a target.
fn holders<'a>(
    helmops: impl Iterator<Item = &'a DynamicObject>,
    target: &ResourceRef,
) -> Vec<String> {
    let mut names: Vec<String> = helmops
        .filter(|h| downstream_refs(&h.data).iter().any(|(_, r)| r == target))
        .filter_map(|h| h.metadata.name.clone())
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The verdict for deleting `target` while `holders` list it (pure).
///
/// Deleting a namespace deletes its Secrets and HelmOps in no particular order; refusing while the
/// namespace is terminating would only hold it in Terminating until the HelmOps are gone too.
fn guard_verdict(
    mode: GuardMode,
    target: &ResourceRef,
    namespace: &str,
    terminating: bool,
    holders: &[String],
) -> Verdict {
    if holders.is_empty() || terminating {
        return Verdict::allow();
    }
    let which = match holders.len() {
        1 => format!("HelmOp {}", list_names(holders)),
        _ => format!("HelmOps {}", list_names(holders)),
    };
    match mode {
        GuardMode::Enforce => Verdict::deny(format!(
            "{} {:?} in namespace {namespace:?} is a downstream resource of {which}; remove it from their \
             downstreamResources before deleting it",
            target.kind, target.name
        )),
        GuardMode::Warn => Verdict::allow_with_warnings(vec![format!(
            "{} {:?} in namespace {namespace:?} is still a downstream resource of {which}; Fleet cannot copy it \
             until it exists again",
            target.kind, target.name
        )]),
    }
}

#[cfg(test)]
mod tests {
    use kube::api::ObjectMeta;
    use serde_json::json;

    use super::*;

    fn helmop(name: &str, spec: serde_json::Value) -> DynamicObject {
        DynamicObject {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("team".into()),
                ..Default::default()
            },
            data: json!({ "spec": spec }),
        }
    }

    #[test]
    fn holders_are_found_at_root_and_in_targets_sorted() {
        let helmops = [
            helmop(
                "zeta",
                json!({"downstreamResources": [{"kind": "Secret", "name": "db"}]}),
            ),
            helmop(
                "alpha",
                json!({"targets": [{"clusterName": "c", "downstreamResources": [{"kind": "secret", "name": "db"}]}]}),
            ),
            helmop(
                "other",
                json!({"downstreamResources": [{"kind": "ConfigMap", "name": "db"}]}),
            ),
            helmop("none", json!({"helm": {"chart": "x"}})),
        ];
        assert_eq!(
            holders(helmops.iter(), &ResourceRef::secret("db")),
            ["alpha", "zeta"]
        );
        assert_eq!(
            holders(helmops.iter(), &ResourceRef::config_map("db")),
            ["other"]
        );
        assert!(holders(helmops.iter(), &ResourceRef::secret("nope")).is_empty());
    }

    #[test]
    fn enforce_denies_naming_the_helmops() {
        let holders = ["a".to_string(), "b".to_string()];
        let verdict = guard_verdict(
            GuardMode::Enforce,
            &ResourceRef::secret("db"),
            "team",
            false,
            &holders,
        );
        assert_eq!(
            verdict,
            Verdict::deny(
                "Secret \"db\" in namespace \"team\" is a downstream resource of HelmOps a and b; remove it from \
                 their downstreamResources before deleting it"
            )
        );
    }

    #[test]
    fn warn_allows_with_a_warning() {
        let holders = ["a".to_string()];
        let verdict = guard_verdict(
            GuardMode::Warn,
            &ResourceRef::config_map("app"),
            "team",
            false,
            &holders,
        );
        assert_eq!(
            verdict,
            Verdict::allow_with_warnings(vec![
                "ConfigMap \"app\" in namespace \"team\" is still a downstream resource of HelmOp a; Fleet cannot \
                 copy it until it exists again"
                    .into()
            ])
        );
    }

    #[test]
    fn unreferenced_objects_are_allowed_in_both_modes() {
        for mode in [GuardMode::Enforce, GuardMode::Warn] {
            assert_eq!(
                guard_verdict(mode, &ResourceRef::secret("x"), "ns", false, &[]),
                Verdict::allow()
            );
        }
    }

    #[test]
    fn a_terminating_namespace_is_never_held_up() {
        let holders = ["a".to_string()];
        let verdict = guard_verdict(
            GuardMode::Enforce,
            &ResourceRef::secret("db"),
            "team",
            true,
            &holders,
        );
        assert_eq!(verdict, Verdict::allow());
    }
}
