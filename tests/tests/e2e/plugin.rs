//! `kubectl-helmop propagate`, `status` and `prune` end to end: the real binary against the
//! shared control plane (upstream + down1 + down2, Fleet Clusters registered per test in a fresh
//! namespace) and, for stopping an API server, a private one.

mod conventions;
pub mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use helmop_tests::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use support::*;

pub(crate) fn secret_obj(
    ns: &str,
    name: &str,
    type_: &str,
    data: &[(&str, &[u8])],
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> Secret {
    let map = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    };
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: map(labels),
            annotations: map(annotations),
            ..ObjectMeta::default()
        },
        type_: Some(type_.into()),
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), ByteString(v.to_vec())))
                .collect(),
        ),
        ..Secret::default()
    }
}

pub(crate) async fn create(client: &kube::Client, secret: &Secret) -> anyhow::Result<Secret> {
    let ns = secret.metadata.namespace.clone().unwrap_or_default();
    Ok(Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), secret)
        .await?)
}

pub(crate) async fn set_secret_data(
    client: &kube::Client,
    ns: &str,
    name: &str,
    data: Value,
) -> anyhow::Result<()> {
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": data})),
        )
        .await?;
    Ok(())
}

pub(crate) fn b64(s: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

pub(crate) fn rv(meta: &ObjectMeta) -> String {
    meta.resource_version.clone().unwrap_or_default()
}

#[tokio::test]
async fn propagate_copies_exactly_the_right_objects_and_a_second_run_writes_nothing()
-> anyhow::Result<()> {
    let f = Fleet::new("pa-copy").await?;
    let (apps, edge) = (f.dest("apps"), f.dest("edge"));
    let db = create(
        &f.upstream,
        &secret_obj(
            &f.ns,
            "db",
            "example.com/db",
            &[("user", b"app"), ("password", &[0, 1, 2, 255])],
            &[
                ("app", "web"),
                ("helmop.dev/owners", "forged"),
                ("fleet.cattle.io/bundledeployment", "x"),
            ],
            &[
                ("note", "hi"),
                ("kubectl.kubernetes.io/last-applied-configuration", "{}"),
            ],
        ),
    )
    .await?;
    let settings = ConfigMap {
        metadata: ObjectMeta {
            name: Some("settings".into()),
            namespace: Some(f.ns.clone()),
            ..ObjectMeta::default()
        },
        data: Some([("mode".to_string(), "fast".to_string())].into()),
        binary_data: Some([("blob".to_string(), ByteString(vec![9, 0, 9]))].into()),
        ..ConfigMap::default()
    };
    Api::<ConfigMap>::namespaced(f.upstream.clone(), &f.ns)
        .create(&PostParams::default(), &settings)
        .await?;
    create_secret(&f.upstream, &f.ns, "unused", &[("x", b"y")]).await?;
    // Root resource db everywhere; the first matching target wins: down2 by its group (into
    // its own namespace), down1 by label (plus settings).
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\n\
             downstreamResources:\n- {{kind: Secret, name: db}}\n\
             targets:\n\
             - clusterGroup: edge\n  namespace: {edge}\n\
             - clusterSelector: {{matchLabels: {{env: prod}}}}\n  downstreamResources:\n  - {{kind: ConfigMap, name: settings}}\n"
        ),
    ))
    .await?;

    // Before anything is copied, status says Missing everywhere.
    let missing = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let missing = states(&missing);
    assert_eq!(missing.len(), 3, "{missing:#?}");
    assert!(missing.values().all(|s| s == "Missing"), "{missing:#?}");

    // The plan first: nothing is written.
    let dry = helmop(&["propagate", "app", "-n", &f.ns, "--dry-run", "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(writes(&dry), 0);
    let planned = states(&dry);
    assert_eq!(
        planned.values().collect::<BTreeSet<_>>(),
        BTreeSet::from([&"Create".to_string()]),
        "{planned:#?}"
    );
    assert_eq!(planned.len(), 3, "{planned:#?}");
    assert!(!namespace_exists(&f.down1, &apps).await?);
    assert!(!namespace_exists(&f.down2, &edge).await?);

    let first = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let id = first["upstreamId"].as_str().unwrap_or_default().to_string();
    assert!(id.starts_with("up-"), "{first:#}");
    assert!(writes(&first) >= 3, "{first:#}");
    let states1 = states(&first);
    assert_eq!(
        states1,
        [
            (
                format!("{}/down1 {apps} ConfigMap/settings", f.ns),
                "Created".to_string()
            ),
            (
                format!("{}/down1 {apps} Secret/db", f.ns),
                "Created".to_string()
            ),
            (
                format!("{}/down2 {edge} Secret/db", f.ns),
                "Created".to_string()
            ),
        ]
        .into(),
    );

    // Exactly these copies, nothing else, nowhere else.
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        BTreeSet::from([
            place(&apps, "ConfigMap", "settings"),
            place(&apps, "Secret", "db")
        ])
    );
    assert_eq!(
        copies_of(&f.down2, &f.ns).await?,
        BTreeSet::from([place(&edge, "Secret", "db")])
    );
    assert!(!namespace_exists(&f.down1, &edge).await?);
    assert!(!namespace_exists(&f.down2, &apps).await?);

    let copy = some(get_secret(&f.down1, &apps, "db").await?, "db on down1")?;
    assert_eq!(copy.type_.as_deref(), Some("example.com/db"));
    assert_eq!(copy.data, db.data);
    let labels = copy.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels,
        [
            ("app".to_string(), "web".to_string()),
            (
                "helmop.dev/managed-by".to_string(),
                "kubectl-helmop".to_string()
            ),
        ]
        .into()
    );
    let m = &copy.metadata;
    assert_eq!(annotation(m, "note"), Some("hi"));
    assert_eq!(
        annotation(m, "kubectl.kubernetes.io/last-applied-configuration"),
        None
    );
    assert_eq!(
        annotation(m, "helmop.dev/owners"),
        Some(format!("{id}/{}/app", f.ns).as_str())
    );
    assert_eq!(
        annotation(m, "helmop.dev/source"),
        Some(format!("{id}/{}/Secret/db", f.ns).as_str())
    );
    assert_eq!(
        annotation(m, "helmop.dev/source-uid"),
        db.metadata.uid.as_deref()
    );
    let hash = annotation(m, "helmop.dev/content-hash").unwrap_or_default();
    assert!(hash.starts_with("v1:") && hash.len() == 67, "{hash}");
    let managers: Vec<String> = m
        .managed_fields
        .iter()
        .flatten()
        .map(|f| {
            format!(
                "{}/{}",
                f.manager.clone().unwrap_or_default(),
                f.operation.clone().unwrap_or_default()
            )
        })
        .collect();
    // Created with a POST (never merged into an object that appeared meanwhile).
    assert_eq!(managers, ["kubectl-helmop/Update"]);
    let cm = some(
        get_config_map(&f.down1, &apps, "settings").await?,
        "settings on down1",
    )?;
    assert_eq!(cm.data, settings.data);
    assert_eq!(cm.binary_data, settings.binary_data);
    let edge_copy = some(get_secret(&f.down2, &edge, "db").await?, "db on down2")?;
    assert_eq!(edge_copy.data, db.data);

    // Second run: zero writes, every object untouched.
    let before = [
        rv(&copy.metadata),
        rv(&cm.metadata),
        rv(&edge_copy.metadata),
    ];
    let second = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(writes(&second), 0, "{second:#}");
    assert!(
        states(&second).values().all(|s| s == "Unchanged"),
        "{second:#}"
    );
    let after = [
        rv(&some(get_secret(&f.down1, &apps, "db").await?, "db")?.metadata),
        rv(&some(
            get_config_map(&f.down1, &apps, "settings").await?,
            "settings",
        )?
        .metadata),
        rv(&some(get_secret(&f.down2, &edge, "db").await?, "db")?.metadata),
    ];
    assert_eq!(before, after);

    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let st = states(&status);
    assert_eq!(st.len(), 3, "{status:#}");
    assert!(st.values().all(|s| s == "Synced"), "{status:#}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_source_is_stale_then_propagated_and_opted_in_workloads_roll()
-> anyhow::Result<()> {
    let f = Fleet::new("pa-roll").await?;
    // The destination namespace exists downstream and opts every workload in.
    let dest = fresh_namespace_with_labels(
        &f.down1,
        "pa-roll-dest",
        &[("helmop.dev/rollout-on-change", "enabled")],
    )
    .await?;
    create_secret(&f.upstream, &f.ns, "db", &[("password", b"one")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!("defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"),
    ))
    .await?;

    // The workloads are admitted before any webhook runs: nothing stamps them yet.
    let deployments: Api<Deployment> = Api::namespaced(f.down1.clone(), &dest);
    for (name, labels, reads) in [
        ("web", json!({}), true),
        (
            "optout",
            json!({"helmop.dev/rollout-on-change": "false"}),
            true,
        ),
        ("other", json!({}), false),
    ] {
        let d: Deployment = serde_json::from_value(deployment(&dest, name, labels, reads))?;
        deployments.create(&PostParams::default(), &d).await?;
    }
    let copy_key = format!("{}/down1 {dest} Secret/db", f.ns);
    let web_key = format!("{copy_key} Deployment/web");

    let first = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let copy = some(get_secret(&f.down1, &dest, "db").await?, "db copy")?;
    let hash1 = annotation(&copy.metadata, "helmop.dev/content-hash")
        .unwrap_or_default()
        .to_string();
    let web = deployments.get("web").await?;
    assert_eq!(
        annotation(&web.metadata, "helmop.dev/restamp"),
        Some(format!("secret/db={hash1}").as_str()),
        "{first:#}"
    );
    let restamped = rows(&first)
        .into_iter()
        .find(|r| r["workload"] == "Deployment/web")
        .unwrap_or_else(|| panic!("no restamp row: {first:#}"));
    assert_eq!(restamped["state"], "Restamped");
    assert!(
        restamped["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("is the helmop webhook installed"),
        "{restamped}"
    );
    for untouched in ["optout", "other"] {
        let d = deployments.get(untouched).await?;
        assert_eq!(
            annotation(&d.metadata, "helmop.dev/restamp"),
            None,
            "{untouched}"
        );
    }
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let st = states(&status);
    assert_eq!(
        st.get(&copy_key).map(String::as_str),
        Some("Synced"),
        "{status:#}"
    );
    assert_eq!(
        st.get(&web_key).map(String::as_str),
        Some("RolloutPending"),
        "{status:#}"
    );
    assert!(
        !st.keys()
            .any(|k| k.contains("optout") || k.contains("other")),
        "{status:#}"
    );

    // Now the webhook stamps workloads in `dest` on down1, with a key of its own.
    let hook = RollingWebhook::start(&f.down1, &dest).await?;

    // Each change of the source: Stale until propagate runs; then the copy is updated, web is
    // restamped, the webhook re-stamps its pod template and a new ReplicaSet rolls out.
    let mut last_hash = hash1;
    for (round, value) in [(1, &b"two"[..]), (2, &b"three"[..])] {
        set_secret_data(&f.upstream, &f.ns, "db", json!({"password": b64(value)})).await?;
        let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
            .await?
            .expect(0)
            .json();
        assert_eq!(
            states(&status).get(&copy_key).map(String::as_str),
            Some("Stale"),
            "{status:#}"
        );

        let stamp_before =
            template_annotation(&deployments.get("web").await?, "helmop.dev/config-hash");
        assert_eq!(
            stamp_before.is_some(),
            round > 1,
            "stamped only once the webhook ran"
        );
        let sets_before = replica_set_hashes(&f.down1, &dest, "web").await?;

        let out = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
            .await?
            .expect(0)
            .json();
        let r = rows(&out);
        assert_eq!(
            row(&r, &format!("{}/down1", f.ns), "db")["state"],
            "Updated",
            "{out:#}"
        );
        let copy = some(get_secret(&f.down1, &dest, "db").await?, "db copy")?;
        assert_eq!(copy.data.unwrap_or_default()["password"].0, value);
        let hash = annotation(&copy.metadata, "helmop.dev/content-hash")
            .unwrap_or_default()
            .to_string();
        assert_ne!(hash, last_hash);
        let web_after = deployments.get("web").await?;
        assert_eq!(
            annotation(&web_after.metadata, "helmop.dev/restamp"),
            Some(format!("secret/db={hash}").as_str())
        );
        let stamp_after = template_annotation(&web_after, "helmop.dev/config-hash");
        assert!(stamp_after.is_some());
        assert_ne!(
            stamp_before, stamp_after,
            "the webhook re-stamped the pod template"
        );
        let restamped = r
            .iter()
            .find(|r| r["workload"] == "Deployment/web")
            .unwrap_or_else(|| panic!("no restamp row: {out:#}"));
        assert_eq!(restamped["state"], "Restamped");
        assert_eq!(restamped["reason"], "pod template re-stamped");
        wait_until("a new ReplicaSet for web", DEFAULT_TIMEOUT, || async {
            let now = replica_set_hashes(&f.down1, &dest, "web").await?;
            Ok(now.len() > sets_before.len()
                && now.contains(stamp_after.as_deref().unwrap_or_default()))
        })
        .await?;
        for untouched in ["optout", "other"] {
            let d = deployments.get(untouched).await?;
            assert_eq!(
                annotation(&d.metadata, "helmop.dev/restamp"),
                None,
                "{untouched}"
            );
        }
        let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
            .await?
            .expect(0)
            .json();
        let st = states(&status);
        assert_eq!(
            st.get(&copy_key).map(String::as_str),
            Some("Synced"),
            "{status:#}"
        );
        assert_eq!(
            st.get(&web_key).map(String::as_str),
            Some("Current"),
            "{status:#}"
        );
        last_hash = hash;
    }

    // A restamp recorded for other content than the copy has now is RolloutPending.
    deployments
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"annotations": {"helmop.dev/restamp": format!("secret/db=v1:{}", "0".repeat(64))}}})),
        )
        .await?;
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "wide"])
        .await?
        .expect(0);
    let line = status
        .stdout
        .lines()
        .find(|l| l.contains("Deployment/web"))
        .unwrap_or_else(|| panic!("no row for web:\n{}", status.stdout));
    assert!(line.contains("RolloutPending"), "{line}");
    assert!(line.contains("changed after the last restamp"), "{line}");
    assert!(status.stdout.starts_with("HELMOP"), "{}", status.stdout);
    assert!(
        status
            .stdout
            .lines()
            .next()
            .unwrap_or_default()
            .contains("REASON")
    );
    hook.stop().await?;
    Ok(())
}

