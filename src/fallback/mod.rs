//! TODO: see the issue that owns this module.
