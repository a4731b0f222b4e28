//! The `drover-executor` binary: parses the command line and hands over to the
//! library (`run` a task, `zygote` to serve an agent's fork requests, `cleanup`
//! after a crashed executor, or `exec` a command in a task for `drover task exec`).
//!
//! The parser is hand-written rather than clap: clap alone is about a quarter
//! megabyte of code, and every host runs one executor per task.

use std::path::PathBuf;
use std::process::ExitCode;

use drover_common::units::{ByteSize, Duration as SpecDuration};

const USAGE: &str = "\
drover-executor: runs one Drover task (sandbox, cgroup, processes, health checks, kill escalation)

usage:
  drover-executor run --task FILE --sandbox DIR [options]
      (DIR is the task directory, root's; the processes work in DIR/sandbox)
      --no-isolation            run without a cgroup and without switching users
      --allow-root              allow a task to run as root (its spec must allow it too)
      --recovery-timeout DUR    kill the task when no agent was connected this long [15m]
      --cgroup-parent PATH      the task cgroup is PATH/<task_id>, PATH relative to the
                                cgroup root (e.g. inside the agent's delegated subtree) [drover]
      --cgroup-root DIR         where the cgroup filesystem is mounted [/sys/fs/cgroup]
      --pids-max N              the most task.resources.pids may ask for; the default
                                limit (1024) is cut to it [4096]
      --log-max-size SIZE       rotate process logs at this size [100MiB]
      --log-max-files N         rotated log files kept per stream [5]
      --disk-scan-interval DUR  scan sandbox/ and tmp/ for resources.disk this often at
                                most (a big tree less often) [5s]
      --ready-fd N              write a byte to (and close) inherited fd N once the socket listens
      --standalone              debug without an agent: no recovery timeout, exit when
                                the task ends, Ctrl-C starts the kill escalation
  drover-executor zygote --socket-fd N
      fork server for an agent: on the inherited SOCK_SEQPACKET socket N, forks one
      `run` executor per request (see docs/executor.md); exits when the agent's end closes
  drover-executor cleanup --sandbox DIR [--task-id ID] [--cgroup-parent PATH] [--cgroup-root DIR]
      kill everything left in the task's cgroup and remove it (after an executor crash)
  drover-executor exec --task-dir DIR --pid PID [--tty] [--cgroup-root DIR] -- CMD ARGS...
      run CMD inside the task of DIR as its process PID runs (user, cgroup, namespaces,
      environment) in its sandbox/, for `drover task exec`; exits with CMD's status
";

use drover_executor::Usage;

fn value<T: std::str::FromStr>(
    args: &mut impl Iterator<Item = String>,
    flag: &str,
    what: &str,
) -> Result<T, Usage>
where
    T::Err: std::fmt::Display,
{
    let text = args
        .next()
        .ok_or_else(|| Usage(format!("{flag} needs a value: {what}")))?;
    text.parse()
        .map_err(|e| Usage(format!("{flag} `{text}`: {e} (expected {what})")))
}

fn parse_run(mut args: impl Iterator<Item = String>) -> Result<drover_executor::Options, Usage> {
    let mut task = None;
    let mut sandbox = None;
    let mut opts = drover_executor::Options {
        task_file: PathBuf::new(),
        sandbox: PathBuf::new(),
        no_isolation: false,
        allow_root: false,
        recovery_timeout: std::time::Duration::from_secs(15 * 60),
        cgroup_parent: "drover".into(),
        cgroup_root: PathBuf::from("/sys/fs/cgroup"),
        pids_max: 4096,
        log_max_bytes: 100 << 20,
        log_keep: 5,
        standalone: false,
        ready_fd: None,
        migration_warm: false,
        disk_scan_interval: std::time::Duration::from_secs(5),
        agent_fd: None,
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--task" => task = Some(value::<PathBuf>(&mut args, "--task", "a task file")?),
            "--sandbox" => sandbox = Some(value::<PathBuf>(&mut args, "--sandbox", "a directory")?),
            "--no-isolation" => opts.no_isolation = true,
            "--allow-root" => opts.allow_root = true,
            "--standalone" => opts.standalone = true,
            "--recovery-timeout" => {
                opts.recovery_timeout =
                    value::<SpecDuration>(&mut args, &arg, "a duration like 15m")?.get()
            }
            "--cgroup-parent" => opts.cgroup_parent = value(&mut args, &arg, "a cgroup path")?,
            "--cgroup-root" => opts.cgroup_root = value(&mut args, &arg, "a directory")?,
            "--pids-max" => opts.pids_max = value(&mut args, &arg, "a number")?,
            "--log-max-size" => {
                opts.log_max_bytes =
                    value::<ByteSize>(&mut args, &arg, "a size like 100MiB")?.bytes()
            }
            "--log-max-files" => opts.log_keep = value(&mut args, &arg, "a number")?,
            "--disk-scan-interval" => {
                opts.disk_scan_interval =
                    value::<SpecDuration>(&mut args, &arg, "a duration like 5s")?.get()
            }
            "--ready-fd" => {
                opts.ready_fd = Some(value(&mut args, &arg, "a file descriptor number")?)
            }
            other => return Err(Usage(format!("run: unknown argument `{other}`"))),
        }
    }
    opts.task_file = task.ok_or_else(|| Usage("run needs --task FILE".into()))?;
    opts.sandbox = sandbox.ok_or_else(|| Usage("run needs --sandbox DIR".into()))?;
    drover_executor::cgroup::check_parent(&opts.cgroup_parent)
        .map_err(|e| Usage(format!("--cgroup-parent {e}")))?;
    Ok(opts)
}

fn zygote(mut args: impl Iterator<Item = String>) -> Result<ExitCode, Usage> {
    let mut socket_fd: Option<i32> = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--socket-fd" => socket_fd = Some(value(&mut args, &arg, "a file descriptor number")?),
            other => return Err(Usage(format!("zygote: unknown argument `{other}`"))),
        }
    }
    let socket_fd = socket_fd.ok_or_else(|| Usage("zygote needs --socket-fd N".into()))?;
    let parse = |args: &[String]| parse_run(args.iter().cloned());
    match drover_executor::zygote::serve(socket_fd, parse) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            eprintln!("drover-executor zygote: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

fn cleanup(mut args: impl Iterator<Item = String>) -> Result<ExitCode, Usage> {
    let mut sandbox: Option<PathBuf> = None;
    let mut task_id: Option<String> = None;
    let mut parent = "drover".to_string();
    let mut root = PathBuf::from("/sys/fs/cgroup");
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--sandbox" => sandbox = Some(value(&mut args, &arg, "a directory")?),
            "--task-id" => task_id = Some(value(&mut args, &arg, "a task id")?),
            "--cgroup-parent" => parent = value(&mut args, &arg, "a cgroup path")?,
            "--cgroup-root" => root = value(&mut args, &arg, "a directory")?,
            other => return Err(Usage(format!("cleanup: unknown argument `{other}`"))),
        }
    }
    let sandbox = sandbox.ok_or_else(|| Usage("cleanup needs --sandbox DIR".into()))?;
    drover_executor::cgroup::check_parent(&parent)
        .map_err(|e| Usage(format!("--cgroup-parent {e}")))?;
    match drover_executor::cleanup::cleanup(&sandbox, task_id.as_deref(), &parent, &root) {
        Ok(msg) => {
            eprintln!("drover-executor cleanup: {msg}");
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("drover-executor cleanup: {e}");
            Ok(ExitCode::from(1))
        }
    }
}

