//! An in-memory CRI runtime for tests and `nodegrace-sim`: pod sandboxes whose containers each
//! behave as told when asked to stop (exit after a while, ignore SIGTERM until their grace
//! ends, make the runtime fail, or never answer). Time is tokio's, so tests pause it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use nodegrace::{
    Container, ContainerState, CriError, PodSandbox, Runtime, RuntimeVersion, SandboxState,
    LABEL_POD_NAME, LABEL_POD_NAMESPACE, LABEL_POD_UID,
};

/// The endpoint the fake reports, and names in its errors.
pub const ENDPOINT: &str = "unix:///fake.sock";

/// What a container does once StopContainer asks it to stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Behaviour {
    /// Traps SIGTERM and exits this long after it (at its grace at the latest, as the
    /// runtime's SIGKILL would end it).
    ExitsAfter(Duration),
    /// Only SIGKILL ends it, at the end of its grace.
    IgnoresTerm,
    /// The runtime answers StopContainer with an error at once.
    Errors,
    /// The runtime never answers.
    Hangs,
}

/// What the runtime was asked to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CriCall {
    StopContainer { pod: String, grace: Duration },
    StopPodSandbox { pod: String },
}

/// What happened in the runtime, reported to the observer (see [`FakeRuntime::observe`]) the
/// moment it happens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CriEvent {
    StopRequested {
        /// `namespace/name` of the container's pod.
        pod: String,
        container: String,
        grace: Duration,
    },
    /// The container has exited (not sent when StopContainer failed or hangs).
    ContainerStopped {
        pod: String,
        container: String,
    },
    SandboxStopped {
        pod: String,
        sandbox: String,
    },
}

type Observer = Arc<dyn Fn(CriEvent) + Send + Sync>;

#[derive(Debug, Clone)]
struct FakeContainer {
    container: Container,
    behaviour: Behaviour,
}

#[derive(Default)]
struct Inner {
    sandboxes: Vec<PodSandbox>,
    containers: Vec<FakeContainer>,
    calls: Vec<CriCall>,
    unreachable: bool,
    sandbox_delay: Duration,
    observer: Option<Observer>,
}

#[derive(Clone, Default)]
pub struct FakeRuntime {
    inner: Arc<Mutex<Inner>>,
}

impl std::fmt::Debug for FakeRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = lock(&self.inner);
        f.debug_struct("FakeRuntime")
            .field("sandboxes", &inner.sandboxes)
            .field("containers", &inner.containers)
            .field("calls", &inner.calls)
            .finish_non_exhaustive()
    }
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn call_error(op: &'static str, id: Option<&str>, code: tonic::Code, message: &str) -> CriError {
    CriError::Call {
        endpoint: ENDPOINT.into(),
        op,
        id: id.map(str::to_string),
        status_code: code,
        message: message.into(),
    }
}

