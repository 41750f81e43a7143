//! Kimi-Linear (`KimiLinearForCausalLM`) → `kimi-linear`: Kimi Delta
//! Attention layers and multi-head latent attention layers
//! (`linear_attn_config.full_attn_layers`, 1-based), a dense first
//! feed-forward (`first_k_dense_replace`), then experts with a shared
//! expert. From the released checkpoint's layout, as llama.cpp's converter
//! writes it:
//! - `attention.head_count_kv` per layer: 1 for MLA (one latent "KV head"),
//!   0 for KDA; `attention.key_length` the cached row `kv_lora_rank +
//!   qk_rope_head_dim`, `key_length_mla` / `value_length_mla` the heads';
//! - the KDA convs `{C, 1, K}` (or `{C, K}`) as `{1, C, 1, K}`; `A_log` →
//!   `ssm_a` = −exp(A_log); `dt_bias` → `ssm_dt.bias`;
//! - `kv_b_proj` split per head into `attn_k_b` (the no-RoPE key rows,
//!   transposed: `[H, r, d_nope]`) and `attn_v_b` (`[H, d_v, r]`);
//! - experts `w1` / `w2` / `w3` stacked into `ffn_gate_exps` /
//!   `ffn_down_exps` / `ffn_up_exps`.
//!
//! The query LoRA of checkpoints that have one (`q_lora_rank`) is written
//! as llama.cpp's converter writes it (`attn_q_a`, `attn_q_a_norm`,
//! `attn_q_b`); coil runs it, llama.cpp's runtime does not.

use super::llama::{text_params, TextOpts};
use super::{block_id, map_name, Arch, Ctx, ExpertBuf, Kv, VocabSpec, VocabStyle};
use crate::config::check_range;
use crate::error::{ConvertError, Result};
use crate::plan::{Op, OutTensor, Source};
use crate::safetensors_src::SrcTensor;

pub(crate) struct KimiLinear<'a> {
    ctx: &'a Ctx<'a>,
    /// Per layer: MLA (else KDA).
    mla: Vec<bool>,
    n_dense: usize,
    n_experts: usize,
    /// Heads `kv_b_proj` is split into, and their widths.
    n_head_kv: usize,
    d_nope: usize,
    d_v: usize,
    experts: ExpertBuf,
}

/// The `linear_attn_config` entry `key`.
fn linear_cfg<'c>(ctx: &'c Ctx, key: &str) -> Option<&'c serde_json::Value> {
    ctx.cfg.get("linear_attn_config")?.get(key)
}

/// Which layers are MLA layers: `linear_attn_config.full_attn_layers`
/// (1-based), else transformers' `layer_types`.
fn mla_layers(ctx: &Ctx, n_layer: usize) -> Result<Vec<bool>> {
    let field = "linear_attn_config.full_attn_layers";
    if let Some(v) = linear_cfg(ctx, "full_attn_layers") {
        let items = v
            .as_array()
            .ok_or_else(|| ConvertError::config(field, format!("expected a list, found {v}")))?;
        let mut mla = vec![false; n_layer];
        for x in items {
            match x.as_u64() {
                Some(i) if (1..=n_layer as u64).contains(&i) => mla[i as usize - 1] = true,
                _ => {
                    return Err(ConvertError::config(
                        field,
                        format!("{x} is not a layer number in 1..={n_layer}"),
                    ))
                }
            }
        }
        return Ok(mla);
    }
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
        None => Err(ConvertError::config(
            field,
            "missing: neither linear_attn_config.full_attn_layers nor layer_types",
        )),
    }
}

impl<'a> KimiLinear<'a> {
    pub fn new(ctx: &'a Ctx<'a>) -> Result<Self> {
        let c = ctx.cfg;
        let n_layer = c.req_uint(&["num_hidden_layers"])? as usize;
        check_range("num_hidden_layers", n_layer as u64, 1, 4096)?;
        let mla = mla_layers(ctx, n_layer)?;
        let n_head = c.req_uint(&["num_attention_heads"])?;
        if let Some(h) = linear_cfg(ctx, "num_heads").and_then(|v| v.as_u64()) {
            if h != n_head {
                return Err(ConvertError::config(
                    "linear_attn_config.num_heads",
                    format!(
                        "{h} KDA heads beside {n_head} attention heads: the kimi-linear GGUF \
                         layout has one head count for both"
                    ),
                ));
            }
        }
        let n_dense = c.uint0(&["first_k_dense_replace"])?.ok_or_else(|| {
            ConvertError::config("first_k_dense_replace", "missing in config.json")
        })? as usize;
        let d_nope = c.req_uint(&["qk_nope_head_dim"])? as usize;
        let d_v = c.req_uint(&["v_head_dim"])? as usize;
        let n_head_kv = c.req_uint(&["num_key_value_heads"])? as usize;
        Ok(KimiLinear {
            ctx,
            mla,
            n_dense,
            n_experts: c.req_uint(&["num_experts", "num_local_experts"])? as usize,
            n_head_kv,
            d_nope,
            d_v,
            experts: ExpertBuf::default(),
        })
    }

