//! Small, careful filesystem helpers shared by every module that reads or persists data.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use nix::sys::stat::{FileStat, SFlag};

/// Largest configuration file (main file or drop-in) read.
pub(crate) const CONFIG_FILE_LIMIT: u64 = 1 << 20;
/// Largest pod list (`plan --pods`): `kubectl get pods -o json` of a full node is a few MiB.
pub(crate) const POD_LIST_LIMIT: u64 = 64 << 20;
/// Largest file read from the state directory or the daemon's status file.
pub(crate) const STATE_FILE_LIMIT: u64 = 8 << 20;

/// Whether [`read_regular`] follows a symlink in the last component of the path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Symlinks {
    Follow,
    Refuse,
}

/// Why [`read_regular`] read nothing.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("no such file")]
    NotFound,
    /// A FIFO, device, directory, socket or (with [`Symlinks::Refuse`]) symlink.
    #[error("a {0}, not a regular file")]
    NotRegular(&'static str),
    #[error("larger than {limit} bytes, more than such a file can sensibly hold")]
    TooLarge { limit: u64 },
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl ReadError {
    /// The file is there but cannot be what it should be (as opposed to missing or an I/O
    /// error that may pass).
    pub(crate) fn is_bad_file(&self) -> bool {
        matches!(self, ReadError::NotRegular(_) | ReadError::TooLarge { .. })
    }
}

/// What kind of file `st` describes, for messages.
pub(crate) fn kind_of(st: &FileStat) -> &'static str {
    match SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT {
        SFlag::S_IFREG => "regular file",
        SFlag::S_IFLNK => "symlink",
        SFlag::S_IFDIR => "directory",
        SFlag::S_IFIFO => "FIFO",
        SFlag::S_IFSOCK => "socket",
        SFlag::S_IFCHR | SFlag::S_IFBLK => "device",
        _ => "unknown file type",
    }
}

/// Reads a whole regular file of at most `limit` bytes. Opening never blocks (a FIFO is
/// opened non-blocking, then refused like every other non-regular file), and no more than
/// `limit` bytes are ever read, whatever the file claims its size is (`/proc` files say 0).
pub(crate) fn read_regular(
    path: &Path,
    limit: u64,
    symlinks: Symlinks,
) -> Result<Vec<u8>, ReadError> {
    let mut flags = nix::libc::O_NONBLOCK | nix::libc::O_NOCTTY | nix::libc::O_CLOEXEC;
    if symlinks == Symlinks::Refuse {
        flags |= nix::libc::O_NOFOLLOW;
    }
    let file = match OpenOptions::new().read(true).custom_flags(flags).open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ReadError::NotFound),
        Err(e) if e.raw_os_error() == Some(nix::libc::ELOOP) && symlinks == Symlinks::Refuse => {
            return Err(ReadError::NotRegular("symlink"))
        }
        Err(e) => return Err(ReadError::Io(e)),
    };
    let st = nix::sys::stat::fstat(&file).map_err(std::io::Error::from)?;
    let kind = kind_of(&st);
    if kind != "regular file" {
        return Err(ReadError::NotRegular(kind));
    }
    let size = u64::try_from(st.st_size).unwrap_or(0);
    if size > limit {
        return Err(ReadError::TooLarge { limit });
    }
    let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    file.take(limit.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(ReadError::TooLarge { limit });
    }
    Ok(bytes)
}

/// Renames a file that cannot be used to `<name>.corrupt-<UTC time>` beside it, so that
/// nothing is lost and the next start does not trip over it again. Returns the new path.
pub(crate) fn set_aside(path: &Path) -> Result<PathBuf> {
    let target = aside_name(path)?;
    fs::rename(path, &target)
        .with_context(|| format!("renaming {} to {}", path.display(), target.display()))?;
    if let Some(dir) = path.parent() {
        fsync_dir(dir)?;
    }
    Ok(target)
}

/// Keeps the file as it is under the name [`set_aside`] would give it (a hard link), for a
/// caller that replaces `path` next and wants no moment without either.
pub(crate) fn keep_aside(path: &Path) -> Result<PathBuf> {
    let target = aside_name(path)?;
    fs::hard_link(path, &target)
        .with_context(|| format!("linking {} to {}", path.display(), target.display()))?;
    if let Some(dir) = path.parent() {
        fsync_dir(dir)?;
    }
    Ok(target)
}

fn aside_name(path: &Path) -> Result<PathBuf> {
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?
        .to_string_lossy()
        .into_owned();
    let stamp = chrono::Utc::now().format("%Y%m%dT%H%M%SZ");
    let base = path.with_file_name(format!("{name}.corrupt-{stamp}"));
    let mut target = base.clone();
    let mut n = 1;
    while fs::symlink_metadata(&target).is_ok() {
        n += 1;
        target = path.with_file_name(format!("{name}.corrupt-{stamp}-{n}"));
    }
    Ok(target)
}

