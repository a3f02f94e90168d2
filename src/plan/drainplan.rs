//! The KEP-4212 admission step for `spec.drainPlan`: default entries injected, canonical
//! order, duplicates rejected. Also the checks the CRD validation mirrors.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

use super::gns::PriorityGracePeriod;
use super::selector::{Selector, SelectorError};
use super::{DrainPlanEntry, PodType};

/// The priorities of the entries injected for each pod type: the highest user priority class,
/// `system-cluster-critical`, `system-node-critical` and the int32 maximum.
pub(crate) const DEFAULT_PLAN_PRIORITIES: [i32; 4] =
    [1_000_000_000, 2_000_000_000, 2_000_001_000, i32::MAX];

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error(
        "drainPlan[{index}] ({pod_type:?}, podPriority {priority}): invalid podSelector: {source}"
    )]
    InvalidSelector {
        index: usize,
        pod_type: PodType,
        priority: i32,
        source: SelectorError,
    },
    #[error("drainPlan[{first}] and drainPlan[{second}] are duplicates: {entry}")]
    Duplicate {
        first: usize,
        second: usize,
        entry: String,
    },
    #[error("drainPlan is not normalized: {0}")]
    NotNormalized(String),
}

/// A plan entry with its selector compiled. `selector` is None for "every pod of the type";
/// an empty `podSelector: {}` is the same thing and compiles to None.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CompiledEntry {
    pub pod_type: PodType,
    pub priority: i32,
    pub selector: Option<Selector>,
}

impl CompiledEntry {
    pub(crate) fn compile(
        index: usize,
        entry: &DrainPlanEntry,
    ) -> Result<CompiledEntry, PlanError> {
        let selector = match &entry.pod_selector {
            None => None,
            Some(s) => {
                let sel = Selector::compile(s).map_err(|source| PlanError::InvalidSelector {
                    index,
                    pod_type: entry.pod_type,
                    priority: entry.pod_priority,
                    source,
                })?;
                (!sel.is_everything()).then_some(sel)
            }
        };
        Ok(CompiledEntry {
            pod_type: entry.pod_type,
            priority: entry.pod_priority,
            selector,
        })
    }

    pub(crate) fn to_entry(&self) -> DrainPlanEntry {
        DrainPlanEntry {
            pod_selector: self.selector.as_ref().map(|s| s.label_selector().clone()),
            pod_priority: self.priority,
            pod_type: self.pod_type,
        }
    }

    /// The plan order: pod type, ascending priority, concrete selectors before plain entries,
    /// then selectors by their canonical form.
    pub(crate) fn plan_cmp(&self, other: &Self) -> Ordering {
        (self.pod_type, self.priority)
            .cmp(&(other.pod_type, other.priority))
            .then_with(|| match (&self.selector, &other.selector) {
                (Some(a), Some(b)) => a.cmp(b),
                (Some(_), None) => Ordering::Less,
                (None, Some(_)) => Ordering::Greater,
                (None, None) => Ordering::Equal,
            })
    }
}

impl fmt::Display for CompiledEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} pods with priority <= {}",
            self.pod_type, self.priority
        )?;
        if let Some(s) = &self.selector {
            write!(f, " matching {s}")?;
        }
        Ok(())
    }
}

impl fmt::Display for DrainPlanEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match CompiledEntry::compile(0, self) {
            Ok(c) => c.fmt(f),
            Err(_) => write!(
                f,
                "{:?} pods with priority <= {} matching <invalid selector>",
                self.pod_type, self.pod_priority
            ),
        }
    }
}

/// One entry of the shutdown drain plan as configured (KEP-4212 `DrainPlanEntry`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DrainPlanEntrySetting {
    pub pod_type: PodType,
    pub pod_priority: i32,
    /// `matchLabels` of the entry's `podSelector`; empty selects every pod.
    pub pod_selector: BTreeMap<String, String>,
}

/// What the shutdown drain plan is made of: `[drain] plan` and the fallback's bands
/// (`config::Settings` provides them; the plan stays free of the settings' other parts).
pub trait ShutdownPlanSettings {
    fn drain_plan(&self) -> &[DrainPlanEntrySetting];
    fn gns_bands(&self) -> &[PriorityGracePeriod];
}

