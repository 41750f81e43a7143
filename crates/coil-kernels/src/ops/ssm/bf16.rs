//! The Mamba-2 recurrence (`scan.rs`'s `m2_head`) over a state stored in bf16:
//! each state row (`d_state` values) is widened to f32, updated with the
//! f32 kernel's arithmetic in the same order, and rounded back to bf16
//! (nearest even) when stored — after every token, so that a token's
//! result does not depend on how many tokens share the call (what
//! batch-invariant decoding and speculative verification need). The
//! output `y` reads the updated row before rounding. The fused AVX2 row
//! sums its sixteen output lanes as a tree (four adds, not sixteen in a
//! row: the f32 kernel's order is kept there for bit-exactness with what
//! it always computed), so `y` may differ from the f32 kernel's in the
//! last bits; the state does not.
//!
//! Half the state bytes of the f32 kernel are read and written per token:
//! on mamba2-370m the state is ~50 MB, a third of a Q4_K_M decode step's
//! memory traffic in f32.

use super::dims::Mamba2Dims;
use crate::multiversion;
use crate::ops::state_elem::{round_row, widen_row};
use crate::ops::state_rows::{fence, prefetch_rows_ahead};
use crate::simd::math::exp_fast;
use half::bf16;

/// One head over `n_tokens` tokens (see `scan.rs`'s `m2_head`); `row` is a work
/// row of `d_state` f32. With `fused` (AVX2, `d_state` a multiple of 16),
/// each row is widened, updated and rounded in registers ([`avx2::row`],
/// or with `wide` [`avx512::row`], the same bits 16 values an instruction);
/// otherwise it goes through `row` (the same arithmetic).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn m2_head_bf16(
    dims: &Mamba2Dims,
    h: usize,
    from: Option<&[bf16]>,
    state: &mut [bf16],
    x: &[f32],
    ldx: usize,
    b: &[f32],
    c: &[f32],
    ldbc: usize,
    dt: &[f32],
    a: &[f32],
    d: Option<&[f32]>,
    y: *mut f32,
    n_tokens: usize,
    row: &mut [f32],
    fused: bool,
    wide: bool,
) {
    let (hn, p_dim, n) = (dims.n_head, dims.head_dim, dims.d_state);
    let g = h / (hn / dims.n_group);
    for t in 0..n_tokens {
        let dth = dt[t * hn + h];
        let da = exp_fast(dth * a[h]);
        let bt = &b[t * ldbc + g * n..t * ldbc + (g + 1) * n];
        let ct = &c[t * ldbc + g * n..t * ldbc + (g + 1) * n];
        let dh = d.map_or(0.0, |d| d[h]);
        let src = if t == 0 { from } else { None };
        // One token moving the state to a new buffer: stream the new rows
        // there (see `moving.rs`; rows of 16-byte multiples).
        let stream =
            src.is_some() && n_tokens == 1 && (state.as_ptr() as usize).is_multiple_of(16) && fused;
        // the rows this pass reads, prefetched ahead as `scan.rs`'s `m2_head`
        // does (a row of n bf16 is the bytes of n / 2 f32)
        let rows = src.unwrap_or(state).as_ptr();
        for p in 0..p_dim {
            prefetch_rows_ahead(rows.wrapping_add(p * n) as *const f32, n.div_ceil(2));
            let xv = x[t * ldx + h * p_dim + p];
            let xdt = xv * dth;
            let s = &mut state[p * n..(p + 1) * n];
            if fused {
                let from_row = match src {
                    Some(f) => f[p * n..(p + 1) * n].as_ptr(),
                    None => s.as_ptr(),
                };
                // SAFETY: `fused` means AVX2 and n a multiple of 16; the
                // source row holds n values (it may be `s` itself: each
                // 16 values are read before they are written).
                let sum = unsafe {
                    if wide {
                        avx512::row(s.as_mut_ptr(), from_row, bt, ct, da, xdt, stream)
                    } else {
                        avx2::row(s.as_mut_ptr(), from_row, bt, ct, da, xdt, stream)
                    }
                };
                let yv = sum + 0f32 + dh * xv;
                // SAFETY: (t, h, p) belongs to this head only.
                unsafe { *y.add((t * hn + h) * p_dim + p) = yv };
                continue;
            }
            match src {
                Some(f) => widen_row(&f[p * n..(p + 1) * n], row),
                None => widen_row(s, row),
            }
            // update and output in one pass over the row, as m2_head
            let mut acc = [0f32; 16];
            let mut sc = row.chunks_exact_mut(16);
            let (mut bc, mut cc) = (bt.chunks_exact(16), ct.chunks_exact(16));
            for ((s16, b16), c16) in (&mut sc).zip(&mut bc).zip(&mut cc) {
                for i in 0..16 {
                    let v = s16[i] * da + xdt * b16[i];
                    s16[i] = v;
                    acc[i] += v * c16[i];
                }
            }
            let mut tail = 0f32;
            for ((sv, &bv), &cv) in sc
                .into_remainder()
                .iter_mut()
                .zip(bc.remainder())
                .zip(cc.remainder())
            {
                *sv = *sv * da + xdt * bv;
                tail += *sv * cv;
            }
            round_row(row, s);
            let yv = acc.iter().sum::<f32>() + tail + dh * xv;
            // SAFETY: (t, h, p) belongs to this head only.
            unsafe { *y.add((t * hn + h) * p_dim + p) = yv };
        }
    }
}

