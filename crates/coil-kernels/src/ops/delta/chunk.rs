//! The chunked gated delta rule (the WY / UT form of Yang et al.'s
//! DeltaNet and Gated DeltaNet papers, as flash-linear-attention's chunked
//! kernels compute it): the same result as the token-by-token recurrence
//! of [`super::gated`], mostly in matrix products. Per value head and
//! chunk of L tokens, from the state S (`[d_k, d_v]`) at its start:
//!
//! ```text
//! γ = cumsum(g)                                  (within the chunk)
//! A = strict_lower((β⊙K)Kᵀ ⊙ e^{γ_i−γ_j})        [L, L]
//! U = (I + A)⁻¹ (β⊙V),  W = (I + A)⁻¹ (β⊙K⊙e^γ)  (forward substitution)
//! V' = U − W S                                   [L, d_v]
//! O = (Q⊙e^γ) S + lower(QKᵀ ⊙ e^{γ_i−γ_j}) V'    [L, d_v]
//! S ← e^{γ_L} S + (K ⊙ e^{γ_L−γ})ᵀ V'
//! ```
//!
//! Every exponent is ≤ 0 (g ≤ 0), so nothing overflows.
//!
//! Chunks made of whole vectors (16 tokens at AVX-512, 8 at AVX2) with
//! `d_k`, `d_v` multiples of the vector (every Qwen3.5 / Qwen3-Next layer)
//! take [`super::chunk_lanes`]: the same algebra with one token per
//! vector lane (a 512-token Qwen3.5-0.8B layer, one thread, on a Zen 4:
//! 13.5–13.9 → 11.7 ms at AVX-512).

use super::chunk_lanes as lanes;
use super::dims::{DeltaInputs, GatedDeltaDims, Heads};
use crate::denormals::FlushDenormals;
use crate::pool::{SendPtr, ThreadPool};

/// Tokens per chunk, for both decay shapes. The per-token work of the chunk-sized products
/// (`KKᵀ`, `QKᵀ`, `T·(β⊙V)`, `T·(β⊙K)`, `P·V'`) grows with the chunk while
/// the state products (`W S`, `Q S`, `Kᵀ V'`) do not: example
/// `gated_delta_bench 2 16 16 128` (a Qwen3.5-0.8B DeltaNet layer, 2
/// threads, 512 tokens) measured 5.7 / 5.0 / 4.9–5.0 ms at chunks of 64 /
/// 32 / 16 with AVX-512, 9.7–9.8 / 8.5 / 8.0 with AVX2; 16 is as fast or
/// faster from 32 to 512 tokens at both levels. KDA's pair terms grow the
/// same way (`A`, `P`: L²·d_k per chunk).
pub const DEFAULT_CHUNK: usize = 16;

/// `a · b + c`, fused (one rounding) when `FMA`.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// Which triangle of a product matters (`L × L` matrices of a chunk).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tri {
    /// All of it.
    Full,
    /// Only `c[i, j]` with `j ≤ i` is wanted: the column tiles past the
    /// diagonal are skipped (what they leave in `c` is the caller's).
    LowerC,
    /// `a[i, r] = 0` for `r > i`: those terms are skipped.
    LowerA,
}

