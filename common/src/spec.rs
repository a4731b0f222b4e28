//! The job spec: one serde model for jobs, tasks, processes, health checks, lifecycle,
//! updates and partition policy. Field names and defaults follow Apache Aurora.
//! Reading a spec from text with every error reported at once lives in `parse`, and
//! the semantic checks in `validate`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::units::{ByteSize, Duration};

/// A job: `instances` near-identical copies of one task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[schema(example = json!({
    "role": "www-data",
    "environment": "test",
    "name": "example",
    "instances": 1,
    "task": {
        "processes": [{"name": "main", "cmdline": "sleep 60"}],
        "resources": {"cpu": 0.1, "ram": "32MiB", "disk": "32MiB"}
    }
}))]
#[serde(deny_unknown_fields)]
pub struct JobSpec {
    /// The owner, usually a service account; the first part of the job key.
    pub role: String,
    /// `prod`, `staging`, `devel`...; the second part of the job key.
    pub environment: String,
    /// The job's name; the third part of the job key.
    pub name: String,
    /// How many copies of the task to run.
    #[serde(default = "defaults::instances")]
    pub instances: u32,
    /// true: a service, replaced forever; false: a batch job, retried up to
    /// `max_task_failures`.
    #[serde(default)]
    pub service: bool,
    /// `preferred` (production) or `preemptible`.
    #[serde(default)]
    pub tier: Tier,
    /// Importance within the role: among tasks of one tier, a higher priority may
    /// preempt a lower one of the same role, and lower priorities are preempted first.
    #[serde(default)]
    pub priority: u32,
    /// Batch jobs: how many failed tasks per instance before giving up (Aurora: 1).
    #[serde(default = "defaults::one")]
    pub max_task_failures: u32,
    /// Host attribute -> Aurora constraint expression (`limit:2`, `a|b`, `!x`),
    /// parsed as it is read.
    #[serde(default)]
    pub constraints: BTreeMap<String, ConstraintExpr>,
    /// Soft: spread the job's instances evenly over the values of host attributes.
    /// Never refuses a placement; see [`Spread`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Vec<Spread>>,
    /// Soft: prefer (positive weight) or avoid (negative) hosts by attribute value.
    /// Never refuses a placement; see [`Affinity`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Vec<Affinity>>,
    /// How the scheduler chooses among the hosts that fit; absent: each job's
    /// rotating cursor (the next instance tries the host after the last one used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub placement: Option<PlacementStrategy>,
    /// The task every instance runs.
    pub task: TaskSpec,
    /// How the executor decides the task is healthy; absent: process liveness only.
    #[serde(default)]
    pub health_check: Option<HealthCheck>,
    /// How the task is asked to stop; absent: the escalation starts at SIGTERM.
    #[serde(default)]
    pub lifecycle: Option<Lifecycle>,
    /// How a changed config rolls out.
    #[serde(default)]
    pub update: UpdateConfig,
    /// What happens to the task when its agent becomes unreachable.
    #[serde(default)]
    pub partition_policy: PartitionPolicy,
    /// A cron job: the standard 5-field schedule (minute hour day-of-month month
    /// day-of-week) on which a run of the job starts; absent: an ordinary job.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron_schedule: Option<String>,
    /// The IANA time zone the schedule is read in (`Europe/Paris`); absent: UTC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cron_timezone: Option<String>,
    /// What a firing does while the previous run is still active.
    #[serde(default)]
    pub cron_collision_policy: CronCollisionPolicy,
    /// How much disruption host maintenance may cause this job; absent: one
    /// instance at a time (see [`SlaPolicy`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sla_policy: Option<SlaPolicy>,
    /// Service discovery: publish each RUNNING instance's address and ports, and
    /// withdraw it before any kill; absent: the job is not announced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub announce: Option<Announce>,
}

/// One `spread` entry: the job's instances spread evenly over the values of a host
/// attribute. Soft: among the hosts that fit, a host whose value holds fewer than
/// its even share of the job's instances scores up to `weight`, one holding more
/// scores down, and a host without the attribute scores `-weight`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Spread {
    /// The host attribute whose values the instances spread over (`rack`, `zone`).
    pub attribute: String,
    /// 1..=100: how much the spread counts beside the job's other preferences.
    #[serde(default = "defaults::spread_weight")]
    pub weight: u32,
}

