//! AVX2 Q4_K and Q5_K products with eight rows in the vector lanes,
//! transposed as they are read (the file's layout stays as it is: no
//! repacking at this level). The two formats differ only by Q5_K's fifth
//! bits (`HIGH`: 32 bytes after the scales, one bit per value and
//! sub-block); their blocks' heads, scales, mins and float work are the
//! same, and the same as the AVX2 integer GEMM's (`igemm/kquant.rs`), so
//! both keep their one-token bits in a GEMM (`plan::gemm_keeps_tokens`).
//!
//! The row-at-a-time kernels (`dot_k45`, the tiles in `tiles.rs`) multiply
//! 32 values of one row per `vpmaddubsw` and need a `vpmaddwd` by the
//! sub-block's scale after each, plus a conversion and an FMA per row, block
//! and token. Here a vector holds 4 columns of 8 rows (row `r` in dword lane
//! `r`): a 32-value sub-block of 8 rows is 8 such vectors, each multiplied
//! with a broadcast of 4 activation bytes, their i16 pair sums added up in
//! i16 (8 × 2 · 15 · 128 < 2¹⁵: exact), then one `vpmaddwd` by the rows'
//! scales gives the sub-block's 8 row sums in i32. Per block and token the
//! rows' mins term is 4 more `vpmaddwd`, and one conversion, multiply and
//! two FMAs finish 8 rows. The transposition (24 shuffles per 32 bytes of 8
//! rows) and the unpacking of nibbles and scales happen once per block for
//! all the tokens ([`rows_q4_k`], 3 to 9 tokens).
//!
//! One or two tokens are bound by memory, not by these operations, and 8
//! rows read side by side are 8 streams the prefetchers follow worse than
//! the rows in order: [`rows_seq`] reads the rows one after the other, sums
//! each block exactly in i32 as the row-at-a-time kernels do, and runs the
//! float work 8 rows at a time in the lanes from those sums: the same
//! operations on the same values as [`rows_q4_k`]'s.
//!
//! Batch invariance: a row's result is computed in its own lane and a
//! token's in its own registers, with the same operations whatever the
//! number of tokens or rows in the call (a short last group repeats its last
//! row in the spare lanes), so one token (decode), a few (batched decode,
//! speculative verification) and a single row's dot product agree bit for
//! bit.
//!
//! Per block and token, row `r`: `y += dx · (d·Σ_j sc_j Σ q·qx − dmin·Σ_j m_j
//! Σ qx)` over the 8 sub-blocks `j` (`q` the nibbles, with Q5_K their
//! fifth bits, `qx` the token's Q8_K values, `dx` its scale per 256), the
//! two sums exact in i32 (Q5_K's `q` up to 31: its i16 pair sums added 4
//! groups at a time, not 8, before the `vpmaddwd` by the scale).

use super::super::act::{ActPanel, PANEL_LANES};
use std::arch::x86_64::*;

/// Rows per group: one per dword lane.
pub(super) const ROWS: usize = 8;
/// Bytes per block: Q4_K, or Q5_K (`HIGH`; the AVX-512 layout's too).
pub(in crate::matmul) const fn block(high: bool) -> usize {
    if high {
        176
    } else {
        144
    }
}

/// Where a block's nibbles start (Q5_K: after its 32 bytes of fifth bits).
pub(in crate::matmul) const fn quants_at(high: bool) -> usize {
    if high {
        48
    } else {
        16
    }
}

/// `nt` tokens' quantized activations as the rows-in-lanes kernels read
/// them: 32-value chunk `c` of token `t` at `qs + (c·nt + t)·32`, block
/// `i`'s scale at `d + i·d_stride + t`, its `g` group sums at `sums + (i·nt
/// + t)·g` (Q8_K: 16 per block of 256; Q8_0-style: 1 per 32): one token's
/// plain rows, or an [`ActPanel`] of 32-value chunks.
#[derive(Clone, Copy)]
pub(super) struct Act {
    pub qs: *const i8,
    pub d: *const f32,
    pub d_stride: usize,
    pub sums: *const i16,
}

impl Act {
    /// One token's activations as [`super::super::act::QuantAct`] holds them.
    pub(super) fn one(xq: &[i8], xd: &[f32], xs: &[i16]) -> Act {
        Act {
            qs: xq.as_ptr(),
            d: xd.as_ptr(),
            d_stride: 1,
            sums: xs.as_ptr(),
        }
    }

    /// A panel's tokens.
    pub(super) fn panel(p: &ActPanel) -> Act {
        Act {
            qs: p.qs.as_ptr(),
            d: p.d.as_ptr(),
            d_stride: PANEL_LANES,
            sums: p.sums.as_ptr(),
        }
    }
}

