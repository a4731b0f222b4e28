//! The embedded SQLite store in `<data_dir>/drover.db`: opening it (0600 files,
//! the schema and its upgrades), loading the snapshot, and committing a batch in
//! one transaction, each change written as `rows` describes it.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use rusqlite::{params, Connection, OptionalExtension};

use super::rows::{write_of, Row, Table, Write, UNDER_A_JOB};
use super::{sqlite_no_space, sqlite_no_space_detail, Store, StoreError, SCHEMA_VERSION};
use crate::core::{
    AgentRecord, Change, ConfigRecord, JobRecord, Snapshot, Task, UpdateRecord, Usage,
};

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
    let writes: Vec<Write> = changes.iter().map(write_of).collect();
    // Later changes to the same row win: keep only the last of each.
    let mut seen: HashSet<(Table, &str)> = HashSet::new();
    let mut keep = vec![false; writes.len()];
    for (i, w) in writes.iter().enumerate().rev() {
        let key = match w {
            // Configs are few: all kept (a put and a later delete of one run in
            // order). A job's delete is kept even when a later write of the job
            // supersedes its row: it also deletes the job's configs and update
            // written before it (all run in order).
            Write::Put(Row::Config { .. }) | Write::DeleteConfig { .. } => {
                keep[i] = true;
                continue;
            }
            Write::DeleteJob(key) => {
                seen.insert((Table::Jobs, key));
                keep[i] = true;
                continue;
            }
            Write::Put(row) => (row.table(), row.key()),
            Write::Delete(table, key) => (*table, *key),
        };
        keep[i] = seen.insert(key);
    }
    let tx = conn.transaction().map_err(sql("begin"))?;
    for (w, _) in writes.iter().zip(&keep).filter(|(_, k)| **k) {
        match w {
            Write::Put(row) => put_row(&tx, row)?,
            Write::Delete(table, key) => delete_row(&tx, *table, key)?,
            Write::DeleteConfig { job, hash } => {
                tx.prepare_cached("DELETE FROM job_configs WHERE job = ?1 AND hash = ?2")
                    .map_err(sql("prepare"))?
                    .execute(params![job, hash])
                    .map_err(sql("delete config"))?;
            }
            Write::DeleteJob(key) => {
                delete_row(&tx, Table::Jobs, key)?;
                for table in UNDER_A_JOB {
                    delete_row(&tx, table, key)?;
                }
                delete_row(&tx, Table::Configs, key)?;
            }
        }
    }
    tx.commit().map_err(sql("commit"))?;
    Ok(())
}

/// Deletes the row of `table` with `key` (for configs: every config of job `key`).
fn delete_row(tx: &rusqlite::Transaction, table: Table, key: &str) -> Result<(), StoreError> {
    let statement = format!(
        "DELETE FROM {} WHERE {} = ?1",
        table.sqlite(),
        table.key_column()
    );
    tx.prepare_cached(&statement)
        .map_err(sql("prepare"))?
        .execute(params![key])
        .map_err(sql("delete"))?;
    Ok(())
}

/// Writes `row` in place of the stored one: its JSON, with the columns SQLite
/// keeps beside it.
fn put_row(tx: &rusqlite::Transaction, row: &Row) -> Result<(), StoreError> {
    let json = row.json()?;
    let (statement, done) = match row {
        Row::Job {
            key, created_ms, ..
        } => (
            "write job",
            tx.prepare_cached(
                "INSERT OR REPLACE INTO jobs (key, spec, created_ms) VALUES (?1, ?2, ?3)",
            )
            .map_err(sql("prepare"))?
            .execute(params![key, json, *created_ms as i64]),
        ),
        Row::Task(t) => {
            let desired = match t.desired {
                drover_common::DesiredState::Running => "RUNNING",
                drover_common::DesiredState::Shutdown => "SHUTDOWN",
            };
            (
                "write task",
                tx.prepare_cached(
                    "INSERT OR REPLACE INTO tasks (id, job, instance, state, desired, agent, record)
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                )
                .map_err(sql("prepare"))?
                .execute(params![
                    t.id,
                    t.job,
                    t.instance,
                    t.status.state.as_str(),
                    desired,
                    t.agent,
                    json
                ]),
            )
        }
        Row::Agent(a) => (
            "write agent",
            tx.prepare_cached("INSERT OR REPLACE INTO agents (id, record) VALUES (?1, ?2)")
                .map_err(sql("prepare"))?
                .execute(params![a.id, json]),
        ),
        Row::Quota(role, _) => (
            "write quota",
            tx.prepare_cached("INSERT OR REPLACE INTO quotas (role, record) VALUES (?1, ?2)")
                .map_err(sql("prepare"))?
                .execute(params![role, json]),
        ),
        Row::UserGrants(role, _) => (
            "write user grants",
            tx.prepare_cached("INSERT OR REPLACE INTO user_grants (role, record) VALUES (?1, ?2)")
                .map_err(sql("prepare"))?
                .execute(params![role, json]),
        ),
        Row::CronFired(job, at) => (
            "write cron firing",
            tx.prepare_cached("INSERT OR REPLACE INTO cron_fired (job, fired_ms) VALUES (?1, ?2)")
                .map_err(sql("prepare"))?
                .execute(params![job, *at as i64]),
        ),
        Row::Index(index) => (
            "write index",
            tx.prepare_cached("INSERT OR REPLACE INTO meta (key, value) VALUES ('index', ?1)")
                .map_err(sql("prepare"))?
                .execute(params![index.to_string()]),
        ),
        Row::Config {
            job, hash, used_ms, ..
        } => (
            "write config",
            tx.prepare_cached(
                "INSERT OR REPLACE INTO job_configs (job, hash, spec, used_ms)
                     VALUES (?1, ?2, ?3, ?4)",
            )
            .map_err(sql("prepare"))?
            .execute(params![job, hash, json, *used_ms as i64]),
        ),
        Row::Update(u) => (
            "write update",
            tx.prepare_cached("INSERT OR REPLACE INTO updates (job, record) VALUES (?1, ?2)")
                .map_err(sql("prepare"))?
                .execute(params![u.view.job, json]),
        ),
    };
    done.map_err(sql(statement))?;
    Ok(())
}
