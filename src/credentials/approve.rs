//! `nodegrace credentials approve`: an opt-in approver, run by an administrator (or as a
//! service with the `nodegrace-credential-approver` ClusterRole), for the requests that
//! `nodegrace credentials request` and the daemon make.
//!
//! It approves a request only when all of this holds, and leaves every other request for a
//! person (it never denies):
//! - signer `kubernetes.io/kube-apiserver-client`, not approved, denied or failed yet;
//! - made by a kubelet: `spec.username` is `system:node:<node>` in group `system:nodes`;
//! - for that same node's identity and nothing else: subject exactly
//!   `CN=nodegrace:node:<node>, O=nodegrace:nodes`, no requested extensions (no SANs), a
//!   valid self-signature;
//! - usages within `digital signature`, `key encipherment`, `client auth`, with
//!   `client auth`; `expirationSeconds` at most `--max-lifetime`;
//! - the Node `<node>` exists.
//!
//! Its limit: whoever holds a node's kubelet credential gets that node's nodegrace identity,
//! which can do nothing beyond that node (packaging/rbac/README.md) and no more than the
//! kubelet's own credential can, save tainting that node and writing its maintenances.

use std::time::Duration;

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition,
};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::watcher;
use x509_parser::prelude::FromDer;

use super::issue::SIGNER;
use crate::cluster::identity::{KUBELET_USER_PREFIX, NODEGRACE_GROUP, NODEGRACE_USER_PREFIX};

/// What the approver makes of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Not a request for a nodegrace identity (or already decided): not looked at.
    NotOurs,
    /// Approve: it is `node`'s own request for its identity, if the Node exists.
    Approve { node: String },
    /// A request for a nodegrace identity that breaks a rule: left for a person.
    Leave(String),
}

fn decided(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| matches!(c.type_.as_str(), "Approved" | "Denied" | "Failed"))
        })
}

/// Judges `csr` by the rules in the module documentation (all but the Node's existence).
pub(crate) fn judge(csr: &CertificateSigningRequest, max_lifetime: Duration) -> Verdict {
    let spec = &csr.spec;
    if spec.signer_name != SIGNER || decided(csr) {
        return Verdict::NotOurs;
    }
    let Ok((_, pem)) = x509_parser::pem::parse_x509_pem(&spec.request.0) else {
        return Verdict::NotOurs;
    };
    let Ok((_, request)) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&pem.contents)
    else {
        return Verdict::NotOurs;
    };
    let info = &request.certification_request_info;
    let text = |a: &x509_parser::x509::AttributeTypeAndValue| a.as_str().ok().map(str::to_owned);
    let cns: Vec<Option<String>> = info.subject.iter_common_name().map(text).collect();
    let Some(Some(cn)) = cns.first().cloned() else {
        return Verdict::NotOurs;
    };
    let Some(wanted) = cn.strip_prefix(NODEGRACE_USER_PREFIX) else {
        return Verdict::NotOurs;
    };
    let wanted = wanted.to_owned();
    let leave = |why: String| Verdict::Leave(format!("request for {cn}: {why}"));

    let requester = spec.username.as_deref().unwrap_or_default();
    let Some(by) = requester.strip_prefix(KUBELET_USER_PREFIX) else {
        return leave(format!(
            "made by {requester:?}, not by a kubelet (system:node:<node>)"
        ));
    };
    if by != wanted {
        return leave(format!(
            "made by {requester}, the kubelet of another node than {wanted}"
        ));
    }
    if !spec
        .groups
        .as_ref()
        .is_some_and(|g| g.iter().any(|g| g == "system:nodes"))
    {
        return leave(format!("{requester} is not in group system:nodes"));
    }
    let orgs: Vec<Option<String>> = info.subject.iter_organization().map(text).collect();
    if cns.len() != 1
        || orgs != [Some(NODEGRACE_GROUP.to_owned())]
        || info.subject.iter_attributes().count() != 2
    {
        return leave(format!(
            "the subject must be exactly CN={cn}, O={NODEGRACE_GROUP}, not {}",
            info.subject
        ));
    }
    if request
        .requested_extensions()
        .is_some_and(|mut e| e.next().is_some())
    {
        return leave("it requests extensions (such as subject alternative names)".into());
    }
    if request.verify_signature().is_err() {
        return leave("its signature does not verify".into());
    }
    let usages = spec.usages.clone().unwrap_or_default();
    if !usages.iter().any(|u| u == "client auth")
        || usages.iter().any(|u| {
            !matches!(
                u.as_str(),
                "client auth" | "digital signature" | "key encipherment"
            )
        })
    {
        return leave(format!(
            "usages {usages:?}: only client auth, digital signature and key encipherment, with client auth"
        ));
    }
    let limit = i64::try_from(max_lifetime.as_secs()).unwrap_or(i64::MAX);
    match spec.expiration_seconds {
        Some(s) if i64::from(s) <= limit => {}
        other => {
            return leave(format!(
                "expirationSeconds {} is over the limit of {limit} (--max-lifetime)",
                other.map_or("unset".to_owned(), |s| s.to_string())
            ))
        }
    }
    Verdict::Approve { node: wanted }
}

