//! The main job end to end on a real node: helmop installed from its shipped
//! manifests and images on a cluster with a kubelet/containerd node, driven through `kubectl` the way
//! users drive it; the Rust client only polls and asserts.
//!
//! - `a_changed_key_rolls_new_pods_that_log_it_and_an_unread_key_rolls_nothing`: an opted-in
//!   Deployment of busybox pods printing one ConfigMap key; changing that key and re-applying gives
//!   new pods logging the new value; changing a key it does not read replaces no pod.
//! - `latest_is_pinned_and_the_node_runs_the_pushed_digest`: an image pushed under `:latest` to the
//!   node's registry is pinned by the webhook pods, pulled by containerd, and the container's
//!   `imageID` is the pushed digest.
//! - `the_propagator_deployment_propagates_and_survives_losing_its_leader`: the propagator Deployment
//!   (2 replicas, leader election) copies a changed Secret to a downstream cluster whose reader
//!   workload rolls; both pods serve /livez, /readyz and /metrics (leadership, runs, copies) through
//!   the API server's pod proxy; a Conflict, an unreachable Cluster and a deleted source each become a
//!   Warning Event on their HelmOp; deleting the leader pod hands the Lease to the other replica
//!   and a later change still propagates.
//! - `the_rollout_watcher_deployment_rolls_workloads_whose_config_map_or_secret_changes`: the rollout
//!   watcher Deployment (manifests/rollout-watcher, 2 replicas, leader election) rolls an opted-in
//!   Deployment nobody touches when its ConfigMap is patched in place and when its Secret is deleted
//!   and created again with another value: new ReplicaSets, new pods printing the new values; it is
//!   Ready with one Lease holder and leaves a Restamped Event on the Deployment; then it is removed
//!   with `kubectl delete -k`.
//!
//! Every wait has a deadline; a failure carries `kubectl get/describe/logs` and the events of what
//! it waited for.

use std::collections::BTreeSet;
use std::process::{Output, Stdio};
use std::time::Duration;

use anyhow::{Context, bail, ensure};
use helmop_tests::*;
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{ListParams, LogParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::node_env::{NodeEnv, node_env};

/// Pods start in seconds, but an image pull plus a rolling update on a loaded 2-core machine can take
/// a minute.
const ROLL: Duration = Duration::from_secs(180);
const OPT_IN: &str = "helmop.dev/rollout-on-change";
const CONFIG_HASH: &str = "helmop.dev/config-hash";

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `kubectl ARGS` on `cluster`, failing with kubectl's stderr when it fails.
async fn kubectl(
    cluster: &ClusterInfo,
    args: &[&str],
    stdin: Option<&str>,
) -> anyhow::Result<String> {
    let out = cluster.run_kubectl(args, stdin).await?;
    ok_or_stderr(&format!("kubectl {}", args.join(" ")), out)
}

fn ok_or_stderr(what: &str, out: Output) -> anyhow::Result<String> {
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            text(&out.stderr).trim()
        );
    }
    Ok(text(&out.stdout))
}

/// `kubectl apply -f -` of one object.
async fn apply(cluster: &ClusterInfo, object: &Value) -> anyhow::Result<String> {
    let out = kubectl_apply(cluster, object, &[]).await?;
    ok_or_stderr("kubectl apply", out)
}

/// `kubectl helmop ARGS` on `cluster`: the plugin found by kubectl on PATH, as users run it.
async fn kubectl_helmop(cluster: &ClusterInfo, args: &[&str]) -> anyhow::Result<Output> {
    let plugin = plugin_binary()?;
    let dir = plugin
        .parent()
        .context("the plugin binary has no parent directory")?;
    let path = match std::env::var_os("PATH") {
        Some(p) => {
            let mut dirs = vec![dir.to_path_buf()];
            dirs.extend(std::env::split_paths(&p));
            std::env::join_paths(dirs)?
        }
        None => dir.as_os_str().to_owned(),
    };
    // kubectl refuses flags before a plugin's name, so --kubeconfig goes to the plugin.
    let mut cmd = tokio::process::Command::new("kubectl");
    cmd.arg("helmop")
        .args(args)
        .arg("--kubeconfig")
        .arg(&cluster.kubeconfig)
        .env("PATH", path)
        .stdin(Stdio::null())
        .kill_on_drop(true);
    tokio::time::timeout(Duration::from_secs(90), cmd.output())
        .await
        .with_context(|| format!("kubectl helmop {args:?} did not finish in 90s"))?
        .context("running kubectl helmop")
}

/// `kubectl helmop rollout TARGET -n NS`, which must succeed.
async fn rollout(cluster: &ClusterInfo, ns: &str, target: &str) -> anyhow::Result<()> {
    let out = kubectl_helmop(cluster, &["rollout", target, "-n", ns]).await?;
    if !out.status.success() {
        bail!(
            "kubectl helmop rollout {target} -n {ns} failed ({}): {}{}",
            out.status,
            text(&out.stdout),
            text(&out.stderr)
        );
    }
    Ok(())
}

/// What a user would look at when a wait on pods fails: the pods, their description (events
/// included), their logs and the namespace's events.
async fn diagnostics(cluster: &ClusterInfo, ns: &str, selector: &str) -> String {
    let mut report = String::new();
    for args in [
        vec!["get", "deploy,rs,pods", "-n", ns, "-o", "wide"],
        vec!["describe", "pods", "-n", ns, "-l", selector],
        vec![
            "logs",
            "-n",
            ns,
            "-l",
            selector,
            "--all-containers",
            "--prefix",
            "--tail=40",
        ],
        vec!["get", "events", "-n", ns, "--sort-by=.lastTimestamp"],
    ] {
        report.push_str(&format!("\n--- kubectl {}\n", args.join(" ")));
        match cluster.run_kubectl(&args, None).await {
            Ok(out) => {
                report.push_str(&text(&out.stdout));
                report.push_str(&text(&out.stderr));
            }
            Err(e) => report.push_str(&format!("(failed: {e:#})\n")),
        }
    }
    report
}

