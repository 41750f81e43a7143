//! One module per subcommand.

pub mod bench;
pub mod bench_constraint;
pub mod bench_parallel;
pub mod bench_spec;
pub mod chat;
pub mod common;
pub mod context;
pub mod convert;
pub mod imatrix;
pub mod inspect;
pub mod logits;
pub mod perplexity;
pub mod quantize;
pub mod run;
pub mod serve;
pub mod split_args;
