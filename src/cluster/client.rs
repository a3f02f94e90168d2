//! Apiserver clients for the node's two identities: nodegrace's own (`node.kubeconfig`,
//! `nodegrace:node:<node>`) for the Node, NodeMaintenances, EvictionRequests and events, and
//! the kubelet's (`node.kubelet_kubeconfig`, `system:node:<node>`) for what NodeRestriction
//! confines to the node's own pods: evictions and DELETEs (packaging/rbac/README.md).
//!
//! A daemon client follows its kubeconfig ([`ReloadingClient`]): a renewed certificate, the
//! kubelet's rotated one or an operator's fix is used from the next request on, without a
//! restart and without dropping what is in flight.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use http::{HeaderName, HeaderValue};

use crate::cluster::bounded::BoundedLayer;
use crate::cluster::kubeconfig::{without_text, KubeconfigFile};
use crate::config::Settings;

/// Sent with every request, so that audit logs tell nodegrace's requests under the kubelet's
/// identity from the kubelet's own.
pub(crate) const USER_AGENT: &str = concat!("nodegrace/", env!("CARGO_PKG_VERSION"));

/// How often a daemon client looks at its kubeconfig's files for a change.
pub(crate) const RELOAD_CHECK: Duration = Duration::from_secs(60);

/// Which identity a client holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// nodegrace's own identity, `node.kubeconfig`.
    Nodegrace,
    /// The kubelet's identity, `node.kubelet_kubeconfig`.
    Kubelet,
}

impl Role {
    /// The role's name in metric labels.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Nodegrace => "nodegrace",
            Role::Kubelet => "kubelet",
        }
    }

    /// The configuration key of the kubeconfig.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Role::Nodegrace => "node.kubeconfig",
            Role::Kubelet => "node.kubelet_kubeconfig",
        }
    }

    /// "nodegrace's credential" / "the kubelet's credential".
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Role::Nodegrace => "nodegrace's credential",
            Role::Kubelet => "the kubelet's credential",
        }
    }

    /// The kubeconfig of this role under `settings`; None means in-cluster config or
    /// `$KUBECONFIG` (nodegrace's), or the same as nodegrace's (the kubelet's).
    pub(crate) fn path(self, settings: &Settings) -> Option<&Path> {
        match self {
            Role::Nodegrace => settings.node.kubeconfig.as_deref(),
            Role::Kubelet => settings
                .node
                .kubelet_kubeconfig
                .as_deref()
                .or(settings.node.kubeconfig.as_deref()),
        }
    }
}

/// Timeouts of a client. `read`, when given, bounds every read, which suits one-shot CLI
/// requests but would cut the daemon's long-running watches. `answer`, when given, bounds
/// the whole answer (headers and body) of every request but a watch.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub read: Option<Duration>,
    pub answer: Option<Duration>,
}

/// A client for `role`'s kubeconfig at `path` (None: in-cluster config or `$KUBECONFIG`).
pub(crate) async fn client_for(
    path: Option<&Path>,
    role: Role,
    timeouts: Timeouts,
) -> Result<kube::Client> {
    build(
        path,
        &format!("{} ({})", role.key(), role.describe()),
        timeouts,
    )
    .await
}

/// A client for the kubeconfig at `path`, which `what` names in errors.
pub async fn build(path: Option<&Path>, what: &str, timeouts: Timeouts) -> Result<kube::Client> {
    let mut config = match path {
        Some(path) => {
            let file = KubeconfigFile::read(path).with_context(|| what.to_owned())?;
            kube::Config::from_custom_kubeconfig(
                file.config,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .with_context(|| format!("cannot use kubeconfig {} ({what})", path.display()))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            let parse = std::error::Error::source(&e)
                .and_then(|s| s.downcast_ref::<kube::config::KubeconfigError>())
                .and_then(without_text);
            match parse {
                Some(why) => anyhow::anyhow!("$KUBECONFIG ({what}) is not a kubeconfig: {why}"),
                None => anyhow::Error::new(e).context(format!(
                    "no kubeconfig ({what}: none given, no in-cluster config, no $KUBECONFIG)"
                )),
            }
        })?,
    };
    // kube retries 429/503/504 inside the client by default, for up to many minutes: a PDB
    // refusing an eviction must come back to the drain loop at once, which backs off itself.
    config.default_retry = false;
    config.connect_timeout = Some(timeouts.connect);
    if let Some(read) = timeouts.read {
        config.read_timeout = Some(read);
        config.write_timeout = Some(read);
    }
    config.headers.push((
        HeaderName::from_static("user-agent"),
        HeaderValue::from_static(USER_AGENT),
    ));
    over_http2(config, timeouts.answer).context("cannot build the apiserver client")
}

