//! Speculative decoding over exact rollback: drafted tokens (see
//! [`super::draft`]) go through the model as one micro-batch together with
//! the token before them, every position returning logits; the longest
//! prefix of the draft that sampling confirms is kept, and the sequence is
//! brought to the state after it.
//!
//! Verifying k drafts reads the weights once for k + 1 tokens. What makes it
//! possible for recurrent layers is getting the state after an arbitrary
//! accepted prefix back exactly. Three ways were open:
//!
//! 1. write the state after every verified position: k + 1 whole states
//!    (≈ 50 MB each on mamba2-370m) per verification — more memory traffic
//!    than the weights it saves;
//! 2. restore a checkpoint and replay the accepted tokens through the
//!    model: a second forward pass (weights read again) on every rejection;
//! 3. a *tape*: during the verification each Mamba-2 mixer records its scan
//!    inputs per token (xBC before and after the convolution, dt: ≈ 18 KB
//!    per token and layer on mamba2-370m, not the state's 1 MB), the state
//!    before the verification is kept by reference (the pass moves off it
//!    as it does off a checkpoint, at no extra cost), and on a rejection the
//!    accepted prefix is *refolded*: the same single-step recurrence over
//!    the same inputs from the kept state. That costs one read and one write
//!    of the state and no weights — a fraction of a decode step.
//!
//! coil uses 3 wherever every recurrent layer is a Mamba-2 mixer (Mamba-2,
//! the Granite-4.0-H / Bamba / Nemotron-H / Falcon-H1 hybrids) or a Gated
//! DeltaNet (Qwen3.5, Qwen3-Next), and 2 for the other recurrent mixers
//! (Mamba-1, Jamba, LFM2's short convolution); measurements in
//! docs/PERFORMANCE.md, "Speculative verification". Attention cells of
//! rejected tokens are simply cut. Full acceptance needs neither: the
//! state after the verification is the one wanted.
//!
//! Exactness: a micro-batch holding a sequence under verification runs
//! with batch-invariant numerics (`UBatch::invariance`: weight products
//! that give each token its one-token bits, attention rows independent of
//! each other, the token-by-token recurrences
//! instead of the chunked SSD / delta-rule forms), so each position's
//! logits and state are bit for bit those single-token decoding reaches.
//!
//! Sampling: each emitted token is drawn from the logits of its position
//! with the caller's sampler, in order, and a draft token is accepted when
//! the draw equals it. For a draft that is a single proposed token (a point
//! mass, as n-gram drafts are) this *is* the speculative sampling rule:
//! the draft x is accepted with probability p(x), and on rejection the
//! token is distributed as p with x removed, renormalised. The output
//! distribution is exactly the model's, and with the same seed the same
//! tokens come out as without speculation.

use super::draft::{AdaptiveLen, Drafter};
pub use super::draft_model::DraftModel;
use super::{BatchEntry, Engine, EngineError};
use crate::memory::{SeqId, SequenceMemory};
use crate::models::LogitRows;

/// Counters of speculative decoding.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpecCounts {
    /// Verification passes run.
    pub verifications: usize,
    /// Draft tokens proposed and verified.
    pub drafted: usize,
    /// Draft tokens accepted.
    pub accepted: usize,
    /// Tokens replayed through the model after a rejection (models whose
    /// recurrent layers cannot refold).
    pub replayed: usize,
}

impl SpecCounts {
    pub fn add(&mut self, o: &SpecCounts) {
        self.verifications += o.verifications;
        self.drafted += o.drafted;
        self.accepted += o.accepted;
        self.replayed += o.replayed;
    }

    /// Accepted ÷ drafted (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// What a commit did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Commit {
    /// Tokens the sequence holds now.
    pub len: usize,
    /// Tokens replayed through the model (0 after a refold or a full
    /// acceptance).
    pub replayed: usize,
}

impl Engine {
    /// Starts a speculative verification of `seq`: the tokens appended next
    /// (by [`Engine::decode_batch`], alone or beside other sequences) are
    /// the token after the sequence and drafts, of which
    /// [`Engine::spec_commit`] keeps a prefix. Returns the position the
    /// verification starts at.
    pub fn spec_begin(&mut self, seq: SeqId) -> Result<usize, EngineError> {
        if self.mem.spec_base(seq).is_some() {
            return Err(EngineError::Invalid(format!(
                "sequence {seq} is already being verified"
            )));
        }
        Ok(self.mem.spec_begin(seq)?)
    }

