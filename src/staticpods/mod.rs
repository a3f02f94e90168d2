//! Static-pod gate: moves manifests out of the kubelet's `staticPodPath` and back,
//! journaled and crash-safe. See the StaticPodGate trait for the contract.
//!
//! A move is: parse and hash the file, append an intent (file, from, to, size, SHA-256,
//! mode, owner) to the journal and fsync it, then `renameat2(RENAME_NOREPLACE)` within a
//! filesystem (hard link + unlink where the flag is unsupported), or across filesystems
//! copy to a dot-file (`.<name>.nodegrace-tmp`, which the kubelet ignores) with the same
//! owner and mode, fsync, rename into place without replacing, fsync the directory, unlink
//! the source, fsync its directory; then append `done`. After a crash, `recover` decides
//! where each journaled file is by comparing content hashes, removes the redundant copy
//! and temporaries, and never deletes the only copy of anything. A record that names no
//! possible move (one directory twice, an unreadable line), or whose file is in neither
//! directory, is set aside (`static-pods.journal.set-aside`, with why) without touching
//! any file, so that it never keeps the other manifests gated. A manifest is only ever
//! removed by `remove_duplicate`, which checks that another directory holds its copy.
//!
//! Hostile paths: names are single components without a leading dot (what the kubelet
//! reads); every file is reached through a directory fd with `O_NOFOLLOW` /
//! `AT_SYMLINK_NOFOLLOW`; symlinks, FIFOs, devices, sockets and directories are reported and
//! never moved. The two directories are opened with `O_NOFOLLOW` (their last component must
//! not be a symlink; parent components are resolved once, at open). The gate directory must
//! not be inside the manifest directory (checked lexically and once resolved), and must be
//! owned by us and not group/other-writable, since its contents get restored into
//! `staticPodPath`. A `staticPodPath` that names a single file is not supported.
//!
//! A regular file the kubelet refuses (not YAML, or not one `v1` Pod) is still the
//! operator's: it is gated and restored like any manifest (byte for byte, journaled), but
//! as it names no pod, its priority cannot be read and it goes last, after every pod.

mod fsio;
mod journal;
mod manifest;
mod moves;

#[cfg(test)]
mod tests;

use std::fs::OpenOptions;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};

use crate::config::StaticPodSettings;
#[cfg(test)]
use fsio::Hook;
use fsio::{check_name, temp_owner, DirHandle, Entry, NoHook, Ops, TOO_LARGE};
use journal::{Intent, Op, Record};
use moves::{check_intent, Moved, Unsettleable};

pub(crate) use fsio::Place;
pub use manifest::mirror_pod_name;
pub(crate) use manifest::parse_manifest;

/// One static pod manifest, identified by parsing it (not by its file name).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticManifest {
    /// File name inside the manifest or gate directory.
    pub file_name: String,
    pub namespace: String,
    /// `metadata.name` in the manifest; the mirror pod is named `<name>-<nodeName>`.
    pub pod_name: String,
    pub priority: i32,
    pub labels: std::collections::BTreeMap<String, String>,
}

impl StaticManifest {
    /// Whether the mirror pod `pod_namespace/pod_name` on `node_name` is this manifest's.
    pub(crate) fn is_mirrored_by(
        &self,
        pod_namespace: &str,
        pod_name: &str,
        node_name: &str,
    ) -> bool {
        self.namespace == pod_namespace && mirror_pod_name(&self.pod_name, node_name) == pod_name
    }
}

/// Synchronous on purpose: callers in async code use `spawn_blocking`.
pub trait StaticPodGate: Send + Sync {
    /// Replays the journal after a crash; every manifest ends in exactly one place.
    fn recover(&self) -> Result<()>;
    /// Manifests the kubelet currently sees (parseable ones; others are reported).
    fn active(&self) -> Result<Vec<StaticManifest>>;
    /// Manifests currently gated.
    fn gated(&self) -> Result<Vec<StaticManifest>>;
    /// Moves one manifest from the manifest directory to the gate directory. Gating a
    /// manifest that is already gated (and gone from the manifest directory) succeeds.
    fn gate(&self, file_name: &str) -> Result<()>;
    /// Moves every gated manifest back, never overwriting; returns the names kept aside.
    fn restore_all(&self) -> Result<Vec<String>>;

