//! Q4_K and Q5_K with the rows in the vector lanes: coil's loader rewrites
//! their weight matrices in memory ([`repack`]: per group of 16 rows and
//! per 256-value block, the rows' heads, Q5_K's fifth bits and the packed
//! nibbles transposed so that row `r` sits in lane `r`; same bytes), and
//! every product with them runs here or in the integer GEMM, whose panels
//! come straight out of it. The two formats differ only by Q5_K's fifth
//! bits (`HIGH`: 32 bytes after the scales, bit `j` of byte `l` for value
//! `32j + l`); their heads, scales, mins and float work are the same, so
//! one body serves both (as `x86_avx2/lanes.rs` at the AVX2 level). The
//! layout keeps Q5_K's fifth bits as byte masks ([`fifth`]: one masked add
//! per vector of values; tested per use from the transposed bits, the
//! one-token kernel ran slower than the plain rows').
//!
//! The dot kernels (`dot_k45`, the tiles in `tiles.rs`) put a row's values
//! in the lanes: per block and token they convert and scale a vector of
//! partial sums, and per row and token they add 16 lanes up, none of it
//! shared by the tokens, so 8 tokens cost ~4 single ones. Here `vpdpbusd`
//! takes 4 columns of 16 rows against one broadcast of 4 activation bytes
//! (as in the prefill GEMM): per 32-value sub-block and token one
//! conversion and an FMA cover 16 rows (the min terms per block in
//! integers, [`min_start`]: 8 tokens 5632 x 2048 on one AMD Zen 4 core
//! 0.667 → 0.657 ms), a token's 16 results come out as
//! one vector, and the nibbles and scales are unpacked once for all the
//! tokens. The group's blocks are one stretch of memory (the plain rows
//! are 16 streams, too many for the prefetchers, and would need the
//! transposition per product).
//!
//! Batch invariance: a token's result is a chain of operations on its own
//! registers, the same whatever the number of tokens in the call, and a
//! row's lane is computed alone, so results depend neither on the token
//! count nor on how the groups are split between threads: one token, a few
//! (batched decode, speculative verification) and the batch-invariant mode
//! all give the same bits.
//!
//! Per block and token: `y += dx · (Σ_j d·sc_j · Σ q·qx − dmin · Σ_j m_j ·
//! Σ qx)` over the 8 sub-blocks `j` (`q` the nibbles, with Q5_K their
//! fifth bits, `qx` the token's Q8_K values, `dx` its scale per 256; the
//! second sum exact in i32).

use super::super::act::{ActPanel, QuantAct, PANEL_LANES};
// bytes per plain block, where its nibbles start (Q4_K, or Q5_K: `true`)
use super::super::x86_avx2::lanes::{block as block_bytes, quants_at};
use std::arch::x86_64::*;

/// Most tokens per kernel call (as the other tiles: a verification of 8
/// drafts).
pub(super) const MAX_TOKENS: usize = 9;

/// The panel [`rows_k45`] reads: [`ActPanel::new`]'s chunks of 64 values
/// and scales, plus in `hxs[(i · nt + t) · 8 + j]` the sum of token `t`'s
/// quantized values over sub-block `j` of block `i` (at most 32 · 127: an
/// i16).
pub(super) fn panel(a: &QuantAct, t0: usize, nt: usize) -> ActPanel {
    let mut p = ActPanel::new(a, t0, nt, 256, 16, 64);
    p.hxs = p.sums.chunks_exact(2).map(|s| s[0] + s[1]).collect();
    p
}