/// The first elements of `NT` output slices.
pub(super) fn out_ptrs<const NT: usize>(out: &mut [&mut [f32]]) -> [*mut f32; NT] {
    let mut o = [std::ptr::null_mut::<f32>(); NT];
    for (o, y) in o.iter_mut().zip(out.iter_mut()) {
        *o = y.as_mut_ptr();
    }
    o
}

/// `out[g]` holds dword `g` of each `v[r]` in lane `r`.
#[inline(always)]
pub(super) unsafe fn transpose8(v: &[__m256i; 8]) -> [__m256i; 8] {
    // pairs of rows: [r g, r' g, r g+1, r' g+1 | the same for g + 4]
    let t0 = _mm256_unpacklo_epi32(v[0], v[1]);
    let t1 = _mm256_unpackhi_epi32(v[0], v[1]);
    let t2 = _mm256_unpacklo_epi32(v[2], v[3]);
    let t3 = _mm256_unpackhi_epi32(v[2], v[3]);
    let t4 = _mm256_unpacklo_epi32(v[4], v[5]);
    let t5 = _mm256_unpackhi_epi32(v[4], v[5]);
    let t6 = _mm256_unpacklo_epi32(v[6], v[7]);
    let t7 = _mm256_unpackhi_epi32(v[6], v[7]);
    // rows 0..4 (u0..u4) and 4..8 (u4..u8) of dword g | g + 4
    let u = [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
        _mm256_unpacklo_epi64(t4, t6),
        _mm256_unpackhi_epi64(t4, t6),
        _mm256_unpacklo_epi64(t5, t7),
        _mm256_unpackhi_epi64(t5, t7),
    ];
    let mut out = [_mm256_setzero_si256(); 8];
    for g in 0..4 {
        out[g] = _mm256_permute2x128_si256::<0x20>(u[g], u[g + 4]);
        out[g + 4] = _mm256_permute2x128_si256::<0x31>(u[g], u[g + 4]);
    }
    out
}

/// `_mm256_shuffle_epi8` mask putting byte `k` of each dword (`k2` too when
/// given, else `k` again) zero-extended into both of its 16-bit halves.
#[inline(always)]
unsafe fn dword_bytes(k: i8, k2: i8) -> __m256i {
    let z = -128i8;
    let mut m = [z; 32];
    for p in 0..8 {
        let base = 4 * (p as i8 % 4);
        m[4 * p] = base + k;
        m[4 * p + 2] = base + k2;
    }
    _mm256_loadu_si256(m.as_ptr() as *const __m256i)
}

/// One block of 8 rows, unpacked for every token: the rows' `d` and `dmin`,
/// each sub-block's scales `sc_j` (both i16 halves of lane `r`), the mins of
/// sub-blocks `2k, 2k + 1` as an i16 pair per lane, and the nibbles
/// `w[j][g]`: columns `32j + 4g .. + 4` of the 8 rows, a byte each.
#[repr(C, align(32))]
struct Block {
    d: __m256,
    dmin: __m256,
    sc: [__m256i; 8],
    mins: [__m256i; 4],
    w: [[__m256i; 8]; 8],
    /// Each token's sub-block sums `sc_j Σ q·qx` (8 rows per vector),
    /// added up once all are done: in memory, so that the 8 weight vectors
    /// of a sub-block stay in registers across the tokens (with an
    /// accumulator register per token they were loaded again per token: 16
    /// loads per sub-block and token, the load ports the limit).
    res: [[__m256i; 8]; MAX_TOKENS],
}

