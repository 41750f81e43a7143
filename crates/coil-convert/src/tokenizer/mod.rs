//! The tokenizer, embedded as llama.cpp's `tokenizer.ggml.*` keys:
//! `tokenizer.json` byte-level BPE → `gpt2` (tokens, token types, merges and
//! the pre-tokenizer name found the way llama.cpp finds it: by hashing the
//! token ids of a fixed text), SentencePiece `tokenizer.model` → `llama`
//! (tokens, scores, types); special token ids, `add_bos`/`add_eos` and the
//! chat template from `tokenizer_config.json` / `config.json`.

mod pre_hashes;
mod spm_model;

pub use pre_hashes::{CHKTXT, PRE_HASHES};
pub use spm_model::{PieceType, SpmModel};

use crate::arch::{VocabSpec, VocabStyle};
use crate::config::{read_json, Config};
use crate::error::{ConvertError, Result};
use coil_gguf::{Metadata, Value, ValueType};
use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use std::path::Path;

const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const UNUSED: i32 = 5;
const BYTE: i32 = 6;

fn tok_err(msg: impl Into<String>) -> ConvertError {
    ConvertError::Tokenizer(msg.into())
}

/// llama.cpp's `does_token_look_special`.
pub fn looks_special(t: &str) -> bool {
    matches!(t, "<pad>" | "<mask>" | "<2mass>" | "[@BOS@]")
        || (t.starts_with("<|") && t.ends_with("|>"))
        || (t.starts_with("<｜") && t.ends_with("｜>"))
        || (t.starts_with("<unused") && t.ends_with('>'))
}

fn strings(v: Vec<String>) -> Value {
    Value::Array(
        ValueType::String,
        v.into_iter().map(Value::String).collect(),
    )
}

/// Writes the `tokenizer.ggml.*` keys for the checkpoint in `dir`.
/// `vocab_size` is config.json's (0 when absent); it is padded to
/// `spec.pad_multiple`.
pub fn write_vocab(
    dir: &Path,
    cfg: &Config,
    spec: VocabSpec,
    vocab_size: usize,
    md: &mut Metadata,
) -> Result<()> {
    let pad = spec.pad_multiple.max(1);
    let padded = vocab_size.div_ceil(pad) * pad;
    let json = dir.join("tokenizer.json");
    let spm = ["tokenizer.model", "tokenizer.model.v3"]
        .iter()
        .map(|n| dir.join(n))
        .find(|p| p.is_file());
    let use_spm = match spec.style {
        VocabStyle::SpmFirst => spm.is_some(),
        VocabStyle::BpeFirst => !json.is_file() && spm.is_some(),
    };
    if use_spm {
        if let Some(p) = spm {
            return write_spm(dir, &p, cfg, padded, md);
        }
    }
    if json.is_file() {
        return write_bpe(dir, &json, cfg, padded, md);
    }
    Err(tok_err(format!(
        "{}: no tokenizer.json or tokenizer.model found",
        dir.display()
    )))
}

/// Reads `tokenizer.json`'s BPE model: (token by id, added-token flags by id,
/// merges).
struct HfBpe {
    tokens: Vec<Option<String>>,
    /// For added tokens: (special, normalized).
    added: Vec<Option<bool>>,
    merges: Vec<String>,
    /// Ids the post-processor puts around a single sequence.
    prefix_ids: Vec<u32>,
    suffix_ids: Vec<u32>,
}

