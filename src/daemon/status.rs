//! The runtime status file (`/run/nodegrace/status.json`) that `nodegrace status` reads.

use std::path::Path;

use serde::{Deserialize, Serialize};

use super::ShutdownKind;
use crate::logind::budget::BudgetReport;

pub(crate) const DEFAULT_STATUS_FILE: &str = "/run/nodegrace/status.json";

pub use crate::plan::lifecycle::Phase;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseChange {
    pub phase: Phase,
    pub at: chrono::DateTime<chrono::Utc>,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ShutdownStatus {
    pub kind: ShutdownKind,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub deadline: chrono::DateTime<chrono::Utc>,
    pub resumed: bool,
    /// The way the drain goes now.
    #[serde(default)]
    pub way: Option<crate::plan::lifecycle::Way>,
}

/// How the last shutdown ended, and when it started and ended.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LastShutdown {
    pub outcome: crate::state::ShutdownOutcome,
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub ended_at: chrono::DateTime<chrono::Utc>,
    pub kind: crate::shutdown::ShutdownKind,
    /// Its duration, when this daemon counts it in the histogram of shutdown durations
    /// (`ShutdownState::duration_to_count`).
    #[serde(skip)]
    pub duration_to_count: Option<std::time::Duration>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub pid: u32,
    pub phase: Phase,
    pub bus_connected: bool,
    pub inhibitor_held: bool,
    /// Budget, logind's effective delay and the drop-in used, once established.
    pub budget: Option<BudgetReport>,
    pub shutdown: Option<ShutdownStatus>,
    /// The last shutdown that ended, in this run or before it.
    #[serde(default)]
    pub last_shutdown: Option<LastShutdown>,
    /// Who/why of a kubelet shutdown delay inhibitor, when one is held beside ours.
    pub kubelet_inhibitor: Option<String>,
    pub last_error: Option<String>,
    pub timeline: Vec<PhaseChange>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

/// Longest timeline kept; older entries are dropped first.
const TIMELINE_MAX: usize = 64;

impl Status {
    pub fn new() -> Self {
        let now = chrono::Utc::now();
        Status {
            pid: std::process::id(),
            phase: Phase::Starting,
            bus_connected: false,
            inhibitor_held: false,
            budget: None,
            shutdown: None,
            last_shutdown: None,
            kubelet_inhibitor: None,
            last_error: None,
            timeline: vec![PhaseChange {
                phase: Phase::Starting,
                at: now,
                reason: "daemon started".into(),
            }],
            updated_at: now,
        }
    }

    pub fn enter(&mut self, phase: Phase, reason: &str) {
        let now = chrono::Utc::now();
        self.phase = phase;
        self.updated_at = now;
        if self.timeline.len() >= TIMELINE_MAX {
            self.timeline.remove(0);
        }
        self.timeline.push(PhaseChange {
            phase,
            at: now,
            reason: reason.into(),
        });
    }

    /// Reads the file a daemon wrote: a regular file (never a FIFO, device or symlink) of
    /// sane size whose budget is one a daemon can have.
    pub fn read(path: &Path) -> anyhow::Result<Self> {
        use crate::fsutil::{read_regular, Symlinks, STATE_FILE_LIMIT};
        use anyhow::Context;
        let bytes = read_regular(path, STATE_FILE_LIMIT, Symlinks::Refuse)
            .with_context(|| format!("reading status {}", path.display()))?;
        let status: Status = serde_json::from_slice(&bytes)
            .with_context(|| format!("parsing status {}", path.display()))?;
        if let Some(b) = &status.budget {
            let max = crate::config::MAX_SHUTDOWN_DELAY;
            if b.budget > max || b.configured > max {
                anyhow::bail!(
                    "parsing status {}: its budget ({} s) is longer than any shutdown.max_delay",
                    path.display(),
                    b.budget.as_secs_f64()
                );
            }
        }
        Ok(status)
    }

    /// Replaces the file by rename, without fsync: it describes this run only (it lives
    /// in /run) and is rewritten on the hot path of a shutdown. Failures are logged.
    pub fn write(&self, path: &Path) {
        let result = serde_json::to_vec_pretty(self)
            .map_err(anyhow::Error::from)
            .and_then(|bytes| replace_unsynced(path, &bytes));
        if let Err(e) = result {
            tracing::warn!(path = %path.display(), error = %crate::cluster::error_text(&e), "cannot write status file");
        }
    }
}

impl Default for Status {
    fn default() -> Self {
        Self::new()
    }
}

fn replace_unsynced(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;

    use anyhow::Context;
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(&tmp)
        .and_then(|mut f| f.write_all(bytes))
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("writing {}", path.display()));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}
