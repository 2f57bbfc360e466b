use proptest::prelude::*;
use serde_json::{Value, json};

use super::*;
use crate::resource::ResourceRef;

fn helmop(spec: Value) -> Value {
    json!({
        "apiVersion": "fleet.cattle.io/v1alpha1",
        "kind": "HelmOp",
        "metadata": {"name": "app", "namespace": "apps"},
        "spec": spec,
    })
}

/// A spec Fleet accepts, to which each case adds its one problem.
fn base() -> Value {
    json!({"helm": {"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3"}})
}

fn with(mut spec: Value, patch: Value) -> Value {
    for (k, v) in patch.as_object().unwrap() {
        spec[k] = v.clone();
    }
    spec
}

fn summary(findings: &[Finding]) -> Vec<(Severity, String)> {
    findings
        .iter()
        .map(|f| (f.severity, f.path.clone()))
        .collect()
}

fn deny(path: &str) -> (Severity, String) {
    (Severity::Deny, path.to_string())
}

fn warn(path: &str) -> (Severity, String) {
    (Severity::Warn, path.to_string())
}

/// (case, spec, expected (severity, path) findings in order, a phrase the first message contains)
type Case = (&'static str, Value, Vec<(Severity, String)>, &'static str);

fn cases() -> Vec<Case> {
    let b = base;
    vec![
        ("valid repo chart", b(), vec![], ""),
        (
            "valid OCI chart",
            json!({"helm": {"repo": "oci://ghcr.io/acme/charts/app", "version": "^1.2"}}),
            vec![],
            "",
        ),
        (
            "valid OCI chart, newest version",
            json!({"helm": {"repo": "oci://ghcr.io/acme/app", "version": "*"}}),
            vec![],
            "",
        ),
        (
            "valid HTTPS repo, scheme in capitals",
            json!({"helm": {"repo": "HTTPS://charts.example.com", "chart": "app"}}),
            vec![],
            "",
        ),
        (
            "valid HTTP repo, no version",
            json!({"helm": {"repo": "http://charts.example.com:8080/sub", "chart": "app"}}),
            vec![],
            "",
        ),
        (
            "valid tarball",
            json!({"helm": {"chart": "https://example.com/app-1.2.3.TGZ"}}),
            vec![],
            "",
        ),
        (
            "valid with resources",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secret", "name": "db"}, {"kind": "ConfigMap", "name": "app.settings"}]}),
            ),
            vec![],
            "",
        ),
        // --- kinds
        (
            "kind not allowed",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Deployment", "name": "db"}]}),
            ),
            vec![deny("spec.downstreamResources[0].kind")],
            "kind \"Deployment\" is not allowed: use Secret or ConfigMap",
        ),
        (
            "kind non-canonical case",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "secret", "name": "db"}]}),
            ),
            vec![warn("spec.downstreamResources[0].kind")],
            "write \"Secret\"",
        ),
        (
            "kind CONFIGMAP",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "CONFIGMAP", "name": "db"}]}),
            ),
            vec![warn("spec.downstreamResources[0].kind")],
            "write \"ConfigMap\"",
        ),
        (
            "kind plural",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secrets", "name": "db"}]}),
            ),
            vec![deny("spec.downstreamResources[0].kind")],
            "not allowed",
        ),
        (
            "kind missing",
            with(b(), json!({"downstreamResources": [{"name": "db"}]})),
            vec![deny("spec.downstreamResources[0].kind")],
            "kind is missing",
        ),
        (
            "kind not a string",
            with(
                b(),
                json!({"downstreamResources": [{"kind": 1, "name": "db"}]}),
            ),
            vec![deny("spec.downstreamResources[0].kind")],
            "must be a string",
        ),
        // --- names
        (
            "name invalid",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secret", "name": "My_DB"}]}),
            ),
            vec![deny("spec.downstreamResources[0].name")],
            "not a valid Secret/ConfigMap name",
        ),
        (
            "name too long",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secret", "name": "a".repeat(254)}]}),
            ),
            vec![deny("spec.downstreamResources[0].name")],
            "at most 253",
        ),
        (
            "name missing",
            with(b(), json!({"downstreamResources": [{"kind": "Secret"}]})),
            vec![deny("spec.downstreamResources[0].name")],
            "name is missing",
        ),
        (
            "name empty",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secret", "name": ""}]}),
            ),
            vec![deny("spec.downstreamResources[0].name")],
            "must not be empty",
        ),
        (
            "name number",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secret", "name": 5}]}),
            ),
            vec![deny("spec.downstreamResources[0].name")],
            "must be a string",
        ),
        // --- shapes
        (
            "list is a string",
            with(b(), json!({"downstreamResources": "x"})),
            vec![deny("spec.downstreamResources")],
            "must be a list",
        ),
        (
            "entry is a string",
            with(b(), json!({"downstreamResources": ["secret/db"]})),
            vec![deny("spec.downstreamResources[0]")],
            "must be an object",
        ),
        (
            "entry with namespace",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secret", "name": "db", "namespace": "other"}]}),
            ),
            vec![warn("spec.downstreamResources[0].namespace")],
            "always copies from the HelmOp's own namespace",
        ),
        (
            "entry with unknown field",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secret", "name": "db", "optional": true}]}),
            ),
            vec![warn("spec.downstreamResources[0].optional")],
            "unknown field",
        ),
        (
            "target list wrong type",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}, "downstreamResources": {"kind": "Secret"}}]}),
            ),
            vec![deny("spec.targets[0].downstreamResources")],
            "must be a list",
        ),
        (
            "rollout value Fleet cannot read",
            with(b(), json!({"rolloutStrategy": {"maxUnavailable": "25 %"}})),
            vec![deny("spec.rolloutStrategy.maxUnavailable")],
            "fails the whole Bundle",
        ),
        (
            "partition maxUnavailable Fleet cannot read",
            with(
                b(),
                json!({"rolloutStrategy": {"partitions": [{"clusterName": "a", "maxUnavailable": "half"}]}}),
            ),
            vec![deny("spec.rolloutStrategy.partitions[0].maxUnavailable")],
            "must be int or percentage",
        ),
        (
            "partition selector Fleet cannot compile",
            with(
                b(),
                json!({"rolloutStrategy": {"partitions": [{"clusterSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}}]}}),
            ),
            vec![deny(
                "spec.rolloutStrategy.partitions[0].clusterSelector.matchExpressions[0].values",
            )],
            "cannot compile",
        ),
        (
            "partition without criteria",
            with(
                b(),
                json!({"rolloutStrategy": {"maxUnavailable": "25%", "partitions": [{"name": "first"}]}}),
            ),
            vec![warn("spec.rolloutStrategy.partitions[0]")],
            "puts no cluster in it",
        ),
        (
            "namespace selector Fleet's agent cannot compile",
            with(
                b(),
                json!({"allowedTargetNamespaceSelector": {"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}}),
            ),
            vec![deny(
                "spec.allowedTargetNamespaceSelector.matchExpressions[0].values",
            )],
            "copies nothing for this HelmOp",
        ),
        (
            "namespace selector on a target",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}, "allowedTargetNamespaceSelector": {}}]}),
            ),
            vec![warn("spec.targets[0].allowedTargetNamespaceSelector")],
            "ignores a target's allowedTargetNamespaceSelector",
        ),
        (
            "targets not a list",
            with(b(), json!({"targets": {"clusterName": "x"}})),
            vec![deny("spec.targets")],
            "must be a list",
        ),
        (
            "target not an object",
            with(b(), json!({"targets": ["x"]})),
            vec![deny("spec.targets[0]")],
            "must be an object",
        ),
        (
            "per-target kind",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}}, {"clusterName": "c", "downstreamResources": [{"kind": "Pod", "name": "x"}]}]}),
            ),
            vec![deny("spec.targets[1].downstreamResources[0].kind")],
            "not allowed",
        ),
        (
            "keepResources wrong type",
            with(b(), json!({"keepResources": "yes"})),
            vec![deny("spec.keepResources")],
            "true or false",
        ),
        // --- duplicates after the merge
        (
            "duplicate in root",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secret", "name": "db"}, {"kind": "secret", "name": "db"}]}),
            ),
            vec![
                warn("spec.downstreamResources[1].kind"),
                warn("spec.downstreamResources[1]"),
            ],
            "write \"Secret\"",
        ),
        (
            "same name, other kind is no duplicate",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secret", "name": "db"}, {"kind": "ConfigMap", "name": "db"}]}),
            ),
            vec![],
            "",
        ),
        (
            "duplicate within a target",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}, "downstreamResources": [{"kind": "ConfigMap", "name": "a"}, {"kind": "ConfigMap", "name": "a"}]}]}),
            ),
            vec![warn("spec.targets[0].downstreamResources[1]")],
            "duplicate of spec.targets[0].downstreamResources[0] (configmap/a)",
        ),
        (
            "target repeats a root entry",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secret", "name": "db"}], "targets": [{"clusterSelector": {}, "downstreamResources": [{"kind": "Secret", "name": "db"}]}]}),
            ),
            vec![warn("spec.targets[0].downstreamResources[0]")],
            "already listed in spec.downstreamResources[0]",
        ),
        (
            "two targets may list the same entry",
            with(
                b(),
                json!({"targets": [
                {"clusterName": "a", "downstreamResources": [{"kind": "Secret", "name": "db"}]},
                {"clusterName": "b", "downstreamResources": [{"kind": "Secret", "name": "db"}]}]}),
            ),
            vec![],
            "",
        ),
        // --- helmSecretName
        (
            "helmSecretName also listed",
            with(
                b(),
                json!({"helmSecretName": "creds", "downstreamResources": [{"kind": "Secret", "name": "creds"}]}),
            ),
            vec![warn("spec.downstreamResources[0]")],
            "also spec.helmSecretName",
        ),
        (
            "helmSecretName listed per target",
            with(
                b(),
                json!({"helmSecretName": "creds", "targets": [{"clusterSelector": {}, "downstreamResources": [{"kind": "Secret", "name": "creds"}]}]}),
            ),
            vec![warn("spec.targets[0].downstreamResources[0]")],
            "copy it twice",
        ),
        (
            "helmSecretName as a ConfigMap name is fine",
            with(
                b(),
                json!({"helmSecretName": "creds", "downstreamResources": [{"kind": "ConfigMap", "name": "creds"}]}),
            ),
            vec![],
            "",
        ),
        (
            "helmSecretName invalid",
            with(b(), json!({"helmSecretName": "Creds"})),
            vec![deny("spec.helmSecretName")],
            "not a valid Secret name",
        ),
        // --- valuesFrom
        (
            "valuesFrom downstream resource in another namespace",
            with(
                json!({"helm": {"repo": "https://x", "chart": "y", "valuesFrom": [{"secretKeyRef": {"name": "db", "namespace": "other", "key": "values.yaml"}}]}}),
                json!({"downstreamResources": [{"kind": "Secret", "name": "db"}]}),
            ),
            vec![warn("spec.helm.valuesFrom[0].secretKeyRef.namespace")],
            "reads it on each downstream cluster from the copy in the release namespace (namespace, else defaultNamespace, else the agent's default namespace (default)) and ignores namespace \"other\"",
        ),
        (
            "valuesFrom naming the HelmOp's own namespace is still ignored downstream",
            with(
                json!({"helm": {"repo": "https://x", "chart": "y", "valuesFrom": [{"secretKeyRef": {"name": "db", "namespace": "apps"}}]}}),
                json!({"defaultNamespace": "web", "downstreamResources": [{"kind": "Secret", "name": "db"}]}),
            ),
            vec![warn("spec.helm.valuesFrom[0].secretKeyRef.namespace")],
            "release namespace (namespace \"web\") and ignores namespace \"apps\"",
        ),
        (
            "valuesFrom naming the release namespace is fine",
            with(
                json!({"helm": {"repo": "https://x", "chart": "y", "valuesFrom": [{"secretKeyRef": {"name": "db", "namespace": "web"}}]}}),
                json!({"namespace": "web", "defaultNamespace": "other", "downstreamResources": [{"kind": "Secret", "name": "db"}]}),
            ),
            vec![],
            "",
        ),
        (
            "target valuesFrom: the target's namespace wins over the root's",
            with(
                b(),
                json!({"namespace": "root-ns", "downstreamResources": [{"kind": "Secret", "name": "db"}], "targets": [{"clusterSelector": {}, "namespace": "eu", "helm": {"valuesFrom": [{"secretKeyRef": {"name": "db", "namespace": "root-ns"}}]}}]}),
            ),
            vec![warn(
                "spec.targets[0].helm.valuesFrom[0].secretKeyRef.namespace",
            )],
            "(namespace \"eu\") and ignores namespace \"root-ns\"",
        ),
        (
            "valuesFrom without namespace is fine",
            with(
                json!({"helm": {"repo": "https://x", "chart": "y", "valuesFrom": [{"configMapKeyRef": {"name": "cfg"}}]}}),
                json!({"downstreamResources": [{"kind": "ConfigMap", "name": "cfg"}]}),
            ),
            vec![],
            "",
        ),
        (
            "valuesFrom kind must match",
            with(
                json!({"helm": {"repo": "https://x", "chart": "y", "valuesFrom": [{"configMapKeyRef": {"name": "db", "namespace": "other"}}]}}),
                json!({"downstreamResources": [{"kind": "Secret", "name": "db"}]}),
            ),
            vec![],
            "",
        ),
        (
            "valuesFrom not a downstream resource",
            with(
                json!({"helm": {"repo": "https://x", "chart": "y", "valuesFrom": [{"secretKeyRef": {"name": "elsewhere", "namespace": "other"}}]}}),
                json!({"downstreamResources": [{"kind": "Secret", "name": "db"}]}),
            ),
            vec![],
            "",
        ),
        (
            "root valuesFrom meets a target's resource",
            with(
                json!({"helm": {"repo": "https://x", "chart": "y", "valuesFrom": [{"configMapKeyRef": {"name": "eu", "namespace": "x"}}]}}),
                json!({"targets": [{"clusterSelector": {}, "downstreamResources": [{"kind": "ConfigMap", "name": "eu"}]}]}),
            ),
            vec![warn("spec.helm.valuesFrom[0].configMapKeyRef.namespace")],
            "configmap/eu is a downstream resource (spec.targets[0].downstreamResources[0])",
        ),
        (
            "target valuesFrom meets the root list",
            with(
                b(),
                json!({"downstreamResources": [{"kind": "Secret", "name": "db"}], "targets": [{"clusterSelector": {}, "helm": {"valuesFrom": [{"secretKeyRef": {"name": "db", "namespace": "x"}}]}}]}),
            ),
            vec![warn(
                "spec.targets[0].helm.valuesFrom[0].secretKeyRef.namespace",
            )],
            "ignores namespace \"x\" here: remove namespace",
        ),
        (
            "target valuesFrom does not see another target's list",
            with(
                b(),
                json!({"targets": [
                {"clusterName": "a", "downstreamResources": [{"kind": "Secret", "name": "db"}]},
                {"clusterName": "b", "helm": {"valuesFrom": [{"secretKeyRef": {"name": "db", "namespace": "x"}}]}}]}),
            ),
            vec![],
            "",
        ),
        (
            "valuesFrom not a list",
            with(
                json!({"helm": {"repo": "https://x", "chart": "y", "valuesFrom": {"secretKeyRef": {}}}}),
                json!({}),
            ),
            vec![deny("spec.helm.valuesFrom")],
            "must be a list",
        ),
        (
            "valuesFrom ref not an object",
            with(
                json!({"helm": {"repo": "https://x", "chart": "y", "valuesFrom": [{"secretKeyRef": "db"}]}}),
                json!({}),
            ),
            vec![deny("spec.helm.valuesFrom[0].secretKeyRef")],
            "must be an object",
        ),
        // --- helm values templates (`${ }`): every place a `$` can reach the YAML text
        (
            "values template Go cannot parse, in a nested list",
            json!({"helm": {"repo": "https://x", "chart": "y", "values": {"a": [{"b": ["ok", "${ toYaml .ClusterLabels }"]}]}}}),
            vec![deny("spec.helm.values")],
            "function \"toYaml\" not defined",
        ),
        (
            "values template Go cannot parse, in a key",
            json!({"helm": {"repo": "https://x", "chart": "y", "values": {"a": {"${ .ClusterLabels.env": 1}}}}),
            vec![deny("spec.helm.values")],
            "cannot parse this as a helm values template",
        ),
        (
            "values template split over a key and its value",
            json!({"helm": {"repo": "https://x", "chart": "y", "values": {"a": {"$": "{ x"}}}}),
            vec![],
            "",
        ),
        (
            "values with a $ and no template",
            json!({"helm": {"repo": "https://x", "chart": "y", "values": {"path": "$HOME/x", "n": 1.5, "t": true, "z": null}}}),
            vec![],
            "",
        ),
        (
            "values template Go cannot parse, preprocessing off",
            json!({"helm": {"repo": "https://x", "chart": "y", "disablePreProcess": true, "values": {"a": "${ toYaml . }"}}}),
            vec![],
            "",
        ),
        (
            "templateValues entry Go cannot parse",
            json!({"helm": {"repo": "https://x", "chart": "y", "templateValues": {"k": "${ nope }"}}}),
            vec![deny("spec.helm.templateValues.k")],
            "function \"nope\" not defined",
        ),
        // --- Fleet's chart/repo/version rules
        (
            "helm missing",
            json!({"downstreamResources": []}),
            vec![deny("spec.helm")],
            "Fleet rejects a HelmOp without helm options",
        ),
        (
            "helm not an object",
            json!({"helm": "x"}),
            vec![deny("spec.helm")],
            "must be an object",
        ),
        (
            "no chart nor repo",
            json!({"helm": {"version": "1.0.0"}}),
            vec![deny("spec.helm.chart")],
            "no chart given",
        ),
        (
            "OCI repo with chart",
            json!({"helm": {"repo": "oci://ghcr.io/acme/charts", "chart": "app", "version": "1.x"}}),
            vec![deny("spec.helm.chart")],
            "e.g. oci://ghcr.io/acme/charts/app",
        ),
        (
            "OCI repo without version",
            json!({"helm": {"repo": "oci://ghcr.io/acme/app"}}),
            vec![deny("spec.helm.version")],
            "an oci:// repo needs a version",
        ),
        (
            "OCI scheme in capitals",
            json!({"helm": {"repo": "OCI://ghcr.io/acme/app", "version": "1.x"}}),
            vec![deny("spec.helm.repo")],
            "in lower case",
        ),
        (
            "OCI scheme in capitals with a chart",
            json!({"helm": {"repo": "Oci://ghcr.io/acme", "chart": "app"}}),
            vec![deny("spec.helm.chart"), deny("spec.helm.repo")],
            "remove chart",
        ),
        (
            "scheme-less repo",
            json!({"helm": {"repo": "charts.example.com/stable", "chart": "app"}}),
            vec![deny("spec.helm.repo")],
            "is not an http:// or https:// URL",
        ),
        (
            "host:port repo without scheme",
            json!({"helm": {"repo": "localhost:8080", "chart": "app"}}),
            vec![deny("spec.helm.repo")],
            "is not an http:// or https:// URL",
        ),
        (
            "repo of another scheme",
            json!({"helm": {"repo": "git://example.com/charts", "chart": "app"}}),
            vec![deny("spec.helm.repo")],
            "is not an http:// or https:// URL",
        ),
        (
            "repo without host",
            json!({"helm": {"repo": "https:///charts", "chart": "app"}}),
            vec![deny("spec.helm.repo")],
            "has no host",
        ),
        (
            "target OCI scheme in capitals",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}, "helm": {"repo": "OCI://x/app", "chart": ""}}]}),
            ),
            vec![
                warn("spec.targets[0].helm.chart"),
                warn("spec.targets[0].helm.repo"),
            ],
            "Fleet's agent fails",
        ),
        (
            "OCI in chart without repo",
            json!({"helm": {"chart": "oci://ghcr.io/acme/charts/app"}}),
            vec![deny("spec.helm.repo")],
            "Fleet expects OCI charts in repo",
        ),
        (
            "repo without chart",
            json!({"helm": {"repo": "https://charts.example.com"}}),
            vec![deny("spec.helm.chart")],
            "set chart to the chart's name",
        ),
        (
            "chart without repo",
            json!({"helm": {"chart": "app"}}),
            vec![deny("spec.helm.repo")],
            "repo is empty",
        ),
        (
            "tarball with repo and version",
            json!({"helm": {"chart": "https://x/app-1.0.0.tgz", "repo": "https://x", "version": "1.0.0"}}),
            vec![deny("spec.helm.repo"), deny("spec.helm.version")],
            "takes no repo",
        ),
        (
            "version not a constraint",
            json!({"helm": {"repo": "https://x", "chart": "app", "version": "latest"}}),
            vec![deny("spec.helm.version")],
            "not a version or semver constraint",
        ),
        (
            "OCI version not a constraint",
            json!({"helm": {"repo": "oci://x/app", "version": "1.2.3.4"}}),
            vec![deny("spec.helm.version")],
            "1.2.x",
        ),
        (
            "version constraint range",
            json!({"helm": {"repo": "https://x", "chart": "app", "version": ">=1.0.0 <2.0.0 || 3.x"}}),
            vec![],
            "",
        ),
        (
            "version a number",
            json!({"helm": {"repo": "https://x", "chart": "app", "version": 1.2}}),
            vec![deny("spec.helm.version")],
            "must be a string",
        ),
        (
            "target overrides to a bad combination",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}, "helm": {"repo": "oci://x/app"}}]}),
            ),
            vec![warn("spec.targets[0].helm.chart")],
            "Fleet's agent fails on the clusters this target matches",
        ),
        (
            "target overrides version only",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}, "helm": {"version": "2.x"}}]}),
            ),
            vec![],
            "",
        ),
        (
            "target bad version",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}, "helm": {"version": "newest"}}]}),
            ),
            vec![warn("spec.targets[0].helm.version")],
            "not a version",
        ),
        // --- releaseName
        (
            "releaseName ok",
            json!({"helm": {"repo": "https://x", "chart": "app", "releaseName": "my-app.v2"}}),
            vec![],
            "",
        ),
        (
            "releaseName 53 chars ok",
            json!({"helm": {"repo": "https://x", "chart": "app", "releaseName": "a".repeat(53)}}),
            vec![],
            "",
        ),
        (
            "releaseName too long",
            json!({"helm": {"repo": "https://x", "chart": "app", "releaseName": "a".repeat(54)}}),
            vec![deny("spec.helm.releaseName")],
            "releaseName is 54 characters long, more than the 53 the CRD allows",
        ),
        (
            "releaseName upper case",
            json!({"helm": {"repo": "https://x", "chart": "app", "releaseName": "MyApp"}}),
            vec![deny("spec.helm.releaseName")],
            "does not match the CRD's pattern",
        ),
        (
            "releaseName empty",
            json!({"helm": {"repo": "https://x", "chart": "app", "releaseName": ""}}),
            vec![deny("spec.helm.releaseName")],
            "an empty string is a value, not the field left out; remove the field",
        ),
        (
            "target releaseName",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}, "helm": {"releaseName": "bad_name"}}]}),
            ),
            vec![deny("spec.targets[0].helm.releaseName")],
            "does not match the CRD's pattern",
        ),
        // --- targets and namespaces
        (
            "target without criteria",
            with(b(), json!({"targets": [{"name": "all"}]})),
            vec![warn("spec.targets[0]")],
            "matches no cluster",
        ),
        (
            "bad selector operator",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {"matchExpressions": [{"key": "env", "operator": "in", "values": ["a"]}]}}]}),
            ),
            vec![deny(
                "spec.targets[0].clusterSelector.matchExpressions[0].operator",
            )],
            "not a valid label selector operator",
        ),
        (
            "In without values",
            with(
                b(),
                json!({"targets": [{"clusterGroupSelector": {"matchExpressions": [{"key": "env", "operator": "In"}]}}]}),
            ),
            vec![deny(
                "spec.targets[0].clusterGroupSelector.matchExpressions[0].values",
            )],
            "at least one value",
        ),
        (
            "matchLabels value not a string",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {"matchLabels": {"gpu": true}}}]}),
            ),
            vec![deny("spec.targets[0].clusterSelector.matchLabels.gpu")],
            "quote it",
        ),
        (
            "selector not an object",
            with(b(), json!({"targets": [{"clusterSelector": "env=prod"}]})),
            vec![deny("spec.targets[0].clusterSelector")],
            "must be an object",
        ),
        (
            "expression without operator",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {"matchExpressions": [{"key": "env"}]}}]}),
            ),
            vec![deny(
                "spec.targets[0].clusterSelector.matchExpressions[0].operator",
            )],
            "operator is missing: the CRD requires it",
        ),
        (
            "namespace invalid",
            with(b(), json!({"namespace": "My NS"})),
            vec![deny("spec.namespace")],
            "not a valid namespace name",
        ),
        (
            "target defaultNamespace invalid",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}, "defaultNamespace": "a.b"}]}),
            ),
            vec![deny("spec.targets[0].defaultNamespace")],
            "not a valid namespace name",
        ),
        (
            "doNotDeploy wrong type",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}, "doNotDeploy": "true"}]}),
            ),
            vec![deny("spec.targets[0].doNotDeploy")],
            "true or false",
        ),
        (
            "targetRestrictions as an allow list only",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}}], "targetRestrictions": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}]}),
            ),
            vec![],
            "",
        ),
        (
            "targetRestrictions make leading targets customizations",
            with(
                b(),
                json!({
                    "targets": [{"clusterName": "a"}, {"clusterName": "b"}, {"clusterSelector": {}}],
                    "targetRestrictions": [{"clusterSelector": {}}],
                }),
            ),
            vec![warn("spec.targets[0]"), warn("spec.targets[1]")],
            "first 2 of 3 targets as customizations",
        ),
        (
            "targetRestrictions bad selector",
            with(
                b(),
                json!({"targetRestrictions": [{"clusterSelector": {"matchLabels": {"-bad": "x"}}}]}),
            ),
            vec![deny(
                "spec.targetRestrictions[0].clusterSelector.matchLabels.-bad",
            )],
            "",
        ),
        (
            "targetCustomizationMode outside the enum",
            with(b(), json!({"targetCustomizationMode": "allMatches"})),
            vec![deny("spec.targetCustomizationMode")],
            "is not \"FirstMatch\" or \"AllMatches\"",
        ),
        (
            // The CRD's enum has no "": an empty string is a value, not the default.
            "targetCustomizationMode empty",
            with(b(), json!({"targetCustomizationMode": ""})),
            vec![deny("spec.targetCustomizationMode")],
            "remove the field to get the default \"FirstMatch\"",
        ),
        (
            "targetCustomizationMode AllMatches",
            with(b(), json!({"targetCustomizationMode": "AllMatches"})),
            vec![],
            "",
        ),
        (
            "namespaceLabels fine",
            with(
                b(),
                json!({"namespaceLabels": {"team": "shop", "example.com/tier": ""}, "namespaceAnnotations": {"note": "any text at all"}}),
            ),
            vec![],
            "",
        ),
        (
            "namespaceLabels pod-security",
            with(
                b(),
                json!({"targets": [{"clusterSelector": {}, "namespaceLabels": {"pod-security.kubernetes.io/enforce": "privileged"}}]}),
            ),
            vec![warn(
                "spec.targets[0].namespaceLabels.pod-security.kubernetes.io/enforce",
            )],
            "never sets pod-security",
        ),
        (
            "namespaceLabels value the API server refuses",
            with(b(), json!({"namespaceLabels": {"team": "a b"}})),
            vec![warn("spec.namespaceLabels.team")],
            "value \"a b\"",
        ),
        (
            "namespaceAnnotations bad key",
            with(b(), json!({"namespaceAnnotations": {"-x": "1"}})),
            vec![warn("spec.namespaceAnnotations.-x")],
            "key \"-x\"",
        ),
        (
            "namespaceLabels wrong types",
            with(
                b(),
                json!({"namespaceLabels": {"n": 1}, "namespaceAnnotations": "x"}),
            ),
            vec![
                deny("spec.namespaceAnnotations"),
                deny("spec.namespaceLabels.n"),
            ],
            "namespaceAnnotations must be an object, not a string",
        ),
        (
            "spec.labels Fleet puts on the Bundle: a key and a value the API server refuses",
            with(
                b(),
                json!({"labels": {"team": "platform", "bad key": "x", "tier": "a/b", "n": 1}}),
            ),
            vec![
                deny("spec.labels.n"),
                deny("spec.labels.bad key"),
                deny("spec.labels.tier"),
            ],
            "must be a string",
        ),
        (
            "a spec.labels value over 63 characters",
            with(b(), json!({"labels": {"team": "x".repeat(64)}})),
            vec![deny("spec.labels.team")],
            "Fleet copies spec.labels onto the HelmOp's Bundle",
        ),
    ]
}