/// Heads `h0..h1` (see `scan.rs`'s `m2_heads`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn m2_heads_bf16(
    dims: &Mamba2Dims,
    h0: usize,
    h1: usize,
    from: Option<&[bf16]>,
    state: *mut bf16,
    x: &[f32],
    ldx: usize,
    b: &[f32],
    c: &[f32],
    ldbc: usize,
    dt: &[f32],
    a: &[f32],
    d: Option<&[f32]>,
    y: *mut f32,
    n_tokens: usize,
) {
    let hs = dims.head_dim * dims.d_state;
    let fused = avx2::usable(dims.d_state);
    let wide = fused && avx512::usable();
    let mut row = vec![0f32; if fused { 0 } else { dims.d_state }];
    for h in h0..h1 {
        // SAFETY: head h owns state[h*hs..(h+1)*hs].
        let st = unsafe { std::slice::from_raw_parts_mut(state.add(h * hs), hs) };
        let f = from.map(|f| &f[h * hs..(h + 1) * hs]);
        m2_head_bf16(
            dims, h, f, st, x, ldx, b, c, ldbc, dt, a, d, y, n_tokens, &mut row, fused, wide,
        );
    }
    if from.is_some() {
        fence();
    }
}

multiversion!(pub(crate) fn m2_heads_bf16_mv(
    dims: &Mamba2Dims, h0: usize, h1: usize, from: Option<&[bf16]>, state: *mut bf16, x: &[f32],
    ldx: usize, b: &[f32], c: &[f32], ldbc: usize, dt: &[f32], a: &[f32], d: Option<&[f32]>, y: *mut f32, n_tokens: usize
) => m2_heads_bf16);

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
pub(crate) mod tests {
    use crate::ops::ssm::{mamba1_scan, mamba2_scan_from, Mamba2Dims, ScanInputs};
    use crate::ops::state_elem::{round_bf16, widen_bf16};
    use crate::testutil::Rng;
    use crate::ThreadPool;
    use half::bf16;

