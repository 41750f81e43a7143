//! The Gated DeltaNet mixer (Yang, Kautz & Hatamizadeh 2024) of Qwen3.5 and
//! Qwen3-Next, as in transformers' torch path:
//!
//! * projections: `[q | k | v]` (`attn_qkv`: Hk·d_k, Hk·d_k, Hv·d_v), the
//!   output gate z (`attn_gate`: Hv·d_v), and per value head b, a
//!   (`ssm_beta` / `ssm_alpha`, or llama.cpp's fused `ssm_ba`; old
//!   qwen3next files fuse q, k, v, z in `ssm_in` instead);
//! * causal depthwise conv over `[q | k | v]` (window K, no bias), SiLU;
//! * q, k L2-normalised per key head, q scaled by 1/√d_k;
//! * `β = sigmoid(b)`, `g = −exp(A_log)·softplus(a + dt_bias)` (`ssm_a`
//!   holds −exp(A_log));
//! * the gated delta rule per value head (state `[d_k, d_v]`, see
//!   `coil_kernels::ops::delta`);
//! * `RMSNorm(o)·w ⊙ silu(z)` per value head (`sigmoid(z)` in Qwen4-Exp),
//!   then `ssm_out`.

use super::common::{
    layer_state, layer_states_moving, recurrent_memory, refold_conv_window, split_rows, typed_state,
};
use crate::memory::{Memory, RecurrentLayerShape, StateMut, StateRef, StateType};
use crate::models::weights::{Loader, Matrix};
use crate::models::{ModelError, Rows};
use coil_gguf::GgufFile;
use coil_kernels::ops::act::{mul_sigmoid_inplace, mul_silu_inplace, softplus1};
use coil_kernels::ops::conv::{
    conv1d_causal_batch, conv1d_causal_pool, ConvAct, ConvSeq, ConvWeights,
};
use coil_kernels::ops::delta::chunk::{delta_chunked, DEFAULT_CHUNK};
use coil_kernels::ops::delta::{
    gated_delta_scan_batch, gated_delta_scan_state, l2_normalize, DeltaInputs, DeltaSeq,
    DeltaState, GatedDeltaDims, HeadOrder,
};
use coil_kernels::ops::norm::rms_norm_inplace;
use coil_kernels::{matmul, matmul_shared, Scratch, ThreadPool, WeightRef};
use half::bf16;

/// The L2 norm's epsilon (transformers' and fla's `l2norm`).
const L2_EPS: f32 = 1e-6;

