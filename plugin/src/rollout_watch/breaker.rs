//! The flap breaker: a Secret or ConfigMap that changes more than `--flap-changes` times within
//! `--flap-window` stops rolling its readers.
//!
//! While a source's breaker is open, none of its readers is restamped (for any reason: a restamp
//! would roll in the source's content of that moment). It closes by itself once the source was
//! quiet for `--flap-release`, or when someone sets `helmop.dev/rollout-resume` on the source to a
//! new value (`kubectl helmop rollout --resume secret/NAME`); its readers are then decided again,
//! once, with the content of then, through the roll budget.
//!
//! Only changes of sources that opted-in workloads read are counted (one entry per such source,
//! at most `--flap-changes + 1` instants each). A change is a new `resourceVersion`: the watcher
//! sees metadata only, so a write that leaves the data as it was counts too.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use tokio::time::Instant;

use super::index::ObjectKey;

/// The breaker flags.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlapLimits {
    /// Changes allowed within `window`; one more opens the breaker. 0 disables the breaker.
    pub changes: u32,
    pub window: Duration,
    /// Quiet time after which an open breaker closes by itself.
    pub release: Duration,
}

#[derive(Debug, Default)]
struct Track {
    /// The last changes, at most `changes + 1`.
    changes: VecDeque<Instant>,
    open: Option<Open>,
}

#[derive(Debug)]
struct Open {
    last_change: Instant,
    /// The source's `helmop.dev/rollout-resume` when the breaker opened: a new value releases it.
    resume: Option<String>,
}

/// What one change did.
#[derive(Debug, PartialEq, Eq)]
pub enum Flap {
    /// Below the limit (or the breaker is disabled).
    Fine,
    /// This change opened the breaker.
    Tripped { changes: usize },
    /// The breaker was open already.
    Open,
    /// The change carried a new resume value: the breaker closed.
    Resumed,
}

/// The breakers of every source read by an opted-in workload that changed lately.
pub struct Breakers {
    limits: FlapLimits,
    tracks: HashMap<ObjectKey, Track>,
}

impl Breakers {
    pub fn new(limits: FlapLimits) -> Breakers {
        Breakers {
            limits,
            tracks: HashMap::new(),
        }
    }

    pub fn limits(&self) -> FlapLimits {
        self.limits
    }

    /// `key` (read by an opted-in workload) changed at `now`; `resume` is its
    /// `helmop.dev/rollout-resume` now.
    pub fn change(&mut self, key: &ObjectKey, resume: Option<&str>, now: Instant) -> Flap {
        if self.limits.changes == 0 {
            return Flap::Fine;
        }
        let limits = self.limits;
        let track = self.tracks.entry(key.clone()).or_default();
        if let Some(open) = &mut track.open {
            if open.resume.as_deref() != resume && resume.is_some() {
                track.open = None;
                track.changes.clear();
                return Flap::Resumed;
            }
            open.last_change = now;
            return Flap::Open;
        }
        track.changes.push_back(now);
        while track
            .changes
            .front()
            .is_some_and(|t| now.duration_since(*t) > limits.window)
        {
            track.changes.pop_front();
        }
        let limit = usize::try_from(limits.changes).unwrap_or(usize::MAX);
        while track.changes.len() > limit + 1 {
            track.changes.pop_front();
        }
        if track.changes.len() > limit {
            track.open = Some(Open {
                last_change: now,
                resume: resume.map(str::to_owned),
            });
            return Flap::Tripped {
                changes: track.changes.len(),
            };
        }
        Flap::Fine
    }

    pub fn is_open(&self, key: &ObjectKey) -> bool {
        self.tracks.get(key).is_some_and(|t| t.open.is_some())
    }

    pub fn open_count(&self) -> usize {
        self.tracks.values().filter(|t| t.open.is_some()).count()
    }

