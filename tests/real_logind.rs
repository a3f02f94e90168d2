//! Real-logind tier: nodegrace and its unit inside a booted Debian (systemd-nspawn), a real
//! `systemctl poweroff`, and from outside the times at which systemd began stopping units.
//! Runs only with `NODEGRACE_REAL_TESTS=1` as root and a `--features test-hooks` build
//! (`NODEGRACE_TEST_DRAIN_SECONDS` makes the drain take a known time).

mod real;

use std::time::Duration;

use real::{first_with, Container, Spec};

/// Budget nodegrace is configured for; the container's logind starts at 30 s.
const MAX_DELAY_SECS: f64 = 180.0;
/// How late after the drain's end systemd may begin stopping units and still count as
/// "right after the release" (measured: 0.02-0.04 s; generous for a loaded 2-core machine).
const RELEASE_SLACK: f64 = 2.0;
/// Timestamps come from different processes and clocks reads; allow this much early.
const EARLY_SLACK: f64 = 0.25;

const TEST_CONFIG: &str = r#"# nodegrace real-logind test configuration
[node]
name = "nodegrace-test"

[shutdown]
max_delay = "3m"
"#;

/// What many nodes have: a package's logind drop-in that silently lowers the delay budget.
const LOW_LOGIND_DROPIN: &str = "[Login]\nInhibitDelayMaxSec=30\n";

fn skip(test: &str) -> bool {
    if !real::enabled(&format!("real_logind::{test}")) {
        return true;
    }
    real::require_prerequisites();
    false
}

/// The container every nodegrace test boots: the built binary where the package puts it, the
/// repository's unit, a test config, a low logind drop-in and a marker unit.
fn nodegrace_spec(drain_secs: u32) -> Spec {
    nodegrace_spec_with(drain_secs, TEST_CONFIG)
}

/// [`nodegrace_spec`] with another configuration.
fn nodegrace_spec_with(drain_secs: u32, config: &str) -> Spec {
    if !cfg!(feature = "test-hooks") {
        panic!("the real-logind tier needs a test-hooks build: cargo test --features test-hooks");
    }
    let mut spec = Spec::default();
    spec.bind("/usr/bin/nodegrace", real::nodegrace_binary())
        .bind(
            "/etc/systemd/system/nodegrace.service",
            real::repo_file("systemd/nodegrace.service"),
        )
        .file(
            "/etc/systemd/system/nodegrace.service.d/50-test-hooks.conf",
            format!("[Service]\nEnvironment=NODEGRACE_TEST_DRAIN_SECONDS={drain_secs}\n"),
        )
        .file("/etc/nodegrace/config.toml", config)
        .file(
            "/etc/systemd/logind.conf.d/50-unattended-upgrades.conf",
            LOW_LOGIND_DROPIN,
        )
        .file(
            "/etc/systemd/system/marker.service",
            real::marker_unit("marker"),
        )
        .want("nodegrace.service")
        .want("marker.service");
    spec
}

fn inhibit_delay_max_usec(c: &Container) -> u64 {
    let out = c.run(&[
        "busctl",
        "get-property",
        "org.freedesktop.login1",
        "/org/freedesktop/login1",
        "org.freedesktop.login1.Manager",
        "InhibitDelayMaxUSec",
    ]);
    // "t 90000000"
    out.split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("unexpected busctl output {out:?}"))
}

fn assert_holds_delay_inhibitor(c: &Container) {
    let list = c.run(&["systemd-inhibit", "--list", "--no-pager", "--no-legend"]);
    assert!(
        list.lines()
            .any(|l| l.contains("nodegrace") && l.contains("shutdown") && l.contains("delay")),
        "nodegrace holds no shutdown delay inhibitor:\n{list}"
    );
}

/// When logind announced the shutdown (it logs this as it emits PrepareForShutdown(true)).
fn signal_time(c: &Container) -> f64 {
    let logind = c.journal_of("systemd-logind");
    first_with(&logind, "The system will power off now")
        .unwrap_or_else(|| panic!("logind never announced the poweroff:\n{}", c.journal_text()))
        .time
}

fn marker_time(c: &Container) -> f64 {
    c.stop_time("marker").unwrap_or_else(|| {
        panic!(
            "the marker unit was never stopped (systemd did not stop units):\n{}",
            c.journal_text()
        )
    })
}

