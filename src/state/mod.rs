//! Persisted state under the state directory, always written atomically.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use crate::fsutil::{read_regular, set_aside, write_atomic, ReadError, Symlinks, STATE_FILE_LIMIT};
use crate::plan::PodInfo;

pub use crate::plan::lifecycle::ShutdownOutcome;

pub(crate) mod report;

pub(crate) const POD_CACHE_FILE: &str = "pods.json";

/// Writes `value` as JSON to `state_dir/file`: fsynced and renamed into place, the
/// directory created if needed.
fn store_json<T: Serialize>(state_dir: &Path, file: &str, what: &str, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value).with_context(|| format!("encoding {what}"))?;
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating state directory {}", state_dir.display()))?;
    write_atomic(&state_dir.join(file), &bytes, 0o600)
}

/// A file of the state directory checks the values it holds before the daemon uses them.
trait Checked {
    /// Why the values cannot be used, if they cannot.
    fn check(&self) -> std::result::Result<(), String>;
}

/// Why a state file could not be loaded.
#[derive(Debug)]
enum LoadError {
    /// Not a regular file, too large, not the expected JSON, or values out of range: the
    /// file will never be usable as it is.
    Corrupt(anyhow::Error),
    /// Reading failed (permissions, I/O): it may be fine later.
    Unreadable(anyhow::Error),
}

impl LoadError {
    fn into_error(self) -> anyhow::Error {
        match self {
            LoadError::Corrupt(e) | LoadError::Unreadable(e) => e,
        }
    }
}

/// Reads and checks `state_dir/file`; a missing file is None. Never follows a symlink,
/// never blocks on a FIFO, never reads more than [`STATE_FILE_LIMIT`].
fn load_checked<T: serde::de::DeserializeOwned + Checked>(
    state_dir: &Path,
    file: &str,
    what: &str,
) -> std::result::Result<Option<T>, LoadError> {
    let path = state_dir.join(file);
    let bytes = match read_regular(&path, STATE_FILE_LIMIT, Symlinks::Refuse) {
        Ok(b) => b,
        Err(ReadError::NotFound) => return Ok(None),
        Err(e) if e.is_bad_file() => {
            return Err(LoadError::Corrupt(anyhow::anyhow!(
                "{what} {}: {e}",
                path.display()
            )))
        }
        Err(e) => {
            return Err(LoadError::Unreadable(anyhow::anyhow!(
                "reading {what} {}: {e}",
                path.display()
            )))
        }
    };
    let value: T = serde_json::from_slice(&bytes)
        .with_context(|| format!("parsing {what} {}", path.display()))
        .map_err(LoadError::Corrupt)?;
    value
        .check()
        .map_err(|why| LoadError::Corrupt(anyhow::anyhow!("{what} {}: {why}", path.display())))?;
    Ok(Some(value))
}

/// Reads `state_dir/file` as JSON; a missing file is None, a corrupt or unreadable one an
/// error naming `what` and the path. Changes nothing (what `nodegrace status` uses).
fn load_json<T: serde::de::DeserializeOwned + Checked>(
    state_dir: &Path,
    file: &str,
    what: &str,
) -> Result<Option<T>> {
    load_checked(state_dir, file, what).map_err(LoadError::into_error)
}

/// What the daemon uses: like [`load_json`], but a corrupt file is reported in one log line
/// and renamed out of the way (`<file>.corrupt-<time>`, never deleted), and the daemon goes
/// on as if it were missing. An unreadable one is an error: it may be fine later.
fn load_or_set_aside<T: serde::de::DeserializeOwned + Checked>(
    state_dir: &Path,
    file: &str,
    what: &str,
) -> Result<Option<T>> {
    match load_checked(state_dir, file, what) {
        Ok(v) => Ok(v),
        Err(LoadError::Unreadable(e)) => Err(e),
        Err(LoadError::Corrupt(e)) => {
            let path = state_dir.join(file);
            match set_aside(&path) {
                Ok(to) => tracing::error!(
                    file = %path.display(),
                    set_aside_as = %to.display(),
                    error = %format!("{e:#}"),
                    "ignoring a corrupt {what}: renamed it out of the way and going on without it"
                ),
                Err(rename) => tracing::error!(
                    file = %path.display(),
                    error = %format!("{e:#}"),
                    rename_error = %format!("{rename:#}"),
                    "ignoring a corrupt {what}; it could not be renamed out of the way"
                ),
            }
            Ok(None)
        }
    }
}

