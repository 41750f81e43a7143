//! Weight rows decoded to small signed integers and float scales, for the
//! integer GEMMs: `w = a·q − b` per scale group (32 values; Q6_K, Q3_K, Q2_K, IQ2_XS,
//! IQ2_S, IQ1_M 16: [`group16`]), `q` as i8 (the lattice, ternary and MXFP4 formats
//! through `decode_iq.rs`). The AVX-512 GEMM packs them as they come; the AVX2 GEMM of the
//! one-scale formats widens them to i16. 128-bit integer instructions only,
//! so both levels share it.

use crate::matmul::scalar::dequant::{iq4xs_scales, q3k_scales, scales_mins_k4, KVALUES_IQ4NL};
use coil_gguf::GgmlType;
use std::arch::x86_64::*;

/// Whether `ty`'s weights have a scale per 16 values in the integer GEMMs
/// (Q6_K, Q3_K, Q2_K, and IQ2_XS, IQ2_S, IQ1_M: [`decode_row`]'s scale
/// groups); the others one per 32.
pub(in crate::matmul) fn group16(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q6_K | Q3_K | Q2_K) || super::decode_iq::group16(ty)
}

/// Decodes one encoded row into 32-blocks: `q` (i8), and `a`, `b` per
/// scale group `g` written at `a[g · st]`, `b[g · st]` (a panel's
/// `[group][16 rows]` layout: `st` = 16, `a`, `b` at the row's lane).
///
/// # Safety
/// AVX2 and F16C; `a` and `b` valid for the row's scale groups
/// at stride `st`.
#[target_feature(enable = "avx2,f16c")]
pub(in crate::matmul) unsafe fn decode_row(
    ty: GgmlType,
    src: &[u8],
    q: &mut [i8],
    a: *mut f32,
    b: *mut f32,
    st: usize,
) {
    use GgmlType::*;
    if super::decode_iq::supported(ty) {
        // the lattice, ternary and MXFP4 formats: no min
        let g = if group16(ty) { 16 } else { 32 };
        for k in 0..src.len() / ty.type_size() * ty.block_size() / g {
            *b.add(k * st) = 0.0;
        }
        return super::decode_iq::decode_row_i8(ty, src, q, a, st);
    }
    // the f16 at byte `off` of a block, converted by F16C (inlined here)
    let rd_f16 = |blk: &[u8], off: usize| {
        crate::matmul::x86_avx2::dots::f16c(u16::from_le_bytes([blk[off], blk[off + 1]]))
    };
    let (bs, ts) = ty.block_layout();
    let m4 = _mm_set1_epi8(0xF);
    let tbl = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr() as *const __m128i);
    let eight = _mm_set1_epi8(8);
    let bit4 = _mm_set1_epi8(0x10);
    // 16 packed nibbles at `p` -> 32 values [lo | hi] at `out` (table or minus 8)
    let nib = |p: *const u8, out: *mut i8, nl: bool| {
        let v = _mm_loadu_si128(p as *const __m128i);
        let lo = _mm_and_si128(v, m4);
        let hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
        let (lo, hi) = if nl {
            (_mm_shuffle_epi8(tbl, lo), _mm_shuffle_epi8(tbl, hi))
        } else {
            (_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight))
        };
        _mm_storeu_si128(out as *mut __m128i, lo);
        _mm_storeu_si128(out.add(16) as *mut __m128i, hi);
    };
    for (bi, blk) in src.chunks_exact(ts).enumerate() {
        let qo = q.as_mut_ptr().add(bi * bs);
        let nsub = bs / if group16(ty) { 16 } else { 32 };
        // this block's scale groups, `st` apart
        let (a, b) = (a.add(bi * nsub * st), b.add(bi * nsub * st));
        let set = |p: *mut f32, g: usize, v: f32| *p.add(g * st) = v;
        let bp = blk.as_ptr();
        match ty {
            Q8_0 => {
                set(a, 0, rd_f16(blk, 0));
                set(b, 0, 0.0);
                std::ptr::copy_nonoverlapping(bp.add(2) as *const i8, qo, 32);
            }
            Q4_0 | IQ4_NL => {
                set(a, 0, rd_f16(blk, 0));
                set(b, 0, 0.0);
                nib(bp.add(2), qo, ty == IQ4_NL);
            }
            Q4_1 => {
                // w = d·q + m (q 0..15): a = d, b = −m
                set(a, 0, rd_f16(blk, 0));
                set(b, 0, -rd_f16(blk, 2));
                let v = _mm_loadu_si128(bp.add(4) as *const __m128i);
                _mm_storeu_si128(qo as *mut __m128i, _mm_and_si128(v, m4));
                _mm_storeu_si128(
                    qo.add(16) as *mut __m128i,
                    _mm_and_si128(_mm_srli_epi16(v, 4), m4),
                );
            }
            Q5_0 | Q5_1 => {
                // Q5_0: w = d·(q − 16); Q5_1: w = d·q + m (a = d, b = −m)
                let one = ty == Q5_1;
                set(a, 0, rd_f16(blk, 0));
                set(b, 0, if one { -rd_f16(blk, 2) } else { 0.0 });
                let hq = if one { 4 } else { 2 };
                // the fifth bit of value v is bit v of `qh`: bytes 0-1 of
                // `qh` for the low nibbles (values 0-15), 2-3 for the high
                let qh = _mm_set1_epi32(i32::from_le_bytes([
                    blk[hq],
                    blk[hq + 1],
                    blk[hq + 2],
                    blk[hq + 3],
                ]));
                let bits = _mm_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
                let fifth = |sel: __m128i| {
                    let h = _mm_and_si128(_mm_shuffle_epi8(qh, sel), bits);
                    _mm_and_si128(_mm_cmpeq_epi8(h, bits), bit4)
                };
                let h_lo = fifth(_mm_setr_epi8(
                    0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                ));
                let h_hi = fifth(_mm_setr_epi8(
                    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                ));
                let v = _mm_loadu_si128(bp.add(hq + 4) as *const __m128i);
                let off = _mm_set1_epi8(if one { 0 } else { 16 });
                let lo = _mm_sub_epi8(_mm_or_si128(_mm_and_si128(v, m4), h_lo), off);
                let hi = _mm_sub_epi8(
                    _mm_or_si128(_mm_and_si128(_mm_srli_epi16(v, 4), m4), h_hi),
                    off,
                );
                _mm_storeu_si128(qo as *mut __m128i, lo);
                _mm_storeu_si128(qo.add(16) as *mut __m128i, hi);
            }
            Q4_K | Q5_K => {
                let (d, dmin) = (rd_f16(blk, 0), rd_f16(blk, 2));
                let scales = &blk[4..16];
                let high = ty == Q5_K;
                // all eight scales and mins with word operations
                let (sc, mn) = scales_mins_k4(scales);
                for j in 0..8 {
                    set(a, j, d * sc[j] as f32);
                    set(b, j, dmin * mn[j] as f32);
                }
                unpack_k45(bp, high, qo as *mut u8);
            }
            IQ4_XS => {
                let d = rd_f16(blk, 0);
                let ls = iq4xs_scales(blk);
                for ib in 0..8 {
                    set(a, ib, d * ls[ib] as f32);
                    set(b, ib, 0.0);
                    nib(bp.add(8 + 16 * ib), qo.add(32 * ib), true);
                }
            }
            Q6_K => {
                let d = rd_f16(blk, 208);
                for g in 0..nsub {
                    set(a, g, d * (blk[192 + g] as i8) as f32);
                    set(b, g, 0.0);
                }
                unpack_q6k::<32>(bp, qo as *mut u8);
            }
            Q3_K => {
                let d = rd_f16(blk, 108);
                for (g, &sc) in q3k_scales(&blk[96..108]).iter().enumerate() {
                    set(a, g, d * sc as f32);
                    set(b, g, 0.0);
                }
                unpack_q3k::<4>(bp, qo as *mut u8);
            }
            Q2_K => {
                let (d, dmin) = (rd_f16(blk, 80), rd_f16(blk, 82));
                for g in 0..nsub {
                    set(a, g, d * (blk[g] & 0xF) as f32);
                    set(b, g, dmin * (blk[g] >> 4) as f32);
                }
                unpack_q2k(bp, qo as *mut u8);
            }
            _ => unreachable!("igemm: unsupported {ty}"),
        }
    }
}

