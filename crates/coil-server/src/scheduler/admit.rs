//! Admission: requests enter the queue, take a slot (resuming from the
//! longest cached prefix) while fewer than `parallel` run, and leave early
//! when their client goes away.

use super::finish::log_request;
use super::{seq_len_or_zero, Active, Event, GenRequest, Worker};
use crate::api::Usage;
use crate::metrics;
use coil::engine::generate::StopMatcher;
use coil::engine::sampling::Sampler;
use std::time::Instant;

impl Worker {
    pub(super) fn enqueue(&mut self, r: GenRequest) {
        metrics::add(&self.metrics.requests, 1);
        self.queue.push_back(r);
    }

    /// Gives `req` a slot holding the longest cached prefix of its prompt.
    pub(super) fn admit(&mut self, mut req: GenRequest) {
        if req.n == 0 || req.n > self.cfg.parallel {
            metrics::add(&self.metrics.requests_failed, 1);
            let msg = format!(
                "n must be between 1 and {} (the server's parallel sequences), got {}",
                self.cfg.parallel, req.n
            );
            let _ = req.events.send(Event::Error(msg));
            return;
        }
        // a new sequence's state may need a buffer
        self.make_room(1, false);
        match self.prepare(&mut req) {
            Ok((seq, cached, branch)) => {
                let mut marks = std::mem::take(&mut req.marks);
                marks.push(branch);
                if let Some(c) = self.chunk_align {
                    // A call may end only at a chunk boundary.
                    marks.iter_mut().for_each(|m| *m = *m / c * c);
                }
                marks.retain(|&m| m > cached && m + 1 < req.prompt.len());
                marks.sort_unstable();
                marks.dedup();
                let n = req.prompt.len();
                let m = &self.metrics;
                metrics::add(&m.prompt_tokens, n);
                metrics::add(&m.prompt_tokens_cached, cached);
                metrics::add(&m.prompt_tokens_processed, n - cached);
                let mut sampler = Sampler::new(req.params);
                for &t in &req.prompt {
                    sampler.accept(t);
                }
                self.busy[seq] = true;
                self.active.push(Active {
                    seq,
                    choice: 0,
                    forks: req.n - 1,
                    logprobs: req.logprobs,
                    events: req.events,
                    done: seq_len_or_zero(&self.engine, seq),
                    prompt: req.prompt,
                    max_tokens: req.max_tokens,
                    stop_at_eos: req.stop_at_eos,
                    sampler,
                    decoder: self.tok.stream_decoder(),
                    stops: StopMatcher::new(&req.stop),
                    next: None,
                    spec: self.cfg.spec.map(super::speculate::speculator),
                    constraint: req.constraint.take(),
                    usage: Usage {
                        prompt_tokens: n,
                        cached_tokens: cached,
                        ..Default::default()
                    },
                    id: self.n_admitted,
                    started: Instant::now(),
                    first_token: None,
                    marks,
                });
                self.n_admitted += 1;
            }
            Err(msg) => {
                metrics::add(&self.metrics.requests_failed, 1);
                let _ = req.events.send(Event::Error(msg));
            }
        }
        // A parked sequence may have been adopted, forked (what the fork
        // shares is now a running sequence's) or evicted.
        self.refresh_cache_bytes();
    }

    /// Cancels requests whose client is gone: queued ones are dropped,
    /// running ones give their slot back at once (their sequence is
    /// parked: what it processed stays reusable).
    pub(super) fn drop_gone(&mut self) {
        let before = self.queue.len();
        self.queue.retain(|r| !r.events.is_closed());
        let n = before - self.queue.len();
        metrics::add(&self.metrics.requests_cancelled, n);
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].events.is_closed() {
                let a = self.active.remove(i);
                metrics::add(&self.metrics.requests_cancelled, 1);
                metrics::add(&self.metrics.completion_tokens, a.usage.completion_tokens);
                if self.cfg.log_requests {
                    log_request(&a, "client gone");
                }
                self.release(a.seq, true);
            } else {
                i += 1;
            }
        }
    }
}
