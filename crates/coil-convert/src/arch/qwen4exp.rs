//! Qwen4-Exp → `qwen4exp`: the Qwen3.5-MoE conversion (see `qwen35.rs`:
//! value heads tiled, `ssm_a` = −exp(A_log), zero-centred norms stored as
//! `1 + w`, experts stacked) with what llama.cpp's `conversion/qwen4exp.py`
//! adds:
//!
//! - hyper-connections: `layers.N.{attn,mlp}_hyper_connection.{hc_norm,
//!   input_mix_weight_down, input_mix_weight_up, block_inject_weight}` →
//!   `blk.N.hc_{attn,ffn}_{norm,down,up,inject}`, the final
//!   `hyper_connection_mixer` → `output_hc_{norm,down,up}` (the norms
//!   `1 + w`); keys `hyper_connection.count`, `.low_rank`;
//! - the QSA indexer: `index_qk_proj` split into `indexer.q_proj` (the
//!   first `indexer_n_heads · indexer_head_dim` rows) and `indexer.k_proj`,
//!   `q_layernorm` / `k_layernorm` → `indexer.q_norm` / `k_norm` (`1 + w`);
//!   keys `attention.indexer.{head_count, key_length, top_k}` and per layer
//!   `attention.compress_ratios` (the block size on attention layers, 0 on
//!   the others);
//! - the per-layer embedding (one layer): `ple.{key_proj, value_proj,
//!   norm_key, norm_query, norm_conv, conv1d}` → `blk.N.ple_*` (norms
//!   `1 + w`, the conv squeezed), the n-gram table's shards
//!   (`ngram_embedding.shard_<i>.weight`, `split_ngram_parts` of them)
//!   concatenated by index into `per_layer_token_embd`, and the int64 hash
//!   buffers as u64 array keys `ple.{layer_multipliers, head_offsets,
//!   head_vocab_sizes}` beside `ple.{layers, ngram_size, heads_per_ngram,
//!   conv_kernel, eos_token_id}` and `embedding_length_per_layer_input`;
//! - no multi-token-prediction block (llama.cpp's converter drops it).
//!
//! Where coil differs: the indexed layers count whether `layer_types`
//! spells them "full_attention" (the released checkpoint) or
//! "indexed_attention" (transformers 5's `save_pretrained`); llama.cpp's
//! converter, reading the config through transformers 5, writes a
//! compression ratio of 0 (dense attention) for the latter. A checkpoint
//! whose DeltaNet output gate is `silu` is refused: llama.cpp's `qwen4exp`
//! files carry no switch and mean `sigmoid`.

use super::{Ctx, Kv};
use crate::error::{ConvertError, Result};
use crate::plan::{Op, OutTensor, Source};
use crate::safetensors_src::SrcTensor;
use std::collections::BTreeMap;

/// What the Qwen4-Exp additions need beyond the Qwen3.5-MoE conversion.
pub(crate) struct Extras {
    hc: usize,
    n_idx_q: usize,
    /// The PLE layer, if any.
    ple: Option<usize>,
    n_shards: usize,
    shards: BTreeMap<usize, String>,
}

/// The checkpoint's int64 buffer ending in `suffix` (llama.cpp reads the
/// first, in checkpoint order).
fn hash_constants(ctx: &Ctx, suffix: &str) -> Result<Vec<u64>> {
    let t = (ctx.ck.tensors().iter())
        .find(|t| t.name.ends_with(suffix))
        .ok_or_else(|| {
            ConvertError::tensor(
                suffix,
                "PLE constant missing from the checkpoint".to_string(),
            )
        })?;
    Ok(ctx.ck.read_i64(t)?.into_iter().map(|v| v as u64).collect())
}

impl Extras {
    pub fn new(ctx: &Ctx, n_layer: usize, recurrent: &[bool]) -> Result<Extras> {
        let c = ctx.cfg;
        let gate = c
            .str("output_gate_type")
            .or(c.str("hidden_act"))
            .unwrap_or("silu");
        if gate != "sigmoid" {
            return Err(ConvertError::config(
                "output_gate_type",
                format!("{gate:?}: llama.cpp's qwen4exp files mean a sigmoid DeltaNet output gate"),
            ));
        }
        let ple_ids = c.uints("ple_layer_ids")?.unwrap_or_default();
        let ple = match ple_ids[..] {
            [] => None,
            [id] if id >= 1 && (id as usize) <= n_layer && recurrent[id as usize - 1] => {
                Some(id as usize - 1)
            }
            [id] => {
                return Err(ConvertError::config(
                    "ple_layer_ids",
                    format!("layer {id} is not a linear-attention layer in 1..={n_layer}"),
                ))
            }
            _ => {
                return Err(ConvertError::config(
                    "ple_layer_ids",
                    format!(
                        "{} layers: llama.cpp's qwen4exp files hold one",
                        ple_ids.len()
                    ),
                ))
            }
        };
        Ok(Extras {
            hc: c.req_uint(&["hc_count"])? as usize,
            n_idx_q: (c.req_uint(&["indexer_n_heads"])? * c.req_uint(&["indexer_head_dim"])?)
                as usize,
            ple,
            n_shards: c.uint(&["split_ngram_parts"])?.unwrap_or(1) as usize,
            shards: BTreeMap::new(),
        })
    }

