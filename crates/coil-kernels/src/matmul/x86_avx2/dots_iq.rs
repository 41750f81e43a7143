//! AVX2 one-token dot products of the lattice, ternary and MXFP4 formats
//! (the arithmetic of `vecdot_iq.rs`, which specifies them).
//!
//! Per sub-block of 32 values the weights become one vector of 32 bytes,
//! and `vpmaddubsw` multiplies it with the activations: the lattice
//! formats' grid entries are unsigned magnitudes (IQ2: 8–43, IQ3_XXS: 4–62,
//! IQ3_S: 1–15), their signs moved onto the activations with `vpsignb`
//! (`±1` bytes from the sign bits); IQ1's `8·g ± 1` (−9..9) and MXFP4's
//! table values (−12..12) take the same route through `|w|` and
//! `sign(x, w)`; the ternary formats' stored `t + 1` (0..2) multiplies
//! the activations directly and `Σ x` (the Q8_K group sums) is taken off
//! once per block. Pairs of products fit in i16 (at most 2·62·127);
//! `vpmaddwd` by the integer scale (per 32 values, or per 16: one per
//! 128-bit half) adds them into i32 lanes, exact over a block; the float
//! scales are applied once per block.

use crate::matmul::x86_avx2::dots::{f16c, hsum256, prefetch_block, prefetch_far, PF_STREAM};
use coil_gguf::quant::grids::{
    IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID, KSIGNS_IQ2XS,
    KVALUES_MXFP4,
};
use std::arch::x86_64::*;

#[inline(always)]
unsafe fn rd16(p: *const u8) -> u16 {
    u16::from_le_bytes([*p, *p.add(1)])
}

#[inline(always)]
unsafe fn rd32(p: *const u8) -> u32 {
    std::ptr::read_unaligned(p as *const u32)
}

/// The 32 sign bits of `s` (bit `j` of byte `k`: value `8k + j`) as ±1
/// bytes (set: −1).
#[inline(always)]
unsafe fn signs_pm1(s: u32) -> __m256i {
    let v = _mm256_set1_epi32(s as i32);
    let pick = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3,
        3, 3,
    );
    let bits = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
    let set = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(v, pick), bits), bits);
    _mm256_or_si256(set, _mm256_set1_epi8(1))
}

/// `Σ_pairs ls·(g·±x)` of 32 values as 8 i32 lanes: `g` unsigned
/// magnitudes, `signs` ±1 bytes, `ls` the `vpmaddwd` scales (i16 lanes).
#[inline(always)]
pub(in crate::matmul) unsafe fn signed_block(
    g: __m256i,
    signs: __m256i,
    x: *const i8,
    ls: __m256i,
) -> __m256i {
    let xv = _mm256_loadu_si256(x as *const __m256i);
    _mm256_madd_epi16(_mm256_maddubs_epi16(g, _mm256_sign_epi8(xv, signs)), ls)
}

/// The scale vector of a 32-value sub-block with scale `lo` for values
/// 0..16 and `hi` for 16..32 (`vpmaddwd` lanes 0–7 and 8–15).
#[inline(always)]
unsafe fn scale_halves(lo: i32, hi: i32) -> __m256i {
    _mm256_setr_m128i(_mm_set1_epi16(lo as i16), _mm_set1_epi16(hi as i16))
}

/// One block's `Σ` (8 lanes, exact) times `d` into `acc`.
#[inline(always)]
unsafe fn fold(acc: __m256, sumi: __m256i, d: f32) -> __m256 {
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(sumi), _mm256_set1_ps(d), acc)
}

/// The five lattice formats whose sub-blocks are unsigned grid magnitudes
/// with their signs apart ([`grid_sub`]), as `KIND` of [`dot_grid`] and
/// the few-token tiles (`tiles.rs`).
pub(in crate::matmul) const IQ2_XXS: u8 = 0;
pub(in crate::matmul) const IQ2_XS: u8 = 1;
pub(in crate::matmul) const IQ2_S: u8 = 2;
pub(in crate::matmul) const IQ3_XXS: u8 = 3;
pub(in crate::matmul) const IQ3_S: u8 = 4;

/// Bytes per 256-value block of grid format `KIND`.
#[inline(always)]
pub(in crate::matmul) const fn grid_bytes(kind: u8) -> usize {
    [66, 74, 82, 98, 110][kind as usize]
}

