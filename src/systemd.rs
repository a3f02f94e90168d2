//! The systemd manager (units, jobs, system state) over D-Bus, and sd_notify.

use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;

use crate::daemon::ShutdownKind;

/// One queued systemd job (`ListJobs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Job {
    pub id: u32,
    pub unit: String,
    pub job_type: String,
    pub state: String,
}

#[async_trait]
pub trait SystemdManager: Send + Sync + 'static {
    async fn kill_unit(&self, unit: &str, whom: &str, signal: i32) -> Result<()>;
    /// `StopUnit(unit, "replace")`.
    async fn stop_unit(&self, unit: &str) -> Result<()>;
    /// `StartUnit(unit, "replace")`.
    async fn start_unit(&self, unit: &str) -> Result<()>;
    /// `SystemState`: "running", "degraded", "stopping", ...
    async fn system_state(&self) -> Result<String>;
    async fn list_jobs(&self) -> Result<Vec<Job>>;
}

/// The kind of shutdown a queued job starts, if one is queued.
pub fn shutdown_kind_from_jobs(jobs: &[Job]) -> Option<ShutdownKind> {
    let starts = |unit: &str| jobs.iter().any(|j| j.unit == unit && j.job_type == "start");
    if starts("reboot.target") || starts("kexec.target") || starts("soft-reboot.target") {
        Some(ShutdownKind::Reboot)
    } else if starts("poweroff.target") || starts("halt.target") {
        Some(ShutdownKind::Poweroff)
    } else if starts("shutdown.target") {
        Some(ShutdownKind::Unknown)
    } else {
        None
    }
}

/// Best guess of the shutdown under way; Unknown when systemd cannot tell (yet).
pub async fn shutdown_kind(systemd: &dyn SystemdManager) -> ShutdownKind {
    match systemd.list_jobs().await {
        Ok(jobs) => shutdown_kind_from_jobs(&jobs).unwrap_or(ShutdownKind::Unknown),
        Err(e) => {
            tracing::debug!(error = %format!("{e:#}"), "cannot list systemd jobs");
            ShutdownKind::Unknown
        }
    }
}

/// The system is going down: systemd is stopping, or a shutdown job is queued.
pub async fn is_system_stopping(systemd: &dyn SystemdManager) -> Result<bool> {
    if systemd.system_state().await? == "stopping" {
        return Ok(true);
    }
    Ok(shutdown_kind_from_jobs(&systemd.list_jobs().await?).is_some())
}

#[zbus::proxy(
    interface = "org.freedesktop.systemd1.Manager",
    default_service = "org.freedesktop.systemd1",
    default_path = "/org/freedesktop/systemd1",
    gen_blocking = false
)]
pub trait Systemd1Manager {
    fn kill_unit(&self, name: &str, whom: &str, signal: i32) -> zbus::Result<()>;
    fn stop_unit(&self, name: &str, mode: &str) -> zbus::Result<zbus::zvariant::OwnedObjectPath>;
    fn start_unit(&self, name: &str, mode: &str) -> zbus::Result<zbus::zvariant::OwnedObjectPath>;
    #[allow(clippy::type_complexity)]
    fn list_jobs(
        &self,
    ) -> zbus::Result<
        Vec<(
            u32,
            String,
            String,
            String,
            zbus::zvariant::OwnedObjectPath,
            zbus::zvariant::OwnedObjectPath,
        )>,
    >;
    #[zbus(property)]
    fn system_state(&self) -> zbus::Result<String>;
}

pub struct ZbusSystemd {
    proxy: Systemd1ManagerProxy<'static>,
}

impl ZbusSystemd {
    pub async fn new(conn: &zbus::Connection) -> Result<Self> {
        let proxy = Systemd1ManagerProxy::builder(conn)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .context("creating the org.freedesktop.systemd1 proxy")?;
        Ok(ZbusSystemd { proxy })
    }
}

