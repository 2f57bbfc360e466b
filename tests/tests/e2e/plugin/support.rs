//! Helpers of the plugin's end-to-end tests: running the real `kubectl-helmop` binary, a Fleet
//! setup on the shared control plane, and reading what ended up downstream.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine;
use helmop_tests::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

/// The plugin binary next to this test binary (`target/<profile>/kubectl-helmop`): `./dev test`
/// builds it with `cargo build --bins` before the tests run.
pub fn plugin_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("path of the test binary");
    // target/<profile>/deps/e2e-<hash> -> target/<profile>/kubectl-helmop
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let bin = dir.join("kubectl-helmop");
    assert!(
        bin.exists(),
        "{} is missing: build it first with `cargo build --workspace --bins --features kubectl-helmop/test-hooks` (./dev test does)",
        bin.display()
    );
    bin
}

/// What one run of the plugin printed and returned.
#[derive(Debug)]
pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Out {
    /// stdout as JSON (the run must have used `-o json`).
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    /// Panics with both streams unless the exit code is `code`.
    pub fn expect(self, code: i32) -> Out {
        assert_eq!(
            self.code, code,
            "exit code {} (wanted {code})\nstdout:\n{}\nstderr:\n{}",
            self.code, self.stdout, self.stderr
        );
        self
    }
}

/// Runs the plugin with `args` against the upstream cluster (its own kubeconfig).
pub async fn helmop(args: &[&str]) -> anyhow::Result<Out> {
    let kubeconfig = control_plane().upstream().kubeconfig.clone();
    run_with(&kubeconfig, args, &[]).await
}

/// Runs the plugin with `args` (a subcommand first) and `--kubeconfig kubeconfig`, extra
/// environment, no KUBECONFIG.
pub async fn run_with(
    kubeconfig: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<Out> {
    let mut full: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    full.push("--kubeconfig".to_string());
    full.push(kubeconfig.display().to_string());
    run_raw(&full, env).await
}

/// Starts the plugin with `args` and `--kubeconfig kubeconfig`; [`finish`] collects it.
pub fn spawn_with(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new(plugin_bin());
    cmd.args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    Ok(cmd.spawn()?)
}

/// Waits (at most 180 s) for a plugin started by [`spawn_with`].
pub async fn finish(child: tokio::process::Child) -> anyhow::Result<Out> {
    let out = tokio::time::timeout(Duration::from_secs(180), child.wait_with_output())
        .await
        .context("kubectl-helmop did not finish in 180s")??;
    Ok(Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// A TCP endpoint that accepts connections and never answers (a hung API server). Sends on the
/// returned channel whenever it accepts one.
pub fn black_hole() -> anyhow::Result<(u16, std::sync::mpsc::Receiver<()>)> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for conn in listener.incoming().flatten() {
            held.push(conn);
            let _ = tx.send(());
        }
    });
    Ok((port, rx))
}

/// A kubeconfig (YAML) for `https://127.0.0.1:port` without certificate checks.
pub fn loopback_kubeconfig(port: u16) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:{port}\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n"
    )
}

/// Runs the plugin with exactly `args`; KUBECONFIG is removed unless `env` sets it.
pub async fn run_raw(args: &[String], env: &[(&str, &str)]) -> anyhow::Result<Out> {
    let mut cmd = tokio::process::Command::new(plugin_bin());
    cmd.args(args);
    run_to_end(cmd, env, &format!("kubectl-helmop {args:?}")).await
}

/// Runs `kubectl helmop ARGS` through real kubectl, with the workspace's plugin binaries first on
/// PATH; KUBECONFIG is removed unless `env` sets it.
pub async fn through_kubectl(args: &[&str], env: &[(&str, &str)]) -> anyhow::Result<Out> {
    let bin_dir = plugin_bin()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.arg("helmop").args(args).env("PATH", path);
    run_to_end(cmd, env, &format!("kubectl helmop {args:?}")).await
}

