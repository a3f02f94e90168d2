//! The two servers of the EvictionRequest/Eviction shapes of Kubernetes 1.37: the in-tree
//! `lifecycle.k8s.io/v1alpha1` API and nodegrace's `lifecycle.nodegrace.dev/v1alpha1` CRDs.
//! Objects are read and written as [`DynamicObject`]s of the chosen group and handled as
//! k8s-openapi's in-tree types, so one requester and one controller serve both.

use anyhow::{Context, Result};
use k8s_openapi::api::lifecycle::v1alpha1::{Eviction, EvictionRequest};
use kube::api::{ApiResource, DynamicObject};
use kube::{Api, Client};
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::api::lifecycle as ours;

const IN_TREE_API_VERSION: &str = "lifecycle.k8s.io/v1alpha1";

#[derive(Debug, Clone)]
pub(crate) struct LifecycleApi {
    requests: ApiResource,
    evictions: ApiResource,
}

impl LifecycleApi {
    /// `lifecycle.k8s.io/v1alpha1`, served by Kubernetes 1.37 with the `EvictionRequestAPI` gate.
    pub(crate) fn in_tree() -> Self {
        Self {
            requests: ApiResource::erase::<EvictionRequest>(&()),
            evictions: ApiResource::erase::<Eviction>(&()),
        }
    }

    /// nodegrace's CRDs of the same shapes.
    pub(crate) fn nodegrace() -> Self {
        Self {
            requests: ApiResource::erase::<ours::EvictionRequest>(&()),
            evictions: ApiResource::erase::<ours::Eviction>(&()),
        }
    }

    pub(crate) fn request_resource(&self) -> ApiResource {
        self.requests.clone()
    }

    pub(crate) fn eviction_resource(&self) -> ApiResource {
        self.evictions.clone()
    }

    /// Whether the pod API beside it has `spec.evictionResponders` (the in-tree API of 1.37);
    /// before, pods declare responders in an annotation.
    pub(crate) fn pod_field_served(&self) -> bool {
        self.requests.api_version == IN_TREE_API_VERSION
    }

    /// The group, for log lines and messages.
    pub(crate) fn group(&self) -> &str {
        &self.requests.group
    }

    pub(crate) fn requests(&self, client: &Client, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &self.requests),
            None => Api::all_with(client.clone(), &self.requests),
        }
    }

    pub(crate) fn evictions(&self, client: &Client, namespace: Option<&str>) -> Api<DynamicObject> {
        match namespace {
            Some(ns) => Api::namespaced_with(client.clone(), ns, &self.evictions),
            None => Api::all_with(client.clone(), &self.evictions),
        }
    }

    /// `object` (an in-tree type) as an object of this API.
    pub(crate) fn to_dynamic<T: Serialize>(&self, object: &T) -> Result<DynamicObject> {
        let mut value = serde_json::to_value(object).context("serializing a lifecycle object")?;
        value["apiVersion"] = self.requests.api_version.clone().into();
        serde_json::from_value(value).context("converting a lifecycle object")
    }
}

/// An object of either API as the in-tree type `T`.
pub(crate) fn typed<T: DeserializeOwned>(object: &DynamicObject) -> Result<T> {
    let mut value = serde_json::to_value(object).context("serializing a lifecycle object")?;
    value["apiVersion"] = IN_TREE_API_VERSION.into();
    serde_json::from_value(value).with_context(|| {
        format!(
            "reading {} {} as a lifecycle object",
            object.types.as_ref().map_or("", |t| t.kind.as_str()),
            object.metadata.name.as_deref().unwrap_or_default()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::lifecycle::v1alpha1::{
        EvictionRequestPodReference, EvictionRequestSpec, EvictionRequestTarget,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn a_request_written_to_either_api_reads_back_the_same() {
        let request = EvictionRequest {
            metadata: ObjectMeta {
                name: Some("nodegrace-u1".into()),
                namespace: Some("ns".into()),
                ..ObjectMeta::default()
            },
            spec: EvictionRequestSpec {
                intent: "Eviction".into(),
                requester: "nodegrace.dev/a".into(),
                target: EvictionRequestTarget {
                    pod: Some(EvictionRequestPodReference {
                        name: "p".into(),
                        uid: "u1".into(),
                    }),
                },
            },
            status: None,
        };
        for (api, version) in [
            (LifecycleApi::in_tree(), "lifecycle.k8s.io/v1alpha1"),
            (
                LifecycleApi::nodegrace(),
                "lifecycle.nodegrace.dev/v1alpha1",
            ),
        ] {
            let written = api.to_dynamic(&request).unwrap();
            assert_eq!(
                written.types.as_ref().map(|t| t.api_version.as_str()),
                Some(version)
            );
            assert_eq!(typed::<EvictionRequest>(&written).unwrap(), request);
        }
        assert_eq!(LifecycleApi::nodegrace().group(), "lifecycle.nodegrace.dev");
    }
}
