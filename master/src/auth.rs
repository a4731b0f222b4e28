//! Who a request is and what it may do (pure, no I/O): bearer token text
//! (`drv_<id>_<secret>`), the hash stored in place of the secret, constant-time
//! comparison (the `subtle` crate), the kinds of token (admin, operator, job roles,
//! agent) and the permission each route needs. docs/auth.md describes the model.

pub use drover_common::wire::Grant;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The prefix of every token's text.
pub const TOKEN_PREFIX: &str = "drv_";
/// Hex digits of a token id (64 random bits).
pub const TOKEN_ID_LEN: usize = 16;
/// Hex digits of a token secret (256 random bits).
pub const TOKEN_SECRET_LEN: usize = 64;
/// The longest `Authorization` header read; anything longer is refused unread.
pub const MAX_AUTHORIZATION_LEN: usize = 256;

/// An authenticated caller: the token's id and what it grants.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    pub token_id: String,
    pub grant: Grant,
}

/// What a route needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Permission {
    /// Manage tokens (admin).
    ManageTokens,
    /// Override a safety of the master, e.g. release the eviction guard (admin).
    Override,
    /// Set the roles' production quotas (admin).
    ManageQuotas,
    /// Grant and revoke the users a role's tasks may run as (admin).
    ManageRoles,
    /// Remove or forbid agents (admin, operator).
    Maintenance,
    /// Read every job and agent (admin, operator).
    ReadAll,
    /// Read the jobs of one role (admin, operator, that role).
    ReadJob { role: String },
    /// Read the announced services of one role (admin, operator, that role,
    /// discovery).
    ReadServices { role: String },
    /// Create, kill or restart the jobs of one role (admin, that role).
    WriteJob { role: String },
    /// Act as this agent (the agent token bound to it; an unbound agent token gets
    /// bound by registering).
    Agent { agent_id: String },
}

impl std::fmt::Display for Permission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Permission::ManageTokens => write!(f, "tokens:manage (an admin token)"),
            Permission::Override => write!(f, "override (an admin token)"),
            Permission::ManageQuotas => write!(f, "quotas:manage (an admin token)"),
            Permission::ManageRoles => write!(f, "roles:manage (an admin token)"),
            Permission::Maintenance => write!(f, "maintenance (an admin or operator token)"),
            Permission::ReadAll => write!(f, "read:all (an admin or operator token)"),
            Permission::ReadJob { role } => {
                write!(f, "jobs:read for role {role} (a token of role {role}, an operator or admin token)")
            }
            Permission::ReadServices { role } => {
                write!(f, "jobs:read for role {role} (a token of role {role}, a discovery, operator or admin token)")
            }
            Permission::WriteJob { role } => {
                write!(
                    f,
                    "jobs:write for role {role} (a token of role {role} or an admin token)"
                )
            }
            Permission::Agent { agent_id } => {
                write!(
                    f,
                    "agent:{agent_id} (the agent token bound to agent {agent_id})"
                )
            }
        }
    }
}

impl Principal {
    /// Whether this caller holds `permission`.
    pub fn may(&self, permission: &Permission) -> bool {
        match (&self.grant, permission) {
            (Grant::Agent { agent_id }, Permission::Agent { agent_id: want }) => {
                agent_id.as_deref() == Some(want.as_str())
            }
            (Grant::Agent { .. }, _) | (_, Permission::Agent { .. }) => false,
            (Grant::Admin, _) => true,
            (Grant::Discovery, p) => matches!(p, Permission::ReadServices { .. }),
            (Grant::Operator, p) => matches!(
                p,
                Permission::Maintenance
                    | Permission::ReadAll
                    | Permission::ReadJob { .. }
                    | Permission::ReadServices { .. }
            ),
            (Grant::Roles { roles }, Permission::ReadJob { role })
            | (Grant::Roles { roles }, Permission::ReadServices { role })
            | (Grant::Roles { roles }, Permission::WriteJob { role }) => roles.contains(role),
            (Grant::Roles { .. }, _) => false,
        }
    }