/// Runs `cmd` without stdin, quiet logs and no KUBECONFIG unless `env` sets it, for at most 180 s.
async fn run_to_end(
    mut cmd: tokio::process::Command,
    env: &[(&str, &str)],
    what: &str,
) -> anyhow::Result<Out> {
    cmd.env_remove("KUBECONFIG")
        .env("HELMOP_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .with_context(|| format!("{what} did not finish in 180s"))??;
    Ok(Out {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

/// Clients of the shared control plane and a fresh upstream namespace holding Fleet Clusters.
pub struct Fleet {
    pub ns: String,
    pub upstream: Client,
    pub down1: Client,
    pub down2: Client,
}

impl Fleet {
    /// A fresh namespace upstream with Fleet Clusters `down1` (labels `env=prod`, `name=down1`)
    /// and `down2` (`env=prod`, `tier=edge`, `name=down2`), and a ClusterGroup `edge` selecting
    /// `tier=edge`.
    pub async fn new(prefix: &str) -> anyhow::Result<Fleet> {
        let cp = control_plane();
        let upstream = cp.upstream().client().await;
        let ns = fresh_namespace(&upstream, prefix).await?;
        register_fleet_cluster(
            &upstream,
            &ns,
            "down1",
            &[("env", "prod"), ("name", "down1")],
            cp.cluster(DOWNSTREAM_1),
        )
        .await?;
        register_fleet_cluster(
            &upstream,
            &ns,
            "down2",
            &[("env", "prod"), ("tier", "edge"), ("name", "down2")],
            cp.cluster(DOWNSTREAM_2),
        )
        .await?;
        create_cluster_group(&upstream, &ns, "edge", &[("tier", "edge")], &[]).await?;
        Ok(Fleet {
            ns,
            upstream,
            down1: cp.cluster(DOWNSTREAM_1).client().await,
            down2: cp.cluster(DOWNSTREAM_2).client().await,
        })
    }

    /// The downstream namespace name `<ns>-<suffix>` (unique per test).
    pub fn dest(&self, suffix: &str) -> String {
        format!("{}-{suffix}", self.ns)
    }

    /// Applies a HelmOp in this namespace from YAML.
    pub async fn helmop(&self, yaml: &str) -> anyhow::Result<()> {
        apply_helmop(&self.upstream, &self.ns, yaml).await?;
        Ok(())
    }
}

/// A HelmOp document: name, then the spec lines (YAML, indented by 2 under `spec:`).
pub fn helmop_yaml(name: &str, spec: &str) -> String {
    let spec: String = spec.lines().map(|l| format!("  {l}\n")).collect();
    format!(
        "apiVersion: fleet.cattle.io/v1alpha1\nkind: HelmOp\nmetadata:\n  name: {name}\nspec:\n  helm:\n    repo: https://charts.example.com\n    chart: app\n    version: 1.0.0\n{spec}"
    )
}

pub async fn get_secret(client: &Client, ns: &str, name: &str) -> anyhow::Result<Option<Secret>> {
    Ok(Api::<Secret>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?)
}

pub async fn get_config_map(
    client: &Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<Option<ConfigMap>> {
    Ok(Api::<ConfigMap>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await?)
}

pub async fn namespace_exists(client: &Client, ns: &str) -> anyhow::Result<bool> {
    Ok(Api::<Namespace>::all(client.clone())
        .get_opt(ns)
        .await?
        .is_some())
}

pub fn annotation<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

pub fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

/// Every helmop copy on a cluster owned by a HelmOp of upstream namespace `ns`:
/// `(namespace, kind, name)`.
pub async fn copies_of(
    client: &Client,
    ns: &str,
) -> anyhow::Result<BTreeSet<(String, String, String)>> {
    let lp = ListParams::default().labels("helmop.dev/managed-by=kubectl-helmop");
    let marker = format!("/{ns}/");
    let mut out = BTreeSet::new();
    for s in Api::<Secret>::all(client.clone()).list(&lp).await? {
        if annotation(&s.metadata, "helmop.dev/owners").is_some_and(|o| o.contains(&marker)) {
            out.insert((
                s.metadata.namespace.clone().unwrap_or_default(),
                "Secret".into(),
                s.metadata.name.clone().unwrap_or_default(),
            ));
        }
    }
    for c in Api::<ConfigMap>::all(client.clone()).list(&lp).await? {
        if annotation(&c.metadata, "helmop.dev/owners").is_some_and(|o| o.contains(&marker)) {
            out.insert((
                c.metadata.namespace.clone().unwrap_or_default(),
                "ConfigMap".into(),
                c.metadata.name.clone().unwrap_or_default(),
            ));
        }
    }
    Ok(out)
}

/// `(namespace, kind, name)` as owned strings.
pub fn place(ns: &str, kind: &str, name: &str) -> (String, String, String) {
    (ns.to_string(), kind.to_string(), name.to_string())
}

/// The rows of a JSON report.
pub fn rows(report: &Value) -> Vec<Value> {
    report["rows"].as_array().cloned().unwrap_or_default()
}

/// `cluster namespace kind/name [workload]` of one JSON report row.
pub fn row_key(r: &Value) -> String {
    let mut key = format!(
        "{} {} {}/{}",
        r["cluster"].as_str().unwrap_or_default(),
        r["namespace"].as_str().unwrap_or_default(),
        r["kind"].as_str().unwrap_or_default(),
        r["name"].as_str().unwrap_or_default()
    );
    if let Some(w) = r["workload"].as_str() {
        key.push_str(&format!(" {w}"));
    }
    key
}

/// `cluster namespace kind/name [workload] -> state` of a JSON report.
pub fn states(report: &Value) -> BTreeMap<String, String> {
    rows(report)
        .iter()
        .map(|r| {
            (
                row_key(r),
                r["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The row of a report matching cluster, namespace and resource name (and no workload).
pub fn row<'a>(report_rows: &'a [Value], cluster: &str, name: &str) -> &'a Value {
    report_rows
        .iter()
        .find(|r| r["cluster"] == cluster && r["name"] == name && r.get("workload").is_none())
        .unwrap_or_else(|| panic!("no row for {cluster} {name} in {report_rows:#?}"))
}

/// `writes` of a propagate report's summary.
pub fn writes(report: &Value) -> u64 {
    report["summary"]["writes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no summary.writes in {report:#}"))
}

/// A kubeconfig file for the upstream cluster authenticating as a ServiceAccount of `ns` that
/// may read HelmOps, ClusterGroups, Secrets and ConfigMaps of `ns`, but not Clusters. The file
/// lives in `dir`.
pub async fn kubeconfig_without_cluster_access(
    upstream: &Client,
    ns: &str,
    dir: &Path,
) -> anyhow::Result<PathBuf> {
    let fleet = [
        "helmops",
        "clustergroups",
        "bundlenamespacemappings",
        "policies",
        "bundles",
    ];
    limited_kubeconfig(upstream, ns, dir, "no-clusters", &fleet, false).await
}

/// Every Fleet resource a plugin run reads upstream (for [`limited_kubeconfig`]).
pub const FLEET_READS: &[&str] = &[
    "helmops",
    "clusters",
    "clustergroups",
    "bundlenamespacemappings",
    "policies",
    "bundles",
    "bundledeployments",
];

/// A kubeconfig file (in `dir`) for the upstream cluster authenticating as the ServiceAccount
/// `ns/name`, which may read the `fleet` resources, Secrets and ConfigMaps of `ns` and nothing
/// of any other namespace; with `identity`, also the `kube-system` namespace object (what the
/// plugin reads to identify the upstream cluster).
pub async fn limited_kubeconfig(
    upstream: &Client,
    ns: &str,
    dir: &Path,
    name: &str,
    fleet: &[&str],
    identity: bool,
) -> anyhow::Result<PathBuf> {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};

    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..ObjectMeta::default()
    };
    Api::<ServiceAccount>::namespaced(upstream.clone(), ns)
        .create(
            &PostParams::default(),
            &ServiceAccount {
                metadata: meta(name),
                ..ServiceAccount::default()
            },
        )
        .await?;
    let rule = |group: &str, resources: &[&str]| PolicyRule {
        api_groups: Some(vec![group.into()]),
        resources: Some(resources.iter().map(|r| r.to_string()).collect()),
        verbs: vec!["get".into(), "list".into(), "watch".into()],
        ..PolicyRule::default()
    };
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: name.into(),
        namespace: Some(ns.into()),
        ..Subject::default()
    };
    Api::<Role>::namespaced(upstream.clone(), ns)
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta(name),
                rules: Some(vec![
                    rule("fleet.cattle.io", fleet),
                    rule("", &["secrets", "configmaps"]),
                ]),
            },
        )
        .await?;
    Api::<RoleBinding>::namespaced(upstream.clone(), ns)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: meta(name),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: name.into(),
                },
                subjects: Some(vec![subject.clone()]),
            },
        )
        .await?;
    if identity {
        let cluster_name = format!("{ns}-{name}-identity");
        let cluster_meta = ObjectMeta {
            name: Some(cluster_name.clone()),
            labels: Some([(TEST_NAMESPACE_LABEL.to_string(), ns.to_string())].into()),
            ..ObjectMeta::default()
        };
        Api::<ClusterRole>::all(upstream.clone())
            .create(
                &PostParams::default(),
                &ClusterRole {
                    metadata: cluster_meta.clone(),
                    rules: Some(vec![PolicyRule {
                        api_groups: Some(vec![String::new()]),
                        resources: Some(vec!["namespaces".into()]),
                        resource_names: Some(vec!["kube-system".into()]),
                        verbs: vec!["get".into()],
                        ..PolicyRule::default()
                    }]),
                    ..ClusterRole::default()
                },
            )
            .await?;
        Api::<ClusterRoleBinding>::all(upstream.clone())
            .create(
                &PostParams::default(),
                &ClusterRoleBinding {
                    metadata: cluster_meta,
                    role_ref: RoleRef {
                        api_group: Some("rbac.authorization.k8s.io".into()),
                        kind: "ClusterRole".into(),
                        name: cluster_name,
                    },
                    subjects: Some(vec![subject]),
                },
            )
            .await?;
    }
    service_account_kubeconfig(
        control_plane().upstream(),
        upstream,
        ns,
        name,
        &dir.join(format!("{name}.kubeconfig")),
    )
    .await
}

