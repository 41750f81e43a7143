//! On-the-fly quantization of f32 activations for the integer dot products:
//! Q8_0-style (32 values per scale) for Q8_0 / Q4_0 / IQ4_NL weights and
//! Q8_K-style (256 values per scale, sums per 16) for K-quants and IQ4_XS.
//! Scales are kept in f32 (ggml rounds the Q8_0 scale to f16; this is an
//! internal buffer, so we keep the extra precision).

/// Activations of `n_tokens` rows of `cols` values, quantized to i8.
#[derive(Default, Debug, Clone)]
pub struct QuantAct {
    /// `[n_tokens, cols]` quantized values.
    pub qs: Vec<i8>,
    /// One scale per block: `[n_tokens, cols / block]`.
    pub d: Vec<f32>,
    /// Sums of `qs` per group: Q8_0 style per block of 32, Q8_K style per 16.
    pub sums: Vec<i16>,
    pub cols: usize,
}

impl QuantAct {
    /// Quantizes `x` (`[n_tokens, cols]`) with 32 values per scale.
    pub fn q8_0(x: &[f32], cols: usize) -> QuantAct {
        let mut a = QuantAct::default();
        a.fill(x, cols, 32, 32);
        a
    }

    /// Quantizes `x` (`[n_tokens, cols]`) with 256 values per scale, sums per 16.
    pub fn q8_k(x: &[f32], cols: usize) -> QuantAct {
        let mut a = QuantAct::default();
        a.fill(x, cols, 256, 16);
        a
    }

    fn fill(&mut self, x: &[f32], cols: usize, block: usize, group: usize) {
        assert!(cols.is_multiple_of(block) && x.len().is_multiple_of(cols.max(1)));
        self.cols = cols;
        self.qs.clear();
        self.qs.resize(x.len(), 0);
        self.d.clear();
        self.d.resize(x.len() / block, 0.0);
        self.sums.clear();
        self.sums.resize(x.len() / group, 0);
        quantize_blocks_mv(x, &mut self.qs, &mut self.d, block);
        for (s, qg) in self.sums.iter_mut().zip(self.qs.chunks_exact(group)) {
            *s = qg.iter().map(|&q| q as i16).sum();
        }
    }

    /// Values of token `t`.
    #[inline]
    pub fn qs_row(&self, t: usize) -> &[i8] {
        &self.qs[t * self.cols..(t + 1) * self.cols]
    }
}

/// Most tokens an [`ActPanel`] holds (the lanes of its scale rows).
pub(crate) const PANEL_LANES: usize = 16;

/// The quantized activations of a few tokens interleaved for the few-token
/// kernels, so one pointer reaches every token at fixed offsets:
/// * `qs`: `[cols / chunk][nt][chunk]`: `chunk`-value chunk `c` of token `t` at
///   `(c·nt + t)·chunk` (`chunk`: 32 or 64, a vector of the kernel reading it)
/// * `d`: `[n_blocks][PANEL_LANES]`: token `t`'s scale of block `i` in lane `t` (the
///   lanes past `nt` are 0)
/// * `sums`: `[n_blocks][nt][per_block]` (the group sums of block `i` of token `t`)
/// * `hq`, `hoff`, `hxd`, `hxs`: empty here; the AVX-512 32-value formats' tiles
///   build their own panels with only these (per group of 8 blocks, the
///   values in half-block lanes, the offset terms and the spread scales)
#[derive(Debug)]
pub(crate) struct ActPanel {
    pub nt: usize,
    pub n_blocks: usize,
    pub qs: Vec<i8>,
    pub d: Vec<f32>,
    pub sums: Vec<i16>,
    pub hq: Vec<i8>,
    pub hoff: Vec<i32>,
    pub hxd: Vec<f32>,
    /// The AVX-512 Q4_K rows-in-lanes kernels' block sums: per block and
    /// token, `Σ qx` of each 32-value sub-block as i16 (`[n_blocks][nt][8]`).
    pub hxs: Vec<i16>,
}

