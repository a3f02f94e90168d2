//! Managed fields and server-side apply, at the granularity of leaf fields, map-list entries
//! (`k:{...}`) and set members (`v:...`), rendered in the real `FieldsV1` format.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use super::schema::{ListKind, Shape};
use super::store::ApiError;

/// A path of FieldsV1 segments: `f:name`, `k:{"key":"v"}`, `v:value`, and `.` for "the entry itself".
pub type FieldPath = Vec<String>;
pub type FieldSet = BTreeSet<FieldPath>;

#[derive(Debug, Clone, PartialEq)]
pub struct ManagerEntry {
    pub manager: String,
    pub operation: &'static str,
    pub subresource: String,
    pub api_version: String,
    pub time: String,
    pub fields: FieldSet,
}

const IGNORED_METADATA: &[&str] = &[
    "name",
    "namespace",
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
    "generateName",
];

/// The part of an object a write through `subresource` may own.
pub fn strip_for(obj: &Value, subresource: &str, has_status: bool) -> Value {
    let mut out = Map::new();
    let Some(o) = obj.as_object() else {
        return Value::Object(out);
    };
    for (k, v) in o {
        match k.as_str() {
            "apiVersion" | "kind" => {}
            "metadata" if subresource.is_empty() => {
                if let Some(m) = v.as_object() {
                    let kept: Map<String, Value> = m
                        .iter()
                        .filter(|(k, _)| !IGNORED_METADATA.contains(&k.as_str()))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect();
                    if !kept.is_empty() {
                        out.insert(k.clone(), Value::Object(kept));
                    }
                }
            }
            "metadata" => {}
            "status" if has_status && subresource.is_empty() => {}
            "status" => {
                out.insert(k.clone(), v.clone());
            }
            _ if subresource == "status" => {}
            _ => {
                out.insert(k.clone(), v.clone());
            }
        }
    }
    Value::Object(out)
}

fn item_key(item: &Value, keys: &[String]) -> String {
    let mut m = Map::new();
    for k in keys {
        if let Some(v) = item.get(k) {
            m.insert(k.clone(), v.clone());
        }
    }
    format!("k:{}", Value::Object(m))
}

/// Every field path a (stripped) object sets.
pub fn field_set(obj: &Value, shape: &Shape) -> FieldSet {
    let mut out = FieldSet::new();
    if let Some(o) = obj.as_object() {
        walk_map(o, shape, &mut Vec::new(), &mut Vec::new(), &mut out);
    }
    out
}

fn walk_map(
    o: &Map<String, Value>,
    shape: &Shape,
    names: &mut Vec<String>,
    path: &mut FieldPath,
    out: &mut FieldSet,
) {
    for (k, child) in o {
        names.push(k.clone());
        path.push(format!("f:{k}"));
        match child {
            Value::Object(m) if !m.is_empty() => walk_map(m, shape, names, path, out),
            Value::Array(items) => match shape.list_kind(names) {
                ListKind::Atomic => {
                    out.insert(path.clone());
                }
                ListKind::Set => {
                    for i in items {
                        let mut p = path.clone();
                        p.push(format!("v:{i}"));
                        out.insert(p);
                    }
                }
                ListKind::Map(keys, _) => {
                    for item in items {
                        path.push(item_key(item, &keys));
                        let mut dot = path.clone();
                        dot.push(".".into());
                        out.insert(dot);
                        if let Some(m) = item.as_object() {
                            walk_map(m, shape, names, path, out);
                        }
                        path.pop();
                    }
                }
            },
            _ => {
                out.insert(path.clone());
            }
        }
        path.pop();
        names.pop();
    }
}

fn item_matches(item: &Value, key_json: &str) -> bool {
    let Ok(Value::Object(keys)) = serde_json::from_str::<Value>(key_json) else {
        return false;
    };
    keys.iter().all(|(k, v)| item.get(k) == Some(v))
}

pub fn value_at<'a>(v: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = v;
    for seg in path {
        cur = if let Some(f) = seg.strip_prefix("f:") {
            cur.get(f)?
        } else if let Some(k) = seg.strip_prefix("k:") {
            cur.as_array()?.iter().find(|i| item_matches(i, k))?
        } else if let Some(val) = seg.strip_prefix("v:") {
            let want: Value = serde_json::from_str(val).ok()?;
            cur.as_array()?.iter().find(|i| **i == want)?
        } else {
            cur
        };
    }
    Some(cur)
}

