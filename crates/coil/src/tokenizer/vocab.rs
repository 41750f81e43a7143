//! The vocabulary: a plain description of a tokenizer as GGUF stores it
//! (`tokenizer.ggml.*`), from which [`Tokenizer`](super::Tokenizer) is built.

use coil_gguf::{GgufFile, Metadata, Value};

use super::pretokenize::PreTokenizer;
use super::TokenizerError;

/// GGUF metadata keys of the tokenizer.
pub mod keys {
    pub const MODEL: &str = "tokenizer.ggml.model";
    pub const PRE: &str = "tokenizer.ggml.pre";
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    pub const SCORES: &str = "tokenizer.ggml.scores";
    pub const MERGES: &str = "tokenizer.ggml.merges";
    pub const BOS_ID: &str = "tokenizer.ggml.bos_token_id";
    pub const EOS_ID: &str = "tokenizer.ggml.eos_token_id";
    pub const UNK_ID: &str = "tokenizer.ggml.unknown_token_id";
    pub const PAD_ID: &str = "tokenizer.ggml.padding_token_id";
    pub const EOT_ID: &str = "tokenizer.ggml.eot_token_id";
    pub const EOM_ID: &str = "tokenizer.ggml.eom_token_id";
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
}

/// Which tokenizer algorithm (`tokenizer.ggml.model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum VocabKind {
    /// `"gpt2"`: byte-level BPE with ranked merges and a regex pre-tokenizer.
    Bpe,
    /// `"llama"`: SentencePiece BPE with scores and `<0xXX>` byte fallback.
    Spm,
}

impl VocabKind {
    /// The `tokenizer.ggml.model` value.
    pub fn gguf_name(self) -> &'static str {
        match self {
            VocabKind::Bpe => "gpt2",
            VocabKind::Spm => "llama",
        }
    }
}

/// A token's type (`tokenizer.ggml.token_type`, llama.cpp's
/// `llama_token_type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
pub enum TokenType {
    /// 0 or any value not listed below.
    Undefined,
    /// 1: ordinary text.
    #[default]
    Normal,
    /// 2: the unknown token.
    Unknown,
    /// 3: control (BOS, EOS, chat markers); never produced from plain text.
    Control,
    /// 4: user-defined (added) token, matched verbatim in the input.
    UserDefined,
    /// 5: unused slot.
    Unused,
    /// 6: a `<0xXX>` byte (SentencePiece byte fallback).
    Byte,
}

impl TokenType {
    pub fn from_i32(v: i32) -> Self {
        match v {
            1 => TokenType::Normal,
            2 => TokenType::Unknown,
            3 => TokenType::Control,
            4 => TokenType::UserDefined,
            5 => TokenType::Unused,
            6 => TokenType::Byte,
            _ => TokenType::Undefined,
        }
    }

    pub fn to_i32(self) -> i32 {
        match self {
            TokenType::Undefined => 0,
            TokenType::Normal => 1,
            TokenType::Unknown => 2,
            TokenType::Control => 3,
            TokenType::UserDefined => 4,
            TokenType::Unused => 5,
            TokenType::Byte => 6,
        }
    }
}

