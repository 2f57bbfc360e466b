//! The roll budget: how many workloads the watcher has rolling at once, in the cluster and in each
//! namespace.
//!
//! A workload counts from the moment its restamp is sent until its rollout is over
//! ([`helmop_core::progress::RollState::is_over`]: every replica updated and available, or past
//! its progress deadline), or until `--roll-timeout` passed (a kind without a deadline, a rollout
//! nobody finishes). A restamp that did not change the stamp gives its room back at once, and so
//! does a CronJob (its next Job runs the new template; nothing rolls now). Restamps that would
//! exceed the budget wait, parked in the queue ([`super::queue::Queue::park`]), and are handed back
//! round robin over namespaces as rollouts end.
//!
//! The budget is the watcher's own: rollouts someone else started (a new image) do not count. A
//! watcher that starts, or takes over the Lease, counts the rollouts a watcher restamped (its
//! `helmop.dev/restamp` value says so and when) that are still going.

use std::collections::HashMap;
use std::time::Duration;

use helmop_core::progress::RollState;
use tokio::time::Instant;

use super::index::WorkloadKey;

/// The budget flags (`--max-rolling`, `--max-rolling-per-namespace`, `--roll-timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Workloads rolling at once in the cluster (the watcher's scope).
    pub cluster: usize,
    /// Workloads rolling at once in one namespace.
    pub namespace: usize,
    /// A rollout still going after this is counted as over (with a Warning Event).
    pub timeout: Duration,
}

/// One workload rolling.
#[derive(Debug)]
struct Rolling {
    started: Instant,
    /// The generation the restamp gave it; `None` while the restamp is in flight.
    generation: Option<i64>,
}

/// What a progress report did to a rolling workload.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// Still rolling (or not rolling at all).
    No,
    Complete,
    Stalled(&'static str),
}

/// The workloads rolling now.
pub struct Budget {
    limits: Limits,
    rolling: HashMap<WorkloadKey, Rolling>,
    per_namespace: HashMap<String, usize>,
    /// The last progress seen of each rolling workload (generation, state): a report may arrive
    /// before its restamp's answer does.
    progress: HashMap<WorkloadKey, (i64, RollState)>,
    /// The largest number rolling at once so far (for the metric and the benchmark).
    peak: usize,
}

