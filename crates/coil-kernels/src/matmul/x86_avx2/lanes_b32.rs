//! AVX2 products of the 32-value formats (Q8_0, Q4_0, IQ4_NL, Q5_0, Q4_1,
//! Q5_1) with eight rows in the vector lanes, as `lanes.rs` does for Q4_K:
//! 3 to 16 tokens read 8 rows side by side, each block unpacked to 32
//! bytes per row ([`Block32::quants`]: the signed quants, or unsigned ones
//! whose offset's product is subtracted from the exact sum) and transposed
//! (a vector holds 4 columns of 8 rows, multiplied with a broadcast of 4
//! activation bytes); two tokens read the rows in order ([`rows_seq`]); one token
//! reads 8 rows far apart, one from each eighth of the matrix
//! ([`rows_far`]). Either way each block's product is an exact i32 per row
//! and token, and the float work — `acc += cvt(Σ q·qx) · (d · dx)` per
//! block, then for the formats with a min `acc += m · (dx · Σ qx)` — runs
//! 8 rows at a time in the lanes: the same bits per row whatever the
//! number of tokens or rows in the call, and the same as the AVX2 integer
//! GEMM's (`igemm/scale32.rs`: the same exact sums, the same roundings in
//! the same order), so these formats keep their one-token bits in a GEMM
//! too (`plan::gemm_keeps_tokens`).
//!
//! The row-at-a-time kernels convert and scale 8 partial sums per row,
//! block and token, and keep two f32 accumulators per token, so at most 4
//! tokens per pass; here a block of 8 rows and a token take 8 `vpmaddubsw`
//! (`vpdpbusd` with AVX-VNNI, the quants offset to unsigned and the
//! offset's product subtracted after) and one conversion and FMA.
//!
//! One token (`coil serve`'s decode, which stays in the lanes whatever the
//! number of sequences): reading the rows in order, the sums went through
//! a buffer and a transpose, at ~92% of the read bandwidth against the
//! row-at-a-time kernel's ~97%; 8 far-apart streams gathered by `vphaddd`
//! close that (AMD EPYC Zen 3, hybrid-350m-like Q8_0, one request through
//! `coil serve` against `coil bench`'s row kernel, `serve-bench.sh -s
//! pair`, medians of 4: 0.895 / 0.908 → 1.010 / 1.071).

use super::super::act::{ActPanel, PANEL_LANES};

use super::dots::{iq4nl_table, nibbles};
use super::lanes::{out_ptrs, store_rows, transpose8, Act, ROWS};
use super::legacy::fifth_bits;
use std::arch::x86_64::*;

/// A format of 32-value blocks as these kernels read it: `d` an f16 at
/// byte 0, `w = d·q` (or `d·q + m` with [`Block32::MIN`]), `q` whole
/// numbers in −128..127.
pub(super) trait Block32 {
    /// Bytes per block.
    const BYTES: usize;
    /// `w = d·q + m`, the min `m` an f16 at byte 2 (Q4_1, Q5_1).
    const MIN: bool;
    /// The name in messages.
    const NAME: &'static str;
    /// `q = u − OFFSET` with `u` unsigned (at most 31): [`Block32::quants`]
    /// gives `u`, multiplied by `vpmaddubsw` as it is, and the kernels
    /// subtract `OFFSET · Σ qx` from the exact sum (Q4_0: 8, Q5_0: 16; Q4_1,
    /// Q5_1: 0). Else `quants` gives `q` itself (Q8_0, IQ4_NL), its sign
    /// moved onto the activations.
    const UNSIGNED: bool;
    const OFFSET: i32;
    /// The 32 `q` (or `u`) of the block at `b`, as bytes in column order.
    ///
    /// # Safety
    /// `b` holds a block; AVX2 available (inlined into the callers).
    unsafe fn quants(b: *const u8) -> __m256i;
}

/// Q8_0: `q` stored as bytes.
pub(super) struct Q8_0;
/// Q4_0: nibbles, `q − 8`.
pub(super) struct Q4_0;
/// IQ4_NL: nibbles through its table.
pub(super) struct Iq4Nl;
/// Q5_0: nibbles and a fifth bit, `q − 16`.
pub(super) struct Q5_0;
/// Q4_1: nibbles, a min.
pub(super) struct Q4_1;
/// Q5_1: nibbles and a fifth bit, a min.
pub(super) struct Q5_1;

