//! The listeners and their lifecycle: TLS on the admission port, plain HTTP on the admin port, readiness that
//! fails before draining, and the signals that start it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::response::Response;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::admin::admin_router;
use super::client_auth::{PeerAcceptor, refuse_untrusted_peers};
use super::endpoints::Handlers;
use super::router::{Limits, router};
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::tls::{self, CertReloader};

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
    client_ca: Option<tls::ClientCaReloader>,
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
            .map(tls::ClientCaReloader::start)
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
        let options = self.options;
        let client_auth = self.client_ca.is_some();
        let tls_config = tls::server_config(
            self.reloader.resolver(),
            self.client_ca.as_ref().map(|c| c.verifier()),
        )?;
        let (stop_tx, stop_rx) = watch::channel(false);
        let stopped = move || {
            let mut rx = stop_rx.clone();
            async move {
                // An error means the sender is gone, which also means stop.
                let _ = rx.wait_for(|stop| *stop).await;
            }
        };

        let reload_task = tokio::spawn(self.reloader.run(options.cert_poll_interval, stopped()));
        let verifier = self.client_ca.as_ref().map(|c| c.verifier());
        if let Some(client_ca) = self.client_ca {
            tokio::spawn(client_ca.run(options.cert_poll_interval, stopped()));
        }

        let shutting_down = Arc::new(AtomicBool::new(false));
        let admin = admin_router(
            self.handlers.clone(),
            self.metrics.clone(),
            shutting_down.clone(),
        );
        let admin_task = tokio::spawn(
            axum::serve(self.admin_listener, admin)
                .with_graceful_shutdown(stopped())
                .into_future(),
        );

        let handle = axum_server::Handle::<SocketAddr>::new();
        let acceptor = PeerAcceptor::new(
            axum_server::tls_rustls::RustlsAcceptor::new(
                axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(tls_config)),
            )
            .handshake_timeout(options.handshake_timeout),
            verifier.clone(),
        );
        let mut server = axum_server::Server::from_listener(self.webhook_listener)
            .acceptor(acceptor)
            .handle(handle.clone());
        let builder = server.http_builder();
        // A small read buffer per connection (hyper's default grows to about 400 KiB): bodies stream
        // through it into the budgeted buffer, so 64 KiB costs nothing in speed and bounds what many
        // connections sending at once hold outside the budget.
        builder
            .http1()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(options.header_read_timeout)
            .max_buf_size(64 * 1024);
        builder
            .http2()
            .timer(hyper_util::rt::TokioTimer::new())
            .keep_alive_interval(Duration::from_secs(30));
        let app = router(
            self.handlers,
            self.metrics,
            options.request_timeout,
            options.limits,
        )
        .layer(axum::middleware::from_fn_with_state(
            shutting_down.clone(),
            close_when_shutting_down,
        ));
        let app = match verifier {
            Some(verifier) => app.layer(axum::middleware::from_fn_with_state(
                verifier,
                refuse_untrusted_peers,
            )),
            None => app,
        };
        let mut webhook_task = tokio::spawn(server.serve(app.into_make_service()));
        tracing::info!(listen = %self.webhook_addr, admin_listen = %self.admin_addr, client_auth, "serving");

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
    let version = request.version();
    let mut response = next.run(request).await;
    if shutting_down.load(Ordering::Relaxed) {
        super::close_after(&mut response, version);
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
