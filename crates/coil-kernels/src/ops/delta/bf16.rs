//! The gated delta rule (`gated.rs`'s `head_scan`) over a value head's
//! state stored in bf16: the same two passes over the state rows (`d_v`
//! values each) as the f32 kernel, each row widened to f32 in a work row
//! as it is read and, in the second pass, rounded back to bf16 (nearest
//! even) as it is written — once per token, so a token's result does not
//! depend on how many tokens share the call. Same arithmetic in the same
//! order as the f32 kernel; half the state bytes go to and from memory.

use super::dims::{DeltaInputs, GatedDeltaDims};
use crate::multiversion;
use crate::ops::state_elem::{round_row, widen_row};
use crate::ops::state_rows::prefetch_rows_ahead;
use crate::pool::SendPtr;
use half::bf16;

#[inline(always)]
fn head_scan_bf16(
    d: &GatedDeltaDims,
    j: usize,
    s: &mut [bf16],
    inp: &DeltaInputs,
    out: SendPtr<f32>,
    kv: &mut [f32],
    n: usize,
) {
    let (dk, dv, hv) = (d.d_k, d.d_v, d.n_v_head);
    let kh = d.key_head(j);
    let mut row = vec![0f32; dv];
    for i in 0..n {
        let (q, k, v) = (inp.q_at(d, i, kh), inp.k_at(d, i, kh), inp.v_at(d, i, j));
        let decay = inp.g[i * hv + j].exp();
        let beta = inp.beta[i * hv + j];
        // kv = Sᵀk: a read-only pass over S.
        kv.fill(0.0);
        for (ri, (r, &kr)) in s.chunks_exact(dv).zip(k).enumerate() {
            if i == 0 {
                // from memory on the first token: rows prefetched ahead as
                // the f32 scan does (dv bf16 are the bytes of dv / 2 f32)
                let at = s.as_ptr().wrapping_add(ri * dv) as *const f32;
                prefetch_rows_ahead(at, dv.div_ceil(2));
            }
            widen_row(r, &mut row);
            for (a, &x) in kv.iter_mut().zip(&row) {
                *a += kr * x;
            }
        }
        // δ = β(v − exp(g)·kv), kept in kv.
        for (a, &vv) in kv.iter_mut().zip(v) {
            *a = beta * (vv - decay * *a);
        }
        // SAFETY: token i, head j: lanes no other head writes.
        let o = unsafe { std::slice::from_raw_parts_mut(out.get().add((i * hv + j) * dv), dv) };
        o.fill(0.0);
        // S ← exp(g)·S + k δᵀ and o = Sᵀq, each row rounded as stored.
        for ((r, &kr), &qr) in s.chunks_exact_mut(dv).zip(k).zip(q) {
            widen_row(r, &mut row);
            for ((x, &dl), ov) in row.iter_mut().zip(kv.iter()).zip(o.iter_mut()) {
                *x = decay * *x + kr * dl;
                *ov += qr * *x;
            }
            round_row(&row, r);
        }
    }
    debug_assert_eq!(s.len(), dk * dv);
}

multiversion!(pub(crate) fn head_scan_bf16_mv(
    d: &GatedDeltaDims, j: usize, s: &mut [bf16], inp: &DeltaInputs, out: SendPtr<f32>, kv: &mut [f32], n: usize
) => head_scan_bf16);

#[cfg(test)]
mod tests {
    use crate::ops::delta::gated::tests::{random_inputs, Case};
    use crate::ops::delta::{
        gated_delta_scan, gated_delta_scan_batch, DeltaInputs, DeltaSeq, GatedDeltaDims, HeadOrder,
    };
    use crate::ops::state_elem::{round_bf16, widen_bf16};
    use crate::testutil::Rng;
    use crate::ThreadPool;
    use half::bf16;

    /// A bf16 state gives exactly the f32 recurrence with the state rounded
    /// to bf16 after every token, in one call or one token per call, alone
    /// or batched.
    #[test]
    fn bf16_is_the_f32_update_rounded_per_token() {
        let mut rng = Rng::new(41);
        let pool = ThreadPool::new(2);
        for &(hk, hv, dk, dv, n) in &[(2, 4, 8, 16, 5), (1, 3, 5, 7, 3), (2, 2, 32, 32, 1)] {
            let dims = GatedDeltaDims {
                n_k_head: hk,
                n_v_head: hv,
                d_k: dk,
                d_v: dv,
                order: HeadOrder::Tiled,
            };
            let Case {
                q,
                k,
                v,
                g,
                beta,
                s0,
            } = random_inputs(&mut rng, &dims, n);
            let s0: Vec<bf16> = s0.iter().map(|&x| round_bf16(x)).collect();
            let inp = DeltaInputs {
                q: &q,
                k: &k,
                ld_qk: hk * dk,
                v: &v,
                ld_v: hv * dv,
                g: &g,
                beta: &beta,
            };
            let one = |i: usize| DeltaInputs {
                q: &q[i * hk * dk..],
                k: &k[i * hk * dk..],
                v: &v[i * hv * dv..],
                g: &g[i * hv..(i + 1) * hv],
                beta: &beta[i * hv..(i + 1) * hv],
                ..inp
            };
            let mut sf: Vec<f32> = s0.iter().map(|&x| widen_bf16(x)).collect();
            let mut want_o = vec![0f32; n * hv * dv];
            for i in 0..n {
                let o = &mut want_o[i * hv * dv..(i + 1) * hv * dv];
                gated_delta_scan(&pool, dims, &mut sf, one(i), o, 1);
                sf.iter_mut().for_each(|x| *x = widen_bf16(round_bf16(*x)));
            }
            let want_s: Vec<bf16> = sf.iter().map(|&x| round_bf16(x)).collect();

            let mut s = s0.clone();
            let mut o = vec![0f32; n * hv * dv];
            gated_delta_scan(&pool, dims, &mut s, inp, &mut o, n);
            assert_eq!(s, want_s);
            assert_eq!(o, want_o);

            let mut s2 = s0.clone();
            let mut o2 = vec![0f32; n * hv * dv];
            let mut seqs = [DeltaSeq {
                state: &mut s2[..],
                from: None,
                inputs: inp,
                out: &mut o2,
                n_tokens: n,
            }];
            gated_delta_scan_batch(&pool, dims, &mut seqs);
            assert_eq!(s2, want_s);
            assert_eq!(o2, want_o);
        }
    }
}
