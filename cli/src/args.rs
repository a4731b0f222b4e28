//! The command line, as clap types only: what each subcommand and flag is. The
//! behaviour lives in the other modules.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::render::StartAt;

/// The default master address: what `drover dev` listens on unless told otherwise.
/// The CLI says on stderr when it falls back to it (see [`master_or_default`]).
pub const DEFAULT_MASTER: &str = "http://127.0.0.1:7070";

/// drover: operate a Drover cluster, or run one on this host with `drover dev`.
#[derive(Debug, Parser)]
#[command(name = "drover", version, about, long_about = None)]
pub struct Cli {
    /// The master's admin API [default: http://127.0.0.1:7070, with a note on stderr
    /// naming it]; masters on etcd: several URLs separated by commas (the CLI asks
    /// their /health which one leads).
    #[arg(long, global = true, env = "DROVER_MASTER", value_name = "URL")]
    pub master: Option<String>,

    /// A file holding the bearer token sent to the master (else DROVER_TOKEN, else
    /// `token` / `token_file` in ~/.config/drover/config.toml).
    #[arg(long, global = true, env = "DROVER_TOKEN_FILE", value_name = "FILE")]
    pub token_file: Option<PathBuf>,

    /// The cluster CA (PEM) that an https:// master's certificate must chain to.
    #[arg(long, global = true, env = "DROVER_CA", value_name = "FILE.pem")]
    pub ca: Option<PathBuf>,

    /// Masters on etcd: reads may be answered from a standby's copy of the state
    /// while no leader answers (a failover); such answers may miss the last writes.
    #[arg(long, global = true)]
    pub stale: bool,

    #[command(subcommand)]
    pub command: Command,
}

/// Top-level subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Validate, create, inspect, kill and restart jobs.
    #[command(subcommand)]
    Job(JobCommand),
    /// Inspect tasks and read their logs.
    #[command(subcommand)]
    Task(TaskCommand),
    /// Inspect agents; forbid or allow one.
    #[command(subcommand)]
    Agent(AgentCommand),
    /// Take hosts out of service for maintenance and bring them back.
    #[command(subcommand)]
    Host(HostCommand),
    /// Create, list and revoke API tokens (admin).
    #[command(subcommand)]
    Token(TokenCommand),
    /// Make a cluster CA and the certificates of masters and agents (offline).
    #[command(subcommand)]
    Tls(TlsCommand),
    /// The fleet at a glance and the eviction guard.
    #[command(subcommand)]
    Cluster(ClusterCommand),
    /// Production quotas per role: show them, or set one (admin).
    #[command(subcommand)]
    Quota(QuotaCommand),
    /// Cron jobs: list them with their next firing, run one now, deschedule one.
    #[command(subcommand)]
    Cron(CronCommand),
    /// The Unix users a role's tasks may run as: show them, grant or revoke one
    /// (admin).
    #[command(subcommand)]
    Role(RoleCommand),
    /// Announced services (jobs with `announce`): list them, show one's endpoints.
    #[command(subcommand)]
    Service(ServiceCommand),
    /// Run a master and agents on this host, optionally with a job, until Ctrl-C.
    Dev(DevArgs),
    /// Open the master's web page of the cluster, a role or a job in a browser
    /// ($BROWSER, else xdg-open); prints the address (only that, with no browser).
    Open {
        /// ROLE (its jobs) or ROLE/ENV/NAME (a job); none: the cluster overview.
        key: Option<String>,
    },
    /// Print a shell completion script, e.g. `drover completions bash >
    /// /etc/bash_completion.d/drover` (no master needed).
    Completions {
        /// The shell.
        shell: Shell,
    },
}

/// The shells `drover completions` writes for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

