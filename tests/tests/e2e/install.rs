//! Installing helmop the way manifests/README.md tells users, on a real single-node cluster (kubelet,
//! containerd, pods), through kubectl only: an overlay over the shipped `self-signed` directory with the
//! `kube-1.20` component and kustomize `images:` pointing at the images `containers/build` pushed to a local
//! registry. The webhook runs under the shipped ServiceAccount and ClusterRole (the test's admin
//! credentials only run kubectl); the API server reaches it through its Service.
//!
//! Then an upgrade (the Deployment rolled to the same build under a new reference) while admissions keep
//! flowing through the API server, counting failures, and removal with `kubectl delete -k`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use base64::Engine;
use helmop_tests::images::{BuiltImage, build_images};
use helmop_tests::registry::TestRegistry;
use helmop_tests::{
    ClusterInfo, ControlPlane, ControlPlaneOptions, helmop_resource, manifests_dir, relative_path,
    wait_for, wait_until,
};
use kube::Client;
use kube::api::{Api, DynamicObject, PostParams};
use serde_json::{Value, json};

const NS: &str = "helmop-system";
const INSTALL_TIMEOUT: Duration = Duration::from_secs(240);

/// Writes the user's overlay: the rendered one-file install `deploy/<install>.yaml` (what the
/// README's install line applies; copied in, as kustomize reads files only below its root) + the
/// 1.20 component + `images:`.
fn write_overlay(dir: &Path, install: &str, webhook: &str) -> anyhow::Result<()> {
    let rendered = manifests_dir().join(format!("../deploy/{install}.yaml"));
    let file = format!("{install}.yaml");
    std::fs::copy(&rendered, dir.join(&file))
        .with_context(|| format!("copying {}", rendered.display()))?;
    let base = std::path::PathBuf::from(file);
    let component = relative_path(dir, &manifests_dir().join("kube-1.20"))?;
    let (name, reference) = webhook
        .split_once('@')
        .map(|(name, digest)| (name.to_owned(), format!("digest: {digest}")))
        .or_else(|| {
            webhook
                .rsplit_once(':')
                .map(|(name, tag)| (name.to_owned(), format!("newTag: {tag}")))
        })
        .context("image reference without tag or digest")?;
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "resources:\n  - {}\ncomponents:\n  - {}\nimages:\n  - name: ghcr.io/helmop/helmop-webhook\n    newName: {name}\n    {reference}\n",
            base.display(),
            component.display()
        ),
    )?;
    Ok(())
}

async fn kubectl(cluster: &ClusterInfo, args: &[&str]) -> anyhow::Result<String> {
    let out = cluster.run_kubectl(args, None).await?;
    ensure!(
        out.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

async fn get_json(cluster: &ClusterInfo, args: &[&str]) -> anyhow::Result<Option<Value>> {
    let mut full = vec!["get", "-o", "json"];
    full.extend_from_slice(args);
    let out = cluster.run_kubectl(&full, None).await?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("NotFound") || stderr.contains("not found") {
            return Ok(None);
        }
        bail!("kubectl {full:?}: {stderr}");
    }
    Ok(Some(serde_json::from_slice(&out.stdout)?))
}

/// `kubectl get pods` of the webhook Deployment, as JSON.
async fn webhook_pods(cluster: &ClusterInfo) -> anyhow::Result<Value> {
    let selector = [
        "-n",
        NS,
        "pods",
        "-l",
        "app.kubernetes.io/name=helmop-webhook",
    ];
    get_json(cluster, &selector).await?.context("no pod list")
}

/// A HelmOp; with `bad_name`, one listing a Secret by an invalid name (denied), else a valid one that lists
/// nothing (so nothing has to exist for it to be allowed).
fn helmop(name: &str, namespace: &str, bad_name: bool) -> Value {
    let mut spec =
        json!({"helm": {"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3"}});
    if bad_name {
        spec["downstreamResources"] = json!([{"kind": "Secret", "name": "Bad_Name"}]);
    }
    json!({
        "apiVersion": "fleet.cattle.io/v1alpha1",
        "kind": "HelmOp",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    })
}

/// Creating the invalid HelmOp `name` through the API server is denied by the webhook (it was
/// called and answered), not refused for failing to reach it.
async fn denied_by_the_webhook(
    api: &Api<DynamicObject>,
    ns: &str,
    name: &str,
) -> anyhow::Result<()> {
    let bad: DynamicObject = serde_json::from_value(helmop(name, ns, true))?;
    match api.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(status)) => ensure!(
            status.message.contains("helmops.validate.helmop.dev")
                && status.message.contains("denied the request"),
            "not denied by the webhook: {}",
            status.message
        ),
        other => bail!("invalid HelmOp not denied: {other:?}"),
    }
    Ok(())
}