impl Block32 for Q8_0 {
    const BYTES: usize = 34;
    const MIN: bool = false;
    const NAME: &'static str = "Q8_0";
    const UNSIGNED: bool = false;
    const OFFSET: i32 = 0;
    #[inline(always)]
    unsafe fn quants(b: *const u8) -> __m256i {
        _mm256_loadu_si256(b.add(2) as *const __m256i)
    }
}

impl Block32 for Q4_0 {
    const BYTES: usize = 18;
    const MIN: bool = false;
    const NAME: &'static str = "Q4_0";
    const UNSIGNED: bool = true;
    const OFFSET: i32 = 8;
    #[inline(always)]
    unsafe fn quants(b: *const u8) -> __m256i {
        nibbles(b.add(2))
    }
}

impl Block32 for Iq4Nl {
    const BYTES: usize = 18;
    const MIN: bool = false;
    const NAME: &'static str = "IQ4_NL";
    const UNSIGNED: bool = false;
    const OFFSET: i32 = 0;
    #[inline(always)]
    unsafe fn quants(b: *const u8) -> __m256i {
        _mm256_shuffle_epi8(iq4nl_table(), nibbles(b.add(2)))
    }
}

impl Block32 for Q5_0 {
    const BYTES: usize = 22;
    const MIN: bool = false;
    const NAME: &'static str = "Q5_0";
    const UNSIGNED: bool = true;
    const OFFSET: i32 = 16;
    #[inline(always)]
    unsafe fn quants(b: *const u8) -> __m256i {
        _mm256_or_si256(
            nibbles(b.add(6)),
            fifth_bits((b.add(2) as *const u32).read_unaligned()),
        )
    }
}

impl Block32 for Q4_1 {
    const BYTES: usize = 20;
    const MIN: bool = true;
    const NAME: &'static str = "Q4_1";
    const UNSIGNED: bool = true;
    const OFFSET: i32 = 0;
    #[inline(always)]
    unsafe fn quants(b: *const u8) -> __m256i {
        nibbles(b.add(4))
    }
}

impl Block32 for Q5_1 {
    const BYTES: usize = 24;
    const MIN: bool = true;
    const NAME: &'static str = "Q5_1";
    const UNSIGNED: bool = true;
    const OFFSET: i32 = 0;
    #[inline(always)]
    unsafe fn quants(b: *const u8) -> __m256i {
        _mm256_or_si256(
            nibbles(b.add(8)),
            fifth_bits((b.add(4) as *const u32).read_unaligned()),
        )
    }
}

/// Most tokens per call: a panel's (16; a verification of 8 drafts takes 9).
pub(super) const MAX_TOKENS: usize = PANEL_LANES;

/// Most tokens that go through [`rows_seq`] (more through [`rows_side`]).
const SEQ_TOKENS: usize = 2;

/// A block's contribution to a token's 8 row results: `acc + cvt(isum) ·
/// (d · dx)`, then with a min `+ m · (dx · sx)` (`sx = Σ qx`): the one
/// order of roundings every path here and the AVX2 integer GEMM share.
#[inline(always)]
unsafe fn finish<F: Block32>(
    acc: __m256,
    d: __m256,
    isum: __m256i,
    dx: f32,
    m: __m256,
    sx: i16,
) -> __m256 {
    let s = _mm256_mul_ps(d, _mm256_set1_ps(dx));
    let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), s, acc);
    if F::MIN {
        _mm256_fmadd_ps(m, _mm256_set1_ps(dx * f32::from(sx)), acc)
    } else {
        acc
    }
}

/// Token `k`'s activation sum `Σ qx` of a block (`k` = block · tokens +
/// token) where the format has a min or an offset (else 0, not read).
#[inline(always)]
unsafe fn sx<F: Block32>(x: Act, k: usize) -> i16 {
    if F::MIN || F::OFFSET != 0 {
        *x.sums.add(k)
    } else {
        0
    }
}