fn exec(mut args: impl Iterator<Item = String>) -> Result<ExitCode, Usage> {
    let mut task_dir: Option<PathBuf> = None;
    let mut pid: Option<u32> = None;
    let mut tty = false;
    let mut cgroup_root = PathBuf::from("/sys/fs/cgroup");
    let mut argv = Vec::new();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--task-dir" => task_dir = Some(value(&mut args, &arg, "a directory")?),
            "--pid" => pid = Some(value(&mut args, &arg, "a process id")?),
            "--tty" => tty = true,
            "--cgroup-root" => cgroup_root = value(&mut args, &arg, "a directory")?,
            "--" => {
                argv = args.by_ref().collect();
                break;
            }
            other => return Err(Usage(format!("exec: unknown argument `{other}`"))),
        }
    }
    if argv.is_empty() {
        return Err(Usage("exec needs a command after --".into()));
    }
    let opts = drover_executor::exec::ExecOptions {
        task_dir: task_dir.ok_or_else(|| Usage("exec needs --task-dir DIR".into()))?,
        pid: pid.ok_or_else(|| Usage("exec needs --pid PID".into()))?,
        tty,
        cgroup_root,
        argv,
    };
    Ok(ExitCode::from(
        drover_executor::exec::run(&opts).clamp(0, 255) as u8,
    ))
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let result = match args.next().as_deref() {
        Some("run") => parse_run(args)
            .map(|opts| ExitCode::from(drover_executor::run(opts).clamp(0, 255) as u8)),
        Some("zygote") => zygote(args),
        Some("cleanup") => cleanup(args),
        Some("exec") => exec(args),
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Some("-V" | "--version") => {
            println!("drover-executor {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Some(other) => Err(Usage(format!(
            "unknown command `{other}`; use run, zygote, cleanup or exec"
        ))),
        None => Err(Usage("no command given; use run or cleanup".into())),
    };
    match result {
        Ok(code) => code,
        Err(Usage(msg)) => {
            eprintln!("drover-executor: {msg}\n\n{USAGE}");
            ExitCode::from(2)
        }
    }
}
