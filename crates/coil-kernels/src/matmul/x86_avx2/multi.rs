//! AVX2 integer dot products of one weight row with four tokens at once
//! (batched decode: N sequences' tokens through one matrix). The row is
//! loaded and unpacked once (nibbles, high bits, scales) and multiplied
//! with each token's quantized activations. Each token's result is
//! computed with exactly the operations, in the same order, of the
//! one-token kernel beside it in `x86_avx2.rs`, so a token's output does
//! not depend on how many tokens share the call (batch invariance: a
//! request decoded alone or among others gets the same logits bit for bit).

use super::{dot_us, f16c, hsum256, nibbles, rd16, KVALUES_IQ4NL};
use std::arch::x86_64::*;

/// Q8_0 / Q4_0 / IQ4_NL (`KIND` 0 / 1 / 2), as `dot_b32`, four tokens.
#[inline(always)]
unsafe fn dot4_b32<const BYTES: usize, const KIND: u8>(
    row: &[u8],
    xq: [&[i8]; 4],
    xd: [&[f32]; 4],
    xs: [&[i16]; 4],
) -> [f32; 4] {
    let nb = xd[0].len();
    let tbl =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
    let mut acc = [[_mm256_setzero_ps(); 2]; 4];
    let mut corr = [0f32; 4];
    for i in 0..nb {
        let b = row.as_ptr().add(BYTES * i);
        let w = match KIND {
            0 => _mm256_loadu_si256(b.add(2) as *const __m256i),
            1 => nibbles(b.add(2)),
            _ => _mm256_shuffle_epi8(tbl, nibbles(b.add(2))),
        };
        let wabs = _mm256_abs_epi8(w);
        let wd = f16c(rd16(b));
        for t in 0..4 {
            let xv = _mm256_loadu_si256(xq[t].as_ptr().add(32 * i) as *const __m256i);
            let dot = match KIND {
                1 => dot_us(w, xv),
                _ => dot_us(wabs, _mm256_sign_epi8(xv, w)),
            };
            let s = wd * xd[t][i];
            if KIND == 1 {
                corr[t] += s * xs[t][i] as f32;
            }
            acc[t][i % 2] =
                _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(s), acc[t][i % 2]);
        }
    }
    std::array::from_fn(|t| hsum256(_mm256_add_ps(acc[t][0], acc[t][1])) - 8.0 * corr[t])
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot4_q8_0(
    row: &[u8],
    xq: [&[i8]; 4],
    xd: [&[f32]; 4],
    xs: [&[i16]; 4],
) -> [f32; 4] {
    dot4_b32::<34, 0>(row, xq, xd, xs)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot4_q4_0(
    row: &[u8],
    xq: [&[i8]; 4],
    xd: [&[f32]; 4],
    xs: [&[i16]; 4],
) -> [f32; 4] {
    dot4_b32::<18, 1>(row, xq, xd, xs)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot4_iq4_nl(
    row: &[u8],
    xq: [&[i8]; 4],
    xd: [&[f32]; 4],
    xs: [&[i16]; 4],
) -> [f32; 4] {
    dot4_b32::<18, 2>(row, xq, xd, xs)
}

/// Q4_K (`HIGH` false) / Q5_K (`HIGH` true), as `dot_k45`, four tokens.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot4_k45<const HIGH: bool>(
    row: &[u8],
    xq: [&[i8]; 4],
    xd: [&[f32]; 4],
    xs: [&[i16]; 4],
) -> [f32; 4] {
    let nb = xd[0].len();
    let bsz = if HIGH { 176 } else { 144 };
    let m4 = _mm256_set1_epi8(0xF);
    let bit4 = _mm256_set1_epi8(0x10);
    let mut facc = [_mm256_setzero_ps(); 4];
    let mut msum = [0f32; 4];
    for i in 0..nb {
        let b = row.as_ptr().add(bsz * i);
        let (sc, mn) =
            super::super::dequant::scales_mins_k4_words(std::slice::from_raw_parts(b.add(4), 12));
        let sp = super::k4_scale_lanes(sc);
        let qs = b.add(if HIGH { 48 } else { 16 });
        let mut hbits = if HIGH {
            _mm256_loadu_si256(b.add(16) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        let mut iacc = [_mm256_setzero_si256(); 4];
        for j in 0..4 {
            let q = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
            let mut lo = _mm256_and_si256(q, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            if HIGH {
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(hbits, 4), bit4));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(hbits, 3), bit4));
                hbits = _mm256_srli_epi16(hbits, 2);
            }
            let (v1, v2) = (super::k4_scale(sp, 2 * j), super::k4_scale(sp, 2 * j + 1));
            for t in 0..4 {
                let x = xq[t].as_ptr().add(256 * i);
                let xl = _mm256_loadu_si256(x.add(64 * j) as *const __m256i);
                let xh = _mm256_loadu_si256(x.add(64 * j + 32) as *const __m256i);
                let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), v1);
                let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), v2);
                iacc[t] = _mm256_add_epi32(iacc[t], _mm256_add_epi32(pl, ph));
            }
        }
        let mins: [i32; 4] =
            std::array::from_fn(|t| super::k4_mins(mn, xs[t].as_ptr().add(16 * i)));
        let (wd, wm) = (f16c(rd16(b)), f16c(rd16(b.add(2))));
        for t in 0..4 {
            let d = wd * xd[t][i];
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t]), _mm256_set1_ps(d), facc[t]);
            msum[t] += wm * xd[t][i] * mins[t] as f32;
        }
    }
    std::array::from_fn(|t| hsum256(facc[t]) - msum[t])
}