/// `c[i, :] += alpha · Σ_r a[i, r] · b[r, :]` for `i < m`, `r < k`, the
/// columns `0..n`: `a` `[m, lda]`, `b` `[k, ldb]`, `c` `[m, ldc]` row-major.
/// Tiles of 4 rows × 16 columns are accumulated in registers (`WIDE`, at
/// AVX-512: 8 × 32 in 16 `zmm`, enough independent sums to keep both FMA
/// ports busy through their latency; the same operations per element, in
/// the same order); `FMA`: fused multiply-adds (one rounding per product;
/// off where they would be a library call, see [`chunk_mv`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_acc<const FMA: bool, const WIDE: bool>(
    tri: Tri,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) {
    const MR: usize = 4;
    const NR: usize = 16;
    if m == 0 || n == 0 || k == 0 {
        return;
    }
    assert!(
        a.len() >= (m - 1) * lda + k && lda >= k,
        "gemm: a too short"
    );
    assert!(
        b.len() >= (k - 1) * ldb + n && ldb >= n,
        "gemm: b too short"
    );
    assert!(
        c.len() >= (m - 1) * ldc + n && ldc >= n,
        "gemm: c too short"
    );
    // the columns and inner length rows up to i1 need
    let limits = |i1: usize, nr: usize| match tri {
        Tri::Full => (n, k),
        Tri::LowerC => (n.min(i1.next_multiple_of(nr)), k),
        Tri::LowerA => (n, k.min(i1)),
    };
    let mut i = 0;
    #[cfg(target_arch = "x86_64")]
    if WIDE && FMA {
        while i + 8 <= m {
            let (n1, k1) = limits(i + 8, 32);
            let mut j = 0;
            while j + 32 <= n1 {
                // SAFETY: WIDE is chosen at the AVX-512 level only; the tile
                // (rows i..i+8, columns j..j+32, inner k1 ≤ k) lies within
                // the lengths asserted above.
                unsafe {
                    tile_8x32(
                        k1,
                        a.as_ptr().add(i * lda),
                        lda,
                        b.as_ptr().add(j),
                        ldb,
                        c.as_mut_ptr().add(i * ldc + j),
                        ldc,
                        alpha,
                    )
                };
                j += 32;
            }
            for i0 in [i, i + 4] {
                band::<FMA, MR, NR>(i0, j, n1, k1, alpha, a, lda, b, ldb, c, ldc);
            }
            i += 8;
        }
    }
    while i + MR <= m {
        let (n, k) = limits(i + MR, NR);
        band::<FMA, MR, NR>(i, 0, n, k, alpha, a, lda, b, ldb, c, ldc);
        i += MR;
    }
    if i < m {
        let (n, k) = limits(m, NR);
        gemm_edge::<FMA>(i, m, 0, n, k, alpha, a, lda, b, ldb, c, ldc);
    }
}

/// Rows `i..i + MR`, columns `j0..n` of [`gemm_acc`] (inner length `k`):
/// tiles of `MR` × `NR` in registers, the columns past the last whole tile
/// one row at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn band<const FMA: bool, const MR: usize, const NR: usize>(
    i: usize,
    j0: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) {
    let mut j = j0;
    while j + NR <= n {
        let mut acc = [[0f32; NR]; MR];
        for r in 0..k {
            // SAFETY: r < k, j + NR <= n and i + MR <= m, within the
            // lengths gemm_acc asserted.
            let (bv, av) = unsafe {
                let bv = std::ptr::read_unaligned(b.as_ptr().add(r * ldb + j) as *const [f32; NR]);
                let ap = a.as_ptr().add(i * lda + r);
                (
                    bv,
                    std::array::from_fn::<f32, MR, _>(|ii| *ap.add(ii * lda)),
                )
            };
            for (acc_row, &x) in acc.iter_mut().zip(&av) {
                for (y, &bb) in acc_row.iter_mut().zip(&bv) {
                    *y = madd::<FMA>(x, bb, *y);
                }
            }
        }
        for (ii, acc_row) in acc.iter().enumerate() {
            let cr = &mut c[(i + ii) * ldc + j..(i + ii) * ldc + j + NR];
            for (x, &v) in cr.iter_mut().zip(acc_row) {
                *x = madd::<FMA>(alpha, v, *x);
            }
        }
        j += NR;
    }
    if j < n {
        gemm_edge::<FMA>(i, i + MR, j, n, k, alpha, a, lda, b, ldb, c, ldc);
    }
}

/// One 8 × 32 tile of [`gemm_acc`] at AVX-512: `c[ii, 0..32] = alpha ·
/// Σ_r a[ii, r] · b[r, 0..32] + c[ii, 0..32]` for `ii < 8`, the sums fused
/// multiply-adds in `r` order (as [`band`]'s).
///
/// # Safety
/// The CPU has AVX-512F; `a` holds rows `0..8` of `k` values `lda` apart,
/// `b` rows `0..k` of 32 values `ldb` apart, `c` rows `0..8` of 32 values
/// `ldc` apart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_8x32(
    k: usize,
    a: *const f32,
    lda: usize,
    b: *const f32,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    alpha: f32,
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm512_setzero_ps(); 2]; 8];
    for r in 0..k {
        let b0 = _mm512_loadu_ps(b.add(r * ldb));
        let b1 = _mm512_loadu_ps(b.add(r * ldb + 16));
        for (ii, acc) in acc.iter_mut().enumerate() {
            let av = _mm512_set1_ps(*a.add(ii * lda + r));
            acc[0] = _mm512_fmadd_ps(av, b0, acc[0]);
            acc[1] = _mm512_fmadd_ps(av, b1, acc[1]);
        }
    }
    let al = _mm512_set1_ps(alpha);
    for (ii, acc) in acc.iter().enumerate() {
        for (h, v) in acc.iter().enumerate() {
            let p = c.add(ii * ldc + 16 * h);
            _mm512_storeu_ps(p, _mm512_fmadd_ps(al, *v, _mm512_loadu_ps(p)));
        }
    }
}

