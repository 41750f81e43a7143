//! coil layer 0 — the file formats: GGUF read (memory-mapped, zero-copy) and
//! write, and the tensor element/block formats with (de)quantization.
//!
//! Nothing here knows about compute or models.

pub mod dtype;
pub mod gguf;
pub mod npy;
pub mod quant;

pub use dtype::GgmlType;
pub use gguf::{
    GgufError, GgufFile, GgufWriter, Metadata, Part, SplitLimits, SplitWriter, TensorInfo,
    TensorSpec, TensorView, Value, ValueType,
};
