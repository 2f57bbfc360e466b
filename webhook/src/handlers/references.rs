//! Secret/ConfigMap DELETE guard: answered from the HelmOp watch cache, never a per-request LIST.

use kube::core::admission::Operation;

use helmop_core::resource::{ResourceKind, ResourceRef};

use super::list_names;
use crate::admission::Request;
use crate::state::guarded::GuardedHelmOp;
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
    if collected(req) {
        // The owner is gone: refusing would leave the object behind for good, not keep it for Fleet.
        tracing::info!(namespace, object = %target, "garbage collector's delete allowed");
        return Verdict::allow();
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

/// The garbage collector's own user (kube-controller-manager with `--use-service-account-credentials`,
/// what kubeadm, RKE2, k3s and the managed control planes run).
pub const GARBAGE_COLLECTOR: &str = "system:serviceaccount:kube-system:generic-garbage-collector";
/// kube-controller-manager's user without service account credentials: every controller in it.
const CONTROLLER_MANAGER: &str = "system:kube-controller-manager";

/// Whether the delete is the garbage collector removing an object whose owner is gone (or a delete
/// propagated from an owner): its own user, or kube-controller-manager's shared user deleting an
/// object that has owners. A user, a controller of the cluster's or a tenant deleting an object
/// is still guarded.
fn collected(req: &Request) -> bool {
    let user = req.user_info.username.as_str();
    let owned = req.old_object.as_ref().is_some_and(|o| {
        o.metadata
            .owner_references
            .as_ref()
            .is_some_and(|refs| !refs.is_empty())
    });
    user == GARBAGE_COLLECTOR || (user == CONTROLLER_MANAGER && owned)
}

/// The HelmOps that list `target` at the root or in a target (names sorted, distinct): `strict` hold
/// it; `optional` ones carry `helmop.dev/allow-missing` and so lay no claim to a name that someone
/// else may create, delete and create again (they get a warning, never a veto).
#[derive(Debug, Default, PartialEq)]
struct Holders {
    strict: Vec<String>,
    optional: Vec<String>,
}

fn holders<'a>(helmops: impl Iterator<Item = &'a GuardedHelmOp>, target: &ResourceRef) -> Holders {
    let mut out = Holders::default();
    for h in helmops.filter(|h| h.refs.binary_search(target).is_ok()) {
        if let Some(name) = h.metadata.name.clone() {
            if h.allow_missing {
                out.optional.push(name);
            } else {
                out.strict.push(name);
            }
        }
    }
    for names in [&mut out.strict, &mut out.optional] {
        names.sort();
        names.dedup();
    }
    out
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
    holders: &Holders,
) -> Verdict {
    if terminating {
        return Verdict::allow();
    }
    let which = |names: &[String]| match names.len() {
        1 => format!("HelmOp {}", list_names(names)),
        _ => format!("HelmOps {}", list_names(names)),
    };
    if holders.strict.is_empty() {
        if holders.optional.is_empty() {
            return Verdict::allow();
        }
        return Verdict::allow_with_warnings(vec![format!(
            "{} {:?} in namespace {namespace:?} is listed by {} with helmop.dev/allow-missing; Fleet cannot \
             copy it until it exists again",
            target.kind,
            target.name,
            which(&holders.optional)
        )]);
    }
    let which = which(&holders.strict);
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
    use serde_json::json;

    use super::*;

    fn helmop(name: &str, spec: serde_json::Value) -> GuardedHelmOp {
        serde_json::from_value(
            json!({"metadata": {"name": name, "namespace": "team"}, "spec": spec}),
        )
        .unwrap()
    }

    fn strict(names: &[&str]) -> Holders {
        Holders {
            strict: names.iter().map(|s| s.to_string()).collect(),
            optional: Vec::new(),
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
            strict(&["alpha", "zeta"])
        );
        assert_eq!(
            holders(helmops.iter(), &ResourceRef::config_map("db")),
            strict(&["other"])
        );
        assert_eq!(
            holders(helmops.iter(), &ResourceRef::secret("nope")),
            Holders::default()
        );
    }

    #[test]
    fn enforce_denies_naming_the_helmops() {
        let holders = strict(&["a", "b"]);
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
        let holders = strict(&["a"]);
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
                guard_verdict(
                    mode,
                    &ResourceRef::secret("x"),
                    "ns",
                    false,
                    &Holders::default()
                ),
                Verdict::allow()
            );
        }
    }

    #[test]
    fn a_terminating_namespace_is_never_held_up() {
        let holders = strict(&["a"]);
        let verdict = guard_verdict(
            GuardMode::Enforce,
            &ResourceRef::secret("db"),
            "team",
            true,
            &holders,
        );
        assert_eq!(verdict, Verdict::allow());
    }

    #[test]
    fn allow_missing_holders_warn_and_never_veto() {
        let helmops = [serde_json::from_value::<GuardedHelmOp>(json!({
            "metadata": {"name": "rotating", "annotations": {"helmop.dev/allow-missing": "true"}},
            "spec": {"downstreamResources": [{"kind": "Secret", "name": "token"}]},
        }))
        .unwrap()];
        let h = holders(helmops.iter(), &ResourceRef::secret("token"));
        assert_eq!(h.optional, ["rotating"]);
        let verdict = guard_verdict(
            GuardMode::Enforce,
            &ResourceRef::secret("token"),
            "team",
            false,
            &h,
        );
        assert!(
            matches!(&verdict, Verdict::Allow { warnings, .. } if warnings[0].contains("allow-missing")),
            "{verdict:?}"
        );
    }

    #[test]
    fn only_the_garbage_collector_is_exempt() {
        let review = |user: &str, owners: bool| {
            let owners = if owners {
                json!([{"apiVersion": "v1", "kind": "ConfigMap", "name": "o", "uid": "u"}])
            } else {
                json!(null)
            };
            let body = json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": "1", "kind": {"group": "", "version": "v1", "kind": "Secret"},
                    "resource": {"group": "", "version": "v1", "resource": "secrets"},
                    "name": "db", "namespace": "team", "operation": "DELETE",
                    "userInfo": {"username": user},
                    "oldObject": {"metadata": {"name": "db", "namespace": "team", "ownerReferences": owners}},
                },
            });
            crate::admission::decode(body.to_string().as_bytes()).unwrap()
        };
        assert!(collected(&review(GARBAGE_COLLECTOR, false)));
        assert!(collected(&review(CONTROLLER_MANAGER, true)));
        assert!(!collected(&review(CONTROLLER_MANAGER, false)));
        assert!(!collected(&review(
            "system:serviceaccount:team:deployer",
            true
        )));
        assert!(!collected(&review("alice", false)));
    }
}
