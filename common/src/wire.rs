//! The messages that cross process boundaries, with a protocol version:
//! agent -> executor (the task file and the Unix socket protocol), agent <-> master
//! (registration, heartbeats, assignments, status updates) and the admin API's views.
//! Everything here is JSON through serde.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::spec::{HealthCheck, JobSpec, Lifecycle, TaskSpec};
use crate::state::{DesiredState, ExitReason, TaskEvent, TaskState, UnixMillis};

/// Bumped on any incompatible change to the messages below.
pub const PROTOCOL_VERSION: u32 = 1;

// ---------------------------------------------------------------- executor

/// What the executor runs: written by the agent as the executor's `--task` file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExecutorTask {
    pub task_id: String,
    pub role: String,
    pub environment: String,
    pub name: String,
    pub instance: u32,
    pub task: TaskSpec,
    #[serde(default)]
    pub health_check: Option<HealthCheck>,
    #[serde(default)]
    pub lifecycle: Option<Lifecycle>,
    /// Port name -> number assigned at placement.
    #[serde(default)]
    pub ports: BTreeMap<String, u16>,
    /// Set for an announced task (`announce.drain_delay`, when not zero): a failed
    /// health check is reported at once (a RUNNING status carrying the exit reason,
    /// on which the master withdraws the instance) and the kill escalation starts
    /// this many milliseconds later.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_delay_ms: Option<u64>,
    /// The executor numbers its statuses after this one: the last sequence number
    /// of the STARTING statuses its agent reported while fetching the task's
    /// artifacts (`fetching 1 of 2 ...`); 0 when there were none. Set by the agent.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub status_seq_base: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The longest path a Unix socket address holds (`sun_path` is 108 bytes with its NUL).
pub const SUN_PATH_MAX: usize = 107;

/// Where to bind or connect the Unix socket at `path`. A path that fits in a socket
/// address is used as it is. A longer one is reached through its directory: `open_dir`
/// opens the directory (the caller does the I/O) and the kernel resolves
/// `/proc/self/fd/<dir fd>/<name>` like the real path. Keep the returned directory open
/// until the bind or connect is done.
pub fn socket_address<D: std::os::fd::AsRawFd, E>(
    path: &std::path::Path,
    open_dir: impl FnOnce(&std::path::Path) -> Result<D, E>,
) -> Result<(std::path::PathBuf, Option<D>), E> {
    match (path.parent(), path.file_name()) {
        (Some(dir), Some(name)) if path.as_os_str().len() > SUN_PATH_MAX => {
            let dir = open_dir(dir)?;
            let via_dir = std::path::Path::new("/proc/self/fd")
                .join(dir.as_raw_fd().to_string())
                .join(name);
            Ok((via_dir, Some(dir)))
        }
        _ => Ok((path.to_path_buf(), None)),
    }
}

/// One process as the executor sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum ProcessState {
    /// Not started yet (ordering, concurrency, min_duration, or final).
    Waiting,
    Running,
    Succeeded,
    /// Reached its max_failures.
    Failed,
    /// Stopped by the kill escalation.
    Killed,
}

/// A process's status inside an executor status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ProcessStatus {
    pub name: String,
    pub state: ProcessState,
    /// The pid of the current run, if running.
    pub pid: Option<u32>,
    /// How many times it was started.
    pub runs: u32,
    /// How many runs failed.
    pub failures: u32,
    /// How its last run ended.
    pub last_exit: Option<ExitReason>,
}

/// The processes a relayed status leaves out beyond its cap (the agent lists at most
/// `validate::MAX_PROCESSES`): how many, and how many of them are in each state.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct OmittedProcesses {
    pub count: u32,
    #[serde(default)]
    pub waiting: u32,
    #[serde(default)]
    pub running: u32,
    #[serde(default)]
    pub succeeded: u32,
    #[serde(default)]
    pub failed: u32,
    #[serde(default)]
    pub killed: u32,
}

impl OmittedProcesses {
    /// The summary of `left_out`, or None when it is empty.
    pub fn of(left_out: &[ProcessStatus]) -> Option<OmittedProcesses> {
        if left_out.is_empty() {
            return None;
        }
        let mut o = OmittedProcesses::default();
        for p in left_out {
            o.count = o.count.saturating_add(1);
            let n = match p.state {
                ProcessState::Waiting => &mut o.waiting,
                ProcessState::Running => &mut o.running,
                ProcessState::Succeeded => &mut o.succeeded,
                ProcessState::Failed => &mut o.failed,
                ProcessState::Killed => &mut o.killed,
            };
            *n = n.saturating_add(1);
        }
        Some(o)
    }
}

/// Every change of a task as the executor reports it: on stdout (one JSON line), in
/// the checkpoint file, and on the Unix socket.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecutorStatus {
    /// Increases by one with every status this executor emits.
    pub seq: u64,
    pub task_id: String,
    /// STARTING, RUNNING, KILLING, then FINISHED, FAILED or KILLED.
    pub state: TaskState,
    pub exit_reason: Option<ExitReason>,
    pub message: String,
    pub timestamp_ms: UnixMillis,
    pub executor_pid: u32,
    pub processes: Vec<ProcessStatus>,
    /// On the terminal status of a task stopped by a kill or a failed health check:
    /// how long each step of the kill escalation took. Absent otherwise, and from
    /// executors older than it. Boxed: every other status carries 8 bytes for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub escalation: Option<Box<EscalationSteps>>,
}

/// How long each step of a kill escalation took, in milliseconds (docs/executor.md,
/// "Kill escalation"); a step not taken is absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EscalationSteps {
    /// From POSTing the graceful shutdown endpoint to the next step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub graceful_ms: Option<u64>,
    /// From POSTing the shutdown endpoint to the next step.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shutdown_ms: Option<u64>,
    /// From SIGTERM to the task's end or to SIGKILL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term_ms: Option<u64>,
    /// From SIGKILL until nothing of the task was left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kill_ms: Option<u64>,
}

impl EscalationSteps {
    /// The steps' names, in the order the executor takes them and of
    /// [`EscalationSteps::durations_ms`].
    pub const NAMES: [&'static str; 4] = ["graceful", "shutdown", "term", "kill"];

    /// The steps' durations, in the order of [`EscalationSteps::NAMES`].
    pub fn durations_ms(&self) -> [Option<u64>; 4] {
        [
            self.graceful_ms,
            self.shutdown_ms,
            self.term_ms,
            self.kill_ms,
        ]
    }
}

/// The current status in an executor's checkpoint file (`.drover/status.json`): one
/// [`ExecutorStatus`] per line, appended, so the last line that parses is the current
/// one (a crash can tear only the line being appended, and a torn line never parses).
/// A file of one status without a newline (older executors) reads the same.
pub fn checkpointed_status(bytes: &[u8]) -> Option<ExecutorStatus> {
    bytes
        .split(|b| *b == b'\n')
        .rev()
        .find_map(|line| serde_json::from_slice(line).ok())
}

/// Agent -> executor on the sandbox's Unix socket, one JSON object per line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ExecutorRequest {
    /// Answered with the current status, then every later one; each a JSON line.
    /// Statuses with `seq <= after_seq` that are still buffered are replayed first.
    Subscribe { after_seq: u64 },
    /// Start the kill escalation; `reason` says why (default: killed by request).
    Kill {
        #[serde(default)]
        reason: Option<ExitReason>,
    },
}

