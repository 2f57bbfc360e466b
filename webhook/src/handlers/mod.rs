//! The three admission decisions. Each takes the decoded request and returns a [`Verdict`]; the rules
//! themselves live in `helmop-core`, these add the cluster lookups and the failure policy of each
//! endpoint (HelmOp validation fails closed, the delete guard fails closed, workload mutation fails open).

mod helmops;
mod references;
mod workloads;

use kube::core::DynamicObject;
use kube::core::admission::AdmissionRequest;

use crate::state::AppState;
use crate::verdict::Verdict;

pub use workloads::{OptIn, opt_in, stamp_ops};

/// `POST /validate/helmops`: HelmOp CREATE/UPDATE against the core rules and the existence of every
/// downstream resource. Never denies DELETE.
pub async fn validate_helmop(state: &AppState, req: &AdmissionRequest<DynamicObject>) -> Verdict {
    helmops::validate(state, req).await
}

/// `POST /validate/references`: Secret/ConfigMap DELETE while a HelmOp of the namespace lists it.
pub async fn guard_reference(state: &AppState, req: &AdmissionRequest<DynamicObject>) -> Verdict {
    references::guard(state, req).await
}

/// `POST /mutate/workloads`: the config stamp (and, through the image seam, image digests).
pub async fn mutate_workload(state: &AppState, req: &AdmissionRequest<DynamicObject>) -> Verdict {
    workloads::mutate(state, req).await
}

/// `namespace/name` of the request's object, for messages.
fn object_name(req: &AdmissionRequest<DynamicObject>) -> String {
    let name = req
        .object
        .as_ref()
        .and_then(|o| o.metadata.name.clone())
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| req.name.clone());
    match req.namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name,
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
}