/// `result`, with [`diagnostics`] attached when it is an error. The error's own chain leads, so the
/// first lines of a truncated CI log still say what failed.
async fn explained<T>(
    result: anyhow::Result<T>,
    cluster: &ClusterInfo,
    ns: &str,
    selector: &str,
) -> anyhow::Result<T> {
    match result {
        Ok(v) => Ok(v),
        Err(e) => {
            let report = diagnostics(cluster, ns, selector).await;
            Err(anyhow::anyhow!("{e:#}\n{report}"))
        }
    }
}

/// Pods of `app=<app>` that are not being deleted.
async fn live_pods(client: &Client, ns: &str, app: &str) -> anyhow::Result<Vec<Pod>> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

fn uid(p: &Pod) -> String {
    p.metadata.uid.clone().unwrap_or_default()
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn pod_log(client: &Client, ns: &str, pod: &Pod) -> anyhow::Result<String> {
    let name = pod.metadata.name.as_deref().unwrap_or_default();
    Api::<Pod>::namespaced(client.clone(), ns)
        .logs(name, &LogParams::default())
        .await
        .with_context(|| format!("reading the log of pod {ns}/{name}"))
}

/// Waits until every live pod of `app` is ready, none is one of `old`, there are `replicas` of
/// them, and each has logged `line`; returns their uids.
async fn wait_pods_logging(
    cluster: &ClusterInfo,
    ns: &str,
    app: &str,
    replicas: usize,
    old: &BTreeSet<String>,
    line: &str,
) -> anyhow::Result<BTreeSet<String>> {
    let client = cluster.client().await;
    let waited = wait_for(
        &format!("{replicas} new ready pod(s) of {ns}/{app} logging {line:?}"),
        ROLL,
        || async {
            let pods = live_pods(&client, ns, app).await?;
            if pods.len() != replicas || pods.iter().any(|p| old.contains(&uid(p)) || !is_ready(p))
            {
                return Ok(None);
            }
            for p in &pods {
                if !pod_log(&client, ns, p).await?.lines().any(|l| l == line) {
                    return Ok(None);
                }
            }
            Ok(Some(pods.iter().map(uid).collect::<BTreeSet<_>>()))
        },
    )
    .await;
    explained(waited, cluster, ns, &format!("app={app}")).await
}

async fn replica_set_names(
    client: &Client,
    ns: &str,
    app: &str,
) -> anyhow::Result<BTreeSet<String>> {
    Ok(Api::<ReplicaSet>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(&format!("app={app}")))
        .await?
        .items
        .into_iter()
        .filter_map(|rs| rs.metadata.name)
        .collect())
}

/// The busybox Deployment `name`, opted in by its own label, printing `GREETING=<value of the
/// ConfigMap key>` once and then idling.
fn greeter(env: &NodeEnv, ns: &str, name: &str, config_map: &str, key: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": {OPT_IN: "true"}},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    // The shell ignores SIGTERM as PID 1: do not wait 30 s for each old pod.
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "app",
                        "image": env.busybox,
                        "command": env.shell(&["echo \"GREETING=$GREETING\"; exec sleep 3600"]),
                        "env": [{"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": config_map, "key": key}}}],
                    }],
                },
            },
        },
    })
}

