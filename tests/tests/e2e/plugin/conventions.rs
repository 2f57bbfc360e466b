//! kubectl conventions of the cluster-facing commands: KUBECONFIG merging, `--context`, the
//! context's namespace, `--target-context`, `--upstream-id`, `-o yaml`, exit codes for bad input
//! and an unreachable upstream, `--request-timeout`, colour only on a terminal and never with
//! NO_COLOR, plain progress lines when not on a terminal, and `kubectl helmop` through kubectl.

use std::process::Stdio;
use std::time::{Duration, Instant};

use helmop_tests::*;
use kube::config::Kubeconfig;
use serde_json::Value;

use super::support::*;

/// A Fleet with HelmOp `app` copying Secret `db` into `<ns>-apps` on down1, propagated.
async fn propagated(prefix: &str) -> anyhow::Result<Fleet> {
    let f = Fleet::new(prefix).await?;
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down1\n",
            f.dest("apps")
        ),
    ))
    .await?;
    helmop(&["propagate", "app", "-n", &f.ns]).await?.expect(0);
    Ok(f)
}

fn path_str(p: &std::path::Path) -> String {
    p.display().to_string()
}

#[tokio::test]
async fn kubeconfig_merging_contexts_and_namespaces_work_as_in_kubectl() -> anyhow::Result<()> {
    let f = propagated("pa-kcfg").await?;
    let cp = control_plane();
    let upstream_cfg = cp.upstream().kubeconfig.clone();
    let down1_cfg = cp.cluster(DOWNSTREAM_1).kubeconfig.clone();
    let dir = tempfile::tempdir()?;

    // KUBECONFIG lists two files: the first one's current context (down1) is the default...
    let merged = format!("{}:{}", path_str(&down1_cfg), path_str(&upstream_cfg));
    let args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = ["status", "app", "-n", &f.ns, "-o", "json"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    let wrong = run_raw(&args(&[]), &[("KUBECONFIG", &merged)])
        .await?
        .expect(1);
    assert!(
        wrong
            .stderr
            .contains(&format!("HelmOp {}/app not found", f.ns)),
        "{}",
        wrong.stderr
    );
    // ...and --context picks the upstream context from the second file.
    let right = run_raw(
        &args(&["--context", "upstream"]),
        &[("KUBECONFIG", &merged)],
    )
    .await?
    .expect(0)
    .json();
    assert!(states(&right).values().all(|s| s == "Synced"), "{right:#}");

    // Without -n, the context's namespace is used; the context lives in a third file that only
    // refers to the cluster and user of the upstream kubeconfig (merged by name).
    let kc = Kubeconfig::read_from(&upstream_cfg)?;
    let ctx = kc.contexts.first().and_then(|c| c.context.clone());
    let ctx = some(ctx, "a context in the upstream kubeconfig")?;
    let scoped = dir.path().join("scoped.kubeconfig");
    std::fs::write(
        &scoped,
        format!(
            "apiVersion: v1\nkind: Config\ncontexts:\n- name: scoped\n  context:\n    cluster: {}\n    user: {}\n    namespace: {}\ncurrent-context: scoped\n",
            ctx.cluster,
            ctx.user.unwrap_or_default(),
            f.ns
        ),
    )?;
    let three = format!("{}:{}", path_str(&scoped), path_str(&upstream_cfg));
    let out = run_raw(
        &[
            "status".to_string(),
            "app".to_string(),
            "-o".to_string(),
            "json".to_string(),
        ],
        &[("KUBECONFIG", &three)],
    )
    .await?
    .expect(0)
    .json();
    assert_eq!(states(&out).len(), 1, "{out:#}");

    // -o yaml carries the same document as -o json.
    let yaml = helmop(&["status", "app", "-n", &f.ns, "-o", "yaml"])
        .await?
        .expect(0);
    let from_yaml: Value = serde_saphyr::from_str(&yaml.stdout)?;
    let from_json = helmop(&["status", "app", "-n", &f.ns, "-o", "json"])
        .await?
        .expect(0)
        .json();
    assert_eq!(from_yaml, from_json);
    Ok(())
}

#[tokio::test]
async fn bad_input_exits_1_and_an_unreachable_upstream_exits_3() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let help = run_raw(&["propagate".into(), "--help".into()], &[])
        .await?
        .expect(0);
    assert!(
        help.stdout.contains("Usage: kubectl helmop propagate"),
        "{}",
        help.stdout
    );
    for args in [
        vec!["propagate", "app", "-A"],
        vec!["propagate", "--concurrency", "0"],
        vec!["status", "-o", "xml"],
        vec!["prune", "--cluster-timeout", "soon"],
    ] {
        let out = helmop(&args).await?;
        assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
    }
    let bad_id = helmop(&["status", "-n", "default", "--upstream-id", "Bad_Id"])
        .await?
        .expect(1);
    assert!(
        bad_id.stderr.contains("invalid upstream id"),
        "{}",
        bad_id.stderr
    );
    let missing = run_raw(
        &[
            "status",
            "-n",
            "default",
            "--kubeconfig",
            "/nonexistent/kubeconfig",
        ]
        .map(String::from),
        &[],
    )
    .await?;
    assert_eq!(missing.code, 1, "{}", missing.stderr);

    // Nothing listens: exit 3.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?;
    let port = closed.local_addr()?.port();
    drop(closed);
    let refused = kubeconfig_for(dir.path(), "refused", port)?;
    let out = run_with(&refused, &["status", "-n", "default"], &[])
        .await?
        .expect(3);
    assert!(
        out.stderr.contains("cannot reach the upstream cluster"),
        "{}",
        out.stderr
    );

    // Something listens and never answers: --request-timeout bounds the wait, exit 3.
    let (port, _accepted) = black_hole()?;
    let hanging = kubeconfig_for(dir.path(), "hanging", port)?;
    let started = Instant::now();
    let out = run_with(
        &hanging,
        &["prune", "-n", "default", "--request-timeout", "2s"],
        &[],
    )
    .await?
    .expect(3);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        out.stderr.contains("cannot reach the upstream cluster"),
        "{}",
        out.stderr
    );
    Ok(())
}

