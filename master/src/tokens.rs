//! The token registry: bearer tokens (only the SHA-256 of their secrets), forbidden
//! agent ids and the keys agents' log servers require from the master, durable in
//! the master's SQLite file (tables `tokens`, `forbidden_agents`, `agent_log_keys`,
//! on a connection of their own, apart from the core's store) or, for masters on
//! etcd, in the shared store (`etcd_auth`, written by the leader only, fenced),
//! and mirrored in memory so a request is checked without touching the disk. A
//! revocation is written, then applied to the mirror before it is answered: the next
//! request with that token is refused. A master on etcd loads the registry each
//! time it is elected, so a change made through any leader holds on every master
//! that leads later.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use rusqlite::{params, Connection};

use drover_os::fs::{write_private, Durability};

use crate::auth::{
    self, may_register_as, AgentProof, AuthError, Grant, NewToken, Principal, Registration,
};
pub(crate) use crate::token_records::{Entry, Mirror};

pub use crate::token_records::{TokenError, TokenInfo};

/// The bootstrap admin token's file inside the data dir (mode 0600).
pub const ADMIN_TOKEN_FILE: &str = "admin.token";

fn sql(op: &'static str) -> impl Fn(rusqlite::Error) -> TokenError {
    move |source| TokenError::Sql { op, source }
}

/// Where the registry is durable.
enum Backend {
    /// Tables in the master's SQLite file.
    Sqlite(Connection),
    /// Rows in the etcd store, beside the core's (masters on etcd).
    Etcd(crate::etcd_auth::EtcdTokens),
}

impl Backend {
    fn put_token(&self, hash: &[u8; 32], info: &TokenInfo) -> Result<(), TokenError> {
        let record = serde_json::to_string(info).map_err(|e| TokenError::Decode {
            id: info.id.clone(),
            message: e.to_string(),
        })?;
        match self {
            Backend::Sqlite(conn) => {
                conn.execute(
                    "INSERT OR REPLACE INTO tokens (id, hash, record) VALUES (?1, ?2, ?3)",
                    params![info.id, hash.as_slice(), record],
                )
                .map_err(sql("write token"))?;
            }
            Backend::Etcd(etcd) => etcd.put_token(&info.id, hash, record)?,
        }
        Ok(())
    }

    fn forbid(&self, agent_id: &str, since_ms: u64) -> Result<(), TokenError> {
        match self {
            Backend::Sqlite(conn) => {
                conn.execute(
                    "INSERT OR REPLACE INTO forbidden_agents (id, since_ms) VALUES (?1, ?2)",
                    params![agent_id, since_ms as i64],
                )
                .map_err(sql("forbid agent"))?;
            }
            Backend::Etcd(etcd) => etcd.forbid(agent_id, since_ms)?,
        }
        Ok(())
    }

    fn allow(&self, agent_id: &str) -> Result<(), TokenError> {
        match self {
            Backend::Sqlite(conn) => {
                conn.execute(
                    "DELETE FROM forbidden_agents WHERE id = ?1",
                    params![agent_id],
                )
                .map_err(sql("allow agent"))?;
            }
            Backend::Etcd(etcd) => etcd.allow(agent_id)?,
        }
        Ok(())
    }

    fn put_log_key(&self, agent_id: &str, key: &str) -> Result<(), TokenError> {
        match self {
            Backend::Sqlite(conn) => {
                conn.execute(
                    "INSERT OR REPLACE INTO agent_log_keys (id, key) VALUES (?1, ?2)",
                    params![agent_id, key],
                )
                .map_err(sql("write agent log key"))?;
            }
            Backend::Etcd(etcd) => etcd.put_log_key(agent_id, key)?,
        }
        Ok(())
    }
}

/// The registry: the mirror behind locks, the durable backend behind another.
pub struct Tokens {
    backend: Mutex<Backend>,
    entries: RwLock<HashMap<String, Entry>>,
    forbidden: RwLock<HashMap<String, u64>>,
    log_keys: RwLock<HashMap<String, String>>,
}