fn deployment(ns: &str, name: &str, labels: Value, reads_db: bool) -> Value {
    let mut container = json!({"name": "app", "image": "registry.example.com/app:1.0"});
    if reads_db {
        container["envFrom"] = json!([{"secretRef": {"name": "db"}}]);
    }
    let mut d = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": {"containers": [container]}},
        },
    });
    if labels.as_object().is_some_and(|l| !l.is_empty()) {
        d["metadata"]["labels"] = labels;
    }
    d
}

/// The config-hash stamps of the ReplicaSets of deployment `name`.
async fn replica_set_hashes(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> anyhow::Result<BTreeSet<String>> {
    let sets = Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={name}")))
        .await?;
    Ok(sets
        .items
        .iter()
        .map(|rs| {
            rs.spec
                .template
                .as_ref()
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get("helmop.dev/config-hash").cloned())
                .unwrap_or_default()
        })
        .collect())
}

/// The real webhook (in-process) stamping workloads of one namespace of a downstream cluster.
struct RollingWebhook {
    server: LocalWebhook,
    client: kube::Client,
    name: String,
}

impl RollingWebhook {
    async fn start(client: &kube::Client, ns: &str) -> anyhow::Result<RollingWebhook> {
        use helmop_webhook::state::{Config, ImageMode, SecretRef};

        let key: Vec<u8> = (0..32u8)
            .map(|i| i.wrapping_mul(37).wrapping_add(11))
            .collect();
        create_secret(client, ns, "hash-key", &[("key", &key)]).await?;
        let config = Config {
            hash_key_secret: SecretRef {
                namespace: ns.into(),
                name: "hash-key".into(),
            },
            image_mode: ImageMode::Off,
            ..Config::default()
        };
        let server = LocalWebhook::start(client.clone(), config).await?;
        let name = format!("{ns}-workloads");
        let url = format!("{}/mutate/workloads", server.url);
        WebhookRegistration::new(WebhookKind::Mutating, &name, &url, &server.ca_pem)
            .rule(WebhookRule::new(
                &["CREATE", "UPDATE"],
                "apps",
                "v1",
                &["deployments", "replicasets"],
            ))
            .only_namespace(ns)
            .register(client)
            .await?;
        Ok(RollingWebhook {
            server,
            client: client.clone(),
            name,
        })
    }