fn poweroff_and_wait(c: &mut Container, argv: &[&str], timeout: Duration) {
    // systemctl may be cut off by the shutdown it started; its exit status is not the test.
    let _ = c.exec(argv);
    let status = c.wait_exit(timeout).unwrap_or_else(|| {
        panic!(
            "the container did not power off within {timeout:?}:\n{}",
            c.journal_text()
        )
    });
    assert!(
        status.success(),
        "systemd-nspawn exited with {status}:\n{}",
        c.console()
    );
}

/// Proves the harness itself: a plain `systemd-inhibit` delay lock held for 3 s after the
/// signal delays the marker by 3 s, and the low drop-in really lowers logind's budget. If this
/// fails, the nodegrace tests below cannot be trusted either.
#[test]
fn harness_measures_a_plain_delay_lock() {
    if skip("harness_measures_a_plain_delay_lock") {
        return;
    }
    let mut spec = Spec::default();
    spec.file(
        "/etc/systemd/system/holder.service",
        "[Service]\nExecStart=/usr/bin/systemd-inhibit --what=shutdown --mode=delay /bin/bash -c \
         'grep -m1 \"boolean true\" <(dbus-monitor --system \"type=signal,member=PrepareForShutdown\"); \
         echo holder-draining; sleep 3; echo holder-released'\n",
    )
    .file(
        "/etc/systemd/logind.conf.d/50-unattended-upgrades.conf",
        LOW_LOGIND_DROPIN,
    )
    .file("/etc/systemd/system/marker.service", real::marker_unit("marker"))
    .want("holder.service")
    .want("marker.service");
    let mut c = Container::boot("harness", &spec);
    c.wait_active("marker.service", Duration::from_secs(30));
    real::wait_until("the holder's inhibitor", Duration::from_secs(10), || {
        let list = c.run(&["systemd-inhibit", "--list", "--no-pager", "--no-legend"]);
        list.contains("delay").then_some(())
    });
    assert_eq!(inhibit_delay_max_usec(&c), 30_000_000);
    // The monitor must be subscribed before the signal is sent.
    real::wait_until("dbus-monitor to subscribe", Duration::from_secs(10), || {
        real::first_with(&c.journal(), "became a monitor").map(|_| ())
    });

    poweroff_and_wait(&mut c, &["systemctl", "poweroff"], Duration::from_secs(30));

    let signal = signal_time(&c);
    let marker = marker_time(&c);
    let released = first_with(&c.journal(), "holder-released")
        .expect("holder never released")
        .time;
    let waited = marker - signal;
    eprintln!("plain delay lock: signal -> units stopping {waited:.3} s (lock held 3 s)");
    assert!(
        (3.0 - EARLY_SLACK..3.0 + RELEASE_SLACK).contains(&waited),
        "poweroff waited {waited:.3} s for a 3 s lock"
    );
    assert!(marker >= released - EARLY_SLACK && marker - released < RELEASE_SLACK);
}

/// (a) + (b): nodegrace raises logind's budget past the low drop-in, holds its inhibitor, and a
/// `systemctl poweroff` waits exactly as long as the drain, then continues at once.
#[test]
fn poweroff_waits_for_the_drain_and_continues_on_release() {
    if skip("poweroff_waits_for_the_drain_and_continues_on_release") {
        return;
    }
    const DRAIN: f64 = 4.0;
    let mut c = Container::boot("poweroff", &nodegrace_spec(DRAIN as u32));
    c.wait_active("nodegrace.service", Duration::from_secs(30));
    assert_holds_delay_inhibitor(&c);

    // (b) The drop-in nodegrace wrote sorts after 50-unattended-upgrades.conf and wins.
    let usec = real::wait_until(
        "InhibitDelayMaxUSec raised to the configured 3 min",
        Duration::from_secs(15),
        || {
            let v = inhibit_delay_max_usec(&c);
            (v == (MAX_DELAY_SECS * 1e6) as u64).then_some(v)
        },
    );
    eprintln!("InhibitDelayMaxUSec after nodegrace started: {usec}");

    poweroff_and_wait(&mut c, &["systemctl", "poweroff"], Duration::from_secs(60));

    let signal = signal_time(&c);
    let marker = marker_time(&c);
    let waited = marker - signal;
    eprintln!(
        "nodegrace drain {DRAIN} s: signal -> units stopping {waited:.3} s (budget {MAX_DELAY_SECS} s)"
    );
    assert!(
        waited >= DRAIN - EARLY_SLACK,
        "poweroff continued after {waited:.3} s, before the {DRAIN} s drain finished:\n{}",
        c.journal_text()
    );
    assert!(
        waited < DRAIN + RELEASE_SLACK,
        "poweroff waited {waited:.3} s for a {DRAIN} s drain: the inhibitor was not released at once:\n{}",
        c.journal_text()
    );
    let ng = c.journal_of("nodegrace");
    let draining = first_with(&ng, "draining the node")
        .unwrap_or_else(|| panic!("nodegrace never began draining:\n{}", c.journal_text()));
    eprintln!(
        "drain began {:.3} s after the signal, kind {:?}",
        draining.time - signal,
        draining.field("KIND")
    );
    // logind 252's signal does not say which shutdown it is; its ScheduledShutdown does.
    assert_eq!(draining.field("KIND"), Some("poweroff"));
    let released = first_with(&ng, "inhibitor released")
        .unwrap_or_else(|| panic!("nodegrace logged no release:\n{}", c.journal_text()));
    eprintln!(
        "inhibitor released (fd store emptied, fd closed) -> units stopping {:.3} s",
        marker - released.time
    );
    assert!(
        released.time <= marker + EARLY_SLACK && released.time >= signal + DRAIN - EARLY_SLACK,
        "release logged at {:.3}, signal {signal:.3}, units stopping {marker:.3}",
        released.time
    );
}

