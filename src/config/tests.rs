use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::error::ConfigError;
use super::load::load_str;
use super::render::to_toml_table;
use super::*;
use crate::plan::PodType;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn err(text: &str) -> ConfigError {
    match load_str(text) {
        Ok(settings) => panic!("expected an error for {text:?}, got {settings:?}"),
        Err(err) => err,
    }
}

/// Asserts file, key and line of an error and that it renders as one line naming them.
#[track_caller]
fn assert_err(err: &ConfigError, file: &str, key: &str, line: usize, needle: &str) {
    let rendered = err.to_string();
    assert_eq!(err.file, PathBuf::from(file), "{rendered}");
    assert_eq!(err.key.as_deref(), Some(key), "{rendered}");
    assert_eq!(err.location.map(|(l, _)| l), Some(line), "{rendered}");
    assert!(
        rendered.contains(needle),
        "{rendered:?} does not mention {needle:?}"
    );
    assert!(!rendered.contains('\n'), "{rendered:?} is not one line");
    assert!(
        rendered.starts_with(&format!("{file}:{line}:")),
        "{rendered:?} does not start with {file}:{line}:"
    );
    assert!(rendered.contains(key), "{rendered:?} does not name {key}");
}

fn shipped_config() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/nodegrace.toml");
    fs::read_to_string(&path).unwrap()
}

#[test]
fn empty_text_is_the_defaults() {
    assert_eq!(load_str("").unwrap(), Settings::default());
}

#[test]
fn metrics_are_on_for_every_address_by_default_and_an_empty_listen_turns_them_off() {
    assert_eq!(
        Settings::default().metrics.listen,
        Some("0.0.0.0:9847".parse().unwrap())
    );
    let off = load_str("[metrics]\nlisten = \"\"\n").unwrap();
    assert_eq!(off.metrics.listen, None);
    let v6 = load_str("[metrics]\nlisten = \"[::]:9847\"\n").unwrap();
    assert_eq!(v6.metrics.listen, Some("[::]:9847".parse().unwrap()));
}

#[test]
fn shipped_config_equals_the_defaults() {
    let text = shipped_config();
    assert_eq!(load_str(&text).unwrap(), Settings::default());
}

/// Every key check-config prints is documented in the shipped file (set or in a comment).
#[test]
fn shipped_config_mentions_every_key() {
    let text = shipped_config();
    fn keys(prefix: &str, table: &toml::Table, out: &mut Vec<String>) {
        for (k, v) in table {
            out.push(format!("{prefix}{k}"));
            if let toml::Value::Table(t) = v {
                keys(&format!("{prefix}{k}."), t, out);
            }
        }
    }
    let mut all = Vec::new();
    keys("", &to_toml_table(&Settings::default()), &mut all);
    all.extend(
        [
            "drain.plan.pod_type",
            "drain.plan.pod_priority",
            "drain.plan.pod_selector",
        ]
        .map(String::from),
    );
    all.extend(
        [
            "fallback.shutdown_grace_period",
            "fallback.shutdown_grace_period_critical_pods",
            "fallback.shutdown_grace_period_by_pod_priority.priority",
        ]
        .map(String::from),
    );
    let tables = to_toml_table(&Settings::default());
    for key in all {
        let leaf = key.rsplit('.').next().unwrap();
        let documented = if matches!(tables.get(&key), Some(toml::Value::Table(_))) {
            text.contains(&format!("\n[{key}]\n"))
        } else {
            text.contains(&format!("{leaf} ="))
                || text.contains(&format!("{leaf}  "))
                || text.contains(&format!("[[{key}]]"))
        };
        assert!(documented, "config/nodegrace.toml does not document {key}");
    }
    assert!(text.contains("[[drain.plan]]"));
    assert!(text.contains("[[fallback.shutdown_grace_period_by_pod_priority]]"));
}

const FULL: &str = r#"
state_dir = "/srv/nodegrace"

[node]
name = "worker-1.example"
kubeconfig = ""
kubelet_kubeconfig = "/srv/kubelet.conf"
renew_credential = false
credential_lifetime = "2h"

[shutdown]
max_delay = "1h 30s"
manage_logind_dropin = false
logind_dropin_dir = "/run/systemd/logind.conf.d"
logind_dropin_name = "zzz-ng.conf"
on_cancel = "complete"
after_boot = "keep"
stop_drain_timeout = "100s"
warn_kubelet_inhibitor = false

[drain]
reserve_daemonset = "10s"
reserve_static = "0s"
reserve_critical = "1m"
critical_priority = 1000000
eviction_backoff_max = "2m"
eviction_backoff_max_shutdown = "1s"
volume_detach_timeout = "0s"

[[drain.plan]]
pod_type = "Default"
pod_priority = 1000
pod_selector = { "app.kubernetes.io/component" = "frontend", tier = "web" }

[[drain.plan]]
pod_priority = -5

[[drain.plan]]
pod_type = "Static"
pod_priority = 2147483647

[fallback]
enabled = false
apiserver_timeout = "45s"
cri_endpoint = "unix:///run/crio/crio.sock"
stop_kubelet = false
kubelet_unit = "kubelet2.service"

[[fallback.shutdown_grace_period_by_pod_priority]]
priority = -10
shutdown_grace_period = "5s"

[[fallback.shutdown_grace_period_by_pod_priority]]
priority = 100000
shutdown_grace_period = "2m"

[static_pods]
manifest_dir = "/etc/k8s/static"
gate_dir = "/etc/k8s/static-gated"

[metrics]
listen = "[::1]:9999"
"#;

