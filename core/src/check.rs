//! `kubectl helmop check`'s verdicts: from facts the plugin collected about an install (which
//! webhook configurations exist, how a dry run was answered, the serving certificate, the hash
//! key, opt-ins, the user's rights, the Leases) to findings that are ok, a warning or a problem,
//! each problem with the one-line fix. No I/O and no clock: the caller passes `now`.

use std::fmt;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

/// How one finding reads. Ordered: the worst of a report is its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Warning,
    Problem,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warning => "warning",
            Verdict::Problem => "problem",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a finding is about; the JSON's `check` field, stable for scripts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Check {
    WebhookConfiguration,
    WebhookAnswer,
    ServingCertificate,
    HashKey,
    OptIn,
    Access,
    Lease,
    AdmissionPort,
    RolloutHolds,
}

impl Check {
    pub fn as_str(self) -> &'static str {
        match self {
            Check::WebhookConfiguration => "webhook-configuration",
            Check::WebhookAnswer => "webhook-answer",
            Check::ServingCertificate => "serving-certificate",
            Check::HashKey => "hash-key",
            Check::OptIn => "opt-in",
            Check::Access => "access",
            Check::Lease => "lease",
            Check::AdmissionPort => "admission-port",
            Check::RolloutHolds => "rollout-holds",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One line of the report. `fix` is set for every problem (and for warnings that have one).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub check: Check,
    /// What was looked at, e.g. `validating/helmop-webhook` or `lease/kubectl-helmop-rollout`.
    pub subject: String,
    pub verdict: Verdict,
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fix: Option<String>,
}

impl Finding {
    fn new(check: Check, subject: impl Into<String>, verdict: Verdict, message: String) -> Self {
        Finding {
            check,
            subject: subject.into(),
            verdict,
            message,
            fix: None,
        }
    }

    fn fix(mut self, fix: impl Into<String>) -> Self {
        self.fix = Some(fix.into());
        self
    }
}

/// How many findings of each verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Summary {
    pub ok: usize,
    pub warning: usize,
    pub problem: usize,
}

/// The whole report: `-o json` prints it as is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The worst verdict of all findings (`ok` when there are none).
    pub result: Verdict,
    pub summary: Summary,
    /// The namespace the dry runs used, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    pub findings: Vec<Finding>,
}

impl Report {
    pub fn new(namespace: Option<String>, findings: Vec<Finding>) -> Report {
        let mut summary = Summary::default();
        for f in &findings {
            match f.verdict {
                Verdict::Ok => summary.ok += 1,
                Verdict::Warning => summary.warning += 1,
                Verdict::Problem => summary.problem += 1,
            }
        }
        let result = findings
            .iter()
            .map(|f| f.verdict)
            .max()
            .unwrap_or(Verdict::Ok);
        Report {
            result,
            summary,
            namespace,
            findings,
        }
    }
}

/// What to re-apply when something the install creates is missing.
const REAPPLY: &str = "re-apply the install file: kubectl apply -f deploy/<flavour>.yaml (stamping-only on downstream clusters)";
/// Re-runs the self-signed bootstrap, which runs in every new webhook pod (the cert-manager flavour
/// renews by itself).
const REBOOTSTRAP: &str = "kubectl -n helmop-system rollout restart deployment helmop-webhook (self-signed: its bootstrap initContainer renews the certificate and fills caBundle), or check cert-manager's Certificate helmop-system/helmop-webhook";

/// Which of the two webhook configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConfigKind {
    Validating,
    Mutating,
}

impl ConfigKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ConfigKind::Validating => "validating",
            ConfigKind::Mutating => "mutating",
        }
    }

    fn kubectl(self) -> &'static str {
        match self {
            ConfigKind::Validating => "validatingwebhookconfiguration",
            ConfigKind::Mutating => "mutatingwebhookconfiguration",
        }
    }
}

/// One webhook of a configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebhookFact {
    pub name: String,
    /// Whether `clientConfig.caBundle` holds anything.
    pub ca_bundle: bool,
}

