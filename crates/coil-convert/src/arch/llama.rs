//! Llama (and Mistral) → `llama`: Q/K rows permuted for ggml's RoPE; the
//! llama.cpp `TextModel` hyper-parameters shared with the Granite and
//! Nemotron-H families.

use super::mamba::block_count;
use super::{map_name, Arch, Ctx, ExpertBuf, Kv, VocabSpec, VocabStyle};
use crate::config::Config;
use crate::error::Result;
use crate::plan::{Op, OutTensor, Source};
use crate::safetensors_src::SrcTensor;
use coil_gguf::Value;

/// Which of llama.cpp's generic keys a family writes.
pub(crate) struct TextOpts {
    /// Write the MoE keys (expert counts, groups).
    pub moe: bool,
    /// Write `attention.key_length`/`value_length` from `head_dim`.
    pub head_dim: bool,
}

/// The `rope_parameters` (transformers 5) or `rope_scaling` table.
pub(crate) fn rope_params(cfg: &Config) -> serde_json::Map<String, serde_json::Value> {
    cfg.get("rope_parameters")
        .or_else(|| cfg.get("rope_scaling"))
        .and_then(|v| v.as_object())
        .cloned()
        .unwrap_or_default()
}

/// llama.cpp's `TextModel.set_gguf_parameters`, in its order.
pub(crate) fn text_params(ctx: &Ctx, kv: &mut Kv, n_layer: usize, o: TextOpts) -> Result<()> {
    let c = ctx.cfg;
    kv.u32("block_count", n_layer as u64)?;
    let ctx_keys = [
        "max_position_embeddings",
        "n_ctx",
        "n_positions",
        "max_length",
        "max_sequence_length",
        "model_max_length",
    ];
    if let Some(n) = c.uint0(&ctx_keys)? {
        kv.u32("context_length", n)?;
    }
    if let Some(n) = c.uint0(&["hidden_size", "n_embd", "dim"])? {
        kv.u32("embedding_length", n)?;
    }
    let ff_keys = [
        "prefix_dense_intermediate_size",
        "dense_intermediate_size",
        "intermediate_size",
        "n_inner",
        "hidden_dim",
    ];
    if let Some(n) = c.uint0(&ff_keys)? {
        kv.u32("feed_forward_length", n)?;
    }
    if let Some(n) = c.uint0(&["num_attention_heads", "n_head", "n_heads"])? {
        kv.u32("attention.head_count", n)?;
    }
    if let Some(n) = c.uint0(&["num_key_value_heads", "n_kv_heads"])? {
        kv.u32("attention.head_count_kv", n)?;
    }
    let rp = rope_params(c);
    let rtype = rp
        .get("rope_type")
        .or_else(|| rp.get("type"))
        .and_then(|v| v.as_str());
    let factor = rp.get("factor").and_then(crate::config::as_f64);
    match (rtype, factor) {
        (Some("linear"), Some(f)) => {
            kv.raw(
                &format!("{}.rope.scaling.type", kv.arch),
                Value::String("linear".into()),
            );
            kv.f32("rope.scaling.factor", f);
        }
        (Some("yarn"), Some(f)) => {
            kv.raw(
                &format!("{}.rope.scaling.type", kv.arch),
                Value::String("yarn".into()),
            );
            kv.f32("rope.scaling.factor", f);
            if let Some(n) = rp
                .get("original_max_position_embeddings")
                .and_then(|v| v.as_u64())
            {
                kv.u32("rope.scaling.original_context_length", n)?;
            }
        }
        _ => {}
    }
    // Multi-section RoPE (Qwen-VL, Qwen3.5): [time, height, width, extra].
    if let Some(sec) = rp.get("mrope_section") {
        let mut v: Vec<u64> = sec
            .as_array()
            .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
            .unwrap_or_default();
        if v.len() != sec.as_array().map_or(0, Vec::len) {
            return Err(crate::error::ConvertError::config(
                "rope_parameters.mrope_section",
                format!("expected a list of integers, found {sec}"),
            ));
        }
        v.resize(v.len().max(4), 0);
        kv.i32s("rope.dimension_sections", &v[..4])?;
    }
    let theta = rp
        .get("rope_theta")
        .and_then(crate::config::as_f64)
        .or(c.float0(&[
            "global_rope_theta",
            "rope_global_theta",
            "rope_theta_global",
            "rope_theta",
            "rotary_emb_base",
        ])?);
    if let Some(t) = theta {
        kv.f32("rope.freq_base", t);
    }
    if let Some(e) = c.float0(&["rms_norm_eps", "norm_eps"])? {
        kv.f32("attention.layer_norm_rms_epsilon", e);
    }
    if let Some(e) = c.float0(&["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"])? {
        kv.f32("attention.layer_norm_epsilon", e);
    }
    if o.moe {
        if let Some(n) = c.uint0(&["num_local_experts", "num_experts", "n_routed_experts"])? {
            kv.u32("expert_count", n)?;
        }
        if let Some(n) = c.uint0(&[
            "num_experts_per_tok",
            "num_experts_per_token",
            "top_k_experts",
        ])? {
            kv.u32("expert_used_count", n)?;
        }
        if let Some(n) = c.uint0(&["n_group"])? {
            kv.u32("expert_group_count", n)?;
        }
        if let Some(n) = c.uint0(&["topk_group"])? {
            kv.u32("expert_group_used_count", n)?;
        }
        let score = [
            "score_function",
            "scoring_func",
            "score_func",
            "moe_router_activation",
            "moe_router_activation_func",
            "expert_selection_fn",
        ]
        .iter()
        .find_map(|k| c.str(k));
        match score {
            Some("softmax") => kv.u32("expert_gating_func", 1)?,
            Some("sigmoid") => kv.u32("expert_gating_func", 2)?,
            _ => {}
        }
    }
    if o.head_dim {
        if let Some(h) = c.uint0(&["head_dim"])? {
            kv.u32("attention.key_length", h)?;
            kv.u32("attention.value_length", h)?;
        }
    }
    kv.file_type(ctx.file_type);
    Ok(())
}

