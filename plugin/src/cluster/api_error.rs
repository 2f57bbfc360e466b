//! Reading `kube::Error`s: what went wrong, in words a user can act on, and whether the server
//! answered at all (a refusal is not an outage).

use crate::error::PluginError;

/// The HTTP status the API server answered with, if it answered.
pub fn code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(status) => Some(status.code),
        _ => None,
    }
}

pub fn is_not_found(e: &kube::Error) -> bool {
    code(e) == Some(404)
}

pub fn is_conflict(e: &kube::Error) -> bool {
    code(e) == Some(409)
}

/// True when the server could not be reached or could not serve (connection refused, TLS,
/// timeouts, 5xx, throttling): retrying later may help, unlike a refusal.
pub fn is_unavailable(e: &kube::Error) -> bool {
    match code(e) {
        Some(c) => c >= 500 || c == 429,
        None => !matches!(
            e,
            kube::Error::SerdeError(_) | kube::Error::BuildRequest(_) | kube::Error::FromUtf8(_)
        ),
    }
}

/// One line: the server's message for API errors, the cause chain otherwise. kube's own
/// `Display` repeats the whole status with `Debug`; this keeps what a user needs. The server may
/// be anything that answers at a Cluster's URL, so its text is made printable and bounded
/// ([`helmop_core::text::printable`]) before it reaches a table, a log or an Event.
pub fn describe(e: &kube::Error) -> String {
    helmop_core::text::printable(&describe_raw(e))
}

fn describe_raw(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => {
            let mut s = if status.message.is_empty() {
                format!("request failed with HTTP {}", status.code)
            } else {
                status.message.clone()
            };
            if !status.reason.is_empty() && !s.contains(&status.reason) {
                s.push_str(&format!(" ({})", status.reason));
            }
            s
        }
        other => {
            let mut parts = vec![other.to_string()];
            let mut source = std::error::Error::source(other);
            while let Some(cause) = source {
                let text = cause.to_string();
                if !parts.iter().any(|p| p.contains(&text)) {
                    parts.push(text);
                }
                source = cause.source();
            }
            parts.join(": ")
        }
    }
}

/// An error talking to the upstream cluster, as the command's error: unreachable (exit 3) or
/// refused (exit 1). `what` says what was being done (`listing HelmOps in team-a`).
pub fn upstream(what: &str, e: &kube::Error) -> PluginError {
    let msg = format!("{what}: {}", describe(e));
    if is_unavailable(e) {
        PluginError::UpstreamUnreachable(msg)
    } else {
        PluginError::Upstream(msg)
    }
}

#[cfg(test)]
mod tests {
    use kube::core::Status;

    use super::*;

    fn api(code: u16, message: &str, reason: &str) -> kube::Error {
        let mut status = Status::failure(message, reason);
        status.code = code;
        kube::Error::Api(Box::new(status))
    }

    #[test]
    fn classifies_api_errors() {
        let forbidden = api(403, "clusters is forbidden: no", "Forbidden");
        assert!(!is_unavailable(&forbidden));
        assert!(matches!(
            upstream("listing Clusters", &forbidden),
            PluginError::Upstream(m) if m == "listing Clusters: clusters is forbidden: no (Forbidden)"
        ));
        assert!(is_not_found(&api(404, "x not found", "NotFound")));
        assert!(is_conflict(&api(409, "modified", "Conflict")));
        assert!(is_unavailable(&api(
            503,
            "unavailable",
            "ServiceUnavailable"
        )));
        assert!(is_unavailable(&api(429, "slow down", "TooManyRequests")));
        assert_eq!(describe(&api(500, "", "")), "request failed with HTTP 500");
    }

    #[test]
    fn transport_errors_are_unavailable() {
        let e = kube::Error::Service("tcp connect error: Connection refused".into());
        assert!(is_unavailable(&e));
        assert!(matches!(
            upstream("x", &e),
            PluginError::UpstreamUnreachable(m) if m.contains("Connection refused")
        ));
        let serde = kube::Error::SerdeError(serde_json::from_str::<u8>("x").unwrap_err());
        assert!(!is_unavailable(&serde));
    }
}