/// A webhook configuration as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigFact {
    Absent,
    /// Could not be read (the reason, e.g. forbidden).
    Unreadable(String),
    Present(Vec<WebhookFact>),
}

/// Whether both configurations are there, and what their absence or emptiness means.
pub fn webhook_configurations(
    name: &str,
    validating: &ConfigFact,
    mutating: &ConfigFact,
) -> Vec<Finding> {
    use ConfigFact::*;
    let subject = |kind: ConfigKind| format!("{}/{name}", kind.as_str());
    if matches!((validating, mutating), (Absent, Absent)) {
        return vec![
            Finding::new(
                Check::WebhookConfiguration,
                name,
                Verdict::Problem,
                "neither webhook configuration exists: helmop's webhook is not installed here"
                    .into(),
            )
            .fix("kubectl apply -f deploy/self-signed.yaml (upstream) or deploy/stamping-only.yaml (downstream)"),
        ];
    }
    let mut out = Vec::new();
    let stamping = matches!(mutating, Present(_));
    for (kind, fact) in [
        (ConfigKind::Validating, validating),
        (ConfigKind::Mutating, mutating),
    ] {
        let finding = match (kind, fact) {
            (_, Unreadable(reason)) => Finding::new(
                Check::WebhookConfiguration,
                subject(kind),
                Verdict::Warning,
                format!("cannot read it: {reason}"),
            )
            .fix(format!("needs get on {}s", kind.kubectl())),
            (ConfigKind::Validating, Absent) => Finding::new(
                Check::WebhookConfiguration,
                subject(kind),
                Verdict::Warning,
                "absent: HelmOps are not validated and the delete guard is off (as meant on a downstream cluster; on the upstream it was removed)".into(),
            )
            .fix(REAPPLY),
            (ConfigKind::Mutating, Absent) => Finding::new(
                Check::WebhookConfiguration,
                subject(kind),
                Verdict::Problem,
                "absent: workloads are not stamped, so pods do not roll when what they read changes".into(),
            )
            .fix(REAPPLY),
            (ConfigKind::Validating, Present(hooks)) if hooks.is_empty() => Finding::new(
                Check::WebhookConfiguration,
                subject(kind),
                Verdict::Ok,
                if stamping {
                    "no webhooks: a stamping-only install (no HelmOp validation, no delete guard; meant for downstream clusters)".into()
                } else {
                    "no webhooks".into()
                },
            ),
            (_, Present(hooks)) if hooks.is_empty() => Finding::new(
                Check::WebhookConfiguration,
                subject(kind),
                Verdict::Problem,
                "no webhooks: workloads are not stamped".into(),
            )
            .fix(REAPPLY),
            (_, Present(hooks)) => {
                let without: Vec<&str> = hooks
                    .iter()
                    .filter(|h| !h.ca_bundle)
                    .map(|h| h.name.as_str())
                    .collect();
                let names: Vec<&str> = hooks.iter().map(|h| h.name.as_str()).collect();
                if without.is_empty() {
                    Finding::new(
                        Check::WebhookConfiguration,
                        subject(kind),
                        Verdict::Ok,
                        format!("{}: {}", plural(hooks.len(), "webhook"), names.join(", ")),
                    )
                } else {
                    Finding::new(
                        Check::WebhookConfiguration,
                        subject(kind),
                        Verdict::Problem,
                        format!(
                            "no caBundle in {}: the API server cannot trust the webhook (the bootstrap initContainer or cert-manager's cainjector has not filled it)",
                            without.join(", ")
                        ),
                    )
                    .fix(REBOOTSTRAP)
                }
            }
        };
        out.push(finding);
    }
    out
}

/// How the dry-run create of an invalid HelmOp was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ValidatingProbe {
    /// The configuration has no webhook for HelmOps (stamping-only, or absent): nothing to ask.
    NoWebhook,
    /// The API server does not serve HelmOps.
    CrdAbsent,
    /// Denied by one of helmop's webhooks with helmop's message.
    Denied { webhook: String },
    /// Denied, but not in helmop's words (another webhook or admission plugin).
    DeniedByOther { message: String },
    /// The API server could not call the webhook (TLS, no endpoints, timeout).
    CallFailed { message: String },
    /// The invalid HelmOp would have been stored.
    Admitted,
    /// The request failed for another reason.
    Error { message: String },
}