fn value_at_mut<'a>(v: &'a mut Value, path: &[String]) -> Option<&'a mut Value> {
    let mut cur = v;
    for seg in path {
        cur = if let Some(f) = seg.strip_prefix("f:") {
            cur.get_mut(f)?
        } else if let Some(k) = seg.strip_prefix("k:") {
            cur.as_array_mut()?
                .iter_mut()
                .find(|i| item_matches(i, k))?
        } else {
            cur
        };
    }
    Some(cur)
}

/// Removes what `path` names; a `.` path removes the whole list entry.
fn remove_at(v: &mut Value, path: &[String]) {
    let path = if path.last().map(String::as_str) == Some(".") {
        &path[..path.len() - 1]
    } else {
        path
    };
    let Some((last, parent_path)) = path.split_last() else {
        return;
    };
    let Some(parent) = value_at_mut(v, parent_path) else {
        return;
    };
    if let Some(f) = last.strip_prefix("f:") {
        if let Some(o) = parent.as_object_mut() {
            o.remove(f);
        }
    } else if let Some(k) = last.strip_prefix("k:") {
        if let Some(a) = parent.as_array_mut() {
            a.retain(|i| !item_matches(i, k));
        }
    } else if let Some(val) = last.strip_prefix("v:") {
        if let (Some(a), Ok(want)) = (parent.as_array_mut(), serde_json::from_str::<Value>(val)) {
            a.retain(|i| *i != want);
        }
    }
}

/// Merges an applied configuration into the live object, list kinds taken from the shape.
fn merge(live: &mut Value, applied: &Value, shape: &Shape, names: &mut Vec<String>) {
    let (Some(l), Some(a)) = (live.as_object_mut(), applied.as_object()) else {
        *live = applied.clone();
        return;
    };
    for (k, av) in a {
        names.push(k.clone());
        match (l.get_mut(k), av) {
            (Some(lv @ Value::Object(_)), Value::Object(_)) => merge(lv, av, shape, names),
            (Some(Value::Array(larr)), Value::Array(aarr)) => match shape.list_kind(names) {
                ListKind::Atomic => *larr = aarr.clone(),
                ListKind::Set => {
                    for i in aarr {
                        if !larr.contains(i) {
                            larr.push(i.clone());
                        }
                    }
                }
                ListKind::Map(keys, _) => {
                    for item in aarr {
                        let key = item_key(item, &keys);
                        let key_json = &key[2..];
                        match larr.iter_mut().find(|i| item_matches(i, key_json)) {
                            Some(existing) => merge(existing, item, shape, names),
                            None => larr.push(item.clone()),
                        }
                    }
                }
            },
            _ => {
                l.insert(k.clone(), av.clone());
            }
        }
        names.pop();
    }
}

/// Renders a path the way the real conflict messages do: `.status.list[name="a"].field`.
pub fn render_path(path: &[String]) -> String {
    let mut s = String::new();
    for seg in path {
        if let Some(f) = seg.strip_prefix("f:") {
            s.push('.');
            s.push_str(f);
        } else if let Some(k) = seg.strip_prefix("k:") {
            if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(k) {
                let parts: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
                s.push_str(&format!("[{}]", parts.join(",")));
            }
        } else if let Some(v) = seg.strip_prefix("v:") {
            s.push_str(&format!("[={v}]"));
        }
    }
    s
}

pub struct ApplyRequest<'a> {
    pub manager: &'a str,
    pub subresource: &'a str,
    pub api_version: &'a str,
    pub force: bool,
    pub has_status: bool,
    pub now: String,
}