    /// Regular files in the manifest directory that the kubelet refuses (not one `v1`
    /// Pod), with why: no priority can be read from them, so they are gated last.
    fn unreadable_active(&self) -> Result<Vec<Problem>> {
        Ok(Vec::new())
    }

    /// Gates every file of [`unreadable_active`](Self::unreadable_active): each file's name
    /// and how its move went.
    fn gate_unreadable(&self) -> Result<Vec<(String, Result<()>)>> {
        Ok(self
            .unreadable_active()?
            .into_iter()
            .map(|p| {
                let r = self.gate(&p.file_name);
                (p.file_name, r)
            })
            .collect())
    }

    /// Whether anything restorable is gated, manifests the kubelet refuses included.
    fn has_gated(&self) -> Result<bool> {
        Ok(!self.gated()?.is_empty())
    }

    /// The active manifest whose mirror pod is `pod_namespace/pod_name` on `node_name`,
    /// matched by the parsed name and namespace, never by file name. When several files
    /// declare the same pod, the first by file name.
    fn find_manifest_for_mirror(
        &self,
        pod_namespace: &str,
        pod_name: &str,
        node_name: &str,
    ) -> Result<Option<StaticManifest>> {
        Ok(self
            .active()?
            .into_iter()
            .find(|m| m.is_mirrored_by(pod_namespace, pod_name, node_name)))
    }
}

/// The daemon's gate: an interrupted move is settled just before the first use, not when
/// the daemon is built, so that the daemon's inhibitor is already held when recovery runs
/// (its first users are the lifecycle's effects, which come after the inhibitor).
pub(crate) struct RecoveredFirst {
    gate: FsGate,
    recovered: std::sync::Once,
}

impl RecoveredFirst {
    pub(crate) fn new(gate: FsGate) -> Self {
        RecoveredFirst {
            gate,
            recovered: std::sync::Once::new(),
        }
    }

    fn ready(&self) -> &FsGate {
        self.recovered.call_once(|| {
            if let Err(err) = self.gate.recover() {
                tracing::error!(
                    error = %crate::text::clip(&format!("{err:#}")),
                    "static pod gate recovery left moves unsettled; see the journal"
                );
            }
        });
        &self.gate
    }
}

impl StaticPodGate for RecoveredFirst {
    fn recover(&self) -> Result<()> {
        self.ready().recover()
    }
    fn active(&self) -> Result<Vec<StaticManifest>> {
        self.ready().active()
    }
    fn gated(&self) -> Result<Vec<StaticManifest>> {
        self.ready().gated()
    }
    fn gate(&self, file_name: &str) -> Result<()> {
        self.ready().gate(file_name)
    }
    fn restore_all(&self) -> Result<Vec<String>> {
        self.ready().restore_all()
    }
    fn unreadable_active(&self) -> Result<Vec<Problem>> {
        self.ready().unreadable_active()
    }
    fn has_gated(&self) -> Result<bool> {
        self.ready().has_gated()
    }
}

/// A file left where it is, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file_name: String,
    pub reason: String,
}

/// What one directory holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scan {
    /// Parseable manifests, by file name.
    pub manifests: Vec<StaticManifest>,
    /// Regular files that are not a single v1 Pod (the kubelet refuses them too); gated
    /// and restored like manifests, last.
    pub unparseable: Vec<Problem>,
    /// Symlinks, FIFOs, devices, sockets, directories: never touched.
    pub refused: Vec<Problem>,
    /// Our own temporaries (`.<name>.nodegrace-tmp`); `recover` removes them.
    pub temporaries: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RestoreReport {
    pub restored: Vec<String>,
    /// A file of the same name is in the manifest directory: the gated one stays in the
    /// gate directory for the operator to decide.
    pub kept_aside: Vec<String>,
    /// Not restored because of an error; still in the gate directory.
    pub failed: Vec<Problem>,
}

/// Where `recover` left a journaled file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Settled {
    /// The move had finished (or was finished from a complete copy).
    AtDestination,
    /// The move had not happened; the file is where it was.
    AtSource,
    /// Two different files now carry the name (one changed or appeared meanwhile); both
    /// kept for the operator.
    BothKept(String),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RecoveryReport {
    pub settled: Vec<(String, Settled)>,
    /// Journal entries that could not be settled for now (a directory could not be read or
    /// changed); they stay in the journal and are tried again.
    pub unsettled: Vec<Problem>,
    /// Journal entries that what is on disk can never settle (an impossible move, a file in
    /// neither directory, an unreadable line): moved to the set-aside file beside the
    /// journal, with why and what to do, so they stop blocking everything else. Nothing
    /// on disk was touched for them.
    pub set_aside: Vec<Problem>,
    /// Temporaries with no complete copy elsewhere, left in place.
    pub leftover_temporaries: Vec<String>,
}

