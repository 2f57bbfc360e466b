//! HelmOp CREATE/UPDATE: the core rules plus the existence of every downstream resource. Fails closed:
//! when a lookup fails the HelmOp is rejected with code 500 and a message saying why.

use std::collections::{BTreeMap, BTreeSet};

use futures::future::join_all;
use kube::core::admission::Operation;

use helmop_core::model::HelmOp;
use helmop_core::resource::ResourceRef;
use helmop_core::validate::fleet::{
    FleetFacts, depends_on_objects, helm_secret_to_check, rejection,
};
use helmop_core::validate::{
    Checked, EntryPath, Finding, JsonView, allows_missing, check_helmop, has_denials,
    missing_reference_finding, same_json,
};

use super::object_name;
use crate::admission::Request;
use crate::state::AppState;
use crate::verdict::Verdict;

pub(super) async fn validate(state: &AppState, req: &Request) -> Verdict {
    if !matches!(req.operation, Operation::Create | Operation::Update) {
        return Verdict::allow();
    }
    let Some(object) = req.object.as_ref() else {
        return Verdict::Deny {
            message: "helmop webhook: the admission request carries no HelmOp object".into(),
            code: 400,
            warnings: Vec::new(),
        };
    };
    // An object being deleted only loses finalizers from here on; blocking that would leave it stuck.
    if object.metadata.deletion_timestamp.is_some() {
        return Verdict::allow();
    }
    let name = object_name(req);
    let view = object.view();
    let namespace = req
        .namespace
        .clone()
        .or_else(|| object.metadata.namespace.clone())
        .unwrap_or_default();
    let Checked {
        findings,
        references: refs,
    } = check_helmop(view, Some(&namespace));
    // Decided before any lookup: an update that leaves spec as it was is never denied, so a failed or
    // slow lookup must not deny it either (it would block Fleet adding its finalizer whenever the API
    // server stutters). Compared on the borrowed trees, whatever the order of keys.
    let spec_unchanged = req.operation == Operation::Update
        && req
            .old_object
            .as_ref()
            .is_some_and(|old| match (spec_of(old.view()), spec_of(view)) {
                (Some(a), Some(b)) => same_json(a, b),
                (a, b) => a.is_none() && b.is_none(),
            });
    let deadline = super::deadline::current();
    let mut warnings = Vec::new();
    if let Some(deny) = crate::caps::helmop_references(&name, refs.len()) {
        if !spec_unchanged {
            return deny;
        }
        // Over the cap but unchanged (e.g. Fleet adding its finalizer to a HelmOp admitted before the cap):
        // admitted without any lookup, as every spec-unchanged update is.
        tracing::warn!(helmop = %name, references = refs.len(), "over the reference cap; spec unchanged, admitted unchecked");
        return Verdict::allow_with_warnings(vec![format!(
            "HelmOp {name} references {} Secrets and ConfigMaps, more than the {} one admission may check; \
             not checked (this update leaves spec unchanged)",
            refs.len(),
            crate::caps::MAX_REFERENCES
        )]);
    }
    let found = super::deadline::within(deadline, find_missing(state, &namespace, &refs)).await;
    let Some(found) = found else {
        return late(&name, &namespace, spec_unchanged);
    };
    let missing = match found {
        Ok(missing) => missing,
        Err((r, error)) if spec_unchanged => {
            tracing::warn!(helmop = %name, reference = %r, %error, "existence check failed; spec unchanged, admitted");
            warnings.push(format!(
                "cannot check that {r} exists in namespace {namespace:?} ({error}) (not enforced: this update \
                 leaves spec unchanged)"
            ));
            Vec::new()
        }
        Err((r, error)) => {
            tracing::warn!(helmop = %name, reference = %r, %error, "existence check failed; HelmOp rejected");
            return Verdict::Deny {
                message: format!(
                    "helmop webhook: cannot check that {r} exists in namespace {namespace:?} ({error}); \
                     HelmOp {name} is rejected until the API server answers, retry"
                ),
                code: 500,
                warnings: Vec::new(),
            };
        }
    };
    if !has_denials(&findings) {
        let fleet = fleet_warnings(state, &name, &namespace, view);
        match super::deadline::within(deadline, fleet).await {
            Some(fleet) => warnings.extend(fleet),
            // Only warnings were at stake; the rest is decided.
            None => warnings.push(
                "Fleet's rules that depend on other objects were not checked before the request deadline"
                    .to_owned(),
            ),
        }
    }
    let allow_missing = allows_missing(view);
    // Paths are rendered only for what is missing.
    let missing: Vec<(String, ResourceRef)> = missing
        .into_iter()
        .map(|(at, r)| (at.to_string(), r))
        .collect();
    decide(
        &name,
        &namespace,
        findings,
        &missing,
        Policy {
            allow_missing,
            spec_unchanged,
        },
    )
    .with_warnings(warnings)
}

fn spec_of<'v, 'a>(view: &'v JsonView<'a>) -> Option<&'v JsonView<'a>> {
    view.as_object().and_then(|o| o.get("spec"))
}

