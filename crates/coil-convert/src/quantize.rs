//! `coil quantize`: llama.cpp's per-tensor type mixtures (`llama-quant.cpp`,
//! `llama_tensor_get_type`) over a GGUF file, with or without an importance
//! matrix (`--imatrix`: [`crate::imatrix`]; each tensor with an entry is
//! quantized with those weights, as llama-quantize does, and the IQ1–IQ3
//! and Q2_K_S mixtures need one).
//!
//! Left as they are (llama.cpp's `tensor_allows_quantization`): tensors
//! with fewer than 2 dimensions, names not ending in `weight` (`ssm_a`,
//! `ssm_d`, biases), norms (`*_norm.weight`), routers (`ffn_gate_inp`),
//! `ssm_conv1d`, position / token-type embeddings, the indexers'
//! `indexer.{q,k}_proj`. The mixtures (`more`:
//! llama.cpp's `use_more_bits` layers, first and last eighth and every third
//! between; `wv`: the running count of attn_v / fused qkv tensors; `L`: the
//! block count):
//!
//! | mix    | default | attn_v, attn_qkv            | ffn_down                                | attn_output |
//! |--------|---------|-----------------------------|-----------------------------------------|-------------|
//! | Q8_0, Q4_0.. | same | —                       | —                                       | —           |
//! | Q2_K   | Q2_K    | Q4_K if n_head / n_head_kv ≥ 4, else Q3_K | Q3_K                      | Q3_K        |
//! | Q3_K_S | Q3_K    | —                           | —                                       | —           |
//! | Q3_K_M | Q3_K    | Q5_K for wv < 2, else Q4_K  | Q5_K below L/16, else Q4_K              | Q4_K        |
//! | Q3_K_L | Q3_K    | Q5_K                        | Q5_K                                    | Q5_K        |
//! | Q4_K_S | Q4_K    | Q5_K for wv < 4             | Q5_K below L/8                          | —           |
//! | Q4_K_M | Q4_K    | Q6_K on `more`              | Q6_K on `more` layers                   | —           |
//! | Q5_K_S | Q5_K    | —                           | —                                       | —           |
//! | Q5_K_M | Q5_K    | Q6_K on `more`              | Q6_K on `more` layers                   | —           |
//! | Q6_K   | Q6_K    | —                           | —                                       | —           |
//! | IQ4_NL, IQ4_XS | same | Q5_K if n_head / n_head_kv ≥ 4 | Q5_K below L/8                 | —           |
//!
//! `output.weight` (and a tied `token_embd`) is Q6_K (Q8_0 stays Q8_0; Q8_0
//! where its rows are not whole blocks, and always for `falcon`). Models of
//! 8 experts: attn_v / attn_k → Q8_0, attn_output → Q5_K for Q2_K..Q4_K_M
//! and the IQ4 mixtures.
//! 70B-class models (llama with 80 layers and grouped heads, …): attn_v
//! Q3_K / Q4_K → Q5_K. `falcon` has its own ffn_down / attn_output rules.
//! Then the shape fallbacks (row length not a multiple of 256: Q2_K / Q3_K →
//! Q4_0, Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, IQ4_XS → IQ4_NL; of 32:
//! F16).

