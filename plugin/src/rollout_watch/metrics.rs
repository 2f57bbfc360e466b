//! Prometheus metrics of `rollout --watch` (prefix `helmop_rollout_`), served on `/metrics` of the
//! `--metrics-addr` listener. Label values come from closed sets (the reasons of
//! [`super::index::Reason::label`], the kinds of [`ErrorKind`]); no workload or object name is a
//! label, so the series are bounded whatever the cluster holds.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::watch::health::Exposition;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

/// What went wrong, for `helmop_rollout_errors_total`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A Secret or ConfigMap a workload reads could not be read.
    Read,
    /// An Event could not be published.
    Event,
    /// A watch failed (it is retried with back-off).
    Watch,
}

impl ErrorKind {
    fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Read => "read",
            ErrorKind::Event => "event",
            ErrorKind::Watch => "watch",
        }
    }
}

/// Cheap to clone: every metric is reference counted.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    restamps: Family<ReasonLabel, Counter>,
    refused: Counter,
    ineffective: Counter,
    errors: Family<KindLabel, Counter>,
    reads: Counter,
    pending: Gauge,
    workloads: Gauge,
    objects: Gauge,
    digests: Gauge,
    leader: Gauge,
    lag: Histogram,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("helmop_rollout");
        let restamps = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "restamps",
            "Restamps the webhook turned into the expected stamp, by what made them due: object-changed, object-created, object-deleted, workload, namespace, start, leader, hash-key, resync, retry",
            restamps.clone(),
        );
        let refused = Counter::default();
        registry.register(
            "refused",
            "Restamps the API server refused (another webhook, a quota, a terminating namespace); each is retried with back-off",
            refused.clone(),
        );
        let ineffective = Counter::default();
        registry.register(
            "ineffective",
            "Restamps that left the stamp other than expected (the webhook missing, failing open, or refusing to stamp)",
            ineffective.clone(),
        );
        let errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "errors",
            "Errors by kind: read, event, watch",
            errors.clone(),
        );
        let reads = Counter::default();
        registry.register(
            "object_reads",
            "Secrets and ConfigMaps read whole (only objects an opted-in workload reads, once per new version)",
            reads.clone(),
        );
        let pending = Gauge::default();
        registry.register(
            "pending",
            "Workloads waiting to be decided or being decided",
            pending.clone(),
        );
        let workloads = Gauge::default();
        registry.register(
            "workloads",
            "Workloads watched (every kind, opted in or not)",
            workloads.clone(),
        );
        let objects = Gauge::default();
        registry.register(
            "objects",
            "Secrets and ConfigMaps whose version is known (metadata only)",
            objects.clone(),
        );
        let digests = Gauge::default();
        registry.register(
            "digests",
            "Objects whose keyed digests are kept (one per object an opted-in workload reads; never their data)",
            digests.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this process holds the leader-election Lease (or runs without election), else 0",
            leader.clone(),
        );
        let lag = Histogram::new([0.01, 0.025, 0.05, 0.1, 0.2, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]);
        registry.register(
            "lag_seconds",
            "From the watch event that made a workload due to the webhook's answer to its restamp",
            lag.clone(),
        );
        registry.register(
            "build",
            "Version of kubectl-helmop",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Metrics {
            registry: Arc::new(Mutex::new(registry)),
            restamps,
            refused,
            ineffective,
            errors,
            reads,
            pending,
            workloads,
            objects,
            digests,
            leader,
            lag,
        }
    }

    pub fn restamped(&self, reason: &'static str, lag: Duration) {
        self.restamps.get_or_create(&ReasonLabel { reason }).inc();
        self.lag.observe(lag.as_secs_f64());
    }

    pub fn refused(&self) {
        self.refused.inc();
    }

    pub fn ineffective(&self) {
        self.ineffective.inc();
    }

    pub fn error(&self, kind: ErrorKind) {
        self.errors
            .get_or_create(&KindLabel {
                kind: kind.as_str(),
            })
            .inc();
    }

    pub fn read(&self) {
        self.reads.inc();
    }

    pub fn set_sizes(&self, pending: usize, workloads: usize, objects: usize, digests: usize) {
        let set = |g: &Gauge, n: usize| g.set(i64::try_from(n).unwrap_or(i64::MAX));
        set(&self.pending, pending);
        set(&self.workloads, workloads);
        set(&self.objects, objects);
        set(&self.digests, digests);
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }
}

impl Exposition for Metrics {
    fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(2048);
        let registry = self.registry.lock().map_err(|_| std::fmt::Error)?;
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_gauges_are_exposed_under_their_names() {
        let m = Metrics::new();
        m.restamped("object-changed", Duration::from_millis(30));
        m.refused();
        m.ineffective();
        m.error(ErrorKind::Read);
        m.read();
        m.set_sizes(2, 10, 20, 3);
        m.set_leader(true);
        let text = m.encode().unwrap();
        for line in [
            "helmop_rollout_restamps_total{reason=\"object-changed\"} 1",
            "helmop_rollout_refused_total 1",
            "helmop_rollout_ineffective_total 1",
            "helmop_rollout_errors_total{kind=\"read\"} 1",
            "helmop_rollout_object_reads_total 1",
            "helmop_rollout_pending 2",
            "helmop_rollout_workloads 10",
            "helmop_rollout_objects 20",
            "helmop_rollout_digests 3",
            "helmop_rollout_leader 1",
            "helmop_rollout_lag_seconds_count 1",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
    }
}