#[test]
fn every_key_is_applied() {
    let s = load_str(FULL).unwrap();
    assert_eq!(s.state_dir, PathBuf::from("/srv/nodegrace"));
    assert_eq!(s.node.name, "worker-1.example");
    assert_eq!(s.node.kubeconfig, None);
    assert_eq!(
        s.node.kubelet_kubeconfig,
        Some(PathBuf::from("/srv/kubelet.conf"))
    );
    assert!(!s.node.renew_credential);
    assert_eq!(s.node.credential_lifetime, secs(7200));
    assert_eq!(s.shutdown.max_delay, secs(3630));
    assert!(!s.shutdown.manage_logind_dropin);
    assert_eq!(
        s.shutdown.logind_dropin_dir,
        PathBuf::from("/run/systemd/logind.conf.d")
    );
    assert_eq!(s.shutdown.logind_dropin_name, "zzz-ng.conf");
    assert_eq!(s.shutdown.on_cancel, CompletionPolicy::Complete);
    assert_eq!(s.shutdown.after_boot, CompletionPolicy::Keep);
    assert_eq!(s.shutdown.stop_drain_timeout, secs(100));
    assert!(!s.shutdown.warn_kubelet_inhibitor);
    assert_eq!(s.drain.reserve_daemonset, secs(10));
    assert_eq!(s.drain.reserve_static, secs(0));
    assert_eq!(s.drain.reserve_critical, secs(60));
    assert_eq!(s.drain.critical_priority, 1_000_000);
    assert_eq!(s.drain.eviction_backoff_max, secs(120));
    assert_eq!(s.drain.eviction_backoff_max_shutdown, secs(1));
    assert_eq!(s.drain.volume_detach_timeout, secs(0));
    let selector: BTreeMap<String, String> = [
        (
            "app.kubernetes.io/component".to_string(),
            "frontend".to_string(),
        ),
        ("tier".to_string(), "web".to_string()),
    ]
    .into();
    assert_eq!(
        s.drain.plan,
        vec![
            DrainPlanEntrySetting {
                pod_type: PodType::Default,
                pod_priority: 1000,
                pod_selector: selector,
            },
            DrainPlanEntrySetting {
                pod_type: PodType::Default,
                pod_priority: -5,
                pod_selector: BTreeMap::new(),
            },
            DrainPlanEntrySetting {
                pod_type: PodType::Static,
                pod_priority: i32::MAX,
                pod_selector: BTreeMap::new(),
            },
        ]
    );
    assert!(!s.fallback.enabled);
    assert_eq!(s.fallback.apiserver_timeout, secs(45));
    assert_eq!(s.fallback.cri_endpoint, "unix:///run/crio/crio.sock");
    assert!(!s.fallback.stop_kubelet);
    assert_eq!(s.fallback.kubelet_unit, "kubelet2.service");
    assert_eq!(
        s.fallback.shutdown_grace_period_by_pod_priority,
        vec![
            PriorityGracePeriod {
                priority: -10,
                shutdown_grace_period: secs(5)
            },
            PriorityGracePeriod {
                priority: 100_000,
                shutdown_grace_period: secs(120)
            },
        ]
    );
    assert_eq!(s.static_pods.manifest_dir, PathBuf::from("/etc/k8s/static"));
    assert_eq!(
        s.static_pods.gate_dir,
        PathBuf::from("/etc/k8s/static-gated")
    );
    assert_eq!(s.metrics.listen, Some("[::1]:9999".parse().unwrap()));
}

#[test]
fn simple_grace_form_converts_like_the_kubelet() {
    let s = load_str(
        "[fallback]\nshutdown_grace_period = \"5m\"\nshutdown_grace_period_critical_pods = \"1m\"\n",
    )
    .unwrap();
    assert_eq!(
        s.fallback.shutdown_grace_period_by_pod_priority,
        vec![
            PriorityGracePeriod {
                priority: 0,
                shutdown_grace_period: secs(240)
            },
            PriorityGracePeriod {
                priority: 2_000_000_000,
                shutdown_grace_period: secs(60)
            },
        ]
    );
    // Only one half given: the other keeps its default (90s total, 30s critical).
    let s = load_str("[fallback]\nshutdown_grace_period = \"2m\"\n").unwrap();
    assert_eq!(
        s.fallback.shutdown_grace_period_by_pod_priority[0].shutdown_grace_period,
        secs(90)
    );
}

#[test]
fn round_trip_of_check_config_output() {
    for settings in [Settings::default(), load_str(FULL).unwrap()] {
        let loaded = Loaded {
            settings: settings.clone(),
            files: vec![PathBuf::from("/etc/nodegrace/config.toml")],
            main_missing: false,
        };
        let printed = check_config_report(Path::new("/etc/nodegrace/config.toml"), &loaded);
        let mut reread = load_str(&printed).unwrap_or_else(|e| panic!("{e}\n{printed}"));
        // The printed bands are set in the printed file; where they came from is a comment.
        reread.fallback.bands_from = settings.fallback.bands_from.clone();
        assert_eq!(reread, settings, "{printed}");
    }
}

#[test]
fn check_config_output_lists_files_and_durations_as_strings() {
    let loaded = Loaded {
        settings: Settings::default(),
        files: vec![
            PathBuf::from("/e/config.toml"),
            PathBuf::from("/e/config.d/10-a.toml"),
        ],
        main_missing: false,
    };
    let out = check_config_report(Path::new("/e/config.toml"), &loaded);
    let a = out.find("#   /e/config.toml").unwrap();
    let b = out.find("#   /e/config.d/10-a.toml").unwrap();
    assert!(a < b, "{out}");
    assert!(out.contains("max_delay = \"15m\""), "{out}");
    assert!(out.contains("listen = \"0.0.0.0:9847\""), "{out}");
    let missing = Loaded {
        files: vec![],
        main_missing: true,
        ..loaded
    };
    let out = check_config_report(Path::new("/e/config.toml"), &missing);
    assert!(out.contains("/e/config.toml does not exist"), "{out}");
}

// ---- bad files ----

#[test]
fn unknown_key_in_each_section() {
    let cases = [
        ("stat_dir = \"/x\"\n", "stat_dir", 1),
        ("[node]\nname = \"a\"\nnmae = \"b\"\n", "node.nmae", 3),
        ("[shutdown]\nmax_dealy = \"1m\"\n", "shutdown.max_dealy", 2),
        ("[drain]\n\nreserve = \"1s\"\n", "drain.reserve", 3),
        (
            "[[drain.plan]]\npod_priority = 1\npod_typ = \"Static\"\n",
            "drain.plan[0].pod_typ",
            3,
        ),
        ("[fallback]\nenable = true\n", "fallback.enable", 2),
        (
            "[[fallback.shutdown_grace_period_by_pod_priority]]\npriority = 1\nshutdown_grace_period = \"1s\"\ngrace = \"1s\"\n",
            "fallback.shutdown_grace_period_by_pod_priority[0].grace",
            4,
        ),
        ("[static_pods]\nmanifests = \"/x\"\n", "static_pods.manifests", 2),
        ("[metrics]\nport = 1\n", "metrics.port", 2),
        ("[metric]\nlisten = \"\"\n", "metric", 1),
    ];
    for (text, key, line) in cases {
        assert_err(&err(text), "<string>", key, line, "unknown field");
    }
}

#[test]
fn wrong_types() {
    let cases = [
        ("state_dir = 5\n", "state_dir", 1),
        ("[node]\nname = true\n", "node.name", 2),
        (
            "[shutdown]\nmanage_logind_dropin = \"yes\"\n",
            "shutdown.manage_logind_dropin",
            2,
        ),
        (
            "[shutdown]\non_cancel = \"later\"\n",
            "shutdown.on_cancel",
            2,
        ),
        (
            "[drain]\ncritical_priority = \"high\"\n",
            "drain.critical_priority",
            2,
        ),
        (
            "[[drain.plan]]\npod_type = \"Job\"\npod_priority = 1\n",
            "drain.plan[0].pod_type",
            2,
        ),
        ("[fallback]\nenabled = 1\n", "fallback.enabled", 2),
        ("[metrics]\nlisten = 9847\n", "metrics.listen", 2),
        ("node = 3\n", "node", 1),
    ];
    for (text, key, line) in cases {
        let e = err(text);
        assert_err(&e, "<string>", key, line, "");
        assert!(
            e.message.contains("invalid") || e.message.contains("unknown variant"),
            "{e}"
        );
    }
}

