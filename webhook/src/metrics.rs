//! Prometheus metrics of the webhook, served as text on the admin port's `/metrics`.
//!
//! [`Metrics`] is cheap to clone (every family is reference counted) and is handed to the handlers, which register
//! their own metrics through [`Metrics::registry`] and report cache sizes through [`Metrics::set_cache_objects`].
//! Every label value is a `&'static str` from a closed set, so no request can grow the label cardinality.

use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::endpoint::Webhook;

/// Labels of `helmop_webhook_requests_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `helmops`, `references`, `workloads`.
    pub webhook: &'static str,
    /// `CREATE`, `UPDATE`, `DELETE`, `CONNECT`, or `unknown` when the request could not be decoded.
    pub operation: &'static str,
    /// See [`Outcome`].
    pub outcome: &'static str,
}

/// Labels of the per-webhook latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WebhookLabel {
    pub webhook: &'static str,
}

/// Labels of `helmop_webhook_cache_objects`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CacheLabel {
    pub cache: &'static str,
}

/// Labels of `helmop_webhook_live_gets_total` and `helmop_webhook_live_lists_total`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    /// `secrets`, `configmaps`, `namespaces`.
    pub kind: &'static str,
}

/// How one HTTP request to a webhook endpoint ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Admitted without changes.
    Allowed,
    /// Admitted with a non-empty JSONPatch.
    Patched,
    /// Denied by policy (`status.code` below 500).
    Denied,
    /// Denied because the webhook could not decide (`status.code` 500 and above, or the request timed out).
    Error,
    /// Answered 400: not an AdmissionReview v1 the webhook can read.
    BadRequest,
    /// Answered 413: body above the limit.
    TooLarge,
    /// Answered 408: the body did not arrive in time.
    Timeout,
    /// Answered 429: the in-flight limits were reached.
    Busy,
    /// A handler panicked; the panic was caught and answered.
    Panic,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Patched => "patched",
            Outcome::Denied => "denied",
            Outcome::Error => "error",
            Outcome::BadRequest => "bad_request",
            Outcome::TooLarge => "too_large",
            Outcome::Timeout => "timeout",
            Outcome::Busy => "busy",
            Outcome::Panic => "panic",
        }
    }
}

const OPERATIONS: [&str; 5] = ["CREATE", "UPDATE", "DELETE", "CONNECT", "unknown"];
const OUTCOMES: usize = Outcome::Panic as usize + 1;

/// The series of the request metrics, resolved from their families once, on first use, so answering a request
/// costs no label hashing and no lock on a family (a series appears in `/metrics` only once it has counted
/// something, as it would through the family alone).
#[derive(Default)]
struct Series {
    requests: [[[OnceLock<Counter>; OUTCOMES]; OPERATIONS.len()]; Webhook::ALL.len()],
    duration: [OnceLock<Histogram>; Webhook::ALL.len()],
}

/// The webhook's metrics and the registry they live in.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    series: Arc<Series>,
    requests: Family<RequestLabels, Counter>,
    duration: Family<WebhookLabel, Histogram, fn() -> Histogram>,
    cache_objects: Family<CacheLabel, Gauge>,
    cache_bytes: Family<CacheLabel, Gauge>,
    live_gets: Family<KindLabel, Counter>,
    live_lists: Family<KindLabel, Counter>,
    cert_reloads: Counter,
    cert_reload_failures: Counter,
    panics: Counter,
}

