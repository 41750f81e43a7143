//! Bamba and GraniteMoeHybrid (Granite 4.0-H) → `granitehybrid`: Mamba-2
//! layers, attention layers with Q/K permuted for ggml's RoPE, dense SwiGLU
//! or MoE + shared expert; Granite multipliers as metadata.
//!
//! Deviations from llama.cpp's converter, following transformers:
//! - Bamba rotates only the first `attn_rotary_emb` lanes of each head;
//!   coil permutes only those rows and writes `coil.rope.partial_permute`.
//! - `position_embedding_type: "rope"` on GraniteMoeHybrid turns RoPE on
//!   (`rope.scaling.finetuned` true), where llama.cpp drops it.
//! - transformers 5's layer types `full_attention` / `linear_attention`
//!   are recognised besides `attention` / `mamba`.

use super::llama::{permute_attn, rope_dim, text_params, TextOpts};
use super::mamba::block_count;
use super::{mamba2_tensor, map_name, Arch, Ctx, Kv, LayerKind, VocabSpec, VocabStyle};
use crate::config::Config;
use crate::error::{ConvertError, Result};
use crate::plan::{OutTensor, Source};
use crate::safetensors_src::SrcTensor;
use coil_gguf::Value;

/// The Mamba-2 dimensions shared by the hybrids.
pub(crate) struct SsmDims {
    pub d_inner: u64,
    pub n_group: u64,
    pub n_head: u64,
    pub d_conv: u64,
    pub d_state: u64,
}

/// Keys with transformers' `mamba_` prefix as fallbacks (llama.cpp's
/// `hparam_prefixes`).
pub(crate) fn with_prefix(keys: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    v.extend(keys.iter().map(|k| format!("mamba_{k}")));
    v
}

pub(crate) fn pfind(c: &Config, keys: &[&str]) -> Result<Option<u64>> {
    let v = with_prefix(keys);
    let refs: Vec<&str> = v.iter().map(String::as_str).collect();
    c.uint(&refs)
}

pub(crate) fn preq(c: &Config, keys: &[&str]) -> Result<u64> {
    pfind(c, keys)?.ok_or_else(|| {
        ConvertError::config(
            with_prefix(keys).join(" | "),
            "missing (or zero) in config.json; it must be a positive integer",
        )
    })
}

impl SsmDims {
    /// As llama.cpp's `GraniteHybridModel`: `d_inner = expand · d_model`
    /// with `d_model` the Mamba head dim if given, else the hidden size.
    pub fn granite(c: &Config) -> Result<SsmDims> {
        let d_model = c.req_uint(&["mamba_head_dim", "hidden_size", "d_model"])?;
        let expand = preq(c, &["expand", "num_heads"])?;
        SsmDims::finish(c, d_model * expand)
    }

    pub fn finish(c: &Config, d_inner: u64) -> Result<SsmDims> {
        let n_group = preq(c, &["n_groups", "num_groups"])?;
        let n_head = preq(c, &["n_heads", "num_heads"])?;
        let d_conv = preq(c, &["conv_kernel", "d_conv"])?;
        let d_state = preq(c, &["state_size", "d_state", "state_dim", "ssm_state_size"])?;
        if !d_inner.is_multiple_of(n_group) || !d_inner.is_multiple_of(n_head) {
            return Err(ConvertError::config(
                "mamba_n_groups / mamba_n_heads",
                format!("the SSM inner size {d_inner} is not a multiple of n_groups {n_group} and n_heads {n_head}"),
            ));
        }
        crate::config::check_range("mamba_d_conv", d_conv, 1, 64)?;
        crate::config::check_range("mamba_d_state", d_state, 1, 4096)?;
        Ok(SsmDims {
            d_inner,
            n_group,
            n_head,
            d_conv,
            d_state,
        })
    }

    pub fn write(&self, kv: &mut Kv) -> Result<()> {
        kv.u32("ssm.conv_kernel", self.d_conv)?;
        kv.u32("ssm.state_size", self.d_state)?;
        kv.u32("ssm.group_count", self.n_group)?;
        kv.u32("ssm.inner_size", self.d_inner)?;
        kv.u32("ssm.time_step_rank", self.n_head)?;
        Ok(())
    }
}

