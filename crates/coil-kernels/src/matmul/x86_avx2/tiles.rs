//! AVX2 integer dot products of a range of weight rows with up to four
//! (32-value formats: Q8_0, Q4_0, IQ4_NL and, with their fifth bit or
//! offset, Q5_0, Q5_1, Q4_1) or nine (K-quants, IQ4_XS and the grid
//! formats IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S: a verification of 8
//! drafts, an expert's few tokens of a prompt) tokens
//! at once (batched decode of several sequences, speculative verification):
//! each row is fetched and unpacked once (nibbles, high
//! bits, scales) and multiplied with every token's quantized activations
//! while it sits in registers; no call per row.
//!
//! Batch invariance: each token's result is computed with exactly the
//! floating-point operations, in the same order, of the one-token kernel
//! beside it in `dots.rs` (the integer parts are exact, so only their
//! per-lane values matter, not the order of their additions), so a token's
//! output does not depend on how many tokens share the call: a request
//! decoded alone or among others, or a drafted token verified in a batch,
//! gets the same logits bit for bit.
//!
//! Register use (16 ymm): the unpacked weights of one 64-value step (two
//! vectors and their two scale vectors) plus one i32 accumulator per token;
//! the f32 accumulators are touched once per 256-value block. An empty
//! `asm!` (`pin!`) marks where each step's unpacked weights must be ready,
//! so the compiler does not hoist all of a block's unpacking ahead of the
//! token loop (it did, spilling half of it to the stack: 2.5× slower).

use super::super::act::{ActPanel, PANEL_LANES};
use super::dots::{dot_us, f16c, hsum256, k4_scale, k4_scale_lanes, nibbles, rd16, PF_STREAM};
use super::dots_iq::{grid_bytes, grid_d, grid_sub, signed_block};
use super::dots_iq::{IQ2_S, IQ2_XS, IQ2_XXS, IQ3_S, IQ3_XXS};
use crate::matmul::scalar::dequant::scales_mins_k4_words;
use crate::matmul::scalar::dequant::{iq4xs_scales, KVALUES_IQ4NL};
use std::arch::x86_64::*;

/// Keeps each `v` in a register at this point of the program: an empty
/// `asm!` the compiler can neither see through nor move across a memory
/// access or another one, so the loads (and the products folded into them)
/// of one step stay between its pins.
macro_rules! pin {
    ($($v:expr),+) => {
        $(
            // SAFETY: an empty instruction template; the register is unchanged.
            core::arch::asm!("/* {0} */", inout(ymm_reg) $v, options(nostack, preserves_flags));
        )+
    };
}

/// Checks the shapes every kernel relies on: a panel of `NT` tokens whose
/// blocks have `block` values and `per_block` sums, one output slice per
/// token of the same length, `w` holding that many rows of `rb` bytes.
/// Returns the row count.
#[inline(always)]
fn check<const NT: usize>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &[&mut [f32]],
    block: usize,
    per_block: usize,
) -> usize {
    assert!(p.nt == NT && out.len() == NT && NT <= PANEL_LANES);
    let n = out[0].len();
    assert!(out.iter().all(|o| o.len() == n) && w.len() >= n * rb);
    let nb = p.n_blocks;
    assert!(
        p.qs.len() >= NT * nb * block
            && p.d.len() >= nb * PANEL_LANES
            && p.sums.len() >= nb * NT * per_block
    );
    n
}

