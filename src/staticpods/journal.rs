//! The move journal: one JSON record per line, each appended and fsynced before the step it
//! announces. A line torn by a crash is skipped: its move had not started.

use std::collections::{HashMap, HashSet};
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

use super::fsio::Place;
use crate::fsutil::{read_regular, ReadError, Symlinks, STATE_FILE_LIMIT};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Op {
    Gate,
    Restore,
}

/// A move about to happen, with what is needed to find the file again after a crash.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Intent {
    pub id: u64,
    pub op: Op,
    pub file: String,
    pub from: Place,
    pub to: Place,
    pub size: u64,
    pub sha256: String,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Copy + rename + unlink (another filesystem) instead of one rename.
    pub copy: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "lowercase")]
pub(crate) enum Record {
    Intent(Intent),
    /// The move finished, or was settled after a failure.
    Done {
        id: u64,
    },
}

/// What the journal holds.
#[derive(Debug, Default)]
pub(crate) struct Contents {
    pub records: Vec<Record>,
    /// Lines that are whole but not a record this version writes (hand-edited or
    /// corrupted): kept for the operator, never acted on.
    pub unreadable: Vec<Unreadable>,
    /// Lines that are not blank, torn ones included.
    pub lines: usize,
}

#[derive(Debug, Clone)]
pub(crate) struct Unreadable {
    pub line: String,
    pub why: String,
}

/// Reads the journal. One with more bad lines than crashes leave is kept aside as it was
/// (a hard link) and stands as one unreadable line; its records are still acted on.
/// One that is not a regular file or is larger than any journal gets
/// (it is compacted at every recovery) is renamed out of the way and reported: the gate
/// then works without it, and settles nothing it cannot see (it never deletes the only
/// copy of a manifest, with or without a journal).
pub(crate) fn read(path: &Path) -> Result<Contents> {
    let text = match read_regular(path, STATE_FILE_LIMIT, Symlinks::Refuse) {
        Ok(b) => b,
        Err(ReadError::NotFound) => return Ok(Contents::default()),
        Err(e) if e.is_bad_file() => {
            let aside = crate::fsutil::set_aside(path)
                .with_context(|| format!("static pod journal {}: {e}", path.display()))?;
            tracing::error!(
                journal = %path.display(),
                set_aside_as = %aside.display(),
                error = %e,
                "ignoring an unusable static pod journal: renamed it out of the way"
            );
            return Ok(Contents::default());
        }
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let mut contents = Contents::default();
    let (mut torn, mut bad, mut long) = (0usize, 0usize, false);
    let mut sample = None;
    for line in text.split(|b| *b == b'\n') {
        if line.iter().all(|b| b.is_ascii_whitespace()) {
            continue;
        }
        contents.lines += 1;
        // Every record is an object: what is not one costs no parse (garbage can be
        // millions of short lines).
        let parsed = if line.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{') {
            serde_json::from_slice::<Record>(line).map_err(Some)
        } else {
            Err(None)
        };
        if parsed.is_err() {
            long |= line.len() > LINE_MAX;
            sample.get_or_insert_with(|| sample_of(line));
        }
        match parsed {
            Ok(r) => contents.records.push(r),
            // Cut short by a crash while it was written: an intent is synced before its
            // move starts, so that move never started.
            Err(Some(e)) if e.is_eof() => torn += 1,
            Err(e) => {
                bad += 1;
                if contents.unreadable.len() < BAD_LINES_KEPT && line.len() <= LINE_MAX {
                    contents.unreadable.push(Unreadable {
                        line: String::from_utf8_lossy(line).into_owned(),
                        why: match e {
                            Some(e) => format!("not a journal record: {e}"),
                            None => "not a journal record: not a JSON object".into(),
                        },
                    });
                }
            }
        }
    }
    if torn + bad > BAD_LINES_KEPT || long {
        let kept = crate::fsutil::keep_aside(path).with_context(|| {
            format!("keeping the damaged static pod journal {}", path.display())
        })?;
        let why = format!(
            "damaged journal: {bad} unreadable and {torn} torn line(s) of {}, {} record(s) read; kept as it was in {}",
            contents.lines,
            contents.records.len(),
            kept.display()
        );
        contents.unreadable = vec![Unreadable {
            line: sample.unwrap_or_default(),
            why,
        }];
    } else if torn > 0 {
        tracing::warn!(journal = %path.display(), torn,
            "skipping torn journal lines (their moves never started)");
    }
    Ok(contents)
}

/// A few lines a crash can leave; more, or one longer than any record, is damage.
const BAD_LINES_KEPT: usize = 16;
const LINE_MAX: usize = 4096;

/// The start of a bad line, printable, for a log line.
fn sample_of(line: &[u8]) -> String {
    let start = &line[..line.len().min(120)];
    let text = crate::text::escape(&String::from_utf8_lossy(start)).into_owned();
    if start.len() < line.len() {
        format!("{text}... ({} bytes)", line.len())
    } else {
        text
    }
}

/// Name of the file, beside the journal, that keeps what recovery set aside.
pub(crate) fn set_aside_path(journal: &Path) -> std::path::PathBuf {
    let mut name = journal.as_os_str().to_owned();
    name.push(".set-aside");
    name.into()
}

/// Appends `(journal line, why)` pairs to the set-aside file and syncs it, so that a record
/// leaves the journal only once the operator can read it there.
pub(crate) fn set_aside(path: &Path, entries: &[(String, String)]) -> Result<()> {
    use std::os::fd::AsFd;
    let existed = path.exists();
    let at = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut out = Vec::new();
    for (line, reason) in entries {
        let record = serde_json::from_str::<serde_json::Value>(line)
            .unwrap_or_else(|_| serde_json::Value::String(line.clone()));
        serde_json::to_writer(
            &mut out,
            &serde_json::json!({"set_aside_at": at, "reason": reason, "record": record}),
        )
        .context("encoding a set-aside record")?;
        out.push(b'\n');
    }
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK | nix::libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    let st =
        nix::sys::stat::fstat(f.as_fd()).with_context(|| format!("stat {}", path.display()))?;
    if crate::fsutil::kind_of(&st) != "regular file" {
        anyhow::bail!(
            "{} is a {}, not a regular file",
            path.display(),
            crate::fsutil::kind_of(&st)
        );
    }
    f.write_all(&out)
        .with_context(|| format!("writing {}", path.display()))?;
    sync(&f, path, existed)
}

/// Makes `f` at `path` durable, and its directory entry too when the file is new.
fn sync(f: &std::fs::File, path: &Path, existed: bool) -> Result<()> {
    f.sync_all()
        .with_context(|| format!("syncing {}", path.display()))?;
    if !existed {
        if let Some(dir) = path.parent() {
            crate::fsutil::fsync_dir(dir)?;
        }
    }
    Ok(())
}

/// Appends one record. An intent is made durable before returning; a `Done` is not
/// synced (recovery decides from the files, so a lost `Done` only costs a re-check).
/// The leading newline keeps a record whole even after a torn line.
pub(crate) fn append(path: &Path, record: &Record) -> Result<()> {
    let existed = path.exists();
    let mut line = b"\n".to_vec();
    serde_json::to_writer(&mut line, record).context("encoding a journal record")?;
    line.push(b'\n');
    let mut f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_CLOEXEC)
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    f.write_all(&line)
        .with_context(|| format!("writing {}", path.display()))?;
    if matches!(record, Record::Done { .. }) {
        return Ok(());
    }
    sync(&f, path, existed)
}

