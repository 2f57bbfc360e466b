//! `rollout --watch`: pods roll whoever changed what they read.
//!
//! Watches opted-in workloads and the Secrets and ConfigMaps they read (metadata only: see
//! [`watches`]), keeps an index from every object to its readers ([`index`]), and when a change
//! may have moved what a workload's pods would read, decides with the webhook's own rule
//! ([`helmop_core::rollout::decide`]) whether an UPDATE now would change its stamp. If so it asks
//! the webhook to restamp it ([`act`]). The webhook stays the only author of stamps.
//!
//! Every restamp goes through the brakes: a quiet period, a minimum interval per workload, turns
//! per namespace and back-off ([`queue`]); a roll budget for the cluster and each namespace that
//! counts a rollout until it is over ([`budget`]); a breaker per flapping source ([`breaker`]);
//! and holds that say why a due workload is not restamped (a required object or key missing, an
//! open breaker, a webhook that ignored three restamps, an Argo Rollout aborted or mid-canary),
//! each a Warning Event and a gauge.
//!
//! State, not memory: nothing is decided before every watch listed once, and then every workload
//! is decided, so a watcher killed between a decision and its restamp repairs on its next start.
//! With leader election (the default) only the holder of the scope's Lease restamps; a standby
//! keeps its index current and decides everything again when it takes over.

pub mod act;
pub mod args;
pub mod breaker;
pub mod budget;
pub mod coverage;
pub mod index;
pub mod lean;
pub mod metrics;
pub mod overlap;
pub mod queue;
pub mod watches;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use helmop_core::hash::HashKey;
use helmop_core::names;
use helmop_core::podrefs::PodRef;
use helmop_core::progress::RollState;
use helmop_core::resource::ResourceKind;
use helmop_core::rollout::opt_in;
use helmop_core::workload::WorkloadKind;
use kube::Client;
use kube::api::ApiResource;
use kube::runtime::events::{EventType, Reporter};
use serde_json::json;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::Instant;

use self::act::{DigestCache, Finished, Job, Lookup, Shared, Work};
pub use self::args::RolloutWatchArgs;
use self::args::brakes;
use self::breaker::{Breakers, Flap};
use self::budget::Budget;
use self::coverage::Coverage;
use self::index::{Index, ObjectFacts, ObjectKey, Progress, Reason, WorkloadKey};
use self::metrics::{ErrorKind, Metrics};
use self::queue::{Outcome, Queue, Ticket};
use self::watches::{Change, Scope, Step};
use crate::args::ReportFormat;
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::watch::Signals;
use crate::watch::events::Events;
use crate::watch::health::{self, Health};
use crate::watch::leader::{self, LeaderHandle};
use crate::watch::service::Joined;
use crate::watch::triggers::Synced;

/// The kinds the watcher restamps: those whose controller rolls their pods when the template
/// changes (a CronJob's next Job). Bare ReplicaSets and Jobs are left alone: a ReplicaSet does not
/// replace its pods, and a Job's template is immutable.
pub const KINDS: [WorkloadKind; 5] = [
    WorkloadKind::Deployment,
    WorkloadKind::StatefulSet,
    WorkloadKind::DaemonSet,
    WorkloadKind::CronJob,
    WorkloadKind::Rollout,
];

/// Lease name of an all-namespaces watcher; others add their scope (see [`lease_name`]).
pub const DEFAULT_LEASE_NAME: &str = "kubectl-helmop-rollout";

/// How long one registry lookup of `--images` may take.
const REGISTRY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the loop holds besides the index.
struct Loop {
    index: Index,
    queue: Queue,
    budget: Budget,
    breakers: Breakers,
    /// Workloads due for a restamp that are held, and why (each announced once).
    holds: HashMap<WorkloadKey, Hold>,
    /// Workloads `--images` wants restamped for a new registry digest (what moved), until a
    /// restamp lands (or they are gone or no longer opted in); a hold keeps them here.
    repins: HashMap<WorkloadKey, String>,
    /// Tells the poll loop a re-pin landed.
    repinned: mpsc::UnboundedSender<crate::images::rollouts::WorkloadKey>,
    /// Other rollout watchers' Leases, and the names a re-listing brought so far.
    overlaps: overlap::Overlaps,
    overlaps_listed: Option<HashSet<String>>,
    /// The Leases were listed once, or cannot be (then no watcher is known to cover this one):
    /// nothing is written before, so a narrower watcher never restamps at start-up what a wider
    /// one leads.
    leases_known: bool,
    own_scope: overlap::WatchScope,
    own_lease: String,
    /// The wider watcher whose fresh Lease contains this scope (this one writes nothing meanwhile).
    covered: Option<String>,
    /// Whether the `--images` poll loop may poll: leading and not covered.
    acting_images: tokio::sync::watch::Sender<bool>,
    /// What the webhook configuration sends to the stamping webhook (`None`: unknown, skip nothing).
    coverage: Option<Coverage>,
    coverage_name: String,
    /// Whether the configuration was read (or failed to be) once: nothing is restamped before, so
    /// a workload it leaves out is never restamped at start-up.
    coverage_seen: bool,
    /// Every namespace's labels, for `coverage`.
    namespace_labels: HashMap<String, std::collections::BTreeMap<String, String>>,
    /// Namespaces whose skipped workloads were announced.
    excluded_told: HashSet<String>,
    digests: DigestCache,
    /// The hash key before the last rotation, with the digests made under it: a workload whose
    /// stamp is current under it only needs a restamp for the key, and gets none (docs/decisions.md).
    previous: Option<(Arc<HashKey>, DigestCache)>,
    key: Result<(Arc<HashKey>, u64), String>,
    key_generation: u64,
    resources: HashMap<WorkloadKind, ApiResource>,
    /// Every watch listed once: only then is anything decided.
    synced: bool,
    /// The sources that listed once, of `sources`.
    listed: HashSet<Source>,
    sources: usize,
    /// Sources re-listing now, with the keys the new listing brought so far.
    relisting: HashMap<Source, HashSet<String>>,
    metrics: Metrics,
    events: Events,
    shared: Arc<Shared>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Source {
    Workloads(WorkloadKind),
    Objects(ResourceKind),
    Namespaces,
    HashKey,
}

pub async fn run(
    ctx: &Ctx,
    kube: &crate::args::KubeArgs,
    args: &RolloutWatchArgs,
    output: ReportFormat,
    dry_run: bool,
) -> Result<ExitStatus, PluginError> {
    if args.images && args.image_interval.is_zero() {
        return Err(PluginError::Usage(
            "--image-interval must be greater than 0".into(),
        ));
    }
    let (pacing, limits, flaps) = brakes(args)?;
    let mut signals = Signals::install()?;
    args.service.timings()?;
    let hash_key = args
        .hash_key_secret
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty())
        .map(|(ns, name)| (ns.to_owned(), name.to_owned()))
        .ok_or_else(|| {
            PluginError::Usage(format!(
                "--hash-key-secret must be NAMESPACE/NAME, not {:?}",
                args.hash_key_secret
            ))
        })?;
    let metrics = Metrics::new();
    let synced = Arc::new(Synced::default());
    let health = Arc::new(Health::new(synced.clone()));
    health.beat();
    let listener = args.service.listen(metrics.clone(), health.clone()).await?;
    let client = ctx.upstream.clone();
    let namespace = (!args.all_namespaces).then(|| ctx.namespace.clone());
    let resources = served_kinds(&client).await?;
    let scope_text = scope_text(namespace.as_deref(), args.selector.as_deref());
    let events = Events::new(output);

