//! Blocks shared by several architectures.

pub mod common;
pub mod mamba1_mixer;
pub mod mamba2_mixer;
