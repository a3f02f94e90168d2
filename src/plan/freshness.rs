//! Which copy of an object is the fresher: the watch's, or the answer to one of our own
//! writes. resourceVersions are opaque (Kubernetes API conventions: only equality may be
//! relied on), so they are never ordered here. What orders copies is the watch itself: it
//! delivers an object's versions in the order they were written, so once it has delivered
//! the version our write returned, its copy is that one or a later one. Until then our
//! answer stands in, unless the watch was listed again after the write (a list may skip
//! versions) or the copies' `metadata.generation`, a counter, says otherwise.

use std::collections::{HashMap, VecDeque};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// Versions remembered per object: more than a pass ever lets the watch run ahead.
const REMEMBERED: usize = 32;

/// The versions the watches delivered, per object, in the order they came.
#[derive(Debug, Default)]
pub(crate) struct WatchLog {
    /// Lists begun per watch (its first, and each one after a failure, a 410 or a silence).
    lists: HashMap<String, u64>,
    /// Per object: the watch and list that last delivered it from a list.
    listed: HashMap<String, (String, u64)>,
    /// Deliveries so far, numbering each one.
    deliveries: u64,
    seen: HashMap<String, VecDeque<(String, u64)>>,
}

/// The answer to one of our own writes, standing in for the watch's copy until the watch
/// has caught up with it.
#[derive(Debug, Clone)]
pub(crate) struct Written<K> {
    pub(crate) copy: K,
    /// The lists each watch had begun when the answer came.
    lists_before: HashMap<String, u64>,
}

/// The copy to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fresher {
    /// The watch's: it has delivered our write's version, or listed the object again since.
    Watched,
    /// Ours: the watch has not delivered it yet.
    Written,
}

/// What is known of one copy for the comparison.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Version<'a> {
    pub(crate) resource_version: Option<&'a str>,
    pub(crate) generation: Option<i64>,
}

impl<'a> Version<'a> {
    pub(crate) fn of(meta: &'a ObjectMeta) -> Self {
        Version {
            resource_version: meta.resource_version.as_deref(),
            generation: meta.generation,
        }
    }
}

impl WatchLog {
    /// `watch` begins a list: what it returns may skip versions.
    pub(crate) fn listing(&mut self, watch: &str) {
        *self.lists.entry(watch.to_owned()).or_default() += 1;
    }

    /// `watch`'s list returned `key` at `resource_version`.
    pub(crate) fn listed(&mut self, watch: &str, key: &str, resource_version: Option<&str>) {
        let list = self.lists.get(watch).copied().unwrap_or_default();
        self.listed.insert(key.to_owned(), (watch.to_owned(), list));
        self.delivered(key, resource_version);
    }

    /// A watch delivered `key` at `resource_version` (None: an object without one, which
    /// nothing can be matched with).
    pub(crate) fn delivered(&mut self, key: &str, resource_version: Option<&str>) {
        let Some(rv) = resource_version else { return };
        self.deliveries += 1;
        let seen = self.seen.entry(key.to_owned()).or_default();
        if seen.back().is_some_and(|(last, _)| last == rv) {
            return;
        }
        if seen.len() == REMEMBERED {
            seen.pop_front();
        }
        seen.push_back((rv.to_owned(), self.deliveries));
    }

    /// A watch said `key` is gone.
    pub(crate) fn deleted(&mut self, key: &str) {
        self.seen.remove(key);
        self.listed.remove(key);
    }

    /// Our write's answer, to stand in for the watch's copy.
    pub(crate) fn written<K>(&self, copy: K) -> Written<K> {
        Written {
            copy,
            lists_before: self.lists.clone(),
        }
    }

    /// When a watch delivered `key` at `resource_version`, as a number that orders
    /// deliveries (also across watches sharing this log); None if none has (lately).
    pub(crate) fn delivered_at(&self, key: &str, resource_version: Option<&str>) -> Option<u64> {
        let rv = resource_version?;
        self.seen
            .get(key)?
            .iter()
            .find(|(seen, _)| seen == rv)
            .map(|(_, at)| *at)
    }