impl ActPanel {
    /// Tokens `t0..t0 + nt` of `a` (`nt` ≤ [`PANEL_LANES`]), whose blocks
    /// have `block` values and `per_block` group sums each, interleaved in
    /// chunks of `chunk` values (a divisor of the row length).
    pub(crate) fn new(
        a: &QuantAct,
        t0: usize,
        nt: usize,
        block: usize,
        per_block: usize,
        chunk: usize,
    ) -> Self {
        assert!((1..=PANEL_LANES).contains(&nt) && a.cols.is_multiple_of(block));
        assert!(chunk > 0 && a.cols.is_multiple_of(chunk));
        let (cols, nb) = (a.cols, a.cols / block);
        let chunks = cols / chunk;
        let mut qs = vec![0i8; nt * cols];
        for (c, dst) in qs.chunks_exact_mut(nt * chunk).enumerate().take(chunks) {
            for (t, d) in dst.chunks_exact_mut(chunk).enumerate() {
                let src = (t0 + t) * cols + chunk * c;
                d.copy_from_slice(&a.qs[src..src + chunk]);
            }
        }
        let mut d = vec![0f32; nb * PANEL_LANES];
        let mut sums = vec![0i16; nb * nt * per_block];
        for i in 0..nb {
            for t in 0..nt {
                d[i * PANEL_LANES + t] = a.d[(t0 + t) * nb + i];
                let src = ((t0 + t) * nb + i) * per_block;
                let dst = (i * nt + t) * per_block;
                sums[dst..dst + per_block].copy_from_slice(&a.sums[src..src + per_block]);
            }
        }
        ActPanel {
            nt,
            n_blocks: nb,
            qs,
            d,
            sums,
            hq: Vec::new(),
            hoff: Vec::new(),
            hxd: Vec::new(),
            hxs: Vec::new(),
        }
    }
}

/// Quantizes each `block` of `x` to i8 with scale `amax / 127` (round half
/// away from zero; NaN values ignored by the maximum, quantized to 0). The
/// definition, and the path without SIMD.
fn quantize_blocks(x: &[f32], qs: &mut [i8], d: &mut [f32], block: usize) {
    for ((xb, qb), d) in x
        .chunks_exact(block)
        .zip(qs.chunks_exact_mut(block))
        .zip(d.iter_mut())
    {
        let mut lanes = [0f32; 8];
        let mut c8 = xb.chunks_exact(8);
        for c in &mut c8 {
            for (m, v) in lanes.iter_mut().zip(c) {
                *m = m.max(v.abs());
            }
        }
        let amax = c8
            .remainder()
            .iter()
            .fold(lanes.iter().fold(0f32, |m, &v| m.max(v)), |m, v| {
                m.max(v.abs())
            });
        if amax == 0.0 || !amax.is_finite() {
            *d = if amax.is_finite() { 0.0 } else { amax };
            qb.fill(0);
            continue;
        }
        *d = amax / 127.0;
        let id = 127.0 / amax;
        for (q, v) in qb.iter_mut().zip(xb) {
            *q = (v * id).round().clamp(-127.0, 127.0) as i8;
        }
    }
}

/// [`quantize_blocks`] with AVX2 where the CPU has it (bit for bit the same
/// results). Left to the compiler, the conversion to i8 stayed scalar (a
/// `vcvttss2si` and a `vpinsrb` per value: 6% of an AVX2 prefill).
pub(crate) fn quantize_blocks_mv(x: &[f32], qs: &mut [i8], d: &mut [f32], block: usize) {
    #[cfg(target_arch = "x86_64")]
    if block.is_multiple_of(32) && crate::simd::level() != crate::simd::SimdLevel::Scalar {
        // SAFETY: the level reports AVX2 (or above) only where the CPU has it.
        return unsafe { quantize_blocks_avx2(x, qs, d, block) };
    }
    quantize_blocks(x, qs, d, block)
}

