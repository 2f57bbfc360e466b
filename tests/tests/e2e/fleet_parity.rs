//! Where helmop follows rules read in Fleet v0.16's own code rather than its documentation.
//!
//! - `a_kubeconfig_namespace_fleet_refuses_is_never_read_unless_allowed`: Fleet's import
//!   controller reads a Cluster's kubeconfig Secret only from the Cluster's own namespace, Fleet's
//!   workspace and system namespaces or a `cluster-*` namespace
//!   (`allowedKubeConfigSecretNamespace`). helmop refuses any other `kubeConfigSecretNamespace`
//!   per cluster, with the reason in `status` and `propagate`, and copies nothing there, unless
//!   `--allow-kubeconfig-namespace` names that namespace.
//! - `kinds_are_lower_cased_as_go_does`: Fleet compares `strings.ToLower(kind)` with `configmap`
//!   and `secret`, so `CONF\u{130}GMAP` (capital I with dot, which Go lower-cases to `i`) names a
//!   ConfigMap: `validate` accepts it and `propagate` copies it, as Fleet's agent would.
//! - `a_paused_cluster_gets_nothing_new_until_unpaused` and
//!   `a_paused_helmop_is_neither_copied_updated_nor_pruned`: Fleet stops a BundleDeployment when
//!   its Cluster or its HelmOp is paused (`target.go` `IsPaused`); helmop freezes the copies the
//!   same way (no create, no update, no prune) and reports `Paused` rows saying whether the copy
//!   is current; unpausing resumes.
//! - `helmops_fleet_rejects_get_no_copies`: a HelmOp Fleet's controller would not turn into a
//!   Bundle (a Policy of its namespace forbids its repo; its `helmSecretName` Secret does not
//!   exist) is `Invalid` with Fleet's reason and gets no copies; a copy made while it was accepted
//!   is left as it is, as Fleet keeps the previous Bundle.

use helmop_tests::*;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::plugin::support::*;

/// The report row of `name` whose cluster column mentions the Fleet Cluster `cluster`.
fn row_for<'a>(report: &'a [Value], cluster: &str, name: &str) -> Option<&'a Value> {
    report.iter().find(|r| {
        r["name"] == name
            && r["cluster"]
                .as_str()
                .is_some_and(|c| c.split(',').any(|n| n.trim().ends_with(cluster)))
    })
}

#[tokio::test]
async fn a_kubeconfig_namespace_fleet_refuses_is_never_read_unless_allowed() -> anyhow::Result<()> {
    let f = Fleet::new("fp-kcns").await?;
    let cp = control_plane();
    // down1's kubeconfig in a namespace Fleet does not read from, down2's in a `cluster-*` one.
    let elsewhere = fresh_namespace(&f.upstream, "fp-secrets").await?;
    let allowed = fresh_namespace(&f.upstream, "cluster-fp").await?;
    for (ns, cluster) in [(&elsewhere, DOWNSTREAM_1), (&allowed, DOWNSTREAM_2)] {
        create_secret(
            &f.upstream,
            ns,
            "kubeconfig",
            &[("value", cp.cluster(cluster).kubeconfig_yaml().as_bytes())],
        )
        .await?;
    }
    for (name, ns) in [("far", &elsewhere), ("near", &allowed)] {
        create_fleet_object(
            &f.upstream,
            &f.ns,
            &cluster_resource(),
            json!({
                "metadata": {"name": name},
                "spec": {"kubeConfigSecret": "kubeconfig", "kubeConfigSecretNamespace": ns},
            }),
        )
        .await?;
    }
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    let dest = f.dest("apps");
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: far\n- clusterName: near\n"
        ),
    ))
    .await?;

    let refusal = format!("kubeConfigSecretNamespace {elsewhere} is not a namespace Fleet reads");
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&status.json());
    let far = row_for(&rows_, "far", "db").unwrap_or_else(|| panic!("no far row: {rows_:#?}"));
    assert_eq!(far["state"], "Unreachable", "{far:#}");
    let reason = far["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains(&refusal) && reason.contains("--allow-kubeconfig-namespace"),
        "{far:#}"
    );
    let near = row_for(&rows_, "near", "db").unwrap_or_else(|| panic!("no near row: {rows_:#?}"));
    assert_ne!(
        near["state"], "Unreachable",
        "a cluster-* namespace is Fleet's: {near:#}"
    );

    let refused = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"]).await?;
    assert_ne!(refused.code, 0, "a refused cluster is a failure of the run");
    let rows_ = rows(&refused.json());
    let far = row_for(&rows_, "far", "db").unwrap_or_else(|| panic!("no far row: {rows_:#?}"));
    assert!(
        far["reason"]
            .as_str()
            .unwrap_or_default()
            .contains(&refusal),
        "{far:#}"
    );
    assert!(
        get_secret(&f.down2, &dest, "db").await?.is_some(),
        "near's copy"
    );
    assert!(
        get_secret(&f.down1, &dest, "db").await?.is_none(),
        "nothing on far's cluster"
    );

    // Widened by the operator: the same Cluster now gets its copy.
    helmop(&[
        "propagate",
        "app",
        "-n",
        &f.ns,
        "-o",
        "json",
        "--allow-kubeconfig-namespace",
        &elsewhere,
    ])
    .await?
    .expect(0);
    assert!(
        get_secret(&f.down1, &dest, "db").await?.is_some(),
        "far's copy"
    );
    Ok(())
}

