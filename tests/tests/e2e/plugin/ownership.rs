//! Whose objects `propagate` may write: a same-named object helmop does not own is a conflict until adopted, and
//! copies Fleet's own agent manages are left alone but compared.

use helmop_tests::*;
use helmop_webhook::state::Config;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use std::time::Duration;

use super::support::*;

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
    let fleet_cfg =
        fleets_agent_copy(&Api::namespaced(f.down1.clone(), &dest), "cfg", "old").await?;
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

/// Readers of copies Fleet's agent makes: Fleet "redeploys" the release after copying, but Helm
/// re-applies an unchanged Deployment as a no-op, so no UPDATE reaches the webhook. `status` says
/// where each reader stands from live reads, and `propagate` restamps one whose stamp is behind, once.
#[tokio::test]
async fn readers_of_fleet_managed_copies_are_reported_and_restamped_once() -> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams};
    use serde_json::json;

    let f = Fleet::new("pa-fleet-readers").await?;
    let FleetReader {
        dest,
        webhook,
        copies,
        deployments,
        first,
    } = fleet_reader(&f, "pa-fleet-readers-dest").await?;
    let d1 = format!("{}/down1", f.ns);
    let reader = |report: &serde_json::Value| {
        rows(report)
            .into_iter()
            .find(|r| r["cluster"] == d1.as_str() && r["workload"] == "Deployment/web")
    };
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .json();
    let r = reader(&status).ok_or_else(|| anyhow::anyhow!("no reader row: {status:#}"))?;
    assert_eq!(r["state"], "Current", "{r}");
    assert_eq!(r["name"], "cfg");

    // Fleet's agent copies a new version (the source changed upstream): the reader is behind.
    let patch = Patch::Merge(json!({"data": {"mode": "v2"}}));
    Api::<ConfigMap>::namespaced(f.upstream.clone(), &f.ns)
        .patch("cfg", &PatchParams::default(), &patch)
        .await?;
    copies.patch("cfg", &PatchParams::default(), &patch).await?;
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .json();
    let r = reader(&status).ok_or_else(|| anyhow::anyhow!("no reader row: {status:#}"))?;
    assert_eq!(r["state"], "RolloutPending", "{r}");
    assert_eq!(
        stamp(&deployments.get("web").await?).as_deref(),
        Some(first.as_str())
    );

    // A dry run says so and writes nothing; the real run restamps it, once.
    let dry = helmop(&["propagate", "app", "-n", &f.ns, "--dry-run", "-o", "json"])
        .await?
        .json();
    assert_eq!(
        reader(&dry).map(|r| r["state"].clone()),
        Some(json!("Restamp")),
        "{dry:#}"
    );
    assert_eq!(
        stamp(&deployments.get("web").await?).as_deref(),
        Some(first.as_str())
    );
    let out = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let r = reader(&out).ok_or_else(|| anyhow::anyhow!("no restamp row: {out:#}"))?;
    assert_eq!(r["state"], "Restamped", "{r}");
    let second = stamp(&deployments.get("web").await?);
    assert!(second.is_some() && second.as_deref() != Some(first.as_str()));
    let again = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(writes(&again), 0, "{again:#}");
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .json();
    assert_eq!(
        reader(&status).map(|r| r["state"].clone()),
        Some(json!("Current")),
        "{status:#}"
    );
    unregister_webhook(&f.down1, WebhookKind::Mutating, &format!("{dest}-stamp")).await?;
    drop(webhook);
    Ok(())
}

