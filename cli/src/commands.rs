//! The `job`, `task` and `agent` subcommands: each talks to the master through
//! `Client` and prints a table, text or the API's JSON.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use drover_common::spec::is_valid_name;
use drover_common::wire::{JobView, TaskView};
use serde::Serialize;

use crate::args::{AgentCommand, JobCommand, TaskCommand};
use crate::client::Client;
use crate::progress::{wait_outcome, Outcome};
use crate::render;
use crate::specfile;
use crate::target::{parse_instance_target, parse_job_target};

/// How often `--wait` and `-f` poll.
const POLL: Duration = Duration::from_millis(250);

/// Runs a `drover job ...` command; Ok(false) means "exit 1" after printing why.
pub async fn job(master: &str, command: JobCommand) -> anyhow::Result<bool> {
    match command {
        JobCommand::Validate { files } => {
            let (report, ok) = specfile::validate_files(&files);
            if ok {
                print!("{report}");
            } else {
                eprint!("{report}");
            }
            Ok(ok)
        }
        JobCommand::Create {
            file,
            wait,
            timeout,
        } => create(&Client::new(master)?, &file, wait, timeout).await,
        JobCommand::Status { key, json } => {
            let client = Client::new(master)?;
            let target = parse_job_target(&key)?;
            let view = client.job(&target.key).await?;
            if json {
                print_json(&view)?;
            } else {
                // Agent names are a nicety: fall back to ids if the list fails.
                let agents = client.agents().await.unwrap_or_default();
                print!(
                    "{}",
                    render::job_status(&view, &render::agent_names(&agents))
                );
            }
            Ok(true)
        }
        JobCommand::List { role, json } => {
            let client = Client::new(master)?;
            let jobs = client.jobs(role.as_deref()).await?;
            if json {
                print_json(&jobs)?;
            } else {
                print!("{}", render::job_list(&jobs));
            }
            Ok(true)
        }
        JobCommand::Kill { target } => {
            let client = Client::new(master)?;
            let target = parse_job_target(&target)?;
            let response = client.kill(&target.key, target.instances).await?;
            println!(
                "killing {}: {} task(s): {}",
                response.job,
                response.tasks.len(),
                response.tasks.join(" ")
            );
            Ok(true)
        }
        JobCommand::Restart { target } => {
            let client = Client::new(master)?;
            let target = parse_job_target(&target)?;
            let response = client.restart(&target.key, target.instances).await?;
            println!(
                "restarting {}: {} new task(s): {}",
                response.job,
                response.tasks.len(),
                response.tasks.join(" ")
            );
            Ok(true)
        }
        JobCommand::Diff { file, instances } => {
            crate::update::diff(&Client::new(master)?, &file, instances.as_deref()).await
        }
        JobCommand::Update(args) => crate::update::update(&Client::new(master)?, args).await,
    }
}

