//! The Mamba-2 row update on a state stored in bf16, in registers: each
//! 16 values of a state row are widened to f32, updated with the f32
//! kernel's arithmetic (`scan.rs`'s `m2_head`, which runs it for both
//! state types) and rounded back to bf16 (nearest even) when stored. The
//! output `y` reads the updated row before rounding. The AVX2 row sums its
//! sixteen output lanes as a tree (four adds, not sixteen in a row: the
//! f32 kernel's order is kept there for bit-exactness with what it always
//! computed), so `y` may differ from the f32 kernel's in the last bits;
//! the state does not.
//!
//! Half the state bytes of the f32 kernel are read and written per token:
//! on mamba2-370m the state is ~50 MB, a third of a Q4_K_M decode step's
//! memory traffic in f32.

use half::bf16;

/// Whether the fused row runs for rows of `n` values at the current SIMD
/// level, and whether in its AVX-512 form: `(fused, wide)`.
#[inline]
pub(super) fn usable(n: usize) -> (bool, bool) {
    let fused = avx2::usable(n);
    (fused, fused && avx512::usable())
}

/// [`avx2::row`], or with `wide` [`avx512::row`] (the same bits, 16 values
/// an instruction).
///
/// # Safety
/// What [`avx2::row`] requires, and AVX-512 with `wide` ([`usable`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn row(
    wide: bool,
    dst: *mut bf16,
    src: *const bf16,
    b: &[f32],
    c: &[f32],
    da: f32,
    xdt: f32,
    stream: bool,
) -> f32 {
    if wide {
        avx512::row(dst, src, b, c, da, xdt, stream)
    } else {
        avx2::row(dst, src, b, c, da, xdt, stream)
    }
}

/// The row update widened, computed and rounded in registers, 16 values
/// at a time.
mod avx2 {
    use crate::simd::{level, SimdLevel};
    use half::bf16;

    /// Whether [`row`] can run: rows of whole 16-value steps, AVX2 (as the
    /// SIMD level allows: a lower forced level takes the portable path).
    #[inline]
    pub(super) fn usable(n: usize) -> bool {
        n.is_multiple_of(16) && n > 0 && level() >= SimdLevel::Avx2
    }

    /// `dst[i] = bf16(src[i]·da + xdt·b[i])` for the `b.len()` values of a
    /// row, returning `Σ (src[i]·da + xdt·b[i])·c[i]` (unrounded) summed as
    /// `scan.rs`'s `m2_head` sums it (16 lanes, added in order). `stream`: store
    /// with non-temporal stores (`dst` 16-byte aligned; call
    /// `state_rows::fence` before another thread reads it).
    ///
    /// # Safety
    /// AVX2 ([`usable`]); `b`, `c` hold n values, n a multiple of 16;
    /// `dst` and `src` point at n bf16 (the same row, or rows that do not
    /// overlap).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn row(
        dst: *mut bf16,
        src: *const bf16,
        b: &[f32],
        c: &[f32],
        da: f32,
        xdt: f32,
        stream: bool,
    ) -> f32 {
        use std::arch::x86_64::*;
        let n = b.len();
        let (vda, vx) = (_mm256_set1_ps(da), _mm256_set1_ps(xdt));
        let (bias, one, quiet) = (
            _mm256_set1_epi32(0x7fff),
            _mm256_set1_epi32(1),
            _mm256_set1_epi32(0x0040),
        );
        // Eight f32 → eight bf16 (nearest even, NaN kept: `round_bf16`)
        // in the low halves of 32-bit lanes.
        let round8 = |v: __m256| {
            let bits = _mm256_castps_si256(v);
            let hi = _mm256_srli_epi32(bits, 16);
            let lsb = _mm256_and_si256(hi, one);
            let r = _mm256_srli_epi32(_mm256_add_epi32(bits, _mm256_add_epi32(bias, lsb)), 16);
            let nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            _mm256_blendv_epi8(r, _mm256_or_si256(hi, quiet), nan)
        };
        let mut acc = [_mm256_setzero_ps(); 2];
        for i in (0..n).step_by(16) {
            let raw = _mm256_loadu_si256(src.add(i) as *const __m256i);
            let halves = [
                _mm256_castsi256_si128(raw),
                _mm256_extracti128_si256(raw, 1),
            ];
            let mut out = [_mm256_setzero_si256(); 2];
            for h in 0..2 {
                let s =
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(halves[h]), 16));
                let bv = _mm256_loadu_ps(b.as_ptr().add(i + 8 * h));
                let cv = _mm256_loadu_ps(c.as_ptr().add(i + 8 * h));
                let v = _mm256_add_ps(_mm256_mul_ps(s, vda), _mm256_mul_ps(vx, bv));
                acc[h] = _mm256_add_ps(acc[h], _mm256_mul_ps(v, cv));
                out[h] = round8(v);
            }
            // packus works per 128-bit lane: [0-3 8-11 4-7 12-15], put back
            // in order.
            let packed =
                _mm256_permute4x64_epi64(_mm256_packus_epi32(out[0], out[1]), 0b11_01_10_00);
            if stream {
                let d = dst.add(i) as *mut __m128i;
                _mm_stream_si128(d, _mm256_castsi256_si128(packed));
                _mm_stream_si128(d.add(1), _mm256_extracti128_si256(packed, 1));
            } else {
                _mm256_storeu_si256(dst.add(i) as *mut __m256i, packed);
            }
        }
        // A tree of four adds (not the f32 kernel's sixteen in a row).
        let s8 = _mm256_add_ps(acc[0], acc[1]);
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
        _mm_cvtss_f32(s1)
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn row(
        _dst: *mut bf16,
        _src: *const bf16,
        _b: &[f32],
        _c: &[f32],
        _da: f32,
        _xdt: f32,
        _stream: bool,
    ) -> f32 {
        unreachable!("usable() is false off x86-64")
    }
}

