//! The apiserver's reachability as the engine sees it: which answers say it cannot be used
//! ([`is_unusable`]), what each answer changes (`plan::reachability` decides when that is
//! an outage, when it ends and when a shutdown falls back offline), and the waits that
//! end in [`EngineError::ApiserverUnreachable`].

use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::time::Instant;

use crate::plan::reachability::{self, Answer, Change};

use super::{
    lock, Engine, EngineError, Ready, Replan, Shared, PROBE_INTERVAL, PROBE_TIMEOUT,
    RETRY_IN_SHUTDOWN,
};

/// `d` to whole milliseconds, for messages.
pub(super) fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Whether a kube error says the apiserver cannot be used now ([`reachability::unusable`]
/// decides on what came back).
pub(super) fn is_unusable(err: &kube::Error) -> bool {
    reachability::unusable(match err {
        kube::Error::Api(status) => Answer::Status {
            code: status.code,
            message: &status.message,
        },
        kube::Error::BuildRequest(_) => Answer::NotSent,
        _ => Answer::NothingReadable,
    })
}

pub(super) fn anyhow_is_unusable(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|c| c.downcast_ref::<kube::Error>().is_some_and(is_unusable))
}

/// Whether the apiserver answered (and refused) rather than not being reached.
pub(super) fn is_api_answer(err: &anyhow::Error) -> bool {
    err.chain()
        .any(|c| matches!(c.downcast_ref::<kube::Error>(), Some(kube::Error::Api(_))))
}

impl Engine {
    /// Whether the apiserver answers (the last request or watch event succeeded).
    pub fn reachable(&self) -> bool {
        lock(&self.shared.reach).usable()
    }

    /// Waits until the apiserver answers again and the watches have listed (after
    /// [`EngineError::ApiserverUnreachable`], before [`Engine::resume`]).
    pub async fn wait_reachable(&self) {
        let sh = &self.shared;
        let mut rx = sh.wake.subscribe();
        loop {
            rx.borrow_and_update();
            let ready = {
                let r = lock(&sh.ready);
                r.node && r.pods && r.maintenances
            };
            if ready && lock(&sh.reach).usable() {
                return;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(PROBE_INTERVAL) => sh.probe().await,
            }
        }
    }
}

impl Shared {
    /// A usable answer. The first after an outage of a second or more wakes the watches (no
    /// back-off inherited from the outage) and has a shutdown under way plan the time it lost.
    pub(super) fn mark_reachable(&self) {
        let change = lock(&self.reach).answered(self.now());
        self.metrics.apiserver_answered();
        if let Change::CameBack { lost, said } = change {
            if said {
                tracing::info!(node = %self.node, apiserver = %self.endpoint, after = ?lost, "the apiserver answers again");
            } else {
                tracing::debug!(node = %self.node, apiserver = %self.endpoint, after = ?lost, "the apiserver answers again");
            }
            if reachability::worth_acting_on(lost) {
                self.reconnect.send_modify(|g| *g = g.wrapping_add(1));
                self.replan_shutdown(
                    lost,
                    format!(
                        "the apiserver could not be used for {}",
                        humantime::format_duration(round_ms(lost))
                    ),
                );
            }
            self.bump();
        }
    }

    /// An unusable answer, or none (see [`is_unusable`]).
    pub(super) fn mark_unreachable(&self, error: &dyn std::fmt::Display) {
        let error = error.to_string();
        let change = lock(&self.reach).failed(self.now(), error.clone());
        match change {
            Change::WentAway { for_ } => {
                self.metrics.apiserver_went_away();
                tracing::warn!(node = %self.node, apiserver = %self.endpoint, error = %error, unusable_for = ?for_, "the apiserver cannot be used; retrying");
            }
            Change::StillAway { for_, remind: true } => {
                tracing::warn!(node = %self.node, apiserver = %self.endpoint, error = %error, unusable_for = ?for_, "the apiserver still cannot be used");
            }
            _ => {}
        }
    }

    /// When a shutdown must go to the offline fallback, if the apiserver cannot be used.
    pub(super) fn unreachable_deadline(&self) -> Option<Instant> {
        let timeout = self.settings().fallback.apiserver_timeout;
        lock(&self.reach)
            .fallback_at(timeout)
            .map(|at| self.epoch + at)
    }

    pub(super) fn unusable_error(&self) -> EngineError {
        let reach = lock(&self.reach);
        let last = reach
            .last_error()
            .map_or_else(|| "no answer yet".to_string(), str::to_owned);
        let unusable_for = reach
            .unusable_for(self.now())
            .max(self.settings().fallback.apiserver_timeout);
        EngineError::ApiserverUnreachable(round_ms(unusable_for), last)
    }

