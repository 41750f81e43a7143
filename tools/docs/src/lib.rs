//! Tools for the repository's documentation (not part of the product):
//!
//! * [`speed`]: the README's speed figure (`docs/img/speed.svg`), drawn from the
//!   `summary.json` that `scripts/bench-vs-llamacpp.sh` writes;
//! * [`text`]: the rules that keep the tracked text a reference about the
//!   product — no numbered work periods, no ticket numbers as provenance, no
//!   words about who did what — and the README's speed section within its
//!   budget. `tests/repository_text.rs` applies them to every tracked file.

pub mod speed;
pub mod text;
