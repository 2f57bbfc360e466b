//! Sustained load with certificate rotations in the middle (symlink swaps, as the kubelet updates a Secret
//! volume), sampling the server's RSS. `check` runs the real serving stack in-process with stub decisions
//! (no cluster: fits a test); `helmop-bench memory --soak-seconds N` does the same against the real webhook
//! process and cluster.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::future::BoxFuture;
use helmop_webhook::{Handlers, Metrics, ServeOptions, Server, Verdict, Webhook};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::load::{self, Load, Outcome, Target};
use crate::machine::rss_kib;
use crate::pki::{Pki, SecretVolume};
use crate::scenarios;

#[derive(Debug, Clone)]
pub struct SoakSettings {
    pub duration: Duration,
    pub connections: usize,
    pub rotate_every: Duration,
    /// Connections are reopened after this many requests, so handshakes keep happening across rotations.
    pub requests_per_connection: u64,
    pub sample_every: Duration,
}

impl Default for SoakSettings {
    fn default() -> Self {
        SoakSettings {
            duration: Duration::from_secs(20),
            connections: 8,
            rotate_every: Duration::from_secs(5),
            requests_per_connection: 500,
            sample_every: Duration::from_secs(1),
        }
    }
}

#[derive(Debug, Clone)]
pub struct SoakReport {
    pub outcome: Outcome,
    pub rotations: usize,
    /// Whether a fresh connection was served the last rotated-in certificate at the end.
    pub last_rotation_served: bool,
    /// (seconds since start, RSS KiB) of the server process.
    pub rss: Vec<(f64, u64)>,
}

impl SoakReport {
    pub fn rss_start_end_max(&self) -> (u64, u64, u64) {
        let start = self.rss.first().map_or(0, |s| s.1);
        let end = self.rss.last().map_or(0, |s| s.1);
        let max = self.rss.iter().map(|s| s.1).max().unwrap_or(0);
        (start, end, max)
    }

    pub fn summary(&self) -> String {
        let (start, end, max) = self.rss_start_end_max();
        format!(
            "{} requests ok ({:.0}/s), {} errors{}, {} handshakes, {} certificate rotations (last one served to new \
             connections: {}), server RSS start {:.1} MiB, end {:.1} MiB, max {:.1} MiB, p99 {:.3} ms",
            self.outcome.ok,
            self.outcome.per_second(),
            self.outcome.errors,
            self.outcome
                .first_error
                .as_ref()
                .map(|e| format!(" (first: {})", e.chars().take(100).collect::<String>()))
                .unwrap_or_default(),
            self.outcome.handshakes,
            self.rotations,
            self.last_rotation_served,
            start as f64 / 1024.0,
            end as f64 / 1024.0,
            max as f64 / 1024.0,
            self.outcome.latencies.quantile(0.99).as_secs_f64() * 1000.0,
        )
    }
}

async fn served_cert(target: &Target) -> anyhow::Result<CertificateDer<'static>> {
    let tcp = TcpStream::connect(target.addr).await?;
    let tls = TlsConnector::from(target.tls.clone())
        .connect(ServerName::try_from("localhost")?, tcp)
        .await?;
    tls.get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first())
        .map(|c| c.clone().into_owned())
        .context("no server certificate")
}

