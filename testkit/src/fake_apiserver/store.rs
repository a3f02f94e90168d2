//! The object store: one global resourceVersion, bounded watch history, the write semantics
//! of the real registry (preconditions, graceful pod deletion, finalizers, status subresource,
//! managed fields), CRD-driven resource registration and the disruption controller's PDB status.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Map, Value};
use tokio::sync::watch;

use super::schema::{self, Shape};
use super::select::{label_selector_object_matches, FieldSelector, LabelSelector};
use super::ssa::{self, ManagerEntry};
use super::str_list;

/// An error answered as a `metav1.Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: u16,
    pub reason: String,
    pub message: String,
    pub details: Option<Value>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

impl ApiError {
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason: reason.into(),
            message: message.into(),
            details: None,
        }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", m)
    }
    fn with_details(mut self, ri: &ResourceInfo, name: &str) -> Self {
        let mut d = json!({"name": name, "kind": ri.plural});
        if !ri.group.is_empty() {
            d["group"] = ri.group.clone().into();
        }
        self.details = Some(d);
        self
    }
    pub fn not_found(ri: &ResourceInfo, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", ri.qualified()),
        )
        .with_details(ri, name)
    }
    pub fn already_exists(ri: &ResourceInfo, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", ri.qualified()),
        )
        .with_details(ri, name)
    }
    pub fn conflict(ri: &ResourceInfo, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                ri.qualified()
            ),
        )
        .with_details(ri, name)
    }
    pub fn stale(ri: &ResourceInfo, name: &str) -> Self {
        Self::conflict(
            ri,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }
    pub fn invalid(ri: &ResourceInfo, name: &str, errs: &[String]) -> Self {
        let mut e = Self::new(
            422,
            "Invalid",
            format!(
                "{}.{} \"{name}\" is invalid: {}",
                ri.kind,
                ri.group,
                errs.join(", ")
            ),
        )
        .with_details(ri, name);
        if let Some(d) = e.details.as_mut() {
            d["causes"] = errs
                .iter()
                .map(|m| json!({"reason": "FieldValueInvalid", "message": m}))
                .collect();
        }
        e
    }
    pub fn expired(m: impl Into<String>) -> Self {
        Self::new(410, "Expired", m)
    }
    pub fn apply_conflict(conflicts: &[(String, ssa::FieldPath)], api_version: &str) -> Self {
        let lines: Vec<String> = conflicts
            .iter()
            .map(|(m, p)| {
                format!(
                    "conflict with \"{m}\" using {api_version}: {}",
                    ssa::render_path(p)
                )
            })
            .collect();
        let causes: Vec<Value> = conflicts
            .iter()
            .map(|(m, p)| {
                json!({"reason": "FieldManagerConflict",
                       "message": format!("conflict with \"{m}\" using {api_version}"),
                       "field": ssa::render_path(p)})
            })
            .collect();
        let n = conflicts.len();
        let mut e = Self::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {n} conflict{}: {}",
                if n == 1 { "" } else { "s" },
                lines.join("\n")
            ),
        );
        e.details = Some(json!({"causes": causes}));
        e
    }

    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {},
            "status": "Failure", "message": self.message, "reason": self.reason, "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

/// One served group/version/resource.
#[derive(Debug, Clone)]
pub struct ResourceInfo {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub has_status: bool,
    /// openAPIV3Schema for CRD-served resources.
    pub schema: Option<Value>,
    pub crd: Option<String>,
    pub short_names: Vec<String>,
}

impl ResourceInfo {
    fn builtin(
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        namespaced: bool,
        has_status: bool,
    ) -> Self {
        Self {
            group: group.into(),
            version: version.into(),
            plural: plural.into(),
            singular: kind.to_lowercase(),
            kind: kind.into(),
            namespaced,
            has_status,
            schema: None,
            crd: None,
            short_names: Vec::new(),
        }
    }
    pub fn api_version(&self) -> String {
        if self.group.is_empty() {
            self.version.clone()
        } else {
            format!("{}/{}", self.group, self.version)
        }
    }
    pub fn qualified(&self) -> String {
        if self.group.is_empty() {
            self.plural.clone()
        } else {
            format!("{}.{}", self.plural, self.group)
        }
    }
    pub fn shape(&self) -> Shape {
        match &self.schema {
            Some(s) => Shape::Schema(s.clone()),
            None => Shape::Builtin {
                group: self.group.clone(),
                plural: self.plural.clone(),
            },
        }
    }
    fn is_pod(&self) -> bool {
        self.group.is_empty() && self.plural == "pods"
    }
}

fn builtin_resources() -> Vec<ResourceInfo> {
    vec![
        ResourceInfo::builtin("", "v1", "namespaces", "Namespace", false, true),
        ResourceInfo::builtin("", "v1", "nodes", "Node", false, true),
        ResourceInfo::builtin("", "v1", "pods", "Pod", true, true),
        ResourceInfo::builtin("", "v1", "events", "Event", true, false),
        ResourceInfo::builtin(
            "policy",
            "v1",
            "poddisruptionbudgets",
            "PodDisruptionBudget",
            true,
            true,
        ),
        ResourceInfo::builtin(
            "storage.k8s.io",
            "v1",
            "volumeattachments",
            "VolumeAttachment",
            false,
            true,
        ),
        ResourceInfo::builtin("events.k8s.io", "v1", "events", "Event", true, false),
        ResourceInfo::builtin("coordination.k8s.io", "v1", "leases", "Lease", true, false),
        ResourceInfo::builtin(
            "apiextensions.k8s.io",
            "v1",
            "customresourcedefinitions",
            "CustomResourceDefinition",
            false,
            true,
        ),
    ]
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjKey {
    pub group: String,
    pub plural: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

#[derive(Debug, Clone)]
pub struct StoreEvent {
    pub rv: u64,
    pub key: ObjKey,
    pub kind: EventType,
    pub object: Value,
    pub old: Option<Value>,
}

struct Stored {
    obj: Value,
    managed: Vec<ManagerEntry>,
}

struct Inner {
    rv: u64,
    resources: Vec<Arc<ResourceInfo>>,
    objects: BTreeMap<ObjKey, Stored>,
    history: VecDeque<StoreEvent>,
    history_limit: usize,
    /// Watches and continues from a resourceVersion below this get 410 Gone.
    oldest_rv: u64,
    counter: u64,
    compactions: u64,
}

impl Inner {
    /// Objects of one resource (optionally one namespace), by key range instead of a full scan.
    fn scan<'a>(
        &'a self,
        group: &'a str,
        plural: &'a str,
        ns: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a ObjKey, &'a Stored)> + 'a {
        let start = ObjKey {
            group: group.to_string(),
            plural: plural.to_string(),
            namespace: ns.unwrap_or_default().to_string(),
            name: String::new(),
        };
        self.objects.range(start..).take_while(move |(k, _)| {
            k.group == group && k.plural == plural && ns.is_none_or(|n| k.namespace == n)
        })
    }
}

/// Wall-clock timestamps derived from tokio's clock, so paused time moves them consistently.
#[derive(Debug)]
struct Clock {
    wall: DateTime<Utc>,
    mono: tokio::time::Instant,
    /// Steps taken so far (milliseconds), as an NTP step moves a host's clock.
    stepped_ms: std::sync::atomic::AtomicI64,
}

impl Clock {
    fn now(&self) -> DateTime<Utc> {
        let stepped = chrono::Duration::milliseconds(
            self.stepped_ms.load(std::sync::atomic::Ordering::SeqCst),
        );
        self.wall + chrono::Duration::from_std(self.mono.elapsed()).unwrap_or_default() + stepped
    }
}

pub fn fmt_time(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Secs, true)
}

/// `t` plus `seconds` (a grace period may be any int64), at most the last day a client can
/// read (a four-digit year; k8s-openapi's time type ends on 9999-12-30).
fn after_seconds(t: DateTime<Utc>, seconds: i64) -> DateTime<Utc> {
    let last = DateTime::parse_from_rfc3339("9999-12-30T00:00:00Z").map(|d| d.to_utc());
    chrono::TimeDelta::try_seconds(seconds)
        .and_then(|d| t.checked_add_signed(d))
        .into_iter()
        .chain(last.ok())
        .min()
        .unwrap_or(t)
}

/// Options of a DELETE (body `DeleteOptions` merged with query parameters).
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub grace_period_seconds: Option<i64>,
    pub uid: Option<String>,
    pub resource_version: Option<String>,
}