/// The webhook Deployment has rolled out `image` on every replica: 2 updated, 2 ready, no old pod left.
async fn wait_rolled_out(cluster: &ClusterInfo, image: &str) -> anyhow::Result<()> {
    wait_until(
        &format!("helmop-webhook to run {image} on 2 ready replicas"),
        INSTALL_TIMEOUT,
        || async move {
            let Some(d) = get_json(cluster, &["-n", NS, "deployment", "helmop-webhook"]).await?
            else {
                return Ok(false);
            };
            let status = &d["status"];
            let current = d["spec"]["template"]["spec"]["containers"][0]["image"] == image
                && status["observedGeneration"] == d["metadata"]["generation"];
            let ready = status["updatedReplicas"] == 2
                && status["readyReplicas"] == 2
                && status["replicas"] == 2
                && status["availableReplicas"] == 2;
            if !(current && ready) {
                return Ok(false);
            }
            let pods = webhook_pods(cluster).await?;
            let items = pods["items"].as_array().cloned().unwrap_or_default();
            Ok(items.len() == 2
                && items
                    .iter()
                    .all(|p| p["spec"]["containers"][0]["image"] == image))
        },
    )
    .await
}

async fn job_succeeded(cluster: &ClusterInfo, name: &str) -> anyhow::Result<()> {
    wait_until(
        &format!("Job {NS}/{name} to succeed"),
        INSTALL_TIMEOUT,
        || async move {
            Ok(get_json(cluster, &["-n", NS, "job", name])
                .await?
                .is_some_and(|j| j["status"]["succeeded"].as_i64().unwrap_or(0) >= 1))
        },
    )
    .await
}

/// Sends admissions through the API server until `stop`: server-side dry-run creates of a valid HelmOp
/// (must be allowed) and of an invalid one (must be denied by the webhook, not fail to reach it).
async fn admission_loop(
    client: Client,
    namespace: String,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    failures: Arc<tokio::sync::Mutex<Vec<String>>>,
) {
    let api: Api<DynamicObject> = Api::namespaced_with(client, &namespace, &helmop_resource());
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut i = 0u64;
    while !stop.load(Ordering::SeqCst) {
        i += 1;
        let valid = i.is_multiple_of(2);
        let doc = if valid {
            helmop(&format!("roll-{i}"), &namespace, false)
        } else {
            helmop(&format!("roll-{i}"), &namespace, true)
        };
        let object: DynamicObject = match serde_json::from_value(doc) {
            Ok(o) => o,
            Err(e) => {
                failures.lock().await.push(format!("#{i}: {e}"));
                continue;
            }
        };
        let result =
            tokio::time::timeout(Duration::from_secs(15), api.create(&dry_run, &object)).await;
        sent.fetch_add(1, Ordering::SeqCst);
        let failure = match (valid, result) {
            (_, Err(_)) => Some("no answer within 15 s".to_owned()),
            (true, Ok(Ok(_))) => None,
            (true, Ok(Err(e))) => Some(format!("valid HelmOp refused: {e}")),
            (false, Ok(Ok(_))) => Some("invalid HelmOp admitted".to_owned()),
            (false, Ok(Err(kube::Error::Api(status))))
                if status.message.contains("denied the request")
                    && status.message.contains("Bad_Name") =>
            {
                None
            }
            (false, Ok(Err(e))) => Some(format!("invalid HelmOp not denied by the webhook: {e}")),
        };
        if let Some(f) = failure {
            failures.lock().await.push(format!("#{i}: {f}"));
        }
    }
}

