//! The admin port's router: liveness, readiness and metrics.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

use super::endpoints::Handlers;
use super::plain;
use crate::metrics::Metrics;

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