fn config_map(ns: &str, name: &str, data: &[(&str, &str)]) -> Value {
    let data: serde_json::Map<String, Value> = data
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": data})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_key_rolls_new_pods_that_log_it_and_an_unread_key_rolls_nothing()
-> anyhow::Result<()> {
    let env = node_env().await?;
    let up = env.cluster();
    let client = up.client().await;
    let ns = fresh_namespace(&client, "nf-roll").await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);

    apply(
        up,
        &config_map(&ns, "settings", &[("greeting", "hello-1"), ("unread", "a")]),
    )
    .await?;
    let manifest = greeter(env, &ns, "web", "settings", "greeting");
    apply(up, &manifest).await?;
    let stamped = deployments.get("web").await?;
    let first_stamp = template_annotation(&stamped, CONFIG_HASH)
        .context("the webhook pods stamped the opted-in Deployment at creation")?;
    let first = wait_pods_logging(up, &ns, "web", 1, &BTreeSet::new(), "GREETING=hello-1").await?;

    // The key the pods read changes: `kubectl helmop rollout` restamps, and the Deployment rolls.
    // (A client-side `kubectl apply` of the unchanged manifest sends nothing, so it cannot.)
    apply(
        up,
        &config_map(&ns, "settings", &[("greeting", "hello-2"), ("unread", "a")]),
    )
    .await?;
    rollout(up, &ns, "deployment/web").await?;
    let rolled = deployments.get("web").await?;
    let second_stamp =
        template_annotation(&rolled, CONFIG_HASH).context("stamp after the rollout")?;
    assert_ne!(first_stamp, second_stamp, "a changed key changes the stamp");
    let second = wait_pods_logging(up, &ns, "web", 1, &first, "GREETING=hello-2").await?;
    let sets = replica_set_names(&client, &ns, "web").await?;
    assert_eq!(sets.len(), 2, "one ReplicaSet per stamp: {sets:?}");

    // A key nobody reads changes: the restamp leaves the stamp, so the pod template and the
    // ReplicaSets and pods stay.
    apply(
        up,
        &config_map(&ns, "settings", &[("greeting", "hello-2"), ("unread", "b")]),
    )
    .await?;
    rollout(up, &ns, "deployment/web").await?;
    let after = deployments.get("web").await?;
    assert_eq!(
        template_annotation(&after, CONFIG_HASH).as_deref(),
        Some(second_stamp.as_str()),
        "an unread key leaves the stamp"
    );
    // Once the controller has seen the latest spec, had it anything to roll it would have.
    let observed = wait_until("the Deployment controller to observe web", ROLL, || async {
        let d = deployments.get("web").await?;
        let status = d.status.unwrap_or_default();
        Ok(status.observed_generation == d.metadata.generation
            && status.updated_replicas == Some(1)
            && status.ready_replicas == Some(1))
    })
    .await;
    explained(observed, up, &ns, "app=web").await?;
    assert_eq!(
        replica_set_names(&client, &ns, "web").await?,
        sets,
        "no new ReplicaSet"
    );
    let pods: BTreeSet<String> = live_pods(&client, &ns, "web")
        .await?
        .iter()
        .map(uid)
        .collect();
    assert_eq!(pods, second, "no pod replaced");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latest_is_pinned_and_the_node_runs_the_pushed_digest() -> anyhow::Result<()> {
    let env = node_env().await?;
    let up = env.cluster();
    let client = up.client().await;
    let ns = fresh_namespace(&client, "nf-pin").await?;
    let repo = format!("{}/nf-pin-{}", env.registry, &ns[ns.len() - 10..]);
    let latest = format!("{repo}:latest");
    let digest = env.push_variant(&latest, &ns).await?;

    let mut manifest = greeter(env, &ns, "pinned", "settings", "greeting");
    manifest["spec"]["template"]["spec"]["containers"][0]["image"] = json!(latest);
    apply(up, &config_map(&ns, "settings", &[("greeting", "pinned")])).await?;
    apply(up, &manifest).await?;
    assert_eq!(
        pinned_image(&client, &ns, "pinned").await?,
        format!("{latest}@{digest}"),
        "the webhook pinned the pushed digest"
    );

    let first =
        wait_pods_logging(up, &ns, "pinned", 1, &BTreeSet::new(), "GREETING=pinned").await?;
    assert_runs(&client, &ns, "pinned", &digest).await?;

    // The CI recipe of the README: push again under the same tag and re-apply the unchanged
    // manifest (it names the bare tag, the live object the pinned one, so kubectl sends it): the
    // webhook pins the new digest and the node runs it.
    let second = env.push_variant(&latest, &format!("{ns}-again")).await?;
    assert_ne!(second, digest, "the second push is another image");
    // The webhook caches a digest for 3 s (README, "Image digests"): a re-apply within 3 s of the
    // first resolution may still get the old one, so re-apply until the new pin shows.
    let want = format!("{latest}@{second}");
    let said = std::sync::Mutex::new(String::new());
    let repinned = wait_until(
        "a re-apply to pin the second push",
        Duration::from_secs(30),
        || {
            let (manifest, want, client, ns) = (&manifest, &want, &client, &ns);
            let said = &said;
            async move {
                let out = kubectl_apply(up, manifest, &[]).await?;
                let answer = format!("{}{}", text(&out.stdout), text(&out.stderr));
                if !out.status.success() {
                    bail!("kubectl apply: {answer}");
                }
                if let Ok(mut last) = said.lock() {
                    *last = answer;
                }
                Ok(pinned_image(client, ns, "pinned").await? == *want)
            }
        },
    )
    .await;
    if let Err(e) = repinned {
        let said = said.lock().map(|s| s.clone()).unwrap_or_default();
        bail!("{e:#}; kubectl said: {said}");
    }
    wait_pods_logging(up, &ns, "pinned", 1, &first, "GREETING=pinned").await?;
    assert_runs(&client, &ns, "pinned", &second).await?;
    Ok(())
}

/// The image of the first container of Deployment `name`.
async fn pinned_image(client: &Client, ns: &str, name: &str) -> anyhow::Result<String> {
    let d = Api::<Deployment>::namespaced(client.clone(), ns)
        .get(name)
        .await?;
    Ok(d.spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default())
}

/// Asserts that the one live pod of `app` runs the image with `digest`, as containerd reports it.
async fn assert_runs(client: &Client, ns: &str, app: &str, digest: &str) -> anyhow::Result<()> {
    let pods = live_pods(client, ns, app).await?;
    let image_ids: Vec<String> = pods
        .iter()
        .flat_map(|p| {
            p.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
        })
        .map(|c| c.image_id.clone())
        .collect();
    assert_eq!(image_ids.len(), 1, "one container runs: {image_ids:?}");
    assert!(
        image_ids[0].ends_with(&format!("@{digest}")),
        "containerd runs {} but {digest} was pushed",
        image_ids[0]
    );
    Ok(())
}

/// Source Secret `ns/name` upstream with one `key=value`, created the way a user would.
async fn create_source(
    up: &ClusterInfo,
    ns: &str,
    name: &str,
    literal: &str,
) -> anyhow::Result<()> {
    let literal = format!("--from-literal={literal}");
    kubectl(
        up,
        &["create", "secret", "generic", name, "-n", ns, &literal],
        None,
    )
    .await
    .map(drop)
}

/// Fleet Cluster `ns/name` reached with `kubeconfig` (stored in Secret `<name>-kubeconfig`).
fn fleet_cluster(ns: &str, name: &str, kubeconfig: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "List",
        "items": [
            {
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("{name}-kubeconfig"), "namespace": ns},
                "stringData": {"value": kubeconfig},
            },
            {
                "apiVersion": FLEET_API_VERSION, "kind": "Cluster",
                "metadata": {"name": name, "namespace": ns, "labels": {"env": "node-flows"}},
                "spec": {"kubeConfigSecret": format!("{name}-kubeconfig")},
            },
        ],
    })
}