/// The verdict on the validating webhook's answer through the API server.
pub fn validating_answer(name: &str, namespace: &str, probe: &ValidatingProbe) -> Finding {
    let subject = format!("validating/{name}");
    let f =
        |verdict, message: String| Finding::new(Check::WebhookAnswer, &subject, verdict, message);
    match probe {
        ValidatingProbe::NoWebhook => f(
            Verdict::Ok,
            "no HelmOp webhook to ask (stamping-only or not installed)".into(),
        ),
        ValidatingProbe::CrdAbsent => f(
            Verdict::Ok,
            "skipped: the cluster does not serve HelmOps (fleet.cattle.io/v1alpha1), so there is nothing to validate".into(),
        ),
        ValidatingProbe::Denied { webhook } => f(
            Verdict::Ok,
            format!("{webhook} denied an invalid HelmOp (dry run in {namespace})"),
        ),
        ValidatingProbe::DeniedByOther { message } => f(
            Verdict::Warning,
            format!("an invalid HelmOp (dry run in {namespace}) was denied, but not by helmop: {message}"),
        )
        .fix(format!("run again with -n NAMESPACE naming a namespace where HelmOps live (not {namespace})")),
        ValidatingProbe::CallFailed { message } => f(
            Verdict::Problem,
            format!("the API server cannot call the webhook: {message}"),
        )
        .fix("kubectl -n helmop-system get pods,endpoints helmop-webhook; a TLS error means caBundle and certificate disagree (see serving-certificate)"),
        ValidatingProbe::Admitted => f(
            Verdict::Problem,
            format!("an invalid HelmOp was admitted (dry run in {namespace}, nothing stored): the webhook did not see it"),
        )
        .fix(format!(
            "check that the webhook's namespaceSelector covers {namespace} and its failurePolicy is Fail: kubectl get validatingwebhookconfiguration {name} -o yaml"
        )),
        ValidatingProbe::Error { message } => f(
            Verdict::Warning,
            format!("could not ask: {message}"),
        )
        .fix("needs create on fleet.cattle.io helmops in the namespace (dry run only)"),
    }
}

/// How the dry-run create of an opted-in Deployment was answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MutatingProbe {
    /// No `--namespace` given: nothing was sent.
    NoNamespace,
    /// The mutating configuration is absent or empty.
    NoWebhook,
    /// The Deployment came back with a config-hash stamp.
    Stamped { stamp: String },
    /// The Deployment came back without one (the webhook was not called, failed open, or had no key).
    NotStamped,
    /// The request failed.
    Error { message: String },
}

/// The verdict on the mutating webhook's answer through the API server.
pub fn mutating_answer(name: &str, namespace: Option<&str>, probe: &MutatingProbe) -> Finding {
    let subject = format!("mutating/{name}");
    let ns = namespace.unwrap_or("-");
    let f =
        |verdict, message: String| Finding::new(Check::WebhookAnswer, &subject, verdict, message);
    match probe {
        MutatingProbe::NoNamespace => f(
            Verdict::Ok,
            "skipped: pass -n NAMESPACE to dry-run an opted-in Deployment there (nothing is stored)".into(),
        ),
        MutatingProbe::NoWebhook => f(Verdict::Ok, "no stamping webhook to ask".into()),
        MutatingProbe::Stamped { stamp } => {
            let short: String = stamp.chars().take(18).collect();
            f(
                Verdict::Ok,
                format!("an opted-in Deployment (dry run in {ns}) came back stamped ({short}…)"),
            )
        }
        MutatingProbe::NotStamped => f(
            Verdict::Problem,
            format!("an opted-in Deployment (dry run in {ns}) came back unstamped: the webhook was not reached, failed open, or has no hash key"),
        )
        .fix("see the serving-certificate and hash-key findings, then kubectl -n helmop-system logs deploy/helmop-webhook"),
        MutatingProbe::Error { message } => f(
            Verdict::Warning,
            format!("could not ask (dry run in {ns}): {message}"),
        )
        .fix("needs create on apps deployments in the namespace (dry run only)"),
    }
}

