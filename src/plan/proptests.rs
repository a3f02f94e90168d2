//! Properties of normalization and drain targets over generated plans, pods and maintenances.

use std::cmp::Ordering;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use proptest::prelude::*;

use super::drainplan::{
    compile_plan, default_plan_entries, normalize_drain_plan, validate_drain_plan, CompiledEntry,
    PlanError,
};
use super::model::ClusterModel;
use super::targets::{node_targets, DrainTargets};
use super::testutil::pod;
use super::{DrainPlanEntry, PodInfo, PodType};

fn req(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
    LabelSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| v.to_string()).collect()),
    }
}

fn arb_selector() -> impl Strategy<Value = Option<LabelSelector>> {
    prop_oneof![
        3 => Just(None),
        1 => Just(Some(LabelSelector::default())),
        1 => Just(Some(LabelSelector { match_labels: Some([("app".to_string(), "db".to_string())].into()), match_expressions: None })),
        1 => Just(Some(LabelSelector { match_labels: None, match_expressions: Some(vec![req("app", "In", &["db"])]) })),
        1 => Just(Some(LabelSelector { match_labels: None, match_expressions: Some(vec![req("app", "In", &["web", "db"])]) })),
        1 => Just(Some(LabelSelector { match_labels: None, match_expressions: Some(vec![req("tier", "Exists", &[])]) })),
        1 => Just(Some(LabelSelector { match_labels: None, match_expressions: Some(vec![req("app", "NotIn", &["web"]), req("tier", "DoesNotExist", &[])]) })),
    ]
}

fn arb_type() -> impl Strategy<Value = PodType> {
    prop_oneof![
        Just(PodType::Default),
        Just(PodType::DaemonSet),
        Just(PodType::Static)
    ]
}

fn arb_priority() -> impl Strategy<Value = i32> {
    prop_oneof![
        Just(0),
        Just(1000),
        Just(5000),
        Just(1_000_000_000),
        Just(2_000_000_000),
        Just(2_000_001_000),
        Just(i32::MAX),
        -100i32..20_000,
    ]
}

fn arb_entry() -> impl Strategy<Value = DrainPlanEntry> {
    (arb_type(), arb_priority(), arb_selector()).prop_map(
        |(pod_type, pod_priority, pod_selector)| DrainPlanEntry {
            pod_selector,
            pod_priority,
            pod_type,
        },
    )
}

/// A valid user plan: generated entries with duplicates removed.
fn arb_plan() -> impl Strategy<Value = Vec<DrainPlanEntry>> {
    proptest::collection::vec(arb_entry(), 0..6).prop_map(|entries| {
        let mut kept: Vec<DrainPlanEntry> = Vec::new();
        let mut seen: Vec<CompiledEntry> = Vec::new();
        for (i, e) in entries.into_iter().enumerate() {
            let c = CompiledEntry::compile(i, &e).expect("generated selectors are valid");
            if !seen.contains(&c) {
                seen.push(c);
                kept.push(e);
            }
        }
        kept
    })
}

fn arb_pod() -> impl Strategy<Value = PodInfo> {
    (
        arb_type(),
        arb_priority(),
        prop_oneof![Just(None), Just(Some("db")), Just(Some("web"))],
        any::<bool>(),
    )
        .prop_map(|(t, p, app, tier)| {
            let mut pd = pod("p", t, p);
            if let Some(app) = app {
                pd.labels.insert("app".into(), app.into());
            }
            if tier {
                pd.labels.insert("tier".into(), "x".into());
            }
            pd
        })
}

/// A maintenance's current targets: a normalized plan at some entry.
fn arb_maintenance_targets() -> impl Strategy<Value = DrainTargets> {
    (arb_plan(), 0usize..20).prop_map(|(plan, i)| {
        let plan = normalize_drain_plan(&plan).expect("valid plan");
        DrainTargets::for_plan(&plan, i).expect("valid plan")
    })
}

