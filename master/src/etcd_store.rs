//! The etcd store: the same `Store` as SQLite, kept in an etcd cluster under the
//! key prefix `/drover/` (one key per job, task, agent, config, update, quota, user grant and
//! cron firing, plus `meta/index`), through the etcd-client crate. Which key a
//! change writes and its value follow the stored form both stores share
//! (`store/rows.rs`); the options (`etcd_store/options.rs`) and the connection
//! (`etcd_store/conn.rs`) are files of their own.
//!
//! The `Store` trait is synchronous (the group-commit writer is a thread of its own);
//! etcd's client is async. An [`EtcdConn`] owns a dedicated one-thread tokio runtime
//! that runs the client, and the store hands each request to it and blocks on a
//! channel for the answer, so it works from the writer's thread and from inside the
//! master's own runtime alike.
//!
//! A commit is one etcd transaction when it fits etcd's limits (`--max-txn-ops`,
//! default 128 operations, and `--max-request-bytes`, default 1.5 MiB: both must be
//! told to the master when the cluster uses others). A larger commit is split
//! safely with a redo log: its operations are first written as chunks under
//! `redo/`, then one small transaction writes `redo/commit` (the commit point),
//! then the operations are applied in transactions that fit and the log is
//! deleted. A master that loads the store finishes a committed log and drops an
//! uncommitted one, so a batch is either wholly in the store or not at all.
//!
//! Every transaction of a leader is fenced: it succeeds only while the leader's
//! election key still has the create revision it had when the master was elected
//! (`leader`), so a master that lost its lease can never write again.

use std::collections::{BTreeSet, HashSet};
use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp};
use serde::{Deserialize, Serialize};

use crate::core::{
    AgentRecord, Change, ConfigRecord, JobRecord, Snapshot, Task, UpdateRecord, Usage,
};
use crate::store::{encode, write_of, Row, Store, StoreError, Table, Write, UNDER_A_JOB};

mod conn;
mod options;

pub(crate) use conn::etcd_no_space;
pub use conn::{EtcdConn, Limits};
pub use options::{EtcdOptionError, EtcdOptions};

use conn::etcd;

/// The key prefix of everything the master stores in etcd.
pub const PREFIX: &str = "/drover/";
/// etcd's default `--max-txn-ops`.
pub const DEFAULT_MAX_TXN_OPS: usize = 128;
/// etcd's default `--max-request-bytes` (1.5 MiB).
pub const DEFAULT_MAX_REQUEST_BYTES: usize = 1536 * 1024;
/// Room left in each request for gRPC and protobuf framing.
const REQUEST_MARGIN: usize = 64 * 1024;
/// Keys read per range request while loading.
const PAGE: i64 = 500;
/// How long a transaction is retried on transport errors (an etcd member down, an
/// etcd leader change) before the store counts as failed.
const RETRY_FOR: Duration = Duration::from_secs(5);
/// The schema version written to `meta/schema_version`.
const SCHEMA_VERSION: &str = "1";

/// The election key a leader's writes are conditioned on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// The leader's election key.
    pub key: Vec<u8>,
    /// Its create revision when this master was elected.
    pub revision: i64,
}

/// One write to etcd.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
enum Op {
    Put { key: String, value: String },
    Delete { key: String },
    DeletePrefix { prefix: String },
}

impl Op {
    fn size(&self) -> usize {
        32 + match self {
            Op::Put { key, value } => key.len() + value.len(),
            Op::Delete { key } => key.len(),
            Op::DeletePrefix { prefix } => 2 * prefix.len(),
        }
    }

    fn txn_op(&self) -> TxnOp {
        match self {
            Op::Put { key, value } => TxnOp::put(key.as_str(), value.as_str(), None),
            Op::Delete { key } => TxnOp::delete(key.as_str(), None),
            Op::DeletePrefix { prefix } => {
                TxnOp::delete(prefix.as_str(), Some(DeleteOptions::new().with_prefix()))
            }
        }
    }

    fn key(&self) -> &str {
        match self {
            Op::Put { key, .. } | Op::Delete { key } => key,
            Op::DeletePrefix { prefix } => prefix,
        }
    }
}

