//! The chunked gated delta rule at AVX-512 for chunks of 16 tokens: one
//! `zmm` holds a value of all 16 tokens, so every small `L × L` matrix of
//! [`super::gated_delta_chunk`]'s form is a row of registers, and every
//! product reads its broadcast operand from one contiguous row (`Qᵀ`,
//! `Kᵀ`, `Wᵀ`, `Kdᵀ`: `[d_k, 16]`). The state is walked in column blocks of
//! 16 (`S[:, c..c+16]`, 8 KB at d_k = 128, staying in L1) and each block
//! goes through the whole chunk at once:
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

use super::gated_delta::{DeltaInputs, GatedDeltaDims};
use crate::pool::SendPtr;
use crate::simd::math::exp_fast;

/// Tokens per chunk of this kernel (one `zmm` of f32).
pub(super) const L: usize = 16;

/// Whether [`chunk16`] can run a layer of these dimensions.
pub(super) fn fits(d: &GatedDeltaDims) -> bool {
    d.d_k.is_multiple_of(L) && d.d_v.is_multiple_of(L) && d.d_k > 0 && d.d_v > 0
}

/// One thread's buffers.
pub(super) struct Work16 {
    qt: Vec<f32>,  // [dk, 16]  Qᵀ
    kt: Vec<f32>,  // [dk, 16]  Kᵀ
    wt: Vec<f32>,  // [dk, 16]  Wᵀ
    kdt: Vec<f32>, // [dk, 16]  (K ⊙ e^{γ_L−γ})ᵀ
    t1: Vec<f32>,  // [16, 16]  T·diag(β)
    p: Vec<f32>,   // [16, 16]  P
    sq: Vec<f32>,  // [16, 16]  K Kᵀ, then Q Kᵀ
    vp: Vec<f32>,  // [16, 16]  V' of one column block
}

impl Work16 {
    pub(super) fn new(dk: usize) -> Self {
        Work16 {
            qt: vec![0.0; dk * L],
            kt: vec![0.0; dk * L],
            wt: vec![0.0; dk * L],
            kdt: vec![0.0; dk * L],
            t1: vec![0.0; L * L],
            p: vec![0.0; L * L],
            sq: vec![0.0; L * L],
            vp: vec![0.0; L * L],
        }
    }
}

