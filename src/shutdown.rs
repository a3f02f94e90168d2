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

/// Why a shutdown under way stopped without happening.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelCause {
    /// logind said so: `PrepareForShutdown(false)` (`shutdown -c`, a cancelled reboot).
    Cancelled,
    /// After reconnecting to the bus, logind was no longer preparing a shutdown: it
    /// restarted and a restarted logind does not keep a delayed shutdown. Nobody asked for
    /// this; the operator must ask for the shutdown again.
    Lost,
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
    /// `CLOCK_BOOTTIME` when it began. Time gone is measured on it within the boot, so a step
    /// of the wall clock (NTP while the apiserver was away) moves no deadline; None (a state
    /// file that lacks it, a clock that cannot be read) measures on the wall clock.
    pub started_since_boot: Option<Duration>,
}

impl ShutdownRequest {
    /// Time gone since it began: on the boot clock where both ends can be read on it, else
    /// on the wall clock (`now`).
    pub fn elapsed(&self, now: chrono::DateTime<chrono::Utc>) -> Duration {
        match (self.started_since_boot, since_boot()) {
            (Some(start), Some(at)) => at.saturating_sub(start),
            _ => (now - self.started_at).to_std().unwrap_or(Duration::ZERO),
        }
    }

    /// Time left until the budget ends.
    pub fn remaining(&self, now: chrono::DateTime<chrono::Utc>) -> Duration {
        self.budget.saturating_sub(self.elapsed(now))
    }
}

/// `CLOCK_BOOTTIME`: time since this boot began, suspend included, never stepped.
pub(crate) fn since_boot() -> Option<Duration> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME).ok()?;
    Some(Duration::new(
        u64::try_from(t.tv_sec()).ok()?,
        u32::try_from(t.tv_nsec()).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 33: the node's wall clock stepped an hour while the drain waited for the
    /// apiserver; two seconds have gone, not an hour and two seconds.
    #[test]
    fn time_gone_is_measured_on_the_boot_clock_not_the_stepped_wall_clock() {
        let Some(boot) = since_boot() else {
            panic!("CLOCK_BOOTTIME cannot be read");
        };
        let now = chrono::Utc::now();
        let req = ShutdownRequest {
            kind: ShutdownKind::Poweroff,
            started_at: now - chrono::TimeDelta::hours(1),
            budget: Duration::from_secs(90),
            resumed: false,
            boot_id: "b".into(),
            started_since_boot: boot.checked_sub(Duration::from_secs(2)),
        };
        let elapsed = req.elapsed(now);
        assert!(
            elapsed >= Duration::from_secs(2) && elapsed < Duration::from_secs(5),
            "{elapsed:?}"
        );
        assert!(req.remaining(now) > Duration::from_secs(85));
        let wall_only = ShutdownRequest {
            started_since_boot: None,
            ..req
        };
        assert_eq!(wall_only.remaining(now), Duration::ZERO);
    }
}
