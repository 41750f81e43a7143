//! LFM2's gated short convolution (Liquid AI 2025):
//!
//! `in_proj(x) → [B | C | x̃]` (d each); `y = C ⊙ conv(B ⊙ x̃)`, a causal
//! depthwise convolution over the last `L` tokens (`shortconv.l_cache`, 3 in
//! the released models) with neither bias nor activation; `out_proj(y)`.
//!
//! Its recurrent state is the last `L − 1` rows of `B ⊙ x̃` (`[L − 1, d]`),
//! kept in the recurrent memory's conv slot like a Mamba conv window (so
//! checkpoints, rollback, forks and sessions come with it); it has no SSM
//! state.

use super::common::{layer_state, recurrent_memory};
use crate::memory::{Memory, RecurrentLayerShape};
use crate::models::weights::{Loader, Matrix};
use crate::models::{ModelError, Rows};
use coil_gguf::GgufFile;
use coil_kernels::ops::conv::{conv1d_causal_pool, ConvAct, ConvWeights};
use coil_kernels::{matmul, Scratch, ThreadPool};

/// Hyper-parameters of a short-conv block.
#[derive(Clone, Copy, Debug)]
pub struct ShortConvParams {
    pub d_model: usize,
    /// The convolution window `L` (`{arch}.shortconv.l_cache`).
    pub l_cache: usize,
}

impl ShortConvParams {
    /// Reads `{arch}.shortconv.l_cache` (at least 2, as llama.cpp requires:
    /// a window of 1 would carry no state).
    pub fn from_gguf(ld: &Loader, d_model: usize) -> Result<Self, ModelError> {
        Ok(ShortConvParams {
            d_model,
            l_cache: ld.u_in("shortconv.l_cache", 2, 256)?,
        })
    }

    pub fn state_shape(&self) -> RecurrentLayerShape {
        RecurrentLayerShape {
            conv: (self.l_cache - 1) * self.d_model,
            ssm: 0,
        }
    }
}

pub struct ShortConv {
    pub p: ShortConvParams,
    /// `[3·d, d]`: rows B, then C, then x̃.
    pub in_proj: Matrix,
    /// `[d, L]` (ggml `{L, d}`), laid out for the kernel.
    pub conv_w: ConvWeights,
    /// `[d, d]`
    pub out_proj: Matrix,
}

impl ShortConv {
    /// Loads `blk.{layer}.shortconv.{in_proj,conv,out_proj}.weight`.
    pub fn load(ld: &Loader, layer: usize, p: ShortConvParams) -> Result<Self, ModelError> {
        let n = |t: &str| format!("blk.{layer}.shortconv.{t}.weight");
        let d = p.d_model;
        Ok(ShortConv {
            in_proj: ld.matrix(&n("in_proj"), 3 * d, d)?,
            conv_w: ConvWeights::new(&ld.vector(&n("conv"), &[p.l_cache, d])?, d, p.l_cache),
            out_proj: ld.matrix(&n("out_proj"), d, d)?,
            p,
        })
    }

    /// `h`: normed input `[n_tokens, d]` stacked over `chunks` (one
    /// sequence each); `out`: `[n_tokens, d]`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        layer: usize,
        chunks: &[Rows],
        mem: &mut Memory,
        h: &[f32],
        out: &mut [f32],
    ) -> Result<(), ModelError> {
        let d = self.p.d_model;
        let n = h.len() / d;
        let mem = recurrent_memory(mem, layer)?;
        // [n, 3d] = [B | C | x̃]
        let mut bcx = Scratch::dirty(n * 3 * d);
        matmul(pool, &self.in_proj.get(file), h, &mut bcx, n);
        // B ⊙ x̃, [n, d]: the convolution's input.
        let mut bx = Scratch::dirty(n * d);
        pool.rows_mut(&mut bx, d, 64, |r0, part| {
            for (i, o) in part.chunks_exact_mut(d).enumerate() {
                let row = &bcx[(r0 + i) * 3 * d..(r0 + i + 1) * 3 * d];
                for ((o, b), x) in o.iter_mut().zip(&row[..d]).zip(&row[2 * d..]) {
                    *o = b * x;
                }
            }
        });
        let mut y = Scratch::dirty(n * d);
        for Rows { seq, rows, .. } in chunks {
            let st = layer_state(mem, layer, *seq)?;
            conv1d_causal_pool(
                pool,
                &bx[rows.start * d..rows.end * d],
                d,
                st.conv,
                &self.conv_w,
                None,
                &mut y[rows.start * d..rows.end * d],
                ConvAct::Identity,
                None,
            );
        }
        // y ⊙= C
        pool.rows_mut(&mut y, d, 64, |r0, part| {
            for (i, o) in part.chunks_exact_mut(d).enumerate() {
                let c = &bcx[(r0 + i) * 3 * d + d..(r0 + i) * 3 * d + 2 * d];
                o.iter_mut().zip(c).for_each(|(o, c)| *o *= c);
            }
        });
        matmul(pool, &self.out_proj.get(file), &y, out, n);
        Ok(())
    }
}
