//! `helmop-bench rollout-watch`: what `kubectl-helmop rollout -A --watch` (the built binary) costs and how
//! fast it is, in a cluster holding many Secrets and ConfigMaps most of which no workload reads.
//!
//! One private kube-apiserver whose kube-controller-manager is stopped before anything is created (N
//! Deployments would otherwise bring N ReplicaSets and their status writes), the real admission webhook
//! (in-process, registered for the bench's namespaces) so that a restamp really changes the stamp, and
//! `--objects` Secrets and as many ConfigMaps over `--namespaces` namespaces. Per N of `--workloads`: N
//! opted-in Deployments (replicas 0), workload `i` reading object `i` (Secrets by `secretKeyRef`,
//! ConfigMaps by `envFrom`); the watcher is started, synced, decides every workload once (one read each),
//! then `--rounds` x `--changes` changes, one at a time: a merge PATCH of one read object's data, timed
//! until the bench's own watch on the Deployments delivers that reader with a new `helmop.dev/restamp`
//! and a new stamp. RSS (`VmRSS`, `VmHWM` of `/proc/PID/status`) after sync and after each round, idle
//! CPU (`utime + stime` of `/proc/PID/stat`) before and after the changes.
//!
//! The baseline, `helmop-bench-reflector` (a separate process, started the same way), caches every
//! Secret and ConfigMap whole with kube-runtime reflectors; it gets the same rounds of changes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use futures::{StreamExt, TryStreamExt};
use helmop_core::names;
use helmop_core::progress::roll_state;
use helmop_core::workload::WorkloadKind;
use helmop_tests::{
    LocalWebhook, PluginProcess, TEST_NAMESPACE_LABEL, WebhookKind, WebhookRegistration,
    WebhookRule, ensure_hash_key,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{
    ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::fixtures;
use crate::machine::{hwm_kib, load_average};
use crate::memory::admin_get;
use crate::stats::{Latencies, mib, ms, percent};
use crate::watch::{ProcSample, idle_cpu, sample};

/// Watcher flags that take the brakes off (see where the watcher is started).
const BRAKES_OFF: [(&str, &str); 5] = [
    ("--debounce", "0s"),
    ("--min-roll-interval", "0s"),
    ("--max-rolling", "1000000"),
    ("--max-rolling-per-namespace", "1000000"),
    ("--flap-changes", "0"),
];

#[derive(Debug, Clone)]
pub struct RolloutWatchSettings {
    pub plugin_bin: PathBuf,
    /// `helmop-bench-reflector`, the baseline.
    pub baseline_bin: PathBuf,
    /// Opted-in workload counts, each a separate watcher run.
    pub workloads: Vec<usize>,
    /// Secrets created, and as many ConfigMaps.
    pub objects: usize,
    pub namespaces: usize,
    /// Requests in flight while creating objects and workloads.
    pub parallel: usize,
    pub rounds: usize,
    /// Changes per round, one at a time.
    pub changes: usize,
    pub idle: Duration,
    /// Pause after each restamp landed, before the next change.
    pub gap: Duration,
    /// Rounds of changes the baseline gets.
    pub baseline_rounds: usize,
    /// Extra flags for the watcher.
    pub extra_args: Vec<String>,
}

/// A process's memory and CPU over one configuration.
#[derive(Debug, Clone, Default)]
pub struct Footprint {
    pub settled: ProcSample,
    pub settled_hwm_kib: u64,
    /// RSS after each round of changes, KiB.
    pub per_round: Vec<u64>,
    pub after: ProcSample,
    pub after_hwm_kib: u64,
    pub idle_cpu_before: f64,
    pub idle_cpu_after: f64,
    /// With `--images`: the registry polls (`poll` events) during the idle windows, before and
    /// after (each window is `--idle-seconds` plus the 3 s before it).
    pub idle_polls: Option<(usize, usize)>,
}

#[derive(Debug, Clone)]
pub struct Row {
    pub workloads: usize,
    pub load: String,
    /// Creating the N Deployments.
    pub created: Duration,
    /// From the watcher's start to its `synced` event, and the counts it reported.
    pub synced: Duration,
    pub synced_counts: String,
    /// From `synced` until every workload was decided once (object reads, nothing pending).
    pub decided: Duration,
    pub startup_reads: u64,
    pub startup_restamps: usize,
    /// Per change: PATCH -> the bench's watch delivers the restamped Deployment.
    pub latencies: Latencies,
    /// `lagMs` of the watcher's `restamped` events for the changes.
    pub lags: Latencies,
    pub restamped: usize,
    pub ineffective: usize,
    pub failed: usize,
    pub reads_total: u64,
    pub footprint: Footprint,
}

#[derive(Debug, Clone)]
pub struct Baseline {
    pub synced: Duration,
    pub synced_counts: String,
    pub footprint: Footprint,
}

pub struct Report {
    pub created: Duration,
    pub rows: Vec<Row>,
    pub baseline: Option<Baseline>,
}

/// The label on the bench's Deployments (value `n<N>`).
const WORKLOAD_LABEL: &str = "helmop-bench/rollout-watch";
const CONFIG_HASH: &str = names::ANN_CONFIG_HASH;

/// Namespace and name of object `i` as [`fixtures::create_many`] lays them out (even: a Secret, odd: a
/// ConfigMap); workload `i` reads it.
fn object(i: usize, namespaces: usize) -> (String, String, bool) {
    (
        format!("mem-{}", i % namespaces.max(1)),
        format!("obj-{}", i / 2),
        i.is_multiple_of(2),
    )
}

fn workload_json(i: usize, namespaces: usize, n: usize) -> Value {
    let (ns, obj, secret) = object(i, namespaces);
    let name = format!("w-{i}");
    let reads = if secret {
        json!({"env": [{"name": "VALUE", "valueFrom": {"secretKeyRef": {"name": obj, "key": "value"}}}]})
    } else {
        json!({"envFrom": [{"configMapRef": {"name": obj}}]})
    };
    let mut container = json!({"name": "app", "image": "registry.example.com/app:1.0"});
    if let (Some(c), Some(r)) = (container.as_object_mut(), reads.as_object()) {
        c.extend(r.clone());
    }
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns, "labels": {WORKLOAD_LABEL: format!("n{n}")}},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [container]},
            },
        },
    })
}

