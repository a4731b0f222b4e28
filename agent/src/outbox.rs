//! The durable outbox of status updates: every update an executor reports (or the
//! agent decides, e.g. executor lost) is written here and fsync'd before the agent
//! relays it, and is dropped only once the master acknowledged it. Updates that
//! arrive together are written as one batch, so one fsync covers many of them.
//!
//! Layout in `<data_dir>/outbox/`: `<segment:020>.log`, append-only segments of
//! batches, one JSON array of `wire::StatusUpdate` per line, each line fdatasync'd
//! before `put` returns; `acked.json` (task id -> highest acknowledged seq); older
//! agents' `<batch:020>.json` files (one JSON array each), still read on open; and
//! `*.tmp` leftovers of interrupted writes (removed on open).
//!
//! Bounded whatever a task does (issue 27): a status that only repeats its task's
//! state (a process list changed) supersedes the pending one of the same task and
//! state unless that one carries an exit reason the new one does not, which is dropped (the master needs the transitions and the latest list,
//! not every list in between), so a task holds at most one pending update per state.
//! Past [`MAX_PENDING_BYTES`] of pending updates a new update is kept without its
//! process list (the master keeps the last list it got), so the outbox stops growing
//! with lists while every state change still reaches the master.
//!
//! Why segments instead of a file per batch: a file per batch cost an inode created
//! (temp file + rename + directory fsync) and one freed (on acknowledgement) per
//! batch. On a journal-less ext4 every inode freed in the last ~30 s is skipped, one
//! inode-table lookup each, by every later inode allocation in its group, so this
//! churn slowed every file the host created. Appending to one open segment costs a
//! write and an fdatasync; the segment is truncated when all it holds is
//! acknowledged, rolled over once it reaches `SEGMENT_MAX`, and removed when a
//! rolled-over segment is fully acknowledged.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use drover_common::wire::StatusUpdate;

/// Size after which the next batch starts a new segment.
const SEGMENT_MAX: u64 = 1 << 20;

/// Pending bytes (updates as JSON) past which new updates lose their process list.
pub const MAX_PENDING_BYTES: u64 = 32 << 20;

/// Why the outbox could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("outbox {op} {path}: {source}; check the agent's data_dir is writable")]
    Io {
        op: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A pending update.
#[derive(Debug)]
struct Pending {
    update: StatusUpdate,
    segment: u64,
    bytes: u64,
}

/// The size of an update as JSON (what it costs in a segment and in a POST).
fn json_len(u: &StatusUpdate) -> u64 {
    serde_json::to_vec(u).map_or(0, |v| v.len() as u64)
}

/// The segment batches are appended to.
#[derive(Debug)]
struct Active {
    segment: u64,
    path: PathBuf,
    file: fs::File,
    len: u64,
}

/// The outbox: pending updates in memory, mirrored on disk.
#[derive(Debug)]
pub struct Outbox {
    dir: PathBuf,
    next_segment: u64,
    /// (task id, seq) -> the update, the segment it lives in, its size as JSON.
    pending: BTreeMap<(String, u64), Pending>,
    /// The sum of the pending updates' sizes.
    bytes: u64,
    /// [`MAX_PENDING_BYTES`] (smaller in tests).
    max_bytes: u64,
    /// Segment -> the (task, seq) entries in it not yet acknowledged.
    segments: BTreeMap<u64, BTreeSet<(String, u64)>>,
    /// Segments (and old-style batch files) on disk -> their path.
    files: BTreeMap<u64, PathBuf>,
    /// The open segment new batches go to; none until the first `put` after open,
    /// and again after a failed write (a torn line is never appended to).
    active: Option<Active>,
    /// Highest acknowledged seq per task.
    acked: BTreeMap<String, u64>,
    /// `acked` changed since `acked.json` was last written.
    acked_dirty: bool,
}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> OutboxError {
    let path = path.to_path_buf();
    move |source| OutboxError::Io { op, path, source }
}

/// Writes `bytes` to `path` through a temporary file, optionally fsync'd.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8], sync: bool) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        if sync {
            f.sync_all()?;
        }
    }
    fs::rename(&tmp, path)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

