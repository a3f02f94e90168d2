//! A panic is a bug, and a command that hit one must not report success: not even when the
//! panic was caught at a task boundary (the daemon survives a panicking drain task and
//! releases its inhibitor) and the command went on to finish.

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};

use super::EXIT_FAILURE;

static PANICKED: AtomicBool = AtomicBool::new(false);

/// Remembers every panic of the process, then reports it as the default hook does.
pub fn record_panics() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        PANICKED.store(true, Ordering::SeqCst);
        report(info);
    }));
}

/// The process's exit code for a command's result: an error is printed and exits with
/// [`EXIT_FAILURE`], and so does any command during which a panic was recorded.
pub fn exit_code(program: &str, result: anyhow::Result<ExitCode>) -> ExitCode {
    let code = match result {
        Ok(code) => code,
        Err(err) => {
            crate::cli::print_stderr(&format!("{program}: {}", crate::cluster::error_text(&err)));
            ExitCode::from(EXIT_FAILURE)
        }
    };
    if PANICKED.load(Ordering::SeqCst) {
        crate::cli::print_stderr(&format!(
            "{program}: exiting with an error: it panicked (a bug; the message is above)"
        ));
        return ExitCode::from(EXIT_FAILURE);
    }
    code
}