/// The ±1 sign bytes of each 7-bit sign index (`KSIGNS_IQ2XS`'s eight bits
/// of entry `i`, bit `j` set: byte `j` is −1), one `u64` per index: four
/// loads give a sub-block's 32 signs.
const SIGNS64: [u64; 128] = {
    let mut t = [0u64; 128];
    let mut i = 0;
    while i < 128 {
        let mut j = 0;
        while j < 8 {
            let byte = if KSIGNS_IQ2XS[i] >> j & 1 != 0 {
                0xff
            } else {
                1
            };
            t[i] |= byte << (8 * j);
            j += 1;
        }
        i += 1;
    }
    t
};

/// The signs of four groups of 8 from their 7-bit sign indices `s(l)`.
#[inline(always)]
unsafe fn signs4(s: impl Fn(usize) -> usize) -> __m256i {
    let g = |l: usize| SIGNS64[s(l) & 127] as i64;
    _mm256_set_epi64x(g(3), g(2), g(1), g(0))
}

/// Sub-block `ib` (values `32ib..32ib + 32`) of the grid-format block at
/// `bp`: its grid magnitudes (unsigned bytes), its ±1 signs and its
/// `vpmaddwd` scales (i16 lanes); see `vecdot_iq.rs` for each layout.
#[inline(always)]
pub(in crate::matmul) unsafe fn grid_sub<const KIND: u8>(
    bp: *const u8,
    ib: usize,
) -> (__m256i, __m256i, __m256i) {
    match KIND {
        IQ2_XXS => {
            let q = bp.add(2 + 8 * ib);
            let aux = rd32(q.add(4));
            let g = |l: usize| IQ2XXS_GRID[*q.add(l) as usize] as i64;
            let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
            let ls = _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16);
            (grid, signs4(|l| (aux >> (7 * l)) as usize), ls)
        }
        IQ2_XS => {
            let q = |l: usize| rd16(bp.add(2 + 2 * (4 * ib + l))) as usize;
            let g = |l: usize| IQ2XS_GRID[q(l) & 511] as i64;
            let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
            let sc = *bp.add(66 + ib) as i32;
            let ls = scale_halves(2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1);
            (grid, signs4(|l| q(l) >> 9), ls)
        }
        IQ2_S => {
            let qh = *bp.add(66 + ib) as usize;
            let g = |l: usize| {
                let index = *bp.add(2 + 4 * ib + l) as usize | (qh << (8 - 2 * l) & 0x300);
                IQ2S_GRID[index] as i64
            };
            let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
            let sc = *bp.add(74 + ib) as i32;
            let ls = scale_halves(2 * (sc & 0xf) + 1, 2 * (sc >> 4) + 1);
            (grid, signs_pm1(rd32(bp.add(34 + 4 * ib))), ls)
        }
        IQ3_XXS => {
            let q = bp.add(2 + 8 * ib);
            let g = |k: usize| IQ3XXS_GRID[*q.add(k) as usize] as i32;
            let grid = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
            let aux = rd32(bp.add(66 + 4 * ib));
            let ls = _mm256_set1_epi16((2 * (aux >> 28) + 1) as i16);
            (grid, signs4(|l| (aux >> (7 * l)) as usize), ls)
        }
        _ => {
            let (q, qh) = (bp.add(2 + 8 * ib), *bp.add(66 + ib) as usize);
            let g = |k: usize| IQ3S_GRID[*q.add(k) as usize | (qh << (8 - k) & 256)] as i32;
            let grid = _mm256_setr_epi32(g(0), g(1), g(2), g(3), g(4), g(5), g(6), g(7));
            let sc = (*bp.add(106 + ib / 2) >> (4 * (ib % 2)) & 0xf) as i16;
            let ls = _mm256_set1_epi16(2 * sc + 1);
            (grid, signs_pm1(rd32(bp.add(74 + 4 * ib))), ls)
        }
    }
}

/// The float factor of the grid-format block at `bp` (its `d` times the
/// format's constant: IQ2 1/8, IQ3_XXS 1/4, IQ3_S 1), to multiply by the
/// token's block scale.
#[inline(always)]
pub(in crate::matmul) unsafe fn grid_d<const KIND: u8>(bp: *const u8) -> f32 {
    let d = f16c(rd16(bp));
    match KIND {
        IQ3_XXS => 0.25 * d,
        IQ3_S => d,
        _ => 0.125 * d,
    }
}

