//! Falcon-H1 → `falcon-h1`: attention ∥ Mamba-2 in every layer; all µP
//! multipliers folded into the weights (none in the metadata), no Q/K
//! permutation.

use super::granite::{preq, SsmDims};
use super::mamba::block_count;
use super::{mamba2_tensor, map_name, Arch, Ctx, Kv, VocabSpec, VocabStyle};
use crate::error::{ConvertError, Result};
use crate::plan::{Op, OutTensor};
use crate::safetensors_src::SrcTensor;

pub(crate) struct FalconH1<'a> {
    ctx: &'a Ctx<'a>,
    n_layer: usize,
    ssm: SsmDims,
    d_model: u64,
    head_dim: u64,
}

impl<'a> FalconH1<'a> {
    pub fn new(ctx: &'a Ctx<'a>) -> Result<Self> {
        let c = ctx.cfg;
        let d_inner = preq(c, &["d_ssm"])?;
        let ssm = SsmDims::finish(c, d_inner)?;
        // llama.cpp's Mamba2Model looks up ["mamba_d_head", "head_dim"] plus
        // their `mamba_` forms: the SSM head dim comes before the attention one.
        let head_dim = c
            .uint(&[
                "mamba_d_head",
                "head_dim",
                "mamba_mamba_d_head",
                "mamba_head_dim",
            ])?
            .unwrap_or(64);
        if d_inner % head_dim != 0 {
            return Err(ConvertError::config(
                "mamba_d_head",
                format!(
                    "the SSM inner size {d_inner} is not a multiple of the head dim {head_dim}"
                ),
            ));
        }
        Ok(FalconH1 {
            ctx,
            n_layer: block_count(ctx)?,
            ssm,
            d_model: c.req_uint(&["hidden_size", "d_model", "dim"])?,
            head_dim,
        })
    }

    fn mult(&self, key: &str) -> Result<f64> {
        Ok(self.ctx.cfg.float0(&[key])?.unwrap_or(1.0))
    }

    fn mults(&self, key: &str, n: usize) -> Result<Vec<f64>> {
        match self.ctx.cfg.floats(key)? {
            None => Ok(vec![1.0; n]),
            Some(v) if v.len() == n => Ok(v),
            Some(v) => Err(ConvertError::config(
                key,
                format!("{} values, expected {n}", v.len()),
            )),
        }
    }
}

