use super::*;
use crate::plan::{DrainPlanEntry, PodType};
use serde_json::json;

fn entry(priority: i32, pod_type: PodType) -> DrainPlanEntry {
    DrainPlanEntry {
        pod_selector: None,
        pod_priority: priority,
        pod_type,
    }
}

#[test]
fn node_maintenance_round_trips_in_kep_shape() {
    let yaml = r#"
apiVersion: nodegrace.dev/v1alpha1
kind: NodeMaintenance
metadata:
  name: maintenance-a
spec:
  nodeSelector:
    nodeSelectorTerms:
      - matchExpressions:
          - key: pool
            operator: In
            values: [blue]
  stage: Drain
  reason: kernel upgrade
  drainPlan:
    - podPriority: 5000
      podType: Default
    - podPriority: 15000
      podType: Default
      podSelector:
        matchLabels:
          app: muffin
    - podPriority: 3000
      podType: DaemonSet
status:
  stageStatuses:
    - name: Drain
      startTimestamp: "2026-11-22T02:00:00Z"
  drainStatus:
    podsPendingEvictionRequest: 130
    activeEvictionRequests: 17
    drainMessage: Draining
    reachedDrainTargets:
      - podPriority: 5000
        podType: Default
  nodeStatuses:
    - nodeName: one
      nodeRef: {name: one}
      podsPendingEvictionRequest: 100
      activeEvictionRequests: 10
      podsRemaining: 110
      podsNotTargeted: 4
      drainMessage: Draining
      drainTargets:
        - podPriority: 5000
          podType: Default
  conditions:
    - type: Drained
      status: "False"
      reason: Draining
      message: ""
      lastTransitionTime: "2026-11-22T02:00:00Z"
"#;
    let nm: NodeMaintenance = serde_yaml::from_str(yaml).unwrap();
    assert_eq!(nm.stage(), Stage::Drain);
    assert_eq!(nm.spec.drain_plan[2], entry(3000, PodType::DaemonSet));
    assert_eq!(nm.drained(), Some("False"));
    let one = nm.node_status("one").unwrap();
    assert_eq!(one.pods_pending_eviction_request, 100);
    assert_eq!(one.drain_targets, vec![entry(5000, PodType::Default)]);
    assert!(nm.node_status("two").is_none());

    let back = serde_json::to_value(&nm).unwrap();
    let original: serde_json::Value = serde_yaml::from_str(yaml).unwrap();
    assert_eq!(
        back, original,
        "serialization must reproduce the KEP field names"
    );
    assert_eq!(
        back["spec"]["drainPlan"][1]["podSelector"]["matchLabels"]["app"],
        "muffin"
    );
    assert_eq!(
        back["status"]["drainStatus"]["reachedDrainTargets"][0]["podPriority"],
        5000
    );
}

#[test]
fn stage_defaults_to_idle_and_only_moves_forward() {
    let nm: NodeMaintenance = serde_json::from_value(json!({
        "apiVersion": API_VERSION, "kind": "NodeMaintenance",
        "metadata": {"name": "m"},
        "spec": {"nodeSelector": {"nodeSelectorTerms": []}}
    }))
    .unwrap();
    assert_eq!(nm.stage(), Stage::Idle);
    assert!(Stage::Idle.may_become(Stage::Complete));
    assert!(Stage::Cordon.may_become(Stage::Drain));
    assert!(!Stage::Drain.may_become(Stage::Cordon));
    assert!(!Stage::Complete.may_become(Stage::Idle));
    let names: Vec<String> = Stage::ALL.iter().map(ToString::to_string).collect();
    assert_eq!(names, ["Idle", "Cordon", "Drain", "Complete"]);
}

#[test]
fn field_manager_is_per_node_and_within_the_apiserver_limit() {
    assert_eq!(field_manager_for_node("worker-1"), "nodegrace-worker-1");
    let long_a = format!("{}a", "n".repeat(252));
    let long_b = format!("{}b", "n".repeat(252));
    let a = field_manager_for_node(&long_a);
    let b = field_manager_for_node(&long_b);
    assert_eq!(a.len(), FIELD_MANAGER_MAX_LEN);
    assert_eq!(b.len(), FIELD_MANAGER_MAX_LEN);
    assert_ne!(a, b, "distinct nodes must never share a manager");
    assert!(a.starts_with("nodegrace-nnnn"));
    assert_eq!(a, field_manager_for_node(&long_a), "stable across restarts");
    let exact = "x".repeat(FIELD_MANAGER_MAX_LEN - FIELD_MANAGER_PREFIX.len());
    assert_eq!(field_manager_for_node(&exact), format!("nodegrace-{exact}"));
}

#[test]
fn node_status_apply_patch_carries_only_this_nodes_entry() {
    let mut entry = NodeMaintenanceNodeStatus::for_node("two");
    entry.drain_targets = vec![entry_for_patch()];
    entry.drain_message = "Draining".into();
    entry.pods_pending_eviction_request = 30;
    entry.active_eviction_requests = 7;
    entry.pods_remaining = 37;
    let body = node_status_apply_patch("maintenance-a", &entry).unwrap();
    assert_eq!(
        body,
        json!({
            "apiVersion": "nodegrace.dev/v1alpha1",
            "kind": "NodeMaintenance",
            "metadata": {"name": "maintenance-a"},
            "status": {"nodeStatuses": [{
                "nodeName": "two",
                "nodeRef": {"name": "two"},
                "drainTargets": [{"podPriority": 5000, "podType": "Default"}],
                "drainMessage": "Draining",
                "podsPendingEvictionRequest": 30,
                "activeEvictionRequests": 7,
                "podsRemaining": 37,
                "podsNotTargeted": 0
            }]}
        })
    );
    let params = node_status_patch_params("two");
    assert_eq!(params.field_manager.as_deref(), Some("nodegrace-two"));
    assert!(params.force);
}

fn entry_for_patch() -> DrainPlanEntry {
    entry(5000, PodType::Default)
}

#[test]
fn node_selector_for_pins_the_node_by_name() {
    let selector = serde_json::to_value(node_selector_for("one")).unwrap();
    assert_eq!(
        selector,
        json!({"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["one"]}]}]})
    );
}

#[test]
fn shutdown_maintenance_name_is_a_valid_object_name_for_any_node() {
    assert_eq!(shutdown_maintenance_name("one"), "shutdown-one");
    // The cut after 227 characters lands on the dot, which must not end a label.
    let long = format!("{}.{}", "a".repeat(226), "b".repeat(26));
    let name = shutdown_maintenance_name(&long);
    assert!(name.len() <= 253, "{}", name.len());
    assert!(name.starts_with("shutdown-aaaa"));
    assert!(!name.contains(".-") && !name.contains("--"), "{name}");
    assert_ne!(
        name,
        shutdown_maintenance_name(&format!("{}.{}", "a".repeat(226), "c".repeat(26)))
    );
}
