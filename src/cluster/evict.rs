//! Terminating one pod through the apiserver: the Eviction API (which honours
//! PodDisruptionBudgets) or, at a shutdown deadline, DELETE. Both carry the pod's UID as a
//! precondition so that a pod recreated under the same name (a StatefulSet replica) is
//! never hit by a request meant for its predecessor.

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::Status;
use kube::Api;

use crate::cluster::gateway::{self, Kind, Reply};
use crate::plan::intree::Refusal;

/// What became of a request to terminate a pod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Accepted: the pod is now terminating.
    Accepted,
    /// The pod is gone, or a different pod now has its name: nothing to do.
    Gone,
    /// 429 from a PodDisruptionBudget (named when the apiserver says which). The
    /// apiserver's own throttling is an error instead: see `gateway::Kind::Throttled`.
    Blocked {
        budget: Option<String>,
        message: String,
    },
}

/// The reason of the `DisruptionTarget` condition of a pod nodegrace deleted.
pub(crate) const DELETION_BY_NODE_MAINTENANCE: &str = "DeletionByNodeMaintenance";

fn preconditions(uid: &str) -> Preconditions {
    Preconditions {
        uid: Some(uid.to_string()),
        resource_version: None,
    }
}

/// POSTs a `policy/v1` Eviction for the pod `name` with UID `uid`. Built by hand rather than
/// with `Api::evict`, whose body spells the field `delete_options`: the apiserver ignores it,
/// and with it the UID precondition.
pub async fn evict(
    api: &Api<Pod>,
    name: &str,
    uid: &str,
    grace_seconds: Option<i64>,
) -> Result<Outcome> {
    let mut delete_options = serde_json::json!({"preconditions": {"uid": uid}});
    if let Some(grace) = grace_seconds {
        delete_options["gracePeriodSeconds"] = grace.max(0).into();
    }
    let body = serde_json::json!({
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": name, "namespace": api.namespace()},
        "deleteOptions": delete_options,
    });
    let result = api
        .create_subresource::<_, Status>("eviction", name, &PostParams::default(), &body)
        .await;
    classify(gateway::reply(result.map(|_| ()))).with_context(|| format!("evicting pod {name}"))
}

/// The pod condition that tells Job `podFailurePolicy`, disruption accounting and `kubectl`
/// that a pod was ended by a disruption, not by a failure of its own.
pub(crate) const DISRUPTION_TARGET: &str = "DisruptionTarget";

/// A `DisruptionTarget` condition (status True, now).
pub(crate) fn disruption_condition(reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "type": DISRUPTION_TARGET,
        "status": "True",
        "reason": reason,
        "message": message,
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
    })
}

/// Strategic-merge-patches the status of the pod `name` (conditions merge by type), with
/// its UID in the patch so that a pod recreated under the same name is refused (the UID is
/// immutable). `Ok(false)`: the pod is gone or is another pod now (404, 409, 422).
pub(crate) async fn patch_pod_status(
    api: &Api<Pod>,
    name: &str,
    uid: &str,
    status: serde_json::Value,
) -> Reply<bool> {
    let body = serde_json::json!({"metadata": {"uid": uid}, "status": status});
    let patched = api
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(body))
        .await;
    match gateway::reply(patched) {
        Ok(_) => Ok(true),
        Err(f) if matches!(f.code(), Some(404 | 409 | 422)) => Ok(false),
        Err(f) => Err(f),
    }
}

/// DELETEs the pod with a bounded grace period, bypassing disruption budgets. The pod first
/// gets the `DisruptionTarget` condition, as the Eviction API would give it (a DELETE does
/// not), naming the maintenance it is deleted for; when that write fails the pod is deleted
/// all the same.
pub async fn delete(
    api: &Api<Pod>,
    name: &str,
    uid: &str,
    grace_seconds: i64,
    maintenance: &str,
) -> Result<Outcome> {
    let condition = disruption_condition(
        DELETION_BY_NODE_MAINTENANCE,
        &format!("Pod was deleted for NodeMaintenance {maintenance}."),
    );
    let status = serde_json::json!({"conditions": [condition]});
    match patch_pod_status(api, name, uid, status).await {
        Ok(true) => {}
        Ok(false) => return Ok(Outcome::Gone),
        Err(err) => {
            tracing::warn!(pod = %name, maintenance = %maintenance, error = %err, "could not mark the pod as a disruption target before deleting it");
        }
    }
    let params = DeleteParams {
        // Saturate: a wrapped 2^32 s would be 0, a forced delete.
        grace_period_seconds: Some(u32::try_from(grace_seconds.max(0)).unwrap_or(u32::MAX)),
        preconditions: Some(preconditions(uid)),
        ..DeleteParams::default()
    };
    classify(gateway::reply(api.delete(name, &params).await.map(|_| ())))
        .with_context(|| format!("deleting pod {name}"))
}

