//! Feed-forward blocks: the dense MLP (SwiGLU `down(silu(gate·x) ⊙ up·x)`,
//! GeGLU `down(gelu(gate·x) ⊙ up·x)` or squared-ReLU `down(relu(up·x)²)`;
//! optionally with low-rank adapters beside gate and up), and the mixture of experts with its
//! router (softmax or sigmoid gating, optional score-correction bias,
//! top-k, optional renormalisation and scaling) and optional shared expert.

use super::lora::Lora;
use crate::models::weights::{Loader, Matrix};
use crate::models::ModelError;
use coil_gguf::GgufFile;
use coil_kernels::ops::act::{
    add_bias_rows, geglu_erf_inplace, relu2_inplace, swiglu_clamped_inplace, swiglu_inplace,
};
use coil_kernels::ops::topk::top_k;
use coil_kernels::{matmul, matmul_shared, Scratch, ThreadPool, WeightRef};

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    /// `silu(gate·x) ⊙ up·x`
    SwiGlu,
    /// `min(silu(gate·x), limit) ⊙ clamp(up·x, −limit, limit)` (llama.cpp's
    /// `swiglu_clamp_exp` / `swiglu_clamp_shexp`).
    SwiGluClamped(f32),
    /// `relu(up·x)²`
    Relu2,
    /// `gelu(gate·x) ⊙ up·x` with the exact (erf) GELU (Zamba2).
    GeGlu,
}

impl Activation {
    /// SwiGLU, clipped at `limit` where it is positive (0: none).
    pub fn swiglu_limit(limit: f32) -> Self {
        if limit > 0.0 {
            Activation::SwiGluClamped(limit)
        } else {
            Activation::SwiGlu
        }
    }

    /// `gate ← act(gate, up)` for the gated activations.
    fn gated(self, gate: &mut [f32], up: &[f32]) {
        match self {
            Activation::SwiGluClamped(limit) => swiglu_clamped_inplace(gate, up, limit),
            Activation::GeGlu => geglu_erf_inplace(gate, up),
            _ => swiglu_inplace(gate, up),
        }
    }
}

pub struct DenseFfn {
    pub up: Matrix,
    pub gate: Option<Matrix>,
    pub down: Matrix,
    pub up_b: Option<Vec<f32>>,
    pub gate_b: Option<Vec<f32>>,
    pub down_b: Option<Vec<f32>>,
    pub act: Activation,
    /// Low-rank adapters added to gate·x and up·x (`ffn_{gate,up}.weight.lora_{a,b}`).
    pub lora: Option<Box<[Lora; 2]>>,
}

impl DenseFfn {
    /// Loads `blk.{layer}.ffn_{up,gate,down}{suffix}` (suffix "" or "_shexp").
    pub fn load(
        ld: &Loader,
        layer: usize,
        suffix: &str,
        d_model: usize,
        n_ff: usize,
        act: Activation,
    ) -> Result<Self, ModelError> {
        Self::load_prefixed(ld, &format!("blk.{layer}"), suffix, d_model, n_ff, act)
    }

    /// Loads `{prefix}.ffn_{up,gate,down}{suffix}`.
    pub fn load_prefixed(
        ld: &Loader,
        prefix: &str,
        suffix: &str,
        d_model: usize,
        n_ff: usize,
        act: Activation,
    ) -> Result<Self, ModelError> {
        let n = |t: &str| format!("{prefix}.ffn_{t}{suffix}.weight");
        let b = |t: &str, len: usize| -> Result<Option<Vec<f32>>, ModelError> {
            let name = format!("{prefix}.ffn_{t}{suffix}.bias");
            if ld.has(&name) {
                ld.vector(&name, &[len]).map(Some)
            } else {
                Ok(None)
            }
        };
        let gate = match act {
            Activation::SwiGlu | Activation::SwiGluClamped(_) | Activation::GeGlu => {
                Some(ld.matrix(&n("gate"), n_ff, d_model)?)
            }
            Activation::Relu2 => None,
        };
        Ok(DenseFfn {
            up: ld.matrix(&n("up"), n_ff, d_model)?,
            gate,
            down: ld.matrix(&n("down"), d_model, n_ff)?,
            up_b: b("up", n_ff)?,
            gate_b: b("gate", n_ff)?,
            down_b: b("down", d_model)?,
            act,
            lora: None,
        })
    }

