//! Errors of conversion and quantization.

use std::path::PathBuf;

/// Why a conversion or quantization failed. Every variant names the file,
/// tensor or config field at fault.
#[derive(Debug, thiserror::Error)]
pub enum ConvertError {
    #[error("cannot access {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {reason}")]
    Json { path: PathBuf, reason: String },
    #[error("architecture {arch:?} is not supported; coil converts {supported}")]
    UnsupportedArch { arch: String, supported: String },
    #[error("{path}: no model architecture found (config.json has no \"architectures\" list and no params.json)")]
    NoArch { path: PathBuf },
    #[error("config field {field}: {reason}")]
    Config { field: String, reason: String },
    #[error("{path}: corrupt safetensors file: {reason}")]
    Safetensors { path: PathBuf, reason: String },
    #[error("{dir}: no model weights found (expected model.safetensors, model-*-of-*.safetensors with model.safetensors.index.json, or consolidated.safetensors)")]
    NoWeights { dir: PathBuf },
    #[error("tensor {name:?} is missing from the checkpoint{hint}")]
    MissingTensor { name: String, hint: String },
    #[error("tensor {name:?}: shape {actual:?}, expected {expected:?}")]
    Shape {
        name: String,
        actual: Vec<usize>,
        expected: Vec<usize>,
    },
    #[error("tensor {name:?}: {reason}")]
    Tensor { name: String, reason: String },
    #[error("tensor {name:?} of the checkpoint was not used by the {arch} converter")]
    UnusedTensor { name: String, arch: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error(transparent)]
    Gguf(#[from] coil_gguf::GgufError),
    #[error("{0}")]
    Quant(String),
}

impl ConvertError {
    pub(crate) fn config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        ConvertError::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub(crate) fn tensor(name: impl Into<String>, reason: impl Into<String>) -> Self {
        ConvertError::Tensor {
            name: name.into(),
            reason: reason.into(),
        }
    }
}

pub type Result<T, E = ConvertError> = std::result::Result<T, E>;
