//! The layer plan: for each layer, its token mixer and its feed-forward,
//! derived once from GGUF metadata (and, where llama.cpp does the same, from
//! which tensors a layer has). Memory is sized from it; `coil inspect`
//! prints it.

use coil_gguf::{GgufFile, Value};
use std::fmt;

/// What mixes information across tokens in a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mixer {
    Attention,
    Mamba1,
    Mamba2,
    /// Attention and Mamba-2 side by side on the same input (Falcon-H1).
    AttentionParallelMamba2,
    /// A feed-forward-only layer (Nemotron-H `-` / `E`).
    None,
    /// Gated DeltaNet (Qwen3.5, Qwen3-Next linear-attention layers).
    GatedDeltaNet,
    /// LFM2's gated short convolution.
    ShortConv,
    /// Kimi Delta Attention (Kimi-Linear's linear-attention layers).
    Kda,
    /// Multi-head latent attention (Kimi-Linear's full-attention layers).
    Mla,
    /// Zamba2's hybrid layer: one of the model's shared transformer blocks
    /// (attention + MLP, on the layer input beside the token embedding;
    /// reused at several depths, each use with its own attention cells and
    /// adapters) added to the input of the layer's own Mamba-2 mixer.
    SharedBlockMamba2,
}

/// The per-token feed-forward of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeedForward {
    Dense,
    Moe,
    /// Routed experts plus an always-on shared expert.
    MoeShared,
    /// A mixer-only layer (Mamba, Nemotron-H `M` / `*`).
    None,
}

impl Mixer {
    pub fn has_attention(self) -> bool {
        matches!(
            self,
            Mixer::Attention
                | Mixer::AttentionParallelMamba2
                | Mixer::Mla
                | Mixer::SharedBlockMamba2
        )
    }
    pub fn has_recurrent(self) -> bool {
        matches!(
            self,
            Mixer::Mamba1
                | Mixer::Mamba2
                | Mixer::AttentionParallelMamba2
                | Mixer::GatedDeltaNet
                | Mixer::ShortConv
                | Mixer::Kda
                | Mixer::SharedBlockMamba2
        )
    }
    pub fn name(self) -> &'static str {
        match self {
            Mixer::Attention => "attention",
            Mixer::Mamba1 => "mamba1",
            Mixer::Mamba2 => "mamba2",
            Mixer::AttentionParallelMamba2 => "attention+mamba2",
            Mixer::None => "none",
            Mixer::GatedDeltaNet => "gated_deltanet",
            Mixer::ShortConv => "shortconv",
            Mixer::Kda => "kda",
            Mixer::Mla => "mla",
            Mixer::SharedBlockMamba2 => "shared+mamba2",
        }
    }
}

