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
    /// Shard counts K, each a separate row: K = 1 is one unlabelled HelmOp and one watcher without
    /// `--shard-id`; K > 1 splits the clusters over K labelled HelmOps, one watcher per shard.
    pub shards: Vec<usize>,
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

/// One shard's watcher process over a row.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShardStats {
    pub rss_settled_kib: u64,
    pub rss_after_kib: u64,
    /// Share of one CPU used while idle, before and after the edits.
    pub idle_cpu_before: f64,
    pub idle_cpu_after: f64,
    /// Runs the watcher reported.
    pub runs: usize,
}

#[derive(Debug, Clone)]
pub struct Row {
    pub clusters: usize,
    /// Shards K (watcher processes).
    pub shards: usize,
    pub debounce: String,
    /// Downstream clusters and rows of the watcher's first run (`summary.clusters`, `summary.states`).
    pub first_run: String,
    /// Per edit: until every copy held the new content.
    pub copies: Latencies,
    /// Per edit: until every reader had a new ReplicaSet (fleetsim: a new restamp).
    pub rollouts: Latencies,
    /// The watcher processes, summed over the shards (RSS, threads, sockets).
    pub settled: ProcSample,
    pub after_edits: ProcSample,
    /// RSS after each edit, KiB, summed over the shards.
    pub rss_per_edit: Vec<u64>,
    /// Share of one CPU used while idle, before and after the edits, summed over the shards.
    pub idle_cpu_before: f64,
    pub idle_cpu_after: f64,
    /// Runs the watchers reported, summed over the shards.
    pub runs: usize,
    /// Runs started during the idle windows before / after the edits, summed over the shards (with
    /// churn on: runs status writes started, the goal is none).
    pub idle_runs: (usize, usize),
    /// Status writes the churn made while the watchers ran.
    pub churn_writes: u64,
    /// Each shard's watcher, in shard order (one entry when K = 1).
    pub per_shard: Vec<ShardStats>,
    /// fleetsim only: downstream requests per cluster and edit, in all and by (verb, resource).
    pub requests_per_edit: Option<RequestMix>,
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
    Ok(idle_cpu_of(&[pid], window).await?.into_iter().sum())
}

/// CPU used by each of `pids` over the same `window`, as shares of one CPU (in the order of `pids`).
pub async fn idle_cpu_of(pids: &[u32], window: Duration) -> anyhow::Result<Vec<f64>> {
    let ticks = || {
        pids.iter()
            .map(|pid| cpu_ticks(*pid))
            .collect::<anyhow::Result<Vec<u64>>>()
    };
    let before = ticks()?;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let after = ticks()?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(before
        .iter()
        .zip(&after)
        .map(|(b, a)| a.saturating_sub(*b) as f64 / USER_HZ / seconds)
        .collect())
}

