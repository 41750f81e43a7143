//! Many-token products (prefill): `y = x · Wᵀ` with the weights decoded to
//! f32 a panel at a time and laid out as strips of `rb` rows, `[k][rb]`,
//! so the microkernel holds a strip's rows in vector lanes and broadcasts
//! activations: an `mt tokens × rb rows` tile of `y` accumulates in
//! registers and goes straight to `y`'s rows, whole vectors each. Nothing is
//! transposed on the output side.
//!
//! A work item is a panel of up to [`PANEL`] weight rows times a group of
//! tokens; its rows are decoded [`KC`] columns at a time (row by row, then
//! transposed into strips in registers). Decoding costs O(rows·cols) per
//! item while the products cost O(rows·cols·tokens), so every weight format
//! runs at f32 GEMM speed once there are enough tokens.
//!
//! Two loop orders, per SIMD level (`Shape`):
//! * AVX-512 and portable: 32-row strips, activations read in place from `x`
//!   (`[n_tokens, cols]`); per token tile, every strip of the panel.
//! * AVX2, and AVX-512 where 512-bit operations run as halves (16 ymm
//!   registers, a 6 × 16 tile): 16-row strips ([`KC_PACKED`] columns), and the
//!   activations packed once per call as `[tile of 6 tokens][cols][6]`, so a
//!   tile's broadcasts come from one contiguous stream; per strip (F16
//!   weights kept 16-bit), every token tile of a block of `MC_TILES` (in
//!   L2). Read
//!   in place, the 6 token rows of a tile sit `cols` floats apart — a
//!   multiple of 4 KiB for the usual widths, so they all fall in the same
//!   L1 sets — and every strip was re-read from L2 for each tile.

use crate::matmul::decode::decode_segment;
use crate::matmul::weight::WeightRef;
use crate::pool::SendPtr;
use crate::pool::ThreadPool;
use crate::simd::tile::{transpose, Lanes, V16};
use crate::simd::SimdLevel;
use coil_gguf::GgmlType;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Weight rows per strip at the AVX-512 and portable levels (AVX2: 16).
pub const RB: usize = 32;
/// Columns decoded per step (a multiple of every block size, 256).
pub const KC: usize = 256;
/// Columns per step of the packed shape: each tile's partial sums go to
/// `y` and come back once per step, so a longer step saves those round
/// trips (rows 16 KiB apart, from L2); the strip (16 rows, 32 KiB of f16
/// or 64 KiB of f32) streams from L2 with the tiles. Measured on an AMD
/// Zen 4, `probe F16 ROWS COLS 512 1`, 256 → 1024: 1024 × 3584 93–97 →
/// 100–104 GFLOP/s, 6144 × 1024 101–104 → 107–109, 3584 × 1024 104–107 →
/// 104–109 (2 threads, 1024 × 2048: 184–190 → 193–196).
pub const KC_PACKED: usize = 4 * KC;
/// Weight rows per work item (a multiple of both strip widths).
pub const PANEL: usize = 96;
/// Tokens per unit of a work item's token group (activations in place).
const TG: usize = 32;
/// Largest microkernel token count.
const MT_MAX: usize = 12;
/// Token tiles per block of the packed loop order (6 tokens each: 120
/// tokens, 120 KiB of packed activations per [`KC`] columns, in L2 beside
/// the panel's strips).
const MC_TILES: usize = 20;

/// How a level tiles the product.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shape {
    /// Weight rows per strip (the microkernel's vector lanes).
    rb: usize,
    /// Tokens per microkernel tile.
    mt: usize,
    /// Activations packed per tile (`[tile][cols][mt]`) and strips outside
    /// token tiles; else read in place, tiles outside strips.
    packed: bool,
    /// Columns per step ([`KC`] or [`KC_PACKED`]).
    kc: usize,
}

/// 16-row strips, 6-token tiles, activations packed (the AVX2 microkernel).
pub(crate) const PACKED: Shape = Shape {
    rb: 16,
    mt: 6,
    packed: true,
    kc: KC_PACKED,
};

/// 32-row strips, 12-token tiles read in place (the AVX-512 microkernel).
pub(crate) const WIDE: Shape = Shape {
    rb: RB,
    mt: MT_MAX,
    packed: false,
    kc: KC,
};

/// 32-row strips, 4-token tiles read in place (the portable microkernel).
pub(crate) const SCALAR: Shape = Shape {
    rb: RB,
    mt: 4,
    packed: false,
    kc: KC,
};

