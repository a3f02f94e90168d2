//! Builders shared by the plan tests.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::{DrainPlanEntry, PodInfo, PodType};

pub(crate) fn entry(pod_type: PodType, prio: i32) -> DrainPlanEntry {
    DrainPlanEntry {
        pod_selector: None,
        pod_priority: prio,
        pod_type,
    }
}

pub(crate) fn sel_entry(pod_type: PodType, prio: i32, k: &str, v: &str) -> DrainPlanEntry {
    DrainPlanEntry {
        pod_selector: Some(LabelSelector {
            match_labels: Some([(k.to_string(), v.to_string())].into()),
            match_expressions: None,
        }),
        pod_priority: prio,
        pod_type,
    }
}

pub(crate) fn pod(name: &str, pod_type: PodType, priority: i32) -> PodInfo {
    PodInfo {
        namespace: "ns".into(),
        name: name.into(),
        uid: format!("uid-{name}"),
        priority,
        pod_type,
        termination_grace_period_seconds: 30,
        labels: Default::default(),
        terminating: false,
        terminal: false,
        static_hash: None,
    }
}

pub(crate) fn pod_l(name: &str, pod_type: PodType, priority: i32, k: &str, v: &str) -> PodInfo {
    let mut p = pod(name, pod_type, priority);
    p.labels.insert(k.into(), v.into());
    p
}
