//! Marks nodegrace puts on its own Node: cordon (remembering who cordoned), the maintenance
//! taint, and the graceful-shutdown condition and load-balancer exclusion label. Each change
//! is a merge patch carrying the resourceVersion it was computed from, so a concurrent writer
//! causes a 409 and a fresh read instead of a lost update.

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};

use super::{api_error_code, FIELD_MANAGER};

/// Present while nodegrace holds the node cordoned; its value is `spec.unschedulable` as it
/// was before, so completing a maintenance restores exactly that.
pub(crate) const PREVIOUS_UNSCHEDULABLE_ANNOTATION: &str = "nodegrace.dev/previous-unschedulable";
/// Present while nodegrace added the load-balancer exclusion label (and so must remove it).
pub(crate) const ADDED_LB_EXCLUSION_ANNOTATION: &str = "nodegrace.dev/added-lb-exclusion";
pub(crate) const MAINTENANCE_TAINT_KEY: &str = "nodegrace.dev/maintenance";
pub(crate) const SHUTDOWN_CONDITION: &str = "GracefulNodeShutdownInProgress";
pub(crate) const EXCLUDE_LB_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

const MAX_CONFLICT_RETRIES: usize = 8;

fn annotation<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
}

fn unschedulable(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

/// The patch that cordons `node`, or None when nodegrace already holds it cordoned.
/// A node someone else cordoned is still recorded, with previous value `true`, so that
/// completion leaves it cordoned. A node uncordoned by someone while nodegrace holds it is
/// cordoned again (KEP-4212 reconciles the cordon while a maintenance is active); what was
/// recorded before stays.
pub(crate) fn cordon_patch(node: &Node) -> Option<Value> {
    if annotation(node, PREVIOUS_UNSCHEDULABLE_ANNOTATION).is_some() {
        return (!unschedulable(node)).then(|| json!({"spec": {"unschedulable": true}}));
    }
    Some(json!({
        "metadata": {"annotations": {
            PREVIOUS_UNSCHEDULABLE_ANNOTATION: unschedulable(node).to_string()
        }},
        "spec": {"unschedulable": true}
    }))
}

/// The patch that undoes nodegrace's cordon, or None when nodegrace does not hold one.
/// The caller decides whether another active maintenance still needs the node cordoned.
pub(crate) fn uncordon_patch(node: &Node) -> Option<Value> {
    let previous = annotation(node, PREVIOUS_UNSCHEDULABLE_ANNOTATION)?;
    let restore = previous == "true";
    Some(json!({
        "metadata": {"annotations": {PREVIOUS_UNSCHEDULABLE_ANNOTATION: null}},
        "spec": {"unschedulable": if restore { json!(true) } else { Value::Null }}
    }))
}

fn taints(node: &Node) -> Vec<Taint> {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.clone())
        .unwrap_or_default()
}

/// Adds (`present`) or removes the `nodegrace.dev/maintenance:NoSchedule` taint. Taints have
/// no merge key, so the whole list is written back.
pub(crate) fn maintenance_taint_patch(node: &Node, present: bool) -> Option<Value> {
    let mut list = taints(node);
    let has = list.iter().any(|t| t.key == MAINTENANCE_TAINT_KEY);
    if has == present {
        return None;
    }
    if present {
        list.push(Taint {
            key: MAINTENANCE_TAINT_KEY.into(),
            effect: "NoSchedule".into(),
            value: None,
            time_added: None,
        });
    } else {
        list.retain(|t| t.key != MAINTENANCE_TAINT_KEY);
    }
    Some(json!({"spec": {"taints": list}}))
}

/// Adds or removes the load-balancer exclusion label, never removing one nodegrace did not add.
pub(crate) fn lb_exclusion_patch(node: &Node, present: bool) -> Option<Value> {
    let labelled = node
        .metadata
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(EXCLUDE_LB_LABEL));
    let ours = annotation(node, ADDED_LB_EXCLUSION_ANNOTATION).is_some();
    match (present, labelled, ours) {
        (true, false, _) => Some(json!({"metadata": {
            "labels": {EXCLUDE_LB_LABEL: ""},
            "annotations": {ADDED_LB_EXCLUSION_ANNOTATION: "true"}
        }})),
        (false, true, true) => Some(json!({"metadata": {
            "labels": {EXCLUDE_LB_LABEL: null},
            "annotations": {ADDED_LB_EXCLUSION_ANNOTATION: null}
        }})),
        (false, false, true) => Some(json!({"metadata": {
            "annotations": {ADDED_LB_EXCLUSION_ANNOTATION: null}
        }})),
        _ => None,
    }
}

