//! One admission request from body to answer: limits, decoding, the decision under the deadline (a panicking or
//! late handler still gets a verdict, per the endpoint's failure policy), metrics and the log line.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::FutureExt;
use tokio::sync::Semaphore;
use tracing::Instrument;

use super::body::{BodyError, MAX_DRAIN_BYTES, ReadBody, drain, read_body};
use super::endpoints::{DEADLINE, Handlers, Webhook};
use super::plain;
use crate::admission::{self, MAX_BODY_BYTES, Request as AdmissionRequest};
use crate::metrics::{Metrics, Outcome};
use crate::verdict::Verdict;

/// What every admission route shares: the handlers, the metrics, the deadline and the in-flight limits.
pub(super) struct Shared {
    pub(super) handlers: Arc<dyn Handlers>,
    pub(super) metrics: Metrics,
    pub(super) request_timeout: Duration,
    pub(super) in_flight: Arc<Semaphore>,
    pub(super) body_bytes: Arc<Semaphore>,
    /// Turns at a decoding thread ([`MAX_DECODES`]).
    pub(super) decoders: Arc<Semaphore>,
    /// Turns at draining a refused body ([`super::body::MAX_DRAINS`]).
    pub(super) drains: Arc<Semaphore>,
}

/// Why a request is answered without a decision.
enum Rejection {
    TooLarge,
    Unreadable,
    /// The body did not arrive before the deadline.
    Late,
    /// Not an AdmissionReview; the decoder's reason.
    Undecodable(String),
    /// The in-flight limits are reached.
    Busy,
}

impl Rejection {
    fn answer(self) -> (Outcome, StatusCode, String) {
        match self {
            Rejection::TooLarge => (
                Outcome::TooLarge,
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body above the {MAX_BODY_BYTES} byte limit"),
            ),
            Rejection::Unreadable => (
                Outcome::BadRequest,
                StatusCode::BAD_REQUEST,
                "request body could not be read".to_owned(),
            ),
            Rejection::Late => (
                Outcome::Timeout,
                StatusCode::REQUEST_TIMEOUT,
                "request body did not arrive before the deadline".to_owned(),
            ),
            Rejection::Undecodable(reason) => {
                (Outcome::BadRequest, StatusCode::BAD_REQUEST, reason)
            }
            Rejection::Busy => (
                Outcome::Busy,
                StatusCode::TOO_MANY_REQUESTS,
                "too many admission requests in flight; retry".to_owned(),
            ),
        }
    }
}

