//! Chunked "state space duality" (SSD) scan for Mamba-2 prompt processing
//! (Dao & Gu 2024, §6): within a chunk of `L` tokens, with `c = cumsum(dt·A)`,
//!
//! ```text
//! Y_diag[l] = Σ_{s≤l} (C_l·B_s) · exp(c_l − c_s) · dt_s · x_s
//! Y_off[l]  = exp(c_l) · (S · C_l)                 (the state entering the chunk)
//! S'        = exp(c_{L−1}) · S + Σ_s exp(c_{L−1} − c_s) · dt_s · x_s ⊗ B_s
//! y         = Y_diag + Y_off + D · x
//! ```
//!
//! The same result as the token-by-token recurrence ([`super::scan::mamba2_scan`])
//! up to f32 rounding, with the state read and written once per chunk
//! instead of once per token and `C·Bᵀ` shared by the heads of a group.
//!
//! Every term is a small matrix product, computed by one register-tiled
//! micro-kernel (`MR` rows × up to 4 vectors of 16 columns held in
//! registers, one operand broadcast, the other loaded contiguously):
//!
//! | product | rows × cols, depth | broadcast | loaded |
//! |---|---|---|---|
//! | `G = C·Bᵀ` (per group) | `L × L`, `N` | `C[l, n]` | `Bᵀ[n, s]` |
//! | `Y_off = C·S` | `L × P`, `N` | `C[l, n]` | `Sᵀ[n, p]` |
//! | `Y_diag = M·X` | `L × P`, `s ≤ l` | `M[l, s]` | `X[s, p]` |
//! | `Sᵀ' = Bᵀ·(coef ⊙ X)` | `N × P`, `L` | `Bᵀ[n, s]` | `X[s, p]·coef_s` |
//!
//! with `M[l, s] = G[l, s] · exp(c_l − c_s) · dt_s` (lower triangle). A call
//! runs in windows of chunks: first C, Bᵀ and `G` of every (group, chunk) of
//! the window (in parallel), then every head over the window's chunks (in
//! parallel), its state held transposed (`[N, P]`) in a per-thread buffer.

use super::dims::{Mamba2Dims, ScanInputs};
use crate::pool::SendPtr;
use crate::pool::ThreadPool;
use crate::simd::math::exp_fast;
use crate::simd::tile::{fma_tile, store_tile, transpose, Lanes, V16};
use crate::simd::{level, SimdLevel};
use std::cell::RefCell;
use std::ops::Range;

/// Tokens per chunk. The work per token is `4·N·P` (state update and
/// output, as in the recurrence) plus `≈ L·P` (the intra-chunk products)
/// plus a per-chunk overhead: at mamba2-370m sizes 32 and 64 measure the
/// same (within 3%, 16 to 2048 tokens), 128 is 15% slower.
pub const DEFAULT_CHUNK: usize = 64;

/// Tokens of one sequence from which [`mamba2_chunked_scan`] is faster
/// than the token-by-token [`super::scan::mamba2_scan`] at the current SIMD
/// level. Measured on a mamba2-370m layer (32 heads × 64, d_state 128) from
/// a non-zero state, CPU time of one thread, SSD ÷ recurrence:
///
/// | level | 4 tokens | 8 | 16 | 32 | 512 |
/// |---|---|---|---|---|---|
/// | AVX-512 | 0.88 | 0.61 | 0.44 | 0.33 | 0.29 |
/// | AVX2 | 1.14 | 0.87 | 0.68 | 0.62 | 0.60 |
/// | portable (x86-64, SSE2) | 1.79 | 1.24 | 0.96 | 0.84 | 0.81 |
///
/// Its fixed cost per call (the state transposed in and out, then read by
/// `Y_off` and read and written by the update of every chunk, where the
/// recurrence streams it once per token) makes SSD lose on a few tokens.
pub fn min_tokens() -> usize {
    match level() {
        SimdLevel::Avx512 | SimdLevel::Avx2 => 8,
        SimdLevel::Scalar => 32,
    }
}

/// Tokens per window (rounded down to whole chunks): bounds the memory of
/// the per-group products to a few hundred KiB per group.
const WINDOW_TOKENS: usize = 1024;