    /// `x`: `[n, d_model]` → `out`: `[n, d_model]`.
    pub fn forward(&self, file: &GgufFile, pool: &ThreadPool, x: &[f32], out: &mut [f32]) {
        let n = x.len() / self.up.cols;
        let n_ff = self.up.rows;
        let mut up = Scratch::dirty(n * n_ff);
        match &self.gate {
            Some(g) => {
                let mut gate = Scratch::dirty(n * n_ff);
                // one quantization of x for both products
                matmul_shared(
                    pool,
                    &[&self.up.get(file), &g.get(file)],
                    x,
                    &mut [&mut up, &mut gate],
                    n,
                );
                if let Some([lg, lu]) = self.lora.as_deref() {
                    lg.add(file, pool, x, &mut gate, n);
                    lu.add(file, pool, x, &mut up, n);
                }
                if let Some(b) = &self.up_b {
                    add_bias_rows(&mut up, b);
                }
                if let Some(b) = &self.gate_b {
                    add_bias_rows(&mut gate, b);
                }
                // element-wise, token rows spread over the pool
                let act = self.act;
                pool.rows_mut(&mut gate, n_ff, 4, |r0, part| {
                    act.gated(part, &up[r0 * n_ff..r0 * n_ff + part.len()])
                });
                up = gate;
            }
            None => {
                matmul(pool, &self.up.get(file), x, &mut up, n);
                if let Some(b) = &self.up_b {
                    add_bias_rows(&mut up, b);
                }
                pool.rows_mut(&mut up, n_ff, 4, |_, part| relu2_inplace(part))
            }
        }
        matmul(pool, &self.down.get(file), &up, out, n);
        if let Some(b) = &self.down_b {
            add_bias_rows(out, b);
        }
    }
}

/// `n_expert` matrices `[rows, cols]` stored one after another (ggml ne =
/// [cols, rows, n_expert]).
pub struct Experts {
    pub all: Matrix,
    pub n_expert: usize,
    pub rows: usize,
    pub cols: usize,
}

impl Experts {
    pub fn load(
        ld: &Loader,
        name: &str,
        n_expert: usize,
        rows: usize,
        cols: usize,
    ) -> Result<Self, ModelError> {
        Ok(Experts {
            all: ld.matrix3(name, n_expert, rows, cols)?,
            n_expert,
            rows,
            cols,
        })
    }

    pub fn get<'a>(&self, file: &'a GgufFile, e: usize) -> WeightRef<'a> {
        let w = self.all.get(file);
        let per = w.data.len() / self.n_expert;
        WeightRef {
            ty: w.ty,
            data: &w.data[e * per..(e + 1) * per],
            rows: self.rows,
            cols: self.cols,
            layout: w.layout,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gating {
    Softmax,
    Sigmoid,
}

/// Group-limited routing (DeepSeek-V3): the experts form `n_group` equal
/// groups, each scored by the sum of its two best selection scores; only
/// the `n_used` best groups' experts can be chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExpertGroups {
    pub n_group: usize,
    pub n_used: usize,
}

impl ExpertGroups {
    /// Sets the selection scores of the experts outside the chosen groups
    /// to −∞.
    fn mask(&self, select: &mut [f32]) {
        let per = select.len() / self.n_group;
        let scores: Vec<f32> = select
            .chunks_exact(per)
            .map(|g| top_k(g, 2.min(per)).iter().map(|&(_, v)| v).sum())
            .collect();
        let keep = top_k(&scores, self.n_used);
        for (gi, g) in select.chunks_exact_mut(per).enumerate() {
            if !keep.iter().any(|&(k, _)| k == gi) {
                g.fill(f32::NEG_INFINITY);
            }
        }
    }
}

