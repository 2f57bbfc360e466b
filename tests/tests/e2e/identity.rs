//! Cluster identity and prune (docs/cluster-identity.md): one physical cluster reached through
//! several endpoints or entries is planned once, the upstream id comes from the upstream
//! cluster's identity (old ids migrated), a source is never adopted or pruned, and a scoped
//! prune never deletes what any HelmOp or entry still wants. Each test runs the real plugin
//! against the shared control plane; every prune is run dry first and must announce exactly
//! what the real run then does.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use helmop_tests::*;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::config::Kubeconfig;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::plugin::support::*;

/// Accepts connections on `127.0.0.1:<port>` and forwards each to `server`'s address: a second
/// endpoint of the same API server (`https://localhost:<port>`, a name in its certificate).
async fn second_endpoint(server: &str) -> anyhow::Result<u16> {
    let target = server
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    Ok(port)
}

/// `cluster` as seen through [`second_endpoint`]: same CA, same user, another URL. The
/// kubeconfig file is written to `dir`.
async fn alias_of(cluster: &ClusterInfo, dir: &Path) -> anyhow::Result<ClusterInfo> {
    let port = second_endpoint(&cluster.server).await?;
    let yaml = cluster
        .kubeconfig_yaml()
        .replace(&cluster.server, &format!("https://localhost:{port}"));
    anyhow::ensure!(
        yaml.contains(&format!("localhost:{port}")),
        "no server {} in the kubeconfig of {}",
        cluster.server,
        cluster.name
    );
    let path = dir.join(format!("{}-alias.kubeconfig", cluster.name));
    std::fs::write(&path, yaml)?;
    Ok(ClusterInfo {
        kubeconfig: path,
        ..cluster.clone()
    })
}

/// A kubeconfig file (in `dir`) for `cluster` through a second endpoint, trusting no CA (like a
/// laptop behind a TLS-intercepting proxy): the URL and the CA both differ from `cluster`'s.
async fn proxied_kubeconfig(
    cluster: &ClusterInfo,
    dir: &Path,
) -> anyhow::Result<(PathBuf, String)> {
    let port = second_endpoint(&cluster.server).await?;
    let url = format!("https://localhost:{port}");
    let mut kc = Kubeconfig::read_from(&cluster.kubeconfig)?;
    for named in &mut kc.clusters {
        if let Some(c) = named.cluster.as_mut() {
            c.server = Some(url.clone());
            c.certificate_authority_data = None;
            c.insecure_skip_tls_verify = Some(true);
        }
    }
    let path = dir.join(format!("{}-proxied.kubeconfig", cluster.name));
    // JSON is YAML.
    std::fs::write(&path, serde_json::to_string(&kc)?)?;
    Ok((path, url))
}

/// The merged kubeconfig of the control plane plus, per `(alias, server)`, a context `alias`
/// for the cluster of context `of` (through `server` when given), written to `dir`.
fn kubeconfig_with_contexts(
    dir: &Path,
    of: &str,
    aliases: &[(&str, Option<&str>)],
) -> anyhow::Result<PathBuf> {
    let mut kc = Kubeconfig::read_from(control_plane().merged_kubeconfig())?;
    let ctx = some(
        kc.contexts.iter().find(|c| c.name == of).cloned(),
        "context in the merged kubeconfig",
    )?;
    let cluster_name = some(
        ctx.context.as_ref().map(|c| c.cluster.clone()),
        "the context's cluster",
    )?;
    for (alias, server) in aliases {
        let mut named = ctx.clone();
        named.name = alias.to_string();
        if let Some(server) = server {
            let mut cluster = some(
                kc.clusters.iter().find(|c| c.name == cluster_name).cloned(),
                "the context's cluster entry",
            )?;
            cluster.name = alias.to_string();
            if let Some(c) = cluster.cluster.as_mut() {
                c.server = Some(server.to_string());
            }
            kc.clusters.push(cluster);
            if let Some(c) = named.context.as_mut() {
                c.cluster = alias.to_string();
            }
        }
        kc.contexts.push(named);
    }
    let path = dir.join("contexts.kubeconfig");
    // JSON is YAML.
    std::fs::write(&path, serde_json::to_string(&kc)?)?;
    Ok(path)
}

