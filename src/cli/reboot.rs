//! `nodegrace reboot`: an operator asks for this node's turn in its reboot wave.

use std::process::ExitCode;

use anyhow::{Context as _, Result};

use crate::daemon::wave::ASKED;

/// Leaves (or, with `cancel`, takes away) the ask the daemon reads beside the sentinel. It
/// lives in /run, so the reboot itself clears it.
pub fn reboot_command(cancel: bool) -> Result<ExitCode> {
    if cancel {
        match std::fs::remove_file(ASKED) {
            Ok(()) => super::print_stdout("the ask for a reboot is withdrawn; a slot already taken is seen through to the reboot\n")?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => super::print_stdout("no reboot was asked for\n")?,
            Err(e) => return Err(e).with_context(|| format!("removing {ASKED}")),
        }
        return Ok(ExitCode::SUCCESS);
    }
    std::fs::write(ASKED, b"asked by nodegrace reboot\n").with_context(|| {
        format!("writing {ASKED} (is the nodegrace service running? it owns /run/nodegrace)")
    })?;
    super::print_stdout(
        "asked for a reboot: the node takes its turn in the RebootWave that selects it (kubectl get rebootwaves); \
         without a wave selecting the node, nothing reboots unless reboot.without_wave is true \
         (then one node of the cluster at a time)\n",
    )?;
    Ok(ExitCode::SUCCESS)
}