/// Longest Kubernetes object name or namespace (a DNS subdomain).
const MAX_NAME: usize = 253;
/// Longest free text (an error message) kept per entry.
const MAX_TEXT: usize = 64 * 1024;

/// A [`BootIdSource`] id: the kernel's UUID, with `.` and PID 1's start time when known;
/// "unknown" where it could not be read.
fn check_boot_id(id: &str) -> std::result::Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "bootId {:?} is not a boot id",
            id.chars().take(80).collect::<String>()
        ))
    }
}

fn check_name(what: &str, index: usize, value: &str) -> std::result::Result<(), String> {
    if value.is_empty() || value.len() > MAX_NAME || value.chars().any(char::is_control) {
        return Err(format!(
            "{what} of entry {index} is not a Kubernetes name ({} characters)",
            value.chars().count()
        ));
    }
    Ok(())
}

/// The node's pods as last seen online; the offline fallback's source of priorities.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodCache {
    pub node: String,
    pub written_at: Option<chrono::DateTime<chrono::Utc>>,
    pub pods: Vec<PodInfo>,
}

impl Checked for PodCache {
    fn check(&self) -> std::result::Result<(), String> {
        for (i, p) in self.pods.iter().enumerate() {
            check_name("namespace", i, &p.namespace)?;
            check_name("name", i, &p.name)?;
            if p.termination_grace_period_seconds < 0 {
                return Err(format!(
                    "pod {} has a negative grace period ({} s)",
                    p.key(),
                    p.termination_grace_period_seconds
                ));
            }
        }
        Ok(())
    }
}

impl PodCache {
    /// Reads the cache; a missing file is an empty cache, a corrupt one an error.
    pub fn load(state_dir: &Path) -> Result<Self> {
        Ok(load_json(state_dir, POD_CACHE_FILE, "pod cache")?.unwrap_or_default())
    }

    /// Reads the cache for the daemon: a corrupt one is set aside (see `load_or_set_aside`)
    /// and the cache is empty.
    pub(crate) fn load_or_set_aside(state_dir: &Path) -> Result<Self> {
        Ok(load_or_set_aside(state_dir, POD_CACHE_FILE, "pod cache")?.unwrap_or_default())
    }

    pub fn store(&self, state_dir: &Path) -> Result<()> {
        store_json(state_dir, POD_CACHE_FILE, "pod cache", self)
    }
}

pub(crate) const SHUTDOWN_STATE_FILE: &str = "state.json";

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
    pub kind: crate::shutdown::ShutdownKind,
    /// When the shutdown began; a resumed drain keeps this deadline origin.
    pub started_at: chrono::DateTime<chrono::Utc>,
    pub budget_seconds: f64,
    /// `/proc/sys/kernel/random/boot_id` of the boot being shut down.
    pub boot_id: String,
    /// `CLOCK_BOOTTIME` when it began, seconds: the deadline origin a wall-clock step does not
    /// move (within the boot `boot_id` names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started_since_boot_seconds: Option<f64>,
    pub updated_at: chrono::DateTime<chrono::Utc>,
    /// How it ended, once it has (with `updated_at` then its end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<ShutdownOutcome>,
    /// Its duration is in a daemon's histogram of shutdown durations
    /// ([`ShutdownState::duration_to_count`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub duration_counted: bool,
}

/// How far in the future a persisted shutdown may have started: the clock may have been
/// set back since, but not by more than a day.
const MAX_CLOCK_SKEW: chrono::TimeDelta = chrono::TimeDelta::days(1);

