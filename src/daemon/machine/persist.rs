//! The shutdown's record in the state directory: what an earlier process persisted, how
//! the last shutdown ended, and each phase written as it comes.

use super::*;

impl Machine {
    pub(super) fn persisted_this_boot(&self) -> Option<ShutdownState> {
        match ShutdownState::load_or_set_aside(&self.settings.state_dir) {
            Ok(s) => s.filter(|s| s.boot_id == self.boot_id && !s.soft_rebooted()),
            Err(e) => {
                tracing::error!(error = %crate::cluster::error_text(&e), "ignoring unreadable shutdown state");
                None
            }
        }
    }

    /// How the last shutdown ended, as the state directory kept it (a restart or a boot
    /// does not lose it).
    /// Its duration is counted here when this is the first daemon since it ended, and
    /// recorded as counted first: a failed write counts nothing rather than twice.
    pub(super) fn last_shutdown_recorded(&self) -> Option<LastShutdown> {
        let mut state = ShutdownState::load(&self.settings.state_dir).ok()??;
        let duration_to_count = state.duration_to_count(&self.boot_id).filter(|_| {
            state.duration_counted = true;
            match state.store(&self.settings.state_dir) {
                Ok(()) => true,
                Err(e) => {
                    tracing::error!(error = %crate::cluster::error_text(&e), "the last shutdown's duration is not counted in the metrics: cannot record it as counted");
                    false
                }
            }
        });
        Some(LastShutdown {
            outcome: state.ended(&self.boot_id)?,
            started_at: state.started_at,
            ended_at: state.updated_at,
            kind: state.kind,
            duration_to_count,
        })
    }

    pub(super) fn request_from(&self, p: &ShutdownState, resumed: bool) -> ShutdownRequest {
        ShutdownRequest {
            kind: p.kind,
            started_at: p.started_at,
            budget: p.budget(),
            resumed,
            boot_id: p.boot_id.clone(),
            started_since_boot: p.started_since_boot(),
        }
    }

    /// The shutdown ended with `outcome`: persisted, and the status says so.
    pub(super) fn persist_end(&mut self, phase: ShutdownPhase, outcome: ShutdownOutcome) {
        let Some((started_at, kind)) = self.shutdown.as_ref().map(|r| (r.started_at, r.kind))
        else {
            return;
        };
        if let Some(at) = self.persist_with(phase, Some(outcome), false) {
            self.status.last_shutdown = Some(LastShutdown {
                outcome,
                started_at,
                ended_at: at,
                kind,
                duration_to_count: None,
            });
        }
    }

    /// `fast`: rename into place now and fsync on a blocking thread, so that the drain
    /// starts without waiting for the disk (tens of ms on a busy node). Returns the time
    /// recorded, None without a shutdown.
    pub(super) fn persist_with(
        &mut self,
        phase: ShutdownPhase,
        outcome: Option<ShutdownOutcome>,
        fast: bool,
    ) -> Option<chrono::DateTime<chrono::Utc>> {
        let req = self.shutdown.as_ref()?;
        let state = ShutdownState {
            phase,
            kind: req.kind,
            started_at: req.started_at,
            budget_seconds: req.budget.as_secs_f64(),
            boot_id: req.boot_id.clone(),
            started_since_boot_seconds: req.started_since_boot.map(|d| d.as_secs_f64()),
            updated_at: chrono::Utc::now(),
            outcome,
            duration_counted: false,
        };
        let at = state.updated_at;
        let dir = self.settings.state_dir.clone();
        let stored = if fast {
            state.store_unsynced(&dir).map(|()| {
                tokio::task::spawn_blocking(move || {
                    if let Err(e) = ShutdownState::sync(&dir) {
                        tracing::error!(error = %crate::cluster::error_text(&e), "cannot sync the shutdown state");
                    }
                });
            })
        } else {
            state.store(&dir)
        };
        if let Err(e) = stored {
            let msg = crate::cluster::error_text(&e);
            tracing::error!(error = %msg, "cannot persist the shutdown state");
            self.status.last_error = Some(msg);
        }
        Some(at)
    }
}
