//! Q6_K with the rows in the vector lanes: the layout [`repack`] gives a
//! Q6_K weight matrix at load and the kernel for 1 to 9 tokens
//! that reads it, as `lanes.rs` does for Q4_K (see there for why, and for
//! the batch invariance).
//!
//! A Q6_K block (256 values, 210 bytes): `ql[128]` (low 4 bits), `qh[64]`
//! (high 2 bits), `scales[16]` (i8, one per 16 values), `d` (f16). In half
//! `n` (values `128n..`), byte `l < 32` of `ql` holds values `l` (low
//! nibble) and `l + 64` (high), byte `32 + l` values `l + 32` and `l + 96`,
//! and `qh` byte `l` their top bits, two each. `w = d·sc·(q − 32)`.
//!
//! Per block and token: `y += dx · Σ_s d·sc_s · (Σ q·qx − 32 · Σ qx)` over
//! the 16 sub-blocks `s` of 16 values (the offset enters the integer sum:
//! it starts from `−32 · Σ qx`).
//!
//! The layout regroups the bits so that the kernels get the 6-bit values
//! back with few operations: per 128-value half `n` and 4-column group
//! `lg`, three vectors `A`, `B`, `C` (16 rows in the lanes, 4 columns per
//! lane) hold in their low 6 bits the values of columns `32k + 4lg ..`
//! (`k` = 0, 1, 2), and in their top 2 bits the bits `2k .. 2k + 2` of
//! columns `96 + 4lg ..`: three masks and one merge of three shifted
//! vectors instead of nibble splits and a shift per top pair.
use super::super::act::{ActPanel, QuantAct, PANEL_LANES};
use super::lanes::rows32;
use std::arch::x86_64::*;

/// Bytes of one block of 16 rows in the repacked layout: per half, per
/// 4-column group, `A`, `B`, `C` (24 vectors, 1536 bytes), then the 16
/// sub-blocks' scales (16 bytes each, row `r` at byte `r`), then the 16
/// rows' `d` (f16).
pub(in crate::matmul) const PACKED_BLOCK: usize = 16 * 210;
const HALF: usize = 1536;
const SC: usize = 3072;
const D: usize = 3328;

/// The panel [`rows_q6_k`] reads: [`ActPanel::new`]'s chunks of 64 values
/// and scales, plus in `hoff[(i · nt + t) · 16 + s]` the start of token
/// `t`'s integer sum over sub-block `s` of block `i`: `−32 · Σ qx`.
pub(super) fn panel(a: &QuantAct, t0: usize, nt: usize) -> ActPanel {
    let mut p = ActPanel::new(a, t0, nt, 256, 16, 64);
    p.hoff = p.sums.iter().map(|&s| -32 * i32::from(s)).collect();
    p
}

/// One block's shared part for 16 rows: `a[s]` = `d·sc_s` per row lane,
/// and `w[s][v]`: columns `16s + 4v .. + 4` of the 16 rows (0..63).
#[repr(C, align(64))]
struct Block {
    a: [__m512; 16],
    w: [[__m512i; 4]; 16],
}

/// The values (0..63) of 4-column group `lg` of half `n` of the block of 16
/// repacked rows at `b`: vector `k` holds columns `128n + 32k + 4lg ..`.
#[inline(always)]
unsafe fn group_values(b: *const u8, n: usize, lg: usize) -> [__m512i; 4] {
    let m3f = _mm512_set1_epi8(0x3f);
    let v = b.add(HALF * n + 192 * lg);
    // (no closure: it would not inherit the target features)
    let a = _mm512_loadu_si512(v as *const _);
    let bb = _mm512_loadu_si512(v.add(64) as *const _);
    let c = _mm512_loadu_si512(v.add(128) as *const _);
    // top pairs to bits 0..2, 2..4, 4..6 (16-bit shifts: what crosses from
    // the next byte is masked off), merged by masks (0xD8: the third
    // operand's set bits from the second, the rest from the first)
    let t = _mm512_ternarylogic_epi32::<0xD8>(
        _mm512_srli_epi16::<4>(bb),
        _mm512_srli_epi16::<6>(a),
        _mm512_set1_epi8(0x03),
    );
    let t = _mm512_ternarylogic_epi32::<0xD8>(_mm512_srli_epi16::<2>(c), t, _mm512_set1_epi8(0x0f));
    [
        _mm512_and_si512(a, m3f),
        _mm512_and_si512(bb, m3f),
        _mm512_and_si512(c, m3f),
        _mm512_and_si512(t, m3f),
    ]
}

