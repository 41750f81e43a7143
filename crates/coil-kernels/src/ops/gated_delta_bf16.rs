//! The gated delta rule (`gated_delta::head_scan`) over a value head's
//! state stored in bf16: per token, the head (`[d_k, d_v]`, 32 KiB at
//! 128 × 128) is widened into an f32 work copy that stays in cache, the
//! f32 step runs on it unchanged, and the result is rounded back to bf16
//! (nearest even) — once per token, so a token's result does not depend on
//! how many tokens share the call. Half the state bytes of the f32 kernel
//! go to and from memory.

use super::gated_delta::{head_scan, DeltaInputs, GatedDeltaDims};
use super::state_elem::{round_row, widen_row};
use crate::multiversion;
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
    let mut wide = crate::Scratch::dirty(s.len());
    let step = d.n_v_head * d.d_v;
    for i in 0..n {
        widen_row(s, &mut wide);
        let one = inp.skip_tokens(d, i);
        // SAFETY: token i's output rows lie within `out`'s n tokens.
        let o = SendPtr(unsafe { out.get().add(i * step) });
        head_scan(d, j, &mut wide, &one, o, kv, 1);
        round_row(&wide, s);
    }
}

multiversion!(pub(crate) fn head_scan_bf16_mv(
    d: &GatedDeltaDims, j: usize, s: &mut [bf16], inp: &DeltaInputs, out: SendPtr<f32>, kv: &mut [f32], n: usize
) => head_scan_bf16);

#[cfg(test)]
mod tests {
    use crate::ops::gated_delta::tests::{random_inputs, Case};
    use crate::ops::gated_delta::{
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
