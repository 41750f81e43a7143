//! The Mamba-2 mixer (Dao & Gu 2024), as in transformers' torch path:
//!
//! `in_proj(x) → [z (d_in) | xBC (d_in + 2GN) | dt (H)]`; causal depthwise
//! conv over xBC (window K, bias) then SiLU; split x `[H, P]`, B `[G, N]`,
//! C `[G, N]`; `dt = softplus(dt + dt_bias)` clamped to time_step_limit;
//! `S_h ← exp(dt_h·A_h)·S_h + dt_h·x_h ⊗ B_g`, `y_h = S_h·C_g + D_h·x_h`;
//! gated RMSNorm per group (`y·silu(z)` before the norm); `out_proj`.

use super::common::{
    layer_state_moving, layer_states_moving, recurrent_memory, refold_conv_window, split_rows,
    typed_state,
};
use crate::memory::{Memory, RecurrentLayerShape, RecurrentMemory};
use crate::memory::{StateMut, StateRef, StateType};
use crate::models::weights::{Loader, Matrix};
use crate::models::ModelError;
use crate::models::Rows;
use coil_gguf::GgufFile;
use coil_kernels::ops::act::{mul_silu_inplace, softplus1};
use coil_kernels::ops::conv::{
    conv1d_causal_batch, conv1d_causal_pool, ConvAct, ConvSeq, ConvWeights,
};
use coil_kernels::ops::norm::group_rms_norm_gated;
use coil_kernels::ops::ssm::ssd::{mamba2_chunked_scan, DEFAULT_CHUNK};
use coil_kernels::ops::ssm::{mamba2_scan_batch, Mamba2Seq};
use coil_kernels::ops::ssm::{mamba2_scan_from_state, Mamba2Dims, ScanInputs, ScanState};
use half::bf16;

/// From how many tokens of one sequence on the chunked SSD algorithm
/// replaces the token-by-token recurrence: `COIL_SSD_MIN_TOKENS` in the
/// environment, else the kernel's measured break-even for the SIMD level
/// ([`coil_kernels::ops::ssm::ssd::min_tokens`]: 8 with AVX-512 or AVX2, 32 for
/// the portable build). Both give the same result (tests run both). On a
/// mamba2-370m layer, one thread, from a non-zero state, SSD takes 0.61×
/// the recurrence's CPU time at 8 tokens, 0.44× at 16 and 0.29× at 512
/// (3.5 vs 12.0 ms) with AVX-512; 0.87×, 0.68× and 0.60× with AVX2.
pub fn ssd_min_tokens() -> usize {
    std::env::var("COIL_SSD_MIN_TOKENS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(coil_kernels::ops::ssm::ssd::min_tokens)
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

/// What [`Mamba2Mixer::step_all`] hands its typed scan: per sequence the
/// SSM state (and its source), output rows and inputs.
struct StepParts<'a, 'b> {
    ssm: Vec<(StateMut<'a>, Option<StateRef<'a>>)>,
    ys: Vec<&'b mut [f32]>,
    xs: &'b [&'b mut [f32]],
    steps: &'b [&'b Rows],
    bc: &'b [f32],
    bc_at: &'b [usize],
    dt: &'b [f32],
}