/// DELETEs a static pod's mirror pod at once (grace 0), by UID: what the kubelet does once
/// the static pod has left the node. No `DisruptionTarget`: the pod was stopped by its gated
/// manifest, and the mirror only reflects it.
pub(crate) async fn delete_mirror(api: &Api<Pod>, name: &str, uid: &str) -> Result<Outcome> {
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(preconditions(uid)),
        ..DeleteParams::default()
    };
    classify(gateway::reply(api.delete(name, &params).await.map(|_| ())))
        .with_context(|| format!("deleting mirror pod {name}"))
}

fn classify(reply: Reply<()>) -> Result<Outcome> {
    let failure = match reply {
        Ok(()) => return Ok(Outcome::Accepted),
        Err(f) => f,
    };
    let message = failure.status().map_or("", |s| s.message.as_str());
    match failure.kind {
        Kind::NotFound => Ok(Outcome::Gone),
        // A UID precondition that no longer holds: the name now belongs to another pod.
        Kind::Conflict if message.contains("Precondition failed") => Ok(Outcome::Gone),
        // The one 429 that is not throttling: a disruption budget's.
        Kind::Refused { code: Some(429) } => Ok(Outcome::Blocked {
            budget: failure.status().and_then(blocking_budget),
            message: message.to_owned(),
        }),
        _ => Err(failure.error),
    }
}

/// Whether `reply` to an eviction (or a DELETE) refused it, and why: the counting of
/// `nodegrace_evictions_refused_total` on every path nodegrace sends the request itself.
/// No answer at all is not a refusal: nothing was asked.
pub(crate) fn refusal(reply: &Reply<Outcome>) -> Option<Refusal> {
    match reply {
        Ok(Outcome::Blocked { .. }) => Some(Refusal::Budget),
        Ok(Outcome::Accepted | Outcome::Gone) => None,
        Err(f) if f.throttled().is_some() => Some(Refusal::Throttled),
        Err(f) if f.answered() => Some(Refusal::Error),
        Err(_) => None,
    }
}