/// Fleet writes the HelmOp's name into a label of its Bundle: a name of 64 characters is a valid
/// object name but not a label value, and Fleet never creates the Bundle.
#[test]
fn a_name_longer_than_a_label_value_is_denied() {
    let mut op = helmop(base());
    op["metadata"]["name"] = json!("a".repeat(63));
    assert_eq!(validate_helmop(&op), vec![]);
    op["metadata"]["name"] = json!("a".repeat(64));
    let got = validate_helmop(&op);
    assert_eq!(summary(&got), vec![deny("metadata.name")], "{got:#?}");
    assert!(
        got[0]
            .message
            .contains("label fleet.cattle.io/fleet-helm-name of its Bundle"),
        "{}",
        got[0].message
    );
}

#[test]
fn rule_table() {
    let mut wrong = Vec::new();
    for (name, spec, want, phrase) in cases() {
        let got = validate_helmop(&helmop(spec));
        if summary(&got) != want {
            wrong.push(format!("{name}: want {want:?}, got {got:#?}"));
        } else if let Some(first) = got.first()
            && !first.message.contains(phrase)
        {
            wrong.push(format!("{name}: {:?} lacks {phrase:?}", first.message));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

#[test]
fn every_problem_is_listed() {
    let spec = json!({
        "helm": {"repo": "oci://r/app", "chart": "app", "version": "1.x", "releaseName": "Bad"},
        "downstreamResources": [{"kind": "Deployment", "name": "x"}, {"kind": "Secret", "name": "Bad"}],
        "targets": [{"clusterSelector": {}, "downstreamResources": [{"kind": "configmap", "name": "ok"}]}],
    });
    let got = validate_helmop(&helmop(spec));
    assert_eq!(
        summary(&got),
        vec![
            // The CRD's schema first, then helmop's rules.
            deny("spec.helm.releaseName"),
            deny("spec.helm.chart"),
            deny("spec.downstreamResources[0].kind"),
            deny("spec.downstreamResources[1].name"),
            warn("spec.targets[0].downstreamResources[0].kind"),
        ]
    );
    assert!(has_denials(&got));
    assert!(!has_denials(&got[4..]));
}

#[test]
fn document_level_problems() {
    let got = validate_helmop(&json!("a string"));
    assert_eq!(summary(&got), vec![deny("")]);
    assert_eq!(
        got[0].to_string(),
        "a HelmOp must be an object, not a string"
    );
    let got = validate_helmop(&json!({"kind": "HelmOp"}));
    assert_eq!(summary(&got), vec![deny("spec")]);
    let got = validate_helmop(&json!({"kind": "HelmOp", "spec": []}));
    assert_eq!(summary(&got), vec![deny("spec")]);
}

#[test]
fn values_from_rule_ignores_the_helmops_namespace() {
    // Fleet reads valuesFrom downstream, so where the HelmOp lives upstream changes nothing.
    let mut obj = helmop(with(
        json!({"helm": {"repo": "https://x", "chart": "y", "valuesFrom": [{"secretKeyRef": {"name": "db", "namespace": "other"}}]}}),
        json!({"downstreamResources": [{"kind": "Secret", "name": "db"}]}),
    ));
    obj["metadata"].as_object_mut().unwrap().remove("namespace");
    let want = vec![warn("spec.helm.valuesFrom[0].secretKeyRef.namespace")];
    assert_eq!(summary(&validate_helmop(&obj)), want);
    assert_eq!(summary(&validate_helmop_in(&obj, Some("apps"))), want);
    assert_eq!(summary(&validate_helmop_in(&obj, Some("other"))), want);
}

#[test]
fn finding_display_and_json() {
    let f = Finding::deny("spec.helm.chart", "chart is empty");
    assert_eq!(f.to_string(), "spec.helm.chart: chart is empty");
    assert_eq!(
        serde_json::to_value(&f).unwrap(),
        json!({"severity": "deny", "path": "spec.helm.chart", "message": "chart is empty"})
    );
    assert_eq!(Severity::Warn.to_string(), "warn");
}

#[test]
fn downstream_refs_lists_well_formed_references() {
    let obj = helmop(json!({
        "helm": {},
        "downstreamResources": [
            {"kind": "Secret", "name": "db"},
            {"kind": "Deployment", "name": "x"},
            {"kind": "configmap", "name": "cfg"},
            {"kind": "Secret", "name": "Bad_Name"},
            "garbage",
        ],
        "targets": [
            {"clusterName": "a"},
            {"clusterName": "b", "downstreamResources": [{"kind": "ConfigMap", "name": "eu"}, {"kind": "Secret"}]},
            {"clusterName": "c", "downstreamResources": "nope"},
        ],
    }));
    assert_eq!(
        downstream_refs(&obj),
        vec![
            (
                "spec.downstreamResources[0]".to_string(),
                ResourceRef::secret("db")
            ),
            (
                "spec.downstreamResources[2]".to_string(),
                ResourceRef::config_map("cfg")
            ),
            (
                "spec.targets[1].downstreamResources[0]".to_string(),
                ResourceRef::config_map("eu")
            ),
        ]
    );
    assert!(downstream_refs(&json!(null)).is_empty());
    assert!(downstream_refs(&json!({"spec": 1})).is_empty());
}

/// Random values shaped like a HelmOp: the right keys, any values, so validation walks deep.
fn arb_helmopish() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        prop_oneof![
            Just("Secret"),
            Just("configmap"),
            Just("Pod"),
            Just("db"),
            Just("In"),
            Just("NotIn"),
            Just("Exists"),
            Just("oci://r/app"),
            Just("https://x"),
            Just("a.tgz"),
            Just("1.2.x"),
            Just(""),
            Just("Bad Name"),
            Just("apps"),
            Just(">=1 <2"),
        ]
        .prop_map(Value::from),
        ".{0,8}".prop_map(Value::from),
    ];
    let key = prop_oneof![
        Just("spec"),
        Just("helm"),
        Just("chart"),
        Just("repo"),
        Just("version"),
        Just("releaseName"),
        Just("valuesFrom"),
        Just("secretKeyRef"),
        Just("configMapKeyRef"),
        Just("name"),
        Just("namespace"),
        Just("key"),
        Just("kind"),
        Just("downstreamResources"),
        Just("targets"),
        Just("clusterSelector"),
        Just("clusterGroupSelector"),
        Just("matchLabels"),
        Just("matchExpressions"),
        Just("operator"),
        Just("values"),
        Just("helmSecretName"),
        Just("targetRestrictions"),
        Just("targetCustomizationMode"),
        Just("namespaceLabels"),
        Just("namespaceAnnotations"),
        Just("keepResources"),
        Just("doNotDeploy"),
        Just("defaultNamespace"),
        Just("clusterName"),
        Just("clusterGroup"),
        Just("metadata"),
    ]
    .prop_map(str::to_string);
    leaf.prop_recursive(6, 64, 6, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            proptest::collection::btree_map(key.clone(), inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn same_json_is_value_equality_whatever_the_key_order(a in arb_helmopish(), b in arb_helmopish(), reorder in any::<bool>()) {
        let text = |v: &Value, rev: bool| -> String {
            // The same document with the keys of every object in reverse order.
            fn reversed(v: &Value) -> String {
                match v {
                    Value::Object(m) => format!("{{{}}}", m.iter().rev().map(|(k, v)| format!("{}:{}", Value::from(k.as_str()), reversed(v))).collect::<Vec<_>>().join(",")),
                    Value::Array(a) => format!("[{}]", a.iter().map(reversed).collect::<Vec<_>>().join(",")),
                    other => other.to_string(),
                }
            }
            if rev { reversed(v) } else { v.to_string() }
        };
        let (ta, ta2, tb) = (text(&a, false), text(&a, reorder), text(&b, false));
        let (va, va2, vb) = (OwnedValue::from_string(ta).unwrap(), OwnedValue::from_string(ta2).unwrap(), OwnedValue::from_string(tb).unwrap());
        prop_assert!(same_json(va.get_value(), va2.get_value()));
        prop_assert_eq!(same_json(va.get_value(), vb.get_value()), a == b);
    }

    #[test]
    fn same_json_takes_the_last_of_a_repeated_key(_x in 0..1u8) {
        let a = OwnedValue::from_string(r#"{"a":1,"b":2,"a":3}"#.to_string()).unwrap();
        let b = OwnedValue::from_string(r#"{"b":2,"a":3}"#.to_string()).unwrap();
        let c = OwnedValue::from_string(r#"{"b":2,"a":1}"#.to_string()).unwrap();
        prop_assert!(same_json(a.get_value(), b.get_value()));
        prop_assert!(!same_json(a.get_value(), c.get_value()));
    }

    #[test]
    fn never_panics_on_helmop_shaped_values(v in arb_helmopish()) {
        let findings = validate_helmop(&v);
        let _ = downstream_refs(&v);
        let wrapped = json!({"metadata": {"namespace": "apps"}, "spec": v});
        let _ = validate_helmop(&wrapped);
        // Every finding points somewhere and says something.
        for f in findings {
            prop_assert!(!f.message.is_empty());
        }
        // Every reference downstream_refs reports is one validation does not deny.
        let refs = downstream_refs(&wrapped);
        let denied: Vec<String> = validate_helmop(&wrapped).into_iter().filter(Finding::is_deny).map(|f| f.path).collect();
        for (path, _) in refs {
            prop_assert!(!denied.iter().any(|d| d.starts_with(&path) && d[path.len()..].starts_with('.')), "{path} denied");
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_through_parse_and_validate(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
        if let Ok(docs) = crate::yaml::parse_documents(&bytes) {
            for d in docs {
                let _ = validate_helmop(&d.value);
                let _ = downstream_refs(&d.value);
            }
        }
    }

    #[test]
    fn valid_resource_lists_pass(
        entries in proptest::collection::vec((prop_oneof![Just("Secret"), Just("ConfigMap")], "[a-z][a-z0-9-]{0,10}[a-z0-9]"), 0..6)
    ) {
        let mut seen = std::collections::HashSet::new();
        let unique: Vec<_> = entries.into_iter().filter(|e| seen.insert(e.clone())).collect();
        let list: Vec<Value> = unique.iter().map(|(k, n)| json!({"kind": k, "name": n})).collect();
        let obj = helmop(with(base(), json!({"downstreamResources": list})));
        prop_assert_eq!(validate_helmop(&obj), vec![]);
        prop_assert_eq!(downstream_refs(&obj).len(), unique.len());
    }
}
#[test]
fn long_values_are_cut_short_in_messages() {
    let long = "A".repeat(300);
    let got = validate_helmop(&helmop(with(
        base(),
        json!({"downstreamResources": [{"kind": "Secret", "name": long}]}),
    )));
    assert_eq!(got.len(), 1);
    assert!(got[0].message.len() < 300, "{}", got[0].message);
    assert!(
        got[0].message.contains("(300 characters)"),
        "{}",
        got[0].message
    );
}

/// `v` as JSON text with every object's keys in reverse order (a sender's order need not be sorted).
fn reversed_json(v: &Value) -> String {
    match v {
        Value::Object(m) => {
            let fields: Vec<String> = m
                .iter()
                .rev()
                .map(|(k, v)| format!("{}:{}", Value::from(k.as_str()), reversed_json(v)))
                .collect();
            format!("{{{}}}", fields.join(","))
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(reversed_json).collect();
            format!("[{}]", items.join(","))
        }
        other => other.to_string(),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    /// The webhook parses the review's text into a borrowed tree (keys in the sender's order), the plugin
    /// converts a `serde_json::Value` (keys sorted): the same HelmOp gets the same findings, in the same order,
    /// and the same references either way.
    #[test]
    fn parsed_text_and_converted_values_agree(v in arb_helmopish()) {
        let wrapped = json!({"metadata": {"namespace": "apps"}, "spec": v});
        let text = reversed_json(&wrapped);
        let view: JsonView = serde_json::from_str(&text).unwrap();
        let findings = validate_helmop_in(&wrapped, Some("apps"));
        prop_assert_eq!(&validate_helmop_in(&view, Some("apps")), &findings);
        let refs = downstream_refs(&wrapped);
        prop_assert_eq!(&downstream_refs(&view), &refs);
        let checked = check_helmop(&view, Some("apps"));
        prop_assert_eq!(&checked.findings, &findings);
        let rendered: Vec<(String, ResourceRef)> =
            checked.references.into_iter().map(|(at, r)| (at.to_string(), r)).collect();
        prop_assert_eq!(rendered, refs);
    }
}

#[test]
fn duplicate_keys_read_as_serde_json_reads_them() {
    // serde_json keeps the last of duplicate keys; the borrowed tree keeps all, and the rules read the last.
    let text = r#"{"spec": {"helm": 1, "helm": {"repo": "https://x", "chart": "y"},
        "namespaceLabels": {"b": 2, "a": "ok", "b": "fine"}}}"#;
    let view: JsonView = serde_json::from_str(text).unwrap();
    let value: Value = serde_json::from_str(text).unwrap();
    assert_eq!(
        validate_helmop_in(&view, None),
        validate_helmop_in(&value, None)
    );
    assert_eq!(validate_helmop(&value), vec![]);
}
