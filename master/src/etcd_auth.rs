//! The token registry and the audit log of masters on etcd, kept in the shared
//! store so every master sees the same: tokens under `<prefix>tokens/<id>` (the
//! hash of the secret in hex and the record), forbidden agents under
//! `<prefix>forbidden_agents/<id>` (since when, ms), agents' log keys under
//! `<prefix>agent_log_keys/<id>`, and audit records under the sibling prefix
//! `/drover-audit/` (one key per record, `<ts_ms>-<leader revision>-<n>`, the
//! JSON line as value). Every write goes through the store's fenced
//! transactions: a deposed leader writes neither tokens nor audit records.
//!
//! Audit records are written by a thread of their own in batches (one etcd
//! transaction for as many records as are queued), so a request never waits for
//! its record; a record that cannot be written (etcd down past the store's retry,
//! or this master deposed) is logged and dropped.

use std::collections::HashMap;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};

use serde::{Deserialize, Serialize};

use crate::etcd_store::EtcdStore;
use crate::store::StoreError;
use crate::token_records::{Entry, Mirror, TokenError, TokenInfo};

/// The registry's tables (as in SQLite).
const TOKENS: &str = "tokens";
const FORBIDDEN: &str = "forbidden_agents";
const LOG_KEYS: &str = "agent_log_keys";

/// One token as stored in etcd.
#[derive(Serialize, Deserialize)]
struct StoredToken {
    /// SHA-256 of the secret, hex.
    hash: String,
    record: TokenInfo,
}

/// The registry's rows in etcd.
pub struct EtcdTokens {
    store: EtcdStore,
}

impl EtcdTokens {
    /// The registry in `store` (its prefix and fence).
    pub fn new(store: EtcdStore) -> EtcdTokens {
        EtcdTokens { store }
    }

    fn table(&self, table: &str) -> String {
        self.store.row_key(table, "")
    }

    /// Every token, forbidden agent and log key.
    pub(crate) fn load(&self) -> Result<Mirror, TokenError> {
        let mut mirror = Mirror::default();
        let prefix = self.table(TOKENS);
        for (key, value) in self.store.rows(&prefix)? {
            let id = key[prefix.len()..].to_string();
            let decode = |message: String| TokenError::Decode {
                id: id.clone(),
                message,
            };
            let stored: StoredToken =
                serde_json::from_str(&value).map_err(|e| decode(e.to_string()))?;
            let hash = unhex(&stored.hash)
                .and_then(|h| <[u8; 32]>::try_from(h).ok())
                .ok_or_else(|| decode("the hash is not 32 bytes of hex".to_string()))?;
            mirror.tokens.insert(
                id,
                Entry {
                    hash,
                    info: stored.record,
                },
            );
        }
        let prefix = self.table(FORBIDDEN);
        for (key, value) in self.store.rows(&prefix)? {
            let since = value.parse::<u64>().unwrap_or(0);
            mirror
                .forbidden
                .insert(key[prefix.len()..].to_string(), since);
        }
        let prefix = self.table(LOG_KEYS);
        let log_keys: HashMap<String, String> = self
            .store
            .rows(&prefix)?
            .into_iter()
            .map(|(key, value)| (key[prefix.len()..].to_string(), value))
            .collect();
        mirror.log_keys = log_keys;
        Ok(mirror)
    }

    /// Writes a token (its record already JSON).
    pub(crate) fn put_token(
        &self,
        id: &str,
        hash: &[u8; 32],
        record: String,
    ) -> Result<(), StoreError> {
        // The record is embedded as JSON, not as a string holding JSON.
        let value = format!(
            "{{\"hash\":\"{}\",\"record\":{record}}}",
            crate::auth::hex(hash)
        );
        self.store
            .write_rows(vec![(self.store.row_key(TOKENS, id), value)], Vec::new())
    }

    /// Forbids an agent id.
    pub(crate) fn forbid(&self, agent_id: &str, since_ms: u64) -> Result<(), StoreError> {
        self.store.write_rows(
            vec![(
                self.store.row_key(FORBIDDEN, agent_id),
                since_ms.to_string(),
            )],
            Vec::new(),
        )
    }

