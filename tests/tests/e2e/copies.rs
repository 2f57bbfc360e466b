//! The copies' write path end to end (rules in
//! docs/copy-lifecycle.md): `--dry-run` is the real run without writes, a recreated source
//! keeps its copies, labels follow the source, new copies are created and never merged into an
//! object that appeared meanwhile, a run killed before restamping is repaired by the next, and
//! copies edited downstream are `Drifted` until repaired. The real binary against the shared
//! control plane, Fleet Clusters registered per test in a fresh namespace.

use std::collections::BTreeMap;
use std::time::Duration;

use helmop_tests::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::plugin::support::*;

const RUN: Duration = Duration::from_secs(120);

/// `cluster namespace kind/name [workload] -> (state, reason)` of a JSON report, with dry-run
/// states put in the past tense of the real run (`Create` -> `Created`).
fn outcomes(report: &Value) -> BTreeMap<String, (String, String)> {
    let tense = |s: &str| -> String {
        match s {
            "Create" => "Created",
            "Update" => "Updated",
            "Recreate" => "Recreated",
            "Restamp" => "Restamped",
            other => other,
        }
        .to_string()
    };
    rows(report)
        .iter()
        .map(|r| {
            let key = row_key(r);
            let state = tense(r["state"].as_str().unwrap_or_default());
            let reason = r["reason"].as_str().unwrap_or_default().to_string();
            (key, (state, reason))
        })
        .collect()
}

/// Runs `propagate` for one HelmOp with `-o json` (plus `extra`) and returns exit code and report.
async fn propagate(f: &Fleet, helmop_name: &str, extra: &[&str]) -> anyhow::Result<(i32, Value)> {
    let mut args = vec!["propagate", helmop_name, "-n", &f.ns, "-o", "json"];
    args.extend_from_slice(extra);
    let out = helmop(&args).await?;
    let code = out.code;
    Ok((code, out.json()))
}

async fn status(f: &Fleet, helmop_name: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let out = helmop(&["status", helmop_name, "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    Ok(states(&out.json()))
}

fn config_map_obj(ns: &str, name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..ObjectMeta::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..ConfigMap::default()
    }
}

/// A namespace downstream that stays `Terminating`: it holds a ConfigMap `hold` with a
/// finalizer nobody removes until [`release_terminating`].
async fn terminating_namespace(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}}))?;
    namespaces
        .create(&PostParams::default(), &namespace)
        .await?;
    let mut hold = config_map_obj(ns, "hold", &[]);
    hold.metadata.finalizers = Some(vec!["helmop.dev/test-hold".into()]);
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &hold)
        .await?;
    namespaces.delete(ns, &DeleteParams::default()).await?;
    wait_until(
        "the namespace to be terminating",
        DEFAULT_TIMEOUT,
        || async {
            Ok(namespaces
                .get_opt(ns)
                .await?
                .is_some_and(|n| n.metadata.deletion_timestamp.is_some()))
        },
    )
    .await
}

