//! AVX2 dot products of the 2- and 3-bit K-quants, Q2_K and Q3_K, against
//! Q8_K-style activations (one row; one token, four tokens, and one-token
//! row ranges; built for the AVX2 level and, with 32 registers, for the
//! AVX-512 level: [`avx2`], [`wide`]): the formats of llama.cpp's
//! Q2_K and Q3_K_S / _M / _L mixtures, which people download for the
//! largest models. Without them a row was decoded to f32 first (scalar),
//! 2% of the read bandwidth at AVX2 and 11–15% at AVX-512.
//!
//! Both formats split a block of 256 values into 16 groups of 16, group
//! `g = 8n + 2j + h` holding bits `2j..2j+2` of the bytes `32n + 16h ..
//! +16` of the block's 2-bit array: one 32-byte load of half `n` shifted
//! by `2j` gives groups `g` (low 128-bit lane) and `g + 1` (high lane),
//! whose activations are the 32 bytes at `128n + 32j`, the layout of Q6_K's
//! vectors (so [`q6k_scale`] picks their scales). Per block:
//!
//! * Q2_K: `Σ w·x = xd · (d · Σ_g sc_g · Σ q·xq − dmin · Σ_g m_g · xs_g)`,
//!   `sc` / `m` the low / high nibbles of the 16 scale bytes, `q` 0..3;
//! * Q3_K: the value is `q − 4` where its high bit (bit `4n + j` of byte
//!   `16h + l` of the 32-byte mask) is clear, i.e. `q3 − 4` with the 3-bit
//!   `q3 = q | high << 2`: `Σ w·x = xd · d · Σ_g sc_g · (Σ q3·xq − 4 xs_g)`,
//!   `sc` the 16 signed 6-bit scales.
//!
//! `Σ q·xq` is exact in integers (`vpmaddubsw`, q ≤ 7), so each block's
//! integer sums are [`crate::matmul::scalar::vecdot`]'s; the float sums run in eight
//! lanes (their order differs from the scalar specification's).

use super::dots::{
    f16_lanes, hsum256, prefetch_block, prefetch_far, q6k_scale, q6k_scale_lanes, rd16,
};
use std::arch::x86_64::*;

/// The body of the Q2_K kernels for `T` tokens.
#[inline(always)]
unsafe fn q2k<const T: usize, const PF: usize>(
    row: &[u8],
    xq: [&[i8]; T],
    xd: [&[f32]; T],
    xs: [&[i16]; T],
) -> [f32; T] {
    let m3 = _mm256_set1_epi8(3);
    let m4 = _mm_set1_epi8(0xF);
    let mut facc = [_mm256_setzero_ps(); T];
    for i in 0..xd[0].len() {
        let (b, x) = block::<T, PF>(row, 84, i, xq);
        let s = _mm_loadu_si128(b as *const __m128i);
        // the 16 scales (low nibbles) in both lanes: byte shuffles make
        // each step's i16 multipliers
        let sc = _mm256_broadcastsi128_si256(_mm_and_si128(s, m4));
        let mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(s, 4), m4));
        // the eight 32-value steps' values and scale multipliers
        let mut vs = [_mm256_setzero_si256(); 8];
        let mut ss = [_mm256_setzero_si256(); 8];
        for n in 0..2 {
            let q = _mm256_loadu_si256(b.add(16 + 32 * n) as *const __m256i);
            for j in 0..4 {
                vs[4 * n + j] = _mm256_and_si256(shift_right(q, j), m3);
                ss[4 * n + j] = _mm256_shuffle_epi8(sc, scale_mask(8 * n + 2 * j));
            }
        }
        let iacc = steps(&vs, &ss, x);
        let (d, dmin) = (f16_lanes(rd16(b.add(80))), f16_lanes(rd16(b.add(82))));
        for t in 0..T {
            let bs16 = _mm256_loadu_si256(xs[t].as_ptr().add(16 * i) as *const __m256i);
            let mins = _mm256_madd_epi16(mn16, bs16);
            let xv = _mm256_set1_ps(*xd[t].get_unchecked(i));
            let (dt, mt) = (_mm256_mul_ps(d, xv), _mm256_mul_ps(dmin, xv));
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t]), dt, facc[t]);
            facc[t] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), mt, facc[t]);
        }
    }
    let mut out = [0f32; T];
    for (o, f) in out.iter_mut().zip(facc) {
        *o = hsum256(f);
    }
    out
}