/// The query of an exec request (`drover task exec`): on the master's
/// `GET /v1/jobs/{role}/{env}/{name}/instances/{instance}/exec` and, forwarded as is,
/// on the agent's `GET /v1/tasks/{task_id}/exec`. Both answer `101 Switching
/// Protocols` (`Upgrade: drover-exec`) and then carry [`ExecFrame`]s both ways.
#[derive(
    Clone,
    Debug,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
    utoipa::IntoParams,
)]
#[into_params(parameter_in = Query)]
pub struct ExecQuery {
    /// The command and its arguments as a JSON array of strings, e.g. `["sh","-c","id"]`.
    pub command: String,
    /// The process of the task whose user, namespaces, cgroup and environment the
    /// command gets (default: the first running one).
    #[serde(default)]
    pub process: Option<String>,
    /// Run the command on a terminal (a PTY): stdout and stderr are one stream.
    #[serde(default)]
    pub tty: bool,
    /// Pass stdin (`Stdin` frames) to the command; without it its stdin is empty.
    #[serde(default)]
    pub stdin: bool,
    /// The terminal's first size (with `tty`).
    #[serde(default)]
    pub rows: Option<u16>,
    #[serde(default)]
    pub cols: Option<u16>,
}

/// The most arguments and bytes of an exec command line.
pub const EXEC_MAX_ARGS: usize = 4096;
pub const EXEC_MAX_COMMAND_BYTES: usize = 128 * 1024;

impl ExecQuery {
    /// The command line, checked: a non-empty JSON array of strings without nul bytes.
    pub fn argv(&self) -> Result<Vec<String>, String> {
        if self.command.len() > EXEC_MAX_COMMAND_BYTES {
            return Err(format!(
                "command: at most {EXEC_MAX_COMMAND_BYTES} bytes, got {}",
                self.command.len()
            ));
        }
        let argv: Vec<String> = serde_json::from_str(&self.command).map_err(|e| {
            format!("command: not a JSON array of strings ({e}); e.g. [\"sh\",\"-c\",\"id\"]")
        })?;
        if argv.is_empty() || argv[0].is_empty() {
            return Err("command: empty; name a program to run".into());
        }
        if argv.len() > EXEC_MAX_ARGS {
            return Err(format!("command: at most {EXEC_MAX_ARGS} arguments"));
        }
        if argv.iter().any(|a| a.contains('\0')) {
            return Err("command: an argument holds a nul byte".into());
        }
        Ok(argv)
    }
}

/// The `Upgrade` protocol name of an exec stream.
pub const EXEC_PROTOCOL: &str = "drover-exec";

/// The largest payload of one [`ExecFrame`].
pub const EXEC_MAX_FRAME: usize = 1 << 20;

/// One message of an exec stream: a kind byte, the payload's length (u32, big
/// endian), the payload. Client to server: `Stdin`, `StdinEof`, `Resize`, `Signal`;
/// server to client: `Stdout`, `Stderr`, `Exit` (the last message) and `Error` (a
/// failure before the command ran, followed by `Exit`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecFrame {
    Stdin(Vec<u8>),
    StdinEof,
    Resize {
        rows: u16,
        cols: u16,
    },
    Signal(i32),
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    /// The command's exit status: its exit code, or 128 + the signal that ended it.
    Exit(i32),
    Error(String),
}

/// A malformed exec stream.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ExecFrameError {
    #[error("exec frame of unknown kind {0}")]
    UnknownKind(u8),
    #[error("exec frame of {0} bytes, over the limit of {EXEC_MAX_FRAME}")]
    TooLarge(usize),
    #[error("exec frame of kind {0} with a malformed payload")]
    BadPayload(u8),
}

impl ExecFrame {
    fn kind(&self) -> u8 {
        match self {
            ExecFrame::Stdin(_) => 0,
            ExecFrame::StdinEof => 1,
            ExecFrame::Resize { .. } => 2,
            ExecFrame::Signal(_) => 3,
            ExecFrame::Stdout(_) => 10,
            ExecFrame::Stderr(_) => 11,
            ExecFrame::Exit(_) => 12,
            ExecFrame::Error(_) => 13,
        }
    }

    /// The frame's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let payload: Vec<u8> = match self {
            ExecFrame::Stdin(b) | ExecFrame::Stdout(b) | ExecFrame::Stderr(b) => b.clone(),
            ExecFrame::StdinEof => Vec::new(),
            ExecFrame::Resize { rows, cols } => {
                let mut p = rows.to_be_bytes().to_vec();
                p.extend_from_slice(&cols.to_be_bytes());
                p
            }
            ExecFrame::Signal(n) | ExecFrame::Exit(n) => n.to_be_bytes().to_vec(),
            ExecFrame::Error(m) => m.as_bytes().to_vec(),
        };
        let mut out = Vec::with_capacity(5 + payload.len());
        out.push(self.kind());
        out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        out.extend_from_slice(&payload);
        out
    }

    /// The first frame in `buf` and the bytes it took, or None when `buf` holds only
    /// part of one.
    pub fn decode(buf: &[u8]) -> Result<Option<(ExecFrame, usize)>, ExecFrameError> {
        if buf.len() < 5 {
            return Ok(None);
        }
        let kind = buf[0];
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if len > EXEC_MAX_FRAME {
            return Err(ExecFrameError::TooLarge(len));
        }
        if buf.len() < 5 + len {
            return Ok(None);
        }
        let p = &buf[5..5 + len];
        let int = || -> Result<i32, ExecFrameError> {
            let b: [u8; 4] = p.try_into().map_err(|_| ExecFrameError::BadPayload(kind))?;
            Ok(i32::from_be_bytes(b))
        };
        let frame = match kind {
            0 => ExecFrame::Stdin(p.to_vec()),
            1 => ExecFrame::StdinEof,
            2 => {
                if p.len() != 4 {
                    return Err(ExecFrameError::BadPayload(kind));
                }
                ExecFrame::Resize {
                    rows: u16::from_be_bytes([p[0], p[1]]),
                    cols: u16::from_be_bytes([p[2], p[3]]),
                }
            }
            3 => ExecFrame::Signal(int()?),
            10 => ExecFrame::Stdout(p.to_vec()),
            11 => ExecFrame::Stderr(p.to_vec()),
            12 => ExecFrame::Exit(int()?),
            13 => ExecFrame::Error(String::from_utf8_lossy(p).into_owned()),
            other => return Err(ExecFrameError::UnknownKind(other)),
        };
        Ok(Some((frame, 5 + len)))
    }
}