/// Per-layer kinds from `layer_types` or `attn_layer_indices` /
/// `attn_layer_period` + `attn_layer_offset`.
fn layer_kinds(c: &Config, n_layer: usize) -> Result<Vec<LayerKind>> {
    if let Some(types) = c.strs("layer_types")? {
        if types.len() != n_layer {
            return Err(ConvertError::config(
                "layer_types",
                format!("{} entries for {n_layer} layers", types.len()),
            ));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                "attention" | "full_attention" => Ok(LayerKind::Attention),
                "mamba" | "linear_attention" | "mamba2" => Ok(LayerKind::Ssm),
                other => Err(ConvertError::config(
                    "layer_types",
                    format!("unknown layer type {other:?}"),
                )),
            })
            .collect();
    }
    let mut attn = c.uints("attn_layer_indices")?.unwrap_or_default();
    if attn.is_empty() {
        let per = c.uint(&["attn_layer_period"])?.ok_or_else(|| {
            ConvertError::config(
                "attn_layer_indices",
                "none of layer_types, attn_layer_indices or attn_layer_period is given",
            )
        })?;
        let off = c
            .uint0(&["attn_layer_offset"])?
            .ok_or_else(|| ConvertError::config("attn_layer_offset", "missing"))?;
        attn = (0..n_layer as u64).filter(|i| i % per == off).collect();
    }
    if let Some(&bad) = attn.iter().find(|&&i| i as usize >= n_layer) {
        return Err(ConvertError::config(
            "attn_layer_indices",
            format!("layer {bad} is out of range (0..{n_layer})"),
        ));
    }
    Ok((0..n_layer)
        .map(|i| {
            if attn.contains(&(i as u64)) {
                LayerKind::Attention
            } else {
                LayerKind::Ssm
            }
        })
        .collect())
}

pub(crate) struct GraniteHybrid<'a> {
    ctx: &'a Ctx<'a>,
    bamba: bool,
    n_layer: usize,
    kinds: Vec<LayerKind>,
    ssm: SsmDims,
    n_head: usize,
    n_head_kv: usize,
    has_experts: bool,
    use_rope: bool,
    /// Rotary lanes per head (Bamba: partial).
    rot: usize,
    head_dim: usize,
}

impl<'a> GraniteHybrid<'a> {
    pub fn new(ctx: &'a Ctx<'a>, bamba: bool) -> Result<Self> {
        let c = ctx.cfg;
        let n_layer = block_count(ctx)?;
        let kinds = layer_kinds(c, n_layer)?;
        let ssm = SsmDims::granite(c)?;
        let n_head = c.req_uint(&["num_attention_heads"])? as usize;
        let n_head_kv = c
            .uint(&["num_key_value_heads"])?
            .map_or(n_head, |v| v as usize);
        let has_experts = c.uint(&["num_local_experts"])?.is_some();
        let has_ssm = kinds.contains(&LayerKind::Ssm);
        let rope_cfg = c.str("position_embedding_type") == Some("rope");
        let use_rope = bamba || !has_ssm || rope_cfg;
        let head_dim = rope_dim(c, false)? as usize;
        let rot = if bamba {
            match c.uint(&["attn_rotary_emb"])? {
                Some(r) => r as usize,
                None => {
                    let f = c
                        .get("rope_parameters")
                        .and_then(|r| r.get("partial_rotary_factor"))
                        .and_then(crate::config::as_f64)
                        .unwrap_or(0.5);
                    (head_dim as f64 * f) as usize
                }
            }
        } else {
            head_dim
        };
        if rot > head_dim || rot % 2 != 0 {
            return Err(ConvertError::config(
                "attn_rotary_emb",
                format!("{rot} rotary lanes do not fit the head size {head_dim} (must be even and ≤ it)"),
            ));
        }
        Ok(GraniteHybrid {
            ctx,
            bamba,
            n_layer,
            kinds,
            ssm,
            n_head,
            n_head_kv,
            has_experts,
            use_rope,
            rot,
            head_dim,
        })
    }
}

