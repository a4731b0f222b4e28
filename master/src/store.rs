//! Durable state: the `Store` trait (load everything at start, commit batches of
//! changes atomically), its SQLite implementation (WAL, synchronous=FULL) and the
//! group-commit writer: one thread drains every pending batch, commits them in one
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

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};
use tokio::sync::watch;

use crate::core::{
    AgentRecord, Change, ConfigRecord, JobRecord, Snapshot, Task, UpdateRecord, Usage,
};

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

/// Creates the database file with mode 0600 when missing (SQLite gives its `-wal` and
/// `-shm` files the database's mode), and makes the three 0600 when they exist.
fn private_files(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    drop(
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(path)?,
    );
    for suffix in ["", "-wal", "-shm"] {
        let mut file = path.as_os_str().to_owned();
        file.push(suffix);
        match std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// The embedded SQLite store in `<data_dir>/drover.db`.
pub struct SqliteStore {
    conn: Connection,
}

fn sql(op: &'static str) -> impl Fn(rusqlite::Error) -> StoreError {
    move |source| {
        if sqlite_no_space(&source) {
            StoreError::NoSpace {
                op,
                detail: sqlite_no_space_detail(&source),
            }
        } else {
            StoreError::Sql { op, source }
        }
    }
}

impl SqliteStore {
    /// Opens (creating if needed) the database at `path`.
    pub fn open(path: &Path) -> Result<SqliteStore, StoreError> {
        let open_err = |source: rusqlite::Error| {
            if sqlite_no_space(&source) {
                StoreError::NoSpace {
                    op: "open",
                    detail: sqlite_no_space_detail(&source),
                }
            } else {
                StoreError::Open {
                    path: path.to_path_buf(),
                    source,
                }
            }
        };
        private_files(path).map_err(|source| StoreError::Permissions {
            path: path.to_path_buf(),
            source,
        })?;
        let conn = Connection::open(path).map_err(open_err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(open_err)?;
        conn.pragma_update(None, "synchronous", "FULL")
            .map_err(open_err)?;
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS jobs (
                key TEXT PRIMARY KEY, spec TEXT NOT NULL, created_ms INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS tasks (
                id TEXT PRIMARY KEY, job TEXT NOT NULL, instance INTEGER NOT NULL,
                state TEXT NOT NULL, desired TEXT NOT NULL, agent TEXT, record TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS tasks_by_job ON tasks(job, instance);
             CREATE TABLE IF NOT EXISTS agents (id TEXT PRIMARY KEY, record TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS job_configs (
                job TEXT NOT NULL, hash TEXT NOT NULL, spec TEXT NOT NULL,
                used_ms INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job, hash));
             CREATE TABLE IF NOT EXISTS updates (
                job TEXT PRIMARY KEY, record TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS quotas (role TEXT PRIMARY KEY, record TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS user_grants (role TEXT PRIMARY KEY, record TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS cron_fired (
                job TEXT PRIMARY KEY, fired_ms INTEGER NOT NULL);",
        )
        .map_err(open_err)?;
        let found: Option<String> = conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'schema_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(open_err)?;
        match found.map(|v| v.parse::<i64>().unwrap_or(-1)) {
            None => {
                conn.execute(
                    "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)",
                    params![SCHEMA_VERSION.to_string()],
                )
                .map_err(open_err)?;
            }
            Some(SCHEMA_VERSION) => {}
            Some(found) => return Err(StoreError::Schema { found }),
        }
        // Stores written before configs were pruned have no `used_ms`: their
        // configs count as the oldest.
        if !configs_have_used_ms(&conn).map_err(open_err)? {
            conn.execute_batch(
                "ALTER TABLE job_configs ADD COLUMN used_ms INTEGER NOT NULL DEFAULT 0",
            )
            .map_err(open_err)?;
        }
        Ok(SqliteStore { conn })
    }

    /// Loads the store at `path` without writing anything, for a master started on
    /// a full disk: the connection takes SQLite's exclusive locking mode before it
    /// reads, so the WAL index lives in memory and no `-shm` file must grow (the
    /// committed content of a `-wal` file left by a crash is read too). The lock
    /// ends when this returns.
    pub fn load_read_only(path: &Path) -> Result<Snapshot, StoreError> {
        let open_err = |source| StoreError::Open {
            path: path.to_path_buf(),
            source,
        };
        let conn = exclusive_reader(path).map_err(open_err)?;
        load_from(&conn)
    }
}

/// A connection to the SQLite file at `path` in exclusive locking mode (set before
/// its first read): it reads a WAL database without the `-shm` file, which a full
/// disk may not let grow. Used only to read at start; dropping it ends the lock.
pub fn exclusive_reader(path: &Path) -> Result<Connection, rusqlite::Error> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "locking_mode", "EXCLUSIVE")?;
    Ok(conn)
}

/// The store of a master started on a full disk: reads go through an exclusive
/// reader until the store can be opened, which each commit tries first (a commit
/// before that fails with `NoSpace`).
pub struct DeferredSqliteStore {
    path: PathBuf,
    store: Option<SqliteStore>,
}

impl DeferredSqliteStore {
    /// The store at `path`, opened at the first commit that can.
    pub fn new(path: &Path) -> DeferredSqliteStore {
        DeferredSqliteStore {
            path: path.to_path_buf(),
            store: None,
        }
    }
}

impl Store for DeferredSqliteStore {
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        match self.store.as_mut() {
            Some(store) => store.load(),
            None => SqliteStore::load_read_only(&self.path),
        }
    }

    fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError> {
        if self.store.is_none() {
            self.store = Some(SqliteStore::open(&self.path)?);
        }
        match self.store.as_mut() {
            Some(store) => store.commit(changes),
            None => Err(StoreError::Stopped),
        }
    }
}

impl Store for SqliteStore {
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        load_from(&self.conn)
    }

    fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError> {
        commit_to(&mut self.conn, changes)
    }
}

/// Everything stored, read through `conn`.
fn load_from(conn: &Connection) -> Result<Snapshot, StoreError> {
    let mut snap = Snapshot::default();
    let mut stmt = conn
        .prepare("SELECT key, spec, created_ms FROM jobs")
        .map_err(sql("load jobs"))?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })
        .map_err(sql("load jobs"))?;
    for row in rows {
        let (key, spec, created) = row.map_err(sql("load jobs"))?;
        let spec = serde_json::from_str(&spec).map_err(|source| StoreError::Decode {
            what: "job",
            key: key.clone(),
            source,
        })?;
        snap.jobs.push(JobRecord {
            key,
            spec,
            created_ms: created as u64,
        });
    }
    let mut stmt = conn
        .prepare("SELECT id, record FROM tasks")
        .map_err(sql("load tasks"))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(sql("load tasks"))?;
    for row in rows {
        let (id, record) = row.map_err(sql("load tasks"))?;
        let task: Task = serde_json::from_str(&record).map_err(|source| StoreError::Decode {
            what: "task",
            key: id,
            source,
        })?;
        snap.tasks.push(task);
    }
    let mut stmt = conn
        .prepare("SELECT id, record FROM agents")
        .map_err(sql("load agents"))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(sql("load agents"))?;
    for row in rows {
        let (id, record) = row.map_err(sql("load agents"))?;
        let agent: AgentRecord =
            serde_json::from_str(&record).map_err(|source| StoreError::Decode {
                what: "agent",
                key: id,
                source,
            })?;
        snap.agents.push(agent);
    }
    let index: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'index'", [], |r| {
            r.get(0)
        })
        .optional()
        .map_err(sql("load index"))?;
    snap.index = index.and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut stmt = conn
        .prepare("SELECT role, record FROM quotas")
        .map_err(sql("load quotas"))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(sql("load quotas"))?;
    for row in rows {
        let (role, record) = row.map_err(sql("load quotas"))?;
        let quota: Usage = serde_json::from_str(&record).map_err(|source| StoreError::Decode {
            what: "quota",
            key: role.clone(),
            source,
        })?;
        snap.quotas.push((role, quota));
    }
    // A store opened read-only may predate `user_grants` (made when opened to write).
    if has_table(conn, "user_grants").map_err(sql("load user grants"))? {
        let mut stmt = conn
            .prepare("SELECT role, record FROM user_grants")
            .map_err(sql("load user grants"))?;
        let rows = stmt
            .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
            .map_err(sql("load user grants"))?;
        for row in rows {
            let (role, record) = row.map_err(sql("load user grants"))?;
            let users = serde_json::from_str(&record).map_err(|source| StoreError::Decode {
                what: "user grants",
                key: role.clone(),
                source,
            })?;
            snap.user_grants.push((role, users));
        }
    }
    let mut stmt = conn
        .prepare("SELECT job, fired_ms FROM cron_fired")
        .map_err(sql("load cron firings"))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))
        .map_err(sql("load cron firings"))?;
    for row in rows {
        let (job, fired) = row.map_err(sql("load cron firings"))?;
        snap.cron_fired.push((job, fired as u64));
    }
    // A store opened read-only may predate `used_ms` (added when opened to write).
    let query = if configs_have_used_ms(conn).map_err(sql("load configs"))? {
        "SELECT job, hash, spec, used_ms FROM job_configs"
    } else {
        "SELECT job, hash, spec, 0 FROM job_configs"
    };
    let mut stmt = conn.prepare(query).map_err(sql("load configs"))?;
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })
        .map_err(sql("load configs"))?;
    for row in rows {
        let (job, hash, spec, used_ms) = row.map_err(sql("load configs"))?;
        let spec = serde_json::from_str(&spec).map_err(|source| StoreError::Decode {
            what: "config",
            key: format!("{job} {hash}"),
            source,
        })?;
        snap.configs.push(ConfigRecord {
            job,
            hash,
            spec,
            used_ms: used_ms.max(0) as u64,
        });
    }
    let mut stmt = conn
        .prepare("SELECT job, record FROM updates")
        .map_err(sql("load updates"))?;
    let rows = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
        .map_err(sql("load updates"))?;
    for row in rows {
        let (job, record) = row.map_err(sql("load updates"))?;
        let update: UpdateRecord =
            serde_json::from_str(&record).map_err(|source| StoreError::Decode {
                what: "update",
                key: job,
                source,
            })?;
        snap.updates.push(update);
    }
    Ok(snap)
}

