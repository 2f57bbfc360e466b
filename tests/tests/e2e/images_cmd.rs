//! `kubectl helmop images [--watch]` end to end: a real registry (docker-registry + skopeo), the
//! webhook in-process with the real resolver (see `images.rs`), real `kubectl apply`, and the real
//! `target/debug/kubectl-helmop`. After a push the command reports Outdated; `rollout` (or `--watch`)
//! re-pins; a burst of pushes under `--watch` rolls the Deployment once; pull secrets of the pod and its
//! ServiceAccount are used; a stopped registry makes rows Unresolvable (exit 2).

use std::process::Output;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use base64::Engine;
use helmop_tests::registry::{OciImage, TestRegistry};
use helmop_tests::*;
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::{Value, json};

use crate::images::{Webhook, deployment, image_of, kubectl_apply, replica_sets_settled, stored};

/// Quiet period `--watch` waits for in these tests: longer than the gap between two back-to-back
/// pushes (well under a second each on loopback), so the three pushes of a burst fold into one roll.
const DEBOUNCE: &str = "4s";

struct Setup {
    kubeconfig: String,
    registries: tempfile::NamedTempFile,
}

impl Setup {
    fn new(registry: &TestRegistry) -> anyhow::Result<Setup> {
        let registries = tempfile::NamedTempFile::new()?;
        std::fs::write(
            registries.path(),
            json!({"insecure": [registry.host()]}).to_string(),
        )?;
        Ok(Setup {
            kubeconfig: control_plane().upstream().kubeconfig.display().to_string(),
            registries,
        })
    }