thread_local! {
    /// A panel decoded row by row, `[PANEL][kc]`, and as strips,
    /// `[PANEL / rb][kc][rb]` (`kc` the shape's step).
    static RBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static SBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The calling thread's packed activations (kept between calls: no
    /// page faults per call).
    static XPACK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Where tile `i`'s packed activations for the columns from `k0` (a
/// multiple of [`KC_PACKED`]) start in the packed buffer: `[k block][tile][kc][mt]`,
/// every k block before `k0` a full [`KC_PACKED`] wide. A k block's tiles are
/// contiguous, so the tiles a loop over them touches form one stream; a
/// tile-major layout put them `cols · mt` floats apart — for `cols` a
/// multiple of 2048 a multiple of the L2's set stride, all in the same sets
/// (`cols` 8192: 67% of the FMA peak instead of 83%).
#[inline]
fn packed_at(k0: usize, i: usize, n_tiles: usize, cols: usize, mt: usize) -> usize {
    let kc = KC_PACKED.min(cols - k0);
    k0 * n_tiles * mt + i * kc * mt
}

/// `xp[packed_at(k0, i) + (k − k0)·mt + j] = x[(i·mt + j)·cols + k]` for
/// tokens `< n` (0 beyond).
fn pack_x(
    pool: &ThreadPool,
    x: &[f32],
    n: usize,
    cols: usize,
    mt: usize,
    xp: &mut [f32],
    level: SimdLevel,
) {
    let n_tiles = n.div_ceil(mt);
    assert!(x.len() >= n * cols && xp.len() >= n_tiles * mt * cols);
    let pp = SendPtr(xp.as_mut_ptr());
    pool.parallel_for(n_tiles, 8, |tr, _| {
        for i in tr {
            let m = mt.min(n - i * mt);
            let src = &x[i * mt * cols..(i * mt + m) * cols];
            for k0 in (0..cols).step_by(KC_PACKED) {
                let kc = KC_PACKED.min(cols - k0);
                // SAFETY: tile i owns its kc·mt values of every k block.
                let dst = unsafe {
                    std::slice::from_raw_parts_mut(
                        pp.get().add(packed_at(k0, i, n_tiles, cols, mt)),
                        kc * mt,
                    )
                };
                #[cfg(target_arch = "x86_64")]
                if level >= SimdLevel::Avx2 && mt == 6 {
                    // SAFETY: AVX2 is the CPU's (the level says so); sizes as checked.
                    unsafe { x86::pack_tile6_avx2(src, m, cols, k0, kc, dst) };
                    continue;
                }
                let _ = level;
                for k in 0..kc {
                    for j in 0..mt {
                        dst[k * mt + j] = if j < m { src[j * cols + k0 + k] } else { 0.0 };
                    }
                }
            }
        }
    });
}

/// `y = x · wᵀ` through the f32 GEMM with the tiling given (one that
/// `level` runs: `plan::f32_gemm_shape`; tests run both AVX-512 ones on
/// any AVX-512 CPU).
pub(crate) fn gemm_shaped(
    pool: &ThreadPool,
    w: &WeightRef,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
    level: SimdLevel,
    shape: Shape,
) {
    let (rows, cols) = (w.rows, w.cols);
    assert!(x.len() >= n_tokens * cols && y.len() >= n_tokens * rows);
    let (rb, mt, kcb) = (shape.rb, shape.mt, shape.kc);
    // Token groups are made of whole units (whole tiles when packed).
    let unit = if shape.packed { 6 * mt } else { TG };
    let nb = n_tokens.div_ceil(unit);
    let panels = rows.div_ceil(PANEL);
    // Split the tokens into groups when there are few row panels.
    let mut groups = 1;
    while panels * groups < 4 * pool.n_threads() && groups < nb {
        groups *= 2;
    }
    let groups = groups.min(nb);
    let units_per_group = nb.div_ceil(groups);
    let groups = nb.div_ceil(units_per_group);

    let mut xpack = if shape.packed {
        let mut v = XPACK.with(|b| std::mem::take(&mut *b.borrow_mut()));
        let len = n_tokens.div_ceil(mt) * mt * cols;
        if v.len() < len {
            v.resize(len, 0.0);
        }
        pack_x(pool, x, n_tokens, cols, mt, &mut v, level);
        v
    } else {
        Vec::new()
    };
    let xpp = SendPtr(xpack.as_mut_ptr());

    let yp = SendPtr(y.as_mut_ptr());
    let n_items = panels * groups;
    // F16 weights stay 16-bit in the packed shape's strips (x86: F16C).
    let f16_strips = cfg!(target_arch = "x86_64") && shape.packed && w.ty == GgmlType::F16;
    let wsize = if f16_strips { 2 } else { 4 };
    // Work items are claimed one ahead, so the first weight block of the
    // next item can be fetched while this one computes — except for the
    // last few, which go to whichever thread is free first (claimed ahead,
    // they could leave one thread a whole item behind the other).
    let next_item = AtomicUsize::new(0);
    let claim = || next_item.fetch_add(1, Ordering::Relaxed);
    let n_threads = pool.n_threads();
    // Rows r0.. of the panel of `item`.
    let rows_of = |item: usize| {
        let r0 = (item / groups) * PANEL;
        (r0, PANEL.min(rows - r0))
    };
    pool.parallel_for(n_threads, 1, |_, _| {
        RBUF.with(|rbuf| {
            SBUF.with(|sbuf| {
                let mut rbuf = rbuf.borrow_mut();
                let mut sbuf = sbuf.borrow_mut();
                if rbuf.len() < PANEL * kcb {
                    rbuf.resize(PANEL * kcb, 0.0);
                    sbuf.resize(PANEL * kcb + 16, 0.0);
                }
                // The strips start on a cache line: a strip's row of 16
                // floats is then one line, not two halves of two (split
                // loads; twice the lines in L1).
                let off = sbuf.as_ptr().align_offset(64).min(15);
                let sbuf = &mut sbuf[off..off + PANEL * kcb];
                let mut item = claim();
                while item < n_items {
                    let following = if next_item.load(Ordering::Relaxed) + n_threads < n_items {
                        claim()
                    } else {
                        usize::MAX
                    };
                    let (r0, nr) = rows_of(item);
                    let g = item % groups;
                    let t_begin = g * units_per_group * unit;
                    let t_end = ((g + 1) * units_per_group * unit).min(n_tokens);
                    let n_strips = nr.div_ceil(rb);
                    let n_tiles = (t_end - t_begin).div_ceil(mt);
                    let mut k0 = 0;
                    while k0 < cols {
                        let kc = kcb.min(cols - k0);
                        // Weight rows r0..r0+nr, columns k0..k0+kc, as f32
                        // strips [strip][k][rb] (rows past nr zero); F16
                        // weights as f16 strips, widened in the packed
                        // microkernel (where `vcvtph2ps` costs no FMA time).
                        if f16_strips {
                            // SAFETY: the buffer holds PANEL·kcb f32, room for
                            // as many u16 (nr ≤ PANEL, kc ≤ kcb); AVX2 at the
                            // packed shape's level.
                            #[cfg(target_arch = "x86_64")]
                            unsafe {
                                x86::strips_f16(w, r0, nr, k0, kc, sbuf.as_mut_ptr() as *mut u16)
                            };
                        } else {
                            for r in 0..nr {
                                let src = w.row_range(r0 + r, k0, kc);
                                decode_segment(w.ty, src, &mut rbuf[r * kc..(r + 1) * kc], level);
                            }
                            to_strips(&rbuf, nr, kc, rb, sbuf, level);
                        }
                        // The panel's rows are many concurrent streams, more
                        // than hardware prefetchers follow: fetch the next
                        // block (of this item, else the first of the
                        // following one) ahead, spread over the
                        // microkernel calls so the requests overlap the
                        // products.
                        let ahead = if k0 + kc < cols {
                            Some((r0, nr, k0 + kc, kcb.min(cols - k0 - kc)))
                        } else if following < n_items {
                            let (fr0, fnr) = rows_of(following);
                            Some((fr0, fnr, 0, kcb.min(cols)))
                        } else {
                            None
                        };
                        let n_calls = n_tiles * n_strips;
                        let mut call = 0;
                        let fetch = |call: usize| {
                            if let Some((pr0, pnr, pk0, pkc)) = ahead {
                                for r in call * pnr / n_calls..(call + 1) * pnr / n_calls {
                                    prefetch(w.row_range(pr0 + r, pk0, pkc));
                                }
                            }
                        };
                        // Tile i's tokens t_begin + i·mt.., its y rows
                        // from column r0 + s·rb: (m, y pointer).
                        let tile = |i: usize, s: usize| {
                            let t0 = t_begin + i * mt;
                            // SAFETY: y[t0.., r0 + s·rb..] belongs to this item.
                            (mt.min(t_end - t0), unsafe {
                                yp.get().add(t0 * rows + r0 + s * rb)
                            })
                        };
                        if shape.packed {
                            for tb in (0..n_tiles).step_by(MC_TILES) {
                                for s in 0..n_strips {
                                    let nrs = rb.min(nr - s * rb);
                                    let tb_end = (tb + MC_TILES).min(n_tiles);
                                    for i in tb..tb_end {
                                        fetch(call);
                                        call += 1;
                                        let (m, yt) = tile(i, s);
                                        // The next tile's partial sums (rows
                                        // 16 KiB apart, usually not in L1)
                                        // load while this one computes.
                                        if k0 > 0 && i + 1 < tb_end {
                                            let (m2, y2) = tile(i + 1, s);
                                            for t in 0..m2 {
                                                // SAFETY: inside y (row t of tile i+1).
                                                let yr = unsafe { y2.add(t * rows) };
                                                prefetch_l1(yr, nrs);
                                            }
                                        }
                                        // SAFETY: the strip holds kc·rb
                                        // values; the packed tile has kc·mt
                                        // for this k block (t_begin is a
                                        // multiple of mt); y rows t0..t0+m,
                                        // columns ..+nrs belong to this item.
                                        unsafe {
                                            let xt = xpp.get().add(packed_at(
                                                k0,
                                                t_begin / mt + i,
                                                n_tokens.div_ceil(mt),
                                                cols,
                                                mt,
                                            ));
                                            packed_microkernel(
                                                level,
                                                m,
                                                f16_strips,
                                                (sbuf.as_ptr() as *const u8)
                                                    .add(s * kc * rb * wsize),
                                                xt,
                                                kc,
                                                yt,
                                                rows,
                                                nrs,
                                                k0 == 0,
                                            )
                                        };
                                    }
                                }
                            }
                        } else {
                            for i in 0..n_tiles {
                                for s in 0..n_strips {
                                    fetch(call);
                                    call += 1;
                                    let (m, yt) = tile(i, s);
                                    let t0 = t_begin + i * mt;
                                    let nrs = rb.min(nr - s * rb);
                                    // SAFETY: the strip holds kc·rb values;
                                    // x rows t0..t0+m have cols ≥ k0+kc
                                    // values; y[t0..t0+m, r0+s·rb ..+nrs]
                                    // belong to this item only.
                                    unsafe {
                                        microkernel(
                                            level,
                                            m,
                                            sbuf.as_ptr().add(s * kc * rb),
                                            x.as_ptr().add(t0 * cols + k0),
                                            cols,
                                            kc,
                                            yt,
                                            rows,
                                            nrs,
                                            k0 == 0,
                                        )
                                    };
                                }
                            }
                        }
                        k0 += kc;
                    }
                    item = if following < n_items {
                        following
                    } else {
                        claim()
                    };
                }
            })
        });
    });
    if shape.packed {
        XPACK.with(|b| *b.borrow_mut() = xpack);
    }
}

/// `strips[s][k][i] = rows[(s·rb + i)·kc + k]` for rows `< nr` (0 beyond),
/// in 16 × 16 register transposes at the SIMD levels (`rb` a multiple of 16).
fn to_strips(rows: &[f32], nr: usize, kc: usize, rb: usize, strips: &mut [f32], level: SimdLevel) {
    assert!(rb.is_multiple_of(16));
    assert!(rows.len() >= nr * kc && strips.len() >= nr.div_ceil(rb) * rb * kc);
    // SAFETY: the sizes are checked above; the levels are the CPU's.
    unsafe {
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => x86::to_strips_avx512(rows, nr, kc, rb, strips),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => x86::to_strips_avx2(rows, nr, kc, rb, strips),
            _ => to_strips_body::<Lanes>(rows, nr, kc, rb, strips),
        }
    }
}

