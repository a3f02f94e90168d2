//! Label and field selectors with the real apiserver's syntax and its list of supported fields.

use serde_json::Value;

use super::store::ApiError;
use super::str_list;

#[derive(Debug, Clone, PartialEq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector` query parameter.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(Vec<LabelReq>);

/// Splits on commas that are not inside parentheses.
fn split_top_level(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => {
                depth += 1;
                cur.push(c)
            }
            ')' => {
                depth -= 1;
                cur.push(c)
            }
            ',' if depth == 0 => parts.push(std::mem::take(&mut cur)),
            _ => cur.push(c),
        }
    }
    parts.push(cur);
    parts
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect()
}

fn parse_set(s: &str) -> Option<Vec<String>> {
    let s = s.trim();
    let inner = s.strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let bad = |p: &str| ApiError::bad_request(format!("unable to parse requirement: {p}"));
        let mut reqs = Vec::new();
        for part in split_top_level(s) {
            let req = if let Some(k) = part.strip_prefix('!') {
                LabelReq::NotExists(k.trim().to_string())
            } else if let Some((k, v)) = part.split_once("!=") {
                LabelReq::NotEq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                LabelReq::Eq(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once(" notin ") {
                LabelReq::NotIn(k.trim().into(), parse_set(v).ok_or_else(|| bad(&part))?)
            } else if let Some((k, v)) = part.split_once(" in ") {
                LabelReq::In(k.trim().into(), parse_set(v).ok_or_else(|| bad(&part))?)
            } else if part.contains(' ') || part.contains('(') {
                return Err(bad(&part));
            } else {
                LabelReq::Exists(part.clone())
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.0.iter().all(|r| match r {
            LabelReq::Eq(k, v) => get(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => get(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::NotIn(k, vs) => !get(k).is_some_and(|x| vs.iter().any(|v| v == x)),
            LabelReq::Exists(k) => get(k).is_some(),
            LabelReq::NotExists(k) => get(k).is_none(),
        })
    }
}

/// A `metav1.LabelSelector` object (matchLabels + matchExpressions), as PDBs carry.
/// An empty selector matches everything (policy/v1 semantics); a missing one matches nothing.
pub fn label_selector_object_matches(selector: Option<&Value>, obj: &Value) -> bool {
    let Some(sel) = selector else { return false };
    let labels = obj.pointer("/metadata/labels");
    let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    if let Some(ml) = sel.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in ml {
            if get(k) != v.as_str() {
                return false;
            }
        }
    }
    if let Some(exprs) = sel.get("matchExpressions").and_then(Value::as_array) {
        for e in exprs {
            let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
            let values = str_list(e.get("values"));
            let ok = match e.get("operator").and_then(Value::as_str) {
                Some("In") => get(key).is_some_and(|x| values.contains(&x)),
                Some("NotIn") => !get(key).is_some_and(|x| values.contains(&x)),
                Some("Exists") => get(key).is_some(),
                Some("DoesNotExist") => get(key).is_none(),
                _ => false,
            };
            if !ok {
                return false;
            }
        }
    }
    true
}

#[derive(Debug, Clone, PartialEq)]
struct FieldReq {
    path: &'static str,
    value: String,
    negate: bool,
}

/// A parsed `fieldSelector`. Only the fields the real apiserver indexes for the resource are
/// accepted; anything else is a 400, exactly as a real cluster answers.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<FieldReq>);

/// Field paths supported per resource (core registry field label conversion funcs).
fn supported_fields(group: &str, plural: &str) -> &'static [&'static str] {
    match (group, plural) {
        ("", "pods") => &[
            "metadata.name",
            "metadata.namespace",
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ],
        ("", "nodes") => &["metadata.name", "spec.unschedulable"],
        ("", "events") => &[
            "metadata.name",
            "metadata.namespace",
            "involvedObject.kind",
            "involvedObject.namespace",
            "involvedObject.name",
            "involvedObject.uid",
            "involvedObject.apiVersion",
            "involvedObject.resourceVersion",
            "involvedObject.fieldPath",
            "reason",
            "reportingComponent",
            "source",
            "type",
        ],
        // events.k8s.io/v1's names for the same fields of the one Event storage.
        ("events.k8s.io", "events") => &[
            "metadata.name",
            "metadata.namespace",
            "regarding.kind",
            "regarding.namespace",
            "regarding.name",
            "regarding.uid",
            "regarding.apiVersion",
            "regarding.resourceVersion",
            "regarding.fieldPath",
            "reason",
            "reportingController",
            "type",
        ],
        ("", "namespaces") => &["metadata.name", "status.phase"],
        _ => &["metadata.name", "metadata.namespace"],
    }
}

fn field_value(obj: &Value, path: &str) -> String {
    let ptr = format!("/{}", path.replace('.', "/"));
    match obj.pointer(&ptr) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Bool(b)) => b.to_string(),
        Some(Value::Number(n)) => n.to_string(),
        // Unset booleans select as "false", like the real conversion of a zero value.
        None if path == "spec.unschedulable" || path == "spec.hostNetwork" => "false".into(),
        _ => String::new(),
    }
}

impl FieldSelector {
    pub fn parse(s: &str, group: &str, plural: &str) -> Result<Self, ApiError> {
        let supported = supported_fields(group, plural);
        let mut reqs = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (key, value, negate) = if let Some((k, v)) = part.split_once("!=") {
                (k, v, true)
            } else if let Some((k, v)) = part.split_once("==") {
                (k, v, false)
            } else if let Some((k, v)) = part.split_once('=') {
                (k, v, false)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{part}'"
                )));
            };
            let key = key.trim();
            let Some(path) = supported.iter().find(|f| **f == key) else {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {key}"
                )));
            };
            reqs.push(FieldReq {
                path,
                value: value.trim().to_string(),
                negate,
            });
        }
        Ok(Self(reqs))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|r| {
            let v = if r.path == "source" {
                field_value(obj, "source.component")
            } else {
                field_value(obj, r.path)
            };
            (v == r.value) != r.negate
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn label_selector_forms() {
        let pod = json!({"metadata": {"labels": {"app": "db", "tier": "a"}}});
        for (sel, want) in [
            ("app=db", true),
            ("app==db,tier=a", true),
            ("app!=db", false),
            ("app in (web, db)", true),
            ("tier notin (a)", false),
            ("app", true),
            ("!missing", true),
            ("!app", false),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&pod),
                want,
                "{sel}"
            );
        }
    }

    #[test]
    fn unsupported_field_is_rejected() {
        assert!(FieldSelector::parse("spec.nodeName=a", "", "pods").is_ok());
        let err = FieldSelector::parse("spec.priority=1", "", "pods").unwrap_err();
        assert_eq!(err.code, 400);
        assert!(FieldSelector::parse("spec.nodeName=a", "", "nodes").is_err());
    }
}
