//! Exit codes and the command implementations behind `main`'s argument parsing.
//! Each command lives with the module that owns its subject.

/// Generic failure: the command could not do its job (message on stderr).
pub const EXIT_FAILURE: u8 = 1;
/// The configuration is invalid.
pub const EXIT_CONFIG: u8 = 2;

pub use crate::api::crds_command as crds;
pub use crate::config::check_config_command as check_config;
pub use crate::daemon::run_command as run;
