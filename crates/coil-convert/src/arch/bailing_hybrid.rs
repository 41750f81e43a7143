//! Bailing-Hybrid (`BailingHybridForCausalLM`, transformers 5.25; the
//! released Ling 3.0 checkpoints' `BailingMoeV3ForCausalLM`) → `bailingmoe3`,
//! as llama.cpp's converter writes it from the released layout:
//! - KDA layers and MLA layers: the last of every `layer_group_size`
//!   (transformers' rule, or its `layer_types` where the config lists them)
//!   is MLA; `attention.head_count_kv` per layer: 1 for MLA (one latent "KV
//!   head"), 0 for KDA;
//! - KDA: `kda.head_dim` (the config's `head_dim`, which transformers reads
//!   as the KDA head width), `kda.safe_gate`, `kda.gate_lower_bound`; the
//!   convs `{C, 1, K}` as `{1, C, 1, K}`; `A_log` → `ssm_a` = exp(A_log) as
//!   `{H, 1}` (the bounded gate multiplies by it); `dt_bias` →
//!   `ssm_dt.bias`; the full-rank `f_proj` → `ssm_f_a`, `g_proj` →
//!   `ssm_g_a`;
//! - MLA: `kv_b_proj` split per head into `attn_k_b` / `attn_v_b` (as for
//!   Kimi-Linear); the per-head output gate `g_proj` → `attn_gate`;
//! - experts `gate_proj` / `up_proj` / `down_proj` stacked; the SwiGLU
//!   clipping limits per layer as `swiglu_clamp_exp` / `swiglu_clamp_shexp`.
//!
//! The multi-token-prediction layers after the trunk (`num_nextn_predict_layers`)
//! are not written: coil's forward pass does not use them.

use super::kimi_linear::split_kv_b;
use super::llama::{text_params, TextOpts};
use super::{block_id, map_name, Arch, Ctx, ExpertBuf, Kv, VocabSpec, VocabStyle};
use crate::config::check_range;
use crate::error::{ConvertError, Result};
use crate::plan::{Op, OutTensor, Source};
use crate::safetensors_src::SrcTensor;

pub(crate) struct BailingHybrid<'a> {
    ctx: &'a Ctx<'a>,
    /// Per layer: MLA (else KDA).
    mla: Vec<bool>,
    n_dense: usize,
    /// Multi-token-prediction layers after the trunk (not written).
    n_mtp: usize,
    n_experts: usize,
    n_head: usize,
    d_nope: usize,
    d_v: usize,
    experts: ExpertBuf,
}

/// Which layers are MLA layers: `layer_types` where listed, else the last
/// of every `layer_group_size`.
fn mla_layers(ctx: &Ctx, n_layer: usize) -> Result<Vec<bool>> {
    match ctx.cfg.strs("layer_types")? {
        Some(t) if t.len() == n_layer => t
            .iter()
            .map(|t| match t.as_str() {
                "full_attention" => Ok(true),
                "linear_attention" => Ok(false),
                other => Err(ConvertError::config(
                    "layer_types",
                    format!("unknown layer type {other:?}"),
                )),
            })
            .collect(),
        Some(t) => Err(ConvertError::config(
            "layer_types",
            format!("{} entries for {n_layer} layers", t.len()),
        )),
        None => {
            let g = ctx.cfg.uint_or(&["layer_group_size"], 6)? as usize;
            check_range("layer_group_size", g as u64, 1, 4096)?;
            Ok((0..n_layer).map(|i| (i + 1) % g == 0).collect())
        }
    }
}

/// `dense` for the first `first_k_dense_replace` layers, then `sparse`: the
/// only pattern the GGUF layout (`leading_dense_block_count`) can hold.
fn n_dense_layers(ctx: &Ctx, n_layer: usize) -> Result<usize> {
    let k = ctx.cfg.uint_or(&["first_k_dense_replace"], 2)? as usize;
    if let Some(t) = ctx.cfg.strs("mlp_layer_types")? {
        let first_k = (0..n_layer).map(|i| if i < k { "dense" } else { "sparse" });
        if t.len() != n_layer || !t.iter().map(String::as_str).eq(first_k) {
            return Err(ConvertError::config(
                "mlp_layer_types",
                format!(
                    "{t:?} is not {k} dense layers then sparse ones (first_k_dense_replace), \
                     the only pattern bailingmoe3 files hold"
                ),
            ));
        }
    }
    Ok(k.min(n_layer))
}

