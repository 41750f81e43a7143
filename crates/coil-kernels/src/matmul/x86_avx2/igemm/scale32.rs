//! The formats of 32 small integers `q` with one float scale `d` per block
//! (and for Q4_1 / Q5_1 a min `m`): Q8_0 (`q` −128..127), Q4_0 (−8..7),
//! Q5_0 (−16..15), IQ4_NL (its table, −127..113), IQ4_XS (the same table,
//! `d` per 32 from its 6-bit sub-scales), Q4_1 (0..15) and Q5_1 (0..31);
//! and the lattice, ternary and MXFP4 formats (IQ2_XXS, IQ2_XS, IQ2_S,
//! IQ3_XXS, IQ3_S, IQ1_S, IQ1_M, TQ1_0, TQ2_0, MXFP4), which `decode_iq`
//! decodes straight to i16 with their integer scales folded in (`|q|` up
//! to 1922: a `vpmaddwd` pair stays far inside i32) and one `d` per 32.
//! The activations are quantized as for the Q8_0 decode path (`x = dx·qx`,
//! `qx` in −127..127, one `dx` per 32). Per row, token and block, `Σ q·qx`
//! is exact in i32 and `y += (d·dx)·Σ` in f32 (Q4_1 / Q5_1: also
//! `+ m·(dx·Σ qx)`), blocks in order.
//!
//! Both operands are signed, so `vpmaddubsw` (unsigned × signed) would need
//! the sign moved onto the activations product by product (`vpsignb`, as
//! llama.cpp's AVX2 dot products do) and a `vpmaddwd` per product anyway
//! (two of its i16 sums can overflow). Widened to i16 instead, `vpmaddwd`
//! alone multiplies 16 pairs into 8 i32 lanes — one instruction and one
//! add per 16 products, measured 10% faster than the sign route here
//! (Zen 3) and about 1.4× the f32 FMA rate, products per cycle.
//!
//! Layout: a panel of [`PR`] = 16 rows (two vectors of i32 lanes; one
//! 64-byte line of `y` per token, so the two threads never write the same
//! line) packed `[block][16 column pairs][16 rows][2]` as i16, `d` per
//! `[block][16 rows]`; the activations packed per tile of [`NT`] tokens,
//! `[tile][block][16 column pairs][NT]` as i32 (a pair of i16: one
//! broadcast feeds a `vpmaddwd`), so a tile's broadcasts come from one
//! contiguous stream. The microkernel keeps `NT` tokens × 16 rows in
//! registers (2 weight loads and `NT` broadcasts per `2·NT` `vpmaddwd`);
//! the panel is walked [`KB`] blocks at a time over all tiles, so its share
//! (16 KiB) stays in L1 while the tiles stream through (stored pass by
//! pass: one contiguous stream per pass).

use super::panels::{over_panels, transpose8};
use super::quant;
use crate::aligned::AlignedVec;
use crate::matmul::scalar::dequant::rd_f16;
use crate::matmul::weight::WeightRef;
use crate::matmul::x86_avx2::decode_i8::decode_row;
use crate::matmul::x86_avx2::decode_iq;
use crate::pool::SendPtr;
use crate::pool::ThreadPool;
use coil_gguf::GgmlType;
use std::arch::x86_64::*;
use std::cell::RefCell;

/// Weight rows per panel.
const PR: usize = 16;
/// Tokens per tile (microkernel call).
const NT: usize = 4;
/// Blocks of 32 columns per pass over the tiles.
const KB: usize = 16;
/// i16 of a packed block of a panel: 16 pairs × [`PR`] rows × 2.
const PANEL_BLOCK: usize = 16 * PR * 2;
/// i32 of a packed block of a tile: 16 pairs × [`NT`] tokens.
const TILE_BLOCK: usize = 16 * NT;

/// Whether `ty` is one of this GEMM's formats.
pub(super) fn supported(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q8_0 | Q4_0 | Q5_0 | IQ4_NL | IQ4_XS | Q4_1 | Q5_1) || decode_iq::supported(ty)
}

