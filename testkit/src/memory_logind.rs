//! logind and the systemd manager in memory, for `nodegrace-sim`: no bus at all. The
//! state and the inhibitor pipes are the D-Bus fake's ([`Fakes`]), so closing the lock is
//! observed the same way, and signals are delivered through a channel.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use tokio::sync::broadcast;

use super::{EventLog, FakeState, Fakes};
use nodegrace::{
    Bus, Connector, InhibitorInfo, InhibitorLock, Job, Logind, LogindError, LogindEvent,
    ShutdownKind, SystemdManager,
};

/// One in-memory logind + systemd; clones share it. It is also its own [`Connector`].
#[derive(Clone)]
pub struct MemoryLogind {
    fakes: Arc<Fakes>,
    events: broadcast::Sender<LogindEvent>,
}

impl MemoryLogind {
    /// A logind whose `InhibitDelayMaxUSec` is `delay_max`.
    pub fn new(delay_max: Duration, log: EventLog) -> Self {
        MemoryLogind {
            fakes: Arc::new(Fakes::new(FakeState::with_delay(delay_max), log)),
            events: broadcast::channel(16).0,
        }
    }

    /// The state (inhibitors with the moments they were taken and closed).
    pub fn fakes(&self) -> &Fakes {
        &self.fakes
    }

    /// Sets `PreparingForShutdown` and delivers `PrepareForShutdown(start)` to subscribers.
    pub fn prepare_for_shutdown(&self, start: bool, kind: Option<ShutdownKind>) {
        self.fakes.with(|s| s.preparing = start);
        self.fakes
            .log(format!("logind: PrepareForShutdown({start})"));
        let _ = self
            .events
            .send(LogindEvent::PrepareForShutdown { start, kind });
    }
}

#[async_trait]
impl Connector for MemoryLogind {
    async fn connect(&self) -> Result<Bus> {
        Ok(Bus {
            logind: Arc::new(self.clone()),
            systemd: Arc::new(self.clone()),
        })
    }
}

#[async_trait]
impl Logind for MemoryLogind {
    async fn inhibit_delay_max(&self) -> Result<Duration, LogindError> {
        self.fakes
            .state()
            .delay_max
            .ok_or_else(|| LogindError::MissingProperty("no InhibitDelayMaxUSec here".into()))
    }

    async fn preparing_for_shutdown(&self) -> Result<bool> {
        Ok(self.fakes.state().preparing)
    }

    async fn list_inhibitors(&self) -> Result<Vec<InhibitorInfo>> {
        Ok(self
            .fakes
            .state()
            .held()
            .into_iter()
            .map(|i| InhibitorInfo {
                what: i.what.clone(),
                who: i.who.clone(),
                why: i.why.clone(),
                mode: i.mode.clone(),
                uid: 0,
                pid: i.pid,
            })
            .collect())
    }

    async fn inhibit_shutdown_delay(&self, who: &str, why: &str) -> Result<InhibitorLock> {
        let fd = self.fakes.inhibit("shutdown", who, why, "delay")?;
        Ok(InhibitorLock::new(fd))
    }

    async fn events(&self) -> Result<BoxStream<'static, LogindEvent>> {
        let rx = self.events.subscribe();
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            loop {
                match rx.recv().await {
                    Ok(event) => return Some((event, rx)),
                    Err(broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(broadcast::error::RecvError::Closed) => return None,
                }
            }
        });
        Ok(stream.boxed())
    }
}

#[async_trait]
impl SystemdManager for MemoryLogind {
    async fn kill_unit(&self, unit: &str, whom: &str, signal: i32) -> Result<()> {
        self.fakes
            .with(|s| s.kill_unit_calls.push((unit.into(), whom.into(), signal)));
        Ok(())
    }
    async fn stop_unit(&self, unit: &str) -> Result<()> {
        self.fakes
            .with(|s| s.unit_calls.push(("stop".into(), unit.into())));
        Ok(())
    }
    async fn start_unit(&self, unit: &str) -> Result<()> {
        self.fakes
            .with(|s| s.unit_calls.push(("start".into(), unit.into())));
        Ok(())
    }
    async fn system_state(&self) -> Result<String> {
        Ok(self.fakes.state().system_state)
    }
    async fn list_jobs(&self) -> Result<Vec<Job>> {
        Ok(self
            .fakes
            .state()
            .jobs
            .into_iter()
            .enumerate()
            .map(|(n, (unit, job_type))| Job {
                id: n as u32 + 1,
                unit,
                job_type,
                state: "waiting".into(),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn signals_reach_subscribers_and_closing_the_lock_is_seen() {
        let logind = MemoryLogind::new(Duration::from_secs(90), EventLog::default());
        let bus = logind.connect().await.unwrap();
        assert_eq!(
            bus.logind.inhibit_delay_max().await.unwrap(),
            Duration::from_secs(90)
        );
        let mut events = bus.logind.events().await.unwrap();
        let lock = bus
            .logind
            .inhibit_shutdown_delay("nodegrace", "test")
            .await
            .unwrap();
        assert_eq!(bus.logind.list_inhibitors().await.unwrap().len(), 1);

        logind.prepare_for_shutdown(true, Some(ShutdownKind::Reboot));
        assert_eq!(
            events.next().await,
            Some(LogindEvent::PrepareForShutdown {
                start: true,
                kind: Some(ShutdownKind::Reboot)
            })
        );
        assert!(bus.logind.preparing_for_shutdown().await.unwrap());

        lock.release("test");
        let state = tokio::time::timeout(
            Duration::from_secs(5),
            logind.fakes().wait_until(|s| s.held().is_empty()),
        )
        .await
        .expect("the closed pipe is noticed");
        assert!(state.inhibitors[0].closed_at.is_some());
    }
}
