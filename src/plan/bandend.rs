//! When a band of the drain ends: the one home of that rule.
//!
//! A band ends when none of its pods holds it. The API alone says a pod holds its band until it
//! is gone or terminal. The node knows sooner: the kubelet deletes a terminating pod from the API
//! only once the runtime runs none of its containers and its volumes are unmounted (`podVolumesExist`
//! on the pod's directories under the kubelet's root), and it writes the terminal phase before
//! that unmount. So the node's own view ([`OnNode`], sampled by the engine) decides, when it is
//! sure:
//! - a terminating pod whose containers have all exited and whose volumes are all unmounted no
//!   longer holds its band, whatever the API still shows;
//! - a terminating pod the API already shows terminal still holds it while the node shows a
//!   container running or a volume mounted (a later band may hold the storage or network
//!   plugin the unmount needs: kubernetes#115148), but never past its step's end when a
//!   shutdown's schedule is in force.
//!
//! A static pod whose manifest nodegrace gated is terminating too, although the API shows no
//! deletion: the kubelet stops it when the manifest leaves its directory. Once the node shows it
//! gone, having shown it present before (so the runtime asked is the one that ran it), its
//! mirror pod is deleted ([`mirrors_to_delete`]): the write the kubelet's housekeeping makes
//! next (every 2 s), made as soon as the node knows.
//!
//! Anything the node cannot tell (the runtime did not answer, a volume directory could not be
//! read) leaves the API's answer standing. Whether the node is empty for the release is not
//! decided here: that stays the API's (`plan::pass`), so no pod is left `Running` there.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::{PodInfo, PodType};

/// What the node itself shows of one pod.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OnNode {
    /// The runtime runs a container or a ready sandbox of the pod's UID; None: the runtime
    /// did not answer.
    pub running: Option<bool>,
    /// A volume directory of the pod is a mount point; None: the mounts could not be read.
    pub mounted: Option<bool>,
}

impl OnNode {
    /// Surely gone from the node: nothing running, nothing mounted.
    fn gone(&self) -> bool {
        self.running == Some(false) && self.mounted == Some(false)
    }

    /// Surely still on the node: something running or mounted.
    fn present(&self) -> bool {
        self.running == Some(true) || self.mounted == Some(true)
    }
}

/// The node's view, by the UID the kubelet knows each pod by ([`node_uid`]); a pod missing
/// from it is one the node could not tell about.
pub type NodeView = HashMap<String, OnNode>;

/// The UID the kubelet runs a pod under: a static pod's is its config hash (its mirror pod's
/// UID is the apiserver's), every other pod's is its own.
pub(crate) fn node_uid(pod: &PodInfo) -> &str {
    pod.static_hash.as_deref().unwrap_or(&pod.uid)
}

/// What the drain remembers of a pod for the node's view.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct NodeTrack {
    /// Its static pod manifest was gated: the kubelet stops it without a deletion in the API.
    pub gated: bool,
    /// Since it was gated, the node showed it present (running or mounted).
    pub seen: bool,
    /// Its mirror pod's deletion was sent (once; the kubelet's housekeeping does it otherwise).
    pub mirror_deleted: bool,
}

impl NodeTrack {
    /// Remembers what the node showed of the pod in one look.
    pub(crate) fn saw(&mut self, on_node: Option<&OnNode>) {
        self.seen |= on_node.is_some_and(OnNode::present);
    }
}

/// The pods whose band the node's view may end or hold: terminating ones and static pods
/// whose manifest was gated (the API shows nothing else the node could know sooner).
pub(crate) fn worth_looking_at(pod: &PodInfo, track: NodeTrack) -> bool {
    pod.terminating || (pod.pod_type == PodType::Static && track.gated)
}

/// The gated static pods whose mirror pod is to be deleted now: the API still shows the mirror
/// active, and the node, which showed the pod present since the gate, now shows it surely gone.
pub(crate) fn mirrors_to_delete<'a>(
    pods: &'a [PodInfo],
    track_of: &dyn Fn(&PodInfo) -> NodeTrack,
    view: Option<&NodeView>,
) -> Vec<&'a PodInfo> {
    let Some(view) = view else {
        return Vec::new();
    };
    pods.iter()
        .filter(|p| p.pod_type == PodType::Static && p.static_hash.is_some() && p.is_active())
        .filter(|p| {
            let track = track_of(p);
            track.gated && track.seen && !track.mirror_deleted
        })
        .filter(|p| view.get(node_uid(p)).is_some_and(OnNode::gone))
        .collect()
}

