//! The control plane itself and the test-support helpers, checked against the real clusters.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;

use helmop_core::model::{Cluster, ClusterGroup, HelmOp};
use helmop_core::targeting::{TargetMatch, match_cluster};
use helmop_tests::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{ListParams, PostParams};
use serde_json::{Value, json};

const FLEET_CRDS: [&str; 4] = [
    "helmops.fleet.cattle.io",
    "clusters.fleet.cattle.io",
    "clustergroups.fleet.cattle.io",
    "bundledeployments.fleet.cattle.io",
];

#[tokio::test]
async fn three_clusters_are_reachable_and_independent() -> anyhow::Result<()> {
    let cp = control_plane();
    let names: Vec<&str> = cp.clusters.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, [UPSTREAM, DOWNSTREAM_1, DOWNSTREAM_2]);

    for cluster in &cp.clusters {
        let version = cluster.client().await.apiserver_version().await?;
        assert_eq!(version.git_version, "v1.20.2", "{}", cluster.name);
    }
    let mut servers: Vec<&str> = cp.clusters.iter().map(|c| c.server.as_str()).collect();
    servers.sort_unstable();
    servers.dedup();
    assert_eq!(servers.len(), 3, "every cluster has its own API server");
    assert_ne!(
        cp.cluster(DOWNSTREAM_1).ca_pem(),
        cp.cluster(DOWNSTREAM_2).ca_pem()
    );

    let upstream = cp.upstream().client().await;
    let ns = fresh_namespace(&upstream, "independent").await?;
    create_config_map(&upstream, &ns, "marker", &[("k", "v")]).await?;
    let back = Api::<ConfigMap>::namespaced(upstream, &ns)
        .get("marker")
        .await?;
    assert_eq!(
        back.data.unwrap_or_default().get("k").map(String::as_str),
        Some("v")
    );
    for name in [DOWNSTREAM_1, DOWNSTREAM_2] {
        let client = cp.cluster(name).client().await;
        assert!(
            Api::<Namespace>::all(client).get_opt(&ns).await?.is_none(),
            "namespace {ns} created upstream must not exist in {name}"
        );
    }
    Ok(())
}

#[test]
fn kubeconfigs_have_one_context_per_cluster() {
    let cp = control_plane();
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(cp.merged_kubeconfig())
        .args(["config", "get-contexts", "-o", "name"])
        .output()
        .expect("run kubectl");
    assert!(out.status.success());
    let mut contexts: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    contexts.sort();
    assert_eq!(contexts, [DOWNSTREAM_1, DOWNSTREAM_2, UPSTREAM]);
    let current = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(cp.merged_kubeconfig())
        .args(["config", "current-context"])
        .output()
        .expect("run kubectl");
    assert_eq!(String::from_utf8_lossy(&current.stdout).trim(), UPSTREAM);

    // Each context reaches its own server, through kubectl as users will use it.
    for cluster in &cp.clusters {
        let out = Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(cp.merged_kubeconfig())
            .args([
                "--context",
                &cluster.context,
                "config",
                "view",
                "--minify",
                "-o",
            ])
            .arg("jsonpath={.clusters[0].cluster.server}")
            .output()
            .expect("run kubectl");
        assert_eq!(String::from_utf8_lossy(&out.stdout), cluster.server);
        let out = cluster
            .kubectl()
            .args(["get", "namespace", "kube-system", "-o", "name"])
            .output()
            .expect("run kubectl");
        assert!(
            out.status.success(),
            "kubectl against {}: {}",
            cluster.name,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "namespace/kube-system"
        );
    }
}

#[tokio::test]
async fn fleet_crds_are_established_in_every_cluster() -> anyhow::Result<()> {
    for cluster in &control_plane().clusters {
        let crds: Api<CustomResourceDefinition> = Api::all(cluster.client().await);
        for name in FLEET_CRDS {
            let crd = crds.get(name).await?;
            let established = crd
                .status
                .and_then(|s| s.conditions)
                .unwrap_or_default()
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True");
            assert!(established, "{name} in {}", cluster.name);
        }
    }
    Ok(())
}

const RICH_HELMOP: &str = r#"
apiVersion: fleet.cattle.io/v1alpha1
kind: HelmOp
metadata:
  name: web
  labels: {team: a}
  annotations: {helmop.dev/allow-missing: "true"}