impl FakeRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a running pod with one container, `main`, that exits `exits_after` once asked
    /// to stop.
    pub fn add_pod(&self, namespace: &str, name: &str, uid: &str, exits_after: Duration) {
        let sandbox = self.add_sandbox(namespace, name, uid);
        self.add_container(&sandbox, "main", Behaviour::ExitsAfter(exits_after));
    }

    /// Adds a Ready sandbox labelled as the kubelet labels it; returns its id, `sb-<name>`
    /// unless a sandbox of another namespace has taken that.
    pub fn add_sandbox(&self, namespace: &str, name: &str, uid: &str) -> String {
        let labels: BTreeMap<String, String> = [
            (LABEL_POD_NAME, name),
            (LABEL_POD_NAMESPACE, namespace),
            (LABEL_POD_UID, uid),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let mut inner = lock(&self.inner);
        let mut id = format!("sb-{name}");
        if inner.sandboxes.iter().any(|s| s.id == id) {
            id = format!("sb-{name}-{}", inner.sandboxes.len());
        }
        inner.sandboxes.push(PodSandbox {
            id: id.clone(),
            name: name.into(),
            namespace: namespace.into(),
            uid: uid.into(),
            state: SandboxState::Ready,
            labels,
            annotations: BTreeMap::new(),
        });
        id
    }

    /// Sets annotation `key` on the sandbox `id`, as the kubelet copies a pod's annotations.
    pub fn annotate_sandbox(&self, id: &str, key: &str, value: &str) {
        let mut inner = lock(&self.inner);
        if let Some(s) = inner.sandboxes.iter_mut().find(|s| s.id == id) {
            s.annotations.insert(key.into(), value.into());
        }
    }

    /// Adds a running container `name` to a sandbox of [`Self::add_sandbox`]; its id is
    /// `<pod name>-<name>` (the sandbox id without `sb-`).
    pub fn add_container(&self, sandbox_id: &str, name: &str, behaviour: Behaviour) -> String {
        let mut inner = lock(&self.inner);
        let id = format!(
            "{}-{name}",
            sandbox_id.strip_prefix("sb-").unwrap_or(sandbox_id)
        );
        inner.containers.push(FakeContainer {
            container: Container {
                id: id.clone(),
                sandbox_id: sandbox_id.into(),
                name: name.into(),
                state: ContainerState::Running,
            },
            behaviour,
        });
        id
    }

    /// While set, listing sandboxes and containers fails as with a runtime that is down.
    pub fn set_unreachable(&self, unreachable: bool) {
        lock(&self.inner).unreachable = unreachable;
    }

    /// StopPodSandbox takes this long.
    pub fn set_sandbox_delay(&self, delay: Duration) {
        lock(&self.inner).sandbox_delay = delay;
    }

    /// Calls `f` with every [`CriEvent`] as it happens, e.g. to put it on a test's timeline
    /// beside the events of other fakes.
    pub fn observe(&self, f: impl Fn(CriEvent) + Send + Sync + 'static) {
        lock(&self.inner).observer = Some(Arc::new(f));
    }

    pub fn calls(&self) -> Vec<CriCall> {
        lock(&self.inner).calls.clone()
    }

    /// `namespace/name` of the pods with a container that still runs.
    pub fn running(&self) -> Vec<String> {
        let inner = lock(&self.inner);
        inner
            .sandboxes
            .iter()
            .filter(|s| {
                inner.containers.iter().any(|c| {
                    c.container.sandbox_id == s.id && c.container.state == ContainerState::Running
                })
            })
            .map(PodSandbox::key)
            .collect()
    }

    fn pod_of(inner: &Inner, sandbox_id: &str) -> String {
        inner
            .sandboxes
            .iter()
            .find(|s| s.id == sandbox_id)
            .map_or_else(String::new, PodSandbox::key)
    }

    /// The state, or the error of a runtime that is down for `op`.
    fn reachable(&self, op: &'static str) -> Result<std::sync::MutexGuard<'_, Inner>, CriError> {
        let inner = lock(&self.inner);
        if inner.unreachable {
            return Err(call_error(
                op,
                None,
                tonic::Code::Unavailable,
                "connection refused",
            ));
        }
        Ok(inner)
    }

    fn emit(&self, event: CriEvent) {
        let observer = lock(&self.inner).observer.clone();
        if let Some(f) = observer {
            f(event);
        }
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    fn endpoint(&self) -> &str {
        ENDPOINT
    }

    async fn version(&self) -> Result<RuntimeVersion, CriError> {
        Ok(RuntimeVersion {
            runtime_name: "fake".into(),
            runtime_version: "0".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>, CriError> {
        Ok(self.reachable("ListPodSandbox")?.sandboxes.clone())
    }

    async fn list_containers(&self, sandbox_id: Option<&str>) -> Result<Vec<Container>, CriError> {
        Ok(self
            .reachable("ListContainers")?
            .containers
            .iter()
            .map(|c| c.container.clone())
            .filter(|c| sandbox_id.is_none_or(|s| c.sandbox_id == s))
            .collect())
    }

    async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        let (pod, container, behaviour) = {
            let mut inner = lock(&self.inner);
            let Some(c) = inner
                .containers
                .iter()
                .find(|c| c.container.id == id)
                .cloned()
            else {
                return Err(call_error(
                    "StopContainer",
                    Some(id),
                    tonic::Code::NotFound,
                    "no such container",
                ));
            };
            let pod = Self::pod_of(&inner, &c.container.sandbox_id);
            inner.calls.push(CriCall::StopContainer {
                pod: pod.clone(),
                grace,
            });
            (pod, c.container, c.behaviour)
        };
        self.emit(CriEvent::StopRequested {
            pod: pod.clone(),
            container: id.into(),
            grace,
        });
        if container.state == ContainerState::Running {
            match behaviour {
                Behaviour::ExitsAfter(d) => tokio::time::sleep(d.min(grace)).await,
                Behaviour::IgnoresTerm => tokio::time::sleep(grace).await,
                Behaviour::Errors => {
                    return Err(call_error(
                        "StopContainer",
                        Some(id),
                        tonic::Code::Internal,
                        "runc did not terminate successfully",
                    ))
                }
                Behaviour::Hangs => futures::future::pending::<()>().await,
            }
        }
        if let Some(c) = lock(&self.inner)
            .containers
            .iter_mut()
            .find(|c| c.container.id == id)
        {
            c.container.state = ContainerState::Exited;
        }
        self.emit(CriEvent::ContainerStopped {
            pod,
            container: id.into(),
        });
        Ok(())
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let (pod, delay) = {
            let mut inner = lock(&self.inner);
            let pod = Self::pod_of(&inner, id);
            if !pod.is_empty() {
                inner
                    .calls
                    .push(CriCall::StopPodSandbox { pod: pod.clone() });
            }
            (pod, inner.sandbox_delay)
        };
        tokio::time::sleep(delay).await;
        {
            let mut inner = lock(&self.inner);
            for s in inner.sandboxes.iter_mut().filter(|s| s.id == id) {
                s.state = SandboxState::NotReady;
            }
            for c in inner
                .containers
                .iter_mut()
                .filter(|c| c.container.sandbox_id == id)
            {
                c.container.state = ContainerState::Exited;
            }
        }
        self.emit(CriEvent::SandboxStopped {
            pod,
            sandbox: id.into(),
        });
        Ok(())
    }
}