impl DeleteOpts {
    pub fn from_body(body: &Value) -> Self {
        Self {
            grace_period_seconds: body.get("gracePeriodSeconds").and_then(Value::as_i64),
            uid: body
                .pointer("/preconditions/uid")
                .and_then(Value::as_str)
                .map(String::from),
            resource_version: body
                .pointer("/preconditions/resourceVersion")
                .and_then(Value::as_str)
                .map(String::from),
        }
    }
}

pub enum PatchKind {
    Json,
    Merge,
    Strategic,
    Apply { force: bool },
}

/// What a list/watch selects.
#[derive(Debug, Clone)]
pub struct Filter {
    pub group: String,
    pub plural: String,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Filter {
    pub fn all(group: &str, plural: &str) -> Self {
        Self {
            group: group.into(),
            plural: plural.into(),
            namespace: None,
            labels: LabelSelector::default(),
            fields: FieldSelector::default(),
        }
    }
    fn matches_key(&self, k: &ObjKey) -> bool {
        k.group == self.group
            && k.plural == self.plural
            && self.namespace.as_ref().is_none_or(|ns| *ns == k.namespace)
    }
    fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

/// A watch step: events after a resourceVersion, or the fact the history no longer has them.
pub enum WatchBatch {
    Events(Vec<(EventType, Value)>, u64),
    Expired(u64),
}

/// The shared object store. All methods are synchronous and never sleep.
pub struct Store {
    inner: Mutex<Inner>,
    notify: watch::Sender<u64>,
    clock: Clock,
    /// resourceVersions served as text that is no number and runs backwards
    /// ([`Store::serve_opaque_resource_versions`]).
    opaque_rvs: std::sync::atomic::AtomicBool,
    /// Writes refused for a resourceVersion precondition that no longer held, as
    /// `plural/name`.
    conflicts: Mutex<Vec<String>>,
}

/// Opaque resourceVersions count down from here: `v999999999998` is older than
/// `v999999999997`, as text and as the digits after the `v`.
const OPAQUE_RV_BASE: u64 = 999_999_999_999;

fn meta<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
}

fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

fn finalizers(obj: &Value) -> Vec<String> {
    str_list(obj.pointer("/metadata/finalizers"))
        .into_iter()
        .map(String::from)
        .collect()
}

fn pod_phase(pod: &Value) -> &str {
    pod.pointer("/status/phase")
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn is_terminal(pod: &Value) -> bool {
    matches!(pod_phase(pod), "Succeeded" | "Failed")
}

/// Ready for PDB purposes: Running, not terminating, and the Ready condition True when present.
pub fn pod_is_healthy(pod: &Value) -> bool {
    if pod_phase(pod) != "Running" || pod.pointer("/metadata/deletionTimestamp").is_some() {
        return false;
    }
    let ready = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .and_then(|cs| {
            cs.iter()
                .find(|c| c.get("type").and_then(Value::as_str) == Some("Ready"))
        });
    ready.is_none_or(|c| c.get("status").and_then(Value::as_str) == Some("True"))
}

/// Everything but metadata and (optionally) status, for generation and no-op detection.
fn content(obj: &Value, include_status: bool) -> Value {
    let mut o = obj.as_object().cloned().unwrap_or_default();
    o.remove("metadata");
    o.remove("apiVersion");
    o.remove("kind");
    if !include_status {
        o.remove("status");
    }
    Value::Object(o)
}

fn scaled(v: Option<&Value>, total: i64, round_up: bool) -> Option<i64> {
    match v? {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => {
            let pct: f64 = s.trim_end_matches('%').parse().ok()?;
            let x = pct * total as f64 / 100.0;
            Some(if round_up { x.ceil() } else { x.floor() } as i64)
        }
        _ => None,
    }
}

impl Default for Store {
    fn default() -> Self {
        Self::new()
    }
}

impl Store {
    pub fn new() -> Self {
        let (notify, _) = watch::channel(1);
        let store = Self {
            inner: Mutex::new(Inner {
                rv: 1,
                resources: builtin_resources().into_iter().map(Arc::new).collect(),
                objects: BTreeMap::new(),
                history: VecDeque::new(),
                history_limit: 2000,
                oldest_rv: 1,
                counter: 0,
                compactions: 0,
            }),
            notify,
            clock: Clock {
                wall: Utc::now(),
                mono: tokio::time::Instant::now(),
                stepped_ms: Default::default(),
            },
            opaque_rvs: Default::default(),
            conflicts: Default::default(),
        };
        for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
            let _ = store.insert_fixture(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            );
        }
        store
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock is a test failure anyway; keep serving.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// Steps the apiserver's clock by `by` (timestamps it writes from now on move with it).
    pub fn step_clock(&self, by: chrono::Duration) {
        self.clock
            .stepped_ms
            .fetch_add(by.num_milliseconds(), std::sync::atomic::Ordering::SeqCst);
    }

    pub fn now_str(&self) -> String {
        fmt_time(self.now())
    }

    /// Notified with the latest resourceVersion after every write.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.notify.subscribe()
    }

    pub fn resource_version(&self) -> u64 {
        self.lock().rv
    }

    /// From now on, resourceVersions are served as text that is not a number and whose
    /// order (as text, or as the digits in it) is the reverse of the writes' (API
    /// conventions make them opaque; only equality means anything). Objects already stored
    /// are stamped again; watch history is dropped (call it before anyone watches).
    pub fn serve_opaque_resource_versions(&self) {
        self.opaque_rvs
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let mut g = self.lock();
        let current = g.rv;
        for stored in g.objects.values_mut() {
            let numeric = meta(&stored.obj, "resourceVersion").and_then(|v| v.parse::<u64>().ok());
            let text = self.rv_text(numeric.unwrap_or(current));
            meta_mut(&mut stored.obj).insert("resourceVersion".into(), text.into());
        }
        g.history.clear();
        g.oldest_rv = current;
    }

    /// The writes refused (409) because the resourceVersion they were made on was no longer
    /// the object's, as `plural/name`.
    pub fn conflicts(&self) -> Vec<String> {
        self.conflicts.lock().map(|c| c.clone()).unwrap_or_default()
    }

    fn stale(&self, ri: &ResourceInfo, name: &str) -> ApiError {
        if let Ok(mut c) = self.conflicts.lock() {
            c.push(format!("{}/{name}", ri.plural));
        }
        ApiError::stale(ri, name)
    }

    /// Wakes every open watch (nothing changed).
    pub fn poke_watches(&self) {
        let rv = self.lock().rv;
        self.notify.send_replace(rv);
    }

    /// A resourceVersion as served.
    pub fn rv_text(&self, rv: u64) -> String {
        if self.opaque_rvs.load(std::sync::atomic::Ordering::SeqCst) {
            format!("v{}", OPAQUE_RV_BASE.saturating_sub(rv))
        } else {
            rv.to_string()
        }
    }

    /// A resourceVersion a client sent, if it is one this store served.
    pub fn rv_parse(&self, text: &str) -> Option<u64> {
        if self.opaque_rvs.load(std::sync::atomic::Ordering::SeqCst) {
            let n: u64 = text.strip_prefix('v')?.parse().ok()?;
            OPAQUE_RV_BASE.checked_sub(n)
        } else {
            text.parse().ok()
        }
    }

    pub fn set_history_limit(&self, limit: usize) {
        self.lock().history_limit = limit.max(1);
    }

    /// Forgets all watch history, like an etcd compaction that the watch cache fell behind:
    /// every open watch ends with a 410 ERROR event, and any watch or continue token from an
    /// older resourceVersion gets 410 too.
    pub fn compact(&self) {
        let mut g = self.lock();
        g.history.clear();
        g.oldest_rv = g.rv;
        g.compactions += 1;
        self.notify.send_replace(g.rv);
    }

    /// How many times [`compact`](Self::compact) ran; open watches end when it changes.
    pub fn compactions(&self) -> u64 {
        self.lock().compactions
    }

    pub fn resources(&self) -> Vec<Arc<ResourceInfo>> {
        self.lock().resources.clone()
    }

    /// Serves a built-in resource that a default apiserver leaves off (an alpha API enabled
    /// with `--runtime-config`), from now on.
    pub fn serve_builtin(
        &self,
        group: &str,
        version: &str,
        plural: &str,
        kind: &str,
        namespaced: bool,
        has_status: bool,
    ) {
        let mut g = self.lock();
        if !g
            .resources
            .iter()
            .any(|r| r.group == group && r.version == version && r.plural == plural)
        {
            g.resources.push(Arc::new(ResourceInfo::builtin(
                group, version, plural, kind, namespaced, has_status,
            )));
        }
    }

    pub fn find_resource(
        &self,
        group: &str,
        version: &str,
        plural: &str,
    ) -> Option<Arc<ResourceInfo>> {
        self.lock()
            .resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.plural == plural)
            .cloned()
    }

