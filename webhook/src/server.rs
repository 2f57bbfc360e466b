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
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::admission::{self, MAX_BODY_BYTES, Request as AdmissionRequest};
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
    /// Decides one admission request.
    fn review<'a>(&'a self, webhook: Webhook, req: &'a AdmissionRequest) -> BoxFuture<'a, Verdict>;

    /// True once everything needed to answer correctly is loaded (caches synced); drives `/readyz`.
    fn ready(&self) -> bool;
}

/// What the admission port holds at once. Past either bound a request is answered 429 at once (the API
/// server then applies the webhook's `failurePolicy`), instead of queueing until everything is slow or
/// memory runs out.
///
/// A slow sender holds the bytes it has sent, up to the request deadline; keeping other callers off the port
/// is the job of `--client-ca` and the NetworkPolicy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Admission requests being decided at once (decoded and past their body).
    pub max_in_flight: usize,
    /// Request-body bytes held at once, across all requests (a body's share is held until it is answered,
    /// since the decoded review is about as large).
    pub max_body_bytes_in_flight: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_in_flight: 64,
            max_body_bytes_in_flight: 16 * 1024 * 1024,
        }
    }
}

#[derive(Clone)]
struct Shared {
    handlers: Arc<dyn Handlers>,
    metrics: Metrics,
    request_timeout: Duration,
    in_flight: Arc<Semaphore>,
    body_bytes: Arc<Semaphore>,
}

/// The admission router: the three `POST` endpoints; unknown paths get 404, other methods 405.
pub fn router(
    handlers: Arc<dyn Handlers>,
    metrics: Metrics,
    request_timeout: Duration,
    limits: Limits,
) -> Router {
    let shared = Shared {
        handlers,
        metrics,
        request_timeout,
        in_flight: Arc::new(Semaphore::new(
            limits.max_in_flight.clamp(1, Semaphore::MAX_PERMITS),
        )),
        body_bytes: Arc::new(Semaphore::new(
            limits
                .max_body_bytes_in_flight
                .clamp(MAX_BODY_BYTES, Semaphore::MAX_PERMITS),
        )),
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
    /// The body-bytes budget is used up by other requests.
    Busy,
}

/// How much of an oversized body is read and thrown away so that its sender gets the 413 (see [`drain`]).
pub const MAX_DRAIN_BYTES: u64 = 64 * 1024 * 1024;

/// A body and its share of the body-bytes budget, returned when dropped.
struct ReadBody {
    bytes: Vec<u8>,
    _share: Option<OwnedSemaphorePermit>,
}

/// Reads the body up to `limit`, taking the bytes received from `budget` as they arrive; on failure, hands back
/// the rest of the stream so it can be drained.
async fn read_body(
    body: Body,
    limit: usize,
    size_hint: usize,
    budget: &Arc<Semaphore>,
) -> Result<ReadBody, (BodyError, Option<axum::body::BodyDataStream>)> {
    let mut stream = body.into_data_stream();
    // The first allocation is sized by the hint, so the hint is taken up front.
    let mut reserved = size_hint.min(limit);
    let mut share = match take(budget, reserved) {
        Ok(share) => share,
        Err(()) => return Err((BodyError::Busy, Some(stream))),
    };
    let mut buf = Vec::with_capacity(reserved);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| (BodyError::Unreadable, None))?;
        let len = buf.len() + chunk.len();
        if len > limit {
            return Err((BodyError::TooLarge, Some(stream)));
        }
        if len > reserved {
            match take(budget, len - reserved) {
                Ok(more) => merge(&mut share, more),
                Err(()) => return Err((BodyError::Busy, Some(stream))),
            }
            reserved = len;
        }
        buf.extend_from_slice(&chunk);
    }
    Ok(ReadBody {
        bytes: buf,
        _share: share,
    })
}

fn take(budget: &Arc<Semaphore>, bytes: usize) -> Result<Option<OwnedSemaphorePermit>, ()> {
    if bytes == 0 {
        return Ok(None);
    }
    let n = u32::try_from(bytes).map_err(|_| ())?;
    budget
        .clone()
        .try_acquire_many_owned(n)
        .map(Some)
        .map_err(|_| ())
}

fn merge(share: &mut Option<OwnedSemaphorePermit>, more: Option<OwnedSemaphorePermit>) {
    match (share.as_mut(), more) {
        (Some(held), Some(more)) => held.merge(more),
        (None, more) => *share = more,
        (_, None) => {}
    }
}