/// `hidden_size / num_attention_heads`, or `head_dim` when `use_head_dim`.
pub(crate) fn rope_dim(c: &Config, use_head_dim: bool) -> Result<u64> {
    if use_head_dim {
        if let Some(h) = c.uint(&["head_dim"])? {
            return Ok(h);
        }
    }
    let hidden = c.req_uint(&["hidden_size", "dim"])?;
    let heads = c.req_uint(&["num_attention_heads", "n_heads"])?;
    Ok(hidden / heads)
}

/// Llama 3's RoPE frequency factors (`rope_type: "llama3"`), as llama.cpp's
/// `LlamaModel.generate_extra_tensors` computes them (in f32).
fn llama3_rope_factors(c: &Config) -> Result<Option<Vec<f32>>> {
    let rp = rope_params(c);
    let is_l3 = rp
        .get("rope_type")
        .or_else(|| rp.get("type"))
        .and_then(|v| v.as_str())
        .is_some_and(|t| t.eq_ignore_ascii_case("llama3"));
    if !is_l3 {
        return Ok(None);
    }
    let num = |k: &str, d: f64| rp.get(k).and_then(crate::config::as_f64).unwrap_or(d) as f32;
    let base = num("rope_theta", c.float0(&["rope_theta"])?.unwrap_or(10000.0));
    let dim = rope_dim(c, true)? as usize;
    let factor = num("factor", 8.0);
    let low = num("low_freq_factor", 1.0);
    let high = num("high_freq_factor", 4.0);
    let old_ctx = num("original_max_position_embeddings", 8192.0);
    let low_wl = old_ctx / low;
    let high_wl = old_ctx / high;
    Ok(Some(
        (0..dim)
            .step_by(2)
            .map(|i| {
                let freq = 1.0 / base.powf(i as f32 / dim as f32);
                let wl = 2.0 * std::f32::consts::PI / freq;
                if wl < high_wl {
                    1.0
                } else if wl > low_wl {
                    factor
                } else {
                    let smooth = (old_ctx / wl - low) / (high - low);
                    1.0 / ((1.0 - smooth) / factor + smooth)
                }
            })
            .collect(),
    ))
}

pub(crate) struct Llama<'a> {
    ctx: &'a Ctx<'a>,
    n_layer: usize,
    n_head: usize,
    n_head_kv: usize,
    experts: ExpertBuf,
}