/// One `affinity` entry: hosts whose attribute matches `value` score `weight`
/// (negative: avoid them). Soft: never refuses a placement.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Affinity {
    /// The host attribute compared.
    pub attribute: String,
    /// A value expression as in `constraints`: `a`, `a|b` (is one of) or `!a|b`
    /// (is none of; a host without the attribute matches). `limit:N` is refused.
    pub value: ConstraintExpr,
    /// -100..=100, not 0: added to a matching host's score.
    pub weight: i32,
}

/// How the scheduler chooses among the hosts that fit a job's next instance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum PlacementStrategy {
    /// The most used host that fits (by the larger of its CPU and RAM use): fills
    /// one host before the next.
    Binpack,
    /// The least used host that fits.
    Spread,
}

/// Service discovery (Aurora's `Announcer`): while an instance is RUNNING its host
/// address and named ports are published (API, DNS); it is withdrawn `drain_delay`
/// before the first shutdown step of any kill, so clients stop using it first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Announce {
    /// The named port (of `task.ports`) clients connect to by default.
    pub primary_port: String,
    /// Further named ports to publish; the primary port is always published.
    #[serde(default)]
    pub ports: Vec<String>,
    /// The name the service is published under; absent: the job's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Time between the withdrawal and the first shutdown step (5s).
    #[serde(default = "defaults::five_seconds")]
    pub drain_delay: Duration,
}

impl JobSpec {
    /// Production work: counted against its role's quota, never preempted.
    pub fn is_production(&self) -> bool {
        self.tier == Tier::Preferred
    }
}

/// Aurora's cron collision policies: what a firing does while the previous run of
/// the job still has active tasks.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CronCollisionPolicy {
    /// Kill the active run, then start the new one.
    #[default]
    KillExisting,
    /// Skip this firing; the active run goes on.
    CancelNew,
}

impl fmt::Display for CronCollisionPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CronCollisionPolicy::KillExisting => "KILL_EXISTING",
            CronCollisionPolicy::CancelNew => "CANCEL_NEW",
        })
    }
}

/// Aurora's tiers.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Production: counted against the role's quota, never preempted, may preempt
    /// preemptible tasks.
    #[default]
    Preferred,
    /// Not bounded by quota; may be preempted for production work, or for
    /// preemptible work of its own role with a higher priority.
    Preemptible,
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tier::Preferred => "preferred",
            Tier::Preemptible => "preemptible",
        })
    }
}

/// What one instance runs: processes sharing one sandbox and one cgroup.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TaskSpec {
    /// The processes, started in the order `order` allows.
    pub processes: Vec<ProcessSpec>,
    /// Ordering constraints: each entry is a list of process names that run one after
    /// another (`[install, server]`: server starts once install succeeded).
    #[serde(default)]
    pub order: Vec<Vec<String>>,
    /// What the task needs from its host.
    pub resources: Resources,
    /// How many processes may fail before the task fails (Aurora: 1).
    #[serde(default = "defaults::one")]
    pub max_failures: u32,
    /// How many processes may run at once; 0 means no limit.
    #[serde(default)]
    pub max_concurrency: u32,
    /// The longest SIGTERM-to-SIGKILL wait, during which final processes run.
    #[serde(default = "defaults::finalization_wait")]
    pub finalization_wait: Duration,
    /// The Unix user processes run as; absent: the job's role.
    #[serde(default)]
    pub user: Option<String>,
    /// Let the task run as root (the executor's config must allow it too).
    #[serde(default)]
    pub allow_root: bool,
    /// Extra environment for every process; values are templated.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Files the agent fetches into the sandbox before the first process starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<Artifact>,
    /// The task's network: the host's (default) or its own namespace with only
    /// loopback (`isolated`).
    #[serde(default, skip_serializing_if = "Network::is_host")]
    pub network: Network,
}

/// A file the agent fetches (through its cache) into the task's sandbox.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    /// `https://`, `http://` or `file://` (an absolute path on the host, read as the
    /// task user).
    pub url: String,
    /// The content's SHA-256 in hex; required for http(s).
    #[serde(default)]
    pub sha256: Option<String>,
    /// A path relative to the sandbox: the file (default: the URL's file name) or
    /// the directory an archive is unpacked into (default: the sandbox).
    #[serde(default)]
    pub dest: Option<String>,
    /// `auto` unpacks `.tar`, `.tar.gz`, `.tgz`; `none` copies the file as it is.
    #[serde(default)]
    pub extract: Extract,
    /// Permission bits of a copied file, octal (`"0644"`, the default).
    #[serde(default)]
    pub mode: Option<String>,
    /// Adds the execute bits to a copied file.
    #[serde(default)]
    pub executable: bool,
}