/// The batches a segment or old-style batch file holds (pure). A segment holds one
/// JSON array per line; an old batch file one array. A line that does not parse is
/// skipped: the last one may be torn by a crash during its write (it was never
/// fsync'd, so never relayed, and its executor still has it); any other is damage
/// from outside, reported in the returned count.
fn parse_batches(bytes: &[u8]) -> (Vec<StatusUpdate>, usize) {
    let mut updates = Vec::new();
    let mut bad = 0;
    let lines: Vec<&[u8]> = bytes.split(|b| *b == b'\n').collect();
    let last = lines.len().saturating_sub(1);
    for (i, line) in lines.iter().enumerate() {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Vec<StatusUpdate>>(line) {
            Ok(batch) => updates.extend(batch),
            // The last line has no newline yet: a write the crash cut short.
            Err(_) if i == last => {}
            Err(_) => bad += 1,
        }
    }
    (updates, bad)
}

impl Outbox {
    /// Opens (creating if needed) the outbox in `<data_dir>/outbox` and loads what is
    /// pending. Updates at or below an acknowledged seq are dropped.
    pub fn open(data_dir: &Path) -> Result<Outbox, OutboxError> {
        let dir = data_dir.join("outbox");
        fs::create_dir_all(&dir).map_err(io("create", &dir))?;
        let acked_path = dir.join("acked.json");
        let acked: BTreeMap<String, u64> = match fs::read(&acked_path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                tracing::warn!(path = %acked_path.display(), error = %e, "ignoring unreadable ack record; updates may be resent (the master ignores duplicates)");
                BTreeMap::new()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(io("read", &acked_path)(e)),
        };
        let mut outbox = Outbox {
            dir: dir.clone(),
            next_segment: 1,
            pending: BTreeMap::new(),
            bytes: 0,
            max_bytes: MAX_PENDING_BYTES,
            segments: BTreeMap::new(),
            files: BTreeMap::new(),
            active: None,
            acked,
            acked_dirty: false,
        };
        let mut found: Vec<(u64, PathBuf)> = Vec::new();
        let entries = fs::read_dir(&dir).map_err(io("list", &dir))?;
        for entry in entries {
            let entry = entry.map_err(io("list", &dir))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(segment) = name
                .strip_suffix(".log")
                .or_else(|| name.strip_suffix(".json"))
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            found.push((segment, path));
        }
        // In write order, so that an update written twice (a retried write) counts
        // once, in the segment written first.
        found.sort();
        let mut damaged = BTreeSet::new();
        for (segment, path) in found {
            outbox.next_segment = outbox.next_segment.max(segment + 1);
            let bytes = fs::read(&path).map_err(io("read", &path))?;
            let (updates, bad) = parse_batches(&bytes);
            if bad > 0 {
                tracing::error!(path = %path.display(), bad, "unreadable lines in an outbox segment skipped; their updates may be lost");
            }
            outbox.segments.insert(segment, BTreeSet::new());
            outbox.files.insert(segment, path);
            for u in updates {
                if u.seq <= outbox.acked.get(&u.task_id).copied().unwrap_or(0)
                    || outbox.pending.contains_key(&(u.task_id.clone(), u.seq))
                {
                    continue;
                }
                let bytes = json_len(&u);
                outbox.insert(u, segment, bytes);
            }
            if bad > 0 {
                // Kept (with its damage) until what it holds is acknowledged.
                damaged.insert(segment);
            }
        }
        // Segments with nothing left: all acknowledged, or superseded by later
        // updates.
        let emptied: Vec<u64> = outbox
            .segments
            .iter()
            .filter(|(s, live)| live.is_empty() && !damaged.contains(*s))
            .map(|(s, _)| *s)
            .collect();
        for segment in emptied {
            outbox.remove_segment(segment)?;
        }
        Ok(outbox)
    }

    /// The highest seq known for a task: pending or acknowledged; 0 if none.
    pub fn last_seq(&self, task_id: &str) -> u64 {
        let acked = self.acked.get(task_id).copied().unwrap_or(0);
        let pending = self
            .pending
            .range((task_id.to_string(), 0)..=(task_id.to_string(), u64::MAX))
            .next_back()
            .map(|((_, seq), _)| *seq)
            .unwrap_or(0);
        acked.max(pending)
    }

