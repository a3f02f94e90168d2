//! Package tier: the built .deb and .rpm hold what an operator needs where the system expects
//! it, and the .deb installed with `dpkg -i` into a booted Debian starts nodegrace, which then
//! holds its inhibitor and delays a poweroff. Runs only with `NODEGRACE_REAL_TESTS=1`, as root,
//! with `NODEGRACE_TEST_DEB` / `NODEGRACE_TEST_RPM` naming the packages (scripts/test-all builds
//! them with scripts/build-packages). Neither package's binary holds any of the test kit.

mod kit_markers;
mod real;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use real::{first_with, Container, Debian, Spec};

fn skip(test: &str) -> bool {
    if !real::enabled(&format!("real_packages::{test}")) {
        return true;
    }
    real::require_prerequisites();
    false
}

fn package(var: &str) -> PathBuf {
    let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
        panic!("{var} is not set: build the packages with scripts/build-packages (scripts/test-all does)")
    });
    assert!(path.is_file(), "{var}={} does not exist", path.display());
    path
}

fn output(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every `*.yaml` under `packaging/<dir>`, which the packages must ship.
fn manifests(dir: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(real::repo_file(&format!("packaging/{dir}")))
        .unwrap_or_else(|e| panic!("packaging/{dir}: {e}"))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".yaml"))
        .collect();
    names.sort();
    assert!(!names.is_empty(), "packaging/{dir} holds no manifests");
    names
}

fn expected_files(unit_dir: &str) -> Vec<String> {
    let mut files = vec![
        "/usr/bin/nodegrace".to_string(),
        format!("{unit_dir}/nodegrace.service"),
        "/usr/lib/systemd/system-generators/nodegrace-generator".into(),
        "/usr/lib/systemd/logind.conf.d/zz-nodegrace-logind.conf".into(),
        "/etc/nodegrace/config.toml".into(),
        "/usr/share/nodegrace/prometheus/nodegrace-rules.yml".into(),
        "/usr/share/nodegrace/prometheus/nodegrace-prometheusrule.yaml".into(),
        "/usr/share/nodegrace/grafana/nodegrace-dashboard.json".into(),
    ];
    for dir in ["crds", "rbac", "admission", "admission/v1beta1"] {
        files.extend(
            manifests(dir)
                .into_iter()
                .map(|n| format!("/usr/share/nodegrace/{dir}/{n}")),
        );
    }
    files
}

#[test]
fn deb_contents_and_maintainer_scripts() {
    if skip("deb_contents_and_maintainer_scripts") {
        return;
    }
    let deb = package("NODEGRACE_TEST_DEB");
    let listing = output(Command::new("dpkg-deb").arg("-c").arg(&deb));
    // "-rwxr-xr-x root/root 123 2024-01-01 00:00 ./usr/bin/nodegrace"
    let entries: BTreeSet<(String, String)> = listing
        .lines()
        .filter_map(|l| {
            let mode = l.split_whitespace().next()?.to_string();
            let path = l
                .split_whitespace()
                .last()?
                .trim_start_matches('.')
                .to_string();
            Some((path, mode))
        })
        .collect();
    let mode_of = |path: &str| {
        entries
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, m)| m.clone())
    };
    for file in expected_files("/lib/systemd/system") {
        let mode =
            mode_of(&file).unwrap_or_else(|| panic!("{} lacks {file}:\n{listing}", deb.display()));
        let want = if file == "/usr/bin/nodegrace" || file.ends_with("/nodegrace-generator") {
            "-rwxr-xr-x"
        } else {
            "-rw-r--r--"
        };
        assert_eq!(mode, want, "mode of {file}");
    }

    let conffiles = output(
        Command::new("dpkg-deb")
            .arg("-I")
            .arg(&deb)
            .arg("conffiles"),
    );
    assert!(
        conffiles
            .lines()
            .any(|l| l.trim() == "/etc/nodegrace/config.toml"),
        "config.toml is not a conffile: {conffiles:?}"
    );
    let packaged_config = output(
        Command::new("sh")
            .arg("-c")
            .arg("dpkg-deb --fsys-tarfile \"$1\" | tar -xOf - ./etc/nodegrace/config.toml")
            .arg("sh")
            .arg(&deb),
    );
    let source_config = std::fs::read_to_string(real::repo_file("config/nodegrace.toml")).unwrap();
    assert_eq!(
        packaged_config, source_config,
        "packaged config differs from config/nodegrace.toml"
    );

    for script in ["postinst", "prerm", "postrm"] {
        let packaged = output(Command::new("dpkg-deb").arg("-I").arg(&deb).arg(script));
        let source =
            std::fs::read_to_string(real::repo_file(&format!("packaging/deb/{script}"))).unwrap();
        assert_eq!(
            packaged.trim(),
            source.trim(),
            "packaged {script} differs from packaging/deb/{script}"
        );
    }
}

