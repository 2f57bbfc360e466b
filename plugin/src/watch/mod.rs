//! `propagate --watch`: propagate whenever HelmOps, Clusters, ClusterGroups or source objects
//! change, until SIGINT/SIGTERM.
//!
//! Each run is [`propagate_once`], the same code as a one-shot `propagate`. Changes are seen through
//! watches ([`triggers`]) and debounced ([`debounce`]); a periodic resync repairs drift downstream,
//! which is not watched. With leader election (the default) only the holder of a Lease on the
//! upstream cluster runs: a standby process never writes, and a leader that loses its Lease aborts
//! the run in flight (dropping its requests) before another process may take over (see
//! [`leader`]). On SIGINT/SIGTERM the run in flight is abandoned (server-side apply makes a
//! repeat harmless), the Lease is released so a standby takes over at once, and the process exits 0.

pub mod debounce;
pub mod events;
#[cfg(test)]
mod fixtures;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod notices;
pub mod service;
pub mod triggers;

use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use helmop_core::state::Problem;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use self::leader::LeaderHandle;
use crate::args::parse_duration;
use crate::args::{KubeArgs, ReportFormat};
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::humanize::humanize;
use crate::run::inventory::Selection;
use crate::run::propagate::{PropagateOpts, propagate_once};

use self::debounce::Pending;
use self::events::Events;
use self::health::Health;
use self::metrics::{ErrorKind, Metrics};
use self::notices::Notices;
use self::service::{Joined, ServiceArgs};

/// The `--watch` flags of `propagate`.
#[derive(Clone, Debug, Args)]
pub struct WatchArgs {
    /// Keep running: propagate again whenever a HelmOp, Cluster, ClusterGroup or source Secret or
    /// ConfigMap changes (watches, not polling), until SIGINT/SIGTERM. Prints one event per line
    /// (-o json: JSON Lines)
    #[arg(long)]
    pub watch: bool,

    /// With --watch: a change after a quiet period runs within 100ms (or this, if shorter);
    /// changes arriving during a run or within this long after one wait until they have been
    /// quiet this long and are handled together; a steady stream of changes still runs at least
    /// every 10 times this
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
    // Installed first, so a signal during start-up is not lost.
    let mut signals = Signals::install()?;
    watch_args.service.timings()?;
    let metrics = Metrics::new();
    let synced = Arc::new(triggers::Synced::default());
    let health = Arc::new(Health::new(synced.clone()));
    health.beat();
    // Bound before connecting, so probes answer (not ready) while start-up is slow.
    let listener = watch_args
        .service
        .listen(metrics.clone(), health.clone())
        .await?;
    let ctx = Ctx::connect_identified(kube).await?;
    let opts = opts(&ctx);
    let events = Events::new(output);

    let Some(Joined {
        election,
        mut leading,
        keep: _keep,
    }) = watch_args
        .service
        .join(
            &ctx.upstream,
            || lease_name(&opts.scope.selection),
            opts.dry_run,
            &mut signals,
            &events,
            &health,
        )
        .await?
    else {
        return Ok(ExitStatus::Ok);
    };
    let scope = scope_text(&opts.scope.selection);
    events.started(
        election.as_ref().map(LeaderHandle::identity),
        election.as_ref().map(LeaderHandle::lease),
        &scope,
        listener.as_ref().map(|l| l.addr),
    );
    let was_leading = *leading.borrow_and_update();
    metrics.set_leader(was_leading);
    let mut notices = (!opts.dry_run).then(|| {
        let identity = election
            .as_ref()
            .map_or_else(leader::default_identity, |h| h.identity().to_owned());
        Notices::new(ctx.upstream.clone(), &identity)
    });
    if let Some(h) = &election {
        events.leader(
            was_leading,
            h.identity(),
            h.lease(),
            leader_note(was_leading),
        );
    }

    crate::test_pause::pause("before-watches", "upstream").await;
    let (tx, mut rx) = mpsc::channel(1024);
    let mut own_ids = vec![ctx.upstream_id.clone()];
    own_ids.extend(ctx.upstream_aliases.iter().cloned());
    let watches = triggers::spawn(
        &ctx.upstream,
        &opts.scope.selection,
        opts.scope.target_contexts.is_empty(),
        triggers::OwnIds(own_ids),
        tx,
        &synced,
    );
    let mut heartbeat = tokio::time::interval(health::HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);

    let max_delay = watch_args.debounce * 10;
    let mut pending = Pending::leading_edge();
    pending.mark(Instant::now(), "start");
    let mut next_resync = resync_after(watch_args.resync);
    // A run that completed with transient problems runs again on its own at this instant; a
    // change before it runs at once as usual (unlike a failed run's back-off, which holds changes).
    let mut next_retry: Option<Instant> = None;
    let mut run_number = 0u64;
    let mut failures = 0u32;
    let mut election_alive = election.is_some();

