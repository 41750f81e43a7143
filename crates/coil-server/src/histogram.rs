//! A Prometheus histogram with fixed buckets, lock-free: what `/metrics`
//! reports for time to first token and time per output token.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds in seconds, ascending (`+Inf` is implied).
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative); the last is `+Inf`.
    counts: Vec<AtomicU64>,
    /// Sum of the observations, in nanoseconds.
    sum_ns: AtomicU64,
}

/// Time to first token: from tens of milliseconds (a cached prompt) to
/// minutes (a long prompt behind a queue).
pub const TTFT_BOUNDS: &[f64] = &[
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0,
];

/// Time per output token: milliseconds (a small model alone) to seconds
/// (a large one on a busy CPU).
pub const TPOT_BOUNDS: &[f64] = &[
    0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5,
];

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_ns: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, secs: f64) {
        let secs = if secs.is_finite() { secs.max(0.0) } else { 0.0 };
        let i = self.bounds.partition_point(|&b| b < secs);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add((secs * 1e9) as u64, Ordering::Relaxed);
    }

    /// Number of observations.
    pub fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    /// `# HELP`, `# TYPE` and the `_bucket` (cumulative), `_sum` and
    /// `_count` lines of `name`.
    pub fn render(&self, name: &str, help: &str, out: &mut String) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut total = 0;
        for (i, c) in self.counts.iter().enumerate() {
            total += c.load(Ordering::Relaxed);
            let le = match self.bounds.get(i) {
                Some(b) => format!("{b}"),
                None => "+Inf".into(),
            };
            let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {total}");
        }
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum:.6}\n{name}_count {total}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative() {
        let h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.1);
        h.observe(0.5);
        h.observe(7.0);
        h.observe(f64::NAN);
        let mut s = String::new();
        h.render("t", "help", &mut s);
        assert!(s.contains("# TYPE t histogram\n"), "{s}");
        // 0.05, 0.1 (le is inclusive) and NaN (as 0) in the first bucket.
        assert!(s.contains("t_bucket{le=\"0.1\"} 3\n"), "{s}");
        assert!(s.contains("t_bucket{le=\"1\"} 4\n"), "{s}");
        assert!(s.contains("t_bucket{le=\"+Inf\"} 5\n"), "{s}");
        assert!(s.contains("t_sum 7.650000\nt_count 5\n"), "{s}");
        assert_eq!(h.count(), 5);
    }
}
