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
//! - `fleet_managed_copies_say_whether_fleets_agent_copied_the_latest`: Fleet's controller
//!   stages downstream resources and bumps a BundleDeployment's
//!   `spec.downstreamResourcesGeneration`; its agent copies them and sets the status's. `status`
//!   reads both (and the HelmOp's `Accepted` condition) to say `FleetManaged (current)`,
//!   `(pending)` or `(blocked)`.
//! - `versions_repos_and_values_from_as_fleet_resolves_them`: Masterminds semver constraints,
//!   `oci://` repos (lower-case, with a version), `http(s)://` repos and valuesFrom naming a
//!   downstream resource, through `validate` and through the webhook on a real API server.
//! - `clusters_of_other_namespaces_through_a_bundle_namespace_mapping`: a Cluster in another
//!   namespace is a candidate only while a `BundleNamespaceMapping` of the HelmOp's namespace
//!   selects the HelmOp's Bundle labels and the Cluster's namespace; its groups are those of its
//!   own namespace and its kubeconfig Secret is read there; `propagate --watch` acts on a new
//!   mapping; `prune` aborts when a mapped namespace's Clusters cannot be listed. Once the
//!   mapping no longer selects the HelmOp (relabelled), its copy is an orphan `prune -n`
//!   removes; once the mapping itself is gone, `prune -A` does.
//! - `a_paused_cluster_gets_nothing_new_until_unpaused` and
//!   `a_paused_helmop_is_neither_copied_updated_nor_pruned`: Fleet stops a BundleDeployment when
//!   its Cluster or its HelmOp is paused (`target.go` `IsPaused`); helmop freezes the copies the
//!   same way (no create, no update, no prune) and reports `Paused` rows saying whether the copy
//!   is current; unpausing resumes.
//! - `a_cluster_off_its_schedule_gets_nothing_new_until_its_schedule_is_active`: a Cluster whose
//!   status says a Schedule holds it outside its window (`scheduled` without `activeSchedule`)
//!   gets BundleDeployments marked `offSchedule`, which Fleet's agent skips (`target.go`
//!   `BundleDeployment`, `bundledeployment_controller.go`) and its controller never deletes as
//!   orphans; helmop freezes its copies like a pause, reports `OffSchedule` rows, and resumes
//!   when the window opens or no Schedule holds it.
//! - `helmops_fleet_rejects_get_no_copies`: a HelmOp Fleet's controller would not turn into a
//!   Bundle (a Policy of its namespace forbids its repo; its `helmSecretName` Secret does not
//!   exist) is `Invalid` with Fleet's reason and gets no copies; a copy made while it was accepted
//!   is left as it is, as Fleet keeps the previous Bundle.
//! - `else_with_and_repeated_keys_in_rendered_values_are_accepted_as_fleet_accepts_them`: Fleet
//!   v0.16.1 builds with go1.26, whose `text/template` has `{{else with}}` (go1.23), and reads
//!   rendered helm values with non-strict `sigs.k8s.io/yaml` (`target/builder.go`
//!   `processTemplateValues`, `processTemplateValuesData`), where a repeated key takes its last
//!   value. Such HelmOps pass `validate`, the webhook admits them on a real API server and
//!   `propagate` copies their downstream resources to every targeted cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::bail;
use helmop_tests::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::plugin::support::*;

/// A fresh [`Fleet`] with the hash key, the Policy CRD, the Policy `policy`, and the source
/// Secret `db` (`k=v1`) upstream.
async fn fleet_with_policy(prefix: &str, policy: Value) -> anyhow::Result<Fleet> {
    let f = Fleet::new(prefix).await?;
    ensure_hash_key(&f.upstream).await?;
    install_fleet_crd(&f.upstream, "policies").await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v1")]).await?;
    create_fleet_object(&f.upstream, &f.ns, &policy_resource(), policy).await?;
    Ok(f)
}

/// Whether some `Invalid` row's reason holds every phrase.
fn invalid_row_says(rows: &[Value], phrases: &[&str]) -> bool {
    rows.iter().any(|r| {
        r["state"] == "Invalid"
            && r["reason"]
                .as_str()
                .is_some_and(|s| phrases.iter().all(|p| s.contains(p)))
    })
}

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
/// How long a watching propagate may take to act on a change.
const WATCH_BOUND: Duration = Duration::from_secs(20);

/// Installs Fleet's BundleNamespaceMapping CRD (not among the harness's CRDs) on `cluster`, as
/// the harness installs the others, and waits until it is served.
async fn install_mapping_crd(cluster: &ClusterInfo, client: &Client) -> anyhow::Result<()> {
    let crds = fleet_crds_dir().display().to_string();
    let file = format!("{crds}/bundlenamespacemappings.fleet.cattle.io.yaml");
    let out = cluster
        .run_kubectl(&["create", "--validate=false", "-f", &file], None)
        .await?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() && !stderr.contains("AlreadyExists") {
        bail!("creating the BundleNamespaceMapping CRD: {stderr}");
    }
    wait_until(
        "BundleNamespaceMappings to be served",
        Duration::from_secs(60),
        || async {
            match client
                .list_api_group_resources("fleet.cattle.io/v1alpha1")
                .await
            {
                Ok(list) => Ok(list
                    .resources
                    .iter()
                    .any(|r| r.name == "bundlenamespacemappings")),
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
                Err(e) => Err(e.into()),
            }
        },
    )
    .await
}