    let own_scope = overlap::WatchScope {
        namespace: namespace.clone(),
        selector: args.selector.clone(),
    };
    let own_lease = args
        .service
        .lease_name
        .clone()
        .unwrap_or_else(|| lease_name(namespace.as_deref(), args.selector.as_deref()));
    let Some(Joined {
        election,
        mut leading,
        keep: _keep,
    }) = args
        .service
        .join(
            &client,
            own_scope.lease_meta(own_lease.clone()),
            dry_run,
            &mut signals,
            &events,
            &health,
        )
        .await?
    else {
        return Ok(ExitStatus::Ok);
    };
    let kinds: Vec<&str> = resources.keys().map(|k| k.kind()).collect();
    events.emit(
        "started",
        &json!({
            "scope": scope_text,
            "kinds": kinds,
            "identity": election.as_ref().map(LeaderHandle::identity),
            "lease": election.as_ref().map(LeaderHandle::lease),
            "metricsAddr": listener.as_ref().map(|l| l.addr.to_string()),
            "maxConcurrent": args.max_concurrent,
            "maxRolling": limits.cluster,
            "maxRollingPerNamespace": limits.namespace,
            "dryRun": dry_run,
        }),
        format!(
            "watching opted-in workloads of {scope_text} ({}) and what they read{}{}",
            kinds.join(", "),
            listener
                .as_ref()
                .map(|l| format!("; metrics on {}", l.addr))
                .unwrap_or_default(),
            if dry_run {
                " (dry run: writing nothing)"
            } else {
                ""
            }
        ),
    );
    let was_leading = *leading.borrow_and_update();
    metrics.set_leader(was_leading);
    if let Some(h) = &election {
        events.leader(
            was_leading,
            h.identity(),
            h.lease(),
            leader_note(was_leading),
        );
    }

    let identity = election
        .as_ref()
        .map_or_else(leader::default_identity, |h| h.identity().to_owned());
    let reporter = Reporter {
        controller: act::CONTROLLER.to_owned(),
        instance: Some(identity),
    };
    let shared = Arc::new(Shared {
        client: client.clone(),
        dry_run,
        recorder: kube::runtime::events::Recorder::new(client.clone(), reporter),
    });
    let scope = Scope {
        namespace,
        selector: args.selector.clone(),
        kinds: resources.iter().map(|(k, r)| (*k, r.clone())).collect(),
        hash_key,
        webhook_configuration: Some(args.webhook_configuration.clone()).filter(|n| !n.is_empty()),
        // Only a scope some other can contain watches for one that does.
        leases: (!own_scope.is_widest()).then(|| args.service.lease_namespace()),
    };
    let (tx, mut rx) = mpsc::channel(1024);
    let watches = watches::spawn(&client, &scope, tx, &synced);
    // `--images`: the registry poll loop, driven beside this one (same task: it borrows its setup).
    let image_setup = if args.images {
        Some(
            crate::images::pass::Setup::new(crate::images::pass::SetupOptions {
                kube,
                registry_config: args.registry_config.as_deref(),
                mutable_tags: &args.mutable_tags,
                all_namespaces: args.all_namespaces,
                selector: args.selector.as_deref(),
                registry_timeout: REGISTRY_TIMEOUT,
            })
            .await?,
        )
    } else {
        None
    };
    let image_options = crate::images::watch::WatchOptions {
        interval: args.image_interval,
        debounce: args.image_interval,
        output,
        dry_run,
    };
    let image_events = Events::new(output);
    let mut images_running = image_setup.is_some();
    // The poll loop hands its restamps to this loop (budget, pacing, breakers, holds) and hears
    // back which landed.
    let (repin_tx, mut repin_rx) = mpsc::unbounded_channel();
    let (repinned_tx, repinned_rx) = mpsc::unbounded_channel();
    let restamps = crate::images::watch::Restamps::Handoff {
        requests: repin_tx,
        done: repinned_rx,
    };
    let (stop_images, images_stopped) = tokio::sync::oneshot::channel::<&'static str>();
    // The poll loop polls only while this loop acts (leads, and no wider watcher covers it).
    let (images_gate_tx, images_leading) = tokio::sync::watch::channel(*leading.borrow());
    let images = async move {
        match image_setup {
            Some(setup) => {
                let stopped = async { images_stopped.await.unwrap_or("the watcher stopped") };
                crate::images::watch::run_loop(
                    &image_options,
                    &setup,
                    &image_events,
                    images_leading,
                    restamps,
                    stopped,
                )
                .await;
            }
            None => std::future::pending::<()>().await,
        }
    };
    let mut images = std::pin::pin!(images);
    let mut state = Loop {
        index: Index::default(),
        queue: Queue::new(pacing),
        budget: Budget::new(limits),
        breakers: Breakers::new(flaps),
        holds: HashMap::new(),
        repins: HashMap::new(),
        repinned: repinned_tx,
        overlaps: overlap::Overlaps::default(),
        overlaps_listed: None,
        leases_known: scope.leases.is_none(),
        own_scope,
        own_lease,
        covered: None,
        acting_images: images_gate_tx,
        coverage: None,
        coverage_name: args.webhook_configuration.clone(),
        coverage_seen: args.webhook_configuration.is_empty(),
        namespace_labels: HashMap::new(),
        excluded_told: HashSet::new(),
        digests: DigestCache::default(),
        previous: None,
        key: Err("the hash key is not read yet".to_owned()),
        key_generation: 0,
        sources: resources.len() + 4,
        resources,
        synced: false,
        listed: HashSet::new(),
        relisting: HashMap::new(),
        metrics: metrics.clone(),
        events,
        shared: shared.clone(),
    };
    let mut heartbeat = tokio::time::interval(health::HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut jobs: JoinSet<Finished> = JoinSet::new();
    let mut next_resync = after(args.resync);
    let max = usize::from(args.max_concurrent);
    let mut election_alive = election.is_some();

    let signal = loop {
        let is_leading = *leading.borrow();
        let now = Instant::now();
        state.check_covered(is_leading, now);
        let acting = is_leading
            && state.leases_known
            && state.covered.is_none()
            && state.synced
            && state.coverage_seen
            && state.key.is_ok();
        if acting {
            state.dispatch(&mut jobs, max);
        }
        let next = if acting && jobs.len() < max {
            state.queue.next_at()
        } else {
            None
        };
        let housekeeping = state.next_housekeeping();
        let lease_expiry = state
            .overlaps
            .next_expiry(&state.own_lease, &state.own_scope);
        tokio::select! {
            signal = signals.recv() => break signal,
            _ = heartbeat.tick() => {
                health.beat();
                state.report_sizes();
            }
            change = rx.recv() => match change {
                Some(change) => {
                    state.apply(change);
                    // Drain what is already queued before deciding: a listing arrives as a burst.
                    while let Ok(change) = rx.try_recv() {
                        state.apply(change);
                    }
                }
                None => break "the watches stopped",
            },
            Some(done) = jobs.join_next(), if !jobs.is_empty() => match done {
                Ok(finished) => state.finish(finished),
                Err(e) => tracing::error!(error = %e, "a restamp task failed"),
            },
            changed = leading.changed(), if election_alive => {
                if changed.is_err() {
                    election_alive = false;
                    continue;
                }
                let now_leading = *leading.borrow_and_update();
                metrics.set_leader(now_leading);
                if let Some(h) = &election {
                    state.events.leader(now_leading, h.identity(), h.lease(), leader_note(now_leading));
                }
                if now_leading {
                    // What the previous leader announced is not known here: holds are told again.
                    state.holds.clear();
                    state.adopt_rollouts();
                    state.mark_all("leader");
                } else {
                    // Restamps in flight finish (each is harmless alone); nothing new starts.
                }
            }
            _ = sleep_until(next_resync) => {
                state.mark_all("resync");
                next_resync = after(args.resync);
            }
            _ = sleep_until(housekeeping) => state.housekeeping(),
            // A covering Lease not renewed in time: looked at again at the top of the loop.
            _ = sleep_until(lease_expiry) => {}
            _ = sleep_until(next) => {}
            _ = &mut images, if images_running => images_running = false,
            Some(repin) = repin_rx.recv(), if images_running => state.repin(repin, Instant::now()),
        }
    };
    drop(watches);
    jobs.abort_all();
    if images_running {
        let _ = stop_images.send(signal);
        images.await;
    }
    if let Some(h) = election {
        h.shutdown().await;
    }
    state.events.stopped(signal);
    Ok(ExitStatus::Ok)
}

/// Why a workload due for a restamp is not restamped.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Hold {
    /// One of the short names of [`helmop_core::check::HOLD_LABELS`].
    reason: &'static str,
    /// What the Event and the report say.
    note: String,
    /// What is missing (`secret/db`, `key password of secret/db`), for the report.
    missing: Vec<String>,
}