/// Keeps, of several writes of one key, only the last; drops writes a later prefix
/// delete covers. What is left conflicts only where a key is written after a prefix
/// delete that covers it (a job deleted and created again in one batch).
fn last_writes(ops: Vec<Op>) -> Vec<Op> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut prefixes: Vec<String> = Vec::new();
    let mut kept: Vec<Op> = Vec::with_capacity(ops.len());
    for op in ops.into_iter().rev() {
        match &op {
            Op::DeletePrefix { prefix } => {
                prefixes.push(prefix.clone());
                kept.push(op);
            }
            Op::Put { key, .. } | Op::Delete { key } => {
                if prefixes.iter().any(|p| key.starts_with(p.as_str())) || !seen.insert(key.clone())
                {
                    continue;
                }
                kept.push(op);
            }
        }
    }
    kept.reverse();
    kept
}

/// Splits `ops` into consecutive transactions within `limits` where no key is
/// written after a prefix delete covering it in the same transaction (etcd
/// refuses those).
fn groups(ops: &[Op], limits: Limits) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0usize, 0usize);
    let mut deleted: Vec<&str> = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        let covered = !matches!(op, Op::DeletePrefix { .. })
            && deleted.iter().any(|p| op.key().starts_with(p));
        let full = i - start >= limits.max_ops || bytes + op.size() > limits.max_bytes;
        if i > start && (covered || full) {
            out.push(start..i);
            start = i;
            bytes = 0;
            deleted.clear();
        }
        bytes += op.size();
        if let Op::DeletePrefix { prefix } = op {
            deleted.push(prefix);
        }
    }
    if start < ops.len() {
        out.push(start..ops.len());
    }
    out
}

/// A task config as stored (the key holds the job and hash only for uniqueness).
#[derive(Serialize, Deserialize)]
struct StoredConfig<S> {
    job: String,
    hash: String,
    spec: S,
    /// When it last became the job's newest config; 0 when stored before.
    #[serde(default)]
    used_ms: u64,
}

/// The `Store` in etcd.
pub struct EtcdStore {
    conn: Arc<EtcdConn>,
    prefix: String,
    fence: Option<Fence>,
    /// A standby's reader (`reader`): every write is refused before it is sent.
    read_only: bool,
}

impl EtcdStore {
    /// A store under [`PREFIX`]; with `fence`, every write is conditioned on it.
    pub fn new(conn: Arc<EtcdConn>, fence: Option<Fence>) -> EtcdStore {
        EtcdStore::with_prefix(conn, fence, PREFIX)
    }

    /// A store under another key prefix (tests, several clusters on one etcd).
    pub fn with_prefix(conn: Arc<EtcdConn>, fence: Option<Fence>, prefix: &str) -> EtcdStore {
        EtcdStore {
            conn,
            prefix: prefix.to_string(),
            fence,
            read_only: false,
        }
    }

    /// A store under [`PREFIX`] that only reads: a standby's copy of the state
    /// (`standby`) and its token registry. Every write is refused with
    /// [`StoreError::StandbyCopy`] and never reaches etcd.
    pub fn reader(conn: Arc<EtcdConn>) -> EtcdStore {
        EtcdStore {
            read_only: true,
            ..EtcdStore::new(conn, None)
        }
    }

    /// etcd's current revision (it moves with every write to the cluster).
    pub fn revision(&self) -> Result<i64, StoreError> {
        let mut client = self.conn.client();
        let key = self.key("meta", "index");
        let resp = self
            .conn
            .block(async move {
                client
                    .get(key, Some(GetOptions::new().with_count_only()))
                    .await
            })
            .map_err(etcd("read the revision"))?;
        Ok(resp.header().map(|h| h.revision()).unwrap_or(0))
    }

    /// Everything stored, read at one revision, without writing anything (unlike
    /// `load`, which finishes or drops a redo log first); None while a large
    /// commit's redo log is in the store (its rows may be half applied).
    pub fn read_snapshot(&self) -> Result<Option<(Snapshot, i64)>, StoreError> {
        let (kvs, revision) = self.range(&self.prefix, None)?;
        let redo = self.key("redo", "");
        if kvs.iter().any(|(k, _)| k.starts_with(&redo)) {
            return Ok(None);
        }
        Ok(Some((self.decode_rows(kvs)?, revision)))
    }

    fn key(&self, table: &str, id: &str) -> String {
        format!("{}{table}/{id}", self.prefix)
    }

