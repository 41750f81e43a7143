//! Jamba → `jamba`: Mamba-1 layers with dt/B/C norms, attention without
//! positional encoding (no Q/K permutation), MoE experts stacked.

use super::mamba::block_count;
use super::{expect_numel, map_name, squeezed, Arch, Ctx, ExpertBuf, Kv, VocabSpec, VocabStyle};
use crate::error::{ConvertError, Result};
use crate::plan::{Op, OutTensor, Source};
use crate::safetensors_src::SrcTensor;

pub(crate) struct Jamba<'a> {
    ctx: &'a Ctx<'a>,
    n_layer: usize,
    d_model: u64,
    d_inner: u64,
    n_experts: usize,
    experts: ExpertBuf,
}

impl<'a> Jamba<'a> {
    pub fn new(ctx: &'a Ctx<'a>) -> Result<Self> {
        let c = ctx.cfg;
        let d_model = c.req_uint(&["hidden_size", "mamba_d_model"])?;
        let expand = c.req_uint(&["mamba_expand"])?;
        Ok(Jamba {
            ctx,
            n_layer: block_count(ctx)?,
            d_model,
            d_inner: expand * d_model,
            n_experts: c.uint_or(&["num_local_experts", "num_experts"], 1)? as usize,
            experts: ExpertBuf::default(),
        })
    }

    fn is_moe_layer(&self, bid: usize) -> Result<bool> {
        let c = self.ctx.cfg;
        let off = c.uint0(&["expert_layer_offset"])?.unwrap_or(1) as usize;
        let per = c.uint(&["expert_layer_period"])?.unwrap_or(2) as usize;
        Ok(bid >= off && (bid - off).is_multiple_of(per))
    }
}

impl Arch for Jamba<'_> {
    fn arch(&self) -> &str {
        "jamba"
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        let c = self.ctx.cfg;
        let d_conv = c.uint_or(&["mamba_d_conv"], 4)?;
        let d_state = c.uint_or(&["mamba_d_state"], 16)?;
        let dt_rank = c.uint_or(&["mamba_dt_rank"], self.d_model.div_ceil(16))?;
        let eps = c
            .float(&["layer_norm_epsilon", "rms_norm_eps"])?
            .unwrap_or(1e-6);
        let n_kv = c.req_uint(&["num_key_value_heads"])?;
        let off = c
            .uint0(&["attn_layer_offset"])?
            .ok_or_else(|| ConvertError::config("attn_layer_offset", "missing in config.json"))?
            as usize;
        let per = c.req_uint(&["attn_layer_period"])? as usize;
        let kv_vec: Vec<u64> = (0..self.n_layer)
            .map(|i| {
                if i >= off && (i - off).is_multiple_of(per) {
                    n_kv
                } else {
                    0
                }
            })
            .collect();
        kv.u32("block_count", self.n_layer as u64)?;
        kv.u32(
            "context_length",
            c.req_uint(&["max_position_embeddings", "n_ctx"])?,
        )?;
        kv.u32("embedding_length", self.d_model)?;
        kv.u32("feed_forward_length", c.req_uint(&["intermediate_size"])?)?;
        kv.u32(
            "attention.head_count",
            c.req_uint(&["num_attention_heads"])?,
        )?;
        kv.i32s("attention.head_count_kv", &kv_vec)?;
        kv.u32("ssm.conv_kernel", d_conv)?;
        kv.u32("ssm.inner_size", self.d_inner)?;
        kv.u32("ssm.state_size", d_state)?;
        kv.u32("ssm.time_step_rank", dt_rank)?;
        kv.f32("attention.layer_norm_rms_epsilon", eps);
        kv.u32("expert_count", self.n_experts as u64)?;
        kv.u32(
            "expert_used_count",
            c.req_uint(&["num_experts_per_tok", "num_experts_per_token"])?,
        )?;
        kv.file_type(self.ctx.file_type);
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &SrcTensor,
        bid: Option<usize>,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        let mut hf = t.name.replace(".moe.", ".feed_forward.");
        if let Some(b) = bid {
            if !self.is_moe_layer(b)? {
                hf = hf.replace(".experts.0.", ".");
            }
        }
        if hf.contains(".feed_forward.experts.") {
            let b = bid.unwrap_or(0);
            if self.experts.add(b, &hf, self.n_experts * 3) {
                self.experts.take(b);
                let prefix = &t.name[..t
                    .name
                    .find("feed_forward")
                    .or_else(|| t.name.find("moe"))
                    .unwrap_or(0)];
                let part = if t.name.contains(".moe.") {
                    "moe"
                } else {
                    "feed_forward"
                };
                for (w, gg) in [
                    ("down_proj", "ffn_down_exps"),
                    ("gate_proj", "ffn_gate_exps"),
                    ("up_proj", "ffn_up_exps"),
                ] {
                    let names: Vec<String> = (0..self.n_experts)
                        .map(|x| format!("{prefix}{part}.experts.{x}.{w}.weight"))
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
        let name = map_name(&hf, bid, "jamba")?;
        let mut o = OutTensor::one(name.clone(), &t.name, &t.shape);
        if name.ends_with(".ssm_conv1d.weight") {
            o.shape = squeezed(t);
        }
        if t.name.ends_with(".A_log") {
            expect_numel(
                t,
                &[
                    self.d_inner as usize,
                    t.n_elements() / self.d_inner.max(1) as usize,
                ],
            )?;
            o = o.with(Op::NegExp);
        }
        out.push(o);
        Ok(())
    }

    fn finish(&mut self, _out: &mut Vec<OutTensor>) -> Result<()> {
        self.experts.check_done()
    }

    fn required(&self) -> Vec<String> {
        let c = self.ctx.cfg;
        let off = c.uint0(&["attn_layer_offset"]).ok().flatten().unwrap_or(0) as usize;
        let per = c
            .uint(&["attn_layer_period"])
            .ok()
            .flatten()
            .unwrap_or(1)
            .max(1) as usize;
        super::required_names((0..self.n_layer).map(|b| {
            let attn = b >= off && (b - off).is_multiple_of(per);
            (
                b,
                if attn {
                    super::ATTN_LAYER
                } else {
                    super::MAMBA1_LAYER
                },
            )
        }))
    }

    fn vocab(&self) -> VocabSpec {
        // llama.cpp reads Jamba's SentencePiece model, or tokenizer.json as a
        // Llama-style vocabulary; a byte-level BPE tokenizer.json is written
        // as `gpt2` (as the fixtures' converter shim does).
        VocabSpec {
            style: VocabStyle::SpmFirst,
            pad_multiple: 1,
        }
    }
}
