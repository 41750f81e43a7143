//! One module per subcommand.

pub mod inspect;
