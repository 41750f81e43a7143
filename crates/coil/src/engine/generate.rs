//! Text generation on one sequence: process the prompt, then sample token
//! by token, streaming decoded text, stopping on an end-of-generation token,
//! a stop string or the token limit; under a [`Constraint`], only among
//! the tokens it allows, its masks computed beside each forward pass.

use super::constraint::{beside, Constraint};
use super::sampling::Sampler;
use super::speculative::{SpecCounts, Speculator};
use super::{Engine, EngineError};
use crate::memory::SeqId;
use crate::models::LogitRows;
use crate::tokenizer::Tokenizer;
use std::time::Instant;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-generation token was sampled.
    Eos,
    /// A stop string appeared in the output.
    StopString,
    /// The token limit was reached.
    Length,
    /// The caller's callback asked to stop.
    Cancelled,
    /// The constrained output is complete: nothing but an
    /// end-of-generation token could follow.
    Complete,
}

#[derive(Clone, Debug)]
pub struct GenerationStats {
    pub n_prompt: usize,
    pub prompt_secs: f64,
    pub n_gen: usize,
    pub gen_secs: f64,
    pub stop: StopReason,
    /// The generated tokens (the stop token excluded).
    pub tokens: Vec<u32>,
    /// Speculative decoding's counters, when it was on.
    pub spec: Option<SpecCounts>,
}

impl GenerationStats {
    pub fn prompt_tps(&self) -> f64 {
        rate(self.n_prompt, self.prompt_secs)
    }
    pub fn gen_tps(&self) -> f64 {
        rate(self.n_gen, self.gen_secs)
    }
}

fn rate(n: usize, secs: f64) -> f64 {
    if secs > 0.0 {
        n as f64 / secs
    } else {
        0.0
    }
}

/// Holds back text that might be the start of a stop string.
#[derive(Clone, Debug)]
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
    /// The stop string that ended the text.
    matched: Option<String>,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
            matched: None,
        }
    }

    /// The stop string that ended the text, once one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Adds text; returns (text safe to emit, whether a stop string ended it).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()).map(|at| (at, s)))
            .min_by_key(|&(at, _)| at);
        if let Some((at, s)) = first_stop {
            self.matched = Some(s.clone());
            let out = self.pending[..at].to_string();
            self.pending.clear();
            return (out, true);
        }
        // Keep the longest suffix that is a prefix of some stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1).chain([(s.len(), ' ')]) {
                let prefix = &s[..i];
                if i < s.len() && self.pending.ends_with(prefix) {
                    keep = keep.max(prefix.len());
                }
            }
        }
        let cut = self.pending.len() - keep;
        let out = self.pending[..cut].to_string();
        self.pending.drain(..cut);
        (out, false)
    }

    /// Whatever is held back, at the end of generation.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

/// Generation settings beyond sampling.
#[derive(Clone, Debug)]
pub struct GenerateOptions {
    pub max_tokens: usize,
    pub stop: Vec<String>,
    /// Stop when an end-of-generation token is sampled.
    pub stop_at_eos: bool,
}

/// Appends `prompt` to `seq` (which may already hold tokens) and generates.
/// `on_text` receives text as it becomes final; returning `false` stops.
pub fn generate(
    engine: &mut Engine,
    tokenizer: &Tokenizer,
    seq: SeqId,
    prompt: &[u32],
    sampler: &mut Sampler,
    opts: &GenerateOptions,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats, EngineError> {
    generate_with(engine, tokenizer, seq, prompt, sampler, opts, None, on_text)
}

/// The tokens generated so far and what decides when to stop.
struct Emitter<'a, F> {
    tokenizer: &'a Tokenizer,
    opts: &'a GenerateOptions,
    decoder: crate::tokenizer::StreamDecoder,
    stops: StopMatcher,
    tokens: Vec<u32>,
    stop: StopReason,
    on_text: F,
    /// Under a constraint, an end-of-generation token (allowed only where
    /// the output is complete) always ends it.
    constrained: bool,
}