/// The serving certificate of one webhook as checked against its configuration's caBundle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CertFact {
    /// The certificate was obtained (from `source`) and parsed.
    Checked {
        /// Where it came from: `Secret helmop-system/helmop-webhook-tls` or `https://HOST:PORT`.
        source: String,
        /// The name the API server verifies it for.
        server_name: String,
        /// Unix seconds.
        not_after: i64,
        /// Whether the caBundle verifies the chain for `server_name` (checked at a moment the
        /// certificate is valid, so an expiry is reported as such, not as a trust failure).
        chain: Result<(), String>,
    },
    /// The certificate could not be obtained.
    Unavailable { source: String, reason: String },
}

/// Certificates expiring within this many days are a warning.
pub const CERT_WARN_DAYS: i64 = 30;

/// The verdict on one serving certificate.
pub fn serving_certificate(subject: &str, fact: &CertFact, now: i64) -> Finding {
    let f = |verdict, message: String| {
        Finding::new(Check::ServingCertificate, subject, verdict, message)
    };
    match fact {
        CertFact::Unavailable { source, reason } => f(
            Verdict::Warning,
            format!("not verified: cannot read the serving certificate from {source}: {reason}"),
        )
        .fix("needs get on the webhook's TLS Secret in helmop-system (or run check where the webhook's URL is reachable)"),
        CertFact::Checked {
            source,
            server_name,
            not_after,
            chain,
        } => {
            let date = date(*not_after);
            if let Err(reason) = chain {
                return f(
                    Verdict::Problem,
                    format!("the caBundle does not verify the certificate from {source} for {server_name}: {reason}"),
                )
                .fix(REBOOTSTRAP);
            }
            let left = not_after - now;
            if left <= 0 {
                f(
                    Verdict::Problem,
                    format!("the certificate from {source} expired at {date}"),
                )
                .fix(REBOOTSTRAP)
            } else if left < CERT_WARN_DAYS * 86_400 {
                f(
                    Verdict::Warning,
                    format!(
                        "verified for {server_name}, but expires at {date} (in {})",
                        span(left)
                    ),
                )
                .fix(REBOOTSTRAP)
            } else {
                f(
                    Verdict::Ok,
                    format!(
                        "verified for {server_name} ({source}), expires {date} (in {})",
                        span(left)
                    ),
                )
            }
        }
    }
}

/// Whether a Secret exists (metadata only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Presence {
    Present,
    Absent,
    Unreadable(String),
}

/// The verdict on the hash-key Secret (`namespace/name`).
pub fn hash_key(secret: &str, fact: &Presence) -> Finding {
    let subject = format!("secret/{secret}");
    match fact {
        Presence::Present => Finding::new(Check::HashKey, subject, Verdict::Ok, "present".into()),
        Presence::Absent => Finding::new(
            Check::HashKey,
            subject,
            Verdict::Problem,
            "missing: the webhook cannot stamp (it admits workloads unstamped) and copies cannot be hashed".into(),
        )
        .fix("kubectl -n helmop-system rollout restart deployment helmop-webhook (its hash-key initContainer makes a new key); on the upstream, restore the old key instead if copies exist (docs/copy-lifecycle.md)"),
        Presence::Unreadable(reason) => Finding::new(
            Check::HashKey,
            subject,
            Verdict::Warning,
            format!("cannot tell whether it exists: {reason}"),
        )
        .fix("needs get on secrets in its namespace (metadata only is read)"),
    }
}

/// At most this many names are listed in one finding; the rest are counted.
pub const MAX_LISTED: usize = 5;

/// Who is opted in to stamping: `namespace` names and `namespace/kind/name` workloads (sorted,
/// complete; the finding lists only the first [`MAX_LISTED`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptIn {
    pub namespaces: Result<Vec<String>, String>,
    pub workloads: Result<Vec<String>, String>,
}

