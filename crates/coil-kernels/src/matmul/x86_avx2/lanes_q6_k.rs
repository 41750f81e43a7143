//! AVX2 Q6_K products with eight rows in the vector lanes, as `lanes.rs`
//! does for Q4_K and `lanes_b32.rs` for Q8_0: 3 to 16 tokens read 8 rows
//! side by side, transposed as they are read (the file's layout stays as it
//! is; [`rows_side`]); one or two tokens read the rows in order
//! ([`rows_seq`]). Either way each block's product is an exact i32 per row
//! and token, and the float work — `acc += cvt(Σ sc·(q − 32)·qx) · (d ·
//! dx)` per block — runs 8 rows at a time in the lanes: the same bits per
//! row whatever the number of tokens or rows in the call.
//!
//! The row-at-a-time tile (`tiles.rs`) spends a `vpmaddubsw` and a
//! `vpmaddwd` per 32 values of a row and token, plus a conversion, a
//! correction and an FMA per row, block and token, at most 9 tokens per
//! pass. Here a vector holds 4 columns of 8 rows (row `r` in dword lane
//! `r`): a 16-value group of 8 rows is 4 vectors, each multiplied with a
//! broadcast of 4 activation bytes by `vpmaddubsw` (quants 0..64 unsigned),
//! two of their i16 pair sums added in i16 (2 · 2 · 63 · 128 < 2¹⁵: exact),
//! then one `vpmaddwd` by the rows' scales per pair: 6 multiplies per 128
//! values of 8 rows and a token instead of 8, and per block and token one
//! conversion and FMA for 8 rows. The `− 32` of the quants is the term `32
//! Σ_g sc_g Σ_g qx`, 8 `vpmaddwd` per block and token from the activations'
//! group sums. The transposition and unpacking (quants, scales, `d`, about
//! 450 operations per block of 8 rows) happen once per block for all the
//! tokens: at 4 tokens level with the row-at-a-time tile, from 8 ahead
//! (AMD EPYC Zen 3, one thread, 2048 x 1024: 8 tokens 0.26-0.27 ms against
//! 0.29-0.31, 16 tokens 0.44-0.46 against 0.63); the masks of the scale
//! shuffles are constants (built per block, they cost as much as the
//! products).
//!
//! Where the CPU has VNNI (AVX-VNNI, or AVX-512 VNNI used on 256-bit
//! vectors at the AVX-512 level: AMD Zen 4 takes these kernels there, see
//! `plan::split_q6k_lanes`), a 16-value group of 8 rows and a token is a
//! chain of 4 `vpdpbusd` and a `vpmulld` by the scales instead (the same
//! exact integers): AMD Zen 4, 2 threads, 8 tokens 248320 x 1024 14.6–15.0
//! → 12.3–12.5 ms, 16 tokens 2048 x 5632 1.00–1.02 → 0.79–0.80. Rows read
//! in order fuse each step's `vpmaddwd` and `vpaddd` into a `vpdpwssd`
//! there (2048 x 5632, four pairs: 1 token 0.195–0.249 → 0.189–0.234 ms,
//! 3 tokens 0.356–0.460 → 0.312–0.378, 4 tokens 0.437–0.560 →
//! 0.382–0.468).
//!
//! Batch invariance: a row's result is computed in its own lane and a
//! token's in its own registers, with the same operations whatever the
//! number of tokens or rows in the call (a short last group repeats its last
//! row in the spare lanes), so one token (decode), a few (batched decode,
//! speculative verification) and a single row's dot product agree bit for
//! bit.

use super::super::act::{ActPanel, PANEL_LANES};
use super::lanes::{out_ptrs, store_rows, transpose8, Act, ROWS};
use super::lanes_b32::scales;
use super::tiles::q6k_step;
use std::arch::x86_64::*;

/// Bytes per Q6_K block: 128 low nibbles, 64 bytes of high bit pairs, 16
/// signed scales, the f16 `d`.
const BLOCK: usize = 210;
/// Offsets in a block.
const QH: usize = 128;
const SCALES: usize = 192;
const D: usize = 208;

/// Most tokens per call: a panel's (16; a verification of 8 drafts takes 9).
pub(super) const MAX_TOKENS: usize = PANEL_LANES;

/// Most tokens that go through [`rows_seq`] (more through [`rows_side`]).
const SEQ_TOKENS: usize = 2;

