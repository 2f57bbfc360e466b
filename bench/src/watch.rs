//! `helmop-bench watch`: what `kubectl-helmop propagate --watch` (the built binary) costs and how fast it
//! is. Per fleet size N and `--debounce`: end-to-end latency of a source edit upstream until (a) every copy
//! downstream holds the new content and (b) every reader Deployment downstream has a new ReplicaSet (the
//! real admission webhook restamps it, a real kube-controller-manager rolls it), and the watcher process's
//! RSS, threads, open sockets and CPU while idle, before and after the edits (does memory grow with the
//! number of edits handled?).
//!
//! Times are taken when the bench's own watches on the downstream API servers deliver the change, so no
//! polling load distorts the watcher; the bench, the webhooks, the watcher and every API server share the
//! machine's CPUs.
//!
//! With `--downstream fleetsim` the N Clusters are N simulated clusters ([`crate::fleet::sim`]) behind one
//! real upstream API server (all of the watcher's watches are upstream). There is no webhook and no
//! controller-manager downstream, so (b) becomes: until every reader Deployment carries the plugin's new
//! `helmop.dev/restamp` (the merge patch has landed). Times are those at which fleetsim's store took the
//! writes, from its write notifications.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use helmop_core::names;
use helmop_tests::{
    ClusterInfo, LocalWebhook, PluginProcess, TEST_NAMESPACE_LABEL, WebhookKind,
    WebhookRegistration, WebhookRule, ensure_hash_key, register_fleet_cluster,
};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc};

use crate::fixtures;
use crate::fleet::churn::{Churn, ChurnSettings};
use crate::fleet::route;
use crate::fleet::sim::{self, Written};
use crate::machine::rss_kib;
use crate::stats::{Latencies, mib, ms, percent};

/// What the Fleet Clusters point at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Downstream {
    /// `--apiservers` real kube-apiservers, each with the webhook and a kube-controller-manager.
    Apiservers,
    /// One simulated cluster per Fleet Cluster ([`crate::fleet::sim`]).
    Fleetsim,
}

#[derive(Debug, Clone)]
pub struct WatchSettings {
    pub plugin_bin: PathBuf,
    pub downstream: Downstream,
    /// Downstream API servers (besides the upstream one; real downstream only).
    pub apiservers: usize,
    /// Fleet Clusters (each targeted into its own namespace, spread round-robin over the API servers).
    pub clusters: Vec<usize>,
    /// Sources per HelmOp (half Secrets, half ConfigMaps); the readers read `res-1`, a ConfigMap.
    pub resources: usize,
    /// Source edits per configuration.
    pub edits: usize,
    /// `--debounce` values, each a separate watcher.
    pub debounces: Vec<String>,
    /// Length of each idle CPU measurement.
    pub idle: Duration,
    /// Pause between the end of one edit's rollout and the next edit.
    pub gap: Duration,
    /// Extra flags for the watcher.
    pub extra_args: Vec<String>,
    /// Fleet-like status churn upstream while measuring: every Cluster checks in and the HelmOp's
    /// status is rewritten once per this interval ([`crate::fleet::churn`]); `None` for a quiet fleet.
    pub churn: Option<Duration>,
}

/// The watcher process at one moment.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    pub rss_kib: u64,
    pub threads: u64,
    pub sockets: u64,
}

#[derive(Debug, Clone)]
pub struct Row {
    pub clusters: usize,
    pub debounce: String,
    /// Downstream clusters and rows of the watcher's first run (`summary.clusters`, `summary.states`).
    pub first_run: String,
    /// Per edit: until every copy held the new content.
    pub copies: Latencies,
    /// Per edit: until every reader had a new ReplicaSet (fleetsim: a new restamp).
    pub rollouts: Latencies,
    pub settled: ProcSample,
    pub after_edits: ProcSample,
    /// RSS after each edit, KiB.
    pub rss_per_edit: Vec<u64>,
    /// Share of one CPU used while idle, before and after the edits.
    pub idle_cpu_before: f64,
    pub idle_cpu_after: f64,
    /// Runs the watcher reported.
    pub runs: usize,
    /// Runs started during the idle windows before / after the edits (with churn on: runs status
    /// writes started, the goal is none).
    pub idle_runs: (usize, usize),
    /// Status writes the churn made while the watcher ran.
    pub churn_writes: u64,
}