    fn configs_of(&self, job: &str) -> String {
        format!("{}configs/{job}\u{0}", self.prefix)
    }

    fn ops(&self, changes: &[Change]) -> Result<Vec<Op>, StoreError> {
        let mut ops = Vec::with_capacity(changes.len());
        for c in changes {
            match write_of(c) {
                Write::Put(row) => {
                    let key = match row {
                        Row::Config { job, hash, .. } => format!("{}{hash}", self.configs_of(job)),
                        _ => self.key(row.table().segment(), row.key()),
                    };
                    let value = match row {
                        Row::Job {
                            key,
                            spec,
                            created_ms,
                        } => {
                            let record = JobRecord {
                                key: key.to_string(),
                                spec: spec.clone(),
                                created_ms,
                            };
                            encode("job", key, &record)?
                        }
                        Row::Config {
                            job,
                            hash,
                            spec,
                            used_ms,
                        } => {
                            let stored = StoredConfig {
                                job: job.to_string(),
                                hash: hash.to_string(),
                                spec,
                                used_ms,
                            };
                            encode("config", &format!("{job} {hash}"), &stored)?
                        }
                        Row::CronFired(_, at) => at.to_string(),
                        Row::Index(index) => index.to_string(),
                        _ => row.json()?.unwrap_or_default(),
                    };
                    ops.push(Op::Put { key, value });
                }
                Write::Delete(table, key) => ops.push(Op::Delete {
                    key: self.key(table.segment(), key),
                }),
                Write::DeleteConfig { job, hash } => ops.push(Op::Delete {
                    key: format!("{}{hash}", self.configs_of(job)),
                }),
                Write::DeleteJob(key) => {
                    ops.push(Op::Delete {
                        key: self.key(Table::Jobs.segment(), key),
                    });
                    for table in UNDER_A_JOB {
                        ops.push(Op::Delete {
                            key: self.key(table.segment(), key),
                        });
                    }
                    ops.push(Op::DeletePrefix {
                        prefix: self.configs_of(key),
                    });
                }
            }
        }
        Ok(last_writes(ops))
    }

