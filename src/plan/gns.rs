//! The kubelet's Graceful Node Shutdown by pod priority (KEP-2000,
//! `shutdownGracePeriodByPodPriority`), for the offline fallback. Same rules as the kubelet's
//! shutdown manager:
//! - bands sorted by ascending priority; a pod goes to the band with the highest priority at or
//!   below its own, pods below every band go to the lowest band (a pod without a priority has 0);
//! - per-pod grace = min(band grace, pod's `terminationGracePeriodSeconds`);
//! - bands run in ascending priority; a band ends when its pods are gone or its grace period is
//!   up, whichever is first; a band with no pods is skipped without waiting.
//!
//! Pods the local cache does not know go to the lowest band with the band's grace.

use std::time::Duration;

use super::PodInfo;

/// One band of the kubelet's `shutdownGracePeriodByPodPriority`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PriorityGracePeriod {
    pub priority: i32,
    pub shutdown_grace_period: Duration,
}

#[cfg(test)]
/// `system-cluster-critical`, the kubelet's critical band for the simple configuration form.
pub(crate) const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GnsError {
    #[error("shutdown_grace_period_by_pod_priority is empty")]
    NoBands,
    #[error("shutdown_grace_period_by_pod_priority lists priority {0} twice")]
    DuplicatePriority(i32),
    #[cfg(test)]
    #[error("shutdown_grace_period_critical_pods ({critical:?}) exceeds shutdown_grace_period ({total:?})")]
    CriticalExceedsTotal { total: Duration, critical: Duration },
}

/// Validated bands in ascending priority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GnsBands {
    bands: Vec<PriorityGracePeriod>,
}

/// What the fallback knows of one pod it must stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GnsCandidate<T> {
    pub item: T,
    /// None: unknown to the pod cache; goes to the lowest band.
    pub priority: Option<i32>,
    /// None: unknown; the band's grace applies.
    pub grace: Option<Duration>,
}

impl<T> GnsCandidate<T> {
    pub fn known(item: T, pod: &PodInfo) -> GnsCandidate<T> {
        GnsCandidate {
            item,
            priority: Some(pod.priority),
            grace: Some(pod.grace_period()),
        }
    }

    #[cfg(test)]
    pub fn unknown(item: T) -> GnsCandidate<T> {
        GnsCandidate {
            item,
            priority: None,
            grace: None,
        }
    }
}

/// One pod in its band, with the grace period to stop it with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GnsMember<T> {
    pub item: T,
    pub grace: Duration,
}

/// One band of the shutdown, in execution order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GnsGroup<T> {
    pub priority: i32,
    /// How long the band may take before the next one starts.
    pub shutdown_grace_period: Duration,
    pub members: Vec<GnsMember<T>>,
}

impl GnsBands {
    /// Sorts the bands by priority; rejects an empty list and duplicate priorities (the kubelet
    /// would silently put pods of a duplicated priority in one band and pods above it in the
    /// other).
    pub fn new(bands: &[PriorityGracePeriod]) -> Result<GnsBands, GnsError> {
        if bands.is_empty() {
            return Err(GnsError::NoBands);
        }
        let mut bands = bands.to_vec();
        bands.sort_by_key(|b| b.priority);
        if let Some(w) = bands.windows(2).find(|w| w[0].priority == w[1].priority) {
            return Err(GnsError::DuplicatePriority(w[0].priority));
        }
        Ok(GnsBands { bands })
    }

    /// One band that stops every pod at once: what is left when no valid bands are configured.
    pub fn immediate() -> GnsBands {
        GnsBands {
            bands: vec![PriorityGracePeriod {
                priority: 0,
                shutdown_grace_period: Duration::ZERO,
            }],
        }
    }

