//! Marks nodegrace puts on its own Node: cordon (remembering who cordoned), the maintenance
//! taint, and the graceful-shutdown condition and load-balancer exclusion label. Each change
//! is a merge patch carrying the resourceVersion it was computed from, so a concurrent writer
//! causes a 409 and a fresh read instead of a lost update.

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Node, NodeCondition, Taint};
use kube::api::{Patch, PatchParams};
use kube::Api;
use serde_json::{json, Value};

use super::gateway::{self, Kind};
use super::FIELD_MANAGER;

/// Present while nodegrace holds the node cordoned; its value is `spec.unschedulable` as it
/// was before, so completing a maintenance restores exactly that.
pub(crate) const PREVIOUS_UNSCHEDULABLE_ANNOTATION: &str = "nodegrace.dev/previous-unschedulable";
/// Present while nodegrace added the load-balancer exclusion label (and so must remove it).
pub(crate) const ADDED_LB_EXCLUSION_ANNOTATION: &str = "nodegrace.dev/added-lb-exclusion";
pub(crate) const MAINTENANCE_TAINT_KEY: &str = "nodegrace.dev/maintenance";
/// On a node that needs a reboot until its slot in its wave is free (PreferNoSchedule).
pub(crate) const REBOOT_PENDING_TAINT_KEY: &str = "nodegrace.dev/reboot-pending";
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

pub(crate) fn unschedulable(node: &Node) -> bool {
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

/// Whether nodegrace's cordon holds the node: unschedulable, with the annotation its cordon
/// set (removed when it uncordons).
pub(crate) fn cordoned_by_nodegrace(node: &Node) -> bool {
    unschedulable(node) && annotation(node, PREVIOUS_UNSCHEDULABLE_ANNOTATION).is_some()
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

/// Adds (`present`) or removes the `nodegrace.dev/maintenance:NoSchedule` taint.
pub(crate) fn maintenance_taint_patch(node: &Node, present: bool) -> Option<Value> {
    taint_patch(node, MAINTENANCE_TAINT_KEY, "NoSchedule", present)
}

/// Adds (`present`) or removes the `nodegrace.dev/reboot-pending:PreferNoSchedule` taint of
/// a node waiting for its turn in a reboot wave.
pub(crate) fn reboot_pending_taint_patch(node: &Node, present: bool) -> Option<Value> {
    taint_patch(node, REBOOT_PENDING_TAINT_KEY, "PreferNoSchedule", present)
}

/// Taints have no merge key, so the whole list is written back.
fn taint_patch(node: &Node, key: &str, effect: &str, present: bool) -> Option<Value> {
    let mut list = taints(node);
    let has = list.iter().any(|t| t.key == key);
    if has == present {
        return None;
    }
    if present {
        list.push(Taint {
            key: key.into(),
            effect: effect.into(),
            value: None,
            time_added: None,
        });
    } else {
        list.retain(|t| t.key != key);
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
        let r = api
            .patch(name, &merge_params(), &Patch::Merge(&patch))
            .await;
        match gateway::reply(r) {
            Ok(_) => return Ok(true),
            Err(f) if f.is(Kind::Conflict) => continue,
            Err(f) => return Err(f.context(format!("patching node {name} to {what}")).into()),
        }
    }
    bail!("patching node {name} to {what}: still conflicting after {MAX_CONFLICT_RETRIES} attempts")
}

/// What nodegrace's lifecycle conditions on its Node should say (KEP-5683 names; KEP-6249's
/// for a shutdown).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lifecycle {
    /// A shutdown drain is about to start: `DrainInProgress=True`, and
    /// `GracefulNodeShutdownInProgress=True` when `gns` (nodegrace is the node's graceful
    /// shutdown manager), both reason `NodeShutdown`.
    Shutdown { gns: bool },
    /// The shutdown was cancelled, or is over (a boot; a True left by a crash): whatever
    /// says `NodeShutdown` (or the reason nodegrace used before) becomes False.
    /// `GracefulNodeShutdownInProgress` is left alone unless `gns`.
    ShutdownOver { gns: bool, reason: &'static str },
    /// An administrator's maintenance drains the node.
    AdminDraining,
    /// Its drain is done: `Drained=True`.
    AdminDrained,
    /// No maintenance of an administrator is active: nodegrace's own True conditions
    /// of one become False. Others' (`kubectl drain`'s, say) are left alone.
    AdminIdle,
}

pub(crate) const DRAIN_CONDITION: &str = "DrainInProgress";
pub(crate) const DRAINED_CONDITION: &str = "Drained";
pub(crate) const REASON_NODE_SHUTDOWN: &str = "NodeShutdown";
pub(crate) const REASON_SHUTDOWN_CANCELLED: &str = "NodeShutdownCancelled";
pub(crate) const REASON_SHUTDOWN_ENDED: &str = "NodeShutdownEnded";
pub(crate) const REASON_DRAIN_STARTED: &str = "NodegraceDrainStarted";
pub(crate) const REASON_DRAIN_COMPLETED: &str = "NodegraceDrainCompleted";
pub(crate) const REASON_MAINTENANCE_ENDED: &str = "NodegraceMaintenanceEnded";
/// What nodegrace wrote into `GracefulNodeShutdownInProgress` before it used the upstream
/// reason: a True with it is nodegrace's too.
const LEGACY_SHUTDOWN_REASON: &str = "NodeShuttingDown";

fn condition<'a>(node: &'a Node, type_: &str) -> Option<&'a NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
}

