//! `kubectl helmop rollout --watch` against the upstream cluster (API server and controller
//! manager) with the real admission webhook (in-process, registered for the test's namespace):
//! pods roll whoever changed what they read, and only then.
//!
//! Ordering without sleeps: a watcher run with `--max-concurrent 1 --debounce 0s` decides
//! workloads one at a time in the order their changes arrived on one watch, so once a change
//! made after another (to a Secret watched on the same stream) has been restamped, the earlier
//! change has been decided too; that is how "this did not roll" is shown.

use std::time::Duration;

use anyhow::Context;
use helmop_tests::*;
use helmop_webhook::state::Config;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::events::v1::Event as KubeEvent;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const CONFIG_HASH: &str = "helmop.dev/config-hash";
const RESTAMP: &str = "helmop.dev/restamp";
const WAIT: Duration = Duration::from_secs(60);

struct Fixture {
    up: &'static ClusterInfo,
    client: Client,
    ns: String,
    kubeconfig: String,
    _webhook: LocalWebhook,
}

impl Fixture {
    async fn new(prefix: &str) -> anyhow::Result<Fixture> {
        let up = control_plane().upstream();
        let client = up.client().await;
        ensure_hash_key(&client).await?;
        let ns = fresh_namespace_with_labels(
            &client,
            prefix,
            &[("helmop.dev/rollout-on-change", "enabled")],
        )
        .await?;
        let webhook = LocalWebhook::start(client.clone(), Config::default()).await?;
        WebhookRegistration::new(
            WebhookKind::Mutating,
            &format!("{ns}-stamp"),
            &format!("{}/mutate/workloads", webhook.url),
            &webhook.ca_pem,
        )
        .rule(WebhookRule::new(
            &["CREATE", "UPDATE"],
            "apps",
            "v1",
            &["deployments", "statefulsets", "daemonsets", "replicasets"],
        ))
        .rule(WebhookRule::new(
            &["CREATE", "UPDATE"],
            "batch",
            "v1beta1",
            &["cronjobs"],
        ))
        .rule(WebhookRule::new(
            &["CREATE", "UPDATE"],
            "argoproj.io",
            "v1alpha1",
            &["rollouts"],
        ))
        .only_namespace(&ns)
        .register(&client)
        .await?;
        Ok(Fixture {
            up,
            client,
            ns,
            kubeconfig: up.kubeconfig.display().to_string(),
            _webhook: webhook,
        })
    }

    fn spawn_watcher(&self, extra: &[&str], env: &[(&str, &str)]) -> anyhow::Result<PluginProcess> {
        let mut args = extra.to_vec();
        // The brakes are proven by their own tests below; the others watch workloads that never
        // become available (no node here) and restamp one workload several times in a row.
        for (flag, value) in [
            ("--min-roll-interval", "0s"),
            ("--max-rolling", "1000"),
            ("--max-rolling-per-namespace", "1000"),
            ("--flap-changes", "0"),
        ] {
            if !extra.contains(&flag) {
                args.extend_from_slice(&[flag, value]);
            }
        }
        self.spawn_scoped(&["-n", &self.ns], &args, env)
    }

    /// `rollout SCOPE --watch EXTRA` on the test cluster, JSON events on stdout; the shipped brakes
    /// but for what `extra` sets.
    fn spawn_scoped(
        &self,
        scope: &[&str],
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> anyhow::Result<PluginProcess> {
        spawn_rollout_watch(&self.kubeconfig, scope, extra, env)
    }

    /// A watcher that decides one workload at a time, in order (see the module's doc).
    async fn ordered_watcher(&self) -> anyhow::Result<PluginProcess> {
        let mut w = self.spawn_watcher(
            &[
                "--no-leader-election",
                "--max-concurrent",
                "1",
                "--debounce",
                "0s",
            ],
            &[],
        )?;
        wait_for(&mut w, "synced").await?;
        Ok(w)
    }

    async fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> anyhow::Result<()> {
        let mut all = vec!["-n", &self.ns];
        all.extend_from_slice(args);
        let out = self.up.run_kubectl(&all, stdin).await?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    }

    /// The ConfigMap `settings` (`mode: a`) and the Deployment `web` reading it whole through
    /// `envFrom`; the stamp `web` got at creation.
    async fn web_reading_settings(&self) -> anyhow::Result<String> {
        create_config_map(&self.client, &self.ns, "settings", &[("mode", "a")]).await?;
        self.apply(&deployment(
            "web",
            json!({}),
            json!({"container": {"envFrom": [{"configMapRef": {"name": "settings"}}]}}),
        ))
        .await?;
        self.stamp("web")
            .await?
            .context("web was not stamped at creation")
    }

    /// `kubectl patch KIND NAME --type merge -p PATCH`, as a user edits an object.
    async fn patch(&self, kind: &str, name: &str, patch: &str) -> anyhow::Result<()> {
        self.kubectl(&["patch", kind, name, "--type", "merge", "-p", patch], None)
            .await
    }

    async fn apply(&self, manifest: &Value) -> anyhow::Result<()> {
        self.kubectl(&["apply", "-f", "-"], Some(&manifest.to_string()))
            .await
    }

    async fn deployment(&self, name: &str) -> anyhow::Result<Deployment> {
        Ok(Api::<Deployment>::namespaced(self.client.clone(), &self.ns)
            .get(name)
            .await?)
    }

    async fn stamp(&self, name: &str) -> anyhow::Result<Option<String>> {
        Ok(template_annotation(
            &self.deployment(name).await?,
            CONFIG_HASH,
        ))
    }

    async fn replica_sets(&self, app: &str) -> anyhow::Result<usize> {
        let list = Api::<ReplicaSet>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default().labels(&format!("app={app}")))
            .await?;
        Ok(list.items.len())
    }

    async fn wait_replica_sets(&self, app: &str, n: usize) -> anyhow::Result<()> {
        wait_until(&format!("{n} ReplicaSets of {app}"), WAIT, || async {
            Ok(self.replica_sets(app).await? == n)
        })
        .await
    }

    async fn wait_replica_sets_at_least(&self, app: &str, n: usize) -> anyhow::Result<()> {
        wait_until(&format!("{n} ReplicaSets of {app}"), WAIT, || async {
            Ok(self.replica_sets(app).await? >= n)
        })
        .await
    }

    /// Events on `name` with `reason`.
    async fn events(&self, name: &str, reason: &str) -> anyhow::Result<Vec<KubeEvent>> {
        let list = Api::<KubeEvent>::namespaced(self.client.clone(), &self.ns)
            .list(&ListParams::default())
            .await?;
        Ok(list
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
            .collect())
    }
}

/// `rollout SCOPE --watch EXTRA` against the cluster of `kubeconfig`, JSON events on stdout,
/// `HELMOP_LOG=info` and `env`.
pub(crate) fn spawn_rollout_watch(
    kubeconfig: &str,
    scope: &[&str],
    extra: &[&str],
    env: &[(&str, &str)],
) -> anyhow::Result<PluginProcess> {
    let mut args = vec!["rollout"];
    args.extend_from_slice(scope);
    args.extend_from_slice(&["--watch", "--kubeconfig", kubeconfig, "-o", "json"]);
    args.extend_from_slice(extra);
    let mut all_env = vec![("HELMOP_LOG", "info")];
    all_env.extend_from_slice(env);
    PluginProcess::spawn(&args, &all_env)
}