    /// Durably adds updates (one line appended to the open segment and
    /// fdatasync'd). Updates at or below the task's last seq are skipped, so replays
    /// are harmless. Returns how many were added.
    pub fn put(&mut self, updates: Vec<StatusUpdate>) -> Result<usize, OutboxError> {
        let mut fresh: Vec<StatusUpdate> = Vec::with_capacity(updates.len());
        for u in updates {
            let last = self.last_seq(&u.task_id).max(
                fresh
                    .iter()
                    .filter(|f| f.task_id == u.task_id)
                    .map(|f| f.seq)
                    .max()
                    .unwrap_or(0),
            );
            if u.seq > last {
                fresh.push(u);
            }
        }
        if fresh.is_empty() {
            return Ok(0);
        }
        let mut total = self.bytes;
        let mut sizes = Vec::with_capacity(fresh.len());
        for u in &mut fresh {
            let mut size = json_len(u);
            if total + size > self.max_bytes && !u.processes.is_empty() {
                u.processes = Vec::new();
                u.processes_omitted = None;
                size = json_len(u);
                crate::metrics::METRICS.status_lists_dropped.inc();
                tracing::warn!(task_id = %u.task_id, seq = u.seq, pending_bytes = total, "outbox over its bound: the status is kept without its process list");
            }
            total += size;
            sizes.push(size);
        }
        let segment = self.append(&fresh)?;
        let n = fresh.len();
        let mut emptied = Vec::new();
        for (u, bytes) in fresh.into_iter().zip(sizes) {
            emptied.extend(self.insert(u, segment, bytes));
        }
        self.release(emptied)?;
        Ok(n)
    }

    /// Adds a pending update of `bytes` as JSON that lives in `segment`. The task's latest pending
    /// update, when it has the same state, is not terminal and carries no exit reason
    /// (or the same one), is superseded: it is dropped, and its segment returned if nothing else in it is pending.
    fn insert(&mut self, u: StatusUpdate, segment: u64, bytes: u64) -> Option<u64> {
        let mut emptied = None;
        let latest = self
            .pending
            .range((u.task_id.clone(), 0)..(u.task_id.clone(), u.seq))
            .next_back()
            .filter(|(_, p)| p.update.state == u.state && !u.state.is_terminal())
            // One carrying an exit reason (a RUNNING task its executor stops for a
            // failed health check: the master withdraws it on that) is not a repeat.
            .filter(|(_, p)| {
                p.update.exit_reason.is_none() || p.update.exit_reason == u.exit_reason
            })
            .map(|(k, _)| k.clone());
        if let Some(key) = latest {
            if let Some(old) = self.pending.remove(&key) {
                self.bytes = self.bytes.saturating_sub(old.bytes);
                crate::metrics::METRICS.status_superseded.inc();
                if let Some(live) = self.segments.get_mut(&old.segment) {
                    live.remove(&key);
                    if live.is_empty() && old.segment != segment {
                        emptied = Some(old.segment);
                    }
                }
            }
        }
        let key = (u.task_id.clone(), u.seq);
        self.bytes += bytes;
        self.segments
            .entry(segment)
            .or_default()
            .insert(key.clone());
        self.pending.insert(
            key,
            Pending {
                update: u,
                segment,
                bytes,
            },
        );
        emptied
    }

