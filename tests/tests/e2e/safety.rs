//! "Safe to install", end to end on the real API server:
//! - only the API server may call the webhook (its admission `kubeConfigFile` client certificate, checked
//!   against `--client-ca`);
//! - the image resolver is not an SSRF tool. Everything listens on loopback: scripted registries that
//!   redirect or name a token realm elsewhere, and a "victim" port that must never be contacted however the
//!   webhook is asked to resolve an image;
//! - concurrent admissions reading the same ConfigMap share live GETs (bounded, coalesced).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use helmop_tests::*;
use helmop_webhook::metrics::{Metrics, Outcome};
use helmop_webhook::state::{Config, Options};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::images::{Webhook, deployment, image_of, kubectl_apply, stderr, stored};

const DIGEST: &str = "sha256:4a5c1e8a5bd4b1a3e2f1f0a8f02f4b0d7e2c6c9a4f1d3b2a1e0f9c8b7a6d5e4f";

/// A loopback HTTP listener that answers every request with one scripted response and counts connections.
struct Scripted {
    port: u16,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Scripted {
    async fn start(response: String) -> anyhow::Result<Scripted> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let connections = Arc::new(AtomicUsize::new(0));
        let counter = connections.clone();
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let response = response.clone();
                tokio::spawn(async move {
                    // HEAD and GET carry no body: the request ends with its head.
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = socket.write_all(response.as_bytes()).await;
                    let _ = socket.shutdown().await;
                });
            }
        });
        Ok(Scripted {
            port,
            connections,
            task,
        })
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for Scripted {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn response(status: &str, headers: &[(&str, String)]) -> String {
    let mut text = format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n");
    for (name, value) in headers {
        text.push_str(&format!("{name}: {value}\r\n"));
    }
    text + "\r\n"
}

/// A registry that would answer any manifest request with a digest: resolving through it "works".
async fn victim() -> anyhow::Result<Scripted> {
    Scripted::start(response(
        "200 OK",
        &[
            ("docker-content-digest", DIGEST.to_owned()),
            (
                "content-type",
                "application/vnd.oci.image.index.v1+json".to_owned(),
            ),
        ],
    ))
    .await
}

/// Applies a Deployment running `image` and returns the warnings kubectl printed, checking it was admitted
/// unchanged.
async fn apply_unresolved(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    image: &str,
    extra_spec: Value,
) -> anyhow::Result<String> {
    let out = kubectl_apply(&deployment(namespace, name, image, extra_spec, json!({}))).await?;
    let warnings = stderr(&out);
    assert_eq!(
        image_of(&stored(client, namespace, name).await?),
        image,
        "{name}: the image must be admitted unchanged; warnings: {warnings}"
    );
    assert!(
        warnings.contains("not resolved to a digest"),
        "{name}: {warnings}"
    );
    Ok(warnings)
}

/// Warnings name no port, address or status code (beyond the image's own name): nothing that tells open from
/// closed from filtered.
fn assert_generic(warnings: &str, image: &str, victim: &Scripted) {
    let warnings = warnings.replace(image, "");
    for leak in [
        victim.port.to_string(),
        "307".into(),
        "401".into(),
        "refused".into(),
        "os error".into(),
    ] {
        assert!(
            !warnings.contains(&leak),
            "warning reveals {leak:?}: {warnings}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_resolver_never_contacts_what_the_registry_config_does_not_list() -> anyhow::Result<()>
{
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "safe-ssrf").await?;
    let victim = victim().await?;
    let manifest_path = "/v2/app/manifests/latest";
    // Listed registries that try to send the resolver (and a credential) to the victim's port.
    let redirector = Scripted::start(response(
        "307 Temporary Redirect",
        &[(
            "location",
            format!("http://{}{manifest_path}", victim.host()),
        )],
    ))
    .await?;
    let realm = Scripted::start(response(
        "401 Unauthorized",
        &[(
            "www-authenticate",
            format!(
                "Bearer realm=\"http://{}/token\",service=\"registry\"",
                victim.host()
            ),
        )],
    ))
    .await?;
    let listed = [redirector.host(), realm.host()];
    let webhook = Webhook::start_with_registry_config(
        client.clone(),
        json!({"insecure": listed}),
        Duration::from_secs(2),
    )
    .await?;
    let registration = webhook.register(&client, &ns).await?;

    // The redirecting registry, with a pull secret naming it: neither the request nor the credential moves.
    let auth = base64::engine::general_purpose::STANDARD.encode("ci:s3cret-pw");
    let config = json!({"auths": {redirector.host(): {"auth": auth}}}).to_string();
    kubectl_apply(&json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "pull", "namespace": ns},
        "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(config)},
    }))
    .await?;
    let pull = json!({"imagePullSecrets": [{"name": "pull"}]});
    let cases = [
        (
            "redirected",
            format!("{}/app:latest", redirector.host()),
            pull,
        ),
        ("realm", format!("{}/app:latest", realm.host()), json!({})),
        // Loopback the config does not list, by address and by name.
        (
            "loopback",
            format!("{}/app:latest", victim.host()),
            json!({}),
        ),
        (
            "by-name",
            format!("localhost:{}/app:latest", victim.port),
            json!({}),
        ),
        // The cloud metadata address.
        (
            "link-local",
            "169.254.169.254/app:latest".to_owned(),
            json!({}),
        ),
    ];
    for (name, image, extra) in cases {
        let warnings = apply_unresolved(&client, &ns, name, &image, extra).await?;
        assert_generic(&warnings, &image, &victim);
        assert!(
            !warnings.contains("s3cret") && !warnings.contains(&auth),
            "{warnings}"
        );
    }
    assert!(
        redirector.connections() > 0 && realm.connections() > 0,
        "the listed registries were asked"
    );
    assert_eq!(
        victim.connections(),
        0,
        "a port the registry config does not list was contacted"
    );
    assert!(webhook.resolver.resolutions("refused") >= 4);
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_allow_list_limits_what_is_resolved() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "safe-allow").await?;
    let allowed = victim().await?;
    let other = victim().await?;
    let webhook = Webhook::start_with_registry_config(
        client.clone(),
        json!({"insecure": [allowed.host(), other.host()], "registries": [allowed.host()]}),
        Duration::from_secs(2),
    )
    .await?;
    let registration = webhook.register(&client, &ns).await?;

    let image = format!("{}/app:latest", allowed.host());
    kubectl_apply(&deployment(&ns, "allowed", &image, json!({}), json!({}))).await?;
    assert_eq!(
        image_of(&stored(&client, &ns, "allowed").await?),
        format!("{image}@{DIGEST}")
    );
    let warnings = apply_unresolved(
        &client,
        &ns,
        "other",
        &format!("{}/app:latest", other.host()),
        json!({}),
    )
    .await?;
    assert!(
        warnings.contains("not allowed by the registry policy"),
        "{warnings}"
    );
    assert_eq!(
        other.connections(),
        0,
        "a registry off the allow-list was contacted"
    );
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

