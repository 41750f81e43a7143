//! The Kimi Delta Attention mixer (Kimi Team, "Kimi Linear", 2025), as
//! transformers' torch path computes it:
//!
//! * projections q, k, v (`attn_q` / `attn_k` / `attn_v`, or a fused
//!   `attn_qkv`; H·d each), β (`ssm_beta`, one per head), and the forget
//!   and output gates' projections: low-rank pairs in Kimi-Linear
//!   (`f_b(f_a(x))`: `ssm_f_a` [d], `ssm_f_b` [H·d]; `g_b(g_a(x))`:
//!   `ssm_g_a`, `ssm_g_b`), full-rank in Ling 3.0 / GLM-5-Next (`ssm_f_a`,
//!   `ssm_g_a` [H·d] alone);
//! * a causal depthwise conv of window K (no bias) + SiLU on each of q, k, v
//!   (`ssm_conv1d_q` / `_k` / `_v`), run here as one conv over `[q | k | v]`;
//! * q, k L2-normalised per head, q scaled by 1/√d;
//! * the per-channel decay `g = −exp(A_log)·softplus(f + dt_bias)`
//!   (Kimi-Linear: `ssm_a` holds −exp(A_log), one per head) or the bounded
//!   ("safe") gate `g = lower·sigmoid(exp(A_log)·(f + dt_bias))` (Ling 3.0:
//!   `ssm_a` holds exp(A_log), `kda.gate_lower_bound` < 0), f the forget
//!   gate's projection, `ssm_dt.bias` one per channel; `β = sigmoid(b)`;
//! * the KDA recurrence per head (state `[d, d]`, see
//!   `coil_kernels::ops::delta::kda`), chunked for prompts;
//! * `RMSNorm(o)·w ⊙ sigmoid(g_b(g_a(x)))` per head (`ssm_norm` [d]), then
//!   `attn_output`.

use super::common::{layer_state, layer_states_moving, recurrent_memory, split_rows, typed_state};
use crate::memory::{Memory, RecurrentLayerShape, StateMut, StateRef, StateType};
use crate::models::weights::{Loader, Matrix};
use crate::models::{ModelError, Rows};
use coil_gguf::GgufFile;
use coil_kernels::ops::act::{mul_sigmoid_inplace, softplus1};
use coil_kernels::ops::conv::{
    conv1d_causal_batch, conv1d_causal_pool, ConvAct, ConvSeq, ConvWeights,
};
use coil_kernels::ops::delta::chunk::{delta_chunked, DEFAULT_CHUNK};
use coil_kernels::ops::delta::l2_normalize;
use coil_kernels::ops::delta::{kda_scan_batch, KdaDims, KdaInputs, KdaSeq, KdaState};
use coil_kernels::ops::norm::rms_norm_inplace;
use coil_kernels::{matmul, matmul_shared, Scratch, ThreadPool, WeightRef};
use half::bf16;

/// The L2 norm's epsilon (transformers' and fla's `l2norm`).
const L2_EPS: f32 = 1e-6;

/// From how many tokens of one sequence the chunked form replaces the
/// token-by-token recurrence: `COIL_KDA_MIN_TOKENS`, else 8 (both give the
/// same result to f32 rounding; tests run both).
pub fn chunk_min_tokens() -> usize {
    std::env::var("COIL_KDA_MIN_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8)
}

/// Tokens per chunk: `COIL_KDA_CHUNK`, else [`DEFAULT_CHUNK`].
pub fn chunk_len() -> usize {
    std::env::var("COIL_KDA_CHUNK")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|&c| c > 0)
        .unwrap_or(DEFAULT_CHUNK)
}

/// How the forget gate's projection f becomes the log decay g.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum KdaGate {
    /// `g = a·softplus(f + dt_bias)`, `a` = −exp(A_log) (Kimi-Linear).
    Softplus,
    /// `g = lower_bound·sigmoid(a·(f + dt_bias))`, `a` = exp(A_log): every
    /// decay within `[e^lower_bound, 1]` (Ling 3.0's `kda_safe_gate`).
    Bounded { lower_bound: f32 },
}

/// Hyper-parameters, from llama.cpp's keys: `attention.head_count` = H (the
/// KDA heads, as llama.cpp reads them), `kda.head_dim` = d (keys and values
/// alike), `ssm.conv_kernel` = K.
#[derive(Clone, Copy, Debug)]
pub struct KdaParams {
    pub d_model: usize,
    pub dims: KdaDims,
    pub d_conv: usize,
    /// The gated output norm's epsilon.
    pub eps: f32,
    pub gate: KdaGate,
    /// Low-rank gate projections (`ssm_f_a` → `ssm_f_b`, `ssm_g_a` →
    /// `ssm_g_b`, rank d) rather than full-rank `ssm_f_a` / `ssm_g_a`.
    pub low_rank_gates: bool,
    pub chunk_min_tokens: usize,
    pub chunk: usize,
}