pub struct Moe {
    /// `[n_expert, d_model]`
    pub router: Matrix,
    pub up: Experts,
    pub gate: Option<Experts>,
    pub down: Experts,
    pub gating: Gating,
    /// Added to the gate probabilities for choosing experts only.
    pub select_bias: Option<Vec<f32>>,
    /// Group-limited choice (`None`: any expert).
    pub groups: Option<ExpertGroups>,
    pub n_used: usize,
    /// Renormalise the chosen experts' weights to sum to 1.
    pub norm_weights: bool,
    /// Multiplies the weights (1 = none).
    pub weights_scale: f32,
    pub act: Activation,
    pub shared: Option<DenseFfn>,
}

impl Moe {
    /// Per token: the chosen experts and their weights.
    fn route(&self, file: &GgufFile, pool: &ThreadPool, x: &[f32]) -> Vec<Vec<(usize, f32)>> {
        let ne = self.router.rows;
        let n = x.len() / self.router.cols;
        let mut logits = Scratch::dirty(n * ne);
        matmul(pool, &self.router.get(file), x, &mut logits, n);
        logits
            .chunks_exact(ne)
            .map(|l| {
                let probs: Vec<f32> = match self.gating {
                    Gating::Softmax => {
                        let m = l.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                        let e: Vec<f32> = l.iter().map(|v| (v - m).exp()).collect();
                        let s: f32 = e.iter().sum();
                        e.iter().map(|v| v / s).collect()
                    }
                    Gating::Sigmoid => l.iter().map(|v| 1.0 / (1.0 + (-v).exp())).collect(),
                };
                let mut select: Vec<f32> = match &self.select_bias {
                    Some(b) => probs.iter().zip(b).map(|(p, b)| p + b).collect(),
                    None => probs.clone(),
                };
                if let Some(g) = &self.groups {
                    g.mask(&mut select);
                }
                let chosen = top_k(&select, self.n_used);
                let mut w: Vec<(usize, f32)> = chosen.iter().map(|&(e, _)| (e, probs[e])).collect();
                if self.norm_weights {
                    let s: f32 = w.iter().map(|x| x.1).sum();
                    if s > 0.0 {
                        w.iter_mut().for_each(|x| x.1 /= s);
                    }
                }
                if self.weights_scale != 0.0 && self.weights_scale != 1.0 {
                    w.iter_mut().for_each(|x| x.1 *= self.weights_scale);
                }
                w
            })
            .collect()
    }

    /// `x`: `[n, d_model]` → `out`: `[n, d_model]`.
    ///
    /// The tokens are grouped by expert so each expert runs one batched
    /// product. With few tokens per expert (decode, small batches) the
    /// experts themselves are spread over the threads, each expert's
    /// products on one thread: an expert's matrices are too small for two
    /// threads to share (one decoded token on a Qwen3.5-MoE-like shape: the
    /// second thread took part in ~10% of the expert work). Each expert's
    /// result is the same either way, and the results are added in expert
    /// order, so the output does not depend on the split.
    pub fn forward(&self, file: &GgufFile, pool: &ThreadPool, x: &[f32], out: &mut [f32]) {
        let d = self.router.cols;
        let n = x.len() / d;
        let routes = self.route(file, pool, x);
        // (expert, its tokens with their weights), in expert order
        let groups: Vec<(usize, Vec<(usize, f32)>)> = (0..self.up.n_expert)
            .filter_map(|e| {
                let users: Vec<(usize, f32)> = routes
                    .iter()
                    .enumerate()
                    .filter_map(|(t, r)| r.iter().find(|(ee, _)| *ee == e).map(|&(_, w)| (t, w)))
                    .collect();
                (!users.is_empty()).then_some((e, users))
            })
            .collect();
        let total: usize = groups.iter().map(|(_, u)| u.len()).sum();
        let mut ys = Scratch::dirty(total * d);
        {
            let mut slots: Vec<std::sync::Mutex<&mut [f32]>> = Vec::with_capacity(groups.len());
            let mut rest: &mut [f32] = &mut ys;
            for (_, users) in &groups {
                let (ye, tail) = rest.split_at_mut(users.len() * d);
                slots.push(std::sync::Mutex::new(ye));
                rest = tail;
            }
            let run = |g: usize| {
                let (e, users) = &groups[g];
                let mut ye = slots[g].lock().unwrap_or_else(|p| p.into_inner());
                self.expert(file, pool, *e, x, users, &mut ye);
            };
            let per_expert = groups.len() >= 2 * pool.n_threads()
                && groups
                    .iter()
                    .all(|(_, u)| u.len() <= EXPERT_PARALLEL_MAX_TOKENS);
            if per_expert {
                // nested matmuls inside a pool job run on their thread alone
                pool.parallel_for(groups.len(), 1, |gr, _| gr.for_each(run));
            } else {
                (0..groups.len()).for_each(run);
            }
        }
        out.fill(0.0);
        let mut at = 0;
        for (_, users) in &groups {
            for &(t, w) in users {
                for (o, y) in out[t * d..(t + 1) * d].iter_mut().zip(&ys[at..at + d]) {
                    *o += w * y;
                }
                at += d;
            }
        }
        if let Some(sh) = &self.shared {
            let mut s = Scratch::dirty(n * d);
            sh.forward(file, pool, x, &mut s);
            out.iter_mut().zip(&s).for_each(|(o, v)| *o += v);
        }
    }