/// `(namespace, kind/name, state)` of every row, with a dry run's verbs in the real run's tense,
/// so a dry run and the real run can be compared row for row.
fn outcome(report: &Value) -> BTreeSet<(String, String, String, String)> {
    rows(report)
        .iter()
        .map(|r| {
            let state = match r["state"].as_str().unwrap_or_default() {
                "Prune" => "Pruned",
                "Release" => "Released",
                "Create" => "Created",
                "Update" => "Updated",
                other => other,
            };
            (
                r["cluster"].as_str().unwrap_or_default().to_string(),
                r["namespace"].as_str().unwrap_or_default().to_string(),
                format!(
                    "{}/{}",
                    r["kind"].as_str().unwrap_or_default(),
                    r["name"].as_str().unwrap_or_default()
                ),
                state.to_string(),
            )
        })
        .collect()
}

/// Runs `prune ARGS` dry, then for real; asserts both announce the same rows and returns the
/// real report.
async fn prune_twice(kubeconfig: &Path, args: &[&str], code: i32) -> anyhow::Result<Value> {
    let mut dry_args = vec!["prune"];
    dry_args.extend_from_slice(args);
    dry_args.extend(["--dry-run", "-o", "json"]);
    let dry = run_with(kubeconfig, &dry_args, &[])
        .await?
        .expect(code)
        .json();
    assert_eq!(dry["writes"], 0, "{dry:#}");
    let mut real_args = vec!["prune"];
    real_args.extend_from_slice(args);
    real_args.extend(["-o", "json"]);
    let real = run_with(kubeconfig, &real_args, &[])
        .await?
        .expect(code)
        .json();
    assert_eq!(
        outcome(&dry),
        outcome(&real),
        "the dry run announced something else than the real run did:\n{dry:#}\n{real:#}"
    );
    Ok(real)
}

/// The row of `name` in downstream namespace `ns`.
fn row_in(report: &Value, ns: &str, name: &str) -> Value {
    rows(report)
        .into_iter()
        .find(|r| r["namespace"] == ns && r["name"] == name && r.get("workload").is_none())
        .unwrap_or_else(|| panic!("no row for {ns}/{name} in {report:#}"))
}

fn states_of(report: &Value) -> BTreeSet<String> {
    rows(report)
        .iter()
        .filter_map(|r| r["state"].as_str().map(String::from))
        .collect()
}