/// Agent -> fork server (`drover-executor zygote --socket-fd N`): start one executor.
/// One SOCK_SEQPACKET message of JSON, carrying two descriptors by SCM_RIGHTS in this
/// order: the readiness pipe's write end (the child's `--ready-fd`) and the file the
/// executor's stderr goes to (or the sandbox's `.drover/` directory, in which the
/// executor then creates `executor.stderr` on its first line). An optional third descriptor is the agent's connection
/// to the executor (one end of a connected stream socket pair): the executor serves it
/// as a socket client and binds its socket only once it closes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZygoteRequest {
    /// The `drover-executor` arguments after the program name, starting with `run`,
    /// without `--ready-fd` (the zygote passes the descriptor it received).
    pub args: Vec<String>,
}

/// Fork server -> agent, one SOCK_SEQPACKET message of JSON each.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
pub enum ZygoteReply {
    /// Sent once when the zygote starts serving.
    Ready { pid: u32, version: String },
    /// The executor was forked; its pidfd comes along by SCM_RIGHTS.
    Started { pid: u32 },
    /// Nothing was forked; `error` says why.
    Failed { error: String },
}

// ---------------------------------------------------------------- agent <-> master

/// What an agent offers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentResources {
    pub cpu: f64,
    pub ram_bytes: u64,
    pub disk_bytes: u64,
    /// Inclusive range of ports tasks may be given.
    pub port_range: (u16, u16),
}

/// POST /v1/agents/register
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RegisterRequest {
    pub protocol_version: u32,
    /// Stable across restarts; kept in the agent's data dir.
    pub agent_id: String,
    pub hostname: String,
    /// `http://host:port` where the agent serves sandbox logs.
    pub address: String,
    /// The IP address clients reach the host's announced tasks at. Absent: the
    /// master takes the host of `address` (an IP literal as it is, a host name
    /// resolved once, at this registration).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip: Option<String>,
    pub resources: AgentResources,
    pub attributes: BTreeMap<String, String>,
    /// The agent's and its executor's versions. Absent from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<AgentVersions>,
}

/// The versions of an agent's binaries, as the agent reports them at registration
/// (`drover agent list` shows them, so version skew across a fleet is visible).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentVersions {
    /// `drover-agent`'s version.
    pub agent: String,
    /// The version `drover-executor --version` printed when the agent started; new
    /// tasks start under that binary (running ones keep the one they started with).
    pub executor: String,
}

/// Answer to a registration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RegisterResponse {
    pub agent_id: String,
    /// How often the master expects a heartbeat.
    pub heartbeat_interval_ms: u64,
    /// How long the agent keeps `partition_policy.exclusive` tasks without reaching
    /// the master (the master's `exclusive_lease`). Absent from older masters: the
    /// agent then uses its own `lease` setting.
    #[serde(default)]
    pub exclusive_lease_ms: Option<u64>,
}

/// A task as the agent holds it, for reconciliation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentTaskReport {
    pub task_id: String,
    pub state: TaskState,
    /// The highest status seq the agent has for this task.
    pub seq: u64,
}

/// POST /v1/agents/{id}/heartbeat
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HeartbeatRequest {
    /// `task_set_digest` of the non-terminal task ids the agent holds.
    pub task_digest: u64,
    /// The assignment set version the agent has applied.
    pub assignments_version: u64,
    /// Sent when the master asked for it (digest mismatch, reconciliation).
    #[serde(default)]
    pub tasks: Option<Vec<AgentTaskReport>>,
}

/// Answer to a heartbeat.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HeartbeatResponse {
    /// The digests differ, or the master reconciles: send `tasks` next time (now).
    pub send_full_task_set: bool,
    /// The master does not know this agent (e.g. after losing its state): register.
    pub reregister: bool,
    /// How often to heartbeat from now on: the master spreads the cell's heartbeats
    /// under its `max_heartbeat_rate`. Absent from older masters (and with
    /// `reregister`): keep the registration's interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heartbeat_interval_ms: Option<u64>,
    /// The exclusive lease from now on (it grows with the interval). Absent: keep
    /// the one in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_lease_ms: Option<u64>,
}

/// One task the agent should hold, and what the master wants of it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Assignment {
    pub desired: DesiredState,
    /// Why it should stop, when desired is SHUTDOWN.
    pub kill_reason: Option<ExitReason>,
    /// When true the agent kills the task itself after losing the master for its
    /// lease (`partition_policy.exclusive`).
    pub exclusive: bool,
    pub task: ExecutorTask,
    /// The master has had a report on this task (it reached STARTING on some
    /// executor). An agent that does not hold such a task (its sandbox was lost) must
    /// not start it again: tasks are one-shot; the master's reconciliation makes it
    /// LOST and replaces it.
    #[serde(default)]
    pub started: bool,
}

/// GET /v1/agents/{id}/assignments?after_version=N&wait_ms=M: the complete set of
/// tasks the agent should hold. A task the agent runs that is not in the set is
/// unknown to the master and is killed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AssignmentSet {
    pub version: u64,
    pub assignments: Vec<Assignment>,
}

/// Response header of the assignments long poll: how many milliseconds the master
/// held the request before answering (the agent subtracts it to get the answer's
/// time in flight).
pub const ASSIGNMENTS_HELD_MS_HEADER: &str = "x-drover-held-ms";

/// A status change relayed from an executor (or decided by the agent, e.g. executor
/// lost). `seq` increases per task; the master ignores what it has already applied.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StatusUpdate {
    pub task_id: String,
    pub seq: u64,
    pub state: TaskState,
    pub exit_reason: Option<ExitReason>,
    pub message: String,
    pub timestamp_ms: UnixMillis,
    #[serde(default)]
    pub processes: Vec<ProcessStatus>,
    /// The processes left out of `processes` beyond its cap (absent when none were,
    /// and from agents older than it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_omitted: Option<OmittedProcesses>,
}

/// POST /v1/agents/{id}/updates
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StatusUpdateBatch {
    pub updates: Vec<StatusUpdate>,
}

/// The master committed these: the agent may delete them from its outbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StatusAck {
    /// (task_id, seq) pairs; everything up to seq for that task is acknowledged.
    pub acked: Vec<(String, u64)>,
}

/// FNV-1a over the sorted task ids, each followed by a 0 byte. Master and agent both
/// compute it, so a mismatch means their views of the agent's tasks differ.
pub fn task_set_digest<'a>(task_ids: impl IntoIterator<Item = &'a str>) -> u64 {
    let mut ids: Vec<&str> = task_ids.into_iter().collect();
    ids.sort_unstable();
    ids.dedup();
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for id in ids {
        for byte in id.bytes().chain(std::iter::once(0)) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    }
    hash
}

