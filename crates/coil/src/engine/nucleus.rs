//! Top-p / min-p candidates when top-k is off, without sorting the row.
//!
//! With top-k off (`top_k` 0, or −1 as vLLM-style clients send) the sampler
//! sorted every logit of the row to cut its tail by min-p and top-p: ~10 ms
//! per sequence and token on a 248k-token vocabulary. Both cuts keep only
//! logits near the largest — min-p those within `ln(min_p)` of it, top-p
//! (without min-p) a head whose mass reaches `top_p` — so [`nucleus`] sorts
//! only those, and hands back the whole row's softmax normalizer, which the
//! cuts need (`coil_kernels::ops::softmax::exp_sum`, vectorized in f64):
//! each kept probability is then the one a full sort gives.

use super::top_k::better;

/// Logits this far under the largest carry less than e⁻³⁰ each of its
/// probability: with min-p off, top-p's head is looked for among the
/// others (on 248k tokens they hold all but ~2.4e-8 of the mass).
const FAR: f64 = 30.0;

/// What the cuts need: the candidates (best first), the largest logit and
/// `Σ exp(l − max)` over every logit of the row (NaNs left out), in f64.
#[derive(Debug)]
pub struct Nucleus {
    pub cand: Vec<(u32, f32)>,
    pub max: f64,
    pub norm: f64,
}

impl Nucleus {
    /// The candidates' probabilities over the whole row.
    pub fn probs(&self) -> Vec<f64> {
        self.cand
            .iter()
            .map(|c| (f64::from(c.1) - self.max).exp() / self.norm)
            .collect()
    }
}

/// The logits of `row`, `adjusted` replacing its tokens' (distinct ids),
/// that min-p (`min_p` > 0: within `ln(min_p)` of the largest) or else
/// top-p can keep — for top-p alone, the logits within 4, 8, 16, then
/// `FAR` (30) of the largest, the first of these heads whose mass reaches
/// `top_p` — with the row's normalizer. `None` when the cuts may reach
/// further (both off, or no such head) or the row has no finite largest
/// logit: the caller then sorts the whole row.
pub fn nucleus(row: &[f32], adjusted: &[(u32, f32)], top_p: f32, min_p: f32) -> Option<Nucleus> {
    if min_p <= 0.0 && top_p >= 1.0 {
        return None;
    }
    let mut adj: Vec<(u32, f32)> = adjusted
        .iter()
        .copied()
        .filter(|a| (a.0 as usize) < row.len())
        .collect();
    adj.sort_unstable_by_key(|a| a.0);
    // the row between the adjusted tokens, then those
    let spans = || {
        let mut start = 0usize;
        adj.iter()
            .map(|a| a.0 as usize)
            .chain(std::iter::once(row.len()))
            .map(move |end| {
                let s = start..end;
                start = end + 1;
                s
            })
    };
    let mut max = f32::NEG_INFINITY;
    for s in spans() {
        max = max_of(&row[s.start..s.end.max(s.start)], max);
    }
    max = adj.iter().fold(max, |m, a| m.max(a.1));
    if !max.is_finite() {
        return None;
    }
    let max = f64::from(max);
    let values = || {
        spans()
            .flat_map(|s| (s.start..s.end.max(s.start)).map(|i| (i as u32, row[i])))
            .chain(adj.iter().copied())
            .filter(|v| !v.1.is_nan())
    };
    // the row's spans vectorized, then the adjusted tokens
    let norm: f64 = spans()
        .map(|s| coil_kernels::ops::softmax::exp_sum(&row[s.start..s.end.max(s.start)], max))
        .sum::<f64>()
        + adj
            .iter()
            .filter(|a| !a.1.is_nan())
            .map(|a| (f64::from(a.1) - max).exp())
            .sum::<f64>();
    // min-p: exp(l − max) ≥ min_p, with a margin (the cut itself is the
    // caller's); top-p alone: heads ever wider until one holds its mass
    let floors: Vec<f64> = if min_p > 0.0 {
        vec![f64::from(min_p).ln() - 1e-6]
    } else {
        vec![-4.0, -8.0, -16.0, -FAR]
    };
    for floor in floors {
        let mut n = Nucleus {
            cand: values().filter(|v| f64::from(v.1) - max >= floor).collect(),
            max,
            norm,
        };
        if min_p > 0.0 || n.probs().iter().sum::<f64>() >= f64::from(top_p) {
            n.cand.sort_unstable_by(better);
            return Some(n);
        }
    }
    None
}