/// Several processes' samples added up (RSS, threads, sockets).
fn sum_samples(samples: &[ProcSample]) -> ProcSample {
    samples
        .iter()
        .fold(ProcSample::default(), |sum, s| ProcSample {
            rss_kib: sum.rss_kib + s.rss_kib,
            threads: sum.threads + s.threads,
            sockets: sum.sockets + s.sockets,
        })
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

    /// When the first of `slots` came to hold `value`.
    fn first_holding(&self, slots: usize, value: &str) -> Option<Instant> {
        (0..slots)
            .filter_map(|i| match self.copy.get(&i) {
                Some((Some(v), at)) if v == value => Some(*at),
                _ => None,
            })
            .min()
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
    /// Requests the simulated clusters served so far, summed over them; `None` on real API servers.
    fn request_counts(&self) -> Option<sim::Counts> {
        let Side::Sim(fleet) = self else {
            return None;
        };
        let mut sum = sim::Counts::new();
        for counts in fleet.counts() {
            for (key, n) in counts {
                *sum.entry(key).or_insert(0) += n;
            }
        }
        Some(sum)
    }

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

/// The HelmOp of shard `i` of `k`: `app` unsharded (k = 1), else `app-s{i}`.
fn shard_helmop(k: usize, i: usize) -> String {
    if k <= 1 {
        fixtures::APP_HELMOP.to_owned()
    } else {
        format!("{}-s{i}", fixtures::APP_HELMOP)
    }
}

/// The `--shard-id` of shard `i` of `k` (its HelmOp's `fleet.cattle.io/shard-ref`); none unsharded.
fn shard_id(k: usize, i: usize) -> Option<String> {
    (k > 1).then(|| format!("shard{i}"))
}

/// The targets (one per cluster, in cluster order) split over `k` shards: cluster `c` goes to shard
/// `c % k`.
fn split_targets(targets: Vec<Value>, k: usize) -> Vec<Vec<Value>> {
    let k = k.max(1);
    let mut shards = vec![Vec::new(); k];
    for (c, target) in targets.into_iter().enumerate() {
        if let Some(shard) = shards.get_mut(c % k) {
            shard.push(target);
        }
    }
    shards
}

/// Upstream namespace, sources, N Clusters and the HelmOps (one per shard, see [`split_targets`]);
/// downstream the destination namespaces. Returns the slots and the HelmOps' names.
async fn prepare(
    upstream: &Client,
    side: &Side<'_>,
    namespace: &str,
    clusters: usize,
    shards: usize,
    resources: usize,
) -> anyhow::Result<(Vec<Slot>, Vec<String>)> {
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
    let mut helmops = Vec::new();
    for (i, targets) in split_targets(targets, shards).iter().enumerate() {
        let name = shard_helmop(shards, i);
        match shard_id(shards, i) {
            None => fixtures::apply_app_helmop(upstream, namespace, &entries, targets).await?,
            Some(id) => {
                let labels = [(names::FLEET_SHARD_REF_LABEL, id.as_str())];
                fixtures::apply_chart_helmop(
                    upstream, namespace, &name, &labels, &entries, targets,
                )
                .await?;
            }
        }
        helmops.push(name);
    }
    Ok((slots, helmops))
}

/// The environment `manifests/propagator` gives the watcher that changes what it costs: glibc's
/// thread cache holding 4096 freed blocks per size instead of 7 (a test below checks the manifest).
/// A build is measured without it through a wrapper that unsets the variable.
const PROPAGATOR_ENV: &[(&str, &str)] = &[("GLIBC_TUNABLES", "glibc.malloc.tcache_count=4096")];

/// The watcher processes of a row, one per shard (in shard order).
struct Watchers {
    procs: Vec<PluginProcess>,
}

impl Watchers {
    /// `shards` watchers with `args`, each shard's with its `--shard-id` (none unsharded).
    fn spawn(binary: &std::path::Path, args: &[&str], shards: usize) -> anyhow::Result<Watchers> {
        let procs = (0..shards.max(1))
            .map(|i| {
                let mut args = args.to_vec();
                let id = shard_id(shards, i);
                if let Some(id) = &id {
                    args.extend(["--shard-id", id.as_str()]);
                }
                PluginProcess::spawn_binary(binary, &args, PROPAGATOR_ENV)
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(Watchers { procs })
    }

    fn pids(&self) -> Vec<u32> {
        self.procs.iter().map(PluginProcess::pid).collect()
    }

    fn samples(&self) -> Vec<ProcSample> {
        self.procs.iter().map(|p| sample(p.pid())).collect()
    }

    /// Events each watcher has printed so far.
    fn event_counts(&self) -> Vec<usize> {
        self.procs.iter().map(|p| p.events().len()).collect()
    }

    /// Runs each watcher has reported so far.
    fn runs(&self) -> Vec<usize> {
        self.procs
            .iter()
            .map(|p| p.events_named("run").len())
            .collect()
    }

    /// Waits, within `timeout` in all, for a run event of every watcher after its first `skip[i]`
    /// events; returns those events.
    async fn wait_runs(
        &mut self,
        what: &str,
        timeout: Duration,
        skip: &[usize],
    ) -> anyhow::Result<Vec<Value>> {
        let deadline = Instant::now() + timeout;
        let several = self.procs.len() > 1;
        let mut runs = Vec::new();
        for (i, (watcher, skip)) in self.procs.iter_mut().zip(skip).enumerate() {
            let what = if several {
                format!("{what} (shard {i})")
            } else {
                what.to_owned()
            };
            let left = deadline.saturating_duration_since(Instant::now());
            runs.push(
                watcher
                    .wait_event(&what, left, *skip, |e| e["event"] == "run")
                    .await?,
            );
        }
        Ok(runs)
    }

    /// SIGTERM to every watcher, then waits for each to exit.
    async fn stop(mut self) -> anyhow::Result<()> {
        for watcher in &self.procs {
            watcher.signal(15)?;
        }
        for watcher in &mut self.procs {
            watcher.wait_exit(Duration::from_secs(30)).await?;
        }
        Ok(())
    }
}

/// `N clusters: {states}` of the watchers' first runs: the states added up over the shards, the
/// clusters (`summary.clusters`, the downstreams a run visits) per shard, since every shard visits
/// every registered Cluster.
fn first_run_summary(firsts: &[Value]) -> String {
    let field = |e: &Value, name: &str| {
        e.pointer(&format!("/report/summary/{name}"))
            .or_else(|| e.pointer(&format!("/summary/{name}")))
            .cloned()
    };
    let clusters: Vec<String> = firsts
        .iter()
        .map(|e| field(e, "clusters").map_or("?".to_owned(), |c| c.to_string()))
        .collect();
    let clusters = match clusters.as_slice() {
        [first, rest @ ..] if rest.iter().all(|c| c == first) => first.clone(),
        several => several.join(" / "),
    };
    let per_shard = if firsts.len() > 1 { " per shard" } else { "" };
    let states = firsts
        .iter()
        .map(|e| match field(e, "states") {
            Some(Value::Object(states)) => Some(states),
            _ => None,
        })
        .try_fold(serde_json::Map::new(), |mut sum, states| {
            for (state, count) in states? {
                let total = sum.get(&state).and_then(Value::as_u64).unwrap_or(0);
                sum.insert(state, Value::from(total + count.as_u64()?));
            }
            Some(sum)
        });
    format!(
        "{clusters} clusters{per_shard}: {}",
        states.map_or("?".to_owned(), |s| Value::Object(s).to_string()),
    )
}

/// Total of per-watcher counts.
fn total(counts: &[usize]) -> usize {
    counts.iter().sum()
}

/// Each shard's numbers, from the per-watcher measurements (all in shard order).
fn per_shard(
    settled: &[ProcSample],
    after: &[ProcSample],
    cpu_before: &[f64],
    cpu_after: &[f64],
    runs: &[usize],
) -> Vec<ShardStats> {
    settled
        .iter()
        .zip(after)
        .zip(cpu_before)
        .zip(cpu_after)
        .zip(runs)
        .map(
            |((((settled, after), before), cpu_after), runs)| ShardStats {
                rss_settled_kib: settled.rss_kib,
                rss_after_kib: after.rss_kib,
                idle_cpu_before: *before,
                idle_cpu_after: *cpu_after,
                runs: *runs,
            },
        )
        .collect()
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

/// What one row measures: N clusters split over K shards, the watchers' `--debounce`, and the row's
/// number (its upstream namespace).
struct RowConfig<'a> {
    clusters: usize,
    shards: usize,
    debounce: &'a str,
    index: usize,
}

async fn one(
    settings: &WatchSettings,
    upstream: &ClusterInfo,
    upstream_client: &Client,
    side: &Side<'_>,
    config: RowConfig<'_>,
) -> anyhow::Result<Row> {
    let RowConfig {
        clusters: n,
        shards,
        debounce,
        index,
    } = config;
    let namespace = format!("watch-{index}-n{n}");
    eprintln!("watch: {n} clusters, {shards} shard(s): preparing ...");
    let (slots, helmops) = prepare(
        upstream_client,
        side,
        &namespace,
        n,
        shards,
        settings.resources,
    )
    .await?;
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
    eprintln!("watch: {n} clusters, --debounce {debounce}: starting {shards} watcher(s) ...");
    let mut watchers = Watchers::spawn(&settings.plugin_bin, &args, shards)?;
    let none_seen = vec![0; shards.max(1)];
    let firsts = watchers
        .wait_runs("the first run", Duration::from_secs(600), &none_seen)
        .await?;
    let first_run = first_run_summary(&firsts);

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
    let pids = watchers.pids();
    // Let the start-up work (watches listing, the first run's allocations) settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let churn = settings.churn.map(|interval| {
        Churn::start(
            upstream_client.clone(),
            ChurnSettings {
                namespace: namespace.clone(),
                clusters: (0..n).map(|c| format!("c{c}")).collect(),
                helmops: helmops.clone(),
                interval,
            },
        )
    });
    let settled = watchers.samples();
    eprintln!("watch: idle CPU for {:?} ...", settings.idle);
    let runs_before_idle = total(&watchers.runs());
    let idle_cpu_before = idle_cpu_of(&pids, settings.idle).await?;
    let idle_runs_before = total(&watchers.runs()) - runs_before_idle;

    let cms: Api<ConfigMap> = Api::namespaced(upstream_client.clone(), &namespace);
    let mut copies = Vec::new();
    let mut rollouts = Vec::new();
    let mut rss_per_edit = Vec::new();
    let requests_before = side.request_counts();
    for edit in 0..settings.edits {
        while let Ok(seen) = rx.try_recv() {
            state.absorb(seen);
        }
        let known = state.known_marks();
        let value = format!("edit-{edit}");
        let events_before = watchers.event_counts();
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
        let first = state
            .first_holding(all, &value)
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(started));
        copies.push(copied.saturating_duration_since(started).as_nanos() as u64);
        rollouts.push(rolled.saturating_duration_since(started).as_nanos() as u64);
        // The next edit must not fall into this edit's run, on any shard.
        watchers
            .wait_runs(
                "the run of this edit",
                Duration::from_secs(300),
                &events_before,
            )
            .await?;
        rss_per_edit.push(sum_samples(&watchers.samples()).rss_kib);
        eprintln!(
            "watch: edit {}/{}: first copy {}, copies {}, readers {} ms",
            edit + 1,
            settings.edits,
            ms(first),
            ms(Duration::from_nanos(*copies.last().unwrap_or(&0))),
            ms(Duration::from_nanos(*rollouts.last().unwrap_or(&0))),
        );
        tokio::time::sleep(settings.gap).await;
    }
    let requests_per_edit = requests_before
        .zip(side.request_counts())
        .map(|(before, after)| RequestMix::between(&before, &after, settings.edits * n));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_edits = watchers.samples();
    let runs_before_idle = total(&watchers.runs());
    let idle_cpu_after = idle_cpu_of(&pids, settings.idle).await?;
    let runs = watchers.runs();
    let idle_runs_after = total(&runs) - runs_before_idle;
    let churn_writes = match churn {
        Some(churn) => churn.stop().await?,
        None => 0,
    };
    watchers.stop().await?;
    Ok(Row {
        clusters: n,
        shards,
        debounce: debounce.to_owned(),
        first_run,
        copies: Latencies::from_samples(copies),
        rollouts: Latencies::from_samples(rollouts),
        settled: sum_samples(&settled),
        after_edits: sum_samples(&after_edits),
        rss_per_edit,
        idle_cpu_before: idle_cpu_before.iter().sum(),
        idle_cpu_after: idle_cpu_after.iter().sum(),
        runs: total(&runs),
        idle_runs: (idle_runs_before, idle_runs_after),
        churn_writes,
        per_shard: per_shard(
            &settled,
            &after_edits,
            &idle_cpu_before,
            &idle_cpu_after,
            &runs,
        ),
        requests_per_edit,
    })
}

/// Downstream requests per cluster and edit.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestMix {
    pub total: f64,
    /// (verb, resource, requests per cluster and edit), most first.
    pub by_kind: Vec<(String, String, f64)>,
}