/// The opt-in findings: namespaces, then workloads.
pub fn opt_in(label: &str, facts: &OptIn) -> Vec<Finding> {
    let nothing = matches!((&facts.namespaces, &facts.workloads), (Ok(n), Ok(w)) if n.is_empty() && w.is_empty());
    let one = |subject: &str, what: &str, list: &Result<Vec<String>, String>| match list {
        Err(reason) => Finding::new(
            Check::OptIn,
            subject,
            Verdict::Warning,
            format!("cannot list them: {reason}"),
        )
        .fix(format!("needs list on {what}")),
        // Said once, on the namespaces, with the fix; the workloads just say none.
        Ok(_) if nothing && subject == "workloads" => {
            Finding::new(Check::OptIn, subject, Verdict::Warning, "none".into())
        }
        Ok(_) if nothing => Finding::new(
            Check::OptIn,
            subject,
            Verdict::Warning,
            format!("none: nothing is stamped until a namespace or workload carries {label}"),
        )
        .fix(format!("kubectl label ns NAME {label}=enabled")),
        Ok(items) => Finding::new(Check::OptIn, subject, Verdict::Ok, listed(items)),
    };
    vec![
        one("namespaces", "namespaces", &facts.namespaces),
        one(
            "workloads",
            "deployments, statefulsets, daemonsets and cronjobs",
            &facts.workloads,
        ),
    ]
}

/// A workload the rollout watcher holds back, from its latest Warning Event about it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HoldFact {
    /// `namespace/kind/name`.
    pub workload: String,
    /// The Event's reason (`RestampHeld`, `RestampBreakerOpen`, ...).
    pub reason: String,
    pub note: String,
}

/// What the rollout watcher holds back on one workload, as `status` shows it on the workload's
/// rows (field `hold`): the reason and note of its newest Event among [`HOLD_REASONS`] and
/// `Restamped`, when that is a hold.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Hold {
    /// The Event's reason (`RestampHeld`, `RestampBreakerOpen`, ...).
    pub reason: String,
    pub note: String,
}

impl Hold {
    /// The short name of the hold ([`hold_label`]).
    pub fn label(&self) -> &str {
        hold_label(&self.reason)
    }
}

/// The short name of a hold's Event reason, as the rollout watcher's `held` events and
/// `helmop_rollout_held{reason}` call it (`stalled` for `RolloutStalled`); another reason is its
/// own name.
pub fn hold_label(reason: &str) -> &str {
    if reason == "RolloutStalled" {
        return "stalled";
    }
    HOLD_LABELS
        .iter()
        .find(|(_, r)| *r == reason)
        .map_or(reason, |(label, _)| label)
}

/// The rollout watcher's holds: the short name (the `held` event's `hold`, the label of
/// `helmop_rollout_held{reason}`) and the reason of the Warning Event it publishes.
pub const HOLD_LABELS: [(&str, &str); 5] = [
    ("missing", "RestampHeld"),
    ("breaker", "RestampBreakerOpen"),
    ("gave-up", "RestampIneffective"),
    ("rollout-busy", "RestampDeferred"),
    ("unwatched", "RestampUnwatched"),
];

/// The Event reasons of the rollout watcher's holds and stalled rollouts (see docs/propagator.md,
/// "Brakes"), with what to do about each.
pub const HOLD_REASONS: [(&str, &str); 6] = [
    ("RestampHeld", "create the missing Secret, ConfigMap or key"),
    (
        "RestampBreakerOpen",
        "find what keeps writing the source, or `kubectl helmop rollout --resume secret/NAME -n NS`",
    ),
    (
        "RestampIneffective",
        "is helmop-webhook installed and stamping it? see the webhook-answer check",
    ),
    (
        "RestampDeferred",
        "promote, retry or abort the Argo Rollout",
    ),
    (
        "RestampUnwatched",
        "read fewer Secrets, ConfigMaps or keys by name",
    ),
    (
        "RolloutStalled",
        "`kubectl rollout status` and the workload's Events",
    ),
];

