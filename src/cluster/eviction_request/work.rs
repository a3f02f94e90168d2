//! The eviction-request controller's work queue and what it reconciles from: the requests
//! ready to reconcile (each at most once at a time, again when it changed meanwhile),
//! timers for heartbeat deadlines and back-off, the two watches' caches, and this node's
//! own latest write of each request until the watch delivers it.
//!
//! Why not kube-runtime's `Controller` (issue 19 asked): it reconciles the object its one
//! store holds. Here a request lives in two watches and moves from one to the other when
//! this node labels it; it is reconciled from this node's own write (or the create's
//! answer) until the watch catches up, so that a heartbeat deadline is not computed from a
//! stale copy; and its concurrency changes with a reloaded configuration. Each would need
//! a store of our own beside the `Controller`'s, which is most of this file again.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::controller::{Reconciled, Reconciler};
use super::{PodState, NODE_LABEL};
use crate::api::EvictionRequest;
use crate::cluster::evict;
use crate::plan::reachability::{request_retry, Window};

/// How long a request owned by its pod waits, once the pod has terminated or gone, for
/// the garbage collector to delete it before it is marked Complete. When a band of pods
/// goes, the next band's requests and evictions go out at once: Complete writes for
/// requests about to be collected would only compete with them for the apiserver.
pub(super) const COMPLETE_AFTER_COLLECTOR: Duration = Duration::from_secs(5);

pub(super) type Key = (String, String);

#[derive(Default)]
pub(super) struct Queue {
    ready: VecDeque<Key>,
    queued: HashSet<Key>,
    timers: BTreeSet<(Instant, Key)>,
    timer_of: HashMap<Key, Instant>,
}

impl Queue {
    pub(super) fn push(&mut self, key: Key) {
        if self.queued.insert(key.clone()) {
            self.ready.push_back(key);
        }
    }

    pub(super) fn pop(&mut self) -> Option<Key> {
        let key = self.ready.pop_front()?;
        self.queued.remove(&key);
        Some(key)
    }

    pub(super) fn set_timer(&mut self, key: &Key, at: Option<Instant>) {
        if let Some(old) = self.timer_of.remove(key) {
            self.timers.remove(&(old, key.clone()));
        }
        if let Some(at) = at {
            self.timers.insert((at, key.clone()));
            self.timer_of.insert(key.clone(), at);
        }
    }

    pub(super) fn next_timer(&self) -> Option<Instant> {
        self.timers.first().map(|(at, _)| *at)
    }

    pub(super) fn fire_due(&mut self, now: Instant) {
        while let Some((at, key)) = self.timers.first().cloned() {
            if at > now {
                break;
            }
            self.timers.remove(&(at, key.clone()));
            self.timer_of.remove(&key);
            self.push(key);
        }
    }
}

/// Whose a request is, for this node's controller.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Ownership {
    /// Labelled for this node.
    Ours,
    /// Unlabelled (made by something other than a node) for a pod in this node's cache:
    /// labelled for this node, then ours.
    Unclaimed,
    /// Unlabelled for a pod not in this node's cache (another node's to claim).
    NotOurs,
}

/// What decides which requests are this node's.
pub(super) struct Owned {
    pub(super) node: String,
    pub(super) pods: Store<Pod>,
}

impl Owned {
    fn ownership(&self, request: &EvictionRequest) -> Ownership {
        let label = request
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(NODE_LABEL));
        match label {
            Some(n) if *n == self.node => Ownership::Ours,
            None if self.cached_pod(request).is_some() => Ownership::Unclaimed,
            _ => Ownership::NotOurs,
        }
    }

    fn cached_pod(&self, request: &EvictionRequest) -> Option<Arc<Pod>> {
        let pod_ref = request.pod_ref()?;
        let namespace = request.metadata.namespace.as_deref()?;
        self.pods
            .get(&ObjectRef::new(&pod_ref.name).within(namespace))
            .filter(|p| p.metadata.uid.as_deref() == Some(pod_ref.uid.as_str()))
    }
}

/// Which of the two EvictionRequest watches an event came from.
#[derive(Debug, Clone, Copy)]
pub(super) enum Watch {
    /// Labelled for this node.
    Ours,
    /// Unlabelled.
    Unclaimed,
}