/// Q6_K, as `dot_q6_k`, four tokens.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot4_q6_k(
    row: &[u8],
    xq: [&[i8]; 4],
    xd: [&[f32]; 4],
    xs: [&[i16]; 4],
) -> [f32; 4] {
    let nb = xd[0].len();
    let mut facc = [_mm256_setzero_ps(); 4];
    for i in 0..nb {
        let b = row.as_ptr().add(210 * i);
        let sc = b.add(192) as *const i8;
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(sc as *const __m128i));
        let lanes = super::q6k_scale_lanes(sc16);
        let mut iacc = [_mm256_setzero_si256(); 4];
        for n in 0..2 {
            let q = super::q6k_quants(b, n);
            for (k, qk) in q.iter().enumerate() {
                let s = super::q6k_scale(&lanes, n, k);
                for t in 0..4 {
                    let x = xq[t].as_ptr().add(256 * i);
                    let xv = _mm256_loadu_si256(x.add(128 * n + 32 * k) as *const __m256i);
                    let p = _mm256_maddubs_epi16(*qk, xv);
                    iacc[t] = _mm256_add_epi32(iacc[t], _mm256_madd_epi16(p, s));
                }
            }
        }
        let wd = f16c(rd16(b.add(208)));
        for t in 0..4 {
            let bs16 = _mm256_loadu_si256(xs[t].as_ptr().add(16 * i) as *const __m256i);
            let corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs16), 5);
            let ia = _mm256_sub_epi32(iacc[t], corr);
            let d = wd * xd[t][i];
            facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), _mm256_set1_ps(d), facc[t]);
        }
    }
    std::array::from_fn(|t| hsum256(facc[t]))
}

#[cfg(test)]
mod tests {
    use super::super::super::act::QuantAct;
    use super::super::super::{ActKind, VecKernel, WeightRef};
    use crate::simd::{detected_level, SimdLevel};
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    /// Each token's result from the four-token kernel equals the one-token
    /// kernel's bit for bit (batch invariance of decode).
    #[test]
    fn four_tokens_equal_one_token_each_bit_for_bit() {
        if detected_level() < SimdLevel::Avx2 {
            return;
        }
        let (rows, cols) = (8, 512);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::IQ4_NL,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
        ] {
            let mut rng = Rng::new(7);
            let data = random_weights(&mut rng, ty, rows, cols);
            let w = WeightRef::new(ty, &data, rows, cols).unwrap();
            let x = rng.vec(4 * cols);
            let Some(VecKernel::Quant(kind, one, Some(four))) = super::super::vec_kernel(ty) else {
                panic!("{ty}: no four-token AVX2 kernel");
            };
            let (xa, nd, ns) = match kind {
                ActKind::Q8_0 => (QuantAct::q8_0(&x, cols), cols / 32, cols / 32),
                ActKind::Q8K => (QuantAct::q8_k(&x, cols), cols / 256, cols / 16),
            };
            let act = |t: usize| {
                (
                    xa.qs_row(t),
                    &xa.d[t * nd..(t + 1) * nd],
                    &xa.sums[t * ns..(t + 1) * ns],
                )
            };
            for r in 0..rows {
                let a = [act(0), act(1), act(2), act(3)];
                let got = four(w.row(r), a.map(|a| a.0), a.map(|a| a.1), a.map(|a| a.2));
                for (t, g) in got.iter().enumerate() {
                    let (q, d, s) = act(t);
                    let want = one(w.row(r), q, d, s);
                    assert_eq!(g.to_bits(), want.to_bits(), "{ty} row {r} token {t}");
                    assert!(want.is_finite());
                }
            }
        }
    }
}
