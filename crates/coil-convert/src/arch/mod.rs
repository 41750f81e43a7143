//! One module per architecture family: the GGUF hyper-parameter keys (in
//! llama.cpp's order) and the tensor plan (HF name → GGUF name, shape and
//! transforms).

mod bailing_hybrid;
mod falcon_h1;
mod granite;
mod jamba;
mod kimi_linear;
mod lfm2;
mod lfm3;
mod llama;
mod mamba;
mod nemotron_h;
mod qwen35;
mod qwen4exp;
mod zamba2;

use crate::config::Config;
use crate::error::{ConvertError, Result};
use crate::plan::OutTensor;
use crate::safetensors_src::{Checkpoint, SrcTensor};
use coil_gguf::{Metadata, Value, ValueType};

/// Hugging Face architecture names coil converts.
pub const SUPPORTED: &[&str] = &[
    "MambaForCausalLM",
    "FalconMambaForCausalLM",
    "Mamba2ForCausalLM",
    "JambaForCausalLM",
    "BambaForCausalLM",
    "GraniteMoeHybridForCausalLM",
    "FalconH1ForCausalLM",
    "NemotronHForCausalLM",
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen3_5ForCausalLM",
    "Qwen3_5ForConditionalGeneration",
    "Qwen3_5MoeForCausalLM",
    "Qwen3_5MoeForConditionalGeneration",
    "Qwen3NextForCausalLM",
    "Lfm2ForCausalLM",
    "Lfm2MoeForCausalLM",
    "Lfm3ForCausalLM",
    "KimiLinearForCausalLM",
    "BailingHybridForCausalLM",
    "BailingMoeV3ForCausalLM",
    "Zamba2ForCausalLM",
    "Qwen4ExpForCausalLM",
    "Qwen4ExpForConditionalGeneration",
];

/// How the vocabulary is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabStyle {
    /// `tokenizer.model` (SentencePiece) first, then `tokenizer.json`.
    SpmFirst,
    /// `tokenizer.json` (byte-level BPE) first, then `tokenizer.model`.
    BpeFirst,
}

/// Vocabulary options of an architecture.
#[derive(Clone, Copy, Debug)]
pub struct VocabSpec {
    pub style: VocabStyle,
    /// Pad the token list to a multiple of this (1: no padding).
    pub pad_multiple: usize,
}

/// What every converter gets.
pub struct Ctx<'a> {
    pub cfg: &'a Config,
    pub ck: &'a Checkpoint,
    /// `general.file_type` (llama.cpp's `LlamaFileType`).
    pub file_type: u32,
    /// Mistral's native layout (`params.json`, `consolidated.safetensors`).
    pub mistral: bool,
    /// Leave out the multi-token-prediction layers (`--no-mtp`).
    pub no_mtp: bool,
}

/// One architecture's converter.
pub(crate) trait Arch {
    /// The GGUF architecture name (`general.architecture`).
    fn arch(&self) -> &str;
    /// Hyper-parameter keys, in llama.cpp's order.
    fn params(&self, kv: &mut Kv) -> Result<()>;
    /// Plans the output tensors made from checkpoint tensor `t` (called in
    /// checkpoint order). Experts may be held back until their layer is
    /// complete.
    fn tensor(&mut self, t: &SrcTensor, bid: Option<usize>, out: &mut Vec<OutTensor>)
        -> Result<()>;
    /// Tensors made before the checkpoint's (llama.cpp's
    /// `generate_extra_tensors`).
    fn extra(&self, _out: &mut Vec<OutTensor>) -> Result<()> {
        Ok(())
    }
    /// Called after the last tensor (e.g. to report unmerged experts).
    fn finish(&mut self, _out: &mut Vec<OutTensor>) -> Result<()> {
        Ok(())
    }
    fn vocab(&self) -> VocabSpec;
    /// GGUF tensors that must be present (checked after planning).
    fn required(&self) -> Vec<String> {
        Vec::new()
    }
}

/// Tensor suffixes every layer of a kind needs.
pub(crate) const MAMBA1_LAYER: &[&str] = &[
    "attn_norm.weight",
    "ssm_in.weight",
    "ssm_conv1d.weight",
    "ssm_x.weight",
    "ssm_dt.weight",
    "ssm_dt.bias",
    "ssm_a",
    "ssm_d",
    "ssm_out.weight",
];
pub(crate) const MAMBA2_LAYER: &[&str] = &[
    "ssm_in.weight",
    "ssm_conv1d.weight",
    "ssm_dt.bias",
    "ssm_a",
    "ssm_d",
    "ssm_norm.weight",
    "ssm_out.weight",
];
pub(crate) const ATTN_LAYER: &[&str] = &[
    "attn_q.weight",
    "attn_k.weight",
    "attn_v.weight",
    "attn_output.weight",
];

