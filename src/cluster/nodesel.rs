//! Which NodeMaintenances select this node: core `NodeSelector` semantics (terms ORed, the
//! requirements of a term ANDed, an empty term selects nothing), with `matchExpressions` on
//! the node's labels and `matchFields` on `metadata.name`, as the scheduler evaluates them.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSelector, NodeSelectorRequirement};

const NAME_FIELD: &str = "metadata.name";

/// Whether `selector` selects `node`. Malformed requirements select nothing.
pub(crate) fn selects(selector: &NodeSelector, node: &Node) -> bool {
    let empty = BTreeMap::new();
    let labels = node.metadata.labels.as_ref().unwrap_or(&empty);
    let name = node.metadata.name.as_deref().unwrap_or_default();
    selector.node_selector_terms.iter().any(|term| {
        let exprs = term.match_expressions.as_deref().unwrap_or_default();
        let fields = term.match_fields.as_deref().unwrap_or_default();
        if exprs.is_empty() && fields.is_empty() {
            return false;
        }
        exprs
            .iter()
            .all(|r| requirement_holds(r, labels.get(&r.key).map(String::as_str)))
            && fields
                .iter()
                .all(|r| r.key == NAME_FIELD && field_requirement_holds(r, name))
    })
}

fn field_requirement_holds(r: &NodeSelectorRequirement, value: &str) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    match r.operator.as_str() {
        "In" => values.len() == 1 && values[0] == value,
        "NotIn" => values.len() == 1 && values[0] != value,
        _ => false,
    }
}

fn requirement_holds(r: &NodeSelectorRequirement, value: Option<&str>) -> bool {
    let values = r.values.as_deref().unwrap_or_default();
    let number = |v: &str| v.parse::<i64>().ok();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.iter().any(|x| x == v)),
        "NotIn" => value.is_none_or(|v| !values.iter().any(|x| x == v)),
        "Exists" => values.is_empty() && value.is_some(),
        "DoesNotExist" => values.is_empty() && value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), [bound]) = (value.and_then(number), values) else {
                return false;
            };
            let Some(bound) = number(bound) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// A label selector (list query) for the nodes `selector` may select: exact for a single
/// term of `In`/`NotIn`/`Exists`/`DoesNotExist` label requirements; None when the apiserver
/// cannot narrow it down (several terms, `Gt`/`Lt`, field requirements), and every node
/// must be read. Either way [`selects`] decides.
pub(crate) fn label_query(selector: &NodeSelector) -> Option<String> {
    let [term] = selector.node_selector_terms.as_slice() else {
        return None;
    };
    if term.match_fields.as_ref().is_some_and(|f| !f.is_empty()) {
        return None;
    }
    let exprs = term.match_expressions.as_deref().unwrap_or_default();
    if exprs.is_empty() {
        return None;
    }
    let parts: Option<Vec<String>> = exprs
        .iter()
        .map(|r| {
            let values = r.values.as_deref().unwrap_or_default().join(",");
            match r.operator.as_str() {
                "In" => Some(format!("{} in ({values})", r.key)),
                "NotIn" => Some(format!("{} notin ({values})", r.key)),
                "Exists" => Some(r.key.clone()),
                "DoesNotExist" => Some(format!("!{}", r.key)),
                _ => None,
            }
        })
        .collect();
    parts.map(|p| p.join(","))
}

/// The exact set of nodes a selector names, when every term pins `metadata.name` (as the
/// shutdown maintenance does); None when it selects by labels and so the set is open.
pub(crate) fn exact_nodes(selector: &NodeSelector) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for term in &selector.node_selector_terms {
        if term
            .match_expressions
            .as_ref()
            .is_some_and(|e| !e.is_empty())
        {
            return None;
        }
        let fields = term.match_fields.as_deref().unwrap_or_default();
        let pin = fields
            .iter()
            .find(|r| r.key == NAME_FIELD && r.operator == "In")?;
        for v in pin.values.iter().flatten() {
            if !names.contains(v) {
                names.push(v.clone());
            }
        }
    }
    Some(names)
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSelectorTerm;

    fn node(name: &str, labels: &[(&str, &str)]) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n
    }

    fn req(key: &str, op: &str, values: &[&str]) -> NodeSelectorRequirement {
        NodeSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: Some(values.iter().map(|v| v.to_string()).collect()),
        }
    }

    fn sel(
        terms: Vec<(Vec<NodeSelectorRequirement>, Vec<NodeSelectorRequirement>)>,
    ) -> NodeSelector {
        NodeSelector {
            node_selector_terms: terms
                .into_iter()
                .map(|(e, f)| NodeSelectorTerm {
                    match_expressions: Some(e),
                    match_fields: Some(f),
                })
                .collect(),
        }
    }

    #[test]
    fn terms_are_ored_and_requirements_anded() {
        let n = node("one", &[("zone", "a"), ("gen", "5")]);
        let s = sel(vec![
            (vec![req("zone", "In", &["b"])], vec![]),
            (
                vec![req("zone", "In", &["a"]), req("gen", "Gt", &["4"])],
                vec![],
            ),
        ]);
        assert!(selects(&s, &n));
        let s = sel(vec![(
            vec![req("zone", "In", &["a"]), req("gen", "Lt", &["4"])],
            vec![],
        )]);
        assert!(!selects(&s, &n));
        assert!(
            !selects(&sel(vec![(vec![], vec![])]), &n),
            "an empty term selects nothing"
        );
        assert!(!selects(&sel(vec![]), &n));
    }

    #[test]
    fn operators() {
        let n = node("one", &[("zone", "a")]);
        assert!(selects(
            &sel(vec![(vec![req("zone", "Exists", &[])], vec![])]),
            &n
        ));
        assert!(selects(
            &sel(vec![(vec![req("rack", "DoesNotExist", &[])], vec![])]),
            &n
        ));
        assert!(selects(
            &sel(vec![(vec![req("rack", "NotIn", &["x"])], vec![])]),
            &n
        ));
        assert!(!selects(
            &sel(vec![(vec![req("zone", "NotIn", &["a"])], vec![])]),
            &n
        ));
        assert!(!selects(
            &sel(vec![(vec![req("zone", "Gt", &["x"])], vec![])]),
            &n
        ));
        assert!(!selects(
            &sel(vec![(vec![req("zone", "Bogus", &["a"])], vec![])]),
            &n
        ));
    }

    #[test]
    fn match_fields_pins_the_name() {
        let n = node("one", &[]);
        let pinned = crate::api::node_selector_for("one");
        assert!(selects(&pinned, &n));
        assert!(!selects(&pinned, &node("two", &[])));
        assert_eq!(exact_nodes(&pinned), Some(vec!["one".to_string()]));
        let labelled = sel(vec![(vec![req("zone", "In", &["a"])], vec![])]);
        assert_eq!(exact_nodes(&labelled), None);
        let other_field = sel(vec![(
            vec![],
            vec![req("spec.unschedulable", "In", &["true"])],
        )]);
        assert!(!selects(&other_field, &n));
    }

    #[test]
    fn a_single_label_term_becomes_a_list_query() {
        let sel: NodeSelector = serde_json::from_value(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [
                {"key": "pool", "operator": "In", "values": ["blue", "green"]},
                {"key": "gpu", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "Exists"}]}]}))
        .unwrap();
        assert_eq!(
            label_query(&sel).as_deref(),
            Some("pool in (blue,green),!gpu,zone")
        );
        let gt: NodeSelector = serde_json::from_value(serde_json::json!({"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "rank", "operator": "Gt", "values": ["3"]}]}]}))
        .unwrap();
        assert_eq!(label_query(&gt), None);
    }
}