/// A Deployment `name` (label `app=name`) whose one container reads `pod` (extra PodSpec fields).
fn deployment(name: &str, labels: Value, pod: Value) -> Value {
    let mut spec =
        json!({"containers": [{"name": "app", "image": "registry.example.com/app:1.0"}]});
    if let (Some(spec), Some(extra)) = (spec.as_object_mut(), pod.as_object()) {
        for (k, v) in extra {
            if k == "container" {
                if let (Some(c), Some(fields)) =
                    (spec["containers"][0].as_object_mut(), v.as_object())
                {
                    c.extend(fields.clone());
                }
            } else {
                spec.insert(k.clone(), v.clone());
            }
        }
    }
    let mut labels = labels;
    labels["app"] = json!(name);
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    })
}

/// Waits for the watcher's next (or first) event named `event`.
async fn wait_for(w: &mut PluginProcess, event: &str) -> anyhow::Result<Value> {
    w.wait_event(&format!("the watcher's {event} event"), WAIT, 0, |e| {
        e["event"] == event
    })
    .await
}

pub(crate) fn restamped_for(name: &str) -> impl Fn(&Value) -> bool + '_ {
    move |e: &Value| {
        e["event"] == "restamped"
            && e["workload"]
                .as_str()
                .is_some_and(|w| w.ends_with(&format!("/{name}")))
    }
}

fn restamps_of(w: &PluginProcess, name: &str) -> usize {
    w.events().iter().filter(|e| restamped_for(name)(e)).count()
}

/// Changes the Secret `sentinel` (read by the Deployment `sentinel`) and waits until the watcher
/// restamped that: every change on the Secret watch before it has been decided.
async fn barrier(f: &Fixture, w: &mut PluginProcess, value: &str) -> anyhow::Result<()> {
    let skip = w.events().len();
    let patch = json!({"stringData": {"v": value}}).to_string();
    f.patch("secret", "sentinel", &patch).await?;
    w.wait_event("the expected event", WAIT, skip, restamped_for("sentinel"))
        .await?;
    Ok(())
}

async fn sentinel(f: &Fixture) -> anyhow::Result<()> {
    create_secret(&f.client, &f.ns, "sentinel", &[("v", b"0")]).await?;
    f.apply(&deployment(
        "sentinel",
        json!({}),
        json!({"container": {"envFrom": [{"secretRef": {"name": "sentinel"}}]}}),
    ))
    .await
}

#[tokio::test]
async fn edits_rotations_and_late_optional_references_roll_and_nothing_else_does()
-> anyhow::Result<()> {
    let f = Fixture::new("rwatch").await?;
    // The ConfigMap as Fleet's agent writes a downstream copy (its BundleDeployment label).
    f.apply(&json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "settings", "labels": {"fleet.cattle.io/bundledeployment": "app-x"}},
        "data": {"mode": "a"},
    }))
    .await?;
    create_secret(
        &f.client,
        &f.ns,
        "db",
        &[("password", b"p1"), ("other", b"o1")],
    )
    .await?;
    sentinel(&f).await?;
    let reads = json!({
        "container": {
            "envFrom": [{"configMapRef": {"name": "settings"}}],
            "env": [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}],
        },
        "volumes": [{"name": "later", "configMap": {"name": "later", "optional": true}}],
    });
    f.apply(&deployment("web", json!({}), reads.clone()))
        .await?;
    f.apply(&deployment(
        "manual",
        json!({"helmop.dev/rollout-on-change": "false"}),
        reads,
    ))
    .await?;
    let first = f.stamp("web").await?.context("stamped at creation")?;
    f.wait_replica_sets("web", 1).await?;
    let mut w = f.ordered_watcher().await?;

    // Nothing changed since admission: the start decides every workload and restamps none.
    barrier(&f, &mut w, "1").await?;
    assert_eq!(restamps_of(&w, "web"), 0, "{}", w.context());
    assert_eq!(f.stamp("web").await?.as_deref(), Some(first.as_str()));

    // kubectl edit of the ConfigMap (a merge patch, as `kubectl edit` sends): web rolls.
    let skip = w.events().len();
    f.patch("configmap", "settings", r#"{"data":{"mode":"b"}}"#)
        .await?;
    let e = w
        .wait_event("the expected event", WAIT, skip, restamped_for("web"))
        .await?;
    assert!(
        e["reason"]
            .as_str()
            .is_some_and(|r| r.contains("ConfigMap") && r.contains("settings changed")),
        "{e}"
    );
    let second = f.stamp("web").await?.context("stamp")?;
    assert_ne!(second, first);
    assert_eq!(e["to"], second.as_str());
    f.wait_replica_sets("web", 2).await?;
    let deployment = f.deployment("web").await?;
    let restamp = deployment
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RESTAMP))
        .context("restamp annotation")?;
    assert!(restamp.starts_with("watch:"), "{restamp}");
    wait_until("a Restamped Event on web", WAIT, || async {
        Ok(f.events("web", "Restamped").await?.iter().any(|e| {
            e.note
                .as_deref()
                .is_some_and(|n| n.contains("settings changed"))
        }))
    })
    .await?;

    // A key nobody reads changes: no restamp, no new ReplicaSet.
    f.patch("secret", "db", r#"{"stringData":{"other":"o2"}}"#)
        .await?;
    barrier(&f, &mut w, "2").await?;
    assert_eq!(restamps_of(&w, "web"), 1, "{}", w.context());
    assert_eq!(f.stamp("web").await?.as_deref(), Some(second.as_str()));
    assert_eq!(f.replica_sets("web").await?, 2);

    // An operator rotates the Secret by delete + create. While it is gone, nothing rolls: new pods
    // could not start, the running ones keep what they read. Once it is back: one rollout.
    let skip = w.events().len();
    f.kubectl(&["delete", "secret", "db"], None).await?;
    let e = w
        .wait_event("waiting for the deleted Secret", WAIT, skip, |e| {
            e["event"] == "held" && e["workload"].as_str().is_some_and(|n| n.ends_with("/web"))
        })
        .await?;
    assert_eq!(e["missing"], json!(["secret/db"]), "{e}");
    assert_eq!(e["hold"], "missing", "{e}");
    barrier(&f, &mut w, "3").await?;
    assert_eq!(restamps_of(&w, "web"), 1, "{}", w.context());
    assert_eq!(f.stamp("web").await?.as_deref(), Some(second.as_str()));
    create_secret(
        &f.client,
        &f.ns,
        "db",
        &[("password", b"p2"), ("other", b"o2")],
    )
    .await?;
    barrier(&f, &mut w, "4").await?;
    assert_eq!(
        restamps_of(&w, "web"),
        2,
        "one rollout for the rotation\n{}",
        w.context()
    );
    let third = f.stamp("web").await?.context("stamp")?;
    assert_ne!(third, second);
    assert!(
        current(&f, "web").await?,
        "stamped for the recreated Secret"
    );
    f.wait_replica_sets("web", 3).await?;

    // A missing optional reference is created later: web rolls.
    let skip = w.events().len();
    create_config_map(&f.client, &f.ns, "later", &[("file", "x")]).await?;
    let e = w
        .wait_event("the expected event", WAIT, skip, restamped_for("web"))
        .await?;
    assert!(
        e["reason"]
            .as_str()
            .is_some_and(|r| r.contains("later created")),
        "{e}"
    );
    let fourth = f.stamp("web").await?.context("stamp")?;
    assert_ne!(fourth, third);

    // The opted-out workload read all of it and was never stamped nor restamped.
    barrier(&f, &mut w, "5").await?;
    assert_eq!(restamps_of(&w, "manual"), 0, "{}", w.context());
    let manual = f.deployment("manual").await?;
    assert_eq!(template_annotation(&manual, CONFIG_HASH), None);
    assert!(
        manual
            .metadata
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(RESTAMP))
    );
    assert_eq!(f.replica_sets("manual").await?, 1);
    // web was restamped several times by one watcher: one Restamped Event, its series counting
    // them, not one Event per restamp.
    let restamped = restamps_of(&w, "web");
    assert!(restamped >= 2, "{}", w.context());
    wait_until(
        "one Restamped Event on web counting its restamps",
        WAIT,
        || async {
            let events = f.events("web", "Restamped").await?;
            Ok(events.len() == 1
                && events[0]
                    .series
                    .as_ref()
                    .is_some_and(|s| usize::try_from(s.count).unwrap_or(0) == restamped))
        },
    )
    .await?;
    Ok(())
}