    /// The keys after Qwen3.5-MoE's, in llama.cpp's order.
    pub fn params(&self, ctx: &Ctx, kv: &mut Kv, recurrent: &[bool]) -> Result<()> {
        let c = ctx.cfg;
        kv.u32("hyper_connection.count", self.hc as u64)?;
        kv.u32("hyper_connection.low_rank", c.req_uint(&["hc_lowrank"])?)?;
        kv.u32(
            "attention.indexer.head_count",
            c.req_uint(&["indexer_n_heads"])?,
        )?;
        kv.u32(
            "attention.indexer.key_length",
            c.req_uint(&["indexer_head_dim"])?,
        )?;
        kv.u32("attention.indexer.top_k", c.req_uint(&["indexer_budget"])?)?;
        let ratio = c.req_uint(&["indexer_compress_ratio"])?;
        let ratios: Vec<u64> = recurrent
            .iter()
            .map(|&r| if r { 0 } else { ratio })
            .collect();
        kv.i32s("attention.compress_ratios", &ratios)?;
        let Some(l) = self.ple else {
            return Ok(());
        };
        kv.i32s("ple.layers", &[l as u64])?;
        kv.u32("ple.ngram_size", c.req_uint(&["ngram_size"])?)?;
        kv.u32("ple.heads_per_ngram", c.req_uint(&["heads_per_ngram"])?)?;
        kv.u32("ple.conv_kernel", c.req_uint(&["ple_conv_kernel_size"])?)?;
        let eos = match c.uints("eos_token_id") {
            Ok(Some(v)) if !v.is_empty() => v[v.len() - 1],
            _ => c.uint0(&["eos_token_id"])?.ok_or_else(|| {
                ConvertError::config(
                    "eos_token_id",
                    "missing: the n-gram hash restarts at it".to_string(),
                )
            })?,
        };
        kv.u32("ple.eos_token_id", eos)?;
        if let Some(img) = c.uint(&["image_token_id"])? {
            kv.u32("ple.image_token_id", img)?;
        }
        let row_dim = (ctx.ck.tensors().iter())
            .find(|t| t.name.contains(".ngram_embedding."))
            .and_then(|t| t.shape.last().copied());
        if let Some(d) = row_dim {
            kv.u32("embedding_length_per_layer_input", d as u64)?;
        }
        kv.u64s(
            "ple.layer_multipliers",
            &hash_constants(ctx, "ple_embedding.layer_multipliers")?,
        );
        kv.u64s(
            "ple.head_offsets",
            &hash_constants(ctx, "ple_embedding.ngram_heads_offsets")?,
        );
        kv.u64s(
            "ple.head_vocab_sizes",
            &hash_constants(ctx, "ple_embedding.ngram_heads_vocab_sizes")?,
        );
        Ok(())
    }

    /// The global tensors (`name` without a multimodal wrapper): the final
    /// mixer. `None`: not one of them.
    pub fn global(&self, t: &SrcTensor, name: &str) -> Option<OutTensor> {
        let rest = name.strip_prefix("model.hyper_connection_mixer.")?;
        let (gg, plus) = match rest {
            "hc_norm.weight" => ("output_hc_norm.weight", true),
            "input_mix_weight_down.weight" => ("output_hc_down.weight", false),
            "input_mix_weight_up.weight" => ("output_hc_up.weight", false),
            _ => return None,
        };
        let o = OutTensor::one(gg, &t.name, &t.shape);
        Some(if plus { o.with(Op::Add(1.0)) } else { o })
    }