    async fn stop(mut self) -> anyhow::Result<()> {
        unregister_webhook(&self.client, WebhookKind::Mutating, &self.name).await?;
        self.server.stop();
        Ok(())
    }
}

#[tokio::test]
async fn an_unowned_same_named_secret_is_a_conflict_until_adopted() -> anyhow::Result<()> {
    let f = Fleet::new("pa-conflict").await?;
    let dest = fresh_namespace(&f.down1, "pa-conflict-dest").await?;
    create_secret(&f.upstream, &f.ns, "db", &[("password", b"from-upstream")]).await?;
    let theirs = create(
        &f.down1,
        &secret_obj(
            &dest,
            "db",
            "Opaque",
            &[("other", b"mine")],
            &[("team", "a")],
            &[],
        ),
    )
    .await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!("defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"),
    ))
    .await?;

    let out = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1)
        .json();
    let r = rows(&out);
    let conflict = row(&r, &format!("{}/down1", f.ns), "db");
    assert_eq!(conflict["state"], "Conflict");
    assert!(
        conflict["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("--adopt"),
        "{conflict}"
    );
    let now = some(get_secret(&f.down1, &dest, "db").await?, "their secret")?;
    assert_eq!(
        serde_json::to_value(&now)?,
        serde_json::to_value(&theirs)?,
        "the unowned Secret is left exactly as it was"
    );
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(
        states(&status)
            .get(&format!("{}/down1 {dest} Secret/db", f.ns))
            .map(String::as_str),
        Some("Conflict")
    );

    let adopted = helmop(&["propagate", "app", "-n", &f.ns, "--adopt", "-o", "json"])
        .await?
        .expect(0)
        .json();
    let r = rows(&adopted);
    let updated = row(&r, &format!("{}/down1", f.ns), "db");
    assert_eq!(updated["state"], "Updated", "{adopted:#}");
    assert!(
        updated["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("adopted"),
        "{updated}"
    );
    let now = some(get_secret(&f.down1, &dest, "db").await?, "adopted secret")?;
    assert_eq!(
        now.metadata.uid, theirs.metadata.uid,
        "taken over, not recreated"
    );
    let data = now.data.clone().unwrap_or_default();
    assert_eq!(
        data.keys().collect::<Vec<_>>(),
        ["password"],
        "exactly the source's keys"
    );
    assert_eq!(data["password"].0, b"from-upstream");
    assert_eq!(
        label(&now.metadata, "helmop.dev/managed-by"),
        Some("kubectl-helmop")
    );
    assert!(
        annotation(&now.metadata, "helmop.dev/owners")
            .is_some_and(|o| o.ends_with(&format!("/{}/app", f.ns)))
    );

    let again = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(writes(&again), 0, "{again:#}");
    Ok(())
}

#[tokio::test]
async fn a_hanging_or_credential_less_cluster_costs_only_its_own_rows() -> anyhow::Result<()> {
    let f = Fleet::new("pa-hang").await?;
    // An API server that accepts connections and never answers.
    let (port, _accepted) = black_hole()?;
    let hanging = loopback_kubeconfig(port);
    create_secret(
        &f.upstream,
        &f.ns,
        "hang-kubeconfig",
        &[("value", hanging.as_bytes())],
    )
    .await?;
    create_fleet_object(
        &f.upstream,
        &f.ns,
        &cluster_resource(),
        json!({"metadata": {"name": "hang", "labels": {"env": "prod"}}, "spec": {"kubeConfigSecret": "hang-kubeconfig"}}),
    )
    .await?;
    create_fleet_object(
        &f.upstream,
        &f.ns,
        &cluster_resource(),
        json!({"metadata": {"name": "nocreds", "labels": {"env": "prod"}}, "spec": {"kubeConfigSecret": "does-not-exist"}}),
    )
    .await?;
    let dest = f.dest("apps");
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!("defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterSelector: {{matchLabels: {{env: prod}}}}\n"),
    ))
    .await?;

    let started = Instant::now();
    let out = helmop(&[
        "propagate",
        "app",
        "-n",
        &f.ns,
        "--cluster-timeout",
        "3s",
        "-o",
        "json",
    ])
    .await?
    .expect(2)
    .json();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let r = rows(&out);
    for reachable in ["down1", "down2"] {
        assert_eq!(
            row(&r, &format!("{}/{reachable}", f.ns), "db")["state"],
            "Created",
            "{out:#}"
        );
    }
    let hang = row(&r, &format!("{}/hang", f.ns), "db");
    assert_eq!(hang["state"], "Unreachable");
    assert_eq!(hang["reason"], "no answer within --cluster-timeout 3s");
    let nocreds = row(&r, &format!("{}/nocreds", f.ns), "db");
    assert_eq!(nocreds["state"], "Unreachable");
    assert!(
        nocreds["reason"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!(
                "kubeconfig Secret {}/does-not-exist not found",
                f.ns
            )),
        "{nocreds}"
    );
    assert_eq!(out["summary"]["unreachableClusters"], 2);
    assert!(get_secret(&f.down1, &dest, "db").await?.is_some());
    assert!(get_secret(&f.down2, &dest, "db").await?.is_some());

    let status = helmop(&[
        "status",
        "app",
        "-n",
        &f.ns,
        "--cluster-timeout",
        "3s",
        "-o",
        "json",
    ])
    .await?
    .expect(2)
    .json();
    let st = states(&status);
    assert_eq!(
        st.get(&format!("{}/down1 {dest} Secret/db", f.ns))
            .map(String::as_str),
        Some("Synced")
    );
    assert_eq!(
        st.get(&format!("{}/hang {dest} Secret/db", f.ns))
            .map(String::as_str),
        Some("Unreachable")
    );
    Ok(())
}

