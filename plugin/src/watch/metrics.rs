//! Prometheus metrics of `propagate --watch`, served on `/metrics` of the `--metrics-addr`
//! listener ([`super::health`]). Names and meanings are listed in docs/propagator.md ("The propagator as a
//! service"). Every value is set from what a run reported, never estimated: the copies gauge is the
//! last run's rows per state, the error counters add that run's problem rows.
//!
//! Label values come from closed sets (row states, result and error kinds), except `cluster`, which
//! is bounded by the Fleet Clusters the watched HelmOps target.

use std::sync::{Arc, Mutex};

use helmop_core::state::{Problem, RowState};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::error::ExitStatus;
use crate::run::propagate::Report;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabel {
    pub state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClusterLabel {
    pub cluster: String,
}

/// What went wrong, as counted in `helmop_propagator_errors_total{kind}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// A whole run failed (upstream unreachable, hash key refused, ...).
    Run,
    /// A downstream cluster could not be worked on (counted once per cluster and run).
    Unreachable,
    /// A copy is refused: the object there is not helmop's.
    Conflict,
    /// A source Secret/ConfigMap named by a HelmOp does not exist (once per row).
    SourceMissing,
    /// A write (or a read before it) failed on a reachable cluster.
    Write,
    /// A HelmOp's targets or entries are invalid.
    Invalid,
    /// A Kubernetes Event could not be published.
    Event,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Run => "run",
            ErrorKind::Unreachable => "unreachable",
            ErrorKind::Conflict => "conflict",
            ErrorKind::SourceMissing => "source_missing",
            ErrorKind::Write => "write",
            ErrorKind::Invalid => "invalid",
            ErrorKind::Event => "event",
        }
    }
}

/// The kind a row in `state` is counted as an error under, if it is one.
fn error_kind(state: RowState) -> Option<ErrorKind> {
    match state.problem()? {
        Problem::Conflict => Some(ErrorKind::Conflict),
        Problem::SourceMissing => Some(ErrorKind::SourceMissing),
        Problem::Failed | Problem::Lost => Some(ErrorKind::Write),
        Problem::Invalid => Some(ErrorKind::Invalid),
        // Counted per cluster, not per row (`unreachable_clusters`).
        Problem::Unreachable => None,
    }
}