/// [`to_strips`] with `V`'s transposes.
///
/// # Safety
/// `rows` holds `nr · kc` values, `strips` `ceil(nr / rb) · rb · kc`.
#[inline(always)]
unsafe fn to_strips_body<V: V16>(
    rows: &[f32],
    nr: usize,
    kc: usize,
    rb: usize,
    strips: &mut [f32],
) {
    for s in 0..nr.div_ceil(rb) {
        let r0 = s * rb;
        let valid = rb.min(nr - r0);
        let dst = strips.as_mut_ptr().add(s * kc * rb);
        transpose::<V>(rows.as_ptr().add(r0 * kc), kc, valid, kc, dst, rb);
        if valid < rb {
            for k in 0..kc {
                std::slice::from_raw_parts_mut(dst.add(k * rb + valid), rb - valid).fill(0.0);
            }
        }
    }
}

/// Hints the CPU to bring the `n` floats at `p` into L1.
#[inline(always)]
fn prefetch_l1(p: *const f32, n: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        // SAFETY: a prefetch has no effect on memory, whatever the address.
        unsafe {
            _mm_prefetch::<_MM_HINT_T0>(p as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(n.max(1) - 1) as *const i8);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, n);
}

/// Hints the CPU to bring `bytes` into L2.
#[inline(always)]
pub(crate) fn prefetch(bytes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
        let mut off = 0;
        while off < bytes.len() {
            // SAFETY: prefetching an address inside the slice has no effect on memory.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(bytes.as_ptr().add(off) as *const i8) };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = bytes;
}

/// `y[t·ys + i] (+)= Σ_k x[t·xs + k] · strip[k·RB + i]` for `t < m`,
/// `i < nrs` (`init`: overwrite instead of accumulate).
///
/// # Safety
/// `strip` valid for `kc·RB` values; `x` for `m` rows of stride `xs` with
/// `kc` values each; `y` for `m` rows of stride `ys` with `nrs ≤ RB` values
/// each; `m ≤ mt_for(level)`; `level` supported by the CPU.
#[allow(clippy::too_many_arguments)]
unsafe fn microkernel(
    level: SimdLevel,
    m: usize,
    strip: *const f32,
    x: *const f32,
    xs: usize,
    kc: usize,
    y: *mut f32,
    ys: usize,
    nrs: usize,
    init: bool,
) {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => x86::mk_avx512_dispatch(m, strip, x, xs, kc, y, ys, nrs, init),
        _ => {
            for t in 0..m {
                let mut acc = [0f32; RB];
                for k in 0..kc {
                    let xv = *x.add(t * xs + k);
                    let wk = std::slice::from_raw_parts(strip.add(k * RB), RB);
                    for (a, &wv) in acc.iter_mut().zip(wk) {
                        *a += xv * wv;
                    }
                }
                let yr = std::slice::from_raw_parts_mut(y.add(t * ys), nrs);
                for (o, a) in yr.iter_mut().zip(acc) {
                    *o = if init { a } else { *o + a };
                }
            }
        }
    }
}