impl Hold {
    /// The Event reason of the hold.
    fn event_reason(&self) -> &'static str {
        helmop_core::check::HOLD_LABELS
            .iter()
            .find(|(label, _)| *label == self.reason)
            .map_or("RestampDeferred", |(_, reason)| reason)
    }
}

enum Planned {
    Done(WorkloadKey, Outcome),
    /// The webhook configuration does not send it to the webhook.
    Excluded(WorkloadKey),
    Held(Ticket, Hold),
    Job(Box<Job>),
    /// Due, and the roll budget has no room for it.
    Park(Ticket),
}

impl Loop {
    fn apply(&mut self, change: Change) {
        let now = Instant::now();
        match change {
            Change::Workload(kind, step) => {
                let source = Source::Workloads(kind);
                match step {
                    Step::Put((key, facts)) | Step::Listed((key, facts)) => {
                        self.seen(source, key.name.clone() + "\0" + &key.namespace);
                        let progress = facts.progress.clone();
                        for w in self.index.put_workload(key.clone(), facts) {
                            self.mark(w, Reason::Workload, now);
                        }
                        self.progressed(&key, progress, now);
                    }
                    Step::Delete(key) => self.workload_gone(&key),
                    Step::Relist => self.relist(source),
                    Step::Done => {
                        if let Some(seen) = self.relisting.remove(&source) {
                            for key in self.index.workloads_of(kind) {
                                if !seen.contains(&(key.name.clone() + "\0" + &key.namespace)) {
                                    self.workload_gone(&key);
                                }
                            }
                        }
                        self.listed(source);
                    }
                }
            }
            Change::Object(kind, step) => {
                let source = Source::Objects(kind);
                match step {
                    Step::Put((key, facts)) | Step::Listed((key, facts)) => {
                        self.seen(source, key.resource.name.clone() + "\0" + &key.namespace);
                        self.object_changed(key, facts, now);
                    }
                    Step::Delete(key) => self.object_gone(&key, now),
                    Step::Relist => self.relist(source),
                    Step::Done => {
                        if let Some(seen) = self.relisting.remove(&source) {
                            for key in self.index.objects_of(kind) {
                                let id = key.resource.name.clone() + "\0" + &key.namespace;
                                if !seen.contains(&id) {
                                    self.object_gone(&key, now);
                                }
                            }
                        }
                        self.listed(source);
                    }
                }
            }
            Change::Namespace(step) => match step {
                Step::Put((name, label, labels)) | Step::Listed((name, label, labels)) => {
                    self.seen(Source::Namespaces, name.clone());
                    if self.namespace_labels.get(&name) != Some(&labels) {
                        self.excluded_told.remove(&name);
                        self.namespace_labels.insert(name.clone(), labels);
                    }
                    for w in self.index.put_namespace(name, label) {
                        self.mark(w, Reason::Namespace, now);
                    }
                }
                Step::Delete(name) => {
                    self.namespace_labels.remove(&name);
                    self.index.delete_namespace(&name);
                }
                Step::Relist => self.relist(Source::Namespaces),
                Step::Done => {
                    if let Some(seen) = self.relisting.remove(&Source::Namespaces) {
                        for name in self.index.namespace_names() {
                            if !seen.contains(&name) {
                                self.namespace_labels.remove(&name);
                                self.index.delete_namespace(&name);
                            }
                        }
                    }
                    self.listed(Source::Namespaces);
                }
            },
            Change::HashKey(key) => {
                let same = match (&self.key, &key) {
                    (Ok((old, _)), Ok(new)) => fingerprint(old) == fingerprint(new),
                    (Err(a), Err(b)) => a == b,
                    _ => false,
                };
                if same {
                    return;
                }
                let digests = std::mem::take(&mut self.digests);
                if let Ok((old, _)) = &self.key {
                    self.previous = Some((old.clone(), digests));
                }
                match key {
                    Ok(key) => {
                        self.key_generation += 1;
                        self.key = Ok((Arc::new(key), self.key_generation));
                        self.mark_all("hash-key");
                    }
                    Err(why) => {
                        self.events.emit(
                            "waiting",
                            &json!({"reason": why}),
                            format!("not restamping: {why}"),
                        );
                        self.key = Err(why);
                    }
                }
            }
            Change::HashKeyListed => self.listed(Source::HashKey),
            Change::Coverage(coverage) => {
                self.coverage_seen = true;
                let coverage = match coverage {
                    Ok(c) => c,
                    Err(why) => {
                        self.events.emit(
                            "coverage-unknown",
                            &json!({"configuration": self.coverage_name, "error": why}),
                            format!(
                                "cannot read the webhook configuration (skipping nothing): {why}"
                            ),
                        );
                        None
                    }
                };
                if coverage != self.coverage {
                    self.coverage = coverage;
                    self.excluded_told.clear();
                    self.mark_all("webhook-configuration");
                }
            }
            Change::Lease(step) => match step {
                Step::Put((name, facts)) => self.overlaps.put(name, facts, now),
                Step::Listed((name, facts)) => {
                    if let Some(listed) = &mut self.overlaps_listed {
                        listed.insert(name.clone());
                    }
                    self.overlaps.put(name, facts, now);
                }
                Step::Delete(name) => self.overlaps.delete(&name),
                Step::Relist => self.overlaps_listed = Some(HashSet::new()),
                Step::Done => {
                    if let Some(listed) = self.overlaps_listed.take() {
                        self.overlaps.retain(&listed);
                    }
                    self.leases_known = true;
                }
            },
            Change::WatchFailed { what, error } => {
                if what.starts_with(watches::LEASES_WATCH) {
                    self.leases_known = true;
                }
                self.metrics.error(ErrorKind::Watch);
                self.events.emit(
                    "watch-failed",
                    &json!({"watch": what, "error": error}),
                    format!("the watch of {what} failed (retrying): {error}"),
                );
            }
        }
    }