/// Everything a tokenizer is built from, mirroring the GGUF keys.
///
/// Fill it by hand (see [`Vocab::bpe`] / [`Vocab::spm`]) or read it with
/// [`Vocab::from_gguf`]. Fields with llama.cpp defaults are already resolved
/// here: `add_bos`, `add_space_prefix` and the special ids hold the values
/// llama.cpp would use.
#[derive(Clone, Debug, PartialEq)]
pub struct Vocab {
    /// `tokenizer.ggml.model`.
    pub kind: VocabKind,
    /// `tokenizer.ggml.tokens`: token texts, as stored (byte-level BPE texts
    /// use GPT-2's byte ↔ unicode mapping, SentencePiece texts use `▁`).
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.token_type`; empty means all [`TokenType::Normal`].
    pub token_types: Vec<TokenType>,
    /// `tokenizer.ggml.scores`; empty means all 0. Used by SentencePiece.
    pub scores: Vec<f32>,
    /// `tokenizer.ggml.merges` (`"left right"`, best first). Used by BPE.
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.eot_token_id` (end of turn).
    pub eot_id: Option<u32>,
    /// `tokenizer.ggml.eom_token_id` (end of message).
    pub eom_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`: prepend BOS when encoding with
    /// `add_special`.
    pub add_bos: bool,
    /// `tokenizer.ggml.add_eos_token`: append EOS when encoding with
    /// `add_special`.
    pub add_eos: bool,
    /// `tokenizer.ggml.add_space_prefix` (SentencePiece): prefix raw text
    /// with a space. Ignored by BPE.
    pub add_space_prefix: bool,
    /// `tokenizer.ggml.pre`: the BPE pre-tokenizer name; `None` means
    /// llama.cpp's "default". Ignored by SentencePiece.
    pub pre: Option<String>,
}

impl Vocab {
    /// A byte-level BPE vocabulary with llama.cpp's defaults: no special ids,
    /// no BOS/EOS added, the given pre-tokenizer.
    pub fn bpe(tokens: Vec<String>, merges: Vec<String>, pre: Option<&str>) -> Self {
        Vocab {
            kind: VocabKind::Bpe,
            tokens,
            token_types: Vec::new(),
            scores: Vec::new(),
            merges,
            bos_id: None,
            eos_id: None,
            unk_id: None,
            pad_id: None,
            eot_id: None,
            eom_id: None,
            add_bos: false,
            add_eos: false,
            add_space_prefix: false,
            pre: pre.map(str::to_string),
        }
    }

    /// A SentencePiece vocabulary with llama.cpp's defaults: unk 0, BOS 1,
    /// EOS 2 (when the vocabulary is that large), BOS added, space prefix.
    pub fn spm(tokens: Vec<String>, scores: Vec<f32>) -> Self {
        let n = tokens.len();
        let id = |i: u32| ((i as usize) < n).then_some(i);
        Vocab {
            kind: VocabKind::Spm,
            tokens,
            token_types: Vec::new(),
            scores,
            merges: Vec::new(),
            bos_id: id(1),
            eos_id: id(2),
            unk_id: id(0),
            pad_id: None,
            eot_id: None,
            eom_id: None,
            add_bos: id(1).is_some(),
            add_eos: false,
            add_space_prefix: true,
            pre: None,
        }
    }

    /// Reads the vocabulary from a GGUF file's metadata.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, TokenizerError> {
        Self::from_metadata(file.metadata())
    }

    /// Reads the vocabulary from GGUF metadata, applying llama.cpp's defaults
    /// for absent optional keys.
    pub fn from_metadata(md: &Metadata) -> Result<Self, TokenizerError> {
        let model = match md.get(keys::MODEL) {
            None => return Err(TokenizerError::MissingKey(keys::MODEL)),
            Some(v) => v.as_str().ok_or(TokenizerError::WrongType {
                key: keys::MODEL,
                expected: "string",
            })?,
        };
        let kind = match model {
            "gpt2" => VocabKind::Bpe,
            "llama" => VocabKind::Spm,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let tokens =
            string_array(md, keys::TOKENS)?.ok_or(TokenizerError::MissingKey(keys::TOKENS))?;
        let pre = match md.get(keys::PRE) {
            None => None,
            Some(v) => Some(
                v.as_str()
                    .ok_or(TokenizerError::WrongType {
                        key: keys::PRE,
                        expected: "string",
                    })?
                    .to_string(),
            ),
        };
        let mut vocab = match kind {
            VocabKind::Bpe => {
                let merges = string_array(md, keys::MERGES)?
                    .ok_or(TokenizerError::MissingKey(keys::MERGES))?;
                let mut v = Vocab::bpe(tokens, merges, pre.as_deref());
                // llama.cpp turns BOS on by default for some pre-tokenizers.
                v.add_bos = PreTokenizer::from_name(pre.as_deref())?.default_add_bos();
                v
            }
            VocabKind::Spm => {
                let scores = f32_array(md, keys::SCORES)?.unwrap_or_default();
                let mut v = Vocab::spm(tokens, scores);
                v.pre = pre;
                v
            }
        };
        if let Some(types) = i32_array(md, keys::TOKEN_TYPE)? {
            vocab.token_types = types.into_iter().map(TokenType::from_i32).collect();
        }
        if vocab.kind == VocabKind::Bpe {
            if let Some(scores) = f32_array(md, keys::SCORES)? {
                vocab.scores = scores;
            }
        }
        for (key, slot) in [
            (keys::BOS_ID, &mut vocab.bos_id),
            (keys::EOS_ID, &mut vocab.eos_id),
            (keys::UNK_ID, &mut vocab.unk_id),
            (keys::PAD_ID, &mut vocab.pad_id),
            (keys::EOT_ID, &mut vocab.eot_id),
            (keys::EOM_ID, &mut vocab.eom_id),
        ] {
            if let Some(v) = md.get(key) {
                *slot = token_id(key, v)?;
            }
        }
        for (key, slot) in [
            (keys::ADD_BOS, &mut vocab.add_bos),
            (keys::ADD_EOS, &mut vocab.add_eos),
            (keys::ADD_SPACE_PREFIX, &mut vocab.add_space_prefix),
        ] {
            if let Some(v) = md.get(key) {
                *slot = v.as_bool().ok_or(TokenizerError::WrongType {
                    key,
                    expected: "bool",
                })?;
            }
        }
        vocab.validate()?;
        Ok(vocab)
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// The type of token `id` (Normal when types are absent, Undefined when
    /// out of range).
    pub fn token_type(&self, id: u32) -> TokenType {
        let i = id as usize;
        if i >= self.tokens.len() {
            TokenType::Undefined
        } else {
            self.token_types
                .get(i)
                .copied()
                .unwrap_or(TokenType::Normal)
        }
    }

    /// The score of token `id` (0 when scores are absent).
    pub fn score(&self, id: u32) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }

    /// Checks lengths, ids and flags against each other.
    pub fn validate(&self) -> Result<(), TokenizerError> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(TokenizerError::Inconsistent {
                key: keys::TOKENS,
                reason: "the vocabulary is empty".into(),
            });
        }
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::Inconsistent {
                key: keys::TOKENS,
                reason: format!("{n} tokens do not fit 32-bit ids"),
            });
        }
        if !self.token_types.is_empty() && self.token_types.len() != n {
            return Err(TokenizerError::Inconsistent {
                key: keys::TOKEN_TYPE,
                reason: format!("{} entries for {n} tokens", self.token_types.len()),
            });
        }
        if !self.scores.is_empty() && self.scores.len() != n {
            return Err(TokenizerError::Inconsistent {
                key: keys::SCORES,
                reason: format!("{} entries for {n} tokens", self.scores.len()),
            });
        }
        for (key, id) in [
            (keys::BOS_ID, self.bos_id),
            (keys::EOS_ID, self.eos_id),
            (keys::UNK_ID, self.unk_id),
            (keys::PAD_ID, self.pad_id),
            (keys::EOT_ID, self.eot_id),
            (keys::EOM_ID, self.eom_id),
        ] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(TokenizerError::Inconsistent {
                        key,
                        reason: format!("token id {id} out of range for {n} tokens"),
                    });
                }
            }
        }
        if self.add_bos && self.bos_id.is_none() {
            return Err(TokenizerError::Inconsistent {
                key: keys::ADD_BOS,
                reason: format!("BOS is to be added but `{}` is not set", keys::BOS_ID),
            });
        }
        if self.add_eos && self.eos_id.is_none() {
            return Err(TokenizerError::Inconsistent {
                key: keys::ADD_EOS,
                reason: format!("EOS is to be added but `{}` is not set", keys::EOS_ID),
            });
        }
        Ok(())
    }
}

fn string_array(md: &Metadata, key: &'static str) -> Result<Option<Vec<String>>, TokenizerError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let wrong = TokenizerError::WrongType {
        key,
        expected: "array of strings",
    };
    let arr = v.as_array().ok_or_else(|| wrong.clone())?;
    arr.iter()
        .map(|e| e.as_str().map(str::to_string).ok_or_else(|| wrong.clone()))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn i32_array(md: &Metadata, key: &'static str) -> Result<Option<Vec<i32>>, TokenizerError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let wrong = TokenizerError::WrongType {
        key,
        expected: "array of integers",
    };
    let arr = v.as_array().ok_or_else(|| wrong.clone())?;
    arr.iter()
        .map(|e| {
            e.as_int()
                .filter(|_| !matches!(e, Value::Bool(_)))
                .and_then(|x| i32::try_from(x).ok())
                .ok_or_else(|| wrong.clone())
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

fn f32_array(md: &Metadata, key: &'static str) -> Result<Option<Vec<f32>>, TokenizerError> {
    let Some(v) = md.get(key) else {
        return Ok(None);
    };
    let wrong = TokenizerError::WrongType {
        key,
        expected: "array of numbers",
    };
    let arr = v.as_array().ok_or_else(|| wrong.clone())?;
    arr.iter()
        .map(|e| match e {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            _ => Err(wrong.clone()),
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

/// A token id key. `-1` and `u32::MAX` (both `LLAMA_TOKEN_NULL` as written by
/// converters) mean "none".
fn token_id(key: &'static str, v: &Value) -> Result<Option<u32>, TokenizerError> {
    let x = match v {
        Value::Bool(_) => None,
        _ => v.as_int(),
    }
    .ok_or(TokenizerError::WrongType {
        key,
        expected: "integer",
    })?;
    if x == -1 || x == i128::from(u32::MAX) {
        return Ok(None);
    }
    u32::try_from(x)
        .map(Some)
        .map_err(|_| TokenizerError::Inconsistent {
            key,
            reason: format!("{x} is not a token id"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn md(entries: Vec<(&str, Value)>) -> Metadata {
        let mut m = Metadata::new();
        for (k, v) in entries {
            m.insert(k, v);
        }
        m
    }

    fn strs(v: &[&str]) -> Value {
        Value::Array(
            coil_gguf::ValueType::String,
            v.iter().map(|s| Value::String(s.to_string())).collect(),
        )
    }

    #[test]
    fn errors_name_the_key() {
        let e = Vocab::from_metadata(&md(vec![])).unwrap_err();
        assert_eq!(e, TokenizerError::MissingKey(keys::MODEL));
        assert!(e.to_string().contains("tokenizer.ggml.model"));

        let e = Vocab::from_metadata(&md(vec![(keys::MODEL, Value::String("gpt2".into()))]))
            .unwrap_err();
        assert_eq!(e, TokenizerError::MissingKey(keys::TOKENS));

        let e = Vocab::from_metadata(&md(vec![
            (keys::MODEL, Value::String("gpt2".into())),
            (keys::TOKENS, strs(&["a", "b"])),
        ]))
        .unwrap_err();
        assert_eq!(e, TokenizerError::MissingKey(keys::MERGES));

        let e = Vocab::from_metadata(&md(vec![
            (keys::MODEL, Value::String("gpt2".into())),
            (keys::TOKENS, Value::String("a".into())),
        ]))
        .unwrap_err();
        assert!(matches!(
            e,
            TokenizerError::WrongType {
                key: keys::TOKENS,
                ..
            }
        ));

        let e = Vocab::from_metadata(&md(vec![
            (keys::MODEL, Value::String("rwkv".into())),
            (keys::TOKENS, strs(&["a"])),
        ]))
        .unwrap_err();
        assert_eq!(e, TokenizerError::UnsupportedModel("rwkv".into()));

        let e = Vocab::from_metadata(&md(vec![
            (keys::MODEL, Value::String("llama".into())),
            (keys::TOKENS, strs(&["<unk>", "<s>", "</s>"])),
            (keys::BOS_ID, Value::U32(7)),
        ]))
        .unwrap_err();
        assert!(
            matches!(
                e,
                TokenizerError::Inconsistent {
                    key: keys::BOS_ID,
                    ..
                }
            ),
            "{e}"
        );

        let e = Vocab::from_metadata(&md(vec![
            (keys::MODEL, Value::String("llama".into())),
            (keys::TOKENS, strs(&["<unk>", "<s>", "</s>"])),
            (
                keys::TOKEN_TYPE,
                Value::Array(coil_gguf::ValueType::I32, vec![Value::I32(1)]),
            ),
        ]))
        .unwrap_err();
        assert!(
            matches!(
                e,
                TokenizerError::Inconsistent {
                    key: keys::TOKEN_TYPE,
                    ..
                }
            ),
            "{e}"
        );

        let e = Vocab::from_metadata(&md(vec![
            (keys::MODEL, Value::String("gpt2".into())),
            (keys::PRE, Value::String("klingon".into())),
            (keys::TOKENS, strs(&["a"])),
            (keys::MERGES, strs(&[])),
        ]))
        .unwrap_err();
        assert_eq!(e, TokenizerError::UnknownPreTokenizer("klingon".into()));
    }

    #[test]
    fn defaults() {
        let v = Vocab::from_metadata(&md(vec![
            (keys::MODEL, Value::String("llama".into())),
            (keys::TOKENS, strs(&["<unk>", "<s>", "</s>", "▁a"])),
        ]))
        .unwrap();
        assert_eq!((v.unk_id, v.bos_id, v.eos_id), (Some(0), Some(1), Some(2)));
        assert!(v.add_bos && !v.add_eos && v.add_space_prefix);
        assert_eq!(v.token_type(3), TokenType::Normal);

        let v = Vocab::from_metadata(&md(vec![
            (keys::MODEL, Value::String("gpt2".into())),
            (keys::PRE, Value::String("llama-bpe".into())),
            (keys::TOKENS, strs(&["a", "b", "ab"])),
            (keys::MERGES, strs(&["a b"])),
            (keys::BOS_ID, Value::U32(2)),
            (keys::PAD_ID, Value::I32(-1)),
        ]))
        .unwrap();
        assert!(v.add_bos);
        assert_eq!(v.pad_id, None);
        assert!(!v.add_space_prefix);
    }
}