/// Row counts of packed operands are padded to a multiple of this (a
/// multiple of every level's micro-kernel row count).
const ROW_PAD: usize = 6;

/// `G` tile: `out[r][..] = Σ_n C[r, n] · Bᵀ[n, ..]`.
#[inline(always)]
unsafe fn g_tile<V: V16, const MR: usize, const NV: usize>(
    c: *const f32,
    n: usize,
    bt: *const f32,
    ldb: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[V::zero(); NV]; MR];
    fma_tile(&mut acc, c, n, bt, ldb, n);
    store_tile(&acc, out, ldo, MR);
}

/// Output tile: `y[r] = exp(c_r)·(C_r·Sᵀ) + Σ_{s<ks} M[r, s]·X[s] + D·X[r]`
/// (the first product skipped for a zero state).
#[inline(always)]
unsafe fn y_tile<V: V16, const MR: usize, const NV: usize>(t: &YTile, col: usize) {
    let mut acc = [[V::zero(); NV]; MR];
    if t.with_state {
        fma_tile(&mut acc, t.c, t.n, t.st.add(col), t.ldp, t.n);
        for r in 0..MR {
            let e = V::splat(*t.el.add(r));
            for j in 0..NV {
                acc[r][j] = V::mul(acc[r][j], e);
            }
        }
    }
    fma_tile(&mut acc, t.m, t.ldm, t.xs.add(col), t.ldx, t.ks);
    let d = V::splat(t.dh);
    let xl = t.xl.add(col);
    for r in 0..MR.min(t.rows) {
        for j in 0..NV {
            let xv = V::load(xl.add(r * t.ldx + 16 * j));
            acc[r][j] = V::fma(d, xv, acc[r][j]);
        }
    }
    store_tile(&acc, t.out.add(col), t.ldo, t.rows);
}

/// The operands of one output row tile, at column 0 (`y_tile` adds the
/// column block's offset to `st`, `xs`, `xl` and `out`).
struct YTile {
    /// Sᵀ (stride `ldp`) and X (stride `ldx`), all rows.
    st: *const f32,
    xs: *const f32,
    ldx: usize,
    /// C rows of the tile (stride `n`); `el`: `exp(c_l)` of its rows.
    c: *const f32,
    el: *const f32,
    n: usize,
    with_state: bool,
    /// M rows of the tile (stride `ldm`), `ks` columns used.
    m: *const f32,
    ldm: usize,
    ks: usize,
    /// X rows of the tile (for `D·x`).
    xl: *const f32,
    ldp: usize,
    dh: f32,
    /// Output rows (stride `ldo`); `rows` of X and the output are valid.
    out: *mut f32,
    ldo: usize,
    rows: usize,
}

/// State tile in place: `Sᵀ[r] = decay·Sᵀ[r] + Σ_{s<ks} Bᵀ[r, s]·Xc[s]`.
#[inline(always)]
unsafe fn s_tile<V: V16, const MR: usize, const NV: usize>(
    st: *mut f32,
    ldp: usize,
    decay: f32,
    bt: *const f32,
    ldb: usize,
    xc: *const f32,
    ks: usize,
) {
    let dv = V::splat(decay);
    let mut acc = [[V::zero(); NV]; MR];
    for r in 0..MR {
        for j in 0..NV {
            acc[r][j] = V::mul(V::load(st.add(r * ldp + 16 * j)), dv);
        }
    }
    fma_tile(&mut acc, bt, ldb, xc, ldp, ks);
    store_tile(&acc, st, ldp, MR);
}

/// Calls `$f::<V, MR, nv>` for a runtime `nv` in 1..=4.
macro_rules! with_nv {
    ($nv:expr, $f:ident::<$v:ident, $mr:ident>($($arg:expr),* $(,)?)) => {
        match $nv {
            1 => $f::<$v, $mr, 1>($($arg),*),
            2 => $f::<$v, $mr, 2>($($arg),*),
            3 => $f::<$v, $mr, 3>($($arg),*),
            _ => $f::<$v, $mr, 4>($($arg),*),
        }
    };
}

