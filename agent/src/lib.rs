//! drover-agent: one host of a Drover cluster. It registers with the master,
//! heartbeats, long-polls its assignment set and converges on it (the decisions are
//! pure, in `host` and `converge`; `runtime` carries them out), starts one
//! `drover-executor` per task and re-adopts them after a restart, relays every status
//! through a durable outbox, kills exclusive tasks when the master is gone past the
//! lease, collects old sandboxes and serves task logs. When the host itself shuts
//! down, it asks the master to drain it first.

pub mod artifacts;
pub mod cgroup;
pub mod config;
pub mod converge;
pub mod disk_quota;
pub mod exec;
pub mod executor;
pub mod host;
pub mod logs;
pub mod master;
pub mod metrics;
pub mod outbox;
pub mod runtime;
pub mod sandbox;
pub mod selfdrain;
mod sys;
pub mod systemd;
pub mod tls;
pub mod unpack;

pub use config::{Config, ConfigError, ConfigFile, HostFacts};
pub use converge::{converge, Action, LocalTask, LocalTasks};
pub use runtime::{run, AgentError};