/// `blk.{layer}.{suffix}` for every layer of `layers` and every suffix,
/// plus the embeddings and the final norm.
pub(crate) fn required_names(
    layers: impl IntoIterator<Item = (usize, &'static [&'static str])>,
) -> Vec<String> {
    let mut v = vec![
        "token_embd.weight".to_string(),
        "output_norm.weight".to_string(),
    ];
    for (b, suffixes) in layers {
        v.extend(suffixes.iter().map(|s| format!("blk.{b}.{s}")));
    }
    v
}

/// Picks the converter for `hf_arch`.
pub(crate) fn for_arch<'a>(hf_arch: &str, ctx: &'a Ctx<'a>) -> Result<Box<dyn Arch + 'a>> {
    Ok(match hf_arch {
        "MambaForCausalLM" | "MambaLMHeadModel" | "FalconMambaForCausalLM" => {
            Box::new(mamba::Mamba1::new(ctx)?)
        }
        "Mamba2ForCausalLM" => Box::new(mamba::Mamba2::new(ctx)?),
        "JambaForCausalLM" => Box::new(jamba::Jamba::new(ctx)?),
        "BambaForCausalLM" | "GraniteMoeHybridForCausalLM" => Box::new(
            granite::GraniteHybrid::new(ctx, hf_arch == "BambaForCausalLM")?,
        ),
        "FalconH1ForCausalLM" => Box::new(falcon_h1::FalconH1::new(ctx)?),
        "NemotronHForCausalLM" => Box::new(nemotron_h::NemotronH::new(ctx)?),
        "LlamaForCausalLM" | "MistralForCausalLM" | "LLaMAForCausalLM" => {
            Box::new(llama::Llama::new(ctx)?)
        }
        "Qwen3_5ForCausalLM" | "Qwen3_5ForConditionalGeneration" => {
            Box::new(qwen35::GatedDeltaHybrid::new(ctx, qwen35::Family::Qwen35)?)
        }
        "Qwen3_5MoeForCausalLM" | "Qwen3_5MoeForConditionalGeneration" => Box::new(
            qwen35::GatedDeltaHybrid::new(ctx, qwen35::Family::Qwen35Moe)?,
        ),
        "Qwen4ExpForCausalLM" | "Qwen4ExpForConditionalGeneration" => Box::new(
            qwen35::GatedDeltaHybrid::new(ctx, qwen35::Family::Qwen4Exp)?,
        ),
        "Qwen3NextForCausalLM" => Box::new(qwen35::GatedDeltaHybrid::new(
            ctx,
            qwen35::Family::Qwen3Next,
        )?),
        "Lfm2ForCausalLM" | "LFM2ForCausalLM" => Box::new(lfm2::Lfm2::new(ctx, false)?),
        "Lfm2MoeForCausalLM" => Box::new(lfm2::Lfm2::new(ctx, true)?),
        "Lfm3ForCausalLM" => Box::new(lfm3::Lfm3::new(ctx)?),
        "KimiLinearForCausalLM" | "KimiLinearModel" => Box::new(kimi_linear::KimiLinear::new(ctx)?),
        "BailingHybridForCausalLM" | "BailingMoeV3ForCausalLM" => {
            Box::new(bailing_hybrid::BailingHybrid::new(ctx)?)
        }
        "Zamba2ForCausalLM" => Box::new(zamba2::Zamba2::new(ctx)?),
        other => {
            return Err(ConvertError::UnsupportedArch {
                arch: other.to_string(),
                supported: SUPPORTED.join(", "),
            })
        }
    })
}

/// Metadata under construction: keys keep the position of their first
/// insertion (as gguf-py's writer does when a key is set twice).
pub struct Kv {
    pub arch: String,
    pub md: Metadata,
}

impl Kv {
    pub fn new(arch: &str) -> Kv {
        Kv {
            arch: arch.to_string(),
            md: Metadata::new(),
        }
    }

    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    pub fn u32(&mut self, k: &str, v: u64) -> Result<()> {
        let v = u32::try_from(v)
            .map_err(|_| ConvertError::config(k, format!("{v} does not fit in 32 bits")))?;
        let key = self.key(k);
        self.md.insert(key, Value::U32(v));
        Ok(())
    }

    pub fn f32(&mut self, k: &str, v: f64) {
        let key = self.key(k);
        self.md.insert(key, Value::F32(v as f32));
    }

    pub fn bool(&mut self, k: &str, v: bool) {
        let key = self.key(k);
        self.md.insert(key, Value::Bool(v));
    }

    pub fn bools(&mut self, k: &str, v: &[bool]) {
        let key = self.key(k);
        let items = v.iter().map(|&b| Value::Bool(b)).collect();
        self.md.insert(key, Value::Array(ValueType::Bool, items));
    }

