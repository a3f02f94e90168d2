//! Persisted state under the state directory, always written atomically.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::fsutil::write_atomic;
use crate::plan::PodInfo;

pub const POD_CACHE_FILE: &str = "pods.json";

/// Writes `value` as JSON to `state_dir/file`: fsynced and renamed into place, the
/// directory created if needed.
fn store_json<T: Serialize>(state_dir: &Path, file: &str, what: &str, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value).with_context(|| format!("encoding {what}"))?;
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating state directory {}", state_dir.display()))?;
    write_atomic(&state_dir.join(file), &bytes, 0o600)
}

/// Reads `state_dir/file` as JSON; a missing file is None, a corrupt one an error naming
/// `what` and the path.
fn load_json<T: serde::de::DeserializeOwned>(
    state_dir: &Path,
    file: &str,
    what: &str,
) -> Result<Option<T>> {
    let path = state_dir.join(file);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map(Some)
            .with_context(|| format!("parsing {what} {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {what} {}", path.display())),
    }
}

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
        Ok(load_json(state_dir, POD_CACHE_FILE, "pod cache")?.unwrap_or_default())
    }

    pub fn store(&self, state_dir: &Path) -> Result<()> {
        store_json(state_dir, POD_CACHE_FILE, "pod cache", self)
    }
}

pub const SHUTDOWN_STATE_FILE: &str = "state.json";

/// Where a shutdown stands, as persisted for a restarted daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShutdownPhase {
    Draining,
    Released,
    Cancelled,
}

/// The shutdown in progress (or last handled); `state.json` in the state directory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ShutdownState {
    pub phase: ShutdownPhase,
    pub kind: crate::daemon::ShutdownKind,
    /// When the shutdown began; a resumed drain keeps this deadline origin.
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub budget_seconds: f64,
    /// `/proc/sys/kernel/random/boot_id` of the boot being shut down.
    pub boot_id: String,
    pub updated_at: chrono::DateTime<chrono::Utc>,
}

impl ShutdownState {
    /// Reads the state; a missing file is None, a corrupt one an error.
    pub fn load(state_dir: &Path) -> Result<Option<Self>> {
        load_json(state_dir, SHUTDOWN_STATE_FILE, "shutdown state")
    }

    /// Writes, fsyncs and renames into place.
    pub fn store(&self, state_dir: &Path) -> Result<()> {
        store_json(state_dir, SHUTDOWN_STATE_FILE, "shutdown state", self)
    }

    /// Writes and renames into place without waiting for the disk: at once visible to a
    /// restarted daemon, which is all a shutdown in progress needs (after a power loss the
    /// boot id differs and the file is ignored). Call [`ShutdownState::sync`] afterwards.
    pub fn store_unsynced(&self, state_dir: &Path) -> Result<()> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let bytes = serde_json::to_vec_pretty(self).context("encoding shutdown state")?;
        std::fs::create_dir_all(state_dir)
            .with_context(|| format!("creating state directory {}", state_dir.display()))?;
        let path = state_dir.join(SHUTDOWN_STATE_FILE);
        let tmp = state_dir.join(format!(".{SHUTDOWN_STATE_FILE}.tmp-{}", std::process::id()));
        let result = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)
            .and_then(|mut f| f.write_all(&bytes))
            .and_then(|()| std::fs::rename(&tmp, &path))
            .with_context(|| format!("writing {}", path.display()));
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }

    /// Makes a [`ShutdownState::store_unsynced`] durable.
    pub fn sync(state_dir: &Path) -> Result<()> {
        let path = state_dir.join(SHUTDOWN_STATE_FILE);
        std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing {}", path.display()))?;
        crate::fsutil::fsync_dir(state_dir)
    }
}

pub const OFFLINE_DRAIN_FILE: &str = "offline-drain.json";

/// What the offline fallback did in a shutdown, kept until a NodeMaintenance records it
/// (after the reboot when the apiserver stayed unreachable). One report per fallback run:
/// the apiserver may come and go more than once in one shutdown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OfflineDrain {
    /// The boot that was shut down.
    pub boot_id: String,
    pub kind: crate::daemon::ShutdownKind,
    pub reports: Vec<crate::fallback::FallbackReport>,
}

impl OfflineDrain {
    /// Reads the record; a missing file is None, a corrupt one an error.
    pub fn load(state_dir: &Path) -> Result<Option<Self>> {
        load_json(state_dir, OFFLINE_DRAIN_FILE, "offline drain record")
    }

    pub fn store(&self, state_dir: &Path) -> Result<()> {
        store_json(state_dir, OFFLINE_DRAIN_FILE, "offline drain record", self)
    }