/// Reads and discards what is left of a refused body, up to `cap` bytes and the request deadline.
///
/// Why: an ordinary client writes its whole body before it reads. Answered early, the server closes (HTTP/1.1)
/// or resets the stream (HTTP/2) with the body still arriving, and a TCP close with unread data is a reset
/// that throws away the 413 before the client reads it. Draining costs bandwidth, not memory (chunks are
/// dropped as they come); a sender of more than the drain cap gets the answer and the close.
async fn drain(mut stream: axum::body::BodyDataStream, cap: u64, deadline: tokio::time::Instant) {
    let mut drained = 0u64;
    let _ = tokio::time::timeout_at(deadline, async {
        while drained <= cap {
            match stream.next().await {
                Some(Ok(chunk)) => drained += chunk.len() as u64,
                _ => return,
            }
        }
    })
    .await;
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

/// The fast answer when the in-flight limits are reached.
fn busy(metrics: &Metrics, webhook: Webhook, started: Instant) -> Response {
    reject(
        metrics,
        webhook,
        Outcome::Busy,
        StatusCode::TOO_MANY_REQUESTS,
        "too many admission requests in flight; retry".to_owned(),
        started,
    )
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
        if declared.is_some_and(|len| len <= MAX_BODY_BYTES as u64 + MAX_DRAIN_BYTES) {
            drain(
                request.into_body().into_data_stream(),
                MAX_DRAIN_BYTES,
                deadline,
            )
            .await;
        }
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
        read_body(
            request.into_body(),
            MAX_BODY_BYTES,
            size_hint,
            &shared.body_bytes,
        ),
    )
    .await
    {
        Ok(Ok(body)) => body,
        Ok(Err((BodyError::TooLarge, rest))) => {
            let reason = format!("request body above the {MAX_BODY_BYTES} byte limit");
            if let Some(rest) = rest {
                drain(rest, MAX_DRAIN_BYTES, deadline).await;
            }
            return reject(
                metrics,
                webhook,
                Outcome::TooLarge,
                StatusCode::PAYLOAD_TOO_LARGE,
                reason,
                started,
            );
        }
        Ok(Err((BodyError::Busy, rest))) => {
            if let Some(rest) = rest {
                drain(rest, MAX_BODY_BYTES as u64, deadline).await;
            }
            return busy(metrics, webhook, started);
        }
        Ok(Err((BodyError::Unreadable, _))) => {
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
    // Taken once the body is in, so a slow sender holds only the bytes it sent (from the body budget), never a
    // decision slot.
    let Ok(_slot) = shared.in_flight.clone().try_acquire_owned() else {
        return busy(metrics, webhook, started);
    };
    // The body's share of the budget stays taken until the answer: the decoded review is about as large.
    let ReadBody {
        bytes: body,
        _share: _body_share,
    } = body;
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

/// One line per request: at INFO for anything a user may need to trace (a denial, a patch, a warning, a
/// failure), at DEBUG for a clean allow, the bulk of the traffic (formatting and writing that line cost more
/// than deciding a validation; `helmop_webhook_requests_total` still counts it). Names and counts only: object
/// content never reaches the log, and denial messages are the ones the requester sees anyway.
fn log_request(
    webhook: Webhook,
    req: &AdmissionRequest,
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
        Outcome::Allowed if warnings == 0 => line!(debug),
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
    /// PEM CA that client certificates must chain to; `None` serves any client.
    pub client_ca: Option<PathBuf>,
    pub limits: Limits,
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
            client_ca: None,
            limits: Limits::default(),
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
    client_ca: Option<rustls::RootCertStore>,
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
        let client_ca = options
            .client_ca
            .as_deref()
            .map(tls::read_client_ca)
            .transpose()?;
        let (webhook_listener, webhook_addr) = bind(options.listen).await?;
        let (admin_listener, admin_addr) = bind(options.admin_listen).await?;
        Ok(Server {
            options,
            webhook_listener,
            admin_listener,
            webhook_addr,
            admin_addr,
            reloader,
            client_ca,
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
            client_ca,
            handlers,
            metrics,
        } = self;
        let client_auth = client_ca.is_some();
        let tls_config = tls::server_config(reloader.resolver(), client_ca)?;
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
        let app = router(handlers, metrics, options.request_timeout, options.limits).layer(
            axum::middleware::from_fn_with_state(shutting_down.clone(), close_when_shutting_down),
        );
        let mut webhook_task = tokio::spawn(server.serve(app.into_make_service()));
        tracing::info!(listen = %webhook_addr, admin_listen = %admin_addr, client_auth, "serving");

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

/// While shutting down, HTTP/1.1 responses carry `Connection: close`, so the API server closes each kept-alive
/// connection after its answer. Without it, draining closes idle connections under the client: a request the
/// API server writes onto one at that moment fails with `EOF` (Go does not retry a POST on a reused
/// connection), which a rolling update turned into a failed admission now and then. The API server always speaks
/// HTTP/1.1 to webhooks (it pins ALPN, kubernetes#75791); HTTP/2 clients get GOAWAY instead.
async fn close_when_shutting_down(
    State(shutting_down): State<Arc<AtomicBool>>,
    request: Request,
    next: axum::middleware::Next,
) -> Response {
    let http1 = request.version() <= axum::http::Version::HTTP_11;
    let mut response = next.run(request).await;
    if http1 && shutting_down.load(Ordering::Relaxed) {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    response
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
