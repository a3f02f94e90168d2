//! The unit's sandbox and the directories the daemon writes.
//!
//! `systemd/nodegrace.service` runs the daemon with `ProtectSystem=strict`: everything is
//! read-only but `ReadWritePaths=`, which names the default directories. So that a configured
//! directory elsewhere works too, the packages ship a systemd generator
//! (`systemd/nodegrace-generator`, which runs `nodegrace generator`): at boot and at every
//! `systemctl daemon-reload` it reads the configuration and writes a drop-in that creates the
//! configured directories and adds them to `ReadWritePaths=`. A configuration changed without
//! a `daemon-reload` is caught at start by [`check_writable`]: the daemon refuses to run,
//! naming the key and what to do, rather than fail at its first write in a shutdown.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};

use crate::config::Settings;

/// The drop-in the generator writes, in `<generator dir>/nodegrace.service.d/`.
pub(crate) const DROPIN_NAME: &str = "50-nodegrace-paths.conf";

/// A directory the daemon writes, with the key that configures it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WrittenDir {
    pub key: &'static str,
    pub path: PathBuf,
    /// The daemon creates it when missing (so its parent must exist and be writable, or
    /// the unit creates it first); the kubelet's manifest directory is never created.
    pub created: bool,
    /// Only nodegrace reads it (state and gated manifests: 0700); logind reads the drop-in
    /// directory (0755).
    pub private: bool,
    /// Only the renewal of nodegrace's credential writes there: the daemon starts without
    /// it and the renewal says what is wrong.
    pub optional: bool,
}

/// Every directory the daemon writes under these settings.
pub(crate) fn written_dirs(s: &Settings) -> Vec<WrittenDir> {
    let mut dirs = vec![
        WrittenDir {
            key: "state_dir",
            path: s.state_dir.clone(),
            created: true,
            private: true,
            optional: false,
        },
        WrittenDir {
            key: "static_pods.gate_dir",
            path: s.static_pods.gate_dir.clone(),
            created: true,
            private: true,
            optional: false,
        },
        WrittenDir {
            key: "static_pods.manifest_dir",
            path: s.static_pods.manifest_dir.clone(),
            created: false,
            private: false,
            optional: false,
        },
    ];
    if s.shutdown.manage_logind_dropin {
        dirs.push(WrittenDir {
            key: "shutdown.logind_dropin_dir",
            path: s.shutdown.logind_dropin_dir.clone(),
            created: true,
            private: false,
            optional: false,
        });
    }
    // The renewed kubeconfig and its pending key are written beside node.kubeconfig.
    if let Some(dir) = s
        .node
        .kubeconfig
        .as_deref()
        .filter(|_| s.node.renew_credential)
        .and_then(Path::parent)
    {
        dirs.push(WrittenDir {
            key: "node.kubeconfig",
            path: dir.to_owned(),
            created: false,
            private: false,
            optional: true,
        });
    }
    dirs
}

/// Whether `path` can go into a unit file as it is: no specifier (`%`), variable (`$`),
/// quote, escape or white space to get wrong.
fn unit_safe(path: &Path) -> bool {
    path.to_str().is_some_and(|p| {
        p.starts_with('/')
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"/._+,:@=-".contains(&b))
    })
}

/// The generator's drop-in for `s`, and the directories it had to leave out (names a unit
/// file cannot carry safely; the start check then names them).
pub(crate) fn dropin(s: &Settings, config: &Path) -> (String, Vec<WrittenDir>) {
    let (safe, unsafe_): (Vec<WrittenDir>, Vec<WrittenDir>) = written_dirs(s)
        .into_iter()
        .partition(|d| unit_safe(&d.path));
    let mut text = format!(
        "# Written by nodegrace's systemd generator from {} (and config.d): the directories\n\
         # the daemon writes, created and made writable under ProtectSystem=strict. Edit the\n\
         # configuration and run `systemctl daemon-reload`, not this file.\n[Service]\n",
        // A line break in the path would end the comment and start a directive.
        crate::text::escape(&config.display().to_string())
    );
    for (private, mode) in [(true, "0700"), (false, "0755")] {
        let created: Vec<String> = safe
            .iter()
            .filter(|d| d.created && d.private == private)
            .map(|d| d.path.display().to_string())
            .collect();
        if !created.is_empty() {
            text.push_str(&format!(
                "ExecStartPre=+/bin/mkdir -p -m {mode} {}\n",
                created.join(" ")
            ));
        }
    }
    // "-": a manifest directory that does not exist (yet) is no error.
    let writable: Vec<String> = safe
        .iter()
        .map(|d| format!("-{}", d.path.display()))
        .collect();
    text.push_str(&format!("ReadWritePaths={}\n", writable.join(" ")));
    (text, unsafe_)
}

