//! Exit codes and the command implementations behind `main`'s argument parsing.
//! Each command lives with the module that owns its subject.

/// Generic failure: the command could not do its job (message on stderr).
pub const EXIT_FAILURE: u8 = 1;
/// The configuration is invalid.
pub const EXIT_CONFIG: u8 = 2;
/// `status`: the daemon is not running (or its status cannot be read).
pub const EXIT_NOT_RUNNING: u8 = 3;
/// `status`: the daemon runs but holds no shutdown delay inhibitor.
pub const EXIT_NO_INHIBITOR: u8 = 4;
/// `status`: the shutdown budget is below what the drain plan's reserves need for the
/// node's pods.
pub const EXIT_BUDGET_SHORT: u8 = 5;

pub use crate::api::crds_command as crds;
pub use crate::config::check_config_command as check_config;
pub use crate::daemon::run_command as run;

mod complete;
mod panics;
mod plan;
mod status;

pub use complete::complete_command as complete;
pub use panics::{exit_code, record_panics};

pub use plan::{parse_pod_list, plan_command as plan, PlanOptions};
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
        eprintln!("nodegrace: invalid configuration: {err}");
        std::process::ExitCode::from(EXIT_CONFIG)
    })
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
pub fn align(rows: &[Vec<String>]) -> Vec<String> {
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
                if c + 1 == row.len() {
                    line.push_str(cell);
                } else {
                    line.push_str(cell);
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

/// Writes a command's output; a closed pipe (`| head`) is not an error worth a panic.
pub fn print_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => r.map_err(Into::into),
    }
}