/// Unpacks block `i` of the rows at `rows` (Q4_K, or Q5_K with `HIGH`).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn unpack<const HIGH: bool>(
    rows: &[*const u8; ROWS],
    i: usize,
    pf: *const u8,
    blk: &mut Block,
) {
    let bsz = block(HIGH);
    // (loops, not closures: a closure does not inherit the target features
    // and its intrinsics would become calls)
    let mut b = [std::ptr::null::<u8>(); ROWS];
    for r in 0..ROWS {
        b[r] = rows[r].add(bsz * i);
    }
    // the 16-byte heads (d, dmin, 12 bytes of scales): row q and q + 4 in
    // the two lanes of z[q], then dword k of every row in lane r of h[k]
    let mut z = [_mm256_setzero_si256(); 4];
    for q in 0..4 {
        let lo = _mm_loadu_si128(b[q] as *const __m128i);
        let hi = _mm_loadu_si128(b[q + 4] as *const __m128i);
        z[q] = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi);
    }
    let t0 = _mm256_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm256_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    let h0 = _mm256_unpacklo_epi64(t0, t2);
    let h1 = _mm256_unpackhi_epi64(t0, t2);
    let h2 = _mm256_unpacklo_epi64(t1, t3);
    let h3 = _mm256_unpackhi_epi64(t1, t3);
    // d (low halves) and dmin (high halves) of the 8 rows as f16 → f32
    let dd = f16_halves(h0);
    blk.d = _mm256_cvtph_ps(_mm256_castsi256_si128(dd));
    blk.dmin = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(dd));
    // the scales and mins (ggml's get_scale_min_k4, 4 bytes per lane)
    let m6 = _mm256_set1_epi8(0x3f);
    let m4 = _mm256_set1_epi8(0x0f);
    let top2 = _mm256_set1_epi8(0x30);
    let sc_lo = _mm256_and_si256(h1, m6);
    let mn_lo = _mm256_and_si256(h2, m6);
    let sc_hi = _mm256_or_si256(
        _mm256_and_si256(h3, m4),
        _mm256_and_si256(_mm256_srli_epi32(h1, 2), top2),
    );
    let mn_hi = _mm256_or_si256(
        _mm256_and_si256(_mm256_srli_epi32(h3, 4), m4),
        _mm256_and_si256(_mm256_srli_epi32(h2, 2), top2),
    );
    for k in 0..4 {
        let m = dword_bytes(k as i8, k as i8);
        blk.sc[k] = _mm256_shuffle_epi8(sc_lo, m);
        blk.sc[k + 4] = _mm256_shuffle_epi8(sc_hi, m);
    }
    for k in 0..2 {
        let m = dword_bytes(2 * k as i8, 2 * k as i8 + 1);
        blk.mins[k] = _mm256_shuffle_epi8(mn_lo, m);
        blk.mins[k + 2] = _mm256_shuffle_epi8(mn_hi, m);
    }
    // Q5_K: the fifth bits, transposed as the nibbles are (bit 2c of byte
    // l for value l of sub-block 2c, bit 2c + 1 for sub-block 2c + 1)
    let mut hb = [_mm256_setzero_si256(); 8];
    if HIGH {
        let mut v = [_mm256_setzero_si256(); 8];
        for r in 0..ROWS {
            v[r] = _mm256_loadu_si256(b[r].add(16) as *const __m256i);
        }
        hb = transpose8(&v);
    }
    // the nibbles: chunk c (bytes 16 + 32c .., Q5_K 48 + 32c ..) holds
    // sub-blocks 2c (low) and 2c + 1 (high)
    for c in 0..4 {
        // a quarter of the next group's share, spread over the block
        let mut off = c * ROWS * bsz / 4 / 64 * 64;
        while off < (c + 1) * ROWS * bsz / 4 {
            _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(off) as *const i8);
            off += 64;
        }
        let mut v = [_mm256_setzero_si256(); 8];
        for r in 0..ROWS {
            v[r] = _mm256_loadu_si256(b[r].add(quants_at(HIGH) + 32 * c) as *const __m256i);
        }
        let t = transpose8(&v);
        for g in 0..8 {
            (blk.w[2 * c][g], blk.w[2 * c + 1][g]) =
                super::dots::k45_nibbles::<HIGH>(t[g], &mut hb[g]);
        }
    }
}

/// `Σ_j m_j Σ qx` of 8 rows' block and a token (`mins[k]`: the rows' mins
/// of sub-blocks `2k`, `2k + 1` as an i16 pair per lane; `sums`: the
/// token's 16 group sums of the block), exact.
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn mins_term(mins: &[__m256i; 4], sums: *const i16) -> __m256i {
    // the sums of the token's 8 sub-blocks as i16, pairs (2k, 2k + 1) in
    // dwords 0, 1 (k = 0, 1) and 4, 5 (k = 2, 3)
    let s = _mm256_loadu_si256(sums as *const __m256i);
    let h = _mm256_hadd_epi16(s, s);
    let mut imin = _mm256_setzero_si256();
    for (k, lane) in [0, 1, 4, 5].into_iter().enumerate() {
        let xk = _mm256_permutevar8x32_epi32(h, _mm256_set1_epi32(lane));
        imin = _mm256_add_epi32(imin, _mm256_madd_epi16(mins[k], xk));
    }
    imin
}

