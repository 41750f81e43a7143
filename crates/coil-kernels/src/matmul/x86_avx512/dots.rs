//! AVX-512 (F/BW/VL/DQ + VNNI) row · activation dot products.
//!
//! Quantized weights against quantized activations with integer dot
//! products: `vpdpbusd` (u8 × i8 → i32) where the weight values are
//! non-negative, `vpmaddubsw` + `vpdpwssd` where a per-group scale must be
//! applied in the integer domain (K-quants, IQ4_XS). Signed weight values
//! (Q8_0, IQ4_*) use the absolute value and move the sign onto the
//! activation.

use crate::matmul::scalar::dequant::{iq4xs_scales, KVALUES_IQ4NL};
use crate::matmul::scalar::vecdot;
use crate::matmul::x86_avx2::dots::f16c;
use coil_gguf::GgmlType;
use std::arch::x86_64::*;

/// Bytes ahead that the F16 / BF16 dot products prefetch (see AVX2's
/// `PF_BYTES_16`): lfm2-1.2b-like F16 decode was slower at this level than
/// at AVX2 with it.
pub(in crate::matmul) const PF_BYTES_16: usize = 1024;

macro_rules! float_dot {
    ($name:ident, $elt:expr, $load:expr, $scalar:path) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
        pub(in crate::matmul) unsafe fn $name(row: &[u8], x: &[f32]) -> f32 {
            let n = x.len();
            debug_assert!(row.len() >= $elt * n);
            let (w, xp) = (row.as_ptr(), x.as_ptr());
            let ld = $load;
            let mut a = [_mm512_setzero_ps(); 4];
            let mut i = 0;
            while i + 64 <= n {
                if $elt == 2 {
                    // F16 / BF16: the two lines of these 64 values, 1 KB
                    // ahead (as AVX2's dot_f16)
                    _mm_prefetch::<_MM_HINT_T0>(w.wrapping_add(2 * i + PF_BYTES_16) as *const i8);
                    _mm_prefetch::<_MM_HINT_T0>(
                        w.wrapping_add(2 * i + PF_BYTES_16 + 64) as *const i8
                    );
                    crate::matmul::x86_avx2::dots::prefetch_far(w.wrapping_add(2 * i), 128);
                }
                for (j, acc) in a.iter_mut().enumerate() {
                    let o = i + 16 * j;
                    *acc = _mm512_fmadd_ps(ld(w, o), _mm512_loadu_ps(xp.add(o)), *acc);
                }
                i += 64;
            }
            while i + 16 <= n {
                a[0] = _mm512_fmadd_ps(ld(w, i), _mm512_loadu_ps(xp.add(i)), a[0]);
                i += 16;
            }
            let s = _mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3]));
            let mut s = _mm512_reduce_add_ps(s);
            if i < n {
                s += $scalar(&row[$elt * i..], &x[i..]);
            }
            s
        }
    };
}

float_dot!(
    dot_f32,
    4,
    |w: *const u8, i: usize| _mm512_loadu_ps((w as *const f32).add(i)),
    vecdot::dot_f32_bytes
);
float_dot!(
    dot_f16,
    2,
    |w: *const u8, i: usize| _mm512_cvtph_ps(_mm256_loadu_si256(w.add(2 * i) as *const __m256i)),
    vecdot::dot_f16
);
float_dot!(
    dot_bf16,
    2,
    |w: *const u8, i: usize| {
        let h = _mm256_loadu_si256(w.add(2 * i) as *const __m256i);
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
    },
    vecdot::dot_bf16
);

#[inline(always)]
pub(in crate::matmul) unsafe fn rd16(p: *const u8) -> u16 {
    (p as *const u16).read_unaligned()
}

/// One token's quantized activations: values, block scales, group sums.
pub(in crate::matmul) type Act<'a> = (&'a [i8], &'a [f32], &'a [i16]);

