//! Text generation on one sequence: process the prompt, then sample token
//! by token, streaming decoded text, stopping on an end-of-generation token,
//! a stop string or the token limit.

use super::sampling::Sampler;
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
pub struct StopMatcher {
    stops: Vec<String>,
    pending: String,
}

impl StopMatcher {
    pub fn new(stops: &[String]) -> Self {
        StopMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            pending: String::new(),
        }
    }

    /// Adds text; returns (text safe to emit, whether a stop string ended it).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        self.pending.push_str(text);
        let first_stop = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min();
        if let Some(at) = first_stop {
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
    mut on_text: impl FnMut(&str) -> bool,
) -> Result<GenerationStats, EngineError> {
    if prompt.is_empty() {
        return Err(EngineError::Invalid("the prompt has no tokens".into()));
    }
    for &t in prompt {
        sampler.accept(t);
    }
    let t0 = Instant::now();
    let mut logits = engine.eval(seq, prompt, LogitRows::Last, 0)?;
    let prompt_secs = t0.elapsed().as_secs_f64();

    let mut decoder = tokenizer.stream_decoder();
    let mut stops = StopMatcher::new(&opts.stop);
    let mut tokens = Vec::new();
    let mut stop = StopReason::Length;
    let t1 = Instant::now();
    while tokens.len() < opts.max_tokens {
        let tok = sampler.sample(&logits);
        if opts.stop_at_eos && tokenizer.is_eog(tok) {
            stop = StopReason::Eos;
            break;
        }
        sampler.accept(tok);
        tokens.push(tok);
        let (text, hit) = stops.push(&decoder.push(tokenizer, tok));
        if !text.is_empty() && !on_text(&text) {
            stop = StopReason::Cancelled;
            break;
        }
        if hit {
            stop = StopReason::StopString;
            break;
        }
        if tokens.len() == opts.max_tokens {
            break;
        }
        logits = engine.eval(seq, &[tok], LogitRows::Last, 1)?;
    }
    if stop != StopReason::StopString && stop != StopReason::Cancelled {
        let mut rest = stops.push(&decoder.flush()).0;
        rest.push_str(&stops.flush());
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    Ok(GenerationStats {
        n_prompt: prompt.len(),
        prompt_secs,
        n_gen: tokens.len(),
        gen_secs: t1.elapsed().as_secs_f64(),
        stop,
        tokens,
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
