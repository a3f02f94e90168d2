//! What the daemon starts once it has reached the apiserver: the eviction path, decided once
//! from what discovery found and the node's name. `daemon/node.rs::connect_engine` only
//! carries it out. No I/O.

/// A warning to log once at connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WiringWarning {
    /// The EvictionRequest API is served but the node's name cannot be a label value.
    NodeNameNotALabel,
}

impl WiringWarning {
    pub(crate) fn message(self) -> &'static str {
        match self {
            WiringWarning::NodeNameNotALabel => "the node name is longer than a label value (63 characters): the admission policy cannot confine this node's EvictionRequests to it, so pods are evicted through the Eviction API directly (their declared responders are not asked)",
        }
    }
}

/// Everything connect decides about the termination path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Wiring {
    /// nodegrace asks the pods that declare responders to leave through EvictionRequests of
    /// `lifecycle.k8s.io` and watches how their Evictions go; false: every pod is evicted
    /// through the Eviction API directly and no watch runs.
    pub requester: bool,
    pub warning: Option<WiringWarning>,
}

impl Wiring {
    /// `in_tree`: the cluster serves `lifecycle.k8s.io/v1alpha1` evictionrequests and
    /// evictions.
    pub(crate) fn new(in_tree: bool, node: &str) -> Wiring {
        // Every request nodegrace writes carries the node label, which the packaged admission
        // policy matches against the writer's node: a node whose name is no label value takes
        // the Eviction API.
        let labelled = super::own::node_label_value(node).is_some();
        Wiring {
            requester: in_tree && labelled,
            warning: (in_tree && !labelled).then_some(WiringWarning::NodeNameNotALabel),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every combination of the inputs, each with what the daemon starts.
    #[test]
    fn each_combination_of_api_and_node_name_is_wired_as_an_operator_expects() {
        let long = format!("{}.example.internal", "n".repeat(60));
        let requester = Wiring {
            requester: true,
            warning: None,
        };
        let eviction_api = Wiring {
            requester: false,
            warning: None,
        };
        let warned = Wiring {
            warning: Some(WiringWarning::NodeNameNotALabel),
            ..eviction_api
        };
        for ((in_tree, node), want) in [
            ((true, "worker-1"), requester),
            ((false, "worker-1"), eviction_api),
            // A name longer than a label value: the Eviction API, said once.
            ((true, long.as_str()), warned),
            ((false, long.as_str()), eviction_api),
            ((true, &"n".repeat(63)), requester),
            ((true, &"n".repeat(64)), warned),
        ] {
            assert_eq!(
                Wiring::new(in_tree, node),
                want,
                "in-tree served: {in_tree}, node: {node}"
            );
        }
    }
}