#[test]
fn bad_durations() {
    let e = err("[shutdown]\nmax_delay = 90\n");
    assert_err(
        &e,
        "<string>",
        "shutdown.max_delay",
        2,
        "write it as a string with a unit, e.g. \"90s\"",
    );
    let e = err("[drain]\nreserve_static = \"3 fortnights\"\n");
    assert_err(
        &e,
        "<string>",
        "drain.reserve_static",
        2,
        "invalid duration \"3 fortnights\"",
    );
    let e = err("[[fallback.shutdown_grace_period_by_pod_priority]]\npriority = 0\nshutdown_grace_period = 1.5\n");
    assert_err(
        &e,
        "<string>",
        "fallback.shutdown_grace_period_by_pod_priority[0].shutdown_grace_period",
        3,
        "bare number",
    );
}

#[test]
fn out_of_range_values() {
    let cases: [(&str, &str, usize, &str); 18] = [
        ("[shutdown]\nmax_delay = \"0s\"\n", "shutdown.max_delay", 2, "greater than zero"),
        ("[shutdown]\nmax_delay = \"25h\"\n", "shutdown.max_delay", 2, "at most 1day"),
        ("[shutdown]\nstop_drain_timeout = \"111s\"\n", "shutdown.stop_drain_timeout", 2, "at most 1m 50s"),
        ("[shutdown]\nlogind_dropin_name = \"nodegrace\"\n", "shutdown.logind_dropin_name", 2, ".conf"),
        ("[shutdown]\nlogind_dropin_name = \"a/b.conf\"\n", "shutdown.logind_dropin_name", 2, ".conf"),
        ("[shutdown]\nlogind_dropin_dir = \"etc/x\"\n", "shutdown.logind_dropin_dir", 2, "absolute"),
        ("state_dir = \"/var/lib/../x\"\n", "state_dir", 1, ".."),
        ("[node]\nname = \"Worker_1\"\n", "node.name", 2, "not a valid Node name"),
        ("[drain]\ncritical_priority = 3000000000\n", "drain.critical_priority", 2, "32-bit"),
        ("[drain]\neviction_backoff_max = \"0s\"\n", "drain.eviction_backoff_max", 2, "greater than zero"),
        (
            "[drain]\n\n[[drain.plan]]\npod_priority = 1\n[[drain.plan]]\npod_priority = -2147483649\n",
            "drain.plan[1].pod_priority",
            6,
            "32-bit",
        ),
        (
            "[[drain.plan]]\npod_priority = 7\n\n[[drain.plan]]\npod_type = \"Default\"\npod_priority = 7\n",
            "drain.plan[1]",
            4,
            "duplicates drain.plan[0]",
        ),
        ("[fallback]\ncri_endpoint = \"/run/containerd.sock\"\n", "fallback.cri_endpoint", 2, "unix://"),
        ("[fallback]\ncri_endpoint = \"unix://run/c.sock\"\n", "fallback.cri_endpoint", 2, "absolute"),
        (
            "[fallback]\nshutdown_grace_period = \"30s\"\nshutdown_grace_period_critical_pods = \"30s\"\n",
            "fallback.shutdown_grace_period_critical_pods",
            3,
            "must be less than",
        ),
        (
            "[[fallback.shutdown_grace_period_by_pod_priority]]\npriority = 10\nshutdown_grace_period = \"1s\"\n[[fallback.shutdown_grace_period_by_pod_priority]]\npriority = 10\nshutdown_grace_period = \"2s\"\n",
            "fallback.shutdown_grace_period_by_pod_priority[1].priority",
            5,
            "strictly ascending",
        ),
        (
            "[[fallback.shutdown_grace_period_by_pod_priority]]\npriority = 10\nshutdown_grace_period = \"0s\"\n",
            "fallback.shutdown_grace_period_by_pod_priority[0].shutdown_grace_period",
            3,
            "greater than zero",
        ),
        ("[static_pods]\ngate_dir = \"/etc/kubernetes/manifests/gated\"\n", "static_pods.gate_dir", 2, "inside"),
    ];
    for (text, key, line, needle) in cases {
        assert_err(&err(text), "<string>", key, line, needle);
    }
    assert_err(
        &err("[metrics]\nlisten = \"localhost:1\"\n"),
        "<string>",
        "metrics.listen",
        2,
        "IP address",
    );
    assert_err(
        &err("[shutdown]\nmax_delay = \"80s\"\n"),
        "<string>",
        "shutdown.max_delay",
        2,
        "nothing of shutdown.max_delay",
    );
    assert_err(
        &err("[fallback]\nshutdown_grace_period_by_pod_priority = []\n"),
        "<string>",
        "fallback.shutdown_grace_period_by_pod_priority",
        2,
        "at least one band",
    );
}

/// What the daemon (or `nodegrace complete`) would refuse at start, check-config refuses
/// with the same FILE:LINE:COL: key: message form.
#[test]
fn values_the_daemon_cannot_use_are_refused() {
    let cases: [(&str, &str, usize, &str); 24] = [
        ("[fallback]\nkubelet_unit = \"dbus.service\"\n", "fallback.kubelet_unit", 2, "is not the kubelet"),
        ("[fallback]\nkubelet_unit = \"nodegrace.service\"\n", "fallback.kubelet_unit", 2, "is not the kubelet"),
        ("[fallback]\nkubelet_unit = \"systemd-logind.service\"\n", "fallback.kubelet_unit", 2, "is not the kubelet"),
        ("state_dir = \"/etc/kubernetes/manifests/ng\"\n", "state_dir", 1, "must not be the manifest directory"),
        ("state_dir = \"/dev/null/nodegrace\"\n", "state_dir", 1, "cannot be a directory: /dev/null is not a directory"),
        ("state_dir = \"/proc/nodegrace\"\n", "state_dir", 1, "is on /proc"),
        ("state_dir = \"/sys/fs/nodegrace/x\"\n", "state_dir", 1, "is on /sys"),
        ("[static_pods]\ngate_dir = \"/proc/self/gate\"\n", "static_pods.gate_dir", 2, "is on /proc"),
        (
            "state_dir = \"/srv/ng\"\n[static_pods]\nmanifest_dir = \"/srv\"\ngate_dir = \"/var/gate\"\n",
            "state_dir",
            1,
            "kubelet would read nodegrace's files",
        ),
        ("[static_pods]\ngate_dir = \"/\"\n", "static_pods.gate_dir", 2, "root directory"),
        ("state_dir = \"/\"\n", "state_dir", 1, "root directory"),
        ("[static_pods]\ngate_dir = \"/etc/kubernetes\"\n", "static_pods.gate_dir", 2, "must not contain the manifest directory"),
        ("[static_pods]\ngate_dir = \"/var/lib/nodegrace\"\n", "static_pods.gate_dir", 2, "must not be the state directory"),
        ("[fallback]\napiserver_timeout = \"1ns\"\n", "fallback.apiserver_timeout", 2, "1ns is too short; at least 1s"),
        ("[shutdown]\nmax_delay = \"999ms\"\n", "shutdown.max_delay", 2, "too short"),
        ("[shutdown]\nstop_drain_timeout = \"10ms\"\n", "shutdown.stop_drain_timeout", 2, "too short"),
        ("[drain]\nreserve_static = \"1ns\"\n", "drain.reserve_static", 2, "at least 1s, or 0"),
        ("[drain]\neviction_backoff_max_shutdown = \"1us\"\n", "drain.eviction_backoff_max_shutdown", 2, "too short"),
        ("[drain]\nvolume_detach_timeout = \"500ms\"\n", "drain.volume_detach_timeout", 2, "too short"),
        (
            "[fallback]\nshutdown_grace_period = \"30s\"\nshutdown_grace_period_critical_pods = \"500ms\"\n",
            "fallback.shutdown_grace_period_critical_pods",
            3,
            "too short",
        ),
        (
            "[fallback]\nshutdown_grace_period_critical_pods = \"29s\"\nshutdown_grace_period = \"29.5s\"\n",
            "fallback.shutdown_grace_period",
            3,
            "leaves other pods 500ms",
        ),
        ("state_dir = \"/var/lib/ng\\u0000x\"\n", "state_dir", 1, "control characters"),
        ("[node]\nkubeconfig = \"/etc/k\\nx\"\n", "node.kubeconfig", 2, "control characters"),
        ("[fallback]\nkubelet_unit = \"kube\\u0000let.service\"\n", "fallback.kubelet_unit", 2, "control characters"),
    ];
    for (text, key, line, needle) in cases {
        assert_err(&err(text), "<string>", key, line, needle);
    }
    // Zero stays "off" where it was.
    let s = load_str("[drain]\nreserve_static = \"0s\"\nvolume_detach_timeout = \"0s\"\n").unwrap();
    assert_eq!(s.drain.reserve_static, Duration::ZERO);
    assert_eq!(s.drain.volume_detach_timeout, Duration::ZERO);
}