/// The answer when the existence lookups do not finish before the stages deadline: a slow API server
/// is treated as a failing one, so a spec-unchanged update is admitted and a changed spec is refused
/// (fail closed) with a message that says it was the time, not a missing object.
fn late(name: &str, namespace: &str, spec_unchanged: bool) -> Verdict {
    tracing::warn!(helmop = %name, spec_unchanged, "existence checks did not finish before the request deadline");
    if spec_unchanged {
        return Verdict::allow_with_warnings(vec![format!(
            "cannot check the downstream resources of HelmOp {name} in namespace {namespace:?} before the \
             request deadline (not enforced: this update leaves spec unchanged)"
        )]);
    }
    Verdict::Deny {
        message: format!(
            "helmop webhook: the API server did not answer the existence checks of HelmOp {name} in namespace \
             {namespace:?} before the request deadline; the HelmOp is rejected until it does, retry"
        ),
        code: 500,
        warnings: Vec::new(),
    }
}

/// Warnings for what Fleet's controller rejects depending on other objects: a Policy of the
/// namespace forbids the HelmOp, or its `helmSecretName` Secret (after Policy defaults) does not
/// exist. Never a denial: a Policy or a Secret created after the HelmOp must not leave Fleet (or
/// whoever applies both) wedged on the order of creation; `propagate`/`status` report such a
/// HelmOp `Invalid`. No Policy cache yet (no Policy CRD, not listed yet) means no Policy warning.
async fn fleet_warnings(
    state: &AppState,
    name: &str,
    namespace: &str,
    view: &JsonView<'_>,
) -> Vec<String> {
    let policies = state.caches().policies_in(namespace).unwrap_or_default();
    // The spec rules are denied already; without the rules that depend on other objects nothing is
    // left to warn about, and the typed decode below is most of what this costs.
    if !depends_on_objects(view, &policies) {
        return Vec::new();
    }
    // Straight from the borrowed tree: no copy of the object on the admission path.
    let Ok(op) = <HelmOp as serde::Deserialize>::deserialize(view) else {
        return Vec::new();
    };
    let secret = helm_secret_to_check(&op, &policies);
    let mut warnings = Vec::new();
    let exists = match &secret {
        Some(s) => match state
            .caches()
            .exists(namespace, &ResourceRef::secret(s))
            .await
        {
            Ok(found) => found,
            Err(error) => {
                tracing::warn!(helmop = %name, secret = %s, %error, "helmSecretName lookup failed");
                warnings.push(format!(
                    "cannot check that helmSecretName Secret {s:?} exists in namespace {namespace:?} ({error})"
                ));
                true
            }
        },
        None => true,
    };
    let found = |_: &str| exists;
    let facts = FleetFacts {
        policies: &policies,
        foreign_bundle: false,
        secret_exists: &found,
    };
    // Spec rules are denied by the core findings already.
    if let Some(finding) = rejection(&op, &facts)
        .map(|r| r.admission_finding())
        .filter(|f| !f.is_deny())
    {
        warnings.push(finding.to_string());
    }
    warnings
}

/// The entries (path, reference) whose object does not exist. Each distinct object is looked up once,
/// all concurrently; the first failed lookup is returned as the error.
async fn find_missing(
    state: &AppState,
    namespace: &str,
    refs: &[(EntryPath, ResourceRef)],
) -> Result<Vec<(EntryPath, ResourceRef)>, (ResourceRef, kube::Error)> {
    // What the cache holds is answered in place; only the rest become lookups (most admissions have none,
    // and gathering futures for them was a fifth of what checking the references cost).
    let caches = state.caches();
    let distinct: BTreeSet<&ResourceRef> = refs
        .iter()
        .map(|(_, r)| r)
        .filter(|r| !caches.cached(namespace, r))
        .collect();
    if distinct.is_empty() {
        return Ok(Vec::new());
    }
    let lookups = distinct.into_iter().map(|r| async move {
        let exists = state.caches().exists(namespace, r).await;
        (r, exists)
    });
    let mut exists: BTreeMap<&ResourceRef, bool> = BTreeMap::new();
    for (r, result) in join_all(lookups).await {
        match result {
            Ok(found) => {
                exists.insert(r, found);
            }
            Err(error) => return Err((r.clone(), error)),
        }
    }
    Ok(refs
        .iter()
        .filter(|(_, r)| exists.get(r) == Some(&false))
        .cloned()
        .collect())
}

/// What relaxes a denial.
#[derive(Clone, Copy, Debug, Default)]
struct Policy {
    /// `helmop.dev/allow-missing: "true"`: missing objects are warnings.
    allow_missing: bool,
    /// An UPDATE that leaves `spec` as it was (labels, annotations, finalizers, e.g. Fleet's own writes):
    /// problems are reported as warnings, because denying would block whoever manages the metadata
    /// without making the spec any better.
    spec_unchanged: bool,
}