/// Whether the store has table `name`.
fn has_table(conn: &Connection, name: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
        params![name],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n > 0)
}

/// Whether `job_configs` has its `used_ms` column.
fn configs_have_used_ms(conn: &Connection) -> rusqlite::Result<bool> {
    let mut stmt = conn.prepare("SELECT name FROM pragma_table_info('job_configs')")?;
    let names = stmt.query_map([], |r| r.get::<_, String>(0))?;
    for name in names {
        if name? == "used_ms" {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Applies `changes` in one transaction (see `Store::commit`).
fn commit_to(conn: &mut Connection, changes: &[Change]) -> Result<(), StoreError> {
    // Later changes to the same row win: keep only the last of each.
    let mut seen: HashSet<(u8, &str)> = HashSet::new();
    let mut keep = vec![false; changes.len()];
    for (i, c) in changes.iter().enumerate().rev() {
        let key = match c {
            Change::PutJob(_, key, _) => (0, key.as_str()),
            Change::PutTask(t) => (1, t.id.as_str()),
            Change::DeleteTask(id) => (1, id.as_str()),
            Change::PutAgent(a) => (2, a.id.as_str()),
            Change::PutQuota(role, _) => (3, role.as_str()),
            Change::PutUserGrants(role, _) => (7, role.as_str()),
            Change::PutCronFired(job, _) => (4, job.as_str()),
            Change::PutUpdate(u) => (5, u.view.job.as_str()),
            Change::Index(_) => (6, "index"),
            // Configs are few: all kept (a put and a later delete of one run in
            // order). A job's delete is kept even when a later write of the job
            // supersedes its row: it also deletes the job's configs and update
            // written before it (all run in order).
            Change::PutConfig { .. } | Change::DeleteConfig { .. } => {
                keep[i] = true;
                continue;
            }
            Change::DeleteJob(key) => {
                seen.insert((0, key.as_str()));
                keep[i] = true;
                continue;
            }
        };
        keep[i] = seen.insert(key);
    }
    let tx = conn.transaction().map_err(sql("begin"))?;
    {
        let mut put_job = tx
            .prepare_cached(
                "INSERT OR REPLACE INTO jobs (key, spec, created_ms) VALUES (?1, ?2, ?3)",
            )
            .map_err(sql("prepare"))?;
        let mut del_job = tx
            .prepare_cached("DELETE FROM jobs WHERE key = ?1")
            .map_err(sql("prepare"))?;
        let mut del_fired = tx
            .prepare_cached("DELETE FROM cron_fired WHERE job = ?1")
            .map_err(sql("prepare"))?;
        let mut put_fired = tx
            .prepare_cached("INSERT OR REPLACE INTO cron_fired (job, fired_ms) VALUES (?1, ?2)")
            .map_err(sql("prepare"))?;
        let mut put_quota = tx
            .prepare_cached("INSERT OR REPLACE INTO quotas (role, record) VALUES (?1, ?2)")
            .map_err(sql("prepare"))?;
        let mut del_quota = tx
            .prepare_cached("DELETE FROM quotas WHERE role = ?1")
            .map_err(sql("prepare"))?;
        let mut put_grants = tx
            .prepare_cached("INSERT OR REPLACE INTO user_grants (role, record) VALUES (?1, ?2)")
            .map_err(sql("prepare"))?;
        let mut del_grants = tx
            .prepare_cached("DELETE FROM user_grants WHERE role = ?1")
            .map_err(sql("prepare"))?;
        let mut put_task = tx
            .prepare_cached(
                "INSERT OR REPLACE INTO tasks (id, job, instance, state, desired, agent, record)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            )
            .map_err(sql("prepare"))?;
        let mut del_task = tx
            .prepare_cached("DELETE FROM tasks WHERE id = ?1")
            .map_err(sql("prepare"))?;
        let mut put_config = tx
            .prepare_cached(
                "INSERT OR REPLACE INTO job_configs (job, hash, spec, used_ms)
                     VALUES (?1, ?2, ?3, ?4)",
            )
            .map_err(sql("prepare"))?;
        let mut del_config = tx
            .prepare_cached("DELETE FROM job_configs WHERE job = ?1 AND hash = ?2")
            .map_err(sql("prepare"))?;
        let mut put_update = tx
            .prepare_cached("INSERT OR REPLACE INTO updates (job, record) VALUES (?1, ?2)")
            .map_err(sql("prepare"))?;
        let mut del_job_configs = tx
            .prepare_cached("DELETE FROM job_configs WHERE job = ?1")
            .map_err(sql("prepare"))?;
        let mut del_job_update = tx
            .prepare_cached("DELETE FROM updates WHERE job = ?1")
            .map_err(sql("prepare"))?;
        let mut put_agent = tx
            .prepare_cached("INSERT OR REPLACE INTO agents (id, record) VALUES (?1, ?2)")
            .map_err(sql("prepare"))?;
        let mut put_index = tx
            .prepare_cached("INSERT OR REPLACE INTO meta (key, value) VALUES ('index', ?1)")
            .map_err(sql("prepare"))?;
        for (c, _) in changes.iter().zip(&keep).filter(|(_, k)| **k) {
            match c {
                Change::PutJob(spec, key, created) => {
                    let json = serde_json::to_string(spec.as_ref()).map_err(|source| {
                        StoreError::Encode {
                            what: "job",
                            key: key.clone(),
                            source,
                        }
                    })?;
                    put_job
                        .execute(params![key, json, *created as i64])
                        .map_err(sql("write job"))?;
                }
                Change::DeleteJob(key) => {
                    del_job.execute(params![key]).map_err(sql("delete job"))?;
                    del_fired
                        .execute(params![key])
                        .map_err(sql("delete cron firing"))?;
                    del_job_configs
                        .execute(params![key])
                        .map_err(sql("delete job"))?;
                    del_job_update
                        .execute(params![key])
                        .map_err(sql("delete job"))?;
                }
                Change::PutConfig {
                    job,
                    hash,
                    spec,
                    used_ms,
                } => {
                    let json = serde_json::to_string(spec.as_ref()).map_err(|source| {
                        StoreError::Encode {
                            what: "config",
                            key: format!("{job} {hash}"),
                            source,
                        }
                    })?;
                    put_config
                        .execute(params![job, hash, json, *used_ms as i64])
                        .map_err(sql("write config"))?;
                }
                Change::DeleteConfig { job, hash } => {
                    del_config
                        .execute(params![job, hash])
                        .map_err(sql("delete config"))?;
                }
                Change::PutUpdate(u) => {
                    let json =
                        serde_json::to_string(u.as_ref()).map_err(|source| StoreError::Encode {
                            what: "update",
                            key: u.view.job.clone(),
                            source,
                        })?;
                    put_update
                        .execute(params![u.view.job, json])
                        .map_err(sql("write update"))?;
                }
                Change::PutTask(t) => {
                    let json =
                        serde_json::to_string(t.as_ref()).map_err(|source| StoreError::Encode {
                            what: "task",
                            key: t.id.clone(),
                            source,
                        })?;
                    let desired = match t.desired {
                        drover_common::DesiredState::Running => "RUNNING",
                        drover_common::DesiredState::Shutdown => "SHUTDOWN",
                    };
                    put_task
                        .execute(params![
                            t.id,
                            t.job,
                            t.instance,
                            t.status.state.as_str(),
                            desired,
                            t.agent,
                            json
                        ])
                        .map_err(sql("write task"))?;
                }
                Change::DeleteTask(id) => {
                    del_task.execute(params![id]).map_err(sql("delete task"))?;
                }
                Change::PutAgent(a) => {
                    let json =
                        serde_json::to_string(a.as_ref()).map_err(|source| StoreError::Encode {
                            what: "agent",
                            key: a.id.clone(),
                            source,
                        })?;
                    put_agent
                        .execute(params![a.id, json])
                        .map_err(sql("write agent"))?;
                }
                Change::PutQuota(role, Some(q)) => {
                    let json = serde_json::to_string(q).map_err(|source| StoreError::Encode {
                        what: "quota",
                        key: role.clone(),
                        source,
                    })?;
                    put_quota
                        .execute(params![role, json])
                        .map_err(sql("write quota"))?;
                }
                Change::PutQuota(role, None) => {
                    del_quota
                        .execute(params![role])
                        .map_err(sql("delete quota"))?;
                }
                Change::PutUserGrants(role, users) if users.is_empty() => {
                    del_grants
                        .execute(params![role])
                        .map_err(sql("delete user grants"))?;
                }
                Change::PutUserGrants(role, users) => {
                    let json =
                        serde_json::to_string(users).map_err(|source| StoreError::Encode {
                            what: "user grants",
                            key: role.clone(),
                            source,
                        })?;
                    put_grants
                        .execute(params![role, json])
                        .map_err(sql("write user grants"))?;
                }
                Change::PutCronFired(job, at) => {
                    put_fired
                        .execute(params![job, *at as i64])
                        .map_err(sql("write cron firing"))?;
                }
                Change::Index(index) => {
                    put_index
                        .execute(params![index.to_string()])
                        .map_err(sql("write index"))?;
                }
            }
        }
    }
    tx.commit().map_err(sql("commit"))?;
    Ok(())
}

/// One batch from the core: its changes, the agents to wake after the commit, and
/// the epoch of the core that made it (a batch of an older epoch is dropped).
struct Batch {
    seq: u64,
    epoch: u64,
    changes: Vec<Change>,
    notify: Vec<String>,
}

/// What the writer thread is asked.
enum Msg {
    Commit(Batch),
    /// Load everything stored and send it back (the master reloads its core).
    Load(mpsc::Sender<Result<Snapshot, StoreError>>),
}

/// Long-poll wake-ups: one watch per agent whose value changes after each commit
/// that touched the agent's assignment set.
#[derive(Default)]
pub struct Notifier {
    agents: Mutex<HashMap<String, watch::Sender<u64>>>,
}

impl Notifier {
    /// A receiver that changes whenever the agent's set changed and was committed.
    pub fn subscribe(&self, agent: &str) -> watch::Receiver<u64> {
        let mut map = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(agent.to_string())
            .or_insert_with(|| watch::channel(0).0)
            .subscribe()
    }

    fn wake(&self, agent: &str, seq: u64) {
        let map = self.agents.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(tx) = map.get(agent) {
            tx.send_replace(seq);
        }
    }
}

/// The committed sequence number, whether the store has failed, and whether it is
/// read-only for want of space.
pub struct CommitState {
    committed: AtomicU64,
    failed: AtomicBool,
    /// Why the store takes no writes now (out of space), if it does not.
    read_only: Mutex<Option<String>>,
    /// Bumped whenever a batch was not stored for want of space: a core of an
    /// older epoch is ahead of the store and must be reloaded from it.
    epoch: AtomicU64,
    changed: watch::Sender<u64>,
}

impl CommitState {
    fn new(committed: u64, read_only: Option<String>) -> CommitState {
        CommitState {
            committed: AtomicU64::new(committed),
            failed: AtomicBool::new(false),
            read_only: Mutex::new(read_only),
            epoch: AtomicU64::new(0),
            changed: watch::channel(committed).0,
        }
    }

    /// The highest batch seq committed.
    pub fn committed(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }

    /// Whether a commit failed (the master must stop: memory is ahead of the disk).
    pub fn failed(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }

    /// Why the store takes no writes now (its disk is full), or None when it does.
    pub fn read_only(&self) -> Option<String> {
        self.read_only
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The epoch of the store: it changes whenever a batch was dropped unstored.
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// Changes after each commit (and on failure, and when the store turns
    /// read-only or writable).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn set_read_only(&self, why: Option<String>) {
        *self.read_only.lock().unwrap_or_else(|p| p.into_inner()) = why;
        self.changed.send_modify(|_| {});
    }

    /// A batch was not stored for want of space (`why`): read-only, with the
    /// reason in place before the new epoch tells waiters their batch is gone.
    fn reject(&self, why: String) {
        *self.read_only.lock().unwrap_or_else(|p| p.into_inner()) = Some(why);
        self.epoch.fetch_add(1, Ordering::AcqRel);
        self.changed.send_modify(|_| {});
    }

    /// Marks the store failed for good (the master stops).
    pub(crate) fn fail(&self) {
        self.failed.store(true, Ordering::Release);
        self.changed.send_replace(u64::MAX);
    }
}

/// What a read-only store answers: the reason for the error and `/health`.
fn read_only_reason(e: &StoreError) -> String {
    format!("the store has no space left ({e}); reads are served, writes resume by themselves once space is freed")
}

/// The group-commit writer thread.
pub struct Writer {
    tx: Option<mpsc::Sender<Msg>>,
    thread: Option<JoinHandle<()>>,
    /// Commit progress, shared with waiters.
    pub state: Arc<CommitState>,
    /// Long-poll wake-ups, shared with the HTTP layer.
    pub notifier: Arc<Notifier>,
}

/// The writer thread's own state.
struct Thread {
    store: Box<dyn Store>,
    state: Arc<CommitState>,
    notifier: Arc<Notifier>,
}

impl Thread {
    fn run(mut self, rx: mpsc::Receiver<Msg>) {
        let mut next: Option<Msg> = None;
        loop {
            let msg = match next.take() {
                Some(m) => m,
                None if self.state.read_only().is_some() => {
                    match rx.recv_timeout(READ_ONLY_RETRY) {
                        Ok(m) => m,
                        Err(mpsc::RecvTimeoutError::Timeout) => {
                            self.try_resume();
                            continue;
                        }
                        Err(mpsc::RecvTimeoutError::Disconnected) => return,
                    }
                }
                None => match rx.recv() {
                    Ok(m) => m,
                    Err(_) => return,
                },
            };
            match msg {
                Msg::Load(reply) => {
                    let _ = reply.send(self.store.load());
                }
                Msg::Commit(first) => {
                    let mut batches = vec![first];
                    while let Ok(more) = rx.try_recv() {
                        match more {
                            Msg::Commit(b) => batches.push(b),
                            load => {
                                next = Some(load);
                                break;
                            }
                        }
                    }
                    if !self.commit(batches) {
                        return;
                    }
                }
            }
        }
    }

    /// Commits the batches of the current epoch; false when the store failed for
    /// good (the thread ends).
    fn commit(&mut self, mut batches: Vec<Batch>) -> bool {
        let st = self.state.clone();
        // Made on top of a batch that was not stored: dropped, their waiters
        // learn it from the epoch.
        let epoch = st.epoch();
        batches.retain(|b| b.epoch == epoch);
        let Some(last) = batches.last().map(|b| b.seq) else {
            return true;
        };
        let mut changes: Vec<Change> = batches
            .iter_mut()
            .flat_map(|b| b.changes.drain(..))
            .collect();
        changes.push(Change::Index(last));
        let began = std::time::Instant::now();
        let result = self.store.commit(&changes);
        let m = &crate::metrics::METRICS;
        m.store_commit.observe(began.elapsed().as_secs_f64());
        m.group_commit_batches.observe(batches.len() as f64);
        match result {
            Ok(()) => {
                st.committed.store(last, Ordering::Release);
                if st.read_only().is_some() {
                    tracing::warn!(
                        "the store takes writes again: the master leaves read-only mode"
                    );
                    st.set_read_only(None);
                }
                st.changed.send_replace(last);
                for b in &batches {
                    for agent in &b.notify {
                        self.notifier.wake(agent, b.seq);
                    }
                }
                true
            }
            Err(e) if e.is_no_space() => {
                if st.read_only().is_none() {
                    tracing::error!(error = %e, "store commit failed for want of space: the master is read-only until space is freed; the write was not stored");
                }
                st.reject(read_only_reason(&e));
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "store commit failed; the master must restart");
                st.fail();
                false
            }
        }
    }

    /// Read-only: tries a write that changes nothing (the stored index,
    /// rewritten); writes resume if it works.
    fn try_resume(&mut self) {
        let st = self.state.clone();
        match self.store.commit(&[Change::Index(st.committed())]) {
            Ok(()) => {
                tracing::warn!("space is back: the master leaves read-only mode");
                st.set_read_only(None);
            }
            Err(e) if e.is_no_space() => {}
            Err(e) => {
                tracing::error!(error = %e, "store write failed; the master must restart");
                st.fail();
            }
        }
    }
}

impl Writer {
    /// Starts the writer thread over `store`; `committed` is the seq already stored.
    pub fn start(store: Box<dyn Store>, committed: u64) -> Writer {
        Writer::spawn(store, committed, None)
    }

    /// Starts a writer that is read-only from the start, for a store that could not
    /// be opened for want of space (`why`, e.g. a [`DeferredSqliteStore`]): it tries
    /// a write every [`READ_ONLY_RETRY`] until one succeeds, then writes resume.
    pub fn start_read_only(store: Box<dyn Store>, committed: u64, why: &StoreError) -> Writer {
        Writer::spawn(store, committed, Some(read_only_reason(why)))
    }

    fn spawn(store: Box<dyn Store>, committed: u64, read_only: Option<String>) -> Writer {
        let (tx, rx) = mpsc::channel::<Msg>();
        let state = Arc::new(CommitState::new(committed, read_only));
        let notifier = Arc::new(Notifier::default());
        let thread = Thread {
            store,
            state: state.clone(),
            notifier: notifier.clone(),
        };
        let thread = std::thread::Builder::new()
            .name("drover-store".to_string())
            .spawn(move || thread.run(rx));
        let thread = match thread {
            Ok(t) => Some(t),
            Err(e) => {
                tracing::error!(error = %e, "cannot start the store thread");
                state.failed.store(true, Ordering::Release);
                None
            }
        };
        Writer {
            tx: Some(tx),
            thread,
            state,
            notifier,
        }
    }

    /// Queues a batch. Call in seq order (under the core's lock).
    pub fn submit(&self, seq: u64, changes: Vec<Change>, notify: Vec<String>) {
        self.submit_from(seq, self.state.epoch(), changes, notify);
    }

    /// Queues a batch made by a core of store epoch `epoch` (dropped unstored if
    /// the store dropped one since). Call in seq order (under the core's lock).
    pub fn submit_from(&self, seq: u64, epoch: u64, changes: Vec<Change>, notify: Vec<String>) {
        let sent = self
            .tx
            .as_ref()
            .map(|tx| {
                tx.send(Msg::Commit(Batch {
                    seq,
                    epoch,
                    changes,
                    notify,
                }))
                .is_ok()
            })
            .unwrap_or(false);
        if !sent {
            self.state.fail();
        }
    }

    /// Everything stored, read by the writer thread after the batches queued
    /// before (blocks until then).
    pub fn load(&self) -> Result<Snapshot, StoreError> {
        let (reply, answer) = mpsc::channel();
        let tx = self.tx.as_ref().ok_or(StoreError::Stopped)?;
        tx.send(Msg::Load(reply)).map_err(|_| StoreError::Stopped)?;
        answer.recv().map_err(|_| StoreError::Stopped)?
    }

    /// Wakes agents without a store change.
    pub fn wake_now(&self, agents: &[String], seq: u64) {
        for a in agents {
            self.notifier.wake(a, seq);
        }
    }

    /// Commits what is queued and stops the thread.
    pub fn close(&mut self) {
        self.tx.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}
