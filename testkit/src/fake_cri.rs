//! An in-memory CRI runtime for tests and `nodegrace-sim`: pod sandboxes with one
//! container each, which exit a chosen time after StopContainer (or at their grace, when
//! that is shorter, as a SIGKILL would end them). Time is tokio's.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use nodegrace::cri::{
    Container, ContainerState, CriError, PodSandbox, Runtime, RuntimeVersion, SandboxState,
};

const ENDPOINT: &str = "unix:///run/fake-cri.sock";

#[derive(Debug, Clone)]
struct FakePod {
    sandbox: PodSandbox,
    container: Container,
    exits_after: Duration,
}

/// What the runtime was asked to do, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CriCall {
    StopContainer { pod: String, grace: Duration },
    StopPodSandbox { pod: String },
}

#[derive(Debug, Default)]
struct Inner {
    pods: Vec<FakePod>,
    calls: Vec<CriCall>,
}

#[derive(Debug, Clone, Default)]
pub struct FakeRuntime {
    inner: Arc<Mutex<Inner>>,
}

fn lock(m: &Mutex<Inner>) -> std::sync::MutexGuard<'_, Inner> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl FakeRuntime {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a running pod whose container exits `exits_after` once asked to stop.
    pub fn add_pod(&self, namespace: &str, name: &str, uid: &str, exits_after: Duration) {
        let mut inner = lock(&self.inner);
        let n = inner.pods.len();
        let labels: BTreeMap<String, String> = [
            ("io.kubernetes.pod.name", name),
            ("io.kubernetes.pod.namespace", namespace),
            ("io.kubernetes.pod.uid", uid),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        inner.pods.push(FakePod {
            sandbox: PodSandbox {
                id: format!("sandbox-{n}"),
                name: name.into(),
                namespace: namespace.into(),
                uid: uid.into(),
                state: SandboxState::Ready,
                labels,
                annotations: BTreeMap::new(),
            },
            container: Container {
                id: format!("container-{n}"),
                sandbox_id: format!("sandbox-{n}"),
                name: "main".into(),
                state: ContainerState::Running,
            },
            exits_after,
        });
    }

    pub fn calls(&self) -> Vec<CriCall> {
        lock(&self.inner).calls.clone()
    }

    /// `namespace/name` of the pods whose container still runs.
    pub fn running(&self) -> Vec<String> {
        lock(&self.inner)
            .pods
            .iter()
            .filter(|p| p.container.state == ContainerState::Running)
            .map(|p| p.sandbox.key())
            .collect()
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
        Ok(lock(&self.inner)
            .pods
            .iter()
            .map(|p| p.sandbox.clone())
            .collect())
    }

    async fn list_containers(&self, sandbox_id: Option<&str>) -> Result<Vec<Container>, CriError> {
        Ok(lock(&self.inner)
            .pods
            .iter()
            .map(|p| p.container.clone())
            .filter(|c| sandbox_id.is_none_or(|s| c.sandbox_id == s))
            .collect())
    }

    async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        let wait = {
            let mut inner = lock(&self.inner);
            let Some(pod) = inner.pods.iter().find(|p| p.container.id == id).cloned() else {
                return Err(CriError::Call {
                    endpoint: ENDPOINT.into(),
                    op: "StopContainer",
                    id: Some(id.into()),
                    status_code: tonic::Code::NotFound,
                    message: "no such container".into(),
                });
            };
            inner.calls.push(CriCall::StopContainer {
                pod: pod.sandbox.key(),
                grace,
            });
            if pod.container.state == ContainerState::Running {
                pod.exits_after.min(grace)
            } else {
                Duration::ZERO
            }
        };
        tokio::time::sleep(wait).await;
        let mut inner = lock(&self.inner);
        if let Some(pod) = inner.pods.iter_mut().find(|p| p.container.id == id) {
            pod.container.state = ContainerState::Exited;
        }
        Ok(())
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut inner = lock(&self.inner);
        let key = inner
            .pods
            .iter()
            .find(|p| p.sandbox.id == id)
            .map(|p| p.sandbox.key());
        if let Some(pod) = key {
            inner.calls.push(CriCall::StopPodSandbox { pod });
        }
        for p in inner.pods.iter_mut().filter(|p| p.sandbox.id == id) {
            p.sandbox.state = SandboxState::NotReady;
            p.container.state = ContainerState::Exited;
        }
        Ok(())
    }
}