/// Writes to `path` a kubeconfig for `cluster` that authenticates as ServiceAccount `ns/name`
/// with its token (Kubernetes 1.20 creates a token Secret for every ServiceAccount), its
/// namespace `ns`.
pub async fn service_account_kubeconfig(
    cluster: &ClusterInfo,
    client: &Client,
    ns: &str,
    name: &str,
    path: &Path,
) -> anyhow::Result<PathBuf> {
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let secret_name = wait_for(
        "the ServiceAccount's token Secret",
        DEFAULT_TIMEOUT,
        || async {
            let sa = accounts.get(name).await?;
            Ok(sa
                .secrets
                .unwrap_or_default()
                .first()
                .and_then(|r| r.name.clone()))
        },
    )
    .await?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let token = wait_for("the token", DEFAULT_TIMEOUT, || async {
        let s = secrets.get(&secret_name).await?;
        Ok(s.data
            .unwrap_or_default()
            .get("token")
            .map(|t| String::from_utf8_lossy(&t.0).into_owned()))
    })
    .await?;
    let ca = base64::engine::general_purpose::STANDARD.encode(cluster.ca_pem());
    let yaml = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority-data: {ca}\nusers:\n- name: {name}\n  user:\n    token: {token}\ncontexts:\n- name: {name}\n  context:\n    cluster: c\n    user: {name}\n    namespace: {ns}\ncurrent-context: {name}\n",
        cluster.server
    );
    std::fs::write(path, yaml)?;
    Ok(path.to_path_buf())
}

