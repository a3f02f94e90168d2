//! The shutdown budget: how long logind will actually wait for us. When logind's limit is
//! below `shutdown.max_delay`, a drop-in that sorts after every other one raises it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{Logind, LogindError};
use crate::config::ShutdownSettings;
use crate::fsutil::write_atomic;
use crate::plan::backoff::Backoff;
use crate::systemd::SystemdManager;

pub(crate) const LOGIND_UNIT: &str = "systemd-logind.service";
/// First line of every drop-in nodegrace writes; how it recognises its own files.
pub(crate) const DROPIN_MARKER: &str = "# Managed by nodegrace";
const SIGHUP: i32 = 1;
/// logind applies a reload asynchronously; how long to keep re-reading the property.
const RELOAD_WAIT: Duration = Duration::from_secs(8);

/// Where logind reads drop-ins from, highest priority first.
pub(crate) fn default_search_dirs() -> Vec<PathBuf> {
    ["/etc", "/run", "/usr/local/lib", "/usr/lib"]
        .iter()
        .map(|p| Path::new(p).join("systemd/logind.conf.d"))
        .collect()
}

/// A drop-in that sets `InhibitDelayMaxSec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DelayDropin {
    pub path: PathBuf,
    pub value: String,
    /// Sorts after nodegrace's drop-in, so logind uses its value instead.
    pub overrides_ours: bool,
}

/// The outcome of `establish`, exposed in the status file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BudgetReport {
    #[serde(with = "secs")]
    pub configured: Duration,
    /// logind's limit before nodegrace touched anything.
    #[serde(with = "secs")]
    pub logind_initial: Duration,
    /// logind's limit as last read.
    #[serde(with = "secs")]
    pub logind_effective: Duration,
    /// min(configured, logind_effective): when the inhibitor is released at the latest.
    #[serde(with = "secs")]
    pub budget: Duration,
    pub dropin_written: Option<PathBuf>,
    pub reload_requested: bool,
    pub delay_dropins: Vec<DelayDropin>,
    /// Why the budget could not be raised, if it could not.
    pub error: Option<String>,
}

mod secs {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer, Serializer};

    pub(crate) fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }
    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let v = f64::deserialize(d)?;
        Duration::try_from_secs_f64(v).map_err(serde::de::Error::custom)
    }
}

#[derive(Debug)]
struct DropinFile {
    dir_rank: usize,
    name: String,
    path: PathBuf,
    ours: bool,
    delay: Option<String>,
}

/// The value of `InhibitDelayMaxSec` in a logind.conf-style file, if it sets one.
pub fn parse_inhibit_delay(contents: &str) -> Option<String> {
    let mut in_login = false;
    let mut value = None;
    for line in contents.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.starts_with('[') {
            in_login = line == "[Login]";
            continue;
        }
        if !in_login {
            continue;
        }
        if let Some((key, v)) = line.split_once('=') {
            if key.trim() == "InhibitDelayMaxSec" {
                value = Some(v.trim().to_string());
            }
        }
    }
    value
}

/// Most bytes read from logind's drop-ins together (a node has a few small ones); past it
/// the rest are listed but not read.
const DROPINS_READ_LIMIT: usize = 4 << 20;

fn scan(search_dirs: &[PathBuf], own_dir: &Path) -> Vec<DropinFile> {
    let mut found = Vec::new();
    let mut total = 0;
    let mut skipped: Vec<String> = Vec::new();
    let mut dirs: Vec<&Path> = search_dirs.iter().map(PathBuf::as_path).collect();
    if !dirs.contains(&own_dir) {
        dirs.push(own_dir);
    }
    for (dir_rank, dir) in dirs.iter().enumerate() {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
            if !name.ends_with(".conf") || is_dir {
                continue;
            }
            let path = entry.path();
            // Listed all the same: nodegrace's own drop-in must sort after it.
            if total > DROPINS_READ_LIMIT {
                skipped.push(crate::text::escape(&path.display().to_string()).into_owned());
                found.push(DropinFile {
                    dir_rank,
                    ours: false,
                    delay: None,
                    name,
                    path,
                });
                continue;
            }
            // Never blocks (a FIFO) nor reads without end; a drop-in masked by a symlink to
            // /dev/null reads as empty, as logind sees it.
            let contents = crate::fsutil::read_regular(
                &path,
                crate::fsutil::CONFIG_FILE_LIMIT,
                crate::fsutil::Symlinks::Follow,
            )
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .unwrap_or_default();
            total += contents.len();
            found.push(DropinFile {
                dir_rank,
                ours: *dir == own_dir && contents.starts_with(DROPIN_MARKER),
                delay: parse_inhibit_delay(&contents),
                name,
                path,
            });
        }
    }
    if !skipped.is_empty() {
        tracing::warn!(
            skipped = skipped.len(),
            first = %skipped[0],
            last = %skipped[skipped.len() - 1],
            "logind's drop-ins pass {} MiB together; the rest are not read, so an InhibitDelayMaxSec they set is not seen",
            DROPINS_READ_LIMIT >> 20
        );
    }
    found
}

