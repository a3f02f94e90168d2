//! systemd-logind: the shutdown delay inhibitor, the `PrepareForShutdown` signal and the
//! delay budget (`InhibitDelayMaxUSec`, raised through a `logind.conf.d` drop-in).

pub(crate) mod budget;

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use anyhow::{Context, Result};
use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;

use crate::shutdown::ShutdownKind;

/// One entry of `ListInhibitors`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InhibitorInfo {
    pub what: String,
    pub who: String,
    pub why: String,
    pub mode: String,
    pub uid: u32,
    pub pid: u32,
}

impl InhibitorInfo {
    /// A shutdown delay lock that the kubelet's Graceful Node Shutdown would hold.
    pub(crate) fn looks_like_kubelet(&self) -> bool {
        if self.mode != "delay" || !self.what.split(':').any(|w| w == "shutdown") {
            return false;
        }
        if self.pid == std::process::id() {
            return false;
        }
        let mentions = |s: &str| s.to_ascii_lowercase().contains("kubelet");
        if mentions(&self.who) || mentions(&self.why) {
            return true;
        }
        std::fs::read_to_string(format!("/proc/{}/comm", self.pid))
            .map(|comm| comm.trim() == "kubelet")
            .unwrap_or(false)
    }
}

/// What logind tells its subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogindEvent {
    /// `PrepareForShutdown(start)`, or `PrepareForShutdownWithMetadata` (logind 255+),
    /// which also says which kind of shutdown it is.
    PrepareForShutdown {
        start: bool,
        kind: Option<ShutdownKind>,
    },
    /// logind lost its bus name; a new inhibitor must be taken once it is back.
    Gone,
}

/// The `type` of `PrepareForShutdownWithMetadata` ("poweroff", "reboot", "kexec", ...), or
/// of `ScheduledShutdown` ("dry-poweroff" and the like are not sent for a real shutdown).
/// logind's manual spells poweroff "power-off"; logind 257 sends "poweroff": both are taken.
pub(crate) fn shutdown_kind_from_type(t: &str) -> ShutdownKind {
    match t {
        "poweroff" | "power-off" => ShutdownKind::Poweroff,
        "reboot" => ShutdownKind::Reboot,
        "halt" => ShutdownKind::Halt,
        "kexec" => ShutdownKind::Kexec,
        "soft-reboot" => ShutdownKind::SoftReboot,
        _ => ShutdownKind::Unknown,
    }
}