/// How often an HTTP/2 connection with nothing received is pinged (busy or idle), and how long
/// the answer may take before the connection counts as dead (client-go's values).
const HTTP2_PING_INTERVAL: Duration = Duration::from_secs(30);
const HTTP2_PING_TIMEOUT: Duration = Duration::from_secs(15);

/// The client kube would build from `config`, but speaking HTTP/2 where the apiserver offers
/// it (kube's own speaks HTTP/1.1 only). Over HTTP/1.1 every request in flight needs a
/// connection of its own: a band of evictions opened one TLS connection per pod at the
/// apiserver just when it is busiest, and every watch held one for good. Over HTTP/2 one
/// connection per identity carries the watches and a whole band's requests, as client-go's
/// does. Plain `http://` endpoints stay HTTP/1.1.
fn over_http2(config: kube::Config, answer: Option<Duration>) -> Result<kube::Client> {
    use hyper_util::client::legacy::connect::HttpConnector;
    use hyper_util::rt::{TokioExecutor, TokioTimer};
    use kube::client::ConfigExt;
    use tower::ServiceBuilder;

    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // Many streams share the connection: a small frame must not wait for the previous one's
    // acknowledgement (Nagle's algorithm against delayed ACKs).
    http.set_nodelay(true);
    let tls = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config.rustls_client_config()?)
        .https_or_http();
    let tls = match &config.tls_server_name {
        Some(name) => {
            let name = rustls_pki_types::ServerName::try_from(name.clone())
                .with_context(|| format!("invalid tls-server-name {name:?}"))?;
            tls.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name))
        }
        None => tls,
    };
    let mut connector = hyper_timeout::TimeoutConnector::new(
        tls.enable_http1().enable_http2().wrap_connector(http),
    );
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    // Idleness is the apiserver's to judge (it closes a connection idle for 90 s; the
    // shutdown opens the evicting identity's again ahead of its requests, see
    // `PodTerminator::connect`); the pings find a dead connection, busy or idle.
    let transport = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
        .timer(TokioTimer::new())
        .pool_idle_timeout(None)
        .http2_keep_alive_interval(HTTP2_PING_INTERVAL)
        .http2_keep_alive_timeout(HTTP2_PING_TIMEOUT)
        .http2_keep_alive_while_idle(true)
        .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .layer(BoundedLayer { deadline: answer })
        .service(transport);
    Ok(kube::Client::new(service, config.default_namespace))
}

/// A one-shot client for `node.kubeconfig` (the CLI's commands).
pub(crate) async fn client(
    settings: &Settings,
    connect_timeout: Duration,
    read_timeout: Option<Duration>,
) -> Result<kube::Client> {
    client_for(
        Role::Nodegrace.path(settings),
        Role::Nodegrace,
        Timeouts {
            connect: connect_timeout,
            read: read_timeout,
            answer: read_timeout,
        },
    )
    .await
}

/// The apiserver URL the client of `settings` talks to, for logs ("in-cluster or
/// $KUBECONFIG" when the configuration does not say).
pub(crate) fn endpoint(settings: &Settings) -> String {
    settings
        .node
        .kubeconfig
        .as_ref()
        .and_then(|path| KubeconfigFile::read(path).ok())
        .and_then(|f| f.server().map(str::to_owned))
        .unwrap_or_else(|| "in-cluster or $KUBECONFIG".to_string())
}