#[test]
fn a_fifo_or_a_device_as_configuration_is_refused_without_hanging() {
    let dir = Dir::new();
    nix::unistd::mkfifo(&dir.main(), nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let began = std::time::Instant::now();
    let e = load(&dir.main()).unwrap_err();
    assert!(began.elapsed() < Duration::from_secs(5));
    assert_eq!(e.file, dir.main());
    assert!(
        e.to_string()
            .contains("cannot read: a FIFO, not a regular file"),
        "{e}"
    );

    // The main file may be a symlink, but not to something that is not a file.
    fs::remove_file(dir.main()).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.main()).unwrap();
    let e = load(&dir.main()).unwrap_err();
    assert!(
        e.to_string().contains("a device, not a regular file"),
        "{e}"
    );
    fs::remove_file(dir.main()).unwrap();

    nix::unistd::mkfifo(
        &dir.0.path().join("config.d/10-fifo.toml"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    let e = load(&dir.main()).unwrap_err();
    assert!(e.to_string().contains("not a regular file"), "{e}");
}

#[test]
fn drop_ins_past_a_few_mib_together_are_refused_naming_the_one_that_passed() {
    let dir = Dir::new();
    let mut text = String::from("# padding\n");
    while text.len() < 1_000_000 {
        text.push_str("# ........................................................\n");
    }
    for n in 0..8 {
        dir.write(&format!("config.d/{n:02}.toml"), &text);
    }
    let e = load(&dir.main()).unwrap_err().to_string();
    assert!(
        e.contains("config.d/04.toml") && e.contains("pass 4 MiB together"),
        "{e}"
    );
}

#[test]
fn an_oversized_configuration_is_refused() {
    let dir = Dir::new();
    let mut text = String::from("# padding\n");
    while text.len() <= crate::fsutil::CONFIG_FILE_LIMIT as usize {
        text.push_str("# ........................................................\n");
    }
    dir.write("config.toml", &text);
    let e = load(&dir.main()).unwrap_err();
    assert!(e.to_string().contains("larger than 1048576 bytes"), "{e}");
}

#[test]
fn both_fallback_forms_in_one_file() {
    let text = "[fallback]\nshutdown_grace_period = \"90s\"\n\n[[fallback.shutdown_grace_period_by_pod_priority]]\npriority = 0\nshutdown_grace_period = \"1m\"\n";
    let e = err(text);
    assert_err(
        &e,
        "<string>",
        "fallback.shutdown_grace_period_by_pod_priority",
        4,
        "cannot be combined with fallback.shutdown_grace_period",
    );
}

#[test]
fn syntax_error_names_file_and_line() {
    let e = err("[node]\nname = \"unterminated\n");
    assert_eq!(e.location.map(|(l, _)| l), Some(2), "{e}");
    assert!(!e.to_string().contains('\n'));
}

#[test]
fn column_is_reported() {
    let e = err("[drain]\n  reserve_static = \"nope\"\n");
    assert_eq!(e.location, Some((2, 20)), "{e}");
}

// ---- files and drop-ins ----

struct Dir(tempfile::TempDir);

impl Dir {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join("config.d")).unwrap();
        Dir(dir)
    }
    fn main(&self) -> PathBuf {
        self.0.path().join("config.toml")
    }
    fn write(&self, name: &str, text: &str) -> PathBuf {
        let path = self.0.path().join(name);
        fs::write(&path, text).unwrap();
        path
    }
}

#[test]
fn drop_ins_merge_in_byte_order_after_main() {
    let dir = Dir::new();
    dir.write(
        "config.toml",
        r#"
[shutdown]
max_delay = "20m"
on_cancel = "complete"

[drain]
reserve_static = "5s"
[[drain.plan]]
pod_priority = 1
[[drain.plan]]
pod_priority = 2
"#,
    );
    // "Z" (0x5a) sorts before "a" (0x61) in byte order, unlike in a case-blind sort.
    dir.write(
        "config.d/a-later.toml",
        "[shutdown]\nmax_delay = \"30m\"\n[[drain.plan]]\npod_priority = 3\n",
    );
    dir.write(
        "config.d/Z-first.toml",
        "[shutdown]\nmax_delay = \"25m\"\nafter_boot = \"keep\"\n",
    );
    dir.write("config.d/.hidden.toml", "bogus = 1\n");
    dir.write("config.d/notes.txt", "bogus = 1\n");
    dir.write("config.d/b.toml.bak", "bogus = 1\n");
    let loaded = load_report(&dir.main()).unwrap();
    assert_eq!(
        loaded.files,
        vec![
            dir.main(),
            dir.0.path().join("config.d/Z-first.toml"),
            dir.0.path().join("config.d/a-later.toml"),
        ]
    );
    assert!(!loaded.main_missing);
    let s = loaded.settings;
    // Scalars: the last file wins.
    assert_eq!(s.shutdown.max_delay, secs(30 * 60));
    // Tables merge: keys set only by earlier files survive.
    assert_eq!(s.shutdown.on_cancel, CompletionPolicy::Complete);
    assert_eq!(s.shutdown.after_boot, CompletionPolicy::Keep);
    assert_eq!(s.drain.reserve_static, secs(5));
    // Arrays replace.
    let priorities: Vec<i32> = s.drain.plan.iter().map(|e| e.pod_priority).collect();
    assert_eq!(priorities, vec![3]);
    assert_eq!(load(&dir.main()).unwrap(), s);
}