fn reject(metrics: &Metrics, webhook: Webhook, rejection: Rejection, started: Instant) -> Response {
    let (outcome, status, reason) = rejection.answer();
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

/// One admission: read the review within the limits, decide it under the deadline, respond.
pub(super) async fn answer(
    shared: &Shared,
    webhook: Webhook,
    request: Request,
    started: Instant,
) -> Response {
    let deadline = tokio::time::Instant::from_std(started + shared.request_timeout);
    let review = match read(shared, request, deadline).await {
        Ok(review) => review,
        Err(Early::Rejected(rejection)) => {
            return reject(&shared.metrics, webhook, rejection, started);
        }
        Err(Early::TooManyValues(uid)) => {
            return too_many_values(&shared.metrics, webhook, uid, started);
        }
    };
    let req = &review.request;
    // Every line logged while deciding (live reads, registry trouble, the answer's own line) carries the
    // review's uid and object, so one request's lines can be found among concurrent ones.
    let span = tracing::info_span!(
        "admission",
        // As strings, not `%` (Display): recorded as they are, with no text formatted per admission.
        uid = req.uid.as_str(),
        webhook = webhook.name(),
        kind = req.kind.kind.as_str(),
        namespace = req.namespace.as_deref().unwrap_or(""),
        // Not `name`: a span's JSON already has its own name under that key.
        object = req.name.as_str(),
    );
    let (verdict, failure) = decide(shared, webhook, req, deadline)
        .instrument(span.clone())
        .await;
    let _in_span = span.enter();
    respond(&shared.metrics, webhook, req, &verdict, failure, started)
}

/// A review read and decoded, with the budget it holds until it is answered.
struct Review {
    request: Box<AdmissionRequest>,
    /// The in-flight slot, the body's share and the decoded form's share of the budget.
    _held: (
        tokio::sync::OwnedSemaphorePermit,
        Option<tokio::sync::OwnedSemaphorePermit>,
        Option<tokio::sync::OwnedSemaphorePermit>,
    ),
}

/// Why a request ends before a decision.
enum Early {
    Rejected(Rejection),
    /// More values than one admission decodes; the review's uid if it has one.
    TooManyValues(Option<String>),
}

/// The body within [`MAX_BODY_BYTES`] and the deadline, a decision slot, then the review decoded off the
/// async workers.
async fn read(
    shared: &Shared,
    request: Request,
    deadline: tokio::time::Instant,
) -> Result<Review, Early> {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY_BYTES as u64) {
        if declared.is_some_and(|len| len <= MAX_BODY_BYTES as u64 + MAX_DRAIN_BYTES) {
            drain(
                &shared.drains,
                request.into_body().into_data_stream(),
                MAX_DRAIN_BYTES,
                deadline,
            )
            .await;
        }
        return Err(Early::Rejected(Rejection::TooLarge));
    }
    // The declared length (at most the limit here) sizes the one allocation, charged to the budget up front:
    // a client that declares 7 MiB and sends nothing holds 7 MiB of the budget until the deadline, never
    // more than it is charged; a body of unknown length grows by doubling, charged by capacity. What
    // decoding a body of that length costs at least (its text, TEXT_COPIES times) is charged with it, before
    // a byte is read: a review the budget cannot decide now is refused before it is received and decrypted,
    // not after (a flood of 7 MiB bodies otherwise had every one read, then most refused).
    let size_hint = declared.map_or(16 * 1024, |len| len as usize);
    let prepaid = declared.map_or(0, |len| {
        (len as usize).saturating_mul(admission::TEXT_COPIES)
    });
    let body = match tokio::time::timeout_at(
        deadline,
        read_body(
            request.into_body(),
            MAX_BODY_BYTES,
            size_hint,
            prepaid,
            &shared.body_bytes,
        ),
    )
    .await
    {
        Ok(Ok(body)) => body,
        Ok(Err((BodyError::TooLarge, rest))) => {
            if let Some(rest) = rest {
                drain(&shared.drains, rest, MAX_DRAIN_BYTES, deadline).await;
            }
            return Err(Early::Rejected(Rejection::TooLarge));
        }
        Ok(Err((BodyError::Busy, rest))) => {
            if let Some(rest) = rest {
                drain(&shared.drains, rest, MAX_BODY_BYTES as u64, deadline).await;
            }
            return Err(Early::Rejected(Rejection::Busy));
        }
        Ok(Err((BodyError::Unreadable, _))) => {
            return Err(Early::Rejected(Rejection::Unreadable));
        }
        Err(_) => return Err(Early::Rejected(Rejection::Late)),
    };
    // Taken once the body is in, so a slow sender holds only the bytes it sent (from the body budget), never a
    // decision slot.
    let Ok(slot) = shared.in_flight.clone().try_acquire_owned() else {
        return Err(Early::Rejected(Rejection::Busy));
    };
    // The body's share of the budget stays taken until the answer, with what decoding it costs on top.
    let ReadBody {
        bytes: body,
        prepaid,
        _share: body_share,
    } = body;
    let decoded =
        match tokio::time::timeout_at(deadline, decode_off_workers(shared, body, prepaid)).await {
            Ok(decoded) => decoded,
            Err(_) => return Err(Early::Rejected(Rejection::Late)),
        };
    match decoded {
        Decoded::Review(request, decoded_share) => Ok(Review {
            request,
            _held: (slot, body_share, decoded_share),
        }),
        Decoded::Undecodable(reason) => Err(Early::Rejected(Rejection::Undecodable(reason))),
        Decoded::Busy => Err(Early::Rejected(Rejection::Busy)),
        Decoded::TooMany(uid) => Err(Early::TooManyValues(uid)),
    }
}

