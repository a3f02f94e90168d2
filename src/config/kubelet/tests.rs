use super::*;

const HEAD: &str = "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n";

fn band(priority: i32, secs: u64) -> PriorityGracePeriod {
    PriorityGracePeriod {
        priority,
        shutdown_grace_period: Duration::from_secs(secs),
    }
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The verdict on the `--config` file `main` with `drop_ins` after it.
fn verdict_of(main: &[u8], drop_ins: &[&str]) -> Verdict {
    let mut files = vec![FileText {
        shown: "config.yaml".into(),
        bytes: main,
        main: true,
    }];
    for (i, d) in drop_ins.iter().enumerate() {
        files.push(FileText {
            shown: format!("{i}.conf"),
            bytes: d.as_bytes(),
            main: false,
        });
    }
    decide(&files)
}

enum Want {
    On(&'static [(i32, u64)]),
    Off,
    Refused(&'static str),
    NotMirrored(&'static str),
}

/// The kubelet's own cases (its validation, its shutdown manager's migration, its
/// decoding), each with what the kubelet does with it.
#[test]
fn the_kubelets_accepted_and_refused_configurations() {
    use Want::*;
    const CRIT: i32 = SYSTEM_CRITICAL_PRIORITY;
    let cases: Vec<(&str, String, Vec<&str>, Want)> = vec![
        // Accepted.
        ("grace alone: a critical band of 0s", format!("{HEAD}shutdownGracePeriod: 30s\n"), vec![], On(&[(0, 30), (CRIT, 0)])),
        ("critical equal to the total", format!("{HEAD}shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 30s\n"), vec![], On(&[(0, 0), (CRIT, 30)])),
        ("the usual two", format!("{HEAD}shutdownGracePeriod: 2m\nshutdownGracePeriodCriticalPods: 30s\n"), vec![], On(&[(0, 90), (CRIT, 30)])),
        ("1500ms: whole seconds, cut", format!("{HEAD}shutdownGracePeriod: 1500ms\n"), vec![], On(&[(0, 1), (CRIT, 0)])),
        ("each band cut to whole seconds", format!("{HEAD}shutdownGracePeriod: 3.9s\nshutdownGracePeriodCriticalPods: 1.5s\n"), vec![], On(&[(0, 2), (CRIT, 1)])),
        ("Go duration forms", format!("{HEAD}shutdownGracePeriod: 1h0m0.5s\nshutdownGracePeriodCriticalPods: +.5h\n"), vec![], On(&[(0, 1800), (CRIT, 1800)])),
        ("a band of 0s", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- priority: 0\n  shutdownGracePeriodSeconds: 0\n- priority: 1000\n  shutdownGracePeriodSeconds: 10\n"), vec![], On(&[(0, 0), (1000, 10)])),
        ("priority 1e3, seconds 60.0 (JSON integers once YAML is JSON)", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- priority: 1e3\n  shutdownGracePeriodSeconds: 60.0\n"), vec![], On(&[(1000, 60)])),
        ("a band's missing fields are 0", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- shutdownGracePeriodSeconds: 5\n- priority: 7\n"), vec![], On(&[(0, 5), (7, 0)])),
        ("sorted by priority", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 100000, shutdownGracePeriodSeconds: 20}}\n- {{priority: -5, shutdownGracePeriodSeconds: 120}}\n"), vec![], On(&[(-5, 120), (100000, 20)])),
        ("a merge key", format!("{HEAD}base: &gns\n  shutdownGracePeriod: 40s\n  shutdownGracePeriodCriticalPods: 10s\n<<: *gns\n"), vec![], On(&[(0, 30), (CRIT, 10)])),
        ("a key given twice: the last (the kubelet's lenient decoding)", format!("{HEAD}shutdownGracePeriod: 30s\nfeatureGates:\n  GracefulNodeShutdown: false\n  GracefulNodeShutdown: true\nshutdownGracePeriod: 40s\n"), vec![], On(&[(0, 40), (CRIT, 0)])),
        ("only the first document is read", format!("{HEAD}shutdownGracePeriod: 30s\n---\n{HEAD}shutdownGracePeriod: 1d\n---\n- [unclosed\n"), vec![], On(&[(0, 30), (CRIT, 0)])),
        ("the file's own key wins over a merge key", format!("{HEAD}base: &gns\n  shutdownGracePeriod: 40s\n<<: *gns\nshutdownGracePeriod: 20s\n"), vec![], On(&[(0, 20), (CRIT, 0)])),
        ("priority-based gate off: the older fields migrated", format!("{HEAD}featureGates:\n  GracefulNodeShutdownBasedOnPodPriority: false\nshutdownGracePeriod: 30s\n"), vec![], On(&[(0, 30), (CRIT, 0)])),
        ("gates as YAML 1.1 booleans", format!("{HEAD}featureGates:\n  GracefulNodeShutdown: on\n  GracefulNodeShutdownBasedOnPodPriority: yes\nshutdownGracePeriod: 30s\n"), vec![], On(&[(0, 30), (CRIT, 0)])),
        ("a drop-in replaces one field", format!("{HEAD}shutdownGracePeriod: 60s\nshutdownGracePeriodCriticalPods: 20s\n"), vec!["apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodCriticalPods: 10s\n"], On(&[(0, 50), (CRIT, 10)])),
        ("a drop-in's null puts the list back to none", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 0, shutdownGracePeriodSeconds: 9}}\n"), vec!["apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodByPodPriority: null\nshutdownGracePeriod: 20s\n"], On(&[(0, 20), (CRIT, 0)])),
        ("a drop-in's null gate is the default again", format!("{HEAD}featureGates: {{GracefulNodeShutdown: false}}\n"), vec!["apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nfeatureGates: {GracefulNodeShutdown: null}\nshutdownGracePeriod: 10s\n"], On(&[(0, 10), (CRIT, 0)])),
        // Accepted, GNS off.
        ("GNS not configured", HEAD.to_string(), vec![], Off),
        ("zero grace", format!("{HEAD}shutdownGracePeriod: 0s\nshutdownGracePeriodCriticalPods: \"0\"\n"), vec![], Off),
        ("the gate off alone", format!("{HEAD}featureGates:\n  GracefulNodeShutdown: false\n"), vec![], Off),
        ("the gate off: a negative grace is not checked", format!("{HEAD}featureGates:\n  GracefulNodeShutdown: off\nshutdownGracePeriod: -5s\n"), vec![], Off),
        ("an empty list", format!("{HEAD}shutdownGracePeriodByPodPriority: []\n"), vec![], Off),
        ("a drop-in turns it off", format!("{HEAD}shutdownGracePeriod: 60s\n"), vec!["apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriod: 0s\n"], Off),
        // Accepted by the kubelet, not mirrored by nodegrace.
        ("two bands for one priority", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 5, shutdownGracePeriodSeconds: 9}}\n- {{priority: 5, shutdownGracePeriodSeconds: 3}}\n"), vec![], NotMirrored("two bands for priority 5")),
        ("a negative band", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 5, shutdownGracePeriodSeconds: -1}}\n"), vec![], NotMirrored("grace period of -1s")),
        ("a band over a day", format!("{HEAD}shutdownGracePeriod: 25h\n"), vec![], NotMirrored("grace period of 90000s")),
        // Refused by the kubelet's validation.
        ("grace 0, critical 30s", format!("{HEAD}shutdownGracePeriod: 0s\nshutdownGracePeriodCriticalPods: 30s\n"), vec![], Refused("longer than shutdownGracePeriod")),
        ("critical above the total", format!("{HEAD}shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 40s\n"), vec![], Refused("longer than")),
        ("critical beside the list", format!("{HEAD}shutdownGracePeriodCriticalPods: 0s\nshutdownGracePeriod: 0s\nshutdownGracePeriodByPodPriority:\n- {{priority: 0, shutdownGracePeriodSeconds: 10}}\nfeatureGates: {{}}\n"), vec!["apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriodCriticalPods: 10s\nshutdownGracePeriod: 10s\n"], Refused("beside shutdownGracePeriod")),
        ("both forms", format!("{HEAD}shutdownGracePeriod: 30s\nshutdownGracePeriodByPodPriority:\n- {{priority: 0, shutdownGracePeriodSeconds: 10}}\n"), vec![], Refused("beside")),
        ("the gate off with a grace period", format!("{HEAD}featureGates:\n  GracefulNodeShutdown: false\nshutdownGracePeriod: 30s\n"), vec![], Refused("GracefulNodeShutdown feature gate is off")),
        ("the priority gate off with a list", format!("{HEAD}featureGates:\n  GracefulNodeShutdownBasedOnPodPriority: false\nshutdownGracePeriodByPodPriority:\n- {{priority: 0, shutdownGracePeriodSeconds: 10}}\n"), vec![], Refused("GracefulNodeShutdownBasedOnPodPriority feature gate is off")),
        ("grace under a second", format!("{HEAD}shutdownGracePeriod: 500ms\n"), vec![], Refused("neither 0 nor at least 1s")),
        ("critical under a second", format!("{HEAD}shutdownGracePeriod: 2s\nshutdownGracePeriodCriticalPods: 999ms\n"), vec![], Refused("neither 0 nor at least 1s")),
        ("a negative grace", format!("{HEAD}shutdownGracePeriod: -5s\nshutdownGracePeriodCriticalPods: -6s\n"), vec![], Refused("neither 0 nor at least 1s")),
        // Refused by the kubelet's decoding.
        ("a number for a duration", format!("{HEAD}shutdownGracePeriod: 30\n"), vec![], Refused("shutdownGracePeriod: not a duration")),
        ("a day is no Go unit", format!("{HEAD}shutdownGracePeriod: 1d\n"), vec![], Refused("not a duration")),
        ("a fraction of a priority", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 1.5, shutdownGracePeriodSeconds: 10}}\n"), vec![], Refused("priority: not a 32-bit integer")),
        ("a priority over 32 bits", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 3e9, shutdownGracePeriodSeconds: 10}}\n"), vec![], Refused("priority: not a 32-bit integer")),
        ("a quoted number", format!("{HEAD}shutdownGracePeriodByPodPriority:\n- {{priority: 0, shutdownGracePeriodSeconds: \"10\"}}\n"), vec![], Refused("whole number of seconds")),
        ("a list that is not one", format!("{HEAD}shutdownGracePeriodByPodPriority: 10\n"), vec![], Refused("not a list")),
        ("a gate that is not a boolean", format!("{HEAD}featureGates:\n  GracefulNodeShutdown: maybe\n"), vec![], Refused("featureGates.GracefulNodeShutdown: not true or false")),
        ("another gate that is not a boolean", format!("{HEAD}featureGates:\n  SomeGate: 3\n"), vec![], Refused("a gate set to something other")),
        ("no kind", "apiVersion: kubelet.config.k8s.io/v1beta1\nshutdownGracePeriod: 30s\n".into(), vec![], Refused("no kind")),
        ("no apiVersion", "kind: KubeletConfiguration\nshutdownGracePeriod: 30s\n".into(), vec![], Refused("no apiVersion")),
        ("another kind", "apiVersion: v1\nkind: Pod\n".into(), vec![], Refused("its kind is not KubeletConfiguration")),
        ("another version", "apiVersion: kubelet.config.k8s.io/v1alpha1\nkind: KubeletConfiguration\n".into(), vec![], Refused("its apiVersion is not")),
        ("a drop-in without kind", format!("{HEAD}shutdownGracePeriod: 30s\n"), vec!["shutdownGracePeriod: 10s\n"], Refused("0.conf: not a KubeletConfiguration (no kind)")),
        ("an empty file", String::new(), vec![], Refused("config.yaml: empty")),
        ("an empty drop-in", format!("{HEAD}shutdownGracePeriod: 30s\n"), vec![""], Refused("0.conf: empty")),
        ("only a comment", "# nothing\n".into(), vec![], Refused("no kind and apiVersion")),
        ("a list, not a mapping", "- a\n".into(), vec![], Refused("no kind and apiVersion")),
        ("not YAML", format!("{HEAD}shutdownGracePeriod: [1, 2\n"), vec![], Refused("not YAML")),
    ];
    for (name, main, drop_ins, want) in cases {
        let got = verdict_of(main.as_bytes(), &drop_ins);
        match (&want, &got) {
            (On(bands), Verdict::On(got_bands)) => {
                let bands: Vec<_> = bands.iter().map(|(p, s)| band(*p, *s)).collect();
                assert_eq!(got_bands, &bands, "{name}");
            }
            (Off, Verdict::Off) => {}
            (Refused(why), Verdict::Refused(got_why))
            | (NotMirrored(why), Verdict::NotMirrored(got_why)) => {
                assert!(got_why.contains(why), "{name}: {got_why}");
            }
            _ => panic!("{name}: {got:?}"),
        }
    }
}

#[test]
fn byte_order_marks_and_utf16_are_read_as_the_kubelet_reads_them() {
    let text = format!("{HEAD}shutdownGracePeriod: 30s\n");
    let want = Verdict::On(vec![band(0, 30), band(SYSTEM_CRITICAL_PRIORITY, 0)]);
    let bom = [b"\xef\xbb\xbf".as_slice(), text.as_bytes()].concat();
    assert_eq!(verdict_of(&bom, &[]), want);
    let le: Vec<u8> = [0xff, 0xfe]
        .into_iter()
        .chain(text.encode_utf16().flat_map(u16::to_le_bytes))
        .collect();
    assert_eq!(verdict_of(&le, &[]), want);
    let be: Vec<u8> = [0xfe, 0xff]
        .into_iter()
        .chain(text.encode_utf16().flat_map(u16::to_be_bytes))
        .collect();
    assert_eq!(verdict_of(&be, &[]), want);
    assert!(matches!(verdict_of(b"\xff\x00\xfe", &[]), Verdict::Refused(w) if w.contains("UTF-8")));
}

#[test]
fn go_durations_as_go_parses_them() {
    for (s, ns) in [
        ("30s", 30 * SECOND_NS),
        ("1m30s", 90 * SECOND_NS),
        ("1.5h", 5400 * SECOND_NS),
        ("0", 0),
        ("-0", 0),
        ("0s", 0),
        ("500ms", SECOND_NS / 2),
        ("1500ms", 3 * SECOND_NS / 2),
        ("2h0m0s", 7200 * SECOND_NS),
        ("-5s", -5 * SECOND_NS),
        ("+1s", SECOND_NS),
        (".5s", SECOND_NS / 2),
        ("1.s", SECOND_NS),
        ("1\u{b5}s", 1000),
        ("3ns4us", 4003),
        ("2562047h47m16.854775807s", i64::MAX),
    ] {
        assert_eq!(go_duration(s), Some(ns), "{s}");
    }
    for s in [
        "",
        "30",
        "1d",
        "s",
        "1m30",
        "abc",
        ".s",
        "-",
        "+",
        "1..5s",
        "2562047h47m16.854775808s",
        "9999999999999999999h",
    ] {
        assert_eq!(go_duration(s), None, "{s:?}");
    }
}

#[test]
fn deep_nesting_and_too_many_or_too_large_drop_ins_are_not_read_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let head = format!("{HEAD}shutdownGracePeriod: 30s\nshutdownGracePeriodCriticalPods: 10s\n");
    let config = write(
        dir.path(),
        "config.yaml",
        &format!("{head}x: {}", "[".repeat((1 << 20) - 200)),
    );
    let d = dir.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let start = std::time::Instant::now();
    let read_now = read(Some(&config), Some(&d));
    assert!(start.elapsed() < std::time::Duration::from_secs(1));
    assert!(read_now.bands().is_empty() && !read_now.gns_on());
    assert!(
        matches!(&read_now.verdict, Verdict::NotRead(w) if w.contains("nested deeper than 64 levels at line 5 column 68")),
        "{:?}",
        read_now.verdict
    );

    write(dir.path(), "config.yaml", &head);
    for i in 0..=MAX_DROP_INS {
        write(&d, &format!("{i:03}.conf"), HEAD);
    }
    let many = read(Some(&config), Some(&d));
    assert!(
        matches!(&many.verdict, Verdict::NotRead(w) if w.contains("more than the 64 drop-ins read")),
        "{:?}",
        many.verdict
    );

    for i in 0..=MAX_DROP_INS {
        std::fs::remove_file(d.join(format!("{i:03}.conf"))).unwrap();
    }
    let big = format!("{HEAD}#{}\n", "x".repeat(300 << 10));
    for i in 0..4 {
        write(&d, &format!("{i}.conf"), &big);
    }
    let large = read(Some(&config), Some(&d));
    assert!(
        matches!(&large.verdict, Verdict::NotRead(w) if w.contains("3.conf: the kubelet's configuration and drop-ins pass 1 MiB together")),
        "{:?}",
        large.verdict
    );
    std::fs::remove_file(d.join("3.conf")).unwrap();
    assert_eq!(read(Some(&config), Some(&d)).bands().len(), 2);
}