fn latency_histogram() -> Histogram {
    // 100 µs .. ~2.4 s: validation answers in well under a millisecond, mutation may wait on the image budget.
    Histogram::new(exponential_buckets(0.0001, 2.5, 12))
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "helmop_webhook_requests",
            "Admission requests answered, by webhook, operation and outcome",
            requests.clone(),
        );
        let duration = Family::<WebhookLabel, Histogram, fn() -> Histogram>::new_with_constructor(
            latency_histogram as fn() -> Histogram,
        );
        registry.register(
            "helmop_webhook_request_duration_seconds",
            "Time from the request head to the response, by webhook",
            duration.clone(),
        );
        let cache_objects = Family::<CacheLabel, Gauge>::default();
        registry.register(
            "helmop_webhook_cache_objects",
            "Objects held in each watch-backed cache",
            cache_objects.clone(),
        );
        let cache_bytes = Family::<CacheLabel, Gauge>::default();
        registry.register(
            "helmop_webhook_cache_bytes",
            "Bytes held by each cache bounded in bytes, as weighed against its bound",
            cache_bytes.clone(),
        );
        let live_gets = Family::<KindLabel, Counter>::default();
        registry.register(
            "helmop_webhook_live_gets",
            "Live GETs sent to the API server, after coalescing concurrent GETs of one object",
            live_gets.clone(),
        );
        let live_lists = Family::<KindLabel, Counter>::default();
        registry.register(
            "helmop_webhook_live_lists",
            "Live metadata LISTs of one kind in one namespace sent to the API server in place of one GET per object, \
             after coalescing",
            live_lists.clone(),
        );
        let cert_reloads = Counter::default();
        registry.register(
            "helmop_webhook_cert_reloads",
            "Serving certificate and key pairs loaded after a change on disk",
            cert_reloads.clone(),
        );
        let cert_reload_failures = Counter::default();
        registry.register(
            "helmop_webhook_cert_reload_failures",
            "Changed certificate or key files that could not be loaded (the previous pair stays in use)",
            cert_reload_failures.clone(),
        );
        let panics = Counter::default();
        registry.register(
            "helmop_webhook_panics",
            "Panics caught while answering a request (each one is a bug)",
            panics.clone(),
        );
        Metrics {
            registry: Arc::new(Mutex::new(registry)),
            series: Arc::default(),
            requests,
            duration,
            cache_objects,
            cache_bytes,
            live_gets,
            live_lists,
            cert_reloads,
            cert_reload_failures,
            panics,
        }
    }

    /// The registry, for metrics the handlers define themselves. Hold the guard only while registering.
    pub fn registry(&self) -> MutexGuard<'_, Registry> {
        // A panic while registering leaves the registry usable; keep serving metrics rather than propagating.
        self.registry
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records one answered request.
    pub fn observe_request(
        &self,
        webhook: &'static str,
        operation: &'static str,
        outcome: Outcome,
        seconds: f64,
    ) {
        let labels = || RequestLabels {
            webhook,
            operation,
            outcome: outcome.as_str(),
        };
        let w = Webhook::ALL.iter().position(|w| w.name() == webhook);
        let o = OPERATIONS.iter().position(|o| *o == operation);
        match (w, o) {
            (Some(w), Some(o)) => {
                self.series.requests[w][o][outcome as usize]
                    .get_or_init(|| self.requests.get_or_create(&labels()).clone())
                    .inc();
                self.series.duration[w]
                    .get_or_init(|| {
                        self.duration
                            .get_or_create(&WebhookLabel { webhook })
                            .clone()
                    })
                    .observe(seconds);
            }
            // Label values outside the closed sets (none today) still count, through the families.
            _ => {
                self.requests.get_or_create(&labels()).inc();
                self.duration
                    .get_or_create(&WebhookLabel { webhook })
                    .observe(seconds);
            }
        }
        if outcome == Outcome::Panic {
            self.panics.inc();
        }
    }

    /// Sets the size of one cache (`cache` names a closed set chosen by the handlers, e.g. `helmops`, `secrets`).
    pub fn set_cache_objects(&self, cache: &'static str, objects: i64) {
        self.cache_objects
            .get_or_create(&CacheLabel { cache })
            .set(objects);
    }

    /// Sets the weight of one cache bounded in bytes (the config stamp's `digests`).
    pub fn set_cache_bytes(&self, cache: &'static str, bytes: i64) {
        self.cache_bytes
            .get_or_create(&CacheLabel { cache })
            .set(bytes);
    }

    pub(crate) fn live_get_sent(&self, kind: &'static str) {
        self.live_gets.get_or_create(&KindLabel { kind }).inc();
    }

    /// Live GETs of this kind sent so far; for tests and the benchmark.
    pub fn live_gets(&self, kind: &'static str) -> u64 {
        self.live_gets
            .get(&KindLabel { kind })
            .map_or(0, |c| c.get())
    }

    pub(crate) fn live_list_sent(&self, kind: &'static str) {
        self.live_lists.get_or_create(&KindLabel { kind }).inc();
    }

    /// Live LISTs of this kind sent so far; for tests and the benchmark.
    pub fn live_lists(&self, kind: &'static str) -> u64 {
        self.live_lists
            .get(&KindLabel { kind })
            .map_or(0, |c| c.get())
    }

    pub(crate) fn cert_reloaded(&self) {
        self.cert_reloads.inc();
    }

    pub(crate) fn cert_reload_failed(&self) {
        self.cert_reload_failures.inc();
    }

    /// Requests answered so far with this outcome (summed over operations); for tests and the benchmark.
    pub fn requests(&self, webhook: &'static str, outcome: Outcome) -> u64 {
        OPERATIONS
            .into_iter()
            .filter_map(|operation| {
                self.requests
                    .get(&RequestLabels {
                        webhook,
                        operation,
                        outcome: outcome.as_str(),
                    })
                    .map(|c| c.get())
            })
            .sum()
    }

    pub fn cert_reloads(&self) -> u64 {
        self.cert_reloads.get()
    }

    pub fn cert_reload_failures(&self) -> u64 {
        self.cert_reload_failures.get()
    }

    /// The Prometheus text exposition of every registered metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(4096);
        prometheus_client::encoding::text::encode(&mut out, &self.registry())?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_the_documented_names() {
        let m = Metrics::new();
        m.observe_request("helmops", "CREATE", Outcome::Denied, 0.0002);
        m.set_cache_objects("secrets", 7);
        m.set_cache_bytes("digests", 4096);
        m.cert_reloaded();
        let text = m.encode().unwrap();
        assert!(
            text.contains(r#"helmop_webhook_requests_total{webhook="helmops",operation="CREATE",outcome="denied"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"helmop_webhook_request_duration_seconds_count{webhook="helmops"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"helmop_webhook_cache_objects{cache="secrets"} 7"#),
            "{text}"
        );
        assert!(
            text.contains(r#"helmop_webhook_cache_bytes{cache="digests"} 4096"#),
            "{text}"
        );
        assert!(
            text.contains("helmop_webhook_cert_reloads_total 1"),
            "{text}"
        );
        assert!(
            text.contains("helmop_webhook_cert_reload_failures_total 0"),
            "{text}"
        );
        assert_eq!(m.requests("helmops", Outcome::Denied), 1);
        assert_eq!(m.requests("helmops", Outcome::Allowed), 0);
    }

    #[test]
    fn resolved_series_are_the_families_series() {
        let m = Metrics::new();
        for _ in 0..3 {
            m.observe_request("workloads", "UPDATE", Outcome::Patched, 0.001);
        }
        m.observe_request("workloads", "unknown", Outcome::Panic, 0.001);
        // Outside the closed sets: counted through the family.
        m.observe_request("other", "PATCH", Outcome::Allowed, 0.001);
        let text = m.encode().unwrap();
        for line in [
            r#"helmop_webhook_requests_total{webhook="workloads",operation="UPDATE",outcome="patched"} 3"#,
            r#"helmop_webhook_requests_total{webhook="workloads",operation="unknown",outcome="panic"} 1"#,
            r#"helmop_webhook_requests_total{webhook="other",operation="PATCH",outcome="allowed"} 1"#,
            r#"helmop_webhook_request_duration_seconds_count{webhook="workloads"} 4"#,
            "helmop_webhook_panics_total 1",
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        // A series that never counted is not exposed.
        assert!(!text.contains(r#"outcome="denied""#), "{text}");
        assert_eq!(m.requests("workloads", Outcome::Patched), 3);
    }

    #[test]
    fn handlers_can_register_their_own() {
        let m = Metrics::new();
        let c = Counter::<u64>::default();
        m.registry()
            .register("helmop_webhook_test_things", "things", c.clone());
        c.inc();
        assert!(
            m.encode()
                .unwrap()
                .contains("helmop_webhook_test_things_total 1")
        );
    }
}
