//! The cluster view: what the watches hold of the node, its pods and the
//! NodeMaintenances that may select it, joined with the objects the engine's own writes
//! returned (a write is never repeated before its watch event arrives).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, Result};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::Store;
use kube::{Client, Resource, ResourceExt};

use crate::api::{NodeMaintenance, Stage, FINALIZER_MAINTENANCE_COMPLETION};
use crate::plan::freshness::{Fresher, Version, WatchLog, Written};
use crate::plan::{own, PodInfo};

use super::{DrainState, RunState, Shared, ShutdownRun, DRAIN_STOPPED_ANNOTATION};

/// How long the shutdown maintenance from its create's answer stands in for the watch's copy.
pub(super) const CREATED_KEPT: Duration = Duration::from_secs(5);

/// The NodeMaintenances the node watches: those labelled for it ([`crate::api::NODE_LABEL`]:
/// its shutdown maintenance) and the unlabelled ones. Maintenances labelled for other nodes
/// (their shutdown maintenances, pinned to them, with their status churn) never reach it.
pub(super) struct Maintenances {
    pub(super) own: Store<NodeMaintenance>,
    pub(super) shared: Store<NodeMaintenance>,
}

impl Maintenances {
    /// Both caches, one object per name. Where both hold it (a maintenance relabelled, one
    /// watch not yet told), the copy delivered last: both watches stream the same
    /// apiserver's changes in order.
    pub(super) fn state(&self, log: &WatchLog) -> Vec<Arc<NodeMaintenance>> {
        let mut by_name: HashMap<String, Arc<NodeMaintenance>> = HashMap::new();
        for m in self.shared.state().into_iter().chain(self.own.state()) {
            let name = m.name_any();
            let key = log_key(m.as_ref());
            let at = |m: &NodeMaintenance| log.delivered_at(&key, m.resource_version().as_deref());
            match by_name.get(&name) {
                Some(known) if at(known) > at(&m) => {}
                _ => {
                    by_name.insert(name, m);
                }
            }
        }
        by_name.into_values().collect()
    }

    /// The maintenance `name` as a watch holds it, for a drain or a cancel outside the loop
    /// (which alone knows which copy came last): an older copy only costs a request that
    /// the apiserver refuses as a conflict.
    pub(super) fn named(&self, name: &str) -> Option<Arc<NodeMaintenance>> {
        let find =
            |s: &Store<NodeMaintenance>| s.state().into_iter().find(|m| m.name_any() == name);
        find(&self.own).or_else(|| find(&self.shared))
    }
}

/// An object's key in the [`WatchLog`]: its kind, namespace and name.
pub(super) fn log_key<K: Resource<DynamicType = ()>>(k: &K) -> String {
    format!(
        "{}/{}/{}",
        K::kind(&()),
        k.meta().namespace.as_deref().unwrap_or_default(),
        k.meta().name.as_deref().unwrap_or_default()
    )
}

/// The copy to act on: the watch's, or our write's answer while the watch has not delivered
/// it. `written` is dropped once the watch's copy is the one.
fn fresher<K: Resource<DynamicType = ()>>(
    log: &WatchLog,
    stored: Arc<K>,
    written: &mut Option<Written<Arc<K>>>,
) -> Arc<K> {
    let Some(w) = written.as_ref() else {
        return stored;
    };
    let key = log_key(stored.as_ref());
    match log.fresher(
        &key,
        Version::of(stored.meta()),
        w,
        Version::of(w.copy.meta()),
    ) {
        Fresher::Written => w.copy.clone(),
        Fresher::Watched => {
            *written = None;
            stored
        }
    }
}

/// The label selectors of the two maintenance watches of `node`.
pub(super) fn maintenance_selectors(node: &str) -> Vec<String> {
    own::own_selector(node)
        .into_iter()
        .chain([own::unlabelled_selector()])
        .collect()
}

/// The NodeMaintenances that may select `node`, as the engine watches them (one list per
/// selector of [`maintenance_selectors`]), for the CLI. One object per name: a maintenance
/// relabelled between the two lists is in both, and the later list's copy counts.
pub(crate) async fn list_maintenances_for(
    client: &Client,
    node: &str,
) -> Result<Vec<NodeMaintenance>> {
    use crate::cluster::listing::{list_all, Caps};
    let mut all: Vec<NodeMaintenance> = Vec::new();
    for selector in maintenance_selectors(node) {
        let params = kube::api::ListParams::default().labels(&selector);
        let list: Vec<NodeMaintenance> = list_all(client, None, &params, Caps::NODE)
            .await
            .with_context(|| format!("listing NodeMaintenances ({selector})"))?;
        for m in list {
            match all
                .iter_mut()
                .find(|known| known.name_any() == m.name_any())
            {
                Some(known) => *known = m,
                None => all.push(m),
            }
        }
    }
    Ok(all)
}

pub(super) fn has_finalizer(m: &NodeMaintenance) -> bool {
    m.finalizers()
        .iter()
        .any(|f| f == FINALIZER_MAINTENANCE_COMPLETION)
}