/// `isum − OFFSET · sx` ([`Block32::OFFSET`]): `Σ q·qx` from `Σ u·qx`.
#[inline(always)]
unsafe fn offset<F: Block32>(isum: __m256i, sx: i16) -> __m256i {
    if F::OFFSET != 0 {
        _mm256_sub_epi32(isum, _mm256_set1_epi32(F::OFFSET * i32::from(sx)))
    } else {
        isum
    }
}

/// One block's `vpmaddubsw` operands for the weights `wq` and activations
/// `xv`: `(u, qx)` as they are ([`Block32::UNSIGNED`]) or `(|q|, ±qx)`.
#[inline(always)]
unsafe fn operands<F: Block32>(wq: __m256i, xv: __m256i) -> (__m256i, __m256i) {
    if F::UNSIGNED {
        (wq, xv)
    } else {
        (_mm256_abs_epi8(wq), _mm256_sign_epi8(xv, wq))
    }
}

/// The rows' mins of the block at byte `off` ([`Block32::MIN`]; else
/// zeros, not read).
#[inline(always)]
unsafe fn mins<F: Block32>(rows: &[*const u8; ROWS], off: usize) -> __m256 {
    if F::MIN {
        scales(rows, off + 2)
    } else {
        _mm256_setzero_ps()
    }
}

/// 8 rows side by side: the rows' results of `NT` tokens over `nb` blocks
/// (`VNNI`: the caller has AVX-VNNI).
#[inline(always)]
unsafe fn rows_side<F: Block32, const NT: usize, const VNNI: bool>(
    w: *const u8,
    rb: usize,
    n: usize,
    nb: usize,
    x: Act,
    out: [*mut f32; NT],
) {
    let ones = _mm256_set1_epi16(1);
    let bias = _mm256_set1_epi8(-128);
    let mut r0 = 0;
    while r0 < n {
        let mut rows = [w; ROWS];
        for (r, p) in rows.iter_mut().enumerate() {
            *p = w.add((r0 + r).min(n - 1) * rb);
        }
        // the next group's stretch of memory, into L2 a block's share at a time
        let next = w.wrapping_add((r0 + ROWS) * rb);
        let mut facc = [_mm256_setzero_ps(); NT];
        for i in 0..nb {
            let pf = next.wrapping_add(ROWS * F::BYTES * i);
            _mm_prefetch::<_MM_HINT_T1>(pf as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(64) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(128) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(ROWS * F::BYTES - 1) as *const i8);
            let mut v = [_mm256_setzero_si256(); 8];
            for r in 0..ROWS {
                v[r] = F::quants(rows[r].add(F::BYTES * i));
            }
            let q = transpose8(&v);
            let d = scales(&rows, F::BYTES * i);
            let m = mins::<F>(&rows, F::BYTES * i);
            if VNNI {
                // Σ (q + 128)·qx − 128 Σ qx (unsigned: Σ u·qx − OFFSET Σ qx)
                let mut u = q;
                if !F::UNSIGNED {
                    for u in u.iter_mut() {
                        *u = _mm256_xor_si256(*u, bias);
                    }
                }
                for (t, f) in facc.iter_mut().enumerate() {
                    let xp = x.qs.add((i * NT + t) * 32) as *const i32;
                    let (mut a, mut b) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                    for g in (0..8).step_by(2) {
                        let xa = _mm256_set1_epi32(xp.add(g).read_unaligned());
                        let xb = _mm256_set1_epi32(xp.add(g + 1).read_unaligned());
                        a = _mm256_dpbusd_avx_epi32(a, u[g], xa);
                        b = _mm256_dpbusd_avx_epi32(b, u[g + 1], xb);
                    }
                    let sx = *x.sums.add(i * NT + t);
                    let isum = if F::UNSIGNED {
                        offset::<F>(_mm256_add_epi32(a, b), sx)
                    } else {
                        let s7 = _mm256_set1_epi32(i32::from(sx) << 7);
                        _mm256_sub_epi32(_mm256_add_epi32(a, b), s7)
                    };
                    *f = finish::<F>(*f, d, isum, *x.d.add(i * x.d_stride + t), m, sx);
                }
            } else {
                let mut qa = q;
                if !F::UNSIGNED {
                    for a in qa.iter_mut() {
                        *a = _mm256_abs_epi8(*a);
                    }
                }
                for (t, f) in facc.iter_mut().enumerate() {
                    let xp = x.qs.add((i * NT + t) * 32) as *const i32;
                    let mut isum = _mm256_setzero_si256();
                    for g in 0..8 {
                        let mut xg = _mm256_set1_epi32(xp.add(g).read_unaligned());
                        if !F::UNSIGNED {
                            xg = _mm256_sign_epi8(xg, q[g]);
                        }
                        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(qa[g], xg), ones);
                        isum = _mm256_add_epi32(isum, p);
                    }
                    let (dx, sx) = (*x.d.add(i * x.d_stride + t), sx::<F>(x, i * NT + t));
                    *f = finish::<F>(*f, d, offset::<F>(isum, sx), dx, m, sx);
                }
            }
        }
        store_rows(&facc, out, r0, n);
        r0 += ROWS;
    }
}

