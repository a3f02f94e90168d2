//! The one state machine: start, steady, draining, fallback, released, cancelled.
//! The Kubernetes drain and the offline fallback plug in behind [`Drainer`].

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

/// Which shutdown logind is preparing, as far as it can be told.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ShutdownKind {
    Poweroff,
    Reboot,
    /// systemd is stopping nodegrace during a shutdown that bypassed logind.
    Bypass,
    Unknown,
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

/// The node's drain, as seen by the state machine. The daemon releases the inhibitor when
/// `drain` returns or when the budget ends, whichever is first; at the budget end the
/// `drain` future is dropped, so implementations must be cancel-safe.
#[async_trait]
pub trait Drainer: Send + Sync + 'static {
    /// Drains the node for `req`; returns once every targeted pod is gone.
    async fn drain(&self, req: &ShutdownRequest) -> anyhow::Result<()>;
    /// The shutdown was cancelled (`PrepareForShutdown(false)`): undo what must be undone.
    async fn cancel(&self, req: &ShutdownRequest) -> anyhow::Result<()>;
    /// The daemon started and no shutdown is in progress: reconcile after a boot.
    async fn after_boot(&self) -> anyhow::Result<()>;
}

/// A drain that does nothing: the node is considered empty at once.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoopDrainer;

#[async_trait]
impl Drainer for NoopDrainer {
    async fn drain(&self, _req: &ShutdownRequest) -> anyhow::Result<()> {
        Ok(())
    }
    async fn cancel(&self, _req: &ShutdownRequest) -> anyhow::Result<()> {
        Ok(())
    }
    async fn after_boot(&self) -> anyhow::Result<()> {
        Ok(())
    }
}

/// `nodegrace run`.
pub fn run_command(_config: &std::path::Path) -> anyhow::Result<std::process::ExitCode> {
    anyhow::bail!("`run` is not implemented yet")
}