/// [`gemm_acc`] on rows `i0..i1`, columns `j0..j1`, one row at a time.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gemm_edge<const FMA: bool>(
    i0: usize,
    i1: usize,
    j0: usize,
    j1: usize,
    k: usize,
    alpha: f32,
    a: &[f32],
    lda: usize,
    b: &[f32],
    ldb: usize,
    c: &mut [f32],
    ldc: usize,
) {
    for i in i0..i1 {
        let cr = &mut c[i * ldc + j0..i * ldc + j1];
        for r in 0..k {
            let av = alpha * a[i * lda + r];
            for (x, &bv) in cr.iter_mut().zip(&b[r * ldb + j0..r * ldb + j1]) {
                *x = madd::<FMA>(av, bv, *x);
            }
        }
    }
}

/// `out = inᵀ` for `in` of `rows × cols` (row-major), in 8 × 8 blocks so
/// that reads and writes both stay within a few cache lines.
#[inline(always)]
pub(crate) fn transpose(inp: &[f32], rows: usize, cols: usize, out: &mut [f32]) {
    const B: usize = 8;
    for i0 in (0..rows).step_by(B) {
        let i1 = (i0 + B).min(rows);
        for c0 in (0..cols).step_by(B) {
            let c1 = (c0 + B).min(cols);
            for c in c0..c1 {
                for i in i0..i1 {
                    out[c * rows + i] = inp[i * cols + c];
                }
            }
        }
    }
}

/// The buffers of a chunk's solve and outputs, the part both decays share
/// (one per value head here, one per key channel in `kda_chunk.rs`): the
/// caller fills `bv` and `bk` and hands [`Solve::run`] its A, P and
/// Q ⊙ e^γ.
pub(crate) struct Solve {
    pub(crate) bv: Vec<f32>, // [L, dv]  β⊙V
    pub(crate) bk: Vec<f32>, // [L, dk]  β⊙K⊙e^γ
    t: Vec<f32>,             // [L, L]   (I + A)⁻¹
    pub(crate) u: Vec<f32>,  // [L, dv]  U, then V'
    w: Vec<f32>,             // [L, dk]
    o: Vec<f32>,             // [L, dv]
}

impl Solve {
    pub(crate) fn new(l: usize, dk: usize, dv: usize) -> Self {
        Solve {
            bv: vec![0.0; l * dv],
            bk: vec![0.0; l * dk],
            t: vec![0.0; l * l],
            u: vec![0.0; l * dv],
            w: vec![0.0; l * dk],
            o: vec![0.0; l * dv],
        }
    }