    /// Appends one batch line to the open segment (opening a new one first when
    /// there is none or it is full) and fdatasyncs it; returns the segment.
    fn append(&mut self, batch: &[StatusUpdate]) -> Result<u64, OutboxError> {
        let mut line = serde_json::to_vec(batch).map_err(|e| {
            io("encode", &self.dir)(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })?;
        line.push(b'\n');
        if self.active.as_ref().is_some_and(|a| a.len >= SEGMENT_MAX) {
            self.active = None;
        }
        let mut created = false;
        if self.active.is_none() {
            let segment = self.next_segment;
            self.next_segment += 1;
            let path = self.dir.join(format!("{segment:020}.log"));
            let file = fs::OpenOptions::new()
                .create_new(true)
                .append(true)
                .open(&path)
                .map_err(io("create", &path))?;
            self.files.insert(segment, path.clone());
            self.segments.entry(segment).or_default();
            self.active = Some(Active {
                segment,
                path,
                file,
                len: 0,
            });
            created = true;
        }
        let Some(active) = self.active.as_mut() else {
            unreachable!("an active segment was just opened")
        };
        let written = active
            .file
            .write_all(&line)
            .and_then(|()| active.file.sync_data());
        if let Err(e) = written {
            // Never append after a possibly torn line: the next batch opens a new
            // segment; this one is read (torn line skipped) and removed as usual.
            let (path, segment) = (active.path.clone(), active.segment);
            self.active = None;
            if self.segments.get(&segment).is_some_and(BTreeSet::is_empty) {
                let _ = self.remove_segment(segment);
            }
            return Err(io("write", &path)(e));
        }
        active.len += line.len() as u64;
        let segment = active.segment;
        if created {
            // The new segment's directory entry must be durable too.
            sync_dir(&self.dir).map_err(io("sync", &self.dir))?;
        }
        Ok(segment)
    }
    /// Up to `max` pending updates of at most `max_bytes` as JSON together (at least
    /// one), each task's in seq order.
    pub fn pending(&self, max: usize, max_bytes: u64) -> Vec<StatusUpdate> {
        let mut total = 0;
        let mut out = Vec::new();
        for p in self.pending.values().take(max) {
            total += p.bytes;
            if total > max_bytes && !out.is_empty() {
                break;
            }
            out.push(p.update.clone());
        }
        out
    }

    /// The pending updates' size as JSON, in bytes.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// How many updates wait for an acknowledgement.
    pub fn len(&self) -> usize {
        self.pending.len()
    }

    /// The wall-clock stamp of the oldest pending update, if any (a scan: for
    /// scrapes, not hot paths).
    pub fn oldest_timestamp_ms(&self) -> Option<u64> {
        self.pending.values().map(|p| p.update.timestamp_ms).min()
    }

    /// True when nothing waits for an acknowledgement.
    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// True when some update of this task waits for an acknowledgement.
    pub fn has_pending_for(&self, task_id: &str) -> bool {
        self.pending
            .range((task_id.to_string(), 0)..=(task_id.to_string(), u64::MAX))
            .next()
            .is_some()
    }

    /// True when this exact update still waits for an acknowledgement.
    pub fn is_pending(&self, task_id: &str, seq: u64) -> bool {
        self.pending.contains_key(&(task_id.to_string(), seq))
    }

    /// Applies the master's acknowledgement: everything up to each (task, seq) is
    /// dropped; batch files with nothing left are deleted. The ack record is
    /// written by the next `flush_acked` (or when the outbox is dropped).
    pub fn ack(&mut self, acked: &[(String, u64)]) -> Result<(), OutboxError> {
        if acked.is_empty() {
            return Ok(());
        }
        for (task_id, seq) in acked {
            let entry = self.acked.entry(task_id.clone()).or_insert(0);
            *entry = (*entry).max(*seq);
        }
        // Recorded on disk by `flush_acked` (the agent calls it every 2 s), not here:
        // the record holds every task the host still has a sandbox of, so writing
        // it per acknowledgement cost O(tasks) per round trip. Losing its latest
        // changes only means resending updates the master ignores.
        self.acked_dirty = true;
        let mut emptied = Vec::new();
        for (task_id, seq) in acked {
            let keys: Vec<(String, u64)> = self
                .pending
                .range((task_id.clone(), 0)..=(task_id.clone(), *seq))
                .map(|(k, _)| k.clone())
                .collect();
            for key in keys {
                if let Some(p) = self.pending.remove(&key) {
                    self.bytes = self.bytes.saturating_sub(p.bytes);
                    if let Some(live) = self.segments.get_mut(&p.segment) {
                        live.remove(&key);
                        if live.is_empty() {
                            emptied.push(p.segment);
                        }
                    }
                }
            }
        }
        self.release(emptied)
    }

    /// Frees segments that hold nothing pending any more: the open one is emptied
    /// in place, the others removed.
    fn release(&mut self, emptied: Vec<u64>) -> Result<(), OutboxError> {
        for segment in emptied {
            if let Some(active) = self.active.as_mut().filter(|a| a.segment == segment) {
                // Kept open for the next batch, emptied in place: no inode churn.
                // Not fsync'd: a crash may bring acknowledged lines back, which
                // are only resent (the master ignores duplicates).
                if active.len > 0 {
                    match active.file.set_len(0) {
                        Ok(()) => active.len = 0,
                        Err(e) => {
                            tracing::warn!(path = %active.path.display(), error = %e, "could not empty the outbox segment; starting a new one");
                            self.active = None;
                        }
                    }
                }
                continue;
            }
            self.remove_segment(segment)?;
        }
        Ok(())
    }

    /// Forgets a segment and removes its file (already gone is fine).
    fn remove_segment(&mut self, segment: u64) -> Result<(), OutboxError> {
        self.segments.remove(&segment);
        if let Some(path) = self.files.remove(&segment) {
            match fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io("remove", &path)(e)),
            }
        }
        Ok(())
    }

    /// Writes the ack record (`acked.json`, not fsync'd) if it changed.
    pub fn flush_acked(&mut self) -> Result<(), OutboxError> {
        if !self.acked_dirty {
            return Ok(());
        }
        let record = self.dir.join("acked.json");
        let bytes = serde_json::to_vec(&self.acked).map_err(|e| {
            io("encode", &record)(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })?;
        // Not fsync'd: losing it only means resending updates the master ignores.
        write_atomic(&record, &bytes, false).map_err(io("write", &record))?;
        self.acked_dirty = false;
        Ok(())
    }

    /// Closes and removes the open segment when nothing in it waits for an
    /// acknowledgement, so that a drained outbox holds no segment (the agent calls
    /// this every 2 s: at most one segment created and removed per call, instead of
    /// a file per batch). Returns whether one was removed.
    pub fn close_idle_segment(&mut self) -> Result<bool, OutboxError> {
        let Some(segment) = self.active.as_ref().map(|a| a.segment) else {
            return Ok(false);
        };
        if self
            .segments
            .get(&segment)
            .is_some_and(|live| !live.is_empty())
        {
            return Ok(false);
        }
        self.active = None;
        self.remove_segment(segment)?;
        Ok(true)
    }

    /// Drops the ack record of a task whose sandbox was garbage collected.
    pub fn forget(&mut self, task_id: &str) {
        if self.acked.remove(task_id).is_some() {
            self.acked_dirty = true;
        }
    }

    /// Drops the ack records of tasks for which `keep` is false and nothing is
    /// pending (e.g. sandboxes removed while the agent was down), so the record does
    /// not grow forever. Returns how many were dropped.
    pub fn prune_acked(&mut self, keep: impl Fn(&str) -> bool) -> usize {
        let drop: Vec<String> = self
            .acked
            .keys()
            .filter(|id| !keep(id) && !self.has_pending_for(id))
            .cloned()
            .collect();
        for id in &drop {
            self.acked.remove(id);
        }
        self.acked_dirty |= !drop.is_empty();
        drop.len()
    }
}