#[test]
fn rpm_contents_and_scriptlets() {
    if skip("rpm_contents_and_scriptlets") {
        return;
    }
    assert!(
        real::which("rpm").is_some(),
        "the package tier needs `rpm` (apt-get install rpm)"
    );
    let rpm = package("NODEGRACE_TEST_RPM");
    // FILEFLAGS: "c" config, "n" noreplace.
    let listing = output(
        Command::new("rpm")
            .args([
                "-qp",
                "--qf",
                "[%{FILEMODES:perms} %{FILEFLAGS:fflags} %{FILENAMES}\\n]",
            ])
            .arg(&rpm),
    );
    let files = output(Command::new("rpm").arg("-qlp").arg(&rpm));
    for file in expected_files("/usr/lib/systemd/system") {
        assert!(
            files.lines().any(|l| l == file),
            "{} lacks {file}:\n{files}",
            rpm.display()
        );
        let line = listing
            .lines()
            .find(|l| l.ends_with(&format!(" {file}")))
            .unwrap_or_else(|| panic!("no attributes for {file}:\n{listing}"));
        let mut fields = line.split_whitespace();
        let perms = fields.next().unwrap();
        let want = if file == "/usr/bin/nodegrace" || file.ends_with("/nodegrace-generator") {
            "-rwxr-xr-x"
        } else {
            "-rw-r--r--"
        };
        assert_eq!(perms, want, "mode of {file}");
        if file == "/etc/nodegrace/config.toml" {
            let flags = fields.next().unwrap();
            assert!(
                flags.contains('c') && flags.contains('n'),
                "config.toml must be %config(noreplace), flags {flags:?}"
            );
        }
    }
    let scripts = output(Command::new("rpm").args(["-qp", "--scripts"]).arg(&rpm));
    for (scriptlet, source) in [
        ("postinstall", "post-install.sh"),
        ("preuninstall", "pre-uninstall.sh"),
        ("postuninstall", "post-uninstall.sh"),
    ] {
        let body =
            std::fs::read_to_string(real::repo_file(&format!("packaging/rpm/{source}"))).unwrap();
        assert!(
            scripts.contains(&format!("{scriptlet} scriptlet")) && scripts.contains(body.trim()),
            "the {scriptlet} scriptlet is not packaging/rpm/{source}:\n{scripts}"
        );
    }
}

#[test]
fn packaged_binaries_hold_no_test_kit() {
    if skip("packaged_binaries_hold_no_test_kit") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (var, unpack) in [
        ("NODEGRACE_TEST_DEB", "dpkg-deb --fsys-tarfile \"$1\""),
        // rpm2archive comes with rpm (rpm2cpio): the payload as a tar stream.
        ("NODEGRACE_TEST_RPM", "rpm2archive -n <\"$1\""),
    ] {
        let pkg = package(var);
        let binary = dir.path().join(var);
        output(
            Command::new("sh")
                .arg("-c")
                .arg(format!("{unpack} | tar -xOf - ./usr/bin/nodegrace >\"$2\""))
                .arg("sh")
                .arg(&pkg)
                .arg(&binary),
        );
        kit_markers::assert_no_kit(&format!("/usr/bin/nodegrace of {}", pkg.display()), &binary);
    }
}

#[test]
fn deb_installed_in_a_booted_debian_holds_its_inhibitor_and_delays_poweroff() {
    if skip("deb_installed_in_a_booted_debian_holds_its_inhibitor_and_delays_poweroff") {
        return;
    }
    deb_installed_holds_its_inhibitor_and_delays_poweroff(Debian::Bookworm);
}

/// The same in Debian 13: systemd 257 enables the unit, runs the generator and takes the
/// packaged logind drop-in.
#[test]
fn deb_installed_in_a_booted_debian_13_holds_its_inhibitor_and_delays_poweroff() {
    if skip("deb_installed_in_a_booted_debian_13_holds_its_inhibitor_and_delays_poweroff") {
        return;
    }
    deb_installed_holds_its_inhibitor_and_delays_poweroff(Debian::Trixie);
}