    fn resource_for(&self, api_version: &str, kind: &str) -> Option<Arc<ResourceInfo>> {
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        self.lock()
            .resources
            .iter()
            .find(|r| r.group == group && r.version == version && r.kind == kind)
            .cloned()
    }

    fn key(ri: &ResourceInfo, ns: &str, name: &str) -> ObjKey {
        ObjKey {
            group: ri.group.clone(),
            plural: ri.plural.clone(),
            namespace: if ri.namespaced {
                ns.to_string()
            } else {
                String::new()
            },
            name: name.to_string(),
        }
    }

    // ---------------------------------------------------------------- reads

    pub fn get(&self, ri: &ResourceInfo, ns: &str, name: &str) -> Result<Value, ApiError> {
        let g = self.lock();
        g.objects
            .get(&Self::key(ri, ns, name))
            .map(|s| with_type(ri, &s.obj))
            .ok_or_else(|| ApiError::not_found(ri, name))
    }

    /// In-process read by group/plural (namespace "" for cluster-scoped).
    pub fn get_obj(&self, group: &str, plural: &str, ns: &str, name: &str) -> Option<Value> {
        let key = ObjKey {
            group: group.into(),
            plural: plural.into(),
            namespace: ns.into(),
            name: name.into(),
        };
        self.lock().objects.get(&key).map(|s| s.obj.clone())
    }

    /// Objects matching the filter, sorted by namespace/name, with the current resourceVersion.
    pub fn list(&self, filter: &Filter) -> (Vec<Value>, u64) {
        let g = self.lock();
        let items = g
            .scan(&filter.group, &filter.plural, filter.namespace.as_deref())
            .filter(|(k, s)| filter.matches_key(k) && filter.matches(&s.obj))
            .map(|(_, s)| s.obj.clone())
            .collect();
        (items, g.rv)
    }

    /// The oldest resourceVersion a watch may still resume from.
    pub fn oldest_rv(&self) -> u64 {
        self.lock().oldest_rv
    }

    /// A consistent snapshot of matching objects and the rv to watch from.
    pub fn snapshot(&self, filter: &Filter) -> (Vec<Value>, u64) {
        self.list(filter)
    }

    pub fn events_after(&self, rv: u64, filter: &Filter) -> WatchBatch {
        let g = self.lock();
        if rv < g.oldest_rv {
            return WatchBatch::Expired(g.oldest_rv);
        }
        let mut out = Vec::new();
        let first = g.history.partition_point(|e| e.rv <= rv);
        for e in g
            .history
            .range(first..)
            .filter(|e| filter.matches_key(&e.key))
        {
            let now = e.kind != EventType::Deleted && filter.matches(&e.object);
            let before = match (&e.kind, &e.old) {
                (EventType::Deleted, _) => filter.matches(&e.object),
                (_, Some(old)) => filter.matches(old),
                (_, None) => false,
            };
            let kind = match (before, now) {
                (true, true) => EventType::Modified,
                (false, true) => EventType::Added,
                (true, false) => EventType::Deleted,
                (false, false) => continue,
            };
            out.push((kind, e.object.clone()));
        }
        WatchBatch::Events(out, g.rv)
    }

    // ---------------------------------------------------------------- writes

