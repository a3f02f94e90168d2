//! The PodDisruptionBudgets that refused this drain's evictions, each watched by name in its
//! namespace while the drain runs — never a cluster-wide watch, so a node's cost stays
//! independent of the cluster's size — so that `plan::drain` can ask the refused pods again
//! the moment a budget allows a disruption instead of after their back-off.

use std::collections::HashMap;

use futures::StreamExt;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::{Shared, ToLoop};
use crate::cluster::backoff::backed_off;
use crate::plan::drain::BudgetStatus;

/// The budgets watched, by `namespace/name`, and what their watches last showed.
#[derive(Default)]
pub(super) struct Budgets {
    watches: HashMap<String, JoinHandle<()>>,
    pub(super) statuses: HashMap<String, BudgetStatus>,
}

impl Drop for Budgets {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Budgets {
    /// The drain is over: no budget is watched any more.
    pub(super) fn stop(&mut self) {
        for (_, task) in self.watches.drain() {
            task.abort();
        }
        self.statuses.clear();
    }

    /// What a budget's watch showed; a budget no longer watched (its news came after the
    /// drain ended) is not kept.
    pub(super) fn saw(&mut self, key: String, status: Option<BudgetStatus>) {
        if !self.watches.contains_key(&key) {
            return;
        }
        match status {
            Some(status) => self.statuses.insert(key, status),
            None => self.statuses.remove(&key),
        };
    }
}

/// The status as `plan::drain` reads it; None before the disruption controller wrote one.
fn status_of(pdb: &PodDisruptionBudget, seen_at: std::time::Duration) -> Option<BudgetStatus> {
    let status = pdb.status.as_ref()?;
    Some(BudgetStatus {
        allowed: status.disruptions_allowed.unwrap_or(0),
        current: status.observed_generation.is_some()
            && status.observed_generation == pdb.metadata.generation,
        seen_at,
    })
}

impl Shared {
    /// Starts a watch of each budget in `wanted` (`namespace/name`) not watched yet.
    pub(super) fn watch_budgets<'a>(
        &self,
        budgets: &mut Budgets,
        wanted: impl Iterator<Item = &'a str>,
    ) {
        for key in wanted {
            if budgets.watches.contains_key(key) {
                continue;
            }
            let Some((namespace, name)) = key.split_once('/') else {
                continue;
            };
            tracing::debug!(node = %self.node, budget = %key, "watching a PodDisruptionBudget that refused an eviction");
            let task = tokio::spawn(watch_budget(
                self.client.clone(),
                namespace.to_owned(),
                name.to_owned(),
                Told {
                    tell: self.to_loop.clone(),
                    epoch: self.epoch,
                    node: self.node.clone(),
                },
                self.under_way.subscribe(),
            ));
            budgets.watches.insert(key.to_owned(), task);
        }
    }
}

/// Where a budget's watch tells the loop what it saw, on the drain clock.
struct Told {
    tell: mpsc::UnboundedSender<ToLoop>,
    epoch: tokio::time::Instant,
    node: String,
}

async fn watch_budget(
    client: Client,
    namespace: String,
    name: String,
    to: Told,
    under_way: tokio::sync::watch::Receiver<bool>,
) {
    let key = format!("{namespace}/{name}");
    let api: Api<PodDisruptionBudget> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = backed_off(watcher(api, config), under_way).boxed();
    while let Some(event) = events.next().await {
        let status = match event {
            Ok(watcher::Event::Apply(pdb) | watcher::Event::InitApply(pdb)) => {
                status_of(&pdb, to.epoch.elapsed())
            }
            Ok(watcher::Event::Delete(_)) => None,
            Ok(watcher::Event::Init | watcher::Event::InitDone) => continue,
            // The back-off of the pods it refused stays in force meanwhile.
            Err(err) => {
                tracing::debug!(node = %to.node, budget = %key, error = %err, "watching a PodDisruptionBudget failed; retrying");
                continue;
            }
        };
        let told = ToLoop::Budget {
            key: key.clone(),
            status,
        };
        if to.tell.send(told).is_err() {
            return;
        }
    }
}
