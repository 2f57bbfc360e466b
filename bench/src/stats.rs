//! Latency percentiles from every sample (no histogram buckets: the runs are short enough to keep them all).

use std::time::Duration;

/// Sorted latency samples of one run.
#[derive(Debug, Clone, Default)]
pub struct Latencies {
    sorted_ns: Vec<u64>,
}

impl Latencies {
    pub fn from_samples(mut samples_ns: Vec<u64>) -> Latencies {
        samples_ns.sort_unstable();
        Latencies {
            sorted_ns: samples_ns,
        }
    }

    pub fn len(&self) -> usize {
        self.sorted_ns.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sorted_ns.is_empty()
    }

    /// The nearest-rank percentile `q` in (0, 1]: the smallest sample at or above a fraction `q` of all samples.
    pub fn quantile(&self, q: f64) -> Duration {
        if self.sorted_ns.is_empty() {
            return Duration::ZERO;
        }
        let n = self.sorted_ns.len();
        let rank = ((q * n as f64).ceil() as usize).clamp(1, n);
        Duration::from_nanos(self.sorted_ns[rank - 1])
    }

    /// The samples of both runs.
    pub fn merge(&mut self, other: Latencies) {
        self.sorted_ns.extend(other.sorted_ns);
        self.sorted_ns.sort_unstable();
    }

    pub fn max(&self) -> Duration {
        Duration::from_nanos(self.sorted_ns.last().copied().unwrap_or(0))
    }
}

/// Milliseconds with three decimals, for tables.
pub fn ms(d: Duration) -> String {
    format!("{:.3}", d.as_secs_f64() * 1000.0)
}

/// KiB as MiB with one decimal, for tables.
pub fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// A share of one CPU as a percentage, for tables.
pub fn percent(share: f64) -> String {
    format!("{:.2}%", share * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let l = Latencies::from_samples((1..=1000).rev().collect());
        assert_eq!(l.quantile(0.5), Duration::from_nanos(500));
        assert_eq!(l.quantile(0.99), Duration::from_nanos(990));
        assert_eq!(l.quantile(0.999), Duration::from_nanos(999));
        assert_eq!(l.quantile(1.0), Duration::from_nanos(1000));
        assert_eq!(l.max(), Duration::from_nanos(1000));
        let one = Latencies::from_samples(vec![7]);
        assert_eq!(one.quantile(0.001), Duration::from_nanos(7));
        assert_eq!(Latencies::default().quantile(0.5), Duration::ZERO);
    }

    #[test]
    fn merged_rounds_are_one_sorted_sample() {
        let mut l = Latencies::from_samples(vec![5, 1, 9]);
        l.merge(Latencies::from_samples(vec![4, 8]));
        assert_eq!(l.len(), 5);
        assert_eq!(l.quantile(0.5), Duration::from_nanos(5));
        assert_eq!(l.quantile(0.2), Duration::from_nanos(1));
        assert_eq!(l.max(), Duration::from_nanos(9));
    }
}