/// Column blocks `(first vector, vectors)` of at most `nvmax` vectors
/// covering `nvec` vectors of 16.
#[inline(always)]
fn col_blocks(nvec: usize, nvmax: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..nvec)
        .step_by(nvmax)
        .map(move |j0| (j0, nvmax.min(nvec - j0)))
}

/// Sizes and inputs of one call, and the window being processed.
struct Ctx<'a> {
    hn: usize,
    p: usize,
    n: usize,
    /// Heads per group.
    hpg: usize,
    chunk: usize,
    /// Padded sizes: P to 16 (`pp`), the chunk to 16 (`lp`) and to
    /// [`ROW_PAD`] (`lr`), N to [`ROW_PAD`] (`nr`).
    pp: usize,
    lp: usize,
    lr: usize,
    nr: usize,
    x: &'a [f32],
    /// Floats between consecutive tokens of `x`, and of `b` and `c`.
    ldx: usize,
    ldbc: usize,
    dt: &'a [f32],
    a: &'a [f32],
    b: &'a [f32],
    c: &'a [f32],
    d: Option<&'a [f32]>,
    state: SendPtr<f32>,
    y: SendPtr<f32>,
    /// Per (group, chunk of the window): C `[lr, n]`, Bᵀ `[nr, lp]`,
    /// G `[lr, lp]`, [`Ctx::item_len`] floats each.
    prep: SendPtr<f32>,
    /// The window: tokens `t0..t1`, `n_chunks` chunks.
    t0: usize,
    t1: usize,
    n_chunks: usize,
}

impl Ctx<'_> {
    fn item_len(&self) -> usize {
        self.lr * self.n + self.nr * self.lp + self.lr * self.lp
    }

    /// Tokens `t0..t0 + len` of chunk `ck` of the window.
    fn chunk_span(&self, ck: usize) -> (usize, usize) {
        let t0 = self.t0 + ck * self.chunk;
        (t0, self.chunk.min(self.t1 - t0))
    }
}

/// Packs C and Bᵀ of (group, chunk) items and computes `G = C·Bᵀ` (the
/// row tiles' lower-triangle column blocks).
///
/// # Safety
/// `cx.prep` holds `n_group · n_chunks` items; items are disjoint per call.
#[inline(always)]
unsafe fn prep_body<V: V16, const MR: usize, const NVMAX: usize>(cx: &Ctx, items: Range<usize>) {
    debug_assert!(ROW_PAD.is_multiple_of(MR));
    let (n, lp, lr, nr) = (cx.n, cx.lp, cx.lr, cx.nr);
    let ldbc = cx.ldbc;
    for item in items {
        let (grp, ck) = (item / cx.n_chunks, item % cx.n_chunks);
        let (t0, len) = cx.chunk_span(ck);
        let base = cx.prep.get().add(item * cx.item_len());
        let cp = std::slice::from_raw_parts_mut(base, lr * n);
        let bt = std::slice::from_raw_parts_mut(base.add(lr * n), nr * lp);
        let g = base.add(lr * n + nr * lp);
        for l in 0..len {
            let src = &cx.c[(t0 + l) * ldbc + grp * n..(t0 + l) * ldbc + (grp + 1) * n];
            cp[l * n..(l + 1) * n].copy_from_slice(src);
        }
        cp[len * n..].fill(0.0);
        bt.fill(0.0);
        for s in 0..len {
            let src = &cx.b[(t0 + s) * ldbc + grp * n..(t0 + s) * ldbc + (grp + 1) * n];
            for (k, &v) in src.iter().enumerate() {
                bt[k * lp + s] = v;
            }
        }
        let mut l0 = 0;
        while l0 < len {
            let nvec = (l0 + MR).min(len).div_ceil(16);
            for (j0, nv) in col_blocks(nvec, NVMAX) {
                with_nv!(
                    nv,
                    g_tile::<V, MR>(
                        cp.as_ptr().add(l0 * n),
                        n,
                        bt.as_ptr().add(16 * j0),
                        lp,
                        g.add(l0 * lp + 16 * j0),
                        lp,
                    )
                );
            }
            l0 += MR;
        }
    }
}

