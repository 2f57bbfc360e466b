//! The HTTP listener of `propagate --watch --metrics-addr` (and `rollout --watch`'s): `/metrics` (Prometheus text,
//! [`super::metrics`]), `/livez` and `/readyz`.
//!
//! Liveness is a heartbeat the watch loop updates (also while a run is in flight): a loop that
//! stopped being polled for [`STALE_AFTER`] answers 503 and the kubelet restarts the pod. Readiness
//! is "joined the election (leading or standing by) and every watch listed once": a standby is
//! ready, because being ready to take over is its job.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::error::PluginError;

/// What `/metrics` serves: the Prometheus text of a watcher's metrics (`propagate --watch`'s or
/// `rollout --watch`'s).
pub trait Exposition: Clone + Send + Sync + 'static {
    fn encode(&self) -> Result<String, std::fmt::Error>;
}

impl Exposition for super::metrics::Metrics {
    fn encode(&self) -> Result<String, std::fmt::Error> {
        super::metrics::Metrics::encode(self)
    }
}

/// How often the watch loop beats.
pub const HEARTBEAT: Duration = Duration::from_secs(2);
/// A heartbeat older than this fails `/livez`: many missed beats, not one slow poll.
pub const STALE_AFTER: Duration = Duration::from_secs(30);

/// Shared between the watch loop (writer) and the HTTP handlers (readers).
pub struct Health {
    started: Instant,
    /// Milliseconds after `started` of the last beat.
    last_beat_ms: AtomicU64,
    joined_election: AtomicBool,
    watches: Arc<super::triggers::Synced>,
}

impl Health {
    pub fn new(watches: Arc<super::triggers::Synced>) -> Health {
        Health {
            started: Instant::now(),
            last_beat_ms: AtomicU64::new(0),
            joined_election: AtomicBool::new(false),
            watches,
        }
    }

    pub fn beat(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_beat_ms.store(ms, Ordering::Relaxed);
    }

    /// The election was joined (or is not used).
    pub fn joined_election(&self) {
        self.joined_election.store(true, Ordering::Relaxed);
    }

    fn since_beat(&self) -> Duration {
        let last = Duration::from_millis(self.last_beat_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }

    /// `Ok` when ready, else what is missing.
    fn readiness(&self) -> Result<(), PluginError> {
        if !self.joined_election.load(Ordering::Relaxed) {
            return Err(PluginError::ElectionNotJoined);
        }
        let (synced, total) = self.watches.progress();
        if synced < total || total == 0 {
            return Err(PluginError::WatchesNotSynced { synced, total });
        }
        Ok(())
    }
}

/// The running listener; dropping it stops serving.
pub struct Listener {
    pub addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Binds `addr` and serves in the background.
pub async fn serve<M: Exposition>(
    addr: SocketAddr,
    metrics: M,
    health: Arc<Health>,
) -> Result<Listener, PluginError> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| PluginError::Usage(format!("cannot listen on --metrics-addr {addr}: {e}")))?;
    let addr = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(metrics_text::<M>))
        .with_state(metrics)
        .merge(
            Router::new()
                .route("/livez", get(livez))
                .route("/readyz", get(readyz))
                .with_state(health),
        );
    let task = tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "the metrics listener stopped");
        }
    });
    Ok(Listener { addr, task })
}

async fn metrics_text<M: Exposition>(State(metrics): State<M>) -> Response {
    match metrics.encode() {
        Ok(text) => (
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(_) => (StatusCode::INTERNAL_SERVER_ERROR, "cannot encode metrics\n").into_response(),
    }
}

async fn livez(State(health): State<Arc<Health>>) -> Response {
    let since = health.since_beat();
    if since > STALE_AFTER {
        let text = format!(
            "not alive: the watch loop last beat {}s ago\n",
            since.as_secs()
        );
        return (StatusCode::SERVICE_UNAVAILABLE, text).into_response();
    }
    (StatusCode::OK, "ok\n").into_response()
}

async fn readyz(State(health): State<Arc<Health>>) -> Response {
    match health.readiness() {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

/// `--metrics-addr`: `HOST:PORT`, or `:PORT` for every interface.
pub fn parse_addr(s: &str) -> Result<SocketAddr, PluginError> {
    let full = if s.starts_with(':') {
        format!("0.0.0.0{s}")
    } else {
        s.to_owned()
    };
    full.parse().map_err(|_| PluginError::InvalidAddr {
        value: s.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(parse_addr(":8080").unwrap().to_string(), "0.0.0.0:8080");
        assert_eq!(
            parse_addr("127.0.0.1:0").unwrap().to_string(),
            "127.0.0.1:0"
        );
        assert_eq!(parse_addr("[::1]:9").unwrap().to_string(), "[::1]:9");
        assert!(parse_addr("8080").is_err());
        assert!(parse_addr("localhost:80").is_err());
    }

    #[test]
    fn ready_needs_the_election_and_every_watch() {
        let synced = Arc::new(super::super::triggers::Synced::default());
        let h = Health::new(synced.clone());
        assert!(h.readiness().is_err());
        h.joined_election();
        assert!(h.readiness().is_err(), "no watch yet");
        synced.expect(2);
        synced.mark();
        assert_eq!(
            h.readiness().unwrap_err().to_string(),
            "not ready: 1 of 2 watches synced"
        );
        synced.mark();
        assert!(h.readiness().is_ok());
    }
}