spec:
  helm:
    chart: nginx
    repo: https://charts.example.com/stable
    version: 1.2.3
    releaseName: web
    values:
      replicaCount: 2
      nested: {list: [1, "two", {three: 3}], flag: false}
    valuesFrom:
      - secretKeyRef: {name: web-values, key: values.yaml}
  defaultNamespace: web
  downstreamResources:
    - {kind: Secret, name: db}
    - {kind: configmap, name: settings}
  keepResources: false
  correctDrift: {enabled: true}
  paused: true
  targets:
    - name: dev
      clusterSelector:
        matchLabels: {env: dev}
        matchExpressions: [{key: tier, operator: In, values: [web]}]
      namespace: web-dev
      downstreamResources: [{kind: ConfigMap, name: dev-only}]
    - name: everything-else
      clusterGroup: default
      doNotDeploy: true
"#;

/// `sent` is contained in `back`: every field sent comes back with the same value (the
/// server may add defaults).
fn assert_contained(sent: &Value, back: &Value, path: &str) {
    match (sent, back) {
        (Value::Object(s), Value::Object(b)) => {
            for (k, v) in s {
                let Some(bv) = b.get(k) else {
                    panic!("{path}.{k} was dropped by the server");
                };
                assert_contained(v, bv, &format!("{path}.{k}"));
            }
        }
        (Value::Array(s), Value::Array(b)) => {
            assert_eq!(s.len(), b.len(), "{path}: array length");
            for (i, (sv, bv)) in s.iter().zip(b).enumerate() {
                assert_contained(sv, bv, &format!("{path}[{i}]"));
            }
        }
        _ => assert_eq!(sent, back, "{path}"),
    }
}

#[tokio::test]
async fn helmop_round_trip_through_core_types_keeps_every_field() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "roundtrip").await?;
    let mut op: HelmOp = serde_saphyr::from_str(RICH_HELMOP)?;
    op.metadata.namespace = Some(ns.clone());
    assert!(
        op.spec.extra.contains_key("correctDrift") && op.spec.paused == Some(true),
        "the test needs fields core does not model"
    );
    let sent = serde_json::to_value(&op)?;

    let api: Api<HelmOp> = Api::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &op).await?;
    let back = api.get("web").await?;
    assert_contained(&sent["spec"], &serde_json::to_value(&back)?["spec"], "spec");
    assert_eq!(back.metadata.labels, op.metadata.labels);
    assert_eq!(back.metadata.annotations, op.metadata.annotations);

    // Read-modify-write through the typed model leaves the untyped fields alone.
    let mut changed = back.clone();
    changed.spec.keep_resources = Some(true);
    api.replace("web", &PostParams::default(), &changed).await?;
    let again = serde_json::to_value(api.get("web").await?)?;
    assert_eq!(again["spec"]["keepResources"], json!(true));
    assert_eq!(again["spec"]["correctDrift"], json!({"enabled": true}));
    assert_eq!(again["spec"]["paused"], json!(true));
    assert_eq!(
        again["spec"]["helm"]["values"],
        sent["spec"]["helm"]["values"]
    );

    // The dynamic helper sees the same object.
    let dynamic = fleet_api(&client, &ns, &helmop_resource())
        .get("web")
        .await?;
    assert_eq!(dynamic.data["spec"]["targets"], again["spec"]["targets"]);
    Ok(())
}

#[tokio::test]
async fn apply_helmop_creates_then_updates_from_yaml_or_json() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "apply").await?;
    let yaml = "apiVersion: fleet.cattle.io/v1alpha1\nkind: HelmOp\nmetadata: {name: app}\n\
                spec: {helm: {chart: app, version: 0.1.0, repo: https://charts.example.com}}\n";
    let created = apply_helmop(&client, &ns, yaml).await?;
    assert_eq!(created.metadata.namespace.as_deref(), Some(ns.as_str()));
    let json_doc = json!({"metadata": {"name": "app"}, "spec": {"helm": {"chart": "app",
        "version": "0.2.0", "repo": "https://charts.example.com"}}})
    .to_string();
    let updated = apply_helmop(&client, &ns, &json_doc).await?;
    assert_eq!(updated.data["spec"]["helm"]["version"], "0.2.0");
    assert_eq!(
        updated.metadata.uid, created.metadata.uid,
        "updated in place"
    );

    let err = apply_helmop(&client, &ns, "metadata: {name: x, namespace: elsewhere}\n")
        .await
        .expect_err("a document for another namespace is refused");
    assert!(err.to_string().contains("elsewhere"), "{err}");
    Ok(())
}