/// The gate on the real filesystem.
pub struct FsGate {
    manifest_dir: PathBuf,
    gate_dir: PathBuf,
    journal: PathBuf,
    lock: PathBuf,
    state_dir: PathBuf,
    ops: Ops,
    force_copy: bool,
}

/// Name of the journal inside the state directory.
pub(crate) const JOURNAL_FILE: &str = "static-pods.journal";
const LOCK_FILE: &str = "static-pods.lock";

fn lexically_clean(p: &Path, what: &str) -> Result<()> {
    if !p.is_absolute() {
        bail!("{what} {} must be an absolute path", p.display());
    }
    if p.components().any(|c| matches!(c, Component::ParentDir)) {
        bail!("{what} {} must not contain '..'", p.display());
    }
    Ok(())
}

fn check_not_inside(inner: &Path, outer: &Path, inner_what: &str) -> Result<()> {
    if inner.starts_with(outer) {
        bail!(
            "{inner_what} {} must not be the kubelet's staticPodPath {} or inside it",
            inner.display(),
            outer.display()
        );
    }
    Ok(())
}

impl FsGate {
    /// `settings.manifest_dir` is the kubelet's `staticPodPath`; the journal and its lock
    /// live in `state_dir`. Nothing is created until the first move.
    pub fn new(settings: &StaticPodSettings, state_dir: &Path) -> Result<Self> {
        lexically_clean(&settings.manifest_dir, "static pod manifest directory")?;
        lexically_clean(&settings.gate_dir, "gate directory")?;
        lexically_clean(state_dir, "state directory")?;
        check_not_inside(&settings.gate_dir, &settings.manifest_dir, "gate directory")?;
        check_not_inside(state_dir, &settings.manifest_dir, "state directory")?;
        let gate = FsGate {
            manifest_dir: settings.manifest_dir.clone(),
            gate_dir: settings.gate_dir.clone(),
            journal: state_dir.join(JOURNAL_FILE),
            lock: state_dir.join(LOCK_FILE),
            state_dir: state_dir.to_path_buf(),
            ops: Ops {
                hook: Arc::new(NoHook),
            },
            force_copy: false,
        };
        gate.check_resolved_layout()?;
        Ok(gate)
    }

    /// Same check on resolved paths, so a symlinked parent cannot put the gate directory
    /// inside the manifest directory.
    fn check_resolved_layout(&self) -> Result<()> {
        let (Ok(m), Ok(g)) = (
            self.manifest_dir.canonicalize(),
            self.gate_dir.canonicalize(),
        ) else {
            return Ok(());
        };
        check_not_inside(&g, &m, "gate directory (resolved)")
    }

    #[cfg(test)]
    fn with_hook(mut self, hook: Hook) -> Self {
        self.ops = Ops { hook };
        self
    }

    /// Always copy (the cross-filesystem path), even within one filesystem. For tests.
    pub fn with_forced_copy(mut self, yes: bool) -> Self {
        self.force_copy = yes;
        self
    }

    pub(crate) fn journal_file(&self) -> &Path {
        &self.journal
    }

    pub fn manifest_dir(&self) -> &Path {
        &self.manifest_dir
    }

    /// Where recovery keeps the journal records it could not settle.
    pub(crate) fn set_aside_file(&self) -> PathBuf {
        journal::set_aside_path(&self.journal)
    }

    /// The two directories must be two: through a bind mount or a symlinked parent, two
    /// names can lead to one directory, where "the copy at the destination" is the source.
    fn check_distinct(&self, m: &DirHandle, g: &DirHandle) -> Result<()> {
        if m.same_dir(g) {
            bail!(
                "the gate directory {} is the static pod manifest directory {} (the same directory under two names); refused",
                g.path.display(),
                m.path.display()
            );
        }
        Ok(())
    }

    pub fn gate_dir(&self) -> &Path {
        &self.gate_dir
    }