fn is_true_with(node: &Node, type_: &str, reasons: &[&str]) -> bool {
    condition(node, type_).is_some_and(|c| {
        c.status == "True" && reasons.contains(&c.reason.as_deref().unwrap_or_default())
    })
}

/// The conditions to write for `want`, each `(type, status, reason, message)`, or none when
/// the Node already says it (status and reason; the message alone is no reason to write).
/// A shutdown's conditions are always written, together, in one write.
pub(crate) fn lifecycle_changes(
    node: &Node,
    want: Lifecycle,
    message: &str,
) -> Vec<(&'static str, bool, &'static str, String)> {
    let differs = |type_: &str, status: bool, reason: &str| {
        condition(node, type_)
            .is_none_or(|c| (c.status == "True") != status || c.reason.as_deref() != Some(reason))
    };
    let msg = message.to_string();
    let mut out: Vec<(&'static str, bool, &'static str, String)> = Vec::new();
    match want {
        Lifecycle::Shutdown { gns } => {
            let mut all = vec![(DRAIN_CONDITION, true, REASON_NODE_SHUTDOWN, msg.clone())];
            if gns {
                all.insert(0, (SHUTDOWN_CONDITION, true, REASON_NODE_SHUTDOWN, msg));
            }
            // Always written: a copy of the Node read before a cancel's write arrived
            // may still say True.
            out = all;
        }
        Lifecycle::ShutdownOver { gns, reason } => {
            let ours = [REASON_NODE_SHUTDOWN, LEGACY_SHUTDOWN_REASON];
            let gns_ours = if gns {
                is_true_with(node, SHUTDOWN_CONDITION, &ours)
            } else {
                is_true_with(node, SHUTDOWN_CONDITION, &[LEGACY_SHUTDOWN_REASON])
            };
            if gns_ours {
                out.push((SHUTDOWN_CONDITION, false, reason, msg.clone()));
            }
            if is_true_with(node, DRAIN_CONDITION, &[REASON_NODE_SHUTDOWN]) {
                out.push((DRAIN_CONDITION, false, reason, msg));
            }
        }
        Lifecycle::AdminDraining => {
            if differs(DRAIN_CONDITION, true, REASON_DRAIN_STARTED) {
                out.push((DRAIN_CONDITION, true, REASON_DRAIN_STARTED, msg.clone()));
            }
            if condition(node, DRAINED_CONDITION).is_some_and(|c| c.status == "True") {
                out.push((DRAINED_CONDITION, false, REASON_DRAIN_STARTED, msg));
            }
        }
        Lifecycle::AdminDrained => {
            if is_true_with(node, DRAIN_CONDITION, &[REASON_DRAIN_STARTED]) {
                out.push((DRAIN_CONDITION, false, REASON_DRAIN_COMPLETED, msg.clone()));
            }
            if differs(DRAINED_CONDITION, true, REASON_DRAIN_COMPLETED) {
                out.push((DRAINED_CONDITION, true, REASON_DRAIN_COMPLETED, msg));
            }
        }
        Lifecycle::AdminIdle => {
            let ours = [REASON_DRAIN_STARTED, REASON_DRAIN_COMPLETED];
            for type_ in [DRAIN_CONDITION, DRAINED_CONDITION] {
                if is_true_with(node, type_, &ours) {
                    out.push((type_, false, REASON_MAINTENANCE_ENDED, msg.clone()));
                }
            }
        }
    }
    out
}