impl<'a> BailingHybrid<'a> {
    pub fn new(ctx: &'a Ctx<'a>) -> Result<Self> {
        let c = ctx.cfg;
        let n_layer = c.req_uint(&["num_hidden_layers"])? as usize;
        check_range("num_hidden_layers", n_layer as u64, 1, 4096)?;
        if c.bool("kda_safe_gate") == Some(false) {
            return Err(ConvertError::config(
                "kda_safe_gate",
                "false: bailingmoe3 files hold only the bounded (\"safe\") KDA gate",
            ));
        }
        if c.bool("no_kda_lora") == Some(false) {
            return Err(ConvertError::config(
                "no_kda_lora",
                "false: low-rank KDA gates are not part of bailingmoe3 files",
            ));
        }
        match c.str("gated_attention_proj_granularity_type") {
            None | Some("head_wise") => {}
            Some(other) => {
                return Err(ConvertError::config(
                    "gated_attention_proj_granularity_type",
                    format!("{other:?}: bailingmoe3 files hold head-wise attention gates only"),
                ))
            }
        }
        let rp = super::llama::rope_params(c);
        match rp
            .get("rope_type")
            .or_else(|| rp.get("type"))
            .and_then(|v| v.as_str())
        {
            None | Some("default") => {}
            Some(other) => {
                return Err(ConvertError::config(
                    "rope_parameters.rope_type",
                    format!("{other:?}: only the default RoPE is supported for this model"),
                ))
            }
        }
        Ok(BailingHybrid {
            ctx,
            mla: mla_layers(ctx, n_layer)?,
            n_dense: n_dense_layers(ctx, n_layer)?,
            n_mtp: c.uint_or(&["num_nextn_predict_layers", "num_mtp_layers"], 0)? as usize,
            n_experts: c.req_uint(&["num_experts", "num_local_experts"])? as usize,
            n_head: c.req_uint(&["num_attention_heads"])? as usize,
            d_nope: c.req_uint(&["qk_nope_head_dim"])? as usize,
            d_v: c.req_uint(&["v_head_dim"])? as usize,
            experts: ExpertBuf::default(),
        })
    }

    /// Experts: stacked once every expert of layer `b` has been seen.
    fn expert(&mut self, t: &SrcTensor, b: usize, out: &mut Vec<OutTensor>) -> Result<()> {
        if !self.experts.add(b, &t.name, self.n_experts * 3) {
            return Ok(());
        }
        self.experts.take(b);
        for (w, gg) in [
            ("down_proj", "ffn_down_exps"),
            ("gate_proj", "ffn_gate_exps"),
            ("up_proj", "ffn_up_exps"),
        ] {
            let names: Vec<String> = (0..self.n_experts)
                .map(|x| format!("model.layers.{b}.mlp.experts.{x}.{w}.weight"))
                .collect();
            let first = self.ctx.ck.req(&names[0])?;
            let mut shape = vec![self.n_experts];
            shape.extend(&first.shape);
            out.push(OutTensor {
                name: format!("blk.{b}.{gg}.weight"),
                shape,
                src: Source::Stack(names),
                ops: Vec::new(),
            });
        }
        Ok(())
    }

    /// The per-layer clipping limits `key` (0 where absent or null).
    fn limits(&self, key: &str) -> Result<Option<Vec<f64>>> {
        let n = self.mla.len();
        let Some(v) = self.ctx.cfg.get(key) else {
            return Ok(None);
        };
        let items = v
            .as_array()
            .ok_or_else(|| ConvertError::config(key, format!("expected a list, found {v}")))?;
        if items.len() != n {
            return Err(ConvertError::config(
                key,
                format!("{} entries for {n} layers", items.len()),
            ));
        }
        items
            .iter()
            .map(|x| match x {
                serde_json::Value::Null => Ok(0.0),
                x => crate::config::as_f64(x)
                    .filter(|f| f.is_finite() && *f >= 0.0)
                    .ok_or_else(|| {
                        ConvertError::config(key, format!("{x} is not a limit (0 = none)"))
                    }),
            })
            .collect::<Result<Vec<f64>>>()
            .map(Some)
    }
}

