//! What the daemon's caches (reflectors) keep of the objects they watch.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStatus, Node, Pod, PodSpec, PodStatus,
};
use kube::Resource;

use crate::api::NodeMaintenance;

/// What a reflector keeps of an object: what the daemon reads of it. The caches live as long
/// as the daemon, on every node.
pub(crate) trait Slim: Resource {
    fn slim(&mut self) {
        // managedFields are the larger part of an object as the apiserver sends it, and
        // nothing here reads them.
        self.meta_mut().managed_fields = None;
    }
}

impl Slim for Node {}
impl Slim for NodeMaintenance {}

impl Slim for Pod {
    /// A pod keeps its metadata, what the drain plan and the eviction paths read of its spec
    /// (node, priority, grace period, tolerations, eviction responders, the PodGroup it belongs
    /// to), its phase and conditions, and when each
    /// running container started (whether the kubelet runs a pod again after an offline
    /// shutdown). Containers, volumes and the rest of the container statuses go: they were
    /// most of a cached pod's memory (a `Container` alone takes 2.3 KiB before any of its
    /// strings), and nothing writes a cached pod back.
    fn slim(&mut self) {
        self.metadata.managed_fields = None;
        if let Some(spec) = self.spec.take() {
            self.spec = Some(PodSpec {
                node_name: spec.node_name,
                priority: spec.priority,
                priority_class_name: spec.priority_class_name,
                termination_grace_period_seconds: spec.termination_grace_period_seconds,
                tolerations: spec.tolerations,
                eviction_responders: spec.eviction_responders,
                scheduling_group: spec.scheduling_group,
                ..PodSpec::default()
            });
        }
        if let Some(status) = self.status.take() {
            self.status = Some(PodStatus {
                phase: status.phase,
                reason: status.reason,
                message: status.message,
                conditions: status.conditions,
                container_statuses: status.container_statuses.map(|all| {
                    all.into_iter()
                        .filter_map(|c| {
                            let started = c.state?.running?.started_at?;
                            Some(ContainerStatus {
                                name: c.name,
                                state: Some(ContainerState {
                                    running: Some(ContainerStateRunning {
                                        started_at: Some(started),
                                    }),
                                    ..ContainerState::default()
                                }),
                                ..ContainerStatus::default()
                            })
                        })
                        .collect()
                }),
                ..PodStatus::default()
            });
        }
    }
}