/// Q8_0 / Q4_0 / IQ4_NL (`KIND` 0 / 1 / 2; `BYTES` per 32-value block), as
/// `dot_b32`, and Q5_0 / Q5_1 / Q4_1 (`KIND` 3 / 4 / 5), as `legacy::dot`,
/// for `NT` tokens.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_b32<const BYTES: usize, const KIND: u8, const NT: usize>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [&mut [f32]],
) {
    let n = check::<NT>(w, rb, p, out, 32, 1);
    let nb = p.n_blocks;
    let (xq, xd, xs) = (p.qs.as_ptr(), p.d.as_ptr(), p.sums.as_ptr());
    let tbl =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
    let wp = w.as_ptr();
    for r in 0..n {
        let row = wp.add(r * rb);
        let mut even = [_mm256_setzero_ps(); NT];
        let mut odd = [_mm256_setzero_ps(); NT];
        let mut corr = [0f32; NT];
        let mut i = 0;
        while i + 2 <= nb {
            b32_block::<BYTES, KIND, NT>(row, i, xq, xd, xs, tbl, &mut even, &mut corr);
            b32_block::<BYTES, KIND, NT>(row, i + 1, xq, xd, xs, tbl, &mut odd, &mut corr);
            i += 2;
        }
        if i < nb {
            b32_block::<BYTES, KIND, NT>(row, i, xq, xd, xs, tbl, &mut even, &mut corr);
        }
        for t in 0..NT {
            let sum = hsum256(_mm256_add_ps(even[t], odd[t]));
            *out[t].get_unchecked_mut(r) = match KIND {
                3 => sum - 16.0 * corr[t],
                4 | 5 => sum + corr[t],
                _ => sum - 8.0 * corr[t],
            };
        }
    }
}

/// Block `i` of [`rows_b32`]'s row `row`: unpacked once, then each token's
/// product added to its accumulator in `acc` (the even or odd blocks'),
/// with `dot_b32`'s (`legacy::dot`'s) operations; prefetches as they do.
/// The unsigned formats (Q4_0 and `KIND` 3 to 5) add their offset term to
/// `corr`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::too_many_arguments)]
unsafe fn b32_block<const BYTES: usize, const KIND: u8, const NT: usize>(
    row: *const u8,
    i: usize,
    xq: *const i8,
    xd: *const f32,
    xs: *const i16,
    tbl: __m256i,
    acc: &mut [__m256; NT],
    corr: &mut [f32; NT],
) {
    let b = row.add(BYTES * i);
    if BYTES > 32 || i.is_multiple_of(2) {
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PF_STREAM) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add(super::dots::PF_FAR) as *const i8);
    }
    // Unsigned values (dot_us of them and the activations as they are):
    // Q4_0, and the legacy formats with a fifth bit (3: Q5_0, 4: Q5_1)
    // and / or an offset `m` after `d` (4, 5: Q4_1).
    let unsigned = matches!(KIND, 1 | 3 | 4 | 5);
    let mut wv = match KIND {
        0 => _mm256_loadu_si256(b.add(2) as *const __m256i),
        1 => nibbles(b.add(2)),
        2 => _mm256_shuffle_epi8(tbl, nibbles(b.add(2))),
        3 => fifth(b.add(2)),
        4 => fifth(b.add(4)),
        _ => nibbles(b.add(4)),
    };
    let mut wabs = if unsigned { wv } else { _mm256_abs_epi8(wv) };
    pin!(wv, wabs);
    let wd = f16c(rd16(b));
    let m = if matches!(KIND, 4 | 5) {
        f16c(rd16(b.add(2)))
    } else {
        0.0
    };
    for t in 0..NT {
        let xv = _mm256_loadu_si256(xq.add(32 * (i * NT + t)) as *const __m256i);
        let dot = match unsigned {
            true => dot_us(wv, xv),
            false => dot_us(wabs, _mm256_sign_epi8(xv, wv)),
        };
        let xdt = *xd.add(i * PANEL_LANES + t);
        let s = wd * xdt;
        match KIND {
            1 | 3 => corr[t] += s * *xs.add(i * NT + t) as f32,
            4 | 5 => corr[t] += m * xdt * *xs.add(i * NT + t) as f32,
            _ => {}
        }
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(s), acc[t]);
    }
}

/// The 32 unsigned 5-bit values of a block whose 32-bit word of fifth bits
/// is at `bits`, the nibbles after it (Q5_0, Q5_1), in `nibbles` order.
#[inline(always)]
unsafe fn fifth(bits: *const u8) -> __m256i {
    let hi = super::legacy::fifth_bits((bits as *const u32).read_unaligned());
    _mm256_or_si256(nibbles(bits.add(4)), hi)
}

