//! HTTP front end: routing, discovery documents, list/watch encoding, fault injection and
//! the request log.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use serde_json::{json, Value};

use super::select::{FieldSelector, LabelSelector};
use super::store::{ApiError, DeleteOpts, Filter, PatchKind, ResourceInfo, Store, WatchBatch};

pub type Body = BoxBody<Bytes, Infallible>;

/// One request as the apiserver received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    pub path: String,
    pub query: String,
    pub content_type: Option<String>,
    pub body: Bytes,
    /// Which client made it, where tests give their clients distinct user agents.
    pub user_agent: String,
}

impl RecordedRequest {
    pub fn body_json(&self) -> Option<Value> {
        if self.body.is_empty() {
            return None;
        }
        serde_json::from_slice(&self.body)
            .ok()
            .or_else(|| serde_yaml::from_slice(&self.body).ok())
    }
    /// A decoded query parameter.
    pub fn param(&self, name: &str) -> Option<String> {
        parse_query(&self.query).remove(name)
    }
    pub fn is_watch(&self) -> bool {
        matches!(self.param("watch").as_deref(), Some("true" | "1"))
    }
}

/// An injected failure: the next `remaining` requests matching method and path glob get `status`
/// (a Status), or with `garbage` an HTML page under that code, as a proxy in front of an
/// apiserver answers.
#[derive(Debug, Clone)]
pub struct Fault {
    pub method: Option<String>,
    pub path_glob: String,
    pub status: u16,
    pub remaining: usize,
    pub garbage: bool,
}

/// What a proxy in front of a broken apiserver sends back.
pub const GARBAGE: &str =
    "<html><head><title>Service</title></head><body><h1>Please wait</h1></body></html>";

/// Extra time before requests matching method and path glob are handled.
#[derive(Debug, Clone)]
pub struct Delay {
    pub method: Option<String>,
    pub path_glob: String,
    pub delay: Duration,
    /// Requests it holds now, and the most it held at once.
    pub held: usize,
    pub most_held: usize,
}

/// The delays holding one request; dropped when it is handled (or its connection closed).
struct Holding<'a> {
    shared: &'a Shared,
    delays: Vec<(Option<String>, String)>,
}

impl Drop for Holding<'_> {
    fn drop(&mut self) {
        if let Ok(mut all) = self.shared.delays.lock() {
            for d in all.iter_mut() {
                if self
                    .delays
                    .contains(&(d.method.clone(), d.path_glob.clone()))
                {
                    d.held = d.held.saturating_sub(1);
                }
            }
        }
    }
}

pub struct Shared {
    pub store: Arc<Store>,
    pub faults: Mutex<Vec<Fault>>,
    pub latency: Mutex<Duration>,
    pub delays: Mutex<Vec<Delay>>,
    pub log: Mutex<Vec<RecordedRequest>>,
    pub address: String,
    /// Resources (plural) whose watches stay open and send nothing, as a watch hung
    /// mid-stream on a live connection.
    pub stalled: Mutex<Vec<String>>,
    /// Events (resource plural, the event) that the next watch of that resource to send
    /// anything sends first, as they are.
    pub injected_events: Mutex<Vec<(String, Value)>>,
}

impl Shared {
    fn take_injected_events(&self, plural: &str) -> Vec<Value> {
        let Ok(mut all) = self.injected_events.lock() else {
            return Vec::new();
        };
        let (mine, others) = all.drain(..).partition(|(p, _)| p == plural);
        *all = others;
        mine.into_iter().map(|(_, e)| e).collect()
    }

    fn is_stalled(&self, plural: &str) -> bool {
        self.stalled
            .lock()
            .map(|s| s.iter().any(|p| p == plural))
            .unwrap_or(false)
    }
}

fn glob_match(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, rest)) => {
            let Some(remaining) = text.strip_prefix(head) else {
                return false;
            };
            (0..=remaining.len())
                .filter(|i| remaining.is_char_boundary(*i))
                .any(|i| glob_match(rest, &remaining[i..]))
        }
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn parse_query(q: &str) -> HashMap<String, String> {
    q.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn full(status: StatusCode, v: &Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(v.to_string())).boxed());
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    r
}

