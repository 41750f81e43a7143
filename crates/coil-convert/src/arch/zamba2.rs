//! Zamba2 → `zamba2` (coil's layout; llama.cpp has no Zamba2 support, so
//! the names follow its conventions for Mamba-2, for attention and MLP
//! tensors and for LoRA adapters; see docs/CONVERT.md):
//!
//! * `layers_block_type` (`mamba` / `linear_attention` or `hybrid`) and
//!   `num_mem_blocks` become `shared_block_schedule` (per layer −1, or the
//!   shared block its hybrid layer runs: its use index modulo
//!   `num_mem_blocks`, as transformers ties them) and
//!   `shared_block_count`;
//! * the Mamba-2 layers as `mamba2`'s (`blk.N.attn_norm`, `blk.N.ssm_*`,
//!   A = −exp(A_log));
//! * shared block b (stored by transformers under its first hybrid layer,
//!   `layers.L.shared_transformer.*`) → `shared.b.attn_norm` (the 2d-wide
//!   `input_layernorm`), `shared.b.attn_{q,k,v,output}`, `shared.b.ffn_norm`
//!   (`pre_ff_layernorm`), `shared.b.ffn_{gate,up}` (the halves of
//!   `gate_up_proj`), `shared.b.ffn_down`;
//! * per use u at hybrid layer L: `linear` → `blk.L.shared_out`, the
//!   adapters `linear_{q,k,v}_adapter_list.u.{0,1}` →
//!   `blk.L.attn_{q,k,v}.weight.lora_{a,b}`, `gate_up_proj_adapter_list.u.0`
//!   → `blk.L.ffn_{gate,up}.weight.lora_a` (the same matrix twice), its
//!   `.1` halves → `blk.L.ffn_{gate,up}.weight.lora_b`;
//! * `attention.key_length` / `value_length` = 2·hidden / heads,
//!   `attention.scale` = 1/√(head_dim/2), `rope.dimension_count` and
//!   `rope.freq_base` only with `use_mem_rope`.

use super::llama::rope_params;
use super::mamba::block_count;
use super::{
    expect_numel, layer_name, mamba2_tensor, map_name, Arch, Ctx, Kv, VocabSpec, VocabStyle,
};
use crate::config::check_range;
use crate::error::{ConvertError, Result};
use crate::plan::{OutTensor, Source};
use crate::safetensors_src::SrcTensor;

pub(crate) struct Zamba2<'a> {
    ctx: &'a Ctx<'a>,
    n_layer: usize,
    d_model: u64,
    d_inner: u64,
    n_group: u64,
    n_head_ssm: u64,
    head_dim: u64,
    n_ff: u64,
    n_blocks: usize,
    /// The hybrid layers, in order: use u is at `hybrid[u]`.
    hybrid: Vec<usize>,
    attn_adapters: bool,
    rope: bool,
}

