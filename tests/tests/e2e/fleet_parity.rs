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
//! - `fleet_managed_copies_say_whether_fleets_agent_copied_the_latest`: Fleet's controller
//!   stages downstream resources and bumps a BundleDeployment's
//!   `spec.downstreamResourcesGeneration`; its agent copies them and sets the status's. `status`
//!   reads both (and the HelmOp's `Accepted` condition) to say `FleetManaged (current)`,
//!   `(pending)` or `(blocked)`.
//! - `versions_repos_and_values_from_as_fleet_resolves_them`: Masterminds semver constraints,
//!   `oci://` repos (lower-case, with a version), `http(s)://` repos and valuesFrom naming a
//!   downstream resource, through `validate` and through the webhook on a real API server.

use helmop_tests::*;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::plugin::support::*;
use crate::plugin::{b64, create, secret_obj, set_secret_data};

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

/// A BundleDeployment as Fleet's controller creates it for HelmOp `app` in `f.ns` on Fleet
/// Cluster `cluster` (`target.BundleDeployment`: the bundle's and the cluster's labels), in a
/// cluster namespace upstream, with the generation of the downstream resources it staged.
async fn bundle_deployment(
    f: &Fleet,
    cluster_ns: &str,
    cluster: &str,
    staged: i64,
) -> anyhow::Result<()> {
    create_fleet_object(
        &f.upstream,
        cluster_ns,
        &bundle_deployment_resource(),
        json!({
            "metadata": {"name": "app", "labels": {
                "fleet.cattle.io/bundle-name": "app",
                "fleet.cattle.io/bundle-namespace": f.ns,
                "fleet.cattle.io/cluster": cluster,
                "fleet.cattle.io/cluster-namespace": f.ns,
                "fleet.cattle.io/managed": "true",
            }},
            "spec": {
                "deploymentID": "s-1:abc",
                "downstreamResourcesGeneration": staged,
                "options": {"downstreamResources": [{"kind": "Secret", "name": "db"}]},
            },
        }),
    )
    .await?;
    Ok(())
}

/// What Fleet's agent records after copying: `status.downstreamResourcesGeneration`.
async fn agent_copied(
    client: &kube::Client,
    cluster_ns: &str,
    generation: i64,
) -> anyhow::Result<()> {
    fleet_api(client, cluster_ns, &bundle_deployment_resource())
        .patch_status(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"downstreamResourcesGeneration": generation}})),
        )
        .await?;
    Ok(())
}

/// `(fleetCopy, reason)` of the `db` row of each Fleet Cluster in a status report.
async fn fleet_copies(f: &Fleet) -> anyhow::Result<Vec<(String, String, String)>> {
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let rows_ = rows(&status);
    let mut out = Vec::new();
    for cluster in ["down1", "down2"] {
        let r = row_for(&rows_, cluster, "db")
            .unwrap_or_else(|| panic!("no {cluster} row: {rows_:#?}"));
        assert_eq!(r["state"], "FleetManaged", "{r:#}");
        out.push((
            cluster.to_string(),
            r["fleetCopy"].as_str().unwrap_or("-").to_string(),
            r["reason"].as_str().unwrap_or_default().to_string(),
        ));
    }
    Ok(out)
}

