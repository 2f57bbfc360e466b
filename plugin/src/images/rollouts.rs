//! Which outdated workloads `images --watch` restamps, and when (pure; the clock is passed in).
//!
//! The rule: a workload is restamped once the registry digests it is outdated against have stayed the
//! same for the debounce period (default: one poll interval). Every poll that sees them move again
//! restarts that period, so a burst of pushes rolls the workload once, for the last push. A steady stream
//! of pushes still rolls it at least every 10 debounce periods (the first change plus that maximum
//! delay), never more often. After a restamp, a workload the next poll still finds outdated against the
//! same digests (the webhook did not re-pin it: not installed, image mode off, a stale cache) is retried
//! after an exponential back-off (1 s, 2 s, 4 s ... at most 10 minutes) plus the debounce period, as is
//! one whose restamp failed. This reuses `propagate --watch`'s debounce ([`crate::watch::debounce`]).

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use super::model::{ImageRow, ImageState, short_digest};
use crate::watch::debounce::{Pending, backoff};

/// Longest wait between attempts at one workload.
pub const MAX_BACKOFF: Duration = Duration::from_secs(600);

/// `(namespace, deployment/web)`.
pub type WorkloadKey = (String, String);

/// Per outdated workload: the digests it should move to and the debounce state.
#[derive(Debug, Default)]
struct Track {
    /// `(container, registry digest)` of its outdated containers, sorted.
    wanted: Vec<(String, String)>,
    pending: Pending,
    /// What the last restamp was for; the next poll checks it took.
    restamped_for: Option<Vec<(String, String)>>,
    failures: u32,
}

/// The debounce state of every outdated workload.
#[derive(Debug)]
pub struct Rollouts {
    debounce: Duration,
    max_delay: Duration,
    tracks: BTreeMap<WorkloadKey, Track>,
}

/// What a poll means for one workload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Restamp now; the reasons say which digests moved.
    Restamp(WorkloadKey, Vec<String>),
    /// The last restamp did not re-pin it; retrying after `retry_in`.
    NotRepinned(WorkloadKey, Duration),
}

impl Rollouts {
    pub fn new(debounce: Duration) -> Rollouts {
        Rollouts {
            debounce,
            max_delay: debounce * 10,
            tracks: BTreeMap::new(),
        }
    }

    /// Takes in the rows of a poll made at `now`; returns what to do.
    pub fn observe(&mut self, now: Instant, rows: &[ImageRow]) -> Vec<Verdict> {
        let mut outdated: BTreeMap<WorkloadKey, Vec<(String, String)>> = BTreeMap::new();
        for r in rows {
            if r.state == ImageState::Outdated
                && let Some(current) = &r.current
            {
                outdated
                    .entry((r.namespace.clone(), r.workload.clone()))
                    .or_default()
                    .push((r.container.clone(), current.clone()));
            }
        }
        // Current, unresolvable or gone: nothing to wait for.
        self.tracks.retain(|key, _| outdated.contains_key(key));
        let mut verdicts = Vec::new();
        for (key, mut wanted) in outdated {
            wanted.sort();
            let track = self.tracks.entry(key.clone()).or_default();
            if track.wanted != wanted {
                let reason = wanted
                    .iter()
                    .map(|(c, d)| format!("{c} -> {}", short_digest(d)))
                    .collect::<Vec<_>>()
                    .join(", ");
                track.pending.mark(now, reason);
                track.wanted = wanted;
                track.restamped_for = None;
                track.failures = 0;
            } else if track.restamped_for.take().is_some() {
                let wait = track.back_off(
                    now,
                    self.debounce,
                    self.max_delay,
                    "still outdated after a restamp",
                );
                verdicts.push(Verdict::NotRepinned(key.clone(), wait));
            }
            if track
                .pending
                .due(self.debounce, self.max_delay)
                .is_some_and(|due| due <= now)
            {
                verdicts.push(Verdict::Restamp(key, track.pending.take()));
            }
        }
        verdicts
    }

    /// The restamp of `key` was written: the next poll checks it took.
    pub fn restamped(&mut self, key: &WorkloadKey) {
        if let Some(t) = self.tracks.get_mut(key) {
            t.restamped_for = Some(t.wanted.clone());
        }
    }

    /// The restamp of `key` failed at `now`: retry later; returns how much later.
    pub fn failed(&mut self, now: Instant, key: &WorkloadKey) -> Duration {
        let mut track = self.tracks.remove(key).unwrap_or_default();
        let wait = track.back_off(
            now,
            self.debounce,
            self.max_delay,
            "retry after a failed restamp",
        );
        self.tracks.insert(key.clone(), track);
        wait
    }
}