    fn args<'a>(&'a self, ns: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
        let mut all = vec![
            "images",
            "--kubeconfig",
            &self.kubeconfig,
            "-n",
            ns,
            "--registry-config",
            self.registries.path().to_str().unwrap_or_default(),
        ];
        all.extend(extra);
        all
    }

    /// `rollout -n NS --watch --images` polling every second with this registry configuration,
    /// JSON events; `extra` adds flags.
    fn rollout_watch(&self, ns: &str, extra: &[&str]) -> anyhow::Result<PluginProcess> {
        let registries = self.registries.path().to_str().unwrap_or_default();
        let mut args = vec![
            "rollout",
            "--watch",
            "--images",
            "--image-interval",
            "1s",
            "--registry-config",
            registries,
            "--kubeconfig",
            &self.kubeconfig,
            "-n",
            ns,
            "-o",
            "json",
        ];
        args.extend_from_slice(extra);
        PluginProcess::spawn(&args, &[])
    }

    async fn images(&self, ns: &str, extra: &[&str]) -> anyhow::Result<Output> {
        run_plugin(&self.args(ns, extra), &[], Duration::from_secs(60)).await
    }

    /// `images -o json`: its exit code and rows.
    async fn rows(&self, ns: &str) -> anyhow::Result<(i32, Vec<Value>)> {
        let out = self.images(ns, &["-o", "json"]).await?;
        let doc: Value = serde_json::from_slice(&out.stdout).with_context(|| {
            format!(
                "images -o json printed no JSON: {}",
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
        let rows = doc["rows"].as_array().cloned().unwrap_or_default();
        Ok((out.status.code().unwrap_or(-1), rows))
    }
}

fn row<'a>(rows: &'a [Value], workload: &str) -> anyhow::Result<&'a Value> {
    rows.iter()
        .find(|r| r["workload"] == workload)
        .with_context(|| format!("no row for {workload} in {rows:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_reports_outdated_and_watch_rolls_once_per_burst() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "img-cmd").await?;
    let registry = TestRegistry::start().await?;
    let webhook =
        Webhook::start(client.clone(), &[registry.host()], Duration::from_secs(2)).await?;
    let registration = webhook.register(&client, &ns).await?;
    let setup = Setup::new(&registry)?;
    let latest = format!("{}:latest", registry.repository("demo/app"));

    let v1 = OciImage::single("cmd-v1")?;
    registry.push(&v1, "demo/app", "latest").await?;
    kubectl_apply(&deployment(&ns, "app", &latest, json!({}), json!({}))).await?;
    assert_eq!(
        image_of(&stored(&client, &ns, "app").await?),
        format!("{latest}@{}", v1.digest)
    );
    assert_eq!(replica_sets_settled(&client, &ns, "app").await?, 1);

    let (code, rows) = setup.rows(&ns).await?;
    assert_eq!(code, 0, "{rows:?}");
    let r = row(&rows, "deployment/app")?;
    assert_eq!(
        (&r["container"], &r["state"], &r["pinned"], &r["current"]),
        (
            &json!("app"),
            &json!("Current"),
            &json!(v1.digest),
            &json!(v1.digest)
        )
    );

    // A push under the same tag: Outdated, in JSON and in the table; still exit 0 (a state).
    let v2 = OciImage::single("cmd-v2")?;
    registry.push(&v2, "demo/app", "latest").await?;
    let (code, rows) = setup.rows(&ns).await?;
    assert_eq!(code, 0);
    let r = row(&rows, "deployment/app")?;
    assert_eq!(
        (&r["state"], &r["pinned"], &r["current"]),
        (&json!("Outdated"), &json!(v1.digest), &json!(v2.digest))
    );
    let table = setup.images(&ns, &[]).await?;
    let text = String::from_utf8_lossy(&table.stdout);
    let short = |d: &str| d[..19].to_owned();
    assert!(
        text.lines()
            .next()
            .is_some_and(|h| h.starts_with("NAMESPACE") && h.contains("STATUS")),
        "{text}"
    );
    assert!(
        text.contains("deployment/app")
            && text.contains(&short(&v1.digest))
            && text.contains(&short(&v2.digest))
            && text.contains("Outdated"),
        "{text}"
    );

    // `rollout` restamps; the webhook re-pins to v2 and the Deployment rolls.
    let out = run_plugin(
        &[
            "rollout",
            "--kubeconfig",
            &setup.kubeconfig,
            "-n",
            &ns,
            "deployment/app",
        ],
        &[],
        Duration::from_secs(60),
    )
    .await?;
    ensure!(
        out.status.success(),
        "rollout: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        image_of(&stored(&client, &ns, "app").await?),
        format!("{latest}@{}", v2.digest)
    );
    assert_eq!(replica_sets_settled(&client, &ns, "app").await?, 2);
    assert_eq!(
        row(&setup.rows(&ns).await?.1, "deployment/app")?["state"],
        "Current"
    );

    // --watch: a burst of three pushes rolls the Deployment once, to the last one.
    let mut watch = PluginProcess::spawn(
        &setup.args(
            &ns,
            &[
                "--watch",
                "--interval",
                "1s",
                "--debounce",
                DEBOUNCE,
                "-o",
                "json",
            ],
        ),
        &[],
    )?;
    watch
        .wait_event(
            "a first poll finding the Deployment current",
            DEFAULT_TIMEOUT,
            0,
            |e| e["event"] == "poll" && e["summary"]["Current"] == 1,
        )
        .await?;
    let burst: Vec<OciImage> = (3..=5)
        .map(|i| OciImage::single(&format!("cmd-v{i}")))
        .collect::<anyhow::Result<_>>()?;
    let started = Instant::now();
    let mut gaps = Vec::new();
    for image in &burst {
        let t = Instant::now();
        registry.push(image, "demo/app", "latest").await?;
        gaps.push(t.elapsed());
    }
    let last = &burst[2].digest;
    let restamped = watch
        .wait_event("the watcher to restamp", DEFAULT_TIMEOUT, 0, |e| {
            e["event"] == "restamped"
        })
        .await?;
    assert_eq!(restamped["workload"], "deployment/app", "{restamped}");
    // The pushes took {gaps:?}; the restamp waited for the last one to be stable.
    assert!(
        started.elapsed() >= Duration::from_secs(4),
        "restamped before the quiet period: pushes took {gaps:?}"
    );
    let polls_then = watch.events_named("poll").len();
    // Three more polls after it finds the Deployment current again: nothing else happens.
    let current_at = watch
        .wait_event(
            "a poll finding the Deployment current again",
            DEFAULT_TIMEOUT,
            0,
            |e| {
                e["event"] == "poll"
                    && e["summary"]["Current"] == 1
                    && e["rows"][0]["pinned"] == json!(last)
            },
        )
        .await?;
    let seen = watch
        .events()
        .iter()
        .position(|e| *e == current_at)
        .unwrap_or(0);
    watch
        .wait_event("three more polls", DEFAULT_TIMEOUT, seen, |e| {
            e["event"] == "poll" && e["poll"].as_u64() >= current_at["poll"].as_u64().map(|p| p + 3)
        })
        .await?;
    assert!(watch.events_named("poll").len() > polls_then);
    assert_eq!(
        watch.events_named("restamped").len(),
        1,
        "one roll for the burst (pushes took {gaps:?}): {}",
        watch.context()
    );
    assert!(
        watch.events_named("not-repinned").is_empty(),
        "{}",
        watch.context()
    );
    assert_eq!(
        image_of(&stored(&client, &ns, "app").await?),
        format!("{latest}@{last}")
    );
    assert_eq!(
        replica_sets_settled(&client, &ns, "app").await?,
        3,
        "exactly one new ReplicaSet"
    );
    let (code, rows) = setup.rows(&ns).await?;
    assert_eq!(
        (code, &row(&rows, "deployment/app")?["state"]),
        (0, &json!("Current"))
    );

    watch.signal(libc::SIGTERM)?;
    let status = watch.wait_exit(Duration::from_secs(20)).await?;
    assert_eq!(status.code(), Some(0), "{}", watch.context());
    assert_eq!(watch.events_named("stopped").len(), 1);

    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_uses_pull_secrets_and_reports_unresolvable() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "img-cmd-auth").await?;
    let mut registry = TestRegistry::start_with_basic_auth("ci", "s3cret-pw").await?;
    let webhook =
        Webhook::start(client.clone(), &[registry.host()], Duration::from_secs(2)).await?;
    let registration = webhook.register(&client, &ns).await?;
    let setup = Setup::new(&registry)?;
    let latest = format!("{}:latest", registry.repository("demo/multi"));
    let multi = OciImage::multi_arch("cmd-m1")?;
    registry.push(&multi, "demo/multi", "latest").await?;

    let auth = base64::engine::general_purpose::STANDARD.encode("ci:s3cret-pw");
    let config = json!({"auths": {registry.host(): {"auth": auth}}}).to_string();
    kubectl_apply(&json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "pull", "namespace": ns},
        "data": {".dockerconfigjson": base64::engine::general_purpose::STANDARD.encode(config)},
    }))
    .await?;
    // One workload names the secret itself, one gets it from its ServiceAccount.
    kubectl_apply(&deployment(
        &ns,
        "own",
        &latest,
        json!({"imagePullSecrets": [{"name": "pull"}]}),
        json!({}),
    ))
    .await?;
    Api::<ServiceAccount>::namespaced(client.clone(), &ns)
        .patch(
            "default",
            &PatchParams::apply("helmop-tests").force(),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
                "metadata": {"name": "default"}, "imagePullSecrets": [{"name": "pull"}]})),
        )
        .await?;
    kubectl_apply(&deployment(
        &ns,
        "via-account",
        &latest,
        json!({}),
        json!({}),
    ))
    .await?;

    let (code, rows) = setup.rows(&ns).await?;
    assert_eq!(code, 0, "{rows:?}");
    for w in ["deployment/own", "deployment/via-account"] {
        let r = row(&rows, w)?;
        // The index digest on both sides, never a platform's.
        assert_eq!(
            (&r["state"], &r["current"]),
            (&json!("Current"), &json!(multi.digest)),
            "{r}"
        );
    }

    // Registry gone: Unresolvable with the reason, exit 2 (partial failure).
    registry.stop().await?;
    let (code, rows) = setup.rows(&ns).await?;
    assert_eq!(code, 2, "{rows:?}");
    let r = row(&rows, "deployment/own")?;
    assert_eq!(r["state"], "Unresolvable");
    let reason = r["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("unreachable"), "{reason}");
    assert!(
        !reason.contains("s3cret") && !reason.contains(&auth),
        "{reason}"
    );

    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

/// `rollout --watch --images`: one process covers both what pods read and the images they run, under
/// one leader election: the leader polls the registry and restamps a moved tag; a standby polls
/// nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_watch_with_images_repins_a_moved_tag_and_a_standby_polls_nothing()
-> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "img-rwatch").await?;
    ensure_hash_key(&client).await?;
    let registry = TestRegistry::start().await?;
    let webhook =
        Webhook::start(client.clone(), &[registry.host()], Duration::from_secs(2)).await?;
    let registration = webhook.register(&client, &ns).await?;
    let setup = Setup::new(&registry)?;
    let latest = format!("{}:latest", registry.repository("demo/app"));
    let v1 = OciImage::single("rwatch-v1")?;
    registry.push(&v1, "demo/app", "latest").await?;
    kubectl_apply(&deployment(&ns, "app", &latest, json!({}), json!({}))).await?;
    assert_eq!(
        image_of(&stored(&client, &ns, "app").await?),
        format!("{latest}@{}", v1.digest)
    );
    let args = ["--lease-namespace", &ns];
    let mut leader = setup.rollout_watch(&ns, &args)?;
    leader
        .wait_event("the first watcher leads", DEFAULT_TIMEOUT, 0, |e| {
            e["event"] == "leader" && e["leading"] == true
        })
        .await?;
    let mut standby = setup.rollout_watch(&ns, &args)?;
    standby
        .wait_event("the second watcher stands by", DEFAULT_TIMEOUT, 0, |e| {
            e["event"] == "leader" && e["leading"] == false
        })
        .await?;
    leader
        .wait_event(
            "a poll finding the Deployment current",
            DEFAULT_TIMEOUT,
            0,
            |e| e["event"] == "poll" && e["summary"]["Current"] == 1,
        )
        .await?;
    let v2 = OciImage::single("rwatch-v2")?;
    registry.push(&v2, "demo/app", "latest").await?;
    // The poll loop hands the workload to the watcher's loop, which restamps it (budget, holds)
    // and says why.
    let restamped = leader
        .wait_event(
            "the leader restamps the moved tag",
            DEFAULT_TIMEOUT,
            0,
            |e| {
                e["event"] == "restamped"
                    && e["workload"].as_str().is_some_and(|w| w.ends_with("/app"))
            },
        )
        .await?;
    let reason = restamped["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("image tags moved"), "{restamped}");
    wait_until(
        "the Deployment pinned to the new digest",
        DEFAULT_TIMEOUT,
        || async {
            Ok(image_of(&stored(&client, &ns, "app").await?) == format!("{latest}@{}", v2.digest))
        },
    )
    .await?;
    assert!(
        standby.events_named("poll").is_empty() && standby.events_named("restamped").is_empty(),
        "a standby polls and writes nothing: {}",
        standby.context()
    );
    leader.signal(libc::SIGTERM)?;
    let status = leader.wait_exit(Duration::from_secs(20)).await?;
    assert_eq!(status.code(), Some(0), "{}", leader.context());
    // The standby takes over (at once: the leader released its Lease) and polls.
    standby
        .wait_event(
            "the standby takes over and polls",
            DEFAULT_TIMEOUT,
            0,
            |e| e["event"] == "poll" && e["summary"]["Current"] == 1,
        )
        .await?;
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

/// Deployments of `ns` the watcher restamped for `--images` (`repin:` in the restamp value) whose
/// rollout is not over yet, in one listing.
async fn repins_rolling(client: &kube::Client, ns: &str) -> anyhow::Result<Vec<String>> {
    let list = Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), ns)
        .list(&kube::api::ListParams::default())
        .await?;
    let mut rolling = Vec::new();
    for d in list.items {
        let repinned = d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("helmop.dev/restamp"))
            .is_some_and(|v| v.contains(helmop_core::names::RESTAMP_REPIN));
        if !repinned {
            continue;
        }
        let state = helmop_core::progress::roll_state(
            helmop_core::workload::WorkloadKind::Deployment,
            d.metadata.generation,
            &serde_json::to_value(&d)?,
        );
        if !state.is_over() {
            rolling.push(d.metadata.name.unwrap_or_default());
        }
    }
    Ok(rolling)
}