/// The entry points of both formats, compiled with the target features
/// `$feat`: one-token dot products, four-token ones (each token's floats
/// those of the one-token kernel: the same body), and one-token row-range
/// kernels (the dot inlined, prefetching `PF_STREAM` bytes ahead block by
/// block as the other K-quants' do).
///
/// # Safety (every function)
/// `row` / each of `w`'s `out.len()` rows of `rb` bytes holds `xd.len()`
/// blocks, `xq` 256 values and `xs` 16 sums per block (for each token);
/// the CPU has the features `$feat`.
macro_rules! entries {
    ($(#[$doc:meta])* $m:ident, $feat:literal) => {
        $(#[$doc])*
        pub(in crate::matmul) mod $m {
            use super::{q2k, q3k};
            use crate::matmul::x86_avx2::dots::PF_STREAM;

            format_entries!($feat, "Q2_K", q2k, dot_q2_k, dot4_q2_k, rows_q2_k);
            format_entries!($feat, "Q3_K", q3k, dot_q3_k, dot4_q3_k, rows_q3_k);
        }
    };
}

/// One format's three entry points of [`entries`] over its body `$body`.
macro_rules! format_entries {
    ($feat:literal, $fmt:literal, $body:ident, $dot:ident, $dot4:ident, $rows:ident) => {
        #[doc = concat!("A ", $fmt, " row times one token's activations.")]
        #[target_feature(enable = $feat)]
        pub unsafe fn $dot(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
            $body::<1, 0>(row, [xq], [xd], [xs])[0]
        }

        #[doc = concat!("A ", $fmt, " row times four tokens' activations.")]
        #[target_feature(enable = $feat)]
        pub unsafe fn $dot4(
            row: &[u8],
            xq: [&[i8]; 4],
            xd: [&[f32]; 4],
            xs: [&[i16]; 4],
        ) -> [f32; 4] {
            $body::<4, 0>(row, xq, xd, xs)
        }

        #[doc = concat!("One-token ", $fmt, " rows.")]
        #[target_feature(enable = $feat)]
        pub unsafe fn $rows(
            w: &[u8],
            rb: usize,
            xq: &[i8],
            xd: &[f32],
            xs: &[i16],
            out: &mut [f32],
        ) {
            assert!(w.len() >= out.len() * rb);
            for (r, o) in out.iter_mut().enumerate() {
                *o = $body::<1, PF_STREAM>(&w[r * rb..(r + 1) * rb], [xq], [xd], [xs])[0];
            }
        }
    };
}

entries!(
    /// The AVX2 level's kernels.
    avx2,
    "avx2,fma,f16c"
);
entries!(
    /// The same kernels compiled for the AVX-512 level: the same operations
    /// (so the same bits), with 32 vector registers (the four-token bodies
    /// spill at 16) and EVEX encodings.
    wide,
    "avx2,fma,f16c,avx512f,avx512vl,avx512bw"
);

/// The body of the Q3_K kernels for `T` tokens.
#[inline(always)]
unsafe fn q3k<const T: usize, const PF: usize>(
    row: &[u8],
    xq: [&[i8]; T],
    xd: [&[f32]; T],
    xs: [&[i16]; T],
) -> [f32; T] {
    let m3 = _mm256_set1_epi8(3);
    let bit2 = _mm256_set1_epi8(4);
    let mut facc = [_mm256_setzero_ps(); T];
    for i in 0..xd[0].len() {
        let (b, x) = block::<T, PF>(row, 110, i, xq);
        let sc16 = _mm256_cvtepi8_epi16(q3k_scales(b.add(96)));
        let lanes = q6k_scale_lanes(sc16);
        let hm = _mm256_loadu_si256(b as *const __m256i);
        let mut vs = [_mm256_setzero_si256(); 8];
        let mut ss = [_mm256_setzero_si256(); 8];
        for n in 0..2 {
            let q = _mm256_loadu_si256(b.add(32 + 32 * n) as *const __m256i);
            // bit 4n of each byte on bit 2 (in 16-bit words: what crosses
            // from the high byte into the low one lands on bit 3 or above)
            let h = if n == 0 {
                _mm256_slli_epi16(hm, 2)
            } else {
                _mm256_srli_epi16(hm, 2)
            };
            for j in 0..4 {
                // the high bit 4n + j on bit 2
                let high = _mm256_and_si256(shift_bits(h, j), bit2);
                vs[4 * n + j] = _mm256_or_si256(_mm256_and_si256(shift_right(q, j), m3), high);
                ss[4 * n + j] = q6k_scale(&lanes, n, j);
            }
        }
        let iacc = steps(&vs, &ss, x);
        let d = f16_lanes(rd16(b.add(108)));
        for t in 0..T {
            // minus 4 · Σ_g sc_g · xs_g
            let bs16 = _mm256_loadu_si256(xs[t].as_ptr().add(16 * i) as *const __m256i);
            let corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs16), 2);
            let it = _mm256_sub_epi32(iacc[t], corr);
            let dt = _mm256_mul_ps(d, _mm256_set1_ps(*xd[t].get_unchecked(i)));
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(it), dt, facc[t]);
        }
    }
    let mut out = [0f32; T];
    for (o, f) in out.iter_mut().zip(facc) {
        *o = hsum256(f);
    }
    out
}

