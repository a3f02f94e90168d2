//! nodegrace: safe Kubernetes node shutdown and reboot.
//!
//! Pure decisions live in [`plan`]; every external system has one adapter module
//! behind a small trait; [`daemon`] is the one state machine that drives them.

pub mod api;
pub mod cli;
pub mod cluster;
pub mod config;
pub mod credentials;
pub mod cri;
pub mod daemon;
pub mod fallback;
pub mod fsutil;
pub mod logind;
pub mod metrics;
pub mod plan;
pub mod sandbox;
pub mod shutdown;
pub mod state;
pub mod staticpods;
pub mod systemd;
pub mod telemetry;
pub mod text;