#[tokio::test]
async fn fleet_clusters_and_groups_drive_core_targeting() -> anyhow::Result<()> {
    let cp = control_plane();
    let upstream = cp.upstream().client().await;
    let ns = fresh_namespace(&upstream, "targeting").await?;
    register_fleet_cluster(
        &upstream,
        &ns,
        "east",
        &[("env", "dev")],
        cp.cluster(DOWNSTREAM_1),
    )
    .await?;
    register_fleet_cluster(
        &upstream,
        &ns,
        "west",
        &[("env", "prod")],
        cp.cluster(DOWNSTREAM_2),
    )
    .await?;
    create_cluster_group(
        &upstream,
        &ns,
        "dev-clusters",
        &[("env", "dev")],
        &[("tier", "dev")],
    )
    .await?;

    let clusters = Api::<Cluster>::namespaced(upstream.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items;
    let groups = Api::<ClusterGroup>::namespaced(upstream.clone(), &ns)
        .list(&ListParams::default())
        .await?
        .items;
    assert_eq!(clusters.len(), 2);
    assert_eq!(groups.len(), 1);
    let cluster = |name: &str| {
        clusters
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .expect("registered cluster")
    };

    let by_group: HelmOp = serde_saphyr::from_str(&format!(
        "metadata: {{name: a, namespace: {ns}}}\nspec:\n  targets: [{{clusterGroup: dev-clusters}}]\n"
    ))?;
    let by_group_selector: HelmOp = serde_saphyr::from_str(&format!(
        "metadata: {{name: b, namespace: {ns}}}\nspec:\n  targets:\n  - clusterGroupSelector: {{matchLabels: {{tier: prod}}}}\n  - clusterSelector: {{matchLabels: {{env: prod}}}}\n"
    ))?;
    assert_eq!(
        match_cluster(&by_group, cluster("east"), &groups)?,
        TargetMatch::selected(Some(0))
    );
    assert_eq!(
        match_cluster(&by_group, cluster("west"), &groups)?,
        TargetMatch::NoMatch
    );
    assert_eq!(
        match_cluster(&by_group_selector, cluster("west"), &groups)?,
        TargetMatch::selected(Some(1))
    );
    assert_eq!(
        match_cluster(&by_group_selector, cluster("east"), &groups)?,
        TargetMatch::NoMatch
    );

    // The kubeconfig Secret the Cluster points at really reaches that downstream cluster.
    let (secret_ns, secret_name) = cluster("east")
        .kubeconfig_secret()
        .expect("registered clusters name their kubeconfig secret");
    let secret = Api::<Secret>::namespaced(upstream.clone(), &secret_ns)
        .get(&secret_name)
        .await?;
    let kubeconfig = secret
        .data
        .and_then(|mut d| d.remove("value"))
        .expect("kubeconfig under key `value`");
    let via_secret = client_from_kubeconfig(std::str::from_utf8(&kubeconfig.0)?, None).await?;
    let probe = fresh_namespace(&via_secret, "via-secret").await?;
    let down1 = cp.cluster(DOWNSTREAM_1).client().await;
    assert!(
        Api::<Namespace>::all(down1)
            .get_opt(&probe)
            .await?
            .is_some()
    );
    assert!(
        Api::<Namespace>::all(upstream)
            .get_opt(&probe)
            .await?
            .is_none()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validating_webhook_registered_by_url_is_called() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let certs = test_certs();
    let (url, calls) = crate::plugin::support::start_denying_webhook(&certs).await?;
    let ns = fresh_namespace(&client, "webhook").await?;
    let other = fresh_namespace(&client, "webhook-other").await?;
    let name = format!("deny-configmaps-{ns}");
    WebhookRegistration::new(WebhookKind::Validating, &name, &url, &certs.ca_pem)
        .rule(WebhookRule::new(&["CREATE"], "", "v1", &["configmaps"]))
        .only_namespace(&ns)
        .register(&client)
        .await?;

    // The API server picks up new webhook configurations asynchronously.
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let message = wait_for(
        "the webhook to deny a ConfigMap",
        DEFAULT_TIMEOUT,
        || async {
            match create_config_map(&client, &ns, "probe", &[]).await {
                Ok(_) => {
                    api.delete("probe", &Default::default()).await?;
                    Ok(None)
                }
                Err(e) => Ok(Some(format!("{e:#}"))),
            }
        },
    )
    .await?;
    assert!(
        message.contains("denied by the helmop-tests webhook"),
        "{message}"
    );
    assert!(calls.load(Ordering::SeqCst) >= 1);

    // Scoped to its namespace: the same create elsewhere is not sent to it.
    let before = calls.load(Ordering::SeqCst);
    create_config_map(&client, &other, "probe", &[]).await?;
    assert_eq!(calls.load(Ordering::SeqCst), before);

    unregister_webhook(&client, WebhookKind::Validating, &name).await?;
    wait_until("the webhook to be gone", DEFAULT_TIMEOUT, || async {
        match create_config_map(&client, &ns, "after", &[]).await {
            Ok(_) => Ok(true),
            Err(_) => Ok(false),
        }
    })
    .await?;
    Ok(())
}

#[test]
fn test_certs_are_a_ca_and_a_serving_certificate() {
    let certs = test_certs();
    for (pem, label) in [
        (&certs.ca_pem, "CERTIFICATE"),
        (&certs.cert_pem, "CERTIFICATE"),
        (&certs.key_pem, "PRIVATE KEY"),
    ] {
        assert!(
            pem.starts_with(&format!("-----BEGIN {label}-----")),
            "{pem}"
        );
    }
    assert_ne!(certs.ca_pem, certs.cert_pem);
    // The webhook test above proves the API server trusts the chain for 127.0.0.1.
}

// ---- the harness script itself ------------------------------------------------------------

/// `(pid, executable)` of every component recorded in a harness directory.
fn recorded_components(dir: &Path) -> Vec<(u32, String)> {
    let pids = std::fs::read_to_string(dir.join("pids")).expect("pids file");
    pids.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            assert_eq!(fields.len(), 4, "pids line {line:?}");
            (fields[2].parse().expect("pid"), fields[3].to_owned())
        })
        .collect()
}