impl Checked for ShutdownState {
    fn check(&self) -> std::result::Result<(), String> {
        let max = crate::config::MAX_SHUTDOWN_DELAY;
        let budget = self.budget_seconds;
        if !budget.is_finite() || !(0.0..=max.as_secs_f64()).contains(&budget) {
            return Err(format!(
                "budgetSeconds {budget} is out of range (0 to {}, the longest shutdown.max_delay)",
                max.as_secs()
            ));
        }
        check_boot_id(&self.boot_id)?;
        if let Some(b) = self.started_since_boot_seconds {
            if !(0.0..=1e12).contains(&b) {
                return Err(format!(
                    "startedSinceBootSeconds {b} is not a time since boot"
                ));
            }
        }
        let latest = chrono::Utc::now() + MAX_CLOCK_SKEW;
        if self.started_at > latest {
            return Err(format!(
                "startedAt {} is more than a day in the future",
                self.started_at.to_rfc3339()
            ));
        }
        let deadline = chrono::TimeDelta::from_std(self.budget())
            .ok()
            .and_then(|b| self.started_at.checked_add_signed(b));
        if deadline.is_none() {
            return Err(format!(
                "startedAt {} plus the budget is not a time",
                self.started_at.to_rfc3339()
            ));
        }
        Ok(())
    }
}

impl ShutdownState {
    /// A soft reboot nodegrace let go: the kernel stayed, so the boot id did, but the
    /// userspace that reads this is a new boot's.
    pub(crate) fn soft_rebooted(&self) -> bool {
        self.kind == crate::shutdown::ShutdownKind::SoftReboot
            && self.phase == ShutdownPhase::Released
    }

    /// How it ended, as seen from the boot `boot_id` (it ended at `updated_at`): its recorded
    /// outcome, or `Interrupted` when an earlier boot went down while it drained. None while
    /// it still runs in this boot.
    pub(crate) fn ended(&self, boot_id: &str) -> Option<ShutdownOutcome> {
        match (self.outcome, self.phase) {
            (Some(o), _) => Some(o),
            (None, ShutdownPhase::Cancelled) => Some(ShutdownOutcome::Cancelled),
            (None, ShutdownPhase::Draining) if self.boot_id != boot_id => {
                Some(ShutdownOutcome::Interrupted)
            }
            (None, _) => None,
        }
    }

    /// From the signal to the release, for the histogram of shutdown durations, when a daemon
    /// started in `boot_id` is to count it: a shutdown that released the inhibitor, counted
    /// once, by the first daemon started after it ended. The daemon that released it goes
    /// down with the node a moment later, before any scrape could show its count.
    pub(crate) fn duration_to_count(&self, boot_id: &str) -> Option<std::time::Duration> {
        if self.duration_counted {
            return None;
        }
        match self.ended(boot_id)? {
            ShutdownOutcome::Drained | ShutdownOutcome::Failed | ShutdownOutcome::BudgetEnded => {
                (self.updated_at - self.started_at).to_std().ok()
            }
            ShutdownOutcome::Cancelled | ShutdownOutcome::Lost | ShutdownOutcome::Interrupted => {
                None
            }
        }
    }

    /// Reads the state; a missing file is None, a corrupt one an error.
    pub fn load(state_dir: &Path) -> Result<Option<Self>> {
        load_json(state_dir, SHUTDOWN_STATE_FILE, "shutdown state")
    }

    /// Reads the state for the daemon: a corrupt one is set aside (see `load_or_set_aside`)
    /// and there is none.
    pub(crate) fn load_or_set_aside(state_dir: &Path) -> Result<Option<Self>> {
        load_or_set_aside(state_dir, SHUTDOWN_STATE_FILE, "shutdown state")
    }

    /// `budget_seconds` as a duration, never longer than any budget the daemon can have.
    pub fn budget(&self) -> std::time::Duration {
        std::time::Duration::try_from_secs_f64(self.budget_seconds)
            .unwrap_or(std::time::Duration::ZERO)
            .min(crate::config::MAX_SHUTDOWN_DELAY)
    }

    /// Its `CLOCK_BOOTTIME` origin, when recorded and a time.
    pub fn started_since_boot(&self) -> Option<std::time::Duration> {
        self.started_since_boot_seconds
            .and_then(|b| std::time::Duration::try_from_secs_f64(b).ok())
    }

    /// Writes, fsyncs and renames into place.
    pub fn store(&self, state_dir: &Path) -> Result<()> {
        store_json(state_dir, SHUTDOWN_STATE_FILE, "shutdown state", self)
    }