/// down1 plays the management cluster and down2 the downstream one: `-A` runs then see only this
/// test's HelmOps and Clusters (on the shared upstream, `prune -A` would release copies other
/// tests are still looking at), and the CRD installed here changes nothing for other tests.
#[tokio::test]
async fn clusters_of_other_namespaces_through_a_bundle_namespace_mapping() -> anyhow::Result<()> {
    let cp = control_plane();
    let mgmt = cp.cluster(DOWNSTREAM_1);
    let upstream = mgmt.client().await;
    let down = cp.cluster(DOWNSTREAM_2).client().await;
    install_mapping_crd(mgmt, &upstream).await?;
    let team = fresh_namespace(&upstream, "fp-bnm").await?;
    let far =
        fresh_namespace_with_labels(&upstream, "fp-bnm-far", &[("mapped-from", &team)]).await?;
    // The Cluster and its kubeconfig Secret live in `far`; only `far`'s own group selects it.
    register_fleet_cluster(
        &upstream,
        &far,
        "far",
        &[("tier", "edge")],
        cp.cluster(DOWNSTREAM_2),
    )
    .await?;
    create_cluster_group(&upstream, &far, "edge", &[("tier", "edge")], &[]).await?;
    create_secret(&upstream, &team, "db", &[("k", b"v")]).await?;
    let dest = format!("{team}-apps");
    let app = |label: &str| {
        helmop_yaml(
            "app",
            &format!(
                "labels: {{team: {label}}}\ndefaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterGroup: edge\n"
            ),
        )
    };
    apply_helmop(&upstream, &team, &app("web")).await?;
    let kubeconfig = mgmt.kubeconfig.clone();
    let run = |args: &'static [&'static str], ns: &str| {
        let mut full: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        full.extend(["-n".to_string(), ns.to_string(), "-o".into(), "json".into()]);
        let kubeconfig = kubeconfig.clone();
        async move {
            let args: Vec<&str> = full.iter().map(String::as_str).collect();
            run_with(&kubeconfig, &args, &[]).await
        }
    };
    let mapping = |name: &str, namespace_selector: Value| {
        json!({
            "metadata": {"name": name},
            "bundleSelector": {"matchLabels": {"team": "web"}},
            "namespaceSelector": namespace_selector,
        })
    };
    let resource = bundle_namespace_mapping_resource();

    // No mapping, then one without a namespaceSelector: `far` is no candidate.
    for step in ["no mapping", "half a mapping"] {
        if step == "half a mapping" {
            create_fleet_object(&upstream, &team, &resource, mapping("half", Value::Null)).await?;
        }
        let out = run(&["propagate", "app"], &team).await?.expect(0);
        let rows_ = rows(&out.json());
        assert!(row_for(&rows_, "far", "db").is_none(), "{step}: {rows_:#?}");
        assert!(
            get_secret(&down, &dest, "db").await?.is_none(),
            "{step}: no copy on far's cluster"
        );
    }

    // Both selectors: far's Cluster gets the copy, and status has its row. A watching propagate
    // (no resync, so only a watch event can start a run) copies it when the mapping appears.
    let kubeconfig_arg = kubeconfig.display().to_string();
    let mut watcher = PluginProcess::spawn(
        &[
            "propagate",
            "app",
            "-n",
            &team,
            "--watch",
            "--no-leader-election",
            "--debounce",
            "200ms",
            "--resync",
            "0",
            "-o",
            "json",
            "--kubeconfig",
            &kubeconfig_arg,
        ],
        &[],
    )?;
    watcher
        .wait_event("the start-up run", WATCH_BOUND, 0, |e| e["event"] == "run")
        .await?;
    let seen = watcher.events().len();
    create_fleet_object(
        &upstream,
        &team,
        &resource,
        mapping("full", json!({"matchLabels": {"mapped-from": team}})),
    )
    .await?;
    let changed = format!("BundleNamespaceMapping {team}/full changed");
    let woke = watcher
        .wait_event("a run for the new mapping", WATCH_BOUND, seen, |e| {
            e["event"] == "run"
                && e["reasons"].as_array().is_some_and(|r| {
                    r.iter()
                        .any(|x| x.as_str().is_some_and(|s| s.contains(&changed)))
                })
        })
        .await?;
    assert!(woke["writes"].as_u64().unwrap_or(0) >= 1, "{woke}");
    assert!(
        get_secret(&down, &dest, "db").await?.is_some(),
        "the watch copied to far's cluster: {}",
        watcher.context()
    );
    watcher.signal(libc::SIGTERM)?;
    assert_eq!(
        watcher.wait_exit(Duration::from_secs(15)).await?.code(),
        Some(0)
    );

    let out = run(&["propagate", "app"], &team).await?.expect(0);
    let rows_ = rows(&out.json());
    assert!(row_for(&rows_, "far", "db").is_some(), "{rows_:#?}");
    let copy = get_secret(&down, &dest, "db").await?;
    assert!(copy.is_some(), "far's copy through the mapping");
    let status = run(&["status", "app"], &team).await?.expect(0);
    let rows_ = rows(&status.json());
    let row = row_for(&rows_, "far", "db").unwrap_or_else(|| panic!("no far row: {rows_:#?}"));
    assert_eq!(row["state"], "Synced", "{row:#}");

    // Prune stays safe: `near`, a Cluster of the HelmOp's namespace that reaches the same
    // cluster but is not targeted, sees the copy as unwanted. A prune that cannot list the mapped
    // namespace's Clusters must not take that partial picture for the truth.
    register_fleet_cluster(
        &upstream,
        &team,
        "near",
        &[("tier", "core")],
        cp.cluster(DOWNSTREAM_2),
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let limited = kubeconfig_blind_to(mgmt, &upstream, &team, dir.path()).await?;
    let denied = run_with(&limited, &["prune", "-n", &team, "-o", "json"], &[])
        .await?
        .expect(1);
    assert!(
        denied
            .stderr
            .contains(&format!("listing Clusters in {far}")),
        "{}",
        denied.stderr
    );
    assert!(
        get_secret(&down, &dest, "db").await?.is_some(),
        "nothing pruned"
    );
    let pruned = run(&["prune"], &team).await?.expect(0);
    assert_eq!(pruned.json()["writes"], 0, "{}", pruned.stdout);
    assert!(
        get_secret(&down, &dest, "db").await?.is_some(),
        "the mapping still wants the copy"
    );
    fleet_api(&upstream, &team, &cluster_resource())
        .delete("near", &DeleteParams::default())
        .await?;

    // The HelmOp relabelled: the mapping no longer selects it. A namespace-scoped run still
    // visits the namespaces the mapping selects, so status sees the orphan and prune removes it.
    apply_helmop(&upstream, &team, &app("api")).await?;
    let status = run(&["status", "app"], &team).await?.expect(0);
    let rows_ = rows(&status.json());
    let row = row_for(&rows_, "far", "db").unwrap_or_else(|| panic!("no far row: {rows_:#?}"));
    assert_eq!(row["state"], "Orphaned", "{row:#}");
    run(&["prune"], &team).await?.expect(0);
    assert!(
        get_secret(&down, &dest, "db").await?.is_none(),
        "prune -n removed the copy the mapping no longer wants"
    );
    apply_helmop(&upstream, &team, &app("web")).await?;
    run(&["propagate", "app"], &team).await?.expect(0);
    assert!(
        get_secret(&down, &dest, "db").await?.is_some(),
        "copied again"
    );

    // Mapping deleted: nothing wants the copy any more. A namespace-scoped run no longer visits
    // `far`; `-A` visits every Cluster and sees the orphan, which prune removes.
    fleet_api(&upstream, &team, &resource)
        .delete("full", &DeleteParams::default())
        .await?;
    let scoped = run(&["status", "app"], &team).await?.expect(0);
    let rows_ = rows(&scoped.json());
    assert!(row_for(&rows_, "far", "db").is_none(), "{rows_:#?}");
    let all = helmop_all(&kubeconfig, "status").await?;
    let rows_ = rows(&all.json());
    let row = row_for(&rows_, "far", "db").unwrap_or_else(|| panic!("no far row: {rows_:#?}"));
    assert_eq!(row["state"], "Orphaned", "{row:#}");
    assert!(
        get_secret(&down, &dest, "db").await?.is_some(),
        "status deletes nothing"
    );
    helmop_all(&kubeconfig, "prune").await?.expect(0);
    assert!(
        get_secret(&down, &dest, "db").await?.is_none(),
        "prune removed the copy no mapping wants"
    );
    Ok(())
}