    /// Verifies `tokens` (the next token of `seq`, then the drafts) in one
    /// pass and returns the logits of every position, `[tokens.len(),
    /// n_vocab]`; then [`Engine::spec_commit`] must follow.
    pub fn spec_verify(&mut self, seq: SeqId, tokens: &[u32]) -> Result<Vec<f32>, EngineError> {
        if tokens.is_empty() {
            return Err(EngineError::Invalid("nothing to verify".into()));
        }
        self.spec_begin(seq)?;
        let entry = BatchEntry {
            seq,
            tokens,
            logits: LogitRows::All,
        };
        match self.decode_batch(&[entry]) {
            Ok(mut out) => Ok(out.pop().unwrap_or_default()),
            Err(e) => {
                // Nothing ran (decode_batch checks first): end the
                // verification where it began.
                self.spec_commit(seq, 0)?;
                Err(e)
            }
        }
    }

    /// Ends the verification of `seq` keeping the first `keep` of the
    /// tokens appended since [`Engine::spec_begin`]: attention cells of the
    /// others are cut, recurrent state is refolded to the kept length (or
    /// restored and replayed where the model cannot refold), and the
    /// checkpoint policy applies at the new length.
    pub fn spec_commit(&mut self, seq: SeqId, keep: usize) -> Result<Commit, EngineError> {
        let Some(base) = self.mem.spec_base(seq) else {
            return Err(EngineError::Invalid(format!(
                "sequence {seq} is not being verified"
            )));
        };
        let len = self.mem.seq_len(seq)?;
        let target = base + keep;
        if target > len {
            return Err(EngineError::Invalid(format!(
                "cannot keep {keep} tokens of a verification that appended {}",
                len - base
            )));
        }
        let mut replayed = 0;
        if target < len {
            self.mem.spec_cut(seq, target)?;
            if let Some(r) = &mut self.mem.recurrent {
                r.drop_checkpoints_after(seq, target)?;
            }
            if self.mem.recurrent.is_some()
                && (force_replay() || !self.model.refold(&self.pool, &mut self.mem, seq, keep)?)
            {
                // Back to the state before the verification, then the kept
                // tokens again (still token by token: stepwise).
                let again = self.mem.seq_tokens(seq)?[base..target].to_vec();
                if let Some(r) = &mut self.mem.recurrent {
                    r.spec_abort(seq)?;
                }
                self.mem.spec_cut(seq, base)?;
                self.mem.spec_end(seq, base)?;
                if !again.is_empty() {
                    self.mem.spec_begin(seq)?;
                    let entry = BatchEntry {
                        seq,
                        tokens: &again,
                        logits: LogitRows::None,
                    };
                    self.decode_batch(&[entry])?;
                    replayed = again.len();
                }
            }
        }
        self.mem.spec_end(seq, target)?;
        self.mem.after_ubatch(seq, true, 1)?;
        Ok(Commit {
            len: self.mem.seq_len(seq)?,
            replayed,
        })
    }

    /// How many draft tokens `seq` can take after its next token: the
    /// context and the next periodic checkpoint position bound the
    /// verification (it must not run past a position where the policy
    /// wants a checkpoint).
    pub fn spec_room(&self, seq: SeqId) -> Result<usize, EngineError> {
        let len = self.mem.seq_len(seq)?;
        let mut room = self.mem.n_ctx().saturating_sub(len + 1);
        if let Some(k) = self.mem.tokens_to_checkpoint(seq)? {
            room = room.min(k.saturating_sub(1));
        }
        Ok(room)
    }
}

/// `COIL_SPEC_REPLAY=1`: recover rejected verifications by restoring the
/// state before them and replaying the kept tokens even where the model can
/// refold (to measure one against the other; the results are the same).
fn force_replay() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("COIL_SPEC_REPLAY").is_ok_and(|v| v == "1"))
}

/// Where drafts come from.
pub enum DraftSource {
    /// A drafter over the sequence's tokens (n-gram lookup).
    Tokens(Box<dyn Drafter + Send>),
    /// The model's own first NextN / MTP block ([`Engine::draft_nextn`];
    /// the engine keeps the block's memory: [`EngineOptions::nextn`]).
    ///
    /// [`EngineOptions::nextn`]: super::EngineOptions::nextn
    Nextn,
    /// A smaller model with the same vocabulary ([`DraftModel`]).
    Model(Box<DraftModel>),
    /// A draft model shared by every sequence, which the caller holds and
    /// drafts with ([`DraftModel::draft`]; `coil serve`'s scheduler, one
    /// draft model for all its requests): [`Speculator::draft`] has no
    /// drafts of its own for it.
    SharedModel,
}

