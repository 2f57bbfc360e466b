//! `rollout --watch`: pods roll whoever changed what they read.
//!
//! Watches opted-in workloads and the Secrets and ConfigMaps they read (metadata only: see
//! [`watches`]), keeps an index from every object to its readers ([`index`]), and when a change
//! may have moved what a workload's pods would read, decides with the webhook's own rule
//! ([`helmop_core::rollout::decide`]) whether an UPDATE now would change its stamp. If so it asks
//! the webhook to restamp it ([`act`]), coalescing bursts and backing off on refusals
//! ([`queue`]). The webhook stays the only author of stamps.
//!
//! State, not memory: nothing is decided before every watch listed once, and then every workload
//! is decided, so a watcher killed between a decision and its restamp repairs on its next start.
//! With leader election (the default) only the holder of the scope's Lease restamps; a standby
//! keeps its index current and decides everything again when it takes over.

pub mod act;
pub mod index;
pub mod metrics;
pub mod queue;
pub mod watches;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use clap::Args;
use helmop_core::hash::HashKey;
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

use self::act::{DigestCache, Finished, Job, Lookup, Regarding, Shared};
use self::index::{Index, Reason, WorkloadKey};
use self::metrics::{ErrorKind, Metrics};
use self::queue::{Outcome, Queue, Ticket};
use self::watches::{Change, Scope, Step};
use crate::args::{ReportFormat, parse_duration};
use crate::cluster::context::Ctx;
use crate::error::{ExitStatus, PluginError};
use crate::watch::Signals;
use crate::watch::events::Events;
use crate::watch::health::{self, Health};
use crate::watch::leader::{self, LeaderHandle};
use crate::watch::service::{Joined, ServiceArgs};
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

/// The `--watch` flags of `rollout`.
#[derive(Clone, Debug, Args)]
pub struct RolloutWatchArgs {
    /// Keep running: restamp every opted-in workload whose stamp no longer matches what its pods
    /// read, whoever changed it (kubectl, an operator, Fleet's agent), until SIGINT/SIGTERM. Prints
    /// one event per line (-o json: JSON Lines)
    #[arg(long)]
    pub watch: bool,

    /// With --watch: watch the workloads of every namespace
    #[arg(short = 'A', long, requires = "watch")]
    pub all_namespaces: bool,

    /// With --watch: only workloads matching this label selector (e.g. app=web,tier!=cache)
    #[arg(short = 'l', long, value_name = "SELECTOR", requires = "watch")]
    pub selector: Option<String>,

    /// With --watch: restamps (and the reads they need) in flight at once
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=256), requires = "watch")]
    pub max_concurrent: u16,

    /// With --watch: after a restamp, further changes to the same workload wait this long and are
    /// restamped together, once (a burst of edits rolls it at most twice)
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "1s", requires = "watch")]
    pub debounce: Duration,

    /// With --watch: decide every workload again this often without changes; 0 disables it
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "10m", requires = "watch")]
    pub resync: Duration,

    /// With --watch: the cluster's hash key Secret, NAMESPACE/NAME (the webhook's
    /// --hash-key-secret): the stamp is recomputed with it to decide, never written
    #[arg(
        long,
        value_name = "NAMESPACE/NAME",
        default_value = "helmop-system/helmop-hash-key",
        requires = "watch"
    )]
    pub hash_key_secret: String,

    #[command(flatten)]
    pub service: ServiceArgs,

    /// With --watch: also poll the registry for the mutable image tags of opted-in workloads and
    /// restamp those whose tag moved, as `images --watch` does, under the same leader election (a
    /// standby polls nothing): one process covers everything that changes what pods run
    #[arg(long, requires = "watch")]
    pub images: bool,

    /// With --images: time between registry polls (each +-10%); a moved tag is restamped once
    /// its new digest stayed the same for one interval
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "30s", requires = "images")]
    pub image_interval: Duration,

    /// With --images: registry configuration (insecure registries, mirrors): the webhook's
    /// --registry-config file
    #[arg(long, value_name = "FILE", requires = "images")]
    pub registry_config: Option<std::path::PathBuf>,

    /// With --images: extra image tags treated as mutable besides `latest` and no tag (comma
    /// separated or repeated; `*` and `?` globs): the webhook's --mutable-tags
    #[arg(
        long,
        value_name = "PATTERN",
        value_delimiter = ',',
        requires = "images"
    )]
    pub mutable_tags: Vec<String>,
}