/// A client that trusts the webhook's serving certificate and presents `identity` (or nothing).
fn direct_client(
    ca_pem: &str,
    identity: Option<reqwest::Identity>,
) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .add_root_certificate(reqwest::Certificate::from_pem(ca_pem.as_bytes())?)
        .timeout(Duration::from_secs(10));
    if let Some(identity) = identity {
        builder = builder.identity(identity);
    }
    Ok(builder.build()?)
}

/// The API server's reviews of ConfigMap deletes in `namespace` that the release webhook answered so far.
async fn answered_deletes(webhook: &WebhookBinary) -> anyhow::Result<f64> {
    webhook
        .metric(r#"helmop_webhook_requests_total{webhook="references",operation="DELETE",outcome="allowed"}"#)
        .await
}

/// Registers the reference guard of `webhook` for ConfigMap deletes in `namespace`; the registration's name.
async fn register_configmap_deletes(
    client: &kube::Client,
    namespace: &str,
    webhook: &WebhookBinary,
) -> anyhow::Result<String> {
    let name = format!("{namespace}-references");
    WebhookRegistration::new(
        WebhookKind::Validating,
        &name,
        &format!("{}/validate/references", webhook.url),
        &webhook.ca_pem,
    )
    .rule(WebhookRule::new(&["DELETE"], "", "v1", &["configmaps"]))
    .only_namespace(namespace)
    .register(client)
    .await?;
    Ok(name)
}

/// Creates and deletes a ConfigMap of a new name in `namespace`: whether the delete went through.
async fn delete_goes_through(client: &kube::Client, namespace: &str) -> anyhow::Result<bool> {
    static PROBES: AtomicUsize = AtomicUsize::new(0);
    let name = format!("probe-{}", PROBES.fetch_add(1, Ordering::Relaxed));
    let configmaps =
        kube::Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), namespace);
    create_config_map(client, namespace, &name, &[]).await?;
    Ok(configmaps.delete(&name, &Default::default()).await.is_ok())
}

