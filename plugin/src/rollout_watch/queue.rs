//! When each workload is decided again: changes wait for a quiet period, namespaces take turns,
//! rolls keep a minimum interval, failures back off, and nothing is decided twice at once.
//!
//! - **Quiet period.** A change of something a workload reads makes it ready once nothing it reads
//!   changed for [`Pacing::quiet`], and at the latest [`Pacing::max_wait`] after the first change of
//!   the burst: a burst of edits ends in one restamp with the final content. Other reasons (its own
//!   template, its namespace's label, start-up, a resync) are ready at once.
//! - **Minimum interval.** After a restamp, the same workload is not restamped again for
//!   [`Pacing::min_interval`]; what arrives meanwhile is handled together, once, after it.
//! - **Turns.** Ready workloads wait in one line per namespace, and the lines are served round
//!   robin: a namespace with 300 ready workloads delays another's by one turn, not 300.
//! - **Parked.** A workload whose restamp is due while the roll budget has no room for it (see
//!   [`super::budget`]) is parked in its namespace's line of parked workloads; [`Queue::unpark`]
//!   hands them back, round robin over namespaces, as the budget frees up.
//! - **Back-off.** A refused restamp is retried after 1 s, 2 s, 4 s ... up to [`MAX_BACKOFF`], each
//!   with up to 20% jitter, so a thousand refusals at once do not come back at once; a restamp the
//!   webhook did not act on is retried [`INEFFECTIVE_TRIES`] times (counted on the workload itself,
//!   see [`super::act`]), then left until what it would stamp changes.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::index::{Reason, WorkloadKey};
use crate::watch::debounce::backoff;

/// Longest wait before a refused restamp is tried again.
pub const MAX_BACKOFF: Duration = Duration::from_secs(300);
/// Longest wait before a restamp the webhook did not act on is tried again.
pub const MAX_INEFFECTIVE_BACKOFF: Duration = Duration::from_secs(30);
/// How many restamps in a row may leave the stamp unchanged before the watcher waits for a change.
pub const INEFFECTIVE_TRIES: u32 = 3;

/// The pacing flags (`--debounce`, `--max-wait`, `--min-roll-interval`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pacing {
    pub quiet: Duration,
    pub max_wait: Duration,
    pub min_interval: Duration,
}

/// How deciding a workload ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to do (current, not opted in, not stamped by the webhook, held, or a dry run).
    Settled,
    /// Digests were read: decide again at once with them (no turn is lost).
    Read,
    /// Restamped, and the webhook wrote a new stamp (the expected one, or a newer one).
    Restamped,
    /// Restamped, but the webhook left the stamp as it was (or wrote none): the `n`th such restamp
    /// in a row for the same expected stamp.
    Ineffective(u32),
    /// The restamp (or a read it needed) failed.
    Failed,
    /// The workload is gone.
    Gone,
}

#[derive(Debug)]
struct Slot {
    /// Why it must be decided, when it must.
    due: Option<Reason>,
    /// When the first of those marks arrived (the lag metric starts there).
    since: Instant,
    /// Not ready before: the quiet period of its last change, capped at `since + max_wait`.
    quiet_until: Instant,
    /// Not ready before either: the minimum interval after a restamp, or a back-off.
    not_before: Instant,
    in_flight: bool,
    /// Scheduled in a line or on the timer (so it is never there twice).
    queued: bool,
    /// Waiting for room in the roll budget.
    parked: bool,
    failures: u32,
}

impl Slot {
    fn ready_at(&self) -> Instant {
        self.quiet_until.max(self.not_before)
    }
}

/// Lines of workloads, one per namespace, served round robin.
#[derive(Default)]
struct Lines {
    lines: HashMap<String, VecDeque<WorkloadKey>>,
    /// Namespaces with a non-empty line, in the order they are served.
    turns: VecDeque<String>,
}

impl Lines {
    fn push(&mut self, key: WorkloadKey) {
        let line = self.lines.entry(key.namespace.clone()).or_default();
        if line.is_empty() {
            self.turns.push_back(key.namespace.clone());
        }
        line.push_back(key);
    }