#[tokio::test]
async fn a_stopped_api_server_is_unreachable_and_the_rest_converges() -> anyhow::Result<()> {
    // Stopping an API server needs a control plane of our own.
    let cp = ControlPlane::start(&["pa-up", "pa-d1", "pa-d2"])?;
    let upstream = cp.cluster("pa-up").client().await;
    let ns = fresh_namespace(&upstream, "pa-stop").await?;
    for name in ["pa-d1", "pa-d2"] {
        register_fleet_cluster(&upstream, &ns, name, &[("env", "prod")], cp.cluster(name)).await?;
    }
    create_secret(&upstream, &ns, "db", &[("k", b"v")]).await?;
    apply_helmop(
        &upstream,
        &ns,
        &helmop_yaml(
            "app",
            "defaultNamespace: apps\ndownstreamResources:\n- {kind: Secret, name: db}\ntargets:\n- clusterSelector: {matchLabels: {env: prod}}\n",
        ),
    )
    .await?;
    let kubeconfig = cp.cluster("pa-up").kubeconfig.clone();
    let (d1, d2) = (format!("{ns}/pa-d1"), format!("{ns}/pa-d2"));

    // A fresh upstream has no hash key yet: a dry run does not create it, the first real run does.
    let dry = run_with(
        &kubeconfig,
        &["propagate", "-A", "--dry-run", "-o", "json"],
        &[],
    )
    .await?
    .expect(0)
    .json();
    assert_eq!(dry["hashKey"], "ephemeral");
    let keys: Api<Secret> = Api::namespaced(upstream.clone(), "helmop-system");
    assert!(keys.get_opt("helmop-hash-key").await?.is_none());

    // Mid-run: with one cluster at a time, a hung cluster sorted first holds the run while
    // pa-d2's API server is stopped; pa-d2 was reachable when the run started.
    let (port, accepted) = black_hole()?;
    create_secret(
        &upstream,
        &ns,
        "a-hang-kubeconfig",
        &[("value", loopback_kubeconfig(port).as_bytes())],
    )
    .await?;
    create_fleet_object(
        &upstream,
        &ns,
        &cluster_resource(),
        json!({"metadata": {"name": "a-hang", "labels": {"env": "prod"}}, "spec": {"kubeConfigSecret": "a-hang-kubeconfig"}}),
    )
    .await?;
    let run = spawn_with(
        &kubeconfig,
        &[
            "propagate",
            "-A",
            "-o",
            "json",
            "--concurrency",
            "1",
            "--cluster-timeout",
            "15s",
        ],
    )?;
    tokio::task::spawn_blocking(move || accepted.recv_timeout(Duration::from_secs(60))).await??;
    cp.stop_cluster("pa-d2")?;
    let out = finish(run).await?.expect(2).json();
    assert_eq!(
        row(&rows(&out), &format!("{ns}/a-hang"), "db")["state"],
        "Unreachable"
    );
    fleet_api(&upstream, &ns, &cluster_resource())
        .delete("a-hang", &DeleteParams::default())
        .await?;
    let r = rows(&out);
    assert_eq!(row(&r, &d1, "db")["state"], "Created", "{out:#}");
    assert_eq!(row(&r, &d2, "db")["state"], "Unreachable", "{out:#}");
    assert_eq!(out["summary"]["unreachableClusters"], 2);
    assert_eq!(out["hashKey"], "created");
    let key = some(keys.get_opt("helmop-hash-key").await?, "the hash key")?;
    assert_eq!(key.data.unwrap_or_default()["key"].0.len(), 32);
    let down1 = cp.cluster("pa-d1").client().await;
    assert!(get_secret(&down1, "apps", "db").await?.is_some());
    let status = run_with(&kubeconfig, &["status", "-A", "-o", "json"], &[])
        .await?
        .expect(2)
        .json();
    assert_eq!(row(&rows(&status), &d2, "db")["state"], "Unreachable");

    cp.start_cluster("pa-d2")?;
    let out = run_with(&kubeconfig, &["propagate", "-A", "-o", "json"], &[])
        .await?
        .expect(0)
        .json();
    let r = rows(&out);
    assert_eq!(row(&r, &d1, "db")["state"], "Unchanged", "{out:#}");
    assert_eq!(row(&r, &d2, "db")["state"], "Created", "{out:#}");
    let status = run_with(&kubeconfig, &["status", "-A", "-o", "json"], &[])
        .await?
        .expect(0)
        .json();
    assert!(
        states(&status).values().all(|s| s == "Synced"),
        "{status:#}"
    );
    Ok(())
}