fn error(e: &ApiError) -> Response<Body> {
    let status = StatusCode::from_u16(e.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut r = full(status, &e.to_status());
    // Like the real server: Retry-After only when the Status carries retryAfterSeconds
    // (throttling does; the PDB 429 of the eviction subresource does not).
    let retry_after = e
        .details
        .as_ref()
        .and_then(|d| d.get("retryAfterSeconds"))
        .and_then(Value::as_u64)
        .filter(|s| *s > 0);
    if let Some(secs) = retry_after {
        if let Ok(v) = http::HeaderValue::from_str(&secs.to_string()) {
            r.headers_mut().insert(http::header::RETRY_AFTER, v);
        }
    }
    r
}

fn injected(status: u16) -> ApiError {
    let reason = match status {
        400 => "BadRequest",
        403 => "Forbidden",
        404 => "NotFound",
        409 => "Conflict",
        410 => "Expired",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    };
    let mut e = ApiError::new(status, reason, format!("injected fault ({status})"));
    if status == 429 {
        e.details = Some(json!({"retryAfterSeconds": 1}));
    }
    e
}

pub async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let path = parts.uri.path().to_string();
    let query = parts.uri.query().unwrap_or_default().to_string();
    let content_type = parts
        .headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let user_agent = parts
        .headers
        .get(http::header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    if let Ok(mut log) = shared.log.lock() {
        log.push(RecordedRequest {
            method: parts.method.to_string(),
            path: path.clone(),
            query: query.clone(),
            content_type: content_type.clone(),
            body: body.clone(),
            user_agent: user_agent.clone(),
        });
    }
    let matches = |method: &Option<String>, glob: &str| {
        method
            .as_deref()
            .is_none_or(|m| m.eq_ignore_ascii_case(parts.method.as_str()))
            && glob_match(glob, &path)
    };
    let mut holding = Holding {
        shared: &shared,
        delays: Vec::new(),
    };
    let mut latency: Duration = shared.latency.lock().map(|l| *l).unwrap_or_default();
    if let Ok(mut delays) = shared.delays.lock() {
        for d in delays
            .iter_mut()
            .filter(|d| matches(&d.method, &d.path_glob))
        {
            latency += d.delay;
            d.held += 1;
            d.most_held = d.most_held.max(d.held);
            holding.delays.push((d.method.clone(), d.path_glob.clone()));
        }
    }
    if !latency.is_zero() {
        tokio::time::sleep(latency).await;
    }
    drop(holding);
    let fault = shared.faults.lock().ok().and_then(|mut faults| {
        let f = faults
            .iter_mut()
            .find(|f| f.remaining > 0 && matches(&f.method, &f.path_glob))?;
        f.remaining -= 1;
        Some((f.status, f.garbage))
    });
    match fault {
        Some((status, true)) => {
            let mut r = Response::new(Full::new(Bytes::from_static(GARBAGE.as_bytes())).boxed());
            *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
            r.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/html"),
            );
            return Ok(r);
        }
        Some((status, false)) => return Ok(error(&injected(status))),
        None => {}
    }
    let q = parse_query(&query);
    let ctx = Ctx {
        shared: &shared,
        method: parts.method,
        query: q,
        content_type,
        user_agent,
        body,
    };
    Ok(match route(&ctx, &path).await {
        Ok(r) => r,
        Err(e) => error(&e),
    })
}

struct Ctx<'a> {
    shared: &'a Arc<Shared>,
    method: Method,
    query: HashMap<String, String>,
    content_type: Option<String>,
    user_agent: String,
    body: Bytes,
}

impl Ctx<'_> {
    fn json_body(&self) -> Result<Value, ApiError> {
        if self.body.is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_slice(&self.body).map_err(|e| {
            ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
        })
    }
    fn param(&self, k: &str) -> Option<&str> {
        self.query.get(k).map(String::as_str)
    }
    fn manager(&self) -> String {
        match self.param("fieldManager") {
            Some(m) if !m.is_empty() => m.to_string(),
            _ => self
                .user_agent
                .split('/')
                .next()
                .unwrap_or("unknown")
                .to_string(),
        }
    }
}

fn not_served() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

const VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];

