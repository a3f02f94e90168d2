//! YAML as nodegrace reads it: serde-saphyr, within limits of its own. Its parser takes time
//! in proportion to the nodes (values, lists, maps) it reads, whatever their nesting (libyaml
//! took the square of flow nesting), so a budget of nodes bounds the time a file takes:
//! 100,000 took 0.2 to 0.3 s on the optimized build, about 2 s unoptimized.

use serde::de::DeserializeOwned;
use serde_saphyr::budget::BudgetBreach;
use serde_saphyr::{DuplicateKeyPolicy, Error};

/// Lists and maps nested, block and flow together: deeper than any Kubernetes object (a pod
/// is about 10 levels), and within a 2 MiB thread stack on an unoptimized build (96 is not).
pub(crate) const MAX_DEPTH: usize = 64;
/// The nodes of a configuration file or a manifest: a kubelet's configuration has about 150,
/// a pod a few hundred.
pub(crate) const MAX_FILE_NODES: usize = 50_000;

/// How a key given twice in one mapping is taken.
#[derive(Clone, Copy)]
pub(crate) enum Duplicates {
    Refused,
    LastWins,
}

/// How a text is read: what a key given twice means, and the most nodes.
#[derive(Clone, Copy)]
pub(crate) struct Reading {
    pub duplicates: Duplicates,
    pub max_nodes: usize,
}

impl Reading {
    pub(crate) const fn file(duplicates: Duplicates) -> Reading {
        Reading {
            duplicates,
            max_nodes: MAX_FILE_NODES,
        }
    }
}

fn options(reading: Reading) -> serde_saphyr::Options {
    serde_saphyr::options! {
        budget: serde_saphyr::budget! {
            max_depth: MAX_DEPTH,
            // Its parser looks ahead through flow collections, before the depth is counted.
            flow_nesting_limit: MAX_DEPTH,
            max_nodes: reading.max_nodes,
        },
        duplicate_keys: match reading.duplicates {
            Duplicates::Refused => DuplicateKeyPolicy::Error,
            Duplicates::LastWins => DuplicateKeyPolicy::LastWins,
        },
        // Its snippet quotes the file's lines, a secret among them.
        with_snippet: false,
    }
}

/// `bytes`, one document: UTF-8, or UTF-16 after its byte order mark.
pub(crate) fn from_slice<T: DeserializeOwned>(bytes: &[u8], reading: Reading) -> Result<T, Error> {
    serde_saphyr::from_slice_with_options(bytes, options(reading))
}

/// Every document of `text` (an empty one is none).
pub(crate) fn documents<T: DeserializeOwned>(
    text: &str,
    reading: Reading,
) -> Result<Vec<T>, Error> {
    serde_saphyr::from_multiple_with_options(text, options(reading))
}

/// The documents of `text` one by one, read as they are taken (empty ones skipped).
pub(crate) fn each_document<'a, T: DeserializeOwned + 'a>(
    text: &'a mut &'a [u8],
    reading: Reading,
) -> impl Iterator<Item = Result<T, Error>> + 'a {
    serde_saphyr::read_with_options(text, options(reading))
}

/// The first document of `text`; the ones after its `---` are not read. None: no document.
pub(crate) fn first_document<T: DeserializeOwned>(
    text: &str,
    reading: Reading,
) -> Option<Result<T, Error>> {
    each_document(&mut text.as_bytes(), reading).next()
}

/// Why `e` is one of nodegrace's limits (the text was not read), with where; None when the
/// text is not YAML or not of the shape read.
pub(crate) fn limit(e: &Error) -> Option<String> {
    let e = e.without_snippet();
    let why = match e {
        Error::Budget {
            breach: BudgetBreach::Depth { .. },
            ..
        } => format!("lists and maps nested deeper than {MAX_DEPTH} levels"),
        Error::Budget {
            breach: BudgetBreach::Nodes { nodes },
            ..
        } => format!("more than {} values, lists and maps", nodes - 1),
        Error::Budget { .. } => "past a limit of the YAML read (aliases, documents, size)".into(),
        _ if e.to_string().starts_with("recursion limit exceeded") => {
            format!("flow collections nested deeper than {MAX_DEPTH} levels")
        }
        _ => return None,
    };
    Some(match e.location() {
        Some(l) => format!("{why} at line {} column {}", l.line(), l.column()),
        None => why,
    })
}

