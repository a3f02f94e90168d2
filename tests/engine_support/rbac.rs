//! Checks requests the daemon made against the ClusterRole shipped in packaging/rbac.
#![allow(dead_code)]

use nodegrace_testkit::fake_apiserver::RecordedRequest;

#[path = "cluster_role.rs"]
mod cluster_role;
use cluster_role::ClusterRole;

/// The request attributes RBAC authorizes: (verb, API group, resource[/subresource]).
fn rbac_attributes(r: &RecordedRequest) -> Option<(String, String, String)> {
    let parts: Vec<&str> = r.path.trim_matches('/').split('/').collect();
    // /api/v1/... or /apis/<group>/<version>/...; anything shorter is discovery.
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => return None,
    };
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let (resource, named) = match rest {
        [] => return None,
        [resource] => (resource.to_string(), false),
        [resource, _name] => (resource.to_string(), true),
        [resource, _name, sub] => (format!("{resource}/{sub}"), true),
        _ => panic!("unexpected request path {}", r.path),
    };
    let watch = r
        .query
        .split('&')
        .any(|q| q == "watch=true" || q == "watch=1");
    let verb = match (r.method.as_str(), named) {
        ("GET", _) if watch => "watch",
        ("GET", true) => "get",
        ("GET", false) => "list",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "delete",
        ("DELETE", false) => "deletecollection",
        (m, _) => panic!("unexpected method {m} on {}", r.path),
    };
    Some((verb.into(), group.into(), resource))
}

/// Fails when the ClusterRole shipped in packaging/rbac would refuse a request the daemon
/// made with its own identity (the fake apiserver authorizes everything; a real one does
/// not), or when the kubelet's credential was used for anything but the node's pod writes.
pub fn assert_cluster_role_allows(reqs: &[RecordedRequest]) {
    let role = ClusterRole::shipped();
    for r in reqs {
        let Some((verb, group, resource)) = rbac_attributes(r) else {
            continue;
        };
        if r.user_agent == nodegrace_testkit::fake_apiserver::KUBELET_AGENT {
            assert!(
                matches!(
                    (verb.as_str(), group.as_str(), resource.as_str()),
                    ("create", "", "pods/eviction")
                        | ("delete", "", "pods")
                        | ("patch", "", "pods/status")
                        | ("create", "authentication.k8s.io", "selfsubjectreviews")
                        | ("create", "authorization.k8s.io", "selfsubjectaccessreviews")
                ),
                "the kubelet's credential is for pod writes (and asking who it is and what it may do) only, not {verb} {group}/{resource} ({} {})",
                r.method,
                r.path
            );
            continue;
        }
        assert!(
            role.allows(&verb, &group, &resource),
            "the ClusterRole does not allow {verb} {group}/{resource} ({} {}?{})",
            r.method,
            r.path,
            r.query
        );
    }
}