/// A drafter and its adaptive length, with counters: what a generation
/// loop needs to speculate.
pub struct Speculator {
    pub source: DraftSource,
    pub len: AdaptiveLen,
    pub counts: SpecCounts,
}

impl Speculator {
    /// Drafts from `drafter` over the sequence's tokens.
    pub fn new(drafter: Box<dyn Drafter + Send>, draft_max: usize) -> Self {
        Self::with_source(DraftSource::Tokens(drafter), draft_max)
    }

    pub fn with_source(source: DraftSource, draft_max: usize) -> Self {
        Speculator {
            source,
            len: AdaptiveLen::new(draft_max),
            counts: SpecCounts::default(),
        }
    }

    /// How many tokens to draft now, at most `room` (0: decode plainly).
    pub fn want(&mut self, room: usize) -> usize {
        self.len.take().min(room)
    }

    /// The draft for the token `next` just sampled for `seq` of `engine`,
    /// at most `room` tokens (empty: decode `next` plainly).
    pub fn draft(
        &mut self,
        engine: &mut Engine,
        seq: SeqId,
        next: u32,
        room: usize,
    ) -> Result<Vec<u32>, EngineError> {
        let k = self.want(room);
        self.draft_k(engine, seq, next, k)
    }

    /// [`Speculator::draft`] of exactly up to `k` tokens (the length
    /// already taken by [`Speculator::want`]).
    pub fn draft_k(
        &mut self,
        engine: &mut Engine,
        seq: SeqId,
        next: u32,
        k: usize,
    ) -> Result<Vec<u32>, EngineError> {
        if k == 0 {
            return Ok(Vec::new());
        }
        let mut d = match &mut self.source {
            DraftSource::Tokens(drafter) => {
                let history = engine.mem.seq_tokens(seq)?;
                let mut h = Vec::with_capacity(history.len() + 1);
                h.extend_from_slice(history);
                h.push(next);
                drafter.propose(&h, k)
            }
            DraftSource::Nextn => engine
                .draft_nextn(&[(seq, next, k)])?
                .pop()
                .unwrap_or_default(),
            DraftSource::Model(m) => m.draft(seq, engine.mem.seq_tokens(seq)?, next, k)?,
            DraftSource::SharedModel => Vec::new(),
        };
        d.truncate(k);
        Ok(d)
    }

    /// Records a verification of `drafted` tokens of which `accepted` were.
    pub fn observe(&mut self, drafted: usize, accepted: usize, replayed: usize) {
        self.len.observe(drafted, accepted);
        self.counts.verifications += 1;
        self.counts.drafted += drafted;
        self.counts.accepted += accepted;
        self.counts.replayed += replayed;
    }
}

#[cfg(test)]
mod tests {
    use super::super::sampling::{Sampler, SamplingParams};

    /// Sampling a position's token and accepting the draft x when the draw
    /// equals it (what the generation loops do) is the speculative
    /// sampling rule for a point-mass draft: accepted with probability
    /// p(x); on rejection, distributed as p without x, renormalised. Seeded
    /// and bounded: 40,000 draws, bounds of 5 standard deviations.
    #[test]
    fn accept_by_equal_draw_is_the_speculative_sampling_rule() {
        let logits = [1.0f32, 2.5, 0.3, -1.0, 2.0, 0.0];
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        let p: Vec<f64> = logits.iter().map(|&l| (l as f64).exp() / z).collect();
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..Default::default()
        };
        let mut s = Sampler::new(params);
        let n = 40_000;
        for x in [1u32, 3] {
            let (mut accepted, mut rejected) = (0usize, vec![0usize; logits.len()]);
            for _ in 0..n {
                let t = s.sample(&logits);
                if t == x {
                    accepted += 1;
                } else {
                    rejected[t as usize] += 1;
                }
            }
            let px = p[x as usize];
            let rate = accepted as f64 / n as f64;
            let sd = (px * (1.0 - px) / n as f64).sqrt();
            assert!(
                (rate - px).abs() < 5.0 * sd,
                "x={x}: accepted {rate}, p(x) {px}"
            );
            let n_rej = (n - accepted) as f64;
            assert_eq!(rejected[x as usize], 0);
            for (y, &c) in rejected.iter().enumerate() {
                if y == x as usize {
                    continue;
                }
                let q = p[y] / (1.0 - px);
                let sd = (q * (1.0 - q) / n_rej).sqrt();
                let f = c as f64 / n_rej;
                assert!((f - q).abs() < 5.0 * sd, "x={x}, y={y}: {f} vs {q}");
            }
        }
    }
}