    /// Closes the breakers quiet for the release time at `now` and forgets sources with no
    /// change left in the window; returns the closed ones.
    pub fn release(&mut self, now: Instant) -> Vec<ObjectKey> {
        let limits = self.limits;
        let mut closed = Vec::new();
        self.tracks.retain(|key, track| {
            if let Some(open) = &track.open {
                if now.duration_since(open.last_change) >= limits.release {
                    closed.push(key.clone());
                    return false;
                }
                return true;
            }
            track
                .changes
                .back()
                .is_some_and(|t| now.duration_since(*t) <= limits.window)
        });
        closed.sort();
        closed
    }

    /// When the next open breaker closes by itself.
    pub fn next_release(&self) -> Option<Instant> {
        self.tracks
            .values()
            .filter_map(|t| t.open.as_ref())
            .map(|o| o.last_change + self.limits.release)
            .min()
    }

    /// The source is gone: its breaker with it (a new object of that name starts afresh).
    pub fn forget(&mut self, key: &ObjectKey) -> bool {
        self.tracks.remove(key).is_some_and(|t| t.open.is_some())
    }
}

#[cfg(test)]
mod tests {
    use helmop_core::resource::ResourceRef;

    use super::*;

    fn db() -> ObjectKey {
        ObjectKey {
            namespace: "apps".into(),
            resource: ResourceRef::secret("db"),
        }
    }

    fn breakers(changes: u32) -> Breakers {
        Breakers::new(FlapLimits {
            changes,
            window: Duration::from_secs(60),
            release: Duration::from_secs(120),
        })
    }

    #[test]
    fn more_than_k_changes_in_the_window_trip_once_and_quiet_releases() {
        let mut b = breakers(5);
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut outcomes = Vec::new();
        // Every 200 ms for 60 s.
        for n in 0..300u64 {
            outcomes.push(b.change(&db(), None, t0 + ms(200 * n)));
        }
        assert_eq!(
            outcomes[..5],
            [Flap::Fine, Flap::Fine, Flap::Fine, Flap::Fine, Flap::Fine]
        );
        assert_eq!(outcomes[5], Flap::Tripped { changes: 6 });
        assert!(outcomes[6..].iter().all(|o| *o == Flap::Open), "one trip");
        assert!(b.is_open(&db()) && b.open_count() == 1);
        let last = t0 + ms(200 * 299);
        assert_eq!(b.next_release(), Some(last + Duration::from_secs(120)));
        assert!(b.release(last + Duration::from_secs(119)).is_empty());
        assert_eq!(b.release(last + Duration::from_secs(120)), vec![db()]);
        assert!(!b.is_open(&db()));
        assert_eq!(
            b.change(&db(), None, last + Duration::from_secs(121)),
            Flap::Fine
        );
    }

    #[test]
    fn slow_changes_never_trip_and_are_forgotten() {
        let mut b = breakers(5);
        let t0 = Instant::now();
        for n in 0..100u64 {
            assert_eq!(
                b.change(&db(), None, t0 + Duration::from_secs(13 * n)),
                Flap::Fine
            );
        }
        assert!(b.release(t0 + Duration::from_secs(13 * 99 + 61)).is_empty());
        assert!(b.tracks.is_empty(), "nothing kept for a quiet source");
    }

    #[test]
    fn a_new_resume_value_closes_it_and_zero_disables_it() {
        let mut b = breakers(1);
        let t0 = Instant::now();
        b.change(&db(), Some("old"), t0);
        assert_eq!(
            b.change(&db(), Some("old"), t0),
            Flap::Tripped { changes: 2 }
        );
        assert_eq!(b.change(&db(), Some("old"), t0), Flap::Open);
        assert_eq!(
            b.change(&db(), Some("2026-12-07T10:00:00Z"), t0),
            Flap::Resumed
        );
        assert!(!b.is_open(&db()));
        let mut off = breakers(0);
        for _ in 0..100 {
            assert_eq!(off.change(&db(), None, t0), Flap::Fine);
        }
    }
}