/// The workload changed by change `k` of `total`: spread over all N (alternating Secrets and ConfigMaps,
/// every namespace), each once while `total <= n`.
fn target(k: usize, total: usize, n: usize) -> usize {
    if total <= n {
        let step = (n / total.max(1)).max(1);
        k * step + k % step
    } else {
        k % n
    }
}

/// `namespaces` opted in and labelled for the webhook registration, which is made for each; then,
/// per namespace `k`, a dry-run create of `probe(k)` (a Deployment in `namespaces[k]`) has to come
/// back stamped.
pub(crate) async fn opt_in(
    client: &Client,
    webhook: &LocalWebhook,
    namespaces: &[String],
    probe: impl Fn(usize) -> Value,
) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces {
        let labels = json!({"metadata": {"labels": {
            TEST_NAMESPACE_LABEL: ns,
            names::LABEL_ROLLOUT_ON_CHANGE: "enabled",
        }}});
        api.patch(ns, &PatchParams::default(), &Patch::Merge(&labels))
            .await
            .with_context(|| format!("labelling namespace {ns}"))?;
        WebhookRegistration::new(
            WebhookKind::Mutating,
            &format!("{ns}-workloads"),
            &format!("{}/mutate/workloads", webhook.url),
            &webhook.ca_pem,
        )
        .rule(WebhookRule::new(
            &["CREATE", "UPDATE"],
            "apps",
            "v1",
            &["deployments"],
        ))
        .only_namespace(ns)
        .register(client)
        .await?;
    }
    // The API server picks a new registration up a moment later: until a dry-run create in every
    // namespace comes back stamped, a workload could be created unstamped (never restamped).
    for (k, ns) in namespaces.iter().enumerate() {
        let mut probe: Deployment = serde_json::from_value(probe(k))?;
        probe.metadata.name = Some("probe".to_owned());
        let api: Api<Deployment> = Api::namespaced(client.clone(), ns);
        helmop_tests::wait_until(
            &format!("the webhook to stamp Deployments in {ns}"),
            Duration::from_secs(60),
            || async {
                let created = api
                    .create(
                        &PostParams {
                            dry_run: true,
                            ..PostParams::default()
                        },
                        &probe,
                    )
                    .await?;
                Ok(created
                    .spec
                    .template
                    .metadata
                    .and_then(|m| m.annotations)
                    .is_some_and(|a| a.contains_key(CONFIG_HASH)))
            },
        )
        .await?;
    }
    Ok(())
}

