//! Pod classification: KEP-4212 pod types from a live `Pod` object.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

use super::{PodInfo, PodType};

/// Set by the kubelet on the mirror pod it creates in the apiserver for a static pod; the value
/// is the static pod's config hash.
pub(crate) const MIRROR_ANNOTATION: &str = "kubernetes.io/config.mirror";
/// Set by the kubelet on every pod it runs: `file` and `http` for static pods, `api` for pods
/// from the apiserver. A pod the apiserver holds with a non-`api` source is a static pod's
/// mirror even when the mirror annotation is missing (the kubelet's `IsStaticPod`).
pub(crate) const SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
pub(crate) const HASH_ANNOTATION: &str = "kubernetes.io/config.hash";
/// The apiserver's default for `terminationGracePeriodSeconds`.
pub(crate) const DEFAULT_GRACE_SECONDS: i64 = 30;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClassifyError {
    #[error("pod has no metadata.name")]
    MissingName,
    #[error("pod {pod}: terminationGracePeriodSeconds is negative ({seconds})")]
    NegativeGracePeriod { pod: String, seconds: i64 },
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a String> {
    pod.metadata.annotations.as_ref().and_then(|a| a.get(key))
}

/// The mirror the kubelet keeps in the apiserver of a static pod: the mirror annotation, or
/// a config source other than `api`. An ownerReference to the Node alone does not make one
/// (the kubelet and `kubectl drain` decide by the annotation; nothing recreates such a pod
/// from a manifest).
pub(crate) fn is_static_mirror(pod: &Pod) -> bool {
    annotation(pod, MIRROR_ANNOTATION).is_some()
        || annotation(pod, SOURCE_ANNOTATION).is_some_and(|s| is_static_source(s))
}

/// A config source ([`SOURCE_ANNOTATION`], on a pod or on its CRI sandbox) other than the
/// apiserver's: a static pod's (`file` or `http`).
pub(crate) fn is_static_source(source: &str) -> bool {
    source != "api"
}

/// The pod's kind, the one definition the plan, the online drain and the requester use:
/// static ([`is_static_mirror`]) wins over DaemonSet ([`daemonset_controller`]); every
/// other pod is Default.
pub(crate) fn kind(pod: &Pod) -> PodType {
    if is_static_mirror(pod) {
        PodType::Static
    } else if daemonset_controller(pod).is_some() {
        PodType::DaemonSet
    } else {
        PodType::Default
    }
}

/// The controller ownerReference of a DaemonSet's pod: kind `DaemonSet` in any group and
/// version, as `kubectl drain` and the cluster autoscaler match it, so that an OpenKruise
/// Advanced DaemonSet's pod (`apps.kruise.io`), recreated on the node like `apps/v1`'s, also
/// goes last.
pub(crate) fn daemonset_controller(pod: &Pod) -> Option<&OwnerReference> {
    pod.metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "DaemonSet")
}

/// A pod with phase Succeeded or Failed: its containers will not run again.
pub(crate) fn is_terminal_phase(phase: Option<&str>) -> bool {
    matches!(phase, Some("Succeeded" | "Failed"))
}

/// [`is_terminal_phase`] of the pod's status.
pub(crate) fn is_terminal(pod: &Pod) -> bool {
    is_terminal_phase(pod.status.as_ref().and_then(|s| s.phase.as_deref()))
}