impl KdaParams {
    pub fn new(d_model: usize, n_head: usize, head_dim: usize, d_conv: usize, eps: f32) -> Self {
        KdaParams {
            d_model,
            dims: KdaDims {
                n_head,
                d_k: head_dim,
                d_v: head_dim,
            },
            d_conv,
            eps,
            gate: KdaGate::Softplus,
            low_rank_gates: true,
            chunk_min_tokens: chunk_min_tokens(),
            chunk: chunk_len(),
        }
    }

    /// Width of each of q, k, v: H·d.
    pub fn inner(&self) -> usize {
        self.dims.n_head * self.dims.d_k
    }

    /// Channels of the convolution: q, k, v.
    pub fn conv_channels(&self) -> usize {
        3 * self.inner()
    }

    pub fn state_shape(&self) -> RecurrentLayerShape {
        RecurrentLayerShape {
            conv: (self.d_conv - 1) * self.conv_channels(),
            ssm: self.dims.state_len(),
        }
    }
}

/// How q, k and v come out of the input.
pub enum QkvProj {
    Split { q: Matrix, k: Matrix, v: Matrix },
    Fused(Matrix),
}

/// A gate's projection to H·d channels: `b(a(x))` through rank d, or `a(x)`.
pub enum GateProj {
    LowRank { a: Matrix, b: Matrix },
    Full(Matrix),
}

impl GateProj {
    /// `ssm_{f,g}_a` (and `_b` where low-rank) of `layer`.
    fn load(ld: &Loader, layer: usize, which: char, p: &KdaParams) -> Result<Self, ModelError> {
        let n = |part: char| format!("blk.{layer}.ssm_{which}_{part}.weight");
        Ok(match p.low_rank_gates {
            true => GateProj::LowRank {
                a: ld.matrix(&n('a'), p.dims.d_k, p.d_model)?,
                b: ld.matrix(&n('b'), p.inner(), p.dims.d_k)?,
            },
            false => GateProj::Full(ld.matrix(&n('a'), p.inner(), p.d_model)?),
        })
    }

    /// The matrix applied to the input.
    fn first(&self) -> &Matrix {
        match self {
            GateProj::LowRank { a, .. } | GateProj::Full(a) => a,
        }
    }
}

pub struct KdaMixer {
    pub p: KdaParams,
    pub qkv: QkvProj,
    /// The forget gate's projection f.
    pub f: GateProj,
    /// The output gate's projection.
    pub g: GateProj,
    pub beta: Matrix,
    /// `[3·H·d, K]`: the q, k and v kernels stacked, laid out for the
    /// kernels.
    pub conv_w: ConvWeights,
    /// `[H·d]`
    pub dt_bias: Vec<f32>,
    /// `[H]`: −exp(A_log) ([`KdaGate::Softplus`]) or exp(A_log)
    /// ([`KdaGate::Bounded`]).
    pub a: Vec<f32>,
    /// `[d]`, shared by the heads.
    pub norm: Vec<f32>,
    pub out_proj: Matrix,
}

impl KdaMixer {
    pub fn load(ld: &Loader, layer: usize, p: KdaParams) -> Result<Self, ModelError> {
        let n = |t: &str| format!("blk.{layer}.{t}");
        let (inner, d, nh, dm, k) = (p.inner(), p.dims.d_k, p.dims.n_head, p.d_model, p.d_conv);
        let qkv = if ld.has(&n("attn_qkv.weight")) {
            QkvProj::Fused(ld.matrix(&n("attn_qkv.weight"), 3 * inner, dm)?)
        } else {
            QkvProj::Split {
                q: ld.matrix(&n("attn_q.weight"), inner, dm)?,
                k: ld.matrix(&n("attn_k.weight"), inner, dm)?,
                v: ld.matrix(&n("attn_v.weight"), inner, dm)?,
            }
        };
        let mut conv_w = Vec::with_capacity(3 * inner * k);
        for part in ["q", "k", "v"] {
            // ggml {K, 1, H·d} (a trailing 1 dropped by some writers)
            conv_w.extend(ld.vector(&n(&format!("ssm_conv1d_{part}.weight")), &[k, 1, inner])?);
        }
        let a_name = n("ssm_a");
        let a = match ld.vector(&a_name, &[1, nh]) {
            Ok(a) => a,
            Err(ModelError::BadShape { found, .. }) => {
                return Err(ModelError::Tensor {
                    name: a_name,
                    reason: format!(
                        "shape {found:?} does not hold one decay rate per head for the {nh} KDA \
                         heads (attention.head_count)"
                    ),
                })
            }
            Err(e) => return Err(e),
        };
        Ok(KdaMixer {
            qkv,
            f: GateProj::load(ld, layer, 'f', &p)?,
            g: GateProj::load(ld, layer, 'g', &p)?,
            beta: ld.matrix(&n("ssm_beta.weight"), nh, dm)?,
            conv_w: ConvWeights::new(&conv_w, 3 * inner, k),
            dt_bias: ld.vector(&n("ssm_dt.bias"), &[inner])?,
            a,
            norm: ld.vector(&n("ssm_norm.weight"), &[d])?,
            out_proj: ld.matrix(&n("attn_output.weight"), dm, inner)?,
            p,
        })
    }