// ---------------------------------------------------------------- admin API views

/// Every admin API error: `{"error": {"code", "message", "field"}}`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiErrorBody {
    pub error: ApiError,
}

/// One error, with the field at fault when there is one.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ApiError {
    /// Stable machine-readable code: `invalid_spec`, `job_exists`, `not_found`...
    pub code: String,
    pub message: String,
    #[serde(default)]
    pub field: Option<String>,
    /// Every problem, when there are several (spec validation).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<FieldError>,
}

/// Header of `POST /v1/agents/register` carrying the secret the agent's log server
/// requires (as `Authorization: Bearer <it>`) from the master proxying log reads.
pub const LOGS_KEY_HEADER: &str = "x-drover-logs-key";
/// Response header of an agent's log server, passed on by the master: the log
/// file's total size in bytes.
pub const LOG_SIZE_HEADER: &str = "x-drover-log-size";
/// Header of a `/v1/services` answer: its index (the body's `index`; the list's
/// highest), the `index` to long-poll from next.
pub const INDEX_HEADER: &str = "x-drover-index";
/// Response header of a standby's `503 not_leader`: the leader's URL, where agents
/// and the CLI go next.
pub const LEADER_HEADER: &str = "x-drover-leader";
/// Request header: a read accepts an answer from a standby's copy of the state
/// (`true`) while no leader answers.
pub const ALLOW_STALE_HEADER: &str = "x-drover-allow-stale";
/// Answer header of a standby answering from its copy: the store batch (change
/// stream index) the copy holds.
pub const COPY_INDEX_HEADER: &str = "x-drover-copy-index";
/// Answer header of a standby answering from its copy: how long ago (ms) the copy
/// was read from etcd.
pub const COPY_AGE_HEADER: &str = "x-drover-copy-age-ms";
/// Set on a request a standby forwards to the leader: the URL of the master that
/// forwarded it.
pub const PROXIED_HEADER: &str = "x-drover-proxied-by";
/// Set on a forwarded answer: the URL of the leader that answered it.
pub const SERVED_BY_HEADER: &str = "x-drover-served-by";

/// A problem at a field path.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

/// A task as the admin API shows it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TaskView {
    pub task_id: String,
    pub job: String,
    pub instance: u32,
    pub state: TaskState,
    pub desired: DesiredState,
    pub exit_reason: Option<ExitReason>,
    pub agent_id: Option<String>,
    pub ports: BTreeMap<String, u16>,
    /// Why a PENDING task is not placed, in words.
    pub pending_reason: Option<String>,
    /// The task whose preemption made this one (a replacement), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<String>,
    pub events: Vec<TaskEvent>,
    #[serde(default)]
    pub processes: Vec<ProcessStatus>,
    /// The processes its last status left out beyond the agent's cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes_omitted: Option<OmittedProcesses>,
}

/// One instance (slot) of a job: its current task and the terminal ones before it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InstanceView {
    pub instance: u32,
    /// The hash of the task config this instance runs (`configs` holds it).
    #[serde(default)]
    pub config: Option<String>,
    pub current: Option<TaskView>,
    pub history: Vec<TaskView>,
}

/// The most instances one page of GET /v1/jobs/{role}/{env}/{name} holds
/// (`limit`).
pub const MAX_INSTANCE_PAGE: u32 = 1000;

/// The most tasks one answer of GET /v1/changes holds (`limit`).
pub const MAX_CHANGES_PAGE: u32 = 5000;

/// GET /v1/jobs/{role}/{env}/{name}: the job's summary (spec, counts per state and
/// per config, recent events) and its instances, all of them or one page
/// (`?limit=N&after=I&state=S`, docs/api.md).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobView {
    pub key: String,
    pub spec: JobSpec,
    pub created_ms: UnixMillis,
    /// Count of current tasks per state (the whole job, whatever the page).
    pub state_counts: BTreeMap<TaskState, u32>,
    /// How many instances the job has (the whole job, whatever the page).
    #[serde(default)]
    pub instance_count: u32,
    /// How many instances run each config, by hash (the whole job).
    #[serde(default)]
    pub config_counts: BTreeMap<String, u32>,
    /// The instances asked for, in instance order: every one without `limit`,
    /// else one page.
    pub instances: Vec<InstanceView>,
    /// Present when more instances match after this page: pass it as `after`
    /// for the next page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_after: Option<u32>,
    /// The job's latest task events (at most 50, newest first), over every
    /// instance whatever the page.
    #[serde(default)]
    pub recent_events: Vec<RecentEvent>,
    /// Present for cron jobs: the schedule and the next firing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<CronView>,
    /// Every task config an instance runs, by hash (several during and after a
    /// partial update, e.g. a canary).
    #[serde(default)]
    pub configs: BTreeMap<String, JobSpec>,
    /// The job's latest update, if it had one.
    #[serde(default)]
    pub update: Option<UpdateView>,
    /// Present when a live task (or the cron template) of the job runs as a user its
    /// role is not granted: that user. The job runs on; its next update, restart or
    /// rollback is refused until an admin grants the user again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ungranted_user: Option<String>,
}

/// A task event of a job with its task and instance (`JobView.recent_events`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RecentEvent {
    pub task_id: String,
    pub instance: u32,
    pub event: TaskEvent,
}

/// A line of GET /v1/jobs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobSummary {
    pub key: String,
    pub instances: u32,
    pub service: bool,
    pub state_counts: BTreeMap<TaskState, u32>,
    /// The job's tier (`preferred`, `preemptible`).
    #[serde(default)]
    pub tier: crate::spec::Tier,
    /// The job's priority within its role.
    #[serde(default)]
    pub priority: u32,
    /// Present for cron jobs: the schedule and the next firing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron: Option<CronView>,
    /// While some instance is PENDING: why the job's pending tasks are not placed,
    /// in words (as `TaskView.pending_reason`, without a task's own preemption
    /// note); absent before the scheduler tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_reason: Option<String>,
}

/// A cron job (GET /v1/cron, and in GET /v1/jobs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CronView {
    pub job: String,
    pub schedule: String,
    /// The IANA time zone the schedule is read in.
    pub timezone: String,
    pub collision_policy: crate::spec::CronCollisionPolicy,
    /// The next scheduled firing (wall clock, Unix ms); None when the schedule
    /// never fires again.
    pub next_fire_ms: Option<UnixMillis>,
    /// The last scheduled firing handled (run or skipped by CANCEL_NEW).
    pub last_fired_ms: Option<UnixMillis>,
    /// Tasks of the current run that are not terminal.
    pub active_tasks: u32,
}

/// Production resources of a quota: cpu in cores, ram and disk in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaResources {
    pub cpu: f64,
    pub ram_bytes: u64,
    pub disk_bytes: u64,
}

/// Body of POST /v1/quotas/{role}: the production resources the role may hold
/// (`{"cpu": 4, "ram_bytes": ..., "disk_bytes": ...}`), or `{"remove": true}`.
// `validate::quota_request` checks it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SetQuotaRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub remove: bool,
}