impl Budget {
    pub fn new(limits: Limits) -> Budget {
        Budget {
            limits,
            rolling: HashMap::new(),
            per_namespace: HashMap::new(),
            progress: HashMap::new(),
            peak: 0,
        }
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Whether one more workload of `namespace` may start rolling.
    pub fn room(&self, namespace: &str) -> bool {
        self.rolling.len() < self.limits.cluster
            && self.per_namespace.get(namespace).copied().unwrap_or(0) < self.limits.namespace
    }

    /// Rooms free in the cluster.
    pub fn free(&self) -> usize {
        self.limits.cluster.saturating_sub(self.rolling.len())
    }

    pub fn rolling(&self) -> usize {
        self.rolling.len()
    }

    pub fn peak(&self) -> usize {
        self.peak
    }

    pub fn is_rolling(&self, key: &WorkloadKey) -> bool {
        self.rolling.contains_key(key)
    }

    /// `key`'s restamp is about to be sent (it already had [`Budget::room`]).
    pub fn start(&mut self, key: &WorkloadKey, now: Instant) {
        self.insert(key, now, None);
    }

    /// A rollout a watcher restamped at `started` is still going (found at start-up or on taking
    /// the Lease); counted even past the limits, which only hold new restamps back.
    pub fn adopt(&mut self, key: &WorkloadKey, started: Instant, generation: i64) {
        if !self.rolling.contains_key(key) {
            self.insert(key, started, Some(generation));
        }
    }

    fn insert(&mut self, key: &WorkloadKey, started: Instant, generation: Option<i64>) {
        if self
            .rolling
            .insert(
                key.clone(),
                Rolling {
                    started,
                    generation,
                },
            )
            .is_none()
        {
            *self.per_namespace.entry(key.namespace.clone()).or_default() += 1;
        }
        self.peak = self.peak.max(self.rolling.len());
    }

    /// The restamp was answered: `generation` is the workload's after it (`None`: nothing rolls,
    /// the room is given back). Returns how the rollout ended if the progress already seen says
    /// it is over.
    pub fn restamped(&mut self, key: &WorkloadKey, generation: Option<i64>) -> Ended {
        let Some(generation) = generation else {
            self.end(key);
            return Ended::No;
        };
        match self.rolling.get_mut(key) {
            Some(r) => r.generation = Some(generation),
            None => return Ended::No,
        }
        match self.progress.get(key).cloned() {
            Some((g, state)) => self.progress(key, g, state),
            None => Ended::No,
        }
    }

    /// The workload's status says `state` at `generation`. Ends its rollout when that is the
    /// restamp's generation (or later) and the rollout is over.
    pub fn progress(&mut self, key: &WorkloadKey, generation: i64, state: RollState) -> Ended {
        let Some(r) = self.rolling.get(key) else {
            return Ended::No;
        };
        let ended = match (&state, r.generation) {
            (_, Some(g)) if generation < g => Ended::No,
            (_, None) => Ended::No,
            (RollState::Complete, _) => Ended::Complete,
            (RollState::Stalled(why), _) => Ended::Stalled(why),
            _ => Ended::No,
        };
        if ended == Ended::No {
            self.progress.insert(key.clone(), (generation, state));
        } else {
            self.end(key);
        }
        ended
    }

    /// Gives `key`'s room back (its rollout ended, the workload is gone, or it rolls nothing).
    pub fn end(&mut self, key: &WorkloadKey) {
        self.progress.remove(key);
        if self.rolling.remove(key).is_none() {
            return;
        }
        if let Some(n) = self.per_namespace.get_mut(&key.namespace) {
            *n -= 1;
            if *n == 0 {
                self.per_namespace.remove(&key.namespace);
            }
        }
    }

    /// Rollouts going for longer than the timeout, at `now`; each is ended.
    pub fn expire(&mut self, now: Instant) -> Vec<WorkloadKey> {
        let timeout = self.limits.timeout;
        let mut late: Vec<WorkloadKey> = self
            .rolling
            .iter()
            .filter(|(_, r)| r.generation.is_some() && now.duration_since(r.started) >= timeout)
            .map(|(k, _)| k.clone())
            .collect();
        late.sort();
        for k in &late {
            self.end(k);
        }
        late
    }

    /// When the oldest answered rollout times out.
    pub fn next_expiry(&self) -> Option<Instant> {
        self.rolling
            .values()
            .filter(|r| r.generation.is_some())
            .map(|r| r.started + self.limits.timeout)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use helmop_core::workload::WorkloadKind;

    use super::*;

    fn key(ns: &str, name: &str) -> WorkloadKey {
        WorkloadKey {
            kind: WorkloadKind::Deployment,
            namespace: ns.into(),
            name: name.into(),
        }
    }

    fn budget(cluster: usize, namespace: usize) -> Budget {
        Budget::new(Limits {
            cluster,
            namespace,
            timeout: Duration::from_secs(600),
        })
    }

    #[test]
    fn the_cluster_and_each_namespace_have_a_limit() {
        let mut b = budget(3, 2);
        let t0 = Instant::now();
        b.start(&key("a", "1"), t0);
        b.start(&key("a", "2"), t0);
        assert!(!b.room("a"), "the namespace's share is used");
        assert!(b.room("b"));
        b.start(&key("b", "1"), t0);
        assert!(!b.room("c"), "the cluster's budget is used");
        assert_eq!((b.rolling(), b.free(), b.peak()), (3, 0, 3));
        b.end(&key("a", "1"));
        assert!(b.room("a") && b.room("c"));
    }

    #[test]
    fn a_rollout_ends_when_its_own_generation_is_complete() {
        let mut b = budget(5, 5);
        let t0 = Instant::now();
        let web = key("a", "web");
        b.start(&web, t0);
        // The old, complete status arrives while the restamp is in flight: it says nothing.
        assert_eq!(b.progress(&web, 3, RollState::Complete), Ended::No);
        assert_eq!(b.restamped(&web, Some(4)), Ended::No);
        assert!(b.is_rolling(&web));
        assert_eq!(b.progress(&web, 4, RollState::Progressing("x")), Ended::No);
        assert_eq!(b.progress(&web, 4, RollState::Complete), Ended::Complete);
        assert!(!b.is_rolling(&web) && b.room("a"));
        // Complete before the answer arrived: ended by the answer.
        b.start(&web, t0);
        b.progress(&web, 5, RollState::Progressing("x"));
        b.progress(&web, 5, RollState::Complete);
        assert_eq!(b.restamped(&web, Some(5)), Ended::Complete);
        assert!(!b.is_rolling(&web));
        // A restamp that changed nothing gives the room back.
        b.start(&web, t0);
        assert_eq!(b.restamped(&web, None), Ended::No);
        assert_eq!(b.rolling(), 0);
    }

    #[test]
    fn stalled_and_timed_out_rollouts_give_their_room_back() {
        let mut b = budget(5, 5);
        let t0 = Instant::now();
        b.start(&key("a", "1"), t0);
        b.restamped(&key("a", "1"), Some(2));
        assert_eq!(
            b.progress(&key("a", "1"), 2, RollState::Stalled("deadline")),
            Ended::Stalled("deadline")
        );
        b.adopt(&key("a", "2"), t0, 7);
        assert_eq!(b.next_expiry(), Some(t0 + Duration::from_secs(600)));
        assert!(b.expire(t0 + Duration::from_secs(599)).is_empty());
        assert_eq!(b.expire(t0 + Duration::from_secs(600)), vec![key("a", "2")]);
        assert_eq!(b.rolling(), 0);
    }
}
