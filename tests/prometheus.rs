//! What nodegrace ships for Prometheus, checked by Prometheus's own `promtool` (Debian package
//! `prometheus`, installed by scripts/install-test-deps): the scrape configuration in the
//! README. Skipped with a message when promtool is absent, unless `NODEGRACE_REAL_TESTS=1`
//! (scripts/test-all), where its absence fails.

use std::path::{Path, PathBuf};
use std::process::Command;

/// promtool's path, or None (after saying so) when it is absent outside the full suite.
fn promtool(test: &str) -> Option<PathBuf> {
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join("promtool"))
            .find(|p| p.is_file())
    });
    if found.is_none() {
        assert!(
            std::env::var("NODEGRACE_REAL_TESTS").as_deref() != Ok("1"),
            "{test}: promtool is missing; scripts/install-test-deps installs it (Debian package prometheus)"
        );
        eprintln!(
            "skipped: {test} (promtool absent; apt-get install prometheus, or scripts/test-all)"
        );
    }
    found
}

/// Runs `promtool args`, failing with its output unless it succeeds; returns its stdout.
fn run_promtool(promtool: &Path, args: &[&str], dir: &Path) -> String {
    let out = Command::new(promtool)
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool {args:?} failed:\n{text}");
    text
}

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