pub struct Mamba2Mixer {
    pub p: Mamba2Params,
    pub in_proj: Matrix,
    /// `[channels, K]`, laid out for the kernels.
    pub conv_w: ConvWeights,
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
        let conv_w = ld.vector(&n("ssm_conv1d.weight"), &[p.d_conv, ch])?;
        Ok(Mamba2Mixer {
            in_proj: ld.matrix(&n("ssm_in.weight"), p.d_in_proj(), p.d_model)?,
            conv_w: ConvWeights::new(&conv_w, ch, p.d_conv),
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

        // dt [n_tokens, H] = softplus(dt + dt_bias), clamped.
        let mut dt = Scratch::dirty(n_tokens * hn);
        for (i, v) in dt.chunks_exact_mut(hn).enumerate() {
            let raw = &zxbcdt[i * dip + di + ch..(i + 1) * dip];
            for ((v, r), b) in v.iter_mut().zip(raw).zip(&self.dt_bias) {
                *v = softplus1(r + b).clamp(p.dt_min, p.dt_max);
            }
        }
        let dims = Mamba2Dims {
            n_head: hn,
            head_dim: p.head_dim,
            n_group: p.n_group,
            d_state: p.d_state,
        };
        // xBC [n_tokens, ch] = silu(conv(xBC columns of in_proj's output,
        // read in place)); its rows are [x (H·P) | B (G·N) | C (G·N)].
        let mut xbc = Scratch::dirty(n_tokens * ch);
        let mut y = Scratch::dirty(n_tokens * di);
        // Batch-invariant micro-batches (speculative verification, batched
        // decode) take the recurrence at any length: each token's output is
        // then bit for bit that of decoding it alone.
        let invariant = coil_kernels::batch_invariant();
        // `CheapInvariant` micro-batches (`coil serve`'s prompts) take the
        // chunked form at every length: a prompt's chunks then start at the
        // same positions of its sequence however it was cut into calls
        // (aligned ones: `Engine::scan_chunk`), so its logits and state are
        // the same bits.
        let always = coil_kernels::invariance() == coil_kernels::Invariance::Cheap;
        let (prompts, steps): (Vec<&Rows>, Vec<&Rows>) = chunks
            .iter()
            .partition(|c| (always || c.rows.len() >= p.ssd_min_tokens) && !invariant);
        // Prompts, one sequence at a time: chunked SSD (matrix products
        // within each chunk, spread over the pool inside).
        for Rows { seq, rows, .. } in prompts {
            let t = rows.len();
            let (mut st, ssm_from) = layer_state_moving(mem, layer, *seq)?;
            let xs = &mut xbc[rows.start * ch..rows.end * ch];
            conv1d_causal_pool(
                pool,
                &zxbcdt[rows.start * dip + di..],
                dip,
                st.conv,
                &self.conv_w,
                Some(&self.conv_b),
                xs,
                ConvAct::Silu,
                None,
            );
            // x, B and C read in place from xBC's rows.
            let inputs = ScanInputs {
                x: xs,
                ldx: ch,
                b: &xs[di..],
                c: &xs[di + gn..],
                ldbc: ch,
            };
            // In f32 (a bf16 state is widened, and rounded once at the end).
            st.ssm.with_f32(ssm_from, |ssm| {
                mamba2_chunked_scan(
                    pool,
                    dims,
                    DEFAULT_CHUNK,
                    ssm,
                    inputs,
                    &dt[rows.start * hn..rows.end * hn],
                    &self.a,
                    Some(&self.d),
                    &mut y[rows.start * di..rows.end * di],
                    t,
                )
            });
        }
        if !steps.is_empty() {
            self.step_all(pool, layer, &steps, mem, &zxbcdt, &dt, &mut xbc, &mut y)?;
        }
        // A verification's tape (see `refold`), per token: xBC before and
        // after the convolution, and dt.
        for Rows { seq, rows, .. } in chunks {
            if let Some(tape) = mem.tape(layer, *seq) {
                for r in rows.clone() {
                    tape.extend_from_slice(&zxbcdt[r * dip + di..r * dip + di + ch]);
                    tape.extend_from_slice(&xbc[r * ch..(r + 1) * ch]);
                    tape.extend_from_slice(&dt[r * hn..(r + 1) * hn]);
                }
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

    /// The few-token updates (decode steps) of every sequence in `steps`
    /// together: one convolution call and one scan call over all their
    /// (sequence, head) pairs, instead of two pool calls per sequence. Each
    /// state moves to its sequence's own buffer head by head if it was
    /// shared (a checkpoint keeps the old one).
    #[allow(clippy::too_many_arguments)]
    fn step_all(
        &self,
        pool: &ThreadPool,
        layer: usize,
        steps: &[&Rows],
        mem: &mut RecurrentMemory,
        zxbcdt: &[f32],
        dt: &[f32],
        xbc: &mut [f32],
        y: &mut [f32],
    ) -> Result<(), ModelError> {
        let p = &self.p;
        let dip = p.d_in_proj();
        let ch = p.conv_channels();
        let (di, hn, gn) = (p.d_inner, p.n_head, p.n_group * p.d_state);
        let seqs: Vec<usize> = steps.iter().map(|c| c.seq).collect();
        let ty = mem.state_type();
        let mut states = layer_states_moving(mem, layer, &seqs)?;
        let mut xs_parts = split_rows(xbc, ch, steps);
        {
            let mut conv: Vec<ConvSeq> = states
                .iter_mut()
                .zip(xs_parts.iter_mut())
                .zip(steps)
                .map(|(((st, _), out), c)| ConvSeq {
                    x: &zxbcdt[c.rows.start * dip + di..],
                    state: &mut *st.conv,
                    out,
                })
                .collect();
            let (w, b) = (&self.conv_w, Some(&self.conv_b[..]));
            conv1d_causal_batch(pool, &mut conv, dip, w, b, ConvAct::Silu);
        }
        // B and C (2·G·N per token) go to a buffer of their own: read in
        // place, right behind x in xBC's rows, they slowed mamba2-370m
        // decode by 7–8% (measured; a placement effect, the loop itself is
        // the same).
        let n_rows: usize = steps.iter().map(|c| c.rows.len()).sum();
        let mut bc = Scratch::dirty(n_rows * 2 * gn);
        let mut at = 0;
        let mut bc_at = Vec::with_capacity(steps.len());
        for xs in &xs_parts {
            bc_at.push(at);
            for r in xs.chunks_exact(ch) {
                bc[at * 2 * gn..(at + 1) * 2 * gn].copy_from_slice(&r[di..]);
                at += 1;
            }
        }
        let dims = Mamba2Dims {
            n_head: hn,
            head_dim: p.head_dim,
            n_group: p.n_group,
            d_state: p.d_state,
        };
        let ys = split_rows(y, di, steps);
        let ssm: Vec<_> = states.into_iter().map(|(st, f)| (st.ssm, f)).collect();
        let parts = StepParts {
            ssm,
            ys,
            xs: &xs_parts,
            steps,
            bc: &bc,
            bc_at: &bc_at,
            dt,
        };
        match ty {
            StateType::F32 => self.scan_steps::<f32>(pool, dims, parts),
            StateType::Bf16 => self.scan_steps::<bf16>(pool, dims, parts),
        }
    }

    /// The scan of [`Mamba2Mixer::step_all`] on states stored as `S`.
    fn scan_steps<S: ScanState>(
        &self,
        pool: &ThreadPool,
        dims: Mamba2Dims,
        parts: StepParts,
    ) -> Result<(), ModelError> {
        let p = &self.p;
        let ch = p.conv_channels();
        let (hn, gn) = (p.n_head, p.n_group * p.d_state);
        let StepParts {
            ssm,
            ys,
            xs,
            steps,
            bc,
            bc_at,
            dt,
        } = parts;
        let mut scan: Vec<Mamba2Seq<S>> = Vec::with_capacity(steps.len());
        for ((((ssm, from), y), xs), (c, &b0)) in ssm
            .into_iter()
            .zip(ys)
            .zip(xs.iter())
            .zip(steps.iter().zip(bc_at))
        {
            let (state, from) = typed_state::<S>(ssm, from)?;
            let t = c.rows.len();
            let bcs = &bc[b0 * 2 * gn..(b0 + t) * 2 * gn];
            scan.push(Mamba2Seq {
                from,
                state,
                inputs: ScanInputs {
                    x: xs,
                    ldx: ch,
                    b: bcs,
                    c: &bcs[gn..],
                    ldbc: 2 * gn,
                },
                dt: &dt[c.rows.start * hn..c.rows.end * hn],
                y,
                n_tokens: t,
            });
        }
        mamba2_scan_batch(pool, dims, &mut scan, &self.a, Some(&self.d));
        Ok(())
    }

    /// After a verification of `seq` (see `Memory::spec_begin`) kept only
    /// the first `n` of its tokens: brings this layer's state to the state
    /// after those `n` tokens, from the state before the verification and
    /// the tape the forward pass wrote (per token: xBC before and after the
    /// convolution, dt). The conv window is the last K−1 inputs of
    /// `window ++ xBC[..n]`; the SSM state is the same single-step
    /// recurrence over the same inputs as the verification (and plain
    /// decoding) ran, so it is bit for bit that state. Costs one read and
    /// one write of the layer's state: a Mamba-2 decode step without the
    /// weights.
    pub fn refold(
        &self,
        pool: &ThreadPool,
        layer: usize,
        seq: usize,
        mem: &mut Memory,
        n: usize,
    ) -> Result<(), ModelError> {
        let p = &self.p;
        let (di, hn, gn) = (p.d_inner, p.n_head, p.n_group * p.d_state);
        let ch = p.conv_channels();
        let w = 2 * ch + hn;
        let (mut st, base_ssm, tape) = refold_conv_window(mem, layer, seq, n, (ch, w, p.d_conv))?;
        if n == 0 {
            st.ssm.copy_from(base_ssm);
            return Ok(());
        }
        let mut dt = Scratch::dirty(n * hn);
        let mut bc = Scratch::dirty(n * 2 * gn);
        for i in 0..n {
            let row = &tape[i * w..(i + 1) * w];
            dt[i * hn..(i + 1) * hn].copy_from_slice(&row[2 * ch..]);
            bc[i * 2 * gn..(i + 1) * 2 * gn].copy_from_slice(&row[ch + di..2 * ch]);
        }
        let dims = Mamba2Dims {
            n_head: hn,
            head_dim: p.head_dim,
            n_group: p.n_group,
            d_state: p.d_state,
        };
        let inputs = ScanInputs {
            x: &tape[ch..],
            ldx: w,
            b: &bc,
            c: &bc[gn..],
            ldbc: 2 * gn,
        };
        let mut y = Scratch::dirty(n * di);
        mamba2_scan_from_state(
            pool,
            dims,
            Some(base_ssm),
            st.ssm,
            inputs,
            &dt,
            &self.a,
            Some(&self.d),
            &mut y,
            n,
        );
        Ok(())
    }
}