#[inline(always)]
pub(in crate::matmul) unsafe fn hsum256(v: __m256) -> f32 {
    let m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_add_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

/// Constants of the 32-value block formats' steps (see [`dot_b32`]).
pub(in crate::matmul) struct B32 {
    x80: __m512i,
    m4: __m256i,
    /// IQ4_NL's table plus 128, in each 128-bit lane.
    tbl: __m512i,
    /// Byte offsets of 8 consecutive blocks (their scales, one gather).
    gidx: __m256i,
    /// The block of each half-block lane (see [`B32::spread`]).
    lane_blk: __m512i,
    /// `−OFFSET` of the format (the formats with a min: −1, see
    /// [`B32::offset16`]).
    noff: i32,
    /// Q5_0 / Q5_1: the fifth bit of a value.
    bit4: __m512i,
}

/// The lanes of the half-block sums that hold a block's first half (and
/// its offset term): lanes 0–3 and 8–11.
pub(in crate::matmul) const FIRST_HALVES: __mmask16 = 0x0F0F;

impl B32 {
    #[inline(always)]
    pub(in crate::matmul) unsafe fn new<const BYTES: usize, const KIND: u8>() -> B32 {
        let mut tblu = [0u8; 16];
        for (t, k) in tblu.iter_mut().zip(KVALUES_IQ4NL) {
            *t = (k as i16 + 128) as u8;
        }
        B32 {
            x80: _mm512_set1_epi8(-128),
            m4: _mm256_set1_epi8(0xF),
            tbl: _mm512_broadcast_i32x4(_mm_loadu_si128(tblu.as_ptr() as *const __m128i)),
            gidx: _mm256_mullo_epi32(
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                _mm256_set1_epi32(BYTES as i32),
            ),
            lane_blk: _mm512_setr_epi32(0, 2, 4, 6, 0, 2, 4, 6, 1, 3, 5, 7, 1, 3, 5, 7),
            noff: if b32_min(KIND) {
                -1
            } else {
                -(b32_offset(KIND) as i32)
            },
            bit4: _mm512_set1_epi8(0x10),
        }
    }

    /// 8 per-block values (lanes 0..8) spread over the 16 half-block lanes:
    /// lane `4j + k` holds block `2k + j/2`'s (the layout of
    /// [`B32::halves`] and [`transpose4`]).
    #[inline(always)]
    pub(in crate::matmul) unsafe fn spread(&self, v8: __m256) -> __m512 {
        _mm512_permutexvar_ps(self.lane_blk, _mm512_zextps256_ps512(v8))
    }

    /// The offset term `−OFFSET · Σx` of 8 blocks (`xs8` their activation
    /// sums) in the lanes of their first halves, 0 in the others (Q4_1,
    /// Q5_1: `−Σx`, for [`B32::min_term`]).
    #[inline(always)]
    pub(in crate::matmul) unsafe fn offset16(&self, xs8: __m256i) -> __m512i {
        let o8 = _mm256_mullo_epi32(xs8, _mm256_set1_epi32(self.noff));
        _mm512_maskz_permutexvar_epi32(FIRST_HALVES, self.lane_blk, _mm512_zextsi256_si512(o8))
    }

    /// The exact integer dot of each of 8 blocks' 16 half-blocks, lane
    /// `4j + k` the half-block of values `64k + 16j ..` (block `2k + j/2`):
    /// from the products of the 4 steps in natural order (`d[k]` step k's
    /// `vpdpbusd` lanes), summed 4 lanes at a time. The few-token tiles get
    /// the same sums from steps transposed beforehand ([`transpose4`]).
    #[inline(always)]
    pub(in crate::matmul) unsafe fn halves(d: [__m512i; 4]) -> __m512i {
        let a0 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(d[0], d[1]),
            _mm512_unpackhi_epi32(d[0], d[1]),
        );
        let a1 = _mm512_add_epi32(
            _mm512_unpacklo_epi32(d[2], d[3]),
            _mm512_unpackhi_epi32(d[2], d[3]),
        );
        _mm512_add_epi32(_mm512_unpacklo_epi64(a0, a1), _mm512_unpackhi_epi64(a0, a1))
    }

    /// `acc += f32(sums) · s16` for one token and 8 blocks: `sums` its exact
    /// half-block integer dots with the offset term added, `s16` the blocks'
    /// scales `d·xd` spread ([`B32::spread`]). The one float step per 8
    /// blocks and token, the same in the one-token kernel and the tiles
    /// (the integer sums are exact in any order, so both give each token's
    /// result bit for bit). The sums stay below 2^24 (16 · 255 · 127 plus
    /// 128 · 32 · 127), so the conversion is exact.
    #[inline(always)]
    pub(in crate::matmul) unsafe fn finish(sums: __m512i, s16: __m512, acc: &mut __m512) {
        *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums), s16, *acc);
    }

    /// Q4_1 / Q5_1: `acc += Σx · m·xd` for one token and 8 blocks (each
    /// block's `m·xd·Σxq` of `w = d·q + m`): `nxs` the blocks' `−Σx` in the
    /// lanes of their first halves, 0 in the others ([`B32::offset16`]),
    /// `mx16` their `m·xd` spread. The float step after [`B32::finish`],
    /// the same in the one-token kernel and the tiles (`Σx` converts
    /// exactly).
    #[inline(always)]
    pub(in crate::matmul) unsafe fn min_term(nxs: __m512i, mx16: __m512, acc: &mut __m512) {
        *acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(nxs), mx16, *acc);
    }

    /// The scales of the 8 blocks at `base`.
    #[inline(always)]
    pub(in crate::matmul) unsafe fn d8(&self, base: *const u8) -> __m256 {
        let dbits = _mm256_i32gather_epi32::<1>(base as *const i32, self.gidx);
        _mm256_cvtph_ps(_mm256_cvtepi32_epi16(dbits))
    }

    /// Q4_1 / Q5_1: the mins of the 8 blocks at `base`.
    #[inline(always)]
    pub(in crate::matmul) unsafe fn m8(&self, base: *const u8) -> __m256 {
        self.d8(base.add(2))
    }

    /// Step `k` of the 8 blocks at `base`: blocks `2k`, `2k + 1` as 64
    /// unsigned values (`w + OFFSET`).
    #[inline(always)]
    pub(in crate::matmul) unsafe fn step<const BYTES: usize, const KIND: u8>(
        &self,
        base: *const u8,
        k: usize,
    ) -> __m512i {
        let b0 = base.add(BYTES * 2 * k);
        let b1 = b0.add(BYTES);
        if KIND == 0 {
            let wv = _mm512_inserti64x4(
                _mm512_castsi256_si512(_mm256_loadu_si256(b0.add(2) as *const __m256i)),
                _mm256_loadu_si256(b1.add(2) as *const __m256i),
                1,
            );
            _mm512_xor_si512(wv, self.x80)
        } else {
            let qs = b32_qs(KIND);
            let q = _mm256_loadu2_m128i(b1.add(qs) as *const __m128i, b0.add(qs) as *const __m128i);
            let lo = _mm256_and_si256(q, self.m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), self.m4);
            let tt = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            // values 0..32 of block 2k, then of block 2k + 1
            let nib = _mm512_shuffle_i64x2(tt, tt, 0b11_01_10_00);
            if KIND == 2 {
                _mm512_shuffle_epi8(self.tbl, nib)
            } else if b32_fifth(KIND) {
                // bit v of a block's `qh` word: value v's fifth bit
                let qh = if KIND == 5 { 4 } else { 2 };
                let h0 = (b0.add(qh) as *const u32).read_unaligned() as u64;
                let h1 = (b1.add(qh) as *const u32).read_unaligned() as u64;
                _mm512_mask_add_epi8(nib, h0 | h1 << 32, nib, self.bit4)
            } else {
                nib
            }
        }
    }
}