/// [`rows_side`] with AVX-VNNI.
#[target_feature(enable = "avx2,fma,f16c,avxvnni")]
unsafe fn rows_side_vnni<F: Block32, const NT: usize>(
    w: *const u8,
    rb: usize,
    n: usize,
    nb: usize,
    x: Act,
    out: [*mut f32; NT],
) {
    rows_side::<F, NT, true>(w, rb, n, nb, x, out)
}

/// [`rows_side`] without.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn rows_side_plain<F: Block32, const NT: usize>(
    w: *const u8,
    rb: usize,
    n: usize,
    nb: usize,
    x: Act,
    out: [*mut f32; NT],
) {
    rows_side::<F, NT, false>(w, rb, n, nb, x, out)
}

/// Blocks `i..i + K` (`K` = 8, or at most 4) of row `r` of [`rows_seq`]'s
/// group: each token's exact block sums stored at `pp[(t · 8 + r) · nbp + i]`
/// (8 at once, in one 32-byte store that the second pass's 32-byte load
/// takes from the store queue whole — two 16-byte stores under one load
/// cannot be forwarded and wait to retire; fewer than 8: 4 at once, past
/// `K` zeros), the blocks' `d` into `heads` (and [`Block32::MIN`]: their
/// `m` into `mheads`). A constant `K` keeps the blocks unrolled, with one
/// prefetch pair per block (per pair of blocks under 32 bytes) as
/// [`super::dots::dot_b32`] issues them.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn seq_blocks<F: Block32, const NT: usize, const K: usize>(
    row: *const u8,
    i: usize,
    r: usize,
    nbp: usize,
    x: Act,
    pp: *mut i32,
    heads: *mut [u16; ROWS],
    mheads: *mut [u16; ROWS],
) {
    let ones = _mm256_set1_epi16(1);
    let mut p = [[_mm256_setzero_si256(); 8]; NT];
    for k in 0..K {
        let b = row.add(F::BYTES * (i + k));
        if F::BYTES > 32 || (i + k).is_multiple_of(2) {
            _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(super::dots::PF_STREAM) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add(super::dots::PF_FAR) as *const i8);
        }
        let wq = F::quants(b);
        for (t, p) in p.iter_mut().enumerate() {
            let xv = _mm256_loadu_si256(x.qs.add(((i + k) * NT + t) * 32) as *const __m256i);
            let (wa, sx) = operands::<F>(wq, xv);
            p[k] = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, sx), ones);
        }
        // (i + k < nb, r < 8)
        (*heads.add(i + k))[r] = (b as *const u16).read_unaligned();
        if F::MIN {
            (*mheads.add(i + k))[r] = (b.add(2) as *const u16).read_unaligned();
        }
    }
    for (t, p) in p.iter().enumerate() {
        let at = pp.add((t * ROWS + r) * nbp + i);
        let h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
        if K == 8 {
            // h: blocks 0..4's halves, lanes [0 1 2 3 | 0 1 2 3]; g: 4..8's
            let g = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
            let s = _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(h, g),
                _mm256_permute2x128_si256::<0x31>(h, g),
            );
            _mm256_storeu_si256(at as *mut __m256i, s);
        } else {
            let s = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
            // (past nb: zeros, read below but not used)
            _mm_storeu_si128(at as *mut __m128i, s);
        }
    }
}