impl From<Option<QuotaResources>> for SetQuotaRequest {
    /// The request that sets `quota`, or removes the role's quota (None).
    fn from(quota: Option<QuotaResources>) -> SetQuotaRequest {
        match quota {
            Some(q) => SetQuotaRequest {
                cpu: Some(q.cpu),
                ram_bytes: Some(q.ram_bytes),
                disk_bytes: Some(q.disk_bytes),
                remove: false,
            },
            None => SetQuotaRequest {
                remove: true,
                ..SetQuotaRequest::default()
            },
        }
    }
}

/// A role's quota and its production use (GET /v1/quotas[/{role}]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QuotaView {
    pub role: String,
    /// None: the role is not bounded.
    pub quota: Option<QuotaResources>,
    pub in_use: QuotaResources,
}

/// Who a role's tasks may run as (GET /v1/roles/{role}): the role's own user (its
/// name) and the users an admin granted it (`drover role grant-user`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RoleView {
    pub role: String,
    /// The user the role's tasks run as without `task.user`: the role's name.
    pub user: String,
    /// The other users the role's tasks may run as (`task.user`), sorted.
    pub granted_users: Vec<String>,
    /// The role's jobs with tasks running as a user the role is not granted (since
    /// revoked, or from before grants existed): they run on, flagged, and their
    /// next update, restart or rollback is refused.
    #[serde(default)]
    pub ungranted_jobs: Vec<String>,
}

/// Body of POST /v1/roles/{role}/grant-user and .../revoke-user.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RoleUserRequest {
    /// The Unix user name, e.g. `backup`.
    pub user: String,
}

/// One announced instance of a service: where a client connects.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ServiceEndpoint {
    pub instance: u32,
    /// The agent's host name.
    pub host: String,
    /// The host's IP address clients connect to.
    pub ip: String,
    /// Announced port name -> number.
    pub ports: BTreeMap<String, u16>,
    pub task_id: String,
    /// When the instance was announced (its task became RUNNING).
    pub since: UnixMillis,
}

/// GET /v1/services/{role}/{env}/{name}: a service's announced instances.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ServiceView {
    pub role: String,
    pub environment: String,
    /// The announced name (`announce.name`, else the job's name).
    pub name: String,
    /// The job the service belongs to.
    pub job: String,
    /// The port name a client uses by default.
    pub primary_port: String,
    /// The change index this view was read at (pass it as `index` to wait for the next).
    pub index: u64,
    /// Announced instances, by instance number.
    pub endpoints: Vec<ServiceEndpoint>,
}

/// GET /v1/changes?index=N: what changed after index N, as the current views of the
/// changed objects (docs/api.md, "Change stream").
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ChangesView {
    /// Pass it as `index` to get the next changes (with `after` when `more`).
    pub index: u64,
    /// True when this answer is one page (`limit`) and more changes follow: ask
    /// again at once with `index` and `after`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub more: bool,
    /// With `more`: the last task of this page; pass it as `after`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
    /// The last committed index when this was read (what `index` is when the
    /// answer is whole): a client that wants only what changes from now on
    /// follows from here.
    #[serde(default)]
    pub head: u64,
    /// True when the index asked for is newer than this master's (its store was
    /// replaced): everything is sent, as for index 0; forget what you held.
    #[serde(default)]
    pub reset: bool,
    /// Tasks written after the index, their latest state (events included).
    pub tasks: Vec<TaskView>,
    /// The jobs of those tasks: state counts now.
    pub jobs: Vec<JobSummary>,
    /// Agents written after the index (tokens that may read everything only).
    pub agents: Vec<AgentView>,
    /// Job updates (rolling updates) written after the index, as
    /// GET .../update shows them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub updates: Vec<UpdateView>,
}

/// GET /v1/agents
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentView {
    pub agent_id: String,
    pub hostname: String,
    pub address: String,
    pub reachable: bool,
    pub last_heartbeat_ms: UnixMillis,
    pub attributes: BTreeMap<String, String>,
    pub resources: AgentResources,
    pub free: AgentResources,
    pub tasks: Vec<String>,
    /// The host's maintenance mode.
    #[serde(default)]
    pub maintenance: MaintenanceMode,
    /// The agent's and executor's versions (none from agents older than this field).
    #[serde(default)]
    pub versions: Option<AgentVersions>,
}

/// A host's maintenance mode (Aurora's MaintenanceMode).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MaintenanceMode {
    /// In service.
    #[default]
    None,
    /// Cordoned: no new placements, running tasks stay.
    Scheduled,
    /// Its tasks are being moved off, within their jobs' SLA policies.
    Draining,
    /// No task of any job is left on it, and the agent confirmed every ending.
    Drained,
}

impl MaintenanceMode {
    /// The upper-case name used in the API and the CLI.
    pub const fn as_str(self) -> &'static str {
        match self {
            MaintenanceMode::None => "NONE",
            MaintenanceMode::Scheduled => "SCHEDULED",
            MaintenanceMode::Draining => "DRAINING",
            MaintenanceMode::Drained => "DRAINED",
        }
    }
}

impl std::fmt::Display for MaintenanceMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Body of POST /v1/hosts/cordon, /drain and /activate.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HostsRequest {
    /// Agent ids or host names; each must name exactly one agent.
    pub hosts: Vec<String>,
    /// Drain only: force what is left this many milliseconds after the drain
    /// starts (the request, or `start_at_ms`).
    #[serde(default)]
    pub deadline_ms: Option<u64>,
    /// Drain only: start the drain at this wall clock time (Unix milliseconds);
    /// until then the host is SCHEDULED (cordoned). A time not in the future
    /// drains at once.
    #[serde(default)]
    pub start_at_ms: Option<UnixMillis>,
    /// Drain only: change nothing, answer what the drain would do ([`HostProbe`]s).
    #[serde(default)]
    pub dry_run: bool,
}

/// Body of POST /v1/agents/{id}/drain: the agent's host is shutting down.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SelfDrainRequest {
    /// Force what is left this many milliseconds after the request.
    #[serde(default)]
    pub deadline_ms: Option<u64>,
}

/// `drover host drain --dry-run` (POST /v1/hosts/drain with `dry_run`): what a drain of these hosts
/// would do, per host and job, without changing anything (Aurora's sla_probe_hosts).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HostProbe {
    pub agent_id: String,
    pub hostname: String,
    /// Non-terminal tasks on the host.
    pub tasks: u32,
    /// Whether every job on it can be drained within its policy.
    pub within_policy: bool,
    /// Estimated time until the host is DRAINED (the slowest of its jobs).
    pub estimate_ms: u64,
    /// One entry per job with tasks on the host.
    pub jobs: Vec<JobProbe>,
}

