//! Lists read one object at a time, for the commands: an object that cannot be decoded (a
//! date past what the API types hold, a field of another type) is set aside with one line
//! naming it instead of failing the whole list, and paging is bounded.

use std::collections::HashSet;

use anyhow::{Context, Result};
use kube::api::ListParams;
use kube::Resource;
use serde::de::DeserializeOwned;

/// How much one listing reads at most; past it, what was read is kept and a line says so.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps {
    pub pages: usize,
    pub bytes: usize,
}

impl Caps {
    /// A list of one node's objects (its pods, the maintenances that may select it), which
    /// the apiserver answers in one page: a few pages and one answer's bytes at most.
    pub(crate) const NODE: Caps = Caps {
        pages: 10,
        bytes: crate::cluster::bounded::MAX_ANSWER_BYTES,
    };
}

/// One list answer, its items left undecoded.
#[derive(serde::Deserialize)]
struct RawList {
    #[serde(default)]
    metadata: RawListMeta,
    #[serde(default)]
    items: Vec<serde_json::Value>,
}

#[derive(serde::Deserialize, Default)]
struct RawListMeta {
    #[serde(rename = "continue", default)]
    continue_: Option<String>,
}

/// Hands each object of the list `params` asks for (in `namespace`, or the whole cluster) to
/// `each`, page after page. Paging stops at a token already sent, at an empty page that
/// still has a token, and at `caps`: each said on one line, and what was read is kept.
pub(crate) async fn list_each<K>(
    client: &kube::Client,
    namespace: Option<&str>,
    params: &ListParams,
    caps: Caps,
    mut each: impl FnMut(K),
) -> Result<()>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let kind = K::kind(&());
    let request = kube::core::Request::new(K::url_path(&(), namespace));
    let mut params = params.clone();
    let mut sent = HashSet::new();
    let (mut pages, mut bytes) = (0, 0);
    loop {
        let req = request
            .list(&params)
            .with_context(|| format!("building the list of {kind}"))?;
        let text = client.request_text(req).await?;
        pages += 1;
        bytes += text.len();
        let list: RawList = serde_json::from_str(&text)
            .map_err(|e| anyhow::anyhow!("the list of {kind} cannot be read: {e}"))?;
        drop(text);
        let empty = list.items.is_empty();
        for item in list.items {
            match K::deserialize(&item) {
                Ok(object) => each(object),
                Err(e) => set_aside(&kind, &item, &e),
            }
        }
        let Some(token) = list.metadata.continue_.filter(|t| !t.is_empty()) else {
            return Ok(());
        };
        let stop = if empty {
            Some("the apiserver answered an empty page that says more follow")
        } else if !sent.insert(token.clone()) {
            Some("the apiserver sent a continue token a second time")
        } else if pages >= caps.pages {
            Some("the most pages read for one list")
        } else if bytes >= caps.bytes {
            Some("the most bytes read for one list")
        } else {
            None
        };
        if let Some(why) = stop {
            tracing::warn!(
                "listing {kind}: stopped after {pages} page(s) ({} KiB): {why}; what was read is shown",
                bytes >> 10
            );
            return Ok(());
        }
        params = params.continue_token(&token);
    }
}

/// [`list_each`] into a list.
pub(crate) async fn list_all<K>(
    client: &kube::Client,
    namespace: Option<&str>,
    params: &ListParams,
    caps: Caps,
) -> Result<Vec<K>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let mut all = Vec::new();
    list_each(client, namespace, params, caps, |o| all.push(o)).await?;
    Ok(all)
}

/// The object `name` (in `namespace`, or cluster-scoped): None when there is none, or when it
/// cannot be decoded (said on one line, as for a list).
pub(crate) async fn get_opt<K>(
    client: &kube::Client,
    namespace: Option<&str>,
    name: &str,
) -> Result<Option<K>>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    use crate::cluster::gateway::{reply, Kind};
    let kind = K::kind(&());
    let req = kube::core::Request::new(K::url_path(&(), namespace))
        .get(name, &kube::api::GetParams::default())
        .with_context(|| format!("building the read of {kind} {name}"))?;
    let text = match reply(client.request_text(req).await) {
        Ok(text) => text,
        Err(f) if f.is(Kind::NotFound) => return Ok(None),
        Err(f) => return Err(f.into()),
    };
    let item: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{kind} {name} cannot be read: {e}"))?;
    match K::deserialize(&item) {
        Ok(object) => Ok(Some(object)),
        Err(e) => {
            set_aside(&kind, &item, &e);
            Ok(None)
        }
    }
}

/// One line for an object that cannot be decoded: its kind, namespace and name, and why.
fn set_aside(kind: &str, item: &serde_json::Value, error: &serde_json::Error) {
    let field = |f: &str| {
        item.pointer(&format!("/metadata/{f}"))
            .and_then(serde_json::Value::as_str)
            .map(|s| crate::text::escape(&crate::text::clip(s)).into_owned())
    };
    let name = match (field("namespace"), field("name")) {
        (Some(ns), Some(name)) => format!("{ns}/{name}"),
        (None, Some(name)) => name,
        (_, None) => "(without a name)".to_string(),
    };
    tracing::warn!(
        "{kind} {name} cannot be decoded and is left out: {}",
        crate::text::escape(&crate::text::clip(&error.to_string()))
    );
}
