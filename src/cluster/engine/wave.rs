//! The engine's part in a reboot wave: whether the node is healthy again after its reboot,
//! read from the engine's stores.

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;

use super::Engine;
use crate::plan::{own, PodInfo, PodType};

impl Engine {
    /// Whether `node` is healthy again after a reboot that `booted_at` (by this node's clock,
    /// as its kubelet writes its heartbeats; None: unknown) (`plan::wave::health`), read from
    /// the engine's stores: asked only while the node holds a slot of its wave.
    pub(crate) fn health(
        &self,
        node: &Node,
        booted_at: Option<jiff::Timestamp>,
    ) -> Result<(), String> {
        let ready = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"));
        let node_ready = ready.is_some_and(|c| c.status == "True");
        // A kubelet posts its status as it starts; a heartbeat in whole seconds.
        let kubelet_of_this_boot = match (
            booted_at,
            ready.and_then(|c| c.last_heartbeat_time.as_ref()),
        ) {
            (Some(boot), Some(beat)) => beat.0.as_second() >= boot.as_second(),
            _ => true,
        };
        let not_ready: Vec<String> = self
            .shared
            .pods
            .state()
            .iter()
            .filter(|p| own::is_bound_to(p, &self.shared.node))
            .filter(|p| {
                PodInfo::from_pod(p).is_ok_and(|i| !i.terminal && i.pod_type != PodType::Default)
            })
            .filter(|p| {
                !p.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
            .collect();
        crate::plan::wave::health(
            node_ready,
            kubelet_of_this_boot,
            crate::cluster::node::unschedulable(node),
            &not_ready,
        )
    }
}