/// Per-thread buffers of [`heads_body`].
#[derive(Default)]
struct Scratch {
    /// `(nr, pp, lr, lp)` the buffers were laid out for (their padding is zero).
    key: (usize, usize, usize, usize),
    /// State transposed, `[nr, pp]`.
    st: Vec<f32>,
    /// x of the chunk `[lr, pp]` (when P is not a multiple of 16), and
    /// scaled by `coef` `[lp, pp]`.
    xb: Vec<f32>,
    xc: Vec<f32>,
    /// `M` `[lr, lp]`; output rows `[lr, pp]` (when P is not a multiple of 16).
    m: Vec<f32>,
    yb: Vec<f32>,
    /// Per token of the chunk: dt, cumsum(dt·A), exp(c), coef.
    dts: Vec<f32>,
    cs: Vec<f32>,
    el: Vec<f32>,
    coef: Vec<f32>,
}

impl Scratch {
    fn fit(&mut self, cx: &Ctx) {
        let key = (cx.nr, cx.pp, cx.lr, cx.lp);
        if self.key == key {
            return;
        }
        let (nr, pp, lr, lp) = key;
        *self = Scratch {
            key,
            st: vec![0.0; nr * pp],
            xb: vec![0.0; lr * pp],
            xc: vec![0.0; lp * pp],
            m: vec![0.0; lr * lp],
            yb: vec![0.0; lr * pp],
            dts: vec![0.0; lr],
            cs: vec![0.0; lr],
            el: vec![0.0; lr],
            coef: vec![0.0; lr],
        };
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    static PREP: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Heads `heads` over the window's chunks.
///
/// # Safety
/// `cx.prep` filled by [`prep_body`] for the window; heads are disjoint
/// between concurrent calls (each owns its state and its columns of y).
#[inline(always)]
unsafe fn heads_body<V: V16, const MR: usize, const NVMAX: usize>(
    cx: &Ctx,
    heads: Range<usize>,
    sc: &mut Scratch,
) {
    debug_assert!(ROW_PAD.is_multiple_of(MR));
    let (hn, p, n) = (cx.hn, cx.p, cx.n);
    let (pp, lp, lr) = (cx.pp, cx.lp, cx.lr);
    let nvec_p = pp / 16;
    let direct = pp == p;
    for h in heads {
        let grp = h / cx.hpg;
        let ah = cx.a[h];
        let dh = cx.d.map_or(0.0, |d| d[h]);
        // SAFETY: head h owns state[h·P·N .. (h+1)·P·N].
        let state = std::slice::from_raw_parts_mut(cx.state.get().add(h * p * n), p * n);
        // Non-zero anywhere (±0 count as zero), in blocks that vectorize.
        let mut with_state = state
            .chunks(256)
            .any(|blk| blk.iter().fold(0u32, |acc, v| acc | (v.to_bits() << 1)) != 0);
        if with_state {
            transpose::<V>(state.as_ptr(), n, p, n, sc.st.as_mut_ptr(), pp);
        } else {
            sc.st.fill(0.0);
        }
        for ck in 0..cx.n_chunks {
            let (t0, len) = cx.chunk_span(ck);
            let base = cx.prep.get().add((grp * cx.n_chunks + ck) * cx.item_len());
            let cp = base as *const f32;
            let bt = base.add(lr * n) as *const f32;
            let g = std::slice::from_raw_parts(base.add(lr * n + cx.nr * lp), lr * lp);
            // c = cumsum(dt·A); exp(c_l); coef_s = exp(c_last − c_s)·dt_s.
            let mut acc = 0f32;
            for l in 0..len {
                let v = cx.dt[(t0 + l) * hn + h];
                sc.dts[l] = v;
                acc += v * ah;
                sc.cs[l] = acc;
            }
            let last = acc;
            for l in 0..len {
                sc.el[l] = exp_fast(sc.cs[l]);
                sc.coef[l] = exp_fast(last - sc.cs[l]) * sc.dts[l];
            }
            sc.el[len..].fill(0.0);
            // x of the chunk, and x ⊙ coef.
            for l in 0..len {
                let src = &cx.x[(t0 + l) * cx.ldx + h * p..(t0 + l) * cx.ldx + (h + 1) * p];
                let cf = sc.coef[l];
                if !direct {
                    sc.xb[l * pp..l * pp + p].copy_from_slice(src);
                }
                for (o, &v) in sc.xc[l * pp..l * pp + p].iter_mut().zip(src) {
                    *o = cf * v;
                }
            }
            // M[l, s] = G[l, s]·exp(c_l − c_s)·dt_s for s ≤ l, else 0.
            for l in 0..len {
                let cl = sc.cs[l];
                let mrow = &mut sc.m[l * lp..(l + 1) * lp];
                let grow = &g[l * lp..l * lp + l + 1];
                let (cs, dts) = (&sc.cs[..=l], &sc.dts[..=l]);
                for (((mv, &gv), &csv), &dtv) in mrow.iter_mut().zip(grow).zip(cs).zip(dts) {
                    *mv = gv * exp_fast(cl - csv) * dtv;
                }
                mrow[l + 1..].fill(0.0);
            }
            if len < cx.chunk {
                sc.m[len * lp..].fill(0.0);
                sc.xb[len * pp..].fill(0.0);
            }
            // Outputs, row tile by row tile.
            // x and y are read and written in place when P is a multiple
            // of 16, else through padded buffers.
            let (xs, ldx) = if direct {
                (cx.x.as_ptr().add(t0 * cx.ldx + h * p), cx.ldx)
            } else {
                (sc.xb.as_ptr(), pp)
            };
            let mut l0 = 0;
            while l0 < len {
                let (out, ldo, rows) = if direct {
                    let o = cx.y.get().add(((t0 + l0) * hn + h) * p);
                    (o, hn * p, len - l0)
                } else {
                    (sc.yb.as_mut_ptr().add(l0 * pp), pp, MR)
                };
                let t = YTile {
                    st: sc.st.as_ptr(),
                    xs,
                    ldx,
                    c: cp.add(l0 * n),
                    el: sc.el.as_ptr().add(l0),
                    n,
                    with_state,
                    m: sc.m.as_ptr().add(l0 * lp),
                    ldm: lp,
                    ks: (l0 + MR).min(len),
                    xl: xs.add(l0 * ldx),
                    ldp: pp,
                    dh,
                    out,
                    ldo,
                    rows,
                };
                for (j0, nv) in col_blocks(nvec_p, NVMAX) {
                    with_nv!(nv, y_tile::<V, MR>(&t, 16 * j0));
                }
                l0 += MR;
            }
            if !direct {
                for l in 0..len {
                    // SAFETY: head h owns y[t, h, ..] for every t.
                    let o =
                        std::slice::from_raw_parts_mut(cx.y.get().add(((t0 + l) * hn + h) * p), p);
                    o.copy_from_slice(&sc.yb[l * pp..l * pp + p]);
                }
            }
            // Sᵀ' = exp(c_last)·Sᵀ + Bᵀ·(coef ⊙ X).
            let decay = exp_fast(last);
            let mut n0 = 0;
            while n0 < n {
                for (j0, nv) in col_blocks(nvec_p, NVMAX) {
                    with_nv!(
                        nv,
                        s_tile::<V, MR>(
                            sc.st.as_mut_ptr().add(n0 * pp + 16 * j0),
                            pp,
                            decay,
                            bt.add(n0 * lp),
                            lp,
                            sc.xc.as_ptr().add(16 * j0),
                            len,
                        )
                    );
                }
                n0 += MR;
            }
            with_state = true;
        }
        transpose::<V>(sc.st.as_ptr(), pp, n, p, state.as_mut_ptr(), n);
    }
}

#[cfg(target_arch = "x86_64")]
mod levels {
    use super::{heads_body, prep_body, Ctx, Scratch};
    use crate::simd::tile::x86::Pair;
    use std::arch::x86_64::__m512;
    use std::ops::Range;

    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub unsafe fn prep_avx512(cx: &Ctx, items: Range<usize>) {
        prep_body::<__m512, 6, 4>(cx, items)
    }
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")]
    pub unsafe fn heads_avx512(cx: &Ctx, heads: Range<usize>, sc: &mut Scratch) {
        heads_body::<__m512, 6, 4>(cx, heads, sc)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn prep_avx2(cx: &Ctx, items: Range<usize>) {
        prep_body::<Pair, 6, 1>(cx, items)
    }
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn heads_avx2(cx: &Ctx, heads: Range<usize>, sc: &mut Scratch) {
        heads_body::<Pair, 6, 1>(cx, heads, sc)
    }
}

/// [`prep_body`] at the current SIMD level.
fn prep(cx: &Ctx, items: Range<usize>) {
    // SAFETY: level() only reports features the CPU has; the caller hands
    // out disjoint items.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        match level() {
            SimdLevel::Avx512 => return levels::prep_avx512(cx, items),
            SimdLevel::Avx2 => return levels::prep_avx2(cx, items),
            SimdLevel::Scalar => {}
        }
        prep_body::<Lanes, 2, 1>(cx, items)
    }
}

/// [`heads_body`] at the current SIMD level.
fn heads(cx: &Ctx, hr: Range<usize>, sc: &mut Scratch) {
    // SAFETY: as in `prep`; the caller hands out disjoint heads after the
    // window's `prep` has finished.
    unsafe {
        #[cfg(target_arch = "x86_64")]
        match level() {
            SimdLevel::Avx512 => return levels::heads_avx512(cx, hr, sc),
            SimdLevel::Avx2 => return levels::heads_avx2(cx, hr, sc),
            SimdLevel::Scalar => {}
        }
        heads_body::<Lanes, 2, 1>(cx, hr, sc)
    }
}

/// Runs `f` with this thread's buffer of type `T` (a fresh one if it is
/// already in use further up the stack).
fn with_local<T: Default, R>(
    key: &'static std::thread::LocalKey<RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut v) => f(&mut v),
        Err(_) => f(&mut T::default()),
    })
}