/// `sum_j mn[j] * (bs_t[2j] + bs_t[2j + 1])` for tokens `t = t0..t0 + 8`
/// (their block `i`'s sixteen 16-value sums, `xs`: a panel's) in lane
/// `t - t0` (tokens from `NT` on: 0), as `k4_mins`; exact.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn k4_mins8<const NT: usize>(mn: u64, xs: *const i16, i: usize, t0: usize) -> __m256i {
    let m = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(mn as i64));
    // [m0 m0 m1 m1 m2 m2 m3 m3 | m4 m4 m5 m5 m6 m6 m7 m7]
    let mdup = _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m));
    let p: [__m256i; 8] = std::array::from_fn(|k| {
        let t = t0 + k;
        if t < NT {
            _mm256_madd_epi16(
                _mm256_loadu_si256(xs.add(16 * (i * NT + t)) as *const __m256i),
                mdup,
            )
        } else {
            _mm256_setzero_si256()
        }
    });
    // lanes: [p0 p1 p2 p3 (low halves) | p0 p1 p2 p3 (high halves)], then p4..p7
    let a = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    let b = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256(a, b, 0x20),
        _mm256_permute2x128_si256(a, b, 0x31),
    )
}

/// Q4_K (`HIGH` false) / Q5_K (`HIGH` true), as `dot_k45`, for `NT`
/// (≤ [`MAX_TOKENS_K`] = 9) tokens. The per-block scalar work of the
/// one-token kernel (the weight and min scales times the token's scale, the
/// mins term) runs in the eight lanes of a vector, one token per lane: the
/// same operations, rounded the same way.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_k45<const HIGH: bool, const NT: usize>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [&mut [f32]],
) {
    let n = check::<NT>(w, rb, p, out, 256, 16);
    let nb = p.n_blocks;
    let (xq, xd, xs) = (p.qs.as_ptr(), p.d.as_ptr(), p.sums.as_ptr());
    let bsz = if HIGH { 176 } else { 144 };
    let wp = w.as_ptr();
    for r in 0..n {
        let row = wp.add(r * rb);
        let mut facc = [_mm256_setzero_ps(); NT];
        // lanes of tokens 0..8, 8..16 (the second only for more than 8)
        let mut msum_all = [_mm256_setzero_ps(); 2];
        let msum = &mut msum_all[..NT.div_ceil(8)];
        for i in 0..nb {
            let b = row.add(bsz * i);
            super::dots::prefetch_block(b.wrapping_add(PF_STREAM), bsz);
            super::dots::prefetch_far(b, bsz);
            let (sc, mn) = scales_mins_k4_words(std::slice::from_raw_parts(b.add(4), 12));
            let sp = k4_scale_lanes(sc);
            let qs = b.add(if HIGH { 48 } else { 16 });
            let mut hbits = if HIGH {
                _mm256_loadu_si256(b.add(16) as *const __m256i)
            } else {
                _mm256_setzero_si256()
            };
            let mut iacc = [_mm256_setzero_si256(); NT];
            for j in 0..4 {
                let q = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
                let (mut lo, mut hi) = super::dots::k45_nibbles::<HIGH>(q, &mut hbits);
                let (mut v1, mut v2) = (k4_scale(sp, 2 * j), k4_scale(sp, 2 * j + 1));
                pin!(lo, hi, v1, v2);
                // chunks 8i + 2j (low nibbles) and 8i + 2j + 1 (high)
                let (cl, ch) = (
                    xq.add(32 * NT * (8 * i + 2 * j)),
                    xq.add(32 * NT * (8 * i + 2 * j + 1)),
                );
                for t in 0..NT {
                    let xl = _mm256_loadu_si256(cl.add(32 * t) as *const __m256i);
                    let xh = _mm256_loadu_si256(ch.add(32 * t) as *const __m256i);
                    let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), v1);
                    let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), v2);
                    iacc[t] = _mm256_add_epi32(iacc[t], _mm256_add_epi32(pl, ph));
                }
                for a in iacc.iter_mut() {
                    pin!(*a);
                }
            }
            // one token per lane: d = wd·xd, msum += (wm·xd)·mins
            let (wd, wm) = (f16c(rd16(b)), f16c(rd16(b.add(2))));
            let mut d = [0f32; PANEL_LANES];
            for (g, ms) in msum.iter_mut().enumerate() {
                let xdv = _mm256_loadu_ps(xd.add(i * PANEL_LANES + 8 * g));
                let mins = _mm256_cvtepi32_ps(k4_mins8::<NT>(mn, xs, i, 8 * g));
                *ms = _mm256_add_ps(
                    *ms,
                    _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(wm), xdv), mins),
                );
                _mm256_storeu_ps(
                    d.as_mut_ptr().add(8 * g),
                    _mm256_mul_ps(_mm256_set1_ps(wd), xdv),
                );
            }
            for t in 0..NT {
                facc[t] = _mm256_fmadd_ps(
                    _mm256_cvtepi32_ps(iacc[t]),
                    _mm256_broadcast_ss(&d[t]),
                    facc[t],
                );
            }
        }
        let mut ms = [0f32; PANEL_LANES];
        for (g, m) in msum_all[..NT.div_ceil(8)].iter().enumerate() {
            _mm256_storeu_ps(ms.as_mut_ptr().add(8 * g), *m);
        }
        for t in 0..NT {
            *out[t].get_unchecked_mut(r) = hsum256(facc[t]) - ms[t];
        }
    }
}

