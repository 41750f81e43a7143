//! Gated DeltaNet hybrids → `qwen35` (Qwen3.5 / Qwen3.6 dense), `qwen35moe`
//! (Qwen3.5-MoE) and `qwen3next` (Qwen3-Next): Gated DeltaNet layers
//! (`linear_attention`) and gated attention layers (`full_attention`), each
//! followed by a SwiGLU feed-forward or experts plus a gated shared expert.
//!
//! As llama.cpp's converter writes them:
//! - `A_log` → `ssm_a` = −exp(A_log); `dt_bias` → `ssm_dt.bias`; the conv
//!   squeezed to `{channels, K}`;
//! - the zero-centred RMSNorm weights (every `*norm.weight` except the Gated
//!   DeltaNet output norm) stored as `1 + w`;
//! - Qwen3-Next's fused `in_proj_qkvz` (per key head: q, k, v, z) split into
//!   `attn_qkv` = [all q | all k | all v] and `attn_gate` = z; `in_proj_ba`
//!   kept as `ssm_ba`;
//! - Qwen3.5's value heads moved from the checkpoint's grouped order (the
//!   value heads of key head 0, then of key head 1, …) to llama.cpp's tiled
//!   order (value head j of every key head, then j + 1, …) in every tensor
//!   indexed by value head: the v rows of `attn_qkv`, `attn_gate`,
//!   `ssm_alpha`/`ssm_beta`, `ssm_a`, `ssm_dt.bias`, the v channels of the
//!   conv and the columns of `ssm_out`;
//! - experts stacked (or split from a fused `gate_up_proj`).
//!
//! - the multi-token-prediction block (`mtp.*`, `mtp_num_hidden_layers`
//!   of them, or as many `mtp.layers.N` as the checkpoint has) appended
//!   after the trunk as blocks `n_layer..`: `mtp.fc` → `nextn.eh_proj`,
//!   `mtp.pre_fc_norm_embedding` / `_hidden` → `nextn.enorm` / `hnorm`,
//!   `mtp.norm` → `nextn.shared_head_norm` (all three `1 + w`), the
//!   block's decoder layer named as a trunk attention layer;
//!   `nextn_predict_layers` says how many (`--no-mtp`: left out).
//!
//! A vision tower is not converted.

use super::llama::{rope_params, text_params, TextOpts};
use super::{block_id, expect_numel, Arch, Ctx, ExpertBuf, Kv, VocabSpec, VocabStyle};
use crate::config::check_range;
use crate::error::{ConvertError, Result};
use crate::plan::{Op, OutTensor, Source};
use crate::safetensors_src::SrcTensor;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    Qwen35,
    Qwen35Moe,
    Qwen3Next,
    /// Qwen4-Exp: Qwen3.5-MoE's conversion plus `qwen4exp.rs`'s additions.
    Qwen4Exp,
}

/// Gated DeltaNet head counts and sizes.
#[derive(Clone, Copy, Debug)]
struct Heads {
    /// Key heads (Hk) and their width d_k.
    n_k: usize,
    d_k: usize,
    /// Value heads (Hv, a multiple of Hk) and their width d_v.
    n_v: usize,
    d_v: usize,
}

impl Heads {
    /// Value heads per key head.
    fn r(&self) -> usize {
        self.n_v / self.n_k
    }

    /// The tiled order of `n_v` value heads of `width` rows each: output
    /// head `j·Hk + g` is the checkpoint's head `g·r + j` (llama.cpp's
    /// `_reorder_v_heads`).
    fn tiled(&self, width: usize) -> Vec<usize> {
        let r = self.r();
        let mut v = Vec::with_capacity(self.n_v * width);
        for j in 0..r {
            for g in 0..self.n_k {
                let h = g * r + j;
                v.extend(h * width..(h + 1) * width);
            }
        }
        v
    }
}

pub(crate) struct GatedDeltaHybrid<'a> {
    ctx: &'a Ctx<'a>,
    family: Family,
    /// Per layer: Gated DeltaNet (true) or attention.
    recurrent: Vec<bool>,
    heads: Heads,
    n_experts: usize,
    experts: ExpertBuf,
    /// Multi-token-prediction blocks written after the trunk.
    n_mtp: usize,
    /// Qwen4-Exp's hyper-connections, indexer and per-layer embedding.
    q4: Option<super::qwen4exp::Extras>,
}