/// 4 × 4 transposes of dwords inside each 128-bit lane: `out[c]` lane
/// `4j + k` = `v[k]` lane `4j + c`. Applied to a group's 4 steps of
/// weights and of activations, `Σ_c vpdpbusd(out_w[c], out_x[c])` is
/// [`B32::halves`] of their products.
#[inline(always)]
pub(in crate::matmul) unsafe fn transpose4(v: [__m512i; 4]) -> [__m512i; 4] {
    let t0 = _mm512_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm512_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm512_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm512_unpackhi_epi32(v[2], v[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// The weight offset of a 32-value block format (`KIND` as in [`dot_b32`]):
/// `w = d · (u − OFFSET)` with `u` unsigned, 0 for the formats with a min.
pub(in crate::matmul) const fn b32_offset(kind: u8) -> f32 {
    match kind {
        1 => 8.0,
        3 => 16.0,
        4 | 5 => 0.0,
        _ => 128.0,
    }
}

/// Where a 32-value block's values start: after `d` (Q4_1, Q5_1: and the
/// min `m`; Q5_0, Q5_1: and the 32 fifth bits).
pub(in crate::matmul) const fn b32_qs(kind: u8) -> usize {
    match kind {
        3 => 6,
        4 => 4,
        5 => 8,
        _ => 2,
    }
}

/// Q5_0 / Q5_1: 5-bit values, their fifth bits in a word of their own.
pub(in crate::matmul) const fn b32_fifth(kind: u8) -> bool {
    kind == 3 || kind == 5
}

/// Q4_1 / Q5_1: `w = d · u + m`, a min `m` per block.
pub(in crate::matmul) const fn b32_min(kind: u8) -> bool {
    kind == 4 || kind == 5
}

/// Shared body of the 32-value block formats (`KIND` 0 Q8_0, 1 Q4_0,
/// 2 IQ4_NL, 3 Q5_0, 4 Q4_1, 5 Q5_1) against Q8_0-style activations of
/// `NT` tokens, 8 blocks per step.
///
/// Weight values are made unsigned (`u = w + OFFSET`) for `vpdpbusd`; the
/// offset is removed with the activation block sums:
/// `sum (u - OFFSET)·x = dot(u, x) - OFFSET·sum(x)`. Q4_1 and Q5_1 (`w =
/// d·u + m`) add `m·xd·Σx` per block instead ([`B32::min_term`]). The 8
/// block scales (and mins) are fetched with one gather and converted
/// together. Weights are unpacked once for all `NT` tokens.
///
/// Per token one accumulator of 16 half-block lanes: per 8 blocks their
/// exact integer dots with the offset term ([`B32::halves`],
/// [`B32::offset16`]), one conversion and FMA ([`B32::finish`]), and for
/// the formats with a min a second FMA ([`B32::min_term`]). The few-token
/// tiles (`tiles::rows_b32`) repeat these float operations exactly, token
/// by token.
#[inline(always)]
pub(in crate::matmul) unsafe fn dot_b32<
    const BYTES: usize,
    const KIND: u8,
    const PF: usize,
    const NT: usize,
>(
    row: &[u8],
    xa: [Act; NT],
) -> [f32; NT] {
    let nb = xa[0].1.len();
    let w = row.as_ptr();
    let c = B32::new::<BYTES, KIND>();
    let mut acc = [_mm512_setzero_ps(); NT];
    let mut i = 0;
    while i + 8 <= nb {
        let base = w.add(BYTES * i);
        prefetch_ahead::<PF>(base, 8 * BYTES);
        let d8 = c.d8(base);
        let m8 = if b32_min(KIND) { c.m8(base) } else { d8 };
        let wu: [__m512i; 4] = std::array::from_fn(|k| c.step::<BYTES, KIND>(base, k));
        for t in 0..NT {
            let (q, xd, xs) = xa[t];
            let d: [__m512i; 4] = std::array::from_fn(|k| {
                let xv = _mm512_loadu_si512(q.as_ptr().add(32 * (i + 2 * k)) as *const _);
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), wu[k], xv)
            });
            let xs8 = _mm256_cvtepi16_epi32(_mm_loadu_si128(xs.as_ptr().add(i) as *const __m128i));
            let xd8 = _mm256_loadu_ps(xd.as_ptr().add(i));
            let s16 = c.spread(_mm256_mul_ps(d8, xd8));
            if b32_min(KIND) {
                B32::finish(B32::halves(d), s16, &mut acc[t]);
                B32::min_term(
                    c.offset16(xs8),
                    c.spread(_mm256_mul_ps(m8, xd8)),
                    &mut acc[t],
                );
            } else {
                let sums = _mm512_add_epi32(B32::halves(d), c.offset16(xs8));
                B32::finish(sums, s16, &mut acc[t]);
            }
        }
        i += 8;
    }
    let mut out = [0f32; NT];
    for t in 0..NT {
        out[t] = _mm512_reduce_add_ps(acc[t]);
        if i < nb {
            let (q, d, xs) = xa[t];
            // the last nb % 8 blocks (all of a row shorter than 256
            // values: a small MoE's expert projections) with AVX2's dot
            let (q, d, xs) = (&q[32 * i..], &d[i..], &xs[i..]);
            debug_assert!(row.len() >= BYTES * nb && q.len() >= 32 * d.len());
            let wt = w.add(BYTES * i);
            use crate::matmul::x86_avx2::legacy::dot as legacy;
            out[t] += match KIND {
                3 => legacy::<BYTES, false, true, 0>(wt, q, d, xs),
                4 => legacy::<BYTES, true, false, 0>(wt, q, d, xs),
                5 => legacy::<BYTES, true, true, 0>(wt, q, d, xs),
                _ => crate::matmul::x86_avx2::dots::dot_b32::<BYTES, KIND, 0>(wt, q, d, xs),
            };
        }
    }
    out
}

/// i16 lane-index vector `[a x16 | b x16]`.
#[inline(always)]
pub(in crate::matmul) unsafe fn idx_pair(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_set1_epi16(a)),
        _mm256_set1_epi16(b),
        1,
    )
}

/// Q4_K / Q5_K: 8 scales and 8 mins (6-bit) as bytes `[sc0..7, m0..7]`.
#[inline(always)]
pub(in crate::matmul) unsafe fn k4_scales_mins(sc: *const u8) -> __m128i {
    const KMASK1: u32 = 0x3f3f_3f3f;
    const KMASK2: u32 = 0x0f0f_0f0f;
    const KMASK3: u32 = 0x0303_0303;
    let u0 = (sc as *const u32).read_unaligned();
    let u1 = (sc.add(4) as *const u32).read_unaligned();
    let u2 = (sc.add(8) as *const u32).read_unaligned();
    let m_hi = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let s_hi = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let m_lo = u1 & KMASK1;
    let s_lo = u0 & KMASK1;
    _mm_set_epi32(m_hi as i32, m_lo as i32, s_hi as i32, s_lo as i32)
}

/// Step `j` (values `64j..64j + 64`) of a Q4_K/Q5_K block whose packed
/// nibbles start at `qs`: `[low nibbles | high nibbles]` as one vector, with
/// Q5_K's fifth bits taken from `hbits` (the block's `qh`, shifted on by two
/// bits per step).
#[inline(always)]
pub(in crate::matmul) unsafe fn k45_step<const HIGH: bool>(
    qs: *const u8,
    j: usize,
    hbits: &mut __m256i,
) -> __m512i {
    let m4 = _mm256_set1_epi8(0xF);
    let q = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
    let mut lo = _mm256_and_si256(q, m4);
    let mut hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
    if HIGH {
        let bit4 = _mm256_set1_epi8(0x10);
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16(*hbits, 4), bit4));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16(*hbits, 3), bit4));
        *hbits = _mm256_srli_epi16(*hbits, 2);
    }
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// Word-lane indices of the scales for [`pair_dot`]'s packed sums: in
/// 128-bit lane `L`, words 0–3 hold sums of the first vector's i32 lanes
/// `4L..4L + 4`, words 4–7 the second's; word `(L, k)` takes scale
/// `group(L, k ≥ 4)`.
#[inline(always)]
pub(in crate::matmul) unsafe fn pair_idx(group: impl Fn(usize, bool) -> usize) -> __m512i {
    let lanes: [i16; 32] = std::array::from_fn(|w| group(w / 8, w % 8 >= 4) as i16);
    _mm512_loadu_si512(lanes.as_ptr() as *const _)
}

/// [`pair_idx`] for steps `2p` and `2p + 1` of a Q4_K/Q5_K block: a
/// step's i32 lanes 0–7 (128-bit lanes 0–1) are its first 32 values, group
/// `2·step`, lanes 8–15 the next; `sm` has the eight scales in words 0–7.
#[inline(always)]
pub(in crate::matmul) unsafe fn k45_pair_idx(p: usize) -> __m512i {
    pair_idx(|l, second| 2 * (2 * p + usize::from(second)) + usize::from(l >= 2))
}

