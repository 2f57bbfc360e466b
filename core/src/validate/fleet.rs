//! Whether Fleet v0.16's HelmOp controller turns a HelmOp into a Bundle (rancher/fleet
//! `internal/cmd/controller/helmops/reconciler/helmop_controller.go` `Reconcile`, and
//! `restrictions.go`). Its checks, in its order; the first failure stops the reconcile, so Fleet
//! neither creates nor updates the Bundle (an existing one stays as it was):
//!
//! 1. `validate()`: `spec.helm` present; chart/repo/version combination ([`spec_rejection`],
//!    the same rules the webhook denies);
//! 2. `AuthorizeAndAssignDefaults`: the Policies of the HelmOp's namespace ([`authorize`]);
//! 3. a Bundle of the same name that is not a HelmOp's;
//! 4. `getChartVersion`: the `helmSecretName` Secret (after Policy defaults) must be readable,
//!    and the version constraint must parse (checked in 1 here, as the webhook does);
//! 5. the Bundle controller's `AuthorizeBundle`: every target's own `serviceAccount` must be
//!    allowed too (checked with 2 here, [`authorize`]);
//! 6. the Bundle's create or update, which the API server refuses when a label Fleet writes is
//!    not a label ([`bundle_label_problems`]; decided by the spec and name, so checked in 1 here).
//!
//! Steps 2 to 4 depend on other objects, so the caller looks them up and passes [`FleetFacts`].

use crate::model::{BundleTarget, HelmOp, HelmOpSpec, Policy};

use super::helm::source_problems;
use super::{Error, Finding};

/// A HelmOp Fleet's controller would not turn into a Bundle, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// Which of Fleet's checks failed.
    pub check: RejectionCheck,
    /// A one-line reason (never any Secret data).
    pub reason: String,
}

