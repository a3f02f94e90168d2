//! The watches: one reflector per resource feeding the reconcile loop.
//!
//! A failed watch waits before it tries again ([`retry_delay`]), but not past the moment the
//! apiserver is known to answer again, or a shutdown starts: then it tries at once. A
//! watcher's own back-off would keep what it built up during an outage, and a shutdown
//! would wait for it after the apiserver came back.
//!
//! While a shutdown runs, a watch that says nothing for [`watch_silence_limit`] is given up
//! and its view listed again: a watch can hang mid-stream on a connection that lives, and
//! the drain must not wait on a view that stopped moving.

use std::collections::HashMap;
use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{self};
use kube::runtime::watcher;
use kube::Resource;
use rand::Rng as _;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::cluster::{gateway, Slim};
use crate::plan::reachability::{retry_delay, watch_silence_limit};

use super::{lenient, lock, Ready, Shared};

pub(super) fn spawn_reflector<K>(
    shared: Arc<Shared>,
    client: kube::Client,
    config: watcher::Config,
    mut writer: reflector::store::Writer<K>,
    flag: fn(&mut Ready) -> &mut bool,
    on_object: fn(&Shared, &K),
) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()>
        + Slim
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    tokio::spawn(async move {
        let kind = K::kind(&()).to_string();
        let watch_name = watch_name(&kind, &config);
        let mut stream = lenient::watch(&client, &config, writer.as_reader());
        let mut reconnect = shared.reconnect.subscribe();
        let mut under_way = shared.under_way.subscribe();
        let mut failures = 0u32;
        // What the view held when a silent watch was given up, until the new list says
        // whether the watch had hung.
        let mut before_relist: Option<Versions> = None;
        // From a (re)start until its list is in: silence then is a list not answered.
        let mut listing = true;
        let mut told_unversioned = false;
        loop {
            let shutdown = *under_way.borrow_and_update();
            let limit = watch_silence_limit(shutdown);
            reconnect.borrow_and_update();
            let silence = sleep_for(limit);
            let item = tokio::select! {
                item = stream.next() => item,
                // A shutdown began or ended (or the apiserver answers again): the silence
                // limit may have changed for the watch waited on.
                open = woken(&mut reconnect, &mut under_way) => {
                    if !open {
                        return;
                    }
                    continue;
                }
                () = silence => {
                    let limit = limit.unwrap_or_default();
                    if listing {
                        gateway::no_answer(
                            &*shared,
                            &format_args!("listing {kind}: no answer in {}s", limit.as_secs()),
                        );
                    } else {
                        tracing::debug!(kind = %kind, silent_for = ?limit, "a watch silent during the shutdown: listing again");
                        before_relist = Some(versions(&writer.as_reader()));
                    }
                    shared.bump();
                    stream = lenient::watch(&client, &config, writer.as_reader());
                    listing = true;
                    continue;
                }
            };
            let Some(item) = item else { return };
            if let Ok(event) = &item {
                writer.apply_watcher_event(event);
                log_delivery(&shared, &kind, &watch_name, event, &mut told_unversioned);
            }
            // Only an answer ends a back-off (`Init` comes before every attempt).
            if matches!(&item, Ok(e) if !matches!(e, watcher::Event::Init)) {
                failures = 0;
            }
            let failed = item.is_err();
            match item {
                Ok(watcher::Event::InitDone) => {
                    listing = false;
                    listed(
                        &shared,
                        &kind,
                        flag,
                        before_relist.take(),
                        &writer.as_reader(),
                    );
                }
                Ok(watcher::Event::InitApply(obj)) => {
                    gateway::listed(&*shared);
                    on_object(&shared, &obj);
                }
                // An event on a watch opened earlier says the connection lives, not that the
                // apiserver takes requests: it does not authorize a stream again (a revoked
                // credential keeps its open watches), and its watch cache streams while
                // etcd refuses writes. Only a new answer counts.
                Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj)) => {
                    on_object(&shared, &obj);
                }
                // Emitted when a (re)list begins, before any request: no answer (a watch
                // retrying against a refusing apiserver emits one at every attempt).
                Ok(watcher::Event::Init) => listing = true,
                Err(err) => gateway::watch_failed(&*shared, &kind, &err),
            }
            shared.bump();
            if failed {
                let delay = retry_delay(failures, shutdown, rand::rng().random::<f64>());
                failures = failures.saturating_add(1);
                reconnect.borrow_and_update();
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    open = woken(&mut reconnect, &mut under_way) => {
                        if !open {
                            return;
                        }
                        // The apiserver answers again, or a shutdown began: what was built
                        // up before says nothing about now.
                        failures = 0;
                    }
                }
            }
        }
    })
}

