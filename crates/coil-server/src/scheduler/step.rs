//! One batched forward pass over every active request: plan what each
//! request feeds (a prompt chunk within the step's token budget, or its
//! last sampled token), run it through the engine, and hand the logits to
//! [`super::finish`].

use super::plan::{split, Need};
use super::{Event, Worker};
use crate::metrics;
use coil::engine::constraint::{beside, Constraint};
use coil::engine::{BatchEntry, BatchLogits, EngineError, Numerics};
use coil::memory::SeqId;
use coil::models::LogitRows;
use std::time::Instant;

/// A step's logits: planned request `i`'s rows are entry `at[i].1` of
/// call `at[i].0` (the prompt chunks' call and the generated tokens'), read
/// in place.
pub(super) struct StepLogits {
    pub(super) calls: Vec<BatchLogits>,
    pub(super) at: Vec<(usize, usize)>,
}

impl StepLogits {
    pub(super) fn rows(&self, i: usize) -> &[f32] {
        let (c, k) = self.at[i];
        self.calls[c].rows(k)
    }
}

/// One request's part of a step.
pub(super) struct Planned {
    /// Index in `Worker::active`.
    pub(super) active: usize,
    pub(super) tokens: Vec<u32>,
    pub(super) rows: LogitRows,
    /// A prompt chunk (else one generated token).
    pub(super) is_prompt: bool,
    /// Goes in the step's first call (prompt chunks before their last
    /// token, [`Numerics::CheapInvariant`]); else in the call of the
    /// generated tokens ([`Numerics::BatchInvariant`], see
    /// [`Worker::forward`]).
    pub(super) fast: bool,
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
        // The constraints' next masks are computed on another thread while
        // the pass runs (they depend on the tokens sampled so far only); a
        // failure shows again, for its request alone, when the mask is
        // asked for.
        let mut held: Vec<(usize, Constraint)> = self
            .active
            .iter_mut()
            .enumerate()
            .filter_map(|(i, a)| a.constraint.take().map(|c| (i, c)))
            .collect();
        let (result, _) = {
            let mut cs: Vec<&mut Constraint> = held.iter_mut().map(|(_, c)| c).collect();
            beside(&mut cs, || self.forward(&plan))
        };
        for (i, c) in held {
            self.active[i].constraint = Some(c);
        }
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
    /// Prompt chunks go in a call of their own before it, with
    /// [`Numerics::CheapInvariant`]: attention rows independent of each
    /// other, the weight products through the GEMM wherever it gives each
    /// token its one-token bits, the chunked recurrences — batch-invariant
    /// too for a model without chunked recurrences whose weights are all in
    /// such formats (`Engine::prompts_invariant`), so that a request's output
    /// depends neither on the load, nor on how its prompt was cut into
    /// chunks, nor on where it resumed from the prefix cache (every state
    /// is the token-by-token one). A prompt's last token (alone in its
    /// call, so that a checkpoint lands before it) joins the generated
    /// tokens' call, which runs anyway: one more read of the weights saved,
    /// and a prompt whose chunk ends this step gets its first token in the
    /// same step. With `batch_invariant` set, everything goes in one
    /// [`Numerics::BatchInvariant`] call: batch-invariant for every model,
    /// at the cost of per-row products for the prompts of the others.
    fn forward(&mut self, plan: &[Planned]) -> Result<StepLogits, EngineError> {
        let seqs: Vec<SeqId> = plan.iter().map(|p| self.active[p.active].seq).collect();
        let entry = |i: usize| BatchEntry {
            seq: seqs[i],
            tokens: &plan[i].tokens,
            logits: plan[i].rows,
        };
        if self.cfg.batch_invariant {
            let entries: Vec<BatchEntry> = (0..plan.len()).map(entry).collect();
            let l = self
                .engine
                .decode_batch_logits(&entries, Numerics::BatchInvariant)?;
            return Ok(StepLogits {
                calls: vec![l],
                at: (0..plan.len()).map(|i| (0, i)).collect(),
            });
        }
        // Where a fast chunk stops before its prompt's last token or at a
        // mark, its checkpoint is pinned before the second call moves the
        // sequence on (a one-token call takes none of its own: see `pin`).
        let pins: Vec<(SeqId, usize)> = plan
            .iter()
            .zip(&seqs)
            .filter(|(p, _)| p.fast)
            .filter_map(|(p, &seq)| {
                let a = &self.active[p.active];
                let at = a.done + p.tokens.len();
                a.pins_at(at).then_some((seq, at))
            })
            .collect();
        // With `chunk_align`, a call that ends a prompt (but its last token)
        // past a chunk boundary stops at the last one first, where the
        // engine takes a checkpoint (see `Engine::scan_chunk`): a longer
        // prompt that shares this one (the next turn of a conversation)
        // resumes there.
        let mut pins = pins;
        if let Some(c) = self.chunk_align {
            for (p, &seq) in plan.iter().zip(&seqs).filter(|(p, _)| p.fast) {
                let a = &self.active[p.active];
                let at = a.done + p.tokens.len();
                let tail = at / c * c;
                if at + 1 == a.prompt.len()
                    && a.done.is_multiple_of(c)
                    && tail > a.done
                    && tail < at
                {
                    pins.push((seq, tail));
                }
            }
        }
        let mut out = StepLogits {
            calls: Vec::new(),
            at: vec![(0, 0); plan.len()],
        };
        for (fast, numerics) in [
            (true, Numerics::CheapInvariant),
            (false, Numerics::BatchInvariant),
        ] {
            let idx: Vec<usize> = (0..plan.len()).filter(|&i| plan[i].fast == fast).collect();
            if idx.is_empty() {
                continue;
            }
            let entries: Vec<BatchEntry> = idx.iter().map(|&i| entry(i)).collect();
            let logits = self.engine.decode_batch_logits(&entries, numerics)?;
            for (k, i) in idx.into_iter().enumerate() {
                out.at[i] = (out.calls.len(), k);
            }
            out.calls.push(logits);
            if fast {
                for &(seq, at) in &pins {
                    self.pin(seq, at);
                }
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
        let mut takes = split(self.cfg.prefill_chunk, &needs);
        if let Some(c) = self.chunk_align {
            // A prompt call ends at a chunk boundary, or where its prompt's
            // call ends: the first prompt of the step goes up to the next
            // boundary however small its share (less than a chunk more),
            // the others wait for a share that reaches one.
            let mut first = true;
            for ((a, need), take) in self.active.iter().zip(&needs).zip(&mut takes) {
                let Need::Prompt(want) = *need else { continue };
                if *take == 0 {
                    continue;
                }
                *take = align_take(a.done, *take, want, c, first);
                first &= *take == 0;
            }
        }
        let mut plan = Vec::new();
        for (i, (a, need)) in self.active.iter().zip(&needs).enumerate() {
            if let (Need::Token, Some(t)) = (need, a.next) {
                plan.push(Planned {
                    active: i,
                    tokens: vec![t],
                    rows: LogitRows::Last,
                    is_prompt: false,
                    fast: false,
                    draft: Vec::new(),
                });
            }
        }
        for (i, (a, &take)) in self.active.iter().zip(&takes).enumerate() {
            if needs[i] == Need::Token || take == 0 {
                continue;
            }
            let n = a.prompt.len();
            let end = a.done + take == n;
            let rows = |end: bool| {
                if end && a.max_tokens > 0 {
                    LogitRows::Last
                } else {
                    LogitRows::None
                }
            };
            plan.push(Planned {
                active: i,
                tokens: a.prompt[a.done..a.done + take].to_vec(),
                rows: rows(end),
                is_prompt: true,
                fast: !end,
                draft: Vec::new(),
            });
            // The chunk stops right before the last token: that token
            // follows in the step's second call (after the first call's
            // checkpoint), beside the generated tokens. In one invariant
            // call (`batch_invariant`) a sequence can appear only once.
            if a.done + take + 1 == n && !self.cfg.batch_invariant {
                plan.push(Planned {
                    active: i,
                    tokens: vec![a.prompt[n - 1]],
                    rows: rows(true),
                    is_prompt: true,
                    fast: false,
                    draft: Vec::new(),
                });
            }
        }
        plan
    }

    /// A failed pass may leave its sequences half-advanced: fail those
    /// requests and clear their slots.
    fn fail(&mut self, plan: &[Planned], err: &str) {
        let msg = format!("the model failed: {err}");
        let mut idx: Vec<usize> = plan.iter().map(|p| p.active).collect();
        idx.sort_unstable();
        idx.dedup(); // a prompt's chunk and its last token
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
        metrics::add(&self.metrics.prompt_tokens_evaluated, n_prompt);
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

/// Prompt tokens a request at `done` feeds a step under chunk alignment
/// (see `Worker::chunk_align`): `take` of the `want` it needs, cut back to
/// the last multiple of `c`, unless it takes them all; where that is none,
/// up to the next multiple (`first`: the step's first prompt) or nothing.
fn align_take(done: usize, take: usize, want: usize, c: usize, first: bool) -> usize {
    if take >= want {
        return want;
    }
    let end = (done + take) / c * c;
    if end > done {
        end - done
    } else if first {
        (c - done % c).min(want)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::align_take;

    #[test]
    fn aligned_takes_end_on_chunk_boundaries() {
        // the whole rest, whatever its end
        assert_eq!(align_take(64, 100, 37, 64, false), 37);
        // cut back to a boundary
        assert_eq!(align_take(0, 100, 500, 64, false), 64);
        assert_eq!(align_take(64, 200, 500, 64, false), 192);
        // a share short of the next boundary: the first prompt goes there,
        // the others wait
        assert_eq!(align_take(64, 16, 500, 64, true), 64);
        assert_eq!(align_take(64, 16, 500, 64, false), 0);
        assert_eq!(align_take(64, 16, 30, 64, true), 30);
    }
}