    /// For a chunk of `l` tokens from `c0`, head `j` of `n_head`, with the
    /// state `s` at its start, A (`a`, strict lower `[L, L]`), P (`p`, lower
    /// `[L, L]`) and Q ⊙ e^γ (`qe`, `[L, dk]`): T = (I + A)⁻¹ by forward
    /// substitution on the identity (row i = e_i − Σ_{j<i} A_ij · row j;
    /// row j is zero past column j), then U = T (β⊙V), W = T (β⊙K⊙e^γ) as
    /// products (the substitution on U and W directly did the same
    /// multiply-adds one row at a time), V' = U − W S (left in `u`) and
    /// O = (Q ⊙ e^γ) S + P V', stored to the head's output rows.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn run<const FMA: bool, const WIDE: bool>(
        &mut self,
        (l, dk, dv): (usize, usize, usize),
        a: &[f32],
        p: &[f32],
        qe: &[f32],
        s: &[f32],
        out: SendPtr<f32>,
        (c0, n_head, j): (usize, usize, usize),
    ) {
        let t = &mut self.t[..l * l];
        t.fill(0.0);
        for i in 0..l {
            let (done, rest) = t.split_at_mut(i * l);
            let ti = &mut rest[..l];
            ti[i] = 1.0;
            for jj in 0..i {
                let a = a[i * l + jj];
                if a == 0.0 {
                    continue;
                }
                for (x, &y) in ti[..=jj].iter_mut().zip(&done[jj * l..jj * l + jj + 1]) {
                    *x = madd::<FMA>(-a, y, *x);
                }
            }
        }
        self.u[..l * dv].fill(0.0);
        self.w[..l * dk].fill(0.0);
        let t = &self.t;
        gemm_acc::<FMA, WIDE>(
            Tri::LowerA,
            l,
            dv,
            l,
            1.0,
            t,
            l,
            &self.bv,
            dv,
            &mut self.u,
            dv,
        );
        gemm_acc::<FMA, WIDE>(
            Tri::LowerA,
            l,
            dk,
            l,
            1.0,
            t,
            l,
            &self.bk,
            dk,
            &mut self.w,
            dk,
        );
        // V' = U − W S.
        gemm_acc::<FMA, WIDE>(
            Tri::Full,
            l,
            dv,
            dk,
            -1.0,
            &self.w,
            dk,
            s,
            dv,
            &mut self.u,
            dv,
        );
        // O = (Q ⊙ e^γ) S + P V'.
        self.o[..l * dv].fill(0.0);
        gemm_acc::<FMA, WIDE>(Tri::Full, l, dv, dk, 1.0, qe, dk, s, dv, &mut self.o, dv);
        gemm_acc::<FMA, WIDE>(
            Tri::LowerA,
            l,
            dv,
            l,
            1.0,
            p,
            l,
            &self.u,
            dv,
            &mut self.o,
            dv,
        );
        for i in 0..l {
            // SAFETY: token c0 + i, head j: lanes no other head writes.
            let o = unsafe {
                std::slice::from_raw_parts_mut(out.get().add(((c0 + i) * n_head + j) * dv), dv)
            };
            o.copy_from_slice(&self.o[i * dv..(i + 1) * dv]);
        }
    }
}

/// One thread's buffers for a chunk of up to `l` tokens: those both decay
/// shapes fill, and `x`, the shape's own (the gated delta rule's pair
/// decays, KDA's per-channel ones).
#[doc(hidden)]
pub struct Work<X> {
    pub(crate) q: Vec<f32>,     // [L, dk]  Q, then Q ⊙ e^γ
    pub(crate) k: Vec<f32>,     // [L, dk]
    pub(crate) kt: Vec<f32>,    // [dk, L]  (K ⊙ e^{γ_L−γ})ᵀ
    pub(crate) a: Vec<f32>,     // [L, L]   A (strict lower)
    pub(crate) p: Vec<f32>,     // [L, L]   P (lower)
    pub(crate) solve: Solve,    // β⊙V, β⊙K⊙e^γ, (I + A)⁻¹, U, V', W, O
    pub(crate) gamma: Vec<f32>, // [L, decays]  γ = cumsum(g)
    pub(crate) x: X,
}

impl<X> Work<X> {
    pub(crate) fn new<D: Heads>(d: &D, l: usize, x: X) -> Self {
        let (_, _, dk, dv) = d.shape();
        Work {
            q: vec![0.0; l * dk],
            k: vec![0.0; l * dk],
            kt: vec![0.0; dk * l],
            a: vec![0.0; l * l],
            p: vec![0.0; l * l],
            solve: Solve::new(l, dk, dv),
            gamma: vec![0.0; l * d.decays()],
            x,
        }
    }
}

/// A decay shape the chunked scan runs: [`GatedDeltaDims`] (one log decay
/// per value head) and `KdaDims` (one per key channel).
pub trait ChunkGate: Heads {
    /// The shape's own buffers of a chunk ([`Work`]'s `x`).
    #[doc(hidden)]
    type Own;
    /// Checks the dims (head counts, widths).
    #[doc(hidden)]
    fn check_dims(&self);
    /// A thread's buffers for chunks of up to `l` tokens.
    #[doc(hidden)]
    fn work(&self, l: usize) -> Work<Self::Own>;
    /// One chunk (`len` tokens from `c0`) of head `j`, from and into its
    /// state `s`, at the best SIMD level; `out`: the start of the scan's
    /// output `[n_tokens, Hv, d_v]`, of which it writes head `j`'s lanes
    /// only.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn chunk(
        &self,
        j: usize,
        s: &mut [f32],
        inp: &DeltaInputs,
        c0: usize,
        len: usize,
        wk: &mut Work<Self::Own>,
        out: *mut f32,
    );
    /// Runs the whole scan in a form of the shape's own where it has one
    /// for `chunk` (the gated delta rule's chunks in SIMD lanes): whether
    /// it did.
    #[doc(hidden)]
    #[allow(clippy::too_many_arguments)]
    fn scan_own(
        &self,
        _pool: &ThreadPool,
        _chunk: usize,
        _state: &mut [f32],
        _inp: &DeltaInputs,
        _out: &mut [f32],
        _n_tokens: usize,
    ) -> bool {
        false
    }
}

