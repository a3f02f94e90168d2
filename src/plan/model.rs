//! A reference model of the whole cluster: every node's engine and every maintenance status
//! evaluated together until nothing changes. The node engine computes the same things for its
//! own node from the maintenances' statuses; this model is for tests and simulations (the KEP's
//! worked example is reproduced below).

use std::collections::BTreeMap;

use super::drainplan::{normalize_compiled, CompiledEntry, PlanError};
use super::targets::{
    maintenance_blockers, maintenance_message, node_message, node_targets, plan_position,
    reached_drain_targets, Blockers, DrainTargets, NodeProgress, NodeReport, NodeTargets,
};
use super::{DrainPlanEntry, PodInfo};

#[derive(Debug, Clone)]
struct Maintenance {
    name: String,
    plan: Vec<CompiledEntry>,
    nodes: Vec<String>,
}

/// What the statuses of a maintenance say after [`ClusterModel::settle`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MaintenanceView {
    pub index: usize,
    pub drained: bool,
    pub targets: DrainTargets,
    pub reached: DrainTargets,
    pub message: String,
}

/// What a node's status says after [`ClusterModel::settle`].
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct NodeView {
    pub targets: DrainTargets,
    pub holders: Vec<String>,
    pub message: String,
}

/// Every maintenance's and every node's view, by name.
pub(crate) type ClusterViews = (
    BTreeMap<String, MaintenanceView>,
    BTreeMap<String, NodeView>,
);

#[derive(Debug, Clone, Default)]
pub(crate) struct ClusterModel {
    /// Oldest first.
    maintenances: Vec<Maintenance>,
    pods: BTreeMap<String, Vec<PodInfo>>,
    reports: BTreeMap<(String, String), NodeReport>,
    nodes: BTreeMap<String, NodeTargets>,
}

impl ClusterModel {
    pub(crate) fn new() -> ClusterModel {
        ClusterModel::default()
    }

    /// Adds a maintenance (newer than every one added before) selecting `nodes`.
    pub(crate) fn add_maintenance(
        &mut self,
        name: &str,
        plan: &[DrainPlanEntry],
        nodes: &[&str],
    ) -> Result<(), PlanError> {
        self.maintenances.push(Maintenance {
            name: name.into(),
            plan: normalize_compiled(plan)?,
            nodes: nodes.iter().map(|n| n.to_string()).collect(),
        });
        Ok(())
    }

    pub(crate) fn set_pods(&mut self, node: &str, pods: Vec<PodInfo>) {
        self.pods.insert(node.into(), pods);
    }

    /// Pods on `node` that `pred` selects finish (are removed).
    pub(crate) fn finish_pods(&mut self, node: &str, pred: impl Fn(&PodInfo) -> bool) {
        if let Some(pods) = self.pods.get_mut(node) {
            pods.retain(|p| !pred(p));
        }
    }

    /// Finishes every pod the node currently targets.
    pub(crate) fn drain_node(&mut self, node: &str) {
        let targets = self
            .nodes
            .get(node)
            .map(|n| n.targets.clone())
            .unwrap_or_default();
        self.finish_pods(node, |p| targets.targets(p));
    }

    fn pods_of(&self, node: &str) -> &[PodInfo] {
        self.pods.get(node).map(Vec::as_slice).unwrap_or(&[])
    }

    fn position(&self, m: &Maintenance) -> super::targets::PlanPosition {
        let reports: Vec<Option<NodeReport>> = m
            .nodes
            .iter()
            .map(|n| self.reports.get(&(m.name.clone(), n.clone())).copied())
            .collect();
        plan_position(m.plan.len(), &reports)
    }

    fn maintenance_targets(&self) -> Result<Vec<DrainTargets>, PlanError> {
        self.maintenances
            .iter()
            .map(|m| {
                Ok(DrainTargets::for_compiled_plan(
                    &m.plan,
                    self.position(m).index,
                ))
            })
            .collect()
    }