/// The 256 values of a Q4_K (`high`: Q5_K) super-block at `bp`, unsigned
/// (0..15 / 0..31), to `qo` in order: per pair of 32-value groups, the
/// low nibbles of 32 bytes then their high nibbles, the fifth bits from
/// `qh` (bits 2j and 2j + 1 of each byte for pair j).
///
/// # Safety
/// `bp` holds a whole super-block, `qo` 256 bytes.
#[inline(always)]
pub(in crate::matmul) unsafe fn unpack_k45(bp: *const u8, high: bool, qo: *mut u8) {
    let m4 = _mm_set1_epi8(0xF);
    let bit4 = _mm_set1_epi8(0x10);
    let qs = bp.add(if high { 48 } else { 16 });
    for h in 0..2 {
        let mut hb = if high {
            _mm_loadu_si128(bp.add(16 + 16 * h) as *const __m128i)
        } else {
            _mm_setzero_si128()
        };
        for j in 0..4 {
            let v = _mm_loadu_si128(qs.add(32 * j + 16 * h) as *const __m128i);
            let mut lo = _mm_and_si128(v, m4);
            let mut hi = _mm_and_si128(_mm_srli_epi16(v, 4), m4);
            if high {
                lo = _mm_or_si128(lo, _mm_and_si128(_mm_slli_epi16(hb, 4), bit4));
                hi = _mm_or_si128(hi, _mm_and_si128(_mm_slli_epi16(hb, 3), bit4));
                hb = _mm_srli_epi16(hb, 2);
            }
            _mm_storeu_si128(qo.add(64 * j + 16 * h) as *mut __m128i, lo);
            _mm_storeu_si128(qo.add(64 * j + 32 + 16 * h) as *mut __m128i, hi);
        }
    }
}