    /// `q_lora_rank`, where the query has a LoRA (absent or null: none).
    fn q_lora_rank(&self) -> Result<Option<u64>> {
        match self.ctx.cfg.get("q_lora_rank") {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(_) => self.ctx.cfg.uint(&["q_lora_rank"]),
        }
    }

    /// Experts: stacked once every expert of layer `b` has been seen.
    fn expert(&mut self, t: &SrcTensor, b: usize, out: &mut Vec<OutTensor>) -> Result<()> {
        if !self.experts.add(b, &t.name, self.n_experts * 3) {
            return Ok(());
        }
        self.experts.take(b);
        for (w, gg) in [
            ("w1", "ffn_gate_exps"),
            ("w2", "ffn_down_exps"),
            ("w3", "ffn_up_exps"),
        ] {
            let names: Vec<String> = (0..self.n_experts)
                .map(|x| format!("model.layers.{b}.block_sparse_moe.experts.{x}.{w}.weight"))
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
}

/// `kv_b_proj` (`[H·(d_nope + d_v), r]`) of layer `b` split into
/// `attn_k_b` (the no-RoPE key rows, transposed: `[H, r, d_nope]`) and
/// `attn_v_b` (`[H, d_v, r]`).
pub(super) fn split_kv_b(
    t: &SrcTensor,
    b: usize,
    h: usize,
    nope: usize,
    dv: usize,
    out: &mut Vec<OutTensor>,
) -> Result<()> {
    let per = nope + dv;
    if t.shape.len() != 2 || t.shape[0] != h * per {
        return Err(ConvertError::Shape {
            name: t.name.clone(),
            actual: t.shape.clone(),
            expected: vec![h * per, t.shape.get(1).copied().unwrap_or(0)],
        });
    }
    let r = t.shape[1];
    out.push(OutTensor {
        name: format!("blk.{b}.attn_k_b.weight"),
        shape: vec![h, r, nope],
        src: Source::HeadRowsTransposed {
            name: t.name.clone(),
            n_head: h,
            first: 0,
            n_rows: nope,
        },
        ops: Vec::new(),
    });
    out.push(OutTensor {
        name: format!("blk.{b}.attn_v_b.weight"),
        shape: vec![h, dv, r],
        src: Source::Gather {
            name: t.name.clone(),
            rows: Some((0..h).flat_map(|x| x * per + nope..(x + 1) * per).collect()),
            cols: None,
        },
        ops: Vec::new(),
    });
    Ok(())
}

/// GGUF name (after `blk.N.`) of a Kimi-Linear layer tensor.
fn kimi_layer_name(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "self_attn.q_conv1d.weight" => "ssm_conv1d_q.weight",
        "self_attn.k_conv1d.weight" => "ssm_conv1d_k.weight",
        "self_attn.v_conv1d.weight" => "ssm_conv1d_v.weight",
        "self_attn.A_log" => "ssm_a",
        "self_attn.dt_bias" => "ssm_dt.bias",
        "self_attn.f_a_proj.weight" => "ssm_f_a.weight",
        "self_attn.f_b_proj.weight" => "ssm_f_b.weight",
        "self_attn.g_a_proj.weight" => "ssm_g_a.weight",
        "self_attn.g_b_proj.weight" => "ssm_g_b.weight",
        "self_attn.b_proj.weight" => "ssm_beta.weight",
        "self_attn.o_norm.weight" => "ssm_norm.weight",
        "self_attn.q_a_proj.weight" => "attn_q_a.weight",
        "self_attn.q_a_layernorm.weight" => "attn_q_a_norm.weight",
        "self_attn.q_b_proj.weight" => "attn_q_b.weight",
        "self_attn.kv_a_proj_with_mqa.weight" => "attn_kv_a_mqa.weight",
        "self_attn.kv_a_layernorm.weight" => "attn_kv_a_norm.weight",
        "block_sparse_moe.gate.weight" => "ffn_gate_inp.weight",
        "block_sparse_moe.gate.e_score_correction_bias" => "exp_probs_b.bias",
        "block_sparse_moe.shared_experts.gate_proj.weight" => "ffn_gate_shexp.weight",
        "block_sparse_moe.shared_experts.up_proj.weight" => "ffn_up_shexp.weight",
        "block_sparse_moe.shared_experts.down_proj.weight" => "ffn_down_shexp.weight",
        _ => return None,
    })
}

