//! A claimed identity only makes helmop more careful (docs/cluster-identity.md): registrations
//! whose endpoints answer one `kube-system` UID each get their own copies through their own
//! credentials, and a registration that may not read its identity is still served through its
//! own. The impostor is a real API server (`down2`) behind an endpoint that answers `down1`'s
//! `kube-system` namespace: what a clone restored from `down1`'s etcd snapshot, or an attacker
//! who read the UID from a Fleet Cluster, would look like.

use std::collections::BTreeSet;

use helmop_tests::*;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use serde_json::Value;

use crate::plugin::support::*;

/// Serves `target`'s API (through the test's admin client of `target`) on a loopback HTTPS port,
/// except that `get namespaces/kube-system` answers `claimed`'s. Reach it with
/// [`loopback_kubeconfig`].
async fn claiming_endpoint(target: &ClusterInfo, claimed: &ClusterInfo) -> anyhow::Result<u16> {
    let kube_system = Api::<Namespace>::all(claimed.client().await)
        .get("kube-system")
        .await?;
    let kube_system = serde_json::to_value(kube_system)?;
    let client = target.client().await;
    let app = axum::Router::new().fallback(move |request: axum::extract::Request| {
        let (client, kube_system) = (client.clone(), kube_system.clone());
        async move { forward(client, kube_system, request).await }
    });
    serve_tls(app, &test_certs()).await
}

async fn forward(
    client: kube::Client,
    kube_system: Value,
    request: axum::extract::Request,
) -> axum::response::Response {
    use axum::http::{Method, StatusCode, header};
    use axum::response::IntoResponse;
    if request.method() == Method::GET && request.uri().path() == "/api/v1/namespaces/kube-system" {
        return axum::Json(kube_system).into_response();
    }
    let (parts, body) = request.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, 64 << 20).await else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut out = axum::http::Request::builder()
        .method(parts.method)
        .uri(path);
    for (name, value) in &parts.headers {
        if name != header::AUTHORIZATION && name != header::HOST {
            out = out.header(name, value);
        }
    }
    let Ok(request) = out.body(kube::client::Body::from(bytes.to_vec())) else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    match client.send(request).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            axum::response::Response::from_parts(parts, axum::body::Body::new(body))
        }
        Err(e) => (StatusCode::BAD_GATEWAY, e.to_string()).into_response(),
    }
}

/// Registers Fleet Cluster `ns/name` whose kubeconfig Secret holds `yaml`.
async fn register_with_kubeconfig(
    f: &Fleet,
    dir: &std::path::Path,
    name: &str,
    yaml: &str,
) -> anyhow::Result<()> {
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, yaml)?;
    let info = ClusterInfo {
        kubeconfig: path,
        ..control_plane().cluster(DOWNSTREAM_2).clone()
    };
    register_fleet_cluster(&f.upstream, &f.ns, name, &[], &info).await?;
    Ok(())
}

fn states_of(report: &Value) -> BTreeSet<String> {
    rows(report)
        .iter()
        .filter_map(|r| r["state"].as_str().map(String::from))
        .collect()
}

/// `(cluster, namespace, state)` of every row, a dry run's verbs in the real run's tense.
fn outcome(report: &Value) -> BTreeSet<(String, String, String)> {
    rows(report)
        .iter()
        .map(|r| {
            let state = match r["state"].as_str().unwrap_or_default() {
                "Create" => "Created",
                "Update" => "Updated",
                "Prune" => "Pruned",
                "Release" => "Released",
                other => other,
            };
            (
                r["cluster"].as_str().unwrap_or_default().to_string(),
                r["namespace"].as_str().unwrap_or_default().to_string(),
                state.to_string(),
            )
        })
        .collect()
}