/// Changes the source Secret `ns/db` upstream, as a user would.
async fn set_password(up: &ClusterInfo, ns: &str, value: &str) -> anyhow::Result<()> {
    let patch = json!({"stringData": {"password": value}}).to_string();
    kubectl(up, &["patch", "secret", "db", "-n", ns, "-p", &patch], None)
        .await
        .map(drop)
}

/// HelmOp `ns/name` copying Secret `secret` into `dest` on the Fleet Cluster `cluster`.
fn copying_helmop(ns: &str, name: &str, dest: &str, secret: &str, cluster: &str) -> Value {
    json!({
        "apiVersion": FLEET_API_VERSION, "kind": "HelmOp",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "helm": {"repo": "https://charts.example.com", "chart": name, "version": "1.0.0"},
            "defaultNamespace": dest,
            "downstreamResources": [{"kind": "Secret", "name": secret}],
            "targets": [{"clusterName": cluster}],
        },
    })
}

/// `GET PATH` of a propagator pod's metrics port, through the API server's pod proxy.
async fn pod_proxy_get(cluster: &ClusterInfo, pod: &str, path: &str) -> anyhow::Result<String> {
    let raw = format!("/api/v1/namespaces/{LEASE_NAMESPACE}/pods/{pod}:8080/proxy/{path}");
    kubectl(cluster, &["get", "--raw", &raw], None).await
}

/// The propagator's Lease.
const LEASE_NAMESPACE: &str = "helmop-system";
const LEASE_NAME: &str = "kubectl-helmop-propagate";
const PROPAGATOR: &str = "app.kubernetes.io/name=helmop-propagator";

/// The holder of Lease `helmop-system/<lease>`.
async fn lease_holder(client: &Client, lease: &str) -> anyhow::Result<Option<String>> {
    Ok(Api::<Lease>::namespaced(client.clone(), LEASE_NAMESPACE)
        .get_opt(lease)
        .await?
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
        .filter(|h| !h.is_empty()))
}

/// The pod whose name starts the holder identity (`<pod name>_<suffix>`).
fn holder_pod(holder: &str) -> &str {
    holder.rsplit_once('_').map_or(holder, |(pod, _)| pod)
}

/// The live pods in helmop-system matching `selector`.
async fn system_pods(client: &Client, selector: &str) -> anyhow::Result<Vec<Pod>> {
    let pods = Api::<Pod>::namespaced(client.clone(), LEASE_NAMESPACE)
        .list(&ListParams::default().labels(selector))
        .await?;
    Ok(pods
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .collect())
}

/// Waits until two ready live pods in helmop-system match `selector` and one of them holds Lease
/// `helmop-system/<lease>`; returns the holder identity and the pod names.
async fn two_ready_and_a_leader(
    up: &ClusterInfo,
    selector: &str,
    lease: &str,
) -> anyhow::Result<(String, Vec<String>)> {
    let client = up.client().await;
    let both = wait_for(
        &format!("two ready pods of {selector} and a holder of Lease {lease}"),
        ROLL,
        || async {
            let pods = system_pods(&client, selector).await?;
            let Some(holder) = lease_holder(&client, lease).await? else {
                return Ok(None);
            };
            if pods.len() != 2 || !pods.iter().all(is_ready) {
                return Ok(None);
            }
            let names: Vec<String> = pods
                .iter()
                .filter_map(|p| p.metadata.name.clone())
                .collect();
            Ok(names
                .iter()
                .any(|n| n == holder_pod(&holder))
                .then_some((holder, names)))
        },
    )
    .await;
    explained(both, up, LEASE_NAMESPACE, selector).await
}

/// The reader's stamp, and whether a ReplicaSet with that stamp exists.
async fn reader_rollout(down: &Client, ns: &str) -> anyhow::Result<(Option<String>, bool)> {
    let Some(d) = Api::<Deployment>::namespaced(down.clone(), ns)
        .get_opt("reader")
        .await?
    else {
        return Ok((None, false));
    };
    let stamp = template_annotation(&d, CONFIG_HASH);
    let rolled = stamp.is_some()
        && reader_set_stamps(down, ns)
            .await?
            .iter()
            .any(|(_, set_stamp)| *set_stamp == stamp);
    Ok((stamp, rolled))
}

/// The config-hash stamp of each reader ReplicaSet's pod template, by ReplicaSet name.
async fn reader_set_stamps(
    down: &Client,
    ns: &str,
) -> anyhow::Result<Vec<(String, Option<String>)>> {
    let sets = Api::<ReplicaSet>::namespaced(down.clone(), ns)
        .list(&ListParams::default().labels("app=reader"))
        .await?;
    Ok(sets
        .items
        .iter()
        .map(|rs| {
            let stamp = rs
                .spec
                .template
                .as_ref()
                .and_then(|t| t.metadata.as_ref())
                .and_then(|m| m.annotations.as_ref())
                .and_then(|a| a.get(CONFIG_HASH))
                .cloned();
            (rs.metadata.name.clone().unwrap_or_default(), stamp)
        })
        .collect())
}