/// The MTP blocks of a checkpoint: `mtp_num_hidden_layers`, else (Qwen3-Next
/// configs lack the key) the `mtp.layers.N` it holds.
fn mtp_layers(ctx: &Ctx) -> Result<usize> {
    if ctx.no_mtp {
        return Ok(0);
    }
    if let Some(n) = ctx.cfg.uint(&["mtp_num_hidden_layers"])? {
        check_range("mtp_num_hidden_layers", n, 0, 64)?;
        return Ok(n as usize);
    }
    Ok(ctx
        .ck
        .tensors()
        .iter()
        .filter_map(|t| {
            mtp_name(&t.name)?
                .strip_prefix("layers.")?
                .split('.')
                .next()?
                .parse::<usize>()
                .ok()
        })
        .map(|i| i + 1)
        .max()
        .unwrap_or(0))
}

/// The part of an MTP tensor's name after `mtp.`.
fn mtp_name(name: &str) -> Option<&str> {
    name.strip_prefix("mtp.")
        .or_else(|| name.strip_prefix("model.mtp."))
        .or_else(|| name.strip_prefix("model.language_model.mtp."))
}

impl<'a> GatedDeltaHybrid<'a> {
    pub fn new(ctx: &'a Ctx<'a>, family: Family) -> Result<Self> {
        let c = ctx.cfg;
        let n_layer = c.req_uint(&["num_hidden_layers"])? as usize;
        check_range("num_hidden_layers", n_layer as u64, 1, 4096)?;
        let recurrent: Vec<bool> = match c.strs("layer_types")? {
            Some(types) => {
                if types.len() != n_layer {
                    return Err(ConvertError::config(
                        "layer_types",
                        format!("{} entries, num_hidden_layers is {n_layer}", types.len()),
                    ));
                }
                types
                    .iter()
                    .map(|t| match t.as_str() {
                        "linear_attention" => Ok(true),
                        "full_attention" => Ok(false),
                        // Qwen4-Exp's indexed layers as transformers 5 saves them
                        "indexed_attention" if family == Family::Qwen4Exp => Ok(false),
                        other => Err(ConvertError::config(
                            "layer_types",
                            format!("unknown layer type {other:?}"),
                        )),
                    })
                    .collect::<Result<_>>()?
            }
            None => {
                let every = c.uint(&["full_attention_interval"])?.unwrap_or(4) as usize;
                (0..n_layer).map(|l| (l + 1) % every.max(1) != 0).collect()
            }
        };
        let u = |k: &str| -> Result<usize> {
            let v = c.req_uint(&[k])? as usize;
            check_range(k, v as u64, 1, 1 << 20)?;
            Ok(v)
        };
        let heads = Heads {
            n_k: u("linear_num_key_heads")?,
            d_k: u("linear_key_head_dim")?,
            n_v: u("linear_num_value_heads")?,
            d_v: u("linear_value_head_dim")?,
        };
        if !heads.n_v.is_multiple_of(heads.n_k) {
            return Err(ConvertError::config(
                "linear_num_value_heads",
                format!(
                    "{} value heads are not a multiple of {} key heads",
                    heads.n_v, heads.n_k
                ),
            ));
        }
        let n_experts = if family == Family::Qwen35 {
            0
        } else {
            c.req_uint(&["num_experts", "num_local_experts"])? as usize
        };
        let q4 = match family {
            Family::Qwen4Exp => Some(super::qwen4exp::Extras::new(ctx, n_layer, &recurrent)?),
            _ => None,
        };
        Ok(GatedDeltaHybrid {
            ctx,
            family,
            recurrent,
            heads,
            n_experts,
            experts: ExpertBuf::default(),
            // llama.cpp's Qwen4-Exp converter drops the MTP block
            n_mtp: if q4.is_some() { 0 } else { mtp_layers(ctx)? },
            q4,
        })
    }

    /// Blocks in the file: the trunk, then the MTP blocks.
    fn n_blocks(&self) -> usize {
        self.recurrent.len() + self.n_mtp
    }

    /// Whether value heads go to llama.cpp's tiled order (Qwen3.5).
    fn tiles(&self) -> bool {
        self.family != Family::Qwen3Next && self.heads.n_v != self.heads.n_k
    }

    /// Rows of a `[q | k | v]` projection with the v heads tiled.
    fn qkv_rows(&self) -> Vec<usize> {
        let h = self.heads;
        let qk = 2 * h.n_k * h.d_k;
        let mut rows: Vec<usize> = (0..qk).collect();
        rows.extend(h.tiled(h.d_v).into_iter().map(|i| qk + i));
        rows
    }

