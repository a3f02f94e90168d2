//! Whether the daemon's two credentials are what the identity model needs
//! (packaging/rbac/README.md): nodegrace's is `nodegrace:node:<node>` in `nodegrace:nodes`,
//! the kubelet's is `system:node:<node>`, and each may do what the daemon asks of it. Checked
//! once at start, so that a wrong credential is said in one line naming the identity, the
//! file and what to do, instead of failing at the first write of a shutdown; a credential
//! that cannot work keeps the cluster path from starting, and a shutdown then drains
//! through the CRI runtime.

use std::path::Path;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};

use super::client::{identity, Clients, Role};
use super::gateway::{self, Reply};
use crate::cluster::kubeconfig::{Credential, KubeconfigFile};

/// A credential the cluster path cannot work with, said in one line.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct CredentialError(pub String);

/// What a credential's identity means for this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Finding {
    /// The identity the model expects.
    Expected,
    /// Works, but outside the model (the shipped RBAC and admission policy do not apply).
    Unusual(String),
    /// Cannot work for this node.
    Unusable(String),
}

pub(crate) const NODEGRACE_USER_PREFIX: &str = "nodegrace:node:";
pub(crate) const NODEGRACE_GROUP: &str = "nodegrace:nodes";
pub(crate) const KUBELET_USER_PREFIX: &str = "system:node:";

const ISSUE: &str =
    "issue this node's identity with `nodegrace credentials request` (run on this node)";

/// Judges the identity the apiserver reported for `role`'s credential on `node`.
pub(crate) fn judge(role: Role, node: &str, user: &str, groups: &[String]) -> Finding {
    let key = role.key();
    match role {
        Role::Nodegrace => match (
            user.strip_prefix(NODEGRACE_USER_PREFIX),
            user.strip_prefix(KUBELET_USER_PREFIX),
        ) {
            (Some(n), _) if n == node => {
                if groups.iter().any(|g| g == NODEGRACE_GROUP) {
                    Finding::Expected
                } else {
                    Finding::Unusable(format!(
                        "{key} authenticates as {user} but not in group {NODEGRACE_GROUP}, to which the ClusterRole is bound: {ISSUE}"
                    ))
                }
            }
            (Some(other), _) => Finding::Unusable(format!(
                "{key} holds {user}, the identity of node {other}, but this node is {node}: the admission policy refuses its writes for {node}; {ISSUE}"
            )),
            (None, Some(_)) => Finding::Unusable(format!(
                "{key} holds {user}, a kubelet's identity: nodegrace needs its own, {NODEGRACE_USER_PREFIX}{node} in {NODEGRACE_GROUP} (NodeRestriction forbids a kubelet to taint its own Node); {ISSUE}"
            )),
            (None, None) => Finding::Unusual(format!(
                "{key} authenticates as {user} ({}), not {NODEGRACE_USER_PREFIX}{node}: the shipped ClusterRole and admission policy do not apply to it, so nothing confines it to this node",
                groups.join(", ")
            )),
        },
        Role::Kubelet => match (
            user.strip_prefix(KUBELET_USER_PREFIX),
            user.strip_prefix(NODEGRACE_USER_PREFIX),
        ) {
            (Some(n), _) if n == node => Finding::Expected,
            (Some(other), _) => Finding::Unusable(format!(
                "{key} holds {user}, the kubelet identity of node {other}, but this node is {node}: NodeRestriction refuses its evictions of {node}'s pods; point {key} at this node's kubelet kubeconfig"
            )),
            (None, Some(_)) => Finding::Unusable(format!(
                "{key} holds {user}, nodegrace's identity, not the kubelet's: {NODEGRACE_GROUP} may not evict or delete pods; point {key} at the kubelet's kubeconfig (system:node:{node})"
            )),
            (None, None) => Finding::Unusual(format!(
                "{key} authenticates as {user} ({}), not the kubelet's system:node:{node}: NodeRestriction does not confine its evictions to this node's pods",
                groups.join(", ")
            )),
        },
    }
}

