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

use helmop_tests::*;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
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