    pub fn f32s(&mut self, k: &str, v: &[f64]) {
        let key = self.key(k);
        let items = v.iter().map(|&x| Value::F32(x as f32)).collect();
        self.md.insert(key, Value::Array(ValueType::F32, items));
    }

    pub fn i32s(&mut self, k: &str, v: &[u64]) -> Result<()> {
        let items = v
            .iter()
            .map(|&x| {
                i32::try_from(x)
                    .map(Value::I32)
                    .map_err(|_| ConvertError::config(k, format!("{x} does not fit in 32 bits")))
            })
            .collect::<Result<Vec<_>>>()?;
        let key = self.key(k);
        self.md.insert(key, Value::Array(ValueType::I32, items));
        Ok(())
    }

    pub fn u64s(&mut self, k: &str, v: &[u64]) {
        let key = self.key(k);
        let items = v.iter().map(|&x| Value::U64(x)).collect();
        self.md.insert(key, Value::Array(ValueType::U64, items));
    }

    /// A key outside the architecture's namespace (`general.file_type`).
    pub fn raw(&mut self, k: &str, v: Value) {
        self.md.insert(k.to_string(), v);
    }

    pub fn file_type(&mut self, ft: u32) {
        self.raw("general.file_type", Value::U32(ft));
    }
}

/// The block id: the first all-digit part of a dotted name (llama.cpp's rule).
pub(crate) fn block_id(name: &str) -> Option<usize> {
    name.split('.')
        .find(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|p| p.parse().ok())
}

/// The part of a layer tensor's name after `layers.N.`.
pub(crate) fn layer_rest(name: &str) -> Option<&str> {
    let i = name.find("layers.")?;
    let after = &name[i + "layers.".len()..];
    let dot = after.find('.')?;
    Some(&after[dot + 1..])
}

/// GGUF names of the tensors outside layers.
pub(crate) fn global_name(name: &str) -> Option<&'static str> {
    Some(match name {
        "backbone.embeddings.weight"
        | "backbone.embedding.weight"
        | "model.embed_tokens.weight"
        | "embed_tokens.weight"
        | "tok_embeddings.weight" => "token_embd.weight",
        "backbone.norm_f.weight"
        | "model.norm.weight"
        | "model.final_layernorm.weight"
        | "norm.weight" => "output_norm.weight",
        "lm_head.weight" | "output.weight" => "output.weight",
        _ => return None,
    })
}

/// GGUF name (after `blk.N.`) of a layer tensor, given its name after
/// `layers.N.`. Covers every layout of the supported families.
pub(crate) fn layer_name(rest: &str) -> Option<String> {
    let (stem, suffix) = match rest.rsplit_once('.') {
        Some((s, "weight")) => (s, ".weight"),
        Some((s, "bias")) => (s, ".bias"),
        _ => (rest, ""),
    };
    // SSM mixers: `mixer.` (Mamba, Mamba-2, Nemotron-H) or `mamba.` (hybrids).
    if let Some(m) = stem
        .strip_prefix("mixer.")
        .or_else(|| stem.strip_prefix("mamba."))
    {
        let base = match m {
            "in_proj" => "ssm_in",
            "conv1d" => "ssm_conv1d",
            "x_proj" => "ssm_x",
            "dt_proj" | "dt" => "ssm_dt",
            "out_proj" => "ssm_out",
            "norm" => "ssm_norm",
            "dt_layernorm" => "ssm_dt_norm",
            "b_layernorm" => "ssm_b_norm",
            "c_layernorm" => "ssm_c_norm",
            "A_log" if suffix.is_empty() => return Some("ssm_a".into()),
            "D" if suffix.is_empty() => return Some("ssm_d".into()),
            "dt_bias" if suffix.is_empty() => return Some("ssm_dt.bias".into()),
            // Nemotron-H attention / MLP / MoE live under `mixer.` too.
            "q_proj" => "attn_q",
            "k_proj" => "attn_k",
            "v_proj" => "attn_v",
            "o_proj" => "attn_output",
            "up_proj" => "ffn_up",
            "down_proj" => "ffn_down",
            "gate" => "ffn_gate_inp",
            "shared_experts.up_proj" => "ffn_up_shexp",
            "shared_experts.down_proj" => "ffn_down_shexp",
            _ => return None,
        };
        return Some(format!("{base}{suffix}"));
    }
    let base = match stem {
        "norm" | "input_layernorm" | "attention_norm" => "attn_norm",
        "pre_ff_layernorm" | "post_attention_layernorm" | "ffn_norm" => "ffn_norm",
        "self_attn.q_proj" | "attention.wq" => "attn_q",
        "self_attn.k_proj" | "attention.wk" => "attn_k",
        "self_attn.v_proj" | "attention.wv" => "attn_v",
        "self_attn.o_proj" | "attention.wo" => "attn_output",
        "mlp.gate_proj" | "feed_forward.gate_proj" | "feed_forward.w1" => "ffn_gate",
        "mlp.up_proj" | "feed_forward.up_proj" | "feed_forward.w3" => "ffn_up",
        "mlp.down_proj" | "feed_forward.down_proj" | "feed_forward.w2" => "ffn_down",
        "feed_forward.router" | "block_sparse_moe.router.layer" | "block_sparse_moe.gate" => {
            "ffn_gate_inp"
        }
        _ => return None,
    };
    Some(format!("{base}{suffix}"))
}