/// The largest of `v` and `m` (NaNs ignored), in 16 lanes.
fn max_of(v: &[f32], m: f32) -> f32 {
    let mut lanes = [m; 16];
    let chunks = v.chunks_exact(16);
    let tail = chunks.remainder();
    for c in chunks {
        for (h, &x) in lanes.iter_mut().zip(c) {
            *h = h.max(x);
        }
    }
    tail.iter().chain(&lanes).fold(m, |a, &b| a.max(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                // distinct values over ~12 units, as a model's logits spread
                (s >> 11) as f32 / (1u64 << 53) as f32 * 12.0 - 4.0
            })
            .collect()
    }

    /// The whole row (adjusted), NaNs out, sorted; its softmax.
    fn full(row: &[f32], adjusted: &[(u32, f32)]) -> (Vec<(u32, f32)>, Vec<f64>) {
        let c = crate::engine::top_k::adjusted_sorted(row, adjusted);
        let max = f64::from(c[0].1);
        let e: Vec<f64> = c.iter().map(|x| (f64::from(x.1) - max).exp()).collect();
        let s: f64 = e.iter().sum();
        let p = e.iter().map(|v| v / s).collect();
        (c, p)
    }

    #[test]
    fn the_candidates_are_the_full_sorts_head_with_its_probabilities() {
        for (len, seed) in [(50usize, 1u64), (1000, 2), (5000, 3)] {
            let mut r = row(len, seed);
            r[7] = f32::NAN;
            // a penalized token that was the best, one lifted to the top,
            // one id past the row
            let top = full(&r, &[]).0[0].0;
            let adjusted = [(top, -9.0f32), (3, 9.5), (len as u32 + 2, 99.0)];
            for (adj, top_p, min_p) in [
                (&[][..], 1.0f32, 0.05f32),
                (&adjusted[..], 1.0, 0.05),
                (&adjusted[..], 0.9, 0.0),
                (&[][..], 0.5, 0.2),
                (&[][..], 0.99, 0.0),
            ] {
                let n = nucleus(&r, adj, top_p, min_p).expect("a head exists");
                let (c, p) = full(&r, adj);
                assert!(n.cand.len() < c.len(), "the whole row came back");
                assert_eq!(n.cand, c[..n.cand.len()].to_vec());
                for (a, b) in n.probs().iter().zip(&p) {
                    assert!((a - b).abs() <= 1e-12 * b.max(1e-300), "{a} against {b}");
                }
                // every logit a min-p cut keeps is a candidate, hardly more
                if min_p > 0.0 {
                    let kept = p
                        .iter()
                        .take_while(|&&q| q >= p[0] * f64::from(min_p))
                        .count();
                    assert!(n.cand.len() >= kept && n.cand.len() <= kept + 1);
                }
                // and top-p's head ends among them
                let mut cum = 0.0;
                let head = p.iter().position(|q| {
                    cum += q;
                    cum >= f64::from(top_p)
                });
                if min_p <= 0.0 {
                    assert!(head.unwrap() < n.cand.len());
                }
            }
        }
    }

    #[test]
    fn the_full_sort_is_left_to_the_caller_when_the_cuts_may_reach_far() {
        let r = row(100, 9);
        assert!(nucleus(&r, &[], 1.0, 0.0).is_none());
        assert!(nucleus(&[f32::NAN; 4], &[], 0.9, 0.1).is_none());
        assert!(nucleus(&[f32::NEG_INFINITY; 4], &[], 0.9, 0.1).is_none());
        // all logits equal: every one a candidate
        assert_eq!(nucleus(&[1.0; 8], &[], 0.5, 0.0).unwrap().cand.len(), 8);
        // a tail just past FAR holding more than 1 − top_p of the mass
        let mut flat = vec![-31.0f32; 200_000];
        flat[0] = 0.0;
        flat[1] = 0.0;
        assert!(nucleus(&flat, &[], 1.0 - 1e-9, 0.0).is_none());
    }
}
