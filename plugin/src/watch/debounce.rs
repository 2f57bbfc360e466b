//! When to run after changes: once the changes have been quiet for the debounce period, but never
//! later than a maximum delay after the first of them (a steady stream of changes must not starve
//! propagation), and not before a retry back-off after a failed run.

use std::time::Duration;

use tokio::time::Instant;

/// Pending work and why.
#[derive(Debug, Default)]
pub struct Pending {
    first: Option<Instant>,
    last: Option<Instant>,
    not_before: Option<Instant>,
    reasons: Vec<String>,
}

/// At most this many distinct reasons are kept for the report of one run.
const MAX_REASONS: usize = 8;

impl Pending {
    /// Something changed at `now`.
    pub fn mark(&mut self, now: Instant, reason: impl Into<String>) {
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

    /// When to run, if anything is pending.
    pub fn due(&self, debounce: Duration, max_delay: Duration) -> Option<Instant> {
        let (first, last) = (self.first?, self.last?);
        let due = (last + debounce).min(first + max_delay.max(debounce));
        Some(match self.not_before {
            Some(nb) => due.max(nb),
            None => due,
        })
    }

    /// Takes the reasons and clears the pending state (the run is starting).
    pub fn take(&mut self) -> Vec<String> {
        let reasons = std::mem::take(&mut self.reasons);
        *self = Pending::default();
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

    #[test]
    fn nothing_pending_nothing_due() {
        let p = Pending::default();
        assert_eq!(p.due(D, MAX), None);
    }

    #[test]
    fn quiet_period_restarts_with_each_change() {
        let t = Instant::now();
        let mut p = Pending::default();
        p.mark(t, "a");
        assert_eq!(p.due(D, MAX), Some(t + D));
        p.mark(t + Duration::from_millis(300), "b");
        assert_eq!(p.due(D, MAX), Some(t + Duration::from_millis(800)));
    }

    #[test]
    fn a_steady_stream_cannot_starve_the_run() {
        let t = Instant::now();
        let mut p = Pending::default();
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