fn kubeconfig_for(
    dir: &std::path::Path,
    name: &str,
    port: u16,
) -> anyhow::Result<std::path::PathBuf> {
    let path = dir.join(format!("{name}.kubeconfig"));
    std::fs::write(&path, loopback_kubeconfig(port))?;
    Ok(path)
}

#[tokio::test]
async fn target_contexts_and_a_custom_upstream_id() -> anyhow::Result<()> {
    let f = Fleet::new("pa-ctx").await?;
    let dest = f.dest("ctx");
    create_secret(&f.upstream, &f.ns, "db", &[("k", b"v")]).await?;
    // Fleet targeting would pick nothing (no such cluster name); contexts ignore it and use
    // the root options, except for a target naming the context.
    f.helmop(&helmop_yaml(
        "app",
        &format!(
            "defaultNamespace: {dest}\ndownstreamResources:\n- {{kind: Secret, name: db}}\ntargets:\n- clusterName: down2\n  namespace: {dest}-two\n"
        ),
    ))
    .await?;
    let merged = path_str(&control_plane().merged_kubeconfig());
    let out = run_raw(
        &[
            "propagate",
            "app",
            "-n",
            &f.ns,
            "--context",
            "upstream",
            "--target-context",
            "down1",
            "--target-context",
            "down2",
            "--upstream-id",
            "team-up",
            "-o",
            "json",
        ]
        .map(String::from),
        &[("KUBECONFIG", &merged)],
    )
    .await?
    .expect(0)
    .json();
    assert_eq!(out["upstreamId"], "team-up");
    assert_eq!(
        states(&out),
        [
            (format!("down1 {dest} Secret/db"), "Created".to_string()),
            (format!("down2 {dest}-two Secret/db"), "Created".to_string()),
        ]
        .into()
    );
    let copy = some(get_secret(&f.down1, &dest, "db").await?, "db on down1")?;
    assert_eq!(
        annotation(&copy.metadata, "helmop.dev/owners"),
        Some(format!("team-up/{}/app", f.ns).as_str())
    );
    assert!(
        get_secret(&f.down2, &format!("{dest}-two"), "db")
            .await?
            .is_some()
    );

    // Through real kubectl, with the plugin on PATH.
    let out = through_kubectl(
        &[
            "status",
            "app",
            "-n",
            &f.ns,
            "--context",
            "upstream",
            "--target-context",
            "down1",
            "--upstream-id",
            "team-up",
        ],
        &[("KUBECONFIG", &merged)],
    )
    .await?
    .expect(0);
    assert!(out.stdout.starts_with("HELMOP"), "{}", out.stdout);
    assert!(out.stdout.contains("Synced"), "{}", out.stdout);
    Ok(())
}

