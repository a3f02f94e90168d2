//! Fake `org.freedesktop.login1` and `org.freedesktop.systemd1` services for a private bus.
//! Inhibit hands out the write end of a real pipe and watches the read end, so the fake
//! sees the moment the daemon closes its lock, exactly as logind would.

use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::sync::watch;
use zbus::object_server::SignalEmitter;
use zbus::zvariant::OwnedObjectPath;

use super::EventLog;
use nodegrace::parse_inhibit_delay;

const LOGIND_PATH: &str = "/org/freedesktop/login1";
const SYSTEMD_PATH: &str = "/org/freedesktop/systemd1";

#[derive(Debug, Clone)]
pub struct FakeInhibitor {
    pub id: u64,
    pub what: String,
    pub who: String,
    pub why: String,
    pub mode: String,
    pub pid: u32,
    pub taken_at: std::time::Instant,
    pub closed_at: Option<std::time::Instant>,
    pub closed_at_tokio: Option<tokio::time::Instant>,
}

impl FakeInhibitor {
    pub fn held(&self) -> bool {
        self.closed_at.is_none()
    }
}

#[derive(Debug, Clone)]
pub struct FakeState {
    /// `InhibitDelayMaxUSec`; None makes reading the property fail like a non-logind.
    pub delay_max: Option<Duration>,
    /// Where the fake re-reads `InhibitDelayMaxSec` from on SIGHUP (sorted, last wins).
    pub dropin_dir: Option<PathBuf>,
    /// The value when no drop-in sets one.
    pub base_delay: Duration,
    /// logind applies a reload asynchronously; so does the fake, after this long.
    pub reload_lag: Duration,
    pub preparing: bool,
    /// The type of `ScheduledShutdown` ("" for none); logind before 255 sets it for every
    /// delayed shutdown.
    pub scheduled_shutdown: String,
    pub inhibitors: Vec<FakeInhibitor>,
    pub kill_unit_calls: Vec<(String, String, i32)>,
    /// ("stop" | "start", unit)
    pub unit_calls: Vec<(String, String)>,
    pub system_state: String,
    /// Queued jobs as (unit, job type).
    pub jobs: Vec<(String, String)>,
    next_id: u64,
}

impl FakeState {
    pub fn with_delay(delay: Duration) -> Self {
        FakeState {
            delay_max: Some(delay),
            dropin_dir: None,
            base_delay: delay,
            reload_lag: Duration::from_millis(30),
            preparing: false,
            scheduled_shutdown: String::new(),
            inhibitors: Vec::new(),
            kill_unit_calls: Vec::new(),
            unit_calls: Vec::new(),
            system_state: "running".into(),
            jobs: Vec::new(),
            next_id: 1,
        }
    }

    pub fn held(&self) -> Vec<&FakeInhibitor> {
        self.inhibitors.iter().filter(|i| i.held()).collect()
    }

    /// Inhibitors taken by `who` (held or not), in order.
    pub fn taken_by(&self, who: &str) -> Vec<&FakeInhibitor> {
        self.inhibitors.iter().filter(|i| i.who == who).collect()
    }

    /// Re-reads the delay like logind reading logind.conf.d.
    fn reload(&mut self) {
        let Some(dir) = &self.dropin_dir else { return };
        let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        names.retain(|p| p.extension().is_some_and(|e| e == "conf"));
        names.sort_by_key(|p| p.file_name().map(|n| n.to_os_string()));
        let mut delay = self.base_delay;
        for p in names {
            let value = std::fs::read_to_string(&p)
                .ok()
                .and_then(|c| parse_inhibit_delay(&c));
            if let Some(d) = value.as_deref().and_then(parse_systemd_timespan) {
                delay = d;
            }
        }
        self.delay_max = Some(delay);
    }
}

/// "900", "900s", "15min", "1h 30s".
pub fn parse_systemd_timespan(v: &str) -> Option<Duration> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    humantime::parse_duration(v).ok()
}

struct Shared {
    state: Mutex<FakeState>,
    changed: watch::Sender<u64>,
    log: EventLog,
}

