//! What nodegrace ships for Prometheus, checked by Prometheus's own `promtool` (Debian package
//! `prometheus`, installed by scripts/install-test-deps): the scrape configuration in the
//! manual (docs/operating.md), the alert rules (packaging/prometheus) and their tests
//! (tests/data/nodegrace-rules-test.yml). Skipped with a message when promtool is absent, unless `NODEGRACE_REAL_TESTS=1`
//! (scripts/test-all), where its absence fails.

use std::path::Path;

mod promtool;
use promtool::{promtool, run_promtool};

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn the_readme_scrape_configuration_is_valid_prometheus_configuration() {
    let Some(promtool) = promtool("the manual's scrape configuration") else {
        return;
    };
    let readme = repo_file("docs/operating.md");
    let block = readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .find(|block| block.contains("kubernetes_sd_configs"))
        .expect("docs/operating.md shows a scrape configuration with kubernetes_sd_configs");
    let discovery = "    kubernetes_sd_configs:\n      - role: node\n";
    assert!(block.contains(discovery), "{block}");
    // Debian's Prometheus is built without Kubernetes discovery, so its promtool rejects the
    // key; the rest (the relabelling that finds the port) is checked with the nodes given
    // statically instead.
    let checkable = block.replace(
        discovery,
        "    static_configs:\n      - targets: ['10.0.0.1:10250']\n",
    );
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("prometheus.yml"), checkable).unwrap();
    let out = run_promtool(
        &promtool,
        &["check", "config", "prometheus.yml"],
        dir.path(),
    );
    assert!(out.contains("SUCCESS"), "{out}");
}

fn yaml(path: &str) -> serde_yaml::Value {
    serde_yaml::from_str(&repo_file(path)).unwrap()
}

const RULES: &str = "packaging/prometheus/nodegrace-rules.yml";
const RULES_TEST: &str = "tests/data/nodegrace-rules-test.yml";

fn alert_names() -> Vec<String> {
    let rules = yaml(RULES);
    let mut names = Vec::new();
    for group in rules["groups"].as_sequence().unwrap() {
        for rule in group["rules"].as_sequence().unwrap() {
            names.push(rule["alert"].as_str().unwrap().to_string());
        }
    }
    names
}

#[test]
fn the_prometheus_rule_holds_the_same_groups_as_the_plain_rules_file() {
    let plain = yaml(RULES);
    let operator = yaml("packaging/prometheus/nodegrace-prometheusrule.yaml");
    assert_eq!(operator["kind"], "PrometheusRule");
    assert_eq!(operator["apiVersion"], "monitoring.coreos.com/v1");
    assert_eq!(operator["spec"]["groups"], plain["groups"]);
}

#[test]
fn every_alert_has_a_runbook_line_and_a_test_that_fires_it() {
    let manual = repo_file("docs/operating.md");
    let runbooks = manual
        .split("\n## Alerts\n")
        .nth(1)
        .expect("docs/operating.md has an Alerts section");
    let tests = yaml(RULES_TEST);
    let fired: Vec<&str> = tests["tests"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_sequence().unwrap())
        .filter(|a| !a["exp_alerts"].as_sequence().unwrap().is_empty())
        .map(|a| a["alertname"].as_str().unwrap())
        .collect();
    let names = alert_names();
    assert!(names.len() >= 8, "{names:?}");
    for name in &names {
        assert!(
            runbooks.contains(&format!("| `{name}` |")),
            "{name} has no runbook line in docs/operating.md's Alerts"
        );
        assert!(
            fired.contains(&name.as_str()),
            "no test in {RULES_TEST} fires {name}"
        );
    }
}

#[test]
fn the_alert_rules_pass_promtool_check_rules_and_their_tests() {
    let Some(promtool) = promtool("promtool check rules and test rules") else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nodegrace-rules.yml"), repo_file(RULES)).unwrap();
    std::fs::write(dir.path().join("rules-test.yml"), repo_file(RULES_TEST)).unwrap();
    let checked = run_promtool(
        &promtool,
        &["check", "rules", "nodegrace-rules.yml"],
        dir.path(),
    );
    assert!(
        checked.contains(&format!("SUCCESS: {} rules found", alert_names().len())),
        "{checked}"
    );
    let tested = run_promtool(&promtool, &["test", "rules", "rules-test.yml"], dir.path());
    assert!(tested.contains("SUCCESS"), "{tested}");
}
