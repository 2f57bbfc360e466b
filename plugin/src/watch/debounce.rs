//! When to run after changes. The first change after a quiet period runs almost at once (the
//! leading edge: once changes have been quiet for [`QUIET`], so the objects of one `kubectl apply`
//! arrive together, and never later than [`GATHER`] after the first); changes
//! that come while a run is in flight or within the debounce period after one wait until they have
//! been quiet for the debounce period (the trailing edge coalesces a burst into one run), but never
//! longer than a maximum delay after the first of them (a steady stream of changes must not starve
//! propagation), and not before a retry back-off after a failed run.
//!
//! Why a leading edge: with a trailing debounce only, every single edit waited the whole debounce
//! period (1 s by default) before its run, most of the edit-to-copy latency on a small fleet
//! (docs/performance.md, "Watching a fleet"). A burst now costs at most one run more than before.

use std::time::Duration;

use tokio::time::Instant;

use helmop_core::plan::HelmOpKey;

use crate::run::focus::{Changes, Focus, MAX_FOCUSED_CHANGES, SourceKey};

/// The longest the leading edge waits for the rest of one apply (at most the debounce period).
pub const GATHER: Duration = Duration::from_millis(100);

/// The leading edge runs once changes have been quiet this long. The objects of one `kubectl apply`
/// arrive a request apart (milliseconds on one network); a single edit, the common case (`kubectl edit`,
/// a rotated Secret, Fleet's agent), no longer waits the whole of [`GATHER`] for company that never comes:
/// that wait was 100 ms of the 500 ms an edit took to reach 1,000 clusters (docs/performance.md,
/// section 6). An apply whose objects come further apart than this is split: the first run takes what has
/// arrived, the rest waits for the trailing edge, as an apply longer than [`GATHER`] always was.
pub const QUIET: Duration = Duration::from_millis(30);

/// Pending work and why.
#[derive(Debug, Default)]
pub struct Pending {
    first: Option<Instant>,
    last: Option<Instant>,
    not_before: Option<Instant>,
    reasons: Vec<String>,
    /// Whether a change after a quiet period runs at once ([`Pending::leading_edge`]).
    leading: bool,
    /// When the last run ended (kept across [`Pending::take`]).
    last_run: Option<Instant>,
    /// The sources and HelmOps changed since the last run, while nothing else changed
    /// ([`Pending::take_focus`]).
    changes: Changes,
    /// Something other than a source or a HelmOp changed (or too many did): the run covers
    /// everything.
    widened: bool,
}

/// At most this many distinct reasons are kept for the report of one run.
const MAX_REASONS: usize = 8;

impl Pending {
    /// Pending work that runs on the leading edge (`propagate --watch`). The default waits for
    /// quiet every time (`images --watch`: a digest must stay put for the debounce period).
    pub fn leading_edge() -> Pending {
        Pending {
            leading: true,
            ..Pending::default()
        }
    }

    /// Something changed at `now`.
    pub fn mark(&mut self, now: Instant, reason: impl Into<String>) {
        self.widened = true;
        self.note(now, reason);
    }

    /// Secret or ConfigMap `source` changed at `now`: unless something else changes before the
    /// run, it covers only the clusters copying the changed sources.
    pub fn mark_source(&mut self, now: Instant, reason: impl Into<String>, source: SourceKey) {
        if self.changes.len() < MAX_FOCUSED_CHANGES || self.changes.sources.contains(&source) {
            self.changes.sources.insert(source);
        } else {
            self.widened = true;
        }
        self.note(now, reason);
    }

    /// HelmOp `helmop` changed (or appeared) at `now`: unless something else changes before the
    /// run, it covers only the clusters that HelmOp concerns ([`crate::run::focus`]).
    pub fn mark_helmop(&mut self, now: Instant, reason: impl Into<String>, helmop: HelmOpKey) {
        if self.changes.len() < MAX_FOCUSED_CHANGES || self.changes.helmops.contains(&helmop) {
            self.changes.helmops.insert(helmop);
        } else {
            self.widened = true;
        }
        self.note(now, reason);
    }

    fn note(&mut self, now: Instant, reason: impl Into<String>) {
        self.first.get_or_insert(now);
        self.last = Some(now);
        let reason = reason.into();
        if self.reasons.len() < MAX_REASONS && !self.reasons.contains(&reason) {
            self.reasons.push(reason);
        }
    }

