//! Many-token products (prefill): `y = x · Wᵀ` with the weights decoded to
//! f32 a panel at a time and laid out as strips of [`RB`] rows, `[k][RB]`,
//! so the microkernel holds a strip's rows in vector lanes and broadcasts
//! activations read in place from `x` (`[n_tokens, cols]`): an `MT tokens ×
//! RB rows` tile of `y` accumulates in registers and goes straight to `y`'s
//! rows, whole vectors each. Nothing is packed on the activation side and
//! nothing transposed on the output side.
//!
//! A work item is a panel of up to [`PANEL`] weight rows times a group of
//! tokens; its rows are decoded [`KC`] columns at a time (row by row, then
//! transposed into strips in registers). Decoding costs O(rows·cols) per
//! item while the products cost O(rows·cols·tokens), so every weight format
//! runs at f32 GEMM speed once there are enough tokens.

use super::{decode_segment, SendPtr, WeightRef};
use crate::pool::ThreadPool;
use crate::simd::tile::{transpose, Lanes, V16};
use crate::simd::SimdLevel;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Weight rows per strip: the microkernel's rows, in vector lanes.
pub const RB: usize = 32;
/// Columns decoded per step (a multiple of every block size, 256).
pub const KC: usize = 256;
/// Weight rows per work item (a multiple of [`RB`]).
pub const PANEL: usize = 96;
/// Tokens per unit of a work item's token group.
const TG: usize = 32;
/// Largest microkernel token count.
const MT_MAX: usize = 12;

