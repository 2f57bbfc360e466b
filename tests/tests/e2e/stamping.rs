//! Stamping rules (docs/stamping.md) end to end: the webhook runs in-process on loopback,
//! registered on the upstream kube-apiserver for the test's namespace only, and workloads are written
//! with real `kubectl`; rollouts are counted from the ReplicaSets the real kube-controller-manager makes.

use std::collections::BTreeMap;
use std::process::Output;

use anyhow::{Context, bail};
use helmop_tests::*;
use helmop_webhook::state::{Config, HashKeyState};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::{Value, json};

pub(crate) const CONFIG_HASH: &str = "helmop.dev/config-hash";
const CONFIG_REFS: &str = "helmop.dev/config-refs";
pub(crate) const OPT_IN: (&str, &str) = ("helmop.dev/rollout-on-change", "enabled");

pub(crate) fn cluster() -> &'static ClusterInfo {
    control_plane().upstream()
}

pub(crate) fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

pub(crate) async fn kubectl(args: &[&str], stdin: Option<&str>) -> anyhow::Result<Output> {
    cluster().run_kubectl(args, stdin).await
}

async fn kubectl_ok(args: &[&str], stdin: Option<&str>) -> anyhow::Result<Output> {
    let out = kubectl(args, stdin).await?;
    if !out.status.success() {
        bail!("kubectl {args:?} failed: {}", text(&out.stderr));
    }
    Ok(out)
}

pub(crate) async fn apply_ok(object: &Value) -> anyhow::Result<Output> {
    let out = kubectl_apply(cluster(), object, &[]).await?;
    if !out.status.success() {
        bail!("kubectl apply failed: {}", text(&out.stderr));
    }
    Ok(out)
}

/// A namespace opted in as a whole, and the webhook registered for it.
pub(crate) async fn setup(
    client: &Client,
    prefix: &str,
    config: impl FnOnce(&str) -> Config,
) -> anyhow::Result<(String, LocalWebhook)> {
    let ns = fresh_namespace_with_labels(client, prefix, &[OPT_IN]).await?;
    let webhook = LocalWebhook::start(client.clone(), config(&ns)).await?;
    Ok((ns, webhook))
}

pub(crate) fn annotation(template_metadata: Option<&Value>, key: &str) -> Option<String> {
    template_metadata?
        .get("annotations")?
        .get(key)?
        .as_str()
        .map(str::to_owned)
}

async fn deployment_stamp(
    deployments: &Api<Deployment>,
    name: &str,
) -> anyhow::Result<Option<String>> {
    Ok(template_annotation(
        &deployments.get(name).await?,
        CONFIG_HASH,
    ))
}

/// Waits until kube-controller-manager has acted on the Deployment's latest spec, so the ReplicaSets
/// it wants exist.
async fn settled(deployments: &Api<Deployment>, name: &str) -> anyhow::Result<()> {
    wait_until(
        &format!("Deployment {name} to be observed"),
        DEFAULT_TIMEOUT,
        || async {
            let d = deployments.get(name).await?;
            let observed = d.status.as_ref().and_then(|s| s.observed_generation);
            Ok(observed.is_some() && observed == d.metadata.generation)
        },
    )
    .await
}

pub(crate) async fn wait_for_key(webhook: &LocalWebhook, loaded: bool) -> anyhow::Result<()> {
    wait_until("the webhook to see the hash key", DEFAULT_TIMEOUT, || {
        let state = webhook.state.hash_key();
        async move { Ok(matches!(state, HashKeyState::Loaded { .. }) == loaded) }
    })
    .await
}