/// Creates the Deployments `workload(0)` .. `workload(n - 1)`, `parallel` at a time. Returns the
/// time it took.
pub(crate) async fn create_workloads(
    client: &Client,
    n: usize,
    parallel: usize,
    workload: impl Fn(usize) -> Value,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let client = client.clone();
            let d = serde_json::from_value::<Deployment>(workload(i));
            async move {
                let d = d?;
                let ns = d.metadata.namespace.clone().unwrap_or_default();
                let name = d.metadata.name.clone().unwrap_or_default();
                Api::<Deployment>::namespaced(client, &ns)
                    .create(&PostParams::default(), &d)
                    .await
                    .with_context(|| format!("creating Deployment {ns}/{name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(parallel.max(1))
        .try_for_each(|()| async { Ok(()) })
        .await?;
    Ok(started.elapsed())
}

async fn delete_workloads(client: &Client, n: usize, namespaces: usize) -> anyhow::Result<()> {
    let selector = format!("{WORKLOAD_LABEL}=n{n}");
    for k in 0..namespaces.max(1) {
        let api: Api<Deployment> = Api::namespaced(client.clone(), &format!("mem-{k}"));
        api.delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&selector),
        )
        .await
        .with_context(|| format!("deleting the Deployments of mem-{k}"))?;
    }
    let all: Api<Deployment> = Api::all(client.clone());
    helmop_tests::wait_until(
        "the bench's Deployments to be gone",
        Duration::from_secs(120),
        || async {
            let left = all
                .list_metadata(&ListParams::default().labels(&selector).limit(1))
                .await?;
            Ok(left.items.is_empty())
        },
    )
    .await
}

/// A Deployment as the bench's watch delivered it.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    /// `namespace/name`.
    pub(crate) key: String,
    /// Its `helmop.dev/restamp` annotation.
    pub(crate) restamp: Option<String>,
    /// The stamp in its pod template.
    pub(crate) stamp: Option<String>,
    /// `metadata.generation` (0 when absent).
    pub(crate) generation: i64,
    /// Whether its rollout at that generation is over, by `kubectl rollout status` rules
    /// ([`helmop_core::progress::roll_state`], what the watcher's roll budget counts by).
    pub(crate) over: bool,
    pub(crate) at: Instant,
}

impl Seen {
    /// What the bench keeps of a Deployment delivered at `at`.
    pub(crate) fn of(d: &DynamicObject, at: Instant) -> Seen {
        let key = format!(
            "{}/{}",
            d.metadata.namespace.as_deref().unwrap_or_default(),
            d.metadata.name.as_deref().unwrap_or_default()
        );
        let restamp = d
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(names::ANN_RESTAMP).cloned());
        let stamp = d
            .data
            .pointer("/spec/template/metadata/annotations")
            .and_then(|a| a.get(CONFIG_HASH))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let over = roll_state(WorkloadKind::Deployment, d.metadata.generation, &d.data).is_over();
        Seen {
            key,
            restamp,
            stamp,
            generation: d.metadata.generation.unwrap_or(0),
            over,
            at,
        }
    }
}

pub(crate) enum Observed {
    Seen(Seen),
    /// The watch's first listing is complete.
    Listed,
}

/// What the bench's watch delivers is folded into one of these.
pub(crate) trait Absorb {
    fn absorb(&mut self, observed: Observed);
}

/// The bench's watch on the Deployments matching `selector` (whole objects: the restamps landing,
/// the stamps, the rollouts' status).
pub(crate) fn observe(
    client: &Client,
    selector: &str,
) -> (
    mpsc::UnboundedReceiver<Observed>,
    tokio::task::JoinHandle<()>,
) {
    let (tx, rx) = mpsc::unbounded_channel();
    let resource = ApiResource::erase::<Deployment>(&());
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
    let config = watcher::Config::default().labels(selector);
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(watcher::watcher(api, config));
        while let Some(event) = stream.next().await {
            let observed = match event {
                Ok(Event::Apply(d) | Event::InitApply(d)) => {
                    Observed::Seen(Seen::of(&d, Instant::now()))
                }
                Ok(Event::InitDone) => Observed::Listed,
                _ => continue,
            };
            if tx.send(observed).is_err() {
                return;
            }
        }
    });
    (rx, task)
}

/// Per Deployment: its restamp and stamp, and since when it has them.
#[derive(Default)]
struct State {
    latest: HashMap<String, (Option<String>, Option<String>, Instant)>,
    listed: bool,
}

impl Absorb for State {
    fn absorb(&mut self, observed: Observed) {
        match observed {
            Observed::Seen(s) => {
                let changed = self
                    .latest
                    .get(&s.key)
                    .is_none_or(|(r, st, _)| *r != s.restamp || *st != s.stamp);
                if changed {
                    self.latest.insert(s.key, (s.restamp, s.stamp, s.at));
                }
            }
            Observed::Listed => self.listed = true,
        }
    }
}

/// Folds what the bench's watch delivers into `state` until `done` says when (or `timeout`).
pub(crate) async fn until<S: Absorb>(
    rx: &mut mpsc::UnboundedReceiver<Observed>,
    state: &mut S,
    timeout: Duration,
    what: &str,
    done: impl Fn(&S) -> Option<Instant>,
) -> anyhow::Result<Instant> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        while let Ok(o) = rx.try_recv() {
            state.absorb(o);
        }
        if let Some(at) = done(state) {
            return Ok(at);
        }
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(o)) => state.absorb(o),
            Ok(None) => bail!("the bench's watch ended while waiting for {what}"),
            Err(_) => bail!("timed out after {timeout:?} waiting for {what}"),
        }
    }
}

