//! The Mamba-2 decode update of one state row while the state moves to a
//! new buffer (a checkpoint keeps the old one): reads the old row, writes
//! the new one with non-temporal stores. The new buffer is not in cache
//! (the state is tens of MB); ordinary stores would first read each line
//! of it (read-for-ownership), a third pass over the state per token.
//! Streaming stores make keeping the old state as a checkpoint cost the
//! same traffic as updating it in place: one read and one write.
//!
//! Same arithmetic, in the same order, as the row loop of `ssm::m2_head`
//! (16 partial sums, added in order), so the result is bit for bit the
//! in-place update's. A bf16 state (`ssm_bf16`) streams its rounded rows
//! with [`stream_row_bf16`].

/// Whether [`move_row`] can run: AVX2, rows a whole number of 16-lane
/// steps, the destination 16-byte aligned.
#[inline]
pub(crate) fn usable(dst: &[f32], n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        n.is_multiple_of(16)
            && (dst.as_ptr() as usize).is_multiple_of(16)
            && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, n);
        false
    }
}

/// `dst[i] = src[i]·da + xdt·b[i]` (streamed), returns `Σ dst[i]·c[i]`
/// summed as `m2_head` sums it. Call [`fence`] before another thread reads
/// `dst`. Requires [`usable`].
///
/// # Safety
/// The CPU has AVX2; `dst`, `src`, `b`, `c` hold `n` values, `n` a multiple
/// of 16, `dst` 16-byte aligned.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn move_row(
    dst: &mut [f32],
    src: &[f32],
    b: &[f32],
    c: &[f32],
    da: f32,
    xdt: f32,
) -> f32 {
    use std::arch::x86_64::*;
    let n = dst.len();
    let (vda, vx) = (_mm256_set1_ps(da), _mm256_set1_ps(xdt));
    let mut acc = [_mm256_setzero_ps(); 2];
    let d = dst.as_mut_ptr();
    for i in (0..n).step_by(16) {
        for (h, acc) in acc.iter_mut().enumerate() {
            let k = i + 8 * h;
            let s = _mm256_loadu_ps(src.as_ptr().add(k));
            let bv = _mm256_loadu_ps(b.as_ptr().add(k));
            let cv = _mm256_loadu_ps(c.as_ptr().add(k));
            let v = _mm256_add_ps(_mm256_mul_ps(s, vda), _mm256_mul_ps(vx, bv));
            *acc = _mm256_add_ps(*acc, _mm256_mul_ps(v, cv));
            _mm_stream_ps(d.add(k), _mm256_castps256_ps128(v));
            _mm_stream_ps(d.add(k + 4), _mm256_extractf128_ps(v, 1));
        }
    }
    let mut lanes = [0f32; 16];
    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
    lanes.iter().sum()
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn move_row(
    _dst: &mut [f32],
    _src: &[f32],
    _b: &[f32],
    _c: &[f32],
    _da: f32,
    _xdt: f32,
) -> f32 {
    unreachable!("usable() is false off x86-64")
}

/// Whether [`stream_row_bf16`] can run: AVX2, rows a whole number of
/// 16-lane steps, the destination 16-byte aligned.
#[inline]
pub(crate) fn usable_bf16(dst: &[half::bf16], n: usize) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        n.is_multiple_of(16)
            && (dst.as_ptr() as usize).is_multiple_of(16)
            && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (dst, n);
        false
    }
}

/// `dst = src` rounded to bf16 (nearest even, NaN kept: as
/// `state_elem::round_bf16`), 16 values at a time, streamed. Call [`fence`]
/// before another thread reads `dst`.
///
/// # Safety
/// The CPU has AVX2; `dst` and `src` hold the same number of values, a
/// multiple of 16; `dst` is 16-byte aligned.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn stream_row_bf16(dst: &mut [half::bf16], src: &[f32]) {
    use std::arch::x86_64::*;
    debug_assert_eq!(dst.len(), src.len());
    let (bias, one, quiet) = (
        _mm256_set1_epi32(0x7fff),
        _mm256_set1_epi32(1),
        _mm256_set1_epi32(0x0040),
    );
    // Eight f32 → eight rounded bf16 in the low halves of 32-bit lanes.
    let round8 = |p: *const f32| {
        let v = _mm256_loadu_ps(p);
        let bits = _mm256_castps_si256(v);
        let hi = _mm256_srli_epi32(bits, 16);
        let lsb = _mm256_and_si256(hi, one);
        let r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(bias, lsb)), 16);
        let nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan)
    };
    let d = dst.as_mut_ptr() as *mut __m128i;
    for i in (0..src.len()).step_by(16) {
        let lo = round8(src.as_ptr().add(i));
        let hi = round8(src.as_ptr().add(i + 8));
        // packus works per 128-bit lane: [lo0-3 hi0-3 lo4-7 hi4-7], put
        // back in order.
        let packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0b11_01_10_00);
        _mm_stream_si128(d.add(i / 8), _mm256_castsi256_si128(packed));
        _mm_stream_si128(d.add(i / 8 + 1), _mm256_extracti128_si256(packed, 1));
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn stream_row_bf16(_dst: &mut [half::bf16], _src: &[f32]) {
    unreachable!("usable_bf16() is false off x86-64")
}

/// Orders the streamed stores before what follows (the pool's hand-back).
#[inline]
pub(crate) fn fence() {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE is part of x86-64.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::state_elem::round_bf16;
    use crate::testutil::Rng;
    use half::bf16;

    /// The streamed rounding is the scalar one (ties, NaN, inf included).
    #[test]
    fn streamed_bf16_rows_round_like_the_scalar_code() {
        let mut rng = Rng::new(9);
        let mut src: Vec<f32> = (0..64)
            .map(|_| f32::from_bits(rng.next_u64() as u32))
            .collect();
        src[1] = f32::from_bits(0x3f80_8000);
        src[2] = f32::from_bits(0x3f81_8000);
        src[3] = f32::from_bits(0x7f80_0001);
        src[4] = f32::NEG_INFINITY;
        src[5] = f32::MAX;
        // 16-byte aligned destination.
        let mut buf = vec![0u128; 64 * 2 / 16];
        // SAFETY: u128 storage reinterpreted as 64 bf16.
        let dst = unsafe { std::slice::from_raw_parts_mut(buf.as_mut_ptr() as *mut bf16, 64) };
        if !usable_bf16(dst, 64) {
            return;
        }
        // SAFETY: checked just above.
        unsafe { stream_row_bf16(dst, &src) };
        fence();
        for (g, &x) in dst.iter().zip(&src) {
            assert_eq!(g.to_bits(), round_bf16(x).to_bits(), "{:08x}", x.to_bits());
        }
    }
}