impl RequestMix {
    /// The requests served between `before` and `after`, over `per` (clusters x edits).
    fn between(before: &sim::Counts, after: &sim::Counts, per: usize) -> RequestMix {
        let per = per.max(1) as f64;
        let mut by_kind: Vec<(String, String, f64)> = after
            .iter()
            .map(|(key, n)| (key, n.saturating_sub(before.get(key).copied().unwrap_or(0))))
            .filter(|(_, n)| *n > 0)
            .map(|((verb, resource), n)| (verb.clone(), resource.clone(), n as f64 / per))
            .collect();
        by_kind.sort_by(|a, b| {
            b.2.total_cmp(&a.2)
                .then_with(|| (&a.0, &a.1).cmp(&(&b.0, &b.1)))
        });
        RequestMix {
            total: by_kind.iter().map(|k| k.2).sum(),
            by_kind,
        }
    }
}

impl std::fmt::Display for RequestMix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:.2}", self.total)?;
        let kinds: Vec<String> = self
            .by_kind
            .iter()
            .map(|(verb, resource, n)| format!("{verb} {resource} {n:.2}"))
            .collect();
        if !kinds.is_empty() {
            write!(f, " ({})", kinds.join(", "))?;
        }
        Ok(())
    }
}

pub async fn run(settings: &WatchSettings) -> anyhow::Result<Vec<Row>> {
    fixtures::require_plugin(&settings.plugin_bin)?;
    if settings.shards.contains(&0) {
        bail!("--shards: every value must be at least 1");
    }
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
        for &shards in &settings.shards {
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
                        RowConfig {
                            clusters: n,
                            shards,
                            debounce,
                            index,
                        },
                    )
                    .await?,
                );
            }
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
        Downstream::Fleetsim => "each a simulated cluster (fleetsim, one listener, a path per cluster) behind one real upstream \
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
    let sharded = rows.iter().any(|r| r.shards > 1);
    let shards = if sharded {
        format!(
            " With K shards, K HelmOps `app-s0` .. each labelled `{label}: shardI` and targeting the Clusters \
             c with c % K = I, one watcher per shard (`--shard-id shardI`); 1 shard is one unlabelled HelmOp and \
             one watcher without `--shard-id`. RSS, threads, sockets, idle CPU and runs are summed over the K \
             watcher processes (each shard's in the last table); an edit is done when every copy on all N \
             clusters holds it, and the next waits for a run of every watcher.",
            label = names::FLEET_SHARD_REF_LABEL
        )
    } else {
        String::new()
    };
    let mut out = format!(
        "`propagate --watch` over N Fleet Clusters {setup}. {} sources per HelmOp, {} edits per row \
         (nearest-rank percentiles over edits, each edit the slowest cluster). {churn}.{shards}\n\n\
         | clusters | shards | --debounce | first run | edit -> every copy p50 / p99 / max ms | edit -> every reader {} p50 / p99 / max ms | runs |\n\
         |---:|---:|---|---|---|---|---:|\n",
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
            "| {} | {} | {} | {} | {} | {} | {} |\n",
            r.clusters,
            r.shards,
            r.debounce,
            r.first_run,
            pct(&r.copies),
            pct(&r.rollouts),
            r.runs
        ));
    }
    out.push_str(
        "\n| clusters | shards | --debounce | RSS MiB settled | RSS MiB after edit 1 / 5 / 10 | RSS MiB after the edits | threads | open sockets settled / after | idle CPU before / after the edits | runs started while idle before / after | status writes |\n\
         |---:|---:|---|---:|---|---:|---:|---|---|---|---:|\n",
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {} / {} | {} |\n",
            r.clusters,
            r.shards,
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
    for r in rows {
        if let Some(mix) = &r.requests_per_edit {
            out.push_str(&format!(
                "\nDownstream requests per cluster and edit, N = {} ({} shard(s)): {mix}\n",
                r.clusters, r.shards
            ));
        }
    }
    if sharded {
        out.push('\n');
        out.push_str(&shard_table(rows));
    }
    out
}