/// `rollout --watch --images`: a moved tag run by several workloads rolls them under the roll budget,
/// as a config change does (the poll loop hands them to the watcher's loop): never more than the
/// budget rolling at once, and every one re-pinned in the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_watch_images_rolls_a_moved_tag_under_the_roll_budget() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    let ns = fresh_namespace(&client, "img-budget").await?;
    ensure_hash_key(&client).await?;
    let registry = TestRegistry::start().await?;
    let webhook =
        Webhook::start(client.clone(), &[registry.host()], Duration::from_secs(2)).await?;
    let registration = webhook.register(&client, &ns).await?;
    let setup = Setup::new(&registry)?;
    let latest = format!("{}:latest", registry.repository("demo/app"));
    let v1 = OciImage::single("budget-v1")?;
    registry.push(&v1, "demo/app", "latest").await?;
    let names = ["a", "b", "c"];
    for name in names {
        // One replica on a cluster without a node: each rollout lasts until its 2 s deadline.
        let mut d = deployment(&ns, name, &latest, json!({}), json!({}));
        d["spec"]["progressDeadlineSeconds"] = json!(2);
        kubectl_apply(&d).await?;
        assert_eq!(
            image_of(&stored(&client, &ns, name).await?),
            format!("{latest}@{}", v1.digest)
        );
    }
    let args = [
        "--no-leader-election",
        "--max-rolling",
        "1",
        "--max-rolling-per-namespace",
        "1",
        "--debounce",
        "0s",
        "--min-roll-interval",
        "0s",
    ];
    let mut w = setup.rollout_watch(&ns, &args)?;
    w.wait_event(
        "a poll finding the three current",
        DEFAULT_TIMEOUT,
        0,
        |e| e["event"] == "poll" && e["summary"]["Current"] == 3,
    )
    .await?;
    let v2 = OciImage::single("budget-v2")?;
    registry.push(&v2, "demo/app", "latest").await?;
    let want = format!("{latest}@{}", v2.digest);
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut peak = 0;
    loop {
        let rolling = repins_rolling(&client, &ns).await?;
        peak = peak.max(rolling.len());
        assert!(
            rolling.len() <= 1,
            "{} rolling at once, over the budget of 1: {rolling:?}\n{}",
            rolling.len(),
            w.context()
        );
        let mut pinned = 0;
        for name in names {
            if image_of(&stored(&client, &ns, name).await?) == want {
                pinned += 1;
            }
        }
        if pinned == names.len() && rolling.is_empty() {
            break;
        }
        ensure!(
            Instant::now() < deadline,
            "{pinned} of {} re-pinned\n{}",
            names.len(),
            w.context()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(peak >= 1, "the sampling saw the rollouts");
    for name in names {
        let d = stored(&client, &ns, name).await?;
        let value = d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("helmop.dev/restamp"))
            .cloned()
            .unwrap_or_default();
        assert!(
            value.contains(helmop_core::names::RESTAMP_REPIN),
            "{name}: {value}"
        );
    }
    // The watcher counted each as a rollout of its budget, and says how each ended (the last one
    // once its status reaches the watcher's watch).
    let ended =
        |w: &PluginProcess| w.events_named("rolled").len() + w.events_named("roll-stalled").len();
    wait_until(
        "the watcher saw the three rollouts end",
        DEFAULT_TIMEOUT,
        || async { Ok(ended(&w) >= names.len()) },
    )
    .await?;
    assert_eq!(ended(&w), names.len(), "{}", w.context());
    w.signal(libc::SIGTERM)?;
    w.wait_exit(Duration::from_secs(20)).await?;
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}