/// A block's contribution to a token's 8 row results: `acc + dx · (d ·
/// isum − dmin · imin)`, in this order of roundings (the one every kernel
/// here shares).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn finish(
    acc: __m256,
    d: __m256,
    dmin: __m256,
    isum: __m256i,
    imin: __m256i,
    dx: f32,
) -> __m256 {
    let v = _mm256_mul_ps(d, _mm256_cvtepi32_ps(isum));
    let v = _mm256_fnmadd_ps(dmin, _mm256_cvtepi32_ps(imin), v);
    _mm256_fmadd_ps(v, _mm256_set1_ps(dx), acc)
}

/// The 8 rows' results of `NT` tokens over `nb` blocks starting at `rows`
/// (`VNNI`: each sub-block's sums by `vpdpbusd`, the caller having
/// AVX-VNNI; the same exact integers).
#[inline(always)]
unsafe fn group<const NT: usize, const VNNI: bool, const HIGH: bool>(
    rows: &[*const u8; ROWS],
    next: *const u8,
    nb: usize,
    x: Act,
    blk: &mut Block,
) -> [__m256; NT] {
    let mut facc = [_mm256_setzero_ps(); NT];
    // the next group's stretch of memory, into L2 one block's share at a time
    let share = ROWS * block(HIGH);
    for i in 0..nb {
        unpack::<HIGH>(rows, i, next.wrapping_add(share * i), blk);
        for j in 0..8 {
            let w = blk.w[j];
            let sc = blk.sc[j];
            // the scale as an i32 (it sits in both i16 halves)
            let sc32 = _mm256_and_si256(sc, _mm256_set1_epi32(0xFFFF));
            for t in 0..NT {
                let xp = x.qs.add(((8 * i + j) * NT + t) * 32) as *const i32;
                let p = if VNNI {
                    let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    for g in (0..8).step_by(2) {
                        let xa = _mm256_set1_epi32(xp.add(g).read_unaligned());
                        let xb = _mm256_set1_epi32(xp.add(g + 1).read_unaligned());
                        a = _mm256_dpbusd_avx_epi32(a, w[g], xa);
                        b = _mm256_dpbusd_avx_epi32(b, w[g + 1], xb);
                    }
                    _mm256_mullo_epi32(_mm256_add_epi32(a, b), sc32)
                } else if HIGH {
                    // q ≤ 31: 4 groups' pair sums at most in i16
                    let mut h = [_mm256_setzero_si256(); 2];
                    for (k, h) in h.iter_mut().enumerate() {
                        let xg = _mm256_set1_epi32(xp.add(4 * k).read_unaligned());
                        let mut a = _mm256_maddubs_epi16(w[4 * k], xg);
                        for g in 4 * k + 1..4 * k + 4 {
                            let xg = _mm256_set1_epi32(xp.add(g).read_unaligned());
                            a = _mm256_add_epi16(a, _mm256_maddubs_epi16(w[g], xg));
                        }
                        *h = _mm256_madd_epi16(a, sc);
                    }
                    _mm256_add_epi32(h[0], h[1])
                } else {
                    let mut a = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(xp.read_unaligned()));
                    for g in 1..8 {
                        let xg = _mm256_set1_epi32(xp.add(g).read_unaligned());
                        a = _mm256_add_epi16(a, _mm256_maddubs_epi16(w[g], xg));
                    }
                    _mm256_madd_epi16(a, sc)
                };
                blk.res[t][j] = p;
            }
        }
        let mut isum = [_mm256_setzero_si256(); NT];
        for (t, s) in isum.iter_mut().enumerate() {
            let r = &blk.res[t];
            let a = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
            let b = _mm256_add_epi32(_mm256_add_epi32(r[4], r[5]), _mm256_add_epi32(r[6], r[7]));
            *s = _mm256_add_epi32(a, b);
        }
        for (t, f) in facc.iter_mut().enumerate() {
            let imin = mins_term(&blk.mins, x.sums.add((i * NT + t) * 16));
            let dx = *x.d.add(i * x.d_stride + t);
            *f = finish(*f, blk.d, blk.dmin, isum[t], imin, dx);
        }
    }
    facc
}

/// Rows `0..n` of `w` (`rb` bytes each, `nb` blocks) times `NT` tokens into
/// `out[t][0..n]`.
#[inline(always)]
unsafe fn rows_q4_k<const NT: usize, const VNNI: bool, const HIGH: bool>(
    w: *const u8,
    rb: usize,
    n: usize,
    nb: usize,
    x: Act,
    out: [*mut f32; NT],
) {
    let mut blk: Block = std::mem::zeroed();
    let mut r0 = 0;
    while r0 < n {
        let mut rows = [w; ROWS];
        for (r, p) in rows.iter_mut().enumerate() {
            *p = w.add((r0 + r).min(n - 1) * rb);
        }
        let next = w.wrapping_add((r0 + 4 * ROWS) * rb);
        let f = group::<NT, VNNI, HIGH>(&rows, next, nb, x, &mut blk);
        store_rows(&f, out, r0, n);
        r0 += ROWS;
    }
}