/// The gated delta rule ([`GatedDeltaDims`]) or KDA (`KdaDims`) over
/// `n_tokens` tokens in chunks of `chunk`, from and into `state` (`[Hv,
/// d_k, d_v]`, f32), heads spread over `pool`; `out`: `[n_tokens, Hv,
/// d_v]`. Same inputs and result as [`super::gated::gated_delta_scan`] and
/// [`super::kda::kda_scan`] (to f32 rounding).
pub fn delta_chunked<D: ChunkGate>(
    pool: &ThreadPool,
    dims: D,
    chunk: usize,
    state: &mut [f32],
    inp: DeltaInputs,
    out: &mut [f32],
    n_tokens: usize,
) {
    assert!(chunk > 0);
    dims.check_dims();
    if dims.scan_own(pool, chunk, state, &inp, out, n_tokens) {
        return;
    }
    let work = || dims.work(chunk.min(n_tokens));
    chunk_heads(
        pool,
        &dims,
        chunk,
        state,
        &inp,
        out,
        n_tokens,
        work,
        |wk, j, s, c0, len, op| dims.chunk(j, s, &inp, c0, len, wk, op.get()),
    );
}

/// The gated delta rule's own buffers: `e^{γ_i−γ_j}` (`[L, L]`, j ≤ i).
type GatedWork = Work<Vec<f32>>;

impl ChunkGate for GatedDeltaDims {
    type Own = Vec<f32>;
    fn check_dims(&self) {
        self.check();
    }
    fn work(&self, l: usize) -> GatedWork {
        Work::new(self, l, vec![0.0; l * l])
    }
    #[inline(always)]
    fn chunk(
        &self,
        j: usize,
        s: &mut [f32],
        inp: &DeltaInputs,
        c0: usize,
        len: usize,
        wk: &mut GatedWork,
        out: *mut f32,
    ) {
        chunk_mv(self, j, s, inp, c0, len, wk, SendPtr(out))
    }
    /// One token per vector lane where the chunk is made of whole vectors
    /// (see `lanes::width`), else the tiles.
    fn scan_own(
        &self,
        pool: &ThreadPool,
        chunk: usize,
        state: &mut [f32],
        inp: &DeltaInputs,
        out: &mut [f32],
        n_tokens: usize,
    ) -> bool {
        let width = lanes::width(chunk, self);
        if width == 0 {
            return false;
        }
        let work = || lanes::Work::new(self.d_k, width);
        chunk_heads(
            pool,
            self,
            width,
            state,
            inp,
            out,
            n_tokens,
            work,
            |lw, j, s, c0, len, op| {
                // SAFETY: `width` is the CPU's and fits the dims; the tokens
                // are within the inputs (checked by chunk_heads).
                unsafe { lanes::chunk_at(width, self, j, s, inp, c0, len, n_tokens, lw, op) }
            },
        );
        true
    }
}

