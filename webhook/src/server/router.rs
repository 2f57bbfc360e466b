//! The admission router: one route per endpoint, the in-flight limits every route shares, and the guard that
//! answers a panic outside the handler.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use axum::extract::{Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use futures::FutureExt;
use tokio::sync::Semaphore;

use super::endpoints::{Handlers, Webhook};
use super::pipeline::{Shared, answer};
use super::plain;
use crate::admission::MAX_REVIEW_COST;
use crate::metrics::{Metrics, Outcome};

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
    /// Bytes held at once across all requests: the bodies as they arrive, and once a body is in, what its
    /// decoded form costs (its objects' text again, and [`crate::admission::VALUE_COST`] per JSON value),
    /// held until it is answered. At least [`MAX_REVIEW_COST`], so the largest review always fits alone.
    pub max_body_bytes_in_flight: usize,
}

/// Default of `--max-in-flight-bytes`: 48 MiB, the largest review (45 MiB decided) plus room for the API
/// server's ordinary reviews, which cost kilobytes.
pub const DEFAULT_MAX_IN_FLIGHT_BYTES: usize = 48 * 1024 * 1024;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_in_flight: 64,
            max_body_bytes_in_flight: DEFAULT_MAX_IN_FLIGHT_BYTES,
        }
    }
}

/// The admission router: the three `POST` endpoints; unknown paths get 404, other methods 405.
pub fn router(
    handlers: Arc<dyn Handlers>,
    metrics: Metrics,
    request_timeout: Duration,
    limits: Limits,
) -> Router {
    // One allocation shared by every request: axum clones the state per request, and a clone of `Shared`
    // itself was 16 reference counts (the metrics' families among them) taken and dropped per admission.
    let shared = Arc::new(Shared {
        handlers,
        metrics,
        request_timeout,
        in_flight: Arc::new(Semaphore::new(
            limits.max_in_flight.clamp(1, Semaphore::MAX_PERMITS),
        )),
        body_bytes: Arc::new(Semaphore::new(
            limits
                .max_body_bytes_in_flight
                .clamp(MAX_REVIEW_COST, Semaphore::MAX_PERMITS),
        )),
        decoders: Arc::new(Semaphore::new(super::pipeline::MAX_DECODES)),
        drains: Arc::new(Semaphore::new(super::body::MAX_DRAINS)),
    });
    let mut router = Router::new();
    for webhook in Webhook::ALL {
        router = router.route(
            webhook.path(),
            post(
                move |State(shared): State<Arc<Shared>>, request: Request| async move {
                    answer_guarded(&shared, webhook, request).await
                },
            ),
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
async fn answer_guarded(shared: &Shared, webhook: Webhook, request: Request) -> Response {
    let started = Instant::now();
    match AssertUnwindSafe(answer(shared, webhook, request, started))
        .catch_unwind()
        .await
    {
        Ok(response) => response,
        Err(_) => {
            shared.metrics.observe_request(
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