    /// A bf16 state gives, token after token, exactly what the f32 kernel
    /// gives from the same (widened) state with its result rounded to bf16
    /// after each token: the same rounded state bit for bit, the same
    /// outputs up to the order of their last sum — whether the tokens come
    /// in one call or one per call (those two bit for bit alike), in place
    /// or moving off another buffer.
    #[test]
    pub(crate) fn mamba2_bf16_is_the_f32_update_rounded_per_token() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(31);
        for &(hn, p, g, n, t) in &[(4, 3, 2, 5, 4), (6, 16, 3, 32, 3), (4, 8, 2, 64, 1)] {
            let dims = Mamba2Dims {
                n_head: hn,
                head_dim: p,
                n_group: g,
                d_state: n,
            };
            let x = rng.vec(t * hn * p);
            let dt: Vec<f32> = rng.vec(t * hn).iter().map(|v| v.abs() * 0.5).collect();
            let a: Vec<f32> = rng.vec(hn).iter().map(|v| -v.abs() - 0.1).collect();
            let b = rng.vec(t * g * n);
            let c = rng.vec(t * g * n);
            let dd = rng.vec(hn);
            let s0: Vec<bf16> = rng.vec(hn * p * n).iter().map(|&v| round_bf16(v)).collect();
            let one = |ti: usize| {
                ScanInputs::dense(
                    &dims,
                    &x[ti * hn * p..(ti + 1) * hn * p],
                    &b[ti * g * n..(ti + 1) * g * n],
                    &c[ti * g * n..(ti + 1) * g * n],
                    1,
                )
            };
            // Reference: the f32 kernel one token at a time, rounding the
            // state in between.
            let mut sf: Vec<f32> = s0.iter().map(|&v| widen_bf16(v)).collect();
            let mut want_y = Vec::new();
            for ti in 0..t {
                let mut y = vec![0f32; hn * p];
                let dts = &dt[ti * hn..(ti + 1) * hn];
                mamba2_scan_from(
                    &pool,
                    dims,
                    None,
                    &mut sf,
                    one(ti),
                    dts,
                    &a,
                    Some(&dd),
                    &mut y,
                    1,
                );
                sf.iter_mut().for_each(|v| *v = widen_bf16(round_bf16(*v)));
                want_y.extend(y);
            }
            let want_s: Vec<bf16> = sf.iter().map(|&v| round_bf16(v)).collect();
            // All tokens in one call, in place.
            let mut st = s0.clone();
            let mut y = vec![0f32; t * hn * p];
            let all = ScanInputs::dense(&dims, &x, &b, &c, t);
            mamba2_scan_from(
                &pool,
                dims,
                None,
                &mut st,
                all,
                &dt,
                &a,
                Some(&dd),
                &mut y,
                t,
            );
            assert_eq!(st, want_s, "{dims:?}");
            close(&y, &want_y, &format!("{dims:?}"));
            // One token per call, the first moving off the start state.
            let mut st2 = vec![bf16::NAN; s0.len()];
            let mut y2 = Vec::new();
            for ti in 0..t {
                let mut yy = vec![0f32; hn * p];
                let dts = &dt[ti * hn..(ti + 1) * hn];
                let from = (ti == 0).then_some(&s0[..]);
                mamba2_scan_from(
                    &pool,
                    dims,
                    from,
                    &mut st2,
                    one(ti),
                    dts,
                    &a,
                    Some(&dd),
                    &mut yy,
                    1,
                );
                y2.extend(yy);
            }
            assert_eq!(st2, want_s, "{dims:?} moving");
            // One call or one token per call: the same bits.
            assert_eq!(y2, y, "{dims:?} moving");
        }
    }

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

    /// `got` equals `want` up to the order of a 16-lane sum.
    fn close(got: &[f32], want: &[f32], what: &str) {
        let max = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() <= 1e-6 * max.max(1.0), "{what}: {g} vs {w}");
        }
    }

    /// Mamba-1 with a bf16 state: the f32 scan rounded after every token.
    #[test]
    pub(crate) fn mamba1_bf16_is_the_f32_update_rounded_per_token() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng::new(32);
        for &(di, n, t) in &[(40, 16, 5), (7, 3, 2), (300, 16, 3)] {
            let x = rng.vec(t * di);
            let dt: Vec<f32> = rng.vec(t * di).iter().map(|v| v.abs()).collect();
            let a: Vec<f32> = rng.vec(di * n).iter().map(|v| -v.abs() * 3.0).collect();
            let b = rng.vec(t * n);
            let c = rng.vec(t * n);
            let dd = rng.vec(di);
            let s0: Vec<bf16> = rng.vec(di * n).iter().map(|&v| round_bf16(v)).collect();
            let mut sf: Vec<f32> = s0.iter().map(|&v| widen_bf16(v)).collect();
            let mut want_y = Vec::new();
            for ti in 0..t {
                let r = ti * di..(ti + 1) * di;
                let mut y = vec![0f32; di];
                mamba1_scan(
                    &pool,
                    di,
                    n,
                    &mut sf,
                    &x[r.clone()],
                    &dt[r.clone()],
                    &a,
                    &b[ti * n..(ti + 1) * n],
                    &c[ti * n..(ti + 1) * n],
                    Some(&dd),
                    &mut y,
                    1,
                );
                sf.iter_mut().for_each(|v| *v = widen_bf16(round_bf16(*v)));
                want_y.extend(y);
            }
            let mut st = s0.clone();
            let mut y = vec![0f32; t * di];
            mamba1_scan(
                &pool,
                di,
                n,
                &mut st,
                &x,
                &dt,
                &a,
                &b,
                &c,
                Some(&dd),
                &mut y,
                t,
            );
            let got: Vec<f32> = st.iter().map(|&v| widen_bf16(v)).collect();
            assert_eq!(got, sf);
            assert_eq!(y, want_y);
        }
    }
}
