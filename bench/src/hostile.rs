//! `helmop-bench hostile`: RSS of the real `helmop-webhook` process under hostile input:
//! HelmOps carrying 1 MiB of `helm.values` in its watch cache, then many concurrent 7 MiB admission bodies.
//! A measurement, not a test: the numbers go into docs/webhook-safety.md.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use kube::api::{DynamicObject, PostParams};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::fixtures;
use crate::machine::rss_kib;
use crate::memory::{WebhookProcess, admin_get, cache_objects};
use crate::pki::{Pki, SecretVolume};
use crate::scenarios;
use crate::stats::{Latencies, mib, ms};

#[derive(Debug, Clone)]
pub struct HostileSettings {
    pub webhook_bin: PathBuf,
    /// Concurrent connections, each posting one body per round.
    pub bodies: usize,
    pub body_bytes: usize,
    pub rounds: usize,
    /// HelmOps created, each with `values_bytes` of `helm.values`.
    pub helmops: usize,
    pub values_bytes: usize,
    /// Extra `helmop-webhook` flags (e.g. other `--max-in-flight-bytes`).
    pub webhook_args: Vec<String>,
    /// Values and bodies of dense lists (`[0,0,...]`, two bytes per JSON value) instead of one long
    /// string: the input that multiplies memory once parsed. The bodies are then UPDATEs carrying
    /// such an object and old object.
    pub dense: bool,
    /// Pin the webhook process (all its threads) to one CPU, as `limits.cpu: "1"` gives it.
    pub one_cpu: bool,
}

pub struct HostileReport {
    pub idle_kib: u64,
    /// Highest RSS sampled (every 10 ms) while the bodies were in flight.
    pub bodies_max_kib: u64,
    /// HTTP status (0: no answer) -> count.
    pub statuses: BTreeMap<u16, usize>,
    pub bodies_time: Duration,
    pub after_bodies_kib: u64,
    pub helmops_cached: u64,
    pub helmops_kib: u64,
    pub helmops_max_kib: u64,
    pub healthy: bool,
    /// Benign HelmOp admissions (another namespace's, one at a time) while the hostile bodies arrived.
    pub benign: Latencies,
    /// Of those, the ones not answered 200 + allowed.
    pub benign_failed: usize,
    /// `/healthz` on the admin port, every 20 ms meanwhile.
    pub healthz: Latencies,
    pub healthz_failed: usize,
}

/// Until `stop`: one benign admission after another (a clean HelmOp review of the fixtures' namespace),
/// each timed, failures counted (not 200, or not allowed).
fn benign_load(
    port: u16,
    tls: Arc<rustls::ClientConfig>,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Vec<u64>, usize)> {
    tokio::spawn(async move {
        let body = scenarios::validate_helmop();
        let (mut samples, mut failed) = (Vec::new(), 0);
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let answer = post_for_body(port, tls.clone(), body.clone()).await;
            samples.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
            let allowed = matches!(&answer, Ok((200, text)) if text.contains("\"allowed\":true"));
            failed += usize::from(!allowed);
        }
        (samples, failed)
    })
}

