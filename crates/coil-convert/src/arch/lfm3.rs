//! LFM3 → `lfm3` (coil's layout; llama.cpp has no LFM3 support, so the
//! names follow its conventions for LFM2, for Gemma's sandwich norms and
//! for Gemma 4's sliding and "proportional" RoPE layers; see
//! docs/CONVERT.md):
//!
//! * `layer_types` become a per-layer `attention.head_count_kv` (0 = short
//!   conv) and `attention.sliding_window_pattern` (true = sliding layer),
//!   `sliding_window` → `attention.sliding_window`;
//! * RoPE per layer type: `full_attention` → `rope.freq_base`,
//!   `rope.dimension_count`; `sliding_attention` → `rope.freq_base_swa`,
//!   `rope.dimension_count_swa`. transformers rotates the whole head with
//!   "default" RoPE (whatever `partial_rotary_factor`), and with
//!   "proportional" RoPE the first `partial_rotary_factor·head_dim/2` pairs
//!   of the NeoX halves at `θ^(−2i/head_dim)`, the rest not at all: the
//!   dimension count is then the head and `rope_freqs.weight`
//!   (`rope_freqs_swa.weight` for sliding layers) holds 1 for the rotated
//!   pairs and 1e30 for the others, as llama.cpp writes Gemma 4's;
//! * tensors: LFM2's names, plus `self_attn.q_norm` / `k_norm` →
//!   `attn_q_norm` / `attn_k_norm`, `self_attn.gate_proj` (transformers' `g_proj`) → `attn_gate`,
//!   `post_operator_norm` → `post_attention_norm`, `post_ffn_norm` →
//!   `post_ffw_norm`, `embedding_norm` → `token_embd_norm`; the conv kernel
//!   `{d, 1, L}` squeezed to `{d, L}`.

use super::llama::{text_params, TextOpts};
use super::mamba::block_count;
use super::{map_name, squeezed, Arch, Ctx, Kv, VocabSpec, VocabStyle};
use crate::error::{ConvertError, Result};
use crate::plan::{OutTensor, Source};
use crate::safetensors_src::SrcTensor;
use serde_json::Value as Json;

/// What a layer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Conv,
    Full,
    Sliding,
}

/// One layer type's RoPE: θ, and the rotated pairs when "proportional".
struct RopeSpec {
    theta: f64,
    /// `Some(k)`: only the first k of head_dim/2 pairs rotate.
    proportional: Option<usize>,
}

pub(crate) struct Lfm3<'a> {
    ctx: &'a Ctx<'a>,
    n_layer: usize,
    kinds: Vec<Kind>,
    head_dim: usize,
    full: RopeSpec,
    sliding: RopeSpec,
}

fn layer_kinds(ctx: &Ctx, n_layer: usize) -> Result<Vec<Kind>> {
    let types = ctx
        .cfg
        .strs("layer_types")?
        .ok_or_else(|| ConvertError::config("layer_types", "missing"))?;
    if types.len() != n_layer {
        return Err(ConvertError::config(
            "layer_types",
            format!("{} entries for {n_layer} layers", types.len()),
        ));
    }
    types
        .iter()
        .map(|t| match t.as_str() {
            "conv" => Ok(Kind::Conv),
            "full_attention" => Ok(Kind::Full),
            "sliding_attention" => Ok(Kind::Sliding),
            other => Err(ConvertError::config(
                "layer_types",
                format!("{other:?} is none of conv, full_attention, sliding_attention"),
            )),
        })
        .collect()
}

/// The RoPE of layer type `ty` from `rope_parameters[ty]`.
fn rope_spec(ctx: &Ctx, ty: &str, head_dim: usize) -> Result<RopeSpec> {
    let field = format!("rope_parameters.{ty}");
    let rp = ctx
        .cfg
        .get("rope_parameters")
        .and_then(|v| v.get(ty))
        .and_then(Json::as_object);
    let Some(rp) = rp else {
        return Ok(RopeSpec {
            theta: 10000.0,
            proportional: None,
        });
    };
    let num = |k: &str| rp.get(k).and_then(crate::config::as_f64);
    let theta = num("rope_theta").unwrap_or(10000.0);
    if num("factor").is_some_and(|f| f != 1.0) {
        return Err(ConvertError::config(
            &field,
            "a RoPE scaling factor other than 1 is not supported",
        ));
    }
    let proportional = match rp
        .get("rope_type")
        .and_then(Json::as_str)
        .unwrap_or("default")
    {
        "default" => None,
        "proportional" => {
            let f = num("partial_rotary_factor").unwrap_or(1.0);
            if !(0.0..=1.0).contains(&f) {
                return Err(ConvertError::config(
                    &field,
                    format!("partial_rotary_factor {f} is outside 0..=1"),
                ));
            }
            Some((f * head_dim as f64) as usize / 2)
        }
        other => {
            return Err(ConvertError::config(
                &field,
                format!("rope_type {other:?} is not supported (default or proportional)"),
            ))
        }
    };
    Ok(RopeSpec {
        theta,
        proportional,
    })
}