/// A new `value` for object `i`'s data (a merge PATCH, as `kubectl edit` would).
async fn change_object(
    client: &Client,
    i: usize,
    namespaces: usize,
    value: &str,
) -> anyhow::Result<()> {
    let (ns, name, secret) = object(i, namespaces);
    let params = PatchParams::default();
    if secret {
        let encoded = base64::engine::general_purpose::STANDARD.encode(value);
        Api::<Secret>::namespaced(client.clone(), &ns)
            .patch(
                &name,
                &params,
                &Patch::Merge(json!({"data": {"value": encoded}})),
            )
            .await
            .with_context(|| format!("patching Secret {ns}/{name}"))?;
    } else {
        Api::<ConfigMap>::namespaced(client.clone(), &ns)
            .patch(
                &name,
                &params,
                &Patch::Merge(json!({"data": {"value": value}})),
            )
            .await
            .with_context(|| format!("patching ConfigMap {ns}/{name}"))?;
    }
    Ok(())
}

/// A sample of the watcher's Prometheus metric `name` (unlabelled, or with its labels as printed:
/// `helmop_rollout_rolls_ended_total{how="complete"}`).
pub(crate) fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

pub(crate) async fn scrape(port: u16) -> anyhow::Result<String> {
    let (_, body) = tokio::time::timeout(Duration::from_secs(10), admin_get(port, "/metrics"))
        .await
        .context("scraping the watcher's /metrics timed out")??;
    Ok(body)
}

const READS: &str = "helmop_rollout_object_reads_total";
const PENDING: &str = "helmop_rollout_pending";

/// The watcher's flags: `defaults` (flag, value) where `extra` does not name that flag, then `extra`.
pub(crate) fn watcher_flags(defaults: &[(&str, &str)], extra: &[String]) -> Vec<String> {
    let named = |flag: &str| {
        extra
            .iter()
            .any(|a| a == flag || a.strip_prefix(flag).is_some_and(|r| r.starts_with('=')))
    };
    let mut flags: Vec<String> = defaults
        .iter()
        .filter(|(flag, _)| !named(flag))
        .flat_map(|(flag, value)| [(*flag).to_owned(), (*value).to_owned()])
        .collect();
    flags.extend(extra.iter().cloned());
    flags
}

/// A running `rollout -A --watch` that has listed everything.
pub(crate) struct Started {
    pub(crate) process: PluginProcess,
    /// Its `started` event (the brakes' settings: `maxRolling`, `maxRollingPerNamespace`).
    pub(crate) started: Value,
    /// Of its `/metrics`.
    pub(crate) port: u16,
    /// From the start to its `synced` event, and the counts that event reported.
    pub(crate) synced: Duration,
    pub(crate) synced_counts: String,
}

/// Starts `plugin_bin rollout -A --watch --no-leader-election -o json --metrics-addr 127.0.0.1:0`
/// against `kubeconfig` with `flags` (and [`ALLOCATOR_ENV`]), and waits for its `synced` event.
pub(crate) async fn start_watcher(
    plugin_bin: &Path,
    kubeconfig: &Path,
    flags: &[String],
) -> anyhow::Result<Started> {
    let kubeconfig = kubeconfig.display().to_string();
    let mut args = vec![
        "rollout",
        "-A",
        "--watch",
        "--no-leader-election",
        "-o",
        "json",
        "--metrics-addr",
        "127.0.0.1:0",
        "--kubeconfig",
        &kubeconfig,
    ];
    args.extend(flags.iter().map(String::as_str));
    let started = Instant::now();
    let mut process = PluginProcess::spawn_binary(plugin_bin, &args, ALLOCATOR_ENV)?;
    // `--images` starts a loop of its own, with a `started` event of its own (no metricsAddr).
    let first = process
        .wait_event("the watcher to start", Duration::from_secs(60), 0, |e| {
            e["event"] == "started" && e["metricsAddr"].is_string()
        })
        .await?;
    let port: u16 = first["metricsAddr"]
        .as_str()
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(_, p)| p.parse().ok())
        .context("no metricsAddr in the started event")?;
    let synced_event = process
        .wait_event(
            "the watcher's synced event",
            Duration::from_secs(600),
            0,
            |e| e["event"] == "synced",
        )
        .await?;
    let synced = started.elapsed();
    let synced_counts = format!(
        "{} workloads, {} objects",
        synced_event["workloads"], synced_event["objects"]
    );
    Ok(Started {
        process,
        started: first,
        port,
        synced,
        synced_counts,
    })
}

