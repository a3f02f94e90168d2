//! Shape knowledge: which lists are atomic, sets or maps (for strategic merge patch and
//! server-side apply), and CRD structural-schema defaulting, pruning and basic validation.

use super::str_list;
use serde_json::{Map, Value};

/// How a list merges, as `x-kubernetes-list-type` / `patchStrategy` describe it.
#[derive(Debug, Clone, PartialEq)]
pub enum ListKind {
    Atomic,
    Set,
    /// Keys for server-side apply, plus the strategic-merge-patch merge key.
    Map(Vec<String>, String),
}

/// The type a stored object follows: a built-in (hard-coded table) or a CRD schema.
#[derive(Debug, Clone)]
pub enum Shape {
    Builtin { group: String, plural: String },
    Schema(Value),
}

fn map(keys: &[&str], smp: &str) -> ListKind {
    ListKind::Map(
        keys.iter().map(|k| k.to_string()).collect(),
        smp.to_string(),
    )
}

fn builtin_list(group: &str, plural: &str, path: &str) -> ListKind {
    match (group, plural, path) {
        (_, _, "metadata.finalizers") => ListKind::Set,
        (_, _, "metadata.ownerReferences") => map(&["uid"], "uid"),
        ("", "pods", "spec.containers" | "spec.initContainers" | "spec.ephemeralContainers") => {
            map(&["name"], "name")
        }
        ("", "pods", p) if p.ends_with("Containers.env") || p == "spec.containers.env" => {
            map(&["name"], "name")
        }
        ("", "pods", "spec.containers.ports") => {
            map(&["containerPort", "protocol"], "containerPort")
        }
        ("", "pods", "spec.containers.volumeMounts") => map(&["mountPath"], "mountPath"),
        ("", "pods", "spec.volumes") => map(&["name"], "name"),
        ("", "pods" | "nodes", "status.conditions") => map(&["type"], "type"),
        ("", "nodes", "spec.taints") => map(&["key", "effect"], "key"),
        ("", "nodes", "status.addresses") => map(&["type"], "type"),
        ("", "nodes", "spec.podCIDRs") => ListKind::Set,
        ("policy", "poddisruptionbudgets", "status.conditions") => map(&["type"], "type"),
        ("lifecycle.k8s.io", _, "status.conditions") => map(&["type"], "type"),
        (
            "lifecycle.k8s.io",
            "evictions",
            "status.requesters" | "status.targetResponders" | "status.responders",
        ) => map(&["name"], "name"),
        _ => ListKind::Atomic,
    }
}

/// Follows property names through a structural schema, stepping into array items.
fn schema_at<'a>(schema: &'a Value, path: &[String]) -> Option<&'a Value> {
    let mut cur = schema;
    for seg in path {
        while cur.get("type").and_then(Value::as_str) == Some("array") {
            cur = cur.get("items")?;
        }
        cur = match cur.get("properties").and_then(|p| p.get(seg)) {
            Some(s) => s,
            None => cur.get("additionalProperties").filter(|a| a.is_object())?,
        };
    }
    Some(cur)
}

impl Shape {
    /// `path` is the chain of field names from the object root (list items are transparent).
    pub fn list_kind(&self, path: &[String]) -> ListKind {
        let joined = path.join(".");
        match self {
            Shape::Builtin { group, plural } => builtin_list(group, plural, &joined),
            Shape::Schema(schema) => {
                if path.first().map(String::as_str) == Some("metadata") {
                    return builtin_list("", "", &joined);
                }
                let Some(s) = schema_at(schema, path) else {
                    return ListKind::Atomic;
                };
                match s.get("x-kubernetes-list-type").and_then(Value::as_str) {
                    Some("set") => ListKind::Set,
                    Some("map") => {
                        let keys: Vec<String> = str_list(s.get("x-kubernetes-list-map-keys"))
                            .into_iter()
                            .map(String::from)
                            .collect();
                        let first = keys.first().cloned().unwrap_or_default();
                        ListKind::Map(keys, first)
                    }
                    _ => ListKind::Atomic,
                }
            }
        }
    }
}

/// Applies CRD schema defaults and prunes unknown fields in place, like the real apiserver
/// does for structural schemas. Top-level apiVersion/kind/metadata are left alone.
pub fn default_and_prune(obj: &mut Value, schema: &Value) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let Some(o) = obj.as_object_mut() else { return };
    for (k, s) in props {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        drop_null_unless_nullable(o, k, s);
        if !o.contains_key(k) {
            if let Some(d) = s.get("default") {
                o.insert(k.clone(), d.clone());
            }
        }
        if let Some(child) = o.get_mut(k) {
            walk(child, s);
        }
    }
    let preserve = schema
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true);
    if !preserve {
        o.retain(|k, _| {
            matches!(k.as_str(), "apiVersion" | "kind" | "metadata") || props.contains_key(k)
        });
    }
}

