//! The chunked gated delta rule with one token per vector lane: chunks of
//! `L` = 16 tokens in `zmm` registers at AVX-512, 8 in `ymm` at AVX2. Every
//! small `L × L` matrix of [`super::chunk`]'s form is a row of
//! registers, and every product reads its broadcast operand from one
//! contiguous row (`Qᵀ`, `Kᵀ`, `Wᵀ`, `Kdᵀ`: `[d_k, L]`). The state is walked
//! in column blocks of `L` (`S[:, c..c+L]`, at most 8 KB at d_k = 128,
//! staying in L1) and each block goes through the whole chunk at once:
//!
//! ```text
//! per chunk:   γ = cumsum(g), Qᵀ, Kᵀ (transposed from the inputs)
//!              A = strict_lower(β_i k_i·k_j e^{γ_i−γ_j}),  P = lower(q_i·k_j e^{γ_i−γ_j})
//!              T = (I + A)⁻¹,  T' = T·diag(β),  Wᵀ = Kᵀ (T·diag(β e^γ))ᵀ,
//!              Kdᵀ = Kᵀ·diag(e^{γ_L−γ})
//! per block c: V'_c = T' V_c − W S_c
//!              O_c  = e^γ ⊙ (Q S_c) + P V'_c          (written to `out`)
//!              S_c ← e^{γ_L} S_c + Kd ᵀ V'_c
//! ```
//!
//! The same algebra as the generic form (the scalings are applied to the
//! small matrices instead of `V`, `K` and `Q`: other roundings, the same
//! sums); rows past a short last chunk are zeros (β = 0, g = 0), which add
//! nothing.

use super::dims::{DeltaInputs, GatedDeltaDims};
use crate::pool::SendPtr;
use crate::simd::math::exp_fast;

/// A vector of `LANES` f32 (one token per lane).
pub(super) trait Lane: Copy {
    const LANES: usize;
    unsafe fn zero() -> Self;
    unsafe fn splat(x: f32) -> Self;
    unsafe fn load(p: *const f32) -> Self;
    unsafe fn store(p: *mut f32, v: Self);
    /// `a · b + c`, fused.
    unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self;
    /// `c − a · b`, fused.
    unsafe fn fnmadd(a: Self, b: Self, c: Self) -> Self;
    unsafe fn mul(a: Self, b: Self) -> Self;
    /// Lane `i` set to `v`, the others kept.
    unsafe fn with_lane(self, i: usize, v: f32) -> Self;
    /// Lanes below `n` kept, the others zero.
    unsafe fn keep_below(self, n: usize) -> Self;
    /// `r[c][t] ← r[t][c]` (`r.len()` = `LANES`).
    unsafe fn transpose(r: &mut [Self]);
    /// Toward L2.
    unsafe fn prefetch(p: *const f32);
}

/// Whether chunks of `l` tokens in lanes can run a layer of these
/// dimensions.
pub(super) fn fits(d: &GatedDeltaDims, l: usize) -> bool {
    d.d_k.is_multiple_of(l) && d.d_v.is_multiple_of(l) && d.d_k > 0 && d.d_v > 0
}

/// Tokens per lane step for chunks of `chunk` tokens of a layer of these
/// dimensions at the current SIMD level: 16 at AVX-512, 8 at AVX2 (a chunk
/// of 16 there runs as two of 8), 0 where the chunk is not made of whole
/// vectors or the dimensions do not fit (the generic form then).
pub(super) fn width(chunk: usize, d: &GatedDeltaDims) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::simd::{level, SimdLevel};
        let w = if level() == SimdLevel::Avx512 && chunk.is_multiple_of(16) {
            16
        } else if level() >= SimdLevel::Avx2 && chunk.is_multiple_of(8) {
            8
        } else {
            0
        };
        if w > 0 && fits(d, w) {
            return w;
        }
    }
    let _ = (chunk, d);
    0
}