    /// Whether this caller sees every job (else only those of its roles).
    pub fn reads_all(&self) -> bool {
        self.may(&Permission::ReadAll)
    }

    /// Whether `task.env` values of `role`'s jobs are shown to this caller: only to
    /// tokens of that role (admins and operators see the names, not the values).
    pub fn sees_secrets_of(&self, role: &str) -> bool {
        matches!(&self.grant, Grant::Roles { roles } if roles.iter().any(|r| r == role))
    }
}

/// How an agent that registers proves who it is.
#[derive(Clone, Copy, Debug)]
pub enum AgentProof<'a> {
    /// A client certificate (TLS), and whether it names the agent
    /// (`<id>.agent.drover`).
    Certificate { names_agent: bool },
    /// A token: its id and grant, and the live token the agent id is bound to, if
    /// any.
    Token {
        token_id: &'a str,
        grant: &'a Grant,
        owner: Option<&'a str>,
    },
}

/// What a registration that may go ahead still needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Registration {
    /// Nothing: the certificate names the agent, or the token is bound to it.
    Allowed,
    /// The token is an unbound agent token: it is bound to the agent id now.
    BindToken,
}

/// Why an agent may not register under an id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RegistrationRefused {
    /// An admin forbade the agent id.
    Forbidden,
    /// The credential is another agent's (a certificate naming another id, a token
    /// bound to another agent, a token that is no agent token), or another live
    /// token is bound to the id.
    Taken,
}

/// Who may register as which agent (pure): a certificate only as the agent it
/// names, then only if the id is not forbidden; a token, unless the id is
/// forbidden, as the agent it is bound to, or, unbound, as any agent no other live
/// token is bound to (binding it).
pub fn may_register_as(
    agent_id: &str,
    proof: AgentProof<'_>,
    forbidden: bool,
) -> Result<Registration, RegistrationRefused> {
    match proof {
        AgentProof::Certificate { names_agent: false } => Err(RegistrationRefused::Taken),
        AgentProof::Certificate { .. } if forbidden => Err(RegistrationRefused::Forbidden),
        AgentProof::Certificate { .. } => Ok(Registration::Allowed),
        AgentProof::Token { .. } if forbidden => Err(RegistrationRefused::Forbidden),
        AgentProof::Token {
            token_id,
            grant,
            owner,
        } => match grant {
            Grant::Agent {
                agent_id: Some(bound),
            } if bound == agent_id => Ok(Registration::Allowed),
            Grant::Agent { agent_id: None } if owner.is_none_or(|o| o == token_id) => {
                Ok(Registration::BindToken)
            }
            _ => Err(RegistrationRefused::Taken),
        },
    }
}

/// A new token's id and secret, and the text the caller keeps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewToken {
    pub id: String,
    /// SHA-256 of the secret, stored instead of it.
    pub hash: [u8; 32],
    /// `drv_<id>_<secret>`: shown once, never stored.
    pub text: String,
}

/// Why a token could not be made.
#[derive(Debug, thiserror::Error)]
#[error("no randomness from the operating system: {0}")]
pub struct NoRandomness(String);

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Makes a token from the operating system's randomness.
pub fn generate() -> Result<NewToken, NoRandomness> {
    let mut id = [0u8; TOKEN_ID_LEN / 2];
    let mut secret = [0u8; TOKEN_SECRET_LEN / 2];
    getrandom::fill(&mut id).map_err(|e| NoRandomness(e.to_string()))?;
    getrandom::fill(&mut secret).map_err(|e| NoRandomness(e.to_string()))?;
    let (id, secret) = (hex(&id), hex(&secret));
    Ok(NewToken {
        hash: hash_secret(&secret),
        text: format!("{TOKEN_PREFIX}{id}_{secret}"),
        id,
    })
}

/// SHA-256 of a secret's text.
pub fn hash_secret(secret: &str) -> [u8; 32] {
    Sha256::digest(secret.as_bytes()).into()
}

