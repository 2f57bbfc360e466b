//! The admission webhook end to end: the real serving stack and decision logic run in-process on
//! 127.0.0.1 with a throwaway certificate, registered by `url` on the upstream kube-apiserver (limited
//! to the test's namespace), and driven by real `kubectl`.

use std::process::Output;

use anyhow::{Context, bail};
use helmop_tests::deployment_manifest as deployment;
use helmop_tests::*;
use helmop_webhook::state::{Config, GuardMode};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const CONFIG_HASH: &str = "helmop.dev/config-hash";
const CONFIG_REFS: &str = "helmop.dev/config-refs";

/// The webhook on loopback (see [`LocalWebhook`]; `register` adds the manifests' registrations).
struct Webhook(LocalWebhook);

impl std::ops::Deref for Webhook {
    type Target = LocalWebhook;
    fn deref(&self) -> &LocalWebhook {
        &self.0
    }
}

impl Webhook {
    async fn start(client: Client, config: Config) -> anyhow::Result<Webhook> {
        Ok(Webhook(LocalWebhook::start(client, config).await?))
    }

    /// `helmop_webhook_cache_objects{cache="..."}` as exported on /metrics.
    fn cache_objects(&self, cache: &str) -> anyhow::Result<i64> {
        let text = self.metrics.encode()?;
        let series = format!("helmop_webhook_cache_objects{{cache=\"{cache}\"}}");
        Ok(metric_value(&text, &series)? as i64)
    }
}

fn config() -> Config {
    Config::default()
}

/// Runs kubectl against the upstream cluster without blocking the runtime the webhook serves on.
async fn kubectl(args: &[&str], stdin: Option<&str>) -> anyhow::Result<Output> {
    control_plane().upstream().run_kubectl(args, stdin).await
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `kubectl apply -f -` of one object given as JSON.
async fn apply(object: &Value, extra: &[&str]) -> anyhow::Result<Output> {
    kubectl_apply(control_plane().upstream(), object, extra).await
}

async fn apply_ok(object: &Value, extra: &[&str]) -> anyhow::Result<Output> {
    let out = apply(object, extra).await?;
    if !out.status.success() {
        bail!("kubectl apply failed: {}", text(&out.stderr));
    }
    Ok(out)
}

fn helmop(namespace: &str, name: &str, extra_spec: Value) -> Value {
    let mut spec =
        json!({"helm": {"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3"}});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra_spec.as_object()) {
        spec.extend(extra.clone());
    }
    json!({
        "apiVersion": "fleet.cattle.io/v1alpha1",
        "kind": "HelmOp",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    })
}

