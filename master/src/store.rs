//! Durable state: the `Store` trait (load everything at start, commit batches of
//! changes atomically) and its errors; the stored form of a change, shared by both
//! stores (`store/rows.rs`); the SQLite implementation (`store/sqlite.rs`: WAL,
//! synchronous=FULL; etcd's is `etcd_store`) and the group-commit writer
//! (`store/writer.rs`): one thread drains every pending batch, commits them in one
//! transaction, then publishes the committed sequence number and wakes the agents
//! whose assignment sets changed.
//!
//! A store that runs out of space ([`StoreError::NoSpace`]) makes the writer
//! read-only instead of failing: the batch is not stored (SQLite rolled it back),
//! every batch made on top of it is dropped unstored, the new [`CommitState::epoch`]
//! tells the master to reload its core from the store, and the writer retries a
//! tiny write every [`READ_ONLY_RETRY`] until one succeeds (then writes resume).
//! A master started on a full disk loads the store read-only
//! ([`SqliteStore::load_read_only`]) and its writer opens the store once it can.

use std::path::PathBuf;
use std::time::Duration;

use crate::core::{Change, Snapshot};

mod rows;
mod sqlite;
mod writer;

pub use rows::{encode, write_of, Row, Table, Write, UNDER_A_JOB};
pub use sqlite::{exclusive_reader, DeferredSqliteStore, SqliteStore};
pub use writer::{CommitState, Notifier, Writer};

/// The file name of the SQLite database inside the data dir.
pub const DB_FILE: &str = "drover.db";
const SCHEMA_VERSION: i64 = 1;
/// How often a read-only writer tries to write again.
pub const READ_ONLY_RETRY: Duration = Duration::from_secs(1);

/// Why the store failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(
        "cannot open the store at {path}: {source}; check the data dir exists and is writable"
    )]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    #[error("cannot make the store at {path} private (mode 0600): {source}; check the data dir is the master's")]
    Permissions {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("store {op} failed: {source}")]
    Sql {
        op: &'static str,
        source: rusqlite::Error,
    },
    #[error("stored {what} {key} is not valid JSON: {source}")]
    Decode {
        what: &'static str,
        key: String,
        source: serde_json::Error,
    },
    #[error("cannot encode {what} {key}: {source}")]
    Encode {
        what: &'static str,
        key: String,
        source: serde_json::Error,
    },
    #[error("the store's schema version is {found}; this master reads version {SCHEMA_VERSION}: use a matching drover-master")]
    Schema { found: i64 },
    #[error("etcd: cannot {op}: {message}")]
    Etcd { op: &'static str, message: String },
    #[error("this master is no longer the leader (its election key changed in etcd): nothing was written")]
    Fenced,
    #[error("the store's writer thread has stopped")]
    Stopped,
    #[error("this is a standby's read-only copy of the store: writes go to the leader")]
    StandbyCopy,
    /// The store's disk (or its quota) is full: nothing of the write was stored.
    /// `detail` says which and what the operator frees ([`sqlite_no_space_detail`],
    /// the etcd store's NOSPACE mapping).
    #[error("store {op} failed: {detail}")]
    NoSpace { op: &'static str, detail: String },
}

impl StoreError {
    /// Whether the store ran out of space (the master goes read-only).
    pub fn is_no_space(&self) -> bool {
        matches!(self, StoreError::NoSpace { .. })
    }
}

/// Whether SQLite failed for want of space: SQLITE_FULL (a write got ENOSPC), or
/// SQLITE_IOERR_SHMSIZE (the `-shm` file could not grow, as when a full disk
/// keeps a store from being opened).
pub fn sqlite_no_space(e: &rusqlite::Error) -> bool {
    match e {
        rusqlite::Error::SqliteFailure(f, _) => {
            f.code == rusqlite::ErrorCode::DiskFull
                || f.extended_code == rusqlite::ffi::SQLITE_IOERR_SHMSIZE
        }
        _ => false,
    }
}

/// The `NoSpace` detail of a full SQLite store: what failed and what to free.
pub fn sqlite_no_space_detail(e: &rusqlite::Error) -> String {
    format!("the master's disk is full ({e}); free space in the master's data dir")
}

/// Where the master keeps its state. Implementations commit a batch atomically.
pub trait Store: Send + 'static {
    /// Everything stored.
    fn load(&mut self) -> Result<Snapshot, StoreError>;
    /// Applies the changes in one transaction, in order (later ones win).
    fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError>;
}
