//! After a pass: each request's prompt progress and pinned checkpoints,
//! sampling and streaming its next token, and ending the requests that
//! stop (their sequences parked for the prefix cache).

use super::step::{Planned, StepLogits};
use super::{Active, Event, Worker};
use crate::api::{FinishReason, Usage};
use crate::metrics;
use coil::engine::logprobs::token_logprob;
use coil::models::LogitRows;
use coil::tokenizer::Tokenizer;
use std::time::Instant;

pub(super) enum Outcome {
    Continue,
    Finished(FinishReason, bool),
    Gone,
    /// The request failed (its output constraint); the client is told.
    Failed,
}

impl Worker {
    /// Applies a pass's logits (one entry per planned request).
    pub(super) fn after_step(&mut self, plan: Vec<Planned>, logits: StepLogits) {
        let mut ended: Vec<(usize, Option<(FinishReason, bool)>)> = Vec::new();
        let mut pins = Vec::new();
        for (i, p) in plan.into_iter().enumerate() {
            let row = logits.rows(i);
            if !p.draft.is_empty() {
                match self.verified(&p, row) {
                    Outcome::Continue => {}
                    Outcome::Finished(r, flush) => ended.push((p.active, Some((r, flush)))),
                    Outcome::Gone => ended.push((p.active, None)),
                    Outcome::Failed => {
                        metrics::add(&self.metrics.requests_failed, 1);
                        ended.push((p.active, None));
                    }
                }
                continue;
            }
            let a = &mut self.active[p.active];
            if p.is_prompt {
                a.done += p.tokens.len();
                // (a fast chunk's is pinned already: `forward`)
                if a.pins_at(a.done) {
                    pins.push((a.seq, a.done));
                }
            } else {
                a.next = None;
            }
            // The prompt is in: its other choices fork from it and draw
            // from the same logits.
            let mut choices = vec![p.active];
            if a.done == a.prompt.len() && a.forks > 0 {
                match self.fork_choices(p.active) {
                    Ok(forks) => choices.extend(forks),
                    Err(msg) => {
                        metrics::add(&self.metrics.requests_failed, 1);
                        let _ = self.active[p.active].events.send(Event::Error(msg));
                        ended.push((p.active, None));
                        continue;
                    }
                }
            }
            for c in choices {
                let a = &mut self.active[c];
                if a.done == a.prompt.len() && a.max_tokens == 0 {
                    ended.push((c, Some((FinishReason::Length, true))));
                    continue;
                }
                if p.rows == LogitRows::None {
                    continue;
                }
                let out = match sample(a, &self.tok, row, 0) {
                    Outcome::Continue => advance(a),
                    o => o,
                };
                match out {
                    Outcome::Continue => {}
                    Outcome::Finished(reason, flush) => ended.push((c, Some((reason, flush)))),
                    Outcome::Gone => ended.push((c, None)),
                    Outcome::Failed => {
                        metrics::add(&self.metrics.requests_failed, 1);
                        ended.push((c, None));
                    }
                }
            }
        }
        for c in logits.calls {
            self.engine.recycle(c);
        }
        for (seq, pos) in pins {
            self.pin(seq, pos);
        }
        self.end(ended);
    }

    /// Forks the other choices of active request `src`, whose prompt is
    /// in, each into a slot of its own (copy-free: the forks share the
    /// prompt's memory until they write); returns their active indices.
    fn fork_choices(&mut self, src: usize) -> Result<Vec<usize>, String> {
        let forks = std::mem::take(&mut self.active[src].forks);
        let mut out = Vec::with_capacity(forks);
        for k in 1..=forks {
            let seq = self.active[src].seq;
            let dst = self
                .take_slot(None)
                .ok_or_else(|| format!("no sequence slot is free for choice {k}"))?;
            self.engine
                .seq_fork(seq, dst)
                .map_err(|e| format!("forking choice {k}: {e}"))?;
            self.busy[dst] = true;
            let a = &self.active[src];
            let seed = a.sampler.params.seed.wrapping_add(k as u64);
            let fork = Active {
                seq: dst,
                choice: k,
                forks: 0,
                logprobs: a.logprobs,
                events: a.events.clone(),
                prompt: a.prompt.clone(),
                done: a.done,
                max_tokens: a.max_tokens,
                stop_at_eos: a.stop_at_eos,
                sampler: a.sampler.reseeded(seed),
                decoder: self.tok.stream_decoder(),
                stops: a.stops.clone(),
                next: None,
                spec: self.cfg.spec.map(super::speculate::speculator),
                // Each choice advances a copy of the prompt's constraint.
                constraint: a.constraint.as_ref().map(|c| c.fork()),
                usage: Usage {
                    prompt_tokens: a.usage.prompt_tokens,
                    cached_tokens: a.usage.cached_tokens,
                    ..Default::default()
                },
                id: a.id,
                started: a.started,
                first_token: None,
                marks: Vec::new(),
            };
            self.active.push(fork);
            out.push(self.active.len() - 1);
        }
        Ok(out)
    }

