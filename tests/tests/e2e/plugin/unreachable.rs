//! A cluster that hangs, has no credentials or whose API server stops costs only its own rows; the rest
//! converges.

use std::time::{Duration, Instant};

use helmop_tests::*;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::DeleteParams;
use serde_json::json;

use super::support::*;

#[tokio::test]
async fn a_hanging_or_credential_less_cluster_costs_only_its_own_rows() -> anyhow::Result<()> {
    let f = Fleet::new("pa-hang").await?;
    // An API server that accepts connections and never answers.
    let (port, _accepted) = black_hole()?;
    let hanging = loopback_kubeconfig(port);
    create_secret(
        &f.upstream,
        &f.ns,
        "hang-kubeconfig",
        &[("value", hanging.as_bytes())],
    )
    .await?;
    create_fleet_object(
        &f.upstream,
        &f.ns,
        &cluster_resource(),
        json!({"metadata": {"name": "hang", "labels": {"env": "prod"}}, "spec": {"kubeConfigSecret": "hang-kubeconfig"}}),
    )
    .await?;
    create_fleet_object(
        &f.upstream,
        &f.ns,
        &cluster_resource(),
        json!({"metadata": {"name": "nocreds", "labels": {"env": "prod"}}, "spec": {"kubeConfigSecret": "does-not-exist"}}),
    )
    .await?;
    let dest = f.dest("apps");
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!("defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterSelector: {{matchLabels: {{env: prod}}}}\n"),
    ))
    .await?;

    let started = Instant::now();
    let out = helmop(&[
        "propagate",
        "app",
        "-n",
        &f.ns,
        "--cluster-timeout",
        "3s",
        "-o",
        "json",
    ])
    .await?
    .expect(2)
    .json();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "took {took:?}");
    let r = rows(&out);
    for reachable in ["down1", "down2"] {
        assert_eq!(
            row(&r, &format!("{}/{reachable}", f.ns), "db")["state"],
            "Created",
            "{out:#}"
        );
    }
    let hang = row(&r, &format!("{}/hang", f.ns), "db");
    assert_eq!(hang["state"], "Unreachable");
    assert_eq!(hang["reason"], "no answer within --cluster-timeout 3s");
    let nocreds = row(&r, &format!("{}/nocreds", f.ns), "db");
    assert_eq!(nocreds["state"], "Unreachable");
    assert!(
        nocreds["reason"]
            .as_str()
            .unwrap_or_default()
            .contains(&format!(
                "kubeconfig Secret {}/does-not-exist not found",
                f.ns
            )),
        "{nocreds}"
    );
    assert_eq!(out["summary"]["unreachableClusters"], 2);
    assert!(get_secret(&f.down1, &dest, "db").await?.is_some());
    assert!(get_secret(&f.down2, &dest, "db").await?.is_some());

    let status = helmop(&[
        "status",
        "app",
        "-n",
        &f.ns,
        "--cluster-timeout",
        "3s",
        "-o",
        "json",
    ])
    .await?
    .expect(2)
    .json();
    let st = states(&status);
    assert_eq!(
        st.get(&format!("{}/down1 {dest} Secret/db", f.ns))
            .map(String::as_str),
        Some("Synced")
    );
    assert_eq!(
        st.get(&format!("{}/hang {dest} Secret/db", f.ns))
            .map(String::as_str),
        Some("Unreachable")
    );
    Ok(())
}

