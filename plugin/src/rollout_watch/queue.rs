//! When each workload is decided again: bursts coalesce per workload, failures back off, and
//! nothing is decided twice at once.
//!
//! A workload marked while idle is ready at once (the first change of a burst is acted on without
//! delay). Marks that arrive while it is being decided, or within `debounce` after a restamp, wait
//! for that to end and are handled together, with the content current then: a burst of edits ends
//! in one restamp with the final content, at most one more. A refused restamp is retried after
//! 1 s, 2 s, 4 s ... up to [`MAX_BACKOFF`]; a restamp the webhook did not act on (it left the stamp
//! as it was) is retried a few times ([`INEFFECTIVE_TRIES`]), then left until the next change.

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

/// How deciding a workload ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing to do (current, not opted in, not stamped by the webhook, or a dry run).
    Settled,
    /// Restamped, and the webhook wrote a new stamp (the expected one, or a newer one).
    Restamped,
    /// Restamped, but the webhook left the stamp as it was (or wrote none).
    Ineffective,
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
    in_flight: bool,
    /// Scheduled in `ready` or `later` (so it is never there twice).
    queued: bool,
    not_before: Instant,
    failures: u32,
    ineffective: u32,
}

/// The schedule.
pub struct Queue {
    debounce: Duration,
    slots: HashMap<WorkloadKey, Slot>,
    ready: VecDeque<WorkloadKey>,
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
    pub fn new(debounce: Duration) -> Queue {
        Queue {
            debounce,
            slots: HashMap::new(),
            ready: VecDeque::new(),
            later: BinaryHeap::new(),
            seq: 0,
        }
    }

    /// `key` must be decided again. The first reason of a burst is kept (it is what is reported).
    pub fn mark(&mut self, key: WorkloadKey, reason: Reason, now: Instant) {
        let slot = self.slots.entry(key.clone()).or_insert_with(|| Slot {
            due: None,
            since: now,
            in_flight: false,
            queued: false,
            not_before: now,
            failures: 0,
            ineffective: 0,
        });
        // A change resets the patience for restamps the webhook ignored.
        if !matches!(reason, Reason::All(_)) {
            slot.ineffective = 0;
        }
        if slot.due.is_none() {
            slot.due = Some(reason);
            slot.since = now;
        }
        if !slot.in_flight && !slot.queued {
            let at = slot.not_before;
            self.schedule(key, at, now);
        }
    }

    fn schedule(&mut self, key: WorkloadKey, at: Instant, now: Instant) {
        let Some(slot) = self.slots.get_mut(&key) else {
            return;
        };
        slot.queued = true;
        if at <= now {
            self.ready.push_back(key);
        } else {
            self.seq += 1;
            self.later.push(Reverse((at, self.seq, key)));
        }
    }