fn deb_installed_holds_its_inhibitor_and_delays_poweroff(debian: Debian) {
    let deb = package("NODEGRACE_TEST_DEB");
    let mut spec = Spec {
        debian,
        ..Spec::default()
    };
    spec.bind("/root/nodegrace.deb", &deb)
        // A gate directory elsewhere than the unit's defaults: the generator must make it
        // writable, or the daemon refuses to start.
        .file(
            "/etc/nodegrace/config.d/50-gate.toml",
            "[static_pods]\ngate_dir = \"/srv/nodegrace-gate\"\n",
        )
        .file(
            "/etc/systemd/logind.conf.d/50-unattended-upgrades.conf",
            "[Login]\nInhibitDelayMaxSec=30\n",
        )
        .file(
            "/etc/systemd/system/marker.service",
            real::marker_unit("marker"),
        )
        .want("marker.service");
    let mut c = Container::boot(&format!("deb-{}", debian.suite()), &spec);
    assert_eq!(c.systemd_version(), debian.systemd());
    c.wait_active("marker.service", Duration::from_secs(30));
    c.wait_active("dbus.service", Duration::from_secs(10));

    let install = c.run(&["dpkg", "-i", "/root/nodegrace.deb"]);
    eprintln!("dpkg -i:\n{install}");
    c.wait_active("nodegrace.service", Duration::from_secs(30));
    assert_eq!(
        c.run(&["systemctl", "is-enabled", "nodegrace.service"])
            .trim(),
        "enabled"
    );
    c.run(&["test", "-d", "/var/lib/nodegrace"]);
    let generated = c.run(&[
        "cat",
        "/run/systemd/generator/nodegrace.service.d/50-nodegrace-paths.conf",
    ]);
    assert!(
        generated.contains("/srv/nodegrace-gate"),
        "the generator's drop-in does not name the gate directory:\n{generated}"
    );
    let rw = c.run(&[
        "systemctl",
        "show",
        "-P",
        "ReadWritePaths",
        "nodegrace.service",
    ]);
    assert!(rw.contains("/srv/nodegrace-gate"), "ReadWritePaths: {rw}");
    let inhibitors = real::wait_until("nodegrace's inhibitor", Duration::from_secs(10), || {
        let list = c.run(&["systemd-inhibit", "--list", "--no-pager", "--no-legend"]);
        list.lines()
            .any(|l| l.contains("nodegrace") && l.contains("shutdown") && l.contains("delay"))
            .then_some(list)
    });
    eprintln!("inhibitors after install:\n{inhibitors}");
    let budget = c.run(&[
        "busctl",
        "get-property",
        "org.freedesktop.login1",
        "/org/freedesktop/login1",
        "org.freedesktop.login1.Manager",
        "InhibitDelayMaxUSec",
    ]);
    let usec: u64 = budget
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap();
    assert!(
        usec > 30_000_000,
        "the packaged drop-in did not raise InhibitDelayMaxUSec: {usec}"
    );

    let _ = c.exec(&["systemctl", "poweroff"]);
    let status = c
        .wait_exit(Duration::from_secs(120))
        .unwrap_or_else(|| panic!("no poweroff within 120 s:\n{}", c.journal_text()));
    assert!(status.success(), "nspawn exited with {status}");

    let signal = first_with(
        &c.journal_of("systemd-logind"),
        "The system will power off now",
    )
    .expect("logind announced no poweroff")
    .time;
    let marker = c.stop_time("marker").expect("systemd stopped no units");
    let ng = c.journal_of("nodegrace");
    let handled = ng
        .iter()
        .find(|l| l.time >= signal - 0.25 && l.contains("draining the node"))
        .unwrap_or_else(|| {
            panic!(
                "nodegrace did not handle PrepareForShutdown:\n{}",
                c.journal_text()
            )
        });
    let released = ng
        .iter()
        .find(|l| l.time >= handled.time && l.contains("inhibitor released"))
        .unwrap_or_else(|| {
            panic!(
                "nodegrace did not release its inhibitor:\n{}",
                c.journal_text()
            )
        });
    eprintln!(
        "installed .deb: signal -> handled {:.3} s -> released {:.3} s -> units stopping {:.3} s",
        handled.time - signal,
        released.time - signal,
        marker - signal
    );
    assert!(
        released.time <= marker + 0.25,
        "systemd began stopping units ({marker:.3}) before nodegrace released ({:.3})",
        released.time
    );
}
