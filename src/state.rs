//! Persisted state under the state directory, always written atomically.

use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::fsutil::write_atomic;
use crate::plan::PodInfo;

pub const POD_CACHE_FILE: &str = "pods.json";

/// The node's pods as last seen online; the offline fallback's source of priorities.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodCache {
    pub node: String,
    pub written_at: Option<chrono::DateTime<chrono::Utc>>,
    pub pods: Vec<PodInfo>,
}

impl PodCache {
    /// Reads the cache; a missing file is an empty cache, a corrupt one an error.
    pub fn load(state_dir: &Path) -> Result<Self> {
        let path = state_dir.join(POD_CACHE_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .with_context(|| format!("parsing pod cache {}", path.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(e).with_context(|| format!("reading pod cache {}", path.display())),
        }
    }

    pub fn store(&self, state_dir: &Path) -> Result<()> {
        let bytes = serde_json::to_vec_pretty(self).context("encoding pod cache")?;
        write_atomic(&state_dir.join(POD_CACHE_FILE), &bytes, 0o600)
    }
}