    fn commit(
        &self,
        g: &mut Inner,
        key: ObjKey,
        new: Option<Value>,
        managed: Vec<ManagerEntry>,
    ) -> Option<Value> {
        g.rv += 1;
        let rv = g.rv;
        let old = g.objects.remove(&key).map(|s| s.obj);
        let (kind, object) = match new {
            Some(mut obj) => {
                meta_mut(&mut obj).insert("resourceVersion".into(), self.rv_text(rv).into());
                if managed.is_empty() {
                    meta_mut(&mut obj).remove("managedFields");
                } else {
                    meta_mut(&mut obj).insert("managedFields".into(), ssa::render(&managed));
                }
                g.objects.insert(
                    key.clone(),
                    Stored {
                        obj: obj.clone(),
                        managed,
                    },
                );
                (
                    if old.is_some() {
                        EventType::Modified
                    } else {
                        EventType::Added
                    },
                    obj,
                )
            }
            None => {
                let mut obj = old.clone().unwrap_or_else(|| json!({}));
                meta_mut(&mut obj).insert("resourceVersion".into(), self.rv_text(rv).into());
                (EventType::Deleted, obj)
            }
        };
        let ri = g
            .resources
            .iter()
            .find(|r| r.group == key.group && r.plural == key.plural)
            .cloned();
        let typed = match &ri {
            Some(ri) => with_type(ri, &object),
            None => object.clone(),
        };
        g.history.push_back(StoreEvent {
            rv,
            key: key.clone(),
            kind,
            object: typed,
            old: old.clone(),
        });
        while g.history.len() > g.history_limit {
            if let Some(e) = g.history.pop_front() {
                g.oldest_rv = e.rv;
            }
        }
        if key.group == "apiextensions.k8s.io" && key.plural == "customresourcedefinitions" {
            self.crd_changed(
                g,
                &key.name,
                if kind == EventType::Deleted {
                    None
                } else {
                    Some(&object)
                },
            );
        }
        let pdb_relevant = (key.group.is_empty() && key.plural == "pods")
            || (key.group == "policy" && key.plural == "poddisruptionbudgets");
        if pdb_relevant {
            self.recompute_pdbs(g, &key.namespace);
        }
        self.notify.send_replace(g.rv);
        if kind == EventType::Deleted {
            old
        } else {
            Some(object)
        }
    }