/// Waits until the copy of `db` on `down` reads `value` and the reader has rolled from stamp
/// `before` to another one (a new ReplicaSet); returns that stamp. Shows the propagator pods' state
/// on failure.
async fn wait_propagated(
    up: &ClusterInfo,
    down: &ClusterInfo,
    dest: &str,
    value: &str,
    before: Option<String>,
) -> anyhow::Result<Option<String>> {
    let client = down.client().await;
    let waited = wait_for(
        &format!(
            "the copy of db on {} to read {value:?} and the reader to roll",
            down.name
        ),
        ROLL,
        || async {
            if copy_value(&client, dest).await?.as_deref() != Some(value) {
                return Ok(None);
            }
            let (now, rolled) = reader_rollout(&client, dest).await?;
            Ok((rolled && now != before).then_some(now))
        },
    )
    .await;
    // What the wait last saw downstream, so a timeout says which half (copy or roll) is missing.
    let waited = match waited {
        Ok(v) => Ok(v),
        Err(e) => {
            let copy = copy_value(&client, dest).await;
            let rollout = reader_rollout(&client, dest).await;
            let stamps = reader_set_stamps(&client, dest).await;
            Err(e.context(format!(
                "downstream: copy of db reads {copy:?}; reader stamp and rolled {rollout:?} \
                 (before: {before:?}); reader ReplicaSets' stamps {stamps:?}"
            )))
        }
    };
    explained(waited, up, LEASE_NAMESPACE, PROPAGATOR).await
}