/// Approves `csr` (the `approval` subresource).
async fn approve(
    api: &Api<CertificateSigningRequest>,
    csr: &CertificateSigningRequest,
    node: &str,
) -> Result<()> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    let mut conditions = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    conditions.push(CertificateSigningRequestCondition {
        type_: "Approved".into(),
        status: "True".into(),
        reason: Some("NodegraceApprover".into()),
        message: Some(format!(
            "nodegrace credentials approve: the kubelet of node {node} asked for that node's nodegrace identity"
        )),
        ..Default::default()
    });
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": csr.metadata.resource_version},
        "status": {"conditions": conditions},
    });
    api.patch_approval(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| format!("approving CertificateSigningRequest {name}"))?;
    Ok(())
}

/// Options of `credentials approve`.
#[derive(Debug, Clone)]
pub struct ApproveOptions {
    pub watch: bool,
    pub dry_run: bool,
    pub max_lifetime: Duration,
}

/// Judges one request and acts; returns the line to print, if any.
async fn handle(
    api: &Api<CertificateSigningRequest>,
    nodes: &Api<Node>,
    csr: &CertificateSigningRequest,
    opts: &ApproveOptions,
) -> Result<Option<String>> {
    let name = csr.metadata.name.clone().unwrap_or_default();
    match judge(csr, opts.max_lifetime) {
        Verdict::NotOurs => Ok(None),
        Verdict::Leave(why) => Ok(Some(format!("left {name} for a person: {why}"))),
        Verdict::Approve { node } => {
            if nodes
                .get_opt(&node)
                .await
                .context("reading the Node")?
                .is_none()
            {
                return Ok(Some(format!(
                    "left {name} for a person: request for {NODEGRACE_USER_PREFIX}{node}: there is no Node {node}"
                )));
            }
            if opts.dry_run {
                return Ok(Some(format!(
                    "would approve {name}: {NODEGRACE_USER_PREFIX}{node}, requested by {KUBELET_USER_PREFIX}{node}"
                )));
            }
            approve(api, csr, &node).await?;
            Ok(Some(format!(
                "approved {name}: {NODEGRACE_USER_PREFIX}{node}, requested by {KUBELET_USER_PREFIX}{node}"
            )))
        }
    }
}

