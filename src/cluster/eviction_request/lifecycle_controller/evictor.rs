//! nodegrace's imperative evictor inside the controller: the Eviction API called when the
//! evictor's decision says so, its entry written.

use super::*;

impl LifecycleController {
    /// nodegrace's imperative evictor, when it is the Eviction's active responder: its
    /// attempt and its entry written.
    pub(super) async fn run_evictor(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        facts: &PodFacts,
        eviction: &Eviction,
        memory: &mut Memory,
    ) -> Result<(Option<Eviction>, Option<Timestamp>)> {
        let d = self
            .evictor_step(namespace, name, uid, facts, eviction, memory)
            .await;
        let written = match d.status {
            Some(entry) => {
                self.write_evictor_entry(namespace, eviction, entry, memory)
                    .await?
            }
            None => None,
        };
        Ok((written, d.wake_at))
    }

    /// The evictor's decision on `eviction`, the Eviction API called when it says so; the
    /// entry to write is the caller's.
    pub(super) async fn evictor_step(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
        facts: &PodFacts,
        eviction: &Eviction,
        memory: &mut Memory,
    ) -> EvictorDecision {
        let cap = memory.backoff_cap.unwrap_or(EVICTOR_BACKOFF_CAP);
        let now = self.clock.now();
        let target = TargetRef {
            name: name.to_owned(),
            uid: uid.to_owned(),
        };
        let d = decide_evictor(
            eviction,
            &target,
            facts,
            memory.last_attempt.get(uid).copied(),
            cap,
            now,
        );
        if !d.evict_now {
            return d;
        }
        // Evicted already (the watch shows the deletion a moment later), or deleted by the
        // drain at its deadline: not evicted again.
        if memory.evicted.contains(uid) {
            return EvictorDecision::idle();
        }
        let Some(sending) = self.gate.sending(uid) else {
            return EvictorDecision::idle();
        };
        let pods: Api<Pod> = Api::namespaced(self.evictor.clone(), namespace);
        // The budget is named in the evictor's message, which the requester's watch reads
        // back for the drain (as the in-tree evictor's on 1.37).
        let reply = gateway::reply(evict::evict(&pods, name, uid, None).await);
        if let Some(why) = evict::refusal(&reply) {
            self.metrics.eviction_refused(why);
        }
        let outcome = match reply {
            Ok(Outcome::Accepted | Outcome::Gone) => EvictionOutcome::Evicted,
            Ok(Outcome::Blocked { budget, message }) => EvictionOutcome::Refused {
                error: budget.map_or(message.clone(), |b| {
                    format!("PodDisruptionBudget {b}: {message}")
                }),
                retry_after: None,
            },
            Err(err) if refused_by_the_apiserver(&err) => EvictionOutcome::Refused {
                error: err.text(),
                retry_after: None,
            },
            Err(err) => {
                // Not answered (or a server error, or throttled): no attempt to count or back
                // off from; asked again at the pace of any request to a struggling apiserver.
                // The eviction may still have been carried out; the pod's watch will say.
                warn!(node = %self.node, pod = %format!("{namespace}/{name}"), error = err.text(), "the imperative evictor's eviction got no answer; asking again");
                let again = crate::plan::reachability::request_retry(
                    self.shutting_down.load(Ordering::Relaxed),
                    rand::random::<f64>(),
                );
                return EvictorDecision {
                    evict_now: false,
                    status: None,
                    wake_at: now.checked_add(again).ok(),
                };
            }
        };
        drop(sending);
        match &outcome {
            EvictionOutcome::Evicted => {
                memory.last_attempt.remove(uid);
                memory.evicted.insert(uid.to_owned());
                info!(node = %self.node, pod = %format!("{namespace}/{name}"), "evicted the pod through the Eviction API (imperative evictor)");
            }
            EvictionOutcome::Refused { .. } => {
                memory.last_attempt.insert(uid.to_owned(), now);
            }
        }
        evictor_attempted(eviction, &target, &outcome, cap, now)
    }

    async fn write_evictor_entry(
        &self,
        namespace: &str,
        eviction: &Eviction,
        entry: ResponderStatus,
        memory: &mut Memory,
    ) -> Result<Option<Eviction>> {
        let mut responders = eviction
            .status
            .as_ref()
            .and_then(|s| s.responders.clone())
            .unwrap_or_default();
        match responders.iter_mut().find(|r| r.name == entry.name) {
            Some(r) => *r = entry,
            None => return Ok(None),
        }
        let api = self.api.evictions(&self.client, Some(namespace));
        self.write_status(&api, eviction, json!({"responders": responders}), memory)
            .await
            .map(Some)
    }
}

/// Whether the Eviction API refused (a 4xx other than throttling): an attempt, counted and
/// backed off from. Anything else said nothing of the pod.
fn refused_by_the_apiserver(err: &gateway::Failure) -> bool {
    err.code().is_some_and(|c| c < 500) && err.throttled().is_none()
}
