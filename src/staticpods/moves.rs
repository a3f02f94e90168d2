//! Moving one manifest between the manifest and gate directories, journaled, and settling a
//! move that a crash or an error interrupted: the file ends up in exactly one place, and
//! the only copy of anything is never deleted.

use anyhow::{bail, Context, Result};
use nix::errno::Errno;

use super::fsio::{check_name, temp_name, DirHandle, Entry, FileData};
use super::journal::{Intent, Op, Record};
use super::{FsGate, Settled};

/// Why an intent can never be settled from what is on disk; trying again cannot help.
#[derive(Debug)]
pub(super) struct Unsettleable(String);

impl std::fmt::Display for Unsettleable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unsettleable {}

pub(super) fn unsettleable(why: String) -> anyhow::Error {
    Unsettleable(why).into()
}

/// A journaled move is between our two directories, one to the other: anything else comes
/// from a corrupted or hand-edited journal and is never acted on.
pub(super) fn check_intent(intent: &Intent) -> Result<()> {
    if intent.from == intent.to {
        return Err(unsettleable(format!(
            "the journal names the {} directory as both source and destination of {} (no move \
             does that: a corrupted or hand-edited journal); nothing touched, the file stays \
             where it is",
            intent.from.describe(),
            intent.file
        )));
    }
    check_name(&intent.file).map_err(|e| unsettleable(format!("{e:#}; nothing touched")))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Moved {
    Yes,
    DestinationExists,
}

impl FsGate {
    /// Moves `name` from `src` to `dst`, journaled. On failure the move is settled at once
    /// (so nothing waits for the next start) and the error returned.
    pub(super) fn move_file(
        &self,
        op: Op,
        src: &DirHandle,
        dst: &DirHandle,
        name: &str,
    ) -> Result<Moved> {
        check_name(name)?;
        self.check_distinct(src, dst)?;
        let data = match src.entry(name)? {
            Entry::Absent => bail!("{} does not exist", src.display(name)),
            Entry::Other(kind) => bail!(
                "refused {}: it is a {kind}, not a regular file; left in place",
                src.display(name)
            ),
            Entry::Regular(d) => d,
        };
        if dst.stat(name)?.is_some() {
            return Ok(Moved::DestinationExists);
        }
        let intent = Intent {
            id: rand::random(),
            op,
            file: name.to_string(),
            from: src.place,
            to: dst.place,
            size: data.bytes.len() as u64,
            sha256: data.sha256.clone(),
            mode: data.mode,
            uid: data.uid,
            gid: data.gid,
            copy: self.force_copy || src.dev != dst.dev,
        };
        self.journal_append(&Record::Intent(intent.clone()))
            .with_context(|| format!("not moving {}", src.display(name)))?;
        match self.carry(&intent, src, dst, &data) {
            Ok(moved) => {
                if let Err(e) = self.journal_append(&Record::Done { id: intent.id }) {
                    tracing::warn!(file = %name, error = %format!("{e:#}"), "moved, but could not journal it; recovery will confirm");
                }
                Ok(moved)
            }
            Err(e) => {
                match self.settle(&intent, src, dst) {
                    Ok(s) => {
                        tracing::warn!(file = %name, outcome = ?s, "settled a failed move");
                        let _ = self.journal_append(&Record::Done { id: intent.id });
                    }
                    Err(e2) => {
                        tracing::error!(file = %name, error = %format!("{e2:#}"), "failed move left for recovery")
                    }
                }
                Err(e)
            }
        }
    }

    pub(super) fn carry(
        &self,
        intent: &Intent,
        src: &DirHandle,
        dst: &DirHandle,
        data: &FileData,
    ) -> Result<Moved> {
        let name = intent.file.as_str();
        let what = || format!("moving {} to {}", src.display(name), dst.path.display());
        if !intent.copy {
            match self.ops.rename_noreplace(src, name, dst, name) {
                Ok(()) => {
                    self.sync_both(src, dst)?;
                    return Ok(Moved::Yes);
                }
                Err(Errno::EEXIST) => return Ok(Moved::DestinationExists),
                Err(Errno::EXDEV) => {}
                Err(Errno::EINVAL) => match self.ops.link(src, name, dst, name) {
                    Ok(()) => {
                        self.ops.fsync_dir(dst).with_context(what)?;
                        self.remove_duplicate(src, dst, name, &intent.sha256)
                            .with_context(what)?;
                        self.ops.fsync_dir(src).with_context(what)?;
                        return Ok(Moved::Yes);
                    }
                    Err(Errno::EEXIST) => return Ok(Moved::DestinationExists),
                    Err(Errno::EXDEV) => {}
                    Err(e) => return Err(e).with_context(what),
                },
                Err(e) => return Err(e).with_context(what),
            }
        }
        let tmp = temp_name(name);
        if dst.stat(&tmp)?.is_some() {
            self.ops.unlink(dst, &tmp).with_context(what)?;
        }
        self.ops.write_copy(dst, &tmp, data).with_context(what)?;
        match self.place_temp(dst, &tmp, name) {
            Ok(()) => {}
            Err(Errno::EEXIST) => {
                self.ops.unlink(dst, &tmp).with_context(what)?;
                self.ops.fsync_dir(dst).with_context(what)?;
                return Ok(Moved::DestinationExists);
            }
            Err(e) => return Err(e).with_context(what),
        }
        self.ops.fsync_dir(dst).with_context(what)?;
        match src.entry(name)? {
            Entry::Regular(now) if now.sha256 == intent.sha256 => {}
            Entry::Absent => return Ok(Moved::Yes),
            _ => bail!(
                "{} changed while it was copied to {}; both kept, decide by hand",
                src.display(name),
                dst.path.display()
            ),
        }
        self.remove_duplicate(src, dst, name, &intent.sha256)
            .with_context(what)?;
        self.ops.fsync_dir(src).with_context(what)?;
        Ok(Moved::Yes)
    }

    /// Unlinks manifest `name` from `dir` because `keep`, another directory, holds the same
    /// content (`sha256`, which the file removed holds too) under the same name: checked
    /// again right before, since this is the only way a manifest (not a temporary of ours)
    /// is ever removed.
    pub(super) fn remove_duplicate(
        &self,
        dir: &DirHandle,
        keep: &DirHandle,
        name: &str,
        sha256: &str,
    ) -> Result<()> {
        if dir.same_dir(keep) {
            return Err(unsettleable(format!(
                "{} and {} are one directory: {name} is the only copy; nothing touched",
                dir.path.display(),
                keep.path.display()
            )));
        }
        let holds = |d: &DirHandle| -> Result<bool> {
            Ok(matches!(d.entry(name)?, Entry::Regular(f) if f.sha256 == sha256))
        };
        if !holds(dir)? || !holds(keep)? {
            bail!(
                "not removing {}: it and {} are not the same complete manifest",
                dir.display(name),
                keep.display(name)
            );
        }
        self.ops
            .unlink(dir, name)
            .with_context(|| format!("removing {}", dir.display(name)))
    }

    /// Renames the temporary into place without replacing anything.
    pub(super) fn place_temp(&self, dst: &DirHandle, tmp: &str, name: &str) -> nix::Result<()> {
        match self.ops.rename_noreplace(dst, tmp, dst, name) {
            Err(Errno::EINVAL) => {
                self.ops.link(dst, tmp, dst, name)?;
                self.ops.unlink(dst, tmp)
            }
            r => r,
        }
    }

    pub(super) fn sync_both(&self, src: &DirHandle, dst: &DirHandle) -> Result<()> {
        self.ops
            .fsync_dir(dst)
            .with_context(|| format!("syncing {}", dst.path.display()))?;
        self.ops
            .fsync_dir(src)
            .with_context(|| format!("syncing {}", src.path.display()))
    }

    pub(super) fn remove_temp(&self, dst: &DirHandle, tmp: &str, t: &Entry) -> Result<()> {
        if matches!(t, Entry::Absent) {
            return Ok(());
        }
        self.ops
            .unlink(dst, tmp)
            .with_context(|| format!("removing {}", dst.display(tmp)))?;
        self.ops
            .fsync_dir(dst)
            .with_context(|| format!("syncing {}", dst.path.display()))
    }

    /// Decides from the files on disk where an interrupted move's file is, and finishes or
    /// undoes it so that it is in exactly one place. Idempotent: a crash inside it is
    /// settled by running it again. Never removes the only copy of the journaled content.
    pub(super) fn settle(
        &self,
        intent: &Intent,
        src: &DirHandle,
        dst: &DirHandle,
    ) -> Result<Settled> {
        let name = intent.file.as_str();
        check_intent(intent)?;
        if src.place != intent.from || dst.place != intent.to {
            bail!("internal error: settling {name} between the wrong directories");
        }
        if src.same_dir(dst) {
            return Err(unsettleable(format!(
                "{} and {} are one directory, so the move of {name} cannot be settled; nothing touched",
                src.path.display(),
                dst.path.display()
            )));
        }
        let tmp = temp_name(name);
        let s = src.entry(name)?;
        let d = dst.entry(name)?;
        let t = dst.entry(&tmp)?;
        let is_ours = |e: &Entry| matches!(e, Entry::Regular(f) if f.sha256 == intent.sha256);
        let present = |e: &Entry| !matches!(e, Entry::Absent);

        if is_ours(&d) {
            if let (Entry::Regular(sf), Entry::Regular(df)) = (&s, &d) {
                if sf.sha256 == intent.sha256 {
                    if let Err(e) = self.remove_duplicate(src, dst, name, &intent.sha256) {
                        // Source cannot be removed (read-only?): undo our copy instead.
                        if sf.ino != df.ino || src.dev != dst.dev {
                            tracing::warn!(file = %src.display(name), error = %format!("{e:#}"), "cannot remove the source; removing the copy instead");
                            self.remove_duplicate(dst, src, name, &intent.sha256)?;
                            self.ops
                                .fsync_dir(dst)
                                .with_context(|| format!("syncing {}", dst.path.display()))?;
                            self.remove_temp(dst, &tmp, &t)?;
                            return Ok(Settled::AtSource);
                        }
                        return Err(e);
                    }
                    self.ops
                        .fsync_dir(src)
                        .with_context(|| format!("syncing {}", src.path.display()))?;
                    self.remove_temp(dst, &tmp, &t)?;
                    return Ok(Settled::AtDestination);
                }
            }
            self.remove_temp(dst, &tmp, &t)?;
            return Ok(if present(&s) {
                Settled::BothKept(format!(
                    "{} differs from the moved copy {}",
                    src.display(name),
                    dst.display(name)
                ))
            } else {
                Settled::AtDestination
            });
        }
        if is_ours(&s) {
            self.remove_temp(dst, &tmp, &t)?;
            return Ok(if present(&d) {
                Settled::BothKept(format!(
                    "{} is a different file; {} stays where it is",
                    dst.display(name),
                    src.display(name)
                ))
            } else {
                Settled::AtSource
            });
        }
        if is_ours(&t) {
            if present(&d) {
                return Err(unsettleable(format!(
                    "the only complete copy of {name} is {} and {} is taken; both left in place: \
                     decide which to keep and rename it to {name} by hand",
                    dst.display(&tmp),
                    dst.display(name)
                )));
            }
            self.place_temp(dst, &tmp, name)
                .with_context(|| format!("renaming {} into place", dst.display(&tmp)))?;
            self.ops
                .fsync_dir(dst)
                .with_context(|| format!("syncing {}", dst.path.display()))?;
            return Ok(if present(&s) {
                Settled::BothKept(format!("{} was changed meanwhile", src.display(name)))
            } else {
                Settled::AtDestination
            });
        }
        if !present(&s) && !present(&d) {
            return Err(unsettleable(format!(
                "{name} (sha256 {}) is in neither {} nor {} (removed by hand?); nothing touched: \
                 if its pod should run, put its manifest back into {}",
                intent.sha256,
                src.path.display(),
                dst.path.display(),
                self.manifest_dir.display()
            )));
        }
        // Someone else replaced the file: what is there is theirs, our partial copy is not.
        self.remove_temp(dst, &tmp, &t)?;
        Ok(Settled::BothKept(format!(
            "{name} was replaced by another file during the move"
        )))
    }
}
