//! What the daemon starts once it has reached the apiserver: the eviction path and everything
//! that follows from it, decided once from what discovery found, the node's name and the
//! settings. `daemon/node.rs::connect_engine` only carries it out. No I/O.

/// What discovery found.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Served {
    /// `lifecycle.k8s.io/v1alpha1` evictionrequests and evictions.
    pub in_tree: bool,
    /// `lifecycle.nodegrace.dev/v1alpha1` evictionrequests and evictions.
    pub lifecycle_crds: bool,
}

/// The group of EvictionRequests and Evictions nodegrace's requester writes and watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LifecycleGroup {
    /// `lifecycle.k8s.io`, the cluster's own API.
    InTree,
    /// `lifecycle.nodegrace.dev`, nodegrace's CRDs of the same shapes.
    Nodegrace,
}

/// nodegrace as a requester: it asks pods that declare responders to leave through
/// EvictionRequests of `group`, and watches how their Evictions go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Requester {
    pub group: LifecycleGroup,
    /// nodegrace itself is the eviction-request controller and imperative evictor of `group`
    /// for its node's pods: it starts that controller, and the requester's watch leaves the
    /// evictor's refusals to it to count (where the evictions are sent).
    pub own_controller: bool,
}

/// A warning to log once at connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WiringWarning {
    /// An EvictionRequest API is served but the node's name cannot be a label value.
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
    /// None: pods are evicted through the Eviction API directly and no watch runs.
    pub requester: Option<Requester>,
    /// The in-tree API is used while nodegrace's CRDs are served too: this node's requests
    /// there are withdrawn, since nothing follows them any more.
    pub withdraw_from_crds: bool,
    pub warning: Option<WiringWarning>,
}

impl Wiring {
    /// `external_controller` is `drain.external_eviction_request_controller`: another
    /// eviction-request controller serves nodegrace's CRDs.
    pub(crate) fn new(served: Served, node: &str, external_controller: bool) -> Wiring {
        let labelled = super::own::node_label_value(node).is_some();
        // The in-tree API first (what workloads written for 1.37 respond to), then nodegrace's
        // CRDs of the same shapes, then the Eviction API. Every request nodegrace writes
        // carries the node label, which the packaged admission policy matches against the
        // writer's node: a node whose name is no label value takes the Eviction API.
        let group = match (labelled, served.in_tree, served.lifecycle_crds) {
            (false, _, _) | (true, false, false) => None,
            (true, true, _) => Some(LifecycleGroup::InTree),
            (true, false, true) => Some(LifecycleGroup::Nodegrace),
        };
        let requester = group.map(|group| Requester {
            group,
            own_controller: group == LifecycleGroup::Nodegrace && !external_controller,
        });
        let api_served = served.in_tree || served.lifecycle_crds;
        Wiring {
            requester,
            withdraw_from_crds: group == Some(LifecycleGroup::InTree) && served.lifecycle_crds,
            warning: (!labelled && api_served).then_some(WiringWarning::NodeNameNotALabel),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use LifecycleGroup::*;

    const SHORT: &str = "worker-1";

    fn long() -> String {
        format!("{}.example.internal", "n".repeat(60))
    }

    fn served(in_tree: bool, lifecycle_crds: bool) -> Served {
        Served {
            in_tree,
            lifecycle_crds,
        }
    }

    fn wired(group: Option<LifecycleGroup>, own_controller: bool, withdraw: bool) -> Wiring {
        Wiring {
            requester: group.map(|group| Requester {
                group,
                own_controller,
            }),
            withdraw_from_crds: withdraw,
            warning: None,
        }
    }

    /// Every combination of the inputs, each with what the daemon starts.
    #[test]
    fn each_combination_of_apis_node_name_and_controller_setting_is_wired_as_an_operator_expects() {
        let long = long();
        let in_tree = wired(Some(InTree), false, false);
        let in_tree_withdrawing = wired(Some(InTree), false, true);
        let crds_own_controller = wired(Some(Nodegrace), true, false);
        let crds_external_controller = wired(Some(Nodegrace), false, false);
        let eviction_api = wired(None, false, false);
        let eviction_api_warned = Wiring {
            warning: Some(WiringWarning::NodeNameNotALabel),
            ..eviction_api
        };
        // (in-tree API served, nodegrace's CRDs served, node, external controller set)
        let table = [
            // Both served: the in-tree API, and what was asked on the CRDs is withdrawn.
            ((true, true, SHORT, false), in_tree_withdrawing),
            ((true, true, SHORT, true), in_tree_withdrawing),
            // Only the in-tree API: the external controller setting is about the CRDs only.
            ((true, false, SHORT, false), in_tree),
            ((true, false, SHORT, true), in_tree),
            // Only the CRDs: nodegrace is their controller unless an external one is set.
            ((false, true, SHORT, false), crds_own_controller),
            ((false, true, SHORT, true), crds_external_controller),
            // Neither: the Eviction API, and nothing is given up to warn about.
            ((false, false, SHORT, false), eviction_api),
            ((false, false, SHORT, true), eviction_api),
            // A name longer than a label value: the Eviction API wherever a requester would
            // have been, said once; nothing is withdrawn (the in-tree API is not used).
            ((true, true, &long, false), eviction_api_warned),
            ((true, true, &long, true), eviction_api_warned),
            ((true, false, &long, false), eviction_api_warned),
            ((true, false, &long, true), eviction_api_warned),
            ((false, true, &long, false), eviction_api_warned),
            ((false, true, &long, true), eviction_api_warned),
            ((false, false, &long, false), eviction_api),
            ((false, false, &long, true), eviction_api),
        ];
        for ((in_tree, crds, node, external), want) in table {
            assert_eq!(
                Wiring::new(served(in_tree, crds), node, external),
                want,
                "in-tree served: {in_tree}, CRDs served: {crds}, node: {node}, external controller: {external}"
            );
        }
    }

    #[test]
    fn a_name_of_exactly_63_characters_is_still_a_label() {
        let crds = served(false, true);
        assert_eq!(
            Wiring::new(crds, &"n".repeat(63), false),
            wired(Some(Nodegrace), true, false)
        );
        let over = Wiring::new(crds, &"n".repeat(64), false);
        assert_eq!(over.requester, None);
        assert_eq!(over.warning, Some(WiringWarning::NodeNameNotALabel));
    }
}