/// `value` as YAML.
pub(crate) fn to_string<T: serde::Serialize>(
    value: &T,
) -> Result<String, serde_saphyr::SerializeError> {
    // Long strings stay on one line, as kubectl and the files written before write them.
    let options = serde_saphyr::ser_options! { folded_wrap_chars: usize::MAX };
    serde_saphyr::to_string_with_options(value, options)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn from_str<T: DeserializeOwned>(text: &str, duplicates: Duplicates) -> Result<T, Error> {
        from_slice(text.as_bytes(), Reading::file(duplicates))
    }

    fn refused(text: &str) -> String {
        let e = from_str::<serde_json::Value>(text, Duplicates::Refused)
            .err()
            .unwrap_or_else(|| panic!("{text:.80} was read"));
        limit(&e).unwrap_or_else(|| panic!("not a limit: {e}"))
    }

    #[test]
    fn nesting_is_refused_where_it_passes_the_limit() {
        let deep = format!("a: {}", "[".repeat(1 << 20));
        assert_eq!(
            refused(&deep),
            "flow collections nested deeper than 64 levels at line 1 column 68"
        );
        let deep = format!("a: {}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(
            refused(&deep),
            "lists and maps nested deeper than 64 levels at line 1 column 67"
        );
        let ok = format!(
            "a: {}{}",
            "[".repeat(MAX_DEPTH - 1),
            "]".repeat(MAX_DEPTH - 1)
        );
        assert!(from_str::<serde_json::Value>(&ok, Duplicates::Refused).is_ok());
        let json = format!("{}\n{}", "{\"a\":".repeat(70), "}".repeat(70));
        assert!(refused(&json).contains("nested deeper than 64 levels"));
        let block = |levels: usize| {
            (0..levels)
                .map(|i| format!("{}- \n", " ".repeat(i * 2)))
                .collect::<String>()
        };
        // On a test's thread, of the 2 MiB stack a tokio worker has.
        assert!(from_str::<serde_json::Value>(&block(MAX_DEPTH), Duplicates::Refused).is_ok());
        assert!(refused(&block(MAX_DEPTH + 1)).starts_with("lists and maps nested deeper than 64"));
    }

    #[test]
    fn brackets_that_are_text_are_read_as_text() {
        let texts = [
            format!("msg: a{}\n", "[".repeat(100)),
            format!("msg: \"{}\"\n", "[".repeat(100)),
            format!("# {}\nk: v\n", "[".repeat(100)),
            format!("script: |\n  {}\n  x\nnext: [1]\n", "[".repeat(100)),
        ];
        for t in &texts {
            assert!(
                from_str::<serde_json::Value>(t, Duplicates::Refused).is_ok(),
                "{t}"
            );
        }
    }

    #[test]
    fn nodes_past_the_budget_are_refused_where_they_pass_it() {
        let most = "- a\n".repeat(MAX_FILE_NODES - 1);
        assert!(from_str::<serde_json::Value>(&most, Duplicates::Refused).is_ok());
        assert_eq!(
            refused(&format!("{most}- a\n")),
            format!("more than 50000 values, lists and maps at line {MAX_FILE_NODES} column 3")
        );
    }

    #[test]
    fn a_megabyte_of_brackets_is_refused_at_once() {
        let start = std::time::Instant::now();
        assert!(refused(&"[".repeat(1 << 20)).contains("nested deeper than 64 levels"));
        assert!(refused(&"{\"a\":".repeat(1 << 18)).contains("nested deeper than 64 levels"));
        assert!(start.elapsed() < std::time::Duration::from_millis(200));
    }

    #[test]
    fn a_key_twice_is_refused_or_the_last_one_kept() {
        let text = "a: 1\nb: 2\na: 3\n";
        let e = from_str::<serde_json::Value>(text, Duplicates::Refused)
            .err()
            .map(|e| crate::text::yaml_fault(&e));
        assert_eq!(
            e.as_deref(),
            Some(
                "a key given twice in a mapping at line 3 column 1 (the file's text is not shown)"
            )
        );
        let v: serde_json::Value = from_str(text, Duplicates::LastWins).unwrap_or_default();
        assert_eq!(v, serde_json::json!({"a": 3, "b": 2}));
    }

    #[test]
    fn yaml_1_1_booleans_are_booleans_as_the_kubelet_reads_them() {
        let v: serde_json::Value =
            from_str("a: yes\nb: off\nc: \"yes\"\n", Duplicates::Refused).unwrap_or_default();
        assert_eq!(v, serde_json::json!({"a": true, "b": false, "c": "yes"}));
    }

    #[test]
    fn only_the_first_document_is_read() {
        let reading = Reading::file(Duplicates::Refused);
        let v: Option<Result<serde_json::Value, _>> =
            first_document("a: 1\n---\n[: broken\n", reading);
        assert_eq!(v.and_then(Result::ok), Some(serde_json::json!({"a": 1})));
        assert!(first_document::<serde_json::Value>("", reading).is_none());
    }
}