/// `COMMAND -n NS` dry, then for real (exit 0 both): the dry run must announce exactly what the
/// real run does. The real report.
async fn dry_then_real(command: &str, ns: &str) -> anyhow::Result<Value> {
    let dry = helmop(&[command, "-n", ns, "--dry-run", "-o", "json"])
        .await?
        .expect(0)
        .json();
    let real = helmop(&[command, "-n", ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(outcome(&dry), outcome(&real), "{dry:#}\n{real:#}");
    Ok(real)
}

/// One HelmOp per `(name, cluster, destination namespace, Secret)`, copying that Secret there.
async fn secret_helmops(f: &Fleet, helmops: &[(&str, &str, &str, &str)]) -> anyhow::Result<()> {
    for (helmop_name, cluster, dest, secret) in helmops {
        f.helmop(&helmop_yaml(
            helmop_name,
            &format!(
                "downstreamResources:\n- {{kind: Secret, name: {secret}}}\ntargets:\n- clusterName: {cluster}\n  namespace: {dest}\n"
            ),
        ))
        .await?;
    }
    Ok(())
}

/// Two registrations (sorting before and after the victim) whose endpoint is `down2`
/// but claims `down1`'s identity. Before, all three were merged and written through one
/// client: the victim's Secret landed on the impostor, or the impostors' copies went through
/// the victim's credentials.
#[tokio::test]
async fn an_endpoint_claiming_another_clusters_identity_gets_only_its_own_copies()
-> anyhow::Result<()> {
    let f = Fleet::new("id-claim").await?;
    let dir = tempfile::tempdir()?;
    let cp = control_plane();
    let port = claiming_endpoint(cp.cluster(DOWNSTREAM_2), cp.cluster(DOWNSTREAM_1)).await?;
    for name in ["a-claim", "z-claim"] {
        register_with_kubeconfig(&f, dir.path(), name, &loopback_kubeconfig(port)).await?;
    }
    let (victim, a, z) = (f.dest("victim"), f.dest("a"), f.dest("z"));
    for (secret, value) in [
        ("victim-db", b"secret"),
        ("a-db", b"a-data"),
        ("z-db", b"z-data"),
    ] {
        create_secret(&f.upstream, &f.ns, secret, &[("k", value)]).await?;
    }
    secret_helmops(
        &f,
        &[
            ("victim", "down1", victim.as_str(), "victim-db"),
            ("tenant-a", "a-claim", a.as_str(), "a-db"),
            ("tenant-z", "z-claim", z.as_str(), "z-db"),
        ],
    )
    .await?;

    let out = dry_then_real("propagate", &f.ns).await?;
    let cluster = |name: &str| format!("{}/{name}", f.ns);
    assert_eq!(
        outcome(&out),
        BTreeSet::from([
            (cluster("down1"), victim.clone(), "Created".to_string()),
            (cluster("a-claim"), a.clone(), "Created".to_string()),
            (cluster("z-claim"), z.clone(), "Created".to_string()),
        ]),
        "{out:#}"
    );
    // Each copy went through its own registration's endpoint, and nowhere else.
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        BTreeSet::from([place(&victim, "Secret", "victim-db")])
    );
    assert_eq!(
        copies_of(&f.down2, &f.ns).await?,
        BTreeSet::from([place(&a, "Secret", "a-db"), place(&z, "Secret", "z-db")])
    );

    // Every registration's own copy is in sync. down2's registration, whose endpoint claims
    // down2, finds the impostors' copies on down2 and wants none of them: a false claim
    // cannot protect copies on the cluster really reached (docs/cluster-identity.md).
    let status = helmop(&["status", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let down2 = cluster("down2");
    let (on_down2, own): (Vec<Value>, Vec<Value>) = rows(&status)
        .into_iter()
        .partition(|r| r["cluster"] == down2.as_str());
    assert_eq!(own.len(), 3, "{status:#}");
    assert!(own.iter().all(|r| r["state"] == "Synced"), "{status:#}");
    assert_eq!(
        on_down2
            .iter()
            .map(|r| (
                r["namespace"].as_str().unwrap_or_default(),
                r["state"].as_str().unwrap_or_default()
            ))
            .collect::<BTreeSet<_>>(),
        BTreeSet::from([(a.as_str(), "Orphaned"), (z.as_str(), "Orphaned")]),
        "{status:#}"
    );

    // A rotation reaches the victim's cluster only.
    let rotated = serde_json::json!({"k": b64(b"rotated")});
    set_secret_data(&f.upstream, &f.ns, "victim-db", rotated).await?;
    let out = helmop(&["propagate", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(
        row(&rows(&out), &cluster("down1"), "victim-db")["state"],
        "Updated",
        "{out:#}"
    );
    assert!(get_secret(&f.down2, &victim, "victim-db").await?.is_none());

    // The victim's copy is never pruned; what prune does through down2 is what status said.
    let pruned = dry_then_real("prune", &f.ns).await?;
    assert_eq!(
        outcome(&pruned),
        BTreeSet::from([
            (down2.clone(), a.clone(), "Pruned".to_string()),
            (down2.clone(), z.clone(), "Pruned".to_string()),
        ]),
        "{pruned:#}"
    );
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        BTreeSet::from([place(&victim, "Secret", "victim-db")])
    );
    Ok(())
}

/// A ServiceAccount of `down1` that may write Secrets and ConfigMaps and restamp workloads in
/// `ns` only (no `kube-system`, no cluster-wide list, no Namespace object): its kubeconfig.
async fn namespace_writer_kubeconfig(
    down1: &kube::Client,
    ns: &str,
    dir: &std::path::Path,
) -> anyhow::Result<String> {
    let meta = |name: &str| ObjectMeta {
        name: Some(name.into()),
        namespace: Some(ns.into()),
        ..ObjectMeta::default()
    };
    Api::<Namespace>::all(down1.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(ns.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            },
        )
        .await?;
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(down1.clone(), ns)
        .create(
            &PostParams::default(),
            &k8s_openapi::api::core::v1::ServiceAccount {
                metadata: meta("writer"),
                ..Default::default()
            },
        )
        .await?;
    Api::<Role>::namespaced(down1.clone(), ns)
        .create(
            &PostParams::default(),
            &Role {
                metadata: meta("writer"),
                rules: Some(vec![
                    PolicyRule {
                        api_groups: Some(vec![String::new()]),
                        resources: Some(vec!["secrets".into(), "configmaps".into()]),
                        verbs: [
                            "get", "list", "watch", "create", "update", "patch", "delete",
                        ]
                        .map(String::from)
                        .to_vec(),
                        ..PolicyRule::default()
                    },
                    // The readers helmop restamps.
                    PolicyRule {
                        api_groups: Some(
                            ["apps", "batch", "argoproj.io"].map(String::from).to_vec(),
                        ),
                        resources: Some(
                            [
                                "deployments",
                                "statefulsets",
                                "daemonsets",
                                "cronjobs",
                                "rollouts",
                            ]
                            .map(String::from)
                            .to_vec(),
                        ),
                        verbs: ["get", "list", "patch"].map(String::from).to_vec(),
                        ..PolicyRule::default()
                    },
                ]),
            },
        )
        .await?;
    Api::<RoleBinding>::namespaced(down1.clone(), ns)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: meta("writer"),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: "writer".into(),
                },
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "writer".into(),
                    namespace: Some(ns.into()),
                    ..Subject::default()
                }]),
            },
        )
        .await?;
    let path = dir.join("writer.kubeconfig");
    let cp = control_plane();
    service_account_kubeconfig(cp.cluster(DOWNSTREAM_1), down1, ns, "writer", &path).await?;
    Ok(std::fs::read_to_string(path)?)
}

