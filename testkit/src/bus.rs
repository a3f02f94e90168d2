//! A private `dbus-daemon` on a socket of the caller's choosing.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::{bail, Context, Result};

pub struct PrivateBus {
    socket: PathBuf,
    address: String,
    child: Option<Child>,
}

impl PrivateBus {
    /// Starts `dbus-daemon --session` listening on `socket`; returns once it accepts.
    pub fn start(socket: &Path) -> Result<Self> {
        let mut bus = PrivateBus {
            socket: socket.to_path_buf(),
            address: format!("unix:path={}", socket.display()),
            child: None,
        };
        bus.spawn()?;
        Ok(bus)
    }

    /// What to connect to (and to put in `DBUS_SYSTEM_BUS_ADDRESS`).
    pub fn address(&self) -> &str {
        &self.address
    }

    fn spawn(&mut self) -> Result<()> {
        let _ = std::fs::remove_file(&self.socket);
        let mut child = Command::new("dbus-daemon")
            .arg("--session")
            .arg(format!("--address={}", self.address))
            .arg("--nofork")
            .arg("--print-address")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting dbus-daemon (is the dbus-daemon binary installed?)")?;
        let stdout = child.stdout.take().context("dbus-daemon stdout")?;
        let mut line = String::new();
        BufReader::new(stdout)
            .read_line(&mut line)
            .context("reading dbus-daemon's address")?;
        if line.trim().is_empty() {
            let _ = child.kill();
            let _ = child.wait();
            bail!("dbus-daemon exited without printing its address");
        }
        self.child = Some(child);
        Ok(())
    }

    /// Kills the bus daemon: every connection on it breaks.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Kills it and starts a new one on the same socket.
    pub fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn()
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_file(&self.socket);
    }
}
