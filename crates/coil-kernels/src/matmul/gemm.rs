//! Many-token products (prefill): weights decoded to f32 a panel at a time,
//! activations packed once per call, and an f32 register-tile microkernel.
//!
//! Layout: the activations `x` (`[n_tokens, cols]`) are packed into blocks of
//! [`TB`] tokens, `xp[block][k][TB]` (zero padded), so the microkernel loads
//! `TB` tokens of one column as vectors and broadcasts one weight value per
//! row: an `MR x TB` tile of `y^T` accumulates in registers. A work item is a
//! panel of up to [`PANEL`] weight rows times a group of token blocks; its
//! rows are decoded to f32 [`KC`] columns at a time (F32 weights aligned in
//! memory are read in place). Decoding costs O(rows·cols) per item while the
//! products cost O(rows·cols·tokens), so every weight format runs at f32
//! GEMM speed once there are enough tokens.

use super::{decode_segment, SendPtr, WeightRef};
use crate::pool::ThreadPool;
use crate::simd::SimdLevel;
use coil_gguf::GgmlType;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Tokens per packed activation block.
pub const TB: usize = 32;
/// Columns decoded per step (a multiple of every block size, 256): one
/// packed activation block of `TB x KC` f32 (32 KiB) stays in L1.
pub const KC: usize = 256;
/// Weight rows per work item (a multiple of every microkernel's row count).
pub const PANEL: usize = 96;
/// Largest microkernel row count.
const MR_MAX: usize = 12;

