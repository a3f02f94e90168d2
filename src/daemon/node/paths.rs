//! The engine and what the termination path chosen at connect ([`Wiring`]) starts beside it,
//! in the one order that works.

use super::*;
use crate::cluster::EvictionApi;
use crate::plan::wiring::Wiring;

/// Starts the engine from `options` and carries out `wiring` around it. The requester is the
/// engine's terminator (it replaces `options.terminator`), so it comes first; the requester's
/// watch reports to the engine, so it follows it.
pub(super) fn start_wired(
    wiring: Wiring,
    clients: &Clients,
    mut options: EngineOptions,
    stop: &CancellationToken,
) -> Engine {
    let node = options.node.clone();
    if let Some(warning) = wiring.warning {
        tracing::warn!(node = %node, "{}", warning.message());
    }
    let requester = wiring.requester.then(|| {
        let t = eviction_request::InTreeTerminator::new(
            clients.nodegrace.clone(),
            clients.kubelet.clone(),
            &node,
        );
        tracing::info!(node = %node, requester = %t.key(), "pods that declare eviction responders are asked to leave through EvictionRequests");
        Arc::new(t)
    });
    options.terminator = Some(match &requester {
        Some(t) => t.clone(),
        None => Arc::new(EvictionApi::new(clients.kubelet.clone())),
    });
    let metrics = options.metrics.clone();
    let engine = Engine::start(options);
    if let Some(t) = requester {
        let progress = t.progress(engine.eviction_block_sink(), metrics);
        let under_way = engine.under_way();
        let stop = stop.clone();
        tokio::spawn(async move { progress.run(stop, under_way).await });
    }
    engine
}
