//! The core's vocabulary with the runtime: the [`Event`]s it reacts to, the
//! [`Reply`] or [`CoreError`] for the sender, and the [`Effect`]s (store changes,
//! agent wake-ups, the next timer) the runtime carries out.

use std::collections::BTreeSet;
use std::sync::Arc;

use drover_common::spec::JobSpec;
use drover_common::state::{MonoMillis, UnixMillis};
use drover_common::wire::{
    ActionResponse, ClusterView, HeartbeatRequest, HeartbeatResponse, QuotaView, RegisterRequest,
    RegisterResponse, RoleView, StatusAck, StatusUpdate, UpdateView,
};

use super::cron::CronSpecError;
use super::quota::Usage;
use drover_common::wire::{HostView, MaintenanceMode};

use super::maintenance::MaintenanceOp;
use super::{AgentRecord, Task, UpdateRecord};

/// One change for the store.
#[derive(Clone, Debug)]
pub enum Change {
    PutJob(Arc<JobSpec>, String, UnixMillis),
    DeleteJob(String),
    PutTask(Box<Task>),
    DeleteTask(String),
    PutAgent(Box<AgentRecord>),
    /// A role's quota set (Some) or removed (None).
    PutQuota(String, Option<Usage>),
    /// The users granted to a role now (empty: none, the row goes).
    PutUserGrants(String, BTreeSet<String>),
    /// The cron job's last scheduled firing handled (wall clock).
    PutCronFired(String, UnixMillis),
    /// The number of the last batch in this commit (added by the store's writer, not
    /// the core): a restarted master goes on numbering from it, so the change
    /// stream's index never repeats.
    Index(u64),
    /// One task config of a job, by its hash; `used_ms`: when it last became the
    /// job's newest config (wall clock; orders the configs kept for history).
    PutConfig {
        job: String,
        hash: String,
        spec: Arc<JobSpec>,
        used_ms: UnixMillis,
    },
    /// A task config of a job that is no longer kept (see `config_history`).
    DeleteConfig {
        job: String,
        hash: String,
    },
    /// A job's update record (the whole record, replacing the stored one).
    PutUpdate(Arc<UpdateRecord>),
}

/// What the core reacts to.
#[derive(Clone, Debug)]
pub enum Event {
    /// POST /v1/jobs (the spec is already validated).
    CreateJob(Box<JobSpec>),
    /// POST .../kill; `None`: every instance.
    Kill {
        job: String,
        instances: Option<Vec<u32>>,
    },
    /// POST .../restart; `None`: every instance.
    Restart {
        job: String,
        instances: Option<Vec<u32>>,
    },
    /// POST .../restart of a whole job, rolling (`restart.rs`); `user` asked.
    RollingRestart {
        job: String,
        user: String,
    },
    Register(Box<RegisterRequest>),
    Heartbeat {
        agent: String,
        request: HeartbeatRequest,
    },
    /// Status reports relayed by an agent (POST /v1/agents/{id}/updates), in order.
    StatusReports {
        agent: String,
        reports: Vec<StatusUpdate>,
    },
    /// POST .../update: roll the job (or `instances` of it) onto `spec`.
    StartUpdate {
        job: String,
        spec: Box<JobSpec>,
        instances: Option<Vec<u32>>,
        user: String,
    },
    /// POST .../update/{pause,resume,abort,rollback}.
    UpdateAction {
        job: String,
        action: UpdateAction,
    },
    /// POST /v1/hosts/{cordon,drain,activate}: hosts by agent id or host name.
    Maintenance {
        op: MaintenanceOp,
        hosts: Vec<String>,
    },
    /// Time passed: fire due timers.
    Tick,
    /// An operator releases the eviction guard (POST
    /// /v1/cluster/eviction-guard/release): the agents lost so far are handled
    /// as ordinary losses, at the loss rate.
    ReleaseEvictionGuard,
    /// POST /v1/quotas/{role}: set (Some) or remove (None) the role's quota.
    SetQuota {
        role: String,
        quota: Option<Usage>,
    },
    /// POST /v1/roles/{role}/grant-user (`granted`) or .../revoke-user.
    SetUserGrant {
        role: String,
        user: String,
        granted: bool,
    },
    /// POST /v1/cron/{key}/start: a run of the cron job now.
    CronStart {
        job: String,
    },
    /// POST /v1/cron/{key}/deschedule: no more firings.
    CronDeschedule {
        job: String,
    },
}

