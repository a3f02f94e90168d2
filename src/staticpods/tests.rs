use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use nix::errno::Errno;
use proptest::prelude::*;

use super::fsio::{Step, StepDir, StepHook, StepKind, TEMP_SUFFIX};
use super::*;

fn pod(name: &str, ns: Option<&str>, extra: &str) -> Vec<u8> {
    let ns = ns
        .map(|n| format!("  namespace: {n}\n"))
        .unwrap_or_default();
    format!("apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n{ns}spec:\n  containers: []\n# {extra}\n")
        .into_bytes()
}

/// Scratch directories on tmpfs when there is one, so thousands of fsyncs stay cheap.
fn scratch() -> tempfile::TempDir {
    if Path::new("/dev/shm").is_dir() {
        if let Ok(d) = tempfile::tempdir_in("/dev/shm") {
            return d;
        }
    }
    tempfile::tempdir().unwrap()
}

struct Fixture {
    _root: tempfile::TempDir,
    m: PathBuf,
    g: PathBuf,
    state: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        Self::with_gate_root(None)
    }

    /// `gate_root`: put the gate directory under another directory (another filesystem).
    fn with_gate_root(gate_root: Option<&Path>) -> Self {
        let root = scratch();
        let m = root.path().join("manifests");
        fs::create_dir(&m).unwrap();
        let g = gate_root
            .unwrap_or(root.path())
            .join(format!("gated-{}", rand::random::<u32>()));
        let state = root.path().join("state");
        Fixture {
            _root: root,
            m,
            g,
            state,
        }
    }

    fn settings(&self) -> StaticPodSettings {
        StaticPodSettings {
            manifest_dir: self.m.clone(),
            gate_dir: self.g.clone(),
        }
    }

    fn gate(&self) -> FsGate {
        FsGate::new(&self.settings(), &self.state).unwrap()
    }

    fn gate_with(&self, hook: Arc<TestHook>, copy: bool) -> FsGate {
        self.gate().with_hook(hook).with_forced_copy(copy)
    }

    fn write(&self, dir: &Path, name: &str, bytes: &[u8], mode: u32) {
        let p = dir.join(name);
        fs::write(&p, bytes).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(mode)).unwrap();
    }

    /// Every entry of both directories: name -> (place, bytes, mode).
    fn contents(&self) -> Vec<(Place, String, Vec<u8>, u32)> {
        let mut out = Vec::new();
        for (place, dir) in [(Place::Manifests, &self.m), (Place::Gate, &self.g)] {
            let Ok(rd) = fs::read_dir(dir) else { continue };
            for e in rd {
                let e = e.unwrap();
                let md = fs::symlink_metadata(e.path()).unwrap();
                let bytes = if md.is_file() {
                    fs::read(e.path()).unwrap()
                } else {
                    Vec::new()
                };
                out.push((
                    place,
                    e.file_name().into_string().unwrap(),
                    bytes,
                    md.mode() & 0o7777,
                ));
            }
        }
        out.sort();
        out
    }

    fn pending_intents(&self) -> usize {
        journal::pending(
            &journal::read(&self.state.join(JOURNAL_FILE))
                .unwrap()
                .records,
        )
        .len()
    }
}

/// A step hook that can crash after `crash_after` steps, make renames unsupported
/// (EINVAL, forcing link + unlink) and fail every change to one directory with an errno.
struct TestHook {
    crash_after: usize,
    rename_einval: bool,
    fail_dir: Option<(Place, Errno)>,
    steps: AtomicUsize,
}

impl TestHook {
    fn new() -> Self {
        TestHook {
            crash_after: usize::MAX,
            rename_einval: false,
            fail_dir: None,
            steps: AtomicUsize::new(0),
        }
    }
    fn crash_after(k: usize, rename_einval: bool) -> Arc<Self> {
        Arc::new(TestHook {
            crash_after: k,
            rename_einval,
            ..TestHook::new()
        })
    }
    fn steps(&self) -> usize {
        self.steps.load(Ordering::SeqCst)
    }
}

impl StepHook for TestHook {
    fn before(&self, step: &Step<'_>) -> std::result::Result<(), Errno> {
        if self.steps.fetch_add(1, Ordering::SeqCst) >= self.crash_after {
            return Err(Errno::EIO);
        }
        if self.rename_einval && step.kind == StepKind::Rename {
            return Err(Errno::EINVAL);
        }
        if let Some((place, errno)) = self.fail_dir {
            let touches =
                step.dir == StepDir::Dir(place) || step.from_dir == Some(StepDir::Dir(place));
            if touches && step.kind != StepKind::Fsync {
                return Err(errno);
            }
        }
        Ok(())
    }
}

#[test]
fn gate_and_restore_round_trip_keeps_bytes_mode_and_owner() {
    for copy in [false, true] {
        let f = Fixture::new();
        f.write(
            &f.m,
            "etcd.yaml",
            &pod("etcd", Some("kube-system"), "1"),
            0o640,
        );
        f.write(&f.m, "api.json", &pod("api", None, "2"), 0o4604);
        let owner = if nix::unistd::geteuid().is_root() {
            (1234, 5678)
        } else {
            let md = fs::metadata(&f.m).unwrap();
            (md.uid(), md.gid())
        };
        std::os::unix::fs::chown(f.m.join("api.json"), Some(owner.0), Some(owner.1)).unwrap();
        fs::set_permissions(f.m.join("api.json"), fs::Permissions::from_mode(0o4604)).unwrap();
        let before = f.contents();
        let gate = f.gate().with_forced_copy(copy);

        gate.gate("etcd.yaml").unwrap();
        gate.gate("api.json").unwrap();
        assert!(gate.active().unwrap().is_empty());
        assert_eq!(gate.gated().unwrap().len(), 2);
        let gated = f.contents();
        assert!(gated.iter().all(|(p, ..)| *p == Place::Gate), "{gated:?}");
        let strip = |v: &[(Place, String, Vec<u8>, u32)]| {
            v.iter()
                .map(|(_, n, b, m)| (n.clone(), b.clone(), *m))
                .collect::<Vec<_>>()
        };
        assert_eq!(strip(&gated), strip(&before), "copy={copy}");
        let md = fs::metadata(f.g.join("api.json")).unwrap();
        assert_eq!((md.uid(), md.gid()), owner);
        assert_eq!(
            fs::metadata(&f.g).unwrap().mode() & 0o7777,
            0o700,
            "gate dir created 0700"
        );

        assert_eq!(gate.restore_all().unwrap(), Vec::<String>::new());
        assert_eq!(f.contents(), before, "copy={copy}");
        let md = fs::metadata(f.m.join("api.json")).unwrap();
        assert_eq!((md.uid(), md.gid()), owner);
        assert_eq!(f.pending_intents(), 0);
    }
}

