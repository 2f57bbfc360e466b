//! The loop of `propagate --watch` as a small state machine, in the style of kube-runtime's
//! controller: [`Machine::start`] connects, joins the election and starts the watches;
//! [`Machine::next`] waits for the next [`Event`]; [`Machine::step`] makes its transition, one
//! small function each (leadership gained or lost, a run due and its report, ...), until a
//! signal; [`Machine::shutdown`] stops.

use std::sync::Arc;

use tokio::sync::{mpsc, watch};
use tokio::time::{Instant, Interval};

use super::debounce::{self, Pending};
use super::events::Events;
use super::health::{self, Health, Listener};
use super::leader::{self, LeaderHandle};
use super::metrics::{ErrorKind, Metrics};
use super::notices::Notices;
use super::service::Joined;
use super::standing;
use super::triggers::{self, Trigger, Watches};
use super::{
    MAX_BACKOFF, Signals, WatchArgs, leader_note, lease_name, lost, resync_after, retry_after,
    scope_text, sleep_until_opt,
};
use crate::args::{KubeArgs, ReportFormat};
use crate::cluster::context::Ctx;
use crate::cluster::read_cache::ReadCache;
use crate::error::PluginError;
use crate::humanize::humanize;
use crate::run::focus::Focus;
use crate::run::inventory::Selection;
use crate::run::kept_inventory::KeptInventory;
use crate::run::propagate::{PropagateOpts, Report, propagate_focused};

/// Reasons for a run that reads every kubeconfig and identity afresh ([`ReadCache`]).
const FRESH_READS: [&str; 3] = ["start", "resync", "became leader"];