/// Everything the test checks after `kubectl apply -k` (and after the upgrade).
/// `install` is the shipped directory the overlay is over: `stamping-only` keeps a validating configuration
/// without webhooks.
async fn check_installed(cluster: &ClusterInfo, install: &str) -> anyhow::Result<()> {
    job_succeeded(cluster, "helmop-hash-key-init").await?;
    job_succeeded(cluster, "helmop-tls-bootstrap").await?;
    let key = get_json(cluster, &["-n", NS, "secret", "helmop-hash-key"])
        .await?
        .context("hash-key Secret missing")?;
    ensure!(
        key["data"]["key"].is_string(),
        "hash key without data key `key`"
    );
    for kind in [
        "validatingwebhookconfiguration",
        "mutatingwebhookconfiguration",
    ] {
        let config = get_json(cluster, &[kind, "helmop-webhook"])
            .await?
            .with_context(|| format!("{kind} helmop-webhook missing"))?;
        let webhooks = config["webhooks"].as_array().cloned().unwrap_or_default();
        if install == "stamping-only" && kind == "validatingwebhookconfiguration" {
            ensure!(webhooks.is_empty(), "stamping-only validates: {config}");
            continue;
        }
        ensure!(!webhooks.is_empty(), "{kind}: no webhooks");
        for w in &webhooks {
            ensure!(
                w["clientConfig"]["caBundle"]
                    .as_str()
                    .is_some_and(|b| !b.is_empty()),
                "{kind} {}: caBundle not filled by the bootstrap",
                w["name"]
            );
            ensure!(w["clientConfig"]["service"]["name"] == "helmop-webhook");
        }
    }
    let pdb = get_json(cluster, &["-n", NS, "pdb", "helmop-webhook"])
        .await?
        .context("PodDisruptionBudget helmop-webhook missing")?;
    ensure!(pdb["spec"]["minAvailable"] == 1, "{pdb}");
    // The webhook runs as the shipped ServiceAccount, which cannot write anything.
    let pods = webhook_pods(cluster).await?;
    for pod in pods["items"].as_array().context("no pods")? {
        ensure!(
            pod["spec"]["serviceAccountName"] == "helmop-webhook",
            "{pod}"
        );
    }
    let sa = "system:serviceaccount:helmop-system:helmop-webhook";
    for (verb, resource) in [
        ("create", "secrets"),
        ("delete", "configmaps"),
        (
            "update",
            "validatingwebhookconfigurations.admissionregistration.k8s.io",
        ),
        ("create", "helmops.fleet.cattle.io"),
    ] {
        let out = cluster
            .run_kubectl(&["auth", "can-i", verb, resource, "-A", "--as", sa], None)
            .await?;
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        ensure!(answer == "no", "{sa} can {verb} {resource}: {answer}");
    }
    Ok(())
}

