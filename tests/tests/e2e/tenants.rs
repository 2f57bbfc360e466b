//! The webhook under hostile tenants (docs/webhook-safety.md): what a tenant with one namespace can make
//! it do is bounded, answers no guess about another namespace, and vetoes nobody else's work. The
//! webhook is the release binary the images ship, pinned to one CPU as `limits.cpu: "1"` leaves it and
//! requiring the API server's client certificate, on loopback against the real upstream kube-apiserver,
//! registered for the test's namespace only; objects are written with real `kubectl`.

use std::process::Output;

use anyhow::Context;
use helmop_tests::proxy::{StallingProxy, kubeconfig_through, server_addr};
use helmop_tests::*;
use serde_json::{Value, json};

use crate::stamping::{CONFIG_HASH, OPT_IN, annotation, apply_ok, cluster, kubectl, text};

/// The release webhook on one CPU against the upstream cluster: what a tenant meets.
async fn release_webhook(extra: &[&str]) -> anyhow::Result<WebhookBinary> {
    WebhookBinary::release_one_cpu(&cluster().kubeconfig, extra).await
}

/// An API server that is slow rather than failing: a spec-unchanged HelmOp update is still
/// admitted (with a warning saying what was not checked), a changed spec is refused with a message
/// that names the deadline, both within the webhook's own deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_api_server_never_denies_a_spec_unchanged_helmop_update() -> anyhow::Result<()> {
    let client = cluster().client().await;
    let ns = fresh_namespace(&client, "tn-slow").await?;
    // Stored before the webhook is there: its Secret does not exist, so every check of it is a live GET.
    let helmop = helmop_object(
        &ns,
        "app",
        json!({"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3"}),
        json!([{"kind": "Secret", "name": "db"}]),
    );
    apply_ok(&helmop).await?;
    let proxy = StallingProxy::start(server_addr(cluster())?).await?;
    let through = kubeconfig_through(cluster(), &proxy)?;
    let webhook = WebhookBinary::release_one_cpu(through.path(), &[]).await?;
    let registered = webhook.register(&client, &ns).await?;
    proxy.stall(true);

    let target = "helmops.fleet.cattle.io/app";
    let patch = |p: &'static str| {
        let ns = ns.clone();
        async move {
            kubectl(
                &["patch", "-n", &ns, target, "--type", "merge", "-p", p],
                None,
            )
            .await
        }
    };
    let finalizer = r#"{"metadata": {"finalizers": ["fleet.cattle.io/helmop-finalizer"]}}"#;
    let out = patch(finalizer).await?;
    let stderr = text(&out.stderr);
    assert!(
        out.status.success(),
        "a spec-unchanged update was denied while the API server was slow: {stderr}"
    );
    assert!(
        stderr.contains("before the request deadline")
            && stderr.contains("not enforced: this update leaves spec unchanged"),
        "{stderr}"
    );

    let out = patch(r#"{"spec": {"helm": {"version": "1.2.4"}}}"#).await?;
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "a spec change was admitted unchecked"
    );
    assert!(
        stderr.contains("did not answer the existence checks")
            && stderr.contains("before the request deadline"),
        "{stderr}"
    );

    proxy.stall(false);
    registered.remove().await?;
    kubectl(
        &[
            "patch",
            "-n",
            &ns,
            target,
            "--type",
            "merge",
            "-p",
            r#"{"metadata": {"finalizers": null}}"#,
        ],
        None,
    )
    .await?;
    Ok(())
}