#[test]
fn later_fallback_form_replaces_the_other() {
    let dir = Dir::new();
    dir.write(
        "config.toml",
        "[fallback]\nshutdown_grace_period = \"10m\"\nshutdown_grace_period_critical_pods = \"2m\"\n",
    );
    dir.write(
        "config.d/10.toml",
        "[[fallback.shutdown_grace_period_by_pod_priority]]\npriority = 5\nshutdown_grace_period = \"7s\"\n",
    );
    let s = load(&dir.main()).unwrap();
    assert_eq!(
        s.fallback.shutdown_grace_period_by_pod_priority,
        vec![PriorityGracePeriod {
            priority: 5,
            shutdown_grace_period: secs(7)
        }]
    );
    dir.write(
        "config.d/20.toml",
        "[fallback]\nshutdown_grace_period_critical_pods = \"20s\"\n",
    );
    let s = load(&dir.main()).unwrap();
    // The band list from 10.toml is gone; the total from the main file was dropped with it
    // when 10.toml switched forms, so the default total (90s) applies.
    assert_eq!(
        s.fallback.shutdown_grace_period_by_pod_priority,
        vec![
            PriorityGracePeriod {
                priority: 0,
                shutdown_grace_period: secs(70)
            },
            PriorityGracePeriod {
                priority: 2_000_000_000,
                shutdown_grace_period: secs(20)
            },
        ]
    );
}

#[test]
fn validation_error_after_merge_names_the_file_that_set_the_key() {
    let dir = Dir::new();
    dir.write("config.toml", "[static_pods]\nmanifest_dir = \"/m\"\n");
    let dropin = dir.write(
        "config.d/50-gate.toml",
        "# gate\n\n[static_pods]\ngate_dir = \"/m/gated\"\n",
    );
    let e = load(&dir.main()).unwrap_err();
    assert_err(
        &e,
        dropin.to_str().unwrap(),
        "static_pods.gate_dir",
        4,
        "inside",
    );

    // The same mistake the other way round: the drop-in moves the manifest dir above the
    // default gate dir.
    let dir = Dir::new();
    let dropin = dir.write(
        "config.d/1.toml",
        "[static_pods]\nmanifest_dir = \"/var/lib/nodegrace\"\n",
    );
    let e = load(&dir.main()).unwrap_err();
    assert_err(
        &e,
        dropin.to_str().unwrap(),
        "static_pods.manifest_dir",
        2,
        "inside",
    );
}

#[test]
fn parse_error_in_a_drop_in_names_the_drop_in() {
    let dir = Dir::new();
    dir.write("config.toml", "[drain]\nreserve_static = \"5s\"\n");
    let dropin = dir.write("config.d/10-x.toml", "[drain]\nreserve_statik = \"5s\"\n");
    let e = load(&dir.main()).unwrap_err();
    assert_err(
        &e,
        dropin.to_str().unwrap(),
        "drain.reserve_statik",
        2,
        "unknown field",
    );
}

#[test]
fn missing_main_file_is_defaults_plus_drop_ins() {
    let dir = Dir::new();
    let dropin = dir.write("config.d/1.toml", "[node]\nname = \"n1\"\n");
    let loaded = load_report(&dir.main()).unwrap();
    assert!(loaded.main_missing);
    assert_eq!(loaded.files, vec![dropin]);
    let mut expected = Settings::default();
    expected.node.name = "n1".into();
    assert_eq!(loaded.settings, expected);

    let empty = tempfile::tempdir().unwrap();
    let loaded = load_report(&empty.path().join("config.toml")).unwrap();
    assert!(loaded.main_missing);
    assert!(loaded.files.is_empty());
    assert_eq!(loaded.settings, Settings::default());
}

#[test]
fn unreadable_main_file_is_an_error() {
    let dir = Dir::new();
    // A directory cannot be read as a file, even by root.
    fs::create_dir(dir.main()).unwrap();
    let e = load(&dir.main()).unwrap_err();
    assert_eq!(e.file, dir.main());
    assert!(e.message.starts_with("cannot read"), "{e}");
}

#[test]
fn a_huge_bad_value_is_not_echoed_whole() {
    let dir = Dir::new();
    let value = "9".repeat(900_000);
    fs::write(
        dir.main(),
        format!("[shutdown]\nmax_delay = \"{value}x\"\n"),
    )
    .unwrap();
    let e = load(&dir.main()).unwrap_err();
    assert!(e.to_string().len() < 1000, "{} bytes", e.to_string().len());
    assert_eq!(e.location.map(|l| l.0), Some(2), "{e}");
}