#[tokio::test]
async fn kinds_are_lower_cased_as_go_does() -> anyhow::Result<()> {
    let f = Fleet::new("fp-kind").await?;
    create_config_map(&f.upstream, &f.ns, "settings", &[("level", "debug")]).await?;
    let dest = f.dest("apps");
    let yaml = helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: \"CONF\u{130}GMAP\", name: settings}}\ntargets:\n- clusterName: down1\n"
        ),
    );
    let file = std::env::temp_dir().join(format!("{}-helmop.yaml", f.ns));
    std::fs::write(&file, &yaml)?;
    let args = ["validate", "-f", &file.display().to_string(), "-o", "json"].map(String::from);
    let validated = run_raw(&args, &[]).await?;
    std::fs::remove_file(&file)?;
    validated.expect(0);

    f.helmop(&yaml).await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    let copy = Api::<ConfigMap>::namespaced(f.down1.clone(), &dest)
        .get_opt("settings")
        .await?;
    let data = copy.and_then(|c| c.data).unwrap_or_default();
    assert_eq!(data.get("level").map(String::as_str), Some("debug"));
    Ok(())
}

/// Sets `spec.paused` of a Fleet Cluster or HelmOp.
async fn set_paused(
    f: &Fleet,
    resource: &kube::api::ApiResource,
    name: &str,
    paused: bool,
) -> anyhow::Result<()> {
    fleet_api(&f.upstream, &f.ns, resource)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"paused": paused}})),
        )
        .await?;
    Ok(())
}

/// Replaces the data of the source Secret `name` upstream.
async fn set_source(f: &Fleet, name: &str, value: &str) -> anyhow::Result<()> {
    Api::<Secret>::namespaced(f.upstream.clone(), &f.ns)
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"stringData": {"k": value}})),
        )
        .await?;
    Ok(())
}

/// The value of key `k` of a Secret downstream, if the Secret exists.
async fn copy_value(client: &kube::Client, ns: &str, name: &str) -> anyhow::Result<Option<String>> {
    Ok(get_secret(client, ns, name).await?.map(|s| {
        s.data
            .and_then(|d| {
                d.get("k")
                    .map(|v| String::from_utf8_lossy(&v.0).into_owned())
            })
            .unwrap_or_default()
    }))
}

/// The row of `name` on `cluster`, or a panic listing the rows.
fn expect_row<'a>(rows_: &'a [Value], cluster: &str, name: &str) -> &'a Value {
    row_for(rows_, cluster, name).unwrap_or_else(|| panic!("no {cluster} {name} row: {rows_:#?}"))
}

