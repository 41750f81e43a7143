//! Token sampling in llama.cpp's order (`common/sampling.cpp`): logit
//! bias; repetition / presence / frequency penalties; DRY; top-n-σ; top-k;
//! locally typical; top-p; min-p; XTC; temperature; a seeded draw. With
//! Mirostat (1 or 2) the chain is logit bias, temperature, Mirostat.
//! Temperature 0 is greedy.

use super::constraint::TokenMask;
use super::cuts::{self, softmax, MirostatState};
use super::dry::{self, DryParams};
use super::nucleus::nucleus;
use super::top_k::{better, top_k};
use std::collections::{HashMap, VecDeque};

/// Mirostat, which replaces the cuts and temperature's draw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Mirostat {
    #[default]
    Off,
    /// Mirostat 1.0 (top-k from an estimated Zipf exponent).
    V1,
    /// Mirostat 2.0 (a surprise ceiling).
    V2,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 = greedy (argmax).
    pub temperature: f32,
    /// 0 = off.
    pub top_k: usize,
    /// 1 = off.
    pub top_p: f32,
    /// 0 = off.
    pub min_p: f32,
    /// 1 = off. Logits of recent tokens: positive ÷ penalty, negative × penalty.
    pub repeat_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub repeat_last_n: usize,
    /// Subtracted once from the logit of every recent token.
    pub presence_penalty: f32,
    /// Subtracted per occurrence of a recent token.
    pub frequency_penalty: f32,
    /// Locally typical sampling's mass (1 = off).
    pub typical_p: f32,
    /// Top-n-σ: keep logits within n standard deviations of the largest
    /// (≤ 0 = off).
    pub top_n_sigma: f32,
    /// XTC: the chance, per token, of dropping the likely tokens (0 = off).
    pub xtc_probability: f32,
    /// XTC: how likely a token must be to be dropped (> 0.5 = off).
    pub xtc_threshold: f32,
    /// DRY repetition penalty (off by default).
    pub dry: DryParams,
    pub mirostat: Mirostat,
    /// Mirostat's target surprise (bits).
    pub mirostat_tau: f32,
    /// Mirostat's learning rate.
    pub mirostat_eta: f32,
    /// Added to tokens' logits before anything else (−∞ bans a token);
    /// distinct ids.
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            typical_p: 1.0,
            top_n_sigma: -1.0,
            xtc_probability: 0.0,
            xtc_threshold: 0.1,
            dry: DryParams::default(),
            mirostat: Mirostat::Off,
            mirostat_tau: 5.0,
            mirostat_eta: 0.1,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplingParams {
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Checks the ranges; the message starts with the parameter's name.
    pub fn validate(&self) -> Result<(), String> {
        let finite = |v: f32, name: &str| {
            if v.is_finite() {
                Ok(())
            } else {
                Err(format!("{name} must be a finite number, got {v}"))
            }
        };
        finite(self.temperature, "temperature")?;
        finite(self.top_p, "top_p")?;
        finite(self.min_p, "min_p")?;
        finite(self.repeat_penalty, "repeat_penalty")?;
        finite(self.presence_penalty, "presence_penalty")?;
        finite(self.frequency_penalty, "frequency_penalty")?;
        finite(self.typical_p, "typical_p")?;
        finite(self.top_n_sigma, "top_n_sigma")?;
        finite(self.xtc_probability, "xtc_probability")?;
        finite(self.xtc_threshold, "xtc_threshold")?;
        finite(self.dry.multiplier, "dry_multiplier")?;
        finite(self.dry.base, "dry_base")?;
        finite(self.mirostat_tau, "mirostat_tau")?;
        finite(self.mirostat_eta, "mirostat_eta")?;
        if self.temperature < 0.0 {
            return Err(format!("temperature must be ≥ 0, got {}", self.temperature));
        }
        if !(0.0..=1.0).contains(&self.top_p) || self.top_p == 0.0 {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        let unit = |v: f32, name: &str| {
            if (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(format!("{name} must be in [0, 1], got {v}"))
            }
        };
        unit(self.min_p, "min_p")?;
        unit(self.typical_p, "typical_p")?;
        unit(self.xtc_probability, "xtc_probability")?;
        unit(self.xtc_threshold, "xtc_threshold")?;
        if self.repeat_penalty <= 0.0 {
            return Err(format!(
                "repeat_penalty must be > 0, got {}",
                self.repeat_penalty
            ));
        }
        if self.dry.multiplier < 0.0 {
            return Err(format!(
                "dry_multiplier must be ≥ 0, got {}",
                self.dry.multiplier
            ));
        }
        if self.dry.base < 1.0 {
            return Err(format!("dry_base must be ≥ 1, got {}", self.dry.base));
        }
        if self.mirostat_eta < 0.0 {
            return Err(format!(
                "mirostat_eta must be ≥ 0, got {}",
                self.mirostat_eta
            ));
        }
        if let Some(b) = self
            .logit_bias
            .iter()
            .find(|b| b.1.is_nan() || b.1 == f32::INFINITY)
        {
            return Err(format!(
                "logit_bias of token {} must be a number or -infinity, got {}",
                b.0, b.1
            ));
        }
        Ok(())
    }

    fn xtc_on(&self) -> bool {
        self.xtc_probability > 0.0 && self.xtc_threshold <= 0.5
    }
}

/// xoshiro256** seeded through SplitMix64: small, fast, reproducible.
#[derive(Clone, Debug)]
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Mirostat's initial `mu`: twice the target.
fn mirostat_start(p: &SamplingParams) -> MirostatState {
    MirostatState {
        mu: 2.0 * p.mirostat_tau,
    }
}

/// XTC's coin has a stream of its own, so that turning it on does not
/// change the draws.
const XTC_STREAM: u64 = 0x5854_435F_434F_494E;

#[derive(Clone, Debug)]
pub struct Sampler {
    pub params: SamplingParams,
    rng: Rng,
    xtc_rng: Rng,
    mirostat: MirostatState,
    /// Recent tokens (prompt and generated), newest last: as many as the
    /// penalties and DRY look at.
    recent: VecDeque<u32>,
    /// A row with a constraint's mask applied (see [`Sampler::sample_masked`]).
    masked: Vec<f32>,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Self {
        Sampler {
            rng: Rng::new(params.seed),
            xtc_rng: Rng::new(params.seed ^ XTC_STREAM),
            mirostat: mirostat_start(&params),
            params,
            recent: VecDeque::new(),
            masked: Vec::new(),
        }
    }

    /// A copy with the same history and state drawing from `seed`: another
    /// choice forked from the same prompt.
    pub fn reseeded(&self, seed: u64) -> Self {
        let mut s = self.clone();
        s.params.seed = seed;
        s.rng = Rng::new(seed);
        s.xtc_rng = Rng::new(seed ^ XTC_STREAM);
        s
    }

    /// Records a token (prompt or generated) for the penalties and DRY.
    pub fn accept(&mut self, token: u32) {
        let keep = self.params.repeat_last_n.max(if self.params.dry.is_on() {
            self.params.dry.penalty_last_n
        } else {
            0
        });
        if keep == 0 {
            return;
        }
        while self.recent.len() >= keep {
            self.recent.pop_front();
        }
        self.recent.push_back(token);
    }

    /// Whether any penalty changes logits now.
    fn penalizes(&self) -> bool {
        let p = &self.params;
        p.repeat_last_n > 0
            && !self.recent.is_empty()
            && (p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0)
    }

    /// The logits that logit bias, the penalties and DRY change (each
    /// token once, ids inside the row), in that order; `bias_only` stops
    /// after the bias (Mirostat's chain).
    fn adjusted(&self, logits: &[f32], bias_only: bool) -> Vec<(u32, f32)> {
        let p = &self.params;
        let mut adj: HashMap<u32, f32> = HashMap::new();
        let get = |adj: &HashMap<u32, f32>, t: u32| {
            adj.get(&t).copied().or(logits.get(t as usize).copied())
        };
        for &(t, b) in &p.logit_bias {
            if let Some(l) = get(&adj, t) {
                adj.insert(t, l + b);
            }
        }
        if bias_only {
            return adj.into_iter().collect();
        }
        if self.penalizes() {
            let mut counts: HashMap<u32, u32> = HashMap::new();
            let n = self.recent.len();
            for &t in self.recent.iter().skip(n.saturating_sub(p.repeat_last_n)) {
                *counts.entry(t).or_default() += 1;
            }
            for (&t, &n) in &counts {
                let Some(l) = get(&adj, t) else {
                    continue;
                };
                let l = if l > 0.0 {
                    l / p.repeat_penalty
                } else {
                    l * p.repeat_penalty
                };
                adj.insert(t, l - (n as f32 * p.frequency_penalty + p.presence_penalty));
            }
        }
        for (t, pen) in dry::penalties(&p.dry, &self.recent) {
            if let Some(l) = get(&adj, t) {
                adj.insert(t, l - pen);
            }
        }
        adj.into_iter().collect()
    }

    /// Picks the next token from one row of logits among those `mask`
    /// allows (all, without one): the others' logits are −∞ before the
    /// penalties and cuts, so the draw is the model's distribution
    /// restricted to the allowed tokens.
    pub fn sample_masked(&mut self, logits: &[f32], mask: Option<&TokenMask>) -> u32 {
        let Some(mask) = mask else {
            return self.sample(logits);
        };
        let mut row = std::mem::take(&mut self.masked);
        mask.apply(logits, &mut row);
        let t = self.sample(&row);
        self.masked = row;
        t
    }

    /// Picks the next token from one row of logits.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.mirostat != Mirostat::Off {
            return self.sample_mirostat(logits);
        }
        // No copy of the row (1 MB on a 248k-token vocabulary, per
        // sequence and token) on the common paths: the adjusted logits
        // beside it, top-k (and greedy) by one pass over it (see `top_k`),
        // top-p / min-p with top-k off by sorting only their head (see
        // `nucleus`).
        let adjusted = self.adjusted(logits, false);
        let p = &self.params;
        let greedy = p.temperature <= 0.0;
        let typical = p.typical_p < 1.0;
        if greedy && !typical && !p.xtc_on() {
            if adjusted.is_empty() {
                return argmax(logits) as u32;
            }
            return top_k(logits, 1, &adjusted).first().map_or(0, |c| c.0);
        }
        // Candidates best first, and their probabilities (softmax at
        // temperature 1) for the cuts.
        let (mut cand, mut probs) = if p.top_n_sigma > 0.0 {
            let l = with_adjusted(logits, &adjusted);
            let floor = cuts::sigma_floor(l.iter().copied(), p.top_n_sigma);
            let mut cand: Vec<(u32, f32)> = l
                .iter()
                .enumerate()
                .filter(|(_, &v)| v >= floor)
                .map(|(i, &v)| (i as u32, v))
                .collect();
            cand.sort_unstable_by(better);
            if p.top_k > 0 {
                cand.truncate(p.top_k);
            }
            let probs = softmax(&cand);
            (cand, probs)
        } else if p.top_k > 0 && p.top_k < logits.len() {
            let cand = top_k(logits, p.top_k, &adjusted);
            let probs = softmax(&cand);
            (cand, probs)
        } else if let Some(n) = nucleus(logits, &adjusted, p.top_p, p.min_p).filter(|_| !typical) {
            let probs = n.probs();
            (n.cand, probs)
        } else {
            // Every candidate: the row adjusted, NaNs left out.
            let l = with_adjusted(logits, &adjusted);
            let mut cand: Vec<(u32, f32)> = l
                .iter()
                .enumerate()
                .filter(|(_, v)| !v.is_nan())
                .map(|(i, &v)| (i as u32, v))
                .collect();
            cand.sort_unstable_by(better);
            let probs = softmax(&cand);
            (cand, probs)
        };
        if cand.is_empty() {
            return 0;
        }
        if typical {
            cand = cuts::typical(&cand, &probs, p.typical_p);
            probs = softmax(&cand);
        }
        let mut keep = cand.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = keep.min(i + 1);
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let thresh = probs[0] * p.min_p as f64;
            let n = probs.iter().take_while(|&&pr| pr >= thresh).count().max(1);
            keep = keep.min(n);
        }
        cand.truncate(keep);
        if p.xtc_on() && cand.len() >= 2 && self.xtc_rng.next_f64() <= p.xtc_probability as f64 {
            cuts::xtc(&mut cand, p.xtc_threshold);
        }
        if greedy {
            return cand[0].0;
        }
        for c in cand.iter_mut() {
            c.1 /= p.temperature;
        }
        let probs = softmax(&cand);
        cand[draw(&mut self.rng, &probs)].0
    }

    /// Mirostat's chain: logit bias, temperature, then the cut that keeps
    /// the expected surprise near `tau`, a draw, and the update of `mu`.
    /// It sorts the whole row.
    fn sample_mirostat(&mut self, logits: &[f32]) -> u32 {
        let adjusted = self.adjusted(logits, true);
        let p = &self.params;
        if p.temperature <= 0.0 {
            return top_k(logits, 1, &adjusted).first().map_or(0, |c| c.0);
        }
        let l = with_adjusted(logits, &adjusted);
        let mut cand: Vec<(u32, f32)> = l
            .iter()
            .enumerate()
            .filter(|(_, v)| !v.is_nan())
            .map(|(i, &v)| (i as u32, v / p.temperature))
            .collect();
        if cand.is_empty() {
            return 0;
        }
        cand.sort_unstable_by(better);
        let probs = softmax(&cand);
        let keep = match p.mirostat {
            Mirostat::V1 => cuts::mirostat_v1_k(&probs, self.mirostat.mu, logits.len(), 100),
            _ => cuts::mirostat_v2_keep(&probs, self.mirostat.mu),
        };
        cand.truncate(keep);
        let probs = softmax(&cand);
        let i = draw(&mut self.rng, &probs);
        let (tau, eta) = (p.mirostat_tau, p.mirostat_eta);
        cuts::mirostat_update(&mut self.mirostat, probs[i], tau, eta);
        cand[i].0
    }
}

