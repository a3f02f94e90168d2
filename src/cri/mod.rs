//! The node's container runtime over the CRI v1 gRPC API (containerd, CRI-O).
//!
//! Only what the offline fallback needs: list pod sandboxes and containers, stop them, and
//! ask the runtime's version. Every call has a timeout and every error names the endpoint
//! and the container or sandbox it was about.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

pub mod v1;

use v1 as proto;
use v1::runtime_service_client::RuntimeServiceClient;

/// Sandbox labels the kubelet sets on every pod sandbox.
pub const LABEL_POD_NAME: &str = "io.kubernetes.pod.name";
pub const LABEL_POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const LABEL_POD_UID: &str = "io.kubernetes.pod.uid";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    Ready,
    NotReady,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

/// One pod sandbox as the runtime reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSandbox {
    pub id: String,
    /// From the sandbox labels, falling back to the sandbox metadata.
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub state: SandboxState,
    pub labels: BTreeMap<String, String>,
    pub annotations: BTreeMap<String, String>,
}

impl PodSandbox {
    /// `namespace/name`, the key the pod cache uses.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Container {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    pub state: ContainerState,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeVersion {
    pub runtime_name: String,
    pub runtime_version: String,
    pub runtime_api_version: String,
}

/// A failed runtime call, naming the endpoint and the object it was about.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("CRI endpoint {endpoint:?} is not usable: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("CRI {op}{} at {endpoint}: {status_code:?}: {message}", id_suffix(.id))]
    Call {
        endpoint: String,
        op: &'static str,
        id: Option<String>,
        status_code: tonic::Code,
        message: String,
    },
    #[error("CRI {op}{} at {endpoint}: no answer within {after:?}", id_suffix(.id))]
    Timeout {
        endpoint: String,
        op: &'static str,
        id: Option<String>,
        after: Duration,
    },
}

fn id_suffix(id: &Option<String>) -> String {
    id.as_deref().map(|i| format!(" {i}")).unwrap_or_default()
}

impl CriError {
    /// The runtime could not be reached at all (socket missing, daemon gone).
    pub(crate) fn is_unreachable(&self) -> bool {
        match self {
            CriError::Endpoint { .. } => true,
            CriError::Call { status_code, .. } => *status_code == tonic::Code::Unavailable,
            CriError::Timeout { .. } => false,
        }
    }

    /// The object no longer exists: for a stop, that is success.
    pub(crate) fn is_not_found(&self) -> bool {
        matches!(self, CriError::Call { status_code, .. } if *status_code == tonic::Code::NotFound)
    }
}

/// The runtime operations the fallback uses; the gRPC client implements it, tests fake it.
#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    fn endpoint(&self) -> &str;
    async fn version(&self) -> Result<RuntimeVersion, CriError>;
    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>, CriError>;
    /// Containers of one sandbox, or of every sandbox when `sandbox_id` is None.
    async fn list_containers(&self, sandbox_id: Option<&str>) -> Result<Vec<Container>, CriError>;
    /// SIGTERM (the image's stop signal), then SIGKILL once `grace` has passed; returns once
    /// the container has stopped. The CRI counts whole seconds, so `grace` is rounded up.
    async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError>;
    /// Stops whatever still runs in the sandbox and tears it down.
    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError>;
}

/// Timeouts of the gRPC client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CriTimeouts {
    /// Connecting to the socket.
    pub connect: Duration,
    /// Every call but StopContainer.
    pub call: Duration,
    /// Added to a StopContainer's grace period: the time a kill and its reaping may take.
    pub stop_slack: Duration,
}

impl Default for CriTimeouts {
    fn default() -> Self {
        CriTimeouts {
            connect: Duration::from_secs(2),
            call: Duration::from_secs(10),
            stop_slack: Duration::from_secs(10),
        }
    }
}

/// The CRI v1 runtime service over a unix socket.
#[derive(Clone)]
pub struct CriClient {
    endpoint: String,
    client: RuntimeServiceClient<Channel>,
    timeouts: CriTimeouts,
}

impl std::fmt::Debug for CriClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CriClient")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