/// `Σ` of the grid-format block at `bp` with the 256 activations at `x`
/// as 8 i32 lanes, exact.
#[inline(always)]
pub(in crate::matmul) unsafe fn grid_block<const KIND: u8>(bp: *const u8, x: *const i8) -> __m256i {
    let mut sumi = _mm256_setzero_si256();
    for ib in 0..8 {
        let (grid, signs, ls) = grid_sub::<KIND>(bp, ib);
        sumi = _mm256_add_epi32(sumi, signed_block(grid, signs, x.add(32 * ib), ls));
    }
    sumi
}

/// IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (`KIND`); see `spec::dot_iq2_xxs`
/// and the others. `PF` > 0: each block prefetches the bytes `PF` ahead
/// (and `dots::PF_FAR` ahead into L2), for the one-token rows ([`rows_grid`]).
///
/// # Safety
/// AVX2 + FMA + F16C; `row` whole blocks, `xq`/`xd` Q8_K activations of
/// its length.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(in crate::matmul) unsafe fn dot_grid<const KIND: u8, const PF: usize>(
    row: &[u8],
    xq: &[i8],
    xd: &[f32],
    _xs: &[i16],
) -> f32 {
    let bs = grid_bytes(KIND);
    let mut acc = _mm256_setzero_ps();
    for (i, b) in row.chunks_exact(bs).enumerate() {
        let bp = b.as_ptr();
        if PF > 0 {
            prefetch_block(bp.wrapping_add(PF), bs);
            prefetch_far(bp, bs);
        }
        let sumi = grid_block::<KIND>(bp, xq.as_ptr().add(256 * i));
        acc = fold(acc, sumi, grid_d::<KIND>(bp) * xd[i]);
    }
    hsum256(acc)
}

/// One-token rows of a grid format: consecutive rows walked in order, each
/// block prefetching as the K-quants' rows do (`dots::rows_stream`).
///
/// # Safety
/// As [`dot_grid`]; `w` holds `out.len()` rows of `rb` bytes.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn rows_grid<const KIND: u8>(
    w: &[u8],
    rb: usize,
    xq: &[i8],
    xd: &[f32],
    xs: &[i16],
    out: &mut [f32],
) {
    assert!(w.len() >= out.len() * rb);
    for (r, o) in out.iter_mut().enumerate() {
        *o = dot_grid::<KIND, PF_STREAM>(&w[r * rb..(r + 1) * rb], xq, xd, xs);
    }
}

/// The 32 values `8·g + δ` of four IQ1 groups (grid indices `i0..i3`, δ
/// of group `l` negative where bit `l` of `neg` is set) as i8.
#[inline(always)]
unsafe fn iq1_values(idx: [usize; 4], neg: u32) -> __m256i {
    let g = |l: usize| IQ1S_GRID[idx[l]] as i64;
    let grid = _mm256_set_epi64x(g(3), g(2), g(1), g(0));
    let delta = _mm256_set_epi64x(
        if neg & 8 != 0 { -1 } else { 1 },
        if neg & 4 != 0 { -1 } else { 1 },
        if neg & 2 != 0 { -1 } else { 1 },
        if neg & 1 != 0 { -1 } else { 1 },
    );
    // 64-bit lanes of ±1 become bytes of ±1: broadcast the low byte
    let spread = _mm256_setr_epi8(
        0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 8, 8,
        8, 8,
    );
    let delta = _mm256_shuffle_epi8(delta, spread);
    // 8·g: g is −1, 0 or 1 per byte (a byte shift by 3 keeps the sign)
    let g8 = _mm256_sign_epi8(_mm256_set1_epi8(8), grid);
    _mm256_add_epi8(g8, delta)
}

/// `Σ ls·w·x` of 32 signed byte weights `w` as 8 i32 lanes.
#[inline(always)]
unsafe fn signed_values(w: __m256i, x: *const i8, ls: __m256i) -> __m256i {
    let xv = _mm256_loadu_si256(x as *const __m256i);
    _mm256_madd_epi16(
        _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(xv, w)),
        ls,
    )
}

/// IQ1_S; see [`spec::dot_iq1_s`].
///
/// # Safety
/// As [`dot_grid`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn dot_iq1_s(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (i, b) in row.chunks_exact(50).enumerate() {
        let (bp, x) = (b.as_ptr(), xq.as_ptr().add(256 * i));
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let qh = rd16(bp.add(34 + 2 * ib)) as usize;
            let idx = std::array::from_fn(|l| {
                *bp.add(2 + 4 * ib + l) as usize | (qh >> (3 * l) & 7) << 8
            });
            let neg = if qh & 0x8000 != 0 { 15 } else { 0 };
            let ls = _mm256_set1_epi16((2 * (qh >> 12 & 7) + 1) as i16);
            let w = iq1_values(idx, neg);
            sumi = _mm256_add_epi32(sumi, signed_values(w, x.add(32 * ib), ls));
        }
        acc = fold(acc, sumi, 0.125 * f16c(rd16(bp)) * xd[i]);
    }
    hsum256(acc)
}

