//! The three admission decisions. Each takes the decoded request and returns a [`Verdict`]; the rules
//! themselves live in `helmop-core`, these add the cluster lookups and the failure policy of each
//! endpoint (HelmOp validation fails closed, the delete guard fails closed, workload mutation fails open).

mod deadline;
mod helmops;
mod references;
mod workloads;

use crate::admission::Request;
use crate::state::AppState;
use crate::verdict::Verdict;

pub use workloads::{OptIn, opt_in, stamp_ops};

/// `POST /validate/helmops`: HelmOp CREATE/UPDATE against the core rules and the existence of every
/// downstream resource. Never denies DELETE.
pub async fn validate_helmop(state: &AppState, req: &Request) -> Verdict {
    helmops::validate(state, req).await
}

/// `POST /validate/references`: Secret/ConfigMap DELETE while a HelmOp of the namespace lists it.
pub async fn guard_reference(state: &AppState, req: &Request) -> Verdict {
    references::guard(state, req).await
}

/// `POST /mutate/workloads`: the config stamp (and, through the image seam, image digests).
pub async fn mutate_workload(state: &AppState, req: &Request) -> Verdict {
    workloads::mutate(state, req).await
}

/// `namespace/name` of the request's object, for messages.
fn object_name(req: &Request) -> String {
    let name = req
        .object
        .as_ref()
        .and_then(|o| o.metadata.name.as_deref())
        .filter(|n| !n.is_empty())
        .unwrap_or(&req.name);
    match req.namespace.as_deref() {
        // Joined by hand: `format!` was 1.5% of a validation's CPU.
        Some(ns) if !ns.is_empty() => [ns, "/", name].concat(),
        _ => name.to_owned(),
    }
}

