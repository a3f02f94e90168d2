//! The ClusterRole shipped in packaging/rbac, as RBAC evaluates it.
#![allow(dead_code)]

use std::path::Path;

use serde_json::Value;

/// The (verbs, apiGroups, resources) of each rule of the shipped ClusterRole.
pub struct ClusterRole {
    rules: Vec<[Vec<String>; 3]>,
}

impl ClusterRole {
    pub fn shipped() -> ClusterRole {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/rbac/clusterrole.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let role: Value = serde_yaml::Deserializer::from_str(&text)
            .map(|doc| serde::Deserialize::deserialize(doc).unwrap())
            .find(|d: &Value| d["kind"] == "ClusterRole")
            .expect("a ClusterRole");
        let strings = |v: &Value| -> Vec<String> {
            v.as_array()
                .map(|a| a.iter().map(|s| s.as_str().unwrap().to_owned()).collect())
                .unwrap_or_default()
        };
        let rules = role["rules"]
            .as_array()
            .unwrap()
            .iter()
            .map(|rule| {
                [
                    strings(&rule["verbs"]),
                    strings(&rule["apiGroups"]),
                    strings(&rule["resources"]),
                ]
            })
            .collect();
        ClusterRole { rules }
    }

    /// Whether some rule grants `verb` on `group`/`resource` (`resource/subresource`), or
    /// every authenticated identity may do it (`system:basic-user`: "who am I" and "may I").
    pub fn allows(&self, verb: &str, group: &str, resource: &str) -> bool {
        if matches!(
            (verb, group, resource),
            ("create", "authentication.k8s.io", "selfsubjectreviews")
                | ("create", "authorization.k8s.io", "selfsubjectaccessreviews")
        ) {
            return true;
        }
        self.rules.iter().any(|[verbs, groups, resources]| {
            verbs.iter().any(|v| v == verb)
                && groups.iter().any(|g| g == group)
                && resources.iter().any(|r| r == resource)
        })
    }
}