/// `drover job ...`
#[derive(Debug, Subcommand)]
pub enum JobCommand {
    /// Check job spec files (YAML, TOML or JSON) without a master.
    Validate {
        /// Spec files; the extension picks the format (.yaml/.yml, .toml, .json).
        #[arg(required = true)]
        files: Vec<PathBuf>,
    },
    /// Submit a job spec to the master.
    Create {
        /// The spec file (.yaml/.yml, .toml or .json).
        file: PathBuf,
        /// Wait until every instance is RUNNING (FINISHED for a batch job), showing
        /// progress; fail if a task fails.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits, e.g. 90s or 5m.
        #[arg(long, default_value = "5m", value_parser = parse_duration)]
        timeout: Duration,
    },
    /// Show a job's summary (instances per state and per config) and its first
    /// 100 instances (--all: every one; role/env/name/INSTANCES: those): each
    /// one's current task, state, agent, ports, reason.
    Status {
        /// role/environment/name[/INSTANCES]
        key: String,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Show every instance (read page by page), not only the first 100.
        #[arg(long)]
        all: bool,
        /// Print the status again whenever the job changes (the master's change
        /// stream), until Ctrl-C.
        #[arg(long, short = 'w', conflicts_with = "json")]
        watch: bool,
    },
    /// List jobs, optionally of one role.
    List {
        /// Only this role's jobs.
        role: Option<String>,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Kill a job, or some of its instances (role/env/name/0-3,7).
    Kill {
        /// role/environment/name[/INSTANCES]
        target: String,
    },
    /// Restart a job, or some of its instances (role/env/name/0-3,7). A whole job
    /// restarts rolling: batch by batch (its `update.batch_size`), each batch
    /// withdrawn from discovery, drained `announce.drain_delay`, replaced, and
    /// RUNNING for `update.watch` before the next (`drover job update status KEY`
    /// follows it). Named instances restart at once.
    Restart {
        /// role/environment/name[/INSTANCES]
        target: String,
        /// Restart every instance of the whole job at once (no batches).
        #[arg(long)]
        all_at_once: bool,
    },
    /// Show what `drover job update FILE` would change, changing nothing: instances
    /// added, removed, replaced, and each changed field. Exit 0: nothing would
    /// change; 1: something would.
    Diff {
        /// The new spec file (.yaml/.yml, .toml or .json).
        file: PathBuf,
        /// Only these instances, e.g. 0 (a canary) or 0-3,7.
        #[arg(long)]
        instances: Option<String>,
    },
    /// Roll a job onto a new spec batch by batch (the spec's `update` section), or
    /// inspect and steer its update: `drover job update status|pause|resume|abort|rollback KEY`.
    Update(UpdateArgs),
}

/// `drover job update FILE [--instances R] [--wait]`, or an action on the running one.
#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct UpdateArgs {
    #[command(subcommand)]
    pub action: Option<UpdateCommand>,
    /// The new spec file (.yaml/.yml, .toml or .json).
    #[arg(required = true)]
    pub file: Option<PathBuf>,
    /// Only these instances, e.g. 0 (a canary) or 0-3,7.
    #[arg(long)]
    pub instances: Option<String>,
    /// Wait until the update ends, showing its progress; exit 1 unless it rolled
    /// forward.
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits, e.g. 10m.
    #[arg(long, default_value = "30m", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// `drover job update ACTION KEY`.
#[derive(Debug, Subcommand)]
pub enum UpdateCommand {
    /// Show the job's latest update: state, per-instance progress, events.
    Status {
        /// role/environment/name
        key: String,
        /// Print the API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Start no new batch (the instances in flight finish).
    Pause {
        /// role/environment/name
        key: String,
    },
    /// Go on where a pause stopped.
    Resume {
        /// role/environment/name
        key: String,
    },
    /// Stop the update, leaving every instance on the config it runs.
    Abort {
        /// role/environment/name
        key: String,
    },
    /// Put every instance the update touched back on its config, in reverse order.
    Rollback {
        /// role/environment/name
        key: String,
    },
}

/// `drover task ...`
#[derive(Debug, Subcommand)]
pub enum TaskCommand {
    /// Show a task: state, agent, ports, processes, events and exit reason.
    Show {
        /// The task id (see `drover job status`).
        task_id: String,
        /// Print the API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print a process's log of an instance's current task.
    Logs {
        /// role/environment/name/INSTANCE
        target: String,
        /// The process; default: the task's first process.
        #[arg(long)]
        process: Option<String>,
        /// Read stderr instead of stdout.
        #[arg(long)]
        stderr: bool,
        /// Keep printing as the log grows, until the task ends or Ctrl-C.
        #[arg(short = 'f', long)]
        follow: bool,
    },
    /// Run a command inside an instance's running task (its user, cgroup,
    /// namespaces, working directory and environment); exits with its status.
    Exec {
        /// role/environment/name/INSTANCE
        target: String,
        /// Take the user and environment of this process (default: the first
        /// running one).
        #[arg(long)]
        process: Option<String>,
        /// Pass stdin to the command.
        #[arg(short = 'i', long)]
        interactive: bool,
        /// Run the command on a terminal (a PTY); the local terminal goes raw.
        #[arg(short = 't', long)]
        tty: bool,
        /// The command and its arguments, after --.
        #[arg(last = true, required = true)]
        command: Vec<String>,
    },
}

/// `drover agent ...`
#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// List agents with their resources, free resources, attributes and tasks.
    List {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Refuse an agent from now on (revokes its tokens; its tasks are replaced
    /// elsewhere once it counts as unreachable).
    Forbid {
        /// The agent id (see `drover agent list`).
        agent_id: String,
    },
    /// Allow a forbidden agent again (it needs a new agent token).
    Allow {
        /// The agent id.
        agent_id: String,
    },
}

/// `drover token ...`
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it (it is shown only this once).
    Create {
        /// `admin`, `operator`, `agent`, `discovery` (reads every announced
        /// service and nothing else), or job roles (repeatable, e.g. --role
        /// www-data --role db) whose jobs the token may create, kill, restart and read.
        #[arg(long = "role", required = true, value_name = "ROLE")]
        roles: Vec<String>,
        /// With --role agent: bind the token to this agent id now (else it is bound
        /// to the id it first registers with).
        #[arg(long)]
        agent_id: Option<String>,
        /// A note shown by `drover token list`.
        #[arg(long, default_value = "")]
        description: String,
    },
    /// List tokens (never their secrets).
    List {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Revoke a token: refused from the next request on.
    Revoke {
        /// The token id (the part after `drv_` and before the next `_`).
        token_id: String,
    },
}

/// `drover tls ...`
#[derive(Debug, Subcommand)]
pub enum TlsCommand {
    /// Create a cluster CA: DIR/ca.pem and DIR/ca.key (mode 0600).
    Init {
        /// Where the CA is written.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Issue a certificate signed by the CA in DIR: DIR/KIND-NAME.pem and .key.
    Issue {
        /// `agent` (identity NAME.agent.drover, NAME = the agent id) or `master`
        /// (identity master.drover, plus NAME as a host name or IP address).
        kind: crate::tls::Kind,
        /// The agent id, or the master's host name or IP address.
        name: String,
        /// Where the CA is and the certificate is written.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Another host name or IP address the holder is reached at (repeatable).
        #[arg(long = "san", value_name = "NAME")]
        extra: Vec<String>,
    },
}

/// `drover cluster ...`
#[derive(Debug, Subcommand)]
pub enum ClusterCommand {
    /// Agents reachable, and whether the eviction guard holds back agent losses.
    Status {
        /// Print the API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Release the eviction guard: tasks on the agents lost so far are LOST and
    /// replaced (at the configured agent_loss_rate). Use it when the agents are
    /// really gone, not when the master or its network is at fault.
    ReleaseGuard,
}

/// `drover host ...`: hosts are named by agent id or host name.
#[derive(Debug, Subcommand)]
pub enum HostCommand {
    /// List hosts with their maintenance mode and tasks left.
    List {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show hosts' maintenance: mode, reason, deadline, what blocks a drain, events.
    Status {
        #[arg(required = true)]
        hosts: Vec<String>,
        /// Print the API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Cordon hosts (SCHEDULED): no new placements, running tasks stay.
    Cordon {
        #[arg(required = true)]
        hosts: Vec<String>,
    },
    /// Drain hosts: move their tasks elsewhere within each job's SLA policy.
    Drain {
        #[arg(required = true)]
        hosts: Vec<String>,
        /// Force what is left this long after the drain starts, e.g. 30m.
        #[arg(long, value_parser = parse_duration)]
        deadline: Option<Duration>,
        /// Cordon now (SCHEDULED) and start the drain at TIME: UTC
        /// `2026-11-25T02:00:00Z` (or `2026-11-25 02:00`), or `+DURATION` from now
        /// (e.g. +2h).
        #[arg(long, value_name = "TIME", value_parser = crate::render::parse_start_at)]
        start_at: Option<StartAt>,
        /// Wait until every host is DRAINED, showing progress per host.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits, e.g. 1h.
        #[arg(long, default_value = "1h", value_parser = parse_duration)]
        timeout: Duration,
        /// Change nothing: predict, per host and job, whether the drain stays within
        /// each job's policy and how long it takes.
        #[arg(long, conflicts_with_all = ["wait", "deadline", "start_at"])]
        dry_run: bool,
    },
    /// End maintenance (or a quarantine): hosts take new tasks again.
    Activate {
        #[arg(required = true)]
        hosts: Vec<String>,
    },
}

/// `drover quota ...`
#[derive(Debug, Subcommand)]
pub enum QuotaCommand {
    /// Set the production resources ROLE's jobs may hold (admin); 0 for a resource
    /// allows none of it.
    Set {
        /// The role.
        role: String,
        /// CPU cores (decimal, e.g. 8 or 0.5).
        #[arg(long)]
        cpu: f64,
        /// Memory, e.g. 16GiB.
        #[arg(long)]
        ram: drover_common::units::ByteSize,
        /// Disk, e.g. 100GiB.
        #[arg(long)]
        disk: drover_common::units::ByteSize,
    },
    /// Remove ROLE's quota: its production jobs are no longer bounded (admin).
    Remove {
        /// The role.
        role: String,
    },
    /// The quota and production use of ROLE, or of every role with either.
    Show {
        /// The role (all when absent).
        role: Option<String>,
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// `drover service ...`
#[derive(Debug, Subcommand)]
pub enum ServiceCommand {
    /// Every announced service the token may read, with its endpoint count.
    List {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// A service's announced instances: host, IP, ports, task.
    Show {
        /// ROLE/ENV/NAME (NAME: `announce.name`, else the job's name).
        service: String,
        /// Print the API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `drover role ...`
#[derive(Debug, Subcommand)]
pub enum RoleCommand {
    /// Let ROLE's tasks run as USER (`task.user`) beside the role's own user (admin).
    GrantUser {
        /// The role.
        role: String,
        /// The Unix user, e.g. backup.
        user: String,
    },
    /// Take USER back from ROLE (admin): its jobs running as USER run on, flagged,
    /// and their next update, restart or rollback is refused.
    RevokeUser {
        /// The role.
        role: String,
        /// The Unix user.
        user: String,
    },
    /// The users ROLE's tasks may run as, and its jobs running as one no longer
    /// granted.
    Show {
        /// The role.
        role: String,
        /// Print the API's JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// `drover cron ...`
#[derive(Debug, Subcommand)]
pub enum CronCommand {
    /// Every cron job: schedule, time zone, collision policy, next and last firing.
    List {
        /// Print the API's JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Run the cron job now (its collision policy applies; the schedule is unchanged).
    Start {
        /// The job key, role/env/name.
        key: String,
    },
    /// Stop the job's firings: a job without active tasks is removed, one with a
    /// run going keeps it as an ordinary job.
    Deschedule {
        /// The job key, role/env/name.
        key: String,
    },
}

/// `drover dev ...`
#[derive(Debug, Args)]
pub struct DevArgs {
    /// How many agents to start (each with host=dev-agent-K, rack=rK).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=32))]
    pub agents: u32,
    /// A job spec to submit once the cluster is up, and follow.
    #[arg(long)]
    pub job: Option<PathBuf>,
    /// Keep state, logs and sandboxes here (default: a temporary directory, removed
    /// on exit).
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The master's port on 127.0.0.1 (0: any free port).
    #[arg(long, default_value_t = 7070)]
    pub port: u16,
    /// Exit 0 once every instance of --job is RUNNING (FINISHED for a batch job),
    /// after stopping everything; non-zero if the job fails or --timeout passes.
    #[arg(long, alias = "until-running", requires = "job")]
    pub exit_when_running: bool,
    /// How long --exit-when-running waits, e.g. 60s.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    pub timeout: Duration,
}

/// The master to talk to: `--master` / `DROVER_MASTER`, else [`DEFAULT_MASTER`] with
/// the note to print on stderr, so a newcomer's commands never go to whatever listens
/// on the default port without a word.
pub fn master_or_default(master: Option<String>) -> (String, Option<String>) {
    match master.filter(|m| !m.trim().is_empty()) {
        Some(master) => (master, None),
        None => (
            DEFAULT_MASTER.to_string(),
            Some(format!(
                "note: talking to the default master {DEFAULT_MASTER} (neither --master nor \
                 DROVER_MASTER is set; `drover dev` prints the line to use for its cluster)"
            )),
        ),
    }
}

/// Reads `30s`, `5m`, `250ms` with the job spec's duration syntax.
fn parse_duration(text: &str) -> Result<Duration, String> {
    text.parse::<drover_common::units::Duration>()
        .map(|d| d.get())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_line_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn durations_use_the_spec_syntax() {
        assert_eq!(parse_duration("90s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("ninety").is_err());
    }

    #[test]
    fn the_default_master_comes_with_a_note_naming_it() {
        let (master, note) = master_or_default(None);
        assert_eq!(master, DEFAULT_MASTER);
        assert!(note.unwrap().contains(DEFAULT_MASTER));
        let (master, note) = master_or_default(Some("https://m:1".into()));
        assert_eq!((master.as_str(), note), ("https://m:1", None));
        assert!(master_or_default(Some(String::new())).1.is_some());
    }

    #[test]
    fn update_takes_a_file_or_an_action() {
        let parse = |args: &[&str]| Cli::try_parse_from(args);
        assert!(parse(&["drover", "job", "update", "web.yaml", "--instances", "0"]).is_ok());
        assert!(
            parse(&["drover", "task", "exec", "a/b/c/0", "-it", "--", "sh", "-c", "x y"]).is_ok()
        );
        assert!(
            parse(&["drover", "task", "exec", "a/b/c/0"]).is_err(),
            "a command is required"
        );
        assert!(parse(&["drover", "job", "update", "status", "a/b/c"]).is_ok());
        assert!(parse(&["drover", "job", "update"]).is_err());
    }

    #[test]
    fn exit_when_running_needs_a_job() {
        assert!(Cli::try_parse_from(["drover", "dev", "--exit-when-running"]).is_err());
        assert!(
            Cli::try_parse_from(["drover", "dev", "--until-running", "--job", "x.yaml"]).is_ok()
        );
    }
}
