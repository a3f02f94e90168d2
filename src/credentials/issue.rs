//! Issuing nodegrace's identity on a node: a key made here, a CertificateSigningRequest
//! (signer `kubernetes.io/kube-apiserver-client`, CN `nodegrace:node:<node>`, O
//! `nodegrace:nodes`) made with the kubelet's credential, so the apiserver records
//! `system:node:<node>` as its requester, and once an administrator (or an approver) has
//! approved it and the signer has issued the certificate, a kubeconfig written 0600.
//!
//! The key waits in `<kubeconfig>.pending-key` (0600) and names the request (a hash of its
//! public key), so a command or daemon that stops while waiting picks the same request up
//! again instead of leaving one behind per attempt.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestSpec,
};
use k8s_openapi::ByteString;
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use rcgen::PublicKeyData;

use crate::cluster::gateway::{self, Kind};
use crate::cluster::identity::{NODEGRACE_GROUP, NODEGRACE_USER_PREFIX};
use crate::cluster::kubeconfig::{render, CertInfo, KubeconfigFile};
use crate::fsutil::{read_regular, Symlinks, CONFIG_FILE_LIMIT};

/// The signer of client certificates the apiserver accepts (kube-controller-manager signs
/// them with the cluster CA).
pub(crate) const SIGNER: &str = "kubernetes.io/kube-apiserver-client";
/// What an ECDSA client certificate is for.
pub(crate) const USAGES: [&str; 2] = ["digital signature", "client auth"];

/// How long one request of the credential flow (not the watch for the approval) may take to
/// be answered in full.
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// What to issue and where.
#[derive(Debug, Clone)]
pub(crate) struct Issue {
    pub node: String,
    /// Where the kubeconfig goes (`node.kubeconfig`).
    pub kubeconfig: PathBuf,
    /// The cluster (server, CA) comes from here when `kubeconfig` has none yet
    /// (`node.kubelet_kubeconfig`).
    pub template: Option<PathBuf>,
    /// `expirationSeconds` of the request.
    pub lifetime: Duration,
}

impl Issue {
    pub(crate) fn user(&self) -> String {
        format!("{NODEGRACE_USER_PREFIX}{}", self.node)
    }

    pub(crate) fn pending_key_path(&self) -> PathBuf {
        let mut name = self
            .kubeconfig
            .file_name()
            .map(|n| n.to_os_string())
            .unwrap_or_default();
        name.push(".pending-key");
        self.kubeconfig.with_file_name(name)
    }
}

/// The request was refused: a new one is needed, by someone's decision.
#[derive(Debug, thiserror::Error)]
#[error("CertificateSigningRequest {name} for {user} was {verdict} ({reason}: {message}); {todo}")]
pub(crate) struct Refused {
    pub name: String,
    pub user: String,
    /// "denied" or "not signed".
    pub verdict: &'static str,
    pub reason: String,
    pub message: String,
    pub todo: &'static str,
}

/// The request's name: unique to the key, so nothing another node made can be mistaken for
/// it, and short enough for any node name.
pub(crate) fn request_name(node: &str, key: &rcgen::KeyPair) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, &key.subject_public_key_info());
    let hex: String = digest.as_ref()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let mut node = node.to_owned();
    node.truncate(200);
    let node = node.trim_end_matches(['-', '.']);
    format!("nodegrace-{node}-{hex}")
}

/// The PEM CertificateSigningRequest for `node`'s identity with `key`.
pub fn request_pem(node: &str, key: &rcgen::KeyPair) -> Result<String> {
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new())
        .context("building the certificate request")?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, NODEGRACE_GROUP);
    params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("{NODEGRACE_USER_PREFIX}{node}"),
    );
    params
        .serialize_request(key)
        .and_then(|r| r.pem())
        .context("signing the certificate request")
}

