//! Pod lists (`kubectl get pods -o yaml|json`) for `nodegrace plan --pods`, read into what the
//! planner reads of each pod. Everything else is skipped as it is parsed, never built, so the
//! memory a list takes follows its pods' names and the labels the drain plan selects on, not
//! the size of the file; the number of pods is capped ([`MAX_PODS`]).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Pod, PodSpec, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use serde::de::{self, DeserializeOwned, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::plan::classify::{ClassifyError, HASH_ANNOTATION, MIRROR_ANNOTATION, SOURCE_ANNOTATION};
use crate::plan::{DrainPlanEntry, PodInfo};
use crate::yaml::{self, Duplicates, Reading};

/// The most pods a list may hold: far more than a node runs (the kubelet's `maxPods` is 110
/// by default), and what bounds the planner's work (at most 64 plan entries over these pods).
pub(crate) const MAX_PODS: usize = 100_000;

/// The largest YAML pod list read, and its most nodes (values, lists, maps): what the YAML
/// parser reads in well under a second on the optimized build (100,000 nodes, 0.2 to 0.3 s);
/// a node's 110 pods as `kubectl get -o yaml` writes them are about 1 MiB and 60,000 nodes.
/// Larger lists are read as JSON, whose parser streams.
pub(crate) const MAX_YAML_BYTES: usize = 2 * 1024 * 1024;
const READING: Reading = Reading {
    duplicates: Duplicates::Refused,
    max_nodes: 100_000,
};

/// Controller owner references kept of one pod; Kubernetes allows one.
const MAX_CONTROLLERS: usize = 16;

/// A pod of a list, as the plan reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedPod {
    pub info: PodInfo,
    pub node_name: Option<String>,
    pub phase: Option<String>,
}

impl ListedPod {
    pub fn from_pod(pod: &Pod) -> std::result::Result<ListedPod, ClassifyError> {
        Ok(ListedPod {
            info: PodInfo::from_pod(pod)?,
            // The apiserver takes an empty nodeName for none.
            node_name: pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .filter(|n| !n.is_empty()),
            phase: pod.status.as_ref().and_then(|s| s.phase.clone()),
        })
    }
}

/// The labels kept of each pod: the planner reads labels only through the plan's selectors.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum LabelKeys {
    #[default]
    All,
    Only(BTreeSet<String>),
}

impl LabelKeys {
    /// The keys the selectors of `plan` read.
    pub(crate) fn of_plan(plan: &[DrainPlanEntry]) -> LabelKeys {
        let mut keys = BTreeSet::new();
        for selector in plan.iter().filter_map(|e| e.pod_selector.as_ref()) {
            keys.extend(
                selector
                    .match_labels
                    .iter()
                    .flatten()
                    .map(|(k, _)| k.clone()),
            );
            keys.extend(
                selector
                    .match_expressions
                    .iter()
                    .flatten()
                    .map(|r| r.key.clone()),
            );
        }
        LabelKeys::Only(keys)
    }

    fn keeps(&self, key: &str) -> bool {
        match self {
            LabelKeys::All => true,
            LabelKeys::Only(keys) => keys.contains(key),
        }
    }
}

thread_local! {
    // serde's derived code has no way to hand the label keys down to `metadata.labels`; a
    // parse runs on one thread and sets them for its duration.
    static LABEL_KEYS: RefCell<LabelKeys> = const { RefCell::new(LabelKeys::All) };
}

struct KeysInScope(LabelKeys);

impl KeysInScope {
    fn set(keys: &LabelKeys) -> KeysInScope {
        KeysInScope(LABEL_KEYS.with(|k| k.replace(keys.clone())))
    }
}

impl Drop for KeysInScope {
    fn drop(&mut self) {
        LABEL_KEYS.with(|k| *k.borrow_mut() = std::mem::take(&mut self.0));
    }
}

