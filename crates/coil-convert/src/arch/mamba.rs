//! Mamba (and Falcon-Mamba) → `mamba`, Mamba-2 → `mamba2`.

use super::{
    expect_numel, mamba2_tensor, map_name, squeezed, Arch, Ctx, Kv, VocabSpec, VocabStyle,
};
use crate::config::check_range;
use crate::error::{ConvertError, Result};
use crate::plan::{Op, OutTensor};
use crate::safetensors_src::SrcTensor;

const BLOCK_KEYS: &[&str] = &["n_layers", "num_hidden_layers", "n_layer", "num_layers"];

pub(crate) fn block_count(ctx: &Ctx) -> Result<usize> {
    let n = ctx.cfg.req_uint(BLOCK_KEYS)?;
    Ok(check_range("num_hidden_layers", n, 1, 4096)? as usize)
}

/// Mamba-1: `A_log` {d_inner, d_state} → `ssm_a` = −exp; conv squeezed; a
/// tied `lm_head` equal to the embeddings is dropped.
pub(crate) struct Mamba1<'a> {
    ctx: &'a Ctx<'a>,
    n_layer: usize,
    d_model: u64,
    d_conv: u64,
    d_inner: u64,
    d_state: u64,
    dt_rank: u64,
    eps: f64,
    falcon: bool,
}

impl<'a> Mamba1<'a> {
    pub fn new(ctx: &'a Ctx<'a>) -> Result<Self> {
        let c = ctx.cfg;
        let d_model = c.req_uint(&["hidden_size", "d_model"])?;
        check_range("hidden_size", d_model, 1, 1 << 20)?;
        let d_conv = c.uint_or(&["conv_kernel", "d_conv"], 4)?;
        check_range("conv_kernel", d_conv, 1, 64)?;
        let d_inner = c.uint_or(&["intermediate_size", "d_inner"], 2 * d_model)?;
        let d_state = c.uint_or(&["state_size", "d_state"], 16)?;
        check_range("state_size", d_state, 1, 4096)?;
        let dt_rank = c.uint_or(&["time_step_rank", "dt_rank"], d_model.div_ceil(16))?;
        let eps = c
            .float(&["layer_norm_epsilon", "rms_norm_eps"])?
            .unwrap_or(1e-5);
        let falcon = c.str("model_type") == Some("falcon_mamba");
        Ok(Mamba1 {
            ctx,
            n_layer: block_count(ctx)?,
            d_model,
            d_conv,
            d_inner,
            d_state,
            dt_rank,
            eps,
            falcon,
        })
    }
}

impl Arch for Mamba1<'_> {
    fn arch(&self) -> &str {
        "mamba"
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        kv.u32("context_length", 1 << 20)?;
        kv.u32("embedding_length", self.d_model)?;
        kv.u32("feed_forward_length", 0)?;
        kv.u32("attention.head_count", 0)?;
        kv.u32("block_count", self.n_layer as u64)?;
        kv.u32("ssm.conv_kernel", self.d_conv)?;
        kv.u32("ssm.inner_size", self.d_inner)?;
        kv.u32("ssm.state_size", self.d_state)?;
        kv.u32("ssm.time_step_rank", self.dt_rank)?;
        kv.f32("attention.layer_norm_rms_epsilon", self.eps);
        kv.bool("ssm.dt_b_c_rms", self.falcon);
        kv.file_type(self.ctx.file_type);
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &SrcTensor,
        bid: Option<usize>,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        let name = map_name(&t.name, bid, "mamba")?;
        if name == "output.weight" {
            // A tied head stored anyway: identical to the embeddings → omit.
            if let Some(e) = self.ctx.ck.get("backbone.embeddings.weight") {
                let ck = self.ctx.ck;
                let same = e.shape == t.shape && e.dtype == t.dtype && ck.bytes(e) == ck.bytes(t);
                ck.release(e);
                ck.release(t);
                if same {
                    return Ok(());
                }
            }
        }
        let mut o = OutTensor::one(name.clone(), &t.name, &t.shape);
        if name.ends_with(".ssm_conv1d.weight") {
            o.shape = squeezed(t);
            expect_numel(t, &[self.d_inner as usize, self.d_conv as usize])?;
        }
        if t.name.ends_with(".A_log") {
            expect_numel(t, &[self.d_inner as usize, self.d_state as usize])?;
            o = o.with(Op::NegExp);
        }
        out.push(o);
        Ok(())
    }

    fn required(&self) -> Vec<String> {
        super::required_names((0..self.n_layer).map(|b| (b, super::MAMBA1_LAYER)))
    }

    fn vocab(&self) -> VocabSpec {
        let pad = self
            .ctx
            .cfg
            .uint_or(&["pad_vocab_size_multiple"], 8)
            .unwrap_or(8);
        VocabSpec {
            style: VocabStyle::BpeFirst,
            pad_multiple: pad as usize,
        }
    }
}

