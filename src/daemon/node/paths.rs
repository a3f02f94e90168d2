//! What the termination path chosen at connect starts beside the engine, and what it leaves.

use super::*;

/// Once the cluster serves the in-tree API, nothing follows what nodegrace asked for on its
/// own lifecycle CRDs: this node's requests there are withdrawn (in the background; a failure
/// is tried again when the daemon next starts).
pub(super) fn leave_unused_apis(
    path: EvictionPath,
    served: crate::plan::intree::Served,
    clients: &Clients,
    node: &str,
    stop: &CancellationToken,
) {
    if path == EvictionPath::InTree && served.lifecycle_crds {
        let ours = eviction_request::InTreeTerminator::new(
            eviction_request::LifecycleApi::nodegrace(),
            clients.nodegrace.clone(),
            clients.kubelet.clone(),
            node,
        );
        let (node, stop) = (node.to_owned(), stop.clone());
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
    metrics: Metrics,
    stop: &CancellationToken,
) {
    let (controller, handle) = eviction_request::LifecycleController::new(
        clients.nodegrace.clone(),
        clients.kubelet.clone(),
        node,
        engine.pod_store(),
        eviction_request::WallClock::System,
        concurrency,
        metrics,
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