/// Whether `secret` hashes to `stored`, compared in constant time.
pub fn secret_matches(secret: &str, stored: &[u8; 32]) -> bool {
    hash_secret(secret).ct_eq(stored).into()
}

/// Why a credential was refused (401).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no token: send `Authorization: Bearer drv_...`; an admin creates one with `drover token create` (the first admin token is in the master's data dir, admin.token)")]
    Missing,
    #[error("the Authorization header is not `Bearer drv_<id>_<secret>`; get a token with `drover token create` from an admin")]
    Malformed,
    #[error("the Authorization header is longer than {MAX_AUTHORIZATION_LEN} bytes; a Drover token is {} characters", TOKEN_PREFIX.len() + TOKEN_ID_LEN + 1 + TOKEN_SECRET_LEN)]
    TooLong,
    #[error("unknown or revoked token; ask an admin for a new one (`drover token create`)")]
    Unknown,
    #[error("the agent API of this master needs a client certificate signed by the cluster CA: `drover tls issue agent NAME` (docs/auth.md)")]
    NoCertificate,
}

/// Splits an `Authorization` header value into the token's id and secret.
pub fn parse_bearer(header: Option<&[u8]>) -> Result<(&str, &str), AuthError> {
    let header = header.ok_or(AuthError::Missing)?;
    if header.len() > MAX_AUTHORIZATION_LEN {
        return Err(AuthError::TooLong);
    }
    let text = std::str::from_utf8(header).map_err(|_| AuthError::Malformed)?;
    let token = text
        .strip_prefix("Bearer ")
        .or_else(|| text.strip_prefix("bearer "))
        .ok_or(AuthError::Malformed)?
        .trim();
    parse_token(token)
}

