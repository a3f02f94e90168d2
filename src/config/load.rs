//! Reading and merging configuration files (main file, then drop-ins); errors located by
//! file, line and key.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use super::error::{ConfigError, Fragment};
use super::merge::Merged;
use super::{check, BandsSource, Settings};
use crate::fsutil::{read_regular, ReadError, Symlinks, CONFIG_FILE_LIMIT};

/// The result of [`load_report`]: the settings and how they were found.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Loaded {
    pub settings: Settings,
    /// Every file that was read, in merge order (main file first, if it exists).
    pub files: Vec<PathBuf>,
    /// The main file does not exist; the settings are the defaults plus any drop-ins.
    pub main_missing: bool,
}

/// Loads `main` and the drop-ins `<dir of main>/config.d/*.toml` (see [`load_report`]).
pub(crate) fn load(main: &Path) -> Result<Settings, ConfigError> {
    // A read that hangs (a file on a hung filesystem) for the daemon's tests: `test-hooks`
    // builds only.
    #[cfg(feature = "test-hooks")]
    if let Some(secs) = std::env::var("NODEGRACE_TEST_CONFIG_READ_SECONDS")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
    {
        std::thread::sleep(std::time::Duration::from_secs(secs));
    }
    load_report(main).map(|loaded| loaded.settings)
}

/// Most bytes of the main file and its drop-ins together: every file is kept in memory to
/// locate errors, and a node's configuration is a few KiB.
const MAX_TOTAL_BYTES: usize = 4 << 20;

/// Loads `main` and the drop-ins `<dir of main>/config.d/*.toml`, merged in byte order of
/// their names after the main file; later files win, tables merge key by key, arrays and
/// scalars replace. Drop-ins whose names start with `.` or do not end in `.toml` are
/// skipped; a drop-in that is a symlink or not a regular file is an error. A missing main
/// file is not an error (a dangling symlink in its place is): the result says so and holds
/// the defaults plus the drop-ins.
pub(crate) fn load_report(main: &Path) -> Result<Loaded, ConfigError> {
    let mut fragments = Vec::new();
    // The main file may be a symlink (configuration management often makes it one).
    let main_missing = match read_regular(main, CONFIG_FILE_LIMIT, Symlinks::Follow) {
        Ok(bytes) => {
            fragments.push(fragment_from_bytes(main, bytes)?);
            false
        }
        // A symlink to nothing is a configuration that went missing, not no configuration.
        Err(ReadError::NotFound) if std::fs::symlink_metadata(main).is_ok() => {
            return Err(ConfigError::file(
                main,
                "cannot read: a symlink to a file that does not exist".to_string(),
            ))
        }
        Err(ReadError::NotFound) => true,
        Err(err) => return Err(ConfigError::file(main, format!("cannot read: {err}"))),
    };
    let mut total = fragments.iter().map(|f| f.text.len()).sum::<usize>();
    for path in drop_in_paths(main)? {
        let bytes = read_regular(&path, CONFIG_FILE_LIMIT, Symlinks::Refuse)
            .map_err(|err| ConfigError::file(&path, format!("cannot read: {err}")))?;
        total += bytes.len();
        if total > MAX_TOTAL_BYTES {
            return Err(ConfigError::file(
                &path,
                format!(
                    "with this drop-in the configuration files pass {} MiB together, more than nodegrace reads; merge or remove drop-ins",
                    MAX_TOTAL_BYTES >> 20
                ),
            ));
        }
        fragments.push(fragment_from_bytes(&path, bytes)?);
    }
    let mut settings = load_fragments(&fragments)?;
    apply_kubelet(&mut settings);
    Ok(Loaded {
        settings,
        files: fragments.into_iter().map(|f| f.name).collect(),
        main_missing,
    })
}

/// Parses one TOML text on top of the defaults; errors name the file `<string>`.
#[cfg(test)]
pub(crate) fn load_str(text: &str) -> Result<Settings, ConfigError> {
    load_fragments(&[Fragment::new("<string>", text)])
}

/// Merges fragments in the given order on top of the defaults and checks the result.
pub(crate) fn load_fragments(fragments: &[Fragment]) -> Result<Settings, ConfigError> {
    let files = Merged::parse(fragments)?;
    let mut settings = files.deserialize()?;
    check::across(&mut settings, &files)?;
    Ok(settings)
}

/// The kubelet's own Graceful Node Shutdown, read from its configuration: whether it is on,
/// and its bands for the fallback unless nodegrace's files set bands; where the
/// configuration is set aside, why and what nodegrace does instead.
fn apply_kubelet(settings: &mut Settings) {
    let fb = &mut settings.fallback;
    let kubelet = super::kubelet::read(
        fb.kubelet_config.as_deref(),
        fb.kubelet_config_dir.as_deref(),
    );
    fb.kubelet_gns = kubelet.gns_on();
    if !kubelet.bands().is_empty() && fb.bands_from == BandsSource::Defaults {
        fb.shutdown_grace_period_by_pod_priority = kubelet.bands().to_vec();
        fb.bands_from = BandsSource::Kubelet(kubelet.files.clone());
    }
    fb.kubelet_set_aside = kubelet.set_aside().map(|why| {
        let condition = if fb.kubelet_gns {
            "leaves GracefulNodeShutdownInProgress to the kubelet"
        } else {
            "writes GracefulNodeShutdownInProgress itself"
        };
        format!(
            "{why}; instead the fallback uses {} and nodegrace {condition}",
            fb.bands_from
        )
    });
}

fn fragment_from_bytes(path: &Path, bytes: Vec<u8>) -> Result<Fragment, ConfigError> {
    let text = String::from_utf8(bytes)
        .map_err(|_| ConfigError::file(path, "not valid UTF-8 (TOML files must be UTF-8)"))?;
    Ok(Fragment::new(path, text))
}

fn drop_in_paths(main: &Path) -> Result<Vec<PathBuf>, ConfigError> {
    let dir = main
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("config.d");
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(err) if err.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => {
            return Err(ConfigError::file(
                &dir,
                format!("cannot list drop-ins: {err}"),
            ))
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|err| ConfigError::file(&dir, format!("cannot list drop-ins: {err}")))?;
        let name = entry.file_name();
        let bytes = name.as_bytes();
        if bytes.starts_with(b".") || !bytes.ends_with(b".toml") {
            continue;
        }
        let path = entry.path();
        let meta = fs::symlink_metadata(&path)
            .map_err(|err| ConfigError::file(&path, format!("cannot stat drop-in: {err}")))?;
        if meta.file_type().is_symlink() {
            return Err(ConfigError::file(
                &path,
                "drop-in is a symlink; copy the file into config.d instead",
            ));
        }
        if !meta.file_type().is_file() {
            return Err(ConfigError::file(&path, "drop-in is not a regular file"));
        }
        names.push(name);
    }
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    Ok(names.into_iter().map(|name| dir.join(name)).collect())
}
