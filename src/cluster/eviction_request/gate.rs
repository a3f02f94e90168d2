//! The drain's escalations and nodegrace's evictor, kept apart.
//!
//! Under a shutdown deadline the drain DELETEs a pod whose eviction is still refused. The
//! evictor retries the same pod on its own back-off (a budget's 429 asks for 10 s, often the
//! very moment of the escalation). Once the pod is being deleted the Eviction API no longer
//! checks its budget, so a retry that lands just after the DELETE would be accepted: an
//! eviction nobody asked for any more. The gate makes the order strict: once the drain
//! escalates a pod, the evictor sends no eviction for it, and the escalation waits for one
//! already sent to be answered.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// How long an escalation waits for an eviction already on its way: one answer's time.
const SENT_EVICTION_WAIT: Duration = Duration::from_secs(1);

#[derive(Clone, Default)]
pub(crate) struct EvictorGate {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    answered: Notify,
}

#[derive(Default)]
struct State {
    escalated: HashSet<String>,
    sending: HashSet<String>,
}

/// An eviction of one pod on its way; dropping it says it was answered.
pub(crate) struct Sending {
    gate: EvictorGate,
    uid: String,
}

impl EvictorGate {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The evictor may send an eviction of `uid`: `None` once the drain escalated it. Hold
    /// the returned value until the answer is in.
    pub(crate) fn sending(&self, uid: &str) -> Option<Sending> {
        let mut state = self.state();
        if state.escalated.contains(uid) {
            return None;
        }
        state.sending.insert(uid.to_owned());
        Some(Sending {
            gate: self.clone(),
            uid: uid.to_owned(),
        })
    }

    /// The drain is about to DELETE `uid`: no eviction of it is sent from now on, and one
    /// already sent is answered first (waited for at most [`SENT_EVICTION_WAIT`]).
    pub(crate) async fn escalating(&self, uid: &str) {
        let wait = async {
            loop {
                let answered = self.inner.answered.notified();
                {
                    let mut state = self.state();
                    state.escalated.insert(uid.to_owned());
                    if !state.sending.contains(uid) {
                        return;
                    }
                }
                answered.await;
            }
        };
        let _ = tokio::time::timeout(SENT_EVICTION_WAIT, wait).await;
    }

    /// The pod `uid` is gone: nothing to keep apart any more.
    pub(crate) fn forget(&self, uid: &str) {
        self.state().escalated.remove(uid);
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        self.gate.state().sending.remove(&self.uid);
        self.gate.inner.answered.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn an_escalated_pod_is_not_evicted_again() {
        let gate = EvictorGate::default();
        drop(gate.sending("a"));
        gate.escalating("a").await;
        assert!(gate.sending("a").is_none());
        assert!(gate.sending("b").is_some(), "other pods are not held");
        gate.forget("a");
        assert!(gate.sending("a").is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn an_escalation_waits_for_the_eviction_already_sent() {
        let gate = EvictorGate::default();
        let sent = gate.sending("a");
        let escalation = tokio::spawn({
            let gate = gate.clone();
            async move {
                gate.escalating("a").await;
                tokio::time::Instant::now()
            }
        });
        let start = tokio::time::Instant::now();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!escalation.is_finished(), "the DELETE waits for the answer");
        drop(sent);
        let done = escalation.await.ok().map(|at| at - start);
        assert_eq!(done, Some(Duration::from_millis(300)));
    }

    #[tokio::test(start_paused = true)]
    async fn an_unanswered_eviction_holds_the_escalation_one_second_at_most() {
        let gate = EvictorGate::default();
        let _sent = gate.sending("a");
        let start = tokio::time::Instant::now();
        gate.escalating("a").await;
        assert_eq!(start.elapsed(), SENT_EVICTION_WAIT);
    }
}