/// `propagate --watch` learns from the HelmOp's BundleDeployment that Fleet's agent copied the
/// downstream resources anew (its status), and restamps the copies' readers without waiting for the
/// resync (which is off here). Which status writes trigger is `applied_id`'s unit test.
#[tokio::test]
async fn watch_restamps_readers_when_fleets_agent_reports_a_new_copy() -> anyhow::Result<()> {
    use kube::api::{Patch, PatchParams};
    use serde_json::json;

    let f = Fleet::new("pa-fleet-bd").await?;
    let FleetReader {
        dest,
        webhook,
        copies,
        deployments,
        first,
    } = fleet_reader(&f, "pa-fleet-bd-dest").await?;
    let bds = fleet_api(&f.upstream, &f.ns, &bundle_deployment_resource());
    create_fleet_object(
        &f.upstream,
        &f.ns,
        &bundle_deployment_resource(),
        json!({
            "metadata": {"name": "app", "labels": {
                "fleet.cattle.io/bundle-name": "app",
                "fleet.cattle.io/bundle-namespace": f.ns,
                "fleet.cattle.io/cluster": "down1",
                "fleet.cattle.io/cluster-namespace": f.ns,
            }},
            "spec": {"deploymentID": "s-1:abc", "downstreamResourcesGeneration": 1},
        }),
    )
    .await?;
    let agent = |generation: i64| {
        Patch::Merge(
            json!({"status": {"appliedDeploymentID": "s-1:abc", "downstreamResourcesGeneration": generation}}),
        )
    };
    bds.patch_status("app", &PatchParams::default(), &agent(1))
        .await?;
    let kubeconfig = control_plane().upstream().kubeconfig.display().to_string();
    let mut w = PluginProcess::spawn(
        &[
            "propagate",
            "-n",
            &f.ns,
            "--watch",
            "--kubeconfig",
            &kubeconfig,
            "--no-leader-election",
            "--resync",
            "0",
            "--debounce",
            "200ms",
            "-o",
            "json",
        ],
        &[("HELMOP_LOG", "info")],
    )?;
    w.wait_event("the first run", Duration::from_secs(60), 0, |e| {
        e["event"] == "run"
    })
    .await?;
    // Fleet's agent copies a new version, then reports it: the run restamps the reader.
    let patch = Patch::Merge(json!({"data": {"mode": "v2"}}));
    Api::<ConfigMap>::namespaced(f.upstream.clone(), &f.ns)
        .patch("cfg", &PatchParams::default(), &patch)
        .await?;
    let skip = w.events().len();
    copies.patch("cfg", &PatchParams::default(), &patch).await?;
    bds.patch_status("app", &PatchParams::default(), &agent(2))
        .await?;
    let run = w
        .wait_event(
            "a run for the agent's report",
            Duration::from_secs(60),
            skip,
            |e| {
                e["event"] == "run"
                    && e["reasons"].as_array().is_some_and(|r| {
                        r.iter()
                            .any(|r| r.as_str().is_some_and(|r| r.contains("BundleDeployment")))
                    })
            },
        )
        .await?;
    assert!(
        run.to_string().contains("Restamped"),
        "the reader was restamped: {run}"
    );
    let second = stamp(&deployments.get("web").await?);
    assert!(second.is_some() && second.as_deref() != Some(first.as_str()));
    w.signal(libc::SIGTERM)?;
    unregister_webhook(&f.down1, WebhookKind::Mutating, &format!("{dest}-stamp")).await?;
    drop(webhook);
    Ok(())
}

const CONFIG_HASH: &str = "helmop.dev/config-hash";

/// The stamp on a Deployment's pod template.
fn stamp(d: &Deployment) -> Option<String> {
    template_annotation(d, CONFIG_HASH)
}

/// A reader of a copy Fleet's agent made on down1: a namespace stamped by a webhook of its own, the
/// ConfigMap `cfg` upstream and its copy labelled as Fleet's agent labels it, a Deployment `web`
/// reading the copy, and the HelmOp `app` listing it.
struct FleetReader {
    dest: String,
    webhook: LocalWebhook,
    copies: Api<ConfigMap>,
    deployments: Api<Deployment>,
    /// The stamp `web` got at creation.
    first: String,
}

async fn fleet_reader(f: &Fleet, prefix: &str) -> anyhow::Result<FleetReader> {
    use serde_json::json;

    ensure_hash_key(&f.down1).await?;
    let dest = fresh_namespace_with_labels(
        &f.down1,
        prefix,
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
    create_config_map(&f.upstream, &f.ns, "cfg", &[("mode", "v1")]).await?;
    // Fleet's agent's copy, current.
    let copies: Api<ConfigMap> = Api::namespaced(f.down1.clone(), &dest);
    fleets_agent_copy(&copies, "cfg", "v1").await?;
    let deployments: Api<Deployment> = Api::namespaced(f.down1.clone(), &dest);
    let web: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}},
                              "spec": {"containers": [{"name": "app", "image": "registry.example.com/app:1",
                                       "envFrom": [{"configMapRef": {"name": "cfg"}}]}]}}},
    }))?;
    deployments.create(&PostParams::default(), &web).await?;
    let first = stamp(&deployments.get("web").await?)
        .ok_or_else(|| anyhow::anyhow!("web was not stamped at creation"))?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "downstreamResources:\n- {{kind: ConfigMap, name: cfg}}\ndefaultNamespace: {dest}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    Ok(FleetReader {
        dest,
        webhook,
        copies,
        deployments,
        first,
    })
}

/// A ConfigMap `name` with `mode: MODE`, labelled as Fleet's agent labels its copies (the
/// BundleDeployment `app`).
async fn fleets_agent_copy(
    api: &Api<ConfigMap>,
    name: &str,
    mode: &str,
) -> anyhow::Result<ConfigMap> {
    let copy = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                [(
                    "fleet.cattle.io/bundledeployment".to_string(),
                    "app".to_string(),
                )]
                .into(),
            ),
            ..ObjectMeta::default()
        },
        data: Some([("mode".to_string(), mode.to_string())].into()),
        ..ConfigMap::default()
    };
    Ok(api.create(&PostParams::default(), &copy).await?)
}