async fn helmop_all(kubeconfig: &std::path::Path, command: &str) -> anyhow::Result<Out> {
    run_with(kubeconfig, &[command, "-A", "-o", "json"], &[]).await
}

/// A kubeconfig for `cluster` as a ServiceAccount that may read everything helmop reads in `ns`
/// (and list Namespaces, get kube-system for the upstream id) but nothing in other namespaces.
async fn kubeconfig_blind_to(
    cluster: &ClusterInfo,
    client: &Client,
    ns: &str,
    dir: &std::path::Path,
) -> anyhow::Result<std::path::PathBuf> {
    let name = format!("{ns}-blind");
    let read = json!(["get", "list", "watch"]);
    let objects = json!({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": name, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": name, "namespace": ns},
         "rules": [
            {"apiGroups": ["fleet.cattle.io"], "resources": ["helmops", "clusters", "clustergroups", "bundlenamespacemappings", "policies", "bundles"], "verbs": read},
            {"apiGroups": [""], "resources": ["secrets", "configmaps"], "verbs": read},
         ]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": name, "namespace": ns},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": name},
         "rules": [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ns}]},
    ]});
    let out = cluster
        .run_kubectl(&["apply", "-f", "-"], Some(&objects.to_string()))
        .await?;
    if !out.status.success() {
        bail!(
            "creating the limited ServiceAccount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    service_account_kubeconfig(cluster, client, ns, &name, &dir.join("blind.kubeconfig")).await
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

    // Fleet's controller rejects the HelmOp: its Bundle stays and the Bundle controller still
    // stages the change for the clusters it serves, so it is pending, not blocked.
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
        assert_eq!(verdict, "pending", "{cluster}: {reason}");
        assert!(
            reason.contains("could not get a chart version") && reason.contains("Bundle stays"),
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

/// Writes what Fleet's schedule controller writes on a Cluster, as it does: through the status
/// subresource (`scheduled`: a Schedule matches the Cluster; `activeSchedule`: one is in its
/// window).
async fn set_schedule(f: &Fleet, name: &str, scheduled: bool, active: bool) -> anyhow::Result<()> {
    let status = json!({"scheduled": scheduled, "activeSchedule": active});
    let patched = fleet_api(&f.upstream, &f.ns, &cluster_resource())
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await?;
    // The test means nothing if the API server dropped the fields (pruning, no subresource).
    if patched.data["status"] != status {
        bail!("Cluster {name}: status not written: {:#}", patched.data);
    }
    Ok(())
}

#[tokio::test]
async fn a_cluster_off_its_schedule_gets_nothing_new_until_its_schedule_is_active()
-> anyhow::Result<()> {
    let f = Fleet::new("fp-sched").await?;
    // The management cluster as a third Fleet Cluster: two stay on schedule.
    register_fleet_cluster(
        &f.upstream,
        &f.ns,
        "local",
        &[("env", "dev"), ("name", "local")],
        control_plane().upstream(),
    )
    .await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v1")]).await?;
    let dest = f.dest("apps");
    let targets = |names: &[&str]| {
        let targets: String = names
            .iter()
            .map(|n| format!("- clusterName: {n}\n"))
            .collect();
        helmop_yaml(
            "app",
            &format!(
                "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n{targets}"
            ),
        )
    };
    f.helmop(&targets(&["down1", "down2", "local"])).await?;
    // Matched by a Schedule whose window is closed: Fleet marks its BundleDeployments
    // offSchedule and its agent deploys nothing.
    set_schedule(&f, "down2", true, false).await?;

    // The dry run says exactly what the run does: nothing for the Cluster off its schedule.
    let dry = helmop(&["propagate", "app", "-n", &f.ns, "--dry-run", "-o", "json"]).await?;
    let report = dry.expect(0).json();
    let rows_ = rows(&report);
    assert_eq!(expect_row(&rows_, "down1", "db")["state"], "Create");
    assert_eq!(expect_row(&rows_, "local", "db")["state"], "Create");
    let held = expect_row(&rows_, "down2", "db");
    assert_eq!(
        (&held["state"], &held["inSync"]),
        (&json!("OffSchedule"), &json!(false)),
        "{held:#}"
    );
    assert!(
        held["reason"]
            .as_str()
            .is_some_and(|r| r.contains("off its schedule") && r.contains("no copy yet")),
        "{held:#}"
    );
    assert_eq!(writes(&report), 0);

    let run = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&run.expect(0).json());
    assert_eq!(expect_row(&rows_, "down1", "db")["state"], "Created");
    assert_eq!(expect_row(&rows_, "local", "db")["state"], "Created");
    assert_eq!(expect_row(&rows_, "down2", "db")["state"], "OffSchedule");
    for (client, what) in [(&f.down1, "down1"), (&f.upstream, "local")] {
        assert_eq!(
            copy_value(client, &dest, "db").await?.as_deref(),
            Some("v1"),
            "{what}"
        );
    }
    assert_eq!(
        copy_value(&f.down2, &dest, "db").await?,
        None,
        "no copy on a Cluster off its schedule"
    );

    // The window opens: copied. It closes: a source change reaches only the others.
    set_schedule(&f, "down2", true, true).await?;
    let run = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&run.expect(0).json());
    assert_eq!(expect_row(&rows_, "down2", "db")["state"], "Created");
    set_schedule(&f, "down2", true, false).await?;
    set_source(&f, "db", "v2").await?;
    let run = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"]).await?;
    let report = run.expect(0).json();
    let rows_ = rows(&report);
    assert_eq!(expect_row(&rows_, "down1", "db")["state"], "Updated");
    assert_eq!(expect_row(&rows_, "local", "db")["state"], "Updated");
    assert_eq!(expect_row(&rows_, "down2", "db")["state"], "OffSchedule");
    for (client, what) in [(&f.down1, "down1"), (&f.upstream, "local")] {
        assert_eq!(
            copy_value(client, &dest, "db").await?.as_deref(),
            Some("v2"),
            "{what}"
        );
    }
    assert_eq!(
        copy_value(&f.down2, &dest, "db").await?.as_deref(),
        Some("v1"),
        "updated off schedule"
    );
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&status.expect(0).json());
    let held = expect_row(&rows_, "down2", "db");
    assert_eq!(
        (&held["state"], &held["inSync"]),
        (&json!("OffSchedule"), &json!(false)),
        "{held:#}"
    );
    assert!(
        held["reason"].as_str().is_some_and(
            |r| r.contains("outdated") && r.contains("once its schedule is active again")
        ),
        "{held:#}"
    );
    assert_eq!(expect_row(&rows_, "down1", "db")["state"], "Synced");
    assert_eq!(expect_row(&rows_, "local", "db")["state"], "Synced");

    // Untargeted off schedule: not pruned (Fleet never deletes an offSchedule
    // BundleDeployment as an orphan).
    f.helmop(&targets(&["down1", "local"])).await?;
    let pruned = helmop(&["prune", "app", "-n", &f.ns, "-o", "json"]).await?;
    let rows_ = rows(&pruned.expect(0).json());
    assert_eq!(
        expect_row(&rows_, "down2", "db")["state"],
        "OffSchedule",
        "{rows_:#?}"
    );
    assert!(
        get_secret(&f.down2, &dest, "db").await?.is_some(),
        "pruned off schedule"
    );

    // No Schedule matches it any more: the run resumes (prune removes the untargeted copy).
    set_schedule(&f, "down2", false, false).await?;
    helmop(&["prune", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert!(
        get_secret(&f.down2, &dest, "db").await?.is_none(),
        "not pruned once no Schedule holds the Cluster"
    );
    Ok(())
}

#[tokio::test]
async fn helmops_fleet_rejects_get_no_copies() -> anyhow::Result<()> {
    // The runs below must write nothing at all, not even the upstream hash key.
    let f = fleet_with_policy(
        "fp-reject",
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
        invalid_row_says(&rows(&status), &["disallowed helm repo"]),
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
        invalid_row_says(&rows_, &["helmSecretName Secret repo-creds does not exist"]),
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

    // A name Fleet cannot write into its Bundle's fleet.cattle.io/fleet-helm-name label (a valid
    // object name of 64 characters): Fleet never creates the Bundle, so nothing is copied, and
    // `validate` refuses the file (the spec alone decides).
    let long = format!("long-{}", "n".repeat(59));
    let long_yaml = helmop_yaml(&long, &resources).replacen(
        "repo: https://charts.example.com",
        "repo: https://charts.internal.example",
        1,
    );
    f.helmop(&long_yaml).await?;
    let run = helmop(&["propagate", &long, "-n", &f.ns, "-o", "json"]).await?;
    let report = run.expect(1).json();
    let rows_ = rows(&report);
    assert!(
        invalid_row_says(
            &rows_,
            &[
                "metadata.name: Fleet writes the HelmOp's name into the label fleet.cattle.io/fleet-helm-name"
            ]
        ),
        "{rows_:#?}"
    );
    assert_eq!(writes(&report), 0, "{report:#}");
    let long_file = std::env::temp_dir().join(format!("{}-long.yaml", f.ns));
    std::fs::write(&long_file, &long_yaml)?;
    let long_arg = long_file.display().to_string();
    let validated = helmop(&["validate", "-f", &long_arg, "--cluster"]).await?;
    std::fs::remove_file(&long_file)?;
    let validated = validated.expect(1);
    let said = format!("{}{}", validated.stdout, validated.stderr);
    assert!(
        said.contains("deny: metadata.name") && said.contains("never creates the Bundle"),
        "{said}"
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

    // Labels Fleet writes on the Bundle: a name over 63 characters, a spec.labels value with a
    // '/': the API server would refuse the Bundle, so the HelmOp is denied.
    let helm = json!({"repo": "https://charts.example.com", "chart": "app"});
    for (object, path) in [
        (
            op(&format!("long-{}", "n".repeat(59)), helm.clone(), json!({})),
            "metadata.name",
        ),
        (
            op("labelled", helm.clone(), json!({"labels": {"tier": "a/b"}})),
            "spec.labels.tier",
        ),
    ] {
        let (admitted, stderr) = admit(&object, &[]).await?;
        assert!(!admitted, "{path}: admitted: {stderr}");
        assert!(
            stderr.contains(path) && stderr.contains("Bundle"),
            "{path} missing from: {stderr}"
        );
    }

    // No Policy in the namespace yet: a helmSecretName Secret that does not exist still warns.
    let (admitted, stderr) = admit(
        &op(
            "no-policy",
            helm.clone(),
            json!({"helmSecretName": "repo-creds"}),
        ),
        &["--dry-run=server"],
    )
    .await?;
    assert!(admitted, "{stderr}");
    assert!(
        stderr.contains("helmSecretName Secret repo-creds does not exist"),
        "{stderr}"
    );

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

/// Fleet writes a Cluster's name into the `fleet.cattle.io/cluster` label of
/// every BundleDeployment, so a Cluster named with 64 characters (a valid object name, not a label
/// value) never gets one. A HelmOp targeting it and down1 is copied to down1 only; the run says
/// why the other gets nothing, and neither `propagate` nor `status` lists a row for it.
#[tokio::test]
async fn a_cluster_whose_name_is_no_label_value_gets_nothing() -> anyhow::Result<()> {
    let f = Fleet::new("fp-longname").await?;
    ensure_hash_key(&f.upstream).await?;
    let long = format!("edge-{}", "c".repeat(59));
    register_fleet_cluster(
        &f.upstream,
        &f.ns,
        &long,
        &[("env", "prod")],
        control_plane().cluster(DOWNSTREAM_2),
    )
    .await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v1")]).await?;
    let dest = f.dest("apps");
    let resources = format!(
        "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n- clusterName: {long}\n"
    );
    f.helmop(&helmop_yaml("app", &resources)).await?;
    let run = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert!(
        run.stderr.contains(&long) && run.stderr.contains("Fleet never deploys anything there"),
        "{}",
        run.stderr
    );
    let about_long = |report: &Value| {
        rows(report)
            .into_iter()
            .filter(|r| r.to_string().contains(&long))
            .collect::<Vec<_>>()
    };
    let report = run.json();
    assert!(about_long(&report).is_empty(), "{report:#}");
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v1")
    );
    assert!(
        get_secret(&f.down2, &dest, "db").await?.is_none(),
        "copied to the Cluster Fleet never deploys to"
    );
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert!(about_long(&status).is_empty(), "{status:#}");
    Ok(())
}

/// Fleet's Bundle controller checks every target's own `serviceAccount` against
/// the Policies' `allowedServiceAccounts` (`AuthorizeBundle`) and refuses the whole Bundle when
/// one is outside, although the HelmOp controller accepted the HelmOp (its own service account is
/// allowed): no copy on any cluster. Once the target's account is allowed, both clusters get one.
#[tokio::test]
async fn a_targets_service_account_outside_the_policy_blocks_every_cluster() -> anyhow::Result<()> {
    let f = fleet_with_policy(
        "fp-targetsa",
        json!({"metadata": {"name": "deployers"}, "allowedServiceAccounts": ["deployer", "edge"]}),
    )
    .await?;
    let dest = f.dest("apps");
    let spec = |edge_account: &str| {
        format!(
            "serviceAccount: deployer\ndefaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n- clusterName: down2\n  serviceAccount: {edge_account}\n"
        )
    };
    f.helmop(&helmop_yaml("app", &spec("root"))).await?;
    let report = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1)
        .json();
    let rows_ = rows(&report);
    assert!(
        invalid_row_says(
            &rows_,
            &["a Fleet Policy forbids it: disallowed serviceAccount root in target target001"]
        ),
        "{rows_:#?}"
    );
    assert_eq!(writes(&report), 0, "{report:#}");
    assert!(get_secret(&f.down1, &dest, "db").await?.is_none());
    assert!(get_secret(&f.down2, &dest, "db").await?.is_none());

    f.helmop(&helmop_yaml("app", &spec("edge"))).await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    for client in [&f.down1, &f.down2] {
        assert_eq!(
            copy_value(client, &dest, "db").await?.as_deref(),
            Some("v1")
        );
    }
    Ok(())
}

/// Policy patterns are Go regular expressions: `\w` is ASCII and `\Q...\E` quotes, where Rust's
/// `regex` used directly would allow `café` and refuse to compile `\Q`.
#[tokio::test]
async fn policy_patterns_mean_what_go_makes_of_them() -> anyhow::Result<()> {
    let f = fleet_with_policy(
        "fp-goregex",
        json!({
            "metadata": {"name": "charts"},
            "helmOp": {"allowedChartPatterns": ["\\w+", "\\Qweb.app\\E"]},
        }),
    )
    .await?;
    let dest = f.dest("apps");
    let spec = format!(
        "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n- clusterName: down2\n"
    );
    let with_chart = |name: &str, chart: &str| {
        helmop_yaml(name, &spec).replacen("chart: app", &format!("chart: {chart}"), 1)
    };
    f.helmop(&with_chart("accented", "café")).await?;
    let report = helmop(&["propagate", "accented", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1)
        .json();
    assert!(
        invalid_row_says(&rows(&report), &["disallowed helm chart café"]),
        "{report:#}"
    );
    assert_eq!(writes(&report), 0, "{report:#}");
    for client in [&f.down1, &f.down2] {
        assert!(get_secret(client, &dest, "db").await?.is_none());
    }

    // `\w+` does not match `web.app`, then the quoted pattern does: copied to both clusters.
    f.helmop(&with_chart("quoted", "web.app")).await?;
    helmop(&["propagate", "quoted", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    for client in [&f.down1, &f.down2] {
        assert_eq!(
            copy_value(client, &dest, "db").await?.as_deref(),
            Some("v1")
        );
    }
    let status = helmop(&["status", "quoted", "-n", &f.ns, "-o", "json"]).await?;
    let status = status.expect(0).json();
    assert!(
        rows(&status).iter().all(|r| r["state"] != "Invalid"),
        "{status:#}"
    );
    Ok(())
}

/// Fleet's HelmOp controller rejecting a HelmOp it accepted earlier leaves the Bundle it made,
/// and the Bundle controller keeps delivering that Bundle: its targets and downstream resources,
/// with every source change, for as long as its own Policy check passes.
#[tokio::test]
async fn a_rejected_helmop_keeps_delivering_through_its_previous_bundle() -> anyhow::Result<()> {
    let f = Fleet::new("fp-follow").await?;
    ensure_hash_key(&f.upstream).await?;
    install_fleet_crd(&f.upstream, "policies").await?;
    install_fleet_crd(&f.upstream, "bundles").await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v1")]).await?;
    create_secret(&f.upstream, &f.ns, "extra", &[("k", b"x")]).await?;
    let dest = f.dest("apps");
    let spec = |resources: &str| {
        format!(
            "defaultNamespace: {dest}\ndownstreamResources:\n{resources}targets:\n- clusterName: down1\n- clusterName: down2\n"
        )
    };
    let db_only = "- {kind: Secret, name: db}\n";
    f.helmop(&helmop_yaml("app", &spec(db_only))).await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    // The Bundle Fleet made when it accepted the HelmOp (`calculateBundle`: the spec, targets
    // named by position, the fleet-helm-name label).
    create_fleet_object(
        &f.upstream,
        &f.ns,
        &bundle_resource(),
        json!({
            "metadata": {"name": "app", "labels": {"fleet.cattle.io/fleet-helm-name": "app"}},
            "spec": {
                "helmOpOptions": {},
                "helm": {"repo": "https://charts.example.com", "chart": "app", "version": "1.0.0"},
                "defaultNamespace": dest,
                "downstreamResources": [{"kind": "Secret", "name": "db"}],
                "targets": [
                    {"name": "target000", "clusterName": "down1"},
                    {"name": "target001", "clusterName": "down2"},
                ],
            },
        }),
    )
    .await?;
    // A Policy added later rejects the HelmOp; its next edit never reaches the Bundle.
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
    f.helmop(&helmop_yaml(
        "app",
        &spec(&format!("{db_only}- {{kind: Secret, name: extra}}\n")),
    ))
    .await?;
    set_source(&f, "db", "v2").await?;
    let report = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1)
        .json();
    assert!(
        invalid_row_says(
            &rows(&report),
            &["disallowed helm repo", "Fleet keeps its previous Bundle"]
        ),
        "{report:#}"
    );
    for client in [&f.down1, &f.down2] {
        assert_eq!(
            copy_value(client, &dest, "db").await?.as_deref(),
            Some("v2"),
            "the Bundle still delivers source changes"
        );
        assert!(
            get_secret(client, &dest, "extra").await?.is_none(),
            "the rejected spec's new entry is not the Bundle's"
        );
    }
    let status = helmop(&["status", "app", "-n", &f.ns, "-o", "json"]).await?;
    let status = rows(&status.expect(1).json());
    for cluster in ["down1", "down2"] {
        let row = expect_row(&status, cluster, "db");
        assert_eq!(row["state"], json!("Synced"), "{row:#}");
    }

    // The Bundle controller refuses the Bundle too (its own Policy check): nothing delivers, the
    // copies stay as they are and are not pruned.
    create_fleet_object(
        &f.upstream,
        &f.ns,
        &policy_resource(),
        json!({"metadata": {"name": "accounts"}, "requireServiceAccount": true}),
    )
    .await?;
    set_source(&f, "db", "v3").await?;
    let report = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1)
        .json();
    assert!(
        invalid_row_says(&rows(&report), &["refuses its previous Bundle too"]),
        "{report:#}"
    );
    assert_eq!(writes(&report), 0, "{report:#}");
    helmop(&["prune", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    for client in [&f.down1, &f.down2] {
        assert_eq!(
            copy_value(client, &dest, "db").await?.as_deref(),
            Some("v2")
        );
    }
    fleet_api(&f.upstream, &f.ns, &policy_resource())
        .delete("accounts", &DeleteParams::default())
        .await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1);
    assert_eq!(
        copy_value(&f.down2, &dest, "db").await?.as_deref(),
        Some("v3")
    );

    // Without a Bundle nothing delivers: frozen.
    fleet_api(&f.upstream, &f.ns, &bundle_resource())
        .delete("app", &DeleteParams::default())
        .await?;
    set_source(&f, "db", "v4").await?;
    let report = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1)
        .json();
    assert!(
        invalid_row_says(&rows(&report), &["it has no Bundle"]),
        "{report:#}"
    );
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v3")
    );
    Ok(())
}

/// `rolloutStrategy.partitions`: Fleet makes BundleDeployments only for clusters some partition
/// holds, a partition without criteria holds none, and a value Fleet cannot read fails the
/// whole Bundle.
#[tokio::test]
async fn rollout_partitions_decide_which_clusters_get_copies() -> anyhow::Result<()> {
    let f = Fleet::new("fp-partitions").await?;
    ensure_hash_key(&f.upstream).await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v1")]).await?;
    let dest = f.dest("apps");
    let spec = |rollout: &str| {
        format!(
            "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterSelector: {{matchLabels: {{env: prod}}}}\nrolloutStrategy:\n{rollout}"
        )
    };
    // Only the `edge` group's cluster (down2) is in a partition; the second has no criteria.
    let partitioned = "  partitions:\n  - name: edge\n    clusterGroup: edge\n  - name: nothing\n";
    f.helmop(&helmop_yaml("app", &spec(partitioned))).await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert_eq!(
        copy_value(&f.down2, &dest, "db").await?.as_deref(),
        Some("v1")
    );
    assert!(
        get_secret(&f.down1, &dest, "db").await?.is_none(),
        "down1 is in no partition"
    );

    // Every cluster in a partition: both get it.
    let both = "  partitions:\n  - name: edge\n    clusterGroup: edge\n  - name: rest\n    clusterName: down1\n";
    f.helmop(&helmop_yaml("app", &spec(both))).await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v1")
    );

    // "25 %" is no percentage Fleet reads: the whole Bundle fails, nothing new anywhere.
    let unreadable = "  maxUnavailable: 25 %\n";
    f.helmop(&helmop_yaml("app", &spec(unreadable))).await?;
    set_source(&f, "db", "v2").await?;
    let report = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1)
        .json();
    assert!(
        invalid_row_says(
            &rows(&report),
            &[
                "Fleet's Bundle controller fails the Bundle on every cluster: failed to reset bundle status from targets: failed to parse 25 %"
            ]
        ),
        "{report:#}"
    );
    assert_eq!(writes(&report), 0, "{report:#}");
    for client in [&f.down1, &f.down2] {
        assert_eq!(
            copy_value(client, &dest, "db").await?.as_deref(),
            Some("v1")
        );
    }
    // `validate` says so from the file alone.
    let file = std::env::temp_dir().join(format!("{}-rollout.yaml", f.ns));
    std::fs::write(&file, helmop_yaml("app", &spec(unreadable)))?;
    let file_arg = file.display().to_string();
    let validated = helmop(&["validate", "-f", &file_arg, "--cluster"]).await?;
    std::fs::remove_file(&file)?;
    let validated = validated.expect(1);
    let said = format!("{}{}", validated.stdout, validated.stderr);
    assert!(
        said.contains("spec.rolloutStrategy.maxUnavailable")
            && said.contains("fails the whole Bundle"),
        "{said}"
    );
    Ok(())
}

/// Sets the labels of namespace `name` on `client`, creating it when absent.
async fn namespace_with_labels(
    client: &Client,
    name: &str,
    labels: &[(&str, &str)],
) -> anyhow::Result<()> {
    let labels: BTreeMap<&str, &str> = labels.iter().copied().collect();
    Api::<Namespace>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply("helmop-tests").force(),
            &Patch::Apply(json!({
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": labels},
            })),
        )
        .await?;
    Ok(())
}

