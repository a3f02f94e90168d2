//! The binary cargo builds for the product holds none of the test kit (fake apiserver,
//! kubelet, logind and CRI runtime, the simulator). The packaged binaries are checked in
//! `real_packages.rs`.

mod kit_markers;

use std::path::Path;

use kit_markers::{assert_no_kit, kit_markers_in, KIT_MARKERS};

#[test]
fn the_built_binary_holds_no_test_kit() {
    let path = Path::new(env!("CARGO_BIN_EXE_nodegrace"));
    assert_no_kit(&path.display().to_string(), path);
    // The same check finds the kit where it is: the simulator is made of it.
    let sim = path.with_file_name("nodegrace-sim");
    if sim.is_file() {
        let found = kit_markers_in(&sim);
        assert!(
            found.len() >= 5,
            "{} shows only {found:?} of {KIT_MARKERS:?}",
            sim.display()
        );
    }
}
