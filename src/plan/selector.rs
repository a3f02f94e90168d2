//! Kubernetes label selectors (`matchLabels` + `matchExpressions`), validated and compiled so
//! that matching cannot fail and two spellings of the same selector compare equal.

use std::cmp::Ordering;
use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};

use super::names;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    #[error("label key {key:?} is invalid: {reason}")]
    InvalidKey { key: String, reason: String },
    #[error("label value {value:?} for key {key:?} is invalid: {reason}")]
    InvalidValue {
        key: String,
        value: String,
        reason: String,
    },
    #[error("operator {operator:?} for key {key:?} is not one of In, NotIn, Exists, DoesNotExist")]
    UnknownOperator { key: String, operator: String },
    #[error("operator {operator} for key {key:?} needs at least one value")]
    MissingValues { key: String, operator: Operator },
    #[error("operator {operator} for key {key:?} takes no values")]
    UnexpectedValues { key: String, operator: Operator },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Operator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Operator::In => "In",
            Operator::NotIn => "NotIn",
            Operator::Exists => "Exists",
            Operator::DoesNotExist => "DoesNotExist",
        })
    }
}

/// One canonical requirement: values sorted and deduplicated.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Requirement {
    pub key: String,
    pub operator: Operator,
    pub values: Vec<String>,
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.operator {
            Operator::In => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            // As in Kubernetes, NotIn also matches objects without the label.
            Operator::NotIn => value.is_none_or(|v| !self.values.iter().any(|x| x == v)),
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

/// A validated label selector. Equality, ordering and hashing use the canonical requirements,
/// so `matchLabels: {app: db}` equals `matchExpressions: [{key: app, operator: In, values: [db]}]`.
/// The original spelling is kept for writing it back into API objects.
#[derive(Debug, Clone)]
pub(crate) struct Selector {
    requirements: Vec<Requirement>,
    original: LabelSelector,
}

impl Selector {
    /// Validates and compiles a selector. An invalid selector is an error, never a silent match.
    pub(crate) fn compile(selector: &LabelSelector) -> Result<Selector, SelectorError> {
        let mut requirements = Vec::new();
        for (key, value) in selector.match_labels.iter().flatten() {
            validate_key(key)?;
            validate_value(key, value)?;
            requirements.push(Requirement {
                key: key.clone(),
                operator: Operator::In,
                values: vec![value.clone()],
            });
        }
        for req in selector.match_expressions.iter().flatten() {
            requirements.push(compile_requirement(req)?);
        }
        requirements.sort();
        requirements.dedup();
        Ok(Selector {
            requirements,
            original: selector.clone(),
        })
    }

    /// True for a selector without requirements: it selects everything.
    pub(crate) fn is_everything(&self) -> bool {
        self.requirements.is_empty()
    }

    pub(crate) fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// The selector as it was written.
    pub(crate) fn label_selector(&self) -> &LabelSelector {
        &self.original
    }
}

impl PartialEq for Selector {
    fn eq(&self, other: &Self) -> bool {
        self.requirements == other.requirements
    }
}
impl Eq for Selector {}
impl PartialOrd for Selector {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Selector {
    fn cmp(&self, other: &Self) -> Ordering {
        self.requirements.cmp(&other.requirements)
    }
}
impl std::hash::Hash for Selector {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.requirements.hash(state)
    }
}

/// kubectl-like text: `app=db,tier in (a,b),!legacy`.
impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.requirements.is_empty() {
            return f.write_str("<everything>");
        }
        let parts: Vec<String> = self
            .requirements
            .iter()
            .map(|r| match r.operator {
                Operator::In if r.values.len() == 1 => format!("{}={}", r.key, r.values[0]),
                Operator::In => format!("{} in ({})", r.key, r.values.join(",")),
                Operator::NotIn => format!("{} notin ({})", r.key, r.values.join(",")),
                Operator::Exists => r.key.clone(),
                Operator::DoesNotExist => format!("!{}", r.key),
            })
            .collect();
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
/// Matches `labels` against a raw selector, validating it first.
pub(crate) fn selector_matches(
    selector: &LabelSelector,
    labels: &BTreeMap<String, String>,
) -> Result<bool, SelectorError> {
    Ok(Selector::compile(selector)?.matches(labels))
}

fn compile_requirement(req: &LabelSelectorRequirement) -> Result<Requirement, SelectorError> {
    validate_key(&req.key)?;
    let operator = match req.operator.as_str() {
        "In" => Operator::In,
        "NotIn" => Operator::NotIn,
        "Exists" => Operator::Exists,
        "DoesNotExist" => Operator::DoesNotExist,
        other => {
            return Err(SelectorError::UnknownOperator {
                key: req.key.clone(),
                operator: other.to_string(),
            })
        }
    };
    let mut values = req.values.clone().unwrap_or_default();
    match operator {
        Operator::In | Operator::NotIn if values.is_empty() => {
            return Err(SelectorError::MissingValues {
                key: req.key.clone(),
                operator,
            })
        }
        Operator::Exists | Operator::DoesNotExist if !values.is_empty() => {
            return Err(SelectorError::UnexpectedValues {
                key: req.key.clone(),
                operator,
            })
        }
        _ => {}
    }
    for value in &values {
        validate_value(&req.key, value)?;
    }
    values.sort();
    values.dedup();
    Ok(Requirement {
        key: req.key.clone(),
        operator,
        values,
    })
}

fn check_name(name: &str) -> Result<(), String> {
    if names::is_label_name(name) {
        Ok(())
    } else {
        Err("must be 1 to 63 alphanumerics, '-', '_' or '.', alphanumeric at both ends".into())
    }
}

fn check_prefix(prefix: &str) -> Result<(), String> {
    if names::is_dns_subdomain(prefix) {
        Ok(())
    } else {
        Err("prefix must be a lowercase DNS subdomain of at most 253 characters".into())
    }
}

fn validate_key(key: &str) -> Result<(), SelectorError> {
    let invalid = |reason: String| SelectorError::InvalidKey {
        key: key.to_string(),
        reason,
    };
    match key.split_once('/') {
        Some((prefix, name)) => {
            check_prefix(prefix).map_err(invalid)?;
            check_name(name).map_err(invalid)
        }
        None => check_name(key).map_err(invalid),
    }
}

fn validate_value(key: &str, value: &str) -> Result<(), SelectorError> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value).map_err(|reason| SelectorError::InvalidValue {
        key: key.to_string(),
        value: value.to_string(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: Option<&[&str]>) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: values.map(|v| v.iter().map(|s| s.to_string()).collect()),
        }
    }

    fn sel(ml: &[(&str, &str)], exprs: Vec<LabelSelectorRequirement>) -> LabelSelector {
        LabelSelector {
            match_labels: if ml.is_empty() {
                None
            } else {
                Some(labels(ml))
            },
            match_expressions: if exprs.is_empty() { None } else { Some(exprs) },
        }
    }

    #[test]
    fn match_labels_need_every_pair() {
        let s = sel(&[("app", "db"), ("tier", "backend")], vec![]);
        assert!(selector_matches(
            &s,
            &labels(&[("app", "db"), ("tier", "backend"), ("x", "y")])
        )
        .unwrap());
        assert!(!selector_matches(&s, &labels(&[("app", "db")])).unwrap());
        assert!(!selector_matches(&s, &labels(&[("app", "web"), ("tier", "backend")])).unwrap());
    }

    #[test]
    fn each_operator_follows_kubernetes() {
        let l = labels(&[("app", "db")]);
        let none = labels(&[]);
        let s_in = sel(&[], vec![expr("app", "In", Some(&["db", "cache"]))]);
        assert!(selector_matches(&s_in, &l).unwrap());
        assert!(!selector_matches(&s_in, &none).unwrap());
        let s_notin = sel(&[], vec![expr("app", "NotIn", Some(&["db"]))]);
        assert!(!selector_matches(&s_notin, &l).unwrap());
        assert!(
            selector_matches(&s_notin, &none).unwrap(),
            "NotIn matches a missing label"
        );
        let s_exists = sel(&[], vec![expr("app", "Exists", None)]);
        assert!(selector_matches(&s_exists, &l).unwrap());
        assert!(!selector_matches(&s_exists, &none).unwrap());
        let s_dne = sel(&[], vec![expr("app", "DoesNotExist", Some(&[]))]);
        assert!(!selector_matches(&s_dne, &l).unwrap());
        assert!(selector_matches(&s_dne, &none).unwrap());
    }

    #[test]
    fn empty_selector_selects_everything() {
        let s = Selector::compile(&LabelSelector::default()).unwrap();
        assert!(s.is_everything());
        assert!(s.matches(&labels(&[("a", "b")])));
    }

    #[test]
    fn invalid_selectors_are_errors() {
        let bad = [
            sel(&[], vec![expr("app", "Equals", Some(&["db"]))]),
            sel(&[], vec![expr("app", "In", None)]),
            sel(&[], vec![expr("app", "NotIn", Some(&[]))]),
            sel(&[], vec![expr("app", "Exists", Some(&["x"]))]),
            sel(&[("-app", "db")], vec![]),
            sel(&[("app", "db!")], vec![]),
            sel(&[("Example.com/app", "db")], vec![]),
            sel(&[("a/b/c", "db")], vec![]),
            sel(&[(&"x".repeat(64), "db")], vec![]),
        ];
        for s in bad {
            assert!(Selector::compile(&s).is_err(), "{s:?} must be rejected");
            assert!(selector_matches(&s, &labels(&[("app", "db")])).is_err());
        }
        assert!(Selector::compile(&sel(&[("example.com/app", "")], vec![])).is_ok());
    }

    #[test]
    fn equivalent_spellings_are_equal() {
        let a = Selector::compile(&sel(&[("app", "db")], vec![])).unwrap();
        let b = Selector::compile(&sel(&[], vec![expr("app", "In", Some(&["db", "db"]))])).unwrap();
        assert_eq!(a, b);
        assert_eq!(a.to_string(), "app=db");
        let c = Selector::compile(&sel(
            &[],
            vec![
                expr("app", "In", Some(&["b", "a"])),
                expr("x", "DoesNotExist", None),
            ],
        ))
        .unwrap();
        assert_eq!(c.to_string(), "app in (a,b),!x");
    }
}
