//! The image resolver under hostile tenants, end to end on the real API
//! server: the release webhook pinned to one CPU (as `limits.cpu: "1"` leaves it) with its production
//! cache lifetimes, read through its `/metrics`; loopback listeners as registries that count their
//! connections (and hold the ones asking for a "slow" repository open, unanswered), real `kubectl apply`
//! (server-side dry-runs for the tenant trying its luck).
//!
//! - `--image-mode off` is off: no annotation turns registry traffic on, and annotate is never raised to pin;
//! - one admission naming many registries resolves a bounded few (connections and DNS lookups counted);
//! - one tenant's slow repositories neither starve another's image on the same registry nor leave a
//!   cached timeout that unpins it later;
//! - addresses in the deny-list (by default the IPv6 pod and Service ranges k3s/RKE2 document) are refused
//!   for unlisted registries, while a listed registry stays trusted at its `host:port`.

use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use helmop_tests::*;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::images::{deployment, image_of, kubectl_apply, register_deployments, stderr, stored};

const DIGEST: &str = "sha256:5b6c1e8a5bd4b1a3e2f1f0a8f02f4b0d7e2c6c9a4f1d3b2a1e0f9c8b7a6d5e4f";
const IMAGE_DIGESTS: &str = "helmop.dev/image-digests";
const IMAGE_MODE: &str = "helmop.dev/image-mode";

/// A loopback registry answering every manifest request with [`DIGEST`], except for repositories whose name
/// starts with `slow`: those requests are held open, unanswered, until the client goes away.
struct FakeRegistry {
    port: u16,
    connections: Arc<AtomicUsize>,
    held: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl FakeRegistry {
    async fn start() -> anyhow::Result<FakeRegistry> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let connections = Arc::new(AtomicUsize::new(0));
        let held = Arc::new(AtomicUsize::new(0));
        let (counter, holding) = (connections.clone(), held.clone());
        let task = tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                counter.fetch_add(1, Ordering::SeqCst);
                let holding = holding.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 4096];
                    loop {
                        while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                            match socket.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => head.extend_from_slice(&buf[..n]),
                            }
                        }
                        let text = String::from_utf8_lossy(&head).into_owned();
                        head.clear();
                        let path = text.split(' ').nth(1).unwrap_or_default().to_owned();
                        if path.starts_with("/v2/slow") {
                            holding.fetch_add(1, Ordering::SeqCst);
                            // Until the client closes the connection.
                            while let Ok(n) = socket.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                            }
                            holding.fetch_sub(1, Ordering::SeqCst);
                            return;
                        }
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\ndocker-content-digest: {DIGEST}\r\n\
                             content-type: application/vnd.oci.image.index.v1+json\r\n\r\n"
                        );
                        if socket.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Ok(FakeRegistry {
            port,
            connections,
            held,
            task,
        })
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Requests for `slow*` repositories being held right now.
    fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }
}

impl Drop for FakeRegistry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The release webhook on one CPU (what a tenant meets) with the registry resolver in `mode` and
/// `registry_config` as its `--registry-config`: the production cache lifetimes and image budget.
struct Resolver {
    webhook: WebhookBinary,
    _registry_config: tempfile::TempDir,
}

impl Resolver {
    async fn start(mode: &str, registry_config: Value, extra: &[&str]) -> anyhow::Result<Resolver> {
        let dir = tempfile::tempdir()?;
        let registries = dir.path().join("registries.yaml");
        std::fs::write(&registries, registry_config.to_string())?;
        let registries = registries.to_string_lossy().into_owned();
        let mut args = vec!["--image-mode", mode, "--registry-config", &registries];
        args.extend_from_slice(extra);
        let webhook =
            WebhookBinary::release_one_cpu(&control_plane().upstream().kubeconfig, &args).await?;
        Ok(Resolver {
            webhook,
            _registry_config: dir,
        })
    }

    async fn register(&self, client: &Client, namespace: &str) -> anyhow::Result<String> {
        register_deployments(client, namespace, &self.webhook.url, &self.webhook.ca_pem).await
    }

    /// A counter of its `/metrics` (0 before its first increment).
    async fn counter(&self, series: &str) -> anyhow::Result<u64> {
        Ok(self.webhook.metric(series).await? as u64)
    }

    /// HTTP requests sent to registries and token endpoints so far.
    async fn registry_requests(&self) -> anyhow::Result<u64> {
        self.counter("helmop_webhook_registry_requests_total").await
    }

    async fn dns_lookups(&self) -> anyhow::Result<u64> {
        self.counter("helmop_webhook_registry_dns_lookups_total")
            .await
    }

    /// Resolutions so far with this outcome.
    async fn resolutions(&self, outcome: &str) -> anyhow::Result<u64> {
        self.counter(&format!(
            "helmop_webhook_image_resolutions_total{{outcome=\"{outcome}\"}}"
        ))
        .await
    }

