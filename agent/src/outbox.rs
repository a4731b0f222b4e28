//! The durable outbox of status updates: every update an executor reports (or the
//! agent decides, e.g. executor lost) is written here and fsync'd before the agent
//! relays it, and is dropped only once the master acknowledged it. Updates that
//! arrive together are written as one batch file, so one fsync covers many of them.
//!
//! Layout in `<data_dir>/outbox/`: `<batch:020>.json` (a JSON array of
//! `wire::StatusUpdate`), `acked.json` (task id -> highest acknowledged seq), and
//! `*.tmp` leftovers of interrupted writes (removed on open).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use drover_common::wire::StatusUpdate;

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

/// The outbox: pending updates in memory, mirrored on disk.
#[derive(Debug)]
pub struct Outbox {
    dir: PathBuf,
    next_batch: u64,
    /// (task id, seq) -> (update, batch file it lives in).
    pending: BTreeMap<(String, u64), (StatusUpdate, u64)>,
    /// Batch file -> the (task, seq) entries in it not yet acknowledged.
    batches: BTreeMap<u64, BTreeSet<(String, u64)>>,
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
            next_batch: 1,
            pending: BTreeMap::new(),
            batches: BTreeMap::new(),
            acked,
            acked_dirty: false,
        };
        let entries = fs::read_dir(&dir).map_err(io("list", &dir))?;
        for entry in entries {
            let entry = entry.map_err(io("list", &dir))?;
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.ends_with(".tmp") {
                let _ = fs::remove_file(&path);
                continue;
            }
            let Some(batch) = name
                .strip_suffix(".json")
                .and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            outbox.next_batch = outbox.next_batch.max(batch + 1);
            let bytes = fs::read(&path).map_err(io("read", &path))?;
            let updates: Vec<StatusUpdate> = match serde_json::from_slice(&bytes) {
                Ok(u) => u,
                Err(e) => {
                    // Batches are renamed into place only once complete, so this is
                    // damage from outside; keep it for a person to look at.
                    tracing::error!(path = %path.display(), error = %e, "unreadable outbox batch moved aside");
                    let _ = fs::rename(&path, path.with_extension("corrupt"));
                    continue;
                }
            };
            let mut live = BTreeSet::new();
            for u in updates {
                if u.seq <= outbox.acked.get(&u.task_id).copied().unwrap_or(0) {
                    continue;
                }
                let key = (u.task_id.clone(), u.seq);
                live.insert(key.clone());
                outbox.pending.insert(key, (u, batch));
            }
            if live.is_empty() {
                let _ = fs::remove_file(&path);
            } else {
                outbox.batches.insert(batch, live);
            }
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

    /// Durably adds updates (one fsync'd batch file). Updates at or below the task's
    /// last seq are skipped, so replays are harmless. Returns how many were added.
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
        let batch = self.next_batch;
        self.next_batch += 1;
        let path = self.dir.join(format!("{batch:020}.json"));
        let bytes = serde_json::to_vec(&fresh).map_err(|e| {
            io("encode", &path)(std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })?;
        write_atomic(&path, &bytes, true).map_err(io("write", &path))?;
        sync_dir(&self.dir).map_err(io("sync", &self.dir))?;
        let n = fresh.len();
        let mut live = BTreeSet::new();
        for u in fresh {
            let key = (u.task_id.clone(), u.seq);
            live.insert(key.clone());
            self.pending.insert(key, (u, batch));
        }
        self.batches.insert(batch, live);
        Ok(n)
    }

    /// Up to `max` pending updates, each task's in seq order.
    pub fn pending(&self, max: usize) -> Vec<StatusUpdate> {
        self.pending
            .values()
            .take(max)
            .map(|(u, _)| u.clone())
            .collect()
    }

    /// How many updates wait for an acknowledgement.
    pub fn len(&self) -> usize {
        self.pending.len()
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
        // Recorded on disk by `flush_acked` (the agent calls it every tick), not here:
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
                if let Some((_, batch)) = self.pending.remove(&key) {
                    if let Some(live) = self.batches.get_mut(&batch) {
                        live.remove(&key);
                        if live.is_empty() {
                            emptied.push(batch);
                        }
                    }
                }
            }
        }
        for batch in emptied {
            self.batches.remove(&batch);
            let path = self.dir.join(format!("{batch:020}.json"));
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

    fn update(task: &str, seq: u64) -> StatusUpdate {
        StatusUpdate {
            task_id: task.into(),
            seq,
            state: TaskState::Running,
            exit_reason: None,
            message: format!("{task} {seq}"),
            timestamp_ms: 1,
            processes: vec![],
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
            .pending(100)
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
        // The second batch is fully acknowledged: its file is gone.
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
        assert_eq!(ob.pending(10), vec![update("b", 1)]);
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

    #[test]
    fn pending_is_bounded_by_max() {
        let dir = tempfile::tempdir().unwrap();
        let mut ob = Outbox::open(dir.path()).unwrap();
        ob.put((1..=10).map(|s| update("a", s)).collect()).unwrap();
        assert_eq!(ob.pending(4).len(), 4);
        assert_eq!(ob.pending(4)[3].seq, 4);
    }
}