/// Whether `ty` has a min per block (`w = d·q + m`): its activations carry
/// their block sums too (matrices share a quantization only with the same
/// answer, [`igemm_many`]).
pub(super) fn has_min(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_1)
}

/// One packed panel of [`PR`] rows.
#[derive(Default)]
struct Panel {
    /// `[block][16 column pairs][PR rows][2]`
    q: AlignedVec<i16>,
    /// `[block][PR]`
    d: AlignedVec<f32>,
    /// The panel's rows decoded (formats other than Q8_0), `[PR][cols]`.
    row8: Vec<i8>,
    /// The same for the formats `decode_iq` decodes to i16.
    row16: Vec<i16>,
    /// The decoder's `b = −m` per `[block][PR]` (zero but for Q4_1 / Q5_1).
    mins: AlignedVec<f32>,
    /// Partial sums between passes, `[tile][2 · NT][8]` (rows 0–7 of the
    /// tile's tokens, then rows 8–15).
    acc: AlignedVec<f32>,
}

/// Activations of all tokens, per tile of [`NT`] (the last padded with
/// zeros): `qx` `[tile][block][16 pairs][NT]`, `dx` and `xs = dx·Σ qx`
/// `[tile][block][NT]`.
#[derive(Default)]
struct Acts {
    qx: AlignedVec<i32>,
    dx: AlignedVec<f32>,
    xs: AlignedVec<f32>,
}

thread_local! {
    static PANEL: RefCell<Panel> = RefCell::new(Panel::default());
    static ACTS: RefCell<Acts> = RefCell::new(Acts::default());
}

/// Packs rows `r0..r0 + nr` of `w` (the others: zeros): per block and half
/// of the panel, the 8 rows' 32 quants widened to i16 in registers and
/// transposed as 32-bit pairs straight into the panel.
///
/// # Safety
/// AVX2 + F16C available.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn pack_panel(w: &WeightRef, r0: usize, nr: usize, p: &mut Panel) {
    static ZEROS: [u8; 32] = [0; 32];
    static ZEROS16: [i16; 32] = [0; 32];
    let cols = w.cols;
    let nb = cols / 32;
    p.q.resize(nb * PANEL_BLOCK);
    p.d.resize(nb * PR);
    let q8 = w.ty == GgmlType::Q8_0;
    // the lattice / ternary / MXFP4 formats: decoded straight to i16
    let wide = decode_iq::supported(w.ty);
    if !q8 {
        if wide {
            p.row16.resize(PR * cols, 0);
        } else {
            p.row8.resize(PR * cols, 0);
        }
        p.mins.resize(nb * PR);
    }
    // where row r's quants start (block b at + `step`·b), as i8 (`wide`:
    // as i16, in `src16`)
    let mut src = [ZEROS.as_ptr(); PR];
    let mut src16 = [ZEROS16.as_ptr(); PR];
    let mut step = [0usize; PR];
    for r in 0..PR {
        if r >= nr {
            for b in 0..nb {
                p.d[b * PR + r] = 0.0;
                if !q8 {
                    p.mins[b * PR + r] = 0.0;
                }
            }
        } else if q8 {
            let row = w.row(r0 + r);
            for (b, blk) in row.chunks_exact(34).enumerate() {
                p.d[b * PR + r] = rd_f16(blk, 0);
            }
            (src[r], step[r]) = (row.as_ptr().add(2), 34);
        } else if wide {
            let dst = &mut p.row16[r * cols..(r + 1) * cols];
            decode_iq::decode_row(w.ty, w.row(r0 + r), dst, p.d.as_mut_ptr().add(r), PR);
            for b in 0..nb {
                p.mins[b * PR + r] = 0.0;
            }
            (src16[r], step[r]) = (dst.as_ptr(), 32);
        } else {
            let dst = &mut p.row8[r * cols..(r + 1) * cols];
            decode_row(
                w.ty,
                w.row(r0 + r),
                dst,
                p.d.as_mut_ptr().add(r),
                p.mins.as_mut_ptr().add(r),
                PR,
            );
            (src[r], step[r]) = (dst.as_ptr() as *const u8, 32);
        }
    }
    // [r][pair] -> [pair][r]: 8 x 8 transposes of 32-bit pairs, rows 0-7
    // then 8-15, pairs 0-7 then 8-15 of each block.
    let dst = p.q.as_mut_ptr() as *mut f32;
    for b in 0..nb {
        for h in 0..PR / 8 {
            let v: [__m256i; 8] = std::array::from_fn(|r| {
                let r = 8 * h + r;
                if wide {
                    _mm256_setzero_si256()
                } else {
                    _mm256_loadu_si256(src[r].add(step[r] * b) as *const __m256i)
                }
            });
            for half in 0..2 {
                let pairs: [__m256; 8] = std::array::from_fn(|i| {
                    let q = if wide {
                        let r = 8 * h + i;
                        let at = src16[r].add(step[r] * b + 16 * half);
                        return _mm256_castsi256_ps(_mm256_loadu_si256(at as *const __m256i));
                    } else if half == 0 {
                        _mm256_castsi256_si128(v[i])
                    } else {
                        _mm256_extracti128_si256(v[i], 1)
                    };
                    _mm256_castsi256_ps(_mm256_cvtepi8_epi16(q))
                });
                for (j, t) in transpose8(pairs).iter().enumerate() {
                    let g = 16 * b + 8 * half + j; // the pair's index in the row
                    _mm256_storeu_ps(dst.add(g * PR + 8 * h), *t);
                }
            }
        }
    }
}