/// [`rows_q4_k`] with `vpdpbusd` (one instruction for a `vpmaddubsw` and a
/// `vpaddw`, then a `vpmulld` by the scale instead of a `vpmaddwd`).
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn rows_q4_k_vnni<const NT: usize, const HIGH: bool>(
    w: *const u8,
    rb: usize,
    n: usize,
    nb: usize,
    x: Act,
    out: [*mut f32; NT],
) {
    rows_q4_k::<NT, true, HIGH>(w, rb, n, nb, x, out)
}

/// A block's partial sums `Σ_j sc_j Σ q·qx` (4 lanes per row) for one
/// token: rows `q` and `q + 4` side by side at `[q]`.
type Part = [[__m128i; 2]; 4];

/// The heads of 8 rows' block: `d | dmin << 16`, and the 8 mins bytes of
/// each row in the slots [`MIN_SLOT`] gives.
#[derive(Clone, Copy)]
struct Heads {
    dd: [u32; ROWS],
    mins: [u64; ROWS],
}

/// Row `r`'s slot in [`Heads::mins`]: rows 0, 1, 4, 5 in the first 32
/// bytes, 2, 3, 6, 7 in the next, so that one shuffle of each and an
/// unpack put the 8 rows in order ([`rows_mins`]).
const MIN_SLOT: [usize; ROWS] = [0, 1, 4, 5, 2, 3, 6, 7];

/// The rows' mins of sub-blocks `2k, 2k + 1` as i16 pairs, row `r` in lane
/// `r` (as [`Block::mins`]), from [`Heads::mins`].
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn rows_mins(m: &[u64; ROWS]) -> [__m256i; 4] {
    let a = _mm256_loadu_si256(m.as_ptr() as *const __m256i);
    let b = _mm256_loadu_si256(m.as_ptr().add(4) as *const __m256i);
    let mut out = [_mm256_setzero_si256(); 4];
    for (k, o) in out.iter_mut().enumerate() {
        // bytes 2k, 2k + 1 of both qwords of a lane, zero-extended to i16
        let z = -128i8;
        let (c, e) = (2 * k as i8, 2 * k as i8 + 1);
        let l = [c, z, e, z, 8 + c, z, 8 + e, z, z, z, z, z, z, z, z, z];
        let mut pat = [0i8; 32];
        pat[..16].copy_from_slice(&l);
        pat[16..].copy_from_slice(&l);
        let pat = _mm256_loadu_si256(pat.as_ptr() as *const __m256i);
        // [r0 r1 . . | r4 r5 . .] and [r2 r3 . . | r6 r7 . .]
        *o = _mm256_unpacklo_epi64(_mm256_shuffle_epi8(a, pat), _mm256_shuffle_epi8(b, pat));
    }
    out
}

/// Row block `b` (of row `r` of the group) against block `i` of `NT`
/// tokens: partial sums of `Σ_j sc_j Σ q·qx` in 4 lanes (`part[t]`), exact;
/// returns the row's 8 mins (bytes).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn block_sums<const NT: usize, const HIGH: bool>(
    b: *const u8,
    x: Act,
    i: usize,
    r: usize,
    part: &mut [Part],
) -> u64 {
    let (sc, mn) = crate::matmul::scalar::dequant::scales_mins_k4_words(
        std::slice::from_raw_parts(b.add(4), 12),
    );
    let sp = super::dots::k4_scale_lanes(sc);
    let qs = b.add(quants_at(HIGH));
    let mut hbits = if HIGH {
        _mm256_loadu_si256(b.add(16) as *const __m256i)
    } else {
        _mm256_setzero_si256()
    };
    let mut iacc = [_mm256_setzero_si256(); NT];
    for j in 0..4 {
        let q = _mm256_loadu_si256(qs.add(32 * j) as *const __m256i);
        let (lo, hi) = super::dots::k45_nibbles::<HIGH>(q, &mut hbits);
        let (sl, sh) = (
            super::dots::k4_scale(sp, 2 * j),
            super::dots::k4_scale(sp, 2 * j + 1),
        );
        for (t, acc) in iacc.iter_mut().enumerate() {
            // chunks 8i + 2j and 8i + 2j + 1 of token t
            let x0 = x.qs.add(((8 * i + 2 * j) * NT + t) * 32);
            let xl = _mm256_loadu_si256(x0 as *const __m256i);
            let xh = _mm256_loadu_si256(x0.add(32 * NT) as *const __m256i);
            let pl = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, xl), sl);
            let ph = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xh), sh);
            *acc = _mm256_add_epi32(*acc, _mm256_add_epi32(pl, ph));
        }
    }
    let (q, h) = (r % 4, r / 4);
    for t in 0..NT {
        let a = iacc[t];
        part[t][q][h] = _mm_add_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256::<1>(a));
    }
    mn
}