impl From<&DrainPlanEntrySetting> for DrainPlanEntry {
    fn from(s: &DrainPlanEntrySetting) -> Self {
        DrainPlanEntry {
            pod_selector: (!s.pod_selector.is_empty()).then(|| LabelSelector {
                match_labels: Some(s.pod_selector.clone()),
                match_expressions: None,
            }),
            pod_priority: s.pod_priority,
            pod_type: s.pod_type,
        }
    }
}

/// The normalized drain plan of the shutdown maintenance: `[drain] plan` when it has
/// entries; otherwise the fallback's priority bands (KEP-4212 "kubelet: Graceful Node
/// Shutdown": the `shutdownGracePeriodByPodPriority` priorities passed to the drainPlan), so
/// one list of priorities orders both drains. A band holds the pods from its priority up to
/// the next band's: each band but the lowest ends the Default entry before it at its
/// priority - 1 (the highest band ends with the injected defaults).
pub fn shutdown_drain_plan(
    settings: &impl ShutdownPlanSettings,
) -> Result<Vec<DrainPlanEntry>, PlanError> {
    let entries: Vec<DrainPlanEntry> = if settings.drain_plan().is_empty() {
        let mut bands: Vec<i32> = settings.gns_bands().iter().map(|b| b.priority).collect();
        bands.sort_unstable();
        bands.dedup();
        bands
            .iter()
            .skip(1)
            .filter_map(|p| p.checked_sub(1))
            .map(|pod_priority| DrainPlanEntry {
                pod_selector: None,
                pod_priority,
                pod_type: PodType::Default,
            })
            .collect()
    } else {
        settings
            .drain_plan()
            .iter()
            .map(DrainPlanEntry::from)
            .collect()
    };
    normalize_drain_plan(&entries)
}

/// The 12 entries injected into every plan, in plan order.
pub(crate) fn default_plan_entries() -> Vec<DrainPlanEntry> {
    [PodType::Default, PodType::DaemonSet, PodType::Static]
        .into_iter()
        .flat_map(|pod_type| {
            DEFAULT_PLAN_PRIORITIES.map(|pod_priority| DrainPlanEntry {
                pod_selector: None,
                pod_priority,
                pod_type,
            })
        })
        .collect()
}

/// Compiles every entry, rejecting invalid selectors and duplicates (same type, priority and
/// selector, whatever its spelling).
pub(crate) fn compile_plan(entries: &[DrainPlanEntry]) -> Result<Vec<CompiledEntry>, PlanError> {
    let compiled = entries
        .iter()
        .enumerate()
        .map(|(i, e)| CompiledEntry::compile(i, e))
        .collect::<Result<Vec<_>, _>>()?;
    for (second, b) in compiled.iter().enumerate() {
        if let Some(first) = compiled[..second].iter().position(|a| a == b) {
            return Err(PlanError::Duplicate {
                first,
                second,
                entry: b.to_string(),
            });
        }
    }
    Ok(compiled)
}

/// The admission step: validates, injects the default entries that are missing and sorts.
/// Idempotent: normalizing a normalized plan returns it unchanged.
pub fn normalize_drain_plan(entries: &[DrainPlanEntry]) -> Result<Vec<DrainPlanEntry>, PlanError> {
    Ok(normalize_compiled(entries)?
        .iter()
        .map(CompiledEntry::to_entry)
        .collect())
}

pub(crate) fn normalize_compiled(
    entries: &[DrainPlanEntry],
) -> Result<Vec<CompiledEntry>, PlanError> {
    let mut plan = compile_plan(entries)?;
    for default in default_plan_entries() {
        let default = CompiledEntry::compile(0, &default)?;
        if !plan.contains(&default) {
            plan.push(default);
        }
    }
    plan.sort_by(CompiledEntry::plan_cmp);
    Ok(plan)
}