/// The 256 six-bit values of a Q6_K super-block at `bp` (0..63), minus
/// `OFF` (32: the signed weights; 0: unsigned), to `qo` in order.
///
/// # Safety
/// `bp` holds a whole super-block, `qo` 256 bytes.
#[inline(always)]
pub(in crate::matmul) unsafe fn unpack_q6k<const OFF: i8>(bp: *const u8, qo: *mut u8) {
    let m4 = _mm_set1_epi8(0xF);
    let m3 = _mm_set1_epi8(3);
    let off = _mm_set1_epi8(OFF);
    let fin = |v: __m128i| if OFF == 0 { v } else { _mm_sub_epi8(v, off) };
    for n in 0..2 {
        let ql = bp.add(64 * n);
        let qh = bp.add(128 + 32 * n);
        for l in [0usize, 16] {
            let va = _mm_loadu_si128(ql.add(l) as *const __m128i);
            let vc = _mm_loadu_si128(ql.add(l + 32) as *const __m128i);
            let h = _mm_loadu_si128(qh.add(l) as *const __m128i);
            let h0 = _mm_slli_epi16(_mm_and_si128(h, m3), 4);
            let h2 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 2), m3), 4);
            let h4 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 4), m3), 4);
            let h6 = _mm_slli_epi16(_mm_and_si128(_mm_srli_epi16(h, 6), m3), 4);
            let q1 = fin(_mm_or_si128(_mm_and_si128(va, m4), h0));
            let q2 = fin(_mm_or_si128(_mm_and_si128(vc, m4), h2));
            let q3 = fin(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(va, 4), m4), h4));
            let q4 = fin(_mm_or_si128(_mm_and_si128(_mm_srli_epi16(vc, 4), m4), h6));
            let base = qo.add(128 * n + l);
            _mm_storeu_si128(base as *mut __m128i, q1);
            _mm_storeu_si128(base.add(32) as *mut __m128i, q2);
            _mm_storeu_si128(base.add(64) as *mut __m128i, q3);
            _mm_storeu_si128(base.add(96) as *mut __m128i, q4);
        }
    }
}