impl<'a> Llama<'a> {
    pub fn new(ctx: &'a Ctx<'a>) -> Result<Self> {
        let n_head = ctx.cfg.req_uint(&["n_heads", "num_attention_heads"])? as usize;
        let n_head_kv = ctx
            .cfg
            .uint(&["n_kv_heads", "num_key_value_heads"])?
            .map_or(n_head, |v| v as usize);
        Ok(Llama {
            ctx,
            n_layer: block_count(ctx)?,
            n_head,
            n_head_kv,
            experts: ExpertBuf::default(),
        })
    }
}

/// The Q/K permutation of attention tensors (llama.cpp's `undo_permute`).
pub(crate) fn permute_attn(
    o: OutTensor,
    hf: &str,
    n_head: usize,
    n_head_kv: usize,
    rot: Option<usize>,
) -> OutTensor {
    let rows = o.shape.first().copied().unwrap_or(0);
    let pick = |heads: usize| {
        let hd = rows.checked_div(heads).unwrap_or(0);
        Op::PermuteQk {
            n_head: heads,
            rot: rot.unwrap_or(hd).min(hd),
        }
    };
    if hf.ends_with("q_proj.weight") || hf.ends_with("q_proj.bias") {
        o.with(pick(n_head))
    } else if hf.ends_with("k_proj.weight") || hf.ends_with("k_proj.bias") {
        o.with(pick(n_head_kv))
    } else {
        o
    }
}

impl Arch for Llama<'_> {
    fn arch(&self) -> &str {
        "llama"
    }

    fn params(&self, kv: &mut Kv) -> Result<()> {
        text_params(
            self.ctx,
            kv,
            self.n_layer,
            TextOpts {
                moe: true,
                head_dim: true,
            },
        )?;
        if !self.ctx.mistral {
            if let Some(v) = self.ctx.cfg.uint(&["vocab_size"])? {
                kv.u32("vocab_size", v)?;
            }
        }
        kv.u32("rope.dimension_count", rope_dim(self.ctx.cfg, true)?)?;
        Ok(())
    }

    fn tensor(
        &mut self,
        t: &SrcTensor,
        bid: Option<usize>,
        out: &mut Vec<OutTensor>,
    ) -> Result<()> {
        if t.name.contains("block_sparse_moe.experts.") {
            let n = self.ctx.cfg.req_uint(&["num_local_experts"])? as usize;
            let b = bid.unwrap_or(0);
            if self.experts.add(b, &t.name, n * 3) {
                self.experts.take(b);
                for (w, gg) in [
                    ("w1", "ffn_gate_exps"),
                    ("w2", "ffn_down_exps"),
                    ("w3", "ffn_up_exps"),
                ] {
                    let names: Vec<String> = (0..n)
                        .map(|x| {
                            format!("model.layers.{b}.block_sparse_moe.experts.{x}.{w}.weight")
                        })
                        .collect();
                    let first = self.ctx.ck.req(&names[0])?;
                    let mut shape = vec![n];
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
        let name = map_name(&t.name, bid, "llama")?;
        let o = OutTensor::one(name, &t.name, &t.shape);
        // Mistral's own layout is not permuted for transformers; only HF files are.
        let o = if self.ctx.mistral {
            o
        } else {
            permute_attn(o, &t.name, self.n_head, self.n_head_kv, None)
        };
        out.push(o);
        Ok(())
    }

    fn extra(&self, out: &mut Vec<OutTensor>) -> Result<()> {
        if let Some(f) = llama3_rope_factors(self.ctx.cfg)? {
            out.push(OutTensor {
                name: "rope_freqs.weight".into(),
                shape: vec![f.len()],
                src: Source::Data(f),
                ops: Vec::new(),
            });
        }
        Ok(())
    }

    fn finish(&mut self, _out: &mut Vec<OutTensor>) -> Result<()> {
        self.experts.check_done()
    }

    fn required(&self) -> Vec<String> {
        super::required_names((0..self.n_layer).map(|b| (b, super::ATTN_LAYER)))
    }

    fn vocab(&self) -> VocabSpec {
        VocabSpec {
            style: VocabStyle::SpmFirst,
            pad_multiple: 1,
        }
    }
}
