//! Failure isolation (docs/webhook-safety.md, "Failure isolation"): a helmop webhook
//! that is down or hung does no collateral damage. The webhook configurations are the shipped ones,
//! rendered from manifests/base with `kubectl kustomize` (never restated here), only pointed at a
//! loopback URL; everything is done through real `kubectl` on `down2`. The readiness test removes the
//! HelmOp CRD from `down2` for its duration (downstream clusters have no Fleet CRDs in production) and
//! restores it. A node drain needs a node, which the harness does not have yet.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, bail};
use base64::Engine;
use helmop_tests::*;
use helmop_webhook::metrics::Outcome;
use helmop_webhook::state::Config;
use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Client};
use serde_json::{Value, json};

const GUARD_LABEL: (&str, &str) = (helmop_core::names::LABEL_GUARD, "enabled");
const NAMESPACE_OPT_IN: (&str, &str) = ("helmop.dev/rollout-on-change", "enabled");

/// The tests here register cluster-wide configurations that select every guard-labelled or opted-in
/// namespace of down2, so they would see each other's namespaces: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn cluster() -> &'static ClusterInfo {
    control_plane().cluster(DOWNSTREAM_2)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `kubectl ARGS` on down2: `Ok(stdout)` or `Err(stderr)` (a refusal is an expected outcome here).
async fn kubectl(args: &[&str], stdin: Option<&str>) -> anyhow::Result<Result<String, String>> {
    let out = cluster().run_kubectl(args, stdin).await?;
    Ok(if out.status.success() {
        Ok(text(&out.stdout))
    } else {
        Err(text(&out.stderr))
    })
}

async fn kubectl_ok(args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    match kubectl(args, stdin).await? {
        Ok(out) => Ok(out),
        Err(stderr) => bail!("kubectl {args:?} failed: {stderr}"),
    }
}

fn shipped(overlay: &str) -> std::path::PathBuf {
    manifests_dir().join(overlay)
}

/// The shipped webhook configurations (manifests/base), renamed `name` and pointed at `base_url`
/// (each webhook keeps its own path) with `ca_pem` as caBundle: selectors, rules, failure policies
/// and timeouts exactly as rendered.
fn rendered_configurations(name: &str, base_url: &str, ca_pem: &str) -> anyhow::Result<Vec<Value>> {
    rendered_configurations_of(&shipped("base"), name, base_url, ca_pem)
}

/// As [`rendered_configurations`], of the kustomization in `dir`.
fn rendered_configurations_of(
    dir: &std::path::Path,
    name: &str,
    base_url: &str,
    ca_pem: &str,
) -> anyhow::Result<Vec<Value>> {
    let out = std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .context("running kubectl kustomize")?;
    if !out.status.success() {
        bail!("kubectl kustomize {}: {}", dir.display(), text(&out.stderr));
    }
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text(&out.stdout))
        .context("parsing the rendered manifests")?;
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    let mut configs = Vec::new();
    for mut doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        if kind != "ValidatingWebhookConfiguration" && kind != "MutatingWebhookConfiguration" {
            continue;
        }
        doc["metadata"] = json!({"name": name});
        for hook in doc["webhooks"].as_array_mut().into_iter().flatten() {
            let path = hook["clientConfig"]["service"]["path"]
                .as_str()
                .context("a rendered webhook without a service path")?
                .to_owned();
            hook["clientConfig"] = json!({"url": format!("{base_url}{path}"), "caBundle": ca});
        }
        configs.push(doc);
    }
    if configs.len() != 2 {
        bail!(
            "expected 2 webhook configurations in {}, got {}",
            dir.display(),
            configs.len()
        );
    }
    Ok(configs)
}

/// A loopback TLS server that accepts every connection and request and never answers, counting the
/// requests it got.
async fn start_hung_webhook(certs: &TestCerts) -> anyhow::Result<(String, Arc<AtomicUsize>)> {
    let calls = Arc::new(AtomicUsize::new(0));
    let counter = calls.clone();
    let app = axum::Router::new().fallback(move || {
        let counter = counter.clone();
        async move {
            counter.fetch_add(1, Ordering::SeqCst);
            std::future::pending::<()>().await;
            ""
        }
    });
    let port = crate::plugin::support::serve_tls(app, certs).await?;
    Ok((format!("https://127.0.0.1:{port}"), calls))
}

/// A loopback URL where nothing listens: the port was bound once and released.
fn nothing_listens() -> anyhow::Result<String> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    drop(listener);
    Ok(format!("https://127.0.0.1:{port}"))
}