thread_local! {
    static WBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static CBUF: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Packs `x` (`[n_tokens, cols]`) into `xp` as `[ceil(n/TB)][cols][TB]`
/// (padding tokens zero). `xp` is reused between calls: a fresh multi-MB
/// buffer per call would cost page faults comparable to the product itself.
fn pack_x(
    pool: &ThreadPool,
    x: &[f32],
    n_tokens: usize,
    cols: usize,
    xp: &mut Vec<f32>,
    level: SimdLevel,
) {
    let nb = n_tokens.div_ceil(TB);
    if xp.len() < nb * cols * TB {
        xp.resize(nb * cols * TB, 0.0);
    }
    // Every element in use is written below (full blocks by copying, the
    // last partial block by zero-filling first).
    let ptr = SendPtr(xp.as_mut_ptr());
    pool.parallel_for(nb, 1, |range, _| {
        for b in range {
            // SAFETY: block b owns xp[b*cols*TB .. (b+1)*cols*TB].
            let dst =
                unsafe { std::slice::from_raw_parts_mut(ptr.get().add(b * cols * TB), cols * TB) };
            let nt = TB.min(n_tokens - b * TB);
            if nt < TB {
                dst.fill(0.0);
            }
            // Whole blocks with AVX-512: 16 x 16 transposes in registers.
            let mut k0 = 0;
            #[cfg(target_arch = "x86_64")]
            if nt == TB && level >= SimdLevel::Avx512 {
                let xb = &x[b * TB * cols..(b + 1) * TB * cols];
                while k0 + 16 <= cols {
                    for h in 0..TB / 16 {
                        // SAFETY: AVX-512 checked; rows 16h..16h+16 of the
                        // block, columns k0..k0+16, exist in xb and dst.
                        unsafe { x86::transpose16(xb, cols, 16 * h, k0, dst) };
                    }
                    k0 += 16;
                }
            }
            let _ = level;
            // The rest (column blocks of 64 keep the written part, 8 KiB, in
            // L1 while the tokens' rows are read).
            while k0 < cols {
                let k1 = (k0 + 64).min(cols);
                for t in 0..nt {
                    let src = &x[(b * TB + t) * cols + k0..(b * TB + t) * cols + k1];
                    for (k, &v) in src.iter().enumerate() {
                        dst[(k0 + k) * TB + t] = v;
                    }
                }
                k0 = k1;
            }
        }
    });
}

thread_local! {
    /// The calling thread's packed-activation buffer.
    static XP: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Rows of the microkernel tile for `level`.
fn mr_for(level: SimdLevel) -> usize {
    match level {
        SimdLevel::Avx512 => 12,
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
    // Reuse this thread's buffer (taken out so nested use cannot alias it).
    let mut xp = XP.with(|b| std::mem::take(&mut *b.borrow_mut()));
    pack_x(pool, x, n_tokens, cols, &mut xp, level);
    let nb = n_tokens.div_ceil(TB);
    let panels = rows.div_ceil(PANEL);
    // Split the token blocks into groups when there are few row panels.
    let mut groups = 1;
    while panels * groups < 4 * pool.n_threads() && groups < nb {
        groups *= 2;
    }
    let groups = groups.min(nb);
    let blocks_per_group = nb.div_ceil(groups);
    let groups = nb.div_ceil(blocks_per_group);

    // F32 weights aligned for f32 access are read in place.
    let direct: Option<&[f32]> = if w.ty == GgmlType::F32 && cfg!(target_endian = "little") {
        // SAFETY: any bit pattern is a valid f32; align_to handles alignment.
        let (pre, mid, post) = unsafe { w.data.align_to::<f32>() };
        (pre.is_empty() && post.is_empty()).then_some(mid)
    } else {
        None
    };

    let yp = SendPtr(y.as_mut_ptr());
    let mr = mr_for(level);
    let row_tiles_max = PANEL.div_ceil(mr);
    let n_items = panels * groups;
    // Work items are claimed one ahead, so the first weight block of the
    // next item can be fetched while this one computes — except for the
    // last few, which go to whichever thread is free first (claimed ahead,
    // they could leave one thread a whole item behind the other).
    let next_item = AtomicUsize::new(0);
    let claim = || next_item.fetch_add(1, Ordering::Relaxed);
    let n_threads = pool.n_threads();
    // Rows r0.. of the panel of `item`, columns k0..k0+KC (clipped).
    let rows_of = |item: usize| {
        let r0 = (item / groups) * PANEL;
        (r0, PANEL.min(rows - r0))
    };
    pool.parallel_for(pool.n_threads(), 1, |_, _| {
        WBUF.with(|wbuf| {
            CBUF.with(|cbuf| {
                let mut wbuf = wbuf.borrow_mut();
                let mut cbuf = cbuf.borrow_mut();
                if direct.is_none() && wbuf.len() < PANEL * KC {
                    wbuf.resize(PANEL * KC, 0.0);
                }
                // Accumulators: [block in group][row tile][MR_MAX][TB].
                let csize = blocks_per_group * row_tiles_max * MR_MAX * TB;
                if cbuf.len() < csize {
                    cbuf.resize(csize, 0.0);
                }
                let mut item = claim();
                while item < n_items {
                    let following = if next_item.load(Ordering::Relaxed) + n_threads < n_items {
                        claim()
                    } else {
                        usize::MAX
                    };
                    let g = item % groups;
                    let (r0, nr) = rows_of(item);
                    let b0 = g * blocks_per_group;
                    let b1 = (b0 + blocks_per_group).min(nb);
                    let mut k0 = 0;
                    while k0 < cols {
                        let kc = KC.min(cols - k0);
                        // Weight rows r0..r0+nr, columns k0..k0+kc, as f32.
                        let (wbase, ws): (*const f32, usize) = match direct {
                            Some(wf) => (wf[r0 * cols + k0..].as_ptr(), cols),
                            None => {
                                for r in 0..nr {
                                    let src = w.row_range(r0 + r, k0, kc);
                                    decode_segment(
                                        w.ty,
                                        src,
                                        &mut wbuf[r * kc..(r + 1) * kc],
                                        level,
                                    );
                                }
                                (wbuf.as_ptr(), kc)
                            }
                        };
                        // The panel's rows are many concurrent streams, more than
                        // hardware prefetchers follow: fetch the next block
                        // (of this item, else the first of the following
                        // one) ahead, spread over the token blocks so the
                        // requests overlap the products.
                        let ahead = if k0 + kc < cols {
                            Some((r0, nr, k0 + kc, KC.min(cols - k0 - kc)))
                        } else if following < n_items {
                            let (fr0, fnr) = rows_of(following);
                            Some((fr0, fnr, 0, KC.min(cols)))
                        } else {
                            None
                        };
                        let nbk = b1 - b0;
                        for b in b0..b1 {
                            if let Some((pr0, pnr, pk0, pkc)) = ahead {
                                let i = b - b0;
                                for r in i * pnr / nbk..(i + 1) * pnr / nbk {
                                    prefetch(w.row_range(pr0 + r, pk0, pkc));
                                }
                            }
                            let xb = &xp[(b * cols + k0) * TB..(b * cols + k0 + kc) * TB];
                            let mut rt = 0;
                            while rt < nr {
                                let m = mr.min(nr - rt);
                                let ci = ((b - b0) * row_tiles_max + rt / mr) * MR_MAX * TB;
                                let tile = &mut cbuf[ci..ci + MR_MAX * TB];
                                // SAFETY: rows rt..rt+m of the panel exist with
                                // stride ws and at least kc columns.
                                unsafe {
                                    let wr = wbase.add(rt * ws);
                                    microkernel(level, m, wr, ws, xb, kc, tile, k0 == 0);
                                }
                                rt += m;
                            }
                        }
                        k0 += kc;
                    }
                    // Scatter the accumulators to y.
                    for b in b0..b1 {
                        let t0 = b * TB;
                        let nt = TB.min(n_tokens - t0);
                        #[cfg(target_arch = "x86_64")]
                        if level >= SimdLevel::Avx512 {
                            // With MR_MAX rows per tile the block's tiles
                            // are one [nr][TB] array: scatter 16 rows at a
                            // time, so each token's row of y gets whole
                            // vectors.
                            debug_assert_eq!(mr, MR_MAX);
                            let ci = (b - b0) * row_tiles_max * MR_MAX * TB;
                            let block = &cbuf[ci..ci + nr * TB];
                            for r in (0..nr).step_by(16) {
                                // SAFETY: AVX-512 checked; y[t0+t, r0+r ..
                                // +16] for t < nt belongs to this item only.
                                unsafe {
                                    x86::scatter_tile(
                                        &block[r * TB..],
                                        16.min(nr - r),
                                        nt,
                                        yp.get().add(t0 * rows + r0 + r),
                                        rows,
                                    )
                                };
                            }
                            continue;
                        }
                        let mut rt = 0;
                        while rt < nr {
                            let m = mr.min(nr - rt);
                            let ci = ((b - b0) * row_tiles_max + rt / mr) * MR_MAX * TB;
                            let tile = &cbuf[ci..ci + MR_MAX * TB];
                            for t in 0..nt {
                                // SAFETY: y[t0+t, r0+rt .. +m] belongs to this item only.
                                let o = unsafe {
                                    std::slice::from_raw_parts_mut(
                                        yp.get().add((t0 + t) * rows + r0 + rt),
                                        m,
                                    )
                                };
                                for (r, ov) in o.iter_mut().enumerate() {
                                    *ov = tile[r * TB + t];
                                }
                            }
                            rt += m;
                        }
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
    XP.with(|b| *b.borrow_mut() = xp);
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

/// `tile[r*TB + t] (+)= sum_k w[r*ws + k] * xb[k*TB + t]` for `r < m`
/// (`init`: overwrite instead of accumulate).
///
/// # Safety
/// `w` must be valid for `m` rows of stride `ws` with `kc` values each;
/// `xb.len() >= kc * TB`; `m <= mr_for(level)`; `level` supported by the CPU.
unsafe fn microkernel(
    level: SimdLevel,
    m: usize,
    w: *const f32,
    ws: usize,
    xb: &[f32],
    kc: usize,
    tile: &mut [f32],
    init: bool,
) {
    debug_assert!(xb.len() >= kc * TB && tile.len() >= MR_MAX * TB);
    match level {
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx512 => {
            x86::mk_avx512_dispatch(m, w, ws, xb.as_ptr(), kc, tile.as_mut_ptr(), init)
        }
        #[cfg(target_arch = "x86_64")]
        SimdLevel::Avx2 => {
            x86::mk_avx2_dispatch(m, w, ws, xb.as_ptr(), kc, tile.as_mut_ptr(), init)
        }
        _ => {
            if init {
                tile.fill(0.0);
            }
            for (r, trow) in tile.chunks_exact_mut(TB).enumerate().take(m) {
                let wr = std::slice::from_raw_parts(w.add(r * ws), kc);
                for (k, &wv) in wr.iter().enumerate() {
                    let xk = &xb[k * TB..k * TB + TB];
                    for t in 0..TB {
                        trow[t] += wv * xk[t];
                    }
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::TB;
    use std::arch::x86_64::*;

    /// `y[t * ys + r] = tile[r * TB + t]` for `r < m ≤ 16`, `t < nt ≤ TB`:
    /// an accumulator tile (`[rows][TB]`) to its rows of `y`, transposed in
    /// registers and stored with masks.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn scatter_tile(tile: &[f32], m: usize, nt: usize, y: *mut f32, ys: usize) {
        assert!(m <= 16 && nt <= TB && tile.len() >= m * TB);
        let mask: u16 = if m >= 16 { 0xFFFF } else { (1u16 << m) - 1 };
        for h in 0..nt.div_ceil(16) {
            let r: [__m512; 16] = std::array::from_fn(|i| {
                if i < m {
                    _mm512_loadu_ps(tile.as_ptr().add(i * TB + 16 * h))
                } else {
                    _mm512_setzero_ps()
                }
            });
            let out = transpose16_regs(&r);
            let yh = y.add(16 * h * ys);
            if m == 16 && nt - 16 * h >= 16 {
                for (k, v) in out.iter().enumerate() {
                    _mm512_storeu_ps(yh.add(k * ys), *v);
                }
            } else {
                for (k, v) in out.iter().enumerate().take(nt - 16 * h) {
                    _mm512_mask_storeu_ps(yh.add(k * ys), mask, *v);
                }
            }
        }
    }

    /// `dst[(k0 + k) * TB + t0 + r] = x[(t0 + r) * cols + k0 + k]` for
    /// `r, k < 16`: one 16 x 16 block of the activation transpose.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn transpose16(x: &[f32], cols: usize, t0: usize, k0: usize, dst: &mut [f32]) {
        assert!((t0 + 15) * cols + k0 + 16 <= x.len());
        assert!((k0 + 15) * TB + t0 + 16 <= dst.len());
        let r: [__m512; 16] =
            std::array::from_fn(|i| _mm512_loadu_ps(x.as_ptr().add((t0 + i) * cols + k0)));
        let out = transpose16_regs(&r);
        let d = dst.as_mut_ptr();
        for (k, v) in out.iter().enumerate() {
            _mm512_storeu_ps(d.add((k0 + k) * TB + t0), *v);
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
            pub unsafe fn $name(
                m: usize, w: *const f32, ws: usize, xb: *const f32, kc: usize,
                tile: *mut f32, init: bool,
            ) {
                match m {
                    $($m => $kern::<$m>(w, ws, xb, kc, tile, init),)*
                    _ => unreachable!("microkernel rows {m}"),
                }
            }
        };
    }
    dispatch!(mk_avx512_dispatch, mk_avx512, 1 2 3 4 5 6 7 8 9 10 11 12);
    dispatch!(mk_avx2_dispatch, mk_avx2, 1 2 3 4 5 6);

    #[target_feature(enable = "avx512f")]
    unsafe fn mk_avx512<const M: usize>(
        w: *const f32,
        ws: usize,
        xb: *const f32,
        kc: usize,
        tile: *mut f32,
        init: bool,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; M];
        if !init {
            for r in 0..M {
                acc[r][0] = _mm512_loadu_ps(tile.add(r * TB));
                acc[r][1] = _mm512_loadu_ps(tile.add(r * TB + 16));
            }
        }
        let mut wp = [w; M];
        for (r, p) in wp.iter_mut().enumerate() {
            *p = w.add(r * ws);
        }
        let mut xk = xb;
        for _ in 0..kc {
            let x0 = _mm512_loadu_ps(xk);
            let x1 = _mm512_loadu_ps(xk.add(16));
            for r in 0..M {
                let b = _mm512_set1_ps(*wp[r]);
                acc[r][0] = _mm512_fmadd_ps(b, x0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(b, x1, acc[r][1]);
                wp[r] = wp[r].add(1);
            }
            xk = xk.add(TB);
        }
        for r in 0..M {
            _mm512_storeu_ps(tile.add(r * TB), acc[r][0]);
            _mm512_storeu_ps(tile.add(r * TB + 16), acc[r][1]);
        }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn mk_avx2<const M: usize>(
        w: *const f32,
        ws: usize,
        xb: *const f32,
        kc: usize,
        tile: *mut f32,
        init: bool,
    ) {
        // Two passes of 16 tokens each: 6 rows x 2 ymm accumulators.
        for h in 0..2 {
            let mut acc = [[_mm256_setzero_ps(); 2]; M];
            if !init {
                for r in 0..M {
                    acc[r][0] = _mm256_loadu_ps(tile.add(r * TB + 16 * h));
                    acc[r][1] = _mm256_loadu_ps(tile.add(r * TB + 16 * h + 8));
                }
            }
            let mut xk = xb.add(16 * h);
            let mut wp = [w; M];
            for (r, p) in wp.iter_mut().enumerate() {
                *p = w.add(r * ws);
            }
            for _ in 0..kc {
                let x0 = _mm256_loadu_ps(xk);
                let x1 = _mm256_loadu_ps(xk.add(8));
                for r in 0..M {
                    let b = _mm256_set1_ps(*wp[r]);
                    acc[r][0] = _mm256_fmadd_ps(b, x0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(b, x1, acc[r][1]);
                    wp[r] = wp[r].add(1);
                }
                xk = xk.add(TB);
            }
            for r in 0..M {
                _mm256_storeu_ps(tile.add(r * TB + 16 * h), acc[r][0]);
                _mm256_storeu_ps(tile.add(r * TB + 16 * h + 8), acc[r][1]);
            }
        }
    }
}