impl Tokens {
    /// Opens the tables in the SQLite file at `path` (creating them) and loads them.
    ///
    /// On a full disk (SQLite cannot grow the `-shm` file to open the store) the
    /// tables are read through an exclusive reader instead, and the connection is
    /// kept for the writes that work again once space is back.
    pub fn open(path: &Path) -> Result<Tokens, TokenError> {
        let connect = || {
            let conn = Connection::open(path).map_err(sql("open"))?;
            conn.busy_timeout(std::time::Duration::from_secs(10))
                .map_err(sql("open"))?;
            Ok::<_, TokenError>(conn)
        };
        let mut conn = connect()?;
        let mirror = match Tokens::load(&conn, true) {
            Err(TokenError::Sql { source, .. }) if crate::store::sqlite_no_space(&source) => {
                // The failed connection may still hold a shared lock.
                drop(conn);
                let reader = crate::store::exclusive_reader(path).map_err(sql("open"))?;
                let mirror = Tokens::load(&reader, false)?;
                drop(reader);
                // Opened lazily: its first write, once space is back, opens the store.
                conn = connect()?;
                mirror
            }
            other => other?,
        };
        Ok(Tokens::with(Backend::Sqlite(conn), mirror))
    }

    /// Loads the registry from the etcd store (a master on etcd, once elected;
    /// `migrate`).
    pub fn open_etcd(store: crate::etcd_store::EtcdStore) -> Result<Tokens, TokenError> {
        let etcd = crate::etcd_auth::EtcdTokens::new(store);
        let mirror = etcd.load()?;
        Ok(Tokens::with(Backend::Etcd(etcd), mirror))
    }

    fn with(backend: Backend, mirror: Mirror) -> Tokens {
        Tokens {
            backend: Mutex::new(backend),
            entries: RwLock::new(mirror.tokens),
            forbidden: RwLock::new(mirror.forbidden),
            log_keys: RwLock::new(mirror.log_keys),
        }
    }

    /// Writes every token, forbidden agent and log key of `from` into this
    /// registry (same ids replaced; `migrate`); how many tokens were copied.
    pub fn copy_from(&self, from: &Tokens) -> Result<usize, TokenError> {
        let backend = self.backend();
        let tokens: Vec<([u8; 32], TokenInfo)> = from
            .read()
            .values()
            .map(|e| (e.hash, e.info.clone()))
            .collect();
        for (hash, info) in &tokens {
            backend.put_token(hash, info)?;
        }
        let forbidden = from
            .forbidden
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (id, since) in &forbidden {
            backend.forbid(id, *since)?;
        }
        let log_keys = from
            .log_keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        for (id, key) in &log_keys {
            backend.put_log_key(id, key)?;
        }
        let mut entries = self.write();
        for (hash, info) in tokens.iter().cloned() {
            entries.insert(info.id.clone(), Entry { hash, info });
        }
        drop(entries);
        self.forbidden
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .extend(forbidden);
        self.log_keys
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .extend(log_keys);
        Ok(tokens.len())
    }

    /// The tables' content (creating them first when `create`).
    fn load(conn: &Connection, create: bool) -> Result<Mirror, TokenError> {
        if create {
            Tokens::create_tables(conn)?;
        }
        Tokens::read_tables(conn)
    }