fn read_hf_bpe(path: &Path) -> Result<(HfBpe, Json)> {
    let j = read_json(path)?;
    let bad = |r: &str| tok_err(format!("{}: {r}", path.display()));
    let model = j.get("model").ok_or_else(|| bad("no \"model\""))?;
    let ty = model.get("type").and_then(Json::as_str).unwrap_or("BPE");
    if ty != "BPE" {
        return Err(bad(&format!(
            "tokenizer model type {ty:?} is not supported (only byte-level BPE)"
        )));
    }
    let vocab = model
        .get("vocab")
        .and_then(Json::as_object)
        .ok_or_else(|| bad("no model.vocab object"))?;
    let mut pairs: Vec<(usize, String, Option<bool>)> = Vec::with_capacity(vocab.len());
    for (t, id) in vocab {
        let id = id
            .as_u64()
            .ok_or_else(|| bad("a vocab id is not an integer"))?;
        pairs.push((id as usize, t.clone(), None));
    }
    if let Some(added) = j.get("added_tokens").and_then(Json::as_array) {
        for a in added {
            let id = a.get("id").and_then(Json::as_u64);
            let content = a.get("content").and_then(Json::as_str);
            if let (Some(id), Some(content)) = (id, content) {
                let special = a.get("special").and_then(Json::as_bool).unwrap_or(false);
                pairs.push((id as usize, content.to_string(), Some(special)));
            }
        }
    }
    let n = pairs.iter().map(|p| p.0 + 1).max().unwrap_or(0);
    if n > 16 << 20 {
        return Err(bad(&format!("token id {} is implausibly large", n - 1)));
    }
    let mut tokens = vec![None; n];
    let mut added = vec![None; n];
    for (id, t, sp) in pairs {
        tokens[id] = Some(t);
        if sp.is_some() {
            added[id] = sp;
        }
    }
    let mut merges = Vec::new();
    if let Some(ms) = model.get("merges").and_then(Json::as_array) {
        for m in ms {
            match m {
                Json::String(s) => merges.push(s.clone()),
                Json::Array(p) if p.len() == 2 => {
                    let part = |x: &Json| -> Result<String> {
                        let s = x
                            .as_str()
                            .ok_or_else(|| bad("a merge is not a string pair"))?;
                        Ok(s.chars()
                            .map(|c| if c == ' ' { '\u{120}' } else { c })
                            .collect())
                    };
                    merges.push(format!("{} {}", part(&p[0])?, part(&p[1])?));
                }
                _ => return Err(bad("unknown merges format")),
            }
        }
    }
    let (mut prefix_ids, mut suffix_ids) = (Vec::new(), Vec::new());
    if let Some(pp) = j.get("post_processor").filter(|p| !p.is_null()) {
        let procs: Vec<&Json> = match pp.get("processors").and_then(Json::as_array) {
            Some(v) => v.iter().collect(),
            None => vec![pp],
        };
        for p in procs {
            if p.get("type").and_then(Json::as_str) != Some("TemplateProcessing") {
                continue;
            }
            let specials = p.get("special_tokens");
            let ids_of = |name: &str| -> Vec<u32> {
                specials
                    .and_then(|s| s.get(name))
                    .and_then(|s| s.get("ids"))
                    .and_then(Json::as_array)
                    .map(|a| {
                        a.iter()
                            .filter_map(|x| x.as_u64())
                            .map(|x| x as u32)
                            .collect()
                    })
                    .unwrap_or_default()
            };
            if let Some(single) = p.get("single").and_then(Json::as_array) {
                let seq_at = single.iter().position(|e| e.get("Sequence").is_some());
                for (i, e) in single.iter().enumerate() {
                    if let Some(id) = e
                        .get("SpecialToken")
                        .and_then(|s| s.get("id"))
                        .and_then(Json::as_str)
                    {
                        if seq_at.is_some_and(|s| i < s) {
                            prefix_ids.extend(ids_of(id));
                        } else {
                            suffix_ids.extend(ids_of(id));
                        }
                    }
                }
            }
        }
    }
    Ok((
        HfBpe {
            tokens,
            added,
            merges,
            prefix_ids,
            suffix_ids,
        },
        j,
    ))
}

/// The `tokenizer.ggml.pre` name: tokenizes [`CHKTXT`] with each
/// pre-tokenizer coil implements and looks the sha256 of the ids up in
/// llama.cpp's table.
fn find_pre(bpe: &HfBpe, texts: &[String], types: &[i32]) -> Result<String> {
    use coil::tokenizer::{TokenType, Tokenizer, Vocab};
    let types: Vec<TokenType> = types.iter().map(|&t| TokenType::from_i32(t)).collect();
    let mut tried = Vec::new();
    for cand in [
        "gpt-2",
        "llama-bpe",
        "qwen2",
        "refact",
        "falcon",
        "dbrx",
        "tekken",
        "gpt-4o",
        "default",
    ] {
        let mut v = Vocab::bpe(texts.to_vec(), bpe.merges.clone(), Some(cand));
        v.token_types = types.clone();
        let tok = match Tokenizer::new(v) {
            Ok(t) => t,
            Err(e) => {
                tried.push(format!("{cand}: {e}"));
                continue;
            }
        };
        let mut ids: Vec<u32> = bpe.prefix_ids.clone();
        ids.extend(tok.encode(CHKTXT, false));
        ids.extend(&bpe.suffix_ids);
        let list = format!(
            "[{}]",
            ids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        );
        let hash = format!("{:x}", Sha256::digest(list.as_bytes()));
        // llama.cpp's table is a run of `if`s: the last match wins (the
        // NeoX fingerprint is listed as "mpt", then as "olmo").
        if let Some((_, name)) = PRE_HASHES.iter().rev().find(|(h, _)| *h == hash) {
            return Ok(name.to_string());
        }
        tried.push(hash);
    }
    Err(tok_err(format!(
        "the BPE pre-tokenizer was not recognised (fingerprints {}); like llama.cpp, coil only converts tokenizers whose pre-tokenizer it knows",
        tried.join(", ")
    )))
}