/// [`SEQ_TOKENS`] where 512-bit operations run as halves
/// ([`crate::simd::split_512`]: AMD Zen 4, which takes these kernels at its
/// AVX-512 level for Q6_K in batched engines, see `plan::split_q6k_lanes`).
/// There, 2 threads, `probe` ms, in order / side by side: 3 tokens
/// 248320 x 1024 7.7-9.3 / 9.3-10.5, 2048 x 5632 0.30-0.38 / 0.33-0.44; 4
/// tokens 9.8-9.9 / 10.1-11.7, 1024 x 3584 0.124-0.140 / 0.128-0.169; 5-8
/// tokens side by side level or ahead (8 tokens 2048 x 5632 0.58-0.62 /
/// 0.77-0.78).
const SEQ_TOKENS_SPLIT_512: usize = 4;

/// A block's contribution to a token's 8 row results: `acc + cvt(isum) ·
/// (d · dx)` (the one order of roundings every path here shares).
#[target_feature(enable = "avx2,fma")]
#[inline]
unsafe fn finish(acc: __m256, d: __m256, isum: __m256i, dx: f32) -> __m256 {
    let s = _mm256_mul_ps(d, _mm256_set1_ps(dx));
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), s, acc)
}

/// One block of 8 rows, unpacked for every token.
#[repr(C, align(32))]
struct Block {
    /// The quants (0..64) of step `s` (columns `32s .. 32s + 32`): `w[s][g]`
    /// holds columns `32s + 4g .. + 4` of the 8 rows, a byte each.
    w: [[__m256i; 8]; 8],
    /// The scale of 16-group `j`, sign-extended, in both i16 halves of lane `r`.
    sc: [__m256i; 16],
    /// The scales of groups `2m`, `2m + 1` as an i16 pair per lane.
    pairs: [__m256i; 8],
    d: __m256,
    /// Each token's exact block sums (8 rows per vector), built step by step
    /// in memory so that a step's 8 weight vectors stay in registers across
    /// the tokens.
    acc: [__m256i; MAX_TOKENS],
}

/// `_mm256_shuffle_epi8` mask putting byte `k` (and `k2`) of each dword
/// into the high byte of its low (and high) 16-bit half, zeros below: a
/// `srai` by 8 then sign-extends them.
const fn dword_bytes_high(k: i8, k2: i8) -> [i8; 32] {
    let mut m = [-128i8; 32];
    let mut p = 0;
    while p < 8 {
        let base = 4 * (p as i8 % 4);
        m[4 * p + 1] = base + k;
        m[4 * p + 3] = base + k2;
        p += 1;
    }
    m
}

/// [`dword_bytes_high`] for one scale (byte `k` twice) and for the pairs of
/// scales (bytes 0, 1 and 2, 3): constants, not built per block.
const SCALE_MASKS: [[i8; 32]; 4] = [
    dword_bytes_high(0, 0),
    dword_bytes_high(1, 1),
    dword_bytes_high(2, 2),
    dword_bytes_high(3, 3),
];
const PAIR_MASKS: [[i8; 32]; 2] = [dword_bytes_high(0, 1), dword_bytes_high(2, 3)];

/// A mask of [`SCALE_MASKS`] or [`PAIR_MASKS`] as a vector.
#[inline(always)]
unsafe fn mask(m: &[i8; 32]) -> __m256i {
    _mm256_loadu_si256(m.as_ptr() as *const __m256i)
}

/// The 32 bytes at offset `o` of each of the 8 blocks at `b`, transposed:
/// dword `g` of block `r` in lane `r` of vector `g`. (A function, not a
/// closure: a closure does not inherit the target features, and its
/// intrinsics would become calls.)
#[inline(always)]
unsafe fn load_t(b: &[*const u8; ROWS], o: usize) -> [__m256i; 8] {
    let mut v = [_mm256_setzero_si256(); 8];
    for r in 0..ROWS {
        v[r] = _mm256_loadu_si256(b[r].add(o) as *const __m256i);
    }
    transpose8(&v)
}