    fn lock(&self) -> Result<nix::fcntl::Flock<std::fs::File>> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.state_dir)
            .with_context(|| format!("creating {}", self.state_dir.display()))?;
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
            .open(&self.lock)
            .with_context(|| format!("opening {}", self.lock.display()))?;
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| e)
            .with_context(|| format!("locking {}", self.lock.display()))
    }

    fn journal_append(&self, record: &Record) -> Result<()> {
        self.ops
            .journal_write(|| journal::append(&self.journal, record))
    }

    fn open(&self, place: Place) -> Result<DirHandle> {
        match place {
            Place::Manifests => DirHandle::open(&self.manifest_dir, place)
                .context("the kubelet's static pod manifest directory"),
            Place::Gate => {
                let g = DirHandle::open(&self.gate_dir, place).context("the gate directory")?;
                // Whatever sits in the gate directory is restored into staticPodPath: a
                // directory others can write to would let them plant a pod.
                let st = nix::sys::stat::fstat(&g.fd)
                    .with_context(|| format!("stat {}", self.gate_dir.display()))?;
                if st.st_uid != nix::unistd::geteuid().as_raw() || st.st_mode & 0o022 != 0 {
                    bail!(
                        "gate directory {} must be owned by uid {} and not writable by group or others (owner {}, mode {:o}); refused",
                        self.gate_dir.display(),
                        nix::unistd::geteuid(),
                        st.st_uid,
                        st.st_mode & 0o7777
                    );
                }
                Ok(g)
            }
        }
    }

    /// The gate directory, created 0700 when missing.
    fn open_gate_creating(&self) -> Result<DirHandle> {
        match std::fs::symlink_metadata(&self.gate_dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                self.ops.mkdir(&self.gate_dir)?;
                if let Some(parent) = self.gate_dir.parent() {
                    crate::fsutil::fsync_dir(parent)?;
                }
            }
            _ => {}
        }
        let g = self.open(Place::Gate)?;
        self.check_resolved_layout()?;
        Ok(g)
    }

    /// Everything in one directory, parsed. A missing gate directory holds nothing.
    pub fn scan(&self, place: Place) -> Result<Scan> {
        let dir = match self.open(place) {
            Ok(d) => d,
            Err(_)
                if place == Place::Gate && std::fs::symlink_metadata(&self.gate_dir).is_err() =>
            {
                return Ok(Scan::default())
            }
            Err(e) => return Err(e),
        };
        let mut scan = Scan::default();
        for name in dir.names()? {
            if temp_owner(&name).is_some() {
                scan.temporaries.push(name);
                continue;
            }
            if name.starts_with('.') {
                continue; // the kubelet ignores dot-files, and so do we
            }
            let entry = match dir.entry(&name) {
                Ok(e) => e,
                Err(e) => {
                    scan.refused.push(Problem {
                        file_name: name,
                        reason: format!("cannot be read: {e:#}"),
                    });
                    continue;
                }
            };
            match entry {
                Entry::Absent => {}
                Entry::Other("directory") => {}
                Entry::Other(kind) => scan.refused.push(Problem {
                    file_name: name,
                    reason: if kind == TOO_LARGE {
                        format!("is a {kind}; not read")
                    } else {
                        format!("is a {kind}, not a regular file")
                    },
                }),
                Entry::Regular(data) => match parse_manifest(&data.bytes) {
                    Ok(p) => scan.manifests.push(StaticManifest {
                        file_name: name,
                        namespace: p.namespace,
                        pod_name: p.name,
                        priority: p.priority,
                        labels: p.labels,
                    }),
                    Err(why) => scan.unparseable.push(Problem {
                        file_name: name,
                        reason: why,
                    }),
                },
            }
        }
        for p in &scan.unparseable {
            tracing::warn!(dir = %dir.path.display(), file = %p.file_name, reason = %p.reason,
                "not a static pod manifest the kubelet can run; gated and restored with the static pods, last");
        }
        for p in &scan.refused {
            tracing::warn!(dir = %dir.path.display(), file = %p.file_name, reason = %p.reason,
                "not a regular file; left in place");
        }
        Ok(scan)
    }

    /// Restores every gated manifest it can; the report says what happened to each.
    pub(crate) fn restore_report(&self) -> Result<RestoreReport> {
        let _lock = self.lock()?;
        let mut report = RestoreReport::default();
        if std::fs::symlink_metadata(&self.gate_dir).is_err() {
            return Ok(report);
        }
        let g = self.open(Place::Gate)?;
        let names: Vec<String> = g
            .names()?
            .into_iter()
            .filter(|n| !n.starts_with('.'))
            .collect();
        let m = match self.open(Place::Manifests) {
            Ok(m) => m,
            Err(e) => {
                for n in names {
                    report.failed.push(Problem {
                        file_name: n,
                        reason: format!("{e:#}"),
                    });
                }
                return Ok(report);
            }
        };
        self.check_distinct(&m, &g)?;
        for name in names {
            if let Ok(Entry::Other("directory")) = g.entry(&name) {
                continue;
            }
            match self.move_file(Op::Restore, &g, &m, &name) {
                Ok(Moved::Yes) => {
                    tracing::info!(file = %name, "restored static pod manifest");
                    report.restored.push(name);
                }
                Ok(Moved::DestinationExists) => {
                    tracing::warn!(
                        file = %name,
                        manifest_dir = %m.path.display(),
                        gate_dir = %g.path.display(),
                        "a different file of the same name is in the manifest directory; \
                         the gated one stays in the gate directory for the operator to decide"
                    );
                    report.kept_aside.push(name);
                }
                Err(e) => {
                    tracing::error!(file = %name, error = %format!("{e:#}"), "restoring failed; the manifest stays gated");
                    report.failed.push(Problem {
                        file_name: name,
                        reason: format!("{e:#}"),
                    });
                }
            }
        }
        Ok(report)
    }

    /// Settles the journal; see `RecoveryReport`.
    pub(crate) fn recover_report(&self) -> Result<RecoveryReport> {
        let _lock = self.lock()?;
        let contents = journal::read(&self.journal)?;
        let pending = journal::pending(&contents.records);
        let mut report = RecoveryReport::default();
        let m = self.open(Place::Manifests);
        let g = self.open(Place::Gate);
        if let (Ok(m), Ok(g)) = (&m, &g) {
            self.check_distinct(m, g)?;
        }
        let aside_file = self.set_aside_file();
        let mut unsettled: Vec<Intent> = Vec::new();
        let mut untouched: Vec<String> = Vec::new();
        let mut aside: Vec<(String, String)> = Vec::new();
        if let Some(first) = contents.unreadable.first() {
            tracing::error!(journal = %self.journal.display(), count = contents.unreadable.len(),
                first_line = %crate::text::clip(&crate::text::escape(&first.line)),
                reason = %crate::text::clip(&first.why), set_aside_in = %aside_file.display(),
                "unreadable static pod journal line(s) set aside; nothing done for them");
        }
        for u in &contents.unreadable {
            report.set_aside.push(Problem {
                file_name: "(unreadable journal line)".into(),
                reason: u.why.clone(),
            });
            aside.push((u.line.clone(), u.why.clone()));
        }
        for intent in pending {
            let handle = |p: Place| match p {
                Place::Manifests => m.as_ref(),
                Place::Gate => g.as_ref(),
            };
            let outcome = check_intent(&intent).and_then(|()| {
                match (handle(intent.from), handle(intent.to)) {
                    (Ok(src), Ok(dst)) => self.settle(&intent, src, dst),
                    (Err(e), _) | (_, Err(e)) => Err(anyhow::anyhow!("{e:#}")),
                }
            });
            match outcome {
                Ok(s) => {
                    tracing::info!(file = %intent.file, outcome = ?s, "settled an interrupted static pod manifest move");
                    report.settled.push((intent.file.clone(), s));
                }
                Err(e) if e.downcast_ref::<Unsettleable>().is_some() => {
                    let reason = format!("{e:#}");
                    tracing::error!(file = %intent.file, reason = %reason,
                        set_aside_in = %aside_file.display(),
                        "an interrupted static pod manifest move cannot be settled: its journal record is set aside; nothing deleted");
                    let line = serde_json::to_string(&Record::Intent(intent.clone()))
                        .context("encoding a journal record")?;
                    aside.push((line, reason.clone()));
                    untouched.push(intent.file.clone());
                    report.set_aside.push(Problem {
                        file_name: intent.file.clone(),
                        reason,
                    });
                }
                Err(e) => {
                    tracing::error!(file = %intent.file, error = %format!("{e:#}"), "cannot settle an interrupted move; kept in the journal");
                    report.unsettled.push(Problem {
                        file_name: intent.file.clone(),
                        reason: format!("{e:#}"),
                    });
                    untouched.push(intent.file.clone());
                    unsettled.push(intent);
                }
            }
        }
        for dir in [&m, &g].into_iter().flatten() {
            self.sweep_temporaries(dir, &m, &g, &untouched, &mut report)?;
        }
        if !aside.is_empty() {
            self.ops
                .journal_write(|| journal::set_aside(&aside_file, &aside))
                .context("keeping the records recovery cannot settle")?;
        }
        if contents.lines > 0 {
            self.ops
                .journal_write(|| journal::rewrite(&self.journal, &unsettled))?;
        }
        Ok(report)
    }

    /// Removes temporaries of ours whose content is complete elsewhere.
    fn sweep_temporaries(
        &self,
        dir: &DirHandle,
        m: &Result<DirHandle>,
        g: &Result<DirHandle>,
        untouched: &[String],
        report: &mut RecoveryReport,
    ) -> Result<()> {
        for name in dir.names()? {
            let Some(owner) = temp_owner(&name) else {
                continue;
            };
            if untouched.iter().any(|f| f == owner) {
                continue;
            }
            let Entry::Regular(tmp) = dir.entry(&name)? else {
                report.leftover_temporaries.push(dir.display(&name));
                continue;
            };
            let mut elsewhere = false;
            for d in [m, g].into_iter().flatten() {
                if let Entry::Regular(f) = d.entry(owner)? {
                    elsewhere |= f.sha256 == tmp.sha256;
                }
            }
            if elsewhere {
                self.ops
                    .unlink(dir, &name)
                    .with_context(|| format!("removing {}", dir.display(&name)))?;
                self.ops
                    .fsync_dir(dir)
                    .with_context(|| format!("syncing {}", dir.path.display()))?;
            } else {
                tracing::warn!(file = %dir.display(&name), "temporary copy with no complete copy elsewhere; left in place");
                report.leftover_temporaries.push(dir.display(&name));
            }
        }
        Ok(())
    }
}

