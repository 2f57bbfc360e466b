//! `helmop-bench propagate`: wall time of `kubectl-helmop propagate` (the built binary) over N Fleet Clusters
//! x M resources, cold and unchanged, at several `--concurrency` values, with the writes each run made counted
//! by the API servers themselves (`apiserver_request_total` on every kube-apiserver's `/metrics`).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use axum::http::Request;
use helmop_tests::{ClusterInfo, register_fleet_cluster};
use kube::Client;
use serde_json::{Value, json};

use crate::fixtures;

#[derive(Debug, Clone)]
pub struct PropagateSettings {
    pub plugin_bin: PathBuf,
    /// Downstream API servers (besides the upstream one).
    pub apiservers: usize,
    pub clusters: Vec<usize>,
    pub resources: usize,
    pub concurrency: Vec<usize>,
}

#[derive(Debug, Clone)]
pub struct Run {
    pub wall: Duration,
    /// Writes counted by the API servers, by resource (leases, endpoints and events excluded: the
    /// controller-managers write those on their own).
    pub writes: BTreeMap<String, u64>,
    /// Requests of any verb to the API servers (same exclusions).
    pub requests: u64,
    /// `summary.writes` of the plugin's JSON report.
    pub reported_writes: Option<u64>,
    /// `summary.clusters` and `summary.states` of the plugin's JSON report: proof every copy was looked at.
    pub reported_clusters: Option<u64>,
    pub reported_states: BTreeMap<String, u64>,
    pub exit_code: i32,
}

impl Run {
    pub fn total_writes(&self) -> u64 {
        self.writes.values().sum()
    }
}

#[derive(Debug, Clone)]
pub struct Row {
    pub clusters: usize,
    pub concurrency: usize,
    pub cold: Run,
    pub unchanged: Run,
}

const WRITE_VERBS: [&str; 5] = ["POST", "PUT", "PATCH", "DELETE", "APPLY"];
const BACKGROUND: [&str; 3] = ["leases", "endpoints", "events"];

fn label<'a>(labels: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let start = labels.find(&key)? + key.len();
    let rest = &labels[start..];
    Some(&rest[..rest.find('"')?])
}

/// (writes by resource, all requests) summed over one API server's `apiserver_request_total`.
fn count(metrics: &str) -> (BTreeMap<String, u64>, u64) {
    let mut writes = BTreeMap::new();
    let mut requests = 0;
    for line in metrics.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.split_once("} ") else {
            continue;
        };
        let resource = label(labels, "resource").unwrap_or("");
        if BACKGROUND.contains(&resource) {
            continue;
        }
        let n = value.trim().parse::<f64>().unwrap_or(0.0) as u64;
        requests += n;
        if label(labels, "verb").is_some_and(|v| WRITE_VERBS.contains(&v)) {
            *writes.entry(resource.to_owned()).or_insert(0) += n;
        }
    }
    (writes, requests)
}

pub async fn scrape(clients: &[Client]) -> anyhow::Result<(BTreeMap<String, u64>, u64)> {
    let mut writes = BTreeMap::new();
    let mut requests = 0;
    for client in clients {
        let text = client
            .request_text(Request::get("/metrics").body(Vec::new())?)
            .await
            .context("reading kube-apiserver /metrics")?;
        let (w, r) = count(&text);
        for (k, v) in w {
            *writes.entry(k).or_insert(0) += v;
        }
        requests += r;
    }
    Ok((writes, requests))
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0).min(*v)))
        .filter(|(_, v)| *v > 0)
        .collect()
}

async fn propagate(
    settings: &PropagateSettings,
    upstream: &ClusterInfo,
    namespace: &str,
    concurrency: usize,
    clients: &[Client],
) -> anyhow::Result<Run> {
    let (writes_before, requests_before) = scrape(clients).await?;
    let (output, wall) = fixtures::timed_propagate(
        &settings.plugin_bin,
        &upstream.kubeconfig,
        namespace,
        concurrency,
    )
    .await?;
    let (writes_after, requests_after) = scrape(clients).await?;
    let report: Option<Value> = serde_json::from_slice(&output.stdout).ok();
    let reported_writes = report
        .as_ref()
        .and_then(|r| r.pointer("/summary/writes"))
        .and_then(Value::as_u64);
    let reported_clusters = report
        .as_ref()
        .and_then(|r| r.pointer("/summary/clusters"))
        .and_then(Value::as_u64);
    let reported_states = report
        .as_ref()
        .and_then(|r| r.pointer("/summary/states"))
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect()
        })
        .unwrap_or_default();
    let exit_code = output.status.code().unwrap_or(-1);
    if exit_code != 0 {
        bail!(
            "propagate exited {exit_code}: {}\n{}",
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
                .chars()
                .take(2000)
                .collect::<String>()
        );
    }
    Ok(Run {
        wall,
        writes: diff(&writes_after, &writes_before),
        // The two scrapes themselves are requests too (one per API server, before): not counted.
        requests: requests_after.saturating_sub(requests_before + clients.len() as u64),
        reported_writes,
        reported_clusters,
        reported_states,
        exit_code,
    })
}

/// Waits (at most 60 s) until no API server sees a write for 3 s.
pub async fn settle(clients: &[Client]) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = scrape(clients).await?.0;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(3)).await;
        let now = scrape(clients).await?.0;
        if now == last {
            return Ok(());
        }
        last = now;
    }
    Ok(())
}