/// Unpacks block `i` of the rows at `rows`, prefetching its share of the
/// memory at `pf` into L2.
#[inline(always)]
unsafe fn unpack(rows: &[*const u8; ROWS], i: usize, pf: *const u8, blk: &mut Block) {
    let b: [*const u8; ROWS] = std::array::from_fn(|r| rows[r].add(BLOCK * i));
    // the scales: row q and q + 4 in the two lanes of z[q], then dword k of
    // every row (scales 4k .. 4k + 4) in lane r of h[k]
    let mut z = [_mm256_setzero_si256(); 4];
    for q in 0..4 {
        let lo = _mm_loadu_si128(b[q].add(SCALES) as *const __m128i);
        let hi = _mm_loadu_si128(b[q + 4].add(SCALES) as *const __m128i);
        z[q] = _mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi);
    }
    let t0 = _mm256_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm256_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm256_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm256_unpackhi_epi32(z[2], z[3]);
    let h = [
        _mm256_unpacklo_epi64(t0, t2),
        _mm256_unpackhi_epi64(t0, t2),
        _mm256_unpacklo_epi64(t1, t3),
        _mm256_unpackhi_epi64(t1, t3),
    ];
    for j in 0..16 {
        let v = _mm256_shuffle_epi8(h[j / 4], mask(&SCALE_MASKS[j % 4]));
        blk.sc[j] = _mm256_srai_epi16::<8>(v);
    }
    for m in 0..8 {
        let v = _mm256_shuffle_epi8(h[m / 2], mask(&PAIR_MASKS[m % 2]));
        blk.pairs[m] = _mm256_srai_epi16::<8>(v);
    }
    blk.d = scales(rows, BLOCK * i + D);
    let (m4, m30) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30));
    for n in 0..2 {
        // half of the next group's share of memory
        let share = ROWS * BLOCK;
        let mut off = n * share / 2 / 64 * 64;
        while off < (n + 1) * share / 2 {
            _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(off) as *const i8);
            off += 64;
        }
        // low nibbles of columns 128n + 0..32 (+64: high nibbles) in `a`,
        // of 128n + 32..64 (+96) in `c`, their high bit pairs in `hb`
        let hb = load_t(&b, QH + 32 * n);
        let a = load_t(&b, 64 * n);
        for g in 0..8 {
            let lo = _mm256_and_si256(a[g], m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(a[g]), m4);
            blk.w[4 * n][g] =
                _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(hb[g]), m30));
            blk.w[4 * n + 2][g] = _mm256_or_si256(hi, _mm256_and_si256(hb[g], m30));
        }
        let c = load_t(&b, 64 * n + 32);
        for g in 0..8 {
            let lo = _mm256_and_si256(c[g], m4);
            let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(c[g]), m4);
            blk.w[4 * n + 1][g] =
                _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<2>(hb[g]), m30));
            blk.w[4 * n + 3][g] =
                _mm256_or_si256(hi, _mm256_and_si256(_mm256_srli_epi16::<2>(hb[g]), m30));
        }
    }
}

/// How [`rows_side`] sums a 16-value group of 8 rows and a token: `vpmaddubsw`
/// pairs added in i16, then `vpmaddwd` by the scales ([`NO_VNNI`]), or
/// `vpdpbusd` chains and a `vpmulld` by the scale, with AVX-VNNI's VEX
/// encoding ([`AVX_VNNI`], Intel client CPUs) or AVX-512 VNNI's EVEX one
/// on 256-bit vectors ([`AVX512_VNNI`]): the same exact integers.
type Vnni = u8;
const NO_VNNI: Vnni = 0;
const AVX_VNNI: Vnni = 1;
const AVX512_VNNI: Vnni = 2;

/// `acc + Σ u8 · i8` in fours, by the instruction `V` names.
#[inline(always)]
unsafe fn dpbusd<const V: Vnni>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    if V == AVX512_VNNI {
        _mm256_dpbusd_epi32(acc, u, s)
    } else {
        _mm256_dpbusd_avx_epi32(acc, u, s)
    }
}

/// The 4 activation bytes at `xp[g]` in every lane.
#[inline(always)]
unsafe fn bcast(xp: *const i32, g: usize) -> __m256i {
    _mm256_set1_epi32(xp.add(g).read_unaligned())
}