/// A chunked scan's checks and its spread over `pool`: each value head's
/// state (`[d_k, d_v]` of `state`'s `[Hv, d_k, d_v]`) gets `run(scratch,
/// j, s, c0, len, out)` on its tokens in pieces of `step` (the last one
/// shorter), `scratch` made once per thread by `work`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn chunk_heads<D: Heads, W>(
    pool: &ThreadPool,
    dims: &D,
    step: usize,
    state: &mut [f32],
    inp: &DeltaInputs,
    out: &mut [f32],
    n_tokens: usize,
    work: impl Fn() -> W + Sync,
    run: impl Fn(&mut W, usize, &mut [f32], usize, usize, SendPtr<f32>) + Sync,
) {
    assert!(step > 0);
    let ((_, hv, dk, dv), f) = (dims.shape(), D::FAMILY);
    inp.check(dims, n_tokens);
    let heads = D::SHAPES.0;
    assert_eq!(
        state.len(),
        hv * dk * dv,
        "{f}: state is not [{heads}, dk, dv]"
    );
    assert_eq!(out.len(), n_tokens * hv * dv);
    if n_tokens == 0 {
        return;
    }
    let sp = SendPtr(state.as_mut_ptr());
    let op = SendPtr(out.as_mut_ptr());
    let grain = (hv / (pool.n_threads() * 2)).max(1);
    pool.parallel_for(hv, grain, |hr, _| {
        let _flush = FlushDenormals::new();
        let mut w = work();
        for j in hr {
            // SAFETY: each value head's state and output lanes belong to
            // exactly one call (parallel_for hands out disjoint heads).
            let s = unsafe { std::slice::from_raw_parts_mut(sp.get().add(j * dk * dv), dk * dv) };
            let mut c0 = 0;
            while c0 < n_tokens {
                let len = step.min(n_tokens - c0);
                run(&mut w, j, s, c0, len, op);
                c0 += len;
            }
        }
    });
}