/// Server-side apply of `applied` onto `live` (an empty object when creating).
pub fn apply(
    live: &Value,
    applied: &Value,
    managers: &mut Vec<ManagerEntry>,
    req: &ApplyRequest<'_>,
    shape: &Shape,
) -> Result<Value, ApiError> {
    let config = strip_for(applied, req.subresource, req.has_status);
    let new_set = field_set(&config, shape);
    let is_me = |e: &ManagerEntry| {
        e.manager == req.manager && e.operation == "Apply" && e.subresource == req.subresource
    };

    let mut conflicts: Vec<(String, FieldPath)> = Vec::new();
    for e in managers.iter().filter(|e| !is_me(e)) {
        for p in e.fields.intersection(&new_set) {
            if p.last().map(String::as_str) == Some(".") {
                continue;
            }
            if value_at(&config, p) != value_at(live, p) {
                conflicts.push((e.manager.clone(), p.clone()));
            }
        }
    }
    if !conflicts.is_empty() && !req.force {
        return Err(ApiError::apply_conflict(&conflicts, req.api_version));
    }
    for (mgr, p) in &conflicts {
        for e in managers
            .iter_mut()
            .filter(|e| &e.manager == mgr && !is_me(e))
        {
            e.fields.remove(p);
        }
    }

    let mut out = live.clone();
    let old_set = managers
        .iter()
        .find(|e| is_me(e))
        .map(|e| e.fields.clone())
        .unwrap_or_default();
    let mut removed: Vec<&FieldPath> = old_set.difference(&new_set).collect();
    removed.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in removed {
        let others_own = managers.iter().filter(|e| !is_me(e)).any(|e| {
            if p.last().map(String::as_str) == Some(".") {
                let prefix = &p[..p.len() - 1];
                e.fields.iter().any(|q| q.starts_with(prefix))
            } else {
                e.fields.contains(p)
            }
        });
        let still_applied = p.last().map(String::as_str) == Some(".")
            && new_set.iter().any(|q| q.starts_with(&p[..p.len() - 1]));
        if !others_own && !still_applied {
            remove_at(&mut out, p);
        }
    }
    merge(&mut out, &config, shape, &mut Vec::new());

    managers.retain(|e| !is_me(e));
    managers.push(ManagerEntry {
        manager: req.manager.to_string(),
        operation: "Apply",
        subresource: req.subresource.to_string(),
        api_version: req.api_version.to_string(),
        time: req.now.clone(),
        fields: new_set,
    });
    Ok(out)
}

/// Ownership after a non-apply write: the writer takes every field it changed.
#[allow(clippy::too_many_arguments)]
pub fn track_update(
    old: Option<&Value>,
    new: &Value,
    managers: &mut Vec<ManagerEntry>,
    manager: &str,
    subresource: &str,
    api_version: &str,
    has_status: bool,
    now: &str,
    shape: &Shape,
) {
    let stripped_new = strip_for(new, subresource, has_status);
    let stripped_old = old.map(|o| strip_for(o, subresource, has_status));
    let changed: FieldSet = field_set(&stripped_new, shape)
        .into_iter()
        .filter(|p| {
            stripped_old.as_ref().and_then(|o| value_at(o, p)) != value_at(&stripped_new, p)
        })
        .collect();
    if !changed.is_empty() {
        for e in managers.iter_mut() {
            e.fields.retain(|p| !changed.contains(p));
        }
        match managers.iter_mut().find(|e| {
            e.manager == manager && e.operation == "Update" && e.subresource == subresource
        }) {
            Some(e) => {
                e.fields.extend(changed);
                e.time = now.to_string();
            }
            None => managers.push(ManagerEntry {
                manager: manager.to_string(),
                operation: "Update",
                subresource: subresource.to_string(),
                api_version: api_version.to_string(),
                time: now.to_string(),
                fields: changed,
            }),
        }
    }
    prune(managers, new);
}

/// Drops ownership of fields that no longer exist, and managers left owning nothing.
pub fn prune(managers: &mut Vec<ManagerEntry>, obj: &Value) {
    for e in managers.iter_mut() {
        e.fields.retain(|p| {
            let p = if p.last().map(String::as_str) == Some(".") {
                &p[..p.len() - 1]
            } else {
                &p[..]
            };
            value_at(obj, p).is_some()
        });
    }
    managers.retain(|e| !e.fields.is_empty() || e.operation == "Apply");
}

fn fields_v1(set: &FieldSet) -> Value {
    let mut root = Map::new();
    for path in set {
        let mut cur = &mut root;
        for seg in path {
            let next = cur
                .entry(seg.clone())
                .or_insert_with(|| Value::Object(Map::new()));
            let Value::Object(m) = next else { break };
            cur = m;
        }
    }
    Value::Object(root)
}

/// `metadata.managedFields` as the real apiserver shows it.
pub fn render(managers: &[ManagerEntry]) -> Value {
    Value::Array(
        managers
            .iter()
            .map(|e| {
                let mut m = Map::new();
                m.insert("manager".into(), e.manager.clone().into());
                m.insert("operation".into(), e.operation.into());
                m.insert("apiVersion".into(), e.api_version.clone().into());
                m.insert("time".into(), e.time.clone().into());
                m.insert("fieldsType".into(), "FieldsV1".into());
                m.insert("fieldsV1".into(), fields_v1(&e.fields));
                if !e.subresource.is_empty() {
                    m.insert("subresource".into(), e.subresource.clone().into());
                }
                Value::Object(m)
            })
            .collect(),
    )
}
