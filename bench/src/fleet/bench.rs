//! `helmop-bench fleet`: a cold `kubectl-helmop propagate` over N distinct clusters against the limit, a bare
//! client loop writing the same objects at the same concurrency to the same servers in the same run, then the
//! unchanged rerun. Downstream: N simulated clusters ([`super::sim`]) and, as the reference, real
//! kube-apiservers (one Fleet Cluster each). Writes are counted by the servers: by fleetsim itself, and by
//! `apiserver_request_total` on the real ones.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use helmop_tests::{ClusterInfo, register_fleet_cluster};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::{Value, json};

use super::sim::{self, Counts, Fleet};
use crate::{fixtures, propagate};

#[derive(Debug, Clone)]
pub struct FleetSettings {
    pub plugin_bin: PathBuf,
    pub clusters: Vec<usize>,
    pub resources: usize,
    pub concurrency: usize,
    /// Real downstream kube-apiservers for the reference run (0: none).
    pub real: usize,
}

#[derive(Debug, Clone)]
pub struct Row {
    pub downstream: &'static str,
    pub clusters: usize,
    pub copies: usize,
    pub cold: Duration,
    pub cold_writes: u64,
    pub cold_requests: u64,
    pub cold_reported_writes: u64,
    pub bare: Duration,
    pub bare_writes: u64,
    pub bare_requests: u64,
    pub unchanged: Duration,
    pub unchanged_writes: u64,
    pub unchanged_requests: u64,
    pub unchanged_states: String,
}

/// How a side's servers count: fleetsim's own counters, or the real API servers' metrics.
enum Servers<'a> {
    Sim(&'a Fleet),
    Real(&'a [Client]),
}

impl Servers<'_> {
    /// (writes, requests) so far, summed over the servers.
    async fn totals(&self) -> anyhow::Result<(u64, u64)> {
        match self {
            Servers::Sim(fleet) => {
                let mut all = Counts::new();
                for c in fleet.counts() {
                    for (k, v) in c {
                        *all.entry(k).or_insert(0) += v;
                    }
                }
                Ok((sim::writes(&all), all.values().sum()))
            }
            Servers::Real(clients) => {
                let (writes, requests) = propagate::scrape(clients).await?;
                // The scrape itself is one request per server.
                Ok((
                    writes.values().sum(),
                    requests.saturating_sub(clients.len() as u64),
                ))
            }
        }
    }

    async fn settle(&self) -> anyhow::Result<()> {
        match self {
            Servers::Sim(_) => Ok(()),
            Servers::Real(clients) => propagate::settle(clients).await,
        }
    }
}

/// Upstream objects of one run: `resources` sources (half Secrets, half ConfigMaps, 1 KiB each), one Fleet
/// Cluster per target, one HelmOp with a target per Cluster into namespace `dest`.
async fn prepare(
    upstream: &Client,
    namespace: &str,
    targets: &[ClusterInfo],
    resources: usize,
) -> anyhow::Result<()> {
    fixtures::create_namespace(upstream, namespace, &[]).await?;
    let entries =
        fixtures::create_sources(upstream, namespace, resources, &"c".repeat(1024)).await?;
    futures::stream::iter(targets.iter().enumerate())
        .map(|(i, t)| async move {
            register_fleet_cluster(upstream, namespace, &format!("c{i}"), &[], t).await
        })
        .buffer_unordered(16)
        .try_collect::<Vec<_>>()
        .await?;
    let targets: Vec<Value> = (0..targets.len())
        .map(|i| json!({"name": format!("c{i}"), "clusterName": format!("c{i}"), "namespace": "dest"}))
        .collect();
    fixtures::apply_app_helmop(upstream, namespace, &entries, &targets).await?;
    Ok(())
}

struct PluginRun {
    wall: Duration,
    reported_writes: u64,
    states: String,
}

async fn run_plugin(
    settings: &FleetSettings,
    upstream: &ClusterInfo,
    namespace: &str,
) -> anyhow::Result<PluginRun> {
    let (output, wall) = fixtures::timed_propagate(
        &settings.plugin_bin,
        &upstream.kubeconfig,
        namespace,
        settings.concurrency,
    )
    .await?;
    let code = output.status.code().unwrap_or(-1);
    if code != 0 {
        bail!(
            "propagate exited {code}: {}\n{}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
                .chars()
                .take(2000)
                .collect::<String>()
        );
    }
    let report: Value =
        serde_json::from_slice(&output.stdout).context("propagate printed no JSON")?;
    let states = report
        .pointer("/summary/states")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .map(|(k, v)| format!("{v} {k}"))
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default();
    Ok(PluginRun {
        wall,
        reported_writes: report
            .pointer("/summary/writes")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        states,
    })
}