/// An aborted Argo Rollout runs its stable revision on purpose: neither `images --watch` nor
/// `rollout --watch --images` restamps it for a moved tag (a restamp would roll it back onto the
/// revision it aborted); each says so, and the watcher re-pins it once the Rollout is healthy again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_argo_rollout_is_re_pinned_only_once_it_is_healthy() -> anyhow::Result<()> {
    let client = control_plane().upstream().client().await;
    install_argo_rollouts_crd(&client).await?;
    let ns = fresh_namespace(&client, "img-argo").await?;
    ensure_hash_key(&client).await?;
    let registry = TestRegistry::start().await?;
    let webhook =
        Webhook::start(client.clone(), &[registry.host()], Duration::from_secs(2)).await?;
    let registration = format!("{ns}-images-rollouts");
    WebhookRegistration::new(
        WebhookKind::Mutating,
        &registration,
        &format!("{}/mutate/workloads", webhook.server.url),
        &webhook.server.ca_pem,
    )
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "argoproj.io",
        "v1alpha1",
        &["rollouts"],
    ))
    .only_namespace(&ns)
    .register(&client)
    .await?;
    let setup = Setup::new(&registry)?;
    let latest = format!("{}:latest", registry.repository("demo/app"));
    let v1 = OciImage::single("argo-v1")?;
    registry.push(&v1, "demo/app", "latest").await?;
    let manifest = json!({
        "apiVersion": ARGO_ROLLOUTS_API_VERSION, "kind": "Rollout",
        "metadata": {"name": "canary", "namespace": ns,
                     "labels": {"helmop.dev/rollout-on-change": "true"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "canary"}},
                 "template": {"metadata": {"labels": {"app": "canary"}},
                              "spec": {"containers": [{"name": "app", "image": latest}]}},
                 "strategy": {"canary": {"steps": [{"setWeight": 50}]}}},
    });
    kubectl_apply(&manifest).await?;
    let api: Api<kube::api::DynamicObject> =
        Api::namespaced_with(client.clone(), &ns, &rollout_resource());
    let image = |obj: &kube::api::DynamicObject| {
        obj.data
            .pointer("/spec/template/spec/containers/0/image")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    assert_eq!(
        image(&api.get("canary").await?),
        format!("{latest}@{}", v1.digest)
    );
    let set_status = |status: Value| {
        let api = api.clone();
        async move {
            api.patch_status(
                "canary",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": status})),
            )
            .await
        }
    };
    // Argo Rollouts writes its observedGeneration as a string.
    let generation = api
        .get("canary")
        .await?
        .metadata
        .generation
        .unwrap_or(1)
        .to_string();
    set_status(json!({"abort": true, "phase": "Degraded", "observedGeneration": generation}))
        .await?;
    let v2 = OciImage::single("argo-v2")?;
    registry.push(&v2, "demo/app", "latest").await?;

    // `images --watch` alone: held, and nothing written.
    let out = setup.args(
        &ns,
        &[
            "--watch",
            "--interval",
            "1s",
            "--debounce",
            "0s",
            "-o",
            "json",
        ],
    );
    let mut alone = PluginProcess::spawn(&out, &[])?;
    let held = alone
        .wait_event(
            "images --watch holds the Rollout",
            DEFAULT_TIMEOUT,
            0,
            |e| e["event"] == "held",
        )
        .await?;
    assert_eq!(held["workload"], "rollout/canary", "{held}");
    assert!(
        held["why"].as_str().is_some_and(|w| w.contains("aborted")),
        "{held}"
    );
    alone.signal(libc::SIGTERM)?;
    alone.wait_exit(Duration::from_secs(20)).await?;

    // `rollout --watch --images`: the poll hands it over, the watcher's loop holds it.
    let args = [
        "--no-leader-election",
        "--debounce",
        "0s",
        "--min-roll-interval",
        "0s",
    ];
    let mut w = setup.rollout_watch(&ns, &args)?;
    let held = w
        .wait_event("the watcher holds the Rollout", DEFAULT_TIMEOUT, 0, |e| {
            e["event"] == "held" && e["hold"] == "rollout-busy"
        })
        .await?;
    assert!(
        held["reason"]
            .as_str()
            .is_some_and(|r| r.contains("image tags moved")),
        "{held}"
    );
    let obj = api.get("canary").await?;
    assert_eq!(
        image(&obj),
        format!("{latest}@{}", v1.digest),
        "an aborted Rollout keeps its pin"
    );
    assert!(
        obj.metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key("helmop.dev/restamp")),
        "an aborted Rollout is not restamped: {:?}",
        obj.metadata.annotations
    );

    // Healthy again: the re-pin it was owed lands.
    set_status(json!({"abort": false, "phase": "Healthy", "observedGeneration": generation}))
        .await?;
    w.wait_event("the watcher re-pins the Rollout", DEFAULT_TIMEOUT, 0, |e| {
        e["event"] == "restamped"
            && e["workload"]
                .as_str()
                .is_some_and(|n| n.ends_with("/canary"))
    })
    .await?;
    wait_until(
        "the Rollout pinned to the new digest",
        DEFAULT_TIMEOUT,
        || async { Ok(image(&api.get("canary").await?) == format!("{latest}@{}", v2.digest)) },
    )
    .await?;
    w.signal(libc::SIGTERM)?;
    w.wait_exit(Duration::from_secs(20)).await?;
    unregister_webhook(&client, WebhookKind::Mutating, &registration).await?;
    Ok(())
}