/// [`chunk`] at the lane width [`width`] chose.
///
/// # Safety
/// `width` came from [`width`] for these dimensions (non-zero); `wk` was
/// made for `d.d_k` and `width`; as [`chunk`] otherwise.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn chunk_at(
    width: usize,
    d: &GatedDeltaDims,
    j: usize,
    s: &mut [f32],
    inp: &DeltaInputs,
    c0: usize,
    len: usize,
    n_tokens: usize,
    wk: &mut Work,
    out: SendPtr<f32>,
) {
    #[cfg(target_arch = "x86_64")]
    match width {
        16 => return x86::chunk16(d, j, s, inp, c0, len, n_tokens, wk, out),
        8 => return x86::chunk8(d, j, s, inp, c0, len, n_tokens, wk, out),
        _ => {}
    }
    unreachable!("no lane kernel {width} wide");
}

/// One thread's buffers.
pub(super) struct Work {
    qt: Vec<f32>,  // [dk, L]  Qᵀ
    kt: Vec<f32>,  // [dk, L]  Kᵀ
    wt: Vec<f32>,  // [dk, L]  Wᵀ
    kdt: Vec<f32>, // [dk, L]  (K ⊙ e^{γ_L−γ})ᵀ
    t1: Vec<f32>,  // [L, L]   T·diag(β)
    p: Vec<f32>,   // [L, L]   P
    sq: Vec<f32>,  // [L, L]   K Kᵀ, then Q Kᵀ, then A
    vp: Vec<f32>,  // [L, L]   V' of one column block
}

impl Work {
    pub(super) fn new(dk: usize, l: usize) -> Self {
        Work {
            qt: vec![0.0; dk * l],
            kt: vec![0.0; dk * l],
            wt: vec![0.0; dk * l],
            kdt: vec![0.0; dk * l],
            t1: vec![0.0; l * l],
            p: vec![0.0; l * l],
            sq: vec![0.0; l * l],
            vp: vec![0.0; l * l],
        }
    }
}