/// The kind `PrepareForShutdownWithMetadata` names. None (the daemon then asks logind's
/// `ScheduledShutdown` and systemd's jobs, as before 255) when its `type` is missing or not
/// a string; a type nodegrace does not know is `Unknown`. Both are logged: the drain runs
/// either way, as for a shutdown of unknown kind.
fn kind_from_metadata(
    start: bool,
    metadata: &HashMap<String, zbus::zvariant::OwnedValue>,
) -> Option<ShutdownKind> {
    let Some(value) = metadata.get("type") else {
        if start {
            tracing::warn!(keys = ?metadata.keys().collect::<Vec<_>>(), "PrepareForShutdownWithMetadata without a type: the shutdown's kind is read from logind's ScheduledShutdown or systemd's jobs");
        }
        return None;
    };
    let Ok(text) = String::try_from(value.clone()) else {
        if start {
            tracing::warn!(value = ?value, "PrepareForShutdownWithMetadata with a type that is not a string: the shutdown's kind is read from logind's ScheduledShutdown or systemd's jobs");
        }
        return None;
    };
    let kind = shutdown_kind_from_type(&text);
    if start && kind == ShutdownKind::Unknown {
        tracing::warn!(r#type = %text, "logind named a shutdown type nodegrace does not know: drained as a shutdown of unknown kind");
    }
    Some(kind)
}

/// logind as the daemon uses it. A stream from [`Logind::events`] ends when the bus
/// connection is lost.
#[async_trait]
pub trait Logind: Send + Sync + 'static {
    /// `InhibitDelayMaxUSec`: how long logind honours a delay inhibitor.
    async fn inhibit_delay_max(&self) -> Result<Duration, LogindError>;
    /// `PreparingForShutdown`: a shutdown is in its delay phase right now.
    async fn preparing_for_shutdown(&self) -> Result<bool>;
    async fn list_inhibitors(&self) -> Result<Vec<InhibitorInfo>>;
    /// `Inhibit("shutdown", who, why, "delay")`.
    async fn inhibit_shutdown_delay(&self, who: &str, why: &str) -> Result<InhibitorLock>;
    /// Subscribes to `PrepareForShutdown` and to logind losing its bus name.
    async fn events(&self) -> Result<BoxStream<'static, LogindEvent>>;
    /// The kind of `ScheduledShutdown`, None when nothing is scheduled. logind before 255
    /// sets it for an immediate shutdown too, for as long as the shutdown is delayed (seen
    /// on 252: `systemctl reboot` gives ("reboot", 0)), so it tells which shutdown a
    /// `PrepareForShutdown` without metadata announces.
    async fn scheduled_shutdown(&self) -> Result<Option<ShutdownKind>> {
        Ok(None)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LogindError {
    /// The service answers but is not a logind we can work with: retrying will not help.
    #[error("logind at org.freedesktop.login1 does not provide InhibitDelayMaxUSec ({0}); is it systemd-logind?")]
    MissingProperty(String),
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// A held delay inhibitor. Closing its fd is what releases the lock; [`InhibitorLock::release`]
/// does so deliberately and logs why, dropping it closes it too.
#[derive(Debug)]
pub struct InhibitorLock {
    fd: Option<OwnedFd>,
    taken_at: chrono::DateTime<chrono::Utc>,
}

impl InhibitorLock {
    pub fn new(fd: OwnedFd) -> Self {
        // Never let a child process (e.g. a restarted helper) keep the lock alive.
        let _ = nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        );
        tracing::info!(fd = fd.as_raw_fd(), "shutdown delay inhibitor taken");
        InhibitorLock {
            fd: Some(fd),
            taken_at: chrono::Utc::now(),
        }
    }

    /// An inhibitor fd that systemd kept in the unit's fd store while the previous daemon
    /// process died. It must be the write end of logind's fifo, and logind must still hold
    /// the read end (otherwise the lock is already gone and a new one must be taken).
    pub fn adopt(fd: OwnedFd) -> Result<Self> {
        let stat = nix::sys::stat::fstat(&fd).context("fstat on the stored inhibitor fd")?;
        if stat.st_mode & nix::libc::S_IFMT != nix::libc::S_IFIFO {
            anyhow::bail!(
                "the stored fd {} is not a fifo, so not a logind inhibitor",
                fd.as_raw_fd()
            );
        }
        nix::fcntl::fcntl(
            &fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .context("setting FD_CLOEXEC on the stored inhibitor fd")?;
        let lock = InhibitorLock {
            fd: Some(fd),
            taken_at: chrono::Utc::now(),
        };
        if !lock.is_alive() {
            anyhow::bail!("logind no longer holds the stored inhibitor");
        }
        tracing::info!(
            fd = lock.fd.as_ref().map(|f| f.as_raw_fd()),
            "shutdown delay inhibitor adopted from systemd's fd store"
        );
        Ok(lock)
    }

    pub fn as_fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    /// logind still holds the read end: a fifo whose reader is gone polls POLLERR.
    pub(crate) fn is_alive(&self) -> bool {
        use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
        let Some(fd) = &self.fd else { return false };
        let mut fds = [PollFd::new(fd.as_fd(), PollFlags::POLLOUT)];
        match poll(&mut fds, PollTimeout::ZERO) {
            Ok(_) => !fds[0]
                .revents()
                .is_some_and(|r| r.intersects(PollFlags::POLLERR | PollFlags::POLLNVAL)),
            Err(_) => false,
        }
    }

    pub fn taken_at(&self) -> chrono::DateTime<chrono::Utc> {
        self.taken_at
    }

    /// Closes the fd now: logind lets the shutdown proceed once no delay lock is left.
    pub fn release(mut self, reason: &str) {
        if let Some(fd) = self.fd.take() {
            let raw = fd.as_raw_fd();
            drop(fd);
            tracing::info!(fd = raw, reason, "shutdown delay inhibitor released");
        }
    }
}

impl Drop for InhibitorLock {
    fn drop(&mut self) {
        if let Some(fd) = self.fd.take() {
            let raw = fd.as_raw_fd();
            drop(fd);
            tracing::info!(fd = raw, "shutdown delay inhibitor closed on drop");
        }
    }
}

#[zbus::proxy(
    interface = "org.freedesktop.login1.Manager",
    default_service = "org.freedesktop.login1",
    default_path = "/org/freedesktop/login1",
    gen_blocking = false
)]
pub(crate) trait Login1Manager {
    fn inhibit(
        &self,
        what: &str,
        who: &str,
        why: &str,
        mode: &str,
    ) -> zbus::Result<zbus::zvariant::OwnedFd>;

    fn list_inhibitors(&self) -> zbus::Result<Vec<(String, String, String, String, u32, u32)>>;

    fn reboot(&self, interactive: bool) -> zbus::Result<()>;

    #[zbus(signal)]
    fn prepare_for_shutdown(&self, start: bool) -> zbus::Result<()>;

    #[zbus(signal)]
    fn prepare_for_shutdown_with_metadata(
        &self,
        start: bool,
        metadata: HashMap<String, zbus::zvariant::OwnedValue>,
    ) -> zbus::Result<()>;

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    fn inhibit_delay_max_usec(&self) -> zbus::Result<u64>;

    #[zbus(property)]
    fn preparing_for_shutdown(&self) -> zbus::Result<bool>;

    #[zbus(property)]
    fn scheduled_shutdown(&self) -> zbus::Result<(String, u64)>;
}

/// logind over a zbus connection.
pub(crate) struct ZbusLogind {
    proxy: Login1ManagerProxy<'static>,
}

impl ZbusLogind {
    pub(crate) async fn new(conn: &zbus::Connection) -> Result<Self> {
        let proxy = Login1ManagerProxy::builder(conn)
            .cache_properties(zbus::proxy::CacheProperties::No)
            .build()
            .await
            .context("creating the org.freedesktop.login1 proxy")?;
        Ok(ZbusLogind { proxy })
    }
}

/// Asks logind on the system bus to reboot the node (a reboot wave's turn). The shutdown
/// then goes as any other: `PrepareForShutdown`, the drain, the release of the inhibitor.
pub(crate) async fn ask_reboot() -> Result<()> {
    let conn = zbus::Connection::system()
        .await
        .context("connecting to the system bus to ask logind for a reboot")?;
    let logind = ZbusLogind::new(&conn).await?;
    logind
        .proxy
        .reboot(false)
        .await
        .context("asking logind to reboot")
}

fn is_missing_property(err: &zbus::Error) -> bool {
    match err {
        zbus::Error::FDO(e) => matches!(
            **e,
            zbus::fdo::Error::UnknownProperty(_) | zbus::fdo::Error::InvalidArgs(_)
        ),
        zbus::Error::MethodError(name, _, _) => {
            let n = name.as_str();
            n.ends_with(".UnknownProperty") || n.ends_with(".InvalidArgs")
        }
        _ => false,
    }
}

#[async_trait]
impl Logind for ZbusLogind {
    async fn inhibit_delay_max(&self) -> Result<Duration, LogindError> {
        match self.proxy.inhibit_delay_max_usec().await {
            Ok(usec) => Ok(Duration::from_micros(usec)),
            Err(e) if is_missing_property(&e) => Err(LogindError::MissingProperty(e.to_string())),
            Err(e) => Err(LogindError::Other(
                anyhow::Error::new(e).context("reading logind's InhibitDelayMaxUSec"),
            )),
        }
    }

    async fn preparing_for_shutdown(&self) -> Result<bool> {
        self.proxy
            .preparing_for_shutdown()
            .await
            .context("reading logind's PreparingForShutdown")
    }

    async fn scheduled_shutdown(&self) -> Result<Option<ShutdownKind>> {
        let (kind, _usec) = self
            .proxy
            .scheduled_shutdown()
            .await
            .context("reading logind's ScheduledShutdown")?;
        Ok((!kind.is_empty()).then(|| shutdown_kind_from_type(&kind)))
    }

    async fn list_inhibitors(&self) -> Result<Vec<InhibitorInfo>> {
        let list = self
            .proxy
            .list_inhibitors()
            .await
            .context("calling logind ListInhibitors")?;
        Ok(list
            .into_iter()
            .map(|(what, who, why, mode, uid, pid)| InhibitorInfo {
                what,
                who,
                why,
                mode,
                uid,
                pid,
            })
            .collect())
    }

    async fn inhibit_shutdown_delay(&self, who: &str, why: &str) -> Result<InhibitorLock> {
        let fd = self
            .proxy
            .inhibit("shutdown", who, why, "delay")
            .await
            .context("taking a shutdown delay inhibitor from logind")?;
        Ok(InhibitorLock::new(OwnedFd::from(fd)))
    }

    async fn events(&self) -> Result<BoxStream<'static, LogindEvent>> {
        // One ordered stream for both signals: logind 255+ sends the one with metadata
        // first, and it must be the one that starts the drain.
        let all = self
            .proxy
            .inner()
            .receive_all_signals()
            .await
            .context("subscribing to logind signals")?;
        let owner = self
            .proxy
            .inner()
            .receive_owner_changed()
            .await
            .context("watching the org.freedesktop.login1 name")?;
        let signals = all.filter_map(|msg| async move {
            let member = msg.header().member()?.as_str().to_owned();
            let body = msg.body();
            let parsed = match member.as_str() {
                "PrepareForShutdown" => body.deserialize::<bool>().map(|start| (start, None)),
                "PrepareForShutdownWithMetadata" => body
                    .deserialize::<(bool, HashMap<String, zbus::zvariant::OwnedValue>)>()
                    .map(|(start, metadata)| (start, kind_from_metadata(start, &metadata))),
                _ => return None,
            };
            match parsed {
                Ok((start, kind)) => Some(LogindEvent::PrepareForShutdown { start, kind }),
                Err(e) => {
                    tracing::warn!(signal = %member, error = %e, "ignoring a malformed logind signal");
                    None
                }
            }
        });
        let gone =
            owner.filter_map(|name| async move { name.is_none().then_some(LogindEvent::Gone) });
        // Either stream ending means the connection is gone: end the merged stream too.
        let merged = futures::stream::select(
            signals
                .map(Some)
                .chain(futures::stream::once(async { None })),
            gone.map(Some).chain(futures::stream::once(async { None })),
        )
        .take_while(|e| futures::future::ready(e.is_some()))
        .filter_map(futures::future::ready);
        Ok(merged.boxed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_logind_names_is_a_kind_and_power_off_is_poweroff() {
        for (sent, kind) in [
            ("poweroff", ShutdownKind::Poweroff),
            ("power-off", ShutdownKind::Poweroff),
            ("reboot", ShutdownKind::Reboot),
            ("halt", ShutdownKind::Halt),
            ("kexec", ShutdownKind::Kexec),
            ("soft-reboot", ShutdownKind::SoftReboot),
            ("", ShutdownKind::Unknown),
            ("Poweroff", ShutdownKind::Unknown),
            ("suspend", ShutdownKind::Unknown),
        ] {
            assert_eq!(shutdown_kind_from_type(sent), kind, "{sent:?}");
        }
    }

    #[test]
    fn metadata_without_a_string_type_leaves_the_kind_to_be_asked() {
        let with = |key: &str, value: zbus::zvariant::Value<'static>| {
            HashMap::from([(
                key.to_string(),
                zbus::zvariant::OwnedValue::try_from(value).unwrap(),
            )])
        };
        assert_eq!(kind_from_metadata(true, &HashMap::new()), None);
        assert_eq!(
            kind_from_metadata(true, &with("kind", "reboot".into())),
            None
        );
        assert_eq!(kind_from_metadata(true, &with("type", 7u32.into())), None);
        assert_eq!(
            kind_from_metadata(true, &with("type", "power-off".into())),
            Some(ShutdownKind::Poweroff)
        );
        assert_eq!(
            kind_from_metadata(true, &with("type", "warp".into())),
            Some(ShutdownKind::Unknown)
        );
    }
}
