//! Server counters, rendered in Prometheus' text format at `/metrics`.

pub use crate::http_metrics::HttpMetrics;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters (monotonic) and gauges (current values), shared between the
/// HTTP handlers and the engine thread.
#[derive(Debug, Default)]
pub struct Metrics {
    pub requests: AtomicU64,
    pub requests_failed: AtomicU64,
    pub requests_cancelled: AtomicU64,
    pub prompt_tokens: AtomicU64,
    pub prompt_tokens_cached: AtomicU64,
    pub prompt_tokens_processed: AtomicU64,
    /// Prompt tokens the forward passes took, counted as they run (the
    /// processed total is what admission promised: the prompt less its
    /// cached part; once every admitted prompt has gone in, the two agree).
    pub prompt_tokens_evaluated: AtomicU64,
    pub completion_tokens: AtomicU64,
    /// Prompt tokens found in the cache but processed again, because the
    /// nearest recurrent checkpoint lies before the shared length.
    pub prefix_tokens_recomputed: AtomicU64,
    pub cache_evictions: AtomicU64,
    /// Micro-seconds spent in the model's forward passes.
    pub busy_us: AtomicU64,
    pub decode_steps: AtomicU64,
    /// Speculative decoding: verification passes, draft tokens proposed
    /// and accepted.
    pub spec_verifications: AtomicU64,
    pub spec_drafted: AtomicU64,
    pub spec_accepted: AtomicU64,
    pub queue_length: AtomicU64,
    pub active_sequences: AtomicU64,
    pub cached_sequences: AtomicU64,
    pub cached_bytes: AtomicU64,
    /// Recurrent-state buffers: free for reuse now, and allocated so far
    /// because none was free (fresh memory mapped while serving).
    pub state_buffers_free: AtomicU64,
    pub state_buffers_allocated: AtomicU64,
    /// 1 while the idle worker still fills its reserve of state buffers.
    pub state_buffers_reserving: AtomicU64,
    /// f64 bits: tokens per second of the recent steps.
    pub prompt_tps: AtomicU64,
    pub generation_tps: AtomicU64,
    /// What the HTTP side measures: requests in flight, rejections,
    /// latency histograms.
    pub http: HttpMetrics,
}

pub(crate) fn add(c: &AtomicU64, n: usize) {
    c.fetch_add(n as u64, Ordering::Relaxed);
}

pub(crate) fn set(c: &AtomicU64, n: usize) {
    c.store(n as u64, Ordering::Relaxed);
}

pub(crate) fn set_f64(c: &AtomicU64, v: f64) {
    c.store(v.to_bits(), Ordering::Relaxed);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn get_f64(c: &AtomicU64) -> f64 {
    f64::from_bits(c.load(Ordering::Relaxed))
}

impl Metrics {
    pub fn render(&self) -> String {
        let mut out = String::new();
        let mut metric = |name: &str, kind: &str, help: &str, value: String| {
            out.push_str(&format!(
                "# HELP coil_{name} {help}\n# TYPE coil_{name} {kind}\ncoil_{name} {value}\n"
            ));
        };
        let counters = [
            (
                "requests_total",
                &self.requests,
                "Generation requests accepted.",
            ),
            (
                "requests_failed_total",
                &self.requests_failed,
                "Requests that ended with a server error.",
            ),
            (
                "requests_cancelled_total",
                &self.requests_cancelled,
                "Requests whose client went away before the end.",
            ),
            (
                "prompt_tokens_total",
                &self.prompt_tokens,
                "Prompt tokens of all requests.",
            ),
            (
                "prompt_tokens_cached_total",
                &self.prompt_tokens_cached,
                "Prompt tokens reused from the prefix cache.",
            ),
            (
                "prompt_tokens_processed_total",
                &self.prompt_tokens_processed,
                "Prompt tokens of admitted requests not taken from the cache (to run through the model).",
            ),
            (
                "prompt_tokens_evaluated_total",
                &self.prompt_tokens_evaluated,
                "Prompt tokens the model's forward passes took, counted as they run.",
            ),
            (
                "completion_tokens_total",
                &self.completion_tokens,
                "Generated tokens.",
            ),
            (
                "prefix_tokens_recomputed_total",
                &self.prefix_tokens_recomputed,
                "Prompt tokens shared with a cached sequence but processed again (no recurrent checkpoint at the shared length).",
            ),
            (
                "cache_evictions_total",
                &self.cache_evictions,
                "Cached sequences evicted (least recently used first).",
            ),
            (
                "decode_steps_total",
                &self.decode_steps,
                "Batched forward steps.",
            ),
            (
                "spec_verifications_total",
                &self.spec_verifications,
                "Speculative decoding: drafts verified (one pass each).",
            ),
            (
                "spec_draft_tokens_total",
                &self.spec_drafted,
                "Speculative decoding: draft tokens proposed.",
            ),
            (
                "spec_accepted_tokens_total",
                &self.spec_accepted,
                "Speculative decoding: draft tokens accepted.",
            ),
        ];
        for (name, c, help) in counters {
            metric(name, "counter", help, get(c).to_string());
        }
        metric(
            "state_buffers_allocated_total",
            "counter",
            "Recurrent-state buffers allocated because none was free (beyond the startup reserve).",
            get(&self.state_buffers_allocated).to_string(),
        );
        metric(
            "busy_seconds_total",
            "counter",
            "Seconds spent in forward passes.",
            format!("{:.6}", get(&self.busy_us) as f64 / 1e6),
        );
        let gauges = [
            (
                "queue_length",
                &self.queue_length,
                "Requests waiting for a free sequence slot.",
            ),
            (
                "active_sequences",
                &self.active_sequences,
                "Requests being processed or generating.",
            ),
            (
                "cached_sequences",
                &self.cached_sequences,
                "Finished sequences kept for prefix reuse.",
            ),
            (
                "cached_bytes",
                &self.cached_bytes,
                "Bytes held by cached sequences beyond the running ones (shared memory counted once).",
            ),
            (
                "state_buffers_free",
                &self.state_buffers_free,
                "Recurrent-state buffers free for reuse.",
            ),
            (
                "state_buffers_reserving",
                &self.state_buffers_reserving,
                "1 while the idle server still writes its reserve of state buffers (a benchmark waits for 0).",
            ),
        ];
        for (name, g, help) in gauges {
            metric(name, "gauge", help, get(g).to_string());
        }
        metric(
            "prompt_tokens_per_second",
            "gauge",
            "Prompt processing speed over recent steps.",
            format!("{:.3}", get_f64(&self.prompt_tps)),
        );
        metric(
            "generation_tokens_per_second",
            "gauge",
            "Generation speed (all sequences together) over recent steps.",
            format!("{:.3}", get_f64(&self.generation_tps)),
        );
        self.http.render(
            get(&self.active_sequences),
            get(&self.cached_bytes),
            &mut out,
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_prometheus_text() {
        let m = Metrics::default();
        add(&m.requests, 3);
        set_f64(&m.generation_tps, 12.5);
        let text = m.render();
        assert!(text.contains("# TYPE coil_requests_total counter\ncoil_requests_total 3\n"));
        assert!(text.contains("coil_generation_tokens_per_second 12.500\n"));
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.split_once(' ').unwrap();
            assert!(name.starts_with("coil_"));
            value.parse::<f64>().unwrap();
        }
    }
}