/// (c) A shutdown that bypasses logind sends no PrepareForShutdown: systemd stops nodegrace
/// before the kubelet (the unit is ordered after it), nodegrace drains from its stop path, and
/// the kubelet stops only after. SIGRTMIN+4 to PID 1 starts poweroff.target directly (as does
/// `systemctl start poweroff.target`). Note that `systemctl poweroff -i` is NOT such a bypass on
/// systemd 252: it goes through logind, which still honours delay inhibitors (measured).
#[test]
fn bypassed_logind_drains_from_the_stop_path_before_the_kubelet_stops() {
    if skip("bypassed_logind_drains_from_the_stop_path_before_the_kubelet_stops") {
        return;
    }
    const DRAIN: f64 = 3.0;
    let mut spec = nodegrace_spec(DRAIN as u32);
    spec.file(
        "/etc/systemd/system/kubelet.service",
        real::long_running_unit("kubelet"),
    )
    .want("kubelet.service");
    let mut c = Container::boot("bypass", &spec);
    c.wait_active("nodegrace.service", Duration::from_secs(30));
    c.wait_active("kubelet.service", Duration::from_secs(10));

    let before = real::now_unix();
    let pid1 = c.pid1.to_string();
    let sent = std::process::Command::new("kill")
        .args(["-s", "RTMIN+4", &pid1])
        .status()
        .expect("run kill");
    assert!(sent.success(), "kill -s RTMIN+4 {pid1} failed");
    let status = c
        .wait_exit(Duration::from_secs(150))
        .unwrap_or_else(|| panic!("no poweroff within 150 s:\n{}", c.journal_text()));
    assert!(
        status.success(),
        "systemd-nspawn exited with {status}:\n{}",
        c.console()
    );

    let journal = c.journal();
    assert!(
        first_with(&c.journal_of("systemd-logind"), "will power off").is_none(),
        "logind announced the shutdown; this test needs the bypass path:\n{}",
        c.journal_text()
    );
    let stopping = journal
        .iter()
        .find(|l| l.ident == "systemd" && l.contains("Stopping nodegrace"))
        .unwrap_or_else(|| panic!("systemd never stopped nodegrace:\n{}", c.journal_text()))
        .time;
    let stopped = journal
        .iter()
        .find(|l| l.ident == "systemd" && l.contains("Stopped nodegrace"))
        .unwrap_or_else(|| panic!("nodegrace never stopped:\n{}", c.journal_text()))
        .time;
    let drain_log = c
        .journal_of("nodegrace")
        .into_iter()
        .find(|l| {
            l.time >= before && l.contains("draining the node") && l.field("KIND") == Some("bypass")
        })
        .unwrap_or_else(|| {
            panic!(
                "nodegrace did not say it drained from the stop path:\n{}",
                c.journal_text()
            )
        });
    let kubelet = c.stop_time("kubelet").expect("kubelet was never stopped");
    eprintln!(
        "bypass: stop path drain logged {:.3} s after systemd began stopping nodegrace; its stop took {:.3} s (drain {DRAIN} s); the kubelet began stopping {:.3} s after it ended",
        drain_log.time - stopping,
        stopped - stopping,
        kubelet - stopped
    );
    assert!(
        stopped - stopping >= DRAIN - EARLY_SLACK,
        "nodegrace's stop took {:.3} s: it did not drain",
        stopped - stopping
    );
    assert!(
        stopped - stopping < DRAIN + RELEASE_SLACK,
        "nodegrace's stop took {:.3} s for a {DRAIN} s drain",
        stopped - stopping
    );
    assert!(
        kubelet >= stopped - EARLY_SLACK,
        "the kubelet began stopping at {kubelet:.3}, before nodegrace finished draining at {stopped:.3}"
    );
}

