//! The Mamba-1 selective-SSM mixer (Gu & Dao 2023), as in transformers'
//! torch path:
//!
//! `in_proj → [x | z]`; causal depthwise conv + SiLU on x;
//! `x_proj(x) → [δ (R) | B (N) | C (N)]` (Jamba: RMSNorms with weights on δ,
//! B, C; Falcon-Mamba: without); `dt = softplus(dt_proj(δ))` (d_in wide);
//! `h ← exp(dt⊙A)⊙h + (dt·x)⊗B`, `y = h·C + D·x`; `y·silu(z)`; `out_proj`.

use super::common::{layer_state, recurrent_memory};
use crate::memory::{Memory, RecurrentLayerShape};
use crate::models::weights::{Loader, Matrix};
use crate::models::ModelError;
use crate::models::Rows;
use coil_gguf::GgufFile;
use coil_kernels::ops::act::{mul_silu_inplace, softplus_inplace};
use coil_kernels::ops::conv::{conv1d_causal_pool, ConvAct, ConvWeights};
use coil_kernels::ops::norm::rms_norm_inplace;
use coil_kernels::ops::ssm::mamba1_scan_state;
use coil_kernels::{matmul, Scratch, ThreadPool};

#[derive(Clone, Copy, Debug)]
pub struct Mamba1Params {
    pub d_model: usize,
    pub d_inner: usize,
    pub d_state: usize,
    pub d_conv: usize,
    /// R, the rank of δ.
    pub dt_rank: usize,
    pub eps: f32,
    /// Weightless RMSNorms on δ, B, C (Falcon-Mamba).
    pub dt_b_c_rms: bool,
}

impl Mamba1Params {
    pub fn from_gguf(ld: &Loader, d_model: usize, eps: f32) -> Result<Self, ModelError> {
        Ok(Mamba1Params {
            d_model,
            d_inner: ld.u_in("ssm.inner_size", 1, 1 << 20)?,
            d_state: ld.u_in("ssm.state_size", 1, 1 << 12)?,
            d_conv: ld.u_in("ssm.conv_kernel", 1, 64)?,
            dt_rank: ld.u_in("ssm.time_step_rank", 1, 1 << 16)?,
            eps,
            dt_b_c_rms: ld.bool_opt("ssm.dt_b_c_rms").unwrap_or(false),
        })
    }

    pub fn state_shape(&self) -> RecurrentLayerShape {
        RecurrentLayerShape {
            conv: (self.d_conv - 1) * self.d_inner,
            ssm: self.d_inner * self.d_state,
        }
    }
}

/// Optional RMSNorm weights on δ, B and C (Jamba).
pub struct DtBcNorms {
    pub dt: Vec<f32>,
    pub b: Vec<f32>,
    pub c: Vec<f32>,
}

pub struct Mamba1Mixer {
    pub p: Mamba1Params,
    pub in_proj: Matrix,
    /// `[d_inner, K]`, laid out for the kernel.
    pub conv_w: ConvWeights,
    pub conv_b: Vec<f32>,
    pub x_proj: Matrix,
    pub dt_proj: Matrix,
    pub dt_proj_b: Vec<f32>,
    /// −exp(A_log), `[d_inner, N]`.
    pub a: Vec<f32>,
    pub d: Vec<f32>,
    pub norms: Option<DtBcNorms>,
    pub out_proj: Matrix,
}

impl Mamba1Mixer {
    pub fn load(ld: &Loader, layer: usize, p: Mamba1Params) -> Result<Self, ModelError> {
        let n = |t: &str| format!("blk.{layer}.{t}");
        let (di, ns, r) = (p.d_inner, p.d_state, p.dt_rank);
        let norms = if ld.has(&n("ssm_dt_norm.weight")) {
            Some(DtBcNorms {
                dt: ld.vector(&n("ssm_dt_norm.weight"), &[r])?,
                b: ld.vector(&n("ssm_b_norm.weight"), &[ns])?,
                c: ld.vector(&n("ssm_c_norm.weight"), &[ns])?,
            })
        } else {
            None
        };
        Ok(Mamba1Mixer {
            in_proj: ld.matrix(&n("ssm_in.weight"), 2 * di, p.d_model)?,
            conv_w: ConvWeights::new(
                &ld.vector(&n("ssm_conv1d.weight"), &[p.d_conv, di])?,
                di,
                p.d_conv,
            ),
            conv_b: ld.vector(&n("ssm_conv1d.bias"), &[di])?,
            x_proj: ld.matrix(&n("ssm_x.weight"), r + 2 * ns, di)?,
            dt_proj: ld.matrix(&n("ssm_dt.weight"), di, r)?,
            dt_proj_b: ld.vector(&n("ssm_dt.bias"), &[di])?,
            a: ld.vector(&n("ssm_a"), &[ns, di])?,
            d: ld.vector(&n("ssm_d"), &[di])?,
            norms,
            out_proj: ld.matrix(&n("ssm_out.weight"), p.d_model, di)?,
            p,
        })
    }