impl Arch for GraniteHybrid<'_> {
    fn arch(&self) -> &str {
        "granitehybrid"
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        let c = self.ctx.cfg;
        text_params(
            self.ctx,
            kv,
            self.n_layer,
            TextOpts {
                moe: true,
                head_dim: false,
            },
        )?;
        if let Some(v) = c.uint(&["vocab_size"])? {
            kv.u32("vocab_size", v)?;
        }
        kv.u32("rope.dimension_count", self.head_dim as u64)?;
        for (k, g) in [
            ("attention_multiplier", "attention.scale"),
            ("embedding_multiplier", "embedding_scale"),
            ("residual_multiplier", "residual_scale"),
            ("logits_scaling", "logit_scale"),
        ] {
            if let Some(v) = c.float(&[k])? {
                kv.f32(g, v);
            }
        }
        if let Some(v) = c.uint(&["shared_intermediate_size"])? {
            kv.u32("expert_shared_feed_forward_length", v)?;
        }
        self.ssm.write(kv)?;
        if let Some(r) = c.uint(&["attn_rotary_emb"])? {
            kv.u32("rope.dimension_count", r)?;
        } else if self.bamba {
            kv.u32("rope.dimension_count", self.rot as u64)?;
        }
        let n_kv = self.n_head_kv as u64;
        let kv_vec: Vec<u64> = self
            .kinds
            .iter()
            .map(|k| if *k == LayerKind::Attention { n_kv } else { 0 })
            .collect();
        kv.i32s("attention.head_count_kv", &kv_vec)?;
        kv.bool("rope.scaling.finetuned", self.use_rope);
        if !self.use_rope {
            kv.u32("context_length", 1 << 20)?;
        }
        if self.bamba {
            kv.raw("coil.rope.partial_permute", Value::Bool(true));
        }
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &SrcTensor,
        bid: Option<usize>,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        let c = self.ctx.cfg;
        let b = bid.unwrap_or(0);
        let split = |name: &str, rows: u64, gate: &str, up: &str, out: &mut Vec<OutTensor>| {
            let rows = rows as usize;
            for (part, gg) in [(0, gate), (1, up)] {
                let mut shape = t.shape.clone();
                let nd = shape.len();
                shape[nd - 2] = rows;
                out.push(OutTensor {
                    name: format!("blk.{b}.{gg}.weight"),
                    shape,
                    src: Source::SplitRows {
                        name: name.to_string(),
                        part,
                        n_rows: rows,
                    },
                    ops: Vec::new(),
                });
            }
        };
        if t.name.ends_with("block_sparse_moe.input_linear.weight") {
            let ff = c.req_uint(&["intermediate_size"])?;
            check_merged(t, ff)?;
            split(&t.name, ff, "ffn_gate_exps", "ffn_up_exps", out);
            return Ok(());
        }
        if t.name.ends_with("block_sparse_moe.output_linear.weight") {
            out.push(OutTensor::one(
                format!("blk.{b}.ffn_down_exps.weight"),
                &t.name,
                &t.shape,
            ));
            return Ok(());
        }
        if t.name.ends_with("shared_mlp.input_linear.weight") {
            let ff = c.req_uint(&["shared_intermediate_size"])?;
            check_merged(t, ff)?;
            if self.has_experts {
                split(&t.name, ff, "ffn_gate_shexp", "ffn_up_shexp", out);
            } else {
                split(&t.name, ff, "ffn_gate", "ffn_up", out);
            }
            return Ok(());
        }
        if t.name.ends_with("shared_mlp.output_linear.weight") {
            let n = if self.has_experts {
                "ffn_down_shexp"
            } else {
                "ffn_down"
            };
            out.push(OutTensor::one(
                format!("blk.{b}.{n}.weight"),
                &t.name,
                &t.shape,
            ));
            return Ok(());
        }
        let name = map_name(&t.name, bid, "granitehybrid")?;
        let kind = bid.and_then(|b| self.kinds.get(b)).copied();
        let o = match kind {
            Some(LayerKind::Ssm) => mamba2_tensor(
                t,
                name,
                self.ssm.n_group as usize,
                self.ssm.d_inner as usize,
            )?,
            Some(LayerKind::Attention) => {
                let o = OutTensor::one(name, &t.name, &t.shape);
                let rot = if self.bamba { Some(self.rot) } else { None };
                permute_attn(o, &t.name, self.n_head, self.n_head_kv, rot)
            }
            _ => OutTensor::one(name, &t.name, &t.shape),
        };
        out.push(o);
        Ok(())
    }

    fn required(&self) -> Vec<String> {
        super::required_names(self.kinds.iter().enumerate().map(|(b, k)| {
            (
                b,
                if *k == LayerKind::Attention {
                    super::ATTN_LAYER
                } else {
                    super::MAMBA2_LAYER
                },
            )
        }))
    }

    fn vocab(&self) -> VocabSpec {
        let ssm = self.kinds.contains(&LayerKind::Ssm);
        VocabSpec {
            style: VocabStyle::SpmFirst,
            pad_multiple: if ssm { 8 } else { 1 },
        }
    }
}

fn check_merged(t: &SrcTensor, ff: u64) -> Result<()> {
    let nd = t.shape.len();
    if nd < 2 || t.shape[nd - 2] as u64 != 2 * ff {
        let mut expected = t.shape.clone();
        if nd >= 2 {
            expected[nd - 2] = 2 * ff as usize;
        }
        return Err(ConvertError::Shape {
            name: t.name.clone(),
            actual: t.shape.clone(),
            expected,
        });
    }
    Ok(())
}