impl<'a> Zamba2<'a> {
    pub fn new(ctx: &'a Ctx<'a>) -> Result<Self> {
        let c = ctx.cfg;
        let n_layer = block_count(ctx)?;
        let types = c
            .strs("layers_block_type")?
            .or(c.strs("layer_types")?)
            .ok_or_else(|| ConvertError::config("layers_block_type", "missing"))?;
        if types.len() != n_layer {
            return Err(ConvertError::config(
                "layers_block_type",
                format!("{} entries for {n_layer} layers", types.len()),
            ));
        }
        let mut hybrid = Vec::new();
        for (l, t) in types.iter().enumerate() {
            match t.as_str() {
                "mamba" | "linear_attention" => {}
                "hybrid" => hybrid.push(l),
                other => {
                    return Err(ConvertError::config(
                        "layers_block_type",
                        format!("{other:?} is neither mamba nor hybrid"),
                    ))
                }
            }
        }
        let n_blocks = c.uint_or(&["num_mem_blocks"], 1)?;
        check_range("num_mem_blocks", n_blocks, 1, 4096)?;
        if c.bool("add_bias_linear") == Some(true) {
            return Err(ConvertError::config(
                "add_bias_linear",
                "biases on the Mamba-2 projections are not supported",
            ));
        }
        if c.bool("tie_word_embeddings") == Some(false) {
            // transformers ties the uses of a shared block to one copy only
            // when it ties the embeddings; untied, every hybrid layer holds
            // its own copy, which one `shared.b.*` set cannot carry.
            return Err(ConvertError::config(
                "tie_word_embeddings",
                "false: transformers then keeps a separate copy of the shared block at every \
                 hybrid layer, which the zamba2 layout (one copy per shared block) cannot hold",
            ));
        }
        if c.bool("use_long_context") == Some(true) {
            return Err(ConvertError::config(
                "use_long_context",
                "the long-context RoPE variant is not supported",
            ));
        }
        match c.str("hidden_act").unwrap_or("gelu") {
            "gelu" => {}
            other => {
                return Err(ConvertError::config(
                    "hidden_act",
                    format!("{other:?}: only \"gelu\" (exact) is supported"),
                ))
            }
        }
        let d_model = c.req_uint(&["hidden_size"])?;
        check_range("hidden_size", d_model, 1, 1 << 20)?;
        let d_inner = c.uint_or(&["mamba_expand"], 2)? * d_model;
        let n_head_ssm = c.uint_or(&["n_mamba_heads"], 8)?;
        let n_group = c.uint_or(&["mamba_ngroups"], 1)?;
        if n_head_ssm == 0 || d_inner % n_head_ssm != 0 {
            return Err(ConvertError::config(
                "n_mamba_heads",
                format!("{n_head_ssm} heads do not divide the SSM inner size {d_inner}"),
            ));
        }
        if n_group == 0 || n_head_ssm % n_group != 0 {
            return Err(ConvertError::config(
                "mamba_ngroups",
                format!("{n_group} groups do not divide the {n_head_ssm} SSM heads"),
            ));
        }
        let n_head = c.req_uint(&["num_attention_heads"])?;
        if n_head == 0 || (2 * d_model) % n_head != 0 {
            return Err(ConvertError::config(
                "num_attention_heads",
                format!(
                    "{n_head} heads do not divide the shared block's width {}",
                    2 * d_model
                ),
            ));
        }
        let head_dim = 2 * d_model / n_head;
        if head_dim < 2 || head_dim % 2 != 0 {
            return Err(ConvertError::config(
                "num_attention_heads",
                format!("a head dimension of {head_dim} (2·hidden_size / heads) is not even"),
            ));
        }
        Ok(Zamba2 {
            ctx,
            n_layer,
            d_model,
            d_inner,
            n_group,
            n_head_ssm,
            head_dim,
            n_ff: c.uint_or(&["intermediate_size"], 4 * d_model)?,
            n_blocks: n_blocks as usize,
            hybrid,
            attn_adapters: c.bool("use_shared_attention_adapter") == Some(true),
            rope: c.bool("use_mem_rope") == Some(true),
        })
    }

    /// The shared block whose weights transformers keeps under layer `l`
    /// (the first use of each block), if any.
    fn block_at(&self, l: usize) -> Option<usize> {
        self.hybrid.iter().take(self.n_blocks).position(|&h| h == l)
    }

    /// The block of use `u`.
    fn block_of_use(&self, u: usize) -> usize {
        u % self.n_blocks
    }
}

/// GGUF name (after `shared.b.`) of a shared-block tensor, given its name
/// after `shared_transformer.`; `None` for an adapter or an unknown name.
fn shared_name(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "input_layernorm.weight" => "attn_norm.weight",
        "pre_ff_layernorm.weight" => "ffn_norm.weight",
        "self_attn.q_proj.weight" => "attn_q.weight",
        "self_attn.k_proj.weight" => "attn_k.weight",
        "self_attn.v_proj.weight" => "attn_v.weight",
        "self_attn.o_proj.weight" => "attn_output.weight",
        "feed_forward.down_proj.weight" => "ffn_down.weight",
        _ => return None,
    })
}