/// Until `stop`: `/healthz` every 20 ms, timed.
fn healthz_probe(
    admin_port: u16,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(Vec<u64>, usize)> {
    tokio::spawn(async move {
        let (mut samples, mut failed) = (Vec::new(), 0);
        while !stop.load(Ordering::Relaxed) {
            let started = Instant::now();
            let ok = matches!(admin_get(admin_port, "/healthz").await, Ok((status, _)) if status.contains(" 200"));
            samples.push(u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX));
            failed += usize::from(!ok);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (samples, failed)
    })
}

/// Samples the RSS of `pid` every 10 ms until `stop`, keeping the maximum.
fn sample_max(pid: String, stop: Arc<AtomicBool>) -> (Arc<AtomicU64>, tokio::task::JoinHandle<()>) {
    let max = Arc::new(AtomicU64::new(0));
    let seen = max.clone();
    let task = tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            if let Some(kib) = rss_kib(&pid) {
                seen.fetch_max(kib, Ordering::Relaxed);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    (max, task)
}

/// A HelmOp review padded (in an annotation of the object) to `size` bytes.
fn padded_review(size: usize) -> anyhow::Result<Bytes> {
    let mut review: Value = serde_json::from_slice(&scenarios::validate_helmop())?;
    review["request"]["object"]["metadata"]["annotations"] = json!({"pad": ""});
    let base = serde_json::to_vec(&review)?.len();
    review["request"]["object"]["metadata"]["annotations"]["pad"] =
        json!("x".repeat(size.saturating_sub(base)));
    Ok(Bytes::from(serde_json::to_vec(&review)?))
}

/// An UPDATE review of `size` bytes whose object and old object carry dense `helm.values` (two thirds of
/// the zeros in the object, one third in the old one, as an edit growing them).
fn dense_review(size: usize) -> anyhow::Result<Bytes> {
    let mut review: Value = serde_json::from_slice(&scenarios::validate_helmop())?;
    review["request"]["operation"] = json!("UPDATE");
    let base = serde_json::to_vec(&review)?.len() * 2;
    let zeros = size.saturating_sub(base) / 2;
    let old = review["request"]["object"].clone();
    review["request"]["oldObject"] = old;
    review["request"]["object"]["spec"]["helm"]["values"] =
        json!({"dense": vec![0; zeros * 2 / 3]});
    review["request"]["oldObject"]["spec"]["helm"]["values"] = json!({"dense": vec![0; zeros / 3]});
    Ok(Bytes::from(serde_json::to_vec(&review)?))
}

/// One POST on a fresh connection: the status and the answer's text.
async fn post_for_body(
    port: u16,
    tls: Arc<rustls::ClientConfig>,
    body: Bytes,
) -> anyhow::Result<(u16, String)> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).await?;
    let stream = TlsConnector::from(tls)
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let request = hyper::Request::post("/validate/helmops")
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(body))?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let bytes = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&bytes).into_owned()))
}

/// One POST on a fresh connection; the status, or 0 when no answer came.
async fn post(port: u16, tls: Arc<rustls::ClientConfig>, body: Bytes) -> anyhow::Result<u16> {
    Ok(post_for_body(port, tls, body).await?.0)
}