    /// Qwen3-Next's `in_proj_qkvz` rows (per key head: q, k, v, z) regrouped
    /// into `[all q | all k | all v]` and `z`.
    fn qkvz_split(&self) -> (Vec<usize>, Vec<usize>) {
        let h = self.heads;
        let vz = h.r() * h.d_v;
        let per = 2 * h.d_k + 2 * vz;
        let part = |off: usize, len: usize| -> Vec<usize> {
            (0..h.n_k)
                .flat_map(|g| (g * per + off)..(g * per + off + len))
                .collect()
        };
        let mut qkv = part(0, h.d_k);
        qkv.extend(part(h.d_k, h.d_k));
        qkv.extend(part(2 * h.d_k, vz));
        (qkv, part(2 * h.d_k + vz, vz))
    }

    fn gather(
        t: &SrcTensor,
        name: String,
        rows: Option<Vec<usize>>,
        cols: Option<Vec<usize>>,
    ) -> OutTensor {
        let mut shape = t.shape.clone();
        if let (Some(r), Some(first)) = (&rows, shape.first_mut()) {
            *first = r.len();
        }
        OutTensor {
            name,
            shape,
            src: Source::Gather {
                name: t.name.clone(),
                rows,
                cols,
            },
            ops: Vec::new(),
        }
    }

    /// A Gated DeltaNet tensor (`rest` after `linear_attn.`).
    fn delta_tensor(
        &self,
        t: &SrcTensor,
        b: usize,
        rest: &str,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        let h = self.heads;
        let blk = |n: &str| format!("blk.{b}.{n}");
        let heads_1d = || self.tiles().then(|| h.tiled(1));
        let o = match rest {
            "A_log" => {
                expect_numel(t, &[h.n_v])?;
                Self::gather(t, blk("ssm_a"), heads_1d(), None).with(Op::NegExp)
            }
            "dt_bias" | "dt_proj.bias" => {
                expect_numel(t, &[h.n_v])?;
                Self::gather(t, blk("ssm_dt.bias"), heads_1d(), None)
            }
            "conv1d.weight" => {
                let channels = 2 * h.n_k * h.d_k + h.n_v * h.d_v;
                let k = t.n_elements() / channels.max(1);
                expect_numel(t, &[channels, k])?;
                let mut o = Self::gather(
                    t,
                    blk("ssm_conv1d.weight"),
                    self.tiles().then(|| self.qkv_rows()),
                    None,
                );
                o.shape = vec![channels, k];
                o
            }
            "in_proj_qkv.weight" => Self::gather(
                t,
                blk("attn_qkv.weight"),
                self.tiles().then(|| self.qkv_rows()),
                None,
            ),
            "in_proj_z.weight" => Self::gather(
                t,
                blk("attn_gate.weight"),
                self.tiles().then(|| h.tiled(h.d_v)),
                None,
            ),
            "in_proj_a.weight" => Self::gather(t, blk("ssm_alpha.weight"), heads_1d(), None),
            "in_proj_b.weight" => Self::gather(t, blk("ssm_beta.weight"), heads_1d(), None),
            "in_proj_ba.weight" => OutTensor::one(blk("ssm_ba.weight"), &t.name, &t.shape),
            "in_proj_qkvz.weight" => {
                let (qkv, z) = self.qkvz_split();
                if t.shape.first() != Some(&(qkv.len() + z.len())) {
                    return Err(ConvertError::Shape {
                        name: t.name.clone(),
                        actual: t.shape.clone(),
                        expected: vec![qkv.len() + z.len(), t.shape.get(1).copied().unwrap_or(0)],
                    });
                }
                out.push(Self::gather(t, blk("attn_qkv.weight"), Some(qkv), None));
                Self::gather(t, blk("attn_gate.weight"), Some(z), None)
            }
            "norm.weight" => OutTensor::one(blk("ssm_norm.weight"), &t.name, &t.shape),
            "out_proj.weight" => Self::gather(
                t,
                blk("ssm_out.weight"),
                None,
                self.tiles().then(|| h.tiled(h.d_v)),
            ),
            _ => return Err(unused(t, self.arch())),
        };
        out.push(o);
        Ok(())
    }