#[test]
fn drop_ins_in_the_kubelets_order_dot_files_and_subdirectories_included() {
    let dir = tempfile::tempdir().unwrap();
    let main = write(
        dir.path(),
        "config.yaml",
        &format!("{HEAD}shutdownGracePeriod: 60s\nshutdownGracePeriodCriticalPods: 20s\n"),
    );
    let d = dir.path().join("kubelet.conf.d");
    std::fs::create_dir_all(d.join("15-sub")).unwrap();
    let crit = |s: &str| format!("{HEAD}shutdownGracePeriodCriticalPods: {s}\n");
    write(&d, "20-late.conf", &crit("10s"));
    write(&d, "10-early.conf", &crit("50s"));
    write(&d, ".05-hidden.conf", &crit("40s"));
    write(&d.join("15-sub"), "a.conf", &crit("30s"));
    write(&d, "30-ignored.yaml", "shutdownGracePeriod: 999s\n");
    let k = read(Some(&main), Some(&d));
    assert_eq!(k.bands(), [band(0, 50), band(SYSTEM_CRITICAL_PRIORITY, 10)]);
    assert_eq!(
        k.files,
        [
            main.clone(),
            d.join(".05-hidden.conf"),
            d.join("10-early.conf"),
            d.join("15-sub/a.conf"),
            d.join("20-late.conf")
        ]
    );
    // A drop-in turning the kubelet's GNS off.
    write(
        &d,
        "40-off.conf",
        &format!("{HEAD}shutdownGracePeriod: 0s\nshutdownGracePeriodCriticalPods: 0s\n"),
    );
    let k = read(Some(&main), Some(&d));
    assert_eq!(k.verdict, Verdict::Off);
    assert!(!k.gns_on() && k.set_aside().is_none());
}