/// `/proc/PID/stat` utime + stime, in clock ticks (USER_HZ, 100 on Linux).
pub fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // The command name may hold spaces: fields are counted after its closing parenthesis.
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat(5); `rest` starts at field 3.
    let utime: u64 = fields.get(11).context("no utime")?.parse()?;
    let stime: u64 = fields.get(12).context("no stime")?.parse()?;
    Ok(utime + stime)
}

const USER_HZ: f64 = 100.0;

/// RSS, threads and open sockets of `pid` now.
pub fn sample(pid: u32) -> ProcSample {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let threads = status
        .lines()
        .find(|l| l.starts_with("Threads:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0);
    let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| {
            dir.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_link(e.path()).ok())
                .filter(|l| l.to_string_lossy().starts_with("socket:"))
                .count() as u64
        })
        .unwrap_or(0);
    ProcSample {
        rss_kib: rss_kib(&pid.to_string()).unwrap_or(0),
        threads,
        sockets,
    }
}

/// CPU used by `pid` over `window`, as a share of one CPU.
pub async fn idle_cpu(pid: u32, window: Duration) -> anyhow::Result<f64> {
    let before = cpu_ticks(pid)?;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let used = cpu_ticks(pid)?.saturating_sub(before) as f64 / USER_HZ;
    Ok(used / started.elapsed().as_secs_f64())
}

/// One reader slot: a destination namespace on a downstream cluster (a real API server, or the
/// simulated cluster of that index).
struct Slot {
    server: usize,
    namespace: String,
}

/// A change downstream, with the instant it happened (or was seen).
enum Seen {
    Copy {
        slot: usize,
        value: Option<String>,
        at: Instant,
    },
    /// A reader's new ReplicaSet (its pod template's config hash), or with fleetsim its new restamp.
    Mark {
        slot: usize,
        mark: Option<String>,
        at: Instant,
    },
    /// Write notifications fleetsim dropped because the bench fell behind.
    Lost(u64),
}

const EDITED: &str = "res-1";
const READER: &str = "reader";
const CONFIG_HASH: &str = "helmop.dev/config-hash";
/// The destination namespace on every simulated cluster.
const SIM_DEST: &str = "dest";

fn spawn_watches(client: Client, slot: usize, namespace: &str, tx: mpsc::UnboundedSender<Seen>) {
    let copies: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let copy_tx = tx.clone();
    tokio::spawn(async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={EDITED}"));
        let mut stream = std::pin::pin!(watcher::watcher(copies, config));
        while let Some(event) = stream.next().await {
            if let Ok(Event::Apply(cm) | Event::InitApply(cm)) = event {
                let value = cm.data.and_then(|d| d.get("value").cloned());
                let at = Instant::now();
                if copy_tx.send(Seen::Copy { slot, value, at }).is_err() {
                    return;
                }
            }
        }
    });
    let sets: Api<ReplicaSet> = Api::namespaced(client, namespace);
    tokio::spawn(async move {
        let config = watcher::Config::default().labels(&format!("app={READER}"));
        let mut stream = std::pin::pin!(watcher::watcher(sets, config));
        while let Some(event) = stream.next().await {
            if let Ok(Event::Apply(rs) | Event::InitApply(rs)) = event {
                let mark = rs
                    .spec
                    .template
                    .and_then(|t| t.metadata)
                    .and_then(|m| m.annotations)
                    .and_then(|a| a.get(CONFIG_HASH).cloned());
                let at = Instant::now();
                if tx.send(Seen::Mark { slot, mark, at }).is_err() {
                    return;
                }
            }
        }
    });
}

/// What a fleetsim write means to the bench: the edited copy or a reader in a destination namespace.
fn seen_in_fleetsim(w: &Written) -> Option<Seen> {
    if w.namespace.as_deref() != Some(SIM_DEST) || w.verb == "DELETE" {
        return None;
    }
    let (slot, at) = (w.cluster, w.at);
    match (w.plural, w.name.as_str()) {
        ("configmaps", EDITED) => Some(Seen::Copy {
            slot,
            value: w
                .object
                .pointer("/data/value")
                .and_then(Value::as_str)
                .map(str::to_owned),
            at,
        }),
        ("deployments", READER) => Some(Seen::Mark {
            slot,
            mark: w
                .object
                .pointer("/metadata/annotations")
                .and_then(|a| a.get(names::ANN_RESTAMP))
                .and_then(Value::as_str)
                .map(str::to_owned),
            at,
        }),
        _ => None,
    }
}