    /// Writes and renames into place without waiting for the disk: at once visible to a
    /// restarted daemon, which is all a shutdown in progress needs (after a power loss the
    /// boot id differs and the file is ignored). Call [`ShutdownState::sync`] afterwards.
    pub(crate) fn store_unsynced(&self, state_dir: &Path) -> Result<()> {
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

    /// Makes a `ShutdownState::store_unsynced` durable.
    pub fn sync(state_dir: &Path) -> Result<()> {
        let path = state_dir.join(SHUTDOWN_STATE_FILE);
        std::fs::File::open(&path)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing {}", path.display()))?;
        crate::fsutil::fsync_dir(state_dir)
    }
}

pub(crate) const OFFLINE_DRAIN_FILE: &str = "offline-drain.json";

/// What the offline fallback did in a shutdown, kept until a NodeMaintenance records it
/// (after the reboot when the apiserver stayed unreachable). One report per fallback run:
/// the apiserver may come and go more than once in one shutdown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OfflineDrain {
    /// The boot that was shut down.
    pub boot_id: String,
    pub kind: crate::shutdown::ShutdownKind,
    pub reports: Vec<report::FallbackReport>,
}

/// More fallback runs than one shutdown can have (one per apiserver loss).
const MAX_FALLBACK_RUNS: usize = 1000;

impl Checked for OfflineDrain {
    fn check(&self) -> std::result::Result<(), String> {
        check_boot_id(&self.boot_id)?;
        if self.reports.len() > MAX_FALLBACK_RUNS {
            return Err(format!(
                "{} fallback runs; one shutdown cannot have more than {MAX_FALLBACK_RUNS}",
                self.reports.len()
            ));
        }
        for (i, p) in self.reports.iter().flat_map(|r| &r.pods).enumerate() {
            check_name("namespace", i, &p.namespace)?;
            check_name("name", i, &p.name)?;
            if p.errors.iter().any(|e| e.len() > MAX_TEXT) {
                return Err(format!(
                    "pod entry {i} has an error text over {MAX_TEXT} bytes"
                ));
            }
        }
        Ok(())
    }
}

impl OfflineDrain {
    /// Reads the record; a missing file is None, a corrupt one an error.
    pub fn load(state_dir: &Path) -> Result<Option<Self>> {
        load_json(state_dir, OFFLINE_DRAIN_FILE, "offline drain record")
    }

    /// Reads the record for the daemon: a corrupt one is set aside (see
    /// `load_or_set_aside`) and there is none.
    pub(crate) fn load_or_set_aside(state_dir: &Path) -> Result<Option<Self>> {
        load_or_set_aside(state_dir, OFFLINE_DRAIN_FILE, "offline drain record")
    }

    pub fn store(&self, state_dir: &Path) -> Result<()> {
        store_json(state_dir, OFFLINE_DRAIN_FILE, "offline drain record", self)
    }