/// The 8 rows' sums from their 4-lane partial sums: `p` holds row `q`'s
/// partials beside row `q + 4`'s, as `[__m128i; 2]` at `p[q]`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn row_sums(p: &[[__m128i; 2]; 4]) -> __m256i {
    let y0 = _mm256_loadu_si256(p[0].as_ptr() as *const __m256i);
    let y1 = _mm256_loadu_si256(p[1].as_ptr() as *const __m256i);
    let y2 = _mm256_loadu_si256(p[2].as_ptr() as *const __m256i);
    let y3 = _mm256_loadu_si256(p[3].as_ptr() as *const __m256i);
    _mm256_hadd_epi32(_mm256_hadd_epi32(y0, y1), _mm256_hadd_epi32(y2, y3))
}

/// [`Part`]s of blocks × tokens that [`rows_seq`] keeps on the stack (rows
/// of up to 16384 values for one token; more go to the heap).
const STACK_PARTS: usize = 64;

/// Rows `0..n` of `w` (`rb` bytes each, `nb` blocks) times `NT` tokens into
/// `out[t][0..n]`, reading the rows one after the other, as the file stores
/// them: one stream for the prefetchers (reading 8 rows side by side, as
/// [`rows_q4_k`] does, streamed one token's weights at 19–20 GB/s where the
/// rows in order go at 24–26 on the Intel Xeon model 167, 2 threads). Each
/// block's exact partial sums and the rows' `d`, `dmin` go to a buffer, then
/// the float work runs 8 rows at a time in the lanes, as [`rows_q4_k`]'s:
/// the same bits.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_seq<const NT: usize, const HIGH: bool>(
    w: *const u8,
    rb: usize,
    n: usize,
    nb: usize,
    x: Act,
    out: [*mut f32; NT],
) {
    // per block and token the rows' partial sums, per block their heads. On
    // the stack and uninitialized: every entry read is written first for
    // each group (a buffer allocated or zeroed per call cost 5-25% of the
    // kernel's speed).
    let mut part_buf = std::mem::MaybeUninit::<[Part; STACK_PARTS]>::uninit();
    let mut heads_buf = std::mem::MaybeUninit::<[Heads; STACK_PARTS]>::uninit();
    let mut part_vec = Vec::new();
    let mut heads_vec = Vec::new();
    let (part, heads): (&mut [Part], &mut [Heads]) = if nb * NT <= STACK_PARTS {
        (
            std::slice::from_raw_parts_mut(part_buf.as_mut_ptr() as *mut Part, nb * NT),
            std::slice::from_raw_parts_mut(heads_buf.as_mut_ptr() as *mut Heads, nb),
        )
    } else {
        part_vec.resize(nb * NT, [[_mm_setzero_si128(); 2]; 4]);
        let zero = Heads {
            dd: [0; ROWS],
            mins: [0; ROWS],
        };
        heads_vec.resize(nb, zero);
        (&mut part_vec[..], &mut heads_vec[..])
    };
    let mut r0 = 0;
    while r0 < n {
        for r in 0..ROWS {
            let row = w.add((r0 + r).min(n - 1) * rb);
            for i in 0..nb {
                let b = row.add(block(HIGH) * i);
                super::dots::prefetch_block(b.wrapping_add(super::dots::PF_STREAM), block(HIGH));
                super::dots::prefetch_far(b, block(HIGH));
                // (unchecked: i < nb, r < 8, and the buffers hold nb blocks)
                let p = part.get_unchecked_mut(i * NT..(i + 1) * NT);
                let mn = block_sums::<NT, HIGH>(b, x, i, r, p);
                let hd = heads.get_unchecked_mut(i);
                *hd.mins.get_unchecked_mut(MIN_SLOT[r]) = mn;
                *hd.dd.get_unchecked_mut(r) = (b as *const u32).read_unaligned();
            }
        }
        let mut f = [_mm256_setzero_ps(); NT];
        for i in 0..nb {
            let hd = f16_halves(_mm256_loadu_si256(heads[i].dd.as_ptr() as *const __m256i));
            let d = _mm256_cvtph_ps(_mm256_castsi256_si128(hd));
            let dmin = _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(hd));
            let mins = rows_mins(&heads[i].mins);
            for (t, f) in f.iter_mut().enumerate() {
                let imin = mins_term(&mins, x.sums.add((i * NT + t) * 16));
                let dx = *x.d.add(i * x.d_stride + t);
                *f = finish(*f, d, dmin, row_sums(&part[i * NT + t]), imin, dx);
            }
        }
        store_rows(&f, out, r0, n);
        r0 += ROWS;
    }
}

