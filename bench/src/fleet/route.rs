//! What a Kubernetes API request addresses, parsed from its path and method: shared by the simulated
//! clusters (to serve it) and the counting proxy in front of real API servers (to count it the same way).

/// The kinds the simulated clusters serve: only what `kubectl-helmop` reads or writes downstream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kind {
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
}

impl Kind {
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.to_owned()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
}

pub const KINDS: [Kind; 10] = [
    kind("", "namespaces", "Namespace", false),
    kind("", "secrets", "Secret", true),
    kind("", "configmaps", "ConfigMap", true),
    kind("apps", "deployments", "Deployment", true),
    kind("apps", "statefulsets", "StatefulSet", true),
    kind("apps", "daemonsets", "DaemonSet", true),
    kind("apps", "replicasets", "ReplicaSet", true),
    kind("batch", "jobs", "Job", true),
    kind("batch", "cronjobs", "CronJob", true),
    // `status` reads the rollout watcher's Events in the namespaces of workload rows.
    kind("", "events", "Event", true),
];

const fn kind(
    group: &'static str,
    plural: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> Kind {
    Kind {
        group,
        version: "v1",
        plural,
        kind,
        namespaced,
    }
}

/// A parsed resource path: `/api/v1[/namespaces/NS]/PLURAL[/NAME]` or `/apis/G/V[/namespaces/NS]/PLURAL[/NAME]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub namespace: Option<String>,
    pub name: Option<String>,
}

impl Target {
    /// The served kind, if the simulated clusters serve it.
    pub fn kind(&self) -> Option<&'static Kind> {
        KINDS
            .iter()
            .find(|k| k.group == self.group && k.version == self.version && k.plural == self.plural)
    }
}

/// Parses a resource path; `None` for anything else (discovery, `/version`, subresources, ...).
pub fn parse(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", v, rest @ ..] => ("", *v, rest),
        ["apis", g, v, rest @ ..] => (*g, *v, rest),
        _ => return None,
    };
    let target = |plural: &str, namespace: Option<&str>, name: Option<&str>| Target {
        group: group.to_owned(),
        version: version.to_owned(),
        plural: plural.to_owned(),
        namespace: namespace.map(str::to_owned),
        name: name.map(str::to_owned),
    };
    match rest {
        // Namespaces themselves are cluster-scoped: `/api/v1/namespaces/NAME`.
        ["namespaces", name] if group.is_empty() => Some(target("namespaces", None, Some(name))),
        ["namespaces", ns, plural] => Some(target(plural, Some(ns), None)),
        ["namespaces", ns, plural, name] => Some(target(plural, Some(ns), Some(name))),
        [plural] => Some(target(plural, None, None)),
        [plural, name] if *plural != "namespaces" => Some(target(plural, None, Some(name))),
        _ => None,
    }
}

/// The verb as kube-apiserver's `apiserver_request_total` names it.
pub fn verb(method: &str, target: &Target, content_type: &str, watch: bool) -> &'static str {
    match (method, target.name.is_some()) {
        ("GET", true) => "GET",
        ("GET", false) if watch => "WATCH",
        ("GET", false) => "LIST",
        ("POST", _) => "POST",
        ("PUT", _) => "PUT",
        ("PATCH", _) if content_type.starts_with("application/apply-patch") => "APPLY",
        ("PATCH", _) => "PATCH",
        ("DELETE", true) => "DELETE",
        ("DELETE", false) => "DELETECOLLECTION",
        _ => "OTHER",
    }
}

/// Whether a verb changes state (what the benchmarks call a write).
pub fn is_write(verb: &str) -> bool {
    matches!(
        verb,
        "POST" | "PUT" | "PATCH" | "APPLY" | "DELETE" | "DELETECOLLECTION"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_paths_helmop_uses() {
        let t = parse("/api/v1/namespaces/kube-system").unwrap();
        assert_eq!(
            (t.plural.as_str(), t.namespace, t.name.as_deref()),
            ("namespaces", None, Some("kube-system"))
        );
        let t = parse("/api/v1/secrets").unwrap();
        assert_eq!(
            (t.plural.as_str(), t.namespace, t.name),
            ("secrets", None, None)
        );
        let t = parse("/api/v1/namespaces/a/configmaps/b").unwrap();
        assert_eq!(t.kind().map(|k| k.kind), Some("ConfigMap"));
        assert_eq!(
            (t.namespace.as_deref(), t.name.as_deref()),
            (Some("a"), Some("b"))
        );
        let t = parse("/apis/apps/v1/namespaces/a/deployments").unwrap();
        assert_eq!(t.kind().map(|k| k.kind), Some("Deployment"));
        let t = parse("/apis/argoproj.io/v1alpha1/namespaces/a/rollouts").unwrap();
        assert_eq!(t.kind(), None);
        assert_eq!(parse("/version"), None);
        assert_eq!(parse("/apis"), None);
        assert_eq!(parse("/api/v1/namespaces/a/secrets/b/status"), None);
    }

    #[test]
    fn verbs_follow_the_api_server() {
        let item = parse("/api/v1/namespaces/a/secrets/b").unwrap();
        let list = parse("/api/v1/namespaces/a/secrets").unwrap();
        assert_eq!(verb("GET", &item, "", false), "GET");
        assert_eq!(verb("GET", &list, "", false), "LIST");
        assert_eq!(verb("GET", &list, "", true), "WATCH");
        assert_eq!(
            verb("PATCH", &item, "application/apply-patch+yaml", false),
            "APPLY"
        );
        assert_eq!(
            verb("PATCH", &item, "application/merge-patch+json", false),
            "PATCH"
        );
        assert!(is_write("APPLY") && !is_write("LIST"));
    }
}