    /// Experts: stacked once every expert of layer `b` has been seen, or
    /// split from a fused `gate_up_proj`.
    fn expert_tensor(
        &mut self,
        t: &SrcTensor,
        b: usize,
        prefix: &str,
        rest: &str,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        let blk = |n: &str| format!("blk.{b}.{n}.weight");
        match rest {
            "experts.gate_up_proj" | "experts.gate_up_proj.weight" => {
                let nd = t.shape.len();
                if nd != 3 || !t.shape[1].is_multiple_of(2) {
                    return Err(ConvertError::tensor(
                        &t.name,
                        format!("expected [n_expert, 2·n_ff, n_embd], found {:?}", t.shape),
                    ));
                }
                let n_ff = t.shape[1] / 2;
                for (part, n) in [(0, "ffn_gate_exps"), (1, "ffn_up_exps")] {
                    out.push(OutTensor {
                        name: blk(n),
                        shape: vec![t.shape[0], n_ff, t.shape[2]],
                        src: Source::SplitRows {
                            name: t.name.clone(),
                            part,
                            n_rows: n_ff,
                        },
                        ops: Vec::new(),
                    });
                }
                return Ok(());
            }
            "experts.down_proj" | "experts.down_proj.weight" => {
                out.push(OutTensor::one(blk("ffn_down_exps"), &t.name, &t.shape));
                return Ok(());
            }
            _ => {}
        }
        if !self.experts.add(b, &t.name, self.n_experts * 3) {
            return Ok(());
        }
        self.experts.take(b);
        for (w, n) in [
            ("down_proj", "ffn_down_exps"),
            ("gate_proj", "ffn_gate_exps"),
            ("up_proj", "ffn_up_exps"),
        ] {
            let names: Vec<String> = (0..self.n_experts)
                .map(|x| format!("{prefix}mlp.experts.{x}.{w}.weight"))
                .collect();
            let first = self.ctx.ck.req(&names[0])?;
            let mut shape = vec![self.n_experts];
            shape.extend(&first.shape);
            out.push(OutTensor {
                name: blk(n),
                shape,
                src: Source::Stack(names),
                ops: Vec::new(),
            });
        }
        Ok(())
    }
}

fn unused(t: &SrcTensor, arch: &str) -> ConvertError {
    ConvertError::UnusedTensor {
        name: t.name.clone(),
        arch: arch.to_string(),
    }
}

/// The checkpoint name without a multimodal wrapper's `language_model.`.
fn text_name(name: &str) -> String {
    name.replacen("model.language_model.", "model.", 1)
}