/// What an operator asks of a running update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateAction {
    /// Start no new batch; the instances in flight finish.
    Pause,
    /// Go on in the direction it was going.
    Resume,
    /// Stop here, leaving every instance on the config it runs.
    Abort,
    /// Put every instance it touched back, in reverse order.
    Rollback,
}

/// The answer to the event's sender.
#[derive(Clone, Debug, PartialEq)]
pub enum Reply {
    None,
    JobCreated {
        job: String,
        tasks: Vec<String>,
    },
    Action(ActionResponse),
    Registered(RegisterResponse),
    Heartbeat(HeartbeatResponse),
    Ack(StatusAck),
    Update(Box<UpdateView>),
    /// The hosts a maintenance request named, as they are now.
    Hosts(Vec<HostView>),
    /// The cluster and its eviction guard after the event.
    Cluster(ClusterView),
    /// A role's quota after the event.
    Quota(QuotaView),
    /// A role's users after the event.
    Role(RoleView),
}

/// Why the core refused an event.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CoreError {
    #[error(
        "job {0} exists and has tasks that are not terminal; kill it first or pick another name"
    )]
    JobExists(String),
    #[error("no job {0}")]
    NoJob(String),
    #[error("instances {bad:?} do not exist: job {job} has instances 0-{last}")]
    BadInstances {
        job: String,
        bad: Vec<u32>,
        last: u32,
    },
    #[error("unknown agent {0}: register first")]
    UnknownAgent(String),
    #[error("protocol version {got} is not supported; this master speaks {want}")]
    Protocol { got: u32, want: u32 },
    #[error("constraint {attribute}: {message}")]
    BadConstraint { attribute: String, message: String },
    #[error("role {role}'s production quota is exceeded: quota {quota}; in use {in_use}; asked {asked}. Ask an admin to raise it (drover quota set) or make the job preemptible")]
    QuotaExceeded {
        role: String,
        quota: String,
        in_use: String,
        asked: String,
    },
    #[error("task.user `{user}` is not granted to role {role}: its tasks run as `{role}` unless an admin grants another user (drover role grant-user {role} {user})")]
    UserNotGranted { role: String, user: String },
    #[error(transparent)]
    BadCron(CronSpecError),
    #[error("job {0} is not a cron job")]
    NotCron(String),
    #[error(
        "job {job} is being updated by update {id} ({state}); pause, abort or wait for it first"
    )]
    UpdateRunning {
        job: String,
        id: String,
        state: String,
    },
    #[error("job {0} has no update running")]
    NoActiveUpdate(String),
    #[error("update of {job}: {message}")]
    BadUpdate { job: String, message: String },
    #[error("no host given: name at least one agent id or host name")]
    NoHosts,
    #[error("no host named {}: use an agent id or host name from `drover host list`", .0.join(", "))]
    UnknownHosts(Vec<String>),
    #[error("host name {name} names several agents ({}): use the agent id", .agents.join(", "))]
    AmbiguousHost { name: String, agents: Vec<String> },
    #[error(
        "host {host} is {mode}: {op} applies to hosts in NONE or SCHEDULED; activate it first"
    )]
    HostConflict {
        host: String,
        mode: MaintenanceMode,
        op: &'static str,
    },
}

/// What the runtime must do after an event.
#[derive(Clone, Debug)]
pub enum Effect {
    /// Commit these changes; `seq` increases with every batch.
    Persist { seq: u64, changes: Vec<Change> },
    /// The agent's assignment set changed: wake its long poll once `seq` is committed.
    Notify { agent: String },
    /// Call `handle(Event::Tick)` at this monotonic time (the earliest pending timer).
    WakeAt(MonoMillis),
    /// The eviction guard engaged or released: say so loudly (the runtime logs it).
    EvictionGuard { engaged: bool, message: String },
    /// A rolling update started a batch of this many instances (counted in
    /// `/metrics`).
    UpdateBatch {
        direction: UpdateDirection,
        instances: u32,
    },
}

/// Which way a rolling update's batch moves its instances.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateDirection {
    /// Onto the new config.
    Forward,
    /// Back to the config they had (a rollback).
    Rollback,
}

/// The result of `handle`.
#[derive(Debug)]
pub struct Output {
    pub reply: Result<Reply, CoreError>,
    pub effects: Vec<Effect>,
}