    /// One transaction of `ops`, fenced; retried on transport errors.
    fn txn(&self, ops: &[Op]) -> Result<(), StoreError> {
        if self.read_only {
            return Err(StoreError::StandbyCopy);
        }
        let began = Instant::now();
        loop {
            let mut txn = Txn::new();
            if let Some(f) = &self.fence {
                txn = txn.when(vec![Compare::create_revision(
                    f.key.clone(),
                    CompareOp::Equal,
                    f.revision,
                )]);
            }
            let txn = txn.and_then(ops.iter().map(Op::txn_op).collect::<Vec<_>>());
            let mut client = self.conn.client();
            match self.conn.block(async move { client.txn(txn).await }) {
                Ok(resp) if resp.succeeded() => return Ok(()),
                Ok(_) => return Err(StoreError::Fenced),
                Err(e) if began.elapsed() < RETRY_FOR && retryable(&e) => {
                    tracing::debug!(error = %e, "etcd transaction failed; retrying");
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => return Err(etcd("commit")(e)),
            }
        }
    }

    /// Applies `ops` in as many transactions as the limits need.
    fn apply(&self, ops: &[Op]) -> Result<(), StoreError> {
        for range in groups(ops, self.conn.limits) {
            self.txn(&ops[range])?;
        }
        Ok(())
    }

    /// Writes `ops` through the redo log (see the module doc).
    fn commit_through_log(&self, ops: &[Op]) -> Result<(), StoreError> {
        let redo = self.key("redo", "");
        // JSON escaping at most doubles a value; keep each chunk within a request.
        let budget = self.conn.limits.max_bytes / 2 - 64;
        let mut chunks: Vec<Vec<&Op>> = vec![Vec::new()];
        let mut bytes = 0;
        for op in ops {
            let last = chunks.len() - 1;
            if !chunks[last].is_empty() && bytes + op.size() > budget {
                chunks.push(Vec::new());
                bytes = 0;
            }
            bytes += op.size();
            let last = chunks.len() - 1;
            chunks[last].push(op);
        }
        // A log left by a failed commit of this master is not committed: drop it.
        self.txn(&[Op::DeletePrefix {
            prefix: redo.clone(),
        }])?;
        for (n, chunk) in chunks.iter().enumerate() {
            let value = serde_json::to_string(chunk).map_err(|source| StoreError::Encode {
                what: "redo log",
                key: n.to_string(),
                source,
            })?;
            self.txn(&[Op::Put {
                key: format!("{redo}{n:08}"),
                value,
            }])?;
        }
        self.txn(&[Op::Put {
            key: format!("{redo}commit"),
            value: chunks.len().to_string(),
        }])?;
        self.apply(ops)?;
        self.txn(&[Op::DeletePrefix { prefix: redo }])
    }

    /// Finishes a committed redo log left by a master that stopped while applying
    /// it, or drops an uncommitted one.
    fn recover_log(&self) -> Result<(), StoreError> {
        let redo = self.key("redo", "");
        let kvs = self.range(&redo, None)?.0;
        if kvs.is_empty() {
            return Ok(());
        }
        let commit = format!("{redo}commit");
        if kvs.iter().any(|(k, _)| *k == commit) {
            let mut ops: Vec<Op> = Vec::new();
            for (key, value) in kvs.iter().filter(|(k, _)| *k != commit) {
                let chunk: Vec<Op> =
                    serde_json::from_str(value).map_err(|source| StoreError::Decode {
                        what: "redo log",
                        key: key.clone(),
                        source,
                    })?;
                ops.extend(chunk);
            }
            tracing::warn!(
                ops = ops.len(),
                "finishing a large commit left half-applied by the previous leader"
            );
            self.apply(&ops)?;
        } else {
            tracing::warn!("dropping an uncommitted redo log of the previous leader");
        }
        self.txn(&[Op::DeletePrefix { prefix: redo }])
    }

    /// Every key under `prefix` (pages of [`PAGE`] at one revision) as strings,
    /// and that revision (or `at`).
    fn range(
        &self,
        prefix: &str,
        at: Option<i64>,
    ) -> Result<(Vec<(String, String)>, i64), StoreError> {
        let end = prefix_end(prefix);
        let mut from = prefix.as_bytes().to_vec();
        let mut out = Vec::new();
        let mut revision = at.unwrap_or(0);
        loop {
            let mut client = self.conn.client();
            let mut options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(PAGE)
                .with_revision(revision);
            if revision == 0 {
                options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            }
            let key = from.clone();
            let resp = self
                .conn
                .block(async move { client.get(key, Some(options)).await })
                .map_err(etcd("load"))?;
            if revision == 0 {
                revision = resp.header().map(|h| h.revision()).unwrap_or(0);
            }
            for kv in resp.kvs() {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                let value =
                    String::from_utf8(kv.value().to_vec()).map_err(|_| StoreError::Etcd {
                        op: "load",
                        message: format!("the value of {key} is not UTF-8"),
                    })?;
                out.push((key, value));
            }
            match (resp.more(), resp.kvs().last()) {
                (true, Some(last)) => {
                    from = last.key().to_vec();
                    from.push(0);
                }
                _ => return Ok((out, revision)),
            }
        }
    }

    fn check_schema(&self) -> Result<(), StoreError> {
        let key = self.key("meta", "schema_version");
        let found = self.range(&key, None)?.0;
        match found.into_iter().find(|(k, _)| *k == key) {
            None => self.txn(&[Op::Put {
                key,
                value: SCHEMA_VERSION.to_string(),
            }]),
            Some((_, v)) if v == SCHEMA_VERSION => Ok(()),
            Some((_, v)) => Err(StoreError::Schema {
                found: v.parse().unwrap_or(-1),
            }),
        }
    }
}

/// Whether a failed request may succeed when sent again (transport trouble, an
/// etcd leader change) rather than being refused for good.
fn retryable(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => matches!(
            s.code(),
            tonic::Code::Unavailable
                | tonic::Code::DeadlineExceeded
                | tonic::Code::Unknown
                | tonic::Code::Aborted
        ),
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        _ => false,
    }
}

/// The end of the key range of every key starting with `prefix`.
fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn decode<T: serde::de::DeserializeOwned>(
    what: &'static str,
    key: &str,
    value: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(value).map_err(|source| StoreError::Decode {
        what,
        key: key.to_string(),
        source,
    })
}