/// What the rollout watcher holds back (its Warning Events of the last hour; Events expire): one
/// warning naming the workloads and the first one's fix, or ok.
pub fn rollout_holds(facts: &Result<Vec<HoldFact>, String>) -> Finding {
    let subject = "workloads";
    match facts {
        Err(reason) => Finding::new(
            Check::RolloutHolds,
            subject,
            Verdict::Warning,
            format!("cannot list the rollout watcher's Events: {reason}"),
        )
        .fix("needs list on events"),
        Ok(holds) if holds.is_empty() => Finding::new(
            Check::RolloutHolds,
            subject,
            Verdict::Ok,
            "none held back by the rollout watcher".into(),
        ),
        Ok(holds) => {
            let items: Vec<String> = holds
                .iter()
                .map(|h| format!("{} ({})", h.workload, h.reason))
                .collect();
            let first = &holds[0];
            let fix = HOLD_REASONS
                .iter()
                .find(|(r, _)| *r == first.reason)
                .map_or("the workload's Events", |(_, fix)| *fix);
            Finding::new(
                Check::RolloutHolds,
                subject,
                Verdict::Warning,
                format!("held back: {}; {}", listed(&items), first.note),
            )
            .fix(format!("{}: {fix}", first.workload))
        }
    }
}

fn listed(items: &[String]) -> String {
    if items.is_empty() {
        return "0".into();
    }
    let shown: Vec<&str> = items.iter().take(MAX_LISTED).map(String::as_str).collect();
    let more = items.len().saturating_sub(MAX_LISTED);
    let mut s = format!("{}: {}", items.len(), shown.join(", "));
    if more > 0 {
        s.push_str(&format!(" (+{more} more)"));
    }
    s
}

/// The answer to one SelfSubjectAccessReview.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AccessFact {
    pub command: &'static str,
    /// `list fleet.cattle.io/helmops`.
    pub right: String,
    /// `Ok(allowed)`, or why the review failed.
    pub allowed: Result<bool, String>,
}

/// One finding per command: whether the current user has every right it needs. A missing right
/// is a warning: the user may not be meant to run that command.
pub fn access(scope: &str, facts: &[AccessFact]) -> Vec<Finding> {
    let mut commands: Vec<&'static str> = facts.iter().map(|f| f.command).collect();
    commands.dedup();
    commands
        .into_iter()
        .map(|command| {
            let mine: Vec<&AccessFact> = facts.iter().filter(|f| f.command == command).collect();
            let denied: Vec<&str> = mine
                .iter()
                .filter(|f| f.allowed == Ok(false))
                .map(|f| f.right.as_str())
                .collect();
            let failed: Vec<String> = mine
                .iter()
                .filter_map(|f| f.allowed.as_ref().err().map(|e| format!("{}: {e}", f.right)))
                .collect();
            let subject = format!("{command} ({scope})");
            if let Some(first) = failed.first() {
                Finding::new(
                    Check::Access,
                    subject,
                    Verdict::Warning,
                    format!("cannot ask the API server: {first}"),
                )
                .fix("needs create on authorization.k8s.io selfsubjectaccessreviews")
            } else if denied.is_empty() {
                Finding::new(
                    Check::Access,
                    subject,
                    Verdict::Ok,
                    format!("allowed ({})", plural(mine.len(), "right")),
                )
            } else {
                Finding::new(
                    Check::Access,
                    subject,
                    Verdict::Warning,
                    format!("not allowed: {}", denied.join(", ")),
                )
                .fix(format!("ask for a Role granting what {command} needs (manifests/propagator/rbac.yaml and manifests/rollout-watcher/rbac.yaml list it)"))
            }
        })
        .collect()
}

/// Which watcher a Lease elects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseRole {
    /// `propagate -A --watch` (optional, upstream only).
    Propagator,
    /// `rollout -A --watch` (installed with the webhook).
    RolloutWatcher,
}

/// A Lease as read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseFact {
    Absent,
    Unreadable(String),
    Present {
        holder: Option<String>,
        /// `renewTime` (else `acquireTime`), unix seconds.
        renewed: Option<i64>,
        /// `leaseDurationSeconds`.
        duration: Option<i64>,
    },
}

/// Slack for clock skew between this machine and the holder's before a Lease counts as stale.
pub const LEASE_SKEW_SECONDS: i64 = 10;