/// Forwards fleetsim's write notifications as [`Seen`] (stops when the bench stops listening).
fn forward_writes(mut written: broadcast::Receiver<Arc<Written>>, tx: mpsc::UnboundedSender<Seen>) {
    tokio::spawn(async move {
        loop {
            let seen = match written.recv().await {
                Ok(w) => seen_in_fleetsim(&w),
                Err(broadcast::error::RecvError::Lagged(n)) => Some(Seen::Lost(n)),
                Err(broadcast::error::RecvError::Closed) => return,
            };
            if let Some(seen) = seen
                && tx.send(seen).is_err()
            {
                return;
            }
        }
    });
}

/// The latest state per slot, from the watch events or write notifications.
#[derive(Default)]
struct State {
    /// The edited copy's value and since when it holds it.
    copy: BTreeMap<usize, (Option<String>, Instant)>,
    /// Every reader mark seen, with when it was first seen.
    marks: BTreeMap<usize, BTreeMap<String, Instant>>,
    lost: u64,
}

impl State {
    /// Applies what the downstream side reported.
    fn absorb(&mut self, seen: Seen) {
        match seen {
            Seen::Copy { slot, value, at } => {
                // A write that leaves the value as it was (an unchanged apply) is not when it changed.
                if self.copy.get(&slot).is_none_or(|(v, _)| *v != value) {
                    self.copy.insert(slot, (value, at));
                }
            }
            Seen::Mark {
                slot,
                mark: Some(mark),
                at,
            } => {
                self.marks
                    .entry(slot)
                    .or_default()
                    .entry(mark)
                    .or_insert(at);
            }
            Seen::Mark { mark: None, .. } => {}
            Seen::Lost(n) => self.lost += n,
        }
    }

    /// When the last of `slots` came to hold `value`, once all hold it.
    fn copies_hold(&self, slots: usize, value: &str) -> Option<Instant> {
        (0..slots)
            .map(|i| match self.copy.get(&i) {
                Some((Some(v), at)) if v == value => Some(*at),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .map(|ats| ats.into_iter().max().unwrap_or_else(Instant::now))
    }

    /// The marks each slot has had so far.
    fn known_marks(&self) -> BTreeMap<usize, BTreeSet<String>> {
        self.marks
            .iter()
            .map(|(slot, m)| (*slot, m.keys().cloned().collect()))
            .collect()
    }

    /// When the last of `slots` got its first mark not in `known`, once all have one.
    fn new_marks(
        &self,
        slots: usize,
        known: &BTreeMap<usize, BTreeSet<String>>,
    ) -> Option<Instant> {
        (0..slots)
            .map(|i| {
                let old = known.get(&i);
                self.marks.get(&i).and_then(|m| {
                    m.iter()
                        .filter(|(mark, _)| old.is_none_or(|o| !o.contains(*mark)))
                        .map(|(_, at)| *at)
                        .min()
                })
            })
            .collect::<Option<Vec<_>>>()
            .map(|ats| ats.into_iter().max().unwrap_or_else(Instant::now))
    }
}

fn reader(namespace: &str) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(reader_json(namespace))?)
}

fn reader_json(namespace: &str) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": READER, "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": READER}},
            "template": {
                "metadata": {"labels": {"app": READER}},
                "spec": {"containers": [{
                    "name": "app",
                    "image": "registry.example.com/app:1.0",
                    "envFrom": [{"configMapRef": {"name": EDITED}}],
                }]},
            },
        },
    })
}

/// What the Fleet Clusters of one configuration point at.
enum Side<'a> {
    Real {
        downstream: &'a [ClusterInfo],
        clients: &'a [Client],
        webhooks: &'a [LocalWebhook],
    },
    Sim(&'a sim::Fleet),
}