impl Arch for FalconH1<'_> {
    fn arch(&self) -> &str {
        "falcon-h1"
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        let c = self.ctx.cfg;
        kv.u32("context_length", 1 << 20)?;
        kv.u32("embedding_length", self.d_model)?;
        kv.u32("feed_forward_length", 0)?;
        kv.u32("attention.head_count", 0)?;
        kv.u32("block_count", self.n_layer as u64)?;
        kv.u32("ssm.conv_kernel", self.ssm.d_conv)?;
        kv.u32("ssm.inner_size", self.ssm.d_inner)?;
        kv.u32("ssm.state_size", self.ssm.d_state)?;
        kv.u32("ssm.time_step_rank", self.ssm.d_inner / self.head_dim)?;
        kv.u32("ssm.group_count", self.ssm.n_group)?;
        let eps = c
            .float(&[
                "layer_norm_epsilon",
                "rms_norm_eps",
                "mamba_layer_norm_epsilon",
                "mamba_rms_norm_eps",
            ])?
            .unwrap_or(1e-5);
        kv.f32("attention.layer_norm_rms_epsilon", eps);
        kv.file_type(self.ctx.file_type);
        kv.u32("vocab_size", c.req_uint(&["vocab_size"])?)?;
        kv.u32("block_count", self.n_layer as u64)?;
        kv.u32(
            "context_length",
            c.uint0(&["max_position_embeddings"])?.unwrap_or(0),
        )?;
        kv.u32("feed_forward_length", c.req_uint(&["intermediate_size"])?)?;
        kv.u32(
            "attention.head_count",
            c.req_uint(&["num_attention_heads"])?,
        )?;
        kv.u32(
            "attention.head_count_kv",
            c.req_uint(&["num_key_value_heads"])?,
        )?;
        let hd = c.req_uint(&["head_dim"])?;
        kv.u32("attention.key_length", hd)?;
        kv.u32("attention.value_length", hd)?;
        let theta = c
            .get("rope_parameters")
            .or_else(|| c.get("rope_scaling"))
            .and_then(|r| r.get("rope_theta"))
            .and_then(crate::config::as_f64)
            .or(c.float0(&["rope_theta"])?)
            .ok_or_else(|| ConvertError::config("rope_theta", "missing in config.json"))?;
        kv.f32("rope.freq_base", theta);
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &SrcTensor,
        bid: Option<usize>,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        let mut name = map_name(&t.name, bid, "falcon-h1")?;
        // llama.cpp's Falcon-H1 map names the pre-FFN norm without `.weight`.
        if name.ends_with(".ffn_norm.weight") {
            name.truncate(name.len() - ".weight".len());
        }
        let mut o = mamba2_tensor(
            t,
            name,
            self.ssm.n_group as usize,
            self.ssm.d_inner as usize,
        )?;
        let n = &t.name;
        let scale = |o: OutTensor, f: f64| o.with(Op::Scale(f));
        if n.contains("down_proj") {
            o = scale(o, self.mults("mlp_multipliers", 2)?[1]);
        } else if n.contains("gate_proj") {
            o = scale(o, self.mults("mlp_multipliers", 2)?[0]);
        } else if n.contains("k_proj") {
            o = scale(o, self.mult("key_multiplier")?);
            o = scale(o, self.mult("attention_in_multiplier")?);
        } else if n.contains("q_proj") || n.contains("v_proj") {
            o = scale(o, self.mult("attention_in_multiplier")?);
        } else if n.contains("o_proj") {
            o = scale(o, self.mult("attention_out_multiplier")?);
        } else if n.contains("out_proj") {
            o = scale(o, self.mult("ssm_out_multiplier")?);
        } else if n.contains("in_proj") {
            o = scale(o, self.mult("ssm_in_multiplier")?);
            let m = self.mults("ssm_multipliers", 5)?;
            let i = self.ssm.d_inner as usize;
            let gs = (self.ssm.n_group * self.ssm.d_state) as usize;
            let rows = t.shape.first().copied().unwrap_or(0);
            let expected = 2 * i + 2 * gs + self.ssm.n_head as usize;
            if rows != expected {
                return Err(ConvertError::Shape {
                    name: t.name.clone(),
                    actual: t.shape.clone(),
                    expected: vec![expected, t.shape.get(1).copied().unwrap_or(0)],
                });
            }
            for (k, (s, e)) in [
                (0, i),
                (i, 2 * i),
                (2 * i, 2 * i + gs),
                (2 * i + gs, 2 * i + 2 * gs),
                (2 * i + 2 * gs, rows),
            ]
            .into_iter()
            .enumerate()
            {
                o = o.with(Op::ScaleRows {
                    start: s,
                    end: e,
                    factor: m[k],
                });
            }
        } else if n.contains("lm_head") {
            o = scale(o, self.mult("lm_head_multiplier")?);
        } else if n.contains("embed_tokens") {
            o = scale(o, self.mult("embedding_multiplier")?);
        }
        out.push(o);
        Ok(())
    }

    fn required(&self) -> Vec<String> {
        let mut v = super::required_names((0..self.n_layer).map(|b| (b, super::MAMBA2_LAYER)));
        // The gated norm exists only with `mamba_rms_norm` (default false).
        if self.ctx.cfg.bool("mamba_rms_norm") != Some(true) {
            v.retain(|n| !n.ends_with(".ssm_norm.weight"));
        }
        v.extend(
            super::required_names((0..self.n_layer).map(|b| (b, super::ATTN_LAYER)))
                .into_iter()
                .skip(2),
        );
        v
    }

    fn vocab(&self) -> VocabSpec {
        VocabSpec {
            style: VocabStyle::BpeFirst,
            pad_multiple: 1,
        }
    }
}