/// The real apiserver prunes `null` for fields not marked `nullable`, before defaulting.
fn drop_null_unless_nullable(o: &mut Map<String, Value>, k: &str, s: &Value) {
    if o.get(k).is_some_and(Value::is_null)
        && s.get("nullable").and_then(Value::as_bool) != Some(true)
    {
        o.remove(k);
    }
}

fn walk(v: &mut Value, s: &Value) {
    let preserve = s
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        == Some(true);
    match v {
        Value::Object(o) => {
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                for (k, ps) in props {
                    drop_null_unless_nullable(o, k, ps);
                    if !o.contains_key(k) {
                        if let Some(d) = ps.get("default") {
                            o.insert(k.clone(), d.clone());
                        }
                    }
                    if let Some(child) = o.get_mut(k) {
                        walk(child, ps);
                    }
                }
                if !preserve && s.get("additionalProperties").is_none() {
                    o.retain(|k, _| props.contains_key(k));
                }
            } else if let Some(ap) = s.get("additionalProperties").filter(|a| a.is_object()) {
                for child in o.values_mut() {
                    walk(child, ap);
                }
            } else if !preserve && s.get("type").and_then(Value::as_str) == Some("object") {
                o.clear();
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for i in items {
                    walk(i, is);
                }
            }
        }
        _ => {}
    }
}

/// Basic OpenAPI validation (type, required, enum, minimum/maximum, map-list key uniqueness).
/// CEL rules (`x-kubernetes-validations`) are NOT evaluated by the fake.
pub fn validate(obj: &Value, schema: &Value) -> Vec<String> {
    let mut errs = Vec::new();
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return errs;
    };
    for (k, s) in props {
        if matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
            continue;
        }
        if let Some(v) = obj.get(k) {
            check(v, s, k, &mut errs);
        }
    }
    if let Some(req) = schema.get("required").and_then(Value::as_array) {
        for r in req.iter().filter_map(Value::as_str) {
            if obj.get(r).is_none() {
                errs.push(format!("{r}: Required value"));
            }
        }
    }
    errs
}