/// One chunk (`len ≤ L` tokens from `c0`) of value head `j`: `s` is its
/// state `[d_k, d_v]`, `out` `[n_tokens, Hv, d_v]`.
///
/// # Safety
/// The CPU has the features of `V`'s instructions; `V::LANES == L`;
/// [`fits`] holds for `L`; `wk` was made for `d.d_k` and `L`; tokens
/// `c0..c0 + len` are within `inp` (checked by the caller); `out` holds
/// those tokens' rows, and this call alone writes head `j`'s lanes of them.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn chunk<V: Lane, const L: usize>(
    d: &GatedDeltaDims,
    j: usize,
    s: &mut [f32],
    inp: &DeltaInputs,
    c0: usize,
    len: usize,
    n_tokens: usize,
    wk: &mut Work,
    out: SendPtr<f32>,
) {
    let (dk, dv, hv) = (d.d_k, d.d_v, d.n_v_head);
    assert!(V::LANES == L && (1..=L).contains(&len) && fits(d, L));
    assert!(s.len() == dk * dv && wk.kt.len() == dk * L);
    let kh = d.key_head(j);
    let zero = V::zero();

    // γ (cumulated g), β, e^{g}; rows past `len` are g = 0, β = 0.
    let mut g = [0f32; L];
    let mut beta = [0f32; L];
    for t in 0..len {
        g[t] = inp.g[(c0 + t) * hv + j];
        beta[t] = inp.beta[(c0 + t) * hv + j];
    }
    let mut gamma = [0f32; L];
    let mut acc = 0f32;
    for t in 0..L {
        acc += g[t];
        gamma[t] = acc;
    }
    let gl = gamma[L - 1];
    // (exp_fast: 16 lanes at once, where libm's expf is a call each)
    let (mut eg, mut egamma, mut ed) = ([0f32; L], [0f32; L], [0f32; L]);
    for t in 0..L {
        eg[t] = exp_fast(g[t]);
        egamma[t] = exp_fast(gamma[t]);
        ed[t] = exp_fast(gl - gamma[t]);
    }
    let el = exp_fast(gl);

    // The next chunk's rows of this head, toward L2 while this one runs
    // (16 rows far apart: the hardware prefetchers do not follow them).
    for t in c0 + len..(c0 + len + L).min(n_tokens) {
        let q = inp.q.as_ptr().add(t * inp.ld_qk + kh * dk);
        let k = inp.k.as_ptr().add(t * inp.ld_qk + kh * dk);
        let v = inp.v.as_ptr().add(t * inp.ld_v + j * dv);
        for o in (0..dk).step_by(16) {
            V::prefetch(q.add(o));
            V::prefetch(k.add(o));
        }
        for o in (0..dv).step_by(16) {
            V::prefetch(v.add(o));
        }
    }
    // Qᵀ, Kᵀ: 16 × 16 blocks of the token rows, transposed.
    for r0 in (0..dk).step_by(L) {
        for (src, dst) in [(inp.q, &mut wk.qt), (inp.k, &mut wk.kt)] {
            let mut rows = [zero; L];
            for (t, row) in rows.iter_mut().enumerate().take(len) {
                // token c0 + t < n_tokens, lanes kh·dk + r0 .. + 16 within
                // the row the caller checked
                *row = V::load(src.as_ptr().add((c0 + t) * inp.ld_qk + kh * dk + r0));
            }
            V::transpose(&mut rows);
            for (c, v) in rows.iter().enumerate() {
                V::store(dst.as_mut_ptr().add((r0 + c) * L), *v);
            }
        }
    }

    // e^{γ_i−γ_j} (j ≤ i) row by row as products of e^{g}: row i = row
    // i−1 · e^{g_i}, lane i = 1 (lanes past i stay 0). A and P from them.
    gram::<V, L>(dk, &wk.kt, &wk.kt, &mut wk.sq);
    let mut a_rows = [zero; L];
    let mut dec = zero;
    let mut decs = [zero; L];
    for i in 0..L {
        dec = V::mul(dec, V::splat(eg[i])).with_lane(i, 1.0);
        decs[i] = dec;
        let kk = V::load(wk.sq.as_ptr().add(i * L));
        let bd = V::mul(V::splat(beta[i]), dec);
        a_rows[i] = V::mul(kk, bd).keep_below(i);
    }
    gram::<V, L>(dk, &wk.qt, &wk.kt, &mut wk.sq);
    for (i, dec) in decs.iter().enumerate() {
        let qk = V::load(wk.sq.as_ptr().add(i * L));
        V::store(
            wk.p.as_mut_ptr().add(i * L),
            V::mul(qk, *dec).keep_below(i + 1),
        );
    }
    // A's rows to memory for their broadcasts.
    for (i, a) in a_rows.iter().enumerate() {
        V::store(wk.sq.as_mut_ptr().add(i * L), *a);
    }

    // T = (I + A)⁻¹ by forward substitution: row i = e_i − Σ_{j<i} A_ij T_j.
    let mut t = [zero; L];
    for i in 0..L {
        let mut ti = zero.with_lane(i, 1.0);
        for jj in 0..i {
            let a = V::splat(*wk.sq.get_unchecked(i * L + jj));
            ti = V::fnmadd(a, t[jj], ti);
        }
        t[i] = ti;
    }
    // T' = T·diag(β) (for U = T' V), T'' = T·diag(β e^γ) (for W = T'' K).
    let bv = V::load(beta.as_ptr());
    let bev = V::mul(bv, V::load(egamma.as_ptr()));
    let mut t2 = [zero; L];
    for i in 0..L {
        V::store(wk.t1.as_mut_ptr().add(i * L), V::mul(t[i], bv));
        t2[i] = V::mul(t[i], bev);
    }
    // Wᵀ[r, :] = Σ_t Kᵀ[r, t] · T''ᵀ[t, :], four rows r at a time; and
    // Kdᵀ[r, :] = Kᵀ[r, :] ⊙ e^{γ_L−γ}.
    let mut t2t = t2;
    V::transpose(&mut t2t);
    let edv = V::load(ed.as_ptr());
    for r0 in (0..dk).step_by(4) {
        let mut w = [zero; 4];
        for (tt, t2r) in t2t.iter().enumerate() {
            for (rr, w) in w.iter_mut().enumerate() {
                let k = V::splat(*wk.kt.get_unchecked((r0 + rr) * L + tt));
                *w = V::fmadd(k, *t2r, *w);
            }
        }
        for (rr, w) in w.iter().enumerate() {
            let r = r0 + rr;
            V::store(wk.wt.as_mut_ptr().add(r * L), *w);
            let k = V::load(wk.kt.as_ptr().add(r * L));
            V::store(wk.kdt.as_mut_ptr().add(r * L), V::mul(k, edv));
        }
    }

    let sp = s.as_mut_ptr();
    let elv = V::splat(el);
    for c in (0..dv).step_by(L) {
        // V'_c = T' V_c − W S_c (T' is lower triangular; every loop over
        // the 16 rows has a constant trip count, so the sums stay in
        // registers).
        let mut acc = [zero; L];
        for tt in 0..L {
            let v = if tt < len {
                V::load(inp.v.as_ptr().add((c0 + tt) * inp.ld_v + j * dv + c))
            } else {
                zero
            };
            for (i, a) in acc.iter_mut().enumerate() {
                if i >= tt {
                    let x = V::splat(*wk.t1.get_unchecked(i * L + tt));
                    *a = V::fmadd(x, v, *a);
                }
            }
        }
        for r in 0..dk {
            let sr = V::load(sp.add(r * dv + c));
            let w = wk.wt.as_ptr().add(r * L);
            for (i, a) in acc.iter_mut().enumerate() {
                *a = V::fnmadd(V::splat(*w.add(i)), sr, *a);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            V::store(wk.vp.as_mut_ptr().add(i * L), *a);
        }
        // O_c = e^γ ⊙ (Q S_c) + P V'_c, rows of the chunk's tokens to `out`.
        let mut o = [zero; L];
        for r in 0..dk {
            let sr = V::load(sp.add(r * dv + c));
            let q = wk.qt.as_ptr().add(r * L);
            for (i, o) in o.iter_mut().enumerate() {
                *o = V::fmadd(V::splat(*q.add(i)), sr, *o);
            }
        }
        for (i, o) in o.iter().enumerate() {
            let mut x = V::mul(*o, V::splat(egamma[i]));
            for tt in 0..=i {
                let vp = V::load(wk.vp.as_ptr().add(tt * L));
                x = V::fmadd(V::splat(*wk.p.get_unchecked(i * L + tt)), vp, x);
            }
            if i < len {
                V::store(out.get().add(((c0 + i) * hv + j) * dv + c), x);
            }
        }
        // S_c ← e^{γ_L} S_c + Kdᵀ V'_c, eight rows at a time.
        for r0 in (0..dk).step_by(8) {
            let mut u = [zero; 8];
            for tt in 0..len {
                let vp = V::load(wk.vp.as_ptr().add(tt * L));
                for (rr, u) in u.iter_mut().enumerate() {
                    let k = V::splat(*wk.kdt.get_unchecked((r0 + rr) * L + tt));
                    *u = V::fmadd(k, vp, *u);
                }
            }
            for (rr, u) in u.iter().enumerate() {
                let p = sp.add((r0 + rr) * dv + c);
                V::store(p, V::fmadd(elv, V::load(p), *u));
            }
        }
    }
}

/// `dst[i, :] = Σ_r xt[r, i] · kt[r, :]` (`xt`, `kt`: `[dk, L]`; `dst`
/// `[L, L]`): `X Kᵀ` from the transposed `X` and `K`.
///
/// # Safety
/// As [`chunk`]; `xt` and `kt` hold `dk · L` values, `dst` `L · L`.
#[inline(always)]
unsafe fn gram<V: Lane, const L: usize>(dk: usize, xt: &[f32], kt: &[f32], dst: &mut [f32]) {
    assert!(xt.len() >= dk * L && kt.len() >= dk * L && dst.len() >= L * L);
    let mut a = [V::zero(); L];
    for r in 0..dk {
        let row = V::load(kt.as_ptr().add(r * L));
        let x = xt.as_ptr().add(r * L);
        for (i, a) in a.iter_mut().enumerate() {
            *a = V::fmadd(V::splat(*x.add(i)), row, *a);
        }
    }
    for (i, a) in a.iter().enumerate() {
        V::store(dst.as_mut_ptr().add(i * L), *a);
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{chunk, DeltaInputs, GatedDeltaDims, Lane, SendPtr, Work};
    use std::arch::x86_64::*;

    impl Lane for __m512 {
        const LANES: usize = 16;
        #[inline(always)]
        unsafe fn zero() -> Self {
            _mm512_setzero_ps()
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            _mm512_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            _mm512_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self) {
            _mm512_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
            _mm512_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn fnmadd(a: Self, b: Self, c: Self) -> Self {
            _mm512_fnmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            _mm512_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn with_lane(self, i: usize, v: f32) -> Self {
            _mm512_mask_mov_ps(self, 1 << i, _mm512_set1_ps(v))
        }
        #[inline(always)]
        unsafe fn keep_below(self, n: usize) -> Self {
            _mm512_maskz_mov_ps(((1u32 << n) - 1) as u16, self)
        }
        #[inline(always)]
        unsafe fn transpose(r: &mut [Self]) {
            let rows: [__m512; 16] = r.try_into().expect("16 rows");
            r.copy_from_slice(&transpose16(rows));
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            _mm_prefetch::<_MM_HINT_T1>(p as *const i8)
        }
    }

    impl Lane for __m256 {
        const LANES: usize = 8;
        #[inline(always)]
        unsafe fn zero() -> Self {
            _mm256_setzero_ps()
        }
        #[inline(always)]
        unsafe fn splat(x: f32) -> Self {
            _mm256_set1_ps(x)
        }
        #[inline(always)]
        unsafe fn load(p: *const f32) -> Self {
            _mm256_loadu_ps(p)
        }
        #[inline(always)]
        unsafe fn store(p: *mut f32, v: Self) {
            _mm256_storeu_ps(p, v)
        }
        #[inline(always)]
        unsafe fn fmadd(a: Self, b: Self, c: Self) -> Self {
            _mm256_fmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn fnmadd(a: Self, b: Self, c: Self) -> Self {
            _mm256_fnmadd_ps(a, b, c)
        }
        #[inline(always)]
        unsafe fn mul(a: Self, b: Self) -> Self {
            _mm256_mul_ps(a, b)
        }
        #[inline(always)]
        unsafe fn with_lane(self, i: usize, v: f32) -> Self {
            let lane = _mm256_castsi256_ps(_mm256_cmpeq_epi32(
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                _mm256_set1_epi32(i as i32),
            ));
            _mm256_blendv_ps(self, _mm256_set1_ps(v), lane)
        }
        #[inline(always)]
        unsafe fn keep_below(self, n: usize) -> Self {
            let below = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                _mm256_set1_epi32(n as i32),
                _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
            ));
            _mm256_and_ps(self, below)
        }
        #[inline(always)]
        unsafe fn transpose(r: &mut [Self]) {
            assert_eq!(r.len(), 8);
            // Pairs of rows interleaved, then quads, within each 128-bit
            // half: u[4m + e], half h = rows 4m..4m+4 at column 4h + e;
            // then the halves.
            let mut t = [_mm256_setzero_ps(); 8];
            for p in 0..4 {
                t[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
                t[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
            }
            let mut u = [_mm256_setzero_ps(); 8];
            for m in 0..2 {
                let (a0, a1, b0, b1) = (t[4 * m], t[4 * m + 1], t[4 * m + 2], t[4 * m + 3]);
                u[4 * m] = _mm256_shuffle_ps::<0x44>(a0, b0);
                u[4 * m + 1] = _mm256_shuffle_ps::<0xEE>(a0, b0);
                u[4 * m + 2] = _mm256_shuffle_ps::<0x44>(a1, b1);
                u[4 * m + 3] = _mm256_shuffle_ps::<0xEE>(a1, b1);
            }
            for e in 0..4 {
                r[e] = _mm256_permute2f128_ps::<0x20>(u[e], u[4 + e]);
                r[4 + e] = _mm256_permute2f128_ps::<0x31>(u[e], u[4 + e]);
            }
        }
        #[inline(always)]
        unsafe fn prefetch(p: *const f32) {
            _mm_prefetch::<_MM_HINT_T1>(p as *const i8)
        }
    }

    /// [`chunk`] in `zmm` lanes, 16 tokens.
    ///
    /// # Safety
    /// As [`chunk`], with AVX-512F.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn chunk16(
        d: &GatedDeltaDims,
        j: usize,
        s: &mut [f32],
        inp: &DeltaInputs,
        c0: usize,
        len: usize,
        n_tokens: usize,
        wk: &mut Work,
        out: SendPtr<f32>,
    ) {
        chunk::<__m512, 16>(d, j, s, inp, c0, len, n_tokens, wk, out)
    }

    /// [`chunk`] in `ymm` lanes, 8 tokens.
    ///
    /// # Safety
    /// As [`chunk`], with AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn chunk8(
        d: &GatedDeltaDims,
        j: usize,
        s: &mut [f32],
        inp: &DeltaInputs,
        c0: usize,
        len: usize,
        n_tokens: usize,
        wk: &mut Work,
        out: SendPtr<f32>,
    ) {
        chunk::<__m256, 8>(d, j, s, inp, c0, len, n_tokens, wk, out)
    }

    /// The 16 × 16 transpose of 16 rows: `out[c][t] = rows[t][c]`.
    #[inline(always)]
    pub(super) unsafe fn transpose16(r: [__m512; 16]) -> [__m512; 16] {
        // Pairs of rows interleaved, then quads, within each 128-bit lane:
        // u[4m + e], lane l = rows 4m..4m+4 at column 4l + e.
        let mut t = [_mm512_setzero_ps(); 16];
        for p in 0..8 {
            t[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
            t[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
        }
        let mut u = [_mm512_setzero_ps(); 16];
        for m in 0..4 {
            let (a0, a1, b0, b1) = (t[4 * m], t[4 * m + 1], t[4 * m + 2], t[4 * m + 3]);
            u[4 * m] = _mm512_shuffle_ps::<0x44>(a0, b0);
            u[4 * m + 1] = _mm512_shuffle_ps::<0xEE>(a0, b0);
            u[4 * m + 2] = _mm512_shuffle_ps::<0x44>(a1, b1);
            u[4 * m + 3] = _mm512_shuffle_ps::<0xEE>(a1, b1);
        }
        // Then the 128-bit lanes: column 4l + e gathers lane l of u[e],
        // u[4 + e], u[8 + e], u[12 + e].
        let mut out = [_mm512_setzero_ps(); 16];
        for e in 0..4 {
            let v0 = _mm512_shuffle_f32x4::<0x88>(u[e], u[4 + e]);
            let v1 = _mm512_shuffle_f32x4::<0xDD>(u[e], u[4 + e]);
            let w0 = _mm512_shuffle_f32x4::<0x88>(u[8 + e], u[12 + e]);
            let w1 = _mm512_shuffle_f32x4::<0xDD>(u[8 + e], u[12 + e]);
            out[e] = _mm512_shuffle_f32x4::<0x88>(v0, w0);
            out[8 + e] = _mm512_shuffle_f32x4::<0xDD>(v0, w0);
            out[4 + e] = _mm512_shuffle_f32x4::<0x88>(v1, w1);
            out[12 + e] = _mm512_shuffle_f32x4::<0xDD>(v1, w1);
        }
        out
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::Lane;
    use crate::simd::{level, SimdLevel};
    use std::arch::x86_64::*;

    /// `V::transpose` on `n × n` values 0, 1, 2, …
    ///
    /// # Safety
    /// The CPU has `V`'s instructions.
    #[inline(always)]
    unsafe fn check<V: Lane>() {
        let n = V::LANES;
        let m: Vec<f32> = (0..n * n).map(|i| i as f32).collect();
        let mut rows: Vec<V> = (0..n).map(|t| V::load(m.as_ptr().add(t * n))).collect();
        V::transpose(&mut rows);
        let mut got = vec![0f32; n * n];
        for (c, v) in rows.iter().enumerate() {
            V::store(got.as_mut_ptr().add(c * n), *v);
        }
        for c in 0..n {
            for t in 0..n {
                assert_eq!(
                    got[c * n + t],
                    m[t * n + c],
                    "{n} lanes: column {c} token {t}"
                );
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    unsafe fn check16() {
        check::<__m512>()
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn check8() {
        check::<__m256>()
    }

    #[test]
    fn transposes_transpose() {
        // SAFETY: each only where the CPU has its level.
        unsafe {
            if level() >= SimdLevel::Avx2 {
                check8();
            }
            if level() == SimdLevel::Avx512 {
                check16();
            }
        }
    }
}
