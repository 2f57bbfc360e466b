//! Renders every kustomization under `manifests/` with the real `kubectl kustomize` and checks what the
//! install promises: least-privilege RBAC, webhook configurations that cannot deadlock the cluster, hardened
//! pods, and command lines that the binaries actually accept.
#![allow(clippy::unwrap_used)] // test code: a panic is a failed test with its message

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Parser;
use helmop_core::workload::WorkloadKind;
use helmop_webhook::cli::{BootstrapCli, Cli};
use serde_json::Value;

fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../manifests")
}

fn is_component(dir: &Path) -> bool {
    std::fs::read_to_string(dir.join("kustomization.yaml"))
        .unwrap()
        .lines()
        .any(|l| l.trim() == "kind: Component")
}

/// Every directory holding a kustomization, except the examples (HelmOps for the demo, not an install) and
/// components (`kube-1.20`), which only render as part of an overlay.
fn kustomizations() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(manifests_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.join("kustomization.yaml").exists()
                && p.file_name().unwrap() != "examples"
                && !is_component(p)
        })
        .collect();
    dirs.sort();
    dirs
}

fn render(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("kubectl must be on PATH (a prerequisite, see ./dev)");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_saphyr::from_multiple::<Value>(&text)
        .unwrap()
        .into_iter()
        .filter(|v| !v.is_null())
        .collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind} {name} missing"))
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// Every workload of every install directory, with `"DIR: Kind name"` to name it in failures.
fn all_workloads() -> Vec<(String, Value)> {
    let mut all = Vec::new();
    for dir in kustomizations() {
        let docs = render(&dir);
        for kind in ["Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob"] {
            for workload in of_kind(&docs, kind) {
                let who = format!("{}: {}", dir.display(), name_of(workload));
                all.push((who, workload.clone()));
            }
        }
    }
    all
}

fn name_of(v: &Value) -> String {
    format!(
        "{} {}",
        v["kind"].as_str().unwrap_or("?"),
        v["metadata"]["name"].as_str().unwrap_or("?")
    )
}

#[test]
fn every_kustomization_renders() {
    let dirs = kustomizations();
    let names: BTreeSet<_> = dirs
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for expected in ["base", "cert-manager", "self-signed"] {
        assert!(
            names.contains(expected),
            "manifests/{expected} missing: {names:?}"
        );
    }
    for dir in dirs {
        assert!(
            !render(&dir).is_empty(),
            "{} renders nothing",
            dir.display()
        );
    }
}

#[test]
fn rbac_is_least_privilege_everywhere() {
    for dir in kustomizations() {
        let docs = render(&dir);
        for role in of_kind(&docs, "Role")
            .into_iter()
            .chain(of_kind(&docs, "ClusterRole"))
        {
            let who = format!("{}: {}", dir.display(), name_of(role));
            assert!(
                role.get("aggregationRule").is_none(),
                "{who}: aggregated roles grant whatever matches"
            );
            for rule in role["rules"].as_array().unwrap() {
                for field in [
                    "verbs",
                    "resources",
                    "apiGroups",
                    "resourceNames",
                    "nonResourceURLs",
                ] {
                    assert!(
                        !strings(&rule[field]).iter().any(|s| s.contains('*')),
                        "{who}: `*` in {field}: {rule}"
                    );
                }
                for verb in strings(&rule["verbs"]) {
                    assert!(
                        !["escalate", "bind", "impersonate"].contains(&verb),
                        "{who}: {verb}"
                    );
                }
                let secrets = strings(&rule["resources"]).contains(&"secrets");
                let writes = strings(&rule["verbs"])
                    .iter()
                    .any(|v| !["get", "list", "watch"].contains(v));
                if secrets && writes {
                    assert_eq!(
                        role["kind"], "Role",
                        "{who}: Secret writes must be namespaced: {rule}"
                    );
                }
            }
        }
    }
}

/// Every rule bound to ServiceAccount `helmop-system/account` in an install directory, with the namespace it
/// holds in (`None`: cluster-wide).
fn bound_rules(docs: &[Value], account: &str) -> Vec<(Option<String>, Value)> {
    let mut out = Vec::new();
    for kind in ["RoleBinding", "ClusterRoleBinding"] {
        for binding in of_kind(docs, kind) {
            let bound = binding["subjects"].as_array().unwrap().iter().any(|s| {
                s["kind"] == "ServiceAccount"
                    && s["name"] == account
                    && s["namespace"] == "helmop-system"
            });
            if !bound {
                continue;
            }
            let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
            let role = named(
                docs,
                role_kind,
                binding["roleRef"]["name"].as_str().unwrap(),
            );
            let scope = (kind == "RoleBinding").then(|| {
                binding["metadata"]["namespace"]
                    .as_str()
                    .unwrap()
                    .to_owned()
            });
            for rule in role["rules"].as_array().unwrap() {
                out.push((scope.clone(), rule.clone()));
            }
        }
    }
    out
}

/// The long-running webhook reads what admission needs; its only writes are its initContainers' bootstrap:
/// creating Secrets in helmop-system (RBAC cannot name what does not exist yet), replacing the bootstrap's
/// own Secrets by name, and setting the caBundle of exactly its own webhook configurations. Nothing is
/// deleted or patched, and nothing is written outside helmop-system but those two configurations.
#[test]
fn the_webhook_reads_and_writes_only_its_own_bootstrap_state() {
    let docs = render(&manifests_dir().join("base"));
    let role = named(&docs, "ClusterRole", "helmop-webhook");
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for verb in strings(&rule["verbs"]) {
            assert!(
                ["get", "list", "watch"].contains(&verb),
                "webhook writes cluster-wide: {rule}"
            );
        }
        for resource in strings(&rule["resources"]) {
            granted.insert(resource.to_owned());
        }
    }
    let expected: BTreeSet<String> = [
        "helmops",
        "policies",
        "secrets",
        "configmaps",
        "namespaces",
        "serviceaccounts",
    ]
    .map(String::from)
    .into();
    assert_eq!(granted, expected);
    let binding = named(&docs, "ClusterRoleBinding", "helmop-webhook");
    assert_eq!(binding["subjects"][0]["name"], "helmop-webhook");
    assert_eq!(binding["subjects"][0]["namespace"], "helmop-system");

    let bootstrap_secrets = [
        "helmop-webhook-tls",
        "helmop-webhook-ca",
        "helmop-apiserver-client",
    ];
    for (dir, configurations_written) in [
        ("base", false),
        ("cert-manager", false),
        ("self-signed", true),
        ("client-auth", true),
        ("stamping-only", true),
    ] {
        let docs = render(&manifests_dir().join(dir));
        let mut writes = BTreeSet::new();
        for (scope, rule) in bound_rules(&docs, "helmop-webhook") {
            let verbs = strings(&rule["verbs"]);
            if verbs.iter().all(|v| ["get", "list", "watch"].contains(v)) {
                continue;
            }
            let resources = strings(&rule["resources"]);
            let names = strings(&rule["resourceNames"]);
            for verb in &verbs {
                assert!(
                    ["get", "create", "update"].contains(verb),
                    "{dir}: the webhook may {verb}: {rule}"
                );
            }
            if resources == ["secrets"] {
                assert_eq!(scope.as_deref(), Some("helmop-system"), "{dir}: {rule}");
                if verbs.contains(&"update") {
                    assert!(
                        !names.is_empty() && names.iter().all(|n| bootstrap_secrets.contains(n)),
                        "{dir}: replaces Secrets beyond the bootstrap's own: {rule}"
                    );
                }
                for verb in verbs {
                    writes.insert(format!("{verb} secrets"));
                }
            } else {
                let mut sorted = resources.clone();
                sorted.sort_unstable();
                assert_eq!(
                    sorted,
                    [
                        "mutatingwebhookconfigurations",
                        "validatingwebhookconfigurations"
                    ],
                    "{dir}: {rule}"
                );
                assert_eq!(names, ["helmop-webhook"], "{dir}: {rule}");
                writes.insert("update webhook configurations".to_owned());
            }
        }
        assert!(writes.contains("create secrets"), "{dir}: {writes:?}");
        assert_eq!(
            writes.contains("update webhook configurations"),
            configurations_written,
            "{dir}: {writes:?}"
        );
    }
}