/// With the hash key unreadable, a `kubectl replace` keeps the stored stamp, so neither the
/// outage nor the key's return rolls the Deployment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stamp_that_cannot_be_computed_is_kept_and_nothing_rolls() -> anyhow::Result<()> {
    let client = cluster().client().await;
    let key = random_key()?;
    let (ns, webhook) = setup(&client, "st-keep", |ns| Config {
        hash_key_secret: hash_key_in(ns),
        ..Config::default()
    })
    .await?;
    create_secret(&client, &ns, "hash-key", &[("key", &key)]).await?;
    wait_for_key(&webhook, true).await?;
    let registered = webhook.register(&client, &ns).await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    create_config_map(&client, &ns, "app", &[("GREETING", "hello")]).await?;
    let web = deployment_manifest(
        &ns,
        "web",
        json!({}),
        json!({"envFrom": [{"configMapRef": {"name": "app"}}]}),
    );
    apply_ok(&web).await?;
    let first = deployment_stamp(&deployments, "web")
        .await?
        .context("not stamped")?;
    settled(&deployments, "web").await?;
    assert_eq!(replica_sets(&client, &ns, "web").await?, 1);

    // The key becomes unreadable (deleted, as during a botched rotation).
    Api::<Secret>::namespaced(client.clone(), &ns)
        .delete("hash-key", &DeleteParams::default())
        .await?;
    wait_for_key(&webhook, false).await?;
    // A replace of the manifest, which carries no stamp: admitted with the stored one and a warning.
    let out = kubectl_ok(&["replace", "-f", "-"], Some(&web.to_string())).await?;
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("keeps its previous config stamp"),
        "{stderr}"
    );
    assert_eq!(
        deployment_stamp(&deployments, "web").await?.as_deref(),
        Some(first.as_str())
    );
    settled(&deployments, "web").await?;
    assert_eq!(
        replica_sets(&client, &ns, "web").await?,
        1,
        "the outage rolled the Deployment"
    );

    // The key is back: a restamp computes the same stamp, nothing rolls.
    create_secret(&client, &ns, "hash-key", &[("key", &key)]).await?;
    wait_for_key(&webhook, true).await?;
    restamp(cluster(), &ns, "deployment/web", "after-outage").await?;
    assert_eq!(
        deployment_stamp(&deployments, "web").await?.as_deref(),
        Some(first.as_str())
    );
    settled(&deployments, "web").await?;
    assert_eq!(replica_sets(&client, &ns, "web").await?, 1);

    registered.remove().await?;
    Ok(())
}

