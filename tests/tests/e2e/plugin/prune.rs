//! `prune` deletes exactly the stale copies, and nothing when the clusters cannot be listed.

use helmop_tests::*;
use std::time::Duration;

use kube::api::DeleteParams;

use super::support::*;

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

/// A copy whose source cannot be read upstream (here: its source namespace is outside what the
/// prune may read) is neither deleted nor called an orphan: the row is `Failed` and prune exits 2,
/// so "nothing pruned" is never mistaken for "nothing to prune".
#[tokio::test]
async fn a_source_that_cannot_be_read_fails_the_prune_and_deletes_nothing() -> anyhow::Result<()> {
    let f = Fleet::new("pa-prune-unread").await?;
    let apps = f.dest("apps");
    let elsewhere = fresh_namespace(&f.upstream, "pa-prune-unread-src").await?;
    let source = create_secret(&f.upstream, &elsewhere, "g", &[("k", b"g")]).await?;
    create_secret(&f.upstream, &f.ns, "a", &[("k", b"a")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n- {{kind: Secret, name: a}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    let out = helmop(&["propagate", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let id = out["upstreamId"].as_str().unwrap_or_default().to_string();
    // A copy of `elsewhere/g` owned by a HelmOp of this namespace that is gone: stale, and its
    // markers name a real source with the right uid.
    let uid = source.metadata.uid.clone().unwrap_or_default();
    create(
        &f.down1,
        &secret_obj(
            &apps,
            "g",
            "Opaque",
            &[("k", b"g")],
            &[("helmop.dev/managed-by", "kubectl-helmop")],
            &[
                ("helmop.dev/owners", &format!("{id}/{}/gone", f.ns)),
                ("helmop.dev/source", &format!("{id}/{elsewhere}/Secret/g")),
                ("helmop.dev/source-uid", &uid),
            ],
        ),
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let blind =
        limited_kubeconfig(&f.upstream, &f.ns, dir.path(), "blind", FLEET_READS, true).await?;
    let failed = run_with(&blind, &["prune", "-n", &f.ns, "-o", "json"], &[])
        .await?
        .expect(2);
    let report = failed.json();
    let report_rows = rows(&report);
    let r = row(&report_rows, &format!("{}/down1", f.ns), "g");
    assert_eq!(r["state"], "Failed", "{report:#}");
    let reason = r["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("cannot verify its source") && reason.ends_with("left alone"),
        "{reason}"
    );
    assert!(get_secret(&f.down1, &apps, "g").await?.is_some());
    assert!(get_secret(&f.down1, &apps, "a").await?.is_some());
    // Whoever may read the source prunes it.
    let pruned = helmop(&["prune", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(
        row(&rows(&pruned), &format!("{}/down1", f.ns), "g")["state"],
        "Pruned",
        "{pruned:#}"
    );
    assert!(get_secret(&f.down1, &apps, "g").await?.is_none());
    Ok(())
}

/// prune lists the HelmOps first and deletes later (minutes later, behind a slow cluster). A HelmOp
/// created in between, whose copy `propagate` made meanwhile, keeps it: the wants are listed again
/// after each cluster is observed, right before anything there is deleted.
#[tokio::test]
async fn a_copy_wanted_by_a_helmop_created_while_prune_runs_is_kept() -> anyhow::Result<()> {
    let f = Fleet::new("pa-prune-race").await?;
    let apps = f.dest("apps");
    create_secret(&f.upstream, &f.ns, "wanted", &[("k", b"wanted")]).await?;
    create_secret(&f.upstream, &f.ns, "stale", &[("k", b"stale")]).await?;
    let wanting = |names: &[&str]| {
        let entries: String = names
            .iter()
            .map(|n| format!("- {{kind: Secret, name: {n}}}\n"))
            .collect();
        format!(
            "defaultNamespace: {apps}\ndownstreamResources:\n{entries}targets:\n- clusterName: down1\n"
        )
    };
    f.helmop(&helmop_yaml("old", &wanting(&["wanted", "stale"])))
        .await?;
    helmop(&["propagate", "-n", &f.ns]).await?.expect(0);
    fleet_api(&f.upstream, &f.ns, &helmop_resource())
        .delete("old", &DeleteParams::default())
        .await?;
    // wanted and stale are stale now. prune lists the HelmOps, then waits; meanwhile a new HelmOp wants `wanted`
    // and propagate gives it the copy.
    let run = Paused::start(
        "prune-after-list",
        "upstream",
        &["prune", "-n", &f.ns, "-o", "json"],
    )
    .await?;
    f.helmop(&helmop_yaml("new", &wanting(&["wanted"]))).await?;
    helmop(&["propagate", "new", "-n", &f.ns]).await?.expect(0);
    run.release()?;
    let mut process = run.process;
    let status = process.wait_exit(Duration::from_secs(120)).await?;
    let report: serde_json::Value = serde_json::from_str(&process.lines().join("\n"))
        .map_err(|e| anyhow::anyhow!("{e}: {}", process.context()))?;
    assert_eq!(status.code(), Some(0), "{report:#}");
    let report_rows = rows(&report);
    let d1 = format!("{}/down1", f.ns);
    let wanted = row(&report_rows, &d1, "wanted");
    assert_eq!(wanted["state"], "Kept", "{report:#}");
    assert!(
        wanted["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("{}/new", f.ns))),
        "{wanted}"
    );
    assert_eq!(
        row(&report_rows, &d1, "stale")["state"],
        "Pruned",
        "{report:#}"
    );
    let copy = some(get_secret(&f.down1, &apps, "wanted").await?, "wanted")?;
    assert!(
        annotation(&copy.metadata, "helmop.dev/owners")
            .is_some_and(|o| o.split(',').any(|o| o.ends_with("/new"))),
        "{:?}",
        copy.metadata.annotations
    );
    assert!(get_secret(&f.down1, &apps, "stale").await?.is_none());
    // Run again: `wanted` is wanted by new alone; whatever of old's ownership propagate left goes.
    helmop(&["prune", "-n", &f.ns]).await?.expect(0);
    let copy = some(get_secret(&f.down1, &apps, "wanted").await?, "wanted")?;
    assert_eq!(
        annotation(&copy.metadata, "helmop.dev/owners"),
        Some(
            format!(
                "{}/{}/new",
                report["upstreamId"].as_str().unwrap_or_default(),
                f.ns
            )
            .as_str()
        )
    );
    Ok(())
}