/// The delete guard protects, it does not veto. The garbage collector removes a Secret a
/// HelmOp lists once its owner is gone; a HelmOp with `helmop.dev/allow-missing` gets no claim on a
/// name someone else creates and deletes (a warning instead of a denial); a plain holder still stops
/// a user's delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_never_blocks_the_garbage_collector_or_an_optional_name() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    use kube::Api;
    use kube::api::{DeleteParams, Patch, PatchParams};

    let client = cluster().client().await;
    let ns = fresh_namespace(&client, "tn-guard").await?;
    let webhook = release_webhook(&[]).await?;
    let registered = webhook.register(&client, &ns).await?;
    let owner = create_config_map(&client, &ns, "owner", &[("k", "v")]).await?;
    create_secret(&client, &ns, "owned", &[("k", b"v")]).await?;
    create_secret(&client, &ns, "held", &[("k", b"v")]).await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let uid = owner.metadata.uid.context("the ConfigMap has no uid")?;
    secrets
        .patch(
            "owned",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": uid}
            ]}})),
        )
        .await?;
    for (name, allow_missing, refs) in [
        (
            "app",
            false,
            json!([{"kind": "Secret", "name": "owned"}, {"kind": "Secret", "name": "held"}]),
        ),
        (
            "rotating",
            true,
            json!([{"kind": "Secret", "name": "token"}]),
        ),
    ] {
        let annotations = if allow_missing {
            json!({"helmop.dev/allow-missing": "true"})
        } else {
            json!({})
        };
        apply_ok(&json!({
            "apiVersion": "fleet.cattle.io/v1alpha1",
            "kind": "HelmOp",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations},
            "spec": {
                "helm": {"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3"},
                "downstreamResources": refs,
            },
        }))
        .await?;
    }
    // The guard is in the path: a user's delete of a listed Secret is refused.
    let refused = kubectl(
        &["delete", "secret", "-n", &ns, "held", "--wait=false"],
        None,
    )
    .await?;
    assert!(!refused.status.success(), "a listed Secret was deleted");
    assert!(
        text(&refused.stderr).contains("is a downstream resource of HelmOp app"),
        "{}",
        text(&refused.stderr)
    );

    // The owner goes: the garbage collector's delete of the listed Secret is not refused.
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .delete("owner", &DeleteParams::background())
        .await?;
    wait_until(
        "the garbage collector to remove the owned Secret",
        DEFAULT_TIMEOUT,
        || {
            let secrets = secrets.clone();
            async move { Ok(secrets.get_opt("owned").await?.is_none()) }
        },
    )
    .await?;

    // A name listed only with allow-missing: created and deleted by someone else, with a warning.
    create_secret(&client, &ns, "token", &[("k", b"1")]).await?;
    let out = kubectl(&["delete", "secret", "-n", &ns, "token"], None).await?;
    assert!(
        out.status.success(),
        "allow-missing vetoed a delete: {}",
        text(&out.stderr)
    );
    assert!(
        text(&out.stderr).contains("with helmop.dev/allow-missing"),
        "{}",
        text(&out.stderr)
    );

    registered.remove().await?;
    Ok(())
}

async fn dry_run_create(object: &Value) -> anyhow::Result<Output> {
    kubectl(
        &["create", "--dry-run=server", "-o", "name", "-f", "-"],
        Some(&object.to_string()),
    )
    .await
}

/// Through the real API server: a HelmOp whose `helm.values` hold 2.9 MB of dense
/// lists (far more JSON values than one admission decodes) and one whose `helm.version` has 600,000
/// digits are refused with a reason, each from a server-side dry-run; an ordinary HelmOp of the same
/// namespace is still admitted afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dense_values_and_huge_versions_are_refused_with_a_reason() -> anyhow::Result<()> {
    let client = cluster().client().await;
    let ns = fresh_namespace(&client, "tn-dense").await?;
    let mut webhook = release_webhook(&[]).await?;
    let registered = webhook.register(&client, &ns).await?;
    create_secret(&client, &ns, "db", &[("k", b"v")]).await?;
    let refs = json!([{"kind": "Secret", "name": "db"}]);
    let base = json!({"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3"});

    let mut dense = base.clone();
    dense["values"] = json!({"dense": vec![0; 1_450_000]});
    let out = dry_run_create(&helmop_object(&ns, "dense", dense, refs.clone())).await?;
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "a dense HelmOp was admitted");
    assert!(stderr.contains("more than 262144 JSON values"), "{stderr}");

    let mut huge = base.clone();
    huge["version"] = json!("1".repeat(600_000));
    let out = dry_run_create(&helmop_object(&ns, "huge", huge, refs.clone())).await?;
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "a 600,000-digit version was admitted"
    );
    assert!(
        stderr.contains(
            "a version constraint of 600000 bytes; helmop checks constraints up to 256 bytes"
        ),
        "{stderr}"
    );

    let out = dry_run_create(&helmop_object(&ns, "fine", base, refs)).await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(webhook.running()?, "the webhook exited: {}", webhook.logs());
    registered.remove().await?;
    Ok(())
}