/// One chunk (`len ≤ 16` tokens from `c0`) of value head `j`: `s` is its
/// state `[d_k, d_v]`, `out` `[n_tokens, Hv, d_v]`.
///
/// # Safety
/// The CPU has AVX-512F; [`fits`] holds; `wk` was made for `d.d_k`;
/// tokens `c0..c0 + len` are within `inp` (checked by the caller);
/// `out` holds those tokens' rows, and this call alone writes head `j`'s
/// lanes of them.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn chunk16(
    d: &GatedDeltaDims,
    j: usize,
    s: &mut [f32],
    inp: &DeltaInputs,
    c0: usize,
    len: usize,
    n_tokens: usize,
    wk: &mut Work16,
    out: SendPtr<f32>,
) {
    use std::arch::x86_64::*;
    let (dk, dv, hv) = (d.d_k, d.d_v, d.n_v_head);
    assert!((1..=L).contains(&len) && fits(d));
    assert!(s.len() == dk * dv && wk.kt.len() == dk * L);
    let kh = d.key_head(j);
    let zero = _mm512_setzero_ps();

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
            _mm_prefetch::<_MM_HINT_T1>(q.add(o) as *const i8);
            _mm_prefetch::<_MM_HINT_T1>(k.add(o) as *const i8);
        }
        for o in (0..dv).step_by(16) {
            _mm_prefetch::<_MM_HINT_T1>(v.add(o) as *const i8);
        }
    }
    // Qᵀ, Kᵀ: 16 × 16 blocks of the token rows, transposed.
    for r0 in (0..dk).step_by(L) {
        for (src, dst) in [(inp.q, &mut wk.qt), (inp.k, &mut wk.kt)] {
            let mut rows = [zero; L];
            for (t, row) in rows.iter_mut().enumerate().take(len) {
                // token c0 + t < n_tokens, lanes kh·dk + r0 .. + 16 within
                // the row the caller checked
                *row = _mm512_loadu_ps(src.as_ptr().add((c0 + t) * inp.ld_qk + kh * dk + r0));
            }
            let cols = transpose16(rows);
            for (c, v) in cols.iter().enumerate() {
                _mm512_storeu_ps(dst.as_mut_ptr().add((r0 + c) * L), *v);
            }
        }
    }

    // e^{γ_i−γ_j} (j ≤ i) row by row as products of e^{g}: row i = row
    // i−1 · e^{g_i}, lane i = 1 (lanes past i stay 0). A and P from them.
    gram(dk, &wk.kt, &wk.kt, &mut wk.sq);
    let mut a_rows = [zero; L];
    let mut dec = zero;
    let mut decs = [zero; L];
    for i in 0..L {
        dec = _mm512_mask_mov_ps(
            _mm512_mul_ps(dec, _mm512_set1_ps(eg[i])),
            1 << i,
            _mm512_set1_ps(1.0),
        );
        decs[i] = dec;
        let kk = _mm512_loadu_ps(wk.sq.as_ptr().add(i * L));
        let bd = _mm512_mul_ps(_mm512_set1_ps(beta[i]), dec);
        a_rows[i] = _mm512_maskz_mul_ps(((1u32 << i) - 1) as u16, kk, bd);
    }
    gram(dk, &wk.qt, &wk.kt, &mut wk.sq);
    for (i, dec) in decs.iter().enumerate() {
        let qk = _mm512_loadu_ps(wk.sq.as_ptr().add(i * L));
        let m = ((2u32 << i) - 1) as u16;
        _mm512_storeu_ps(
            wk.p.as_mut_ptr().add(i * L),
            _mm512_maskz_mul_ps(m, qk, *dec),
        );
    }
    // A's rows to memory for their broadcasts.
    for (i, a) in a_rows.iter().enumerate() {
        _mm512_storeu_ps(wk.sq.as_mut_ptr().add(i * L), *a);
    }

    // T = (I + A)⁻¹ by forward substitution: row i = e_i − Σ_{j<i} A_ij T_j.
    let mut t = [zero; L];
    for i in 0..L {
        let mut ti = _mm512_mask_mov_ps(zero, 1 << i, _mm512_set1_ps(1.0));
        for jj in 0..i {
            let a = _mm512_set1_ps(*wk.sq.get_unchecked(i * L + jj));
            ti = _mm512_fnmadd_ps(a, t[jj], ti);
        }
        t[i] = ti;
    }
    // T' = T·diag(β) (for U = T' V), T'' = T·diag(β e^γ) (for W = T'' K).
    let bv = _mm512_loadu_ps(beta.as_ptr());
    let bev = _mm512_mul_ps(bv, _mm512_loadu_ps(egamma.as_ptr()));
    let mut t2 = [zero; L];
    for i in 0..L {
        _mm512_storeu_ps(wk.t1.as_mut_ptr().add(i * L), _mm512_mul_ps(t[i], bv));
        t2[i] = _mm512_mul_ps(t[i], bev);
    }
    // Wᵀ[r, :] = Σ_t Kᵀ[r, t] · T''ᵀ[t, :], eight rows r at a time; and
    // Kdᵀ[r, :] = Kᵀ[r, :] ⊙ e^{γ_L−γ}.
    let t2t = transpose16(t2);
    let edv = _mm512_loadu_ps(ed.as_ptr());
    for r0 in (0..dk).step_by(8) {
        let mut w = [zero; 8];
        for (tt, t2r) in t2t.iter().enumerate() {
            for (rr, w) in w.iter_mut().enumerate() {
                let k = _mm512_set1_ps(*wk.kt.get_unchecked((r0 + rr) * L + tt));
                *w = _mm512_fmadd_ps(k, *t2r, *w);
            }
        }
        for (rr, w) in w.iter().enumerate() {
            let r = r0 + rr;
            _mm512_storeu_ps(wk.wt.as_mut_ptr().add(r * L), *w);
            let k = _mm512_loadu_ps(wk.kt.as_ptr().add(r * L));
            _mm512_storeu_ps(wk.kdt.as_mut_ptr().add(r * L), _mm512_mul_ps(k, edv));
        }
    }

    let sp = s.as_mut_ptr();
    let elv = _mm512_set1_ps(el);
    for c in (0..dv).step_by(L) {
        // V'_c = T' V_c − W S_c (T' is lower triangular; every loop over
        // the 16 rows has a constant trip count, so the sums stay in
        // registers).
        let mut acc = [zero; L];
        for tt in 0..L {
            let v = if tt < len {
                _mm512_loadu_ps(inp.v.as_ptr().add((c0 + tt) * inp.ld_v + j * dv + c))
            } else {
                zero
            };
            for (i, a) in acc.iter_mut().enumerate() {
                if i >= tt {
                    let x = _mm512_set1_ps(*wk.t1.get_unchecked(i * L + tt));
                    *a = _mm512_fmadd_ps(x, v, *a);
                }
            }
        }
        for r in 0..dk {
            let sr = _mm512_loadu_ps(sp.add(r * dv + c));
            let w = wk.wt.as_ptr().add(r * L);
            for (i, a) in acc.iter_mut().enumerate() {
                *a = _mm512_fnmadd_ps(_mm512_set1_ps(*w.add(i)), sr, *a);
            }
        }
        for (i, a) in acc.iter().enumerate() {
            _mm512_storeu_ps(wk.vp.as_mut_ptr().add(i * L), *a);
        }
        // O_c = e^γ ⊙ (Q S_c) + P V'_c, rows of the chunk's tokens to `out`.
        let mut o = [zero; L];
        for r in 0..dk {
            let sr = _mm512_loadu_ps(sp.add(r * dv + c));
            let q = wk.qt.as_ptr().add(r * L);
            for (i, o) in o.iter_mut().enumerate() {
                *o = _mm512_fmadd_ps(_mm512_set1_ps(*q.add(i)), sr, *o);
            }
        }
        for (i, o) in o.iter().enumerate() {
            let mut x = _mm512_mul_ps(*o, _mm512_set1_ps(egamma[i]));
            for tt in 0..=i {
                let vp = _mm512_loadu_ps(wk.vp.as_ptr().add(tt * L));
                x = _mm512_fmadd_ps(_mm512_set1_ps(*wk.p.get_unchecked(i * L + tt)), vp, x);
            }
            if i < len {
                _mm512_storeu_ps(out.get().add(((c0 + i) * hv + j) * dv + c), x);
            }
        }
        // S_c ← e^{γ_L} S_c + Kdᵀ V'_c, eight rows at a time.
        for r0 in (0..dk).step_by(8) {
            let mut u = [zero; 8];
            for tt in 0..len {
                let vp = _mm512_loadu_ps(wk.vp.as_ptr().add(tt * L));
                for (rr, u) in u.iter_mut().enumerate() {
                    let k = _mm512_set1_ps(*wk.kdt.get_unchecked((r0 + rr) * L + tt));
                    *u = _mm512_fmadd_ps(k, vp, *u);
                }
            }
            for (rr, u) in u.iter().enumerate() {
                let p = sp.add((r0 + rr) * dv + c);
                _mm512_storeu_ps(p, _mm512_fmadd_ps(elv, _mm512_loadu_ps(p), *u));
            }
        }
    }
}