    /// Allows a forbidden agent id again.
    pub(crate) fn allow(&self, agent_id: &str) -> Result<(), StoreError> {
        self.store
            .write_rows(Vec::new(), vec![self.store.row_key(FORBIDDEN, agent_id)])
    }

    /// Records an agent's log key.
    pub(crate) fn put_log_key(&self, agent_id: &str, key: &str) -> Result<(), StoreError> {
        self.store.write_rows(
            vec![(self.store.row_key(LOG_KEYS, agent_id), key.to_string())],
            Vec::new(),
        )
    }
}

fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(text.get(i..i + 2)?, 16).ok())
        .collect()
}

/// Audit records queued before new ones are dropped (etcd slower than requests).
const AUDIT_QUEUE: usize = 10_000;
/// Records written per etcd transaction at most.
const AUDIT_BATCH: usize = 100;

/// The audit log's etcd writer: records queued here are written in batches by
/// a thread that ends when this is dropped.
pub struct EtcdAudit {
    tx: SyncSender<(u64, String)>,
}

impl EtcdAudit {
    /// Starts the writer into `store`'s audit prefix; `term` (the leader's
    /// election revision) keeps keys of different leaders apart.
    pub fn start(store: EtcdStore, term: i64) -> std::io::Result<EtcdAudit> {
        let (tx, rx) = sync_channel(AUDIT_QUEUE);
        std::thread::Builder::new()
            .name("drover-audit".to_string())
            .spawn(move || write_audit(store, term, rx))?;
        Ok(EtcdAudit { tx })
    }

    /// Queues one record (its JSON line, without the newline).
    pub fn record(&self, ts_ms: u64, line: String) {
        match self.tx.try_send((ts_ms, line)) {
            Ok(()) => {}
            Err(TrySendError::Full((_, line))) => {
                tracing::error!(record = %line, "the audit log's etcd writer is behind: record dropped");
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// The writer thread: takes what is queued, writes it in one fenced batch.
fn write_audit(store: EtcdStore, term: i64, rx: Receiver<(u64, String)>) {
    let prefix = store.audit_prefix();
    let mut n: u64 = 0;
    while let Ok(first) = rx.recv() {
        let mut lines = vec![first];
        while lines.len() < AUDIT_BATCH {
            match rx.try_recv() {
                Ok(line) => lines.push(line),
                Err(_) => break,
            }
        }
        let puts: Vec<(String, String)> = lines
            .into_iter()
            .map(|(ts, line)| {
                n += 1;
                let k = n;
                (format!("{prefix}{ts:013}-{term}-{k:08}"), line)
            })
            .collect();
        let count = puts.len();
        if let Err(e) = store.write_rows(puts, Vec::new()) {
            tracing::error!(error = %e, records = count, "cannot write audit records to etcd: dropped");
        }
    }
}

/// Every audit record in `store` (JSON lines, oldest first): `migrate`.
pub fn read_audit(store: &EtcdStore) -> Result<Vec<String>, StoreError> {
    Ok(store
        .rows(&store.audit_prefix())?
        .into_iter()
        .map(|(_, line)| line)
        .collect())
}

/// Writes audit records (JSON lines with `ts_ms`) into `store`: `migrate`.
pub fn write_audit_lines(store: &EtcdStore, lines: &[String]) -> Result<(), StoreError> {
    let prefix = store.audit_prefix();
    let puts = lines
        .iter()
        .enumerate()
        .map(|(n, line)| {
            let ts = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["ts_ms"].as_u64())
                .unwrap_or(0);
            (format!("{prefix}{ts:013}-migrated-{n:08}"), line.clone())
        })
        .collect();
    store.write_rows(puts, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_bad_hex_is_refused() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&crate::auth::hex(&bytes)), Some(bytes));
        assert_eq!(unhex("abc"), None);
        assert_eq!(unhex("zz"), None);
    }
}
