//! drover-master: the cluster's brain. A pure core (jobs, tasks, agents, lifecycle
//! rules, reconciliation, the scheduler) driven by events, a SQLite store with group
//! commit, and a thin async runtime serving the admin and agent HTTP APIs.

pub mod config;
pub mod core;
pub mod http;
pub mod runtime;
pub mod store;

pub use config::{Args, Config, ConfigError};
pub use runtime::{run, serve, start, Handle, Master, RunError};