/// Reads the node, computes a patch from what it read, and applies it with that read's
/// resourceVersion; on 409 reads again. Returns whether anything was written.
pub(crate) async fn patch_node_with<F>(
    api: &Api<Node>,
    name: &str,
    what: &str,
    compute: F,
) -> Result<bool>
where
    F: Fn(&Node) -> Option<Value>,
{
    for _ in 0..MAX_CONFLICT_RETRIES {
        let node = api
            .get(name)
            .await
            .with_context(|| format!("reading node {name} to {what}"))?;
        let Some(mut patch) = compute(&node) else {
            return Ok(false);
        };
        if let (Some(obj), Some(rv)) = (patch.as_object_mut(), node.metadata.resource_version) {
            let meta = obj.entry("metadata").or_insert_with(|| json!({}));
            if let Some(meta) = meta.as_object_mut() {
                meta.insert("resourceVersion".into(), Value::String(rv));
            }
        }
        match api
            .patch(name, &merge_params(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(true),
            Err(err) if api_error_code(&err) == Some(409) => continue,
            Err(err) => return Err(err).with_context(|| format!("patching node {name} to {what}")),
        }
    }
    bail!("patching node {name} to {what}: still conflicting after {MAX_CONFLICT_RETRIES} attempts")
}

/// Sets or clears the `GracefulNodeShutdownInProgress` condition through the status
/// subresource; conditions merge by type, so the kubelet's own conditions are untouched.
pub(crate) async fn set_shutdown_condition(
    api: &Api<Node>,
    name: &str,
    in_progress: bool,
    message: &str,
) -> Result<()> {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let patch = json!({"status": {"conditions": [{
        "type": SHUTDOWN_CONDITION,
        "status": if in_progress { "True" } else { "False" },
        "reason": if in_progress { "NodeShuttingDown" } else { "ShutdownHandled" },
        "message": message,
        "lastHeartbeatTime": now,
        "lastTransitionTime": now,
    }]}});
    api.patch_status(name, &merge_params(), &Patch::Strategic(&patch))
        .await
        .with_context(|| format!("setting condition {SHUTDOWN_CONDITION} on node {name}"))?;
    Ok(())
}

fn merge_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.into()),
        ..PatchParams::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use std::collections::BTreeMap;

    fn node(unschedulable: Option<bool>, annotations: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some("node-a".into());
        n.spec = Some(NodeSpec {
            unschedulable,
            ..NodeSpec::default()
        });
        if !annotations.is_empty() {
            n.metadata.annotations = Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            );
        }
        n
    }

    #[test]
    fn cordon_records_the_previous_state() {
        let p = cordon_patch(&node(None, &[])).unwrap();
        assert_eq!(p["spec"]["unschedulable"], json!(true));
        assert_eq!(
            p["metadata"]["annotations"][PREVIOUS_UNSCHEDULABLE_ANNOTATION],
            json!("false")
        );

        let p = cordon_patch(&node(Some(true), &[])).unwrap();
        assert_eq!(
            p["metadata"]["annotations"][PREVIOUS_UNSCHEDULABLE_ANNOTATION],
            json!("true")
        );
    }

    #[test]
    fn cordon_is_idempotent_once_recorded() {
        let n = node(Some(true), &[(PREVIOUS_UNSCHEDULABLE_ANNOTATION, "false")]);
        assert!(cordon_patch(&n).is_none());
    }

    #[test]
    fn a_node_uncordoned_under_nodegrace_is_cordoned_again_keeping_the_record() {
        let n = node(None, &[(PREVIOUS_UNSCHEDULABLE_ANNOTATION, "false")]);
        assert_eq!(
            cordon_patch(&n).unwrap(),
            json!({"spec": {"unschedulable": true}})
        );
    }

    #[test]
    fn uncordon_restores_what_was_there() {
        let ours = node(Some(true), &[(PREVIOUS_UNSCHEDULABLE_ANNOTATION, "false")]);
        let p = uncordon_patch(&ours).unwrap();
        assert_eq!(p["spec"]["unschedulable"], Value::Null);
        assert_eq!(
            p["metadata"]["annotations"][PREVIOUS_UNSCHEDULABLE_ANNOTATION],
            Value::Null
        );

        let someone_elses = node(Some(true), &[(PREVIOUS_UNSCHEDULABLE_ANNOTATION, "true")]);
        let p = uncordon_patch(&someone_elses).unwrap();
        assert_eq!(p["spec"]["unschedulable"], json!(true));
    }

    #[test]
    fn uncordon_leaves_a_node_nodegrace_never_cordoned() {
        assert!(uncordon_patch(&node(Some(true), &[])).is_none());
    }

    #[test]
    fn taint_is_added_once_and_removed_alone() {
        let mut n = node(None, &[]);
        let p = maintenance_taint_patch(&n, true).unwrap();
        assert_eq!(p["spec"]["taints"][0]["key"], json!(MAINTENANCE_TAINT_KEY));
        assert_eq!(p["spec"]["taints"][0]["effect"], json!("NoSchedule"));
        n.spec.as_mut().unwrap().taints = Some(vec![
            Taint {
                key: "other".into(),
                effect: "NoExecute".into(),
                ..Taint::default()
            },
            Taint {
                key: MAINTENANCE_TAINT_KEY.into(),
                effect: "NoSchedule".into(),
                ..Taint::default()
            },
        ]);
        assert!(maintenance_taint_patch(&n, true).is_none());
        let p = maintenance_taint_patch(&n, false).unwrap();
        assert_eq!(p["spec"]["taints"].as_array().unwrap().len(), 1);
        assert_eq!(p["spec"]["taints"][0]["key"], json!("other"));
    }

    #[test]
    fn lb_label_removed_only_when_nodegrace_added_it() {
        let mut n = node(None, &[]);
        n.metadata.labels = Some([(EXCLUDE_LB_LABEL.to_string(), String::new())].into());
        assert!(lb_exclusion_patch(&n, true).is_none());
        assert!(lb_exclusion_patch(&n, false).is_none());

        let fresh = node(None, &[]);
        let p = lb_exclusion_patch(&fresh, true).unwrap();
        assert_eq!(p["metadata"]["labels"][EXCLUDE_LB_LABEL], json!(""));

        let mut ours = node(None, &[(ADDED_LB_EXCLUSION_ANNOTATION, "true")]);
        ours.metadata.labels = Some([(EXCLUDE_LB_LABEL.to_string(), String::new())].into());
        let p = lb_exclusion_patch(&ours, false).unwrap();
        assert_eq!(p["metadata"]["labels"][EXCLUDE_LB_LABEL], Value::Null);
    }
}