/// Cheap to clone: every metric is reference counted.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Mutex<Registry>>,
    copies: Family<StateLabel, Gauge>,
    runs: Family<ResultLabel, Counter>,
    errors: Family<KindLabel, Counter>,
    last_success: Family<ClusterLabel, Gauge>,
    leader: Gauge,
    clients: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("helmop_propagator");
        let copies = Family::<StateLabel, Gauge>::default();
        registry.register(
            "copies",
            "Rows of the last completed run per state (copies, plus restamped workloads)",
            copies.clone(),
        );
        let runs = Family::<ResultLabel, Counter>::default();
        registry.register(
            "runs",
            "Propagation runs by result: ok, partial (a cluster unreachable or a write failed), invalid (a conflict, missing source or invalid HelmOp), failed, aborted",
            runs.clone(),
        );
        let errors = Family::<KindLabel, Counter>::default();
        registry.register(
            "errors",
            "Problems found by runs, by kind: run, unreachable, conflict, source_missing, write, invalid, event",
            errors.clone(),
        );
        let last_success = Family::<ClusterLabel, Gauge>::default();
        registry.register(
            "last_success_timestamp_seconds",
            "Unix time of the last run that reached the cluster and wrote everything it had to",
            last_success.clone(),
        );
        let leader = Gauge::default();
        registry.register(
            "leader",
            "1 while this process holds the leader-election Lease (or runs without election), else 0",
            leader.clone(),
        );
        let clients = Gauge::default();
        registry.register(
            "downstream_clients",
            "Downstream clients kept between runs (one per distinct kubeconfig Secret or context; bounded by the fleet, not by the runs)",
            clients.clone(),
        );
        registry.register(
            "build",
            "Version of kubectl-helmop",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        Metrics {
            registry: Arc::new(Mutex::new(registry)),
            copies,
            runs,
            errors,
            last_success,
            leader,
            clients,
        }
    }

    /// Downstream clients kept after a run ([`crate::cluster::client_cache`]).
    pub fn set_clients(&self, n: usize) {
        self.clients.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn set_leader(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    pub fn error(&self, kind: ErrorKind) {
        self.errors
            .get_or_create(&KindLabel {
                kind: kind.as_str(),
            })
            .inc();
    }

    /// A run that could not complete.
    pub fn run_failed(&self) {
        self.count_run("failed");
        self.error(ErrorKind::Run);
    }

    /// A run abandoned (lost the Lease, or a signal).
    pub fn run_aborted(&self) {
        self.count_run("aborted");
    }

    /// A completed run; `standing` is where the fleet stands after it (the run itself for a full
    /// run, [`crate::watch::standing`] for a focused one); `now` is the Unix time it ended.
    pub fn run_done(&self, report: &Report, standing: &Report, now: i64) {
        self.count_run(match report.exit_status() {
            ExitStatus::Ok => "ok",
            ExitStatus::Partial => "partial",
            _ => "invalid",
        });
        // States absent from the fleet now must read 0, not their old value.
        self.copies.clear();
        for (state, n) in &standing.summary.states {
            self.copies
                .get_or_create(&StateLabel {
                    state: state.as_str(),
                })
                .set(i64::try_from(*n).unwrap_or(i64::MAX));
        }
        if report.summary.unreachable_clusters > 0 {
            self.errors
                .get_or_create(&KindLabel {
                    kind: ErrorKind::Unreachable.as_str(),
                })
                .inc_by(report.summary.unreachable_clusters as u64);
        }
        for (state, n) in &report.summary.states {
            if let Some(kind) = error_kind(*state) {
                self.errors
                    .get_or_create(&KindLabel {
                        kind: kind.as_str(),
                    })
                    .inc_by(*n as u64);
            }
        }
        for cluster in report.succeeded_clusters() {
            self.last_success
                .get_or_create(&ClusterLabel { cluster })
                .set(now);
        }
    }

    fn count_run(&self, result: &'static str) {
        self.runs.get_or_create(&ResultLabel { result }).inc();
    }

    /// The Prometheus text exposition of every metric.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::with_capacity(2048);
        let registry = self.registry.lock().map_err(|_| std::fmt::Error)?;
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::watch::fixtures::{report, row};

    #[test]
    fn a_run_sets_states_errors_and_per_cluster_success() {
        let m = Metrics::new();
        m.set_leader(true);
        let first = report(
            vec![
                row("team/d1", RowState::Created),
                row("team/d2", RowState::Unreachable),
            ],
            1,
        );
        m.run_done(&first, &first, 1_700_000_000);
        let second = report(
            vec![
                row("team/d1", RowState::Unchanged),
                row("team/d2", RowState::Conflict),
            ],
            0,
        );
        m.run_done(&second, &second, 1_700_000_100);
        let text = m.encode().unwrap();
        for want in [
            r#"helmop_propagator_copies{state="Unchanged"} 1"#,
            r#"helmop_propagator_copies{state="Conflict"} 1"#,
            r#"helmop_propagator_runs_total{result="partial"} 1"#,
            r#"helmop_propagator_runs_total{result="invalid"} 1"#,
            r#"helmop_propagator_errors_total{kind="unreachable"} 1"#,
            r#"helmop_propagator_errors_total{kind="conflict"} 1"#,
            r#"helmop_propagator_last_success_timestamp_seconds{cluster="team/d1"} 1700000100"#,
            r#"helmop_propagator_last_success_timestamp_seconds{cluster="team/d2"} 1700000100"#,
            "helmop_propagator_leader 1",
            "helmop_propagator_build_info{version=",
        ] {
            assert!(text.contains(want), "{want} missing in\n{text}");
        }
        assert!(
            !text.contains(r#"state="Created""#),
            "a state of an earlier run lingers:\n{text}"
        );
    }
}