    /// Live GETs of this kind (`secrets`, `serviceaccounts`) so far.
    async fn live_gets(&self, kind: &str) -> anyhow::Result<u64> {
        self.counter(&format!(
            "helmop_webhook_live_gets_total{{kind=\"{kind}\"}}"
        ))
        .await
    }
}

/// A Deployment whose containers `c0`, `c1`, ... run `images`.
fn deployment_of(namespace: &str, name: &str, images: &[String], annotations: Value) -> Value {
    let mut d = deployment(namespace, name, "placeholder", json!({}), annotations);
    d["spec"]["template"]["spec"]["containers"] = images
        .iter()
        .enumerate()
        .map(|(i, image)| json!({"name": format!("c{i}"), "image": image}))
        .collect();
    d
}

fn images_of(d: &k8s_openapi::api::apps::v1::Deployment) -> Vec<String> {
    d.spec
        .template
        .spec
        .as_ref()
        .map(|s| {
            s.containers
                .iter()
                .map(|c| c.image.clone().unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

/// `kubectl apply --dry-run=server`: the tenant's probe, admitted (and mutated) but never stored.
async fn dry_run(object: &Value) -> anyhow::Result<Output> {
    let out = control_plane()
        .upstream()
        .run_kubectl(
            &["apply", "--dry-run=server", "-f", "-"],
            Some(&object.to_string()),
        )
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "dry-run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(out)
}

async fn annotate_namespace(client: &Client, namespace: &str, mode: &str) -> anyhow::Result<()> {
    Api::<Namespace>::all(client.clone())
        .patch(
            namespace,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {IMAGE_MODE: mode}}})),
        )
        .await?;
    Ok(())
}

/// A workload (and its namespace) asking for `pin` gets nothing from a webhook started with `off`, and
/// only `annotate` from one started with `annotate`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_mode_off_is_off_whatever_the_annotations_say() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "hostile-off").await?;
    annotate_namespace(&client, &ns, "pin").await?;
    let registry = FakeRegistry::start().await?;
    let image = format!("{}/app:latest", registry.host());
    let asks_pin = json!({IMAGE_MODE: "pin"});

    let off = Resolver::start("off", json!({"insecure": [registry.host()]}), &[]).await?;
    let registration = off.register(&client, &ns).await?;
    kubectl_apply(&deployment(
        &ns,
        "asks-pin",
        &image,
        json!({}),
        asks_pin.clone(),
    ))
    .await?;
    assert_eq!(image_of(&stored(&client, &ns, "asks-pin").await?), image);
    assert_eq!(
        registry.connections(),
        0,
        "with --image-mode off a registry was contacted"
    );
    assert_eq!(off.registry_requests().await?, 0);
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    drop(off);

    // `annotate` is a ceiling too: the digest is recorded, the image is not rewritten.
    let annotate = Resolver::start("annotate", json!({"insecure": [registry.host()]}), &[]).await?;
    let registration = annotate.register(&client, &ns).await?;
    kubectl_apply(&deployment(
        &ns,
        "annotate-asks-pin",
        &image,
        json!({}),
        asks_pin,
    ))
    .await?;
    let d = stored(&client, &ns, "annotate-asks-pin").await?;
    assert_eq!(image_of(&d), image, "annotate was raised to pin");
    let recorded = d
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(IMAGE_DIGESTS).cloned());
    assert_eq!(recorded, Some(format!("app={DIGEST}")));
    assert!(registry.connections() > 0);
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