/// GGUF name (after `blk.N.`) of a Bailing-Hybrid layer tensor (the
/// released checkpoint's names), given whether the layer is MLA.
fn layer_name(rest: &str, mla: bool) -> Option<&'static str> {
    Some(match rest {
        "attention.q_proj.weight" => "attn_q.weight",
        "attention.k_proj.weight" => "attn_k.weight",
        "attention.v_proj.weight" => "attn_v.weight",
        "attention.dense.weight" => "attn_output.weight",
        "attention.q_conv1d.weight" => "ssm_conv1d_q.weight",
        "attention.k_conv1d.weight" => "ssm_conv1d_k.weight",
        "attention.v_conv1d.weight" => "ssm_conv1d_v.weight",
        "attention.A_log" => "ssm_a",
        "attention.dt_bias" => "ssm_dt.bias",
        "attention.f_proj.weight" if !mla => "ssm_f_a.weight",
        "attention.g_proj.weight" if mla => "attn_gate.weight",
        "attention.g_proj.weight" => "ssm_g_a.weight",
        "attention.b_proj.weight" => "ssm_beta.weight",
        "attention.o_norm.weight" => "ssm_norm.weight",
        "attention.q_a_proj.weight" => "attn_q_a.weight",
        "attention.q_a_layernorm.weight" => "attn_q_a_norm.weight",
        "attention.q_b_proj.weight" => "attn_q_b.weight",
        "attention.kv_a_proj_with_mqa.weight" => "attn_kv_a_mqa.weight",
        "attention.kv_a_layernorm.weight" => "attn_kv_a_norm.weight",
        "mlp.gate.weight" => "ffn_gate_inp.weight",
        "mlp.gate.expert_bias" => "exp_probs_b.bias",
        "mlp.shared_experts.gate_proj.weight" => "ffn_gate_shexp.weight",
        "mlp.shared_experts.up_proj.weight" => "ffn_up_shexp.weight",
        "mlp.shared_experts.down_proj.weight" => "ffn_down_shexp.weight",
        _ => return None,
    })
}