#[test]
fn nothing_there_is_gns_off_and_nothing_set_aside() {
    let dir = tempfile::tempdir().unwrap();
    let none = read(
        Some(&dir.path().join("missing.yaml")),
        Some(&dir.path().join("nodir")),
    );
    assert_eq!(none, KubeletShutdown::default());
    assert!(none.set_aside().is_none());
}

#[test]
fn a_file_that_is_no_kubelet_configuration_is_refused_as_the_kubelet_refuses_it() {
    let k = read(Some(Path::new("/proc/self/status")), None);
    assert!(
        matches!(&k.verdict, Verdict::Refused(w) if w.starts_with("/proc/self/status: ")),
        "{:?}",
        k.verdict
    );
    assert!(k
        .set_aside()
        .unwrap()
        .contains("the kubelet refuses it too"));
}

#[test]
fn files_nodegrace_does_not_read_leave_the_kubelets_gns_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let good = write(
        dir.path(),
        "config.yaml",
        &format!("{HEAD}shutdownGracePeriod: 60s\n"),
    );
    let unknown = |k: &KubeletShutdown, what: &str| {
        assert!(k.bands().is_empty() && !k.gns_on(), "{k:?}");
        assert!(
            matches!(&k.verdict, Verdict::NotRead(w) if w.contains(what)),
            "{what}: {:?}",
            k.verdict
        );
        assert!(k.set_aside().unwrap().contains("is not known"));
    };
    // A symlinked file, a symlinked drop-in directory, a symlinked drop-in: not followed.
    let link = dir.path().join("link.yaml");
    std::os::unix::fs::symlink(&good, &link).unwrap();
    unknown(&read(Some(&link), None), "symlink");
    let d = dir.path().join("d");
    std::fs::create_dir(&d).unwrap();
    let dlink = dir.path().join("dlink");
    std::os::unix::fs::symlink(&d, &dlink).unwrap();
    unknown(&read(Some(&good), Some(&dlink)), "symlink");
    std::os::unix::fs::symlink(&good, d.join("10-link.conf")).unwrap();
    unknown(&read(Some(&good), Some(&d)), "10-link.conf");
    // A directory where the file should be.
    unknown(&read(Some(dir.path()), None), "not a regular file");
    // The files themselves are left as they were.
    assert_eq!(
        std::fs::read_to_string(&good).unwrap(),
        format!("{HEAD}shutdownGracePeriod: 60s\n")
    );
}

#[test]
fn no_value_of_the_file_is_quoted_in_a_refusal() {
    let secret = "c2VjcmV0LXRva2VuLXZhbHVl";
    for text in [
        format!("{HEAD}shutdownGracePeriod: {secret}\n"),
        format!("{HEAD}featureGates:\n  X: {secret}\n"),
        format!("{HEAD}shutdownGracePeriodByPodPriority:\n- priority: {secret}\n"),
        format!("{HEAD}token: {secret}\nbad: [unclosed\n"),
    ] {
        let v = verdict_of(text.as_bytes(), &[]);
        assert!(
            matches!(&v, Verdict::Refused(w) if !w.contains(secret)),
            "{v:?}"
        );
    }
}