/// Whether an artifact is unpacked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Extract {
    /// Unpack what the URL's file name says is an archive.
    #[default]
    Auto,
    /// Copy it as one file.
    None,
}

/// A task's network (`task.network`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Network {
    /// The host's network namespace.
    #[default]
    Host,
    /// Its own network namespace with only loopback: no route out; the executor
    /// forwards the named ports into it from the host.
    Isolated,
}

impl Network {
    /// Whether this is the default, `host` (left out when serialized).
    pub fn is_host(&self) -> bool {
        *self == Network::Host
    }
}

/// One process of a task (a Thermos process).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ProcessSpec {
    /// Unique within the task; names the log files.
    pub name: String,
    /// Run with `/bin/sh -c` after templating.
    pub cmdline: String,
    /// Runs before the process counts as failed; 0 means retry forever (Aurora: 1).
    #[serde(default = "defaults::one")]
    pub max_failures: u32,
    /// Restart even after success.
    #[serde(default)]
    pub daemon: bool,
    /// The task does not wait for it to finish.
    #[serde(default)]
    pub ephemeral: bool,
    /// The shortest time between starts (Aurora: 5s).
    #[serde(default = "defaults::min_duration")]
    pub min_duration: Duration,
    /// Runs during finalization, after the others were told to stop.
    #[serde(default, rename = "final")]
    pub is_final: bool,
}

/// Resources a task requests from its host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    /// CPU cores, a decimal (0.5 is half a core).
    pub cpu: f64,
    /// Memory limit.
    pub ram: ByteSize,
    /// Sandbox disk.
    pub disk: ByteSize,
    /// Named ports; each gets a number from the host's range at placement.
    #[serde(default)]
    pub ports: Vec<String>,
    /// The most processes and threads the task may have at once (its cgroup's
    /// `pids.max`); default [`DEFAULT_PIDS`], at most the host's `max_task_pids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
}

/// `task.resources.pids` when the spec says nothing.
pub const DEFAULT_PIDS: u64 = 1024;
/// The largest `task.resources.pids` (and agent `max_task_pids`): Linux's own limit.
pub const MAX_PIDS: u64 = 4_194_304;

impl Resources {
    /// The task's pids limit: `pids`, else [`DEFAULT_PIDS`].
    pub fn pids_limit(&self) -> u64 {
        self.pids.unwrap_or(DEFAULT_PIDS)
    }
}

/// The kind of health check.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum HealthCheckType {
    /// GET `endpoint`, healthy when the code and body match.
    #[default]
    Http,
    /// Run `command`, healthy on exit 0.
    Shell,
    /// Connect to `port`.
    Tcp,
}

/// Aurora's health check config.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// http, shell or tcp.
    #[serde(default, rename = "type")]
    pub kind: HealthCheckType,
    /// The named port to check (http, tcp); Aurora's `health`.
    #[serde(default = "defaults::health_port")]
    pub port: String,
    /// HTTP path.
    #[serde(default = "defaults::health_endpoint")]
    pub endpoint: String,
    /// The expected body, compared after trimming whitespace.
    #[serde(default = "defaults::expected_response")]
    pub expected_response: String,
    /// The expected HTTP status code.
    #[serde(default = "defaults::expected_response_code")]
    pub expected_response_code: u16,
    /// Shell checks: the command, templated.
    #[serde(default)]
    pub command: Option<String>,
    /// Grace before failures count (Aurora: 15s).
    #[serde(default = "defaults::initial_interval")]
    pub initial_interval: Duration,
    /// Between checks (Aurora: 10s).
    #[serde(default = "defaults::interval")]
    pub interval: Duration,
    /// Per check (Aurora: 1s).
    #[serde(default = "defaults::timeout")]
    pub timeout: Duration,
    /// Failures in a row that kill the task; 0: the first failure after the initial
    /// interval does.
    #[serde(default)]
    pub max_consecutive_failures: u32,
    /// Successes in a row before the task is RUNNING (Aurora: 1).
    #[serde(default = "defaults::one")]
    pub min_consecutive_successes: u32,
}

/// How a task is asked to stop.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Lifecycle {
    /// The HTTP shutdown protocol; absent: start at SIGTERM.
    #[serde(default)]
    pub http: Option<HttpLifecycle>,
}