/// What the two watches hold. A request this node labels moves from `unclaimed` to `ours`;
/// while both hold it, the later version counts.
pub(super) struct Caches {
    pub(super) ours: Store<EvictionRequest>,
    pub(super) unclaimed: Store<EvictionRequest>,
}

impl Caches {
    pub(super) fn get(&self, key: &Key) -> Option<Arc<EvictionRequest>> {
        let at = ObjectRef::new(&key.1).within(&key.0);
        match (self.ours.get(&at), self.unclaimed.get(&at)) {
            (Some(a), Some(b)) if rv_number(&b) > rv_number(&a) => Some(b),
            (a, b) => a.or(b),
        }
    }

    fn keys(&self) -> Vec<Key> {
        let mut keys: Vec<Key> = self
            .ours
            .state()
            .iter()
            .chain(self.unclaimed.state().iter())
            .map(|r| key_pair(r))
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

/// Whether `request`'s pod has terminated or gone and `request` has it as owner: the
/// garbage collector deletes it with the pod (which the kubelet deletes once terminated).
fn collected_with_its_pod(request: &EvictionRequest, pod: Option<&Pod>) -> bool {
    let Some(target) = request.pod_ref() else {
        return false;
    };
    matches!(
        PodState::of(pod, &target.uid),
        PodState::Absent | PodState::Terminal
    ) && request
        .metadata
        .owner_references
        .iter()
        .flatten()
        .any(|o| o.kind == "Pod" && o.api_version == "v1" && o.uid == target.uid)
}

fn rv_number(request: &EvictionRequest) -> u64 {
    request
        .metadata
        .resource_version
        .as_deref()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

pub(super) fn key_pair(request: &EvictionRequest) -> Key {
    (
        request.metadata.namespace.clone().unwrap_or_default(),
        request.metadata.name.clone().unwrap_or_default(),
    )
}

/// One request to reconcile now.
pub(super) struct Ready {
    pub(super) key: Key,
    pub(super) request: EvictionRequest,
    pub(super) pod: Option<Arc<Pod>>,
    /// Unlabelled: label it for this node first.
    pub(super) claim: bool,
}

/// The controller loop's state, apart from the reconciles running.
pub(super) struct Work {
    pub(super) this: Owned,
    pub(super) cache: Caches,
    pub(super) queue: Queue,
    /// Our own latest write per request, until the watch delivers it (events come in
    /// resourceVersion order, so anything cached before that is older than the write).
    pub(super) written: HashMap<Key, EvictionRequest>,
    /// Requests being reconciled, and those that changed meanwhile.
    pub(super) in_flight: HashSet<Key>,
    pub(super) again: HashSet<Key>,
    /// Requests whose pod has terminated or gone, given time to be garbage collected.
    pub(super) awaiting_collector: HashMap<Key, Instant>,
    /// At most this many reconciled at once: the configured number, narrowed while the
    /// apiserver throttles.
    pub(super) window: Window,
    /// The engine's: true while a shutdown drains (failed requests are tried again sooner).
    pub(super) shutting_down: Arc<AtomicBool>,
}

impl Work {
    /// The next queued request to reconcile, skipping those that need nothing now.
    pub(super) fn next_ready(&mut self) -> Option<Ready> {
        loop {
            let key = self.queue.pop()?;
            if self.in_flight.contains(&key) {
                self.again.insert(key);
                continue;
            }
            let cached = self.cache.get(&key);
            let request = match (&cached, self.written.get(&key)) {
                (_, Some(ours)) => ours.clone(),
                (Some(cached), None) => (**cached).clone(),
                (None, None) => {
                    self.queue.set_timer(&key, None);
                    continue;
                }
            };
            if cached.is_none() {
                // Created here, not watched yet: reconciled from the create's answer,
                // and kept again only as its own status write returns it.
                self.written.remove(&key);
            }
            let claim = match self.this.ownership(&request) {
                Ownership::Ours => false,
                Ownership::Unclaimed => true,
                Ownership::NotOurs => continue,
            };
            let pod = self.this.cached_pod(&request);
            if !request.is_complete() && collected_with_its_pod(&request, pod.as_deref()) {
                let now = Instant::now();
                let until = *self
                    .awaiting_collector
                    .entry(key.clone())
                    .or_insert(now + COMPLETE_AFTER_COLLECTOR);
                if now < until {
                    self.queue.set_timer(&key, Some(until));
                    continue;
                }
            }
            self.in_flight.insert(key.clone());
            return Some(Ready {
                key,
                request,
                pod,
                claim,
            });
        }
    }

    /// A reconcile ended.
    pub(super) fn finished(&mut self, key: Key, result: anyhow::Result<Reconciled>) {
        self.in_flight.remove(&key);
        self.awaiting_collector.remove(&key);
        match result {
            Ok(done) => {
                self.window.taken(1);
                if let Some(stored) = done.written {
                    self.written.insert(key.clone(), stored);
                }
                self.queue
                    .set_timer(&key, done.recheck_after.map(|d| Instant::now() + d));
            }
            Err(err) => {
                if evict::anyhow_throttled(&err).is_some() {
                    self.window.throttled();
                }
                let retry = retry_after_error(&err, self.shutting_down.load(Ordering::Relaxed));
                warn!(request = %format!("{}/{}", key.0, key.1), error = crate::cluster::error_text(&err), retry_after = ?retry, "reconciling EvictionRequest failed; retrying");
                self.queue.set_timer(&key, Some(Instant::now() + retry));
            }
        }
        if self.again.remove(&key) {
            self.queue.push(key);
        }
    }

    /// An event of one of the two watches; an error once the watches ended.
    pub(super) fn watched(
        &mut self,
        reconciler: &Reconciler,
        event: Option<(
            Watch,
            Result<watcher::Event<EvictionRequest>, watcher::Error>,
        )>,
    ) -> anyhow::Result<()> {
        match event {
            Some((_, Ok(watcher::Event::Apply(r) | watcher::Event::InitApply(r)))) => {
                let key = key_pair(&r);
                // The watch caught up with our write, or went past it (someone else
                // changed the request since): its version is the one to build on.
                if self
                    .written
                    .get(&key)
                    .is_some_and(|w| rv_number(w) <= rv_number(&r))
                {
                    self.written.remove(&key);
                }
                self.queue.push(key);
            }
            // An unlabelled request stops matching its watch when a node labels it
            // (the watch says Deleted), and nothing is kept of a request before this
            // node has labelled it: look it up again.
            Some((Watch::Unclaimed, Ok(watcher::Event::Delete(r)))) => {
                self.queue.push(key_pair(&r));
            }
            Some((Watch::Ours, Ok(watcher::Event::Delete(r)))) => {
                let key = key_pair(&r);
                self.awaiting_collector.remove(&key);
                reconciler.forget(&r);
                self.written.remove(&key);
                self.queue.set_timer(&key, None);
            }
            Some((_, Ok(watcher::Event::InitDone))) => {
                // A re-list may have replaced what was cached; look at everything.
                self.requeue_all();
            }
            // A re-list shows the latest state, our writes included.
            Some((Watch::Ours, Ok(watcher::Event::Init))) => {
                self.written.clear();
                self.awaiting_collector.clear();
            }
            Some((Watch::Unclaimed, Ok(watcher::Event::Init))) => {}
            // The drain engine reports an apiserver that cannot be used, once.
            Some((_, Err(err))) => debug!(error = %err, "EvictionRequest watch failed; retrying"),
            None => anyhow::bail!("the EvictionRequest watch ended"),
        }
        Ok(())
    }

    pub(super) fn requeue_all(&mut self) {
        for key in self.cache.keys() {
            self.queue.push(key);
        }
    }

    /// This node's requester created `request` (the create's answer).
    pub(super) fn created(&mut self, request: EvictionRequest) {
        let key = key_pair(&request);
        let newer = |known: &EvictionRequest| rv_number(known) >= rv_number(&request);
        let known = self.cache.get(&key).is_some_and(|c| newer(&c))
            || self.written.get(&key).is_some_and(newer);
        if !known {
            self.written.insert(key.clone(), request);
            self.queue.push(key);
        }
    }
}

/// When to reconcile a request again after an error: after the apiserver's wait when it
/// throttled us (spread, so that a band's requests do not come back at once), else as
/// [`request_retry`] says.
fn retry_after_error(err: &anyhow::Error, shutdown: bool) -> Duration {
    match evict::anyhow_throttled(err) {
        Some(wait) => wait.mul_f64(1.0 + rand::random::<f64>()),
        None => request_retry(shutdown, rand::random::<f64>()),
    }
}
