//! Nemotron-H → `nemotron_h` (dense relu² MLP) or `nemotron_h_moe`: a
//! per-layer pattern of Mamba-2 (`M`), attention (`*`, no positional
//! encoding), MLP (`-`) and MoE (`E`) layers.
//!
//! Deviation from llama.cpp's converter: the file is `nemotron_h_moe` only
//! when some layer *is* MoE (not when MoE keys merely appear in the config,
//! as they always do with transformers 5), and a pattern mixing `-` and `E`
//! gets each layer's own feed-forward length.

use super::granite::{preq, SsmDims};
use super::llama::{permute_attn, rope_dim, text_params, TextOpts};
use super::{mamba2_tensor, map_name, Arch, Ctx, ExpertBuf, Kv, LayerKind, VocabSpec, VocabStyle};
use crate::config::check_range;
use crate::error::{ConvertError, Result};
use crate::plan::{OutTensor, Source};
use crate::safetensors_src::SrcTensor;

pub(crate) struct NemotronH<'a> {
    ctx: &'a Ctx<'a>,
    kinds: Vec<LayerKind>,
    ssm: SsmDims,
    moe: bool,
    n_head: usize,
    n_head_kv: usize,
    n_experts: usize,
    experts: ExpertBuf,
}

fn pattern(ctx: &Ctx) -> Result<Vec<LayerKind>> {
    let c = ctx.cfg;
    if let Some(p) = c.str("hybrid_override_pattern") {
        return p
            .chars()
            .map(|ch| match ch {
                'M' => Ok(LayerKind::Ssm),
                '*' => Ok(LayerKind::Attention),
                '-' => Ok(LayerKind::Mlp),
                'E' => Ok(LayerKind::Moe),
                other => Err(ConvertError::config(
                    "hybrid_override_pattern",
                    format!("unknown layer code {other:?}"),
                )),
            })
            .collect();
    }
    if let Some(list) = c.strs("layers_block_type")? {
        return list
            .iter()
            .map(|t| match t.as_str() {
                "mamba" | "linear_attention" => Ok(LayerKind::Ssm),
                "attention" | "full_attention" => Ok(LayerKind::Attention),
                "mlp" => Ok(LayerKind::Mlp),
                "moe" => Ok(LayerKind::Moe),
                other => Err(ConvertError::config(
                    "layers_block_type",
                    format!("unknown layer type {other:?}"),
                )),
            })
            .collect();
    }
    Err(ConvertError::config(
        "hybrid_override_pattern",
        "neither hybrid_override_pattern nor layers_block_type is given",
    ))
}

impl<'a> NemotronH<'a> {
    pub fn new(ctx: &'a Ctx<'a>) -> Result<Self> {
        let c = ctx.cfg;
        let kinds = pattern(ctx)?;
        check_range("number of layers", kinds.len() as u64, 1, 4096)?;
        if let Some(n) = c.uint(&["num_hidden_layers"])? {
            if n as usize != kinds.len() && c.contains("hybrid_override_pattern") {
                return Err(ConvertError::config(
                    "hybrid_override_pattern",
                    format!(
                        "{} layers in the pattern, num_hidden_layers is {n}",
                        kinds.len()
                    ),
                ));
            }
        }
        let d_model = c.req_uint(&["mamba_head_dim", "hidden_size", "d_model"])?;
        let ssm = SsmDims::finish(c, preq(c, &["num_heads"])? * d_model)?;
        let n_head = c.req_uint(&["num_attention_heads"])? as usize;
        let n_head_kv = c
            .uint(&["num_key_value_heads"])?
            .map_or(n_head, |v| v as usize);
        let moe = kinds.contains(&LayerKind::Moe);
        let n_experts = if moe {
            c.req_uint(&["n_routed_experts"])? as usize
        } else {
            0
        };
        Ok(NemotronH {
            ctx,
            kinds,
            ssm,
            moe,
            n_head,
            n_head_kv,
            n_experts,
            experts: ExpertBuf::default(),
        })
    }
}