/// Loads `target` for `settings.duration`, swapping a new leaf into `volume` every `rotate_every`, sampling
/// the RSS of process `pid` (`"self"` for in-process servers).
pub async fn run(
    target: &Target,
    volume: &mut SecretVolume,
    pki: &Pki,
    pid: &str,
    settings: &SoakSettings,
) -> anyhow::Result<SoakReport> {
    let load = Load {
        connections: settings.connections,
        duration: settings.duration,
        warmup: Duration::ZERO,
        requests_per_connection: Some(settings.requests_per_connection),
    };
    let started = Instant::now();
    let running = {
        let target = target.clone();
        tokio::spawn(async move { load::run(&target, &load).await })
    };
    let mut rss = Vec::new();
    let mut rotations = 0;
    let mut last_leaf = None;
    let mut next_rotation = started + settings.rotate_every;
    let end = started + settings.duration;
    while Instant::now() < end {
        if let Some(kib) = rss_kib(pid) {
            rss.push((started.elapsed().as_secs_f64(), kib));
        }
        if Instant::now() >= next_rotation && next_rotation + settings.rotate_every / 2 < end {
            rotations += 1;
            let leaf = pki.leaf(&format!("helmop-webhook-{rotations}"))?;
            volume.swap_in(&leaf)?;
            last_leaf = Some(leaf.der);
            next_rotation += settings.rotate_every;
        }
        tokio::time::sleep(
            settings
                .sample_every
                .min(end.saturating_duration_since(Instant::now())),
        )
        .await;
    }
    let outcome = running.await.context("load generator failed")?;
    if let Some(kib) = rss_kib(pid) {
        rss.push((started.elapsed().as_secs_f64(), kib));
    }
    let last_rotation_served = match last_leaf {
        None => true,
        Some(der) => {
            // The server polls the files; give it a bounded time to pick up the last swap.
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                if served_cert(target).await.ok().as_ref() == Some(&der) {
                    break true;
                }
                if Instant::now() > deadline {
                    break false;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    Ok(SoakReport {
        outcome,
        rotations,
        last_rotation_served,
        rss,
    })
}

/// Allows HelmOps, patches workloads: the protocol work (decode, encode, log, metrics) without a cluster.
struct StubHandlers;

impl Handlers for StubHandlers {
    fn review<'a>(
        &'a self,
        webhook: Webhook,
        _req: &'a helmop_webhook::admission::Request,
    ) -> BoxFuture<'a, Verdict> {
        Box::pin(async move {
            match webhook {
                Webhook::Workloads => {
                    let patch = serde_json::from_value(serde_json::json!([{
                        "op": "add",
                        "path": "/spec/template/metadata/annotations",
                        "value": {"helmop.dev/config-hash": "v1:0123456789abcdef"},
                    }]));
                    Verdict::Allow {
                        patch: patch.ok(),
                        warnings: Vec::new(),
                    }
                }
                _ => Verdict::allow(),
            }
        })
    }

    fn ready(&self) -> bool {
        true
    }
}

/// The in-process soak: the real `Server` with stub decisions, HelmOp validations under load, rotations.
pub async fn check(settings: &SoakSettings) -> anyhow::Result<SoakReport> {
    let pki = Pki::new()?;
    let mut volume = SecretVolume::new(&pki.leaf("helmop-webhook-0")?)?;
    let options = ServeOptions {
        listen: "127.0.0.1:0".parse()?,
        admin_listen: "127.0.0.1:0".parse()?,
        tls_cert: volume.cert(),
        tls_key: volume.key(),
        cert_poll_interval: Duration::from_millis(200),
        ..ServeOptions::default()
    };
    let server = Server::bind(options, Arc::new(StubHandlers), Metrics::new()).await?;
    let target = Target {
        addr: server.webhook_addr(),
        tls: pki.client_config()?,
        path: Webhook::Helmops.path().to_owned(),
        body: scenarios::validate_helmop(),
        check: scenarios::clean_allow(),
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn(server.run(async move {
        let _ = stopped.await;
    }));
    let report = run(&target, &mut volume, &pki, "self", settings).await;
    let _ = stop.send(());
    let _ = serving.await;
    report
}

/// What is wrong with a soak: errors, a rotation not picked up, RSS growth beyond `max_growth_kib`
/// between the first sample after warm-up and the end.
pub fn problems(report: &SoakReport, max_growth_kib: u64) -> Vec<String> {
    let mut out = Vec::new();
    if report.outcome.errors > 0 {
        out.push(format!(
            "{} requests failed (first: {})",
            report.outcome.errors,
            report.outcome.first_error.as_deref().unwrap_or("?")
        ));
    }
    if report.outcome.ok == 0 {
        out.push("no request succeeded".to_owned());
    }
    if report.rotations == 0 || !report.last_rotation_served {
        out.push(format!(
            "{} rotations, last one served to new connections: {}",
            report.rotations, report.last_rotation_served
        ));
    }
    // The first seconds allocate connection and TLS state for good; growth is judged from a quarter in.
    let settled = report.rss.get(report.rss.len() / 4).map_or(0, |s| s.1);
    let end = report.rss.last().map_or(0, |s| s.1);
    if end > settled + max_growth_kib {
        out.push(format!("RSS grew from {settled} KiB to {end} KiB"));
    }
    out
}