/// Two 64-value vectors of small unsigned weights (a K-quant block's
/// steps) against one token: `vpdpbusd` sums four products per i32 lane (at
/// most 4·63·127, an i16), the two vectors' sums packed to i16 side by side
/// (`vpackssdw`, exact) and one `vpdpwssd` by their scales `sc` (see
/// [`k45_pair_idx`], [`q6k_pair_idx`]) adds them to `acc`: three
/// instructions on the integer-multiply port per 128 values where
/// `vpmaddubsw` + `vpdpwssd` per vector took four (the pack runs on the
/// shuffle port). The integers are exact; how they spread over the lanes
/// is this function's, shared by the one-token kernels and the tiles.
#[inline(always)]
pub(in crate::matmul) unsafe fn pair_dot(
    acc: __m512i,
    wa: __m512i,
    wb: __m512i,
    xa: __m512i,
    xb: __m512i,
    sc: __m512i,
) -> __m512i {
    let va = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wa, xa);
    let vb = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wb, xb);
    _mm512_dpwssd_epi32(acc, _mm512_packs_epi32(va, vb), sc)
}

/// Half `n` (values `128n..128n + 128`) of the Q6_K block at `b`: its 6-bit
/// values (stored plus 32) as `[values 0..64, values 64..128]`.
#[inline(always)]
pub(in crate::matmul) unsafe fn q6k_half(b: *const u8, n: usize) -> [__m512i; 2] {
    let m4 = _mm512_set1_epi8(0xF);
    let m3 = _mm256_set1_epi8(3);
    let l = _mm512_loadu_si512(b.add(64 * n) as *const _);
    let h = _mm256_loadu_si256(b.add(128 + 32 * n) as *const __m256i);
    let h12 = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_and_si256(h, m3)),
        _mm256_and_si256(_mm256_srli_epi16(h, 2), m3),
        1,
    );
    let h34 = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3)),
        _mm256_and_si256(_mm256_srli_epi16(h, 6), m3),
        1,
    );
    [
        _mm512_or_si512(_mm512_and_si512(l, m4), _mm512_slli_epi16(h12, 4)),
        _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16(l, 4), m4),
            _mm512_slli_epi16(h34, 4),
        ),
    ]
}

/// [`pair_idx`] for Q6_K's vectors `2n` and `2n + 1` (values
/// `128n..128n + 128`, scales in words 0–15 of `sc`): a vector's i32 lanes
/// `4L..4L + 4` lie in its 16-value group `L`.
#[inline(always)]
pub(in crate::matmul) unsafe fn q6k_pair_idx(n: usize) -> __m512i {
    pair_idx(|l, second| 4 * (2 * n + usize::from(second)) + l)
}

/// Shared body of Q4_K and Q5_K (`HIGH` adds the fifth bit from `qh`) for
/// `NT` tokens of Q8_K-style activations.
#[inline(always)]
pub(in crate::matmul) unsafe fn dot_k45<const HIGH: bool, const PF: usize, const NT: usize>(
    row: &[u8],
    xa: [Act; NT],
) -> [f32; NT] {
    let nb = xa[0].1.len();
    let bsz = if HIGH { 176 } else { 144 };
    let idx = [k45_pair_idx(0), k45_pair_idx(1)];
    // mins duplicated per pair of 16-sums: lanes 8,8,9,9,..,15,15
    let idx_m = _mm512_castsi256_si512(_mm256_setr_epi16(
        8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14, 15, 15,
    ));
    let mut facc = [_mm512_setzero_ps(); NT];
    let mut macc = [_mm256_setzero_ps(); NT];
    for i in 0..nb {
        let b = row.as_ptr().add(bsz * i);
        prefetch_ahead::<PF>(b, bsz);
        let dd = _mm_cvtph_ps(_mm_cvtsi32_si128((b as *const i32).read_unaligned()));
        let sm = _mm512_cvtepu8_epi16(_mm256_zextsi128_si256(k4_scales_mins(b.add(4))));
        let qs = b.add(if HIGH { 48 } else { 16 });
        let mut hbits = if HIGH {
            _mm256_loadu_si256(b.add(16) as *const __m256i)
        } else {
            _mm256_setzero_si256()
        };
        let mut iacc = [_mm512_setzero_si512(); NT];
        for (p, ix) in idx.iter().enumerate() {
            let wa = k45_step::<HIGH>(qs, 2 * p, &mut hbits);
            let wb = k45_step::<HIGH>(qs, 2 * p + 1, &mut hbits);
            let sc = _mm512_permutexvar_epi16(*ix, sm);
            for t in 0..NT {
                let x = xa[t].0.as_ptr().add(256 * i + 128 * p);
                let xv = _mm512_loadu_si512(x as *const _);
                let xw = _mm512_loadu_si512(x.add(64) as *const _);
                iacc[t] = pair_dot(iacc[t], wa, wb, xv, xw, sc);
            }
        }
        let mins = _mm512_castsi512_si256(_mm512_permutexvar_epi16(idx_m, sm));
        for t in 0..NT {
            let (_, xd, xs) = xa[t];
            let dxd = _mm_mul_ps(dd, _mm_set1_ps(xd[i])); // [d*xd, dmin*xd]
            facc[t] = _mm512_fmadd_ps(
                _mm512_cvtepi32_ps(iacc[t]),
                _mm512_broadcastss_ps(dxd),
                facc[t],
            );
            let bs = _mm256_loadu_si256(xs.as_ptr().add(16 * i) as *const __m256i);
            let mprod = _mm256_madd_epi16(mins, bs);
            let dmin = _mm256_broadcastss_ps(_mm_movehdup_ps(dxd));
            macc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mprod), dmin, macc[t]);
        }
    }
    let mut out = [0f32; NT];
    for t in 0..NT {
        out[t] = _mm512_reduce_add_ps(facc[t]) - hsum256(macc[t]);
    }
    out
}

#[inline(always)]
pub(in crate::matmul) unsafe fn dot_q6k<const PF: usize, const NT: usize>(
    row: &[u8],
    xa: [Act; NT],
) -> [f32; NT] {
    let nb = xa[0].1.len();
    let idx = [q6k_pair_idx(0), q6k_pair_idx(1)];
    let mut facc = [_mm512_setzero_ps(); NT];
    for i in 0..nb {
        let b = row.as_ptr().add(210 * i);
        prefetch_ahead::<PF>(b, 210);
        let d = f16c(rd16(b.add(208)));
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(192) as *const __m128i));
        let sc = _mm512_castsi256_si512(sc16);
        let mut iacc = [_mm512_setzero_si512(); NT];
        for (n, ix) in idx.iter().enumerate() {
            let [q12, q34] = q6k_half(b, n);
            let s = _mm512_permutexvar_epi16(*ix, sc);
            for t in 0..NT {
                let x = xa[t].0.as_ptr().add(256 * i + 128 * n);
                let x12 = _mm512_loadu_si512(x as *const _);
                let x34 = _mm512_loadu_si512(x.add(64) as *const _);
                iacc[t] = pair_dot(iacc[t], q12, q34, x12, x34, s);
            }
        }
        for t in 0..NT {
            let (_, xd, xs) = xa[t];
            let bs = _mm256_loadu_si256(xs.as_ptr().add(16 * i) as *const __m256i);
            let ia = q6k_offset(iacc[t], sc16, bs);
            let dv = d * xd[i];
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ia), _mm512_set1_ps(dv), facc[t]);
        }
    }
    let mut out = [0f32; NT];
    for t in 0..NT {
        out[t] = _mm512_reduce_add_ps(facc[t]);
    }
    out
}