    /// Which to act on: the watch's copy of `key` (`watched`) or our written one.
    pub(crate) fn fresher<K>(
        &self,
        key: &str,
        watched: Version<'_>,
        written: &Written<K>,
        ours: Version<'_>,
    ) -> Fresher {
        if let (Some(a), Some(b)) = (watched.generation, ours.generation) {
            if a != b {
                return if a > b {
                    Fresher::Watched
                } else {
                    Fresher::Written
                };
            }
        }
        let caught_up = ours.resource_version.is_some()
            && (watched.resource_version == ours.resource_version
                || self.delivered_at(key, ours.resource_version).is_some());
        let listed_since = self.listed.get(key).is_some_and(|(watch, list)| {
            *list > written.lists_before.get(watch).copied().unwrap_or_default()
        });
        if caught_up || listed_since {
            Fresher::Watched
        } else {
            Fresher::Written
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(rv: &str) -> Version<'_> {
        Version {
            resource_version: Some(rv),
            generation: None,
        }
    }

    #[test]
    fn ours_stands_until_the_watch_delivers_its_version_whatever_the_versions_spell() {
        let mut log = WatchLog::default();
        log.listing("nodes");
        // Versions that would sort the wrong way as numbers or as text.
        log.delivered("n", Some("9"));
        let ours = log.written("copy");
        assert_eq!(log.fresher("n", v("9"), &ours, v("10")), Fresher::Written);
        // Someone else's write, delivered before ours: still older than ours.
        log.delivered("n", Some("zz"));
        assert_eq!(log.fresher("n", v("zz"), &ours, v("10")), Fresher::Written);
        log.delivered("n", Some("10"));
        assert_eq!(log.fresher("n", v("10"), &ours, v("10")), Fresher::Watched);
        // A later write by someone else, after ours: the watch's copy, though "1" < "10".
        log.delivered("n", Some("1"));
        assert_eq!(log.fresher("n", v("1"), &ours, v("10")), Fresher::Watched);
    }

    #[test]
    fn a_list_of_the_object_begun_after_the_write_is_taken_no_other() {
        let mut log = WatchLog::default();
        log.listing("own");
        log.listing("shared");
        log.listed("own", "m", Some("a"));
        let ours = log.written(());
        assert_eq!(log.fresher("m", v("a"), &ours, v("b")), Fresher::Written);
        // Another watch listed again, or this one began a list not yet in.
        log.listing("shared");
        log.listed("shared", "other", Some("x"));
        log.listing("own");
        assert_eq!(log.fresher("m", v("a"), &ours, v("b")), Fresher::Written);
        log.listed("own", "m", Some("c"));
        assert_eq!(log.fresher("m", v("c"), &ours, v("b")), Fresher::Watched);
    }

    #[test]
    fn generation_decides_when_it_differs() {
        let log = WatchLog::default();
        let ours = log.written(());
        let gen = |rv, g| Version {
            resource_version: Some(rv),
            generation: Some(g),
        };
        assert_eq!(
            log.fresher("m", gen("x", 3), &ours, gen("y", 2)),
            Fresher::Watched
        );
        assert_eq!(
            log.fresher("m", gen("x", 1), &ours, gen("y", 2)),
            Fresher::Written
        );
    }

    #[test]
    fn copies_without_a_version_are_never_taken_for_ours() {
        let mut log = WatchLog::default();
        log.delivered("n", None);
        let ours = log.written(());
        let none = Version::default();
        assert_eq!(log.fresher("n", none, &ours, v("5")), Fresher::Written);
        // Our answer without one: nothing can show the watch caught up; a list can.
        assert_eq!(log.fresher("n", none, &ours, none), Fresher::Written);
        assert_eq!(log.delivered_at("n", None), None);
    }

    #[test]
    fn deliveries_are_ordered_across_objects_and_forgotten_on_delete() {
        let mut log = WatchLog::default();
        log.delivered("a", Some("x"));
        log.delivered("b", Some("x"));
        assert!(log.delivered_at("a", Some("x")) < log.delivered_at("b", Some("x")));
        log.deleted("a");
        assert_eq!(log.delivered_at("a", Some("x")), None);
        for i in 0..100 {
            log.delivered("b", Some(&i.to_string()));
        }
        assert_eq!(log.delivered_at("b", Some("0")), None, "bounded");
        assert!(log.delivered_at("b", Some("99")).is_some());
    }
}