    /// Runs every engine until nothing changes and returns what the statuses then say.
    pub(crate) fn settle(&mut self) -> Result<ClusterViews, PlanError> {
        for _ in 0..10_000 {
            let targets = self.maintenance_targets()?;
            let mut changed = false;
            let node_names: Vec<String> = self
                .maintenances
                .iter()
                .flat_map(|m| m.nodes.iter().cloned())
                .collect();
            for node in &node_names {
                let on_node: Vec<(&str, &DrainTargets)> = self
                    .maintenances
                    .iter()
                    .zip(&targets)
                    .filter(|(m, _)| m.nodes.contains(node))
                    .map(|(m, t)| (m.name.as_str(), t))
                    .collect();
                let previous = self.nodes.get(node).map(|n| &n.targets);
                let next = node_targets(previous, &on_node);
                if self.nodes.get(node) != Some(&next) {
                    self.nodes.insert(node.clone(), next);
                    changed = true;
                }
            }
            for (m, t) in self.maintenances.iter().zip(&targets) {
                let index = self.position(m).index;
                for node in &m.nodes {
                    let report = NodeReport {
                        index,
                        finished: t.is_finished(self.pods_of(node)),
                    };
                    let key = (m.name.clone(), node.clone());
                    if self.reports.get(&key) != Some(&report) {
                        self.reports.insert(key, report);
                        changed = true;
                    }
                }
            }
            if !changed {
                return self.views(&targets);
            }
        }
        Err(PlanError::NotNormalized(
            "cluster model did not settle".into(),
        ))
    }