/// Q6_K's values are stored plus 32: removes `32 * sum_g sc_g * bsum_g`
/// (`sc16` the block's sixteen scales, `bs` the token's sixteen group sums)
/// from a block's integer sums, in the low eight lanes; exact.
#[inline(always)]
pub(in crate::matmul) unsafe fn q6k_offset(iacc: __m512i, sc16: __m256i, bs: __m256i) -> __m512i {
    let corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5);
    _mm512_sub_epi32(iacc, _mm512_zextsi256_si512(corr))
}

#[inline(always)]
pub(in crate::matmul) unsafe fn dot_iq4xs<const NT: usize>(row: &[u8], xa: [Act; NT]) -> [f32; NT] {
    let nb = xa[0].1.len();
    let mut abs = [0u8; 16];
    for (a, k) in abs.iter_mut().zip(KVALUES_IQ4NL) {
        *a = k.unsigned_abs();
    }
    let tbl = _mm512_broadcast_i32x4(_mm_loadu_si128(abs.as_ptr() as *const __m128i));
    let eight = _mm512_set1_epi8(8);
    let m4 = _mm256_set1_epi8(0xF);
    let idx = [
        idx_pair(0, 1),
        idx_pair(2, 3),
        idx_pair(4, 5),
        idx_pair(6, 7),
    ];
    let mut facc = [_mm512_setzero_ps(); NT];
    for i in 0..nb {
        let b = row.as_ptr().add(136 * i);
        // 8 six-bit scales: low nibbles from bytes 4..8, high 2 bits from the u16 at 2.
        let sl = (b.add(4) as *const u32).read_unaligned() as u64;
        let sh = rd16(b.add(2)) as u64;
        let ls8 = _pdep_u64(sl, 0x0F0F_0F0F_0F0F_0F0F) | _pdep_u64(sh, 0x3030_3030_3030_3030);
        let ls8 = _mm_sub_epi8(_mm_cvtsi64_si128(ls8 as i64), _mm_set1_epi8(32));
        let ls16 = _mm512_castsi128_si512(_mm_cvtepi8_epi16(ls8));
        let mut iacc = [_mm512_setzero_si512(); NT];
        for k in 0..4 {
            let q = _mm256_loadu_si256(b.add(8 + 32 * k) as *const __m256i);
            let lo = _mm256_and_si256(q, m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m4);
            let tt = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
            let nib = _mm512_shuffle_i64x2(tt, tt, 0b11_01_10_00);
            // |kvalue| as u8; the sign moves onto the activation
            let v = _mm512_shuffle_epi8(tbl, nib);
            let neg = _mm512_cmplt_epu8_mask(nib, eight);
            let sc = _mm512_permutexvar_epi16(idx[k], ls16);
            for t in 0..NT {
                let xv = _mm512_loadu_si512(xa[t].0.as_ptr().add(256 * i + 64 * k) as *const _);
                let sx = _mm512_mask_sub_epi8(xv, neg, _mm512_setzero_si512(), xv);
                iacc[t] = _mm512_dpwssd_epi32(iacc[t], _mm512_maddubs_epi16(v, sx), sc);
            }
        }
        let d = f16c(rd16(b));
        for t in 0..NT {
            let dv = d * xa[t].1[i];
            facc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[t]), _mm512_set1_ps(dv), facc[t]);
        }
    }
    let mut out = [0f32; NT];
    for t in 0..NT {
        out[t] = _mm512_reduce_add_ps(facc[t]);
    }
    out
}

/// Entry points: one token (`dot_*`) and four tokens (`dot4_*`).
macro_rules! entries {
    ($one:ident, $four:ident, $body:ident $(, $c:expr)*) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
        pub(in crate::matmul) unsafe fn $one(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
            $body::<$($c,)* 1>(row, [(xq, xd, xs)])[0]
        }
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
        pub(in crate::matmul) unsafe fn $four(row: &[u8], xq: [&[i8]; 4], xd: [&[f32]; 4], xs: [&[i16]; 4]) -> [f32; 4] {
            $body::<$($c,)* 4>(row, [0, 1, 2, 3].map(|t| (xq[t], xd[t], xs[t])))
        }
    };
}

/// Row-range entry points (one token): the single-row body inlined in a
/// loop, so its constants are set up once per range.
macro_rules! rows_entry {
    ($name:ident, $body:ident $(, $c:expr)*) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
        pub(in crate::matmul) unsafe fn $name(w: &[u8], rb: usize, xq: &[i8], xd: &[f32], xs: &[i16], out: &mut [f32]) {
            let n = out.len();
            debug_assert!(w.len() >= n * rb);
            let pf = |r: usize| {
                let mut off = 0;
                while off < rb {
                    _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(r * rb + off) as *const i8);
                    off += 64;
                }
            };
            let pfr = crate::matmul::kernel::pf_rows(rb);
            for r in 0..pfr.min(n) {
                pf(r);
            }
            for (r, o) in out.iter_mut().enumerate() {
                if r + pfr < n {
                    pf(r + pfr);
                }
                *o = $body::<$($c,)* 1>(&w[r * rb..(r + 1) * rb], [(xq, xd, xs)])[0];
            }
        }
    };
}

/// One-token rows of a K-quant or a 32-value format: consecutive rows walked in order, each
/// block prefetching the block `PF_STREAM` bytes ahead (as at AVX2: a
/// steady stream instead of whole rows in bursts at each row start).
macro_rules! rows_stream {
    ($name:ident, $body:ident $(, $c:expr)*) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
        pub(in crate::matmul) unsafe fn $name(w: &[u8], rb: usize, xq: &[i8], xd: &[f32], xs: &[i16], out: &mut [f32]) {
            assert!(w.len() >= out.len() * rb);
            for (r, o) in out.iter_mut().enumerate() {
                *o = $body::<$($c,)* { crate::matmul::x86_avx2::dots::PF_STREAM }, 1>(
                    &w[r * rb..(r + 1) * rb],
                    [(xq, xd, xs)],
                )[0];
            }
        }
    };
}
rows_stream!(rows_q8_0, dot_b32, 34, 0);
rows_stream!(rows_q4_0, dot_b32, 18, 1);
rows_stream!(rows_iq4_nl, dot_b32, 18, 2);
rows_stream!(rows_q5_0, dot_b32, 22, 3);
rows_stream!(rows_q4_1, dot_b32, 20, 4);
rows_stream!(rows_q5_1, dot_b32, 24, 5);
rows_stream!(rows_q4_k, dot_k45, false);
rows_stream!(rows_q5_k, dot_k45, true);
rows_stream!(rows_q6_k, dot_q6k);

