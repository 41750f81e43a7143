//! coil layer 5: Hugging Face checkpoints → GGUF (`coil convert`) and GGUF →
//! quantized GGUF (`coil quantize`), file-compatible with llama.cpp's
//! `convert_hf_to_gguf.py` and `llama-quantize`.
//!
//! - [`convert()`]: reads `config.json` + safetensors (single or sharded,
//!   f32/f16/bf16; or Mistral's `params.json` + `consolidated.safetensors`),
//!   maps names and transforms tensors per architecture ([`arch`]), embeds
//!   the tokenizer ([`tokenizer`]) and streams the GGUF out one tensor at a
//!   time.
//! - [`quantize()`]: llama.cpp's per-tensor type mixtures (`Q4_K_M`, ...)
//!   over any GGUF coil reads.
//!
//! Both write to `OUT.partial` and rename on success: a failure (bad input,
//! full disk) leaves no output behind.

pub mod arch;
pub mod config;
mod convert;
pub mod error;
pub mod imatrix;
pub mod plan;
mod progress;
pub mod quantize;
pub mod safetensors_src;
pub mod tokenizer;

pub use convert::{convert, ConvertOptions, ConvertReport, OutType};
pub use error::ConvertError;
pub use quantize::{quantize, QuantMix, QuantizeOptions, QuantizeReport, TensorTypeRule};