/// Parses `kubectl get pods -o yaml` / `-o json` output: a v1 `List` of pods, a `PodList`, a
/// single `Pod`, or a stream of several JSON values or YAML documents made of those. Only the
/// labels `labels` names are kept. Each pod is classified here, so an error names its item.
pub fn parse_pod_list(text: &str, labels: &LabelKeys) -> Result<Vec<ListedPod>> {
    let _scope = KeysInScope::set(labels);
    let mut pods = Vec::new();
    let mut objects = 0;
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        let stream = serde_json::Deserializer::from_str(trimmed).into_iter::<Document>();
        for (i, doc) in stream.enumerate() {
            let what = || format!("JSON value {}", i + 1);
            let doc = doc.map_err(|e| anyhow::anyhow!("{}: {}", what(), json_fault(&e)))?;
            objects += 1;
            collect(doc, &mut pods).with_context(what)?;
        }
    } else {
        if trimmed.len() > MAX_YAML_BYTES {
            bail!(
                "a YAML pod list of {:.1} MiB: YAML is read up to {} MiB (its parser holds the whole document in memory); give it as JSON (kubectl get pods -o json), read up to the 64 MiB file cap",
                trimmed.len() as f64 / (1024.0 * 1024.0),
                MAX_YAML_BYTES / (1024 * 1024)
            );
        }
        let mut bytes = trimmed.as_bytes();
        for (i, doc) in yaml::each_document::<Document>(&mut bytes, READING).enumerate() {
            let what = || format!("YAML document {}", i + 1);
            let doc = doc.map_err(|e| match yaml::limit(&e) {
                Some(why) => {
                    anyhow::anyhow!("{why}: not read; give it as JSON (kubectl get pods -o json)")
                }
                None => anyhow::anyhow!("{}: {}", what(), crate::text::yaml_fault(&e)),
            })?;
            objects += 1;
            collect(doc, &mut pods).with_context(what)?;
        }
    }
    if objects == 0 {
        bail!("no Kubernetes objects in it; expected kubectl get pods -o yaml output");
    }
    Ok(pods)
}

/// A pod list may be any file `plan` was given (a key, a kubeconfig): its errors say where,
/// never what the file holds there.
fn json_fault(e: &serde_json::Error) -> String {
    crate::text::parse_fault(&e.to_string(), Some((e.line(), e.column())))
}

fn collect(doc: Document, out: &mut Vec<ListedPod>) -> Result<()> {
    let kind = doc.kind.clone().unwrap_or_default();
    match kind.as_str() {
        "Pod" => push(out, doc.without_items())?,
        "List" | "PodList" => {
            for (j, item) in doc
                .items
                .map(|i| i.0)
                .unwrap_or_default()
                .into_iter()
                .enumerate()
            {
                let Some(item) = item else {
                    bail!("items[{j}] is null, not a Pod");
                };
                // API PodList items carry no kind; kubectl's List items say Pod.
                let item_kind = match item.kind.as_deref() {
                    Some(k) => k,
                    None if kind == "PodList" => "Pod",
                    None => "",
                };
                if item_kind != "Pod" {
                    let what = if item_kind.is_empty() {
                        "an object without a kind".to_string()
                    } else {
                        a_kind(item_kind)
                    };
                    bail!("items[{j}] is {what}, not a Pod");
                }
                push(out, item).with_context(|| format!("items[{j}]"))?;
            }
        }
        "" => {
            bail!("not a Kubernetes object (no kind); expected a Pod, a PodList or a List of pods")
        }
        other => bail!("{}, not a Pod, PodList or List of pods", a_kind(other)),
    }
    Ok(())
}

/// "a ConfigMap": a kind is named only when it looks like one (a Kubernetes kind is a
/// CamelCase word), since the file may be anything, a key or a token among them.
fn a_kind(kind: &str) -> String {
    let looks_like_a_kind = kind.len() <= 63
        && kind.starts_with(|c: char| c.is_ascii_uppercase())
        && kind.chars().all(|c| c.is_ascii_alphanumeric());
    if looks_like_a_kind {
        format!("a {kind}")
    } else {
        "an object of another kind".to_string()
    }
}

fn push(out: &mut Vec<ListedPod>, raw: RawPod<IgnoredAny>) -> Result<()> {
    if out.len() >= MAX_PODS {
        bail!("more than {MAX_PODS} pods, more than a plan is made for");
    }
    out.push(ListedPod::from_pod(&raw.into_pod())?);
    Ok(())
}

/// A pod as read, or (`I` = [`Items`]) a list of them.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", bound = "I: DeserializeOwned")]
struct RawPod<I> {
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<RawMeta>,
    spec: Option<RawSpec>,
    status: Option<RawStatus>,
    items: Option<I>,
}