pub(super) fn is_deleting(m: &NodeMaintenance) -> bool {
    m.metadata.deletion_timestamp.is_some()
}

pub(super) fn is_active(m: &NodeMaintenance) -> bool {
    !is_deleting(m) && matches!(m.spec.stage, Stage::Cordon | Stage::Drain)
}

pub(super) fn is_draining(m: &NodeMaintenance) -> bool {
    !is_deleting(m) && m.spec.stage == Stage::Drain
}

/// The node's shutdown maintenance (named `shutdown`) whose shutdown was cancelled: it drains
/// nothing more, though still in stage Drain, until a shutdown begins again.
pub(super) fn drain_stopped(m: &NodeMaintenance, shutdown: &str, run: &ShutdownRun) -> bool {
    !run.on()
        && m.name_any() == shutdown
        && (run.state == RunState::Stopped
            || m.annotations().contains_key(DRAIN_STOPPED_ANNOTATION))
}

/// The volumes the Node says are attached to it or in use by its kubelet, by name.
pub(super) fn node_volumes(node: &Node) -> Vec<String> {
    let Some(status) = node.status.as_ref() else {
        return Vec::new();
    };
    let attached = status.volumes_attached.iter().flatten().map(|v| &v.name);
    let in_use = status.volumes_in_use.iter().flatten();
    let mut names: Vec<String> = attached.chain(in_use).cloned().collect();
    names.sort();
    names.dedup();
    names
}

pub(super) fn tolerates_everything(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.tolerations.as_ref())
        .is_some_and(|ts| {
            ts.iter().any(|t| {
                t.operator.as_deref() == Some("Exists")
                    && t.key.as_deref().unwrap_or_default().is_empty()
                    && t.effect.as_deref().unwrap_or_default().is_empty()
            })
        })
}

impl Shared {
    /// Our write's answer, to act on until the watch delivers it.
    pub(super) fn pod_infos(&self) -> Vec<PodInfo> {
        self.pods
            .state()
            .iter()
            .filter(|p| own::is_bound_to(p, &self.node))
            .filter_map(|p| match PodInfo::from_pod(p) {
                Ok(info) => Some(info),
                Err(err) => {
                    tracing::warn!(node = %self.node, error = %err, "ignoring a pod that cannot be classified");
                    None
                }
            })
            .collect()
    }

    /// This node's Node as its watch last delivered it.
    pub(super) fn node_watched(&self) -> Option<Arc<Node>> {
        self.nodes
            .state()
            .into_iter()
            .find(|n| n.metadata.name.as_deref() == Some(self.node.as_str()))
    }

    pub(super) fn node_obj(&self, st: &mut DrainState) -> Option<Arc<Node>> {
        let stored = self.node_watched()?;
        Some(fresher(&st.watch_log, stored, &mut st.node_overlay))
    }

    pub(super) fn maintenance_objs(&self, st: &mut DrainState) -> Vec<Arc<NodeMaintenance>> {
        let log = &st.watch_log;
        let mut stored = self.maintenances.state(log);
        let mut names: HashSet<String> = stored.iter().map(|m| m.name_any()).collect();
        {
            // The shutdown maintenance from its create's answer, until the watch has it: the
            // drain does not wait for a watch that may still be reconnecting.
            match st.created_maintenance.as_ref() {
                Some((m, at)) if !names.contains(&m.name_any()) && at.elapsed() < CREATED_KEPT => {
                    names.insert(m.name_any());
                    stored.push(m.clone());
                }
                Some(_) => st.created_maintenance = None,
                None => {}
            }
        }
        st.nm_overlay.retain(|n, _| names.contains(n));
        let mut out: Vec<Arc<NodeMaintenance>> = stored
            .into_iter()
            .map(|m| {
                let name = m.name_any();
                let mut written = st.nm_overlay.remove(&name);
                let m = fresher(log, m, &mut written);
                if let Some(w) = written {
                    st.nm_overlay.insert(name, w);
                }
                m
            })
            .collect();
        out.sort_by(|a, b| {
            let ca = a.metadata.creation_timestamp.as_ref().map(|t| t.0);
            let cb = b.metadata.creation_timestamp.as_ref().map(|t| t.0);
            ca.cmp(&cb).then_with(|| a.name_any().cmp(&b.name_any()))
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn node_volumes_are_those_attached_or_in_use() {
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "n"},
            "status": {
                "volumesAttached": [{"name": "kubernetes.io/csi/d^a", "devicePath": ""}],
                "volumesInUse": ["kubernetes.io/csi/d^a", "kubernetes.io/csi/d^b"],
            },
        }))
        .unwrap();
        assert_eq!(
            node_volumes(&node),
            ["kubernetes.io/csi/d^a", "kubernetes.io/csi/d^b"]
        );
        let bare: Node = serde_json::from_value(json!({"metadata": {"name": "n"}})).unwrap();
        assert!(node_volumes(&bare).is_empty());
    }
}