/// Rows `r0..min(r0 + 8, n)` of each token's results (lane `r` = row `r0 +
/// r`) into `out[t]`.
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn store_rows<const NT: usize>(
    f: &[__m256; NT],
    out: [*mut f32; NT],
    r0: usize,
    n: usize,
) {
    let m = ROWS.min(n - r0);
    for t in 0..NT {
        let mut v = [0f32; ROWS];
        _mm256_storeu_ps(v.as_mut_ptr(), f[t]);
        std::ptr::copy_nonoverlapping(v.as_ptr(), out[t].add(r0), m);
    }
}

/// One token: rows `0..out.len()` of `w` (decode), the same bits per row as
/// the tiles'.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_one<const HIGH: bool>(
    w: &[u8],
    rb: usize,
    xq: &[i8],
    xd: &[f32],
    xs: &[i16],
    out: &mut [f32],
) {
    let n = out.len();
    let nb = rb / block(HIGH);
    assert!(
        rb.is_multiple_of(block(HIGH)) && w.len() >= n * rb && xq.len() >= nb * 256,
        "{} rows: bad shapes",
        if HIGH { "Q5_K" } else { "Q4_K" }
    );
    assert!(xd.len() >= nb && xs.len() >= nb * 16);
    if n == 0 {
        return;
    }
    let x = Act::one(xq, xd, xs);
    rows_seq::<1, HIGH>(w.as_ptr(), rb, n, nb, x, [out.as_mut_ptr()]);
}

/// The low 16 bits of 8 dwords in the low 128 bits, the high ones in the
/// high 128 bits (each in lane order).
#[target_feature(enable = "avx2")]
#[inline]
pub(super) unsafe fn f16_halves(v: __m256i) -> __m256i {
    let idx = _mm256_setr_epi8(
        0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7,
        10, 11, 14, 15,
    );
    _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(v, idx))
}

/// One row's dot product with one token: [`rows_one`] for a single row.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot<const HIGH: bool>(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut y = [0f32];
    rows_one::<HIGH>(row, row.len(), xq, xd, xs, &mut y);
    y[0]
}

/// `NT` tokens of a panel (32-value chunks): rows `0..out[0].len()` of `w`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_n<const HIGH: bool, const NT: usize>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [&mut [f32]],
) {
    assert!(p.nt == NT && out.len() == NT && NT <= PANEL_LANES);
    let n = out[0].len();
    let nb = p.n_blocks;
    assert!(out.iter().all(|o| o.len() == n) && rb == nb * block(HIGH) && w.len() >= n * rb);
    assert!(
        p.qs.len() >= NT * nb * 256
            && p.d.len() >= nb * PANEL_LANES
            && p.sums.len() >= nb * NT * 16
    );
    if n == 0 {
        return;
    }
    let (x, o) = (Act::panel(p), out_ptrs::<NT>(out));
    if NT <= SEQ_TOKENS {
        rows_seq::<NT, HIGH>(w.as_ptr(), rb, n, nb, x, o);
    } else {
        if crate::simd::avx_vnni() {
            rows_q4_k_vnni::<NT, HIGH>(w.as_ptr(), rb, n, nb, x, o);
        } else {
            rows_q4_k::<NT, false, HIGH>(w.as_ptr(), rb, n, nb, x, o);
        }
    }
}

/// Most tokens that go through [`rows_seq`] (more through [`rows_q4_k`]).
const SEQ_TOKENS: usize = 2;

/// Most tokens per call: a panel's (16; a verification of 8 drafts takes 9).
pub(super) const MAX_TOKENS: usize = PANEL_LANES;

/// The few-token entry: 1 to [`MAX_TOKENS`] tokens of a panel.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile<const HIGH: bool>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [&mut [f32]],
) {
    by_token_count!(
        p.nt,
        tile_n<{ HIGH }>,
        if HIGH { "Q5_K" } else { "Q4_K" },
        (w, rb, p, out),
        16
    )
}