    /// Run again, but not before `at` (a failed run's back-off).
    pub fn retry_at(&mut self, at: Instant, reason: impl Into<String>) {
        self.mark(at, reason);
        self.not_before = Some(at);
    }

    /// A run ended at `now` (whatever its outcome).
    pub fn ran(&mut self, now: Instant) {
        self.last_run = Some(now);
    }

    /// When to run, if anything is pending.
    pub fn due(&self, debounce: Duration, max_delay: Duration) -> Option<Instant> {
        let (first, last) = (self.first?, self.last?);
        let quiet_before = self.leading && self.last_run.is_none_or(|r| first >= r + debounce);
        let due = if quiet_before {
            (first + GATHER).min(last + QUIET).min(first + debounce)
        } else {
            (last + debounce).min(first + max_delay.max(debounce))
        };
        Some(match self.not_before {
            Some(nb) => due.max(nb),
            None => due,
        })
    }

    /// [`Pending::take`], with what the run covers: only the clusters of the changed sources
    /// and HelmOps when nothing else changed.
    pub fn take_focus(&mut self) -> (Vec<String>, Focus) {
        let focus = if self.widened || self.changes.is_empty() {
            Focus::Everything
        } else {
            Focus::Changes(std::mem::take(&mut self.changes))
        };
        (self.take(), focus)
    }

    /// Takes the reasons and clears the pending state (the run is starting).
    pub fn take(&mut self) -> Vec<String> {
        let reasons = std::mem::take(&mut self.reasons);
        *self = Pending {
            leading: self.leading,
            last_run: self.last_run,
            ..Pending::default()
        };
        reasons
    }
}