impl Arch for NemotronH<'_> {
    fn arch(&self) -> &str {
        if self.moe {
            "nemotron_h_moe"
        } else {
            "nemotron_h"
        }
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        let c = self.ctx.cfg;
        let n = self.kinds.len();
        text_params(
            self.ctx,
            kv,
            n,
            TextOpts {
                moe: self.moe,
                head_dim: false,
            },
        )?;
        if let Some(v) = c.uint(&["vocab_size"])? {
            kv.u32("vocab_size", v)?;
        }
        kv.u32("rope.dimension_count", rope_dim(c, false)?)?;
        self.ssm.write(kv)?;
        let n_kv = self.n_head_kv as u64;
        let kv_vec: Vec<u64> = self
            .kinds
            .iter()
            .map(|k| if *k == LayerKind::Attention { n_kv } else { 0 })
            .collect();
        kv.i32s("attention.head_count_kv", &kv_vec)?;
        kv.bool("rope.scaling.finetuned", false);
        kv.u32("context_length", 1 << 20)?;
        let hd = c
            .uint(&["head_dim", "attention_head_dim"])?
            .ok_or_else(|| {
                ConvertError::config("head_dim", "missing: the attention head dim is needed")
            })?;
        kv.u32("attention.key_length", hd)?;
        kv.u32("attention.value_length", hd)?;
        let dense_ff = c.uint(&["intermediate_size", "n_inner", "hidden_dim"])?;
        let moe_ff = c.uint(&["moe_intermediate_size"])?;
        let ff: Vec<u64> = self
            .kinds
            .iter()
            .map(|k| match k {
                LayerKind::Mlp => dense_ff.ok_or_else(|| {
                    ConvertError::config("intermediate_size", "missing for the MLP layers")
                }),
                LayerKind::Moe => moe_ff.ok_or_else(|| {
                    ConvertError::config("moe_intermediate_size", "missing for the MoE layers")
                }),
                _ => Ok(0),
            })
            .collect::<Result<_>>()?;
        kv.i32s("feed_forward_length", &ff)?;
        if self.moe {
            kv.u32("expert_used_count", c.req_uint(&["num_experts_per_tok"])?)?;
            kv.u32(
                "expert_feed_forward_length",
                c.req_uint(&["moe_intermediate_size"])?,
            )?;
            kv.u32(
                "expert_shared_feed_forward_length",
                c.req_uint(&["moe_shared_expert_intermediate_size"])?,
            )?;
            kv.u32("expert_count", self.n_experts as u64)?;
            kv.u32(
                "expert_shared_count",
                c.uint0(&["n_shared_experts"])?.unwrap_or(0),
            )?;
            kv.bool(
                "expert_weights_norm",
                c.bool("norm_topk_prob").unwrap_or(false),
            );
            kv.f32(
                "expert_weights_scale",
                c.float0(&["routed_scaling_factor"])?.unwrap_or(1.0),
            );
            kv.u32("expert_group_count", c.uint0(&["n_group"])?.unwrap_or(1))?;
            if let Some(l) = c.uint(&["moe_latent_size"])? {
                kv.u32("moe_latent_size", l)?;
            }
        }
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &SrcTensor,
        bid: Option<usize>,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        if t.name.starts_with("mtp.") {
            return Ok(()); // the multi-token-prediction head is not converted
        }
        let hf = if t.name.starts_with("model.layers.") && t.name.contains(".mixer.") {
            t.name.replacen("model.layers.", "backbone.layers.", 1)
        } else {
            t.name.clone()
        };
        if hf.contains("mixer.experts.") {
            let b = bid.unwrap_or(0);
            if self.experts.add(b, &hf, self.n_experts * 2) {
                self.experts.take(b);
                for (w, gg) in [("down_proj", "ffn_down_exps"), ("up_proj", "ffn_up_exps")] {
                    let names: Vec<String> = (0..self.n_experts)
                        .map(|x| format!("backbone.layers.{b}.mixer.experts.{x}.{w}.weight"))
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
        let name = map_name(&hf, bid, self.arch())?;
        let kind = bid.and_then(|b| self.kinds.get(b)).copied();
        let o = match kind {
            Some(LayerKind::Ssm) => mamba2_tensor(
                t,
                name,
                self.ssm.n_group as usize,
                self.ssm.d_inner as usize,
            )?,
            // llama.cpp permutes Nemotron-H's Q/K like Llama's (harmless
            // without positional encoding); do the same for identical files.
            Some(LayerKind::Attention) => permute_attn(
                OutTensor::one(name, &t.name, &t.shape),
                &hf,
                self.n_head,
                self.n_head_kv,
                None,
            ),
            _ => OutTensor::one(name, &t.name, &t.shape),
        };
        out.push(o);
        Ok(())
    }

    fn finish(&mut self, _out: &mut Vec<OutTensor>) -> Result<()> {
        self.experts.check_done()
    }

    fn required(&self) -> Vec<String> {
        super::required_names(self.kinds.iter().enumerate().map(|(b, k)| {
            let s: &'static [&'static str] = match k {
                LayerKind::Ssm => super::MAMBA2_LAYER,
                LayerKind::Attention => super::ATTN_LAYER,
                LayerKind::Mlp => &["ffn_up.weight", "ffn_down.weight"],
                LayerKind::Moe => &[
                    "ffn_up_exps.weight",
                    "ffn_down_exps.weight",
                    "ffn_gate_inp.weight",
                ],
            };
            (b, s)
        }))
    }

    fn vocab(&self) -> VocabSpec {
        VocabSpec {
            style: VocabStyle::BpeFirst,
            pad_multiple: 8,
        }
    }
}