/// Block `i` (of `bytes` bytes) of `row` and each token's activations for
/// it, the block `PF` bytes ahead prefetched (0: none) with the far lines
/// ([`prefetch_far`]).
#[inline(always)]
unsafe fn block<const T: usize, const PF: usize>(
    row: &[u8],
    bytes: usize,
    i: usize,
    xq: [&[i8]; T],
) -> (*const u8, [*const i8; T]) {
    let b = row.as_ptr().add(bytes * i);
    if PF > 0 {
        prefetch_block(b.wrapping_add(PF), bytes);
        prefetch_far(b, bytes);
    }
    let mut x = [std::ptr::null::<i8>(); T];
    for (p, q) in x.iter_mut().zip(xq) {
        *p = q.as_ptr().add(256 * i);
    }
    (b, x)
}

/// A block's integer sums for each token: `Σ_k (vs[k] · x[32k..]) · ss[k]`
/// over the eight 32-value steps (`vpmaddubsw`, then `vpmaddwd` by the
/// step's scales). One token: the steps interleaved; several: token by
/// token, the steps' values reread from L1 (held in registers they were
/// spilled anyway).
#[inline(always)]
unsafe fn steps<const T: usize>(
    vs: &[__m256i; 8],
    ss: &[__m256i; 8],
    x: [*const i8; T],
) -> [__m256i; T] {
    // (loops, not closures: a closure does not inherit the caller's
    // target features, and the intrinsics in it would become calls)
    let mut acc = [_mm256_setzero_si256(); T];
    for (t, a) in acc.iter_mut().enumerate() {
        for k in 0..8 {
            let xv = _mm256_loadu_si256(x[t].add(32 * k) as *const __m256i);
            *a = _mm256_add_epi32(
                *a,
                _mm256_madd_epi16(_mm256_maddubs_epi16(vs[k], xv), ss[k]),
            );
        }
    }
    acc
}

/// The `vpshufb` mask that makes i16 lanes of byte `g` (low 128-bit
/// lane) and byte `g + 1` (high lane) of a broadcast 16-byte vector, high
/// bytes zero.
#[inline(always)]
unsafe fn scale_mask(g: usize) -> __m256i {
    let w = |b: usize| (0x8000 | b) as i16;
    _mm256_set_m128i(_mm_set1_epi16(w(g + 1)), _mm_set1_epi16(w(g)))
}

/// `q >> 2j` in 16-bit words (the caller masks the two bits it wants).
#[inline(always)]
unsafe fn shift_right(q: __m256i, j: usize) -> __m256i {
    match j {
        0 => q,
        1 => _mm256_srli_epi16(q, 2),
        2 => _mm256_srli_epi16(q, 4),
        _ => _mm256_srli_epi16(q, 6),
    }
}

/// `h >> j` in 16-bit words.
#[inline(always)]
unsafe fn shift_bits(h: __m256i, j: usize) -> __m256i {
    match j {
        0 => h,
        1 => _mm256_srli_epi16(h, 1),
        2 => _mm256_srli_epi16(h, 2),
        _ => _mm256_srli_epi16(h, 3),
    }
}

/// Q3_K's 16 signed 6-bit scales (minus 32) from the 12 bytes at `p`, as
/// [`crate::matmul::scalar::dequant::q3k_scales`] gives them: low nibbles of bytes
/// 0..8 then their high nibbles, each with two bits of bytes 8..12 above.
#[inline(always)]
unsafe fn q3k_scales(p: *const u8) -> __m128i {
    const M4: u64 = 0x0f0f_0f0f_0f0f_0f0f;
    const M2: u64 = 0x0303_0303_0303_0303;
    let lo = (p as *const u64).read_unaligned();
    let t = u64::from((p.add(8) as *const u32).read_unaligned());
    // scales 0..8: bits 0..2 then 2..4 of the top word; 8..16: 4..6, 6..8
    let t01 = (t | (t >> 2) << 32) & M2;
    let t23 = ((t >> 4) | (t >> 6) << 32) & M2;
    let a = (lo & M4) | (t01 << 4);
    let c = ((lo >> 4) & M4) | (t23 << 4);
    _mm_sub_epi8(_mm_set_epi64x(c as i64, a as i64), _mm_set1_epi8(32))
}

