//! What nodegrace ships for Prometheus, checked by Prometheus's own `promtool` (Debian package
//! `prometheus`, installed by scripts/install-test-deps): the scrape configuration in the
//! README. Skipped with a message when promtool is absent, unless `NODEGRACE_REAL_TESTS=1`
//! (scripts/test-all), where its absence fails.

use std::path::Path;

mod promtool;
use promtool::{promtool, run_promtool};

fn repo_file(path: &str) -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn the_readme_scrape_configuration_is_valid_prometheus_configuration() {
    let Some(promtool) = promtool("the README's scrape configuration") else {
        return;
    };
    let readme = repo_file("README.md");
    let block = readme
        .split("```yaml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .find(|block| block.contains("kubernetes_sd_configs"))
        .expect("README.md shows a scrape configuration with kubernetes_sd_configs");
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