/// Exponential back-off after consecutive failed runs: 1 s, 2 s, 4 s ... capped at `max`.
pub fn backoff(failures: u32, max: Duration) -> Duration {
    let exp = failures.saturating_sub(1).min(16);
    Duration::from_secs(1u64 << exp).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(5);

    fn source(name: &str) -> SourceKey {
        SourceKey {
            namespace: "team".into(),
            resource: helmop_core::resource::ResourceRef::secret(name),
        }
    }

    #[test]
    fn only_source_edits_focus_a_run() {
        let t = Instant::now();
        let mut p = Pending::leading_edge();
        p.mark_source(t, "Secret team/a changed", source("a"));
        p.mark_source(t, "Secret team/b changed", source("b"));
        let (reasons, focus) = p.take_focus();
        assert_eq!(reasons.len(), 2);
        assert_eq!(
            focus,
            Focus::Changes(Changes {
                sources: [source("a"), source("b")].into_iter().collect(),
                ..Changes::default()
            })
        );
        // HelmOp edits focus too, with sources or alone.
        let app = HelmOpKey::new("team", "app");
        p.mark_source(t, "Secret team/a changed", source("a"));
        p.mark_helmop(t, "HelmOp team/app changed", app.clone());
        assert_eq!(
            p.take_focus().1,
            Focus::Changes(Changes {
                sources: [source("a")].into_iter().collect(),
                helmops: [app.clone()].into_iter().collect(),
                ..Changes::default()
            })
        );
        // Anything else pending widens the run to everything, before or after the changes.
        p.mark_source(t, "Secret team/a changed", source("a"));
        p.mark(t, "Cluster team/c1 changed");
        assert_eq!(p.take_focus().1, Focus::Everything);
        p.mark(t, "HelmOp team/app deleted");
        p.mark_helmop(t, "HelmOp team/app changed", app);
        assert_eq!(p.take_focus().1, Focus::Everything);
        p.mark(t, "resync");
        p.mark_source(t, "Secret team/a changed", source("a"));
        assert_eq!(p.take_focus().1, Focus::Everything);
        // Nothing pending: a run (if one is made) covers everything.
        assert_eq!(p.take_focus().1, Focus::Everything);
        // Too many sources at once: everything.
        for i in 0..=MAX_FOCUSED_CHANGES {
            p.mark_source(
                t,
                format!("Secret team/s{i} changed"),
                source(&format!("s{i}")),
            );
        }
        assert_eq!(p.take_focus().1, Focus::Everything);
    }

    #[test]
    fn nothing_pending_nothing_due() {
        let p = Pending::default();
        assert_eq!(p.due(D, MAX), None);
    }

    /// A pending state right after a run that ended at `t`.
    fn after_run(t: Instant) -> Pending {
        let mut p = Pending::leading_edge();
        p.ran(t);
        p
    }

    #[test]
    fn a_change_after_a_quiet_period_runs_at_once() {
        let t = Instant::now();
        let ms = Duration::from_millis;
        let mut p = Pending::leading_edge();
        p.mark(t, "start");
        assert_eq!(p.due(D, MAX), Some(t + QUIET));
        // More of the same apply, each within QUIET of the one before, move it on...
        p.mark(t + ms(20), "b");
        assert_eq!(p.due(D, MAX), Some(t + ms(20) + QUIET));
        // ... but never past GATHER after the first.
        for at in [40, 60, 80, 95] {
            p.mark(t + ms(at), "c");
        }
        assert_eq!(p.due(D, MAX), Some(t + GATHER));
        p.take();
        p.ran(t + Duration::from_secs(1));
        let later = t + Duration::from_secs(1) + D;
        p.mark(later, "edit");
        assert_eq!(p.due(D, MAX), Some(later + QUIET));
        // Never later than a trailing debounce would have run.
        p.mark(later + ms(25), "more");
        assert_eq!(p.due(ms(40), MAX), Some(later + ms(40)));
    }

    #[test]
    fn without_the_leading_edge_every_change_waits_for_quiet() {
        let t = Instant::now();
        let mut p = Pending::default();
        p.mark(t, "a");
        assert_eq!(p.due(D, MAX), Some(t + D));
        p.mark(t + Duration::from_millis(300), "b");
        assert_eq!(p.due(D, MAX), Some(t + Duration::from_millis(800)));
        p.take();
        p.mark(t + Duration::from_secs(10), "c");
        assert_eq!(p.due(D, MAX), Some(t + Duration::from_secs(10) + D));
    }

    #[test]
    fn changes_right_after_a_run_wait_for_quiet() {
        let t = Instant::now();
        let mut p = after_run(t);
        p.mark(t, "a");
        assert_eq!(p.due(D, MAX), Some(t + D));
        p.mark(t + Duration::from_millis(300), "b");
        assert_eq!(p.due(D, MAX), Some(t + Duration::from_millis(800)));
    }

    #[test]
    fn a_steady_stream_cannot_starve_the_run() {
        let t = Instant::now();
        let mut p = after_run(t);
        for i in 0..100 {
            p.mark(t + Duration::from_millis(100 * i), "churn");
        }
        assert_eq!(p.due(D, MAX), Some(t + MAX));
    }

    #[test]
    fn retry_waits_for_its_back_off() {
        let t = Instant::now();
        let mut p = Pending::default();
        p.retry_at(t + Duration::from_secs(4), "retry");
        p.mark(t, "change");
        assert_eq!(p.due(D, MAX), Some(t + Duration::from_secs(4)));
        // With the leading edge a retry is a change at its time, gathered like any other.
        let mut p = after_run(t);
        p.retry_at(t + Duration::from_secs(4), "retry");
        assert_eq!(p.due(D, MAX), Some(t + Duration::from_secs(4) + QUIET));
    }

    #[test]
    fn take_keeps_when_the_last_run_ended() {
        let t = Instant::now();
        let mut p = after_run(t);
        p.mark(t, "a");
        p.take();
        p.mark(t + Duration::from_millis(10), "b");
        assert_eq!(p.due(D, MAX), Some(t + Duration::from_millis(10) + D));
    }

    #[test]
    fn take_clears_and_keeps_distinct_reasons() {
        let t = Instant::now();
        let mut p = Pending::default();
        p.mark(t, "a");
        p.mark(t, "a");
        p.mark(t, "b");
        assert_eq!(p.take(), ["a", "b"]);
        assert_eq!(p.due(D, MAX), None);
        for i in 0..20 {
            p.mark(t, format!("r{i}"));
        }
        assert_eq!(p.take().len(), MAX_REASONS);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap() {
        let cap = Duration::from_secs(60);
        assert_eq!(backoff(1, cap), Duration::from_secs(1));
        assert_eq!(backoff(2, cap), Duration::from_secs(2));
        assert_eq!(backoff(4, cap), Duration::from_secs(8));
        assert_eq!(backoff(50, cap), cap);
        assert_eq!(backoff(0, cap), Duration::from_secs(1));
    }
}