/// Sums (8 rows × blocks × tokens, two groups) that [`rows_seq`] keeps on
/// the stack (rows of up to 8192 values for the two tokens it takes; more go
/// to the heap).
const STACK_SUMS: usize = 8192;

/// The rows read in order: each block's exact sum per row and token and the
/// rows' `d` go to a buffer, then the float work runs 8 rows at a time in
/// the lanes, as [`rows_side`]'s. The float work of a group of 8 rows runs
/// after the next group's sums (two buffers in turn), so the loads that
/// gather the sums and `d`s never wait on stores still in the store queue
/// (a load over several stores is not forwarded: it waits for them to
/// retire, once per block when it ran right after them).
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_seq<F: Block32, const NT: usize>(
    w: *const u8,
    rb: usize,
    n: usize,
    nb: usize,
    x: Act,
    out: [*mut f32; NT],
) {
    // per buffer: sums at [(t · 8 + r) · nbp + i] (each row's blocks in a
    // row), the heads at [i][r] (the mins' after them, at [2 · nb + i][r]);
    // on the stack and uninitialized where they fit (every entry read is
    // written first for each group)
    let nbp = nb.next_multiple_of(8);
    let mut part_buf = std::mem::MaybeUninit::<[i32; STACK_SUMS]>::uninit();
    let mut heads_buf = std::mem::MaybeUninit::<[[u16; ROWS]; STACK_SUMS / ROWS]>::uninit();
    let mut mheads_buf = std::mem::MaybeUninit::<[[u16; ROWS]; STACK_SUMS / ROWS]>::uninit();
    let (mut part_vec, mut heads_vec) = (Vec::new(), Vec::new());
    let len = NT * ROWS * nbp;
    let (part, heads, mheads): (*mut i32, *mut [u16; ROWS], *mut [u16; ROWS]) =
        if 2 * len <= STACK_SUMS {
            (
                part_buf.as_mut_ptr() as *mut i32,
                heads_buf.as_mut_ptr() as *mut [u16; ROWS],
                mheads_buf.as_mut_ptr() as *mut [u16; ROWS],
            )
        } else {
            part_vec.resize(2 * len, 0i32);
            heads_vec.resize(if F::MIN { 4 } else { 2 } * nb, [0u16; ROWS]);
            let h = heads_vec.as_mut_ptr();
            (part_vec.as_mut_ptr(), h, h.wrapping_add(2 * nb))
        };
    let buffers = |g: usize| {
        let at = g % 2 * nb;
        (
            part.add(g % 2 * len),
            heads.add(at),
            mheads.wrapping_add(at),
        )
    };
    // the sums of group g (rows 8g..8g + 8)
    let sums = |g: usize| {
        let (pp, hp, mp) = buffers(g);
        for r in 0..ROWS {
            let row = w.add((ROWS * g + r).min(n - 1) * rb);
            let mut i = 0;
            while i + 8 <= nb {
                seq_blocks::<F, NT, 8>(row, i, r, nbp, x, pp, hp, mp);
                i += 8;
            }
            if i + 4 <= nb {
                seq_blocks::<F, NT, 4>(row, i, r, nbp, x, pp, hp, mp);
                i += 4;
            }
            match nb - i {
                1 => seq_blocks::<F, NT, 1>(row, i, r, nbp, x, pp, hp, mp),
                2 => seq_blocks::<F, NT, 2>(row, i, r, nbp, x, pp, hp, mp),
                3 => seq_blocks::<F, NT, 3>(row, i, r, nbp, x, pp, hp, mp),
                _ => {}
            }
            // the sums stored so far end at the next multiple of 4
            let i = nb.next_multiple_of(4);
            if i < nbp {
                for t in 0..NT {
                    _mm_storeu_si128(
                        pp.add((t * ROWS + r) * nbp + i) as *mut __m128i,
                        _mm_setzero_si128(),
                    );
                }
            }
        }
    };
    // the float work of group g, and its results stored
    let finish_group = |g: usize| {
        let (pp, hp, mp) = buffers(g);
        let mut f = [_mm256_setzero_ps(); NT];
        for i0 in (0..nb).step_by(8) {
            for (t, f) in f.iter_mut().enumerate() {
                // the 8 rows' sums of blocks i0..i0 + 8, block k in lane r of v[k]
                let mut v = [_mm256_setzero_si256(); 8];
                for r in 0..ROWS {
                    v[r] = _mm256_loadu_si256(pp.add((t * ROWS + r) * nbp + i0) as *const __m256i);
                }
                let v = transpose8(&v);
                for k in 0..8.min(nb - i0) {
                    let i = i0 + k;
                    let d = _mm256_cvtph_ps(_mm_loadu_si128(hp.add(i) as *const __m128i));
                    let m = if F::MIN {
                        _mm256_cvtph_ps(_mm_loadu_si128(mp.add(i) as *const __m128i))
                    } else {
                        _mm256_setzero_ps()
                    };
                    let (dx, sx) = (*x.d.add(i * x.d_stride + t), sx::<F>(x, i * NT + t));
                    *f = finish::<F>(*f, d, offset::<F>(v[k], sx), dx, m, sx);
                }
            }
        }
        store_rows(&f, out, ROWS * g, n);
    };
    let groups = n.div_ceil(ROWS);
    for g in 0..groups {
        sums(g);
        if g > 0 {
            finish_group(g - 1);
        }
    }
    finish_group(groups - 1);
}

