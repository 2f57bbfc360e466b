//! Faults on purpose: the real `helmop-webhook` binary with its API server stopped and started again under it
//! (a private control plane), and `kubectl-helmop propagate` killed with SIGKILL half way, then rerun.
//! (A downstream cluster that accepts connections and never answers is covered in `plugin.rs`:
//! `a_hanging_or_credential_less_cluster_costs_only_its_own_rows`.)

use std::collections::BTreeSet;
use std::time::Duration;

use anyhow::bail;
use helmop_tests::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::ListParams;
use kube::{Api, Client};
use serde_json::{Value, json};

/// An AdmissionReview v1 as the API server sends it.
pub fn review(
    (group, version, kind): (&str, &str, &str),
    resource: &str,
    namespace: &str,
    name: &str,
    operation: &str,
    object: Option<Value>,
    old_object: Option<Value>,
) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": format!("{operation}-{name}"),
            "kind": {"group": group, "version": version, "kind": kind},
            "resource": {"group": group, "version": version, "resource": resource},
            "name": name,
            "namespace": namespace,
            "operation": operation,
            "userInfo": {"username": "faults-test"},
            "object": object,
            "oldObject": old_object,
            "dryRun": false,
        },
    })
}

pub const HELMOP: (&str, &str, &str) = ("fleet.cattle.io", "v1alpha1", "HelmOp");
pub const SECRET: (&str, &str, &str) = ("", "v1", "Secret");
pub const DEPLOYMENT: (&str, &str, &str) = ("apps", "v1", "Deployment");

pub fn helmop_object(namespace: &str, name: &str, secrets: &[&str]) -> Value {
    let resources: Vec<Value> = secrets
        .iter()
        .map(|s| json!({"kind": "Secret", "name": s}))
        .collect();
    json!({
        "apiVersion": "fleet.cattle.io/v1alpha1",
        "kind": "HelmOp",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "helm": {"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3"},
            "downstreamResources": resources,
        },
    })
}

/// A Deployment whose container reads `secret`/`key` through `secretKeyRef`.
pub fn deployment_object(namespace: &str, name: &str, secret: &str, key: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": "registry.example.com/app:1.0",
                    "env": [{"name": "V", "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}]}]},
            },
        },
    })
}