/// One block of 16 repacked rows at `b`.
#[inline(always)]
unsafe fn unpack_packed(b: *const u8, blk: &mut Block) {
    let d = _mm512_cvtph_ps(_mm256_loadu_si256(b.add(D) as *const __m256i));
    for (s, a) in blk.a.iter_mut().enumerate() {
        let sc = _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(SC + 16 * s) as *const __m128i));
        *a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
    }
    for n in 0..2 {
        for lg in 0..8 {
            let q = group_values(b, n, lg);
            // q[k]: columns 128n + 32k + 4lg: sub-block 8n + 2k + lg / 4
            for (k, q) in q.iter().enumerate() {
                blk.w[8 * n + 2 * k + lg / 4][lg % 4] = *q;
            }
        }
    }
}

/// Repacked Q6_K rows (`out[t].len()` of them, a multiple of 16; `rb`
/// bytes per row) times `NT` tokens of a [`panel`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
unsafe fn rows_q6_k<const NT: usize>(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    let nb = p.n_blocks;
    assert!(p.nt == NT && out.len() == NT && NT <= PANEL_LANES);
    assert!(p.qs.len() >= NT * nb * 256 && p.d.len() >= nb * PANEL_LANES);
    assert!(p.hoff.len() >= nb * NT * 16);
    let n = out[0].len();
    assert!(out.iter().all(|o| o.len() == n) && n.is_multiple_of(16));
    assert!(rb == nb * 210 && w.len() >= n * rb);
    let (xq, xd, xo) = (p.qs.as_ptr(), p.d.as_ptr(), p.hoff.as_ptr());
    let mut blk: Block = std::mem::zeroed();
    for r0 in (0..n).step_by(16) {
        let mut facc = [_mm512_setzero_ps(); NT];
        for i in 0..nb {
            let b = w.as_ptr().add(r0 * rb + PACKED_BLOCK * i);
            unpack_packed(b, &mut blk);
            let mut fsb = [_mm512_setzero_ps(); NT];
            for s in 0..16 {
                // the block's lines ahead, spread over its sub-blocks (see
                // `prefetch_part`)
                super::dots::prefetch_part::<{ super::super::x86_avx2::dots::PF_STREAM }>(
                    b,
                    PACKED_BLOCK,
                    s,
                    16,
                );
                let wv = blk.w[s];
                let a = blk.a[s];
                for t in 0..NT {
                    // columns 256i + 16s .. of token t: chunk 4i + s/4
                    let x = xq.add(64 * ((4 * i + s / 4) * NT + t) + 16 * (s % 4));
                    let mut acc = _mm512_set1_epi32(*xo.add((i * NT + t) * 16 + s));
                    for (v, wq) in wv.iter().enumerate() {
                        let xb = _mm512_set1_epi32((x.add(4 * v) as *const i32).read_unaligned());
                        acc = _mm512_dpbusd_epi32(acc, *wq, xb);
                    }
                    fsb[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), a, fsb[t]);
                }
            }
            for t in 0..NT {
                let dx = _mm512_set1_ps(*xd.add(i * PANEL_LANES + t));
                facc[t] = _mm512_fmadd_ps(fsb[t], dx, facc[t]);
            }
        }
        for (t, o) in out.iter_mut().enumerate() {
            _mm512_storeu_ps(o.as_mut_ptr().add(r0), facc[t]);
        }
    }
}