/// Targets of plans without selectors: these always form a chain.
fn arb_plain_maintenance_targets() -> impl Strategy<Value = DrainTargets> {
    (
        proptest::collection::btree_set((arb_type(), arb_priority()), 0..5),
        0usize..20,
    )
        .prop_map(|(entries, i)| {
            let plan: Vec<DrainPlanEntry> = entries
                .into_iter()
                .map(|(pod_type, pod_priority)| DrainPlanEntry {
                    pod_selector: None,
                    pod_priority,
                    pod_type,
                })
                .collect();
            let plan = normalize_drain_plan(&plan).expect("valid plan");
            DrainTargets::for_plan(&plan, i).expect("valid plan")
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn normalization_is_idempotent_sorted_unique_and_has_defaults(entries in proptest::collection::vec(arb_entry(), 0..8)) {
        let has_duplicate = {
            let c: Vec<CompiledEntry> = entries.iter().enumerate().map(|(i, e)| CompiledEntry::compile(i, e).unwrap()).collect();
            (0..c.len()).any(|j| c[..j].contains(&c[j]))
        };
        match normalize_drain_plan(&entries) {
            Err(PlanError::Duplicate { first, second, .. }) => {
                prop_assert!(has_duplicate);
                prop_assert!(first < second);
            }
            Err(e) => prop_assert!(false, "unexpected error {e}"),
            Ok(plan) => {
                prop_assert!(!has_duplicate);
                prop_assert_eq!(normalize_drain_plan(&plan).unwrap(), plan.clone());
                prop_assert!(validate_drain_plan(&plan).is_ok());
                let c = compile_plan(&plan).unwrap();
                prop_assert!(c.windows(2).all(|w| w[0].plan_cmp(&w[1]) == Ordering::Less));
                for d in default_plan_entries().iter().chain(&entries) {
                    let d = CompiledEntry::compile(0, d).unwrap();
                    prop_assert!(c.contains(&d), "{} missing", d);
                }
                prop_assert!(c.len() <= 12 + entries.len());
            }
        }
    }

    #[test]
    fn plan_steps_put_each_pod_at_the_first_entry_that_targets_it(plan in arb_plan(), pods in proptest::collection::vec(arb_pod(), 0..12)) {
        let steps = super::plan_steps(&plan, &pods).expect("a valid plan");
        let compiled = compile_plan(&plan).expect("a valid plan");
        let mut previous = DrainTargets::none();
        for (index, step) in steps.iter().enumerate() {
            let targets = DrainTargets::for_compiled_plan(&compiled, index);
            let expected: Vec<&PodInfo> = targets
                .active_targeted(&pods)
                .filter(|p| !previous.targets(p))
                .collect();
            prop_assert_eq!(step.pods.iter().collect::<Vec<_>>(), expected);
            previous = targets;
        }
    }

    #[test]
    fn later_plan_entries_keep_earlier_targets(plan in arb_plan(), pods in proptest::collection::vec(arb_pod(), 0..10)) {
        let plan = normalize_drain_plan(&plan).unwrap();
        let mut previous = DrainTargets::none();
        for i in 0..plan.len() {
            let t = DrainTargets::for_plan(&plan, i).unwrap();
            prop_assert!(t.covers(&previous));
            for p in &pods {
                prop_assert!(!previous.targets(p) || t.targets(p));
            }
            previous = t;
        }
        // The whole plan targets every pod.
        prop_assert!(pods.iter().all(|p| previous.targets(p)));
    }

    #[test]
    fn node_targets_never_backtrack(
        rounds in proptest::collection::vec(proptest::collection::vec(arb_maintenance_targets(), 0..4), 1..6),
        pods in proptest::collection::vec(arb_pod(), 1..10),
    ) {
        let mut previous: Option<DrainTargets> = None;
        for maintenances in rounds {
            let named: Vec<(String, DrainTargets)> = maintenances.into_iter().enumerate().map(|(i, t)| (format!("m{i}"), t)).collect();
            let refs: Vec<(&str, &DrainTargets)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
            let next = node_targets(previous.as_ref(), &refs);
            if let Some(prev) = &previous {
                prop_assert!(next.targets.covers(prev));
                for p in &pods {
                    prop_assert!(!prev.targets(p) || next.targets.targets(p), "{:?} no longer targeted", p);
                }
            }
            // With selectors, incomparable maintenances would deadlock under a strict
            // intersection, so the node takes one maintenance's targets whole (see
            // `node_targets`); the strict rule for selector-free plans is the next property.
            for p in &pods {
                if next.targets.targets(p) {
                    let by_some = refs.iter().any(|(_, t)| t.targets(p));
                    let by_previous = previous.as_ref().is_some_and(|prev| prev.targets(p));
                    prop_assert!(by_some || by_previous || refs.is_empty());
                }
            }
            for (n, t) in &refs {
                prop_assert_eq!(next.holders.iter().any(|h| h == n), next.targets.covers(t));
            }
            // Never less than what every maintenance targets, and someone always holds the node.
            let exact_intersection_pods = pods.iter().filter(|p| refs.iter().all(|(_, t)| t.targets(p)));
            for p in exact_intersection_pods {
                prop_assert!(refs.is_empty() || next.targets.targets(p));
            }
            prop_assert!(refs.is_empty() || !next.holders.is_empty());
            previous = Some(next.targets);
        }
    }

    #[test]
    fn effective_targets_only_target_what_every_maintenance_targets(
        maintenances in proptest::collection::vec(arb_plain_maintenance_targets(), 1..4),
        pods in proptest::collection::vec(arb_pod(), 1..12),
        previous in proptest::option::of(arb_plain_maintenance_targets()),
    ) {
        let named: Vec<(String, DrainTargets)> = maintenances.into_iter().enumerate().map(|(i, t)| (format!("m{i}"), t)).collect();
        let refs: Vec<(&str, &DrainTargets)> = named.iter().map(|(n, t)| (n.as_str(), t)).collect();
        let effective = node_targets(previous.as_ref(), &refs).targets;
        for p in &pods {
            if effective.targets(p) {
                let by_previous = previous.as_ref().is_some_and(|prev| prev.targets(p));
                prop_assert!(by_previous || refs.iter().all(|(_, t)| t.targets(p)));
            }
        }
        if previous.is_none() {
            prop_assert!(refs.iter().all(|(_, t)| t.covers(&effective)));
        }
        // The status form reads back to the same targets.
        prop_assert_eq!(DrainTargets::from_entries(&effective.to_entries()).unwrap(), effective);
    }
}

proptest! {
    // Each case settles a whole cluster dozens of times.
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn cluster_model_never_backtracks_and_finishes(
        plans in proptest::collection::vec((arb_plan(), proptest::collection::btree_set(0usize..3, 1..3)), 1..4),
        pods in proptest::collection::vec((0usize..3, arb_pod()), 0..15),
        drains in proptest::collection::vec(0usize..3, 0..30),
    ) {
        let nodes = ["n0", "n1", "n2"];
        let mut c = ClusterModel::new();
        for (n, node) in nodes.iter().enumerate() {
            let on: Vec<PodInfo> = pods.iter().enumerate().filter(|(_, (pn, _))| *pn == n).map(|(i, (_, p))| {
                let mut p = p.clone();
                p.name = format!("p{i}");
                p
            }).collect();
            c.set_pods(node, on);
        }
        let mut seen: std::collections::BTreeMap<String, DrainTargets> = Default::default();
        let mut check = |c: &mut ClusterModel| -> Result<(), TestCaseError> {
            let (_, views) = c.settle().map_err(|e| TestCaseError::fail(e.to_string()))?;
            for (n, v) in views {
                if let Some(prev) = seen.get(&n) {
                    prop_assert!(v.targets.covers(prev), "node {} backtracked", n);
                }
                seen.insert(n, v.targets);
            }
            Ok(())
        };
        // Maintenances arrive one by one while nodes drain.
        for (i, (plan, sel)) in plans.iter().enumerate() {
            let selected: Vec<&str> = sel.iter().map(|&n| nodes[n]).collect();
            c.add_maintenance(&format!("m{i}"), plan, &selected).unwrap();
            check(&mut c)?;
            for &d in drains.iter().skip(i * 3).take(3) {
                c.drain_node(nodes[d]);
                check(&mut c)?;
            }
        }
        for _ in 0..40 {
            for n in nodes {
                c.drain_node(n);
            }
            check(&mut c)?;
        }
        let (maints, views) = c.settle().unwrap();
        prop_assert!(maints.values().all(|m| m.drained && m.message == "Drained"), "{:?}", maints);
        prop_assert!(views.values().all(|v| v.message == "Drained"), "{:?}", views);
    }
}