impl Arch for BailingHybrid<'_> {
    fn arch(&self) -> &str {
        "bailingmoe3"
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        let c = self.ctx.cfg;
        text_params(
            self.ctx,
            kv,
            self.mla.len(),
            TextOpts {
                moe: true,
                head_dim: true,
            },
        )?;
        // (the scalar text_params wrote for the latent "KV head" becomes the
        // per-layer list, in the same place)
        let kv_heads: Vec<u64> = self.mla.iter().map(|&m| u64::from(m)).collect();
        kv.i32s("attention.head_count_kv", &kv_heads)?;
        kv.u32("vocab_size", c.req_uint(&["vocab_size"])?)?;
        kv.u32(
            "ssm.conv_kernel",
            c.uint_or(&["short_conv_kernel_size"], 4)?,
        )?;
        kv.u32("kda.head_dim", c.uint_or(&["head_dim"], 128)?)?;
        kv.bool("kda.safe_gate", true);
        let lower = c.float0(&["kda_lower_bound"])?.unwrap_or(-5.0);
        if lower.is_nan() || lower >= 0.0 {
            return Err(ConvertError::config(
                "kda_lower_bound",
                format!("{lower} is not negative"),
            ));
        }
        kv.f32("kda.gate_lower_bound", lower);
        match c.get("q_lora_rank") {
            None | Some(serde_json::Value::Null) => {}
            Some(_) => kv.u32("attention.q_lora_rank", c.req_uint(&["q_lora_rank"])?)?,
        }
        let r = c.req_uint(&["kv_lora_rank"])?;
        kv.u32("attention.kv_lora_rank", r)?;
        let rope = c.req_uint(&["qk_rope_head_dim"])?;
        kv.u32("rope.dimension_count", rope)?;
        kv.u32("attention.key_length", r + rope)?;
        kv.u32("attention.key_length_mla", self.d_nope as u64 + rope)?;
        kv.u32("attention.value_length_mla", self.d_v as u64)?;
        let ff = c.req_uint(&["moe_intermediate_size"])?;
        kv.u32("expert_feed_forward_length", ff)?;
        let n_shared = c.uint_or(&["num_shared_experts", "n_shared_experts"], 1)?;
        let shared_ff = match c.uint0(&["moe_shared_expert_intermediate_size"])? {
            Some(s) => s,
            None => ff * n_shared,
        };
        kv.u32("expert_shared_feed_forward_length", shared_ff)?;
        kv.u32("expert_shared_count", n_shared)?;
        kv.u32("leading_dense_block_count", self.n_dense as u64)?;
        kv.f32(
            "expert_weights_scale",
            c.float0(&["routed_scaling_factor"])?.unwrap_or(2.5),
        );
        kv.bool(
            "expert_weights_norm",
            c.bool("norm_topk_prob")
                .or_else(|| c.bool("moe_renormalize"))
                .unwrap_or(true),
        );
        for (key, gguf) in [
            ("expert_swiglu_limit_list", "swiglu_clamp_exp"),
            ("share_expert_swiglu_limit_list", "swiglu_clamp_shexp"),
        ] {
            if let Some(v) = self.limits(key)? {
                kv.f32s(gguf, &v);
            }
        }
        // transformers' router is always sigmoid; llama.cpp's converter
        // writes the function only where the config names it.
        if !kv
            .md
            .contains_key(&format!("{}.expert_gating_func", kv.arch))
        {
            kv.u32("expert_gating_func", 2)?;
        }
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &SrcTensor,
        bid: Option<usize>,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        let b = bid.or_else(|| block_id(&t.name));
        if let Some(b) = b {
            if b >= self.mla.len() + self.n_mtp {
                return Err(ConvertError::UnusedTensor {
                    name: t.name.clone(),
                    arch: self.arch().into(),
                });
            }
            if b >= self.mla.len() {
                // a multi-token-prediction layer
                return Ok(());
            }
            if t.name.contains(".mlp.experts.") {
                return self.expert(t, b, out);
            }
            if t.name.ends_with(".attention.kv_b_proj.weight") {
                return split_kv_b(t, b, self.n_head, self.d_nope, self.d_v, out);
            }
        }
        let name = match t.name.as_str() {
            "model.word_embeddings.weight" => "token_embd.weight".to_string(),
            _ => {
                let rest = super::layer_rest(&t.name);
                match (
                    b,
                    rest.and_then(|r| layer_name(r, b.is_some_and(|b| self.mla[b]))),
                ) {
                    (Some(b), Some(n)) => format!("blk.{b}.{n}"),
                    _ => map_name(&t.name, b, self.arch())?,
                }
            }
        };
        let mut o = OutTensor::one(name.clone(), &t.name, &t.shape);
        if name.contains(".ssm_conv1d_") {
            // {C, 1, K} or {C, K} → {1, C, 1, K}
            let (ch, k) = match t.shape[..] {
                [c, 1, k] | [c, k] => (c, k),
                _ => {
                    return Err(ConvertError::tensor(
                        &t.name,
                        format!("expected [channels, 1, kernel], found {:?}", t.shape),
                    ))
                }
            };
            o.shape = vec![1, ch, 1, k];
        } else if name.ends_with(".ssm_a") {
            // exp(A_log) as {H, 1}
            o.shape = vec![t.n_elements(), 1];
            o = o.with(Op::Exp);
        }
        out.push(o);
        Ok(())
    }

    fn finish(&mut self, _out: &mut Vec<OutTensor>) -> Result<()> {
        self.experts.check_done()
    }

    fn required(&self) -> Vec<String> {
        const KDA: &[&str] = &[
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "ssm_conv1d_q.weight",
            "ssm_conv1d_k.weight",
            "ssm_conv1d_v.weight",
            "ssm_f_a.weight",
            "ssm_beta.weight",
            "ssm_a",
            "ssm_dt.bias",
            "ssm_g_a.weight",
            "ssm_norm.weight",
            "attn_output.weight",
        ];
        const MLA: &[&str] = &[
            "attn_kv_a_mqa.weight",
            "attn_kv_a_norm.weight",
            "attn_k_b.weight",
            "attn_v_b.weight",
            "attn_gate.weight",
            "attn_output.weight",
        ];
        const DENSE: &[&str] = &["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"];
        const MOE: &[&str] = &[
            "ffn_gate_inp.weight",
            "ffn_gate_exps.weight",
            "ffn_up_exps.weight",
            "ffn_down_exps.weight",
            "exp_probs_b.bias",
            "ffn_gate_shexp.weight",
            "ffn_up_shexp.weight",
            "ffn_down_shexp.weight",
        ];
        let mut v = super::required_names(
            self.mla
                .iter()
                .enumerate()
                .map(|(b, &m)| (b, if m { MLA } else { KDA })),
        );
        for b in 0..self.mla.len() {
            let ffn = if b < self.n_dense { DENSE } else { MOE };
            v.extend(
                ["attn_norm.weight", "ffn_norm.weight"]
                    .iter()
                    .chain(ffn)
                    .map(|s| format!("blk.{b}.{s}")),
            );
        }
        v
    }

    fn vocab(&self) -> VocabSpec {
        VocabSpec {
            style: VocabStyle::BpeFirst,
            pad_multiple: 1,
        }
    }
}