impl Shared {
    fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        let r = {
            let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
            f(&mut s)
        };
        self.changed.send_modify(|v| *v += 1);
        r
    }
}

impl Shared {
    /// Records a lock and hands out the write end of a pipe whose closing is watched.
    fn inhibit(
        self: &Arc<Self>,
        what: &str,
        who: &str,
        why: &str,
        mode: &str,
        pid: u32,
    ) -> nix::Result<OwnedFd> {
        let (read_end, write_end) =
            nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK)?;
        let id = self.with(|s| {
            let id = s.next_id;
            s.next_id += 1;
            s.inhibitors.push(FakeInhibitor {
                id,
                what: what.into(),
                who: who.into(),
                why: why.into(),
                mode: mode.into(),
                pid,
                taken_at: std::time::Instant::now(),
                closed_at: None,
                closed_at_tokio: None,
            });
            id
        });
        self.log.push(format!(
            "logind: Inhibit({what}, {who}, {mode}) -> inhibitor {id}"
        ));
        tokio::spawn(watch_close(self.clone(), id, read_end));
        Ok(write_end)
    }
}

/// The fake services; [`Fakes::serve`] puts them on a bus (again after a bus restart).
pub struct Fakes {
    shared: Arc<Shared>,
    conn: Mutex<Option<zbus::Connection>>,
}

impl Fakes {
    pub fn new(state: FakeState, log: EventLog) -> Self {
        Fakes {
            shared: Arc::new(Shared {
                state: Mutex::new(state),
                changed: watch::channel(0).0,
                log,
            }),
            conn: Mutex::new(None),
        }
    }

