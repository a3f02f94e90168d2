//! What the termination path chosen at connect starts beside the engine, and what it leaves.

use super::*;

/// Once a lifecycle API is used, nothing follows what nodegrace asked for on the APIs it
/// replaced: this node's requests there are left (in the background; a failure is tried
/// again when the daemon next starts).
pub(super) fn leave_unused_apis(
    path: EvictionPath,
    served: crate::plan::intree::Served,
    clients: &Clients,
    node: &str,
    stop: &CancellationToken,
) {
    let node = node.to_owned();
    // Nothing follows the deprecated CRD once a lifecycle API is used: this node's requester
    // leaves its requests there. (A lifecycle path is only chosen for a node whose name fits
    // the node label.)
    let lifecycle_used = matches!(path, EvictionPath::InTree | EvictionPath::LifecycleCrds);
    if lifecycle_used && served.legacy_crd {
        if let Some(name) = crate::api::node_requester(&node) {
            tracing::warn!(node = %node, "evictionrequests.nodegrace.dev (deprecated) is still served but not used: {}", if path == EvictionPath::InTree { "the in-tree API is used (lifecycle.k8s.io)" } else { "nodegrace's lifecycle.nodegrace.dev CRDs are used" });
            let old = Requester::new(clients.nodegrace.clone(), &node);
            let (node, stop) = (node.clone(), stop.clone());
            tokio::spawn(async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = leave_old_crd_requests(&old, &node, &name) => {}
                }
            });
        }
    }
    // Likewise for nodegrace's lifecycle CRDs once the cluster serves the in-tree API.
    if path == EvictionPath::InTree && served.lifecycle_crds {
        let ours = eviction_request::InTreeTerminator::new(
            eviction_request::LifecycleApi::nodegrace(),
            clients.nodegrace.clone(),
            clients.kubelet.clone(),
            &node,
        );
        let (node, stop) = (node.clone(), stop.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = stop.cancelled() => {}
                result = ours.withdraw_all() => match result {
                    Ok(0) => {}
                    Ok(withdrawn) => tracing::info!(node = %node, withdrawn, "withdrew this node's EvictionRequests of lifecycle.nodegrace.dev: the in-tree API is used instead"),
                    Err(err) => tracing::warn!(node = %node, error = crate::cluster::error_text(&err), "withdrawing this node's EvictionRequests of lifecycle.nodegrace.dev failed; tried again when the daemon next starts"),
                },
            }
        });
    }
}

/// nodegrace as the eviction-request controller and evictor of its lifecycle CRDs for this
/// node's pods, fed by the engine and told of the requester's writes.
pub(super) fn start_lifecycle_controller(
    clients: &Clients,
    node: &str,
    engine: &Engine,
    lifecycle: Option<&eviction_request::InTreeTerminator>,
    concurrency: usize,
    stop: &CancellationToken,
) {
    let (controller, handle) = eviction_request::LifecycleController::new(
        clients.nodegrace.clone(),
        clients.kubelet.clone(),
        node,
        engine.pod_store(),
        eviction_request::WallClock::System,
        concurrency,
    );
    let controller = controller.retrying_as_in_shutdown_when(engine.shutting_down());
    if let Some(t) = lifecycle {
        t.announce_to(handle.clone());
    }
    engine.attach_eviction_request_controller(handle);
    let stop = stop.clone();
    tokio::spawn(async move {
        if let Err(err) = controller.run(stop).await {
            tracing::error!(
                error = crate::cluster::error_text(&err),
                "the eviction-request controller (lifecycle.nodegrace.dev) stopped"
            );
        }
    });
}

/// With the in-tree API in use, nothing follows nodegrace's EvictionRequest CRD any more: this
/// node's requester (`requester`) leaves every request of the CRD labelled for the node, so
/// that none holds a pod for it (an external controller of the CRD would still evict it). A
/// failure is tried again when the daemon next starts (it connects once).
async fn leave_old_crd_requests(old: &Requester, node: &str, requester: &str) {
    let pods = match old.own_requests().await {
        Ok(pods) => pods,
        Err(err) => {
            tracing::warn!(node = %node, requester, error = crate::cluster::error_text(&err), "could not list this node's EvictionRequests (evictionrequests.nodegrace.dev) to withdraw from them; tried again when the daemon next starts");
            return;
        }
    };
    let (mut withdrawn, mut kept, mut failed) = (0usize, 0usize, 0usize);
    for pod in &pods {
        match old.withdraw(pod).await {
            Ok(
                eviction_request::Withdrawn::Removed
                | eviction_request::Withdrawn::Cancelled
                | eviction_request::Withdrawn::Deleted,
            ) => withdrawn += 1,
            Ok(eviction_request::Withdrawn::NotRequested) => {}
            // Complete and held by others, or not cancellable: the requester stays by the
            // request's own rules.
            Ok(
                eviction_request::Withdrawn::LeftToOthers | eviction_request::Withdrawn::Forbidden,
            ) => kept += 1,
            Err(err) => {
                failed += 1;
                tracing::warn!(node = %node, pod = %pod, requester, error = crate::cluster::error_text(&err), "withdrawing from an EvictionRequest (evictionrequests.nodegrace.dev) failed; tried again when the daemon next starts");
            }
        }
    }
    if !pods.is_empty() {
        tracing::info!(node = %node, requester, withdrawn, kept, failed, "withdrew from this node's EvictionRequests of nodegrace's deprecated CRD (evictionrequests.nodegrace.dev): a lifecycle API is used instead");
    }
}

/// nodegrace as the eviction-request controller of the deprecated CRD for this node's pods,
/// told of the writes of this node's `requester` and reasserting the `intent` its terminator
/// keeps.
pub(super) fn start_crd_controller(
    clients: &Clients,
    engine: &Engine,
    requester: &Requester,
    intent: Option<eviction_request::Intent>,
    config: ControllerConfig,
    stop: CancellationToken,
) {
    let (controller, handle) =
        Controller::new(clients.nodegrace.clone(), engine.pod_store(), config);
    let mut controller = controller
        .evicting_with(clients.kubelet.clone())
        .retrying_as_in_shutdown_when(engine.shutting_down())
        .reporting_blocks_to(engine.eviction_block_sink());
    if let Some(intent) = intent {
        controller = controller.reasserting(intent);
    }
    requester.announce_to(handle.clone());
    engine.attach_eviction_request_controller(handle);
    tokio::spawn(async move {
        if let Err(err) = controller.run(stop).await {
            tracing::error!(
                error = crate::cluster::error_text(&err),
                "the eviction-request controller stopped"
            );
        }
    });
}
