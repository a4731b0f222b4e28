//! drover-common: the vocabulary every Drover process shares. The job spec and its
//! validation, templating, the task state machine and the wire messages. No I/O of
//! any kind: no tokio, no hyper, no nix, no files; the one thing read from outside is the
//! wall clock, in `state::now_ms`.

pub mod artifact;
pub mod configs;
pub mod cron;
pub mod layout;
#[cfg(feature = "metrics")]
pub mod metrics;
pub mod parse;
pub mod spec;
pub mod state;
mod suggest;
pub mod systemd;
pub mod template;
pub mod units;
pub mod validate;
pub mod wire;

pub use spec::{JobKey, JobSpec};
pub use state::{DesiredState, ExitReason, TaskState};