/// `allowedTargetNamespaceSelector`: Fleet's agent copies only into a destination namespace that
/// exists downstream and matches it, and never creates it.
#[tokio::test]
async fn an_allowed_target_namespace_selector_admits_only_existing_matching_namespaces()
-> anyhow::Result<()> {
    let f = Fleet::new("fp-nsgate").await?;
    ensure_hash_key(&f.upstream).await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v1")]).await?;
    let dest = f.dest("apps");
    let spec = format!(
        "defaultNamespace: {dest}\nallowedTargetNamespaceSelector: {{matchLabels: {{tenant: a}}}}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterSelector: {{matchLabels: {{env: prod}}}}\n"
    );
    f.helmop(&helmop_yaml("app", &spec)).await?;
    let report = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1)
        .json();
    for cluster in ["down1", "down2"] {
        let row = expect_row(&rows(&report), cluster, "db").clone();
        assert_eq!(row["state"], "Invalid", "{row:#}");
        assert!(
            row["reason"]
                .as_str()
                .is_some_and(|s| s.contains("does not exist on downstream cluster")),
            "{row:#}"
        );
    }
    assert_eq!(writes(&report), 0, "{report:#}");
    for client in [&f.down1, &f.down2] {
        let ns = Api::<Namespace>::all(client.clone()).get_opt(&dest).await?;
        assert!(ns.is_none(), "the namespace must not be created");
    }

    // Only the namespace whose labels match gets the copy.
    namespace_with_labels(&f.down1, &dest, &[("tenant", "a")]).await?;
    namespace_with_labels(&f.down2, &dest, &[("tenant", "b")]).await?;
    let report = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1)
        .json();
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v1")
    );
    assert!(get_secret(&f.down2, &dest, "db").await?.is_none());
    let refused = expect_row(&rows(&report), "down2", "db").clone();
    assert!(
        refused["reason"]
            .as_str()
            .is_some_and(|s| s.contains("does not match AllowedTargetNamespaceSelector")),
        "{refused:#}"
    );

    // Relabelled to match: copied. Relabelled away again: the copy stays as it is (not
    // updated, not pruned), as Fleet's agent stops before copying.
    namespace_with_labels(&f.down2, &dest, &[("tenant", "a")]).await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert_eq!(
        copy_value(&f.down2, &dest, "db").await?.as_deref(),
        Some("v1")
    );
    namespace_with_labels(&f.down2, &dest, &[("tenant", "b")]).await?;
    set_source(&f, "db", "v2").await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1);
    helmop(&["prune", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    assert_eq!(
        copy_value(&f.down1, &dest, "db").await?.as_deref(),
        Some("v2")
    );
    assert_eq!(
        copy_value(&f.down2, &dest, "db").await?.as_deref(),
        Some("v1")
    );
    Ok(())
}

/// Helm values templating (`target/builder.go` `preprocessHelmValues`): Fleet renders
/// `spec.helm.values` as a Go template for every targeted cluster with labels, and one failure
/// fails the Bundle on every cluster; `disablePreProcess` turns the templating off.
#[tokio::test]
async fn a_values_template_failing_on_one_cluster_blocks_every_cluster() -> anyhow::Result<()> {
    let f = Fleet::new("fp-values-tpl").await?;
    ensure_hash_key(&f.upstream).await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v1")]).await?;
    let dest = f.dest("apps");
    let op = |values: &str| {
        helmop_yaml(
            "app",
            &format!(
                "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterSelector: {{matchLabels: {{env: prod}}}}"
            ),
        )
        .replace("    version: 1.0.0\n", &format!("    version: 1.0.0\n{values}"))
    };
    // down1 has no `tier` label: missingkey=error fails it, so nobody gets anything.
    let failing = "    values:\n      tier: ${ .ClusterLabels.tier }\n";
    f.helmop(&op(failing)).await?;
    let report = helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(1)
        .json();
    assert!(
        invalid_row_says(
            &rows(&report),
            &[
                "Fleet's Bundle controller fails the Bundle on every cluster: cluster down1 in namespace",
                "failed to render helm values template: template: values:",
                "map has no entry for key \"tier\"",
            ]
        ),
        "{report:#}"
    );
    assert_eq!(writes(&report), 0, "{report:#}");
    for client in [&f.down1, &f.down2] {
        assert!(get_secret(client, &dest, "db").await?.is_none());
    }

    // Templates that render everywhere: both clusters get copies.
    for values in [
        "    values:\n      tier: ${ default \"none\" (index .ClusterLabels \"tier\") }\n",
        "    values:\n      env: ${ .ClusterLabels.env }\n",
    ] {
        f.helmop(&op(values)).await?;
        helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
            .await?
            .expect(0);
        for client in [&f.down1, &f.down2] {
            assert_eq!(
                copy_value(client, &dest, "db").await?.as_deref(),
                Some("v1")
            );
        }
    }

    // disablePreProcess: the failing template is never rendered, so it blocks nothing.
    set_source(&f, "db", "v2").await?;
    f.helmop(&op(&format!("    disablePreProcess: true\n{failing}")))
        .await?;
    helmop(&["propagate", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0);
    for client in [&f.down1, &f.down2] {
        assert_eq!(
            copy_value(client, &dest, "db").await?.as_deref(),
            Some("v2")
        );
    }

    // `validate` denies a template Go cannot parse, from the file alone.
    let file = std::env::temp_dir().join(format!("{}-values.yaml", f.ns));
    std::fs::write(
        &file,
        op("    values:\n      tier: ${ toYaml .ClusterLabels }\n"),
    )?;
    let file_arg = file.display().to_string();
    let validated = helmop(&["validate", "-f", &file_arg, "--cluster"]).await?;
    std::fs::remove_file(&file)?;
    let validated = validated.expect(1);
    let said = format!("{}{}", validated.stdout, validated.stderr);
    assert!(
        said.contains("spec.helm.values") && said.contains("function \"toYaml\" not defined"),
        "{said}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn else_with_and_repeated_keys_in_rendered_values_are_accepted_as_fleet_accepts_them()
-> anyhow::Result<()> {
    let f = Fleet::new("fp-go126").await?;
    ensure_hash_key(&f.upstream).await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v1")]).await?;
    let webhook = LocalWebhook::start(f.upstream.clone(), Default::default()).await?;
    let _registered = webhook.register(&f.upstream, &f.ns).await?;
    let op = |name: &str, helm: Value| {
        let mut spec_helm =
            json!({"repo": "https://charts.example.com", "chart": "app", "version": "1.0.0"});
        if let (Some(into), Some(extra)) = (spec_helm.as_object_mut(), helm.as_object()) {
            into.extend(extra.clone());
        }
        json!({
            "apiVersion": "fleet.cattle.io/v1alpha1",
            "kind": "HelmOp",
            "metadata": {"name": name, "namespace": f.ns},
            "spec": {
                "helm": spec_helm,
                "defaultNamespace": f.dest(name),
                "downstreamResources": [{"kind": "Secret", "name": "db"}],
                "targets": [{"clusterSelector": {"matchLabels": {"env": "prod"}}}],
            },
        })
    };
    let cases = [
        // go1.23's `{{else with}}`: down1 renders `prod` (its env), down2 `edge` (its tier).
        (
            "else-with",
            json!({"templateValues": {
                "tier": "${ with index .ClusterLabels \"tier\" }${ . }${ else with .ClusterLabels.env }${ . }${ else }none${ end }"
            }}),
        ),
        // Rendered values repeating a key: Fleet's reader keeps the last one.
        (
            "repeated-keys",
            json!({
                "values": {"region": "eu", "${ \"region\" }": "${ .ClusterLabels.env }"},
                "templateValues": {"config": "replicas: 1\nreplicas: ${ len .ClusterName }"},
            }),
        ),
    ];
    for (name, helm) in cases {
        let object = op(name, helm);
        // `validate`, offline.
        let file = std::env::temp_dir().join(format!("{}-{name}.json", f.ns));
        std::fs::write(&file, serde_json::to_string_pretty(&object)?)?;
        let file_arg = file.display().to_string();
        let args = ["validate", "-f", &file_arg].map(String::from);
        let validated = run_raw(&args, &[]).await?;
        std::fs::remove_file(&file)?;
        let validated = validated.expect(0);
        assert!(
            !format!("{}{}", validated.stdout, validated.stderr).contains("template"),
            "{name}: {validated:?}"
        );

        // The webhook, through the real API server.
        let (admitted, stderr) = admit(&object, &[]).await?;
        assert!(admitted, "{name} denied: {stderr}");

        // `propagate` renders the values for both clusters and copies, nothing is Invalid.
        let report = helmop(&["propagate", name, "-n", &f.ns, "-o", "json"])
            .await?
            .expect(0)
            .json();
        assert!(
            rows(&report).iter().all(|r| r["state"] != "Invalid"),
            "{name}: {report:#}"
        );
        for client in [&f.down1, &f.down2] {
            assert_eq!(
                copy_value(client, &f.dest(name), "db").await?.as_deref(),
                Some("v1"),
                "{name}: {report:#}"
            );
        }
    }
    Ok(())
}