/// Aurora's HttpLifecycleConfig.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HttpLifecycle {
    /// The named port the endpoints listen on.
    #[serde(default = "defaults::health_port")]
    pub port: String,
    /// POSTed first.
    #[serde(default = "defaults::graceful_shutdown_endpoint")]
    pub graceful_shutdown_endpoint: String,
    /// POSTed second.
    #[serde(default = "defaults::shutdown_endpoint")]
    pub shutdown_endpoint: String,
    /// Wait after the graceful endpoint (5s).
    #[serde(default = "defaults::five_seconds")]
    pub graceful_shutdown_wait: Duration,
    /// Wait after the shutdown endpoint (5s).
    #[serde(default = "defaults::five_seconds")]
    pub shutdown_wait: Duration,
}

/// Rolling update settings (Aurora's UpdateConfig).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpdateConfig {
    /// Instances updated at once.
    #[serde(default = "defaults::one")]
    pub batch_size: u32,
    /// How long an updated instance must stay RUNNING to count as healthy.
    #[serde(default = "defaults::watch")]
    pub watch: Duration,
    /// Failures of one instance that fail the update.
    #[serde(default)]
    pub max_per_instance_failures: u32,
    /// Failed instances that fail the update.
    #[serde(default)]
    pub max_total_failures: u32,
    /// Roll back in reverse order when the update fails.
    #[serde(default = "defaults::yes")]
    pub rollback_on_failure: bool,
}

impl Default for UpdateConfig {
    fn default() -> Self {
        UpdateConfig {
            batch_size: 1,
            watch: defaults::watch(),
            max_per_instance_failures: 0,
            max_total_failures: 0,
            rollback_on_failure: true,
        }
    }
}

/// What happens when the task's agent stops reporting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PartitionPolicy {
    /// Replace the task elsewhere (after `delay`).
    #[serde(default = "defaults::yes")]
    pub reschedule: bool,
    /// How long an unreachable agent's task waits before it is LOST.
    #[serde(default)]
    pub delay: Duration,
    /// Never run two copies of an instance at once, even across a partition: the
    /// agent kills the task when it loses its lease, and the master replaces it only
    /// after the lease and the kill time have passed.
    #[serde(default)]
    pub exclusive: bool,
}

impl Default for PartitionPolicy {
    fn default() -> Self {
        PartitionPolicy {
            reschedule: true,
            delay: Duration::default(),
            exclusive: false,
        }
    }
}

/// How much disruption a drain may cause a job (Aurora's `sla_policy`, a
/// Kubernetes PodDisruptionBudget). Exactly one of `min_healthy`,
/// `min_healthy_percent` and `max_disrupted` is set; a job without a policy drains
/// one instance at a time (`max_disrupted: 1`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SlaPolicy {
    /// At least this many instances RUNNING (healthy) for `min_time` after a kill.
    #[serde(default)]
    pub min_healthy: Option<u32>,
    /// At least this percentage of the instances (rounded up) RUNNING for `min_time`.
    #[serde(default)]
    pub min_healthy_percent: Option<u32>,
    /// How long an instance must have been RUNNING to count as healthy.
    #[serde(default)]
    pub min_time: Duration,
    /// At most this many instances disrupted (not RUNNING, or being drained) at once.
    #[serde(default)]
    pub max_disrupted: Option<u32>,
}

/// `role/environment/name`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct JobKey {
    pub role: String,
    pub environment: String,
    pub name: String,
}

/// Why a string is not a job key.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a job key: write role/environment/name, e.g. www-data/prod/hello")]
pub struct BadJobKey(pub String);

impl JobKey {
    /// Parses `role/environment/name`.
    pub fn parse(text: &str) -> Result<JobKey, BadJobKey> {
        let parts: Vec<&str> = text.split('/').collect();
        match parts.as_slice() {
            [role, environment, name]
                if [role, environment, name].iter().all(|p| is_valid_name(p)) =>
            {
                Ok(JobKey {
                    role: role.to_string(),
                    environment: environment.to_string(),
                    name: name.to_string(),
                })
            }
            _ => Err(BadJobKey(text.to_string())),
        }
    }
}

impl fmt::Display for JobKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}/{}", self.role, self.environment, self.name)
    }
}

impl JobSpec {
    /// This job's key.
    pub fn key(&self) -> JobKey {
        JobKey {
            role: self.role.clone(),
            environment: self.environment.clone(),
            name: self.name.clone(),
        }
    }

