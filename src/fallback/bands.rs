//! GNS band assignment, as the kubelet's `shutdownGracePeriodByPodPriority` does it.
//!
//! TODO(plan::gns): this is a private stand-in until the pure `plan::gns` lands; the lead
//! switches the fallback to it and deletes this file.

use std::time::Duration;

use crate::config::PriorityGracePeriod;

/// Bands sorted by ascending priority; an empty list becomes one band of priority 0 and no
/// grace, so every pod still gets a band (and is killed at once).
pub(crate) fn sorted_bands(bands: &[PriorityGracePeriod]) -> Vec<PriorityGracePeriod> {
    let mut sorted = bands.to_vec();
    sorted.sort_by_key(|b| b.priority);
    sorted.dedup_by_key(|b| b.priority);
    if sorted.is_empty() {
        sorted.push(PriorityGracePeriod {
            priority: 0,
            shutdown_grace_period: Duration::ZERO,
        });
    }
    sorted
}

/// Index of the highest band whose priority is at most `priority`; pods below every band
/// (and pods of unknown priority, passed as None) go to the lowest one.
pub(crate) fn band_index(sorted: &[PriorityGracePeriod], priority: Option<i32>) -> usize {
    let Some(p) = priority else { return 0 };
    sorted.iter().rposition(|b| b.priority <= p).unwrap_or(0)
}

/// The grace a pod gets in its band: the band's, or the pod's own if shorter.
pub(crate) fn pod_grace(band: &PriorityGracePeriod, pod_grace: Option<Duration>) -> Duration {
    match pod_grace {
        Some(g) => g.min(band.shutdown_grace_period),
        None => band.shutdown_grace_period,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn band(priority: i32, secs: u64) -> PriorityGracePeriod {
        PriorityGracePeriod {
            priority,
            shutdown_grace_period: Duration::from_secs(secs),
        }
    }

    #[test]
    fn pods_go_to_the_highest_band_at_or_below_their_priority() {
        let bands = sorted_bands(&[band(100_000, 20), band(0, 60), band(2_000_000_000, 10)]);
        assert_eq!(bands[0].priority, 0);
        assert_eq!(band_index(&bands, Some(0)), 0);
        assert_eq!(band_index(&bands, Some(99_999)), 0);
        assert_eq!(band_index(&bands, Some(100_000)), 1);
        assert_eq!(band_index(&bands, Some(2_000_001_000)), 2);
        assert_eq!(band_index(&bands, Some(-5)), 0, "below every band: lowest");
        assert_eq!(band_index(&bands, None), 0, "unknown: lowest");
    }

    #[test]
    fn grace_is_the_shorter_of_band_and_pod() {
        let b = band(0, 30);
        assert_eq!(
            pod_grace(&b, Some(Duration::from_secs(5))),
            Duration::from_secs(5)
        );
        assert_eq!(
            pod_grace(&b, Some(Duration::from_secs(90))),
            Duration::from_secs(30)
        );
        assert_eq!(pod_grace(&b, None), Duration::from_secs(30));
    }

    #[test]
    fn no_bands_still_gives_every_pod_one() {
        let bands = sorted_bands(&[]);
        assert_eq!(band_index(&bands, Some(7)), 0);
        assert_eq!(bands[0].shutdown_grace_period, Duration::ZERO);
    }
}