/// How long one registry lookup of `--images` may take.
const REGISTRY_TIMEOUT: Duration = Duration::from_secs(10);

/// What the loop holds besides the index.
struct Loop {
    index: Index,
    queue: Queue,
    digests: DigestCache,
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

    let Some(Joined {
        election,
        mut leading,
        keep: _keep,
    }) = args
        .service
        .join(
            &client,
            || lease_name(namespace.as_deref(), args.selector.as_deref()),
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
    let shared = Arc::new(Shared {
        client: client.clone(),
        dry_run,
        reporter: Reporter {
            controller: act::CONTROLLER.to_owned(),
            instance: Some(identity),
        },
    });
    let scope = Scope {
        namespace,
        selector: args.selector.clone(),
        kinds: resources.iter().map(|(k, r)| (*k, r.clone())).collect(),
        hash_key,
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
    let (stop_images, images_stopped) = tokio::sync::oneshot::channel::<&'static str>();
    let images_leading = leading.clone();
    let images = async move {
        match image_setup {
            Some(setup) => {
                let stopped = async { images_stopped.await.unwrap_or("the watcher stopped") };
                crate::images::watch::run_loop(
                    &image_options,
                    &setup,
                    &image_events,
                    images_leading,
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
        queue: Queue::new(args.debounce),
        digests: DigestCache::default(),
        key: Err("the hash key is not read yet".to_owned()),
        key_generation: 0,
        sources: resources.len() + 4,
        resources,
        synced: false,
        listed: HashSet::new(),
        relisting: HashMap::new(),
        metrics: metrics.clone(),
        events,
    };
    let mut heartbeat = tokio::time::interval(health::HEARTBEAT);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut jobs: JoinSet<Finished> = JoinSet::new();
    let mut next_resync = after(args.resync);
    let max = usize::from(args.max_concurrent);
    let mut election_alive = election.is_some();

    let signal = loop {
        let is_leading = *leading.borrow();
        let acting = is_leading && state.synced && state.key.is_ok();
        if acting {
            state.dispatch(&shared, &mut jobs, max);
        }
        let next = if acting && jobs.len() < max {
            state.queue.next_at()
        } else {
            None
        };
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
                Ok(finished) => state.finish(&shared, finished),
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
                    state.mark_all("leader");
                } else {
                    // Restamps in flight finish (each is harmless alone); nothing new starts.
                }
            }
            _ = sleep_until(next_resync) => {
                state.mark_all("resync");
                next_resync = after(args.resync);
            }
            _ = sleep_until(next) => {}
            _ = &mut images, if images_running => images_running = false,
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

impl Loop {
    fn apply(&mut self, change: Change) {
        let now = Instant::now();
        match change {
            Change::Workload(kind, step) => {
                let source = Source::Workloads(kind);
                match step {
                    Step::Put((key, facts)) | Step::Listed((key, facts)) => {
                        self.seen(source, key.name.clone() + "\0" + &key.namespace);
                        for w in self.index.put_workload(key, facts) {
                            self.mark(w, Reason::Workload, now);
                        }
                    }
                    Step::Delete(key) => {
                        self.index.delete_workload(&key);
                        self.queue.forget(&key);
                    }
                    Step::Relist => self.relist(source),
                    Step::Done => {
                        if let Some(seen) = self.relisting.remove(&source) {
                            for key in self.index.workloads_of(kind) {
                                if !seen.contains(&(key.name.clone() + "\0" + &key.namespace)) {
                                    self.index.delete_workload(&key);
                                    self.queue.forget(&key);
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
                        for (w, reason) in self.index.put_object(key, facts) {
                            self.mark(w, reason, now);
                        }
                    }
                    Step::Delete(key) => {
                        self.digests.remove(&key);
                        for (w, reason) in self.index.delete_object(&key) {
                            self.mark(w, reason, now);
                        }
                    }
                    Step::Relist => self.relist(source),
                    Step::Done => {
                        if let Some(seen) = self.relisting.remove(&source) {
                            for key in self.index.objects_of(kind) {
                                let id = key.resource.name.clone() + "\0" + &key.namespace;
                                if !seen.contains(&id) {
                                    self.digests.remove(&key);
                                    for (w, reason) in self.index.delete_object(&key) {
                                        self.mark(w, reason, now);
                                    }
                                }
                            }
                        }
                        self.listed(source);
                    }
                }
            }
            Change::Namespace(step) => match step {
                Step::Put((name, label)) | Step::Listed((name, label)) => {
                    self.seen(Source::Namespaces, name.clone());
                    for w in self.index.put_namespace(name, label) {
                        self.mark(w, Reason::Namespace, now);
                    }
                }
                Step::Delete(name) => self.index.delete_namespace(&name),
                Step::Relist => self.relist(Source::Namespaces),
                Step::Done => {
                    if let Some(seen) = self.relisting.remove(&Source::Namespaces) {
                        for name in self.index.namespace_names() {
                            if !seen.contains(&name) {
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
                self.digests.clear();
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
            Change::WatchFailed { what, error } => {
                self.metrics.error(ErrorKind::Watch);
                self.events.emit(
                    "watch-failed",
                    &json!({"watch": what, "error": error}),
                    format!("the watch of {what} failed (retrying): {error}"),
                );
            }
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
        self.mark_all("start");
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
    }

    /// Hands ready workloads over, deciding inline those whose digests are all known and that are
    /// current (the common case: a status write, the watcher's own restamp coming back).
    fn dispatch(&mut self, shared: &Arc<Shared>, jobs: &mut JoinSet<Finished>, max: usize) {
        let Ok((key, generation)) = self.key.clone() else {
            return;
        };
        loop {
            let room = max.saturating_sub(jobs.len());
            if room == 0 {
                return;
            }
            let tickets = self.queue.take(Instant::now(), room);
            if tickets.is_empty() {
                return;
            }
            for ticket in tickets {
                match self.plan(ticket, &key, generation) {
                    Planned::Done(key, outcome) => {
                        self.queue.done(&key, &outcome, Instant::now());
                    }
                    Planned::Job(job) => {
                        let shared = shared.clone();
                        jobs.spawn(act::run(shared, *job));
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
        let refs = match &facts.refs {
            Ok(refs) if decision.stamps() => refs,
            _ => return Planned::Done(ticket.key, Outcome::Settled),
        };
        let lookups: Vec<Lookup> = refs
            .iter()
            .map(|r| {
                let object = index::ObjectKey {
                    namespace: ns.clone(),
                    resource: r.resource.clone(),
                };
                match self.index.object(&object) {
                    None => Lookup::Absent,
                    Some(o) => match self.digests.get(&object, &o.version, &r.reads) {
                        Some(d) => Lookup::Digest(d),
                        None => Lookup::Read,
                    },
                }
            })
            .collect();
        let all_known = lookups.iter().all(|l| !matches!(l, Lookup::Read));
        if all_known {
            let digests: HashMap<&helmop_core::resource::ResourceRef, &Lookup> = refs
                .iter()
                .map(|r| &r.resource)
                .zip(lookups.iter())
                .collect();
            let decision =
                helmop_core::rollout::decide(key, ns, refs, facts.stamp.as_deref(), |r| {
                    match digests.get(&r.resource) {
                        Some(Lookup::Digest(d)) => helmop_core::hash::Observed::Digest(*d),
                        _ => helmop_core::hash::Observed::Absent,
                    }
                });
            match decision {
                helmop_core::rollout::Decision::Due { .. } => {}
                helmop_core::rollout::Decision::Missing(missing) => {
                    waiting(&self.events, &ticket.key, &ticket.reason, &missing);
                    return Planned::Done(ticket.key, Outcome::Settled);
                }
                _ => return Planned::Done(ticket.key, Outcome::Settled),
            }
        }
        let copies = self.index.copies_read(&ticket.key);
        Planned::Job(Box::new(Job {
            resource: resource.clone(),
            uid: facts.uid.clone(),
            refs: refs.clone(),
            lookups,
            stamp: facts.stamp.clone(),
            copies,
            key: key.clone(),
            key_generation: generation,
            ticket,
        }))
    }

    fn finish(&mut self, shared: &Arc<Shared>, finished: Finished) {
        let now = Instant::now();
        let current_generation = self.key.as_ref().ok().map(|(_, g)| *g);
        if current_generation == Some(finished.key_generation) {
            for read in finished.reads {
                self.metrics.read();
                self.digests
                    .insert(read.object, read.version, read.reads, read.digest);
            }
        }
        for _ in 0..finished.read_errors {
            self.metrics.error(ErrorKind::Read);
        }
        for _ in 0..finished.event_errors {
            self.metrics.error(ErrorKind::Event);
        }
        let key = &finished.key;
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
        match finished.outcome {
            Outcome::Restamped => {
                self.metrics
                    .restamped(finished.reason.label(), finished.lag);
                self.events.emit(
                    "restamped",
                    &fields,
                    format!("restamped {key}: {}", finished.reason),
                );
            }
            Outcome::Settled if d.dry_run && d.expected.is_some() => {
                self.events.emit(
                    "would-restamp",
                    &fields,
                    format!("would restamp {key}: {}", finished.reason),
                );
            }
            Outcome::Ineffective => {
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
            Outcome::Settled if !d.missing.is_empty() => {
                waiting(&self.events, key, &finished.reason, &d.missing);
            }
            Outcome::Settled | Outcome::Gone => {}
        }
        let gave_up = self.queue.done(key, &finished.outcome, now);
        if gave_up && let Some(facts) = self.index.workload(key) {
            let Some(resource) = self.resources.get(&key.kind).cloned() else {
                return;
            };
            let shared = shared.clone();
            let metrics = self.metrics.clone();
            let key = key.clone();
            let uid = facts.uid.clone();
            let note = format!(
                "restamped {} times, and the webhook did not write the stamp of what the pods read: is helmop-webhook installed, reachable and stamping this workload? Waiting for the next change",
                queue::INEFFECTIVE_TRIES
            );
            tokio::spawn(async move {
                let about = Regarding {
                    resource: &resource,
                    key: &key,
                    uid: &uid,
                };
                let published = act::publish(
                    &shared,
                    &about,
                    EventType::Warning,
                    "RestampIneffective",
                    &note,
                )
                .await;
                if !published {
                    metrics.error(ErrorKind::Event);
                }
            });
        }
    }
}

/// A workload not restamped because what it requires is missing (its new pods could not start).
fn waiting(
    events: &Events,
    key: &WorkloadKey,
    reason: &Reason,
    missing: &[helmop_core::resource::ResourceRef],
) {
    let names: Vec<String> = missing.iter().map(ToString::to_string).collect();
    events.emit(
        "waiting",
        &json!({"workload": key.to_string(), "reason": reason.to_string(), "missing": names}),
        format!(
            "not restamping {key} ({reason}): it requires {}, which does not exist; its pods keep running, and it rolls once it exists again",
            names.join(", ")
        ),
    );
}

enum Planned {
    Done(WorkloadKey, Outcome),
    Job(Box<Job>),
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