type Document = RawPod<Items>;

impl Document {
    fn without_items(self) -> RawPod<IgnoredAny> {
        RawPod {
            kind: self.kind,
            metadata: self.metadata,
            spec: self.spec,
            status: self.status,
            items: None,
        }
    }
}

impl RawPod<IgnoredAny> {
    /// The Pod [`PodInfo::from_pod`] classifies: only the fields it reads.
    fn into_pod(self) -> Pod {
        let meta = self.metadata.unwrap_or_default();
        Pod {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                labels: Some(meta.labels.0),
                annotations: Some(meta.annotations.0),
                owner_references: Some(meta.owner_references.0),
                deletion_timestamp: meta.deletion_timestamp,
                ..ObjectMeta::default()
            },
            spec: self.spec.map(|s| PodSpec {
                node_name: s.node_name,
                priority: s.priority,
                termination_grace_period_seconds: s.termination_grace_period_seconds,
                ..PodSpec::default()
            }),
            status: self.status.map(|s| PodStatus {
                phase: s.phase,
                ..PodStatus::default()
            }),
        }
    }
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawMeta {
    name: Option<String>,
    namespace: Option<String>,
    uid: Option<String>,
    #[serde(default)]
    labels: Labels,
    #[serde(default)]
    annotations: ClassifyingAnnotations,
    #[serde(default)]
    owner_references: Controllers,
    deletion_timestamp: Option<Time>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSpec {
    node_name: Option<String>,
    priority: Option<i32>,
    termination_grace_period_seconds: Option<i64>,
}

#[derive(Deserialize)]
struct RawStatus {
    phase: Option<String>,
}

/// `metadata.labels`, only the keys in scope ([`LABEL_KEYS`]).
#[derive(Default)]
struct Labels(BTreeMap<String, String>);

/// `metadata.annotations`, only those that make a pod static.
#[derive(Default)]
struct ClassifyingAnnotations(BTreeMap<String, String>);

/// `metadata.ownerReferences`, only the controllers.
#[derive(Default)]
struct Controllers(Vec<OwnerReference>);

/// `items`, at most [`MAX_PODS`] of them.
struct Items(Vec<Option<RawPod<IgnoredAny>>>);

/// A string map read entry by entry, keeping the entries `keep` selects (the others' values
/// are skipped unread); `null` is empty.
fn filtered_map<'de, D: Deserializer<'de>>(
    d: D,
    keep: impl Fn(&str) -> bool,
) -> std::result::Result<BTreeMap<String, String>, D::Error> {
    struct V<F>(F);
    impl<'de, F: Fn(&str) -> bool> Visitor<'de> for V<F> {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a map of strings")
        }
        fn visit_unit<E: de::Error>(self) -> std::result::Result<Self::Value, E> {
            Ok(BTreeMap::new())
        }
        fn visit_map<A: MapAccess<'de>>(
            self,
            mut map: A,
        ) -> std::result::Result<Self::Value, A::Error> {
            let mut kept = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                if (self.0)(&key) {
                    let value = map.next_value::<String>()?;
                    kept.insert(key, value);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(kept)
        }
    }
    d.deserialize_any(V(keep))
}

impl<'de> Deserialize<'de> for Labels {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        LABEL_KEYS.with(|keys| {
            let keys = keys.borrow();
            filtered_map(d, |k| keys.keeps(k)).map(Labels)
        })
    }
}

impl<'de> Deserialize<'de> for ClassifyingAnnotations {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        filtered_map(d, |k| {
            [MIRROR_ANNOTATION, SOURCE_ANNOTATION, HASH_ANNOTATION].contains(&k)
        })
        .map(ClassifyingAnnotations)
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawOwner {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    controller: Option<bool>,
}

impl<'de> Deserialize<'de> for Controllers {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Controllers;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of owner references")
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Controllers, E> {
                Ok(Controllers::default())
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Controllers, A::Error> {
                let mut kept = Vec::new();
                while let Some(owner) = seq.next_element::<RawOwner>()? {
                    if owner.controller != Some(true) {
                        continue;
                    }
                    if kept.len() == MAX_CONTROLLERS {
                        return Err(de::Error::custom(format_args!(
                            "more than {MAX_CONTROLLERS} controller owner references (Kubernetes allows one)"
                        )));
                    }
                    kept.push(OwnerReference {
                        api_version: owner.api_version,
                        kind: owner.kind,
                        controller: owner.controller,
                        ..OwnerReference::default()
                    });
                }
                Ok(Controllers(kept))
            }
        }
        d.deserialize_any(V)
    }
}