#[cfg(test)]
/// What the CRD validation enforces on a stored plan: it is exactly what normalization makes of
/// it (defaults present, ordered, no duplicates, valid selectors).
pub(crate) fn validate_drain_plan(entries: &[DrainPlanEntry]) -> Result<(), PlanError> {
    let given = compile_plan(entries)?;
    let normalized = normalize_compiled(entries)?;
    if let Some(missing) = normalized.iter().find(|e| !given.contains(e)) {
        return Err(PlanError::NotNormalized(format!(
            "missing default entry: {missing}"
        )));
    }
    if let Some(i) = (1..given.len()).find(|&i| given[i - 1].plan_cmp(&given[i]) != Ordering::Less)
    {
        return Err(PlanError::NotNormalized(format!(
            "drainPlan[{}] ({}) must come before drainPlan[{}] ({})",
            i,
            given[i],
            i - 1,
            given[i - 1]
        )));
    }
    Ok(())
}

#[cfg(test)]
/// True when `new` is a different plan from `old` (the spec field is immutable). Spelling
/// differences (selector order, an empty selector vs none, injected defaults) are not changes.
pub(crate) fn drain_plan_changed(old: &[DrainPlanEntry], new: &[DrainPlanEntry]) -> bool {
    match (normalize_compiled(old), normalize_compiled(new)) {
        (Ok(a), Ok(b)) => a != b,
        _ => old != new,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::testutil::{entry, sel_entry};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    #[test]
    fn empty_plan_becomes_the_twelve_defaults_in_order() {
        let plan = normalize_drain_plan(&[]).unwrap();
        assert_eq!(plan, default_plan_entries());
        let text: Vec<String> = plan
            .iter()
            .map(|e| format!("{:?}/{}", e.pod_type, e.pod_priority))
            .collect();
        assert_eq!(
            text,
            [
                "Default/1000000000",
                "Default/2000000000",
                "Default/2000001000",
                "Default/2147483647",
                "DaemonSet/1000000000",
                "DaemonSet/2000000000",
                "DaemonSet/2000001000",
                "DaemonSet/2147483647",
                "Static/1000000000",
                "Static/2000000000",
                "Static/2000001000",
                "Static/2147483647",
            ]
        );
    }

    #[test]
    fn user_entries_are_sorted_in_and_identical_defaults_not_repeated() {
        let user = vec![
            entry(PodType::Static, 5),
            entry(PodType::DaemonSet, 3000),
            entry(PodType::Default, 1_000_000_000),
            entry(PodType::Default, 2000),
            sel_entry(PodType::Default, 2000, "app", "postgres"),
        ];
        let plan = normalize_drain_plan(&user).unwrap();
        assert_eq!(plan.len(), 12 + 4);
        assert_eq!(
            plan[0],
            entry(PodType::Default, 2000).with_selector_of(&user[4])
        );
        assert_eq!(plan[1], entry(PodType::Default, 2000));
        assert_eq!(plan[2], entry(PodType::Default, 1_000_000_000));
        assert_eq!(plan[6], entry(PodType::DaemonSet, 3000));
        assert_eq!(plan[11], entry(PodType::Static, 5));
        assert_eq!(
            plan.iter()
                .filter(|e| **e == entry(PodType::Default, 1_000_000_000))
                .count(),
            1
        );
    }

    impl DrainPlanEntry {
        fn with_selector_of(mut self, other: &DrainPlanEntry) -> DrainPlanEntry {
            self.pod_selector = other.pod_selector.clone();
            self
        }
    }

    #[test]
    fn duplicates_are_rejected_naming_both() {
        let same_selector_other_spelling = DrainPlanEntry {
            pod_selector: Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "app".into(),
                    operator: "In".into(),
                    values: Some(vec!["db".into()]),
                }]),
            }),
            pod_priority: 10,
            pod_type: PodType::Default,
        };
        let err = normalize_drain_plan(&[
            sel_entry(PodType::Default, 10, "app", "db"),
            entry(PodType::Default, 10),
            same_selector_other_spelling,
        ])
        .unwrap_err();
        assert_eq!(
            err,
            PlanError::Duplicate {
                first: 0,
                second: 2,
                entry: "Default pods with priority <= 10 matching app=db".into()
            }
        );
        assert!(err.to_string().contains("drainPlan[0] and drainPlan[2]"));
        let err = normalize_drain_plan(&[entry(PodType::Static, 1), entry(PodType::Static, 1)])
            .unwrap_err();
        assert!(matches!(
            err,
            PlanError::Duplicate {
                first: 0,
                second: 1,
                ..
            }
        ));
    }

    #[test]
    fn empty_selector_is_a_plain_entry() {
        let with_empty = DrainPlanEntry {
            pod_selector: Some(LabelSelector::default()),
            ..entry(PodType::Default, 1_000_000_000)
        };
        let plan = normalize_drain_plan(std::slice::from_ref(&with_empty)).unwrap();
        assert_eq!(plan, default_plan_entries());
        assert!(
            normalize_drain_plan(&[with_empty, entry(PodType::Default, 1_000_000_000)]).is_err()
        );
    }

    #[test]
    fn invalid_selector_is_rejected_with_its_index() {
        let bad = DrainPlanEntry {
            pod_selector: Some(LabelSelector {
                match_labels: None,
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "app".into(),
                    operator: "Like".into(),
                    values: None,
                }]),
            }),
            ..entry(PodType::Default, 5)
        };
        let err = normalize_drain_plan(&[entry(PodType::Default, 1), bad]).unwrap_err();
        assert!(
            matches!(err, PlanError::InvalidSelector { index: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn validation_accepts_only_normalized_plans() {
        let normalized = normalize_drain_plan(&[entry(PodType::Default, 5)]).unwrap();
        validate_drain_plan(&normalized).unwrap();
        let err = validate_drain_plan(&[entry(PodType::Default, 5)]).unwrap_err();
        assert!(err.to_string().contains("missing default entry"), "{err}");
        let mut swapped = normalized.clone();
        swapped.swap(0, 1);
        let err = validate_drain_plan(&swapped).unwrap_err();
        assert!(err.to_string().contains("must come before"), "{err}");
    }

    #[test]
    fn shutdown_plan_comes_from_config() {
        let mut settings = crate::config::Settings::default();
        settings.drain.plan = vec![DrainPlanEntrySetting {
            pod_type: PodType::Default,
            pod_priority: 100,
            pod_selector: [("app".to_string(), "db".to_string())].into(),
        }];
        let plan = shutdown_drain_plan(&settings).unwrap();
        assert_eq!(plan.len(), 13);
        assert_eq!(plan[0], sel_entry(PodType::Default, 100, "app", "db"));
        settings.drain.plan[0]
            .pod_selector
            .insert("bad key!".into(), "x".into());
        assert!(matches!(
            shutdown_drain_plan(&settings),
            Err(PlanError::InvalidSelector { index: 0, .. })
        ));
    }

    #[test]
    fn without_a_drain_plan_the_shutdown_follows_the_fallback_bands() {
        use crate::config::PriorityGracePeriod;
        let band = |priority| PriorityGracePeriod {
            priority,
            shutdown_grace_period: std::time::Duration::from_secs(10),
        };
        let mut settings = crate::config::Settings::default();
        // The shipped simple form: priority 0 and 2000000000 (critical pods).
        let plan = shutdown_drain_plan(&settings).unwrap();
        let defaults: Vec<i32> = plan
            .iter()
            .filter(|e| e.pod_type == PodType::Default)
            .map(|e| e.pod_priority)
            .collect();
        assert_eq!(
            defaults,
            [
                1_000_000_000,
                1_999_999_999,
                2_000_000_000,
                2_000_001_000,
                i32::MAX
            ]
        );
        settings.fallback.shutdown_grace_period_by_pod_priority =
            vec![band(100_000), band(i32::MIN), band(1000), band(1000)];
        let plan = shutdown_drain_plan(&settings).unwrap();
        assert_eq!(plan[0], entry(PodType::Default, 999));
        assert_eq!(plan[1], entry(PodType::Default, 99_999));
        assert_eq!(plan.len(), 14);
    }

    #[test]
    fn plan_change_ignores_spelling_but_not_content() {
        let a = vec![sel_entry(PodType::Default, 5, "app", "db")];
        let normalized = normalize_drain_plan(&a).unwrap();
        assert!(!drain_plan_changed(&a, &normalized));
        assert!(drain_plan_changed(
            &a,
            &[sel_entry(PodType::Default, 6, "app", "db")]
        ));
        assert!(drain_plan_changed(
            &a,
            &[sel_entry(PodType::Default, 5, "app", "web")]
        ));
        assert!(drain_plan_changed(&a, &[]));
    }
}