/// Why the apiserver answered 401 to `role`'s credential, and what to do.
pub(crate) fn unauthorized(
    role: Role,
    path: Option<&Path>,
    now: chrono::DateTime<chrono::Utc>,
) -> String {
    let key = role.key();
    let file = path.map_or_else(
        || "in-cluster or $KUBECONFIG".into(),
        |p| p.display().to_string(),
    );
    let what = match path.map(KubeconfigFile::read).map(|f| f.and_then(|f| f.credential())) {
        Some(Ok(Credential::Certificate(c))) if c.not_after <= now => format!(
            "its client certificate for {} expired at {}",
            c.common_name,
            c.not_after.to_rfc3339()
        ),
        Some(Ok(Credential::Certificate(c))) if c.not_before > now => format!(
            "its client certificate for {} is not valid before {} (is the clock right?)",
            c.common_name,
            c.not_before.to_rfc3339()
        ),
        Some(Ok(Credential::Certificate(c))) => format!(
            "its client certificate for {} (valid until {}) is not signed by a CA the apiserver trusts, or was revoked",
            c.common_name,
            c.not_after.to_rfc3339()
        ),
        Some(Ok(Credential::Other(kind))) => format!("its {kind} is not accepted (expired or revoked)"),
        _ => "it is not accepted".into(),
    };
    let todo = match role {
        Role::Nodegrace => ISSUE,
        Role::Kubelet => "the kubelet renews its own client certificate: check the kubelet, and that this key names its kubeconfig",
    };
    format!(
        "the apiserver refuses {} ({key} {file}, 401 Unauthorized): {what}; {todo}",
        role.describe()
    )
}

/// One permission the daemon needs, as a SelfSubjectAccessReview asks it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permission {
    pub verb: &'static str,
    pub group: &'static str,
    pub resource: &'static str,
    pub subresource: &'static str,
    pub name: Option<String>,
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.subresource.is_empty() {
            write!(f, "/{}", self.subresource)?;
        }
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if let Some(name) = &self.name {
            write!(f, " {name}")?;
        }
        Ok(())
    }
}

fn permission(verb: &'static str, group: &'static str, resource: &'static str) -> Permission {
    let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
    Permission {
        verb,
        group,
        resource,
        subresource,
        name: None,
    }
}

/// What the daemon asks of `role`'s credential on every path (an EvictionRequest API's rights
/// are checked once its path is chosen).
pub(crate) fn required(role: Role, node: &str) -> Vec<Permission> {
    match role {
        Role::Nodegrace => vec![
            Permission {
                name: Some(node.to_owned()),
                ..permission("patch", "", "nodes")
            },
            permission("watch", "", "pods"),
            permission("watch", "nodegrace.dev", "nodemaintenances"),
            permission("create", "nodegrace.dev", "nodemaintenances"),
            permission("patch", "nodegrace.dev", "nodemaintenances/status"),
        ],
        Role::Kubelet => vec![
            permission("create", "", "pods/eviction"),
            permission("delete", "", "pods"),
        ],
    }
}

async fn allowed(client: &kube::Client, p: &Permission) -> Reply<bool> {
    let api: kube::Api<SelfSubjectAccessReview> = kube::Api::all(client.clone());
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(p.verb.to_owned()),
                group: Some(p.group.to_owned()),
                resource: Some(p.resource.to_owned()),
                subresource: Some(p.subresource.to_owned()).filter(|s| !s.is_empty()),
                name: p.name.clone(),
                ..ResourceAttributes::default()
            }),
            ..SelfSubjectAccessReviewSpec::default()
        },
        ..SelfSubjectAccessReview::default()
    };
    let answer = gateway::reply(api.create(&kube::api::PostParams::default(), &review).await)?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// Who each credential is, as the apiserver says.
#[derive(Debug, Clone, Default)]
pub struct Verified {
    /// `user (group, ...)` of nodegrace's credential; empty when the apiserver could not say.
    pub nodegrace: String,
    /// The same for the kubelet's credential.
    pub kubelet: String,
    /// Identities outside the model, said as warnings.
    pub warnings: Vec<String>,
}

fn describe(user: &str, groups: &[String]) -> String {
    let groups: Vec<&str> = groups
        .iter()
        .map(String::as_str)
        .filter(|g| *g != "system:authenticated")
        .collect();
    if groups.is_empty() {
        user.to_owned()
    } else {
        format!("{user} ({})", groups.join(", "))
    }
}