/// Whether `name`'s stored stamp is the one the webhook computes now: a server-side dry-run
/// restamp would not change it.
async fn current(f: &Fixture, name: &str) -> anyhow::Result<bool> {
    let target = format!("deploy/{name}");
    let out = run_plugin(
        &[
            "rollout",
            &target,
            "--dry-run",
            "-o",
            "json",
            "-n",
            &f.ns,
            "--kubeconfig",
            &f.kubeconfig,
        ],
        &[],
        WAIT,
    )
    .await?;
    let r: Value = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "rollout --dry-run: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    })?;
    Ok(r["stampChanged"] == false)
}

#[tokio::test]
async fn a_burst_of_edits_rolls_once_or_twice_and_ends_with_the_final_content() -> anyhow::Result<()>
{
    let f = Fixture::new("rwatch-burst").await?;
    create_config_map(&f.client, &f.ns, "settings", &[("mode", "0")]).await?;
    f.apply(&deployment(
        "web",
        json!({}),
        json!({"container": {"envFrom": [{"configMapRef": {"name": "settings"}}]}}),
    ))
    .await?;
    f.wait_replica_sets("web", 1).await?;
    let mut w = f.spawn_watcher(&["--no-leader-election", "--debounce", "1s"], &[])?;
    wait_for(&mut w, "synced").await?;
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(f.client.clone(), &f.ns);
    for i in 1..=10 {
        cms.patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"mode": i.to_string()}})),
        )
        .await?;
    }
    // Settled: the stored stamp is the one the webhook computes for the final content. From then
    // on no restamp can change it (a later decision finds it current), so the count is final.
    wait_until("web stamped for the final content", WAIT, || {
        current(&f, "web")
    })
    .await?;
    // The last restamp's event may print just after its stamp is stored: read until it has.
    wait_until("the restamp that stored the final stamp", WAIT, || async {
        let stamp = f.stamp("web").await?;
        Ok(w.events_named("restamped")
            .iter()
            .any(|e| e["to"].as_str() == stamp.as_deref()))
    })
    .await?;
    let restamps = restamps_of(&w, "web");
    assert!(
        (1..=2).contains(&restamps),
        "a burst of 10 edits: {restamps} restamps\n{}",
        w.context()
    );
    // One new ReplicaSet per template the Deployment controller saw: at least the final one, at
    // most one per restamp.
    f.wait_replica_sets_at_least("web", 2).await?;
    let sets = f.replica_sets("web").await?;
    assert!(
        sets <= 1 + restamps,
        "{sets} ReplicaSets for {restamps} restamps"
    );
    Ok(())
}

