//! The `drover-executor` binary: parses the command line and hands over to the
//! library (`run` a task, or `cleanup` after a crashed executor).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use drover_common::units::{ByteSize, Duration as SpecDuration};

#[derive(Parser)]
#[command(
    name = "drover-executor",
    version,
    about = "Runs one Drover task: sandbox, cgroup, processes, health checks, kill escalation."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a task; print every status as a JSON line on stdout.
    Run {
        /// The task file: JSON of wire::ExecutorTask.
        #[arg(long)]
        task: PathBuf,
        /// The sandbox directory (the processes' working directory).
        #[arg(long)]
        sandbox: PathBuf,
        /// Run without a cgroup and as the current user (when not root or no cgroups).
        #[arg(long)]
        no_isolation: bool,
        /// Allow the task to run as root if its spec's task.allow_root says so too.
        #[arg(long)]
        allow_root: bool,
        /// Kill the task when no agent was connected to the socket this long.
        #[arg(long, default_value = "15m")]
        recovery_timeout: SpecDuration,
        /// The cgroup under which the task's cgroup `<task_id>` is made.
        #[arg(long, default_value = "drover")]
        cgroup_parent: String,
        /// Where the cgroup filesystem is mounted.
        #[arg(long, default_value = "/sys/fs/cgroup")]
        cgroup_root: PathBuf,
        /// The task cgroup's pids limit (processes and threads).
        #[arg(long, default_value_t = 4096)]
        pids_max: u64,
        /// Rotate a process log file at this size.
        #[arg(long, default_value = "100MiB")]
        log_max_size: ByteSize,
        /// How many rotated log files to keep per stream.
        #[arg(long, default_value_t = 5)]
        log_max_files: u32,
        /// Debug without an agent: no recovery timeout, exit as soon as the task ended,
        /// stay in the caller's session (Ctrl-C starts the kill escalation).
        #[arg(long)]
        standalone: bool,
    },
    /// Kill everything left in a task's cgroup and remove it (after an executor crash).
    Cleanup {
        /// The task's sandbox.
        #[arg(long)]
        sandbox: PathBuf,
        /// The task id; default: read from the sandbox's .drover/task.json.
        #[arg(long)]
        task_id: Option<String>,
        /// As given to `run`.
        #[arg(long, default_value = "drover")]
        cgroup_parent: String,
        /// As given to `run`.
        #[arg(long, default_value = "/sys/fs/cgroup")]
        cgroup_root: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    match cli.command {
        Command::Run {
            task,
            sandbox,
            no_isolation,
            allow_root,
            recovery_timeout,
            cgroup_parent,
            cgroup_root,
            pids_max,
            log_max_size,
            log_max_files,
            standalone,
        } => {
            let code = drover_executor::run(drover_executor::Options {
                task_file: task,
                sandbox,
                no_isolation,
                allow_root,
                recovery_timeout: recovery_timeout.get(),
                cgroup_parent,
                cgroup_root,
                pids_max,
                log_max_bytes: log_max_size.bytes(),
                log_keep: log_max_files,
                standalone,
            });
            ExitCode::from(code as u8)
        }
        Command::Cleanup {
            sandbox,
            task_id,
            cgroup_parent,
            cgroup_root,
        } => match drover_executor::cleanup::cleanup(
            &sandbox,
            task_id.as_deref(),
            &cgroup_parent,
            &cgroup_root,
        ) {
            Ok(msg) => {
                eprintln!("drover-executor cleanup: {msg}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("drover-executor cleanup: {e}");
                ExitCode::from(1)
            }
        },
    }
}