impl Side<'_> {
    /// Destination namespace `slot` (opted in to rolling on change; with real API servers, the webhook
    /// registered for it; with fleetsim, its reader created too: nothing would restamp a reader created
    /// after the first run) and the endpoint its Fleet Cluster points at.
    async fn prepare_slot(&self, namespace: &str, c: usize) -> anyhow::Result<(Slot, ClusterInfo)> {
        let opt_in = |dest: &str| -> Vec<(String, String)> {
            vec![
                (TEST_NAMESPACE_LABEL.to_owned(), dest.to_owned()),
                (
                    names::LABEL_ROLLOUT_ON_CHANGE.to_owned(),
                    "enabled".to_owned(),
                ),
            ]
        };
        match self {
            Side::Real {
                downstream,
                clients,
                webhooks,
            } => {
                let server = c % downstream.len();
                let dest = format!("{namespace}-c{c}");
                let labels = opt_in(&dest);
                let labels: Vec<(&str, &str)> = labels
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str()))
                    .collect();
                fixtures::create_namespace(&clients[server], &dest, &labels).await?;
                WebhookRegistration::new(
                    WebhookKind::Mutating,
                    &format!("{dest}-workloads"),
                    &format!("{}/mutate/workloads", webhooks[server].url),
                    &webhooks[server].ca_pem,
                )
                .rule(WebhookRule::new(
                    &["CREATE", "UPDATE"],
                    "apps",
                    "v1",
                    &["deployments"],
                ))
                .only_namespace(&dest)
                .register(&clients[server])
                .await?;
                Ok((
                    Slot {
                        server,
                        namespace: dest,
                    },
                    downstream[server].clone(),
                ))
            }
            Side::Sim(fleet) => {
                let kind = |plural: &str| {
                    route::KINDS
                        .iter()
                        .find(|k| k.plural == plural)
                        .context("fleetsim serves no such kind")
                };
                let (namespaces, deployments) = (kind("namespaces")?, kind("deployments")?);
                let labels: serde_json::Map<String, Value> = opt_in(SIM_DEST)
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect();
                fleet.clusters[c]
                    .with_store(|store| {
                        store.create(
                            namespaces,
                            None,
                            json!({"metadata": {"name": SIM_DEST, "labels": labels}}),
                            "helmop-bench",
                        )?;
                        store.create(
                            deployments,
                            Some(SIM_DEST),
                            reader_json(SIM_DEST),
                            "helmop-bench",
                        )
                    })
                    .map_err(|e| anyhow::anyhow!("fleetsim cluster {c}: {}", e.message))?;
                Ok((
                    Slot {
                        server: c,
                        namespace: SIM_DEST.to_owned(),
                    },
                    fleet.infos[c].clone(),
                ))
            }
        }
    }

    /// Starts reporting the copies and readers of `slots` downstream.
    fn observe(&self, slots: &[Slot]) -> mpsc::UnboundedReceiver<Seen> {
        let (tx, rx) = mpsc::unbounded_channel();
        match self {
            Side::Real { clients, .. } => {
                for (i, slot) in slots.iter().enumerate() {
                    spawn_watches(clients[slot.server].clone(), i, &slot.namespace, tx.clone());
                }
            }
            Side::Sim(fleet) => forward_writes(fleet.subscribe(), tx),
        }
        rx
    }

    /// Creates the readers where they are created once the copies exist (real API servers: the
    /// webhook stamps them from the copies).
    async fn create_readers(&self, slots: &[Slot]) -> anyhow::Result<()> {
        let Side::Real { clients, .. } = self else {
            return Ok(());
        };
        for slot in slots {
            Api::<Deployment>::namespaced(clients[slot.server].clone(), &slot.namespace)
                .create(&PostParams::default(), &reader(&slot.namespace)?)
                .await
                .with_context(|| format!("creating the reader in {}", slot.namespace))?;
        }
        Ok(())
    }
}

