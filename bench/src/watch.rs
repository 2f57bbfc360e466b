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

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
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
use tokio::sync::mpsc;

use crate::fixtures;
use crate::machine::rss_kib;
use crate::stats::{Latencies, ms};

#[derive(Debug, Clone)]
pub struct WatchSettings {
    pub plugin_bin: PathBuf,
    /// Downstream API servers (besides the upstream one).
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
    /// Per edit: until every reader had a new ReplicaSet.
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
}

/// `/proc/PID/stat` utime + stime, in clock ticks (USER_HZ, 100 on Linux).
fn cpu_ticks(pid: u32) -> anyhow::Result<u64> {
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

fn sample(pid: u32) -> ProcSample {
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
async fn idle_cpu(pid: u32, window: Duration) -> anyhow::Result<f64> {
    let before = cpu_ticks(pid)?;
    let started = Instant::now();
    tokio::time::sleep(window).await;
    let used = cpu_ticks(pid)?.saturating_sub(before) as f64 / USER_HZ;
    Ok(used / started.elapsed().as_secs_f64())
}

/// One reader slot: a destination namespace on a downstream API server.
struct Slot {
    server: usize,
    namespace: String,
}

/// What the bench's own watches downstream saw.
enum Seen {
    Copy { slot: usize, value: Option<String> },
    ReplicaSet { slot: usize, hash: Option<String> },
}

const EDITED: &str = "res-1";
const READER: &str = "reader";
const CONFIG_HASH: &str = "helmop.dev/config-hash";

fn spawn_watches(client: Client, slot: usize, namespace: &str, tx: mpsc::UnboundedSender<Seen>) {
    let copies: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let copy_tx = tx.clone();
    tokio::spawn(async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={EDITED}"));
        let mut stream = std::pin::pin!(watcher::watcher(copies, config));
        while let Some(event) = stream.next().await {
            if let Ok(Event::Apply(cm) | Event::InitApply(cm)) = event {
                let value = cm.data.and_then(|d| d.get("value").cloned());
                if copy_tx.send(Seen::Copy { slot, value }).is_err() {
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
                let hash = rs
                    .spec
                    .template
                    .and_then(|t| t.metadata)
                    .and_then(|m| m.annotations)
                    .and_then(|a| a.get(CONFIG_HASH).cloned());
                if tx.send(Seen::ReplicaSet { slot, hash }).is_err() {
                    return;
                }
            }
        }
    });
}

/// The latest state per slot, from the watch events.
#[derive(Default)]
struct State {
    copy: BTreeMap<usize, Option<String>>,
    hashes: BTreeMap<usize, BTreeSet<String>>,
}

impl State {
    /// Applies what a downstream watch delivered.
    fn absorb(&mut self, seen: Seen) {
        match seen {
            Seen::Copy { slot, value } => {
                self.copy.insert(slot, value);
            }
            Seen::ReplicaSet {
                slot,
                hash: Some(hash),
            } => {
                self.hashes.entry(slot).or_default().insert(hash);
            }
            Seen::ReplicaSet { hash: None, .. } => {}
        }
    }
}

fn reader(namespace: &str) -> anyhow::Result<Deployment> {
    Ok(serde_json::from_value(json!({
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
    }))?)
}

/// Upstream namespace, sources, N Clusters and the HelmOp; downstream the destination namespaces (opted in,
/// the webhook registered for each).
async fn prepare(
    upstream: &Client,
    downstream: &[ClusterInfo],
    clients: &[Client],
    webhooks: &[LocalWebhook],
    namespace: &str,
    clusters: usize,
    resources: usize,
) -> anyhow::Result<Vec<Slot>> {
    fixtures::create_namespace(upstream, namespace, &[]).await?;
    let entries =
        fixtures::create_sources(upstream, namespace, resources.max(2), "initial").await?;
    let mut targets = Vec::new();
    let mut slots = Vec::new();
    for c in 0..clusters {
        let name = format!("c{c}");
        let server = c % downstream.len();
        let dest = format!("{namespace}-c{c}");
        fixtures::create_namespace(
            &clients[server],
            &dest,
            &[
                (TEST_NAMESPACE_LABEL, dest.as_str()),
                (names::LABEL_ROLLOUT_ON_CHANGE, "enabled"),
            ],
        )
        .await?;
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
        register_fleet_cluster(
            upstream,
            namespace,
            &name,
            &[("bench", "yes")],
            &downstream[server],
        )
        .await?;
        targets.push(json!({"name": name, "clusterName": name, "namespace": dest}));
        slots.push(Slot {
            server,
            namespace: dest,
        });
    }
    fixtures::apply_app_helmop(upstream, namespace, &entries, &targets).await?;
    Ok(slots)
}

/// Receives watch events until `done` holds or `timeout` passes; returns when it held.
async fn until(
    rx: &mut mpsc::UnboundedReceiver<Seen>,
    state: &mut State,
    timeout: Duration,
    what: &str,
    done: impl Fn(&State) -> bool,
) -> anyhow::Result<Instant> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if done(state) {
            return Ok(Instant::now());
        }
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(seen)) => state.absorb(seen),
            Ok(None) => bail!("the downstream watches ended while waiting for {what}"),
            Err(_) => bail!("timed out after {timeout:?} waiting for {what}"),
        }
    }
}