/// [`avx2::row`] on 512-bit vectors: the same operations on the same
/// values in the same lanes (its two 8-lane sums are one 16-lane sum's
/// halves), so the same bits, with half the instructions.
mod avx512 {
    use crate::simd::{level, SimdLevel};
    use half::bf16;

    /// Whether [`row`] can run (besides [`super::avx2::usable`]).
    #[inline]
    pub(super) fn usable() -> bool {
        cfg!(target_arch = "x86_64") && level() >= SimdLevel::Avx512
    }

    /// See [`super::avx2::row`].
    ///
    /// # Safety
    /// AVX-512 ([`usable`]) and what `avx2::row` requires.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
    pub(super) unsafe fn row(
        dst: *mut bf16,
        src: *const bf16,
        b: &[f32],
        c: &[f32],
        da: f32,
        xdt: f32,
        stream: bool,
    ) -> f32 {
        use std::arch::x86_64::*;
        let n = b.len();
        let (vda, vx) = (_mm512_set1_ps(da), _mm512_set1_ps(xdt));
        let (bias, one, quiet) = (
            _mm512_set1_epi32(0x7fff),
            _mm512_set1_epi32(1),
            _mm512_set1_epi32(0x0040),
        );
        let mut acc = _mm512_setzero_ps();
        for i in (0..n).step_by(16) {
            let raw = _mm256_loadu_si256(src.add(i) as *const __m256i);
            let s = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw)));
            let bv = _mm512_loadu_ps(b.as_ptr().add(i));
            let cv = _mm512_loadu_ps(c.as_ptr().add(i));
            let v = _mm512_add_ps(_mm512_mul_ps(s, vda), _mm512_mul_ps(vx, bv));
            acc = _mm512_add_ps(acc, _mm512_mul_ps(v, cv));
            // nearest even, NaN kept quiet (`round_bf16`)
            let bits = _mm512_castps_si512(v);
            let hi = _mm512_srli_epi32::<16>(bits);
            let lsb = _mm512_and_si512(hi, one);
            let r = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, _mm512_add_epi32(bias, lsb)));
            let nan = _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(v, v);
            let r = _mm512_mask_blend_epi32(nan, r, _mm512_or_si512(hi, quiet));
            let packed = _mm512_cvtepi32_epi16(r);
            if stream {
                let d = dst.add(i) as *mut __m128i;
                _mm_stream_si128(d, _mm256_castsi256_si128(packed));
                _mm_stream_si128(d.add(1), _mm256_extracti128_si256::<1>(packed));
            } else {
                _mm256_storeu_si256(dst.add(i) as *mut __m256i, packed);
            }
        }
        // avx2::row's tree: its two halves, then four adds
        let s8 = _mm256_add_ps(
            _mm512_castps512_ps256(acc),
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc))),
        );
        let s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps::<1>(s8));
        let s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
        let s1 = _mm_add_ss(s2, _mm_movehdup_ps(s2));
        _mm_cvtss_f32(s1)
    }

    #[cfg(not(target_arch = "x86_64"))]
    pub(super) unsafe fn row(
        _dst: *mut bf16,
        _src: *const bf16,
        _b: &[f32],
        _c: &[f32],
        _da: f32,
        _xdt: f32,
        _stream: bool,
    ) -> f32 {
        unreachable!("usable() is false off x86-64")
    }
}

