//! Errors of building a tokenizer.

/// Why a vocabulary or tokenizer could not be built. Every variant names the
/// GGUF key (or the [`Vocab`](super::Vocab) field mirroring it) at fault.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A required key is absent.
    #[error("tokenizer: missing GGUF key `{0}`")]
    MissingKey(&'static str),
    /// A key holds a value of the wrong type (e.g. a string where an array
    /// of strings belongs), or an array element of the wrong type.
    #[error("tokenizer: GGUF key `{key}` has the wrong type (expected {expected})")]
    WrongType {
        key: &'static str,
        expected: &'static str,
    },
    /// A key's value contradicts the rest of the vocabulary (length
    /// mismatch, id out of range, malformed entry).
    #[error("tokenizer: GGUF key `{key}`: {reason}")]
    Inconsistent { key: &'static str, reason: String },
    /// `tokenizer.ggml.model` names a tokenizer coil does not implement.
    #[error("tokenizer: unsupported tokenizer model `{0}` (GGUF key `tokenizer.ggml.model`; supported: gpt2, llama)")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer coil does not implement.
    #[error(
        "tokenizer: unsupported pre-tokenizer `{0}` (GGUF key `tokenizer.ggml.pre`); \
         to tokenize with llama.cpp's \"default\" split instead, set `Vocab::pre` to \"default\""
    )]
    UnknownPreTokenizer(String),
}
