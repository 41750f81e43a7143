//! The softmax normalizer of a row of logits, `Σ exp(l − max)`, in f64 and
//! vectorized per SIMD level: samplers that cut by probability (top-p,
//! min-p without top-k) need the whole row's, and libm's `exp` per logit
//! took ~4 ms of each token on a 248k-token vocabulary.

use crate::multiversion;

/// `e^x` for `x ≤ 0`, to about 1 ulp, in operations a compiler vectorizes
/// (no branch, no table, no call): `x = k·ln 2 + r` with `|r| ≤ ln 2 / 2`,
/// `e^r` by its Taylor series to degree 12 (remainder < 2e-16), `2^k` built
/// in the exponent bits. Below −708 it returns `e^−708` (~3e-308): beside
/// the largest term of a row, 1, nothing.
#[inline(always)]
pub fn exp_neg_f64(x: f64) -> f64 {
    const LOG2E: f64 = std::f64::consts::LOG2_E;
    // ln 2 in two parts (fdlibm's): k·LN2_HI is exact for |k| < 2^11
    const LN2_HI: f64 = f64::from_bits(0x3FE6_2E42_FEE0_0000);
    const LN2_LO: f64 = f64::from_bits(0x3DEA_39EF_3579_3C76);
    // adding it rounds to an integer k (round to nearest) and leaves k + 1023
    // in the low mantissa bits
    const SHIFT: f64 = 4_503_599_627_370_496.0 + 1023.0;
    let x = x.max(-708.0);
    let t = x * LOG2E + SHIFT;
    let k = t - SHIFT;
    let r = (x - k * LN2_HI) - k * LN2_LO;
    // 1/n! for n = 12 down to 0
    const C: [f64; 13] = [
        1.0 / 479_001_600.0,
        1.0 / 39_916_800.0,
        1.0 / 3_628_800.0,
        1.0 / 362_880.0,
        1.0 / 40_320.0,
        1.0 / 5_040.0,
        1.0 / 720.0,
        1.0 / 120.0,
        1.0 / 24.0,
        1.0 / 6.0,
        0.5,
        1.0,
        1.0,
    ];
    let mut p = C[0];
    for c in &C[1..] {
        p = p * r + c;
    }
    // 2^k: k + 1023 (1..=1023 here) into the exponent field
    p * f64::from_bits(t.to_bits() << 52)
}

#[inline(always)]
fn term(l: f32, max: f64) -> f64 {
    let e = exp_neg_f64(f64::from(l) - max);
    if l.is_nan() {
        0.0
    } else {
        e
    }
}

#[inline(always)]
fn exp_sum_body(v: &[f32], max: f64) -> f64 {
    let mut acc = [0f64; 8];
    let chunks = v.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, &l) in acc.iter_mut().zip(c) {
            *a += term(l, max);
        }
    }
    let t: f64 = tail.iter().map(|&l| term(l, max)).sum();
    acc.iter().sum::<f64>() + t
}
multiversion!(fn exp_sum_mv(v: &[f32], max: f64) -> f64 => exp_sum_body);

/// `Σ exp(l − max)` over the logits `v` (NaNs left out), in f64; every `l`
/// at most `max`.
pub fn exp_sum(v: &[f32], max: f64) -> f64 {
    exp_sum_mv(v, max)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn exp_matches_libm() {
        let mut worst = 0f64;
        let mut x = -707.9;
        while x <= 0.0 {
            let (a, b) = (exp_neg_f64(x), x.exp());
            worst = worst.max((a - b).abs() / b);
            x += 0.013_7;
        }
        for x in [0.0, -1e-300, -0.5 * std::f64::consts::LN_2, -1.0, -30.0] {
            let (a, b) = (exp_neg_f64(x), x.exp());
            worst = worst.max((a - b).abs() / b);
        }
        assert!(worst < 1e-15, "relative error {worst}");
        assert!(exp_neg_f64(-800.0) < 1e-307 && exp_neg_f64(f64::NEG_INFINITY) < 1e-307);
    }

    /// At every level the CPU has: the sum of libm's terms, NaNs out.
    #[test]
    pub(crate) fn sums_match_libm() {
        let mut s = 7u64;
        let mut v: Vec<f32> = (0..10_007)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (s >> 40) as f32 / (1u64 << 24) as f32 * 40.0 - 30.0
            })
            .collect();
        v[17] = f32::NAN;
        v[18] = f32::NEG_INFINITY;
        let max = v
            .iter()
            .copied()
            .filter(|l| !l.is_nan())
            .fold(f32::MIN, f32::max) as f64;
        let want: f64 = v
            .iter()
            .filter(|l| !l.is_nan())
            .map(|&l| (f64::from(l) - max).exp())
            .sum();
        for n in [0, 1, 7, 8, 9, 1000, v.len()] {
            let want_n: f64 = v[..n]
                .iter()
                .filter(|l| !l.is_nan())
                .map(|&l| (f64::from(l) - max).exp())
                .sum();
            let got = exp_sum(&v[..n], max);
            assert!(
                (got - want_n).abs() <= 1e-13 * want_n.max(1e-300),
                "{n}: {got} vs {want_n}"
            );
        }
        assert!((exp_sum(&v, max) - want).abs() <= 1e-13 * want);
    }
}