impl PodInfo {
    /// Classifies a pod as the drain needs it (its kind: [`kind`]).
    /// Namespace defaults to `default` and uid to empty (pod list files for `nodegrace plan`).
    pub fn from_pod(pod: &Pod) -> Result<PodInfo, ClassifyError> {
        let meta = &pod.metadata;
        let name = meta.name.clone().ok_or(ClassifyError::MissingName)?;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".into());

        let pod_type = kind(pod);
        let is_static = pod_type == PodType::Static;

        let spec = pod.spec.as_ref();
        let grace = spec
            .and_then(|s| s.termination_grace_period_seconds)
            .unwrap_or(DEFAULT_GRACE_SECONDS);
        if grace < 0 {
            return Err(ClassifyError::NegativeGracePeriod {
                pod: format!("{namespace}/{name}"),
                seconds: grace,
            });
        }
        Ok(PodInfo {
            uid: meta.uid.clone().unwrap_or_default(),
            priority: spec.and_then(|s| s.priority).unwrap_or(0),
            pod_type,
            termination_grace_period_seconds: grace,
            labels: meta.labels.clone().unwrap_or_default(),
            terminating: meta.deletion_timestamp.is_some(),
            terminal: is_terminal(pod),
            static_hash: if is_static {
                annotation(pod, MIRROR_ANNOTATION)
                    .or_else(|| annotation(pod, HASH_ANNOTATION))
                    .cloned()
            } else {
                None
            },
            namespace,
            name,
        })
    }

    /// Still occupies the node: not Succeeded/Failed. Terminating pods are active.
    pub fn is_active(&self) -> bool {
        !self.terminal
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
    use std::collections::BTreeMap;

    fn pod(name: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(PodSpec::default()),
            status: None,
        }
    }

    fn owner(kind: &str, api_version: &str, controller: Option<bool>) -> OwnerReference {
        OwnerReference {
            api_version: api_version.into(),
            kind: kind.into(),
            name: "owner".into(),
            uid: "owner-uid".into(),
            controller,
            block_owner_deletion: None,
        }
    }

    fn annotate(p: &mut Pod, k: &str, v: &str) {
        p.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(k.into(), v.into());
    }

    #[test]
    fn plain_pod_gets_apiserver_defaults() {
        let info = PodInfo::from_pod(&pod("web")).unwrap();
        assert_eq!(info.pod_type, PodType::Default);
        assert_eq!(info.priority, 0);
        assert_eq!(info.termination_grace_period_seconds, 30);
        assert_eq!(info.key(), "ns/web");
        assert_eq!(info.uid, "uid-web");
        assert!(!info.terminal && !info.terminating && info.is_active());
    }

    #[test]
    fn mirror_pod_is_static_even_with_node_owner() {
        let mut p = pod("etcd-n1");
        annotate(&mut p, MIRROR_ANNOTATION, "abc123");
        p.metadata.owner_references = Some(vec![owner("Node", "v1", Some(true))]);
        let info = PodInfo::from_pod(&p).unwrap();
        assert_eq!(info.pod_type, PodType::Static);
        assert_eq!(info.static_hash.as_deref(), Some("abc123"));
    }

    #[test]
    fn non_api_config_source_is_static() {
        let mut p = pod("kube-vip-n1");
        annotate(&mut p, SOURCE_ANNOTATION, "file");
        annotate(&mut p, HASH_ANNOTATION, "h1");
        let info = PodInfo::from_pod(&p).unwrap();
        assert_eq!(info.pod_type, PodType::Static);
        assert_eq!(info.static_hash.as_deref(), Some("h1"));
        let mut q = pod("api-pod");
        annotate(&mut q, SOURCE_ANNOTATION, "api");
        assert_eq!(PodInfo::from_pod(&q).unwrap().pod_type, PodType::Default);
    }