/// A copy of the row with the adjusted logits in place (for the paths
/// that look at every logit).
fn with_adjusted(row: &[f32], adjusted: &[(u32, f32)]) -> Vec<f32> {
    let mut l = row.to_vec();
    for &(t, v) in adjusted {
        l[t as usize] = v;
    }
    l
}

/// A draw from `probs` (summing to 1).
fn draw(rng: &mut Rng, probs: &[f64]) -> usize {
    let r = rng.next_f64();
    let mut cum = 0.0;
    for (i, pr) in probs.iter().enumerate() {
        cum += pr;
        if r < cum {
            return i;
        }
    }
    probs.len().saturating_sub(1)
}

/// The index of the largest value, the first one on ties; NaNs never win
/// (0 when every value is NaN). The maximum is found in 16 independent
/// lanes (vectorized: a greedy step on a 248k-token vocabulary took ~0.5 ms
/// with a compare-and-branch per value), then its first position.
pub fn argmax(v: &[f32]) -> usize {
    const L: usize = 16;
    let mut lanes = [f32::NEG_INFINITY; L];
    let chunks = v.chunks_exact(L);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            // `max` of a NaN and a number is the number.
            *m = m.max(x);
        }
    }
    let m = tail
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    v.iter().position(|&x| x == m).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_picks_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, -1.0, 2.9]), 1);
        assert_eq!(argmax(&[f32::NAN, 1.0, 0.5]), 1);
        assert_eq!(argmax(&[f32::NAN, f32::NAN]), 0);
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), 0);
        assert_eq!(argmax(&[]), 0);
        // Long rows (the lanes and the tail), ties to the first.
        let mut v: Vec<f32> = (0..1000).map(|i| ((i * 37) % 101) as f32).collect();
        v[998] = 500.0;
        assert_eq!(argmax(&v), 998);
        v[3] = 500.0;
        assert_eq!(argmax(&v), 3);
        v[500] = f32::NAN;
        assert_eq!(argmax(&v), 3);
        v[999] = f32::INFINITY;
        assert_eq!(argmax(&v), 999);
    }

    #[test]
    fn seed_makes_it_reproducible_and_top_k_1_is_greedy() {
        let logits: Vec<f32> = (0..100).map(|i| ((i * 37) % 17) as f32 * 0.3).collect();
        let draw = |seed| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.0,
                top_k: 0,
                top_p: 1.0,
                min_p: 0.0,
                seed,
                ..Default::default()
            });
            (0..20).map(|_| s.sample(&logits)).collect::<Vec<_>>()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let mut s = Sampler::new(SamplingParams {
            temperature: 5.0,
            top_k: 1,
            ..Default::default()
        });
        for _ in 0..10 {
            assert_eq!(s.sample(&logits) as usize, argmax(&logits));
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        // probabilities ≈ [0.64, 0.24, 0.09, 0.03]
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let mut seen = [0usize; 4];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.8,
            min_p: 0.0,
            seed: 1,
            ..Default::default()
        });
        for _ in 0..2000 {
            seen[s.sample(&logits) as usize] += 1;
        }
        assert!(
            seen[0] > 0 && seen[1] > 0 && seen[2] == 0 && seen[3] == 0,
            "{seen:?}"
        );
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.3,
            seed: 1,
            ..Default::default()
        });
        let mut seen = [0usize; 4];
        for _ in 0..2000 {
            seen[s.sample(&logits) as usize] += 1;
        }
        assert!(seen[0] > 0 && seen[1] > 0 && seen[2] == 0, "{seen:?}");
    }

    #[test]
    fn penalties_push_recent_tokens_down() {
        let mut s = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            ..SamplingParams::greedy()
        });
        s.accept(0);
        // 3.0 / 2 = 1.5 < 2.0
        assert_eq!(s.sample(&[3.0, 2.0]), 1);
        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 0.6,
            ..SamplingParams::greedy()
        });
        s.accept(0);
        s.accept(0);
        assert_eq!(s.sample(&[3.0, 2.0]), 1);
        let mut s = Sampler::new(SamplingParams {
            presence_penalty: 0.5,
            ..SamplingParams::greedy()
        });
        s.accept(0);
        assert_eq!(s.sample(&[3.0, 2.0]), 0);
        s.params.presence_penalty = 1.5;
        assert_eq!(s.sample(&[3.0, 2.0]), 1);
    }

    #[test]
    fn logit_bias_comes_first_and_minus_infinity_bans() {
        let logits = [3.0f32, 2.0, 1.0];
        let mut s = Sampler::new(SamplingParams {
            logit_bias: vec![(1, 1.5)],
            ..SamplingParams::greedy()
        });
        assert_eq!(s.sample(&logits), 1);
        // the penalty applies to the biased logit: (2 + 1.5) / 2 < 3
        s.params.repeat_penalty = 2.0;
        s.accept(1);
        assert_eq!(s.sample(&logits), 0);
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            logit_bias: vec![(0, f32::NEG_INFINITY)],
            seed: 3,
            ..Default::default()
        });
        assert!((0..200).all(|_| s.sample(&logits) != 0));
    }

    /// The tokens `params` ever draws from `logits` in `n` tries.
    fn support(params: SamplingParams, logits: &[f32], n: usize) -> Vec<u32> {
        let mut s = Sampler::new(params);
        let mut seen: Vec<u32> = (0..n).map(|_| s.sample(logits)).collect();
        seen.sort_unstable();
        seen.dedup();
        seen
    }

    fn open(seed: u64) -> SamplingParams {
        SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed,
            ..Default::default()
        }
    }

    #[test]
    fn top_n_sigma_typical_and_xtc_cut_as_defined() {
        // two close leaders, a middle token, a low tail
        let mut logits = vec![0.0f32; 20];
        logits[0] = 6.0;
        logits[1] = 5.9;
        logits[2] = 4.0;
        // σ ≈ 1.92 over the row
        let sigma = SamplingParams {
            top_n_sigma: 1.5,
            ..open(1)
        };
        assert_eq!(support(sigma, &logits, 500), vec![0, 1, 2]);
        let sigma = SamplingParams {
            top_n_sigma: 0.5,
            ..open(1)
        };
        assert_eq!(support(sigma, &logits, 500), vec![0, 1]);
        // XTC always on: both leaders (each ≥ 0.1 likely) but the weaker
        // one go; greedy then takes token 1
        let xtc = SamplingParams {
            xtc_probability: 1.0,
            xtc_threshold: 0.1,
            ..SamplingParams::greedy()
        };
        assert_eq!(support(xtc, &logits, 10), vec![1]);
        // typical with a small mass keeps one token
        let typ = SamplingParams {
            typical_p: 0.01,
            ..open(2)
        };
        assert_eq!(support(typ, &logits, 200).len(), 1);
    }

    #[test]
    fn dry_steers_away_from_repeating_the_text() {
        let mut s = Sampler::new(SamplingParams {
            dry: DryParams {
                multiplier: 10.0,
                ..Default::default()
            },
            ..SamplingParams::greedy()
        });
        for t in [1, 2, 3, 4, 9, 1, 2, 3] {
            s.accept(t);
        }
        // 4 would repeat "1 2 3 4"
        let mut logits = vec![0.0f32; 10];
        logits[4] = 5.0;
        logits[5] = 4.0;
        assert_eq!(s.sample(&logits), 5);
    }

    #[test]
    fn mirostat_draws_reproducibly_and_adapts() {
        let logits: Vec<f32> = (0..500).map(|i| -(i as f32 + 1.0).ln() * 1.3).collect();
        for m in [Mirostat::V1, Mirostat::V2] {
            let params = SamplingParams {
                mirostat: m,
                mirostat_tau: 2.0,
                ..open(5)
            };
            let draws = |p: SamplingParams| {
                let mut s = Sampler::new(p);
                let v: Vec<u32> = (0..50).map(|_| s.sample(&logits)).collect();
                (v, s.mirostat.mu)
            };
            let (a, mu) = draws(params.clone());
            assert_eq!(a, draws(params.clone()).0);
            assert_ne!(mu, 4.0, "mu never moved");
            // a low target surprise keeps the draws near the top
            assert!(a.iter().all(|&t| t < 100), "{m:?}: {a:?}");
        }
    }

    #[test]
    fn reseeded_samplers_keep_the_history_and_draw_apart() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 7) % 11) as f32 * 0.2).collect();
        let mut a = Sampler::new(open(1));
        a.accept(3);
        let mut b = a.reseeded(2);
        assert_eq!(b.recent, a.recent);
        let da: Vec<u32> = (0..30).map(|_| a.sample(&logits)).collect();
        let db: Vec<u32> = (0..30).map(|_| b.sample(&logits)).collect();
        assert_ne!(da, db);
    }

    #[test]
    fn validation_names_the_parameter() {
        let bad = SamplingParams {
            top_p: 1.5,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("top_p"));
        let bad = SamplingParams {
            dry: DryParams {
                base: 0.5,
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().starts_with("dry_base"));
        let bad = SamplingParams {
            logit_bias: vec![(1, f32::NAN)],
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().starts_with("logit_bias"));
        assert!(SamplingParams::default().validate().is_ok());
    }
}