/// The verdict on one Lease (`namespace/name`).
pub fn lease(role: LeaseRole, lease: &str, fact: &LeaseFact, now: i64) -> Finding {
    let subject = format!("lease/{lease}");
    let (what, pods) = match role {
        LeaseRole::Propagator => ("the propagator", "helmop-propagator"),
        LeaseRole::RolloutWatcher => ("the rollout watcher", "helmop-rollout-watcher"),
    };
    let look = format!(
        "kubectl -n helmop-system get pods -l app.kubernetes.io/name={pods}, then its logs"
    );
    let f = |verdict, message: String| Finding::new(Check::Lease, &subject, verdict, message);
    match fact {
        LeaseFact::Absent => match role {
            LeaseRole::Propagator => f(
                Verdict::Ok,
                "absent: no in-cluster propagator here (optional, upstream only)".into(),
            ),
            LeaseRole::RolloutWatcher => f(
                Verdict::Warning,
                "absent: no rollout watcher, so pods roll only when propagate or rollout restamps them".into(),
            )
            .fix("kubectl apply -f deploy/rollout-watcher.yaml"),
        },
        LeaseFact::Unreadable(reason) => f(
            Verdict::Warning,
            format!("cannot read it: {reason}"),
        )
        .fix("needs get on coordination.k8s.io leases in helmop-system"),
        LeaseFact::Present { holder, renewed, duration } => {
            let Some(holder) = holder.as_deref().filter(|h| !h.is_empty()) else {
                return f(
                    Verdict::Warning,
                    format!("released: {what} has no leader right now (replicas stopping or starting)"),
                )
                .fix(look);
            };
            let Some(renewed) = renewed else {
                return f(
                    Verdict::Warning,
                    format!("held by {holder}, never renewed"),
                )
                .fix(look);
            };
            let age = now - renewed;
            let limit = duration.unwrap_or(15) + LEASE_SKEW_SECONDS;
            if age > limit {
                f(
                    Verdict::Problem,
                    format!(
                        "stale: held by {holder}, not renewed for {} (lease {}s): {what} is gone or cannot reach the API server",
                        span(age),
                        duration.unwrap_or(15)
                    ),
                )
                .fix(look)
            } else {
                f(
                    Verdict::Ok,
                    format!("held by {holder}, renewed {} ago", span(age.max(0))),
                )
            }
        }
    }
}

fn plural(n: usize, what: &str) -> String {
    if n == 1 {
        format!("1 {what}")
    } else {
        format!("{n} {what}s")
    }
}

/// `2027-03-01T00:00:00Z`; the raw number when out of range.
fn date(unix: i64) -> String {
    Timestamp::from_second(unix)
        .map(|t| t.to_string())
        .unwrap_or_else(|_| unix.to_string())
}

/// A span in its largest whole unit: `45s`, `12m`, `5h`, `87d`.
fn span(seconds: i64) -> String {
    match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    }
}

/// Who besides the API server can reach the webhook's admission port, as far as the cluster says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PortFact {
    /// The webhook's pods could not be read (or none run): nothing to judge.
    Unknown(String),
    Known {
        /// Every webhook pod runs with `--client-ca`: only certified clients complete a handshake.
        client_auth: bool,
        /// Names of the NetworkPolicies selecting the webhook's pods for ingress; empty: none, so every
        /// pod may connect.
        policies: Vec<String>,
        /// What those policies let in on the admission port.
        admits: PortAdmits,
        /// The API server's own addresses (the `default/kubernetes` Endpoints); empty when unreadable.
        /// Where it calls webhooks directly, these are what a NetworkPolicy admitting the control plane
        /// alone names.
        apiserver: Vec<String>,
    },
}

/// What the NetworkPolicies selecting the webhook's pods admit on its admission port.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortAdmits {
    /// A rule admitting every source (no `from`), by policy name.
    pub everyone: Vec<String>,
    /// Rules admitting pods by `podSelector`/`namespaceSelector` (policy name).
    pub selected_pods: Vec<String>,
    /// Pod ranges of nodes (`node (cidr)`) inside an `ipBlock` and outside its `except`.
    pub pod_ranges: Vec<String>,
    /// The nodes' pod ranges (`spec.podCIDRs`); `None` when the nodes cannot be read or none has one
    /// (a CNI that assigns addresses itself), so whether pods are kept off is not known.
    pub known_ranges: Option<usize>,
}

