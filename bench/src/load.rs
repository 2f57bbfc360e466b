//! A closed-loop HTTPS load generator: a fixed number of HTTP/1.1 keep-alive connections over rustls, each
//! sending the next request as soon as the previous answer is read, every latency recorded.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Request;
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use crate::stats::Latencies;

/// Decides whether a 200 answer is the right one (e.g. `allowed` as expected).
pub type Check = Arc<dyn Fn(&[u8]) -> bool + Send + Sync>;

/// What to send where.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub tls: Arc<rustls::ClientConfig>,
    pub path: String,
    pub body: Bytes,
    pub check: Check,
}

/// How hard and how long.
#[derive(Debug, Clone)]
pub struct Load {
    pub connections: usize,
    pub duration: Duration,
    /// Requests sent before measuring starts (connections set up, caches warm); not recorded.
    pub warmup: Duration,
    /// Close and reopen a connection after this many requests (new TLS handshakes during a soak).
    pub requests_per_connection: Option<u64>,
}

/// The outcome of one run.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub ok: u64,
    pub errors: u64,
    /// Requests that failed because their connection broke under them (counted in `errors` too).
    pub connection_errors: u64,
    pub handshakes: u64,
    pub elapsed: Duration,
    pub latencies: Latencies,
    pub first_error: Option<String>,
    /// CPU time of this whole process (load generator and in-process servers) during the measured window: on a
    /// machine shared with other work this, per request, is steadier than throughput.
    pub cpu: Duration,
}

impl Outcome {
    pub fn per_second(&self) -> f64 {
        self.ok as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    /// Process CPU microseconds per request answered in the measured window.
    pub fn cpu_us_per_request(&self) -> f64 {
        self.cpu.as_secs_f64() * 1e6 / (self.ok.max(1)) as f64
    }

    /// Adds a later run of the same contender (rounds interleaved with its baseline's).
    pub fn absorb(&mut self, other: Outcome) {
        self.ok += other.ok;
        self.errors += other.errors;
        self.connection_errors += other.connection_errors;
        self.handshakes += other.handshakes;
        self.elapsed += other.elapsed;
        self.cpu += other.cpu;
        self.latencies.merge(other.latencies);
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }
}

#[derive(Default)]
struct WorkerOutcome {
    ok: u64,
    errors: u64,
    connection_errors: u64,
    handshakes: u64,
    samples: Vec<u64>,
    first_error: Option<String>,
}

impl WorkerOutcome {
    fn error(&mut self, what: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(what);
        }
    }
}

async fn connect(target: &Target) -> anyhow::Result<SendRequest<Full<Bytes>>> {
    let tcp = TcpStream::connect(target.addr)
        .await
        .with_context(|| format!("connecting to {}", target.addr))?;
    tcp.set_nodelay(true)?;
    let tls = TlsConnector::from(target.tls.clone())
        .connect(ServerName::try_from("localhost")?, tcp)
        .await
        .context("TLS handshake")?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    Ok(sender)
}

/// One request; `Err` with `true` when the connection is unusable afterwards.
async fn exchange(
    sender: &mut SendRequest<Full<Bytes>>,
    target: &Target,
) -> Result<(), (bool, String)> {
    sender
        .ready()
        .await
        .map_err(|e| (true, format!("connection not ready: {e}")))?;
    let request = Request::builder()
        .method("POST")
        .uri(target.path.as_str())
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(target.body.clone()))
        .map_err(|e| (false, e.to_string()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| (true, format!("request failed: {e}")))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| (true, format!("body failed: {e}")))?
        .to_bytes();
    if !status.is_success() {
        return Err((
            false,
            format!("HTTP {status}: {}", String::from_utf8_lossy(&body)),
        ));
    }
    if !(target.check)(&body) {
        return Err((
            false,
            format!("unexpected answer: {}", String::from_utf8_lossy(&body)),
        ));
    }
    Ok(())
}

