//! A watched object the types here cannot hold (the apiserver accepts a date past
//! 9999-12-30, which k8s-openapi's timestamps stop at) is set aside alone: it must not fail
//! the list or the watch of every other object, or the apiserver looks unusable.

use std::borrow::Cow;
use std::collections::HashSet;

use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::DynamicResourceScope;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::{self, watcher, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Resource};
use serde::de::{Deserialize, DeserializeOwned, Deserializer};

/// An object as a watch delivered it: decoded, or only what names it and why it is not.
#[derive(Debug, Clone)]
enum Lenient<K> {
    Decoded(K),
    Undecodable {
        meta: Box<ObjectMeta>,
        error: String,
    },
}

impl<'de, K: DeserializeOwned> Deserialize<'de> for Lenient<K> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let value = serde_json::Value::deserialize(d)?;
        Ok(match K::deserialize(&value) {
            Ok(k) => Lenient::Decoded(k),
            Err(e) => Lenient::Undecodable {
                meta: Box::new(naming(&value)),
                error: crate::text::clip(&e.to_string()).into_owned(),
            },
        })
    }
}

/// What names an object, read field by field so that nothing else in it can fail.
fn naming(value: &serde_json::Value) -> ObjectMeta {
    let field = |key: &str| {
        value
            .get("metadata")
            .and_then(|m| m.get(key))
            .and_then(serde_json::Value::as_str)
            .map(str::to_owned)
    };
    ObjectMeta {
        name: field("name"),
        namespace: field("namespace"),
        uid: field("uid"),
        resource_version: field("resourceVersion"),
        ..ObjectMeta::default()
    }
}

impl<K: Resource<DynamicType = ()>> Resource for Lenient<K> {
    type DynamicType = ();
    type Scope = DynamicResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &()) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &()) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &()) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        match self {
            Lenient::Decoded(k) => k.meta(),
            Lenient::Undecodable { meta, .. } => meta.as_ref(),
        }
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Lenient::Decoded(k) => k.meta_mut(),
            Lenient::Undecodable { meta, .. } => meta.as_mut(),
        }
    }
}

impl<K: crate::cluster::Slim> Lenient<K> {
    fn slim(&mut self) {
        if let Lenient::Decoded(k) = self {
            k.slim();
        }
    }
}

/// The watch of every `K` that `config` selects, each object decoded alone (see [`decoded`]).
pub(super) fn watch<K>(
    client: &kube::Client,
    config: &watcher::Config,
    view: Store<K>,
) -> BoxStream<'static, watcher::Result<Event<K>>>
where
    K: Resource<DynamicType = ()>
        + crate::cluster::Slim
        + Clone
        + DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let kind = K::kind(&()).to_string();
    let mut told = HashSet::new();
    // Every watch here is cluster-wide (a node's pods are selected by field).
    let api = Api::<Lenient<K>>::all_with(client.clone(), &());
    watcher(api, config.clone())
        .modify(Lenient::slim)
        .filter_map(move |item| {
            let item = match item {
                Ok(event) => decoded(event, &kind, &view, &mut told).map(Ok),
                Err(err) => Some(Err(err)),
            };
            std::future::ready(item)
        })
        .boxed()
}