/// 8 rows side by side: the rows' results of `NT` tokens over `nb` blocks
/// (`V`: see [`Vnni`]; the caller has the features it names).
#[inline(always)]
unsafe fn rows_side<const NT: usize, const V: Vnni>(
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
        // the next group's stretch of memory, into L2 a block's share at a time
        let next = w.wrapping_add((r0 + ROWS) * rb);
        let mut facc = [_mm256_setzero_ps(); NT];
        for i in 0..nb {
            unpack(&rows, i, next.wrapping_add(ROWS * BLOCK * i), &mut blk);
            // each token's sums start at −32 Σ_g sc_g Σ_g qx
            for t in 0..NT {
                let s = x.sums.add((i * NT + t) * 16) as *const i32;
                let mut c = _mm256_setzero_si256();
                for m in 0..8 {
                    let sp = _mm256_set1_epi32(s.add(m).read_unaligned());
                    c = _mm256_add_epi32(c, _mm256_madd_epi16(blk.pairs[m], sp));
                }
                blk.acc[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32::<5>(c));
            }
            for s in 0..8 {
                let q = blk.w[s];
                let (s0, s1) = (blk.sc[2 * s], blk.sc[2 * s + 1]);
                if V != NO_VNNI {
                    // the scales as i32s (sign-extended in the high halves)
                    let (l0, l1) = (_mm256_srai_epi32::<16>(s0), _mm256_srai_epi32::<16>(s1));
                    for t in 0..NT {
                        let xp = x.qs.add(((8 * i + s) * NT + t) * 32) as *const i32;
                        let mut lo = dpbusd::<V>(_mm256_setzero_si256(), q[0], bcast(xp, 0));
                        let mut hi = dpbusd::<V>(_mm256_setzero_si256(), q[4], bcast(xp, 4));
                        for g in 1..4 {
                            lo = dpbusd::<V>(lo, q[g], bcast(xp, g));
                            hi = dpbusd::<V>(hi, q[g + 4], bcast(xp, g + 4));
                        }
                        let p = _mm256_add_epi32(
                            _mm256_mullo_epi32(lo, l0),
                            _mm256_mullo_epi32(hi, l1),
                        );
                        blk.acc[t] = _mm256_add_epi32(blk.acc[t], p);
                    }
                    continue;
                }
                for t in 0..NT {
                    // chunk 8i + s of token t, 4 bytes per column group
                    let xp = x.qs.add(((8 * i + s) * NT + t) * 32) as *const i32;
                    let p: [__m256i; 8] = std::array::from_fn(|g| {
                        _mm256_maddubs_epi16(q[g], _mm256_set1_epi32(xp.add(g).read_unaligned()))
                    });
                    let lo = _mm256_add_epi32(
                        _mm256_madd_epi16(_mm256_add_epi16(p[0], p[1]), s0),
                        _mm256_madd_epi16(_mm256_add_epi16(p[2], p[3]), s0),
                    );
                    let hi = _mm256_add_epi32(
                        _mm256_madd_epi16(_mm256_add_epi16(p[4], p[5]), s1),
                        _mm256_madd_epi16(_mm256_add_epi16(p[6], p[7]), s1),
                    );
                    blk.acc[t] = _mm256_add_epi32(blk.acc[t], _mm256_add_epi32(lo, hi));
                }
            }
            for (t, f) in facc.iter_mut().enumerate() {
                *f = finish(*f, blk.d, blk.acc[t], *x.d.add(i * x.d_stride + t));
            }
        }
        store_rows(&facc, out, r0, n);
        r0 += ROWS;
    }
}

/// [`q6k_step`] (step `(N, K)` of a Q6_K block for `NT` tokens: `iacc[t]
/// += sc · (q · x)`, exact) with VNNI's `vpdpwssd` in place of `vpmaddwd`
/// and `vpaddd` where `V` names it.
#[inline(always)]
unsafe fn step<const NT: usize, const N: usize, const K: usize, const V: Vnni>(
    b: *const u8,
    lanes: &[__m256i; 2],
    c: *const i8,
    iacc: &mut [__m256i; NT],
) {
    if V == NO_VNNI {
        return q6k_step::<NT, N, K>(b, lanes, c, iacc);
    }
    let q = super::dots::q6k_quant(b, N, K);
    let s = super::dots::q6k_scale(lanes, N, K);
    let c = c.add(32 * NT * (4 * N + K));
    for (t, acc) in iacc.iter_mut().enumerate() {
        let x = _mm256_loadu_si256(c.add(32 * t) as *const __m256i);
        let p = _mm256_maddubs_epi16(q, x);
        *acc = if V == AVX512_VNNI {
            _mm256_dpwssd_epi32(*acc, p, s)
        } else {
            _mm256_dpwssd_avx_epi32(*acc, p, s)
        };
    }
}