pub async fn run(settings: &HostileSettings) -> anyhow::Result<HostileReport> {
    eprintln!("starting a private control plane ...");
    let cluster = fixtures::start(&["hostile"]).await?;
    fixtures::create_hash_key(&cluster.client).await?;
    fixtures::create_scenario_objects(&cluster.client).await?;
    let pki = Pki::new()?;
    let volume = SecretVolume::new(&pki.leaf("helmop-webhook-0")?)?;
    let extra: Vec<&str> = settings.webhook_args.iter().map(String::as_str).collect();
    let process = WebhookProcess::start(&settings.webhook_bin, &cluster, &volume, &extra).await?;
    let (pid, mut child) = (process.pid.clone(), process.child);
    if settings.one_cpu {
        let out = std::process::Command::new("taskset")
            .args(["-a", "-p", "-c", "0", &pid])
            .output()
            .context("running taskset (util-linux)")?;
        anyhow::ensure!(
            out.status.success(),
            "taskset failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_kib = rss_kib(&pid).context("cannot read the webhook's RSS")?;
    eprintln!("webhook ready, RSS {idle_kib} KiB");

    eprintln!(
        "creating {} HelmOps with {} bytes of values ...",
        settings.helmops, settings.values_bytes
    );
    let stop = Arc::new(AtomicBool::new(false));
    let (max, sampler) = sample_max(pid.clone(), stop.clone());
    let api = helmop_tests::fleet_api(
        &cluster.client,
        fixtures::NAMESPACE,
        &helmop_tests::helmop_resource(),
    );
    let values = if settings.dense {
        json!({"dense": vec![0; settings.values_bytes / 2]})
    } else {
        json!({"blob": "v".repeat(settings.values_bytes)})
    };
    for i in 0..settings.helmops {
        let helmop: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "fleet.cattle.io/v1alpha1", "kind": "HelmOp",
            "metadata": {"name": format!("big-values-{i}"), "namespace": fixtures::NAMESPACE},
            "spec": {"helm": {"repo": "https://charts.example.com", "chart": "app", "version": "1.0.0",
                              "values": values},
                     "downstreamResources": [{"kind": "Secret", "name": "db"}]},
        }))?;
        api.create(&PostParams::default(), &helmop).await?;
    }
    let want = settings.helmops as u64;
    let helmops_cached = helmop_tests::wait_for(
        "the HelmOp cache to hold every HelmOp",
        Duration::from_secs(120),
        || async {
            let (_, body) = admin_get(process.admin_port, "/metrics").await?;
            Ok(cache_objects(&body, "helmops").filter(|n| *n >= want))
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    sampler.await?;
    let helmops_max_kib = max.load(Ordering::Relaxed);
    let helmops_kib = rss_kib(&pid).context("the webhook died")?;

    let body = if settings.dense {
        dense_review(settings.body_bytes)?
    } else {
        padded_review(settings.body_bytes)?
    };
    let tls = pki.client_config()?;
    let stop = Arc::new(AtomicBool::new(false));
    let (max, sampler) = sample_max(pid.clone(), stop.clone());
    let watching = Arc::new(AtomicBool::new(false));
    let benign = benign_load(process.port, tls.clone(), watching.clone());
    let healthz = healthz_probe(process.admin_port, watching.clone());
    let started = Instant::now();
    let mut statuses = BTreeMap::new();
    for round in 0..settings.rounds {
        let posts: Vec<_> = (0..settings.bodies)
            .map(|_| tokio::spawn(post(process.port, tls.clone(), body.clone())))
            .collect();
        for p in posts {
            let status = p.await?.unwrap_or(0);
            *statuses.entry(status).or_insert(0) += 1;
        }
        eprintln!("round {round}: {statuses:?}");
    }
    let bodies_time = started.elapsed();
    watching.store(true, Ordering::Relaxed);
    let (benign, benign_failed) = benign.await?;
    let (healthz, healthz_failed) = healthz.await?;
    stop.store(true, Ordering::Relaxed);
    sampler.await?;
    let bodies_max_kib = max.load(Ordering::Relaxed);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after_bodies_kib = rss_kib(&pid).context("the webhook died")?;

    let healthy = matches!(admin_get(process.admin_port, "/healthz").await, Ok((status, _)) if status.contains(" 200"));
    let _ = child.start_kill();
    let _ = child.wait().await;
    Ok(HostileReport {
        idle_kib,
        bodies_max_kib,
        statuses,
        bodies_time,
        after_bodies_kib,
        helmops_cached,
        helmops_kib,
        helmops_max_kib,
        healthy,
        benign: Latencies::from_samples(benign),
        benign_failed,
        healthz: Latencies::from_samples(healthz),
        healthz_failed,
    })
}

pub fn table(r: &HostileReport, s: &HostileSettings) -> String {
    let statuses: Vec<String> = r
        .statuses
        .iter()
        .map(|(status, n)| match status {
            0 => format!("{n} without an answer"),
            _ => format!("{n} x {status}"),
        })
        .collect();
    format!(
        "| state | webhook RSS MiB |\n|---|---:|\n| ready | {} |\n\
         | {} HelmOps with {:.1} MiB of values each cached (max while they arrived) | {} ({}) |\n\
         | max while {} connections post {:.1} MiB bodies, {} rounds ({:.1} s; {}) | {} |\n\
         | 3 s later | {} |\n\
         \nWebhook alive afterwards (/healthz 200): {}\n\
         Meanwhile: {} benign HelmOp admissions, p50 {} p99 {} max {}, {} not allowed; \
         /healthz {} probes, p99 {} max {}, {} failed{}\n",
        mib(r.idle_kib),
        r.helmops_cached,
        s.values_bytes as f64 / (1024.0 * 1024.0),
        mib(r.helmops_kib),
        mib(r.helmops_max_kib),
        s.bodies,
        s.body_bytes as f64 / (1024.0 * 1024.0),
        s.rounds,
        r.bodies_time.as_secs_f64(),
        statuses.join(", "),
        mib(r.bodies_max_kib),
        mib(r.after_bodies_kib),
        if r.healthy { "yes" } else { "NO" },
        r.benign.len(),
        ms(r.benign.quantile(0.5)),
        ms(r.benign.quantile(0.99)),
        ms(r.benign.max()),
        r.benign_failed,
        r.healthz.len(),
        ms(r.healthz.quantile(0.99)),
        ms(r.healthz.max()),
        r.healthz_failed,
        if s.one_cpu {
            " (webhook pinned to one CPU)"
        } else {
            ""
        },
    )
}
