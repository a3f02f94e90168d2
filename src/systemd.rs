//! The systemd manager (units, jobs, system state) over D-Bus, and sd_notify.

use std::os::fd::{BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;

use crate::shutdown::ShutdownKind;

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
pub(crate) fn shutdown_kind_from_jobs(jobs: &[Job]) -> Option<ShutdownKind> {
    let starts = |unit: &str| jobs.iter().any(|j| j.unit == unit && j.job_type == "start");
    let kinds = [
        ("reboot.target", ShutdownKind::Reboot),
        ("kexec.target", ShutdownKind::Kexec),
        ("soft-reboot.target", ShutdownKind::SoftReboot),
        ("poweroff.target", ShutdownKind::Poweroff),
        ("halt.target", ShutdownKind::Halt),
    ];
    if let Some((_, kind)) = kinds.iter().find(|(unit, _)| starts(unit)) {
        Some(*kind)
    } else if starts("shutdown.target") {
        Some(ShutdownKind::Unknown)
    } else {
        None
    }
}

/// Best guess of the shutdown under way; Unknown when systemd cannot tell (yet).
pub(crate) async fn shutdown_kind(systemd: &dyn SystemdManager) -> ShutdownKind {
    match systemd.list_jobs().await {
        Ok(jobs) => shutdown_kind_from_jobs(&jobs).unwrap_or(ShutdownKind::Unknown),
        Err(e) => {
            tracing::debug!(error = %format!("{e:#}"), "cannot list systemd jobs");
            ShutdownKind::Unknown
        }
    }
}

/// The system is going down: systemd is stopping, or a shutdown job is queued.
pub(crate) async fn is_system_stopping(systemd: &dyn SystemdManager) -> Result<bool> {
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
pub(crate) trait Systemd1Manager {
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

pub(crate) struct ZbusSystemd {
    proxy: Systemd1ManagerProxy<'static>,
}

impl ZbusSystemd {
    pub(crate) async fn new(conn: &zbus::Connection) -> Result<Self> {
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

/// The name under which the logind inhibitor fd is kept in the unit's fd store.
pub const INHIBITOR_FDNAME: &str = "logind-inhibitor";

pub trait Notifier: Send + Sync + 'static {
    fn notify(&self, msg: Notify);
    /// How often to ping the watchdog; None when systemd does not watch us.
    fn watchdog_interval(&self) -> Option<Duration>;
    /// `FDSTORE=1` + `FDNAME=name` with a duplicate of `fd`: systemd keeps it open across
    /// a crash and passes it back on restart (`FileDescriptorStoreMax=` in the unit).
    fn store_fd(&self, _name: &str, _fd: BorrowedFd<'_>) {}
    /// `FDSTOREREMOVE=1` + `FDNAME=name`: systemd closes its copies.
    fn remove_stored_fd(&self, _name: &str) {}
}

/// sd_notify(3) through `$NOTIFY_SOCKET`; a no-op when not run by systemd.
#[derive(Debug, Default)]
pub(crate) struct SdNotifier;

impl Notifier for SdNotifier {
    fn notify(&self, msg: Notify) {
        let state = match &msg {
            Notify::Ready => sd_notify::NotifyState::Ready,
            Notify::Status(s) => sd_notify::NotifyState::Status(s),
            Notify::Watchdog => sd_notify::NotifyState::Watchdog,
            Notify::Stopping => sd_notify::NotifyState::Stopping,
        };
        if let Err(e) = sd_notify::notify(false, &[state]) {
            tracing::warn!(error = %e, notification = ?msg, "sd_notify failed");
        }
    }

    fn store_fd(&self, name: &str, fd: BorrowedFd<'_>) {
        let state = [
            sd_notify::NotifyState::FdStore,
            sd_notify::NotifyState::FdName(name),
        ];
        if let Err(e) = sd_notify::notify_with_fds(false, &state, &[fd]) {
            tracing::warn!(error = %e, name, "cannot keep the fd in systemd's fd store");
        }
    }

    fn remove_stored_fd(&self, name: &str) {
        let state = [
            sd_notify::NotifyState::FdStoreRemove,
            sd_notify::NotifyState::FdName(name),
        ];
        if let Err(e) = sd_notify::notify(false, &state) {
            tracing::warn!(error = %e, name, "cannot remove the fd from systemd's fd store");
        }
    }

    fn watchdog_interval(&self) -> Option<Duration> {
        let mut usec = 0;
        // Ping at half the timeout, as sd_watchdog_enabled(3) recommends.
        sd_notify::watchdog_enabled(false, &mut usec).then(|| Duration::from_micros(usec / 2))
    }
}

/// `SD_LISTEN_FDS_START`: the first fd systemd passes.
pub(crate) const LISTEN_FDS_START: RawFd = 3;

/// `LISTEN_PID`, `LISTEN_FDS` and `LISTEN_FDNAMES` as systemd set them.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListenEnv {
    pub pid: Option<String>,
    pub fds: Option<String>,
    pub names: Option<String>,
}

impl ListenEnv {
    pub(crate) fn from_env() -> Self {
        ListenEnv {
            pid: std::env::var("LISTEN_PID").ok(),
            fds: std::env::var("LISTEN_FDS").ok(),
            names: std::env::var("LISTEN_FDNAMES").ok(),
        }
    }
}

/// Takes the fd named `name` among those systemd passed (numbered from `start`), with
/// FD_CLOEXEC set. Every other passed fd is closed: a stray copy of an inhibitor left open
/// would hold the shutdown back.
pub(crate) fn take_passed_fd(
    env: &ListenEnv,
    my_pid: u32,
    start: RawFd,
    name: &str,
) -> Option<OwnedFd> {
    let pid = env.pid.as_deref()?.trim().parse::<u32>().ok()?;
    if pid != my_pid {
        return None;
    }
    let count = match env.fds.as_deref().map(|s| s.trim().parse::<u16>()) {
        Some(Ok(n)) => RawFd::from(n),
        other => {
            tracing::warn!(value = ?other, "ignoring an invalid LISTEN_FDS");
            return None;
        }
    };
    let names: Vec<&str> = env
        .names
        .as_deref()
        .map(|n| n.split(':').collect())
        .unwrap_or_default();
    if names.len() != count as usize {
        tracing::warn!(
            fds = count,
            names = ?env.names,
            "LISTEN_FDNAMES does not name every passed fd; closing them all"
        );
    }
    let mut found = None;
    for i in 0..count {
        let raw = start + i;
        // SAFETY: only probes whether the number is open; nothing is read or closed here.
        let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
        if nix::fcntl::fcntl(borrowed, nix::fcntl::FcntlArg::F_GETFD).is_err() {
            continue;
        }
        // SAFETY: systemd passed this open fd to this process (LISTEN_PID matched) and
        // nothing else in the process knows about it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let _ = nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
        let this_name = names.get(i as usize).copied();
        if names.len() == count as usize && this_name == Some(name) && found.is_none() {
            found = Some(fd);
        } else {
            tracing::warn!(fd = raw, name = ?this_name, "closing an unexpected fd passed by systemd");
        }
    }
    found
}

/// The fd named `name` that systemd passed back from the unit's fd store, if any; the
/// `LISTEN_*` variables are then removed so that no child mistakes them for its own.
/// Call while the process has a single thread.
pub(crate) fn take_stored_fd(name: &str) -> Option<OwnedFd> {
    let env = ListenEnv::from_env();
    let fd = take_passed_fd(&env, std::process::id(), LISTEN_FDS_START, name);
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(var);
    }
    fd
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsFd, AsRawFd, IntoRawFd};

    fn listen(pid: u32, fds: &str, names: &str) -> ListenEnv {
        ListenEnv {
            pid: Some(pid.to_string()),
            fds: Some(fds.into()),
            names: Some(names.into()),
        }
    }

    fn is_open(raw: RawFd) -> bool {
        nix::fcntl::fcntl(
            unsafe { BorrowedFd::borrow_raw(raw) },
            nix::fcntl::FcntlArg::F_GETFD,
        )
        .is_ok()
    }

    #[test]
    fn adopts_the_named_fd_with_cloexec() {
        let (r, w) = nix::unistd::pipe().unwrap();
        let raw = w.into_raw_fd();
        let me = std::process::id();
        let fd = take_passed_fd(
            &listen(me, "1", INHIBITOR_FDNAME),
            me,
            raw,
            INHIBITOR_FDNAME,
        )
        .expect("adopted");
        assert_eq!(fd.as_raw_fd(), raw);
        let flags = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GETFD).unwrap();
        assert!(
            nix::fcntl::FdFlag::from_bits_truncate(flags).contains(nix::fcntl::FdFlag::FD_CLOEXEC)
        );
        let lock = crate::logind::InhibitorLock::adopt(fd).expect("a live fifo");
        assert!(lock.is_alive());
        drop(r);
        assert!(!lock.is_alive(), "the reader is gone");
    }

    #[test]
    fn ignores_fds_meant_for_another_process() {
        let (_r, w) = nix::unistd::pipe().unwrap();
        let raw = w.as_raw_fd();
        let me = std::process::id();
        assert!(take_passed_fd(
            &listen(me + 1, "1", INHIBITOR_FDNAME),
            me,
            raw,
            INHIBITOR_FDNAME
        )
        .is_none());
        assert!(is_open(raw), "not ours to close");
    }

    #[test]
    fn closes_a_passed_fd_with_another_name() {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let (r, w) = nix::unistd::pipe().unwrap();
        let raw = w.into_raw_fd();
        let me = std::process::id();
        assert!(take_passed_fd(
            &listen(me, "1", "something-else"),
            me,
            raw,
            INHIBITOR_FDNAME
        )
        .is_none());
        // The reader sees a hang-up once its only writer is closed.
        let mut fds = [PollFd::new(r.as_fd(), PollFlags::POLLIN)];
        poll(&mut fds, PollTimeout::ZERO).unwrap();
        assert!(
            fds[0].revents().unwrap().contains(PollFlags::POLLHUP),
            "a stray inhibitor copy would hold the shutdown"
        );
    }

    #[test]
    fn a_stored_fd_that_is_not_a_fifo_is_refused() {
        let f = tempfile::tempfile().unwrap();
        assert!(crate::logind::InhibitorLock::adopt(OwnedFd::from(f)).is_err());
    }

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
pub(crate) struct SystemdKubelet {
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