/// The apiserver answers again after an outage, or a shutdown began or ended; false once
/// the engine is gone.
async fn woken(
    reconnect: &mut watch::Receiver<u64>,
    under_way: &mut watch::Receiver<bool>,
) -> bool {
    tokio::select! {
        r = reconnect.changed() => r.is_ok(),
        r = under_way.changed() => r.is_ok(),
    }
}

/// A watch's name in the engine's [`crate::plan::freshness::WatchLog`]: its kind and selectors.
fn watch_name(kind: &str, config: &watcher::Config) -> String {
    format!(
        "{kind} {} {}",
        config.label_selector.as_deref().unwrap_or_default(),
        config.field_selector.as_deref().unwrap_or_default()
    )
}

/// What the watch delivered, in the engine's [`crate::plan::freshness::WatchLog`]. An object
/// without a resourceVersion is said once per watch: nothing can tell whether our own
/// writes are newer than it, so they stand in for it until the watch delivers them.
fn log_delivery<K: Resource<DynamicType = ()>>(
    shared: &Shared,
    kind: &str,
    watch: &str,
    event: &watcher::Event<K>,
    told_unversioned: &mut bool,
) {
    let mut log = lock(&shared.watch_log);
    match event {
        watcher::Event::Init => log.listing(watch),
        watcher::Event::InitApply(obj) | watcher::Event::Apply(obj) => {
            let rv = obj.meta().resource_version.as_deref();
            if rv.is_none() && !std::mem::replace(told_unversioned, true) {
                tracing::warn!(kind = %kind, name = ?obj.meta().name, "the apiserver listed an object without a resourceVersion; nodegrace's own writes stand in for it until the watch delivers them");
            }
            let key = super::view::log_key(obj);
            if matches!(event, watcher::Event::InitApply(_)) {
                log.listed(watch, &key, rv);
            } else {
                log.delivered(&key, rv);
            }
        }
        watcher::Event::Delete(obj) => log.deleted(&super::view::log_key(obj)),
        watcher::Event::InitDone => {}
    }
}

/// Sleeps for `limit`, or forever when there is none.
async fn sleep_for(limit: Option<std::time::Duration>) {
    match limit {
        Some(limit) => tokio::time::sleep(limit).await,
        None => std::future::pending().await,
    }
}

/// A list is in: the view is ready, the apiserver answered, and a watch given up for its
/// silence is told apart from one that had hung.
fn listed<K: Resource<DynamicType = ()> + Clone>(
    shared: &Shared,
    kind: &str,
    flag: fn(&mut Ready) -> &mut bool,
    before_relist: Option<Versions>,
    view: &reflector::Store<K>,
) {
    {
        let mut ready = lock(&shared.ready);
        *flag(&mut ready) = true;
        ready.settle();
    }
    gateway::listed(shared);
    if let Some(before) = before_relist {
        let missed = changed(&before, &versions(view));
        if missed > 0 {
            tracing::warn!(kind = %kind, missed, "the {kind} watch had hung: it said nothing while objects changed; listed again");
        }
    }
}

/// Each object of a view and the version it was seen at.
type Versions = HashMap<String, Option<String>>;

fn versions<K: Resource<DynamicType = ()> + Clone>(view: &reflector::Store<K>) -> Versions {
    view.state()
        .iter()
        .map(|o| {
            let m = o.meta();
            (
                format!(
                    "{}/{}",
                    m.namespace.as_deref().unwrap_or_default(),
                    m.name.as_deref().unwrap_or_default()
                ),
                m.resource_version.clone(),
            )
        })
        .collect()
}