impl Store for EtcdStore {
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        self.recover_log()?;
        self.check_schema()?;
        let (kvs, _) = self.range(&self.prefix, None)?;
        self.decode_rows(kvs)
    }

    fn commit(&mut self, changes: &[Change]) -> Result<(), StoreError> {
        let ops = self.ops(changes)?;
        if ops.is_empty() {
            return Ok(());
        }
        if groups(&ops, self.conn.limits).len() == 1 {
            self.txn(&ops)
        } else {
            self.commit_through_log(&ops)
        }
    }
}

impl EtcdStore {
    /// The snapshot of the rows under this store's prefix.
    fn decode_rows(&self, kvs: Vec<(String, String)>) -> Result<Snapshot, StoreError> {
        let mut snap = Snapshot::default();
        for (key, value) in kvs {
            let Some((table, id)) = key[self.prefix.len()..].split_once('/') else {
                continue;
            };
            match table {
                "jobs" => snap.jobs.push(decode::<JobRecord>("job", id, &value)?),
                "tasks" => snap.tasks.push(decode::<Task>("task", id, &value)?),
                "agents" => snap
                    .agents
                    .push(decode::<AgentRecord>("agent", id, &value)?),
                "quotas" => snap
                    .quotas
                    .push((id.to_string(), decode::<Usage>("quota", id, &value)?)),
                "user_grants" => snap.user_grants.push((
                    id.to_string(),
                    decode::<BTreeSet<String>>("user grants", id, &value)?,
                )),
                "cron_fired" => snap
                    .cron_fired
                    .push((id.to_string(), decode::<u64>("cron firing", id, &value)?)),
                "updates" => snap
                    .updates
                    .push(decode::<UpdateRecord>("update", id, &value)?),
                "configs" => {
                    let c: StoredConfig<_> = decode("config", id, &value)?;
                    snap.configs.push(ConfigRecord {
                        job: c.job,
                        hash: c.hash,
                        spec: c.spec,
                        used_ms: c.used_ms,
                    });
                }
                "meta" if id == "index" => snap.index = decode::<u64>("index", id, &value)?,
                _ => {}
            }
        }
        Ok(snap)
    }
}

/// Rows kept beside the core's (the token registry, the audit log: `etcd_auth`),
/// written through the same fenced, retried transactions.
impl EtcdStore {
    /// The key of row `id` of `table` under this store's prefix.
    pub(crate) fn row_key(&self, table: &str, id: &str) -> String {
        self.key(table, id)
    }

    /// The prefix of the audit log: beside the store's, not under it, so
    /// loading the store never reads the log (`/drover/` -> `/drover-audit/`).
    pub(crate) fn audit_prefix(&self) -> String {
        format!("{}-audit/", self.prefix.trim_end_matches('/'))
    }

    /// Every `(key, value)` whose key starts with `prefix`.
    pub(crate) fn rows(&self, prefix: &str) -> Result<Vec<(String, String)>, StoreError> {
        Ok(self.range(prefix, None)?.0)
    }

    /// Writes `puts` and deletes `deletes` (fenced), in as many transactions as
    /// the limits need (each row on its own is atomic).
    pub(crate) fn write_rows(
        &self,
        puts: Vec<(String, String)>,
        deletes: Vec<String>,
    ) -> Result<(), StoreError> {
        let mut ops: Vec<Op> = puts
            .into_iter()
            .map(|(key, value)| Op::Put { key, value })
            .collect();
        ops.extend(deletes.into_iter().map(|key| Op::Delete { key }));
        self.apply(&ops)
    }
}