/// One admission naming twelve registries contacts four of them (`MAX_REGISTRIES_PER_ADMISSION`),
/// and one naming forty unlisted hosts looks up at most four names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_workload_naming_many_registries_costs_a_bounded_few() -> anyhow::Result<()> {
    use helmop_webhook::images::{MAX_IMAGES_PER_ADMISSION, MAX_REGISTRIES_PER_ADMISSION};

    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "hostile-many").await?;
    let mut registries = Vec::new();
    for _ in 0..12 {
        registries.push(FakeRegistry::start().await?);
    }
    let hosts: Vec<String> = registries.iter().map(FakeRegistry::host).collect();
    let webhook = Resolver::start("pin", json!({"insecure": hosts}), &[]).await?;
    let registration = webhook.register(&client, &ns).await?;

    let images: Vec<String> = hosts.iter().map(|h| format!("{h}/app:latest")).collect();
    let out = kubectl_apply(&deployment_of(&ns, "many", &images, json!({}))).await?;
    let warnings = stderr(&out);
    let stored_images = images_of(&stored(&client, &ns, "many").await?);
    for (i, (written, admitted)) in images.iter().zip(&stored_images).enumerate() {
        if i < MAX_REGISTRIES_PER_ADMISSION {
            assert_eq!(*admitted, format!("{written}@{DIGEST}"));
        } else {
            assert_eq!(admitted, written, "registry {i} was resolved");
        }
    }
    assert!(
        warnings.contains("more images or registries than one admission resolves"),
        "{warnings}"
    );
    let contacted = registries.iter().filter(|r| r.connections() > 0).count();
    assert_eq!(
        contacted, MAX_REGISTRIES_PER_ADMISSION,
        "registries contacted"
    );
    for r in &registries[MAX_REGISTRIES_PER_ADMISSION..] {
        assert_eq!(r.connections(), 0);
    }

    // Forty unlisted names (which never resolve): a few DNS lookups, not forty (nor forty times the
    // search list).
    let before = webhook.dns_lookups().await?;
    let names: Vec<String> = (0..40)
        .map(|i| format!("r{i}.{ns}.hostile.invalid/app:latest"))
        .collect();
    dry_run(&deployment_of(&ns, "names", &names, json!({}))).await?;
    let lookups = webhook.dns_lookups().await? - before;
    assert!(
        (1..=MAX_REGISTRIES_PER_ADMISSION as u64).contains(&lookups),
        "{lookups} DNS lookups for one admission"
    );

    // Many images of one registry: at most MAX_IMAGES_PER_ADMISSION requests' worth are resolved.
    let one = &registries[0];
    let repositories: Vec<String> = (0..40)
        .map(|i| format!("{}/app{i}:latest", one.host()))
        .collect();
    let before = webhook.registry_requests().await?;
    dry_run(&deployment_of(&ns, "repos", &repositories, json!({}))).await?;
    let requests = webhook.registry_requests().await? - before;
    assert!(
        (1..=MAX_IMAGES_PER_ADMISSION as u64).contains(&requests),
        "{requests} registry requests for one admission"
    );
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

/// A tenant's dry-run naming eight slow repositories ahead of another tenant's image on the same
/// registry neither starves that image's lookup while it runs nor leaves a timeout behind for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_tenant_cannot_unpin_another() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let attacker = fresh_namespace(&client, "hostile-attacker").await?;
    let victim = fresh_namespace(&client, "hostile-victim").await?;
    let registry = FakeRegistry::start().await?;
    // The production cache lifetimes: a cached timeout would outlive the attacker's dry-run.
    let webhook = Resolver::start("pin", json!({"insecure": [registry.host()]}), &[]).await?;
    let registrations = [
        webhook.register(&client, &attacker).await?,
        webhook.register(&client, &victim).await?,
    ];
    let victims_image = format!("{}/victim:latest", registry.host());
    let mut probe: Vec<String> = (0..8)
        .map(|i| format!("{}/slow{i}:latest", registry.host()))
        .collect();
    probe.push(victims_image.clone());
    let probe = deployment_of(&attacker, "probe", &probe, json!({}));

    // After the dry-run (its lookups ran out of time): the victim's next admission is pinned.
    let out = dry_run(&probe).await?;
    assert!(
        stderr(&out).contains("not resolved to a digest"),
        "{}",
        stderr(&out)
    );
    kubectl_apply(&deployment(
        &victim,
        "app",
        &victims_image,
        json!({}),
        json!({}),
    ))
    .await?;
    assert_eq!(
        image_of(&stored(&client, &victim, "app").await?),
        format!("{victims_image}@{DIGEST}"),
        "the attacker's timeout was reused for the victim"
    );

    // While the dry-run holds its slow requests: the victim's image still gets a slot on the registry.
    let background = tokio::spawn({
        let probe = probe.clone();
        async move { dry_run(&probe).await }
    });
    wait_until(
        "the probe's slow requests to reach the registry",
        DEFAULT_TIMEOUT,
        || {
            let held = registry.held();
            async move { Ok(held >= 2) }
        },
    )
    .await?;
    kubectl_apply(&deployment(
        &victim,
        "app-2",
        &victims_image,
        json!({}),
        json!({}),
    ))
    .await?;
    assert_eq!(
        image_of(&stored(&client, &victim, "app-2").await?),
        format!("{victims_image}@{DIGEST}"),
        "the attacker's slow repositories starved the victim's lookup"
    );
    background.await??;
    for name in registrations {
        unregister_webhook(&client, WebhookKind::Mutating, &name).await?;
    }
    Ok(())
}