/// The copy of Secret `db` on the downstream cluster, as text.
async fn copy_value(down: &Client, ns: &str) -> anyhow::Result<Option<String>> {
    let secret = Api::<Secret>::namespaced(down.clone(), ns)
        .get_opt("db")
        .await?;
    Ok(secret
        .and_then(|s| s.data)
        .and_then(|d| d.get("password").cloned())
        .map(|b| text(&b.0)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_propagator_deployment_propagates_and_survives_losing_its_leader() -> anyhow::Result<()>
{
    use helmop_webhook::state::{Config, ImageMode};

    let env = node_env().await?;
    let up = env.cluster();
    let down = env.downstream();
    let client = up.client().await;
    let down_client = down.client().await;

    // The Fleet workspace, labelled as the install docs say, and the source.
    let ns = fresh_namespace_with_labels(
        &client,
        "nf-prop",
        &[(helmop_core::names::LABEL_GUARD, "enabled")],
    )
    .await?;
    create_source(up, &ns, "db", "password=one").await?;

    // Downstream: the destination namespace opts its workloads in; its stamping webhook runs as a
    // host process registered by URL (down has no node to run the webhook's pods on).
    let dest =
        fresh_namespace_with_labels(&down_client, "nf-prop-dest", &[(OPT_IN, "enabled")]).await?;
    let key: Vec<u8> = random_key()?;
    create_secret(&down_client, &dest, "hash-key", &[("key", &key)]).await?;
    let config = Config {
        hash_key_secret: hash_key_in(&dest),
        image_mode: ImageMode::Off,
        ..Config::default()
    };
    let hook = LocalWebhook::start(down_client.clone(), config).await?;
    let hook_name = format!("{dest}-workloads");
    WebhookRegistration::new(
        WebhookKind::Mutating,
        &hook_name,
        &format!("{}/mutate/workloads", hook.url),
        &hook.ca_pem,
    )
    .rule(WebhookRule::new(
        &["CREATE", "UPDATE"],
        "apps",
        "v1",
        &["deployments", "replicasets"],
    ))
    .only_namespace(&dest)
    .register(&down_client)
    .await?;
    let reader = deployment_manifest(
        &dest,
        "reader",
        json!({}),
        json!({"env": [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password", "optional": true}}}]}),
    );
    apply(down, &reader).await?;

    // The Fleet Cluster. The node control plane's API servers listen on the pod bridge, so the
    // downstream kubeconfig's server is one the propagator's pods reach as it is.
    let down_kubeconfig = std::fs::read_to_string(&down.kubeconfig)
        .with_context(|| format!("reading {}", down.kubeconfig.display()))?;
    apply(up, &fleet_cluster(&ns, "down", &down_kubeconfig)).await?;
    apply(up, &copying_helmop(&ns, "app", &dest, "db", "down")).await?;

    // A second HelmOp whose copy would land on a Secret helmop does not own: a Conflict, which the
    // leader reports as a Warning Event on that HelmOp.
    create_source(up, &ns, "clash", "token=upstream").await?;
    create_secret(
        &down_client,
        &dest,
        "clash",
        &[("token", b"someone else's")],
    )
    .await?;
    apply(up, &copying_helmop(&ns, "clash", &dest, "clash", "down")).await?;

    // The other two problems users must act on, each a Warning Event on its HelmOp: a Cluster that
    // cannot be reached (its kubeconfig names a host port nothing listens on), and a source that
    // goes away (in a namespace the delete guard does not watch, so deleting it is allowed).
    let dead_server = format!("https://{}:1", env.host_address()?);
    let dead_kubeconfig = down_kubeconfig.replace(&down.server, &dead_server);
    ensure!(
        dead_kubeconfig != down_kubeconfig,
        "{} does not name {}",
        down.kubeconfig.display(),
        down.server
    );
    apply(up, &fleet_cluster(&ns, "dead", &dead_kubeconfig)).await?;
    apply(up, &copying_helmop(&ns, "far", &dest, "db", "dead")).await?;
    let unguarded = fresh_namespace(&client, "nf-prop-unguarded").await?;
    apply(up, &fleet_cluster(&unguarded, "down", &down_kubeconfig)).await?;
    create_source(up, &unguarded, "ephemeral", "token=soon-gone").await?;
    apply(
        up,
        &copying_helmop(&unguarded, "ephemeral", &dest, "ephemeral", "down"),
    )
    .await?;

    let (unset, _) = reader_rollout(&down_client, &dest).await?;
    env.install_propagator().await?;
    let one = wait_propagated(up, down, &dest, "one", unset).await?;

    // A change of the source reaches the copy and rolls the reader (a new ReplicaSet downstream).
    set_password(up, &ns, "two").await?;
    let two = wait_propagated(up, down, &dest, "two", one).await?;

    // Both replicas run; one holds the Lease. Deleting it hands over to the other one.
    let (holder, names) = two_ready_and_a_leader(up, PROPAGATOR, LEASE_NAME).await?;
    let leader = holder_pod(&holder).to_owned();
    let standby = names
        .iter()
        .find(|n| **n != leader)
        .cloned()
        .context("no standby propagator pod")?;
    // The propagator as an in-cluster service, read through the API server's pod proxy the way a
    // user or Prometheus would: both pods answer their probe paths; the leader's /metrics say it
    // leads and what its runs did, the standby's that it does not.
    for (pod, leading) in [(leader.as_str(), true), (standby.as_str(), false)] {
        let scraped = wait_for(&format!("/metrics of {pod}"), ROLL, || async {
            for probe in ["livez", "readyz"] {
                pod_proxy_get(up, pod, probe).await?;
            }
            let metrics = pod_proxy_get(up, pod, "metrics").await?;
            let want = format!("helmop_propagator_leader {}", u8::from(leading));
            Ok(metrics.lines().any(|l| l == want).then_some(metrics))
        })
        .await;
        let metrics = explained(scraped, up, LEASE_NAMESPACE, PROPAGATOR).await?;
        let has = |prefix: &str| metrics.lines().any(|l| l.starts_with(prefix));
        if leading {
            assert!(
                has("helmop_propagator_last_success_timestamp_seconds{")
                    && has("helmop_propagator_copies{")
                    && has("helmop_propagator_runs_total{"),
                "the leader's /metrics miss its runs:\n{metrics}"
            );
        } else {
            assert!(
                !has("helmop_propagator_runs_total{"),
                "a standby that never ran reports runs:\n{metrics}"
            );
        }
    }
    kubectl(
        up,
        &["delete", "secret", "ephemeral", "-n", &unguarded],
        None,
    )
    .await?;
    for (helmop_ns, helmop, reason) in [
        (&ns, "clash", "Conflict"),
        (&ns, "far", "ClusterUnreachable"),
        (&unguarded, "ephemeral", "SourceMissing"),
    ] {
        let event = wait_for(
            &format!("a {reason} Event on HelmOp {helmop_ns}/{helmop}"),
            ROLL,
            || async {
                Ok(propagator_events(&client, helmop_ns, helmop)
                    .await?
                    .into_iter()
                    .find(|e| e.reason.as_deref() == Some(reason)))
            },
        )
        .await;
        let event = explained(event, up, LEASE_NAMESPACE, PROPAGATOR).await?;
        assert_eq!(event.type_.as_deref(), Some("Warning"), "{event:?}");
        assert_eq!(
            event.regarding.as_ref().and_then(|r| r.kind.as_deref()),
            Some("HelmOp"),
            "{event:?}"
        );
        for value in ["someone else's", "soon-gone"] {
            assert!(
                !event.note.as_deref().unwrap_or_default().contains(value),
                "a Secret value in an Event: {event:?}"
            );
        }
    }

    // Cordoned, the node cannot start the leader's replacement, so only the standby can take the
    // released Lease (otherwise the replacement may win the race for it); as in `kubectl drain`.
    let node = env.node_name()?;
    kubectl(up, &["cordon", node], None).await?;
    let deleted = kubectl(
        up,
        &[
            "delete",
            "pod",
            "-n",
            LEASE_NAMESPACE,
            &leader,
            "--wait=false",
        ],
        None,
    )
    .await;
    let handed = match deleted {
        Ok(_) => {
            wait_until(
                &format!("the Lease to pass from {leader} to {standby}"),
                ROLL,
                || async {
                    Ok(lease_holder(&client, LEASE_NAME)
                        .await?
                        .is_some_and(|h| holder_pod(&h) == standby))
                },
            )
            .await
        }
        Err(e) => Err(e),
    };
    kubectl(up, &["uncordon", node], None).await?;
    explained(handed, up, LEASE_NAMESPACE, PROPAGATOR).await?;

    set_password(up, &ns, "three").await?;
    wait_propagated(up, down, &dest, "three", two).await?;

    unregister_webhook(&down_client, WebhookKind::Mutating, &hook_name).await?;
    drop(hook);
    Ok(())
}

/// The rollout watcher's Lease (the only name its Role lets it use) and pods.
const WATCHER_LEASE: &str = "kubectl-helmop-rollout";
const WATCHER: &str = "app.kubernetes.io/name=helmop-rollout-watcher";

/// The busybox Deployment `name` (opted in by its namespace) printing, in a loop, the ConfigMap
/// `settings`' key `GREETING` (all its keys as env vars, `envFrom`) and Secret `db`'s key `password`
/// (`secretKeyRef`) as `greeting=<..> password=<..>`.
fn printer(env: &NodeEnv, ns: &str, name: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "app",
                        "image": env.busybox,
                        "command": env.shell(&[
                            "while true; do echo \"greeting=$GREETING password=$PASSWORD\"; sleep 2; done",
                        ]),
                        "envFrom": [{"configMapRef": {"name": "settings"}}],
                        "env": [{"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}],
                    }],
                },
            },
        },
    })
}

/// The line [`printer`] pods print.
fn printed(greeting: &str, password: &str) -> String {
    format!("greeting={greeting} password={password}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rollout_watcher_deployment_rolls_workloads_whose_config_map_or_secret_changes()
-> anyhow::Result<()> {
    let env = node_env().await?;
    let up = env.cluster();
    let overlay = env.install_rollout_watcher().await?;
    let flow = rollout_watcher_flow(env).await;
    // The watcher's own state when anything failed: its pods, their logs (one JSON event a line) and
    // the events of helmop-system.
    let flow = match flow {
        Ok(()) => Ok(()),
        Err(e) => {
            let report = diagnostics(up, LEASE_NAMESPACE, WATCHER).await;
            Err(anyhow::anyhow!("{e:#}\n--- the rollout watcher:{report}"))
        }
    };
    let removed = env.uninstall(&overlay).await;
    flow?;
    removed
}

async fn rollout_watcher_flow(env: &NodeEnv) -> anyhow::Result<()> {
    let up = env.cluster();
    let client = up.client().await;
    let ns = fresh_namespace_with_labels(&client, "nf-watch", &[(OPT_IN, "enabled")]).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    apply(up, &config_map(&ns, "settings", &[("GREETING", "hello-1")])).await?;
    create_source(up, &ns, "db", "password=first-pw").await?;
    apply(up, &printer(env, &ns, "printer")).await?;
    let stamp = |d: &Deployment| template_annotation(d, CONFIG_HASH);
    let first_stamp = stamp(&deployments.get("printer").await?)
        .context("the webhook stamped the Deployment of an opted-in namespace")?;
    let first = wait_pods_logging(
        up,
        &ns,
        "printer",
        1,
        &BTreeSet::new(),
        &printed("hello-1", "first-pw"),
    )
    .await?;
    // Both watchers listed everything (they are ready) and one leads before anything changes.
    two_ready_and_a_leader(up, WATCHER, WATCHER_LEASE).await?;
    let sets = replica_set_names(&client, &ns, "printer").await?;
    assert_eq!(sets.len(), 1, "one ReplicaSet at first: {sets:?}");

    // 1. The ConfigMap edited in place (the merge patch `kubectl edit` sends); nobody touches the
    // Deployment: the watcher restamps it, and it rolls new pods that print the new value.
    kubectl(
        up,
        &[
            "patch",
            "configmap",
            "settings",
            "-n",
            &ns,
            "--type",
            "merge",
            "-p",
            r#"{"data":{"GREETING":"hello-2"}}"#,
        ],
        None,
    )
    .await?;
    let second = wait_pods_logging(
        up,
        &ns,
        "printer",
        1,
        &first,
        &printed("hello-2", "first-pw"),
    )
    .await?;
    let second_stamp = stamp(&deployments.get("printer").await?).context("stamp after the edit")?;
    assert_ne!(first_stamp, second_stamp, "the edit changed the stamp");
    let after_edit = replica_set_names(&client, &ns, "printer").await?;
    assert!(
        after_edit.len() > sets.len() && after_edit.is_superset(&sets),
        "a new ReplicaSet: before {sets:?}, after {after_edit:?}"
    );

    // 2. The Secret deleted and created again with another value.
    kubectl(up, &["delete", "secret", "db", "-n", &ns], None).await?;
    create_source(up, &ns, "db", "password=second-pw").await?;
    wait_pods_logging(
        up,
        &ns,
        "printer",
        1,
        &second,
        &printed("hello-2", "second-pw"),
    )
    .await?;
    let third_stamp =
        stamp(&deployments.get("printer").await?).context("stamp after the new Secret")?;
    assert_ne!(
        second_stamp, third_stamp,
        "the new Secret changed the stamp"
    );
    assert!(
        replica_set_names(&client, &ns, "printer").await?.len() > after_edit.len(),
        "a new ReplicaSet for the new Secret"
    );

    // 3. The watcher's Deployment is Ready with two replicas, one of which holds the Lease, and it
    // said what it did on the Deployment.
    two_ready_and_a_leader(up, WATCHER, WATCHER_LEASE).await?;
    let watcher = Api::<Deployment>::namespaced(client.clone(), LEASE_NAMESPACE)
        .get("helmop-rollout-watcher")
        .await?;
    let status = watcher.status.unwrap_or_default();
    assert_eq!(
        (status.replicas, status.ready_replicas),
        (Some(2), Some(2)),
        "the rollout watcher Deployment is Ready"
    );
    let event = wait_for(
        "a Restamped Event on the Deployment printer",
        ROLL,
        || async {
            Ok(controller_events(
                &client,
                &ns,
                "Deployment",
                "printer",
                "helmop.dev/rollout-watcher",
            )
            .await?
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("Restamped")))
        },
    )
    .await;
    let event = explained(event, up, &ns, "app=printer").await?;
    assert_eq!(event.type_.as_deref(), Some("Normal"), "{event:?}");
    assert!(
        !event
            .note
            .as_deref()
            .unwrap_or_default()
            .contains("second-pw"),
        "a Secret value in an Event: {event:?}"
    );
    kubectl(up, &["delete", "namespace", &ns, "--wait=false"], None).await?;

    // 4. A change read in every namespace (a CA bundle rotated everywhere) over 200 workloads rolls
    // them under the shipped roll budget.
    rolls_under_the_budget(env).await
}

/// Label of the workloads of [`rolls_under_the_budget`].
const BUDGET_LABEL: &str = "helmop-test/budget";
/// The shipped watcher's `--max-rolling` and `--max-rolling-per-namespace` defaults.
const MAX_ROLLING: usize = 10;
const MAX_ROLLING_PER_NAMESPACE: usize = 3;

/// 200 Deployments in 5 namespaces, each reading its namespace's `ca-bundle`; all 5 are rewritten at
/// once. Sampled from the cluster's own listing until all are restamped and their rollouts over: never
/// more than 10 rolling in the cluster, 3 in a namespace. A rollout is as `kubectl rollout status`
/// sees it (`helmop_core::progress`), from a restamp by the watcher. 50 of them run a pod on the
/// node (so their rollouts end when new pods are available); the other 150 have no replicas (the
/// node's 110 pods and the runner's 2 cores), and their rollouts end when the controller has made
/// the new ReplicaSet.
async fn rolls_under_the_budget(env: &NodeEnv) -> anyhow::Result<()> {
    let up = env.cluster();
    let client = up.client().await;
    let mut namespaces = Vec::new();
    for _ in 0..5 {
        let ns = fresh_namespace_with_labels(&client, "nf-budget", &[(OPT_IN, "enabled")]).await?;
        apply(up, &config_map(&ns, "ca-bundle", &[("CA", "first")])).await?;
        for i in 0..40 {
            let replicas = if i < 10 { 1 } else { 0 };
            let name = format!("reader-{i:02}");
            apply(
                up,
                &json!({
                    "apiVersion": "apps/v1",
                    "kind": "Deployment",
                    "metadata": {"name": name, "namespace": ns, "labels": {BUDGET_LABEL: "1"}},
                    "spec": {
                        "replicas": replicas,
                        "selector": {"matchLabels": {"app": name}},
                        "template": {
                            "metadata": {"labels": {"app": name}},
                            "spec": {
                                "terminationGracePeriodSeconds": 0,
                                "containers": [{
                                    "name": "app",
                                    "image": env.busybox,
                                    "command": env.shell(&["sleep 3600"]),
                                    "envFrom": [{"configMapRef": {"name": "ca-bundle"}}],
                                }],
                            },
                        },
                    },
                }),
            )
            .await?;
        }
        namespaces.push(ns);
    }
    let all: Api<Deployment> = Api::all(client.clone());
    let listed = || async {
        Ok::<_, anyhow::Error>(
            all.list(&ListParams::default().labels(BUDGET_LABEL))
                .await?
                .items,
        )
    };
    let restamp = |d: &Deployment| {
        d.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("helmop.dev/restamp"))
            .cloned()
    };
    let over = |d: &Deployment| -> anyhow::Result<bool> {
        Ok(helmop_core::progress::roll_state(
            helmop_core::workload::WorkloadKind::Deployment,
            d.metadata.generation,
            &serde_json::to_value(d)?,
        )
        .is_over())
    };
    // Every first rollout over (the pods run) before the change.
    wait_for("the 200 Deployments to be available", ROLL, || async {
        let items = listed().await?;
        let mut ready = 0;
        for d in &items {
            if over(d)? {
                ready += 1;
            }
        }
        Ok((items.len() == 200 && ready == 200).then_some(()))
    })
    .await?;
    let before: std::collections::HashMap<String, Option<String>> = listed()
        .await?
        .iter()
        .map(|d| (key(d), restamp(d)))
        .collect();
    for ns in &namespaces {
        kubectl(
            up,
            &[
                "patch",
                "configmap",
                "ca-bundle",
                "-n",
                ns,
                "--type",
                "merge",
                "-p",
                r#"{"data":{"CA":"second"}}"#,
            ],
            None,
        )
        .await?;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
    let mut peak = 0;
    loop {
        let items = listed().await?;
        let mut rolling: std::collections::BTreeMap<String, usize> = Default::default();
        let mut restamped = 0;
        for d in &items {
            if restamp(d) == before.get(&key(d)).cloned().flatten() {
                continue;
            }
            restamped += 1;
            if !over(d)? {
                *rolling
                    .entry(d.metadata.namespace.clone().unwrap_or_default())
                    .or_default() += 1;
            }
        }
        let total: usize = rolling.values().sum();
        peak = peak.max(total);
        ensure!(
            total <= MAX_ROLLING,
            "{total} rolling at once, over the budget of {MAX_ROLLING}: {rolling:?}"
        );
        ensure!(
            rolling.values().all(|n| *n <= MAX_ROLLING_PER_NAMESPACE),
            "over the share of {MAX_ROLLING_PER_NAMESPACE} in a namespace: {rolling:?}"
        );
        if restamped == 200 && total == 0 {
            break;
        }
        ensure!(
            tokio::time::Instant::now() < deadline,
            "{restamped} of 200 restamped, {total} rolling"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("200 workloads rolled under the budget; peak rolling seen: {peak}");
    ensure!(peak >= 2, "the sampling saw rollouts at once (peak {peak})");
    for ns in &namespaces {
        kubectl(up, &["delete", "namespace", ns, "--wait=false"], None).await?;
    }
    Ok(())
}

/// `namespace/name` of a Deployment.
fn key(d: &Deployment) -> String {
    format!(
        "{}/{}",
        d.metadata.namespace.as_deref().unwrap_or_default(),
        d.metadata.name.as_deref().unwrap_or_default()
    )
}
