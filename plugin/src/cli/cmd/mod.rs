//! One module per subcommand.

pub mod check;
pub mod completion;
pub mod images;
pub mod propagate;
pub mod prune;
pub mod rollout;
pub mod status;
pub mod validate;
