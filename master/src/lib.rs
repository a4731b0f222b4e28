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
mod guard;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod migrate;
pub mod proxy;
pub mod ratelimit;
pub mod runtime;
pub mod server;
pub mod standby;
pub mod store;
pub mod systemd;
pub mod tls;
pub mod tokens;
mod ui;

pub use config::{Args, Config, ConfigError};
pub use runtime::{Master, RunError};
pub use server::{run, serve, start, start_with, Handle};