    #[cfg(test)]
    /// The kubelet's conversion of `shutdownGracePeriod` + `shutdownGracePeriodCriticalPods`:
    /// priority 0 gets the difference, `system-cluster-critical` the critical time. A zero
    /// total means GNS is off (no bands).
    pub(crate) fn from_simple(
        total: Duration,
        critical: Duration,
    ) -> Result<Vec<PriorityGracePeriod>, GnsError> {
        if total.is_zero() {
            return Ok(Vec::new());
        }
        let regular = total
            .checked_sub(critical)
            .ok_or(GnsError::CriticalExceedsTotal { total, critical })?;
        Ok(vec![
            PriorityGracePeriod {
                priority: 0,
                shutdown_grace_period: regular,
            },
            PriorityGracePeriod {
                priority: SYSTEM_CRITICAL_PRIORITY,
                shutdown_grace_period: critical,
            },
        ])
    }

    pub fn bands(&self) -> &[PriorityGracePeriod] {
        &self.bands
    }

    /// Index of the band for a pod priority: the highest band at or below it, else the lowest.
    pub fn band_for(&self, priority: i32) -> usize {
        self.bands
            .iter()
            .rposition(|b| b.priority <= priority)
            .unwrap_or(0)
    }

    /// The band for pods the cache does not know: the lowest.
    pub(crate) fn band_for_unknown(&self) -> usize {
        0
    }

    /// min(band grace, pod grace); the band grace when the pod's is unknown.
    pub(crate) fn pod_grace(&self, band: usize, pod_grace: Option<Duration>) -> Duration {
        let band_grace = self.bands[band.min(self.bands.len() - 1)].shutdown_grace_period;
        pod_grace.map_or(band_grace, |g| g.min(band_grace))
    }

    /// Every band in ascending priority with its pods. Skip the empty ones (`GnsGroup::members`
    /// empty) without waiting, as the kubelet does.
    pub fn group<T>(
        &self,
        candidates: impl IntoIterator<Item = GnsCandidate<T>>,
    ) -> Vec<GnsGroup<T>> {
        let mut groups: Vec<GnsGroup<T>> = self
            .bands
            .iter()
            .map(|b| GnsGroup {
                priority: b.priority,
                shutdown_grace_period: b.shutdown_grace_period,
                members: Vec::new(),
            })
            .collect();
        for c in candidates {
            let band = c
                .priority
                .map_or(self.band_for_unknown(), |p| self.band_for(p));
            let grace = self.pod_grace(band, c.grace);
            groups[band].members.push(GnsMember {
                item: c.item,
                grace,
            });
        }
        groups
    }

