//! `KIND/NAME` as kubectl spells workloads (`deployment/web`, `deploy/web`, `sts/db`,
//! `deployment.apps/web`), for `rollout` and its shell completion.

use helmop_core::workload::WorkloadKind;

/// The kinds `rollout` accepts: every workload with a pod template that rolls when the template
/// changes. A bare Pod cannot roll, so it is not one of them.
pub fn rollout_kinds() -> impl Iterator<Item = WorkloadKind> {
    WorkloadKind::ALL
        .into_iter()
        .filter(|k| *k != WorkloadKind::Pod)
}

/// A parsed `KIND/NAME`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkloadRef {
    pub kind: WorkloadKind,
    pub name: String,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum WorkloadRefError {
    #[error("expected KIND/NAME (e.g. deployment/web), got {0:?}")]
    Shape(String),
    #[error("unknown workload kind {0:?}: use one of {kinds}", kinds = kind_list())]
    Kind(String),
    #[error("{0:?} is not a valid object name (lowercase letters, digits, '-' and '.')")]
    Name(String),
}

fn kind_list() -> String {
    rollout_kinds()
        .map(canonical)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The lowercase singular name kubectl prints (`deployment`).
pub fn canonical(kind: WorkloadKind) -> &'static str {
    match kind {
        WorkloadKind::Deployment => "deployment",
        WorkloadKind::StatefulSet => "statefulset",
        WorkloadKind::DaemonSet => "daemonset",
        WorkloadKind::ReplicaSet => "replicaset",
        WorkloadKind::Job => "job",
        WorkloadKind::CronJob => "cronjob",
        WorkloadKind::Rollout => "rollout",
        WorkloadKind::Pod => "pod",
    }
}

/// Singular, plural and short names, case-insensitive, with an optional `.group` suffix.
pub fn parse_kind(text: &str) -> Option<WorkloadKind> {
    let lower = text.to_ascii_lowercase();
    let (name, group) = match lower.split_once('.') {
        Some((n, g)) => (n, Some(g)),
        None => (lower.as_str(), None),
    };
    let kind = rollout_kinds().find(|k| {
        let short: &[&str] = match k {
            WorkloadKind::Deployment => &["deploy"],
            WorkloadKind::StatefulSet => &["sts"],
            WorkloadKind::DaemonSet => &["ds"],
            WorkloadKind::ReplicaSet => &["rs"],
            WorkloadKind::CronJob => &["cj"],
            WorkloadKind::Rollout => &["ro"],
            WorkloadKind::Job | WorkloadKind::Pod => &[],
        };
        name == canonical(*k) || name == k.plural() || short.contains(&name)
    })?;
    match group {
        None => Some(kind),
        Some(g) if g == kind.group() => Some(kind),
        Some(_) => None,
    }
}

/// Parses `KIND/NAME`.
pub fn parse(text: &str) -> Result<WorkloadRef, WorkloadRefError> {
    let Some((kind, name)) = text.split_once('/') else {
        return Err(WorkloadRefError::Shape(text.to_owned()));
    };
    if kind.is_empty() || name.is_empty() {
        return Err(WorkloadRefError::Shape(text.to_owned()));
    }
    let kind = parse_kind(kind).ok_or_else(|| WorkloadRefError::Kind(kind.to_owned()))?;
    if !helmop_core::name_rules::is_dns1123_subdomain(name) {
        return Err(WorkloadRefError::Name(name.to_owned()));
    }
    Ok(WorkloadRef {
        kind,
        name: name.to_owned(),
    })
}

impl std::fmt::Display for WorkloadRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", canonical(self.kind), self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectl_spellings() {
        let table = [
            ("deployment/web", WorkloadKind::Deployment),
            ("deployments/web", WorkloadKind::Deployment),
            ("deploy/web", WorkloadKind::Deployment),
            ("Deployment/web", WorkloadKind::Deployment),
            ("deployment.apps/web", WorkloadKind::Deployment),
            ("sts/web", WorkloadKind::StatefulSet),
            ("ds/web", WorkloadKind::DaemonSet),
            ("rs/web", WorkloadKind::ReplicaSet),
            ("job/web", WorkloadKind::Job),
            ("jobs.batch/web", WorkloadKind::Job),
            ("cj/web", WorkloadKind::CronJob),
            ("rollout.argoproj.io/web", WorkloadKind::Rollout),
        ];
        for (text, kind) in table {
            let r = parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(r.kind, kind, "{text}");
            assert_eq!(r.name, "web");
        }
        assert_eq!(parse("deploy/web").unwrap().to_string(), "deployment/web");
    }

    #[test]
    fn rejects_what_cannot_roll_or_parse() {
        assert!(matches!(parse("web"), Err(WorkloadRefError::Shape(_))));
        assert!(matches!(
            parse("deployment/"),
            Err(WorkloadRefError::Shape(_))
        ));
        assert!(matches!(parse("/web"), Err(WorkloadRefError::Shape(_))));
        assert!(matches!(parse("pod/web"), Err(WorkloadRefError::Kind(_))));
        assert!(matches!(
            parse("deployment.batch/web"),
            Err(WorkloadRefError::Kind(_))
        ));
        assert!(matches!(
            parse("secret/web"),
            Err(WorkloadRefError::Kind(_))
        ));
        assert!(matches!(
            parse("deployment/Web"),
            Err(WorkloadRefError::Name(_))
        ));
        assert!(matches!(
            parse("deployment/a/b"),
            Err(WorkloadRefError::Name(_))
        ));
        let msg = parse("pod/x").unwrap_err().to_string();
        assert!(msg.contains("deployment, statefulset"), "{msg}");
    }
}