#[tokio::test]
async fn statefulsets_daemonsets_cronjobs_and_argo_rollouts_roll_too() -> anyhow::Result<()> {
    let f = Fixture::new("rwatch-kinds").await?;
    install_argo_rollouts_crd(&f.client).await?;
    create_config_map(&f.client, &f.ns, "shared", &[("mode", "a")]).await?;
    let pod = json!({
        "containers": [{"name": "app", "image": "registry.example.com/app:1.0",
                        "envFrom": [{"configMapRef": {"name": "shared"}}]}],
        "restartPolicy": "Always",
    });
    let mut job_pod = pod.clone();
    job_pod["restartPolicy"] = json!("Never");
    let template =
        |name: &str, pod: &Value| json!({"metadata": {"labels": {"app": name}}, "spec": pod});
    let manifests = [
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "db"},
               "spec": {"serviceName": "db", "selector": {"matchLabels": {"app": "db"}},
                        "template": template("db", &pod)}}),
        json!({"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "agent"},
               "spec": {"selector": {"matchLabels": {"app": "agent"}},
                        "template": template("agent", &pod)}}),
        json!({"apiVersion": "batch/v1beta1", "kind": "CronJob", "metadata": {"name": "nightly"},
               "spec": {"schedule": "0 3 * * *", "jobTemplate": {"spec": {
                        "template": template("nightly", &job_pod)}}}}),
        json!({"apiVersion": "argoproj.io/v1alpha1", "kind": "Rollout", "metadata": {"name": "canary"},
               "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "canary"}},
                        "template": template("canary", &pod),
                        "strategy": {"canary": {"steps": [{"setWeight": 50}]}}}}),
    ];
    for m in &manifests {
        f.apply(m).await?;
    }
    let kinds = [
        (
            "apps",
            "v1",
            "StatefulSet",
            "statefulsets",
            "db",
            &["spec", "template"][..],
        ),
        (
            "apps",
            "v1",
            "DaemonSet",
            "daemonsets",
            "agent",
            &["spec", "template"][..],
        ),
        (
            "batch",
            "v1beta1",
            "CronJob",
            "cronjobs",
            "nightly",
            &["spec", "jobTemplate", "spec", "template"][..],
        ),
        (
            "argoproj.io",
            "v1alpha1",
            "Rollout",
            "rollouts",
            "canary",
            &["spec", "template"][..],
        ),
    ];
    let stamp_of = |obj: &DynamicObject, path: &[&str]| -> Option<String> {
        let mut v = &obj.data;
        for p in path {
            v = v.get(*p)?;
        }
        v.pointer("/metadata/annotations/helmop.dev~1config-hash")?
            .as_str()
            .map(str::to_owned)
    };
    let mut before = Vec::new();
    for (group, version, kind, plural, name, path) in kinds {
        let ar = kube::api::ApiResource {
            group: group.into(),
            version: version.into(),
            api_version: format!("{group}/{version}"),
            kind: kind.into(),
            plural: plural.into(),
        };
        let api: Api<DynamicObject> = Api::namespaced_with(f.client.clone(), &f.ns, &ar);
        let obj = api.get(name).await?;
        let stamp =
            stamp_of(&obj, path).with_context(|| format!("{kind} {name} stamped at creation"))?;
        before.push((api, name, path, stamp));
    }
    let mut w = f.spawn_watcher(&["--no-leader-election"], &[])?;
    let started = wait_for(&mut w, "started").await?;
    for kind in ["StatefulSet", "DaemonSet", "CronJob", "Rollout"] {
        assert!(
            started["kinds"]
                .as_array()
                .is_some_and(|k| k.contains(&json!(kind))),
            "{started}"
        );
    }
    wait_for(&mut w, "synced").await?;
    f.patch("configmap", "shared", r#"{"data":{"mode":"b"}}"#)
        .await?;
    for (api, name, path, old) in &before {
        wait_until(&format!("{name} restamped"), WAIT, || async {
            let obj = api.get(name).await?;
            Ok(stamp_of(&obj, path).is_some_and(|s| s != *old))
        })
        .await?;
        // The watcher prints its event once the PATCH response is back, which may be after the
        // new stamp is visible here.
        w.wait_event(
            &format!("the watcher's restamp of {name}"),
            WAIT,
            0,
            restamped_for(name),
        )
        .await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_refused_restamp_is_reported_and_retried_with_back_off() -> anyhow::Result<()> {
    let f = Fixture::new("rwatch-refused").await?;
    let first = f.web_reading_settings().await?;
    // Every UPDATE of a Deployment in the namespace is refused: nothing answers this webhook.
    let refuse = format!("{}-refuse", f.ns);
    WebhookRegistration::new(
        WebhookKind::Validating,
        &refuse,
        "https://127.0.0.1:1/refuse",
        &f._webhook.ca_pem,
    )
    .rule(WebhookRule::new(
        &["UPDATE"],
        "apps",
        "v1",
        &["deployments"],
    ))
    .only_namespace(&f.ns)
    .timeout_seconds(2)
    .register(&f.client)
    .await?;
    let mut w = f.spawn_watcher(&["--no-leader-election"], &[])?;
    wait_for(&mut w, "synced").await?;
    f.patch("configmap", "settings", r#"{"data":{"mode":"b"}}"#)
        .await?;
    // Refused twice: reported each time, retried after a back-off, never in a hot loop.
    wait_for(&mut w, "failed").await?;
    let failures = w.events_named("failed");
    let second = w
        .wait_event("a second refusal", WAIT, 0, |e| {
            e["event"] == "failed" && e["time"] != failures[0]["time"]
        })
        .await?;
    let t0: k8s_openapi::jiff::Timestamp = failures[0]["time"].as_str().context("time")?.parse()?;
    let t1: k8s_openapi::jiff::Timestamp = second["time"].as_str().context("time")?.parse()?;
    assert!(
        t1.duration_since(t0).as_secs_f64() >= 0.9,
        "retried after a back-off: {t0} then {t1}"
    );
    wait_until("a RestampRefused Event on web", WAIT, || async {
        Ok(!f.events("web", "RestampRefused").await?.is_empty())
    })
    .await?;
    assert_eq!(f.stamp("web").await?.as_deref(), Some(first.as_str()));
    // The refusal goes: the next retry restamps, with nothing changed meanwhile.
    unregister_webhook(&f.client, WebhookKind::Validating, &refuse).await?;
    w.wait_event("the expected event", WAIT, 0, restamped_for("web"))
        .await?;
    assert_ne!(f.stamp("web").await?.as_deref(), Some(first.as_str()));
    Ok(())
}

#[tokio::test]
async fn a_watcher_killed_between_decision_and_restamp_repairs_on_start() -> anyhow::Result<()> {
    let f = Fixture::new("rwatch-kill").await?;
    let first = f.web_reading_settings().await?;
    let dir = tempfile::tempdir()?;
    let never = dir.path().join("never");
    let pause = format!("rollout-before-restamp:{}", never.display());
    let mut w = f.spawn_watcher(&["--no-leader-election"], &[("HELMOP_TEST_PAUSE", &pause)])?;
    wait_for(&mut w, "synced").await?;
    f.patch("configmap", "settings", r#"{"data":{"mode":"b"}}"#)
        .await?;
    wait_until("the watcher paused before its restamp", WAIT, || async {
        Ok(w.stderr().contains("paused at rollout-before-restamp"))
    })
    .await?;
    w.signal(libc::SIGKILL)?;
    w.wait_exit(WAIT).await?;
    assert_eq!(f.stamp("web").await?.as_deref(), Some(first.as_str()));
    // A new watcher knows nothing of the old one: its start decides from state.
    let mut w = f.spawn_watcher(&["--no-leader-election"], &[])?;
    let e = w
        .wait_event("the expected event", WAIT, 0, restamped_for("web"))
        .await?;
    assert_eq!(e["reason"], "start", "{e}");
    assert_ne!(f.stamp("web").await?.as_deref(), Some(first.as_str()));
    // The new template's ReplicaSet (at least: on a shared, loaded cluster another stamper may
    // have rolled it as well).
    f.wait_replica_sets_at_least("web", 2).await?;
    Ok(())
}

#[tokio::test]
async fn two_watchers_of_one_scope_elect_one_restamper() -> anyhow::Result<()> {
    let f = Fixture::new("rwatch-lease").await?;
    f.web_reading_settings().await?;
    let args = ["--lease-namespace", f.ns.as_str(), "--lease-duration", "3s"];
    let mut a = f.spawn_watcher(&args, &[])?;
    let mut b = f.spawn_watcher(&args, &[])?;
    for w in [&mut a, &mut b] {
        wait_for(w, "synced").await?;
    }
    let leaders = |w: &PluginProcess| {
        w.events_named("leader")
            .last()
            .is_some_and(|e| e["leading"] == true)
    };
    wait_until("one leader", WAIT, || async {
        Ok(leaders(&a) || leaders(&b))
    })
    .await?;
    assert!(
        !(leaders(&a) && leaders(&b)),
        "{}\n{}",
        a.context(),
        b.context()
    );
    let lease =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(f.client.clone(), &f.ns)
            .get(&format!("kubectl-helmop-rollout-ns-{}", f.ns))
            .await?;
    assert!(lease.spec.and_then(|s| s.holder_identity).is_some());
    f.patch("configmap", "settings", r#"{"data":{"mode":"b"}}"#)
        .await?;
    let (leader, standby) = if leaders(&a) {
        (&mut a, &b)
    } else {
        (&mut b, &a)
    };
    leader
        .wait_event("the expected event", WAIT, 0, restamped_for("web"))
        .await?;
    assert_eq!(restamps_of(standby, "web"), 0, "{}", standby.context());
    Ok(())
}

/// Two watchers whose scopes nest (`-n NS` contains `-n NS -l app=web`): the narrower one stands by
/// while the wider one's Lease is fresh, so a change is restamped once, not twice; once the wider
/// one is gone (its Lease released), the narrower one restamps again.
#[tokio::test]
async fn a_narrower_watcher_stands_by_while_a_wider_one_leads() -> anyhow::Result<()> {
    let f = Fixture::new("rwatch-nest").await?;
    f.web_reading_settings().await?;
    let lease = ["--lease-namespace", f.ns.as_str(), "--lease-duration", "3s"];
    let mut narrow_args = lease.to_vec();
    narrow_args.extend_from_slice(&["-l", "app=web", "--debounce", "0s"]);
    let mut narrow = f.spawn_watcher(&narrow_args, &[])?;
    wait_for(&mut narrow, "synced").await?;
    let mut wide_args = lease.to_vec();
    wide_args.extend_from_slice(&["--debounce", "0s"]);
    let mut wide = f.spawn_watcher(&wide_args, &[])?;
    wait_for(&mut wide, "synced").await?;
    let wide_lease = format!("kubectl-helmop-rollout-ns-{}", f.ns);
    let covered = narrow
        .wait_event("the narrower watcher stands by", WAIT, 0, |e| {
            e["event"] == "covered"
        })
        .await?;
    assert_eq!(covered["lease"], wide_lease.as_str(), "{covered}");
    // Two changes, each restamped by the wider watcher; the narrower one writes nothing (it would
    // have restamped the first one at the same time as the wider one did).
    for (n, mode) in ["b", "c"].iter().enumerate() {
        f.patch(
            "configmap",
            "settings",
            &json!({"data": {"mode": mode}}).to_string(),
        )
        .await?;
        wait_until(
            &format!("restamp {} by the wider watcher", n + 1),
            WAIT,
            || async { Ok(restamps_of(&wide, "web") > n) },
        )
        .await?;
    }
    assert_eq!(restamps_of(&narrow, "web"), 0, "{}", narrow.context());
    // The wider watcher stops and releases its Lease: the narrower one acts again.
    let skip = narrow.events().len();
    wide.signal(libc::SIGTERM)?;
    wide.wait_exit(Duration::from_secs(20)).await?;
    narrow
        .wait_event("the narrower watcher acts again", WAIT, skip, |e| {
            e["event"] == "uncovered"
        })
        .await?;
    f.patch("configmap", "settings", r#"{"data":{"mode":"d"}}"#)
        .await?;
    narrow
        .wait_event(
            "the narrower watcher restamps",
            WAIT,
            0,
            restamped_for("web"),
        )
        .await?;
    Ok(())
}

#[tokio::test]
async fn a_workload_deleted_mid_restamp_is_dropped_quietly() -> anyhow::Result<()> {
    let f = Fixture::new("rwatch-gone").await?;
    create_config_map(&f.client, &f.ns, "settings", &[("mode", "a")]).await?;
    for name in ["web", "api"] {
        f.apply(&deployment(
            name,
            json!({}),
            json!({"container": {"envFrom": [{"configMapRef": {"name": "settings"}}]}}),
        ))
        .await?;
    }
    let dir = tempfile::tempdir()?;
    let release = dir.path().join("release");
    let pause = format!("rollout-before-restamp:{}", release.display());
    let mut w = f.spawn_watcher(
        &["--no-leader-election", "--max-concurrent", "1"],
        &[("HELMOP_TEST_PAUSE", &pause)],
    )?;
    w.wait_event("synced", WAIT, 0, |e| e["event"] == "synced")
        .await?;
    f.patch("configmap", "settings", r#"{"data":{"mode":"b"}}"#)
        .await?;
    wait_until(
        "the watcher paused before its first restamp",
        WAIT,
        || async { Ok(w.stderr().contains("paused at rollout-before-restamp")) },
    )
    .await?;
    // Both were due; one is being restamped. Delete both, then let the restamp go on.
    f.kubectl(
        &["delete", "deployment", "web", "api", "--wait=false"],
        None,
    )
    .await?;
    wait_until("both Deployments gone", WAIT, || async {
        Ok(Api::<Deployment>::namespaced(f.client.clone(), &f.ns)
            .list(&ListParams::default())
            .await?
            .items
            .is_empty())
    })
    .await?;
    std::fs::write(&release, b"")?;
    // The watcher goes on: a new reader is restamped as usual, and nothing failed meanwhile.
    f.apply(&deployment(
        "late",
        json!({}),
        json!({"container": {"envFrom": [{"configMapRef": {"name": "settings"}}]}}),
    ))
    .await?;
    f.patch("configmap", "settings", r#"{"data":{"mode":"c"}}"#)
        .await?;
    w.wait_event("the new reader restamped", WAIT, 0, restamped_for("late"))
        .await?;
    for bad in ["failed", "ineffective"] {
        assert!(
            w.events_named(bad).is_empty(),
            "a deleted workload is no failure: {}",
            w.context()
        );
    }
    assert_eq!(restamps_of(&w, "web") + restamps_of(&w, "api"), 0);
    Ok(())
}

/// A Deployment `name` reading Secret `secret` through `envFrom`, with `replicas` and a progress
/// deadline: with no node here, a rollout of one replica is over when the deployment controller
/// marks it past its deadline, one of zero replicas as soon as the controller observes it.
fn reader(name: &str, secret: &str, replicas: u32) -> Value {
    let mut d = deployment(
        name,
        json!({}),
        json!({"container": {"envFrom": [{"secretRef": {"name": secret}}]}}),
    );
    d["spec"]["replicas"] = json!(replicas);
    d["spec"]["progressDeadlineSeconds"] = json!(2);
    d
}

/// Deployments of the namespace whose rollout the watcher started and that is not over yet, in
/// one consistent listing: restamped by a watcher (`watch:` in its restamp value), and neither
/// observed complete nor past its progress deadline.
async fn rolling_now(f: &Fixture) -> anyhow::Result<Vec<String>> {
    let list = Api::<Deployment>::namespaced(f.client.clone(), &f.ns)
        .list(&ListParams::default())
        .await?;
    let mut rolling = Vec::new();
    for d in list.items {
        let restamped = d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RESTAMP))
            .is_some_and(|v| v.contains("watch:"));
        if !restamped {
            continue;
        }
        let obj = serde_json::to_value(&d)?;
        let state = helmop_core::progress::roll_state(
            helmop_core::workload::WorkloadKind::Deployment,
            d.metadata.generation,
            &obj,
        );
        if !state.is_over() {
            rolling.push(d.metadata.name.unwrap_or_default());
        }
    }
    Ok(rolling)
}

#[tokio::test]
async fn a_change_read_by_every_workload_never_has_more_than_the_budget_rolling()
-> anyhow::Result<()> {
    let f = Fixture::new("rwatch-budget").await?;
    create_secret(&f.client, &f.ns, "shared", &[("v", b"0")]).await?;
    // Half roll for seconds (until their deadline), half are over at once.
    let names: Vec<String> = (0..12).map(|n| format!("w{n:02}")).collect();
    for (n, name) in names.iter().enumerate() {
        let replicas = if n % 2 == 0 { 1 } else { 0 };
        f.apply(&reader(name, "shared", replicas)).await?;
    }
    let mut w = f.spawn_watcher(
        &[
            "--no-leader-election",
            "--max-rolling",
            "3",
            "--max-rolling-per-namespace",
            "2",
            "--debounce",
            "0s",
        ],
        &[],
    )?;
    wait_for(&mut w, "synced").await?;
    f.patch("secret", "shared", r#"{"stringData":{"v":"1"}}"#)
        .await?;
    // Sample the cluster's own picture until every reader is restamped and over.
    let mut peak = 0;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(180);
    loop {
        let rolling = rolling_now(&f).await?;
        peak = peak.max(rolling.len());
        assert!(
            rolling.len() <= 2,
            "{} rolling at once in one namespace, over its share of 2: {rolling:?}\n{}",
            rolling.len(),
            w.context()
        );
        let restamped = names.iter().filter(|n| restamps_of(&w, n) >= 1).count();
        if restamped == names.len() && rolling.is_empty() {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "{restamped} of {} restamped\n{}",
            names.len(),
            w.context()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(peak >= 1, "the sampling saw rollouts");
    // The watcher's own account agrees, and it said how each ended.
    let rolled = w.events_named("rolled").len() + w.events_named("roll-stalled").len();
    assert_eq!(rolled, names.len(), "{}", w.context());
    wait_until("a RolloutStalled Event on w00", WAIT, || async {
        Ok(!f.events("w00", "RolloutStalled").await?.is_empty())
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn a_flapping_secret_opens_the_breaker_once_and_rolls_at_most_twice() -> anyhow::Result<()> {
    let f = Fixture::new("rwatch-flap").await?;
    create_secret(&f.client, &f.ns, "flap", &[("v", b"0")]).await?;
    f.apply(&reader("web", "flap", 0)).await?;
    let first = f.stamp("web").await?.context("web was not stamped")?;
    let mut w = f.spawn_watcher(
        &[
            "--no-leader-election",
            "--debounce",
            "250ms",
            "--max-wait",
            "2s",
            "--min-roll-interval",
            "10s",
            "--flap-changes",
            "5",
            "--flap-window",
            "30s",
            "--flap-release",
            "4s",
        ],
        &[],
    )?;
    wait_for(&mut w, "synced").await?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(f.client.clone(), &f.ns);
    // Written every 200 ms for 10 s.
    let mut last = String::new();
    for i in 1..=50 {
        last = i.to_string();
        secrets
            .patch(
                "flap",
                &PatchParams::default(),
                &Patch::Merge(json!({"stringData": {"v": last}})),
            )
            .await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let during = restamps_of(&w, "web");
    assert!(
        during <= 1,
        "{during} restamps while it flapped\n{}",
        w.context()
    );
    // Quiet for the release time: the breaker closes and web rolls once, to the final content.
    let e = wait_for(&mut w, "breaker-closed").await?;
    assert_eq!(e["how"], "quiet", "{e}");
    wait_until("web stamped for the final content", WAIT, || {
        current(&f, "web")
    })
    .await?;
    assert_ne!(f.stamp("web").await?.as_deref(), Some(first.as_str()));
    let total = restamps_of(&w, "web");
    assert!(
        (1..=2).contains(&total),
        "{total} restamps for 50 writes\n{}",
        w.context()
    );
    assert_eq!(w.events_named("breaker-open").len(), 1, "{}", w.context());
    wait_until(
        "one RolloutBreakerOpen Event on the Secret",
        WAIT,
        || async { Ok(f.events("flap", "RolloutBreakerOpen").await?.len() == 1) },
    )
    .await?;
    wait_until("a RestampBreakerOpen Event on web", WAIT, || async {
        Ok(f.events("web", "RestampBreakerOpen").await?.len() == 1)
    })
    .await?;
    let _ = last;
    Ok(())
}

#[tokio::test]
async fn rollout_resume_releases_an_open_breaker() -> anyhow::Result<()> {
    let f = Fixture::new("rwatch-resume").await?;
    create_secret(&f.client, &f.ns, "flap", &[("v", b"0")]).await?;
    f.apply(&reader("web", "flap", 0)).await?;
    let mut w = f.spawn_watcher(
        &[
            "--no-leader-election",
            "--debounce",
            "250ms",
            "--flap-changes",
            "2",
            "--flap-window",
            "1m",
            "--flap-release",
            "1h",
        ],
        &[],
    )?;
    wait_for(&mut w, "synced").await?;
    for i in 1..=4 {
        f.patch(
            "secret",
            "flap",
            &format!(r#"{{"stringData":{{"v":"{i}"}}}}"#),
        )
        .await?;
    }
    wait_for(&mut w, "breaker-open").await?;
    let held = w
        .wait_event("web held", WAIT, 0, |e| {
            e["event"] == "held" && e["hold"] == "breaker"
        })
        .await?;
    assert!(
        held["note"]
            .as_str()
            .is_some_and(|n| n.contains("rollout --resume secret/flap")),
        "{held}"
    );
    // `check` reports the hold, with the fix (read from the watcher's Events).
    let hold_reported = || async {
        let out = run_plugin(
            &[
                "check",
                "-n",
                &f.ns,
                "--kubeconfig",
                &f.kubeconfig,
                "-o",
                "json",
            ],
            &[],
            WAIT,
        )
        .await?;
        let report: Value = serde_json::from_slice(&out.stdout)
            .with_context(|| String::from_utf8_lossy(&out.stderr).into_owned())?;
        let holds = report["findings"]
            .as_array()
            .and_then(|f| f.iter().find(|f| f["check"] == "rollout-holds").cloned())
            .context("no rollout-holds finding")?;
        Ok::<Value, anyhow::Error>(holds)
    };
    wait_until("check reports web held", WAIT, || async {
        let holds = hold_reported().await?;
        Ok(holds["verdict"] == "warning"
            && holds["message"]
                .as_str()
                .is_some_and(|m| m.contains("/deployment/web (RestampBreakerOpen)"))
            && holds["fix"]
                .as_str()
                .is_some_and(|x| x.contains("rollout --resume")))
    })
    .await?;
    // A dry run releases nothing.
    let out = run_plugin(
        &[
            "rollout",
            "--resume",
            "secret/flap",
            "-n",
            &f.ns,
            "--dry-run",
            "--kubeconfig",
            &f.kubeconfig,
        ],
        &[],
        WAIT,
    )
    .await?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run_plugin(
        &[
            "rollout",
            "--resume",
            "secret/flap",
            "-n",
            &f.ns,
            "--kubeconfig",
            &f.kubeconfig,
        ],
        &[],
        WAIT,
    )
    .await?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("the flap breaker released"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let e = wait_for(&mut w, "breaker-closed").await?;
    assert_eq!(e["how"], "resumed", "{e}");
    assert_eq!(
        w.events_named("breaker-closed").len(),
        1,
        "the dry run released nothing"
    );
    wait_until("web stamped for the final content", WAIT, || {
        current(&f, "web")
    })
    .await?;
    // Restamped since: no longer held.
    wait_until("check reports nothing held", WAIT, || async {
        Ok(hold_reported().await?["verdict"] == "ok")
    })
    .await?;
    // Not found is a clear error.
    let out = run_plugin(
        &[
            "rollout",
            "--resume",
            "secret/nope",
            "-n",
            &f.ns,
            "--kubeconfig",
            &f.kubeconfig,
        ],
        &[],
        WAIT,
    )
    .await?;
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("secret/nope in namespace"));
    Ok(())
}

#[tokio::test]
async fn a_missing_required_key_holds_like_a_missing_object() -> anyhow::Result<()> {
    let f = Fixture::new("rwatch-key").await?;
    create_secret(
        &f.client,
        &f.ns,
        "db",
        &[("password", b"p1"), ("user", b"u")],
    )
    .await?;
    let mut d = deployment(
        "web",
        json!({}),
        json!({"container": {"env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]}}),
    );
    d["spec"]["replicas"] = json!(0);
    f.apply(&d).await?;
    sentinel(&f).await?;
    let first = f.stamp("web").await?.context("web was not stamped")?;
    let mut w = f.ordered_watcher().await?;
    // The key the pods need is removed: new pods could not start, so nothing rolls.
    let skip = w.events().len();
    f.kubectl(
        &[
            "patch",
            "secret",
            "db",
            "--type",
            "json",
            "-p",
            r#"[{"op":"remove","path":"/data/password"}]"#,
        ],
        None,
    )
    .await?;
    let e = w
        .wait_event("web held for the key", WAIT, skip, |e| {
            e["event"] == "held" && e["workload"].as_str().is_some_and(|n| n.ends_with("/web"))
        })
        .await?;
    assert_eq!(e["hold"], "missing", "{e}");
    assert_eq!(e["missing"], json!(["key password of secret/db"]), "{e}");
    barrier(&f, &mut w, "1").await?;
    assert_eq!(restamps_of(&w, "web"), 0, "{}", w.context());
    assert_eq!(f.stamp("web").await?.as_deref(), Some(first.as_str()));
    wait_until("a RestampHeld Event on web", WAIT, || async {
        Ok(f.events("web", "RestampHeld").await?.len() == 1)
    })
    .await?;
    // Back with a new value: one rollout.
    f.patch("secret", "db", r#"{"stringData":{"password":"p2"}}"#)
        .await?;
    w.wait_event("the expected event", WAIT, skip, restamped_for("web"))
        .await?;
    wait_until("web current", WAIT, || current(&f, "web")).await?;
    Ok(())
}

/// Rewrites the Secret `name` (its `v`) every 200 ms, `times` times or until a write fails.
pub(crate) fn flap_secret(
    secrets: Api<k8s_openapi::api::core::v1::Secret>,
    name: &'static str,
    times: u64,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        for i in 1..=times {
            let patch = json!({"stringData": {"v": i.to_string()}});
            if secrets
                .patch(name, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
}

/// Peak resident set size of a process, in KiB (`VmHWM`).
pub(crate) fn peak_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("VmHWM in /proc/PID/status")
}

#[tokio::test]
async fn workloads_that_are_not_opted_in_cost_the_watcher_nothing_whatever_they_read()
-> anyhow::Result<()> {
    let f = Fixture::new("rwatch-mem").await?;
    // A tenant's namespace, not opted in, with 6 Deployments of 20,000 key references each
    // (1.2 MB each, near etcd's limit).
    let tenant = fresh_namespace_with_labels(&f.client, "rwatch-mem-tenant", &[]).await?;
    let empty = fresh_namespace_with_labels(&f.client, "rwatch-mem-empty", &[]).await?;
    let env: Vec<Value> = (0..20_000)
        .map(|i| json!({"name": format!("a{i}"), "valueFrom": {"secretKeyRef": {"name": "s", "key": format!("{i}")}}}))
        .collect();
    let deployments: Api<Deployment> = Api::namespaced(f.client.clone(), &tenant);
    for n in 0..6 {
        let mut d = deployment(
            &format!("big{n}"),
            json!({}),
            json!({"container": {"env": env}}),
        );
        d["spec"]["replicas"] = json!(0);
        deployments
            .create(
                &kube::api::PostParams::default(),
                &serde_json::from_value(d)?,
            )
            .await?;
    }
    let watcher = |ns: &str| f.spawn_scoped(&["-n", ns], &["--no-leader-election"], &[]);
    // The same watcher over an empty namespace, then over the tenant's: listing, then holding them.
    let mut idle = watcher(&empty)?;
    wait_for(&mut idle, "synced").await?;
    let mut busy = watcher(&tenant)?;
    let synced = wait_for(&mut busy, "synced").await?;
    assert_eq!(synced["workloads"], 6, "{synced}");
    // Both settle (every workload decided) before they are measured.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (idle_kib, busy_kib) = (peak_rss_kib(idle.pid())?, peak_rss_kib(busy.pid())?);
    assert!(
        busy_kib < idle_kib + 24 * 1024,
        "peak RSS {} MiB over 6 large workloads not opted in, {} MiB over none",
        busy_kib / 1024,
        idle_kib / 1024
    );
    eprintln!(
        "peak RSS: {} KiB over none, {} KiB over 6 x 20,000 references not opted in",
        idle_kib, busy_kib
    );
    Ok(())
}

#[tokio::test]
async fn a_namespace_opted_in_later_has_its_workloads_read_then() -> anyhow::Result<()> {
    let f = Fixture::new("rwatch-late").await?;
    let first = f.web_reading_settings().await?;
    sentinel(&f).await?;
    // The namespace opts out before the watcher starts: web is not indexed (nothing it reads is
    // kept), only its key.
    f.up.run_kubectl(
        &["label", "ns", &f.ns, "helmop.dev/rollout-on-change-"],
        None,
    )
    .await?;
    let mut w = f.ordered_watcher().await?;
    f.patch("configmap", "settings", r#"{"data":{"mode":"b"}}"#)
        .await?;
    f.up.run_kubectl(
        &["label", "ns", &f.ns, "helmop.dev/rollout-on-change=enabled"],
        None,
    )
    .await?;
    // Opted in again: the watcher reads web whole, finds its stamp behind, restamps it once.
    let e = w
        .wait_event("the expected event", WAIT, 0, restamped_for("web"))
        .await?;
    assert_eq!(
        e["reason"],
        "its namespace's opt-in label changed",
        "{e}\n{}",
        w.context()
    );
    assert_ne!(f.stamp("web").await?.as_deref(), Some(first.as_str()));
    barrier(&f, &mut w, "1").await?;
    assert_eq!(restamps_of(&w, "web"), 1, "{}", w.context());
    Ok(())
}

#[tokio::test]
async fn a_new_watcher_reads_nothing_for_what_a_watcher_restamped_and_nothing_changed_since()
-> anyhow::Result<()> {
    use crate::propagator_service::{addr_of, metric, scrape};
    let f = Fixture::new("rwatch-handover").await?;
    let names: Vec<String> = (0..5).map(|n| format!("w{n}")).collect();
    for name in &names {
        create_secret(&f.client, &f.ns, name, &[("v", b"0")]).await?;
        f.apply(&reader(name, name, 0)).await?;
    }
    let mut first = f.spawn_watcher(&["--no-leader-election", "--debounce", "0s"], &[])?;
    wait_for(&mut first, "synced").await?;
    for name in &names {
        f.patch("secret", name, r#"{"stringData":{"v":"1"}}"#)
            .await?;
    }
    for name in &names {
        first
            .wait_event("the expected event", WAIT, 0, restamped_for(name))
            .await?;
    }
    first.signal(libc::SIGTERM)?;
    first.wait_exit(WAIT).await?;
    // A new process (a restart, a new leader): every workload decided, nothing read.
    let mut second = f.spawn_watcher(
        &["--no-leader-election", "--metrics-addr", "127.0.0.1:0"],
        &[],
    )?;
    let started = wait_for(&mut second, "started").await?;
    let addr = addr_of(&started)?;
    wait_for(&mut second, "synced").await?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()?;
    wait_until("every workload decided", WAIT, || async {
        let m = scrape(&http, &addr).await?;
        Ok(metric(&m, "helmop_rollout_pending") == 0.0
            && metric(&m, "helmop_rollout_workloads") == 5.0)
    })
    .await?;
    let m = scrape(&http, &addr).await?;
    assert_eq!(
        metric(&m, "helmop_rollout_object_reads_total"),
        0.0,
        "{}",
        second.context()
    );
    assert!(second.events_named("restamped").is_empty());
    // A change since is read (once) and restamped.
    f.patch("secret", "w0", r#"{"stringData":{"v":"2"}}"#)
        .await?;
    second
        .wait_event("the expected event", WAIT, 0, restamped_for("w0"))
        .await?;
    let m = scrape(&http, &addr).await?;
    assert_eq!(metric(&m, "helmop_rollout_object_reads_total"), 1.0);
    Ok(())
}

#[tokio::test]
async fn workloads_the_webhook_configuration_leaves_out_are_skipped_with_one_message()
-> anyhow::Result<()> {
    let f = Fixture::new("rwatch-cover").await?;
    // Another opted-in namespace, which the fixture's webhook configuration does not send: a
    // workload there is never stamped (as kube-system's under the shipped configuration).
    let other = fresh_namespace_with_labels(
        &f.client,
        "rwatch-cover-other",
        &[("helmop.dev/rollout-on-change", "enabled")],
    )
    .await?;
    let tag = f.ns.clone();
    for ns in [&f.ns, &other] {
        create_secret(&f.client, ns, "db", &[("v", b"0")]).await?;
        let mut d = reader("web", "db", 0);
        d["metadata"]["labels"]["helmop-tests/cover"] = json!(tag);
        f.up.run_kubectl(&["apply", "-n", ns, "-f", "-"], Some(&d.to_string()))
            .await?;
    }
    let selector = format!("helmop-tests/cover={tag}");
    let configuration = format!("{}-stamp", f.ns);
    let mut w = f.spawn_scoped(
        &["-A", "-l", &selector],
        &[
            "--no-leader-election",
            "--debounce",
            "0s",
            "--webhook-configuration",
            &configuration,
        ],
        &[],
    )?;
    wait_for(&mut w, "synced").await?;
    let e = wait_for(&mut w, "excluded").await?;
    assert_eq!(e["namespace"], other.as_str(), "{e}");
    for ns in [&f.ns, &other] {
        f.up.run_kubectl(
            &[
                "patch",
                "secret",
                "db",
                "-n",
                ns,
                "--type",
                "merge",
                "-p",
                r#"{"stringData":{"v":"1"}}"#,
            ],
            None,
        )
        .await?;
    }
    w.wait_event("the expected event", WAIT, 0, |e| {
        e["event"] == "restamped"
            && e["workload"]
                .as_str()
                .is_some_and(|n| n.starts_with(&format!("{}/", f.ns)))
    })
    .await?;
    // The other namespace's change was decided too (one watch, in order): never restamped.
    let restamp = Api::<Deployment>::namespaced(f.client.clone(), &other)
        .get("web")
        .await?
        .metadata
        .annotations
        .and_then(|a| a.get(RESTAMP).cloned());
    assert_eq!(restamp, None, "{}", w.context());
    assert!(w.events_named("ineffective").is_empty(), "{}", w.context());
    assert_eq!(w.events_named("excluded").len(), 1, "{}", w.context());
    Ok(())
}

#[tokio::test]
async fn a_tenant_flapping_a_secret_read_by_300_cron_jobs_does_not_delay_another_namespace()
-> anyhow::Result<()> {
    let f = Fixture::new("rwatch-fair").await?;
    let tenant = fresh_namespace_with_labels(
        &f.client,
        "rwatch-fair-tenant",
        &[("helmop.dev/rollout-on-change", "enabled")],
    )
    .await?;
    WebhookRegistration::new(
        WebhookKind::Mutating,
        &format!("{tenant}-stamp"),
        &format!("{}/mutate/workloads", f._webhook.url),
        &f._webhook.ca_pem,
    )
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "batch",
        "v1beta1",
        &["cronjobs"],
    ))
    .only_namespace(&tenant)
    .register(&f.client)
    .await?;
    let tag = f.ns.clone();
    let labelled = |mut d: Value| {
        d["metadata"]["labels"]["helmop-tests/fair"] = json!(tag);
        d
    };
    create_secret(&f.client, &tenant, "flap", &[("v", b"0")]).await?;
    // The tenant's readers are suspended CronJobs: each restamp is a PATCH and an admission like a
    // Deployment's, but creates no ReplicaSet, so the test loads the watcher and the API server, not
    // the controller-manager every other test shares.
    let cron_job = |name: String| {
        labelled(json!({
            "apiVersion": "batch/v1beta1", "kind": "CronJob", "metadata": {"name": name, "labels": {}},
            "spec": {"schedule": "0 0 1 1 *", "suspend": true, "jobTemplate": {"spec": {"template": {
                "spec": {"restartPolicy": "Never", "containers": [{"name": "app",
                    "image": "registry.example.com/app:1.0",
                    "envFrom": [{"secretRef": {"name": "flap"}}]}]}}}}}
        }))
    };
    let items: Vec<Value> = (0..300).map(|n| cron_job(format!("t{n:03}"))).collect();
    let list = json!({"apiVersion": "v1", "kind": "List", "items": items});
    let out =
        f.up.run_kubectl(
            &["apply", "-n", &tenant, "-f", "-"],
            Some(&list.to_string()),
        )
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    create_secret(&f.client, &f.ns, "mine", &[("v", b"0")]).await?;
    f.apply(&labelled(reader("mine", "mine", 0))).await?;
    // The shipped brakes but the breaker, which would stop the tenant at once: the budget's share
    // and the namespaces' turns are what keep the other namespace moving.
    let selector = format!("helmop-tests/fair={tag}");
    let mut w = f.spawn_scoped(
        &["-A", "-l", &selector],
        &[
            "--no-leader-election",
            "--flap-changes",
            "0",
            "--min-roll-interval",
            "0s",
            "--webhook-configuration",
            "",
        ],
        &[],
    )?;
    wait_for(&mut w, "synced").await?;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(f.client.clone(), &tenant);
    // Every 200 ms for 30 s.
    let flapping = flap_secret(secrets.clone(), "flap", 150);
    // Meanwhile, the other namespace changes its own Secret 10 times, each timed to its restamp.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut lags = Vec::new();
    for i in 1..=10 {
        let skip = w.events().len();
        let start = tokio::time::Instant::now();
        f.patch(
            "secret",
            "mine",
            &format!(r#"{{"stringData":{{"v":"{i}"}}}}"#),
        )
        .await?;
        w.wait_event("the expected event", WAIT, skip, restamped_for("mine"))
            .await?;
        lags.push(start.elapsed());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    flapping.abort();
    lags.sort();
    let p50 = lags[lags.len() / 2];
    let tenant_restamps = w
        .events_named("restamped")
        .iter()
        .filter(|e| {
            e["workload"]
                .as_str()
                .is_some_and(|n| n.starts_with(&format!("{tenant}/")))
        })
        .count();
    let counts: std::collections::BTreeMap<String, usize> =
        w.events().iter().fold(Default::default(), |mut m, e| {
            *m.entry(e["event"].as_str().unwrap_or("?").to_owned())
                .or_default() += 1;
            m
        });
    eprintln!(
        "other namespace change -> restamp p50 {p50:?} ({lags:?}); tenant restamps {tenant_restamps}; events {counts:?}"
    );
    assert!(
        p50 < Duration::from_secs(2),
        "the other namespace waited behind the tenant: p50 {p50:?} {lags:?}"
    );
    assert!(
        tenant_restamps > 0,
        "the tenant's readers roll too, within their share"
    );
    Ok(())
}