    /// `h`: normed input `[n_tokens, d_model]` stacked over `chunks`;
    /// `out`: `[n_tokens, d_model]`.
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
        let p = &self.p;
        let mem = recurrent_memory(mem, layer)?;
        let n_tokens = h.len() / p.d_model;
        let (di, ns, r) = (p.d_inner, p.d_state, p.dt_rank);

        // [n_tokens, 2·d_inner] = [x | z]
        let mut xz = Scratch::dirty(n_tokens * 2 * di);
        matmul(pool, &self.in_proj.get(file), h, &mut xz, n_tokens);
        // x = silu(conv(x columns of xz, read in place)) per sequence, with
        // its carried window.
        let mut x = Scratch::dirty(n_tokens * di);
        for Rows { seq, rows, .. } in chunks {
            let st = layer_state(mem, layer, *seq)?;
            conv1d_causal_pool(
                pool,
                &xz[rows.start * 2 * di..rows.end * 2 * di],
                2 * di,
                st.conv,
                &self.conv_w,
                Some(&self.conv_b),
                &mut x[rows.start * di..rows.end * di],
                ConvAct::Silu,
                None,
            );
        }

        // [n_tokens, R + 2N] = [δ | B | C]
        let w = r + 2 * ns;
        let mut dbc = Scratch::dirty(n_tokens * w);
        matmul(pool, &self.x_proj.get(file), &x, &mut dbc, n_tokens);
        let mut delta = Scratch::dirty(n_tokens * r);
        let mut b = Scratch::dirty(n_tokens * ns);
        let mut c = Scratch::dirty(n_tokens * ns);
        for t in 0..n_tokens {
            let row = &dbc[t * w..(t + 1) * w];
            delta[t * r..(t + 1) * r].copy_from_slice(&row[..r]);
            b[t * ns..(t + 1) * ns].copy_from_slice(&row[r..r + ns]);
            c[t * ns..(t + 1) * ns].copy_from_slice(&row[r + ns..]);
        }
        if let Some(nw) = &self.norms {
            rms_norm_inplace(&mut delta, Some(&nw.dt), p.eps, r);
            rms_norm_inplace(&mut b, Some(&nw.b), p.eps, ns);
            rms_norm_inplace(&mut c, Some(&nw.c), p.eps, ns);
        } else if p.dt_b_c_rms {
            rms_norm_inplace(&mut delta, None, p.eps, r);
            rms_norm_inplace(&mut b, None, p.eps, ns);
            rms_norm_inplace(&mut c, None, p.eps, ns);
        }
        // dt = softplus(dt_proj(δ) + bias): [n_tokens, d_inner]
        let mut dt = Scratch::dirty(n_tokens * di);
        matmul(pool, &self.dt_proj.get(file), &delta, &mut dt, n_tokens);
        pool.rows_mut(&mut dt, di, 16, |_, part| {
            for row in part.chunks_exact_mut(di) {
                row.iter_mut()
                    .zip(&self.dt_proj_b)
                    .for_each(|(v, b)| *v += b);
                softplus_inplace(row);
            }
        });

        let mut y = Scratch::dirty(n_tokens * di);
        for Rows { seq, rows, .. } in chunks {
            let st = layer_state(mem, layer, *seq)?;
            let (sd, sn) = (
                rows.start * di..rows.end * di,
                rows.start * ns..rows.end * ns,
            );
            mamba1_scan_state(
                pool,
                di,
                ns,
                st.ssm,
                &x[sd.clone()],
                &dt[sd.clone()],
                &self.a,
                &b[sn.clone()],
                &c[sn],
                Some(&self.d),
                &mut y[sd],
                rows.len(),
            );
        }
        // Gate: y·silu(z), z read in place from xz.
        pool.rows_mut(&mut y, di, 16, |t0, part| {
            for (i, yr) in part.chunks_exact_mut(di).enumerate() {
                let t = t0 + i;
                mul_silu_inplace(yr, &xz[t * 2 * di + di..(t + 1) * 2 * di]);
            }
        });
        matmul(pool, &self.out_proj.get(file), &y, out, n_tokens);
        Ok(())
    }
}