/// The handler's verdict under the deadline; a panicking or late handler gets the endpoint's failure
/// answer ([`Webhook::undecided`]) and the outcome that says why.
async fn decide(
    shared: &Shared,
    webhook: Webhook,
    req: &AdmissionRequest,
    deadline: tokio::time::Instant,
) -> (Verdict, Option<Outcome>) {
    let decision = AssertUnwindSafe(DEADLINE.scope(deadline, shared.handlers.review(webhook, req)))
        .catch_unwind();
    match tokio::time::timeout_at(deadline, decision).await {
        Ok(Ok(verdict)) => (verdict, None),
        Ok(Err(_)) => (webhook.undecided("internal error"), Some(Outcome::Panic)),
        Err(_) => (
            webhook.undecided("timed out deciding"),
            Some(Outcome::Timeout),
        ),
    }
}

/// The AdmissionReview answer, counted and logged.
fn respond(
    metrics: &Metrics,
    webhook: Webhook,
    req: &AdmissionRequest,
    verdict: &Verdict,
    failure: Option<Outcome>,
    started: Instant,
) -> Response {
    let (body, sent) = admission::encode(&req.uid, verdict, webhook.mutating());
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
        req,
        operation,
        outcome,
        verdict,
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

/// Decodes run on threads of their own, at most this many at once: a large review takes tens of
/// milliseconds to count and parse, which on an async worker (one, under `limits.cpu: "1"`) would hold
/// up `/healthz` and every other admission meanwhile.
pub(super) const MAX_DECODES: usize = 2;

/// The nice value a decoding thread runs at (0 is the process's own; 19 the lowest priority). The kernel
/// then gives the async workers, which answer `/healthz` and the small reviews of ordinary admissions, about
/// nine times a decoder's share of the CPU while both want it, and the decoders all of it when nothing else
/// runs: a flood of large reviews slows down itself, not the API server's other calls.
pub(super) const DECODE_NICE: i32 = 10;

enum Decoded {
    /// The request, and the budget its decoded form holds until the answer.
    Review(
        Box<AdmissionRequest>,
        Option<tokio::sync::OwnedSemaphorePermit>,
    ),
    Undecodable(String),
    /// The budget cannot take the decoded form now.
    Busy,
    /// More than [`admission::MAX_VALUES`] values; the review's uid if it has one.
    TooMany(Option<String>),
}

/// Reviews up to this size are decoded on the async worker that read them: counting and parsing
/// 16 KiB takes tens of microseconds, less than the hop to another thread and back costs (two
/// thread wake-ups per admission, most of what separated the webhook from a webhook that only
/// decodes). Real reviews of a HelmOp or a workload are a few KiB.
pub(super) const INLINE_DECODE_BYTES: usize = 16 * 1024;

// values_at_most(body) <= body.len() + 1: no small body is ever too many values to decode.
const _: () = assert!(INLINE_DECODE_BYTES < admission::MAX_VALUES);

/// Takes what decoding the body costs from the in-flight budget (or answers busy), then decodes: small
/// bodies in place ([`INLINE_DECODE_BYTES`]), larger ones counted and decoded on a thread of their own
/// at [`DECODE_NICE`], bounded by [`MAX_DECODES`].
async fn decode_off_workers(shared: &Shared, body: Vec<u8>, prepaid: usize) -> Decoded {
    if body.len() <= INLINE_DECODE_BYTES {
        // Charged a bound from one byte scan, not counted by a full parse before the parse that decodes
        // it: a small body cannot reach MAX_VALUES, and the bound overcharges it by kilobytes at most.
        let values = admission::values_at_most(&body);
        return charge_and_decode(&shared.body_bytes, &body, prepaid, values);
    }
    let Ok(_turn) = shared.decoders.clone().acquire_owned().await else {
        return Decoded::Busy;
    };
    let budget = shared.body_bytes.clone();
    match on_decode_thread(move || count_and_decode(&budget, &body, prepaid)).await {
        Ok(decoded) => decoded,
        Err(ThreadTrouble::NotStarted) => Decoded::Busy,
        Err(ThreadTrouble::Panicked) => {
            Decoded::Undecodable("the review could not be decoded".to_owned())
        }
    }
}

/// Why [`on_decode_thread`] has no result.
#[derive(Debug, PartialEq, Eq)]
enum ThreadTrouble {
    /// No thread could be started (a resource limit): the request may be retried.
    NotStarted,
    Panicked,
}

/// Runs `work` on a thread of its own at [`DECODE_NICE`].
///
/// A thread per large review, not the blocking pool: a thread's priority can be lowered but never raised
/// again without privileges, and the pool's threads serve other work afterwards. A spawn costs tens of
/// microseconds, next to the milliseconds such a decode takes.
async fn on_decode_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ThreadTrouble> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("helmop-decode".to_owned())
        .spawn(move || {
            // Linux: the calling thread only. Failing leaves it at the process's priority, as before.
            let _ = rustix::process::nice(DECODE_NICE);
            let _ = tx.send(work());
        })
        .map_err(|_| ThreadTrouble::NotStarted)?;
    rx.await.map_err(|_| ThreadTrouble::Panicked)
}