/// Maps a checkpoint name to its GGUF name, or an error naming it.
pub(crate) fn map_name(name: &str, bid: Option<usize>, arch: &str) -> Result<String> {
    if let Some(g) = global_name(name) {
        return Ok(g.to_string());
    }
    if name.ends_with("mixer.gate.e_score_correction_bias") {
        if let Some(b) = bid {
            return Ok(format!("blk.{b}.exp_probs_b.bias"));
        }
    }
    if let (Some(b), Some(rest)) = (bid, layer_rest(name)) {
        if let Some(n) = layer_name(rest) {
            return Ok(format!("blk.{b}.{n}"));
        }
    }
    Err(ConvertError::UnusedTensor {
        name: name.to_string(),
        arch: arch.to_string(),
    })
}

/// Tensors the reference converter drops.
pub(crate) fn skipped(name: &str) -> bool {
    name.ends_with(".attention.masked_bias")
        || name.ends_with(".attention.bias")
        || name.ends_with(".rotary_emb.inv_freq")
}

/// Checks a tensor's element count against an expected shape.
pub(crate) fn expect_numel(t: &SrcTensor, shape: &[usize]) -> Result<()> {
    if t.n_elements() != shape.iter().product::<usize>() {
        return Err(ConvertError::Shape {
            name: t.name.clone(),
            actual: t.shape.clone(),
            expected: shape.to_vec(),
        });
    }
    Ok(())
}

/// `t` with its size-1 dimensions removed (`torch.squeeze`).
pub(crate) fn squeezed(t: &SrcTensor) -> Vec<usize> {
    let s: Vec<usize> = t.shape.iter().copied().filter(|&d| d != 1).collect();
    if s.is_empty() && !t.shape.is_empty() {
        vec![]
    } else {
        s
    }
}

/// Expert-merging buffer: per layer, the names seen so far.
#[derive(Default)]
pub(crate) struct ExpertBuf {
    layers: std::collections::HashMap<usize, Vec<String>>,
}

impl ExpertBuf {
    /// Adds `name`; returns true when layer `bid` has `want` names.
    pub fn add(&mut self, bid: usize, name: &str, want: usize) -> bool {
        let v = self.layers.entry(bid).or_default();
        v.push(name.to_string());
        v.len() >= want
    }

    pub fn take(&mut self, bid: usize) {
        self.layers.remove(&bid);
    }

    /// An error if any layer's experts are incomplete.
    pub fn check_done(&self) -> Result<()> {
        if let Some((bid, names)) = self.layers.iter().find(|(_, v)| !v.is_empty()) {
            return Err(ConvertError::tensor(
                names[0].clone(),
                format!(
                    "layer {bid}: only {} expert tensors found; some experts are missing",
                    names.len()
                ),
            ));
        }
        Ok(())
    }
}

/// The shared plan for a Mamba-2 mixer tensor (Mamba-2, Bamba, Granite,
/// Falcon-H1, Nemotron-H): conv squeezed, A = −exp(A_log) and D as
/// {n_head, 1}, the gated norm as {n_group, d_inner / n_group}.
pub(crate) fn mamba2_tensor(
    t: &SrcTensor,
    gguf: String,
    n_group: usize,
    d_inner: usize,
) -> Result<OutTensor> {
    let mut o = OutTensor::one(gguf.clone(), &t.name, &t.shape);
    if gguf.ends_with(".ssm_conv1d.weight") {
        o.shape = squeezed(t);
    } else if gguf.ends_with(".ssm_a") || gguf.ends_with(".ssm_d") {
        let n = t.n_elements();
        o.shape = vec![n, 1];
    } else if gguf.ends_with(".ssm_norm.weight") {
        if n_group == 0 || !d_inner.is_multiple_of(n_group) || t.n_elements() != d_inner {
            return Err(ConvertError::Shape {
                name: t.name.clone(),
                actual: t.shape.clone(),
                expected: vec![d_inner],
            });
        }
        o.shape = vec![n_group, d_inner / n_group];
    }
    if t.name.ends_with(".A_log") {
        o.ops.push(crate::plan::Op::NegExp);
    }
    Ok(o)
}

/// Reads `layer_types`-style lists and patterns into per-layer kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LayerKind {
    Ssm,
    Attention,
    Mlp,
    Moe,
}