/// Upstream namespace, sources, N Clusters and the HelmOp; downstream the destination namespaces.
async fn prepare(
    upstream: &Client,
    side: &Side<'_>,
    namespace: &str,
    clusters: usize,
    resources: usize,
) -> anyhow::Result<Vec<Slot>> {
    fixtures::create_namespace(upstream, namespace, &[]).await?;
    let entries =
        fixtures::create_sources(upstream, namespace, resources.max(2), "initial").await?;
    let mut targets = Vec::new();
    let mut slots = Vec::new();
    let mut endpoints = Vec::new();
    for c in 0..clusters {
        let (slot, endpoint) = side.prepare_slot(namespace, c).await?;
        let name = format!("c{c}");
        targets.push(json!({"name": name, "clusterName": name, "namespace": slot.namespace}));
        slots.push(slot);
        endpoints.push((name, endpoint));
    }
    // One by one, 1000 Clusters (a Secret and a Cluster each) took minutes.
    futures::stream::iter(&endpoints)
        .map(|(name, endpoint)| {
            register_fleet_cluster(upstream, namespace, name, &[("bench", "yes")], endpoint)
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    fixtures::apply_app_helmop(upstream, namespace, &entries, &targets).await?;
    Ok(slots)
}

/// Receives downstream changes until `done` gives the instant its condition came to hold, or `timeout`
/// passes.
async fn until(
    rx: &mut mpsc::UnboundedReceiver<Seen>,
    state: &mut State,
    timeout: Duration,
    what: &str,
    done: impl Fn(&State) -> Option<Instant>,
) -> anyhow::Result<Instant> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if state.lost > 0 {
            bail!(
                "fleetsim dropped {} write notifications while waiting for {what}: the bench fell behind",
                state.lost
            );
        }
        if let Some(at) = done(state) {
            return Ok(at);
        }
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(seen)) => state.absorb(seen),
            Ok(None) => bail!("the downstream observation ended while waiting for {what}"),
            Err(_) => bail!("timed out after {timeout:?} waiting for {what}"),
        }
    }
}