/// Splits `drv_<id>_<secret>` into id and secret, checking their shape.
pub fn parse_token(token: &str) -> Result<(&str, &str), AuthError> {
    let rest = token
        .strip_prefix(TOKEN_PREFIX)
        .ok_or(AuthError::Malformed)?;
    let (id, secret) = rest.split_once('_').ok_or(AuthError::Malformed)?;
    let hex_of = |s: &str, len: usize| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    if !hex_of(id, TOKEN_ID_LEN) || !hex_of(secret, TOKEN_SECRET_LEN) {
        return Err(AuthError::Malformed);
    }
    Ok((id, secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(grant: Grant) -> Principal {
        Principal {
            token_id: "0".repeat(16),
            grant,
        }
    }

    #[test]
    fn tokens_round_trip_and_only_their_secret_matches() {
        let t = generate().unwrap();
        let (id, secret) = parse_token(&t.text).unwrap();
        assert_eq!(id, t.id);
        assert!(secret_matches(secret, &t.hash));
        let mut wrong = secret.to_string();
        wrong.replace_range(0..1, if wrong.starts_with('0') { "1" } else { "0" });
        assert!(!secret_matches(&wrong, &t.hash));
        assert_ne!(generate().unwrap().text, t.text);
    }

    #[test]
    fn the_comparison_is_subtle_constant_time_eq() {
        // The comparison is `subtle::ConstantTimeEq` on the two 32-byte digests (no
        // early exit on the first differing byte); this pins that choice.
        let stored = hash_secret("a");
        let choice: subtle::Choice = hash_secret("a").ct_eq(&stored);
        assert!(bool::from(choice));
        assert!(secret_matches("a", &stored));
    }

    #[test]
    fn bad_headers_say_what_is_wrong() {
        assert_eq!(parse_bearer(None), Err(AuthError::Missing));
        assert_eq!(parse_bearer(Some(b"Basic abc")), Err(AuthError::Malformed));
        assert_eq!(
            parse_bearer(Some(b"Bearer drv_zz_yy")),
            Err(AuthError::Malformed)
        );
        let long = format!("Bearer {}", "a".repeat(10_000));
        assert_eq!(parse_bearer(Some(long.as_bytes())), Err(AuthError::TooLong));
        let t = generate().unwrap();
        let header = format!("Bearer {}", t.text);
        assert_eq!(parse_bearer(Some(header.as_bytes())).unwrap().0, t.id);
        assert!(AuthError::Missing
            .to_string()
            .contains("drover token create"));
    }

    #[test]
    fn roles_grant_their_jobs_only() {
        let www = p(Grant::Roles {
            roles: vec!["www".into()],
        });
        let read = |r: &str| Permission::ReadJob { role: r.into() };
        let write = |r: &str| Permission::WriteJob { role: r.into() };
        assert!(www.may(&read("www")) && www.may(&write("www")));
        assert!(!www.may(&read("db")) && !www.may(&write("db")));
        assert!(!www.may(&Permission::ReadAll) && !www.may(&Permission::ManageTokens));
        let op = p(Grant::Operator);
        assert!(op.may(&read("db")) && op.may(&Permission::Maintenance));
        assert!(!op.may(&write("db")) && !op.may(&Permission::ManageTokens));
        let admin = p(Grant::Admin);
        assert!(admin.may(&write("db")) && admin.may(&Permission::ManageTokens));
        assert!(!admin.may(&Permission::Agent {
            agent_id: "a".into()
        }));
        assert!(www.sees_secrets_of("www") && !admin.sees_secrets_of("www"));
    }

    #[test]
    fn an_agent_token_acts_for_its_agent_only() {
        let bound = p(Grant::Agent {
            agent_id: Some("a1".into()),
        });
        let act = |a: &str| Permission::Agent { agent_id: a.into() };
        assert!(bound.may(&act("a1")));
        assert!(!bound.may(&act("a2")));
        assert!(!bound.may(&Permission::ReadAll));
        assert!(!bound.may(&Permission::ReadJob { role: "www".into() }));
        let unbound = p(Grant::Agent { agent_id: None });
        assert!(!unbound.may(&act("a2")), "bound by registering first");
        assert!(Permission::WriteJob { role: "db".into() }
            .to_string()
            .contains("role db"));
    }

    #[test]
    fn a_certificate_registers_only_as_the_agent_it_names_and_not_when_forbidden() {
        let cert = |names_agent| AgentProof::Certificate { names_agent };
        assert_eq!(
            may_register_as("a1", cert(true), false),
            Ok(Registration::Allowed)
        );
        assert_eq!(
            may_register_as("a1", cert(false), false),
            Err(RegistrationRefused::Taken)
        );
        assert_eq!(
            may_register_as("a1", cert(true), true),
            Err(RegistrationRefused::Forbidden)
        );
        // Another agent's certificate is refused as such, forbidden or not.
        assert_eq!(
            may_register_as("a1", cert(false), true),
            Err(RegistrationRefused::Taken)
        );
    }

    #[test]
    fn a_token_registers_as_its_bound_agent_or_binds_to_a_free_id() {
        let bound = Grant::Agent {
            agent_id: Some("a1".to_string()),
        };
        let unbound = Grant::Agent { agent_id: None };
        let others = [Grant::Admin, Grant::Operator];
        let token = |grant, owner| AgentProof::Token {
            token_id: "t1",
            grant,
            owner,
        };
        assert_eq!(
            may_register_as("a1", token(&bound, Some("t1")), false),
            Ok(Registration::Allowed)
        );
        assert_eq!(
            may_register_as("a2", token(&bound, None), false),
            Err(RegistrationRefused::Taken)
        );
        assert_eq!(
            may_register_as("a2", token(&unbound, None), false),
            Ok(Registration::BindToken)
        );
        // Its own earlier binding (a re-registration) does not stop it.
        assert_eq!(
            may_register_as("a2", token(&unbound, Some("t1")), false),
            Ok(Registration::BindToken)
        );
        assert_eq!(
            may_register_as("a2", token(&unbound, Some("t9")), false),
            Err(RegistrationRefused::Taken)
        );
        assert_eq!(
            may_register_as("a1", token(&bound, Some("t1")), true),
            Err(RegistrationRefused::Forbidden)
        );
        for grant in &others {
            assert_eq!(
                may_register_as("a1", token(grant, None), false),
                Err(RegistrationRefused::Taken)
            );
        }
    }
}