/// One job's part of a drain probe (its budget is shared across every host probed).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct JobProbe {
    pub job: String,
    /// Its tasks on this host.
    pub tasks_on_host: u32,
    /// Its tasks on all the hosts probed.
    pub tasks_on_hosts: u32,
    /// Whether the drain can go on within the job's policy (false: it would block
    /// until the deadline).
    pub within_policy: bool,
    /// How many tasks the policy lets go at once now.
    pub at_once: u32,
    /// Waves of kills the job's tasks need, one after another.
    pub waves: u32,
    /// Estimated time for those waves: each a worst-case kill escalation plus the
    /// time a replacement took to become RUNNING, plus the policy's `min_time`.
    pub estimate_ms: u64,
    /// Why the drain would block, when it would.
    #[serde(default)]
    pub reason: Option<String>,
}

/// One maintenance event of a host.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HostEvent {
    pub timestamp_ms: UnixMillis,
    pub message: String,
}

/// GET /v1/hosts and /v1/hosts/{host}: a host's maintenance state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HostView {
    pub agent_id: String,
    pub hostname: String,
    pub reachable: bool,
    pub mode: MaintenanceMode,
    /// Why it is in maintenance (`maintenance`, `quarantined`); absent for NONE.
    #[serde(default)]
    pub reason: Option<String>,
    /// When the current mode began.
    pub since_ms: UnixMillis,
    /// When a drain forces what is left.
    #[serde(default)]
    pub deadline_ms: Option<UnixMillis>,
    /// While SCHEDULED with a drain start time: when the drain starts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_at_ms: Option<UnixMillis>,
    /// Non-terminal tasks still on the host.
    pub tasks_left: u32,
    /// While DRAINING: why tasks are not moved yet, one line per job that blocks.
    #[serde(default)]
    pub blocked: Vec<String>,
    /// While DRAINING: set when the drain cannot go on as things stand: every job
    /// that blocks it waits for replacements that no agent can take, for reasons
    /// only an operator changes (the job's limits or constraints, hosts in
    /// maintenance); says why. `host drain --wait` ends on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stuck: Option<String>,
    /// The latest maintenance events, oldest first.
    #[serde(default)]
    pub events: Vec<HostEvent>,
}

/// GET /v1/cluster and POST /v1/cluster/eviction-guard/release: the fleet at a
/// glance and the eviction guard.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterView {
    /// Agents the master knows.
    pub agents: u32,
    /// Agents heartbeating within the agent timeout.
    pub reachable_agents: u32,
    pub eviction_guard: EvictionGuardView,
    /// Agents per maintenance mode (modes no agent is in are left out).
    #[serde(default)]
    pub maintenance: BTreeMap<MaintenanceMode, u32>,
    /// The resources every agent offers, summed.
    #[serde(default)]
    pub capacity: Capacity,
    /// What is not in use of them (offered minus what placed tasks hold), summed.
    #[serde(default)]
    pub free: Capacity,
}

/// Resources summed over agents (`ClusterView`): cpu in cores.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Capacity {
    pub cpu: f64,
    pub ram_bytes: u64,
    pub disk_bytes: u64,
}

/// The eviction guard: while `engaged`, tasks on unreachable agents are neither
/// LOST nor replaced (exclusive tasks excepted: their lease ends them anyway).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EvictionGuardView {
    pub engaged: bool,
    /// When it engaged (wall clock).
    #[serde(default)]
    pub since_ms: Option<UnixMillis>,
    /// Agents that went unreachable in the storm and are still unreachable.
    pub unreachable_agents: u32,
    /// The fleet the share is measured against (agents reachable at the start of
    /// the storm window).
    pub fleet_agents: u32,
    /// Tasks whose loss is held back.
    pub held_tasks: u32,
    /// What it is doing and how to release it, in words.
    pub message: String,
}

/// Body of POST .../kill and .../restart: which instances (`0-3,7`); absent: all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InstancesRequest {
    #[serde(default)]
    pub instances: Option<String>,
}

/// Body of POST .../restart: which instances (`0-3,7`; absent: the whole job) and,
/// for the whole job, whether all at once. A whole job restarts rolling unless
/// `all_at_once`: batch by batch, as an update to the same configs; named
/// instances restart at once.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RestartRequest {
    #[serde(default)]
    pub instances: Option<String>,
    #[serde(default)]
    pub all_at_once: bool,
}

/// Body of POST /v1/jobs/{key}/update: the new spec, optionally only some instances.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UpdateRequest {
    pub spec: JobSpec,
    /// `0-3,7`; absent: every instance.
    #[serde(default)]
    pub instances: Option<String>,
    /// Who asks (shown in the update record); absent: `unknown`.
    #[serde(default)]
    pub user: Option<String>,
}

/// Where an update is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum UpdateState {
    RollingForward,
    Paused,
    RolledForward,
    RollingBack,
    RolledBack,
    Aborted,
    Failed,
}

impl UpdateState {
    /// Whether the update has ended.
    pub const fn is_terminal(self) -> bool {
        matches!(
            self,
            UpdateState::RolledForward
                | UpdateState::RolledBack
                | UpdateState::Aborted
                | UpdateState::Failed
        )
    }

    /// The name as the API writes it.
    pub const fn as_str(self) -> &'static str {
        match self {
            UpdateState::RollingForward => "ROLLING_FORWARD",
            UpdateState::Paused => "PAUSED",
            UpdateState::RolledForward => "ROLLED_FORWARD",
            UpdateState::RollingBack => "ROLLING_BACK",
            UpdateState::RolledBack => "ROLLED_BACK",
            UpdateState::Aborted => "ABORTED",
            UpdateState::Failed => "FAILED",
        }
    }
}

impl std::fmt::Display for UpdateState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where one instance of an update is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum InstanceUpdateState {
    /// Not started.
    Pending,
    /// Its new task is starting or being watched.
    Updating,
    /// Ran healthy on the new config for the watch time (or was removed).
    Updated,
    /// Failed more often than `max_per_instance_failures` allows.
    Failed,
    /// Being put back on the config it had.
    RollingBack,
    /// Back on the config it had.
    RolledBack,
}

/// One instance's progress in an update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct InstanceProgress {
    pub instance: u32,
    /// The config it ran before (None: the update adds it).
    pub from: Option<String>,
    /// The config the update puts it on (None: the update removes it).
    pub to: Option<String>,
    pub state: InstanceUpdateState,
    /// Failures of its tasks on the new config in this update.
    pub failures: u32,
}

/// One line of an update's history.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UpdateEvent {
    pub at_ms: UnixMillis,
    pub message: String,
}

