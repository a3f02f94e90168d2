//! `nodegrace generator`, as systemd runs the packaged generator: the unit drop-in that makes
//! the configured directories writable under the unit's sandbox.

use std::process::Command;

fn generator(config: &std::path::Path, out: &std::path::Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_nodegrace"))
        .arg("--config")
        .arg(config)
        .arg("generator")
        .arg(out)
        .arg(out.join("early"))
        .arg(out.join("late"))
        .env_remove("NODEGRACE_CONFIG")
        .output()
        .unwrap()
}

#[test]
fn the_drop_in_follows_the_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "state_dir = \"/srv/ng\"\n[static_pods]\nmanifest_dir = \"/opt/manifests\"\ngate_dir = \"/srv/ng-gate\"\n",
    )
    .unwrap();
    let out = dir.path().join("generated");
    let run = generator(&config, &out);
    assert!(run.status.success(), "{run:?}");
    let text =
        std::fs::read_to_string(out.join("nodegrace.service.d/50-nodegrace-paths.conf")).unwrap();
    assert!(
        text.contains(
            "\nReadWritePaths=-/srv/ng -/srv/ng-gate -/opt/manifests -/etc/systemd/logind.conf.d -/etc/nodegrace\n"
        ),
        "{text}"
    );
    assert!(
        text.contains("\nExecStartPre=+/bin/mkdir -p -m 0700 /srv/ng /srv/ng-gate\n"),
        "{text}"
    );
}

/// A generator must never fail the boot: an invalid configuration writes nothing (the daemon
/// reports the configuration itself when it starts).
#[test]
fn an_invalid_configuration_writes_nothing_and_succeeds() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "state_dir = 1\n").unwrap();
    let out = dir.path().join("generated");
    let run = generator(&config, &out);
    assert!(run.status.success(), "{run:?}");
    assert!(!out.join("nodegrace.service.d").exists());
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(err.contains("invalid configuration"), "{err}");
}

#[test]
fn the_generator_is_not_in_the_help() {
    let out = Command::new(env!("CARGO_BIN_EXE_nodegrace"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&out.stdout).contains("generator"));
}
