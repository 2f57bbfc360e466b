//! `kubectl helmop rollout KIND/NAME` against the upstream cluster with the real admission webhook
//! (in-process, registered for the test's namespace), and shell completion through real `kubectl`
//! (>= 1.26 runs `kubectl_complete-helmop`).

use std::process::Output;
use std::time::Duration;

use anyhow::Context;
use helmop_tests::*;
use helmop_webhook::state::Config;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const CONFIG_HASH: &str = "helmop.dev/config-hash";
const RESTAMP: &str = "helmop.dev/restamp";
const RUN: Duration = Duration::from_secs(60);

/// The webhook serving on loopback, stopped when dropped.
struct Webhook(LocalWebhook);

impl Webhook {
    async fn start(client: Client) -> anyhow::Result<Webhook> {
        Ok(Webhook(
            LocalWebhook::start(client, Config::default()).await?,
        ))
    }

    /// The workload endpoint for `namespace` only; returns the configuration's name.
    async fn register_workloads(&self, client: &Client, namespace: &str) -> anyhow::Result<String> {
        let name = format!("{namespace}-rollout");
        WebhookRegistration::new(
            WebhookKind::Mutating,
            &name,
            &format!("{}/mutate/workloads", self.0.url),
            &self.0.ca_pem,
        )
        .rule(WebhookRule::new(
            &["CREATE", "UPDATE"],
            "apps",
            "v1",
            &["deployments", "statefulsets", "daemonsets", "replicasets"],
        ))
        .only_namespace(namespace)
        .register(client)
        .await?;
        Ok(name)
    }
}

fn deployment(name: &str, labels: Value) -> anyhow::Result<Deployment> {
    let mut d = json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{
                    "name": "app",
                    "image": "registry.example.com/app:1.0",
                    "envFrom": [{"configMapRef": {"name": "settings"}}],
                }]},
            },
        },
    });
    if labels.as_object().is_some_and(|l| !l.is_empty()) {
        d["metadata"]["labels"] = labels;
    }
    Ok(serde_json::from_value(d)?)
}

fn stamp(d: &Deployment) -> Option<String> {
    template_annotation(d, CONFIG_HASH)
}