thread_local! {
    /// A panel decoded row by row, `[PANEL][KC]`, and as strips,
    /// `[PANEL / RB][KC][RB]`.
    static RBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static SBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Tokens of the microkernel tile for `level`.
fn mt_for(level: SimdLevel) -> usize {
    match level {
        SimdLevel::Avx512 => MT_MAX,
        SimdLevel::Avx2 => 6,
        SimdLevel::Scalar => 4,
    }
}

pub fn gemm(
    pool: &ThreadPool,
    w: &WeightRef,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
    level: SimdLevel,
) {
    let (rows, cols) = (w.rows, w.cols);
    assert!(x.len() >= n_tokens * cols && y.len() >= n_tokens * rows);
    let nb = n_tokens.div_ceil(TG);
    let panels = rows.div_ceil(PANEL);
    // Split the tokens into groups when there are few row panels.
    let mut groups = 1;
    while panels * groups < 4 * pool.n_threads() && groups < nb {
        groups *= 2;
    }
    let groups = groups.min(nb);
    let units_per_group = nb.div_ceil(groups);
    let groups = nb.div_ceil(units_per_group);

    let yp = SendPtr(y.as_mut_ptr());
    let mt = mt_for(level);
    let n_items = panels * groups;
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
                if rbuf.len() < PANEL * KC {
                    rbuf.resize(PANEL * KC, 0.0);
                    sbuf.resize(PANEL * KC, 0.0);
                }
                let mut item = claim();
                while item < n_items {
                    let following = if next_item.load(Ordering::Relaxed) + n_threads < n_items {
                        claim()
                    } else {
                        usize::MAX
                    };
                    let (r0, nr) = rows_of(item);
                    let g = item % groups;
                    let t_begin = g * units_per_group * TG;
                    let t_end = ((g + 1) * units_per_group * TG).min(n_tokens);
                    let n_strips = nr.div_ceil(RB);
                    let mut k0 = 0;
                    while k0 < cols {
                        let kc = KC.min(cols - k0);
                        // Weight rows r0..r0+nr, columns k0..k0+kc, as f32
                        // strips [strip][k][RB] (rows past nr zero).
                        for r in 0..nr {
                            let src = w.row_range(r0 + r, k0, kc);
                            decode_segment(w.ty, src, &mut rbuf[r * kc..(r + 1) * kc], level);
                        }
                        to_strips(&rbuf, nr, kc, &mut sbuf, level);
                        // The panel's rows are many concurrent streams, more
                        // than hardware prefetchers follow: fetch the next
                        // block (of this item, else the first of the
                        // following one) ahead, spread over the token tiles
                        // so the requests overlap the products.
                        let ahead = if k0 + kc < cols {
                            Some((r0, nr, k0 + kc, KC.min(cols - k0 - kc)))
                        } else if following < n_items {
                            let (fr0, fnr) = rows_of(following);
                            Some((fr0, fnr, 0, KC.min(cols)))
                        } else {
                            None
                        };
                        let n_tiles = (t_end - t_begin).div_ceil(mt);
                        for (i, t0) in (t_begin..t_end).step_by(mt).enumerate() {
                            if let Some((pr0, pnr, pk0, pkc)) = ahead {
                                for r in i * pnr / n_tiles..(i + 1) * pnr / n_tiles {
                                    prefetch(w.row_range(pr0 + r, pk0, pkc));
                                }
                            }
                            let m = mt.min(t_end - t0);
                            for s in 0..n_strips {
                                let nrs = RB.min(nr - s * RB);
                                // SAFETY: the strip holds kc·RB values; x
                                // rows t0..t0+m have cols ≥ k0+kc values;
                                // y[t0..t0+m, r0+s·RB ..+nrs] belong to this
                                // item only.
                                unsafe {
                                    microkernel(
                                        level,
                                        m,
                                        sbuf.as_ptr().add(s * kc * RB),
                                        x.as_ptr().add(t0 * cols + k0),
                                        cols,
                                        kc,
                                        yp.get().add(t0 * rows + r0 + s * RB),
                                        rows,
                                        nrs,
                                        k0 == 0,
                                    )
                                };
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
}

/// `strips[s][k][i] = rows[(s·RB + i)·kc + k]` for rows `< nr` (0 beyond),
/// in 16 × 16 register transposes at the SIMD levels.
fn to_strips(rows: &[f32], nr: usize, kc: usize, strips: &mut [f32], level: SimdLevel) {
    assert!(rows.len() >= nr * kc && strips.len() >= nr.div_ceil(RB) * RB * kc);
    // SAFETY: the sizes are checked above; the levels are the CPU's.
    unsafe {
        match level {
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx512 => x86::to_strips_avx512(rows, nr, kc, strips),
            #[cfg(target_arch = "x86_64")]
            SimdLevel::Avx2 => x86::to_strips_avx2(rows, nr, kc, strips),
            _ => to_strips_body::<Lanes>(rows, nr, kc, strips),
        }
    }
}

/// [`to_strips`] with `V`'s transposes.
///
/// # Safety
/// `rows` holds `nr · kc` values, `strips` `ceil(nr / RB) · RB · kc`.
#[inline(always)]
unsafe fn to_strips_body<V: V16>(rows: &[f32], nr: usize, kc: usize, strips: &mut [f32]) {
    for s in 0..nr.div_ceil(RB) {
        let r0 = s * RB;
        let valid = RB.min(nr - r0);
        let dst = strips.as_mut_ptr().add(s * kc * RB);
        transpose::<V>(rows.as_ptr().add(r0 * kc), kc, valid, kc, dst, RB);
        if valid < RB {
            for k in 0..kc {
                std::slice::from_raw_parts_mut(dst.add(k * RB + valid), RB - valid).fill(0.0);
            }
        }
    }
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
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => x86::mk_avx2_dispatch(m, strip, x, xs, kc, y, ys, nrs, init),
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::RB;
    use crate::simd::tile::x86::Pair;
    use std::arch::x86_64::*;

    #[target_feature(enable = "avx512f")]
    pub unsafe fn to_strips_avx512(rows: &[f32], nr: usize, kc: usize, strips: &mut [f32]) {
        super::to_strips_body::<__m512>(rows, nr, kc, strips)
    }

    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn to_strips_avx2(rows: &[f32], nr: usize, kc: usize, strips: &mut [f32]) {
        super::to_strips_body::<Pair>(rows, nr, kc, strips)
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
    dispatch!(mk_avx2_dispatch, mk_avx2, 1 2 3 4 5 6);

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

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn mk_avx2<const M: usize>(
        strip: *const f32,
        x: *const f32,
        xs: usize,
        kc: usize,
        y: *mut f32,
        ys: usize,
        nrs: usize,
        init: bool,
    ) {
        // Each half of the strip (16 rows, 2 ymm) in turn: M tokens x 2 ymm
        // accumulators, the activations broadcast twice (from L1).
        let mut buf = [0f32; 16];
        for h in 0..RB / 16 {
            let n = nrs.saturating_sub(16 * h).min(16);
            if n == 0 {
                break;
            }
            let mut acc = [[_mm256_setzero_ps(); 2]; M];
            if !init {
                for (t, a) in acc.iter_mut().enumerate() {
                    let yt = y.add(t * ys + 16 * h);
                    let src = if n == 16 {
                        yt as *const f32
                    } else {
                        buf[..n].copy_from_slice(std::slice::from_raw_parts(yt, n));
                        buf.as_ptr()
                    };
                    a[0] = _mm256_loadu_ps(src);
                    a[1] = _mm256_loadu_ps(src.add(8));
                }
            }
            let mut xp = [x; M];
            for (t, p) in xp.iter_mut().enumerate() {
                *p = x.add(t * xs);
            }
            let mut wk = strip.add(16 * h);
            for _ in 0..kc {
                let w0 = _mm256_loadu_ps(wk);
                let w1 = _mm256_loadu_ps(wk.add(8));
                for t in 0..M {
                    let b = _mm256_set1_ps(*xp[t]);
                    acc[t][0] = _mm256_fmadd_ps(b, w0, acc[t][0]);
                    acc[t][1] = _mm256_fmadd_ps(b, w1, acc[t][1]);
                    xp[t] = xp[t].add(1);
                }
                wk = wk.add(RB);
            }
            for (t, a) in acc.iter().enumerate() {
                let yt = y.add(t * ys + 16 * h);
                if n == 16 {
                    _mm256_storeu_ps(yt, a[0]);
                    _mm256_storeu_ps(yt.add(8), a[1]);
                } else {
                    _mm256_storeu_ps(buf.as_mut_ptr(), a[0]);
                    _mm256_storeu_ps(buf.as_mut_ptr().add(8), a[1]);
                    std::slice::from_raw_parts_mut(yt, n).copy_from_slice(&buf[..n]);
                }
            }
        }
    }
}