/// Approves the pending requests that pass [`judge`] (once, or as they come with `watch`).
pub(crate) async fn run(
    client: kube::Client,
    opts: &ApproveOptions,
    out: &mut dyn FnMut(&str),
) -> Result<()> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let nodes: Api<Node> = Api::all(client);
    if !opts.watch {
        let list = api
            .list(&Default::default())
            .await
            .context("listing CertificateSigningRequests")?;
        for csr in &list.items {
            if let Some(line) = handle(&api, &nodes, csr, opts).await? {
                out(&line);
            }
        }
        return Ok(());
    }
    let mut events = watcher(api.clone(), watcher::Config::default()).boxed();
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(csr) | watcher::Event::InitApply(csr)) => {
                match handle(&api, &nodes, &csr, opts).await {
                    Ok(Some(line)) => out(&line),
                    Ok(None) => {}
                    Err(err) => out(&format!("error: {err:#}")),
                }
            }
            Ok(_) => {}
            Err(err) => {
                out(&format!(
                    "watching CertificateSigningRequests: {err}; retrying"
                ));
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::certificates::v1::{
        CertificateSigningRequestSpec, CertificateSigningRequestStatus,
    };
    use k8s_openapi::ByteString;

    const YEAR: Duration = Duration::from_secs(365 * 24 * 3600);

    fn csr(pem: String, user: &str) -> CertificateSigningRequest {
        CertificateSigningRequest {
            metadata: kube::api::ObjectMeta {
                name: Some("r".into()),
                ..Default::default()
            },
            spec: CertificateSigningRequestSpec {
                request: ByteString(pem.into_bytes()),
                signer_name: SIGNER.into(),
                username: Some(user.into()),
                groups: Some(vec!["system:nodes".into(), "system:authenticated".into()]),
                usages: Some(vec!["digital signature".into(), "client auth".into()]),
                expiration_seconds: Some(86400),
                ..Default::default()
            },
            status: None,
        }
    }

    fn ours(node: &str) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        crate::credentials::issue::request_pem(node, &key).unwrap()
    }

    fn custom(cn: &str, orgs: &[&str], sans: Vec<String>) -> String {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(sans).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, cn);
        for o in orgs {
            params
                .distinguished_name
                .push(rcgen::DnType::OrganizationName, *o);
        }
        params.serialize_request(&key).unwrap().pem().unwrap()
    }

    #[test]
    fn a_kubelets_request_for_its_own_nodes_identity_is_approved() {
        assert_eq!(
            judge(&csr(ours("n1"), "system:node:n1"), YEAR),
            Verdict::Approve { node: "n1".into() }
        );
    }

    #[test]
    fn a_request_for_another_nodes_identity_is_left_for_a_person() {
        let v = judge(&csr(ours("n2"), "system:node:n1"), YEAR);
        assert!(
            matches!(&v, Verdict::Leave(w) if w.contains("another node")),
            "{v:?}"
        );
        let v = judge(&csr(ours("n1"), "alice"), YEAR);
        assert!(
            matches!(&v, Verdict::Leave(w) if w.contains("not by a kubelet")),
            "{v:?}"
        );
        let mut not_a_node = csr(ours("n1"), "system:node:n1");
        not_a_node.spec.groups = Some(vec!["system:authenticated".into()]);
        assert!(
            matches!(judge(&not_a_node, YEAR), Verdict::Leave(w) if w.contains("system:nodes"))
        );
    }

    #[test]
    fn more_than_the_identity_is_left_for_a_person() {
        let extra_group = custom("nodegrace:node:n1", &["system:masters"], vec![]);
        assert!(matches!(
            judge(&csr(extra_group, "system:node:n1"), YEAR),
            Verdict::Leave(w) if w.contains("subject must be exactly")
        ));
        let sans = custom(
            "nodegrace:node:n1",
            &[NODEGRACE_GROUP],
            vec!["evil.example".into()],
        );
        assert!(matches!(
            judge(&csr(sans, "system:node:n1"), YEAR),
            Verdict::Leave(w) if w.contains("extensions")
        ));
        let mut server = csr(ours("n1"), "system:node:n1");
        server.spec.usages = Some(vec!["server auth".into(), "client auth".into()]);
        assert!(matches!(judge(&server, YEAR), Verdict::Leave(w) if w.contains("usages")));
        let mut long = csr(ours("n1"), "system:node:n1");
        long.spec.expiration_seconds = Some(i32::MAX);
        assert!(matches!(judge(&long, YEAR), Verdict::Leave(w) if w.contains("--max-lifetime")));
        long.spec.expiration_seconds = None;
        assert!(matches!(judge(&long, YEAR), Verdict::Leave(w) if w.contains("unset")));
    }

    #[test]
    fn other_requests_and_decided_ones_are_not_looked_at() {
        let kubelet = custom("system:node:n1", &["system:nodes"], vec![]);
        assert_eq!(
            judge(&csr(kubelet, "system:node:n1"), YEAR),
            Verdict::NotOurs
        );
        let mut other_signer = csr(ours("n1"), "system:node:n1");
        other_signer.spec.signer_name = "kubernetes.io/kubelet-serving".into();
        assert_eq!(judge(&other_signer, YEAR), Verdict::NotOurs);
        let mut denied = csr(ours("n1"), "system:node:n1");
        denied.status = Some(CertificateSigningRequestStatus {
            conditions: Some(vec![CertificateSigningRequestCondition {
                type_: "Denied".into(),
                status: "True".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert_eq!(judge(&denied, YEAR), Verdict::NotOurs);
    }
}