/// (d) nodegrace is killed (SIGKILL) while it drains; systemd restarts it, it resumes the
/// shutdown, releases, and the poweroff completes within the budget without having continued
/// while no nodegrace was running.
#[test]
fn daemon_killed_during_the_delay_resumes_and_releases() {
    if skip("daemon_killed_during_the_delay_resumes_and_releases") {
        return;
    }
    const DRAIN: f64 = 6.0;
    let mut c = Container::boot("restart", &nodegrace_spec(DRAIN as u32));
    c.wait_active("nodegrace.service", Duration::from_secs(30));
    let first_pid = c.run(&["systemctl", "show", "-P", "MainPID", "nodegrace.service"]);

    let _ = c.exec(&["systemctl", "poweroff"]);
    // Kill it once it is draining.
    real::wait_until(
        "nodegrace to start draining",
        Duration::from_secs(10),
        || {
            let ng = c.journal_of("nodegrace");
            ng.iter()
                .any(|l| l.contains("draining the node"))
                .then_some(())
        },
    );
    std::thread::sleep(Duration::from_millis(500));
    let killed_at = real::now_unix();
    c.run(&[
        "systemctl",
        "kill",
        "--kill-who=main",
        "-s",
        "SIGKILL",
        "nodegrace.service",
    ]);

    let status = c
        .wait_exit(Duration::from_secs(MAX_DELAY_SECS as u64 + 30))
        .unwrap_or_else(|| panic!("no poweroff within the budget:\n{}", c.journal_text()));
    assert!(status.success(), "nspawn exited with {status}");

    let signal = signal_time(&c);
    let marker = marker_time(&c);
    let waited = marker - signal;
    let ng = c.journal_of("nodegrace");
    let resumed = ng
        .iter()
        .find(|l| {
            l.time > killed_at
                && l.contains("draining the node")
                && l.field("RESUMED") == Some("true")
        })
        .unwrap_or_else(|| {
            panic!(
                "the restarted nodegrace did not resume; systemd began stopping units {:.3} s after the kill \
                 (+{waited:.3} s after the signal): the kill closed the delay lock and logind went on. \
                 Keeping the inhibitor fd in systemd's fd store (FDSTORE=1) would hold it across a restart.\n{}",
                marker - killed_at,
                c.journal_text()
            )
        });
    let released = ng
        .iter()
        .find(|l| l.time > resumed.time && l.contains("inhibitor released"))
        .unwrap_or_else(|| {
            panic!(
                "the restarted nodegrace did not release:\n{}",
                c.journal_text()
            )
        });
    eprintln!(
        "restart mid-drain (first pid {}): killed {:.3} s after the signal, resumed {:.3} s, released {:.3} s, units stopping {waited:.3} s",
        first_pid.trim(),
        killed_at - signal,
        resumed.time - signal,
        released.time - signal
    );
    assert!(
        marker >= released.time - EARLY_SLACK,
        "systemd began stopping units at +{waited:.3} s, before the restarted nodegrace released at +{:.3} s: the kill let the shutdown through",
        released.time - signal
    );
    assert!(
        waited < MAX_DELAY_SECS,
        "poweroff took {waited:.3} s, past the {MAX_DELAY_SECS} s budget"
    );
    assert!(marker - released.time < RELEASE_SLACK);
}

fn nodegrace_delay_inhibitors(c: &Container) -> usize {
    c.run(&["systemd-inhibit", "--list", "--no-pager", "--no-legend"])
        .lines()
        .filter(|l| l.contains("nodegrace") && l.contains("shutdown") && l.contains("delay"))
        .count()
}