#[tokio::test]
async fn a_stopped_api_server_is_unreachable_and_the_rest_converges() -> anyhow::Result<()> {
    // Stopping an API server needs a control plane of our own.
    let cp = ControlPlane::start(&["pa-up", "pa-d1", "pa-d2"])?;
    let upstream = cp.cluster("pa-up").client().await;
    let ns = fresh_namespace(&upstream, "pa-stop").await?;
    for name in ["pa-d1", "pa-d2"] {
        register_fleet_cluster(&upstream, &ns, name, &[("env", "prod")], cp.cluster(name)).await?;
    }
    create_secret(&upstream, &ns, "db", &[("k", b"v")]).await?;
    apply_helmop(
        &upstream,
        &ns,
        &helmop_yaml(
            "app",
            "defaultNamespace: apps\ndownstreamResources:\n- {kind: Secret, name: db}\ntargets:\n- clusterSelector: {matchLabels: {env: prod}}\n",
        ),
    )
    .await?;
    let kubeconfig = cp.cluster("pa-up").kubeconfig.clone();
    let (d1, d2) = (format!("{ns}/pa-d1"), format!("{ns}/pa-d2"));

    // A fresh upstream has no hash key yet: a dry run does not create it, the first real run does.
    let dry = run_with(
        &kubeconfig,
        &["propagate", "-A", "--dry-run", "-o", "json"],
        &[],
    )
    .await?
    .expect(0)
    .json();
    assert_eq!(dry["hashKey"], "ephemeral");
    let keys: Api<Secret> = Api::namespaced(upstream.clone(), "helmop-system");
    assert!(keys.get_opt("helmop-hash-key").await?.is_none());

    // Mid-run: with one cluster at a time, a hung cluster sorted first holds the run while
    // pa-d2's API server is stopped; pa-d2 was reachable when the run started.
    let (port, accepted) = black_hole()?;
    create_secret(
        &upstream,
        &ns,
        "a-hang-kubeconfig",
        &[("value", loopback_kubeconfig(port).as_bytes())],
    )
    .await?;
    create_fleet_object(
        &upstream,
        &ns,
        &cluster_resource(),
        json!({"metadata": {"name": "a-hang", "labels": {"env": "prod"}}, "spec": {"kubeConfigSecret": "a-hang-kubeconfig"}}),
    )
    .await?;
    let run = spawn_with(
        &kubeconfig,
        &[
            "propagate",
            "-A",
            "-o",
            "json",
            "--concurrency",
            "1",
            "--cluster-timeout",
            "15s",
        ],
    )?;
    tokio::task::spawn_blocking(move || accepted.recv_timeout(Duration::from_secs(60))).await??;
    cp.stop_cluster("pa-d2")?;
    let out = finish(run).await?.expect(2).json();
    assert_eq!(
        row(&rows(&out), &format!("{ns}/a-hang"), "db")["state"],
        "Unreachable"
    );
    fleet_api(&upstream, &ns, &cluster_resource())
        .delete("a-hang", &DeleteParams::default())
        .await?;
    let r = rows(&out);
    assert_eq!(row(&r, &d1, "db")["state"], "Created", "{out:#}");
    assert_eq!(row(&r, &d2, "db")["state"], "Unreachable", "{out:#}");
    assert_eq!(out["summary"]["unreachableClusters"], 2);
    assert_eq!(out["hashKey"], "created");
    let key = some(keys.get_opt("helmop-hash-key").await?, "the hash key")?;
    assert_eq!(key.data.unwrap_or_default()["key"].0.len(), 32);
    let down1 = cp.cluster("pa-d1").client().await;
    assert!(get_secret(&down1, "apps", "db").await?.is_some());
    let status = run_with(&kubeconfig, &["status", "-A", "-o", "json"], &[])
        .await?
        .expect(2)
        .json();
    assert_eq!(row(&rows(&status), &d2, "db")["state"], "Unreachable");

    cp.start_cluster("pa-d2")?;
    let out = run_with(&kubeconfig, &["propagate", "-A", "-o", "json"], &[])
        .await?
        .expect(0)
        .json();
    let r = rows(&out);
    assert_eq!(row(&r, &d1, "db")["state"], "Unchanged", "{out:#}");
    assert_eq!(row(&r, &d2, "db")["state"], "Created", "{out:#}");
    let status = run_with(&kubeconfig, &["status", "-A", "-o", "json"], &[])
        .await?
        .expect(0)
        .json();
    assert!(
        states(&status).values().all(|s| s == "Synced"),
        "{status:#}"
    );
    Ok(())
}

/// Whatever answers at a Cluster's URL writes the reasons of its rows: terminal escapes in them
/// reach neither the table nor the JSON report raw, and a body kube's client cannot parse (it
/// logs those whole, Secret data included) never reaches the log, at any level.
#[tokio::test]
async fn text_from_a_cluster_endpoint_is_printable_and_bodies_never_reach_the_log()
-> anyhow::Result<()> {
    let f = Fleet::new("pa-text").await?;
    let hostile = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
        "reason": "Forbidden",
        "message": "no \u{1b}[2J\u{1b}]0;pwned\u{7}entry\u{202e}",
    });
    let loud = fake_api_server(403, hostile.to_string()).await?;
    let leaky = fake_api_server(
        200,
        r#"{"kind":"Namespace","metadata":{"uid":7},"data":"SECRET-DATA-4711"}"#.to_string(),
    )
    .await?;
    for (name, port) in [("loud", loud), ("leaky", leaky)] {
        let secret = format!("{name}-kubeconfig");
        create_secret(
            &f.upstream,
            &f.ns,
            &secret,
            &[("value", loopback_kubeconfig(port).as_bytes())],
        )
        .await?;
        create_fleet_object(
            &f.upstream,
            &f.ns,
            &cluster_resource(),
            json!({"metadata": {"name": name, "labels": {"env": "noisy"}}, "spec": {"kubeConfigSecret": secret}}),
        )
        .await?;
    }
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterSelector: {{matchLabels: {{env: noisy}}}}\n",
            f.dest("apps")
        ),
    ))
    .await?;
    let kubeconfig = control_plane().upstream().kubeconfig.clone();
    for (args, env) in [
        (vec!["propagate", "app", "-n", &f.ns, "-o", "json"], vec![]),
        (vec!["propagate", "app", "-n", &f.ns], vec![]),
        (
            vec!["status", "app", "-n", &f.ns, "-o", "json"],
            vec![("HELMOP_LOG", "debug")],
        ),
    ] {
        let out = run_with(&kubeconfig, &args, &env).await?.expect(2);
        for (stream, text) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
            assert!(
                !text
                    .chars()
                    .any(|c| c == '\u{1b}' || c == '\u{7}' || c == '\u{202e}'),
                "{args:?}: a control character on {stream}: {text:?}"
            );
            assert!(
                !text.contains("SECRET-DATA-4711"),
                "{args:?}: a response body on {stream}: {text}"
            );
        }
        assert!(
            out.stdout.contains("\\u{1b}[2J"),
            "{args:?}: the reason is kept, escaped: {}",
            out.stdout
        );
    }
    Ok(())
}
