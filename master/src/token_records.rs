//! What the token registry holds, apart from where it is durable: a token's
//! record, the in-memory mirror, and the registry's error. `tokens` (the
//! registry, SQLite) and `etcd_auth` (its rows in etcd) both build on these, so
//! neither imports the other for them.

use std::collections::HashMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::auth::{self, Grant};

/// A token as listed: everything but its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenInfo {
    pub id: String,
    #[serde(flatten)]
    pub grant: Grant,
    /// Free text given at creation.
    #[serde(default)]
    pub description: String,
    pub created_ms: u64,
    /// The token id that created it (empty for the bootstrap token).
    #[serde(default)]
    pub created_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_ms: Option<u64>,
}

/// One token as stored: the hash of its secret and its record.
pub(crate) struct Entry {
    pub(crate) hash: [u8; 32],
    pub(crate) info: TokenInfo,
}

/// Why the registry failed.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error("token store: {op}: {source}")]
    Sql {
        op: &'static str,
        source: rusqlite::Error,
    },
    #[error("stored token {id} is not valid: {message}")]
    Decode { id: String, message: String },
    #[error(transparent)]
    Random(#[from] auth::NoRandomness),
    #[error("no token {0}; `drover token list` shows them")]
    NoToken(String),
    #[error(
        "agent {agent_id} is bound to another token; revoke that one first (`drover token list`)"
    )]
    AgentTaken { agent_id: String },
    #[error("agent {0} is forbidden; an admin allows it again with `drover agent allow {0}`")]
    Forbidden(String),
    #[error("cannot write the bootstrap token to {path}: {source}")]
    BootstrapFile {
        path: PathBuf,
        source: std::io::Error,
    },
    /// The etcd store refused or failed (a deposed leader's write is `Fenced`).
    #[error("token store: {0}")]
    Etcd(#[from] crate::store::StoreError),
}

/// What the registry holds: tokens by id, forbidden agents (since when), agents'
/// log keys.
#[derive(Default)]
pub(crate) struct Mirror {
    pub(crate) tokens: HashMap<String, Entry>,
    pub(crate) forbidden: HashMap<String, u64>,
    pub(crate) log_keys: HashMap<String, String>,
}