/// The `d` of the 8 rows' block at byte `off` of each row, gathered by lane
/// (no stores: a 16-byte load over 8 fresh 2-byte stores would wait for
/// them to retire).
#[target_feature(enable = "avx2,f16c")]
#[inline]
pub(super) unsafe fn scales(rows: &[*const u8; ROWS], off: usize) -> __m256 {
    let h = |r: usize| (rows[r].add(off) as *const u16).read_unaligned() as i32;
    let mut v = _mm_cvtsi32_si128(h(0));
    v = _mm_insert_epi16::<1>(v, h(1));
    v = _mm_insert_epi16::<2>(v, h(2));
    v = _mm_insert_epi16::<3>(v, h(3));
    v = _mm_insert_epi16::<4>(v, h(4));
    v = _mm_insert_epi16::<5>(v, h(5));
    v = _mm_insert_epi16::<6>(v, h(6));
    v = _mm_insert_epi16::<7>(v, h(7));
    _mm256_cvtph_ps(v)
}

/// One token, the rows in the lanes taken far apart: lane `j` of group
/// `g` is row `j·s + g` (`s = n / 8`; the last `n mod 8` rows one more
/// group, side by side), so the 8 lanes read 8 streams, each walking
/// consecutive rows of its own eighth of the matrix. Per block each row's
/// exact sum is one `vpmaddubsw` + `vpmaddwd`, the 8 rows' sums gathered
/// into the lanes by a tree of `vphaddd` (no store, no transpose), then
/// [`finish`]: the same operations on the same values as [`rows_seq`]'s
/// and [`rows_side`]'s.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn rows_far<F: Block32>(
    w: *const u8,
    rb: usize,
    n: usize,
    nb: usize,
    x: Act,
    out: *mut f32,
) {
    let ones = _mm256_set1_epi16(1);
    let s = n / ROWS;
    let groups = n.div_ceil(ROWS);
    for g in 0..groups {
        let idx: [usize; ROWS] = if g < s {
            std::array::from_fn(|j| j * s + g)
        } else {
            std::array::from_fn(|j| (ROWS * s + j).min(n - 1))
        };
        let rows: [*const u8; ROWS] = std::array::from_fn(|j| w.add(idx[j] * rb));
        let mut f = _mm256_setzero_ps();
        for i in 0..nb {
            let xv = _mm256_loadu_si256(x.qs.add(i * 32) as *const __m256i);
            let mut p = [_mm256_setzero_si256(); ROWS];
            for r in 0..ROWS {
                let b = rows[r].add(F::BYTES * i);
                if F::BYTES > 32 || i.is_multiple_of(2) {
                    _mm_prefetch::<_MM_HINT_T0>(b.wrapping_add(super::dots::PF_STREAM) as *const i8);
                    _mm_prefetch::<_MM_HINT_T1>(b.wrapping_add(super::dots::PF_FAR) as *const i8);
                }
                let wq = F::quants(b);
                let (wa, sx) = operands::<F>(wq, xv);
                p[r] = _mm256_madd_epi16(_mm256_maddubs_epi16(wa, sx), ones);
            }
            // lanes [r0 r1 r2 r3 | r0 r1 r2 r3] (halves of each sum), r4..r8
            let h0 =
                _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
            let h1 =
                _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
            let isum = _mm256_add_epi32(
                _mm256_permute2x128_si256::<0x20>(h0, h1),
                _mm256_permute2x128_si256::<0x31>(h0, h1),
            );
            let d = scales(&rows, F::BYTES * i);
            let m = mins::<F>(&rows, F::BYTES * i);
            let sx = sx::<F>(x, i);
            f = finish::<F>(f, d, offset::<F>(isum, sx), *x.d.add(i * x.d_stride), m, sx);
        }
        let mut v = [0f32; ROWS];
        _mm256_storeu_ps(v.as_mut_ptr(), f);
        // (the last group's spare lanes repeat row n - 1: not stored)
        let live = if g < s { ROWS } else { n - ROWS * s };
        for j in 0..live {
            *out.add(idx[j]) = v[j];
        }
    }
}