    /// The input projections: `qkv` `[n, 3·H·d]` (`[q | k | v]` rows),
    /// the forget gate's log decays `g` and the output gate's pre-activation
    /// `gate` (`[n, H·d]` each), and β (`[n, H]`, sigmoid applied).
    #[allow(clippy::too_many_arguments)]
    fn project(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        h: &[f32],
        qkv: &mut [f32],
        g: &mut [f32],
        gate: &mut [f32],
        beta: &mut [f32],
        n: usize,
    ) {
        let (inner, d, nh) = (self.p.inner(), self.p.dims.d_k, self.p.dims.n_head);
        // The low-rank gates' rank-d intermediates (empty when full-rank).
        let rank = |gp: &GateProj| match gp {
            GateProj::LowRank { .. } => n * d,
            GateProj::Full(_) => 0,
        };
        let mut fa = Scratch::dirty(rank(&self.f));
        let mut ga = Scratch::dirty(rank(&self.g));
        {
            // one activation quantization for every product of `h`
            let (mut q, mut k, mut v) = match self.qkv {
                QkvProj::Split { .. } => (
                    Scratch::dirty(n * inner),
                    Scratch::dirty(n * inner),
                    Scratch::dirty(n * inner),
                ),
                QkvProj::Fused(_) => (Scratch::dirty(0), Scratch::dirty(0), Scratch::dirty(0)),
            };
            let mut ws: Vec<WeightRef> = Vec::with_capacity(6);
            let mut ys: Vec<&mut [f32]> = Vec::with_capacity(6);
            match &self.qkv {
                QkvProj::Split {
                    q: wq,
                    k: wk,
                    v: wv,
                } => {
                    ws.extend([wq.get(file), wk.get(file), wv.get(file)]);
                    ys.extend([&mut q[..], &mut k[..], &mut v[..]]);
                }
                QkvProj::Fused(w) => {
                    ws.push(w.get(file));
                    ys.push(&mut *qkv);
                }
            }
            ws.extend([
                self.f.first().get(file),
                self.g.first().get(file),
                self.beta.get(file),
            ]);
            let f_out: &mut [f32] = match self.f {
                GateProj::LowRank { .. } => &mut fa,
                GateProj::Full(_) => &mut *g,
            };
            let g_out: &mut [f32] = match self.g {
                GateProj::LowRank { .. } => &mut ga,
                GateProj::Full(_) => &mut *gate,
            };
            ys.extend([f_out, g_out, &mut *beta]);
            let wr: Vec<&WeightRef> = ws.iter().collect();
            matmul_shared(pool, &wr, h, &mut ys, n);
            drop(ys);
            if let QkvProj::Split { .. } = self.qkv {
                for (i, row) in qkv.chunks_exact_mut(3 * inner).enumerate() {
                    let src = i * inner..(i + 1) * inner;
                    row[..inner].copy_from_slice(&q[src.clone()]);
                    row[inner..2 * inner].copy_from_slice(&k[src.clone()]);
                    row[2 * inner..].copy_from_slice(&v[src]);
                }
            }
        }
        if let GateProj::LowRank { b, .. } = &self.f {
            matmul(pool, &b.get(file), &fa, g, n);
        }
        if let GateProj::LowRank { b, .. } = &self.g {
            matmul(pool, &b.get(file), &ga, gate, n);
        }
        // The log decays per channel (see [`KdaGate`]), β = sigmoid(b).
        let form = self.p.gate;
        for row in g.chunks_exact_mut(inner) {
            for ((hd, &a), x) in row.chunks_exact_mut(d).zip(&self.a).zip(0..) {
                let bias = &self.dt_bias[x * d..(x + 1) * d];
                for (v, &b) in hd.iter_mut().zip(bias) {
                    *v = match form {
                        KdaGate::Softplus => a * softplus1(*v + b),
                        KdaGate::Bounded { lower_bound } => {
                            lower_bound / (1.0 + (-a * (*v + b)).exp())
                        }
                    };
                }
            }
        }
        debug_assert_eq!(beta.len(), n * nh);
        for b in beta.iter_mut() {
            *b = 1.0 / (1.0 + (-*b).exp());
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
        let (inner, ch, nh, d) = (p.inner(), p.conv_channels(), dims.n_head, dims.d_k);

        let mut qkv = Scratch::dirty(n * ch);
        let mut g = Scratch::dirty(n * inner);
        let mut gate = Scratch::dirty(n * inner);
        let mut beta = Scratch::dirty(n * nh);
        self.project(file, pool, h, &mut qkv, &mut g, &mut gate, &mut beta, n);

        // [n, ch] = silu(conv([q | k | v])), then q, k L2-normalised.
        let mut x = Scratch::dirty(n * ch);
        let mut o = Scratch::dirty(n * inner);
        let q_scale = 1.0 / (d as f32).sqrt();
        let l2 = |part: &mut [f32]| {
            for row in part.chunks_exact_mut(ch) {
                l2_normalize(&mut row[..inner], d, L2_EPS, q_scale);
                l2_normalize(&mut row[inner..2 * inner], d, L2_EPS, 1.0);
            }
        };
        // The rows `r` of the recurrence's inputs (q, k, v in `xs`).
        fn inputs<'a>(
            xs: &'a [f32],
            g: &'a [f32],
            beta: &'a [f32],
            r: &std::ops::Range<usize>,
            (inner, nh): (usize, usize),
        ) -> KdaInputs<'a> {
            KdaInputs {
                q: xs,
                k: &xs[inner..],
                ld_qk: 3 * inner,
                v: &xs[2 * inner..],
                ld_v: 3 * inner,
                g: &g[r.start * inner..r.end * inner],
                beta: &beta[r.start * nh..r.end * nh],
            }
        }
        // Batch-invariant micro-batches take the recurrence at any length.
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
            let os = &mut o[rows.start * inner..rows.end * inner];
            // In f32 (a bf16 state is widened, and rounded once at the end).
            st.ssm.with_f32(None, |s| {
                delta_chunked(
                    pool,
                    dims,
                    p.chunk,
                    s,
                    inputs(xs, &g, &beta, rows, (inner, nh)),
                    os,
                    t,
                )
            });
        }
        // Decode steps: every sequence's convolution in one call, then the
        // recurrence over all (sequence, head) pairs in one call.
        if !steps.is_empty() {
            let seqs: Vec<usize> = steps.iter().map(|c| c.seq).collect();
            let ty = mem.state_type();
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
                l2(xs);
            }
            let os = split_rows(&mut o, inner, &steps);
            let ins: Vec<KdaInputs> = xs_parts
                .iter()
                .zip(&steps)
                .map(|(xs, c)| inputs(xs, &g, &beta, &c.rows, (inner, nh)))
                .collect();
            let ssm: Vec<(StateMut, Option<StateRef>)> =
                states.into_iter().map(|(st, f)| (st.ssm, f)).collect();
            match ty {
                StateType::F32 => scan_steps::<f32>(pool, dims, ssm, ins, os)?,
                StateType::Bf16 => scan_steps::<bf16>(pool, dims, ssm, ins, os)?,
            }
        }
        // RMSNorm(o)·w per head, times sigmoid(gate).
        pool.rows_mut(&mut o, inner, 16, |r0, part| {
            rms_norm_inplace(part, Some(&self.norm), p.eps, d);
            mul_sigmoid_inplace(part, &gate[r0 * inner..r0 * inner + part.len()]);
        });
        matmul(pool, &self.out_proj.get(file), &o, out, n);
        Ok(())
    }
}

/// The decode steps' recurrence of [`KdaMixer::forward`] on states stored
/// as `S`, all sequences in one call.
fn scan_steps<S: KdaState>(
    pool: &ThreadPool,
    dims: KdaDims,
    ssm: Vec<(StateMut, Option<StateRef>)>,
    inputs: Vec<KdaInputs>,
    os: Vec<&mut [f32]>,
) -> Result<(), ModelError> {
    let mut scan: Vec<KdaSeq<S>> = Vec::with_capacity(ssm.len());
    for (((st, from), inputs), out) in ssm.into_iter().zip(inputs).zip(os) {
        let (state, from) = typed_state::<S>(st, from)?;
        let n_tokens = inputs.beta.len() / dims.n_head;
        scan.push(KdaSeq {
            state,
            from,
            inputs,
            out,
            n_tokens,
        });
    }
    kda_scan_batch(pool, dims, &mut scan);
    Ok(())
}