#[async_trait]
impl SystemdManager for ZbusSystemd {
    async fn kill_unit(&self, unit: &str, whom: &str, signal: i32) -> Result<()> {
        self.proxy
            .kill_unit(unit, whom, signal)
            .await
            .with_context(|| format!("systemd KillUnit({unit}, {whom}, {signal})"))
    }
    async fn stop_unit(&self, unit: &str) -> Result<()> {
        self.proxy
            .stop_unit(unit, "replace")
            .await
            .map(drop)
            .with_context(|| format!("systemd StopUnit({unit})"))
    }
    async fn start_unit(&self, unit: &str) -> Result<()> {
        self.proxy
            .start_unit(unit, "replace")
            .await
            .map(drop)
            .with_context(|| format!("systemd StartUnit({unit})"))
    }
    async fn system_state(&self) -> Result<String> {
        self.proxy
            .system_state()
            .await
            .context("reading systemd SystemState")
    }
    async fn list_jobs(&self) -> Result<Vec<Job>> {
        let jobs = self.proxy.list_jobs().await.context("systemd ListJobs")?;
        Ok(jobs
            .into_iter()
            .map(|(id, unit, job_type, state, _, _)| Job {
                id,
                unit,
                job_type,
                state,
            })
            .collect())
    }
}

/// What the daemon tells the service manager.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notify {
    Ready,
    Status(String),
    Watchdog,
    Stopping,
}

pub trait Notifier: Send + Sync + 'static {
    fn notify(&self, msg: Notify);
    /// How often to ping the watchdog; None when systemd does not watch us.
    fn watchdog_interval(&self) -> Option<Duration>;
}

/// sd_notify(3) through `$NOTIFY_SOCKET`; a no-op when not run by systemd.
#[derive(Debug, Default)]
pub struct SdNotifier;

impl Notifier for SdNotifier {
    fn notify(&self, msg: Notify) {
        let state = match &msg {
            Notify::Ready => sd_notify::NotifyState::Ready,
            Notify::Status(s) => sd_notify::NotifyState::Status(s),
            Notify::Watchdog => sd_notify::NotifyState::Watchdog,
            Notify::Stopping => sd_notify::NotifyState::Stopping,
        };
        if let Err(e) = sd_notify::notify(false, &[state]) {
            tracing::warn!(error = %e, message = ?msg, "sd_notify failed");
        }
    }

    fn watchdog_interval(&self) -> Option<Duration> {
        let mut usec = 0;
        // Ping at half the timeout, as sd_watchdog_enabled(3) recommends.
        sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec / 2))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(unit: &str) -> Job {
        Job {
            id: 1,
            unit: unit.into(),
            job_type: "start".into(),
            state: "waiting".into(),
        }
    }

    #[test]
    fn tells_reboot_from_poweroff() {
        assert_eq!(
            shutdown_kind_from_jobs(&[job("reboot.target")]),
            Some(ShutdownKind::Reboot)
        );
        assert_eq!(
            shutdown_kind_from_jobs(&[job("shutdown.target"), job("poweroff.target")]),
            Some(ShutdownKind::Poweroff)
        );
        assert_eq!(shutdown_kind_from_jobs(&[job("nginx.service")]), None);
    }
}

/// Stops and starts the kubelet for the offline fallback over its own system-bus
/// connection, opened on first use: the fallback runs rarely and must not depend on the
/// daemon's logind connection being up.
#[derive(Default)]
pub struct SystemdKubelet {
    systemd: tokio::sync::OnceCell<ZbusSystemd>,
}

impl SystemdKubelet {
    async fn systemd(&self) -> Result<&ZbusSystemd> {
        self.systemd
            .get_or_try_init(|| async {
                let conn = zbus::Connection::system()
                    .await
                    .context("connecting to the system bus to control the kubelet")?;
                ZbusSystemd::new(&conn).await
            })
            .await
    }

    /// Waits until systemd has no job left for `unit` (StopUnit/StartUnit return at once).
    async fn settle(systemd: &ZbusSystemd, unit: &str) -> Result<()> {
        while systemd.list_jobs().await?.iter().any(|j| j.unit == unit) {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

#[async_trait]
impl crate::fallback::KubeletControl for SystemdKubelet {
    async fn stop(&self, unit: &str) -> Result<()> {
        let systemd = self.systemd().await?;
        systemd.stop_unit(unit).await?;
        Self::settle(systemd, unit).await
    }

    async fn start(&self, unit: &str) -> Result<()> {
        let systemd = self.systemd().await?;
        systemd.start_unit(unit).await?;
        Self::settle(systemd, unit).await
    }
}