fn runs(pid: u32, exe: &str) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == Path::new(exe))
}

/// Listening TCP sockets on the loopback address of `server` (`https://127.a.b.c:port`).
fn listeners_on(server: &str) -> Vec<String> {
    let host = server
        .trim_start_matches("https://")
        .rsplit_once(':')
        .map(|(h, _)| h.to_owned())
        .expect("server has a port");
    let out = Command::new("ss").args(["-Hltn"]).output().expect("run ss");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains(&format!(" {host}:")))
        .map(str::to_owned)
        .collect()
}

fn run_cp(args: &[&str]) -> String {
    let out = Command::new(cp_script())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run the harness");
    assert!(
        out.status.success(),
        "cp {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn detached_up_then_down_leaves_no_process_and_no_port() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dir_arg = dir.path().to_str().expect("utf-8 path");
    let summary: Value = serde_json::from_str(&run_cp(&[
        "up",
        "--clusters",
        "1",
        "--names",
        "solo",
        "--dir",
        dir_arg,
    ]))
    .expect("summary JSON");
    assert_eq!(summary["ready"], true);
    let server = summary["clusters"][0]["server"]
        .as_str()
        .expect("server")
        .to_owned();
    let components = recorded_components(dir.path());
    assert_eq!(
        components.len(),
        3,
        "etcd, kube-apiserver, kube-controller-manager"
    );
    assert!(components.iter().all(|(pid, exe)| runs(*pid, exe)));
    assert_eq!(
        listeners_on(&server).len(),
        3,
        "etcd client + peer, apiserver"
    );

    run_cp(&["down", "--dir", dir_arg]);
    for (pid, exe) in &components {
        assert!(
            !runs(*pid, exe),
            "{exe} ({pid}) still running after cp down"
        );
    }
    assert_eq!(listeners_on(&server), Vec::<String>::new());
    assert!(!dir.path().join("pids").exists());
    // Idempotent.
    run_cp(&["down", "--dir", dir_arg]);
}

#[tokio::test]
async fn private_control_plane_restarts_a_cluster_and_cleans_up_on_drop() -> anyhow::Result<()> {
    let cp = ControlPlane::start(&["solo"])?;
    let dir = cp.dir.clone();
    let solo = cp.cluster("solo").clone();
    let client = solo.client().await;
    let ns = fresh_namespace(&client, "survivor").await?;

    cp.stop_cluster("solo")?;
    assert!(
        solo.client().await.apiserver_version().await.is_err(),
        "the API server is down"
    );
    cp.start_cluster("solo")?;
    let client = solo.client().await;
    assert!(
        Api::<Namespace>::all(client).get_opt(&ns).await?.is_some(),
        "etcd kept the data across the restart"
    );

    let components = recorded_components(&dir);
    assert!(components.iter().all(|(pid, exe)| runs(*pid, exe)));
    drop(cp);
    for (pid, exe) in &components {
        assert!(!runs(*pid, exe), "{exe} ({pid}) still running after drop");
    }
    assert_eq!(listeners_on(&solo.server), Vec::<String>::new());
    assert!(!dir.exists(), "the harness removes its directory");
    Ok(())
}

#[test]
fn missing_kube_binaries_fail_with_a_hint_to_build() {
    let empty_cache = tempfile::tempdir().expect("tempdir");
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(cp_script())
        .args(["up", "--clusters", "1", "--dir"])
        .arg(dir.path())
        .env("HELMOP_CACHE", empty_cache.path())
        .stdin(Stdio::null())
        .output()
        .expect("run the harness");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("cp build"), "{stderr}");
}