/// The user and groups the apiserver authenticates `client` as (a SelfSubjectReview,
/// which every authenticated identity may create).
pub(crate) async fn identity(client: &kube::Client) -> kube::Result<(String, Vec<String>)> {
    use k8s_openapi::api::authentication::v1::SelfSubjectReview;
    let api: kube::Api<SelfSubjectReview> = kube::Api::all(client.clone());
    let review = api
        .create(
            &kube::api::PostParams::default(),
            &SelfSubjectReview::default(),
        )
        .await?;
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    Ok((
        user.username.unwrap_or_default(),
        user.groups.unwrap_or_default(),
    ))
}

/// The two clients the daemon acts with.
#[derive(Clone)]
pub struct Clients {
    /// nodegrace's own identity.
    pub nodegrace: kube::Client,
    /// The kubeconfig's identity that evicts and deletes the node's pods: the kubelet's.
    pub kubelet: kube::Client,
    /// Both are the same client (`node.kubelet_kubeconfig` is empty, or a test).
    pub shared: bool,
}

impl From<kube::Client> for Clients {
    /// One client for everything (tests, and `node.kubelet_kubeconfig = ""`).
    fn from(client: kube::Client) -> Self {
        Clients {
            nodegrace: client.clone(),
            kubelet: client,
            shared: true,
        }
    }
}

/// (device, inode, mtime seconds, mtime nanoseconds, size) of a file.
type FileStamp = (u64, u64, i64, i64, u64);

/// The files a kubeconfig reads and what they were when last looked at.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Fingerprint(Vec<(PathBuf, Option<FileStamp>)>);

fn fingerprint(path: &Path) -> Fingerprint {
    use std::os::unix::fs::MetadataExt;
    let files = KubeconfigFile::read(path)
        .map(|f| f.files())
        .unwrap_or_else(|_| vec![path.to_owned()]);
    Fingerprint(
        files
            .into_iter()
            .map(|f| {
                let meta = std::fs::metadata(&f)
                    .ok()
                    .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec(), m.size()));
                (f, meta)
            })
            .collect(),
    )
}

/// Where the current inner client is published: the file watch alone replaces it.
type Current = tokio::sync::watch::Sender<kube::Client>;

/// What the file watch needs to build, check and publish a new inner client.
struct Reloading {
    path: PathBuf,
    role: Role,
    timeouts: Timeouts,
    /// Checks a reloaded client before it replaces the current one.
    accept:
        Box<dyn Fn(kube::Client) -> futures::future::BoxFuture<'static, Result<()>> + Send + Sync>,
}

/// Forwards every request to the current inner client.
#[derive(Clone)]
struct Forward(tokio::sync::watch::Receiver<kube::Client>);

impl tower::Service<http::Request<kube::client::Body>> for Forward {
    type Response = http::Response<kube::client::Body>;
    type Error = kube::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, kube::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<kube::client::Body>) -> Self::Future {
        let inner = self.0.borrow().clone();
        Box::pin(async move { inner.send(request).await })
    }
}

/// A client whose credential follows the kubeconfig file: every [`RELOAD_CHECK`] the
/// kubeconfig and the files it names are looked at (a stat each), and when one changed a
/// new inner client is built, checked with `accept` and swapped in. Requests already under
/// way finish on the old one. A kubeconfig that cannot be used keeps the current client
/// (and is said once).
pub(crate) struct ReloadingClient {
    client: kube::Client,
}

impl ReloadingClient {
    pub(crate) async fn new<A, F>(
        path: &Path,
        role: Role,
        timeouts: Timeouts,
        accept: A,
    ) -> Result<Self>
    where
        A: Fn(kube::Client) -> F + Send + Sync + 'static,
        F: std::future::Future<Output = Result<()>> + Send + 'static,
    {
        let seen = fingerprint_blocking(path.to_owned()).await;
        let inner = client_for(Some(path), role, timeouts).await?;
        let namespace = inner.default_namespace().to_owned();
        let (current, forward) = tokio::sync::watch::channel(inner);
        let reloading = Reloading {
            path: path.to_owned(),
            role,
            timeouts,
            accept: Box::new(move |c| Box::pin(accept(c))),
        };
        let client = kube::Client::new(Forward(forward), namespace);
        tokio::spawn(watch_files(reloading, current, seen));
        Ok(ReloadingClient { client })
    }

