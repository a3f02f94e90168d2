//! The engine and what the termination path chosen at connect ([`Wiring`]) starts beside it,
//! and what it leaves, in the one order that works.

use super::*;
use crate::cluster::EvictionApi;
use crate::plan::wiring::{LifecycleGroup, Requester, Wiring};

/// Starts the engine from `options` and carries out `wiring` around it. The requester is the
/// engine's terminator (it replaces `options.terminator`), so it comes first; the requester's
/// watch and nodegrace's own eviction-request controller are fed by the engine, so they
/// follow it.
pub(super) fn start_wired(
    wiring: Wiring,
    clients: &Clients,
    mut options: EngineOptions,
    stop: &CancellationToken,
) -> Engine {
    let node = options.node.clone();
    let requester = wiring
        .requester
        .map(|r| (r, Arc::new(requester(r.group, clients, &node))));
    if wiring.withdraw_from_crds {
        withdraw_from_crds(clients, &node, stop);
    }
    if let Some(warning) = wiring.warning {
        tracing::warn!(node = %node, "{}", warning.message());
    }
    options.terminator = Some(match &requester {
        Some((_, t)) => t.clone(),
        None => Arc::new(EvictionApi::new(clients.kubelet.clone())),
    });
    let concurrency = options.settings.drain.max_concurrent_requests;
    let metrics = options.metrics.clone();
    let engine = Engine::start(options);
    if let Some((r, t)) = requester {
        watch_requests(r, &t, &engine, metrics.clone(), stop);
        if r.own_controller {
            start_lifecycle_controller(clients, &node, &engine, &t, concurrency, metrics, stop);
        }
    }
    engine
}

fn lifecycle_api(group: LifecycleGroup) -> eviction_request::LifecycleApi {
    match group {
        LifecycleGroup::InTree => eviction_request::LifecycleApi::in_tree(),
        LifecycleGroup::Nodegrace => eviction_request::LifecycleApi::nodegrace(),
    }
}

/// nodegrace's requester on `group` for `node`'s pods.
fn requester_on(
    group: LifecycleGroup,
    clients: &Clients,
    node: &str,
) -> eviction_request::InTreeTerminator {
    eviction_request::InTreeTerminator::new(
        lifecycle_api(group),
        clients.nodegrace.clone(),
        clients.kubelet.clone(),
        node,
    )
}

/// The requester the drain uses, said once.
fn requester(
    group: LifecycleGroup,
    clients: &Clients,
    node: &str,
) -> eviction_request::InTreeTerminator {
    let t = requester_on(group, clients, node);
    tracing::info!(node = %node, requester = %t.key(), api = %lifecycle_api(group).group(), "pods are asked to leave through EvictionRequests");
    t
}

/// The requester's watch of its Evictions, reporting what blocks a pod to the engine.
fn watch_requests(
    requester: Requester,
    t: &eviction_request::InTreeTerminator,
    engine: &Engine,
    metrics: Metrics,
    stop: &CancellationToken,
) {
    // nodegrace's own evictor counts its refusals where it sends the evictions.
    let progress = t.progress(
        engine.eviction_block_sink(),
        metrics,
        requester.own_controller,
    );
    let shutting_down = engine.shutting_down();
    let stop = stop.clone();
    tokio::spawn(async move { progress.run(stop, shutting_down).await });
}

/// Once the cluster serves the in-tree API, nothing follows what nodegrace asked for on its
/// own lifecycle CRDs: this node's requests there are withdrawn (in the background; a failure
/// is tried again when the daemon next starts).
fn withdraw_from_crds(clients: &Clients, node: &str, stop: &CancellationToken) {
    let ours = requester_on(LifecycleGroup::Nodegrace, clients, node);
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

/// nodegrace as the eviction-request controller and evictor of its lifecycle CRDs for this
/// node's pods, fed by the engine and told of the requester's writes.
fn start_lifecycle_controller(
    clients: &Clients,
    node: &str,
    engine: &Engine,
    requester: &eviction_request::InTreeTerminator,
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
    requester.announce_to(handle.clone());
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