fn deployment(namespace: &str, name: &str) -> String {
    deployment_manifest(namespace, name, json!({}), json!({})).to_string()
}

async fn namespace_gone(client: &Client, name: &str) -> anyhow::Result<bool> {
    Ok(Api::<Namespace>::all(client.clone())
        .get_opt(name)
        .await?
        .is_none())
}

/// Registers the shipped configurations at `base_url`, runs the scenario, and always unregisters.
async fn with_shipped_webhooks(
    base_url: &str,
    ca_pem: &str,
    calls: Option<&AtomicUsize>,
) -> anyhow::Result<()> {
    let client = cluster().client().await;
    let guarded = fresh_namespace_with_labels(&client, "iso-guarded", &[GUARD_LABEL]).await?;
    let name = format!("helmop-{guarded}");
    let configs = rendered_configurations(&name, base_url, ca_pem)?;
    apply_configurations(configs).await?;
    let outcome = scenario(&client, &guarded, calls).await;
    let removed = delete_configurations(&name).await;
    outcome?;
    removed
}

async fn apply_configurations(configs: Vec<Value>) -> anyhow::Result<()> {
    let list = json!({"apiVersion": "v1", "kind": "List", "items": configs}).to_string();
    kubectl_ok(&["apply", "-f", "-"], Some(&list))
        .await
        .map(drop)
}

async fn delete_configurations(name: &str) -> anyhow::Result<()> {
    kubectl_ok(
        &[
            "delete",
            "validatingwebhookconfiguration,mutatingwebhookconfiguration",
            name,
            "--ignore-not-found",
        ],
        None,
    )
    .await
    .map(drop)
}

async fn scenario(
    client: &Client,
    guarded: &str,
    calls: Option<&AtomicUsize>,
) -> anyhow::Result<()> {
    let count = || calls.map(|c| c.load(Ordering::SeqCst));

    // Opted in, fail closed: in a labelled (Fleet workspace) namespace a ConfigMap delete is refused.
    // This is also how the test knows the API server has picked the configurations up.
    let refusal = wait_for(
        "the delete guard to refuse a delete in a guarded namespace",
        Duration::from_secs(90),
        || async move {
            create_config_map(client, guarded, "probe", &[("k", "v")]).await?;
            Ok(
                kubectl(&["-n", guarded, "delete", "configmap", "probe"], None)
                    .await?
                    .err(),
            )
        },
    )
    .await?;
    assert!(
        refusal.contains("references.validate.helmop.dev"),
        "the refusal names the webhook: {refusal}"
    );

    // Unrelated work: nothing of it is sent to the webhook, so none of it waits or fails.
    let before = count();
    let plain = fresh_namespace(client, "iso-plain").await?;
    for i in 0..20 {
        create_config_map(client, &plain, &format!("cm-{i}"), &[("k", "v")]).await?;
    }
    kubectl_ok(&["-n", &plain, "delete", "configmap", "cm-0"], None).await?;
    kubectl_ok(
        &["apply", "-f", "-"],
        Some(&deployment(&plain, "unrelated")),
    )
    .await?;
    let opted_out_ns =
        fresh_namespace_with_labels(client, "iso-optout", &[NAMESPACE_OPT_IN]).await?;
    let opted_out = deployment_manifest(
        &opted_out_ns,
        "opted-out",
        json!({"helmop.dev/rollout-on-change": "false"}),
        json!({}),
    );
    kubectl_ok(&["apply", "-f", "-"], Some(&opted_out.to_string())).await?;
    // The namespace controller deletes every ConfigMap (kube-root-ca.crt included) on its own.
    kubectl_ok(&["delete", "namespace", &plain, "--wait=false"], None).await?;
    wait_until(
        "the namespace full of ConfigMaps to be gone",
        Duration::from_secs(90),
        || {
            let plain = plain.clone();
            async move { namespace_gone(client, &plain).await }
        },
    )
    .await?;
    assert_eq!(count(), before, "unrelated requests reached the webhook");

    // Opted in, fail open: a Deployment in an opted-in namespace and one labelled "true" still apply.
    let opted = fresh_namespace_with_labels(client, "iso-opted", &[NAMESPACE_OPT_IN]).await?;
    kubectl_ok(
        &["apply", "-f", "-"],
        Some(&deployment(&opted, "by-namespace")),
    )
    .await?;
    let unlabelled = fresh_namespace(client, "iso-labelled").await?;
    let labelled = deployment_manifest(
        &unlabelled,
        "by-label",
        json!({"helmop.dev/rollout-on-change": "true"}),
        json!({}),
    );
    kubectl_ok(&["apply", "-f", "-"], Some(&labelled.to_string())).await?;
    if let (Some(before), Some(after)) = (before, count()) {
        assert!(
            after >= before + 2,
            "opted-in workloads were sent: {before} -> {after}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_scaled_to_zero_blocks_nothing_unrelated() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    with_shipped_webhooks(&nothing_listens()?, &test_certs().ca_pem, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_hung_blocks_nothing_unrelated() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let certs = test_certs();
    let (url, calls) = start_hung_webhook(&certs).await?;
    with_shipped_webhooks(&url, &certs.ca_pem, Some(&calls)).await
}

/// `kubectl create` of Fleet's HelmOp CRD on down2 (as the harness installs it) and waits until served.
async fn restore_helmop_crd(client: &Client) -> anyhow::Result<()> {
    let crds = fleet_crds_dir().display().to_string();
    let file = format!("{crds}/helmops.fleet.cattle.io.yaml");
    if let Err(stderr) = kubectl(&["create", "--validate=false", "-f", &file], None).await?
        && !stderr.contains("AlreadyExists")
    {
        bail!("re-creating the HelmOp CRD: {stderr}");
    }
    wait_until(
        "down2 to serve HelmOps again",
        Duration::from_secs(60),
        || async { helmops_served(client).await },
    )
    .await
}

async fn helmops_served(client: &Client) -> anyhow::Result<bool> {
    match client
        .list_api_group_resources("fleet.cattle.io/v1alpha1")
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "helmops")),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// A cluster without Fleet's HelmOp CRD (every downstream cluster) has no HelmOps: the webhook becomes
/// ready there, and its delete guard allows. When the CRD appears later, the webhook starts watching
/// HelmOps by itself and guards what they list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_without_the_helmop_crd_and_guards_once_it_appears() -> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let client = cluster().client().await;
    kubectl_ok(
        &["delete", "crd", "helmops.fleet.cattle.io", "--wait=true"],
        None,
    )
    .await?;
    let outcome = without_the_crd(&client).await;
    let restored = restore_helmop_crd(&client).await;
    outcome?;
    restored
}

