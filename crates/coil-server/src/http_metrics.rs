//! What routers and autoscalers read from `/metrics` beside the engine's
//! counters: requests waiting and running, the prefix cache's memory over
//! its limit, rejected and timed-out requests, and histograms of time to
//! first token and time per output token — all measured where the client
//! sees them, at the HTTP side.

use crate::api::Usage;
use crate::histogram::{Histogram, TPOT_BOUNDS, TTFT_BOUNDS};
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Debug)]
pub struct HttpMetrics {
    /// Generation requests admitted and not yet answered (queued in the
    /// server, waiting for a slot, or generating).
    pub in_flight: AtomicU64,
    /// Refused with 503 (queue full or shutting down).
    pub rejected: AtomicU64,
    /// Ended by `--request-timeout`.
    pub timed_out: AtomicU64,
    /// The prefix cache's byte budget (`--cache-mib`).
    pub cache_limit_bytes: AtomicU64,
    /// Seconds from the request's arrival to its first generated token.
    pub ttft: Histogram,
    /// Seconds per generated token after the first.
    pub tpot: Histogram,
}

impl Default for HttpMetrics {
    fn default() -> Self {
        HttpMetrics {
            in_flight: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            cache_limit_bytes: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BOUNDS),
            tpot: Histogram::new(TPOT_BOUNDS),
        }
    }
}

impl HttpMetrics {
    /// Requests admitted but not holding a sequence slot: in flight less
    /// `running` (the engine's active sequences, which lags by a step).
    pub fn waiting(&self, running: u64) -> u64 {
        self.in_flight
            .load(Ordering::Relaxed)
            .saturating_sub(running)
    }

    /// Appends the gauges, counters and histograms in Prometheus' text
    /// format; `running` and `cached_bytes` are the engine's gauges.
    pub fn render(&self, running: u64, cached_bytes: u64, out: &mut String) {
        let mut line = |name: &str, kind: &str, help: &str, value: String| {
            let _ = writeln!(
                out,
                "# HELP coil_{name} {help}\n# TYPE coil_{name} {kind}\ncoil_{name} {value}"
            );
        };
        let limit = self.cache_limit_bytes.load(Ordering::Relaxed);
        line(
            "requests_running",
            "gauge",
            "Requests holding a sequence slot (processing the prompt or generating).",
            running.to_string(),
        );
        line(
            "requests_waiting",
            "gauge",
            "Requests admitted and waiting for a sequence slot.",
            self.waiting(running).to_string(),
        );
        line(
            "cache_limit_bytes",
            "gauge",
            "The prefix cache's memory budget (coil_cached_bytes is what it holds).",
            limit.to_string(),
        );
        let usage = if limit > 0 {
            cached_bytes as f64 / limit as f64
        } else {
            0.0
        };
        line(
            "cache_usage_ratio",
            "gauge",
            "coil_cached_bytes over coil_cache_limit_bytes.",
            format!("{usage:.6}"),
        );
        line(
            "requests_rejected_total",
            "counter",
            "Requests refused with 503 (queue full or shutting down).",
            self.rejected.load(Ordering::Relaxed).to_string(),
        );
        line(
            "requests_timed_out_total",
            "counter",
            "Requests ended by the server's request timeout.",
            self.timed_out.load(Ordering::Relaxed).to_string(),
        );
        self.ttft.render(
            "coil_time_to_first_token_seconds",
            "Seconds from a request's arrival to its first generated token.",
            out,
        );
        self.tpot.render(
            "coil_time_per_output_token_seconds",
            "Seconds per generated token after the first, per request.",
            out,
        );
    }
}

/// One admitted request: counted in flight until dropped, and timed.
#[derive(Debug)]
pub struct InFlight {
    m: Arc<crate::metrics::Metrics>,
    start: Instant,
    first: Option<Instant>,
}

impl InFlight {
    /// Counts a request in flight from `start` (its arrival).
    pub fn new(m: Arc<crate::metrics::Metrics>, start: Instant) -> Self {
        m.http.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            m,
            start,
            first: None,
        }
    }

    /// The first output reached the client's side (text, or the end).
    pub fn first_output(&mut self) {
        if self.first.is_none() {
            let now = Instant::now();
            self.first = Some(now);
            self.m
                .http
                .ttft
                .observe(now.duration_since(self.start).as_secs_f64());
        }
    }

    /// The request was ended by the request timeout.
    pub fn timed_out(&self) {
        self.m.http.timed_out.fetch_add(1, Ordering::Relaxed);
    }

    /// The request ended normally with `usage`.
    pub fn done(&mut self, usage: &Usage) {
        if usage.completion_tokens == 0 {
            return;
        }
        self.first_output();
        if let Some(first) = self.first {
            if usage.completion_tokens > 1 {
                let secs = first.elapsed().as_secs_f64();
                self.m
                    .http
                    .tpot
                    .observe(secs / (usage.completion_tokens - 1) as f64);
            }
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.m.http.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}