use crate::error::{ConvertError, Result};
use crate::imatrix::Imatrix;
use coil_gguf::{
    GgmlType, GgufFile, Metadata, SplitLimits, SplitWriter, TensorInfo, TensorSpec, Value,
};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A quantization mixture (llama.cpp's `llama_ftype`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(non_camel_case_types)]
pub enum QuantMix {
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q2_K,
    Q3_K_S,
    Q3_K_M,
    Q3_K_L,
    Q4_K_S,
    Q4_K_M,
    Q5_K_S,
    Q5_K_M,
    Q6_K,
    IQ4_NL,
    IQ4_XS,
    Q2_K_S,
    IQ2_XXS,
    IQ2_XS,
    IQ2_S,
    IQ2_M,
    IQ3_XXS,
    IQ3_XS,
    IQ3_S,
    IQ3_M,
    IQ1_S,
    IQ1_M,
    TQ1_0,
    TQ2_0,
    MXFP4_MOE,
}

impl QuantMix {
    pub const ALL: [QuantMix; 30] = [
        QuantMix::Q8_0,
        QuantMix::Q4_0,
        QuantMix::Q4_1,
        QuantMix::Q5_0,
        QuantMix::Q5_1,
        QuantMix::Q2_K,
        QuantMix::Q3_K_S,
        QuantMix::Q3_K_M,
        QuantMix::Q3_K_L,
        QuantMix::Q4_K_S,
        QuantMix::Q4_K_M,
        QuantMix::Q5_K_S,
        QuantMix::Q5_K_M,
        QuantMix::Q6_K,
        QuantMix::IQ4_NL,
        QuantMix::IQ4_XS,
        QuantMix::Q2_K_S,
        QuantMix::IQ2_XXS,
        QuantMix::IQ2_XS,
        QuantMix::IQ2_S,
        QuantMix::IQ2_M,
        QuantMix::IQ3_XXS,
        QuantMix::IQ3_XS,
        QuantMix::IQ3_S,
        QuantMix::IQ3_M,
        QuantMix::IQ1_S,
        QuantMix::IQ1_M,
        QuantMix::TQ1_0,
        QuantMix::TQ2_0,
        QuantMix::MXFP4_MOE,
    ];

    pub fn name(self) -> &'static str {
        match self {
            QuantMix::Q8_0 => "Q8_0",
            QuantMix::Q4_0 => "Q4_0",
            QuantMix::Q4_1 => "Q4_1",
            QuantMix::Q5_0 => "Q5_0",
            QuantMix::Q5_1 => "Q5_1",
            QuantMix::Q2_K => "Q2_K",
            QuantMix::Q3_K_S => "Q3_K_S",
            QuantMix::Q3_K_M => "Q3_K_M",
            QuantMix::Q3_K_L => "Q3_K_L",
            QuantMix::Q4_K_S => "Q4_K_S",
            QuantMix::Q4_K_M => "Q4_K_M",
            QuantMix::Q5_K_S => "Q5_K_S",
            QuantMix::Q5_K_M => "Q5_K_M",
            QuantMix::Q6_K => "Q6_K",
            QuantMix::IQ4_NL => "IQ4_NL",
            QuantMix::IQ4_XS => "IQ4_XS",
            QuantMix::Q2_K_S => "Q2_K_S",
            QuantMix::IQ2_XXS => "IQ2_XXS",
            QuantMix::IQ2_XS => "IQ2_XS",
            QuantMix::IQ2_S => "IQ2_S",
            QuantMix::IQ2_M => "IQ2_M",
            QuantMix::IQ3_XXS => "IQ3_XXS",
            QuantMix::IQ3_XS => "IQ3_XS",
            QuantMix::IQ3_S => "IQ3_S",
            QuantMix::IQ3_M => "IQ3_M",
            QuantMix::IQ1_S => "IQ1_S",
            QuantMix::IQ1_M => "IQ1_M",
            QuantMix::TQ1_0 => "TQ1_0",
            QuantMix::TQ2_0 => "TQ2_0",
            QuantMix::MXFP4_MOE => "MXFP4_MOE",
        }
    }

    /// Case-insensitive; `Q3_K` / `Q4_K` / `Q5_K` mean the `_M` mixtures
    /// (as for llama-quantize).
    pub fn parse(s: &str) -> Option<QuantMix> {
        let u = s.to_ascii_uppercase();
        let u = match u.as_str() {
            "Q3_K" => "Q3_K_M",
            "Q4_K" => "Q4_K_M",
            "Q5_K" => "Q5_K_M",
            other => other,
        };
        QuantMix::ALL.into_iter().find(|m| m.name() == u)
    }

    /// The type of most tensors.
    pub fn default_type(self) -> GgmlType {
        use QuantMix::*;
        match self {
            Q8_0 => GgmlType::Q8_0,
            Q4_0 => GgmlType::Q4_0,
            Q4_1 => GgmlType::Q4_1,
            Q5_0 => GgmlType::Q5_0,
            Q5_1 => GgmlType::Q5_1,
            Q2_K | Q2_K_S => GgmlType::Q2_K,
            Q3_K_S | Q3_K_M | Q3_K_L => GgmlType::Q3_K,
            Q4_K_S | Q4_K_M => GgmlType::Q4_K,
            Q5_K_S | Q5_K_M => GgmlType::Q5_K,
            Q6_K => GgmlType::Q6_K,
            IQ4_NL => GgmlType::IQ4_NL,
            IQ4_XS => GgmlType::IQ4_XS,
            IQ2_XXS => GgmlType::IQ2_XXS,
            IQ2_XS | IQ2_S => GgmlType::IQ2_XS,
            IQ2_M => GgmlType::IQ2_S,
            IQ3_XXS => GgmlType::IQ3_XXS,
            IQ3_XS | IQ3_S | IQ3_M => GgmlType::IQ3_S,
            IQ1_S => GgmlType::IQ1_S,
            IQ1_M => GgmlType::IQ1_M,
            TQ1_0 => GgmlType::TQ1_0,
            TQ2_0 => GgmlType::TQ2_0,
            MXFP4_MOE => GgmlType::MXFP4,
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub fn file_type(self) -> u32 {
        use QuantMix::*;
        match self {
            Q4_0 => 2,
            Q4_1 => 3,
            Q8_0 => 7,
            Q5_0 => 8,
            Q5_1 => 9,
            Q2_K => 10,
            Q3_K_S => 11,
            Q3_K_M => 12,
            Q3_K_L => 13,
            Q4_K_S => 14,
            Q4_K_M => 15,
            Q5_K_S => 16,
            Q5_K_M => 17,
            Q6_K => 18,
            IQ4_NL => 25,
            IQ4_XS => 30,
            IQ2_XXS => 19,
            IQ2_XS => 20,
            Q2_K_S => 21,
            IQ3_XS => 22,
            IQ3_XXS => 23,
            IQ1_S => 24,
            IQ3_S => 26,
            IQ3_M => 27,
            IQ2_S => 28,
            IQ2_M => 29,
            IQ1_M => 31,
            TQ1_0 => 36,
            TQ2_0 => 37,
            MXFP4_MOE => 38,
        }
    }
}

/// Options of [`quantize`] (llama-quantize's flags of the same names).
#[derive(Clone, Debug)]
pub struct QuantizeOptions {
    pub mix: QuantMix,
    pub progress: bool,
    /// `--pure`: every quantizable tensor gets the mixture's default type
    /// (then the shape fallbacks), no per-tensor rules.
    pub pure: bool,
    /// `--leave-output-tensor`: `output.weight` keeps its type.
    pub leave_output: bool,
    /// `--output-tensor-type`: the type of `output.weight` (and of tied
    /// token embeddings, which follow the output's rules).
    pub output_type: Option<GgmlType>,
    /// `--token-embedding-type`: the type of `token_embd.weight`.
    pub token_embd_type: Option<GgmlType>,
    /// `--tensor-type PATTERN=TYPE`: the first rule whose pattern matches
    /// a quantizable tensor's name gives its type (then the shape
    /// fallback), in place of the mixture's rules.
    pub tensor_types: Vec<TensorTypeRule>,
    /// `--split-max-size` / `--split-max-tensors`: write the output as
    /// llama.cpp's split parts (`OUT-00001-of-0000n.gguf`, …) of at most
    /// this much tensor data / this many tensors each.
    pub split: SplitLimits,
    /// `--imatrix FILE`: the importance matrix (as given on the command
    /// line, which the output's `quantize.imatrix.file` records, and its
    /// contents). Every tensor it has an entry for is quantized with those
    /// importance weights, and the mixtures' rules that read it apply.
    pub imatrix: Option<(String, Imatrix)>,
}

/// One `--tensor-type PATTERN=TYPE` rule: a regular expression searched
/// for in tensor names (lowercased, as llama-quantize does) and a type.
#[derive(Clone, Debug)]
pub struct TensorTypeRule {
    pattern: regex::Regex,
    pub ty: GgmlType,
}

impl TensorTypeRule {
    /// Parses `PATTERN=TYPE` at the first `=`, as llama-quantize does (the
    /// type by its ggml name, any case; one coil can write).
    pub fn parse(rule: &str) -> Result<TensorTypeRule> {
        let bad = |why: String| ConvertError::Quant(format!("--tensor-type {rule:?}: {why}"));
        let (pattern, ty) = rule
            .split_once('=')
            .ok_or_else(|| bad("expected PATTERN=TYPE".into()))?;
        if pattern.is_empty() {
            return Err(bad("missing tensor name pattern".into()));
        }
        let ty = GgmlType::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(ty))
            .filter(|&t| coil_gguf::quant::can_quantize(t))
            .ok_or_else(|| bad(format!("{ty:?} is not a type coil writes")))?;
        let pattern = regex::Regex::new(&pattern.to_ascii_lowercase())
            .map_err(|e| bad(format!("bad pattern: {e}")))?;
        Ok(TensorTypeRule { pattern, ty })
    }

    fn matches(&self, name: &str) -> bool {
        self.pattern.is_match(name)
    }
}

impl QuantizeOptions {
    /// `mix` with llama-quantize's defaults and no progress bar.
    pub fn new(mix: QuantMix) -> QuantizeOptions {
        QuantizeOptions {
            mix,
            progress: false,
            pure: false,
            leave_output: false,
            output_type: None,
            token_embd_type: None,
            tensor_types: Vec::new(),
            split: SplitLimits::default(),
            imatrix: None,
        }
    }
}

/// What [`quantize`] wrote.
#[derive(Clone, Debug)]
pub struct QuantizeReport {
    /// The file written (the first part of a split output).
    pub output: PathBuf,
    /// Every file written: `output` alone, or every part in order.
    pub files: Vec<PathBuf>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Output tensor count per type.
    pub types: BTreeMap<String, usize>,
    /// Tensors converted from a quantized type (to another one): the
    /// result carries both roundings (llama-quantize refuses this without
    /// `--allow-requantize`; coil does it and reports it).
    pub requantized: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Category {
    TokenEmbd,
    AttnQ,
    AttnV,
    AttnK,
    AttnOutput,
    FfnUp,
    FfnGate,
    FfnDown,
    Output,
    Other,
}

fn category(name: &str) -> Category {
    use Category::*;
    if name == "output.weight" {
        Output
    } else if name == "token_embd.weight" || name == "per_layer_token_embd.weight" {
        TokenEmbd
    } else if name.contains("attn_qkv.weight")
        || name.contains("attn_kv_b.weight")
        || name.contains("attn_v.weight")
    {
        AttnV
    } else if name.contains("attn_k.weight") {
        AttnK
    } else if name.contains("attn_q.weight") {
        AttnQ
    } else if name.contains("attn_output.weight") {
        AttnOutput
    } else if name.contains("ffn_up") {
        FfnUp
    } else if name.contains("ffn_gate") {
        FfnGate
    } else if name.contains("ffn_down") {
        FfnDown
    } else {
        Other
    }
}

/// llama.cpp's `tensor_allows_quantization` (the parts that concern the
/// supported architectures).
fn allows_quantization(t: &TensorInfo) -> bool {
    let n_dims = t.dims.iter().rposition(|&d| d > 1).map_or(1, |i| i + 1);
    if n_dims < 2 {
        return false;
    }
    let n = t.name.as_str();
    n.ends_with("weight")
        && !n.contains("_norm.weight")
        && !n.contains("ffn_gate_inp.weight")
        && !n.contains("ssm_conv1d")
        && !n.contains("shortconv.conv.weight")
        && !n.contains(".position_embd")
        && n != "position_embd.weight"
        && n != "token_types.weight"
        && !n.contains("attn_rel_b.weight")
        // the indexers' projections (MiniMax's, Qwen4-Exp's): small
        && !n.contains("indexer.k_proj.weight")
        && !n.contains("indexer.q_proj.weight")
}

fn use_more_bits(i: i64, n: i64) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

fn fallback(t: &TensorInfo, ty: GgmlType) -> GgmlType {
    let ncols = t.dims.first().copied().unwrap_or(1);
    if ncols % ty.block_size() as u64 == 0 {
        return ty;
    }
    use GgmlType::*;
    let f = match ty {
        IQ1_S | IQ1_M | IQ2_XXS | IQ2_XS | IQ2_S | IQ3_XXS | IQ3_S | IQ4_XS => IQ4_NL,
        Q2_K | Q3_K | TQ1_0 | TQ2_0 => Q4_0,
        Q4_K => Q5_0,
        Q5_K => Q5_1,
        Q6_K => Q8_0,
        other => other,
    };
    if ncols % f.block_size() as u64 != 0 {
        GgmlType::F16
    } else {
        f
    }
}

/// What llama.cpp's mixture rules read from the model's hyperparameters.
struct ModelFacts {
    arch: String,
    n_layer: i64,
    /// 0 for dense models (llama.cpp turns an expert count of 1 into 0).
    n_expert: i64,
    /// Layer 0's `n_head / n_head_kv` (0 without attention heads).
    n_gqa: i64,
    /// llama.cpp's `LLM_TYPE_70B`, which widens attn_v.
    is_70b: bool,
}

impl ModelFacts {
    fn of(md: &Metadata, arch: &str) -> ModelFacts {
        let key = |k: &str| md.get(&format!("{arch}.{k}"));
        let int = |k: &str| key(k).and_then(Value::as_u64).unwrap_or(0) as i64;
        // A count given per layer (hybrids) or once; llama.cpp reads layer 0.
        let layer0 = |v: &Value| match v.as_array() {
            Some(a) => a.first().and_then(Value::as_u64),
            None => v.as_u64(),
        };
        let n_layer = int("block_count");
        let n_head = key("attention.head_count").and_then(layer0).unwrap_or(0) as i64;
        let n_head_kv = key("attention.head_count_kv")
            .and_then(layer0)
            .map_or(n_head, |v| v as i64);
        let n_expert = match int("expert_count") {
            n if n <= 1 => 0,
            n => n,
        };
        let is_70b = match arch {
            "llama" => n_layer == 80 && n_head != n_head_kv,
            "qwen2" | "deci" | "olmo" => n_layer == 80,
            "jais2" => n_layer == 68,
            _ => false,
        };
        ModelFacts {
            arch: arch.to_string(),
            n_layer,
            n_expert,
            n_gqa: if n_head_kv == 0 {
                0
            } else {
                n_head / n_head_kv
            },
            is_70b,
        }
    }
}

/// llama.cpp's counters, advanced in its tensor order.
#[derive(Default)]
struct Counters {
    n_attention_wv: i64,
    i_attention_wv: i64,
    i_ffn_down: i64,
    i_ffn_gate: i64,
    i_ffn_up: i64,
}

/// The type of one quantizable tensor under `mix` before the shape fallback
/// (llama.cpp's `llama_tensor_get_type_impl`, branch for branch;
/// `imatrix`: an importance matrix is given, which some rules read).
fn mixture_type(
    t: &TensorInfo,
    opts: &QuantizeOptions,
    m: &ModelFacts,
    tied: bool,
    imatrix: bool,
    c: &mut Counters,
) -> GgmlType {
    use GgmlType::*;
    use QuantMix as X;
    let mix = opts.mix;
    let falcon = m.arch == "falcon";
    let mut ty = mix.default_type();
    // The layer of an expert tensor is in its name (experts of one layer
    // need not be consecutive); otherwise llama.cpp counts.
    let layer_of = |counter: i64| -> i64 {
        if m.n_expert > 1 {
            t.name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or(counter)
        } else {
            counter
        }
    };
    // the IQ1 / IQ2 mixtures share one branch
    let iq12 = matches!(
        mix,
        X::IQ2_XXS | X::IQ2_XS | X::IQ1_S | X::IQ2_S | X::IQ2_M | X::IQ1_M
    );
    let iq2_sm = matches!(mix, X::IQ2_S | X::IQ2_M);
    let n = m.n_layer;
    let cat = category(&t.name);
    if cat == Category::Output || (tied && cat == Category::TokenEmbd) {
        let nx = t.dims.first().copied().unwrap_or(1);
        return if let Some(o) = opts.output_type {
            o
        } else if mix == X::MXFP4_MOE || falcon || nx % ty.block_size() as u64 != 0 {
            Q8_0
        } else if iq12 || mix == X::IQ3_XXS {
            Q5_K
        } else if ty != Q8_0 {
            Q6_K
        } else {
            ty
        };
    }
    if mix == X::MXFP4_MOE {
        // expert tensors (3-D) MXFP4, everything else Q8_0; Ling 3.0's MLA
        // projections are 3-D too, so there only the feed-forward roles
        let expert_role = matches!(cat, Category::FfnUp | Category::FfnGate | Category::FfnDown);
        let experts = t.dims.get(2).copied().unwrap_or(1) > 1;
        return if experts && (m.arch != "bailingmoe3" || expert_role) {
            MXFP4
        } else {
            Q8_0
        };
    }
    if cat == Category::TokenEmbd {
        return match mix {
            X::IQ2_XXS | X::IQ2_XS | X::IQ1_S | X::IQ1_M => Q2_K,
            X::IQ2_S | X::IQ2_M | X::IQ3_XXS => IQ3_S,
            X::TQ1_0 | X::TQ2_0 => Q4_K,
            _ => ty,
        };
    }
    if iq12 {
        match cat {
            Category::AttnV => {
                ty = if m.n_gqa >= 4 || m.n_expert >= 4 {
                    Q4_K
                } else if iq2_sm {
                    IQ3_S
                } else {
                    Q2_K
                };
                c.i_attention_wv += 1;
            }
            Category::AttnK if m.n_expert == 8 => ty = Q4_K,
            Category::FfnDown => {
                // the running count of ffn_down tensors (experts and
                // shared experts alike), not the layer
                if c.i_ffn_down < n / 8 {
                    ty = if iq2_sm { IQ3_S } else { Q2_K };
                }
                c.i_ffn_down += 1;
            }
            Category::AttnOutput => {
                ty = if m.n_expert == 8 {
                    Q5_K
                } else if matches!(mix, X::IQ1_S | X::IQ1_M) {
                    IQ2_XXS
                } else if iq2_sm {
                    IQ3_S
                } else {
                    ty
                };
            }
            _ => {}
        }
        return ty;
    }
    match cat {
        Category::AttnV => {
            let i = c.i_attention_wv;
            let gqa4 = m.n_gqa >= 4;
            ty = match mix {
                X::Q2_K if gqa4 => Q4_K,
                X::Q2_K => Q3_K,
                X::Q2_K_S if gqa4 => Q4_K,
                X::IQ3_XXS if gqa4 => Q4_K,
                X::IQ3_XXS if !imatrix => IQ3_S,
                X::IQ3_XXS => IQ3_XXS,
                X::IQ3_XS | X::IQ3_S if gqa4 => Q4_K,
                X::IQ3_M => Q4_K,
                X::Q3_K_M if i < 2 => Q5_K,
                X::Q3_K_M => Q4_K,
                X::Q3_K_L => Q5_K,
                X::IQ4_NL | X::IQ4_XS if gqa4 => Q5_K,
                X::Q4_K_M | X::Q5_K_M if use_more_bits(i, c.n_attention_wv) => Q6_K,
                X::Q4_K_S if i < 4 => Q5_K,
                _ => ty,
            };
            if m.is_70b && matches!(ty, Q3_K | Q4_K) {
                ty = Q5_K;
            }
            if m.n_expert == 8 {
                ty = Q8_0;
            }
            c.i_attention_wv += 1;
        }
        Category::AttnK => {
            ty = match mix {
                _ if m.n_expert == 8 => Q8_0,
                X::IQ3_XS => IQ3_XXS,
                X::IQ3_XXS => IQ2_S,
                _ => ty,
            }
        }
        Category::AttnQ => {
            ty = match mix {
                X::IQ3_XS => IQ3_XXS,
                X::IQ3_XXS => IQ2_S,
                _ => ty,
            }
        }
        Category::FfnDown => {
            let i = layer_of(c.i_ffn_down);
            let more = use_more_bits(i, n);
            ty = match mix {
                X::Q2_K => Q3_K,
                X::Q2_K_S if i < n / 8 => Q4_K,
                X::Q2_K_S => ty,
                X::IQ3_XXS if !imatrix && i < n / 8 => Q4_K,
                X::IQ3_XXS if !imatrix => Q3_K,
                X::Q3_K_M if i < n / 16 => Q5_K,
                X::Q3_K_M if !falcon || more => Q4_K,
                X::Q3_K_M => Q3_K,
                X::IQ3_M if i < n / 8 || (m.n_expert == 8 && more) => Q4_K,
                X::Q3_K_L if falcon => Q4_K,
                X::Q3_K_L => Q5_K,
                X::Q4_K_M if falcon && i < n / 16 => Q6_K,
                X::Q4_K_M if falcon && more => Q5_K,
                X::Q4_K_M if falcon => Q4_K,
                X::Q4_K_M if more => Q6_K,
                X::Q4_K_M => ty,
                X::IQ4_NL | X::IQ4_XS if i < n / 8 && !imatrix => Q5_K,
                X::Q5_K_M if more => Q6_K,
                X::Q4_K_S if !falcon && i < n / 8 => Q5_K,
                X::Q4_0 if imatrix && i < n / 8 => Q4_1,
                X::Q5_0 if imatrix && i < n / 8 => Q5_1,
                _ => ty,
            };
            c.i_ffn_down += 1;
        }
        Category::AttnOutput => {
            ty = match mix {
                X::Q3_K_L if falcon => Q4_K,
                _ if falcon => ty,
                X::Q2_K
                | X::IQ3_XS
                | X::IQ3_XXS
                | X::Q3_K_S
                | X::Q3_K_M
                | X::IQ4_NL
                | X::Q4_K_S
                | X::Q4_K_M
                | X::IQ3_S
                | X::IQ3_M
                | X::IQ4_XS
                    if m.n_expert == 8 =>
                {
                    Q5_K
                }
                _ if m.n_expert == 8 => ty,
                X::Q2_K => Q3_K,
                X::IQ3_XXS => IQ3_S,
                X::Q3_K_M | X::IQ3_M => Q4_K,
                X::Q3_K_L => Q5_K,
                _ => ty,
            }
        }
        Category::FfnGate | Category::FfnUp => {
            let counter = if cat == Category::FfnGate {
                &mut c.i_ffn_gate
            } else {
                &mut c.i_ffn_up
            };
            let i = layer_of(*counter);
            if mix == X::IQ3_XS && i >= n / 8 && i < 7 * n / 8 {
                ty = IQ3_XXS;
            }
            *counter += 1;
        }
        _ => {}
    }
    ty
}

/// The output type of every tensor of `file` under `mix`, in file order
/// (decided in llama-quantize's order, which its layer counters follow).
pub fn plan_types(file: &GgufFile, mix: QuantMix) -> Vec<GgmlType> {
    plan_types_with(file, &QuantizeOptions::new(mix))
}

/// [`plan_types`] with llama-quantize's flags (`opts`; llama.cpp's
/// `llama_tensor_get_type`): a given token-embedding or output type is
/// taken as is, without the shape fallback.
pub fn plan_types_with(file: &GgufFile, opts: &QuantizeOptions) -> Vec<GgmlType> {
    let facts = ModelFacts::of(file.metadata(), file.architecture().unwrap_or(""));
    let tensors = file.tensors();
    let mut counters = Counters {
        n_attention_wv: tensors
            .iter()
            .filter(|t| category(&t.name) == Category::AttnV)
            .count() as i64,
        ..Counters::default()
    };
    let tied = !tensors.iter().any(|t| t.name == "output.weight");
    let mut types: Vec<GgmlType> = tensors.iter().map(|t| t.ty).collect();
    // Counters run in llama-quantize's order (by layer, then name).
    for i in llama_order(tensors) {
        let t = &tensors[i];
        if !allows_quantization(t) || (opts.leave_output && t.name == "output.weight") {
            continue;
        }
        let rule = opts.tensor_types.iter().find(|r| r.matches(&t.name));
        types[i] = match (
            category(&t.name),
            opts.token_embd_type,
            opts.output_type,
            rule,
        ) {
            (Category::TokenEmbd, Some(e), _, _) => e,
            (Category::Output, _, Some(o), _) => o,
            // a rule's tensor skips the mixture's rules, counters included
            (_, _, _, Some(r)) => fallback(t, r.ty),
            _ if opts.pure => fallback(t, opts.mix.default_type()),
            _ => fallback(
                t,
                mixture_type(t, opts, &facts, tied, opts.imatrix.is_some(), &mut counters),
            ),
        };
    }
    types
}

/// llama-quantize's tensor order: by layer (`blk.N.`; other tensors first),
/// then by name.
pub fn llama_order(tensors: &[TensorInfo]) -> Vec<usize> {
    let layer = |n: &str| -> i64 {
        n.strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|s| s.parse().ok())
            .unwrap_or(-1)
    };
    let mut idx: Vec<usize> = (0..tensors.len()).collect();
    idx.sort_by(|&a, &b| {
        let (na, nb) = (tensors[a].name.as_str(), tensors[b].name.as_str());
        (layer(na), na.as_bytes()).cmp(&(layer(nb), nb.as_bytes()))
    });
    idx
}

/// Quantizes whole rows of `f` into `q` on all cores.
fn quantize_parallel(
    ty: GgmlType,
    f: &[f32],
    q: &mut [u8],
    ne0: usize,
    row_out: usize,
    importance: Option<&[f32]>,
) -> Result<(), coil_gguf::quant::QuantError> {
    use coil_gguf::quant::quantize_rows;
    let n_rows = f.len().checked_div(ne0).unwrap_or(0);
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(n_rows)
        .max(1);
    if threads == 1 {
        return quantize_rows(ty, f, ne0, importance, q);
    }
    let per = n_rows.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = f
            .chunks(per * ne0)
            .zip(q.chunks_mut(per * row_out))
            .map(|(fx, qx)| s.spawn(move || quantize_rows(ty, fx, ne0, importance, qx)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect::<Result<Vec<()>, _>>()
            .map(|_| ())
    })
}

/// Whether llama-quantize refuses to write `ty` for tensor `name` under
/// `mix` without importance weights (`tensor_requires_imatrix`).
fn requires_imatrix(name: &str, ty: GgmlType, mix: QuantMix) -> bool {
    use GgmlType::*;
    if matches!(category(name), Category::Output | Category::TokenEmbd) {
        return false;
    }
    match ty {
        IQ3_XXS | IQ2_XXS | IQ2_XS | IQ2_S | IQ1_M | IQ1_S => true,
        Q2_K => mix == QuantMix::Q2_K_S,
        _ => false,
    }
}

/// Per tensor (file order) the importance weights it is quantized with
/// (per expert, one after another), as llama-quantize picks them; errors
/// for an importance matrix of another model and for types that need one.
fn importance_of(
    file: &GgufFile,
    types: &[GgmlType],
    opts: &QuantizeOptions,
) -> Result<Vec<Option<Vec<f32>>>> {
    let mut out = vec![None; types.len()];
    let needs = |t: &TensorInfo, ty: GgmlType| {
        ty != t.ty && allows_quantization(t) && requires_imatrix(&t.name, ty, opts.mix)
    };
    let Some((label, m)) = &opts.imatrix else {
        if let Some((t, &ty)) = file
            .tensors()
            .iter()
            .zip(types)
            .find(|(t, &ty)| needs(t, ty))
        {
            return Err(ConvertError::Quant(format!(
                "{} quantizes tensor {:?} to {ty}, which needs an importance matrix: give one with --imatrix FILE (from coil imatrix or llama-imatrix)",
                opts.mix.name(),
                t.name
            )));
        }
        return Ok(out);
    };
    let file_err = |why: String| ConvertError::Quant(format!("importance matrix {label}: {why}"));
    if !file
        .tensors()
        .iter()
        .any(|t| m.entries.contains_key(&t.name))
    {
        return Err(file_err(format!(
            "none of its {} entries (e.g. {:?}) names a tensor of this model: it was made for another model",
            m.entries.len(),
            m.entries.keys().next().map_or("", |k| k.as_str())
        )));
    }
    for (i, (t, &ty)) in file.tensors().iter().zip(types).enumerate() {
        if ty == t.ty {
            continue;
        }
        let Some(w) = m.importance(&t.name) else {
            continue;
        };
        let want = t.dims.first().copied().unwrap_or(1) * t.dims.get(2).copied().unwrap_or(1);
        if w.len() as u64 != want {
            // llama-quantize lets token embeddings pass
            if category(&t.name) == Category::TokenEmbd {
                continue;
            }
            return Err(file_err(format!(
                "its entry for tensor {:?} has {} values, the tensor takes {want} ({} columns{}): it was made for another model",
                t.name,
                w.len(),
                t.dims[0],
                match t.dims.get(2) {
                    Some(e) if *e > 1 => format!(" × {e} experts"),
                    _ => String::new(),
                }
            )));
        }
        if let Some(v) = w.iter().find(|v| !v.is_finite()) {
            return Err(file_err(format!(
                "its entry for tensor {:?} holds the non-finite value {v}",
                t.name
            )));
        }
        out[i] = Some(w);
    }
    let missing = file
        .tensors()
        .iter()
        .zip(types)
        .zip(&out)
        .find(|((t, &ty), w)| w.is_none() && needs(t, ty));
    if let Some(((t, ty), _)) = missing {
        return Err(file_err(format!(
            "it has no entry for tensor {:?}, which {} quantizes to {ty} (that needs importance weights)",
            t.name,
            opts.mix.name()
        )));
    }
    Ok(out)
}

/// Elements converted per step, bounding memory for huge tensors.
const CHUNK_ELEMENTS: usize = 1 << 22;

/// Quantizes `input` into `output` with mixture `opts.mix`.
pub fn quantize(input: &Path, output: &Path, opts: &QuantizeOptions) -> Result<QuantizeReport> {
    let same = match (std::fs::canonicalize(input), std::fs::canonicalize(output)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    };
    if same {
        return Err(ConvertError::Quant(
            "the output file must differ from the input file".into(),
        ));
    }
    let file = GgufFile::open(input)?;
    // A second map of each file for the tensor data, whose pages are
    // released after each tensor (the GgufFile's own map is only used for
    // the header), so memory stays near one block of rows.
    let maps = file
        .parts()
        .iter()
        .map(|p| {
            let path = p.path.clone().unwrap_or_else(|| input.to_path_buf());
            let io = |source| ConvertError::Io {
                path: path.clone(),
                source,
            };
            let f = std::fs::File::open(&path).map_err(io)?;
            // SAFETY: read-only map of a file coil does not write.
            unsafe { memmap2::Mmap::map(&f) }.map_err(io)
        })
        .collect::<Result<Vec<_>>>()?;
    let release = |map: &memmap2::Mmap, r: std::ops::Range<usize>| {
        #[cfg(unix)]
        {
            // SAFETY: read-only shared file mapping: dropped pages fault the
            // unchanged contents back in.
            let _ = unsafe {
                map.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    r.start,
                    r.end - r.start,
                )
            };
        }
        #[cfg(not(unix))]
        let _ = (map, r);
    };
    let types = plan_types_with(&file, opts);
    let importance = importance_of(&file, &types, opts)?;
    let mut md = file.metadata().clone();
    // llama-quantize re-appends these two keys at the end.
    md.remove("general.quantization_version");
    md.remove("general.file_type");
    md.insert("general.quantization_version", Value::U32(2));
    md.insert("general.file_type", Value::U32(opts.mix.file_type()));
    if let Some((label, m)) = &opts.imatrix {
        // llama-quantize's overrides, in its order (strings cut at 127 bytes)
        let cut = |s: &str| {
            let mut n = s.len().min(127);
            while !s.is_char_boundary(n) {
                n -= 1;
            }
            s[..n].to_string()
        };
        md.insert("quantize.imatrix.file", Value::String(cut(label)));
        if let Some(d) = m.datasets.first() {
            md.insert("quantize.imatrix.dataset", Value::String(cut(d)));
        }
        md.insert(
            "quantize.imatrix.entries_count",
            Value::U32(m.entries.len() as u32),
        );
        if m.chunk_count > 0 {
            md.insert("quantize.imatrix.chunks_count", Value::U32(m.chunk_count));
        }
    }
    // Written in llama-quantize's order, so the files are identical.
    let order = llama_order(file.tensors());
    let specs: Vec<TensorSpec> = order
        .iter()
        .map(|&i| {
            let t = &file.tensors()[i];
            // ggml drops trailing 1-dims ({512, 1} is written as {512}).
            let n = t.dims.iter().rposition(|&d| d != 1).map_or(1, |p| p + 1);
            TensorSpec::new(t.name.clone(), &t.dims[..n], types[i])
        })
        .collect();
    let mut requantized = 0;
    for (t, &ty) in file.tensors().iter().zip(&types) {
        if ty != t.ty && !coil_gguf::quant::can_dequantize(t.ty) {
            return Err(ConvertError::Quant(format!(
                "tensor {:?}: coil cannot read its type {} to requantize it",
                t.name, t.ty
            )));
        }
        requantized += usize::from(ty != t.ty && !t.ty.is_plain());
    }
    let total: u64 = file.tensors().iter().map(|t| t.n_bytes).sum();
    let pb = crate::progress::bar(total, opts.progress, "quantizing");
    let mut w = SplitWriter::create(output, &md, &specs, opts.split)?;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut bytes_out = 0u64;
    for &i in &order {
        let (t, ty) = (&file.tensors()[i], types[i]);
        pb.set_message(t.name.clone());
        *counts.entry(ty.name().to_string()).or_default() += 1;
        // The tensor's bytes in its own file's map.
        let (map, part) = (&maps[t.part], &file.parts()[t.part]);
        let start = (part.data_offset + t.offset) as usize;
        let range = start..start + t.n_bytes as usize;
        let data = map.get(range.clone()).ok_or_else(|| {
            ConvertError::Quant(format!(
                "tensor {:?}: data past the end of the file",
                t.name
            ))
        })?;
        if ty == t.ty {
            w.write_tensor_data(data)?;
            bytes_out += data.len() as u64;
            release(map, range);
        } else {
            let ne0 = t.dims.first().copied().unwrap_or(1) as usize;
            let row_in = t.ty.bytes_for(ne0 as u64).unwrap_or(0) as usize;
            let row_out = ty.bytes_for(ne0 as u64).unwrap_or(0) as usize;
            let rows_per_chunk = (CHUNK_ELEMENTS / ne0.max(1)).max(1);
            let n_rows = (t.n_elements as usize).checked_div(ne0).unwrap_or(0);
            // an expert's rows take its own importance weights
            let imp = importance[i].as_deref();
            let n_mat = imp.map_or(1, |w| w.len() / ne0.max(1)).max(1);
            let rows_per_mat = n_rows / n_mat;
            let mut f = vec![0f32; rows_per_chunk.min(n_rows.max(1)) * ne0];
            let mut q = vec![0u8; rows_per_chunk.min(n_rows.max(1)) * row_out];
            let mut r = 0;
            while r < n_rows {
                let mat = r / rows_per_mat.max(1);
                let mat_end = ((mat + 1) * rows_per_mat).min(n_rows);
                let n = rows_per_chunk.min(mat_end - r);
                let weights = imp.map(|w| &w[mat * ne0..(mat + 1) * ne0]);
                let src = &data[r * row_in..(r + n) * row_in];
                let fx = &mut f[..n * ne0];
                let qx = &mut q[..n * row_out];
                let err = |e: coil_gguf::quant::QuantError| {
                    ConvertError::Quant(format!("tensor {:?}: {e}", t.name))
                };
                coil_gguf::quant::dequantize_row(t.ty, src, fx).map_err(err)?;
                quantize_parallel(ty, fx, qx, ne0, row_out, weights).map_err(err)?;
                w.write_tensor_data(qx)?;
                bytes_out += qx.len() as u64;
                release(
                    map,
                    range.start + r * row_in..range.start + (r + n) * row_in,
                );
                r += n;
            }
        }
        pb.inc(t.n_bytes);
    }
    let files = w.finish()?;
    pb.finish_and_clear();
    Ok(QuantizeReport {
        output: files[0].clone(),
        files,
        bytes_in: total,
        bytes_out,
        types: counts,
        requantized,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixture_names() {
        assert_eq!(QuantMix::parse("q4_k_m"), Some(QuantMix::Q4_K_M));
        assert_eq!(QuantMix::parse("Q5_K"), Some(QuantMix::Q5_K_M));
        assert_eq!(QuantMix::parse("Q3_K"), Some(QuantMix::Q3_K_M));
        assert_eq!(QuantMix::parse("q3_k_s"), Some(QuantMix::Q3_K_S));
        assert_eq!(QuantMix::parse("q2_k_s"), Some(QuantMix::Q2_K_S));
        assert_eq!(QuantMix::parse("IQ2_XS"), Some(QuantMix::IQ2_XS));
        assert_eq!(QuantMix::parse("mxfp4_moe"), Some(QuantMix::MXFP4_MOE));
        assert_eq!(QuantMix::parse("IQ4_K"), None);
        assert_eq!(QuantMix::IQ2_M.file_type(), 29);
        assert_eq!(QuantMix::IQ2_M.default_type(), GgmlType::IQ2_S);
        assert_eq!(QuantMix::IQ2_S.default_type(), GgmlType::IQ2_XS);
        assert_eq!(QuantMix::Q6_K.file_type(), 18);
        assert_eq!(QuantMix::Q2_K.file_type(), 10);
        assert_eq!(QuantMix::Q5_K_S.file_type(), 16);
        for m in QuantMix::ALL {
            assert_eq!(QuantMix::parse(m.name()), Some(m));
        }
    }

    /// A llama-shaped file: 8 layers, dims multiples of 256, plus SSM-style
    /// extras; the plan must follow llama.cpp's rules.
    fn synthetic() -> GgufFile {
        use coil_gguf::{Metadata, TensorSpec};
        let mut md = Metadata::new();
        md.insert("general.architecture", Value::String("llama".into()));
        md.insert("llama.block_count", Value::U32(8));
        md.insert("llama.attention.head_count", Value::U32(4));
        md.insert("llama.attention.head_count_kv", Value::U32(1));
        let mut t = vec![
            TensorSpec::new("token_embd.weight", &[256, 1000], GgmlType::F16),
            TensorSpec::new("output.weight", &[256, 1000], GgmlType::F16),
            TensorSpec::new("blk.0.ssm_conv1d.weight", &[4, 256], GgmlType::F32),
            TensorSpec::new("blk.0.ssm_a", &[1, 8], GgmlType::F32),
            TensorSpec::new("blk.0.ssm_norm.weight", &[32, 8], GgmlType::F32),
            TensorSpec::new("blk.0.ssm_dt.weight", &[48, 256], GgmlType::F16),
            TensorSpec::new("blk.0.ssm_x.weight", &[512, 288], GgmlType::F16),
            TensorSpec::new("blk.0.ffn_gate_inp.weight", &[256, 8], GgmlType::F32),
        ];
        for b in 0..8 {
            for (n, d) in [
                ("attn_norm.weight", vec![256]),
                ("attn_q.weight", vec![256, 256]),
                ("attn_k.weight", vec![256, 64]),
                ("attn_v.weight", vec![256, 64]),
                ("attn_output.weight", vec![256, 256]),
                ("ffn_down.weight", vec![512, 256]),
                ("ffn_up.weight", vec![256, 512]),
            ] {
                t.push(TensorSpec::new(format!("blk.{b}.{n}"), &d, GgmlType::F16));
            }
        }
        let (mut bytes, sizes) = coil_gguf::gguf::encode_header(&md, &t).unwrap();
        for s in sizes {
            bytes.extend(vec![0u8; (s as usize).div_ceil(32) * 32]);
        }
        GgufFile::from_bytes(bytes).unwrap()
    }

    #[test]
    fn q4_k_m_plan_follows_llama_cpp() {
        let f = synthetic();
        let types = plan_types(&f, QuantMix::Q4_K_M);
        let ty = |name: &str| {
            let i = f.tensors().iter().position(|t| t.name == name).unwrap();
            types[i]
        };
        use GgmlType::*;
        assert_eq!(ty("output.weight"), Q6_K);
        assert_eq!(ty("token_embd.weight"), Q4_K); // untied
        assert_eq!(ty("blk.0.ssm_conv1d.weight"), F32);
        assert_eq!(ty("blk.0.ssm_a"), F32);
        assert_eq!(ty("blk.0.ssm_norm.weight"), F32);
        assert_eq!(ty("blk.0.ffn_gate_inp.weight"), F32);
        assert_eq!(ty("blk.0.ssm_dt.weight"), F16); // 48 columns: Q4_K → Q5_0 → F16
        assert_eq!(ty("blk.0.ssm_x.weight"), Q4_K); // 512 columns
        for b in 0..8 {
            let more = [0, 3, 6, 7].contains(&b);
            let want = if more { Q6_K } else { Q4_K };
            assert_eq!(ty(&format!("blk.{b}.attn_v.weight")), want, "layer {b}");
            assert_eq!(ty(&format!("blk.{b}.ffn_down.weight")), want, "layer {b}");
            assert_eq!(ty(&format!("blk.{b}.attn_q.weight")), Q4_K);
            assert_eq!(ty(&format!("blk.{b}.attn_norm.weight")), F16); // 1-D: kept as is
        }
        // Q4_0: only the output changes; Q8_0: nothing but the default.
        let t0 = plan_types(&f, QuantMix::Q4_0);
        assert_eq!(t0[1], Q6_K);
        assert!(t0.iter().filter(|&&t| t == Q4_0).count() > 40);
        let t8 = plan_types(&f, QuantMix::Q8_0);
        assert_eq!(t8[1], Q8_0);
        assert_eq!(t8[5], F16); // ssm_dt: rows of 48 are not whole 32-blocks
    }

    /// The low-bit and `_S` / `_L` mixtures on the same llama-shaped file
    /// (8 layers, 4 query heads per KV head).
    #[test]
    fn k_mixture_plans_follow_llama_cpp() {
        use GgmlType::*;
        let f = synthetic();
        let f = &f;
        let plan = |mix| {
            let types = plan_types(f, mix);
            move |name: &str| {
                let i = f.tensors().iter().position(|t| t.name == name).unwrap();
                types[i]
            }
        };
        let q2 = plan(QuantMix::Q2_K);
        assert_eq!(q2("output.weight"), Q6_K);
        assert_eq!(q2("blk.0.ssm_x.weight"), Q2_K);
        assert_eq!(q2("blk.0.ssm_dt.weight"), F16); // Q2_K → Q4_0 → F16
        for b in 0..8 {
            let l = |n: &str| format!("blk.{b}.{n}");
            assert_eq!(q2(&l("attn_v.weight")), Q4_K); // n_head / n_head_kv = 4
            assert_eq!(q2(&l("ffn_down.weight")), Q3_K);
            assert_eq!(q2(&l("attn_output.weight")), Q3_K);
            assert_eq!(q2(&l("attn_q.weight")), Q2_K);
            assert_eq!(q2(&l("ffn_up.weight")), Q2_K);
        }
        let (s, m, l) = (
            plan(QuantMix::Q3_K_S),
            plan(QuantMix::Q3_K_M),
            plan(QuantMix::Q3_K_L),
        );
        for b in 0..8 {
            let n = |x: &str| format!("blk.{b}.{x}");
            for x in ["attn_v.weight", "ffn_down.weight", "attn_output.weight"] {
                assert_eq!(s(&n(x)), Q3_K, "{x}");
                assert_eq!(l(&n(x)), Q5_K, "{x}");
            }
            assert_eq!(m(&n("attn_v.weight")), if b < 2 { Q5_K } else { Q4_K });
            // below 8 / 16 = 0 layers: never Q5_K; Q4_K elsewhere
            assert_eq!(m(&n("ffn_down.weight")), Q4_K);
            assert_eq!(m(&n("attn_output.weight")), Q4_K);
            assert_eq!(m(&n("attn_q.weight")), Q3_K);
        }
        let (k4s, k5s) = (plan(QuantMix::Q4_K_S), plan(QuantMix::Q5_K_S));
        for b in 0..8 {
            let n = |x: &str| format!("blk.{b}.{x}");
            assert_eq!(k4s(&n("attn_v.weight")), if b < 4 { Q5_K } else { Q4_K });
            assert_eq!(k4s(&n("ffn_down.weight")), if b < 1 { Q5_K } else { Q4_K });
            assert_eq!(k4s(&n("attn_output.weight")), Q4_K);
            assert_eq!(k5s(&n("attn_v.weight")), Q5_K);
            assert_eq!(k5s(&n("ffn_down.weight")), Q5_K);
        }
        let xs = plan(QuantMix::IQ4_XS);
        assert_eq!(xs("output.weight"), Q6_K);
        assert_eq!(xs("blk.0.ssm_x.weight"), IQ4_XS);
        assert_eq!(xs("blk.0.ssm_dt.weight"), F16); // 48: IQ4_XS → IQ4_NL → F16
        for b in 0..8 {
            let n = |x: &str| format!("blk.{b}.{x}");
            assert_eq!(xs(&n("attn_v.weight")), Q5_K);
            assert_eq!(xs(&n("ffn_down.weight")), if b < 1 { Q5_K } else { IQ4_XS });
            assert_eq!(xs(&n("attn_q.weight")), IQ4_XS);
        }
        let nl = plan(QuantMix::IQ4_NL);
        assert_eq!(nl("blk.3.attn_q.weight"), IQ4_NL);
        assert_eq!(nl("blk.0.ssm_dt.weight"), F16);
    }

    /// llama-quantize's flags: a given output / token-embedding type is taken
    /// as is, `--pure` drops the per-tensor rules, `--leave-output-tensor`
    /// keeps the output's type; tied embeddings follow the output's type.
    #[test]
    fn flags_follow_llama_cpp() {
        use GgmlType::*;
        let f = synthetic();
        let ty = |opts: &QuantizeOptions, name: &str| {
            let i = f.tensors().iter().position(|t| t.name == name).unwrap();
            plan_types_with(&f, opts)[i]
        };
        let base = QuantizeOptions::new(QuantMix::Q4_K_M);
        let pure = QuantizeOptions {
            pure: true,
            ..base.clone()
        };
        assert_eq!(ty(&pure, "output.weight"), Q4_K);
        assert_eq!(ty(&pure, "blk.0.attn_v.weight"), Q4_K); // a `more` layer
        assert_eq!(ty(&pure, "blk.0.ssm_dt.weight"), F16); // fallback still
        assert_eq!(ty(&pure, "blk.0.ssm_conv1d.weight"), F32);
        let leave = QuantizeOptions {
            leave_output: true,
            ..base.clone()
        };
        assert_eq!(ty(&leave, "output.weight"), F16);
        assert_eq!(ty(&leave, "token_embd.weight"), Q4_K);
        let types = QuantizeOptions {
            output_type: Some(Q8_0),
            token_embd_type: Some(Q5_1),
            ..base.clone()
        };
        assert_eq!(ty(&types, "output.weight"), Q8_0);
        assert_eq!(ty(&types, "token_embd.weight"), Q5_1);
        assert_eq!(ty(&types, "blk.0.attn_v.weight"), Q6_K);
        // tied embeddings (no output.weight): the output type applies to them
        use coil_gguf::{Metadata, TensorSpec};
        let mut md = Metadata::new();
        md.insert("general.architecture", Value::String("llama".into()));
        md.insert("llama.block_count", Value::U32(1));
        let t = [TensorSpec::new(
            "token_embd.weight",
            &[256, 64],
            GgmlType::F16,
        )];
        let (mut bytes, sizes) = coil_gguf::gguf::encode_header(&md, &t).unwrap();
        bytes.extend(vec![0u8; sizes[0] as usize]);
        let tied = GgufFile::from_bytes(bytes).unwrap();
        let out_f16 = QuantizeOptions {
            output_type: Some(F16),
            ..base.clone()
        };
        assert_eq!(plan_types_with(&tied, &out_f16), [F16]);
        assert_eq!(plan_types_with(&tied, &base), [Q6_K]);
        // --tensor-type: the first matching rule; the others keep the
        // mixture's rules (and counters: attn_v of layer 7 is still `more`)
        let rules = QuantizeOptions {
            tensor_types: vec![
                TensorTypeRule::parse(r"BLK\.[0-2]\.attn_v=q8_0").unwrap(),
                TensorTypeRule::parse("attn=Q5_1").unwrap(),
                TensorTypeRule::parse("ssm_dt=q4_k").unwrap(),
            ],
            ..base.clone()
        };
        assert_eq!(ty(&rules, "blk.1.attn_v.weight"), Q8_0);
        assert_eq!(ty(&rules, "blk.5.attn_v.weight"), Q5_1);
        assert_eq!(ty(&rules, "blk.5.attn_q.weight"), Q5_1);
        assert_eq!(ty(&rules, "blk.5.ffn_down.weight"), Q4_K);
        assert_eq!(ty(&rules, "blk.7.ffn_down.weight"), Q6_K);
        assert_eq!(ty(&rules, "blk.0.ssm_dt.weight"), F16); // 48 wide: fallback
        for bad in [
            "attn_v",
            "=q8_0",
            "attn(=q8_0",
            "attn=q9_9",
            "attn=q8_k",
            "a=b=q8_0",
        ] {
            let e = TensorTypeRule::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
    }

    /// The IQ and other importance-matrix mixtures on the llama-shaped file
    /// (8 layers, 4 query heads per KV head), with and without an
    /// importance matrix where the rules read it.
    #[test]
    fn iq_mixture_plans_follow_llama_cpp() {
        use GgmlType::*;
        let f = synthetic();
        let plan = |mix, imat: bool| {
            let opts = QuantizeOptions {
                imatrix: imat.then(|| ("m.gguf".to_string(), Imatrix::default())),
                ..QuantizeOptions::new(mix)
            };
            let types = plan_types_with(&f, &opts);
            let f = &f;
            move |name: &str| {
                let i = f.tensors().iter().position(|t| t.name == name).unwrap();
                types[i]
            }
        };
        let n = |b: usize, x: &str| format!("blk.{b}.{x}");
        let xxs = plan(QuantMix::IQ2_XXS, true);
        assert_eq!(xxs("output.weight"), Q5_K);
        assert_eq!(xxs("token_embd.weight"), Q2_K);
        assert_eq!(xxs("blk.0.ssm_dt.weight"), F16); // 48 wide: IQ4_NL → F16
        assert_eq!(xxs("blk.0.ssm_x.weight"), IQ2_XXS);
        for b in 0..8 {
            assert_eq!(xxs(&n(b, "attn_v.weight")), Q4_K);
            assert_eq!(
                xxs(&n(b, "ffn_down.weight")),
                if b < 1 { Q2_K } else { IQ2_XXS }
            );
            assert_eq!(xxs(&n(b, "attn_output.weight")), IQ2_XXS);
            assert_eq!(xxs(&n(b, "attn_q.weight")), IQ2_XXS);
        }
        let m2 = plan(QuantMix::IQ2_M, true);
        assert_eq!(m2("token_embd.weight"), IQ3_S);
        assert_eq!(m2("blk.3.attn_q.weight"), IQ2_S);
        assert_eq!(m2("blk.3.attn_output.weight"), IQ3_S);
        assert_eq!(m2("blk.0.ffn_down.weight"), IQ3_S);
        let s1 = plan(QuantMix::IQ1_S, true);
        assert_eq!(s1("blk.2.attn_output.weight"), IQ2_XXS);
        assert_eq!(s1("blk.2.ffn_up.weight"), IQ1_S);
        for imat in [true, false] {
            let x3 = plan(QuantMix::IQ3_XXS, imat);
            assert_eq!(x3("output.weight"), Q5_K);
            assert_eq!(x3("token_embd.weight"), IQ3_S);
            for b in 0..8 {
                assert_eq!(x3(&n(b, "attn_v.weight")), Q4_K); // 4 heads per KV head
                assert_eq!(x3(&n(b, "attn_q.weight")), IQ2_S);
                assert_eq!(x3(&n(b, "attn_k.weight")), IQ2_S);
                assert_eq!(x3(&n(b, "attn_output.weight")), IQ3_S);
                let down = match (imat, b) {
                    (true, _) => IQ3_XXS,
                    (false, 0) => Q4_K,
                    (false, _) => Q3_K,
                };
                assert_eq!(x3(&n(b, "ffn_down.weight")), down, "{imat} {b}");
            }
        }
        let xs = plan(QuantMix::IQ3_XS, true);
        assert_eq!(xs("output.weight"), Q6_K);
        for b in 0..8 {
            let mid = (1..7).contains(&b);
            assert_eq!(
                xs(&n(b, "ffn_up.weight")),
                if mid { IQ3_XXS } else { IQ3_S }
            );
            assert_eq!(xs(&n(b, "attn_v.weight")), Q4_K);
            assert_eq!(xs(&n(b, "attn_q.weight")), IQ3_XXS);
            assert_eq!(xs(&n(b, "ffn_down.weight")), IQ3_S);
        }
        let m3 = plan(QuantMix::IQ3_M, true);
        for b in 0..8 {
            assert_eq!(m3(&n(b, "attn_output.weight")), Q4_K);
            assert_eq!(
                m3(&n(b, "ffn_down.weight")),
                if b < 1 { Q4_K } else { IQ3_S }
            );
        }
        // Q4_0 / Q5_0 with an importance matrix: the first eighth's ffn_down
        // a step up; IQ4_XS's Q5_K step only without one
        assert_eq!(plan(QuantMix::Q4_0, true)("blk.0.ffn_down.weight"), Q4_1);
        assert_eq!(plan(QuantMix::Q4_0, false)("blk.0.ffn_down.weight"), Q4_0);
        assert_eq!(plan(QuantMix::Q5_0, true)("blk.0.ffn_down.weight"), Q5_1);
        assert_eq!(
            plan(QuantMix::IQ4_XS, true)("blk.0.ffn_down.weight"),
            IQ4_XS
        );
        assert_eq!(plan(QuantMix::IQ4_XS, false)("blk.0.ffn_down.weight"), Q5_K);
        let ks = plan(QuantMix::Q2_K_S, true);
        assert_eq!(ks("blk.0.ffn_down.weight"), Q4_K);
        assert_eq!(ks("blk.5.ffn_down.weight"), Q2_K);
        assert_eq!(ks("blk.5.attn_v.weight"), Q4_K);
        let tq = plan(QuantMix::TQ1_0, false);
        assert_eq!(tq("token_embd.weight"), Q4_K);
        assert_eq!(tq("blk.1.ffn_up.weight"), TQ1_0);
        assert_eq!(tq("blk.0.ssm_dt.weight"), F16); // TQ1_0 → Q4_0 → F16
                                                    // MXFP4_MOE: no expert tensors here, so Q8_0 throughout
        let mx = plan(QuantMix::MXFP4_MOE, false);
        assert_eq!(mx("output.weight"), Q8_0);
        assert_eq!(mx("token_embd.weight"), Q8_0);
        assert_eq!(mx("blk.1.ffn_up.weight"), Q8_0);
    }

    /// Without an importance matrix the mixtures that need one are refused
    /// by name; with one made for another model, the file and tensor are
    /// named.
    #[test]
    fn importance_matrix_errors_name_file_and_tensor() {
        use crate::imatrix::ImatrixEntry;
        let f = synthetic();
        let opts = QuantizeOptions::new(QuantMix::IQ2_XXS);
        let types = plan_types_with(&f, &opts);
        let e = importance_of(&f, &types, &opts).unwrap_err().to_string();
        assert!(e.contains("IQ2_XXS") && e.contains("--imatrix"), "{e}");
        // names of another model
        let mut other = Imatrix::default();
        other.entries.insert(
            "blk.0.ffn_up_exps.weight".into(),
            ImatrixEntry {
                sums: vec![1.0; 64],
                counts: vec![1.0],
            },
        );
        let with = |m: Imatrix| QuantizeOptions {
            imatrix: Some(("other.imatrix".into(), m)),
            ..QuantizeOptions::new(QuantMix::IQ2_XXS)
        };
        let o = with(other);
        let e = importance_of(&f, &plan_types_with(&f, &o), &o)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("other.imatrix") && e.contains("another model"),
            "{e}"
        );
        // a size that differs
        let mut sized = Imatrix::default();
        sized.entries.insert(
            "blk.2.attn_q.weight".into(),
            ImatrixEntry {
                sums: vec![1.0; 128],
                counts: vec![4.0],
            },
        );
        let o = with(sized.clone());
        let e = importance_of(&f, &plan_types_with(&f, &o), &o)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("other.imatrix") && e.contains("blk.2.attn_q.weight") && e.contains("128"),
            "{e}"
        );
        // right sizes but a tensor the mixture needs weights for is missing
        sized.entries.get_mut("blk.2.attn_q.weight").unwrap().sums = vec![1.0; 256];
        let o = with(sized);
        let e = importance_of(&f, &plan_types_with(&f, &o), &o)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("other.imatrix") && e.contains("no entry for tensor"),
            "{e}"
        );
    }

    #[test]
    fn more_bits_layers() {
        // llama.cpp: first and last eighth, then every third layer.
        let n = 24;
        let picked: Vec<i64> = (0..n).filter(|&i| use_more_bits(i, n)).collect();
        assert_eq!(picked, [0, 1, 2, 5, 8, 11, 14, 17, 20, 21, 22, 23]);
    }
}