/// Every stored row as changes: what `migrate` commits into the other store.
pub fn snapshot_changes(snap: Snapshot) -> Vec<Change> {
    let mut changes = Vec::new();
    for j in snap.jobs {
        changes.push(Change::PutJob(Arc::new(j.spec), j.key, j.created_ms));
    }
    for c in snap.configs {
        changes.push(Change::PutConfig {
            job: c.job,
            hash: c.hash,
            spec: Arc::new(c.spec),
            used_ms: c.used_ms,
        });
    }
    for u in snap.updates {
        changes.push(Change::PutUpdate(Arc::new(u)));
    }
    for t in snap.tasks {
        changes.push(Change::PutTask(Box::new(t)));
    }
    for a in snap.agents {
        changes.push(Change::PutAgent(Box::new(a)));
    }
    for (role, q) in snap.quotas {
        changes.push(Change::PutQuota(role, Some(q)));
    }
    for (role, users) in snap.user_grants {
        changes.push(Change::PutUserGrants(role, users));
    }
    for (job, at) in snap.cron_fired {
        changes.push(Change::PutCronFired(job, at));
    }
    changes.push(Change::Index(snap.index));
    changes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(k: &str) -> Op {
        Op::Put {
            key: k.into(),
            value: "v".into(),
        }
    }

    #[test]
    fn only_the_last_write_of_a_key_is_kept_and_a_later_prefix_delete_drops_earlier_puts() {
        let ops = vec![
            put("/t/a"),
            put("/c/j\u{0}h1"),
            Op::Delete { key: "/t/a".into() },
            Op::DeletePrefix {
                prefix: "/c/j\u{0}".into(),
            },
            put("/c/j\u{0}h2"),
            put("/t/b"),
            put("/t/b"),
        ];
        assert_eq!(
            last_writes(ops),
            vec![
                Op::Delete { key: "/t/a".into() },
                Op::DeletePrefix {
                    prefix: "/c/j\u{0}".into()
                },
                put("/c/j\u{0}h2"),
                put("/t/b"),
            ]
        );
    }

    #[test]
    fn transactions_are_cut_at_the_limits_and_where_a_put_follows_a_prefix_delete() {
        let limits = Limits {
            max_ops: 3,
            max_bytes: 1 << 20,
        };
        let ops: Vec<Op> = (0..7).map(|i| put(&format!("/t/{i}"))).collect();
        assert_eq!(groups(&ops, limits), vec![0..3, 3..6, 6..7]);
        let ops = vec![
            put("/t/a"),
            Op::DeletePrefix {
                prefix: "/c/j\u{0}".into(),
            },
            put("/c/j\u{0}h"),
        ];
        assert_eq!(groups(&ops, limits), vec![0..2, 2..3]);
        let small = Limits {
            max_ops: 100,
            max_bytes: 2 * put("/t/0").size(),
        };
        let ops: Vec<Op> = (0..5).map(|i| put(&format!("/t/{i}"))).collect();
        assert_eq!(groups(&ops, small), vec![0..2, 2..4, 4..5]);
        assert!(groups(&[], limits).is_empty());
    }

    #[test]
    fn etcds_space_exceeded_is_no_space_and_other_errors_are_not() {
        let full = etcd_client::Error::GRpcStatus(tonic::Status::resource_exhausted(
            "etcdserver: mvcc: database space exceeded",
        ));
        let e = etcd("commit")(full);
        assert!(e.is_no_space(), "{e}");
        assert!(e.to_string().contains("alarm disarm"), "{e}");
        let big = etcd_client::Error::GRpcStatus(tonic::Status::resource_exhausted(
            "grpc: received message larger than max",
        ));
        assert!(!etcd("commit")(big).is_no_space());
        let gone = etcd_client::Error::GRpcStatus(tonic::Status::unavailable("no leader"));
        assert!(!etcd("commit")(gone).is_no_space());
    }

    #[test]
    fn a_store_url_lists_members_and_tls_needs_a_ca() {
        let o = EtcdOptions::parse("etcd://10.0.0.1:2379, 10.0.0.2:2379", None, None, None)
            .expect("valid");
        assert_eq!(
            o.endpoints,
            vec!["http://10.0.0.1:2379", "http://10.0.0.2:2379"]
        );
        let o = EtcdOptions::parse("etcd://h:1", Some("ca.pem".into()), None, None).expect("tls");
        assert_eq!(o.endpoints, vec!["https://h:1"]);
        for bad in [
            "etcd://",
            "http://h:1",
            "etcd://h",
            "etcd://h:x",
            "etcd://h:1/p",
        ] {
            let e = EtcdOptions::parse(bad, None, None, None).expect_err(bad);
            assert_eq!(e.field, "store", "{bad}");
        }
        let e = EtcdOptions::parse("etcd://h:1", None, Some("c".into()), None).expect_err("key");
        assert_eq!(e.field, "etcd_key");
        let e = EtcdOptions::parse("etcd://h:1", None, Some("c".into()), Some("k".into()))
            .expect_err("ca");
        assert_eq!(e.field, "etcd_ca");
        assert_eq!(prefix_end("/drover/"), b"/drover0".to_vec());
    }
}