fn restamp_annotation(d: &Deployment) -> Option<String> {
    d.metadata.annotations.as_ref()?.get(RESTAMP).cloned()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn json_of(out: &Output) -> anyhow::Result<Value> {
    serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "stdout is not JSON:\n{}\nstderr:\n{}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

async fn rollout(kubeconfig: &str, ns: &str, args: &[&str]) -> anyhow::Result<Output> {
    let mut all = vec!["rollout", "--kubeconfig", kubeconfig, "-n", ns];
    all.extend_from_slice(args);
    run_plugin(&all, &[], RUN).await
}

async fn replica_sets(client: &Client, ns: &str, app: &str) -> anyhow::Result<usize> {
    let list = Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?;
    Ok(list.items.len())
}

#[tokio::test]
async fn rollout_reports_whether_the_stamp_changed() -> anyhow::Result<()> {
    let up = control_plane().upstream();
    let client = up.client().await;
    let kubeconfig = up.kubeconfig.display().to_string();
    ensure_hash_key(&client).await?;
    let ns = fresh_namespace_with_labels(
        &client,
        "rollout",
        &[("helmop.dev/rollout-on-change", "enabled")],
    )
    .await?;
    let webhook = Webhook::start(client.clone()).await?;
    let registration = webhook.register_workloads(&client, &ns).await?;

    create_config_map(&client, &ns, "settings", &[("mode", "a")]).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let created = deployments
        .create(&PostParams::default(), &deployment("web", json!({}))?)
        .await?;
    let first = stamp(&created).context("the webhook stamps the Deployment at creation")?;
    wait_until("the first ReplicaSet", DEFAULT_TIMEOUT, || async {
        Ok(replica_sets(&client, &ns, "web").await? == 1)
    })
    .await?;

    // Nothing the pods read changed: restamped, but the stamp (and so the pods) stay.
    let out = rollout(&kubeconfig, &ns, &["deployment/web", "-o", "json"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json_of(&out)?;
    assert_eq!(r["workload"], "deployment/web");
    assert_eq!(r["stampChanged"], false, "{r}");
    assert_eq!(r["previousStamp"], first.as_str());
    assert_eq!(r["stamp"], first.as_str());
    assert_eq!(r["optedIn"], true);
    let written = r["restamp"].as_str().context("restamp")?.to_owned();
    let stored = deployments.get("web").await?;
    assert_eq!(
        restamp_annotation(&stored).as_deref(),
        Some(written.as_str())
    );
    assert_eq!(stamp(&stored).as_deref(), Some(first.as_str()));

    // The table output says so in words.
    let out = rollout(&kubeconfig, &ns, &["deploy/web"]).await?;
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stdout).contains("stamp unchanged"),
        "{}",
        text(&out.stdout)
    );

    // The ConfigMap changes: a dry run shows the new stamp and stores nothing ...
    Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"mode": "b"}})),
        )
        .await?;
    let before_dry = deployments.get("web").await?;
    let out = rollout(&kubeconfig, &ns, &["deploy/web", "--dry-run", "-o", "json"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let dry = json_of(&out)?;
    assert_eq!(dry["stampChanged"], true, "{dry}");
    assert_eq!(dry["dryRun"], true);
    let after_dry = deployments.get("web").await?;
    // (The resourceVersion moves with status updates of the deployment controller.)
    assert_eq!(
        after_dry.metadata.generation, before_dry.metadata.generation,
        "a dry run stores nothing"
    );
    assert_eq!(
        restamp_annotation(&after_dry),
        restamp_annotation(&before_dry)
    );
    assert_eq!(stamp(&after_dry).as_deref(), Some(first.as_str()));

    // ... and the real one rolls the Deployment: new stamp, new ReplicaSet.
    let out = rollout(&kubeconfig, &ns, &["deployment.apps/web", "-o", "json"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json_of(&out)?;
    assert_eq!(r["stampChanged"], true, "{r}");
    let second = r["stamp"].as_str().context("stamp")?.to_owned();
    assert_ne!(second, first);
    assert_eq!(
        dry["stamp"],
        second.as_str(),
        "the dry run predicted the stamp"
    );
    assert_eq!(
        stamp(&deployments.get("web").await?).as_deref(),
        Some(second.as_str())
    );
    wait_until(
        "a new ReplicaSet for the new stamp",
        DEFAULT_TIMEOUT,
        || async { Ok(replica_sets(&client, &ns, "web").await? == 2) },
    )
    .await?;

    // A workload that opted out is restamped but not stamped, and the report says why.
    deployments
        .create(
            &PostParams::default(),
            &deployment("manual", json!({"helmop.dev/rollout-on-change": "false"}))?,
        )
        .await?;
    let out = rollout(&kubeconfig, &ns, &["deployment/manual", "-o", "json"]).await?;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let r = json_of(&out)?;
    assert_eq!(r["optedIn"], false);
    assert_eq!(r["stamp"], Value::Null);
    assert!(
        r["message"]
            .as_str()
            .is_some_and(|m| m.starts_with("not opted in")),
        "{r}"
    );

    // Errors and their exit codes.
    let out = rollout(&kubeconfig, &ns, &["deployment/nope"]).await?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("not found"),
        "{}",
        text(&out.stderr)
    );
    let out = rollout(&kubeconfig, &ns, &["pod/web"]).await?;
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("unknown workload kind"),
        "{}",
        text(&out.stderr)
    );
    let dir = tempfile::tempdir()?;
    let dead = dir.path().join("dead.kubeconfig");
    std::fs::write(
        &dead,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n\
contexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n\
users:\n- name: u\n  user:\n    token: x\n",
    )?;
    let out = rollout(&dead.display().to_string(), &ns, &["deployment/web"]).await?;
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));

    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    drop(webhook);
    Ok(())
}

/// `kubectl __complete helmop WORDS...` with the workspace binaries first on PATH: what a shell's
/// kubectl completion asks for on `kubectl helmop WORDS<TAB>`. Returns the candidates (without
/// descriptions) and the directive line.
async fn kubectl_complete(
    words: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<(Vec<String>, String)> {
    let bin_dir = plugin_binary()?
        .parent()
        .context("binary directory")?
        .to_path_buf();
    // kubectl_complete-helmop must be there too: it is what kubectl looks for.
    workspace_binary("kubectl_complete-helmop")?;
    let path = std::env::join_paths(std::iter::once(bin_dir).chain(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    )))?;
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.arg("__complete")
        .arg("helmop")
        .args(words)
        .env("PATH", path)
        .envs(env.iter().copied())
        .kill_on_drop(true);
    let out = tokio::time::timeout(RUN, cmd.output()).await??;
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let mut lines: Vec<String> = stdout.lines().map(str::to_owned).collect();
    let directive = lines.pop().unwrap_or_default();
    let values = lines
        .iter()
        .map(|l| l.split('\t').next().unwrap_or_default().to_owned())
        .collect();
    Ok((values, directive))
}

