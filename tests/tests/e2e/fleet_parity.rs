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
//! - `target_restrictions_split_targets_as_fleet_does`: with `targetRestrictions`, Fleet's
//!   target builder treats the leading `targets - restrictions` targets as customizations
//!   (`target/matcher/bundlematch.go`, `target/builder.go`): they never select a cluster, a
//!   regular target selects only clusters a restriction allows, the first matching
//!   customization replaces the options (`FirstMatch`) or all of them merge (`AllMatches`), and
//!   a customization's `doNotDeploy` skips the cluster. Three Fleet Clusters (the two
//!   downstreams and the management cluster), `status` before and after `propagate`.
//! - `created_namespaces_carry_the_merged_namespace_labels`: Fleet gives every
//!   BundleDeployment the root `namespaceLabels`/`namespaceAnnotations` merged with those of all
//!   targets (`target/target.go` `BundleDeployment`; the agent ignores pod-security labels).
//!   `propagate` puts them on the namespaces it creates, `--dry-run` says exactly that, and a
//!   namespace that already exists is left as it is.

use std::collections::BTreeMap;

use helmop_tests::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::PostParams;
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

/// `cluster namespace kind/name -> state` of the rows of one HelmOp in a JSON report.
fn states_of(report: &Value, helmop: &str) -> BTreeMap<String, String> {
    rows(report)
        .iter()
        .filter(|r| {
            r["helmops"]
                .as_array()
                .is_some_and(|h| h.iter().any(|h| h == helmop))
        })
        .map(|r| {
            (
                row_key(r),
                r["state"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn expected(rows_: &[(&str, &str, &str, &str)]) -> BTreeMap<String, String> {
    rows_
        .iter()
        .map(|(cluster, ns, res, state)| (format!("{cluster} {ns} {res}"), state.to_string()))
        .collect()
}

#[tokio::test]
async fn target_restrictions_split_targets_as_fleet_does() -> anyhow::Result<()> {
    let f = Fleet::new("fp-split").await?;
    let cp = control_plane();
    // The management cluster as a third Fleet Cluster, in no restriction of `split`.
    register_fleet_cluster(
        &f.upstream,
        &f.ns,
        "local",
        &[("env", "dev"), ("name", "local")],
        cp.upstream(),
    )
    .await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    create_config_map(&f.upstream, &f.ns, "settings", &[("level", "debug")]).await?;
    let (apps, custom, lead, merged, edge) = (
        f.dest("apps"),
        f.dest("custom"),
        f.dest("lead"),
        f.dest("merged"),
        f.dest("edge"),
    );
    // 3 targets, 1 restriction: targets 0 and 1 are customizations.
    f.helmop(&helmop_yaml(
        "split",
        &format!(
            "defaultNamespace: {apps}
downstreamResources:
- {{kind: Secret, name: db}}
targets:
- clusterName: down1
  namespace: {custom}
  downstreamResources:
  - {{kind: ConfigMap, name: settings}}
- clusterGroup: edge
  doNotDeploy: true
- clusterSelector: {{}}
  namespace: {apps}-never
targetRestrictions:
- clusterSelector: {{matchLabels: {{env: prod}}}}
"
        ),
    ))
    .await?;
    // down2 matches target 0 and the restriction, but target 0 is a customization.
    f.helmop(&helmop_yaml(
        "lead",
        &format!(
            "defaultNamespace: {lead}
downstreamResources:
- {{kind: Secret, name: db}}
targets:
- clusterName: down2
- clusterName: down1
targetRestrictions:
- clusterSelector: {{matchLabels: {{env: prod}}}}
"
        ),
    ))
    .await?;
    // AllMatches: down2 gets both customizations merged (settings, and the edge namespace).
    f.helmop(&helmop_yaml(
        "merged",
        &format!(
            "targetCustomizationMode: AllMatches
defaultNamespace: {merged}
downstreamResources:
- {{kind: Secret, name: db}}
targets:
- clusterSelector: {{matchLabels: {{env: prod}}}}
  downstreamResources:
  - {{kind: ConfigMap, name: settings}}
- clusterName: down2
  namespace: {edge}
- clusterSelector: {{}}
targetRestrictions:
- clusterSelector: {{}}
"
        ),
    ))
    .await?;

    let (d1, d2, local) = (
        format!("{}/down1", f.ns),
        format!("{}/down2", f.ns),
        format!("{}/local", f.ns),
    );
    let want_split = |state: &str| {
        expected(&[
            (&d1, &custom, "Secret/db", state),
            (&d1, &custom, "ConfigMap/settings", state),
        ])
    };
    let want_lead = |state: &str| expected(&[(&d1, &lead, "Secret/db", state)]);
    let want_merged = |state: &str| {
        expected(&[
            (&d1, &merged, "Secret/db", state),
            (&d1, &merged, "ConfigMap/settings", state),
            (&d2, &edge, "Secret/db", state),
            (&d2, &edge, "ConfigMap/settings", state),
            (&local, &merged, "Secret/db", state),
        ])
    };
    let split = format!("{}/split", f.ns);
    let lead_op = format!("{}/lead", f.ns);
    let merged_op = format!("{}/merged", f.ns);

    let before = helmop(&["status", "-n", &f.ns, "-o", "json"]).await?.json();
    assert_eq!(
        states_of(&before, &split),
        want_split("Missing"),
        "{before:#}"
    );
    assert_eq!(
        states_of(&before, &lead_op),
        want_lead("Missing"),
        "{before:#}"
    );
    assert_eq!(
        states_of(&before, &merged_op),
        want_merged("Missing"),
        "{before:#}"
    );

    let run = helmop(&["propagate", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(states_of(&run, &split), want_split("Created"), "{run:#}");
    assert_eq!(states_of(&run, &lead_op), want_lead("Created"), "{run:#}");
    assert_eq!(
        states_of(&run, &merged_op),
        want_merged("Created"),
        "{run:#}"
    );

    let after = helmop(&["status", "-n", &f.ns, "-o", "json"]).await?.json();
    assert_eq!(states_of(&after, &split), want_split("Synced"), "{after:#}");
    assert_eq!(
        states_of(&after, &lead_op),
        want_lead("Synced"),
        "{after:#}"
    );
    assert_eq!(
        states_of(&after, &merged_op),
        want_merged("Synced"),
        "{after:#}"
    );

    // What is really on the clusters, beyond the report.
    let on = |c: &kube::Client| {
        let ns = f.ns.clone();
        let c = c.clone();
        async move { copies_of(&c, &ns).await }
    };
    assert_eq!(
        on(&f.down1).await?,
        [
            place(&custom, "ConfigMap", "settings"),
            place(&custom, "Secret", "db"),
            place(&lead, "Secret", "db"),
            place(&merged, "ConfigMap", "settings"),
            place(&merged, "Secret", "db"),
        ]
        .into(),
    );
    assert_eq!(
        on(&f.down2).await?,
        [
            place(&edge, "ConfigMap", "settings"),
            place(&edge, "Secret", "db"),
        ]
        .into(),
        "down2: split skips it (doNotDeploy customization), lead's target 0 is a customization"
    );
    let upstream_copies = on(&f.upstream).await?;
    assert_eq!(
        upstream_copies,
        [place(&merged, "Secret", "db")].into(),
        "local: no restriction of split allows it"
    );
    for ns in [&apps, &format!("{apps}-never")] {
        for (c, what) in [
            (&f.down1, "down1"),
            (&f.down2, "down2"),
            (&f.upstream, "local"),
        ] {
            assert!(!namespace_exists(c, ns).await?, "{ns} on {what}");
        }
    }
    Ok(())
}

#[tokio::test]
async fn created_namespaces_carry_the_merged_namespace_labels() -> anyhow::Result<()> {
    let f = Fleet::new("fp-nsmeta").await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    let dest = f.dest("apps");
    // down2 already has the namespace, with its own metadata.
    let existing = Api::<Namespace>::all(f.down2.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "metadata": {"name": dest, "labels": {"keep": "me"}, "annotations": {"a": "b"}},
            }))?,
        )
        .await?;
    let yaml = helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {dest}
downstreamResources:
- {{kind: Secret, name: db}}
namespaceLabels: {{team: shop, tier: root}}
namespaceAnnotations: {{note: root}}
targets:
- clusterName: down1
  namespaceLabels: {{tier: web, pod-security.kubernetes.io/enforce: privileged}}
- clusterName: down2
- clusterName: nowhere
  namespaceLabels: {{zone: eu}}
  namespaceAnnotations: {{owner: platform}}
"
        ),
    );
    let file = std::env::temp_dir().join(format!("{}-helmop.yaml", f.ns));
    std::fs::write(&file, &yaml)?;
    let args = ["validate", "-f", &file.display().to_string(), "-o", "json"].map(String::from);
    let validated = run_raw(&args, &[]).await?;
    std::fs::remove_file(&file)?;
    let report = validated.expect(0).json();
    let findings = &report["files"][0]["documents"][0]["findings"];
    assert_eq!(findings.as_array().map(Vec::len), Some(1), "{findings}");
    assert_eq!(findings[0]["severity"], "warn");
    assert_eq!(
        findings[0]["path"],
        "spec.targets[0].namespaceLabels.pod-security.kubernetes.io/enforce"
    );
    f.helmop(&yaml).await?;

    let note = format!(
        "creates namespace {dest} with labels team=shop,tier=web,zone=eu and annotations note=root,owner=platform"
    );
    let d1 = format!("{}/down1", f.ns);
    let d2 = format!("{}/down2", f.ns);
    let dry = helmop(&["propagate", "app", "-n", &f.ns, "--dry-run", "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(writes(&dry), 0, "{dry:#}");
    let dry_rows = rows(&dry);
    let dry_reason = row(&dry_rows, &d1, "db")["reason"].clone();
    assert!(
        dry_reason.as_str().unwrap_or_default().ends_with(&note),
        "{dry:#}"
    );
    assert_eq!(row(&dry_rows, &d1, "db")["state"], "Create");
    let d2_dry = row(&dry_rows, &d2, "db");
    assert_eq!(d2_dry["state"], "Create", "{dry:#}");
    assert!(
        !d2_dry["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("creates namespace"),
        "{dry:#}"
    );
    assert!(
        !namespace_exists(&f.down1, &dest).await?,
        "a dry run creates nothing"
    );

    let real = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let real_rows = rows(&real);
    assert_eq!(row(&real_rows, &d1, "db")["state"], "Created", "{real:#}");
    assert_eq!(
        row(&real_rows, &d1, "db")["reason"],
        dry_reason,
        "the dry run says what the real run does"
    );

    let created = Api::<Namespace>::all(f.down1.clone()).get(&dest).await?;
    let mut labels = created.metadata.labels.clone().unwrap_or_default();
    // Added by newer API servers themselves, not by helmop.
    labels.remove("kubernetes.io/metadata.name");
    assert_eq!(
        labels,
        BTreeMap::from([
            ("team".to_string(), "shop".to_string()),
            ("tier".to_string(), "web".to_string()),
            ("zone".to_string(), "eu".to_string()),
        ])
    );
    assert_eq!(
        created.metadata.annotations.clone().unwrap_or_default(),
        BTreeMap::from([
            ("note".to_string(), "root".to_string()),
            ("owner".to_string(), "platform".to_string()),
        ])
    );
    assert!(get_secret(&f.down1, &dest, "db").await?.is_some());

    let untouched = Api::<Namespace>::all(f.down2.clone()).get(&dest).await?;
    assert_eq!(
        untouched.metadata.resource_version, existing.metadata.resource_version,
        "an existing namespace is never rewritten"
    );
    assert_eq!(label(&untouched.metadata, "team"), None);
    assert!(get_secret(&f.down2, &dest, "db").await?.is_some());

    // Labels are set when helmop creates the namespace, never rewritten later.
    f.helmop(&yaml.replace("team: shop", "team: shop2")).await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    let later = Api::<Namespace>::all(f.down1.clone()).get(&dest).await?;
    assert_eq!(
        later.metadata.resource_version,
        created.metadata.resource_version
    );
    Ok(())
}