    let signal = 'outer: loop {
        let is_leading = *leading.borrow();
        let due = if is_leading {
            pending.due(watch_args.debounce, max_delay)
        } else {
            None
        };
        tokio::select! {
            signal = signals.recv() => break signal,
            _ = heartbeat.tick() => health.beat(),
            Some(trigger) = rx.recv() => pending.mark(Instant::now(), trigger.0),
            changed = leading.changed(), if election_alive => {
                if changed.is_err() {
                    // The elector is gone (it only ends on shutdown): stop acting on it.
                    election_alive = false;
                    continue;
                }
                let now_leading = *leading.borrow_and_update();
                metrics.set_leader(now_leading);
                if let Some(h) = &election {
                    events.leader(now_leading, h.identity(), h.lease(), leader_note(now_leading));
                }
                if !now_leading && let Some(n) = notices.as_mut() {
                    n.forget();
                }
                if now_leading {
                    // Changes seen while standing by were not acted on.
                    pending.mark(Instant::now(), "became leader");
                }
            }
            _ = sleep_until_opt(next_resync) => {
                pending.mark(Instant::now(), "resync");
                next_resync = resync_after(watch_args.resync);
            }
            _ = sleep_until_opt(next_retry) => {
                pending.mark(Instant::now(), "retry");
                next_retry = None;
            }
            _ = sleep_until_opt(due) => {
                let reasons = pending.take();
                run_number += 1;
                let run = propagate_once(&ctx, &opts);
                let mut run = std::pin::pin!(run);
                // The heartbeat goes on during a run: a long run is not a dead process.
                let outcome = loop {
                    tokio::select! {
                        result = &mut run => break Outcome::Done(result.map(Box::new)),
                        _ = lost(&mut leading), if election.is_some() => break Outcome::LostLease,
                        signal = signals.recv() => break Outcome::Signal(signal),
                        _ = heartbeat.tick() => health.beat(),
                    }
                };
                pending.ran(Instant::now());
                match outcome {
                    Outcome::Done(Ok(report)) => {
                        let retry = retry_after(&report, failures + 1);
                        failures = if retry.is_some() { failures + 1 } else { 0 };
                        next_retry = retry.map(|wait| Instant::now() + wait);
                        watches.note_namespaces(&report.namespaces);
                        metrics.run_done(&report, k8s_openapi::jiff::Timestamp::now().as_second());
                        metrics.set_clients(ctx.clients.len());
                        let retry_in = retry.map(humanize);
                        events.run(run_number, &reasons, &report, retry_in.as_deref());
                        // Only the leader tells: a run only completes while leading.
                        if *leading.borrow() && let Some(n) = notices.as_mut() {
                            let failed = tokio::select! {
                                failed = n.publish(&report) => failed,
                                signal = signals.recv() => break 'outer signal,
                            };
                            for _ in 0..failed {
                                metrics.error(ErrorKind::Event);
                            }
                        }
                    }
                    Outcome::Done(Err(e)) => {
                        metrics.run_failed();
                        failures += 1;
                        let wait = debounce::backoff(failures, MAX_BACKOFF);
                        events.failed(run_number, &reasons, &e, &humanize(wait));
                        pending.retry_at(Instant::now() + wait, "retry");
                    }
                    Outcome::LostLease => {
                        metrics.run_aborted();
                        metrics.set_leader(false);
                        events.aborted(run_number, "lost the lease");
                        if let Some(h) = &election {
                            events.leader(false, h.identity(), h.lease(), "lost the Lease: not writing");
                        }
                        pending.mark(Instant::now(), "aborted run");
                    }
                    Outcome::Signal(signal) => {
                        metrics.run_aborted();
                        events.aborted(run_number, signal);
                        break 'outer signal;
                    }
                }
            }
        }
    };
    // Stop acting on changes, say so, then give the Lease away: nothing writes any more, so a
    // standby may take over at once.
    drop(watches);
    if let Some(h) = election {
        if *leading.borrow() {
            events.leader(
                false,
                h.identity(),
                h.lease(),
                "stopping: not writing any more",
            );
        }
        h.shutdown().await;
    }
    events.stopped(signal);
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

enum Outcome {
    // Boxed: a report is far larger than the other outcomes.
    Done(Result<Box<crate::run::propagate::Report>, PluginError>),
    LostLease,
    Signal(&'static str),
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

/// The default Lease of a scope ([`leader::scoped_lease_name`]).
fn lease_name(selection: &Selection) -> String {
    let base = leader::DEFAULT_LEASE_NAME;
    match selection {
        Selection::All => leader::scoped_lease_name(base, None, None),
        Selection::Namespace(ns) => leader::scoped_lease_name(base, Some(ns), None),
        Selection::One { namespace, name } => {
            leader::scoped_lease_name(base, Some(namespace), Some(name))
        }
    }
}

fn scope_text(selection: &Selection) -> String {
    match selection {
        Selection::One { namespace, name } => format!("HelmOp {namespace}/{name}"),
        Selection::Namespace(ns) => format!("the HelmOps of namespace {ns}"),
        Selection::All => "the HelmOps of all namespaces".to_owned(),
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