/// What the watcher waits for.
pub(super) enum Event {
    /// SIGINT or SIGTERM.
    Shutdown(&'static str),
    Heartbeat,
    /// A watched object changed.
    Trigger(Trigger),
    /// The elector is gone (it only ends on shutdown).
    ElectorGone,
    LeadershipGained,
    LeadershipLost,
    Resync,
    /// A completed run with transient problems is due again.
    Retry,
    /// The pending changes are due for a run.
    Due,
}

/// How a run ended.
enum Outcome {
    // Boxed: a report is far larger than the other outcomes.
    Done(Result<Box<Report>, PluginError>),
    LostLease,
    Signal(&'static str),
}

/// A started watcher: what it holds and where it stands.
pub(super) struct Machine<'a> {
    args: &'a WatchArgs,
    ctx: Ctx,
    opts: PropagateOpts,
    signals: Signals,
    metrics: Metrics,
    health: Arc<Health>,
    events: Events,
    election: Option<LeaderHandle>,
    leading: watch::Receiver<bool>,
    notices: Option<Notices>,
    watches: Watches,
    triggers: mpsc::Receiver<Trigger>,
    heartbeat: Interval,
    pending: Pending,
    next_resync: Option<Instant>,
    /// A run that completed with transient problems runs again on its own at this instant; a
    /// change before it runs at once as usual (unlike a failed run's back-off, which holds
    /// changes).
    next_retry: Option<Instant>,
    run_number: u64,
    failures: u32,
    /// Where the fleet stands after the runs so far ([`standing`]); `None` before the first.
    standing: Option<Report>,
    /// The last run's inventory, for a run after source edits alone.
    inventory: KeptInventory,
    election_alive: bool,
    /// Keeps `leading` open without an election.
    _keep: watch::Sender<bool>,
    /// Serves /metrics and the probes until the watcher is gone.
    _listener: Option<health::Listener>,
}

impl<'a> Machine<'a> {
    /// Start: connects, joins the election, announces and starts the watches; `None` when a
    /// signal came while joining (the `stopped` event is printed).
    pub(super) async fn start(
        kube: &KubeArgs,
        output: ReportFormat,
        opts: impl FnOnce(&Ctx) -> PropagateOpts,
        args: &'a WatchArgs,
    ) -> Result<Option<Machine<'a>>, PluginError> {
        // Installed first, so a signal during start-up is not lost.
        let mut signals = Signals::install()?;
        args.service.timings()?;
        let metrics = Metrics::new();
        let synced = Arc::new(triggers::Synced::default());
        let health = Arc::new(Health::new(synced.clone()));
        health.beat();
        // Bound before connecting, so probes answer (not ready) while start-up is slow.
        let listener = args.service.listen(metrics.clone(), health.clone()).await?;
        let mut ctx = Ctx::connect_identified(kube).await?;
        let opts = opts(&ctx);
        // Kept between runs, invalidated by the Secret watch this watcher starts below.
        let namespace = match &opts.scope.selection {
            Selection::All => None,
            Selection::Namespace(ns) | Selection::One { namespace: ns, .. } => Some(ns.clone()),
        };
        ctx.reads = Some(Arc::new(ReadCache::new(namespace)));
        let events = Events::new(output);
        let lease = crate::watch::service::LeaseMeta {
            default_name: lease_name(&opts.scope.selection, &opts.scope.shard),
            ..Default::default()
        };
        let joined = args.service.join(
            &ctx.upstream,
            lease,
            opts.dry_run,
            &mut signals,
            &events,
            &health,
        );
        let Some(Joined {
            election,
            mut leading,
            keep,
        }) = joined.await?
        else {
            return Ok(None);
        };
        let notices = announce(
            &ctx,
            &opts,
            &events,
            &metrics,
            &election,
            &mut leading,
            &listener,
        );
        crate::test_pause::pause("before-watches", "upstream").await;
        let (watches, triggers) = spawn_watches(&ctx, &opts, &synced);
        let mut heartbeat = tokio::time::interval(health::HEARTBEAT);
        heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pending = Pending::leading_edge();
        pending.mark(Instant::now(), "start");
        let next_resync = resync_after(args.resync);
        Ok(Some(Machine {
            args,
            ctx,
            opts,
            signals,
            metrics,
            health,
            events,
            election_alive: election.is_some(),
            election,
            leading,
            notices,
            watches,
            triggers,
            heartbeat,
            pending,
            next_resync,
            next_retry: None,
            run_number: 0,
            failures: 0,
            standing: None,
            inventory: KeptInventory::default(),
            _keep: keep,
            _listener: listener,
        }))
    }