    /// Up to `limit` workloads to decide now, each marked in flight.
    pub fn take(&mut self, now: Instant, limit: usize) -> Vec<Ticket> {
        while let Some(Reverse((at, _, _))) = self.later.peek() {
            if *at > now {
                break;
            }
            if let Some(Reverse((_, _, key))) = self.later.pop() {
                self.ready.push_back(key);
            }
        }
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(key) = self.ready.pop_front() else {
                break;
            };
            let Some(slot) = self.slots.get_mut(&key) else {
                continue;
            };
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
        let retry = match outcome {
            Outcome::Settled | Outcome::Gone => {
                slot.failures = 0;
                None
            }
            Outcome::Restamped => {
                slot.failures = 0;
                slot.ineffective = 0;
                slot.not_before = now + self.debounce;
                None
            }
            Outcome::Failed => {
                slot.failures += 1;
                Some(backoff(slot.failures, MAX_BACKOFF))
            }
            Outcome::Ineffective => {
                slot.ineffective += 1;
                (slot.ineffective < INEFFECTIVE_TRIES)
                    .then(|| backoff(slot.ineffective, MAX_INEFFECTIVE_BACKOFF))
            }
        };
        if let Some(wait) = retry {
            slot.not_before = now + wait;
            if slot.due.is_none() {
                slot.due = Some(Reason::All("retry"));
                slot.since = now;
            }
        }
        let gave_up = *outcome == Outcome::Ineffective && retry.is_none();
        if slot.due.is_some() {
            let at = slot.not_before.max(now);
            self.schedule(key.clone(), at, now);
        } else if slot.failures == 0 && slot.ineffective == 0 && slot.not_before <= now {
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
        if self.ready.is_empty() && self.ready.capacity() > 64 {
            self.ready.shrink_to_fit();
        }
    }

    /// Workloads marked, waiting or in flight.
    pub fn pending(&self) -> usize {
        self.slots
            .values()
            .filter(|s| s.due.is_some() || s.in_flight)
            .count()
    }

    /// Forgets a workload that is gone (a decision in flight for it still ends with `done`).
    pub fn forget(&mut self, key: &WorkloadKey) {
        if let Some(slot) = self.slots.get_mut(key) {
            slot.due = None;
            if !slot.in_flight {
                self.slots.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use helmop_core::workload::WorkloadKind;

    use super::*;

    fn key(name: &str) -> WorkloadKey {
        WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: "apps".into(),
            name: name.into(),
        }
    }

    fn names(tickets: &[Ticket]) -> Vec<String> {
        tickets.iter().map(|t| t.key.name.clone()).collect()
    }

    #[test]
    fn a_burst_is_one_decision_now_and_at_most_one_more_after_the_debounce() {
        let debounce = Duration::from_secs(1);
        let mut q = Queue::new(debounce);
        let t0 = Instant::now();
        q.mark(key("web"), Reason::Workload, t0);
        let first = q.take(t0, 10);
        assert_eq!(names(&first), vec!["web"]);
        // Ten more edits while the first restamp is in flight.
        for _ in 0..10 {
            q.mark(key("web"), Reason::Workload, t0);
        }
        assert!(q.take(t0, 10).is_empty(), "never twice at once");
        q.done(&key("web"), &Outcome::Restamped, t0);
        assert!(q.take(t0, 10).is_empty(), "waits for the debounce");
        assert_eq!(q.next_at(), Some(t0 + debounce));
        let second = q.take(t0 + debounce, 10);
        assert_eq!(
            names(&second),
            vec!["web"],
            "one more, with the final content"
        );
        q.done(&key("web"), &Outcome::Settled, t0 + debounce);
        assert!(q.take(t0 + debounce * 5, 10).is_empty());
        assert_eq!(q.pending(), 0);
    }

    #[test]
    fn concurrency_is_capped_and_the_rest_waits_its_turn() {
        let mut q = Queue::new(Duration::from_secs(1));
        let t0 = Instant::now();
        for n in ["a", "b", "c"] {
            q.mark(key(n), Reason::All("start"), t0);
        }
        assert_eq!(names(&q.take(t0, 2)), vec!["a", "b"]);
        assert_eq!(q.pending(), 3);
        assert_eq!(names(&q.take(t0, 2)), vec!["c"]);
    }

    #[test]
    fn refusals_back_off_and_ineffective_restamps_give_up() {
        let mut q = Queue::new(Duration::from_secs(1));
        let t0 = Instant::now();
        q.mark(key("web"), Reason::Workload, t0);
        q.take(t0, 1);
        q.done(&key("web"), &Outcome::Failed, t0);
        assert!(q.take(t0, 1).is_empty(), "no hot loop");
        assert_eq!(q.next_at(), Some(t0 + Duration::from_secs(1)));
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(q.take(t1, 1)[0].reason, Reason::All("retry"));
        q.done(&key("web"), &Outcome::Failed, t1);
        assert_eq!(q.next_at(), Some(t1 + Duration::from_secs(2)));

        let mut q = Queue::new(Duration::from_secs(1));
        q.mark(key("web"), Reason::Workload, t0);
        let mut now = t0;
        let mut tries = 0;
        while let Some(at) = q.next_at() {
            now = now.max(at);
            if q.take(now, 1).is_empty() {
                break;
            }
            tries += 1;
            let gave_up = q.done(&key("web"), &Outcome::Ineffective, now);
            assert_eq!(gave_up, tries == INEFFECTIVE_TRIES);
        }
        assert_eq!(tries, INEFFECTIVE_TRIES, "then it waits for a change");
        q.mark(key("web"), Reason::Workload, now);
        assert_eq!(q.take(now, 1).len(), 1, "a change tries again");
    }

    #[test]
    fn a_deleted_workload_is_forgotten() {
        let mut q = Queue::new(Duration::from_secs(1));
        let t0 = Instant::now();
        q.mark(key("web"), Reason::Workload, t0);
        q.forget(&key("web"));
        assert!(q.take(t0, 1).is_empty());
        q.mark(key("web"), Reason::Workload, t0);
        q.take(t0, 1);
        q.done(&key("web"), &Outcome::Gone, t0);
        assert_eq!(q.pending(), 0);
    }
}
