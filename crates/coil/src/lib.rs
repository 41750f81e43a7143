//! coil layers 2–4: memory (KV cells and recurrent state), models (one file
//! per architecture), engine (batches, sampling, tokenizer, generation).

pub mod engine;
pub mod memory;
pub mod models;
pub mod tokenizer;
