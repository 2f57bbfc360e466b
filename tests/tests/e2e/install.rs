//! Installing helmop the way manifests/README.md tells users, on a real single-node cluster (kubelet,
//! containerd, pods), through kubectl only: an overlay over the shipped `self-signed` directory with the
//! `kube-1.20` component and kustomize `images:` pointing at the images `containers/build` pushed to a local
//! registry. The webhook runs under the shipped ServiceAccount and ClusterRole (the test's admin
//! credentials only run kubectl); the API server reaches it through its Service. After each install
//! `kubectl helmop check` finds no problem, as the README's install section says to run it.
//!
//! Then an upgrade (the Deployment rolled to the same build under a new reference) by re-applying and
//! nothing else, while admissions keep flowing through the API server, counting failures; and the uninstall
//! docs/uninstall.md describes: `kubectl delete -k`, after which stamped workloads keep running unrolled and
//! a guarded namespace deletes, and a reinstall over a backed-up hash key keeps every stamp.

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

use crate::plugin::support::run_with;

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

/// `kubectl get -o json` of a list. A list always exists, so a failure is kubectl's or the API server's:
/// retried twice, a second apart (a request can fail once while the webhook rolls or kubectl rediscovers the
/// API); then the error with kubectl's own words.
async fn list_json(cluster: &ClusterInfo, args: &[&str]) -> anyhow::Result<Value> {
    let mut full = vec!["get", "-o", "json"];
    full.extend_from_slice(args);
    let mut attempts = 0;
    loop {
        attempts += 1;
        let out = cluster.run_kubectl(&full, None).await?;
        if out.status.success() {
            return Ok(serde_json::from_slice(&out.stdout)?);
        }
        let stderr = String::from_utf8_lossy(&out.stderr);
        if attempts == 3 {
            bail!("kubectl {full:?} failed {attempts} times, last: {stderr}");
        }
        eprintln!("kubectl {full:?} failed, retrying: {stderr}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
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
    let jobs = list_json(cluster, &["-n", NS, "jobs"]).await?;
    let jobs: Vec<&str> = jobs["items"]
        .as_array()
        .context("a Job list without items")?
        .iter()
        .map(|job| job["metadata"]["name"].as_str().unwrap_or("?"))
        .collect();
    ensure!(
        jobs.is_empty(),
        "install Jobs exist ({jobs:?}): the bootstrap runs as initContainers"
    );
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
    // The webhook runs as the shipped ServiceAccount, whose only writes are its initContainers' bootstrap.
    let pods = webhook_pods(cluster).await?;
    for pod in pods["items"].as_array().context("no pods")? {
        ensure!(
            pod["spec"]["serviceAccountName"] == "helmop-webhook",
            "{pod}"
        );
    }
    let sa = "system:serviceaccount:helmop-system:helmop-webhook";
    let vwc = "validatingwebhookconfigurations.admissionregistration.k8s.io";
    for (verb, resource, namespace, allowed) in [
        ("create", "secrets".to_owned(), Some(NS), true),
        ("create", "secrets".to_owned(), Some("default"), false),
        ("create", "secrets".to_owned(), None, false),
        ("delete", "secrets".to_owned(), Some(NS), false),
        (
            "update",
            "secrets/helmop-hash-key".to_owned(),
            Some(NS),
            false,
        ),
        ("delete", "configmaps".to_owned(), None, false),
        ("update", format!("{vwc}/helmop-webhook"), None, true),
        ("update", format!("{vwc}/another-webhook"), None, false),
        ("delete", format!("{vwc}/helmop-webhook"), None, false),
        ("update", vwc.to_owned(), None, false),
        ("create", "helmops.fleet.cattle.io".to_owned(), None, false),
    ] {
        let mut args = vec!["auth", "can-i", verb, resource.as_str(), "--as", sa];
        match namespace {
            Some(ns) => args.extend(["-n", ns]),
            None => args.push("-A"),
        }
        let out = cluster.run_kubectl(&args, None).await?;
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        ensure!(
            answer == if allowed { "yes" } else { "no" },
            "{sa} can {verb} {resource} in {namespace:?}: {answer}"
        );
    }
    doctor_finds_no_problem(cluster, install).await
}

/// `kubectl helmop check` on the installed cluster, as the README's install section ends: no problem
/// (exit 0), both webhooks answered through the API server and the Service, the serving certificate
/// read from the Deployment's Secret verifies against caBundle, the hash key is there.
async fn doctor_finds_no_problem(cluster: &ClusterInfo, install: &str) -> anyhow::Result<()> {
    let out = run_with(
        &cluster.kubeconfig,
        &["check", "-n", "default", "-o", "json"],
        &[],
    )
    .await?;
    let report: Value = serde_json::from_str(&out.stdout)
        .with_context(|| format!("check -o json printed no JSON: {}", out.stderr))?;
    ensure!(
        out.code == 0 && report["result"] != "problem",
        "check found a problem in the {install} install (exit {}): {report:#}",
        out.code
    );
    let verdict = |check: &str, subject: &str| -> Option<(String, String)> {
        report["findings"].as_array()?.iter().find_map(|f| {
            (f["check"] == check && f["subject"] == subject).then(|| {
                (
                    f["verdict"].as_str().unwrap_or_default().to_owned(),
                    f["message"].as_str().unwrap_or_default().to_owned(),
                )
            })
        })
    };
    let validating = "validating/helmop-webhook";
    let mutating = "mutating/helmop-webhook";
    let mut wanted = vec![
        ("webhook-configuration", validating, ""),
        ("webhook-configuration", mutating, ""),
        ("webhook-answer", mutating, "stamped (v2:"),
        (
            "serving-certificate",
            mutating,
            "verified for helmop-webhook.",
        ),
        (
            "hash-key",
            "secret/helmop-system/helmop-hash-key",
            "present",
        ),
    ];
    wanted.push(if install == "stamping-only" {
        ("webhook-answer", validating, "no HelmOp webhook to ask")
    } else {
        ("webhook-answer", validating, "denied an invalid HelmOp")
    });
    for (check, subject, says) in wanted {
        let (v, message) = verdict(check, subject)
            .with_context(|| format!("no {check} finding about {subject}: {report:#}"))?;
        ensure!(
            v == "ok" && message.contains(says),
            "{check} {subject} in the {install} install: {v}: {message}"
        );
    }
    // Who may call the webhook: with client-auth only the API server; without it and with no
    // NetworkPolicy any pod, which is said as a warning.
    let port = "service/helmop-system/helmop-webhook";
    let (v, message) = verdict("admission-port", port)
        .with_context(|| format!("no admission-port finding: {report:#}"))?;
    let (want, says) = if install == "client-auth" {
        ("ok", "--client-ca")
    } else {
        ("warning", "any pod can post a review")
    };
    ensure!(
        v == want && message.contains(says),
        "admission-port in the {install} install: {v}: {message}"
    );
    Ok(())
}

/// What the bootstrap made and an upgrade must keep: the hash key's bytes, the CA certificate, and every
/// `caBundle`, which must trust that CA.
async fn bootstrap_state(cluster: &ClusterInfo) -> anyhow::Result<(String, String, Vec<String>)> {
    let secret_field = |name: &'static str, key: &'static str| async move {
        let secret = get_json(cluster, &["-n", NS, "secret", name])
            .await?
            .with_context(|| format!("Secret {name} missing"))?;
        secret["data"][key]
            .as_str()
            .map(str::to_owned)
            .with_context(|| format!("Secret {name} has no {key}"))
    };
    let key = secret_field("helmop-hash-key", "key").await?;
    let ca = secret_field("helmop-webhook-ca", "tls.crt").await?;
    let ca_pem = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(&ca)?)?;
    let mut bundles = Vec::new();
    for kind in [
        "validatingwebhookconfiguration",
        "mutatingwebhookconfiguration",
    ] {
        let config = get_json(cluster, &[kind, "helmop-webhook"])
            .await?
            .with_context(|| format!("{kind} missing"))?;
        for w in config["webhooks"].as_array().into_iter().flatten() {
            let bundle = w["clientConfig"]["caBundle"]
                .as_str()
                .context("caBundle missing")?;
            let pem = String::from_utf8(base64::engine::general_purpose::STANDARD.decode(bundle)?)?;
            ensure!(
                helmop_webhook::bootstrap::pem_blocks(&pem).contains(&ca_pem.trim()),
                "{kind} {}: caBundle does not trust the CA",
                w["name"]
            );
            bundles.push(bundle.to_owned());
        }
    }
    Ok((key, ca, bundles))
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
    let installed = bootstrap_state(node).await?;
    let app = StampedApp::create(node, registry).await?;

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
    // Nothing but the re-apply: no Job to delete, no other command.
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
    // The initContainers ran again on every new pod and changed nothing: same key bytes, same CA, same
    // caBundle. So the webhook stamps as before: an UPDATE of the workload keeps its stamp, no rollout.
    ensure!(
        bootstrap_state(node).await? == installed,
        "the upgrade changed the hash key, the CA or a caBundle"
    );
    app.updated_without_rollout(node).await?;

    client_auth(cp, overlay.path(), &webhook.pinned(), &ns).await?;
    check_installed(node, "client-auth").await?;

    // Uninstall as docs/uninstall.md says: back up the hash key, `kubectl delete -k`.
    let backup = tempfile::tempdir()?;
    let key_file = backup.path().join("helmop-hash-key.bin");
    let key_path = key_file.to_str().context("temp dir not UTF-8")?;
    let saved = kubectl(
        node,
        &[
            "-n",
            NS,
            "get",
            "secret",
            "helmop-hash-key",
            "-o",
            "jsonpath={.data.key}",
        ],
    )
    .await?;
    std::fs::write(
        &key_file,
        base64::engine::general_purpose::STANDARD.decode(saved.trim())?,
    )?;
    kubectl(node, &["delete", "ns", &ns, "--wait=false"]).await?;
    let before = app.running(node).await?;
    remove(node, &dir).await?;
    app.left_running_and_guarded_namespace_deletes(node, &before)
        .await?;

    // Reinstalled over the restored key (here the downstream variant, which installs the same way): the
    // bootstrap keeps it, so stamps stay and the workload does not roll.
    kubectl(node, &["create", "namespace", NS]).await?;
    kubectl(
        node,
        &[
            "-n",
            NS,
            "create",
            "secret",
            "generic",
            "helmop-hash-key",
            &format!("--from-file=key={key_path}"),
        ],
    )
    .await?;
    write_overlay(overlay.path(), "stamping-only", &webhook.tagged())?;
    let started = std::time::Instant::now();
    kubectl(node, &["apply", "-k", &dir]).await?;
    wait_rolled_out(node, &webhook.tagged()).await?;
    check_installed(node, "stamping-only").await?;
    eprintln!("stamping-only installed in {:?}", started.elapsed());
    ensure!(
        bootstrap_state(node).await?.0 == installed.0,
        "the reinstall replaced the restored hash key"
    );
    app.updated_without_rollout(node).await?;
    remove(node, &dir).await?;

    // What docs/uninstall.md says to sweep last: helmop's namespace labels.
    let names = kubectl(
        node,
        &[
            "get",
            "ns",
            "-l",
            "helmop.dev/rollout-on-change",
            "-o",
            "name",
        ],
    )
    .await?;
    ensure!(
        names.lines().any(|l| l == format!("namespace/{}", app.ns)),
        "{names}"
    );
    kubectl(
        node,
        &[
            "label",
            "ns",
            "--all",
            "helmop.dev/guard-",
            "helmop.dev/rollout-on-change-",
        ],
    )
    .await?;
    let left = kubectl(node, &["get", "ns", "-l", "helmop.dev/guard", "-o", "name"]).await?
        + &kubectl(
            node,
            &[
                "get",
                "ns",
                "-l",
                "helmop.dev/rollout-on-change",
                "-o",
                "name",
            ],
        )
        .await?;
    ensure!(left.trim().is_empty(), "labelled namespaces left: {left}");
    kubectl(node, &["delete", "ns", &app.ns, "--wait=false"]).await?;
    Ok(())
}

/// What an uninstall must leave working: a Deployment stamped by the webhook in a namespace opted in to
/// stamping, and a namespace guarded by the delete guard holding a Secret a HelmOp lists.
struct StampedApp {
    ns: String,
    guarded: String,
}

/// A running workload as seen at one moment: its stamp, how many ReplicaSets it has had (one per
/// rollout), its pods' UIDs. Not the generation: on a Deployment an annotation change bumps it too.
#[derive(Debug, PartialEq)]
struct Running {
    stamp: String,
    replica_sets: usize,
    pods: Vec<String>,
}

impl StampedApp {
    async fn create(node: &ClusterInfo, registry: &TestRegistry) -> anyhow::Result<StampedApp> {
        let image =
            helmop_tests::build_busybox_image(registry, "uninstall-app", "v1", "app").await?;
        let pid = std::process::id();
        let app = StampedApp {
            ns: format!("app-{pid}"),
            guarded: format!("guarded-{pid}"),
        };
        let docs = json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": app.ns,
                "labels": {"helmop.dev/rollout-on-change": "enabled"}}},
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "app-config", "namespace": app.ns}, "data": {"greeting": "hello"}},
            {"apiVersion": "apps/v1", "kind": "Deployment",
             "metadata": {"name": "app", "namespace": app.ns},
             "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "app"}},
                      "template": {"metadata": {"labels": {"app": "app"}},
                                   "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
                                       "name": "app",
                                       // By digest: nothing for the webhook to resolve.
                                       "image": format!("{}@{}", image.reference.rsplit_once(':').map_or(image.reference.as_str(), |(r, _)| r), image.digest),
                                       "command": ["sleep", "100000"],
                                       "envFrom": [{"configMapRef": {"name": "app-config"}}]}]}}}},
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": app.guarded,
                "labels": {"helmop.dev/guard": "enabled"}}},
            {"apiVersion": "v1", "kind": "Secret",
             "metadata": {"name": "db", "namespace": app.guarded}, "stringData": {"password": "x"}},
        ]});
        let out = node
            .run_kubectl(&["apply", "-f", "-"], Some(&docs.to_string()))
            .await?;
        ensure!(
            out.status.success(),
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let mut web = helmop("web", &app.guarded, false);
        web["spec"]["downstreamResources"] = json!([{"kind": "Secret", "name": "db"}]);
        let web = web.to_string();
        // Until the webhook's caches have seen the new namespaces and the Secret: the HelmOp is denied for a
        // missing Secret, and a workload written before its namespace's opt-in label was seen is not stamped.
        let (ns, web) = (app.ns.as_str(), web.as_str());
        wait_until(
            "the HelmOp admitted and the Deployment stamped",
            INSTALL_TIMEOUT,
            || async move {
                let applied = node.run_kubectl(&["apply", "-f", "-"], Some(web)).await?;
                let stamped = get_json(node, &["-n", ns, "deployment", "app"])
                    .await?
                    .is_some_and(|d| {
                        d["spec"]["template"]["metadata"]["annotations"]["helmop.dev/config-hash"]
                            .is_string()
                    });
                if !stamped {
                    let touched = format!(
                        "example.com/touched={}",
                        std::time::UNIX_EPOCH.elapsed()?.as_nanos()
                    );
                    kubectl(
                        node,
                        &[
                            "-n",
                            ns,
                            "annotate",
                            "--overwrite",
                            "deployment",
                            "app",
                            &touched,
                        ],
                    )
                    .await?;
                }
                Ok(applied.status.success() && stamped)
            },
        )
        .await?;
        app.running(node).await?;
        // The guard is on: the listed Secret cannot go while helmop is installed.
        let out = node
            .run_kubectl(&["-n", &app.guarded, "delete", "secret", "db"], None)
            .await?;
        ensure!(
            !out.status.success()
                && String::from_utf8_lossy(&out.stderr).contains("references.validate.helmop.dev"),
            "the delete guard let a listed Secret go: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(app)
    }

    /// Waits until the Deployment is rolled out with one ready pod, and returns what is running.
    async fn running(&self, node: &ClusterInfo) -> anyhow::Result<Running> {
        let ns = self.ns.as_str();
        wait_for(
            "the stamped Deployment to run one ready pod",
            INSTALL_TIMEOUT,
            || async move {
                let Some(d) = get_json(node, &["-n", ns, "deployment", "app"]).await? else {
                    return Ok(None);
                };
                let status = &d["status"];
                if status["observedGeneration"] != d["metadata"]["generation"]
                    || status["readyReplicas"] != 1
                    || status["updatedReplicas"] != 1
                    || status["replicas"] != 1
                {
                    return Ok(None);
                }
                let pods = get_json(node, &["-n", ns, "pods", "-l", "app=app"])
                    .await?
                    .context("no pod list")?;
                let items = pods["items"].as_array().cloned().unwrap_or_default();
                let ready = |p: &Value| {
                    p["metadata"]["deletionTimestamp"].is_null()
                        && p["status"]["conditions"].as_array().is_some_and(|c| {
                            c.iter()
                                .any(|c| c["type"] == "Ready" && c["status"] == "True")
                        })
                };
                if items.len() != 1 || !items.iter().all(ready) {
                    return Ok(None);
                }
                let replica_sets = get_json(node, &["-n", ns, "replicasets", "-l", "app=app"])
                    .await?
                    .context("no ReplicaSet list")?;
                Ok(Some(Running {
                    replica_sets: replica_sets["items"].as_array().map_or(0, Vec::len),
                    stamp:
                        d["spec"]["template"]["metadata"]["annotations"]["helmop.dev/config-hash"]
                            .as_str()
                            .unwrap_or_default()
                            .to_owned(),
                    pods: items
                        .iter()
                        .map(|p| p["metadata"]["uid"].as_str().unwrap_or_default().to_owned())
                        .collect(),
                }))
            },
        )
        .await
    }

    /// An UPDATE of the Deployment goes through the webhook, which restamps it under the cluster's key: the
    /// same key gives the same stamp, so the template and the pods stay.
    async fn updated_without_rollout(&self, node: &ClusterInfo) -> anyhow::Result<()> {
        let before = self.running(node).await?;
        let touched = format!(
            "example.com/touched={}",
            std::time::UNIX_EPOCH.elapsed()?.as_nanos()
        );
        kubectl(
            node,
            &[
                "-n",
                &self.ns,
                "annotate",
                "--overwrite",
                "deployment",
                "app",
                &touched,
            ],
        )
        .await?;
        let after = self.running(node).await?;
        ensure!(
            after == before,
            "the UPDATE rolled the workload: {before:?} -> {after:?}"
        );
        Ok(())
    }

    /// After the uninstall: the workload runs on, unrolled (same stamp, ReplicaSets and pods), and the guarded
    /// namespace, Secret listed by a HelmOp included, deletes completely.
    async fn left_running_and_guarded_namespace_deletes(
        &self,
        node: &ClusterInfo,
        before: &Running,
    ) -> anyhow::Result<()> {
        let guarded = self.guarded.as_str();
        kubectl(node, &["delete", "ns", guarded, "--wait=false"]).await?;
        wait_until(
            &format!("namespace {guarded} to be gone"),
            INSTALL_TIMEOUT,
            || async move { Ok(get_json(node, &["ns", guarded]).await?.is_none()) },
        )
        .await?;
        let after = self.running(node).await?;
        ensure!(
            &after == before,
            "the uninstall rolled or restarted the workload: {before:?} -> {after:?}"
        );
        Ok(())
    }
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
        // Whatever its name or labels: no configuration may still call a helmop webhook.
        for kind in [
            "validatingwebhookconfigurations",
            "mutatingwebhookconfigurations",
        ] {
            let list = get_json(node, &[kind]).await?.context("no list")?;
            for item in list["items"].as_array().into_iter().flatten() {
                let calls_helmop = item["webhooks"].as_array().into_iter().flatten().any(|w| {
                    w["name"]
                        .as_str()
                        .is_some_and(|n| n.ends_with(".helmop.dev"))
                        || w["clientConfig"]["service"]["namespace"] == NS
                });
                if calls_helmop {
                    left.push(format!("{kind}/{}", item["metadata"]["name"]));
                }
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

/// Webhook configurations named `name` that never match anything (a made-up API group), so the shared
/// control plane's other tests never see them called; only their `caBundle` matters here.
fn inert_webhook_configurations(name: &str) -> (Value, Value) {
    let webhook = json!({
        "name": "inert.bootstrap.helmop.dev",
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "clientConfig": {"url": "https://127.0.0.1:1/never"},
        "rules": [{"apiGroups": ["bootstrap.helmop.invalid"], "apiVersions": ["v1"],
                   "operations": ["CREATE"], "resources": ["nothing"]}],
    });
    let config = |kind: &str| {
        json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": name},
            "webhooks": [webhook.clone()],
        })
    };
    (
        config("ValidatingWebhookConfiguration"),
        config("MutatingWebhookConfiguration"),
    )
}

/// What a bootstrap run leaves: hash-key bytes, CA certificate, serving certificate, and the
/// `caBundle`s of both configurations.
async fn bootstrap_objects(
    client: &Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<(Vec<u8>, Vec<u8>, Vec<u8>, Vec<Vec<u8>>)> {
    use k8s_openapi::api::admissionregistration::v1::{
        MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
    };
    use k8s_openapi::api::core::v1::Secret;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let data = |s: &Secret, key: &str| -> anyhow::Result<Vec<u8>> {
        Ok(s.data
            .as_ref()
            .and_then(|d| d.get(key))
            .with_context(|| format!("{:?} has no {key}", s.metadata.name))?
            .0
            .clone())
    };
    let key = data(&secrets.get("helmop-hash-key").await?, "key")?;
    let ca = data(&secrets.get("helmop-webhook-ca").await?, "tls.crt")?;
    let serving = data(&secrets.get("helmop-webhook-tls").await?, "tls.crt")?;
    let mut bundles = Vec::new();
    let validating = Api::<ValidatingWebhookConfiguration>::all(client.clone())
        .get(name)
        .await?;
    let mutating = Api::<MutatingWebhookConfiguration>::all(client.clone())
        .get(name)
        .await?;
    for config in validating
        .webhooks
        .iter()
        .flatten()
        .map(|w| &w.client_config)
        .chain(mutating.webhooks.iter().flatten().map(|w| &w.client_config))
    {
        bundles.push(
            config
                .ca_bundle
                .as_ref()
                .context("caBundle not set")?
                .0
                .clone(),
        );
    }
    Ok((key, ca, serving, bundles))
}

/// The bootstrap as the webhook's initContainers run it: every replica of a fresh install at once, then
/// again at every rollout. Concurrent first runs all succeed and agree on one hash key, one CA and one
/// serving certificate (the losers of each create re-read instead of failing or overwriting); the runs of
/// an upgrade change nothing, so the key's bytes and the `caBundle` stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_bootstrap_runs_keep_one_hash_key_and_one_ca() -> anyhow::Result<()> {
    use helmop_webhook::bootstrap::{self, HashKeyOutcome, TlsTarget};
    use helmop_webhook::config::SecretRef;
    let cluster = helmop_tests::control_plane().upstream();
    let client = cluster.client().await;
    let ns = helmop_tests::fresh_namespace(&client, "bootstrap").await?;
    let name = format!("helmop-{ns}");
    let (validating, mutating) = inert_webhook_configurations(&name);
    for doc in [&validating, &mutating] {
        let out = cluster
            .run_kubectl(&["apply", "-f", "-"], Some(&doc.to_string()))
            .await?;
        ensure!(
            out.status.success(),
            "kubectl apply: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let at = |secret: &str| SecretRef {
        namespace: ns.clone(),
        name: secret.to_owned(),
    };
    let key_ref = at("helmop-hash-key");
    let target = TlsTarget {
        secret: at("helmop-webhook-tls"),
        ca_secret: at("helmop-webhook-ca"),
        client_secret: at("helmop-apiserver-client"),
        service: "helmop-webhook".to_owned(),
        webhook_configuration: name.clone(),
        validity_days: 365,
        renew_before: Duration::from_secs(30 * 86_400),
    };
    let run_all = || async {
        futures::future::join_all((0..4).map(|_| {
            let client = client.clone();
            let (key_ref, target) = (&key_ref, &target);
            async move {
                let key = bootstrap::ensure_hash_key(client.clone(), key_ref).await?;
                let tls = bootstrap::bootstrap_tls(client, target).await?;
                anyhow::Ok((key, tls))
            }
        }))
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<_>>>()
    };

    let first = run_all().await.context("a concurrent first run failed")?;
    let created = first
        .iter()
        .filter(|(k, _)| *k == HashKeyOutcome::Created)
        .count();
    ensure!(created == 1, "{created} runs created the hash key");
    let cas = first.iter().filter(|(_, t)| t.ca_created).count();
    ensure!(cas == 1, "{cas} runs created the CA");
    let installed = bootstrap_objects(&client, &ns, &name).await?;
    let (key, ca, _, bundles) = &installed;
    ensure!(key.len() == 32, "hash key of {} bytes", key.len());
    let ca_text = String::from_utf8(ca.clone())?;
    for bundle in bundles {
        let bundle = String::from_utf8(bundle.clone())?;
        ensure!(
            bootstrap::pem_blocks(&bundle) == bootstrap::pem_blocks(&ca_text),
            "caBundle is not exactly the CA: {bundle}"
        );
    }

    // An upgrade's rollout runs them again, concurrently: nothing is created, issued or replaced.
    let again = run_all().await.context("a re-run failed")?;
    for (key, tls) in &again {
        ensure!(*key == HashKeyOutcome::AlreadyPresent, "{key:?}");
        ensure!(
            !tls.ca_created && tls.issued.is_none() && tls.client_issued.is_none(),
            "a re-run changed the TLS state: {tls:?}"
        );
    }
    ensure!(
        bootstrap_objects(&client, &ns, &name).await? == installed,
        "hash key, CA, serving certificate or caBundle changed on a re-run"
    );

    for kind in [
        "validatingwebhookconfiguration",
        "mutatingwebhookconfiguration",
    ] {
        cluster.run_kubectl(&["delete", kind, &name], None).await?;
    }
    cluster
        .run_kubectl(&["delete", "ns", &ns, "--wait=false"], None)
        .await?;
    Ok(())
}
