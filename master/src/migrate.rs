//! `drover-master migrate --from STORE --to STORE`: copies a stopped master's
//! state between stores (`sqlite:PATH` and `etcd://host:port,...`, either way):
//! loads everything from one and commits it into the other in one batch (through
//! the etcd store's redo log when large). The target must be empty unless forced,
//! and no master may run on an etcd target. The token registry (tokens, forbidden
//! agents, agents' log keys) and the audit log are copied too: from the SQLite
//! file's tables and `audit.log` beside it into etcd (`etcd_auth`), or back
//! (records appended to the target's `audit.log`).

use std::path::PathBuf;

use crate::core::Snapshot;
use std::sync::Arc;

use crate::audit::AUDIT_FILE;
use crate::etcd_store::{snapshot_changes, EtcdConn, EtcdOptions, EtcdStore};
use crate::ha::ELECTION;
use crate::store::{SqliteStore, Store, StoreError, DB_FILE};
use crate::tokens::{TokenError, Tokens};

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
    #[error("--{flag}: the token registry: {source}")]
    Tokens {
        flag: &'static str,
        source: TokenError,
    },
    #[error("--{flag}: the audit log {path}: {source}")]
    Audit {
        flag: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

/// What was copied.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Migrated {
    pub jobs: usize,
    pub tasks: usize,
    pub agents: usize,
    pub index: u64,
    /// Tokens copied (revoked ones included).
    pub tokens: usize,
    /// Audit records copied.
    pub audit: usize,
}

/// Where one side's token registry and audit log live.
enum Side {
    /// The SQLite file (the audit log is `audit.log` beside it).
    Sqlite(PathBuf),
    /// The etcd cluster (no fence: no master runs during a migration).
    Etcd(Arc<EtcdConn>),
}

impl Side {
    fn tokens(&self, flag: &'static str) -> Result<Tokens, MigrateError> {
        let err = |source| MigrateError::Tokens { flag, source };
        match self {
            Side::Sqlite(path) => Tokens::open(path).map_err(err),
            Side::Etcd(conn) => Tokens::open_etcd(EtcdStore::new(conn.clone(), None)).map_err(err),
        }
    }

    fn audit_file(path: &std::path::Path) -> PathBuf {
        path.parent()
            .unwrap_or(std::path::Path::new("."))
            .join(AUDIT_FILE)
    }

    /// The audit log's records (JSON lines, oldest first).
    fn read_audit(&self, flag: &'static str) -> Result<Vec<String>, MigrateError> {
        match self {
            Side::Sqlite(path) => {
                let path = Side::audit_file(path);
                match std::fs::read_to_string(&path) {
                    Ok(text) => Ok(text
                        .lines()
                        .filter(|l| !l.trim().is_empty())
                        .map(str::to_string)
                        .collect()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
                    Err(source) => Err(MigrateError::Audit { flag, path, source }),
                }
            }
            Side::Etcd(conn) => crate::etcd_auth::read_audit(&EtcdStore::new(conn.clone(), None))
                .map_err(|source| MigrateError::Store { flag, source }),
        }
    }

    /// Adds `lines` to the audit log.
    fn write_audit(&self, flag: &'static str, lines: &[String]) -> Result<(), MigrateError> {
        match self {
            Side::Sqlite(path) => {
                use std::io::Write as _;
                use std::os::unix::fs::OpenOptionsExt as _;
                let path = Side::audit_file(path);
                let text: String = lines.iter().map(|l| format!("{l}\n")).collect();
                std::fs::OpenOptions::new()
                    .append(true)
                    .create(true)
                    .mode(0o600)
                    .open(&path)
                    .and_then(|mut f| f.write_all(text.as_bytes()))
                    .map_err(|source| MigrateError::Audit { flag, path, source })
            }
            Side::Etcd(conn) => {
                crate::etcd_auth::write_audit_lines(&EtcdStore::new(conn.clone(), None), lines)
                    .map_err(|source| MigrateError::Store { flag, source })
            }
        }
    }
}

/// TLS files for etcd, from the master's flags.
#[derive(Clone, Debug, Default)]
pub struct EtcdTls {
    pub ca: Option<PathBuf>,
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
}

type Opened = (Box<dyn Store>, Side);

fn open(flag: &'static str, spec: &str, tls: &EtcdTls) -> Result<Opened, MigrateError> {
    let store_err = |source| MigrateError::Store { flag, source };
    if let Some(path) = spec.strip_prefix("sqlite:") {
        let mut path = PathBuf::from(path);
        if path.is_dir() {
            path = path.join(DB_FILE);
        }
        let store = SqliteStore::open(&path).map_err(store_err)?;
        return Ok((Box::new(store), Side::Sqlite(path)));
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
        return Ok((
            Box::new(EtcdStore::new(conn.clone(), None)),
            Side::Etcd(conn),
        ));
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
    let (mut source, source_side) = open("from", from, tls)?;
    let (mut target, target_side) = open("to", to, tls)?;
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
    let mut migrated = Migrated {
        jobs: snapshot.jobs.len(),
        tasks: snapshot.tasks.len(),
        agents: snapshot.agents.len(),
        index: snapshot.index,
        ..Migrated::default()
    };
    let audit = source_side.read_audit("from")?;
    let tokens = source_side.tokens("from")?;
    target
        .commit(&snapshot_changes(snapshot))
        .map_err(|source| MigrateError::Store { flag: "to", source })?;
    migrated.tokens = target_side
        .tokens("to")?
        .copy_from(&tokens)
        .map_err(|source| MigrateError::Tokens { flag: "to", source })?;
    target_side.write_audit("to", &audit)?;
    migrated.audit = audit.len();
    Ok(migrated)
}