/// Four Fleet Clusters over two API servers, each reached directly and through a second
/// endpoint, each target copying into its own namespace.
#[tokio::test]
async fn one_cluster_behind_two_endpoints_is_planned_once_and_nothing_wanted_is_pruned()
-> anyhow::Result<()> {
    let f = Fleet::new("id-alias").await?;
    let dir = tempfile::tempdir()?;
    let cp = control_plane();
    for (name, cluster) in [("down1-alias", DOWNSTREAM_1), ("down2-alias", DOWNSTREAM_2)] {
        let alias = alias_of(cp.cluster(cluster), dir.path()).await?;
        register_fleet_cluster(&f.upstream, &f.ns, name, &[], &alias).await?;
    }
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    let ns_of = |entry: &str| f.dest(entry);
    let targets: String = ["down1", "down1-alias", "down2", "down2-alias"]
        .iter()
        .map(|c| format!("- clusterName: {c}\n  namespace: {}\n", ns_of(c)))
        .collect();
    f.helmop(&helmop_yaml(
        "app",
        &format!("downstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n{targets}"),
    ))
    .await?;
    let kubeconfig = cp.upstream().kubeconfig.clone();

    let dry = helmop(&["propagate", "app", "-n", &f.ns, "--dry-run", "-o", "json"])
        .await?
        .expect(0)
        .json();
    let out = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(outcome(&dry), outcome(&out), "{dry:#}\n{out:#}");
    assert_eq!(
        states_of(&out),
        BTreeSet::from(["Created".to_string()]),
        "{out:#}"
    );
    assert_eq!(rows(&out).len(), 4, "{out:#}");
    for (client, entries) in [
        (&f.down1, ["down1", "down1-alias"]),
        (&f.down2, ["down2", "down2-alias"]),
    ] {
        assert_eq!(
            copies_of(client, &f.ns).await?,
            entries
                .iter()
                .map(|e| place(&ns_of(e), "Secret", "db"))
                .collect()
        );
    }

    // Every entry's copy is wanted: nothing is Orphaned, whatever the scope.
    for scope in [vec!["app", "-n", f.ns.as_str()], vec!["-n", f.ns.as_str()]] {
        let mut args = vec!["status"];
        args.extend(scope.iter().copied());
        args.extend(["-o", "json"]);
        let status = helmop(&args).await?.expect(0).json();
        assert_eq!(
            states_of(&status),
            BTreeSet::from(["Synced".to_string()]),
            "{status:#}"
        );
        assert_eq!(rows(&status).len(), 4, "{status:#}");
    }
    let again = helmop(&["propagate", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(writes(&again), 0, "{again:#}");

    for scope in [vec!["app", "-n", f.ns.as_str()], vec!["-n", f.ns.as_str()]] {
        let pruned = prune_twice(&kubeconfig, &scope, 0).await?;
        assert!(
            !states_of(&pruned).contains("Pruned"),
            "a wanted copy was pruned: {pruned:#}"
        );
    }
    for (client, entries) in [
        (&f.down1, ["down1", "down1-alias"]),
        (&f.down2, ["down2", "down2-alias"]),
    ] {
        for e in entries {
            assert!(
                get_secret(client, &ns_of(e), "db").await?.is_some(),
                "the copy for {e} survived prune"
            );
        }
    }

    // Only what no entry wants goes: drop the alias targets.
    let targets: String = ["down1", "down2"]
        .iter()
        .map(|c| format!("- clusterName: {c}\n  namespace: {}\n", ns_of(c)))
        .collect();
    f.helmop(&helmop_yaml(
        "app",
        &format!("downstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n{targets}"),
    ))
    .await?;
    let pruned = prune_twice(&kubeconfig, &["-n", &f.ns], 0).await?;
    assert_eq!(
        rows(&pruned)
            .iter()
            .filter(|r| r["state"] == "Pruned")
            .count(),
        2,
        "{pruned:#}"
    );
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        BTreeSet::from([place(&ns_of("down1"), "Secret", "db")])
    );
    assert_eq!(
        copies_of(&f.down2, &f.ns).await?,
        BTreeSet::from([place(&ns_of("down2"), "Secret", "db")])
    );
    Ok(())
}

/// With `--target-context`: two contexts reaching one cluster through two URLs, each
/// copying into its own namespace (the target naming the context).
#[tokio::test]
async fn two_target_contexts_of_one_cluster_are_planned_once() -> anyhow::Result<()> {
    let f = Fleet::new("id-ctx2").await?;
    let dir = tempfile::tempdir()?;
    let port = second_endpoint(&control_plane().cluster(DOWNSTREAM_1).server).await?;
    let alias_url = format!("https://localhost:{port}");
    let kubeconfig = kubeconfig_with_contexts(
        dir.path(),
        DOWNSTREAM_1,
        &[("d1", None), ("d1-alias", Some(&alias_url))],
    )?;
    let (a, b) = (f.dest("a"), f.dest("b"));
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "downstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: d1\n  namespace: {a}\n- clusterName: d1-alias\n  namespace: {b}\n"
        ),
    ))
    .await?;
    let ctx_args = [
        "-n",
        f.ns.as_str(),
        "--context",
        "upstream",
        "--target-context",
        "d1",
        "--target-context",
        "d1-alias",
    ];
    let run = |command: &'static str, extra: &'static [&'static str]| {
        let mut args = vec![command];
        args.extend(ctx_args);
        args.extend(extra);
        args.extend(["-o", "json"]);
        let kubeconfig = kubeconfig.clone();
        async move { run_with(&kubeconfig, &args, &[]).await }
    };
    let dry = run("propagate", &["--dry-run"]).await?.expect(0).json();
    let out = run("propagate", &[]).await?.expect(0).json();
    assert_eq!(outcome(&dry), outcome(&out), "{dry:#}\n{out:#}");
    assert_eq!(rows(&out).len(), 2, "{out:#}");
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        BTreeSet::from([place(&a, "Secret", "db"), place(&b, "Secret", "db")])
    );
    let status = run("status", &[]).await?.expect(0).json();
    assert_eq!(
        states_of(&status),
        BTreeSet::from(["Synced".to_string()]),
        "{status:#}"
    );
    assert_eq!(rows(&status).len(), 2, "{status:#}");
    let pruned = prune_twice(&kubeconfig, &ctx_args, 0).await?;
    assert!(!states_of(&pruned).contains("Pruned"), "{pruned:#}");
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        BTreeSet::from([place(&a, "Secret", "db"), place(&b, "Secret", "db")])
    );
    Ok(())
}