fn resource_list(store: &Store, group: &str, version: &str) -> Option<Value> {
    let rs: Vec<_> = store
        .resources()
        .into_iter()
        .filter(|r| r.group == group && r.version == version)
        .collect();
    if rs.is_empty() {
        return None;
    }
    let mut entries = Vec::new();
    for r in rs {
        let mut e = json!({"name": r.plural, "singularName": r.singular, "namespaced": r.namespaced,
            "kind": r.kind, "verbs": VERBS});
        if !r.short_names.is_empty() {
            e["shortNames"] = json!(r.short_names);
        }
        entries.push(e);
        if r.has_status {
            entries.push(
                json!({"name": format!("{}/status", r.plural), "singularName": "",
                "namespaced": r.namespaced, "kind": r.kind, "verbs": ["get", "patch", "update"]}),
            );
        }
        if group.is_empty() && r.plural == "pods" {
            entries.push(
                json!({"name": "pods/eviction", "singularName": "", "namespaced": true,
                "group": "policy", "version": "v1", "kind": "Eviction", "verbs": ["create"]}),
            );
        }
    }
    let gv = if group.is_empty() {
        version.to_string()
    } else {
        format!("{group}/{version}")
    };
    Some(
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": entries}),
    )
}

fn api_group(store: &Store, group: &str) -> Option<Value> {
    let mut versions: Vec<String> = store
        .resources()
        .into_iter()
        .filter(|r| r.group == group)
        .map(|r| r.version.clone())
        .collect();
    versions.dedup();
    let first = versions.first()?.clone();
    Some(json!({
        "kind": "APIGroup", "apiVersion": "v1", "name": group,
        "versions": versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect::<Vec<_>>(),
        "preferredVersion": {"groupVersion": format!("{group}/{first}"), "version": first},
    }))
}

async fn route(ctx: &Ctx<'_>, path: &str) -> Result<Response<Body>, ApiError> {
    let store = &ctx.shared.store;
    let segs: Vec<&str> = path
        .trim_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let get = ctx.method == Method::GET;
    match segs.as_slice() {
        ["version"] if get => Ok(full(
            StatusCode::OK,
            &json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-nodegrace-fake",
                "platform": "linux/amd64", "goVersion": "go1.24", "compiler": "gc"}),
        )),
        ["api"] if get => Ok(full(
            StatusCode::OK,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs":
                [{"clientCIDR": "0.0.0.0/0", "serverAddress": ctx.shared.address}]}),
        )),
        ["api", "v1"] if get => resource_list(store, "", "v1")
            .map(|v| full(StatusCode::OK, &v))
            .ok_or_else(not_served),
        ["apis"] if get => {
            let mut groups: Vec<String> = store
                .resources()
                .iter()
                .filter(|r| !r.group.is_empty())
                .map(|r| r.group.clone())
                .collect();
            groups.sort();
            groups.dedup();
            let list: Vec<Value> = groups.iter().filter_map(|g| api_group(store, g)).collect();
            Ok(full(
                StatusCode::OK,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": list}),
            ))
        }
        ["apis", g] if get => api_group(store, g)
            .map(|v| full(StatusCode::OK, &v))
            .ok_or_else(not_served),
        ["apis", g, v] if get => resource_list(store, g, v)
            .map(|v| full(StatusCode::OK, &v))
            .ok_or_else(not_served),
        ["api", "v1", rest @ ..] if !rest.is_empty() => resource(ctx, "", "v1", rest).await,
        ["apis", g, v, rest @ ..] if !rest.is_empty() => resource(ctx, g, v, rest).await,
        _ => Err(not_served()),
    }
}