/// Counts the body's values (stopping past [`admission::MAX_VALUES`]), then [`charge_and_decode`].
fn count_and_decode(budget: &Arc<Semaphore>, body: &[u8], prepaid: usize) -> Decoded {
    let values = match admission::count_values(body, admission::MAX_VALUES) {
        admission::Counted::TooMany => return Decoded::TooMany(admission::review_uid(body)),
        admission::Counted::Values(n) => n,
        admission::Counted::Invalid => 0,
    };
    charge_and_decode(budget, body, prepaid, values)
}

/// Takes what decoding a body of `values` JSON values costs from the budget, then decodes it. `prepaid`:
/// what the body's share of the budget already holds for decoding it.
fn charge_and_decode(
    budget: &Arc<Semaphore>,
    body: &[u8],
    prepaid: usize,
    values: usize,
) -> Decoded {
    // The objects' text is copied for the trees that borrow from it, and strings again by typed decoding.
    let cost = body
        .len()
        .saturating_mul(admission::TEXT_COPIES)
        .saturating_add(values.saturating_mul(admission::VALUE_COST))
        .saturating_sub(prepaid);
    let Ok(share) = super::body::take(budget, cost) else {
        return Decoded::Busy;
    };
    match admission::decode(body) {
        Ok(req) => Decoded::Review(Box::new(req), share),
        Err(e) => Decoded::Undecodable(e.to_string()),
    }
}

/// The answer to a review holding more values than one admission decodes: the endpoint's failure
/// policy, with a reason the requester can act on, when its uid can be read; else a 413.
fn too_many_values(
    metrics: &Metrics,
    webhook: Webhook,
    uid: Option<String>,
    started: Instant,
) -> Response {
    let Some(uid) = uid else {
        return reject(metrics, webhook, Rejection::TooLarge, started);
    };
    let reason = format!(
        "the review holds more than {} JSON values (dense lists in helm.values, say), more than one admission \
         decodes",
        admission::MAX_VALUES
    );
    let verdict = webhook.undecided(&reason);
    let (body, _) = admission::encode(&uid, &verdict, webhook.mutating());
    let latency = started.elapsed();
    metrics.observe_request(
        webhook.name(),
        "unknown",
        Outcome::TooLarge,
        latency.as_secs_f64(),
    );
    tracing::warn!(
        uid = %uid,
        webhook = webhook.name(),
        outcome = Outcome::TooLarge.as_str(),
        max_values = admission::MAX_VALUES,
        latency_ms = latency.as_secs_f64() * 1000.0,
        "admission review not decoded: too many values"
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
                // Not `message`: flattened JSON already has the event's own message under that key.
                denial = message,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn large_decodes_run_below_the_workers_priority() {
        let ours = rustix::process::getpriority_process(None).unwrap();
        let theirs = on_decode_thread(|| rustix::process::getpriority_process(None).unwrap())
            .await
            .unwrap();
        assert_eq!(theirs, (ours + DECODE_NICE).min(19));
        assert_eq!(
            rustix::process::getpriority_process(None).unwrap(),
            ours,
            "the worker's own priority is untouched"
        );
        assert_eq!(
            on_decode_thread(|| panic!("boom")).await,
            Err::<(), _>(ThreadTrouble::Panicked),
            "a panicking decode is undecodable, not busy"
        );
    }
}