/// The socket path of a `unix:///path` endpoint (a bare absolute path is accepted too).
pub(crate) fn socket_path(endpoint: &str) -> Result<PathBuf, CriError> {
    let bad = |reason: &str| CriError::Endpoint {
        endpoint: endpoint.to_string(),
        reason: reason.to_string(),
    };
    let path = match endpoint.strip_prefix("unix://") {
        Some(p) => p,
        None if endpoint.starts_with('/') => endpoint,
        None => return Err(bad("only unix:///path endpoints are supported")),
    };
    if !path.starts_with('/') {
        return Err(bad("the socket path must be absolute"));
    }
    Ok(PathBuf::from(path))
}

/// A lazily connecting channel to the runtime's socket: it dials on first use and again
/// after the runtime restarted, so a runtime that is down is an error per call, not a
/// construction failure.
pub(crate) fn channel(endpoint: &str, connect_timeout: Duration) -> Result<Channel, CriError> {
    let path = socket_path(endpoint)?;
    // The URI is required by tonic but never resolved: the connector dials the socket.
    let ep = Endpoint::from_static("http://cri.invalid")
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true);
    Ok(
        ep.connect_with_connector_lazy(tower::service_fn(move |_: Uri| {
            let path = path.clone();
            async move {
                let stream = tokio::net::UnixStream::connect(&path).await?;
                Ok::<_, std::io::Error>(TokioIo::new(stream))
            }
        })),
    )
}

impl CriClient {
    pub fn new(endpoint: &str, timeouts: CriTimeouts) -> Result<Self, CriError> {
        let ch = channel(endpoint, timeouts.connect)?;
        Ok(CriClient {
            endpoint: endpoint.to_string(),
            client: RuntimeServiceClient::new(ch),
            timeouts,
        })
    }

    /// The raw generated client, for calls outside [`Runtime`] (tests create pods with it).
    pub fn raw(&self) -> RuntimeServiceClient<Channel> {
        self.client.clone()
    }

    async fn call<T, F>(
        &self,
        op: &'static str,
        id: Option<&str>,
        after: Duration,
        fut: F,
    ) -> Result<T, CriError>
    where
        F: std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    {
        match tokio::time::timeout(after, fut).await {
            Ok(Ok(resp)) => Ok(resp.into_inner()),
            Ok(Err(status)) => Err(CriError::Call {
                endpoint: self.endpoint.clone(),
                op,
                id: id.map(str::to_string),
                status_code: status.code(),
                message: status.message().to_string(),
            }),
            Err(_) => Err(CriError::Timeout {
                endpoint: self.endpoint.clone(),
                op,
                id: id.map(str::to_string),
                after,
            }),
        }
    }
}

/// Whole seconds for the CRI, rounded up so a grace is never cut short.
pub(crate) fn grace_seconds(grace: Duration) -> i64 {
    let secs = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
    i64::try_from(secs).unwrap_or(i64::MAX)
}

fn sandbox_from_proto(s: proto::PodSandbox) -> PodSandbox {
    let meta = s.metadata.unwrap_or_default();
    let labels: BTreeMap<String, String> = s.labels.into_iter().collect();
    let pick = |label: &str, fallback: String| labels.get(label).cloned().unwrap_or(fallback);
    PodSandbox {
        name: pick(LABEL_POD_NAME, meta.name),
        namespace: pick(LABEL_POD_NAMESPACE, meta.namespace),
        uid: pick(LABEL_POD_UID, meta.uid),
        state: if s.state == proto::PodSandboxState::SandboxReady as i32 {
            SandboxState::Ready
        } else {
            SandboxState::NotReady
        },
        annotations: s.annotations.into_iter().collect(),
        labels,
        id: s.id,
    }
}

fn container_from_proto(c: proto::Container) -> Container {
    let state = match proto::ContainerState::try_from(c.state) {
        Ok(proto::ContainerState::ContainerCreated) => ContainerState::Created,
        Ok(proto::ContainerState::ContainerRunning) => ContainerState::Running,
        Ok(proto::ContainerState::ContainerExited) => ContainerState::Exited,
        _ => ContainerState::Unknown,
    };
    Container {
        id: c.id,
        sandbox_id: c.pod_sandbox_id,
        name: c.metadata.map(|m| m.name).unwrap_or_default(),
        state,
    }
}

#[async_trait]
impl Runtime for CriClient {
    fn endpoint(&self) -> &str {
        &self.endpoint
    }

