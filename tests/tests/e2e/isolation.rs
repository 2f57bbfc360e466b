//! Isolation (docs/webhook-safety.md): deadlines that compose,
//! and config stamps that bind their namespace, with the migration from v1 stamps. The webhook runs
//! in-process on loopback, registered on the upstream kube-apiserver for the test's namespaces, and
//! workloads are written with real `kubectl`.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use helmop_core::hash::{HashKey, ObjectData, Observed, config_stamp};
use helmop_core::podrefs::pod_refs_from_value;
use helmop_tests::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::PostParams;
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::images::{Webhook, deployment, image_of, stored};

const CONFIG_HASH: &str = "helmop.dev/config-hash";
const CONFIG_REFS: &str = "helmop.dev/config-refs";
const OPT_IN: (&str, &str) = ("helmop.dev/rollout-on-change", "enabled");

fn cluster() -> &'static ClusterInfo {
    control_plane().upstream()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

async fn kubectl_ok(args: &[&str], stdin: Option<&str>) -> anyhow::Result<String> {
    let out = cluster().run_kubectl(args, stdin).await?;
    if !out.status.success() {
        bail!("kubectl {args:?} failed: {}", text(&out.stderr));
    }
    Ok(text(&out.stderr))
}

/// Waits until kube-controller-manager has acted on the Deployment's latest spec, then counts its
/// ReplicaSets (one per rollout).
async fn rollouts(client: &Client, ns: &str, name: &str) -> anyhow::Result<usize> {
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
    wait_until(
        &format!("Deployment {name} to be observed"),
        DEFAULT_TIMEOUT,
        || async {
            let d = deployments.get(name).await?;
            let observed = d.status.as_ref().and_then(|s| s.observed_generation);
            Ok(observed.is_some() && observed == d.metadata.generation)
        },
    )
    .await?;
    replica_sets(client, ns, name).await
}

async fn stamp_of(client: &Client, ns: &str, name: &str) -> anyhow::Result<Option<String>> {
    Ok(template_annotation(
        &Api::<Deployment>::namespaced(client.clone(), ns)
            .get(name)
            .await?,
        CONFIG_HASH,
    ))
}

