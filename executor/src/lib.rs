//! drover-executor: runs one Drover task (what Thermos is to Aurora). It builds the
//! sandbox and the task's cgroup, runs the processes with Thermos semantics, checks
//! their health, follows the kill escalation, checkpoints every status and serves it
//! on a Unix socket so that an agent can come and go.
//!
//! The decisions are pure ([`machine`], [`health::HealthTracker`]); [`runner`] does
//! the I/O around them.

pub mod cgroup;
pub mod child;
pub mod cleanup;
pub mod disk;
pub mod exec;
pub mod exit;
pub mod health;
pub mod hub;
pub mod machine;
pub mod ns;
pub mod plan;
pub mod portfwd;
pub mod quota;
pub mod resident;
pub mod runner;
pub mod sandbox;
pub mod spawn;
pub mod supervisor;
pub mod sys;
pub mod users;
pub mod zygote;

pub use runner::{run, Options, Usage};