/// (e) Outside a shutdown: a killed nodegrace is restarted and adopts the lock systemd kept
/// in its fd store (one lock, not two); `systemctl stop` releases it for good (systemd 252
/// empties the fd store when the unit stops), and nothing is left to delay a poweroff.
#[test]
fn a_kill_adopts_the_stored_lock_and_a_stop_releases_it() {
    if skip("a_kill_adopts_the_stored_lock_and_a_stop_releases_it") {
        return;
    }
    let mut c = Container::boot("fdstore", &nodegrace_spec(30));
    c.wait_active("nodegrace.service", Duration::from_secs(30));
    assert_eq!(nodegrace_delay_inhibitors(&c), 1);
    let first_pid = c.run(&["systemctl", "show", "-P", "MainPID", "nodegrace.service"]);

    c.run(&[
        "systemctl",
        "kill",
        "--kill-who=main",
        "-s",
        "SIGKILL",
        "nodegrace.service",
    ]);
    // While it is down, systemd's copy holds the lock.
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        nodegrace_delay_inhibitors(&c),
        1,
        "the kill released the lock:\n{}",
        c.journal_text()
    );
    real::wait_until(
        "systemd to restart nodegrace",
        Duration::from_secs(30),
        || {
            let pid = c.run(&["systemctl", "show", "-P", "MainPID", "nodegrace.service"]);
            (pid.trim() != first_pid.trim()
                && pid.trim() != "0"
                && c.is_active("nodegrace.service") == "active")
                .then_some(())
        },
    );
    assert!(
        first_with(
            &c.journal_of("nodegrace"),
            "adopted from systemd's fd store"
        )
        .is_some(),
        "the restarted nodegrace did not adopt the stored lock:\n{}",
        c.journal_text()
    );
    assert_eq!(
        nodegrace_delay_inhibitors(&c),
        1,
        "the restart took a second lock"
    );

    let stop_at = real::now_unix();
    c.run(&["systemctl", "stop", "nodegrace.service"]);
    let gone = real::wait_until(
        "the lock to be released after systemctl stop",
        Duration::from_secs(10),
        || (nodegrace_delay_inhibitors(&c) == 0).then(real::now_unix),
    );
    eprintln!(
        "kill -> restart adopted the stored lock; systemctl stop -> no lock after {:.3} s",
        gone - stop_at
    );
    poweroff_and_wait(&mut c, &["systemctl", "poweroff"], Duration::from_secs(30));
    let waited = marker_time(&c) - signal_time(&c);
    assert!(
        waited < RELEASE_SLACK,
        "poweroff waited {waited:.3} s with nodegrace stopped: a stored lock outlived the unit"
    );
}

/// A configuration whose directories are all elsewhere than the unit's defaults: the packaged
/// generator makes them writable under ProtectSystem=strict (else the daemon refuses to start),
/// and on logind 252, whose PrepareForShutdown does not say the kind, a `systemctl reboot` is
/// still drained as a reboot (from logind's ScheduledShutdown).
#[test]
fn configured_directories_are_writable_and_a_reboot_is_named() {
    if skip("configured_directories_are_writable_and_a_reboot_is_named") {
        return;
    }
    configured_directories_are_writable_and_a_reboot_is_named_on(real::Debian::Bookworm);
}

/// The same on Debian 13: systemd 257's generator run and sandbox, and logind 257, which
/// names the reboot in `PrepareForShutdownWithMetadata`.
#[test]
fn on_debian_13_configured_directories_are_writable_and_a_reboot_is_named() {
    if skip("on_debian_13_configured_directories_are_writable_and_a_reboot_is_named") {
        return;
    }
    configured_directories_are_writable_and_a_reboot_is_named_on(real::Debian::Trixie);
}