/// The release webhook on one CPU with `--client-ca` (the `client-auth` install): the API server's
/// reviews are answered, anyone else's, without a certificate or with another CA's, get no HTTP answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_api_server_may_call_the_webhook() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "safe-mtls").await?;
    let webhook =
        WebhookBinary::release_one_cpu(&control_plane().upstream().kubeconfig, &[]).await?;
    let name = register_configmap_deletes(&client, &ns, &webhook).await?;

    // The API server presents its client certificate: its reviews are answered (registration is picked up
    // asynchronously, hence the retries).
    wait_until(
        "the API server to call the webhook",
        DEFAULT_TIMEOUT,
        || async {
            delete_goes_through(&client, &ns).await?;
            Ok(answered_deletes(&webhook).await? > 0.0)
        },
    )
    .await?;

    // Anyone else, without the certificate or with one from another CA: a forged review of a kube-system
    // Secret DELETE gets no HTTP answer at all.
    let mut forged = json!({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {
            "uid": "forged", "kind": {"group": "", "version": "v1", "kind": "Secret"},
            "resource": {"group": "", "version": "v1", "resource": "secrets"},
            "name": "bootstrap-token", "namespace": "kube-system", "operation": "DELETE",
            "userInfo": {"username": "system:admin", "groups": ["system:masters"]},
            "oldObject": {"apiVersion": "v1", "kind": "Secret",
                          "metadata": {"name": "bootstrap-token", "namespace": "kube-system"}},
        },
    });
    forged["request"]["dryRun"] = json!(false);
    let other = test_certs();
    let stranger =
        reqwest::Identity::from_pem(format!("{}{}", other.cert_pem, other.key_pem).as_bytes())?;
    // Every DELETE review the reference guard answered, whatever its outcome (counters only grow).
    let all_outcomes = || async {
        let text = webhook.metrics().await?;
        let prefix = r#"helmop_webhook_requests_total{webhook="references",operation="DELETE","#;
        anyhow::Ok(
            text.lines()
                .filter(|l| l.starts_with(prefix))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum::<f64>(),
        )
    };
    let answered_before = all_outcomes().await?;
    for (who, identity) in [
        ("no certificate", None),
        ("another CA's certificate", Some(stranger)),
    ] {
        let result = direct_client(&webhook.ca_pem, identity)?
            .post(format!("{}/validate/references", webhook.url))
            .header("content-type", "application/json")
            .body(forged.to_string())
            .send()
            .await;
        assert!(
            result.is_err(),
            "{who}: answered {:?}",
            result.map(|r| r.status())
        );
    }
    assert_eq!(
        all_outcomes().await?,
        answered_before,
        "a forged review reached the handler"
    );
    unregister_webhook(&client, WebhookKind::Validating, &name).await?;
    Ok(())
}

/// A client CA rotation without a restart and without a lock-out, through the real API server: the
/// release webhook first trusts only a CA the API server's certificate is not from (its reviews fail, the
/// delete is refused by the fail-closed guard); `--client-ca` rewritten as that CA plus the API
/// server's (added before the other is removed, as the bootstrap writes it) lets them through; rewritten
/// as the other CA alone, they fail again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_client_ca_is_taken_into_use_without_a_restart() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "safe-rotate").await?;
    let apiserver_ca = webhook_client_pki().ca_pem.clone();
    let other_ca = test_certs().ca_pem;
    let webhook = WebhookBinary::release_one_cpu_trusting(
        &control_plane().upstream().kubeconfig,
        &["--cert-poll-ms", "200"],
        &other_ca,
    )
    .await?;
    let ca_file = webhook
        .client_ca_file()
        .context("the webhook was started without --client-ca")?
        .to_path_buf();
    let name = register_configmap_deletes(&client, &ns, &webhook).await?;
    // Fail closed: until the API server is trusted, its calls fail and the delete is refused. (A
    // registration not yet in force would let it through, hence the wait.)
    wait_until(
        "the API server's calls to be refused",
        DEFAULT_TIMEOUT,
        || async { Ok(!delete_goes_through(&client, &ns).await?) },
    )
    .await?;
    assert_eq!(answered_deletes(&webhook).await?, 0.0);

    // Added: both are trusted.
    std::fs::write(&ca_file, format!("{other_ca}{apiserver_ca}"))?;
    wait_until(
        "the added client CA to be trusted",
        DEFAULT_TIMEOUT,
        || async { delete_goes_through(&client, &ns).await },
    )
    .await?;
    assert!(answered_deletes(&webhook).await? > 0.0);

    // Removed: refused again, without a restart in between.
    std::fs::write(&ca_file, &other_ca)?;
    wait_until(
        "the removed client CA to be refused",
        DEFAULT_TIMEOUT,
        || async { Ok(!delete_goes_through(&client, &ns).await?) },
    )
    .await?;
    unregister_webhook(&client, WebhookKind::Validating, &name).await?;
    Ok(())
}

