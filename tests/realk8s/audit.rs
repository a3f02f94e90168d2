//! The apiserver's audit log (`$REALK8S_RUN/logs/audit.log`, one JSON event per line, level
//! Metadata): what a client really asked and what it was answered.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::Value;

/// One request (its last logged stage).
#[derive(Debug, Clone)]
pub struct Request {
    pub user: String,
    /// `nodegrace/<version>` for the daemon, under either of its identities.
    pub user_agent: String,
    pub verb: String,
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    pub uri: String,
    /// HTTP status; 0 while a watch is still open.
    pub code: u16,
    /// Unix seconds when the apiserver received it.
    pub received: f64,
    /// Unix seconds of its last logged stage (for a finished request: when the answer was
    /// complete).
    pub completed: f64,
}

impl Request {
    /// `resource` or `resource/subresource`, as RBAC names it.
    pub fn rbac_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    /// `verb group/resource[/sub]`, e.g. `create /pods/eviction`.
    pub fn kind(&self) -> String {
        format!("{} {}/{}", self.verb, self.api_group, self.rbac_resource())
    }

    pub fn is_watch(&self) -> bool {
        self.verb == "watch"
    }
}

fn parse_time(text: &str) -> Option<f64> {
    let t = chrono::DateTime::parse_from_rfc3339(text).ok()?;
    Some(t.timestamp_micros() as f64 / 1e6)
}

fn parse(line: &str) -> Option<(String, Request)> {
    let v: Value = serde_json::from_str(line).ok()?;
    let s = |ptr: &str| {
        v.pointer(ptr)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let request = Request {
        user: s("/user/username"),
        user_agent: s("/userAgent"),
        verb: s("/verb"),
        api_group: s("/objectRef/apiGroup"),
        resource: s("/objectRef/resource"),
        subresource: s("/objectRef/subresource"),
        namespace: s("/objectRef/namespace"),
        name: s("/objectRef/name"),
        uri: s("/requestURI"),
        code: v
            .pointer("/responseStatus/code")
            .and_then(Value::as_u64)
            .unwrap_or(0) as u16,
        received: parse_time(&s("/requestReceivedTimestamp"))?,
        completed: parse_time(&s("/stageTimestamp"))?,
    };
    Some((s("/auditID"), request))
}

/// Every request `user` made that the apiserver received at or after `since` (Unix
/// seconds), in order of receipt. A watch appears once (its latest stage).
pub fn requests_of(log: &Path, user: &str, since: f64) -> Vec<Request> {
    let text: String = written_since(log, since)
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect();
    let mut by_id: BTreeMap<String, Request> = BTreeMap::new();
    for line in text.lines() {
        if !line.contains(user) {
            continue;
        }
        if let Some((id, r)) = parse(line) {
            if r.user == user && r.received >= since {
                by_id.insert(id, r);
            }
        }
    }
    let mut all: Vec<Request> = by_id.into_values().collect();
    all.sort_by(|a, b| a.received.total_cmp(&b.received));
    all
}

/// Every request of any of `users` since `since`, as [`requests_of`] gives one user's, the
/// log read once for all of them (it grows to 100 MB).
pub fn requests_of_users(log: &Path, users: &[String], since: f64) -> Vec<Request> {
    let mut by_id: BTreeMap<String, Request> = BTreeMap::new();
    for path in written_since(log, since) {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        for line in text.lines() {
            if !users.iter().any(|u| line.contains(u.as_str())) {
                continue;
            }
            if let Some((id, r)) = parse(line) {
                if r.received >= since && users.contains(&r.user) {
                    by_id.insert(id, r);
                }
            }
        }
    }
    let mut all: Vec<Request> = by_id.into_values().collect();
    all.sort_by(|a, b| a.received.total_cmp(&b.received));
    all
}

/// `log` and the files the apiserver rotated it to (`audit-<time>.log`, at 100 MB) since
/// `since` (Unix seconds): a run that spans a rotation has its first requests there.
fn written_since(log: &Path, since: f64) -> Vec<std::path::PathBuf> {
    let stem = log
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or_default()
        .to_owned();
    let dir = log.parent().map(Path::to_path_buf).unwrap_or_default();
    let mut rotated: Vec<std::path::PathBuf> = std::fs::read_dir(&dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
            name.starts_with(&format!("{stem}-")) && name.ends_with(".log")
        })
        .filter(|p| {
            std::fs::metadata(p)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .is_some_and(|t| t.as_secs_f64() >= since)
        })
        .collect();
    rotated.sort();
    rotated.push(log.to_path_buf());
    rotated
}

/// Requests counted by `verb group/resource[/sub]`, for reports and assertions.
pub fn count_by_kind(requests: &[Request]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for r in requests {
        *counts.entry(r.kind()).or_insert(0) += 1;
    }
    counts
}

#[path = "../engine_support/cluster_role.rs"]
mod cluster_role;

/// Fails unless every request was authorized, and by the shipped ClusterRole (or by the
/// grants every authenticated identity has: discovery, SelfSubjectReview); requests made
/// with the kubelet's credential only for what nodegrace uses it for.
pub fn assert_allowed_by_cluster_role(requests: &[Request]) {
    let role = cluster_role::ClusterRole::shipped();
    for r in requests {
        assert!(
            r.code != 401 && r.code != 403,
            "refused ({}): {} {}",
            r.code,
            r.kind(),
            r.uri
        );
        if r.resource.is_empty() {
            continue;
        }
        // The kubelet's credential: the Node authorizer's grants, used for pod writes only.
        if r.user.starts_with("system:node:") {
            assert!(
                matches!(
                    (
                        r.verb.as_str(),
                        r.api_group.as_str(),
                        r.rbac_resource().as_str()
                    ),
                    ("create", "", "pods/eviction")
                        | ("delete", "", "pods")
                        | ("patch", "", "pods/status")
                        | ("create", "authentication.k8s.io", "selfsubjectreviews")
                        | ("create", "authorization.k8s.io", "selfsubjectaccessreviews")
                        | (
                            "create" | "get" | "list" | "watch",
                            "certificates.k8s.io",
                            "certificatesigningrequests"
                        )
                ),
                "nodegrace used the kubelet's credential for {} ({})",
                r.kind(),
                r.uri
            );
            continue;
        }
        assert!(
            role.allows(&r.verb, &r.api_group, &r.rbac_resource()),
            "the shipped ClusterRole does not allow {} ({})",
            r.kind(),
            r.uri
        );
    }
}