#[cfg(test)]
mod tests {
    use crate::ops::state_elem::round_bf16;
    use crate::testutil::Rng;
    use half::bf16;

    /// The fused row rounds as `round_bf16` does (ties, NaN, inf), in
    /// place and streamed: with a zero state, da = 1 and xdt = 1 the row's
    /// new values are exactly `b`.
    #[test]
    fn fused_row_rounds_like_the_scalar_code() {
        if !super::avx2::usable(64) {
            return;
        }
        let mut rng = Rng::new(9);
        let mut b: Vec<f32> = (0..64)
            .map(|_| f32::from_bits(rng.next_u64() as u32))
            .collect();
        b[1] = f32::from_bits(0x3f80_8000);
        b[2] = f32::from_bits(0x3f81_8000);
        b[3] = f32::from_bits(0x7f80_0001);
        b[4] = f32::NEG_INFINITY;
        b[5] = f32::MAX;
        b[6] = f32::from_bits(0xffff_ffff);
        let c = vec![0f32; 64];
        let zeros = [bf16::ZERO; 64];
        for (stream, wide) in [(false, false), (true, false), (false, true), (true, true)] {
            if wide && !super::avx512::usable() {
                continue;
            }
            // 16-byte aligned destination.
            let mut buf = vec![0u128; 64 * 2 / 16];
            let dst = buf.as_mut_ptr() as *mut bf16;
            // SAFETY: AVX2 (AVX-512 with `wide`) checked; 64 values
            // everywhere; no overlap.
            unsafe {
                if wide {
                    super::avx512::row(dst, zeros.as_ptr(), &b, &c, 1.0, 1.0, stream);
                } else {
                    super::avx2::row(dst, zeros.as_ptr(), &b, &c, 1.0, 1.0, stream);
                }
            }
            crate::ops::state_rows::fence();
            // SAFETY: the u128 buffer holds 64 bf16.
            let got = unsafe { std::slice::from_raw_parts(dst, 64) };
            for (g, &x) in got.iter().zip(&b) {
                let want = round_bf16(0.0 * 1.0 + 1.0 * x);
                assert_eq!(
                    g.to_bits(),
                    want.to_bits(),
                    "{:08x} stream {stream} wide {wide}",
                    x.to_bits()
                );
            }
        }
    }

    /// The 512-bit row gives the 256-bit row's bits: the rounded state and
    /// the returned sum, on random rows.
    #[test]
    fn wide_row_is_the_avx2_row() {
        if !super::avx2::usable(128) || !super::avx512::usable() {
            return;
        }
        let mut rng = Rng::new(17);
        for _ in 0..20 {
            let src: Vec<bf16> = rng.vec(128).iter().map(|&v| round_bf16(v)).collect();
            let (b, c) = (rng.vec(128), rng.vec(128));
            let (da, xdt) = (0.9 + 0.1 * rng.vec(1)[0], rng.vec(1)[0]);
            let (mut d2, mut d5) = (vec![bf16::ZERO; 128], vec![bf16::ZERO; 128]);
            // SAFETY: both levels checked; 128 values everywhere.
            let (s2, s5) = unsafe {
                (
                    super::avx2::row(d2.as_mut_ptr(), src.as_ptr(), &b, &c, da, xdt, false),
                    super::avx512::row(d5.as_mut_ptr(), src.as_ptr(), &b, &c, da, xdt, false),
                )
            };
            assert_eq!(s2.to_bits(), s5.to_bits());
            assert_eq!(d2, d5);
        }
    }
}
