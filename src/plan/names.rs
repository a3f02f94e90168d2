//! Kubernetes' name rules, as the apiserver applies them (apimachinery's validation): one
//! definition each, used for node names, label keys and values, selectors and the
//! EvictionRequest API's domain-prefixed keys.

/// Longest DNS subdomain: object names such as a Node's, label key prefixes.
pub(crate) const DNS_SUBDOMAIN_MAX: usize = 253;
/// Longest label value and name part of a qualified name.
pub(crate) const LABEL_MAX: usize = 63;

fn lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, any length.
fn is_dns_part(part: &str) -> bool {
    let b = part.as_bytes();
    b.first().copied().is_some_and(lower_alnum)
        && b.last().copied().is_some_and(lower_alnum)
        && b.iter().all(|&c| lower_alnum(c) || c == b'-')
}

/// A DNS subdomain as the apiserver checks one (IsDNS1123Subdomain): at most 253
/// characters, dot-separated parts of lowercase alphanumerics and `-`, alphanumeric at both
/// ends. The apiserver does not limit a part to 63 characters, so neither does this: a
/// Node named with a 64-character part exists and must be accepted.
pub(crate) fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= DNS_SUBDOMAIN_MAX && s.split('.').all(is_dns_part)
}

/// The name part of a qualified name (a label key, a responder's name) and a non-empty
/// label value: 1 to 63 of `[A-Za-z0-9-_.]`, alphanumeric at both ends.
pub(crate) fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    b.len() <= LABEL_MAX
        && b.first().copied().is_some_and(alnum)
        && b.last().copied().is_some_and(alnum)
        && b.iter()
            .all(|&c| alnum(c) || matches!(c, b'-' | b'_' | b'.'))
}

/// A label value: empty, or a label name.
pub(crate) fn is_label_value(s: &str) -> bool {
    s.is_empty() || is_label_name(s)
}

/// A qualified name (a label key): an optional DNS subdomain and `/`, then a label name.
pub(crate) fn is_qualified_name(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_label_name(name),
        None => is_label_name(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_subdomain_limits_the_whole_not_each_part() {
        let part64 = "a".repeat(64);
        assert!(is_dns_subdomain(&part64));
        assert!(is_dns_subdomain(&format!("{part64}.example.com")));
        let long = format!("{}.{}", "a".repeat(126), "b".repeat(126));
        assert_eq!(long.len(), 253);
        assert!(is_dns_subdomain(&long));
        assert!(!is_dns_subdomain(&format!("{long}c")));
        for bad in [
            "", "Node-A", "node_a", "-a", "a-", "a..b", ".a", "a.", "a/b", "nöde",
        ] {
            assert!(!is_dns_subdomain(bad), "{bad:?}");
        }
        assert!(is_dns_subdomain("10.0.0.1"));
    }

    #[test]
    fn label_names_and_values_take_uppercase_and_at_most_63() {
        assert!(is_label_name("App.Tier_1-x"));
        assert!(is_label_name(&"a".repeat(63)));
        assert!(!is_label_name(&"a".repeat(64)));
        for bad in ["", "-a", "a_", ".a", "a b", "a/b", "ä"] {
            assert!(!is_label_name(bad), "{bad:?}");
        }
        assert!(is_label_value(""));
        assert!(!is_label_value(&"v".repeat(64)));
    }

    #[test]
    fn qualified_names_take_a_lowercase_subdomain_prefix() {
        assert!(is_qualified_name("app"));
        assert!(is_qualified_name("example.com/App"));
        assert!(is_qualified_name(&format!("{}/a", "p".repeat(64))));
        assert!(!is_qualified_name(&format!("{}/a", "p".repeat(254))));
        for bad in [
            "/a",
            "Example.com/a",
            "example.com/",
            "a/b/c",
            "example.com/-a",
        ] {
            assert!(!is_qualified_name(bad), "{bad:?}");
        }
    }
}
