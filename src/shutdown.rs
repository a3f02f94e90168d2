//! The shutdown a drain serves: what the state machine hands to the drainers, what logind
//! and systemd report, what the state directory keeps.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which shutdown logind is preparing, as far as it can be told: logind 255+ names it in
/// `PrepareForShutdownWithMetadata`; before, its `ScheduledShutdown` or systemd's queued job
/// tells poweroff from reboot only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShutdownKind {
    Poweroff,
    Reboot,
    Halt,
    /// A reboot into a kernel loaded with kexec.
    Kexec,
    /// A userspace-only reboot (systemd 254+): the kernel, and so its boot id, stay.
    SoftReboot,
    /// systemd is stopping nodegrace during a shutdown that bypassed logind.
    Bypass,
    Unknown,
}

impl ShutdownKind {
    /// The name logind and systemd use for it ("soft-reboot", ...).
    pub fn as_str(self) -> &'static str {
        match self {
            ShutdownKind::Poweroff => "poweroff",
            ShutdownKind::Reboot => "reboot",
            ShutdownKind::Halt => "halt",
            ShutdownKind::Kexec => "kexec",
            ShutdownKind::SoftReboot => "soft-reboot",
            ShutdownKind::Bypass => "bypass",
            ShutdownKind::Unknown => "unknown",
        }
    }

    /// The node comes back: a reboot of any kind.
    pub fn is_reboot(self) -> bool {
        matches!(
            self,
            ShutdownKind::Reboot | ShutdownKind::Kexec | ShutdownKind::SoftReboot
        )
    }
}

impl std::fmt::Display for ShutdownKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Everything a drain needs to know about the shutdown it serves.
#[derive(Debug, Clone)]
pub struct ShutdownRequest {
    pub kind: ShutdownKind,
    /// Wall-clock start, persisted so that a restarted daemon keeps the same deadline.
    pub started_at: chrono::DateTime<chrono::Utc>,
    /// Total time from `started_at` until the inhibitor must be released.
    pub budget: Duration,
    /// The daemon restarted mid-shutdown and is resuming a drain already under way.
    pub resumed: bool,
    /// `/proc/sys/kernel/random/boot_id` of the boot being shut down.
    pub boot_id: String,
}

impl ShutdownRequest {
    /// Time left until the budget ends, measured against the wall clock.
    pub fn remaining(&self, now: chrono::DateTime<chrono::Utc>) -> Duration {
        let elapsed = (now - self.started_at).to_std().unwrap_or(Duration::ZERO);
        self.budget.saturating_sub(elapsed)
    }
}