/// Lets a namespace made by [`terminating_namespace`] go.
async fn release_terminating(client: &kube::Client, ns: &str) -> anyhow::Result<()> {
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .patch(
            "hold",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"finalizers": null}})),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn dry_run_reports_exactly_what_the_real_run_then_does() -> anyhow::Result<()> {
    let f = Fleet::new("cp-dry").await?;
    let (apps, gone) = (f.dest("apps"), f.dest("gone"));
    create(
        &f.upstream,
        &secret_obj(&f.ns, "typed", "Opaque", &[("k", b"v")], &[], &[]),
    )
    .await?;
    Api::<ConfigMap>::namespaced(f.upstream.clone(), &f.ns)
        .create(
            &PostParams::default(),
            &config_map_obj(&f.ns, "frozen", &[("mode", "one")]),
        )
        .await?;
    create_secret(&f.upstream, &f.ns, "db", &[("password", b"pw")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\n\
             downstreamResources:\n- {{kind: Secret, name: typed}}\n- {{kind: ConfigMap, name: frozen}}\n\
             targets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    let (code, first) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{first:#}");

    // Scenario 1: the source Secret is recreated with another type (a type cannot change in
    // place, on the source or on the copy).
    Api::<Secret>::namespaced(f.upstream.clone(), &f.ns)
        .delete("typed", &DeleteParams::default())
        .await?;
    create(
        &f.upstream,
        &secret_obj(
            &f.ns,
            "typed",
            "example.com/other",
            &[("k", b"v2")],
            &[],
            &[],
        ),
    )
    .await?;
    // Scenario 2: the copy was made immutable downstream, and the source changes.
    let frozen_copies: Api<ConfigMap> = Api::namespaced(f.down1.clone(), &apps);
    frozen_copies
        .patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(&json!({"immutable": true})),
        )
        .await?;
    Api::<ConfigMap>::namespaced(f.upstream.clone(), &f.ns)
        .patch(
            "frozen",
            &PatchParams::default(),
            &Patch::Merge(&json!({"data": {"mode": "two"}})),
        )
        .await?;
    // Scenario 3: a HelmOp copying into a namespace that is being deleted.
    terminating_namespace(&f.down1, &gone).await?;
    f.helmop(&helmop_yaml(
        "late",
        &format!(
            "defaultNamespace: {gone}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;

    let typed_before = some(get_secret(&f.down1, &apps, "typed").await?, "typed copy")?;
    let frozen_before = some(frozen_copies.get_opt("frozen").await?, "frozen copy")?;
    let mut dry = BTreeMap::new();
    let mut real = BTreeMap::new();
    for helmop_name in ["app", "late"] {
        let (dry_code, d) = propagate(&f, helmop_name, &["--dry-run"]).await?;
        assert_eq!(writes(&d), 0, "{d:#}");
        let (real_code, r) = propagate(&f, helmop_name, &[]).await?;
        assert_eq!(dry_code, real_code, "exit codes\ndry: {d:#}\nreal: {r:#}");
        dry.extend(outcomes(&d));
        real.extend(outcomes(&r));
    }
    assert_eq!(dry, real, "dry run and real run differ");
    let c = format!("{}/down1", f.ns);
    assert_eq!(
        real.get(&format!("{c} {apps} Secret/typed"))
            .map(|o| o.0.as_str()),
        Some("Recreated"),
        "{real:#?}"
    );
    assert_eq!(
        real.get(&format!("{c} {apps} ConfigMap/frozen"))
            .map(|o| o.0.as_str()),
        Some("Recreated"),
        "{real:#?}"
    );
    let late = real
        .get(&format!("{c} {gone} Secret/db"))
        .unwrap_or_else(|| panic!("no row for the terminating namespace: {real:#?}"));
    assert_eq!(late.0, "Failed");
    assert!(late.1.contains("being deleted"), "{late:?}");

    // The real run did what it said: new objects with the source's type and content.
    let typed = some(get_secret(&f.down1, &apps, "typed").await?, "typed copy")?;
    assert_eq!(typed.type_.as_deref(), Some("example.com/other"));
    assert_ne!(typed.metadata.uid, typed_before.metadata.uid);
    assert_eq!(typed.data.unwrap_or_default()["k"].0, b"v2");
    let frozen = some(frozen_copies.get_opt("frozen").await?, "frozen copy")?;
    assert_ne!(frozen.metadata.uid, frozen_before.metadata.uid);
    assert_eq!(frozen.data.unwrap_or_default()["mode"], "two");
    assert_eq!(frozen.immutable, None, "a copy is created updatable");
    let (code, again) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{again:#}");
    assert_eq!(writes(&again), 0, "{again:#}");
    release_terminating(&f.down1, &gone).await?;
    Ok(())
}

#[tokio::test]
async fn a_recreated_source_keeps_its_copies_and_an_impostor_stays_a_conflict() -> anyhow::Result<()>
{
    let f = Fleet::new("cp-recreate").await?;
    let apps = f.dest("apps");
    let first = create_secret(&f.upstream, &f.ns, "db", &[("password", b"one")]).await?;
    create_secret(&f.upstream, &f.ns, "api", &[("token", b"t")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: db}}\n- {{kind: Secret, name: api}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    // An impostor where `api` is wanted: helmop's markers for this source, but an old
    // source-uid and owners that are not this HelmOp.
    let (code, report) = propagate(&f, "app", &["--dry-run"]).await?;
    assert_eq!(code, 0, "{report:#}");
    let id = report["upstreamId"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let namespaces: Api<Namespace> = Api::all(f.down1.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": apps}}))?,
        )
        .await?;
    let impostor = create(
        &f.down1,
        &secret_obj(
            &apps,
            "api",
            "Opaque",
            &[("token", b"stolen")],
            &[("helmop.dev/managed-by", "kubectl-helmop")],
            &[
                ("helmop.dev/source", &format!("{id}/{}/Secret/api", f.ns)),
                ("helmop.dev/source-uid", "uid-of-long-ago"),
                ("helmop.dev/owners", &format!("{id}/elsewhere/other")),
            ],
        ),
    )
    .await?;
    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 1, "the impostor is a conflict: {report:#}");

    // What external secret tools do: delete the source and create it again.
    let secrets: Api<Secret> = Api::namespaced(f.upstream.clone(), &f.ns);
    secrets.delete("db", &DeleteParams::default()).await?;
    let second = create_secret(&f.upstream, &f.ns, "db", &[("password", b"two")]).await?;
    assert_ne!(first.metadata.uid, second.metadata.uid);

    let c = format!("{}/down1", f.ns);
    let st = status(&f, "app").await?;
    assert_eq!(st[&format!("{c} {apps} Secret/db")], "Stale", "{st:#?}");
    assert_eq!(st[&format!("{c} {apps} Secret/api")], "Conflict", "{st:#?}");
    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 1, "{report:#}");
    let r = rows(&report);
    let db = row(&r, &c, "db");
    assert_eq!(db["state"], "Updated", "{report:#}");
    assert!(
        db["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("source was recreated"),
        "{db}"
    );
    assert_eq!(row(&r, &c, "api")["state"], "Conflict", "{report:#}");
    let copy = some(get_secret(&f.down1, &apps, "db").await?, "db copy")?;
    assert_eq!(
        annotation(&copy.metadata, "helmop.dev/source-uid"),
        second.metadata.uid.as_deref()
    );
    assert_eq!(copy.data.unwrap_or_default()["password"].0, b"two");
    let api = some(get_secret(&f.down1, &apps, "api").await?, "impostor")?;
    assert_eq!(rv(&api.metadata), rv(&impostor.metadata), "left alone");
    let st = status(&f, "app").await?;
    assert_eq!(st[&format!("{c} {apps} Secret/db")], "Synced", "{st:#?}");
    Ok(())
}

#[tokio::test]
async fn labels_on_copies_follow_the_source_exactly() -> anyhow::Result<()> {
    let f = Fleet::new("cp-labels").await?;
    let apps = f.dest("apps");
    create(
        &f.upstream,
        &secret_obj(
            &f.ns,
            "db",
            "Opaque",
            &[("password", b"pw")],
            &[("app", "web"), ("tier", "backend")],
            &[],
        ),
    )
    .await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{report:#}");

    // The source loses `tier` and gains `team`; someone adds `extra` to the copy downstream.
    Api::<Secret>::namespaced(f.upstream.clone(), &f.ns)
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"tier": null, "team": "a"}}})),
        )
        .await?;
    Api::<Secret>::namespaced(f.down1.clone(), &apps)
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {"labels": {"extra": "x"}}})),
        )
        .await?;
    let c = format!("{}/down1", f.ns);
    let st = status(&f, "app").await?;
    assert_eq!(st[&format!("{c} {apps} Secret/db")], "Stale", "{st:#?}");
    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(row(&rows(&report), &c, "db")["state"], "Updated");
    let copy = some(get_secret(&f.down1, &apps, "db").await?, "db copy")?;
    assert_eq!(
        copy.metadata.labels.unwrap_or_default(),
        BTreeMap::from([
            ("app".to_string(), "web".to_string()),
            ("team".to_string(), "a".to_string()),
            (
                "helmop.dev/managed-by".to_string(),
                "kubectl-helmop".to_string()
            ),
        ])
    );
    let (_, again) = propagate(&f, "app", &[]).await?;
    assert_eq!(writes(&again), 0, "{again:#}");
    Ok(())
}