    /// Ends the requests `ended` (active index; how, or `None` when the
    /// client is gone): flushes their text, parks their sequences, and
    /// tells the clients once the counters are current.
    fn end(&mut self, mut ended: Vec<(usize, Option<(FinishReason, bool)>)>) {
        ended.sort_unstable_by_key(|e| e.0);
        let mut replies = Vec::new();
        for (i, how) in ended.into_iter().rev() {
            let mut a = self.active.remove(i);
            metrics::add(&self.metrics.completion_tokens, a.usage.completion_tokens);
            match how {
                Some((reason, flush)) => {
                    let mut rest = String::new();
                    if flush {
                        rest = a.stops.push(&a.decoder.flush()).0;
                        rest.push_str(&a.stops.flush());
                    }
                    if self.cfg.log_requests {
                        log_request(&a, reason.as_str());
                    }
                    let done = Event::Done {
                        choice: a.choice,
                        finish: reason,
                        usage: a.usage,
                        stop: a.stops.matched().map(str::to_string),
                    };
                    replies.push((a.events, a.choice, rest, done));
                }
                None => {
                    metrics::add(&self.metrics.requests_cancelled, 1);
                    if self.cfg.log_requests {
                        log_request(&a, "client gone");
                    }
                }
            }
            self.release(a.seq, true);
        }
        // Counters and gauges are current before a client hears the end.
        self.gauges();
        // (in choice order: they were collected last index first)
        replies.reverse();
        for (events, choice, rest, done) in replies {
            if !rest.is_empty() {
                let _ = events.send(Event::Text {
                    choice,
                    text: rest,
                    logprobs: Vec::new(),
                });
            }
            let _ = events.send(done);
        }
    }
}

/// One line per request: prompt reuse, speed, how it ended.
pub(super) fn log_request(a: &Active, end: &str) {
    let u = &a.usage;
    let total = a.started.elapsed().as_secs_f64();
    let (ttft, gen_secs) = match a.first_token {
        Some(t) => {
            let first = t.duration_since(a.started).as_secs_f64();
            (first, total - first)
        }
        None => (total, 0.0),
    };
    let tps = if gen_secs > 0.0 && u.completion_tokens > 1 {
        (u.completion_tokens - 1) as f64 / gen_secs
    } else {
        0.0
    };
    eprintln!(
        "request {}: prompt {} tokens ({} cached, {} processed), first token after {:.3} s, {} generated ({:.1} tokens/s), {end}",
        a.id,
        u.prompt_tokens,
        u.cached_tokens,
        u.prompt_tokens - u.cached_tokens,
        ttft,
        u.completion_tokens,
        tps
    );
}

/// Samples the next token of `a` from `logits` (position `j` of a
/// speculative verification, 0 otherwise: under a constraint, among the
/// tokens its mask there allows) and streams its text. The constraint is
/// not advanced here (see [`advance`]).
pub(super) fn sample(a: &mut Active, tok: &Tokenizer, logits: &[f32], j: usize) -> Outcome {
    let mask = match a.constraint.as_mut().map(|c| c.mask(j)) {
        None => None,
        Some(Ok(m)) => Some(m),
        Some(Err(e)) => return fail(a, &e.to_string()),
    };
    let t = a.sampler.sample_masked(logits, mask);
    if a.first_token.is_none() {
        a.first_token = Some(Instant::now());
    }
    // Under a constraint an end-of-generation token is allowed only where
    // the output is complete, and ends it.
    if (a.stop_at_eos || a.constraint.is_some()) && tok.is_eog(t) {
        return Outcome::Finished(FinishReason::Stop, true);
    }
    a.sampler.accept(t);
    a.usage.completion_tokens += 1;
    let logprobs = match a.logprobs {
        Some(k) => vec![token_logprob(logits, t, k)],
        None => Vec::new(),
    };
    let (text, hit) = a.stops.push(&a.decoder.push(tok, t));
    if !text.is_empty() || !logprobs.is_empty() {
        let ev = Event::Text {
            choice: a.choice,
            text,
            logprobs,
        };
        if a.events.send(ev).is_err() {
            return Outcome::Gone;
        }
    }
    if hit {
        return Outcome::Finished(FinishReason::Stop, false);
    }
    if a.usage.completion_tokens >= a.max_tokens {
        return Outcome::Finished(FinishReason::Length, true);
    }
    a.next = Some(t);
    Outcome::Continue
}

/// Tells the client that its request failed.
fn fail(a: &mut Active, msg: &str) -> Outcome {
    let _ = a.events.send(Event::Error(msg.to_string()));
    Outcome::Failed
}

/// Advances the constraint of `a` past its sampled token; the request ends
/// when the constrained output is complete (only an end-of-generation
/// token could follow).
pub(super) fn advance(a: &mut Active) -> Outcome {
    let (Some(c), Some(t)) = (a.constraint.as_mut(), a.next) else {
        return Outcome::Continue;
    };
    if let Err(e) = c.commit(t) {
        return fail(a, &e.to_string());
    }
    if c.is_finished() {
        return Outcome::Finished(FinishReason::Stop, true);
    }
    Outcome::Continue
}
