//! The audit log: one JSON line per mutating admin request (who, what, when,
//! result) appended to `<data_dir>/audit.log` (or, for masters on etcd, written
//! to the shared store by `etcd_auth`) and echoed to the log under the
//! `drover_master::audit` target. docs/auth.md describes the fields.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::Serialize;

use crate::auth::Principal;

/// The audit log file's name inside the data dir.
pub const AUDIT_FILE: &str = "audit.log";

/// One line of the audit log.
#[derive(Debug, Serialize)]
struct Line<'a> {
    ts_ms: u64,
    token_id: &'a str,
    grant: String,
    method: &'a str,
    path: &'a str,
    status: u16,
    /// The command line of an exec (`drover task exec`).
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<&'a [String]>,
}

/// The append-only audit log.
pub struct Audit {
    path: PathBuf,
    file: Mutex<Option<std::fs::File>>,
    /// Masters on etcd: the records go there instead of the file.
    etcd: Option<crate::etcd_auth::EtcdAudit>,
}

impl Audit {
    /// Opens (creating, mode 0600) `<data_dir>/audit.log` for appending.
    pub fn open(data_dir: &Path) -> std::io::Result<Audit> {
        use std::os::unix::fs::OpenOptionsExt as _;
        let path = data_dir.join(AUDIT_FILE);
        let file = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)?;
        Ok(Audit {
            path,
            file: Mutex::new(Some(file)),
            etcd: None,
        })
    }

    /// The audit log in the etcd store (masters on etcd; see `etcd_auth`).
    pub fn etcd(audit: crate::etcd_auth::EtcdAudit) -> Audit {
        Audit {
            path: PathBuf::from("/drover-audit/ (etcd)"),
            file: Mutex::new(None),
            etcd: Some(audit),
        }
    }

    /// No log: for a standby's copy of the state, which answers reads only
    /// (reads are not audited).
    pub fn discard() -> Audit {
        Audit {
            path: PathBuf::from("(none: a standby's copy)"),
            file: Mutex::new(None),
            etcd: None,
        }
    }

    /// Appends one request's line (a failed write is logged, never fatal).
    pub fn record(&self, who: &Principal, method: &str, path: &str, status: u16) {
        self.record_command(who, method, path, status, None);
    }

    /// Appends one request's line with the command line it ran (an exec).
    pub fn record_command(
        &self,
        who: &Principal,
        method: &str,
        path: &str,
        status: u16,
        command: Option<&[String]>,
    ) {
        let line = Line {
            ts_ms: drover_common::state::now_ms(),
            token_id: &who.token_id,
            grant: who.grant.describe(),
            method,
            path,
            status,
            command,
        };
        tracing::info!(target: "drover_master::audit", token = %line.token_id, grant = %line.grant, method, path, status, ?command, "audit");
        let Ok(mut text) = serde_json::to_string(&line) else {
            return;
        };
        if let Some(etcd) = &self.etcd {
            etcd.record(line.ts_ms, text);
            return;
        }
        text.push('\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = file.as_mut() {
            if let Err(e) = f.write_all(text.as_bytes()) {
                tracing::error!(path = %self.path.display(), error = %e, "cannot append to the audit log");
            }
        }
    }
}