async fn resource(
    ctx: &Ctx<'_>,
    group: &str,
    version: &str,
    rest: &[&str],
) -> Result<Response<Body>, ApiError> {
    let store = &ctx.shared.store;
    let namespaced_path = rest[0] == "namespaces"
        && rest.len() >= 3
        && !(rest.len() == 3 && matches!(rest[2], "status" | "finalize"));
    let (ns, plural, name, sub) = if namespaced_path {
        (
            Some(rest[1]),
            rest[2],
            rest.get(3).copied(),
            rest.get(4).copied(),
        )
    } else {
        (None, rest[0], rest.get(1).copied(), rest.get(2).copied())
    };
    if rest.len() > if namespaced_path { 5 } else { 3 } {
        return Err(not_served());
    }
    let ri = store
        .find_resource(group, version, plural)
        .ok_or_else(not_served)?;
    if ns.is_some() && !ri.namespaced {
        return Err(not_served());
    }
    if name.is_some() && ri.namespaced && ns.is_none() {
        return Err(not_served());
    }
    let ns = ns.unwrap_or_default();
    let sub = sub.unwrap_or_default();
    match sub {
        "" => {}
        "status" if ri.has_status => {}
        "eviction" if group.is_empty() && plural == "pods" && ctx.method == Method::POST => {}
        _ => return Err(not_served()),
    }
    let method = ctx.method.clone();
    match (method, name) {
        (Method::GET, Some(name)) => Ok(full(StatusCode::OK, &store.get(&ri, ns, name)?)),
        (Method::GET, None) => {
            let filter = request_filter(ctx, &ri, ns)?;
            if matches!(ctx.param("watch"), Some("true" | "1")) {
                watch(ctx, &ri, filter)
            } else {
                list(ctx, &ri, &filter)
            }
        }
        (Method::POST, None) => {
            check_dry_run(ctx)?;
            let body = ctx.json_body()?;
            check_kind(&ri, &body)?;
            let created = store.create(&ri, ns, body, &ctx.manager())?;
            Ok(full(StatusCode::CREATED, &created))
        }
        (Method::POST, Some(name)) if sub == "eviction" => {
            check_dry_run(ctx)?;
            let body = ctx.json_body()?;
            store.evict(ns, name, &body)?;
            Ok(full(
                StatusCode::CREATED,
                &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}),
            ))
        }
        (Method::PUT, Some(name)) => {
            check_dry_run(ctx)?;
            let body = ctx.json_body()?;
            check_kind(&ri, &body)?;
            Ok(full(
                StatusCode::OK,
                &store.replace(&ri, ns, name, sub, body, &ctx.manager())?,
            ))
        }
        (Method::PATCH, Some(name)) => {
            check_dry_run(ctx)?;
            let ct = ctx.content_type.as_deref().unwrap_or_default();
            let ct = ct.split(';').next().unwrap_or_default().trim();
            let (kind, body) = match ct {
                "application/json-patch+json" => (PatchKind::Json, ctx.json_body()?),
                "application/merge-patch+json" => (PatchKind::Merge, ctx.json_body()?),
                "application/strategic-merge-patch+json" => (PatchKind::Strategic, ctx.json_body()?),
                "application/apply-patch+yaml" | "application/apply-patch+cbor" => {
                    let body: Value = serde_yaml::from_slice(&ctx.body)
                        .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?;
                    check_kind(&ri, &body)?;
                    if body.get("apiVersion").is_none() || body.get("kind").is_none() {
                        return Err(ApiError::bad_request("apiVersion and kind must be set in an apply configuration"));
                    }
                    let force = matches!(ctx.param("force"), Some("true" | "1"));
                    (PatchKind::Apply { force }, body)
                }
                other => {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        format!("the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml (got {other:?})"),
                    ))
                }
            };
            let manager = ctx.param("fieldManager").map(String::from);
            let manager = match (&kind, manager) {
                (PatchKind::Apply { .. }, m) => m,
                (_, Some(m)) => Some(m),
                (_, None) => Some(ctx.manager()),
            };
            Ok(full(
                StatusCode::OK,
                &store.patch(&ri, ns, name, sub, kind, &body, manager.as_deref())?,
            ))
        }
        (Method::DELETE, Some(name)) => {
            check_dry_run(ctx)?;
            let opts = delete_opts(ctx)?;
            let (obj, gone) = store.delete(&ri, ns, name, &opts)?;
            // Pods and custom resources return the deleted object; other kinds a Status.
            let returns_object = ri.crd.is_some() || (ri.group.is_empty() && ri.plural == "pods");
            if gone && !returns_object {
                let uid = obj.pointer("/metadata/uid").cloned().unwrap_or_default();
                Ok(full(
                    StatusCode::OK,
                    &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success",
                        "details": {"name": name, "group": ri.group, "kind": ri.plural, "uid": uid}}),
                ))
            } else {
                Ok(full(StatusCode::OK, &obj))
            }
        }
        (Method::DELETE, None) => {
            check_dry_run(ctx)?;
            let opts = delete_opts(ctx)?;
            let filter = request_filter(ctx, &ri, ns)?;
            let items = store.delete_collection(&ri, &filter, &opts)?;
            Ok(full(
                StatusCode::OK,
                &json!({"kind": format!("{}List", ri.kind), "apiVersion": ri.api_version(),
                    "metadata": {"resourceVersion": store.rv_text(store.resource_version())}, "items": items}),
            ))
        }
        _ => Err(ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )),
    }
}