/// `(projection, use, matrix)` of an adapter tensor name after
/// `shared_transformer.`: `self_attn.linear_q_adapter_list.2.0.weight` →
/// `("q", 2, 0)`.
fn adapter(rest: &str) -> Option<(&str, usize, usize)> {
    let (proj, tail) = if let Some(t) = rest.strip_prefix("feed_forward.gate_up_proj_adapter_list.")
    {
        ("gate_up", t)
    } else {
        let t = rest.strip_prefix("self_attn.linear_")?;
        let (p, t) = t.split_once("_adapter_list.")?;
        (p, t)
    };
    let mut parts = tail.split('.');
    let u = parts.next()?.parse().ok()?;
    let m = parts.next()?.parse().ok()?;
    (parts.next() == Some("weight") && parts.next().is_none()).then_some((proj, u, m))
}

impl Arch for Zamba2<'_> {
    fn arch(&self) -> &str {
        "zamba2"
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        let c = self.ctx.cfg;
        kv.u32(
            "context_length",
            c.uint_or(&["max_position_embeddings"], 4096)?,
        )?;
        kv.u32("embedding_length", self.d_model)?;
        kv.u32("block_count", self.n_layer as u64)?;
        kv.u32("feed_forward_length", self.n_ff)?;
        let n_head = c.req_uint(&["num_attention_heads"])?;
        kv.u32("attention.head_count", n_head)?;
        kv.u32(
            "attention.head_count_kv",
            c.uint_or(&["num_key_value_heads"], n_head)?,
        )?;
        kv.u32("attention.key_length", self.head_dim)?;
        kv.u32("attention.value_length", self.head_dim)?;
        kv.f32("attention.scale", 1.0 / (self.head_dim as f64 / 2.0).sqrt());
        kv.f32(
            "attention.layer_norm_rms_epsilon",
            c.float(&["rms_norm_eps"])?.unwrap_or(1e-5),
        );
        if self.rope {
            let rp = rope_params(c);
            if let Some(t) = rp.get("rope_type").and_then(|v| v.as_str()) {
                if t != "default" {
                    return Err(ConvertError::config(
                        "rope_parameters.rope_type",
                        format!("{t:?} is not supported (default)"),
                    ));
                }
            }
            let theta = rp
                .get("rope_theta")
                .and_then(crate::config::as_f64)
                .or(c.float(&["rope_theta"])?)
                .unwrap_or(10000.0);
            kv.u32("rope.dimension_count", self.head_dim)?;
            kv.f32("rope.freq_base", theta);
        }
        kv.u32("ssm.conv_kernel", c.uint_or(&["mamba_d_conv"], 4)?)?;
        kv.u32("ssm.inner_size", self.d_inner)?;
        kv.u32("ssm.state_size", c.uint_or(&["mamba_d_state"], 64)?)?;
        kv.u32("ssm.time_step_rank", self.n_head_ssm)?;
        kv.u32("ssm.group_count", self.n_group)?;
        // (blocks past the hybrid layers' count are never used, nor stored)
        kv.u32(
            "shared_block_count",
            self.n_blocks.min(self.hybrid.len()) as u64,
        )?;
        let mut schedule = vec![-1i32; self.n_layer];
        for (u, &l) in self.hybrid.iter().enumerate() {
            schedule[l] = self.block_of_use(u) as i32;
        }
        kv.raw(
            "zamba2.shared_block_schedule",
            coil_gguf::Value::Array(
                coil_gguf::ValueType::I32,
                schedule.into_iter().map(coil_gguf::Value::I32).collect(),
            ),
        );
        kv.file_type(self.ctx.file_type);
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
            arch: "zamba2".into(),
        };
        let rest = super::layer_rest(&t.name);
        let (Some(l), Some(rest)) = (bid, rest) else {
            out.push(OutTensor::one(
                map_name(&t.name, bid, "zamba2")?,
                &t.name,
                &t.shape,
            ));
            return Ok(());
        };
        if let Some(st) = rest.strip_prefix("shared_transformer.") {
            // The tied copies of later uses (where a checkpoint stores
            // them) are the first use's.
            let Some(b) = self.block_at(l) else {
                return Ok(());
            };
            if let Some((proj, u, m)) = adapter(st) {
                // Adapter u lives in the block it belongs to.
                if u >= self.hybrid.len() || self.block_of_use(u) != b || m > 1 {
                    return Err(unused());
                }
                let at = self.hybrid[u];
                let ab = if m == 0 { "lora_a" } else { "lora_b" };
                match proj {
                    "q" | "k" | "v" => out.push(OutTensor::one(
                        format!("blk.{at}.attn_{proj}.weight.{ab}"),
                        &t.name,
                        &t.shape,
                    )),
                    "gate_up" => {
                        for (part, w) in ["ffn_gate", "ffn_up"].iter().enumerate() {
                            let name = format!("blk.{at}.{w}.weight.{ab}");
                            out.push(if m == 0 {
                                OutTensor::one(name, &t.name, &t.shape)
                            } else {
                                let rank = t.shape.get(1).copied().unwrap_or(0);
                                expect_numel(t, &[2 * self.n_ff as usize, rank])?;
                                OutTensor {
                                    name,
                                    shape: vec![self.n_ff as usize, rank],
                                    src: Source::SplitRows {
                                        name: t.name.clone(),
                                        part,
                                        n_rows: self.n_ff as usize,
                                    },
                                    ops: Vec::new(),
                                }
                            });
                        }
                    }
                    _ => return Err(unused()),
                }
                return Ok(());
            }
            if st == "feed_forward.gate_up_proj.weight" {
                let ff = self.n_ff as usize;
                expect_numel(t, &[2 * ff, self.d_model as usize])?;
                for (part, w) in ["ffn_gate", "ffn_up"].iter().enumerate() {
                    out.push(OutTensor {
                        name: format!("shared.{b}.{w}.weight"),
                        shape: vec![ff, self.d_model as usize],
                        src: Source::SplitRows {
                            name: t.name.clone(),
                            part,
                            n_rows: ff,
                        },
                        ops: Vec::new(),
                    });
                }
                return Ok(());
            }
            let n = shared_name(st).ok_or_else(unused)?;
            out.push(OutTensor::one(format!("shared.{b}.{n}"), &t.name, &t.shape));
            return Ok(());
        }
        if rest == "linear.weight" {
            if !self.hybrid.contains(&l) {
                return Err(unused());
            }
            out.push(OutTensor::one(
                format!("blk.{l}.shared_out.weight"),
                &t.name,
                &t.shape,
            ));
            return Ok(());
        }
        // The Mamba-2 layer (`mamba_decoder.` in hybrid layers).
        let rest = rest.strip_prefix("mamba_decoder.").unwrap_or(rest);
        let n = layer_name(rest).ok_or_else(unused)?;
        let o = mamba2_tensor(
            t,
            format!("blk.{l}.{n}"),
            self.n_group as usize,
            self.d_inner as usize,
        )?;
        if o.name.ends_with(".ssm_a") || o.name.ends_with(".ssm_d") {
            expect_numel(t, &[self.n_head_ssm as usize])?;
        }
        out.push(o);
        Ok(())
    }

    fn required(&self) -> Vec<String> {
        let mut v = super::required_names((0..self.n_layer).map(|b| (b, super::MAMBA2_LAYER)));
        v.extend((0..self.n_layer).map(|b| format!("blk.{b}.attn_norm.weight")));
        for b in 0..self.n_blocks.min(self.hybrid.len()) {
            for s in [
                "attn_norm",
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_norm",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
            ] {
                v.push(format!("shared.{b}.{s}.weight"));
            }
        }
        for &l in &self.hybrid {
            v.push(format!("blk.{l}.shared_out.weight"));
            let mut w = vec!["ffn_gate", "ffn_up"];
            if self.attn_adapters {
                w.extend(["attn_q", "attn_k", "attn_v"]);
            }
            for w in w {
                for ab in ["lora_a", "lora_b"] {
                    v.push(format!("blk.{l}.{w}.weight.{ab}"));
                }
            }
        }
        v
    }

    fn vocab(&self) -> VocabSpec {
        VocabSpec {
            style: VocabStyle::SpmFirst,
            pad_multiple: 1,
        }
    }
}