#[test]
fn link_and_unlink_when_rename_noreplace_is_unsupported() {
    let f = Fixture::new();
    f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
    let hook = Arc::new(TestHook {
        rename_einval: true,
        ..TestHook::new()
    });
    let gate = f.gate_with(hook, false);
    gate.gate("a.yaml").unwrap();
    assert_eq!(fs::read(f.g.join("a.yaml")).unwrap(), pod("a", None, ""));
    assert!(!f.m.join("a.yaml").exists());
    gate.restore_all().unwrap();
    assert!(f.m.join("a.yaml").exists() && !f.g.join("a.yaml").exists());
}

#[test]
fn symlinked_manifest_is_refused_and_nothing_moves() {
    let f = Fixture::new();
    let outside = f.m.parent().unwrap().join("outside.yaml");
    fs::write(&outside, pod("secret", None, "")).unwrap();
    std::os::unix::fs::symlink(&outside, f.m.join("evil.yaml")).unwrap();
    f.write(&f.m, "ok.yaml", &pod("ok", None, ""), 0o600);
    let gate = f.gate();
    let err = gate.gate("evil.yaml").unwrap_err();
    assert!(format!("{err:#}").contains("symlink"), "{err:#}");
    assert!(fs::symlink_metadata(f.m.join("evil.yaml"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(fs::read(&outside).unwrap(), pod("secret", None, ""));
    assert!(!f.g.join("evil.yaml").exists());
    let scan = gate.scan(Place::Manifests).unwrap();
    assert_eq!(scan.refused.len(), 1);
    assert_eq!(
        scan.manifests.len(),
        1,
        "a symlink is not followed to parse it"
    );
    gate.gate("ok.yaml").unwrap();
}

#[test]
fn symlinked_gate_dir_is_refused() {
    let f = Fixture::new();
    let elsewhere = f.m.parent().unwrap().join("elsewhere");
    fs::create_dir(&elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &f.g).unwrap();
    f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
    let err = f.gate().gate("a.yaml").unwrap_err();
    assert!(format!("{err:#}").contains("symlink"), "{err:#}");
    assert!(f.m.join("a.yaml").exists());
    assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
}

#[test]
fn symlinked_manifest_dir_is_refused() {
    let f = Fixture::new();
    let real = f.m.parent().unwrap().join("real-manifests");
    fs::rename(&f.m, &real).unwrap();
    std::os::unix::fs::symlink(&real, &f.m).unwrap();
    fs::write(real.join("a.yaml"), pod("a", None, "")).unwrap();
    assert!(f.gate().gate("a.yaml").is_err());
    assert!(real.join("a.yaml").exists());
}

#[test]
fn fifo_and_devices_are_refused_without_blocking() {
    let f = Fixture::new();
    nix::unistd::mkfifo(
        &f.m.join("pipe.yaml"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    fs::create_dir(f.m.join("subdir")).unwrap();
    let gate = f.gate();
    let err = gate.gate("pipe.yaml").unwrap_err();
    assert!(format!("{err:#}").contains("FIFO"), "{err:#}");
    assert!(gate.gate("subdir").is_err());
    assert!(fs::symlink_metadata(f.m.join("pipe.yaml")).is_ok());
    assert!(f.m.join("subdir").is_dir());
    assert_eq!(gate.scan(Place::Manifests).unwrap().refused.len(), 1);
}

#[test]
fn hostile_names_are_refused() {
    let f = Fixture::new();
    f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
    let outside = f.m.parent().unwrap().join("victim.yaml");
    fs::write(&outside, pod("victim", None, "")).unwrap();
    let gate = f.gate();
    for bad in [
        "",
        ".",
        "..",
        "../victim.yaml",
        "a/../a.yaml",
        "/etc/passwd",
        ".hidden",
        "a\0b",
    ] {
        assert!(gate.gate(bad).is_err(), "{bad:?} accepted");
    }
    assert!(f.m.join("a.yaml").exists());
    assert!(outside.exists());
    assert!(gate.gated().unwrap().is_empty());
}

#[test]
fn a_file_the_kubelet_refuses_is_gated_and_restored_byte_for_byte() {
    for copy in [false, true] {
        let f = Fixture::new();
        let broken: &[u8] = b"apiVersion: v1\nkind: Pod\nmetadata: [";
        let not_a_pod: &[u8] = b"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n";
        f.write(&f.m, "broken.yaml", broken, 0o640);
        f.write(&f.m, "deploy.yaml", not_a_pod, 0o600);
        f.write(
            &f.m,
            "etcd.yaml~",
            &pod("etcd", None, "editor backup"),
            0o600,
        );
        f.write(&f.m, "etcd.yaml", &pod("etcd", None, ""), 0o600);
        let gate = f.gate().with_forced_copy(copy);
        let scan = gate.scan(Place::Manifests).unwrap();
        let mut unreadable: Vec<String> = gate
            .unreadable_active()
            .unwrap()
            .into_iter()
            .map(|p| p.file_name)
            .collect();
        unreadable.sort();
        assert_eq!(unreadable, ["broken.yaml", "deploy.yaml"]);
        assert_eq!(
            scan.manifests.len(),
            2,
            "the kubelet reads editor backups too"
        );
        assert!(!gate.has_gated().unwrap());
        gate.gate("broken.yaml").unwrap();
        assert!(
            gate.has_gated().unwrap(),
            "a gated file that names no pod still counts"
        );
        assert!(gate.gated().unwrap().is_empty());
        gate.gate("deploy.yaml").unwrap();
        gate.gate("etcd.yaml").unwrap();
        gate.gate("etcd.yaml~").unwrap();
        assert!(!f.m.join("broken.yaml").exists());
        assert_eq!(fs::read(f.g.join("broken.yaml")).unwrap(), broken);
        assert!(gate.unreadable_active().unwrap().is_empty());
        assert!(gate.restore_all().unwrap().is_empty());
        assert_eq!(fs::read(f.m.join("broken.yaml")).unwrap(), broken);
        assert_eq!(fs::read(f.m.join("deploy.yaml")).unwrap(), not_a_pod);
        let mode = fs::metadata(f.m.join("broken.yaml"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o640, "copy={copy}");
        assert!(!gate.has_gated().unwrap());
        assert_eq!(gate.active().unwrap().len(), 2);
    }
}

#[test]
fn restore_never_overwrites_a_file_that_reappeared() {
    for copy in [false, true] {
        let f = Fixture::new();
        f.write(&f.m, "etcd.yaml", &pod("etcd", None, "old"), 0o600);
        f.write(&f.m, "api.yaml", &pod("api", None, ""), 0o600);
        let gate = f.gate().with_forced_copy(copy);
        gate.gate("etcd.yaml").unwrap();
        gate.gate("api.yaml").unwrap();
        f.write(&f.m, "etcd.yaml", &pod("etcd", None, "new"), 0o644);
        assert_eq!(gate.restore_all().unwrap(), vec!["etcd.yaml".to_string()]);
        assert_eq!(
            fs::read(f.m.join("etcd.yaml")).unwrap(),
            pod("etcd", None, "new")
        );
        assert_eq!(
            fs::read(f.g.join("etcd.yaml")).unwrap(),
            pod("etcd", None, "old")
        );
        assert!(f.m.join("api.yaml").exists() && !f.g.join("api.yaml").exists());
        // A second gate of the new file must not clobber the kept-aside one either.
        let err = gate.gate("etcd.yaml").unwrap_err();
        assert!(format!("{err:#}").contains("already exists"));
        assert_eq!(
            fs::read(f.g.join("etcd.yaml")).unwrap(),
            pod("etcd", None, "old")
        );
        assert_eq!(
            fs::read(f.m.join("etcd.yaml")).unwrap(),
            pod("etcd", None, "new")
        );
    }
}

#[test]
fn read_only_gate_dir_fails_cleanly_and_loses_nothing() {
    for copy in [false, true] {
        let f = Fixture::new();
        f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
        f.write(&f.m, "b.yaml", &pod("b", None, ""), 0o600);
        f.gate().gate("b.yaml").unwrap();
        let before = f.contents();
        let hook = Arc::new(TestHook {
            fail_dir: Some((Place::Gate, Errno::EROFS)),
            ..TestHook::new()
        });
        let gate = f.gate_with(hook, copy);
        let err = gate.gate("a.yaml").unwrap_err();
        assert!(format!("{err:#}").contains("Read-only"), "{err:#}");
        // Restoring b needs to unlink it from the read-only gate dir: it stays gated.
        let err = gate.restore_all().unwrap_err();
        assert!(format!("{err:#}").contains("b.yaml"), "{err:#}");
        assert_eq!(f.contents(), before, "copy={copy}");
        assert_eq!(f.pending_intents(), 0, "failed moves are settled at once");
    }
}

#[test]
fn missing_manifest_dir_is_a_clear_error() {
    let f = Fixture::new();
    f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
    f.gate().gate("a.yaml").unwrap();
    fs::remove_dir(&f.m).unwrap();
    let gate = f.gate();
    let err = gate.gate("x.yaml").unwrap_err();
    assert!(format!("{err:#}").contains("does not exist"), "{err:#}");
    assert!(gate.active().is_err());
    let err = gate.restore_all().unwrap_err();
    assert!(format!("{err:#}").contains("a.yaml"), "{err:#}");
    assert!(f.g.join("a.yaml").exists());
    gate.recover().unwrap();
}

#[test]
fn layout_is_validated() {
    let f = Fixture::new();
    let bad = |m: &Path, g: &Path, s: &Path| {
        FsGate::new(
            &StaticPodSettings {
                manifest_dir: m.into(),
                gate_dir: g.into(),
            },
            s,
        )
        .is_err()
    };
    assert!(bad(&f.m, &f.m.join("gated"), &f.state));
    assert!(bad(&f.m, &f.m, &f.state));
    assert!(bad(&f.m, &f.g, &f.m.join("state")));
    assert!(bad(Path::new("manifests"), &f.g, &f.state));
    assert!(bad(&f.m, &f.m.join("../gated"), &f.state));
    // Through a symlinked parent: only visible once resolved.
    let alias = f.m.parent().unwrap().join("alias");
    std::os::unix::fs::symlink(&f.m, &alias).unwrap();
    fs::create_dir(f.m.join("gated")).unwrap();
    assert!(bad(&f.m, &alias.join("gated"), &f.state));
}

#[test]
fn mirror_pods_map_by_parsed_name_and_namespace() {
    let f = Fixture::new();
    f.write(
        &f.m,
        "zz-not-etcd.yaml",
        &pod("etcd", Some("kube-system"), ""),
        0o600,
    );
    f.write(
        &f.m,
        "etcd.yaml",
        &pod("etcd-x", Some("kube-system"), ""),
        0o600,
    );
    f.write(&f.m, "other.yaml", &pod("etcd", None, ""), 0o600);
    let gate = f.gate();
    let m = gate
        .find_manifest_for_mirror("kube-system", "etcd-node-1", "Node-1")
        .unwrap()
        .unwrap();
    assert_eq!(m.file_name, "zz-not-etcd.yaml");
    let m = gate
        .find_manifest_for_mirror("default", "etcd-node-1", "node-1")
        .unwrap()
        .unwrap();
    assert_eq!(m.file_name, "other.yaml");
    assert!(gate
        .find_manifest_for_mirror("kube-system", "etcd-node-2", "node-1")
        .unwrap()
        .is_none());
    assert!(gate
        .find_manifest_for_mirror("kube-public", "etcd-node-1", "node-1")
        .unwrap()
        .is_none());
}

#[test]
fn source_edited_during_a_copy_keeps_both() {
    struct EditOnRename(PathBuf);
    impl StepHook for EditOnRename {
        fn before(&self, step: &Step<'_>) -> std::result::Result<(), Errno> {
            if step.kind == StepKind::Rename {
                fs::write(&self.0, pod("a", None, "edited")).unwrap();
            }
            Ok(())
        }
    }
    let f = Fixture::new();
    f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
    let gate = f
        .gate()
        .with_hook(Arc::new(EditOnRename(f.m.join("a.yaml"))))
        .with_forced_copy(true);
    let err = gate.gate("a.yaml").unwrap_err();
    assert!(format!("{err:#}").contains("changed"), "{err:#}");
    assert_eq!(
        fs::read(f.m.join("a.yaml")).unwrap(),
        pod("a", None, "edited")
    );
    assert_eq!(fs::read(f.g.join("a.yaml")).unwrap(), pod("a", None, ""));
    assert_eq!(f.pending_intents(), 0);
}

#[test]
fn recover_removes_only_temporaries_with_a_complete_copy() {
    let f = Fixture::new();
    f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
    f.gate().gate("a.yaml").unwrap();
    let tmp_done = f.g.join(format!(".a.yaml{TEMP_SUFFIX}"));
    fs::write(&tmp_done, pod("a", None, "")).unwrap();
    let tmp_orphan = f.m.join(format!(".b.yaml{TEMP_SUFFIX}"));
    fs::write(&tmp_orphan, pod("b", None, "")).unwrap();
    let report = f.gate().recover_report().unwrap();
    assert!(!tmp_done.exists());
    assert!(tmp_orphan.exists(), "the only copy of b is never deleted");
    assert_eq!(report.leftover_temporaries.len(), 1);
}

#[derive(Debug, Clone, Copy)]
enum Scenario {
    Gate,
    Restore,
    RestoreWithConflict,
}

/// Sets up the scenario, runs it with `hook`, ignoring errors (a crash is an error).
fn run_scenario(
    f: &Fixture,
    files: &[(String, Vec<u8>, u32)],
    scenario: Scenario,
    copy: bool,
    hook: Arc<TestHook>,
) {
    for (n, b, mode) in files {
        f.write(&f.m, n, b, *mode);
    }
    if !matches!(scenario, Scenario::Gate) {
        let clean = f.gate().with_forced_copy(copy);
        for (n, ..) in files {
            clean.gate(n).unwrap();
        }
    }
    if matches!(scenario, Scenario::RestoreWithConflict) {
        f.write(
            &f.m,
            &files[0].0,
            b"apiVersion: v1\nkind: Pod\nmetadata: {name: new}\n",
            0o600,
        );
    }
    let gate = f.gate_with(hook, copy);
    match scenario {
        Scenario::Gate => {
            for (n, ..) in files {
                let _ = gate.gate(n);
            }
        }
        Scenario::Restore | Scenario::RestoreWithConflict => {
            let _ = gate.restore_all();
        }
    }
}

/// After recovery: each original manifest exists exactly once (same bytes and mode), a
/// conflicting newcomer is untouched, no temporary remains, the journal is settled.
fn check_invariant(
    f: &Fixture,
    files: &[(String, Vec<u8>, u32)],
    scenario: Scenario,
) -> std::result::Result<(), TestCaseError> {
    let contents = f.contents();
    for (_, name, ..) in &contents {
        prop_assert!(!name.starts_with('.'), "temporary left: {name}");
    }
    let mut expected = BTreeMap::new();
    for (n, b, mode) in files {
        let copies: Vec<_> = contents
            .iter()
            .filter(|(_, name, bytes, m)| name == n && bytes == b && m == mode)
            .collect();
        prop_assert_eq!(copies.len(), 1, "{} in {:?}", n, contents);
        expected.insert(n.clone(), 1);
    }
    let extra = if matches!(scenario, Scenario::RestoreWithConflict) {
        let newcomer = contents
            .iter()
            .filter(|(p, n, b, _)| {
                *p == Place::Manifests
                    && *n == files[0].0
                    && b.starts_with(b"apiVersion: v1\nkind: Pod\nmetadata: {name: new}")
            })
            .count();
        prop_assert_eq!(newcomer, 1);
        1
    } else {
        0
    };
    prop_assert_eq!(contents.len(), files.len() + extra, "{:?}", contents);
    prop_assert_eq!(f.pending_intents(), 0);
    Ok(())
}

fn manifest_set() -> impl Strategy<Value = Vec<(String, Vec<u8>, u32)>> {
    proptest::collection::btree_map(
        "[a-z][a-z0-9-]{0,6}(\\.yaml|\\.json|~)?",
        (
            "[a-z]{1,6}",
            "[ -~]{0,40}",
            prop_oneof![Just(0o600u32), Just(0o644), Just(0o640)],
            // Files the kubelet refuses are gated and restored too.
            prop_oneof![
                Just(None),
                Just(Some(&b"metadata: ["[..])),
                Just(Some(&b"kind: Deployment\n"[..]))
            ],
        ),
        1..4,
    )
    .prop_map(|m| {
        m.into_iter()
            .map(|(file, (name, extra, mode, unreadable))| {
                let bytes = match unreadable {
                    Some(b) => [b, extra.as_bytes()].concat(),
                    None => pod(&name, None, &extra),
                };
                (file, bytes, mode)
            })
            .collect()
    })
}

fn crash_everywhere(
    files: &[(String, Vec<u8>, u32)],
    scenario: Scenario,
    copy: bool,
    rename_einval: bool,
    gate_root: Option<&Path>,
) -> std::result::Result<(), TestCaseError> {
    let counter = TestHook::crash_after(usize::MAX, rename_einval);
    let f = Fixture::with_gate_root(gate_root);
    run_scenario(&f, files, scenario, copy, counter.clone());
    let total = counter.steps();
    for k in 0..=total {
        // Crash after k steps, then a crash after j steps of the recovery, then recover.
        let mut j = 0;
        loop {
            let f = Fixture::with_gate_root(gate_root);
            run_scenario(
                &f,
                files,
                scenario,
                copy,
                TestHook::crash_after(k, rename_einval),
            );
            let rec_hook = TestHook::crash_after(j, rename_einval);
            let rec_done =
                f.gate_with(rec_hook.clone(), copy).recover().is_ok() && rec_hook.steps() <= j;
            f.gate()
                .recover()
                .map_err(|e| TestCaseError::fail(format!("{e:#}")))?;
            check_invariant(&f, files, scenario).map_err(|e| {
                TestCaseError::fail(format!("crash at {k}/{total}, recovery crash at {j}: {e}"))
            })?;
            if rec_done {
                break;
            }
            j += 1;
            prop_assert!(j < 1000, "recovery never finishes");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]

    #[test]
    fn a_crash_at_any_step_loses_no_manifest(
        files in manifest_set(),
        copy in any::<bool>(),
        rename_einval in any::<bool>(),
    ) {
        for scenario in [Scenario::Gate, Scenario::Restore, Scenario::RestoreWithConflict] {
            crash_everywhere(&files, scenario, copy, rename_einval, None)?;
        }
    }
}

/// Root-only tests on real mounts; they run with NODEGRACE_REAL_TESTS=1 and fail loudly
/// when they cannot set up what they need.
mod real {
    use super::*;
    use std::process::Command;

    struct Mount(PathBuf);

    impl Mount {
        fn tmpfs(at: &Path) -> Mount {
            fs::create_dir_all(at).unwrap();
            let st = Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=4m", "nodegrace-test"])
                .arg(at)
                .status()
                .expect("running mount");
            assert!(st.success(), "mounting a tmpfs at {} failed", at.display());
            Mount(at.to_path_buf())
        }
        fn remount(&self, opt: &str) {
            let st = Command::new("mount")
                .args(["-o", &format!("remount,{opt}")])
                .arg(&self.0)
                .status()
                .unwrap();
            assert!(st.success(), "remount {opt} failed");
        }
    }

    impl Drop for Mount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }

    fn enabled() -> bool {
        if std::env::var("NODEGRACE_REAL_TESTS").as_deref() != Ok("1") {
            return false;
        }
        assert!(
            nix::unistd::geteuid().is_root(),
            "NODEGRACE_REAL_TESTS=1 needs root for the static-pod mount tests"
        );
        true
    }

    #[test]
    fn real_second_filesystem_crash_at_every_step() {
        if !enabled() {
            return;
        }
        // The manifest dir must be on a filesystem other than the tmpfs.
        let outer = tempfile::tempdir_in("/var/tmp").unwrap();
        let mnt = Mount::tmpfs(&outer.path().join("gatefs"));
        let f = Fixture::with_gate_root(Some(&mnt.0));
        fs::create_dir_all(&f.g).unwrap();
        assert_ne!(
            fs::metadata(&f.m).unwrap().dev(),
            fs::metadata(&f.g).unwrap().dev(),
            "test setup: the two directories must be on different filesystems"
        );
        let files = vec![
            (
                "etcd.yaml".to_string(),
                pod("etcd", Some("kube-system"), "x"),
                0o600,
            ),
            (
                "api.yaml".to_string(),
                pod("api", Some("kube-system"), "y"),
                0o644,
            ),
        ];
        // No forced copy: the rename must fail with EXDEV and fall back by itself.
        for scenario in [
            Scenario::Gate,
            Scenario::Restore,
            Scenario::RestoreWithConflict,
        ] {
            crash_everywhere(&files, scenario, false, false, Some(&mnt.0)).unwrap();
        }
        let gate = f.gate();
        f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o640);
        gate.gate("a.yaml").unwrap();
        let recs = journal::read(gate.journal_file()).unwrap().records;
        assert!(
            recs.iter()
                .any(|r| matches!(r, journal::Record::Intent(i) if i.copy)),
            "the move should have taken the copy path"
        );
        assert_eq!(
            fs::metadata(f.g.join("a.yaml")).unwrap().mode() & 0o7777,
            0o640
        );
    }

    #[test]
    fn real_read_only_gate_filesystem() {
        if !enabled() {
            return;
        }
        let outer = tempfile::tempdir_in("/var/tmp").unwrap();
        let mnt = Mount::tmpfs(&outer.path().join("gatefs"));
        let f = Fixture::with_gate_root(Some(&mnt.0));
        f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
        f.write(&f.m, "b.yaml", &pod("b", None, ""), 0o600);
        let gate = f.gate();
        gate.gate("b.yaml").unwrap();
        mnt.remount("ro");
        let before = f.contents();
        let err = gate.gate("a.yaml").unwrap_err();
        assert!(format!("{err:#}").contains("Read-only"), "{err:#}");
        let err = gate.restore_all().unwrap_err();
        assert!(format!("{err:#}").contains("b.yaml"), "{err:#}");
        assert_eq!(f.contents(), before);
        gate.recover().unwrap();
        mnt.remount("rw");
        assert_eq!(gate.restore_all().unwrap(), Vec::<String>::new());
        assert!(f.m.join("a.yaml").exists() && f.m.join("b.yaml").exists());
    }
}

#[test]
fn an_undeletable_source_takes_the_copy_back() {
    // e.g. `chattr +i` on the manifest: the copy is made, the source cannot be unlinked.
    struct ImmutableSource;
    impl StepHook for ImmutableSource {
        fn before(&self, step: &Step<'_>) -> std::result::Result<(), Errno> {
            if step.kind == StepKind::Unlink
                && step.dir == StepDir::Dir(Place::Manifests)
                && step.name == "a.yaml"
            {
                return Err(Errno::EPERM);
            }
            Ok(())
        }
    }
    let f = Fixture::new();
    f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
    f.write(&f.m, "b.yaml", &pod("b", None, ""), 0o600);
    let gate = f
        .gate()
        .with_hook(Arc::new(ImmutableSource))
        .with_forced_copy(true);
    assert!(gate.gate("a.yaml").is_err());
    gate.gate("b.yaml").unwrap();
    assert!(f.m.join("a.yaml").exists());
    assert!(!f.g.join("a.yaml").exists(), "the copy was taken back");
    assert!(f.g.join("b.yaml").exists() && !f.m.join("b.yaml").exists());
    assert_eq!(f.pending_intents(), 0);
}

#[test]
fn a_gate_dir_others_can_write_is_refused() {
    let f = Fixture::new();
    f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
    f.write(&f.m, "b.yaml", &pod("b", None, ""), 0o600);
    let gate = f.gate();
    gate.gate("a.yaml").unwrap();
    fs::set_permissions(&f.g, fs::Permissions::from_mode(0o777)).unwrap();
    fs::write(f.g.join("planted.yaml"), pod("planted", None, "")).unwrap();
    let before = f.contents();
    assert!(format!("{:#}", gate.gate("b.yaml").unwrap_err()).contains("not writable"));
    assert!(gate.restore_all().is_err());
    assert_eq!(f.contents(), before);
}

#[test]
fn a_torn_temporary_copy_is_cleaned_up_and_the_source_kept() {
    let f = Fixture::new();
    let body = pod("a", None, "a fairly long comment to tear in half");
    f.write(&f.m, "a.yaml", &body, 0o600);
    fs::create_dir(&f.g).unwrap();
    fs::set_permissions(&f.g, fs::Permissions::from_mode(0o700)).unwrap();
    // Steps: journal intent, copy, fsync of the copy (crash here), ...
    let _ = f
        .gate_with(TestHook::crash_after(2, false), true)
        .gate("a.yaml");
    let tmp = f.g.join(format!(".a.yaml{TEMP_SUFFIX}"));
    assert!(tmp.exists(), "setup: the crash left the temporary");
    // The page cache never reached the disk: only half of the copy survived.
    fs::write(&tmp, &body[..body.len() / 2]).unwrap();
    f.gate().recover().unwrap();
    assert_eq!(fs::read(f.m.join("a.yaml")).unwrap(), body);
    assert!(!tmp.exists());
    assert!(!f.g.join("a.yaml").exists());
}

#[test]
fn gating_twice_is_harmless() {
    let f = Fixture::new();
    f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
    let gate = f.gate();
    gate.gate("a.yaml").unwrap();
    gate.gate("a.yaml").unwrap();
    assert!(f.g.join("a.yaml").exists());
    assert!(gate.gate("never-existed.yaml").is_err());
}

/// A journal line as a corrupted or hand-edited journal could hold it.
fn intent_line(file: &str, from: &str, to: &str, bytes: &[u8]) -> String {
    format!(
        "{{\"record\":\"intent\",\"id\":7,\"op\":\"gate\",\"file\":\"{file}\",\"from\":\"{from}\",\"to\":\"{to}\",\"size\":{},\"sha256\":\"{}\",\"mode\":384,\"uid\":0,\"gid\":0,\"copy\":false}}\n",
        bytes.len(),
        fsio::sha256_hex(bytes)
    )
}

#[test]
fn an_intent_naming_one_directory_twice_deletes_nothing() {
    for (dir, from_to) in [(0, "manifests"), (1, "gate")] {
        let f = Fixture::new();
        f.write(&f.m, "other.yaml", &pod("other", None, ""), 0o600);
        f.gate().gate("other.yaml").unwrap();
        let where_ = if dir == 0 { &f.m } else { &f.g };
        let body = pod("etcd", Some("kube-system"), "");
        f.write(where_, "etcd.yaml", &body, 0o600);
        fs::create_dir_all(&f.state).unwrap();
        fs::write(
            f.state.join(JOURNAL_FILE),
            intent_line("etcd.yaml", from_to, from_to, &body),
        )
        .unwrap();
        let before = f.contents();
        let _ = f.gate().recover();
        assert_eq!(f.contents(), before, "{from_to} -> {from_to}");
        assert_eq!(fs::read(where_.join("etcd.yaml")).unwrap(), body);
    }
}

#[test]
fn two_names_for_one_directory_delete_nothing() {
    // The gate directory's parent becomes a symlink into the manifest directory's parent
    // after the gate was set up: both names now lead to one directory.
    let f = Fixture::new();
    let root = f.m.parent().unwrap().to_path_buf();
    let alias = root.join("alias");
    let settings = StaticPodSettings {
        manifest_dir: f.m.clone(),
        gate_dir: alias.join("manifests"),
    };
    let gate = FsGate::new(&settings, &f.state).unwrap();
    std::os::unix::fs::symlink(&root, &alias).unwrap();
    let body = pod("etcd", Some("kube-system"), "");
    f.write(&f.m, "etcd.yaml", &body, 0o600);
    fs::create_dir_all(&f.state).unwrap();
    fs::write(
        f.state.join(JOURNAL_FILE),
        intent_line("etcd.yaml", "manifests", "gate", &body),
    )
    .unwrap();
    let err = gate.recover().unwrap_err();
    assert!(format!("{err:#}").contains("same directory"), "{err:#}");
    assert_eq!(fs::read(f.m.join("etcd.yaml")).unwrap(), body);
    let err = gate.restore_all().unwrap_err();
    assert!(format!("{err:#}").contains("same directory"), "{err:#}");
    assert_eq!(fs::read(f.m.join("etcd.yaml")).unwrap(), body);
}

#[test]
fn a_stale_intent_is_set_aside_and_everything_else_restored() {
    let f = Fixture::new();
    for n in ["a", "b", "c"] {
        f.write(&f.m, &format!("{n}.yaml"), &pod(n, None, ""), 0o600);
    }
    // An interrupted move of b (its intent stays), then b removed by hand from the gate.
    let crash = TestHook::crash_after(1, false);
    let gate = f.gate();
    gate.gate("a.yaml").unwrap();
    let _ = f.gate_with(crash, false).gate("b.yaml");
    gate.gate("c.yaml").unwrap();
    assert_eq!(f.pending_intents(), 1, "setup: b's move was interrupted");
    // The crash came before the rename: b is still in the manifest directory.
    fs::remove_file(f.m.join("b.yaml")).unwrap();

    let report = gate.recover_report().unwrap();
    assert_eq!(report.set_aside.len(), 1, "{report:?}");
    assert_eq!(report.set_aside[0].file_name, "b.yaml");
    assert!(
        report.set_aside[0].reason.contains("in neither"),
        "{report:?}"
    );
    assert!(report.unsettled.is_empty());
    assert_eq!(f.pending_intents(), 0);
    let aside = fs::read_to_string(gate.set_aside_file()).unwrap();
    assert!(
        aside.contains("\"b.yaml\"") && aside.contains("in neither"),
        "{aside}"
    );
    gate.recover().unwrap();
    assert!(gate.restore_all().unwrap().is_empty());
    assert!(f.m.join("a.yaml").exists() && f.m.join("c.yaml").exists());
    assert_eq!(fs::read_to_string(gate.set_aside_file()).unwrap(), aside);
}

#[test]
fn unreadable_journal_lines_are_set_aside_and_torn_ones_skipped() {
    let f = Fixture::new();
    let body = pod("a", None, "");
    f.write(&f.m, "a.yaml", &body, 0o600);
    fs::create_dir(&f.g).unwrap();
    fs::set_permissions(&f.g, fs::Permissions::from_mode(0o700)).unwrap();
    fs::create_dir_all(&f.state).unwrap();
    let good = intent_line("a.yaml", "manifests", "gate", &body);
    let journal = format!(
        "{}\n{}{}{}",
        "{\"record\":\"intent\",\"id\":2,\"op",
        good.replace("\"gate\",\"size\"", "\"/etc\",\"size\""),
        "not json at all\n",
        good,
    );
    fs::write(f.state.join(JOURNAL_FILE), journal).unwrap();
    let gate = f.gate();
    let report = gate.recover_report().unwrap();
    assert_eq!(report.set_aside.len(), 2, "{report:?}");
    assert_eq!(report.settled.len(), 1, "{report:?}");
    let aside = fs::read_to_string(gate.set_aside_file()).unwrap();
    assert!(
        aside.contains("/etc") && aside.contains("not json at all"),
        "{aside}"
    );
    assert!(
        !aside.contains("\"id\":2"),
        "a torn line is not set aside: {aside}"
    );
    assert_eq!(fs::read(f.m.join("a.yaml")).unwrap(), body);
    assert_eq!(
        fs::read_to_string(f.state.join(JOURNAL_FILE)).unwrap(),
        "",
        "the journal is compacted"
    );
}

#[test]
fn the_daemons_gate_settles_the_journal_at_its_first_use_not_when_built() {
    let f = Fixture::new();
    let body = pod("a", None, "");
    f.write(&f.m, "a.yaml", &body, 0o600);
    fs::create_dir(&f.g).unwrap();
    fs::set_permissions(&f.g, fs::Permissions::from_mode(0o700)).unwrap();
    fs::create_dir_all(&f.state).unwrap();
    let journal = intent_line("a.yaml", "manifests", "gate", &body);
    fs::write(f.state.join(JOURNAL_FILE), &journal).unwrap();

    let gate = RecoveredFirst::new(f.gate());
    assert_eq!(
        fs::read_to_string(f.state.join(JOURNAL_FILE)).unwrap(),
        journal,
        "nothing is read before the first use"
    );
    assert!(!gate.has_gated().unwrap());
    assert_eq!(f.pending_intents(), 0, "settled before the first answer");
    gate.gate("a.yaml").unwrap();
    assert_eq!(fs::read(f.g.join("a.yaml")).unwrap(), body);
}

#[test]
fn a_damaged_journal_is_kept_as_it_was_and_its_records_still_settled() {
    for garbage in [b"x}\n".repeat(2 << 20).to_vec(), vec![0u8; 8 << 20]] {
        let f = Fixture::new();
        let body = pod("a", None, "");
        f.write(&f.m, "a.yaml", &body, 0o600);
        fs::create_dir(&f.g).unwrap();
        fs::set_permissions(&f.g, fs::Permissions::from_mode(0o700)).unwrap();
        fs::create_dir_all(&f.state).unwrap();
        // A record of a move that started, then the damage a crash or a disk leaves.
        let mut journal = intent_line("a.yaml", "manifests", "gate", &body).into_bytes();
        journal.extend_from_slice(&garbage[..garbage.len() - journal.len()]);
        fs::write(f.state.join(JOURNAL_FILE), &journal).unwrap();

        let started = std::time::Instant::now();
        let report = f.gate().recover_report().unwrap();
        println!(
            "{} bytes recovered in {:?}",
            journal.len(),
            started.elapsed()
        );
        assert_eq!(
            report.settled,
            [("a.yaml".into(), Settled::AtSource)],
            "{report:?}"
        );
        assert_eq!(fs::read(f.m.join("a.yaml")).unwrap(), body);
        assert_eq!(report.set_aside.len(), 1, "{report:?}");
        let why = &report.set_aside[0].reason;
        assert!(
            why.contains("damaged journal") && why.contains("1 record(s) read"),
            "{why}"
        );
        let kept: Vec<PathBuf> = fs::read_dir(&f.state)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().contains(".corrupt-"))
            .collect();
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert_eq!(fs::read(&kept[0]).unwrap(), journal, "kept as it was");
        let aside = fs::read_to_string(f.gate().set_aside_file()).unwrap();
        assert!(aside.len() < 2000, "{aside}");
        assert_eq!(
            fs::read_to_string(f.state.join(JOURNAL_FILE)).unwrap(),
            "",
            "the journal is compacted"
        );
    }
}

/// Where a journaled file is before recovery, relative to its intent's source and
/// destination (for an intent that names one directory twice or none of ours: the manifest
/// and gate directories).
#[derive(Debug, Clone, Copy)]
enum OnDisk {
    SourceOnly,
    DestinationOnly,
    BothSame,
    BothDiffering,
    Neither,
    /// Only our complete temporary copy, in the destination.
    TemporaryOnly,
}

#[derive(Debug, Clone, Copy)]
enum Journaled {
    Move { restore: bool },
    MoveDone { restore: bool },
    SameDirectory { gate: bool },
    UnknownDirectory,
    BadSha,
    Torn(usize),
    Nothing,
}

fn on_disk() -> impl Strategy<Value = OnDisk> {
    prop_oneof![
        Just(OnDisk::SourceOnly),
        Just(OnDisk::DestinationOnly),
        Just(OnDisk::BothSame),
        Just(OnDisk::BothDiffering),
        Just(OnDisk::Neither),
        Just(OnDisk::TemporaryOnly),
    ]
}

fn journaled() -> impl Strategy<Value = Journaled> {
    prop_oneof![
        any::<bool>().prop_map(|restore| Journaled::Move { restore }),
        any::<bool>().prop_map(|restore| Journaled::MoveDone { restore }),
        any::<bool>().prop_map(|gate| Journaled::SameDirectory { gate }),
        Just(Journaled::UnknownDirectory),
        Just(Journaled::BadSha),
        (1usize..200).prop_map(Journaled::Torn),
        Just(Journaled::Nothing),
    ]
}

/// Every regular file's bytes in both directories, temporaries included.
fn all_bytes(f: &Fixture) -> Vec<Vec<u8>> {
    f.contents()
        .into_iter()
        .map(|(_, _, bytes, _)| bytes)
        .collect()
}

fn journal_then_complete(files: &[(OnDisk, Journaled)]) -> std::result::Result<(), TestCaseError> {
    let f = Fixture::new();
    fs::create_dir(&f.g).unwrap();
    fs::set_permissions(&f.g, fs::Permissions::from_mode(0o700)).unwrap();
    fs::create_dir_all(&f.state).unwrap();
    let mut journal = String::new();
    let mut impossible = 0;
    for (i, (disk, journaled)) in files.iter().enumerate() {
        let name = format!("f{i}.yaml");
        let ours = pod(&format!("p{i}"), None, "ours");
        let theirs = pod(&format!("p{i}"), None, "theirs");
        let (from, to) = match journaled {
            Journaled::Move { restore: true } | Journaled::MoveDone { restore: true } => {
                ("gate", "manifests")
            }
            Journaled::SameDirectory { gate: true } => ("gate", "gate"),
            Journaled::SameDirectory { gate: false } => ("manifests", "manifests"),
            _ => ("manifests", "gate"),
        };
        let dir = |p: &str| if p == "gate" { &f.g } else { &f.m };
        let (src, dst) = if from == to {
            (&f.m, &f.g)
        } else {
            (dir(from), dir(to))
        };
        match disk {
            OnDisk::SourceOnly => f.write(src, &name, &ours, 0o600),
            OnDisk::DestinationOnly => f.write(dst, &name, &ours, 0o600),
            OnDisk::BothSame => {
                f.write(src, &name, &ours, 0o600);
                f.write(dst, &name, &ours, 0o600);
            }
            OnDisk::BothDiffering => {
                f.write(src, &name, &theirs, 0o600);
                f.write(dst, &name, &ours, 0o600);
            }
            OnDisk::Neither => {}
            OnDisk::TemporaryOnly => f.write(dst, &format!(".{name}{TEMP_SUFFIX}"), &ours, 0o600),
        }
        let line = intent_line(&name, from, to, &ours).replace("\"id\":7", &format!("\"id\":{i}"));
        match journaled {
            Journaled::Move { .. } | Journaled::SameDirectory { .. } => journal.push_str(&line),
            Journaled::MoveDone { .. } => {
                journal.push_str(&line);
                journal.push_str(&format!("{{\"record\":\"done\",\"id\":{i}}}\n"));
            }
            Journaled::UnknownDirectory => {
                journal.push_str(&line.replace("\"to\":\"gate\"", "\"to\":\"../etc\""));
                impossible += 1;
            }
            Journaled::BadSha => {
                journal.push_str(&line.replace("\"sha256\":\"", "\"sha256\":\"00"));
            }
            Journaled::Torn(at) => {
                journal.push_str(&line[..(*at).min(line.len() - 2)]);
                journal.push('\n');
            }
            Journaled::Nothing => {}
        }
        if matches!(journaled, Journaled::SameDirectory { .. }) {
            impossible += 1;
        }
    }
    fs::write(f.state.join(JOURNAL_FILE), &journal).unwrap();
    let before = all_bytes(&f);

    let gate = f.gate();
    let recovery = gate
        .recover_report()
        .map_err(|e| TestCaseError::fail(format!("recovery failed: {e:#}")))?;
    prop_assert!(recovery.unsettled.is_empty(), "{:?}", recovery);
    prop_assert!(recovery.set_aside.len() >= impossible, "{:?}", recovery);
    let restore = gate
        .restore_report()
        .map_err(|e| TestCaseError::fail(format!("restore failed: {e:#}")))?;
    prop_assert!(restore.failed.is_empty(), "{:?}", restore);

    let after = all_bytes(&f);
    for bytes in &before {
        prop_assert!(
            after.contains(bytes),
            "lost {:?}\nbefore {:?}\nafter {:?}\njournal {}\n{:?}",
            String::from_utf8_lossy(bytes),
            f.contents(),
            after.len(),
            journal,
            recovery
        );
    }
    prop_assert_eq!(f.pending_intents(), 0);
    let aside = fs::read_to_string(gate.set_aside_file()).unwrap_or_default();
    prop_assert_eq!(aside.lines().count(), recovery.set_aside.len(), "{}", aside);
    // Recovery has nothing left to do: running it (and `complete`) again changes nothing.
    let settled_contents = f.contents();
    let again = gate.recover_report().unwrap();
    prop_assert!(again.set_aside.is_empty() && again.unsettled.is_empty());
    prop_assert_eq!(f.contents(), settled_contents);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn recovery_and_complete_lose_no_manifest_whatever_the_journal_says(
        files in proptest::collection::vec((on_disk(), journaled()), 1..5),
    ) {
        journal_then_complete(&files)?;
    }
}

#[test]
fn a_huge_file_is_never_read_whole_nor_moved() {
    let f = Fixture::new();
    f.write(&f.m, "a.yaml", &pod("a", None, ""), 0o600);
    // Sparse: a gigabyte that costs nothing on disk, and would cost a gigabyte to read.
    let huge = fs::File::create(f.m.join("huge.yaml")).unwrap();
    huge.set_len(1 << 30).unwrap();
    let gate = f.gate();
    let scan = gate.scan(Place::Manifests).unwrap();
    assert_eq!(scan.manifests.len(), 1);
    assert_eq!(scan.refused.len(), 1, "{scan:?}");
    assert!(scan.refused[0].reason.contains("larger than"), "{scan:?}");
    assert!(gate.gate("huge.yaml").is_err());
    gate.gate("a.yaml").unwrap();
    assert_eq!(fs::metadata(f.m.join("huge.yaml")).unwrap().len(), 1 << 30);
    assert!(!f.g.join("huge.yaml").exists());
}
