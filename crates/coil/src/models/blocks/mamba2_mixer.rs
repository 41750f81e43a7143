//! The Mamba-2 mixer (Dao & Gu 2024), as in transformers' torch path:
//!
//! `in_proj(x) → [z (d_in) | xBC (d_in + 2GN) | dt (H)]`; causal depthwise
//! conv over xBC (window K, bias) then SiLU; split x `[H, P]`, B `[G, N]`,
//! C `[G, N]`; `dt = softplus(dt + dt_bias)` clamped to time_step_limit;
//! `S_h ← exp(dt_h·A_h)·S_h + dt_h·x_h ⊗ B_g`, `y_h = S_h·C_g + D_h·x_h`;
//! gated RMSNorm per group (`y·silu(z)` before the norm); `out_proj`.

use super::common::{layer_state_moving, recurrent_memory};
use crate::memory::{Memory, RecurrentLayerShape};
use crate::models::weights::{Loader, Matrix};
use crate::models::ModelError;
use crate::models::Rows;
use coil_gguf::GgufFile;
use coil_kernels::ops::act::{mul_silu_inplace, softplus1};
use coil_kernels::ops::conv::conv1d_causal_silu_pool;
use coil_kernels::ops::norm::group_rms_norm_gated;
use coil_kernels::ops::ssd::{mamba2_chunked_scan_rows, DEFAULT_CHUNK};
use coil_kernels::ops::ssm::{mamba2_scan_from, Mamba2Dims, ScanInputs};

