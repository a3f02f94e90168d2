//! nodegrace's test kit, a crate of its own so that the packaged binary holds none of it:
//! a fake apiserver, kubelet and CRI runtime, a private `dbus-daemon` with fake logind and
//! systemd manager services on it (or both in memory), a scriptable drainer and a notifier
//! that records what the daemon tells systemd. The tests, the benchmarks and `nodegrace-sim`
//! use it.

pub mod bus;
pub mod drainer;
pub mod fake_apiserver;
pub mod fake_cri;
pub mod fake_kubelet;
pub mod fake_lifecycle;
pub mod fake_logind;
pub mod harness;
pub mod lifecycle_decisions;
pub mod log_buffer;
pub mod memory_logind;

use std::sync::{Arc, Mutex};

pub use bus::PrivateBus;
pub use drainer::{drain_through, DrainMode, ScriptedDrainer};
pub use fake_logind::{FakeInhibitor, FakeState, Fakes};
pub use harness::TestEnv;
pub use log_buffer::LogBuffer;

use nodegrace::{Notifier, Notify};

/// One ordered log that fakes and the recording notifier both append to, so tests can
/// assert the order of things seen from outside ("Inhibit" before "READY=1").
#[derive(Debug, Clone, Default)]
pub struct EventLog(Arc<Mutex<Vec<String>>>);

impl EventLog {
    pub fn push(&self, entry: impl Into<String>) {
        if let Ok(mut v) = self.0.lock() {
            v.push(entry.into());
        }
    }

    pub fn entries(&self) -> Vec<String> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Index of the first entry starting with `prefix`.
    pub fn position(&self, prefix: &str) -> Option<usize> {
        self.entries().iter().position(|e| e.starts_with(prefix))
    }
}

/// A [`Notifier`] that logs `notify: READY=1` etc. instead of talking to systemd.
#[derive(Debug, Clone, Default)]
pub struct RecordingNotifier {
    pub log: EventLog,
}

impl Notifier for RecordingNotifier {
    fn notify(&self, msg: Notify) {
        self.log.push(match msg {
            Notify::Ready => "notify: READY=1".to_string(),
            Notify::Status(s) => format!("notify: STATUS={s}"),
            Notify::Watchdog => "notify: WATCHDOG=1".to_string(),
            Notify::Stopping => "notify: STOPPING=1".to_string(),
        });
    }

    fn watchdog_interval(&self) -> Option<std::time::Duration> {
        None
    }
}

/// Number of open file descriptors of this process.
pub fn open_fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Writes a kubeconfig for `server` (e.g. `http://127.0.0.1:PORT`) to `path`, for tests that
/// run the `nodegrace` binary against a fake or absent apiserver.
pub fn write_kubeconfig(path: &std::path::Path, server: &str) -> std::io::Result<()> {
    let tls = if server.starts_with("https://") {
        "\n    insecure-skip-tls-verify: true"
    } else {
        ""
    };
    std::fs::write(
        path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {server}{tls}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\nusers:\n- name: u\n  user: {{token: t}}\n"
        ),
    )
}