fn response(body: &Value) -> &Value {
    &body["response"]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_stopped_under_the_webhook_fails_closed_for_validation_open_for_mutation_and_recovers()
-> anyhow::Result<()> {
    // Stopping an API server needs a control plane of our own.
    let cp = ControlPlane::start(&["wf-up"])?;
    let cluster = cp.cluster("wf-up");
    let client = cluster.client().await;
    ensure_hash_key(&client).await?;
    let ns = fresh_namespace_with_labels(
        &client,
        "wf",
        &[("helmop.dev/rollout-on-change", "enabled")],
    )
    .await?;
    create_secret(&client, &ns, "db", &[("password", b"hunter2")]).await?;
    apply_helmop(
        &client,
        &ns,
        &helmop_object(&ns, "app", &["db"]).to_string(),
    )
    .await?;
    let webhook = WebhookBinary::start(&cluster.kubeconfig, "info", &[]).await?;
    let post = |path: &'static str, review: Value| {
        let webhook = &webhook;
        async move { webhook.post(path, &review).await }
    };

    // While the API server is up: a missing Secret is a plain denial (403), the guard knows HelmOp app.
    let missing = review(
        HELMOP,
        "helmops",
        &ns,
        "x",
        "CREATE",
        Some(helmop_object(&ns, "x", &["nope"])),
        None,
    );
    let (status, body) = post("/validate/helmops", missing.clone()).await?;
    assert_eq!(status, 200);
    assert_eq!(response(&body)["allowed"], false, "{body}");
    assert_eq!(response(&body)["status"]["code"], 403, "{body}");
    let guard = review(SECRET, "secrets", &ns, "db", "DELETE", None, None);
    wait_until("the guard to know HelmOp app", DEFAULT_TIMEOUT, || async {
        let (_, body) = post("/validate/references", guard.clone()).await?;
        Ok(response(&body)["allowed"] == false)
    })
    .await?;
    let secrets_before = webhook.cache_objects("secrets").await?;

    cp.stop_cluster("wf-up")?;

    // HelmOp validation that needs a live lookup fails closed: code 500 and a message saying what could not be checked.
    let (status, body) = post("/validate/helmops", missing.clone()).await?;
    assert_eq!(status, 200, "{body}");
    let r = response(&body);
    assert_eq!(r["allowed"], false, "admitted without checking: {body}");
    assert_eq!(r["status"]["code"], 500, "{body}");
    assert_eq!(r["uid"], "CREATE-x");
    let message = r["status"]["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!(
            "cannot check that secret/nope exists in namespace \"{ns}\""
        )),
        "{message}"
    );
    // What the caches already hold is still answered: the referenced Secret is known to exist.
    let cached = review(
        HELMOP,
        "helmops",
        &ns,
        "y",
        "CREATE",
        Some(helmop_object(&ns, "y", &["db"])),
        None,
    );
    let (_, body) = post("/validate/helmops", cached).await?;
    assert_eq!(response(&body)["allowed"], true, "{body}");
    // The delete guard answers from its HelmOp cache: still enforced.
    let (_, body) = post("/validate/references", guard.clone()).await?;
    assert_eq!(response(&body)["allowed"], false, "{body}");
    assert!(
        response(&body)["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("HelmOp app"),
        "{body}"
    );
    // Workload mutation fails open: admitted unchanged, with a warning saying why there is no stamp. Its
    // namespace is cached (opted in), the Secret's content is never cached, so its read fails.
    let workload = review(
        DEPLOYMENT,
        "deployments",
        &ns,
        "web",
        "CREATE",
        Some(deployment_object(&ns, "web", "db", "password")),
        None,
    );
    let (status, body) = post("/mutate/workloads", workload).await?;
    assert_eq!(status, 200, "{body}");
    let r = response(&body);
    assert_eq!(r["allowed"], true, "{body}");
    assert!(
        r.get("patch").is_none(),
        "patched without reading the Secret: {body}"
    );
    let warning = r["warnings"][0].as_str().unwrap_or_default();
    assert!(
        warning.contains(&format!("cannot read secret/db in namespace \"{ns}\""))
            && warning.contains("admitted without a config stamp"),
        "{body}"
    );
    // A namespace the cache has never seen: its labels cannot be read either; still admitted.
    let elsewhere = review(
        DEPLOYMENT,
        "deployments",
        "not-cached",
        "web",
        "CREATE",
        Some(deployment_object("not-cached", "web", "db", "password")),
        None,
    );
    let (_, body) = post("/mutate/workloads", elsewhere).await?;
    assert_eq!(response(&body)["allowed"], true, "{body}");
    assert!(
        response(&body)["warnings"][0]
            .as_str()
            .unwrap_or_default()
            .contains("cannot read the labels of namespace \"not-cached\""),
        "{body}"
    );
    // The process stays up and keeps serving from its caches: still ready.
    assert_eq!(webhook.readyz().await?, 200);

    cp.start_cluster("wf-up")?;
    let client = cluster.client().await;

    // The watches resume: a Secret created after the restart shows up in the Secret cache, and a HelmOp created
    // after the restart is known to the delete guard (which reads nothing live).
    create_secret(&client, &ns, "fresh", &[("k", b"v")]).await?;
    apply_helmop(
        &client,
        &ns,
        &helmop_object(&ns, "later", &["fresh"]).to_string(),
    )
    .await?;
    wait_until(
        "the Secret watch to resume",
        Duration::from_secs(90),
        || async { Ok(webhook.cache_objects("secrets").await? > secrets_before) },
    )
    .await?;
    let guard_fresh = review(SECRET, "secrets", &ns, "fresh", "DELETE", None, None);
    let message = wait_for(
        "the HelmOp watch to resume",
        Duration::from_secs(90),
        || async {
            let (_, body) = post("/validate/references", guard_fresh.clone()).await?;
            let r = response(&body);
            Ok((r["allowed"] == false).then(|| {
                r["status"]["message"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            }))
        },
    )
    .await?;
    assert!(message.contains("HelmOp later"), "{message}");
    // Live lookups work again: the missing Secret is a 403 denial again, not a 500.
    let (_, body) = post("/validate/helmops", missing).await?;
    assert_eq!(response(&body)["status"]["code"], 403, "{body}");
    assert_eq!(webhook.readyz().await?, 200);
    // The outage is in the logs as watch errors, without a crash.
    let logs = webhook.logs();
    assert!(logs.contains("watch failed, retrying"), "{logs}");
    assert!(!logs.contains("panic"), "{logs}");
    Ok(())
}

/// `(namespace, name)` of every helmop Secret copy on `client` owned by a HelmOp of upstream namespace `ns`, and
/// the owners annotation of each.
async fn copies(client: &Client, ns: &str) -> anyhow::Result<Vec<(String, String, String)>> {
    let lp = ListParams::default().labels("helmop.dev/managed-by=kubectl-helmop");
    let marker = format!("/{ns}/");
    let mut out = Vec::new();
    for s in Api::<Secret>::all(client.clone()).list(&lp).await? {
        let owners = s
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("helmop.dev/owners"))
            .cloned()
            .unwrap_or_default();
        if owners.contains(&marker) {
            out.push((
                s.metadata.namespace.clone().unwrap_or_default(),
                s.metadata.name.clone().unwrap_or_default(),
                owners,
            ));
        }
    }
    for c in Api::<ConfigMap>::all(client.clone()).list(&lp).await? {
        let owners = c
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("helmop.dev/owners"))
            .cloned()
            .unwrap_or_default();
        if owners.contains(&marker) {
            bail!("unexpected ConfigMap copy {:?}", c.metadata.name);
        }
    }
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn propagate_killed_half_way_then_rerun_converges_without_duplicates_or_orphans()
-> anyhow::Result<()> {
    const RESOURCES: usize = 120;
    let cp = control_plane();
    let upstream = cp.upstream().client().await;
    let ns = fresh_namespace(&upstream, "wf-kill").await?;
    for name in [DOWNSTREAM_1, DOWNSTREAM_2] {
        register_fleet_cluster(&upstream, &ns, name, &[("env", "kill")], cp.cluster(name)).await?;
    }
    let names: Vec<String> = (0..RESOURCES).map(|i| format!("s{i:03}")).collect();
    for name in &names {
        create_secret(&upstream, &ns, name, &[("k", name.as_bytes())]).await?;
    }
    let dest = format!("{ns}-dest");
    let resources: String = names
        .iter()
        .map(|n| format!("  - {{kind: Secret, name: {n}}}\n"))
        .collect();
    apply_helmop(
        &upstream,
        &ns,
        &format!(
            "apiVersion: fleet.cattle.io/v1alpha1\nkind: HelmOp\nmetadata:\n  name: app\nspec:\n  helm:\n    repo: https://charts.example.com\n    chart: app\n    version: 1.0.0\n  defaultNamespace: {dest}\n  downstreamResources:\n{resources}  targets:\n  - clusterSelector: {{matchLabels: {{env: kill}}}}\n"
        ),
    )
    .await?;
    let down = [
        cp.cluster(DOWNSTREAM_1).client().await,
        cp.cluster(DOWNSTREAM_2).client().await,
    ];
    let kubeconfig = cp.upstream().kubeconfig.display().to_string();
    let args = [
        "propagate",
        "app",
        "-n",
        &ns,
        "-o",
        "json",
        "--concurrency",
        "1",
        "--kubeconfig",
        &kubeconfig,
    ];

    // SIGKILL as soon as the first copy is there: no chance to clean up or finish the batch.
    let mut run = PluginProcess::spawn(&args, &[])?;
    let written = wait_for("a first copy", Duration::from_secs(120), || async {
        let mut n = 0;
        for client in &down {
            n += copies(client, &ns).await?.len();
        }
        Ok((n > 0).then_some(n))
    })
    .await
    .unwrap_or(0);
    run.signal(libc::SIGKILL)?;
    let status = run.wait_exit(DEFAULT_TIMEOUT).await?;
    assert!(
        written > 0,
        "no copy appeared within 120s: {}",
        run.context()
    );
    assert!(!status.success(), "killed run exited cleanly: {status:?}");
    let mut partial = 0;
    for client in &down {
        partial += copies(client, &ns).await?.len();
    }
    eprintln!("killed after {partial} of {} copies", 2 * RESOURCES);

    // The rerun converges: exactly one copy per resource and cluster, one owner each, nothing else.
    let out = run_plugin(&args[..], &[], Duration::from_secs(300)).await?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&stdout)?;
    let expected: BTreeSet<(String, String)> =
        names.iter().map(|n| (dest.clone(), n.clone())).collect();
    for client in &down {
        let found = copies(client, &ns).await?;
        let places: BTreeSet<(String, String)> = found
            .iter()
            .map(|(n, s, _)| (n.clone(), s.clone()))
            .collect();
        assert_eq!(places.len(), found.len(), "duplicate copies");
        assert_eq!(places, expected, "missing or orphaned copies");
        for (_, name, owners) in &found {
            assert_eq!(owners.split(',').count(), 1, "{name}: owners {owners}");
            assert!(
                owners.ends_with(&format!("/{ns}/app")),
                "{name}: owners {owners}"
            );
        }
    }
    // Copies the killed run finished are not written again.
    let count = |state: &str| {
        report["rows"].as_array().map_or(0, |rows| {
            rows.iter().filter(|r| r["state"] == state).count()
        })
    };
    assert_eq!(count("Unchanged"), partial, "{report:#}");
    assert_eq!(count("Created"), 2 * RESOURCES - partial, "{report:#}");

    // Nothing left to repair or prune.
    let status = run_plugin(
        &[
            "status",
            "app",
            "-n",
            &ns,
            "-o",
            "json",
            "--kubeconfig",
            &kubeconfig,
        ],
        &[],
        Duration::from_secs(120),
    )
    .await?;
    let status_json: Value = serde_json::from_slice(&status.stdout)?;
    assert_eq!(status.status.code(), Some(0), "{status_json:#}");
    let states: BTreeSet<&str> = status_json["rows"]
        .as_array()
        .map(|rows| rows.iter().filter_map(|r| r["state"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(states, BTreeSet::from(["Synced"]), "{status_json:#}");
    let prune = run_plugin(
        &[
            "prune",
            "-n",
            &ns,
            "--dry-run",
            "-o",
            "json",
            "--kubeconfig",
            &kubeconfig,
        ],
        &[],
        Duration::from_secs(120),
    )
    .await?;
    assert_eq!(
        prune.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&prune.stderr)
    );
    let prune_json: Value = serde_json::from_slice(&prune.stdout)?;
    let doomed: Vec<&Value> = prune_json["rows"]
        .as_array()
        .map(|rows| rows.iter().filter(|r| r["state"] == "Prune").collect())
        .unwrap_or_default();
    assert!(doomed.is_empty(), "prune would delete: {prune_json:#}");
    Ok(())
}
