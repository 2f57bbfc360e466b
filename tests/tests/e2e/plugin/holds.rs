//! `status` shows the rollout watcher's holds on the rows of the workloads it reports: a real
//! watcher (`rollout -n NS --watch`) on down1, with the real webhook stamping there, holds a
//! Deployment whose required key vanished from helmop's copy and restamps another reader of the
//! same copy; `status` (upstream) reads the watcher's Events back.

use std::time::Duration;

use helmop_tests::*;
use helmop_webhook::state::Config;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::support::*;

const WAIT: Duration = Duration::from_secs(60);

/// Whether `client` holds an Event of `reason` about `name` in `ns`.
async fn has_event(client: &Client, ns: &str, name: &str, reason: &str) -> anyhow::Result<bool> {
    let list = Api::<KubeEvent>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    Ok(list.items.iter().any(|e| {
        e.reason.as_deref() == Some(reason)
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
    }))
}

/// The row of `workload` reading the copy of `db` on `cluster` in a `status -o json` report.
fn reader<'a>(report_rows: &'a [Value], cluster: &str, workload: &str) -> &'a Value {
    report_rows
        .iter()
        .find(|r| r["cluster"] == cluster && r["name"] == "db" && r["workload"] == workload)
        .unwrap_or_else(|| panic!("no row for {workload} on {cluster}: {report_rows:#?}"))
}

#[tokio::test]
async fn status_shows_the_rollout_watchers_hold_on_a_held_workload_and_not_on_a_restamped_one()
-> anyhow::Result<()> {
    let f = Fleet::new("st-holds").await?;
    let d1 = control_plane().cluster(DOWNSTREAM_1);
    let d1_kubeconfig = d1.kubeconfig.display().to_string();
    ensure_hash_key(&f.down1).await?;
    let dest = fresh_namespace_with_labels(
        &f.down1,
        "st-holds-dest",
        &[("helmop.dev/rollout-on-change", "enabled")],
    )
    .await?;
    let webhook = LocalWebhook::start(f.down1.clone(), Config::default()).await?;
    WebhookRegistration::new(
        WebhookKind::Mutating,
        &format!("{dest}-stamp"),
        &format!("{}/mutate/workloads", webhook.url),
        &webhook.ca_pem,
    )
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "apps",
        "v1",
        &["deployments"],
    ))
    .only_namespace(&dest)
    .register(&f.down1)
    .await?;

    create_secret(
        &f.upstream,
        &f.ns,
        "db",
        &[("password", b"p1"), ("user", b"u")],
    )
    .await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    helmop(&["propagate", "app", "-n", &f.ns]).await?.expect(0);

    // Two readers of the copy: `web` requires its key `password`, `other` reads it whole.
    let deployments: Api<Deployment> = Api::namespaced(f.down1.clone(), &dest);
    for (name, container) in [
        (
            "web",
            json!({"env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]}),
        ),
        ("other", json!({"envFrom": [{"secretRef": {"name": "db"}}]})),
    ] {
        let mut d = deployment_manifest(&dest, name, json!({}), container);
        d["spec"]["replicas"] = json!(0);
        let d: Deployment = serde_json::from_value(d)?;
        deployments.create(&PostParams::default(), &d).await?;
    }

    let mut w = PluginProcess::spawn(
        &[
            "rollout",
            "-n",
            &dest,
            "--watch",
            "--kubeconfig",
            &d1_kubeconfig,
            "-o",
            "json",
            "--no-leader-election",
            "--debounce",
            "0s",
            "--min-roll-interval",
            "0s",
            "--flap-changes",
            "0",
        ],
        &[("HELMOP_LOG", "info")],
    )?;
    w.wait_event("the watcher synced", WAIT, 0, |e| e["event"] == "synced")
        .await?;

    // The key `web` requires goes from the copy (edited downstream): `web` is held, `other`
    // restamped.
    let copies: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(f.down1.clone(), &dest);
    copies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Json::<()>(serde_json::from_value(json!([
                {"op": "remove", "path": "/data/password"}
            ]))?),
        )
        .await?;
    let held = w
        .wait_event("web held", WAIT, 0, |e| {
            e["event"] == "held" && e["workload"].as_str().is_some_and(|n| n.ends_with("/web"))
        })
        .await?;
    assert_eq!(held["hold"], "missing", "{held}");
    wait_until(
        "Events RestampHeld on web and Restamped on other",
        WAIT,
        || async {
            Ok(has_event(&f.down1, &dest, "web", "RestampHeld").await?
                && has_event(&f.down1, &dest, "other", "Restamped").await?)
        },
    )
    .await?;

    let cluster = format!("{}/down1", f.ns);
    let report = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let r = rows(&report);
    let web = reader(&r, &cluster, "Deployment/web");
    assert_eq!(web["hold"]["reason"], "RestampHeld", "{web:#}");
    assert!(
        web["hold"]["note"]
            .as_str()
            .is_some_and(|n| n.contains("password")),
        "{web:#}"
    );
    let other = reader(&r, &cluster, "Deployment/other");
    assert!(other.get("hold").is_none(), "{other:#}");
    assert_eq!(report["notes"], json!([]), "{report:#}");
    // In a table, the state says it (and -o wide why).
    let table = helmop(&["status", "app", "-n", &f.ns, "-o", "wide"])
        .await?
        .expect(0);
    let line = table
        .stdout
        .lines()
        .find(|l| l.contains("Deployment/web"))
        .unwrap_or_else(|| panic!("no row for web:\n{}", table.stdout));
    assert!(line.contains("(held: missing)"), "{line}");
    assert!(line.contains("held (missing): "), "{line}");

    // The key is back: `web` is restamped, and no longer held.
    let skip = w.events().len();
    copies
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"password": "p2"}})),
        )
        .await?;
    w.wait_event("web restamped", WAIT, skip, |e| {
        e["event"] == "restamped" && e["workload"].as_str().is_some_and(|n| n.ends_with("/web"))
    })
    .await?;
    wait_until("an Event Restamped on web", WAIT, || async {
        has_event(&f.down1, &dest, "web", "Restamped").await
    })
    .await?;
    let report = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let r = rows(&report);
    for workload in ["Deployment/web", "Deployment/other"] {
        let row = reader(&r, &cluster, workload);
        assert!(row.get("hold").is_none(), "{row:#}");
    }
    drop(w);
    drop(webhook);
    Ok(())
}