/// `nodegrace generator NORMAL_DIR [EARLY_DIR LATE_DIR]`, as systemd runs generators. Never
/// fails the boot: an invalid configuration writes nothing (the daemon reports it at start).
pub fn generator_command(config: &Path, normal_dir: &Path) -> Result<ExitCode> {
    let settings = match crate::config::load(config) {
        Ok(s) => s,
        Err(e) => {
            crate::text::print_stderr(&format!("nodegrace-generator: not adding directories to the unit: invalid configuration: {e}"));
            return Ok(ExitCode::SUCCESS);
        }
    };
    let (text, left_out) = dropin(&settings, config);
    for d in &left_out {
        crate::text::print_stderr(&format!(
            "nodegrace-generator: {} {} cannot be written into a unit file safely; add it to ReadWritePaths= in a drop-in by hand",
            d.key,
            d.path.display()
        ));
    }
    let dir = normal_dir.join("nodegrace.service.d");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let path = dir.join(DROPIN_NAME);
    std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    Ok(ExitCode::SUCCESS)
}

/// Why a directory cannot be written, in one line naming the key and the way out.
fn refusal(d: &WrittenDir, probe: &Path, err: &std::io::Error) -> String {
    let how = if err.raw_os_error() == Some(nix::libc::EROFS) {
        "is read-only for nodegrace: under the unit's ProtectSystem=strict only ReadWritePaths= \
         can be written"
    } else {
        "cannot be written by nodegrace"
    };
    format!(
        "{} {} {how} ({} {}: {err}). nodegrace's systemd generator adds the configured \
         directories at boot and at every `systemctl daemon-reload`: run that, then `systemctl \
         restart nodegrace`; or add `ReadWritePaths={}` in a drop-in (`systemctl edit nodegrace`)",
        d.key,
        d.path.display(),
        if probe == d.path {
            "checked"
        } else {
            "checked its parent"
        },
        probe.display(),
        d.path.display()
    )
}

/// The start check: every directory the daemon writes can be written (a missing one that
/// the daemon creates needs a writable parent). `writable` probes one existing directory.
pub(crate) fn check_writable_with(
    s: &Settings,
    writable: impl Fn(&Path) -> std::io::Result<()>,
) -> Result<(), String> {
    for d in written_dirs(s).into_iter().filter(|d| !d.optional) {
        let mut probe = d.path.as_path();
        while !probe.exists() {
            if !d.created {
                break;
            }
            match probe.parent() {
                Some(p) => probe = p,
                None => break,
            }
        }
        if !probe.exists() {
            continue;
        }
        if let Err(e) = writable(probe) {
            return Err(refusal(&d, probe, &e));
        }
    }
    Ok(())
}