/// IQ1_M; see [`spec::dot_iq1_m`].
///
/// # Safety
/// As [`dot_grid`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn dot_iq1_m(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for (i, b) in row.chunks_exact(56).enumerate() {
        let (bp, x) = (b.as_ptr(), xq.as_ptr().add(256 * i));
        let sc: [u16; 4] = std::array::from_fn(|k| rd16(bp.add(48 + 2 * k)));
        let d = coil_gguf::quant::iq1::iq1_m_scale(sc);
        let mut sumi = _mm256_setzero_si256();
        for ib in 0..8 {
            let h = rd16(bp.add(32 + 2 * ib)) as usize; // four nibbles, group l at 4l
            let idx =
                std::array::from_fn(|l| *bp.add(4 * ib + l) as usize | (h >> (4 * l) & 7) << 8);
            let neg = (0..4).fold(0, |n, l| n | (h >> (4 * l + 3) & 1) << l) as u32;
            let s = (sc[ib / 2] >> (6 * (ib % 2))) as i32;
            let ls = scale_halves(2 * (s & 7) + 1, 2 * (s >> 3 & 7) + 1);
            let w = iq1_values(idx, neg);
            sumi = _mm256_add_epi32(sumi, signed_values(w, x.add(32 * ib), ls));
        }
        acc = fold(acc, sumi, 0.125 * d * xd[i]);
    }
    hsum256(acc)
}

/// `Σ xs` of a block's 16 group sums.
#[inline(always)]
fn block_sum(xs: &[i16], i: usize) -> i32 {
    xs[16 * i..16 * i + 16].iter().map(|&v| v as i32).sum()
}

/// TQ2_0; see [`spec::dot_tq2_0`].
///
/// # Safety
/// As [`dot_grid`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn dot_tq2_0(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let m3 = _mm256_set1_epi8(3);
    let one = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (i, b) in row.chunks_exact(66).enumerate() {
        let (bp, x) = (b.as_ptr(), xq.as_ptr().add(256 * i));
        let mut sumi = _mm256_setzero_si256();
        for h in 0..2 {
            let v = _mm256_loadu_si256(bp.add(32 * h) as *const __m256i);
            for l in 0..4 {
                let t = _mm256_and_si256(_mm256_srlv_epi32(v, _mm256_set1_epi32(2 * l)), m3);
                let xv = _mm256_loadu_si256(x.add(128 * h + 32 * l as usize) as *const __m256i);
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(_mm256_maddubs_epi16(t, xv), one));
            }
        }
        let sumi = _mm256_sub_epi32(
            sumi,
            _mm256_setr_epi32(block_sum(xs, i), 0, 0, 0, 0, 0, 0, 0),
        );
        acc = fold(acc, sumi, f16c(rd16(bp.add(64))) * xd[i]);
    }
    hsum256(acc)
}

/// TQ1_0; see [`spec::dot_tq1_0`]. Trit `n` of byte `q` is
/// `((q·3ⁿ mod 256)·3) >> 8`, taken in 16-bit lanes.
///
/// # Safety
/// As [`dot_grid`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn dot_tq1_0(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    const POW3: [i16; 5] = [1, 3, 9, 27, 81];
    let low = _mm256_set1_epi16(0xff);
    let three = _mm256_set1_epi16(3);
    let mut acc = _mm256_setzero_ps();
    // trits of 16 bytes (as u16 lanes) times 16 activations (i8 at `x`)
    let part = |q: __m256i, n: usize, x: *const i8| {
        let t = _mm256_and_si256(_mm256_mullo_epi16(q, _mm256_set1_epi16(POW3[n])), low);
        let t = _mm256_srli_epi16(_mm256_mullo_epi16(t, three), 8);
        let xv = _mm256_cvtepi8_epi16(_mm_loadu_si128(x as *const __m128i));
        _mm256_madd_epi16(t, xv)
    };
    for (i, b) in row.chunks_exact(54).enumerate() {
        let (bp, x) = (b.as_ptr(), xq.as_ptr().add(256 * i));
        let mut sumi = _mm256_setzero_si256();
        // bytes 0..32: values m + 32n; 32..48: 160 + m + 16n
        for (start, width, base) in [(0usize, 16usize, 0usize), (16, 16, 16), (32, 16, 160)] {
            let q = _mm256_cvtepu8_epi16(_mm_loadu_si128(bp.add(start) as *const __m128i));
            let stride = if start < 32 { 32 } else { 16 };
            for n in 0..5 {
                let at = base + stride * n;
                sumi = _mm256_add_epi32(sumi, part(q, n, x.add(at)));
            }
            let _ = width;
        }
        // qh: values 240 + j + 4n, n < 4 (scalar: 16 values)
        let mut tail = 0i32;
        for n in 0..4 {
            for j in 0..4 {
                let q = (*bp.add(48 + j)).wrapping_mul(POW3[n] as u8);
                tail += ((q as u16 * 3) >> 8) as i32 * *x.add(240 + 4 * n + j) as i32;
            }
        }
        let fix = tail - block_sum(xs, i);
        let sumi = _mm256_add_epi32(sumi, _mm256_setr_epi32(fix, 0, 0, 0, 0, 0, 0, 0));
        acc = fold(acc, sumi, f16c(rd16(bp.add(52))) * xd[i]);
    }
    hsum256(acc)
}

