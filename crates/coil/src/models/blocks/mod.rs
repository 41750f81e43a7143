//! Blocks shared by several architectures.

pub mod attention;
pub mod common;
pub mod ffn;
pub mod gated_attention;
pub mod gated_delta_mixer;
pub mod hyper_connection;
pub mod indexed_attention;
pub mod kda_mixer;
pub mod lora;
pub mod mamba1_mixer;
pub mod mamba2_mixer;
pub mod mla;
pub mod ngram_embedding;
pub mod per_layer_embedding;
pub mod short_conv;
pub mod stack;
mod stack_nextn;