    /// Steps until a signal; returns it.
    pub(super) async fn run(&mut self) -> &'static str {
        loop {
            let event = self.next().await;
            if let Some(signal) = self.step(event).await {
                return signal;
            }
        }
    }

    /// Waits for the next event.
    async fn next(&mut self) -> Event {
        let due = if *self.leading.borrow() {
            let debounce = self.args.debounce;
            self.pending.due(debounce, debounce * 10)
        } else {
            None
        };
        tokio::select! {
            signal = self.signals.recv() => Event::Shutdown(signal),
            _ = self.heartbeat.tick() => Event::Heartbeat,
            Some(trigger) = self.triggers.recv() => Event::Trigger(trigger),
            changed = self.leading.changed(), if self.election_alive => match changed {
                Err(_) => Event::ElectorGone,
                Ok(()) if *self.leading.borrow_and_update() => Event::LeadershipGained,
                Ok(()) => Event::LeadershipLost,
            },
            _ = sleep_until_opt(self.next_resync) => Event::Resync,
            _ = sleep_until_opt(self.next_retry) => Event::Retry,
            _ = sleep_until_opt(due) => Event::Due,
        }
    }

    /// The transition `event` makes; `Some(signal)` when the watcher is to stop.
    async fn step(&mut self, event: Event) -> Option<&'static str> {
        match event {
            Event::Shutdown(signal) => return Some(signal),
            Event::Heartbeat => self.health.beat(),
            Event::Trigger(Trigger {
                why,
                source,
                helmop,
            }) => match (source, helmop) {
                (Some(source), _) => self.pending.mark_source(Instant::now(), why, source),
                (None, Some(helmop)) => self.pending.mark_helmop(Instant::now(), why, helmop),
                (None, None) => self.pending.mark(Instant::now(), why),
            },
            // Stop acting on the elector.
            Event::ElectorGone => self.election_alive = false,
            Event::LeadershipGained => self.leadership_gained(),
            Event::LeadershipLost => self.leadership_lost(),
            Event::Resync => {
                self.pending.mark(Instant::now(), "resync");
                self.next_resync = resync_after(self.args.resync);
            }
            Event::Retry => {
                self.pending.mark(Instant::now(), "retry");
                self.next_retry = None;
            }
            Event::Due => return self.due().await,
        }
        None
    }

    /// Says whether this process leads now.
    fn leadership(&self, leading: bool) {
        self.metrics.set_leader(leading);
        if let Some(h) = &self.election {
            self.events
                .leader(leading, h.identity(), h.lease(), leader_note(leading));
        }
    }

    fn leadership_gained(&mut self) {
        self.leadership(true);
        // Changes seen while standing by were not acted on.
        self.pending.mark(Instant::now(), "became leader");
    }

    fn leadership_lost(&mut self) {
        self.leadership(false);
        if let Some(n) = self.notices.as_mut() {
            n.forget();
        }
    }

    /// Due: runs once for the pending changes and reports; `Some(signal)` when a signal
    /// interrupted it.
    async fn due(&mut self) -> Option<&'static str> {
        let (reasons, focus) = self.pending.take_focus();
        let focus = focus.placed(self.standing.as_ref().map(|s| s.rows.as_slice()));
        // The periodic resync and a new leader read everything afresh, so nothing kept from
        // earlier runs outlives one resync period.
        if reasons.iter().any(|r| FRESH_READS.contains(&r.as_str())) {
            self.forget_reads();
        }
        self.run_number += 1;
        let outcome = self.propagate(&focus).await;
        self.pending.ran(Instant::now());
        match outcome {
            Outcome::Done(Ok(report)) => return self.report(&report, &reasons).await,
            Outcome::Done(Err(e)) => {
                self.forget_reads();
                self.failed(&e, &reasons)
            }
            Outcome::LostLease => self.aborted(),
            Outcome::Signal(signal) => {
                self.metrics.run_aborted();
                self.events.aborted(self.run_number, signal);
                return Some(signal);
            }
        }
        None
    }

    /// Forgets what runs keep for the next ([`ReadCache`], [`KeptInventory`]): the next run
    /// reads everything afresh.
    fn forget_reads(&self) {
        if let Some(reads) = &self.ctx.reads {
            reads.clear();
        }
        self.inventory.clear();
    }

    /// One run, cut short by losing the Lease or a signal.
    async fn propagate(&mut self, focus: &Focus) -> Outcome {
        let run = propagate_focused(&self.ctx, &self.opts, focus, Some(&self.inventory));
        let mut run = std::pin::pin!(run);
        // The heartbeat goes on during a run: a long run is not a dead process.
        loop {
            tokio::select! {
                result = &mut run => break Outcome::Done(result.map(Box::new)),
                _ = lost(&mut self.leading), if self.election.is_some() => break Outcome::LostLease,
                signal = self.signals.recv() => break Outcome::Signal(signal),
                _ = self.heartbeat.tick() => self.health.beat(),
            }
        }
    }

    /// Report: a run completed; `Some(signal)` when a signal came while telling it.
    async fn report(&mut self, report: &Report, reasons: &[String]) -> Option<&'static str> {
        // Retries, the copy counts and the Events go by the whole fleet, not by what a focused
        // run covered.
        let standing = match &self.standing {
            Some(standing) => standing::merge(standing, report),
            None => report.clone(),
        };
        let retry = retry_after(&standing, self.failures + 1);
        self.failures = if retry.is_some() {
            self.failures + 1
        } else {
            0
        };
        self.next_retry = retry.map(|wait| Instant::now() + wait);
        self.watches.note_namespaces(&report.namespaces);
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        self.metrics.run_done(report, &standing, now);
        self.metrics.set_clients(self.ctx.clients.len());
        let retry_in = retry.map(humanize);
        self.events
            .run(self.run_number, reasons, report, retry_in.as_deref());
        // Only the leader tells: a run only completes while leading.
        if *self.leading.borrow()
            && let Some(n) = self.notices.as_mut()
        {
            let failed = tokio::select! {
                failed = n.publish(&standing) => failed,
                signal = self.signals.recv() => return Some(signal),
            };
            for _ in 0..failed {
                self.metrics.error(ErrorKind::Event);
            }
        }
        self.standing = Some(standing);
        None
    }

    /// A run failed: backs off.
    fn failed(&mut self, e: &PluginError, reasons: &[String]) {
        self.metrics.run_failed();
        self.failures += 1;
        let wait = debounce::backoff(self.failures, MAX_BACKOFF);
        self.events
            .failed(self.run_number, reasons, e, &humanize(wait));
        self.pending.retry_at(Instant::now() + wait, "retry");
    }

    /// A run was aborted as the Lease was lost.
    fn aborted(&mut self) {
        self.metrics.run_aborted();
        self.metrics.set_leader(false);
        self.events.aborted(self.run_number, "lost the lease");
        if let Some(h) = &self.election {
            let note = "lost the Lease: not writing";
            self.events.leader(false, h.identity(), h.lease(), note);
        }
        self.pending.mark(Instant::now(), "aborted run");
    }

    /// Shutdown: stops acting on changes, says so, then gives the Lease away: nothing writes any
    /// more, so a standby may take over at once.
    pub(super) async fn shutdown(self, signal: &'static str) {
        drop(self.watches);
        if let Some(h) = self.election {
            if *self.leading.borrow() {
                let note = "stopping: not writing any more";
                self.events.leader(false, h.identity(), h.lease(), note);
            }
            h.shutdown().await;
        }
        self.events.stopped(signal);
    }
}