/// `dst[i, :] = Σ_r xt[r, i] · kt[r, :]` (`xt`, `kt`: `[dk, 16]`; `dst`
/// `[16, 16]`): `X Kᵀ` from the transposed `X` and `K`.
///
/// # Safety
/// The CPU has AVX-512F; `xt` and `kt` hold `dk · 16` values, `dst` 256.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn gram(dk: usize, xt: &[f32], kt: &[f32], dst: &mut [f32]) {
    use std::arch::x86_64::*;
    assert!(xt.len() >= dk * L && kt.len() >= dk * L && dst.len() >= L * L);
    let mut a = [_mm512_setzero_ps(); L];
    for r in 0..dk {
        let row = _mm512_loadu_ps(kt.as_ptr().add(r * L));
        let x = xt.as_ptr().add(r * L);
        for (i, a) in a.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(_mm512_set1_ps(*x.add(i)), row, *a);
        }
    }
    for (i, a) in a.iter().enumerate() {
        _mm512_storeu_ps(dst.as_mut_ptr().add(i * L), *a);
    }
}

/// The 16 × 16 transpose of 16 rows: `out[c][t] = rows[t][c]`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
fn transpose16(r: [std::arch::x86_64::__m512; L]) -> [std::arch::x86_64::__m512; L] {
    use std::arch::x86_64::*;
    // Pairs of rows interleaved, then quads, within each 128-bit lane:
    // u[4m + e], lane l = rows 4m..4m+4 at column 4l + e.
    let mut t = [_mm512_setzero_ps(); L];
    for p in 0..8 {
        t[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
        t[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
    }
    let mut u = [_mm512_setzero_ps(); L];
    for m in 0..4 {
        let (a0, a1, b0, b1) = (t[4 * m], t[4 * m + 1], t[4 * m + 2], t[4 * m + 3]);
        u[4 * m] = _mm512_shuffle_ps::<0x44>(a0, b0);
        u[4 * m + 1] = _mm512_shuffle_ps::<0xEE>(a0, b0);
        u[4 * m + 2] = _mm512_shuffle_ps::<0x44>(a1, b1);
        u[4 * m + 3] = _mm512_shuffle_ps::<0xEE>(a1, b1);
    }
    // Then the 128-bit lanes: column 4l + e gathers lane l of u[e],
    // u[4 + e], u[8 + e], u[12 + e].
    let mut out = [_mm512_setzero_ps(); L];
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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    #[test]
    fn transpose16_transposes() {
        if crate::simd::level() != crate::simd::SimdLevel::Avx512 {
            return;
        }
        use std::arch::x86_64::*;
        let m: Vec<f32> = (0..256).map(|i| i as f32).collect();
        let mut got = vec![0f32; 256];
        // SAFETY: AVX-512F checked above; 16 rows of 16 in both buffers.
        unsafe {
            #[target_feature(enable = "avx512f")]
            unsafe fn run(m: &[f32], got: &mut [f32]) {
                let rows: [__m512; L] =
                    std::array::from_fn(|t| _mm512_loadu_ps(m.as_ptr().add(t * L)));
                for (c, v) in transpose16(rows).iter().enumerate() {
                    _mm512_storeu_ps(got.as_mut_ptr().add(c * L), *v);
                }
            }
            run(&m, &mut got);
        }
        for c in 0..L {
            for t in 0..L {
                assert_eq!(got[c * L + t], m[t * L + c], "column {c} token {t}");
            }
        }
    }
}