    /// The longest the shutdown can take with these pods: the sum of the non-empty bands.
    pub(crate) fn max_duration<T>(groups: &[GnsGroup<T>]) -> Duration {
        groups
            .iter()
            .filter(|g| !g.members.is_empty())
            .map(|g| g.shutdown_grace_period)
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::testutil::pod;
    use crate::plan::PodType;
    use proptest::prelude::*;

    fn band(priority: i32, secs: u64) -> PriorityGracePeriod {
        PriorityGracePeriod {
            priority,
            shutdown_grace_period: Duration::from_secs(secs),
        }
    }

    fn kubelet_docs_bands() -> GnsBands {
        // The example of the kubelet documentation.
        GnsBands::new(&[
            band(100000, 10),
            band(10000, 180),
            band(1000, 120),
            band(0, 60),
        ])
        .unwrap()
    }

    #[test]
    fn pods_go_to_the_highest_band_at_or_below_them() {
        let b = kubelet_docs_bands();
        let prio = |p: i32| b.bands()[b.band_for(p)].priority;
        assert_eq!(prio(100000), 100000);
        assert_eq!(prio(i32::MAX), 100000);
        assert_eq!(prio(99999), 10000);
        assert_eq!(prio(10000), 10000);
        assert_eq!(prio(1000), 1000);
        assert_eq!(prio(999), 0);
        assert_eq!(prio(0), 0);
        assert_eq!(prio(-5), 0, "below every band: the lowest");
        let shifted = GnsBands::new(&[band(500, 10), band(5000, 20)]).unwrap();
        assert_eq!(shifted.band_for(0), 0);
        assert_eq!(shifted.band_for_unknown(), 0);
    }

    #[test]
    fn grace_is_the_smaller_of_band_and_pod() {
        let b = kubelet_docs_bands();
        let mut long = pod("long", PodType::Default, 10000);
        long.termination_grace_period_seconds = 600;
        let short = pod("short", PodType::Default, 10000);
        let groups = b.group([
            GnsCandidate::known("long", &long),
            GnsCandidate::known("short", &short),
            GnsCandidate::unknown("mystery"),
        ]);
        assert_eq!(
            groups.iter().map(|g| g.priority).collect::<Vec<_>>(),
            [0, 1000, 10000, 100000]
        );
        assert_eq!(
            groups[2].members,
            [
                GnsMember {
                    item: "long",
                    grace: Duration::from_secs(180)
                },
                GnsMember {
                    item: "short",
                    grace: Duration::from_secs(30)
                },
            ]
        );
        assert_eq!(
            groups[0].members,
            [GnsMember {
                item: "mystery",
                grace: Duration::from_secs(60)
            }]
        );
        assert!(groups[1].members.is_empty() && groups[3].members.is_empty());
        assert_eq!(
            GnsBands::max_duration(&groups),
            Duration::from_secs(240),
            "empty bands cost nothing"
        );
    }

    #[test]
    fn simple_form_converts_like_the_kubelet() {
        let bands =
            GnsBands::from_simple(Duration::from_secs(30), Duration::from_secs(10)).unwrap();
        assert_eq!(bands, [band(0, 20), band(SYSTEM_CRITICAL_PRIORITY, 10)]);
        assert_eq!(
            GnsBands::from_simple(Duration::ZERO, Duration::ZERO).unwrap(),
            []
        );
        assert!(GnsBands::from_simple(Duration::from_secs(5), Duration::from_secs(10)).is_err());
    }

    #[test]
    fn invalid_bands_are_rejected() {
        assert_eq!(GnsBands::new(&[]), Err(GnsError::NoBands));
        assert_eq!(
            GnsBands::new(&[band(1, 1), band(1, 2)]),
            Err(GnsError::DuplicatePriority(1))
        );
    }

    proptest! {
        #[test]
        fn every_pod_in_exactly_one_band_with_bounded_grace(
            band_prios in proptest::collection::btree_set(any::<i32>(), 1..6),
            band_secs in proptest::collection::vec(0u64..400, 6),
            pods in proptest::collection::vec((proptest::option::of(any::<i32>()), proptest::option::of(0u64..1000)), 0..40),
        ) {
            let bands: Vec<_> = band_prios.iter().zip(&band_secs).map(|(p, s)| band(*p, *s)).collect();
            let b = GnsBands::new(&bands).unwrap();
            let candidates = pods.iter().enumerate().map(|(i, (prio, grace))| GnsCandidate {
                item: i,
                priority: *prio,
                grace: grace.map(Duration::from_secs),
            });
            let groups = b.group(candidates);
            prop_assert!(groups.windows(2).all(|w| w[0].priority < w[1].priority));
            let mut seen = vec![0; pods.len()];
            for g in &groups {
                for m in &g.members {
                    seen[m.item] += 1;
                    let (prio, grace) = pods[m.item];
                    prop_assert!(m.grace <= g.shutdown_grace_period);
                    if let Some(gr) = grace {
                        prop_assert!(m.grace <= Duration::from_secs(gr));
                    }
                    match prio {
                        None => prop_assert_eq!(g.priority, groups[0].priority),
                        Some(p) if p < groups[0].priority => prop_assert_eq!(g.priority, groups[0].priority),
                        Some(p) => {
                            prop_assert!(g.priority <= p);
                            prop_assert!(groups.iter().all(|o| o.priority <= g.priority || o.priority > p));
                        }
                    }
                }
            }
            prop_assert!(seen.iter().all(|&n| n == 1));
        }
    }
}