/// Step `(N, K)` of a Q6_K block (its 16-groups `8N + 2K`, `+ 1`) for `NT`
/// tokens (`c`: the block's first activation chunk): `iacc[t] += sc ·
/// (q · x)`, exact.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn q6k_step<const NT: usize, const N: usize, const K: usize>(
    b: *const u8,
    lanes: &[__m256i; 2],
    c: *const i8,
    iacc: &mut [__m256i; NT],
) {
    let mut q = super::dots::q6k_quant(b, N, K);
    let mut s = super::dots::q6k_scale(lanes, N, K);
    pin!(q, s);
    let c = c.add(32 * NT * (4 * N + K));
    for (t, acc) in iacc.iter_mut().enumerate() {
        let x = c.add(32 * t);
        let p = _mm256_maddubs_epi16(q, _mm256_loadu_si256(x as *const __m256i));
        *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(p, s));
    }
    for a in iacc.iter_mut() {
        pin!(*a);
    }
}

/// Q6_K, as `dot_q6_k`, for `NT` (≤ [`MAX_TOKENS_K`] = 9) tokens.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_q6_k<const NT: usize>(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    let n = check::<NT>(w, rb, p, out, 256, 16);
    let nb = p.n_blocks;
    let (xq, xd, xs) = (p.qs.as_ptr(), p.d.as_ptr(), p.sums.as_ptr());
    let wp = w.as_ptr();
    for r in 0..n {
        let row = wp.add(r * rb);
        let mut facc = [_mm256_setzero_ps(); NT];
        for i in 0..nb {
            let b = row.add(210 * i);
            super::dots::prefetch_block(b.wrapping_add(PF_STREAM), 210);
            super::dots::prefetch_far(b, 210);
            let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
            let lanes = super::dots::q6k_scale_lanes(sc16);
            let mut iacc = [_mm256_setzero_si256(); NT];
            // the eight steps written out: as loops, LLVM kept the one over
            // `k` (a branch per step, `q6k_quant`'s shifts chosen at run
            // time, each scale mask built from scalars in 5 operations;
            // 8 tokens ran at ~17 cycles per block and token on AMD Zen 3)
            let c = xq.add(32 * NT * 8 * i);
            q6k_step::<NT, 0, 0>(b, &lanes, c, &mut iacc);
            q6k_step::<NT, 0, 1>(b, &lanes, c, &mut iacc);
            q6k_step::<NT, 0, 2>(b, &lanes, c, &mut iacc);
            q6k_step::<NT, 0, 3>(b, &lanes, c, &mut iacc);
            q6k_step::<NT, 1, 0>(b, &lanes, c, &mut iacc);
            q6k_step::<NT, 1, 1>(b, &lanes, c, &mut iacc);
            q6k_step::<NT, 1, 2>(b, &lanes, c, &mut iacc);
            q6k_step::<NT, 1, 3>(b, &lanes, c, &mut iacc);
            let mut d = [0f32; PANEL_LANES];
            let wd = _mm256_set1_ps(f16c(rd16(b.add(208))));
            for g in 0..NT.div_ceil(8) {
                let xdv = _mm256_loadu_ps(xd.add(i * PANEL_LANES + 8 * g));
                _mm256_storeu_ps(d.as_mut_ptr().add(8 * g), _mm256_mul_ps(wd, xdv));
            }
            for t in 0..NT {
                // minus 32 * sum_g sc_g * bsum_g
                let bs16 = _mm256_loadu_si256(xs.add(16 * (i * NT + t)) as *const __m256i);
                let corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs16), 5);
                let ia = _mm256_sub_epi32(iacc[t], corr);
                facc[t] =
                    _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia), _mm256_broadcast_ss(&d[t]), facc[t]);
            }
        }
        for t in 0..NT {
            *out[t].get_unchecked_mut(r) = hsum256(facc[t]);
        }
    }
}

