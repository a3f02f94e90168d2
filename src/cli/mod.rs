//! Exit codes and the command implementations behind `main`'s argument parsing.
//! Each command lives with the module that owns its subject.

/// Generic failure: the command could not do its job (message on stderr).
pub const EXIT_FAILURE: u8 = 1;
/// The configuration is invalid.
pub const EXIT_CONFIG: u8 = 2;
/// `status`: the daemon is not running (or its status cannot be read).
pub(crate) const EXIT_NOT_RUNNING: u8 = 3;
/// `status`: the daemon runs but holds no shutdown delay inhibitor.
pub(crate) const EXIT_NO_INHIBITOR: u8 = 4;
/// `status`: the shutdown budget is below what the drain plan's reserves need for the
/// node's pods.
pub(crate) const EXIT_BUDGET_SHORT: u8 = 5;

pub use crate::api::crds_command as crds;

mod complete;
mod credentials;
mod history;
mod panics;
mod plan;
mod podlist;
mod reboot;
mod status;
mod timeline;
mod wave_history;

pub use complete::complete_command as complete;
pub use credentials::{approve_command, request_command, RequestOptions};
pub use history::history_command as history;
pub use panics::{exit_code, record_panics};
pub use wave_history::wave_history_command as wave_history;

pub use plan::{parse_budget, plan_command as plan, PlanOptions};
pub use podlist::{parse_pod_list, LabelKeys, ListedPod};
pub use reboot::reboot_command as reboot;
pub use status::status_command as status;

/// `-o` of `plan` and `status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns for people.
    #[default]
    Table,
    /// One JSON object on stdout, stable for scripts.
    Json,
}

/// Loads the configuration the way every command does: an invalid one is reported on stderr
/// and ends the command with [`EXIT_CONFIG`].
pub fn load_settings(
    path: &std::path::Path,
) -> Result<crate::config::Settings, std::process::ExitCode> {
    crate::config::load(path).map_err(|err| {
        crate::cli::print_stderr(&format!("nodegrace: invalid configuration: {err}"));
        std::process::ExitCode::from(EXIT_CONFIG)
    })
}

/// `nodegrace run`: the daemon, with a configuration that is valid and usable under the
/// unit's sandbox (exit [`EXIT_CONFIG`] otherwise: restarting cannot help).
pub fn run(config: &std::path::Path) -> anyhow::Result<std::process::ExitCode> {
    // Still single-threaded: the LISTEN_* variables can be read and removed safely.
    let stored_inhibitor = crate::systemd::take_stored_fd(crate::systemd::INHIBITOR_FDNAME);
    let target = crate::telemetry::init();
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        log = ?target,
        config = %crate::text::escape(&config.display().to_string()),
        "nodegrace starting: reading the configuration"
    );
    let settings = match load_settings_within(config, crate::config::READ_LIMIT) {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    // A directory the sandbox keeps read-only would only fail at the first write, in the
    // middle of a shutdown.
    if let Err(why) = crate::sandbox::check_writable(&settings) {
        crate::cli::print_stderr(&format!(
            "nodegrace: cannot run with this configuration: {why}"
        ));
        return Ok(std::process::ExitCode::from(EXIT_CONFIG));
    }
    crate::daemon::run(settings, config, stored_inhibitor)?;
    Ok(std::process::ExitCode::SUCCESS)
}

/// [`load_settings`] on a thread of its own, abandoned after `limit`: a read stuck on a hung
/// filesystem ends `run` with an error (exit [`EXIT_FAILURE`]: a restart may find the
/// filesystem back) instead of leaving it silent and unprotected.
fn load_settings_within(
    path: &std::path::Path,
    limit: std::time::Duration,
) -> Result<crate::config::Settings, std::process::ExitCode> {
    let (tx, rx) = std::sync::mpsc::channel();
    let owned = path.to_path_buf();
    let spawned = std::thread::Builder::new()
        .name("config-read".into())
        .spawn(move || {
            let _ = tx.send(load_settings(&owned));
        });
    if let Err(e) = spawned {
        crate::cli::print_stderr(&format!(
            "nodegrace: cannot start a thread to read the configuration: {e}"
        ));
        return Err(std::process::ExitCode::from(EXIT_FAILURE));
    }
    rx.recv_timeout(limit).unwrap_or_else(|_| {
        crate::cli::print_stderr(&format!(
            "nodegrace: reading the configuration did not finish in {} s (a file on a hung filesystem?): abandoned, not started",
            limit.as_secs()
        ));
        Err(std::process::ExitCode::from(EXIT_FAILURE))
    })
}

/// `nodegrace check-config`: validate, then print the files read and the effective settings.
pub fn check_config(path: &std::path::Path) -> anyhow::Result<std::process::ExitCode> {
    match crate::config::load_report(path) {
        Ok(loaded) => {
            print_stdout(&crate::config::check_config_report(path, &loaded))?;
            Ok(std::process::ExitCode::SUCCESS)
        }
        Err(err) => {
            crate::cli::print_stderr(&format!("nodegrace: invalid configuration: {err}"));
            Ok(std::process::ExitCode::from(EXIT_CONFIG))
        }
    }
}

/// Left-aligned columns separated by two spaces; the last column is not padded. Every
/// cell is one line: control characters in it (a name someone else chose) are escaped.
pub fn align(rows: &[Vec<String>]) -> Vec<String> {
    let rows: Vec<Vec<std::borrow::Cow<'_, str>>> = rows
        .iter()
        .map(|r| r.iter().map(|c| crate::text::escape(c)).collect())
        .collect();
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    rows.iter()
        .map(|row| {
            let mut line = String::new();
            for (c, cell) in row.iter().enumerate() {
                line.push_str(cell);
                if c + 1 < row.len() {
                    let pad = widths[c] - cell.chars().count() + 2;
                    line.extend(std::iter::repeat_n(' ', pad));
                }
            }
            line.trim_end().to_string()
        })
        .collect()
}

pub fn human(d: std::time::Duration) -> String {
    // Whole milliseconds: the budget split works in them, and nanoseconds are noise here.
    let d = std::time::Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    if d.is_zero() {
        "0s".into()
    } else {
        humantime::format_duration(d).to_string()
    }
}

fn secs(d: std::time::Duration) -> f64 {
    d.as_millis() as f64 / 1000.0
}

/// A kube client for the node's kubeconfig whose connects and reads give up after `timeout`.
async fn kube_client(
    settings: &crate::config::Settings,
    timeout: std::time::Duration,
) -> anyhow::Result<kube::Client> {
    crate::cluster::client::client(settings, timeout, Some(timeout)).await
}

pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    use anyhow::Context;
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")
}

pub(crate) use crate::text::{print_stderr, print_stdout};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_config_exit_codes() {
        let dir = tempfile::tempdir().unwrap();
        let main = dir.path().join("config.toml");
        std::fs::write(&main, "[node]\nname = \"n\"\n").unwrap();
        assert_eq!(
            check_config(&main).unwrap(),
            std::process::ExitCode::SUCCESS
        );
        std::fs::create_dir(dir.path().join("config.d")).unwrap();
        std::fs::write(dir.path().join("config.d/1.toml"), "[node]\nname = 1\n").unwrap();
        assert_eq!(
            check_config(&main).unwrap(),
            std::process::ExitCode::from(EXIT_CONFIG)
        );
    }
}