/// From how many tokens of one sequence the chunked gated delta rule
/// replaces the token-by-token recurrence: `COIL_GDN_MIN_TOKENS` in the
/// environment, else 8. Both give the same result (tests run both). On a
/// Qwen3.5-0.8B DeltaNet layer (16 heads of 128), 2 threads, chunks of 16,
/// chunked ÷ recurrence time measured 1.26–1.38 at 1 token, 0.94–1.00 at
/// 4, 0.61–0.70 at 8, 0.46–0.59 at 16 (AVX-512 and AVX2; `coil-kernels`
/// example `gated_delta_bench`).
pub fn chunk_min_tokens() -> usize {
    std::env::var("COIL_GDN_MIN_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

/// Tokens per chunk of the chunked form: `COIL_GDN_CHUNK`, else
/// [`DEFAULT_CHUNK`] (tests use small chunks to cross chunk boundaries).
pub fn chunk_len() -> usize {
    std::env::var("COIL_GDN_CHUNK")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&c| c > 0)
        .unwrap_or(DEFAULT_CHUNK)
}

/// Hyper-parameters, from `{arch}.ssm.*` as llama.cpp's converter writes
/// them: `group_count` = Hk, `time_step_rank` = Hv, `state_size` = d_k,
/// `inner_size` = Hv·d_v, `conv_kernel` = K.
#[derive(Clone, Copy, Debug)]
pub struct GatedDeltaParams {
    pub d_model: usize,
    pub dims: GatedDeltaDims,
    pub d_conv: usize,
    /// The gated norm's epsilon.
    pub eps: f32,
    /// See [`chunk_min_tokens`] and [`chunk_len`].
    pub chunk_min_tokens: usize,
    pub chunk: usize,
    /// The output gate is `sigmoid(z)` (Qwen4-Exp) instead of `silu(z)`.
    pub sigmoid_gate: bool,
}

impl GatedDeltaParams {
    pub fn from_gguf(
        ld: &Loader,
        d_model: usize,
        eps: f32,
        order: HeadOrder,
    ) -> Result<Self, ModelError> {
        let n_k_head = ld.u_in("ssm.group_count", 1, 4096)?;
        let n_v_head = ld.u_in("ssm.time_step_rank", 1, 4096)?;
        let d_k = ld.u_in("ssm.state_size", 1, 4096)?;
        let inner = ld.u_in("ssm.inner_size", 1, 1 << 20)?;
        let d_conv = ld.u_in("ssm.conv_kernel", 1, 64)?;
        let key = |s: &str| format!("{}.{s}", ld.arch);
        if !n_v_head.is_multiple_of(n_k_head) {
            return Err(ModelError::BadKey {
                key: key("ssm.time_step_rank"),
                reason: format!(
                    "{n_v_head} value heads are not a multiple of the {n_k_head} key heads (ssm.group_count)"
                ),
            });
        }
        if !inner.is_multiple_of(n_v_head) {
            return Err(ModelError::BadKey {
                key: key("ssm.inner_size"),
                reason: format!("{inner} is not a multiple of the {n_v_head} value heads"),
            });
        }
        Ok(GatedDeltaParams {
            d_model,
            dims: GatedDeltaDims {
                n_k_head,
                n_v_head,
                d_k,
                d_v: inner / n_v_head,
                order,
            },
            d_conv,
            eps,
            chunk_min_tokens: chunk_min_tokens(),
            chunk: chunk_len(),
            sigmoid_gate: false,
        })
    }

    /// Width of q and of k: Hk·d_k.
    pub fn key_dim(&self) -> usize {
        self.dims.n_k_head * self.dims.d_k
    }

    /// Width of v and of z: Hv·d_v.
    pub fn value_dim(&self) -> usize {
        self.dims.n_v_head * self.dims.d_v
    }

    /// Channels of the convolution: q, k, v.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    pub fn state_shape(&self) -> RecurrentLayerShape {
        RecurrentLayerShape {
            conv: (self.d_conv - 1) * self.conv_channels(),
            ssm: self.dims.state_len(),
        }
    }
}

/// How q, k, v and z come out of the input.
pub enum QkvzProj {
    /// `attn_qkv` → `[q | k | v]`, `attn_gate` → z.
    Split { qkv: Matrix, gate: Matrix },
    /// Old qwen3next files: `ssm_in`, per key head `[q | k | v (r heads) |
    /// z (r heads)]` (r = Hv/Hk).
    Fused(Matrix),
}

/// How b and a come out of the input.
pub enum BaProj {
    /// `ssm_beta`, `ssm_alpha`: `[Hv]` each.
    Split { beta: Matrix, alpha: Matrix },
    /// `ssm_ba`: per key head `[b (r) | a (r)]`.
    Fused(Matrix),
}

pub struct GatedDeltaMixer {
    pub p: GatedDeltaParams,
    pub qkvz: QkvzProj,
    pub ba: BaProj,
    /// `[channels, K]`, laid out for the kernels.
    pub conv_w: ConvWeights,
    pub dt_bias: Vec<f32>,
    /// −exp(A_log), `[Hv]`.
    pub a: Vec<f32>,
    /// The gated norm's weight `[d_v]`, shared by the value heads.
    pub norm: Vec<f32>,
    pub out_proj: Matrix,
}