/// The status patch for `changes`. Conditions merge by type, so the kubelet's own are
/// untouched; a condition keeps its `lastTransitionTime` unless its status changes.
pub(crate) fn lifecycle_patch(
    node: &Node,
    changes: &[(&'static str, bool, &'static str, String)],
) -> Value {
    let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let conditions: Vec<Value> = changes
        .iter()
        .map(|(type_, status, reason, message)| {
            let status = if *status { "True" } else { "False" };
            let transition = condition(node, type_)
                .filter(|c| c.status == status)
                .and_then(|c| c.last_transition_time.as_ref())
                .map(|t| t.0.to_string())
                .unwrap_or_else(|| now.clone());
            json!({
                "type": type_,
                "status": status,
                "reason": reason,
                "message": message,
                "lastHeartbeatTime": now,
                "lastTransitionTime": transition,
            })
        })
        .collect();
    json!({"status": {"conditions": conditions}})
}

/// Writes what [`lifecycle_changes`] says, in one status write. Returns the Node as the
/// apiserver answered, or None when nothing needed writing.
pub(crate) async fn set_lifecycle_conditions(
    api: &Api<Node>,
    node: &Node,
    want: Lifecycle,
    message: &str,
) -> Result<Option<Node>> {
    let changes = lifecycle_changes(node, want, message);
    if changes.is_empty() {
        return Ok(None);
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    let patch = lifecycle_patch(node, &changes);
    let types: Vec<&str> = changes.iter().map(|c| c.0).collect();
    let written = api
        .patch_status(&name, &merge_params(), &Patch::Strategic(&patch))
        .await
        .with_context(|| format!("setting conditions {} on node {name}", types.join(", ")))?;
    Ok(Some(written))
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

    fn with_conditions(conds: &[(&str, &str, &str)]) -> Node {
        let mut n = node(None, &[]);
        n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(
                conds
                    .iter()
                    .map(|(t, s, r)| NodeCondition {
                        type_: t.to_string(),
                        status: s.to_string(),
                        reason: Some(r.to_string()),
                        ..NodeCondition::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        });
        n
    }

    fn summary(
        changes: &[(&'static str, bool, &'static str, String)],
    ) -> Vec<(&'static str, bool, &'static str)> {
        changes.iter().map(|(t, s, r, _)| (*t, *s, *r)).collect()
    }

    #[test]
    fn a_shutdown_writes_both_conditions_even_when_the_node_says_so() {
        for node in [
            with_conditions(&[]),
            with_conditions(&[
                (SHUTDOWN_CONDITION, "True", REASON_NODE_SHUTDOWN),
                (DRAIN_CONDITION, "True", REASON_NODE_SHUTDOWN),
            ]),
        ] {
            let c = lifecycle_changes(&node, Lifecycle::Shutdown { gns: true }, "m");
            assert_eq!(
                summary(&c),
                [
                    (SHUTDOWN_CONDITION, true, REASON_NODE_SHUTDOWN),
                    (DRAIN_CONDITION, true, REASON_NODE_SHUTDOWN)
                ]
            );
        }
        let c = lifecycle_changes(
            &with_conditions(&[]),
            Lifecycle::Shutdown { gns: false },
            "m",
        );
        assert_eq!(summary(&c), [(DRAIN_CONDITION, true, REASON_NODE_SHUTDOWN)]);
    }

    #[test]
    fn the_end_of_a_shutdown_clears_only_node_shutdown_trues() {
        let over = |gns| Lifecycle::ShutdownOver {
            gns,
            reason: REASON_SHUTDOWN_ENDED,
        };
        let stale = with_conditions(&[
            (SHUTDOWN_CONDITION, "True", REASON_NODE_SHUTDOWN),
            (DRAIN_CONDITION, "True", REASON_NODE_SHUTDOWN),
        ]);
        assert_eq!(
            summary(&lifecycle_changes(&stale, over(true), "m")),
            [
                (SHUTDOWN_CONDITION, false, REASON_SHUTDOWN_ENDED),
                (DRAIN_CONDITION, false, REASON_SHUTDOWN_ENDED)
            ]
        );
        // The kubelet's GNS: its condition is its own.
        assert_eq!(
            summary(&lifecycle_changes(&stale, over(false), "m")),
            [(DRAIN_CONDITION, false, REASON_SHUTDOWN_ENDED)]
        );
        // nodegrace's reason of before is still its own.
        let legacy = with_conditions(&[(SHUTDOWN_CONDITION, "True", "NodeShuttingDown")]);
        assert_eq!(
            summary(&lifecycle_changes(&legacy, over(false), "m")),
            [(SHUTDOWN_CONDITION, false, REASON_SHUTDOWN_ENDED)]
        );
        let others = with_conditions(&[
            (DRAIN_CONDITION, "True", "KubectlDrainStarted"),
            (DRAINED_CONDITION, "True", "AdminRequested"),
            (SHUTDOWN_CONDITION, "False", REASON_SHUTDOWN_ENDED),
        ]);
        assert!(lifecycle_changes(&others, over(true), "m").is_empty());
    }

    #[test]
    fn an_admin_drain_goes_from_in_progress_to_drained_to_neither() {
        let fresh = with_conditions(&[]);
        assert_eq!(
            summary(&lifecycle_changes(&fresh, Lifecycle::AdminDraining, "m")),
            [(DRAIN_CONDITION, true, REASON_DRAIN_STARTED)]
        );
        let draining = with_conditions(&[(DRAIN_CONDITION, "True", REASON_DRAIN_STARTED)]);
        assert!(lifecycle_changes(&draining, Lifecycle::AdminDraining, "other message").is_empty());
        assert_eq!(
            summary(&lifecycle_changes(&draining, Lifecycle::AdminDrained, "m")),
            [
                (DRAIN_CONDITION, false, REASON_DRAIN_COMPLETED),
                (DRAINED_CONDITION, true, REASON_DRAIN_COMPLETED)
            ]
        );
        let drained = with_conditions(&[
            (DRAIN_CONDITION, "False", REASON_DRAIN_COMPLETED),
            (DRAINED_CONDITION, "True", REASON_DRAIN_COMPLETED),
        ]);
        assert!(lifecycle_changes(&drained, Lifecycle::AdminDrained, "m").is_empty());
        // More to drain (a second maintenance): no longer drained.
        assert_eq!(
            summary(&lifecycle_changes(&drained, Lifecycle::AdminDraining, "m")),
            [
                (DRAIN_CONDITION, true, REASON_DRAIN_STARTED),
                (DRAINED_CONDITION, false, REASON_DRAIN_STARTED)
            ]
        );
        assert_eq!(
            summary(&lifecycle_changes(&drained, Lifecycle::AdminIdle, "m")),
            [(DRAINED_CONDITION, false, REASON_MAINTENANCE_ENDED)]
        );
        // kubectl's drain is not nodegrace's to end.
        let kubectl = with_conditions(&[(DRAINED_CONDITION, "True", "KubectlDrainCompleted")]);
        assert!(lifecycle_changes(&kubectl, Lifecycle::AdminIdle, "m").is_empty());
        assert!(lifecycle_changes(&fresh, Lifecycle::AdminIdle, "m").is_empty());
    }

    #[test]
    fn a_condition_keeps_its_transition_time_unless_its_status_changes() {
        let mut n = with_conditions(&[(DRAIN_CONDITION, "True", REASON_DRAIN_STARTED)]);
        let t = "2026-01-02T03:04:05Z";
        n.status.as_mut().unwrap().conditions.as_mut().unwrap()[0].last_transition_time = Some(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.parse().unwrap()),
        );
        let same = lifecycle_patch(
            &n,
            &[(DRAIN_CONDITION, true, REASON_NODE_SHUTDOWN, "m".into())],
        );
        assert_eq!(
            same["status"]["conditions"][0]["lastTransitionTime"],
            json!(t)
        );
        let flip = lifecycle_patch(
            &n,
            &[(DRAIN_CONDITION, false, REASON_DRAIN_COMPLETED, "m".into())],
        );
        assert_ne!(
            flip["status"]["conditions"][0]["lastTransitionTime"],
            json!(t)
        );
    }
}