    async fn version(&self) -> Result<RuntimeVersion, CriError> {
        let mut c = self.client.clone();
        let req = proto::VersionRequest {
            version: "v1".into(),
        };
        let v = self
            .call("Version", None, self.timeouts.call, c.version(req))
            .await?;
        Ok(RuntimeVersion {
            runtime_name: v.runtime_name,
            runtime_version: v.runtime_version,
            runtime_api_version: v.runtime_api_version,
        })
    }

    async fn list_pod_sandboxes(&self) -> Result<Vec<PodSandbox>, CriError> {
        let mut c = self.client.clone();
        let req = proto::ListPodSandboxRequest { filter: None };
        let resp = self
            .call(
                "ListPodSandbox",
                None,
                self.timeouts.call,
                c.list_pod_sandbox(req),
            )
            .await?;
        Ok(resp.items.into_iter().map(sandbox_from_proto).collect())
    }

    async fn list_containers(&self, sandbox_id: Option<&str>) -> Result<Vec<Container>, CriError> {
        let mut c = self.client.clone();
        let req = proto::ListContainersRequest {
            filter: sandbox_id.map(|id| proto::ContainerFilter {
                pod_sandbox_id: id.to_string(),
                ..Default::default()
            }),
        };
        let resp = self
            .call(
                "ListContainers",
                sandbox_id,
                self.timeouts.call,
                c.list_containers(req),
            )
            .await?;
        Ok(resp
            .containers
            .into_iter()
            .map(container_from_proto)
            .collect())
    }

    async fn stop_container(&self, id: &str, grace: Duration) -> Result<(), CriError> {
        let mut c = self.client.clone();
        let req = proto::StopContainerRequest {
            container_id: id.to_string(),
            timeout: grace_seconds(grace),
        };
        let after =
            Duration::from_secs(grace_seconds(grace).max(0) as u64) + self.timeouts.stop_slack;
        self.call("StopContainer", Some(id), after, c.stop_container(req))
            .await
            .map(|_| ())
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let mut c = self.client.clone();
        let req = proto::StopPodSandboxRequest {
            pod_sandbox_id: id.to_string(),
        };
        self.call(
            "StopPodSandbox",
            Some(id),
            self.timeouts.call,
            c.stop_pod_sandbox(req),
        )
        .await
        .map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_to_socket_paths() {
        assert_eq!(
            socket_path("unix:///run/containerd/containerd.sock").unwrap(),
            PathBuf::from("/run/containerd/containerd.sock")
        );
        assert_eq!(
            socket_path("/run/crio/crio.sock").unwrap(),
            PathBuf::from("/run/crio/crio.sock")
        );
        let err = socket_path("tcp://10.0.0.1:1234").unwrap_err();
        assert!(err.to_string().contains("tcp://10.0.0.1:1234"), "{err}");
        assert!(socket_path("unix://relative.sock").is_err());
    }

    #[test]
    fn grace_is_rounded_up_to_whole_seconds() {
        assert_eq!(grace_seconds(Duration::ZERO), 0);
        assert_eq!(grace_seconds(Duration::from_millis(1)), 1);
        assert_eq!(grace_seconds(Duration::from_secs(30)), 30);
        assert_eq!(grace_seconds(Duration::from_millis(2500)), 3);
    }

    #[test]
    fn sandbox_labels_win_over_metadata() {
        let s = proto::PodSandbox {
            id: "abc".into(),
            metadata: Some(proto::PodSandboxMetadata {
                name: "meta-name".into(),
                uid: "meta-uid".into(),
                namespace: "meta-ns".into(),
                attempt: 0,
            }),
            state: proto::PodSandboxState::SandboxNotready as i32,
            labels: [(LABEL_POD_NAME.to_string(), "web-0".to_string())]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        let s = sandbox_from_proto(s);
        assert_eq!(s.key(), "meta-ns/web-0");
        assert_eq!(s.uid, "meta-uid");
        assert_eq!(s.state, SandboxState::NotReady);
    }

    #[tokio::test]
    async fn an_absent_socket_is_an_error_naming_the_endpoint() {
        let dir = tempfile::tempdir().unwrap();
        let ep = format!("unix://{}/none.sock", dir.path().display());
        let cri = CriClient::new(&ep, CriTimeouts::default()).unwrap();
        let err = cri.list_pod_sandboxes().await.unwrap_err();
        assert!(err.is_unreachable(), "{err:?}");
        assert!(err.to_string().contains("none.sock"), "{err}");
        let err = cri
            .stop_container("c1", Duration::from_secs(1))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("c1"), "{err}");
    }
}