/// Row block `b`'s exact sum with `NT` tokens' block `i` as the row kernel
/// computes it (8 partial sums in the lanes of `part[t]`).
#[inline(always)]
unsafe fn row_block<const NT: usize, const V: Vnni>(
    b: *const u8,
    x: Act,
    i: usize,
    part: &mut [__m256i; NT],
) {
    super::dots::prefetch_block(b.wrapping_add(super::dots::PF_STREAM), BLOCK);
    super::dots::prefetch_far(b, BLOCK);
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(b.add(SCALES) as *const __m128i));
    let lanes = super::dots::q6k_scale_lanes(sc16);
    let mut iacc = [_mm256_setzero_si256(); NT];
    // the eight steps written out (as loops, LLVM chose the shifts of
    // `q6k_quant` at run time; see `tiles.rs`)
    let c = x.qs.add(32 * NT * 8 * i);
    step::<NT, 0, 0, V>(b, &lanes, c, &mut iacc);
    step::<NT, 0, 1, V>(b, &lanes, c, &mut iacc);
    step::<NT, 0, 2, V>(b, &lanes, c, &mut iacc);
    step::<NT, 0, 3, V>(b, &lanes, c, &mut iacc);
    step::<NT, 1, 0, V>(b, &lanes, c, &mut iacc);
    step::<NT, 1, 1, V>(b, &lanes, c, &mut iacc);
    step::<NT, 1, 2, V>(b, &lanes, c, &mut iacc);
    step::<NT, 1, 3, V>(b, &lanes, c, &mut iacc);
    for (t, acc) in iacc.iter().enumerate() {
        // minus 32 · Σ_g sc_g · bsum_g
        let bs16 = _mm256_loadu_si256(x.sums.add((i * NT + t) * 16) as *const __m256i);
        let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs16));
        part[t] = _mm256_sub_epi32(*acc, corr);
    }
}

/// The sum of an i32 vector's lanes (exact).
#[inline(always)]
unsafe fn hsum_i32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    _mm_cvtsi128_si32(s)
}

/// Block sums and `d`s (8 rows × blocks × tokens, two groups) that
/// [`rows_seq`] keeps on the stack (rows of up to 16384 values for one
/// token, 8192 for two; more go to the heap).
const STACK_SUMS: usize = 1024;

/// One or two tokens, the rows read in order as the file stores them (one
/// stream for the prefetchers, as the row-at-a-time kernels read it): each
/// row's block sums computed as the row kernel does and summed exactly into
/// a buffer with the rows' `d`s, then the float work 8 rows at a time in
/// the lanes ([`finish`]): the same operations on the same values as
/// [`rows_side`]'s. The float work of a group of 8 rows runs after the next
/// group's sums (two buffers in turn), so its vector loads never wait on
/// the scalar stores still in the store queue.
#[inline(always)]
unsafe fn rows_seq<const NT: usize, const V: Vnni>(
    w: *const u8,
    rb: usize,
    n: usize,
    nb: usize,
    x: Act,
    out: [*mut f32; NT],
) {
    // per buffer: sums at [(t · nb + i) · 8 + r], the d's at [i · 8 + r];
    // on the stack and uninitialized where they fit (every entry read is
    // written first for each group)
    let len = NT * nb * ROWS;
    let mut sums_buf = std::mem::MaybeUninit::<[i32; 2 * STACK_SUMS]>::uninit();
    let mut d_buf = std::mem::MaybeUninit::<[u16; 2 * STACK_SUMS]>::uninit();
    let (mut sums_vec, mut d_vec) = (Vec::new(), Vec::new());
    let (sums, ds): (*mut i32, *mut u16) = if len <= STACK_SUMS {
        (
            sums_buf.as_mut_ptr() as *mut i32,
            d_buf.as_mut_ptr() as *mut u16,
        )
    } else {
        sums_vec.resize(2 * len, 0i32);
        d_vec.resize(2 * nb * ROWS, 0u16);
        (sums_vec.as_mut_ptr(), d_vec.as_mut_ptr())
    };
    let groups = n.div_ceil(ROWS);
    for g in 0..=groups {
        if g < groups {
            let (pp, dp) = (sums.add(g % 2 * len), ds.add(g % 2 * nb * ROWS));
            for r in 0..ROWS {
                let row = w.add((ROWS * g + r).min(n - 1) * rb);
                for i in 0..nb {
                    let b = row.add(BLOCK * i);
                    let mut part = [_mm256_setzero_si256(); NT];
                    row_block::<NT, V>(b, x, i, &mut part);
                    for (t, p) in part.iter().enumerate() {
                        *pp.add((t * nb + i) * ROWS + r) = hsum_i32(*p);
                    }
                    *dp.add(i * ROWS + r) = (b.add(D) as *const u16).read_unaligned();
                }
            }
        }
        if g > 0 {
            let g = g - 1;
            let (pp, dp) = (sums.add(g % 2 * len), ds.add(g % 2 * nb * ROWS));
            let mut f = [_mm256_setzero_ps(); NT];
            for i in 0..nb {
                let d = _mm256_cvtph_ps(_mm_loadu_si128(dp.add(i * ROWS) as *const __m128i));
                for (t, f) in f.iter_mut().enumerate() {
                    let isum = _mm256_loadu_si256(pp.add((t * nb + i) * ROWS) as *const __m256i);
                    *f = finish(*f, d, isum, *x.d.add(i * x.d_stride + t));
                }
            }
            store_rows(&f, out, ROWS * g, n);
        }
    }
}

