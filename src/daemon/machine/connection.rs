//! The state machine's side of the bus: connecting (and reconnecting) to logind, noticing
//! the kubelet's own inhibitor, and which shutdown is coming. Taking and letting go of
//! nodegrace's inhibitor stays in `mod.rs`.

use super::*;

impl Machine {
    pub(super) fn start_connecting(&mut self) {
        self.reconnect_at = None;
        let connector = self.connector.clone();
        let cfg = self.settings.shutdown.clone();
        let dirs = self.paths.logind_search_dirs.clone();
        self.connecting = Some(tokio::spawn(async move {
            let bus = connector.connect().await?;
            // Subscribe before reading any state so that no signal falls in between.
            let events = bus.logind.events().await?;
            let budget =
                budget::establish(bus.logind.as_ref(), bus.systemd.as_ref(), &cfg, &dirs).await?;
            Ok(Connected {
                bus,
                events,
                budget,
            })
        }));
    }

    pub(super) fn schedule_reconnect(&mut self) {
        self.reconnect_at = Some(instant_after(self.backoff.next()));
    }

    /// Forgets the connection; the inhibitor fd is kept until a new one replaces it,
    /// because logind may well still honour it.
    pub(super) fn disconnect(&mut self, why: &str) {
        tracing::warn!(reason = why, retry_in = ?self.backoff.peek(), "lost the bus or logind; reconnecting");
        self.events = None;
        self.bus = None;
        self.status.bus_connected = false;
        self.status.last_error = Some(why.to_string());
        self.publish();
        self.schedule_reconnect();
    }

    pub(super) async fn on_connected(
        &mut self,
        r: Result<Result<Connected, LogindError>, JoinError>,
    ) -> Result<()> {
        let c = match r {
            Ok(Ok(c)) => c,
            Ok(Err(LogindError::MissingProperty(detail))) => {
                let e = LogindError::MissingProperty(detail);
                self.status.last_error = Some(e.to_string());
                self.publish();
                return Err(e.into());
            }
            Ok(Err(LogindError::Other(e))) => {
                let msg = format!("cannot use logind: {e:#}");
                tracing::warn!(error = %crate::cluster::error_text(&e), retry_in = ?self.backoff.peek(), "cannot use logind yet; retrying");
                self.status.last_error = Some(msg);
                self.publish();
                self.schedule_reconnect();
                return Ok(());
            }
            Err(e) => {
                self.status.last_error = Some(format!("connecting failed: {e}"));
                self.schedule_reconnect();
                return Ok(());
            }
        };
        self.status.last_error = c.budget.error.clone();
        self.status.budget = Some(c.budget.clone());
        self.status.bus_connected = true;
        self.budget = Some(c.budget);
        self.bus = Some(c.bus.clone());
        self.events = Some(c.events);
        match self.after_connect(&c.bus).await {
            Ok(()) => {
                self.backoff.reset();
                self.publish();
            }
            Err(e) => self.disconnect(&crate::cluster::error_text(&e)),
        }
        Ok(())
    }

    /// Brings the inhibitor and the shutdown in line with what logind says now, which
    /// also catches a shutdown that began or was cancelled while we were disconnected.
    pub(super) async fn after_connect(&mut self, bus: &Bus) -> Result<()> {
        let preparing = bus.logind.preparing_for_shutdown().await?;
        let stored = if self.life.wants_persisted() {
            self.persisted_this_boot()
        } else {
            None
        };
        let persisted = stored.as_ref().map(|p| lifecycle::Persisted {
            kind: p.kind,
            cancelled: p.phase == ShutdownPhase::Cancelled,
        });
        let event = Event::Connected {
            preparing,
            persisted,
        };
        if let (_, Some(e)) = self.dispatch(event, stored.as_ref()).await {
            return Err(e);
        }
        self.check_kubelet_inhibitor(bus).await;
        Ok(())
    }

    pub(super) async fn check_kubelet_inhibitor(&mut self, bus: &Bus) {
        if !self.settings.shutdown.warn_kubelet_inhibitor {
            return;
        }
        let listed = bus.logind.list_inhibitors().await;
        self.note_kubelet_inhibitor(listed);
    }

    pub(super) fn note_kubelet_inhibitor(&mut self, listed: Result<Vec<InhibitorInfo>>) {
        match listed {
            Ok(list) => {
                let found = list.iter().find(|i| i.looks_like_kubelet());
                let seen = found.map(|k| format!("{} ({}), pid {}", k.who, k.why, k.pid));
                if let Some(k) = found.filter(|_| seen != self.status.kubelet_inhibitor) {
                    tracing::warn!(
                        who = %k.who, why = %k.why, pid = k.pid,
                        "the kubelet holds a shutdown delay inhibitor too: its Graceful Node Shutdown \
                         would drain this node alongside nodegrace; set shutdownGracePeriod to 0 in \
                         the kubelet configuration"
                    );
                }
                self.status.kubelet_inhibitor = seen;
            }
            Err(e) => {
                tracing::debug!(error = %crate::cluster::error_text(&e), "cannot list inhibitors")
            }
        }
    }
}

/// Which shutdown logind is preparing, when its signal did not say (logind before 255):
/// logind's `ScheduledShutdown` (set for the whole delay, also for an immediate shutdown),
/// else a shutdown job systemd has queued. systemd's jobs alone cannot tell during the
/// delay: logind starts reboot.target or poweroff.target only once the inhibitors are gone
/// (seen on 252: ListJobs is empty then); they tell for a shutdown that bypassed logind or
/// whose delay is already over.
pub(super) async fn shutdown_kind_now(bus: &Bus) -> ShutdownKind {
    match bus.logind.scheduled_shutdown().await {
        Ok(Some(kind)) if kind != ShutdownKind::Unknown => return kind,
        Ok(_) => {}
        Err(e) => {
            tracing::debug!(error = %crate::cluster::error_text(&e), "cannot read logind's scheduled shutdown")
        }
    }
    systemd::shutdown_kind(bus.systemd.as_ref()).await
}
