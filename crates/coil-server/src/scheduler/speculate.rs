//! Speculative decoding inside continuous batching (`coil serve --spec
//! ngram|mtp|draft`): a generating request that has a draft feeds its next token
//! *and* the drafts in the step's one batched pass, beside every other
//! request's rows; then it samples position by position and keeps what the
//! draws confirm (`Engine::spec_commit` cuts the rest of its own sequence:
//! drafts never touch another sequence). The tokens are those it would
//! generate without speculation. With `mtp` the model's own NextN block
//! drafts for every speculating request of the step side by side (one
//! row per request per draft step); with a draft model (`-md`) it drafts
//! for each in turn, in the draft model's sequence of the same id.

use super::finish::{advance, sample, Outcome};
use super::step::Planned;
use super::{Event, Worker};
use crate::metrics;
use coil::engine::draft::{SpecKind, SpecParams};
use coil::engine::speculative::{DraftSource, Speculator};
use coil::models::LogitRows;

/// A request's speculator: n-gram drafts, the model's NextN block or the
/// scheduler's draft model, adaptive length.
pub(super) fn speculator(p: SpecParams) -> Speculator {
    match p.kind {
        SpecKind::Ngram => Speculator::new(
            Box::new(coil::engine::draft::NgramDrafter::new(p.ngram_max)),
            p.draft_max,
        ),
        SpecKind::Nextn => Speculator::with_source(DraftSource::Nextn, p.draft_max),
        SpecKind::Model => Speculator::with_source(DraftSource::SharedModel, p.draft_max),
    }
}

impl Worker {
    /// Adds drafts behind the generated token of each speculating request
    /// that has one, and starts its verification.
    pub(super) fn add_drafts(&mut self, plan: &mut [Planned]) {
        // (plan index, sequence, next token, draft length) of the requests
        // the NextN block drafts for, together.
        let mut nextn = Vec::new();
        for (i, p) in plan.iter_mut().enumerate().filter(|(_, p)| !p.is_prompt) {
            let a = &mut self.active[p.active];
            let (Some(sp), Some(&next)) = (a.spec.as_mut(), p.tokens.first()) else {
                continue;
            };
            // At most the tokens the request may still emit after `next`.
            let left = a.max_tokens.saturating_sub(a.usage.completion_tokens);
            let Ok(room) = self.engine.spec_room(a.seq) else {
                continue;
            };
            let k = sp.want(room.min(left.saturating_sub(1)));
            if k == 0 {
                continue;
            }
            if matches!(sp.source, DraftSource::Nextn) {
                nextn.push((i, a.seq, next, k));
                continue;
            }
            let seq = a.seq;
            let draft = match (&sp.source, self.draft.as_mut()) {
                (DraftSource::SharedModel, Some(m)) => match self.engine.mem.seq_tokens(seq) {
                    Ok(history) => m.draft(seq, history, next, k),
                    Err(e) => Err(e.into()),
                },
                _ => sp.draft_k(&mut self.engine, seq, next, k),
            };
            // A failed draft is no draft: the request decodes plainly.
            let Ok(draft) = draft else {
                continue;
            };
            self.start_verification(p, draft);
        }
        if nextn.is_empty() {
            return;
        }
        let seqs: Vec<_> = nextn.iter().map(|&(_, s, t, k)| (s, t, k)).collect();
        // A failed draft is no draft: those requests decode plainly.
        let Ok(drafts) = self.engine.draft_nextn(&seqs) else {
            return;
        };
        for ((i, ..), draft) in nextn.into_iter().zip(drafts) {
            self.start_verification(&mut plan[i], draft);
        }
    }

    /// Puts `draft` behind a request's next token and starts its
    /// verification (nothing for an empty draft).
    fn start_verification(&mut self, p: &mut Planned, mut draft: Vec<u32>) {
        let a = &mut self.active[p.active];
        if let Some(c) = a.constraint.as_mut() {
            // Only what the constraint allows is worth verifying; its masks
            // for the verified positions are computed beside the pass.
            let n = c.propose(&draft);
            draft.truncate(n);
        }
        if draft.is_empty() || self.engine.spec_begin(a.seq).is_err() {
            return;
        }
        p.tokens.extend_from_slice(&draft);
        p.rows = LogitRows::All;
        p.draft = draft;
    }

    /// A request that verified drafts: samples from each position's logits
    /// in turn while the draws equal the drafts, streams every sampled
    /// token, and keeps the fed tokens up to the first that differs.
    pub(super) fn verified(&mut self, p: &Planned, rows: &[f32]) -> Outcome {
        let n_vocab = self.engine.n_vocab();
        let a = &mut self.active[p.active];
        a.next = None;
        let d = &p.draft;
        let mut keep = d.len() + 1;
        let mut out = Outcome::Continue;
        for j in 0..=d.len() {
            match sample(a, &self.tok, &rows[j * n_vocab..(j + 1) * n_vocab], j) {
                Outcome::Continue if j < d.len() && a.next == Some(d[j]) => {
                    a.next = None;
                }
                o => {
                    keep = j + 1;
                    out = o;
                    break;
                }
            }
        }
        let seq = a.seq;
        match self.engine.spec_commit(seq, keep) {
            Ok(c) => {
                let a = &mut self.active[p.active];
                if let Some(sp) = a.spec.as_mut() {
                    sp.observe(d.len(), keep - 1, c.replayed);
                }
                a.usage.draft_tokens += d.len();
                a.usage.accepted_draft_tokens += keep - 1;
                let m = &self.metrics;
                metrics::add(&m.spec_verifications, 1);
                metrics::add(&m.spec_drafted, d.len());
                metrics::add(&m.spec_accepted, keep - 1);
                // The constraint goes back to the accepted drafts, as the
                // sequence did, then past the token sampled after them.
                match (out, a.constraint.as_mut()) {
                    (Outcome::Continue, Some(c)) => match c.settle(keep - 1) {
                        Ok(()) => advance(a),
                        Err(e) => {
                            let _ = a.events.send(Event::Error(e.to_string()));
                            Outcome::Failed
                        }
                    },
                    (out, _) => out,
                }
            }
            Err(e) => {
                let a = &mut self.active[p.active];
                metrics::add(&self.metrics.requests_failed, 1);
                let _ = a
                    .events
                    .send(Event::Error(format!("the model failed: {e}")));
                Outcome::Gone
            }
        }
    }
}