    /// Whether a wider watcher covers this one now; says so when that changes. Uncovered again,
    /// the watcher takes over as a new leader does: it counts the rollouts still going and decides
    /// every workload once (through the budget; a workload the wider one restamped reads nothing).
    fn check_covered(&mut self, leading: bool, now: Instant) {
        let found = self
            .overlaps
            .covering(&self.own_lease, &self.own_scope, now);
        // Called at every turn of the loop: nothing is allocated unless the answer changed.
        if found.map(|(name, _)| name) != self.covered.as_deref() {
            let covering = found.map(|(name, scope)| (name.to_owned(), scope.describe()));
            let name = covering.as_ref().map(|(name, _)| name.clone());
            match &covering {
                Some((lease, scope)) => self.events.emit(
                    "covered",
                    &json!({"lease": lease, "scope": scope}),
                    format!(
                        "standing by: the watcher of {scope} (Lease {lease}) leads and contains this scope; writing nothing while its Lease is fresh"
                    ),
                ),
                None => self.events.emit(
                    "uncovered",
                    &json!({"lease": self.covered}),
                    format!(
                        "the wider watcher's Lease {} was released or went stale: restamping in {} again",
                        self.covered.as_deref().unwrap_or_default(),
                        self.own_scope.describe()
                    ),
                ),
            }
            self.metrics.set_covered(name.is_some());
            if name.is_none() && leading {
                self.holds.clear();
                self.adopt_rollouts();
                self.mark_all("uncovered");
            }
            self.covered = name;
        }
        self.acting_images.send_if_modified(|acting| {
            let now_acting = leading && self.covered.is_none();
            let changed = *acting != now_acting;
            *acting = now_acting;
            changed
        });
    }

    /// `--images` found new digests for `repin`'s tags: decide it again, as due for a re-pin.
    fn repin(&mut self, repin: crate::images::watch::Repin, now: Instant) {
        let key = WorkloadKey {
            kind: repin.kind,
            namespace: repin.namespace,
            name: repin.name,
        };
        self.repins.insert(key.clone(), repin.moved.clone());
        self.mark(key, Reason::Images(repin.moved), now);
    }

    fn workload_gone(&mut self, key: &WorkloadKey) {
        self.repins.remove(key);
        self.index.delete_workload(key);
        self.queue.forget(key);
        self.budget.end(key);
        self.holds.remove(key);
    }

    /// A workload's status moved: its rollout may be over (room in the budget), or an Argo
    /// Rollout held while busy may be free again.
    fn progressed(&mut self, key: &WorkloadKey, progress: Progress, now: Instant) {
        match self
            .budget
            .progress(key, progress.generation, progress.state.clone())
        {
            budget::Ended::No => {}
            budget::Ended::Complete => self.roll_ended(key, "complete", None),
            budget::Ended::Stalled(why) => self.roll_ended(key, "stalled", Some(why)),
        }
        let busy = self
            .holds
            .get(key)
            .is_some_and(|h| h.reason == "rollout-busy");
        if busy && progress.state == RollState::Complete {
            self.mark(key.clone(), Reason::Workload, now);
        }
    }

    fn roll_ended(&mut self, key: &WorkloadKey, how: &'static str, why: Option<&str>) {
        self.metrics.roll_ended(how);
        let fields = json!({"workload": key.to_string(), "how": how, "why": why});
        match why {
            None => self
                .events
                .emit("rolled", &fields, format!("{key} rolled out")),
            Some(why) => {
                let note = format!(
                    "its rollout is not over ({why}); it no longer counts against the roll budget"
                );
                self.events
                    .emit("roll-stalled", &fields, format!("{key}: {note}"));
                self.publish_on_workload(key, EventType::Warning, "RolloutStalled", note);
            }
        }
    }