/// Which pods hold their band now, and when to decide again without a change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct BandEnd {
    /// UIDs (the API's) of the pods holding their band.
    holding: HashSet<String>,
    /// A hold of the node's view lapses then (drain clock).
    pub(crate) wake_at: Option<Duration>,
}

impl BandEnd {
    /// The API's answer alone: every active pod holds its band.
    pub(crate) fn by_api(pods: &[PodInfo]) -> Self {
        Self {
            holding: pods
                .iter()
                .filter(|p| p.is_active())
                .map(|p| p.uid.clone())
                .collect(),
            wake_at: None,
        }
    }

    /// The node's view over the API's (see the module documentation). `track_of`: what the
    /// drain remembers of each pod; `hold_ends`: when a pod's step ends under a shutdown's
    /// schedule in force, if it does; `now` on the same clock.
    pub(crate) fn decide(
        pods: &[PodInfo],
        track_of: &dyn Fn(&PodInfo) -> NodeTrack,
        view: Option<&NodeView>,
        hold_ends: &dyn Fn(&PodInfo) -> Option<Duration>,
        now: Duration,
    ) -> Self {
        let mut band = Self::by_api(pods);
        let Some(view) = view else {
            return band;
        };
        for pod in pods.iter().filter(|p| worth_looking_at(p, track_of(p))) {
            let Some(on_node) = view.get(node_uid(pod)) else {
                continue;
            };
            if pod.terminal {
                if !on_node.present() {
                    continue;
                }
                match hold_ends(pod) {
                    Some(end) if end <= now => continue,
                    Some(end) => band.wake_at = Some(band.wake_at.map_or(end, |w| w.min(end))),
                    None => {}
                }
                band.holding.insert(pod.uid.clone());
            } else if on_node.gone() {
                band.holding.remove(&pod.uid);
            }
        }
        band
    }