/// [`rows_q6_k_1`]'s work on 4-column group `LG` of half `N` of the block
/// at `b` (`x`: the token's 256 quantized values of this block, as the
/// panel lays them out): its four vectors of values into the integer sums
/// of their sub-blocks.
#[inline(always)]
unsafe fn group_1<const PF: bool, const N: usize, const LG: usize>(
    b: *const u8,
    x: *const i8,
    acc: &mut [__m512i; 16],
) {
    if PF {
        super::dots::prefetch_part::<{ super::super::x86_avx2::dots::PF_STREAM }>(
            b,
            PACKED_BLOCK,
            8 * N + LG,
            16,
        );
    }
    let q = group_values(b, N, LG);
    for (k, q) in q.iter().enumerate() {
        // columns 128N + 32k + 4LG: sub-block s, its 4-column group LG % 4
        let s = 8 * N + 2 * k + LG / 4;
        let x = x.add(64 * (s / 4) + 16 * (s % 4) + 4 * (LG % 4));
        let xb = _mm512_set1_epi32((x as *const i32).read_unaligned());
        acc[s] = _mm512_dpbusd_epi32(acc[s], *q, xb);
    }
}

/// [`rows_q6_k`] for one token, without the [`Block`] staging: each
/// 4-column group's values go straight into the 16 sub-blocks' integer
/// sums (16 accumulators in registers), then the float part runs in
/// [`rows_q6_k`]'s order — the same operations on the same values, so the
/// same bits. (One token's work per byte is small, and writing and reading
/// the staged block back was a good part of it: kernel bench, one token,
/// 2 threads, weights in huge pages, 28.8–31.8 GB/s staged, 30.7–33.5
/// direct; the file's rows, row at a time, 32.6–34.9. With the groups
/// written out, the 16 sums left the stack: 2048 × 2048 in cache, 43–46
/// → 48–56 GB/s, the rows 53–57; streamed unchanged, 29–31 against the
/// rows' 33–35, whatever the prefetch distances, with or without blocks
/// padded to whole cache lines.)
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
pub(super) unsafe fn rows_q6_k_1<const PF: bool>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [f32],
) {
    let nb = p.n_blocks;
    assert!(p.nt == 1 && p.qs.len() >= nb * 256 && p.d.len() >= nb * PANEL_LANES);
    assert!(p.hoff.len() >= nb * 16);
    let n = out.len();
    assert!(n.is_multiple_of(16) && rb == nb * 210 && w.len() >= n * rb);
    let (xq, xd, xo) = (p.qs.as_ptr(), p.d.as_ptr(), p.hoff.as_ptr());
    for r0 in (0..n).step_by(16) {
        let mut facc = _mm512_setzero_ps();
        for i in 0..nb {
            let b = w.as_ptr().add(r0 * rb + PACKED_BLOCK * i);
            let mut acc = [_mm512_setzero_si512(); 16];
            for (s, a) in acc.iter_mut().enumerate() {
                *a = _mm512_set1_epi32(*xo.add(i * 16 + s));
            }
            let x = xq.add(256 * i);
            // written out so that every accumulator index is a constant and
            // the 16 sums stay in registers (a loop over `lg` kept them on
            // the stack: a load and a store around every `vpdpbusd`)
            macro_rules! groups {
                ($($n:literal $lg:literal),*) => {$(
                    group_1::<PF, $n, $lg>(b, x, &mut acc);
                )*};
            }
            groups!(0 0, 0 1, 0 2, 0 3, 0 4, 0 5, 0 6, 0 7, 1 0, 1 1, 1 2, 1 3, 1 4, 1 5, 1 6, 1 7);
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(b.add(D) as *const __m256i));
            let mut fsb = _mm512_setzero_ps();
            for (s, acc) in acc.iter().enumerate() {
                let sc =
                    _mm512_cvtepi8_epi32(_mm_loadu_si128(b.add(SC + 16 * s) as *const __m128i));
                let a = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
                fsb = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*acc), a, fsb);
            }
            let dx = _mm512_set1_ps(*xd.add(i * PANEL_LANES));
            facc = _mm512_fmadd_ps(fsb, dx, facc);
        }
        _mm512_storeu_ps(out.as_mut_ptr().add(r0), facc);
    }
}