/// An update as the admin API shows it (GET /v1/jobs/{key}/update).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UpdateView {
    pub id: String,
    pub job: String,
    pub user: String,
    pub created_ms: UnixMillis,
    pub state: UpdateState,
    /// The settings it runs with (the new spec's `update` section).
    pub settings: crate::spec::UpdateConfig,
    /// The config hash instances move to.
    pub to_config: String,
    /// Instance count before and after.
    pub instances_before: u32,
    pub instances_after: u32,
    /// Every instance it touches, in the order it rolls forward.
    pub instances: Vec<InstanceProgress>,
    /// Oldest first.
    pub events: Vec<UpdateEvent>,
    /// Batches started so far in the current direction (forward or rolling back)
    /// and how many it takes in all at the batch size (a batch a drain shrinks
    /// adds one).
    #[serde(default)]
    pub batch: u32,
    #[serde(default)]
    pub batches: u32,
    /// While it runs: what it waits for now (the batch in flight, a drain), with
    /// the scheduler's reason when instances of the batch are PENDING.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// While it runs: set when it cannot finish as things stand: instances of its
    /// batch are PENDING for reasons only an operator changes (the job's limits or
    /// constraints, hosts in maintenance; not resources other tasks may free) and
    /// no task of the job is starting or stopping; says why. `job update --wait`
    /// ends on it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stuck: Option<String>,
}

/// What a token is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Grant {
    /// Everything: jobs of every role, tokens, agents.
    Admin,
    /// Maintenance (removing agents) and reading everything; no job changes.
    Operator,
    /// Create, update, kill, restart and read the jobs of these roles only.
    Roles { roles: Vec<String> },
    /// Service discovery: reads every announced service (`/v1/services`) and
    /// nothing else (a DNS server, a load balancer, a client library).
    Discovery,
    /// An agent: the agent API for the one agent id it is bound to (bound at its
    /// first registration when created without one).
    Agent {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        agent_id: Option<String>,
    },
}

impl Grant {
    /// A short description for logs and listings (`admin`, `roles:www,db`, `agent:a1`).
    pub fn describe(&self) -> String {
        match self {
            Grant::Admin => "admin".to_string(),
            Grant::Operator => "operator".to_string(),
            Grant::Discovery => "discovery".to_string(),
            Grant::Roles { roles } => format!("roles:{}", roles.join(",")),
            Grant::Agent { agent_id: Some(id) } => format!("agent:{id}"),
            Grant::Agent { agent_id: None } => "agent:(unbound)".to_string(),
        }
    }
}

/// A token as listed: everything but its secret.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenInfo {
    pub id: String,
    #[serde(flatten)]
    pub grant: Grant,
    /// Free text given at creation.
    #[serde(default)]
    pub description: String,
    pub created_ms: u64,
    /// The token id that created it (empty for the bootstrap token).
    #[serde(default)]
    pub created_by: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_ms: Option<u64>,
}

/// Body of POST /v1/tokens: `{"kind": "admin" | "operator" | "agent" | "discovery"}` (an agent
/// token may name its `agent_id`) or `{"kind": "roles", "roles": ["www-data"]}`,
/// and an optional description.
// `validate::token_request` checks it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateTokenRequest {
    pub kind: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roles: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent_id: Option<String>,
    #[serde(default)]
    pub description: String,
}

/// Answer of POST /v1/tokens: the token's record and its text, shown only here.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreateTokenResponse {
    #[serde(flatten)]
    pub info: TokenInfo,
    pub token: String,
}

/// Answer of POST /v1/agents/{id}/forbid and /allow.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentAccessResponse {
    pub agent_id: String,
    pub forbidden: bool,
    /// Tokens revoked because they were bound to the agent.
    pub revoked_tokens: Vec<String>,
}

/// What a kill or restart touched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ActionResponse {
    pub job: String,
    pub tasks: Vec<String>,
    /// A rolling restart of the whole job: the id of the update that restarts it
    /// batch by batch (`GET .../update` follows it; `tasks` is then empty).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub update: Option<String>,
}

/// The most comma-separated parts an instance set may have (each costs work).
pub const MAX_INSTANCE_SET_PARTS: usize = 10_000;
/// The highest instance number an instance set may name (above any job's).
pub const MAX_INSTANCE: u32 = 100_000;

/// Parses an instance set like `0-3,7` into sorted, merged, disjoint inclusive
/// ranges. The work is bounded by the number of parts (at most
/// `MAX_INSTANCE_SET_PARTS`), never by the size of the ranges.
pub fn parse_instance_ranges(text: &str) -> Result<Vec<(u32, u32)>, String> {
    let parts = text.split(',').count();
    if parts > MAX_INSTANCE_SET_PARTS {
        return Err(format!(
            "the instance set has {parts} parts; at most {MAX_INSTANCE_SET_PARTS} are accepted: merge them into ranges like 0-99"
        ));
    }
    let mut ranges = Vec::with_capacity(parts);
    for part in text.split(',').map(str::trim) {
        let bad = || {
            let shown: String = part.chars().take(40).collect();
            format!("`{shown}` is not an instance or range; write e.g. 0-3,7")
        };
        let (lo, hi) = match part.split_once('-') {
            Some((lo, hi)) => (
                lo.trim().parse::<u32>().map_err(|_| bad())?,
                hi.trim().parse::<u32>().map_err(|_| bad())?,
            ),
            None => {
                let n = part.parse::<u32>().map_err(|_| bad())?;
                (n, n)
            }
        };
        if lo > hi {
            return Err(bad());
        }
        if hi > MAX_INSTANCE {
            return Err(format!(
                "instance {hi} in `{part}` is above {MAX_INSTANCE}, the highest any job has"
            ));
        }
        ranges.push((lo, hi));
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u32, u32)> = Vec::with_capacity(ranges.len());
    for (lo, hi) in ranges {
        match merged.last_mut() {
            Some(last) if lo <= last.1.saturating_add(1) => last.1 = last.1.max(hi),
            _ => merged.push((lo, hi)),
        }
    }
    Ok(merged)
}