    /// The next namespace's first workload whose namespace `may` serve; that namespace goes to the
    /// end of the turns. Looks at each namespace at most once.
    fn pop(&mut self, mut may: impl FnMut(&str) -> bool) -> Option<WorkloadKey> {
        for _ in 0..self.turns.len() {
            let ns = self.turns.pop_front()?;
            if !may(&ns) {
                self.turns.push_back(ns);
                continue;
            }
            let Some(line) = self.lines.get_mut(&ns) else {
                continue;
            };
            let key = line.pop_front();
            if line.is_empty() {
                self.lines.remove(&ns);
            } else {
                self.turns.push_back(ns);
            }
            if key.is_some() {
                return key;
            }
        }
        None
    }

    fn is_empty(&self) -> bool {
        self.turns.is_empty()
    }

    fn len(&self) -> usize {
        self.lines.values().map(VecDeque::len).sum()
    }

    fn shrink(&mut self) {
        if self.lines.is_empty() && self.lines.capacity() > 64 {
            self.lines.shrink_to_fit();
            self.turns.shrink_to_fit();
        }
    }
}

/// The schedule.
pub struct Queue {
    pacing: Pacing,
    slots: HashMap<WorkloadKey, Slot>,
    ready: Lines,
    parked: Lines,
    later: BinaryHeap<Reverse<(Instant, u64, WorkloadKey)>>,
    seq: u64,
}

/// A workload to decide now.
#[derive(Debug)]
pub struct Ticket {
    pub key: WorkloadKey,
    pub reason: Reason,
    pub since: Instant,
}