/// The control plane's parts one configuration runs on.
struct Fleet<'a> {
    upstream: &'a ClusterInfo,
    upstream_client: &'a Client,
    downstream: &'a [ClusterInfo],
    clients: &'a [Client],
    webhooks: &'a [LocalWebhook],
}

async fn one(
    settings: &WatchSettings,
    fleet: &Fleet<'_>,
    n: usize,
    debounce: &str,
    index: usize,
) -> anyhow::Result<Row> {
    let Fleet {
        upstream,
        upstream_client,
        downstream,
        clients,
        webhooks,
    } = *fleet;
    let namespace = format!("watch-{index}-n{n}");
    let slots = prepare(
        upstream_client,
        downstream,
        clients,
        webhooks,
        &namespace,
        n,
        settings.resources,
    )
    .await?;
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

    let (tx, mut rx) = mpsc::unbounded_channel();
    for (i, slot) in slots.iter().enumerate() {
        spawn_watches(clients[slot.server].clone(), i, &slot.namespace, tx.clone());
    }
    drop(tx);
    let mut state = State::default();
    let all = slots.len();
    until(
        &mut rx,
        &mut state,
        Duration::from_secs(120),
        "every copy",
        |s| {
            (0..all).all(|i| {
                s.copy
                    .get(&i)
                    .is_some_and(|v| v.as_deref() == Some("initial"))
            })
        },
    )
    .await?;
    for slot in &slots {
        Api::<Deployment>::namespaced(clients[slot.server].clone(), &slot.namespace)
            .create(&PostParams::default(), &reader(&slot.namespace)?)
            .await
            .with_context(|| format!("creating the reader in {}", slot.namespace))?;
    }
    until(
        &mut rx,
        &mut state,
        Duration::from_secs(120),
        "the readers' first ReplicaSets (stamped)",
        |s| (0..all).all(|i| s.hashes.get(&i).is_some_and(|h| !h.is_empty())),
    )
    .await?;
    let pid = watcher.pid();
    // Let the start-up work (watches listing, the first run's allocations) settle.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let settled = sample(pid);
    eprintln!("watch: idle CPU for {:?} ...", settings.idle);
    let idle_cpu_before = idle_cpu(pid, settings.idle).await?;

    let cms: Api<ConfigMap> = Api::namespaced(upstream_client.clone(), &namespace);
    let mut copies = Vec::new();
    let mut rollouts = Vec::new();
    let mut rss_per_edit = Vec::new();
    for edit in 0..settings.edits {
        while let Ok(seen) = rx.try_recv() {
            state.absorb(seen);
        }
        let known: BTreeMap<usize, usize> = state
            .hashes
            .iter()
            .map(|(slot, h)| (*slot, h.len()))
            .collect();
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
            |s| (0..all).all(|i| s.copy.get(&i).is_some_and(|v| v.as_deref() == Some(&value))),
        )
        .await?;
        let rolled = until(
            &mut rx,
            &mut state,
            Duration::from_secs(300),
            "a new ReplicaSet of every reader",
            |s| {
                (0..all).all(|i| {
                    s.hashes.get(&i).map_or(0, BTreeSet::len) > known.get(&i).copied().unwrap_or(0)
                })
            },
        )
        .await?;
        copies.push((copied - started).as_nanos() as u64);
        rollouts.push((rolled - started).as_nanos() as u64);
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
            "watch: edit {}/{}: copies {}, rollouts {} ms",
            edit + 1,
            settings.edits,
            ms(Duration::from_nanos(*copies.last().unwrap_or(&0))),
            ms(Duration::from_nanos(*rollouts.last().unwrap_or(&0))),
        );
        tokio::time::sleep(settings.gap).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_edits = sample(pid);
    let idle_cpu_after = idle_cpu(pid, settings.idle).await?;
    let runs = watcher.events_named("run").len();
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
    })
}