/// Where block `b` of tile `tile` starts in [`Acts`], in blocks: pass by
/// pass ([`KB`] blocks each), then tile by tile, so that a pass over the
/// tiles reads one contiguous stream.
#[inline(always)]
fn act_block(nb: usize, tiles: usize, tile: usize, b: usize) -> usize {
    let (k, bb) = (b / KB, b % KB);
    let kb = KB.min(nb - k * KB);
    tiles * KB * k + tile * kb + bb
}

/// Quantizes the tokens of tile `tile` into `qx` / `dx` (tokens past `n`:
/// zeros), through `rows` / `rdx` (the tile's tokens' i16 and scales,
/// `[NT][cols]` / `[NT][cols / 32]`).
///
/// # Safety
/// AVX2 available; `qx` / `dx` are [`Acts`]' buffers for `tiles` tiles of
/// `cols` columns, and this tile's blocks are this call's alone.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_tile(
    x: &[f32],
    n: usize,
    cols: usize,
    tiles: usize,
    tile: usize,
    qx: *mut i32,
    dx: *mut f32,
    xs: *mut f32,
    rows: &mut [i16],
    rdx: &mut [f32],
) {
    let nb = cols / 32;
    for t in 0..NT {
        let tok = tile * NT + t;
        let (row, d) = (
            &mut rows[t * cols..(t + 1) * cols],
            &mut rdx[t * nb..(t + 1) * nb],
        );
        if tok < n {
            quant::row_i16(&x[tok * cols..(tok + 1) * cols], row, d);
        } else {
            row.fill(0);
            d.fill(0.0);
        }
    }
    let rp = rows.as_ptr();
    for b in 0..nb {
        let ab = act_block(nb, tiles, tile, b);
        for t in 0..NT {
            *dx.add(ab * NT + t) = rdx[t * nb + b];
            if !xs.is_null() {
                let q = &rows[t * cols + 32 * b..t * cols + 32 * b + 32];
                let sum: i32 = q.iter().map(|&q| q as i32).sum();
                *xs.add(ab * NT + t) = rdx[t * nb + b] * sum as f32;
            }
        }
        // [token][16 pairs] -> [pair][NT tokens], 8 pairs at a time
        let q = qx.add(ab * TILE_BLOCK) as *mut __m256i;
        for half in 0..2 {
            let [a, b_, c, d]: [__m256i; NT] = std::array::from_fn(|t| {
                _mm256_loadu_si256(rp.add(t * cols + 32 * b + 16 * half) as *const __m256i)
            });
            let (ab_lo, ab_hi) = (_mm256_unpacklo_epi32(a, b_), _mm256_unpackhi_epi32(a, b_));
            let (cd_lo, cd_hi) = (_mm256_unpacklo_epi32(c, d), _mm256_unpackhi_epi32(c, d));
            // pairs (0, 4), (1, 5), (2, 6), (3, 7) of the 8, all 4 tokens each
            let p04 = _mm256_unpacklo_epi64(ab_lo, cd_lo);
            let p15 = _mm256_unpackhi_epi64(ab_lo, cd_lo);
            let p26 = _mm256_unpacklo_epi64(ab_hi, cd_hi);
            let p37 = _mm256_unpackhi_epi64(ab_hi, cd_hi);
            let o = q.add(4 * half);
            _mm256_storeu_si256(o, _mm256_permute2x128_si256::<0x20>(p04, p15));
            _mm256_storeu_si256(o.add(1), _mm256_permute2x128_si256::<0x20>(p26, p37));
            _mm256_storeu_si256(o.add(2), _mm256_permute2x128_si256::<0x31>(p04, p15));
            _mm256_storeu_si256(o.add(3), _mm256_permute2x128_si256::<0x31>(p26, p37));
        }
    }
}