    /// The client to use (clones share the reloading).
    pub(crate) fn client(&self) -> kube::Client {
        self.client.clone()
    }
}

async fn fingerprint_blocking(path: PathBuf) -> Fingerprint {
    tokio::task::spawn_blocking(move || fingerprint(&path))
        .await
        .unwrap_or_default()
}

/// Until every clone of the client is gone.
async fn watch_files(state: Reloading, current: Current, mut seen: Fingerprint) {
    // The last reload error said, so it is not repeated every check.
    let mut last_error = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(RELOAD_CHECK) => {}
            () = current.closed() => return,
        }
        check(&state, &current, &mut seen, &mut last_error).await;
    }
}

async fn check(
    state: &Reloading,
    current: &Current,
    seen: &mut Fingerprint,
    last_error: &mut Option<String>,
) {
    let now = fingerprint_blocking(state.path.clone()).await;
    if *seen == now {
        return;
    }
    let attempt = async {
        let fresh = client_for(Some(&state.path), state.role, state.timeouts).await?;
        (state.accept)(fresh.clone()).await?;
        anyhow::Ok(fresh)
    };
    match attempt.await {
        Ok(fresh) => {
            current.send_replace(fresh);
            *seen = now;
            *last_error = None;
            tracing::info!(kubeconfig = %state.path.display(), key = state.role.key(), "the kubeconfig changed: using its new credential");
        }
        Err(err) => {
            let text = crate::cluster::error_text(&err);
            if last_error.as_deref() != Some(text.as_str()) {
                tracing::error!(kubeconfig = %state.path.display(), key = state.role.key(), error = %text, "the kubeconfig changed but cannot be used: keeping the credential in use");
                *last_error = Some(text);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(namespace: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\n    namespace: {namespace}\ncurrent-context: x\nusers:\n- name: u\n  user:\n    token: t\n"
        )
    }

    const TIMEOUTS: Timeouts = Timeouts {
        connect: Duration::from_secs(1),
        read: None,
        answer: None,
    };

    /// The credential follows the file: a changed kubeconfig that `accept` refuses keeps
    /// the client in use (and is said once); one it takes is swapped in.
    #[tokio::test]
    async fn a_changed_kubeconfig_is_taken_once_accepted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, kubeconfig("first")).expect("write");
        let inner = client_for(Some(&path), Role::Nodegrace, TIMEOUTS)
            .await
            .expect("client");
        let (current, mut seen_by_requests) = tokio::sync::watch::channel(inner);
        let refuse = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let refusing = refuse.clone();
        let state = Reloading {
            path: path.clone(),
            role: Role::Nodegrace,
            timeouts: TIMEOUTS,
            accept: Box::new(move |_| {
                let refused = refusing.load(std::sync::atomic::Ordering::SeqCst);
                Box::pin(async move {
                    if refused {
                        anyhow::bail!("refused")
                    }
                    Ok(())
                })
            }),
        };
        let mut seen = fingerprint(&path);
        let mut last_error = None;

        check(&state, &current, &mut seen, &mut last_error).await;
        assert!(
            !seen_by_requests.has_changed().expect("open"),
            "unchanged file"
        );

        std::fs::write(&path, kubeconfig("second-namespace")).expect("write");
        check(&state, &current, &mut seen, &mut last_error).await;
        assert!(!seen_by_requests.has_changed().expect("open"), "refused");
        assert!(last_error.is_some());

        refuse.store(false, std::sync::atomic::Ordering::SeqCst);
        check(&state, &current, &mut seen, &mut last_error).await;
        assert_eq!(
            seen_by_requests.borrow_and_update().default_namespace(),
            "second-namespace"
        );
        assert!(last_error.is_none());
        assert_eq!(seen, fingerprint(&path));
    }
}