#[tokio::test]
async fn kubectl_completes_the_plugin_through_kubectl_complete_helmop() -> anyhow::Result<()> {
    let cp = control_plane();
    let up = cp.upstream();
    let client = up.client().await;
    let kubeconfig = up.kubeconfig.display().to_string();
    let ns = fresh_namespace(&client, "complete").await?;
    apply_helmop(
        &client,
        &ns,
        r#"{"metadata": {"name": "payments"}, "spec": {"helm": {"chart": "oci://registry.example.com/payments", "version": "1.0.0"}}}"#,
    )
    .await?;
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &deployment("web", json!({}))?)
        .await?;

    let (subcommands, directive) = kubectl_complete(&[""], &[]).await?;
    for sub in [
        "validate",
        "propagate",
        "status",
        "prune",
        "rollout",
        "completion",
    ] {
        assert!(
            subcommands.iter().any(|s| s == sub),
            "{sub} missing: {subcommands:?}"
        );
    }
    assert_eq!(directive, ":4", "no file names after `kubectl helmop`");

    let (flags, _) = kubectl_complete(&["propagate", "--wat"], &[]).await?;
    assert_eq!(flags, ["--watch"]);

    // HelmOp names come from the cluster and namespace named on the line.
    let (helmops, _) =
        kubectl_complete(&["status", "--kubeconfig", &kubeconfig, "-n", &ns, ""], &[]).await?;
    assert_eq!(helmops, ["payments"]);
    // The same with the connection flags typed before the subcommand.
    let (helmops, _) =
        kubectl_complete(&["--kubeconfig", &kubeconfig, "-n", &ns, "status", ""], &[]).await?;
    assert_eq!(helmops, ["payments"]);

    // Workloads: the kind first (no space after it), then the names of that kind.
    let (kinds, directive) = kubectl_complete(&["rollout", "-n", &ns, ""], &[]).await?;
    assert!(kinds.iter().any(|k| k == "deployment/"), "{kinds:?}");
    assert_eq!(
        directive, ":6",
        "no space and no file names after `deployment/`"
    );
    let (names, _) = kubectl_complete(
        &[
            "rollout",
            "--kubeconfig",
            &kubeconfig,
            "-n",
            &ns,
            "deploy/w",
        ],
        &[],
    )
    .await?;
    assert_eq!(names, ["deploy/web"]);

    // Contexts come from KUBECONFIG (the merged file of the control plane).
    let merged = cp.merged_kubeconfig().display().to_string();
    let (contexts, _) =
        kubectl_complete(&["status", "--context", ""], &[("KUBECONFIG", &merged)]).await?;
    for c in [UPSTREAM, DOWNSTREAM_1, DOWNSTREAM_2] {
        assert!(contexts.iter().any(|x| x == c), "{c} missing: {contexts:?}");
    }
    Ok(())
}

#[tokio::test]
async fn completion_scripts_are_valid_shell() -> anyhow::Result<()> {
    let out = run_plugin(&["completion", "bash"], &[], RUN).await?;
    assert_eq!(out.status.code(), Some(0));
    let dir = tempfile::tempdir()?;
    let script = dir.path().join("kubectl-helmop.bash");
    std::fs::write(&script, &out.stdout)?;
    // Sourcing it in a real bash registers the completion function for kubectl-helmop.
    let check = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "source {} && complete -p kubectl-helmop",
            script.display()
        ))
        .output()?;
    assert!(check.status.success(), "{}", text(&check.stderr));
    assert!(
        text(&check.stdout).contains("kubectl-helmop"),
        "{}",
        text(&check.stdout)
    );
    let out = run_plugin(&["completion", "powershell"], &[], RUN).await?;
    assert_eq!(
        out.status.code(),
        Some(1),
        "unsupported shells are invalid input"
    );
    Ok(())
}
