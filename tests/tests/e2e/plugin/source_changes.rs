//! A changed source: `status` reports its copies stale, `propagate` brings them up to date and the opted-in
//! workloads that read them roll (the real webhook stamping them downstream).

use std::collections::BTreeSet;

use helmop_tests::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use super::support::*;

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
