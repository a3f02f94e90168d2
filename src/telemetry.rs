//! Logging: journald with structured fields under systemd, stderr otherwise; filtered by
//! `RUST_LOG` (default [`DEFAULT_FILTER`]).

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Where log records go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogTarget {
    Journald,
    Stderr,
}

/// Journald when systemd connected our output to the journal (`$JOURNAL_STREAM`).
pub(crate) fn preferred_target() -> LogTarget {
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        LogTarget::Journald
    } else {
        LogTarget::Stderr
    }
}

/// nodegrace's own records from `info` up. The kube client and its watcher log every
/// failed connection attempt (dozens a second while the apiserver is away); nodegrace says
/// once when the apiserver becomes unusable, reminds, and says when it is back, so theirs
/// are off unless `RUST_LOG` asks for them.
pub(crate) const DEFAULT_FILTER: &str = "info,kube_client=off,kube_runtime=off";

/// Installs the global subscriber; a second call is a no-op. Returns where logs go.
pub(crate) fn init() -> LogTarget {
    let filter =
        || EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(DEFAULT_FILTER));
    let target = preferred_target();
    if target == LogTarget::Journald {
        match tracing_journald::layer() {
            Ok(layer) => {
                // Unprefixed fields, so `journalctl -u nodegrace MAINTENANCE=shutdown-node-a`
                // works; no field may be named like a journal field (message, priority).
                let layer = layer
                    .with_syslog_identifier("nodegrace".into())
                    .with_field_prefix(None);
                if tracing_subscriber::registry()
                    .with(layer.with_filter(filter()))
                    .try_init()
                    .is_ok()
                {
                    return LogTarget::Journald;
                }
                return target;
            }
            Err(e) => crate::text::print_stderr(&format!(
                "nodegrace: journald unavailable ({e}); logging to stderr"
            )),
        }
    }
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(|| EscapedStderr)
                .with_ansi(false)
                // A closed or full stderr loses the record; reporting that on stderr
                // again would panic.
                .log_internal_errors(false)
                .with_filter(filter()),
        )
        .try_init();
    LogTarget::Stderr
}

/// Stderr for log records: each record is one line, whatever its fields hold (a name
/// someone else chose): control characters, line breaks included, are escaped but the
/// record's own final line break.
struct EscapedStderr;

impl std::io::Write for EscapedStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        let (body, end) = match text.strip_suffix('\n') {
            Some(body) => (body, "\n"),
            None => (&*text, ""),
        };
        let line = format!("{}{end}", crate::text::escape_keeping_tabs(body));
        std::io::stderr().lock().write_all(line.as_bytes())?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().lock().flush()
    }
}

/// What commands other than `run` log: warnings and errors, the daemon's own records (a
/// journal record set aside, a manifest left in place), for the operator at the terminal.
pub(crate) const CLI_FILTER: &str = "warn,kube_client=off,kube_runtime=off";

/// Logging for commands other than `run`: stderr, filtered by `RUST_LOG` (default
/// `CLI_FILTER`), without timestamps. A second call is a no-op.
pub fn init_cli() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(CLI_FILTER));
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(|| EscapedStderr)
                .with_ansi(false)
                .with_target(false)
                .without_time()
                .log_internal_errors(false)
                .with_filter(filter),
        )
        .try_init();
}