#[test]
fn pod_selector_labels_are_what_the_apiserver_accepts() {
    let dir = Dir::new();
    let with = |selector: &str| {
        fs::write(
            dir.main(),
            format!("[[drain.plan]]\npod_priority = 1\npod_selector = {selector}\n"),
        )
        .unwrap();
        load(&dir.main())
    };
    for good in [
        r#"{ app = "web" }"#,
        r#"{ "app.kubernetes.io/component" = "front-end_1.2" }"#,
        r#"{ "example.com/tier" = "" }"#,
        r#"{ A_b-1 = "x" }"#,
    ] {
        assert!(with(good).is_ok(), "{good}: {:?}", with(good));
    }
    for bad in [
        r#"{ "" = "x" }"#,
        r#"{ "-app" = "x" }"#,
        r#"{ "app/" = "x" }"#,
        r#"{ "Example.com/app" = "x" }"#,
        r#"{ "a/b/c" = "x" }"#,
        r#"{ "app name" = "x" }"#,
        r#"{ app = "has space" }"#,
        r#"{ app = "-leading" }"#,
    ] {
        let e = with(bad).unwrap_err();
        assert_eq!(
            e.key.as_deref(),
            Some("drain.plan[0].pod_selector"),
            "{bad}: {e}"
        );
        assert!(e.location.is_some(), "{bad}: {e}");
        assert!(e.message.contains("label"), "{bad}: {e}");
    }
    let long = format!(r#"{{ app = "{}" }}"#, "a".repeat(64));
    assert!(with(&long).is_err());
}

#[test]
fn drain_plan_entries_are_capped() {
    let entries = |n: usize| {
        (0..n)
            .map(|i| format!("[[drain.plan]]\npod_priority = {i}\n"))
            .collect::<String>()
    };
    let dir = Dir::new();
    fs::write(dir.main(), entries(64)).unwrap();
    assert_eq!(load(&dir.main()).unwrap().drain.plan.len(), 64);
    fs::write(dir.main(), entries(65)).unwrap();
    let e = load(&dir.main()).unwrap_err();
    assert_eq!(e.key.as_deref(), Some("drain.plan"), "{e}");
    assert!(e.message.contains("at most 64"), "{e}");
    assert!(e.location.is_some(), "{e}");
}

#[test]
fn a_main_file_symlinked_to_nothing_is_an_error_not_the_defaults() {
    let dir = Dir::new();
    std::os::unix::fs::symlink(dir.0.path().join("gone.toml"), dir.main()).unwrap();
    let e = load(&dir.main()).unwrap_err();
    assert_eq!(e.file, dir.main());
    assert!(e.message.contains("symlink"), "{e}");
    // The symlink to a real file still works.
    let target = dir.write("real.toml", "[node]\nname = \"x\"\n");
    fs::remove_file(dir.main()).unwrap();
    std::os::unix::fs::symlink(&target, dir.main()).unwrap();
    assert_eq!(load(&dir.main()).unwrap().node.name, "x");
}

#[test]
fn non_utf8_file_is_an_error() {
    let dir = Dir::new();
    fs::write(dir.main(), b"state_dir = \"/\xff\"\n").unwrap();
    let e = load(&dir.main()).unwrap_err();
    assert!(e.message.contains("UTF-8"), "{e}");
}

#[test]
fn symlinked_drop_in_is_an_error() {
    let dir = Dir::new();
    let target = dir.write("real.toml", "[node]\nname = \"x\"\n");
    let link = dir.0.path().join("config.d/10-link.toml");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let e = load(&dir.main()).unwrap_err();
    assert_eq!(e.file, link);
    assert!(e.to_string().contains("symlink"), "{e}");
}

#[test]
fn non_regular_drop_in_is_an_error() {
    let dir = Dir::new();
    let sub = dir.0.path().join("config.d/10-dir.toml");
    fs::create_dir(&sub).unwrap();
    let e = load(&dir.main()).unwrap_err();
    assert_eq!(e.file, sub);
    assert!(e.message.contains("not a regular file"), "{e}");
}

#[test]
fn node_name_prefers_the_configured_name() {
    let mut s = Settings::default();
    s.node.name = "configured".into();
    assert_eq!(s.node_name().unwrap(), "configured");
    s.node.name.clear();
    let host = s.node_name().unwrap();
    assert!(!host.is_empty());
    assert_eq!(host, host.to_lowercase());
}

#[test]
fn restart_required_lists_changed_static_keys_only() {
    let a = Settings::default();
    let mut b = a.clone();
    b.drain.reserve_static = secs(1);
    b.shutdown.on_cancel = CompletionPolicy::Complete;
    assert!(restart_required(&a, &b).is_empty());
    b.static_pods.gate_dir = "/elsewhere".into();
    b.metrics.listen = None;
    assert_eq!(
        restart_required(&a, &b),
        vec!["static_pods.gate_dir", "metrics.listen"]
    );
}

/// Every key a SIGHUP applies, with the tests that show it reaching what uses it (in
/// `tests/daemon_reload.rs` unless named `file::test`; one per component, comma-separated).
const RELOADED: &[(&str, &str)] = &[
    (
        "shutdown.on_cancel",
        "a_reloaded_on_cancel_completes_a_cancelled_shutdown",
    ),
    (
        "shutdown.after_boot",
        "a_reloaded_after_boot_completes_the_last_shutdown",
    ),
    (
        "shutdown.stop_drain_timeout",
        "daemon_lifecycle::reload_applies_runtime_keys_and_keeps_the_config_when_invalid",
    ),
    (
        "shutdown.warn_kubelet_inhibitor",
        "daemon_lifecycle::a_reloaded_warn_kubelet_inhibitor_reports_the_kubelets_lock",
    ),
    (
        "drain.plan",
        "a_reloaded_drain_plan_orders_the_next_shutdown",
    ),
    (
        "drain.reserve_daemonset",
        "reloaded_reserves_set_the_budget_needed",
    ),
    (
        "drain.reserve_static",
        "reloaded_reserves_set_the_budget_needed",
    ),
    (
        "drain.reserve_critical",
        "a_reloaded_drain_reserve_moves_the_escalation",
    ),
    (
        "drain.critical_priority",
        "reloaded_reserves_set_the_budget_needed",
    ),
    (
        "drain.eviction_backoff_max",
        "reloaded_backoff_caps_pace_the_blocked_evictions",
    ),
    (
        "drain.eviction_backoff_max_shutdown",
        "reloaded_backoff_caps_pace_the_blocked_evictions",
    ),
    (
        "drain.max_concurrent_requests",
        "a_reloaded_max_concurrent_requests_bounds_the_evictions_in_flight",
    ),
    (
        "drain.volume_detach_timeout",
        "a_reloaded_volume_detach_timeout_releases_sooner",
    ),
    (
        "drain.kubelet_root_dir",
        "a_reloaded_kubelet_root_dir_is_where_mounts_are_read",
    ),
    (
        "fallback.enabled",
        "a_reloaded_fallback_section_drives_the_offline_drain",
    ),
    (
        "fallback.apiserver_timeout",
        "a_reloaded_fallback_section_drives_the_offline_drain",
    ),
    (
        "fallback.stop_kubelet",
        "a_reloaded_fallback_section_drives_the_offline_drain",
    ),
    (
        "fallback.kubelet_unit",
        "a_reloaded_fallback_section_drives_the_offline_drain",
    ),
    (
        "fallback.shutdown_grace_period_by_pod_priority",
        "a_reloaded_fallback_section_drives_the_offline_drain",
    ),
    (
        "fallback.kubelet_config",
        "the_kubelets_files_are_read_again_on_reload",
    ),
    (
        "fallback.kubelet_config_dir",
        "the_kubelets_files_are_read_again_on_reload",
    ),
    (
        "reboot.sentinel",
        "realk8s_waves::a_node_needing_a_reboot_takes_its_turn_reboots_and_frees_its_slot_once_healthy",
    ),
    (
        "reboot.sentinel_command",
        "realk8s_waves::a_node_needing_a_reboot_takes_its_turn_reboots_and_frees_its_slot_once_healthy",
    ),
    (
        "reboot.without_wave",
        "realk8s_waves::a_node_needing_a_reboot_takes_its_turn_reboots_and_frees_its_slot_once_healthy",
    ),
];

/// The keys of the rendered settings; a list (the plan, the bands) is one key.
fn rendered_keys(table: &toml::Table, prefix: &str, out: &mut Vec<String>) {
    for (k, v) in table {
        match v {
            toml::Value::Table(t) => rendered_keys(t, &format!("{prefix}{k}."), out),
            _ => out.push(format!("{prefix}{k}")),
        }
    }
}

/// A new key must be classified: restart-only, or reloaded with a test that exists.
#[test]
fn every_key_is_restart_only_or_reloaded_with_its_test() {
    let mut keys = Vec::new();
    rendered_keys(&to_toml_table(&Settings::default()), "", &mut keys);
    let mut classified: Vec<String> = RESTART_ONLY
        .iter()
        .chain(RELOADED.iter().map(|(key, _)| key))
        .map(|k| k.to_string())
        .collect();
    let count = classified.len();
    classified.sort();
    classified.dedup();
    assert_eq!(classified.len(), count, "a key is listed twice");
    keys.sort();
    assert_eq!(
        classified, keys,
        "RESTART_ONLY and RELOADED against the rendered keys"
    );
    // The shipped file's opening comment is the one list users read.
    let text = shipped_config();
    let header: String = text
        .lines()
        .take_while(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join(" ");
    for key in RESTART_ONLY {
        // A section may be named for its keys when all of them need a restart.
        let section = key.split_once('.').map(|(section, _)| section);
        let whole = section.filter(|section| {
            keys.iter()
                .filter(|k| k.starts_with(&format!("{section}.")))
                .all(|k| RESTART_ONLY.contains(&k.as_str()))
        });
        assert!(
            header.contains(key) || whole.is_some_and(|s| header.contains(&format!("[{s}]"))),
            "config/nodegrace.toml's header does not say that {key} needs a restart"
        );
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests");
    for (key, test) in RELOADED
        .iter()
        .flat_map(|(k, t)| t.split(", ").map(move |t| (k, t)))
    {
        let (file, name) = test.split_once("::").unwrap_or(("daemon_reload", test));
        let text = fs::read_to_string(dir.join(format!("{file}.rs"))).unwrap();
        assert!(
            text.contains(&format!("async fn {name}()")),
            "{key}: tests/{file}.rs has no test {name}"
        );
    }
}

#[test]
fn missing_field_and_duplicate_key_name_the_place() {
    let e = err("[[drain.plan]]\npod_priority = 1\n\n[[drain.plan]]\npod_type = \"Static\"\n");
    assert_err(
        &e,
        "<string>",
        "drain.plan[1]",
        4,
        "missing field `pod_priority`",
    );
    let e = err("[shutdown]\nmax_delay = \"1h\"\nmax_delay = \"2h\"\n");
    assert_eq!(e.location, Some((3, 1)), "{e}");
    assert!(e.message.contains("duplicate key `max_delay`"), "{e}");
}

#[test]
fn a_key_nested_past_the_recursion_limit_names_its_line() {
    let deep = format!("a{} = 1", ".b".repeat(200));
    let e = err(&format!(
        "[shutdown]\nmax_delay = \"1h\"\n\n[drain]\n{deep}\n[metrics]\n"
    ));
    assert_eq!(e.location, Some((5, 1)), "{e}");
    assert!(e.message.contains("recursion limit"), "{e}");
}

#[test]
fn only_the_effective_value_is_validated() {
    let dir = Dir::new();
    dir.write("config.toml", "[shutdown]\nmax_delay = \"48h\"\n");
    dir.write("config.d/1.toml", "[shutdown]\nmax_delay = \"2h\"\n");
    assert_eq!(load(&dir.main()).unwrap().shutdown.max_delay, secs(7200));
}

mod roundtrip {
    use super::*;
    use proptest::collection::{btree_map, btree_set, vec};
    use proptest::prelude::*;

    /// At least a second, as every duration setting, and at most `max_ms` (the bound of the
    /// setting it is drawn for: 110 s and 1 ns is refused).
    fn duration(max_ms: u64) -> impl Strategy<Value = Duration> {
        (1_000..=max_ms, 0u32..1_000_000).prop_map(move |(ms, ns)| {
            (Duration::from_millis(ms) + Duration::from_nanos(ns.into()))
                .min(Duration::from_millis(max_ms))
        })
    }

    fn pod_type() -> impl Strategy<Value = PodType> {
        prop_oneof![
            Just(PodType::Default),
            Just(PodType::DaemonSet),
            Just(PodType::Static)
        ]
    }

    fn plan() -> impl Strategy<Value = Vec<DrainPlanEntrySetting>> {
        let entry = (
            pod_type(),
            any::<i32>(),
            btree_map(
                "([a-z0-9]{1,4}(\\.[a-z0-9]{1,4}){0,2}/)?[A-Za-z0-9]([A-Za-z0-9._-]{0,5}[A-Za-z0-9])?",
                "([A-Za-z0-9]([A-Za-z0-9._-]{0,4}[A-Za-z0-9])?)?",
                0..3,
            ),
        )
            .prop_map(
                |(pod_type, pod_priority, pod_selector)| DrainPlanEntrySetting {
                    pod_type,
                    pod_priority,
                    pod_selector,
                },
            );
        vec(entry, 0..5).prop_map(|mut entries| {
            let mut seen = Vec::new();
            entries.retain(|e| {
                let new = !seen.contains(e);
                seen.push(e.clone());
                new
            });
            entries
        })
    }

    fn bands() -> impl Strategy<Value = Vec<PriorityGracePeriod>> {
        (btree_set(any::<i32>(), 1..5), vec(duration(3_600_000), 5)).prop_map(
            |(priorities, graces)| {
                priorities
                    .into_iter()
                    .zip(graces)
                    .map(|(priority, shutdown_grace_period)| PriorityGracePeriod {
                        priority,
                        shutdown_grace_period,
                    })
                    .collect()
            },
        )
    }

    prop_compose! {
        fn settings()(
            name in "([a-z0-9]([a-z0-9-]{0,8}[a-z0-9])?)?",
            kubeconfig in proptest::option::of("/[a-z]{1,8}/[a-z ]{1,8}"),
            max_delay in duration(24 * 3_600_000),
            bools in vec(any::<bool>(), 6),
            stop_drain_timeout in duration(110_000),
            reserves in vec(prop_oneof![Just(0u64), 1_000u64..=1_500], 3),
            critical_priority in any::<i32>(),
            backoff in duration(3_600_000),
            backoff_shutdown in duration(300_000),
            volume in 0u64..=600,
            apiserver_timeout in duration(3_600_000),
            plan in plan(),
            bands in bands(),
            port in 1u16..,
            v6 in any::<bool>(),
            metrics_on in any::<bool>(),
        ) -> Settings {
            let mut s = Settings::default();
            s.node.name = name;
            s.node.kubeconfig = kubeconfig.map(PathBuf::from);
            // Leave room for the reserves (at most 3 * 1500 ms).
            s.shutdown.max_delay = max_delay + secs(5);
            s.shutdown.max_delay = s.shutdown.max_delay.min(Duration::from_secs(24 * 3600));
            s.shutdown.manage_logind_dropin = bools[0];
            s.shutdown.on_cancel = if bools[1] { CompletionPolicy::Keep } else { CompletionPolicy::Complete };
            s.shutdown.after_boot = if bools[2] { CompletionPolicy::Keep } else { CompletionPolicy::Complete };
            s.shutdown.stop_drain_timeout = stop_drain_timeout;
            s.shutdown.warn_kubelet_inhibitor = bools[3];
            s.drain.reserve_daemonset = Duration::from_millis(reserves[0]);
            s.drain.reserve_static = Duration::from_millis(reserves[1]);
            s.drain.reserve_critical = Duration::from_millis(reserves[2]);
            s.drain.critical_priority = critical_priority;
            s.drain.eviction_backoff_max = backoff;
            s.drain.eviction_backoff_max_shutdown = backoff_shutdown;
            s.drain.volume_detach_timeout = secs(volume);
            s.drain.plan = plan;
            s.fallback.enabled = bools[5];
            s.fallback.apiserver_timeout = apiserver_timeout;
            s.fallback.shutdown_grace_period_by_pod_priority = bands;
            s.metrics.listen = metrics_on.then(|| {
                if v6 { format!("[::]:{port}") } else { format!("0.0.0.0:{port}") }
                    .parse()
                    .unwrap()
            });
            s
        }
    }

    proptest! {
        #[test]
        fn check_config_output_reloads_to_the_same_settings(settings in settings()) {
            let loaded = Loaded { settings: settings.clone(), files: vec![], main_missing: true };
            let printed = check_config_report(Path::new("/x/config.toml"), &loaded);
            let mut reread = load_str(&printed).map_err(|e| TestCaseError::fail(format!("{e}\n{printed}")))?;
            // The printed bands are set in the printed file; where they came from is a comment.
            reread.fallback.bands_from = settings.fallback.bands_from.clone();
            prop_assert_eq!(reread, settings);
        }

        #[test]
        fn a_reload_keeps_exactly_the_restart_only_keys(running in settings(), reloaded in settings()) {
            let kept = keep_restart_only(&running, reloaded.clone());
            prop_assert_eq!(restart_required(&running, &kept), Vec::<&str>::new());
            let (kept, reloaded) = (to_toml_table(&kept), to_toml_table(&reloaded));
            for (key, _) in RELOADED {
                prop_assert_eq!(
                    super::super::render::lookup(&kept, key),
                    super::super::render::lookup(&reloaded, key),
                    "{}", key
                );
            }
        }
    }
}

// ---- the kubelet's own Graceful Node Shutdown settings ----

fn kubelet_dir(dir: &Dir, config: &str, dropins: &[(&str, &str)]) -> String {
    dir.write("kubelet.yaml", config);
    fs::create_dir_all(dir.0.path().join("kubelet.conf.d")).unwrap();
    for (name, text) in dropins {
        dir.write(&format!("kubelet.conf.d/{name}"), text);
    }
    format!(
        "[fallback]\nkubelet_config = \"{}\"\nkubelet_config_dir = \"{}\"\n",
        dir.0.path().join("kubelet.yaml").display(),
        dir.0.path().join("kubelet.conf.d").display()
    )
}

#[test]
fn the_kubelets_bands_are_used_unless_nodegrace_sets_its_own() {
    let dir = Dir::new();
    let keys = kubelet_dir(
        &dir,
        "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriod: 2m\nshutdownGracePeriodCriticalPods: 20s\n",
        &[("50-prio.conf", "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nshutdownGracePeriod: 0s\nshutdownGracePeriodCriticalPods: 0s\nshutdownGracePeriodByPodPriority:\n- priority: 0\n  shutdownGracePeriodSeconds: 40\n- priority: 1000\n  shutdownGracePeriodSeconds: 10\n")],
    );
    dir.write("config.toml", &keys);
    let loaded = load_report(&dir.main()).unwrap();
    let fb = &loaded.settings.fallback;
    assert_eq!(
        fb.shutdown_grace_period_by_pod_priority,
        [
            PriorityGracePeriod {
                priority: 0,
                shutdown_grace_period: Duration::from_secs(40)
            },
            PriorityGracePeriod {
                priority: 1000,
                shutdown_grace_period: Duration::from_secs(10)
            },
        ]
    );
    assert!(fb.kubelet_gns);
    assert_eq!(
        fb.bands_from,
        BandsSource::Kubelet(vec![
            dir.0.path().join("kubelet.yaml"),
            dir.0.path().join("kubelet.conf.d/50-prio.conf"),
        ])
    );
    let report = check_config_report(&dir.main(), &loaded);
    assert!(
        report.contains("# fallback bands from the kubelet's configuration ("),
        "{report}"
    );
    assert!(report.contains("50-prio.conf)"), "{report}");
    assert!(
        report.contains("leaves the GracefulNodeShutdownInProgress condition to it"),
        "{report}"
    );

    // nodegrace's own bands, in a drop-in, win; the kubelet's GNS is still seen.
    dir.write(
        "config.d/20-bands.toml",
        "[fallback]\nshutdown_grace_period = \"60s\"\nshutdown_grace_period_critical_pods = \"15s\"\n",
    );
    let loaded = load_report(&dir.main()).unwrap();
    let fb = &loaded.settings.fallback;
    assert_eq!(
        fb.shutdown_grace_period_by_pod_priority[0].shutdown_grace_period,
        Duration::from_secs(45)
    );
    assert!(fb.kubelet_gns);
    assert_eq!(
        fb.bands_from,
        BandsSource::Nodegrace(dir.0.path().join("config.d/20-bands.toml"))
    );
    let report = check_config_report(&dir.main(), &loaded);
    assert!(
        report.contains("# fallback bands from [fallback] in "),
        "{report}"
    );
}

#[test]
fn a_broken_kubelet_configuration_is_a_warning_that_changes_nothing() {
    let dir = Dir::new();
    let keys = kubelet_dir(&dir, "shutdownGracePeriod: [oops\n", &[]);
    dir.write("config.toml", &keys);
    let loaded = load_report(&dir.main()).unwrap();
    let fb = &loaded.settings.fallback;
    assert_eq!(
        fb.shutdown_grace_period_by_pod_priority,
        Settings::default()
            .fallback
            .shutdown_grace_period_by_pod_priority
    );
    assert_eq!(fb.bands_from, BandsSource::Defaults);
    assert!(!fb.kubelet_gns);
    assert!(
        fb.kubelet_set_aside.as_deref().is_some_and(|w| w.contains(
            "the kubelet refuses it too (it does not start with it): "
        ) && w.ends_with(
            "; instead the fallback uses nodegrace's defaults and nodegrace writes GracefulNodeShutdownInProgress itself"
        )),
        "{:?}",
        fb.kubelet_set_aside
    );
    let report = check_config_report(&dir.main(), &loaded);
    assert!(
        report.contains("# warning: the kubelet's configuration is set aside: "),
        "{report}"
    );
    assert!(report.contains("kubelet.yaml: not YAML"), "{report}");
    assert!(
        report.contains("# fallback bands from nodegrace's defaults"),
        "{report}"
    );

    // "" reads nothing; a relative path is an error of nodegrace's own file.
    dir.write(
        "config.toml",
        "[fallback]\nkubelet_config = \"\"\nkubelet_config_dir = \"\"\n",
    );
    let loaded = load_report(&dir.main()).unwrap();
    assert_eq!(loaded.settings.fallback.kubelet_config, None);
    assert!(loaded.settings.fallback.kubelet_set_aside.is_none());
    dir.write(
        "config.toml",
        "[fallback]\nkubelet_config = \"kubelet.yaml\"\n",
    );
    let err = load_report(&dir.main()).unwrap_err().to_string();
    assert!(err.contains("fallback.kubelet_config"), "{err}");
}
