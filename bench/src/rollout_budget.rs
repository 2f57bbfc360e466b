//! `helmop-bench rollout-budget`: `kubectl-helmop rollout -A --watch` (the built binary) with its brakes
//! as shipped, against a change every workload of the cluster reads, with rollouts that really end.
//!
//! One private kube-apiserver whose kube-controller-manager keeps running (its client rate limit set
//! by `HELMOP_CP_KCM_QPS`, `--kcm-qps`), the real admission webhook in-process (registered for the
//! bench's namespaces, so a restamp really changes the pod template), and `--namespaces` opted-in
//! namespaces, each with a ConfigMap `ca-bundle`. N Deployments (replicas 0) spread over them, each
//! mounting its namespace's `ca-bundle`: with no replicas a rollout is over as soon as the deployment
//! controller has made the new ReplicaSet and written the status (`kubectl rollout status` rules).
//!
//! Once the controller-manager has rolled out every new Deployment, the watcher is started with the
//! default brakes (`--max-rolling 10`, `--max-rolling-per-namespace 3`, `--debounce 250ms`,
//! `--min-roll-interval 30s`, `--flap-changes 5`; `--watcher-arg` adds flags), synced, and decides
//! every workload once. Then the change: new data in every `ca-bundle` at once (a CA bundle rotated
//! in every namespace). The bench's own watch on the Deployments counts a workload as rolling from
//! when it delivers the workload's new `helmop.dev/restamp` until the workload's status says the
//! rollout of that generation is over ([`helmop_core::progress::roll_state`], what the watcher's
//! budget counts by), and times the change until every workload rolled. Also: the watcher's own
//! rolling and parked gauges (sampled every 2 s) and peak, its `-o json` events, its RSS (`VmRSS`,
//! `VmHWM`) and the CPU it, the API server, etcd, the controller-manager and the bench used over the
//! run.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use helmop_tests::{LocalWebhook, ensure_hash_key};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::fixtures;
use crate::machine::load_average;
use crate::rollout_watch::{
    Absorb, Footprint, Observed, Started, create_workloads, finish, metric, observe, opt_in,
    scrape, settle, start_watcher, until, wait_decided, watcher_flags,
};
use crate::stats::{Latencies, mib, ms, percent};
use crate::watch::{cpu_ticks, sample};

/// The environment variable `tests/controlplane/cp` reads for the controller-manager's
/// `--kube-api-qps` (burst twice that).
pub const KCM_QPS_ENV: &str = "HELMOP_CP_KCM_QPS";

/// The value [`KCM_QPS_ENV`] must have for `--kcm-qps QPS` (0: unset, the controller-manager's
/// default).
pub fn kcm_qps_env(qps: u32) -> Option<String> {
    (qps > 0).then(|| qps.to_string())
}

/// The control plane's one cluster.
const CLUSTER: &str = "budget";
/// The label on the bench's Deployments (value `n<N>`).
const WORKLOAD_LABEL: &str = "helmop-bench/rollout-budget";
/// The ConfigMap every workload of a namespace mounts.
const BUNDLE: &str = "ca-bundle";
const BUNDLE_KEY: &str = "ca.crt";
/// The longest the controller-manager may take to roll out the N new Deployments.
const CATCH_UP_TIMEOUT: Duration = Duration::from_secs(3600);

#[derive(Debug, Clone)]
pub struct RolloutBudgetSettings {
    pub plugin_bin: PathBuf,
    /// Opted-in Deployments.
    pub workloads: usize,
    pub namespaces: usize,
    /// Requests in flight while creating the Deployments.
    pub parallel: usize,
    /// Each idle CPU measurement of the watcher (before and after the change).
    pub idle: Duration,
    /// The longest one change may take until every workload rolled.
    pub timeout: Duration,
    /// Cluster-wide changes, one after the other (each once every workload rolled from the one
    /// before, and `pause` later).
    pub changes: usize,
    /// Between two changes: longer than the watcher's `--min-roll-interval` (30 s), so that no
    /// workload is held back by it.
    pub pause: Duration,
    /// Extra flags for the watcher (e.g. `--max-rolling 20`).
    pub extra_args: Vec<String>,
}

/// The rollouts after the change, as the bench's watch saw them.
#[derive(Debug, Clone, Default)]
pub struct Rolled {
    /// Workloads whose new restamp landed, and of those whose rollout ended.
    pub restamped: usize,
    pub ended: usize,
    pub first_restamp: Option<Instant>,
    pub last_restamp: Option<Instant>,
    pub last_end: Option<Instant>,
    /// Per workload: its new restamp landed -> its rollout over.
    pub durations: Latencies,
    /// The sum of those durations (over the span: the mean number rolling at once).
    pub busy: Duration,
    /// The most rolling at once, in the cluster and in one namespace.
    pub peak: usize,
    pub peak_namespace: usize,
    /// Restamps landed on a workload that was already restamped after the change (none expected:
    /// one change, `--min-roll-interval`).
    pub restamped_again: usize,
}