    /// Expert `e` on the tokens `users` of `x`: `ye` = `[users.len(), d_model]`.
    fn expert(
        &self,
        file: &GgufFile,
        pool: &ThreadPool,
        e: usize,
        x: &[f32],
        users: &[(usize, f32)],
        ye: &mut [f32],
    ) {
        let (d, n_ff, m) = (self.router.cols, self.up.rows, users.len());
        let mut xe = Scratch::dirty(m * d);
        for (i, &(t, _)) in users.iter().enumerate() {
            xe[i * d..(i + 1) * d].copy_from_slice(&x[t * d..(t + 1) * d]);
        }
        let mut up = Scratch::dirty(m * n_ff);
        match &self.gate {
            Some(g) => {
                let mut gate = Scratch::dirty(m * n_ff);
                // one quantization of the expert's tokens for both products
                matmul_shared(
                    pool,
                    &[&self.up.get(file, e), &g.get(file, e)],
                    &xe,
                    &mut [&mut up, &mut gate],
                    m,
                );
                self.act.gated(&mut gate, &up);
                up = gate;
            }
            None => {
                matmul(pool, &self.up.get(file, e), &xe, &mut up, m);
                relu2_inplace(&mut up)
            }
        }
        matmul(pool, &self.down.get(file, e), &up, ye, m);
    }
}

/// Experts run one per thread while none of them has more tokens than this
/// (decode and small batches); beyond, each expert's products are split
/// over the threads (the few-token tiles and the GEMM use them well).
const EXPERT_PARALLEL_MAX_TOKENS: usize = 8;

/// A mixture of experts plus an always-on shared expert scaled per token by
/// `sigmoid(shared_gate · x)` (Qwen2-MoE family: Qwen3-Next, Qwen3.5-MoE).
pub struct MoeGatedShared {
    pub moe: Moe,
    pub shared: DenseFfn,
    /// `ffn_gate_inp_shexp`: `[1, d_model]`.
    pub shared_gate: Matrix,
}

impl MoeGatedShared {
    /// `x`: `[n, d_model]` → `out`: `[n, d_model]`.
    pub fn forward(&self, file: &GgufFile, pool: &ThreadPool, x: &[f32], out: &mut [f32]) {
        let d = self.moe.router.cols;
        let n = x.len() / d;
        self.moe.forward(file, pool, x, out);
        let mut s = Scratch::dirty(n * d);
        self.shared.forward(file, pool, x, &mut s);
        let mut gate = Scratch::dirty(n);
        matmul(pool, &self.shared_gate.get(file), x, &mut gate, n);
        for ((o, sr), g) in out
            .chunks_exact_mut(d)
            .zip(s.chunks_exact(d))
            .zip(gate.iter())
        {
            let w = 1.0 / (1.0 + (-g).exp());
            o.iter_mut().zip(sr).for_each(|(o, v)| *o += w * v);
        }
    }
}