/// Fails unless `value` is `Some`.
pub fn some<T>(value: Option<T>, what: &str) -> anyhow::Result<T> {
    match value {
        Some(v) => Ok(v),
        None => bail!("{what} is missing"),
    }
}

pub fn secret_obj(
    ns: &str,
    name: &str,
    type_: &str,
    data: &[(&str, &[u8])],
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> Secret {
    let map = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: map(labels),
            annotations: map(annotations),
            ..ObjectMeta::default()
        },
        type_: Some(type_.into()),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

pub async fn create(client: &kube::Client, secret: &Secret) -> anyhow::Result<Secret> {
    let ns = secret.metadata.namespace.clone().unwrap_or_default();
    Ok(Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), secret)
        .await?)
}

pub async fn set_secret_data(
    client: &kube::Client,
    ns: &str,
    name: &str,
    data: Value,
) -> anyhow::Result<()> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": data})),
        )
        .await?;
    Ok(())
}

pub fn b64(s: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

pub fn rv(meta: &ObjectMeta) -> String {
    meta.resource_version.clone().unwrap_or_default()
}

/// A plugin run paused at a test-only pause point (`HELMOP_TEST_PAUSE`), and the file that
/// releases it.
pub struct Paused {
    pub process: PluginProcess,
    release: PathBuf,
    _dir: tempfile::TempDir,
}

impl Paused {
    /// Starts `args` and waits until the run pauses at `point` on `cluster`.
    pub async fn start(point: &str, cluster: &str, args: &[&str]) -> anyhow::Result<Paused> {
        let dir = tempfile::tempdir()?;
        let release = dir.path().join("release");
        let kubeconfig = control_plane().upstream().kubeconfig.clone();
        let mut full: Vec<&str> = args.to_vec();
        let kc = kubeconfig.display().to_string();
        full.extend(["--kubeconfig", &kc]);
        let pause = format!("{point}:{}", release.display());
        let process = PluginProcess::spawn(&full, &[("HELMOP_TEST_PAUSE", &pause)])?;
        let marker = format!("helmop-test: paused at {point} on {cluster}");
        let paused = Paused {
            process,
            release,
            _dir: dir,
        };
        wait_until(
            &format!("the run to pause at {point}"),
            Duration::from_secs(120),
            || {
                let seen = paused.process.stderr().contains(&marker);
                async move { Ok(seen) }
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e:#}\n{}", paused.process.context()))?;
        Ok(paused)
    }

    pub fn release_path(&self) -> &Path {
        &self.release
    }

    /// Lets the run go on.
    pub fn release(&self) -> anyhow::Result<()> {
        std::fs::write(&self.release, b"go")?;
        Ok(())
    }
}

/// A loopback HTTPS server (a self-signed certificate: reach it with [`loopback_kubeconfig`])
/// that answers every request with `status` and `body` as JSON: whatever may answer at a
/// Cluster's URL.
pub async fn fake_api_server(status: u16, body: String) -> anyhow::Result<u16> {
    let code = axum::http::StatusCode::from_u16(status)?;
    let app = axum::Router::new().fallback(move || {
        let body = body.clone();
        async move {
            (
                code,
                [(axum::http::header::CONTENT_TYPE, "application/json")],
                body,
            )
        }
    });
    serve_tls(app, &test_certs()).await
}

/// Serves `app` over TLS with `certs` on a free loopback port, in the background; the port.
pub async fn serve_tls(app: axum::Router, certs: &TestCerts) -> anyhow::Result<u16> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    listener.set_nonblocking(true)?;
    let port = listener.local_addr()?.port();
    let config = axum_server::tls_rustls::RustlsConfig::from_pem(
        certs.cert_pem.clone().into_bytes(),
        certs.key_pem.clone().into_bytes(),
    )
    .await?;
    let server = axum_server::from_tcp_rustls(listener, config)?;
    tokio::spawn(async move { server.serve(app.into_make_service()).await });
    Ok(port)
}

/// A webhook server that denies everything and counts the reviews it gets.
pub async fn start_denying_webhook(
    certs: &TestCerts,
) -> anyhow::Result<(String, std::sync::Arc<std::sync::atomic::AtomicUsize>)> {
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = calls.clone();
    let app = axum::Router::new().route(
        "/deny",
        axum::routing::post(move |axum::Json(review): axum::Json<Value>| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                axum::Json(json!({
                    "apiVersion": "admission.k8s.io/v1",
                    "kind": "AdmissionReview",
                    "response": {
                        "uid": review["request"]["uid"],
                        "allowed": false,
                        "status": {"code": 403, "message": "denied by the helmop-tests webhook"}
                    }
                }))
            }
        }),
    );
    let port = serve_tls(app, certs).await?;
    Ok((format!("https://127.0.0.1:{port}/deny"), calls))
}