    #[test]
    fn daemonset_is_a_controller_owner_of_kind_daemonset_in_any_group() {
        let mut p = pod("fluentd-x");
        for api_version in ["apps/v1", "apps/v1beta2", "apps.kruise.io/v1alpha1"] {
            p.metadata.owner_references = Some(vec![owner("DaemonSet", api_version, Some(true))]);
            assert_eq!(
                daemonset_controller(&p).map(|o| o.api_version.as_str()),
                Some(api_version)
            );
            assert_eq!(PodInfo::from_pod(&p).unwrap().pod_type, PodType::DaemonSet);
        }
        // Not the controller: an adopting-but-not-controlling reference.
        for controller in [None, Some(false)] {
            p.metadata.owner_references = Some(vec![owner("DaemonSet", "apps/v1", controller)]);
            assert!(daemonset_controller(&p).is_none());
            assert_eq!(PodInfo::from_pod(&p).unwrap().pod_type, PodType::Default);
        }
        // The controller is another kind; a DaemonSet merely owns it too.
        p.metadata.owner_references = Some(vec![
            owner("DaemonSet", "apps/v1", Some(false)),
            owner("ReplicaSet", "apps/v1", Some(true)),
        ]);
        assert_eq!(PodInfo::from_pod(&p).unwrap().pod_type, PodType::Default);
        p.metadata.owner_references = Some(vec![owner("daemonset", "apps/v1", Some(true))]);
        assert_eq!(PodInfo::from_pod(&p).unwrap().pod_type, PodType::Default);
    }

    #[test]
    fn static_mirror_is_the_annotation_or_a_non_api_source_not_a_node_owner() {
        let mut p = pod("etcd-n1");
        p.metadata.owner_references = Some(vec![owner("Node", "v1", Some(true))]);
        assert!(!is_static_mirror(&p));
        annotate(&mut p, MIRROR_ANNOTATION, "abc123");
        assert!(is_static_mirror(&p));
        let mut q = pod("kube-vip-n1");
        annotate(&mut q, SOURCE_ANNOTATION, "http");
        assert!(is_static_mirror(&q));
        let mut r = pod("web");
        annotate(&mut r, SOURCE_ANNOTATION, "api");
        assert!(!is_static_mirror(&r));
        // A mirror pod that a DaemonSet also claims stays static.
        p.metadata.owner_references = Some(vec![owner("DaemonSet", "apps/v1", Some(true))]);
        assert_eq!(PodInfo::from_pod(&p).unwrap().pod_type, PodType::Static);
    }

    #[test]
    fn terminal_is_succeeded_or_failed_only() {
        for (phase, terminal) in [
            (Some("Succeeded"), true),
            (Some("Failed"), true),
            (Some("Running"), false),
            (Some("Pending"), false),
            (Some("Unknown"), false),
            (Some("succeeded"), false),
            (None, false),
        ] {
            assert_eq!(is_terminal_phase(phase), terminal, "{phase:?}");
        }
    }

    #[test]
    fn priority_grace_phase_and_deletion() {
        let mut p = pod("db");
        p.spec = Some(PodSpec {
            priority: Some(2_000_000_000),
            termination_grace_period_seconds: Some(120),
            ..Default::default()
        });
        p.metadata.deletion_timestamp = Some(Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH));
        p.metadata.labels = Some([("app".to_string(), "db".to_string())].into());
        let info = PodInfo::from_pod(&p).unwrap();
        assert_eq!(info.priority, 2_000_000_000);
        assert_eq!(info.grace_period().as_secs(), 120);
        assert!(info.terminating && info.is_active());
        assert_eq!(info.labels.get("app").map(String::as_str), Some("db"));
        for (phase, terminal) in [
            ("Succeeded", true),
            ("Failed", true),
            ("Running", false),
            ("Pending", false),
        ] {
            p.status = Some(PodStatus {
                phase: Some(phase.into()),
                ..Default::default()
            });
            assert_eq!(PodInfo::from_pod(&p).unwrap().terminal, terminal, "{phase}");
        }
    }

    #[test]
    fn bad_pods_are_errors() {
        let mut p = pod("x");
        p.metadata.name = None;
        assert_eq!(PodInfo::from_pod(&p), Err(ClassifyError::MissingName));
        let mut q = pod("y");
        q.spec = Some(PodSpec {
            termination_grace_period_seconds: Some(-1),
            ..Default::default()
        });
        assert!(matches!(
            PodInfo::from_pod(&q),
            Err(ClassifyError::NegativeGracePeriod { .. })
        ));
    }
}
