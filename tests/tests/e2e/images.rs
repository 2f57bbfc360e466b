//! Mutable image tags resolved to digests at admission, end to end: a real registry (Debian's
//! docker-registry on loopback, images pushed with skopeo), the webhook in-process with the real
//! `RegistryResolver`, registered by `url` on the upstream kube-apiserver, and real `kubectl apply`.

use std::process::Output;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use helmop_tests::registry::{OciImage, TestRegistry};
use helmop_tests::*;
use helmop_webhook::Metrics;
use helmop_webhook::images::RegistryResolver;
use helmop_webhook::state::{Config, Options};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const IMAGE_DIGESTS: &str = "helmop.dev/image-digests";

/// The webhook on loopback with the registry resolver; stopped when dropped.
pub(crate) struct Webhook {
    pub(crate) resolver: Arc<RegistryResolver>,
    pub(crate) server: LocalWebhook,
    _registry_config: tempfile::TempDir,
}

impl Webhook {
    /// `insecure`: registry hosts spoken to over plain HTTP (written to a `--registry-config` file).
    pub(crate) async fn start(
        client: Client,
        insecure: &[&str],
        budget: Duration,
    ) -> anyhow::Result<Webhook> {
        Self::start_with_registry_config(client, json!({"insecure": insecure}), budget).await
    }

    /// [`Webhook::start`] with a whole `--registry-config` document.
    pub(crate) async fn start_with_registry_config(
        client: Client,
        registry_config: Value,
        budget: Duration,
    ) -> anyhow::Result<Webhook> {
        let config = Config {
            image_budget: budget,
            ..Config::default()
        };
        // No reuse between admissions: each step of a test pushes and expects the new digest at once.
        Self::start_configured(client, config, registry_config, true).await
    }

    /// The webhook with `config` and `registry_config` as its `--registry-config` file; `fresh`: the
    /// resolver keeps nothing between admissions (else the production cache lifetimes).
    pub(crate) async fn start_configured(
        client: Client,
        config: Config,
        registry_config: Value,
        fresh: bool,
    ) -> anyhow::Result<Webhook> {
        let dir = tempfile::tempdir()?;
        let registries = dir.path().join("registries.yaml");
        std::fs::write(&registries, registry_config.to_string())?;
        let config = Config {
            registry_config: Some(registries),
            ..config
        };
        let metrics = Metrics::new();
        let mut resolver = RegistryResolver::new(&config, &metrics).map_err(anyhow::Error::msg)?;
        if fresh {
            resolver = resolver.with_ttls(Duration::ZERO, Duration::ZERO);
        }
        let resolver = Arc::new(resolver);
        let options = Options {
            images: resolver.clone(),
            ..Options::default()
        };
        let server = LocalWebhook::start_with(client, config, metrics, options).await?;
        Ok(Webhook {
            resolver,
            server,
            _registry_config: dir,
        })
    }

    pub(crate) async fn register(
        &self,
        client: &Client,
        namespace: &str,
    ) -> anyhow::Result<String> {
        register_deployments(client, namespace, &self.server.url, &self.server.ca_pem).await
    }
}

/// Registers the mutating endpoint at `url` for Deployments in `namespace` only; the registration's name.
pub(crate) async fn register_deployments(
    client: &Client,
    namespace: &str,
    url: &str,
    ca_pem: &str,
) -> anyhow::Result<String> {
    let name = format!("{namespace}-images");
    let url = format!("{url}/mutate/workloads");
    WebhookRegistration::new(WebhookKind::Mutating, &name, &url, ca_pem)
        .rule(WebhookRule::new(
            &["CREATE", "UPDATE"],
            "apps",
            "v1",
            &["deployments"],
        ))
        .only_namespace(namespace)
        .register(client)
        .await?;
    Ok(name)
}

pub(crate) async fn kubectl_apply(object: &Value) -> anyhow::Result<Output> {
    let out = control_plane()
        .upstream()
        .run_kubectl(&["apply", "-f", "-"], Some(&object.to_string()))
        .await?;
    if !out.status.success() {
        bail!(
            "kubectl apply failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(out)
}

pub(crate) fn deployment(
    namespace: &str,
    name: &str,
    image: &str,
    extra_spec: Value,
    annotations: Value,
) -> Value {
    let mut d = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"helmop.dev/rollout-on-change": "true"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": image}]},
            },
        },
    });
    if let (Some(spec), Some(extra)) = (
        d["spec"]["template"]["spec"].as_object_mut(),
        extra_spec.as_object(),
    ) {
        spec.extend(extra.clone());
    }
    if annotations.as_object().is_some_and(|a| !a.is_empty()) {
        d["metadata"]["annotations"] = annotations;
    }
    d
}