/// HelmOps stored with megabytes of dense values (around the webhook) are listed into the
/// guard's cache object by object without their values, and the guard still protects what they list.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stored_dense_helmops_are_cached_without_their_values_and_still_guard() -> anyhow::Result<()>
{
    let client = cluster().client().await;
    let ns = fresh_namespace(&client, "tn-stored").await?;
    create_secret(&client, &ns, "db", &[("k", b"v")]).await?;
    for i in 0..3 {
        let helm = json!({"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3",
                          "values": {"dense": vec![0; 600_000]}});
        // `create`, not `apply`: no last-applied copy of the values in an annotation.
        let helmop = helmop_object(
            &ns,
            &format!("dense-{i}"),
            helm,
            json!([{"kind": "Secret", "name": "db"}]),
        );
        let out = kubectl(&["create", "-f", "-"], Some(&helmop.to_string())).await?;
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
    let webhook = release_webhook(&[]).await?;
    let registered = webhook.register(&client, &ns).await?;
    let out = kubectl(&["delete", "secret", "-n", &ns, "db", "--wait=false"], None).await?;
    let stderr = text(&out.stderr);
    assert!(
        !out.status.success(),
        "a Secret listed by stored HelmOps was deleted"
    );
    assert!(
        stderr.contains("is a downstream resource of HelmOps dense-0, dense-1 and dense-2"),
        "{stderr}"
    );
    registered.remove().await?;
    Ok(())
}

/// `kubectl create --dry-run=server` of `deployment`: its pod template's stamp, or `None` when the
/// webhook did not stamp it (not in force yet, or it failed open).
async fn dry_run_stamp(deployment: &Value) -> anyhow::Result<Option<String>> {
    let out = kubectl(
        &["create", "--dry-run=server", "-o", "json", "-f", "-"],
        Some(&deployment.to_string()),
    )
    .await?;
    anyhow::ensure!(out.status.success(), "{}", text(&out.stderr));
    let created: Value = serde_json::from_slice(&out.stdout)?;
    Ok(annotation(
        created.pointer("/spec/template/metadata"),
        CONFIG_HASH,
    ))
}

/// 20,000 `envFrom` prefixes over a ConfigMap of 20,000 keys in the tenant's own namespace
/// (41 s of CPU before, when every prefix met every key) are one reference whose keys are read once:
/// the hostile Deployment is stamped within the webhook's deadline, and the ordinary Deployments
/// admitted alongside it are all stamped too (a webhook busy past the API server's timeout fails
/// open, which here would be a Deployment without a stamp). Ten more dry-runs with fresh prefixes
/// cost the stamp's digest cache a fingerprint each, not their lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_env_from_prefixes_over_a_wide_config_map_cost_one_read() -> anyhow::Result<()> {
    let client = cluster().client().await;
    let ns = fresh_namespace_with_labels(&client, "tn-prefixes", &[OPT_IN]).await?;
    create_secret(&client, &ns, "hash-key", &[("key", &random_key()?)]).await?;
    let webhook = release_webhook(&["--hash-key-secret", &format!("{ns}/hash-key")]).await?;
    let keys: Vec<(String, String)> = (0..20_000)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect();
    let keys: Vec<(&str, &str)> = keys.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    create_config_map(&client, &ns, "wide", &keys).await?;
    create_config_map(&client, &ns, "small", &[("greeting", "hello")]).await?;
    let registered = webhook.register(&client, &ns).await?;

    let ordinary = |name: &str| {
        deployment_manifest(
            &ns,
            name,
            json!({}),
            json!({"envFrom": [{"configMapRef": {"name": "small"}}]}),
        )
    };
    // The API server picks a new registration up asynchronously, the webhook its hash key too.
    wait_for(
        "the webhook to stamp an ordinary Deployment",
        DEFAULT_TIMEOUT,
        || async { dry_run_stamp(&ordinary("probe")).await },
    )
    .await?;

    let env_from: Vec<Value> = (0..20_000)
        .map(|i| json!({"prefix": format!("p{i}_"), "configMapRef": {"name": "wide"}}))
        .collect();
    let hostile = deployment_manifest(&ns, "hostile", json!({}), json!({"envFrom": env_from}));
    let others = async {
        let mut unstamped = Vec::new();
        for i in 0..6 {
            let name = format!("ordinary-{i}");
            if dry_run_stamp(&ordinary(&name)).await?.is_none() {
                unstamped.push(name);
            }
        }
        anyhow::Ok(unstamped)
    };
    let (hostile_stamp, unstamped) = tokio::join!(dry_run_stamp(&hostile), others);
    assert!(
        hostile_stamp?.is_some(),
        "the Deployment with 20,000 prefixes was not stamped"
    );
    let unstamped = unstamped?;
    assert!(
        unstamped.is_empty(),
        "ordinary Deployments admitted meanwhile were not stamped: {unstamped:?}"
    );

    // An entry of the stamp's digest cache keeps a fingerprint of what the pod reads, never
    // the caller's lists: ten dry-runs with 2,000 fresh prefixes each (about 20 KB of text apiece;
    // 240 such dry-runs held 490 MiB before) add at most an entry each, of a few hundred bytes.
    let digests = "helmop_webhook_cache_objects{cache=\"digests\"}";
    let before = webhook.metric(digests).await?;
    for round in 0..10 {
        let env_from: Vec<Value> = (0..2_000)
            .map(|i| json!({"prefix": format!("r{round}p{i}_"), "configMapRef": {"name": "wide"}}))
            .collect();
        let fresh = deployment_manifest(
            &ns,
            &format!("fresh-{round}"),
            json!({}),
            json!({"envFrom": env_from}),
        );
        assert!(
            dry_run_stamp(&fresh).await?.is_some(),
            "round {round} was not stamped"
        );
    }
    let entries = webhook.metric(digests).await?;
    let bytes = webhook
        .metric("helmop_webhook_cache_bytes{cache=\"digests\"}")
        .await?;
    assert!(
        entries <= before + 10.0,
        "{entries} entries after {before} + 10 dry-runs"
    );
    assert!(
        bytes <= entries * 1024.0,
        "the digest cache holds {bytes} bytes in {entries} entries: more than a fingerprint each"
    );
    registered.remove().await?;
    Ok(())
}