/// [`rows_q6_k`] for a panel of 1 to 9 tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
pub(super) unsafe fn tile_packed(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    match p.nt {
        1 if super::dots::one_token_prefetch() => rows_q6_k_1::<true>(w, rb, p, out[0]),
        1 => rows_q6_k_1::<false>(w, rb, p, out[0]),
        2 => rows_q6_k::<2>(w, rb, p, out),
        3 => rows_q6_k::<3>(w, rb, p, out),
        4 => rows_q6_k::<4>(w, rb, p, out),
        5 => rows_q6_k::<5>(w, rb, p, out),
        6 => rows_q6_k::<6>(w, rb, p, out),
        7 => rows_q6_k::<7>(w, rb, p, out),
        8 => rows_q6_k::<8>(w, rb, p, out),
        9 => rows_q6_k::<9>(w, rb, p, out),
        n => panic!("tile_packed (Q6_K): unsupported token count {n}"),
    }
}

/// For the integer GEMM's panels: block `i` of 16 repacked rows at `g`:
/// per 16-value sub-block `s`, its 4 vectors of values (0..63) and `d·sc_s`
/// per row lane.
///
/// # Safety
/// AVX-512 available; `g` points at a group of a repacked matrix with more
/// than `i` blocks.
#[inline(always)]
pub(in crate::matmul) unsafe fn packed_block(
    g: *const u8,
    i: usize,
) -> ([[__m512i; 4]; 16], [__m512; 16]) {
    let mut blk: Block = std::mem::zeroed();
    unpack_packed(g.add(PACKED_BLOCK * i), &mut blk);
    (blk.w, blk.a)
}

/// Rewrites a Q6_K matrix in place into the layout above (see
/// `lanes::repack` for the conditions).
pub fn repack(data: &mut [u8], rows: usize, cols: usize) {
    assert!(super::lanes::can_repack(rows) && cols.is_multiple_of(256));
    let nb = cols / 256;
    let rb = nb * 210;
    assert_eq!(
        data.len(),
        rows * rb,
        "repack: not {rows} Q6_K rows of {cols}"
    );
    // SAFETY: AVX-512 checked by the caller.
    super::lanes::for_each_group(data, rb, |g, out| unsafe { repack_group(g, rb, nb, out) });
}

