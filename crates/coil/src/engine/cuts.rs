//! The candidate cuts beyond top-k / top-p / min-p, as llama.cpp defines
//! them (`src/llama-sampler.cpp`): top-n-σ, locally typical sampling, XTC
//! and the two Mirostat samplers. Candidates are `(token, logit)`.

/// Softmax of the candidates' logits, in f64.
pub fn softmax(c: &[(u32, f32)]) -> Vec<f64> {
    let max = c.iter().fold(f32::NEG_INFINITY, |m, x| m.max(x.1)) as f64;
    let e: Vec<f64> = c.iter().map(|x| (x.1 as f64 - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| v / s).collect()
}

/// Top-n-σ: the lowest logit kept, `max − n·σ`, where `σ` is the standard
/// deviation of the row's logits (−∞ and NaN left out); `values` yields
/// every logit of the row once.
pub fn sigma_floor(values: impl Iterator<Item = f32> + Clone, n: f32) -> f32 {
    let finite = values.filter(|v| *v != f32::NEG_INFINITY && !v.is_nan());
    let (mut max, mut sum, mut count) = (f32::NEG_INFINITY, 0f64, 0usize);
    for v in finite.clone() {
        max = max.max(v);
        sum += v as f64;
        count += 1;
    }
    if count == 0 {
        return f32::NEG_INFINITY;
    }
    let mean = sum / count as f64;
    let var = finite.map(|v| (v as f64 - mean).powi(2)).sum::<f64>() / count as f64;
    max - n * var.sqrt() as f32
}

/// Locally typical sampling: the candidates whose surprise `−ln p` is
/// closest to the distribution's entropy, in that order, until their mass
/// passes `p` (`probs`: the candidates' probabilities). Returns the kept
/// candidates, best logit first.
pub fn typical(cand: &[(u32, f32)], probs: &[f64], p: f32) -> Vec<(u32, f32)> {
    let entropy: f64 = probs
        .iter()
        .filter(|&&q| q > 0.0)
        .map(|&q| -q * q.ln())
        .sum();
    let mut order: Vec<usize> = (0..cand.len()).collect();
    let shift = |i: usize| (-probs[i].ln() - entropy).abs();
    order.sort_by(|&a, &b| shift(a).total_cmp(&shift(b)));
    let mut cum = 0.0;
    let mut keep = order.len();
    for (i, &j) in order.iter().enumerate() {
        cum += probs[j];
        if cum > p as f64 {
            keep = i + 1;
            break;
        }
    }
    let mut out: Vec<(u32, f32)> = order[..keep].iter().map(|&j| cand[j]).collect();
    out.sort_by(super::top_k::better);
    out
}

/// XTC ("exclude top choices"), once its coin came up: every candidate at
/// least `threshold` likely but the least likely of them is dropped
/// (`cand` best first; nothing when fewer than two reach the threshold).
pub fn xtc(cand: &mut Vec<(u32, f32)>, threshold: f32) {
    let probs = softmax(cand);
    let above = probs.iter().take_while(|&&q| q >= threshold as f64).count();
    if above >= 2 {
        cand.drain(..above - 1);
    }
}

/// Mirostat's target: `mu` starts at `2·tau` and follows the observed
/// surprise of each sampled token.
#[derive(Clone, Debug, PartialEq)]
pub struct MirostatState {
    pub mu: f32,
}

/// Mirostat 1.0 (Basu et al. 2021): estimates the Zipf exponent `s` from
/// the `m` most likely candidates, keeps the top `k` that make the
/// expected surprise `mu`. `cand` best first, `probs` theirs.
pub fn mirostat_v1_k(probs: &[f64], mu: f32, n_vocab: usize, m: usize) -> usize {
    let (mut num, mut den) = (0f64, 0f64);
    for i in 0..m.saturating_sub(1).min(probs.len().saturating_sub(1)) {
        let t = ((i + 2) as f64 / (i + 1) as f64).ln();
        let b = (probs[i] / probs[i + 1]).ln();
        num += t * b;
        den += t * t;
    }
    let s = num / den;
    let eps = s - 1.0;
    let k = ((eps * 2f64.powf(mu as f64)) / (1.0 - (n_vocab as f64).powf(-eps))).powf(1.0 / s);
    if k.is_finite() && k >= 1.0 {
        (k as usize).min(probs.len())
    } else {
        1
    }
}

/// Mirostat 2.0: the candidates whose surprise `−log2 p` is at most `mu`
/// (at least one); `probs` best first.
pub fn mirostat_v2_keep(probs: &[f64], mu: f32) -> usize {
    probs
        .iter()
        .take_while(|&&q| -q.log2() <= mu as f64)
        .count()
        .max(1)
}

/// Mirostat's update after sampling a token of probability `p` (among the
/// kept candidates): `mu ← mu − eta · (−log2 p − tau)`.
pub fn mirostat_update(state: &mut MirostatState, p: f64, tau: f32, eta: f32) {
    let surprise = -p.log2() as f32;
    state.mu -= eta * (surprise - tau);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sigma_floor_is_max_minus_n_std() {
        let v = [1.0f32, 2.0, 3.0, 4.0, f32::NEG_INFINITY, f32::NAN];
        // mean 2.5, σ = sqrt(1.25)
        let f = sigma_floor(v.iter().copied(), 1.0);
        assert!((f - (4.0 - 1.25f32.sqrt())).abs() < 1e-6);
        assert_eq!(
            sigma_floor([f32::NAN].iter().copied(), 1.0),
            f32::NEG_INFINITY
        );
    }

    #[test]
    fn typical_keeps_the_tokens_nearest_the_entropy() {
        // one dominant token and a flat tail: the entropy is low, the
        // dominant token's surprise nearest it
        let cand = [(0u32, 5.0f32), (1, 1.0), (2, 1.0), (3, 1.0)];
        let probs = softmax(&cand);
        let kept = typical(&cand, &probs, 0.05);
        assert_eq!(kept.len(), 1);
        let kept = typical(&cand, &probs, 0.99);
        assert_eq!(kept.len(), 4);
        assert_eq!(kept[0].0, 0);
    }

    #[test]
    fn xtc_drops_all_likely_tokens_but_the_least() {
        let mut c = vec![(0u32, 3.0f32), (1, 2.9), (2, 2.8), (3, -5.0)];
        xtc(&mut c, 0.1);
        assert_eq!(c.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 3]);
        let mut c = vec![(0u32, 9.0f32), (1, 0.0)];
        xtc(&mut c, 0.1);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn mirostat_cuts_follow_mu() {
        let cand: Vec<(u32, f32)> = (0..100).map(|i| (i, -(i as f32).ln_1p() * 2.0)).collect();
        let probs = softmax(&cand);
        // a higher target surprise keeps more
        let lo = mirostat_v1_k(&probs, 2.0, 100, 100);
        let hi = mirostat_v1_k(&probs, 8.0, 100, 100);
        assert!(lo >= 1 && lo < hi, "{lo} {hi}");
        assert_eq!(mirostat_v2_keep(&probs, 0.0), 1);
        assert!(mirostat_v2_keep(&probs, 6.0) > mirostat_v2_keep(&probs, 3.0));
        let mut s = MirostatState { mu: 10.0 };
        mirostat_update(&mut s, 0.25, 5.0, 0.5);
        // surprise 2 bits, 3 under the target: mu rises by 1.5
        assert!((s.mu - 11.5).abs() < 1e-6);
    }
}
