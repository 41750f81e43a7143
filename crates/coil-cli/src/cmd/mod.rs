//! One module per subcommand.

pub mod common;
pub mod inspect;
pub mod logits;
pub mod run;