    pub async fn serve(&self, address: &str) -> Result<()> {
        let conn = zbus::connection::Builder::address(address)?
            .serve_at(
                LOGIND_PATH,
                FakeLogind {
                    shared: self.shared.clone(),
                },
            )?
            .serve_at(
                SYSTEMD_PATH,
                FakeSystemd {
                    shared: self.shared.clone(),
                },
            )?
            .name("org.freedesktop.login1")?
            .name("org.freedesktop.systemd1")?
            .build()
            .await
            .context("putting the fake logind and systemd on the bus")?;
        *self.conn.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn);
        Ok(())
    }

    /// Leaves the bus (the services' state stays).
    pub fn disconnect(&self) {
        self.conn.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    fn connection(&self) -> Result<zbus::Connection> {
        self.conn
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .context("the fakes are not on a bus")
    }

    /// Like logind 255+: `PrepareForShutdownWithMetadata(start, {"type": kind})`, then
    /// `PrepareForShutdown(start)`.
    pub async fn prepare_for_shutdown_typed(
        &self,
        start: bool,
        kind: &str,
    ) -> Result<std::time::Instant> {
        let metadata =
            std::collections::HashMap::from([("type", zbus::zvariant::Value::from(kind))]);
        let at = self.prepare_for_shutdown_metadata(start, metadata).await?;
        self.prepare_for_shutdown(start).await?;
        Ok(at)
    }

    /// Sets `PreparingForShutdown` and emits only `PrepareForShutdownWithMetadata(start,
    /// metadata)`, whatever the metadata holds; returns the moment of emission.
    pub async fn prepare_for_shutdown_metadata(
        &self,
        start: bool,
        metadata: std::collections::HashMap<&str, zbus::zvariant::Value<'_>>,
    ) -> Result<std::time::Instant> {
        let conn = self.connection()?;
        let iface = conn
            .object_server()
            .interface::<_, FakeLogind>(LOGIND_PATH)
            .await?;
        let metadata = metadata
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect();
        self.shared.with(|s| s.preparing = start);
        self.shared
            .log
            .push(format!("logind: PrepareForShutdownWithMetadata({start})"));
        let at = std::time::Instant::now();
        FakeLogind::prepare_for_shutdown_with_metadata(iface.signal_emitter(), start, metadata)
            .await?;
        Ok(at)
    }

    /// Sets `PreparingForShutdown` and emits `PrepareForShutdown(start)`; returns the
    /// moment of emission.
    pub async fn prepare_for_shutdown(&self, start: bool) -> Result<std::time::Instant> {
        self.shared.with(|s| s.preparing = start);
        self.shared
            .log
            .push(format!("logind: PrepareForShutdown({start})"));
        let conn = self.connection()?;
        let iface = conn
            .object_server()
            .interface::<_, FakeLogind>(LOGIND_PATH)
            .await?;
        let at = std::time::Instant::now();
        FakeLogind::prepare_for_shutdown(iface.signal_emitter(), start).await?;
        Ok(at)
    }

    /// `Inhibit` without a bus, for the in-memory logind: the same recorded, watched lock.
    pub fn inhibit(&self, what: &str, who: &str, why: &str, mode: &str) -> Result<OwnedFd> {
        self.shared
            .inhibit(what, who, why, mode, std::process::id())
            .context("creating the inhibitor pipe")
    }

    /// Appends to the shared event log.
    pub fn log(&self, entry: impl Into<String>) {
        self.shared.log.push(entry);
    }

    /// Reads or changes the state (waking [`Fakes::wait_until`]).
    pub fn with<R>(&self, f: impl FnOnce(&mut FakeState) -> R) -> R {
        self.shared.with(f)
    }

    pub fn state(&self) -> FakeState {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Adds a lock held by someone else (e.g. a kubelet), without an fd.
    pub fn add_foreign_inhibitor(&self, who: &str, why: &str, pid: u32) {
        self.shared.with(|s| {
            let id = s.next_id;
            s.next_id += 1;
            s.inhibitors.push(FakeInhibitor {
                id,
                what: "shutdown".into(),
                who: who.into(),
                why: why.into(),
                mode: "delay".into(),
                pid,
                taken_at: std::time::Instant::now(),
                closed_at: None,
                closed_at_tokio: None,
            });
        });
    }

    pub async fn wait_until(&self, mut pred: impl FnMut(&FakeState) -> bool) -> FakeState {
        let mut rx = self.shared.changed.subscribe();
        loop {
            let s = self.state();
            if pred(&s) {
                return s;
            }
            if rx.changed().await.is_err() {
                return s;
            }
        }
    }
}

struct FakeLogind {
    shared: Arc<Shared>,
}

fn failed(e: impl std::fmt::Display) -> zbus::fdo::Error {
    zbus::fdo::Error::Failed(e.to_string())
}

async fn watch_close(shared: Arc<Shared>, id: u64, read_end: OwnedFd) {
    let closed = async {
        let rx = tokio::net::unix::pipe::Receiver::from_owned_fd(read_end)?;
        let mut buf = [0u8; 64];
        loop {
            rx.readable().await?;
            match rx.try_read(&mut buf) {
                Ok(0) => return Ok::<(), std::io::Error>(()),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(e),
            }
        }
    }
    .await;
    let (at, at_tokio) = (std::time::Instant::now(), tokio::time::Instant::now());
    if let Err(e) = closed {
        tracing::warn!(error = %e, "fake logind: watching an inhibitor failed");
    }
    shared.log.push(format!("logind: inhibitor {id} closed"));
    shared.with(|s| {
        if let Some(i) = s.inhibitors.iter_mut().find(|i| i.id == id) {
            i.closed_at = Some(at);
            i.closed_at_tokio = Some(at_tokio);
        }
    });
}

#[zbus::interface(name = "org.freedesktop.login1.Manager")]
impl FakeLogind {
    async fn inhibit(
        &self,
        what: String,
        who: String,
        why: String,
        mode: String,
        #[zbus(header)] header: zbus::message::Header<'_>,
        #[zbus(connection)] conn: &zbus::Connection,
    ) -> zbus::fdo::Result<zbus::zvariant::OwnedFd> {
        let pid = match header.sender() {
            Some(sender) => zbus::fdo::DBusProxy::new(conn)
                .await
                .map_err(failed)?
                .get_connection_unix_process_id(sender.clone().into())
                .await
                .unwrap_or(0),
            None => 0,
        };
        let write_end = self
            .shared
            .inhibit(&what, &who, &why, &mode, pid)
            .map_err(failed)?;
        Ok(write_end.into())
    }

    async fn list_inhibitors(&self) -> Vec<(String, String, String, String, u32, u32)> {
        let s = self.shared.state.lock().unwrap_or_else(|p| p.into_inner());
        s.held()
            .into_iter()
            .map(|i| {
                (
                    i.what.clone(),
                    i.who.clone(),
                    i.why.clone(),
                    i.mode.clone(),
                    0,
                    i.pid,
                )
            })
            .collect()
    }

    #[zbus(property, name = "InhibitDelayMaxUSec")]
    async fn inhibit_delay_max_usec(&self) -> zbus::fdo::Result<u64> {
        let delay = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .delay_max;
        match delay {
            Some(d) => Ok(d.as_micros() as u64),
            None => Err(zbus::fdo::Error::UnknownProperty(
                "no InhibitDelayMaxUSec here".into(),
            )),
        }
    }

    #[zbus(property)]
    async fn preparing_for_shutdown(&self) -> bool {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .preparing
    }

    #[zbus(property)]
    async fn scheduled_shutdown(&self) -> (String, u64) {
        let kind = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .scheduled_shutdown
            .clone();
        let usec = if kind.is_empty() { u64::MAX } else { 0 };
        (kind, usec)
    }

    #[zbus(signal)]
    async fn prepare_for_shutdown(emitter: &SignalEmitter<'_>, start: bool) -> zbus::Result<()>;

    #[zbus(signal)]
    async fn prepare_for_shutdown_with_metadata(
        emitter: &SignalEmitter<'_>,
        start: bool,
        metadata: std::collections::HashMap<String, zbus::zvariant::Value<'_>>,
    ) -> zbus::Result<()>;
}

struct FakeSystemd {
    shared: Arc<Shared>,
}

fn job_path(n: usize) -> zbus::fdo::Result<OwnedObjectPath> {
    OwnedObjectPath::try_from(format!("/org/freedesktop/systemd1/job/{n}")).map_err(failed)
}

#[zbus::interface(name = "org.freedesktop.systemd1.Manager")]
impl FakeSystemd {
    async fn kill_unit(&self, name: String, whom: String, signal: i32) {
        self.shared
            .log
            .push(format!("systemd: KillUnit({name}, {whom}, {signal})"));
        let lag = self.shared.with(|s| {
            s.kill_unit_calls.push((name.clone(), whom, signal));
            s.reload_lag
        });
        if name == "systemd-logind.service" && signal == 1 {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                tokio::time::sleep(lag).await;
                shared.with(FakeState::reload);
                shared.log.push("logind: reloaded logind.conf.d");
            });
        }
    }

    async fn stop_unit(&self, name: String, _mode: String) -> zbus::fdo::Result<OwnedObjectPath> {
        self.shared.log.push(format!("systemd: StopUnit({name})"));
        let n = self.shared.with(|s| {
            s.unit_calls.push(("stop".into(), name));
            s.unit_calls.len()
        });
        job_path(n)
    }

    async fn start_unit(&self, name: String, _mode: String) -> zbus::fdo::Result<OwnedObjectPath> {
        self.shared.log.push(format!("systemd: StartUnit({name})"));
        let n = self.shared.with(|s| {
            s.unit_calls.push(("start".into(), name));
            s.unit_calls.len()
        });
        job_path(n)
    }

    #[allow(clippy::type_complexity)]
    async fn list_jobs(
        &self,
    ) -> zbus::fdo::Result<
        Vec<(
            u32,
            String,
            String,
            String,
            OwnedObjectPath,
            OwnedObjectPath,
        )>,
    > {
        let jobs = self
            .shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .jobs
            .clone();
        jobs.into_iter()
            .enumerate()
            .map(|(n, (unit, kind))| {
                Ok((
                    n as u32 + 1,
                    unit,
                    kind,
                    "waiting".to_string(),
                    job_path(n + 1)?,
                    OwnedObjectPath::try_from("/org/freedesktop/systemd1/unit/x")
                        .map_err(failed)?,
                ))
            })
            .collect()
    }

    #[zbus(property)]
    async fn system_state(&self) -> String {
        self.shared
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .system_state
            .clone()
    }
}