/// The 256 two-bit values of a Q2_K super-block at `bp` (0..3) to `qo` in
/// order: value `l` of 16-group `g = 8n + 2j + h` is bits `2j..2j+2` of
/// byte `16 + 32n + 16h + l`.
///
/// # Safety
/// `bp` holds a whole super-block, `qo` 256 bytes.
#[inline(always)]
pub(in crate::matmul) unsafe fn unpack_q2k(bp: *const u8, qo: *mut u8) {
    let m3 = _mm_set1_epi8(3);
    for n in 0..2 {
        for h in 0..2 {
            let v = _mm_loadu_si128(bp.add(16 + 32 * n + 16 * h) as *const __m128i);
            let at = |j: usize| qo.add(128 * n + 32 * j + 16 * h) as *mut __m128i;
            _mm_storeu_si128(at(0), _mm_and_si128(v, m3));
            _mm_storeu_si128(at(1), _mm_and_si128(_mm_srli_epi16(v, 2), m3));
            _mm_storeu_si128(at(2), _mm_and_si128(_mm_srli_epi16(v, 4), m3));
            _mm_storeu_si128(at(3), _mm_and_si128(_mm_srli_epi16(v, 6), m3));
        }
    }
}

/// The 256 three-bit values of a Q3_K super-block at `bp` as `q | high <<
/// 2` (0..7) minus `OFF` (4: the signed weights −4..3; 0: unsigned), to
/// `qo` in order: `q` as Q2_K's (from byte 32), the high bit of value `l`
/// of group `8n + 2j + h` bit `4n + j` of byte `16h + l`.
///
/// # Safety
/// `bp` holds a whole super-block, `qo` 256 bytes.
#[inline(always)]
pub(in crate::matmul) unsafe fn unpack_q3k<const OFF: i8>(bp: *const u8, qo: *mut u8) {
    let m3 = _mm_set1_epi8(3);
    let bit2 = _mm_set1_epi8(4);
    let off = _mm_set1_epi8(OFF);
    for h in 0..2 {
        let hm = _mm_loadu_si128(bp.add(16 * h) as *const __m128i);
        for n in 0..2 {
            let v = _mm_loadu_si128(bp.add(32 + 32 * n + 16 * h) as *const __m128i);
            for j in 0..4 {
                let q = match j {
                    0 => v,
                    1 => _mm_srli_epi16(v, 2),
                    2 => _mm_srli_epi16(v, 4),
                    _ => _mm_srli_epi16(v, 6),
                };
                // bit 4n + j of each byte to bit 2 (in 16-bit words; what
                // crosses from the high byte lands on bit 3 or above)
                let hb = match 4 * n + j {
                    0 => _mm_slli_epi16(hm, 2),
                    1 => _mm_slli_epi16(hm, 1),
                    2 => hm,
                    3 => _mm_srli_epi16(hm, 1),
                    4 => _mm_srli_epi16(hm, 2),
                    5 => _mm_srli_epi16(hm, 3),
                    6 => _mm_srli_epi16(hm, 4),
                    _ => _mm_srli_epi16(hm, 5),
                };
                let v3 = _mm_or_si128(_mm_and_si128(q, m3), _mm_and_si128(hb, bit2));
                let v3 = if OFF == 0 { v3 } else { _mm_sub_epi8(v3, off) };
                _mm_storeu_si128(qo.add(128 * n + 32 * j + 16 * h) as *mut __m128i, v3);
            }
        }
    }
}