/// From how many tokens of one sequence on the chunked SSD algorithm
/// replaces the token-by-token recurrence: `COIL_SSD_MIN_TOKENS` in the
/// environment, else the kernel's measured break-even for the SIMD level
/// ([`coil_kernels::ops::ssd::min_tokens`]: 8 with AVX-512 or AVX2, 32 for
/// the portable build). Both give the same result (tests run both). On a
/// mamba2-370m layer, one thread, from a non-zero state, SSD takes 0.61×
/// the recurrence's CPU time at 8 tokens, 0.44× at 16 and 0.29× at 512
/// (3.5 vs 12.0 ms) with AVX-512; 0.87×, 0.68× and 0.60× with AVX2.
pub fn ssd_min_tokens() -> usize {
    std::env::var("COIL_SSD_MIN_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(coil_kernels::ops::ssd::min_tokens)
}
use coil_kernels::{matmul, Scratch, ThreadPool};

/// Hyper-parameters of a Mamba-2 mixer, from `{arch}.ssm.*`.
#[derive(Clone, Copy, Debug)]
pub struct Mamba2Params {
    pub d_model: usize,
    /// d_in = H·P.
    pub d_inner: usize,
    pub n_head: usize,
    pub head_dim: usize,
    pub n_group: usize,
    pub d_state: usize,
    pub d_conv: usize,
    pub eps: f32,
    /// time_step_limit: dt is clamped to this range after softplus.
    pub dt_min: f32,
    pub dt_max: f32,
    /// See [`ssd_min_tokens`].
    pub ssd_min_tokens: usize,
}

impl Mamba2Params {
    pub fn from_gguf(ld: &Loader, d_model: usize, eps: f32) -> Result<Self, ModelError> {
        let d_inner = ld.u_in("ssm.inner_size", 1, 1 << 20)?;
        let n_head = ld.u_in("ssm.time_step_rank", 1, d_inner)?;
        let n_group = ld.u_in("ssm.group_count", 1, n_head)?;
        let d_state = ld.u_in("ssm.state_size", 1, 1 << 12)?;
        let d_conv = ld.u_in("ssm.conv_kernel", 1, 64)?;
        let key = |s: &str| format!("{}.{s}", ld.arch);
        if d_inner % n_head != 0 {
            return Err(ModelError::BadKey {
                key: key("ssm.time_step_rank"),
                reason: format!("{n_head} heads do not divide ssm.inner_size {d_inner}"),
            });
        }
        if n_head % n_group != 0 {
            return Err(ModelError::BadKey {
                key: key("ssm.group_count"),
                reason: format!("{n_group} groups do not divide the {n_head} heads"),
            });
        }
        // Optional (coil's converter writes it; llama.cpp never clamps).
        let dt_min = ld.f32_opt("ssm.time_step_min")?.unwrap_or(0.0);
        let dt_max = ld.f32_opt("ssm.time_step_max")?.unwrap_or(f32::INFINITY);
        Ok(Mamba2Params {
            d_model,
            d_inner,
            n_head,
            head_dim: d_inner / n_head,
            n_group,
            d_state,
            d_conv,
            eps,
            dt_min,
            dt_max,
            ssd_min_tokens: ssd_min_tokens(),
        })
    }

    /// Channels of the convolution: x, B and C.
    pub fn conv_channels(&self) -> usize {
        self.d_inner + 2 * self.n_group * self.d_state
    }

    /// Width of in_proj's output: z, xBC, dt.
    pub fn d_in_proj(&self) -> usize {
        self.d_inner + self.conv_channels() + self.n_head
    }

    pub fn state_shape(&self) -> RecurrentLayerShape {
        RecurrentLayerShape {
            conv: (self.d_conv - 1) * self.conv_channels(),
            ssm: self.n_head * self.head_dim * self.d_state,
        }
    }
}

pub struct Mamba2Mixer {
    pub p: Mamba2Params,
    pub in_proj: Matrix,
    /// `[channels, K]`
    pub conv_w: Vec<f32>,
    pub conv_b: Vec<f32>,
    pub dt_bias: Vec<f32>,
    /// −exp(A_log), `[H]`.
    pub a: Vec<f32>,
    pub d: Vec<f32>,
    /// Gated-norm weight `[d_inner]`, absent where the model has no norm.
    pub norm: Option<Vec<f32>>,
    pub out_proj: Matrix,
}

impl Mamba2Mixer {
    /// Loads `blk.{layer}.ssm_*`.
    pub fn load(ld: &Loader, layer: usize, p: Mamba2Params) -> Result<Self, ModelError> {
        let n = |t: &str| format!("blk.{layer}.{t}");
        let ch = p.conv_channels();
        let norm_name = n("ssm_norm.weight");
        let norm = if ld.has(&norm_name) {
            Some(ld.vector(&norm_name, &[p.d_inner / p.n_group, p.n_group])?)
        } else {
            None
        };
        Ok(Mamba2Mixer {
            in_proj: ld.matrix(&n("ssm_in.weight"), p.d_in_proj(), p.d_model)?,
            conv_w: ld.vector(&n("ssm_conv1d.weight"), &[p.d_conv, ch])?,
            conv_b: ld.vector(&n("ssm_conv1d.bias"), &[ch])?,
            dt_bias: ld.vector(&n("ssm_dt.bias"), &[p.n_head])?,
            a: ld.vector(&n("ssm_a"), &[1, p.n_head])?,
            d: ld.vector(&n("ssm_d"), &[1, p.n_head])?,
            norm,
            out_proj: ld.matrix(&n("ssm_out.weight"), p.d_model, p.d_inner)?,
            p,
        })
    }

    /// `h`: normed input `[n_tokens, d_model]` stacked over `chunks` (one
    /// sequence each); `out`: `[n_tokens, d_model]`.
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
        let dip = p.d_in_proj();
        let ch = p.conv_channels();
        let (di, hn, gn) = (p.d_inner, p.n_head, p.n_group * p.d_state);

        // [n_tokens, d_in_proj] = [z | xBC | dt]
        let mut zxbcdt = Scratch::dirty(n_tokens * dip);
        matmul(pool, &self.in_proj.get(file), h, &mut zxbcdt, n_tokens);

        let mut y = Scratch::dirty(n_tokens * di);
        for Rows { seq, rows, .. } in chunks {
            let t = rows.len();
            let (st, ssm_from) = layer_state_moving(mem, layer, *seq)?;
            let zx = &zxbcdt[rows.start * dip..rows.end * dip];
            let mut dt = Scratch::dirty(t * hn);
            for (i, v) in dt.chunks_exact_mut(hn).enumerate() {
                let raw = &zx[i * dip + di + ch..(i + 1) * dip];
                for ((v, r), b) in v.iter_mut().zip(raw).zip(&self.dt_bias) {
                    *v = softplus1(r + b).clamp(p.dt_min, p.dt_max);
                }
            }
            // xBC [t, ch] = silu(conv(xBC columns of in_proj's output, read
            // in place)); its rows are [x (H·P) | B (G·N) | C (G·N)].
            let mut xbc = Scratch::dirty(t * ch);
            conv1d_causal_silu_pool(
                pool,
                &zx[di..],
                dip,
                st.conv,
                &self.conv_w,
                Some(&self.conv_b),
                &mut xbc,
                ch,
                p.d_conv,
            );
            let dims = Mamba2Dims {
                n_head: hn,
                head_dim: p.head_dim,
                n_group: p.n_group,
                d_state: p.d_state,
            };
            let ys = &mut y[rows.start * di..rows.end * di];
            // x, B and C read in place from xBC's rows.
            let inputs = ScanInputs {
                x: &xbc,
                ldx: ch,
                b: &xbc[di..],
                c: &xbc[di + gn..],
                ldbc: ch,
            };
            // Batch-invariant micro-batches (speculative verification,
            // batched decode) take the recurrence at any length: each
            // token's output is then bit for bit that of decoding it alone.
            if t >= p.ssd_min_tokens && !coil_kernels::batch_invariant() {
                if let Some(f) = ssm_from {
                    st.ssm.copy_from_slice(f);
                }
                // Prompt: chunked SSD (matrix products within each chunk).
                mamba2_chunked_scan_rows(
                    pool,
                    dims,
                    DEFAULT_CHUNK,
                    st.ssm,
                    inputs,
                    &dt,
                    &self.a,
                    Some(&self.d),
                    ys,
                    t,
                );
            } else {
                // Decode: the single-step recurrence (moving the state to
                // this sequence's own buffer head by head if it was shared).
                // B and C (2·G·N per token) go to a buffer of their own:
                // read in place, right behind x in xBC's rows, they slowed
                // mamba2-370m decode by 7–8% (measured; a placement effect,
                // the loop itself is the same).
                let mut bc = Scratch::dirty(t * 2 * gn);
                for i in 0..t {
                    bc[i * 2 * gn..(i + 1) * 2 * gn]
                        .copy_from_slice(&xbc[i * ch + di..(i + 1) * ch]);
                }
                let inputs = ScanInputs {
                    b: &bc,
                    c: &bc[gn..],
                    ldbc: 2 * gn,
                    ..inputs
                };
                mamba2_scan_from(
                    pool,
                    dims,
                    ssm_from,
                    st.ssm,
                    inputs,
                    &dt,
                    &self.a,
                    Some(&self.d),
                    ys,
                    t,
                );
            }
        }
        // Gate and normalise: y·silu(z), RMSNorm per group; z read in place
        // from in_proj's output.
        let mut g = Scratch::dirty(n_tokens * di);
        pool.rows_mut(&mut g, di, 16, |r0, part| {
            for (i, gr) in part.chunks_exact_mut(di).enumerate() {
                let r = r0 + i;
                let (yr, zr) = (&y[r * di..(r + 1) * di], &zxbcdt[r * dip..r * dip + di]);
                match &self.norm {
                    Some(w) => group_rms_norm_gated(yr, Some(zr), w, p.n_group, p.eps, gr, di),
                    None => {
                        gr.copy_from_slice(yr);
                        mul_silu_inplace(gr, zr);
                    }
                }
            }
        });
        matmul(pool, &self.out_proj.get(file), &g, out, n_tokens);
        Ok(())
    }
}