impl Rejection {
    /// What admission (the webhook, `validate --cluster`) says about it: the spec rules deny;
    /// the others depend on objects that may arrive in any order, so they only warn.
    pub fn admission_finding(&self) -> Finding {
        let (path, message) = match self.check {
            RejectionCheck::Spec => return Finding::deny("", self.reason.clone()),
            RejectionCheck::Policy => ("spec", self.reason.clone()),
            RejectionCheck::ForeignBundle => ("metadata.name", self.reason.clone()),
            RejectionCheck::HelmSecret => ("spec.helmSecretName", self.reason.clone()),
        };
        Finding::warn(
            path,
            format!(
                "{message}: Fleet's controller will not deploy this HelmOp (and helmop copies none of its downstream resources) until this changes"
            ),
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RejectionCheck {
    /// Decided by the spec alone: the webhook denies these at admission.
    Spec,
    /// A Fleet Policy of the HelmOp's namespace forbids it.
    Policy,
    /// A Bundle of the same name exists that is not a HelmOp's.
    ForeignBundle,
    /// The `helmSecretName` Secret does not exist.
    HelmSecret,
}

/// Fleet's `validate()` plus the version constraint, then the labels of the Bundle it would
/// write ([`bundle_label_problems`]): `None` when the spec alone is acceptable.
pub fn spec_rejection(op: &HelmOp) -> Option<String> {
    let Some(helm) = &op.spec.helm else {
        return Some("spec.helm: helm options are empty in the HelmOp's spec".into());
    };
    let field = |f: &Option<String>| f.as_deref().unwrap_or_default().to_string();
    let (chart, repo, version) = (field(&helm.chart), field(&helm.repo), field(&helm.version));
    source_problems(&chart, &repo, &version)
        .into_iter()
        .next()
        .map(|(path, message)| format!("spec.helm.{path}: {message}"))
        .or_else(|| {
            let labels = op.spec.labels.iter().flatten();
            bundle_label_problems(
                op.metadata.name.as_deref(),
                labels.map(|(k, v)| (k.as_str(), v.as_str())),
            )
            .into_iter()
            .next()
            .map(|(path, message)| format!("{path}: {message}"))
        })
}

/// Label Fleet writes on a HelmOp's Bundle (and its BundleDeployments) with the HelmOp's name.
pub const HELMOP_NAME_LABEL: &str = "fleet.cattle.io/fleet-helm-name";

/// What the API server would refuse in the labels of the Bundle Fleet writes for a HelmOp named
/// `name` with `spec.labels` `labels` (rancher/fleet `helmop_controller.go` `toBundle`: every
/// `spec.labels` entry, then [`HELMOP_NAME_LABEL`] = the name). Fleet's CRD checks neither, so
/// the HelmOp is stored, Fleet's create (or update) of the Bundle fails on every reconcile, and no
/// cluster gets anything. `(path, message)` pairs, in the order given.
pub fn bundle_label_problems<'a>(
    name: Option<&str>,
    labels: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> Vec<(String, String)> {
    use crate::name_rules::{label_value_error, qualified_name_error};
    let mut out = Vec::new();
    if let Some(name) = name
        && let Some(problem) = label_value_error(name)
    {
        out.push((
            "metadata.name".to_string(),
            format!(
                "Fleet writes the HelmOp's name into the label {HELMOP_NAME_LABEL} of its Bundle, and as a label value it {problem} (has {}): Fleet never creates the Bundle; use a shorter name",
                name.len()
            ),
        ));
    }
    for (key, value) in labels {
        let problem = qualified_name_error(key)
            .map(|p| format!("its key {} {p}", super::q(key)))
            .or_else(|| {
                label_value_error(value).map(|p| format!("its value {} {p}", super::q(value)))
            });
        if let Some(problem) = problem {
            out.push((
                format!("spec.labels.{key}"),
                format!(
                    "Fleet copies spec.labels onto the HelmOp's Bundle, and the API server refuses this label ({problem}): Fleet never creates or updates the Bundle"
                ),
            ));
        }
    }
    out
}

/// Fleet's `policyrestrictions.Aggregate` restricted to what the HelmOp controller reads:
/// Policies in name order, booleans ORed, lists unioned, defaults first non-empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MergedPolicy {
    pub require_service_account: bool,
    pub allowed_service_accounts: Vec<String>,
    pub default_service_account: String,
    pub default_helm_secret_name: String,
    pub allowed_helm_secret_names: Vec<String>,
    pub allowed_repo_patterns: Vec<String>,
    pub allowed_chart_patterns: Vec<String>,
}

pub fn aggregate(policies: &[Policy]) -> MergedPolicy {
    let mut sorted: Vec<&Policy> = policies.iter().collect();
    sorted.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let mut m = MergedPolicy::default();
    let list = |l: &Option<Vec<String>>| l.clone().unwrap_or_default();
    for p in sorted {
        m.require_service_account |= p.require_service_account.unwrap_or(false);
        m.allowed_service_accounts
            .extend(list(&p.allowed_service_accounts));
        let Some(h) = &p.helm_op else { continue };
        if m.default_service_account.is_empty() {
            m.default_service_account = h.default_service_account.clone().unwrap_or_default();
        }
        if m.default_helm_secret_name.is_empty() {
            m.default_helm_secret_name = h.default_helm_secret_name.clone().unwrap_or_default();
        }
        m.allowed_helm_secret_names
            .extend(list(&h.allowed_helm_secret_names));
        m.allowed_repo_patterns
            .extend(list(&h.allowed_helm_repo_patterns));
        m.allowed_chart_patterns
            .extend(list(&h.allowed_chart_patterns));
    }
    m
}

/// What Fleet uses after applying the Policies' defaults.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Authorized {
    pub service_account: Option<String>,
    pub helm_secret_name: Option<String>,
}

/// Fleet's `AuthorizeAndAssignDefaults`: no Policy means no restriction; otherwise the
/// defaults fill empty fields, then each restriction is checked in Fleet's order.
pub fn authorize(op: &HelmOp, policies: &[Policy]) -> Result<Authorized, Error> {
    let own = |s: Option<&str>| s.unwrap_or_default().to_string();
    let mut service_account = own(op.spec.service_account());
    let mut helm_secret_name = own(op.spec.helm_secret_name());
    let non_empty = |s: String| (!s.is_empty()).then_some(s);
    if policies.is_empty() {
        return Ok(Authorized {
            service_account: non_empty(service_account),
            helm_secret_name: non_empty(helm_secret_name),
        });
    }
    let pol = aggregate(policies);
    if service_account.is_empty() {
        service_account = pol.default_service_account.clone();
    }
    if helm_secret_name.is_empty() {
        helm_secret_name = pol.default_helm_secret_name.clone();
    }
    if pol.require_service_account && service_account.is_empty() {
        return Err(Error::ServiceAccountRequired);
    }
    allowed(
        "serviceAccount",
        &service_account,
        &pol.allowed_service_accounts,
    )?;
    allowed(
        "helmSecretName",
        &helm_secret_name,
        &pol.allowed_helm_secret_names,
    )?;
    if let Some(helm) = &op.spec.helm {
        let repo = helm.repo.as_deref().unwrap_or_default();
        allowed_by_regex("helm repo", repo, &pol.allowed_repo_patterns)?;
        let chart = helm.chart.as_deref().unwrap_or_default();
        allowed_by_regex("helm chart", chart, &pol.allowed_chart_patterns)?;
    }
    // The Bundle controller's `AuthorizeBundle`: a target's own service account bypasses the
    // default, so each is checked too, and one outside the list refuses the whole Bundle.
    targets_allowed(op.spec.targets(), &pol)?;
    Ok(Authorized {
        service_account: non_empty(service_account),
        helm_secret_name: non_empty(helm_secret_name),
    })
}

/// Fleet's `AuthorizeBundle` (`bundle_policy.go`), which the Bundle controller runs on every
/// reconcile of a Bundle, also one whose HelmOp the HelmOp controller now rejects: the Bundle's
/// own service account (the HelmOp controller filled in the Policy default when it made the
/// Bundle) and every target's, against the Policies as they are now, without defaults. Nothing
/// else a Policy says (secret names, repo and chart patterns) is checked on the Bundle.
pub fn authorize_bundle(spec: &HelmOpSpec, policies: &[Policy]) -> Result<(), Error> {
    if policies.is_empty() {
        return Ok(());
    }
    let pol = aggregate(policies);
    let service_account = spec.service_account().unwrap_or_default();
    if pol.require_service_account && service_account.is_empty() {
        return Err(Error::ServiceAccountRequired);
    }
    allowed(
        "serviceAccount",
        service_account,
        &pol.allowed_service_accounts,
    )?;
    targets_allowed(spec.targets(), &pol)
}

/// Every target's own service account against `allowedServiceAccounts`. The HelmOp controller
/// names unnamed targets `target%03d` by position (`calculateBundle`).
fn targets_allowed(targets: &[BundleTarget], pol: &MergedPolicy) -> Result<(), Error> {
    for (i, target) in targets.iter().enumerate() {
        let sa = target.service_account.as_deref().unwrap_or_default();
        if allowed("serviceAccount", sa, &pol.allowed_service_accounts).is_err() {
            let name = match target.name.as_deref() {
                Some(n) if !n.is_empty() => n.to_string(),
                _ => format!("target{i:03}"),
            };
            return Err(Error::TargetServiceAccount {
                target: name,
                value: sa.to_owned(),
                allowed: pol.allowed_service_accounts.clone(),
            });
        }
    }
    Ok(())
}

/// What becomes of a HelmOp Fleet's HelmOp controller rejects. The controller stops before
/// it touches the Bundle, so a Bundle it made earlier stays as it was, and the Bundle
/// controller keeps reconciling it: it still targets clusters and stages source changes
/// (`bundle_controller.go`), as long as its own check ([`authorize_bundle`]) passes.
#[derive(Debug, PartialEq)]
pub enum AfterRejection {
    /// No Bundle of this HelmOp: nothing delivers (copies already made stay as they are).
    NoBundle,
    /// The previous Bundle delivers: plan its spec instead of the HelmOp's.
    Follow(Box<HelmOpSpec>),
    /// The previous Bundle stays, but nothing delivers it now; the reason.
    Frozen(String),
}

/// [`AfterRejection`] from the Bundle of the HelmOp's name (as read, `None` when absent) and the
/// Policies of its namespace. A Bundle without `spec.helmOpOptions` is not the HelmOp's.
pub fn after_rejection(bundle: Option<&serde_json::Value>, policies: &[Policy]) -> AfterRejection {
    let Some(bundle) = bundle else {
        return AfterRejection::NoBundle;
    };
    let spec = bundle.get("spec");
    let is_helmops = spec
        .and_then(|s| s.get("helmOpOptions"))
        .is_some_and(|o| !o.is_null());
    if !is_helmops {
        return AfterRejection::NoBundle;
    }
    let mut spec: HelmOpSpec = match spec.cloned().map(serde_json::from_value) {
        Some(Ok(spec)) => spec,
        Some(Err(e)) => {
            return AfterRejection::Frozen(format!("its previous Bundle cannot be read: {e}"));
        }
        None => return AfterRejection::NoBundle,
    };
    // Fleet copied the HelmOp's spec.labels onto the Bundle: what BundleNamespaceMappings see.
    let labels = bundle
        .pointer("/metadata/labels")
        .cloned()
        .and_then(|l| serde_json::from_value(l).ok());
    spec.labels = labels;
    match authorize_bundle(&spec, policies) {
        Ok(()) => AfterRejection::Follow(Box::new(spec)),
        Err(e) => AfterRejection::Frozen(format!(
            "Fleet's Bundle controller refuses its previous Bundle too: {e}"
        )),
    }
}

/// Fleet's `IsAllowed`: empty values and empty lists allow.
fn allowed(field: &'static str, value: &str, list: &[String]) -> Result<(), Error> {
    if value.is_empty() || list.is_empty() || list.iter().any(|v| v == value) {
        Ok(())
    } else {
        Err(Error::Disallowed {
            field,
            value: value.to_owned(),
            allowed: list.to_vec(),
        })
    }
}

/// Fleet's `IsAllowedByRegex`: a pattern matches verbatim or as an anchored regular
/// expression with Go's meaning ([`crate::goregex`]); patterns are tried in order and one that
/// Go would not compile fails the check.
fn allowed_by_regex(field: &'static str, value: &str, patterns: &[String]) -> Result<(), Error> {
    if value.is_empty() || patterns.is_empty() {
        return Ok(());
    }
    for pattern in patterns {
        if pattern == value {
            return Ok(());
        }
        let re = crate::goregex::compile_anchored(pattern).map_err(|e| Error::PolicyRegex {
            field,
            value: value.to_owned(),
            pattern: pattern.clone(),
            reason: e.to_string(),
        })?;
        if re.is_match(value) {
            return Ok(());
        }
    }
    Err(Error::Disallowed {
        field,
        value: value.to_owned(),
        allowed: patterns.to_vec(),
    })
}

/// The `helmSecretName` Secret whose existence [`rejection`] depends on (after Policy defaults),
/// for the caller to look up; `None` when there is none or a Policy rejects the HelmOp anyway.
pub fn helm_secret_to_check(op: &HelmOp, policies: &[Policy]) -> Option<String> {
    authorize(op, policies)
        .ok()
        .and_then(|a| a.helm_secret_name)
}

/// What the caller looked up for [`rejection`].
pub struct FleetFacts<'a> {
    /// The Policies of the HelmOp's namespace (none when the kind is not served).
    pub policies: &'a [Policy],
    /// A Bundle of the HelmOp's name exists without `spec.helmOpOptions`.
    pub foreign_bundle: bool,
    /// Whether a Secret of this name exists in the HelmOp's namespace.
    pub secret_exists: &'a dyn Fn(&str) -> bool,
}