#[tokio::test]
async fn prune_deletes_exactly_the_stale_copies_and_nothing_when_clusters_cannot_be_listed()
-> anyhow::Result<()> {
    let f = Fleet::new("pa-prune").await?;
    let apps = f.dest("apps");
    for name in ["a", "b", "shared", "k", "g", "impostor"] {
        create_secret(&f.upstream, &f.ns, name, &[("k", name.as_bytes())]).await?;
    }
    let both = "targets:\n- clusterSelector: {matchLabels: {env: prod}}\n";
    let one = "targets:\n- clusterName: down1\n";
    let ops = [
        (
            "app",
            format!(
                "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: a}}\n- {{kind: Secret, name: b}}\n- {{kind: Secret, name: shared}}\n{both}"
            ),
        ),
        (
            "app2",
            format!(
                "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: shared}}\n{one}"
            ),
        ),
        (
            "keeper",
            format!(
                "defaultNamespace: {apps}\nkeepResources: true\ndownstreamResources:\n- {{kind: Secret, name: k}}\n{one}"
            ),
        ),
        (
            "gone",
            format!(
                "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: g}}\n{one}"
            ),
        ),
    ];
    for (name, spec) in &ops {
        f.helmop(&helmop_yaml(name, spec)).await?;
    }
    let out = helmop(&["propagate", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let id = out["upstreamId"].as_str().unwrap_or_default().to_string();
    let owner = |name: &str| format!("{id}/{}/{name}", f.ns);
    assert_eq!(
        annotation(
            &some(get_secret(&f.down1, &apps, "shared").await?, "shared")?.metadata,
            "helmop.dev/owners"
        ),
        Some(format!("{},{}", owner("app"), owner("app2")).as_str())
    );
    // Impostors: helmop's labels and markers, but a source uid that matches nothing, or an owner
    // that never existed.
    let managed = [("helmop.dev/managed-by", "kubectl-helmop")];
    let app_owner = owner("app");
    let nobody = owner("nobody");
    let impostor_source = format!("{id}/{}/Secret/impostor", f.ns);
    for (name, owners) in [
        ("impostor", app_owner.as_str()),
        ("impostor2", nobody.as_str()),
    ] {
        create(
            &f.down1,
            &secret_obj(
                &apps,
                name,
                "Opaque",
                &[("k", b"x")],
                &managed,
                &[
                    ("helmop.dev/owners", owners),
                    ("helmop.dev/source", &impostor_source),
                    (
                        "helmop.dev/source-uid",
                        "00000000-0000-0000-0000-000000000000",
                    ),
                ],
            ),
        )
        .await?;
    }

    // Make copies stale: an entry removed, a cluster untargeted, HelmOps deleted.
    f.helmop(&helmop_yaml(
        "app",
        &format!("defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: a}}\n- {{kind: Secret, name: shared}}\ntargets:\n- clusterSelector: {{matchLabels: {{name: down1}}}}\n"),
    ))
    .await?;
    let helmops = fleet_api(&f.upstream, &f.ns, &helmop_resource());
    for name in ["app2", "keeper", "gone"] {
        helmops.delete(name, &DeleteParams::default()).await?;
    }
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(
        states(&status)
            .get(&format!("{}/down1 {apps} Secret/b", f.ns))
            .map(String::as_str),
        Some("Orphaned"),
        "{status:#}"
    );
    let stale_down1 = ["b", "g"];
    let stale_down2 = ["a", "b", "shared"];

    // Without permission to list Clusters, prune stops before touching anything.
    let dir = tempfile::tempdir()?;
    let limited = kubeconfig_without_cluster_access(&f.upstream, &f.ns, dir.path()).await?;
    let denied = run_with(&limited, &["prune", "-n", &f.ns], &[])
        .await?
        .expect(1);
    assert!(
        denied.stderr.contains("listing Clusters"),
        "{}",
        denied.stderr
    );
    let dry = helmop(&["prune", "-n", &f.ns, "--dry-run", "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(dry["writes"], 0);
    for name in stale_down1
        .iter()
        .chain(["k", "impostor", "impostor2"].iter())
    {
        assert!(
            get_secret(&f.down1, &apps, name).await?.is_some(),
            "{name} still on down1"
        );
    }
    for name in stale_down2 {
        assert!(
            get_secret(&f.down2, &apps, name).await?.is_some(),
            "{name} still on down2"
        );
    }
    let planned = states(&dry);
    assert_eq!(
        planned
            .get(&format!("{}/down1 {apps} Secret/b", f.ns))
            .map(String::as_str),
        Some("Prune"),
        "{dry:#}"
    );

    let pruned = helmop(&["prune", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let st = states(&pruned);
    let d1 = |name: &str| format!("{}/down1 {apps} Secret/{name}", f.ns);
    let d2 = |name: &str| format!("{}/down2 {apps} Secret/{name}", f.ns);
    for name in stale_down1 {
        assert_eq!(
            st.get(&d1(name)).map(String::as_str),
            Some("Pruned"),
            "{pruned:#}"
        );
        assert!(
            get_secret(&f.down1, &apps, name).await?.is_none(),
            "{name} pruned on down1"
        );
    }
    for name in stale_down2 {
        assert_eq!(
            st.get(&d2(name)).map(String::as_str),
            Some("Pruned"),
            "{pruned:#}"
        );
        assert!(
            get_secret(&f.down2, &apps, name).await?.is_none(),
            "{name} pruned on down2"
        );
    }
    assert_eq!(
        st.get(&d1("shared")).map(String::as_str),
        Some("Released"),
        "{pruned:#}"
    );
    let shared = some(get_secret(&f.down1, &apps, "shared").await?, "shared")?;
    assert_eq!(
        annotation(&shared.metadata, "helmop.dev/owners"),
        Some(owner("app").as_str())
    );
    assert_eq!(
        st.get(&d1("k")).map(String::as_str),
        Some("Kept"),
        "{pruned:#}"
    );
    let kept = some(get_secret(&f.down1, &apps, "k").await?, "kept copy")?;
    assert_eq!(annotation(&kept.metadata, "helmop.dev/owners"), None);
    assert_eq!(annotation(&kept.metadata, "helmop.dev/keep"), Some("true"));
    let kept_uid = kept.metadata.uid.clone();
    assert_eq!(
        st.get(&d1("impostor")).map(String::as_str),
        Some("Orphaned"),
        "{pruned:#}"
    );
    assert!(get_secret(&f.down1, &apps, "impostor").await?.is_some());
    assert!(get_secret(&f.down1, &apps, "impostor2").await?.is_some());
    assert!(
        get_secret(&f.down1, &apps, "a").await?.is_some(),
        "still wanted"
    );
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        ["a", "impostor", "impostor2", "shared"]
            .iter()
            .map(|n| place(&apps, "Secret", n))
            .collect()
    );
    assert!(copies_of(&f.down2, &f.ns).await?.is_empty());

    let again = helmop(&["prune", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(again["writes"], 0, "{again:#}");

    // A later HelmOp listing the same source re-adopts the kept copy.
    f.helmop(&helmop_yaml(
        "keeper2",
        &format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: k}}\n{one}"
        ),
    ))
    .await?;
    let readopted = helmop(&["propagate", "keeper2", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(
        row(&rows(&readopted), &format!("{}/down1", f.ns), "k")["state"],
        "Updated",
        "{readopted:#}"
    );
    let kept = some(get_secret(&f.down1, &apps, "k").await?, "re-adopted copy")?;
    assert_eq!(kept.metadata.uid, kept_uid, "the same object");
    assert_eq!(
        annotation(&kept.metadata, "helmop.dev/owners"),
        Some(owner("keeper2").as_str())
    );
    assert_eq!(annotation(&kept.metadata, "helmop.dev/keep"), None);
    Ok(())
}

#[tokio::test]
async fn fleet_managed_copies_are_left_alone_but_compared_and_missing_sources_reported()
-> anyhow::Result<()> {
    let f = Fleet::new("pa-fleet").await?;
    let dest = fresh_namespace(&f.down1, "pa-fleet-dest").await?;
    create_secret(&f.upstream, &f.ns, "db", &[("password", b"same")]).await?;
    create_config_map(&f.upstream, &f.ns, "cfg", &[("mode", "new")]).await?;
    // Fleet's agent copied both itself; its ConfigMap is behind the source.
    let fleet_label = [("fleet.cattle.io/bundledeployment", "app")];
    let fleet_db = create(
        &f.down1,
        &secret_obj(
            &dest,
            "db",
            "Opaque",
            &[("password", b"same")],
            &fleet_label,
            &[],
        ),
    )
    .await?;
    let fleet_cfg = Api::<ConfigMap>::namespaced(f.down1.clone(), &dest)
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some("cfg".into()),
                    labels: Some(
                        [(
                            "fleet.cattle.io/bundledeployment".to_string(),
                            "app".to_string(),
                        )]
                        .into(),
                    ),
                    ..ObjectMeta::default()
                },
                data: Some([("mode".to_string(), "old".to_string())].into()),
                ..ConfigMap::default()
            },
        )
        .await?;
    let one = format!("defaultNamespace: {dest}\ntargets:\n- clusterName: down1\n");
    f.helmop(&helmop_yaml(
        "app",
        &format!("downstreamResources:\n- {{kind: Secret, name: db}}\n- {{kind: ConfigMap, name: cfg}}\n{one}"),
    ))
    .await?;
    f.helmop(&helmop_yaml(
        "later",
        &format!("downstreamResources:\n- {{kind: Secret, name: not-yet}}\n{one}"),
    ))
    .await?;

    let out = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let d1 = format!("{}/down1", f.ns);
    assert_eq!(
        row(&rows(&out), &d1, "db")["state"],
        "FleetManaged",
        "{out:#}"
    );
    assert_eq!(
        row(&rows(&out), &d1, "cfg")["state"],
        "FleetManaged",
        "{out:#}"
    );
    assert_eq!(writes(&out), 0, "{out:#}");
    assert_eq!(
        serde_json::to_value(some(get_secret(&f.down1, &dest, "db").await?, "db")?)?,
        serde_json::to_value(&fleet_db)?
    );
    assert_eq!(
        serde_json::to_value(some(get_config_map(&f.down1, &dest, "cfg").await?, "cfg")?)?,
        serde_json::to_value(&fleet_cfg)?
    );
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let r = rows(&status);
    assert_eq!(row(&r, &d1, "db")["state"], "FleetManaged");
    assert_eq!(row(&r, &d1, "db")["inSync"], true, "{status:#}");
    assert_eq!(row(&r, &d1, "cfg")["inSync"], false, "{status:#}");
    assert!(
        !status.to_string().contains("same"),
        "no data in the output"
    );

    // A source that does not exist (yet) is reported, and fails the run.
    let out = helmop(&["propagate", "later", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1)
        .json();
    assert_eq!(
        row(&rows(&out), &d1, "not-yet")["state"],
        "SourceMissing",
        "{out:#}"
    );
    let status = helmop(&["status", "later", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(
        row(&rows(&status), &d1, "not-yet")["state"],
        "SourceMissing"
    );
    create_secret(&f.upstream, &f.ns, "not-yet", &[("k", b"v")]).await?;
    helmop(&["propagate", "later", "-n", &f.ns])
        .await?
        .expect(0);
    Ok(())
}