    pub(crate) fn holds(&self, pod: &PodInfo) -> bool {
        self.holding.contains(&pod.uid)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::testutil::pod;
    use crate::plan::PodType;
    use proptest::prelude::*;

    const GONE: OnNode = on(Some(false), Some(false));
    const NO_LIMIT: &dyn Fn(&PodInfo) -> Option<Duration> = &|_| None;
    const UNTRACKED: &dyn Fn(&PodInfo) -> NodeTrack = &|_| NodeTrack::default();

    const fn on(running: Option<bool>, mounted: Option<bool>) -> OnNode {
        OnNode { running, mounted }
    }

    fn leaving(name: &str) -> PodInfo {
        let mut p = pod(name, PodType::Default, 0);
        p.terminating = true;
        p
    }

    fn done(name: &str) -> PodInfo {
        let mut p = leaving(name);
        p.terminal = true;
        p
    }

    /// Whether `pod`, alone on the node, holds its band with the node showing `on_node`.
    fn holds(pod: &PodInfo, on_node: Option<OnNode>) -> bool {
        let view: NodeView = on_node
            .map(|n| (node_uid(pod).to_owned(), n))
            .into_iter()
            .collect();
        let pods = [pod.clone()];
        BandEnd::decide(&pods, UNTRACKED, Some(&view), NO_LIMIT, Duration::ZERO).holds(pod)
    }

    #[test]
    fn without_a_view_the_api_decides() {
        let pods = [
            pod("up", PodType::Default, 0),
            leaving("going"),
            done("done"),
        ];
        let band = BandEnd::decide(&pods, UNTRACKED, None, NO_LIMIT, Duration::ZERO);
        assert!(band.holds(&pods[0]) && band.holds(&pods[1]));
        assert!(!band.holds(&pods[2]));
        assert_eq!(band, BandEnd::by_api(&pods));
    }

    #[test]
    fn a_terminating_pod_with_nothing_running_or_mounted_ends_its_band() {
        assert!(!holds(&leaving("going"), Some(GONE)));
    }

    #[test]
    fn a_pod_not_asked_to_leave_holds_however_empty_the_node_looks() {
        // Pending, or between two runs of a container: nothing runs and nothing is mounted.
        assert!(holds(&pod("starting", PodType::Default, 0), Some(GONE)));
    }

    #[test]
    fn a_terminating_pod_holds_unless_the_node_is_sure_it_left() {
        let going = leaving("going");
        for on_node in [
            on(Some(false), Some(true)),
            on(Some(true), Some(false)),
            on(None, Some(false)),
            on(Some(false), None),
        ] {
            assert!(holds(&going, Some(on_node)), "{on_node:?}");
        }
        assert!(holds(&going, None));
    }

    #[test]
    fn a_terminal_phase_does_not_end_the_band_while_a_volume_is_mounted() {
        assert!(holds(&done("done"), Some(on(Some(false), Some(true)))));
        assert!(!holds(&done("done"), Some(GONE)));
    }

    #[test]
    fn a_terminal_pod_the_node_cannot_tell_about_is_done() {
        assert!(!holds(&done("done"), Some(on(None, None))));
        assert!(!holds(&done("done"), None));
    }

    #[test]
    fn the_hold_of_a_terminal_pod_lapses_at_its_step_end() {
        let pods = [done("done")];
        let v: NodeView = [("uid-done".to_owned(), on(Some(true), Some(true)))].into();
        let end: &dyn Fn(&PodInfo) -> Option<Duration> = &|_| Some(Duration::from_secs(10));
        let band = BandEnd::decide(&pods, UNTRACKED, Some(&v), end, Duration::from_secs(4));
        assert!(band.holds(&pods[0]));
        assert_eq!(band.wake_at, Some(Duration::from_secs(10)));
        let band = BandEnd::decide(&pods, UNTRACKED, Some(&v), end, Duration::from_secs(10));
        assert!(!band.holds(&pods[0]));
    }

    #[test]
    fn a_completed_pod_nobody_deletes_never_holds() {
        // A finished Job's pod: terminal, no deletion under way, its volumes left mounted.
        let mut finished = pod("job", PodType::Default, 0);
        finished.terminal = true;
        assert!(!holds(&finished, Some(on(Some(false), Some(true)))));
    }

    #[test]
    fn a_static_pod_is_looked_up_by_its_config_hash() {
        let mut st = pod("etcd", PodType::Static, 0);
        st.static_hash = Some("hash".into());
        st.terminating = true;
        let pods = [st];
        let by_api_uid: NodeView = [("uid-etcd".to_owned(), GONE)].into();
        let band = BandEnd::decide(
            &pods,
            UNTRACKED,
            Some(&by_api_uid),
            NO_LIMIT,
            Duration::ZERO,
        );
        assert!(
            band.holds(&pods[0]),
            "the mirror's UID is not the pod's on the node"
        );
        assert!(!holds(&pods[0], Some(GONE)));
    }

    fn gated_etcd() -> PodInfo {
        let mut p = pod("etcd", PodType::Static, 0);
        p.static_hash = Some("hash".into());
        p
    }

    const GATED_AND_SEEN: NodeTrack = NodeTrack {
        gated: true,
        seen: true,
        mirror_deleted: false,
    };

    #[test]
    fn a_gated_static_pod_the_node_shows_gone_ends_its_band_though_the_api_shows_no_deletion() {
        let pods = [gated_etcd()];
        let v: NodeView = [("hash".to_owned(), GONE)].into();
        let gated: &dyn Fn(&PodInfo) -> NodeTrack = &|_| GATED_AND_SEEN;
        let band = BandEnd::decide(&pods, gated, Some(&v), NO_LIMIT, Duration::ZERO);
        assert!(!band.holds(&pods[0]));
        let band = BandEnd::decide(&pods, UNTRACKED, Some(&v), NO_LIMIT, Duration::ZERO);
        assert!(band.holds(&pods[0]), "not gated: the kubelet runs it on");
    }

    #[test]
    fn a_mirror_is_deleted_only_for_a_gated_static_pod_the_node_showed_and_now_shows_gone() {
        let etcd = gated_etcd();
        let gone: NodeView = [("hash".to_owned(), GONE)].into();
        let deleted = |pod: &PodInfo, track: NodeTrack, view: Option<&NodeView>| {
            let pods = [pod.clone()];
            !mirrors_to_delete(&pods, &move |_| track, view).is_empty()
        };
        assert!(deleted(&etcd, GATED_AND_SEEN, Some(&gone)));

        let never_seen = NodeTrack {
            seen: false,
            ..GATED_AND_SEEN
        };
        assert!(
            !deleted(&etcd, never_seen, Some(&gone)),
            "a runtime that never showed the pod may not be the kubelet's"
        );
        let not_gated = NodeTrack {
            gated: false,
            ..GATED_AND_SEEN
        };
        assert!(!deleted(&etcd, not_gated, Some(&gone)));
        let sent = NodeTrack {
            mirror_deleted: true,
            ..GATED_AND_SEEN
        };
        assert!(!deleted(&etcd, sent, Some(&gone)), "asked once");
        assert!(!deleted(&etcd, GATED_AND_SEEN, None));
        for on_node in [
            on(Some(true), Some(false)),
            on(Some(false), Some(true)),
            on(None, Some(false)),
            on(Some(false), None),
        ] {
            let v: NodeView = [("hash".to_owned(), on_node)].into();
            assert!(!deleted(&etcd, GATED_AND_SEEN, Some(&v)), "{on_node:?}");
        }
        let by_api_uid: NodeView = [("uid-etcd".to_owned(), GONE)].into();
        assert!(!deleted(&etcd, GATED_AND_SEEN, Some(&by_api_uid)));

        let mut terminal = etcd.clone();
        terminal.terminal = true;
        assert!(
            !deleted(&terminal, GATED_AND_SEEN, Some(&gone)),
            "the API shows it done"
        );
        let mut no_hash = etcd.clone();
        no_hash.static_hash = None;
        let by_uid: NodeView = [("uid-etcd".to_owned(), GONE)].into();
        assert!(!deleted(&no_hash, GATED_AND_SEEN, Some(&by_uid)));
        let mut daemon = leaving("agent");
        daemon.pod_type = PodType::DaemonSet;
        let v: NodeView = [("uid-agent".to_owned(), GONE)].into();
        assert!(!deleted(&daemon, GATED_AND_SEEN, Some(&v)));
    }

    #[test]
    fn a_pod_counts_as_seen_once_the_node_showed_it_present() {
        let mut track = NodeTrack::default();
        for unsure in [None, Some(&GONE), Some(&on(None, None))] {
            track.saw(unsure);
            assert!(!track.seen, "{unsure:?}");
        }
        track.saw(Some(&on(Some(true), None)));
        assert!(track.seen);
        track.saw(Some(&GONE));
        assert!(track.seen, "kept");
    }

    fn arb_answer() -> impl Strategy<Value = Option<bool>> {
        prop_oneof![Just(None), Just(Some(false)), Just(Some(true))]
    }

    fn arb_case() -> impl Strategy<Value = Vec<(bool, bool, Option<OnNode>)>> {
        let on_node = proptest::option::of(
            (arb_answer(), arb_answer()).prop_map(|(running, mounted)| OnNode { running, mounted }),
        );
        proptest::collection::vec((any::<bool>(), any::<bool>(), on_node), 0..8)
    }

    proptest! {
        /// The node's view ends a band sooner only for a pod that is surely gone from the
        /// node, and holds one longer only for a pod surely still on it; whatever it cannot
        /// tell leaves the API's answer.
        #[test]
        fn the_view_overrides_the_api_only_when_sure(
            case in arb_case(),
            now in 0u64..20,
            end in proptest::option::of(0u64..20),
        ) {
            let mut pods = Vec::new();
            let mut v = NodeView::new();
            for (i, (terminating, terminal, on_node)) in case.iter().enumerate() {
                let mut p = pod(&format!("p{i}"), PodType::Default, 0);
                p.terminating = *terminating;
                p.terminal = *terminal;
                if let Some(n) = on_node {
                    v.insert(node_uid(&p).to_owned(), *n);
                }
                pods.push(p);
            }
            let ends = move |_: &PodInfo| end.map(Duration::from_secs);
            let now = Duration::from_secs(now);
            let api = BandEnd::by_api(&pods);
            let band = BandEnd::decide(&pods, UNTRACKED, Some(&v), &ends, now);
            for p in &pods {
                let on_node = v.get(node_uid(p));
                if api.holds(p) && !band.holds(p) {
                    prop_assert!(p.terminating && on_node.is_some_and(OnNode::gone), "{p:?}");
                }
                if !api.holds(p) && band.holds(p) {
                    prop_assert!(p.terminating && on_node.is_some_and(OnNode::present));
                    prop_assert!(end.is_none_or(|e| Duration::from_secs(e) > now));
                }
                if on_node.is_none_or(|n| !n.gone() && !n.present()) {
                    prop_assert_eq!(band.holds(p), api.holds(p));
                }
            }
        }
    }
}