pub(crate) async fn stored(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Deployment> {
    Ok(Api::<Deployment>::namespaced(client.clone(), namespace)
        .get(name)
        .await?)
}

pub(crate) fn image_of(d: &Deployment) -> String {
    d.spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// ReplicaSets of `app`, once the controller has observed the Deployment's current generation.
pub(crate) async fn replica_sets_settled(
    client: &Client,
    namespace: &str,
    app: &str,
) -> anyhow::Result<usize> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), namespace);
    let rs = Api::<ReplicaSet>::namespaced(client.clone(), namespace);
    wait_for(
        "the deployment controller to observe the deployment",
        DEFAULT_TIMEOUT,
        || {
            let (deployments, rs) = (deployments.clone(), rs.clone());
            async move {
                let d = deployments.get(app).await?;
                let observed = d.status.as_ref().and_then(|s| s.observed_generation);
                if observed != d.metadata.generation {
                    return Ok(None);
                }
                let lp = ListParams::default().labels(&format!("app={app}"));
                let count = rs.list(&lp).await?.items.len();
                // The ReplicaSet of the current template exists once the controller has observed it.
                Ok((count > 0).then_some(count))
            }
        },
    )
    .await
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_tag_is_pinned_and_re_resolved_on_apply() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "img-pin").await?;
    let registry = TestRegistry::start().await?;
    let webhook =
        Webhook::start(client.clone(), &[registry.host()], Duration::from_secs(2)).await?;
    let registration = webhook.register(&client, &ns).await?;
    let repo = registry.repository("demo/app");
    let latest = format!("{repo}:latest");

    let v1 = OciImage::single("v1")?;
    registry.push(&v1, "demo/app", "latest").await?;
    let manifest = deployment(&ns, "app", &latest, json!({}), json!({}));
    kubectl_apply(&manifest).await?;
    let d = stored(&client, &ns, "app").await?;
    assert_eq!(
        image_of(&d),
        format!("{latest}@{}", v1.digest),
        "pinned to v1"
    );
    assert_eq!(replica_sets_settled(&client, &ns, "app").await?, 1);

    // CI pushes a new build under the same tag and re-applies the unchanged manifest: it rolls.
    let v2 = OciImage::single("v2")?;
    assert_ne!(v1.digest, v2.digest);
    registry.push(&v2, "demo/app", "latest").await?;
    kubectl_apply(&manifest).await?;
    let d = stored(&client, &ns, "app").await?;
    assert_eq!(
        image_of(&d),
        format!("{latest}@{}", v2.digest),
        "pinned to v2"
    );
    assert_eq!(
        replica_sets_settled(&client, &ns, "app").await?,
        2,
        "a new ReplicaSet for v2"
    );
    let generation = d.metadata.generation;

    // Nothing pushed: the same apply changes nothing (the resolver's output admits as itself).
    kubectl_apply(&manifest).await?;
    let d = stored(&client, &ns, "app").await?;
    assert_eq!(image_of(&d), format!("{latest}@{}", v2.digest));
    assert_eq!(d.metadata.generation, generation, "no template change");
    assert_eq!(
        replica_sets_settled(&client, &ns, "app").await?,
        2,
        "no new ReplicaSet"
    );

    // A restamp re-resolves a pinned image (the digest is dropped, the tag resolved again).
    let v3 = OciImage::single("v3")?;
    registry.push(&v3, "demo/app", "latest").await?;
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .patch(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {"helmop.dev/restamp": "1"}}})),
        )
        .await?;
    let d = stored(&client, &ns, "app").await?;
    assert_eq!(
        image_of(&d),
        format!("{latest}@{}", v3.digest),
        "restamp re-resolves"
    );
    assert_eq!(replica_sets_settled(&client, &ns, "app").await?, 3);

    // Annotate mode, chosen per workload: the image stays, the digest goes into the pod template.
    let annotated = deployment(
        &ns,
        "annotated",
        &latest,
        json!({}),
        json!({"helmop.dev/image-mode": "annotate"}),
    );
    kubectl_apply(&annotated).await?;
    let d = stored(&client, &ns, "annotated").await?;
    assert_eq!(image_of(&d), latest, "annotate mode leaves the image");
    let template = &d.spec.template;
    let annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    assert_eq!(
        annotations.get(IMAGE_DIGESTS),
        Some(&format!("app={}", v3.digest))
    );
    let container = &template.spec.as_ref().context("pod spec")?.containers[0];
    assert_eq!(container.image_pull_policy.as_deref(), Some("Always"));

    // `off` per workload: untouched.
    let off = deployment(
        &ns,
        "off",
        &latest,
        json!({}),
        json!({"helmop.dev/image-mode": "off"}),
    );
    kubectl_apply(&off).await?;
    assert_eq!(image_of(&stored(&client, &ns, "off").await?), latest);

    assert!(webhook.resolver.resolutions("resolved") >= 5);
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_auth_pull_secrets_and_multi_arch_index() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "img-auth").await?;
    let registry = TestRegistry::start_with_basic_auth("ci", "s3cret-pw").await?;
    let webhook =
        Webhook::start(client.clone(), &[registry.host()], Duration::from_secs(2)).await?;
    let registration = webhook.register(&client, &ns).await?;

    let multi = OciImage::multi_arch("m1")?;
    registry.push(&multi, "demo/multi", "latest").await?;
    let latest = format!("{}:latest", registry.repository("demo/multi"));

    let auth = base64::engine::general_purpose::STANDARD.encode("ci:s3cret-pw");
    let config = json!({"auths": {registry.host(): {"auth": auth}}}).to_string();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "pull", "namespace": ns},
        "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(config)},
    });
    kubectl_apply(&secret).await?;

    // Without credentials: admitted unchanged, with a warning that says why (and no secret in it).
    let anonymous = deployment(&ns, "anonymous", &latest, json!({}), json!({}));
    let out = kubectl_apply(&anonymous).await?;
    assert_eq!(image_of(&stored(&client, &ns, "anonymous").await?), latest);
    let warning = stderr(&out);
    assert!(warning.contains("authentication failed"), "{warning}");
    assert!(
        !warning.contains("s3cret") && !warning.contains(&auth),
        "{warning}"
    );

    // The pod's imagePullSecrets: pinned to the index digest, never a platform's.
    let with_secret = deployment(
        &ns,
        "with-secret",
        &latest,
        json!({"imagePullSecrets": [{"name": "pull"}]}),
        json!({}),
    );
    kubectl_apply(&with_secret).await?;
    let image = image_of(&stored(&client, &ns, "with-secret").await?);
    assert_eq!(
        image,
        format!("{latest}@{}", multi.digest),
        "the index digest"
    );
    assert!(
        multi
            .platform_digests
            .iter()
            .all(|p| !image.contains(p.as_str()))
    );

    // The ServiceAccount's imagePullSecrets count too.
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .patch(
            "default",
            &PatchParams::apply("helmop-tests").force(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "default"}, "imagePullSecrets": [{"name": "pull"}]})),
        )
        .await?;
    let via_account = deployment(&ns, "via-account", &latest, json!({}), json!({}));
    kubectl_apply(&via_account).await?;
    assert_eq!(
        image_of(&stored(&client, &ns, "via-account").await?),
        format!("{latest}@{}", multi.digest)
    );
    assert!(webhook.resolver.resolutions("unauthorized") >= 1);
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_down_admits_unchanged_within_the_budget() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "img-down").await?;
    let mut registry = TestRegistry::start().await?;
    // A registry that accepts connections and never answers: only the budget ends the wait.
    let black_hole = helmop_tests::registry::BlackHole::start().await?;
    let hole = black_hole.addr.clone();
    let budget = Duration::from_millis(1500);
    let webhook = Webhook::start(client.clone(), &[registry.host(), &hole], budget).await?;
    let registration = webhook.register(&client, &ns).await?;

    let v1 = OciImage::single("down-v1")?;
    registry.push(&v1, "demo/app", "latest").await?;
    let latest = format!("{}:latest", registry.repository("demo/app"));
    let manifest = deployment(&ns, "app", &latest, json!({}), json!({}));
    kubectl_apply(&manifest).await?;
    let pinned = format!("{latest}@{}", v1.digest);
    assert_eq!(image_of(&stored(&client, &ns, "app").await?), pinned);

    registry.stop().await?;
    // A new workload: admitted unchanged with a warning.
    let fresh = deployment(&ns, "fresh", &latest, json!({}), json!({}));
    let out = kubectl_apply(&fresh).await?;
    assert_eq!(image_of(&stored(&client, &ns, "fresh").await?), latest);
    assert!(
        stderr(&out).contains("registry unreachable"),
        "{}",
        stderr(&out)
    );
    // Re-applying over a pinned image while the registry is down keeps the pin: an outage never rolls.
    let out = kubectl_apply(&manifest).await?;
    assert_eq!(image_of(&stored(&client, &ns, "app").await?), pinned);
    assert!(
        stderr(&out).contains("kept the previous digest"),
        "{}",
        stderr(&out)
    );

    // A registry that hangs: the admission returns when the budget runs out, not at the API server's timeout.
    let hanging = deployment(
        &ns,
        "hanging",
        &format!("{hole}/demo/app:latest"),
        json!({}),
        json!({}),
    );
    let started = Instant::now();
    let out = kubectl_apply(&hanging).await?;
    let elapsed = started.elapsed();
    assert!(
        stderr(&out).contains("time budget exhausted"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        image_of(&stored(&client, &ns, "hanging").await?),
        format!("{hole}/demo/app:latest")
    );
    assert!(elapsed >= budget, "answered before the budget: {elapsed:?}");
    // kubectl itself (discovery, the GET and PATCH) takes well under the webhook's 10 s timeout.
    assert!(
        elapsed < Duration::from_secs(8),
        "the budget did not bound the admission: {elapsed:?}"
    );
    assert!(webhook.resolver.resolutions("timeout") >= 1);
    drop(black_hole);
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}