/// The verdict from the core findings and the missing references (pure).
fn decide(
    name: &str,
    namespace: &str,
    findings: Vec<Finding>,
    missing: &[(String, ResourceRef)],
    policy: Policy,
) -> Verdict {
    let mut problems = Vec::new();
    let mut warnings = Vec::new();
    for finding in findings {
        if finding.is_deny() {
            problems.push(finding);
        } else {
            warnings.push(finding.to_string());
        }
    }
    for (path, r) in missing {
        let finding = missing_reference_finding(path, r, namespace, policy.allow_missing);
        if finding.is_deny() {
            problems.push(finding);
        } else {
            warnings.push(finding.to_string());
        }
    }
    if problems.is_empty() {
        return Verdict::allow_with_warnings(warnings);
    }
    if policy.spec_unchanged {
        warnings.extend(
            problems
                .iter()
                .map(|p| format!("{p} (not enforced: this update leaves spec unchanged)")),
        );
        return Verdict::allow_with_warnings(warnings);
    }
    Verdict::Deny {
        message: denial_message(name, &problems),
        code: 403,
        warnings,
    }
}

/// One message listing every problem with its JSON path.
fn denial_message(name: &str, problems: &[Finding]) -> String {
    let count = match problems.len() {
        1 => "1 problem".to_string(),
        n => format!("{n} problems"),
    };
    let mut message = format!("HelmOp {name} has {count}:");
    for p in problems {
        message.push_str("\n- ");
        message.push_str(&p.to_string());
    }
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    fn missing() -> Vec<(String, ResourceRef)> {
        vec![
            (
                "spec.downstreamResources[1]".into(),
                ResourceRef::secret("db"),
            ),
            (
                "spec.targets[0].downstreamResources[0]".into(),
                ResourceRef::config_map("app"),
            ),
        ]
    }

    fn findings() -> Vec<Finding> {
        vec![
            Finding::deny(
                "spec.downstreamResources[0].kind",
                "kind must be Secret or ConfigMap",
            ),
            Finding::warn(
                "spec.downstreamResources[2].kind",
                "use the canonical kind ConfigMap",
            ),
        ]
    }

    #[test]
    fn every_problem_is_listed_with_its_path() {
        let verdict = decide(
            "team/app",
            "team",
            findings(),
            &missing(),
            Policy::default(),
        );
        let Verdict::Deny {
            message,
            code,
            warnings,
        } = verdict
        else {
            panic!("allowed: {verdict:?}");
        };
        assert_eq!(code, 403);
        assert_eq!(
            message,
            "HelmOp team/app has 3 problems:\n\
             - spec.downstreamResources[0].kind: kind must be Secret or ConfigMap\n\
             - spec.downstreamResources[1]: Secret \"db\" does not exist in namespace \"team\"; create it first, \
             or annotate the HelmOp helmop.dev/allow-missing=true if it is created later\n\
             - spec.targets[0].downstreamResources[0]: ConfigMap \"app\" does not exist in namespace \"team\"; \
             create it first, or annotate the HelmOp helmop.dev/allow-missing=true if it is created later"
        );
        assert_eq!(
            warnings,
            ["spec.downstreamResources[2].kind: use the canonical kind ConfigMap"]
        );
    }

    #[test]
    fn single_problem_wording() {
        let verdict = decide("ns/x", "ns", vec![], &missing()[..1], Policy::default());
        let Verdict::Deny { message, .. } = verdict else {
            panic!("allowed");
        };
        assert!(
            message.starts_with("HelmOp ns/x has 1 problem:\n- spec.downstreamResources[1]: "),
            "{message}"
        );
    }

    #[test]
    fn allow_missing_turns_missing_objects_into_warnings_only() {
        let policy = Policy {
            allow_missing: true,
            ..Policy::default()
        };
        // Missing objects alone: admitted with one warning each.
        let verdict = decide("ns/x", "ns", vec![], &missing(), policy);
        let Verdict::Allow {
            patch: None,
            warnings,
        } = verdict
        else {
            panic!("denied: {verdict:?}");
        };
        assert_eq!(warnings.len(), 2);
        assert!(
            warnings[0].starts_with("spec.downstreamResources[1]: Secret \"db\" does not exist"),
            "{warnings:?}"
        );
        // A rule violation is still denied, and the missing objects are still reported (as warnings).
        let verdict = decide("ns/x", "ns", findings(), &missing(), policy);
        let Verdict::Deny {
            message, warnings, ..
        } = verdict
        else {
            panic!("allowed");
        };
        assert!(
            message.starts_with("HelmOp ns/x has 1 problem:"),
            "{message}"
        );
        assert_eq!(warnings.len(), 3);
    }

    #[test]
    fn unchanged_spec_is_never_denied() {
        let policy = Policy {
            spec_unchanged: true,
            ..Policy::default()
        };
        let verdict = decide("ns/x", "ns", findings(), &missing(), policy);
        let Verdict::Allow { warnings, .. } = verdict else {
            panic!("denied: {verdict:?}");
        };
        assert_eq!(warnings.len(), 4);
        assert!(
            warnings[1].ends_with("(not enforced: this update leaves spec unchanged)"),
            "{warnings:?}"
        );
    }

    #[test]
    fn clean_helmop_is_allowed_without_warnings() {
        assert_eq!(
            decide("ns/x", "ns", vec![], &[], Policy::default()),
            Verdict::allow()
        );
    }
}