/// `drover job create FILE [--wait]`.
async fn create(
    client: &Client,
    file: &Path,
    wait: bool,
    timeout: Duration,
) -> anyhow::Result<bool> {
    let spec = match specfile::load(file) {
        Ok(spec) => spec,
        Err(errors) => {
            eprintln!("{errors}");
            return Ok(false);
        }
    };
    let key = spec.key();
    let created = client.create_job(&spec).await?;
    println!(
        "created {key}: {} task(s): {}",
        created.tasks.len(),
        created.tasks.join(" ")
    );
    if !wait {
        return Ok(true);
    }
    let goal = if spec.service { "RUNNING" } else { "FINISHED" };
    let started = Instant::now();
    let mut last_counts = String::new();
    loop {
        let view = client.job(&key).await?;
        let counts = render::state_counts(&view.state_counts);
        if counts != last_counts {
            println!("  {:>6.1}s  {counts}", started.elapsed().as_secs_f64());
            last_counts = counts;
        }
        match wait_outcome(&view) {
            Outcome::Done => {
                println!("{key}: all {} instance(s) {goal}", view.instances.len());
                return Ok(true);
            }
            Outcome::Failed(why) => bail!("{key} did not reach {goal}: {why}"),
            Outcome::Waiting => {}
        }
        if started.elapsed() > timeout {
            bail!(
                "{key}: not every instance is {goal} after {}s ({last_counts}); \
                 `drover job status {key}` shows why, --timeout waits longer",
                timeout.as_secs()
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Runs a `drover task ...` command.
pub async fn task(master: &str, command: TaskCommand) -> anyhow::Result<bool> {
    let client = Client::new(master)?;
    match command {
        TaskCommand::Show { task_id, json } => {
            let task = client.task(&task_id).await?;
            if json {
                print_json(&task)?;
            } else {
                let agents = client.agents().await.unwrap_or_default();
                let agent = task
                    .agent_id
                    .as_ref()
                    .and_then(|id| agents.iter().find(|a| &a.agent_id == id));
                print!("{}", render::task_details(&task, agent));
            }
            Ok(true)
        }
        TaskCommand::Logs {
            target,
            process,
            stderr,
            follow,
        } => logs(&client, &target, process, stderr, follow).await,
    }
}

/// `drover task logs KEY/INSTANCE`: finds the instance's current task and its agent,
/// then reads the log from the agent (and keeps reading with -f).
async fn logs(
    client: &Client,
    target: &str,
    process: Option<String>,
    stderr: bool,
    follow: bool,
) -> anyhow::Result<bool> {
    let (key, instance) = parse_instance_target(target)?;
    let view = client.job(&key).await?;
    let task = latest_task(&view, instance)?;
    let process = match process {
        Some(p) => p,
        None => view
            .spec
            .task
            .processes
            .first()
            .map(|p| p.name.clone())
            .ok_or_else(|| anyhow!("{key} has no processes"))?,
    };
    if !is_valid_name(&process) {
        bail!(
            "`{process}` is not a process name: see `drover task show {}`",
            task.task_id
        );
    }
    let agent_id = task.agent_id.clone().ok_or_else(|| {
        anyhow!(
            "task {} is {} and has not been placed on an agent, so it has no logs yet{}",
            task.task_id,
            task.state,
            task.pending_reason
                .as_ref()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )
    })?;
    let agents = client.agents().await?;
    let agent = agents
        .iter()
        .find(|a| a.agent_id == agent_id)
        .ok_or_else(|| {
            anyhow!(
                "agent {agent_id} of task {} is not registered any more",
                task.task_id
            )
        })?;
    let stream = if stderr { "stderr" } else { "stdout" };
    let task_id = task.task_id.clone();
    let mut offset = 0u64;
    let mut stdout = std::io::stdout();
    let mut last_state_check = Instant::now();
    loop {
        let chunk = client
            .fetch_log(&agent.address, &task_id, &process, stream, offset)
            .await;
        let chunk = match chunk {
            Ok(chunk) => chunk,
            // With -f, a log that does not exist yet may appear.
            Err(e) if follow && e.api_code() == Some("not_found") => crate::client::LogChunk {
                bytes: vec![],
                size: None,
            },
            Err(e) => {
                return Err(e).with_context(|| {
                    format!("reading {stream} of process {process} of task {task_id}")
                })
            }
        };
        if let Some(size) = chunk.size {
            // The file was rotated or truncated under us: start over.
            if size < offset {
                offset = 0;
                continue;
            }
        }
        offset += chunk.bytes.len() as u64;
        stdout.write_all(&chunk.bytes)?;
        stdout.flush()?;
        if !follow {
            return Ok(true);
        }
        if chunk.bytes.is_empty() && last_state_check.elapsed() > Duration::from_secs(2) {
            last_state_check = Instant::now();
            let now = client.task(&task_id).await?;
            if now.state.is_terminal() {
                eprintln!("task {task_id} is {}", now.state);
                return Ok(true);
            }
        }
        if chunk.bytes.is_empty() {
            tokio::time::sleep(POLL * 2).await;
        }
    }
}

/// The instance's latest task (`current`, else the newest in history).
fn latest_task(view: &JobView, instance: u32) -> anyhow::Result<TaskView> {
    let slot = view
        .instances
        .iter()
        .find(|i| i.instance == instance)
        .ok_or_else(|| {
            anyhow!(
                "{} has no instance {instance} (it has {} instance(s), numbered from 0)",
                view.key,
                view.instances.len()
            )
        })?;
    slot.current
        .clone()
        .or_else(|| slot.history.first().cloned())
        .ok_or_else(|| anyhow!("instance {instance} of {} has no task", view.key))
}

/// Runs a `drover agent ...` command.
pub async fn agent(master: &str, command: AgentCommand) -> anyhow::Result<bool> {
    let client = Client::new(master)?;
    match command {
        AgentCommand::List { json } => {
            let agents = client.agents().await?;
            if json {
                print_json(&agents)?;
            } else {
                print!("{}", render::agent_list(&agents));
            }
            Ok(true)
        }
    }
}

fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    println!("{text}");
    Ok(())
}
