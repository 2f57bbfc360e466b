//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several `propagate --watch`
//! processes (replicas of the in-cluster Deployment, or two laptops) exactly one writes.
//!
//! The protocol is client-go's: the holder renews `renewTime` every retry period; a candidate may
//! take the Lease over when its holder is empty (released) or when the record has not changed for
//! `leaseDurationSeconds` *as measured on the candidate's own clock* since it first saw that record
//! (so clock skew between machines does not matter). Every write carries the `resourceVersion` it
//! was based on, so of two candidates racing for the same record only one succeeds.
//!
//! A holder that cannot renew stops considering itself leader at `attempt start + renew deadline`,
//! which is shorter than the lease duration other candidates wait, so there is never a moment where
//! two processes both believe they lead.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Lease name of an all-namespaces `propagate --watch`; other scopes add theirs
/// ([`scoped_lease_name`]).
pub const DEFAULT_LEASE_NAME: &str = "kubectl-helmop-propagate";

/// The Lease of one watch scope: `base`, then `-ns-NAMESPACE` for a namespaced watcher and a hash
/// of `within` (one HelmOp's name, a label selector) when the scope is narrower still. Watchers of
/// different scopes never stand by for each other (a `-n` watcher left running on a laptop does
/// not stop the in-cluster `-A` one); two of one scope elect one. Always a valid object name: a
/// namespace name has at most 63 characters, the hash 12.
pub fn scoped_lease_name(base: &str, namespace: Option<&str>, within: Option<&str>) -> String {
    use sha2::{Digest, Sha256};
    let mut name = base.to_owned();
    if let Some(ns) = namespace {
        name.push_str("-ns-");
        name.push_str(ns);
    }
    if let Some(within) = within {
        let digest = Sha256::digest(within.as_bytes());
        name.push('-');
        name.push_str(&hex::encode(&digest[..6]));
    }
    name
}

/// The Lease of one shard of a scope whose Lease is `scoped`: `-shard-ID` when the shard ID is
/// fit for an object name (lower case, no `_`), else `-shard-` and a hash of the ID (an ID is a
/// label value, which may have capitals and `_`). Each shard elects its own leader, so losing one
/// shard's leader leaves the others' work alone.
pub fn shard_lease_name(scoped: &str, id: &str) -> String {
    use sha2::{Digest, Sha256};
    if helmop_core::name_rules::is_dns1123_label(id) {
        format!("{scoped}{SHARD_INFIX}{id}")
    } else {
        let digest = Sha256::digest(id.as_bytes());
        format!("{scoped}{SHARD_INFIX}{}", hex::encode(&digest[..6]))
    }
}

/// What [`shard_lease_name`] puts between a scope's Lease name and the shard.
pub const SHARD_INFIX: &str = "-shard-";

/// How long the holder's claim lasts, and the two periods derived from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseTimings {
    /// Candidates wait this long after the last change they saw before taking over.
    pub lease_duration: Duration,
    /// The holder gives up leadership when it could not renew for this long.
    pub renew_deadline: Duration,
    /// Time between two attempts to acquire or renew.
    pub retry_period: Duration,
}

/// Shortest lease duration accepted: below this, one slow request costs the leadership.
pub const MIN_LEASE_DURATION: Duration = Duration::from_secs(2);

impl LeaseTimings {
    /// The renew deadline is 2/3 of the lease duration, as in client-go's defaults (15 s / 10 s),
    /// and the retry period 1/6 of it (2.5 s at 15 s, where client-go uses 2 s), so a holder gets
    /// several attempts before it steps down and steps down well before anyone else may take over.
    pub fn from_lease_duration(lease_duration: Duration) -> Option<LeaseTimings> {
        if lease_duration < MIN_LEASE_DURATION {
            return None;
        }
        Some(LeaseTimings {
            lease_duration,
            renew_deadline: lease_duration * 2 / 3,
            retry_period: lease_duration / 6,
        })
    }
}

impl Default for LeaseTimings {
    fn default() -> Self {
        LeaseTimings {
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_millis(2500),
        }
    }
}

/// What one attempt should do, given the Lease as last read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// No Lease yet: create it with us as holder.
    Create,
    /// We hold it: bump `renewTime`.
    Renew,
    /// Released or expired: write us as holder.
    TakeOver,
    /// Someone else holds it and their claim has not run out.
    Wait,
}