    fn object_changed(&mut self, key: ObjectKey, facts: ObjectFacts, now: Instant) {
        let resume = facts.resume.clone();
        let uid = facts.version.uid.clone();
        let due = self.index.put_object(key.clone(), facts);
        if due.is_empty() || !self.synced {
            for (w, reason) in due {
                self.mark(w, reason, now);
            }
            return;
        }
        match self.breakers.change(&key, resume.as_deref(), now) {
            Flap::Fine | Flap::Open => {}
            Flap::Tripped { changes } => {
                self.metrics.breaker_tripped();
                let limits = self.breakers.limits();
                let note = format!(
                    "changed {changes} times within {}: its {} reader(s) are not restamped until it is quiet for {} or `kubectl helmop rollout --resume {} -n {}`",
                    crate::humanize::humanize(limits.window),
                    due.len(),
                    crate::humanize::humanize(limits.release),
                    key.resource,
                    key.namespace,
                );
                self.events.emit(
                    "breaker-open",
                    &json!({"object": key.to_string(), "changes": changes, "readers": due.len()}),
                    format!("{key} {note}"),
                );
                let regarding = act::object_ref(&key, &uid);
                self.publish(regarding, EventType::Warning, "RolloutBreakerOpen", note);
            }
            Flap::Resumed => self.breaker_closed(&key, "resumed"),
        }
        for (w, reason) in due {
            self.mark(w, reason, now);
        }
    }

    fn breaker_closed(&mut self, key: &ObjectKey, how: &'static str) {
        self.events.emit(
            "breaker-closed",
            &json!({"object": key.to_string(), "how": how}),
            format!("{key}: the flap breaker closed ({how}): its readers are decided again"),
        );
    }

    fn object_gone(&mut self, key: &ObjectKey, now: Instant) {
        self.digests.remove(key);
        if self.breakers.forget(key) {
            self.breaker_closed(key, "deleted");
        }
        for (w, reason) in self.index.delete_object(key) {
            self.mark(w, reason, now);
        }
    }

    fn relist(&mut self, source: Source) {
        // The first listing of a source has nothing to drop.
        if self.listed.contains(&source) {
            self.relisting.insert(source, HashSet::new());
        }
    }

    fn seen(&mut self, source: Source, id: String) {
        if let Some(seen) = self.relisting.get_mut(&source) {
            seen.insert(id);
        }
    }

    /// `source` listed (again). Counted here, in the order the loop sees the steps, not when the
    /// watch finished listing: its listing may still be queued behind another watch's steps.
    fn listed(&mut self, source: Source) {
        self.listed.insert(source);
        if self.synced || self.listed.len() < self.sources {
            return;
        }
        self.synced = true;
        self.events.emit(
            "synced",
            &json!({
                "workloads": self.index.workload_count(),
                "objects": self.index.object_count(),
            }),
            format!(
                "listed {} workloads and {} Secrets and ConfigMaps: deciding every workload",
                self.index.workload_count(),
                self.index.object_count()
            ),
        );
        self.adopt_rollouts();
        self.mark_all("start");
    }

    /// Counts against the budget the rollouts a watcher restamped (this process before a restart,
    /// or another leader) that are not over yet: a new leader does not start more than the budget.
    fn adopt_rollouts(&mut self) {
        let now = Instant::now();
        let wall = k8s_openapi::jiff::Timestamp::now();
        let timeout = self.budget.limits().timeout;
        let mut found: Vec<(WorkloadKey, Instant, i64)> = Vec::new();
        for key in self.index.workload_keys() {
            let Some(facts) = self.index.workload(key) else {
                continue;
            };
            let Some(at) = facts.restamp.at else {
                continue;
            };
            if facts.progress.state.is_over() || facts.progress.state == RollState::Aborted {
                continue;
            }
            let age = wall.duration_since(at).try_into().unwrap_or(Duration::ZERO);
            if age < timeout {
                found.push((
                    key.clone(),
                    now.checked_sub(age).unwrap_or(now),
                    facts.progress.generation,
                ));
            }
        }
        for (key, started, generation) in found {
            self.budget.adopt(&key, started, generation);
        }
    }

    fn mark(&mut self, key: WorkloadKey, reason: Reason, now: Instant) {
        if self.synced {
            self.queue.mark(key, reason, now);
        }
    }

    fn mark_all(&mut self, why: &'static str) {
        if !self.synced {
            return;
        }
        let now = Instant::now();
        let mut keys: Vec<WorkloadKey> = self.index.workload_keys().cloned().collect();
        keys.sort();
        for key in keys {
            self.queue.mark(key, Reason::All(why), now);
        }
    }

    fn report_sizes(&self) {
        self.metrics.set_sizes(
            self.queue.pending(),
            self.index.workload_count(),
            self.index.object_count(),
            self.digests.len(),
        );
        self.metrics.set_budget(
            self.budget.rolling(),
            self.budget.peak(),
            self.queue.parked(),
        );
        self.metrics
            .set_holds(self.breakers.open_count(), |reason| {
                self.holds.values().filter(|h| h.reason == reason).count()
            });
    }