fn configured_directories_are_writable_and_a_reboot_is_named_on(debian: real::Debian) {
    const CONFIG: &str = r#"state_dir = "/srv/nodegrace"
[node]
name = "nodegrace-test"
[shutdown]
max_delay = "3m"
logind_dropin_dir = "/run/systemd/logind.conf.d"
[static_pods]
manifest_dir = "/srv/kubernetes/manifests"
gate_dir = "/srv/nodegrace-gate"
"#;
    let mut spec = nodegrace_spec_with(2, CONFIG);
    spec.debian = debian;
    spec.bind(
        "/etc/systemd/system-generators/nodegrace-generator",
        real::repo_file("systemd/nodegrace-generator"),
    )
    .file(
        "/srv/kubernetes/manifests/README",
        "the kubelet's manifests\n",
    );
    let mut c = Container::boot(&format!("generator-{}", debian.suite()), &spec);
    assert_eq!(c.systemd_version(), debian.systemd());
    c.wait_active("nodegrace.service", Duration::from_secs(30));
    assert_holds_delay_inhibitor(&c);
    let rw = c.run(&[
        "systemctl",
        "show",
        "-P",
        "ReadWritePaths",
        "nodegrace.service",
    ]);
    for dir in [
        "/srv/nodegrace",
        "/srv/nodegrace-gate",
        "/srv/kubernetes/manifests",
        "/run/systemd/logind.conf.d",
    ] {
        assert!(rw.contains(dir), "ReadWritePaths lacks {dir}: {rw}");
    }
    // The drop-in nodegrace writes to raise logind's delay lands in the configured directory.
    real::wait_until(
        "nodegrace's logind drop-in",
        Duration::from_secs(15),
        || {
            let out = c.exec(&["ls", "/run/systemd/logind.conf.d"]);
            String::from_utf8_lossy(&out.stdout)
                .contains("zz-nodegrace.conf")
                .then_some(())
        },
    );
    let exposure = c.exec(&[
        "systemd-analyze",
        "security",
        "--no-pager",
        "nodegrace.service",
    ]);
    let exposure = String::from_utf8_lossy(&exposure.stdout).into_owned();
    eprintln!(
        "systemd-analyze security (booted systemd {}, with the generated drop-in): {}",
        debian.systemd(),
        exposure
            .lines()
            .find(|l| l.contains("Overall exposure level"))
            .unwrap_or("(no summary)")
    );

    let _ = c.exec(&["systemctl", "reboot"]);
    c.wait_exit(Duration::from_secs(60)).unwrap_or_else(|| {
        panic!(
            "the container did not reboot within 60 s:\n{}",
            c.journal_text()
        )
    });
    let ng = c.journal_of("nodegrace");
    let draining = first_with(&ng, "draining the node")
        .unwrap_or_else(|| panic!("nodegrace never began draining:\n{}", c.journal_text()));
    assert_eq!(
        draining.field("KIND"),
        Some("reboot"),
        "{}",
        c.journal_text()
    );
    assert!(
        first_with(&ng, "cannot persist the shutdown state").is_none(),
        "the state directory was not writable:\n{}",
        c.journal_text()
    );
}

/// logind 257 names each shutdown it can be asked for here in its metadata; nodegrace drains
/// for that kind and says so in `nodegrace status` while it drains, with the way the drain
/// goes (the test hook's drain stands for the cluster's). (`systemctl kexec`
/// cannot be asked for in a container: without a kexec kernel loaded, logind 257 answers
/// `RebootWithFlags(KEXEC)` with type "reboot" — measured — and loading one needs the host.)
#[test]
fn on_debian_13_poweroff_and_halt_are_named_in_the_drain_and_in_status() {
    if skip("on_debian_13_poweroff_and_halt_are_named_in_the_drain_and_in_status") {
        return;
    }
    for verb in ["poweroff", "halt"] {
        let mut spec = nodegrace_spec(3);
        spec.debian = real::Debian::Trixie;
        let mut c = Container::boot(&format!("kind-{verb}"), &spec);
        c.wait_active("nodegrace.service", Duration::from_secs(30));
        real::wait_until("nodegrace's inhibitor", Duration::from_secs(15), || {
            let list = c.run(&["systemd-inhibit", "--list", "--no-pager", "--no-legend"]);
            list.contains("nodegrace").then_some(())
        });
        let _ = c.exec(&["systemctl", "--no-block", verb]);
        let status = real::wait_until(
            "`nodegrace status` naming the shutdown",
            Duration::from_secs(10),
            || {
                let out = c.exec(&["nodegrace", "status"]);
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                text.lines()
                    .any(|l| {
                        l.starts_with("Shutdown")
                            && l.contains(&format!(" {verb} since"))
                            && l.contains(", draining through the cluster")
                    })
                    .then_some(text)
            },
        );
        eprintln!(
            "{verb}: {}",
            status
                .lines()
                .find(|l| l.starts_with("Shutdown"))
                .unwrap_or_default()
        );
        let exit = c.wait_exit(Duration::from_secs(60)).unwrap_or_else(|| {
            panic!(
                "the container did not {verb} within 60 s:\n{}",
                c.journal_text()
            )
        });
        assert!(exit.success(), "systemd-nspawn exited with {exit}");
        let ng = c.journal_of("nodegrace");
        let draining = first_with(&ng, "draining the node")
            .unwrap_or_else(|| panic!("nodegrace never began draining:\n{}", c.journal_text()));
        assert_eq!(draining.field("KIND"), Some(verb), "{}", c.journal_text());
    }
}