async fn set_config_map(
    client: &Client,
    namespace: &str,
    name: &str,
    patch: Value,
) -> anyhow::Result<()> {
    Api::<ConfigMap>::namespaced(client.clone(), namespace)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// `envFrom` reads only `data`, and only keys that make variable names; a key ref does not
/// read `binaryData`, and a pod that cannot start is warned about.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stamps_cover_exactly_what_the_kubelet_reads() -> anyhow::Result<()> {
    let client = cluster().client().await;
    ensure_hash_key(&client).await?;
    let (ns, webhook) = setup(&client, "st-kubelet", |_| Config::default()).await?;
    let registered = webhook.register(&client, &ns).await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), &ns);
    let app = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("app".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            ("GREETING".to_string(), "hello".to_string()),
            ("1st-line".to_string(), "not a variable name".to_string()),
        ])),
        binary_data: Some(BTreeMap::from([(
            "logo.png".to_string(),
            ByteString(vec![0x89, b'P', b'N', b'G']),
        )])),
        ..Default::default()
    };
    config_maps.create(&PostParams::default(), &app).await?;

    apply_ok(&deployment_manifest(
        &ns,
        "env",
        json!({}),
        json!({"envFrom": [{"configMapRef": {"name": "app"}}]}),
    ))
    .await?;
    let first = deployment_stamp(&deployments, "env")
        .await?
        .context("not stamped")?;

    // binaryData, and a key that is no valid variable name: invisible to envFrom, the stamp stays.
    set_config_map(
        &client,
        &ns,
        "app",
        json!({"binaryData": {"logo.png": "AAAA"}}),
    )
    .await?;
    restamp(cluster(), &ns, "deployment/env", "binary").await?;
    assert_eq!(
        deployment_stamp(&deployments, "env").await?.as_deref(),
        Some(first.as_str()),
        "a binaryData change restamped an envFrom workload"
    );
    // A key that is no valid variable name by 1.20's rule: the newest kubelets (1.30+) import it
    // anyway, and a missed rollout is worse than an extra one, so it counts, with or without a
    // prefix (docs/stamping.md, "envFrom: the newest kubelet's rule").
    set_config_map(
        &client,
        &ns,
        "app",
        json!({"data": {"1st-line": "changed"}}),
    )
    .await?;
    restamp(cluster(), &ns, "deployment/env", "digit-first").await?;
    let digit_first = deployment_stamp(&deployments, "env")
        .await?
        .context("not stamped")?;
    assert_ne!(
        digit_first, first,
        "a key 1.30+ kubelets import did not restamp the workload"
    );
    let first = digit_first;
    apply_ok(&deployment_manifest(
        &ns,
        "prefixed",
        json!({}),
        json!({"envFrom": [{"configMapRef": {"name": "app"}, "prefix": "APP_"}]}),
    ))
    .await?;
    let prefixed = deployment_stamp(&deployments, "prefixed")
        .await?
        .context("not stamped")?;
    set_config_map(&client, &ns, "app", json!({"data": {"1st-line": "again"}})).await?;
    restamp(cluster(), &ns, "deployment/prefixed", "1").await?;
    assert_ne!(
        deployment_stamp(&deployments, "prefixed").await?,
        Some(prefixed)
    );
    // What envFrom does read still restamps.
    set_config_map(
        &client,
        &ns,
        "app",
        json!({"data": {"GREETING": "bonjour"}}),
    )
    .await?;
    restamp(cluster(), &ns, "deployment/env", "greeting").await?;
    assert_ne!(
        deployment_stamp(&deployments, "env").await?.as_deref(),
        Some(first.as_str())
    );

    // A key ref to a key that exists only in binaryData: the pod cannot start; warned, stamped as absent.
    let out = apply_ok(&deployment_manifest(
        &ns,
        "keyref",
        json!({}),
        json!({"env": [{"name": "LOGO", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "logo.png"}}}]}),
    ))
    .await?;
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "ConfigMap \"app\" in namespace \"{ns}\" has no key \"logo.png\" (only in binaryData"
        )) && stderr.contains("pods that need it will not start"),
        "{stderr}"
    );
    let absent = deployment_stamp(&deployments, "keyref")
        .await?
        .context("not stamped")?;
    set_config_map(
        &client,
        &ns,
        "app",
        json!({"binaryData": {"logo.png": "BBBB"}}),
    )
    .await?;
    restamp(cluster(), &ns, "deployment/keyref", "1").await?;
    assert_eq!(
        deployment_stamp(&deployments, "keyref").await?,
        Some(absent.clone()),
        "binaryData a key ref cannot read changed the stamp"
    );
    // Once the key is in data the pod can start: the stamp changes.
    set_config_map(
        &client,
        &ns,
        "app",
        json!({"binaryData": {"logo.png": null}, "data": {"logo.png": "svg"}}),
    )
    .await?;
    let out = restamp(cluster(), &ns, "deployment/keyref", "2").await?;
    assert!(
        !text(&out.stderr).contains("will not start"),
        "{}",
        text(&out.stderr)
    );
    assert_ne!(
        deployment_stamp(&deployments, "keyref").await?,
        Some(absent)
    );

    registered.remove().await?;
    Ok(())
}

/// A StatefulSet owned by an operator's object (a controller ownerReference) is stamped; only
/// what inherits a stamped template is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_managed_workloads_are_stamped() -> anyhow::Result<()> {
    let client = cluster().client().await;
    ensure_hash_key(&client).await?;
    let (ns, webhook) = setup(&client, "st-owned", |_| Config::default()).await?;
    let registered = webhook.register(&client, &ns).await?;
    create_config_map(&client, &ns, "app", &[("GREETING", "hello")]).await?;
    // The operator's custom resource, played by a ConfigMap (the garbage collector needs a real owner).
    let owner = create_config_map(&client, &ns, "my-database", &[]).await?;
    let uid = owner.metadata.uid.context("owner without uid")?;
    let sts = json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": "db", "namespace": ns, "ownerReferences": [{
            "apiVersion": "v1", "kind": "ConfigMap", "name": "my-database", "uid": uid,
            "controller": true, "blockOwnerDeletion": true}]},
        "spec": {
            "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {
                "metadata": {"labels": {"app": "db"}},
                "spec": {"containers": [{"name": "db", "image": "registry.example.com/db:1",
                    "envFrom": [{"configMapRef": {"name": "app"}}]}]},
            },
        },
    });
    apply_ok(&sts).await?;
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), &ns);
    let stored = statefulsets.get("db").await?;
    let template = serde_json::to_value(&stored.spec)?;
    let first = annotation(template.pointer("/template/metadata"), CONFIG_HASH)
        .context("an operator's StatefulSet was not stamped")?;
    assert_eq!(
        annotation(template.pointer("/template/metadata"), CONFIG_REFS).as_deref(),
        Some("configmap/app")
    );
    // And it rolls when what it reads changes.
    set_config_map(&client, &ns, "app", json!({"data": {"GREETING": "hi"}})).await?;
    restamp(cluster(), &ns, "statefulset/db", "1").await?;
    let template = serde_json::to_value(statefulsets.get("db").await?.spec)?;
    assert_ne!(
        annotation(template.pointer("/template/metadata"), CONFIG_HASH),
        Some(first)
    );

    registered.remove().await?;
    Ok(())
}