#[tokio::test]
async fn fleet_managed_copies_say_whether_fleets_agent_copied_the_latest() -> anyhow::Result<()> {
    let f = Fleet::new("fp-fleetcopy").await?;
    let dest = fresh_namespace(&f.down1, "fp-fleetcopy-dest").await?;
    Api::<Namespace>::all(f.down2.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(dest.clone()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await?;
    create_secret(&f.upstream, &f.ns, "db", &[("password", b"one")]).await?;
    // Fleet's agent copied the source to both clusters itself (its ownership label).
    for client in [&f.down1, &f.down2] {
        create(
            client,
            &secret_obj(
                &dest,
                "db",
                "Opaque",
                &[("password", b"one")],
                &[("fleet.cattle.io/bundledeployment", "app")],
                &[],
            ),
        )
        .await?;
    }
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n- clusterName: down2\n"
        ),
    ))
    .await?;

    // Before Fleet's controller made any BundleDeployment, nothing tells.
    let before = fleet_copies(&f).await?;
    for (cluster, verdict, reason) in &before {
        assert_eq!(verdict, "unknown", "{cluster}: {reason}");
        assert!(
            reason.contains("no BundleDeployment"),
            "{cluster}: {reason}"
        );
    }

    // The controller staged generation 2 for both; the agent on down1 copied it, down2's lags.
    let cluster_ns1 = fresh_namespace(&f.upstream, "cluster-fp-one").await?;
    let cluster_ns2 = fresh_namespace(&f.upstream, "cluster-fp-two").await?;
    bundle_deployment(&f, &cluster_ns1, "down1", 2).await?;
    bundle_deployment(&f, &cluster_ns2, "down2", 2).await?;
    agent_copied(&f.upstream, &cluster_ns1, 2).await?;
    agent_copied(&f.upstream, &cluster_ns2, 1).await?;
    let staged = fleet_copies(&f).await?;
    assert_eq!(staged[0].1, "current", "{staged:#?}");
    assert!(
        staged[0]
            .2
            .contains("Fleet's agent copied the latest content"),
        "{staged:#?}"
    );
    assert_eq!(staged[1].1, "pending", "{staged:#?}");
    assert!(
        staged[1].2.contains(&format!(
            "BundleDeployment {cluster_ns2}/app downstreamResourcesGeneration: copied 1, staged 2"
        )),
        "{staged:#?}"
    );
    // The table says it in the state column.
    let table = helmop(&["status", "app", "-n", &f.ns]).await?.expect(0);
    assert!(
        table.stdout.contains("FleetManaged (current)"),
        "{}",
        table.stdout
    );
    assert!(
        table.stdout.contains("FleetManaged (pending)"),
        "{}",
        table.stdout
    );

    // down2's agent catches up.
    agent_copied(&f.upstream, &cluster_ns2, 2).await?;
    assert_eq!(fleet_copies(&f).await?[1].1, "current");

    // The source changes; Fleet's controller has not staged it yet: pending on both.
    set_secret_data(&f.upstream, &f.ns, "db", json!({"password": b64(b"two")})).await?;
    for (cluster, verdict, reason) in fleet_copies(&f).await? {
        assert_eq!(verdict, "pending", "{cluster}: {reason}");
        assert!(
            reason.contains("has yet to stage the change"),
            "{cluster}: {reason}"
        );
    }

    // Fleet's controller rejects the HelmOp: the change will not arrive.
    fleet_api(&f.upstream, &f.ns, &helmop_resource())
        .patch_status(
            "app",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": [{
                "type": "Accepted", "status": "False",
                "message": "could not get a chart version: no chart version found",
            }]}})),
        )
        .await?;
    for (cluster, verdict, reason) in fleet_copies(&f).await? {
        assert_eq!(verdict, "blocked", "{cluster}: {reason}");
        assert!(
            reason.contains("could not get a chart version"),
            "{cluster}: {reason}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_repos_and_values_from_as_fleet_resolves_them() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "fp-verdicts").await?;
    create_secret(&client, &ns, "db", &[("values.yaml", b"a: 1")]).await?;
    let https = "https://charts.example.com";
    // (name, spec, admitted, (severity, path, phrase) of the finding that matters)
    let cases = [
        (
            "oci-no-version",
            json!({"helm": {"repo": "oci://ghcr.io/acme/app"}}),
            false,
            (
                "deny",
                "spec.helm.version",
                "an oci:// repo needs a version",
            ),
        ),
        (
            "oci-caps",
            json!({"helm": {"repo": "OCI://ghcr.io/acme/app", "version": "1.x"}}),
            false,
            ("deny", "spec.helm.repo", "in lower case"),
        ),
        (
            "no-scheme",
            json!({"helm": {"repo": "charts.example.com/stable", "chart": "app"}}),
            false,
            (
                "deny",
                "spec.helm.repo",
                "is not an http:// or https:// URL",
            ),
        ),
        (
            "range-after-space",
            json!({"helm": {"repo": https, "chart": "app", "version": ">=1 1.2 - 1.4"}}),
            false,
            ("deny", "spec.helm.version", "improper constraint"),
        ),
        (
            "wildcards",
            json!({"helm": {"repo": "oci://ghcr.io/acme/app", "version": "1.x.3 || >=1, 1.2 - 1.4"}}),
            true,
            ("", "", ""),
        ),
        (
            "https-caps",
            json!({"helm": {"repo": "HTTPS://charts.example.com", "chart": "app", "version": "~1.2"}}),
            true,
            ("", "", ""),
        ),
        (
            "values-from",
            json!({
                "helm": {"repo": https, "chart": "app", "version": "*",
                         "valuesFrom": [{"secretKeyRef": {"name": "db", "namespace": ns, "key": "values.yaml"}}]},
                "defaultNamespace": "web",
                "downstreamResources": [{"kind": "Secret", "name": "db"}],
            }),
            true,
            (
                "warn",
                "spec.helm.valuesFrom[0].secretKeyRef.namespace",
                "reads it on each downstream cluster from the copy in the release namespace (namespace \"web\")",
            ),
        ),
    ];
    let object = |name: &str, spec: &Value| {
        json!({
            "apiVersion": "fleet.cattle.io/v1alpha1", "kind": "HelmOp",
            "metadata": {"name": name, "namespace": ns}, "spec": spec,
        })
    };

    // Offline: `validate` gives every verdict, document by document.
    let file = tempfile::Builder::new().suffix(".yaml").tempfile()?;
    let docs: Vec<String> = cases
        .iter()
        .map(|(name, spec, _, _)| object(name, spec).to_string())
        .collect();
    std::fs::write(file.path(), docs.join("\n---\n"))?;
    let args = [
        "validate",
        "-f",
        &file.path().display().to_string(),
        "-o",
        "json",
    ]
    .map(String::from);
    let report = run_raw(&args, &[]).await?.expect(1).json();
    let documents = report["files"][0]["documents"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(documents.len(), cases.len(), "{report:#}");
    for ((name, _, admitted, (severity, path, phrase)), doc) in cases.iter().zip(&documents) {
        assert_eq!(
            doc["status"],
            if *admitted { "valid" } else { "denied" },
            "{name}: {doc:#}"
        );
        let findings = doc["findings"].as_array().cloned().unwrap_or_default();
        if phrase.is_empty() {
            assert!(findings.is_empty(), "{name}: {doc:#}");
        } else {
            assert!(
                findings.iter().any(|f| f["severity"] == *severity
                    && f["path"] == *path
                    && f["message"].as_str().is_some_and(|m| m.contains(phrase))),
                "{name}: {doc:#}"
            );
        }
    }

    // Online: the webhook on the real API server denies and warns the same way.
    let webhook =
        LocalWebhook::start(client.clone(), helmop_webhook::state::Config::default()).await?;
    let registered = webhook.register(&client, &ns).await?;
    let helmops = fleet_api(&client, &ns, &helmop_resource());
    for (name, spec, admitted, (_, path, phrase)) in &cases {
        let out = kubectl_apply(
            control_plane().upstream(),
            &object(name, spec),
            &["--validate=false"],
        )
        .await?;
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.success(), *admitted, "{name}: {stderr}");
        assert_eq!(helmops.get_opt(name).await?.is_some(), *admitted, "{name}");
        if !phrase.is_empty() {
            assert!(
                stderr.contains(path) && stderr.contains(phrase),
                "{name}: {stderr}"
            );
        }
    }
    registered.remove().await?;
    Ok(())
}