/// One chunk (`len` tokens from `c0`) of value head `j` (`WIDE`: the
/// AVX-512 tiles of [`gemm_acc`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn chunk_step<const FMA: bool, const WIDE: bool>(
    d: &GatedDeltaDims,
    j: usize,
    s: &mut [f32],
    inp: &DeltaInputs,
    c0: usize,
    len: usize,
    wk: &mut GatedWork,
    out: SendPtr<f32>,
) {
    let (dk, dv, hv) = (d.d_k, d.d_v, d.n_v_head);
    let kh = d.key_head(j);
    let l = len;
    // γ, and the rows of Q, K, β⊙V, β⊙K⊙e^γ.
    let mut acc = 0f32;
    for i in 0..l {
        let t = c0 + i;
        acc += inp.g[t * hv + j];
        wk.gamma[i] = acc;
        let (e, beta) = (acc.exp(), inp.beta[t * hv + j]);
        let (q, k, v) = (inp.q_at(d, t, kh), inp.k_at(d, t, kh), inp.v_at(d, t, j));
        // Contiguous copies (vectorized; Kᵀ's strided stores below would
        // keep this loop scalar: 11% of the chunk's time at AVX2).
        wk.q[i * dk..(i + 1) * dk].copy_from_slice(&q[..dk]);
        wk.k[i * dk..(i + 1) * dk].copy_from_slice(&k[..dk]);
        for (x, &kv) in wk.solve.bk[i * dk..(i + 1) * dk].iter_mut().zip(k) {
            *x = kv * beta * e;
        }
        for (x, &vv) in wk.solve.bv[i * dv..(i + 1) * dv].iter_mut().zip(v) {
            *x = beta * vv;
        }
    }
    transpose(&wk.k[..l * dk], l, dk, &mut wk.kt[..dk * l]);
    // KKᵀ and QKᵀ, then the decays.
    wk.a[..l * l].fill(0.0);
    wk.p[..l * l].fill(0.0);
    gemm_acc::<FMA, WIDE>(
        Tri::LowerC,
        l,
        l,
        dk,
        1.0,
        &wk.k,
        dk,
        &wk.kt,
        l,
        &mut wk.a,
        l,
    );
    gemm_acc::<FMA, WIDE>(
        Tri::LowerC,
        l,
        l,
        dk,
        1.0,
        &wk.q,
        dk,
        &wk.kt,
        l,
        &mut wk.p,
        l,
    );
    // e^{γ_i−γ_j} (j ≤ i) as products of the per-token decays e^{g}, row
    // by row (no exponential per pair): row i = row i−1 · e^{g_i}.
    for i in 0..l {
        let (beta, eg) = (inp.beta[(c0 + i) * hv + j], inp.g[(c0 + i) * hv + j].exp());
        let (prev, row) = wk.x.split_at_mut(i * l);
        let row = &mut row[..l];
        if i > 0 {
            for (x, &p) in row[..i].iter_mut().zip(&prev[(i - 1) * l..(i - 1) * l + i]) {
                *x = p * eg;
            }
        }
        row[i] = 1.0;
        let (kk, qk) = (&mut wk.a[i * l..(i + 1) * l], &mut wk.p[i * l..(i + 1) * l]);
        // A_ij = β_i (k_i·k_j) e^{γ_i−γ_j} below the diagonal; P_ij =
        // (q_i·k_j) e^{γ_i−γ_j} on and below.
        for jj in 0..l {
            if jj < i {
                kk[jj] *= beta * row[jj];
            } else {
                kk[jj] = 0.0;
            }
            if jj <= i {
                qk[jj] *= row[jj];
            } else {
                qk[jj] = 0.0;
            }
        }
    }
    // Q ⊙ e^γ for the inter-chunk term.
    for (qr, &gi) in wk.q.chunks_exact_mut(dk).zip(&wk.gamma[..l]) {
        let e = gi.exp();
        qr.iter_mut().for_each(|x| *x *= e);
    }
    // T = (I + A)⁻¹, U, W, V' = U − W S, O = (Q ⊙ e^γ) S + P V'.
    let at = (c0, hv, j);
    wk.solve
        .run::<FMA, WIDE>((l, dk, dv), &wk.a, &wk.p, &wk.q, s, out, at);
    // S ← e^{γ_L} S + (K ⊙ e^{γ_L−γ})ᵀ V'.
    let gl = wk.gamma[l - 1];
    for i in 0..l {
        let e = (gl - wk.gamma[i]).exp();
        for r in 0..dk {
            wk.kt[r * l + i] *= e;
        }
    }
    let el = gl.exp();
    s.iter_mut().for_each(|x| *x *= el);
    gemm_acc::<FMA, WIDE>(Tri::Full, dk, dv, l, 1.0, &wk.kt, l, &wk.solve.u, dv, s, dv);
}
/// The compiled levels of a module's `chunk_step::<FMA, WIDE>(d, j, s,
/// inp, c0, len, wk, out)` (the gated delta rule's and KDA's, over their
/// dims and inputs types) and `chunk_mv`, which runs it at the best SIMD
/// level: with fused multiply-adds where the CPU has them (x86-64 at the
/// AVX2 and AVX-512 levels, every AArch64), plain ones at the portable x86
/// level (`mul_add` would be a library call there), and the AVX-512 tiles
/// of [`gemm_acc`] (`WIDE`) at AVX-512.
macro_rules! chunk_levels {
    ($dims:ty, $inputs:ty, $work:ty) => {
        $crate::multiversion!(fn chunk_fma(
            d: &$dims, j: usize, s: &mut [f32], inp: &$inputs, c0: usize, len: usize,
            wk: &mut $work, out: SendPtr<f32>
        ) => chunk_step::<true, false>);
        $crate::multiversion!(fn chunk_fma_wide(
            d: &$dims, j: usize, s: &mut [f32], inp: &$inputs, c0: usize, len: usize,
            wk: &mut $work, out: SendPtr<f32>
        ) => chunk_step::<true, true>);

        #[allow(clippy::too_many_arguments)]
        fn chunk_mv(
            d: &$dims,
            j: usize,
            s: &mut [f32],
            inp: &$inputs,
            c0: usize,
            len: usize,
            wk: &mut $work,
            out: SendPtr<f32>,
        ) {
            use $crate::simd::{level, SimdLevel};
            let fused = !cfg!(target_arch = "x86_64") || level() != SimdLevel::Scalar;
            if cfg!(target_arch = "x86_64") && level() == SimdLevel::Avx512 {
                chunk_fma_wide(d, j, s, inp, c0, len, wk, out)
            } else if fused {
                chunk_fma(d, j, s, inp, c0, len, wk, out)
            } else {
                chunk_step::<false, false>(d, j, s, inp, c0, len, wk, out)
            }
        }
    };
}
pub(crate) use chunk_levels;