/// The largest and smallest of `values`, `None` when there are none.
fn max_min<T: Copy + PartialOrd>(values: impl IntoIterator<Item = T>) -> Option<(T, T)> {
    values.into_iter().fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((max, min)) => Some((if v > max { v } else { max }, if v < min { v } else { min })),
    })
}

/// `max / min` of one number over a row's shards, each formatted by `show`.
fn over_shards<T: Copy + PartialOrd>(
    row: &Row,
    value: impl Fn(&ShardStats) -> T,
    show: impl Fn(T) -> String,
) -> String {
    max_min(row.per_shard.iter().map(value)).map_or("-".to_owned(), |(max, min)| {
        format!("{} / {}", show(max), show(min))
    })
}

/// Per-shard numbers of every row: max and min over the shards, and each shard's runs.
fn shard_table(rows: &[Row]) -> String {
    let mut out = "| clusters | shards | --debounce | RSS MiB settled, per shard max / min | RSS MiB after the edits, per shard max / min | idle CPU before the edits, per shard max / min | idle CPU after the edits, per shard max / min | runs per shard |\n\
         |---:|---:|---|---|---|---|---|---|\n"
        .to_owned();
    for r in rows {
        let runs: Vec<String> = r.per_shard.iter().map(|s| s.runs.to_string()).collect();
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.clusters,
            r.shards,
            r.debounce,
            over_shards(r, |s| s.rss_settled_kib, mib),
            over_shards(r, |s| s.rss_after_kib, mib),
            over_shards(r, |s| s.idle_cpu_before, percent),
            over_shards(r, |s| s.idle_cpu_after, percent),
            runs.join(" / "),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the benchmark measures is what the manifests run.
    #[test]
    fn the_watcher_gets_the_environment_of_the_propagator_manifest() {
        let manifest = include_str!("../../manifests/propagator/controller/deployment.yaml");
        for (name, value) in PROPAGATOR_ENV {
            let at = manifest
                .find(&format!("- name: {name}\n"))
                .unwrap_or_else(|| panic!("{name} is not in the propagator's Deployment"));
            let next = manifest[at..].lines().nth(1).unwrap_or_default();
            assert_eq!(next.trim(), format!("value: {value}"), "{name}");
        }
    }

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
    fn clusters_are_split_over_the_shards_by_c_mod_k() {
        let targets: Vec<Value> = (0..10).map(|c| json!(format!("c{c}"))).collect();
        let one = split_targets(targets.clone(), 1);
        assert_eq!(one, vec![targets.clone()]);
        let four = split_targets(targets, 4);
        let names: Vec<Vec<&str>> = four
            .iter()
            .map(|s| s.iter().filter_map(Value::as_str).collect())
            .collect();
        assert_eq!(
            names,
            vec![
                vec!["c0", "c4", "c8"],
                vec!["c1", "c5", "c9"],
                vec!["c2", "c6"],
                vec!["c3", "c7"],
            ]
        );
        // Unsharded: the HelmOp as before shards, no --shard-id; sharded: labelled, one id each.
        assert_eq!(
            (shard_helmop(1, 0), shard_id(1, 0)),
            ("app".to_owned(), None)
        );
        assert_eq!(
            (shard_helmop(4, 3), shard_id(4, 3)),
            ("app-s3".to_owned(), Some("shard3".to_owned()))
        );
    }

    #[test]
    fn first_runs_add_up_over_the_shards() {
        let run = |clusters: u64, created: u64| {
            json!({"event": "run", "report": {"summary": {
                "clusters": clusters, "states": {"Created": created, "Restamped": clusters},
            }}})
        };
        assert_eq!(
            first_run_summary(&[run(3, 12)]),
            r#"3 clusters: {"Created":12,"Restamped":3}"#
        );
        assert_eq!(
            first_run_summary(&[run(3, 12), run(3, 8)]),
            r#"3 clusters per shard: {"Created":20,"Restamped":6}"#
        );
        assert_eq!(
            first_run_summary(&[run(3, 12), run(2, 8)]),
            r#"3 / 2 clusters per shard: {"Created":20,"Restamped":5}"#
        );
        assert_eq!(first_run_summary(&[json!({})]), "? clusters: ?");
    }

    fn row(shards: Vec<ShardStats>) -> Row {
        Row {
            clusters: 8,
            shards: shards.len(),
            debounce: "1s".to_owned(),
            first_run: String::new(),
            copies: Latencies::from_samples(vec![1_000_000]),
            rollouts: Latencies::from_samples(vec![2_000_000]),
            settled: ProcSample::default(),
            after_edits: ProcSample::default(),
            rss_per_edit: Vec::new(),
            idle_cpu_before: 0.0,
            idle_cpu_after: 0.0,
            runs: shards.iter().map(|s| s.runs).sum(),
            idle_runs: (0, 0),
            churn_writes: 0,
            per_shard: shards,
            requests_per_edit: None,
        }
    }

    #[test]
    fn the_shard_table_shows_max_and_min_over_shards() {
        let shard = |mib: u64, cpu: f64, runs| ShardStats {
            rss_settled_kib: mib * 1024,
            rss_after_kib: (mib + 1) * 1024,
            idle_cpu_before: cpu,
            idle_cpu_after: cpu / 2.0,
            runs,
        };
        let settings = WatchSettings {
            plugin_bin: PathBuf::from("kubectl-helmop"),
            downstream: Downstream::Fleetsim,
            apiservers: 0,
            clusters: vec![8],
            resources: 4,
            edits: 1,
            debounces: vec!["1s".to_owned()],
            shards: vec![1, 2],
            idle: Duration::from_secs(1),
            gap: Duration::from_secs(1),
            extra_args: Vec::new(),
            churn: None,
        };
        let unsharded = row(vec![shard(30, 0.01, 2)]);
        assert!(!table(std::slice::from_ref(&unsharded), &settings).contains("per shard"));
        let rows = [
            unsharded,
            row(vec![shard(20, 0.004, 2), shard(12, 0.02, 3)]),
        ];
        let out = table(&rows, &settings);
        assert!(out.contains(
            "| 8 | 2 | 1s | 20.0 / 12.0 | 21.0 / 13.0 | 2.00% / 0.40% | 1.00% / 0.20% | 2 / 3 |"
        ));
        assert!(out.contains(
            "| 8 | 1 | 1s | 30.0 / 30.0 | 31.0 / 31.0 | 1.00% / 1.00% | 0.50% / 0.50% | 2 |"
        ));
        assert_eq!(max_min(Vec::<u64>::new()), None);
    }

    #[test]
    fn rss_after_edits_1_5_10_and_the_last() {
        let kib: Vec<u64> = (1..=12).map(|i| i * 1024).collect();
        assert_eq!(rss_series(&kib), "1.0 / 5.0 / 10.0 / (12: 12.0)");
        assert_eq!(rss_series(&kib[..3]), "1.0");
        assert_eq!(rss_series(&[]), "-");
    }

    #[test]
    fn request_mix_is_per_cluster_and_edit_most_first() {
        let key = |v: &str, r: &str| (v.to_owned(), r.to_owned());
        let before = sim::Counts::from([(key("GET", "secrets"), 10), (key("LIST", "pods"), 4)]);
        let after = sim::Counts::from([
            (key("GET", "secrets"), 30),
            (key("LIST", "pods"), 4),
            (key("PATCH", "deployments"), 10),
        ]);
        let mix = RequestMix::between(&before, &after, 10);
        assert_eq!(mix.total, 3.0);
        assert_eq!(
            mix.to_string(),
            "3.00 (GET secrets 2.00, PATCH deployments 1.00)"
        );
    }
}