/// The collection a list, watch or delete-collection addresses, with its selectors.
fn request_filter(ctx: &Ctx<'_>, ri: &ResourceInfo, ns: &str) -> Result<Filter, ApiError> {
    Ok(Filter {
        group: ri.group.clone(),
        plural: ri.plural.clone(),
        namespace: (!ns.is_empty()).then(|| ns.to_string()),
        labels: LabelSelector::parse(ctx.param("labelSelector").unwrap_or_default())?,
        fields: FieldSelector::parse(
            ctx.param("fieldSelector").unwrap_or_default(),
            &ri.group,
            &ri.plural,
        )?,
    })
}

fn check_dry_run(ctx: &Ctx<'_>) -> Result<(), ApiError> {
    if ctx.param("dryRun").is_some_and(|d| !d.is_empty()) {
        return Err(ApiError::bad_request(
            "dryRun is not supported by the nodegrace fake apiserver",
        ));
    }
    Ok(())
}

fn check_kind(ri: &ResourceInfo, body: &Value) -> Result<(), ApiError> {
    let kind = body.get("kind").and_then(Value::as_str);
    let av = body.get("apiVersion").and_then(Value::as_str);
    if kind.is_some_and(|k| k != ri.kind) || av.is_some_and(|a| a != ri.api_version()) {
        return Err(ApiError::bad_request(format!(
            "the API version in the data ({}) does not match the expected API version ({})",
            av.unwrap_or_default(),
            ri.api_version()
        )));
    }
    Ok(())
}

fn delete_opts(ctx: &Ctx<'_>) -> Result<DeleteOpts, ApiError> {
    let body = ctx.json_body()?;
    let mut opts = DeleteOpts::from_body(&body);
    if let Some(g) = ctx.param("gracePeriodSeconds") {
        opts.grace_period_seconds = Some(
            g.parse()
                .map_err(|_| ApiError::bad_request("invalid gracePeriodSeconds"))?,
        );
    }
    Ok(opts)
}

fn strip_type(ri: &ResourceInfo, mut v: Value) -> Value {
    // Core list items carry no type meta on a real server; custom resources do.
    if ri.crd.is_none() {
        if let Some(o) = v.as_object_mut() {
            o.remove("apiVersion");
            o.remove("kind");
        }
    }
    v
}

fn list(ctx: &Ctx<'_>, ri: &ResourceInfo, filter: &Filter) -> Result<Response<Body>, ApiError> {
    let store = &ctx.shared.store;
    let (items, rv) = store.list(filter);
    if ctx.param("resourceVersionMatch") == Some("Exact") {
        if let Some(want) = ctx.param("resourceVersion") {
            if want != store.rv_text(rv) {
                return Err(ApiError::expired(format!(
                    "too old resource version: {want} ({rv}) (the fake serves only the latest state)"
                )));
            }
        }
    }
    let mut list_rv = rv;
    let mut start = 0;
    if let Some(token) = ctx.param("continue").filter(|t| !t.is_empty()) {
        let mut parts = token.splitn(3, '|');
        let (Some(trv), Some(tns), Some(tname)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(ApiError::bad_request("continue key is not valid"));
        };
        let trv: u64 = trv
            .parse()
            .map_err(|_| ApiError::bad_request("continue key is not valid"))?;
        if trv < store.oldest_rv() {
            return Err(ApiError::expired(
                "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter.",
            ));
        }
        list_rv = trv;
        start = items
            .iter()
            .position(|i| {
                let ns = i
                    .pointer("/metadata/namespace")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let name = i
                    .pointer("/metadata/name")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                (ns, name) > (tns, tname)
            })
            .unwrap_or(items.len());
    }
    let limit: usize = ctx
        .param("limit")
        .and_then(|l| l.parse().ok())
        .filter(|l| *l > 0)
        .unwrap_or(usize::MAX);
    let end = start.saturating_add(limit).min(items.len());
    let mut meta = json!({"resourceVersion": store.rv_text(list_rv)});
    if end < items.len() {
        let last = &items[end - 1];
        let ns = last
            .pointer("/metadata/namespace")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let name = last
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        meta["continue"] = format!("{list_rv}|{ns}|{name}").into();
        meta["remainingItemCount"] = (items.len() - end).into();
    }
    let page: Vec<Value> = items[start..end]
        .iter()
        .cloned()
        .map(|i| strip_type(ri, i))
        .collect();
    Ok(full(
        StatusCode::OK,
        &json!({"kind": format!("{}List", ri.kind), "apiVersion": ri.api_version(), "metadata": meta, "items": page}),
    ))
}

