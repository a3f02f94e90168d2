//! Directory handles and the primitive, fault-injectable filesystem steps of a move.
//!
//! Every name is resolved relative to a directory file descriptor with `O_NOFOLLOW` /
//! `AT_SYMLINK_NOFOLLOW`, so nothing a hostile entry points at is ever opened, and the
//! directories themselves are opened with `O_NOFOLLOW` (their last component must not be a
//! symlink; parents are resolved once, when the directory is opened).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, RenameFlags};
use nix::sys::stat::{FileStat, Mode};
use nix::unistd::{Gid, Uid, UnlinkatFlags};
use serde::{Deserialize, Serialize};

/// One of the two directories a manifest can live in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Place {
    /// The kubelet's `staticPodPath`.
    Manifests,
    /// The gate directory.
    Gate,
}

impl Place {
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Place::Manifests => "static pod manifest",
            Place::Gate => "gate",
        }
    }
}

/// Which directory a primitive step changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepDir {
    Dir(Place),
    State,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepKind {
    JournalWrite,
    Mkdir,
    Rename,
    Link,
    /// Create a temporary file and write the copy into it (mode and owner included).
    Copy,
    Fsync,
    Unlink,
}

/// Only test hooks look inside a step.
#[cfg_attr(not(test), allow(dead_code))]
#[derive(Debug, Clone)]
pub(crate) struct Step<'a> {
    pub kind: StepKind,
    pub dir: StepDir,
    /// The other directory a rename changes.
    pub from_dir: Option<StepDir>,
    pub name: &'a str,
}

/// Called before every step that changes the disk. Tests return an error to simulate a
/// crash (every later step fails too) or a failure such as EROFS.
pub(crate) trait StepHook: Send + Sync {
    fn before(&self, step: &Step<'_>) -> std::result::Result<(), Errno>;
}

pub(crate) struct NoHook;

impl StepHook for NoHook {
    fn before(&self, _: &Step<'_>) -> std::result::Result<(), Errno> {
        Ok(())
    }
}

pub(crate) type Hook = Arc<dyn StepHook>;

/// Suffix of the temporary file of a cross-filesystem copy: `.<name>.nodegrace-tmp`,
/// a dot-file, so the kubelet never reads it.
pub(crate) const TEMP_SUFFIX: &str = ".nodegrace-tmp";

pub(crate) fn temp_name(name: &str) -> String {
    format!(".{name}{TEMP_SUFFIX}")
}

/// The manifest name a temporary file belongs to, if `name` is one of ours.
pub(crate) fn temp_owner(name: &str) -> Option<&str> {
    name.strip_prefix('.')?
        .strip_suffix(TEMP_SUFFIX)
        .filter(|n| !n.is_empty())
}

/// Names we will move: what the kubelet would read (no leading dot), a single path
/// component, nothing that could climb out of the directory.
pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.starts_with('.')
        || name.contains('/')
        || name.contains('\0')
        || name.len() > 255 - TEMP_SUFFIX.len() - 1
    {
        bail!("refused manifest name {name:?}: not a plain file name the kubelet would read");
    }
    Ok(())
}

pub(crate) fn sha256_hex(bytes: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, bytes);
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// A regular file read through `O_NOFOLLOW`.
#[derive(Debug, Clone)]
pub(crate) struct FileData {
    pub bytes: Vec<u8>,
    pub sha256: String,
    /// Permission bits including setuid/setgid/sticky.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub ino: u64,
}