/// An entry that cannot be identified may be any cluster: prune keeps what it wants everywhere.
#[tokio::test]
async fn prune_keeps_what_an_unidentifiable_entry_wants() -> anyhow::Result<()> {
    let f = Fleet::new("id-lost").await?;
    let dir = tempfile::tempdir()?;
    let alias = alias_of(control_plane().cluster(DOWNSTREAM_1), dir.path()).await?;
    register_fleet_cluster(&f.upstream, &f.ns, "down1-alias", &[], &alias).await?;
    let (a, b) = (f.dest("a"), f.dest("b"));
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "downstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n  namespace: {a}\n- clusterName: down1-alias\n  namespace: {b}\n"
        ),
    ))
    .await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    let both = BTreeSet::from([place(&a, "Secret", "db"), place(&b, "Secret", "db")]);
    assert_eq!(copies_of(&f.down1, &f.ns).await?, both);

    // The alias's credentials now lead nowhere: it cannot be identified.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = closed.local_addr()?.port();
    drop(closed);
    Api::<Secret>::namespaced(f.upstream.clone(), &f.ns)
        .patch(
            "down1-alias-kubeconfig",
            &PatchParams::default(),
            &Patch::Merge(&json!({"stringData": {"value": loopback_kubeconfig(port)}})),
        )
        .await?;
    let kubeconfig = control_plane().upstream().kubeconfig.clone();
    let pruned = prune_twice(&kubeconfig, &["-n", &f.ns], 2).await?;
    let unreachable = row(&rows(&pruned), &format!("{}/down1-alias", f.ns), "").clone();
    assert_eq!(unreachable["state"], "Unreachable", "{pruned:#}");
    assert!(!states_of(&pruned).contains("Pruned"), "{pruned:#}");
    assert_eq!(copies_of(&f.down1, &f.ns).await?, both);
    Ok(())
}

/// `-n NS --context upstream --target-context laptop-d1`: a laptop's run through the context
/// [`kubeconfig_with_contexts`] adds for down1.
fn laptop_args(ns: &str) -> [&str; 6] {
    [
        "-n",
        ns,
        "--context",
        "upstream",
        "--target-context",
        "laptop-d1",
    ]
}