impl<'de> Deserialize<'de> for Items {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Items;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list of pods")
            }
            fn visit_unit<E: de::Error>(self) -> std::result::Result<Items, E> {
                Ok(Items(Vec::new()))
            }
            fn visit_seq<A: SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> std::result::Result<Items, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element()? {
                    if items.len() == MAX_PODS {
                        return Err(de::Error::custom(format_args!(
                            "more than {MAX_PODS} items, more than a plan is made for"
                        )));
                    }
                    items.push(item);
                }
                Ok(Items(items))
            }
        }
        d.deserialize_any(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::PodType;

    const JSON: &str = r#"{"apiVersion":"v1","items":[
      {"apiVersion":"v1","kind":"Pod","metadata":{"name":"web-1","namespace":"shop","uid":"u1",
        "labels":{"app":"web","tier":"front","pod-template-hash":"abc"},
        "annotations":{"kubectl.kubernetes.io/last-applied-configuration":"{\"big\":true}"},
        "managedFields":[{"manager":"kubectl","fieldsV1":{"f:metadata":{}}}],
        "ownerReferences":[{"apiVersion":"apps/v1","kind":"ReplicaSet","name":"web","uid":"r","controller":true}]},
       "spec":{"containers":[{"name":"web","image":"nginx","env":[{"name":"A","value":"b"}]}],
        "nodeName":"node-a","priority":100,"terminationGracePeriodSeconds":45},
       "status":{"phase":"Running","podIP":"10.0.0.1"}},
      {"apiVersion":"v1","kind":"Pod","metadata":{"name":"agent","namespace":"kube-system",
        "deletionTimestamp":"2026-11-24T05:00:00Z",
        "ownerReferences":[{"apiVersion":"apps/v1","kind":"DaemonSet","name":"agent","uid":"d","controller":true}]},
       "spec":{"nodeName":"node-a"},"status":{"phase":"Running"}},
      {"apiVersion":"v1","kind":"Pod","metadata":{"name":"etcd-node-a","namespace":"kube-system",
        "annotations":{"kubernetes.io/config.mirror":"h1","kubernetes.io/config.source":"file","other":"x"}},
       "spec":{"nodeName":"node-a","priority":2000001000},"status":{"phase":"Succeeded"}}
    ],"kind":"List","metadata":{"resourceVersion":""}}"#;

    #[test]
    fn a_list_is_read_as_the_planner_reads_it() {
        let only_tier = LabelKeys::Only(["tier".to_string()].into());
        let pods = parse_pod_list(JSON, &only_tier).expect("parses");
        assert_eq!(pods.len(), 3);
        let web = &pods[0];
        assert_eq!(web.info.key(), "shop/web-1");
        assert_eq!(web.info.uid, "u1");
        assert_eq!(web.info.priority, 100);
        assert_eq!(web.info.termination_grace_period_seconds, 45);
        assert_eq!(web.info.pod_type, PodType::Default);
        assert_eq!(
            web.info.labels,
            BTreeMap::from([("tier".to_string(), "front".to_string())])
        );
        assert_eq!(web.node_name.as_deref(), Some("node-a"));
        assert_eq!(web.phase.as_deref(), Some("Running"));
        assert_eq!(pods[1].info.pod_type, PodType::DaemonSet);
        assert!(pods[1].info.terminating);
        assert_eq!(pods[1].info.termination_grace_period_seconds, 30);
        assert_eq!(pods[2].info.pod_type, PodType::Static);
        assert_eq!(pods[2].info.static_hash.as_deref(), Some("h1"));
        assert!(pods[2].info.terminal);

        let all = parse_pod_list(JSON, &LabelKeys::All).expect("parses");
        assert_eq!(all[0].info.labels.len(), 3);
    }

    #[test]
    fn a_pod_read_from_a_list_is_the_pod_the_apiserver_would_give() {
        let value: serde_json::Value = serde_json::from_str(JSON).expect("JSON");
        let yaml = yaml::to_string(&value).expect("YAML");
        for text in [JSON, yaml.as_str()] {
            let listed = parse_pod_list(text, &LabelKeys::All).expect("parses");
            for (i, item) in value["items"].as_array().expect("items").iter().enumerate() {
                let pod: Pod = serde_json::from_value(item.clone()).expect("a pod");
                assert_eq!(listed[i], ListedPod::from_pod(&pod).expect("classifies"));
            }
        }
    }

    #[test]
    fn a_yaml_list_past_its_cap_is_refused_before_it_is_parsed_and_json_is_pointed_to() {
        let mut text = String::from("kind: PodList\nitems:\n- metadata: {name: p, namespace: n}\n");
        let comment = format!("#{}\n", "x".repeat(1022));
        while text.len() + comment.len() <= MAX_YAML_BYTES {
            text.push_str(&comment);
        }
        text.push_str(&"#".repeat(MAX_YAML_BYTES - text.len() - 1));
        text.push('\n');
        assert_eq!(text.len(), MAX_YAML_BYTES);
        assert_eq!(
            parse_pod_list(&text, &LabelKeys::All)
                .expect("at the cap")
                .len(),
            1
        );
        text.push('\n');
        let err = format!(
            "{:#}",
            parse_pod_list(&text, &LabelKeys::All).expect_err("over the YAML cap")
        );
        assert!(err.contains("kubectl get pods -o json"), "{err}");
    }

    #[test]
    fn a_yaml_list_past_its_nodes_is_refused_and_json_is_pointed_to() {
        let head = "kind: PodList\nitems:\n- metadata: {name: p, namespace: n}\n  x:\n";
        let list = |n: usize| format!("{head}{}", "  - a\n".repeat(n));
        // The head's nodes: the document, items, the item, metadata, x (maps and lists), 6
        // keys and 3 values.
        let most = READING.max_nodes - 14;
        assert_eq!(
            parse_pod_list(&list(most), &LabelKeys::All)
                .map(|p| p.len())
                .ok(),
            Some(1)
        );
        let err = format!(
            "{:#}",
            parse_pod_list(&list(most + 1), &LabelKeys::All).expect_err("over the nodes")
        );
        assert!(
            err.starts_with("more than 100000 values, lists and maps at line")
                && err.ends_with("not read; give it as JSON (kubectl get pods -o json)"),
            "{err}"
        );
    }

    #[test]
    fn a_list_of_more_pods_than_a_plan_is_made_for_is_refused() {
        let list = |n: usize| {
            let items = vec![r#"{"metadata":{"name":"p"}}"#; n].join(",");
            format!(r#"{{"kind":"PodList","items":[{items}]}}"#)
        };
        assert_eq!(
            parse_pod_list(&list(MAX_PODS), &LabelKeys::All)
                .expect("at the cap")
                .len(),
            MAX_PODS
        );
        let err = format!(
            "{:#}",
            parse_pod_list(&list(MAX_PODS + 1), &LabelKeys::All).expect_err("over the cap")
        );
        assert!(err.contains("more than 100000 items"), "{err}");
        let err = format!(
            "{:#}",
            parse_pod_list(&format!("{}\n{}", list(MAX_PODS), list(1)), &LabelKeys::All)
                .expect_err("over the cap")
        );
        assert!(err.contains("more than 100000 pods"), "{err}");
    }

    #[test]
    fn a_byte_order_mark_is_not_taken_for_content() {
        for text in [
            "\u{feff}{\"kind\":\"Pod\",\"metadata\":{\"name\":\"a\"}}",
            "\u{feff}kind: Pod\nmetadata: {name: a}\n",
        ] {
            let pods = parse_pod_list(text, &LabelKeys::All).expect("parses");
            assert_eq!(pods[0].info.key(), "default/a");
        }
        let err = format!(
            "{:#}",
            parse_pod_list("\u{feff}{\"kind\":\"Pod\"", &LabelKeys::All).expect_err("cut short")
        );
        assert!(err.starts_with("JSON value 1: EOF while parsing"), "{err}");
    }

    #[test]
    fn an_empty_node_name_is_no_binding() {
        let text = "kind: Pod\nmetadata: {name: a}\nspec: {nodeName: \"\"}\n";
        let pods = parse_pod_list(text, &LabelKeys::All).expect("parses");
        assert_eq!(pods[0].node_name, None);
    }
}
