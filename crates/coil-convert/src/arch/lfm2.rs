//! LFM2 → `lfm2` and LFM2-MoE → `lfm2moe` (Liquid AI's short-convolution
//! hybrids): `layer_types` become a per-layer `attention.head_count_kv`
//! (0 = short-conv layer), the conv kernel `{d, 1, L}` is squeezed to
//! `{d, L}`, `embedding_norm` (the final norm) is `token_embd_norm`, Q/K are
//! not permuted (NeoX RoPE), LFM2-MoE's experts are stacked and its
//! `expert_bias` becomes `exp_probs_b.bias`.
//!
//! The dense FFN width is adjusted as llama.cpp's converter does
//! (`block_auto_adjust_ff_dim`: ⌊2·ff/3⌋, times `block_ffn_dim_multiplier`,
//! rounded up to `block_multiple_of`). One deviation: transformers rounds
//! only when a multiplier is set, so where the checkpoint's `w1` rows differ
//! from that value, coil writes the checkpoint's width (llama.cpp would write
//! a length its own runtime then rejects). Likewise LFM2-MoE's
//! `norm_topk_prob: false` and `routed_scaling_factor` ≠ 1, which llama.cpp
//! drops, become `expert_weights_norm` / `expert_weights_scale`.

use super::llama::{text_params, TextOpts};
use super::mamba::block_count;
use super::{map_name, squeezed, Arch, Ctx, ExpertBuf, Kv, VocabSpec, VocabStyle};
use crate::error::{ConvertError, Result};
use crate::plan::{OutTensor, Source};
use crate::safetensors_src::SrcTensor;

pub(crate) struct Lfm2<'a> {
    ctx: &'a Ctx<'a>,
    moe: bool,
    n_layer: usize,
    /// Per layer: attention (else short conv).
    attention: Vec<bool>,
    n_experts: usize,
    n_dense: usize,
    experts: ExpertBuf,
}

/// Which layers are attention layers: `layer_types` (LFM2: anything but
/// "conv"; LFM2-MoE: "full_attention", as llama.cpp reads them), or the older
/// `full_attn_idxs`.
fn attention_layers(ctx: &Ctx, moe: bool, n_layer: usize) -> Result<Vec<bool>> {
    let c = ctx.cfg;
    let v: Vec<bool> = if let Some(types) = c.strs("layer_types")? {
        types
            .iter()
            .map(|t| {
                if moe {
                    t == "full_attention"
                } else {
                    t != "conv"
                }
            })
            .collect()
    } else if let Some(idx) = c.uints("full_attn_idxs")? {
        (0..n_layer).map(|i| idx.contains(&(i as u64))).collect()
    } else {
        return Err(ConvertError::config(
            "layer_types",
            "neither layer_types nor full_attn_idxs is given",
        ));
    };
    if v.len() != n_layer {
        return Err(ConvertError::config(
            "layer_types",
            format!("{} entries for {n_layer} layers", v.len()),
        ));
    }
    Ok(v)
}

impl<'a> Lfm2<'a> {
    pub fn new(ctx: &'a Ctx<'a>, moe: bool) -> Result<Self> {
        let c = ctx.cfg;
        let n_layer = block_count(ctx)?;
        let attention = attention_layers(ctx, moe, n_layer)?;
        let (n_experts, n_dense) = if moe {
            (
                c.req_uint(&["num_local_experts", "num_experts"])? as usize,
                c.req_uint(&["num_dense_layers"])? as usize,
            )
        } else {
            (0, n_layer)
        };
        Ok(Lfm2 {
            ctx,
            moe,
            n_layer,
            attention,
            n_experts,
            n_dense,
            experts: ExpertBuf::default(),
        })
    }

    /// The dense FFN width, as llama.cpp's converter computes it for LFM2
    /// (the checkpoint's own width where it differs).
    fn ff_dim(&self) -> Result<u64> {
        let c = self.ctx.cfg;
        let mut ff = c.req_uint(&["block_ff_dim", "intermediate_size"])?;
        if c.bool("block_auto_adjust_ff_dim").unwrap_or(true) {
            ff = 2 * ff / 3;
            if let Some(m) = c.float(&["block_ffn_dim_multiplier"])? {
                ff = (m * ff as f64) as u64;
            }
            let multiple = c.uint_or(&["block_multiple_of"], 256)?.max(1);
            ff = ff.div_ceil(multiple) * multiple;
        }
        let w1 = (0..self.n_dense.min(self.n_layer))
            .map(|b| format!("model.layers.{b}.feed_forward.w1.weight"))
            .find_map(|n| self.ctx.ck.get(&n));
        Ok(match w1 {
            Some(t) if t.shape.len() == 2 && t.shape[0] as u64 != ff => t.shape[0] as u64,
            _ => ff,
        })
    }
}