    /// Removes the record if it is still the one of `boot_id`. A corrupt one is set aside,
    /// never deleted; an unreadable one is left to the operator.
    pub(crate) fn remove_if_boot(state_dir: &Path, boot_id: &str) -> Result<()> {
        match Self::load_or_set_aside(state_dir)? {
            Some(r) if r.boot_id == boot_id => Self::remove(state_dir),
            _ => Ok(()),
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

/// When this boot began by the wall clock: now less the time since the kernel's boot (`btime`
/// is whole seconds: a reboot just asked must not look older than the ask), plus PID 1's start.
pub(crate) fn booted_at() -> Option<jiff::Timestamp> {
    use nix::time::{clock_gettime, ClockId};
    let ns =
        |id| i128::try_from(std::time::Duration::from(clock_gettime(id).ok()?).as_nanos()).ok();
    let (now, since_boot) = (ns(ClockId::CLOCK_REALTIME)?, ns(ClockId::CLOCK_BOOTTIME)?);
    // SAFETY: sysconf reads a constant of the system and touches no memory of ours.
    let hz = i128::from(unsafe { nix::libc::sysconf(nix::libc::_SC_CLK_TCK) });
    let init = i128::from(init_start_ticks()?) * 1_000_000_000 / hz.max(1);
    jiff::Timestamp::from_nanosecond(now - since_boot + init).ok()
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
        let booted = booted_at().expect("the kernel's boot time and init's start");
        assert!(booted < jiff::Timestamp::now(), "{booted}");
    }

    #[test]
    fn shutdown_state_round_trips_and_missing_is_none() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(ShutdownState::load(dir.path()).unwrap(), None);
        let s = ShutdownState {
            phase: ShutdownPhase::Draining,
            kind: crate::shutdown::ShutdownKind::Reboot,
            started_at: chrono::Utc::now(),
            budget_seconds: 900.0,
            boot_id: current_boot_id(),
            started_since_boot_seconds: Some(12.5),
            updated_at: chrono::Utc::now(),
            outcome: None,
            duration_counted: false,
        };
        s.store(dir.path()).unwrap();
        assert_eq!(ShutdownState::load(dir.path()).unwrap(), Some(s.clone()));
        let ended = ShutdownState {
            phase: ShutdownPhase::Released,
            outcome: Some(ShutdownOutcome::BudgetEnded),
            ..s.clone()
        };
        ended.store(dir.path()).unwrap();
        let stored = std::fs::read_to_string(dir.path().join(SHUTDOWN_STATE_FILE)).unwrap();
        assert!(stored.contains("\"outcome\": \"budget_ended\""), "{stored}");
        assert_eq!(ShutdownState::load(dir.path()).unwrap(), Some(ended));
        std::fs::write(dir.path().join(SHUTDOWN_STATE_FILE), b"{").unwrap();
        assert!(ShutdownState::load(dir.path()).is_err());
    }

    /// A poweroff of boot `boot-1` that began at `at` and was last written 12.5 s later.
    fn poweroff_of_boot_1(
        at: chrono::DateTime<chrono::Utc>,
        phase: ShutdownPhase,
        outcome: Option<ShutdownOutcome>,
    ) -> ShutdownState {
        ShutdownState {
            phase,
            kind: crate::shutdown::ShutdownKind::Poweroff,
            started_at: at,
            budget_seconds: 60.0,
            boot_id: "boot-1".into(),
            started_since_boot_seconds: None,
            updated_at: at + chrono::TimeDelta::milliseconds(12_500),
            outcome,
            duration_counted: false,
        }
    }

    #[test]
    fn a_shutdown_has_ended_once_its_outcome_is_recorded_or_its_boot_went_down_draining() {
        let at = chrono::Utc::now();
        let s = |phase, outcome| poweroff_of_boot_1(at, phase, outcome);
        let drained = s(ShutdownPhase::Released, Some(ShutdownOutcome::Drained));
        assert_eq!(drained.ended("boot-2"), Some(ShutdownOutcome::Drained));
        let draining = s(ShutdownPhase::Draining, None);
        assert_eq!(draining.ended("boot-1"), None, "still running in this boot");
        assert_eq!(draining.ended("boot-2"), Some(ShutdownOutcome::Interrupted));
        assert_eq!(
            s(ShutdownPhase::Cancelled, None).ended("boot-1"),
            Some(ShutdownOutcome::Cancelled)
        );
    }

    #[test]
    fn a_released_shutdowns_duration_is_counted_once_and_only_a_released_ones() {
        let at = chrono::Utc::now();
        let s = |phase, outcome| poweroff_of_boot_1(at, phase, outcome);
        let took = Some(std::time::Duration::from_millis(12_500));
        for released in [
            ShutdownOutcome::Drained,
            ShutdownOutcome::Failed,
            ShutdownOutcome::BudgetEnded,
        ] {
            let ended = s(ShutdownPhase::Released, Some(released));
            assert_eq!(ended.duration_to_count("boot-2"), took, "{released:?}");
            // A daemon restarted in the same boot after the release counts it as well: the
            // one that released it never did.
            assert_eq!(ended.duration_to_count("boot-1"), took, "{released:?}");
            let counted = ShutdownState {
                duration_counted: true,
                ..ended
            };
            assert_eq!(counted.duration_to_count("boot-2"), None, "{released:?}");
        }
        let draining = s(ShutdownPhase::Draining, None);
        assert_eq!(draining.duration_to_count("boot-1"), None, "still draining");
        assert_eq!(draining.duration_to_count("boot-2"), None, "never released");
        let cancelled = s(ShutdownPhase::Cancelled, Some(ShutdownOutcome::Cancelled));
        assert_eq!(cancelled.duration_to_count("boot-1"), None);
        let stored = serde_json::to_string(&cancelled).unwrap();
        assert!(!stored.contains("durationCounted"), "{stored}");
        let counted = ShutdownState {
            duration_counted: true,
            ..cancelled
        };
        let stored = serde_json::to_string(&counted).unwrap();
        assert!(stored.contains("\"durationCounted\":true"), "{stored}");
    }

    #[test]
    fn offline_drain_round_trips_and_removing_twice_is_fine() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(OfflineDrain::load(dir.path()).unwrap(), None);
        let record = OfflineDrain {
            boot_id: "b1".into(),
            kind: crate::shutdown::ShutdownKind::Poweroff,
            reports: vec![report::FallbackReport {
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

/// Arbitrary JSON, and valid files with one value replaced by an arbitrary one, through the
/// loaders the daemon uses: they never panic, and what they accept is safe to do time
/// arithmetic with; what they refuse is set aside, never deleted.
#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>()
                .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
            prop_oneof![
                Just(1e15),
                Just(1e300),
                Just(-1.0),
                Just(86_400.0),
                Just(86_400.5),
                Just(f64::MAX),
                Just(f64::MIN_POSITIVE)
            ]
            .prop_map(Value::from),
            "[ -~]{0,12}".prop_map(Value::from),
            prop_oneof![
                Just("+262142-12-31T23:59:59Z"),
                Just("-262143-01-01T00:00:00Z"),
                Just("9999-12-31T23:59:59Z"),
                Just("1970-01-01T00:00:00Z"),
                Just("draining"),
                Just("reboot"),
            ]
            .prop_map(Value::from),
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map("[a-zA-Z]{1,12}", inner, 0..4)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn valid_state() -> Value {
        json!({
            "phase": "draining",
            "kind": "reboot",
            "startedAt": chrono::Utc::now().to_rfc3339(),
            "budgetSeconds": 900.0,
            "bootId": "0b7b2c1e-8d7a-4a55-9d0e-6f1f7e3c2a11",
            "updatedAt": chrono::Utc::now().to_rfc3339(),
        })
    }

    fn valid_offline() -> Value {
        json!({
            "bootId": "b-1",
            "kind": "poweroff",
            "reports": [{"endpoint": "unix:///run/c.sock", "runtime": null, "startedAt": null,
                "finishedAt": null, "kubeletStopped": true, "bands": [], "errors": [],
                "pods": []}],
        })
    }

    fn valid_cache() -> Value {
        json!({
            "node": "n",
            "writtenAt": null,
            "pods": [{"namespace": "a", "name": "b", "uid": "u", "priority": 5,
                "podType": "Default", "terminationGracePeriodSeconds": 30}],
        })
    }

    /// `doc` with the value at `path` (object keys, array indexes) replaced.
    fn replace(mut doc: Value, path: &[&str], with: Value) -> Value {
        let mut at = &mut doc;
        for step in path {
            at = match step.parse::<usize>() {
                Ok(i) => &mut at[i],
                Err(_) => &mut at[*step],
            };
        }
        *at = with;
        doc
    }

    fn mutated() -> impl Strategy<Value = (&'static str, Value)> {
        let state_paths = prop::sample::select(vec![
            "phase",
            "kind",
            "startedAt",
            "budgetSeconds",
            "bootId",
            "updatedAt",
        ]);
        let cache_paths = prop::sample::select(vec![
            "node",
            "writtenAt",
            "pods",
            "pods.0.name",
            "pods.0.priority",
            "pods.0.terminationGracePeriodSeconds",
            "pods.0.podType",
        ]);
        let offline_paths = prop::sample::select(vec![
            "bootId",
            "kind",
            "reports",
            "reports.0.pods",
            "reports.0.startedAt",
        ]);
        prop_oneof![
            (state_paths, leaf()).prop_map(|(p, v)| (
                SHUTDOWN_STATE_FILE,
                replace(valid_state(), &p.split('.').collect::<Vec<_>>(), v)
            )),
            (cache_paths, leaf()).prop_map(|(p, v)| (
                POD_CACHE_FILE,
                replace(valid_cache(), &p.split('.').collect::<Vec<_>>(), v)
            )),
            (offline_paths, leaf()).prop_map(|(p, v)| (
                OFFLINE_DRAIN_FILE,
                replace(valid_offline(), &p.split('.').collect::<Vec<_>>(), v)
            )),
            (
                prop::sample::select(vec![
                    SHUTDOWN_STATE_FILE,
                    POD_CACHE_FILE,
                    OFFLINE_DRAIN_FILE
                ]),
                value()
            ),
        ]
    }

    /// Loads `file` the daemon's way; Ok(true) when a value was accepted.
    fn load_as_daemon(dir: &Path, file: &str) -> Result<bool> {
        Ok(match file {
            SHUTDOWN_STATE_FILE => match ShutdownState::load_or_set_aside(dir)? {
                Some(s) => {
                    let budget = s.budget();
                    assert!(std::time::Instant::now().checked_add(budget).is_some());
                    let delta = chrono::TimeDelta::from_std(budget).unwrap();
                    assert!(s.started_at.checked_add_signed(delta).is_some());
                    let req_remaining = budget.saturating_sub(
                        (chrono::Utc::now() - s.started_at)
                            .to_std()
                            .unwrap_or_default(),
                    );
                    assert!(req_remaining <= crate::config::MAX_SHUTDOWN_DELAY);
                    true
                }
                None => false,
            },
            POD_CACHE_FILE => {
                let c = PodCache::load_or_set_aside(dir)?;
                for p in &c.pods {
                    let _ = p.grace_period();
                }
                c != PodCache::default()
            }
            _ => OfflineDrain::load_or_set_aside(dir)?.is_some(),
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]
        #[test]
        fn loaders_never_panic_and_set_aside_what_they_refuse((file, doc) in mutated()) {
            let dir = tempfile::tempdir().unwrap();
            let bytes = serde_json::to_vec(&doc).unwrap();
            std::fs::write(dir.path().join(file), &bytes).unwrap();
            let accepted = load_as_daemon(dir.path(), file).unwrap();
            let names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            if accepted {
                prop_assert_eq!(names, vec![file.to_string()]);
            } else if names.len() == 1 && names[0] != file {
                // Set aside, byte for byte.
                prop_assert!(names[0].starts_with(&format!("{file}.corrupt-")), "{:?}", names);
                prop_assert_eq!(std::fs::read(dir.path().join(&names[0])).unwrap(), bytes);
            } else {
                // Accepted as empty (an empty pod cache): left where it is.
                prop_assert_eq!(names, vec![file.to_string()]);
            }
        }
    }

    #[test]
    fn a_budget_past_the_longest_delay_is_refused_and_set_aside() {
        for budget in [1e15, 86_400.5, -1.0, f64::MAX] {
            let dir = tempfile::tempdir().unwrap();
            let doc = replace(valid_state(), &["budgetSeconds"], json!(budget));
            std::fs::write(dir.path().join(SHUTDOWN_STATE_FILE), doc.to_string()).unwrap();
            let err = ShutdownState::load(dir.path()).unwrap_err();
            assert!(format!("{err:#}").contains("budgetSeconds"), "{err:#}");
            assert_eq!(ShutdownState::load_or_set_aside(dir.path()).unwrap(), None);
            assert!(!dir.path().join(SHUTDOWN_STATE_FILE).exists());
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(SHUTDOWN_STATE_FILE),
            valid_state().to_string(),
        )
        .unwrap();
        assert!(ShutdownState::load_or_set_aside(dir.path())
            .unwrap()
            .is_some());
    }

    #[test]
    fn a_fifo_in_the_state_directory_is_set_aside_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join(POD_CACHE_FILE);
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert_eq!(
            PodCache::load_or_set_aside(dir.path()).unwrap(),
            PodCache::default()
        );
        assert!(!p.exists());
    }
}