/// The watcher's own gauges, sampled while the rollouts ran.
#[derive(Debug, Clone, Copy, Default)]
pub struct Sampled {
    pub samples: usize,
    pub rolling_max: f64,
    pub parked_max: f64,
}

impl Sampled {
    fn absorb(&mut self, metrics: &str) {
        self.samples += 1;
        if let Some(r) = metric(metrics, ROLLING) {
            self.rolling_max = self.rolling_max.max(r);
        }
        if let Some(p) = metric(metrics, PARKED) {
            self.parked_max = self.parked_max.max(p);
        }
    }
}

const ROLLING: &str = "helmop_rollout_rolling";
const PARKED: &str = "helmop_rollout_parked";
const ROLLING_PEAK: &str = "helmop_rollout_rolling_peak";
const ROLLS_COMPLETE: &str = "helmop_rollout_rolls_ended_total{how=\"complete\"}";
const RESTAMPS: &str = "helmop_rollout_restamps_total";

/// Every labelled series of metric `name` in a Prometheus text body: (labels as printed, value).
fn series<'a>(body: &'a str, name: &str) -> Vec<(&'a str, f64)> {
    body.lines()
        .filter_map(|l| {
            let (labels, value) = l.strip_prefix(name)?.strip_prefix('{')?.split_once("} ")?;
            Some((labels, value.trim().parse().ok()?))
        })
        .collect()
}

/// CPU used over the run by each process, in seconds (clock ticks of 10 ms).
#[derive(Debug, Clone, Default)]
pub struct RunCpu {
    /// The window the CPU was counted over: the change until every workload rolled (and the
    /// scrape after it).
    pub window: Duration,
    /// (process, CPU seconds).
    pub per_process: Vec<(String, f64)>,
}

#[derive(Debug, Clone)]
pub struct Report {
    pub workloads: usize,
    pub namespaces: usize,
    pub load: String,
    /// `--kube-api-qps` of the running controller-manager (`None`: its default, 20).
    pub kcm_qps: Option<String>,
    /// Creating the N Deployments, then until the controller-manager had rolled them all out.
    pub created: Duration,
    pub caught_up: Duration,
    /// The watcher's start to its `synced` event, and the counts it reported.
    pub synced: Duration,
    pub synced_counts: String,
    /// From `synced` until every workload was decided once (object reads, restamps).
    pub decided: Duration,
    pub startup_reads: u64,
    pub startup_restamps: usize,
    /// The budget the watcher reported in its `started` event (cluster, per namespace).
    pub max_rolling: Option<u64>,
    pub max_rolling_per_namespace: Option<u64>,
    /// Each change, in order.
    pub changes: Vec<Change>,
    /// `helmop_rollout_rolling_peak` and `helmop_rollout_rolls_ended_total{how="complete"}` at the
    /// end, and its restamps by reason (`helmop_rollout_restamps_total`, start-up included).
    pub watcher_peak: Option<f64>,
    pub watcher_rolls_complete: Option<f64>,
    pub restamps_by_reason: Vec<(String, f64)>,
    /// RSS before the first change, when each change had rolled everything (`per_round`), 3 s after
    /// the last, `VmHWM` then; idle CPU before the first change and after the last.
    pub footprint: Footprint,
}

/// One cluster-wide change.
#[derive(Debug, Clone)]
pub struct Change {
    /// Writing the new data into every `ca-bundle`.
    pub written: Duration,
    /// The change (just before the writes) until every workload rolled.
    pub wall: Duration,
    pub started_at: Instant,
    pub rolled: Rolled,
    pub sampled: Sampled,
    /// The watcher's events during this change.
    pub restamped: usize,
    pub ineffective: usize,
    pub failed: usize,
    pub rolled_events: usize,
    pub cpu: RunCpu,
}

/// Namespace `k` of the bench.
fn namespace(k: usize) -> String {
    format!("budget-{k}")
}

/// Workload `i` of `n`: Deployment `w-i` (replicas 0) in namespace `i % namespaces`, mounting that
/// namespace's `ca-bundle`.
fn workload_json(i: usize, namespaces: usize, n: usize) -> Value {
    let name = format!("w-{i}");
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {
            "name": name,
            "namespace": namespace(i % namespaces.max(1)),
            "labels": {WORKLOAD_LABEL: format!("n{n}")},
        },
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "containers": [{
                        "name": "app",
                        "image": "registry.example.com/app:1.0",
                        "volumeMounts": [{"name": "ca", "mountPath": "/etc/ssl/bundle", "readOnly": true}],
                    }],
                    "volumes": [{"name": "ca", "configMap": {"name": BUNDLE}}],
                },
            },
        },
    })
}

