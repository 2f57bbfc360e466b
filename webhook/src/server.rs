//! HTTP serving: the admission router (HTTPS), the admin router (plain HTTP) and their lifecycle.
//!
//! The routers take their decision logic as a [`Handlers`] trait object, so protocol tests and the benchmark can
//! run the real serving stack without a cluster; production passes the live `AppState`.

use std::net::SocketAddr;
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use kube::core::DynamicObject;
use kube::core::admission::AdmissionRequest;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::admission::{self, MAX_BODY_BYTES};
use crate::error::{Error, Result};
use crate::metrics::{Metrics, Outcome};
use crate::tls::{self, CertReloader};
use crate::verdict::Verdict;

tokio::task_local! {
    /// The deadline of the admission being decided, so handlers can fit their own stages into it.
    static DEADLINE: tokio::time::Instant;
}

/// The deadline of the admission request the calling task is deciding (`None` outside one, e.g. in
/// unit tests that call a handler directly). A handler that finishes by then answers itself instead
/// of leaving the answer to [`Webhook::undecided`].
pub fn request_deadline() -> Option<tokio::time::Instant> {
    DEADLINE.try_with(|d| *d).ok()
}

/// The three admission endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Webhook {
    /// `POST /validate/helmops`: HelmOp CREATE/UPDATE.
    Helmops,
    /// `POST /validate/references`: Secret/ConfigMap DELETE guard.
    References,
    /// `POST /mutate/workloads`: hash and image stamping.
    Workloads,
}

impl Webhook {
    pub const ALL: [Webhook; 3] = [Webhook::Helmops, Webhook::References, Webhook::Workloads];

    /// The `webhook` label in metrics and logs.
    pub fn name(self) -> &'static str {
        match self {
            Webhook::Helmops => "helmops",
            Webhook::References => "references",
            Webhook::Workloads => "workloads",
        }
    }

    pub fn path(self) -> &'static str {
        match self {
            Webhook::Helmops => "/validate/helmops",
            Webhook::References => "/validate/references",
            Webhook::Workloads => "/mutate/workloads",
        }
    }

    /// Only the mutating endpoint may send a patch.
    pub fn mutating(self) -> bool {
        self == Webhook::Workloads
    }

    /// The answer when no decision could be made in time (or the handler failed): validation fails closed (the
    /// message says why, the API server shows it), mutation fails open with a warning, matching the
    /// `failurePolicy` of each webhook configuration, so the outcome does not depend on who gave up first.
    pub fn undecided(self, reason: &str) -> Verdict {
        match self {
            Webhook::Workloads => Verdict::allow_with_warnings(vec![format!(
                "helmop webhook: {reason}; admitted without config-hash or image stamping"
            )]),
            Webhook::Helmops | Webhook::References => Verdict::Deny {
                message: format!(
                    "helmop webhook: {reason}; retry, and check the helmop-webhook logs if it persists"
                ),
                code: 500,
                warnings: Vec::new(),
            },
        }
    }
}

/// The decision logic behind the endpoints.
pub trait Handlers: Send + Sync + 'static {
    /// Decides one admission request. `req.uid`, `req.dry_run` and `req.types` are set from the review.
    fn review<'a>(
        &'a self,
        webhook: Webhook,
        req: &'a AdmissionRequest<DynamicObject>,
    ) -> BoxFuture<'a, Verdict>;

    /// True once everything needed to answer correctly is loaded (caches synced); drives `/readyz`.
    fn ready(&self) -> bool;
}

#[derive(Clone)]
struct Shared {
    handlers: Arc<dyn Handlers>,
    metrics: Metrics,
    request_timeout: Duration,
}

/// The admission router: the three `POST` endpoints; unknown paths get 404, other methods 405.
pub fn router(handlers: Arc<dyn Handlers>, metrics: Metrics, request_timeout: Duration) -> Router {
    let shared = Shared {
        handlers,
        metrics,
        request_timeout,
    };
    let mut router = Router::new();
    for webhook in Webhook::ALL {
        router = router.route(
            webhook.path(),
            post(move |State(shared): State<Shared>, request: Request| {
                answer_guarded(shared, webhook, request)
            }),
        );
    }
    router.fallback(not_found).with_state(shared)
}

async fn not_found() -> Response {
    let paths = Webhook::ALL.map(Webhook::path).join(", ");
    (
        StatusCode::NOT_FOUND,
        format!("no such endpoint; admission endpoints are {paths}\n"),
    )
        .into_response()
}

