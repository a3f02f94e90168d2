//! An in-process fake kube-apiserver over plain HTTP on 127.0.0.1, for tests and
//! `nodegrace-sim`.
//!
//! It implements the API semantics nodegrace depends on the way a real apiserver does:
//! one global, monotonically increasing resourceVersion; 409 on stale updates and failed
//! preconditions; list with label/field selectors and limit/continue; watch with bounded
//! history, 410 Gone (as an ERROR event) and bookmarks; JSON, merge, strategic merge patch
//! and server-side apply with per-manager field ownership on map-lists; the status
//! subresource; graceful pod deletion and finalizers; the eviction subresource with
//! PodDisruptionBudget arithmetic (429); CRD-driven discovery.
//!
//! Usage (tests and `nodegrace-sim`):
//! ```ignore
//! let cluster = FakeCluster::start().await?;           // 127.0.0.1:<free port>, ~60 ms
//! let client = cluster.client()?;                      // kube::Client, default_retry off
//! cluster.add_node("n1")?;
//! cluster.add_running_pod("default", "web-0", "n1", json!({"app": "web"}))?;
//! cluster.install_crd(&NodeMaintenance::crd())?;        // served at once; uninstall_crd(name)
//! let kubelet = cluster.kubelet(KubeletConfig::node("n1")); // finishes deleted pods
//! cluster.api.inject_errors(Some("POST"), "/api/v1/namespaces/*/pods/*/eviction", 429, 3);
//! cluster.api.delay(Some("GET"), "/api/v1/pods", Duration::from_secs(5)); // held back
//! cluster.api.set_reachable(false).await?;             // connection refused, watches cut
//! cluster.store.compact();                             // open watches get ERROR 410
//! let sent = cluster.api.writes();                     // what the apiserver received
//! ```
//!
//! Deliberate simplifications (each chosen so that client bugs stay visible):
//! - No authn/authz/admission webhooks, no CEL (`x-kubernetes-validations`) evaluation;
//!   CRD schemas are used for defaulting, pruning, types, `required`, `enum`, min/max and
//!   map-list key uniqueness only.
//! - `Store::serve_opaque_resource_versions` serves resourceVersions that are no numbers and
//!   whose text runs backwards (only equality may be relied on); `FakeApiServer::inject_watch_event`
//!   sends a watch event as given (an unknown type, an object without a resourceVersion);
//!   `Store::conflicts` lists the writes refused for a stale resourceVersion.
//! - Lists always serve the latest state; `resourceVersionMatch=Exact` for any other rv
//!   answers 410, and continue tokens page over the latest state (410 once compacted).
//! - A watch from a resourceVersion newer than the current one starts from "now"; the
//!   aggregated discovery format (`apidiscovery.k8s.io/v2`) is not served, only the
//!   legacy `/api`, `/apis` documents. `sendInitialEvents=true` is supported (synthetic
//!   ADDED events, then a bookmark with `k8s.io/initial-events-end`).
//! - The disruption controller runs synchronously after every pod/PDB write: expected
//!   pods = every pod the PDB selects (no scale lookups on controllers); a pod is healthy
//!   when Running, not terminating, and its Ready condition is True (or absent).
//! - No garbage collector (ownerReferences/propagationPolicy are stored, not acted on);
//!   namespace deletion does not cascade; no scheduler; `dryRun` is rejected with 400.
//! - events.k8s.io/v1 and core/v1 events are separate stores.
//! - Clients cannot edit `metadata.managedFields` (the server's own record wins).
//! - A pod deleted with a grace period stays (deletionTimestamp set) until a
//!   [`FakeKubelet`](super::fake_kubelet::FakeKubelet) finishes it; nothing else does.

mod http;
mod schema;
mod select;
mod ssa;
mod store;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

pub use http::{Fault, RecordedRequest};
pub use schema::{ListKind, Shape};
pub use select::{FieldSelector, LabelSelector};
pub use ssa::ManagerEntry;
pub use store::{
    fmt_time, pod_is_healthy, ApiError, DeleteOpts, EventType, Filter, ObjKey, PatchKind,
    ResourceInfo, Store, StoreEvent, WatchBatch,
};