fn write_bpe(
    dir: &Path,
    path: &Path,
    cfg: &Config,
    vocab_size: usize,
    md: &mut Metadata,
) -> Result<()> {
    let (bpe, j) = read_hf_bpe(path)?;
    let n = if vocab_size == 0 {
        bpe.tokens.len()
    } else {
        vocab_size
    };
    if bpe.tokens.len() > n {
        return Err(tok_err(format!(
            "{}: token id {} is beyond the model's vocab_size {n}",
            path.display(),
            bpe.tokens.len() - 1
        )));
    }
    let mut texts = Vec::with_capacity(n);
    let mut types = Vec::with_capacity(n);
    for i in 0..n {
        match bpe.tokens.get(i).cloned().flatten() {
            None => {
                texts.push(format!("[PAD{i}]"));
                types.push(UNUSED);
            }
            Some(t) => match bpe.added.get(i).copied().flatten() {
                Some(special) => {
                    if special || looks_special(&t) {
                        types.push(CONTROL);
                        texts.push(t);
                    } else {
                        types.push(USER_DEFINED);
                        texts.push(t.replace('\u{2581}', " "));
                    }
                }
                None => {
                    types.push(NORMAL);
                    texts.push(t);
                }
            },
        }
    }
    let pre = find_pre(&bpe, &texts, &types)?;
    md.insert("tokenizer.ggml.model", Value::String("gpt2".into()));
    md.insert("tokenizer.ggml.pre", Value::String(pre));
    md.insert("tokenizer.ggml.tokens", strings(texts));
    md.insert(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
    );
    if !bpe.merges.is_empty() {
        md.insert("tokenizer.ggml.merges", strings(bpe.merges));
    }
    special_vocab(dir, cfg, Some(&j), None, md)
}