/// Last line of defence: a panic outside the handler call (which has its own guard) is answered 500.
async fn answer_guarded(shared: Shared, webhook: Webhook, request: Request) -> Response {
    let started = Instant::now();
    let metrics = shared.metrics.clone();
    match AssertUnwindSafe(answer(shared, webhook, request, started))
        .catch_unwind()
        .await
    {
        Ok(response) => response,
        Err(_) => {
            metrics.observe_request(
                webhook.name(),
                "unknown",
                Outcome::Panic,
                started.elapsed().as_secs_f64(),
            );
            tracing::error!(
                webhook = webhook.name(),
                outcome = Outcome::Panic.as_str(),
                "panic while answering"
            );
            plain(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal error\n".to_owned(),
            )
        }
    }
}

fn plain(status: StatusCode, body: String) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        )],
        body,
    )
        .into_response()
}

enum BodyError {
    TooLarge,
    Unreadable,
}

async fn read_body(body: Body, limit: usize, size_hint: usize) -> Result<Vec<u8>, BodyError> {
    let mut buf = Vec::with_capacity(size_hint.min(limit));
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| BodyError::Unreadable)?;
        if buf.len() + chunk.len() > limit {
            return Err(BodyError::TooLarge);
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(buf)
}

fn reject(
    metrics: &Metrics,
    webhook: Webhook,
    outcome: Outcome,
    status: StatusCode,
    reason: String,
    started: Instant,
) -> Response {
    let latency = started.elapsed();
    metrics.observe_request(webhook.name(), "unknown", outcome, latency.as_secs_f64());
    tracing::warn!(
        webhook = webhook.name(),
        outcome = outcome.as_str(),
        status = status.as_u16(),
        reason = %reason,
        latency_ms = latency.as_secs_f64() * 1000.0,
        "admission request rejected"
    );
    plain(status, format!("{reason}\n"))
}

async fn answer(shared: Shared, webhook: Webhook, request: Request, started: Instant) -> Response {
    let metrics = &shared.metrics;
    let deadline = tokio::time::Instant::from_std(started + shared.request_timeout);
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        let reason = format!("request body above the {MAX_BODY_BYTES} byte limit");
        return reject(
            metrics,
            webhook,
            Outcome::TooLarge,
            StatusCode::PAYLOAD_TOO_LARGE,
            reason,
            started,
        );
    }
    // The declared length only sizes the first allocation, capped: a client may declare 7 MiB and send nothing.
    let size_hint = declared.map_or(16 * 1024, |len| (len as usize).min(256 * 1024));
    let body = match tokio::time::timeout_at(
        deadline,
        read_body(request.into_body(), MAX_BODY_BYTES, size_hint),
    )
    .await
    {
        Ok(Ok(body)) => body,
        Ok(Err(BodyError::TooLarge)) => {
            let reason = format!("request body above the {MAX_BODY_BYTES} byte limit");
            return reject(
                metrics,
                webhook,
                Outcome::TooLarge,
                StatusCode::PAYLOAD_TOO_LARGE,
                reason,
                started,
            );
        }
        Ok(Err(BodyError::Unreadable)) => {
            let reason = "request body could not be read".to_owned();
            return reject(
                metrics,
                webhook,
                Outcome::BadRequest,
                StatusCode::BAD_REQUEST,
                reason,
                started,
            );
        }
        Err(_) => {
            let reason = "request body did not arrive before the deadline".to_owned();
            return reject(
                metrics,
                webhook,
                Outcome::Timeout,
                StatusCode::REQUEST_TIMEOUT,
                reason,
                started,
            );
        }
    };
    let req = match admission::decode(&body) {
        Ok(req) => req,
        Err(e) => {
            return reject(
                metrics,
                webhook,
                Outcome::BadRequest,
                StatusCode::BAD_REQUEST,
                e.to_string(),
                started,
            );
        }
    };
    drop(body);

    let decision =
        AssertUnwindSafe(DEADLINE.scope(deadline, shared.handlers.review(webhook, &req)))
            .catch_unwind();
    let (verdict, failure) = match tokio::time::timeout_at(deadline, decision).await {
        Ok(Ok(verdict)) => (verdict, None),
        Ok(Err(_)) => (webhook.undecided("internal error"), Some(Outcome::Panic)),
        Err(_) => (
            webhook.undecided("timed out deciding"),
            Some(Outcome::Timeout),
        ),
    };
    let (body, sent) = admission::encode(&req.uid, &verdict, webhook.mutating());
    let outcome = failure.unwrap_or(match (sent.allowed, sent.patch_ops, sent.code) {
        (true, 0, _) => Outcome::Allowed,
        (true, _, _) => Outcome::Patched,
        (false, _, code) if code >= 500 => Outcome::Error,
        (false, _, _) => Outcome::Denied,
    });
    let operation = admission::operation_name(&req.operation);
    let latency = started.elapsed();
    metrics.observe_request(webhook.name(), operation, outcome, latency.as_secs_f64());
    log_request(
        webhook,
        &req,
        operation,
        outcome,
        &verdict,
        sent.patch_ops,
        latency,
    );
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// One line per request. Names and counts only: object content never reaches the log, and denial messages are
/// the ones the requester sees anyway.
fn log_request(
    webhook: Webhook,
    req: &AdmissionRequest<DynamicObject>,
    operation: &'static str,
    outcome: Outcome,
    verdict: &Verdict,
    patch_ops: usize,
    latency: Duration,
) {
    let (message, warnings) = match verdict {
        Verdict::Allow { warnings, .. } => ("", warnings.len()),
        Verdict::Deny {
            message, warnings, ..
        } => (message.as_str(), warnings.len()),
    };
    let latency_ms = latency.as_secs_f64() * 1000.0;
    let namespace = req.namespace.as_deref().unwrap_or("");
    macro_rules! line {
        ($level:ident) => {
            tracing::$level!(
                uid = %req.uid,
                webhook = webhook.name(),
                operation,
                kind = %req.kind.kind,
                namespace,
                name = %req.name,
                dry_run = req.dry_run,
                outcome = outcome.as_str(),
                patch_ops,
                warnings,
                message,
                latency_ms,
                "admission"
            )
        };
    }
    match outcome {
        Outcome::Panic | Outcome::Timeout | Outcome::Error => line!(warn),
        _ => line!(info),
    }
}