/// The `started` event, and whether this process leads at first; the notices it will publish
/// (none in a dry run).
fn announce(
    ctx: &Ctx,
    opts: &PropagateOpts,
    events: &Events,
    metrics: &Metrics,
    election: &Option<LeaderHandle>,
    leading: &mut watch::Receiver<bool>,
    listener: &Option<Listener>,
) -> Option<Notices> {
    let scope = scope_text(&opts.scope.selection, &opts.scope.shard);
    events.started(
        election.as_ref().map(LeaderHandle::identity),
        election.as_ref().map(LeaderHandle::lease),
        &scope,
        opts.scope.shard.id(),
        listener.as_ref().map(|l| l.addr),
    );
    let was_leading = *leading.borrow_and_update();
    metrics.set_leader(was_leading);
    let notices = (!opts.dry_run).then(|| {
        let identity = election
            .as_ref()
            .map_or_else(leader::default_identity, |h| h.identity().to_owned());
        Notices::new(ctx.upstream.clone(), &identity)
    });
    if let Some(h) = election {
        events.leader(
            was_leading,
            h.identity(),
            h.lease(),
            leader_note(was_leading),
        );
    }
    notices
}

/// Starts the watches upstream; their triggers come through the receiver.
fn spawn_watches(
    ctx: &Ctx,
    opts: &PropagateOpts,
    synced: &Arc<triggers::Synced>,
) -> (Watches, mpsc::Receiver<Trigger>) {
    let (tx, rx) = mpsc::channel(1024);
    let mut own_ids = vec![ctx.upstream_id.clone()];
    own_ids.extend(ctx.upstream_aliases.iter().cloned());
    let watches = triggers::spawn(
        &ctx.upstream,
        &opts.scope,
        triggers::OwnIds(own_ids),
        ctx.reads.clone(),
        tx,
        synced,
    );
    (watches, rx)
}