/// MXFP4 with Q8_0 activations; see [`spec::dot_mxfp4`].
///
/// # Safety
/// AVX2 + FMA + F16C; `row` whole blocks, `xq`/`xd` Q8_0 activations of
/// its length.
#[target_feature(enable = "avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn dot_mxfp4(row: &[u8], xq: &[i8], xd: &[f32], _xs: &[i16]) -> f32 {
    let tbl =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_MXFP4.as_ptr() as *const __m128i));
    let one = _mm256_set1_epi16(1);
    let mut acc = _mm256_setzero_ps();
    for (i, b) in row.chunks_exact(17).enumerate() {
        let w = _mm256_shuffle_epi8(
            tbl,
            crate::matmul::x86_avx2::dots::nibbles(b.as_ptr().add(1)),
        );
        let p = signed_values(w, xq.as_ptr().add(32 * i), one);
        let d = coil_gguf::quant::mxfp4::e8m0_to_f32_half(b[0]) * xd[i];
        acc = fold(acc, p, d);
    }
    hsum256(acc)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::act::QuantAct;
    use crate::matmul::scalar::vecdot_iq as spec;
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    type Dot = fn(&[u8], &[i8], &[f32], &[i16]) -> f32;
    type SimdDot = unsafe fn(&[u8], &[i8], &[f32], &[i16]) -> f32;

    /// Each kernel against its specification: the same integers, the
    /// floats applied in another order (f32 rounding).
    #[test]
    fn kernels_match_the_scalar_dots() {
        if !(is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c"))
        {
            return;
        }
        let formats: [(GgmlType, Dot, SimdDot); 10] = [
            (GgmlType::IQ2_XXS, spec::dot_iq2_xxs, dot_grid::<IQ2_XXS, 0>),
            (GgmlType::IQ2_XS, spec::dot_iq2_xs, dot_grid::<IQ2_XS, 0>),
            (GgmlType::IQ2_S, spec::dot_iq2_s, dot_grid::<IQ2_S, 0>),
            (GgmlType::IQ3_XXS, spec::dot_iq3_xxs, dot_grid::<IQ3_XXS, 0>),
            (GgmlType::IQ3_S, spec::dot_iq3_s, dot_grid::<IQ3_S, 0>),
            (GgmlType::IQ1_S, spec::dot_iq1_s, dot_iq1_s),
            (GgmlType::IQ1_M, spec::dot_iq1_m, dot_iq1_m),
            (GgmlType::TQ1_0, spec::dot_tq1_0, dot_tq1_0),
            (GgmlType::TQ2_0, spec::dot_tq2_0, dot_tq2_0),
            (GgmlType::MXFP4, spec::dot_mxfp4, dot_mxfp4),
        ];
        let mut rng = Rng::new(9);
        for (ty, scalar, simd) in formats {
            for cols in [256, 1024] {
                let w = random_weights(&mut rng, ty, 1, cols);
                let x = rng.vec(cols);
                let a = if ty.block_size() == 32 {
                    QuantAct::q8_0(&x, cols)
                } else {
                    QuantAct::q8_k(&x, cols)
                };
                let want = scalar(&w, &a.qs, &a.d, &a.sums);
                let got = unsafe { simd(&w, &a.qs, &a.d, &a.sums) };
                let tol = 1e-5 * want.abs().max(1e-3);
                assert!((got - want).abs() <= tol, "{ty} {cols}: {got} vs {want}");
            }
        }
    }
}
