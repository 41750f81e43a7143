//! Layer 3: one file per architecture plus the shared blocks and the layer
//! plan.

pub mod plan;

pub use plan::{FeedForward, LayerKind, LayerPlan, Mixer};