    /// Removes the record if it is still the one of `boot_id`.
    pub fn remove_if_boot(state_dir: &Path, boot_id: &str) -> Result<()> {
        match Self::load(state_dir) {
            Ok(Some(r)) if r.boot_id == boot_id => Self::remove(state_dir),
            Ok(_) => Ok(()),
            // Unreadable: leave it to the operator rather than delete what cannot be read.
            Err(e) => Err(e),
        }
    }

    /// Removes the record; a missing one is fine.
    fn remove(state_dir: &Path) -> Result<()> {
        let path = state_dir.join(OFFLINE_DRAIN_FILE);
        match std::fs::remove_file(&path) {
            Ok(()) => crate::fsutil::fsync_dir(state_dir),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing {}", path.display())),
        }
    }
}

/// Where the identity of the running boot comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BootIdSource {
    /// The kernel's boot id, plus the start time of PID 1 (see [`BootIdSource::read`]).
    System,
    /// A file holding the id (tests and the simulator play reboots with it).
    File(PathBuf),
}

impl BootIdSource {
    /// The id of the running boot. For [`BootIdSource::System`]: the kernel's
    /// `/proc/sys/kernel/random/boot_id`, followed by `.` and PID 1's start time (clock ticks
    /// since the kernel booted) when it can be read. A node that is itself a container
    /// (systemd-nspawn, kind) shares its host kernel's boot id; its init is started anew at
    /// every boot, so the pair tells a new boot from a restart of nodegrace everywhere.
    pub fn read(&self) -> Result<String> {
        match self {
            BootIdSource::File(path) => std::fs::read_to_string(path)
                .map(|s| s.trim().to_string())
                .with_context(|| format!("reading {}", path.display())),
            BootIdSource::System => {
                let path = "/proc/sys/kernel/random/boot_id";
                let kernel =
                    std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?;
                let kernel = kernel.trim();
                Ok(match init_start_ticks() {
                    Some(ticks) => format!("{kernel}.{ticks}"),
                    None => kernel.to_string(),
                })
            }
        }
    }
}

/// Field 22 of `/proc/1/stat` (after the parenthesised command name, which may hold spaces).
fn init_start_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/1/stat").ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().nth(19)?.parse().ok()
}

/// This boot's id ([`BootIdSource::System`]); "unknown" where the kernel does not say.
pub fn current_boot_id() -> String {
    BootIdSource::System
        .read()
        .unwrap_or_else(|_| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_boot_id_is_the_kernels_and_stays_the_same_within_a_boot() {
        let kernel = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        let id = BootIdSource::System.read().unwrap();
        let (head, ticks) = id.split_once('.').expect("kernel id and init start");
        assert_eq!(head, kernel.trim());
        assert!(ticks.parse::<u64>().is_ok(), "{id}");
        assert_eq!(BootIdSource::System.read().unwrap(), id);
        assert_eq!(current_boot_id(), id);
    }

    #[test]
    fn shutdown_state_round_trips_and_missing_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(ShutdownState::load(dir.path()).unwrap(), None);
        let s = ShutdownState {
            phase: ShutdownPhase::Draining,
            kind: crate::daemon::ShutdownKind::Reboot,
            started_at: chrono::Utc::now(),
            budget_seconds: 900.0,
            boot_id: current_boot_id(),
            updated_at: chrono::Utc::now(),
        };
        s.store(dir.path()).unwrap();
        assert_eq!(ShutdownState::load(dir.path()).unwrap(), Some(s));
        std::fs::write(dir.path().join(SHUTDOWN_STATE_FILE), b"{").unwrap();
        assert!(ShutdownState::load(dir.path()).is_err());
    }

    #[test]
    fn offline_drain_round_trips_and_removing_twice_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(OfflineDrain::load(dir.path()).unwrap(), None);
        let record = OfflineDrain {
            boot_id: "b1".into(),
            kind: crate::daemon::ShutdownKind::Poweroff,
            reports: vec![crate::fallback::FallbackReport {
                endpoint: "unix:///run/containerd/containerd.sock".into(),
                started_at: Some(chrono::Utc::now()),
                kubelet_stopped: true,
                ..Default::default()
            }],
        };
        record.store(dir.path()).unwrap();
        assert_eq!(OfflineDrain::load(dir.path()).unwrap(), Some(record));
        OfflineDrain::remove_if_boot(dir.path(), "b2").unwrap();
        assert!(
            OfflineDrain::load(dir.path()).unwrap().is_some(),
            "another boot's record stays"
        );
        OfflineDrain::remove_if_boot(dir.path(), "b1").unwrap();
        OfflineDrain::remove(dir.path()).unwrap();
        assert_eq!(OfflineDrain::load(dir.path()).unwrap(), None);
        std::fs::write(dir.path().join(OFFLINE_DRAIN_FILE), b"[").unwrap();
        let err = OfflineDrain::load(dir.path()).unwrap_err();
        assert!(format!("{err:#}").contains(OFFLINE_DRAIN_FILE), "{err:#}");
    }
}