async fn without_the_crd(client: &Client) -> anyhow::Result<()> {
    wait_until("down2 to stop serving HelmOps", DEFAULT_TIMEOUT, || async {
        Ok(!helmops_served(client).await?)
    })
    .await?;
    // Waits for readiness (state.ready()), which before failed here: the HelmOp watch never synced.
    let webhook = LocalWebhook::start(client.clone(), Config::default()).await?;
    assert!(webhook.state.caches().helmops_absent());

    let ns = fresh_namespace_with_labels(client, "iso-nocrd", &[GUARD_LABEL]).await?;
    let name = format!("guard-{ns}");
    WebhookRegistration::new(
        WebhookKind::Validating,
        &name,
        &format!("{}/validate/references", webhook.url),
        &webhook.ca_pem,
    )
    .rule(WebhookRule::new(&["DELETE"], "", "v1", &["configmaps"]))
    .only_namespace(&ns)
    .register(client)
    .await?;
    let outcome = guarded_once_the_crd_appears(client, &webhook, &ns).await;
    let removed = unregister_webhook(client, WebhookKind::Validating, &name).await;
    outcome?;
    removed
}

async fn guarded_once_the_crd_appears(
    client: &Client,
    webhook: &LocalWebhook,
    ns: &str,
) -> anyhow::Result<()> {
    // No HelmOps can exist: deletes are allowed, answered by the webhook itself (the registration
    // fails closed, so an unanswered review would refuse them).
    wait_until("the webhook to allow a delete", DEFAULT_TIMEOUT, || async {
        create_config_map(client, ns, "db", &[("k", "v")]).await?;
        kubectl_ok(&["-n", ns, "delete", "configmap", "db"], None).await?;
        Ok(webhook.metrics.requests("references", Outcome::Allowed) > 0)
    })
    .await?;

    restore_helmop_crd(client).await?;
    wait_until(
        "the webhook to watch HelmOps after the CRD appeared",
        Duration::from_secs(60),
        || async {
            let caches = webhook.state.caches();
            Ok(!caches.helmops_absent() && caches.helmops_synced())
        },
    )
    .await?;
    create_config_map(client, ns, "db", &[("k", "v")]).await?;
    apply_helmop(
        client,
        ns,
        &json!({
            "apiVersion": "fleet.cattle.io/v1alpha1",
            "kind": "HelmOp",
            "metadata": {"name": "app"},
            "spec": {
                "helm": {"chart": "app", "repo": "https://charts.example.com", "version": "1.0.0"},
                "downstreamResources": [{"kind": "ConfigMap", "name": "db"}],
            },
        })
        .to_string(),
    )
    .await?;
    let refusal = wait_for(
        "the guard to refuse deleting a ConfigMap the new HelmOp lists",
        DEFAULT_TIMEOUT,
        || async {
            create_config_map(client, ns, "db", &[("k", "v")])
                .await
                .ok();
            Ok(kubectl(&["-n", ns, "delete", "configmap", "db"], None)
                .await?
                .err())
        },
    )
    .await?;
    assert!(
        refusal.contains("app"),
        "the refusal names the HelmOp: {refusal}"
    );
    Ok(())
}