impl GatedDeltaMixer {
    pub fn load(ld: &Loader, layer: usize, p: GatedDeltaParams) -> Result<Self, ModelError> {
        let n = |t: &str| format!("blk.{layer}.{t}");
        let (kd, vd, hv, dm) = (p.key_dim(), p.value_dim(), p.dims.n_v_head, p.d_model);
        let qkvz = if ld.has(&n("attn_qkv.weight")) {
            QkvzProj::Split {
                qkv: ld.matrix(&n("attn_qkv.weight"), 2 * kd + vd, dm)?,
                gate: ld.matrix(&n("attn_gate.weight"), vd, dm)?,
            }
        } else if ld.has(&n("ssm_in.weight")) {
            QkvzProj::Fused(ld.matrix(&n("ssm_in.weight"), 2 * kd + 2 * vd, dm)?)
        } else {
            return Err(ModelError::MissingTensor(n("attn_qkv.weight")));
        };
        let ba = if ld.has(&n("ssm_ba.weight")) {
            BaProj::Fused(ld.matrix(&n("ssm_ba.weight"), 2 * hv, dm)?)
        } else {
            BaProj::Split {
                beta: ld.matrix(&n("ssm_beta.weight"), hv, dm)?,
                alpha: ld.matrix(&n("ssm_alpha.weight"), hv, dm)?,
            }
        };
        let conv_w = ld.vector(&n("ssm_conv1d.weight"), &[p.d_conv, p.conv_channels()])?;
        Ok(GatedDeltaMixer {
            qkvz,
            ba,
            conv_w: ConvWeights::new(&conv_w, p.conv_channels(), p.d_conv),
            dt_bias: ld.vector(&n("ssm_dt.bias"), &[hv])?,
            a: ld.vector(&n("ssm_a"), &[hv])?,
            norm: ld.vector(&n("ssm_norm.weight"), &[p.dims.d_v])?,
            out_proj: ld.matrix(&n("ssm_out.weight"), dm, vd)?,
            p,
        })
    }