/// How many objects were added, removed or changed from `before` to `after`.
fn changed(before: &Versions, after: &Versions) -> usize {
    let gone_or_changed = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(*v))
        .count();
    gone_or_changed + after.keys().filter(|k| !before.contains_key(*k)).count()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::cluster::eviction_request::PodState;
    use crate::plan::PodInfo;

    /// A Deployment's pod as kube-apiserver v1.28 sends it in a watch event.
    fn pod_as_sent() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "web-7d9f8b6c5-x2kqp", "namespace": "shop",
                "uid": "0b1c6a5e-1111-4c1e-9a61-000000000001", "resourceVersion": "4242",
                "labels": {"app": "web", "pod-template-hash": "7d9f8b6c5"},
                "annotations": {
                    "interceptor.evictionrequest.coordination.k8s.io/priority_backup.example.com":
                        "10000/backup"
                },
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet",
                    "name": "web-7d9f8b6c5", "uid": "5f0c1a2b-aaaa", "controller": true,
                    "blockOwnerDeletion": true}],
                "managedFields": [{"manager": "kube-controller-manager", "operation": "Update",
                    "apiVersion": "v1", "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}}}}}]
            },
            "spec": {
                "nodeName": "node-a", "priority": 1000, "priorityClassName": "high",
                "terminationGracePeriodSeconds": 45, "serviceAccountName": "default",
                "schedulingGroup": {"podGroupName": "g"},
                "schedulerName": "default-scheduler", "dnsPolicy": "ClusterFirst",
                "restartPolicy": "Always", "enableServiceLinks": true,
                "containers": [{
                    "name": "web", "image": "nginx:1.27", "imagePullPolicy": "IfNotPresent",
                    "args": ["--port", "8080"],
                    "env": [{"name": "MODE", "value": "production"}],
                    "ports": [{"containerPort": 8080, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080},
                        "periodSeconds": 5},
                    "volumeMounts": [{"name": "kube-api-access-abcde",
                        "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
                        "readOnly": true}],
                    "terminationMessagePath": "/dev/termination-log"
                }],
                "tolerations": [
                    {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                        "effect": "NoExecute", "tolerationSeconds": 300},
                    {"operator": "Exists"}
                ],
                "volumes": [{"name": "kube-api-access-abcde", "projected": {"sources": [
                    {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                    {"configMap": {"name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                    {"downwardAPI": {"items": [{"path": "namespace",
                        "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}
                ], "defaultMode": 420}}]
            },
            "status": {
                "phase": "Running", "qosClass": "Burstable", "hostIP": "10.0.0.7",
                "podIP": "10.244.1.9", "startTime": "2026-11-24T05:00:00Z",
                "conditions": [
                    {"type": "Ready", "status": "True",
                        "lastTransitionTime": "2026-11-24T05:00:02Z"},
                    {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                        "lastTransitionTime": "2026-11-24T05:01:00Z"}
                ],
                "containerStatuses": [{"name": "web", "ready": true, "restartCount": 0,
                    "image": "nginx:1.27", "imageID": "sha256:abc", "containerID": "containerd://abc",
                    "started": true,
                    "state": {"running": {"startedAt": "2026-11-24T05:00:01Z"}}}]
            }
        }))
        .expect("a valid pod")
    }

    #[test]
    fn a_slim_pod_keeps_what_the_daemon_reads() {
        let sent = pod_as_sent();
        let mut kept = sent.clone();
        kept.slim();

        assert_eq!(
            PodInfo::from_pod(&kept).expect("classifies"),
            PodInfo::from_pod(&sent).expect("classifies")
        );
        // The responders a pod declares by annotation.
        assert_eq!(kept.metadata.annotations, sent.metadata.annotations);
        assert_eq!(
            kept.metadata.resource_version,
            sent.metadata.resource_version
        );
        assert!(super::super::tolerates_everything(&kept));
        let spec = kept.spec.as_ref().expect("spec");
        let sent_spec = sent.spec.as_ref().expect("spec");
        assert_eq!(spec.node_name, sent_spec.node_name);
        assert_eq!(spec.priority_class_name, sent_spec.priority_class_name);
        assert_eq!(spec.tolerations, sent_spec.tolerations);
        // The eviction-request controller refuses a pod of a PodGroup (EvictionInvalid).
        assert!(spec.scheduling_group.is_some());
        assert_eq!(spec.scheduling_group, sent_spec.scheduling_group);
        let status = kept.status.as_ref().expect("status");
        let sent_status = sent.status.as_ref().expect("status");
        assert_eq!(status.phase, sent_status.phase);
        assert_eq!(status.conditions, sent_status.conditions);
        let started = |s: &k8s_openapi::api::core::v1::PodStatus| {
            s.container_statuses.as_ref().map(|all| {
                all.iter()
                    .map(|c| c.state.as_ref()?.running.as_ref()?.started_at.clone())
                    .collect::<Vec<_>>()
            })
        };
        assert_eq!(started(status), started(sent_status));
        let uid = "0b1c6a5e-1111-4c1e-9a61-000000000001";
        assert_eq!(
            PodState::of(Some(&kept), uid),
            PodState::of(Some(&sent), uid)
        );
    }

    #[test]
    fn a_slim_pod_drops_what_nothing_reads() {
        let mut pod = pod_as_sent();
        let before = serde_json::to_vec(&pod).expect("serializes").len();
        pod.slim();
        let after = serde_json::to_vec(&pod).expect("serializes").len();

        assert!(pod.metadata.managed_fields.is_none());
        let spec = pod.spec.as_ref().expect("spec");
        assert!(spec.volumes.is_none() && spec.containers.is_empty());
        let status = pod.status.as_ref().expect("status");
        assert!(status.pod_ip.is_none());
        let containers = status
            .container_statuses
            .as_ref()
            .expect("container statuses");
        assert_eq!(containers.len(), 1);
        assert!(containers[0].image.is_empty() && containers[0].container_id.is_none());
        assert!(after * 2 < before, "{before} bytes as sent, {after} kept");
    }
}