/// Replaces the journal with just `keep` (intents still unsettled).
pub(crate) fn rewrite(path: &Path, keep: &[Intent]) -> Result<()> {
    let mut out = Vec::new();
    for i in keep {
        serde_json::to_writer(&mut out, &Record::Intent(i.clone()))
            .context("encoding a journal record")?;
        out.push(b'\n');
    }
    crate::fsutil::write_atomic(path, &out, 0o600)
}

/// The intents that still need settling: for each file, its latest intent when that has
/// no `Done`. An older intent for the same file is moot: the later move started from the
/// state the older one left.
pub(crate) fn pending(records: &[Record]) -> Vec<Intent> {
    let done: HashSet<u64> = records
        .iter()
        .filter_map(|r| match r {
            Record::Done { id } => Some(*id),
            Record::Intent(_) => None,
        })
        .collect();
    let mut latest: HashMap<&str, &Intent> = HashMap::new();
    let mut order = Vec::new();
    for r in records {
        if let Record::Intent(i) = r {
            if latest.insert(i.file.as_str(), i).is_none() {
                order.push(i.file.as_str());
            }
        }
    }
    order
        .into_iter()
        .filter_map(|f| latest.get(f).copied())
        .filter(|i| !done.contains(&i.id))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn intent(id: u64, file: &str) -> Intent {
        Intent {
            id,
            op: Op::Gate,
            file: file.into(),
            from: Place::Manifests,
            to: Place::Gate,
            size: 1,
            sha256: "x".into(),
            mode: 0o600,
            uid: 0,
            gid: 0,
            copy: false,
        }
    }

    #[test]
    fn torn_lines_are_skipped_and_later_records_survive() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j");
        append(&p, &Record::Intent(intent(1, "a"))).unwrap();
        // A crash in the middle of a write leaves half a line without a newline.
        let mut f = OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"record\":\"intent\",\"id\":2,\"op")
            .unwrap();
        append(&p, &Record::Done { id: 1 }).unwrap();
        append(&p, &Record::Intent(intent(3, "b"))).unwrap();
        let r = read(&p).unwrap().records;
        assert_eq!(r.len(), 3);
        assert_eq!(pending(&r), vec![intent(3, "b")]);
    }

    #[test]
    fn an_unusable_journal_is_set_aside_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("j");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        assert!(read(&p).unwrap().records.is_empty());
        assert!(!p.exists());
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().any(|n| n.starts_with("j.corrupt-")),
            "{names:?}"
        );
    }

    #[test]
    fn only_the_latest_intent_per_file_counts() {
        let r = vec![
            Record::Intent(intent(1, "a")),
            Record::Intent(intent(2, "a")),
            Record::Done { id: 2 },
            Record::Intent(intent(3, "b")),
        ];
        assert_eq!(pending(&r), vec![intent(3, "b")]);
    }
}