fn check_webhook(who: &str, w: &Value, service_ports: &[i64]) {
    assert_eq!(w["sideEffects"], "None", "{who}");
    assert_eq!(strings(&w["admissionReviewVersions"]), ["v1"], "{who}");
    let timeout = w["timeoutSeconds"].as_i64().unwrap_or(10);
    assert!(
        (1..=10).contains(&timeout),
        "{who}: timeoutSeconds {timeout}"
    );
    let excluded: Vec<&str> = w["namespaceSelector"]["matchExpressions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["key"] == "kubernetes.io/metadata.name" && e["operator"] == "NotIn")
        .flat_map(|e| strings(&e["values"]))
        .collect();
    for ns in ["kube-system", "helmop-system"] {
        assert!(
            excluded.contains(&ns),
            "{who}: {ns} not excluded: {excluded:?}"
        );
    }
    let svc = &w["clientConfig"]["service"];
    assert_eq!(svc["name"], "helmop-webhook", "{who}");
    assert_eq!(svc["namespace"], "helmop-system", "{who}");
    assert!(
        service_ports.contains(&svc["port"].as_i64().unwrap_or(443)),
        "{who}"
    );
}

#[test]
fn webhook_configurations_match_the_server() {
    for dir in ["base", "cert-manager", "self-signed"] {
        let docs = render(&manifests_dir().join(dir));
        let service = named(&docs, "Service", "helmop-webhook");
        let ports: Vec<i64> = service["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p["port"].as_i64())
            .collect();
        assert!(ports.contains(&443));

        let validating = named(&docs, "ValidatingWebhookConfiguration", "helmop-webhook");
        let mut paths = BTreeSet::new();
        for w in validating["webhooks"].as_array().unwrap() {
            let who = format!("{dir}: {}", w["name"]);
            check_webhook(&who, w, &ports);
            assert_eq!(w["failurePolicy"], "Fail", "{who}");
            let path = w["clientConfig"]["service"]["path"].as_str().unwrap();
            paths.insert(path.to_owned());
            let rules = &w["rules"].as_array().unwrap();
            let ops: BTreeSet<&str> = rules
                .iter()
                .flat_map(|r| strings(&r["operations"]))
                .collect();
            let resources: BTreeSet<&str> = rules
                .iter()
                .flat_map(|r| strings(&r["resources"]))
                .collect();
            match path {
                "/validate/helmops" => {
                    assert_eq!(
                        ops,
                        ["CREATE", "UPDATE"].into(),
                        "{who}: HelmOp DELETE is never denied"
                    );
                    assert_eq!(resources, ["helmops"].into(), "{who}");
                }
                "/validate/references" => {
                    assert_eq!(ops, ["DELETE"].into(), "{who}");
                    assert_eq!(resources, ["configmaps", "secrets"].into(), "{who}");
                }
                other => panic!("{who}: unexpected path {other}"),
            }
        }
        assert_eq!(paths.len(), 2);

        let mutating = named(&docs, "MutatingWebhookConfiguration", "helmop-webhook");
        let resources = check_mutating(dir, mutating);
        // Every kind the handler decodes, in every version it decodes: a version missing here is a
        // workload the API server never sends (batch/v1beta1 CronJobs on Kubernetes 1.20).
        let expected: BTreeSet<String> = WorkloadKind::ALL
            .into_iter()
            .filter(|k| *k != WorkloadKind::Pod)
            .flat_map(|k| {
                k.versions()
                    .iter()
                    .map(move |v| format!("{}/{v}/{}", k.group(), k.plural()))
            })
            .collect();
        assert!(expected.contains("batch/v1beta1/cronjobs"));
        assert_eq!(resources, expected, "{dir}");
    }
}

/// `group/version/resource` of every rule of a webhook entry.
fn rule_resources(who: &str, w: &Value) -> BTreeSet<String> {
    w["rules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| {
            let group = strings(&r["apiGroups"]).join(",");
            assert_eq!(strings(&r["operations"]), ["CREATE", "UPDATE"], "{who}");
            let versions = strings(&r["apiVersions"]);
            strings(&r["resources"])
                .into_iter()
                .flat_map(|res| {
                    let group = group.clone();
                    versions.iter().map(move |v| format!("{group}/{v}/{res}"))
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// `(key, operator, values)` of each match expression of a selector.
fn expressions(selector: &Value) -> Vec<(String, String, Vec<String>)> {
    selector["matchExpressions"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|e| {
            (
                e["key"].as_str().unwrap().to_owned(),
                e["operator"].as_str().unwrap().to_owned(),
                strings(&e["values"])
                    .into_iter()
                    .map(String::from)
                    .collect(),
            )
        })
        .collect()
}

fn expr(key: &str, operator: &str, values: &[&str]) -> (String, String, Vec<String>) {
    (
        key.to_owned(),
        operator.to_owned(),
        values.iter().map(|v| v.to_string()).collect(),
    )
}

/// The mutating configuration only ever sees opted-in workloads (docs/webhook-safety.md, "Failure
/// isolation"): one entry for namespaces labelled `enabled` (never ReplicaSets or Jobs, mostly
/// controllers' copies there), one for workloads labelled `"true"`, which never both match one object.
/// Returns the union of the kinds they send.
fn check_mutating(dir: &str, mutating: &Value) -> BTreeSet<String> {
    let hooks = mutating["webhooks"].as_array().unwrap();
    assert_eq!(hooks.len(), 2, "{dir}");
    let mut union = BTreeSet::new();
    for w in hooks {
        let who = format!("{dir}: {}", w["name"]);
        let ports = [443];
        check_webhook(&who, w, &ports);
        assert_eq!(w["failurePolicy"], "Ignore", "{who}");
        assert_eq!(w["reinvocationPolicy"], "IfNeeded", "{who}");
        assert_eq!(
            w["clientConfig"]["service"]["path"], "/mutate/workloads",
            "{who}"
        );
        let resources = rule_resources(&who, w);
        let namespaces = expressions(&w["namespaceSelector"]);
        let objects = expressions(&w["objectSelector"]);
        match w["name"].as_str().unwrap() {
            "workloads.mutate.helmop.dev" => {
                assert!(
                    namespaces.contains(&expr(LABEL, "In", &["enabled"])),
                    "{who}: {namespaces:?}"
                );
                assert_eq!(objects, [expr(LABEL, "NotIn", &["false", "true"])], "{who}");
                for copy in ["apps/v1/replicasets", "batch/v1/jobs"] {
                    assert!(!resources.contains(copy), "{who}: sends {copy}");
                }
            }
            "opted-in.workloads.mutate.helmop.dev" => {
                assert!(
                    !namespaces.iter().any(|(k, ..)| k == LABEL),
                    "{who}: {namespaces:?}"
                );
                assert_eq!(objects, [expr(LABEL, "In", &["true"])], "{who}");
            }
            other => panic!("{who}: unexpected webhook {other}"),
        }
        union.extend(resources);
    }
    union
}

const LABEL: &str = "helmop.dev/rollout-on-change";

/// The delete guard sees only namespaces labelled `helmop.dev/guard=enabled` (Fleet's workspaces), so
/// a webhook outage never blocks deletes, or namespace deletion, anywhere else.
#[test]
fn the_delete_guard_only_sees_labelled_namespaces() {
    for dir in ["base", "cert-manager", "self-signed", "client-auth"] {
        let docs = render(&manifests_dir().join(dir));
        let validating = named(&docs, "ValidatingWebhookConfiguration", "helmop-webhook");
        let guard = validating["webhooks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|w| w["name"] == "references.validate.helmop.dev")
            .unwrap_or_else(|| panic!("{dir}: no delete guard"));
        assert!(
            expressions(&guard["namespaceSelector"]).contains(&expr(
                "helmop.dev/guard",
                "In",
                &["enabled"]
            )),
            "{dir}: {}",
            guard["namespaceSelector"]
        );
    }
}

/// The downstream overlay: the stamping webhook as everywhere, no validation and no delete guard, and
/// the self-signed bootstrap still finds both configurations to inject its CA into.
#[test]
fn stamping_only_overlay_has_only_the_mutating_webhook() {
    let docs = render(&manifests_dir().join("stamping-only"));
    let validating = named(&docs, "ValidatingWebhookConfiguration", "helmop-webhook");
    assert_eq!(
        validating["webhooks"].as_array().map(Vec::len),
        Some(0),
        "{validating}"
    );
    let mutating = named(&docs, "MutatingWebhookConfiguration", "helmop-webhook");
    let full = render(&manifests_dir().join("self-signed"));
    assert_eq!(
        mutating,
        named(&full, "MutatingWebhookConfiguration", "helmop-webhook")
    );
    check_mutating("stamping-only", mutating);
    let deployment = named(&docs, "Deployment", "helmop-webhook");
    assert!(
        init_container(deployment, "tls").is_some(),
        "no tls initContainer"
    );
}

fn pod_spec(workload: &Value) -> &Value {
    match workload["kind"].as_str().unwrap() {
        "CronJob" => &workload["spec"]["jobTemplate"]["spec"]["template"]["spec"],
        _ => &workload["spec"]["template"]["spec"],
    }
}

#[test]
fn every_pod_is_non_root_read_only_and_capability_free() {
    for (who, workload) in all_workloads() {
        let workload = &workload;
        let pod = pod_spec(workload);
        assert_eq!(
            pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
            "{who}"
        );
        assert_ne!(pod["hostNetwork"], true, "{who}");
        for c in pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .chain(pod["initContainers"].as_array().into_iter().flatten())
        {
            let sc = &c["securityContext"];
            let non_root = sc["runAsNonRoot"] == true
                || (pod["securityContext"]["runAsNonRoot"] == true && sc["runAsNonRoot"] != false);
            assert!(non_root, "{who}/{}: runAsNonRoot", c["name"]);
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{who}/{}", c["name"]);
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{who}/{}", c["name"]);
            assert_eq!(
                strings(&sc["capabilities"]["drop"]),
                ["ALL"],
                "{who}/{}",
                c["name"]
            );
            assert!(sc["capabilities"]["add"].is_null(), "{who}/{}", c["name"]);
            assert_ne!(sc["privileged"], true, "{who}/{}", c["name"]);
            for r in ["requests", "limits"] {
                assert!(
                    c["resources"][r]["memory"].is_string(),
                    "{who}/{}: resources.{r}.memory",
                    c["name"]
                );
            }
        }
    }
}

#[test]
fn webhook_deployment_serves_what_the_configurations_call() {
    let docs = render(&manifests_dir().join("base"));
    let deployment = named(&docs, "Deployment", "helmop-webhook");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pdb = named(&docs, "PodDisruptionBudget", "helmop-webhook");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    // A broken replica never holds up a drain.
    assert_eq!(pdb["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow");
    assert_eq!(pdb["spec"]["selector"], deployment["spec"]["selector"]);
    let service = named(&docs, "Service", "helmop-webhook");
    assert_eq!(
        &service["spec"]["selector"],
        &deployment["spec"]["selector"]["matchLabels"]
    );

    let pod = pod_spec(deployment);
    assert_eq!(pod["serviceAccountName"], "helmop-webhook");
    let c = &pod["containers"][0];
    let mut argv = strings(&c["command"]);
    argv.extend(strings(&c["args"]));
    assert_eq!(argv[0], "helmop-webhook");
    let cli = Cli::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("Deployment args rejected by the binary: {e}"));

    let port = |name: &str| {
        c["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["name"] == name)
            .unwrap()["containerPort"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(u64::from(cli.listen.port()), port("webhook"));
    assert_eq!(u64::from(cli.admin_listen.port()), port("admin"));
    let target = service["spec"]["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == 443)
        .unwrap();
    assert_eq!(target["targetPort"], "webhook");
    for probe in ["livenessProbe", "readinessProbe", "startupProbe"] {
        assert_eq!(c[probe]["httpGet"]["port"], "admin", "{probe}");
    }
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");

    // The certificate files come from the TLS Secret volume.
    let mount = c["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "tls")
        .unwrap();
    let dir = Path::new(mount["mountPath"].as_str().unwrap());
    assert_eq!(cli.tls_cert, dir.join("tls.crt"));
    assert_eq!(cli.tls_key, dir.join("tls.key"));
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "tls")
        .unwrap();
    assert_eq!(volume["secret"]["secretName"], "helmop-webhook-tls");

    // Answer before the API server gives up: the deadline is below every timeoutSeconds.
    let smallest_timeout = [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ]
    .iter()
    .flat_map(|k| {
        named(&docs, k, "helmop-webhook")["webhooks"]
            .as_array()
            .unwrap()
            .clone()
    })
    .map(|w| w["timeoutSeconds"].as_u64().unwrap())
    .min()
    .unwrap();
    assert!(
        cli.request_timeout_ms < smallest_timeout * 1000,
        "{} ms",
        cli.request_timeout_ms
    );
    // Readiness drop, drain and exit fit in the grace period.
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    assert!(cli.shutdown_delay_seconds + 15 < grace);

    // The hash-key initContainer creates the Secret the webhook reads, before the webhook starts.
    let init = init_container(deployment, "hash-key").expect("no hash-key initContainer");
    let argv = strings(&init["command"]);
    let bootstrap = BootstrapCli::try_parse_from(&argv)
        .unwrap_or_else(|e| panic!("hash-key initContainer rejected: {e}"));
    match bootstrap.command {
        helmop_webhook::cli::BootstrapCommand::HashKey { secret } => {
            assert_eq!(secret, cli.hash_key_secret)
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn cert_manager_overlay_injects_the_ca_of_the_mounted_certificate() {
    let docs = render(&manifests_dir().join("cert-manager"));
    for kind in [
        "ValidatingWebhookConfiguration",
        "MutatingWebhookConfiguration",
    ] {
        let inject = named(&docs, kind, "helmop-webhook")["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
            .as_str()
            .unwrap_or_else(|| panic!("{kind} lacks cert-manager.io/inject-ca-from"));
        let (ns, name) = inject.split_once('/').unwrap();
        let cert = named(&docs, "Certificate", name);
        assert_eq!(cert["metadata"]["namespace"], ns);
        assert_eq!(cert["spec"]["secretName"], "helmop-webhook-tls");
        assert!(strings(&cert["spec"]["dnsNames"]).contains(&"helmop-webhook.helmop-system.svc"));
        let issuer = named(
            &docs,
            "Issuer",
            cert["spec"]["issuerRef"]["name"].as_str().unwrap(),
        );
        assert!(
            issuer["spec"]["ca"].is_object(),
            "serving certificate comes from a CA, so renewals keep the caBundle"
        );
    }
}

/// The initContainer of `workload` named `name`.
fn init_container<'a>(workload: &'a Value, name: &str) -> Option<&'a Value> {
    pod_spec(workload)["initContainers"]
        .as_array()?
        .iter()
        .find(|c| c["name"] == name)
}

/// No install ships a Job: its pod template is immutable, so re-applying a release with a new image
/// (kubectl apply, kustomize, GitOps) would fail on it. The bootstrap runs as initContainers instead.
#[test]
fn no_install_ships_a_job() {
    for dir in kustomizations() {
        let docs = render(&dir);
        assert!(
            of_kind(&docs, "Job").is_empty(),
            "{}: a Job cannot be re-applied with a new image",
            dir.display()
        );
    }
}

#[test]
fn self_signed_overlay_bootstraps_the_secret_the_deployment_mounts() {
    let docs = render(&manifests_dir().join("self-signed"));
    let deployment = named(&docs, "Deployment", "helmop-webhook");
    let cron = named(&docs, "CronJob", "helmop-tls-renew");
    let init = init_container(deployment, "tls").expect("no tls initContainer");
    for (who, argv, account) in [
        (
            "initContainer",
            strings(&init["command"]),
            pod_spec(deployment)["serviceAccountName"].as_str().unwrap(),
        ),
        (
            "CronJob",
            strings(&pod_spec(cron)["containers"][0]["command"]),
            pod_spec(cron)["serviceAccountName"].as_str().unwrap(),
        ),
    ] {
        let cli = BootstrapCli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{who}: {e}"));
        match cli.command {
            helmop_webhook::cli::BootstrapCommand::Tls {
                secret,
                ca_secret,
                client_secret,
                service,
                webhook_configuration,
                mounted_cert,
                ..
            } => {
                assert_eq!(secret.to_string(), "helmop-system/helmop-webhook-tls");
                assert_eq!(service, "helmop-webhook");
                assert_eq!(webhook_configuration, "helmop-webhook");
                if who == "initContainer" {
                    // It checks the file the webhook container reads, from the same volume.
                    let volume = pod_spec(deployment)["volumes"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|v| v["secret"]["secretName"] == secret.name.as_str())
                        .expect("the serving Secret is not mounted");
                    assert_eq!(volume["secret"]["optional"], true, "{volume}");
                    let mount = init["volumeMounts"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .find(|m| m["name"] == volume["name"])
                        .expect("the initContainer does not mount the serving Secret");
                    let webhook_args = strings(&pod_spec(deployment)["containers"][0]["args"]);
                    let served = flag_value(&webhook_args, "--tls-cert").unwrap();
                    assert_eq!(mounted_cert.as_deref(), Some(Path::new(served)), "{who}");
                    assert!(served.starts_with(mount["mountPath"].as_str().unwrap()));
                } else {
                    assert_eq!(mounted_cert, None, "{who}: a CronJob pod mounts nothing");
                }
                let rules: Vec<Value> = bound_rules(&docs, account)
                    .into_iter()
                    .map(|(_, rule)| rule)
                    .collect();
                let names: Vec<&str> = rules
                    .iter()
                    .flat_map(|r| strings(&r["resourceNames"]))
                    .collect();
                assert!(
                    names.contains(&secret.name.as_str())
                        && names.contains(&ca_secret.name.as_str())
                        && names.contains(&client_secret.name.as_str())
                        && names.contains(&webhook_configuration.as_str()),
                    "{who}: {names:?}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    let cluster_role = named(&docs, "ClusterRole", "helmop-tls-bootstrap");
    for rule in cluster_role["rules"].as_array().unwrap() {
        assert_eq!(
            strings(&rule["resourceNames"]),
            ["helmop-webhook"],
            "{rule}"
        );
    }
}

#[test]
fn network_policy_admits_the_admission_port_only_from_outside_the_pod_network() {
    for dir in kustomizations() {
        let docs = render(&dir);
        if of_kind(&docs, "Deployment")
            .iter()
            .all(|d| d["metadata"]["name"] != "helmop-webhook")
        {
            continue;
        }
        // Opt-in: a wrong pod CIDR would block the API server, so no install ships the policy.
        assert!(
            of_kind(&docs, "NetworkPolicy").is_empty(),
            "{}: the NetworkPolicy is the network-policy component's",
            dir.display()
        );
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        let docs = render_overlay(&[name], &["network-policy"]);
        let policy = named(&docs, "NetworkPolicy", "helmop-webhook");
        assert_eq!(
            policy["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/name"],
            "helmop-webhook",
            "{}",
            dir.display()
        );
        assert_eq!(strings(&policy["spec"]["policyTypes"]), ["Ingress"]);
        let admission: Vec<&Value> = policy["spec"]["ingress"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|rule| {
                rule["ports"]
                    .as_array()
                    .is_some_and(|ports| ports.iter().any(|p| p["port"] == 8443))
            })
            .collect();
        assert_eq!(admission.len(), 1, "{}", dir.display());
        let from = admission[0]["from"]
            .as_array()
            .expect("a source restriction");
        assert!(!from.is_empty());
        for source in from {
            // Addresses only, each with the pod network excepted: no pod or namespace selector admits pods.
            assert!(
                source.get("podSelector").is_none() && source.get("namespaceSelector").is_none()
            );
            assert!(
                !strings(&source["ipBlock"]["except"]).is_empty(),
                "{source}"
            );
        }
    }
}

#[test]
fn client_auth_overlay_requires_the_ca_of_the_mounted_secret() {
    let docs = render(&manifests_dir().join("client-auth"));
    let deployment = named(&docs, "Deployment", "helmop-webhook");
    let container = &pod_spec(deployment)["containers"][0];
    let mut argv = vec!["helmop-webhook"];
    argv.extend(strings(&container["args"]));
    let cli = Cli::try_parse_from(&argv).unwrap();
    assert_eq!(
        cli.client_ca.as_deref(),
        Some(Path::new("/tls/ca.crt")),
        "{argv:?}"
    );
    // /tls is the serving Secret, which the bootstrap writes with ca.crt (the CA of the client certificate).
    let mounts = container["volumeMounts"].as_array().unwrap();
    assert!(mounts.iter().any(|m| m["mountPath"] == "/tls"));
    // The bootstrap may manage the client certificate Secret.
    let role = named(&docs, "Role", "helmop-tls-bootstrap");
    assert!(
        role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| strings(&r["resourceNames"]).contains(&"helmop-apiserver-client"))
    );
    // Without the overlay, client certificates stay optional.
    let plain = render(&manifests_dir().join("self-signed"));
    let args =
        strings(&pod_spec(named(&plain, "Deployment", "helmop-webhook"))["containers"][0]["args"]);
    assert!(
        !args.iter().any(|a| a.starts_with("--client-ca")),
        "{args:?}"
    );
}

/// The container's environment variable `name`, whole (`value` or `valueFrom`).
fn env_var<'a>(container: &'a Value, name: &str) -> Option<&'a Value> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)
}

#[test]
fn propagator_serves_metrics_and_probes_where_the_manifests_look() {
    let docs = render(&manifests_dir().join("propagator"));
    let deployment = named(&docs, "Deployment", "helmop-propagator");
    let pod = pod_spec(deployment);
    let c = &pod["containers"][0];
    let args = strings(&c["args"]);
    assert!(args.contains(&"--watch"), "{args:?}");
    let port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a container port named metrics");
    let number = port["containerPort"].as_i64().unwrap();
    assert!(
        args.contains(&format!("--metrics-addr=:{number}").as_str()),
        "the listener must be on the declared port {number}: {args:?}"
    );
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], number.to_string());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    // The edit latency the benchmark measured at 10,000 clusters (docs/performance.md, section 6) is
    // with glibc's larger thread cache; `helmop-bench watch` starts the watcher with the same variable.
    assert_eq!(
        env_var(c, "GLIBC_TUNABLES").map(|e| &e["value"]),
        Some(&serde_json::json!("glibc.malloc.tcache_count=4096")),
        "{c:#}"
    );

    let service = named(&docs, "Service", "helmop-propagator-metrics");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");

    // Events on HelmOps: create only, in the events.k8s.io group the propagator uses.
    let role = named(&docs, "ClusterRole", "helmop-propagator");
    let events: Vec<&Value> = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| strings(&r["resources"]).contains(&"events"))
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(strings(&events[0]["apiGroups"]), ["events.k8s.io"]);
    assert_eq!(strings(&events[0]["verbs"]), ["create"]);
}

/// `manifests/propagator-shards` on top of `manifests/propagator`: the propagator as it is, plus per shard a
/// Deployment that differs only by `--shard-id=ID` and a selector of its own, and a Role granting get/update on
/// exactly the Lease that shard elects on (`kubectl-helmop-propagate-shard-ID`, the name the plugin derives
/// for an `-A` watcher of that shard) to the propagator's ServiceAccount.
#[test]
fn propagator_shards_add_one_deployment_and_lease_per_shard() {
    let plain = render(&manifests_dir().join("propagator"));
    let sharded = render_overlay(&["propagator"], &["propagator-shards"]);
    let shard_of = |d: &Value| {
        d["metadata"]["labels"]["helmop.dev/shard"]
            .as_str()
            .map(str::to_owned)
    };
    // Everything of the plain install is there unchanged.
    let unsharded: Vec<&Value> = sharded.iter().filter(|d| shard_of(d).is_none()).collect();
    assert_eq!(unsharded, plain.iter().collect::<Vec<_>>());

    let default = named(&plain, "Deployment", "helmop-propagator");
    let default_args = strings(&pod_spec(default)["containers"][0]["args"]);
    let mut ids = BTreeSet::new();
    let mut selectors = vec![default["spec"]["selector"].clone()];
    for deployment in of_kind(&sharded, "Deployment") {
        let Some(id) = shard_of(deployment) else {
            continue;
        };
        let who = name_of(deployment);
        assert_eq!(
            deployment["metadata"]["name"],
            format!("helmop-propagator-{id}").as_str()
        );
        let args = strings(&pod_spec(deployment)["containers"][0]["args"]);
        let shard_flag = format!("--shard-id={id}");
        let rest: Vec<&str> = args.iter().copied().filter(|a| *a != shard_flag).collect();
        assert_eq!(rest, default_args, "{who}: only --shard-id may differ");
        assert_eq!(args.len(), default_args.len() + 1, "{who}: {args:?}");
        let mut pod = pod_spec(deployment).clone();
        let mut default_pod = pod_spec(default).clone();
        for p in [&mut pod, &mut default_pod] {
            p["containers"][0]["args"] = Value::Null;
            p["affinity"] = Value::Null;
        }
        assert_eq!(pod, default_pod, "{who}: the pod differs beyond its args");
        let template = &deployment["spec"]["template"]["metadata"]["labels"];
        assert_eq!(
            template["app.kubernetes.io/name"], "helmop-propagator",
            "{who}"
        );
        assert_eq!(
            deployment["spec"]["selector"]["matchLabels"]["helmop.dev/shard"],
            id.as_str()
        );
        assert!(
            !selectors.contains(&deployment["spec"]["selector"]),
            "{who}: selector shared"
        );
        selectors.push(deployment["spec"]["selector"].clone());

        let role = named(&sharded, "Role", &format!("helmop-propagator-lease-{id}"));
        let rules = role["rules"].as_array().unwrap();
        assert_eq!(rules.len(), 1, "{who}: {rules:?}");
        assert_eq!(strings(&rules[0]["resources"]), ["leases"]);
        assert_eq!(strings(&rules[0]["verbs"]), ["get", "update"]);
        assert_eq!(
            strings(&rules[0]["resourceNames"]),
            [format!("kubectl-helmop-propagate-shard-{id}").as_str()]
        );
        let binding = named(
            &sharded,
            "RoleBinding",
            &format!("helmop-propagator-lease-{id}"),
        );
        assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
        assert_eq!(
            binding["subjects"][0]["name"],
            pod_spec(deployment)["serviceAccountName"]
        );
        assert!(ids.insert(id), "two Deployments of one shard");
    }
    assert_eq!(
        ids,
        BTreeSet::from(["shard0".to_owned(), "shard1".to_owned()])
    );
}

/// The value of `flag` in `args`, written `FLAG VALUE` or `FLAG=VALUE`.
fn flag_value<'a>(args: &[&'a str], flag: &str) -> Option<&'a str> {
    args.iter().enumerate().find_map(|(i, a)| {
        if *a == flag {
            args.get(i + 1).copied()
        } else {
            a.strip_prefix(flag).and_then(|rest| rest.strip_prefix('='))
        }
    })
}

/// `(apiGroup, resource)` -> verbs, over every rule of `roles`.
fn grants(roles: &[&Value]) -> std::collections::BTreeMap<(String, String), BTreeSet<String>> {
    let mut granted = std::collections::BTreeMap::<_, BTreeSet<String>>::new();
    for role in roles {
        for rule in role["rules"].as_array().unwrap() {
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    granted
                        .entry((group.to_owned(), resource.to_owned()))
                        .or_default()
                        .extend(strings(&rule["verbs"]).into_iter().map(String::from));
                }
            }
        }
    }
    granted
}

/// `kubectl helmop rollout -A --watch` in the cluster (manifests/rollout-watcher): the command line the
/// plugin takes, probes and scrape targets on the port it listens on, and RBAC that lets it restamp
/// workloads and nothing else.
#[test]
fn rollout_watcher_serves_metrics_and_probes_where_the_manifests_look() {
    let docs = render(&manifests_dir().join("rollout-watcher"));
    let deployment = named(&docs, "Deployment", "helmop-rollout-watcher");
    assert_eq!(deployment["spec"]["replicas"], 2);
    let pod = pod_spec(deployment);
    let c = &pod["containers"][0];
    assert_eq!(strings(&c["command"]), ["kubectl-helmop"]);
    let args = strings(&c["args"]);
    assert_eq!(args.first(), Some(&"rollout"), "{args:?}");
    for flag in ["-A", "--watch"] {
        assert!(args.contains(&flag), "{flag} missing: {args:?}");
    }
    assert_eq!(
        flag_value(&args, "-o").or(flag_value(&args, "--output")),
        Some("json"),
        "{args:?}"
    );
    let port = c["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a container port named metrics");
    let number = port["containerPort"].as_i64().unwrap();
    assert_eq!(
        flag_value(&args, "--metrics-addr"),
        Some(format!(":{number}").as_str()),
        "the listener must be on the declared port {number}: {args:?}"
    );
    for (probe, path) in [("livenessProbe", "/livez"), ("readinessProbe", "/readyz")] {
        assert_eq!(c[probe]["httpGet"]["path"], path, "{probe}");
        assert_eq!(c[probe]["httpGet"]["port"], "metrics", "{probe}");
    }
    let annotations = &deployment["spec"]["template"]["metadata"]["annotations"];
    assert_eq!(annotations["prometheus.io/scrape"], "true");
    assert_eq!(annotations["prometheus.io/port"], number.to_string());
    assert_eq!(annotations["prometheus.io/path"], "/metrics");
    let service = named(&docs, "Service", "helmop-rollout-watcher-metrics");
    assert_eq!(
        service["spec"]["selector"],
        deployment["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(service["spec"]["ports"][0]["targetPort"], "metrics");
    assert_eq!(c["resources"]["limits"]["memory"], "128Mi");
    assert_eq!(c["resources"]["limits"]["cpu"], "500m");
    // The RSS the benchmark measured (docs/performance.md, section 8) is with one glibc arena.
    assert_eq!(
        env_var(c, "MALLOC_ARENA_MAX").map(|e| &e["value"]),
        Some(&serde_json::json!("1")),
        "{c:#}"
    );

    // The Lease is in the pod's namespace, which comes from the downward API.
    let pod_namespace = env_var(c, "POD_NAMESPACE").expect("POD_NAMESPACE");
    assert_eq!(
        pod_namespace["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.namespace"
    );
    assert_eq!(deployment["metadata"]["namespace"], "helmop-system");
    assert_eq!(flag_value(&args, "--lease-namespace"), None, "{args:?}");
    let lease = flag_value(&args, "--lease-name").unwrap_or("kubectl-helmop-rollout");
    assert_eq!(lease, "kubectl-helmop-rollout");

    // Every binding is to the Deployment's ServiceAccount, every role is bound.
    let account = pod["serviceAccountName"].as_str().unwrap();
    named(&docs, "ServiceAccount", account);
    let mut bound = BTreeSet::new();
    for binding in of_kind(&docs, "ClusterRoleBinding")
        .into_iter()
        .chain(of_kind(&docs, "RoleBinding"))
    {
        let who = name_of(binding);
        let subjects = binding["subjects"].as_array().unwrap();
        assert_eq!(subjects.len(), 1, "{who}");
        assert_eq!(subjects[0]["kind"], "ServiceAccount", "{who}");
        assert_eq!(subjects[0]["name"], account, "{who}");
        assert_eq!(subjects[0]["namespace"], "helmop-system", "{who}");
        let role_kind = binding["roleRef"]["kind"].as_str().unwrap();
        if binding["kind"] == "ClusterRoleBinding" {
            assert_eq!(role_kind, "ClusterRole", "{who}");
        }
        bound.insert((
            role_kind.to_owned(),
            binding["roleRef"]["name"].as_str().unwrap().to_owned(),
        ));
    }
    let roles: BTreeSet<(String, String)> = of_kind(&docs, "ClusterRole")
        .into_iter()
        .chain(of_kind(&docs, "Role"))
        .map(|r| {
            (
                r["kind"].as_str().unwrap().to_owned(),
                r["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(bound, roles);

    // Cluster-wide: read what pods read and the namespace opt-in, patch (the restamp annotation) only the
    // workload kinds that roll on a new pod template: not ReplicaSets (a template change replaces no
    // pod), Jobs (immutable template) or Pods. Events: create only.
    let cluster_roles = of_kind(&docs, "ClusterRole");
    for role in &cluster_roles {
        for rule in role["rules"].as_array().unwrap() {
            assert!(rule.get("resourceNames").is_none(), "{rule}");
        }
    }
    let granted = grants(&cluster_roles);
    let set = |verbs: &[&str]| verbs.iter().map(|v| v.to_string()).collect::<BTreeSet<_>>();
    let key = |group: &str, resource: &str| (group.to_owned(), resource.to_owned());
    let patched: BTreeSet<(String, String)> = granted
        .iter()
        .filter(|(_, verbs)| verbs.contains("patch"))
        .map(|(k, _)| k.clone())
        .collect();
    let workloads: BTreeSet<(String, String)> = WorkloadKind::ALL
        .into_iter()
        .filter(|k| {
            ![
                WorkloadKind::ReplicaSet,
                WorkloadKind::Job,
                WorkloadKind::Pod,
            ]
            .contains(k)
        })
        .map(|k| key(k.group(), k.plural()))
        .collect();
    assert_eq!(patched, workloads);
    for workload in &workloads {
        assert_eq!(
            granted[workload],
            set(&["get", "list", "watch", "patch"]),
            "{workload:?}"
        );
    }
    for resource in ["secrets", "configmaps", "namespaces"] {
        assert_eq!(
            granted.get(&key("", resource)),
            Some(&set(&["get", "list", "watch"])),
            "{resource}: read-only"
        );
    }
    assert_eq!(
        granted.get(&key("events.k8s.io", "events")),
        Some(&set(&["create"]))
    );
    // `--images`: the pull secrets of a pod's ServiceAccount, read as the kubelet reads them.
    assert_eq!(
        granted.get(&key("", "serviceaccounts")),
        Some(&set(&["get"])),
        "serviceaccounts: get only"
    );
    // The webhook configuration it reads to skip what the webhook never stamps: read-only.
    assert_eq!(
        granted.get(&key(
            "admissionregistration.k8s.io",
            "mutatingwebhookconfigurations"
        )),
        Some(&set(&["get", "list", "watch"])),
        "mutatingwebhookconfigurations: read-only"
    );
    assert_eq!(
        granted.len(),
        workloads.len() + 6,
        "nothing else is granted: {granted:?}"
    );

    // Namespaced: only its Lease, in helmop-system.
    for role in of_kind(&docs, "Role") {
        assert_eq!(role["metadata"]["namespace"], "helmop-system");
        for rule in role["rules"].as_array().unwrap() {
            assert_eq!(
                strings(&rule["apiGroups"]),
                ["coordination.k8s.io"],
                "{rule}"
            );
            assert_eq!(strings(&rule["resources"]), ["leases"], "{rule}");
            let verbs = strings(&rule["verbs"]);
            if verbs == ["create"] {
                // create cannot be limited by name
                continue;
            }
            assert_eq!(strings(&rule["resourceNames"]), [lease], "{rule}");
            assert!(
                verbs.iter().all(|v| ["get", "update"].contains(v)),
                "{rule}"
            );
        }
    }
    let lease_grants = grants(&of_kind(&docs, "Role"));
    assert_eq!(
        lease_grants.get(&key("coordination.k8s.io", "leases")),
        Some(&set(&["create", "get", "update"]))
    );

    // It computes expected stamps with the key the webhook stamps with.
    let base = render(&manifests_dir().join("base"));
    let webhook = &pod_spec(named(&base, "Deployment", "helmop-webhook"))["containers"][0];
    let mut argv = strings(&webhook["command"]);
    argv.extend(strings(&webhook["args"]));
    let cli = Cli::try_parse_from(&argv).unwrap();
    assert_eq!(
        flag_value(&args, "--hash-key-secret").unwrap_or("helmop-system/helmop-hash-key"),
        cli.hash_key_secret.to_string()
    );
}

/// The watcher runs next to the webhook, downstream (stamping-only) and on the management cluster, also
/// combined in one overlay and on 1.20: no object clashes, and the namespace and hash key it relies on
/// come from the webhook's part.
#[test]
fn rollout_watcher_combines_with_the_webhook_overlays() {
    let alone = render(&manifests_dir().join("rollout-watcher"));
    let watcher = named(&alone, "Deployment", "helmop-rollout-watcher");
    let cases: [(&[&str], &[&str]); 4] = [
        (&["stamping-only", "rollout-watcher"], &[]),
        (&["stamping-only", "rollout-watcher"], &["kube-1.20"]),
        (&["self-signed", "propagator", "rollout-watcher"], &[]),
        (
            &["cert-manager", "propagator", "rollout-watcher"],
            &["kube-1.20"],
        ),
    ];
    for (dirs, components) in cases {
        let who = format!("{dirs:?} + {components:?}");
        let docs = render_overlay(dirs, components);
        let parts: usize = dirs
            .iter()
            .map(|d| render(&manifests_dir().join(d)).len())
            .sum();
        assert_eq!(docs.len(), parts, "{who}");
        assert_eq!(
            named(&docs, "Deployment", "helmop-rollout-watcher"),
            watcher,
            "{who}"
        );
        named(&docs, "Namespace", "helmop-system");
        let webhook = named(&docs, "Deployment", "helmop-webhook");
        let init = init_container(webhook, "hash-key").expect("no hash-key initContainer");
        let argv = strings(&init["command"]);
        match BootstrapCli::try_parse_from(&argv).unwrap().command {
            helmop_webhook::cli::BootstrapCommand::HashKey { secret } => {
                let args = strings(&pod_spec(watcher)["containers"][0]["args"]);
                assert_eq!(
                    flag_value(&args, "--hash-key-secret"),
                    Some(secret.to_string().as_str()),
                    "{who}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}

/// The two images `containers/build` (`./dev image`) makes, at the workspace version: every container of every
/// install directory runs one of them, and its command is a binary that image ships. Users retarget them with
/// kustomize `images:` under exactly these names.
#[test]
fn every_container_runs_a_shipped_image_and_binary() {
    let version = env!("CARGO_PKG_VERSION");
    let webhook = format!("ghcr.io/helmop/helmop-webhook:{version}");
    let propagator = format!("ghcr.io/helmop/kubectl-helmop:{version}");
    let mut seen = BTreeSet::new();
    for (who, workload) in all_workloads() {
        let workload = &workload;
        let pod = pod_spec(workload);
        for c in pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .chain(pod["initContainers"].as_array().into_iter().flatten())
        {
            let image = c["image"].as_str().unwrap_or("");
            let binaries: &[&str] = if image == webhook {
                &["helmop-webhook", "helmop-bootstrap"]
            } else if image == propagator {
                &["kubectl-helmop"]
            } else {
                panic!("{who}: image {image:?} is neither {webhook} nor {propagator}")
            };
            let command = strings(&c["command"]);
            assert!(
                command.first().is_some_and(|b| binaries.contains(b)),
                "{who}: command {command:?} is not one of {binaries:?} in {image}"
            );
            seen.insert(image.to_owned());
        }
    }
    assert_eq!(seen, BTreeSet::from([webhook, propagator]));
}

/// A path to `to` relative to `from` (kustomize refuses absolute paths to other kustomizations).
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from = from.canonicalize().unwrap();
    let to = to.canonicalize().unwrap();
    let mut rel = PathBuf::new();
    for _ in from.components().skip(1) {
        rel.push("..");
    }
    rel.join(to.strip_prefix("/").unwrap())
}

/// Renders a user's overlay listing the install directories `dirs` under `resources:` and `components`
/// under `components:`, as manifests/README.md tells users to combine them.
fn render_overlay(dirs: &[&str], components: &[&str]) -> Vec<Value> {
    let overlay = tempfile::tempdir().unwrap();
    let list = |names: &[&str]| {
        names
            .iter()
            .map(|n| {
                let path = relative(overlay.path(), &manifests_dir().join(n));
                format!("  - {}\n", path.display())
            })
            .collect::<String>()
    };
    let mut text = format!("resources:\n{}", list(dirs));
    if !components.is_empty() {
        text.push_str(&format!("components:\n{}", list(components)));
    }
    std::fs::write(overlay.path().join("kustomization.yaml"), text).unwrap();
    render(overlay.path())
}

/// Renders an overlay of `dir` with the `kube-1.20` component, as manifests/README.md tells 1.20 users.
fn render_for_1_20(dir: &str) -> Vec<Value> {
    render_overlay(&[dir], &["kube-1.20"])
}

/// 1.20 serves CronJob and PodDisruptionBudget only as v1beta1 (removed in 1.25): the component changes
/// those API versions and nothing else.
#[test]
fn kube_1_20_component_only_downgrades_cronjob_and_pdb_versions() {
    for dir in [
        "self-signed",
        "stamping-only",
        "client-auth",
        "cert-manager",
        "propagator",
        "rollout-watcher",
    ] {
        let current = render(&manifests_dir().join(dir));
        let old = render_for_1_20(dir);
        assert_eq!(current.len(), old.len(), "{dir}");
        for (new, old) in current.iter().zip(&old) {
            let expected = match (new["apiVersion"].as_str(), new["kind"].as_str()) {
                (Some("batch/v1"), Some("CronJob")) => "batch/v1beta1",
                (Some("policy/v1"), Some("PodDisruptionBudget")) => "policy/v1beta1",
                (Some(v), _) => v,
                (None, _) => panic!("{dir}: {} has no apiVersion", name_of(new)),
            };
            assert_eq!(old["apiVersion"], expected, "{dir}: {}", name_of(new));
            let mut old = old.clone();
            old["apiVersion"] = new["apiVersion"].clone();
            let mut new = new.clone();
            if new["kind"] == "PodDisruptionBudget" {
                // Kubernetes 1.26+ only: dropped for 1.20.
                assert_eq!(
                    new["spec"]["unhealthyPodEvictionPolicy"], "AlwaysAllow",
                    "{dir}"
                );
                assert!(
                    old["spec"].get("unhealthyPodEvictionPolicy").is_none(),
                    "{dir}"
                );
                if let Some(spec) = new["spec"].as_object_mut() {
                    spec.remove("unhealthyPodEvictionPolicy");
                }
            }
            assert_eq!(old, new, "{dir}: {}", name_of(&new));
        }
        for doc in &old {
            let version = doc["apiVersion"].as_str().unwrap_or("");
            assert!(
                !matches!(version, "batch/v1" if doc["kind"] == "CronJob")
                    && !matches!(version, "policy/v1" if doc["kind"] == "PodDisruptionBudget"),
                "{dir}: {} still {version}",
                name_of(doc)
            );
        }
    }
    let signed = render_for_1_20("self-signed");
    assert!(
        of_kind(&signed, "CronJob")
            .iter()
            .all(|c| c["apiVersion"] == "batch/v1beta1")
    );
    assert!(!of_kind(&signed, "CronJob").is_empty());
}

/// On 1.20 the name label can be set by whoever may update a Namespace, so `kube-1.20-strict` removes
/// the exclusion by that label from every entry of a full install and changes nothing else.
#[test]
fn kube_1_20_strict_component_drops_only_the_name_label_exclusion() {
    for dir in ["self-signed", "cert-manager", "client-auth"] {
        let plain = render_for_1_20(dir);
        let strict = render_overlay(&[dir], &["kube-1.20", "kube-1.20-strict"]);
        assert_eq!(plain.len(), strict.len(), "{dir}");
        let mut entries = 0;
        for (p, s) in plain.iter().zip(&strict) {
            let kind = p["kind"].as_str().unwrap_or("");
            if !kind.ends_with("WebhookConfiguration") {
                assert_eq!(p, s, "{dir}: {}", name_of(p));
                continue;
            }
            for (pw, sw) in p["webhooks"]
                .as_array()
                .unwrap()
                .iter()
                .zip(s["webhooks"].as_array().unwrap())
            {
                entries += 1;
                let mut expected = pw.clone();
                let kept: Vec<Value> = pw["namespaceSelector"]["matchExpressions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|e| e["key"] != "kubernetes.io/metadata.name")
                    .cloned()
                    .collect();
                expected["namespaceSelector"]["matchExpressions"] = Value::Array(kept);
                assert_eq!(&expected, sw, "{dir}: {}", pw["name"]);
            }
        }
        assert_eq!(entries, 4, "{dir}");
    }
}

/// `deploy/<flavour>.yaml`, what the README's install lines apply, is `kubectl kustomize` of its overlay.
#[test]
fn the_rendered_install_files_are_current() {
    let script = manifests_dir().join("../scripts/render-manifests");
    let out = Command::new(&script)
        .arg("--check")
        .output()
        .expect("scripts/render-manifests runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for flavour in [
        "self-signed",
        "cert-manager",
        "stamping-only",
        "propagator",
        "rollout-watcher",
    ] {
        let file = manifests_dir().join(format!("../deploy/{flavour}.yaml"));
        let text = std::fs::read_to_string(&file).expect("a rendered file per flavour");
        let docs: Vec<Value> = serde_saphyr::from_multiple::<Value>(&text)
            .expect("the rendered file is YAML")
            .into_iter()
            .filter(|v| !v.is_null())
            .collect();
        assert_eq!(docs, render(&manifests_dir().join(flavour)), "{flavour}");
    }
}

// ---- manifests/monitoring: scrape targets, alerts and dashboard -------------------------------------

/// What `/metrics` of the helmop processes can expose, read from the registrations in the code, so that a
/// renamed metric or label fails here rather than leaving an alert that never fires.
struct Registered {
    /// Sample names as exposed (`_total` of counters, `_bucket`/`_sum`/`_count` of histograms, `_info`)
    /// with the label names the code gives them.
    samples: std::collections::BTreeMap<String, BTreeSet<String>>,
    /// Names as registered (a histogram's base name, as the docs and descriptions quote it).
    families: BTreeSet<String>,
    /// The non-test source, to look label values up as string literals.
    source: String,
}

/// Labels Prometheus (and the Prometheus Operator, for a PodMonitor) puts on every scraped sample.
const TARGET_LABELS: [&str; 6] = [
    "job",
    "instance",
    "namespace",
    "pod",
    "container",
    "endpoint",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The arguments of the call whose `(` ends just before `text`, split at top-level commas; string
/// literals (help texts hold parentheses and commas) are kept whole.
fn call_args(text: &str) -> Vec<String> {
    let (mut args, mut current) = (Vec::new(), String::new());
    let (mut depth, mut in_str, mut escaped) = (0usize, false, false);
    for c in text.chars() {
        if in_str {
            current.push(c);
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_str = true;
                current.push(c);
            }
            '(' | '[' | '{' => {
                depth += 1;
                current.push(c);
            }
            ')' | ']' | '}' if depth == 0 => break,
            ')' | ']' | '}' => {
                depth -= 1;
                current.push(c);
            }
            ',' if depth == 0 => args.push(std::mem::take(&mut current).trim().to_owned()),
            _ => current.push(c),
        }
    }
    if !current.trim().is_empty() {
        args.push(current.trim().to_owned());
    }
    args
}

/// The field names of `struct name { ... }` in `text`: a label set's label names.
fn struct_fields(text: &str, name: &str) -> BTreeSet<String> {
    let start = text
        .find(&format!("struct {name} {{"))
        .unwrap_or_else(|| panic!("label struct {name} not found next to its registration"));
    let body = &text[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    body.lines()
        .map(str::trim)
        .filter(|l| !l.starts_with("//") && !l.starts_with('#') && l.contains(':'))
        .map(|l| {
            let l = l.strip_prefix("pub ").unwrap_or(l);
            l[..l.find(':').unwrap()].trim().to_owned()
        })
        .collect()
}

fn registered_metrics() -> Registered {
    let root = manifests_dir().join("..");
    let mut files = Vec::new();
    for dir in ["webhook/src", "plugin/src", "core/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    let mut registered = Registered {
        samples: Default::default(),
        families: BTreeSet::new(),
        source: String::new(),
    };
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        // Unit tests register throwaway metrics; only what the processes register counts.
        let text = match text.find("#[cfg(test)]") {
            Some(at) => text[..at].to_owned(),
            None => text,
        };
        let prefix = text.find("Registry::with_prefix(\"").map(|at| {
            let rest = &text[at + "Registry::with_prefix(\"".len()..];
            format!("{}_", &rest[..rest.find('"').unwrap()])
        });
        for (at, _) in text.match_indices(".register(") {
            let args = call_args(&text[at + ".register(".len()..]);
            let who = format!("{}: register({})", file.display(), args.join(", "));
            assert_eq!(args.len(), 3, "{who}: expected name, help, metric");
            let name = args[0].trim_matches('"');
            assert!(
                args[0].starts_with('"') && !name.contains('"'),
                "{who}: the name must be a literal"
            );
            let name = format!("{}{name}", prefix.as_deref().unwrap_or(""));
            let metric = args[2].as_str();
            let (kind, labels) = if metric.starts_with("Info::new") {
                let labels = metric
                    .match_indices("(\"")
                    .map(|(i, _)| {
                        let rest = &metric[i + 2..];
                        rest[..rest.find('"').unwrap()].to_owned()
                    })
                    .collect();
                ("info", labels)
            } else {
                let ident = metric.strip_suffix(".clone()").unwrap_or_else(|| {
                    panic!("{who}: expected `VARIABLE.clone()` or `Info::new(..)`")
                });
                let decl = text[..at]
                    .rfind(&format!("let {ident} = "))
                    .unwrap_or_else(|| panic!("{who}: `let {ident} = ` not found before it"));
                let stmt = &text[decl..];
                let stmt = &stmt[..stmt.find(';').unwrap()];
                let kind = ["Counter", "Gauge", "Histogram"]
                    .into_iter()
                    .filter_map(|k| stmt.find(k).map(|i| (i, k)))
                    .min()
                    .unwrap_or_else(|| panic!("{who}: unknown metric type in `{stmt}`"))
                    .1;
                let labels = match stmt.find("Family::<") {
                    Some(i) => {
                        let rest = &stmt[i + "Family::<".len()..];
                        struct_fields(&text, rest[..rest.find(',').unwrap()].trim())
                    }
                    None => BTreeSet::new(),
                };
                (kind, labels)
            };
            let suffixes: &[&str] = match kind {
                "Counter" => &["_total"],
                "Gauge" => &[""],
                "Histogram" => &["_bucket", "_sum", "_count"],
                _ => &["_info"],
            };
            for suffix in suffixes {
                let mut labels = labels.clone();
                if *suffix == "_bucket" {
                    labels.insert("le".to_owned());
                }
                registered.samples.insert(format!("{name}{suffix}"), labels);
            }
            registered.families.insert(name);
        }
        registered.source.push_str(&text);
    }
    for expected in [
        "helmop_webhook_requests_total",
        "helmop_propagator_last_success_timestamp_seconds",
        "helmop_rollout_lag_seconds_bucket",
        "helmop_propagator_build_info",
    ] {
        assert!(
            registered.samples.contains_key(expected),
            "the registration scan missed {expected}: {:?}",
            registered.samples.keys()
        );
    }
    registered
}

/// Every `helmop_*` word of `text`.
fn helmop_names(text: &str) -> Vec<&str> {
    let is_name = |c: char| c.is_ascii_alphanumeric() || c == '_';
    text.match_indices("helmop_")
        .filter(|(i, _)| *i == 0 || !text[..*i].ends_with(is_name))
        .map(|(i, _)| {
            let rest = &text[i..];
            &rest[..rest.find(|c: char| !is_name(c)).unwrap_or(rest.len())]
        })
        .collect()
}

/// Checks one PromQL expression against the code: every `helmop_*` metric is exposed under that name,
/// every label matched or grouped by is one of its labels (or a target label), and every value matched
/// by `=`/`=~` is a string literal of the code (`outcome="panic"` stays true to `Outcome::as_str`).
fn check_promql(who: &str, expr: &str, registered: &Registered) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    let mut in_scope: BTreeSet<String> = TARGET_LABELS.iter().map(|l| l.to_string()).collect();
    let chars: Vec<char> = expr.chars().collect();
    let mut words: Vec<(String, usize)> = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            words.push((chars[start..i].iter().collect(), i));
        } else {
            i += 1;
        }
    }
    let after = |end: usize| {
        chars[end..]
            .iter()
            .position(|c| !c.is_whitespace())
            .map(|p| (end + p, chars[end + p]))
    };
    let mut grouped = Vec::new();
    for (word, end) in &words {
        let next = after(*end);
        if word.starts_with("helmop_") {
            let labels = registered
                .samples
                .get(word)
                .unwrap_or_else(|| panic!("{who}: {word} is not exposed by the code: {expr}"));
            used.insert(word.clone());
            in_scope.extend(labels.iter().cloned());
            if let Some((open, '{')) = next {
                let close = open + chars[open..].iter().position(|c| *c == '}').unwrap();
                let body: String = chars[open + 1..close].iter().collect();
                for matcher in body.split(',').map(str::trim).filter(|m| !m.is_empty()) {
                    let op_at = matcher.find(['=', '!']).unwrap();
                    let label = matcher[..op_at].trim();
                    let rest = &matcher[op_at..];
                    let (op, value) = rest.split_at(if rest.starts_with("=\"") { 1 } else { 2 });
                    let value = value.trim().trim_matches('"');
                    assert!(
                        labels.contains(label) || TARGET_LABELS.contains(&label),
                        "{who}: {word} has no label {label} (it has {labels:?}): {expr}"
                    );
                    let literal = matches!(op, "=" | "=~")
                        && !TARGET_LABELS.contains(&label)
                        && !value.contains('$');
                    if literal {
                        for alternative in value.split('|') {
                            assert!(
                                registered.source.contains(&format!("\"{alternative}\"")),
                                "{who}: {word}{{{label}}} never takes the value {alternative:?} in the code: {expr}"
                            );
                        }
                    }
                }
            }
        } else if ["by", "without", "on", "ignoring"].contains(&word.as_str())
            && let Some((open, '(')) = next
        {
            let close = open + chars[open..].iter().position(|c| *c == ')').unwrap();
            let list: String = chars[open + 1..close].iter().collect();
            grouped.extend(
                list.split(',')
                    .map(|l| l.trim().to_owned())
                    .filter(|l| !l.is_empty()),
            );
        }
    }
    for label in grouped {
        assert!(
            in_scope.contains(&label) || label == "le",
            "{who}: no metric of the expression has the label {label}: {expr}"
        );
    }
    used
}

/// Every string in `v`, at any depth (queries sit in panels, rows and template variables).
fn json_strings(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::String(s) => out.push(s.clone()),
        Value::Array(items) => items.iter().for_each(|i| json_strings(i, out)),
        Value::Object(map) => map.values().for_each(|i| json_strings(i, out)),
        _ => {}
    }
}

fn render_with_monitoring(dirs: &[&str]) -> Vec<Value> {
    render_overlay(dirs, &["monitoring"])
}

fn prometheus_rule() -> Value {
    let docs = render_with_monitoring(&["self-signed"]);
    named(&docs, "PrometheusRule", "helmop").clone()
}

fn rules(rule: &Value) -> Vec<&Value> {
    rule["spec"]["groups"]
        .as_array()
        .expect("spec.groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("a group's rules").iter())
        .collect()
}

/// The component adds its own objects to any install and changes nothing else; its PodMonitors select the
/// pods of the webhook, the propagator and the rollout watcher, on the ports and paths they serve metrics
/// on, and the `job` each alert selects is the one its PodMonitor gives.
#[test]
fn monitoring_component_scrapes_every_helmop_pod_where_it_serves_metrics() {
    let full = ["self-signed", "propagator", "rollout-watcher"];
    let with = render_with_monitoring(&full);
    let without = render_overlay(&full, &[]);
    let added: Vec<&Value> = with.iter().filter(|d| !without.contains(d)).collect();
    let kinds: BTreeSet<String> = added.iter().map(|d| name_of(d)).collect();
    let expected: BTreeSet<String> = [
        "PodMonitor helmop-webhook",
        "PodMonitor helmop-propagator",
        "PodMonitor helmop-rollout-watcher",
        "PrometheusRule helmop",
        "ConfigMap helmop-grafana-dashboard",
    ]
    .map(String::from)
    .into();
    assert_eq!(kinds, expected, "the component adds only its own objects");
    assert_eq!(
        with.len(),
        without.len() + added.len(),
        "the component changed an installed object"
    );
    for doc in &added {
        assert_eq!(
            doc["metadata"]["namespace"],
            "helmop-system",
            "{}",
            name_of(doc)
        );
    }

    let mut jobs = BTreeSet::new();
    for monitor in of_kind(&with, "PodMonitor") {
        let who = name_of(monitor);
        let spec = &monitor["spec"];
        let selector = spec["selector"]["matchLabels"].as_object().unwrap();
        assert!(!selector.is_empty(), "{who}: selects every pod");
        assert!(spec["selector"].get("matchExpressions").is_none(), "{who}");
        let namespaces = strings(&spec["namespaceSelector"]["matchNames"]);
        let pods: Vec<&Value> = of_kind(&with, "Deployment")
            .into_iter()
            .filter(|d| {
                let labels = &d["spec"]["template"]["metadata"]["labels"];
                selector.iter().all(|(k, v)| &labels[k] == v)
            })
            .collect();
        assert_eq!(pods.len(), 1, "{who}: selects one Deployment's pods");
        let deployment = pods[0];
        assert!(
            namespaces.contains(&deployment["metadata"]["namespace"].as_str().unwrap()),
            "{who}: looks in {namespaces:?}"
        );
        let template = &deployment["spec"]["template"];
        let job_label = spec["jobLabel"].as_str().expect("jobLabel");
        let job = template["metadata"]["labels"][job_label]
            .as_str()
            .unwrap_or_else(|| panic!("{who}: the pods have no label {job_label}"));
        assert_eq!(job, monitor["metadata"]["name"], "{who}: job label");
        jobs.insert(job.to_owned());
        let annotations = &template["metadata"]["annotations"];
        for endpoint in spec["podMetricsEndpoints"].as_array().unwrap() {
            let port_name = endpoint["port"].as_str().expect("a named port");
            let path = endpoint["path"].as_str().expect("a path");
            assert_eq!(path, "/metrics", "{who}");
            let container = pod_spec(deployment)["containers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| {
                    c["ports"]
                        .as_array()
                        .is_some_and(|ps| ps.iter().any(|p| p["name"] == port_name))
                })
                .unwrap_or_else(|| panic!("{who}: no container port named {port_name}"));
            let port = container["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == port_name)
                .unwrap();
            // The probes prove that the port answers plain HTTP.
            assert_eq!(
                container["livenessProbe"]["httpGet"]["port"]
                    .as_str()
                    .or_else(|| container["readinessProbe"]["httpGet"]["port"].as_str()),
                Some(port_name),
                "{who}: metrics port {port_name} is not the probed plain-HTTP port"
            );
            if let Some(annotated) = annotations["prometheus.io/port"].as_str() {
                assert_eq!(annotated, port["containerPort"].to_string(), "{who}");
                assert_eq!(annotations["prometheus.io/path"], path, "{who}");
            }
            // The webhook's metrics sit on its admin port, never on the TLS admission port.
            assert_ne!(port["containerPort"], 8443, "{who}");
        }
    }
    for deployment in of_kind(&with, "Deployment") {
        let job = deployment["metadata"]["name"].as_str().unwrap();
        assert!(jobs.contains(job), "{job} is not scraped");
    }

    // Every job an alert or a dashboard query selects is a PodMonitor's.
    let rule = prometheus_rule();
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(manifests_dir().join("monitoring/dashboards/helmop.json"))
            .unwrap(),
    )
    .expect("the dashboard is JSON");
    let mut texts: Vec<String> = rules(&rule)
        .iter()
        .map(|r| r["expr"].as_str().unwrap().to_owned())
        .collect();
    json_strings(&dashboard, &mut texts);
    for text in &texts {
        for (at, _) in text.match_indices("job") {
            let rest = text[at + 3..].trim_start();
            let Some(value) = rest
                .strip_prefix("=~\"")
                .or_else(|| rest.strip_prefix("=\""))
            else {
                continue;
            };
            let value = &value[..value.find('"').unwrap()];
            for job in value.split('|') {
                assert!(jobs.contains(job), "job {job} is no PodMonitor's: {text}");
            }
        }
    }

    // On a downstream cluster (no propagator) and with the watcher alone it still renders.
    for dirs in [
        &["stamping-only", "rollout-watcher"][..],
        &["rollout-watcher"][..],
    ] {
        let docs = render_with_monitoring(dirs);
        assert_eq!(of_kind(&docs, "PodMonitor").len(), 3, "{dirs:?}");
    }
}

/// Every metric and label the alerts and the dashboard use is one the code registers.
#[test]
fn monitoring_uses_only_metrics_the_code_registers() {
    let registered = registered_metrics();
    let rule = prometheus_rule();
    let mut used = BTreeSet::new();
    let mut alerts = BTreeSet::new();
    let troubleshooting =
        std::fs::read_to_string(manifests_dir().join("../docs/troubleshooting.md")).unwrap();
    for r in rules(&rule) {
        let alert = r["alert"].as_str().expect("alerting rules only");
        assert!(alerts.insert(alert.to_owned()), "{alert} twice");
        used.extend(check_promql(
            alert,
            r["expr"].as_str().unwrap(),
            &registered,
        ));
        assert!(
            ["critical", "warning", "info"]
                .contains(&r["labels"]["severity"].as_str().unwrap_or("")),
            "{alert}: severity"
        );
        let summary = r["annotations"]["summary"].as_str().unwrap_or("");
        let description = r["annotations"]["description"].as_str().unwrap_or("");
        assert!(!summary.is_empty(), "{alert}: summary");
        for name in helmop_names(summary)
            .into_iter()
            .chain(helmop_names(description))
        {
            assert!(
                registered.samples.contains_key(name) || registered.families.contains(name),
                "{alert}: the description names {name}, which the code does not register"
            );
        }
        // Points at a section of the troubleshooting guide that exists, and the guide names the alert.
        let section = description
            .split("docs/troubleshooting.md, \"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap_or_else(|| {
                panic!("{alert}: no docs/troubleshooting.md section: {description}")
            });
        assert!(
            troubleshooting.contains(&format!("## {section}\n")),
            "{alert}: docs/troubleshooting.md has no section {section:?}"
        );
        assert!(
            troubleshooting.contains(&format!("`{alert}`")),
            "{alert}: not mentioned in docs/troubleshooting.md"
        );
    }

    let text =
        std::fs::read_to_string(manifests_dir().join("monitoring/dashboards/helmop.json")).unwrap();
    let dashboard: Value = serde_json::from_str(&text).expect("the dashboard is JSON");
    for name in helmop_names(&text) {
        assert!(
            registered.samples.contains_key(name) || registered.families.contains(name),
            "the dashboard names {name}, which the code does not register"
        );
    }
    let mut ids = BTreeSet::new();
    let mut panels: Vec<&Value> = dashboard["panels"]
        .as_array()
        .expect("panels")
        .iter()
        .collect();
    while let Some(panel) = panels.pop() {
        let id = panel["id"].as_i64().expect("every panel has a numeric id");
        assert!(ids.insert(id), "panel id {id} twice");
        if let Some(nested) = panel["panels"].as_array() {
            panels.extend(nested);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            let who = format!("dashboard panel {:?}", panel["title"]);
            used.extend(check_promql(
                &who,
                target["expr"].as_str().expect("expr"),
                &registered,
            ));
        }
    }
    assert!(ids.len() > 10, "{ids:?}");
    // The dashboard shows each process.
    for prefix in ["helmop_webhook_", "helmop_propagator_", "helmop_rollout_"] {
        assert!(
            used.iter().any(|m| m.starts_with(prefix)),
            "nothing of {prefix}*"
        );
    }

    let docs = render_with_monitoring(&["self-signed"]);
    let config_map = named(&docs, "ConfigMap", "helmop-grafana-dashboard");
    assert_eq!(config_map["metadata"]["labels"]["grafana_dashboard"], "1");
    assert_eq!(config_map["data"]["helmop.json"], text.as_str());
}

/// `promtool check rules` accepts the PrometheusRule's groups (syntax, templates, durations), and the
/// alerts fire as `monitoring/rules-test.yaml` expects (`promtool test rules`).
#[test]
fn monitoring_rules_pass_promtool() {
    let version = Command::new("promtool").arg("--version").output().expect(
        "promtool must be on PATH (Debian package `prometheus`, which ./dev installs with the other packages)",
    );
    assert!(version.status.success(), "promtool --version failed");
    let promtool = |args: &[&Path]| {
        let out = Command::new("promtool").args(args).output().unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "promtool {args:?}: {text}");
        text
    };
    let rule = prometheus_rule();
    let dir = tempfile::tempdir().unwrap();
    // JSON is YAML, which promtool reads.
    let checked = dir.path().join("helmop-rules-annotated.yaml");
    let groups = serde_json::json!({ "groups": rule["spec"]["groups"] });
    std::fs::write(&checked, serde_json::to_string_pretty(&groups).unwrap()).unwrap();
    let text = promtool(&[Path::new("check"), Path::new("rules"), checked.as_path()]);
    let found = format!("SUCCESS: {} rules found", rules(&rule).len());
    assert!(text.contains(&found), "{text}");

    // The cases compare labels only: without annotations they need not repeat every description.
    let mut bare = groups.clone();
    for group in bare["groups"].as_array_mut().unwrap() {
        for r in group["rules"].as_array_mut().unwrap() {
            r.as_object_mut().unwrap().remove("annotations");
        }
    }
    std::fs::write(
        dir.path().join("helmop-rules.yaml"),
        serde_json::to_string_pretty(&bare).unwrap(),
    )
    .unwrap();
    let cases = dir.path().join("rules-test.yaml");
    std::fs::copy(manifests_dir().join("monitoring/rules-test.yaml"), &cases).unwrap();
    promtool(&[Path::new("test"), Path::new("rules"), cases.as_path()]);
}