#[tokio::test]
async fn an_object_appearing_between_observation_and_write_is_a_conflict_left_untouched()
-> anyhow::Result<()> {
    let f = Fleet::new("cp-race").await?;
    let apps = f.dest("apps");
    create_secret(&f.upstream, &f.ns, "db", &[("password", b"pw")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    Api::<Namespace>::all(f.down1.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": apps}}))?,
        )
        .await?;
    let mut run = Paused::start(
        "after-plan",
        &format!("{}/down1", f.ns),
        &["propagate", "app", "-n", &f.ns, "-o", "json"],
    )
    .await?;
    // Someone else's Secret of the same name appears; nothing in it conflicts field by field
    // with the copy, so a merge would have succeeded.
    let theirs = create(
        &f.down1,
        &secret_obj(&apps, "db", "Opaque", &[("other", b"theirs")], &[], &[]),
    )
    .await?;
    std::fs::write(run.release_path(), b"go")?;
    let status = run.process.wait_exit(RUN).await?;
    let report: Value = serde_json::from_str(&run.process.lines().join("\n"))
        .map_err(|e| anyhow::anyhow!("{e}: {}", run.process.context()))?;
    assert_eq!(status.code(), Some(1), "{report:#}");
    let c = format!("{}/down1", f.ns);
    let r = rows(&report);
    assert_eq!(row(&r, &c, "db")["state"], "Conflict", "{report:#}");
    let after = some(get_secret(&f.down1, &apps, "db").await?, "their Secret")?;
    assert_eq!(after.metadata, theirs.metadata, "byte-for-byte untouched");
    assert_eq!(after.data, theirs.data);
    Ok(())
}

fn deployment_reading(ns: &str, name: &str, secret: &str) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": ns,
                     "labels": {"helmop.dev/rollout-on-change": "true"}},
        "spec": {
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "c", "image": "registry.invalid/app:1",
                    "envFrom": [{"secretRef": {"name": secret}}],
                }]},
            },
        },
    }))?)
}