fn check(v: &Value, s: &Value, path: &str, errs: &mut Vec<String>) {
    if v.is_null() && s.get("nullable").and_then(Value::as_bool) == Some(true) {
        return;
    }
    let ty = s.get("type").and_then(Value::as_str);
    let ok = match ty {
        Some("object") => v.is_object(),
        Some("array") => v.is_array(),
        Some("string") => v.is_string(),
        Some("integer") => v.is_i64() || v.is_u64(),
        Some("number") => v.is_number(),
        Some("boolean") => v.is_boolean(),
        _ => true,
    };
    let int_or_string = s.get("x-kubernetes-int-or-string").and_then(Value::as_bool) == Some(true);
    if !ok && !(int_or_string && (v.is_string() || v.is_i64())) {
        errs.push(format!(
            "{path}: Invalid value: must be of type {}",
            ty.unwrap_or("?")
        ));
        return;
    }
    if let Some(en) = s.get("enum").and_then(Value::as_array) {
        if !en.contains(v) {
            errs.push(format!("{path}: Unsupported value: {v}"));
        }
    }
    if let (Some(min), Some(n)) = (s.get("minimum").and_then(Value::as_f64), v.as_f64()) {
        if n < min {
            errs.push(format!(
                "{path}: Invalid value: {v}: should be greater than or equal to {min}"
            ));
        }
    }
    if let (Some(max), Some(n)) = (s.get("maximum").and_then(Value::as_f64), v.as_f64()) {
        if n > max {
            errs.push(format!(
                "{path}: Invalid value: {v}: should be less than or equal to {max}"
            ));
        }
    }
    match v {
        Value::Object(o) => {
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                for (k, ps) in props {
                    if let Some(child) = o.get(k) {
                        check(child, ps, &format!("{path}.{k}"), errs);
                    }
                }
            }
            if let Some(req) = s.get("required").and_then(Value::as_array) {
                for r in req.iter().filter_map(Value::as_str) {
                    if !o.contains_key(r) {
                        errs.push(format!("{path}.{r}: Required value"));
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                for (i, item) in items.iter().enumerate() {
                    check(item, is, &format!("{path}[{i}]"), errs);
                }
            }
            if s.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("map") {
                let keys = str_list(s.get("x-kubernetes-list-map-keys"));
                let mut seen = Vec::new();
                for item in items {
                    let k: Vec<Option<&Value>> = keys.iter().map(|k| item.get(*k)).collect();
                    if seen.contains(&k) {
                        errs.push(format!("{path}: Duplicate value: {item}"));
                    }
                    seen.push(k);
                }
            }
        }
        _ => {}
    }
}

/// Strategic merge patch for built-in kinds: maps merge, keyed lists merge by their merge key,
/// `$patch: delete|replace`, `$deleteFromPrimitiveList/<field>` and `$retainKeys` are honoured,
/// `$setElementOrder` is accepted and ignored.
pub fn strategic_merge(target: &mut Value, patch: &Value, shape: &Shape, path: &mut Vec<String>) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if p.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut clean = p.clone();
        clean.remove("$patch");
        *target = Value::Object(clean);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    for (k, v) in p {
        if k.starts_with("$setElementOrder/") || k == "$patch" || k == "$retainKeys" {
            continue;
        }
        if let Some(field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(arr), Some(del)) = (
                target.get_mut(field).and_then(Value::as_array_mut),
                v.as_array(),
            ) {
                arr.retain(|x| !del.contains(x));
            }
            continue;
        }
        let Some(t) = target.as_object_mut() else {
            return;
        };
        if v.is_null() {
            t.remove(k);
            continue;
        }
        path.push(k.clone());
        match v {
            Value::Object(_) => {
                let child = t.entry(k.clone()).or_insert(Value::Object(Map::new()));
                strategic_merge(child, v, shape, path);
            }
            Value::Array(items) => match shape.list_kind(path) {
                ListKind::Atomic => {
                    t.insert(k.clone(), v.clone());
                }
                ListKind::Set => {
                    let entry = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                    if let Some(arr) = entry.as_array_mut() {
                        for i in items {
                            if !arr.contains(i) {
                                arr.push(i.clone());
                            }
                        }
                    }
                }
                ListKind::Map(_, key) => {
                    let entry = t.entry(k.clone()).or_insert(Value::Array(Vec::new()));
                    if !entry.is_array() {
                        *entry = Value::Array(Vec::new());
                    }
                    if let Some(arr) = entry.as_array_mut() {
                        for item in items {
                            let kv = item.get(&key).cloned();
                            let pos = arr.iter().position(|x| x.get(&key).cloned() == kv);
                            if item.get("$patch").and_then(Value::as_str) == Some("delete") {
                                if let Some(pos) = pos {
                                    arr.remove(pos);
                                }
                                continue;
                            }
                            match pos {
                                Some(pos) => strategic_merge(&mut arr[pos], item, shape, path),
                                None => {
                                    let mut fresh = Value::Object(Map::new());
                                    strategic_merge(&mut fresh, item, shape, path);
                                    arr.push(fresh);
                                }
                            }
                        }
                    }
                }
            },
            _ => {
                t.insert(k.clone(), v.clone());
            }
        }
        path.pop();
    }
    if let Some(retain) = p.get("$retainKeys").and_then(Value::as_array) {
        if let Some(t) = target.as_object_mut() {
            t.retain(|k, _| retain.iter().any(|r| r.as_str() == Some(k)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn smp_merges_taints_by_key_and_conditions_by_type() {
        let shape = Shape::Builtin {
            group: String::new(),
            plural: "nodes".into(),
        };
        let mut node = json!({"spec": {"taints": [{"key": "a", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]}});
        let patch = json!({"spec": {"unschedulable": true, "taints": [{"key": "b", "effect": "NoSchedule"}]},
            "status": {"conditions": [{"type": "Ready", "status": "False"}, {"type": "X", "status": "True"}]}});
        strategic_merge(&mut node, &patch, &shape, &mut Vec::new());
        assert_eq!(node["spec"]["taints"].as_array().unwrap().len(), 2);
        assert_eq!(node["spec"]["unschedulable"], json!(true));
        assert_eq!(node["status"]["conditions"][0]["status"], json!("False"));
        assert_eq!(node["status"]["conditions"].as_array().unwrap().len(), 2);
        let del = json!({"spec": {"taints": [{"key": "a", "$patch": "delete"}]}});
        strategic_merge(&mut node, &del, &shape, &mut Vec::new());
        assert_eq!(
            node["spec"]["taints"],
            json!([{"key": "b", "effect": "NoSchedule"}])
        );
    }

    #[test]
    fn prune_and_default_follow_schema() {
        let schema = json!({"type": "object", "properties": {"spec": {"type": "object", "properties": {
            "stage": {"type": "string", "default": "Idle"}}}}});
        let mut obj = json!({"apiVersion": "x/v1", "kind": "K", "metadata": {}, "spec": {"typo": 1, "stage": null}, "junk": 2});
        default_and_prune(&mut obj, &schema);
        assert_eq!(obj["spec"], json!({"stage": "Idle"}));
        assert!(obj.get("junk").is_none());
    }
}
