//! The node's own objects: the pods bound to it, and the NodeMaintenances, EvictionRequests
//! and Evictions labelled for it. A node's daemon watches its own objects and the
//! unlabelled ones, never those labelled for another node.

use k8s_openapi::api::core::v1::Pod;

/// Label naming one node: on a NodeMaintenance, the node it drains alone (a node's shutdown
/// maintenance); on an EvictionRequest or Eviction, the node whose daemon acts on it (a
/// restarted daemon recognises its requests after the pod has left its pod cache).
pub const NODE_LABEL: &str = "nodegrace.dev/node";

/// The [`NODE_LABEL`] value for `node`; None when the name is not a label value (node names
/// are DNS subdomains of up to 253 characters, label values at most 63).
pub(crate) fn node_label_value(node: &str) -> Option<&str> {
    (!node.is_empty() && super::names::is_label_value(node)).then_some(node)
}

/// The label selector of the objects labelled for `node`; None when it cannot be labelled.
pub(crate) fn own_selector(node: &str) -> Option<String> {
    node_label_value(node).map(|value| format!("{NODE_LABEL}={value}"))
}

/// The label selector of the objects labelled for no node.
pub(crate) fn unlabelled_selector() -> String {
    format!("!{NODE_LABEL}")
}

/// The field selector of the pods bound to `node`.
pub(crate) fn pods_field_selector(node: &str) -> String {
    format!("spec.nodeName={node}")
}

/// `pod` is bound to `node` (what [`pods_field_selector`] asks the apiserver for; a cached
/// copy is checked again).
pub(crate) fn is_bound_to(pod: &Pod, node: &str) -> bool {
    pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_name_over_63_characters_has_no_label_and_no_own_selector() {
        assert_eq!(own_selector("n1").as_deref(), Some("nodegrace.dev/node=n1"));
        let n63 = "n".repeat(63);
        assert_eq!(node_label_value(&n63), Some(n63.as_str()));
        let n64 = "n".repeat(64);
        assert_eq!(node_label_value(&n64), None);
        assert_eq!(own_selector(&n64), None);
        assert_eq!(node_label_value(""), None);
        assert_eq!(unlabelled_selector(), "!nodegrace.dev/node");
    }

    #[test]
    fn bound_means_spec_node_name() {
        let pod = |node: Option<&str>| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "p"},
                "spec": {"containers": [], "nodeName": node},
            }))
            .unwrap()
        };
        assert!(is_bound_to(&pod(Some("n1")), "n1"));
        assert!(!is_bound_to(&pod(Some("n2")), "n1"));
        assert!(!is_bound_to(&pod(None), "n1"));
        assert_eq!(pods_field_selector("n1"), "spec.nodeName=n1");
    }
}
