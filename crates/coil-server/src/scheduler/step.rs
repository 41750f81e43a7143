//! One batched forward pass over every active request: plan what each
//! request feeds (a prompt chunk within the step's token budget, or its
//! last sampled token), run it through the engine, and hand the logits to
//! [`super::finish`].

use super::plan::{split, Need};
use super::{Event, Worker};
use crate::metrics;
use coil::engine::{BatchEntry, EngineError, Numerics};
use coil::models::LogitRows;
use std::time::Instant;

/// One request's part of a step.
pub(super) struct Planned {
    /// Index in `Worker::active`.
    pub(super) active: usize,
    pub(super) tokens: Vec<u32>,
    pub(super) rows: LogitRows,
    /// A prompt chunk (else one generated token).
    pub(super) is_prompt: bool,
    /// Draft tokens after the generated one (see [`super::speculate`]).
    pub(super) draft: Vec<u32>,
}

impl Worker {
    /// One batched forward pass over every active request.
    pub(super) fn step(&mut self) {
        let mut plan = self.plan();
        self.add_drafts(&mut plan);
        if plan.is_empty() {
            return;
        }
        self.make_room(plan.len(), true);
        let t0 = Instant::now();
        let result = self.forward(&plan);
        let secs = t0.elapsed().as_secs_f64();
        metrics::add(&self.metrics.decode_steps, 1);
        metrics::add(&self.metrics.busy_us, (secs * 1e6) as usize);
        let logits = match result {
            Ok(l) => l,
            Err(e) => return self.fail(&plan, &e.to_string()),
        };
        self.count_rates(&plan, secs);
        self.after_step(plan, logits);
    }

    /// Runs the step's entries; returns each one's logits, in plan order.
    ///
    /// Generated tokens always go through the batch-invariant kernels
    /// ([`Numerics::BatchInvariant`]): a sequence's logits are then bit for
    /// bit those of decoding it alone, however many others share the step.
    /// Prompt chunks take the fast kernels (GEMM, chunked scans) in a call
    /// of their own, unless `batch_invariant` is set: then they join the
    /// same invariant call, and a request's whole output no longer depends
    /// on the load, on how its prompt was cut into chunks or on where it
    /// resumed from the prefix cache (every state is the token-by-token
    /// one), at the cost of slower prompt processing.
    fn forward<'p>(&mut self, plan: &'p [Planned]) -> Result<Vec<Vec<f32>>, EngineError> {
        let active = &self.active;
        let entry = |p: &'p Planned| BatchEntry {
            seq: active[p.active].seq,
            tokens: &p.tokens,
            logits: p.rows,
        };
        if self.cfg.batch_invariant {
            let entries: Vec<BatchEntry> = plan.iter().map(entry).collect();
            return self
                .engine
                .decode_batch_with(&entries, Numerics::BatchInvariant);
        }
        let mut out = vec![Vec::new(); plan.len()];
        for (prompt, numerics) in [(true, Numerics::Fast), (false, Numerics::BatchInvariant)] {
            let idx: Vec<usize> = (0..plan.len())
                .filter(|&i| plan[i].is_prompt == prompt)
                .collect();
            if idx.is_empty() {
                continue;
            }
            let entries: Vec<BatchEntry> = idx.iter().map(|&i| entry(&plan[i])).collect();
            let logits = self.engine.decode_batch_with(&entries, numerics)?;
            for (i, l) in idx.into_iter().zip(logits) {
                out[i] = l;
            }
        }
        Ok(out)
    }

    /// What each active request feeds this step (see [`super::plan`]): its
    /// sampled token, or the next chunk of its prompt within the step's
    /// token budget. Generated tokens come first in the plan.
    fn plan(&self) -> Vec<Planned> {
        let needs: Vec<Need> = self
            .active
            .iter()
            .map(|a| {
                if a.next.is_some() {
                    return Need::Token;
                }
                if a.done >= a.prompt.len() {
                    return Need::Idle;
                }
                // The last prompt token goes in a call of its own, so that a
                // checkpoint lands right before it: the same prompt sent
                // again then reuses all but that token.
                let n = a.prompt.len();
                let mut target = if a.done + 1 < n { n - 1 } else { n };
                // End a call at the next mark: a checkpoint lands there.
                if let Some(&m) = a.marks.iter().find(|&&m| m > a.done && m < target) {
                    target = m;
                }
                Need::Prompt(target - a.done)
            })
            .collect();
        let takes = split(self.cfg.prefill_chunk, &needs);
        let mut plan = Vec::new();
        for (i, (a, need)) in self.active.iter().zip(&needs).enumerate() {
            if let (Need::Token, Some(t)) = (need, a.next) {
                plan.push(Planned {
                    active: i,
                    tokens: vec![t],
                    rows: LogitRows::Last,
                    is_prompt: false,
                    draft: Vec::new(),
                });
            }
        }
        for (i, (a, &take)) in self.active.iter().zip(&takes).enumerate() {
            if needs[i] == Need::Token || take == 0 {
                continue;
            }
            let end = a.done + take == a.prompt.len();
            let rows = if end && a.max_tokens > 0 {
                LogitRows::Last
            } else {
                LogitRows::None
            };
            plan.push(Planned {
                active: i,
                tokens: a.prompt[a.done..a.done + take].to_vec(),
                rows,
                is_prompt: true,
                draft: Vec::new(),
            });
        }
        plan
    }

    /// A failed pass may leave its sequences half-advanced: fail those
    /// requests and clear their slots.
    fn fail(&mut self, plan: &[Planned], err: &str) {
        let msg = format!("the model failed: {err}");
        let mut idx: Vec<usize> = plan.iter().map(|p| p.active).collect();
        idx.sort_unstable();
        for &i in idx.iter().rev() {
            let a = self.active.remove(i);
            metrics::add(&self.metrics.requests_failed, 1);
            let _ = a.events.send(Event::Error(msg.clone()));
            self.release(a.seq, false);
        }
    }

    /// Steps that processed prompt tokens count for the prompt speed;
    /// steps that only generated count for the generation speed.
    fn count_rates(&mut self, plan: &[Planned], secs: f64) {
        let n_prompt: usize = plan
            .iter()
            .filter(|p| p.is_prompt)
            .map(|p| p.tokens.len())
            .sum();
        if n_prompt > 0 {
            self.rates.prompt += n_prompt;
            self.rates.prompt_secs += secs;
        } else {
            self.rates.gen += plan.len();
            self.rates.gen_secs += secs;
        }
        if self.rates.prompt_secs + self.rates.gen_secs >= 1.0 {
            self.publish_rates();
        }
    }
}
