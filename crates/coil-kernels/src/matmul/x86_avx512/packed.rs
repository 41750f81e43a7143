//! Products of a matrix repacked into the rows-in-lanes layout
//! ([`crate::matmul::Layout::Lanes16`]): per token group the format's
//! rows-in-lanes tile over groups of 16 rows (`lanes.rs` for Q4_K and
//! Q5_K, `lanes_q6_k.rs`, `lanes_q8_0.rs`).

use super::lanes::{self, MAX_TOKENS};
use super::{lanes_q6_k, lanes_q8_0};
use crate::matmul::act::{ActPanel, QuantAct};

/// `y = x · wᵀ` for a repacked Q4_K, Q5_K, Q6_K or Q8_0 matrix ([`lanes::repack`],
/// [`lanes_q6_k::repack`], [`lanes_q8_0::repack`]), `n_tokens`
/// tokens through the rows-in-lanes kernels (from the plan's `gemm_from`
/// tokens on, outside batch-invariant mode, the caller takes the integer
/// GEMM instead, whose panels read straight from this layout).
///
/// # Safety
/// The CPU has the AVX-512 level (F, BW, VL, DQ, VNNI).
pub(in crate::matmul) unsafe fn matmul_packed(
    pool: &crate::pool::ThreadPool,
    w: &crate::matmul::weight::WeightRef,
    x: &[f32],
    y: &mut [f32],
    n_tokens: usize,
) {
    let (rows, cols) = (w.rows, w.cols);
    use coil_gguf::GgmlType;
    let ty = w.ty;
    let xa = match ty {
        GgmlType::Q8_0 => QuantAct::q8_0(x, cols),
        _ => QuantAct::q8_k(x, cols),
    };
    let panels: Vec<ActPanel> = (0..n_tokens)
        .step_by(MAX_TOKENS)
        .map(|t0| {
            let nt = MAX_TOKENS.min(n_tokens - t0);
            match ty {
                GgmlType::Q6_K => lanes_q6_k::panel(&xa, t0, nt),
                GgmlType::Q8_0 => lanes_q8_0::panel(&xa, t0, nt),
                _ => lanes::panel(&xa, t0, nt),
            }
        })
        .collect();
    let rb = w.row_bytes();
    let yp = crate::pool::SendPtr(y.as_mut_ptr());
    // Groups of 16 rows, in the decode path's guided chunks: long
    // contiguous ranges first. Work items of at most 8 groups (128 rows)
    // broke each thread's stream every 100-200 KB; kernel bench
    // `decode-*`, 2 threads, Intel model 167, weights streamed, weight
    // GB/s at 1 / 8 tokens: Q6_K 29.3-32.7 / 22.0-23.0 -> 30.1-34.5 /
    // 21.8-24.3, Q4_K 32.6-35.2 / 17.3-19.4 -> 34.8-37.8 / 18.2-20.0,
    // Q8_0 unchanged; `coil bench --parallel 1 / 8 -p 16 -n 64`, Q4_K_M:
    // qwen35-0.8b-like 47.4-48.0 / 196-197 -> 52.6-53.3 / 208-211 tok/s,
    // mamba2-370m-like 104.5-105.4 / 274 -> 109.4-111.4 / 281-285.
    let groups = rows / 16;
    crate::matmul::split::rows_for(pool, groups, |gr| {
        let (r0, r1) = (16 * gr.start, 16 * gr.end);
        for (pi, p) in panels.iter().enumerate() {
            let t0 = pi * MAX_TOKENS;
            // SAFETY: y[t0.., r0..r1] is written by this work item only.
            let mut outs: [&mut [f32]; MAX_TOKENS] = std::array::from_fn(|k| match k < p.nt {
                true => std::slice::from_raw_parts_mut(yp.get().add((t0 + k) * rows + r0), r1 - r0),
                false => &mut [],
            });
            let wr = &w.data[r0 * rb..r1 * rb];
            match ty {
                GgmlType::Q6_K => lanes_q6_k::tile_packed(wr, rb, p, &mut outs[..p.nt]),
                GgmlType::Q8_0 => lanes_q8_0::tile_packed(wr, rb, p, &mut outs[..p.nt]),
                GgmlType::Q5_K => lanes::tile_packed::<true>(wr, rb, p, &mut outs[..p.nt]),
                _ => lanes::tile_packed::<false>(wr, rb, p, &mut outs[..p.nt]),
            }
        }
    });
}