/// Quantizes all tokens into `a` (`min`: the block sums `xs` too).
fn quantize_acts(pool: &ThreadPool, x: &[f32], n: usize, cols: usize, min: bool, a: &mut Acts) {
    let nb = cols / 32;
    let tiles = n.div_ceil(NT);
    a.qx.resize(tiles * nb * TILE_BLOCK);
    a.dx.resize(tiles * nb * NT);
    a.xs.resize(if min { tiles * nb * NT } else { 0 });
    let (pq, pd) = (SendPtr(a.qx.as_mut_ptr()), SendPtr(a.dx.as_mut_ptr()));
    let px = SendPtr(if min {
        a.xs.as_mut_ptr()
    } else {
        std::ptr::null_mut()
    });
    pool.parallel_for(tiles, 4, |tr, _| {
        let (mut rows, mut rdx) = (vec![0i16; NT * cols], vec![0f32; NT * nb]);
        for tile in tr {
            // SAFETY: AVX2 checked by igemm's caller; the tile owns its
            // blocks of both buffers.
            unsafe {
                quantize_tile(
                    x,
                    n,
                    cols,
                    tiles,
                    tile,
                    pq.get(),
                    pd.get(),
                    px.get(),
                    &mut rows,
                    &mut rdx,
                )
            };
        }
    });
}

/// One pass's operands, each at the pass's first block: the panel's `w`,
/// `d` and `b` (`−m`, read with `MIN` only), the tile's `xq`, `xd` and `xs`
/// (`dx·Σ qx`, `MIN` only), and the block count.
#[derive(Clone, Copy)]
struct Pass {
    w: *const i16,
    d: *const f32,
    b: *const f32,
    xq: *const i32,
    xd: *const f32,
    xs: *const f32,
    nb: usize,
}