/// Transposes 16 rows of 32 bytes (`z[r]` = row `r` in the low half, row
/// `r + 8` in the high half) into 8 vectors: vector `g` holds bytes
/// `4g..4g + 4` of row `r` in dword lane `r`.
#[inline(always)]
pub(super) unsafe fn transpose_16x8(z: [__m512i; 8]) -> [__m512i; 8] {
    // (loops, not closures: a closure does not inherit the target features
    // and its intrinsics would become calls)
    let mut t = [_mm512_setzero_si512(); 8];
    for i in 0..4 {
        t[2 * i] = _mm512_unpacklo_epi32(z[2 * i], z[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_epi32(z[2 * i], z[2 * i + 1]);
    }
    let mut u = [_mm512_setzero_si512(); 8];
    for i in 0..8 {
        let (h, d) = (i / 4, i % 4);
        let (a, b) = (t[4 * h + d / 2], t[4 * h + 2 + d / 2]);
        u[i] = if d % 2 == 0 {
            _mm512_unpacklo_epi64(a, b)
        } else {
            _mm512_unpackhi_epi64(a, b)
        };
    }
    let lo_idx = _mm512_setr_epi64(0, 1, 8, 9, 4, 5, 12, 13);
    let hi_idx = _mm512_setr_epi64(2, 3, 10, 11, 6, 7, 14, 15);
    let mut v = [_mm512_setzero_si512(); 8];
    for g in 0..8 {
        let (d, hi) = (g % 4, g >= 4);
        v[g] = _mm512_permutex2var_epi64(u[d], if hi { hi_idx } else { lo_idx }, u[4 + d]);
    }
    v
}

/// Dword `k` (bytes `4k..4k + 4`) of the 16-byte heads of 16 rows, as four
/// vectors with row `r` in lane `r`.
#[inline(always)]
pub(super) unsafe fn heads(rows: &[*const u8; 16], off: usize) -> [__m512i; 4] {
    let mut z = [_mm512_setzero_si512(); 4];
    for (q, z) in z.iter_mut().enumerate() {
        // rows q, q + 4, q + 8, q + 12 in its four 128-bit lanes
        let ld = |r: usize| rows[r].add(off) as *const __m128i;
        let v = _mm512_castsi128_si512(_mm_loadu_si128(ld(q)));
        let v = _mm512_inserti32x4::<1>(v, _mm_loadu_si128(ld(q + 4)));
        let v = _mm512_inserti32x4::<2>(v, _mm_loadu_si128(ld(q + 8)));
        *z = _mm512_inserti32x4::<3>(v, _mm_loadu_si128(ld(q + 12)));
    }
    let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    // lane 4c + q of each result is row 4c + q
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// One block's shared part for 16 rows: the sub-block scales `d·sc_j`
/// (`a`) and mins `dmin·m_j` (`b`) per row lane, the mins as integers in
/// pairs (`mp[p]`: `m_2p | m_2p+1 << 16` per lane) with `−dmin` (`ndmin`),
/// and the nibbles as `w[j][g]`: columns `32j + 4g .. + 4` of the 16 rows,
/// one byte each.
#[repr(C, align(64))]
struct Block {
    a: [__m512; 8],
    b: [__m512; 8],
    mp: [__m512i; 4],
    ndmin: __m512,
    w: [[__m512i; 8]; 8],
}

/// The scales `d·sc_j` and mins `dmin·m_j` of 16 rows' blocks from their
/// heads (dwords 0–3 of each row's block, row `r` in lane `r`).
#[inline(always)]
unsafe fn decode_heads([h0, u0, u1, u2]: [__m512i; 4], blk: &mut Block) {
    let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(h0));
    let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(h0)));
    // the 6-bit scales and mins of each lane, four per dword (as
    // `k4_scales_mins` for one row)
    let m6 = _mm512_set1_epi32(0x3f3f_3f3f);
    let m4 = _mm512_set1_epi32(0x0f0f_0f0f);
    let m2 = _mm512_set1_epi32(0x0303_0303);
    let s_lo = _mm512_and_si512(u0, m6);
    let m_lo = _mm512_and_si512(u1, m6);
    let s_hi = _mm512_or_si512(
        _mm512_and_si512(u2, m4),
        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u0), m2)),
    );
    let m_hi = _mm512_or_si512(
        _mm512_and_si512(_mm512_srli_epi32::<4>(u2), m4),
        _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(u1), m2)),
    );
    // the mins in i16 pairs: bytes 0, 1 (and 2, 3) of each dword
    let pair_lo = |v: __m512i| {
        _mm512_or_si512(
            _mm512_and_si512(v, _mm512_set1_epi32(0xff)),
            _mm512_and_si512(_mm512_slli_epi32::<8>(v), _mm512_set1_epi32(0x00ff_0000)),
        )
    };
    let pair_hi = |v: __m512i| {
        _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<16>(v), _mm512_set1_epi32(0xff)),
            _mm512_and_si512(_mm512_srli_epi32::<8>(v), _mm512_set1_epi32(0x00ff_0000)),
        )
    };
    blk.mp = [pair_lo(m_lo), pair_hi(m_lo), pair_lo(m_hi), pair_hi(m_hi)];
    blk.ndmin = _mm512_sub_ps(_mm512_setzero_ps(), dmin);
    let (ff, mut sh) = (_mm512_set1_epi32(0xff), _mm512_setzero_si512());
    for k in 0..4 {
        let byte = |v: __m512i| _mm512_srlv_epi32(v, sh);
        let (sl, sh_, ml, mh) = (byte(s_lo), byte(s_hi), byte(m_lo), byte(m_hi));
        let f = |v: __m512i| _mm512_cvtepi32_ps(_mm512_and_si512(v, ff));
        blk.a[k] = _mm512_mul_ps(d, f(sl));
        blk.a[4 + k] = _mm512_mul_ps(d, f(sh_));
        blk.b[k] = _mm512_mul_ps(dmin, f(ml));
        blk.b[4 + k] = _mm512_mul_ps(dmin, f(mh));
        sh = _mm512_add_epi32(sh, _mm512_set1_epi32(8));
    }
}