/// Where value `c` (0..256) of row `r` lies in a repacked block: the
/// byte of `A`/`B`/`C` holding its 6 bits (`k` < 3), or, for the last
/// quarter of a half (`k` = 3), the byte of `C` whose top pair holds its
/// bits 4..6 (its `B` and `A` bytes 64 and 128 before).
fn place(c: usize, r: usize) -> (usize, usize) {
    let (n, c) = (c / 128, c % 128);
    let (k, lg, j) = (c / 32, (c % 32) / 4, c % 4);
    (HALF * n + 192 * lg + 64 * k.min(2) + 4 * r + j, k)
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn repack_group(group: &[u8], rb: usize, nb: usize, out: &mut [u8]) {
    let mut rows = [group.as_ptr(); 16];
    for (k, row) in rows.iter_mut().enumerate() {
        *row = group.as_ptr().add(k * rb);
    }
    let byte = |v: i8| _mm512_set1_epi8(v);
    let (m4, m3, mc0) = (byte(0x0f), byte(0x03), byte(-64));
    for i in 0..nb {
        let (src, o) = (210 * i, out.as_mut_ptr().add(PACKED_BLOCK * i));
        for n in 0..2 {
            // dword g of each row in lane r: ql bytes 4g.. and 32 + 4g..,
            // qh bytes 4g..
            let lo = rows32(&rows, src + 64 * n);
            let hi = rows32(&rows, src + 64 * n + 32);
            let qh = rows32(&rows, src + 128 + 32 * n);
            for lg in 0..8 {
                let h = qh[lg];
                let top = |k: u32| {
                    let hk = match k {
                        0 => h,
                        1 => _mm512_srli_epi16::<2>(h),
                        2 => _mm512_srli_epi16::<4>(h),
                        _ => _mm512_srli_epi16::<6>(h),
                    };
                    _mm512_slli_epi16::<4>(_mm512_and_si512(hk, m3))
                };
                let nib = |v: __m512i| _mm512_and_si512(v, m4);
                let q = [
                    _mm512_or_si512(nib(lo[lg]), top(0)),
                    _mm512_or_si512(nib(hi[lg]), top(1)),
                    _mm512_or_si512(nib(_mm512_srli_epi16::<4>(lo[lg])), top(2)),
                    _mm512_or_si512(nib(_mm512_srli_epi16::<4>(hi[lg])), top(3)),
                ];
                // q[3]'s pairs 0, 1, 2 to the top of A, B, C
                let pair = [
                    _mm512_slli_epi16::<6>(q[3]),
                    _mm512_slli_epi16::<4>(q[3]),
                    _mm512_slli_epi16::<2>(q[3]),
                ];
                for k in 0..3 {
                    let v = _mm512_or_si512(q[k], _mm512_and_si512(pair[k], mc0));
                    _mm512_storeu_si512(o.add(HALF * n + 192 * lg + 64 * k) as *mut _, v);
                }
            }
        }
        for (r, row) in rows.iter().enumerate() {
            for s in 0..16 {
                *o.add(SC + 16 * s + r) = *row.add(src + 192 + s);
            }
            std::ptr::copy_nonoverlapping(row.add(src + 208), o.add(D + 2 * r), 2);
        }
    }
}

/// Row `r` of a repacked Q6_K matrix back in its GGUF encoding (`out`: 210
/// bytes per block).
pub fn unpack_row(data: &[u8], cols: usize, r: usize, out: &mut [u8]) {
    let nb = cols / 256;
    let rb = nb * 210;
    assert_eq!(out.len(), rb);
    let (g, lane) = (r / 16, r % 16);
    let group = &data[g * 16 * rb..(g + 1) * 16 * rb];
    for i in 0..nb {
        let b = &group[PACKED_BLOCK * i..PACKED_BLOCK * (i + 1)];
        let mut q = [0u8; 256];
        for (c, v) in q.iter_mut().enumerate() {
            let (at, k) = place(c, lane);
            *v = if k < 3 {
                b[at] & 0x3f
            } else {
                (0..3).map(|m| (b[at - 64 * (2 - m)] >> 6) << (2 * m)).sum()
            };
        }
        let o = &mut out[210 * i..210 * (i + 1)];
        for n in 0..2 {
            for l in 0..32 {
                let v = |c: usize| q[128 * n + c];
                o[64 * n + l] = (v(l) & 15) | ((v(l + 64) & 15) << 4);
                o[64 * n + l + 32] = (v(l + 32) & 15) | ((v(l + 96) & 15) << 4);
                o[128 + 32 * n + l] = (v(l) >> 4)
                    | ((v(l + 32) >> 4) << 2)
                    | ((v(l + 64) >> 4) << 4)
                    | ((v(l + 96) >> 4) << 6);
            }
        }
        for s in 0..16 {
            o[192 + s] = b[SC + 16 * s + lane];
        }
        o[208..210].copy_from_slice(&b[D + 2 * lane..D + 2 * lane + 2]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::simd::{detected_level, SimdLevel};
    use coil_gguf::GgmlType;

    /// The checks of every rows-in-lanes format (`lanes_check::check`),
    /// repacking directly: `matmul::repack` leaves Q6_K alone on a Zen 4,
    /// where the layout is still tested.
    #[test]
    fn q6_k_rows_in_lanes() {
        if detected_level() < SimdLevel::Avx512 {
            return;
        }
        let f = super::super::lanes_check::Format {
            ty: GgmlType::Q6_K,
            repack,
            unpack_row,
            quantize: QuantAct::q8_k,
            act_block: 256,
            panel,
            tile: tile_packed,
        };
        super::super::lanes_check::check(&f, 768, 21);
    }
}