async fn one(
    settings: &WatchSettings,
    upstream: &ClusterInfo,
    upstream_client: &Client,
    side: &Side<'_>,
    n: usize,
    debounce: &str,
    index: usize,
) -> anyhow::Result<Row> {
    let namespace = format!("watch-{index}-n{n}");
    eprintln!("watch: {n} clusters: preparing ...");
    let slots = prepare(upstream_client, side, &namespace, n, settings.resources).await?;
    let mut rx = side.observe(&slots);
    let kubeconfig = upstream.kubeconfig.display().to_string();
    let mut args = vec![
        "propagate",
        "-n",
        &namespace,
        "--watch",
        "--no-leader-election",
        "-o",
        "json",
        "--debounce",
        debounce,
        "--kubeconfig",
        &kubeconfig,
    ];
    args.extend(settings.extra_args.iter().map(String::as_str));
    eprintln!("watch: {n} clusters, --debounce {debounce}: starting the watcher ...");
    let mut watcher = PluginProcess::spawn_binary(&settings.plugin_bin, &args, &[])?;
    let first = watcher
        .wait_event("the first run", Duration::from_secs(600), 0, |e| {
            e["event"] == "run"
        })
        .await?;
    let first_run = format!(
        "{} clusters: {}",
        first
            .pointer("/report/summary/clusters")
            .or_else(|| first.pointer("/summary/clusters"))
            .map_or("?".to_owned(), Value::to_string),
        first
            .pointer("/report/summary/states")
            .or_else(|| first.pointer("/summary/states"))
            .map_or("?".to_owned(), Value::to_string),
    );

    let mut state = State::default();
    let all = slots.len();
    until(
        &mut rx,
        &mut state,
        Duration::from_secs(600),
        "every copy",
        |s| s.copies_hold(all, "initial"),
    )
    .await?;
    side.create_readers(&slots).await?;
    let none = BTreeMap::new();
    until(
        &mut rx,
        &mut state,
        Duration::from_secs(600),
        "the readers' first marks (ReplicaSets stamped, or fleetsim restamps)",
        |s| s.new_marks(all, &none),
    )
    .await?;
    let pid = watcher.pid();
    // Let the start-up work (watches listing, the first run's allocations) settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let churn = settings.churn.map(|interval| {
        Churn::start(
            upstream_client.clone(),
            ChurnSettings {
                namespace: namespace.clone(),
                clusters: (0..n).map(|c| format!("c{c}")).collect(),
                helmops: vec![fixtures::APP_HELMOP.to_owned()],
                interval,
            },
        )
    });
    let settled = sample(pid);
    eprintln!("watch: idle CPU for {:?} ...", settings.idle);
    let runs_before_idle = watcher.events_named("run").len();
    let idle_cpu_before = idle_cpu(pid, settings.idle).await?;
    let idle_runs_before = watcher.events_named("run").len() - runs_before_idle;

    let cms: Api<ConfigMap> = Api::namespaced(upstream_client.clone(), &namespace);
    let mut copies = Vec::new();
    let mut rollouts = Vec::new();
    let mut rss_per_edit = Vec::new();
    for edit in 0..settings.edits {
        while let Ok(seen) = rx.try_recv() {
            state.absorb(seen);
        }
        let known = state.known_marks();
        let value = format!("edit-{edit}");
        let events_before = watcher.events().len();
        let started = Instant::now();
        cms.patch(
            EDITED,
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"value": value}})),
        )
        .await
        .with_context(|| format!("editing ConfigMap {namespace}/{EDITED}"))?;
        let copied = until(
            &mut rx,
            &mut state,
            Duration::from_secs(300),
            "every copy to change",
            |s| s.copies_hold(all, &value),
        )
        .await?;
        let rolled = until(
            &mut rx,
            &mut state,
            Duration::from_secs(300),
            "a new mark on every reader",
            |s| s.new_marks(all, &known),
        )
        .await?;
        copies.push(copied.saturating_duration_since(started).as_nanos() as u64);
        rollouts.push(rolled.saturating_duration_since(started).as_nanos() as u64);
        // The next edit must not fall into this edit's run.
        watcher
            .wait_event(
                "the run of this edit",
                Duration::from_secs(300),
                events_before,
                |e| e["event"] == "run",
            )
            .await?;
        rss_per_edit.push(sample(pid).rss_kib);
        eprintln!(
            "watch: edit {}/{}: copies {}, readers {} ms",
            edit + 1,
            settings.edits,
            ms(Duration::from_nanos(*copies.last().unwrap_or(&0))),
            ms(Duration::from_nanos(*rollouts.last().unwrap_or(&0))),
        );
        tokio::time::sleep(settings.gap).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_edits = sample(pid);
    let runs_before_idle = watcher.events_named("run").len();
    let idle_cpu_after = idle_cpu(pid, settings.idle).await?;
    let runs = watcher.events_named("run").len();
    let idle_runs_after = runs - runs_before_idle;
    let churn_writes = match churn {
        Some(churn) => churn.stop().await?,
        None => 0,
    };
    watcher.signal(15)?;
    watcher.wait_exit(Duration::from_secs(30)).await?;
    Ok(Row {
        clusters: n,
        debounce: debounce.to_owned(),
        first_run,
        copies: Latencies::from_samples(copies),
        rollouts: Latencies::from_samples(rollouts),
        settled,
        after_edits,
        rss_per_edit,
        idle_cpu_before,
        idle_cpu_after,
        runs,
        idle_runs: (idle_runs_before, idle_runs_after),
        churn_writes,
    })
}

pub async fn run(settings: &WatchSettings) -> anyhow::Result<Vec<Row>> {
    fixtures::require_plugin(&settings.plugin_bin)?;
    let cluster = match settings.downstream {
        Downstream::Apiservers => fixtures::start_with_downstreams(settings.apiservers).await?,
        Downstream::Fleetsim => fixtures::start(&["upstream"]).await?,
    };
    let upstream = cluster.cp.clusters[0].clone();
    let downstream: Vec<ClusterInfo> = cluster.cp.clusters[1..].to_vec();
    let mut clients = Vec::new();
    let mut webhooks = Vec::new();
    if settings.downstream == Downstream::Apiservers {
        for d in &downstream {
            let client = d.client().await;
            ensure_hash_key(&client).await?;
            webhooks.push(
                LocalWebhook::start(client.clone(), helmop_webhook::state::Config::default())
                    .await?,
            );
            clients.push(client);
        }
    }
    let mut rows = Vec::new();
    let mut index = 0;
    for &n in &settings.clusters {
        for debounce in &settings.debounces {
            index += 1;
            let fleet;
            let side = match settings.downstream {
                Downstream::Apiservers => Side::Real {
                    downstream: &downstream,
                    clients: &clients,
                    webhooks: &webhooks,
                },
                Downstream::Fleetsim => {
                    // A fleet per configuration: each starts without copies.
                    fleet = sim::Fleet::start(n).await?;
                    Side::Sim(&fleet)
                }
            };
            rows.push(
                one(
                    settings,
                    &upstream,
                    &cluster.client,
                    &side,
                    n,
                    debounce,
                    index,
                )
                .await?,
            );
        }
    }
    Ok(rows)
}