impl Queue {
    pub fn new(pacing: Pacing) -> Queue {
        Queue {
            pacing,
            slots: HashMap::new(),
            ready: Lines::default(),
            parked: Lines::default(),
            later: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// `key` must be decided again. The first reason of a burst is kept (it is what is reported).
    pub fn mark(&mut self, key: WorkloadKey, reason: Reason, now: Instant) {
        let slot = self.slots.entry(key.clone()).or_insert_with(|| Slot {
            due: None,
            since: now,
            quiet_until: now,
            not_before: now,
            in_flight: false,
            queued: false,
            parked: false,
            failures: 0,
        });
        let change = matches!(reason, Reason::Object { .. });
        if slot.due.is_none() {
            slot.due = Some(reason);
            slot.since = now;
        }
        if change {
            // The quiet period restarts with every change, up to the burst's maximum wait.
            slot.quiet_until = (now + self.pacing.quiet).min(slot.since + self.pacing.max_wait);
        }
        if !slot.in_flight && !slot.queued && !slot.parked {
            let at = slot.ready_at();
            self.schedule(key, at, now);
        }
    }

    fn schedule(&mut self, key: WorkloadKey, at: Instant, now: Instant) {
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        slot.queued = true;
        if at <= now {
            self.ready.push(key);
        } else {
            self.seq += 1;
            self.later.push(Reverse((at, self.seq, key)));
        }
    }

    /// Up to `limit` workloads to decide now, one namespace after the other, each marked in flight.
    pub fn take(&mut self, now: Instant, limit: usize) -> Vec<Ticket> {
        while let Some(Reverse((at, _, _))) = self.later.peek() {
            if *at > now {
                break;
            }
            if let Some(Reverse((_, _, key))) = self.later.pop() {
                self.ready.push(key);
            }
        }
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(key) = self.ready.pop(|_| true) else {
                break;
            };
            let Some(slot) = self.slots.get_mut(&key) else {
                continue;
            };
            // A change since it was scheduled moved its quiet period: wait for that.
            let at = slot.ready_at();
            if at > now {
                self.seq += 1;
                self.later.push(Reverse((at, self.seq, key)));
                continue;
            }
            slot.queued = false;
            let Some(reason) = slot.due.take() else {
                continue;
            };
            slot.in_flight = true;
            out.push(Ticket {
                key,
                reason,
                since: slot.since,
            });
        }
        out
    }

    /// When the next scheduled workload becomes ready (`None`: nothing waits on a timer).
    pub fn next_at(&self) -> Option<Instant> {
        if !self.ready.is_empty() {
            return Some(Instant::now());
        }
        self.later.peek().map(|Reverse((at, _, _))| *at)
    }

    /// `ticket`'s restamp is due but the roll budget has no room: it waits in its namespace's line
    /// of parked workloads, keeping its reason and age. Changes meanwhile only update its reason.
    pub fn park(&mut self, ticket: Ticket) {
        let Some(slot) = self.slots.get_mut(&ticket.key) else {
            return;
        };
        slot.in_flight = false;
        slot.parked = true;
        if slot.due.is_none() {
            slot.due = Some(ticket.reason);
            slot.since = ticket.since;
        }
        self.parked.push(ticket.key);
    }

    /// Hands up to `n` parked workloads back to be decided, round robin over the namespaces that
    /// `room` says have room. Each is decided again then, with the content current then.
    pub fn unpark(&mut self, mut n: usize, mut room: impl FnMut(&str) -> bool, now: Instant) {
        while n > 0 {
            let Some(key) = self.parked.pop(&mut room) else {
                return;
            };
            let Some(slot) = self.slots.get_mut(&key) else {
                continue;
            };
            slot.parked = false;
            if slot.due.is_none() {
                slot.due = Some(Reason::All("budget"));
            }
            self.schedule(key, now, now);
            n -= 1;
        }
    }

    /// The digests `ticket` needed were read: decide it again with the same reason and age.
    pub fn again(&mut self, key: &WorkloadKey, reason: Reason, since: Instant, now: Instant) {
        if let Some(slot) = self.slots.get_mut(key)
            && slot.due.is_none()
        {
            slot.due = Some(reason);
            slot.since = since;
        }
        self.done(key, &Outcome::Read, now);
    }

    /// Workloads waiting for room in the roll budget.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    /// Deciding `key` ended with `outcome`. True when that was the last restamp the webhook did
    /// not act on that the watcher tries before waiting for a change (worth a Warning Event).
    pub fn done(&mut self, key: &WorkloadKey, outcome: &Outcome, now: Instant) -> bool {
        if *outcome == Outcome::Gone {
            self.slots.remove(key);
            return false;
        }
        let Some(slot) = self.slots.get_mut(key) else {
            return false;
        };
        slot.in_flight = false;
        let mut gave_up = false;
        let retry = match outcome {
            Outcome::Settled | Outcome::Gone => {
                slot.failures = 0;
                None
            }
            Outcome::Read => {
                // Decided again with what was read (see `again`), as soon as its turn comes.
                slot.failures = 0;
                if slot.due.is_none() {
                    slot.due = Some(Reason::All("read"));
                }
                None
            }
            Outcome::Restamped => {
                slot.failures = 0;
                slot.not_before = now + self.pacing.min_interval;
                None
            }
            Outcome::Failed => {
                slot.failures += 1;
                Some(jitter(
                    backoff(slot.failures, MAX_BACKOFF),
                    key,
                    slot.failures,
                ))
            }
            Outcome::Ineffective(tries) => {
                gave_up = *tries >= INEFFECTIVE_TRIES;
                (!gave_up).then(|| jitter(backoff(*tries, MAX_INEFFECTIVE_BACKOFF), key, *tries))
            }
        };
        if let Some(wait) = retry {
            slot.not_before = now + wait;
            if slot.due.is_none() {
                slot.due = Some(Reason::All("retry"));
                slot.since = now;
            }
        }
        if slot.due.is_some() {
            let at = slot.ready_at().max(now);
            self.schedule(key.clone(), at, now);
        } else if slot.failures == 0 && slot.ready_at() <= now {
            // Nothing left to remember.
            self.slots.remove(key);
            self.shrink();
        }
        gave_up
    }

    /// Gives back the room a burst took (start-up marks every workload) once it has settled: a map
    /// never shrinks by itself.
    fn shrink(&mut self) {
        if self.slots.capacity() > 64 && self.slots.len() * 4 < self.slots.capacity() {
            self.slots.shrink_to_fit();
        }
        self.ready.shrink();
        self.parked.shrink();
    }

    /// Workloads marked, waiting, parked or in flight.
    pub fn pending(&self) -> usize {
        self.slots
            .values()
            .filter(|s| s.due.is_some() || s.in_flight || s.parked)
            .count()
    }

    /// Forgets a workload that is gone (a decision in flight for it still ends with `done`; a
    /// parked one leaves its line when its turn comes).
    pub fn forget(&mut self, key: &WorkloadKey) {
        if let Some(slot) = self.slots.get_mut(key) {
            slot.due = None;
            if !slot.in_flight {
                self.slots.remove(key);
            }
        }
    }
}

/// `wait` plus up to 20% more, spread by the workload and the attempt (no clock, no RNG: the same
/// workload retries on the same schedule, different workloads on different ones).
fn jitter(wait: Duration, key: &WorkloadKey, attempt: u32) -> Duration {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    key.hash(&mut h);
    attempt.hash(&mut h);
    let permille = h.finish() % 201;
    wait + wait.mul_f64(permille as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use helmop_core::workload::WorkloadKind;

    use super::*;
    use crate::rollout_watch::index::ObjectKey;

    fn key_in(ns: &str, name: &str) -> WorkloadKey {
        WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn key(name: &str) -> WorkloadKey {
        key_in("apps", name)
    }

    fn changed() -> Reason {
        Reason::Object {
            object: ObjectKey {
                namespace: "apps".into(),
                resource: helmop_core::resource::ResourceRef::secret("db"),
            },
            what: "changed",
        }
    }

    fn pacing(quiet: u64, max_wait: u64, min_interval: u64) -> Pacing {
        Pacing {
            quiet: Duration::from_millis(quiet),
            max_wait: Duration::from_millis(max_wait),
            min_interval: Duration::from_millis(min_interval),
        }
    }

    fn names(tickets: &[Ticket]) -> Vec<String> {
        tickets
            .iter()
            .map(|t| format!("{}/{}", t.key.namespace, t.key.name))
            .collect()
    }

    #[test]
    fn a_burst_waits_for_quiet_up_to_the_maximum_wait() {
        let mut q = Queue::new(pacing(250, 2000, 0));
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        q.mark(key("web"), changed(), t0);
        assert!(q.take(t0, 10).is_empty(), "not before the quiet period");
        // A change every 200 ms: never quiet, so the maximum wait decides.
        let mut now = t0;
        for _ in 0..9 {
            now += ms(200);
            assert!(
                q.take(now, 10).is_empty(),
                "still changing at {:?}",
                now - t0
            );
            q.mark(key("web"), changed(), now);
        }
        assert!(q.take(t0 + ms(1999), 10).is_empty());
        assert_eq!(names(&q.take(t0 + ms(2000), 10)), vec!["apps/web"]);
        q.done(&key("web"), &Outcome::Restamped, t0 + ms(2000));
        // A single change after that is ready once quiet.
        let later = t0 + ms(5000);
        q.mark(key("web"), changed(), later);
        assert!(q.take(later + ms(249), 10).is_empty());
        assert_eq!(q.take(later + ms(250), 10).len(), 1);
    }

    #[test]
    fn restamps_of_one_workload_keep_the_minimum_interval() {
        let mut q = Queue::new(pacing(0, 0, 30_000));
        let t0 = Instant::now();
        q.mark(key("web"), changed(), t0);
        assert_eq!(q.take(t0, 10).len(), 1);
        for _ in 0..10 {
            q.mark(key("web"), changed(), t0);
        }
        assert!(q.take(t0, 10).is_empty(), "never twice at once");
        q.done(&key("web"), &Outcome::Restamped, t0);
        assert!(q.take(t0 + Duration::from_secs(29), 10).is_empty());
        let second = q.take(t0 + Duration::from_secs(30), 10);
        assert_eq!(
            names(&second),
            vec!["apps/web"],
            "one more, after the interval"
        );
        q.done(&key("web"), &Outcome::Settled, t0 + Duration::from_secs(30));
        assert_eq!(q.pending(), 0);
    }

    #[test]
    fn namespaces_take_turns() {
        let mut q = Queue::new(pacing(0, 0, 0));
        let t0 = Instant::now();
        for n in 0..100 {
            q.mark(
                key_in("noisy", &format!("w{n:03}")),
                Reason::All("start"),
                t0,
            );
        }
        q.mark(key_in("quiet", "web"), Reason::All("start"), t0);
        let first = names(&q.take(t0, 2));
        assert_eq!(first, vec!["noisy/w000", "quiet/web"], "one turn each");
        assert_eq!(names(&q.take(t0, 2)), vec!["noisy/w001", "noisy/w002"]);
    }

    #[test]
    fn parked_workloads_come_back_round_robin_where_there_is_room() {
        let mut q = Queue::new(pacing(0, 0, 0));
        let t0 = Instant::now();
        for (ns, name) in [("a", "1"), ("a", "2"), ("b", "1"), ("c", "1")] {
            q.mark(key_in(ns, name), Reason::All("hash-key"), t0);
        }
        for t in q.take(t0, 10) {
            q.park(t);
        }
        assert_eq!(q.parked(), 4);
        assert!(q.take(t0, 10).is_empty(), "parked until unparked");
        // A change of a parked workload keeps it parked.
        q.mark(key_in("a", "1"), changed(), t0);
        assert!(q.take(t0, 10).is_empty());
        q.unpark(2, |ns| ns != "b", t0);
        assert_eq!(names(&q.take(t0, 10)), vec!["a/1", "c/1"]);
        q.unpark(5, |_| true, t0);
        assert_eq!(names(&q.take(t0, 10)), vec!["a/2", "b/1"]);
        assert_eq!(q.parked(), 0);
    }

    #[test]
    fn refusals_back_off_with_jitter_and_ineffective_restamps_give_up() {
        let mut q = Queue::new(pacing(0, 0, 1000));
        let t0 = Instant::now();
        q.mark(key("web"), Reason::Workload, t0);
        q.take(t0, 1);
        q.done(&key("web"), &Outcome::Failed, t0);
        assert!(q.take(t0, 1).is_empty(), "no hot loop");
        let at = q.next_at().unwrap();
        assert!(at >= t0 + Duration::from_secs(1) && at <= t0 + Duration::from_millis(1200));
        assert_eq!(q.take(at, 1)[0].reason, Reason::All("retry"));
        // Two workloads refused at once come back at different times.
        let spread: std::collections::BTreeSet<Duration> = (0..20)
            .map(|n| jitter(Duration::from_secs(10), &key(&format!("w{n}")), 1))
            .collect();
        assert!(spread.len() > 10, "{spread:?}");

        let mut q = Queue::new(pacing(0, 0, 1000));
        q.mark(key("web"), Reason::Workload, t0);
        q.take(t0, 1);
        assert!(!q.done(&key("web"), &Outcome::Ineffective(1), t0));
        let at = q.next_at().unwrap();
        q.take(at, 1);
        assert!(q.done(&key("web"), &Outcome::Ineffective(INEFFECTIVE_TRIES), at));
        assert_eq!(q.next_at(), None, "then it waits for a change");
    }

    #[test]
    fn a_read_is_decided_again_at_once_and_a_deleted_workload_is_forgotten() {
        let mut q = Queue::new(pacing(0, 0, 0));
        let t0 = Instant::now();
        q.mark(key("web"), Reason::Workload, t0);
        let t = q.take(t0, 1);
        q.again(&t[0].key, Reason::Workload, t0, t0);
        let again = q.take(t0, 1);
        assert_eq!(again[0].reason, Reason::Workload, "the reason is kept");
        q.forget(&key("web"));
        q.done(&key("web"), &Outcome::Gone, t0);
        assert_eq!(q.pending(), 0);
        q.mark(key("web"), Reason::Workload, t0);
        q.forget(&key("web"));
        assert!(q.take(t0, 1).is_empty());
    }
}