/// A cap on references per admission: a HelmOp above it is denied with a message saying so (even with
/// `allow-missing`), a workload above it is admitted without a config stamp, with a warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn references_per_admission_are_capped() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    ensure_hash_key(&client).await?;
    let ns = fresh_namespace(&client, "safe-caps").await?;
    let webhook = LocalWebhook::start(client.clone(), Config::default()).await?;
    let (helmops, workloads) = (format!("{ns}-helmops"), format!("{ns}-workloads"));
    WebhookRegistration::new(
        WebhookKind::Validating,
        &helmops,
        &format!("{}/validate/helmops", webhook.url),
        &webhook.ca_pem,
    )
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "fleet.cattle.io",
        "v1alpha1",
        &["helmops"],
    ))
    .only_namespace(&ns)
    .register(&client)
    .await?;
    WebhookRegistration::new(
        WebhookKind::Mutating,
        &workloads,
        &format!("{}/mutate/workloads", webhook.url),
        &webhook.ca_pem,
    )
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "apps",
        "v1",
        &["deployments"],
    ))
    .only_namespace(&ns)
    .register(&client)
    .await?;

    let over = helmop_webhook::caps::MAX_REFERENCES + 1;
    let resources: Vec<Value> = (0..over)
        .map(|i| json!({"kind": "ConfigMap", "name": format!("cm-{i}")}))
        .collect();
    let helmop = |name: &str, resources: &[Value]| {
        json!({
            "apiVersion": "fleet.cattle.io/v1alpha1", "kind": "HelmOp",
            "metadata": {"name": name, "annotations": {"helmop.dev/allow-missing": "true"}},
            "spec": {"helm": {"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3"},
                     "downstreamResources": resources},
        })
        .to_string()
    };
    // The webhook registration is picked up asynchronously: wait for a denial, then check its reason.
    let denial = wait_for(
        "the HelmOp above the cap to be denied",
        DEFAULT_TIMEOUT,
        || {
            let (client, ns, doc) = (client.clone(), ns.clone(), helmop("too-many", &resources));
            async move {
                match apply_helmop(&client, &ns, &doc).await {
                    Ok(_) => {
                        fleet_api(&client, &ns, &helmop_resource())
                            .delete("too-many", &Default::default())
                            .await?;
                        Ok(None)
                    }
                    Err(e) => Ok(Some(format!("{e:#}"))),
                }
            }
        },
    )
    .await?;
    assert!(
        denial.contains(&format!(
            "references {over} Secrets and ConfigMaps, more than the"
        )),
        "{denial}"
    );
    // At the cap: admitted (allow-missing turns the missing ones into warnings).
    apply_helmop(&client, &ns, &helmop("at-cap", &resources[..over - 1])).await?;

    let env_from: Vec<Value> = (0..over)
        .map(|i| json!({"configMapRef": {"name": format!("cm-{i}"), "optional": true}}))
        .collect();
    let manifest = deployment(
        &ns,
        "many-refs",
        "registry.example.com/app:1.0",
        json!({}),
        json!({}),
    );
    let mut manifest = manifest;
    manifest["spec"]["template"]["spec"]["containers"][0]["envFrom"] = json!(env_from);
    // Each attempt changes the object, so kubectl always sends it (an unchanged apply sends nothing).
    let attempt = AtomicUsize::new(0);
    let out = wait_for("the workload webhook to answer", DEFAULT_TIMEOUT, || {
        let mut manifest = manifest.clone();
        manifest["metadata"]["annotations"] =
            json!({"attempt": attempt.fetch_add(1, Ordering::SeqCst).to_string()});
        async move {
            let out = kubectl_apply(&manifest).await?;
            Ok(stderr(&out).contains("helmop webhook").then_some(out))
        }
    })
    .await?;
    let warnings = stderr(&out);
    assert!(
        warnings.contains(&format!(
            "references {over} Secrets and ConfigMaps, more than the"
        )),
        "{warnings}"
    );
    let stored = stored(&client, &ns, "many-refs").await?;
    assert_eq!(
        template_annotation(&stored, "helmop.dev/config-hash"),
        None,
        "no stamp above the cap"
    );
    unregister_webhook(&client, WebhookKind::Validating, &helmops).await?;
    unregister_webhook(&client, WebhookKind::Mutating, &workloads).await?;
    Ok(())
}