/// The key waiting for its certificate, made (and stored 0600) when there is none.
pub(crate) fn pending_key(issue: &Issue) -> Result<rcgen::KeyPair> {
    let path = issue.pending_key_path();
    match read_regular(&path, CONFIG_FILE_LIMIT, Symlinks::Refuse) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes)
                .with_context(|| format!("{} is not UTF-8", path.display()))?;
            return rcgen::KeyPair::from_pem(&text)
                .with_context(|| format!("{} holds no usable private key", path.display()));
        }
        Err(crate::fsutil::ReadError::NotFound) => {}
        Err(err) => return Err(err).with_context(|| format!("reading {}", path.display())),
    }
    let key = rcgen::KeyPair::generate().context("generating a key")?;
    crate::fsutil::write_atomic(&path, key.serialize_pem().as_bytes(), 0o600)
        .with_context(|| format!("storing the new key in {}", path.display()))?;
    Ok(key)
}

fn condition<'a>(csr: &'a CertificateSigningRequest, kind: &str) -> Option<(&'a str, &'a str)> {
    csr.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == kind && c.status == "True")
        .map(|c| {
            (
                c.reason.as_deref().unwrap_or_default(),
                c.message.as_deref().unwrap_or_default(),
            )
        })
}

fn refused(issue: &Issue, csr: &CertificateSigningRequest) -> Option<Refused> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    let (verdict, (reason, message), todo) = if let Some(d) = condition(csr, "Denied") {
        (
            "denied",
            d,
            "ask the cluster's administrators why, then request again",
        )
    } else if let Some(f) = condition(csr, "Failed") {
        (
            "not signed",
            f,
            "the signer refused it (kube-controller-manager --cluster-signing-cert-file); request again once that is fixed",
        )
    } else {
        return None;
    };
    Some(Refused {
        name,
        user: issue.user(),
        verdict,
        reason: reason.to_owned(),
        message: message.to_owned(),
        todo,
    })
}

/// What [`submit`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Submitted {
    Created(String),
    /// Made earlier (by this command or the daemon) and still pending or approved.
    Existing(String),
}

impl Submitted {
    pub(crate) fn name(&self) -> &str {
        match self {
            Submitted::Created(n) | Submitted::Existing(n) => n,
        }
    }
}

/// Creates the request for `key` with `kubelet` (the kubelet's client), or finds the one
/// made earlier. A denied or failed earlier request is [`Refused`] and its key dropped, so
/// that the next attempt is a new request.
pub(crate) async fn submit(
    kubelet: &kube::Client,
    issue: &Issue,
    key: &rcgen::KeyPair,
) -> Result<Submitted> {
    let api: Api<CertificateSigningRequest> = Api::all(kubelet.clone());
    let name = request_name(&issue.node, key);
    let spki = key.subject_public_key_info();
    for _ in 0..3 {
        if let Some(existing) = api
            .get_opt(&name)
            .await
            .with_context(|| format!("reading CertificateSigningRequest {name}"))?
        {
            if !request_matches(&existing, &spki) {
                bail!("CertificateSigningRequest {name} exists but is not this node's request for its key; remove {} and try again", issue.pending_key_path().display());
            }
            if let Some(r) = refused(issue, &existing) {
                let _ = std::fs::remove_file(issue.pending_key_path());
                return Err(r.into());
            }
            return Ok(Submitted::Existing(name));
        }
        let csr = CertificateSigningRequest {
            metadata: kube::api::ObjectMeta {
                name: Some(name.clone()),
                labels: Some(
                    [("app.kubernetes.io/name".to_owned(), "nodegrace".to_owned())].into(),
                ),
                ..Default::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(request_pem(&issue.node, key)?.into_bytes()),
                signer_name: SIGNER.to_owned(),
                usages: Some(USAGES.iter().map(|u| u.to_string()).collect()),
                expiration_seconds: Some(
                    i32::try_from(issue.lifetime.as_secs()).unwrap_or(i32::MAX),
                ),
                ..Default::default()
            },
            status: None,
        };
        match gateway::reply(api.create(&PostParams::default(), &csr).await) {
            Ok(_) => return Ok(Submitted::Created(name)),
            // Made meanwhile (by a daemon or command racing this one): read it again.
            Err(f) if f.is(Kind::Conflict) => continue,
            Err(f) => {
                return Err(f.error).with_context(|| {
                    format!(
                        "creating CertificateSigningRequest {name} with the kubelet's credential"
                    )
                })
            }
        }
    }
    bail!("CertificateSigningRequest {name} kept changing; try again")
}