/// GGUF name (after `blk.N.`) of an LFM2-specific layer tensor.
fn lfm2_layer_name(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "operator_norm.weight" => "attn_norm.weight",
        "conv.conv.weight" => "shortconv.conv.weight",
        "conv.in_proj.weight" => "shortconv.in_proj.weight",
        "conv.out_proj.weight" => "shortconv.out_proj.weight",
        "self_attn.out_proj.weight" => "attn_output.weight",
        "self_attn.q_layernorm.weight" => "attn_q_norm.weight",
        "self_attn.k_layernorm.weight" => "attn_k_norm.weight",
        "feed_forward.gate.weight" => "ffn_gate_inp.weight",
        "feed_forward.expert_bias" => "exp_probs_b.bias",
        _ => return None,
    })
}

impl Arch for Lfm2<'_> {
    fn arch(&self) -> &str {
        if self.moe {
            "lfm2moe"
        } else {
            "lfm2"
        }
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        let c = self.ctx.cfg;
        text_params(
            self.ctx,
            kv,
            self.n_layer,
            TextOpts {
                moe: self.moe,
                head_dim: true,
            },
        )?;
        let n_kv = c.req_uint(&["num_key_value_heads"])?;
        let kv_vec: Vec<u64> = self
            .attention
            .iter()
            .map(|&a| if a { n_kv } else { 0 })
            .collect();
        // Keeps the position text_params gave the key.
        kv.i32s("attention.head_count_kv", &kv_vec)?;
        if self.moe {
            kv.u32(
                "expert_feed_forward_length",
                c.req_uint(&["moe_intermediate_size"])?,
            )?;
            kv.u32("leading_dense_block_count", self.n_dense as u64)?;
            kv.u32("expert_gating_func", 2)?; // sigmoid
                                              // Not written by llama.cpp's converter, whose runtime always
                                              // renormalises and never scales LFM2-MoE's expert weights: only
                                              // where the checkpoint differs from that.
            if c.bool("norm_topk_prob") == Some(false) {
                kv.bool("expert_weights_norm", false);
            }
            if let Some(f) = c.float(&["routed_scaling_factor"])? {
                if f != 1.0 {
                    kv.f32("expert_weights_scale", f);
                }
            }
        }
        kv.u32("vocab_size", c.req_uint(&["vocab_size"])?)?;
        let l_cache = c.req_uint(&["conv_L_cache"])?;
        if l_cache < 2 {
            return Err(ConvertError::config(
                "conv_L_cache",
                format!("{l_cache}: the short convolution needs a window of at least 2"),
            ));
        }
        kv.u32("shortconv.l_cache", l_cache)?;
        if !self.moe {
            // In the place text_params gave it (intermediate_size there).
            kv.u32("feed_forward_length", self.ff_dim()?)?;
        }
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &SrcTensor,
        bid: Option<usize>,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        if t.name.contains(".feed_forward.experts.") {
            let b = bid.unwrap_or(0);
            if self.experts.add(b, &t.name, self.n_experts * 3) {
                self.experts.take(b);
                for (w, gg) in [
                    ("w1", "ffn_gate_exps"),
                    ("w2", "ffn_down_exps"),
                    ("w3", "ffn_up_exps"),
                ] {
                    let names: Vec<String> = (0..self.n_experts)
                        .map(|x| format!("model.layers.{b}.feed_forward.experts.{x}.{w}.weight"))
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
            }
            return Ok(());
        }
        if t.name == "model.embedding_norm.weight" {
            out.push(OutTensor::one("token_embd_norm.weight", &t.name, &t.shape));
            return Ok(());
        }
        let rest = super::layer_rest(&t.name);
        let name = match (bid, rest.and_then(lfm2_layer_name)) {
            (Some(b), Some(n)) => format!("blk.{b}.{n}"),
            _ => map_name(&t.name, bid, self.arch())?,
        };
        let mut o = OutTensor::one(name.clone(), &t.name, &t.shape);
        if name.ends_with(".shortconv.conv.weight") {
            o.shape = squeezed(t);
        }
        out.push(o);
        Ok(())
    }

    fn finish(&mut self, _out: &mut Vec<OutTensor>) -> Result<()> {
        self.experts.check_done()
    }

    fn required(&self) -> Vec<String> {
        let mut v = vec![
            "token_embd.weight".to_string(),
            "token_embd_norm.weight".to_string(),
        ];
        for b in 0..self.n_layer {
            let mut s: Vec<&str> = vec!["attn_norm.weight", "ffn_norm.weight"];
            if self.attention[b] {
                s.extend(super::ATTN_LAYER);
                s.extend(["attn_q_norm.weight", "attn_k_norm.weight"]);
            } else {
                s.extend([
                    "shortconv.conv.weight",
                    "shortconv.in_proj.weight",
                    "shortconv.out_proj.weight",
                ]);
            }
            if b < self.n_dense {
                s.extend(["ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]);
            } else {
                s.extend([
                    "ffn_gate_inp.weight",
                    "ffn_gate_exps.weight",
                    "ffn_up_exps.weight",
                    "ffn_down_exps.weight",
                    "exp_probs_b.bias",
                ]);
            }
            v.extend(s.iter().map(|s| format!("blk.{b}.{s}")));
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