async fn worker(target: Target, load: Load, measure_from: Instant) -> WorkerOutcome {
    let end = measure_from + load.duration;
    let mut out = WorkerOutcome {
        samples: Vec::with_capacity(64 * 1024),
        ..Default::default()
    };
    let mut sender: Option<SendRequest<Full<Bytes>>> = None;
    let mut on_this_connection = 0u64;
    loop {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let measuring = now >= measure_from;
        if sender.is_none()
            || load
                .requests_per_connection
                .is_some_and(|max| on_this_connection >= max)
        {
            match connect(&target).await {
                Ok(s) => {
                    sender = Some(s);
                    on_this_connection = 0;
                    out.handshakes += 1;
                }
                Err(e) => {
                    if measuring {
                        out.connection_errors += 1;
                        out.error(format!("{e:#}"));
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            }
        }
        let Some(s) = sender.as_mut() else { continue };
        let sent = Instant::now();
        let result = exchange(s, &target).await;
        let latency = sent.elapsed();
        on_this_connection += 1;
        match result {
            Ok(()) => {
                if sent >= measure_from && sent < end {
                    out.ok += 1;
                    out.samples
                        .push(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
                }
            }
            Err((broken, what)) => {
                if broken {
                    sender = None;
                }
                if sent >= measure_from {
                    if broken {
                        out.connection_errors += 1;
                    }
                    out.error(what);
                }
            }
        }
    }
    out
}

/// The process CPU time used between `from` and `to` (zero where it cannot be read).
fn cpu_window(from: Instant, to: Instant) -> tokio::task::JoinHandle<Duration> {
    tokio::spawn(async move {
        tokio::time::sleep_until(from.into()).await;
        let start = crate::machine::process_cpu();
        tokio::time::sleep_until(to.into()).await;
        match (start, crate::machine::process_cpu()) {
            (Some(start), Some(end)) => end.saturating_sub(start),
            _ => Duration::ZERO,
        }
    })
}

/// Runs `load` against `target`; throughput counts requests completed inside the measured window.
pub async fn run(target: &Target, load: &Load) -> Outcome {
    let measure_from = Instant::now() + load.warmup;
    let cpu = cpu_window(measure_from, measure_from + load.duration);
    let workers: Vec<_> = (0..load.connections.max(1))
        .map(|_| tokio::spawn(worker(target.clone(), load.clone(), measure_from)))
        .collect();
    let mut outcome = Outcome::default();
    let mut samples = Vec::new();
    for w in workers {
        match w.await {
            Ok(w) => {
                outcome.ok += w.ok;
                outcome.errors += w.errors;
                outcome.connection_errors += w.connection_errors;
                outcome.handshakes += w.handshakes;
                samples.extend(w.samples);
                if outcome.first_error.is_none() {
                    outcome.first_error = w.first_error;
                }
            }
            Err(e) => {
                outcome.errors += 1;
                outcome
                    .first_error
                    .get_or_insert(format!("worker failed: {e}"));
            }
        }
    }
    outcome.elapsed = load.duration;
    outcome.latencies = Latencies::from_samples(samples);
    outcome.cpu = cpu.await.unwrap_or_default();
    outcome
}

/// Runs `load.connections` closed loops of `call` (no HTTP of its own: e.g. a kube client's GET), with the same
/// warm-up, window and percentiles as [`run`]; `requests_per_connection` does not apply.
pub async fn run_calls<F, Fut>(load: &Load, call: F) -> Outcome
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = Result<(), String>> + Send,
{
    let measure_from = Instant::now() + load.warmup;
    let end = measure_from + load.duration;
    let cpu = cpu_window(measure_from, end);
    let workers: Vec<_> = (0..load.connections.max(1))
        .map(|_| {
            let call = call.clone();
            tokio::spawn(async move {
                let mut out = WorkerOutcome::default();
                while Instant::now() < end {
                    let sent = Instant::now();
                    let result = call().await;
                    let latency = sent.elapsed();
                    if sent < measure_from || sent >= end {
                        continue;
                    }
                    match result {
                        Ok(()) => {
                            out.ok += 1;
                            out.samples
                                .push(u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX));
                        }
                        Err(what) => out.error(what),
                    }
                }
                out
            })
        })
        .collect();
    let mut outcome = Outcome::default();
    let mut samples = Vec::new();
    for w in workers {
        match w.await {
            Ok(w) => {
                outcome.ok += w.ok;
                outcome.errors += w.errors;
                samples.extend(w.samples);
                if outcome.first_error.is_none() {
                    outcome.first_error = w.first_error;
                }
            }
            Err(e) => {
                outcome.errors += 1;
                outcome
                    .first_error
                    .get_or_insert(format!("worker failed: {e}"));
            }
        }
    }
    outcome.elapsed = load.duration;
    outcome.latencies = Latencies::from_samples(samples);
    outcome.cpu = cpu.await.unwrap_or_default();
    outcome
}

/// Sends one request and returns the answer body (to check a scenario before loading it).
pub async fn probe(target: &Target) -> anyhow::Result<Bytes> {
    let mut sender = connect(target).await?;
    sender.ready().await?;
    let request = Request::builder()
        .method("POST")
        .uri(target.path.as_str())
        .header("host", "localhost")
        .header("content-type", "application/json")
        .body(Full::new(target.body.clone()))?;
    let response = sender.send_request(request).await?;
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    anyhow::ensure!(
        status.is_success(),
        "HTTP {status}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(body)
}