/// A CA bundle's text for `version`: three PEM blocks of 1 KiB of (made-up) DER each, different
/// for every version.
fn ca_bundle(version: u32) -> String {
    let mut out = String::new();
    for block in 0..3u32 {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        for line in 0..16u32 {
            let bytes: Vec<u8> = (0..48u32)
                .map(|j| {
                    (version
                        .wrapping_mul(131)
                        .wrapping_add(block * 31 + line * 7 + j * 13)
                        % 251) as u8
                })
                .collect();
            out.push_str(&base64::engine::general_purpose::STANDARD.encode(bytes));
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

/// `ca-bundle` at `version` in every one of `namespaces` at once (merge PATCHes in parallel).
async fn write_bundles(client: &Client, namespaces: &[String], version: u32) -> anyhow::Result<()> {
    let data = json!({"data": {BUNDLE_KEY: ca_bundle(version)}});
    futures::future::try_join_all(namespaces.iter().map(|ns| {
        let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
        let data = &data;
        async move {
            api.patch(BUNDLE, &PatchParams::default(), &Patch::Merge(data))
                .await
                .with_context(|| format!("writing {ns}/{BUNDLE}"))
        }
    }))
    .await?;
    Ok(())
}

/// One workload's rollout after the change.
#[derive(Debug, Clone)]
struct Roll {
    restamp: Option<String>,
    /// The generation its restamp gave it.
    generation: i64,
    started: Instant,
    ended: Option<Instant>,
}

/// What the bench's watch saw: before the change, each Deployment's restamp and whether its
/// rollout is over; from the change on ([`Tracker::arm`]), the rollouts it set off.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    latest: HashMap<String, (Option<String>, bool)>,
    listed: bool,
    /// Each Deployment's restamp when the change was made; `None` before it.
    before: Option<HashMap<String, Option<String>>>,
    rolls: HashMap<String, Roll>,
    rolling: usize,
    per_namespace: HashMap<String, usize>,
    peak: usize,
    peak_namespace: usize,
    ended: usize,
    last_end: Option<Instant>,
    restamped_again: usize,
}

fn namespace_of(key: &str) -> &str {
    key.split_once('/').map_or(key, |(ns, _)| ns)
}

impl Tracker {
    /// Deployments seen so far whose latest rollout is not over.
    fn not_over(&self) -> usize {
        self.latest.values().filter(|(_, over)| !over).count()
    }

    /// A change is made now: the restamps seen so far are the ones before it, and the rollouts of a
    /// change before are forgotten.
    fn arm(&mut self) {
        self.rolls.clear();
        self.rolling = 0;
        self.per_namespace.clear();
        self.peak = 0;
        self.peak_namespace = 0;
        self.ended = 0;
        self.last_end = None;
        self.restamped_again = 0;
        self.before = Some(
            self.latest
                .iter()
                .map(|(k, (r, _))| (k.clone(), r.clone()))
                .collect(),
        );
    }

    /// When the last rollout ended, once every Deployment there at the change has rolled.
    fn done(&self) -> Option<Instant> {
        let before = self.before.as_ref()?;
        (self.ended >= before.len()).then_some(self.last_end?)
    }

    fn rolled(&self) -> Rolled {
        let durations: Vec<u64> = self
            .rolls
            .values()
            .filter_map(|r| r.ended.map(|e| e.saturating_duration_since(r.started)))
            .map(|d| d.as_nanos() as u64)
            .collect();
        let busy = Duration::from_nanos(durations.iter().sum());
        Rolled {
            restamped: self.rolls.len(),
            ended: self.ended,
            first_restamp: self.rolls.values().map(|r| r.started).min(),
            last_restamp: self.rolls.values().map(|r| r.started).max(),
            last_end: self.last_end,
            durations: Latencies::from_samples(durations),
            busy,
            peak: self.peak,
            peak_namespace: self.peak_namespace,
            restamped_again: self.restamped_again,
        }
    }
}

impl Absorb for Tracker {
    fn absorb(&mut self, observed: Observed) {
        let s = match observed {
            Observed::Listed => {
                self.listed = true;
                return;
            }
            Observed::Seen(s) => s,
        };
        self.latest
            .insert(s.key.clone(), (s.restamp.clone(), s.over));
        let Some(before) = self.before.as_ref().and_then(|b| b.get(&s.key)).cloned() else {
            return;
        };
        if !self.rolls.contains_key(&s.key) {
            if s.restamp == before {
                return;
            }
            self.rolling += 1;
            self.peak = self.peak.max(self.rolling);
            let in_namespace = self
                .per_namespace
                .entry(namespace_of(&s.key).to_owned())
                .or_default();
            *in_namespace += 1;
            self.peak_namespace = self.peak_namespace.max(*in_namespace);
            self.rolls.insert(
                s.key.clone(),
                Roll {
                    restamp: s.restamp.clone(),
                    generation: s.generation,
                    started: s.at,
                    ended: None,
                },
            );
        }
        let Some(roll) = self.rolls.get_mut(&s.key) else {
            return;
        };
        if roll.restamp != s.restamp {
            self.restamped_again += 1;
            roll.restamp = s.restamp.clone();
        }
        if roll.ended.is_none() && s.over && s.generation >= roll.generation {
            roll.ended = Some(s.at);
            self.rolling = self.rolling.saturating_sub(1);
            if let Some(n) = self.per_namespace.get_mut(namespace_of(&s.key)) {
                *n = n.saturating_sub(1);
            }
            self.ended += 1;
            self.last_end = Some(self.last_end.map_or(s.at, |l| l.max(s.at)));
        }
    }
}

/// The value of `--flag=VALUE` (or `--flag VALUE`) in a NUL-separated `/proc/PID/cmdline`.
fn flag_value(cmdline: &str, flag: &str) -> Option<String> {
    let mut args = cmdline.split('\0');
    while let Some(arg) = args.next() {
        if arg == flag {
            return args.next().map(str::to_owned);
        }
        if let Some(v) = arg.strip_prefix(flag).and_then(|r| r.strip_prefix('=')) {
            return Some(v.to_owned());
        }
    }
    None
}

fn cpu_of(pids: &[u32]) -> anyhow::Result<Vec<u64>> {
    pids.iter().map(|p| cpu_ticks(*p)).collect()
}

pub async fn run(s: &RolloutBudgetSettings) -> anyhow::Result<Report> {
    fixtures::require_plugin(&s.plugin_bin)?;
    let n = s.workloads.max(1);
    let load = load_average();
    eprintln!(
        "rollout-budget: starting a private control plane ({KCM_QPS_ENV}={}) ...",
        std::env::var(KCM_QPS_ENV).unwrap_or_else(|_| "unset".to_owned())
    );
    let cluster = fixtures::start(&[CLUSTER]).await?;
    let kcm = cluster.component_pid(CLUSTER, "controller-manager", "kube-controller-manager")?;
    let apiserver = cluster.component_pid(CLUSTER, "apiserver", "kube-apiserver")?;
    let etcd = cluster.component_pid(CLUSTER, "etcd", "etcd")?;
    let kcm_qps = std::fs::read(format!("/proc/{kcm}/cmdline"))
        .ok()
        .and_then(|c| flag_value(&String::from_utf8_lossy(&c), "--kube-api-qps"));
    let client = cluster.client.clone();
    ensure_hash_key(&client).await?;
    let webhook =
        LocalWebhook::start(client.clone(), helmop_webhook::state::Config::default()).await?;
    let names: Vec<String> = (0..s.namespaces.max(1)).map(namespace).collect();
    for ns in &names {
        fixtures::create_namespace(&client, ns, &[]).await?;
        let bundle = fixtures::config_map(
            ns,
            BUNDLE,
            BTreeMap::from([(BUNDLE_KEY.to_owned(), ca_bundle(0))]),
        );
        Api::<ConfigMap>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &bundle)
            .await
            .with_context(|| format!("creating {ns}/{BUNDLE}"))?;
    }
    opt_in(&client, &webhook, &names, |k| {
        workload_json(k, names.len(), 0)
    })
    .await?;

    eprintln!("rollout-budget: creating {n} Deployments ...");
    let created =
        create_workloads(&client, n, s.parallel, |i| workload_json(i, names.len(), n)).await?;
    let (mut rx, observer) = observe(&client, &format!("{WORKLOAD_LABEL}=n{n}"));
    let mut tracker = Tracker::default();
    until(
        &mut rx,
        &mut tracker,
        Duration::from_secs(300),
        "the bench's watch to list",
        |t| t.listed.then(Instant::now),
    )
    .await?;
    if tracker.latest.len() != n {
        bail!("{} Deployments listed, want {n}", tracker.latest.len());
    }
    eprintln!(
        "rollout-budget: created in {created:?}; waiting for the controller-manager to roll them out ..."
    );
    let catching_up = Instant::now();
    until(
        &mut rx,
        &mut tracker,
        CATCH_UP_TIMEOUT,
        "the controller-manager to roll out every new Deployment",
        |t| (t.not_over() == 0).then(Instant::now),
    )
    .await?;
    let caught_up = catching_up.elapsed();

    eprintln!(
        "rollout-budget: rolled out in {caught_up:?}; starting the watcher (brakes as shipped) ..."
    );
    let flags = watcher_flags(&[], &s.extra_args);
    let Started {
        process: mut watcher,
        started,
        port,
        synced,
        synced_counts,
    } = start_watcher(&s.plugin_bin, &cluster.info().kubeconfig, &flags).await?;
    let max_rolling = started["maxRolling"].as_u64();
    let max_rolling_per_namespace = started["maxRollingPerNamespace"].as_u64();
    eprintln!(
        "rollout-budget: synced in {synced:?} ({synced_counts}); budget {} ({} per namespace); deciding every workload ...",
        max_rolling.map_or("?".to_owned(), |m| m.to_string()),
        max_rolling_per_namespace.map_or("?".to_owned(), |m| m.to_string()),
    );
    let (decided, startup_reads) = wait_decided(port, names.len() as u64).await?;
    let startup_restamps = watcher.events_named("restamped").len();
    let pid = watcher.pid();
    let mut footprint = Footprint::default();
    settle(pid, &mut footprint, s.idle).await?;

    let pids = [pid, apiserver, etcd, kcm, std::process::id()];
    let mut changes = Vec::new();
    for version in 1..=u32::try_from(s.changes.max(1)).unwrap_or(u32::MAX) {
        if version > 1 {
            eprintln!(
                "rollout-budget: {:?} before the next change (--min-roll-interval) ...",
                s.pause
            );
            tokio::time::sleep(s.pause).await;
        }
        while let Ok(o) = rx.try_recv() {
            tracker.absorb(o);
        }
        let events_before = watcher.events().len();
        let change = change(
            s,
            &client,
            &names,
            version,
            port,
            &pids,
            &mut rx,
            &mut tracker,
        )
        .await?;
        footprint.per_round.push(sample(pid).rss_kib);
        let events: Vec<Value> = watcher.events().into_iter().skip(events_before).collect();
        let named = |name: &str| events.iter().filter(|e| e["event"] == name).count();
        eprintln!(
            "rollout-budget: change {version}: every workload rolled in {:?}; peak {} rolling at once; RSS {} MiB",
            change.wall,
            change.rolled.peak,
            mib(footprint.per_round.last().copied().unwrap_or(0)),
        );
        changes.push(Change {
            restamped: named("restamped"),
            ineffective: named("ineffective"),
            failed: named("failed"),
            rolled_events: named("rolled"),
            ..change
        });
    }
    let body = scrape(port).await?;
    eprintln!("rollout-budget: idle CPU for {:?} ...", s.idle);
    finish(pid, &mut footprint, s.idle).await?;
    let report = Report {
        workloads: n,
        namespaces: names.len(),
        load,
        kcm_qps,
        created,
        caught_up,
        synced,
        synced_counts,
        decided,
        startup_reads,
        startup_restamps,
        max_rolling,
        max_rolling_per_namespace,
        changes,
        watcher_peak: metric(&body, ROLLING_PEAK),
        watcher_rolls_complete: metric(&body, ROLLS_COMPLETE),
        restamps_by_reason: series(&body, RESTAMPS)
            .into_iter()
            .map(|(labels, v)| (labels.to_owned(), v))
            .collect(),
        footprint,
    };
    watcher.signal(15)?;
    watcher.wait_exit(Duration::from_secs(30)).await?;
    observer.abort();
    drop(webhook);
    Ok(report)
}

/// Change `version`: new data in every `ca-bundle`, then until every workload rolled. The
/// watcher's event counts are the caller's.
#[allow(clippy::too_many_arguments)]
async fn change(
    s: &RolloutBudgetSettings,
    client: &Client,
    names: &[String],
    version: u32,
    port: u16,
    pids: &[u32],
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<Observed>,
    tracker: &mut Tracker,
) -> anyhow::Result<Change> {
    tracker.arm();
    let ticks_before = cpu_of(pids)?;
    eprintln!(
        "rollout-budget: change {version}: writing a new {BUNDLE} into all {} namespaces ...",
        names.len()
    );
    let started_at = Instant::now();
    write_bundles(client, names, version).await?;
    let written = started_at.elapsed();
    let deadline = started_at + s.timeout;
    let mut sampled = Sampled::default();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    let done_at = loop {
        while let Ok(o) = rx.try_recv() {
            tracker.absorb(o);
        }
        if let Some(at) = tracker.done() {
            break at;
        }
        tokio::select! {
            o = rx.recv() => match o {
                Some(o) => tracker.absorb(o),
                None => bail!("the bench's watch ended while the workloads rolled"),
            },
            _ = tick.tick() => {
                sampled.absorb(&scrape(port).await?);
                if sampled.samples % 10 == 0 {
                    eprintln!(
                        "rollout-budget: {:.0} s: {} restamped, {} rolled, {} rolling (the watcher's gauge at most {}, {} parked at most)",
                        started_at.elapsed().as_secs_f64(),
                        tracker.rolls.len(),
                        tracker.ended,
                        tracker.rolling,
                        sampled.rolling_max,
                        sampled.parked_max,
                    );
                }
                if Instant::now() > deadline {
                    bail!(
                        "not every workload rolled within {:?} ({} restamped, {} rolled)",
                        s.timeout,
                        tracker.rolls.len(),
                        tracker.ended
                    );
                }
            }
        }
    };
    let ticks_after = cpu_of(pids)?;
    let window = started_at.elapsed();
    sampled.absorb(&scrape(port).await?);
    let per_process = PROCESSES
        .iter()
        .zip(ticks_before.iter().zip(&ticks_after))
        .map(|(name, (b, a))| ((*name).to_owned(), a.saturating_sub(*b) as f64 / 100.0))
        .collect();
    Ok(Change {
        written,
        wall: done_at.saturating_duration_since(started_at),
        started_at,
        rolled: tracker.rolled(),
        sampled,
        restamped: 0,
        ineffective: 0,
        failed: 0,
        rolled_events: 0,
        cpu: RunCpu {
            window,
            per_process,
        },
    })
}

/// The processes whose CPU a change counts, in the order of their pids.
const PROCESSES: [&str; 5] = [
    "watcher",
    "kube-apiserver",
    "etcd",
    "kube-controller-manager",
    "bench (webhook in-process, its watch)",
];

fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

/// `at` as seconds after the change.
fn since(start: Instant, at: Option<Instant>) -> String {
    at.map_or("-".to_owned(), |a| secs(a.saturating_duration_since(start)))
}

fn opt(v: Option<f64>) -> String {
    v.map_or("?".to_owned(), |v| format!("{v:.0}"))
}

pub fn table(r: &Report, s: &RolloutBudgetSettings) -> String {
    let flags = if s.extra_args.is_empty() {
        "none".to_owned()
    } else {
        format!("`{}`", s.extra_args.join(" "))
    };
    let budget = r.max_rolling.map_or("?".to_owned(), |m| m.to_string());
    let mut out = format!(
        "`rollout -A --watch --no-leader-election -o json` with its brakes as shipped (extra flags: {flags}; \
         MALLOC_ARENA_MAX=1) against one kube-apiserver with its kube-controller-manager running \
         (--kube-api-qps {qps}), the real webhook in-process; {n} opted-in Deployments (replicas 0) over \
         {ns} namespaces, each mounting its namespace's ConfigMap `{BUNDLE}`. A change: new data in all {ns} \
         `{BUNDLE}`s at once ({c} change(s), {p} s apart). A workload is rolling from when the bench's watch \
         delivers its new `helmop.dev/restamp` until its status says the rollout of that generation is over \
         (helmop_core::progress::roll_state).\n\n",
        qps = r.kcm_qps.as_deref().unwrap_or("default, 20"),
        n = r.workloads,
        ns = r.namespaces,
        c = r.changes.len(),
        p = s.pause.as_secs(),
    );
    out.push_str(&format!(
        "| workloads | load at start | Deployments created s | rolled out by the controller-manager s | synced s (listed) | every workload decided s (reads, restamps) | budget: cluster / namespace |\n\
         |---:|---|---:|---:|---|---|---|\n\
         | {} | {} | {} | {} | {:.2} ({}) | {:.2} ({}, {}) | {budget} / {} |\n\n",
        r.workloads,
        r.load,
        secs(r.created),
        secs(r.caught_up),
        r.synced.as_secs_f64(),
        r.synced_counts,
        r.decided.as_secs_f64(),
        r.startup_reads,
        r.startup_restamps,
        r.max_rolling_per_namespace
            .map_or("?".to_owned(), |m| m.to_string()),
    ));
    out.push_str(&format!(
        "| change | {} PATCHes written ms | first restamp landed s | every workload restamped s | every workload rolled s | rollouts/s (first restamp to last end) | one rollout p50 / p99 / max ms (mean) | rolling at once: peak seen / budget | peak in one namespace | mean rolling at once | watcher's gauges every 2 s: rolling / parked at most | restamped / ineffective / failed / rolled events (restamped twice) | watcher RSS MiB when all rolled |\n\
         |---:|---:|---:|---:|---:|---:|---|---|---:|---:|---|---|---:|\n",
        r.namespaces
    ));
    for (k, c) in r.changes.iter().enumerate() {
        let d = &c.rolled;
        let span = match (d.first_restamp, d.last_end) {
            (Some(a), Some(b)) => b.saturating_duration_since(a),
            _ => Duration::ZERO,
        };
        let rate = if span.is_zero() {
            "-".to_owned()
        } else {
            format!("{:.1}", d.ended as f64 / span.as_secs_f64())
        };
        let mean_rolling = if span.is_zero() {
            0.0
        } else {
            d.busy.as_secs_f64() / span.as_secs_f64()
        };
        let mean = if d.durations.is_empty() {
            Duration::ZERO
        } else {
            d.busy / d.durations.len() as u32
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {rate} | {} / {} / {} ({}) | {} / {budget} | {} | {mean_rolling:.2} | {} / {} | {} / {} / {} / {} ({}) | {} |\n",
            k + 1,
            ms(c.written),
            since(c.started_at, d.first_restamp),
            since(c.started_at, d.last_restamp),
            secs(c.wall),
            ms(d.durations.quantile(0.5)),
            ms(d.durations.quantile(0.99)),
            ms(d.durations.max()),
            ms(mean),
            d.peak,
            d.peak_namespace,
            opt(Some(c.sampled.rolling_max)),
            opt(Some(c.sampled.parked_max)),
            c.restamped,
            c.ineffective,
            c.failed,
            c.rolled_events,
            d.restamped_again,
            mib(r.footprint.per_round.get(k).copied().unwrap_or(0)),
        ));
    }
    let reasons = r
        .restamps_by_reason
        .iter()
        .map(|(labels, v)| format!("{labels} {v:.0}"))
        .collect::<Vec<_>>()
        .join(", ");
    out.push_str(&format!(
        "\nThe watcher at the end: helmop_rollout_rolling_peak {}, helmop_rollout_rolls_ended_total{{how=\"complete\"}} {}, \
         helmop_rollout_restamps_total {}.\n\n",
        opt(r.watcher_peak),
        opt(r.watcher_rolls_complete),
        if reasons.is_empty() { "-".to_owned() } else { reasons },
    ));
    let f = &r.footprint;
    out.push_str(&format!(
        "| watcher RSS MiB: before the changes / when each change had rolled everything / 3 s after the last | VmHWM MiB | threads | idle CPU ({} s) before / after |\n\
         |---|---:|---:|---|\n\
         | {} / {} / {} | {} | {} | {} / {} |\n\n",
        s.idle.as_secs(),
        mib(f.settled.rss_kib),
        f.per_round
            .iter()
            .map(|k| mib(*k))
            .collect::<Vec<_>>()
            .join(" / "),
        mib(f.after.rss_kib),
        mib(f.after_hwm_kib),
        f.after.threads,
        percent(f.idle_cpu_before),
        percent(f.idle_cpu_after),
    ));
    for (k, c) in r.changes.iter().enumerate() {
        let window = c.cpu.window.as_secs_f64();
        let cpu = c
            .cpu
            .per_process
            .iter()
            .map(|(name, seconds)| {
                let share = if window > 0.0 { seconds / window } else { 0.0 };
                format!("{name} {seconds:.1} s ({})", percent(share))
            })
            .collect::<Vec<_>>()
            .join(", ");
        out.push_str(&format!(
            "CPU of change {} over its {window:.1} s (share of one core): {cpu}.\n",
            k + 1
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rollout_watch::Seen;

    fn seen(
        key: &str,
        restamp: Option<&str>,
        generation: i64,
        over: bool,
        at: Instant,
    ) -> Observed {
        Observed::Seen(Seen {
            key: key.to_owned(),
            restamp: restamp.map(str::to_owned),
            stamp: None,
            generation,
            over,
            at,
        })
    }

    #[test]
    fn a_workload_rolls_from_its_new_restamp_until_its_rollout_of_that_generation_is_over() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut t = Tracker::default();
        t.absorb(seen("a/w-0", None, 1, false, at(0)));
        t.absorb(seen("a/w-1", Some("old"), 1, true, at(0)));
        t.absorb(Observed::Listed);
        assert_eq!(t.not_over(), 1);
        t.absorb(seen("a/w-0", None, 1, true, at(1)));
        assert_eq!(t.not_over(), 0);
        t.arm();
        assert_eq!(t.done(), None);
        // Status writes before the restamp change nothing.
        t.absorb(seen("a/w-0", None, 1, true, at(5)));
        assert_eq!(t.rolling, 0);
        t.absorb(seen("a/w-0", Some("new"), 2, false, at(10)));
        t.absorb(seen("a/w-1", Some("new"), 2, false, at(20)));
        assert_eq!((t.rolling, t.peak, t.peak_namespace), (2, 2, 2));
        // An old status of the earlier generation does not end it.
        t.absorb(seen("a/w-0", Some("new"), 1, true, at(25)));
        assert_eq!(t.rolling, 2);
        t.absorb(seen("a/w-0", Some("new"), 2, true, at(40)));
        assert_eq!(t.rolling, 1);
        assert_eq!(t.done(), None);
        t.absorb(seen("a/w-1", Some("new"), 2, true, at(100)));
        assert_eq!(t.done(), Some(at(100)));
        let r = t.rolled();
        assert_eq!((r.restamped, r.ended, r.peak), (2, 2, 2));
        assert_eq!(r.durations.max(), Duration::from_millis(80));
        assert_eq!(r.busy, Duration::from_millis(110));
        assert_eq!(r.first_restamp, Some(at(10)));
        assert_eq!(r.last_restamp, Some(at(20)));
        assert_eq!(r.restamped_again, 0);
    }

    #[test]
    fn peaks_count_in_the_cluster_and_per_namespace_and_a_second_restamp_is_counted() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        for key in ["a/x", "a/y", "b/x"] {
            t.absorb(seen(key, None, 1, true, t0));
        }
        t.arm();
        t.absorb(seen("a/x", Some("1"), 2, false, t0));
        t.absorb(seen("b/x", Some("1"), 2, false, t0));
        t.absorb(seen("a/x", Some("1"), 2, true, t0));
        t.absorb(seen("a/y", Some("1"), 2, false, t0));
        assert_eq!((t.peak, t.peak_namespace), (2, 1));
        // Restamped again after it rolled: counted, not a second rollout.
        t.absorb(seen("a/x", Some("2"), 3, false, t0));
        assert_eq!(t.restamped_again, 1);
        assert_eq!(t.rolling, 2);
        // A Deployment created after the change is not the change's.
        t.absorb(seen("c/new", Some("1"), 2, false, t0));
        assert_eq!(t.rolling, 2);
        t.absorb(seen("a/y", Some("1"), 2, true, t0));
        t.absorb(seen("b/x", Some("1"), 2, true, t0));
        assert_eq!(t.done(), Some(t0));
        // The next change starts from what was seen last, afresh.
        t.arm();
        assert_eq!(t.done(), None);
        assert_eq!((t.peak, t.restamped_again, t.rolled().restamped), (0, 0, 0));
        t.absorb(seen("a/y", Some("1"), 2, true, t0));
        assert_eq!(t.rolling, 0, "the restamp of the change before");
        t.absorb(seen("a/y", Some("3"), 3, false, t0));
        assert_eq!(t.rolling, 1);
    }

    #[test]
    fn a_restamp_that_did_not_change_the_template_ends_at_once() {
        let t0 = Instant::now();
        let mut t = Tracker::default();
        t.absorb(seen("a/x", Some("0"), 4, true, t0));
        t.arm();
        t.absorb(seen("a/x", Some("1"), 4, true, t0));
        assert_eq!((t.rolling, t.peak, t.ended), (0, 1, 1));
        assert_eq!(t.done(), Some(t0));
    }

    #[test]
    fn workloads_spread_over_the_namespaces_and_mount_its_bundle() {
        let w = workload_json(23, 20, 100);
        assert_eq!(w["metadata"]["namespace"], "budget-3");
        assert_eq!(w["metadata"]["name"], "w-23");
        assert_eq!(w["metadata"]["labels"][WORKLOAD_LABEL], "n100");
        assert_eq!(w["spec"]["replicas"], 0);
        assert_eq!(
            w["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"],
            BUNDLE
        );
        let names: std::collections::HashSet<String> = (0..100)
            .map(|i| workload_json(i, 20, 100)["metadata"]["namespace"].to_string())
            .collect();
        assert_eq!(names.len(), 20);
    }

    #[test]
    fn every_bundle_version_differs_and_looks_like_pem() {
        let (a, b) = (ca_bundle(0), ca_bundle(1));
        assert_ne!(a, b);
        assert_eq!(a.matches("-----BEGIN CERTIFICATE-----").count(), 3);
        assert!(a.len() > 3 * 1024 && a.len() < 8 * 1024, "{}", a.len());
        assert_eq!(ca_bundle(7), ca_bundle(7));
    }

    #[test]
    fn flags_are_read_from_a_command_line() {
        let cmdline = [
            "/bin/kube-controller-manager",
            "--v=1",
            "--kube-api-qps=500",
            "--kube-api-burst",
            "1000",
        ]
        .join("\0");
        let cmdline = cmdline.as_str();
        assert_eq!(
            flag_value(cmdline, "--kube-api-qps"),
            Some("500".to_owned())
        );
        assert_eq!(
            flag_value(cmdline, "--kube-api-burst"),
            Some("1000".to_owned())
        );
        assert_eq!(flag_value(cmdline, "--kube-api"), None);
        assert_eq!(flag_value("x\0--v=1\0", "--kube-api-qps"), None);
    }

    #[test]
    fn labelled_series_are_read() {
        let body = "# HELP x\nhelmop_rollout_restamps_total{reason=\"object-changed\"} 200\nhelmop_rollout_restamps_total{reason=\"budget\"} 3\nhelmop_rollout_restamps_total_x{a=\"b\"} 1\nhelmop_rollout_rolling 2\n";
        assert_eq!(
            series(body, RESTAMPS),
            [
                ("reason=\"object-changed\"", 200.0),
                ("reason=\"budget\"", 3.0)
            ]
        );
        assert!(series(body, ROLLING).is_empty());
    }

    #[test]
    fn the_control_plane_variable_follows_the_flag() {
        assert_eq!(kcm_qps_env(0), None);
        assert_eq!(kcm_qps_env(500), Some("500".to_owned()));
    }
}