/// A namespace-scoped kubeconfig cannot read `kube-system`. Before, the registration
/// was Unreachable forever; now it is served through its own credentials, its wants protect
/// the copies other registrations see, and prune deletes nothing through it.
#[tokio::test]
async fn a_registration_that_cannot_read_its_identity_is_served_through_its_own_credentials()
-> anyhow::Result<()> {
    let f = Fleet::new("id-scoped-creds").await?;
    let dir = tempfile::tempdir()?;
    let (own, other) = (f.dest("own"), f.dest("other"));
    let yaml = namespace_writer_kubeconfig(&f.down1, &own, dir.path()).await?;
    register_with_kubeconfig(&f, dir.path(), "scoped", &yaml).await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    let spec = |targets: &str| {
        format!("downstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n{targets}")
    };
    let both = format!(
        "- clusterName: scoped\n  namespace: {own}\n- clusterName: down1\n  namespace: {other}\n"
    );
    f.helmop(&helmop_yaml("app", &spec(&both))).await?;

    let out = helmop(&["propagate", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    let scoped = format!("{}/scoped", f.ns);
    assert_eq!(
        row(&rows(&out), &scoped, "db")["state"],
        "Created",
        "{out:#}"
    );
    assert_eq!(row(&rows(&out), &scoped, "db")["namespace"], own.as_str());
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        BTreeSet::from([place(&own, "Secret", "db"), place(&other, "Secret", "db")])
    );
    // down1 (which sees both copies) does not call the scoped registration's copy Orphaned.
    let status = helmop(&["status", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(
        states_of(&status),
        BTreeSet::from(["Synced".to_string()]),
        "{status:#}"
    );
    assert_eq!(rows(&status).len(), 2, "{status:#}");
    let again = helmop(&["propagate", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(writes(&again), 0, "{again:#}");

    // Only down1's target is left: the scoped copy goes, deleted through down1 (which can read
    // its identity), never through the registration that cannot.
    let only_down1 = format!("- clusterName: down1\n  namespace: {other}\n");
    f.helmop(&helmop_yaml("app", &spec(&only_down1))).await?;
    let pruned = dry_then_real("prune", &f.ns).await?;
    assert_eq!(
        outcome(&pruned),
        BTreeSet::from([(format!("{}/down1", f.ns), own.clone(), "Pruned".to_string())]),
        "{pruned:#}"
    );
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        BTreeSet::from([place(&other, "Secret", "db")])
    );
    Ok(())
}

/// The clone case: a second real cluster restored from an etcd snapshot of down1 answers
/// down1's `kube-system` UID. Before, the two registrations were merged and the clone's copy
/// landed on the original (written through down1's credentials, which sort first).
#[tokio::test]
async fn a_cluster_restored_from_anothers_snapshot_gets_its_own_copies() -> anyhow::Result<()> {
    let f = Fleet::new("id-clone").await?;
    let name = format!("{}-restored", f.ns);
    let clone =
        tokio::task::spawn_blocking(move || control_plane().clone_cluster(DOWNSTREAM_1, &name))
            .await??;
    let restored = clone.client().await;
    let uid = |client: kube::Client| async move {
        let ns = Api::<Namespace>::all(client).get("kube-system").await?;
        anyhow::Ok(ns.metadata.uid)
    };
    assert_eq!(
        uid(f.down1.clone()).await?,
        uid(restored.clone()).await?,
        "a clone shares the identity"
    );
    register_fleet_cluster(&f.upstream, &f.ns, "down1-restored", &[], &clone).await?;
    let (orig, copy) = (f.dest("orig"), f.dest("restored"));
    create_secret(&f.upstream, &f.ns, "orig-db", &[("k", b"o")]).await?;
    create_secret(&f.upstream, &f.ns, "restored-db", &[("k", b"r")]).await?;
    secret_helmops(
        &f,
        &[
            ("orig", "down1", orig.as_str(), "orig-db"),
            ("restored", "down1-restored", copy.as_str(), "restored-db"),
        ],
    )
    .await?;
    let out = dry_then_real("propagate", &f.ns).await?;
    assert_eq!(
        outcome(&out),
        BTreeSet::from([
            (
                format!("{}/down1", f.ns),
                orig.clone(),
                "Created".to_string()
            ),
            (
                format!("{}/down1-restored", f.ns),
                copy.clone(),
                "Created".to_string()
            ),
        ]),
        "{out:#}"
    );
    assert_eq!(
        copies_of(&f.down1, &f.ns).await?,
        BTreeSet::from([place(&orig, "Secret", "orig-db")])
    );
    assert_eq!(
        copies_of(&restored, &f.ns).await?,
        BTreeSet::from([place(&copy, "Secret", "restored-db")])
    );
    let status = helmop(&["status", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(
        states_of(&status),
        BTreeSet::from(["Synced".to_string()]),
        "{status:#}"
    );
    assert_eq!(rows(&status).len(), 2, "{status:#}");
    Ok(())
}