fn write_spm(
    dir: &Path,
    path: &Path,
    cfg: &Config,
    vocab_size: usize,
    md: &mut Metadata,
) -> Result<()> {
    let bytes = std::fs::read(path).map_err(|source| ConvertError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let model = SpmModel::parse(&bytes).map_err(|e| tok_err(format!("{}: {e}", path.display())))?;
    let n = if vocab_size == 0 {
        model.pieces.len()
    } else {
        vocab_size
    };
    let mut texts: Vec<String> = (0..n).map(|i| format!("[PAD{i}]")).collect();
    let mut scores = vec![-10000.0f32; n];
    let mut types = vec![UNUSED; n];
    for (i, p) in model.pieces.iter().enumerate().take(n) {
        texts[i] = p.text.clone();
        scores[i] = p.score;
        types[i] = match p.kind {
            PieceType::Unknown => UNKNOWN,
            PieceType::Control => CONTROL,
            PieceType::Unused => UNUSED,
            PieceType::Byte => BYTE,
            PieceType::Normal | PieceType::UserDefined => NORMAL,
        };
    }
    if let Ok(added) = read_json(&dir.join("added_tokens.json")) {
        if let Some(obj) = added.as_object() {
            for (k, v) in obj {
                if let Some(id) = v.as_u64().map(|x| x as usize).filter(|&x| x < n) {
                    texts[id] = k.clone();
                    scores[id] = -1000.0;
                    types[id] = USER_DEFINED;
                }
            }
        }
    }
    if let Ok(tc) = read_json(&dir.join("tokenizer_config.json")) {
        if let Some(dec) = tc.get("added_tokens_decoder").and_then(Json::as_object) {
            for (k, v) in dec {
                let Some(id) = k.parse::<usize>().ok().filter(|&x| x < n) else {
                    continue;
                };
                let Some(content) = v.get("content").and_then(Json::as_str) else {
                    continue;
                };
                let special = v.get("special").and_then(Json::as_bool).unwrap_or(false);
                if special || looks_special(content) {
                    types[id] = CONTROL;
                    texts[id] = content.to_string();
                } else {
                    types[id] = USER_DEFINED;
                    texts[id] = content.replace('\u{2581}', " ");
                }
                scores[id] = -1000.0;
            }
        }
    }
    md.insert("tokenizer.ggml.model", Value::String("llama".into()));
    md.insert("tokenizer.ggml.pre", Value::String("default".into()));
    md.insert("tokenizer.ggml.tokens", strings(texts));
    md.insert(
        "tokenizer.ggml.scores",
        Value::Array(ValueType::F32, scores.into_iter().map(Value::F32).collect()),
    );
    md.insert(
        "tokenizer.ggml.token_type",
        Value::Array(ValueType::I32, types.into_iter().map(Value::I32).collect()),
    );
    let tj = read_json(&dir.join("tokenizer.json")).ok();
    special_vocab(dir, cfg, tj.as_ref(), Some(n), md)
}

const SPECIAL_TYPES: [&str; 7] = ["bos", "eos", "unk", "sep", "pad", "cls", "mask"];

fn id_key(typ: &str) -> String {
    match typ {
        "unk" => "tokenizer.ggml.unknown_token_id".into(),
        "sep" => "tokenizer.ggml.seperator_token_id".into(),
        "pad" => "tokenizer.ggml.padding_token_id".into(),
        t => format!("tokenizer.ggml.{t}_token_id"),
    }
}

/// gguf-py's `SpecialVocab`: special ids from `tokenizer_config.json` (by
/// content, looked up among `added_tokens`) then `config.json`; `add_bos` /
/// `add_eos` from the post-processor and `tokenizer_config.json`; the chat
/// template.
fn special_vocab(
    dir: &Path,
    cfg: &Config,
    tokenizer_json: Option<&Json>,
    n_vocab: Option<usize>,
    md: &mut Metadata,
) -> Result<()> {
    let tc = read_json(&dir.join("tokenizer_config.json")).ok();
    let mut ids: Vec<(&str, u32)> = Vec::new();
    let mut add: Vec<(&str, bool)> = Vec::new();
    let set_id = |ids: &mut Vec<(&str, u32)>, typ: &'static str, id: Option<u64>| {
        if let Some(id) = id {
            if n_vocab.is_none_or(|n| (id as usize) < n) && !ids.iter().any(|(t, _)| *t == typ) {
                if let Ok(id) = u32::try_from(id) {
                    ids.push((typ, id));
                }
            }
        }
    };
    if let Some(tj) = tokenizer_json {
        if let Some(pp) = tj.get("post_processor").filter(|p| !p.is_null()) {
            let procs: Vec<&Json> = match pp.get("processors").and_then(Json::as_array) {
                Some(v) => v.iter().collect(),
                None => vec![pp],
            };
            for p in procs {
                match p.get("type").and_then(Json::as_str) {
                    Some("ByteLevel") => {
                        for t in ["bos", "eos"] {
                            if !add.iter().any(|(x, _)| *x == t) {
                                add.push((t, false));
                            }
                        }
                    }
                    Some("TemplateProcessing") => {
                        if let Some(single) = p.get("single").and_then(Json::as_array) {
                            if single.len() > 1 {
                                let first = single[0].get("SpecialToken").is_some();
                                let last = single[single.len() - 1].get("SpecialToken").is_some();
                                add.retain(|(t, _)| *t != "bos" && *t != "eos");
                                add.push(("bos", first));
                                add.push(("eos", last));
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
        if let Some(tc) = &tc {
            let added = tj.get("added_tokens").and_then(Json::as_array);
            for typ in SPECIAL_TYPES {
                let content = match tc.get(format!("{typ}_token")) {
                    Some(Json::String(s)) => Some(s.as_str()),
                    Some(Json::Object(o)) => o.get("content").and_then(Json::as_str),
                    _ => None,
                };
                if let (Some(content), Some(added)) = (content, added) {
                    let id = added
                        .iter()
                        .find(|a| a.get("content").and_then(Json::as_str) == Some(content))
                        .and_then(|a| a.get("id"))
                        .and_then(Json::as_u64);
                    set_id(&mut ids, typ, id);
                }
            }
        }
    }
    if let Some(tc) = &tc {
        for typ in SPECIAL_TYPES {
            if let Some(b) = tc.get(format!("add_{typ}_token")).and_then(Json::as_bool) {
                if !add.iter().any(|(t, _)| *t == typ) {
                    add.push((typ, b));
                }
            }
        }
    }
    for typ in SPECIAL_TYPES {
        let id = cfg.get(&format!("{typ}_token_id")).and_then(Json::as_u64);
        set_id(&mut ids, typ, id);
    }
    for (typ, id) in ids {
        md.insert(id_key(typ), Value::U32(id));
    }
    for (typ, b) in add {
        md.insert(format!("tokenizer.ggml.add_{typ}_token"), Value::Bool(b));
    }
    // Chat template: tokenizer_config.json, else chat_template.jinja / .json.
    let mut template = tc
        .as_ref()
        .and_then(|t| t.get("chat_template"))
        .and_then(Json::as_str)
        .map(str::to_string);
    if template.is_none() {
        if let Ok(s) = std::fs::read_to_string(dir.join("chat_template.jinja")) {
            template = Some(s);
        } else if let Ok(j) = read_json(&dir.join("chat_template.json")) {
            template = j
                .get("chat_template")
                .and_then(Json::as_str)
                .map(str::to_string);
        }
    }
    if tc.is_some() {
        if let Some(t) = template {
            md.insert("tokenizer.chat_template", Value::String(t));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_looking_tokens() {
        assert!(looks_special("<|im_end|>"));
        assert!(looks_special("<unused12>"));
        assert!(!looks_special("hello"));
    }
}