/// Adds blocks `0..nb` of a panel times a tile to `acc` (`[2 · NT]`: rows
/// 0–7 of each token, then rows 8–15), block by block: `acc += (d·dx)·Σ q·qx`
/// (`MIN`: then `acc −= b·(dx·Σ qx)`). `VNNI`: each `vpmaddwd` + `vpaddd`
/// pair is one AVX-VNNI `vpdpwssd` (the same exact integer sums; the pair
/// was this kernel's bound, ~1.5 per cycle).
///
/// # Safety
/// AVX2 + FMA available (and AVX-VNNI with `VNNI`); the pointers hold `nb`
/// blocks.
#[inline(always)]
unsafe fn kernel<const VNNI: bool, const MIN: bool>(p: Pass, acc: &mut [__m256; 2 * NT]) {
    for b in 0..p.nb {
        let wb = p.w.add(b * PANEL_BLOCK);
        let xb = p.xq.add(b * TILE_BLOCK);
        let mut ia = [_mm256_setzero_si256(); 2 * NT];
        for g in 0..16 {
            let w0 = _mm256_loadu_si256(wb.add(2 * PR * g) as *const __m256i);
            let w1 = _mm256_loadu_si256(wb.add(2 * PR * g + 16) as *const __m256i);
            for t in 0..NT {
                let x = _mm256_set1_epi32(*xb.add(NT * g + t));
                if VNNI {
                    ia[t] = _mm256_dpwssd_avx_epi32(ia[t], w0, x);
                    ia[NT + t] = _mm256_dpwssd_avx_epi32(ia[NT + t], w1, x);
                } else {
                    ia[t] = _mm256_add_epi32(ia[t], _mm256_madd_epi16(w0, x));
                    ia[NT + t] = _mm256_add_epi32(ia[NT + t], _mm256_madd_epi16(w1, x));
                }
            }
        }
        let d0 = _mm256_loadu_ps(p.d.add(b * PR));
        let d1 = _mm256_loadu_ps(p.d.add(b * PR + 8));
        for t in 0..NT {
            let dx = _mm256_set1_ps(*p.xd.add(b * NT + t));
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ia[t]), _mm256_mul_ps(d0, dx), acc[t]);
            acc[NT + t] = _mm256_fmadd_ps(
                _mm256_cvtepi32_ps(ia[NT + t]),
                _mm256_mul_ps(d1, dx),
                acc[NT + t],
            );
        }
        if MIN {
            let b0 = _mm256_loadu_ps(p.b.add(b * PR));
            let b1 = _mm256_loadu_ps(p.b.add(b * PR + 8));
            for t in 0..NT {
                let xs = _mm256_set1_ps(*p.xs.add(b * NT + t));
                acc[t] = _mm256_fnmadd_ps(b0, xs, acc[t]);
                acc[NT + t] = _mm256_fnmadd_ps(b1, xs, acc[NT + t]);
            }
        }
    }
}

/// Stores a tile's `acc` (rows `r0..r0 + nr` of tokens `t0..t0 + NT`, those
/// below `n`) into `y` (`[n][rows]`).
///
/// # Safety
/// AVX available; `y` holds `n · rows` floats; `nr ≤ PR`, `r0 + nr ≤ rows`.
#[inline(always)]
unsafe fn store(
    acc: &[__m256; 2 * NT],
    t0: usize,
    n: usize,
    nr: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    for t in 0..NT.min(n - t0) {
        let dst = y.add((t0 + t) * rows + r0);
        if nr == PR {
            _mm256_storeu_ps(dst, acc[t]);
            _mm256_storeu_ps(dst.add(8), acc[NT + t]);
        } else {
            let mut tmp = [0f32; PR];
            _mm256_storeu_ps(tmp.as_mut_ptr(), acc[t]);
            _mm256_storeu_ps(tmp.as_mut_ptr().add(8), acc[NT + t]);
            std::ptr::copy_nonoverlapping(tmp.as_ptr(), dst, nr);
        }
    }
}

/// Rows `r0..r0 + nr` of `y` for all `n` tokens from the packed panel `p`,
/// by the kernel for this CPU and format.
///
/// # Safety
/// AVX2 + FMA available; `p` packed from `cols` columns, `acts` quantized
/// for `n` tokens of `cols`; `y` holds `n · rows` floats and rows
/// `r0..r0 + nr` of it belong to this call.
#[allow(clippy::too_many_arguments)]
unsafe fn panel_rows(
    p: &mut Panel,
    acts: &Acts,
    cols: usize,
    n: usize,
    nr: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    let f: unsafe fn(&mut Panel, &Acts, usize, usize, usize, *mut f32, usize, usize) =
        match (crate::simd::avx_vnni(), !acts.xs.is_empty()) {
            (true, true) => panel_rows_vnni::<true>,
            (true, false) => panel_rows_vnni::<false>,
            (false, true) => panel_rows_plain::<true>,
            (false, false) => panel_rows_plain::<false>,
        };
    f(p, acts, cols, n, nr, y, rows, r0)
}