/// What a name in a directory is.
#[derive(Debug)]
pub(crate) enum Entry {
    Absent,
    Regular(FileData),
    /// A symlink, FIFO, device, socket or directory: never opened, never moved.
    Other(&'static str),
}

pub(crate) use crate::fsutil::kind_of;

/// The most a file in the manifest or gate directory is read: far more than any pod
/// manifest, and what `status` and a shutdown can afford per file.
pub(crate) const MANIFEST_LIMIT: u64 = crate::fsutil::STATE_FILE_LIMIT;

/// The "kind" of a regular file over [`MANIFEST_LIMIT`]: like a FIFO, never read whole,
/// never moved.
pub(crate) const TOO_LARGE: &str = "file larger than 8 MiB (no pod manifest is)";

pub(crate) struct DirHandle {
    pub fd: OwnedFd,
    pub path: PathBuf,
    pub place: Place,
    pub dev: u64,
    pub ino: u64,
}

impl DirHandle {
    /// Opens an existing directory; a symlink in its place is refused.
    pub(crate) fn open(path: &Path, place: Place) -> Result<Self> {
        let fd = nix::fcntl::open(
            path,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            Errno::ELOOP => anyhow::anyhow!(
                "{} is a symlink; refused (configure the real directory)",
                path.display()
            ),
            Errno::ENOENT => anyhow::anyhow!("{} does not exist", path.display()),
            Errno::ENOTDIR => anyhow::anyhow!(
                "{} is not a directory (or is a symlink); refused",
                path.display()
            ),
            e => anyhow::Error::new(e).context(format!("opening {}", path.display())),
        })?;
        let st = nix::sys::stat::fstat(&fd).with_context(|| format!("stat {}", path.display()))?;
        Ok(DirHandle {
            fd,
            path: path.to_path_buf(),
            place,
            dev: st.st_dev,
            ino: st.st_ino,
        })
    }

    /// Whether both handles are one directory (the same path, a bind mount, a symlinked
    /// parent), whatever their names say.
    pub(crate) fn same_dir(&self, other: &DirHandle) -> bool {
        self.dev == other.dev && self.ino == other.ino
    }

    pub(crate) fn display(&self, name: &str) -> String {
        self.path.join(name).display().to_string()
    }

    pub(crate) fn stat(&self, name: &str) -> Result<Option<FileStat>> {
        match nix::sys::stat::fstatat(&self.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some(st)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e).with_context(|| format!("stat {}", self.display(name))),
        }
    }

    /// Reads `name` if it is a regular file, without following a symlink and without
    /// blocking on a FIFO.
    pub(crate) fn entry(&self, name: &str) -> Result<Entry> {
        let Some(st) = self.stat(name)? else {
            return Ok(Entry::Absent);
        };
        if kind_of(&st) != "regular file" {
            return Ok(Entry::Other(kind_of(&st)));
        }
        let fd = match nix::fcntl::openat(
            &self.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => return Ok(Entry::Absent),
            Err(Errno::ELOOP) => return Ok(Entry::Other("symlink")),
            Err(e) => return Err(e).with_context(|| format!("opening {}", self.display(name))),
        };
        let st =
            nix::sys::stat::fstat(&fd).with_context(|| format!("stat {}", self.display(name)))?;
        if kind_of(&st) != "regular file" {
            return Ok(Entry::Other(kind_of(&st)));
        }
        let limit = MANIFEST_LIMIT;
        if u64::try_from(st.st_size).unwrap_or(u64::MAX) > limit {
            return Ok(Entry::Other(TOO_LARGE));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(st.st_size).unwrap_or(0));
        File::from(fd)
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .with_context(|| format!("reading {}", self.display(name)))?;
        if bytes.len() as u64 > limit {
            return Ok(Entry::Other(TOO_LARGE));
        }
        Ok(Entry::Regular(FileData {
            sha256: sha256_hex(&bytes),
            bytes,
            mode: st.st_mode & 0o7777,
            uid: st.st_uid,
            gid: st.st_gid,
            ino: st.st_ino,
        }))
    }

    /// Entry names, sorted. Read through `/proc/self/fd` so that the listing is of the
    /// directory we hold open, not of whatever the path names now.
    pub(crate) fn names(&self) -> Result<Vec<String>> {
        use std::os::fd::AsRawFd;
        let proc_path = PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd()));
        let rd = std::fs::read_dir(&proc_path)
            .or_else(|_| std::fs::read_dir(&self.path))
            .with_context(|| format!("listing {}", self.path.display()))?;
        let mut names = Vec::new();
        for e in rd {
            let e = e.with_context(|| format!("listing {}", self.path.display()))?;
            match e.file_name().into_string() {
                Ok(n) => names.push(n),
                Err(raw) => tracing::warn!(
                    dir = %self.path.display(),
                    name = ?raw,
                    "ignoring a file whose name is not UTF-8"
                ),
            }
        }
        names.sort();
        Ok(names)
    }
}