/// Mamba-2 over `n_tokens` tokens with the chunked SSD algorithm; the
/// arguments and result of [`super::scan::mamba2_scan_from`] on an f32
/// state in place:
///
/// * `state`: `[n_head, head_dim, d_state]`, updated in place
/// * `inputs`: x `[n_tokens, n_head, head_dim]`, B and C `[n_tokens,
///   n_group, d_state]` as rows ([`ScanInputs::dense`] for packed ones)
/// * `dt`: `[n_tokens, n_head]` (activated); `y`: `[n_tokens, n_head, head_dim]`
/// * `a`: `[n_head]` (= −exp(A_log)); `d`: `[n_head]` or `None`
/// * `chunk`: tokens per chunk (e.g. [`DEFAULT_CHUNK`])
#[allow(clippy::too_many_arguments)]
pub fn mamba2_chunked_scan(
    pool: &ThreadPool,
    dims: Mamba2Dims,
    chunk: usize,
    state: &mut [f32],
    inputs: ScanInputs,
    dt: &[f32],
    a: &[f32],
    d: Option<&[f32]>,
    y: &mut [f32],
    n_tokens: usize,
) {
    let Mamba2Dims {
        n_head: hn,
        head_dim: p,
        n_group: g,
        d_state: n,
    } = dims;
    let ScanInputs { x, ldx, b, c, ldbc } = inputs;
    assert!(chunk > 0, "ssd: chunk must be at least 1");
    dims.check_heads(a, d);
    dims.check_state(state.len(), None);
    assert_eq!(y.len(), n_tokens * hn * p);
    assert_eq!(dt.len(), n_tokens * hn);
    inputs.check(&dims, n_tokens);
    if n_tokens == 0 || hn == 0 || p == 0 {
        return;
    }
    let window = (WINDOW_TOKENS / chunk).max(1) * chunk;
    let mut cx = Ctx {
        hn,
        p,
        n,
        hpg: hn / g,
        chunk,
        pp: p.next_multiple_of(16),
        lp: chunk.next_multiple_of(16),
        lr: chunk.next_multiple_of(ROW_PAD),
        nr: n.next_multiple_of(ROW_PAD),
        x,
        ldx,
        ldbc,
        dt,
        a,
        b,
        c,
        d,
        state: SendPtr(state.as_mut_ptr()),
        y: SendPtr(y.as_mut_ptr()),
        prep: SendPtr(std::ptr::null_mut()),
        t0: 0,
        t1: 0,
        n_chunks: 0,
    };
    with_local(&PREP, |buf: &mut Vec<f32>| {
        let need = g * window.min(n_tokens).div_ceil(chunk) * cx.item_len();
        if buf.len() < need {
            buf.resize(need, 0.0);
        }
        cx.prep = SendPtr(buf.as_mut_ptr());
        let mut t0 = 0;
        while t0 < n_tokens {
            cx.t0 = t0;
            cx.t1 = (t0 + window).min(n_tokens);
            cx.n_chunks = (cx.t1 - t0).div_ceil(chunk);
            let cx = &cx;
            pool.parallel_for(g * cx.n_chunks, 1, |items, _| {
                let _flush = crate::denormals::FlushDenormals::new();
                prep(cx, items)
            });
            pool.parallel_for(hn, 1, |hr, _| {
                let _flush = crate::denormals::FlushDenormals::new();
                with_local(&SCRATCH, |sc: &mut Scratch| {
                    sc.fit(cx);
                    heads(cx, hr, sc)
                })
            });
            t0 = cx.t1;
        }
    });
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ops::ssm::mamba2_scan;

    struct Lcg(u64);
    impl Lcg {
        fn f(&mut self) -> f32 {
            self.0 = self
                .0
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((self.0 >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        }
        fn v(&mut self, n: usize, s: f32) -> Vec<f32> {
            (0..n).map(|_| self.f() * s).collect()
        }
    }

    /// Chunked SSD equals the sequential recurrence, for chunk sizes that do
    /// and do not divide the token count, from a non-zero starting state
    /// (and from zero, without D, in every other case): head sizes below,
    /// at and above one register tile, several windows of chunks.
    pub fn chunked_matches_sequential() {
        let pool = ThreadPool::new(2);
        let mut r = Lcg(3);
        for (case, (hn, p, g, n, t)) in [
            (4, 16, 2, 16, 37),
            (8, 24, 4, 12, 64),
            (2, 8, 1, 20, 5),
            (6, 64, 3, 128, 70),
            (4, 80, 2, 7, 45),
            (2, 128, 1, 16, 1100),
        ]
        .into_iter()
        .enumerate()
        {
            let zero = case % 2 == 0;
            let dims = Mamba2Dims {
                n_head: hn,
                head_dim: p,
                n_group: g,
                d_state: n,
            };
            let x = r.v(t * hn * p, 1.0);
            let dt: Vec<f32> = r
                .v(t * hn, 1.0)
                .iter()
                .map(|v| 0.05 + 0.5 * v.abs())
                .collect();
            let a: Vec<f32> = r.v(hn, 1.0).iter().map(|v| -0.2 - v.abs()).collect();
            let b = r.v(t * g * n, 1.0);
            let c = r.v(t * g * n, 1.0);
            let d = r.v(hn, 1.0);
            let d = (!zero).then_some(&d[..]);
            let s0 = if zero {
                vec![0.0; hn * p * n]
            } else {
                r.v(hn * p * n, 0.5)
            };
            let mut s_ref = s0.clone();
            let mut y_ref = vec![0f32; t * hn * p];
            mamba2_scan(
                &pool, dims, &mut s_ref, &x, &dt, &a, &b, &c, d, &mut y_ref, t,
            );
            for chunk in [1, 4, 8, 64, 100] {
                let mut s = s0.clone();
                let mut y = vec![0f32; t * hn * p];
                let inputs = ScanInputs::dense(&dims, &x, &b, &c, t);
                mamba2_chunked_scan(&pool, dims, chunk, &mut s, inputs, &dt, &a, d, &mut y, t);
                let my = y_ref.iter().fold(0f32, |m, v| m.max(v.abs()));
                let dy = y
                    .iter()
                    .zip(&y_ref)
                    .fold(0f32, |m, (u, v)| m.max((u - v).abs()));
                assert!(
                    dy <= 2e-5 * my,
                    "y: chunk {chunk} {hn}x{p} g{g} n{n}: {dy} of {my}"
                );
                let ms = s_ref.iter().fold(0f32, |m, v| m.max(v.abs()));
                let ds = s
                    .iter()
                    .zip(&s_ref)
                    .fold(0f32, |m, (u, v)| m.max((u - v).abs()));
                assert!(ds <= 2e-5 * ms, "state: chunk {chunk}: {ds} of {ms}");
            }
        }
    }

    #[test]
    fn chunked_equals_sequential() {
        chunked_matches_sequential();
    }
}

#[cfg(test)]
mod timing {
    use super::*;
    use crate::ops::ssm::mamba2_scan;

    /// Best time in ms of `reps` runs of `f`.
    fn best(reps: usize, mut f: impl FnMut()) -> f64 {
        (0..reps)
            .map(|_| {
                let t0 = std::time::Instant::now();
                f();
                t0.elapsed().as_secs_f64() * 1e3
            })
            .fold(f64::INFINITY, f64::min)
    }

    /// `cargo test --release -p coil-kernels ssd_timing -- --ignored --nocapture`:
    /// a mamba2-370m layer (32 heads × 64, d_state 128, 1 group) on 2
    /// threads, from a non-zero state; best of several runs.
    #[test]
    #[ignore]
    fn ssd_timing() {
        let pool = ThreadPool::new(2);
        let (hn, p, n) = (32, 64, 128);
        let dims = Mamba2Dims {
            n_head: hn,
            head_dim: p,
            n_group: 1,
            d_state: n,
        };
        let mut seed = 7u64;
        let mut rnd = |k: usize, s: f32| -> Vec<f32> {
            (0..k)
                .map(|_| {
                    seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * s
                })
                .collect()
        };
        let tmax = 512;
        let x = rnd(tmax * hn * p, 2.0);
        let dt: Vec<f32> = rnd(tmax * hn, 0.2).iter().map(|v| v.abs() + 0.01).collect();
        let a: Vec<f32> = rnd(hn, 2.0).iter().map(|v| -v.abs() - 0.1).collect();
        let b = rnd(tmax * n, 0.2);
        let c = rnd(tmax * n, 0.2);
        let d = rnd(hn, 1.0);
        let s0 = rnd(hn * p * n, 1.0);
        let mut y = vec![0f32; tmax * hn * p];
        let mut s = s0.clone();
        for t in [512, 256, 128, 64, 32, 16, 8, 4, 2] {
            let reps = if t >= 128 { 10 } else { 40 };
            let (xt, dtt, bt, ct) = (&x[..t * hn * p], &dt[..t * hn], &b[..t * n], &c[..t * n]);
            let yt = &mut y[..t * hn * p];
            let seq = best(reps, || {
                s.copy_from_slice(&s0);
                mamba2_scan(&pool, dims, &mut s, xt, dtt, &a, bt, ct, Some(&d), yt, t);
            });
            let chunked = |chunk: usize, s: &mut [f32], y: &mut [f32]| {
                let inputs = ScanInputs::dense(&dims, xt, bt, ct, t);
                mamba2_chunked_scan(&pool, dims, chunk, s, inputs, dtt, &a, Some(&d), y, t)
            };
            let mut line = format!("{t:4} tokens: sequential {seq:7.3} ms");
            for chunk in [32, 64, 128] {
                if chunk > 2 * t.max(32) {
                    continue;
                }
                let ms = best(reps, || {
                    s.copy_from_slice(&s0);
                    chunked(chunk, &mut s, &mut *yt);
                });
                line += &format!(" | chunk {chunk} {ms:7.3} ms ({:.2}x)", ms / seq);
            }
            let zero = best(reps, || {
                s.fill(0.0);
                chunked(DEFAULT_CHUNK, &mut s, &mut *yt);
            });
            line += &format!(" | zero state {zero:7.3} ms ({:.2}x)", zero / seq);
            eprintln!("{line}");
        }
    }
}