/// [`quantize_blocks`] for blocks of a multiple of 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_blocks_avx2(x: &[f32], qs: &mut [i8], d: &mut [f32], block: usize) {
    use std::arch::x86_64::*;
    let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let signmask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    let (half, one) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0));
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for ((xb, qb), d) in x
        .chunks_exact(block)
        .zip(qs.chunks_exact_mut(block))
        .zip(d.iter_mut())
    {
        // max(a, b) returns b where either is NaN: NaN values are skipped,
        // as by f32::max
        let mut m = _mm256_setzero_ps();
        for v in xb.chunks_exact(8) {
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(v.as_ptr()), absmask), m);
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let amax = _mm_cvtss_f32(_mm_max_ss(m2, _mm_movehdup_ps(m2)));
        if amax == 0.0 || !amax.is_finite() {
            *d = if amax.is_finite() { 0.0 } else { amax };
            qb.fill(0);
            continue;
        }
        *d = amax / 127.0;
        let id = _mm256_set1_ps(127.0 / amax);
        // round half away from zero: trunc, plus ±1 where |frac| ≥ 0.5
        // (p − trunc(p) is exact); then clamped, NaN to 0
        let q = |v: &[f32]| {
            let p = _mm256_mul_ps(_mm256_loadu_ps(v.as_ptr()), id);
            let t = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(p);
            let frac = _mm256_and_ps(_mm256_sub_ps(p, t), absmask);
            let step = _mm256_or_ps(one, _mm256_and_ps(p, signmask));
            let r = _mm256_add_ps(
                t,
                _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, half), step),
            );
            let r = _mm256_min_ps(hi, _mm256_max_ps(lo, r));
            _mm256_cvtps_epi32(_mm256_and_ps(r, _mm256_cmp_ps::<_CMP_ORD_Q>(r, r)))
        };
        for (v, o) in xb.chunks_exact(32).zip(qb.chunks_exact_mut(32)) {
            let ab = _mm256_packs_epi32(q(&v[..8]), q(&v[8..16]));
            let cd = _mm256_packs_epi32(q(&v[16..24]), q(&v[24..]));
            let all = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd), order);
            _mm256_storeu_si256(o.as_mut_ptr() as *mut __m256i, all);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::QuantAct;

    /// The SIMD quantizer agrees with the scalar definition bit for bit on
    /// random blocks with ties, NaN and both signs, at 32 and 256 values.
    #[test]
    fn simd_quantizer_is_the_definition() {
        let mut rng = crate::testutil::Rng::new(5);
        for block in [32, 256] {
            let mut x = rng.vec(64 * block);
            for (i, v) in x.iter_mut().enumerate() {
                match i % 97 {
                    0 => *v = 127.0, // amax 127: id = 1, the halves below are ties
                    1 => *v = -((i % 13) as f32 + 0.5),
                    2 => *v = (i % 11) as f32 + 0.5,
                    3 if i % 5 == 0 => *v = f32::NAN,
                    _ => *v *= 40.0,
                }
            }
            let (mut q1, mut d1) = (vec![0i8; x.len()], vec![0f32; x.len() / block]);
            let (mut q2, mut d2) = (q1.clone(), d1.clone());
            super::quantize_blocks(&x, &mut q1, &mut d1, block);
            super::quantize_blocks_mv(&x, &mut q2, &mut d2, block);
            assert_eq!(q1, q2, "block {block}");
            let bits = |d: &[f32]| d.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&d1), bits(&d2), "block {block}");
        }
    }

    /// The vectorized quantization gives the plain scalar loop's values,
    /// including NaN / infinite / all-zero blocks and ties at .5.
    #[test]
    fn quantization_matches_the_scalar_definition() {
        let mut x: Vec<f32> = (0..4 * 256)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 0.013)
            .collect();
        x[40] = 127.0; // amax 127: exact .5 ties below
        x[41] = 0.5;
        x[42] = -2.5;
        x[300] = f32::NAN;
        x[600] = f32::INFINITY;
        for v in &mut x[768..800] {
            *v = 0.0;
        }
        for (block, a) in [
            (32, QuantAct::q8_0(&x, 256)),
            (256, QuantAct::q8_k(&x, 256)),
        ] {
            for (b, xb) in x.chunks_exact(block).enumerate() {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                let want_d = if amax == 0.0 || !amax.is_finite() {
                    if amax.is_finite() {
                        0.0
                    } else {
                        amax
                    }
                } else {
                    amax / 127.0
                };
                assert_eq!(a.d[b].to_bits(), want_d.to_bits(), "block {b} of {block}");
                for (k, v) in xb.iter().enumerate() {
                    let want = if amax == 0.0 || !amax.is_finite() {
                        0
                    } else {
                        (v * (127.0 / amax)).round().clamp(-127.0, 127.0) as i8
                    };
                    assert_eq!(
                        a.qs[b * block + k],
                        want,
                        "value {k} of block {b} of {block}"
                    );
                }
            }
        }
    }
}