/// Checks both credentials of `clients` for `node`: who they are and whether they may do
/// what the daemon asks. A 401, a wrong identity or a missing permission is a
/// `CredentialError`; an apiserver that cannot say (no SelfSubjectReview) is let through.
pub async fn verify(
    clients: &Clients,
    paths: [Option<&Path>; 2],
    node: &str,
) -> anyhow::Result<Verified> {
    let mut verified = Verified::default();
    let roles: &[Role] = if clients.shared {
        &[Role::Nodegrace]
    } else {
        &[Role::Nodegrace, Role::Kubelet]
    };
    for (&role, path) in roles.iter().zip(paths) {
        let client = match role {
            Role::Nodegrace => &clients.nodegrace,
            Role::Kubelet => &clients.kubelet,
        };
        let who = match gateway::reply(identity(client).await) {
            Ok((user, groups)) => {
                match judge(role, node, &user, &groups) {
                    Finding::Expected => {}
                    Finding::Unusual(w) => verified.warnings.push(w),
                    Finding::Unusable(e) => return Err(CredentialError(e).into()),
                }
                describe(&user, &groups)
            }
            Err(f) if f.code() == Some(401) => {
                return Err(CredentialError(unauthorized(role, path, chrono::Utc::now())).into())
            }
            // The apiserver cannot say (no SelfSubjectReview), or this credential may not
            // ask: a 403 here only keeps the question from being asked, the requests
            // themselves will tell (for the engine a 403 is an unusable answer).
            Err(f) if f.code() == Some(403) || f.not_served() => String::new(),
            Err(f) => {
                return Err(f
                    .error
                    .context(format!("asking the apiserver who {} is", role.describe())))
            }
        };
        match role {
            Role::Nodegrace => verified.nodegrace = who,
            Role::Kubelet => verified.kubelet = who,
        }
    }
    if clients.shared {
        verified.kubelet = verified.nodegrace.clone();
    }
    let mut lacking: Vec<(Role, Permission)> = Vec::new();
    for role in [Role::Nodegrace, Role::Kubelet] {
        let client = match role {
            Role::Nodegrace => &clients.nodegrace,
            Role::Kubelet => &clients.kubelet,
        };
        let wanted = required(role, node);
        let answers = futures::future::join_all(wanted.iter().map(|p| allowed(client, p))).await;
        for (p, answer) in wanted.into_iter().zip(answers) {
            match answer {
                Ok(true) => {}
                Ok(false) => lacking.push((role, p)),
                // An apiserver without the API cannot say; the requests themselves will.
                Err(f) if f.not_served() => {}
                Err(f) => {
                    return Err(f.error.context(format!(
                        "asking the apiserver what {} may do",
                        role.describe()
                    )))
                }
            }
        }
    }
    if !lacking.is_empty() {
        return Err(CredentialError(lacks(&verified, &lacking, clients.shared)).into());
    }
    Ok(verified)
}

/// What nodegrace's credential needs on the in-tree EvictionRequest API (1.37,
/// `lifecycle.k8s.io/v1alpha1`) when the cluster serves it.
pub fn required_in_tree() -> Vec<Permission> {
    vec![
        permission("create", "lifecycle.k8s.io", "evictionrequests"),
        permission("patch", "lifecycle.k8s.io", "evictionrequests"),
        permission("watch", "lifecycle.k8s.io", "evictionrequests"),
        permission("watch", "lifecycle.k8s.io", "evictions"),
    ]
}

/// [`verify`]'s permission check for the in-tree EvictionRequest API: a missing grant is a
/// [`CredentialError`] naming it.
pub(crate) async fn verify_in_tree(clients: &Clients, verified: &Verified) -> anyhow::Result<()> {
    verify_nodegrace_may(clients, verified, required_in_tree()).await
}

async fn verify_nodegrace_may(
    clients: &Clients,
    verified: &Verified,
    wanted: Vec<Permission>,
) -> anyhow::Result<()> {
    let answers =
        futures::future::join_all(wanted.iter().map(|p| allowed(&clients.nodegrace, p))).await;
    let mut lacking = Vec::new();
    for (p, answer) in wanted.into_iter().zip(answers) {
        match answer {
            Ok(true) => {}
            Ok(false) => lacking.push((Role::Nodegrace, p)),
            Err(f) if f.not_served() => {}
            Err(f) => {
                return Err(f
                    .error
                    .context("asking the apiserver what nodegrace's credential may do"))
            }
        }
    }
    if !lacking.is_empty() {
        return Err(CredentialError(lacks(verified, &lacking, clients.shared)).into());
    }
    Ok(())
}