/// The PodDisruptionBudget named in a 429 from the eviction subresource. The apiserver puts
/// it in a cause of reason `DisruptionBudget` whose message starts
/// "The disruption budget <name> ...".
pub(crate) fn blocking_budget(status: &Status) -> Option<String> {
    let causes = status.details.as_ref()?.causes.iter();
    causes
        .filter(|c| c.reason == "DisruptionBudget")
        .find_map(|c| {
            c.message
                .strip_prefix("The disruption budget ")?
                .split_whitespace()
                .next()
                .map(str::to_string)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::gateway::testutil::{answering, refused, status_body};
    use crate::cluster::gateway::Failure;
    use kube::core::response::StatusCause;
    use std::time::Duration;

    fn status(code: u16, message: &str, causes: Vec<StatusCause>) -> Box<Status> {
        Box::new(
            serde_json::from_value(serde_json::json!({
                "code": code,
                "message": message,
                "details": {"causes": causes},
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_pdb_block_names_the_budget() {
        let s = status(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            vec![StatusCause {
                reason: "DisruptionBudget".into(),
                message: "The disruption budget db-pdb needs 2 healthy pods and has 2 currently"
                    .into(),
                field: String::new(),
            }],
        );
        assert_eq!(
            classify(Err(refused(s))).unwrap(),
            Outcome::Blocked {
                budget: Some("db-pdb".into()),
                message: "Cannot evict pod as it would violate the pod's disruption budget.".into()
            }
        );
    }

    #[test]
    fn throttling_is_an_error_that_names_its_wait_not_a_block() {
        // API Priority and Fairness answers plain text: kube's client makes it this Status.
        let apf = status(429, "Too many requests, please try again later.", vec![]);
        let err = classify(Err(refused(apf))).unwrap_err();
        let wrapped = err.context("evicting pod web-1");
        assert_eq!(
            Failure::new(wrapped).throttled(),
            Some(Duration::from_secs(1))
        );
    }

    #[test]
    fn a_budget_refusal_is_never_taken_for_throttling() {
        // A budget the apiserver has not processed yet: no count in the cause's message.
        let pending = status(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            vec![StatusCause {
                reason: "DisruptionBudget".into(),
                message: "The disruption budget db-pdb is still being processed by the server."
                    .into(),
                field: String::new(),
            }],
        );
        assert_eq!(refused(pending.clone()).throttled(), None);
        assert!(matches!(
            classify(Err(refused(pending))).unwrap(),
            Outcome::Blocked { budget: Some(b), .. } if b == "db-pdb"
        ));
        let bare = status(
            429,
            "Cannot evict pod as it would violate the pod's disruption budget.",
            vec![],
        );
        assert_eq!(refused(bare).throttled(), None);
        assert_eq!(
            refused(status(500, "etcdserver: request timed out", vec![])).throttled(),
            None
        );
    }

    #[test]
    fn other_errors_stay_errors() {
        let s = status(
            500,
            "This pod has more than one PodDisruptionBudget",
            vec![],
        );
        assert!(classify(Err(refused(s))).is_err());
        let conflict = status(409, "Operation cannot be fulfilled", vec![]);
        assert!(classify(Err(refused(conflict))).is_err());
    }

    #[test]
    fn a_missing_pod_or_a_failed_uid_precondition_is_gone() {
        let missing = status(404, "pods \"web-0\" not found", vec![]);
        assert_eq!(classify(Err(refused(missing))).unwrap(), Outcome::Gone);
        let replaced = status(
            409,
            "Precondition failed: UID in precondition: a, UID in object meta: b",
            vec![],
        );
        assert_eq!(classify(Err(refused(replaced))).unwrap(), Outcome::Gone);
        let forbidden = status(403, "forbidden", vec![]);
        assert!(classify(Err(refused(forbidden))).is_err());
    }

    #[tokio::test]
    async fn a_status_patch_refused_as_for_another_pod_is_false() {
        let answered = |code: u16| async move {
            let client = answering(move |_, _| match code {
                200 => (
                    200,
                    serde_json::json!({"apiVersion": "v1", "kind": "Pod",
                        "metadata": {"name": "web-0", "namespace": "default"}}),
                ),
                code => (code, status_body(code, "refused")),
            });
            let api: Api<Pod> = Api::namespaced(client, "default");
            patch_pod_status(&api, "web-0", "uid-1", serde_json::json!({})).await
        };
        assert!(answered(200).await.unwrap());
        for code in [404, 409, 422] {
            assert!(!answered(code).await.unwrap(), "{code}");
        }
        for code in [403, 500] {
            assert_eq!(answered(code).await.unwrap_err().code(), Some(code));
        }
    }

    #[test]
    fn a_refusal_is_a_budget_a_throttle_or_an_answered_error_and_no_answer_is_none() {
        let failure = |s: Box<Status>| Err(refused(s));
        let blocked = Ok(Outcome::Blocked {
            budget: None,
            message: "Cannot evict pod".into(),
        });
        assert_eq!(refusal(&blocked), Some(Refusal::Budget));
        let apf = status(429, "Too many requests, please try again later.", vec![]);
        assert_eq!(refusal(&failure(apf)), Some(Refusal::Throttled));
        let forbidden = status(403, "forbidden", vec![]);
        assert_eq!(refusal(&failure(forbidden)), Some(Refusal::Error));
        let unanswered = Err(Failure::new(anyhow::anyhow!("connection refused")));
        assert_eq!(refusal(&unanswered), None);
        assert_eq!(refusal(&Ok(Outcome::Accepted)), None);
        assert_eq!(refusal(&Ok(Outcome::Gone)), None);
    }
}