async fn set_secret_key(
    client: &Client,
    namespace: &str,
    name: &str,
    key: &[u8],
) -> anyhow::Result<()> {
    let patch = Secret {
        data: Some([("key".to_string(), ByteString(key.to_vec()))].into()),
        ..Default::default()
    };
    Api::<Secret>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn set_config_map_key(
    client: &Client,
    namespace: &str,
    name: &str,
    key: &str,
    value: &str,
) -> anyhow::Result<()> {
    let patch = json!({"data": {key: value}});
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn restamp(namespace: &str, deployment: &str, value: &str) -> anyhow::Result<Output> {
    let target = format!("deployment/{deployment}");
    helmop_tests::restamp(control_plane().upstream(), namespace, &target, value).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helmops_are_validated_with_every_problem_listed() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "wh-helmops").await?;
    let webhook = Webhook::start(client.clone(), config()).await?;
    let registered = webhook.register(&client, &ns).await?;
    let helmops = fleet_api(&client, &ns, &helmop_resource());

    // Every problem in one denial, each with its JSON path; nothing stored.
    let bad = helmop(
        &ns,
        "bad",
        json!({"downstreamResources": [
            {"kind": "Deployment", "name": "x"},
            {"kind": "Secret", "name": "Bad_Name"},
            {"kind": "Secret", "name": "db"},
        ]}),
    );
    let out = apply(&bad, &["--validate=false"]).await?;
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "invalid HelmOp admitted: {stderr}");
    assert!(
        stderr.contains(&format!("HelmOp {ns}/bad has 3 problems:")),
        "{stderr}"
    );
    for path in [
        "spec.downstreamResources[0].kind",
        "spec.downstreamResources[1].name",
        "spec.downstreamResources[2]: Secret \"db\" does not exist",
    ] {
        assert!(stderr.contains(path), "{path} missing from: {stderr}");
    }
    assert!(helmops.get_opt("bad").await?.is_none());

    // A valid HelmOp whose ConfigMap exists.
    create_config_map(&client, &ns, "settings", &[("a", "b")]).await?;
    let good = helmop(
        &ns,
        "good",
        json!({"downstreamResources": [{"kind": "ConfigMap", "name": "settings"}]}),
    );
    apply_ok(&good, &["--validate=false"]).await?;

    // A missing Secret (per target) is denied; once it exists (a moment ago: not necessarily in the
    // watch cache yet) the same HelmOp is admitted.
    let needs_db = helmop(
        &ns,
        "needs-db",
        json!({"targets": [{"clusterName": "c1", "downstreamResources": [{"kind": "Secret", "name": "db"}]}]}),
    );
    let out = apply(&needs_db, &["--validate=false"]).await?;
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "spec.targets[0].downstreamResources[0]: Secret \"db\" does not exist in namespace \"{ns}\""
        )),
        "{stderr}"
    );
    create_secret(&client, &ns, "db", &[("password", b"hunter2")]).await?;
    apply_ok(&needs_db, &["--validate=false"]).await?;

    // allow-missing: admitted with a warning.
    let mut later = helmop(
        &ns,
        "later",
        json!({"downstreamResources": [{"kind": "Secret", "name": "from-vault"}]}),
    );
    later["metadata"]["annotations"] = json!({"helmop.dev/allow-missing": "true"});
    let out = apply_ok(&later, &["--validate=false"]).await?;
    let stderr = text(&out.stderr);
    assert!(
        stderr
            .contains("Warning: spec.downstreamResources[0]: Secret \"from-vault\" does not exist"),
        "{stderr}"
    );

    // Taking allow-missing away is a metadata-only update: not denied, the problem is a warning.
    let out = kubectl(
        &[
            "annotate",
            "-n",
            &ns,
            "helmops.fleet.cattle.io/later",
            "helmop.dev/allow-missing-",
        ],
        None,
    )
    .await?;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("not enforced: this update leaves spec unchanged"),
        "{stderr}"
    );
    // A spec change is enforced again.
    let mut changed = later.clone();
    changed["metadata"]["annotations"] = json!({});
    changed["spec"]["helm"]["version"] = json!("1.2.4");
    let out = apply(&changed, &["--validate=false"]).await?;
    assert!(!out.status.success(), "{}", text(&out.stderr));

    // DELETE is never denied, even of a HelmOp that would not pass validation now.
    let out = kubectl(
        &["delete", "-n", &ns, "helmops.fleet.cattle.io/later"],
        None,
    )
    .await?;
    assert!(out.status.success(), "{}", text(&out.stderr));

    registered.remove().await?;
    Ok(())
}