/// An address in the deny-list (by default the IPv6 ranges k3s and RKE2 document for pods and
/// Services; the registry config's `deny` replaces them) is refused for a registry the config does not
/// list, before any connection; `--registry-deny` adds ranges. A listed registry is trusted at its
/// `host:port` even inside a denied range.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_ranges_are_refused_unless_the_registry_is_listed() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "hostile-deny").await?;

    // The default deny-list: a global IPv6 address in k3s's documented pod range.
    let defaults = Resolver::start("pin", json!({}), &[]).await?;
    let registration = defaults.register(&client, &ns).await?;
    let pod_address = "[2001:cafe:42::17]:5000/app:latest".to_owned();
    let out = kubectl_apply(&deployment(
        &ns,
        "v6-pod",
        &pod_address,
        json!({}),
        json!({}),
    ))
    .await?;
    let warnings = stderr(&out);
    assert_eq!(
        image_of(&stored(&client, &ns, "v6-pod").await?),
        pod_address
    );
    assert!(warnings.contains("not resolved to a digest"), "{warnings}");
    assert!(
        !warnings.contains("2001:cafe:42::17]:5000 is"),
        "{warnings}"
    );
    assert_eq!(defaults.resolutions("refused").await?, 1);
    assert_eq!(defaults.resolutions("unreachable").await?, 0);
    assert_eq!(defaults.registry_requests().await?, 0);
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    drop(defaults);

    // The operator's own ranges: a privately used public IPv4 range, and loopback where a listed registry
    // lives.
    let listed = FakeRegistry::start().await?;
    let custom = Resolver::start(
        "pin",
        json!({"insecure": [listed.host()], "deny": ["11.0.0.0/8", "127.0.0.0/8"]}),
        &[],
    )
    .await?;
    let registration = custom.register(&client, &ns).await?;
    let private_public = "11.2.3.4:5000/app:latest".to_owned();
    kubectl_apply(&deployment(
        &ns,
        "v4-private",
        &private_public,
        json!({}),
        json!({}),
    ))
    .await?;
    assert_eq!(
        image_of(&stored(&client, &ns, "v4-private").await?),
        private_public
    );
    assert_eq!(custom.resolutions("refused").await?, 1);
    assert_eq!(custom.registry_requests().await?, 0);
    let image = format!("{}/app:latest", listed.host());
    kubectl_apply(&deployment(&ns, "listed", &image, json!({}), json!({}))).await?;
    assert_eq!(
        image_of(&stored(&client, &ns, "listed").await?),
        format!("{image}@{DIGEST}"),
        "a listed registry is trusted at its host:port"
    );
    assert!(listed.connections() > 0);
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    drop(custom);

    // `--registry-deny` adds to the default deny-list (or the config's).
    let flagged = Resolver::start("pin", json!({}), &["--registry-deny", "12.0.0.0/8"]).await?;
    let registration = flagged.register(&client, &ns).await?;
    for (name, image) in [
        ("flag-v4", "12.1.1.1:5000/app:latest"),
        ("flag-v6", pod_address.as_str()),
    ] {
        kubectl_apply(&deployment(&ns, name, image, json!({}), json!({}))).await?;
        assert_eq!(image_of(&stored(&client, &ns, name).await?), image);
    }
    assert_eq!(flagged.resolutions("refused").await?, 2);
    assert_eq!(flagged.registry_requests().await?, 0);
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

/// A pod listing thousands of image pull secrets makes a bounded few Secret GETs, through the
/// webhook's counted live reads (its ServiceAccount too), and is told the rest were not read; its
/// image is still pinned.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_pull_secrets_cost_a_bounded_few_counted_reads() -> anyhow::Result<()> {
    use helmop_webhook::images::pull_secrets::MAX_PULL_SECRETS;
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "hostile-pull").await?;
    let registry = FakeRegistry::start().await?;
    let image = format!("{}/app:latest", registry.host());
    let webhook = Resolver::start("pin", json!({"insecure": [registry.host()]}), &[]).await?;
    let registration = webhook.register(&client, &ns).await?;
    let mut d = deployment(&ns, "many-secrets", &image, json!({}), json!({}));
    d["spec"]["template"]["spec"]["imagePullSecrets"] = (0..3_000)
        .map(|i| json!({"name": format!("pull-{i}")}))
        .collect();
    let before = webhook.live_gets("secrets").await?;
    let accounts_before = webhook.live_gets("serviceaccounts").await?;
    let out = dry_run(&d).await?;
    let warnings = String::from_utf8_lossy(&out.stderr).into_owned();
    let gets = webhook.live_gets("secrets").await? - before;
    // The ServiceAccount naming more pull secrets is read on the same counted road: once per call
    // of the webhook (the API server may call a mutating webhook a second time).
    let accounts = webhook.live_gets("serviceaccounts").await? - accounts_before;
    assert!(
        (1..=2).contains(&accounts),
        "{accounts} counted ServiceAccount GETs for one admission"
    );
    assert!(
        gets <= MAX_PULL_SECRETS as u64 && gets > 0,
        "{gets} counted Secret GETs for 3,000 pull secrets"
    );
    assert!(
        warnings.contains("the pod has 3000 image pull secrets")
            && warnings.contains(&format!("only the first {MAX_PULL_SECRETS} are read")),
        "{warnings}"
    );
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}