    /// A layer tensor (`rest` after `layers.{b}.`); `Ok(false)`: not one of
    /// the additions.
    pub fn tensor(
        &mut self,
        ctx: &Ctx,
        t: &SrcTensor,
        b: usize,
        rest: &str,
        out: &mut Vec<OutTensor>,
    ) -> Result<bool> {
        let blk = |n: &str| format!("blk.{b}.{n}.weight");
        let one = |n: &str, plus: bool| {
            let o = OutTensor::one(blk(n), &t.name, &t.shape);
            if plus {
                o.with(Op::Add(1.0))
            } else {
                o
            }
        };
        for (hf, gg) in [
            ("attn_hyper_connection.", "hc_attn"),
            ("mlp_hyper_connection.", "hc_ffn"),
        ] {
            if let Some(r) = rest.strip_prefix(hf) {
                let o = match r {
                    "hc_norm.weight" => one(&format!("{gg}_norm"), true),
                    "input_mix_weight_down.weight" => one(&format!("{gg}_down"), false),
                    "input_mix_weight_up.weight" => one(&format!("{gg}_up"), false),
                    "block_inject_weight.weight" => one(&format!("{gg}_inject"), false),
                    _ => return Ok(false),
                };
                out.push(o);
                return Ok(true);
            }
        }
        if let Some(r) = rest.strip_prefix("self_attn.indexer.") {
            match r {
                "index_qk_proj.weight" => {
                    let rows = t.shape.first().copied().unwrap_or(0);
                    if rows <= self.n_idx_q || t.shape.len() != 2 {
                        return Err(ConvertError::tensor(
                            &t.name,
                            format!(
                                "{:?} has no key rows past the {} query rows",
                                t.shape, self.n_idx_q
                            ),
                        ));
                    }
                    for (n, range) in [
                        ("indexer.q_proj", 0..self.n_idx_q),
                        ("indexer.k_proj", self.n_idx_q..rows),
                    ] {
                        out.push(OutTensor {
                            name: blk(n),
                            shape: vec![range.len(), t.shape[1]],
                            src: Source::Gather {
                                name: t.name.clone(),
                                rows: Some(range.collect()),
                                cols: None,
                            },
                            ops: Vec::new(),
                        });
                    }
                }
                "q_layernorm.weight" => out.push(one("indexer.q_norm", true)),
                "k_layernorm.weight" => out.push(one("indexer.k_norm", true)),
                _ => return Ok(false),
            }
            return Ok(true);
        }
        let Some(r) = rest.strip_prefix("ple.") else {
            return Ok(false);
        };
        if self.ple != Some(b) {
            return Ok(false);
        }
        let o = match r {
            "key_proj.weight" => one("ple_key", false),
            "value_proj.weight" => one("ple_value", false),
            "norm_key.weight" => one("ple_norm_key", true),
            "norm_query.weight" => one("ple_norm_query", true),
            "norm_conv.weight" => one("ple_norm_conv", true),
            "conv1d.weight" => {
                let mut o = one("ple_conv1d", false);
                o.shape = super::squeezed(t);
                o
            }
            "ple_embedding.layer_multipliers"
            | "ple_embedding.ngram_heads_offsets"
            | "ple_embedding.ngram_heads_vocab_sizes" => return Ok(true),
            _ => {
                let Some(i) = r
                    .strip_prefix("ple_embedding.ngram_embedding.shard_")
                    .and_then(|s| s.strip_suffix(".weight"))
                    .and_then(|s| s.parse::<usize>().ok())
                else {
                    return Ok(false);
                };
                self.shards.insert(i, t.name.clone());
                if self.shards.len() == self.n_shards {
                    out.push(self.table(ctx)?);
                }
                return Ok(true);
            }
        };
        out.push(o);
        Ok(true)
    }

    /// `per_layer_token_embd`: the shards' rows by shard index.
    fn table(&self, ctx: &Ctx) -> Result<OutTensor> {
        let names: Vec<String> = self.shards.values().cloned().collect();
        let width = ctx.ck.req(&names[0])?.shape.last().copied().unwrap_or(0);
        let mut rows = 0;
        for n in &names {
            let s = ctx.ck.req(n)?;
            if s.shape.len() != 2 || s.shape[1] != width {
                return Err(ConvertError::Shape {
                    name: n.clone(),
                    actual: s.shape.clone(),
                    expected: vec![s.shape.first().copied().unwrap_or(0), width],
                });
            }
            rows += s.shape[0];
        }
        Ok(OutTensor {
            name: "per_layer_token_embd.weight".into(),
            shape: vec![rows, width],
            src: Source::Concat(names),
            ops: Vec::new(),
        })
    }

    /// After the last tensor: every shard was seen.
    pub fn finish(&self) -> Result<()> {
        if self.ple.is_some() && self.shards.len() != self.n_shards {
            return Err(ConvertError::config(
                "split_ngram_parts",
                format!(
                    "{} n-gram table shards in the checkpoint, {} expected",
                    self.shards.len(),
                    self.n_shards
                ),
            ));
        }
        Ok(())
    }
}