impl Track {
    /// Another failure: wait longer before the next attempt; returns how long from `now`.
    fn back_off(
        &mut self,
        now: Instant,
        debounce: Duration,
        max_delay: Duration,
        reason: &str,
    ) -> Duration {
        self.failures += 1;
        self.pending
            .retry_at(now + backoff(self.failures, MAX_BACKOFF), reason);
        self.pending
            .due(debounce, max_delay)
            .map_or(debounce, |due| due.saturating_duration_since(now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const I: Duration = Duration::from_secs(1);

    fn row(container: &str, state: ImageState, current: &str) -> ImageRow {
        ImageRow {
            namespace: "apps".into(),
            workload: "deployment/web".into(),
            container: container.into(),
            image: "reg.io/app:latest".into(),
            pinned: Some("sha256:old".into()),
            current: Some(current.into()),
            state,
            reason: String::new(),
        }
    }

    fn key() -> WorkloadKey {
        ("apps".into(), "deployment/web".into())
    }

    fn restamps(v: &[Verdict]) -> usize {
        v.iter()
            .filter(|v| matches!(v, Verdict::Restamp(..)))
            .count()
    }

    #[test]
    fn a_burst_of_pushes_restamps_once_after_a_quiet_interval() {
        let t = Instant::now();
        let mut r = Rollouts::new(I);
        let outdated = |d: &str| vec![row("app", ImageState::Outdated, d)];
        // Three pushes seen on three polls in a row: each restarts the quiet period.
        assert!(r.observe(t, &outdated("sha256:a")).is_empty());
        assert!(r.observe(t + I / 2, &outdated("sha256:b")).is_empty());
        assert!(r.observe(t + I, &outdated("sha256:c")).is_empty());
        // Quiet for one interval: restamp, once.
        let v = r.observe(t + I * 2, &outdated("sha256:c"));
        assert_eq!(v.len(), 1);
        let Verdict::Restamp(k, reasons) = &v[0] else {
            panic!("{v:?}")
        };
        assert_eq!(k, &key());
        // One restamp for the whole burst, naming every digest seen.
        assert_eq!(
            reasons,
            &["app -> sha256:a", "app -> sha256:b", "app -> sha256:c"]
        );
        r.restamped(&key());
        // The restamp took: the workload is current and forgotten.
        assert!(
            r.observe(t + I * 3, &[row("app", ImageState::Current, "sha256:c")])
                .is_empty()
        );
        assert!(r.tracks.is_empty());
    }

    #[test]
    fn steady_pushes_cannot_starve_the_rollout() {
        let t = Instant::now();
        let mut r = Rollouts::new(I);
        let mut total = 0;
        for i in 0..25u32 {
            let now = t + I / 2 * i;
            total += restamps(&r.observe(
                now,
                &[row("app", ImageState::Outdated, &format!("sha256:{i}"))],
            ));
        }
        // 12 s of pushes every 0.5 s: at most one restamp per 10 s.
        assert_eq!(total, 1);
    }

    #[test]
    fn a_restamp_that_did_not_repin_backs_off() {
        let t = Instant::now();
        let mut r = Rollouts::new(I);
        let rows = [row("app", ImageState::Outdated, "sha256:c")];
        assert!(r.observe(t, &rows).is_empty());
        assert_eq!(restamps(&r.observe(t + I, &rows)), 1);
        r.restamped(&key());
        // Back-off 1 s, then the debounce period.
        let v = r.observe(t + I * 2, &rows);
        assert_eq!(v, [Verdict::NotRepinned(key(), I * 2)]);
        assert_eq!(restamps(&r.observe(t + I * 3, &rows)), 0);
        assert_eq!(restamps(&r.observe(t + I * 4, &rows)), 1);
        r.restamped(&key());
        // The back-off doubles.
        assert_eq!(
            r.observe(t + I * 5, &rows),
            [Verdict::NotRepinned(key(), I * 3)]
        );
    }

    #[test]
    fn failed_restamps_back_off_and_other_states_are_ignored() {
        let t = Instant::now();
        let mut r = Rollouts::new(I);
        let rows = [
            row("app", ImageState::Outdated, "sha256:c"),
            row("side", ImageState::Unresolvable, "sha256:x"),
            row("init", ImageState::Unpinned, "sha256:y"),
        ];
        r.observe(t, &rows);
        let v = r.observe(t + I, &rows);
        assert_eq!(
            v,
            [Verdict::Restamp(key(), vec!["app -> sha256:c".to_owned()])]
        );
        assert_eq!(r.failed(t + I, &key()), I * 2);
        assert!(r.observe(t + I * 2, &rows).is_empty());
        assert_eq!(restamps(&r.observe(t + I * 3, &rows)), 1);
        assert_eq!(r.failed(t + I * 3, &key()), I * 3);
    }
}