impl Arch for GatedDeltaHybrid<'_> {
    fn arch(&self) -> &str {
        match self.family {
            Family::Qwen35 => "qwen35",
            Family::Qwen35Moe => "qwen35moe",
            Family::Qwen3Next => "qwen3next",
            Family::Qwen4Exp => "qwen4exp",
        }
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        let c = self.ctx.cfg;
        let h = self.heads;
        text_params(
            self.ctx,
            kv,
            self.n_blocks(),
            TextOpts {
                moe: true,
                head_dim: true,
            },
        )?;
        // Qwen2-MoE's additions.
        if let Some(n) = c.uint(&["moe_intermediate_size"])? {
            kv.u32("expert_feed_forward_length", n)?;
        }
        if let Some(n) = c.uint(&["shared_expert_intermediate_size"])? {
            kv.u32("expert_shared_feed_forward_length", n)?;
        }
        if self.n_mtp > 0 {
            kv.u32("nextn_predict_layers", self.n_mtp as u64)?;
        }
        kv.u32("ssm.conv_kernel", c.req_uint(&["linear_conv_kernel_dim"])?)?;
        kv.u32("ssm.state_size", h.d_k as u64)?;
        kv.u32("ssm.group_count", h.n_k as u64)?;
        kv.u32("ssm.time_step_rank", h.n_v as u64)?;
        kv.u32("ssm.inner_size", (h.d_v * h.n_v) as u64)?;
        if c.contains("layer_types") {
            // The MTP blocks are attention layers.
            let mut rec = self.recurrent.clone();
            rec.resize(self.n_blocks(), false);
            kv.bools("attention.recurrent_layers", &rec);
        }
        kv.u32(
            "full_attention_interval",
            c.uint(&["full_attention_interval"])?.unwrap_or(4),
        )?;
        let rp = rope_params(c);
        let head_dim = match c.uint(&["head_dim"])? {
            Some(d) => d,
            None => c.req_uint(&["hidden_size"])? / c.req_uint(&["num_attention_heads"])?.max(1),
        };
        let partial = rp
            .get("partial_rotary_factor")
            .and_then(crate::config::as_f64)
            .or(c.float(&["partial_rotary_factor"])?)
            .unwrap_or(0.25);
        kv.u32("rope.dimension_count", (head_dim as f64 * partial) as u64)?;
        // llama.cpp's Qwen3.5 loaders require the sections; transformers'
        // default is [11, 11, 10].
        if self.family != Family::Qwen3Next && !rp.contains_key("mrope_section") {
            kv.i32s("rope.dimension_sections", &[11, 11, 10, 0])?;
        }
        if let Some(q4) = &self.q4 {
            q4.params(self.ctx, kv, &self.recurrent)?;
        }
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &SrcTensor,
        bid: Option<usize>,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        let name = text_name(&t.name);
        if name.contains("visual.") {
            return Ok(());
        }
        let zero_centred =
            name.ends_with("norm.weight") && !name.ends_with("linear_attn.norm.weight");
        let plus_one = |o: OutTensor| {
            if zero_centred {
                o.with(Op::Add(1.0))
            } else {
                o
            }
        };
        // The MTP block: its own tensors, then a decoder layer at block n + j.
        let mut bid = bid;
        if let Some(rest) = mtp_name(&t.name) {
            if self.n_mtp == 0 {
                return Ok(());
            }
            let n = self.recurrent.len();
            let own = match rest {
                "fc.weight" => Some("nextn.eh_proj.weight"),
                "pre_fc_norm_embedding.weight" => Some("nextn.enorm.weight"),
                "pre_fc_norm_hidden.weight" => Some("nextn.hnorm.weight"),
                "norm.weight" => Some("nextn.shared_head_norm.weight"),
                _ => None,
            };
            if let Some(gg) = own {
                let o = OutTensor::one(format!("blk.{n}.{gg}"), &t.name, &t.shape);
                out.push(if gg.ends_with("norm.weight") {
                    o.with(Op::Add(1.0))
                } else {
                    o
                });
                return Ok(());
            }
            let j = rest
                .strip_prefix("layers.")
                .and_then(|r| r.split('.').next())
                .and_then(|i| i.parse::<usize>().ok())
                .filter(|&j| j < self.n_mtp)
                .ok_or_else(|| unused(t, self.arch()))?;
            bid = Some(n + j);
        }
        if let Some(o) = self.q4.as_ref().and_then(|q4| q4.global(t, &name)) {
            out.push(o);
            return Ok(());
        }
        match name.as_str() {
            "model.embed_tokens.weight" => {
                out.push(OutTensor::one("token_embd.weight", &t.name, &t.shape));
                return Ok(());
            }
            "model.norm.weight" => {
                out.push(plus_one(OutTensor::one(
                    "output_norm.weight",
                    &t.name,
                    &t.shape,
                )));
                return Ok(());
            }
            "lm_head.weight" => {
                out.push(OutTensor::one("output.weight", &t.name, &t.shape));
                return Ok(());
            }
            _ => {}
        }
        let b = bid
            .or_else(|| block_id(&name))
            .ok_or_else(|| unused(t, self.arch()))?;
        if b >= self.n_blocks() {
            return Err(unused(t, self.arch()));
        }
        // A trunk layer's `layers.{b}.`, or an MTP layer's `layers.{j}.`.
        let marker = match b.checked_sub(self.recurrent.len()) {
            Some(j) => format!("mtp.layers.{j}."),
            None => format!("layers.{b}."),
        };
        let at = t.name.find(&marker).ok_or_else(|| unused(t, self.arch()))? + marker.len();
        let (prefix, rest) = t.name.split_at(at);
        if let Some(q4) = &mut self.q4 {
            if q4.tensor(self.ctx, t, b, rest, out)? {
                return Ok(());
            }
        }
        if let Some(r) = rest.strip_prefix("linear_attn.") {
            if b >= self.recurrent.len() {
                return Err(unused(t, self.arch()));
            }
            return self.delta_tensor(t, b, r, out);
        }
        if let Some(r) = rest.strip_prefix("mlp.") {
            if r.starts_with("experts.") {
                let prefix = prefix.to_string();
                return self.expert_tensor(t, b, &prefix, r, out);
            }
        }
        let gg = match rest {
            "input_layernorm.weight" => "attn_norm.weight",
            "post_attention_layernorm.weight" => "post_attention_norm.weight",
            "self_attn.q_proj.weight" => "attn_q.weight",
            "self_attn.k_proj.weight" => "attn_k.weight",
            "self_attn.v_proj.weight" => "attn_v.weight",
            "self_attn.o_proj.weight" => "attn_output.weight",
            "self_attn.q_norm.weight" => "attn_q_norm.weight",
            "self_attn.k_norm.weight" => "attn_k_norm.weight",
            "mlp.gate_proj.weight" => "ffn_gate.weight",
            "mlp.up_proj.weight" => "ffn_up.weight",
            "mlp.down_proj.weight" => "ffn_down.weight",
            "mlp.gate.weight" => "ffn_gate_inp.weight",
            "mlp.shared_expert.gate_proj.weight" => "ffn_gate_shexp.weight",
            "mlp.shared_expert.up_proj.weight" => "ffn_up_shexp.weight",
            "mlp.shared_expert.down_proj.weight" => "ffn_down_shexp.weight",
            "mlp.shared_expert_gate.weight" => "ffn_gate_inp_shexp.weight",
            _ => return Err(unused(t, self.arch())),
        };
        out.push(plus_one(OutTensor::one(
            format!("blk.{b}.{gg}"),
            &t.name,
            &t.shape,
        )));
        Ok(())
    }

    fn finish(&mut self, _out: &mut Vec<OutTensor>) -> Result<()> {
        if let Some(q4) = &self.q4 {
            q4.finish()?;
        }
        self.experts.check_done()
    }

    fn required(&self) -> Vec<String> {
        const DELTA: &[&str] = &[
            "attn_norm.weight",
            "ssm_a",
            "ssm_conv1d.weight",
            "ssm_dt.bias",
            "attn_qkv.weight",
            "attn_gate.weight",
            "ssm_norm.weight",
            "ssm_out.weight",
            "post_attention_norm.weight",
        ];
        const ATTN: &[&str] = &[
            "attn_norm.weight",
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "attn_q_norm.weight",
            "attn_k_norm.weight",
            "post_attention_norm.weight",
        ];
        const NEXTN: &[&str] = &[
            "nextn.eh_proj.weight",
            "nextn.enorm.weight",
            "nextn.hnorm.weight",
        ];
        // Qwen4-Exp: hyper-connections in place of the norms, an indexer
        // beside each attention layer.
        const Q4_DELTA: &[&str] = &[
            "hc_attn_norm.weight",
            "hc_attn_down.weight",
            "hc_attn_up.weight",
            "hc_attn_inject.weight",
            "ssm_a",
            "ssm_conv1d.weight",
            "ssm_dt.bias",
            "attn_qkv.weight",
            "attn_gate.weight",
            "ssm_norm.weight",
            "ssm_out.weight",
            "hc_ffn_norm.weight",
            "hc_ffn_down.weight",
            "hc_ffn_up.weight",
            "hc_ffn_inject.weight",
        ];
        const Q4_ATTN: &[&str] = &[
            "hc_attn_norm.weight",
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "attn_output.weight",
            "attn_q_norm.weight",
            "attn_k_norm.weight",
            "indexer.q_proj.weight",
            "indexer.k_proj.weight",
            "indexer.q_norm.weight",
            "indexer.k_norm.weight",
            "hc_ffn_norm.weight",
        ];
        if self.q4.is_some() {
            let mut v = super::required_names(
                (self.recurrent.iter().enumerate())
                    .map(|(b, &r)| (b, if r { Q4_DELTA } else { Q4_ATTN })),
            );
            v.retain(|n| n != "output_norm.weight");
            v.extend(
                [
                    "output_hc_norm.weight",
                    "output_hc_down.weight",
                    "output_hc_up.weight",
                ]
                .map(String::from),
            );
            return v;
        }
        let n = self.recurrent.len();
        let mtp = (n..self.n_blocks()).flat_map(|b| [(b, ATTN), (b, NEXTN)]);
        super::required_names(
            self.recurrent
                .iter()
                .enumerate()
                .map(|(b, &r)| (b, if r { DELTA } else { ATTN }))
                .chain(mtp),
        )
    }

    fn vocab(&self) -> VocabSpec {
        VocabSpec {
            style: VocabStyle::BpeFirst,
            pad_multiple: 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiled_order_interleaves_key_groups() {
        // Hk = 2, r = 2: checkpoint heads [g0v0, g0v1, g1v0, g1v1] → tiled
        // [g0v0, g1v0, g0v1, g1v1].
        let h = Heads {
            n_k: 2,
            d_k: 1,
            n_v: 4,
            d_v: 1,
        };
        assert_eq!(h.tiled(1), [0, 2, 1, 3]);
        assert_eq!(h.tiled(2), [0, 1, 4, 5, 2, 3, 6, 7]);
    }
}