impl Arch for KimiLinear<'_> {
    fn arch(&self) -> &str {
        "kimi-linear"
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
        // (the scalar 1 text_params wrote for the latent "KV head" becomes
        // the per-layer list, in the same place)
        let kv_heads: Vec<u64> = self.mla.iter().map(|&m| u64::from(m)).collect();
        kv.i32s("attention.head_count_kv", &kv_heads)?;
        kv.u32("vocab_size", c.req_uint(&["vocab_size"])?)?;
        let k = linear_cfg(self.ctx, "short_conv_kernel_size").and_then(|v| v.as_u64());
        if let Some(k) = k {
            kv.u32("ssm.conv_kernel", k)?;
        }
        if let Some(d) = linear_cfg(self.ctx, "head_dim").and_then(|v| v.as_u64()) {
            kv.u32("kda.head_dim", d)?;
        }
        if let Some(q) = self.q_lora_rank()? {
            kv.u32("attention.q_lora_rank", q)?;
        }
        let r = c.req_uint(&["kv_lora_rank"])?;
        kv.u32("attention.kv_lora_rank", r)?;
        let rope = c.req_uint(&["qk_rope_head_dim"])?;
        kv.u32("rope.dimension_count", rope)?;
        kv.u32("attention.key_length", r + rope)?;
        kv.u32("attention.key_length_mla", self.d_nope as u64 + rope)?;
        kv.u32("attention.value_length_mla", self.d_v as u64)?;
        kv.u32(
            "expert_feed_forward_length",
            c.req_uint(&["moe_intermediate_size"])?,
        )?;
        kv.u32(
            "expert_shared_count",
            c.uint0(&["num_shared_experts"])?.ok_or_else(|| {
                ConvertError::config("num_shared_experts", "missing in config.json")
            })?,
        )?;
        kv.u32("leading_dense_block_count", self.n_dense as u64)?;
        let scale = c.float0(&["routed_scaling_factor"])?.ok_or_else(|| {
            ConvertError::config("routed_scaling_factor", "missing in config.json")
        })?;
        kv.f32("expert_weights_scale", scale);
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &SrcTensor,
        bid: Option<usize>,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        let unused = || ConvertError::UnusedTensor {
            name: t.name.clone(),
            arch: "kimi-linear".into(),
        };
        let b = bid.or_else(|| block_id(&t.name));
        if let Some(b) = b {
            if b >= self.mla.len() {
                return Err(unused());
            }
            if t.name.contains(".block_sparse_moe.experts.") {
                return self.expert(t, b, out);
            }
            if t.name.ends_with(".self_attn.kv_b_proj.weight") {
                return split_kv_b(t, b, self.n_head_kv, self.d_nope, self.d_v, out);
            }
        }
        let rest = super::layer_rest(&t.name);
        let name = match (b, rest.and_then(kimi_layer_name)) {
            (Some(b), Some(n)) => format!("blk.{b}.{n}"),
            _ => map_name(&t.name, b, self.arch())?,
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
            o = o.with(Op::NegExp);
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
            "ssm_f_b.weight",
            "ssm_beta.weight",
            "ssm_a",
            "ssm_dt.bias",
            "ssm_g_a.weight",
            "ssm_g_b.weight",
            "ssm_norm.weight",
            "attn_output.weight",
        ];
        const MLA: &[&str] = &[
            "attn_kv_a_mqa.weight",
            "attn_kv_a_norm.weight",
            "attn_k_b.weight",
            "attn_v_b.weight",
            "attn_output.weight",
        ];
        const DENSE: &[&str] = &["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"];
        const MOE: &[&str] = &[
            "ffn_gate_inp.weight",
            "ffn_gate_exps.weight",
            "ffn_up_exps.weight",
            "ffn_down_exps.weight",
            "exp_probs_b.bias",
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