/// The event for the view. An object that cannot be decoded is said once (until it is
/// deleted) and left out: listed, it is not in the view; changed, the view keeps the
/// version it last decoded (the drain still asks a pod it knew to leave); deleted, the
/// version the view holds goes.
fn decoded<K>(
    event: Event<Lenient<K>>,
    kind: &str,
    view: &Store<K>,
    told: &mut HashSet<String>,
) -> Option<Event<K>>
where
    K: Resource<DynamicType = ()> + Clone,
{
    match event {
        Event::Init => Some(Event::Init),
        Event::InitDone => Some(Event::InitDone),
        Event::InitApply(Lenient::Decoded(k)) => Some(Event::InitApply(k)),
        Event::Apply(Lenient::Decoded(k)) => Some(Event::Apply(k)),
        Event::Delete(Lenient::Decoded(k)) => Some(Event::Delete(k)),
        Event::InitApply(Lenient::Undecodable { meta, error })
        | Event::Apply(Lenient::Undecodable { meta, error }) => {
            let key = key(&meta);
            if told.insert(key) {
                tracing::error!(
                    kind = %kind,
                    namespace = %crate::text::escape(meta.namespace.as_deref().unwrap_or_default()),
                    name = %crate::text::escape(meta.name.as_deref().unwrap_or_default()),
                    error = %error,
                    "an object the apiserver sent cannot be decoded: set aside (left out of the view, or kept as last decoded); the watch goes on"
                );
            }
            None
        }
        Event::Delete(Lenient::Undecodable { meta, .. }) => {
            told.remove(&key(&meta));
            let name = meta.name.as_deref()?;
            let mut at = ObjectRef::<K>::new(name);
            if let Some(ns) = meta.namespace.as_deref() {
                at = at.within(ns);
            }
            view.get(&at).map(|k| Event::Delete((*k).clone()))
        }
    }
}

fn key(meta: &ObjectMeta) -> String {
    format!(
        "{}/{}",
        meta.namespace.as_deref().unwrap_or_default(),
        meta.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Pod;
    use kube::core::ObjectList;
    use kube::runtime::reflector;

    use super::*;

    fn pod(name: &str, start: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "shop", "resourceVersion": "7"},
            "spec": {"containers": []},
            "status": {"startTime": start}
        })
    }

    const TOO_LATE: &str = "9999-12-31T23:59:59.000000Z";

    #[test]
    fn one_object_that_cannot_be_decoded_leaves_the_rest_of_the_list() {
        let list = serde_json::json!({
            "apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "9"},
            "items": [pod("a", "2026-11-24T05:00:00Z"), pod("b", TOO_LATE), pod("c", "2026-11-24T05:00:00Z")]
        });
        assert!(serde_json::from_value::<ObjectList<Pod>>(list.clone()).is_err());
        let list: ObjectList<Lenient<Pod>> = serde_json::from_value(list).unwrap();
        let names: Vec<(String, bool)> = list
            .items
            .iter()
            .map(|o| {
                let decoded = matches!(o, Lenient::Decoded(_));
                (o.meta().name.clone().unwrap(), decoded)
            })
            .collect();
        assert_eq!(
            names,
            [("a".into(), true), ("b".into(), false), ("c".into(), true)]
        );
        let Lenient::Undecodable { meta, error } = &list.items[1] else {
            panic!("b decoded")
        };
        assert_eq!(meta.namespace.as_deref(), Some("shop"));
        assert!(!error.is_empty());
    }

    #[test]
    fn an_undecodable_object_is_left_out_until_its_deletion_removes_what_was_known() {
        let (view, mut writer) = reflector::store::<Pod>();
        let mut told = HashSet::new();
        let lenient = |v| serde_json::from_value::<Lenient<Pod>>(v).unwrap();
        let known: Pod = serde_json::from_value(pod("a", "2026-11-24T05:00:00Z")).unwrap();
        writer.apply_watcher_event(&Event::Apply(known.clone()));

        let changed = Event::Apply(lenient(pod("a", TOO_LATE)));
        assert!(decoded(changed.clone(), "Pod", &view, &mut told).is_none());
        assert!(decoded(changed, "Pod", &view, &mut told).is_none());
        assert_eq!(told.len(), 1, "said once");
        assert!(decoded(
            Event::InitApply(lenient(pod("b", TOO_LATE))),
            "Pod",
            &view,
            &mut told
        )
        .is_none());

        let gone = decoded(
            Event::Delete(lenient(pod("a", TOO_LATE))),
            "Pod",
            &view,
            &mut told,
        );
        let Some(Event::Delete(removed)) = gone else {
            panic!("{gone:?}")
        };
        assert_eq!(removed, known);
        assert!(
            decoded(
                Event::Delete(lenient(pod("z", TOO_LATE))),
                "Pod",
                &view,
                &mut told
            )
            .is_none(),
            "nothing known, nothing to remove"
        );
    }
}