impl FeedForward {
    pub fn name(self) -> &'static str {
        match self {
            FeedForward::Dense => "dense",
            FeedForward::Moe => "moe",
            FeedForward::MoeShared => "moe+shared",
            FeedForward::None => "none",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerKind {
    pub mixer: Mixer,
    pub ffn: FeedForward,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LayerPlan {
    pub arch: String,
    /// The trunk: the layers of the forward pass, blocks `0..layers.len()`.
    pub layers: Vec<LayerKind>,
    /// The NextN / multi-token-prediction blocks that follow the trunk in
    /// the file (`{arch}.nextn_predict_layers`, blocks `layers.len()..`):
    /// ordinary decoder blocks beside `blk.N.nextn.*` tensors, which only a
    /// draft of the next-but-one token runs (see [`super::nextn`]).
    pub nextn: Vec<LayerKind>,
    /// Shared blocks (Zamba2): per trunk layer, the shared block it runs
    /// before its own mixer, if any (`{arch}.shared_block_schedule`). One
    /// block serves several depths; each use keeps its own attention cells
    /// (those of its layer) and its own adapters (its layer's tensors).
    /// Empty for architectures without shared blocks.
    pub shared: Vec<Option<usize>>,
    /// The shared blocks in the file (`{arch}.shared_block_count`).
    pub n_shared_blocks: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("GGUF has no general.architecture")]
    NoArchitecture,
    #[error("architecture {0:?} is not supported (supported: {list})", list = SUPPORTED_ARCHS.join(", "))]
    UnsupportedArch(String),
    #[error("metadata {key}: {reason}")]
    Metadata { key: String, reason: String },
}

/// GGUF architectures coil knows.
pub const SUPPORTED_ARCHS: [&str; 18] = [
    "mamba",
    "mamba2",
    "jamba",
    "granitehybrid",
    "falcon-h1",
    "nemotron_h",
    "nemotron_h_moe",
    "llama",
    "qwen35",
    "qwen35moe",
    "qwen3next",
    "lfm2",
    "lfm2moe",
    "lfm3",
    "kimi-linear",
    "bailingmoe3",
    "qwen4exp",
    "zamba2",
];

/// A per-layer integer hyper-parameter: either one value for all layers or
/// an array with one per layer.
pub fn per_layer_u64(
    file: &GgufFile,
    key: &str,
    n_layer: usize,
) -> Result<Option<Vec<u64>>, PlanError> {
    let bad = |reason: String| PlanError::Metadata {
        key: key.to_string(),
        reason,
    };
    match file.metadata().get(key) {
        None => Ok(None),
        Some(Value::Array(_, items)) => {
            if items.len() != n_layer {
                return Err(bad(format!(
                    "has {} entries for {n_layer} layers",
                    items.len()
                )));
            }
            items
                .iter()
                .map(|v| {
                    v.as_u64()
                        .ok_or_else(|| bad(format!("entry {v} is not a count")))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some)
        }
        Some(v) => v
            .as_u64()
            .map(|x| Some(vec![x; n_layer]))
            .ok_or_else(|| bad(format!("{v} is not a count"))),
    }
}

/// Which layers are recurrent (Gated DeltaNet) in a `qwen35` / `qwen35moe` /
/// `qwen3next` file: the `attention.recurrent_layers` flags, else every
/// layer but each `full_attention_interval`-th (default 4), as llama.cpp
/// reads them.
fn recurrent_layers(file: &GgufFile, arch: &str, n_layer: usize) -> Result<Vec<bool>, PlanError> {
    let key = format!("{arch}.attention.recurrent_layers");
    let bad = |key: &str, reason: String| PlanError::Metadata {
        key: key.to_string(),
        reason,
    };
    match file.metadata().get(&key) {
        Some(Value::Array(_, items)) => {
            // llama.cpp's converter appends `false` for multi-token-prediction
            // blocks beyond block_count (not written with --no-mtp).
            if items.len() < n_layer {
                return Err(bad(
                    &key,
                    format!("has {} entries for {n_layer} layers", items.len()),
                ));
            }
            items[..n_layer]
                .iter()
                .map(|v| match v {
                    Value::Bool(b) => Ok(*b),
                    other => other
                        .as_u64()
                        .map(|x| x != 0)
                        .ok_or_else(|| bad(&key, format!("entry {other} is not a flag"))),
                })
                .collect()
        }
        Some(v) => Err(bad(&key, format!("{v} is not an array of flags"))),
        None => {
            let key = format!("{arch}.full_attention_interval");
            let every = match file.metadata().get(&key) {
                None => 4,
                Some(v) => v
                    .as_u64()
                    .filter(|&x| x > 0)
                    .ok_or_else(|| bad(&key, format!("{v} is not a positive count")))?,
            } as usize;
            Ok((0..n_layer).map(|i| (i + 1) % every != 0).collect())
        }
    }
}

/// Zamba2's shared-block schedule: `{arch}.shared_block_count` blocks and,
/// per layer, `{arch}.shared_block_schedule` (−1: none, else the block run
/// before the layer's mixer). A use of a block the file does not have is
/// an error naming the layer.
fn shared_schedule(
    file: &GgufFile,
    arch: &str,
    n_layer: usize,
) -> Result<(Vec<Option<usize>>, usize), PlanError> {
    let count_key = format!("{arch}.shared_block_count");
    let key = format!("{arch}.shared_block_schedule");
    let n_blocks = file
        .metadata()
        .get_u64(&count_key)
        .ok_or_else(|| PlanError::Metadata {
            key: count_key.clone(),
            reason: "missing (a count of shared blocks)".into(),
        })? as usize;
    let bad = |reason: String| PlanError::Metadata {
        key: key.clone(),
        reason,
    };
    let items = match file.metadata().get(&key) {
        Some(Value::Array(_, items)) => items,
        Some(v) => return Err(bad(format!("{v} is not an array of block indices"))),
        None => return Err(bad("missing (one entry per layer, -1 for none)".into())),
    };
    if items.len() != n_layer {
        return Err(bad(format!(
            "has {} entries for {n_layer} layers",
            items.len()
        )));
    }
    let schedule = items
        .iter()
        .enumerate()
        .map(|(l, v)| {
            let b = v
                .as_int()
                .ok_or_else(|| bad(format!("entry {l} ({v}) is not an integer")))?;
            match b {
                -1 => Ok(None),
                b if b >= 0 && b < n_blocks as i128 => Ok(Some(b as usize)),
                b => Err(bad(format!(
                    "layer {l} uses shared block {b}, but the file has {n_blocks} ({count_key})"
                ))),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((schedule, n_blocks))
}

impl LayerPlan {
    pub fn from_gguf(file: &GgufFile) -> Result<LayerPlan, PlanError> {
        let arch = file
            .architecture()
            .ok_or(PlanError::NoArchitecture)?
            .to_string();
        if !SUPPORTED_ARCHS.contains(&arch.as_str()) {
            return Err(PlanError::UnsupportedArch(arch));
        }
        let key = format!("{arch}.block_count");
        let n_layer = file
            .metadata()
            .get_u64(&key)
            .ok_or_else(|| PlanError::Metadata {
                key: key.clone(),
                reason: "missing".into(),
            })?;
        if n_layer == 0 || n_layer > 4096 {
            return Err(PlanError::Metadata {
                key,
                reason: format!("{n_layer} layers is out of range"),
            });
        }
        let n_all = n_layer as usize;
        // Multi-token-prediction blocks follow the trunk's layers; they are
        // not part of the forward pass (llama.cpp: n_layer = block_count −
        // nextn_predict_layers, whatever the architecture).
        let key = format!("{arch}.nextn_predict_layers");
        let n_nextn = match file.metadata().get(&key) {
            None => 0,
            Some(v) => v.as_u64().ok_or_else(|| PlanError::Metadata {
                key: key.clone(),
                reason: format!("{v} is not a count"),
            })? as usize,
        };
        if n_nextn >= n_all {
            return Err(PlanError::Metadata {
                key,
                reason: format!("{n_nextn} prediction layers leave none of {n_all}"),
            });
        }
        let n_layer = n_all - n_nextn;
        let gated_delta = matches!(
            arch.as_str(),
            "qwen35" | "qwen35moe" | "qwen3next" | "qwen4exp"
        );
        // Per-layer arrays cover every block, the tail's too.
        let kv = per_layer_u64(file, &format!("{arch}.attention.head_count_kv"), n_all)?;
        let ff = per_layer_u64(file, &format!("{arch}.feed_forward_length"), n_all)?;
        let has = |i: usize, t: &str| file.tensor_info(&format!("blk.{i}.{t}.weight")).is_some();
        let ffn_of = |i: usize| {
            if has(i, "ffn_gate_inp") {
                if has(i, "ffn_up_shexp") || has(i, "ffn_down_shexp") {
                    FeedForward::MoeShared
                } else {
                    FeedForward::Moe
                }
            } else if has(i, "ffn_down") || has(i, "ffn_up") {
                FeedForward::Dense
            } else {
                FeedForward::None
            }
        };
        let kv_at = |i: usize| kv.as_ref().map_or(0, |v| v[i]);
        let recurrent = if gated_delta {
            Some(recurrent_layers(file, &arch, n_layer)?)
        } else {
            None
        };
        let (shared, n_shared_blocks) = match arch.as_str() {
            "zamba2" => shared_schedule(file, &arch, n_layer)?,
            _ => (Vec::new(), 0),
        };
        let layers = (0..n_layer)
            .map(|i| {
                let mixer = match arch.as_str() {
                    "zamba2" if shared[i].is_some() => Mixer::SharedBlockMamba2,
                    "zamba2" => Mixer::Mamba2,
                    "mamba" => Mixer::Mamba1,
                    "mamba2" => Mixer::Mamba2,
                    "llama" => Mixer::Attention,
                    "falcon-h1" => Mixer::AttentionParallelMamba2,
                    "jamba" if kv_at(i) > 0 => Mixer::Attention,
                    "jamba" => Mixer::Mamba1,
                    "granitehybrid" if kv_at(i) > 0 => Mixer::Attention,
                    "granitehybrid" => Mixer::Mamba2,
                    "lfm2" | "lfm2moe" | "lfm3" if kv_at(i) > 0 => Mixer::Attention,
                    "lfm2" | "lfm2moe" | "lfm3" => Mixer::ShortConv,
                    "kimi-linear" | "bailingmoe3" if kv_at(i) > 0 => Mixer::Mla,
                    "kimi-linear" | "bailingmoe3" => Mixer::Kda,
                    _ if gated_delta => match recurrent.as_ref().is_some_and(|r| r[i]) {
                        true => Mixer::GatedDeltaNet,
                        false => Mixer::Attention,
                    },
                    // nemotron_h(_moe): one block per layer, chosen by the
                    // per-layer arrays: attention, feed-forward, or Mamba-2.
                    _ if kv_at(i) > 0 => Mixer::Attention,
                    // llama.cpp's converter writes n_ff 0 for dense layers of
                    // patterns that mix dense and MoE, so look at the tensors too.
                    _ if ff.as_ref().is_some_and(|f| f[i] > 0)
                        || has(i, "ffn_gate_inp")
                        || has(i, "ffn_up") =>
                    {
                        Mixer::None
                    }
                    _ => Mixer::Mamba2,
                };
                let ffn = match arch.as_str() {
                    "mamba" | "mamba2" => FeedForward::None,
                    // the shared block's MLP
                    "zamba2" if shared[i].is_some() => FeedForward::Dense,
                    "zamba2" => FeedForward::None,
                    "nemotron_h" | "nemotron_h_moe" if mixer != Mixer::None => FeedForward::None,
                    _ => ffn_of(i),
                };
                LayerKind { mixer, ffn }
            })
            .collect();
        // A tail block is a decoder block: attention (where it has the
        // tensors) and its feed-forward.
        let nextn = (n_layer..n_all)
            .map(|i| LayerKind {
                mixer: if has(i, "attn_q") || has(i, "attn_qkv") {
                    Mixer::Attention
                } else {
                    Mixer::None
                },
                ffn: ffn_of(i),
            })
            .collect();
        Ok(LayerPlan {
            arch,
            layers,
            nextn,
            shared,
            n_shared_blocks,
        })
    }

    /// Blocks in the file: the trunk's and the NextN tail's (`block_count`),
    /// the length of the per-layer metadata arrays.
    pub fn n_blocks(&self) -> usize {
        self.layers.len() + self.nextn.len()
    }

    /// The uses of shared blocks in layer order: `(layer, block, use)`.
    pub fn shared_uses(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.shared
            .iter()
            .enumerate()
            .filter_map(|(l, b)| b.map(|b| (l, b)))
            .enumerate()
            .map(|(u, (l, b))| (l, b, u))
    }

    pub fn n_attention(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.mixer.has_attention())
            .count()
    }

    pub fn n_recurrent(&self) -> usize {
        self.layers
            .iter()
            .filter(|l| l.mixer.has_recurrent())
            .count()
    }

    /// A one-letter-per-layer pattern in Nemotron-H's notation: `M` Mamba,
    /// `*` attention (MLA too), `P` parallel, `-` dense FFN, `E` MoE (and
    /// `D` Gated DeltaNet, `C` LFM2's short convolution, `K` Kimi Delta
    /// Attention, `S` a shared block before Mamba-2); a layer with both a
    /// mixer and a feed-forward shows the mixer.
    pub fn pattern(&self) -> String {
        self.layers
            .iter()
            .map(|l| match (l.mixer, l.ffn) {
                (Mixer::Attention | Mixer::Mla, _) => '*',
                (Mixer::Kda, _) => 'K',
                (Mixer::Mamba1 | Mixer::Mamba2, _) => 'M',
                (Mixer::GatedDeltaNet, _) => 'D',
                (Mixer::AttentionParallelMamba2, _) => 'P',
                (Mixer::ShortConv, _) => 'C',
                (Mixer::SharedBlockMamba2, _) => 'S',
                (Mixer::None, FeedForward::Moe | FeedForward::MoeShared) => 'E',
                (Mixer::None, _) => '-',
            })
            .collect()
    }
}

impl fmt::Display for LayerPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "layer plan ({}): {} layers, {} attention, {} recurrent, pattern {}",
            self.arch,
            self.layers.len(),
            self.n_attention(),
            self.n_recurrent(),
            self.pattern()
        )?;
        if self.n_shared_blocks > 0 {
            writeln!(
                f,
                "shared blocks: {}, used {} times (each use: its own attention cells and adapters)",
                self.n_shared_blocks,
                self.shared_uses().count()
            )?;
        }
        let mut use_of = self.shared_uses().map(|(_, _, u)| u);
        for (i, l) in self.layers.iter().enumerate() {
            match self.shared.get(i).copied().flatten() {
                Some(b) => writeln!(
                    f,
                    "  blk.{i:<3} {:<17} {:<10} shared block {b}, use {}",
                    l.mixer.name(),
                    l.ffn.name(),
                    use_of.next().unwrap_or(0)
                )?,
                None => writeln!(f, "  blk.{i:<3} {:<17} {}", l.mixer.name(), l.ffn.name())?,
            }
        }
        if !self.nextn.is_empty() {
            writeln!(
                f,
                "NextN / MTP tail: {} block(s), not in the forward pass (draft heads)",
                self.nextn.len()
            )?;
        }
        for (i, l) in self.nextn.iter().enumerate() {
            let b = self.layers.len() + i;
            writeln!(
                f,
                "  blk.{b:<3} {:<17} {:<10} nextn",
                l.mixer.name(),
                l.ffn.name()
            )?;
        }
        Ok(())
    }
}