/// The primitive steps, each announced to the hook first.
pub(crate) struct Ops {
    pub hook: Hook,
}

fn step_dir(d: &DirHandle) -> StepDir {
    StepDir::Dir(d.place)
}

impl Ops {
    fn announce(&self, kind: StepKind, dir: StepDir, name: &str) -> nix::Result<()> {
        self.hook.before(&Step {
            kind,
            dir,
            from_dir: None,
            name,
        })
    }

    /// `renameat2(RENAME_NOREPLACE)`; EEXIST if `to` exists, EINVAL where the filesystem
    /// lacks the flag, EXDEV across filesystems.
    pub(crate) fn rename_noreplace(
        &self,
        from: &DirHandle,
        from_name: &str,
        to: &DirHandle,
        to_name: &str,
    ) -> nix::Result<()> {
        self.hook.before(&Step {
            kind: StepKind::Rename,
            dir: step_dir(to),
            from_dir: Some(step_dir(from)),
            name: to_name,
        })?;
        nix::fcntl::renameat2(
            &from.fd,
            from_name,
            &to.fd,
            to_name,
            RenameFlags::RENAME_NOREPLACE,
        )
    }

    /// A hard link never replaces an existing name: the fallback for `RENAME_NOREPLACE`.
    pub(crate) fn link(
        &self,
        from: &DirHandle,
        from_name: &str,
        to: &DirHandle,
        to_name: &str,
    ) -> nix::Result<()> {
        self.announce(StepKind::Link, step_dir(to), to_name)?;
        nix::unistd::linkat(&from.fd, from_name, &to.fd, to_name, AtFlags::empty())
    }

    pub(crate) fn unlink(&self, dir: &DirHandle, name: &str) -> nix::Result<()> {
        self.announce(StepKind::Unlink, step_dir(dir), name)?;
        nix::unistd::unlinkat(&dir.fd, name, UnlinkatFlags::NoRemoveDir)
    }

    pub(crate) fn fsync_dir(&self, dir: &DirHandle) -> nix::Result<()> {
        self.announce(StepKind::Fsync, step_dir(dir), ".")?;
        nix::unistd::fsync(&dir.fd)
    }

    /// Writes `data` into a new file `name` (which must not exist) with the original's
    /// owner and mode, and fsyncs it. A partial file may remain on error.
    pub(crate) fn write_copy(
        &self,
        dir: &DirHandle,
        name: &str,
        data: &FileData,
    ) -> nix::Result<()> {
        self.announce(StepKind::Copy, step_dir(dir), name)?;
        let fd = nix::fcntl::openat(
            &dir.fd,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )?;
        let mut f = File::from(fd);
        f.write_all(&data.bytes)
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(nix::libc::EIO)))?;
        // chown before chmod: chown clears setuid/setgid bits.
        nix::unistd::fchown(
            f.as_fd(),
            Some(Uid::from_raw(data.uid)),
            Some(Gid::from_raw(data.gid)),
        )?;
        nix::sys::stat::fchmod(f.as_fd(), Mode::from_bits_truncate(data.mode))?;
        self.announce(StepKind::Fsync, step_dir(dir), name)?;
        nix::unistd::fsync(f.as_fd())
    }

    pub(crate) fn mkdir(&self, path: &Path) -> Result<()> {
        self.announce(StepKind::Mkdir, StepDir::Dir(Place::Gate), "")
            .with_context(|| format!("creating {}", path.display()))?;
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(path)
            .with_context(|| format!("creating {}", path.display()))
    }

    pub(crate) fn journal_write(&self, f: impl FnOnce() -> Result<()>) -> Result<()> {
        self.announce(StepKind::JournalWrite, StepDir::State, "journal")
            .context("writing the static-pod journal")?;
        f()
    }
}