    /// The user the task's processes run as.
    pub fn run_as_user(&self) -> &str {
        self.task.user.as_deref().unwrap_or(&self.role)
    }
}

/// Names become paths and cgroup names: `[A-Za-z0-9_.-]{1,64}`, never `.` or `..`,
/// never starting with `-`.
pub fn is_valid_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name != "."
        && name != ".."
        // A leading `-` reads as a flag to the CLI and to shell tools.
        && !name.starts_with('-')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A parsed constraint expression (Aurora syntax), the value side of one
/// `constraints` entry; the key is the host attribute it applies to.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Constraint {
    /// `limit:N`: at most N of this job's tasks on hosts sharing one value of the
    /// attribute (`host: "limit:1"` spreads instances one per host).
    Limit(u32),
    /// `a|b` (the host's value is one of these) or `!a|b` (none of these).
    Value {
        /// The accepted (or, when `negated`, refused) values; never empty.
        values: Vec<String>,
        /// `!`: the host's value must be none of `values`.
        negated: bool,
    },
}

/// One `constraints` value: the expression as written and what it parses to. It is
/// parsed once, when the spec is read (from a file, the API or the store), and
/// carried typed from there: `validate` reports a bad one at its field, the master
/// places with the parsed value. Serialized as the text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConstraintExpr {
    text: String,
    parsed: Result<Constraint, ConstraintError>,
}

impl ConstraintExpr {
    /// Parses `text` (see [`parse_constraint`]); a bad expression is kept with its error.
    pub fn new(text: impl Into<String>) -> ConstraintExpr {
        let text = text.into();
        let parsed = parse_constraint(&text);
        ConstraintExpr { text, parsed }
    }

    /// The expression as written.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The parsed constraint, or why the text is not one.
    pub fn parsed(&self) -> Result<&Constraint, &ConstraintError> {
        self.parsed.as_ref()
    }
}

impl From<&str> for ConstraintExpr {
    fn from(text: &str) -> ConstraintExpr {
        ConstraintExpr::new(text)
    }
}

impl From<String> for ConstraintExpr {
    fn from(text: String) -> ConstraintExpr {
        ConstraintExpr::new(text)
    }
}

impl utoipa::PartialSchema for ConstraintExpr {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::units::text_schema(
            "an Aurora constraint: `limit:N`, `value`, `a|b` or `!value`",
            "limit:1",
        )
    }
}

impl utoipa::ToSchema for ConstraintExpr {}

impl Serialize for ConstraintExpr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.text)
    }
}

impl<'de> Deserialize<'de> for ConstraintExpr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ConstraintExpr, D::Error> {
        String::deserialize(d).map(ConstraintExpr::new)
    }
}

/// Why a constraint expression could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ConstraintError {
    #[error("empty constraint: write `limit:N`, `value`, `a|b` or `!value`")]
    Empty,
    #[error(
        "`{0}` is not a limit: write `limit:N` with a whole number N of 1 or more, e.g. limit:2"
    )]
    BadLimit(String),
    #[error("`{0}` has an empty value between `|`: write values like `a|b`")]
    EmptyValue(String),
    #[error("`{0}` has a value with whitespace or control characters; write values like `us-east-1a|us-east-1b`")]
    BadValue(String),
}

/// Parses an Aurora constraint expression: `limit:N` (N >= 1), `a|b|c`, `!a|b`.
pub fn parse_constraint(expr: &str) -> Result<Constraint, ConstraintError> {
    let text = expr.trim();
    if text.is_empty() {
        return Err(ConstraintError::Empty);
    }
    if let Some(limit) = text.strip_prefix("limit:") {
        return match limit.trim().parse::<u32>() {
            Ok(n) if n >= 1 => Ok(Constraint::Limit(n)),
            _ => Err(ConstraintError::BadLimit(expr.to_string())),
        };
    }
    let (negated, body) = match text.strip_prefix('!') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let mut values = Vec::new();
    for value in body.split('|') {
        let value = value.trim();
        if value.is_empty() {
            return Err(ConstraintError::EmptyValue(expr.to_string()));
        }
        if value.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(ConstraintError::BadValue(expr.to_string()));
        }
        values.push(value.to_string());
    }
    Ok(Constraint::Value { values, negated })
}

