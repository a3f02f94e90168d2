//! Static-pod gate: moves manifests out of the kubelet's `staticPodPath` and back,
//! journaled and crash-safe. See the StaticPodGate trait for the contract.

use anyhow::Result;

/// One static pod manifest, identified by parsing it (not by its file name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticManifest {
    /// File name inside the manifest or gate directory.
    pub file_name: String,
    pub namespace: String,
    /// `metadata.name` in the manifest; the mirror pod is named `<name>-<nodeName>`.
    pub pod_name: String,
    pub priority: i32,
    pub labels: std::collections::BTreeMap<String, String>,
}

/// Synchronous on purpose: callers in async code use `spawn_blocking`.
pub trait StaticPodGate: Send + Sync {
    /// Replays the journal after a crash; every manifest ends in exactly one place.
    fn recover(&self) -> Result<()>;
    /// Manifests the kubelet currently sees (parseable ones; others are reported).
    fn active(&self) -> Result<Vec<StaticManifest>>;
    /// Manifests currently gated.
    fn gated(&self) -> Result<Vec<StaticManifest>>;
    /// Moves one manifest from the manifest directory to the gate directory.
    fn gate(&self, file_name: &str) -> Result<()>;
    /// Moves every gated manifest back, never overwriting; returns the names kept aside.
    fn restore_all(&self) -> Result<Vec<String>>;
}
