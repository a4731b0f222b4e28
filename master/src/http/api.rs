//! What every handler of the API shares: the master, the token registry, the audit
//! log, the agents' log client and the admin rate bound.

use std::sync::Arc;

use crate::audit::Audit;
use crate::runtime::Master;
use crate::tokens::Tokens;

/// What every handler shares: the master, the token registry and the audit log.
pub struct Api {
    pub master: Arc<Master>,
    pub tokens: Arc<Tokens>,
    pub audit: Audit,
    /// The listener is TLS with the cluster CA: the agent API takes agents'
    /// client certificates only (no tokens).
    pub agent_certs: bool,
    /// The client of the agents' log servers.
    pub http: reqwest::Client,
    /// The admin API's per-token request rate bound.
    pub limiter: crate::ratelimit::RateLimiter,
}

pub type Shared = Arc<Api>;