/// Step `s`'s 8 transposed vectors of packed bytes (byte `k` of a step's
/// 32: value `k` in the low nibble, value `32 + k` in the high one) split
/// into the values of sub-blocks `2s` and `2s + 1` (Q5_K: with the fifth
/// bits of the repacked block at `b`).
#[inline(always)]
unsafe fn split_step<const HIGH: bool>(v: &[__m512i; 8], b: *const u8, s: usize, blk: &mut Block) {
    for (g, v) in v.iter().enumerate() {
        [blk.w[2 * s][g], blk.w[2 * s + 1][g]] = values::<HIGH>(*v, fifth::<HIGH>(b, s, g));
    }
}

/// The values of two sub-blocks in `v`'s bytes: its low and high nibbles,
/// with Q5_K (`HIGH`) 16 added to the bytes `k[0]` (`k[1]`) marks: one
/// masked add per vector.
#[inline(always)]
unsafe fn values<const HIGH: bool>(v: __m512i, k: [__mmask64; 2]) -> [__m512i; 2] {
    let low = _mm512_set1_epi8(0x0f);
    let mut q = [
        _mm512_and_si512(v, low),
        _mm512_and_si512(_mm512_srli_epi16::<4>(v), low),
    ];
    if HIGH {
        let sixteen = _mm512_set1_epi8(16);
        for (q, k) in q.iter_mut().zip(k) {
            *q = _mm512_mask_add_epi8(*q, k, *q, sixteen);
        }
    }
    q
}

/// Q5_K (`HIGH`): the fifth bits of sub-blocks `2s`, `2s + 1`, 4-column
/// group `g` of the repacked block at `b`, as byte masks (bit `4r + c`:
/// column `4g + c` of row `r`); none for Q4_K.
#[inline(always)]
unsafe fn fifth<const HIGH: bool>(b: *const u8, s: usize, g: usize) -> [__mmask64; 2] {
    if !HIGH {
        return [0; 2];
    }
    let m = b.add(256 + fifth_at(s, g)) as *const u64;
    [m.read_unaligned(), m.add(1).read_unaligned()]
}

/// Where the masks of [`fifth`] lie after a repacked Q5_K block's heads.
const fn fifth_at(s: usize, g: usize) -> usize {
    8 * (16 * s + 2 * g)
}

/// Where a repacked block's steps of nibbles start: after the heads'
/// 4 vectors and, for Q5_K, the fifth bits' 64 masks.
const fn steps_at(high: bool) -> usize {
    if high {
        768
    } else {
        256
    }
}

/// Step `s` (values `64s..64s + 64`) of the block at `off` of 16 plain
/// rows, transposed: [`transpose_16x8`] of their packed bytes.
#[inline(always)]
unsafe fn step_plain<const HIGH: bool>(
    rows: &[*const u8; 16],
    off: usize,
    s: usize,
) -> [__m512i; 8] {
    rows32(rows, off + quants_at(HIGH) + 32 * s)
}

/// Bytes `q..q + 32` of 16 rows, transposed ([`transpose_16x8`]).
#[inline(always)]
pub(super) unsafe fn rows32(rows: &[*const u8; 16], q: usize) -> [__m512i; 8] {
    let mut z = [_mm512_setzero_si512(); 8];
    for (r, z) in z.iter_mut().enumerate() {
        let a = _mm256_loadu_si256(rows[r].add(q) as *const __m256i);
        let b = _mm256_loadu_si256(rows[r + 8].add(q) as *const __m256i);
        *z = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b);
    }
    transpose_16x8(z)
}

/// Bytes of one block of 16 rows in the repacked layout ([`repack`]):
/// Q4_K, or Q5_K (`high`).
pub(in crate::matmul) const fn packed_block_bytes(high: bool) -> usize {
    16 * block_bytes(high)
}

#[inline(always)]
pub(super) unsafe fn load16<const N: usize>(p: *const u8) -> [__m512i; N] {
    let mut v = [_mm512_setzero_si512(); N];
    for (k, v) in v.iter_mut().enumerate() {
        *v = _mm512_loadu_si512(p.add(64 * k) as *const _);
    }
    v
}