/// Installs, checks, upgrades under load, removes. `node` is a cluster with a kubelet; `registry` is
/// reachable from its containerd.
async fn install_upgrade_remove(cp: &ControlPlane, registry: &TestRegistry) -> anyhow::Result<()> {
    let node = cp.cluster("install");
    let started = std::time::Instant::now();
    let images = build_images(registry.host(), "e2e").await?;
    let webhook: &BuiltImage = images
        .iter()
        .find(|i| i.name == "helmop-webhook")
        .context("no helmop-webhook image")?;
    eprintln!("images built and pushed in {:?}", started.elapsed());

    // 1.20 does not label namespaces by name: do by hand what manifests/README.md says.
    kubectl(
        node,
        &[
            "label",
            "--overwrite",
            "ns",
            "kube-system",
            "kubernetes.io/metadata.name=kube-system",
        ],
    )
    .await?;

    let overlay = tempfile::tempdir()?;
    let dir = overlay
        .path()
        .to_str()
        .context("temp dir not UTF-8")?
        .to_owned();
    write_overlay(overlay.path(), "self-signed", &webhook.tagged())?;
    let started = std::time::Instant::now();
    kubectl(node, &["apply", "-k", &dir]).await?;
    wait_rolled_out(node, &webhook.tagged()).await?;
    check_installed(node, "self-signed").await?;
    eprintln!("installed (2 replicas ready) in {:?}", started.elapsed());

    // An invalid HelmOp is denied through the Service; a valid one is allowed.
    let ns = format!("install-{}", std::process::id());
    kubectl(node, &["create", "ns", &ns]).await?;
    let client = node.client().await;
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &helmop_resource());
    denied_by_the_webhook(&api, &ns, "bad").await?;
    let good: DynamicObject = serde_json::from_value(helmop("good", &ns, false))?;
    api.create(&PostParams::default(), &good)
        .await
        .map_err(|e| anyhow::anyhow!("a valid HelmOp was refused: {e}"))?;

    // Upgrade: the same build under its digest is a new image for the Deployment; roll it while
    // admissions keep going through the API server.
    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let failures = Arc::new(tokio::sync::Mutex::new(Vec::new()));
    let load = tokio::spawn(admission_loop(
        client.clone(),
        ns.clone(),
        stop.clone(),
        sent.clone(),
        failures.clone(),
    ));
    let before = sent.load(Ordering::SeqCst);
    wait_until(
        "the admission loop to get going",
        Duration::from_secs(30),
        || {
            let sent = sent.clone();
            async move { Ok(sent.load(Ordering::SeqCst) >= before + 10) }
        },
    )
    .await?;
    let started = std::time::Instant::now();
    kubectl(
        node,
        &[
            "-n",
            NS,
            "delete",
            "job",
            "helmop-hash-key-init",
            "helmop-tls-bootstrap",
        ],
    )
    .await?;
    write_overlay(overlay.path(), "self-signed", &webhook.pinned())?;
    kubectl(node, &["apply", "-k", &dir]).await?;
    let rolled = wait_rolled_out(node, &webhook.pinned()).await;
    // Keep sending a little after the last old pod is gone (its endpoint removal is the risky part).
    let at_roll_end = sent.load(Ordering::SeqCst);
    let tail = wait_until("admissions after the roll", Duration::from_secs(30), || {
        let sent = sent.clone();
        async move { Ok(sent.load(Ordering::SeqCst) >= at_roll_end + 20) }
    })
    .await;
    stop.store(true, Ordering::SeqCst);
    load.await.context("admission loop panicked")?;
    rolled?;
    tail?;
    let failures = failures.lock().await.clone();
    let total = sent.load(Ordering::SeqCst);
    eprintln!(
        "rolled to {} in {:?}: {total} admissions sent, {} failed",
        webhook.pinned(),
        started.elapsed(),
        failures.len()
    );
    ensure!(
        failures.is_empty(),
        "{} of {total} admissions failed during the roll: {failures:#?}",
        failures.len()
    );
    check_installed(node, "self-signed").await?;

    client_auth(cp, overlay.path(), &webhook.pinned(), &ns).await?;
    check_installed(node, "client-auth").await?;

    kubectl(node, &["delete", "ns", &ns, "--wait=false"]).await?;
    remove(node, &dir).await?;

    // The downstream variant installs the same way.
    write_overlay(overlay.path(), "stamping-only", &webhook.tagged())?;
    let started = std::time::Instant::now();
    kubectl(node, &["apply", "-k", &dir]).await?;
    wait_rolled_out(node, &webhook.tagged()).await?;
    check_installed(node, "stamping-only").await?;
    eprintln!("stamping-only installed in {:?}", started.elapsed());
    remove(node, &dir).await
}

