//! The activations' quantization for the Q8_0 integer GEMM (widened to i16), in AVX2 registers
//! and bit for bit as [`crate::matmul::act::QuantAct`] does it: per block
//! (32 values for Q8_0, 256 for the K-quants) `dx = amax / 127` and
//! `qx = round(x · 127 / amax)` (ties away from zero), clamped to ±127;
//! NaN values count as 0, a block with an infinity gets `dx = ±inf` and
//! `qx = 0`, a zero block `dx = 0`.

use std::arch::x86_64::*;

/// Eight values of `x` from `p`, NaN lanes as 0 (the scalar code's `max`
/// skips them and `NaN as i8` is 0).
///
/// # Safety
/// AVX available; `p` readable for 8 floats.
#[inline(always)]
unsafe fn load(p: *const f32) -> __m256 {
    let l = _mm256_loadu_ps(p);
    _mm256_and_ps(l, _mm256_cmp_ps::<_CMP_ORD_Q>(l, l))
}

/// `max |x|` over a block (a multiple of 8 values), NaN counted as 0.
///
/// # Safety
/// AVX available.
#[inline(always)]
unsafe fn abs_max(xb: &[f32]) -> f32 {
    let absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let mut m = _mm256_setzero_ps();
    for c in xb.chunks_exact(8) {
        m = _mm256_max_ps(m, _mm256_and_ps(load(c.as_ptr()), absmask));
    }
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)))
}

/// `round(x · id)` of 8 values at `p`, clamped to ±127, as i32 lanes.
///
/// # Safety
/// AVX available; `p` readable for 8 floats.
#[inline(always)]
unsafe fn round8(p: *const f32, id: __m256) -> __m256i {
    let signmask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    // round() as trunc(v + copysign(0.5 - 2^-25, v)): exact (0.5 itself
    // would turn 0.49999997 into 1)
    let half = _mm256_set1_ps(0.499_999_97);
    let (lim, nlim) = (_mm256_set1_ps(127.0), _mm256_set1_ps(-127.0));
    let v = _mm256_mul_ps(load(p), id);
    let r = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(_mm256_add_ps(
        v,
        _mm256_or_ps(_mm256_and_ps(v, signmask), half),
    ));
    _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(r, lim), nlim))
}

/// The scale of a block and `127 / amax`, or `None` (with `dx` set) for a
/// block whose `qx` are all 0.
///
/// # Safety
/// AVX available.
#[inline(always)]
unsafe fn scale(xb: &[f32], dx: &mut f32) -> Option<__m256> {
    let amax = abs_max(xb);
    if amax == 0.0 || !amax.is_finite() {
        *dx = if amax.is_finite() { 0.0 } else { amax };
        return None;
    }
    *dx = amax / 127.0;
    Some(_mm256_set1_ps(127.0 / amax))
}

/// One token, blocks of 32, `qx` widened to i16 (the Q8_0 GEMM's operand).
///
/// # Safety
/// AVX2 available; `x.len()` a multiple of 32, `qx` as long, `dx` one per 32.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn row_i16(x: &[f32], qx: &mut [i16], dx: &mut [f32]) {
    for ((xb, qb), d) in x
        .chunks_exact(32)
        .zip(qx.chunks_exact_mut(32))
        .zip(dx.iter_mut())
    {
        let Some(id) = scale(xb, d) else {
            qb.fill(0);
            continue;
        };
        let q: [__m256i; 4] = std::array::from_fn(|j| round8(xb.as_ptr().add(8 * j), id));
        // packs interleave the 128-bit lanes: [0 1 | 0 1] -> put them back
        let lo = _mm256_permute4x64_epi64::<0xD8>(_mm256_packs_epi32(q[0], q[1]));
        let hi = _mm256_permute4x64_epi64::<0xD8>(_mm256_packs_epi32(q[2], q[3]));
        _mm256_storeu_si256(qb.as_mut_ptr() as *mut __m256i, lo);
        _mm256_storeu_si256(qb.as_mut_ptr().add(16) as *mut __m256i, hi);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::act::QuantAct;
    use crate::testutil::Rng;

    /// Values that stress the rounding and the special blocks: ties after
    /// scaling, NaN, ±infinity, a zero block, a value just below a tie.
    fn tricky(n_blocks32: usize) -> Vec<f32> {
        let mut rng = Rng::new(5);
        let mut x = rng.vec(32 * n_blocks32);
        // block 1: ties after scaling (amax 127: qx = x exactly)
        x[32] = 127.0;
        for i in 1..32 {
            x[32 + i] = (i as f32 - 16.0) + 0.5;
        }
        x[64 + 3] = f32::NAN; // block 2
        x[96 + 5] = f32::INFINITY; // block 3
        x[128..160].fill(0.0); // block 4
        x[160] = 0.499_999_97; // block 5: just below a tie
        x[161] = 1.0;
        x[192 + 7] = -f32::INFINITY; // block 6
        x
    }

    /// Blocks of 32 to i16, bit for bit as the decode path.
    #[test]
    fn row_i16_matches_quant_act() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return;
        }
        let x = tricky(8);
        let a = QuantAct::q8_0(&x, x.len());
        let (mut qx, mut dx) = (vec![0i16; x.len()], vec![0f32; x.len() / 32]);
        // SAFETY: AVX2 checked above.
        unsafe { row_i16(&x, &mut qx, &mut dx) };
        for (i, (q, r)) in qx.iter().zip(&a.qs).enumerate() {
            assert_eq!(*q, *r as i16, "value {i} ({})", x[i]);
        }
        for (b, (d, r)) in dx.iter().zip(&a.d).enumerate() {
            assert_eq!(d.to_bits(), r.to_bits(), "block {b}");
        }
    }
}