/// One block of 16 repacked rows at `b`: the heads' 4 vectors, Q5_K's
/// 64 masks of fifth bits, then 4 steps of 8 transposed vectors, as
/// stored by [`repack`].
#[inline(always)]
unsafe fn unpack_packed<const HIGH: bool>(b: *const u8, blk: &mut Block) {
    decode_heads(load16::<4>(b), blk);
    for s in 0..4 {
        split_step::<HIGH>(&load16::<8>(b.add(steps_at(HIGH) + 512 * s)), b, s, blk);
    }
}

/// Where a token's sum over a block starts: its min terms `− dmin · Σ_j
/// m_j·Σqx_j`, the products in integers (two sub-blocks per `vpdpwssd`
/// lane; `h`: the token's 8 sub-block sums), one float multiply — in place
/// of an FMA per sub-block, on the pipes the products use.
#[inline(always)]
unsafe fn min_start(blk: &Block, h: *const i16) -> __m512 {
    let mut m = _mm512_setzero_si512();
    for (p, mp) in blk.mp.iter().enumerate() {
        let x = _mm512_set1_epi32((h.add(2 * p) as *const i32).read_unaligned());
        m = _mm512_dpwssd_epi32(m, *mp, x);
    }
    _mm512_mul_ps(_mm512_cvtepi32_ps(m), blk.ndmin)
}

