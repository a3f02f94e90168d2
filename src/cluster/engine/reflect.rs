//! The watches: one reflector per resource feeding the reconcile loop.

use std::sync::Arc;

use futures::StreamExt;
use kube::runtime::reflector::{self};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use tokio::task::JoinHandle;

use crate::cluster::api_error_code;

use super::{is_unusable, lock, Ready, Shared};

pub(super) fn spawn_reflector<K>(
    shared: Arc<Shared>,
    api: Api<K>,
    config: watcher::Config,
    writer: reflector::store::Writer<K>,
    flag: fn(&mut Ready) -> &mut bool,
    optional: bool,
    on_object: fn(&Shared, &K),
) -> JoinHandle<()>
where
    K: Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    tokio::spawn(async move {
        let kind = K::kind(&()).to_string();
        // managedFields are the larger part of a pod as the apiserver sends it, and
        // nothing here reads them.
        let stream = reflector::reflector(
            writer,
            watcher(api, config)
                .default_backoff()
                .modify(|o: &mut K| o.meta_mut().managed_fields = None),
        );
        futures::pin_mut!(stream);
        while let Some(item) = stream.next().await {
            match item {
                Ok(watcher::Event::InitDone) => {
                    *flag(&mut lock(&shared.ready)) = true;
                    shared.mark_reachable();
                }
                Ok(
                    watcher::Event::Apply(obj)
                    | watcher::Event::InitApply(obj)
                    | watcher::Event::Delete(obj),
                ) => {
                    shared.mark_reachable();
                    on_object(&shared, &obj);
                }
                Ok(watcher::Event::Init) => shared.mark_reachable(),
                Err(err) => {
                    let inner = match &err {
                        watcher::Error::InitialListFailed(e)
                        | watcher::Error::WatchStartFailed(e)
                        | watcher::Error::WatchFailed(e) => Some(e),
                        _ => None,
                    };
                    let code = inner.and_then(api_error_code);
                    if optional && matches!(code, Some(403 | 404)) {
                        // Not allowed or not served: nothing to wait for.
                        *flag(&mut lock(&shared.ready)) = true;
                        shared.mark_reachable();
                    } else if code == Some(404) {
                        shared.mark_unreachable(&format_args!(
                            "the apiserver does not serve {kind} (is its CRD installed? see /usr/share/nodegrace/crds): {err}"
                        ));
                    } else if inner.is_some_and(is_unusable) {
                        shared.mark_unreachable(&format_args!("watching {kind}: {err}"));
                    } else {
                        shared.mark_reachable();
                    }
                    tracing::debug!(kind = %kind, error = %err, "watch error; retrying with back-off");
                }
            }
            shared.bump();
        }
    })
}