impl Drop for Outbox {
    fn drop(&mut self) {
        if let Err(e) = self.flush_acked() {
            tracing::warn!(error = %e, "could not record acknowledgements; updates may be resent");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::state::TaskState;

    /// An update whose state differs from its task's previous seq's, so that no
    /// update in a run of them supersedes another.
    fn update(task: &str, seq: u64) -> StatusUpdate {
        let state = if seq.is_multiple_of(2) {
            TaskState::Running
        } else {
            TaskState::Starting
        };
        StatusUpdate {
            task_id: task.into(),
            seq,
            state,
            exit_reason: None,
            message: format!("{task} {seq}"),
            timestamp_ms: 1,
            processes: vec![],
            processes_omitted: None,
        }
    }

    #[test]
    fn updates_survive_a_crash_and_reload_in_seq_order() {
        let dir = tempfile::tempdir().unwrap();
        {
            let mut ob = Outbox::open(dir.path()).unwrap();
            ob.put(vec![update("a", 2), update("b", 1)]).unwrap();
            ob.put(vec![update("a", 3)]).unwrap();
            // Dropped without any shutdown: a crash.
        }
        let ob = Outbox::open(dir.path()).unwrap();
        let seqs: Vec<(String, u64)> = ob
            .pending(100, u64::MAX)
            .into_iter()
            .map(|u| (u.task_id, u.seq))
            .collect();
        assert_eq!(
            seqs,
            vec![("a".into(), 2), ("a".into(), 3), ("b".into(), 1)]
        );
        assert_eq!(ob.last_seq("a"), 3);
    }

    #[test]
    fn replayed_and_duplicate_updates_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        assert_eq!(ob.put(vec![update("a", 1), update("a", 2)]).unwrap(), 2);
        assert_eq!(ob.put(vec![update("a", 1), update("a", 2)]).unwrap(), 0);
        ob.ack(&[("a".into(), 2)]).unwrap();
        assert_eq!(ob.put(vec![update("a", 2)]).unwrap(), 0);
        assert_eq!(ob.put(vec![update("a", 3), update("a", 3)]).unwrap(), 1);
    }

    #[test]
    fn ack_deletes_updates_and_files_and_survives_reload() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        ob.put(vec![update("a", 1), update("b", 1)]).unwrap();
        ob.put(vec![update("a", 2)]).unwrap();
        ob.ack(&[("a".into(), 2)]).unwrap();
        assert_eq!(ob.len(), 1);
        assert!(!ob.has_pending_for("a"));
        assert!(ob.has_pending_for("b"));
        // Both batches went to one segment, which still holds b's update.
        let batch_files = |d: &Path| {
            fs::read_dir(d.join("outbox"))
                .unwrap()
                .filter(|e| {
                    let n = e.as_ref().unwrap().file_name();
                    n.to_string_lossy().chars().next().unwrap().is_ascii_digit()
                })
                .count()
        };
        assert_eq!(batch_files(dir.path()), 1);
        drop(ob);
        let mut ob = Outbox::open(dir.path()).unwrap();
        assert_eq!(ob.pending(10, u64::MAX), vec![update("b", 1)]);
        assert_eq!(ob.last_seq("a"), 2, "the ack record keeps the seq");
        ob.ack(&[("b".into(), 1)]).unwrap();
        assert_eq!(batch_files(dir.path()), 0);
        assert!(Outbox::open(dir.path()).unwrap().is_empty());
    }

