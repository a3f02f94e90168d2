//! The apiserver's reachability as the engine sees it: what each answer the gateway
//! (`cluster::gateway`, which alone tells it) read changes (`plan::reachability` decides
//! when that is an outage, when it ends and when a shutdown falls back offline), and the
//! waits that end in [`EngineError::ApiserverUnreachable`].

use std::time::Duration;

use anyhow::Result;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use tokio::time::Instant;

use crate::cluster::gateway::{self, Reach};
use crate::plan::reachability::{self, Change};

use super::{
    lock, Engine, EngineError, Ready, Replan, Shared, ShutdownCtx, ToLoop, PROBE_INTERVAL,
    PROBE_TIMEOUT, RETRY_IN_SHUTDOWN,
};

/// `d` to whole milliseconds, for messages.
pub(super) fn round_ms(d: Duration) -> Duration {
    Duration::from_millis(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
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
        let mut ready = sh.ready.subscribe();
        loop {
            rx.borrow_and_update();
            if ready.borrow_and_update().all() && lock(&sh.reach).usable() {
                return;
            }
            tokio::select! {
                r = rx.changed() => if r.is_err() { return },
                r = ready.changed() => if r.is_err() { return },
                _ = tokio::time::sleep(PROBE_INTERVAL) => sh.probe().await,
            }
        }
    }
}

impl Reach for Shared {
    /// A usable answer. The first after an outage of a second or more wakes the watches (no
    /// back-off inherited from the outage) and has a shutdown under way plan the time it lost.
    fn usable_answer(&self) {
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
                self.tell_loop(ToLoop::Replan {
                    lost,
                    cause: format!(
                        "the apiserver could not be used for {}",
                        humantime::format_duration(round_ms(lost))
                    ),
                });
            }
            self.bump();
        }
    }

    /// An unusable answer, or none (see [`gateway::Kind::Unusable`]).
    fn unusable_answer(&self, error: &str) {
        let change = lock(&self.reach).failed(self.now(), error.to_owned());
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
}

impl Shared {
    /// When a shutdown must go to the offline fallback, if the apiserver cannot be used.
    pub(super) fn unreachable_deadline(&self) -> Option<Instant> {
        let timeout = self.settings().fallback.apiserver_timeout;
        lock(&self.reach)
            .fallback_at(timeout)
            .map(|at| self.epoch + at)
    }

    pub(super) fn unusable_error(&self) -> EngineError {
        let timeout = self.settings().fallback.apiserver_timeout;
        lock(&self.reach).given_up(self.now(), timeout).into()
    }

    /// The shutdown's schedule after `lost`: what is left of its budget split again over the
    /// pods left (see [`crate::plan::budget::split_remaining`]), made now either way (it is
    /// the schedule after the outage, which `schedule_holds` compares with).
    pub(super) fn replanned(
        &self,
        ctx: &ShutdownCtx,
        lost: Duration,
        cause: String,
    ) -> ShutdownCtx {
        let at = ctx.start.elapsed();
        let mut next = ctx.clone();
        next.planned_at = self.now();
        let pods = self.pod_infos();
        match crate::plan::plan_steps(&ctx.plan, &pods) {
            Ok(steps) => {
                next.planned = pods.into_iter().map(|p| p.uid).collect();
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
        next
    }

    /// One cheap request to learn whether the apiserver answers.
    /// A consistent read of the Node (no resourceVersion: served from etcd, not the watch
    /// cache); one that gets no answer in [`PROBE_TIMEOUT`] counts as an unusable answer.
    pub(super) async fn probe(&self) {
        let api: Api<Node> = Api::all(self.client.clone());
        let r = match tokio::time::timeout(PROBE_TIMEOUT, api.get_metadata_opt(&self.node)).await {
            Ok(r) => r,
            Err(_) => {
                gateway::no_answer(
                    self,
                    &format_args!(
                        "reading the Node {}: no answer in {} s",
                        self.node,
                        PROBE_TIMEOUT.as_secs()
                    ),
                );
                return;
            }
        };
        let was_usable = lock(&self.reach).usable();
        if gateway::answer(self, r).is_ok() && !was_usable {
            self.bump();
        }
    }

    /// After an unusable answer (recorded by the gateway): waits a moment to try again, or gives up
    /// once the apiserver has not been usable for `fallback.apiserver_timeout`.
    pub(super) async fn retry_or_unreachable(&self, started: Instant) -> Result<(), EngineError> {
        let timeout = self.settings().fallback.apiserver_timeout;
        if let Some(given_up) = lock(&self.reach).give_up(self.now(), started.elapsed(), timeout) {
            return Err(given_up.into());
        }
        tokio::time::sleep(RETRY_IN_SHUTDOWN).await;
        Ok(())
    }

    /// Waits until the watches named by `which` have listed, or the apiserver has not been
    /// usable for `fallback.apiserver_timeout` (counted from the last good answer, so a
    /// node whose apiserver went away long ago does not wait the whole timeout again).
    pub(super) async fn wait_ready(&self, which: fn(&Ready) -> bool) -> Result<(), EngineError> {
        let mut rx = self.wake.subscribe();
        let mut ready = self.ready.subscribe();
        let started = Instant::now();
        let timeout = self.settings().fallback.apiserver_timeout;
        loop {
            rx.borrow_and_update();
            if which(&ready.borrow_and_update()) {
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
                r = ready.changed() => if r.is_err() {
                    return Err(anyhow::anyhow!("the engine stopped").into());
                },
                _ = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use k8s_openapi::api::core::v1::Pod;
    use kube::runtime::{reflector, watcher};

    /// Why the engine's views say they have listed through its own flags and `wake` channel
    /// rather than kube's `Store::wait_until_ready`: that wakes only the task that polled it
    /// last (one waker slot), and the engine's views are waited for by several at once (the
    /// loop, a drain, `Engine::wait_reachable`, the eviction-request controller on the pods).
    #[tokio::test]
    async fn kubes_store_readiness_wakes_only_the_last_of_its_waiters() {
        let (store, mut writer) = reflector::store::<Pod>();
        let waiter = |store: reflector::Store<Pod>| {
            tokio::spawn(async move { store.wait_until_ready().await.is_ok() })
        };
        let first = waiter(store.clone());
        tokio::task::yield_now().await;
        let last = waiter(store.clone());
        tokio::task::yield_now().await;

        writer.apply_watcher_event(&watcher::Event::InitDone);

        let waited = |task| tokio::time::timeout(Duration::from_secs(1), task);
        assert!(matches!(waited(last).await, Ok(Ok(true))));
        assert!(
            waited(first).await.is_err(),
            "kube's readiness woke every waiter: the engine's flags may give way to it"
        );
    }
}
