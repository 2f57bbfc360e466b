//! `helmop-bench memory`: RSS of the real `helmop-webhook` process (read from `/proc/PID/status`) on an empty
//! cluster, after its caches hold thousands of Secrets and ConfigMaps, and during and after a soak with
//! certificate rotations.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use helmop_tests::{wait_for, wait_until};

use crate::fixtures;
use crate::load::{self, Load, Outcome, Target};
use crate::machine::rss_kib;
use crate::pki::{Pki, SecretVolume};
use crate::scenarios;
use crate::soak::{self, SoakReport, SoakSettings};
use crate::stats::mib;

#[derive(Debug, Clone)]
pub struct MemorySettings {
    pub webhook_bin: PathBuf,
    /// Secrets, and as many ConfigMaps, created in the cluster.
    pub per_kind: usize,
    pub namespaces: usize,
    pub parallel: usize,
    /// Soak after the caches are full; a zero duration skips it.
    pub soak: SoakSettings,
}

pub struct MemoryReport {
    pub idle_kib: u64,
    pub create_time: Duration,
    pub sync_time: Duration,
    pub synced_kib: u64,
    pub cached: (u64, u64),
    pub soak: Option<(SoakReport, Outcome)>,
    pub after_soak_kib: Option<u64>,
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// `GET path` on the plain-HTTP admin port: (status line, body).
pub async fn admin_get(port: u16, path: &str) -> anyhow::Result<(String, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").as_bytes())
        .await?;
    let mut text = String::new();
    stream.read_to_string(&mut text).await?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    Ok((
        head.lines().next().unwrap_or("").to_owned(),
        body.to_owned(),
    ))
}

/// `helmop_webhook_cache_objects{cache="CACHE"}` in the `/metrics` text (0 before it is reported).
pub fn cache_objects(metrics: &str, cache: &str) -> Option<u64> {
    let series = format!("helmop_webhook_cache_objects{{cache=\"{cache}\"}}");
    helmop_tests::metric_value(metrics, &series)
        .ok()
        .map(|v| v as u64)
}

/// The real `helmop-webhook` against `cluster`, serving the certificate of `volume` on loopback, ready.
pub struct WebhookProcess {
    pub child: tokio::process::Child,
    pub pid: String,
    pub port: u16,
    pub admin_port: u16,
}

impl WebhookProcess {
    pub async fn start(
        bin: &std::path::Path,
        cluster: &fixtures::Cluster,
        volume: &SecretVolume,
        extra: &[&str],
    ) -> anyhow::Result<WebhookProcess> {
        let (port, admin_port) = (free_port()?, free_port()?);
        let log_path = volume.path().join("..webhook.log");
        let log = std::fs::File::create(&log_path)?;
        let child = tokio::process::Command::new(bin)
            .arg("--listen")
            .arg(format!("127.0.0.1:{port}"))
            .arg("--admin-listen")
            .arg(format!("127.0.0.1:{admin_port}"))
            .arg("--tls-cert")
            .arg(volume.cert())
            .arg("--tls-key")
            .arg(volume.key())
            .arg("--cert-poll-ms")
            .arg("200")
            .arg("--image-mode")
            .arg("off")
            .args(extra)
            .env("KUBECONFIG", &cluster.info().kubeconfig)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child
            .id()
            .context("the webhook exited at once")?
            .to_string();
        wait_until(
            "the webhook to be ready",
            Duration::from_secs(60),
            || async {
                let (status, _) = admin_get(admin_port, "/readyz").await?;
                Ok(status.contains(" 200"))
            },
        )
        .await
        .with_context(|| format!("webhook log: {}", log_path.display()))?;
        Ok(WebhookProcess {
            child,
            pid,
            port,
            admin_port,
        })
    }
}

pub async fn run(settings: &MemorySettings) -> anyhow::Result<MemoryReport> {
    if !settings.webhook_bin.is_file() {
        bail!(
            "{} not found: build it first with `cargo build --release -p helmop-webhook`",
            settings.webhook_bin.display()
        );
    }
    eprintln!("starting a private control plane ...");
    let cluster = fixtures::start(&["memory"]).await?;
    fixtures::create_hash_key(&cluster.client).await?;
    fixtures::create_scenario_objects(&cluster.client).await?;

    let pki = Pki::new()?;
    let mut volume = SecretVolume::new(&pki.leaf("helmop-webhook-0")?)?;
    let process = WebhookProcess::start(&settings.webhook_bin, &cluster, &volume, &[]).await?;
    let (port, admin_port, pid) = (process.port, process.admin_port, process.pid.clone());
    let mut child = process.child;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let idle_kib = rss_kib(&pid).context("cannot read the webhook's RSS")?;
    eprintln!(
        "webhook ready, RSS {idle_kib} KiB; creating {} Secrets and {} ConfigMaps ...",
        settings.per_kind, settings.per_kind
    );

    let create_time = fixtures::create_many(
        &cluster.client,
        settings.per_kind,
        settings.namespaces,
        settings.parallel,
    )
    .await?;
    let sync_started = Instant::now();
    let want = settings.per_kind as u64;
    let cached = wait_for(
        "the caches to hold every object",
        Duration::from_secs(300),
        || async {
            let (_, body) = admin_get(admin_port, "/metrics").await?;
            let s = cache_objects(&body, "secrets");
            let c = cache_objects(&body, "configmaps");
            Ok(s.zip(c).filter(|(s, c)| *s >= want && *c >= want))
        },
    )
    .await?;
    let sync_time = sync_started.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let synced_kib = rss_kib(&pid).context("cannot read the webhook's RSS")?;
    eprintln!("caches synced ({cached:?}), RSS {synced_kib} KiB");

    let (soak, after_soak_kib) = if settings.soak.duration.is_zero() {
        (None, None)
    } else {
        let tls = pki.client_config()?;
        let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse()?;
        let mutate = Target {
            addr,
            tls: tls.clone(),
            path: "/mutate/workloads".to_owned(),
            body: scenarios::mutate_deployment(),
            check: scenarios::patched(),
        };
        let validate = Target {
            path: "/validate/helmops".to_owned(),
            body: scenarios::validate_helmop(),
            check: scenarios::clean_allow(),
            ..mutate.clone()
        };
        let half = (settings.soak.connections / 2).max(1);
        let validate_load = Load {
            connections: half,
            duration: settings.soak.duration,
            warmup: Duration::ZERO,
            requests_per_connection: Some(settings.soak.requests_per_connection),
        };
        let validating = tokio::spawn(async move { load::run(&validate, &validate_load).await });
        let soak_settings = SoakSettings {
            connections: half,
            ..settings.soak.clone()
        };
        eprintln!("soaking for {:?} ...", settings.soak.duration);
        let report = soak::run(&mutate, &mut volume, &pki, &pid, &soak_settings).await?;
        let validated = validating.await?;
        tokio::time::sleep(Duration::from_secs(3)).await;
        (Some((report, validated)), rss_kib(&pid))
    };
    let _ = child.start_kill();
    let _ = child.wait().await;
    Ok(MemoryReport {
        idle_kib,
        create_time,
        sync_time,
        synced_kib,
        cached,
        soak,
        after_soak_kib,
    })
}

pub fn table(r: &MemoryReport, s: &MemorySettings) -> String {
    let mut out = format!(
        "| state | webhook RSS MiB |\n|---|---:|\n| ready, empty cluster | {} |\n\
         | caches synced: {} Secrets + {} ConfigMaps cached (created in {:.1} s, {} parallel requests; caches caught up {:.1} s later) | {} |\n",
        mib(r.idle_kib),
        r.cached.0,
        r.cached.1,
        r.create_time.as_secs_f64(),
        s.parallel,
        r.sync_time.as_secs_f64(),
        mib(r.synced_kib),
    );
    if let Some((soak, validated)) = &r.soak {
        let (start, end, max) = soak.rss_start_end_max();
        out.push_str(&format!(
            "| soak start ({} s, mutate + validate, {} rotations) | {} |\n| soak end | {} |\n| soak max | {} |\n| 3 s after the soak | {} |\n",
            s.soak.duration.as_secs(),
            soak.rotations,
            mib(start),
            mib(end),
            mib(max),
            r.after_soak_kib.map_or("?".to_owned(), mib),
        ));
        let samples: Vec<String> = (0..=4)
            .filter_map(|q| soak.rss.get((soak.rss.len().saturating_sub(1)) * q / 4))
            .map(|(t, kib)| format!("{t:.0} s: {}", mib(*kib)))
            .collect();
        out.push_str(&format!(
            "\nRSS during the soak (MiB): {}\n",
            samples.join(", ")
        ));
        out.push_str(&format!(
            "\nSoak traffic: mutate: {}\nvalidate: {} ok ({:.0}/s), {} errors, p99 {:.3} ms\n",
            soak.summary(),
            validated.ok,
            validated.per_second(),
            validated.errors,
            validated.latencies.quantile(0.99).as_secs_f64() * 1000.0,
        ));
    }
    out
}