#[cfg(test)]
mod tests {
    use super::super::super::act::{ActPanel, QuantAct};
    use crate::simd::{detected_level, SimdLevel};
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    /// Rows read in order (one token, and up to [`super::SEQ_TOKENS`]) and
    /// read side by side (more tokens) give each row the same bits, and they
    /// match an f64 dot product of the dequantized row with the quantized
    /// activations: rows in several groups, a short last group, chunks of
    /// rows that start past a group boundary; Q4_K and Q5_K.
    #[test]
    fn in_order_and_side_by_side_agree() {
        if detected_level() < SimdLevel::Avx2 {
            return;
        }
        agree::<false>(GgmlType::Q4_K);
        agree::<true>(GgmlType::Q5_K);
    }

    fn agree<const HIGH: bool>(ty: GgmlType) {
        let (rows, cols) = (29, 1024);
        let mut rng = Rng::new(5);
        let data = random_weights(&mut rng, ty, rows, cols);
        let rb = cols / 256 * super::block(HIGH);
        let nt = 5;
        let x = rng.vec(nt * cols);
        let xa = QuantAct::q8_k(&x, cols);
        let nb = cols / 256;
        // one token at a time over rows 3..29 (a chunk not starting a group)
        let mut one = vec![vec![0f32; rows - 3]; nt];
        for (t, y) in one.iter_mut().enumerate() {
            let (q, d, s) = (
                xa.qs_row(t),
                &xa.d[t * nb..(t + 1) * nb],
                &xa.sums[t * nb * 16..(t + 1) * nb * 16],
            );
            // SAFETY: the test returned above without AVX2.
            unsafe { super::rows_one::<HIGH>(&data[3 * rb..], rb, q, d, s, y) };
            let mut deq = vec![0f32; cols];
            for (r, &got) in y.iter().enumerate() {
                let row = &data[(3 + r) * rb..(4 + r) * rb];
                assert!(super::super::super::dequant::dequant_row(ty, row, &mut deq));
                let want: f64 = (0..cols)
                    .map(|c| deq[c] as f64 * q[c] as f64 * d[c / 256] as f64)
                    .sum();
                assert!(
                    (got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "row {} token {t}: {got} vs {want}",
                    3 + r
                );
            }
        }
        // both integer paths of the side-by-side kernel (whichever the tile
        // picks below), 3 and 5 tokens
        let side = |k: usize, vnni: bool| {
            let panel = ActPanel::new(&xa, 0, k, 256, 16, 32);
            let mut ys = vec![vec![f32::NAN; rows - 3]; k];
            let x = super::Act::panel(&panel);
            let (w, n) = (data[3 * rb..].as_ptr(), rows - 3);
            // SAFETY: AVX2 checked above, AVX-VNNI by the caller.
            unsafe {
                match (k, vnni) {
                    (3, false) => super::rows_q4_k::<3, false, HIGH>(
                        w,
                        rb,
                        n,
                        nb,
                        x,
                        [0, 1, 2].map(|t| ys[t].as_mut_ptr()),
                    ),
                    (3, true) => super::rows_q4_k_vnni::<3, HIGH>(
                        w,
                        rb,
                        n,
                        nb,
                        x,
                        [0, 1, 2].map(|t| ys[t].as_mut_ptr()),
                    ),
                    (5, false) => super::rows_q4_k::<5, false, HIGH>(
                        w,
                        rb,
                        n,
                        nb,
                        x,
                        [0, 1, 2, 3, 4].map(|t| ys[t].as_mut_ptr()),
                    ),
                    (5, true) => super::rows_q4_k_vnni::<5, HIGH>(
                        w,
                        rb,
                        n,
                        nb,
                        x,
                        [0, 1, 2, 3, 4].map(|t| ys[t].as_mut_ptr()),
                    ),
                    _ => unreachable!(),
                }
            }
            ys
        };
        let mut paths = vec![false];
        if std::arch::is_x86_feature_detected!("avxvnni") {
            paths.push(true);
        }
        for k in [3, 5] {
            for &v in &paths {
                let ys = side(k, v);
                for t in 0..k {
                    for r in 0..rows - 3 {
                        assert_eq!(
                            ys[t][r].to_bits(),
                            one[t][r].to_bits(),
                            "{k} tokens (VNNI {v}), row {r}, token {t}"
                        );
                    }
                }
            }
        }
        for k in 1..=nt {
            let panel = ActPanel::new(&xa, 0, k, 256, 16, 32);
            let mut ys = vec![vec![f32::NAN; rows - 3]; k];
            let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
            // SAFETY: as above.
            unsafe { super::tile::<HIGH>(&data[3 * rb..], rb, &panel, &mut outs) };
            for t in 0..k {
                for r in 0..rows - 3 {
                    assert_eq!(
                        ys[t][r].to_bits(),
                        one[t][r].to_bits(),
                        "{k} tokens, row {r}, token {t}"
                    );
                }
            }
        }
    }
}