/// Whether `csr` asks for a certificate of the key whose SubjectPublicKeyInfo is `spki`.
fn request_matches(csr: &CertificateSigningRequest, spki: &[u8]) -> bool {
    use x509_parser::prelude::FromDer;
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(&csr.spec.request.0) else {
        return false;
    };
    x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
        .is_ok_and(|(_, r)| r.certification_request_info.subject_pki.raw == spki)
}

/// Waits (watching the request) until its certificate is issued, it is refused, or
/// `timeout` passes (`Ok(None)`).
pub(crate) async fn wait_issued(
    kubelet: &kube::Client,
    issue: &Issue,
    name: &str,
    timeout: Option<Duration>,
) -> Result<Option<String>> {
    let api: Api<CertificateSigningRequest> = Api::all(kubelet.clone());
    let done = |csr: Option<&CertificateSigningRequest>| {
        csr.is_none_or(|c| {
            condition(c, "Denied").is_some()
                || condition(c, "Failed").is_some()
                || c.status
                    .as_ref()
                    .and_then(|s| s.certificate.as_ref())
                    .is_some_and(|b| !b.0.is_empty())
        })
    };
    let wait = await_condition(api, name, done);
    let csr = match timeout {
        Some(t) => match tokio::time::timeout(t, wait).await {
            Ok(r) => r,
            Err(_) => return Ok(None),
        },
        None => wait.await,
    }
    .with_context(|| format!("watching CertificateSigningRequest {name}"))?;
    let Some(csr) = csr else {
        bail!("CertificateSigningRequest {name} was deleted before it was approved (pending requests are removed after 24 hours); request again");
    };
    if let Some(r) = refused(issue, &csr) {
        let _ = std::fs::remove_file(issue.pending_key_path());
        return Err(r.into());
    }
    let pem = csr
        .status
        .and_then(|s| s.certificate)
        .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        .unwrap_or_default();
    Ok(Some(pem))
}

/// Writes the kubeconfig for the issued `cert_pem` and `key` (0600, atomically) and drops
/// the pending key. The certificate must be the node's identity for this key.
pub(crate) fn install(issue: &Issue, key: &rcgen::KeyPair, cert_pem: &str) -> Result<CertInfo> {
    let info = CertInfo::from_pem(cert_pem.as_bytes()).context("the issued certificate")?;
    if info.public_key != key.subject_public_key_info() {
        bail!("the issued certificate is not for the requested key");
    }
    if info.common_name != issue.user() || !info.organizations.iter().any(|o| o == NODEGRACE_GROUP)
    {
        bail!(
            "the issued certificate is for {}, not {} ({NODEGRACE_GROUP})",
            info.identity(),
            issue.user()
        );
    }
    let cluster = cluster_for(issue)?;
    let text = render(&cluster, &issue.user(), cert_pem, &key.serialize_pem())?;
    crate::fsutil::write_atomic(&issue.kubeconfig, text.as_bytes(), 0o600)
        .with_context(|| format!("writing {}", issue.kubeconfig.display()))?;
    let _ = std::fs::remove_file(issue.pending_key_path());
    Ok(info)
}

/// The cluster the new kubeconfig names: the current kubeconfig's (an operator may have
/// pointed it at a load balancer), else the kubelet's.
fn cluster_for(issue: &Issue) -> Result<kube::config::Cluster> {
    if let Ok(cluster) = KubeconfigFile::read(&issue.kubeconfig).and_then(|f| f.embedded_cluster())
    {
        return Ok(cluster);
    }
    let template = issue
        .template
        .as_deref()
        .context("no kubeconfig to take the apiserver's address from")?;
    KubeconfigFile::read(template)
        .and_then(|f| f.embedded_cluster())
        .with_context(|| format!("taking the apiserver's address from {}", template.display()))
}