/// `a, b and c`.
fn list_names(names: &[String]) -> String {
    match names {
        [] => String::new(),
        [one] => one.clone(),
        [init @ .., last] => format!("{} and {last}", init.join(", ")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_listed_readably() {
        let n = |v: &[&str]| list_names(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(n(&[]), "");
        assert_eq!(n(&["a"]), "a");
        assert_eq!(n(&["a", "b"]), "a and b");
        assert_eq!(n(&["a", "b", "c"]), "a, b and c");
    }

    mod unreachable_api_server {
        //! The failure policy of each endpoint when the API server cannot be reached (a closed port on
        //! loopback: every lookup fails the way it does when the API server is down).

        use serde_json::{Value, json};

        use super::super::*;
        use crate::config::Config;
        use crate::metrics::Metrics;

        async fn state() -> AppState {
            let url = "http://127.0.0.1:1".parse().unwrap();
            let client = kube::Client::try_from(kube::Config::new(url)).unwrap();
            AppState::start(client, Config::default(), &Metrics::new())
                .await
                .unwrap()
        }

        fn request(
            gvk: (&str, &str, &str),
            resource: &str,
            operation: &str,
            object: Option<Value>,
        ) -> Request {
            update(gvk, resource, operation, object, None)
        }

        fn update(
            gvk: (&str, &str, &str),
            resource: &str,
            operation: &str,
            object: Option<Value>,
            old: Option<Value>,
        ) -> Request {
            let (group, version, kind) = gvk;
            let review = json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "request": {
                    "uid": "u1",
                    "kind": {"group": group, "version": version, "kind": kind},
                    "resource": {"group": group, "version": version, "resource": resource},
                    "name": "x",
                    "namespace": "team",
                    "operation": operation,
                    "userInfo": {},
                    "object": object,
                    "oldObject": old,
                    "dryRun": false,
                },
            });
            crate::admission::decode(&serde_json::to_vec(&review).unwrap()).unwrap()
        }

        fn helmop() -> Value {
            json!({
                "apiVersion": "fleet.cattle.io/v1alpha1",
                "kind": "HelmOp",
                "metadata": {"name": "x", "namespace": "team"},
                "spec": {
                    "helm": {"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3"},
                    "downstreamResources": [{"kind": "Secret", "name": "db"}],
                },
            })
        }

        fn deployment(labels: Value) -> Value {
            json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "x", "namespace": "team", "labels": labels},
                "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "i",
                    "envFrom": [{"configMapRef": {"name": "app"}}]}]}}},
            })
        }

        const HELMOP: (&str, &str, &str) = ("fleet.cattle.io", "v1alpha1", "HelmOp");
        const DEPLOYMENT: (&str, &str, &str) = ("apps", "v1", "Deployment");

        #[tokio::test]
        async fn helmop_validation_fails_closed_with_500() {
            let state = state().await;
            assert!(!state.ready());
            let req = request(HELMOP, "helmops", "CREATE", Some(helmop()));
            let Verdict::Deny { message, code, .. } = validate_helmop(&state, &req).await else {
                panic!("admitted without checking existence");
            };
            assert_eq!(code, 500);
            assert!(
                message.contains("cannot check that secret/db exists in namespace \"team\""),
                "{message}"
            );
            // DELETE is still never denied.
            let req = request(HELMOP, "helmops", "DELETE", None);
            assert_eq!(validate_helmop(&state, &req).await, Verdict::allow());
        }

        #[tokio::test]
        async fn an_update_that_leaves_the_helmop_spec_unchanged_passes_without_lookups() {
            let state = state().await;
            let mut finalized = helmop();
            finalized["metadata"]["finalizers"] = json!(["fleet.cattle.io/helmop-finalizer"]);
            let req = update(
                HELMOP,
                "helmops",
                "UPDATE",
                Some(finalized.clone()),
                Some(helmop()),
            );
            let Verdict::Allow { warnings, .. } = validate_helmop(&state, &req).await else {
                panic!("a finalizer-only update was denied");
            };
            assert!(
                warnings[0].contains("cannot check that secret/db exists")
                    && warnings[0].ends_with("(not enforced: this update leaves spec unchanged)"),
                "{warnings:?}"
            );
            // A spec change still fails closed.
            let mut changed = finalized;
            changed["spec"]["helm"]["version"] = json!("1.2.4");
            let req = update(HELMOP, "helmops", "UPDATE", Some(changed), Some(helmop()));
            let Verdict::Deny { code, .. } = validate_helmop(&state, &req).await else {
                panic!("a spec change was admitted without checking existence");
            };
            assert_eq!(code, 500);
        }

        #[tokio::test]
        async fn an_unchanged_spec_over_the_reference_cap_passes_and_a_new_one_is_denied() {
            let state = state().await;
            let mut big = helmop();
            let entries: Vec<_> = (0..=crate::caps::MAX_REFERENCES)
                .map(|i| json!({"kind": "Secret", "name": format!("s{i}")}))
                .collect();
            big["spec"]["downstreamResources"] = json!(entries);
            let mut finalized = big.clone();
            finalized["metadata"]["finalizers"] = json!(["fleet.cattle.io/helmop-finalizer"]);
            let req = update(
                HELMOP,
                "helmops",
                "UPDATE",
                Some(finalized),
                Some(big.clone()),
            );
            let Verdict::Allow { warnings, .. } = validate_helmop(&state, &req).await else {
                panic!("a finalizer-only update over the cap was denied");
            };
            assert!(
                warnings[0].contains("more than the 256")
                    && warnings[0].ends_with("(this update leaves spec unchanged)"),
                "{warnings:?}"
            );
            let req = update(HELMOP, "helmops", "CREATE", Some(big), None);
            let Verdict::Deny { code, message, .. } = validate_helmop(&state, &req).await else {
                panic!("a HelmOp over the cap was admitted");
            };
            assert!(code < 500 && message.contains("257"), "{code} {message}");
        }

        #[tokio::test]
        async fn an_update_keeps_the_stored_stamp_when_none_can_be_computed() {
            let state = state().await;
            let labelled = deployment(json!({"helmop.dev/rollout-on-change": "true"}));
            let mut stored = labelled.clone();
            stored["spec"]["template"]["metadata"] = json!({"annotations": {
                "helmop.dev/config-hash": "v1:00", "helmop.dev/config-refs": "configmap/app"}});
            // A `kubectl replace` of the manifest, which has no stamp: the stored one is carried over.
            let req = update(
                DEPLOYMENT,
                "deployments",
                "UPDATE",
                Some(labelled.clone()),
                Some(stored.clone()),
            );
            let Verdict::Allow {
                patch: Some(patch),
                warnings,
            } = mutate_workload(&state, &req).await
            else {
                panic!("the stored stamp was not kept");
            };
            let mut out = labelled.clone();
            json_patch::patch(&mut out, &patch).unwrap();
            assert_eq!(
                out["spec"]["template"]["metadata"],
                stored["spec"]["template"]["metadata"]
            );
            assert!(
                warnings[0].contains("keeps its previous config stamp"),
                "{warnings:?}"
            );
            // The same with the namespace unreadable (opt-in by namespace cannot be decided).
            let unlabelled = deployment(json!({}));
            let mut stored = unlabelled.clone();
            stored["spec"]["template"]["metadata"] =
                json!({"annotations": {"helmop.dev/config-hash": "v1:00"}});
            let req = update(
                DEPLOYMENT,
                "deployments",
                "UPDATE",
                Some(unlabelled),
                Some(stored),
            );
            let Verdict::Allow {
                patch: Some(_),
                warnings,
            } = mutate_workload(&state, &req).await
            else {
                panic!("the stored stamp was not kept");
            };
            assert!(
                warnings[0].contains("keeps its previous config stamp"),
                "{warnings:?}"
            );
            // The object already carries it (e.g. `kubectl apply`): nothing to patch.
            let req = update(
                DEPLOYMENT,
                "deployments",
                "UPDATE",
                Some(out.clone()),
                Some(out),
            );
            let Verdict::Allow { patch: None, .. } = mutate_workload(&state, &req).await else {
                panic!("patched an object that has its stamp");
            };
        }

        #[tokio::test]
        async fn delete_guard_fails_closed_until_helmops_are_loaded() {
            let state = state().await;
            let req = request(("", "v1", "Secret"), "secrets", "DELETE", None);
            let Verdict::Deny { message, code, .. } = guard_reference(&state, &req).await else {
                panic!("delete allowed without knowing the HelmOps");
            };
            assert_eq!(code, 500);
            assert!(
                message.contains("HelmOp cache is not loaded yet"),
                "{message}"
            );
            // Other operations and kinds are not the guard's business.
            let req = request(("", "v1", "Secret"), "secrets", "CREATE", Some(json!({})));
            assert_eq!(guard_reference(&state, &req).await, Verdict::allow());
            let req = request(("apps", "v1", "Deployment"), "deployments", "DELETE", None);
            assert_eq!(guard_reference(&state, &req).await, Verdict::allow());
        }

        #[tokio::test]
        async fn workload_mutation_fails_open_with_a_warning() {
            let state = state().await;
            // Opt-in depends on the namespace, which cannot be read.
            let req = request(
                DEPLOYMENT,
                "deployments",
                "CREATE",
                Some(deployment(json!({}))),
            );
            let Verdict::Allow {
                patch: None,
                warnings,
            } = mutate_workload(&state, &req).await
            else {
                panic!("not admitted unchanged");
            };
            assert_eq!(warnings.len(), 1, "{warnings:?}");
            assert!(
                warnings[0].contains("cannot read the labels of namespace \"team\""),
                "{warnings:?}"
            );
            // Opted in by its own label, but no hash key could be loaded.
            let labelled = deployment(json!({"helmop.dev/rollout-on-change": "true"}));
            let req = request(DEPLOYMENT, "deployments", "UPDATE", Some(labelled));
            let Verdict::Allow {
                patch: None,
                warnings,
            } = mutate_workload(&state, &req).await
            else {
                panic!("not admitted unchanged");
            };
            assert!(
                warnings[0]
                    .contains("hash key Secret helmop-system/helmop-hash-key not loaded yet"),
                "{warnings:?}"
            );
            // Opted out: nothing to look up, nothing to say.
            let opted_out = deployment(json!({"helmop.dev/rollout-on-change": "false"}));
            let req = request(DEPLOYMENT, "deployments", "CREATE", Some(opted_out));
            assert_eq!(mutate_workload(&state, &req).await, Verdict::allow());
        }
    }
}