/// `y[t·ys + i] (+)= Σ_k xt[k·mt + t] · strip[k·rb + i]` for `t < m`,
/// `i < nrs`, with the activations packed (`xt`: a tile, `[k][mt]`).
///
/// # Safety
/// `strip` valid for `kc·rb` values; `xt` for `kc·mt`; `y` for `m` rows of
/// stride `ys` with `nrs ≤ rb` values each; `level`'s shape packed and
/// supported by the CPU.
#[allow(clippy::too_many_arguments)]
unsafe fn packed_microkernel(
    level: SimdLevel,
    m: usize,
    f16: bool,
    strip: *const u8,
    xt: *const f32,
    kc: usize,
    y: *mut f32,
    ys: usize,
    nrs: usize,
    init: bool,
) {
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 if f16 => {
            x86::mk_avx512_packed_f16(m, strip as *const u16, xt, kc, y, ys, nrs, init)
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 if f16 => {
            x86::mk_avx2_packed_f16(m, strip as *const u16, xt, kc, y, ys, nrs, init)
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 | SimdLevel::Avx512 => {
            x86::mk_avx2_packed(m, strip as *const f32, xt, kc, y, ys, nrs, init)
        }
        _ => unreachable!("no packed microkernel at {level:?}"),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::RB;
    use crate::simd::tile::x86::{columns8, Pair};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn to_strips_avx512(
        rows: &[f32],
        nr: usize,
        kc: usize,
        rb: usize,
        strips: &mut [f32],
    ) {
        super::to_strips_body::<__m512>(rows, nr, kc, rb, strips)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn to_strips_avx2(
        rows: &[f32],
        nr: usize,
        kc: usize,
        rb: usize,
        strips: &mut [f32],
    ) {
        super::to_strips_body::<Pair>(rows, nr, kc, rb, strips)
    }

    macro_rules! dispatch {
        ($name:ident, $kern:ident, $($m:literal)*) => {
            #[allow(clippy::too_many_arguments)]
            pub unsafe fn $name(
                m: usize, strip: *const f32, x: *const f32, xs: usize, kc: usize,
                y: *mut f32, ys: usize, nrs: usize, init: bool,
            ) {
                match m {
                    $($m => $kern::<$m>(strip, x, xs, kc, y, ys, nrs, init),)*
                    _ => unreachable!("microkernel tokens {m}"),
                }
            }
        };
    }
    dispatch!(mk_avx512_dispatch, mk_avx512, 1 2 3 4 5 6 7 8 9 10 11 12);

    /// Lane masks of the two vectors of a strip's first `nrs` rows.
    fn masks(nrs: usize) -> (u16, u16) {
        let m = |n: usize| match n {
            0 => 0,
            n if n >= 16 => 0xFFFF,
            n => (1u16 << n) - 1,
        };
        (m(nrs), m(nrs.saturating_sub(16)))
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn mk_avx512<const M: usize>(
        strip: *const f32,
        x: *const f32,
        xs: usize,
        kc: usize,
        y: *mut f32,
        ys: usize,
        nrs: usize,
        init: bool,
    ) {
        let (m0, m1) = masks(nrs);
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        if !init {
            for (t, a) in acc.iter_mut().enumerate() {
                a[0] = _mm512_maskz_loadu_ps(m0, y.add(t * ys));
                a[1] = _mm512_maskz_loadu_ps(m1, y.add(t * ys + 16));
            }
        }
        let mut xp = [x; M];
        for (t, p) in xp.iter_mut().enumerate() {
            *p = x.add(t * xs);
        }
        let mut wk = strip;
        for _ in 0..kc {
            let w0 = _mm512_loadu_ps(wk);
            let w1 = _mm512_loadu_ps(wk.add(16));
            for t in 0..M {
                let b = _mm512_set1_ps(*xp[t]);
                acc[t][0] = _mm512_fmadd_ps(b, w0, acc[t][0]);
                acc[t][1] = _mm512_fmadd_ps(b, w1, acc[t][1]);
                xp[t] = xp[t].add(1);
            }
            wk = wk.add(RB);
        }
        for (t, a) in acc.iter().enumerate() {
            if m1 == 0xFFFF {
                _mm512_storeu_ps(y.add(t * ys), a[0]);
                _mm512_storeu_ps(y.add(t * ys + 16), a[1]);
            } else {
                _mm512_mask_storeu_ps(y.add(t * ys), m0, a[0]);
                _mm512_mask_storeu_ps(y.add(t * ys + 16), m1, a[1]);
            }
        }
    }

    /// One tile of 6 tokens, columns `c0..c0 + kc`: `dst[k·6 + j] =
    /// src[j·cols + c0 + k]` (`m ≤ 6` token rows in `src`, zeros for the
    /// others): 8 columns at a time, an
    /// 8 × 8 transpose (rows 6 and 7 zero), each column stored as 8 lanes
    /// whose last 2 the next column's store overwrites.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn pack_tile6_avx2(
        src: &[f32],
        m: usize,
        cols: usize,
        c0: usize,
        kc: usize,
        dst: &mut [f32],
    ) {
        assert!(m <= 6 && src.len() >= m * cols && c0 + kc <= cols && dst.len() >= 6 * kc);
        let (sp, dp) = (src.as_ptr().add(c0), dst.as_mut_ptr());
        let six = _mm256_setr_epi32(-1, -1, -1, -1, -1, -1, 0, 0);
        let mut k0 = 0;
        while k0 + 8 <= kc {
            let mut r = [_mm256_setzero_ps(); 8];
            for (j, v) in r.iter_mut().enumerate().take(m) {
                *v = _mm256_loadu_ps(sp.add(j * cols + k0));
            }
            // column c = k0 + k
            let col = columns8(r);
            let o = dp.add(6 * k0);
            for k in 0..7 {
                _mm256_storeu_ps(o.add(6 * k), col[k]);
            }
            _mm256_maskstore_ps(o.add(42), six, col[7]);
            k0 += 8;
        }
        for k in k0..kc {
            for j in 0..6 {
                *dp.add(6 * k + j) = if j < m { *sp.add(j * cols + k) } else { 0.0 };
            }
        }
    }

    /// F16 weight rows `r0..r0 + nr`, columns `k0..k0 + kc`, as strips of
    /// 16 rows `[strip][k][16]` of u16 at `dst` (rows past `nr` zero).
    ///
    /// # Safety
    /// AVX2; `w` is F16 with those rows and columns; `dst` holds
    /// `ceil(nr / 16) · 16 · kc` values.
    #[target_feature(enable = "avx2")]
    pub unsafe fn strips_f16(
        w: &crate::matmul::weight::WeightRef,
        r0: usize,
        nr: usize,
        k0: usize,
        kc: usize,
        dst: *mut u16,
    ) {
        let kv = kc / 16 * 16;
        for s in 0..nr.div_ceil(16) {
            let rows: [Option<*const u16>; 16] = std::array::from_fn(|i| {
                let r = s * 16 + i;
                (r < nr).then(|| w.row_range(r0 + r, k0, kc).as_ptr() as *const u16)
            });
            let out = dst.add(s * kc * 16);
            for kb in (0..kv).step_by(16) {
                let mut v = [_mm256_setzero_si256(); 16];
                for (x, row) in v.iter_mut().zip(&rows) {
                    if let Some(p) = row {
                        *x = _mm256_loadu_si256(p.add(kb) as *const __m256i);
                    }
                }
                for (c, x) in transpose16_u16(v).iter().enumerate() {
                    _mm256_storeu_si256(out.add((kb + c) * 16) as *mut __m256i, *x);
                }
            }
            for k in kv..kc {
                for (i, row) in rows.iter().enumerate() {
                    *out.add(k * 16 + i) = row.map_or(0, |p| p.add(k).read_unaligned());
                }
            }
        }
    }

    /// The 16 × 16 transpose of 16-bit values: `out[c]` lane `r` =
    /// `v[r]` lane `c`.
    #[inline(always)]
    pub(super) unsafe fn transpose16_u16(v: [__m256i; 16]) -> [__m256i; 16] {
        // Within each 128-bit half (columns 0–7 / 8–15): pairs of rows
        // interleaved, then quads, then octets; then the halves.
        let mut b = [_mm256_setzero_si256(); 16];
        for p in 0..8 {
            b[2 * p] = _mm256_unpacklo_epi16(v[2 * p], v[2 * p + 1]);
            b[2 * p + 1] = _mm256_unpackhi_epi16(v[2 * p], v[2 * p + 1]);
        }
        // c[4q + j]: rows 4q..4q+4, columns 2j, 2j+1 (+8 in the high half)
        let mut c = [_mm256_setzero_si256(); 16];
        for q in 0..4 {
            c[4 * q] = _mm256_unpacklo_epi32(b[4 * q], b[4 * q + 2]);
            c[4 * q + 1] = _mm256_unpackhi_epi32(b[4 * q], b[4 * q + 2]);
            c[4 * q + 2] = _mm256_unpacklo_epi32(b[4 * q + 1], b[4 * q + 3]);
            c[4 * q + 3] = _mm256_unpackhi_epi32(b[4 * q + 1], b[4 * q + 3]);
        }
        // e[g][col]: rows 8g..8g+8 at column col (+8 in the high half)
        let mut e = [[_mm256_setzero_si256(); 8]; 2];
        for (g, e) in e.iter_mut().enumerate() {
            for j in 0..4 {
                let (x, y) = (c[8 * g + j], c[8 * g + 4 + j]);
                e[2 * j] = _mm256_unpacklo_epi64(x, y);
                e[2 * j + 1] = _mm256_unpackhi_epi64(x, y);
            }
        }
        let mut out = [_mm256_setzero_si256(); 16];
        for col in 0..8 {
            out[col] = _mm256_permute2x128_si256::<0x20>(e[0][col], e[1][col]);
            out[col + 8] = _mm256_permute2x128_si256::<0x31>(e[0][col], e[1][col]);
        }
        out
    }

    /// Lane masks (`maskload` / `maskstore`) of the first `n ≤ 16` of 16 rows.
    #[inline(always)]
    unsafe fn masks256(n: usize) -> [__m256i; 2] {
        let idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let lim = |k: usize| _mm256_set1_epi32(n.saturating_sub(k).min(8) as i32);
        [
            _mm256_cmpgt_epi32(lim(0), idx),
            _mm256_cmpgt_epi32(lim(8), idx),
        ]
    }

    /// How far ahead (floats) the packed activations are prefetched: one
    /// tile's k block (`6 · kc`), i.e. the same column of the next tile
    /// (contiguous in the `[k block][tile][kc][6]` layout), which the next
    /// call reads. Measured on an AMD Zen 5 at AVX2 (256-column steps):
    /// 1.5 KB ahead 78–85% of the FMA peak on 2048 × 8192 weights, 6 KB
    /// 84–86%, none 69%. A fixed `6 · KC_PACKED` overshoots in shorter
    /// steps: on the Zen 4, `gemm_cpu F16 hybrid` (768 columns), AVX2
    /// level, best of 10 in four alternating rounds, one thread 129.9 /
    /// 94.3 / 98.1 / 91.9 → 94.2 / 91.1 / 93.4 / 90.9 ms, two threads
    /// 108.7 / 102.1 / 115.4 / 102.2 → 94.2 / 94.7 / 102.2 / 107.2 ms.
    #[inline(always)]
    fn pf_x(kc: usize) -> usize {
        6 * kc
    }

    /// 6 tokens × 16 rows (12 accumulators, 2 weight vectors, 1 broadcast
    /// of the 16 ymm registers): the activations' broadcasts from one
    /// contiguous tile `[k][6]`, the strip `[k][16]` (in L1 across tiles).
    /// Tokens past `m` are the tile's zero padding: computed, not stored.
    /// Each output starts from `y` (unless `init`) and adds the products in
    /// `k` order, one FMA each — the other levels' order.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn mk_avx2_packed(
        m: usize,
        strip: *const f32,
        xt: *const f32,
        kc: usize,
        y: *mut f32,
        ys: usize,
        nrs: usize,
        init: bool,
    ) {
        mk_packed::<false>(m, strip as *const u8, xt, kc, y, ys, nrs, init)
    }

    /// [`mk_avx2_packed`] on a strip of f16 weights `[k][16]`, widened
    /// exactly as they are loaded (the same products, bit for bit).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn mk_avx2_packed_f16(
        m: usize,
        strip: *const u16,
        xt: *const f32,
        kc: usize,
        y: *mut f32,
        ys: usize,
        nrs: usize,
        init: bool,
    ) {
        mk_packed::<true>(m, strip as *const u8, xt, kc, y, ys, nrs, init)
    }

    /// [`mk_avx2_packed_f16`] with a strip's 16 rows in one `zmm`: per
    /// column one conversion and six FMAs taking their broadcast from
    /// memory (the same products in the same order, bit for bit).
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn mk_avx512_packed_f16(
        m: usize,
        strip: *const u16,
        xt: *const f32,
        kc: usize,
        y: *mut f32,
        ys: usize,
        nrs: usize,
        init: bool,
    ) {
        const M: usize = 6;
        let (mask, _) = masks(nrs);
        let mut acc = [_mm512_setzero_ps(); M];
        if !init {
            for (t, a) in acc.iter_mut().enumerate().take(m) {
                *a = _mm512_maskz_loadu_ps(mask, y.add(t * ys));
            }
        }
        let mut wk = strip;
        let mut xk = xt;
        for _ in 0..kc {
            _mm_prefetch::<_MM_HINT_T0>(xk.wrapping_add(pf_x(kc)) as *const i8);
            let w = _mm512_cvtph_ps(_mm256_loadu_si256(wk as *const __m256i));
            for (t, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fmadd_ps(_mm512_set1_ps(*xk.add(t)), w, *a);
            }
            wk = wk.add(16);
            xk = xk.add(M);
        }
        for (t, a) in acc.iter().enumerate().take(m) {
            _mm512_mask_storeu_ps(y.add(t * ys), mask, *a);
        }
    }

    /// The body of both: `F16` strips of u16, else of f32.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn mk_packed<const F16: bool>(
        m: usize,
        strip: *const u8,
        xt: *const f32,
        kc: usize,
        y: *mut f32,
        ys: usize,
        nrs: usize,
        init: bool,
    ) {
        const M: usize = 6;
        let full = nrs == 16;
        let mk = masks256(nrs);
        let mut acc = [[_mm256_setzero_ps(); 2]; M];
        if !init {
            for (t, a) in acc.iter_mut().enumerate().take(m) {
                let yt = y.add(t * ys);
                if full {
                    a[0] = _mm256_loadu_ps(yt);
                    a[1] = _mm256_loadu_ps(yt.add(8));
                } else {
                    a[0] = _mm256_maskload_ps(yt, mk[0]);
                    a[1] = _mm256_maskload_ps(yt.add(8), mk[1]);
                }
            }
        }
        let mut wk = strip;
        let mut xk = xt;
        for _ in 0..kc {
            _mm_prefetch::<_MM_HINT_T0>(xk.wrapping_add(pf_x(kc)) as *const i8);
            let (w0, w1) = if F16 {
                (
                    _mm256_cvtph_ps(_mm_loadu_si128(wk as *const __m128i)),
                    _mm256_cvtph_ps(_mm_loadu_si128(wk.add(16) as *const __m128i)),
                )
            } else {
                let wf = wk as *const f32;
                (_mm256_loadu_ps(wf), _mm256_loadu_ps(wf.add(8)))
            };
            for (t, a) in acc.iter_mut().enumerate() {
                let b = _mm256_broadcast_ss(&*xk.add(t));
                a[0] = _mm256_fmadd_ps(b, w0, a[0]);
                a[1] = _mm256_fmadd_ps(b, w1, a[1]);
            }
            wk = wk.add(if F16 { 32 } else { 64 });
            xk = xk.add(M);
        }
        for (t, a) in acc.iter().enumerate().take(m) {
            let yt = y.add(t * ys);
            if full {
                _mm256_storeu_ps(yt, a[0]);
                _mm256_storeu_ps(yt.add(8), a[1]);
            } else {
                _mm256_maskstore_ps(yt, mk[0], a[0]);
                _mm256_maskstore_ps(yt.add(8), mk[1], a[1]);
            }
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use crate::simd::{level, SimdLevel};
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx2")]
    unsafe fn run(m: &[u16], got: &mut [u16]) {
        let mut v = [_mm256_setzero_si256(); 16];
        for (r, x) in v.iter_mut().enumerate() {
            *x = _mm256_loadu_si256(m.as_ptr().add(16 * r) as *const __m256i);
        }
        for (c, x) in super::x86::transpose16_u16(v).iter().enumerate() {
            _mm256_storeu_si256(got.as_mut_ptr().add(16 * c) as *mut __m256i, *x);
        }
    }

    #[test]
    fn f16_strip_transpose_transposes() {
        if level() < SimdLevel::Avx2 {
            return;
        }
        let m: Vec<u16> = (0..256).collect();
        let mut got = vec![0u16; 256];
        // SAFETY: AVX2 checked above; 256 values in both.
        unsafe { run(&m, &mut got) };
        for c in 0..16 {
            for r in 0..16 {
                assert_eq!(got[16 * c + r], m[16 * r + c], "column {c} row {r}");
            }
        }
    }
}