/// Repacked Q4_K (Q5_K: `HIGH`) rows (`out[t].len()` of them, a multiple
/// of 16; `rb` bytes per row) times `NT` tokens of a [`panel`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
unsafe fn rows_k45<const NT: usize, const HIGH: bool>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [&mut [f32]],
) {
    let nb = p.n_blocks;
    assert!(p.nt == NT && out.len() == NT && NT <= PANEL_LANES);
    assert!(p.qs.len() >= NT * nb * 256 && p.d.len() >= nb * PANEL_LANES);
    assert!(p.hxs.len() >= nb * NT * 8);
    let n = out[0].len();
    assert!(out.iter().all(|o| o.len() == n) && n.is_multiple_of(16));
    assert!(rb == nb * block_bytes(HIGH) && w.len() >= n * rb);
    let (xq, xd, xs) = (p.qs.as_ptr(), p.d.as_ptr(), p.hxs.as_ptr());
    let bytes = packed_block_bytes(HIGH);
    let mut blk: Block = std::mem::zeroed();
    for r0 in (0..n).step_by(16) {
        let mut facc = [_mm512_setzero_ps(); NT];
        for i in 0..nb {
            // one stream: the group's blocks follow each other
            let b = w.as_ptr().add(r0 * rb + bytes * i);
            unpack_packed::<HIGH>(b, &mut blk);
            let mut fsb: [__m512; NT] =
                std::array::from_fn(|t| min_start(&blk, xs.add((i * NT + t) * 8)));
            for j in 0..8 {
                // the block's lines ahead, spread over its sub-blocks (see
                // `prefetch_part`)
                super::dots::prefetch_part::<{ super::super::x86_avx2::dots::PF_STREAM }>(
                    b, bytes, j, 8,
                );
                let wv = blk.w[j];
                let a = blk.a[j];
                for t in 0..NT {
                    // columns 256i + 32j .. of token t: chunk 4i + j/2
                    let x = xq.add(64 * ((4 * i + j / 2) * NT + t) + 32 * (j % 2));
                    let mut acc = _mm512_setzero_si512();
                    for (g, wg) in wv.iter().enumerate() {
                        let xb = _mm512_set1_epi32((x.add(4 * g) as *const i32).read_unaligned());
                        acc = _mm512_dpbusd_epi32(acc, *wg, xb);
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

/// [`rows_k45`] for one token, without staging the nibbles in a
/// [`Block`]: each step's transposed bytes split into the two sub-blocks'
/// integer sums at once, the float part in [`rows_k45`]'s order (the
/// same operations on the same values: the same bits). One token does
/// little work per byte, and the staged block's stores and loads were a
/// good part of it.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
#[inline]
unsafe fn rows_k45_1<const PF: bool, const HIGH: bool>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [f32],
) {
    let nb = p.n_blocks;
    assert!(p.nt == 1 && p.qs.len() >= nb * 256 && p.d.len() >= nb * PANEL_LANES);
    assert!(p.hxs.len() >= nb * 8);
    let n = out.len();
    assert!(n.is_multiple_of(16) && rb == nb * block_bytes(HIGH) && w.len() >= n * rb);
    let (xq, xd, xs) = (p.qs.as_ptr(), p.d.as_ptr(), p.hxs.as_ptr());
    let bytes = packed_block_bytes(HIGH);
    let mut blk: Block = std::mem::zeroed();
    for r0 in (0..n).step_by(16) {
        let mut facc = _mm512_setzero_ps();
        for i in 0..nb {
            let b = w.as_ptr().add(r0 * rb + bytes * i);
            decode_heads(load16::<4>(b), &mut blk);
            let mut fsb = min_start(&blk, xs.add(i * 8));
            for st in 0..4 {
                let v = load16::<8>(b.add(steps_at(HIGH) + 512 * st));
                let mut acc = [_mm512_setzero_si512(); 2];
                for (g, v) in v.iter().enumerate() {
                    if PF {
                        super::dots::prefetch_part::<{ super::super::x86_avx2::dots::PF_STREAM }>(
                            b,
                            bytes,
                            8 * st + g,
                            32,
                        );
                    }
                    let q = values::<HIGH>(*v, fifth::<HIGH>(b, st, g));
                    for (h, q) in q.iter().enumerate() {
                        // sub-block j = 2st + h: columns 256i + 32j ..,
                        // chunk 4i + j/2 = 4i + st, half h
                        let x = xq.add(64 * (4 * i + st) + 32 * h + 4 * g);
                        let xb = _mm512_set1_epi32((x as *const i32).read_unaligned());
                        acc[h] = _mm512_dpbusd_epi32(acc[h], *q, xb);
                    }
                }
                for (h, acc) in acc.iter().enumerate() {
                    let j = 2 * st + h;
                    fsb = _mm512_fmadd_ps(_mm512_cvtepi32_ps(*acc), blk.a[j], fsb);
                }
            }
            let dx = _mm512_set1_ps(*xd.add(i * PANEL_LANES));
            facc = _mm512_fmadd_ps(fsb, dx, facc);
        }
        _mm512_storeu_ps(out.as_mut_ptr().add(r0), facc);
    }
}

/// Whether [`repack`] takes a Q4_K or Q5_K matrix of `rows` rows (its groups of
/// 16 rows must not straddle the row ranges it is used in: whole matrices,
/// experts of a multiple of 16 rows).
pub fn can_repack(rows: usize) -> bool {
    rows > 0 && rows.is_multiple_of(16)
}

/// Rewrites a Q4_K matrix (Q5_K: `HIGH`; `rows` rows of `cols` values,
/// plain GGUF blocks) in place into the layout of the rows-in-lanes
/// kernels: per group of 16 rows and per block, the 16 rows' 16-byte heads
/// as 4 vectors (dword `k` of row `r` in lane `r`), for Q5_K their fifth
/// bits as 64 byte masks (per step and 4-column group those of its two
/// vectors of values, [`fifth`]: where a masked add puts them, with no
/// test or shift to do per product), then per 64-value step their packed
/// nibbles as 8 vectors (bytes `4g..4g + 4` of row `r` in lane `r`).
/// Same size; no transposition left to do per product. The caller checks
/// the CPU has the AVX-512 level (the kernels that read this layout need
/// it).
///
/// # Panics
/// If `rows` does not pass [`can_repack`] or `data` is not `rows` rows of
/// the format.
pub fn repack<const HIGH: bool>(data: &mut [u8], rows: usize, cols: usize) {
    assert!(can_repack(rows) && cols.is_multiple_of(256));
    let nb = cols / 256;
    let rb = nb * block_bytes(HIGH);
    assert_eq!(
        data.len(),
        rows * rb,
        "repack: not {rows} {} rows of {cols}",
        if HIGH { "Q5_K" } else { "Q4_K" }
    );
    // SAFETY: AVX-512 checked by the caller.
    for_each_group(data, rb, |g, out| unsafe {
        repack_group::<HIGH>(g, rb, nb, out)
    });
}

/// Runs `f(group, out)` on each group of 16 rows of `rb` bytes (`out`: a
/// buffer of the group's size) and puts `out` in the group's place.
pub(super) fn for_each_group(data: &mut [u8], rb: usize, f: impl Fn(&[u8], &mut [u8])) {
    let mut tmp = vec![0u8; 16 * rb];
    for group in data.chunks_exact_mut(16 * rb) {
        f(group, &mut tmp);
        group.copy_from_slice(&tmp);
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
unsafe fn repack_group<const HIGH: bool>(group: &[u8], rb: usize, nb: usize, out: &mut [u8]) {
    let mut rows = [group.as_ptr(); 16];
    for (k, row) in rows.iter_mut().enumerate() {
        *row = group.as_ptr().add(k * rb);
    }
    let bsz = block_bytes(HIGH);
    for i in 0..nb {
        let o = out.as_mut_ptr().add(packed_block_bytes(HIGH) * i);
        for (k, v) in heads(&rows, bsz * i).iter().enumerate() {
            _mm512_storeu_si512(o.add(64 * k) as *mut _, *v);
        }
        if HIGH {
            // bit j of qh byte 4g + c of row r: mask (j, g)'s bit 4r + c
            for (g, v) in rows32(&rows, bsz * i + 16).iter().enumerate() {
                for j in 0..8 {
                    let k = _mm512_test_epi8_mask(*v, _mm512_set1_epi8((1u8 << j) as i8));
                    let at = o.add(256 + fifth_at(j / 2, g) + 8 * (j % 2));
                    (at as *mut u64).write_unaligned(k);
                }
            }
        }
        for s in 0..4 {
            for (g, v) in step_plain::<HIGH>(&rows, bsz * i, s).iter().enumerate() {
                _mm512_storeu_si512(o.add(steps_at(HIGH) + 512 * s + 64 * g) as *mut _, *v);
            }
        }
    }
}

/// Row `r` of a repacked matrix ([`repack`]; Q5_K: `HIGH`) back in its
/// GGUF encoding (`out`: 144 or 176 bytes per block).
pub fn unpack_row<const HIGH: bool>(data: &[u8], cols: usize, r: usize, out: &mut [u8]) {
    let nb = cols / 256;
    let (bsz, pb) = (block_bytes(HIGH), packed_block_bytes(HIGH));
    let rb = nb * bsz;
    assert_eq!(out.len(), rb);
    let (g, lane) = (r / 16, r % 16);
    let group = &data[g * 16 * rb..(g + 1) * 16 * rb];
    // (a vector of the layout at `v`: bytes `4·lane..` are the row's 4)
    let dword = |o: &mut [u8], at: usize, b: &[u8], v: usize| {
        o[at..at + 4].copy_from_slice(&b[v + 4 * lane..v + 4 * lane + 4]);
    };
    for i in 0..nb {
        let b = &group[pb * i..pb * (i + 1)];
        let o = &mut out[bsz * i..bsz * (i + 1)];
        for k in 0..4 {
            dword(o, 4 * k, b, 64 * k);
        }
        if HIGH {
            for gq in 0..8 {
                for c in 0..4 {
                    o[16 + 4 * gq + c] = (0..8)
                        .map(|j| {
                            let at = 256 + fifth_at(j / 2, gq) + 8 * (j % 2);
                            let m = u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
                            (((m >> (4 * lane + c)) & 1) as u8) << j
                        })
                        .sum();
                }
            }
        }
        for s in 0..4 {
            for gq in 0..8 {
                let at = quants_at(HIGH) + 32 * s + 4 * gq;
                dword(o, at, b, steps_at(HIGH) + 512 * s + 64 * gq);
            }
        }
    }
}

/// [`rows_k45`] over repacked rows (Q4_K, or Q5_K: `HIGH`) for a panel of
/// 1 to [`MAX_TOKENS`] tokens.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c,bmi2")]
pub(super) unsafe fn tile_packed<const HIGH: bool>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [&mut [f32]],
) {
    match p.nt {
        1 if super::dots::one_token_prefetch() => rows_k45_1::<true, HIGH>(w, rb, p, out[0]),
        1 => rows_k45_1::<false, HIGH>(w, rb, p, out[0]),
        2 => rows_k45::<2, HIGH>(w, rb, p, out),
        3 => rows_k45::<3, HIGH>(w, rb, p, out),
        4 => rows_k45::<4, HIGH>(w, rb, p, out),
        5 => rows_k45::<5, HIGH>(w, rb, p, out),
        6 => rows_k45::<6, HIGH>(w, rb, p, out),
        7 => rows_k45::<7, HIGH>(w, rb, p, out),
        8 => rows_k45::<8, HIGH>(w, rb, p, out),
        9 => rows_k45::<9, HIGH>(w, rb, p, out),
        n => panic!("tile_packed: unsupported token count {n}"),
    }
}

/// For the integer GEMM's panels: block `i`'s 32-value sub-blocks of 16
/// repacked rows (Q4_K, or Q5_K: `HIGH`) starting at `g`: per sub-block
/// `j`, `q[j]` the 8 vectors of values (columns `4k..4k + 4` of the 16
/// rows; Q5_K's with their fifth bits), `a[j]` = `d·sc_j` and `b[j]` =
/// `dmin·m_j` per row lane.
///
/// # Safety
/// AVX-512 available; `g` points at a group of a repacked matrix with more
/// than `i` blocks.
#[inline(always)]
pub(in crate::matmul) unsafe fn packed_block<const HIGH: bool>(
    g: *const u8,
    i: usize,
) -> ([[__m512i; 8]; 8], [__m512; 8], [__m512; 8]) {
    let mut blk: Block = std::mem::zeroed();
    unpack_packed::<HIGH>(g.add(packed_block_bytes(HIGH) * i), &mut blk);
    (blk.w, blk.a, blk.b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::matmul::matmul;
    use crate::matmul::scalar::dequant::dequant_row;
    use crate::matmul::weight::Layout;
    use crate::matmul::weight::WeightRef;
    use crate::simd::{detected_level, SimdLevel};
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    /// Tokens `t0..t0 + nt` of `xa` against the repacked rows `packed`.
    fn run(
        packed: &[u8],
        rb: usize,
        rows: usize,
        xa: &QuantAct,
        t0: usize,
        nt: usize,
    ) -> Vec<Vec<f32>> {
        let p = panel(xa, t0, nt);
        let mut ys = vec![vec![f32::NAN; rows]; nt];
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
        // SAFETY: AVX-512 checked by the caller.
        unsafe { tile_packed::<false>(packed, rb, &p, &mut outs) };
        ys
    }

    /// The one-token kernels of Q4_K, Q5_K and Q6_K give the same bits with
    /// and without their prefetches (`one_token_prefetch` picks one per
    /// CPU; this runs both wherever AVX-512 is).
    #[test]
    fn one_token_kernels_same_bits_with_or_without_prefetch() {
        if detected_level() < SimdLevel::Avx512 {
            return;
        }
        let (rows, cols) = (48, 1024);
        let mut rng = Rng::new(77);
        let x = rng.vec(cols);
        let xa = QuantAct::q8_k(&x, cols);
        for ty in [GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K] {
            let mut w = random_weights(&mut rng, ty, rows, cols);
            let rb = w.len() / rows;
            let (mut on, mut off) = (vec![0f32; rows], vec![1f32; rows]);
            // SAFETY: AVX-512 checked above; whole groups of 16 rows.
            unsafe {
                if ty == GgmlType::Q4_K {
                    repack::<false>(&mut w, rows, cols);
                    let p = panel(&xa, 0, 1);
                    rows_k45_1::<true, false>(&w, rb, &p, &mut on);
                    rows_k45_1::<false, false>(&w, rb, &p, &mut off);
                } else if ty == GgmlType::Q5_K {
                    repack::<true>(&mut w, rows, cols);
                    let p = panel(&xa, 0, 1);
                    rows_k45_1::<true, true>(&w, rb, &p, &mut on);
                    rows_k45_1::<false, true>(&w, rb, &p, &mut off);
                } else {
                    super::super::lanes_q6_k::repack(&mut w, rows, cols);
                    let p = super::super::lanes_q6_k::panel(&xa, 0, 1);
                    super::super::lanes_q6_k::rows_q6_k_1::<true>(&w, rb, &p, &mut on);
                    super::super::lanes_q6_k::rows_q6_k_1::<false>(&w, rb, &p, &mut off);
                }
            }
            assert!(on.iter().all(|v| v.is_finite()), "{ty}");
            assert_eq!(
                on.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                off.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{ty}"
            );
        }
    }

    /// Each row and token equals the product of the dequantized weights
    /// with the quantized activations (f64), within f32 rounding; the same
    /// bits whatever the token count (1–9) and wherever the rows start
    /// (batch invariance); the rows unpack to what they were.
    #[test]
    fn q4_k_rows_in_lanes_match_the_reference_and_are_invariant() {
        if detected_level() < SimdLevel::Avx512 {
            return;
        }
        let cols = 768;
        for rows in [16, 48] {
            let mut rng = Rng::new(5 + rows as u64);
            let plain = random_weights(&mut rng, GgmlType::Q4_K, rows, cols);
            let rb = plain.len() / rows;
            let mut packed = plain.clone();
            repack::<false>(&mut packed, rows, cols);
            assert_ne!(packed, plain);
            let mut row = vec![0u8; rb];
            for r in 0..rows {
                unpack_row::<false>(&packed, cols, r, &mut row);
                assert_eq!(row, plain[r * rb..(r + 1) * rb], "row {r}");
            }
            let x = rng.vec(12 * cols);
            let xa = QuantAct::q8_k(&x, cols);
            let nb = cols / 256;
            let mut wf = vec![0f32; cols];
            let alone: Vec<Vec<f32>> = (0..12)
                .map(|t| run(&packed, rb, rows, &xa, t, 1).remove(0))
                .collect();
            for r in 0..rows {
                assert!(dequant_row(
                    GgmlType::Q4_K,
                    &plain[r * rb..(r + 1) * rb],
                    &mut wf
                ));
                for (t, y) in alone.iter().enumerate() {
                    let want: f64 = (0..cols)
                        .map(|c| {
                            let dx = f64::from(xa.d[t * nb + c / 256]);
                            f64::from(wf[c]) * f64::from(xa.qs_row(t)[c]) * dx
                        })
                        .sum();
                    let scale: f64 = (0..cols)
                        .map(|c| (f64::from(wf[c]) * f64::from(x[t * cols + c])).abs())
                        .sum();
                    let got = f64::from(y[r]);
                    assert!(
                        (got - want).abs() <= 1e-5 * scale + 1e-6,
                        "row {r} token {t}: {got} against {want}"
                    );
                }
            }
            for nt in 2..=MAX_TOKENS {
                let t0 = 12 - nt;
                for (k, y) in run(&packed, rb, rows, &xa, t0, nt).iter().enumerate() {
                    for r in 0..rows {
                        assert_eq!(
                            y[r].to_bits(),
                            alone[t0 + k][r].to_bits(),
                            "{nt} tokens, row {r}"
                        );
                    }
                }
            }
            // from the second group of rows on: the same results
            if rows > 16 {
                let y = run(&packed[16 * rb..], rb, rows - 16, &xa, 4, 5);
                for (k, y) in y.iter().enumerate() {
                    for r in 16..rows {
                        assert_eq!(y[r - 16].to_bits(), alone[4 + k][r].to_bits());
                    }
                }
            }
        }
    }

    /// Through `matmul`: a repacked matrix gives each token's bits of the
    /// kernel alone for 1 to 13 tokens (below the integer GEMM's threshold,
    /// and in batch-invariant mode above it), the integer GEMM's on the
    /// plain rows from 12 tokens (its panels unpacked from the layout), and
    /// its rows decode as the plain ones.
    #[test]
    fn repacked_q4_k_through_matmul() {
        if detected_level() < SimdLevel::Avx512 {
            return;
        }
        let pool = crate::ThreadPool::new(2);
        let (rows, cols) = (80, 512);
        let mut rng = Rng::new(3);
        let plain = random_weights(&mut rng, GgmlType::Q4_K, rows, cols);
        let rb = plain.len() / rows;
        let mut packed = plain.clone();
        assert!(crate::matmul::repack(
            GgmlType::Q4_K,
            &mut packed,
            rows,
            cols
        ));
        let wp = WeightRef::new(GgmlType::Q4_K, &plain, rows, cols).unwrap();
        let wl = WeightRef {
            layout: Layout::Lanes16,
            ..WeightRef::new(GgmlType::Q4_K, &packed, rows, cols).unwrap()
        };
        let (mut a, mut b) = (vec![0f32; cols], vec![0f32; cols]);
        wp.dequantize_row(17, &mut a);
        wl.dequantize_row(17, &mut b);
        assert_eq!(a, b);
        let x = rng.vec(40 * cols);
        let xa = QuantAct::q8_k(&x, cols);
        let alone: Vec<Vec<f32>> = (0..40)
            .map(|t| run(&packed, rb, rows, &xa, t, 1).remove(0))
            .collect();
        for (n, invariant) in [(1, false), (3, false), (9, false), (11, false), (13, true)] {
            let _scope = crate::invariant_scope(invariant);
            let mut y = vec![0f32; n * rows];
            matmul(&pool, &wl, &x[..n * cols], &mut y, n);
            for t in 0..n {
                for r in 0..rows {
                    assert_eq!(
                        y[t * rows + r].to_bits(),
                        alone[t][r].to_bits(),
                        "{n} tokens"
                    );
                }
            }
        }
        let (mut yp, mut yl) = (vec![0f32; 40 * rows], vec![0f32; 40 * rows]);
        matmul(&pool, &wp, &x, &mut yp, 40);
        matmul(&pool, &wl, &x, &mut yl, 40);
        assert_eq!(yp, yl);
    }

    /// Q5_K: the checks of every rows-in-lanes format
    /// (`lanes_check::check`).
    #[test]
    fn q5_k_rows_in_lanes() {
        if detected_level() < SimdLevel::Avx512 {
            return;
        }
        let f = super::super::lanes_check::Format {
            ty: GgmlType::Q5_K,
            repack: repack::<true>,
            unpack_row: unpack_row::<true>,
            quantize: QuantAct::q8_k,
            act_block: 256,
            panel,
            tile: tile_packed::<true>,
        };
        super::super::lanes_check::check(&f, 768, 25);
    }
}