/// 1,150 key references with long keys, and a template whose other annotations are large: the
/// workload is admitted (config-refs summarised within the limit), and the hash still covers every key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stamps_never_push_annotations_over_the_limit() -> anyhow::Result<()> {
    let client = cluster().client().await;
    ensure_hash_key(&client).await?;
    let (ns, webhook) = setup(&client, "st-size", |_| Config::default()).await?;
    let registered = webhook.register(&client, &ns).await?;
    let keys: Vec<String> = (0..1150)
        .map(|i| format!("{i:04}-{}", "k".repeat(240)))
        .collect();
    let data: Vec<(&str, &str)> = keys.iter().map(|k| (k.as_str(), "v")).collect();
    create_config_map(&client, &ns, "big", &data).await?;
    let env: Vec<Value> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| json!({"name": format!("V{i}"), "valueFrom": {"configMapKeyRef": {"name": "big", "key": k}}}))
        .collect();
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    // Created through the API: `kubectl apply` would keep a copy of the manifest in an annotation of
    // the Deployment itself, which is too big on its own.
    let create = |name: &str, filler: usize| -> anyhow::Result<Deployment> {
        let mut d = deployment_manifest(&ns, name, json!({}), json!({"env": env}));
        if filler > 0 {
            d["spec"]["template"]["metadata"]["annotations"] =
                json!({"example.com/notes": "n".repeat(filler)});
        }
        Ok(serde_json::from_value(d)?)
    };
    for (name, filler) in [("wide", 0), ("crowded", 250 * 1024)] {
        let stored = deployments
            .create(&PostParams::default(), &create(name, filler)?)
            .await
            .with_context(|| format!("Deployment {name} with 1,150 key refs refused"))?;
        let annotations = stored
            .spec
            .template
            .metadata
            .and_then(|m| m.annotations)
            .unwrap_or_default();
        let total: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert!(total <= 256 * 1024, "{name}: {total} bytes of annotations");
        let refs = annotations
            .get(CONFIG_REFS)
            .with_context(|| format!("{name}: no config-refs"))?;
        assert!(refs.len() <= 16 * 1024, "{name}: {} bytes", refs.len());
        assert!(
            refs.starts_with("configmap/big[0000-") && refs.ends_with(']'),
            "{name}: {refs}"
        );
        assert!(refs.contains(",+"), "{name}: not summarised: {refs}");
        assert!(annotations.contains_key(CONFIG_HASH), "{name}: no hash");
    }
    // The last key is not shown, and still covered by the hash.
    let before = deployment_stamp(&deployments, "wide").await?;
    let last = keys.last().context("no keys")?;
    set_config_map(&client, &ns, "big", json!({"data": {last: "changed"}})).await?;
    restamp(cluster(), &ns, "deployment/wide", "1").await?;
    assert_ne!(deployment_stamp(&deployments, "wide").await?, before);

    registered.remove().await?;
    Ok(())
}

/// A client for the upstream cluster that acts as `user` (impersonated by the admin credentials).
async fn client_as(user: &str) -> anyhow::Result<Client> {
    let kubeconfig = Kubeconfig::read_from(&cluster().kubeconfig)?;
    let mut config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.auth_info.impersonate = Some(user.to_owned());
    Ok(Client::try_from(config)?)
}