impl StaticPodGate for FsGate {
    fn recover(&self) -> Result<()> {
        let r = self.recover_report()?;
        if r.unsettled.is_empty() {
            return Ok(());
        }
        let list: Vec<String> = r
            .unsettled
            .iter()
            .map(|p| format!("{}: {}", p.file_name, p.reason))
            .collect();
        bail!(
            "static pod journal {}: {} move(s) could not be settled (nothing deleted): {}",
            self.journal.display(),
            list.len(),
            list.join("; ")
        )
    }

    fn active(&self) -> Result<Vec<StaticManifest>> {
        Ok(self.scan(Place::Manifests)?.manifests)
    }

    fn gated(&self) -> Result<Vec<StaticManifest>> {
        Ok(self.scan(Place::Gate)?.manifests)
    }

    fn unreadable_active(&self) -> Result<Vec<Problem>> {
        Ok(self.scan(Place::Manifests)?.unparseable)
    }

    fn has_gated(&self) -> Result<bool> {
        let scan = self.scan(Place::Gate)?;
        Ok(!scan.manifests.is_empty() || !scan.unparseable.is_empty())
    }

    fn gate(&self, file_name: &str) -> Result<()> {
        let _lock = self.lock()?;
        check_name(file_name)?;
        let m = self.open(Place::Manifests)?;
        let g = self.open_gate_creating()?;
        self.check_distinct(&m, &g)?;
        if m.stat(file_name)?.is_none() {
            if let Entry::Regular(_) = g.entry(file_name)? {
                tracing::debug!(file = %file_name, "already gated");
                return Ok(());
            }
        }
        match self.move_file(Op::Gate, &m, &g, file_name)? {
            Moved::Yes => {
                tracing::info!(file = %file_name, "gated static pod manifest");
                Ok(())
            }
            Moved::DestinationExists => bail!(
                "cannot gate {}: {} already exists (an earlier restore kept it aside?); \
                 both left in place, decide by hand",
                m.display(file_name),
                g.display(file_name)
            ),
        }
    }

    fn restore_all(&self) -> Result<Vec<String>> {
        let r = self.restore_report()?;
        if r.failed.is_empty() {
            return Ok(r.kept_aside);
        }
        let list: Vec<String> = r
            .failed
            .iter()
            .map(|p| format!("{}: {}", p.file_name, p.reason))
            .collect();
        bail!(
            "{} gated manifest(s) could not be restored and stay in {} ({} restored, {} kept aside: {:?}): {}",
            list.len(),
            self.gate_dir.display(),
            r.restored.len(),
            r.kept_aside.len(),
            r.kept_aside,
            list.join("; ")
        )
    }
}