/// The VNNI form this thread's SIMD level allows (the AVX-512 level has
/// AVX-512 VNNI and VL; the AVX2 level AVX-VNNI where the CPU has it and
/// `COIL_AVX_VNNI` is not `0`).
fn vnni() -> Vnni {
    if crate::simd::level() >= crate::simd::SimdLevel::Avx512 {
        AVX512_VNNI
    } else if crate::simd::avx_vnni() {
        AVX_VNNI
    } else {
        NO_VNNI
    }
}

/// `$any::<NT>(w, rb, n, nb, x, out)`: `$body::<NT, V>` in the form [`vnni`]
/// picks, each form compiled with the features it names (the bodies are
/// `#[inline(always)]` without features of their own).
macro_rules! vnni_forms {
    ($any:ident, $body:ident) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $any<const NT: usize>(
            w: *const u8,
            rb: usize,
            n: usize,
            nb: usize,
            x: Act,
            out: [*mut f32; NT],
        ) {
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn plain<const NT: usize>(
                w: *const u8,
                rb: usize,
                n: usize,
                nb: usize,
                x: Act,
                out: [*mut f32; NT],
            ) {
                $body::<NT, NO_VNNI>(w, rb, n, nb, x, out)
            }
            #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
            unsafe fn avx<const NT: usize>(
                w: *const u8,
                rb: usize,
                n: usize,
                nb: usize,
                x: Act,
                out: [*mut f32; NT],
            ) {
                $body::<NT, AVX_VNNI>(w, rb, n, nb, x, out)
            }
            #[target_feature(enable = "avx2,fma,f16c,avx512vnni,avx512vl")]
            unsafe fn avx512<const NT: usize>(
                w: *const u8,
                rb: usize,
                n: usize,
                nb: usize,
                x: Act,
                out: [*mut f32; NT],
            ) {
                $body::<NT, AVX512_VNNI>(w, rb, n, nb, x, out)
            }
            match vnni() {
                AVX512_VNNI => avx512::<NT>(w, rb, n, nb, x, out),
                AVX_VNNI => avx::<NT>(w, rb, n, nb, x, out),
                _ => plain::<NT>(w, rb, n, nb, x, out),
            }
        }
    };
}
vnni_forms!(rows_seq_any, rows_seq);
vnni_forms!(rows_side_any, rows_side);

/// One token: rows `0..out.len()` of `w` (decode), the same bits per row as
/// the tiles'.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn rows_one(
    w: &[u8],
    rb: usize,
    xq: &[i8],
    xd: &[f32],
    xs: &[i16],
    out: &mut [f32],
) {
    let n = out.len();
    let nb = rb / BLOCK;
    assert!(
        rb.is_multiple_of(BLOCK)
            && w.len() >= n * rb
            && xq.len() >= nb * 256
            && xd.len() >= nb
            && xs.len() >= nb * 16,
        "Q6_K rows: bad shapes"
    );
    if n == 0 {
        return;
    }
    let x = Act::one(xq, xd, xs);
    rows_seq_any::<1>(w.as_ptr(), rb, n, nb, x, [out.as_mut_ptr()]);
}

/// One row's dot product with one token: [`rows_one`] for a single row.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot(row: &[u8], xq: &[i8], xd: &[f32], xs: &[i16]) -> f32 {
    let mut y = [0f32];
    rows_one(row, row.len(), xq, xd, xs, &mut y);
    y[0]
}