/// [`panel_rows_body`] with the AVX2 kernel.
///
/// # Safety
/// As [`panel_rows`].
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn panel_rows_plain<const MIN: bool>(
    p: &mut Panel,
    acts: &Acts,
    cols: usize,
    n: usize,
    nr: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    panel_rows_body::<false, MIN>(p, acts, cols, n, nr, y, rows, r0)
}

/// [`panel_rows_body`] with the AVX-VNNI kernel.
///
/// # Safety
/// As [`panel_rows`], and AVX-VNNI available.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,avxvnni")]
unsafe fn panel_rows_vnni<const MIN: bool>(
    p: &mut Panel,
    acts: &Acts,
    cols: usize,
    n: usize,
    nr: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    panel_rows_body::<true, MIN>(p, acts, cols, n, nr, y, rows, r0)
}

/// The tiles of [`panel_rows`] pass by pass, the kernel inlined (one call
/// per tile and the accumulators passed through memory cost ~1.5% of a
/// Qwen3.5-0.8B Q8_0 prompt at AVX2).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn panel_rows_body<const VNNI: bool, const MIN: bool>(
    p: &mut Panel,
    acts: &Acts,
    cols: usize,
    n: usize,
    nr: usize,
    y: *mut f32,
    rows: usize,
    r0: usize,
) {
    let nb = cols / 32;
    let tiles = n.div_ceil(NT);
    let passes = nb.div_ceil(KB);
    if passes > 1 {
        p.acc.resize(tiles * 2 * NT * 8);
    }
    for k in 0..passes {
        let (b0, b1) = (k * KB, (k * KB + KB).min(nb));
        for tile in 0..tiles {
            let saved = p.acc.as_mut_ptr().add(tile * 2 * NT * 8);
            let mut acc: [__m256; 2 * NT] = if k == 0 {
                [_mm256_setzero_ps(); 2 * NT]
            } else {
                std::array::from_fn(|i| _mm256_loadu_ps(saved.add(8 * i)))
            };
            let ab = act_block(nb, tiles, tile, b0);
            let pass = Pass {
                w: p.q.as_ptr().add(b0 * PANEL_BLOCK),
                d: p.d.as_ptr().add(b0 * PR),
                b: if MIN {
                    p.mins.as_ptr().add(b0 * PR)
                } else {
                    std::ptr::null()
                },
                xq: acts.qx.as_ptr().add(ab * TILE_BLOCK),
                xd: acts.dx.as_ptr().add(ab * NT),
                xs: if MIN {
                    acts.xs.as_ptr().add(ab * NT)
                } else {
                    std::ptr::null()
                },
                nb: b1 - b0,
            };
            kernel::<VNNI, MIN>(pass, &mut acc);
            if k + 1 == passes {
                store(&acc, tile * NT, n, nr, y, rows, r0);
            } else {
                for (i, a) in acc.iter().enumerate() {
                    _mm256_storeu_ps(saved.add(8 * i), *a);
                }
            }
        }
    }
}

/// `y = x · wᵀ` for `n_tokens` tokens (weights of a [`supported`] format;
/// the CPU has AVX2 + FMA + F16C).
pub(super) fn igemm(pool: &ThreadPool, w: &WeightRef, x: &[f32], y: &mut [f32], n_tokens: usize) {
    igemm_many(pool, &[w], x, &mut [y], n_tokens)
}