/// Parses an instance set like `0-3,7` into sorted, deduplicated numbers (ranges
/// merged first, so overlapping parts cost nothing extra; at most
/// `MAX_INSTANCE + 1` numbers).
pub fn parse_instance_set(text: &str) -> Result<Vec<u32>, String> {
    Ok(parse_instance_ranges(text)?
        .into_iter()
        .flat_map(|(lo, hi)| lo..=hi)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_without_processes_omitted_reads_as_none_and_writes_none() {
        // What an agent older than the field sends.
        let old = r#"{"task_id":"t","seq":1,"state":"RUNNING","exit_reason":null,
            "message":"","timestamp_ms":0,"processes":[]}"#;
        let u: StatusUpdate = serde_json::from_str(old).expect("an old status");
        assert_eq!(u.processes_omitted, None);
        let text = serde_json::to_string(&u).expect("json");
        assert!(!text.contains("processes_omitted"), "{text}");
    }

    #[test]
    fn omitted_processes_are_counted_by_state() {
        let p = |state| ProcessStatus {
            name: "p".into(),
            state,
            pid: None,
            runs: 0,
            failures: 0,
            last_exit: None,
        };
        assert_eq!(OmittedProcesses::of(&[]), None);
        let o = OmittedProcesses::of(&[
            p(ProcessState::Running),
            p(ProcessState::Failed),
            p(ProcessState::Running),
            p(ProcessState::Waiting),
        ])
        .expect("a summary");
        assert_eq!(
            (
                o.count,
                o.running,
                o.failed,
                o.waiting,
                o.succeeded,
                o.killed
            ),
            (4, 2, 1, 1, 0, 0)
        );
    }

    #[test]
    fn only_socket_paths_too_long_for_sun_path_go_through_the_directory() {
        struct Fd;
        impl std::os::fd::AsRawFd for Fd {
            fn as_raw_fd(&self) -> i32 {
                7
            }
        }
        let open = |_: &std::path::Path| Ok::<_, ()>(Fd);
        let short = std::path::Path::new("/var/lib/drover/sandboxes/t-0-abc/.drover/executor.sock");
        let (addr, dir) = socket_address(short, open).unwrap();
        assert_eq!((addr.as_path(), dir.is_none()), (short, true));
        let long = std::path::PathBuf::from(format!("/{}/.drover/executor.sock", "d".repeat(100)));
        let (addr, dir) = socket_address(&long, open).unwrap();
        assert_eq!(
            addr,
            std::path::PathBuf::from("/proc/self/fd/7/executor.sock")
        );
        assert!(dir.is_some());
    }

    #[test]
    fn digest_ignores_order_and_duplicates() {
        assert_eq!(
            task_set_digest(["a", "b"]),
            task_set_digest(["b", "a", "a"])
        );
        assert_ne!(task_set_digest(["ab"]), task_set_digest(["a", "b"]));
    }

    #[test]
    fn the_last_whole_line_of_a_checkpoint_is_current() {
        let status = |seq: u64, state: TaskState| ExecutorStatus {
            seq,
            task_id: "t".into(),
            state,
            exit_reason: None,
            message: String::new(),
            timestamp_ms: 1,
            executor_pid: 2,
            processes: Vec::new(),
            escalation: None,
        };
        let line = |s: &ExecutorStatus| serde_json::to_string(s).unwrap() + "\n";
        let (starting, running) = (
            status(1, TaskState::Starting),
            status(2, TaskState::Running),
        );
        let log = line(&starting) + &line(&running);
        assert_eq!(checkpointed_status(log.as_bytes()), Some(running.clone()));
        // A crash tore the line being appended: the one before it is current.
        let torn = log.clone() + &line(&status(3, TaskState::Finished))[..40];
        assert_eq!(checkpointed_status(torn.as_bytes()), Some(running.clone()));
        // An older executor's file: one status, no newline.
        let old = serde_json::to_vec(&starting).unwrap();
        assert_eq!(checkpointed_status(&old), Some(starting));
        assert_eq!(checkpointed_status(b""), None);
    }

    #[test]
    fn escalation_steps_are_optional_on_the_wire() {
        // An older executor's terminal status, without steps, still parses.
        let old = r#"{"seq":3,"task_id":"t","state":"KILLED","exit_reason":{"kind":"killed_by_request"},
            "message":"","timestamp_ms":1,"executor_pid":2,"processes":[]}"#;
        let status: ExecutorStatus = serde_json::from_str(old).unwrap();
        assert_eq!(status.escalation, None);
        // Without steps nothing is written; with them, only the steps taken.
        assert!(!serde_json::to_string(&status)
            .unwrap()
            .contains("escalation"));
        let steps = EscalationSteps {
            term_ms: Some(2_000),
            kill_ms: Some(3),
            ..EscalationSteps::default()
        };
        let with = ExecutorStatus {
            escalation: Some(Box::new(steps)),
            ..status
        };
        let text = serde_json::to_string(&with).unwrap();
        assert!(
            text.contains(r#""escalation":{"term_ms":2000,"kill_ms":3}"#),
            "{text}"
        );
        assert_eq!(serde_json::from_str::<ExecutorStatus>(&text).unwrap(), with);
        assert_eq!(steps.durations_ms(), [None, None, Some(2_000), Some(3)]);
    }

    #[test]
    fn instance_sets_parse() {
        assert_eq!(parse_instance_set("0-3,7").unwrap(), vec![0, 1, 2, 3, 7]);
        assert!(parse_instance_set("3-1").is_err());
        assert!(parse_instance_set("x").is_err());
    }

    #[test]
    fn instance_sets_merge_ranges_and_bound_the_work() {
        assert_eq!(
            parse_instance_ranges("5-9,0-3,4,20,8-12").unwrap(),
            vec![(0, 12), (20, 20)]
        );
        // 8,000 copies of 1-100000: merged into one range, cheap.
        let many = vec!["1-100000"; 8_000].join(",");
        let started = std::time::Instant::now();
        assert_eq!(parse_instance_ranges(&many).unwrap(), vec![(1, 100_000)]);
        assert_eq!(parse_instance_set(&many).unwrap().len(), 100_000);
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
        let too_many = vec!["1"; MAX_INSTANCE_SET_PARTS + 1].join(",");
        assert!(parse_instance_ranges(&too_many)
            .unwrap_err()
            .contains("at most"));
        assert!(parse_instance_ranges("0-4000000000")
            .unwrap_err()
            .contains("above"));
    }

    #[test]
    fn exec_frames_round_trip_and_partial_buffers_wait() {
        let frames = vec![
            ExecFrame::Stdin(b"ls\n".to_vec()),
            ExecFrame::StdinEof,
            ExecFrame::Resize { rows: 24, cols: 80 },
            ExecFrame::Signal(2),
            ExecFrame::Stdout(vec![0, 255]),
            ExecFrame::Stderr(Vec::new()),
            ExecFrame::Exit(-1),
            ExecFrame::Error("no".into()),
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(|f| f.encode()).collect();
        let mut at = 0;
        let mut back = Vec::new();
        while let Some((f, n)) = ExecFrame::decode(&bytes[at..]).unwrap() {
            back.push(f);
            at += n;
        }
        assert_eq!(back, frames);
        assert_eq!(ExecFrame::decode(&bytes[..3]).unwrap(), None);
        assert_eq!(
            ExecFrame::decode(&[99, 0, 0, 0, 0]),
            Err(ExecFrameError::UnknownKind(99))
        );
        assert!(ExecFrame::decode(&[3, 0, 0, 0, 1, 0]).is_err());
        assert!(ExecFrame::decode(&[0, 255, 255, 255, 255]).is_err());
    }

    #[test]
    fn exec_commands_are_checked() {
        let q = |c: &str| {
            ExecQuery {
                command: c.into(),
                ..Default::default()
            }
            .argv()
        };
        assert_eq!(q(r#"["id","-u"]"#).unwrap(), vec!["id", "-u"]);
        assert!(q("[]").unwrap_err().contains("empty"));
        assert!(q("id").unwrap_err().contains("JSON array"));
    }
}