/// [`check_writable_with`] through `access(W_OK)`, which says EROFS for a read-only mount.
pub(crate) fn check_writable(s: &Settings) -> Result<(), String> {
    check_writable_with(s, |p| {
        nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).map_err(std::io::Error::from)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Defaults but for state, gate, manifest and logind drop-in directories.
    fn with_dirs(state: &Path, gate: &Path, manifests: &Path, logind: &Path) -> Settings {
        let mut s = Settings {
            state_dir: state.into(),
            ..Settings::default()
        };
        s.static_pods.gate_dir = gate.into();
        s.static_pods.manifest_dir = manifests.into();
        s.shutdown.logind_dropin_dir = logind.into();
        s
    }

    fn settings() -> Settings {
        with_dirs(
            Path::new("/srv/nodegrace"),
            Path::new("/srv/nodegrace/gate"),
            Path::new("/opt/k8s/manifests"),
            Path::new("/run/systemd/logind.conf.d"),
        )
    }

    #[test]
    fn the_dropin_creates_and_opens_the_configured_directories() {
        let (text, left_out) = dropin(&settings(), Path::new("/etc/nodegrace/config.toml"));
        assert!(left_out.is_empty());
        assert!(text.contains("[Service]\n"), "{text}");
        assert!(
            text.contains(
                "ExecStartPre=+/bin/mkdir -p -m 0700 /srv/nodegrace /srv/nodegrace/gate\n\
                 ExecStartPre=+/bin/mkdir -p -m 0755 /run/systemd/logind.conf.d\n"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "ReadWritePaths=-/srv/nodegrace -/srv/nodegrace/gate -/opt/k8s/manifests -/run/systemd/logind.conf.d -/etc/nodegrace\n"
            ),
            "{text}"
        );
    }

    #[test]
    fn the_kubeconfig_directory_only_when_the_daemon_renews_the_credential() {
        let mut s = settings();
        s.node.kubeconfig = Some("/etc/k8s/nodegrace/kubeconfig".into());
        let (text, _) = dropin(&s, Path::new("/c"));
        assert!(text.contains(" -/etc/k8s/nodegrace\n"), "{text}");
        assert!(
            !text.contains("mkdir -p -m 0755 /run/systemd/logind.conf.d /etc"),
            "{text}"
        );
        // Not writable: the daemon still starts (the renewal says why it cannot write).
        assert_eq!(
            check_writable_with(&s, |p| if p.starts_with("/etc") {
                Err(std::io::Error::from_raw_os_error(nix::libc::EROFS))
            } else {
                Ok(())
            }),
            Ok(())
        );
        s.node.renew_credential = false;
        let (text, _) = dropin(&s, Path::new("/c"));
        assert!(!text.contains("/etc/k8s"), "{text}");
    }

    #[test]
    fn a_line_break_in_the_config_path_stays_in_the_comment() {
        let (text, _) = dropin(
            &settings(),
            Path::new("/etc/x\nExecStartPre=/bin/evil\n/config.toml"),
        );
        assert!(
            text.lines()
                .all(|l| !l.starts_with("ExecStartPre=/bin/evil")),
            "{text}"
        );
        assert!(
            text.contains("/etc/x\\u000aExecStartPre=/bin/evil"),
            "{text}"
        );
    }

    #[test]
    fn the_logind_directory_only_when_nodegrace_writes_there() {
        let mut s = settings();
        s.shutdown.manage_logind_dropin = false;
        let (text, _) = dropin(&s, Path::new("/c"));
        assert!(!text.contains("logind.conf.d"), "{text}");
    }

    #[test]
    fn names_a_unit_file_cannot_carry_are_left_out_and_named() {
        let mut s = settings();
        s.static_pods.manifest_dir = "/opt/my manifests".into();
        s.state_dir = "/srv/100%".into();
        let (text, left_out) = dropin(&s, Path::new("/c"));
        assert!(!text.contains("manifests") && !text.contains('%'), "{text}");
        let keys: Vec<&str> = left_out.iter().map(|d| d.key).collect();
        assert_eq!(keys, ["state_dir", "static_pods.manifest_dir"]);
    }

    #[test]
    fn a_read_only_directory_is_refused_naming_the_key_and_the_fix() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let s = with_dirs(
            &d.join("state"),
            &d.join("state/gate"),
            &d.join("manifests"),
            &d.join("logind"),
        );
        std::fs::create_dir(dir.path().join("manifests")).unwrap();
        assert_eq!(check_writable_with(&s, |_| Ok(())), Ok(()));

        let manifests = s.static_pods.manifest_dir.clone();
        let err = check_writable_with(&s, |p| {
            if p == manifests {
                Err(std::io::Error::from_raw_os_error(nix::libc::EROFS))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert!(err.starts_with("static_pods.manifest_dir "), "{err}");
        assert!(err.contains("read-only for nodegrace"), "{err}");
        assert!(err.contains("systemctl daemon-reload"), "{err}");
        assert!(
            err.contains(&format!("ReadWritePaths={}", manifests.display())),
            "{err}"
        );
        assert!(!err.contains('\n'));

        // A state directory still to be created is judged by its parent.
        let parent = dir.path().to_path_buf();
        let err = check_writable_with(&s, |p| {
            if p == parent {
                Err(std::io::Error::from_raw_os_error(nix::libc::EROFS))
            } else {
                Ok(())
            }
        })
        .unwrap_err();
        assert!(err.starts_with("state_dir "), "{err}");
        assert!(err.contains("checked its parent"), "{err}");
    }

    #[test]
    fn a_missing_manifest_directory_is_no_error() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let mut s = with_dirs(
            &d.join("state"),
            &d.join("gate"),
            &d.join("no/manifests"),
            &d.join("logind"),
        );
        s.shutdown.manage_logind_dropin = false;
        let blocked = dir.path().join("no");
        assert_eq!(
            check_writable_with(&s, |p| if p.starts_with(&blocked) {
                Err(std::io::Error::from_raw_os_error(nix::libc::EROFS))
            } else {
                Ok(())
            }),
            Ok(())
        );
    }
}