/// IQ4_XS, as `dot_iq4_xs`, for `NT` (≤ [`MAX_TOKENS_K`]) tokens: each
/// 32-value sub-block looked up in the IQ4_NL table once, its products
/// with every token's chunk scaled by the sub-block's scale into one i32
/// accumulator per token, which meets the f32 accumulator once per block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_iq4_xs<const NT: usize>(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    const BSZ: usize = 136;
    let n = check::<NT>(w, rb, p, out, 256, 16);
    let nb = p.n_blocks;
    let (xq, xd) = (p.qs.as_ptr(), p.d.as_ptr());
    let tbl =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i));
    let wp = w.as_ptr();
    for r in 0..n {
        let row = wp.add(r * rb);
        let mut facc = [_mm256_setzero_ps(); NT];
        for i in 0..nb {
            let b = row.add(BSZ * i);
            super::dots::prefetch_block(b.wrapping_add(PF_STREAM), BSZ);
            super::dots::prefetch_far(b, BSZ);
            let ls = iq4xs_scales(std::slice::from_raw_parts(b, BSZ));
            let mut iacc = [_mm256_setzero_si256(); NT];
            for (ib, &l) in ls.iter().enumerate() {
                let mut v = _mm256_shuffle_epi8(tbl, nibbles(b.add(8 + 16 * ib)));
                let mut va = _mm256_abs_epi8(v);
                let mut lv = _mm256_set1_epi16(l as i16);
                pin!(v, va, lv);
                let c = xq.add(32 * NT * (8 * i + ib));
                for (t, acc) in iacc.iter_mut().enumerate() {
                    let xv = _mm256_loadu_si256(c.add(32 * t) as *const __m256i);
                    let pr = _mm256_maddubs_epi16(va, _mm256_sign_epi8(xv, v));
                    *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(pr, lv));
                }
            }
            let wd = f16c(rd16(b));
            for t in 0..NT {
                let d = wd * *xd.add(i * PANEL_LANES + t);
                facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t]), _mm256_set1_ps(d), facc[t]);
            }
        }
        for t in 0..NT {
            *out[t].get_unchecked_mut(r) = hsum256(facc[t]);
        }
    }
}

/// The grid formats (`KIND`: IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), as
/// `dots_iq::dot_grid`, for `NT` (≤ [`MAX_TOKENS_K`]) tokens: each 32-value
/// sub-block's grid magnitudes, signs and scales looked up once, its
/// products with every token's chunk into one i32 accumulator per token,
/// which meets the f32 accumulator once per block.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_grid<const KIND: u8, const NT: usize>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [&mut [f32]],
) {
    let bsz = grid_bytes(KIND);
    let n = check::<NT>(w, rb, p, out, 256, 16);
    let nb = p.n_blocks;
    let (xq, xd) = (p.qs.as_ptr(), p.d.as_ptr());
    let wp = w.as_ptr();
    for r in 0..n {
        let row = wp.add(r * rb);
        let mut facc = [_mm256_setzero_ps(); NT];
        for i in 0..nb {
            let b = row.add(bsz * i);
            super::dots::prefetch_block(b.wrapping_add(PF_STREAM), bsz);
            super::dots::prefetch_far(b, bsz);
            let mut iacc = [_mm256_setzero_si256(); NT];
            for ib in 0..8 {
                let (mut g, mut s, mut ls) = grid_sub::<KIND>(b, ib);
                pin!(g, s, ls);
                let c = xq.add(32 * NT * (8 * i + ib));
                for (t, acc) in iacc.iter_mut().enumerate() {
                    *acc = _mm256_add_epi32(*acc, signed_block(g, s, c.add(32 * t), ls));
                }
            }
            let wd = grid_d::<KIND>(b);
            for t in 0..NT {
                let d = wd * *xd.add(i * PANEL_LANES + t);
                facc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t]), _mm256_set1_ps(d), facc[t]);
            }
        }
        for t in 0..NT {
            *out[t].get_unchecked_mut(r) = hsum256(facc[t]);
        }
    }
}

