//! drover-master: the cluster's brain. A pure core (jobs, tasks, agents, lifecycle
//! rules, reconciliation, the scheduler) driven by events, a SQLite store with group
//! commit, a thin async runtime, and the admin and agent HTTP APIs behind bearer
//! tokens with per-role permissions.

pub mod announce_etcd;
pub mod audit;
pub mod auth;
pub mod config;
pub mod core;
pub mod dns;
pub mod etcd_auth;
pub mod etcd_store;
pub mod ha;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod migrate;
pub mod open;
pub mod proxy;
pub mod ratelimit;
pub mod runtime;
pub mod server;
pub mod standby;
pub mod store;
pub mod systemd;
pub mod tls;
mod token_records;
pub mod tokens;
mod ui;

pub use config::{Args, Config, ConfigError};
pub use open::{start, start_with, Handle};
pub use runtime::{Master, RunError};
pub use server::serve;

/// Runs a master until `shutdown`: on etcd one of several (`leader`: standby,
/// leader when elected), else the only one (`open::run_single`).
pub async fn run(
    config: Config,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), RunError> {
    match &config.store {
        config::StoreChoice::Etcd(options) => {
            let options = options.clone();
            leader::run(config, options, shutdown).await
        }
        config::StoreChoice::Sqlite => open::run_single(config, shutdown).await,
    }
}