/// RSS after edits 1, 5, 10 and the last, as far as there were edits: `16.9 / 17.1 / 17.3 (20: 17.3)`.
fn rss_series(per_edit: &[u64]) -> String {
    let at = |edit: usize| per_edit.get(edit - 1).map(|k| mib(*k));
    let mut out: Vec<String> = [1, 5, 10].into_iter().filter_map(at).collect();
    if per_edit.len() > 10
        && let Some(last) = per_edit.last()
    {
        out.push(format!("({}: {})", per_edit.len(), mib(*last)));
    }
    if out.is_empty() {
        "-".to_owned()
    } else {
        out.join(" / ")
    }
}

pub fn table(rows: &[Row], settings: &WatchSettings) -> String {
    let setup = match settings.downstream {
        Downstream::Apiservers => format!(
            "spread round-robin over {} downstream kube-apiservers, each Cluster into its own namespace; one \
             reader Deployment per destination namespace (envFrom the edited ConfigMap), stamped by the real \
             webhook, rolled by a real kube-controller-manager; latency from the PATCH upstream to the bench's \
             watch event downstream",
            settings.apiservers
        ),
        Downstream::Fleetsim => "each a simulated cluster (fleetsim, one listener each) behind one real upstream \
             kube-apiserver; one reader Deployment per cluster (envFrom the edited ConfigMap), no webhook and no \
             controller-manager, so \"reader\" means the plugin's restamp merge patch has landed; latency from the \
             PATCH upstream to the instant fleetsim's store took the write"
            .to_owned(),
    };
    let churn = match settings.churn {
        Some(interval) => format!(
            "Status churn on throughout: every Cluster's agent checks in (`status.agent.lastSeen`) and the \
             HelmOp's status is rewritten once per {} s, spread evenly",
            interval.as_secs()
        ),
        None => "No status churn (a quiet fleet)".to_owned(),
    };
    let mut out = format!(
        "`propagate --watch` over N Fleet Clusters {setup}. {} sources per HelmOp, {} edits per row \
         (nearest-rank percentiles over edits, each edit the slowest cluster). {churn}.\n\n\
         | clusters | --debounce | first run | edit -> every copy p50 / p99 / max ms | edit -> every reader {} p50 / p99 / max ms | runs |\n\
         |---:|---|---|---|---|---:|\n",
        settings.resources,
        settings.edits,
        match settings.downstream {
            Downstream::Apiservers => "rolled",
            Downstream::Fleetsim => "restamped",
        },
    );
    let pct = |l: &Latencies| {
        format!(
            "{} / {} / {}",
            ms(l.quantile(0.5)),
            ms(l.quantile(0.99)),
            ms(l.max())
        )
    };
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} |\n",
            r.clusters,
            r.debounce,
            r.first_run,
            pct(&r.copies),
            pct(&r.rollouts),
            r.runs
        ));
    }
    out.push_str(
        "\n| clusters | --debounce | RSS MiB settled | RSS MiB after edit 1 / 5 / 10 | RSS MiB after the edits | threads | open sockets settled / after | idle CPU before / after the edits | runs started while idle before / after | status writes |\n\
         |---:|---|---:|---|---:|---:|---|---|---|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {} / {} | {} |\n",
            r.clusters,
            r.debounce,
            mib(r.settled.rss_kib),
            rss_series(&r.rss_per_edit),
            mib(r.after_edits.rss_kib),
            r.after_edits.threads,
            r.settled.sockets,
            r.after_edits.sockets,
            percent(r.idle_cpu_before),
            percent(r.idle_cpu_after),
            r.idle_runs.0,
            r.idle_runs.1,
            r.churn_writes,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cpu_ticks_of_this_process() {
        let pid = std::process::id();
        let ticks = cpu_ticks(pid).expect("own /proc/PID/stat");
        // Burn a little CPU: the counter never goes backwards.
        let mut x = 0u64;
        for i in 0..10_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        assert!(cpu_ticks(pid).expect("own /proc/PID/stat") >= ticks);
        assert!(sample(pid).threads >= 1);
    }

    fn written(cluster: usize, plural: &'static str, name: &str, object: Value) -> Written {
        Written {
            cluster,
            at: Instant::now(),
            verb: "APPLY",
            plural,
            namespace: Some(SIM_DEST.to_owned()),
            name: name.to_owned(),
            object,
        }
    }

    #[test]
    fn fleetsim_writes_become_copies_and_restamps() {
        let copy = written(
            3,
            "configmaps",
            EDITED,
            json!({"data": {"value": "edit-0"}}),
        );
        assert!(matches!(
            seen_in_fleetsim(&copy),
            Some(Seen::Copy { slot: 3, value: Some(v), .. }) if v == "edit-0"
        ));
        let reader = written(
            2,
            "deployments",
            READER,
            json!({"metadata": {"annotations": {names::ANN_RESTAMP: "configmap/res-1=v1:ab"}}}),
        );
        assert!(matches!(
            seen_in_fleetsim(&reader),
            Some(Seen::Mark { slot: 2, mark: Some(m), .. }) if m == "configmap/res-1=v1:ab"
        ));
        // Other objects, other namespaces and deletions mean nothing to the bench.
        assert!(seen_in_fleetsim(&written(0, "secrets", "res-0", json!({}))).is_none());
        let mut elsewhere = written(0, "configmaps", EDITED, json!({}));
        elsewhere.namespace = Some("other".into());
        assert!(seen_in_fleetsim(&elsewhere).is_none());
        let mut deleted = written(0, "configmaps", EDITED, json!({}));
        deleted.verb = "DELETE";
        assert!(seen_in_fleetsim(&deleted).is_none());
    }

    #[test]
    fn an_edit_is_done_when_the_last_slot_changed_and_unchanged_writes_do_not_count() {
        let t0 = Instant::now();
        let t = |ms: u64| t0 + Duration::from_millis(ms);
        let copy = |slot, value: &str, at| Seen::Copy {
            slot,
            value: Some(value.to_owned()),
            at,
        };
        let mut state = State::default();
        state.absorb(copy(0, "a", t(1)));
        assert_eq!(state.copies_hold(2, "a"), None);
        state.absorb(copy(1, "a", t(5)));
        // A later write of the same value (an unchanged apply) does not move the time.
        state.absorb(copy(0, "a", t(9)));
        assert_eq!(state.copies_hold(2, "a"), Some(t(5)));

        let mark = |slot, mark: &str, at| Seen::Mark {
            slot,
            mark: Some(mark.to_owned()),
            at,
        };
        state.absorb(mark(0, "x", t(1)));
        state.absorb(mark(1, "x", t(2)));
        let known = state.known_marks();
        assert_eq!(state.new_marks(2, &known), None);
        state.absorb(mark(1, "y", t(7)));
        state.absorb(mark(0, "y", t(4)));
        state.absorb(mark(0, "x", t(8)));
        assert_eq!(state.new_marks(2, &known), Some(t(7)));
        assert_eq!(state.new_marks(2, &BTreeMap::new()), Some(t(2)));
    }

    #[tokio::test]
    async fn lost_notifications_fail_the_measurement() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        tx.send(Seen::Lost(3)).expect("receiver open");
        let mut state = State::default();
        state.absorb(Seen::Lost(0));
        let err = until(&mut rx, &mut state, Duration::from_secs(5), "x", |_| None)
            .await
            .expect_err("lost notifications");
        assert!(err.to_string().contains("dropped 3"), "{err}");
    }

    #[test]
    fn rss_after_edits_1_5_10_and_the_last() {
        let kib: Vec<u64> = (1..=12).map(|i| i * 1024).collect();
        assert_eq!(rss_series(&kib), "1.0 / 5.0 / 10.0 / (12: 12.0)");
        assert_eq!(rss_series(&kib[..3]), "1.0");
        assert_eq!(rss_series(&[]), "-");
    }
}