/// Whether [`rejection`], with no foreign Bundle, can find more than the spec rules for `helmop`
/// (the object as admission reads it): only a Policy of its namespace or a `helmSecretName` it
/// names bring in the rules that depend on other objects ([`authorize`]). Read from the borrowed
/// tree, so that a caller with neither skips decoding the whole HelmOp.
pub fn depends_on_objects(helmop: &super::JsonView<'_>, policies: &[Policy]) -> bool {
    !policies.is_empty()
        || super::field_of(helmop, "spec")
            .and_then(|spec| super::field_of(spec, "helmSecretName"))
            .is_some_and(|name| name.as_str() != Some(""))
}

/// The first of Fleet's checks the HelmOp fails, in Fleet's order; `None` when Fleet would
/// produce its Bundle.
pub fn rejection(op: &HelmOp, facts: &FleetFacts<'_>) -> Option<Rejection> {
    let reject = |check, reason| Some(Rejection { check, reason });
    if let Some(reason) = spec_rejection(op) {
        return reject(RejectionCheck::Spec, reason);
    }
    let authorized = match authorize(op, facts.policies) {
        Ok(a) => a,
        Err(reason) => {
            return reject(
                RejectionCheck::Policy,
                format!("a Fleet Policy forbids it: {reason}"),
            );
        }
    };
    if facts.foreign_bundle {
        return reject(
            RejectionCheck::ForeignBundle,
            "a Bundle of this name exists that is not a HelmOp's (Fleet will not replace it)"
                .into(),
        );
    }
    if let Some(name) = authorized.helm_secret_name
        && !(facts.secret_exists)(&name)
    {
        return reject(
            RejectionCheck::HelmSecret,
            format!("helmSecretName Secret {name} does not exist in the HelmOp's namespace"),
        );
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HelmOpPolicy, HelmOpSpec, HelmOptions};

    /// Labels the API server refuses on the Bundle: the spec alone rejects the HelmOp, so the
    /// plugin copies nothing for it, whatever the Policies say.
    #[test]
    fn labels_fleet_cannot_write_on_the_bundle_reject_the_spec() {
        let mut o = op("app", "https://charts.example.com", "");
        assert_eq!(spec_rejection(&o), None);
        o.spec.labels = Some([("tier".to_string(), "a/b".to_string())].into());
        let reason = spec_rejection(&o).unwrap_or_default();
        assert!(reason.starts_with("spec.labels.tier: "), "{reason}");
        o.spec.labels = Some([("tier".to_string(), "web".to_string())].into());
        o.metadata.name = Some("a".repeat(64));
        let reason = spec_rejection(&o).unwrap_or_default();
        assert!(reason.starts_with("metadata.name: "), "{reason}");
        let facts = FleetFacts {
            policies: &[],
            foreign_bundle: false,
            secret_exists: &|_| true,
        };
        assert_eq!(
            rejection(&o, &facts).map(|r| r.check),
            Some(RejectionCheck::Spec)
        );
    }

    fn op(chart: &str, repo: &str, version: &str) -> HelmOp {
        let s = |v: &str| (!v.is_empty()).then(|| v.to_string());
        HelmOp::new(
            "team",
            "app",
            HelmOpSpec {
                helm: Some(HelmOptions {
                    chart: s(chart),
                    repo: s(repo),
                    version: s(version),
                    ..HelmOptions::default()
                }),
                ..HelmOpSpec::default()
            },
        )
    }

    fn ok() -> HelmOp {
        op("web", "https://charts.example.com", "1.2.3")
    }

    fn policy(name: &str, f: impl FnOnce(&mut Policy)) -> Policy {
        let mut p = Policy::new("team", name);
        f(&mut p);
        p
    }

    fn helm_policy(name: &str, f: impl FnOnce(&mut HelmOpPolicy)) -> Policy {
        policy(name, |p| {
            let mut h = HelmOpPolicy::default();
            f(&mut h);
            p.helm_op = Some(h);
        })
    }

    fn v(items: &[&str]) -> Option<Vec<String>> {
        Some(items.iter().map(|s| s.to_string()).collect())
    }

    fn verdict(op: &HelmOp, policies: &[Policy], secrets: &[&str]) -> Option<Rejection> {
        let exists = |name: &str| secrets.contains(&name);
        rejection(
            op,
            &FleetFacts {
                policies,
                foreign_bundle: false,
                secret_exists: &exists,
            },
        )
    }

    #[test]
    fn spec_rules_are_fleets_validate() {
        assert_eq!(spec_rejection(&ok()), None);
        let mut no_helm = ok();
        no_helm.spec.helm = None;
        assert_eq!(
            spec_rejection(&no_helm).as_deref(),
            Some("spec.helm: helm options are empty in the HelmOp's spec")
        );
        assert!(
            spec_rejection(&op("https://x/c.TGZ", "https://r", ""))
                .is_some_and(|r| r.starts_with("spec.helm.repo: "))
        );
        assert!(
            spec_rejection(&op("c", "OCI://r/c", ""))
                .is_some_and(|r| r.starts_with("spec.helm.chart: "))
        );
        assert!(spec_rejection(&op("", "oci://r/c", "")).is_none());
        assert!(
            spec_rejection(&op("web", "https://r", "not a version"))
                .is_some_and(|r| r.starts_with("spec.helm.version: "))
        );
        let r = verdict(&op("", "", ""), &[], &[]).map(|r| r.check);
        assert_eq!(r, Some(RejectionCheck::Spec));
    }

    #[test]
    fn no_policy_restricts_nothing() {
        assert_eq!(verdict(&ok(), &[], &[]), None);
        assert_eq!(
            authorize(&ok(), &[]),
            Ok(Authorized {
                service_account: None,
                helm_secret_name: None
            })
        );
    }

    /// The Bundle controller checks every target's own service account too; the HelmOp
    /// controller's names for unnamed targets (`target%03d`) appear in the reason.
    #[test]
    fn a_targets_service_account_outside_the_policy_refuses_the_bundle() {
        use crate::model::BundleTarget;
        let allow = policy("a", |p| p.allowed_service_accounts = v(&["deployer"]));
        let mut o = ok();
        o.spec.targets = Some(vec![
            BundleTarget {
                cluster_name: Some("one".into()),
                service_account: Some("deployer".into()),
                ..BundleTarget::default()
            },
            BundleTarget {
                cluster_name: Some("two".into()),
                service_account: Some("root".into()),
                ..BundleTarget::default()
            },
        ]);
        let r = verdict(&o, std::slice::from_ref(&allow), &[]);
        assert_eq!(r.as_ref().map(|r| r.check), Some(RejectionCheck::Policy));
        assert_eq!(
            r.map(|r| r.reason).as_deref(),
            Some(
                "a Fleet Policy forbids it: disallowed serviceAccount root in target target001: root not in allowed set [deployer]"
            )
        );
        if let Some(t) = o.spec.targets.as_mut().and_then(|t| t.get_mut(1)) {
            t.name = Some("edge".into());
            t.service_account = Some("deployer".into());
        }
        assert_eq!(verdict(&o, std::slice::from_ref(&allow), &[]), None);
        // Without Policies, nothing is checked.
        if let Some(t) = o.spec.targets.as_mut().and_then(|t| t.get_mut(1)) {
            t.service_account = Some("root".into());
        }
        assert_eq!(verdict(&o, &[], &[]), None);
    }

    #[test]
    fn require_and_allowed_service_accounts() {
        let require = policy("a", |p| p.require_service_account = Some(true));
        assert_eq!(
            authorize(&ok(), std::slice::from_ref(&require)),
            Err(Error::ServiceAccountRequired)
        );
        assert_eq!(
            Error::ServiceAccountRequired.to_string(),
            "serviceAccount is required by Policy but is not set"
        );
        // A default from a Policy (first non-empty in name order) satisfies it.
        let defaults = [
            helm_policy("c", |h| h.default_service_account = Some("late".into())),
            helm_policy("b", |h| h.default_service_account = Some("deployer".into())),
            require.clone(),
        ];
        assert_eq!(
            authorize(&ok(), &defaults).map(|a| a.service_account),
            Ok(Some("deployer".into()))
        );
        let allowed = policy("d", |p| p.allowed_service_accounts = v(&["deployer"]));
        let mut other = ok();
        other.spec.service_account = Some("root".into());
        assert_eq!(
            authorize(&other, std::slice::from_ref(&allowed)).map_err(|e| e.to_string()),
            Err("disallowed serviceAccount root: root not in allowed set [deployer]".into())
        );
        other.spec.service_account = Some("deployer".into());
        assert!(authorize(&other, &[allowed]).is_ok());
    }

    #[test]
    fn helm_secret_names_are_restricted_and_defaulted() {
        let p = helm_policy("p", |h| {
            h.allowed_helm_secret_names = v(&["repo-auth"]);
            h.default_helm_secret_name = Some("repo-auth".into());
        });
        let mut other = ok();
        other.spec.helm_secret_name = Some("stolen".into());
        let r = verdict(&other, std::slice::from_ref(&p), &["stolen"]);
        assert_eq!(r.as_ref().map(|r| r.check), Some(RejectionCheck::Policy));
        assert!(r.is_some_and(|r| r.reason.contains("disallowed helmSecretName stolen")));
        // The default applies, and then must exist.
        let r = verdict(&ok(), std::slice::from_ref(&p), &[]);
        assert_eq!(
            r,
            Some(Rejection {
                check: RejectionCheck::HelmSecret,
                reason: "helmSecretName Secret repo-auth does not exist in the HelmOp's namespace"
                    .into()
            })
        );
        assert_eq!(verdict(&ok(), &[p], &["repo-auth"]), None);
    }

    /// Where `depends_on_objects` says no, `rejection` finds nothing but spec rules, whatever
    /// Secrets exist; where a `helmSecretName` is named it says yes.
    #[test]
    fn without_policies_only_a_named_helm_secret_depends_on_objects() {
        for (spec, depends) in [
            (
                serde_json::json!({"helm": {"chart": "https://x/app.tgz"}}),
                false,
            ),
            (
                serde_json::json!({"helm": {"chart": "https://x/app.tgz"}, "helmSecretName": ""}),
                false,
            ),
            (serde_json::json!({"helmSecretName": ""}), false),
            (
                serde_json::json!({"helm": {"chart": "https://x/app.tgz"}, "helmSecretName": "creds"}),
                true,
            ),
            (
                serde_json::json!({"helm": {"chart": "https://x/app.tgz"}, "helmSecretName": null}),
                true,
            ),
        ] {
            let text = serde_json::json!({"metadata": {"name": "app"}, "spec": spec}).to_string();
            let view: crate::validate::JsonView<'_> = serde_json::from_str(&text).unwrap();
            assert_eq!(depends_on_objects(&view, &[]), depends, "{text}");
            assert!(depends_on_objects(&view, &[policy("p", |_| {})]), "{text}");
            let op: HelmOp = serde_json::from_str(&text).unwrap();
            if !depends {
                assert!(
                    verdict(&op, &[], &[]).is_none_or(|r| r.check == RejectionCheck::Spec),
                    "{text}"
                );
            } else if op.spec.helm_secret_name().is_some() {
                assert_eq!(
                    verdict(&op, &[], &[]).map(|r| r.check),
                    Some(RejectionCheck::HelmSecret),
                    "{text}"
                );
            }
        }
    }

    #[test]
    fn missing_helm_secret_without_policies() {
        let mut o = ok();
        o.spec.helm_secret_name = Some("creds".into());
        assert_eq!(
            verdict(&o, &[], &[]).map(|r| r.check),
            Some(RejectionCheck::HelmSecret)
        );
        assert_eq!(verdict(&o, &[], &["creds"]), None);
        o.spec.helm_secret_name = Some(String::new());
        assert_eq!(verdict(&o, &[], &[]), None, "empty means none");
    }

    #[test]
    fn repo_and_chart_patterns_are_anchored_regexes_or_verbatim() {
        let p = [helm_policy("p", |h| {
            h.allowed_helm_repo_patterns = v(&["https://charts\\.example\\.com(/.*)?"]);
            h.allowed_chart_patterns = v(&["web|api", "a+b"]);
        })];
        assert!(authorize(&ok(), &p).is_ok());
        assert!(authorize(&op("api", "https://charts.example.com/stable", ""), &p).is_ok());
        // Anchored: a prefix or suffix match is not enough.
        assert_eq!(
            authorize(&op("web", "https://evil.example/https://charts.example.com", ""), &p)
                .map_err(|e| e.to_string()),
            Err("disallowed helm repo https://evil.example/https://charts.example.com: https://evil.example/https://charts.example.com not in allowed set [https://charts\\.example\\.com(/.*)?]".into())
        );
        assert!(authorize(&op("webx", "https://charts.example.com", ""), &p).is_err());
        // Verbatim match even where the regex would not match itself.
        assert!(authorize(&op("a+b", "https://charts.example.com", ""), &p).is_ok());
        // An OCI HelmOp has no chart: an empty chart is allowed.
        assert!(authorize(&op("", "https://charts.example.com/oci", ""), &p).is_ok());
        let broken = [helm_policy("p", |h| {
            h.allowed_chart_patterns = v(&["(unclosed"]);
        })];
        assert!(
            authorize(&ok(), &broken)
                .is_err_and(|e| e.to_string().contains("policy failed to compile regex"))
        );
    }

    #[test]
    fn a_rejected_helmop_follows_its_previous_bundle_while_the_bundle_controller_allows_it() {
        use serde_json::json;
        let bundle = |options: serde_json::Value, sa: &str| {
            json!({
                "metadata": {"name": "app", "labels": {"team": "a"}},
                "spec": {
                    "helmOpOptions": options,
                    "serviceAccount": sa,
                    "defaultNamespace": "apps",
                    "downstreamResources": [{"kind": "Secret", "name": "db"}],
                    "targets": [{"name": "target000", "clusterName": "down1"}],
                },
            })
        };
        assert_eq!(after_rejection(None, &[]), AfterRejection::NoBundle);
        // A Bundle that is not a HelmOp's is not this HelmOp's previous Bundle.
        let foreign = bundle(serde_json::Value::Null, "");
        assert_eq!(
            after_rejection(Some(&foreign), &[]),
            AfterRejection::NoBundle
        );
        let ours = bundle(json!({}), "deployer");
        let AfterRejection::Follow(spec) = after_rejection(Some(&ours), &[]) else {
            panic!("not followed");
        };
        assert_eq!(spec.downstream_resources().len(), 1);
        assert_eq!(spec.targets()[0].name.as_deref(), Some("target000"));
        assert_eq!(
            spec.labels
                .as_ref()
                .and_then(|l| l.get("team"))
                .map(String::as_str),
            Some("a")
        );
        // Repo, chart and secret-name rules are not the Bundle controller's: still followed.
        let repos = [helm_policy("p", |h| {
            h.allowed_helm_repo_patterns = v(&["https://internal"]);
        })];
        assert!(matches!(
            after_rejection(Some(&ours), &repos),
            AfterRejection::Follow(_)
        ));
        // A service account outside the Policies refuses the Bundle itself.
        let accounts = [policy("p", |p| p.allowed_service_accounts = v(&["edge"]))];
        assert_eq!(
            after_rejection(Some(&ours), &accounts),
            AfterRejection::Frozen(
                "Fleet's Bundle controller refuses its previous Bundle too: disallowed serviceAccount deployer: deployer not in allowed set [edge]".into()
            )
        );
        let required = [policy("p", |p| p.require_service_account = Some(true))];
        assert!(matches!(
            after_rejection(Some(&bundle(json!({}), "")), &required),
            AfterRejection::Frozen(_)
        ));
    }

    #[test]
    fn policies_for_gitrepos_only_still_count_as_policies() {
        // A Policy with no helmOp section still triggers the top-level checks.
        let p = policy("p", |p| p.allowed_service_accounts = v(&["sa"]));
        assert!(authorize(&ok(), std::slice::from_ref(&p)).is_ok());
        let mut o = ok();
        o.spec.service_account = Some("x".into());
        assert!(authorize(&o, &[p]).is_err());
    }

    #[test]
    fn admission_denies_only_spec_rules() {
        let spec = verdict(&op("", "", ""), &[], &[]).map(|r| r.admission_finding());
        assert!(spec.is_some_and(|f| f.is_deny()));
        let mut o = ok();
        o.spec.helm_secret_name = Some("creds".into());
        let f = verdict(&o, &[], &[]).map(|r| r.admission_finding());
        let f = f.unwrap_or_else(|| panic!("no finding"));
        assert!(!f.is_deny());
        assert_eq!(f.path, "spec.helmSecretName");
        assert!(
            f.message
                .starts_with("helmSecretName Secret creds does not exist")
        );
    }

    #[test]
    fn foreign_bundle_comes_after_policies() {
        let exists = |_: &str| true;
        let facts = FleetFacts {
            policies: &[],
            foreign_bundle: true,
            secret_exists: &exists,
        };
        assert_eq!(
            rejection(&ok(), &facts).map(|r| r.check),
            Some(RejectionCheck::ForeignBundle)
        );
        let p = [policy("p", |p| p.require_service_account = Some(true))];
        let facts = FleetFacts {
            policies: &p,
            ..facts
        };
        assert_eq!(
            rejection(&ok(), &facts).map(|r| r.check),
            Some(RejectionCheck::Policy)
        );
    }
}