/// The admin router: `/healthz` (process alive), `/readyz` (handlers ready and not shutting down), `/metrics`.
pub fn admin_router(
    handlers: Arc<dyn Handlers>,
    metrics: Metrics,
    shutting_down: Arc<AtomicBool>,
) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || async move {
                if shutting_down.load(Ordering::Relaxed) {
                    (StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")
                } else if handlers.ready() {
                    (StatusCode::OK, "ready\n")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "caches not synced yet\n")
                }
            }),
        )
        .route(
            "/metrics",
            get(move || async move {
                match metrics.encode() {
                    Ok(text) => (
                        [(
                            header::CONTENT_TYPE,
                            HeaderValue::from_static(
                                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                            ),
                        )],
                        text,
                    )
                        .into_response(),
                    Err(_) => plain(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "cannot encode metrics\n".to_owned(),
                    ),
                }
            }),
        )
}

/// Everything [`Server`] needs besides the handlers.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub listen: SocketAddr,
    pub admin_listen: SocketAddr,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    /// Deadline per admission request, body included.
    pub request_timeout: Duration,
    pub cert_poll_interval: Duration,
    /// After the shutdown signal: time spent still serving, with `/readyz` failing, before draining starts.
    pub shutdown_delay: Duration,
    /// How long in-flight requests may take to finish once draining; then connections are closed.
    pub drain_timeout: Duration,
    /// TLS handshake deadline per connection.
    pub handshake_timeout: Duration,
    /// HTTP/1 deadline for a request head, also closing keep-alive connections idle that long.
    pub header_read_timeout: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            listen: SocketAddr::from(([0, 0, 0, 0], 8443)),
            admin_listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            tls_cert: PathBuf::from("/tls/tls.crt"),
            tls_key: PathBuf::from("/tls/tls.key"),
            request_timeout: Duration::from_secs(4),
            cert_poll_interval: Duration::from_secs(1),
            shutdown_delay: Duration::ZERO,
            drain_timeout: Duration::from_secs(15),
            handshake_timeout: Duration::from_secs(10),
            header_read_timeout: Duration::from_secs(60),
        }
    }
}

/// Both listeners bound and the certificate loaded: ready to [`Server::run`].
pub struct Server {
    options: ServeOptions,
    webhook_listener: TcpListener,
    admin_listener: TcpListener,
    webhook_addr: SocketAddr,
    admin_addr: SocketAddr,
    reloader: CertReloader,
    handlers: Arc<dyn Handlers>,
    metrics: Metrics,
}

async fn bind(addr: SocketAddr) -> Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| Error::Bind { addr, source })?;
    let local = listener
        .local_addr()
        .map_err(|source| Error::Bind { addr, source })?;
    Ok((listener, local))
}