/// The bare client loop: per cluster (at most `concurrency` at once) a client from its kubeconfig, the
/// namespace, then each object created, exactly the objects (size, labels, annotations) a cold propagate
/// writes; nothing read, nothing planned. Like the plugin, it reads the system trust roots once for every
/// kubeconfig without a CA (kube would otherwise re-read them per client), so the two pay the same fixed
/// TLS set-up and the ratio compares API work.
async fn bare_loop(
    targets: &[ClusterInfo],
    namespace: &str,
    resources: usize,
    concurrency: usize,
) -> anyhow::Result<Duration> {
    let annotations = BTreeMap::from([
        (
            "helmop.dev/owners".to_owned(),
            format!("{:016x}/bench/app", 0),
        ),
        (
            "helmop.dev/source".to_owned(),
            format!("{:016x}/bench/secret/res-0", 0),
        ),
        (
            "helmop.dev/source-uid".to_owned(),
            "00000000-0000-0000-0000-000000000000".to_owned(),
        ),
        (
            "helmop.dev/content-hash".to_owned(),
            format!("v1:{}", "0".repeat(64)),
        ),
    ]);
    let labels = BTreeMap::from([(
        "helmop.dev/managed-by".to_owned(),
        "kubectl-helmop".to_owned(),
    )]);
    let started = Instant::now();
    let roots = system_roots();
    futures::stream::iter(targets)
        .map(|t| {
            let (annotations, labels) = (annotations.clone(), labels.clone());
            let roots = &roots;
            async move {
                let client = bare_client(t, roots).await?;
                let ns = Namespace {
                    metadata: ObjectMeta {
                        name: Some(namespace.to_owned()),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                Api::<Namespace>::all(client.clone())
                    .create(&PostParams::default(), &ns)
                    .await?;
                for r in 0..resources {
                    let metadata = ObjectMeta {
                        name: Some(format!("res-{r}")),
                        namespace: Some(namespace.to_owned()),
                        labels: Some(labels.clone()),
                        annotations: Some(annotations.clone()),
                        ..Default::default()
                    };
                    let pp = PostParams {
                        field_manager: Some("kubectl-helmop".to_owned()),
                        ..Default::default()
                    };
                    if r % 2 == 0 {
                        let s = Secret {
                            metadata,
                            type_: Some("Opaque".to_owned()),
                            data: Some(BTreeMap::from([(
                                "value".to_owned(),
                                ByteString(vec![b's'; 1024]),
                            )])),
                            ..Default::default()
                        };
                        Api::<Secret>::namespaced(client.clone(), namespace)
                            .create(&pp, &s)
                            .await?;
                    } else {
                        let c = ConfigMap {
                            metadata,
                            data: Some(BTreeMap::from([("value".to_owned(), "c".repeat(1024))])),
                            ..Default::default()
                        };
                        Api::<ConfigMap>::namespaced(client.clone(), namespace)
                            .create(&pp, &c)
                            .await?;
                    }
                }
                Ok::<_, anyhow::Error>(())
            }
        })
        .buffer_unordered(concurrency.max(1))
        .try_collect::<Vec<_>>()
        .await
        .context("bare client loop")?;
    Ok(started.elapsed())
}

/// The system's trust roots as DER, read once.
fn system_roots() -> Vec<Vec<u8>> {
    rustls_native_certs::load_native_certs()
        .certs
        .into_iter()
        .map(|c| c.to_vec())
        .collect()
}

async fn bare_client(t: &ClusterInfo, roots: &[Vec<u8>]) -> anyhow::Result<Client> {
    let options = KubeConfigOptions {
        context: Some(t.context.clone()),
        ..Default::default()
    };
    let mut config =
        kube::Config::from_custom_kubeconfig(Kubeconfig::read_from(&t.kubeconfig)?, &options)
            .await?;
    if config.root_cert.is_none() {
        config.root_cert = Some(roots.to_vec());
    }
    Ok(Client::try_from(config)?)
}

async fn measure(
    settings: &FleetSettings,
    upstream: &ClusterInfo,
    downstream: &'static str,
    targets: &[ClusterInfo],
    servers: Servers<'_>,
    namespace: &str,
) -> anyhow::Result<Row> {
    let up = upstream.client().await;
    prepare(&up, namespace, targets, settings.resources).await?;
    let n = targets.len();
    eprintln!(
        "{downstream}: {n} clusters x {} resources: bare loop ...",
        settings.resources
    );
    let (w0, r0) = servers.totals().await?;
    let bare = bare_loop(targets, "bare", settings.resources, settings.concurrency).await?;
    let (w1, r1) = servers.totals().await?;
    servers.settle().await?;
    eprintln!("{downstream}: cold propagate ...");
    let (w2, r2) = servers.totals().await?;
    let cold = run_plugin(settings, upstream, namespace).await?;
    let (w3, r3) = servers.totals().await?;
    servers.settle().await?;
    eprintln!("{downstream}: unchanged propagate ...");
    let (w4, r4) = servers.totals().await?;
    let unchanged = run_plugin(settings, upstream, namespace).await?;
    let (w5, r5) = servers.totals().await?;
    Ok(Row {
        downstream,
        clusters: n,
        copies: n * settings.resources,
        cold: cold.wall,
        cold_writes: w3 - w2,
        cold_requests: r3 - r2,
        cold_reported_writes: cold.reported_writes,
        bare,
        bare_writes: w1 - w0,
        bare_requests: r1 - r0,
        unchanged: unchanged.wall,
        unchanged_writes: w5 - w4,
        unchanged_requests: r5 - r4,
        unchanged_states: unchanged.states,
    })
}

pub async fn run(settings: &FleetSettings) -> anyhow::Result<Vec<Row>> {
    if !settings.plugin_bin.is_file() {
        bail!(
            "{} not found: build it first with `cargo build --release -p kubectl-helmop`",
            settings.plugin_bin.display()
        );
    }
    let mut names = vec!["upstream".to_owned()];
    names.extend((1..=settings.real).map(|i| format!("down{i}")));
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    eprintln!(
        "starting a private control plane with {} API servers ...",
        refs.len()
    );
    let cluster = fixtures::start(&refs).await?;
    let upstream = cluster.cp.clusters[0].clone();
    let mut rows = Vec::new();
    if settings.real > 0 {
        let real: Vec<ClusterInfo> = cluster.cp.clusters[1..].to_vec();
        let mut clients = Vec::new();
        for r in &real {
            clients.push(r.client().await);
        }
        rows.push(
            measure(
                settings,
                &upstream,
                "kube-apiserver",
                &real,
                Servers::Real(&clients),
                "fleet-real",
            )
            .await?,
        );
    }
    for &n in &settings.clusters {
        let fleet = Fleet::start(n).await?;
        let namespace = format!("fleet-sim-{n}");
        rows.push(
            measure(
                settings,
                &upstream,
                "fleetsim",
                &fleet.infos.clone(),
                Servers::Sim(&fleet),
                &namespace,
            )
            .await?,
        );
    }
    Ok(rows)
}

pub fn table(rows: &[Row], settings: &FleetSettings) -> String {
    let mut out = format!(
        "{} resources per cluster (half Secrets, half ConfigMaps, 1 KiB each), one HelmOp with a target per \
         cluster, `--concurrency {}` for the plugin and the bare loop alike. Writes and requests counted by the \
         servers (kube-apiserver: `apiserver_request_total`, leases/endpoints/events excluded, including the \
         controller-manager's reactions to new namespaces).\n\n\
         | downstream | clusters | copies | bare loop s | bare copies/s | cold propagate s | cold copies/s | ratio | \
         cold writes (plugin says) / bare writes | cold requests / bare requests | unchanged s | unchanged writes | unchanged requests | unchanged rows |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---:|---:|---|\n",
        settings.resources, settings.concurrency
    );
    for r in rows {
        let rate = |d: Duration| r.copies as f64 / d.as_secs_f64().max(1e-9);
        out.push_str(&format!(
            "| {} | {} | {} | {:.2} | {:.0} | {:.2} | {:.0} | {:.2} | {} ({}) / {} | {} / {} | {:.2} | {} | {} | {} |\n",
            r.downstream,
            r.clusters,
            r.copies,
            r.bare.as_secs_f64(),
            rate(r.bare),
            r.cold.as_secs_f64(),
            rate(r.cold),
            rate(r.cold) / rate(r.bare).max(1e-9),
            r.cold_writes,
            r.cold_reported_writes,
            r.bare_writes,
            r.cold_requests,
            r.bare_requests,
            r.unchanged.as_secs_f64(),
            r.unchanged_writes,
            r.unchanged_requests,
            r.unchanged_states,
        ));
    }
    out
}