impl<F: FnMut(&str) -> bool> Emitter<'_, F> {
    /// Takes a sampled token; `true` when generation ends here (the token
    /// is then not fed to the model).
    fn push(&mut self, sampler: &mut Sampler, tok: u32) -> bool {
        if (self.opts.stop_at_eos || self.constrained) && self.tokenizer.is_eog(tok) {
            self.stop = StopReason::Eos;
            return true;
        }
        sampler.accept(tok);
        self.tokens.push(tok);
        let (text, hit) = self.stops.push(&self.decoder.push(self.tokenizer, tok));
        if !text.is_empty() && !(self.on_text)(&text) {
            self.stop = StopReason::Cancelled;
            return true;
        }
        if hit {
            self.stop = StopReason::StopString;
            return true;
        }
        self.tokens.len() >= self.opts.max_tokens
    }
}

/// [`generate`], with speculative decoding when `spec` is given: after each
/// sampled token the speculator may propose drafts, verified in one pass
/// (see [`super::speculative`]). The tokens are those of plain decoding.
#[allow(clippy::too_many_arguments)]
pub fn generate_with(
    engine: &mut Engine,
    tokenizer: &Tokenizer,
    seq: SeqId,
    prompt: &[u32],
    sampler: &mut Sampler,
    opts: &GenerateOptions,
    spec: Option<&mut Speculator>,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats, EngineError> {
    generate_constrained(
        engine, tokenizer, seq, prompt, sampler, opts, spec, None, on_text,
    )
}

/// The constraint's masks for the next sampling, computed on another
/// thread while `forward` runs.
fn with_masks<T>(
    constraint: &mut Option<&mut Constraint>,
    forward: impl FnOnce() -> Result<T, EngineError>,
) -> Result<T, EngineError> {
    let mut cs: Vec<&mut Constraint> = constraint.as_deref_mut().into_iter().collect();
    let (out, masks) = beside(&mut cs, forward);
    let out = out?;
    masks?;
    Ok(out)
}

/// [`generate_with`] under `constraint` (see [`super::constraint`]): each
/// token is drawn among those it allows, drafts are cut where it stops
/// allowing them and a rejected draft rolls it back with the sequence;
/// generation ends when the constrained output is complete.
#[allow(clippy::too_many_arguments)]
pub fn generate_constrained(
    engine: &mut Engine,
    tokenizer: &Tokenizer,
    seq: SeqId,
    prompt: &[u32],
    sampler: &mut Sampler,
    opts: &GenerateOptions,
    mut spec: Option<&mut Speculator>,
    mut constraint: Option<&mut Constraint>,
    on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::Invalid("the prompt has no tokens".into()));
    }
    for &t in prompt {
        sampler.accept(t);
    }
    let t0 = Instant::now();
    let mut logits = with_masks(&mut constraint, || {
        engine.eval(seq, prompt, LogitRows::Last, 0)
    })?;
    let prompt_secs = t0.elapsed().as_secs_f64();
    let n_vocab = engine.n_vocab();

    let mut out = Emitter {
        tokenizer,
        opts,
        decoder: tokenizer.stream_decoder(),
        stops: StopMatcher::new(&opts.stop),
        tokens: Vec::new(),
        stop: StopReason::Length,
        on_text,
        constrained: constraint.is_some(),
    };
    let t1 = Instant::now();
    // A token sampled (and emitted) but not yet fed to the model.
    let mut pending: Option<u32> = None;
    while out.tokens.len() < opts.max_tokens {
        let tok = match pending.take() {
            Some(t) => t,
            None => {
                let mask = match constraint.as_deref_mut() {
                    Some(c) => Some(c.mask(0)?),
                    None => None,
                };
                let t = sampler.sample_masked(&logits, mask);
                if out.push(sampler, t) {
                    break;
                }
                if let Some(c) = constraint.as_deref_mut() {
                    c.commit(t)?;
                    if c.is_finished() {
                        out.stop = StopReason::Complete;
                        break;
                    }
                }
                t
            }
        };
        let mut draft = match spec.as_deref_mut() {
            Some(sp) => {
                // No point drafting past the token limit.
                let left = opts.max_tokens - out.tokens.len();
                let room = engine.spec_room(seq)?.min(left.saturating_sub(1));
                sp.draft(engine, seq, tok, room)?
            }
            None => Vec::new(),
        };
        if let Some(c) = constraint.as_deref_mut() {
            // Only what the constraint allows is worth verifying.
            let n = c.propose(&draft);
            draft.truncate(n);
        }
        if draft.is_empty() {
            logits = with_masks(&mut constraint, || {
                engine.eval(seq, &[tok], LogitRows::Last, 1)
            })?;
            continue;
        }
        let mut fed = Vec::with_capacity(draft.len() + 1);
        fed.push(tok);
        fed.extend_from_slice(&draft);
        let rows = with_masks(&mut constraint, || engine.spec_verify(seq, &fed))?;
        // Row j holds the logits after fed[..=j]: sample position by
        // position while the draws confirm the draft.
        let mut keep = fed.len();
        let mut stopped = false;
        for j in 0..fed.len() {
            let mask = match constraint.as_deref_mut() {
                Some(c) => Some(c.mask(j)?),
                None => None,
            };
            let t = sampler.sample_masked(&rows[j * n_vocab..(j + 1) * n_vocab], mask);
            if out.push(sampler, t) {
                keep = j + 1;
                stopped = true;
                break;
            }
            if j < draft.len() && t == draft[j] {
                continue;
            }
            // A correction (or, after a whole accepted draft, the bonus
            // token): the next token to feed.
            keep = j + 1;
            pending = Some(t);
            break;
        }
        let c = engine.spec_commit(seq, keep)?;
        if let Some(sp) = spec.as_deref_mut() {
            sp.observe(draft.len(), keep - 1, c.replayed);
        }
        if stopped {
            break;
        }
        if let Some(c) = constraint.as_deref_mut() {
            // Back to the accepted drafts, as the sequence is; then the
            // correction (or the bonus token) sampled after them.
            c.settle(keep - 1)?;
            if let Some(t) = pending {
                c.commit(t)?;
                if c.is_finished() {
                    out.stop = StopReason::Complete;
                    break;
                }
            }
        }
    }
    let mut on_text = out.on_text;
    if out.stop != StopReason::StopString && out.stop != StopReason::Cancelled {
        let mut rest = out.stops.push(&out.decoder.flush()).0;
        rest.push_str(&out.stops.flush());
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    Ok(GenerationStats {
        n_prompt: prompt.len(),
        prompt_secs,
        n_gen: out.tokens.len(),
        gen_secs: t1.elapsed().as_secs_f64(),
        stop: out.stop,
        tokens: out.tokens,
        spec: spec.map(|s| s.counts),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_are_held_back_and_cut() {
        let mut m = StopMatcher::new(&["\n\n".to_string(), "END".to_string()]);
        assert_eq!(m.push("Hello"), ("Hello".into(), false));
        assert_eq!(m.push(" wor\n"), (" wor".into(), false));
        assert_eq!(m.push("x E"), ("\nx ".into(), false));
        assert_eq!(m.push("N"), ("".into(), false));
        assert_eq!(m.push("Dtail"), ("".into(), true));
        let mut m = StopMatcher::new(&["\n\n".to_string()]);
        assert_eq!(m.push("a\n"), ("a".into(), false));
        assert_eq!(m.flush(), "\n");
        let mut m = StopMatcher::new(&[]);
        assert_eq!(m.push("é\n"), ("é\n".into(), false));
    }
}