chunk_levels!(GatedDeltaDims, DeltaInputs, GatedWork);

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::ops::delta::gated::tests::{random_inputs, Case, Family};
    use crate::ops::delta::HeadOrder;
    use crate::testutil::Rng;

    /// [`delta_chunked`] over the case's `n` tokens in chunks of `chunk`:
    /// within 1e-4 (of the largest value) of the f64 recurrence and of the
    /// f32 recurrence kernel.
    pub(crate) fn check_chunked<D: ChunkGate + Family>(
        pool: &ThreadPool,
        d: D,
        c: &Case,
        n: usize,
        chunk: usize,
    ) {
        let (_, hv, _, dv) = d.shape();
        let inp = c.inputs(&d);
        let (ws, wo) = d.naive(c, n);
        let mut s = c.s0.clone();
        let mut out = vec![0f32; n * hv * dv];
        delta_chunked(pool, d, chunk, &mut s, inp, &mut out, n);
        let max = wo.iter().fold(0f64, |m, x| m.max(x.abs()));
        for (a, e) in out.iter().zip(&wo) {
            assert!(
                (*a as f64 - e).abs() <= 1e-4 * max,
                "{a} vs {e} (n {n}, chunk {chunk})"
            );
        }
        let smax = ws.iter().fold(0f64, |m, x| m.max(x.abs()));
        for (a, e) in s.iter().zip(&ws) {
            assert!((*a as f64 - e).abs() <= 1e-4 * smax);
        }
        let mut s2 = c.s0.clone();
        let mut out2 = vec![0f32; n * hv * dv];
        d.scan(pool, &mut s2, inp, &mut out2, n);
        for (a, e) in out.iter().zip(&out2) {
            assert!(((a - e) as f64).abs() <= 1e-4 * max);
        }
    }

    /// Every tile path of the chunk's products (AVX-512 8 × 32, the 4 × 16
    /// band) gives the band's result bit for bit: fused
    /// multiply-adds in `r` order, then `c += alpha · sum`; the columns past
    /// the whole tiles go one row at a time.
    #[test]
    fn tiles_are_the_band_bit_for_bit() {
        let mut rng = Rng::new(9);
        let (m, n, k) = (64, 45, 64);
        for tri in [Tri::Full, Tri::LowerC, Tri::LowerA] {
            let mut a = rng.vec(m * k);
            if tri == Tri::LowerA {
                for i in 0..m {
                    a[i * k + i..(i + 1) * k].fill(0.0);
                }
            }
            let b = rng.vec(k * n);
            let c0 = rng.vec(m * n);
            let mut want = c0.clone();
            for i in 0..m {
                for j in 0..n {
                    let w = &mut want[i * n + j];
                    if j < 32 {
                        // in a whole tile of 16 (or 32) columns
                        let mut acc = 0f32;
                        for r in 0..k {
                            acc = a[i * k + r].mul_add(b[r * n + j], acc);
                        }
                        *w = 0.5f32.mul_add(acc, *w);
                    } else {
                        // the columns past them, one row at a time
                        for r in 0..k {
                            *w = (0.5 * a[i * k + r]).mul_add(b[r * n + j], *w);
                        }
                    }
                }
            }
            for wide in [false, true] {
                if wide && crate::simd::level() != crate::simd::SimdLevel::Avx512 {
                    continue;
                }
                let mut c = c0.clone();
                if wide {
                    gemm_acc::<true, true>(tri, m, n, k, 0.5, &a, k, &b, n, &mut c, n);
                } else {
                    gemm_acc::<true, false>(tri, m, n, k, 0.5, &a, k, &b, n, &mut c, n);
                }
                for i in 0..m {
                    let cols = if tri == Tri::LowerC {
                        (i + 1).min(n)
                    } else {
                        n
                    };
                    for j in 0..cols {
                        assert_eq!(
                            c[i * n + j].to_bits(),
                            want[i * n + j].to_bits(),
                            "wide {wide} row {i} col {j}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    pub fn chunked_matches_recurrence() {
        let mut rng = Rng::new(21);
        let pool = ThreadPool::new(2);
        for order in [HeadOrder::Grouped, HeadOrder::Tiled] {
            for &(hk, hv, dk, dv, n, chunk) in &[
                (2, 4, 8, 8, 37, 8),
                (1, 3, 5, 19, 20, 64),
                (2, 2, 16, 4, 1, 4),
                (1, 2, 24, 20, 70, 16),
                (2, 4, 32, 32, 130, 64),
                // chunks of 40 in lanes of 8 at AVX2 and AVX-512 (five steps)
                (1, 2, 40, 48, 90, 40),
                // chunks of 16 with d_k, d_v multiples of 16 (the AVX-512
                // 16-token kernel there): whole and short last chunks
                (2, 4, 16, 32, 37, 16),
                (1, 2, 32, 16, 50, 16),
                (2, 2, 16, 16, 5, 16),
                (1, 1, 128, 128, 33, 16),
            ] {
                let dims = GatedDeltaDims {
                    n_k_head: hk,
                    n_v_head: hv,
                    d_k: dk,
                    d_v: dv,
                    order,
                };
                let c = random_inputs(&mut rng, &dims, n);
                check_chunked(&pool, dims, &c, n, chunk);
            }
        }
    }
}
