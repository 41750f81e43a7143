//! Log-probabilities of sampled tokens, as OpenAI's `logprobs` reports
//! them: the model's own distribution — the log-softmax of the raw logits,
//! before penalties, bias, cuts and temperature (what llama-server and
//! vLLM report by default) — of the chosen token and of the row's most
//! likely ones.

use super::top_k::top_k;

/// One sampled token's log-probability and the `top` most likely tokens'
/// (best first).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprob {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// `ln Σ exp(l)` over the row (NaNs left out; −∞ for a row without a
/// finite logit), vectorized.
pub fn log_sum_exp(row: &[f32]) -> f64 {
    let max = row
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m });
    if !max.is_finite() {
        return f64::from(max);
    }
    let max = f64::from(max);
    max + coil_kernels::ops::softmax::exp_sum(row, max).ln()
}

/// `token`'s log-probability in `row` and the `n_top` most likely tokens'.
pub fn token_logprob(row: &[f32], token: u32, n_top: usize) -> TokenLogprob {
    let lse = log_sum_exp(row);
    let lp = |l: f32| (f64::from(l) - lse) as f32;
    let logprob = row
        .get(token as usize)
        .map_or(f32::NEG_INFINITY, |&l| lp(l));
    let top = top_k(row, n_top, &[])
        .into_iter()
        .map(|(t, l)| (t, lp(l)))
        .collect();
    TokenLogprob {
        token,
        logprob,
        top,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn logprobs_are_the_log_softmax_of_the_row() {
        let row = [1.0f32, 3.0, 2.0, f32::NAN];
        let z: f64 = [1.0f64, 3.0, 2.0].iter().map(|x| x.exp()).sum();
        let t = token_logprob(&row, 2, 2);
        assert!((f64::from(t.logprob) - (2.0 - z.ln())).abs() < 1e-6);
        assert_eq!(t.top.len(), 2);
        assert_eq!(t.top[0].0, 1);
        assert!((f64::from(t.top[0].1) - (3.0 - z.ln())).abs() < 1e-6);
        let total: f64 = [0u32, 1, 2]
            .iter()
            .map(|&i| f64::from(token_logprob(&row, i, 0).logprob).exp())
            .sum();
        assert!((total - 1.0).abs() < 1e-6);
    }
}