impl Server {
    /// Loads the certificate (fails when it cannot be served) and binds both addresses (port 0 picks one).
    pub async fn bind(
        options: ServeOptions,
        handlers: Arc<dyn Handlers>,
        metrics: Metrics,
    ) -> Result<Server> {
        let reloader =
            CertReloader::start(&options.tls_cert, &options.tls_key, metrics.clone()).await?;
        let (webhook_listener, webhook_addr) = bind(options.listen).await?;
        let (admin_listener, admin_addr) = bind(options.admin_listen).await?;
        Ok(Server {
            options,
            webhook_listener,
            admin_listener,
            webhook_addr,
            admin_addr,
            reloader,
            handlers,
            metrics,
        })
    }

    pub fn webhook_addr(&self) -> SocketAddr {
        self.webhook_addr
    }

    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Serves until `shutdown` resolves, then fails `/readyz`, waits `shutdown_delay`, stops accepting and drains
    /// in-flight requests for up to `drain_timeout`.
    pub async fn run(self, shutdown: impl Future<Output = ()> + Send) -> Result<()> {
        let Server {
            options,
            webhook_listener,
            admin_listener,
            webhook_addr,
            admin_addr,
            reloader,
            handlers,
            metrics,
        } = self;
        let tls_config = tls::server_config(reloader.resolver())?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                // An error means the sender is gone, which also means stop.
                let _ = rx.wait_for(|stop| *stop).await;
            }
        };

        let reload_task = tokio::spawn(reloader.run(options.cert_poll_interval, stopped()));

        let shutting_down = Arc::new(AtomicBool::new(false));
        let admin = admin_router(handlers.clone(), metrics.clone(), shutting_down.clone());
        let admin_task = tokio::spawn(
            axum::serve(admin_listener, admin)
                .with_graceful_shutdown(stopped())
                .into_future(),
        );

        let handle = axum_server::Handle::<SocketAddr>::new();
        let acceptor = axum_server::tls_rustls::RustlsAcceptor::new(
            axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(tls_config)),
        )
        .handshake_timeout(options.handshake_timeout);
        let mut server = axum_server::Server::from_listener(webhook_listener)
            .acceptor(acceptor)
            .handle(handle.clone());
        let builder = server.http_builder();
        builder
            .http1()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(options.header_read_timeout);
        builder
            .http2()
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive_interval(Duration::from_secs(30));
        let app = router(handlers, metrics, options.request_timeout);
        let mut webhook_task = tokio::spawn(server.serve(app.into_make_service()));
        tracing::info!(listen = %webhook_addr, admin_listen = %admin_addr, "serving");

        let early_exit = tokio::select! {
            _ = shutdown => None,
            result = &mut webhook_task => Some(result),
        };
        if let Some(result) = early_exit {
            let _ = stop_tx.send(true);
            return Err(match result {
                Ok(Err(source)) => Error::Serve {
                    what: "webhook",
                    source,
                },
                _ => Error::Serve {
                    what: "webhook",
                    source: std::io::Error::other("stopped unexpectedly"),
                },
            });
        }

        tracing::info!(
            delay_s = options.shutdown_delay.as_secs_f64(),
            "shutdown requested; failing readiness"
        );
        shutting_down.store(true, Ordering::Relaxed);
        tokio::time::sleep(options.shutdown_delay).await;
        tracing::info!(
            in_flight_connections = handle.connection_count(),
            "draining"
        );
        handle.graceful_shutdown(Some(options.drain_timeout));
        let served = webhook_task.await;
        let _ = stop_tx.send(true);
        let _ = reload_task.await;
        let admin = admin_task.await;
        tracing::info!("stopped");
        match served {
            Ok(Ok(())) => {}
            Ok(Err(source)) => {
                return Err(Error::Serve {
                    what: "webhook",
                    source,
                });
            }
            Err(_) => {
                return Err(Error::Serve {
                    what: "webhook",
                    source: std::io::Error::other("task failed"),
                });
            }
        }
        match admin {
            Ok(Ok(())) => Ok(()),
            Ok(Err(source)) => Err(Error::Serve {
                what: "admin",
                source,
            }),
            Err(_) => Err(Error::Serve {
                what: "admin",
                source: std::io::Error::other("task failed"),
            }),
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() -> Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(Error::Signal)?;
    let mut int = signal(SignalKind::interrupt()).map_err(Error::Signal)?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => tracing::info!(signal = "SIGTERM", "signal received"),
            _ = int.recv() => tracing::info!(signal = "SIGINT", "signal received"),
        }
    })
}