/// Replaces `path` with `contents` so that a crash leaves either the old or the new
/// file, never a torn one: write a temporary sibling, fsync it, rename, fsync the dir.
pub(crate) fn write_atomic(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    let dir = path
        .parent()
        .with_context(|| format!("{} has no parent directory", path.display()))?;
    let name = path
        .file_name()
        .with_context(|| format!("{} has no file name", path.display()))?;
    let tmp = dir.join(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| -> Result<()> {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&tmp)
            .with_context(|| format!("creating {}", tmp.display()))?;
        f.write_all(contents)
            .with_context(|| format!("writing {}", tmp.display()))?;
        f.sync_all()
            .with_context(|| format!("syncing {}", tmp.display()))?;
        fs::rename(&tmp, path)
            .with_context(|| format!("renaming {} to {}", tmp.display(), path.display()))?;
        fsync_dir(dir)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

/// Makes a directory entry change (create, rename, unlink) durable.
pub(crate) fn fsync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("syncing directory {}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fifo(dir: &Path) -> PathBuf {
        let p = dir.join("fifo");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        p
    }

    #[test]
    fn read_regular_refuses_a_fifo_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = fifo(dir.path());
        let began = std::time::Instant::now();
        let err = read_regular(&p, 1024, Symlinks::Follow).unwrap_err();
        assert!(matches!(err, ReadError::NotRegular("FIFO")), "{err}");
        assert!(began.elapsed() < std::time::Duration::from_secs(2));
        assert_eq!(err.to_string(), "a FIFO, not a regular file");
    }

    #[test]
    fn read_regular_refuses_devices_and_directories() {
        let err = read_regular(Path::new("/dev/zero"), 1024, Symlinks::Follow).unwrap_err();
        assert!(matches!(err, ReadError::NotRegular("device")), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let err = read_regular(dir.path(), 1024, Symlinks::Follow).unwrap_err();
        assert!(matches!(err, ReadError::NotRegular("directory")), "{err}");
        assert!(err.is_bad_file());
    }

    #[test]
    fn read_regular_bounds_the_size() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("big");
        fs::write(&p, vec![b'x'; 11]).unwrap();
        assert_eq!(read_regular(&p, 11, Symlinks::Refuse).unwrap().len(), 11);
        let err = read_regular(&p, 10, Symlinks::Refuse).unwrap_err();
        assert!(matches!(err, ReadError::TooLarge { limit: 10 }), "{err}");
        // A regular file whose size says 0 is still read only up to the limit.
        let err = read_regular(Path::new("/proc/self/environ"), 1, Symlinks::Follow);
        if let Err(err) = err {
            assert!(matches!(err, ReadError::TooLarge { limit: 1 }), "{err}");
        }
    }

    #[test]
    fn read_regular_follows_or_refuses_symlinks_as_asked() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("target");
        fs::write(&target, b"x").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert_eq!(read_regular(&link, 10, Symlinks::Follow).unwrap(), b"x");
        let err = read_regular(&link, 10, Symlinks::Refuse).unwrap_err();
        assert!(matches!(err, ReadError::NotRegular("symlink")), "{err}");
        let err = read_regular(&dir.path().join("none"), 10, Symlinks::Refuse).unwrap_err();
        assert!(matches!(err, ReadError::NotFound) && !err.is_bad_file());
    }

    #[test]
    fn set_aside_renames_and_never_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        fs::write(&p, b"one").unwrap();
        let first = set_aside(&p).unwrap();
        fs::write(&p, b"two").unwrap();
        let second = set_aside(&p).unwrap();
        assert_ne!(first, second);
        assert!(!p.exists());
        assert_eq!(fs::read(&first).unwrap(), b"one");
        assert_eq!(fs::read(&second).unwrap(), b"two");
        let name = first.file_name().unwrap().to_string_lossy().into_owned();
        assert!(name.starts_with("state.json.corrupt-"), "{name}");
    }

    #[test]
    fn write_atomic_replaces_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("state.json");
        write_atomic(&p, b"one", 0o600).unwrap();
        write_atomic(&p, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&p).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn write_atomic_refuses_a_symlinked_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        fs::write(&target, b"keep").unwrap();
        let p = dir.path().join("state.json");
        let tmp = dir
            .path()
            .join(format!(".state.json.tmp-{}", std::process::id()));
        std::os::unix::fs::symlink(&target, &tmp).unwrap();
        assert!(write_atomic(&p, b"new", 0o600).is_err());
        assert_eq!(fs::read(&target).unwrap(), b"keep");
    }
}
