//! The chunked form of Kimi Delta Attention (flash-linear-attention's
//! `chunk_kda`): the same result as the token-by-token recurrence of
//! [`super::kda`], mostly in matrix products. It is the chunked gated delta
//! rule of [`super::chunk`] with the decay inside the products,
//! one cumulative log decay per key channel. Per head and chunk of L tokens,
//! from the state S (`[d_k, d_v]`) at its start, with `Γ = cumsum(g)`
//! (`[L, d_k]`, within the chunk):
//!
//! ```text
//! A_ij = β_i Σ_c k_ic k_jc e^{Γ_ic−Γ_jc}   (i > j)            [L, L]
//! P_ij =     Σ_c q_ic k_jc e^{Γ_ic−Γ_jc}   (i ≥ j)            [L, L]
//! U = (I + A)⁻¹ (β⊙V),  W = (I + A)⁻¹ (β⊙K⊙e^Γ)   (forward substitution)
//! V' = U − W S                                                [L, d_v]
//! O = (Q⊙e^Γ) S + P V'                                        [L, d_v]
//! S ← Diag(e^{Γ_L}) S + (K ⊙ e^{Γ_L−Γ})ᵀ V'
//! ```
//!
//! Every exponent is ≤ 0 (g ≤ 0), so nothing overflows. The pair decays
//! `e^{Γ_i−Γ_j}` are never exponentials of differences: for each key row j
//! the vector `k_j ⊙ e^{Γ_i−Γ_j}` is carried down the rows i by multiplying
//! with the token decays `e^{g_i}` (no cancellation, no overflow, however
//! fast a channel decays; fla splits chunks into sub-chunks for the same
//! reason).

use super::chunk::{chunk_levels, gemm_acc, madd, ChunkGate, Tri, Work};
use super::dims::DeltaInputs;
use super::kda::{KdaDims, KdaInputs};
use crate::pool::SendPtr;

/// KDA's own buffers of a chunk (beside [`Work`]'s, where `gamma` is Γ,
/// `[L, d_k]`).
#[doc(hidden)]
pub struct Decays {
    e: Vec<f32>,  // [L, dk]  e^g
    kd: Vec<f32>, // [dk]     k_j ⊙ e^{Γ_i−Γ_j}
}

type KdaWork = Work<Decays>;

impl ChunkGate for KdaDims {
    type Own = Decays;
    fn check_dims(&self) {
        self.check();
    }
    fn work(&self, l: usize) -> KdaWork {
        let dk = self.d_k;
        let own = Decays {
            e: vec![0.0; l * dk],
            kd: vec![0.0; dk],
        };
        Work::new(self, l, own)
    }
    #[inline(always)]
    fn chunk(
        &self,
        j: usize,
        s: &mut [f32],
        inp: &DeltaInputs,
        c0: usize,
        len: usize,
        wk: &mut KdaWork,
        out: *mut f32,
    ) {
        chunk_mv(self, j, s, inp, c0, len, wk, SendPtr(out))
    }
}