#[tokio::test]
async fn a_paused_cluster_gets_nothing_new_until_unpaused() -> anyhow::Result<()> {
    let f = Fleet::new("fp-pausec").await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v1")]).await?;
    let dest = f.dest("apps");
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n- clusterName: down2\n"
        ),
    ))
    .await?;
    set_paused(&f, &cluster_resource(), "down2", true).await?;

    // The dry run says exactly what the run does: nothing for the paused Cluster.
    let dry = helmop(&["propagate", "app", "-n", &f.ns, "--dry-run", "-o", "json"]).await?;
    let report = dry.expect(0).json();
    let rows_ = rows(&report);
    assert_eq!(expect_row(&rows_, "down1", "db")["state"], "Create");
    let paused = expect_row(&rows_, "down2", "db");
    assert_eq!(paused["state"], "Paused", "{paused:#}");
    assert_eq!(paused["inSync"], false, "{paused:#}");
    assert!(
        paused["reason"]
            .as_str()
            .is_some_and(|r| r.contains("the Cluster is paused") && r.contains("no copy yet")),
        "{paused:#}"
    );
    assert_eq!(writes(&report), 0);

    let run = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"]).await?;
    let report = run.expect(0).json();
    let rows_ = rows(&report);
    assert_eq!(expect_row(&rows_, "down1", "db")["state"], "Created");
    assert_eq!(expect_row(&rows_, "down2", "db")["state"], "Paused");
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v1")
    );
    assert_eq!(
        copy_value(&f.down2, &dest, "db").await?,
        None,
        "no copy on a paused Cluster"
    );

    // Unpaused: copied. Paused again: a source change reaches only down1.
    set_paused(&f, &cluster_resource(), "down2", false).await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert_eq!(
        copy_value(&f.down2, &dest, "db").await?.as_deref(),
        Some("v1")
    );
    set_paused(&f, &cluster_resource(), "down2", true).await?;
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&status.expect(0).json());
    let paused = expect_row(&rows_, "down2", "db");
    assert_eq!(
        (&paused["state"], &paused["inSync"]),
        (&json!("Paused"), &json!(true)),
        "{paused:#}"
    );

    set_source(&f, "db", "v2").await?;
    let run = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&run.expect(0).json());
    assert_eq!(expect_row(&rows_, "down1", "db")["state"], "Updated");
    assert_eq!(expect_row(&rows_, "down2", "db")["state"], "Paused");
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v2")
    );
    assert_eq!(
        copy_value(&f.down2, &dest, "db").await?.as_deref(),
        Some("v1"),
        "not updated while paused"
    );
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&status.expect(0).json());
    let paused = expect_row(&rows_, "down2", "db");
    assert_eq!(
        (&paused["state"], &paused["inSync"]),
        (&json!("Paused"), &json!(false)),
        "{paused:#}"
    );
    assert!(
        paused["reason"]
            .as_str()
            .is_some_and(|r| r.contains("outdated")),
        "{paused:#}"
    );
    assert_eq!(expect_row(&rows_, "down1", "db")["state"], "Synced");

    // Untargeted while paused: not pruned.
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"
        ),
    ))
    .await?;
    let pruned = helmop(&["prune", "app", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&pruned.expect(0).json());
    assert_eq!(
        expect_row(&rows_, "down2", "db")["state"],
        "Paused",
        "{rows_:#?}"
    );
    assert!(
        get_secret(&f.down2, &dest, "db").await?.is_some(),
        "pruned on a paused Cluster"
    );

    // Unpaused: the run resumes (prune now removes the untargeted copy).
    set_paused(&f, &cluster_resource(), "down2", false).await?;
    helmop(&["prune", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert!(
        get_secret(&f.down2, &dest, "db").await?.is_none(),
        "not pruned after unpausing"
    );
    Ok(())
}

#[tokio::test]
async fn a_paused_helmop_is_neither_copied_updated_nor_pruned() -> anyhow::Result<()> {
    let f = Fleet::new("fp-pauseh").await?;
    // The runs below must write nothing at all, not even the upstream hash key.
    ensure_hash_key(&f.upstream).await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v1")]).await?;
    let dest = f.dest("apps");
    let spec = |paused: bool, resources: &str| {
        helmop_yaml(
            "app",
            &format!(
                "paused: {paused}\ndefaultNamespace: {dest}\ndownstreamResources:\n{resources}targets:\n- clusterName: down1\n"
            ),
        )
    };
    let with_db = "- {kind: Secret, name: db}\n";
    f.helmop(&spec(true, with_db)).await?;
    let run = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"]).await?;
    let report = run.expect(0).json();
    let row_ = expect_row(&rows(&report), "down1", "db").clone();
    assert_eq!(row_["state"], "Paused", "{row_:#}");
    assert!(
        row_["reason"]
            .as_str()
            .is_some_and(|r| r.contains("the HelmOp is paused")),
        "{row_:#}"
    );
    assert_eq!(writes(&report), 0, "{report:#}");
    assert!(get_secret(&f.down1, &dest, "db").await?.is_none());

    set_paused(&f, &helmop_resource(), "app", false).await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v1")
    );

    set_paused(&f, &helmop_resource(), "app", true).await?;
    set_source(&f, "db", "v2").await?;
    let run = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"]).await?;
    let report = run.expect(0).json();
    let row_ = expect_row(&rows(&report), "down1", "db").clone();
    assert_eq!(
        (&row_["state"], &row_["inSync"]),
        (&json!("Paused"), &json!(false)),
        "{row_:#}"
    );
    assert_eq!(writes(&report), 0, "{report:#}");
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v1")
    );

    // The entry removed while paused: the copy stays.
    f.helmop(&spec(true, "- {kind: ConfigMap, name: other}\n"))
        .await?;
    let pruned = helmop(&["prune", "app", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&pruned.expect(0).json());
    let row_ = expect_row(&rows_, "down1", "db");
    assert_eq!(row_["state"], "Paused", "{rows_:#?}");
    assert!(
        row_["reason"]
            .as_str()
            .is_some_and(|r| r.contains("not pruned")),
        "{row_:#}"
    );
    assert!(
        get_secret(&f.down1, &dest, "db").await?.is_some(),
        "pruned while paused"
    );

    // Unpaused with db again: updated, as Fleet resumes the BundleDeployment.
    f.helmop(&spec(false, with_db)).await?;
    let run = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&run.expect(0).json());
    assert_eq!(expect_row(&rows_, "down1", "db")["state"], "Updated");
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v2")
    );
    Ok(())
}