impl<'a> Lfm3<'a> {
    pub fn new(ctx: &'a Ctx<'a>) -> Result<Self> {
        let c = ctx.cfg;
        let n_layer = block_count(ctx)?;
        let kinds = layer_kinds(ctx, n_layer)?;
        for flag in ["conv_bias", "attention_bias"] {
            if c.bool(flag) == Some(true) {
                return Err(ConvertError::config(
                    flag,
                    "biases are not supported for LFM3",
                ));
            }
        }
        let head_dim = match c.uint(&["head_dim"])? {
            Some(h) => h,
            None => c.req_uint(&["hidden_size"])? / c.req_uint(&["num_attention_heads"])?.max(1),
        } as usize;
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(ConvertError::config(
                "head_dim",
                format!("{head_dim} is not a positive even number"),
            ));
        }
        Ok(Lfm3 {
            ctx,
            n_layer,
            kinds,
            head_dim,
            full: rope_spec(ctx, "full_attention", head_dim)?,
            sliding: rope_spec(ctx, "sliding_attention", head_dim)?,
        })
    }

    fn has(&self, k: Kind) -> bool {
        self.kinds.contains(&k)
    }
}

/// `[1; k] ++ [1e30; half − k]`: the divisors that leave all but the first
/// k pairs unrotated.
fn proportional_factors(k: usize, half: usize) -> Vec<f32> {
    (0..half).map(|i| if i < k { 1.0 } else { 1e30 }).collect()
}

/// GGUF name (after `blk.N.`) of an LFM3 layer tensor.
fn lfm3_layer_name(rest: &str) -> Option<&'static str> {
    Some(match rest {
        "operator_norm.weight" => "attn_norm.weight",
        "post_operator_norm.weight" => "post_attention_norm.weight",
        "post_ffn_norm.weight" => "post_ffw_norm.weight",
        "conv.conv.weight" => "shortconv.conv.weight",
        "conv.in_proj.weight" => "shortconv.in_proj.weight",
        "conv.out_proj.weight" => "shortconv.out_proj.weight",
        "self_attn.q_norm.weight" => "attn_q_norm.weight",
        "self_attn.k_norm.weight" => "attn_k_norm.weight",
        // `gate_proj` in the released checkpoints and in what
        // `save_pretrained` writes; `g_proj` in transformers' module.
        "self_attn.gate_proj.weight" | "self_attn.g_proj.weight" => "attn_gate.weight",
        _ => return None,
    })
}

impl Arch for Lfm3<'_> {
    fn arch(&self) -> &str {
        "lfm3"
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        let c = self.ctx.cfg;
        text_params(
            self.ctx,
            kv,
            self.n_layer,
            TextOpts {
                moe: false,
                head_dim: true,
            },
        )?;
        let n_kv = c.req_uint(&["num_key_value_heads"])?;
        let kv_vec: Vec<u64> = self
            .kinds
            .iter()
            .map(|&k| if k == Kind::Conv { 0 } else { n_kv })
            .collect();
        kv.i32s("attention.head_count_kv", &kv_vec)?;
        if self.has(Kind::Full) {
            kv.f32("rope.freq_base", self.full.theta);
            kv.u32("rope.dimension_count", self.head_dim as u64)?;
        }
        if self.has(Kind::Sliding) {
            kv.f32("rope.freq_base_swa", self.sliding.theta);
            kv.u32("rope.dimension_count_swa", self.head_dim as u64)?;
            let w = c.req_uint(&["sliding_window"]).map_err(|_| {
                ConvertError::config(
                    "sliding_window",
                    "missing, though a layer is sliding_attention",
                )
            })?;
            if w == 0 {
                return Err(ConvertError::config(
                    "sliding_window",
                    "a window of 0 tokens",
                ));
            }
            kv.u32("attention.sliding_window", w)?;
            let pattern: Vec<bool> = self.kinds.iter().map(|&k| k == Kind::Sliding).collect();
            kv.bools("attention.sliding_window_pattern", &pattern);
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
        Ok(())
    }

    fn extra(&self, out: &mut Vec<OutTensor>) -> Result<()> {
        let half = self.head_dim / 2;
        for (kind, spec, name) in [
            (Kind::Full, &self.full, "rope_freqs.weight"),
            (Kind::Sliding, &self.sliding, "rope_freqs_swa.weight"),
        ] {
            if let (true, Some(k)) = (self.has(kind), spec.proportional) {
                out.push(OutTensor {
                    name: name.into(),
                    shape: vec![half],
                    src: Source::Data(proportional_factors(k, half)),
                    ops: Vec::new(),
                });
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
        if t.name == "model.embedding_norm.weight" {
            out.push(OutTensor::one("token_embd_norm.weight", &t.name, &t.shape));
            return Ok(());
        }
        let rest = super::layer_rest(&t.name);
        let name = match (bid, rest.and_then(lfm3_layer_name)) {
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

    fn required(&self) -> Vec<String> {
        let c = self.ctx.cfg;
        let sandwich = c.bool("use_sandwich_norm").unwrap_or(true);
        let gate = c.bool("use_attention_gate").unwrap_or(true);
        let mut v = vec![
            "token_embd.weight".to_string(),
            "token_embd_norm.weight".to_string(),
        ];
        for (b, &kind) in self.kinds.iter().enumerate() {
            let mut s: Vec<&str> = vec![
                "attn_norm.weight",
                "ffn_norm.weight",
                "ffn_gate.weight",
                "ffn_up.weight",
                "ffn_down.weight",
            ];
            if sandwich {
                s.extend(["post_attention_norm.weight", "post_ffw_norm.weight"]);
            }
            if kind == Kind::Conv {
                s.extend([
                    "shortconv.conv.weight",
                    "shortconv.in_proj.weight",
                    "shortconv.out_proj.weight",
                ]);
            } else {
                s.extend(super::ATTN_LAYER);
                s.extend(["attn_q_norm.weight", "attn_k_norm.weight"]);
                if gate {
                    s.push("attn_gate.weight");
                }
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