/// The name label on 1.20 (docs/webhook-safety.md, "Kubernetes 1.20: the name label"): 1.20 neither sets
/// nor protects `kubernetes.io/metadata.name`, so a tenant who may label its namespace
/// `kube-system` is skipped by every shipped entry, the delete guard included. With the
/// `kube-1.20-strict` component the same namespace is checked like any other. The webhook is down
/// (fail closed), so "checked" is a refused delete and "skipped" an allowed one; a guarded namespace
/// without the label shows the configurations are in force before the spoofed one is judged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_labelled_kube_system_is_checked_with_the_strict_component()
-> anyhow::Result<()> {
    let _serial = SERIAL.lock().await;
    let client = cluster().client().await;
    let control = fresh_namespace_with_labels(&client, "spoof-control", &[GUARD_LABEL]).await?;
    let spoofed = fresh_namespace_with_labels(
        &client,
        "spoof",
        &[GUARD_LABEL, ("kubernetes.io/metadata.name", "kube-system")],
    )
    .await?;
    let strict = tempfile::tempdir()?;
    let to = |what: &str| -> anyhow::Result<String> {
        Ok(relative_path(strict.path(), &shipped(what))?
            .display()
            .to_string())
    };
    std::fs::write(
        strict.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\n\
             components:\n  - {}\n  - {}\n",
            to("base")?,
            to("kube-1.20")?,
            to("kube-1.20-strict")?
        ),
    )?;
    let url = nothing_listens()?;
    let ca = test_certs().ca_pem;
    for (variant, dir, checked) in [
        ("shipped", shipped("base"), false),
        ("strict", strict.path().to_path_buf(), true),
    ] {
        let name = format!("helmop-{spoofed}-{variant}");
        let configs = rendered_configurations_of(&dir, &name, &url, &ca)?;
        apply_configurations(configs).await?;
        let outcome = spoofed_delete(&client, &control, &spoofed, checked).await;
        let removed = delete_configurations(&name).await;
        outcome.with_context(|| format!("with the {variant} configurations"))?;
        removed?;
        // The next variant starts only once this one is out of force (a delete in the control
        // namespace goes through again).
        wait_until(
            "the configurations to be out of force",
            Duration::from_secs(90),
            || async { Ok(delete_a_new_config_map(&client, &control).await?.is_ok()) },
        )
        .await?;
    }
    Ok(())
}

/// Once a delete in `control` is refused (the configurations are in force), a delete in `spoofed`
/// must be refused exactly when `checked`.
async fn spoofed_delete(
    client: &Client,
    control: &str,
    spoofed: &str,
    checked: bool,
) -> anyhow::Result<()> {
    wait_for(
        "the delete guard to refuse a delete in the control namespace",
        Duration::from_secs(90),
        || async move { Ok(delete_a_new_config_map(client, control).await?.err()) },
    )
    .await?;
    match (checked, delete_a_new_config_map(client, spoofed).await?) {
        (true, Ok(out)) => bail!("the delete in {spoofed} was not checked: {out}"),
        (false, Err(stderr)) => bail!(
            "the shipped configurations checked {spoofed} (the 1.20 caveat no longer holds?): {stderr}"
        ),
        (true, Err(stderr)) => {
            assert!(
                stderr.contains("references.validate.helmop.dev"),
                "the refusal names the webhook: {stderr}"
            );
            Ok(())
        }
        (false, Ok(_)) => Ok(()),
    }
}

/// Creates a ConfigMap of a name not used before in `ns` and deletes it with kubectl: `Ok(stdout)`,
/// or `Err(stderr)` when the delete is refused (the ConfigMap then stays).
async fn delete_a_new_config_map(
    client: &Client,
    ns: &str,
) -> anyhow::Result<Result<String, String>> {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let name = format!("probe-{}", NEXT.fetch_add(1, Ordering::SeqCst));
    create_config_map(client, ns, &name, &[("k", "v")]).await?;
    kubectl(&["-n", ns, "delete", "configmap", &name], None).await
}