fn lacks(verified: &Verified, lacking: &[(Role, Permission)], shared: bool) -> String {
    let mut parts = Vec::new();
    for role in [Role::Nodegrace, Role::Kubelet] {
        let list: Vec<String> = lacking
            .iter()
            .filter(|(r, _)| *r == role)
            .map(|(_, p)| p.to_string())
            .collect();
        if list.is_empty() {
            continue;
        }
        let who = match role {
            Role::Nodegrace => &verified.nodegrace,
            Role::Kubelet => &verified.kubelet,
        };
        let who = if who.is_empty() {
            role.describe()
        } else {
            who.as_str()
        };
        let fix = match (role, shared) {
            (Role::Nodegrace, _) => "apply packaging/rbac (the ClusterRole nodegrace-node bound to nodegrace:nodes)",
            (Role::Kubelet, false) => "the apiserver's Node authorizer grants them to system:node:<node> (--authorization-mode=Node,RBAC)",
            (Role::Kubelet, true) => "node.kubelet_kubeconfig is empty, so pods are evicted with node.kubeconfig's identity: set it to the kubelet's kubeconfig",
        };
        parts.push(format!(
            "{who} ({}) may not {}: {fix}",
            role.key(),
            list.join(", ")
        ));
    }
    parts.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::gateway::testutil::{answering, status_body};
    use serde_json::json;

    /// An apiserver answering SelfSubjectReviews with `who` and SelfSubjectAccessReviews
    /// with `may`: a code, 200 for `nodegrace:node:n1` and "allowed".
    fn apiserver(who: u16, may: u16) -> Clients {
        Clients::from(answering(move |_, path| {
            let (code, body) = if path.ends_with("/selfsubjectreviews") {
                let user = json!({"username": "nodegrace:node:n1", "groups": [NODEGRACE_GROUP]});
                (who, json!({"status": {"userInfo": user}}))
            } else {
                (may, json!({"spec": {}, "status": {"allowed": true}}))
            };
            match code {
                200 => (200, body),
                code => (code, status_body(code, "refused")),
            }
        }))
    }

    #[tokio::test]
    async fn a_401_is_a_credential_error_and_a_403_404_or_405_leaves_the_identity_unsaid() {
        let who = verify(&apiserver(200, 200), [None, None], "n1")
            .await
            .unwrap();
        assert_eq!(who.nodegrace, "nodegrace:node:n1 (nodegrace:nodes)");
        let err = verify(&apiserver(401, 200), [None, None], "n1")
            .await
            .unwrap_err();
        let refused = err
            .downcast_ref::<CredentialError>()
            .unwrap_or_else(|| panic!("{err:#}"));
        assert!(refused.0.contains("401 Unauthorized"), "{}", refused.0);
        for code in [403, 404, 405] {
            let who = verify(&apiserver(code, 200), [None, None], "n1").await;
            assert_eq!(who.unwrap().nodegrace, "", "{code}");
        }
        for code in [400, 500] {
            let err = verify(&apiserver(code, 200), [None, None], "n1")
                .await
                .unwrap_err();
            assert!(err.downcast_ref::<CredentialError>().is_none(), "{code}");
            assert!(
                format!("{err:#}").contains("asking the apiserver who"),
                "{err:#}"
            );
        }
    }

    #[tokio::test]
    async fn an_apiserver_without_access_reviews_lets_the_permissions_through() {
        let verified = Verified::default();
        for code in [404, 405] {
            let clients = apiserver(200, code);
            verify(&clients, [None, None], "n1").await.unwrap();
            verify_in_tree(&clients, &verified).await.unwrap();
        }
        for code in [403, 500] {
            let clients = apiserver(200, code);
            let err = verify(&clients, [None, None], "n1").await.unwrap_err();
            assert!(err.downcast_ref::<CredentialError>().is_none(), "{code}");
            assert!(
                format!("{err:#}").contains("asking the apiserver what"),
                "{err:#}"
            );
            let err = verify_in_tree(&clients, &verified).await.unwrap_err();
            assert!(
                format!("{err:#}").contains("what nodegrace's credential may do"),
                "{err:#}"
            );
        }
    }

    fn groups(g: &[&str]) -> Vec<String> {
        g.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_expected_identities_pass() {
        assert_eq!(
            judge(
                Role::Nodegrace,
                "n1",
                "nodegrace:node:n1",
                &groups(&["nodegrace:nodes", "system:authenticated"])
            ),
            Finding::Expected
        );
        assert_eq!(
            judge(
                Role::Kubelet,
                "n1",
                "system:node:n1",
                &groups(&["system:nodes"])
            ),
            Finding::Expected
        );
    }

    #[test]
    fn another_nodes_identity_is_unusable_and_says_what_to_do() {
        let Finding::Unusable(m) = judge(
            Role::Nodegrace,
            "n1",
            "nodegrace:node:n2",
            &groups(&["nodegrace:nodes"]),
        ) else {
            panic!()
        };
        assert!(
            m.contains("nodegrace:node:n2") && m.contains("this node is n1"),
            "{m}"
        );
        assert!(m.contains("nodegrace credentials request"), "{m}");
        let Finding::Unusable(m) = judge(Role::Kubelet, "n1", "system:node:n2", &[]) else {
            panic!()
        };
        assert!(
            m.contains("system:node:n2") && m.contains("node.kubelet_kubeconfig"),
            "{m}"
        );
    }

    #[test]
    fn swapped_credentials_are_unusable() {
        let Finding::Unusable(m) = judge(
            Role::Nodegrace,
            "n1",
            "system:node:n1",
            &groups(&["system:nodes"]),
        ) else {
            panic!()
        };
        assert!(
            m.contains("a kubelet's identity") && m.contains("taint"),
            "{m}"
        );
        let Finding::Unusable(m) = judge(
            Role::Kubelet,
            "n1",
            "nodegrace:node:n1",
            &groups(&["nodegrace:nodes"]),
        ) else {
            panic!()
        };
        assert!(m.contains("nodegrace's identity"), "{m}");
        assert!(matches!(
            judge(Role::Nodegrace, "n1", "nodegrace:node:n1", &groups(&["system:authenticated"])),
            Finding::Unusable(m) if m.contains("not in group nodegrace:nodes")
        ));
    }

    #[test]
    fn other_identities_work_with_a_warning() {
        assert!(matches!(
            judge(Role::Nodegrace, "n1", "admin", &groups(&["system:masters"])),
            Finding::Unusual(m) if m.contains("nothing confines it")
        ));
        assert!(matches!(
            judge(Role::Kubelet, "n1", "admin", &[]),
            Finding::Unusual(m) if m.contains("NodeRestriction does not confine")
        ));
    }

    #[test]
    fn a_refused_certificate_says_whether_it_expired() {
        let dir = tempfile::tempdir().unwrap();
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "nodegrace:node:n1");
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        let cert = params.self_signed(&key).unwrap();
        let cluster = kube::config::Cluster {
            server: Some("https://x".into()),
            ..Default::default()
        };
        let text = crate::cluster::kubeconfig::render(
            &cluster,
            "nodegrace:node:n1",
            &cert.pem(),
            &key.serialize_pem(),
        )
        .unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(&path, text).unwrap();
        let now = chrono::DateTime::parse_from_rfc3339("2022-01-01T00:00:00Z")
            .unwrap()
            .to_utc();
        let m = unauthorized(Role::Nodegrace, Some(&path), now);
        assert!(
            m.contains("expired at 2021-01-01T00:00:00+00:00")
                && m.contains(&path.display().to_string())
                && m.contains("nodegrace credentials request"),
            "{m}"
        );
        let earlier = chrono::DateTime::parse_from_rfc3339("2020-06-01T00:00:00Z")
            .unwrap()
            .to_utc();
        let m = unauthorized(Role::Kubelet, Some(&path), earlier);
        assert!(
            m.contains("not signed by a CA the apiserver trusts")
                && m.contains("check the kubelet"),
            "{m}"
        );
    }

    #[test]
    fn missing_permissions_are_listed_per_identity() {
        let v = Verified {
            nodegrace: "nodegrace:node:n1 (nodegrace:nodes)".into(),
            kubelet: String::new(),
            warnings: vec![],
        };
        let lacking = vec![
            (Role::Nodegrace, required(Role::Nodegrace, "n1")[0].clone()),
            (Role::Kubelet, required(Role::Kubelet, "n1")[0].clone()),
        ];
        let m = lacks(&v, &lacking, false);
        assert_eq!(
            m,
            "nodegrace:node:n1 (nodegrace:nodes) (node.kubeconfig) may not patch nodes n1: apply packaging/rbac (the ClusterRole nodegrace-node bound to nodegrace:nodes); \
             the kubelet's credential (node.kubelet_kubeconfig) may not create pods/eviction: the apiserver's Node authorizer grants them to system:node:<node> (--authorization-mode=Node,RBAC)"
        );
    }
}
