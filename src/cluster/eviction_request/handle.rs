//! How the drain engine and the requester feed this node's eviction-request controller.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;

use super::gate::EvictorGate;

/// Told what blocks the eviction of a pod (by UID): `Some` with the budget or the
/// apiserver's message after a refusal, `None` once it is evicted or gone. The drain engine
/// names the blocker on the NodeMaintenance, as it does for its own evictions.
pub(crate) type BlockSink = Arc<dyn Fn(&str, Option<String>) + Send + Sync>;

pub(super) enum Message {
    PodChanged {
        namespace: String,
        uid: String,
    },
    /// This node's requester wrote a request of the `lifecycle` API (the write's answer).
    LifecycleRequested(Box<k8s_openapi::api::lifecycle::v1alpha1::EvictionRequest>),
    BackoffMax(Duration),
    Concurrency(usize),
}

/// Lets the drain engine feed the controller.
#[derive(Clone)]
pub struct ControllerHandle {
    tx: mpsc::UnboundedSender<Message>,
    gate: EvictorGate,
}

impl ControllerHandle {
    pub(super) fn from_sender(tx: mpsc::UnboundedSender<Message>, gate: EvictorGate) -> Self {
        Self { tx, gate }
    }

    /// The drain is about to DELETE the pod `uid` at its deadline: the controller's evictor
    /// leaves it from now on (returns once an eviction already sent is answered).
    pub(crate) async fn escalating(&self, uid: &str) {
        self.gate.escalating(uid).await;
    }

    /// A pod of this node changed or was deleted (call from the pod watch).
    pub fn pod_changed(&self, namespace: &str, uid: &str) {
        let _ = self.tx.send(Message::PodChanged {
            namespace: namespace.to_owned(),
            uid: uid.to_owned(),
        });
    }

    /// This node's requester wrote `request` on the `lifecycle` API: looked at at once, not
    /// when the watch shows it (after an apiserver restart that can be seconds later).
    pub(crate) fn lifecycle_requested(
        &self,
        request: k8s_openapi::api::lifecycle::v1alpha1::EvictionRequest,
    ) {
        let _ = self.tx.send(Message::LifecycleRequested(Box::new(request)));
    }

    /// Changes the eviction back-off cap (shorter under a shutdown deadline).
    pub fn set_backoff_max(&self, cap: Duration) {
        let _ = self.tx.send(Message::BackoffMax(cap));
    }

    /// Changes how many requests are reconciled at once (a reloaded configuration).
    pub(crate) fn set_concurrency(&self, n: usize) {
        let _ = self.tx.send(Message::Concurrency(n.max(1)));
    }
}