pub async fn run(settings: &WatchSettings) -> anyhow::Result<Vec<Row>> {
    fixtures::require_plugin(&settings.plugin_bin)?;
    let cluster = fixtures::start_with_downstreams(settings.apiservers).await?;
    let upstream = cluster.cp.clusters[0].clone();
    let downstream: Vec<ClusterInfo> = cluster.cp.clusters[1..].to_vec();
    let mut clients = Vec::new();
    let mut webhooks = Vec::new();
    for d in &downstream {
        let client = d.client().await;
        ensure_hash_key(&client).await?;
        webhooks.push(
            LocalWebhook::start(client.clone(), helmop_webhook::state::Config::default()).await?,
        );
        clients.push(client);
    }
    let fleet = Fleet {
        upstream: &upstream,
        upstream_client: &cluster.client,
        downstream: &downstream,
        clients: &clients,
        webhooks: &webhooks,
    };
    let mut rows = Vec::new();
    let mut index = 0;
    for &n in &settings.clusters {
        for debounce in &settings.debounces {
            index += 1;
            rows.push(one(settings, &fleet, n, debounce, index).await?);
        }
    }
    Ok(rows)
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

fn percent(share: f64) -> String {
    format!("{:.2}%", share * 100.0)
}

pub fn table(rows: &[Row], settings: &WatchSettings) -> String {
    let mut out = format!(
        "`propagate --watch` over N Fleet Clusters spread round-robin over {} downstream kube-apiservers, each \
         Cluster into its own namespace, {} sources per HelmOp; one reader Deployment per destination namespace \
         (envFrom the edited ConfigMap), stamped by the real webhook, rolled by a real kube-controller-manager. \
         {} edits per row; latency from the PATCH upstream to the bench's watch event downstream (nearest-rank \
         percentiles over edits, each edit the slowest cluster).\n\n\
         | clusters | --debounce | first run | edit -> every copy p50 / p99 / max ms | edit -> every reader rolled p50 / p99 / max ms | runs |\n\
         |---:|---|---|---|---|---:|\n",
        settings.apiservers, settings.resources, settings.edits
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
        "\n| clusters | --debounce | RSS MiB settled | RSS MiB after the edits (first edit .. last) | threads | open sockets settled / after | idle CPU before / after the edits |\n\
         |---:|---|---:|---|---:|---|---|\n",
    );
    for r in rows {
        let series = match (r.rss_per_edit.first(), r.rss_per_edit.last()) {
            (Some(a), Some(b)) => format!(
                "{} ({} .. {})",
                mib(r.after_edits.rss_kib),
                mib(*a),
                mib(*b)
            ),
            _ => mib(r.after_edits.rss_kib),
        };
        out.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} / {} | {} / {} |\n",
            r.clusters,
            r.debounce,
            mib(r.settled.rss_kib),
            series,
            r.after_edits.threads,
            r.settled.sockets,
            r.after_edits.sockets,
            percent(r.idle_cpu_before),
            percent(r.idle_cpu_after),
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
}