/// The parts of a Lease the decision needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseView<'a> {
    pub holder: Option<&'a str>,
    pub lease_duration: Option<Duration>,
}

impl<'a> LeaseView<'a> {
    pub fn of(spec: Option<&'a LeaseSpec>) -> LeaseView<'a> {
        LeaseView {
            holder: spec
                .and_then(|s| s.holder_identity.as_deref())
                .filter(|h| !h.is_empty()),
            lease_duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs),
        }
    }
}

/// The decision of one attempt. `unchanged_since` is when this process first saw the Lease's current
/// record (see [`Observer`]); `default_duration` is used when the Lease names none.
pub fn next_step(
    identity: &str,
    lease: Option<LeaseView<'_>>,
    unchanged_since: Instant,
    now: Instant,
    default_duration: Duration,
) -> Step {
    let Some(lease) = lease else {
        return Step::Create;
    };
    match lease.holder {
        Some(holder) if holder == identity => Step::Renew,
        None => Step::TakeOver,
        Some(_) => {
            let duration = lease.lease_duration.unwrap_or(default_duration);
            if now.saturating_duration_since(unchanged_since) >= duration {
                Step::TakeOver
            } else {
                Step::Wait
            }
        }
    }
}

/// Remembers when the Lease's record (its `resourceVersion`, which every write changes) was first
/// seen, so expiry is judged on this process's monotonic clock, never on the holder's timestamps.
#[derive(Debug, Default)]
pub struct Observer {
    version: Option<String>,
    since: Option<Instant>,
}

impl Observer {
    /// Records the version just read; returns since when it has been unchanged.
    pub fn observe(&mut self, version: Option<&str>, now: Instant) -> Instant {
        match self.since {
            Some(since) if self.version.as_deref() == version => since,
            _ => {
                self.version = version.map(str::to_owned);
                self.since = Some(now);
                now
            }
        }
    }
}

/// A default identity: the host name (the pod name in a cluster) and a per-process random suffix, so
/// two processes on one machine are still two candidates.
pub fn default_identity() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_owned())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kubectl-helmop".to_owned());
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    format!("{host}_{:08x}", hasher.finish() & 0xffff_ffff)
}

/// One candidate for one Lease.
pub struct Elector {
    api: Api<Lease>,
    namespace: String,
    name: String,
    identity: String,
    timings: LeaseTimings,
    observer: Observer,
    /// Labels and annotations the holder keeps on the Lease (what it watches, for other watchers).
    labels: BTreeMap<String, String>,
    annotations: BTreeMap<String, String>,
}

