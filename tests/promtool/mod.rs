//! promtool (Debian package `prometheus`) for the tests: found on `PATH`, or the test is
//! skipped with a message, unless `NODEGRACE_REAL_TESTS=1` (scripts/test-all), where its
//! absence fails.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// promtool's path, or None (after saying so) when it is absent outside the full suite.
pub fn promtool(test: &str) -> Option<PathBuf> {
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
pub fn run_promtool(promtool: &Path, args: &[&str], dir: &Path) -> String {
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

/// `promtool check metrics` on an exposition; fails with its findings unless it has none.
pub fn check_metrics(promtool: &Path, exposition: &str) {
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && findings.trim().is_empty(),
        "promtool check metrics:\n{findings}\non:\n{exposition}"
    );
}