/// Σ a·b in 8 independent lanes, then the lanes in order.
#[inline(always)]
fn dot<const FMA: bool>(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (xa, xb) in ca.zip(cb) {
        for ((l, &x), &y) in lanes.iter_mut().zip(xa).zip(xb) {
            *l = madd::<FMA>(x, y, *l);
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// One chunk (`len` tokens from `c0`) of head `h` (`WIDE`: the AVX-512
/// tiles of [`gemm_acc`]).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn chunk_step<const FMA: bool, const WIDE: bool>(
    d: &KdaDims,
    h: usize,
    s: &mut [f32],
    inp: &KdaInputs,
    c0: usize,
    len: usize,
    wk: &mut KdaWork,
    out: SendPtr<f32>,
) {
    let (dk, dv, nh) = (d.d_k, d.d_v, d.n_head);
    let l = len;
    // Γ, e^g, and the rows of Q, K, β⊙V, β⊙K⊙e^Γ.
    for i in 0..l {
        let t = c0 + i;
        let beta = inp.beta[t * nh + h];
        let (q, k, v, g) = (
            inp.q_at(d, t, h),
            inp.k_at(d, t, h),
            inp.v_at(d, t, h),
            inp.g_at(d, t, h),
        );
        let (done, rest) = wk.gamma.split_at_mut(i * dk);
        let gi = &mut rest[..dk];
        if i == 0 {
            gi.copy_from_slice(g);
        } else {
            for ((x, &p), &gr) in gi.iter_mut().zip(&done[(i - 1) * dk..]).zip(g) {
                *x = p + gr;
            }
        }
        for (e, &gr) in wk.x.e[i * dk..(i + 1) * dk].iter_mut().zip(g) {
            *e = gr.exp();
        }
        wk.q[i * dk..(i + 1) * dk].copy_from_slice(q);
        wk.k[i * dk..(i + 1) * dk].copy_from_slice(k);
        for ((x, &kr), &gr) in wk.solve.bk[i * dk..(i + 1) * dk]
            .iter_mut()
            .zip(k)
            .zip(gi.iter())
        {
            *x = beta * kr * gr.exp();
        }
        for (x, &vv) in wk.solve.bv[i * dv..(i + 1) * dv].iter_mut().zip(v) {
            *x = beta * vv;
        }
    }
    // A and P, column by column: kd = k_j ⊙ e^{Γ_i−Γ_j}, carried down the
    // rows by the token decays.
    wk.a[..l * l].fill(0.0);
    wk.p[..l * l].fill(0.0);
    for j in 0..l {
        wk.x.kd.copy_from_slice(&wk.k[j * dk..(j + 1) * dk]);
        wk.p[j * l + j] = dot::<FMA>(&wk.q[j * dk..(j + 1) * dk], &wk.x.kd);
        for i in j + 1..l {
            for (x, &e) in wk.x.kd.iter_mut().zip(&wk.x.e[i * dk..(i + 1) * dk]) {
                *x *= e;
            }
            let beta = inp.beta[(c0 + i) * nh + h];
            wk.a[i * l + j] = beta * dot::<FMA>(&wk.k[i * dk..(i + 1) * dk], &wk.x.kd);
            wk.p[i * l + j] = dot::<FMA>(&wk.q[i * dk..(i + 1) * dk], &wk.x.kd);
        }
    }
    // Q ⊙ e^Γ; then T = (I + A)⁻¹, U = T (β⊙V), W = T (β⊙K⊙e^Γ),
    // V' = U − W S, O = (Q ⊙ e^Γ) S + P V'.
    for (x, &gr) in wk.q[..l * dk].iter_mut().zip(&wk.gamma[..l * dk]) {
        *x *= gr.exp();
    }
    let at = (c0, nh, h);
    wk.solve
        .run::<FMA, WIDE>((l, dk, dv), &wk.a, &wk.p, &wk.q, s, out, at);
    // S ← Diag(e^{Γ_L}) S + (K ⊙ e^{Γ_L−Γ})ᵀ V'.
    let gl = &wk.gamma[(l - 1) * dk..l * dk];
    for i in 0..l {
        let (ki, gi) = (&wk.k[i * dk..(i + 1) * dk], &wk.gamma[i * dk..(i + 1) * dk]);
        for r in 0..dk {
            wk.kt[r * l + i] = ki[r] * (gl[r] - gi[r]).exp();
        }
    }
    for (row, &g) in s.chunks_exact_mut(dv).zip(gl) {
        let e = g.exp();
        row.iter_mut().for_each(|x| *x *= e);
    }
    gemm_acc::<FMA, WIDE>(Tri::Full, dk, dv, l, 1.0, &wk.kt, l, &wk.solve.u, dv, s, dv);
}
chunk_levels!(KdaDims, KdaInputs, KdaWork);

#[cfg(test)]
pub(crate) mod tests {
    use crate::ops::delta::chunk::tests::check_chunked;
    use crate::ops::delta::kda::tests::random_inputs;
    use crate::ops::delta::kda::KdaDims;
    use crate::pool::ThreadPool;
    use crate::testutil::Rng;

    /// Within 1e-4 (of the largest value) of the f64 recurrence and of the
    /// f32 recurrence kernel, across chunk boundaries and short last chunks,
    /// with channels that forget within a token beside ones that remember.
    #[test]
    pub fn chunked_matches_recurrence() {
        let mut rng = Rng::new(66);
        let pool = ThreadPool::new(2);
        for &(nh, dk, dv, n, chunk) in &[
            (2, 8, 8, 37, 8),
            (3, 5, 19, 20, 64),
            (2, 16, 4, 1, 4),
            (1, 24, 20, 70, 16),
            (2, 32, 32, 130, 16),
            (1, 16, 32, 50, 16),
            (1, 128, 128, 33, 16),
        ] {
            let d = KdaDims {
                n_head: nh,
                d_k: dk,
                d_v: dv,
            };
            let c = random_inputs(&mut rng, &d, n);
            check_chunked(&pool, d, &c, n, chunk);
        }
    }
}
