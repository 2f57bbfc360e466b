//! `propagate --watch`: propagate whenever HelmOps, Clusters, ClusterGroups or source objects
//! change, until SIGINT/SIGTERM.
//!
//! Each run is [`crate::run::propagate::propagate_once`], the same code as a one-shot `propagate`. Changes are seen through
//! watches ([`triggers`]) and debounced ([`debounce`]); a periodic resync repairs drift downstream,
//! which is not watched. With leader election (the default) only the holder of a Lease on the
//! upstream cluster runs: a standby process never writes, and a leader that loses its Lease aborts
//! the run in flight (dropping its requests) before another process may take over (see
//! [`leader`]). On SIGINT/SIGTERM the run in flight is abandoned (server-side apply makes a
//! repeat harmless), the Lease is released so a standby takes over at once, and the process exits 0.

pub mod debounce;
pub mod events;
#[cfg(test)]
pub(crate) mod fixtures;
pub mod health;
pub mod leader;
mod machine;
pub mod metrics;
pub mod notices;
mod relist;
pub mod service;
pub mod standing;
pub mod triggers;

use std::time::Duration;

use clap::Args;
use helmop_core::sharding::Shard;
use helmop_core::state::Problem;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::args::parse_duration;
use crate::args::{KubeArgs, ReportFormat};
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::run::inventory::Selection;
use crate::run::propagate::PropagateOpts;

use self::machine::Machine;
use self::service::ServiceArgs;

/// The `--watch` flags of `propagate`.
#[derive(Clone, Debug, Args)]
pub struct WatchArgs {
    /// Keep running: propagate again whenever a HelmOp, Cluster, ClusterGroup or source Secret or
    /// ConfigMap changes (watches, not polling), until SIGINT/SIGTERM. Prints one event per line
    /// (-o json: JSON Lines)
    #[arg(long)]
    pub watch: bool,

    /// With --watch: a change after a quiet period runs once changes have stopped for 30ms, within
    /// 100ms of the first (or this, if shorter); changes arriving during a run or within this long
    /// after one wait until they have been quiet this long and are handled together; a steady
    /// stream of changes still runs at least every 10 times this
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s", requires = "watch")]
    pub debounce: Duration,

    /// With --watch: run at least this often without changes, to repair edits made downstream; 0
    /// disables it
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10m", requires = "watch")]
    pub resync: Duration,

    #[command(flatten)]
    pub service: ServiceArgs,
}

/// Longest wait between failed runs, and before retrying a run's failed writes.
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Longest wait before retrying a run whose only transient problem is clusters that could not be
/// reached: one dead cluster in a fleet of a thousand costs a full run every few minutes, not
/// every minute.
const MAX_UNREACHABLE_BACKOFF: Duration = Duration::from_secs(300);

/// `opts` turns the connected context into the options of each run (`propagate`'s flags).
pub async fn run(
    kube: &KubeArgs,
    output: ReportFormat,
    opts: impl FnOnce(&Ctx) -> PropagateOpts,
    watch_args: &WatchArgs,
) -> Result<ExitStatus, PluginError> {
    let Some(mut machine) = Machine::start(kube, output, opts, watch_args).await? else {
        return Ok(ExitStatus::Ok);
    };
    let signal = machine.run().await;
    machine.shutdown(signal).await;
    Ok(ExitStatus::Ok)
}

/// When a completed run is tried again with nothing changed, as the `failures`-th consecutive one:
/// after the back-off of its most urgent problem that can go away on its own ([`retry_cap`]);
/// `None` when it has none. Without this a copy whose write failed once would wait for the next
/// change or the resync (10 minutes by default).
fn retry_after(report: &crate::run::propagate::Report, failures: u32) -> Option<Duration> {
    let rows = report
        .summary
        .states
        .iter()
        .filter(|(_, count)| **count > 0)
        .filter_map(|(state, _)| state.problem());
    // A cluster unreachable before any row was planned for it has no row.
    let clusters = (report.summary.unreachable_clusters > 0).then_some(Problem::Unreachable);
    rows.chain(clusters)
        .filter_map(retry_cap)
        .min()
        .map(|cap| debounce::backoff(failures, cap))
}