/// `kubectl delete -k`, then nothing of helmop is left: namespace, RBAC, webhook configurations.
async fn remove(node: &ClusterInfo, dir: &str) -> anyhow::Result<()> {
    let started = std::time::Instant::now();
    kubectl(node, &["delete", "-k", dir, "--wait=false"]).await?;
    let last_left_store = std::sync::Mutex::new(Vec::<String>::new());
    let last_left = &last_left_store;
    let gone = wait_for("helmop to be gone", INSTALL_TIMEOUT, || async move {
        let mut left = Vec::new();
        for (kind, name) in [
            ("namespace", NS),
            ("validatingwebhookconfiguration", "helmop-webhook"),
            ("mutatingwebhookconfiguration", "helmop-webhook"),
            ("clusterrole", "helmop-webhook"),
            ("clusterrolebinding", "helmop-webhook"),
            ("clusterrole", "helmop-tls-bootstrap"),
            ("clusterrolebinding", "helmop-tls-bootstrap"),
        ] {
            if get_json(node, &[kind, name]).await?.is_some() {
                left.push(format!("{kind}/{name}"));
            }
        }
        for kind in [
            "clusterroles",
            "clusterrolebindings",
            "validatingwebhookconfigurations",
            "mutatingwebhookconfigurations",
            "namespaces",
        ] {
            let list = get_json(node, &[kind, "-l", "app.kubernetes.io/part-of=helmop"])
                .await?
                .context("no list")?;
            for item in list["items"].as_array().into_iter().flatten() {
                left.push(format!("{kind}/{}", item["metadata"]["name"]));
            }
        }
        let done = left.is_empty();
        if let Ok(mut last) = last_left.lock() {
            *last = left;
        }
        Ok(done.then_some(()))
    })
    .await;
    if let Err(e) = gone {
        let left = last_left.lock().map(|l| l.clone()).unwrap_or_default();
        bail!("{e:#}; still there: {left:?}");
    }
    eprintln!("removed in {:?}", started.elapsed());
    Ok(())
}

/// A private control plane with a node: installing and removing helmop touches cluster-wide objects
/// (webhook configurations, ClusterRoles) that the shared node cluster's other tests must not see come
/// and go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_from_the_shipped_manifests_upgrade_without_failed_admissions_and_remove()
-> anyhow::Result<()> {
    let started = std::time::Instant::now();
    let cp = tokio::task::spawn_blocking(|| {
        ControlPlane::start_with(&["install"], &ControlPlaneOptions::with_node())
    })
    .await??;
    eprintln!("control plane with a node up in {:?}", started.elapsed());
    let node = cp.node()?;
    let registry = TestRegistry::start_on(&node.host_address).await?;
    node.allow_http_registry(registry.host())?;
    install_upgrade_remove(&cp, &registry).await
}

