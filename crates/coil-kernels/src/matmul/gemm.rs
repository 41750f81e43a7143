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
        SimdLevel::Avx2 => 3,
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

/// `strips[s][k][i] = rows[(s·RB + i)·kc + k]` for rows `< nr` (0 beyond).
fn to_strips(rows: &[f32], nr: usize, kc: usize, strips: &mut [f32], level: SimdLevel) {
    for s in 0..nr.div_ceil(RB) {
        let dst = &mut strips[s * kc * RB..(s + 1) * kc * RB];
        for h in 0..RB / 16 {
            let r0 = s * RB + 16 * h;
            let valid = nr.saturating_sub(r0).min(16);
            let mut k = 0;
            #[cfg(target_arch = "x86_64")]
            if level >= SimdLevel::Avx512 {
                while k + 16 <= kc {
                    // SAFETY: AVX-512 checked; rows r0..r0+valid have kc
                    // values from k, dst rows k..k+16 have RB values.
                    unsafe { x86::strip16(rows, kc, r0, valid, k, dst, 16 * h) };
                    k += 16;
                }
            }
            let _ = level;
            for kk in k..kc {
                let d = &mut dst[kk * RB + 16 * h..kk * RB + 16 * h + 16];
                for (i, v) in d.iter_mut().enumerate() {
                    *v = if i < valid {
                        rows[(r0 + i) * kc + kk]
                    } else {
                        0.0
                    };
                }
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
    use std::arch::x86_64::*;

    /// `dst[(k0 + k)·RB + c0 + i] = rows[(r0 + i)·kc + k0 + k]` for
    /// `k < 16`, `i < 16` (rows `i ≥ valid` give 0): one 16 × 16 block of a
    /// panel's transpose into strips.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn strip16(
        rows: &[f32],
        kc: usize,
        r0: usize,
        valid: usize,
        k0: usize,
        dst: &mut [f32],
        c0: usize,
    ) {
        assert!(valid == 0 || (r0 + valid - 1) * kc + k0 + 16 <= rows.len());
        assert!((k0 + 15) * RB + c0 + 16 <= dst.len());
        let r: [__m512; 16] = std::array::from_fn(|i| {
            if i < valid {
                _mm512_loadu_ps(rows.as_ptr().add((r0 + i) * kc + k0))
            } else {
                _mm512_setzero_ps()
            }
        });
        let out = transpose16_regs(&r);
        let d = dst.as_mut_ptr();
        for (k, v) in out.iter().enumerate() {
            _mm512_storeu_ps(d.add((k0 + k) * RB + c0), *v);
        }
    }

    /// The transpose of a 16 x 16 block held in registers: lane `i` of
    /// `out[k]` is lane `k` of `r[i]`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn transpose16_regs(r: &[__m512; 16]) -> [__m512; 16] {
        // Per 128-bit lane L: t[2i] = [a0 b0 a1 b1], t[2i+1] = [a2 b2 a3 b3]
        // (a = row 2i, b = row 2i+1, elements 4L + ·).
        let t: [__m512; 16] = std::array::from_fn(|i| {
            let (a, b) = (r[i & !1], r[i | 1]);
            if i % 2 == 0 {
                _mm512_unpacklo_ps(a, b)
            } else {
                _mm512_unpackhi_ps(a, b)
            }
        });
        // u[4i + j], lane L: rows 4i..4i+3 of element 4L + j.
        let u: [__m512; 16] = std::array::from_fn(|n| {
            let (i, j) = (n / 4, n % 4);
            let (a, b) = (t[4 * i + j / 2], t[4 * i + 2 + j / 2]);
            if j % 2 == 0 {
                _mm512_shuffle_ps::<0x44>(a, b)
            } else {
                _mm512_shuffle_ps::<0xEE>(a, b)
            }
        });
        // out[4m + j] = [u[j].m, u[4+j].m, u[8+j].m, u[12+j].m] (lanes).
        let mut out = [_mm512_setzero_ps(); 16];
        for j in 0..4 {
            let p0 = _mm512_shuffle_f32x4::<0x44>(u[j], u[4 + j]);
            let p1 = _mm512_shuffle_f32x4::<0xEE>(u[j], u[4 + j]);
            let q0 = _mm512_shuffle_f32x4::<0x44>(u[8 + j], u[12 + j]);
            let q1 = _mm512_shuffle_f32x4::<0xEE>(u[8 + j], u[12 + j]);
            out[j] = _mm512_shuffle_f32x4::<0x88>(p0, q0);
            out[4 + j] = _mm512_shuffle_f32x4::<0xDD>(p0, q0);
            out[8 + j] = _mm512_shuffle_f32x4::<0x88>(p1, q1);
            out[12 + j] = _mm512_shuffle_f32x4::<0xDD>(p1, q1);
        }
        out
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
    dispatch!(mk_avx2_dispatch, mk_avx2, 1 2 3);

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
        // M tokens x 4 ymm (32 rows).
        let mut acc = [[_mm256_setzero_ps(); 4]; M];
        let mut buf = [0f32; RB];
        if !init {
            for (t, a) in acc.iter_mut().enumerate() {
                buf[..nrs].copy_from_slice(std::slice::from_raw_parts(y.add(t * ys), nrs));
                for (j, v) in a.iter_mut().enumerate() {
                    *v = _mm256_loadu_ps(buf.as_ptr().add(8 * j));
                }
            }
        }
        let mut xp = [x; M];
        for (t, p) in xp.iter_mut().enumerate() {
            *p = x.add(t * xs);
        }
        let mut wk = strip;
        for _ in 0..kc {
            let wv: [__m256; 4] = std::array::from_fn(|j| _mm256_loadu_ps(wk.add(8 * j)));
            for t in 0..M {
                let b = _mm256_set1_ps(*xp[t]);
                for j in 0..4 {
                    acc[t][j] = _mm256_fmadd_ps(b, wv[j], acc[t][j]);
                }
                xp[t] = xp[t].add(1);
            }
            wk = wk.add(RB);
        }
        for (t, a) in acc.iter().enumerate() {
            for (j, v) in a.iter().enumerate() {
                _mm256_storeu_ps(buf.as_mut_ptr().add(8 * j), *v);
            }
            std::slice::from_raw_parts_mut(y.add(t * ys), nrs).copy_from_slice(&buf[..nrs]);
        }
    }
}