/// Mamba-2: A and D as {n_head, 1}, the gated norm as {n_group, d_inner/n_group}.
pub(crate) struct Mamba2<'a> {
    ctx: &'a Ctx<'a>,
    n_layer: usize,
    d_model: u64,
    d_inner: u64,
    n_group: u64,
    d_conv: u64,
    d_state: u64,
    head_dim: u64,
    eps: f64,
}

impl<'a> Mamba2<'a> {
    pub fn new(ctx: &'a Ctx<'a>) -> Result<Self> {
        let c = ctx.cfg;
        let d_model = c.req_uint(&["hidden_size", "d_model", "dim"])?;
        check_range("hidden_size", d_model, 1, 1 << 20)?;
        let expand = c.uint_or(&["mamba_expand", "expand"], 2)?;
        let d_inner = c.uint_or(
            &["mamba_d_ssm", "intermediate_size", "d_inner"],
            expand * d_model,
        )?;
        let n_group = c.uint_or(&["n_groups"], 1)?;
        let d_conv = c.uint_or(&["conv_kernel", "d_conv"], 4)?;
        check_range("conv_kernel", d_conv, 1, 64)?;
        let d_state = c.uint_or(&["state_size", "d_state"], 128)?;
        check_range("state_size", d_state, 1, 4096)?;
        let head_dim = c.uint_or(&["mamba_d_head", "head_dim"], 64)?;
        if d_inner % head_dim != 0 {
            return Err(ConvertError::config(
                "head_dim",
                format!("the SSM inner size {d_inner} is not a multiple of head_dim {head_dim}"),
            ));
        }
        if d_inner % n_group != 0 {
            return Err(ConvertError::config(
                "n_groups",
                format!("the SSM inner size {d_inner} is not a multiple of n_groups {n_group}"),
            ));
        }
        let eps = c
            .float(&["layer_norm_epsilon", "rms_norm_eps"])?
            .unwrap_or(1e-5);
        Ok(Mamba2 {
            ctx,
            n_layer: block_count(ctx)?,
            d_model,
            d_inner,
            n_group,
            d_conv,
            d_state,
            head_dim,
            eps,
        })
    }
}

impl Arch for Mamba2<'_> {
    fn arch(&self) -> &str {
        "mamba2"
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        kv.u32("context_length", 1 << 20)?;
        kv.u32("embedding_length", self.d_model)?;
        kv.u32("feed_forward_length", 0)?;
        kv.u32("attention.head_count", 0)?;
        kv.u32("block_count", self.n_layer as u64)?;
        kv.u32("ssm.conv_kernel", self.d_conv)?;
        kv.u32("ssm.inner_size", self.d_inner)?;
        kv.u32("ssm.state_size", self.d_state)?;
        kv.u32("ssm.time_step_rank", self.d_inner / self.head_dim)?;
        kv.u32("ssm.group_count", self.n_group)?;
        kv.f32("attention.layer_norm_rms_epsilon", self.eps);
        kv.file_type(self.ctx.file_type);
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &SrcTensor,
        bid: Option<usize>,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        // Mamba-Codestral spells the prefixes `model.backbone` / `model.lm_head`.
        let hf = t
            .name
            .strip_prefix("model.")
            .filter(|n| n.starts_with("backbone") || n.starts_with("lm_head"))
            .unwrap_or(&t.name);
        let name = map_name(hf, bid, "mamba2")?;
        let o = mamba2_tensor(t, name, self.n_group as usize, self.d_inner as usize)?;
        if o.name.ends_with(".ssm_a") || o.name.ends_with(".ssm_d") {
            expect_numel(t, &[(self.d_inner / self.head_dim) as usize])?;
        }
        out.push(o);
        Ok(())
    }

    fn required(&self) -> Vec<String> {
        let mut v = super::required_names((0..self.n_layer).map(|b| (b, super::MAMBA2_LAYER)));
        v.extend((0..self.n_layer).map(|b| format!("blk.{b}.attn_norm.weight")));
        v
    }

    fn vocab(&self) -> VocabSpec {
        let pad = self
            .ctx
            .cfg
            .uint_or(&["pad_vocab_size_multiple"], 16)
            .unwrap_or(16);
        VocabSpec {
            style: VocabStyle::SpmFirst,
            pad_multiple: pad as usize,
        }
    }
}