/// Waits until the watcher on `port` has read at least `reads` objects and has nothing pending:
/// every workload decided once. Returns how long that took and the reads it made.
pub(crate) async fn wait_decided(port: u16, reads: u64) -> anyhow::Result<(Duration, u64)> {
    let deciding = Instant::now();
    let deadline = deciding + Duration::from_secs(600);
    let startup_reads = loop {
        let body = scrape(port).await?;
        let done = metric(&body, READS).unwrap_or(0.0) as u64;
        // The pending gauge is set every 2 s: only a sample taken after the reads counts.
        if done >= reads {
            tokio::time::sleep(Duration::from_millis(2100)).await;
            let body = scrape(port).await?;
            if metric(&body, PENDING) == Some(0.0) {
                break metric(&body, READS).unwrap_or(0.0) as u64;
            }
        }
        if Instant::now() > deadline {
            bail!("the watcher did not decide every workload within 600 s ({done} reads)");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // The settle check waits for one heartbeat after the last read: take that off.
    let decided = deciding
        .elapsed()
        .saturating_sub(Duration::from_millis(2100));
    Ok((decided, startup_reads))
}

pub(crate) async fn settle(
    pid: u32,
    footprint: &mut Footprint,
    idle: Duration,
) -> anyhow::Result<()> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    footprint.settled = sample(pid);
    footprint.settled_hwm_kib = hwm_kib(&pid.to_string()).unwrap_or(0);
    eprintln!(
        "watcher RSS {} MiB; idle CPU for {idle:?} ...",
        mib(footprint.settled.rss_kib)
    );
    footprint.idle_cpu_before = idle_cpu(pid, idle).await?;
    Ok(())
}

pub(crate) async fn finish(
    pid: u32,
    footprint: &mut Footprint,
    idle: Duration,
) -> anyhow::Result<()> {
    tokio::time::sleep(Duration::from_secs(3)).await;
    footprint.after = sample(pid);
    footprint.after_hwm_kib = hwm_kib(&pid.to_string()).unwrap_or(0);
    footprint.idle_cpu_after = idle_cpu(pid, idle).await?;
    Ok(())
}

async fn one(
    settings: &RolloutWatchSettings,
    cluster: &fixtures::Cluster,
    n: usize,
) -> anyhow::Result<Row> {
    let client = &cluster.client;
    let load = load_average();
    eprintln!("rollout-watch: {n} workloads: creating them ...");
    let created = create_workloads(client, n, settings.parallel, |i| {
        workload_json(i, settings.namespaces, n)
    })
    .await?;
    let (mut rx, observer) = observe(client, &format!("{WORKLOAD_LABEL}=n{n}"));
    let mut state = State::default();
    until(
        &mut rx,
        &mut state,
        Duration::from_secs(300),
        "the bench's watch to list",
        |s| s.listed.then(Instant::now),
    )
    .await?;
    let unstamped = state
        .latest
        .values()
        .filter(|(_, st, _)| st.is_none())
        .count();
    if state.latest.len() != n || unstamped > 0 {
        bail!(
            "{} Deployments listed ({unstamped} without a stamp; want {n}, all stamped by the webhook)",
            state.latest.len()
        );
    }

    // The controller-manager is stopped, so no rollout is ever over: the brakes (a roll budget
    // counted until rollouts end, the quiet period, the minimum interval, the flap breaker) would
    // measure themselves. This measures deciding and restamping; `--watcher-arg` overrides.
    let flags = watcher_flags(&BRAKES_OFF, &settings.extra_args);
    eprintln!("rollout-watch: {n} workloads: starting the watcher ...");
    let Started {
        process: mut watcher,
        port,
        synced,
        synced_counts,
        ..
    } = start_watcher(&settings.plugin_bin, &cluster.info().kubeconfig, &flags).await?;
    eprintln!("rollout-watch: synced in {synced:?} ({synced_counts}); deciding every workload ...");
    let (decided, startup_reads) = wait_decided(port, n as u64).await?;
    let startup_restamps = watcher.events_named("restamped").len();
    let events_before = watcher.events().len();
    let pid = watcher.pid();
    let mut footprint = Footprint::default();
    let polls = |w: &PluginProcess| w.events_named("poll").len();
    let polls_before = polls(&watcher);
    settle(pid, &mut footprint, settings.idle).await?;
    let idle_polls_before = polls(&watcher) - polls_before;

    let total = settings.rounds * settings.changes;
    let mut latencies = Vec::new();
    for round in 0..settings.rounds {
        for c in 0..settings.changes {
            let k = round * settings.changes + c;
            let w = target(k, total, n);
            let key = {
                let (ns, _, _) = object(w, settings.namespaces);
                format!("{ns}/w-{w}")
            };
            while let Ok(o) = rx.try_recv() {
                state.absorb(o);
            }
            let (restamp0, stamp0, _) = state
                .latest
                .get(&key)
                .cloned()
                .with_context(|| format!("the bench's watch never saw {key}"))?;
            let t0 = Instant::now();
            change_object(
                client,
                w,
                settings.namespaces,
                &format!("n{n}-round-{round}-change-{c}"),
            )
            .await?;
            let landed = until(
                &mut rx,
                &mut state,
                Duration::from_secs(60),
                &format!("{key} to be restamped"),
                |s| {
                    s.latest.get(&key).and_then(|(r, st, at)| {
                        (*r != restamp0 && *st != stamp0 && *at >= t0).then_some(*at)
                    })
                },
            )
            .await?;
            latencies.push(landed.saturating_duration_since(t0).as_nanos() as u64);
            tokio::time::sleep(settings.gap).await;
        }
        footprint.per_round.push(sample(pid).rss_kib);
        let l = Latencies::from_samples(latencies.clone());
        eprintln!(
            "rollout-watch: {n} workloads: round {}/{}: p50 {} ms, RSS {} MiB",
            round + 1,
            settings.rounds,
            ms(l.quantile(0.5)),
            mib(*footprint.per_round.last().unwrap_or(&0)),
        );
    }
    let polls_before = polls(&watcher);
    finish(pid, &mut footprint, settings.idle).await?;
    let all_polls = polls(&watcher);
    if all_polls > 0 {
        footprint.idle_polls = Some((idle_polls_before, all_polls - polls_before));
    }
    let reads_total = metric(&scrape(port).await?, READS).unwrap_or(0.0) as u64;
    let events: Vec<Value> = watcher.events().into_iter().skip(events_before).collect();
    let named = |name: &str| events.iter().filter(|e| e["event"] == name).count();
    let lags: Vec<u64> = events
        .iter()
        .filter(|e| e["event"] == "restamped")
        .filter_map(|e| e["lagMs"].as_u64())
        .map(|l| l * 1_000_000)
        .collect();
    let (restamped, ineffective, failed) =
        (named("restamped"), named("ineffective"), named("failed"));
    watcher.signal(15)?;
    watcher.wait_exit(Duration::from_secs(30)).await?;
    observer.abort();
    eprintln!("rollout-watch: {n} workloads: deleting them ...");
    delete_workloads(client, n, settings.namespaces).await?;
    Ok(Row {
        workloads: n,
        load,
        created,
        synced,
        synced_counts,
        decided,
        startup_reads,
        startup_restamps,
        latencies: Latencies::from_samples(latencies),
        lags: Latencies::from_samples(lags),
        restamped,
        ineffective,
        failed,
        reads_total,
        footprint,
    })
}

/// The allocator setting `manifests/rollout-watcher` runs the watcher with (glibc's arenas capped, so
/// memory freed by one worker thread is reused by the other instead of kept per thread). Both the
/// watcher and the baseline run with it, so the ratio compares the state they hold.
pub(crate) const ALLOCATOR_ENV: &[(&str, &str)] = &[("MALLOC_ARENA_MAX", "1")];

/// The baseline process through the same rounds of changes (of the objects the largest N reads).
async fn baseline(
    settings: &RolloutWatchSettings,
    cluster: &fixtures::Cluster,
) -> anyhow::Result<Baseline> {
    let kubeconfig = cluster.info().kubeconfig.display().to_string();
    eprintln!("rollout-watch: starting the baseline (every Secret and ConfigMap cached whole) ...");
    let started = Instant::now();
    let mut env = vec![("KUBECONFIG", kubeconfig.as_str())];
    env.extend_from_slice(ALLOCATOR_ENV);
    let mut process = PluginProcess::spawn_binary(&settings.baseline_bin, &[], &env)?;
    let synced_event = process
        .wait_event(
            "the baseline's synced event",
            Duration::from_secs(600),
            0,
            |e| e["event"] == "synced",
        )
        .await?;
    let synced = started.elapsed();
    let synced_counts = format!(
        "{} Secrets, {} ConfigMaps",
        synced_event["secrets"], synced_event["configMaps"]
    );
    let pid = process.pid();
    let mut footprint = Footprint::default();
    settle(pid, &mut footprint, settings.idle).await?;
    let n = settings.workloads.iter().copied().max().unwrap_or(1).max(1);
    let total = settings.baseline_rounds * settings.changes;
    for round in 0..settings.baseline_rounds {
        for c in 0..settings.changes {
            let w = target(round * settings.changes + c, total, n);
            change_object(
                &cluster.client,
                w,
                settings.namespaces,
                &format!("baseline-round-{round}-change-{c}"),
            )
            .await?;
            tokio::time::sleep(settings.gap).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        footprint.per_round.push(sample(pid).rss_kib);
    }
    finish(pid, &mut footprint, settings.idle).await?;
    process.signal(15)?;
    process.wait_exit(Duration::from_secs(30)).await?;
    Ok(Baseline {
        synced,
        synced_counts,
        footprint,
    })
}

pub async fn run(settings: &RolloutWatchSettings) -> anyhow::Result<Report> {
    fixtures::require_plugin(&settings.plugin_bin)?;
    if !settings.baseline_bin.is_file() {
        bail!(
            "{} not found: build it first with `cargo build --release -p helmop-bench`",
            settings.baseline_bin.display()
        );
    }
    if let Some(n) = settings
        .workloads
        .iter()
        .find(|n| **n > 2 * settings.objects)
    {
        bail!(
            "--workloads {n}: each reads its own object, and there are only 2 x {} objects",
            settings.objects
        );
    }
    eprintln!("rollout-watch: starting a private control plane ...");
    let cluster = fixtures::start(&["rollout"]).await?;
    // N Deployments would otherwise bring N ReplicaSets and their status writes.
    tokio::task::block_in_place(|| cluster.cp.stop_controller_manager("rollout"))?;
    let client = cluster.client.clone();
    ensure_hash_key(&client).await?;
    let webhook =
        LocalWebhook::start(client.clone(), helmop_webhook::state::Config::default()).await?;
    eprintln!(
        "rollout-watch: creating {} Secrets and {} ConfigMaps ...",
        settings.objects, settings.objects
    );
    let created = fixtures::create_many(
        &client,
        settings.objects,
        settings.namespaces,
        settings.parallel,
    )
    .await?;
    let namespaces: Vec<String> = (0..settings.namespaces.max(1))
        .map(|k| format!("mem-{k}"))
        .collect();
    opt_in(&client, &webhook, &namespaces, |k| {
        workload_json(k, settings.namespaces, 0)
    })
    .await?;
    let mut rows = Vec::new();
    for &n in &settings.workloads {
        rows.push(one(settings, &cluster, n).await?);
    }
    let baseline = baseline(settings, &cluster).await?;
    drop(webhook);
    Ok(Report {
        created,
        rows,
        baseline: Some(baseline),
    })
}

/// RSS after each round: `20.1 / 20.3 / 20.3`.
fn rounds(per_round: &[u64]) -> String {
    if per_round.is_empty() {
        return "-".to_owned();
    }
    per_round
        .iter()
        .map(|k| mib(*k))
        .collect::<Vec<_>>()
        .join(" / ")
}

fn footprint_row(what: &str, f: &Footprint) -> String {
    let polls = f
        .idle_polls
        .map(|(b, a)| format!(" ({b} / {a} registry polls in them)"))
        .unwrap_or_default();
    format!(
        "| {what} | {} | {} | {} | {} | {} | {} / {}{polls} |\n",
        mib(f.settled.rss_kib),
        rounds(&f.per_round),
        mib(f.after.rss_kib),
        mib(f.after_hwm_kib),
        f.after.threads,
        percent(f.idle_cpu_before),
        percent(f.idle_cpu_after),
    )
}

pub fn table(report: &Report, s: &RolloutWatchSettings) -> String {
    let pct = |l: &Latencies| {
        format!(
            "{} / {} / {}",
            ms(l.quantile(0.5)),
            ms(l.quantile(0.99)),
            ms(l.max())
        )
    };
    let flags = watcher_flags(&BRAKES_OFF, &s.extra_args).join(" ");
    let mut out = format!(
        "`rollout -A --watch --no-leader-election -o json {flags}` (MALLOC_ARENA_MAX=1) against one kube-apiserver without a controller-manager, \
         the real webhook in-process registered for the {ns} bench namespaces; {o} Secrets + {o} ConfigMaps (256-byte \
         values, created in {:.1} s, {p} in flight) over {ns} namespaces; N opted-in Deployments (replicas 0), \
         workload i reading object i (Secrets by secretKeyRef, ConfigMaps by envFrom), the other objects read by \
         none. {r} rounds x {c} changes, one at a time ({g} ms after each landed): a merge PATCH of one read object's \
         data, timed until the bench's own watch on the Deployments delivers the reader with a new \
         `helmop.dev/restamp` and a new stamp. \"watcher lag\" is the `lagMs` of its `restamped` events (from the \
         change reaching its loop to the restamp PATCH's response).\n\n\
         | workloads | load at start | created in s | synced s (listed) | start-up: every workload decided s (reads, restamps) | change -> restamp landed p50 / p99 / max ms | watcher lag p50 / p99 ms | restamped / ineffective / failed | reads in all |\n\
         |---:|---|---:|---|---|---|---|---|---:|\n",
        report.created.as_secs_f64(),
        ns = s.namespaces,
        o = s.objects,
        p = s.parallel,
        r = s.rounds,
        c = s.changes,
        g = s.gap.as_millis(),
    );
    for r in &report.rows {
        out.push_str(&format!(
            "| {} | {} | {:.1} | {:.2} ({}) | {:.2} ({}, {}) | {} | {} / {} | {} / {} / {} | {} |\n",
            r.workloads,
            r.load,
            r.created.as_secs_f64(),
            r.synced.as_secs_f64(),
            r.synced_counts,
            r.decided.as_secs_f64(),
            r.startup_reads,
            r.startup_restamps,
            pct(&r.latencies),
            ms(r.lags.quantile(0.5)),
            ms(r.lags.quantile(0.99)),
            r.restamped,
            r.ineffective,
            r.failed,
            r.reads_total,
        ));
    }
    out.push_str(&format!(
        "\n| process | RSS MiB after sync | RSS MiB after round 1 .. {} | RSS MiB after the rounds | VmHWM MiB | threads | idle CPU ({} s) before / after the changes |\n\
         |---|---:|---|---:|---:|---:|---|\n",
        s.rounds,
        s.idle.as_secs()
    ));
    for r in &report.rows {
        out.push_str(&footprint_row(
            &format!("watcher, {} workloads", r.workloads),
            &r.footprint,
        ));
    }
    if let Some(b) = &report.baseline {
        out.push_str(&footprint_row(
            &format!(
                "baseline reflector ({}, synced in {:.2} s)",
                b.synced_counts,
                b.synced.as_secs_f64()
            ),
            &b.footprint,
        ));
        out.push('\n');
        for r in &report.rows {
            let ratio = |a: u64, b: u64| {
                if b == 0 {
                    "?".to_owned()
                } else {
                    format!("{:.2}", a as f64 / b as f64)
                }
            };
            out.push_str(&format!(
                "Watcher / baseline RSS at {} workloads: {} after sync, {} after the rounds.\n",
                r.workloads,
                ratio(r.footprint.settled.rss_kib, b.footprint.settled.rss_kib),
                ratio(r.footprint.after.rss_kib, b.footprint.after.rss_kib),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_distinct_and_alternate_kinds_while_there_are_enough_workloads() {
        for (n, total) in [(100, 100), (1000, 100), (10_000, 100), (10_000, 37)] {
            let picked: Vec<usize> = (0..total).map(|k| target(k, total, n)).collect();
            let distinct: std::collections::HashSet<_> = picked.iter().collect();
            assert_eq!(distinct.len(), total, "n {n}");
            assert!(picked.iter().all(|w| *w < n));
            let secrets = picked.iter().filter(|w| object(**w, 20).2).count();
            assert!(
                secrets > total / 4 && secrets < total * 3 / 4,
                "n {n}: {secrets}"
            );
        }
        assert_eq!(target(150, 200, 100), 50);
    }

    #[test]
    fn workload_i_reads_object_i_where_create_many_made_it() {
        let w = workload_json(3, 20, 100);
        assert_eq!(w["metadata"]["namespace"], "mem-3");
        assert_eq!(
            w["spec"]["template"]["spec"]["containers"][0]["envFrom"][0]["configMapRef"]["name"],
            "obj-1"
        );
        let w = workload_json(4, 20, 100);
        assert_eq!(
            w["spec"]["template"]["spec"]["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]["name"],
            "obj-2"
        );
        assert_eq!(w["metadata"]["labels"][WORKLOAD_LABEL], "n100");
    }

    #[test]
    fn the_brakes_stay_off_unless_a_flag_names_them() {
        let flags = watcher_flags(&BRAKES_OFF, &[]);
        assert_eq!(flags.len(), 10);
        assert_eq!(flags[..2], ["--debounce", "0s"]);
        let extra: Vec<String> = ["--max-rolling=7", "--images", "--debounce", "1s"]
            .map(str::to_owned)
            .to_vec();
        let flags = watcher_flags(&BRAKES_OFF, &extra);
        assert_eq!(
            flags,
            [
                "--min-roll-interval",
                "0s",
                "--max-rolling-per-namespace",
                "1000000",
                "--flap-changes",
                "0",
                "--max-rolling=7",
                "--images",
                "--debounce",
                "1s",
            ]
        );
        assert_eq!(watcher_flags(&[], &extra), extra);
    }

    #[test]
    fn a_seen_deployment_carries_its_restamp_stamp_and_whether_its_rollout_is_over() {
        let d = |observed: i64| -> DynamicObject {
            serde_json::from_value(json!({
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "w-1", "namespace": "a", "generation": 3,
                             "annotations": {names::ANN_RESTAMP: "r1"}},
                "spec": {"replicas": 0, "template": {"metadata": {"annotations": {CONFIG_HASH: "h1"}}}},
                "status": {"observedGeneration": observed},
            }))
            .expect("a Deployment")
        };
        let at = Instant::now();
        let s = Seen::of(&d(2), at);
        assert_eq!(s.key, "a/w-1");
        assert_eq!(s.restamp.as_deref(), Some("r1"));
        assert_eq!(s.stamp.as_deref(), Some("h1"));
        assert_eq!(s.generation, 3);
        assert!(!s.over, "the controller has not seen generation 3");
        assert!(Seen::of(&d(3), at).over);
    }

    #[test]
    fn unlabelled_metrics_are_read() {
        let body = "# HELP x\nhelmop_rollout_pending 3\nhelmop_rollout_pending_x 9\nhelmop_rollout_object_reads_total 12\n";
        assert_eq!(metric(body, PENDING), Some(3.0));
        assert_eq!(metric(body, READS), Some(12.0));
        assert_eq!(metric(body, "nope"), None);
        let body = "helmop_rollout_rolls_ended_total{how=\"complete\"} 10\nhelmop_rollout_rolling_peak 10\nhelmop_rollout_rolling 3\n";
        assert_eq!(
            metric(body, "helmop_rollout_rolls_ended_total{how=\"complete\"}"),
            Some(10.0)
        );
        assert_eq!(metric(body, "helmop_rollout_rolling"), Some(3.0));
    }
}