/// Defines a `#[target_feature]` entry point `$name` that serves 1 to `$max`
/// tokens by choosing the instantiation of `$kernel` for their count.
macro_rules! tile_entry {
    ($name:ident, $kernel:ident, [$($nt:literal)+]) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $name(
            w: &[u8],
            rb: usize,
            p: &ActPanel,
            out: &mut [&mut [f32]],
        ) {
            match p.nt {
                $($nt => $kernel::<$nt>(w, rb, p, out),)+
                n => panic!("{}: unsupported token count {n}", stringify!($name)),
            }
        }
    };
}
/// Most tokens per call: the 32-value formats keep two f32 accumulators per
/// token in registers (as their one-token kernel does), the K-quants one
/// i32 accumulator.
pub(super) const MAX_TOKENS_B32: usize = 4;
pub(super) const MAX_TOKENS_K: usize = 9;
/// Each format's kernel with its token count as the only parameter.
macro_rules! format_kernel {
    ($name:ident, $kernel:ident, $($param:tt),+) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        #[inline]
        unsafe fn $name<const NT: usize>(
            w: &[u8],
            rb: usize,
            p: &ActPanel,
            out: &mut [&mut [f32]],
        ) {
            $kernel::<$($param,)+ NT>(w, rb, p, out)
        }
    };
}
format_kernel!(q8_0_n, rows_b32, 34, 0);
format_kernel!(q4_0_n, rows_b32, 18, 1);
format_kernel!(iq4_nl_n, rows_b32, 18, 2);
format_kernel!(q5_0_n, rows_b32, 22, 3);
format_kernel!(q5_1_n, rows_b32, 24, 4);
format_kernel!(q4_1_n, rows_b32, 20, 5);
format_kernel!(q4_k_n, rows_k45, false);
format_kernel!(q5_k_n, rows_k45, true);
format_kernel!(iq2_xxs_n, rows_grid, IQ2_XXS);
format_kernel!(iq2_xs_n, rows_grid, IQ2_XS);
format_kernel!(iq2_s_n, rows_grid, IQ2_S);
format_kernel!(iq3_xxs_n, rows_grid, IQ3_XXS);
format_kernel!(iq3_s_n, rows_grid, IQ3_S);
tile_entry!(tile_q8_0, q8_0_n, [1 2 3 4]);
tile_entry!(tile_q4_0, q4_0_n, [1 2 3 4]);
tile_entry!(tile_iq4_nl, iq4_nl_n, [1 2 3 4]);
tile_entry!(tile_q5_0, q5_0_n, [1 2 3 4]);
tile_entry!(tile_q5_1, q5_1_n, [1 2 3 4]);
tile_entry!(tile_q4_1, q4_1_n, [1 2 3 4]);
tile_entry!(tile_q4_k, q4_k_n, [1 2 3 4 5 6 7 8 9]);
tile_entry!(tile_q5_k, q5_k_n, [1 2 3 4 5 6 7 8 9]);
tile_entry!(tile_q6_k, rows_q6_k, [1 2 3 4 5 6 7 8 9]);
tile_entry!(tile_iq4_xs, rows_iq4_xs, [1 2 3 4 5 6 7 8 9]);
tile_entry!(tile_iq2_xxs, iq2_xxs_n, [1 2 3 4 5 6 7 8 9]);
tile_entry!(tile_iq2_xs, iq2_xs_n, [1 2 3 4 5 6 7 8 9]);
tile_entry!(tile_iq2_s, iq2_s_n, [1 2 3 4 5 6 7 8 9]);
tile_entry!(tile_iq3_xxs, iq3_xxs_n, [1 2 3 4 5 6 7 8 9]);
tile_entry!(tile_iq3_s, iq3_s_n, [1 2 3 4 5 6 7 8 9]);

