//! One module per subcommand.

pub mod validate;
pub mod propagate;
pub mod prune;
pub mod status;
pub mod completion;
pub mod rollout;