#[tokio::test]
async fn a_run_killed_between_copy_writes_and_restamps_is_repaired_by_the_next()
-> anyhow::Result<()> {
    let f = Fleet::new("cp-kill").await?;
    let apps = f.dest("apps");
    create_secret(&f.upstream, &f.ns, "db", &[("password", b"one")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{report:#}");
    let deployments: Api<Deployment> = Api::namespaced(f.down1.clone(), &apps);
    deployments
        .create(
            &PostParams::default(),
            &deployment_reading(&apps, "web", "db")?,
        )
        .await?;
    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{report:#}");
    let restamp = |d: &Deployment| annotation(&d.metadata, "helmop.dev/restamp").map(String::from);
    let hash_of = |s: &Secret| {
        annotation(&s.metadata, "helmop.dev/content-hash")
            .unwrap_or_default()
            .to_string()
    };
    let copy = some(get_secret(&f.down1, &apps, "db").await?, "db copy")?;
    assert_eq!(
        restamp(&deployments.get("web").await?),
        Some(format!("secret/db={}", hash_of(&copy)))
    );

    // The source changes; a run writes the copy and is SIGKILLed before restamping.
    set_secret_data(&f.upstream, &f.ns, "db", json!({"password": b64(b"two")})).await?;
    let run = Paused::start(
        "before-restamp",
        &format!("{}/down1", f.ns),
        &["propagate", "app", "-n", &f.ns, "-o", "json"],
    )
    .await?;
    run.process.signal(libc::SIGKILL)?;
    drop(run);
    let copy = some(get_secret(&f.down1, &apps, "db").await?, "db copy")?;
    assert_eq!(copy.data.clone().unwrap_or_default()["password"].0, b"two");
    let new = format!("secret/db={}", hash_of(&copy));
    assert_ne!(restamp(&deployments.get("web").await?), Some(new.clone()));

    // The next run finds the copy current and the workload's record behind: it restamps.
    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{report:#}");
    let c = format!("{}/down1", f.ns);
    assert_eq!(row(&rows(&report), &c, "db")["state"], "Unchanged");
    let restamped = rows(&report)
        .into_iter()
        .find(|r| r["workload"] == "Deployment/web")
        .unwrap_or_else(|| panic!("no restamp row: {report:#}"));
    assert_eq!(restamped["state"], "Restamped", "{report:#}");
    assert_eq!(restamp(&deployments.get("web").await?), Some(new));
    let (_, again) = propagate(&f, "app", &[]).await?;
    assert_eq!(writes(&again), 0, "{again:#}");
    Ok(())
}

/// A run writes every cluster's copies before it restamps any reader, and a cluster whose
/// restamps do not finish within `--cluster-timeout` keeps its written copies: its readers are
/// reported `Failed` (exit 2) and restamped by the next run.
#[tokio::test]
async fn copies_reach_every_cluster_before_any_reader_is_restamped() -> anyhow::Result<()> {
    let f = Fleet::new("cp-passes").await?;
    let apps = f.dest("apps");
    create_secret(&f.upstream, &f.ns, "db", &[("password", b"one")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterSelector: {{matchLabels: {{env: prod}}}}\n"
        ),
    ))
    .await?;
    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{report:#}");
    let readers = [&f.down1, &f.down2].map(|c| Api::<Deployment>::namespaced(c.clone(), &apps));
    for api in &readers {
        api.create(
            &PostParams::default(),
            &deployment_reading(&apps, "web", "db")?,
        )
        .await?;
    }
    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{report:#}");
    let restamp = |d: &Deployment| annotation(&d.metadata, "helmop.dev/restamp").map(String::from);
    let before = readers[0].get("web").await?;

    // One cluster at a time: in one pass per cluster, down2 would not have been started while
    // down1 waits before its restamps.
    set_secret_data(&f.upstream, &f.ns, "db", json!({"password": b64(b"two")})).await?;
    let (c1, c2) = (format!("{}/down1", f.ns), format!("{}/down2", f.ns));
    let mut run = Paused::start(
        "before-restamp",
        &c1,
        &[
            "propagate",
            "app",
            "-n",
            &f.ns,
            "-o",
            "json",
            "--concurrency",
            "1",
            "--cluster-timeout",
            "5s",
        ],
    )
    .await?;
    for (cluster, client) in [("down1", &f.down1), ("down2", &f.down2)] {
        let copy = some(get_secret(client, &apps, "db").await?, "db copy")?;
        assert_eq!(
            copy.data.clone().unwrap_or_default()["password"].0,
            b"two",
            "{cluster}'s copy is written while down1 waits to restamp"
        );
    }
    assert_eq!(restamp(&readers[0].get("web").await?), restamp(&before));

    // down1's restamps run out of their deadline at the pause; down2's pause is released.
    let marker = format!("helmop-test: paused at before-restamp on {c2}");
    wait_until("down2 to pause before its restamps", RUN, || {
        let seen = run.process.stderr().contains(&marker);
        async move { Ok(seen) }
    })
    .await?;
    run.release()?;
    let status = run.process.wait_exit(RUN).await?;
    let report: Value = serde_json::from_str(&run.process.lines().join("\n"))
        .map_err(|e| anyhow::anyhow!("{e}: {}", run.process.context()))?;
    assert_eq!(status.code(), Some(2), "{report:#}");
    let r = rows(&report);
    assert_eq!(row(&r, &c1, "db")["state"], "Updated", "{report:#}");
    assert_eq!(row(&r, &c2, "db")["state"], "Updated", "{report:#}");
    let left: Vec<&Value> = r
        .iter()
        .filter(|x| x["cluster"] == c1.as_str() && x["state"] == "Failed")
        .collect();
    assert_eq!(left.len(), 1, "{report:#}");
    assert_eq!(left[0]["namespace"], apps.as_str());
    let reason = left[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("readers not restamped: no answer within --cluster-timeout 5s"),
        "{reason}"
    );
    assert_eq!(on_rows(&report, &c1), Vec::<String>::new(), "{report:#}");
    assert_eq!(on_rows(&report, &c2), ["Restamped"], "{report:#}");
    let hash_of = |s: &Secret| {
        annotation(&s.metadata, "helmop.dev/content-hash")
            .unwrap_or_default()
            .to_string()
    };
    let copy = some(get_secret(&f.down1, &apps, "db").await?, "db copy")?;
    let new = Some(format!("secret/db={}", hash_of(&copy)));
    assert_ne!(restamp(&readers[0].get("web").await?), new);

    // The next run restamps what the deadline left.
    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(on_rows(&report, &c1), ["Restamped"], "{report:#}");
    assert_eq!(restamp(&readers[0].get("web").await?), new);
    Ok(())
}

/// The states of the rows about `Deployment/web` on `cluster`.
fn on_rows(report: &Value, cluster: &str) -> Vec<String> {
    rows(report)
        .iter()
        .filter(|x| x["cluster"] == cluster && x["workload"] == "Deployment/web")
        .filter_map(|x| x["state"].as_str().map(String::from))
        .collect()
}

#[tokio::test]
async fn a_copy_edited_downstream_is_drifted_until_the_next_run_repairs_it() -> anyhow::Result<()> {
    let f = Fleet::new("cp-drift").await?;
    let apps = f.dest("apps");
    create_secret(&f.upstream, &f.ns, "db", &[("password", b"right")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{report:#}");
    let c = format!("{}/down1", f.ns);
    let key = format!("{c} {apps} Secret/db");
    assert_eq!(status(&f, "app").await?[&key], "Synced");

    // Someone edits the copy's data downstream (a value changed, a key added).
    set_secret_data(
        &f.down1,
        &apps,
        "db",
        json!({"password": b64(b"wrong"), "added": b64(b"x")}),
    )
    .await?;
    let out = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert!(
        !out.stdout.contains(&b64(b"wrong")),
        "no data in the report"
    );
    let st = states(&out.json());
    assert_eq!(st[&key], "Drifted", "{st:#?}");

    let (code, report) = propagate(&f, "app", &[]).await?;
    assert_eq!(code, 0, "{report:#}");
    let db = row(&rows(&report), &c, "db").clone();
    assert_eq!(db["state"], "Updated", "{report:#}");
    assert!(
        db["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("edited downstream"),
        "{db}"
    );
    let copy = some(get_secret(&f.down1, &apps, "db").await?, "db copy")?;
    let data = copy.data.unwrap_or_default();
    assert_eq!(data.keys().collect::<Vec<_>>(), ["password"]);
    assert_eq!(data["password"].0, b"right");
    assert_eq!(status(&f, "app").await?[&key], "Synced");
    Ok(())
}

#[tokio::test]
async fn an_entry_of_a_kind_helmop_cannot_copy_is_reported_not_dropped() -> anyhow::Result<()> {
    let f = Fleet::new("cp-kind").await?;
    let apps = f.dest("apps");
    create_secret(&f.upstream, &f.ns, "db", &[("password", b"pw")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Service, name: web}}\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    for args in [
        vec!["propagate", "app", "-n", &f.ns, "--dry-run", "-o", "json"],
        vec!["propagate", "app", "-n", &f.ns, "-o", "json"],
        vec!["status", "app", "-n", &f.ns, "-o", "json"],
    ] {
        let out = helmop(&args).await?.expect(1).json();
        let r = rows(&out);
        let bad = row(&r, "-", "web");
        assert_eq!(bad["state"], "Invalid", "{out:#}");
        assert_eq!(bad["kind"], "Service", "{out:#}");
        assert!(
            bad["reason"]
                .as_str()
                .unwrap_or_default()
                .contains("only Secret and ConfigMap"),
            "{bad}"
        );
    }
    // The valid entry was still copied.
    assert!(get_secret(&f.down1, &apps, "db").await?.is_some());
    Ok(())
}

#[tokio::test]
async fn a_lost_hash_key_is_never_replaced_silently() -> anyhow::Result<()> {
    // Deleting the upstream's hash key needs an upstream of our own.
    let cp = ControlPlane::start(&["cp-kup", "cp-kd1"])?;
    let upstream = cp.cluster("cp-kup").client().await;
    let down = cp.cluster("cp-kd1").client().await;
    let ns = fresh_namespace(&upstream, "cp-key").await?;
    register_fleet_cluster(&upstream, &ns, "cp-kd1", &[], cp.cluster("cp-kd1")).await?;
    create_secret(&upstream, &ns, "db", &[("k", b"v")]).await?;
    apply_helmop(
        &upstream,
        &ns,
        &helmop_yaml(
            "app",
            "defaultNamespace: apps\ndownstreamResources:\n- {kind: Secret, name: db}\ntargets:\n- clusterName: cp-kd1\n",
        ),
    )
    .await?;
    let kubeconfig = cp.cluster("cp-kup").kubeconfig.clone();
    let run = |args: &'static [&'static str]| {
        let kubeconfig = kubeconfig.clone();
        let ns = ns.clone();
        async move {
            let mut full: Vec<&str> = args.to_vec();
            full.extend(["-n", &ns, "-o", "json"]);
            run_with(&kubeconfig, &full, &[]).await
        }
    };
    let first = run(&["propagate", "app"]).await?.expect(0).json();
    assert_eq!(first["hashKey"], "created", "{first:#}");
    let keys: Api<Secret> = Api::namespaced(upstream.clone(), "helmop-system");
    keys.delete("helmop-hash-key", &DeleteParams::default())
        .await?;
    let copy = some(get_secret(&down, "apps", "db").await?, "db copy")?;
    let d1 = format!("{ns}/cp-kd1");

    // status says why the copy is not confirmed.
    let status = run(&["status", "app"]).await?.expect(0).json();
    let r = rows(&status);
    let db = row(&r, &d1, "db");
    assert_eq!(db["state"], "Stale", "{status:#}");
    let reason = db["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("another hash key"), "{reason}");

    // propagate refuses to make a new key (dry and real alike) and writes nothing.
    for args in [
        &["propagate", "app", "--dry-run"][..],
        &["propagate", "app"][..],
    ] {
        let out = run(args).await?.expect(1);
        assert!(
            out.stderr
                .contains("helmop-system/helmop-hash-key is missing")
                && out.stderr.contains("--new-hash-key"),
            "{}",
            out.stderr
        );
    }
    assert!(keys.get_opt("helmop-hash-key").await?.is_none());
    let same = some(get_secret(&down, "apps", "db").await?, "db copy")?;
    assert_eq!(rv(&same.metadata), rv(&copy.metadata));

    // Asked to, it makes a new key and rehashes, saying so.
    let out = run(&["propagate", "app", "--new-hash-key"])
        .await?
        .expect(0)
        .json();
    assert_eq!(out["hashKey"], "created", "{out:#}");
    let r = rows(&out);
    let db = row(&r, &d1, "db");
    assert_eq!(db["state"], "Updated", "{out:#}");
    assert!(
        db["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("another hash key"),
        "{db}"
    );
    let status = run(&["status", "app"]).await?.expect(0).json();
    assert!(
        states(&status).values().all(|s| s == "Synced"),
        "{status:#}"
    );
    Ok(())
}

/// The pause points are test hooks: SIGTERM ends a run parked at one (nothing written), and the
/// release binary, which the images ship, has none, whatever `HELMOP_TEST_PAUSE` says.
#[tokio::test]
async fn pause_points_are_test_builds_only_and_sigterm_ends_a_parked_run() -> anyhow::Result<()> {
    let f = Fleet::new("cp-hooks").await?;
    let apps = f.dest("apps");
    create_secret(&f.upstream, &f.ns, "db", &[("password", b"pw")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    let args = ["propagate", "app", "-n", &f.ns, "-o", "json"];
    let mut run = Paused::start("after-plan", &format!("{}/down1", f.ns), &args).await?;
    run.process.signal(libc::SIGTERM)?;
    let status = run.process.wait_exit(Duration::from_secs(20)).await?;
    assert_eq!(status.code(), Some(143), "{}", run.process.context());
    assert!(get_secret(&f.down1, &apps, "db").await?.is_none());

    let release = helmop_tests::images::release_dir()?.join("kubectl-helmop");
    let kubeconfig = control_plane().upstream().kubeconfig.display().to_string();
    let out = tokio::time::timeout(
        RUN,
        tokio::process::Command::new(&release)
            .args(args)
            .args(["--kubeconfig", &kubeconfig])
            .env_remove("KUBECONFIG")
            .env("HELMOP_TEST_PAUSE", "after-plan:/nonexistent/never")
            .kill_on_drop(true)
            .output(),
    )
    .await
    .map_err(|_| anyhow::anyhow!("the release binary waited at a pause point"))??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("helmop-test: paused"), "{stderr}");
    assert!(get_secret(&f.down1, &apps, "db").await?.is_some());
    Ok(())
}