/// `NT` tokens of a panel (32-value chunks): rows `0..out[0].len()` of `w`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn tile_n<const NT: usize>(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    assert!(p.nt == NT && out.len() == NT && NT <= PANEL_LANES);
    let n = out[0].len();
    let nb = p.n_blocks;
    assert!(out.iter().all(|o| o.len() == n) && rb == nb * BLOCK && w.len() >= n * rb);
    assert!(
        p.qs.len() >= NT * nb * 256
            && p.d.len() >= nb * PANEL_LANES
            && p.sums.len() >= nb * NT * 16
    );
    if n == 0 {
        return;
    }
    let (x, o) = (Act::panel(p), out_ptrs::<NT>(out));
    if NT <= SEQ_TOKENS || (NT <= SEQ_TOKENS_SPLIT_512 && crate::simd::split_512()) {
        rows_seq_any::<NT>(w.as_ptr(), rb, n, nb, x, o);
    } else {
        rows_side_any::<NT>(w.as_ptr(), rb, n, nb, x, o);
    }
}

/// The few-token entry: 1 to [`MAX_TOKENS`] tokens of a panel.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn tile(w: &[u8], rb: usize, p: &ActPanel, out: &mut [&mut [f32]]) {
    by_token_count!(p.nt, tile_n, "Q6_K", (w, rb, p, out), 16)
}

#[cfg(test)]
mod tests {
    use super::super::super::act::{ActPanel, QuantAct, PANEL_LANES};
    use crate::simd::{detected_level, SimdLevel};
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    /// One token (rows in order) matches an f64 dot product of each
    /// dequantized row with the quantized activations, and every token
    /// count of the tile (in order for 1–2, side by side for more) gives
    /// each row the one-token bits: rows in several groups, a short last
    /// group, a chunk of rows that starts past a group boundary, scales of
    /// both signs (random weights), rows of 2 and 4 blocks.
    #[test]
    fn in_order_and_side_by_side_agree_with_the_reference() {
        if detected_level() < SimdLevel::Avx2 {
            return;
        }
        for cols in [512, 1024] {
            let rows = 29;
            let mut rng = Rng::new(11 + cols as u64);
            let data = random_weights(&mut rng, GgmlType::Q6_K, rows, cols);
            let (nb, rb) = (cols / 256, cols / 256 * super::BLOCK);
            let nt = PANEL_LANES;
            let x = rng.vec(nt * cols);
            let xa = QuantAct::q8_k(&x, cols);
            let n = rows - 3;
            let mut one = vec![vec![0f32; n]; nt];
            let mut deq = vec![0f32; cols];
            for (t, y) in one.iter_mut().enumerate() {
                let (q, d, s) = (
                    xa.qs_row(t),
                    &xa.d[t * nb..(t + 1) * nb],
                    &xa.sums[t * nb * 16..(t + 1) * nb * 16],
                );
                // SAFETY: the test returned above without AVX2.
                unsafe { super::rows_one(&data[3 * rb..], rb, q, d, s, y) };
                for (r, &got) in y.iter().enumerate() {
                    let row = &data[(3 + r) * rb..(4 + r) * rb];
                    assert!(super::super::super::dequant::dequant_row(
                        GgmlType::Q6_K,
                        row,
                        &mut deq
                    ));
                    let want: f64 = (0..cols)
                        .map(|c| deq[c] as f64 * q[c] as f64 * d[c / 256] as f64)
                        .sum();
                    assert!(
                        (got as f64 - want).abs() <= 1e-4 * (1.0 + want.abs()),
                        "{cols} columns, row {} token {t}: {got} vs {want}",
                        3 + r
                    );
                    // SAFETY: as above.
                    let dot = unsafe { super::dot(row, q, d, s) };
                    assert_eq!(dot.to_bits(), got.to_bits(), "dot, row {}", 3 + r);
                }
            }
            for k in 1..=nt {
                let panel = ActPanel::new(&xa, 0, k, 256, 16, 32);
                let mut ys = vec![vec![f32::NAN; n]; k];
                let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
                // SAFETY: as above.
                unsafe { super::tile(&data[3 * rb..], rb, &panel, &mut outs) };
                for t in 0..k {
                    for r in 0..n {
                        assert_eq!(
                            ys[t][r].to_bits(),
                            one[t][r].to_bits(),
                            "{cols} columns, {k} tokens, row {r}, token {t}"
                        );
                    }
                }
            }
        }
    }
}