/// `ys[i] = x · ws[i]ᵀ` for matrices of [`supported`] formats, all with or
/// all without a min ([`has_min`]) and `x`'s width: the activations
/// quantized and tiled once, each product as [`igemm`] runs it.
pub(super) fn igemm_many(
    pool: &ThreadPool,
    ws: &[&WeightRef],
    x: &[f32],
    ys: &mut [&mut [f32]],
    n_tokens: usize,
) {
    let (cols, min) = (ws[0].cols, has_min(ws[0].ty));
    assert!(
        ws.len() == ys.len()
            && ws
                .iter()
                .all(|w| supported(w.ty) && w.cols == cols && has_min(w.ty) == min),
        "igemm_many: matrices of different widths or activation sums"
    );
    let mut acts = ACTS.with(|a| std::mem::take(&mut *a.borrow_mut()));
    quantize_acts(pool, x, n_tokens, cols, min, &mut acts);
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        let (rows, acts) = (w.rows, &acts);
        let yp = SendPtr(y.as_mut_ptr());
        over_panels(pool, w, PR, &PANEL, |r0, nr, p, packed| {
            // SAFETY: AVX2 + FMA + F16C checked by the caller; rows
            // r0..r0+nr of y belong to this panel only.
            unsafe {
                pack_panel(w, r0, nr, p);
                packed();
                panel_rows(p, acts, cols, n_tokens, nr, yp.get(), rows, r0);
            }
        });
    }
    ACTS.with(|a| *a.borrow_mut() = acts);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{random_weights, Rng};
    use coil_gguf::GgmlType;

    /// The integer GEMM gives, per row and token, `Σ_b dx·Σ w·qx` with the
    /// decode path's activation quantization and the scalar decoder's
    /// weights (`w = d·q`, or `d·q + m`; checked in f64, to f32 rounding of
    /// the products' magnitude), for every format, every Q8_0 byte
    /// including −128, ragged panels and token tiles, one and two threads.
    #[test]
    fn igemm_is_the_exact_integer_product() {
        if !std::arch::is_x86_feature_detected!("avx2")
            || !std::arch::is_x86_feature_detected!("fma")
            || !std::arch::is_x86_feature_detected!("f16c")
        {
            return;
        }
        let mut rng = Rng::new(11);
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::IQ4_NL,
            GgmlType::IQ4_XS,
            GgmlType::Q4_1,
            GgmlType::Q5_1,
        ] {
            for (rows, cols, n, threads) in [
                (8, 256, 6, 1),
                (21, 768, 13, 2),
                (64, 512, 40, 2),
                (40, 1280, 9, 2),
            ] {
                let mut data = random_weights(&mut rng, ty, rows, cols);
                if ty == GgmlType::Q8_0 {
                    // one block of extremes: −128 and 127
                    data[2..18].fill(0x80);
                    data[18..34].fill(0x7f);
                }
                let w = WeightRef::new(ty, &data, rows, cols).unwrap();
                let mut x = rng.vec(n * cols);
                x[..32].fill(0.0); // a zero block
                let pool = ThreadPool::new(threads);
                let mut y = vec![f32::NAN; n * rows];
                igemm(&pool, &w, &x, &mut y, n);
                let a = crate::matmul::act::QuantAct::q8_0(&x, cols);
                let mut wr = vec![0f32; cols];
                for r in 0..rows {
                    assert!(crate::matmul::scalar::dequant::dequant_row(
                        ty,
                        w.row(r),
                        &mut wr
                    ));
                    for t in 0..n {
                        let (mut want, mut mag) = (0f64, 0f64);
                        for (b, wb) in wr.chunks_exact(32).enumerate() {
                            let dx = a.d[t * cols / 32 + b] as f64;
                            for (i, &wv) in wb.iter().enumerate() {
                                let p = dx * wv as f64 * a.qs[t * cols + 32 * b + i] as f64;
                                want += p;
                                mag += p.abs();
                            }
                        }
                        let got = y[t * rows + r] as f64;
                        assert!(
                            (got - want).abs() <= 1e-6 * mag + 1e-12,
                            "{ty} rows {rows} cols {cols} t {t} r {r}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