#[tokio::test]
async fn colour_and_progress_only_on_a_terminal() -> anyhow::Result<()> {
    let f = propagated("pa-tty").await?;
    let kubeconfig = path_str(&control_plane().upstream().kubeconfig);
    let command = format!(
        "{} status app -n {} --kubeconfig {kubeconfig}",
        plugin_bin().display(),
        f.ns
    );
    // `script` runs the command on a pseudo-terminal.
    let on_tty = |no_color: Option<&str>| {
        let mut cmd = tokio::process::Command::new("script");
        cmd.args(["-qec", &command, "/dev/null"])
            .env_remove("KUBECONFIG")
            .env_remove("NO_COLOR")
            .stdin(Stdio::null());
        if let Some(v) = no_color {
            cmd.env("NO_COLOR", v);
        }
        cmd.output()
    };
    let coloured = on_tty(None).await?;
    let text = String::from_utf8_lossy(&coloured.stdout);
    assert!(text.contains("\x1b[32mSynced\x1b[0m"), "{text:?}");
    let plain = on_tty(Some("1")).await?;
    let text = String::from_utf8_lossy(&plain.stdout);
    assert!(
        text.contains("Synced") && !text.contains("\x1b[32m"),
        "{text:?}"
    );

    // Not a terminal: no colour, and progress as plain lines on stderr.
    let piped = helmop(&["status", "app", "-n", &f.ns]).await?.expect(0);
    assert!(!piped.stdout.contains('\x1b'), "{:?}", piped.stdout);
    assert!(
        piped
            .stderr
            .contains(&format!("status {}/down1: done", f.ns)),
        "{}",
        piped.stderr
    );
    Ok(())
}

/// kubectl users type connection flags before the subcommand (`kubectl helmop --context prod
/// status`), as cobra-based plugins accept them; kubectl passes them on as typed.
#[tokio::test]
async fn connection_flags_work_before_and_after_the_subcommand_through_kubectl()
-> anyhow::Result<()> {
    let f = propagated("pa-flagpos").await?;
    let cp = control_plane();
    let upstream_cfg = path_str(&cp.upstream().kubeconfig);
    let down1_cfg = path_str(&cp.cluster(DOWNSTREAM_1).kubeconfig);
    // down1's context is the default, so only a --context that is honoured reaches the HelmOp.
    let merged = format!("{down1_cfg}:{upstream_cfg}");
    let env = [("KUBECONFIG", merged.as_str())];
    let ns = f.ns.as_str();

    let after = through_kubectl(
        &[
            "status",
            "app",
            "-o",
            "json",
            "--context",
            "upstream",
            "-n",
            ns,
            "--request-timeout",
            "20s",
        ],
        &env,
    )
    .await?
    .expect(0)
    .json();
    assert!(states(&after).values().all(|s| s == "Synced"), "{after:#}");
    assert!(!states(&after).is_empty(), "{after:#}");
    for before in [
        &[
            "--context",
            "upstream",
            "-n",
            ns,
            "--request-timeout",
            "20s",
            "status",
            "app",
            "-o",
            "json",
        ][..],
        &[
            "--context=upstream",
            &format!("--namespace={ns}"),
            "status",
            "app",
            "-o",
            "json",
        ],
        &[
            "--context",
            "upstream",
            "status",
            "app",
            "-n",
            ns,
            "-o",
            "json",
        ],
    ] {
        let out = through_kubectl(before, &env).await?.expect(0).json();
        assert_eq!(states(&out), states(&after), "{before:?}");
    }

    // --kubeconfig and -A before the subcommand, without KUBECONFIG. Other tests' HelmOps share
    // the upstream (some invalid on purpose), so only this one's rows are judged, not the exit code.
    let all = through_kubectl(
        &["--kubeconfig", &upstream_cfg, "-A", "status", "-o", "json"],
        &[],
    )
    .await?
    .json();
    let ours: Vec<Value> = rows(&all)
        .into_iter()
        .filter(|r| r["helmops"][0] == format!("{ns}/app").as_str())
        .collect();
    assert!(!ours.is_empty(), "{all:#}");
    assert!(ours.iter().all(|r| r["state"] == "Synced"), "{ours:#?}");

    // A flag the subcommand does not take is still refused by that subcommand, wherever typed.
    let refused = through_kubectl(&["-A", "validate", "-"], &env)
        .await?
        .expect(1);
    assert!(refused.stderr.contains("'-A'"), "{}", refused.stderr);
    Ok(())
}
