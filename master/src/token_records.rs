//! What the token registry holds, apart from where it is durable: a token's
//! record, the in-memory mirror, and the registry's error. `tokens` (the
//! registry, SQLite) and `etcd_auth` (its rows in etcd) both build on these, so
//! neither imports the other for them.

use std::collections::HashMap;
use std::path::PathBuf;

use crate::auth::{self, RegistrationRefused};

pub use drover_common::wire::TokenInfo;

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

impl TokenError {
    /// The error of a registration as agent `agent_id` that `may_register_as`
    /// refused.
    pub fn registration(refused: RegistrationRefused, agent_id: &str) -> TokenError {
        match refused {
            RegistrationRefused::Forbidden => TokenError::Forbidden(agent_id.to_string()),
            RegistrationRefused::Taken => TokenError::AgentTaken {
                agent_id: agent_id.to_string(),
            },
        }
    }
}

/// What the registry holds: tokens by id, forbidden agents (since when), agents'
/// log keys.
#[derive(Default)]
pub(crate) struct Mirror {
    pub(crate) tokens: HashMap<String, Entry>,
    pub(crate) forbidden: HashMap<String, u64>,
    pub(crate) log_keys: HashMap<String, String>,
}