/// Turning client-certificate authentication on as manifests/README.md says, on the
/// running install. The operator copies Secret `helmop-apiserver-client` to the control-plane node and
/// restarts the API server with an admission configuration presenting it, then applies `client-auth`.
/// Afterwards the API server's reviews are answered (an invalid HelmOp is denied by the webhook), and a
/// review sent straight to a webhook pod is answered only with that certificate: without one the TLS
/// handshake fails and a forged review learns nothing.
async fn client_auth(
    cp: &ControlPlane,
    overlay: &Path,
    image: &str,
    ns: &str,
) -> anyhow::Result<()> {
    let node = cp.cluster("install");
    let secret = get_json(node, &["-n", NS, "secret", "helmop-apiserver-client"])
        .await?
        .context("Secret helmop-apiserver-client missing after the install")?;
    let field = |key: &str| -> anyhow::Result<Vec<u8>> {
        let text = secret["data"][key]
            .as_str()
            .with_context(|| format!("helmop-apiserver-client has no {key}"))?;
        Ok(base64::engine::general_purpose::STANDARD.decode(text)?)
    };
    let (cert, key) = (field("tls.crt")?, field("tls.key")?);
    let files = tempfile::tempdir()?;
    let (cert_file, key_file) = (files.path().join("tls.crt"), files.path().join("tls.key"));
    std::fs::write(&cert_file, &cert)?;
    std::fs::write(&key_file, &key)?;
    let started = std::time::Instant::now();
    // `cp` waits on child processes: off the async workers, without giving up the borrow.
    tokio::task::block_in_place(|| {
        cp.stop_cluster("install")?;
        cp.start_cluster_with_webhook_client("install", &cert_file, &key_file)
    })?;
    eprintln!(
        "API server restarted with the webhook client certificate in {:?}",
        started.elapsed()
    );

    let dir = overlay.to_str().context("temp dir not UTF-8")?;
    write_overlay(overlay, "client-auth", image)?;
    kubectl(node, &["apply", "-k", dir]).await?;
    wait_until(
        "helmop-webhook to run with --client-ca on 2 ready replicas",
        INSTALL_TIMEOUT,
        || async move {
            let pods = webhook_pods(node).await?;
            let items = pods["items"].as_array().cloned().unwrap_or_default();
            Ok(items.len() == 2
                && items.iter().all(|p| {
                    p["metadata"]["deletionTimestamp"].is_null()
                        && p["spec"]["containers"][0]["args"]
                            .as_array()
                            .is_some_and(|a| a.iter().any(|a| a == "--client-ca=/tls/ca.crt"))
                        && p["status"]["conditions"].as_array().is_some_and(|c| {
                            c.iter()
                                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                        })
                }))
        },
    )
    .await?;

    // The API server presents its certificate: its reviews are answered.
    let client = node.client().await;
    let api: Api<DynamicObject> = Api::namespaced_with(client, ns, &helmop_resource());
    denied_by_the_webhook(&api, ns, "bad-mtls")
        .await
        .context("with client-auth on")?;

    // Straight to a pod: only the API server's certificate gets an answer.
    let serving = get_json(node, &["-n", NS, "secret", "helmop-webhook-tls"])
        .await?
        .context("Secret helmop-webhook-tls missing")?;
    let ca = base64::engine::general_purpose::STANDARD.decode(
        serving["data"]["ca.crt"]
            .as_str()
            .context("helmop-webhook-tls has no ca.crt")?,
    )?;
    let pods = webhook_pods(node).await?;
    let ip: std::net::IpAddr = pods["items"][0]["status"]["podIP"]
        .as_str()
        .context("a webhook pod without an IP")?
        .parse()?;
    let forged = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "forged", "kind": {"group": "", "version": "v1", "kind": "Secret"},
            "resource": {"group": "", "version": "v1", "resource": "secrets"},
            "name": "db", "namespace": ns, "operation": "DELETE",
            "userInfo": {"username": "mallory"},
            "oldObject": {"apiVersion": "v1", "kind": "Secret",
                          "metadata": {"name": "db", "namespace": ns}},
        },
    })
    .to_string();
    let host = "helmop-webhook.helmop-system.svc";
    let url = format!("https://{host}:8443/validate/references");
    let mut identity = cert.clone();
    identity.extend_from_slice(&key);
    for (who, identity) in [
        ("no certificate", None),
        (
            "the API server's certificate",
            Some(reqwest::Identity::from_pem(&identity)?),
        ),
    ] {
        let mut builder = reqwest::Client::builder()
            .use_rustls_tls()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca)?)
            .resolve(host, std::net::SocketAddr::new(ip, 8443))
            .timeout(Duration::from_secs(10));
        let expected = identity.is_some();
        if let Some(identity) = identity {
            builder = builder.identity(identity);
        }
        let answer = builder
            .build()?
            .post(&url)
            .header("content-type", "application/json")
            .body(forged.clone())
            .send()
            .await;
        match (expected, answer) {
            (true, Ok(r)) => ensure!(r.status().is_success(), "{who}: answered {}", r.status()),
            (true, Err(e)) => bail!("{who}: no answer: {e:#}"),
            (false, Ok(r)) => bail!("{who}: answered {}", r.status()),
            (false, Err(_)) => {}
        }
    }
    Ok(())
}
