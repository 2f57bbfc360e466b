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
    covered: Gauge,
    lag: Histogram,
    brakes: Brakes,
}

/// The brakes' metrics: the roll budget, the flap breaker, holds.
#[derive(Clone)]
struct Brakes {
    rolling: Gauge,
    rolling_peak: Gauge,
    parked: Gauge,
    rolls_ended: Family<HowLabel, Counter>,
    breakers_open: Gauge,
    breaker_trips: Counter,
    held: Family<ReasonLabel, Gauge>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HowLabel {
    pub how: &'static str,
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
            "Restamps the webhook turned into the expected stamp, by what made them due: object-changed, object-created, object-deleted, workload, namespace, start, leader, hash-key, resync, retry, budget, read, images, uncovered",
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
        let covered = Gauge::default();
        registry.register(
            "covered",
            "1 while a wider watcher's fresh Lease contains this watcher's scope (it writes nothing), else 0",
            covered.clone(),
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
        let rolling = Gauge::default();
        registry.register(
            "rolling",
            "Workloads the watcher restamped whose rollout is not over (the roll budget in use)",
            rolling.clone(),
        );
        let rolling_peak = Gauge::default();
        registry.register(
            "rolling_peak",
            "The most workloads rolling at once since the watcher started",
            rolling_peak.clone(),
        );
        let parked = Gauge::default();
        registry.register(
            "parked",
            "Workloads due for a restamp that wait for room in the roll budget",
            parked.clone(),
        );
        let rolls_ended = Family::<HowLabel, Counter>::default();
        registry.register(
            "rolls_ended",
            "Rollouts the watcher started that ended: complete, stalled (progress deadline, degraded) or timeout (--roll-timeout)",
            rolls_ended.clone(),
        );
        let breakers_open = Gauge::default();
        registry.register(
            "breakers_open",
            "Secrets and ConfigMaps whose flap breaker is open (their readers are not restamped)",
            breakers_open.clone(),
        );
        let breaker_trips = Counter::default();
        registry.register(
            "breaker_trips",
            "Times a flap breaker opened",
            breaker_trips.clone(),
        );
        let held = Family::<ReasonLabel, Gauge>::default();
        registry.register(
            "held",
            "Workloads due for a restamp that the watcher holds, by reason (missing, breaker, gave-up, rollout-busy, unwatched)",
            held.clone(),
        );
        let brakes = Brakes {
            rolling,
            rolling_peak,
            parked,
            rolls_ended,
            breakers_open,
            breaker_trips,
            held,
        };
        Metrics {
            brakes,
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
            covered,
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

    /// The roll budget in use, its peak and the workloads waiting for it.
    pub fn set_budget(&self, rolling: usize, peak: usize, parked: usize) {
        let set = |g: &Gauge, n: usize| g.set(i64::try_from(n).unwrap_or(i64::MAX));
        set(&self.brakes.rolling, rolling);
        set(&self.brakes.rolling_peak, peak);
        set(&self.brakes.parked, parked);
    }

    /// A rollout the watcher started ended (`complete`, `stalled`, `timeout`).
    pub fn roll_ended(&self, how: &'static str) {
        self.brakes
            .rolls_ended
            .get_or_create(&HowLabel { how })
            .inc();
    }

    pub fn breaker_tripped(&self) {
        self.brakes.breaker_trips.inc();
    }

    /// Open breakers, and held workloads per hold of [`helmop_core::check::HOLD_LABELS`] (a
    /// closed set of label values).
    pub fn set_holds(&self, breakers_open: usize, held: impl Fn(&str) -> usize) {
        self.brakes
            .breakers_open
            .set(i64::try_from(breakers_open).unwrap_or(i64::MAX));
        for (reason, _) in helmop_core::check::HOLD_LABELS {
            self.brakes
                .held
                .get_or_create(&ReasonLabel { reason })
                .set(i64::try_from(held(reason)).unwrap_or(i64::MAX));
        }
    }

    pub fn set_covered(&self, covered: bool) {
        self.covered.set(i64::from(covered));
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
        m.set_budget(3, 5, 7);
        m.roll_ended("stalled");
        m.breaker_tripped();
        m.set_holds(1, |r| usize::from(r == "breaker") * 4);
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
            "helmop_rollout_rolling 3",
            "helmop_rollout_rolling_peak 5",
            "helmop_rollout_parked 7",
            "helmop_rollout_rolls_ended_total{how=\"stalled\"} 1",
            "helmop_rollout_breakers_open 1",
            "helmop_rollout_breaker_trips_total 1",
            "helmop_rollout_held{reason=\"breaker\"} 4",
            "helmop_rollout_held{reason=\"missing\"} 0",
        ] {
            assert!(text.contains(line), "{line} missing in:\n{text}");
        }
    }
}