/// A `--target-context` prune keeps what a Fleet Cluster reaching the same cluster wants.
#[tokio::test]
async fn a_target_context_prune_keeps_what_a_fleet_cluster_of_the_same_cluster_wants()
-> anyhow::Result<()> {
    let f = Fleet::new("id-ctx").await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = kubeconfig_with_contexts(dir.path(), DOWNSTREAM_1, &[("laptop-d1", None)])?;
    let (fleet_ns, ctx_ns, ctx_ns2) = (f.dest("fleet"), f.dest("ctx"), f.dest("ctx2"));
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    // Fleet's Cluster down1 gets db in fleet_ns; the context (no target names it) gets the root
    // options: ctx_ns.
    let spec = |root_ns: &str| {
        format!(
            "defaultNamespace: {root_ns}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n  namespace: {fleet_ns}\n"
        )
    };
    f.helmop(&helmop_yaml("app", &spec(&ctx_ns))).await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    let ctx_args = laptop_args(&f.ns);
    let mut args = vec!["propagate"];
    args.extend(ctx_args);
    args.extend(["-o", "json"]);
    run_with(&kubeconfig, &args, &[]).await?.expect(0);
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        BTreeSet::from([
            place(&fleet_ns, "Secret", "db"),
            place(&ctx_ns, "Secret", "db")
        ])
    );

    // The context's namespace moves: its old copy is unwanted, the Fleet Cluster's is not.
    f.helmop(&helmop_yaml("app", &spec(&ctx_ns2))).await?;
    let pruned = prune_twice(&kubeconfig, &ctx_args, 0).await?;
    let pruned_rows: Vec<String> = rows(&pruned)
        .iter()
        .filter(|r| r["state"] == "Pruned")
        .map(|r| r["namespace"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(pruned_rows, std::slice::from_ref(&ctx_ns), "{pruned:#}");
    assert!(
        get_secret(&f.down1, &fleet_ns, "db").await?.is_some(),
        "the Fleet Cluster's copy was pruned"
    );
    assert!(get_secret(&f.down1, &ctx_ns, "db").await?.is_none());
    // And status through the context agrees: the Fleet copy is not Orphaned.
    let mut args = vec!["status"];
    args.extend(ctx_args);
    args.extend(["-o", "json"]);
    let status = run_with(&kubeconfig, &args, &[]).await?.expect(0).json();
    assert!(!states_of(&status).contains("Orphaned"), "{status:#}");
    Ok(())
}

/// A copy records which kind of run made it (`helmop.dev/made-by`); a prune
/// without `--target-context` never deletes what a `--target-context` run made, and a copy both
/// kinds made is only handed over by the kind that lets go.
#[tokio::test]
async fn a_fleet_prune_never_deletes_what_a_target_context_run_made() -> anyhow::Result<()> {
    let f = Fleet::new("id-modes").await?;
    let dir = tempfile::tempdir()?;
    let kubeconfig = kubeconfig_with_contexts(dir.path(), DOWNSTREAM_1, &[("laptop-d1", None)])?;
    let dest = f.dest("apps");
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    let spec = |clusters: &[&str]| {
        let targets: String = clusters
            .iter()
            .map(|c| format!("- clusterName: {c}\n  namespace: {dest}\n"))
            .collect();
        format!("downstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n{targets}")
    };
    let ctx_args = laptop_args(&f.ns);
    let with_ctx = |command: &'static str| {
        let mut args = vec![command];
        args.extend(ctx_args);
        args.extend(["-o", "json"]);
        args
    };
    let made_by = || async {
        let copy = some(get_secret(&f.down1, &dest, "db").await?, "the copy")?;
        anyhow::Ok(annotation(&copy.metadata, "helmop.dev/made-by").map(String::from))
    };
    let upstream = control_plane().upstream().kubeconfig.clone();

    // Only the context's target: made by a --target-context run.
    f.helmop(&helmop_yaml("app", &spec(&["laptop-d1"]))).await?;
    run_with(&kubeconfig, &with_ctx("propagate"), &[])
        .await?
        .expect(0);
    assert_eq!(made_by().await?.as_deref(), Some("target-context"));
    // A Fleet-mode prune wants nothing there, and leaves it to the context runs. (Namespaced:
    // other tests share the clusters; `-A` judges the same way.)
    let pruned = prune_twice(&upstream, &["-n", &f.ns], 0).await?;
    let left = row_in(&pruned, &dest, "db");
    assert_eq!(left["state"], "Orphaned", "{pruned:#}");
    assert!(
        left["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("--target-context"),
        "{left:#}"
    );
    assert!(made_by().await?.is_some(), "the context's copy was pruned");

    // Fleet's down1 wants it too: both kinds made it.
    f.helmop(&helmop_yaml("app", &spec(&["laptop-d1", "down1"])))
        .await?;
    helmop(&["propagate", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert_eq!(made_by().await?.as_deref(), Some("fleet,target-context"));

    // Fleet lets go: it only hands the copy over.
    f.helmop(&helmop_yaml("app", &spec(&["laptop-d1"]))).await?;
    let pruned = prune_twice(&upstream, &["-n", &f.ns], 0).await?;
    assert_eq!(
        row_in(&pruned, &dest, "db")["state"],
        "Released",
        "{pruned:#}"
    );
    assert_eq!(made_by().await?.as_deref(), Some("target-context"));

    // The context lets go too: its own prune deletes it.
    f.helmop(&helmop_yaml("app", &spec(&["elsewhere"]))).await?;
    let pruned = prune_twice(&kubeconfig, &ctx_args, 0).await?;
    assert_eq!(
        row_in(&pruned, &dest, "db")["state"],
        "Pruned",
        "{pruned:#}"
    );
    assert!(get_secret(&f.down1, &dest, "db").await?.is_none());
    Ok(())
}

/// `prune HELMOP` never deletes a copy another HelmOp of the namespace wants, even one
/// that HelmOp has not propagated yet.
#[tokio::test]
async fn a_scoped_prune_keeps_a_copy_another_helmop_wants() -> anyhow::Result<()> {
    let f = Fleet::new("id-scoped").await?;
    let dest = f.dest("apps");
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    create_secret(&f.upstream, &f.ns, "other", &[("k", b"w")]).await?;
    let spec = |name: &str| {
        format!(
            "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: {name}}}\ntargets:\n- clusterName: down1\n"
        )
    };
    f.helmop(&helmop_yaml("a", &spec("db"))).await?;
    helmop(&["propagate", "a", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    let copy = some(get_secret(&f.down1, &dest, "db").await?, "a's copy")?;
    // b wants the same copy but has not propagated; a lets go of it.
    f.helmop(&helmop_yaml("b", &spec("db"))).await?;
    f.helmop(&helmop_yaml("a", &spec("other"))).await?;

    let kubeconfig = control_plane().upstream().kubeconfig.clone();
    let pruned = prune_twice(&kubeconfig, &["a", "-n", &f.ns], 0).await?;
    assert!(!states_of(&pruned).contains("Pruned"), "{pruned:#}");
    let kept = some(get_secret(&f.down1, &dest, "db").await?, "the copy b wants")?;
    assert_eq!(kept.metadata.uid, copy.metadata.uid, "the same object");
    let owners = annotation(&kept.metadata, "helmop.dev/owners").unwrap_or_default();
    assert!(
        !owners.ends_with(&format!("/{}/a", f.ns)) && !owners.contains(&format!("/{}/a,", f.ns)),
        "a was released: {owners}"
    );
    // b's own run finds its copy in place.
    let out = helmop(&["propagate", "b", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert!(!states_of(&out).contains("Created"), "{out:#}");
    Ok(())
}

/// A Fleet Cluster that is the management cluster itself, with the HelmOp's own
/// namespace as destination: the "copy" is the source. Never adopted, never pruned.
#[tokio::test]
async fn the_management_cluster_as_a_target_never_adopts_or_prunes_a_source() -> anyhow::Result<()>
{
    let f = Fleet::new("id-self").await?;
    let cp = control_plane();
    register_fleet_cluster(&f.upstream, &f.ns, "self", &[], cp.upstream()).await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: self\n",
            f.ns
        ),
    ))
    .await?;
    let source = some(get_secret(&f.upstream, &f.ns, "db").await?, "source")?;
    let adopt = helmop(&["propagate", "app", "-n", &f.ns, "--adopt", "-o", "json"])
        .await?
        .expect(1)
        .json();
    refused_as_source(&adopt, &format!("{}/self", f.ns), "db");
    let after = some(get_secret(&f.upstream, &f.ns, "db").await?, "source")?;
    assert_eq!(
        after.metadata.resource_version,
        source.metadata.resource_version
    );
    assert_eq!(label(&after.metadata, "helmop.dev/managed-by"), None);

    // A source that an older release marked as its own copy, no longer wanted: never pruned.
    let id = adopt["upstreamId"].as_str().unwrap_or_default().to_string();
    let uid = source.metadata.uid.clone().unwrap_or_default();
    Api::<Secret>::namespaced(f.upstream.clone(), &f.ns)
        .patch(
            "db",
            &PatchParams::default(),
            &Patch::Merge(&json!({"metadata": {
                "labels": {"helmop.dev/managed-by": "kubectl-helmop"},
                "annotations": {
                    "helmop.dev/owners": format!("{id}/{}/app", f.ns),
                    "helmop.dev/source": format!("{id}/{}/Secret/db", f.ns),
                    "helmop.dev/source-uid": uid,
                },
            }})),
        )
        .await?;
    fleet_api(&f.upstream, &f.ns, &helmop_resource())
        .delete("app", &DeleteParams::default())
        .await?;
    let kubeconfig = cp.upstream().kubeconfig.clone();
    let pruned = prune_twice(&kubeconfig, &["-n", &f.ns], 1).await?;
    refused_as_source(&pruned, &format!("{}/self", f.ns), "db");
    let still = some(get_secret(&f.upstream, &f.ns, "db").await?, "the source")?;
    assert_eq!(still.metadata.uid, source.metadata.uid);
    Ok(())
}

/// `--adopt` on the management cluster never takes over a source any HelmOp names: not one of a
/// namespace outside the run's scope, not one of a HelmOp that targets no cluster now. And a run
/// that cannot tell which cluster is the management cluster adopts nothing.
#[tokio::test]
async fn adopt_never_takes_over_a_source_any_helmop_names() -> anyhow::Result<()> {
    let f = Fleet::new("id-adopt").await?;
    let cp = control_plane();
    register_fleet_cluster(&f.upstream, &f.ns, "self", &[], cp.upstream()).await?;
    // Another team's namespace holds its source `token`, named by a HelmOp that targets nothing.
    let other = fresh_namespace(&f.upstream, "id-adopt-other").await?;
    let theirs = create_secret(&f.upstream, &other, "token", &[("k", b"theirs")]).await?;
    apply_helmop(
        &f.upstream,
        &other,
        &helmop_yaml(
            "idle",
            "downstreamResources:\n- {kind: Secret, name: token}\ntargets:\n- clusterName: nowhere\n",
        ),
    )
    .await?;
    // This namespace's HelmOp copies its own `token` into that namespace of the management cluster.
    create_secret(&f.upstream, &f.ns, "token", &[("k", b"mine")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {other}\ndownstreamResources:\n- {{kind: Secret, name: token}}\ntargets:\n- clusterName: self\n"
        ),
    ))
    .await?;
    let out = helmop(&["propagate", "app", "-n", &f.ns, "--adopt", "-o", "json"])
        .await?
        .expect(1)
        .json();
    refused_as_source(&out, &format!("{}/self", f.ns), "token");
    let after = some(
        get_secret(&f.upstream, &other, "token").await?,
        "their source",
    )?;
    assert_eq!(
        after.metadata.resource_version,
        theirs.metadata.resource_version
    );
    assert_eq!(after.data, theirs.data);

    // Credentials that cannot read kube-system: the run cannot tell whether `self` is the
    // management cluster, so --adopt is refused before anything is written.
    let dir = tempfile::tempdir()?;
    let blind = limited_kubeconfig(
        &f.upstream,
        &f.ns,
        dir.path(),
        "no-identity",
        FLEET_READS,
        false,
    )
    .await?;
    let refused = run_with(&blind, &["propagate", "app", "-n", &f.ns, "--adopt"], &[])
        .await?
        .expect(1);
    assert!(
        refused.stderr.contains("--adopt refused"),
        "{}",
        refused.stderr
    );
    let after = some(
        get_secret(&f.upstream, &other, "token").await?,
        "their source",
    )?;
    assert_eq!(
        after.metadata.resource_version,
        theirs.metadata.resource_version
    );
    Ok(())
}

/// The row of `name` on `cluster` says the place holds a source: `Conflict`, "the source itself".
fn refused_as_source(report: &Value, cluster: &str, name: &str) {
    let r = row(&rows(report), cluster, name).clone();
    assert_eq!(r["state"], "Conflict", "{report:#}");
    assert!(
        r["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("source itself"),
        "{report:#}"
    );
}

/// The upstream id an older release derived for a kubeconfig without a CA (the first release's derivation).
fn legacy_url_id(url: &str) -> String {
    let mut h = Sha256::new();
    h.update(b"helmop.dev/upstream-id/v1/url\0");
    h.update(url.as_bytes());
    format!("up-{}", &hex::encode(h.finalize())[..12])
}

/// The in-cluster view and a laptop behind a proxy with another CA and URL agree on the
/// upstream id; copies marked with the laptop's old id are recognised and migrated, never taken
/// for another upstream's, and another upstream's copies stay foreign.
#[tokio::test]
async fn one_upstream_one_id_and_old_ids_are_migrated() -> anyhow::Result<()> {
    let f = Fleet::new("id-up").await?;
    let dir = tempfile::tempdir()?;
    let cp = control_plane();
    let direct = cp.upstream().kubeconfig.clone();
    let (proxied, proxied_url) = proxied_kubeconfig(cp.upstream(), dir.path()).await?;
    let (apps, old, foreign) = (f.dest("apps"), f.dest("old"), f.dest("foreign"));
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    let spec = |ns: &str| {
        format!(
            "defaultNamespace: {ns}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"
        )
    };
    f.helmop(&helmop_yaml("app", &spec(&apps))).await?;

    let made = run_with(
        &direct,
        &["propagate", "app", "-n", &f.ns, "-o", "json"],
        &[],
    )
    .await?
    .expect(0)
    .json();
    let seen = run_with(&proxied, &["status", "app", "-n", &f.ns, "-o", "json"], &[])
        .await?
        .expect(0)
        .json();
    assert_eq!(made["upstreamId"], seen["upstreamId"], "{made:#}\n{seen:#}");
    assert_eq!(
        states_of(&seen),
        BTreeSet::from(["Synced".to_string()]),
        "{seen:#}"
    );

    // Copies an older release made from the laptop (its id was derived from the proxy's URL).
    let legacy = legacy_url_id(&proxied_url);
    let id = made["upstreamId"].as_str().unwrap_or_default().to_string();
    assert_ne!(legacy, id);
    f.helmop(&helmop_yaml("app", &spec(&old))).await?;
    run_with(
        &direct,
        &[
            "propagate",
            "app",
            "-n",
            &f.ns,
            "--upstream-id",
            &legacy,
            "-o",
            "json",
        ],
        &[],
    )
    .await?
    .expect(0);
    let before = some(get_secret(&f.down1, &old, "db").await?, "old copy")?;
    assert_eq!(
        annotation(&before.metadata, "helmop.dev/owners"),
        Some(format!("{legacy}/{}/app", f.ns).as_str())
    );
    let status = run_with(&proxied, &["status", "app", "-n", &f.ns, "-o", "json"], &[])
        .await?
        .expect(0)
        .json();
    assert_eq!(row_in(&status, &old, "db")["state"], "Stale", "{status:#}");
    let out = run_with(
        &proxied,
        &["propagate", "app", "-n", &f.ns, "-o", "json"],
        &[],
    )
    .await?
    .expect(0)
    .json();
    assert_eq!(row_in(&out, &old, "db")["state"], "Updated", "{out:#}");
    let after = some(get_secret(&f.down1, &old, "db").await?, "migrated copy")?;
    assert_eq!(after.metadata.uid, before.metadata.uid, "migrated in place");
    assert_eq!(
        annotation(&after.metadata, "helmop.dev/owners"),
        Some(format!("{id}/{}/app", f.ns).as_str())
    );
    assert_eq!(
        annotation(&after.metadata, "helmop.dev/source"),
        Some(format!("{id}/{}/Secret/db", f.ns).as_str())
    );
    // The old apps copy is helmop's (new id) and no longer wanted: prune removes it, from
    // either view.
    let pruned = prune_twice(&direct, &["app", "-n", &f.ns], 0).await?;
    assert!(states_of(&pruned).contains("Pruned"), "{pruned:#}");
    assert!(get_secret(&f.down1, &apps, "db").await?.is_none());

    // A copy of another upstream (another id) is never taken for ours.
    f.helmop(&helmop_yaml("app", &spec(&foreign))).await?;
    run_with(
        &direct,
        &[
            "propagate",
            "app",
            "-n",
            &f.ns,
            "--upstream-id",
            "elsewhere",
            "-o",
            "json",
        ],
        &[],
    )
    .await?
    .expect(0);
    let status = run_with(&proxied, &["status", "app", "-n", &f.ns, "-o", "json"], &[])
        .await?
        .expect(0)
        .json();
    assert_eq!(
        row_in(&status, &foreign, "db")["state"],
        "Conflict",
        "{status:#}"
    );

    // Another management cluster reached through the same proxy URL derived the same legacy id.
    // Its copy of its own `db` (another source uid) is not ours: never migrated, never
    // overwritten as if our source had been recreated.
    let twin = f.dest("twin");
    Api::<k8s_openapi::api::core::v1::Namespace>::all(f.down1.clone())
        .create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": twin}}))?,
        )
        .await?;
    let theirs = create(
        &f.down1,
        &secret_obj(
            &twin,
            "db",
            "Opaque",
            &[("k", b"the other management cluster's")],
            &[("helmop.dev/managed-by", "kubectl-helmop")],
            &[
                ("helmop.dev/owners", &format!("{legacy}/{}/app", f.ns)),
                ("helmop.dev/source", &format!("{legacy}/{}/Secret/db", f.ns)),
                (
                    "helmop.dev/source-uid",
                    "uid-of-the-other-management-cluster",
                ),
            ],
        ),
    )
    .await?;
    f.helmop(&helmop_yaml("app", &spec(&twin))).await?;
    let out = run_with(
        &proxied,
        &["propagate", "app", "-n", &f.ns, "-o", "json"],
        &[],
    )
    .await?
    .expect(1)
    .json();
    assert_eq!(row_in(&out, &twin, "db")["state"], "Conflict", "{out:#}");
    let after = some(get_secret(&f.down1, &twin, "db").await?, "their copy")?;
    assert_eq!(
        after.metadata.resource_version,
        theirs.metadata.resource_version
    );
    assert_eq!(after.data, theirs.data);
    Ok(())
}