/// The longest back-off before a problem is tried again on its own; `None` for the problems that
/// need somebody to change something (an edit upstream, which the watches see, or the resync).
fn retry_cap(problem: Problem) -> Option<Duration> {
    match problem {
        // A write or read that failed.
        Problem::Failed | Problem::Lost => Some(MAX_BACKOFF),
        Problem::Unreachable => Some(MAX_UNREACHABLE_BACKOFF),
        Problem::Conflict | Problem::SourceMissing | Problem::Invalid => None,
    }
}

fn leader_note(leading: bool) -> &'static str {
    if leading {
        "propagating"
    } else {
        "another process holds the Lease (or it could not be renewed): not writing"
    }
}

/// Resolves once `leading` turns false (or its sender is gone).
async fn lost(leading: &mut watch::Receiver<bool>) {
    let _ = leading.wait_for(|l| !*l).await;
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn resync_after(every: Duration) -> Option<Instant> {
    (!every.is_zero()).then(|| Instant::now() + every)
}

/// The default Lease of a scope ([`leader::scoped_lease_name`]) and shard
/// ([`leader::shard_lease_name`]).
fn lease_name(selection: &Selection, shard: &Shard) -> String {
    let base = leader::DEFAULT_LEASE_NAME;
    let scoped = match selection {
        Selection::All => leader::scoped_lease_name(base, None, None),
        Selection::Namespace(ns) => leader::scoped_lease_name(base, Some(ns), None),
        Selection::One { namespace, name } => {
            leader::scoped_lease_name(base, Some(namespace), Some(name))
        }
    };
    match shard.id() {
        Some(id) => leader::shard_lease_name(&scoped, id),
        None => scoped,
    }
}

fn scope_text(selection: &Selection, shard: &Shard) -> String {
    let helmops = match selection {
        Selection::One { namespace, name } => format!("HelmOp {namespace}/{name}"),
        Selection::Namespace(ns) => format!("the HelmOps of namespace {ns}"),
        Selection::All => "the HelmOps of all namespaces".to_owned(),
    };
    let label = helmop_core::names::FLEET_SHARD_REF_LABEL;
    match shard {
        Shard::Every => helmops,
        Shard::Unlabelled => format!("{helmops} without the label {label} (the unsharded ones)"),
        Shard::Id(id) => format!("{helmops} labelled {label}={id} (shard {id})"),
    }
}

/// SIGINT and SIGTERM.
pub struct Signals {
    #[cfg(unix)]
    term: tokio::signal::unix::Signal,
    #[cfg(unix)]
    int: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn install() -> Result<Signals, PluginError> {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            Ok(Signals {
                term: signal(SignalKind::terminate())?,
                int: signal(SignalKind::interrupt())?,
            })
        }
        #[cfg(not(unix))]
        Ok(Signals {})
    }

    pub async fn recv(&mut self) -> &'static str {
        #[cfg(unix)]
        {
            tokio::select! {
                _ = self.term.recv() => "SIGTERM",
                _ = self.int.recv() => "SIGINT",
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            "SIGINT"
        }
    }
}

#[cfg(test)]
mod tests {
    use helmop_core::state::RowState;

    use super::*;
    use crate::watch::fixtures::{report, row};

    #[test]
    fn failed_writes_are_retried_with_back_off_up_to_a_minute() {
        let r = report(
            vec![
                row("team/d1", RowState::Failed),
                row("team/d2", RowState::Unreachable),
            ],
            1,
        );
        assert_eq!(retry_after(&r, 1), Some(Duration::from_secs(1)));
        assert_eq!(retry_after(&r, 3), Some(Duration::from_secs(4)));
        assert_eq!(retry_after(&r, 20), Some(MAX_BACKOFF));
    }

    #[test]
    fn unreachable_clusters_alone_back_off_up_to_five_minutes() {
        let rows = report(vec![row("team/d2", RowState::Unreachable)], 1);
        // A cluster unreachable before any row was planned for it counts too.
        let none = report(vec![row("team/d1", RowState::Unchanged)], 1);
        for r in [rows, none] {
            assert_eq!(retry_after(&r, 2), Some(Duration::from_secs(2)));
            assert_eq!(retry_after(&r, 20), Some(MAX_UNREACHABLE_BACKOFF));
        }
    }

    #[test]
    fn problems_that_need_a_change_are_not_retried() {
        for state in [
            RowState::Conflict,
            RowState::SourceMissing,
            RowState::Invalid,
            RowState::Unchanged,
            RowState::Created,
        ] {
            let r = report(vec![row("team/d1", state)], 0);
            assert_eq!(retry_after(&r, 1), None, "{state}");
        }
    }
}