/// A name that sorts after every drop-in that is not ours.
pub(crate) fn name_sorting_last<'a>(wanted: &str, others: impl Iterator<Item = &'a str>) -> String {
    let mut name = wanted.to_string();
    if let Some(max) = others.max() {
        while name.as_str() <= max {
            name.insert(0, 'z');
        }
    }
    name
}

fn dropin_contents(max_delay: Duration) -> String {
    format!(
        "{DROPIN_MARKER} (shutdown.max_delay); removing it shortens the node's shutdown budget.\n\
         [Login]\n\
         InhibitDelayMaxSec={}s\n",
        max_delay.as_secs().max(1)
    )
}

/// Reads logind's limit, raises it through a drop-in when it is too low and allowed to,
/// and returns the budget. Only an unusable logind is an error; a drop-in that cannot be
/// written leaves the lower budget and says why in [`BudgetReport::error`].
pub(crate) async fn establish(
    logind: &dyn Logind,
    systemd: &dyn SystemdManager,
    cfg: &ShutdownSettings,
    search_dirs: &[PathBuf],
) -> Result<BudgetReport, LogindError> {
    let initial = logind.inhibit_delay_max().await?;
    let mut report = BudgetReport {
        configured: cfg.max_delay,
        logind_initial: initial,
        logind_effective: initial,
        budget: cfg.max_delay.min(initial),
        dropin_written: None,
        reload_requested: false,
        delay_dropins: Vec::new(),
        error: None,
    };
    let own_dir = cfg.logind_dropin_dir.as_path();
    let mut own_name = cfg.logind_dropin_name.clone();

    if initial < cfg.max_delay && cfg.manage_logind_dropin {
        let files = scan(search_dirs, own_dir);
        own_name = name_sorting_last(
            &cfg.logind_dropin_name,
            files.iter().filter(|f| !f.ours).map(|f| f.name.as_str()),
        );
        let path = own_dir.join(&own_name);
        let written = std::fs::create_dir_all(own_dir)
            .map_err(anyhow::Error::from)
            .and_then(|()| write_atomic(&path, dropin_contents(cfg.max_delay).as_bytes(), 0o644));
        match written {
            Err(e) => {
                let msg = format!(
                    "cannot write logind drop-in {}: {e:#}; the shutdown budget stays at logind's {}",
                    path.display(),
                    humantime::format_duration(initial)
                );
                tracing::error!(path = %path.display(), error = %format!("{e:#}"), "{msg}");
                report.error = Some(msg);
            }
            Ok(()) => {
                tracing::info!(path = %path.display(), max_delay = ?cfg.max_delay, "wrote logind drop-in");
                report.dropin_written = Some(path.clone());
                for stale in files.iter().filter(|f| f.ours && f.name != own_name) {
                    match std::fs::remove_file(&stale.path) {
                        Ok(()) => {
                            tracing::info!(path = %stale.path.display(), "removed an older nodegrace drop-in")
                        }
                        Err(e) => {
                            tracing::warn!(path = %stale.path.display(), error = %e, "cannot remove an older nodegrace drop-in")
                        }
                    }
                }
                match systemd.kill_unit(LOGIND_UNIT, "main", SIGHUP).await {
                    Err(e) => {
                        let msg = format!("cannot make logind reload its configuration: {e:#}");
                        tracing::error!("{msg}");
                        report.error = Some(msg);
                    }
                    Ok(()) => {
                        report.reload_requested = true;
                        report.logind_effective =
                            wait_for_reload(logind, cfg.max_delay, initial).await;
                    }
                }
            }
        }
    }

    let own_rank = search_dirs.iter().position(|d| d == own_dir);
    report.delay_dropins = scan(search_dirs, own_dir)
        .into_iter()
        .filter(|f| !f.ours)
        .filter_map(|f| {
            let value = f.delay?;
            let overrides_ours = f.name > own_name
                || (f.name == own_name && own_rank.is_some_and(|r| f.dir_rank < r));
            Some(DelayDropin {
                path: f.path,
                value,
                overrides_ours,
            })
        })
        .collect();
    for d in report.delay_dropins.iter().filter(|d| d.overrides_ours) {
        tracing::warn!(path = %d.path.display(), value = %d.value, "this logind drop-in overrides nodegrace's InhibitDelayMaxSec");
    }

    report.budget = cfg.max_delay.min(report.logind_effective);
    tracing::info!(
        configured = %humantime::format_duration(report.configured),
        logind = %humantime::format_duration(report.logind_effective),
        budget = %humantime::format_duration(report.budget),
        "shutdown budget"
    );
    if report.logind_effective < cfg.max_delay {
        tracing::warn!(
            logind = %humantime::format_duration(report.logind_effective),
            configured = %humantime::format_duration(cfg.max_delay),
            "logind allows less shutdown delay than configured"
        );
    }
    Ok(report)
}