    /// When rollouts time out or breakers close by themselves next.
    fn next_housekeeping(&self) -> Option<Instant> {
        match (self.budget.next_expiry(), self.breakers.next_release()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn housekeeping(&mut self) {
        let now = Instant::now();
        for key in self.budget.expire(now) {
            let why = format!(
                "still rolling after --roll-timeout ({})",
                crate::humanize::humanize(self.budget.limits().timeout)
            );
            self.metrics.roll_ended("timeout");
            self.events.emit(
                "roll-stalled",
                &json!({"workload": key.to_string(), "how": "timeout"}),
                format!("{key}: {why}; it no longer counts against the roll budget"),
            );
            self.publish_on_workload(
                &key,
                EventType::Warning,
                "RolloutStalled",
                format!("{why}; it no longer counts against the roll budget"),
            );
        }
        for key in self.breakers.release(now) {
            self.breaker_closed(&key, "quiet");
            let readers: Vec<WorkloadKey> = self.index.readers(&key).to_vec();
            for w in readers {
                self.mark(
                    w,
                    Reason::Object {
                        object: key.clone(),
                        what: "quiet again",
                    },
                    now,
                );
            }
        }
    }

    /// Hands ready workloads over, deciding inline those whose digests are all known (the common
    /// case: a status write, the watcher's own restamp coming back); parked ones come back as the
    /// budget frees up.
    fn dispatch(&mut self, jobs: &mut JoinSet<Finished>, max: usize) {
        let Ok((key, generation)) = self.key.clone() else {
            return;
        };
        loop {
            let room = max.saturating_sub(jobs.len());
            if room == 0 {
                return;
            }
            let now = Instant::now();
            let budget = &self.budget;
            self.queue.unpark(budget.free(), |ns| budget.room(ns), now);
            let tickets = self.queue.take(now, room);
            if tickets.is_empty() {
                return;
            }
            for ticket in tickets {
                match self.plan(ticket, &key, generation) {
                    Planned::Done(key, outcome) => {
                        // Gone, or no longer opted in or stamped: no re-pin is owed either.
                        self.repins.remove(&key);
                        self.holds.remove(&key);
                        self.queue.done(&key, &outcome, Instant::now());
                    }
                    Planned::Held(ticket, hold) => {
                        self.hold(&ticket, hold);
                        self.queue
                            .done(&ticket.key, &Outcome::Settled, Instant::now());
                    }
                    Planned::Park(ticket) => self.queue.park(ticket),
                    Planned::Excluded(key) => {
                        self.repins.remove(&key);
                        self.excluded(&key.namespace);
                        self.holds.remove(&key);
                        self.queue.done(&key, &Outcome::Settled, Instant::now());
                    }
                    Planned::Job(job) => {
                        if matches!(job.work, Work::Restamp { .. }) {
                            self.holds.remove(&job.ticket.key);
                            self.budget.start(&job.ticket.key, now);
                        }
                        jobs.spawn(act::run(self.shared.clone(), *job));
                    }
                }
            }
        }
    }

    fn plan(&self, ticket: Ticket, key: &Arc<HashKey>, generation: u64) -> Planned {
        let Some(facts) = self.index.workload(&ticket.key) else {
            return Planned::Done(ticket.key, Outcome::Gone);
        };
        let Some(resource) = self.resources.get(&ticket.key.kind) else {
            return Planned::Done(ticket.key, Outcome::Gone);
        };
        let ns = &ticket.key.namespace;
        let decision = opt_in(facts.label.as_deref(), self.index.namespace_label(ns));
        if !decision.stamps() {
            return Planned::Done(ticket.key, Outcome::Settled);
        }
        if let Some(coverage) = &self.coverage {
            let workload: std::collections::BTreeMap<String, String> = facts
                .label
                .iter()
                .map(|l| (names::LABEL_ROLLOUT_ON_CHANGE.to_owned(), l.clone()))
                .collect();
            let empty = std::collections::BTreeMap::new();
            let labels = self.namespace_labels.get(ns).unwrap_or(&empty);
            if !coverage.sends(labels, &workload) {
                return Planned::Excluded(ticket.key);
            }
        }
        let refs = match &facts.refs {
            Ok(refs) => refs,
            Err(why) => {
                let hold = Hold {
                    reason: "unwatched",
                    note: format!("not watched: {why}"),
                    missing: Vec::new(),
                };
                return Planned::Held(ticket, hold);
            }
        };
        let objects: Vec<ObjectKey> = refs
            .iter()
            .map(|r| ObjectKey {
                namespace: ns.clone(),
                resource: r.resource.clone(),
            })
            .collect();
        // An open breaker holds every reader, before anything is read for it.
        if let Some(open) = objects.iter().find(|o| self.breakers.is_open(o)) {
            let hold = Hold {
                reason: "breaker",
                note: format!(
                    "not restamped: {open} changes too often (its flap breaker is open); released when it is quiet for {} or by `kubectl helmop rollout --resume {} -n {ns}`",
                    crate::humanize::humanize(self.breakers.limits().release),
                    open.resource
                ),
                missing: Vec::new(),
            };
            return Planned::Held(ticket, hold);
        }
        let versions: Vec<Option<&index::Version>> = objects
            .iter()
            .map(|o| self.index.object(o).map(|f| &f.version))
            .collect();
        let seen = act::versions_fingerprint(refs.iter().zip(versions.iter().copied()));
        // Restamped by a watcher from exactly these versions, and the stamp it meant to write is
        // the one stored: current, without reading anything (a restart, a new leader).
        let written = match (&facts.restamp.tries, facts.stamp.as_deref()) {
            (Some((_, tag)), Some(stamp)) => act::tries_tag(stamp) == tag,
            _ => false,
        };
        let repin = self.repins.contains_key(&ticket.key);
        if facts.indexed
            && written
            && !repin
            && facts.restamp.seen.as_deref() == Some(seen.as_str())
        {
            return Planned::Done(ticket.key, Outcome::Settled);
        }
        let lookups: Vec<Lookup> = refs
            .iter()
            .zip(&objects)
            .map(|(r, object)| match self.index.object(object) {
                None => Lookup::Absent,
                Some(o) => match self.digests.get(object, &o.version, &r.reads) {
                    Some(known) => Lookup::Known(known.clone()),
                    None => Lookup::Read,
                },
            })
            .collect();
        let copies = self.index.copies_read(&ticket.key);
        let job = |ticket: Ticket, work: Work, lookups: Vec<Lookup>| {
            Planned::Job(Box::new(Job {
                ticket,
                work,
                resource: resource.clone(),
                uid: facts.uid.clone(),
                refs: refs.clone(),
                lookups,
                stamp: facts.stamp.clone(),
                copies,
                key: key.clone(),
                key_generation: generation,
            }))
        };
        if !facts.indexed {
            return job(ticket, Work::Fetch, Vec::new());
        }
        if lookups.iter().any(|l| matches!(l, Lookup::Read)) {
            return job(ticket, Work::Read, lookups);
        }
        let known = |r: &PodRef| match refs
            .iter()
            .position(|x| x.resource == r.resource)
            .and_then(|i| lookups.get(i))
        {
            Some(Lookup::Known(k)) => helmop_core::hash::Observed::Digest(k.digest),
            _ => helmop_core::hash::Observed::Absent,
        };
        // `None`: the stamp is current (or the webhook stamps nothing here): only a re-pin is due.
        let mut due = match helmop_core::rollout::decide(
            key,
            ns,
            refs,
            facts.stamp.as_deref(),
            known,
        ) {
            helmop_core::rollout::Decision::Due { expected, .. } => Some(expected),
            helmop_core::rollout::Decision::Missing(missing) => {
                let names: Vec<String> = missing.iter().map(ToString::to_string).collect();
                let hold = Hold {
                    reason: "missing",
                    note: format!(
                        "not restamped: it requires {}, which does not exist; its pods keep running, and it rolls once it exists",
                        names.join(", ")
                    ),
                    missing: names,
                };
                return Planned::Held(ticket, hold);
            }
            helmop_core::rollout::Decision::NotStamped(_)
            | helmop_core::rollout::Decision::Current
                if repin =>
            {
                None
            }
            helmop_core::rollout::Decision::NotStamped(why) => {
                tracing::debug!(workload = %ticket.key, why, "not stamped by the webhook: left alone");
                return Planned::Done(ticket.key, Outcome::Settled);
            }
            helmop_core::rollout::Decision::Current => {
                return Planned::Done(ticket.key, Outcome::Settled);
            }
        };
        // A required key missing stops new pods as a missing object does.
        let lacking: Vec<String> = refs
            .iter()
            .zip(&lookups)
            .filter(|(r, _)| !r.optional)
            .filter_map(|(r, l)| match l {
                Lookup::Known(k) if !k.missing_keys.is_empty() => Some(format!(
                    "key {} of {}",
                    k.missing_keys.join(", "),
                    r.resource
                )),
                _ => None,
            })
            .collect();
        if due.is_some() && !lacking.is_empty() {
            let hold = Hold {
                reason: "missing",
                note: format!(
                    "not restamped: it requires {}, which does not exist; its pods keep running, and it rolls once it exists",
                    lacking.join(", ")
                ),
                missing: lacking,
            };
            return Planned::Held(ticket, hold);
        }
        if due.is_some() && self.only_the_key_changed(refs, &objects, facts.stamp.as_deref(), ns) {
            if !repin {
                return Planned::Done(ticket.key, Outcome::Settled);
            }
            due = None;
        }
        if ticket.key.kind == WorkloadKind::Rollout {
            match &facts.progress.state {
                RollState::Aborted => {
                    let hold = Hold {
                        reason: "rollout-busy",
                        note: "not restamped: the Rollout is aborted (a restamp would roll it back onto the revision it aborted); it rolls once it is healthy again".to_owned(),
                        missing: Vec::new(),
                    };
                    return Planned::Held(ticket, hold);
                }
                RollState::Progressing(why) => {
                    let hold = Hold {
                        reason: "rollout-busy",
                        note: format!(
                            "not restamped: {why} (a restamp would restart its steps); it rolls once it is healthy"
                        ),
                        missing: Vec::new(),
                    };
                    return Planned::Held(ticket, hold);
                }
                _ => {}
            }
        }
        // A re-pin alone writes the stamp the workload has; the registry poll checks it took.
        let expected = due
            .clone()
            .or_else(|| facts.stamp.clone())
            .unwrap_or_default();
        let tag = act::tries_tag(&expected);
        let tries = match &facts.restamp.tries {
            Some((n, t)) if t == tag => *n,
            _ => 0,
        };
        if due.is_some() && tries >= queue::INEFFECTIVE_TRIES {
            let hold = Hold {
                reason: "gave-up",
                note: format!(
                    "restamped {tries} times, and the webhook did not write the stamp of what the pods read: is helmop-webhook installed, reachable and stamping this workload? Waiting for the next change"
                ),
                missing: Vec::new(),
            };
            return Planned::Held(ticket, hold);
        }
        if !self.budget.room(ns) {
            return Planned::Park(ticket);
        }
        job(
            ticket,
            Work::Restamp {
                expected,
                tries: if due.is_some() {
                    tries + 1
                } else {
                    tries.max(1)
                },
                seen,
                repin,
            },
            lookups,
        )
    }

    /// Whether the stamp is current under the hash key before the last rotation, for the content
    /// of now: then only the key changed, and nothing the pods read (see docs/decisions.md).
    fn only_the_key_changed(
        &self,
        refs: &[PodRef],
        objects: &[ObjectKey],
        stamp: Option<&str>,
        ns: &str,
    ) -> bool {
        let Some((old_key, old_digests)) = &self.previous else {
            return false;
        };
        let mut digests = Vec::with_capacity(refs.len());
        for (r, object) in refs.iter().zip(objects) {
            match self.index.object(object) {
                None => digests.push(None),
                Some(o) => match old_digests.get(object, &o.version, &r.reads) {
                    Some(k) => digests.push(Some(k.digest)),
                    // Changed since the rotation (or never read before it): not provable.
                    None => return false,
                },
            }
        }
        let observed = |r: &PodRef| match refs
            .iter()
            .position(|x| x.resource == r.resource)
            .and_then(|i| digests.get(i).copied().flatten())
        {
            Some(d) => helmop_core::hash::Observed::Digest(d),
            None => helmop_core::hash::Observed::Absent,
        };
        helmop_core::rollout::decide(old_key, ns, refs, stamp, observed)
            == helmop_core::rollout::Decision::Current
    }

    /// Says once per namespace (and configuration) that its opted-in workloads are skipped.
    fn excluded(&mut self, namespace: &str) {
        if !self.excluded_told.insert(namespace.to_owned()) {
            return;
        }
        self.events.emit(
            "excluded",
            &json!({"namespace": namespace, "configuration": self.coverage_name}),
            format!(
                "not restamping the opted-in workloads of namespace {namespace}: the webhook configuration {} does not send them to the webhook (its namespace and object selectors), so nothing stamps them",
                self.coverage_name
            ),
        );
    }

    /// Announces a hold once per workload and cause (stdout, a Warning Event, the gauge).
    fn hold(&mut self, ticket: &Ticket, hold: Hold) {
        if self.holds.get(&ticket.key) == Some(&hold) {
            return;
        }
        let key = &ticket.key;
        self.events.emit(
            "held",
            &json!({
                "workload": key.to_string(),
                "reason": ticket.reason.to_string(),
                "hold": hold.reason,
                "missing": hold.missing,
                "note": hold.note,
            }),
            format!("{key} ({}): {}", ticket.reason, hold.note),
        );
        self.publish_on_workload(
            key,
            EventType::Warning,
            hold.event_reason(),
            hold.note.clone(),
        );
        self.holds.insert(key.clone(), hold);
    }

    fn publish_on_workload(
        &self,
        key: &WorkloadKey,
        type_: EventType,
        reason: &'static str,
        note: String,
    ) {
        let (Some(facts), Some(resource)) =
            (self.index.workload(key), self.resources.get(&key.kind))
        else {
            return;
        };
        let regarding = act::workload_ref(resource, key, &facts.uid);
        self.publish(regarding, type_, reason, note);
    }

    /// Publishes an Event off the loop (a slow API server never stalls it).
    fn publish(
        &self,
        regarding: k8s_openapi::api::core::v1::ObjectReference,
        type_: EventType,
        reason: &'static str,
        note: String,
    ) {
        if self.shared.dry_run {
            return;
        }
        let shared = self.shared.clone();
        let metrics = self.metrics.clone();
        tokio::spawn(async move {
            if !act::publish(&shared, &regarding, type_, reason, &note).await {
                metrics.error(ErrorKind::Event);
            }
        });
    }

    fn finish(&mut self, finished: Finished) {
        let now = Instant::now();
        let current_generation = self.key.as_ref().ok().map(|(_, g)| *g);
        // Whether every read is of the version the watch has: if the object moved on since (or the
        // read saw a version the watch has not delivered yet), that watch event decides the reader
        // again; deciding it now would only read again (a flapping source would loop).
        let mut current_reads = true;
        if current_generation == Some(finished.key_generation) {
            for read in finished.reads {
                self.metrics.read();
                current_reads &= self
                    .index
                    .object(&read.object)
                    .is_some_and(|o| o.version == read.version);
                self.digests
                    .insert(read.object, read.version, read.reads, read.known);
            }
        }
        for _ in 0..finished.read_errors {
            self.metrics.error(ErrorKind::Read);
        }
        for _ in 0..finished.event_errors {
            self.metrics.error(ErrorKind::Event);
        }
        let key = &finished.key;
        if let Some(facts) = finished.fetched {
            self.index.put_workload(key.clone(), *facts);
        }
        if finished.outcome == Outcome::Read {
            if current_reads {
                self.queue.again(key, finished.reason, finished.since, now);
            } else {
                self.queue.done(key, &Outcome::Settled, now);
            }
            return;
        }
        let d = &finished.detail;
        let fields = json!({
            "workload": key.to_string(),
            "reason": finished.reason.to_string(),
            "from": d.from,
            "expected": d.expected,
            "to": d.to,
            "error": d.error,
            "lagMs": u64::try_from(finished.lag.as_millis()).unwrap_or(u64::MAX),
        });
        match &finished.outcome {
            Outcome::Restamped => {
                if finished.repinned && self.repins.remove(key).is_some() {
                    let _ = self.repinned.send((
                        key.namespace.clone(),
                        format!(
                            "{}/{}",
                            crate::run::workload_ref::canonical(key.kind),
                            key.name
                        ),
                    ));
                }
                self.metrics
                    .restamped(finished.reason.label(), finished.lag);
                self.events.emit(
                    "restamped",
                    &fields,
                    format!("restamped {key}: {}", finished.reason),
                );
                let rolls = key.kind != WorkloadKind::CronJob;
                match self
                    .budget
                    .restamped(key, finished.generation.filter(|_| rolls))
                {
                    budget::Ended::No => {}
                    budget::Ended::Complete => self.roll_ended(key, "complete", None),
                    budget::Ended::Stalled(why) => self.roll_ended(key, "stalled", Some(why)),
                }
            }
            Outcome::Settled if d.dry_run && d.expected.is_some() => {
                self.budget.end(key);
                self.events.emit(
                    "would-restamp",
                    &fields,
                    format!("would restamp {key}: {}", finished.reason),
                );
            }
            Outcome::Ineffective(_) => {
                self.budget.end(key);
                self.metrics.ineffective();
                self.events.emit(
                    "ineffective",
                    &fields,
                    format!(
                        "restamped {key}, but the webhook did not write the expected stamp (is helmop-webhook installed and stamping it?)"
                    ),
                );
            }
            Outcome::Failed => {
                self.budget.end(key);
                if d.to.is_none() && d.expected.is_some() {
                    self.metrics.refused();
                }
                self.events.emit(
                    "failed",
                    &fields,
                    format!(
                        "cannot restamp {key} ({}): {}",
                        finished.reason,
                        d.error.as_deref().unwrap_or("unknown error")
                    ),
                );
            }
            Outcome::Settled | Outcome::Gone | Outcome::Read => self.budget.end(key),
        }
        let gave_up = self.queue.done(key, &finished.outcome, now);
        if gave_up {
            let ticket = Ticket {
                key: key.clone(),
                reason: finished.reason,
                since: finished.since,
            };
            let hold = Hold {
                reason: "gave-up",
                note: format!(
                    "restamped {} times, and the webhook did not write the stamp of what the pods read: is helmop-webhook installed, reachable and stamping this workload? Waiting for the next change",
                    queue::INEFFECTIVE_TRIES
                ),
                missing: Vec::new(),
            };
            self.hold(&ticket, hold);
        }
    }
}

/// A digest that differs between two keys and reveals nothing of either (as the webhook tells a
/// rotation).
fn fingerprint(key: &HashKey) -> helmop_core::hash::ObjectDigest {
    helmop_core::hash::object_digest(
        key,
        &helmop_core::hash::ObjectData::default(),
        &helmop_core::podrefs::Keys::All,
    )
}

/// Which of [`KINDS`] the server serves, and at which version (CronJobs are `batch/v1beta1` only
/// before Kubernetes 1.21; Argo Rollouts only where installed).
async fn served_kinds(client: &Client) -> Result<HashMap<WorkloadKind, ApiResource>, PluginError> {
    let mut out = HashMap::new();
    for kind in KINDS {
        for version in kind.versions() {
            let group_version = format!("{}/{version}", kind.group());
            match client.list_api_group_resources(&group_version).await {
                Ok(list) if list.resources.iter().any(|r| r.name == kind.plural()) => {
                    out.insert(
                        kind,
                        ApiResource {
                            group: kind.group().to_owned(),
                            version: (*version).to_owned(),
                            api_version: group_version,
                            kind: kind.kind().to_owned(),
                            plural: kind.plural().to_owned(),
                        },
                    );
                    break;
                }
                Ok(_) => {}
                Err(e) if crate::cluster::api_error::is_not_found(&e) => {}
                Err(e) => {
                    return Err(crate::cluster::api_error::upstream(
                        &format!("discovering {group_version}"),
                        &e,
                    ));
                }
            }
        }
    }
    Ok(out)
}

/// The Lease of a scope ([`leader::scoped_lease_name`]).
pub fn lease_name(namespace: Option<&str>, selector: Option<&str>) -> String {
    leader::scoped_lease_name(DEFAULT_LEASE_NAME, namespace, selector)
}

fn scope_text(namespace: Option<&str>, selector: Option<&str>) -> String {
    let mut text = match namespace {
        Some(ns) => format!("namespace {ns}"),
        None => "all namespaces".to_owned(),
    };
    if let Some(s) = selector {
        text.push_str(&format!(" matching {s}"));
    }
    text
}

fn leader_note(leading: bool) -> &'static str {
    if leading {
        "restamping"
    } else {
        "another process holds the Lease (or it could not be renewed): not restamping"
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn after(every: Duration) -> Option<Instant> {
    (!every.is_zero()).then(|| Instant::now() + every)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_scope_has_its_own_lease() {
        assert_eq!(lease_name(None, None), "kubectl-helmop-rollout");
        assert_eq!(
            lease_name(Some("apps"), None),
            "kubectl-helmop-rollout-ns-apps"
        );
        let a = lease_name(None, Some("app=web"));
        let b = lease_name(None, Some("app=api"));
        assert!(a.starts_with("kubectl-helmop-rollout-") && a != b);
        assert!(lease_name(Some(&"n".repeat(63)), Some("x")).len() <= 253);
    }
}