    fn crd_changed(&self, g: &mut Inner, crd_name: &str, crd: Option<&Value>) {
        g.resources.retain(|r| r.crd.as_deref() != Some(crd_name));
        let Some(crd) = crd else {
            let group_plural = crd_name
                .split_once('.')
                .map(|(p, g)| (g.to_string(), p.to_string()));
            if let Some((group, plural)) = group_plural {
                let keys: Vec<ObjKey> = g
                    .objects
                    .keys()
                    .filter(|k| k.group == group && k.plural == plural)
                    .cloned()
                    .collect();
                for k in keys {
                    self.commit(g, k, None, Vec::new());
                }
            }
            return;
        };
        if crd.pointer("/metadata/deletionTimestamp").is_some() {
            return;
        }
        let spec = &crd["spec"];
        let s = |p: &str| {
            spec.pointer(p)
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string()
        };
        let short_names: Vec<String> = str_list(spec.pointer("/names/shortNames"))
            .into_iter()
            .map(String::from)
            .collect();
        for v in spec
            .get("versions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if v.get("served").and_then(Value::as_bool) == Some(false) {
                continue;
            }
            g.resources.push(Arc::new(ResourceInfo {
                group: s("/group"),
                version: v
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .into(),
                plural: s("/names/plural"),
                singular: {
                    let sg = s("/names/singular");
                    if sg.is_empty() {
                        s("/names/kind").to_lowercase()
                    } else {
                        sg
                    }
                },
                kind: s("/names/kind"),
                namespaced: s("/scope") == "Namespaced",
                has_status: v.pointer("/subresources/status").is_some(),
                schema: v.pointer("/schema/openAPIV3Schema").cloned(),
                crd: Some(crd_name.to_string()),
                short_names: short_names.clone(),
            }));
        }
    }

    /// The disruption controller, run synchronously after every pod or PDB write.
    fn recompute_pdbs(&self, g: &mut Inner, ns: &str) {
        let pdb_keys: Vec<ObjKey> = g
            .scan("policy", "poddisruptionbudgets", Some(ns))
            .map(|(k, _)| k.clone())
            .collect();
        for key in pdb_keys {
            let Some(stored) = g.objects.get(&key) else {
                continue;
            };
            let pdb = stored.obj.clone();
            let pods: Vec<&Value> = g
                .scan("", "pods", Some(ns))
                .map(|(_, s)| &s.obj)
                .filter(|p| label_selector_object_matches(pdb.pointer("/spec/selector"), p))
                .collect();
            let mut disrupted = pdb
                .pointer("/status/disruptedPods")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default();
            disrupted.retain(|name, _| {
                pods.iter().any(|p| {
                    meta(p, "name") == Some(name.as_str())
                        && p.pointer("/metadata/deletionTimestamp").is_none()
                })
            });
            let healthy = pods
                .iter()
                .filter(|p| pod_is_healthy(p))
                .filter(|p| !disrupted.contains_key(meta(p, "name").unwrap_or_default()))
                .count() as i64;
            let expected = pods.len() as i64;
            let desired = if let Some(mu) = pdb.pointer("/spec/maxUnavailable") {
                (expected - scaled(Some(mu), expected, true).unwrap_or(0)).max(0)
            } else if let Some(ma) = pdb.pointer("/spec/minAvailable") {
                scaled(Some(ma), expected, true).unwrap_or(0)
            } else {
                0
            };
            let allowed = (healthy - desired).max(0);
            let old_status = pdb.get("status").cloned().unwrap_or_else(|| json!({}));
            let allowed_str = if allowed > 0 { "True" } else { "False" };
            let old_cond = old_status.pointer("/conditions/0").cloned();
            let cond = match old_cond {
                Some(c) if c.get("status").and_then(Value::as_str) == Some(allowed_str) => c,
                _ => json!({
                    "type": "DisruptionAllowed", "status": allowed_str,
                    "reason": if allowed > 0 { "SufficientPods" } else { "InsufficientPods" },
                    "message": "", "lastTransitionTime": fmt_time(self.clock.now()),
                    "observedGeneration": pdb.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
                }),
            };
            let mut status = json!({
                "observedGeneration": pdb.pointer("/metadata/generation").cloned().unwrap_or(json!(1)),
                "disruptionsAllowed": allowed, "currentHealthy": healthy,
                "desiredHealthy": desired, "expectedPods": expected, "conditions": [cond],
            });
            if !disrupted.is_empty() {
                status["disruptedPods"] = Value::Object(disrupted);
            }
            if status != old_status {
                let mut new = pdb.clone();
                new["status"] = status;
                let managed = g
                    .objects
                    .get(&key)
                    .map(|s| s.managed.clone())
                    .unwrap_or_default();
                self.commit_raw(g, key, new, managed);
            }
        }
    }

    /// A write that does not re-trigger controllers (used by the PDB controller itself).
    fn commit_raw(&self, g: &mut Inner, key: ObjKey, mut obj: Value, managed: Vec<ManagerEntry>) {
        g.rv += 1;
        let rv = g.rv;
        meta_mut(&mut obj).insert("resourceVersion".into(), self.rv_text(rv).into());
        let old = g
            .objects
            .insert(
                key.clone(),
                Stored {
                    obj: obj.clone(),
                    managed,
                },
            )
            .map(|s| s.obj);
        let typed = match g
            .resources
            .iter()
            .find(|r| r.group == key.group && r.plural == key.plural)
        {
            Some(ri) => with_type(ri, &obj),
            None => obj,
        };
        g.history.push_back(StoreEvent {
            rv,
            key,
            kind: EventType::Modified,
            object: typed,
            old,
        });
        while g.history.len() > g.history_limit {
            if let Some(e) = g.history.pop_front() {
                g.oldest_rv = e.rv;
            }
        }
    }

    fn next_id(g: &mut Inner) -> u64 {
        g.counter += 1;
        g.counter
    }

    fn validate_cr(ri: &ResourceInfo, name: &str, obj: &mut Value) -> Result<(), ApiError> {
        if let Some(schema) = &ri.schema {
            schema::default_and_prune(obj, schema);
            let errs = schema::validate(obj, schema);
            if !errs.is_empty() {
                return Err(ApiError::invalid(ri, name, &errs));
            }
        }
        Ok(())
    }

    /// POST: create with the registry's create-time rules.
    pub fn create(
        &self,
        ri: &ResourceInfo,
        ns: &str,
        mut obj: Value,
        manager: &str,
    ) -> Result<Value, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be an object",
            ));
        }
        let mut g = self.lock();
        if ri.namespaced {
            if let Some(body_ns) = meta(&obj, "namespace") {
                if body_ns != ns {
                    return Err(ApiError::bad_request(
                        "the namespace of the provided object does not match the namespace sent on the request",
                    ));
                }
            }
            let ns_key = ObjKey {
                group: String::new(),
                plural: "namespaces".into(),
                namespace: String::new(),
                name: ns.into(),
            };
            match g.objects.get(&ns_key) {
                None => {
                    return Err(ApiError::new(404, "NotFound", format!("namespaces \"{ns}\" not found"))
                        .with_details(&ResourceInfo::builtin("", "v1", "namespaces", "Namespace", false, true), ns))
                }
                Some(n) if n.obj.pointer("/metadata/deletionTimestamp").is_some() => {
                    return Err(ApiError::new(
                        403,
                        "Forbidden",
                        format!("unable to create new content in namespace {ns} because it is being terminated"),
                    ))
                }
                _ => {}
            }
        }
        let name = match meta(&obj, "name").filter(|n| !n.is_empty()) {
            Some(n) => n.to_string(),
            None => match meta(&obj, "generateName") {
                Some(prefix) => {
                    let id = Self::next_id(&mut g);
                    format!("{prefix}{}", suffix(id))
                }
                None => {
                    return Err(ApiError::invalid(
                        ri,
                        "",
                        &[
                            "metadata.name: Required value: name or generateName is required"
                                .into(),
                        ],
                    ))
                }
            },
        };
        let key = Self::key(ri, ns, &name);
        if g.objects.contains_key(&key) {
            return Err(ApiError::already_exists(ri, &name));
        }
        if meta(&obj, "resourceVersion").is_some_and(|rv| !rv.is_empty()) {
            // What etcd3 storage answers when a fetched object is re-created as-is.
            return Err(ApiError::new(
                500,
                "InternalError",
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let now = self.now_str();
        let id = Self::next_id(&mut g);
        {
            let m = meta_mut(&mut obj);
            m.insert("name".into(), name.clone().into());
            if ri.namespaced {
                m.insert("namespace".into(), ns.into());
            } else {
                m.remove("namespace");
            }
            m.insert("uid".into(), uid(id).into());
            m.insert("creationTimestamp".into(), now.clone().into());
            m.insert("generation".into(), 1.into());
            for f in [
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "resourceVersion",
                "managedFields",
            ] {
                m.remove(f);
            }
        }
        obj["apiVersion"] = ri.api_version().into();
        obj["kind"] = ri.kind.clone().into();
        prepare_create(ri, &mut obj);
        Self::validate_cr(ri, &name, &mut obj)?;
        let mut managed = Vec::new();
        ssa::track_update(
            None,
            &obj,
            &mut managed,
            manager,
            "",
            &ri.api_version(),
            ri.has_status,
            &now,
            &ri.shape(),
        );
        let out = self.commit(&mut g, key, Some(obj), managed);
        Ok(with_type(ri, &out.unwrap_or_default()))
    }

    /// Inserts an object as-is (status and a given metadata.uid kept; resourceVersion
    /// ignored), for fixtures and `nodegrace-sim`.
    pub fn insert_fixture(&self, mut obj: Value) -> Result<Value, ApiError> {
        let api_version = obj
            .get("apiVersion")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let kind = obj
            .get("kind")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let ri = self.resource_for(&api_version, &kind).ok_or_else(|| {
            ApiError::bad_request(format!("no resource serves {api_version} {kind}"))
        })?;
        let ns = meta(&obj, "namespace").unwrap_or("default").to_string();
        let status = obj.get("status").cloned().filter(|_| ri.has_status);
        let uid = meta(&obj, "uid").map(String::from);
        meta_mut(&mut obj).remove("resourceVersion");
        let created = self.create(&ri, &ns, obj, "fixture")?;
        if status.is_none() && uid.is_none() {
            return Ok(created);
        }
        let name = meta(&created, "name").unwrap_or_default().to_string();
        let store_ns = if ri.namespaced { ns.as_str() } else { "" };
        self.update_in_process(&ri.group, &ri.plural, store_ns, &name, |o| {
            if let Some(st) = status {
                o["status"] = st;
            }
            if let Some(uid) = uid {
                meta_mut(o).insert("uid".into(), uid.into());
            }
        })
        .map(|o| with_type(&ri, &o))
        .ok_or_else(|| ApiError::not_found(&ri, &name))
    }

    /// In-process read-modify-write that bypasses subresource rules (the kubelet's and
    /// controllers' view). Returns None when the object does not exist.
    pub fn update_in_process(
        &self,
        group: &str,
        plural: &str,
        ns: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> Option<Value> {
        let mut g = self.lock();
        let key = ObjKey {
            group: group.into(),
            plural: plural.into(),
            namespace: ns.into(),
            name: name.into(),
        };
        let stored = g.objects.get(&key)?;
        let mut obj = stored.obj.clone();
        let managed = stored.managed.clone();
        f(&mut obj);
        if obj == stored.obj {
            return Some(obj);
        }
        self.commit(&mut g, key, Some(obj), managed)
    }

    /// Removes an object at once (the kubelet's final delete with grace 0), honouring finalizers.
    pub fn finish_deletion(
        &self,
        group: &str,
        plural: &str,
        ns: &str,
        name: &str,
        uid_pre: Option<&str>,
    ) -> bool {
        let mut g = self.lock();
        let key = ObjKey {
            group: group.into(),
            plural: plural.into(),
            namespace: ns.into(),
            name: name.into(),
        };
        let Some(stored) = g.objects.get(&key) else {
            return false;
        };
        if uid_pre.is_some_and(|u| meta(&stored.obj, "uid") != Some(u)) {
            return false;
        }
        if finalizers(&stored.obj).is_empty() {
            self.commit(&mut g, key, None, Vec::new());
        } else {
            let mut obj = stored.obj.clone();
            let managed = stored.managed.clone();
            let now = self.now_str();
            let m = meta_mut(&mut obj);
            m.entry("deletionTimestamp").or_insert(now.into());
            m.insert("deletionGracePeriodSeconds".into(), 0.into());
            if obj != stored.obj {
                self.commit(&mut g, key, Some(obj), managed);
            }
        }
        true
    }

    /// PUT, to the main resource or `status`.
    pub fn replace(
        &self,
        ri: &ResourceInfo,
        ns: &str,
        name: &str,
        sub: &str,
        body: Value,
        manager: &str,
    ) -> Result<Value, ApiError> {
        if meta(&body, "name").is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(
                "the name of the object does not match the name on the URL",
            ));
        }
        let mut g = self.lock();
        let key = Self::key(ri, ns, name);
        let stored = g
            .objects
            .get(&key)
            .ok_or_else(|| ApiError::not_found(ri, name))?;
        let current_rv = meta(&stored.obj, "resourceVersion")
            .unwrap_or_default()
            .to_string();
        match meta(&body, "resourceVersion").filter(|r| !r.is_empty()) {
            Some(rv) if rv != current_rv => return Err(self.stale(ri, name)),
            None if ri.crd.is_some() => return Err(ApiError::invalid(
                ri,
                name,
                &[
                    "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update"
                        .into(),
                ],
            )),
            _ => {}
        }
        let old = stored.obj.clone();
        let managed = stored.managed.clone();
        self.finish_update(&mut g, ri, key, &old, body, sub, managed, Some(manager))
    }

    /// PATCH in all four flavours.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        ri: &ResourceInfo,
        ns: &str,
        name: &str,
        sub: &str,
        kind: PatchKind,
        body: &Value,
        manager: Option<&str>,
    ) -> Result<Value, ApiError> {
        let mut g = self.lock();
        let key = Self::key(ri, ns, name);
        let existing = g
            .objects
            .get(&key)
            .map(|s| (s.obj.clone(), s.managed.clone()));
        if let PatchKind::Apply { force } = kind {
            let Some(manager) = manager.filter(|m| !m.is_empty()) else {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
                ));
            };
            if meta(body, "name").is_some_and(|n| n != name) {
                return Err(ApiError::bad_request(
                    "the name of the object does not match the name on the URL",
                ));
            }
            let (live, mut managed) = match &existing {
                Some((o, m)) => (o.clone(), m.clone()),
                None => {
                    if !sub.is_empty() {
                        return Err(ApiError::not_found(ri, name));
                    }
                    (json!({}), Vec::new())
                }
            };
            let req = ssa::ApplyRequest {
                manager,
                subresource: sub,
                api_version: &ri.api_version(),
                force,
                has_status: ri.has_status,
                now: self.now_str(),
            };
            let merged = ssa::apply(&live, body, &mut managed, &req, &ri.shape())?;
            return match existing {
                None => {
                    drop(g);
                    let mut obj = merged;
                    meta_mut(&mut obj).insert("name".into(), name.into());
                    let created = self.create(ri, ns, obj, manager)?;
                    // Re-own as Apply (create records Update ownership).
                    let mut g = self.lock();
                    let key = Self::key(ri, ns, name);
                    if let Some(s) = g.objects.get_mut(&key) {
                        let mut m = managed;
                        ssa::prune(&mut m, &s.obj);
                        s.managed = m;
                        meta_mut(&mut s.obj)
                            .insert("managedFields".into(), ssa::render(&s.managed));
                        return Ok(with_type(ri, &s.obj));
                    }
                    Ok(created)
                }
                Some((old, _)) => {
                    if let Some(rv) = meta(body, "resourceVersion") {
                        if Some(rv) != meta(&old, "resourceVersion") {
                            return Err(self.stale(ri, name));
                        }
                    }
                    self.finish_update(&mut g, ri, key, &old, merged, sub, managed, None)
                }
            };
        }
        let (old, managed) = existing.ok_or_else(|| ApiError::not_found(ri, name))?;
        let mut patched = old.clone();
        match kind {
            PatchKind::Json => {
                let p: json_patch::Patch = serde_json::from_value(body.clone())
                    .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
                json_patch::patch(&mut patched, &p).map_err(|e| {
                    ApiError::new(
                        422,
                        "Invalid",
                        format!(
                            "the server rejected our request due to an error in our request: {e}"
                        ),
                    )
                })?;
            }
            PatchKind::Merge => json_patch::merge(&mut patched, body),
            PatchKind::Strategic => {
                if ri.crd.is_some() {
                    return Err(ApiError::new(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
                    ));
                }
                schema::strategic_merge(&mut patched, body, &ri.shape(), &mut Vec::new());
            }
            PatchKind::Apply { .. } => unreachable!("handled above"),
        }
        if meta(&patched, "resourceVersion") != meta(&old, "resourceVersion") {
            return Err(self.stale(ri, name));
        }
        self.finish_update(
            &mut g,
            ri,
            key,
            &old,
            patched,
            sub,
            managed,
            manager.or(Some("unknown")),
        )
    }

    /// The shared tail of PUT and PATCH: immutable metadata, subresource rules, finalizer
    /// rules, schema, generation, managed fields, no-op detection, finalizer-driven removal.
    #[allow(clippy::too_many_arguments)]
    fn finish_update(
        &self,
        g: &mut Inner,
        ri: &ResourceInfo,
        key: ObjKey,
        old: &Value,
        mut new: Value,
        sub: &str,
        mut managed: Vec<ManagerEntry>,
        update_manager: Option<&str>,
    ) -> Result<Value, ApiError> {
        let name = key.name.clone();
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be an object",
            ));
        }
        if let Some(uid) = meta(&new, "uid").filter(|u| !u.is_empty()) {
            if meta(old, "uid") != Some(uid) {
                return Err(ApiError::new(
                    422,
                    "Invalid",
                    format!("metadata.uid: Invalid value: \"{uid}\": field is immutable"),
                ));
            }
        }
        if ri.has_status {
            if sub == "status" {
                let mut out = old.clone();
                match new.get("status") {
                    Some(s) => out["status"] = s.clone(),
                    None => {
                        if let Some(o) = out.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
                new = out;
            } else {
                match old.get("status") {
                    Some(s) => new["status"] = s.clone(),
                    None => {
                        if let Some(o) = new.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
        }
        {
            let old_meta = old.get("metadata").cloned().unwrap_or_default();
            let m = meta_mut(&mut new);
            for f in [
                "name",
                "namespace",
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "resourceVersion",
            ] {
                match old_meta.get(f) {
                    Some(v) => m.insert(f.into(), v.clone()),
                    None => m.remove(f),
                };
            }
        }
        new["apiVersion"] = ri.api_version().into();
        new["kind"] = ri.kind.clone().into();
        if old.pointer("/metadata/deletionTimestamp").is_some() {
            let before = finalizers(old);
            if finalizers(&new).iter().any(|f| !before.contains(f)) {
                return Err(ApiError::new(
                    422,
                    "Forbidden",
                    format!("{} \"{name}\" is forbidden: no new finalizers can be added if the object is being deleted", ri.qualified()),
                ));
            }
        }
        Self::validate_cr(ri, &name, &mut new)?;
        if ri.is_pod() && sub.is_empty() && mutable_pod_spec(old) != mutable_pod_spec(&new) {
            return Err(ApiError::invalid(
                ri,
                &name,
                &["spec: Forbidden: pod updates may not change fields other than `spec.containers[*].image`,`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` (only additions to existing tolerations),`spec.terminationGracePeriodSeconds`".into()],
            ));
        }
        if content(&new, !ri.has_status) != content(old, !ri.has_status) {
            let gen = old
                .pointer("/metadata/generation")
                .and_then(Value::as_i64)
                .unwrap_or(1);
            meta_mut(&mut new).insert("generation".into(), (gen + 1).into());
        }
        let now = self.now_str();
        if let Some(m) = update_manager {
            ssa::track_update(
                Some(old),
                &new,
                &mut managed,
                m,
                sub,
                &ri.api_version(),
                ri.has_status,
                &now,
                &ri.shape(),
            );
        } else {
            ssa::prune(&mut managed, &new);
        }
        let strip = |v: &Value| {
            let mut v = v.clone();
            if let Some(m) = v.get_mut("metadata").and_then(Value::as_object_mut) {
                m.remove("managedFields");
                m.remove("resourceVersion");
            }
            v
        };
        let old_managed = g
            .objects
            .get(&key)
            .map(|s| s.managed.clone())
            .unwrap_or_default();
        let unchanged_fields = old_managed
            .iter()
            .map(|e| (&e.manager, e.operation, &e.subresource, &e.fields))
            .eq(managed
                .iter()
                .map(|e| (&e.manager, e.operation, &e.subresource, &e.fields)));
        if strip(&new) == strip(old) && unchanged_fields {
            return Ok(with_type(ri, old));
        }
        let deleting = new.pointer("/metadata/deletionTimestamp").is_some()
            && finalizers(&new).is_empty()
            && new
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
                .unwrap_or(0)
                == 0;
        if deleting {
            let out = self.commit(g, key, None, Vec::new());
            return Ok(with_type(ri, &out.unwrap_or_default()));
        }
        let out = self.commit(g, key, Some(new), managed);
        Ok(with_type(ri, &out.unwrap_or_default()))
    }

    /// DELETE. Returns the object (still present while graceful/finalizers) and whether it is gone.
    pub fn delete(
        &self,
        ri: &ResourceInfo,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<(Value, bool), ApiError> {
        let mut g = self.lock();
        self.delete_locked(&mut g, ri, ns, name, opts)
    }

    fn delete_locked(
        &self,
        g: &mut Inner,
        ri: &ResourceInfo,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<(Value, bool), ApiError> {
        let key = Self::key(ri, ns, name);
        let stored = g
            .objects
            .get(&key)
            .ok_or_else(|| ApiError::not_found(ri, name))?;
        let obj = stored.obj.clone();
        let managed = stored.managed.clone();
        for (wanted, label, field) in [
            (&opts.uid, "UID", "uid"),
            (&opts.resource_version, "ResourceVersion", "resourceVersion"),
        ] {
            let Some(wanted) = wanted else { continue };
            let actual = meta(&obj, field).unwrap_or_default();
            if wanted != actual {
                return Err(ApiError::conflict(
                    ri,
                    name,
                    &format!("Precondition failed: {label} in precondition: {wanted}, {label} in object meta: {actual}"),
                ));
            }
        }
        let mut grace = 0;
        if ri.is_pod() {
            grace = opts
                .grace_period_seconds
                .or_else(|| {
                    obj.pointer("/spec/terminationGracePeriodSeconds")
                        .and_then(Value::as_i64)
                })
                .unwrap_or(30)
                .max(0);
            let unscheduled = obj
                .pointer("/spec/nodeName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .is_empty();
            if unscheduled || is_terminal(&obj) {
                grace = 0;
            }
            if let Some(existing) = obj
                .pointer("/metadata/deletionGracePeriodSeconds")
                .and_then(Value::as_i64)
            {
                if grace >= existing && existing > 0 {
                    // A repeated delete may only shorten the grace period.
                    return Ok((with_type(ri, &obj), false));
                }
            }
        }
        let fins = finalizers(&obj);
        if grace == 0 && fins.is_empty() {
            self.commit(g, key, None, Vec::new());
            return Ok((with_type(ri, &obj), true));
        }
        let mut new = obj.clone();
        let now = self.now();
        {
            let m = meta_mut(&mut new);
            if grace > 0 {
                m.insert(
                    "deletionTimestamp".into(),
                    fmt_time(after_seconds(now, grace)).into(),
                );
            } else {
                m.entry("deletionTimestamp").or_insert(fmt_time(now).into());
            }
            m.insert("deletionGracePeriodSeconds".into(), grace.into());
        }
        if new == obj {
            return Ok((with_type(ri, &obj), false));
        }
        let out = self.commit(g, key, Some(new), managed);
        Ok((with_type(ri, &out.unwrap_or_default()), false))
    }

    /// DELETE on a collection.
    pub fn delete_collection(
        &self,
        ri: &ResourceInfo,
        filter: &Filter,
        opts: &DeleteOpts,
    ) -> Result<Vec<Value>, ApiError> {
        let (items, _) = self.list(filter);
        let mut g = self.lock();
        let mut out = Vec::new();
        for i in items {
            let ns = meta(&i, "namespace").unwrap_or_default().to_string();
            let name = meta(&i, "name").unwrap_or_default().to_string();
            match self.delete_locked(&mut g, ri, &ns, &name, opts) {
                Ok((o, _)) => out.push(o),
                Err(e) if e.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    /// `POST pods/NAME/eviction`: the eviction REST handler's PDB checks, then a graceful delete.
    pub fn evict(&self, ns: &str, name: &str, eviction: &Value) -> Result<(), ApiError> {
        let pods = self
            .find_resource("", "v1", "pods")
            .ok_or_else(|| ApiError::new(500, "InternalError", "pods not served"))?;
        if meta(eviction, "name").is_some_and(|n| n != name) {
            return Err(ApiError::bad_request(
                "name in URL does not match name in Eviction object",
            ));
        }
        let opts = eviction
            .get("deleteOptions")
            .map(DeleteOpts::from_body)
            .unwrap_or_default();
        let mut g = self.lock();
        let key = Self::key(&pods, ns, name);
        let pod = g
            .objects
            .get(&key)
            .map(|s| s.obj.clone())
            .ok_or_else(|| ApiError::not_found(&pods, name))?;
        if let Some(u) = &opts.uid {
            let actual = meta(&pod, "uid").unwrap_or_default();
            if u != actual {
                return Err(ApiError::conflict(
                    &pods,
                    name,
                    &format!("Precondition failed: UID in precondition: {u}, UID in object meta: {actual}"),
                ));
            }
        }
        let can_ignore_pdb = is_terminal(&pod)
            || pod_phase(&pod) == "Pending"
            || pod.pointer("/metadata/deletionTimestamp").is_some();
        if !can_ignore_pdb {
            let pdbs: Vec<(ObjKey, Value)> = g
                .scan("policy", "poddisruptionbudgets", Some(ns))
                .filter(|(_, s)| {
                    label_selector_object_matches(s.obj.pointer("/spec/selector"), &pod)
                })
                .map(|(k, s)| (k.clone(), s.obj.clone()))
                .collect();
            if pdbs.len() > 1 {
                return Err(ApiError::new(
                    500,
                    "InternalError",
                    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.",
                ));
            }
            if let Some((pdb_key, pdb)) = pdbs.into_iter().next() {
                let st = |f: &str| {
                    pdb.pointer(&format!("/status/{f}"))
                        .and_then(Value::as_i64)
                        .unwrap_or(0)
                };
                let pdb_name = meta(&pdb, "name").unwrap_or_default().to_string();
                let unhealthy_ok = !pod_is_healthy(&pod)
                    && (pdb
                        .pointer("/spec/unhealthyPodEvictionPolicy")
                        .and_then(Value::as_str)
                        == Some("AlwaysAllow")
                        || (st("currentHealthy") >= st("desiredHealthy")
                            && st("desiredHealthy") > 0));
                if !unhealthy_ok {
                    let allowed = st("disruptionsAllowed");
                    if allowed < 0 {
                        return Err(ApiError::new(
                            403,
                            "Forbidden",
                            "pdb disruptions allowed is negative",
                        ));
                    }
                    if allowed == 0 {
                        let mut e = ApiError::new(
                            429,
                            "TooManyRequests",
                            "Cannot evict pod as it would violate the pod's disruption budget.",
                        );
                        e.details = Some(json!({"causes": [{
                            "reason": "DisruptionBudget",
                            "message": format!("The disruption budget {pdb_name} needs {} healthy pods and has {} currently",
                                st("desiredHealthy"), st("currentHealthy")),
                        }]}));
                        return Err(e);
                    }
                    let mut new_pdb = pdb.clone();
                    new_pdb["status"]["disruptionsAllowed"] = (allowed - 1).into();
                    if !new_pdb["status"]["disruptedPods"].is_object() {
                        new_pdb["status"]["disruptedPods"] = json!({});
                    }
                    new_pdb["status"]["disruptedPods"][name] = fmt_time(self.now()).into();
                    let managed = g
                        .objects
                        .get(&pdb_key)
                        .map(|s| s.managed.clone())
                        .unwrap_or_default();
                    self.commit_raw(&mut g, pdb_key, new_pdb, managed);
                }
            }
        }
        let del = DeleteOpts { uid: None, ..opts };
        self.delete_locked(&mut g, &pods, ns, name, &del)
            .map(|_| ())
    }
}

/// A pod spec without the fields an update may change, for the immutability check.
fn mutable_pod_spec(pod: &Value) -> Value {
    let mut spec = pod.get("spec").cloned().unwrap_or_else(|| json!({}));
    if let Some(o) = spec.as_object_mut() {
        for f in [
            "activeDeadlineSeconds",
            "tolerations",
            "terminationGracePeriodSeconds",
        ] {
            o.remove(f);
        }
        for list in ["containers", "initContainers"] {
            if let Some(cs) = o.get_mut(list).and_then(Value::as_array_mut) {
                for c in cs.iter_mut().filter_map(Value::as_object_mut) {
                    c.remove("image");
                }
            }
        }
    }
    spec
}

/// Type metadata on every object the server returns (the store keeps it too).
fn with_type(ri: &ResourceInfo, obj: &Value) -> Value {
    let mut o = obj.clone();
    if o.is_object() {
        o["apiVersion"] = ri.api_version().into();
        o["kind"] = ri.kind.clone().into();
    }
    o
}

/// Create-time defaults and status resets, per the real registries' PrepareForCreate.
fn prepare_create(ri: &ResourceInfo, obj: &mut Value) {
    let o = match obj.as_object_mut() {
        Some(o) => o,
        None => return,
    };
    match (ri.group.as_str(), ri.plural.as_str()) {
        ("", "pods") => {
            o.insert("status".into(), json!({"phase": "Pending"}));
            let spec = o.entry("spec").or_insert(json!({}));
            if spec.get("terminationGracePeriodSeconds").is_none() {
                spec["terminationGracePeriodSeconds"] = 30.into();
            }
            if spec.get("restartPolicy").is_none() {
                spec["restartPolicy"] = "Always".into();
            }
            if spec.get("priority").is_none() {
                spec["priority"] = 0.into();
            }
        }
        ("", "namespaces") => {
            o.insert("status".into(), json!({"phase": "Active"}));
        }
        ("policy", "poddisruptionbudgets") => {
            o.insert("status".into(), json!({"disruptionsAllowed": 0, "currentHealthy": 0, "desiredHealthy": 0, "expectedPods": 0}));
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            let names = o
                .get("spec")
                .and_then(|s| s.get("names"))
                .cloned()
                .unwrap_or(json!({}));
            o.insert(
                "status".into(),
                json!({"acceptedNames": names, "storedVersions": [], "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found"},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted"}]}),
            );
        }
        _ if ri.crd.is_some() && ri.has_status => {
            o.remove("status");
        }
        _ => {}
    }
}

fn uid(id: u64) -> String {
    format!("5e1f0000-0000-4000-8000-{id:012x}")
}

fn suffix(id: u64) -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut n = id.wrapping_mul(2_654_435_761) % 14_348_907;
    let mut s = String::new();
    for _ in 0..5 {
        s.push(ALPHABET[(n % 27) as usize] as char);
        n /= 27;
    }
    s
}
