//! What the decisions need of the API's names: domain-prefixed keys (apimachinery's rules),
//! intents and the limits on a pod's responders.

/// Most responders a pod declares.
pub const MAX_POD_RESPONDERS: usize = 10;
/// Highest responder priority; 0..=999 are reserved for `*.k8s.io` responders.
pub const MAX_RESPONDER_PRIORITY: i32 = 100_000;

/// `spec.intent` values of an EvictionRequest.
pub const INTENT_EVICTION: &str = "Eviction";
pub const INTENT_WITHDRAWN: &str = "Withdrawn";

/// A responder a pod declares (`spec.evictionResponders`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredResponder {
    pub name: String,
    pub priority: i64,
}

fn lower_alnum(c: u8) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

/// A DNS subdomain as the apiserver checks one (IsDNS1123Subdomain).
fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            b.first().copied().is_some_and(lower_alnum)
                && b.last().copied().is_some_and(lower_alnum)
                && b.iter().all(|&c| lower_alnum(c) || c == b'-')
        })
}

/// The name part of a qualified name: 1 to 63 of `[A-Za-z0-9-_.]`, alphanumeric at both ends.
fn is_label_name(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_alphanumeric();
    b.len() <= 63
        && b.first().copied().is_some_and(alnum)
        && b.last().copied().is_some_and(alnum)
        && b.iter()
            .all(|&c| alnum(c) || matches!(c, b'-' | b'_' | b'.'))
}

/// What is wrong with `key` as a domain-prefixed key (`example.com/name`), if anything.
pub fn domain_prefixed_key_problem(key: &str) -> Option<String> {
    let Some((prefix, name)) = key.split_once('/') else {
        return Some(format!("{key:?} has no domain prefix (example.com/{key})"));
    };
    if !is_dns_subdomain(prefix) {
        return Some(format!("the prefix of {key:?} is not a DNS subdomain"));
    }
    if !is_label_name(name) {
        return Some(format!(
            "the name part of {key:?} must be 1-63 alphanumeric characters, '-', '_' or '.', alphanumeric at both ends"
        ));
    }
    None
}
