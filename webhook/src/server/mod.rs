//! HTTP serving: the admission router (HTTPS), the admin router (plain HTTP) and their lifecycle.
//!
//! The routers take their decision logic as a [`Handlers`] trait object, so protocol tests and the benchmark can
//! run the real serving stack without a cluster; production passes the live `AppState`.

mod admin;
mod body;
mod client_auth;
mod endpoints;
mod pipeline;
mod router;
mod serve;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};

pub use admin::admin_router;
pub use body::MAX_DRAIN_BYTES;
pub use endpoints::{Handlers, Webhook, request_deadline};
pub use router::{DEFAULT_MAX_IN_FLIGHT_BYTES, Limits, router};
pub use serve::{ServeOptions, Server, shutdown_signal};

/// Asks an HTTP/1.x client to close the connection after `response`. HTTP/2 has no such header (a
/// connection-specific header is malformed there); its connections end by GOAWAY.
fn close_after(response: &mut Response, version: axum::http::Version) {
    if version <= axum::http::Version::HTTP_11 {
        response
            .headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
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
