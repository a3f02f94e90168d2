//! Reading a static pod manifest the way the kubelet does: one `v1` Pod per file, YAML or
//! JSON (JSON is read as YAML, which it is a subset of).

use std::collections::BTreeMap;

use serde_json::Value;

use crate::yaml::{self, Duplicates, Reading};

/// Value of the built-in PriorityClass `system-node-critical`.
pub(crate) const SYSTEM_NODE_CRITICAL: i32 = 2_000_001_000;
/// Value of the built-in PriorityClass `system-cluster-critical`.
pub(crate) const SYSTEM_CLUSTER_CRITICAL: i32 = 2_000_000_000;

/// What nodegrace needs to know about a static pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ParsedPod {
    pub namespace: String,
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub priority: i32,
}

/// Parses one manifest. The priority is `spec.priority` when the file sets it; otherwise
/// the value of a built-in class named by `spec.priorityClassName`
/// (`system-node-critical`, `system-cluster-critical`); otherwise 0. The kubelet never
/// resolves other PriorityClasses for static pods (admission does that only for the
/// mirror pod), so neither do we.
pub(crate) fn parse_manifest(bytes: &[u8]) -> Result<ParsedPod, String> {
    if bytes.iter().all(|b| b.is_ascii_whitespace()) {
        return Err("file is empty".into());
    }
    if bytes.len() > MAX_PARSED_BYTES {
        return Err(format!(
            "not read: larger than {} MiB, the most of a manifest parsed (no pod manifest is \
             near it); gated last with the files not read",
            MAX_PARSED_BYTES >> 20
        ));
    }
    let doc: Value =
        yaml::from_slice(bytes, Reading::file(Duplicates::Refused)).map_err(
            |e| match yaml::limit(&e) {
                Some(why) => format!("not read: {why}"),
                None => format!("not YAML/JSON: {}", crate::text::yaml_fault(&e)),
            },
        )?;
    let Value::Object(_) = doc else {
        return Err("top level is not an object".into());
    };
    match doc.get("apiVersion").and_then(Value::as_str) {
        Some("v1") => {}
        Some(other) => return Err(format!("apiVersion is {other:?}, the kubelet needs \"v1\"")),
        None => return Err("apiVersion is missing".into()),
    }
    match doc.get("kind").and_then(Value::as_str) {
        Some("Pod") => {}
        Some(other) => return Err(format!("kind is {other:?}, not \"Pod\"")),
        None => return Err("kind is missing".into()),
    }
    let meta = doc.get("metadata").ok_or("metadata is missing")?;
    let name = match meta.get("name") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err("metadata.name is missing or empty".into()),
    };
    let namespace = match meta.get("namespace") {
        None | Some(Value::Null) => "default".to_string(),
        Some(Value::String(s)) if s.is_empty() => "default".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("metadata.namespace is not a string".into()),
    };
    let mut labels = BTreeMap::new();
    match meta.get("labels") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (k, v) in m {
                match v {
                    Value::String(v) => {
                        labels.insert(k.clone(), v.clone());
                    }
                    _ => return Err(format!("metadata.labels has a non-string entry {k:?}")),
                }
            }
        }
        Some(_) => return Err("metadata.labels is not a map".into()),
    }
    let spec = doc.get("spec");
    let priority = match spec.and_then(|s| s.get("priority")) {
        None | Some(Value::Null) => spec
            .and_then(|s| s.get("priorityClassName"))
            .and_then(Value::as_str)
            .map(builtin_class_priority)
            .unwrap_or(0),
        Some(v) => v
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .ok_or("spec.priority is not a 32-bit integer")?,
    };
    Ok(ParsedPod {
        namespace,
        name,
        labels,
        priority,
    })
}

fn builtin_class_priority(class: &str) -> i32 {
    match class {
        "system-node-critical" => SYSTEM_NODE_CRITICAL,
        "system-cluster-critical" => SYSTEM_CLUSTER_CRITICAL,
        _ => 0,
    }
}

/// The most of a manifest parsed: with the nodes allowed (`yaml::MAX_FILE_NODES`), about a
/// tenth of a second of the YAML parser on the optimized build (files up to
/// `fsio::MANIFEST_LIMIT` are still moved, gated and restored).
pub(crate) const MAX_PARSED_BYTES: usize = 1 << 20;

/// The name the kubelet gives the mirror pod of a static pod: `<name>-<nodeName>`, with
/// the node name lower-cased as the kubelet does.
pub fn mirror_pod_name(manifest_pod_name: &str, node_name: &str) -> String {
    format!("{manifest_pod_name}-{}", node_name.to_lowercase())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn yaml_with_defaults() {
        let p = parse_manifest(b"apiVersion: v1\nkind: Pod\nmetadata:\n  name: etcd\nspec: {}\n")
            .unwrap();
        assert_eq!(p.namespace, "default");
        assert_eq!(p.name, "etcd");
        assert_eq!(p.priority, 0);
        assert!(p.labels.is_empty());
    }

    #[test]
    fn a_manifest_past_the_parse_cap_is_not_read() {
        let head = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: big\n";
        let pad = |n: usize| format!("{head}x: \"{}\"\n", "a".repeat(n - head.len() - 6));
        assert_eq!(pad(MAX_PARSED_BYTES).len(), MAX_PARSED_BYTES);
        assert!(parse_manifest(pad(MAX_PARSED_BYTES).as_bytes()).is_ok());
        let over = parse_manifest(pad(MAX_PARSED_BYTES + 1).as_bytes()).unwrap_err();
        assert!(over.starts_with("not read: larger than 1 MiB"), "{over}");
    }

    #[test]
    fn json_with_everything() {
        let p = parse_manifest(
            br#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"kube-apiserver",
               "namespace":"kube-system","labels":{"tier":"control-plane"}},
               "spec":{"priority":17,"priorityClassName":"system-node-critical"}}"#,
        )
        .unwrap();
        assert_eq!(p.namespace, "kube-system");
        assert_eq!(p.priority, 17, "spec.priority wins over the class name");
        assert_eq!(p.labels["tier"], "control-plane");
    }

    #[test]
    fn builtin_priority_classes() {
        for (class, want) in [
            ("system-node-critical", SYSTEM_NODE_CRITICAL),
            ("system-cluster-critical", SYSTEM_CLUSTER_CRITICAL),
            ("my-class", 0),
        ] {
            let y = format!(
                "apiVersion: v1\nkind: Pod\nmetadata: {{name: a}}\nspec: {{priorityClassName: {class}}}\n"
            );
            assert_eq!(parse_manifest(y.as_bytes()).unwrap().priority, want);
        }
    }

    #[test]
    fn rejects_what_the_kubelet_rejects() {
        for bad in [
            &b""[..],
            b"   \n",
            b"{{{ not yaml",
            b"- a\n- b\n",
            b"apiVersion: v1\nkind: Deployment\nmetadata: {name: a}\n",
            b"kind: Pod\nmetadata: {name: a}\n",
            b"apiVersion: v1\nkind: Pod\nmetadata: {namespace: x}\n",
            b"apiVersion: v1\nkind: Pod\nmetadata: {name: a, labels: {n: 1}}\n",
            b"apiVersion: v1\nkind: Pod\nmetadata: {name: a}\nspec: {priority: 99999999999}\n",
            b"apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\napiVersion: v1\nkind: Pod\nmetadata: {name: b}\n",
        ] {
            assert!(
                parse_manifest(bad).is_err(),
                "{:?} parsed",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn mirror_name_lowercases_node() {
        assert_eq!(mirror_pod_name("etcd", "Node-A"), "etcd-node-a");
    }
}