/// `kubectl delete --dry-run=server`: goes through admission without deleting anything, so a test can
/// wait for the webhook's HelmOp cache to catch up.
async fn dry_run_delete(namespace: &str, what: &str) -> anyhow::Result<Output> {
    kubectl(&["delete", "-n", namespace, what, "--dry-run=server"], None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn referenced_secrets_cannot_be_deleted() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "wh-guard").await?;
    let webhook = Webhook::start(client.clone(), config()).await?;
    let registered = webhook.register(&client, &ns).await?;

    create_secret(&client, &ns, "db", &[("password", b"hunter2")]).await?;
    create_secret(&client, &ns, "unused", &[("k", b"v")]).await?;
    let zeta = helmop(
        &ns,
        "zeta",
        json!({"downstreamResources": [{"kind": "Secret", "name": "db"}]}),
    );
    let alpha = helmop(
        &ns,
        "alpha",
        json!({"targets": [{"clusterName": "c1", "downstreamResources": [{"kind": "Secret", "name": "db"}]}]}),
    );
    apply_ok(&zeta, &["--validate=false"]).await?;
    apply_ok(&alpha, &["--validate=false"]).await?;

    let denial = wait_for("the guard to see both HelmOps", DEFAULT_TIMEOUT, || async {
        let out = dry_run_delete(&ns, "secret/db").await?;
        let stderr = text(&out.stderr);
        Ok((!out.status.success() && stderr.contains("HelmOps alpha and zeta")).then_some(stderr))
    })
    .await?;
    assert!(
        denial.contains(&format!(
            "Secret \"db\" in namespace \"{ns}\" is a downstream resource of HelmOps alpha and zeta"
        )),
        "{denial}"
    );
    let out = kubectl(&["delete", "-n", &ns, "secret/db"], None).await?;
    assert!(!out.status.success(), "referenced Secret deleted");
    assert!(
        Api::<Secret>::namespaced(client.clone(), &ns)
            .get_opt("db")
            .await?
            .is_some()
    );

    // An unreferenced Secret goes.
    let out = kubectl(&["delete", "-n", &ns, "secret/unused"], None).await?;
    assert!(out.status.success(), "{}", text(&out.stderr));

    // Once no HelmOp lists it any more, it can be deleted.
    apply_ok(
        &helmop(&ns, "zeta", json!({"downstreamResources": []})),
        &["--validate=false"],
    )
    .await?;
    apply_ok(
        &helmop(&ns, "alpha", json!({"targets": [{"clusterName": "c1"}]})),
        &["--validate=false"],
    )
    .await?;
    wait_until(
        "the guard to see the edited HelmOps",
        DEFAULT_TIMEOUT,
        || async { Ok(dry_run_delete(&ns, "secret/db").await?.status.success()) },
    )
    .await?;
    let out = kubectl(&["delete", "-n", &ns, "secret/db"], None).await?;
    assert!(out.status.success(), "{}", text(&out.stderr));

    registered.remove().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warn_mode_allows_the_delete_with_a_warning() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "wh-guard-warn").await?;
    let webhook = Webhook::start(
        client.clone(),
        Config {
            guard: GuardMode::Warn,
            ..config()
        },
    )
    .await?;
    let registered = webhook.register(&client, &ns).await?;
    create_config_map(&client, &ns, "settings", &[("a", "b")]).await?;
    apply_ok(
        &helmop(
            &ns,
            "app",
            json!({"downstreamResources": [{"kind": "ConfigMap", "name": "settings"}]}),
        ),
        &["--validate=false"],
    )
    .await?;
    let warning = wait_for("the guard to warn", DEFAULT_TIMEOUT, || async {
        let out = dry_run_delete(&ns, "configmap/settings").await?;
        let stderr = text(&out.stderr);
        Ok((out.status.success() && stderr.contains("Warning:")).then_some(stderr))
    })
    .await?;
    assert!(
        warning.contains(&format!(
            "ConfigMap \"settings\" in namespace \"{ns}\" is still a downstream resource of HelmOp app"
        )),
        "{warning}"
    );
    let out = kubectl(&["delete", "-n", &ns, "configmap/settings"], None).await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("HelmOp app"));
    registered.remove().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opted_in_deployments_are_stamped_and_roll_when_what_they_read_changes()
-> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    ensure_hash_key(&client).await?;
    let ns = fresh_namespace_with_labels(
        &client,
        "wh-stamp",
        &[("helmop.dev/rollout-on-change", "enabled")],
    )
    .await?;
    let webhook = Webhook::start(client.clone(), config()).await?;
    let registered = webhook.register(&client, &ns).await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);

    create_config_map(
        &client,
        &ns,
        "app",
        &[("greeting", "hello"), ("unread", "x")],
    )
    .await?;
    let web = deployment(
        &ns,
        "web",
        json!({}),
        json!({"env": [{"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "greeting"}}}]}),
    );
    apply_ok(&web, &[]).await?;
    let stored = deployments.get("web").await?;
    let first = template_annotation(&stored, CONFIG_HASH).context("no config-hash stamped")?;
    assert!(first.starts_with("v2:") && first.len() == 3 + 64, "{first}");
    assert_eq!(
        template_annotation(&stored, CONFIG_REFS).as_deref(),
        Some("configmap/app[greeting]")
    );
    wait_until("the first ReplicaSet", DEFAULT_TIMEOUT, || async {
        Ok(replica_sets(&client, &ns, "web").await? == 1)
    })
    .await?;
    let generation = stored.metadata.generation;

    // Re-applying the same manifest changes nothing, and sending the stored object back through
    // admission unchanged (a plain PUT) yields an empty patch: the spec, so the generation, stays.
    // (Not `kubectl replace`: it rewrites the last-applied annotation, and any Deployment annotation
    // change bumps the generation.)
    let out = apply_ok(&web, &[]).await?;
    assert!(
        text(&out.stdout).contains("unchanged"),
        "{}",
        text(&out.stdout)
    );
    // The deployment controller writes status meanwhile: a 409 on the resourceVersion means
    // read again, not that admission changed anything.
    let mut attempts = 0;
    let replaced = loop {
        let stored = deployments.get("web").await?;
        match deployments
            .replace("web", &PostParams::default(), &stored)
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 409 && attempts < 5 => attempts += 1,
            other => break other?,
        }
    };
    assert_eq!(
        replaced.metadata.generation, generation,
        "admitting the output again changed the spec"
    );
    assert_eq!(
        template_annotation(&replaced, CONFIG_HASH).as_deref(),
        Some(first.as_str())
    );

    // A key the pods do not read, and a label: the stamp stays, nothing rolls.
    set_config_map_key(&client, &ns, "app", "unread", "y").await?;
    let out = kubectl(&["label", "-n", &ns, "configmap/app", "team=blue"], None).await?;
    assert!(out.status.success(), "{}", text(&out.stderr));
    restamp(&ns, "web", "1").await?;
    let stored = deployments.get("web").await?;
    assert_eq!(
        template_annotation(&stored, CONFIG_HASH).as_deref(),
        Some(first.as_str())
    );
    assert_eq!(replica_sets(&client, &ns, "web").await?, 1);

    // The key the pods read: a new stamp on restamp, and kube-controller-manager rolls out a new ReplicaSet.
    set_config_map_key(&client, &ns, "app", "greeting", "bonjour").await?;
    restamp(&ns, "web", "2").await?;
    let stored = deployments.get("web").await?;
    let second = template_annotation(&stored, CONFIG_HASH).context("stamp lost")?;
    assert_ne!(second, first, "changed content, same stamp");
    wait_until("a second ReplicaSet", DEFAULT_TIMEOUT, || async {
        Ok(replica_sets(&client, &ns, "web").await? == 2)
    })
    .await?;
    // Restamping again without a change keeps the stamp (the digest now comes from the cache).
    restamp(&ns, "web", "3").await?;
    let stored = deployments.get("web").await?;
    assert_eq!(
        template_annotation(&stored, CONFIG_HASH),
        Some(second.clone())
    );
    assert!(webhook.state.cached_digests() >= 1);
    // Cache sizes are exported (a HelmOp of this test, so the count does not depend on others).
    apply_helmop(
        &client,
        &ns,
        "apiVersion: fleet.cattle.io/v1alpha1\nkind: HelmOp\nmetadata:\n  name: counted\nspec:\n  helm:\n    repo: https://charts.example.com\n    chart: app\n    version: 1.0.0\n",
    )
    .await?;
    wait_until("the HelmOp cache to count it", DEFAULT_TIMEOUT, || async {
        Ok(webhook.cache_objects("helmops")? >= 1)
    })
    .await?;
    for cache in ["helmops", "secrets", "configmaps", "namespaces", "digests"] {
        assert!(
            webhook.cache_objects(cache)? >= 1,
            "cache {cache} reported empty"
        );
    }

    // The workload label "false" opts out of a namespace-wide opt-in.
    let opted_out = deployment(
        &ns,
        "opted-out",
        json!({"helmop.dev/rollout-on-change": "false"}),
        json!({"envFrom": [{"configMapRef": {"name": "app"}}]}),
    );
    apply_ok(&opted_out, &[]).await?;
    assert_eq!(
        template_annotation(&deployments.get("opted-out").await?, CONFIG_HASH),
        None
    );

    // A required reference that does not exist: admitted, stamped as absent, with a warning; creating
    // it changes the stamp.
    let needs = deployment(
        &ns,
        "needs-secret",
        json!({}),
        json!({"env": [{"name": "P", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}}]}),
    );
    let out = apply_ok(&needs, &[]).await?;
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "Warning: Secret \"creds\" does not exist in namespace \"{ns}\""
        )),
        "{stderr}"
    );
    let stored = deployments.get("needs-secret").await?;
    assert_eq!(
        template_annotation(&stored, CONFIG_REFS).as_deref(),
        Some("secret/creds[password]!")
    );
    let absent =
        template_annotation(&stored, CONFIG_HASH).context("absent reference not stamped")?;
    create_secret(&client, &ns, "creds", &[("password", b"hunter2")]).await?;
    restamp(&ns, "needs-secret", "1").await?;
    let stored = deployments.get("needs-secret").await?;
    assert_eq!(
        template_annotation(&stored, CONFIG_REFS).as_deref(),
        Some("secret/creds[password]")
    );
    assert_ne!(template_annotation(&stored, CONFIG_HASH), Some(absent));

    registered.remove().await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workload_label_opts_in_and_a_hash_key_created_later_is_picked_up() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    // No namespace-wide opt-in here, and a hash key Secret of the test's own that does not exist yet.
    let ns = fresh_namespace(&client, "wh-key").await?;
    let webhook = Webhook::start(
        client.clone(),
        Config {
            hash_key_secret: hash_key_in(&ns),
            ..config()
        },
    )
    .await?;
    let registered = webhook.register(&client, &ns).await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    create_config_map(&client, &ns, "app", &[("greeting", "hello")]).await?;
    let reads_app = json!({"envFrom": [{"configMapRef": {"name": "app"}}]});

    // Not opted in: untouched, no warning.
    let out = apply_ok(&deployment(&ns, "plain", json!({}), reads_app.clone()), &[]).await?;
    assert!(
        !text(&out.stderr).contains("Warning"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        template_annotation(&deployments.get("plain").await?, CONFIG_HASH),
        None
    );

    // Opted in by its own label, but there is no key: admitted unchanged, with a warning.
    let labelled = deployment(
        &ns,
        "labelled",
        json!({"helmop.dev/rollout-on-change": "true"}),
        reads_app,
    );
    let out = apply_ok(&labelled, &[]).await?;
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("hash key Secret {ns}/hash-key does not exist")),
        "{stderr}"
    );
    assert_eq!(
        template_annotation(&deployments.get("labelled").await?, CONFIG_HASH),
        None
    );

    // The key is created: the watch picks it up without a restart.
    create_secret(&client, &ns, "hash-key", &[("key", &random_key()?)]).await?;
    let mut attempt = 0;
    let first = wait_for("a stamp with the new key", DEFAULT_TIMEOUT, || {
        attempt += 1;
        let (ns, deployments) = (ns.clone(), deployments.clone());
        async move {
            restamp(&ns, "labelled", &format!("key-{attempt}")).await?;
            Ok(template_annotation(
                &deployments.get("labelled").await?,
                CONFIG_HASH,
            ))
        }
    })
    .await?;
    assert_eq!(
        template_annotation(&deployments.get("labelled").await?, CONFIG_REFS).as_deref(),
        Some("configmap/app")
    );

    // Rotating the key changes the stamp of unchanged content: no digest made with the old key survives.
    set_secret_key(&client, &ns, "hash-key", &random_key()?).await?;
    let mut attempt = 0;
    wait_for("a stamp with the rotated key", DEFAULT_TIMEOUT, || {
        attempt += 1;
        let (ns, deployments, first) = (ns.clone(), deployments.clone(), first.clone());
        async move {
            restamp(&ns, "labelled", &format!("rotated-{attempt}")).await?;
            let now = template_annotation(&deployments.get("labelled").await?, CONFIG_HASH);
            Ok(now.filter(|h| *h != first).map(|_| ()))
        }
    })
    .await?;

    registered.remove().await?;
    Ok(())
}