/// Concurrent admissions of Deployments reading the same ConfigMap share live GETs of it: with one live GET
/// allowed at a time (`--max-live-gets 1`), admissions arriving while one is queued join it, so the webhook
/// sends fewer GETs of the ConfigMap than it answers admissions (each admission reads its version live), and
/// every Deployment still gets the same stamp.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_admissions_share_live_gets() -> anyhow::Result<()> {
    const DEPLOYMENTS: usize = 40;
    let client = control_plane().upstream().client().await;
    ensure_hash_key(&client).await?;
    let ns = fresh_namespace(&client, "safe-coalesce").await?;
    let options = Options {
        max_live_gets: 1,
        ..Options::default()
    };
    let webhook =
        LocalWebhook::start_with(client.clone(), Config::default(), Metrics::new(), options)
            .await?;
    let workloads = format!("{ns}-workloads");
    WebhookRegistration::new(
        WebhookKind::Mutating,
        &workloads,
        &format!("{}/mutate/workloads", webhook.url),
        &webhook.ca_pem,
    )
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "apps",
        "v1",
        &["deployments"],
    ))
    .only_namespace(&ns)
    .register(&client)
    .await?;
    create_config_map(&client, &ns, "shared", &[("mode", "fast")]).await?;
    let manifest = |name: &str| {
        deployment(
            &ns,
            name,
            "registry.example.com/app:1.0",
            json!({}),
            json!({}),
        )
    };
    let with_env = |name: &str| {
        let mut d = manifest(name);
        d["spec"]["template"]["spec"]["containers"][0]["envFrom"] =
            json!([{"configMapRef": {"name": "shared"}}]);
        d
    };
    let deployments =
        kube::Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), &ns);
    // The registration is picked up asynchronously: wait until a Deployment is stamped.
    let probe = AtomicUsize::new(0);
    let stamp = wait_for("the workload webhook to stamp", DEFAULT_TIMEOUT, || {
        let name = format!("probe-{}", probe.fetch_add(1, Ordering::SeqCst));
        let (deployments, doc) = (deployments.clone(), with_env(&name));
        async move {
            let d = deployments
                .create(&Default::default(), &serde_json::from_value(doc)?)
                .await?;
            Ok(template_annotation(&d, "helmop.dev/config-hash"))
        }
    })
    .await?;

    let answered = |m: &Metrics| {
        m.requests("workloads", Outcome::Patched) + m.requests("workloads", Outcome::Allowed)
    };
    let (gets_before, answered_before) = (
        webhook.metrics.live_gets("configmaps"),
        answered(&webhook.metrics),
    );
    let mut creating = tokio::task::JoinSet::new();
    for i in 0..DEPLOYMENTS {
        let (deployments, doc) = (deployments.clone(), with_env(&format!("app-{i}")));
        creating.spawn(async move {
            anyhow::Ok(
                deployments
                    .create(&Default::default(), &serde_json::from_value(doc)?)
                    .await?,
            )
        });
    }
    while let Some(created) = creating.join_next().await {
        assert_eq!(
            template_annotation(&created??, "helmop.dev/config-hash").as_ref(),
            Some(&stamp),
            "every Deployment is stamped from the same ConfigMap content"
        );
    }
    let gets = webhook.metrics.live_gets("configmaps") - gets_before;
    let admissions = answered(&webhook.metrics) - answered_before;
    assert!(admissions >= DEPLOYMENTS as u64, "{admissions} admissions");
    assert!(
        gets < admissions,
        "{gets} live GETs of the ConfigMap for {admissions} admissions"
    );
    unregister_webhook(&client, WebhookKind::Mutating, &workloads).await?;
    Ok(())
}