use super::fake_kubelet::{FakeKubelet, KubeletConfig};

struct Accepting {
    token: CancellationToken,
    task: JoinHandle<()>,
}

struct ServerInner {
    shared: Arc<http::Shared>,
    addr: SocketAddr,
    accepting: tokio::sync::Mutex<Option<Accepting>>,
    root: CancellationToken,
}

impl Drop for ServerInner {
    fn drop(&mut self) {
        self.root.cancel();
    }
}

/// The HTTP server half. Cloning shares the same server; it stops when the last clone drops.
#[derive(Clone)]
pub struct FakeApiServer {
    inner: Arc<ServerInner>,
}

fn spawn_accept(
    shared: Arc<http::Shared>,
    listener: TcpListener,
    token: CancellationToken,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let stream = tokio::select! {
                _ = token.cancelled() => return,
                r = listener.accept() => match r {
                    Ok((s, _)) => s,
                    Err(_) => continue,
                },
            };
            let _ = stream.set_nodelay(true);
            let shared = shared.clone();
            let token = token.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| http::handle(shared.clone(), req));
                let conn = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc);
                tokio::select! {
                    _ = conn => {}
                    _ = token.cancelled() => {}
                }
            });
        }
    })
}

impl FakeApiServer {
    /// Listens on 127.0.0.1 on a free port and serves `store`.
    pub async fn start(store: Arc<Store>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the fake apiserver on 127.0.0.1")?;
        let addr = listener
            .local_addr()
            .context("reading the fake apiserver address")?;
        let shared = Arc::new(http::Shared {
            store,
            faults: Mutex::new(Vec::new()),
            latency: Mutex::new(Duration::ZERO),
            delays: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            address: addr.to_string(),
            stalled: Mutex::new(Vec::new()),
            injected_events: Mutex::new(Vec::new()),
        });
        let root = CancellationToken::new();
        let token = root.child_token();
        let task = spawn_accept(shared.clone(), listener, token.clone());
        Ok(Self {
            inner: Arc::new(ServerInner {
                shared,
                addr,
                accepting: tokio::sync::Mutex::new(Some(Accepting { token, task })),
                root,
            }),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.inner.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.inner.addr)
    }

    pub fn store(&self) -> &Arc<Store> {
        &self.inner.shared.store
    }

    /// A kube config pointing at this server (no TLS, no auth).
    ///
    /// `default_retry` is off: kube 5 otherwise retries 429/503/504 inside the client (up to
    /// 15 times, backing off to 1000 s), which hides eviction 429s from the caller. nodegrace's
    /// production client must make the same choice.
    pub fn kube_config(&self) -> Result<kube::Config> {
        let uri: ::http::Uri = self
            .url()
            .parse()
            .context("parsing the fake apiserver URL")?;
        let mut config = kube::Config::new(uri);
        config.default_retry = false;
        Ok(config)
    }

    /// A `kube::Client` for this server.
    pub fn client(&self) -> Result<kube::Client> {
        kube::Client::try_from(self.kube_config()?)
            .context("building a kube client for the fake apiserver")
    }

    /// A client standing for the kubelet's credential: its requests are recorded with the
    /// user agent [`KUBELET_AGENT`].
    pub fn kubelet_client(&self) -> Result<kube::Client> {
        let mut config = self.kube_config()?;
        config.headers.push((
            ::http::header::USER_AGENT,
            ::http::HeaderValue::from_static(KUBELET_AGENT),
        ));
        kube::Client::try_from(config).context("building a kube client for the fake apiserver")
    }

    /// Unreachable: the port is closed (connection refused) and every open connection,
    /// watches included, is cut. Reachable: listens again on the same port.
    pub async fn set_reachable(&self, reachable: bool) -> Result<()> {
        let mut accepting = self.inner.accepting.lock().await;
        match (reachable, accepting.take()) {
            (false, Some(a)) => {
                a.token.cancel();
                let _ = a.task.await;
            }
            (true, None) => {
                let listener = TcpListener::bind(self.inner.addr).await.with_context(|| {
                    format!("re-binding the fake apiserver on {}", self.inner.addr)
                })?;
                let token = self.inner.root.child_token();
                let task = spawn_accept(self.inner.shared.clone(), listener, token.clone());
                *accepting = Some(Accepting { token, task });
            }
            (_, a) => *accepting = a,
        }
        Ok(())
    }

    /// The next `count` requests whose path matches `path_glob` (`*` matches anything,
    /// slashes included) and whose method matches (any when None) fail with `status`.
    pub fn inject_errors(&self, method: Option<&str>, path_glob: &str, status: u16, count: usize) {
        if let Ok(mut f) = self.inner.shared.faults.lock() {
            f.push(Fault {
                method: method.map(String::from),
                path_glob: path_glob.to_string(),
                status,
                remaining: count,
                garbage: false,
            });
        }
    }

    /// The next `count` requests matching (as [`Self::inject_errors`]) get 200 and an HTML
    /// page: what a proxy in front of an apiserver sends when it cannot reach it.
    pub fn inject_garbage(&self, method: Option<&str>, path_glob: &str, count: usize) {
        if let Ok(mut f) = self.inner.shared.faults.lock() {
            f.push(Fault {
                method: method.map(String::from),
                path_glob: path_glob.to_string(),
                status: 200,
                remaining: count,
                garbage: true,
            });
        }
    }

    /// While on, watches of `plural` (open ones and new ones) stay open and send nothing, not
    /// even bookmarks: a watch hung mid-stream on a connection that lives. Lists still answer.
    pub fn stall_watches(&self, plural: &str, on: bool) {
        if let Ok(mut s) = self.inner.shared.stalled.lock() {
            s.retain(|p| p != plural);
            if on {
                s.push(plural.to_string());
            }
        }
    }

    /// The next watch of `plural` to send anything sends `event` first, once, as it is (a
    /// type no apiserver sends, an object without a resourceVersion), then goes on as before.
    pub fn inject_watch_event(&self, plural: &str, event: Value) {
        if let Ok(mut all) = self.inner.shared.injected_events.lock() {
            all.push((plural.to_string(), event));
        }
        self.inner.shared.store.poke_watches();
    }

    /// Drops the injected errors and delays.
    pub fn clear_faults(&self) {
        if let Ok(mut f) = self.inner.shared.faults.lock() {
            f.clear();
        }
        if let Ok(mut d) = self.inner.shared.delays.lock() {
            d.clear();
        }
    }

    /// Delay added before every request is handled (tokio time, so it pauses with tests).
    pub fn set_latency(&self, latency: Duration) {
        if let Ok(mut l) = self.inner.shared.latency.lock() {
            *l = latency;
        }
    }

    /// Requests whose path matches `path_glob` (as [`Self::inject_errors`]) and whose
    /// method matches (any when None) are handled `delay` later, on top of the latency.
    pub fn delay(&self, method: Option<&str>, path_glob: &str, delay: Duration) {
        if let Ok(mut d) = self.inner.shared.delays.lock() {
            d.push(http::Delay {
                method: method.map(String::from),
                path_glob: path_glob.to_string(),
                delay,
                held: 0,
                most_held: 0,
            });
        }
    }

    /// The most requests the delays given for `method` and `path_glob` held at once: how
    /// many such requests a client had in flight together.
    pub fn most_held(&self, method: Option<&str>, path_glob: &str) -> usize {
        self.inner
            .shared
            .delays
            .lock()
            .map(|d| {
                d.iter()
                    .filter(|d| d.method.as_deref() == method && d.path_glob == path_glob)
                    .map(|d| d.most_held)
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0)
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.inner
            .shared
            .log
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    pub fn clear_requests(&self) {
        if let Ok(mut l) = self.inner.shared.log.lock() {
            l.clear();
        }
    }

    /// Requests that change state (everything but GET), in order.
    pub fn writes(&self) -> Vec<RecordedRequest> {
        self.requests()
            .into_iter()
            .filter(|r| r.method != "GET")
            .collect()
    }
}

/// User agent of [`FakeApiServer::kubelet_client`].
pub const KUBELET_AGENT: &str = "test/kubelet-identity";

/// A fake cluster: the store, the HTTP server in front of it, and helpers for fixtures.
#[derive(Clone)]
pub struct FakeCluster {
    pub store: Arc<Store>,
    pub api: FakeApiServer,
}

impl FakeCluster {
    pub async fn start() -> Result<Self> {
        let store = Arc::new(Store::new());
        let api = FakeApiServer::start(store.clone()).await?;
        Ok(Self { store, api })
    }

    pub fn client(&self) -> Result<kube::Client> {
        self.api.client()
    }

    /// See [`FakeApiServer::kubelet_client`].
    pub fn kubelet_client(&self) -> Result<kube::Client> {
        self.api.kubelet_client()
    }

    /// nodegrace's and the kubelet's clients, as the daemon holds them.
    pub fn clients(&self) -> Result<nodegrace::Clients> {
        Ok(nodegrace::Clients {
            nodegrace: self.client()?,
            kubelet: self.kubelet_client()?,
            shared: false,
        })
    }

    /// Starts a fake kubelet for `node` (every node when None) on this cluster's store.
    pub fn kubelet(&self, config: KubeletConfig) -> FakeKubelet {
        FakeKubelet::start(self.store.clone(), config)
    }

    /// Creates a CRD object (serialisable `CustomResourceDefinition` or JSON); its
    /// resources are served at once.
    pub fn install_crd(&self, crd: &impl serde::Serialize) -> Result<Value> {
        let mut v = serde_json::to_value(crd).context("serialising the CRD")?;
        v["apiVersion"] = "apiextensions.k8s.io/v1".into();
        v["kind"] = "CustomResourceDefinition".into();
        self.store.insert_fixture(v).map_err(anyhow::Error::from)
    }

    /// Deletes a CRD and every object of it; its resources stop being served.
    pub fn uninstall_crd(&self, name: &str) -> Result<()> {
        let ri = self
            .store
            .find_resource("apiextensions.k8s.io", "v1", "customresourcedefinitions")
            .context("CRDs are not served")?;
        self.store.delete(&ri, "", name, &DeleteOpts::default())?;
        Ok(())
    }

    /// Inserts any object as-is, status included (fixtures; bypasses create-time resets).
    pub fn insert(&self, obj: &impl serde::Serialize) -> Result<Value> {
        let v = serde_json::to_value(obj).context("serialising the fixture")?;
        self.store.insert_fixture(v).map_err(anyhow::Error::from)
    }

    pub fn ensure_namespace(&self, name: &str) -> Result<()> {
        if self.store.get_obj("", "namespaces", "", name).is_none() {
            self.store.insert_fixture(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
            )?;
        }
        Ok(())
    }

    /// A Ready node with the usual labels.
    pub fn add_node(&self, name: &str) -> Result<Value> {
        self.insert(&json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
            "spec": {},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady"}]},
        }))
    }

    /// A Running, Ready pod bound to `node` (namespace created if missing).
    pub fn add_running_pod(
        &self,
        namespace: &str,
        name: &str,
        node: &str,
        labels: Value,
    ) -> Result<Value> {
        self.ensure_namespace(namespace)?;
        self.insert(&json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}]},
            "status": running_status(&self.store.now_str()),
        }))
    }
}

/// The status the fake kubelet gives a started pod.
/// The strings of a JSON array (non-strings skipped); empty when `v` is not an array.
pub(crate) fn str_list(v: Option<&Value>) -> Vec<&str> {
    v.and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

pub fn running_status(now: &str) -> Value {
    json!({
        "phase": "Running", "startTime": now,
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
            {"type": "Initialized", "status": "True", "lastTransitionTime": now},
            {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
            {"type": "Ready", "status": "True", "lastTransitionTime": now},
        ],
    })
}
