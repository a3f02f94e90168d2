//! The watches: one per resource, polled by the reconcile loop itself, so that what they
//! saw (the views' readiness, the order of their deliveries) is the loop's own state and no
//! task but the loop's writes it.
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

use futures::stream::BoxStream;
use futures::{FutureExt as _, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::reflector::{self};
use kube::runtime::watcher;
use kube::Resource;
use rand::Rng as _;
use tokio::time::Instant;

use crate::api::NodeMaintenance;
use crate::cluster::{gateway, Slim};
use crate::plan::freshness::WatchLog;
use crate::plan::reachability::{retry_delay, watch_silence_limit};

use super::{lenient, Ready, Shared};

/// The engine's watches, which the loop polls between its passes.
pub(super) struct Watches {
    pub(super) node: Watch<Node>,
    pub(super) pods: Watch<Pod>,
    /// The maintenances labelled for the node; None: a node name too long for a label
    /// value, whose shutdown maintenance is unlabelled, in the shared watch.
    pub(super) own: Option<Watch<NodeMaintenance>>,
    pub(super) shared: Watch<NodeMaintenance>,
}

impl Watches {
    /// What the next watch item brings. Cancel-safe: an item is taken and recorded, or not
    /// taken at all.
    pub(super) async fn next(&mut self) -> Seen {
        let own = async {
            match self.own.as_mut() {
                Some(w) => w.next().await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            seen = self.node.next() => seen,
            seen = self.pods.next() => seen,
            seen = own => seen,
            seen = self.shared.next() => seen,
        }
    }

    /// Every item the watches hold already, into the loop's records, without waiting.
    pub(super) fn take_ready(&mut self, ready: &mut Ready, log: &mut WatchLog) {
        while let Some(seen) = self.next().now_or_never() {
            seen.record(ready, log);
        }
    }

    /// A shutdown began or ended, or the apiserver answers again: a watch waiting out a
    /// back-off tries at once, and the silence limit is the one of now.
    pub(super) fn woken(&mut self, shutdown: bool) {
        self.node.woken(shutdown);
        self.pods.woken(shutdown);
        if let Some(own) = self.own.as_mut() {
            own.woken(shutdown);
        }
        self.shared.woken(shutdown);
    }
}

/// What one watch item leaves in the loop's records.
#[derive(Default)]
pub(super) struct Seen {
    delivered: Option<Delivery>,
    /// A list is in: this view is ready.
    listed: Option<fn(&mut Ready) -> &mut bool>,
}

/// A watch event as the [`WatchLog`] records it.
enum Delivery {
    Listing {
        watch: String,
    },
    Listed {
        watch: String,
        key: String,
        rv: Option<String>,
    },
    Applied {
        key: String,
        rv: Option<String>,
    },
    Deleted {
        key: String,
    },
}

impl Seen {
    pub(super) fn record(self, ready: &mut Ready, log: &mut WatchLog) {
        match self.delivered {
            Some(Delivery::Listing { watch }) => log.listing(&watch),
            Some(Delivery::Listed { watch, key, rv }) => log.listed(&watch, &key, rv.as_deref()),
            Some(Delivery::Applied { key, rv }) => log.delivered(&key, rv.as_deref()),
            Some(Delivery::Deleted { key }) => log.deleted(&key),
            None => {}
        }
        if let Some(flag) = self.listed {
            *flag(ready) = true;
            ready.settle();
        }
    }
}

pub(super) struct Watch<K: Resource<DynamicType = ()> + Clone + 'static> {
    shared: Arc<Shared>,
    client: kube::Client,
    config: watcher::Config,
    kind: String,
    /// Its name in the [`WatchLog`]: its kind and selectors.
    name: String,
    stream: BoxStream<'static, watcher::Result<watcher::Event<K>>>,
    writer: reflector::store::Writer<K>,
    flag: fn(&mut Ready) -> &mut bool,
    failures: u32,
    /// After a failure: when it tries again.
    retry_at: Option<Instant>,
    /// While a shutdown runs: when it is given up for its silence.
    silent_at: Option<Instant>,
    shutdown: bool,
    /// What the view held when a silent watch was given up, until the new list says
    /// whether the watch had hung.
    before_relist: Option<Versions>,
    /// From a (re)start until its list is in: silence then is a list not answered.
    listing: bool,
    told_unversioned: bool,
    /// The stream ended (a watcher's never does): nothing more comes.
    ended: bool,
}

impl<K> Watch<K>
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
    pub(super) fn new(
        shared: Arc<Shared>,
        config: watcher::Config,
        writer: reflector::store::Writer<K>,
        flag: fn(&mut Ready) -> &mut bool,
    ) -> Watch<K> {
        let kind = K::kind(&()).to_string();
        let client = shared.client.clone();
        let stream = lenient::watch(&client, &config, writer.as_reader());
        Watch {
            name: watch_name(&kind, &config),
            shared,
            client,
            config,
            kind,
            stream,
            writer,
            flag,
            failures: 0,
            retry_at: None,
            silent_at: None,
            shutdown: false,
            before_relist: None,
            listing: true,
            told_unversioned: false,
            ended: false,
        }
    }

    fn woken(&mut self, shutdown: bool) {
        self.shutdown = shutdown;
        if self.retry_at.take().is_some() {
            // What was built up before says nothing about now.
            self.failures = 0;
        }
        self.silent_at = self.silence_from_now();
    }

    fn silence_from_now(&self) -> Option<Instant> {
        watch_silence_limit(self.shutdown).map(|limit| Instant::now() + limit)
    }

    async fn next(&mut self) -> Seen {
        if self.ended {
            return std::future::pending().await;
        }
        if let Some(at) = self.retry_at {
            tokio::time::sleep_until(at).await;
            self.retry_at = None;
            self.silent_at = self.silence_from_now();
        }
        let item = tokio::select! {
            biased;
            item = self.stream.next() => item,
            () = crate::timer::sleep_until(self.silent_at) => {
                self.given_up_for_silence();
                return Seen::default();
            }
        };
        self.silent_at = self.silence_from_now();
        let Some(item) = item else {
            self.ended = true;
            return Seen::default();
        };
        let seen = self.took(item);
        self.shared.bump();
        seen
    }

    fn given_up_for_silence(&mut self) {
        let limit = watch_silence_limit(self.shutdown).unwrap_or_default();
        if self.listing {
            gateway::no_answer(
                &*self.shared,
                &format_args!("listing {}: no answer in {}s", self.kind, limit.as_secs()),
            );
        } else {
            tracing::debug!(kind = %self.kind, silent_for = ?limit, "a watch silent during the shutdown: listing again");
            self.before_relist = Some(versions(&self.writer.as_reader()));
        }
        self.shared.bump();
        self.stream = lenient::watch(&self.client, &self.config, self.writer.as_reader());
        self.listing = true;
        self.silent_at = self.silence_from_now();
    }

    fn took(&mut self, item: watcher::Result<watcher::Event<K>>) -> Seen {
        let mut seen = Seen::default();
        if let Ok(event) = &item {
            self.writer.apply_watcher_event(event);
            seen.delivered = self.delivery(event);
        }
        // Only an answer ends a back-off (`Init` comes before every attempt).
        if matches!(&item, Ok(e) if !matches!(e, watcher::Event::Init)) {
            self.failures = 0;
        }
        match item {
            Ok(watcher::Event::InitDone) => {
                self.listing = false;
                seen.listed = Some(self.flag);
                gateway::listed(&*self.shared);
                if let Some(before) = self.before_relist.take() {
                    let missed = changed(&before, &versions(&self.writer.as_reader()));
                    if missed > 0 {
                        tracing::warn!(kind = %self.kind, missed, "the {} watch had hung: it said nothing while objects changed; listed again", self.kind);
                    }
                }
            }
            Ok(watcher::Event::InitApply(_)) => gateway::listed(&*self.shared),
            // An event on a watch opened earlier says the connection lives, not that the
            // apiserver takes requests: it does not authorize a stream again (a revoked
            // credential keeps its open watches), and its watch cache streams while
            // etcd refuses writes. Only a new answer counts.
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {}
            // Emitted when a (re)list begins, before any request: no answer (a watch
            // retrying against a refusing apiserver emits one at every attempt).
            Ok(watcher::Event::Init) => self.listing = true,
            Err(err) => {
                gateway::watch_failed(&*self.shared, &self.kind, &err);
                let delay = retry_delay(self.failures, self.shutdown, rand::rng().random::<f64>());
                self.failures = self.failures.saturating_add(1);
                self.retry_at = Some(Instant::now() + delay);
            }
        }
        seen
    }

    /// What the watch delivered, for the [`WatchLog`]. An object without a resourceVersion
    /// is said once per watch: nothing can tell whether our own writes are newer than it,
    /// so they stand in for it until the watch delivers them.
    fn delivery(&mut self, event: &watcher::Event<K>) -> Option<Delivery> {
        Some(match event {
            watcher::Event::Init => Delivery::Listing {
                watch: self.name.clone(),
            },
            watcher::Event::InitApply(obj) | watcher::Event::Apply(obj) => {
                let rv = obj.meta().resource_version.clone();
                if rv.is_none() && !std::mem::replace(&mut self.told_unversioned, true) {
                    tracing::warn!(kind = %self.kind, name = ?obj.meta().name, "the apiserver listed an object without a resourceVersion; nodegrace's own writes stand in for it until the watch delivers them");
                }
                let key = super::view::log_key(obj);
                if matches!(event, watcher::Event::InitApply(_)) {
                    Delivery::Listed {
                        watch: self.name.clone(),
                        key,
                        rv,
                    }
                } else {
                    Delivery::Applied { key, rv }
                }
            }
            watcher::Event::Delete(obj) => Delivery::Deleted {
                key: super::view::log_key(obj),
            },
            watcher::Event::InitDone => return None,
        })
    }
}

fn watch_name(kind: &str, config: &watcher::Config) -> String {
    format!(
        "{kind} {} {}",
        config.label_selector.as_deref().unwrap_or_default(),
        config.field_selector.as_deref().unwrap_or_default()
    )
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