async fn wait_for_reload(logind: &dyn Logind, wanted: Duration, mut last: Duration) -> Duration {
    let mut pauses = Backoff::new(Duration::from_millis(20), Duration::from_secs(1));
    let mut waited = Duration::ZERO;
    while waited < RELOAD_WAIT {
        let pause = pauses.next();
        tokio::time::sleep(pause).await;
        waited += pause;
        match logind.inhibit_delay_max().await {
            Ok(v) => {
                last = v;
                if v >= wanted {
                    return v;
                }
            }
            Err(e) => tracing::debug!(error = %e, "re-reading InhibitDelayMaxUSec"),
        }
    }
    tracing::warn!(
        logind = %humantime::format_duration(last),
        "logind did not take up the drop-in's InhibitDelayMaxSec"
    );
    last
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_last_value_in_the_login_section() {
        let c = "# x\n[Login]\nInhibitDelayMaxSec=30\nKillUserProcesses=no\nInhibitDelayMaxSec = 5min\n[Other]\nInhibitDelayMaxSec=1\n";
        assert_eq!(parse_inhibit_delay(c).as_deref(), Some("5min"));
        assert_eq!(
            parse_inhibit_delay("[Login]\nHandleLidSwitch=ignore\n"),
            None
        );
    }

    #[test]
    fn drop_ins_past_a_few_mib_together_are_listed_but_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut text = String::from("[Login]\nInhibitDelayMaxSec=5\n");
        text.push_str(&"#".repeat(1_000_000));
        for n in 0..8 {
            std::fs::write(dir.path().join(format!("{n}.conf")), &text).unwrap();
        }
        let found = scan(&[dir.path().to_path_buf()], dir.path());
        assert_eq!(found.len(), 8);
        let read = found.iter().filter(|f| f.delay.is_some()).count();
        assert_eq!(read, 5, "{found:?}");
    }

    #[test]
    fn own_name_sorts_after_every_other() {
        assert_eq!(
            name_sorting_last(
                "zz-nodegrace.conf",
                ["50-foo.conf", "zz-nodegrace-logind.conf"].into_iter()
            ),
            "zz-nodegrace.conf"
        );
        let n = name_sorting_last(
            "zz-nodegrace.conf",
            ["zzz-unattended.conf", "a.conf"].into_iter(),
        );
        assert!(n.as_str() > "zzz-unattended.conf", "{n}");
        let n = name_sorting_last("zz-nodegrace.conf", ["zz-nodegrace.conf"].into_iter());
        assert!(n.as_str() > "zz-nodegrace.conf", "{n}");
    }
}