    /// The input projections: `qkv` `[n, 2·Hk·d_k + Hv·d_v]`, `z`
    /// `[n, Hv·d_v]`, and the raw b, a into `beta`, `g` (`[n, Hv]` each),
    /// every matrix in one [`matmul_shared`] call (the activations quantized
    /// once where the matrices' products share it); the fused layouts of
    /// older files are unpacked afterwards.
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        h: &[f32],
        qkv: &mut [f32],
        z: &mut [f32],
        beta: &mut [f32],
        g: &mut [f32],
        n: usize,
    ) {
        let (hk, hv, dk) = (self.p.dims.n_k_head, self.p.dims.n_v_head, self.p.dims.d_k);
        let rv = self.p.value_dim() / hk; // v (and z) lanes per key head
        let per = 2 * dk + 2 * rv;
        let mut qkvz_all = match self.qkvz {
            QkvzProj::Fused(_) => Scratch::dirty(n * hk * per),
            QkvzProj::Split { .. } => Scratch::dirty(0),
        };
        let mut ba_all = match self.ba {
            BaProj::Fused(_) => Scratch::dirty(n * 2 * hv),
            BaProj::Split { .. } => Scratch::dirty(0),
        };
        {
            let mut ws = Vec::with_capacity(4);
            let mut ys: Vec<&mut [f32]> = Vec::with_capacity(4);
            match &self.qkvz {
                QkvzProj::Split { qkv: wq, gate } => {
                    ws.extend([wq.get(file), gate.get(file)]);
                    ys.extend([&mut *qkv, &mut *z]);
                }
                QkvzProj::Fused(w) => {
                    ws.push(w.get(file));
                    ys.push(&mut qkvz_all);
                }
            }
            match &self.ba {
                BaProj::Split { beta: wb, alpha } => {
                    ws.extend([wb.get(file), alpha.get(file)]);
                    ys.extend([&mut *beta, &mut *g]);
                }
                BaProj::Fused(w) => {
                    ws.push(w.get(file));
                    ys.push(&mut ba_all);
                }
            }
            let wr: Vec<&WeightRef> = ws.iter().collect();
            matmul_shared(pool, &wr, h, &mut ys, n);
        }
        if let QkvzProj::Fused(_) = self.qkvz {
            // per key head [q | k | v (r heads) | z (r heads)]
            let (kd, vd) = (self.p.key_dim(), self.p.value_dim());
            let ch = 2 * kd + vd;
            for (i, row) in qkvz_all.chunks_exact(hk * per).enumerate() {
                let (qr, zr) = (&mut qkv[i * ch..(i + 1) * ch], &mut z[i * vd..(i + 1) * vd]);
                for (g, src) in row.chunks_exact(per).enumerate() {
                    qr[g * dk..(g + 1) * dk].copy_from_slice(&src[..dk]);
                    qr[kd + g * dk..kd + (g + 1) * dk].copy_from_slice(&src[dk..2 * dk]);
                    qr[2 * kd + g * rv..2 * kd + (g + 1) * rv]
                        .copy_from_slice(&src[2 * dk..2 * dk + rv]);
                    zr[g * rv..(g + 1) * rv].copy_from_slice(&src[2 * dk + rv..]);
                }
            }
        }
        if let BaProj::Fused(_) = self.ba {
            // per key head [b (r) | a (r)]
            let r = hv / hk;
            for (i, row) in ba_all.chunks_exact(2 * hv).enumerate() {
                for (kh, src) in row.chunks_exact(2 * r).enumerate() {
                    beta[i * hv + kh * r..i * hv + (kh + 1) * r].copy_from_slice(&src[..r]);
                    g[i * hv + kh * r..i * hv + (kh + 1) * r].copy_from_slice(&src[r..]);
                }
            }
        }
    }

    /// β = sigmoid(b) and g = −exp(A_log)·softplus(a + dt_bias) in place,
    /// `[n, Hv]` each.
    fn gates(&self, beta: &mut [f32], g: &mut [f32]) {
        let hv = self.p.dims.n_v_head;
        for b in beta.iter_mut() {
            *b = 1.0 / (1.0 + (-*b).exp());
        }
        for row in g.chunks_exact_mut(hv) {
            for ((x, a), bias) in row.iter_mut().zip(&self.a).zip(&self.dt_bias) {
                *x = a * softplus1(*x + bias);
            }
        }
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
        let dims = p.dims;
        let mem = recurrent_memory(mem, layer)?;
        let n = h.len() / p.d_model;
        let (kd, vd, ch, hv) = (p.key_dim(), p.value_dim(), p.conv_channels(), dims.n_v_head);

        let mut qkv = Scratch::dirty(n * ch);
        let mut z = Scratch::dirty(n * vd);
        let mut beta = Scratch::dirty(n * hv);
        let mut g = Scratch::dirty(n * hv);
        self.project(file, pool, h, &mut qkv, &mut z, &mut beta, &mut g, n);
        self.gates(&mut beta, &mut g);

        // [n, ch] = silu(conv([q | k | v])), then q, k L2-normalised.
        let mut x = Scratch::dirty(n * ch);
        let mut o = Scratch::dirty(n * vd);
        let q_scale = 1.0 / (dims.d_k as f32).sqrt();
        // Batch-invariant micro-batches take the recurrence at any length
        // (bit for bit the one-token result; see `coil_kernels::numerics`).
        let invariant = coil_kernels::batch_invariant();
        // `CheapInvariant` micro-batches (`coil serve`'s prompts) take the
        // chunked form at every length: a prompt's chunks then start at the
        // same positions of its sequence however it was cut into calls
        // (aligned ones: `Engine::scan_chunk`), so its logits and state are
        // the same bits.
        let always = coil_kernels::invariance() == coil_kernels::Invariance::Cheap;
        let (prompts, steps): (Vec<&Rows>, Vec<&Rows>) = chunks
            .iter()
            .partition(|c| (always || c.rows.len() >= p.chunk_min_tokens) && !invariant);
        // Prompts, one sequence at a time: the chunked form.
        for Rows { seq, rows, .. } in prompts {
            let t = rows.len();
            let mut st = layer_state(mem, layer, *seq)?;
            let xs = &mut x[rows.start * ch..rows.end * ch];
            // (q and k normalised right after their rows of the convolution,
            // while those are in cache)
            let l2 = |part: &mut [f32]| {
                for row in part.chunks_exact_mut(ch) {
                    l2_normalize(&mut row[..kd], dims.d_k, L2_EPS, q_scale);
                    l2_normalize(&mut row[kd..2 * kd], dims.d_k, L2_EPS, 1.0);
                }
            };
            conv1d_causal_pool(
                pool,
                &qkv[rows.start * ch..rows.end * ch],
                ch,
                st.conv,
                &self.conv_w,
                None,
                xs,
                ConvAct::Silu,
                Some(&l2),
            );
            let inputs = DeltaInputs {
                q: xs,
                k: &xs[kd..],
                ld_qk: ch,
                v: &xs[2 * kd..],
                ld_v: ch,
                g: &g[rows.start * hv..rows.end * hv],
                beta: &beta[rows.start * hv..rows.end * hv],
            };
            let os = &mut o[rows.start * vd..rows.end * vd];
            // In f32 (a bf16 state is widened, and rounded once at the end).
            st.ssm.with_f32(None, |s| {
                delta_chunked(pool, dims, p.chunk, s, inputs, os, t)
            });
        }
        // Decode steps: every sequence's convolution in one call, then the
        // recurrence over all (sequence, value head) pairs in one call.
        if !steps.is_empty() {
            let seqs: Vec<usize> = steps.iter().map(|c| c.seq).collect();
            let ty = mem.state_type();
            // A state moving off a checkpoint is copied head by head in
            // the scan (`DeltaSeq::from`), not here.
            let mut states = layer_states_moving(mem, layer, &seqs)?;
            let mut xs_parts = split_rows(&mut x, ch, &steps);
            let mut conv: Vec<ConvSeq> = states
                .iter_mut()
                .zip(xs_parts.iter_mut())
                .zip(&steps)
                .map(|(((st, _), out), c)| ConvSeq {
                    x: &qkv[c.rows.start * ch..c.rows.end * ch],
                    state: &mut *st.conv,
                    out,
                })
                .collect();
            conv1d_causal_batch(pool, &mut conv, ch, &self.conv_w, None, ConvAct::Silu);
            drop(conv);
            for xs in xs_parts.iter_mut() {
                for row in xs.chunks_exact_mut(ch) {
                    l2_normalize(&mut row[..kd], dims.d_k, L2_EPS, q_scale);
                    l2_normalize(&mut row[kd..2 * kd], dims.d_k, L2_EPS, 1.0);
                }
            }
            let os = split_rows(&mut o, vd, &steps);
            let inputs: Vec<DeltaInputs> = xs_parts
                .iter()
                .zip(&steps)
                .map(|(xs, c)| DeltaInputs {
                    q: xs,
                    k: &xs[kd..],
                    ld_qk: ch,
                    v: &xs[2 * kd..],
                    ld_v: ch,
                    g: &g[c.rows.start * hv..c.rows.end * hv],
                    beta: &beta[c.rows.start * hv..c.rows.end * hv],
                })
                .collect();
            let ssm: Vec<(StateMut, Option<StateRef>)> =
                states.into_iter().map(|(st, f)| (st.ssm, f)).collect();
            match ty {
                StateType::F32 => scan_steps::<f32>(pool, dims, ssm, inputs, os)?,
                StateType::Bf16 => scan_steps::<bf16>(pool, dims, ssm, inputs, os)?,
            }
        }
        // A verification's tape (see `refold`), per token: [q | k | v]
        // before and after the convolution (normalised), g and β.
        for Rows { seq, rows, .. } in chunks {
            if let Some(tape) = mem.tape(layer, *seq) {
                for r in rows.clone() {
                    tape.extend_from_slice(&qkv[r * ch..(r + 1) * ch]);
                    tape.extend_from_slice(&x[r * ch..(r + 1) * ch]);
                    tape.extend_from_slice(&g[r * hv..(r + 1) * hv]);
                    tape.extend_from_slice(&beta[r * hv..(r + 1) * hv]);
                }
            }
        }
        // RMSNorm(o)·w per value head, times silu(z) (or sigmoid(z)).
        pool.rows_mut(&mut o, vd, 16, |r0, part| {
            rms_norm_inplace(part, Some(&self.norm), p.eps, dims.d_v);
            let z = &z[r0 * vd..r0 * vd + part.len()];
            match p.sigmoid_gate {
                true => mul_sigmoid_inplace(part, z),
                false => mul_silu_inplace(part, z),
            }
        });
        matmul(pool, &self.out_proj.get(file), &o, out, n);
        Ok(())
    }

    /// After a verification of `seq` kept only its first `n` tokens: this
    /// layer's state after them, from the state before the verification and
    /// the tape its forward pass wrote — the conv window from the raw
    /// inputs, the delta-rule state by the same token-by-token recurrence
    /// over the same inputs (bit for bit the state plain decoding reaches).
    /// See `Mamba2Mixer::refold`.
    pub fn refold(
        &self,
        pool: &ThreadPool,
        layer: usize,
        seq: usize,
        mem: &mut Memory,
        n: usize,
    ) -> Result<(), ModelError> {
        let p = &self.p;
        let dims = p.dims;
        let (kd, vd, ch, hv) = (p.key_dim(), p.value_dim(), p.conv_channels(), dims.n_v_head);
        let w = 2 * ch + 2 * hv;
        let (mut st, base_ssm, tape) = refold_conv_window(mem, layer, seq, n, (ch, w, p.d_conv))?;
        st.ssm.copy_from(base_ssm);
        if n == 0 {
            return Ok(());
        }
        let mut gb = Scratch::dirty(n * 2 * hv);
        for i in 0..n {
            let row = &tape[i * w + 2 * ch..(i + 1) * w];
            gb[i * hv..(i + 1) * hv].copy_from_slice(&row[..hv]);
            gb[(n + i) * hv..(n + i + 1) * hv].copy_from_slice(&row[hv..]);
        }
        let xs = &tape[ch..];
        let inputs = DeltaInputs {
            q: xs,
            k: &xs[kd..],
            ld_qk: w,
            v: &xs[2 * kd..],
            ld_v: w,
            g: &gb[..n * hv],
            beta: &gb[n * hv..],
        };
        let mut o = Scratch::dirty(n * vd);
        gated_delta_scan_state(pool, dims, st.ssm, inputs, &mut o, n);
        Ok(())
    }
}

/// The decode steps' recurrence of [`GatedDeltaMixer::forward`] on states
/// stored as `S`, all sequences in one call.
fn scan_steps<S: DeltaState>(
    pool: &ThreadPool,
    dims: GatedDeltaDims,
    ssm: Vec<(StateMut, Option<StateRef>)>,
    inputs: Vec<DeltaInputs>,
    os: Vec<&mut [f32]>,
) -> Result<(), ModelError> {
    let mut scan: Vec<DeltaSeq<S>> = Vec::with_capacity(ssm.len());
    for (((st, from), inputs), out) in ssm.into_iter().zip(inputs).zip(os) {
        let (state, from) = typed_state::<S>(st, from)?;
        let n_tokens = inputs.g.len() / dims.n_v_head;
        scan.push(DeltaSeq {
            state,
            from,
            inputs,
            out,
            n_tokens,
        });
    }
    gated_delta_scan_batch(pool, dims, &mut scan);
    Ok(())
}