#[cfg(test)]
mod tests {
    use super::super::super::{act::QuantAct, dequant::q3k_scales as scalar_scales, vecdot};
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    fn avx2() -> bool {
        is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    #[test]
    fn q3k_scales_match_the_scalar_decoder() {
        if !avx2() {
            return;
        }
        let mut rng = Rng::new(3);
        for _ in 0..200 {
            let b = rng.bytes(12);
            let mut got = [0i8; 16];
            // SAFETY: AVX2 checked; 12 readable bytes.
            unsafe {
                let v = super::q3k_scales(b.as_ptr());
                std::arch::x86_64::_mm_storeu_si128(got.as_mut_ptr() as *mut _, v);
            }
            assert_eq!(got, scalar_scales(&b));
        }
    }

    /// The four-token kernels give each token the one-token kernel's
    /// result, bit for bit (what batched decoding's invariance rests on).
    #[test]
    fn four_tokens_are_one_token_bit_for_bit() {
        if !avx2() {
            return;
        }
        let mut rng = Rng::new(8);
        for ty in [GgmlType::Q2_K, GgmlType::Q3_K] {
            let cols = 1024;
            let w = random_weights(&mut rng, ty, 1, cols);
            let a: Vec<QuantAct> = (0..4)
                .map(|_| QuantAct::q8_k(&rng.vec(cols), cols))
                .collect();
            let (q, d, s) = (
                std::array::from_fn(|t| &a[t].qs[..]),
                std::array::from_fn(|t| &a[t].d[..]),
                std::array::from_fn(|t| &a[t].sums[..]),
            );
            // SAFETY: AVX2 checked; lengths from QuantAct.
            let four = unsafe {
                match ty {
                    GgmlType::Q2_K => super::avx2::dot4_q2_k(&w, q, d, s),
                    _ => super::avx2::dot4_q3_k(&w, q, d, s),
                }
            };
            for t in 0..4 {
                // SAFETY: as above.
                let one = unsafe {
                    match ty {
                        GgmlType::Q2_K => super::avx2::dot_q2_k(&w, q[t], d[t], s[t]),
                        _ => super::avx2::dot_q3_k(&w, q[t], d[t], s[t]),
                    }
                };
                assert_eq!(four[t].to_bits(), one.to_bits(), "{ty} token {t}");
            }
            // and the AVX-512 level's builds of the same kernels
            if is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512bw")
            {
                // SAFETY: AVX-512 F/VL/BW checked; lengths from QuantAct.
                let (one, four_w) = unsafe {
                    match ty {
                        GgmlType::Q2_K => (
                            super::wide::dot_q2_k(&w, q[0], d[0], s[0]),
                            super::wide::dot4_q2_k(&w, q, d, s),
                        ),
                        _ => (
                            super::wide::dot_q3_k(&w, q[0], d[0], s[0]),
                            super::wide::dot4_q3_k(&w, q, d, s),
                        ),
                    }
                };
                assert_eq!(one.to_bits(), four[0].to_bits(), "{ty} wide");
                for t in 0..4 {
                    assert_eq!(
                        four_w[t].to_bits(),
                        four[t].to_bits(),
                        "{ty} wide token {t}"
                    );
                }
            }
        }
    }

    /// The kernels' integer sums are the scalar specification's: the two
    /// agree to float rounding on rows with extreme activations and
    /// weights (every scale and value drawn at random, including the
    /// extremes of the activations' int8 range).
    #[test]
    fn agree_with_the_scalar_specification() {
        if !avx2() {
            return;
        }
        let mut rng = Rng::new(5);
        for ty in [GgmlType::Q2_K, GgmlType::Q3_K] {
            for cols in [256, 1024, 4352] {
                let w = random_weights(&mut rng, ty, 3, cols);
                let rb = w.len() / 3;
                let mut x = rng.vec(cols);
                x[7] = 40.0; // one large value: many activations at ±127 / small
                let a = QuantAct::q8_k(&x, cols);
                for r in 0..3 {
                    let row = &w[r * rb..(r + 1) * rb];
                    let (want, got) = match ty {
                        GgmlType::Q2_K => (vecdot::dot_q2_k(row, &a.qs, &a.d, &a.sums), unsafe {
                            // SAFETY: AVX2 checked; lengths from QuantAct.
                            super::avx2::dot_q2_k(row, &a.qs, &a.d, &a.sums)
                        }),
                        _ => (vecdot::dot_q3_k(row, &a.qs, &a.d, &a.sums), unsafe {
                            // SAFETY: as above.
                            super::avx2::dot_q3_k(row, &a.qs, &a.d, &a.sums)
                        }),
                    };
                    assert!(
                        (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                        "{ty} cols {cols} row {r}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