/// Whether the kubeconfig at `path` is already a client certificate this node may keep
/// using: its own identity, not yet due for renewal at `now`.
pub(crate) fn current(path: &Path, node: &str) -> Option<CertInfo> {
    use crate::cluster::kubeconfig::Credential;
    match KubeconfigFile::read(path).ok()?.credential().ok()? {
        Credential::Certificate(c) if c.common_name == format!("{NODEGRACE_USER_PREFIX}{node}") => {
            Some(c)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::gateway::testutil::{answering, status_body};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// The issue of node `n`'s identity, its kubeconfig in `dir`.
    fn issue_in(dir: &Path) -> Issue {
        Issue {
            node: "n".into(),
            kubeconfig: dir.join("kubeconfig"),
            template: None,
            lifetime: Duration::from_secs(3600),
        }
    }

    #[tokio::test]
    async fn a_request_made_meanwhile_is_read_again_and_another_refusal_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let issue = issue_in(dir.path());
        let key = rcgen::KeyPair::generate().unwrap();
        let submitted = |created: u16| {
            let posts = Arc::new(AtomicUsize::new(0));
            let counted = posts.clone();
            let kubelet = answering(move |method, _| match *method {
                http::Method::GET => (404, status_body(404, "not found")),
                _ => {
                    counted.fetch_add(1, Ordering::SeqCst);
                    match created {
                        201 => (
                            201,
                            serde_json::json!({"spec": {"request": "", "signerName": SIGNER}}),
                        ),
                        code => (code, status_body(code, "refused")),
                    }
                }
            });
            let (issue, key) = (&issue, &key);
            async move {
                (
                    submit(&kubelet, issue, key).await,
                    posts.load(Ordering::SeqCst),
                )
            }
        };
        let (made, posts) = submitted(201).await;
        assert!(matches!(made.unwrap(), Submitted::Created(_)));
        assert_eq!(posts, 1);
        let (conflict, posts) = submitted(409).await;
        let err = format!("{:#}", conflict.unwrap_err());
        assert!(err.contains("kept changing"), "{err}");
        assert_eq!(posts, 3, "each conflict is read again");
        let (refused, posts) = submitted(422).await;
        let err = format!("{:#}", refused.unwrap_err());
        assert!(err.contains("creating CertificateSigningRequest"), "{err}");
        assert_eq!(posts, 1);
    }

    #[test]
    fn the_request_names_the_nodes_identity_and_its_key() {
        let key = rcgen::KeyPair::generate().unwrap();
        let pem = request_pem("node-a", &key).unwrap();
        use x509_parser::prelude::FromDer;
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let (_, req) =
            x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
                .unwrap();
        let subject = &req.certification_request_info.subject;
        assert_eq!(
            subject.to_string(),
            "O=nodegrace:nodes, CN=nodegrace:node:node-a"
        );
        let csr = CertificateSigningRequest {
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.into_bytes()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert!(request_matches(&csr, &key.subject_public_key_info()));
        let other = rcgen::KeyPair::generate().unwrap();
        assert!(!request_matches(&csr, &other.subject_public_key_info()));
    }

    #[test]
    fn request_names_are_per_key_and_valid_for_long_node_names() {
        let a = rcgen::KeyPair::generate().unwrap();
        let b = rcgen::KeyPair::generate().unwrap();
        assert_ne!(request_name("n", &a), request_name("n", &b));
        assert!(request_name("n", &a).starts_with("nodegrace-n-"));
        let long = format!("{}.example", "a".repeat(240));
        let name = request_name(&long, &a);
        assert!(name.len() <= 253, "{}", name.len());
        assert!(crate::plan::names::is_dns_subdomain(&name), "{name}");
    }

    #[test]
    fn the_pending_key_survives_a_restart_and_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let issue = issue_in(dir.path());
        assert_eq!(
            issue.pending_key_path(),
            dir.path().join("kubeconfig.pending-key")
        );
        let first = pending_key(&issue).unwrap();
        let again = pending_key(&issue).unwrap();
        assert_eq!(first.serialize_pem(), again.serialize_pem());
        let mode = std::fs::metadata(issue.pending_key_path())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