#[tokio::test]
async fn helmops_fleet_rejects_get_no_copies() -> anyhow::Result<()> {
    let f = Fleet::new("fp-reject").await?;
    // The runs below must write nothing at all, not even the upstream hash key.
    ensure_hash_key(&f.upstream).await?;
    install_fleet_crd(&f.upstream, "policies").await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v1")]).await?;
    create_fleet_object(
        &f.upstream,
        &f.ns,
        &policy_resource(),
        json!({
            "metadata": {"name": "internal-charts"},
            "helmOp": {"allowedHelmRepoPatterns": ["https://charts\\.internal\\..*"]},
        }),
    )
    .await?;
    let dest = f.dest("apps");
    let resources = format!(
        "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n"
    );
    // helmop_yaml's repo is https://charts.example.com: the Policy forbids it.
    f.helmop(&helmop_yaml("public", &resources)).await?;
    let run = helmop(&["propagate", "public", "-n", &f.ns, "-o", "json"]).await?;
    let report = run.expect(1).json();
    let rows_ = rows(&report);
    let invalid: Vec<&Value> = rows_.iter().filter(|r| r["state"] == "Invalid").collect();
    assert_eq!(invalid.len(), 1, "one row for the HelmOp: {rows_:#?}");
    let reason = invalid[0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason
            .contains("a Fleet Policy forbids it: disallowed helm repo https://charts.example.com"),
        "{reason}"
    );
    assert_eq!(
        report["rejected"][0]["helmop"],
        format!("{}/public", f.ns),
        "{report:#}"
    );
    assert!(
        rows_
            .iter()
            .all(|r| r["state"] != "Created" && r["state"] != "Create"),
        "{rows_:#?}"
    );
    assert_eq!(writes(&report), 0, "{report:#}");
    assert!(get_secret(&f.down1, &dest, "db").await?.is_none());
    let status = helmop(&["status", "public", "-n", &f.ns, "-o", "json"]).await?;
    let status = status.expect(1).json();
    assert!(
        rows(&status).iter().any(|r| r["state"] == "Invalid"
            && r["reason"]
                .as_str()
                .is_some_and(|s| s.contains("disallowed helm repo"))),
        "{status:#}"
    );

    // Allowed repo, but its helmSecretName Secret does not exist.
    let private = format!(
        "apiVersion: fleet.cattle.io/v1alpha1\nkind: HelmOp\nmetadata:\n  name: private\nspec:\n  helm:\n    repo: https://charts.internal.example\n    chart: app\n  helmSecretName: repo-creds\n{}",
        resources
            .lines()
            .map(|l| format!("  {l}\n"))
            .collect::<String>()
    );
    f.helmop(&private).await?;
    let run = helmop(&["propagate", "private", "-n", &f.ns, "-o", "json"]).await?;
    let report = run.expect(1).json();
    let rows_ = rows(&report);
    assert!(
        rows_.iter().any(|r| r["state"] == "Invalid"
            && r["reason"]
                .as_str()
                .is_some_and(|s| s.contains("helmSecretName Secret repo-creds does not exist"))),
        "{rows_:#?}"
    );
    assert!(get_secret(&f.down1, &dest, "db").await?.is_none());

    // Once the Secret exists, Fleet accepts it: copied.
    create_secret(
        &f.upstream,
        &f.ns,
        "repo-creds",
        &[("username", b"u"), ("password", b"p")],
    )
    .await?;
    helmop(&["propagate", "private", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v1")
    );

    // Rejected again: Fleet keeps the previous Bundle, so the copy stays as it is (not updated,
    // not pruned) and is listed as Invalid.
    Api::<Secret>::namespaced(f.upstream.clone(), &f.ns)
        .delete("repo-creds", &Default::default())
        .await?;
    set_source(&f, "db", "v2").await?;
    let run = helmop(&["propagate", "private", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&run.expect(1).json());
    let kept = expect_row(&rows_, "down1", "db");
    assert_eq!(
        (&kept["state"], &kept["inSync"]),
        (&json!("Invalid"), &json!(false)),
        "{kept:#}"
    );
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v1")
    );
    helmop(&["prune", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert!(
        get_secret(&f.down1, &dest, "db").await?.is_some(),
        "pruned while rejected"
    );

    // `validate --cluster` says the same before anything is applied, as warnings (like the
    // webhook): the Policy and the missing Secret depend on objects that may come later.
    let with_ns = |doc: String, name: &str| {
        doc.replacen(
            &format!("name: {name}"),
            &format!("name: {name}\n  namespace: {}", f.ns),
            1,
        )
    };
    let file = std::env::temp_dir().join(format!("{}-helmops.yaml", f.ns));
    std::fs::write(
        &file,
        format!(
            "{}---\n{}",
            with_ns(helmop_yaml("public", &resources), "public"),
            with_ns(private.clone(), "private")
        ),
    )?;
    let file_arg = file.display().to_string();
    let validated = helmop(&["validate", "-f", &file_arg, "--cluster", "-o", "json"]).await?;
    std::fs::remove_file(&file)?;
    let out = validated.expect(0).stdout;
    for warning in [
        "a Fleet Policy forbids it: disallowed helm repo https://charts.example.com",
        "helmSecretName Secret repo-creds does not exist",
    ] {
        assert!(out.contains(warning), "{warning} missing from: {out}");
    }
    Ok(())
}

/// `kubectl apply` of a HelmOp through the webhook: (admitted, stderr).
async fn admit(object: &Value, extra: &[&str]) -> anyhow::Result<(bool, String)> {
    let mut args = vec!["--validate=false"];
    args.extend_from_slice(extra);
    let out = kubectl_apply(control_plane().upstream(), object, &args).await?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_webhook_denies_what_fleet_rejects_from_the_spec_and_warns_about_the_rest()
-> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    install_fleet_crd(&client, "policies").await?;
    let ns = fresh_namespace(&client, "fp-admit").await?;
    let webhook = LocalWebhook::start(client.clone(), Default::default()).await?;
    let registered = webhook.register(&client, &ns).await?;
    let op = |name: &str, helm: Value, extra: Value| {
        let mut spec = json!({"helm": helm});
        if let (Some(spec), Some(extra)) = (spec.as_object_mut(), extra.as_object()) {
            spec.extend(extra.clone());
        }
        json!({
            "apiVersion": "fleet.cattle.io/v1alpha1",
            "kind": "HelmOp",
            "metadata": {"name": name, "namespace": ns},
            "spec": spec,
        })
    };

    // Fleet's validate(): a tarball chart takes no repo; an OCI repo takes no chart.
    for (name, helm, path) in [
        (
            "tarball",
            json!({"chart": "https://example.com/app-1.0.0.TGZ", "repo": "https://charts.example.com"}),
            "spec.helm.repo",
        ),
        (
            "oci",
            json!({"repo": "oci://registry.example.com/charts/app", "chart": "app"}),
            "spec.helm.chart",
        ),
    ] {
        let (admitted, stderr) = admit(&op(name, helm, json!({})), &[]).await?;
        assert!(!admitted, "{name} admitted: {stderr}");
        assert!(
            stderr.contains(path),
            "{name}: {path} missing from: {stderr}"
        );
    }

    // A Policy forbidding the repo: a warning, never a denial (the Policy may well arrive after
    // the HelmOp). The Policy reaches the webhook through its watch: poll with dry runs.
    create_fleet_object(
        &client,
        &ns,
        &policy_resource(),
        json!({
            "metadata": {"name": "internal-only"},
            "helmOp": {"allowedHelmRepoPatterns": ["https://charts\\.internal\\..*"]},
        }),
    )
    .await?;
    let public = op(
        "public",
        json!({"repo": "https://charts.example.com", "chart": "app"}),
        json!({}),
    );
    wait_until("the Policy warning", DEFAULT_TIMEOUT, || {
        let public = public.clone();
        async move {
            let (admitted, stderr) = admit(&public, &["--dry-run=server"]).await?;
            anyhow::ensure!(admitted, "denied: {stderr}");
            Ok(stderr.contains(
                "a Fleet Policy forbids it: disallowed helm repo https://charts.example.com",
            ))
        }
    })
    .await?;
    let (admitted, stderr) = admit(&public, &[]).await?;
    assert!(admitted && stderr.contains("Warning:"), "{stderr}");

    // An allowed repo whose helmSecretName Secret does not exist: a warning as well.
    let private = op(
        "private",
        json!({"repo": "https://charts.internal.example", "chart": "app"}),
        json!({"helmSecretName": "repo-creds"}),
    );
    let (admitted, stderr) = admit(&private, &[]).await?;
    assert!(admitted, "{stderr}");
    assert!(
        stderr.contains("helmSecretName Secret repo-creds does not exist"),
        "{stderr}"
    );
    create_secret(&client, &ns, "repo-creds", &[("username", b"u")]).await?;
    // A spec change, so the apply reaches the webhook again.
    let mut private = private;
    private["spec"]["helm"]["version"] = json!("1.0.0");
    let (admitted, stderr) = admit(&private, &[]).await?;
    assert!(admitted && !stderr.contains("repo-creds"), "{stderr}");

    registered.remove().await?;
    Ok(())
}
