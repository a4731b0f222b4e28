//! `drover-master migrate --from STORE --to STORE`: copies a stopped master's
//! state between stores (`sqlite:PATH` and `etcd://host:port,...`, either way):
//! loads everything from one and commits it into the other in one batch (through
//! the etcd store's redo log when large). The target must be empty unless forced,
//! and no master may run on an etcd target. The token registry and the audit log
//! stay in each master's data dir: they are not part of the store.

use std::path::PathBuf;

use crate::core::Snapshot;
use crate::etcd_store::{snapshot_changes, EtcdConn, EtcdOptions, EtcdStore};
use crate::leader::ELECTION;
use crate::store::{SqliteStore, Store, StoreError, DB_FILE};

/// Why a migration did not happen.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("--{flag}: `{spec}` is not a store; write sqlite:/var/lib/drover-master (or the drover.db file) or etcd://host:port,host:port")]
    BadStore { flag: &'static str, spec: String },
    #[error("--{flag}: {message}")]
    Option { flag: &'static str, message: String },
    #[error("--{flag}: {source}")]
    Store {
        flag: &'static str,
        source: StoreError,
    },
    #[error("--to already holds state ({jobs} jobs, {tasks} tasks, {agents} agents): migrate into an empty store, or pass --force to write over it row by row")]
    NotEmpty {
        jobs: usize,
        tasks: usize,
        agents: usize,
    },
    #[error("--to: a master is running on this etcd cluster (election key {key}): stop every master before migrating")]
    MasterRunning { key: String },
}

/// What was copied.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    pub jobs: usize,
    pub tasks: usize,
    pub agents: usize,
    pub index: u64,
}

/// TLS files for etcd, from the master's flags.
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

fn open(flag: &'static str, spec: &str, tls: &EtcdTls) -> Result<Box<dyn Store>, MigrateError> {
    let store_err = |source| MigrateError::Store { flag, source };
    if let Some(path) = spec.strip_prefix("sqlite:") {
        let mut path = PathBuf::from(path);
        if path.is_dir() {
            path = path.join(DB_FILE);
        }
        return Ok(Box::new(SqliteStore::open(&path).map_err(store_err)?));
    }
    if spec.starts_with("etcd://") {
        let options = EtcdOptions::parse(spec, tls.ca.clone(), tls.cert.clone(), tls.key.clone())
            .map_err(|e| MigrateError::Option {
            flag,
            message: e.to_string(),
        })?;
        let conn = EtcdConn::connect(&options).map_err(store_err)?;
        if flag == "to" {
            let mut client = conn.client();
            let leaders = conn
                .block(async move {
                    client
                        .get(ELECTION, Some(etcd_client::GetOptions::new().with_prefix()))
                        .await
                })
                .map_err(|e| {
                    store_err(StoreError::Etcd {
                        op: "read the election",
                        message: e.to_string(),
                    })
                })?;
            if let Some(kv) = leaders.kvs().first() {
                return Err(MigrateError::MasterRunning {
                    key: String::from_utf8_lossy(kv.key()).into_owned(),
                });
            }
        }
        return Ok(Box::new(EtcdStore::new(conn, None)));
    }
    Err(MigrateError::BadStore {
        flag,
        spec: spec.to_string(),
    })
}

fn is_empty(s: &Snapshot) -> bool {
    s.jobs.is_empty() && s.tasks.is_empty() && s.agents.is_empty() && s.index == 0
}

/// Copies the state in `from` into `to`.
pub fn migrate(from: &str, to: &str, force: bool, tls: &EtcdTls) -> Result<Migrated, MigrateError> {
    let mut source = open("from", from, tls)?;
    let mut target = open("to", to, tls)?;
    let snapshot = source.load().map_err(|source| MigrateError::Store {
        flag: "from",
        source,
    })?;
    let existing = target
        .load()
        .map_err(|source| MigrateError::Store { flag: "to", source })?;
    if !force && !is_empty(&existing) {
        return Err(MigrateError::NotEmpty {
            jobs: existing.jobs.len(),
            tasks: existing.tasks.len(),
            agents: existing.agents.len(),
        });
    }
    let migrated = Migrated {
        jobs: snapshot.jobs.len(),
        tasks: snapshot.tasks.len(),
        agents: snapshot.agents.len(),
        index: snapshot.index,
    };
    target
        .commit(&snapshot_changes(snapshot))
        .map_err(|source| MigrateError::Store { flag: "to", source })?;
    Ok(migrated)
}