    fn create_tables(conn: &Connection) -> Result<(), TokenError> {
        conn.execute_batch(
            "CREATE TABLE IF NOT EXISTS tokens (
                id TEXT PRIMARY KEY, hash BLOB NOT NULL, record TEXT NOT NULL);
             CREATE TABLE IF NOT EXISTS forbidden_agents (
                id TEXT PRIMARY KEY, since_ms INTEGER NOT NULL);
             CREATE TABLE IF NOT EXISTS agent_log_keys (
                id TEXT PRIMARY KEY, key TEXT NOT NULL);",
        )
        .map_err(sql("create tables"))
    }

    fn read_tables(conn: &Connection) -> Result<Mirror, TokenError> {
        let mut entries = HashMap::new();
        {
            let mut stmt = conn
                .prepare("SELECT id, hash, record FROM tokens")
                .map_err(sql("load tokens"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, Vec<u8>>(1)?,
                        r.get::<_, String>(2)?,
                    ))
                })
                .map_err(sql("load tokens"))?;
            for row in rows {
                let (id, hash, record) = row.map_err(sql("load tokens"))?;
                let decode = |message: String| TokenError::Decode {
                    id: id.clone(),
                    message,
                };
                let hash: [u8; 32] = hash
                    .try_into()
                    .map_err(|_| decode("the hash is not 32 bytes".to_string()))?;
                let info: TokenInfo =
                    serde_json::from_str(&record).map_err(|e| decode(e.to_string()))?;
                entries.insert(id, Entry { hash, info });
            }
        }
        let forbidden = {
            let mut stmt = conn
                .prepare("SELECT id, since_ms FROM forbidden_agents")
                .map_err(sql("load forbidden agents"))?;
            let rows = stmt
                .query_map([], |r| {
                    Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64))
                })
                .map_err(sql("load forbidden agents"))?;
            rows.collect::<Result<HashMap<_, _>, _>>()
                .map_err(sql("load forbidden agents"))?
        };
        let log_keys = {
            let mut stmt = conn
                .prepare("SELECT id, key FROM agent_log_keys")
                .map_err(sql("load agent log keys"))?;
            let rows = stmt
                .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)))
                .map_err(sql("load agent log keys"))?;
            rows.collect::<Result<HashMap<_, _>, _>>()
                .map_err(sql("load agent log keys"))?
        };
        Ok(Mirror {
            tokens: entries,
            forbidden,
            log_keys,
        })
    }

    fn backend(&self) -> std::sync::MutexGuard<'_, Backend> {
        self.backend.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<String, Entry>> {
        self.entries.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<String, Entry>> {
        self.entries.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Who holds the token in this `Authorization` header.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<Principal, AuthError> {
        let (id, secret) = auth::parse_bearer(header)?;
        let entries = self.read();
        let entry = entries.get(id).ok_or(AuthError::Unknown)?;
        if !auth::secret_matches(secret, &entry.hash) || entry.info.revoked_ms.is_some() {
            return Err(AuthError::Unknown);
        }
        Ok(Principal {
            token_id: entry.info.id.clone(),
            grant: entry.info.grant.clone(),
        })
    }

    /// Creates a token; its text is returned once and never stored.
    pub fn create(
        &self,
        grant: Grant,
        description: String,
        created_by: &str,
        now_ms: u64,
    ) -> Result<(TokenInfo, String), TokenError> {
        let NewToken { id, hash, text } = auth::generate()?;
        let info = TokenInfo {
            id: id.clone(),
            grant,
            description,
            created_ms: now_ms,
            created_by: created_by.to_string(),
            revoked_ms: None,
        };
        self.backend().put_token(&hash, &info)?;
        self.write().insert(
            id,
            Entry {
                hash,
                info: info.clone(),
            },
        );
        Ok((info, text))
    }

    /// Every token, without secrets, oldest first.
    pub fn list(&self) -> Vec<TokenInfo> {
        let mut out: Vec<TokenInfo> = self.read().values().map(|e| e.info.clone()).collect();
        out.sort_by(|a, b| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
        out
    }

    /// Revokes a token: refused from the moment this returns.
    pub fn revoke(&self, id: &str, now_ms: u64) -> Result<TokenInfo, TokenError> {
        let backend = self.backend();
        let (hash, mut info) = {
            let entries = self.read();
            let e = entries
                .get(id)
                .ok_or_else(|| TokenError::NoToken(id.to_string()))?;
            (e.hash, e.info.clone())
        };
        if info.revoked_ms.is_none() {
            info.revoked_ms = Some(now_ms);
            backend.put_token(&hash, &info)?;
            if let Some(e) = self.write().get_mut(id) {
                e.info.revoked_ms = info.revoked_ms;
            }
        }
        Ok(info)
    }

    /// The live token bound to `agent_id`, if one.
    fn owner_of(&self, agent_id: &str) -> Option<String> {
        self.read()
            .values()
            .find(|e| {
                e.info.revoked_ms.is_none()
                    && matches!(&e.info.grant, Grant::Agent { agent_id: Some(a) } if a == agent_id)
            })
            .map(|e| e.info.id.clone())
    }

    /// Binds an agent token to `agent_id` at registration: Ok if it is (now) bound
    /// to it, Err if it is bound to another agent, the agent id belongs to another
    /// live token, or the agent is forbidden.
    pub fn bind_agent(&self, principal: &Principal, agent_id: &str) -> Result<(), TokenError> {
        let owner = self.owner_of(agent_id);
        let proof = AgentProof::Token {
            token_id: &principal.token_id,
            grant: &principal.grant,
            owner: owner.as_deref(),
        };
        match may_register_as(agent_id, proof, self.is_forbidden(agent_id)) {
            Ok(Registration::Allowed) => return Ok(()),
            Ok(Registration::BindToken) => {}
            Err(refused) => return Err(TokenError::registration(refused, agent_id)),
        }
        let backend = self.backend();
        let (hash, mut info) = {
            let entries = self.read();
            let e = entries
                .get(&principal.token_id)
                .ok_or_else(|| TokenError::NoToken(principal.token_id.clone()))?;
            (e.hash, e.info.clone())
        };
        // The stored grant again: the token may have been bound since it was read.
        let stored = AgentProof::Token {
            token_id: &principal.token_id,
            grant: &info.grant,
            owner: None,
        };
        match may_register_as(agent_id, stored, false) {
            Ok(Registration::Allowed) => return Ok(()),
            Ok(Registration::BindToken) => {}
            Err(refused) => return Err(TokenError::registration(refused, agent_id)),
        }
        info.grant = Grant::Agent {
            agent_id: Some(agent_id.to_string()),
        };
        backend.put_token(&hash, &info)?;
        if let Some(e) = self.write().get_mut(&principal.token_id) {
            e.info.grant = info.grant;
        }
        Ok(())
    }

    /// Records the key agent `agent_id`'s log server requires (sent at registration).
    pub fn set_log_key(&self, agent_id: &str, key: &str) -> Result<(), TokenError> {
        let unchanged = self
            .log_keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(agent_id)
            .is_some_and(|k| k == key);
        if unchanged {
            return Ok(());
        }
        self.backend().put_log_key(agent_id, key)?;
        self.log_keys
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(agent_id.to_string(), key.to_string());
        Ok(())
    }

    /// The key agent `agent_id`'s log server requires, if it sent one.
    pub fn log_key(&self, agent_id: &str) -> Option<String> {
        self.log_keys
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(agent_id)
            .cloned()
    }

    /// Whether an agent id is forbidden.
    pub fn is_forbidden(&self, agent_id: &str) -> bool {
        self.forbidden
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(agent_id)
    }

    /// Forbids an agent id and revokes the tokens bound to it; returns their ids.
    pub fn forbid_agent(&self, agent_id: &str, now_ms: u64) -> Result<Vec<String>, TokenError> {
        self.backend().forbid(agent_id, now_ms)?;
        self.forbidden
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(agent_id.to_string(), now_ms);
        let bound: Vec<String> = self
            .read()
            .values()
            .filter(|e| {
                e.info.revoked_ms.is_none()
                    && matches!(&e.info.grant, Grant::Agent { agent_id: Some(a) } if a == agent_id)
            })
            .map(|e| e.info.id.clone())
            .collect();
        for id in &bound {
            self.revoke(id, now_ms)?;
        }
        Ok(bound)
    }

    /// Allows a forbidden agent id again (it needs a new agent token).
    pub fn allow_agent(&self, agent_id: &str) -> Result<bool, TokenError> {
        let backend = self.backend();
        if !self.is_forbidden(agent_id) {
            return Ok(false);
        }
        backend.allow(agent_id)?;
        self.forbidden
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(agent_id);
        Ok(true)
    }

    /// At the first start (no token at all), creates an admin token and writes its
    /// text to `<data_dir>/admin.token`, mode 0600. Later starts leave it alone.
    pub fn bootstrap(&self, data_dir: &Path, now_ms: u64) -> Result<Option<PathBuf>, TokenError> {
        if !self.read().is_empty() {
            return Ok(None);
        }
        let path = data_dir.join(ADMIN_TOKEN_FILE);
        let (_, text) = self.create(
            Grant::Admin,
            "bootstrap admin token".to_string(),
            "",
            now_ms,
        )?;
        write_private(&path, format!("{text}\n").as_bytes(), Durability::Synced).map_err(
            |source| TokenError::BootstrapFile {
                path: path.clone(),
                source,
            },
        )?;
        Ok(Some(path))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn header(text: &str) -> Vec<u8> {
        format!("Bearer {text}").into_bytes()
    }

    #[test]
    fn tokens_survive_a_reopen_and_revocation_is_immediate() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("drover.db");
        let tokens = Tokens::open(&db).unwrap();
        let path = tokens.bootstrap(dir.path(), 1).unwrap().unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let admin = std::fs::read_to_string(&path).unwrap();
        assert_eq!(
            tokens
                .authenticate(Some(&header(admin.trim())))
                .unwrap()
                .grant,
            Grant::Admin
        );
        let (info, text) = tokens
            .create(
                Grant::Roles {
                    roles: vec!["www".into()],
                },
                String::new(),
                "x",
                2,
            )
            .unwrap();
        let stored: Vec<u8> = Connection::open(&db)
            .unwrap()
            .query_row("SELECT hash FROM tokens WHERE id = ?1", [&info.id], |r| {
                r.get(0)
            })
            .unwrap();
        let (_, secret) = auth::parse_token(&text).unwrap();
        assert_ne!(stored, secret.as_bytes(), "only the hash is stored");
        drop(tokens);
        let tokens = Tokens::open(&db).unwrap();
        assert!(tokens.bootstrap(dir.path(), 3).unwrap().is_none());
        assert!(tokens.authenticate(Some(&header(&text))).is_ok());
        tokens.revoke(&info.id, 4).unwrap();
        assert_eq!(
            tokens.authenticate(Some(&header(&text))),
            Err(AuthError::Unknown)
        );
        drop(tokens);
        let tokens = Tokens::open(&db).unwrap();
        assert_eq!(
            tokens.authenticate(Some(&header(&text))),
            Err(AuthError::Unknown)
        );
    }

    #[test]
    fn an_agent_token_binds_to_one_agent_id() {
        let dir = tempfile::tempdir().unwrap();
        let tokens = Tokens::open(&dir.path().join("drover.db")).unwrap();
        let (_, a) = tokens
            .create(Grant::Agent { agent_id: None }, String::new(), "", 1)
            .unwrap();
        let (_, b) = tokens
            .create(Grant::Agent { agent_id: None }, String::new(), "", 1)
            .unwrap();
        let pa = tokens.authenticate(Some(&header(&a))).unwrap();
        let pb = tokens.authenticate(Some(&header(&b))).unwrap();
        tokens.bind_agent(&pa, "agent-a").unwrap();
        assert!(tokens.bind_agent(&pb, "agent-a").is_err(), "taken by a");
        let pa = tokens.authenticate(Some(&header(&a))).unwrap();
        assert!(tokens.bind_agent(&pa, "agent-b").is_err(), "a is bound");
        tokens.bind_agent(&pb, "agent-b").unwrap();
        let revoked = tokens.forbid_agent("agent-b", 2).unwrap();
        assert_eq!(revoked.len(), 1);
        assert!(tokens.authenticate(Some(&header(&b))).is_err());
        let (_, c) = tokens
            .create(Grant::Agent { agent_id: None }, String::new(), "", 3)
            .unwrap();
        let pc = tokens.authenticate(Some(&header(&c))).unwrap();
        assert!(matches!(
            tokens.bind_agent(&pc, "agent-b"),
            Err(TokenError::Forbidden(_))
        ));
        assert!(tokens.allow_agent("agent-b").unwrap());
        tokens.bind_agent(&pc, "agent-b").unwrap();
    }
}