/// One token: rows `0..out.len()` of `w` (decode), the same bits per row as
/// the tiles'.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_one<F: Block32>(
    w: &[u8],
    rb: usize,
    xq: &[i8],
    xd: &[f32],
    xs: &[i16],
    out: &mut [f32],
) {
    let n = out.len();
    let nb = rb / F::BYTES;
    assert!(
        rb.is_multiple_of(F::BYTES)
            && w.len() >= n * rb
            && xq.len() >= nb * 32
            && xd.len() >= nb
            && (!(F::MIN || F::OFFSET != 0) || xs.len() >= nb),
        "{} rows: bad shapes",
        F::NAME
    );
    if n == 0 {
        return;
    }
    let x = Act::one(xq, xd, xs);
    rows_far::<F>(w.as_ptr(), rb, n, nb, x, out.as_mut_ptr());
}

/// One row's dot product with one token: [`rows_one`] for a single row.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot<F: Block32>(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut y = [0f32];
    rows_one::<F>(row, row.len(), xq, xd, xs, &mut y);
    y[0]
}

/// `NT` tokens of a panel (32-value chunks): rows `0..out[0].len()` of `w`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_n<F: Block32, const NT: usize>(
    w: &[u8],
    rb: usize,
    p: &ActPanel,
    out: &mut [&mut [f32]],
) {
    assert!(p.nt == NT && out.len() == NT && NT <= PANEL_LANES);
    let n = out[0].len();
    let nb = p.n_blocks;
    assert!(out.iter().all(|o| o.len() == n) && rb == nb * F::BYTES && w.len() >= n * rb);
    assert!(p.qs.len() >= NT * nb * 32 && p.d.len() >= nb * PANEL_LANES && p.sums.len() >= nb * NT);
    if n == 0 {
        return;
    }
    let (x, o) = (Act::panel(p), out_ptrs::<NT>(out));
    if NT == 1 {
        rows_far::<F>(w.as_ptr(), rb, n, nb, x, o[0]);
    } else if NT <= SEQ_TOKENS {
        rows_seq::<F, NT>(w.as_ptr(), rb, n, nb, x, o);
    } else if crate::simd::avx_vnni() {
        rows_side_vnni::<F, NT>(w.as_ptr(), rb, n, nb, x, o);
    } else {
        rows_side_plain::<F, NT>(w.as_ptr(), rb, n, nb, x, o);
    }
}

/// The few-token entry: 1 to [`MAX_TOKENS`] tokens of a panel.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile<F: Block32>(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    by_token_count!(p.nt, tile_n<F>, F::NAME, (w, rb, p, out), 16)
}