impl Constraint {
    /// For value constraints: whether a host whose attribute has `host_value` (None:
    /// the host lacks the attribute) may run the task. Limit constraints depend on
    /// the other tasks placed, which the scheduler counts; here they always allow.
    pub fn allows_value(&self, host_value: Option<&str>) -> bool {
        match self {
            Constraint::Limit(_) => true,
            Constraint::Value { values, negated } => {
                let listed = host_value.is_some_and(|v| values.iter().any(|x| x == v));
                listed != *negated
            }
        }
    }
}

impl fmt::Display for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Constraint::Limit(n) => write!(f, "limit:{n}"),
            Constraint::Value { values, negated } => {
                if *negated {
                    write!(f, "!")?;
                }
                write!(f, "{}", values.join("|"))
            }
        }
    }
}

/// Aurora's defaults, one function per serde default.
pub mod defaults {
    use crate::units::Duration;

    pub fn instances() -> u32 {
        1
    }
    pub fn spread_weight() -> u32 {
        50
    }
    pub fn one() -> u32 {
        1
    }
    pub fn yes() -> bool {
        true
    }
    pub fn finalization_wait() -> Duration {
        Duration::from_secs(30)
    }
    pub fn min_duration() -> Duration {
        Duration::from_secs(5)
    }
    pub fn health_port() -> String {
        "health".to_string()
    }
    pub fn health_endpoint() -> String {
        "/health".to_string()
    }
    pub fn expected_response() -> String {
        "ok".to_string()
    }
    pub fn expected_response_code() -> u16 {
        200
    }
    pub fn initial_interval() -> Duration {
        Duration::from_secs(15)
    }
    pub fn interval() -> Duration {
        Duration::from_secs(10)
    }
    pub fn timeout() -> Duration {
        Duration::from_secs(1)
    }
    pub fn graceful_shutdown_endpoint() -> String {
        "/quitquitquit".to_string()
    }
    pub fn shutdown_endpoint() -> String {
        "/abortabortabort".to_string()
    }
    pub fn five_seconds() -> Duration {
        Duration::from_secs(5)
    }
    pub fn watch() -> Duration {
        Duration::from_secs(45)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constraints_parse_aurora_syntax() {
        assert_eq!(parse_constraint("limit:2"), Ok(Constraint::Limit(2)));
        assert_eq!(
            parse_constraint("us-east-1a|us-east-1b"),
            Ok(Constraint::Value {
                values: vec!["us-east-1a".into(), "us-east-1b".into()],
                negated: false
            })
        );
        assert_eq!(
            parse_constraint("!windows"),
            Ok(Constraint::Value {
                values: vec!["windows".into()],
                negated: true
            })
        );
        for bad in ["", "limit:0", "limit:x", "limit:-1", "a||b", "!", "a b"] {
            assert!(parse_constraint(bad).is_err(), "{bad:?} should be refused");
        }
    }

    #[test]
    fn constraints_print_back_to_the_same_text() {
        for text in ["limit:3", "a|b", "!windows", "www-data/hello"] {
            assert_eq!(parse_constraint(text).unwrap().to_string(), text);
        }
    }

    #[test]
    fn value_constraints_match_host_attributes() {
        let zone = parse_constraint("a|b").unwrap();
        assert!(zone.allows_value(Some("a")));
        assert!(!zone.allows_value(Some("c")));
        assert!(!zone.allows_value(None));
        let not_windows = parse_constraint("!windows").unwrap();
        assert!(not_windows.allows_value(Some("linux")));
        assert!(not_windows.allows_value(None));
        assert!(!not_windows.allows_value(Some("windows")));
    }

    #[test]
    fn constraint_expressions_are_parsed_when_read_and_written_back_as_given() {
        let read: BTreeMap<String, ConstraintExpr> =
            serde_json::from_str(r#"{"rack":"limit:2","zone":"a||b"}"#).unwrap();
        assert_eq!(read["rack"].parsed(), Ok(&Constraint::Limit(2)));
        assert!(matches!(
            read["zone"].parsed(),
            Err(ConstraintError::EmptyValue(_))
        ));
        assert_eq!(read["zone"].text(), "a||b");
        assert_eq!(
            serde_json::to_string(&read).unwrap(),
            r#"{"rack":"limit:2","zone":"a||b"}"#
        );
    }

    #[test]
    fn names_refuse_paths_and_odd_characters() {
        assert!(is_valid_name("www-data"));
        assert!(!is_valid_name("-rf"), "a leading dash reads as a flag");
        assert!(is_valid_name("a.b_c-1"));
        for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(65), "é"] {
            assert!(!is_valid_name(bad), "{bad:?}");
        }
    }
}