/// Lookups that fail (the webhook may list and watch Secrets but not get one) never deny an
/// update that leaves the HelmOp's spec as it was, e.g. Fleet adding its finalizer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unchanged_helmop_specs_pass_when_lookups_fail() -> anyhow::Result<()> {
    let client = cluster().client().await;
    let ns = fresh_namespace(&client, "st-finalizer").await?;
    let user = format!("helmop-e2e-{ns}");
    let role: ClusterRole = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": user},
        "rules": [
            {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": ["list", "watch"]},
            {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list", "watch"]},
            {"apiGroups": ["fleet.cattle.io"], "resources": ["helmops"], "verbs": ["get", "list", "watch"]},
        ],
    }))?;
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": user},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
    }))?;
    let roles = Api::<ClusterRole>::all(client.clone());
    let bindings = Api::<ClusterRoleBinding>::all(client.clone());
    roles.create(&PostParams::default(), &role).await?;
    bindings.create(&PostParams::default(), &binding).await?;

    // A HelmOp naming a Secret that does not exist yet, stored before the webhook is there.
    let helmop = helmop_object(
        &ns,
        "app",
        json!({"repo": "https://charts.example.com", "chart": "app", "version": "1.2.3"}),
        json!([{"kind": "Secret", "name": "db"}]),
    );
    apply_ok(&helmop).await?;
    let webhook = LocalWebhook::start(client_as(&user).await?, Config::default()).await?;
    let registered = webhook.register(&client, &ns).await?;

    // The webhook is in the path and fails closed: a spec change cannot be checked, so it is denied.
    let patch_version = r#"{"spec": {"helm": {"version": "1.2.4"}}}"#;
    let target = "helmops.fleet.cattle.io/app";
    let out = kubectl(
        &[
            "patch",
            "-n",
            &ns,
            target,
            "--type",
            "merge",
            "-p",
            patch_version,
        ],
        None,
    )
    .await?;
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "spec change admitted: {stderr}");
    assert!(
        stderr.contains("cannot check that secret/db exists"),
        "{stderr}"
    );

    // Adding a finalizer leaves spec unchanged: admitted, with a warning saying what was not checked.
    let finalizer = r#"{"metadata": {"finalizers": ["fleet.cattle.io/helmop-finalizer"]}}"#;
    let out = kubectl(
        &[
            "patch", "-n", &ns, target, "--type", "merge", "-p", finalizer,
        ],
        None,
    )
    .await?;
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "finalizer update denied: {stderr}");
    assert!(
        stderr.contains("not enforced: this update leaves spec unchanged"),
        "{stderr}"
    );

    registered.remove().await?;
    let unfinalize = r#"{"metadata": {"finalizers": null}}"#;
    kubectl_ok(
        &[
            "patch", "-n", &ns, target, "--type", "merge", "-p", unfinalize,
        ],
        None,
    )
    .await?;
    bindings.delete(&user, &DeleteParams::default()).await?;
    roles.delete(&user, &DeleteParams::default()).await?;
    Ok(())
}

/// On Kubernetes 1.20 CronJobs exist as batch/v1beta1 only; they are stamped, and restamped when
/// what they read changes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_v1beta1_cronjobs_are_stamped() -> anyhow::Result<()> {
    let client = cluster().client().await;
    ensure_hash_key(&client).await?;
    let (ns, webhook) = setup(&client, "st-cron", |_| Config::default()).await?;
    let registered = webhook.register(&client, &ns).await?;
    create_config_map(&client, &ns, "app", &[("schedule", "nightly")]).await?;
    let cronjob = json!({
        "apiVersion": "batch/v1beta1",
        "kind": "CronJob",
        "metadata": {"name": "report", "namespace": ns},
        "spec": {
            "schedule": "0 3 * * *",
            "jobTemplate": {"spec": {"template": {"spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "report", "image": "registry.example.com/report:1",
                    "env": [{"name": "WHEN", "valueFrom": {"configMapKeyRef": {"name": "app", "key": "schedule"}}}]}],
            }}}},
        },
    });
    apply_ok(&cronjob).await?;
    let gvk = GroupVersionKind::gvk("batch", "v1beta1", "CronJob");
    let cronjobs =
        Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &ApiResource::from_gvk(&gvk));
    let stamp = |cj: &DynamicObject| {
        annotation(
            cj.data.pointer("/spec/jobTemplate/spec/template/metadata"),
            CONFIG_HASH,
        )
    };
    let stored = cronjobs.get("report").await?;
    let first = stamp(&stored).context("a batch/v1beta1 CronJob was not stamped")?;
    assert_eq!(
        annotation(
            stored
                .data
                .pointer("/spec/jobTemplate/spec/template/metadata"),
            CONFIG_REFS
        )
        .as_deref(),
        Some("configmap/app[schedule]")
    );
    set_config_map(&client, &ns, "app", json!({"data": {"schedule": "hourly"}})).await?;
    restamp(cluster(), &ns, "cronjob/report", "1").await?;
    let now = stamp(&cronjobs.get("report").await?);
    assert!(
        now.as_ref().is_some_and(|h| *h != first),
        "not restamped: {now:?}"
    );

    registered.remove().await?;
    Ok(())
}

