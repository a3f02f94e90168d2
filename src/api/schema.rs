//! Server-side validation that schemars cannot derive: CEL rules (`x-kubernetes-validations`,
//! including transition rules), list-type markers and bounds, applied to the generated
//! OpenAPI schema by path.
//!
//! Every list a rule iterates has `maxItems`, so the apiserver's static cost estimate stays
//! small (equality of two objects costs O(number of properties), not O(bytes)).

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Map, Value};

/// One change to the schema at `path` (dot-separated property names; `[]` after a name
/// descends into the list's items; `.` alone is the root).
pub(crate) enum Patch {
    Rule {
        path: &'static str,
        rule: &'static str,
        message: &'static str,
    },
    MapList {
        path: &'static str,
        keys: &'static [&'static str],
    },
    Set {
        path: &'static str,
        key: &'static str,
        value: fn() -> Value,
    },
}

const INT32_MIN: i64 = i32::MIN as i64;
const INT32_MAX: i64 = i32::MAX as i64;

/// Stage order as a CEL map, so the transition rule is one lookup on each side.
pub(crate) const STAGE_ORDER_RULE: &str = "{'Idle': 0, 'Cordon': 1, 'Drain': 2, 'Complete': 3}[self] >= {'Idle': 0, 'Cordon': 1, 'Drain': 2, 'Complete': 3}[oldSelf]";

pub(crate) const NODE_MAINTENANCE: &[Patch] = &[
    Patch::Set {
        path: "spec.stage",
        key: "default",
        value: || json!("Idle"),
    },
    Patch::Rule {
        path: "spec.stage",
        rule: STAGE_ORDER_RULE,
        message: "stage cannot go back: the order is Idle -> Cordon -> Drain -> Complete (stages may be skipped)",
    },
    Patch::Set {
        path: "spec.nodeSelector.nodeSelectorTerms",
        key: "minItems",
        value: || json!(1),
    },
    Patch::Set {
        path: "spec.nodeSelector.nodeSelectorTerms",
        key: "maxItems",
        value: || json!(32),
    },
    Patch::Set {
        path: "spec.drainPlan",
        key: "maxItems",
        value: || json!(100),
    },
    Patch::Rule {
        path: "spec.drainPlan",
        rule: "self.all(a, self.exists_one(b, b == a))",
        message: "drainPlan entries must be unique",
    },
    Patch::Rule {
        path: "spec.drainPlan",
        rule: "self == oldSelf",
        message: "drainPlan is immutable once set",
    },
    Patch::Rule {
        path: "spec",
        rule: "has(self.drainPlan) || !has(oldSelf.drainPlan)",
        message: "drainPlan cannot be removed once set",
    },
    Patch::MapList {
        path: "status.stageStatuses",
        keys: &["name"],
    },
    Patch::MapList {
        path: "status.nodeStatuses",
        keys: &["nodeName"],
    },
    Patch::Rule {
        path: "status.nodeStatuses[]",
        rule: "self.nodeRef.name == self.nodeName",
        message: "nodeRef.name must equal nodeName",
    },
    Patch::MapList {
        path: "status.conditions",
        keys: &["type"],
    },
];

const CLOCK: &str = "^([01][0-9]|2[0-3]):[0-5][0-9]$";

pub(crate) const REBOOT_WAVE: &[Patch] = &[
    Patch::Rule {
        path: "spec.maxUnavailable",
        rule: "string(self).matches('^([1-9][0-9]*|([1-9][0-9]?|100)%)$')",
        message: "maxUnavailable is a count of 1 or more or a percentage from 1% to 100%",
    },
    Patch::Set {
        path: "spec.windows[].start",
        key: "pattern",
        value: || json!(CLOCK),
    },
    Patch::Set {
        path: "spec.windows[].end",
        key: "pattern",
        value: || json!(CLOCK),
    },
    Patch::Set {
        path: "spec.windows[].days",
        key: "x-kubernetes-list-type",
        value: || json!("set"),
    },
    Patch::MapList {
        path: "status.members",
        keys: &["node"],
    },
    Patch::MapList {
        path: "status.slots",
        keys: &["node"],
    },
];

/// Applies `patches` to an `openAPIV3Schema`, failing on a path the schema does not have
/// (a renamed field must not silently drop its validation).
pub(crate) fn apply(schema: &mut Value, patches: &[Patch]) -> Result<()> {
    for patch in patches {
        match patch {
            Patch::Rule {
                path,
                rule,
                message,
            } => push_rule(
                at(schema, path)?,
                json!({ "rule": rule, "message": message }),
            )?,
            Patch::MapList { path, keys } => {
                let node = object(at(schema, path)?, path)?;
                node.insert("x-kubernetes-list-type".into(), json!("map"));
                node.insert("x-kubernetes-list-map-keys".into(), json!(keys));
            }
            Patch::Set { path, key, value } => {
                object(at(schema, path)?, path)?.insert((*key).into(), value());
            }
        }
    }
    Ok(())
}

/// Every `DrainPlanEntry` in the schema gets the int32 bounds of `podPriority`, wherever
/// it is embedded (spec, drainStatus, nodeStatuses).
pub(crate) fn bound_pod_priorities(schema: &mut Value) {
    match schema {
        Value::Object(map) => {
            if let Some(Value::Object(props)) = map.get_mut("properties") {
                if props.contains_key("podType") {
                    if let Some(Value::Object(priority)) = props.get_mut("podPriority") {
                        priority.insert("minimum".into(), json!(INT32_MIN));
                        priority.insert("maximum".into(), json!(INT32_MAX));
                    }
                }
            }
            for value in map.values_mut() {
                bound_pod_priorities(value);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(bound_pod_priorities),
        _ => {}
    }
}

fn push_rule(node: &mut Value, rule: Value) -> Result<()> {
    let node = object(node, "rule target")?;
    let rules = node
        .entry("x-kubernetes-validations")
        .or_insert_with(|| Value::Array(Vec::new()));
    match rules {
        Value::Array(rules) => rules.push(rule),
        _ => bail!("x-kubernetes-validations is not a list"),
    }
    Ok(())
}

fn object<'a>(node: &'a mut Value, path: &str) -> Result<&'a mut Map<String, Value>> {
    node.as_object_mut()
        .with_context(|| format!("schema at {path} is not an object"))
}

fn at<'a>(schema: &'a mut Value, path: &str) -> Result<&'a mut Value> {
    if path == "." {
        return Ok(schema);
    }
    let mut node = schema;
    for segment in path.split('.') {
        let (name, items) = match segment.strip_suffix("[]") {
            Some(name) => (name, true),
            None => (segment, false),
        };
        node = node
            .get_mut("properties")
            .and_then(|p| p.get_mut(name))
            .with_context(|| format!("schema has no property {name:?} on the way to {path}"))?;
        if items {
            node = node
                .get_mut("items")
                .with_context(|| format!("schema property {name:?} in {path} is not a list"))?;
        }
    }
    Ok(node)
}
