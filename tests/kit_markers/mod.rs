//! What shows that a binary holds the test kit: the product's must show none of it.

use std::path::Path;
use std::process::Command;

/// Strings only the test kit puts into a binary, which survive stripping: its source paths
/// (panic locations; `src/testing/` is where the kit lived inside the product), its module and
/// type names (Debug output), the simulator's name and help.
pub const KIT_MARKERS: &[&str] = &[
    "testkit/src/",
    "src/testing/",
    "nodegrace_testkit",
    "fake_apiserver",
    "fake_cri",
    "fake_kubelet",
    "fake_logind",
    "memory_logind",
    "FakeCluster",
    "ScriptedDrainer",
    "nodegrace-sim",
    "Play a node shutdown",
];

/// The markers in the file at `binary` (grep: a debug build is hundreds of megabytes).
pub fn kit_markers_in(binary: &Path) -> Vec<String> {
    let mut grep = Command::new("grep");
    grep.args(["--text", "--only-matching", "--fixed-strings"]);
    for m in KIT_MARKERS {
        grep.arg("-e").arg(m);
    }
    let out = grep
        .arg(binary)
        .output()
        .unwrap_or_else(|e| panic!("{grep:?}: {e}"));
    // grep exits 1 when nothing matched, 2 on trouble.
    assert!(
        out.status.code().is_some_and(|c| c < 2),
        "{grep:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut found: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    found.sort();
    found.dedup();
    found
}

pub fn assert_no_kit(what: &str, binary: &Path) {
    let size = std::fs::metadata(binary)
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .len();
    assert!(
        size > 1_000_000,
        "{what} is {size} bytes: not the nodegrace binary"
    );
    let found = kit_markers_in(binary);
    assert!(
        found.is_empty(),
        "{what} holds test kit code; it contains {found:?}"
    );
}