/// The ConfigMaps a Deployment reads in a namespace that holds few are read with one metadata
/// LIST instead of one GET each, and that LIST is as fresh as the GETs: a ConfigMap changed just before a restamp
/// is stamped with its new content. A namespace holding many more ConfigMaps than the Deployment reads gets GETs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_references_are_read_with_one_fresh_list() -> anyhow::Result<()> {
    use helmop_core::resource::ResourceKind;
    use helmop_webhook::state::cache::LIST_SPREAD;

    let client = cluster().client().await;
    ensure_hash_key(&client).await?;
    let (ns, webhook) = setup(&client, "st-list", |_| Config::default()).await?;
    let registered = webhook.register(&client, &ns).await?;
    let deployments = Api::<Deployment>::namespaced(client.clone(), &ns);
    let names = ["a", "b", "c", "d"];
    // Written right before the Deployment: the webhook's watch cache may not have them yet.
    for name in names {
        create_config_map(&client, &ns, name, &[("VALUE", "one")]).await?;
    }
    let env_from: Vec<Value> = names
        .iter()
        .map(|n| json!({"configMapRef": {"name": n}}))
        .collect();
    let reads = || {
        (
            webhook.metrics.live_lists("configmaps"),
            webhook.metrics.live_gets("configmaps"),
        )
    };
    let before = reads();
    apply_ok(&deployment_manifest(
        &ns,
        "reader",
        json!({}),
        json!({"envFrom": env_from}),
    ))
    .await?;
    let first = deployment_stamp(&deployments, "reader")
        .await?
        .context("not stamped")?;
    let after = reads();
    assert!(after.0 > before.0, "no LIST: {before:?} -> {after:?}");
    // One GET per object for its content (its digest was not cached yet); none for the versions.
    assert_eq!(after.1 - before.1, 4, "{before:?} -> {after:?}");

    // Changed and restamped at once: the LIST sees the new content's version.
    set_config_map(&client, &ns, "c", json!({"data": {"VALUE": "two"}})).await?;
    let before = reads();
    restamp(cluster(), &ns, "deployment/reader", "changed").await?;
    let changed = deployment_stamp(&deployments, "reader")
        .await?
        .context("not stamped")?;
    assert_ne!(changed, first, "a just-changed ConfigMap was not stamped");
    let after = reads();
    assert!(after.0 > before.0, "no LIST: {before:?} -> {after:?}");
    assert_eq!(after.1 - before.1, 1, "only the changed content is read");
    // Back to the first content: back to the first stamp.
    set_config_map(&client, &ns, "c", json!({"data": {"VALUE": "one"}})).await?;
    restamp(cluster(), &ns, "deployment/reader", "reverted").await?;
    assert_eq!(
        deployment_stamp(&deployments, "reader").await?.as_deref(),
        Some(first.as_str())
    );

    // A namespace holding more than LIST_SPREAD ConfigMaps per reference: one GET each, no LIST.
    let crowd = LIST_SPREAD * names.len() + 1;
    for i in 0..crowd {
        create_config_map(&client, &ns, &format!("other-{i}"), &[("X", "y")]).await?;
    }
    wait_until(
        "the webhook to count the ConfigMaps",
        DEFAULT_TIMEOUT,
        || {
            let counted = webhook
                .state
                .caches()
                .cached_in(ResourceKind::ConfigMap, &ns);
            async move { Ok(counted > LIST_SPREAD * names.len()) }
        },
    )
    .await?;
    let before = reads();
    restamp(cluster(), &ns, "deployment/reader", "crowded").await?;
    assert_eq!(
        deployment_stamp(&deployments, "reader").await?.as_deref(),
        Some(first.as_str())
    );
    let after = reads();
    assert_eq!(after.0, before.0, "listed a crowded namespace");
    assert!(after.1 - before.1 >= 4, "{before:?} -> {after:?}");

    registered.remove().await?;
    Ok(())
}