/// Prefetches the lines of the `bytes`-byte block `PF` bytes past `b`, and
/// again `PF_FAR` past it into L2 (`PF` = 0: nothing).
#[inline(always)]
pub(in crate::matmul) unsafe fn prefetch_ahead<const PF: usize>(b: *const u8, bytes: usize) {
    if PF > 0 {
        let p = b.wrapping_add(PF);
        let mut off = 0;
        while off < bytes {
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(off) as *const i8);
            off += 64;
        }
        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(bytes - 1) as *const i8);
        crate::matmul::x86_avx2::dots::prefetch_far(b, bytes);
    }
}
rows_entry!(rows_iq4_xs, dot_iq4xs);

/// Whether the one-token Q4_K and Q6_K rows-in-lanes kernels prefetch
/// ahead of the weights they stream ([`prefetch_part`]): not where 512-bit
/// operations run as halves ([`crate::simd::split_512`], AMD Zen 4), where
/// the hardware prefetchers alone keep more of the stream in flight
/// (weights in huge pages; AMD EPYC Zen 4, 2 threads, `probe` with
/// `PROBE_HUGE=1`, best of 10, alternating runs: Q4_K 65536 x 2048 one
/// token, median 2.02 → 1.69 ms; Q6_K 248320 x 1024 7.3–9.2 → 6.1–6.8 ms,
/// level with the file's rows then; `scripts/ab-env.sh` decode, tg128:
/// lfm2-1.2b-like Q4_K_M median +10% over 16 rounds, qwen35-0.8b-like
/// +7%, mamba2-370m-like +5%, lfm2 Q8_0's lanes no different, the
/// row-at-a-time kernels 10% slower without theirs). Elsewhere they do
/// (measured on an Intel Xeon with the weights in huge pages, see
/// [`prefetch_part`]). `COIL_LANES_PREFETCH=0` / `1` overrides.
pub(in crate::matmul) fn one_token_prefetch() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| {
        match std::env::var("COIL_LANES_PREFETCH")
            .as_deref()
            .map(str::trim)
        {
            Ok("0") => false,
            Ok("1") => true,
            _ => !crate::simd::split_512(),
        }
    })
}

/// Part `k` of `parts` of [`prefetch_ahead`]'s lines (near and far), for
/// kernels that spend long on each block (several tokens at once): the
/// requests spread over the block's work instead of one burst at its start,
/// which stalls on the core's fill buffers with no work beside the wait
/// (perf put 45–52% of the rows-in-lanes tiles' samples on their prefetch
/// instructions at 8 tokens). Kernel bench, 2 threads, Intel model 167,
/// weights streamed, weight GB/s at 2 / 4 / 8 tokens, interleaved runs:
/// Q4_K 18–20 / 15–18 / 11–12 → 20–23 / 18–20 / 14–15, Q6_K 20–23 / 17–20
/// / 14–16 → 21–25 / 18–22 / 15–18. One token kept the burst (spread, it
/// fell from 68% to 57% of the read bandwidth) until the weights moved into
/// huge pages; with them the spread requests are the faster at one token
/// too (kernel bench, 2 threads: Q4_K 22.6–26.6 → 26.7–30.0 GB/s, Q6_K
/// 25.9–27.9 → 28.1–30.7).
#[inline(always)]
pub(in crate::matmul) unsafe fn prefetch_part<const PF: usize>(
    b: *const u8,
    bytes: usize,
    k: usize,
    parts: usize,
) {
    let lines = bytes.div_ceil(64);
    for l in lines * k / parts..lines * (k + 1) / parts {
        _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(PF + 64 * l) as *const i8);
        _mm_prefetch::<_MM_HINT_T1>(
            b.wrapping_add(crate::matmul::x86_avx2::dots::PF_FAR + 64 * l) as *const i8,
        );
    }
}

entries!(dot_q8_0, dot4_q8_0, dot_b32, 34, 0, 0);
entries!(dot_q4_0, dot4_q4_0, dot_b32, 18, 1, 0);
entries!(dot_iq4_nl, dot4_iq4_nl, dot_b32, 18, 2, 0);
entries!(dot_q5_0, dot4_q5_0, dot_b32, 22, 3, 0);
entries!(dot_q4_1, dot4_q4_1, dot_b32, 20, 4, 0);
entries!(dot_q5_1, dot4_q5_1, dot_b32, 24, 5, 0);
entries!(dot_q4_k, dot4_q4_k, dot_k45, false, 0);
entries!(dot_q5_k, dot4_q5_k, dot_k45, true, 0);
entries!(dot_q6_k, dot4_q6_k, dot_q6k, 0);
entries!(dot_iq4_xs, dot4_iq4_xs, dot_iq4xs);

/// AVX-512 decoding to f32 for the GEMM path; false = not handled here.
pub(in crate::matmul) fn decode(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> bool {
    // SAFETY: called only at the AVX-512 level; whole blocks (checked by the caller).
    unsafe {
        match ty {
            GgmlType::Q4_K => decode_k45::<false>(src, dst),
            GgmlType::Q5_K => decode_k45::<true>(src, dst),
            GgmlType::Q6_K => decode_q6_k(src, dst),
            GgmlType::Q4_0 => decode_q4_0_nl::<false>(src, dst),
            GgmlType::IQ4_NL => decode_q4_0_nl::<true>(src, dst),
            GgmlType::IQ4_XS => decode_iq4_xs(src, dst),
            GgmlType::F16 => decode_f16(src, dst),
            GgmlType::BF16 => decode_bf16(src, dst),
            GgmlType::Q8_0 => decode_q8_0(src, dst),
            GgmlType::Q2_K => decode_q2_k(src, dst),
            GgmlType::Q3_K => decode_q3_k(src, dst),
            GgmlType::Q4_1 => decode_q4_1(src, dst),
            GgmlType::Q5_0 => decode_q5::<false>(src, dst),
            GgmlType::Q5_1 => decode_q5::<true>(src, dst),
            _ => return false,
        }
    }
    true
}

/// 16 u8 → 16 f32.
#[inline(always)]
pub(in crate::matmul) unsafe fn u8x16_ps(v: __m128i) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v))
}