    #[test]
    fn interrupted_writes_are_discarded_on_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        ob.put(vec![update("a", 1)]).unwrap();
        drop(ob);
        fs::write(
            dir.path().join("outbox/00000000000000000009.tmp"),
            b"[{\"trunc",
        )
        .unwrap();
        let ob = Outbox::open(dir.path()).unwrap();
        assert_eq!(ob.len(), 1);
        assert!(!dir.path().join("outbox/00000000000000000009.tmp").exists());
    }

    #[test]
    fn ack_records_of_vanished_tasks_are_pruned_unless_pending() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        ob.put(vec![
            update("gone", 1),
            update("kept", 1),
            update("busy", 1),
        ])
        .unwrap();
        ob.ack(&[("gone".into(), 1), ("kept".into(), 1), ("busy".into(), 1)])
            .unwrap();
        ob.put(vec![update("busy", 2)]).unwrap();
        assert_eq!(ob.prune_acked(|id| id == "kept"), 1);
        assert_eq!(ob.last_seq("gone"), 0);
        assert_eq!(ob.last_seq("kept"), 1);
        assert_eq!(ob.last_seq("busy"), 2);
    }

    fn segment_sizes(dir: &Path) -> Vec<u64> {
        let mut sizes: Vec<(String, u64)> = fs::read_dir(dir.join("outbox"))
            .unwrap()
            .map(|e| e.unwrap())
            .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                (name, e.metadata().unwrap().len())
            })
            .collect();
        sizes.sort();
        sizes.into_iter().map(|(_, len)| len).collect()
    }

    #[test]
    fn batches_share_one_segment_that_is_emptied_in_place_once_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        for seq in 1..=5 {
            ob.put(vec![update("a", seq)]).unwrap();
        }
        let sizes = segment_sizes(dir.path());
        assert_eq!(sizes.len(), 1, "one segment for every batch");
        assert!(sizes[0] > 0);
        ob.ack(&[("a".into(), 5)]).unwrap();
        assert_eq!(segment_sizes(dir.path()), vec![0], "kept, emptied");
        ob.put(vec![update("a", 6)]).unwrap();
        assert_eq!(segment_sizes(dir.path()).len(), 1);
        assert!(!ob.close_idle_segment().unwrap(), "a6 still waits");
        drop(ob);
        let mut ob = Outbox::open(dir.path()).unwrap();
        assert_eq!(ob.pending(10, u64::MAX), vec![update("a", 6)]);
        ob.put(vec![update("a", 7)]).unwrap();
        ob.ack(&[("a".into(), 7)]).unwrap();
        assert_eq!(segment_sizes(dir.path()).len(), 1, "a6's segment is gone");
        assert!(ob.close_idle_segment().unwrap());
        assert!(segment_sizes(dir.path()).is_empty(), "a drained outbox");
        ob.put(vec![update("a", 8)]).unwrap();
        assert_eq!(ob.pending(10, u64::MAX), vec![update("a", 8)]);
    }

    #[test]
    fn a_full_segment_rolls_over_and_is_removed_once_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        let mut big = update("a", 1);
        big.message = "x".repeat(SEGMENT_MAX as usize);
        ob.put(vec![big.clone()]).unwrap();
        ob.put(vec![update("b", 1)]).unwrap();
        assert_eq!(segment_sizes(dir.path()).len(), 2);
        ob.ack(&[("a".into(), 1)]).unwrap();
        assert_eq!(
            segment_sizes(dir.path()).len(),
            1,
            "the full one is removed"
        );
        drop(ob);
        let ob = Outbox::open(dir.path()).unwrap();
        assert_eq!(ob.pending(10, u64::MAX), vec![update("b", 1)]);
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_never_appended_to() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        ob.put(vec![update("a", 1)]).unwrap();
        drop(ob);
        let segment = dir.path().join("outbox/00000000000000000001.log");
        let mut f = fs::OpenOptions::new().append(true).open(&segment).unwrap();
        f.write_all(b"[{\"task_id\":\"a\",\"se").unwrap();
        drop(f);
        let mut ob = Outbox::open(dir.path()).unwrap();
        assert_eq!(ob.pending(10, u64::MAX), vec![update("a", 1)]);
        ob.put(vec![update("a", 2)]).unwrap();
        assert_eq!(segment_sizes(dir.path()).len(), 2, "a new segment");
        drop(ob);
        let ob = Outbox::open(dir.path()).unwrap();
        assert_eq!(
            ob.pending(10, u64::MAX),
            vec![update("a", 1), update("a", 2)]
        );
    }

    #[test]
    fn batch_files_of_an_older_agent_are_still_relayed() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("outbox")).unwrap();
        let old = dir.path().join("outbox/00000000000000000007.json");
        fs::write(&old, serde_json::to_vec(&vec![update("a", 1)]).unwrap()).unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        assert_eq!(ob.pending(10, u64::MAX), vec![update("a", 1)]);
        ob.put(vec![update("a", 2)]).unwrap();
        assert!(dir.path().join("outbox/00000000000000000008.log").exists());
        ob.ack(&[("a".into(), 1)]).unwrap();
        assert!(!old.exists());
    }

    #[test]
    fn pending_is_bounded_by_max() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        ob.put((1..=10).map(|s| update("a", s)).collect()).unwrap();
        assert_eq!(ob.pending(4, u64::MAX).len(), 4);
        assert_eq!(ob.pending(4, u64::MAX)[3].seq, 4);
    }

    fn with_processes(task: &str, seq: u64, state: TaskState, n: usize) -> StatusUpdate {
        let mut u = update(task, seq);
        u.state = state;
        u.processes = (0..n)
            .map(|i| drover_common::wire::ProcessStatus {
                name: format!("worker-{i}"),
                state: drover_common::wire::ProcessState::Running,
                pid: Some(1000 + i as u32),
                runs: 1,
                failures: 0,
                last_exit: None,
            })
            .collect();
        u
    }

    #[test]
    fn a_later_status_of_the_same_state_supersedes_the_pending_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        let starting = with_processes("a", 1, TaskState::Starting, 3);
        ob.put(vec![starting.clone()]).unwrap();
        for seq in 2..=500 {
            ob.put(vec![with_processes("a", seq, TaskState::Running, 3)])
                .unwrap();
        }
        let killed = with_processes("a", 501, TaskState::Killed, 3);
        ob.put(vec![killed.clone()]).unwrap();
        // The transitions stay, the lists between them do not.
        let kept: Vec<(u64, TaskState)> = ob
            .pending(100, u64::MAX)
            .iter()
            .map(|u| (u.seq, u.state))
            .collect();
        assert_eq!(
            kept,
            vec![
                (1, TaskState::Starting),
                (500, TaskState::Running),
                (501, TaskState::Killed)
            ]
        );
        let sizes: u64 = ob.pending(100, u64::MAX).iter().map(json_len).sum();
        assert_eq!(ob.bytes(), sizes);
        // The same after a restart.
        drop(ob);
        let mut ob = Outbox::open(dir.path()).unwrap();
        assert_eq!(ob.len(), 3);
        assert_eq!(ob.bytes(), sizes);
        ob.ack(&[("a".into(), 501)]).unwrap();
        assert_eq!((ob.len(), ob.bytes()), (0, 0));
        // A terminal status is never superseded, nor one after it.
        ob.put(vec![with_processes("b", 1, TaskState::Killed, 1)])
            .unwrap();
        ob.put(vec![with_processes("b", 2, TaskState::Killed, 1)])
            .unwrap();
        assert_eq!(ob.len(), 2);
    }

    #[test]
    fn a_status_carrying_an_exit_reason_is_not_superseded_by_a_plain_one() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        // RUNNING, health failed (the master withdraws on it), then a process list.
        let mut failing = with_processes("a", 1, TaskState::Running, 1);
        failing.exit_reason = Some(drover_common::state::ExitReason::HealthCheckFailed {
            last_error: "503".into(),
        });
        ob.put(vec![failing]).unwrap();
        ob.put(vec![with_processes("a", 2, TaskState::Running, 2)])
            .unwrap();
        ob.put(vec![with_processes("a", 3, TaskState::Running, 3)])
            .unwrap();
        let kept: Vec<(u64, bool)> = ob
            .pending(100, u64::MAX)
            .iter()
            .map(|u| (u.seq, u.exit_reason.is_some()))
            .collect();
        assert_eq!(kept, vec![(1, true), (3, false)]);
        // The same after a restart (the outbox is read back through `insert`).
        drop(ob);
        let ob = Outbox::open(dir.path()).unwrap();
        assert_eq!(ob.len(), 2);
    }

    #[test]
    fn past_the_byte_bound_statuses_lose_their_process_list_not_their_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        // 400 tasks of 100 processes each: about 4 MB of lists, over a 1 MiB bound.
        ob.max_bytes = 1 << 20;
        let mut seq_state = Vec::new();
        for chunk in 0..4 {
            let batch: Vec<StatusUpdate> = (0..100)
                .map(|t| with_processes(&format!("t{chunk}-{t}"), 1, TaskState::Running, 100))
                .collect();
            seq_state.extend(batch.iter().map(|u| (u.task_id.clone(), u.state)));
            ob.put(batch).unwrap();
        }
        assert_eq!(ob.len(), 400);
        assert!(ob.bytes() <= (1 << 20) + 100_000, "{}", ob.bytes());
        let all = ob.pending(10_000, u64::MAX);
        assert!(all.iter().any(|u| u.processes.is_empty()));
        assert!(all.iter().any(|u| u.processes.len() == 100));
        let got: Vec<(String, TaskState)> =
            all.iter().map(|u| (u.task_id.clone(), u.state)).collect();
        let mut want = seq_state;
        want.sort();
        assert_eq!(got, want);
        // A batch to relay stays under its byte limit (and holds at least one).
        let batch = ob.pending(1000, 100_000);
        let size: u64 = batch.iter().map(json_len).sum();
        assert!(size <= 100_000 && batch.len() > 1, "{size}");
        assert_eq!(ob.pending(1000, 1).len(), 1);
    }
}