    fn views(&self, targets: &[DrainTargets]) -> Result<ClusterViews, PlanError> {
        let empty = NodeTargets {
            targets: DrainTargets::none(),
            holders: Vec::new(),
        };
        let draining = |node: &str| {
            let n = self.nodes.get(node).unwrap_or(&empty);
            n.targets
                .active_targeted(self.pods_of(node))
                .next()
                .is_some()
        };
        let mut blockers: BTreeMap<String, Blockers> = BTreeMap::new();
        let mut maintenances = BTreeMap::new();
        for (age, (m, t)) in self.maintenances.iter().zip(targets).enumerate() {
            let pos = self.position(m);
            let progress: Vec<NodeProgress<'_>> = m
                .nodes
                .iter()
                .map(|node| {
                    let n = self.nodes.get(node).unwrap_or(&empty);
                    NodeProgress {
                        targets: &n.targets,
                        finished: self
                            .reports
                            .get(&(m.name.clone(), node.clone()))
                            .is_some_and(|r| r.finished),
                        draining: draining(node),
                        holders: &n.holders,
                    }
                })
                .collect();
            let b = maintenance_blockers(t, pos.index + 1 >= m.plan.len(), &progress);
            let older: Vec<&str> = self.maintenances[..age]
                .iter()
                .map(|o| o.name.as_str())
                .collect();
            maintenances.insert(
                m.name.clone(),
                MaintenanceView {
                    index: pos.index,
                    drained: pos.drained,
                    targets: t.clone(),
                    reached: reached_drain_targets(progress.iter().map(|p| p.targets)),
                    message: maintenance_message(&m.name, &b, &older),
                },
            );
            blockers.insert(m.name.clone(), b);
        }
        let mut nodes = BTreeMap::new();
        for (node, n) in &self.nodes {
            let oldest = self
                .maintenances
                .iter()
                .zip(targets)
                .find(|(m, _)| m.nodes.contains(node))
                .map(|(_, t)| t);
            let holder_blockers: Vec<(&str, &Blockers)> = n
                .holders
                .iter()
                .filter_map(|h| blockers.get(h).map(|b| (h.as_str(), b)))
                .collect();
            nodes.insert(
                node.clone(),
                NodeView {
                    targets: n.targets.clone(),
                    holders: n.holders.clone(),
                    message: node_message(n, draining(node), oldest, &holder_blockers),
                },
            );
        }
        Ok((maintenances, nodes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::testutil::{entry, pod};
    use crate::plan::PodType::{self, DaemonSet, Default};

    fn default_at(p: i32) -> DrainTargets {
        DrainTargets::from_entries(&[entry(Default, p)]).unwrap()
    }

    fn check(
        views: &(
            BTreeMap<String, MaintenanceView>,
            BTreeMap<String, NodeView>,
        ),
        maint: &[(&str, i32, &str)],
        nodes: &[(&str, i32, &str)],
    ) {
        for (name, reached, message) in maint {
            let m = &views.0[*name];
            assert_eq!(
                m.reached,
                default_at(*reached),
                "{name} reachedDrainTargets: {:?}",
                m.reached.to_entries()
            );
            assert_eq!(m.message, *message, "{name} drainMessage");
        }
        for (name, target, message) in nodes {
            let n = &views.1[*name];
            assert_eq!(
                n.targets,
                default_at(*target),
                "node {name} drainTargets: {:?}",
                n.targets.to_entries()
            );
            assert_eq!(n.message, *message, "node {name} drainMessage");
        }
    }

    fn pods(list: &[(&str, PodType, i32)]) -> Vec<PodInfo> {
        list.iter().map(|(n, t, p)| pod(n, *t, *p)).collect()
    }

    /// KEP-4212 "Pod Selection and DrainTargets Example", snapshot by snapshot.
    #[test]
    fn kep_worked_example() {
        let mut c = ClusterModel::new();
        c.set_pods(
            "one",
            pods(&[
                ("one-1000", Default, 1000),
                ("one-7000", Default, 7000),
                ("one-12000", Default, 12000),
                ("one-ds", DaemonSet, 1000),
            ]),
        );
        c.set_pods(
            "two",
            pods(&[("two-3000", Default, 3000), ("two-12000", Default, 12000)]),
        );
        c.set_pods(
            "three",
            pods(&[
                ("three-8000", Default, 8000),
                ("three-12000", Default, 12000),
            ]),
        );
        c.set_pods(
            "four",
            pods(&[("four-1000", Default, 1000), ("four-12000", Default, 12000)]),
        );
        c.add_maintenance(
            "maintenance-a",
            &[
                entry(Default, 5000),
                entry(Default, 15000),
                entry(DaemonSet, 3000),
            ],
            &["one", "two"],
        )
        .unwrap();
        c.add_maintenance(
            "maintenance-b",
            &[
                entry(Default, 10000),
                entry(Default, 15000),
                entry(DaemonSet, 4000),
            ],
            &["one", "three"],
        )
        .unwrap();

        let v = c.settle().unwrap();
        check(
            &v,
            &[
                ("maintenance-a", 5000, "Draining"),
                ("maintenance-b", 5000, "Draining (limited by maintenance-a)"),
            ],
            &[
                ("one", 5000, "Draining"),
                ("two", 5000, "Draining"),
                ("three", 10000, "Draining"),
            ],
        );

        // Node three is drained: it has to wait for node one, which maintenance-a holds.
        c.drain_node("three");
        let v = c.settle().unwrap();
        check(
            &v,
            &[("maintenance-b", 5000, "Draining (limited by maintenance-a)")],
            &[("three", 10000, "Waiting for maintenance-a.")],
        );

        // Node one is drained: still waiting for maintenance-a to drain node two.
        c.drain_node("one");
        let v = c.settle().unwrap();
        check(
            &v,
            &[
                ("maintenance-a", 5000, "Draining"),
                ("maintenance-b", 5000, "Waiting for maintenance-a."),
            ],
            &[
                ("one", 5000, "Waiting for maintenance-a."),
                ("two", 5000, "Draining"),
                ("three", 10000, "Waiting for maintenance-a."),
            ],
        );

        // Node two drains: maintenance-a advances to 15000; node one is held by maintenance-b.
        c.drain_node("two");
        let v = c.settle().unwrap();
        check(
            &v,
            &[
                ("maintenance-a", 10000, "Draining"),
                ("maintenance-b", 10000, "Draining"),
            ],
            &[
                ("one", 10000, "Draining (limited by maintenance-b)"),
                ("two", 15000, "Draining"),
                ("three", 10000, "Waiting for maintenance-b."),
            ],
        );
        assert_eq!(v.0["maintenance-a"].targets, default_at(15000));
        assert_eq!(v.0["maintenance-b"].targets, default_at(10000));

        // maintenance-c selects one and four: node one does not backtrack.
        c.add_maintenance(
            "maintenance-c",
            &[entry(Default, 2000), entry(Default, 15000)],
            &["one", "four"],
        )
        .unwrap();
        let v = c.settle().unwrap();
        check(
            &v,
            &[("maintenance-c", 2000, "Draining")],
            &[
                (
                    "one",
                    10000,
                    "Draining (limited by maintenance-b, maintenance-c)",
                ),
                ("four", 2000, "Draining"),
            ],
        );

        // Carry on to the end: every node is drained of every pod, DaemonSet pods last.
        let mut rounds = 0;
        loop {
            let v = c.settle().unwrap();
            if v.0.values().all(|m| m.drained) {
                assert!(v.1.values().all(|n| n.message == "Drained"), "{:?}", v.1);
                assert!(v.0.values().all(|m| m.message == "Drained"), "{:?}", v.0);
                break;
            }
            for node in ["one", "two", "three", "four"] {
                c.drain_node(node);
            }
            rounds += 1;
            assert!(rounds < 20, "the example never finishes");
        }
        assert!(c.pods.values().all(Vec::is_empty));
    }

    #[test]
    fn incomparable_selector_targets_do_not_deadlock() {
        // db-first wants app=db pods up to 100 gone first; low-first every pod up to 50. The
        // exact intersection (app=db up to 50) targets neither pod and both would wait forever.
        use crate::plan::testutil::{pod_l, sel_entry};
        let mut c = ClusterModel::new();
        c.set_pods(
            "n",
            vec![
                pod_l("db", Default, 80, "app", "db"),
                pod("other", Default, 30),
            ],
        );
        c.add_maintenance("db-first", &[sel_entry(Default, 100, "app", "db")], &["n"])
            .unwrap();
        c.add_maintenance("low-first", &[entry(Default, 50)], &["n"])
            .unwrap();
        let (_, nodes) = c.settle().unwrap();
        // db-first targets no plain Default pods yet, so it is the least powerful.
        assert_eq!(nodes["n"].holders, ["db-first"]);
        assert!(nodes["n"]
            .targets
            .targets(&pod_l("db", Default, 80, "app", "db")));
        assert!(!nodes["n"].targets.targets(&pod("other", Default, 30)));
        assert_eq!(nodes["n"].message, "Draining");
        for _ in 0..20 {
            c.drain_node("n");
            c.settle().unwrap();
        }
        let (maint, nodes) = c.settle().unwrap();
        assert!(maint.values().all(|m| m.drained), "{maint:?}");
        assert_eq!(nodes["n"].message, "Drained");
    }

    #[test]
    fn daemonset_pods_wait_for_every_default_pod() {
        let mut c = ClusterModel::new();
        c.set_pods(
            "n",
            pods(&[("web", Default, 2_000_000_000), ("ds", DaemonSet, 0)]),
        );
        c.add_maintenance("m", &[], &["n"]).unwrap();
        let v = c.settle().unwrap();
        assert!(v.1["n"]
            .targets
            .targets(&pod("web", Default, 2_000_000_000)));
        assert!(!v.1["n"].targets.targets(&pod("ds", DaemonSet, 0)));
        c.drain_node("n");
        let v = c.settle().unwrap();
        assert!(v.1["n"].targets.targets(&pod("ds", DaemonSet, 0)));
        assert_eq!(v.1["n"].message, "Draining");
    }
}