    /// Splits what is left of the shutdown's budget again over the pods left, after `lost`
    /// (see [`crate::plan::budget::split_remaining`]). No shutdown under way: nothing to do.
    pub(super) fn replan_shutdown(&self, lost: Duration, cause: String) {
        let mut slot = lock(&self.shutdown);
        let Some(ctx) = slot.as_ref() else {
            return;
        };
        let at = ctx.start.elapsed();
        // Made now, whether split again or kept: either way it is the schedule after the
        // outage, which `schedule_holds` compares with.
        let mut next = (**ctx).clone();
        next.planned_at = self.now();
        match crate::plan::plan_steps(&ctx.plan, &self.pod_infos()) {
            Ok(steps) => {
                let left = ctx.budget.saturating_sub(at);
                tracing::info!(node = %self.node, maintenance = %ctx.name, lost = ?lost, at = ?at, left = ?left, cause = %cause, "time lost: the rest of the shutdown budget is split again over the pods left");
                next.schedule =
                    crate::plan::budget::split_remaining(ctx.budget, at, &steps, &ctx.reserves);
                next.replanned = Some(Replan {
                    at,
                    lost,
                    left,
                    cause,
                });
            }
            Err(err) => {
                tracing::warn!(node = %self.node, maintenance = %ctx.name, error = %err, "cannot plan the shutdown again; keeping its schedule");
            }
        }
        *slot = Some(Arc::new(next));
    }

    /// One cheap request to learn whether the apiserver answers.
    /// A consistent read of the Node (no resourceVersion: served from etcd, not the watch
    /// cache); one that gets no answer in [`PROBE_TIMEOUT`] counts as an unusable answer.
    pub(super) async fn probe(&self) {
        let api: Api<Node> = Api::all(self.client.clone());
        let r = match tokio::time::timeout(PROBE_TIMEOUT, api.get_metadata_opt(&self.node)).await {
            Ok(r) => r.map_err(anyhow::Error::from),
            Err(_) => {
                self.mark_unreachable(&format_args!(
                    "reading the Node {}: no answer in {} s",
                    self.node,
                    PROBE_TIMEOUT.as_secs()
                ));
                return;
            }
        };
        let was_usable = lock(&self.reach).usable();
        self.note(&r);
        if r.is_ok() && !was_usable {
            self.bump();
        }
    }

    pub(super) fn note<T>(&self, r: &Result<T>) {
        match r {
            Ok(_) => self.mark_reachable(),
            Err(e) if anyhow_is_unusable(e) => {
                self.mark_unreachable(&crate::cluster::error_text(e))
            }
            Err(_) => self.mark_reachable(),
        }
    }

    /// After an unusable answer (already noted): waits a moment to try again, or gives up
    /// once the apiserver has not been usable for `fallback.apiserver_timeout`.
    pub(super) async fn retry_or_unreachable(&self, started: Instant) -> Result<(), EngineError> {
        let timeout = self.settings().fallback.apiserver_timeout;
        if started.elapsed() >= timeout || lock(&self.reach).must_fall_back(self.now(), timeout) {
            return Err(self.unusable_error());
        }
        tokio::time::sleep(RETRY_IN_SHUTDOWN).await;
        Ok(())
    }

    /// Waits until the watches named by `which` have listed, or the apiserver has not been
    /// usable for `fallback.apiserver_timeout` (counted from the last good answer, so a
    /// node whose apiserver went away long ago does not wait the whole timeout again).
    pub(super) async fn wait_ready(&self, which: fn(&Ready) -> bool) -> Result<(), EngineError> {
        let mut rx = self.wake.subscribe();
        let started = Instant::now();
        let timeout = self.settings().fallback.apiserver_timeout;
        loop {
            rx.borrow_and_update();
            if which(&lock(&self.ready)) {
                return Ok(());
            }
            let deadline = self
                .unreachable_deadline()
                .map_or(started + timeout, |d| d.min(started + timeout));
            if Instant::now() >= deadline {
                return Err(self.unusable_error());
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() {
                    return Err(anyhow::anyhow!("the engine stopped").into());
                },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn api(code: u16) -> kube::Error {
        kube::Error::Api(Box::new(
            serde_json::from_value(json!({"code": code, "message": "m"})).unwrap(),
        ))
    }

    #[test]
    fn answers_about_the_request_leave_the_apiserver_usable() {
        for code in [400, 404, 409, 410, 422] {
            assert!(!is_unusable(&api(code)), "{code}");
        }
        // What kube-apiserver v1.28 answered to a status apply with a field an older CRD
        // lacks.
        let older_crd = kube::Error::Api(Box::new(
            serde_json::from_value(json!({"code": 500, "message":
                "failed to create typed patch object (/shutdown-n1; nodegrace.dev/v1alpha1, Kind=NodeMaintenance): .status.nodeStatuses[nodeName=\"n1\"].deadlineReplan: field not declared in schema"}))
            .unwrap(),
        ));
        assert!(!is_unusable(&older_crd));
    }

    #[test]
    fn refusals_of_everything_no_answer_and_unreadable_answers_make_it_unusable() {
        // 401/403 while its RBAC caches load, 429 throttling, 5xx while its storage is away.
        for code in [401, 403, 429, 500, 502, 503, 504] {
            assert!(is_unusable(&api(code)), "{code}");
        }
        let refused = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        assert!(is_unusable(&kube::Error::Service(Box::new(refused))));
        // A 200 whose body is a proxy's HTML page, or cut short.
        for body in [
            "<html><body>502 Bad Gateway</body></html>",
            "{\"kind\":\"Node\",\"meta",
        ] {
            let garbage = serde_json::from_str::<Node>(body).unwrap_err();
            assert!(is_unusable(&kube::Error::SerdeError(garbage)), "{body}");
        }
        let through_context = anyhow::Error::from(api(503)).context("patching node n1");
        assert!(anyhow_is_unusable(&through_context));
        assert!(!anyhow_is_unusable(&anyhow::anyhow!(
            "no kube error at all"
        )));
    }
}