/// An image budget longer than the request deadline ends with the deadline, and the UPDATE
/// keeps the stored pin and gets its stamp, instead of the deadline admitting it with no patch at
/// all (a bare tag and no stamp: a rollout nobody asked for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_image_budget_ends_with_the_request_deadline_and_pins_and_stamp_stay()
-> anyhow::Result<()> {
    let client = cluster().client().await;
    ensure_hash_key(&client).await?;
    let ns = fresh_namespace(&client, "iso-deadline").await?;
    // A registry that accepts connections and never answers.
    let black_hole = helmop_tests::registry::BlackHole::start().await?;
    let hole = black_hole.addr.clone();
    // An image budget far beyond the request deadline (4 s by default) and the registration's 10 s.
    let webhook = Webhook::start(client.clone(), &[&hole], Duration::from_secs(60)).await?;
    let registration = webhook.register(&client, &ns).await?;
    create_config_map(&client, &ns, "app", &[("GREETING", "hello")]).await?;

    let tag = format!("{hole}/demo/app:latest");
    let pinned = format!("{tag}@sha256:{}", "1".repeat(64));
    let manifest = |image: &str| {
        let mut d = deployment(&ns, "web", image, json!({}), json!({}));
        let container = &mut d["spec"]["template"]["spec"]["containers"][0];
        container["envFrom"] = json!([{"configMapRef": {"name": "app"}}]);
        // Stated, so the API server's defaulting (Always for a bare `:latest`) does not change it.
        container["imagePullPolicy"] = json!("IfNotPresent");
        d
    };
    // Created pinned (nothing to resolve): stamped.
    kubectl_ok(&["apply", "-f", "-"], Some(&manifest(&pinned).to_string())).await?;
    let created = stored(&client, &ns, "web").await?;
    let stamp = template_annotation(&created, CONFIG_HASH).context("not stamped")?;
    assert_eq!(image_of(&created), pinned);
    assert_eq!(rollouts(&client, &ns, "web").await?, 1);

    // A replace of the manifest with the bare tag and no stamp: the registry hangs past the deadline.
    let started = Instant::now();
    let stderr = kubectl_ok(&["replace", "-f", "-"], Some(&manifest(&tag).to_string())).await?;
    let elapsed = started.elapsed();
    let after = stored(&client, &ns, "web").await?;
    assert_eq!(image_of(&after), pinned, "the pin was dropped; {stderr}");
    assert_eq!(
        template_annotation(&after, CONFIG_HASH).as_deref(),
        Some(stamp.as_str()),
        "the stamp was dropped; {stderr}"
    );
    assert!(stderr.contains("kept the previous digest"), "{stderr}");
    // (Not the generation: a Deployment's also counts changes of its own annotations.)
    assert_eq!(
        serde_json::to_value(&after.spec.template)?,
        serde_json::to_value(&created.spec.template)?,
        "the pod template changed"
    );
    assert_eq!(rollouts(&client, &ns, "web").await?, 1, "it rolled");
    // Answered by the request deadline (4 s), not by the API server's timeout (10 s).
    assert!(elapsed < Duration::from_secs(9), "took {elapsed:?}");
    drop(black_hole);
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

fn envfrom_deployment(ns: &str, name: &str) -> Value {
    deployment_manifest(
        ns,
        name,
        json!({}),
        json!({"envFrom": [{"configMapRef": {"name": "app"}}]}),
    )
}

/// The same content read the same way in two namespaces stamps differently (`v2:`), and a stored
/// `v1:` stamp is never kept: not namespace-bound, a kept v1 value would tell whoever planted it
/// (another namespace's, copied while the webhook did not see the workload) whether their guess of
/// that namespace's content was right. A workload still carrying v1 moves to v2 on its first UPDATE,
/// whatever it reads (one rollout), and stays there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stamps_bind_the_namespace_and_a_stored_v1_stamp_is_never_kept() -> anyhow::Result<()> {
    let client = cluster().client().await;
    let key = HashKey::new(&ensure_hash_key(&client).await?).map_err(anyhow::Error::msg)?;
    let ns_a = fresh_namespace_with_labels(&client, "iso-v2a", &[OPT_IN]).await?;
    let ns_b = fresh_namespace_with_labels(&client, "iso-v2b", &[OPT_IN]).await?;
    // The release webhook on one CPU: what a tenant probing with dry-runs meets.
    let webhook = WebhookBinary::release_one_cpu(&cluster().kubeconfig, &[]).await?;
    let registered_a = webhook.register(&client, &ns_a).await?;
    let registered_b = webhook.register(&client, &ns_b).await?;
    for ns in [&ns_a, &ns_b] {
        create_config_map(&client, ns, "app", &[("PASSWORD", "hunter2")]).await?;
        kubectl_ok(
            &["apply", "-f", "-"],
            Some(&envfrom_deployment(ns, "web").to_string()),
        )
        .await?;
    }
    let in_a = stamp_of(&client, &ns_a, "web")
        .await?
        .context("a: no stamp")?;
    let in_b = stamp_of(&client, &ns_b, "web")
        .await?
        .context("b: no stamp")?;
    assert!(
        in_a.starts_with("v2:") && in_b.starts_with("v2:"),
        "{in_a} {in_b}"
    );
    assert_ne!(
        in_a, in_b,
        "the same content stamps alike in two namespaces"
    );

    // A workload stamped by the previous version: created in a namespace the webhook does not see
    // yet, with the v1 stamp of what it reads.
    let ns_old = fresh_namespace_with_labels(&client, "iso-v1", &[OPT_IN]).await?;
    create_config_map(&client, &ns_old, "app", &[("PASSWORD", "hunter2")]).await?;
    let mut legacy = envfrom_deployment(&ns_old, "legacy");
    let cm = Api::<ConfigMap>::namespaced(client.clone(), &ns_old)
        .get("app")
        .await?;
    let refs = pod_refs_from_value(&legacy["spec"]["template"]["spec"])?;
    let v1 = config_stamp(&key, &refs, |_| Observed::Data(ObjectData::from(&cm)));
    assert!(v1.config_hash.starts_with("v1:"));
    legacy["spec"]["template"]["metadata"]["annotations"] =
        json!({CONFIG_HASH: v1.config_hash, CONFIG_REFS: v1.config_refs});
    Api::<Deployment>::namespaced(client.clone(), &ns_old)
        .create(&PostParams::default(), &serde_json::from_value(legacy)?)
        .await?;
    assert_eq!(rollouts(&client, &ns_old, "legacy").await?, 1);
    let registered_old = webhook.register(&client, &ns_old).await?;

    // The planted v1 value is exactly the v1 stamp of what the workload reads (the guess is right):
    // a dry-run UPDATE does not keep it, nor does a real one.
    let dry_run: Value = serde_json::from_slice(
        &cluster()
            .run_kubectl(
                &["apply", "--dry-run=server", "-o", "json", "-f", "-"],
                Some(&envfrom_deployment(&ns_old, "legacy").to_string()),
            )
            .await?
            .stdout,
    )?;
    let answered = dry_run["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        answered.starts_with("v2:"),
        "a dry-run kept the planted v1 value: {answered}"
    );
    restamp(cluster(), &ns_old, "deployment/legacy", "after-upgrade").await?;
    let moved = stamp_of(&client, &ns_old, "legacy")
        .await?
        .context("no stamp")?;
    assert!(moved.starts_with("v2:"), "{moved}");
    assert_eq!(moved, answered);
    assert_eq!(
        rollouts(&client, &ns_old, "legacy").await?,
        2,
        "the move to v2 is one rollout"
    );
    // And stays: the next UPDATE computes the same v2 stamp.
    kubectl_ok(
        &["apply", "-f", "-"],
        Some(&envfrom_deployment(&ns_old, "legacy").to_string()),
    )
    .await?;
    restamp(cluster(), &ns_old, "deployment/legacy", "again").await?;
    assert_eq!(
        stamp_of(&client, &ns_old, "legacy").await?.as_deref(),
        Some(moved.as_str())
    );
    assert_eq!(rollouts(&client, &ns_old, "legacy").await?, 2);

    for r in [registered_a, registered_b, registered_old] {
        r.remove().await?;
    }
    Ok(())
}