/// One upstream namespace per (N, concurrency) so every cold run is really cold: N Clusters spread
/// round-robin over the downstream API servers, each targeted into its own destination namespace.
async fn prepare(
    upstream: &Client,
    downstream: &[ClusterInfo],
    namespace: &str,
    clusters: usize,
    resources: usize,
) -> anyhow::Result<()> {
    fixtures::create_namespace(upstream, namespace, &[]).await?;
    let mut entries = Vec::new();
    for r in 0..resources {
        let name = format!("res-{r}");
        if r % 2 == 0 {
            let data = BTreeMap::from([("value".to_owned(), vec![b's'; 1024])]);
            kube::Api::namespaced(upstream.clone(), namespace)
                .create(
                    &Default::default(),
                    &fixtures::secret(namespace, &name, data),
                )
                .await?;
            entries.push(json!({"kind": "Secret", "name": name}));
        } else {
            let data = BTreeMap::from([("value".to_owned(), "c".repeat(1024))]);
            kube::Api::namespaced(upstream.clone(), namespace)
                .create(
                    &Default::default(),
                    &fixtures::config_map(namespace, &name, data),
                )
                .await?;
            entries.push(json!({"kind": "ConfigMap", "name": name}));
        }
    }
    let mut targets = Vec::new();
    for c in 0..clusters {
        let name = format!("c{c}");
        register_fleet_cluster(
            upstream,
            namespace,
            &name,
            &[("bench", "yes")],
            &downstream[c % downstream.len()],
        )
        .await?;
        targets.push(
            json!({"name": name, "clusterName": name, "namespace": format!("{namespace}-c{c}")}),
        );
    }
    fixtures::apply_app_helmop(upstream, namespace, &entries, &targets).await?;
    Ok(())
}

pub async fn run(settings: &PropagateSettings) -> anyhow::Result<Vec<Row>> {
    fixtures::require_plugin(&settings.plugin_bin)?;
    let cluster = fixtures::start_with_downstreams(settings.apiservers).await?;
    let upstream = cluster.cp.clusters[0].clone();
    let downstream: Vec<ClusterInfo> = cluster.cp.clusters[1..].to_vec();
    let mut clients = vec![cluster.client.clone()];
    for d in &downstream {
        clients.push(d.client().await);
    }
    let mut rows = Vec::new();
    for &n in &settings.clusters {
        for &c in &settings.concurrency {
            let namespace = format!("bench-n{n}-c{c}");
            prepare(
                &cluster.client,
                &downstream,
                &namespace,
                n,
                settings.resources,
            )
            .await?;
            eprintln!(
                "propagate: {n} clusters x {} resources, --concurrency {c} ...",
                settings.resources
            );
            let cold = propagate(settings, &upstream, &namespace, c, &clients).await?;
            // The controller-managers react to the new namespaces (ServiceAccount, token Secret, root CA
            // ConfigMap); let that finish so the rerun's count is the plugin's alone.
            settle(&clients).await?;
            let unchanged = propagate(settings, &upstream, &namespace, c, &clients).await?;
            rows.push(Row {
                clusters: n,
                concurrency: c,
                cold,
                unchanged,
            });
        }
    }
    Ok(rows)
}

fn writes(run: &Run) -> String {
    let detail: Vec<String> = run.writes.iter().map(|(k, v)| format!("{v} {k}")).collect();
    let reported = run
        .reported_writes
        .map_or(String::new(), |w| format!("; plugin says {w}"));
    if detail.is_empty() {
        format!("0{reported}")
    } else {
        format!("{} ({}){reported}", run.total_writes(), detail.join(", "))
    }
}

fn states(run: &Run) -> String {
    let states: Vec<String> = run
        .reported_states
        .iter()
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    format!(
        "{} clusters: {}",
        run.reported_clusters
            .map_or("?".to_owned(), |c| c.to_string()),
        states.join(", ")
    )
}

pub fn table(rows: &[Row], settings: &PropagateSettings) -> String {
    let mut out = format!(
        "{} resources (half Secrets, half ConfigMaps, 1 KiB each) per HelmOp; Clusters spread over {} downstream \
         kube-apiservers, each Cluster into its own namespace. Writes and requests counted by the API servers \
         (`apiserver_request_total`, leases/endpoints/events excluded).\n\n\
         | clusters | --concurrency | cold s | cold writes (API servers) | unchanged s | unchanged writes | unchanged requests | unchanged rows (plugin) | unchanged / cold time |\n\
         |---:|---:|---:|---|---:|---|---:|---|---:|\n",
        settings.resources, settings.apiservers
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {} | {:.2} | {} | {:.2} | {} | {} | {} | {:.2} |\n",
            r.clusters,
            r.concurrency,
            r.cold.wall.as_secs_f64(),
            writes(&r.cold),
            r.unchanged.wall.as_secs_f64(),
            writes(&r.unchanged),
            r.unchanged.requests,
            states(&r.unchanged),
            r.unchanged.wall.as_secs_f64() / r.cold.wall.as_secs_f64().max(1e-9),
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_writes_by_resource_without_background_traffic() {
        let metrics = r#"# HELP apiserver_request_total x
apiserver_request_total{code="201",component="apiserver",dry_run="",group="",resource="secrets",scope="namespace",subresource="",verb="POST",version="v1"} 3
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="secrets",scope="namespace",subresource="",verb="APPLY",version="v1"} 2
apiserver_request_total{code="200",component="apiserver",dry_run="",group="",resource="secrets",scope="namespace",subresource="",verb="GET",version="v1"} 10
apiserver_request_total{code="200",component="apiserver",dry_run="",group="coordination.k8s.io",resource="leases",scope="namespace",subresource="",verb="PUT",version="v1"} 99
"#;
        let (writes, requests) = count(metrics);
        assert_eq!(writes, BTreeMap::from([("secrets".to_owned(), 5)]));
        assert_eq!(requests, 15);
    }
}