/// 16 i8 → 16 f32.
#[inline(always)]
pub(in crate::matmul) unsafe fn i8x16_ps(v: __m128i) -> __m512 {
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v))
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_k45<const HIGH: bool>(src: &[u8], dst: &mut [f32]) {
    let bsz = if HIGH { 176 } else { 144 };
    let m4 = _mm_set1_epi8(0xF);
    let bit4 = _mm_set1_epi8(0x10);
    for (bi, y) in dst.chunks_exact_mut(256).enumerate() {
        let b = src.as_ptr().add(bsz * bi);
        let d = f16c(rd16(b));
        let dmin = f16c(rd16(b.add(2)));
        let mut sm = [0u8; 16];
        _mm_storeu_si128(sm.as_mut_ptr() as *mut __m128i, k4_scales_mins(b.add(4)));
        let qs = b.add(if HIGH { 48 } else { 16 });
        let yp = y.as_mut_ptr();
        for h in 0..2 {
            let mut hb = if HIGH {
                _mm_loadu_si128(b.add(16 + 16 * h) as *const __m128i)
            } else {
                _mm_setzero_si128()
            };
            for j in 0..4 {
                let (d1, m1) = (
                    _mm512_set1_ps(d * sm[2 * j] as f32),
                    _mm512_set1_ps(dmin * sm[8 + 2 * j] as f32),
                );
                let (d2, m2) = (
                    _mm512_set1_ps(d * sm[2 * j + 1] as f32),
                    _mm512_set1_ps(dmin * sm[8 + 2 * j + 1] as f32),
                );
                let q = _mm_loadu_si128(qs.add(32 * j + 16 * h) as *const __m128i);
                let mut lo = _mm_and_si128(q, m4);
                let mut hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
                if HIGH {
                    lo = _mm_or_si128(lo, _mm_and_si128(_mm_slli_epi16(hb, 4), bit4));
                    hi = _mm_or_si128(hi, _mm_and_si128(_mm_slli_epi16(hb, 3), bit4));
                    hb = _mm_srli_epi16(hb, 2);
                }
                _mm512_storeu_ps(
                    yp.add(64 * j + 16 * h),
                    _mm512_fmsub_ps(u8x16_ps(lo), d1, m1),
                );
                _mm512_storeu_ps(
                    yp.add(64 * j + 32 + 16 * h),
                    _mm512_fmsub_ps(u8x16_ps(hi), d2, m2),
                );
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_q6_k(src: &[u8], dst: &mut [f32]) {
    let m4 = _mm_set1_epi8(0xF);
    let m3 = _mm_set1_epi8(3);
    let off = _mm_set1_epi8(32);
    for (bi, y) in dst.chunks_exact_mut(256).enumerate() {
        let b = src.as_ptr().add(210 * bi);
        let d = f16c(rd16(b.add(208)));
        let yp = y.as_mut_ptr();
        for n in 0..2 {
            let ql = b.add(64 * n);
            let qh = b.add(128 + 32 * n);
            let sc = b.add(192 + 8 * n) as *const i8;
            for l in [0usize, 16] {
                let is = l / 16;
                let a = _mm_loadu_si128(ql.add(l) as *const __m128i);
                let c = _mm_loadu_si128(ql.add(l + 32) as *const __m128i);
                let h = _mm_loadu_si128(qh.add(l) as *const __m128i);
                let hb = |s: i32| match s {
                    0 => _mm_slli_epi16(_mm_and_si128(h, m3), 4),
                    2 => _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 2), m3), 4),
                    4 => _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 4), m3), 4),
                    _ => _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 6), m3), 4),
                };
                let q1 = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(a, m4), hb(0)), off);
                let q2 = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(c, m4), hb(2)), off);
                let q3 = _mm_sub_epi8(
                    _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), m4), hb(4)),
                    off,
                );
                let q4 = _mm_sub_epi8(
                    _mm_or_si128(_mm_and_si128(_mm_srli_epi16(c, 4), m4), hb(6)),
                    off,
                );
                let base = yp.add(128 * n + l);
                let s = |k: usize| _mm512_set1_ps(d * *sc.add(is + 2 * k) as f32);
                _mm512_storeu_ps(base, _mm512_mul_ps(i8x16_ps(q1), s(0)));
                _mm512_storeu_ps(base.add(32), _mm512_mul_ps(i8x16_ps(q2), s(1)));
                _mm512_storeu_ps(base.add(64), _mm512_mul_ps(i8x16_ps(q3), s(2)));
                _mm512_storeu_ps(base.add(96), _mm512_mul_ps(i8x16_ps(q4), s(3)));
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_q4_0_nl<const NL: bool>(src: &[u8], dst: &mut [f32]) {
    let m4 = _mm_set1_epi8(0xF);
    let tbl = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    let eight = _mm_set1_epi8(8);
    for (bi, y) in dst.chunks_exact_mut(32).enumerate() {
        let b = src.as_ptr().add(18 * bi);
        let d = _mm512_set1_ps(f16c(rd16(b)));
        let q = _mm_loadu_si128(b.add(2) as *const __m128i);
        let lo = _mm_and_si128(q, m4);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
        let (lo, hi) = if NL {
            (_mm_shuffle_epi8(tbl, lo), _mm_shuffle_epi8(tbl, hi))
        } else {
            (_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight))
        };
        _mm512_storeu_ps(y.as_mut_ptr(), _mm512_mul_ps(i8x16_ps(lo), d));
        _mm512_storeu_ps(y.as_mut_ptr().add(16), _mm512_mul_ps(i8x16_ps(hi), d));
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_iq4_xs(src: &[u8], dst: &mut [f32]) {
    let m4 = _mm_set1_epi8(0xF);
    let tbl = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    for (bi, y) in dst.chunks_exact_mut(256).enumerate() {
        let blk = &src[136 * bi..136 * bi + 136];
        let d = f16c(rd16(blk.as_ptr()));
        let ls = iq4xs_scales(blk);
        for (ib, &l) in ls.iter().enumerate() {
            let dl = _mm512_set1_ps(d * l as f32);
            let q = _mm_loadu_si128(blk.as_ptr().add(8 + 16 * ib) as *const __m128i);
            let lo = _mm_shuffle_epi8(tbl, _mm_and_si128(q, m4));
            let hi = _mm_shuffle_epi8(tbl, _mm_and_si128(_mm_srli_epi16(q, 4), m4));
            _mm512_storeu_ps(y.as_mut_ptr().add(32 * ib), _mm512_mul_ps(i8x16_ps(lo), dl));
            _mm512_storeu_ps(
                y.as_mut_ptr().add(32 * ib + 16),
                _mm512_mul_ps(i8x16_ps(hi), dl),
            );
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_f16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    while i + 16 <= n {
        _mm512_storeu_ps(
            d.add(i),
            _mm512_cvtph_ps(_mm256_loadu_si256(s.add(2 * i) as *const __m256i)),
        );
        i += 16;
    }
    if i < n {
        let m = (1u16 << (n - i)) - 1;
        let h = _mm256_maskz_loadu_epi16(m, s.add(2 * i) as *const i16);
        _mm512_mask_storeu_ps(d.add(i), m, _mm512_cvtph_ps(h));
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_bf16(src: &[u8], dst: &mut [f32]) {
    let n = dst.len();
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    while i + 16 <= n {
        let h = _mm256_loadu_si256(s.add(2 * i) as *const __m256i);
        _mm512_storeu_si512(
            d.add(i) as *mut _,
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16),
        );
        i += 16;
    }
    if i < n {
        let m = (1u16 << (n - i)) - 1;
        let h = _mm256_maskz_loadu_epi16(m, s.add(2 * i) as *const i16);
        _mm512_mask_storeu_epi32(
            d.add(i) as *mut i32,
            m,
            _mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16),
        );
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_q8_0(src: &[u8], dst: &mut [f32]) {
    for (bi, y) in dst.chunks_exact_mut(32).enumerate() {
        let b = src.as_ptr().add(34 * bi);
        let d = _mm512_set1_ps(f16c(rd16(b)));
        let q0 = _mm_loadu_si128(b.add(2) as *const __m128i);
        let q1 = _mm_loadu_si128(b.add(18) as *const __m128i);
        _mm512_storeu_ps(y.as_mut_ptr(), _mm512_mul_ps(i8x16_ps(q0), d));
        _mm512_storeu_ps(y.as_mut_ptr().add(16), _mm512_mul_ps(i8x16_ps(q1), d));
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_q2_k(src: &[u8], dst: &mut [f32]) {
    let m3 = _mm_set1_epi8(3);
    for (bi, y) in dst.chunks_exact_mut(256).enumerate() {
        let b = src.as_ptr().add(84 * bi);
        let (d, dmin) = (f16c(rd16(b.add(80))), f16c(rd16(b.add(82))));
        let yp = y.as_mut_ptr();
        let mut is = 0;
        for n in 0..2 {
            let q0 = _mm_loadu_si128(b.add(16 + 32 * n) as *const __m128i);
            let q1 = _mm_loadu_si128(b.add(16 + 32 * n + 16) as *const __m128i);
            for j in 0..4 {
                let sh = _mm_cvtsi32_si128(2 * j as i32);
                for (h, q) in [q0, q1].into_iter().enumerate() {
                    let sc = *b.add(is);
                    is += 1;
                    let v = _mm_and_si128(_mm_srl_epi16(q, sh), m3);
                    let dl = _mm512_set1_ps(d * (sc & 0xF) as f32);
                    let ml = _mm512_set1_ps(dmin * (sc >> 4) as f32);
                    _mm512_storeu_ps(
                        yp.add(128 * n + 32 * j + 16 * h),
                        _mm512_fmsub_ps(u8x16_ps(v), dl, ml),
                    );
                }
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_q3_k(src: &[u8], dst: &mut [f32]) {
    let m3 = _mm_set1_epi8(3);
    let four = _mm_set1_epi8(4);
    for (bi, y) in dst.chunks_exact_mut(256).enumerate() {
        let blk = &src[110 * bi..110 * bi + 110];
        let b = blk.as_ptr();
        let d = f16c(rd16(b.add(108)));
        let sc = crate::matmul::scalar::dequant::q3k_scales(&blk[96..108]);
        let hm = [
            _mm_loadu_si128(b as *const __m128i),
            _mm_loadu_si128(b.add(16) as *const __m128i),
        ];
        let yp = y.as_mut_ptr();
        let mut is = 0;
        for n in 0..2 {
            let q = [
                _mm_loadu_si128(b.add(32 + 32 * n) as *const __m128i),
                _mm_loadu_si128(b.add(32 + 32 * n + 16) as *const __m128i),
            ];
            for j in 0..4 {
                let sh = _mm_cvtsi32_si128(2 * j as i32);
                let mbit = _mm_set1_epi8((1u8 << (4 * n + j)) as i8);
                for h in 0..2 {
                    let v = _mm_and_si128(_mm_srl_epi16(q[h], sh), m3);
                    // minus 4 where the high bit is clear
                    let clear = _mm_cmpeq_epi8(_mm_and_si128(hm[h], mbit), _mm_setzero_si128());
                    let v = _mm_sub_epi8(v, _mm_and_si128(clear, four));
                    let dl = _mm512_set1_ps(d * sc[is] as f32);
                    is += 1;
                    _mm512_storeu_ps(
                        yp.add(128 * n + 32 * j + 16 * h),
                        _mm512_mul_ps(i8x16_ps(v), dl),
                    );
                }
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_q4_1(src: &[u8], dst: &mut [f32]) {
    let m4 = _mm_set1_epi8(0xF);
    for (bi, y) in dst.chunks_exact_mut(32).enumerate() {
        let b = src.as_ptr().add(20 * bi);
        let d = _mm512_set1_ps(f16c(rd16(b)));
        let m = _mm512_set1_ps(f16c(rd16(b.add(2))));
        let q = _mm_loadu_si128(b.add(4) as *const __m128i);
        let lo = _mm_and_si128(q, m4);
        let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m4);
        _mm512_storeu_ps(y.as_mut_ptr(), _mm512_fmadd_ps(u8x16_ps(lo), d, m));
        _mm512_storeu_ps(y.as_mut_ptr().add(16), _mm512_fmadd_ps(u8x16_ps(hi), d, m));
    }
}

/// Q5_0 (`MIN = false`: values − 16) and Q5_1 (`MIN = true`: plus m).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
pub(in crate::matmul) unsafe fn decode_q5<const MIN: bool>(src: &[u8], dst: &mut [f32]) {
    let m4 = _mm_set1_epi8(0xF);
    let bit4 = _mm_set1_epi8(0x10);
    let bsz = if MIN { 24 } else { 22 };
    let qo = if MIN { 8 } else { 6 };
    for (bi, y) in dst.chunks_exact_mut(32).enumerate() {
        let b = src.as_ptr().add(bsz * bi);
        let d = _mm512_set1_ps(f16c(rd16(b)));
        let qh = (b.add(qo - 4) as *const u32).read_unaligned();
        // bit i of qh is the fifth bit of element i
        let hb_lo = _mm_and_si128(_mm_movm_epi8(qh as u16), bit4);
        let hb_hi = _mm_and_si128(_mm_movm_epi8((qh >> 16) as u16), bit4);
        let q = _mm_loadu_si128(b.add(qo) as *const __m128i);
        let lo = _mm_or_si128(_mm_and_si128(q, m4), hb_lo);
        let hi = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(q, 4), m4), hb_hi);
        let (vlo, vhi) = (u8x16_ps(lo), u8x16_ps(hi));
        let (ylo, yhi) = if MIN {
            let m = _mm512_set1_ps(f16c(rd16(b.add(2))));
            (_mm512_fmadd_ps(vlo, d, m), _mm512_fmadd_ps(vhi, d, m))
        } else {
            let c = _mm512_set1_ps(16.0);
            (
                _mm512_mul_ps(_mm512_sub_ps(vlo, c), d),
                _mm512_mul_ps(_mm512_sub_ps(vhi, c), d),
            )
        };
        _mm512_storeu_ps(y.as_mut_ptr(), ylo);
        _mm512_storeu_ps(y.as_mut_ptr().add(16), yhi);
    }
}