#[cfg(test)]
mod tests {
    use super::super::super::act::{ActPanel, QuantAct, PANEL_LANES};
    use super::super::super::{ActKind, VecKernel, WeightRef};
    use crate::simd::{detected_level, SimdLevel};
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    /// Each token's result from the tile kernels (1 to 4 or 9 tokens, row counts
    /// below and above the prefetch distance and a group of 8 rows) equals the one-token dot
    /// kernel's bit for bit (batch invariance of decode).
    #[test]
    fn tiles_equal_one_token_each_bit_for_bit() {
        if detected_level() < SimdLevel::Avx2 {
            return;
        }
        for (ty, cols) in [
            (GgmlType::Q8_0, 512),
            // an odd block count: the last block alone in the even accumulator
            (GgmlType::Q8_0, 480),
            // more sums than the rows-in-lanes kernel's stack buffer
            (GgmlType::Q8_0, 32 * 520),
            (GgmlType::Q4_0, 512),
            (GgmlType::Q4_0, 480),
            (GgmlType::IQ4_NL, 480),
            (GgmlType::Q5_0, 480),
            (GgmlType::Q5_1, 512),
            (GgmlType::Q4_1, 480),
            (GgmlType::Q4_K, 512),
            // more blocks × tokens than the rows-in-lanes kernel's stack buffer
            (GgmlType::Q4_K, 256 * 33),
            (GgmlType::Q5_K, 512),
            (GgmlType::Q6_K, 512),
            (GgmlType::IQ4_XS, 512),
            (GgmlType::IQ2_XXS, 512),
            (GgmlType::IQ2_XS, 512),
            (GgmlType::IQ2_S, 512),
            (GgmlType::IQ3_XXS, 512),
            (GgmlType::IQ3_S, 512),
        ] {
            // both choices of `plan::avx2_lanes` (Q8_0 and Q4_K); 29 rows:
            // four groups of 8 through the Q8_0 kernel's two buffers, and
            // for its one-token kernel three far-apart groups and a side by
            // side one of 5; 24: three far-apart groups, no other
            let plans = [true, false].map(|l| [(l, 1), (l, 5), (l, 13), (l, 24), (l, 29)]);
            for (lanes, rows) in plans.into_iter().flatten() {
                let mut rng = Rng::new(7 + rows as u64);
                let data = random_weights(&mut rng, ty, rows, cols);
                let w = WeightRef::new(ty, &data, rows, cols).unwrap();
                let x = rng.vec((PANEL_LANES + 1) * cols);
                let Some(VecKernel::Quant(kind, one, _)) = super::super::vec_kernel(ty, lanes)
                else {
                    panic!("{ty}: no AVX2 dot kernel");
                };
                let tk = super::super::tile_kernel(ty, lanes).expect("tile kernel");
                let (tile, max) = (tk.f, tk.max_tokens);
                let (xa, nd, ns) = match kind {
                    ActKind::Q8_0 => (QuantAct::q8_0(&x, cols), cols / 32, cols / 32),
                    ActKind::Q8K => (QuantAct::q8_k(&x, cols), cols / 256, cols / 16),
                };
                let (block, per_block) = match kind {
                    ActKind::Q8_0 => (32, 1),
                    ActKind::Q8K => (256, 16),
                };
                let act = |t: usize| {
                    (
                        xa.qs_row(t),
                        &xa.d[t * nd..(t + 1) * nd],
                        &xa.sums[t * ns..(t + 1) * ns],
                    )
                };
                for nt in 1..=max {
                    // the last nt of PANEL_LANES + 1 tokens: a panel that does
                    // not start at token 0, up to the lanes tiles' 16 tokens
                    let t0 = PANEL_LANES + 1 - nt;
                    let panel = ActPanel::new(&xa, t0, nt, block, per_block, 32);
                    let mut ys = vec![vec![f32::NAN; rows]; nt];
                    let mut outs: Vec<&mut [f32]> =
                        ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                    tile(w.data, w.row_bytes(), &panel, &mut outs);
                    for (t, y) in ys.iter().enumerate() {
                        for (r, g) in y.iter().enumerate() {
                            let (q, d, sm) = act(t0 + t);
                            let want = one(w.row(r), q, d, sm);
                            assert!(want.is_finite());
                            assert_eq!(
                                g.to_bits(),
                                want.to_bits(),
                                "{ty} lanes {lanes}: {nt} tokens row {r} token {t}"
                            );
                        }
                    }
                }
            }
        }
    }
}