impl Elector {
    pub fn new(
        client: Client,
        namespace: &str,
        name: &str,
        identity: &str,
        timings: LeaseTimings,
    ) -> Elector {
        Elector {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            timings,
            observer: Observer::default(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }

    /// Labels and annotations written on the Lease whenever this candidate creates, renews or
    /// takes it over.
    pub fn with_metadata(
        mut self,
        labels: BTreeMap<String, String>,
        annotations: BTreeMap<String, String>,
    ) -> Elector {
        self.labels = labels;
        self.annotations = annotations;
        self
    }

    fn stamp_metadata(&self, meta: &mut ObjectMeta) {
        if !self.labels.is_empty() {
            meta.labels
                .get_or_insert_with(BTreeMap::new)
                .extend(self.labels.clone());
        }
        if !self.annotations.is_empty() {
            meta.annotations
                .get_or_insert_with(BTreeMap::new)
                .extend(self.annotations.clone());
        }
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    /// `namespace/name` of the Lease.
    pub fn lease(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// One attempt: reads the Lease and creates, renews or takes it over when allowed. `Ok(true)`
    /// when we hold it afterwards. A lost race (409) is `Ok(false)`, not an error.
    pub async fn try_acquire_or_renew(&mut self) -> Result<bool, kube::Error> {
        let current = self.api.get_opt(&self.name).await?;
        let now = Instant::now();
        let since = self.observer.observe(
            current
                .as_ref()
                .and_then(|l| l.metadata.resource_version.as_deref()),
            now,
        );
        let view = current.as_ref().map(|l| LeaseView::of(l.spec.as_ref()));
        let step = next_step(
            &self.identity,
            view,
            since,
            now,
            self.timings.lease_duration,
        );
        let stamp = MicroTime(Timestamp::now());
        let duration_secs =
            i32::try_from(self.timings.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let result = match (step, current) {
            (Step::Wait, _) => return Ok(false),
            (Step::Create, _) | (_, None) => {
                let mut metadata = ObjectMeta {
                    name: Some(self.name.clone()),
                    namespace: Some(self.namespace.clone()),
                    ..ObjectMeta::default()
                };
                self.stamp_metadata(&mut metadata);
                let lease = Lease {
                    metadata,
                    spec: Some(LeaseSpec {
                        holder_identity: Some(self.identity.clone()),
                        lease_duration_seconds: Some(duration_secs),
                        acquire_time: Some(stamp.clone()),
                        renew_time: Some(stamp),
                        lease_transitions: Some(0),
                        ..LeaseSpec::default()
                    }),
                };
                self.api.create(&PostParams::default(), &lease).await
            }
            (Step::Renew, Some(mut lease)) => {
                self.stamp_metadata(&mut lease.metadata);
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                spec.renew_time = Some(stamp);
                spec.lease_duration_seconds = Some(duration_secs);
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
            (Step::TakeOver, Some(mut lease)) => {
                self.stamp_metadata(&mut lease.metadata);
                let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
                spec.holder_identity = Some(self.identity.clone());
                spec.acquire_time = Some(stamp.clone());
                spec.renew_time = Some(stamp);
                spec.lease_duration_seconds = Some(duration_secs);
                spec.lease_transitions =
                    Some(spec.lease_transitions.unwrap_or(0).saturating_add(1));
                // `replace` sends the resourceVersion we read: of two candidates only one wins.
                self.api
                    .replace(&self.name, &PostParams::default(), &lease)
                    .await
            }
        };
        match result {
            Ok(written) => {
                self.observer
                    .observe(written.metadata.resource_version.as_deref(), now);
                Ok(true)
            }
            Err(kube::Error::Api(status)) if status.is_conflict() || status.is_already_exists() => {
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// Gives the Lease up if we still hold it, so another candidate takes over at once instead of
    /// after the lease duration. Call only after this process has stopped writing.
    pub async fn release(&mut self) -> Result<(), kube::Error> {
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            return Ok(());
        };
        let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
        if spec.holder_identity.as_deref() != Some(self.identity.as_str()) {
            return Ok(());
        }
        spec.holder_identity = None;
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        // What client-go writes on release, so its candidates take over at once as well.
        spec.lease_duration_seconds = Some(1);
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(()),
            // Someone changed it meanwhile: it is not ours to release any more.
            Err(kube::Error::Api(status)) if status.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// The running election: `state()` says whether this process leads right now.
pub struct LeaderHandle {
    state: watch::Receiver<bool>,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
    identity: String,
    lease: String,
}

impl LeaderHandle {
    /// Makes a first attempt (so a missing namespace, missing permission or unreachable API server
    /// fails the start instead of retrying silently), then keeps renewing in the background.
    pub async fn start(mut elector: Elector) -> Result<LeaderHandle, kube::Error> {
        let started = Instant::now();
        let limit = elector.timings.renew_deadline;
        let leads = match tokio::time::timeout(limit, elector.try_acquire_or_renew()).await {
            Ok(result) => result?,
            Err(_) => {
                let e = std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer within {limit:?}"),
                );
                return Err(kube::Error::Service(Box::new(e)));
            }
        };
        let (state_tx, state) = watch::channel(leads);
        let (stop, stop_rx) = watch::channel(false);
        let identity = elector.identity().to_owned();
        let lease = elector.lease();
        let valid_until = started + elector.timings.renew_deadline;
        let task = tokio::spawn(run(elector, state_tx, stop_rx, leads, valid_until));
        Ok(LeaderHandle {
            state,
            stop,
            task,
            identity,
            lease,
        })
    }

    /// `true` while this process leads; changes are published as they happen.
    pub fn state(&self) -> watch::Receiver<bool> {
        self.state.clone()
    }

    pub fn identity(&self) -> &str {
        &self.identity
    }

    pub fn lease(&self) -> &str {
        &self.lease
    }

    /// Stops renewing and releases the Lease if held. Call after every write has stopped.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Publishes a change of leadership; receivers are woken only when it really changed.
fn publish(state: &watch::Sender<bool>, leads: bool) {
    state.send_if_modified(|current| {
        let changed = *current != leads;
        *current = leads;
        changed
    });
}

async fn run(
    mut elector: Elector,
    state: watch::Sender<bool>,
    mut stop: watch::Receiver<bool>,
    mut leads: bool,
    mut valid_until: Instant,
) {
    let timings = elector.timings;
    let mut next = Instant::now() + timings.retry_period;
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            // A leader must not outlive its tenure even while waiting for the next attempt.
            _ = tokio::time::sleep_until(valid_until), if leads => {}
            _ = stop.changed() => break,
        }
        let now = Instant::now();
        if leads && now >= valid_until {
            leads = false;
            tracing::warn!(lease = %elector.lease(), "could not renew the lease in time; standing by");
            publish(&state, false);
        }
        if now < next {
            continue;
        }
        next = now + timings.retry_period;
        // A leader's attempt may not run past its tenure; a candidate's not past the renew deadline.
        let limit = if leads {
            valid_until
        } else {
            now + timings.renew_deadline
        };
        match tokio::time::timeout_at(limit, elector.try_acquire_or_renew()).await {
            Ok(Ok(true)) => {
                valid_until = now + timings.renew_deadline;
                if !leads {
                    tracing::info!(lease = %elector.lease(), identity = %elector.identity(), "acquired the lease");
                }
                leads = true;
                publish(&state, true);
            }
            Ok(Ok(false)) => {
                if leads {
                    tracing::warn!(lease = %elector.lease(), "lost the lease to another holder");
                }
                leads = false;
                publish(&state, false);
            }
            Ok(Err(e)) => {
                tracing::warn!(lease = %elector.lease(), error = %e, "lease request failed");
            }
            Err(_) => {
                tracing::warn!(lease = %elector.lease(), "lease request timed out");
            }
        }
        if leads && Instant::now() >= valid_until {
            leads = false;
            publish(&state, false);
        }
    }
    // Stopped: publish that we no longer lead before giving the Lease away.
    publish(&state, false);
    if leads {
        match tokio::time::timeout(timings.renew_deadline, elector.release()).await {
            Ok(Ok(())) => tracing::info!(lease = %elector.lease(), "released the lease"),
            Ok(Err(e)) => {
                tracing::warn!(lease = %elector.lease(), error = %e, "could not release the lease")
            }
            Err(_) => tracing::warn!(lease = %elector.lease(), "releasing the lease timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_secs(15);

    fn view(holder: Option<&str>, secs: Option<u64>) -> Option<LeaseView<'_>> {
        Some(LeaseView {
            holder,
            lease_duration: secs.map(Duration::from_secs),
        })
    }

    #[test]
    fn absent_lease_is_created() {
        let t = Instant::now();
        assert_eq!(next_step("me", None, t, t, D), Step::Create);
    }

    #[test]
    fn own_lease_is_renewed_even_when_old() {
        let t = Instant::now();
        let later = t + Duration::from_secs(3600);
        assert_eq!(
            next_step("me", view(Some("me"), Some(15)), t, later, D),
            Step::Renew
        );
    }

    #[test]
    fn released_lease_is_taken_at_once() {
        let t = Instant::now();
        assert_eq!(
            next_step("me", view(None, Some(1)), t, t, D),
            Step::TakeOver
        );
    }

    #[test]
    fn foreign_lease_waits_for_its_own_duration_on_our_clock() {
        let t = Instant::now();
        let v = view(Some("other"), Some(5));
        assert_eq!(next_step("me", v, t, t, D), Step::Wait);
        assert_eq!(
            next_step("me", v, t, t + Duration::from_millis(4999), D),
            Step::Wait
        );
        assert_eq!(
            next_step("me", v, t, t + Duration::from_secs(5), D),
            Step::TakeOver
        );
    }

    #[test]
    fn foreign_lease_without_duration_uses_ours() {
        let t = Instant::now();
        let v = view(Some("other"), None);
        assert_eq!(
            next_step("me", v, t, t + Duration::from_secs(14), D),
            Step::Wait
        );
        assert_eq!(next_step("me", v, t, t + D, D), Step::TakeOver);
    }

    #[test]
    fn empty_holder_counts_as_released() {
        let spec = LeaseSpec {
            holder_identity: Some(String::new()),
            lease_duration_seconds: Some(-3),
            ..LeaseSpec::default()
        };
        let v = LeaseView::of(Some(&spec));
        assert_eq!(v.holder, None);
        assert_eq!(v.lease_duration, None, "a negative duration is ignored");
    }

    #[test]
    fn observer_restarts_the_clock_only_when_the_record_changes() {
        let t0 = Instant::now();
        let mut o = Observer::default();
        assert_eq!(o.observe(Some("1"), t0), t0);
        let t1 = t0 + Duration::from_secs(3);
        assert_eq!(
            o.observe(Some("1"), t1),
            t0,
            "same record: clock keeps running"
        );
        assert_eq!(o.observe(Some("2"), t1), t1, "renewed: clock restarts");
        let t2 = t1 + Duration::from_secs(1);
        assert_eq!(o.observe(None, t2), t2);
        assert_eq!(o.observe(None, t2 + D), t2);
    }

    #[test]
    fn a_holder_steps_down_before_anyone_may_take_over() {
        for secs in [2, 3, 5, 15, 60, 137] {
            let t = LeaseTimings::from_lease_duration(Duration::from_secs(secs)).unwrap();
            assert!(t.renew_deadline < t.lease_duration, "{t:?}");
            assert!(t.retry_period < t.renew_deadline, "{t:?}");
            // At least two renewals fit into the deadline, so one failed request is not fatal.
            assert!(t.retry_period * 2 < t.renew_deadline, "{t:?}");
        }
        assert_eq!(
            LeaseTimings::from_lease_duration(Duration::from_millis(1999)),
            None
        );
        let d = LeaseTimings::default();
        assert!(d.renew_deadline < d.lease_duration && d.retry_period * 2 < d.renew_deadline);
    }

    #[test]
    fn identities_differ_between_candidates() {
        let a = default_identity();
        let b = default_identity();
        assert_ne!(a, b);
        assert!(!a.is_empty() && a.contains('_'));
    }

    #[test]
    fn each_scope_has_its_own_lease() {
        assert_eq!(
            scoped_lease_name(DEFAULT_LEASE_NAME, None, None),
            "kubectl-helmop-propagate"
        );
        assert_eq!(
            scoped_lease_name(DEFAULT_LEASE_NAME, Some("team"), None),
            "kubectl-helmop-propagate-ns-team"
        );
        let a = scoped_lease_name(DEFAULT_LEASE_NAME, Some("team"), Some("app"));
        let b = scoped_lease_name(DEFAULT_LEASE_NAME, Some("team"), Some("api"));
        assert!(a.starts_with("kubectl-helmop-propagate-ns-team-") && a != b);
        assert!(
            scoped_lease_name(DEFAULT_LEASE_NAME, Some(&"n".repeat(63)), Some("x")).len() <= 253
        );
    }

    #[test]
    fn each_shard_has_its_own_lease() {
        let base = scoped_lease_name(DEFAULT_LEASE_NAME, None, None);
        assert_eq!(
            shard_lease_name(&base, "shard0"),
            "kubectl-helmop-propagate-shard-shard0"
        );
        // Label values that are no object names are hashed, and stay apart.
        let upper = shard_lease_name(&base, "Shard_0");
        let lower = shard_lease_name(&base, "shard_0");
        assert!(upper.starts_with("kubectl-helmop-propagate-shard-") && upper != lower);
        for name in [&upper, &lower] {
            assert!(
                helmop_core::name_rules::is_dns1123_subdomain(name),
                "{name}"
            );
        }
        let longest = shard_lease_name(
            &scoped_lease_name(DEFAULT_LEASE_NAME, Some(&"n".repeat(63)), Some("x")),
            &"s".repeat(63),
        );
        assert!(
            helmop_core::name_rules::is_dns1123_subdomain(&longest),
            "{longest}"
        );
    }
}
