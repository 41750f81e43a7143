//! One decode token of the gated delta rule on one value head while the
//! head's state moves to a new buffer (a server keeps the old one as the
//! checkpoint of the position before): the first pass reads the old state,
//! the second writes the new one with non-temporal stores. Copying the
//! head over first and updating it in place made the new buffer's lines
//! come from memory before being overwritten (read-for-ownership): three
//! passes of memory traffic over the state per token instead of two (see
//! `ssm/moving.rs`, the same for Mamba-2).
//!
//! Same arithmetic, in the same order, as `gated.rs`'s `head_scan` for one
//! token (every operation is per element; none is fused), so the result is
//! bit for bit the copy-then-update one.

use super::dims::{DeltaInputs, GatedDeltaDims};

/// Head `j`'s state `src` (`[d_k, d_v]`) after token 0 of `inp`, streamed
/// into `dst`; its output row into `out` (`[Hv, d_v]`); `kv`: `d_v` values
/// of scratch. Call `state_rows::fence` before another thread reads `dst`.
///
/// # Safety
/// Requires `state_rows::can_stream(dst, d.d_v)`; `src` and `dst` hold `d_k · d_v`
/// values; `out` holds `Hv · d_v` values of which this call alone writes
/// row `j`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn move_step(
    d: &GatedDeltaDims,
    j: usize,
    src: &[f32],
    dst: &mut [f32],
    inp: &DeltaInputs,
    out: *mut f32,
    kv: &mut [f32],
) {
    use std::arch::x86_64::*;
    let (dk, dv) = (d.d_k, d.d_v);
    assert!(src.len() == dk * dv && dst.len() == dk * dv && kv.len() == dv);
    let kh = d.key_head(j);
    let (q, k, v) = (inp.q_at(d, 0, kh), inp.k_at(d, 0, kh), inp.v_at(d, 0, j));
    let decay = inp.g[j].exp();
    let beta = inp.beta[j];
    // kv = Sᵀk over the old state (its first touch: rows prefetched ahead).
    kv.fill(0.0);
    for (ri, (r, &kr)) in src.chunks_exact(dv).zip(k).enumerate() {
        crate::ops::state_rows::prefetch_rows_ahead(src.as_ptr().wrapping_add(ri * dv), dv);
        for (a, &x) in kv.iter_mut().zip(r) {
            *a += kr * x;
        }
    }
    // δ = β(v − exp(g)·kv), kept in kv.
    for (a, &vv) in kv.iter_mut().zip(v) {
        *a = beta * (vv - decay * *a);
    }
    let o = std::slice::from_raw_parts_mut(out.add(j * dv), dv);
    o.fill(0.0);
    // S' = exp(g)·S + k δᵀ streamed to dst, o = S'ᵀq.
    let vdecay = _mm256_set1_ps(decay);
    let (s, t, dl, op) = (src.as_ptr(), dst.as_mut_ptr(), kv.as_ptr(), o.as_mut_ptr());
    for r in 0..dk {
        let (vk, vq) = (_mm256_set1_ps(k[r]), _mm256_set1_ps(q[r]));
        for c in (0..dv).step_by(8) {
            let x = _mm256_loadu_ps(s.add(r * dv + c));
            let nx = _mm256_add_ps(
                _mm256_mul_ps(vdecay, x),
                _mm256_mul_ps(vk, _mm256_loadu_ps(dl.add(c))),
            );
            _mm_stream_ps(t.add(r * dv + c), _mm256_castps256_ps128(nx));
            _mm_stream_ps(t.add(r * dv + c + 4), _mm256_extractf128_ps(nx, 1));
            let ov = _mm256_add_ps(_mm256_loadu_ps(op.add(c)), _mm256_mul_ps(vq, nx));
            _mm256_storeu_ps(op.add(c), ov);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
pub(crate) unsafe fn move_step(
    _d: &GatedDeltaDims,
    _j: usize,
    _src: &[f32],
    _dst: &mut [f32],
    _inp: &DeltaInputs,
    _out: *mut f32,
    _kv: &mut [f32],
) {
    unreachable!("can_stream() is false off x86-64")
}