fn line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

fn watch(ctx: &Ctx<'_>, ri: &ResourceInfo, filter: Filter) -> Result<Response<Body>, ApiError> {
    let store = ctx.shared.store.clone();
    let rv_param = ctx.param("resourceVersion").unwrap_or_default().to_string();
    let send_initial = ctx.param("sendInitialEvents") == Some("true");
    let bookmarks = ctx.param("allowWatchBookmarks") == Some("true");
    let timeout = ctx
        .param("timeoutSeconds")
        .and_then(|t| t.parse::<u64>().ok())
        .map(Duration::from_secs)
        .unwrap_or(Duration::from_secs(1800));
    let start_rv: Option<u64> = if rv_param.is_empty() || rv_param == "0" || send_initial {
        None
    } else {
        Some(store.rv_parse(&rv_param).ok_or_else(|| {
            ApiError::bad_request(format!("invalid resource version: {rv_param}"))
        })?)
    };
    let (kind, api_version) = (ri.kind.clone(), ri.api_version());
    let (shared, plural) = (ctx.shared.clone(), ri.plural.clone());
    let rv_store = store.clone();
    let bookmark = move |rv: u64, initial_end: bool| {
        let mut m = json!({"resourceVersion": rv_store.rv_text(rv)});
        if initial_end {
            m["annotations"] = json!({"k8s.io/initial-events-end": "true"});
        }
        line(
            &json!({"type": "BOOKMARK", "object": {"kind": kind, "apiVersion": api_version, "metadata": m}}),
        )
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(256);
    let mut changes = store.subscribe();
    let epoch = store.compactions();
    tokio::spawn(async move {
        let deadline = tokio::time::Instant::now() + timeout;
        let mut last = match start_rv {
            Some(rv) => rv,
            None => {
                let (items, rv) = store.snapshot(&filter);
                for obj in items {
                    if tx
                        .send(line(&json!({"type": "ADDED", "object": obj})))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
                if send_initial && bookmarks && tx.send(bookmark(rv, true)).await.is_err() {
                    return;
                }
                rv
            }
        };
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + Duration::from_secs(60),
            Duration::from_secs(60),
        );
        loop {
            if shared.is_stalled(&plural) {
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep_until(deadline) => return,
                    _ = tokio::time::sleep(Duration::from_millis(50)) => {}
                }
                continue;
            }
            for event in shared.take_injected_events(&plural) {
                if tx.send(line(&event)).await.is_err() {
                    return;
                }
            }
            let batch = if store.compactions() != epoch {
                WatchBatch::Expired(store.oldest_rv())
            } else {
                store.events_after(last, &filter)
            };
            match batch {
                WatchBatch::Expired(oldest) => {
                    let status =
                        ApiError::expired(format!("too old resource version: {last} ({oldest})"))
                            .to_status();
                    let _ = tx
                        .send(line(&json!({"type": "ERROR", "object": status})))
                        .await;
                    return;
                }
                WatchBatch::Events(events, rv) => {
                    for (kind, obj) in events {
                        if tx
                            .send(line(&json!({"type": kind.as_str(), "object": obj})))
                            .await
                            .is_err()
                        {
                            return;
                        }
                    }
                    last = rv;
                }
            }
            tokio::select! {
                r = changes.changed() => if r.is_err() { return },
                _ = tx.closed() => return,
                _ = tokio::time::sleep_until(deadline) => return,
                _ = tick.tick(), if bookmarks => {
                    if tx.send(bookmark(last, false)).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx))
    });
    let mut r = Response::new(BodyExt::boxed(StreamBody::new(stream)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_and_queries() {
        assert!(glob_match(
            "/api/v1/namespaces/*/pods/*/eviction",
            "/api/v1/namespaces/a/pods/b/eviction"
        ));
        assert!(!glob_match("/api/v1/nodes", "/api/v1/nodes/x"));
        assert!(glob_match("*", "/anything"));
        let q = parse_query("fieldSelector=spec.nodeName%3Dn1&watch=true&labelSelector=a+in+(b)");
        assert_eq!(q["fieldSelector"], "spec.nodeName=n1");
        assert_eq!(q["labelSelector"], "a in (b)");
    }
}