/// The verdict on who may call the admission port (`subject`: the webhook's Service).
pub fn admission_port(subject: &str, fact: &PortFact) -> Finding {
    let subject = format!("service/{subject}");
    let f =
        |verdict, message: String| Finding::new(Check::AdmissionPort, &subject, verdict, message);
    const SAFETY: &str = "see \"Only the API server may call it\" in docs/webhook-safety.md: the client-auth overlay where the API server can present a certificate, else the network-policy component with your pod CIDR";
    let (client_auth, policies, admits, apiserver) = match fact {
        PortFact::Unknown(why) => {
            return f(
                Verdict::Warning,
                format!("cannot tell who may call it: {why}"),
            )
            .fix(
                "needs list on pods and networkpolicies in the webhook's namespace, and on nodes",
            );
        }
        PortFact::Known {
            client_auth,
            policies,
            admits,
            apiserver,
        } => (*client_auth, policies, admits, apiserver),
    };
    // As far as the cluster lets it be known: the addresses the API server advertises. A control plane
    // calling through a tunnel (konnectivity) arrives from its agents' pods instead, hence "directly".
    let control_plane_only = if apiserver.is_empty() {
        String::new()
    } else {
        let blocks: Vec<String> = apiserver
            .iter()
            .map(|ip| {
                let bits = if ip.contains(':') { 128 } else { 32 };
                format!("{ip}/{bits}")
            })
            .collect();
        format!(
            "; where the API server calls webhooks directly (no konnectivity tunnel), an ipBlock of only {} (its addresses: kubectl get endpoints kubernetes -n default) admits the control plane alone",
            blocks.join(", ")
        )
    };
    if client_auth {
        return f(
            Verdict::Ok,
            "only clients with a certificate of the webhook's CA (the API server) get an answer (--client-ca)".into(),
        );
    }
    if policies.is_empty() {
        return f(
            Verdict::Warning,
            "no client certificate is required and no NetworkPolicy selects the webhook's pods: any pod can post a review and learn which Secrets exist in any namespace".into(),
        )
        .fix(format!("{SAFETY}{control_plane_only}"));
    }
    let names = policies.join(", ");
    if let Some(open) = admits.everyone.first() {
        return f(
            Verdict::Problem,
            format!("NetworkPolicy {open} admits every source on the admission port, so it keeps no pod off"),
        )
        .fix(format!("give the rule of {open} for the admission port an ipBlock that excepts the pod ranges ({SAFETY}){control_plane_only}"));
    }
    if !admits.pod_ranges.is_empty() {
        return f(
            Verdict::Problem,
            format!(
                "NetworkPolicy {names} admits pods on the admission port: the pod ranges of {} are inside its ipBlock and outside its except list",
                admits.pod_ranges.join(", ")
            ),
        )
        .fix(format!("add the cluster's pod CIDR (kubectl get nodes -o jsonpath='{{.items[*].spec.podCIDRs}}') to the ipBlock's except list{control_plane_only}"));
    }
    if !admits.selected_pods.is_empty() {
        return f(
            Verdict::Warning,
            format!(
                "NetworkPolicy {} admits pods chosen by selectors on the admission port: make sure only the control plane's own agents (konnectivity) match",
                admits.selected_pods.join(", ")
            ),
        );
    }
    match admits.known_ranges {
        None => f(
            Verdict::Warning,
            format!("NetworkPolicy {names} admits the admission port from ipBlocks, but the nodes name no pod ranges (spec.podCIDRs), so whether pods are kept off is not known"),
        )
        .fix("compare the ipBlock's except list with your CNI's pod CIDR"),
        Some(n) => f(
            Verdict::Ok,
            format!("NetworkPolicy {names} keeps the pod ranges of all {} off the admission port", plural(n, "node")),
        ),
    }
}

#[cfg(test)]
mod tests;
