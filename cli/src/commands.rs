//! The `job`, `task`, `agent` and `token` subcommands: each talks to the master
//! through `Client` and prints a table, text or the API's JSON.

use std::io::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use drover_common::spec::is_valid_name;
use drover_common::wire::{CreateTokenRequest, JobView, TaskView};
use serde::Serialize;

use crate::args::{
    AgentCommand, ClusterCommand, CronCommand, JobCommand, QuotaCommand, TaskCommand, TlsCommand,
    TokenCommand,
};
use crate::client::Client;
use crate::follow::Changes;
use crate::progress::{wait_outcome, Outcome};
use crate::render;
use crate::specfile;
use crate::target::{parse_instance_target, parse_job_target, JobTarget};
use crate::Endpoint;

/// How often `task logs -f` polls.
const POLL: Duration = Duration::from_millis(250);

/// Runs a `drover job ...` command; Ok(false) means "exit 1" after printing why.
pub async fn job(master: &Endpoint, command: JobCommand) -> anyhow::Result<bool> {
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
        } => create(&master.client()?, &file, wait, timeout).await,
        JobCommand::Status {
            key,
            json: false,
            watch: true,
            all,
        } => {
            let client = master.client()?;
            let target = parse_job_target(&key)?;
            let mut changes = Changes::start(&client, Some(&target.key)).await?;
            loop {
                let view = status_view(&client, &target, all).await?;
                let only = shown_instances(&view, target.instances.as_deref())?;
                println!(
                    "--- {} (UTC)",
                    render::timestamp(drover_common::state::now_ms())
                );
                print!("{}", render::job_status(&view, only.as_deref()));
                while !changes.next(Duration::from_secs(60)).await? {}
            }
        }
        JobCommand::Status { key, json, all, .. } => {
            let client = master.client()?;
            let target = parse_job_target(&key)?;
            let view = status_view(&client, &target, all).await?;
            let only = shown_instances(&view, target.instances.as_deref())?;
            if json {
                let mut view = view;
                if let Some(only) = &only {
                    view.instances.retain(|i| only.contains(&i.instance));
                }
                print_json(&view)?;
            } else {
                print!("{}", render::job_status(&view, only.as_deref()));
            }
            Ok(true)
        }
        JobCommand::List { role, json } => {
            let client = master.client()?;
            let jobs = client.jobs(role.as_deref()).await?;
            if json {
                print_json(&jobs)?;
            } else {
                print!("{}", render::job_list(&jobs));
            }
            Ok(true)
        }
        JobCommand::Kill { target } => {
            let client = master.client()?;
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
        JobCommand::Restart {
            target,
            all_at_once,
        } => {
            let client = master.client()?;
            let target = parse_job_target(&target)?;
            let response = client
                .restart(&target.key, target.instances, all_at_once)
                .await?;
            if let Some(id) = &response.update {
                // The restart started; its shape is a courtesy (a failed read of it
                // is no failure of the command).
                let shape = match client.update(&target.key).await {
                    Ok(u) if u.id == *id => format!(
                        ", {} instance(s) in batches of {} (each RUNNING {} before the next)",
                        u.instances.len(),
                        u.settings.batch_size.max(1),
                        u.settings.watch
                    ),
                    _ => String::new(),
                };
                println!(
                    "rolling restart of {}: update {id}{shape}; follow it with \
                     `drover job update status {}`",
                    response.job, response.job
                );
                return Ok(true);
            }
            println!(
                "restarting {}: {} new task(s): {}",
                response.job,
                response.tasks.len(),
                response.tasks.join(" ")
            );
            Ok(true)
        }
        JobCommand::Diff { file, instances } => {
            crate::update::diff(&master.client()?, &file, instances.as_deref()).await
        }
        JobCommand::Update(args) => crate::update::update(&master.client()?, args).await,
    }
}

/// How many instances `job status` shows without --all.
pub const STATUS_PAGE: u32 = 100;

/// What `job status` reads: every instance with --all or an instance set (read
/// page by page), else the job's summary and its first `STATUS_PAGE` instances.
async fn status_view(client: &Client, target: &JobTarget, all: bool) -> anyhow::Result<JobView> {
    Ok(if all || target.instances.is_some() {
        client.job_all_pages(&target.key).await?
    } else {
        client.job_page(&target.key, STATUS_PAGE, None).await?
    })
}

/// The instances `job status` shows: those of `set` when given (else all: None).
fn shown_instances(view: &JobView, set: Option<&str>) -> anyhow::Result<Option<Vec<u32>>> {
    set.map(|set| instances_of(view, set)).transpose()
}

/// The instances of `set` (`0-3,7`, already checked by the parser), refused with the
/// job's instance count when one does not exist.
fn instances_of(view: &JobView, set: &str) -> anyhow::Result<Vec<u32>> {
    let wanted = drover_common::wire::parse_instance_set(set).map_err(|e| anyhow!(e))?;
    let count = view.instances.len();
    let missing: Vec<String> = wanted
        .iter()
        .filter(|i| !view.instances.iter().any(|x| x.instance == **i))
        .map(u32::to_string)
        .collect();
    if !missing.is_empty() {
        bail!(
            "{} has no instance {} (it has {count} instance(s), numbered from 0)",
            view.key,
            missing.join(", ")
        );
    }
    Ok(wanted)
}

/// How long every instance of a service must stay RUNNING, with no change of the
/// job committed, before `job create --wait` says it runs.
const SERVICE_SETTLE: Duration = Duration::from_millis(500);

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
            eprintln!("{}", errors.with_error_prefix());
            return Ok(false);
        }
    };
    let key = spec.key();
    let created = client.create_job(&spec).await?;
    let cron = match spec.cron_schedule {
        Some(_) => client.job(&key).await.ok().and_then(|view| view.cron),
        None => None,
    };
    match &cron {
        Some(cron) => print!(
            "{}",
            render::cron_created(&key.to_string(), cron, spec.instances)
        ),
        None => println!(
            "created {key}: {} task(s): {}",
            created.tasks.len(),
            created.tasks.join(" ")
        ),
    }
    println!(
        "  page: {}",
        crate::open::job_url(client.base(), &key.to_string())
    );
    if cron.is_some() && wait {
        println!("  --wait: a cron job has no task until it fires; nothing to wait for");
        return Ok(true);
    }
    if !wait {
        return Ok(true);
    }
    let goal = if spec.service { "RUNNING" } else { "FINISHED" };
    let started = Instant::now();
    let mut last_progress = String::new();
    // The index first, then the view: a change committed in between wakes the
    // first wait rather than being missed.
    let mut changes = Changes::start(client, Some(&key)).await?;
    // When every instance of a service is RUNNING, the wait goes on for
    // SERVICE_SETTLE without a change, so a service that dies at once fails it.
    let mut all_running_since: Option<Instant> = None;
    loop {
        let view = client.job(&key).await?;
        let progress = render::progress(&view);
        if progress != last_progress {
            println!("  {:>6.1}s  {progress}", started.elapsed().as_secs_f64());
            last_progress = progress;
        }
        match wait_outcome(&view) {
            Outcome::Done if !spec.service => {
                println!("{key}: all {} instance(s) {goal}", view.instances.len());
                return Ok(true);
            }
            Outcome::Done => {
                let since = *all_running_since.get_or_insert_with(Instant::now);
                let settle_left = SERVICE_SETTLE.saturating_sub(since.elapsed());
                if settle_left.is_zero() || !changes.next(settle_left).await? {
                    println!("{key}: all {} instance(s) {goal}", view.instances.len());
                    return Ok(true);
                }
                continue;
            }
            Outcome::Failed(why) => bail!("{key} did not reach {goal}: {why}"),
            Outcome::Waiting => all_running_since = None,
        }
        let left = timeout.saturating_sub(started.elapsed());
        if left.is_zero() || !changes.next(left).await? {
            bail!(
                "{key}: not every instance is {goal} after {}s ({last_progress}); \
                 `drover job status {key}` shows why, --timeout waits longer",
                timeout.as_secs()
            );
        }
    }
}

/// Runs a `drover task ...` command.
pub async fn task(master: &Endpoint, command: TaskCommand) -> anyhow::Result<bool> {
    let client = master.client()?;
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
        TaskCommand::Exec {
            target,
            process,
            interactive,
            tty,
            command,
        } => {
            let args = crate::exec::ExecArgs {
                target,
                process,
                stdin: interactive,
                tty,
                command,
            };
            let code = crate::exec::exec(&client, args).await?;
            // The command's status is the CLI's.
            std::process::exit(code.clamp(0, 255));
        }
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
    let names: Vec<&str> = view
        .spec
        .task
        .processes
        .iter()
        .map(|p| p.name.as_str())
        .collect();
    let stream = if stderr { "stderr" } else { "stdout" };
    let process = pick_process(&names, process.as_deref(), &task.task_id)?;
    if names.len() > 1 {
        // On stderr, so stdout stays the log alone.
        eprintln!(
            "{stream} of process {process} of task {} (processes: {}; --process picks another)",
            task.task_id,
            names.join(", ")
        );
    }
    task.agent_id.as_ref().ok_or_else(|| {
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
    let task_id = task.task_id.clone();
    let mut offset = 0u64;
    let mut stdout = std::io::stdout();
    let mut last_state_check = Instant::now();
    loop {
        let chunk = client.fetch_log(&task_id, &process, stream, offset).await;
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

/// The process whose log `task logs` reads: `wanted`, which must be one of the task's
/// processes (else the error lists them), or the first.
fn pick_process(names: &[&str], wanted: Option<&str>, task_id: &str) -> anyhow::Result<String> {
    let Some(wanted) = wanted else {
        return names
            .first()
            .map(|n| n.to_string())
            .ok_or_else(|| anyhow!("task {task_id} has no processes"));
    };
    if names.contains(&wanted) {
        return Ok(wanted.to_string());
    }
    let what = if is_valid_name(wanted) {
        "is not a process of"
    } else {
        "is not a process name; see"
    };
    bail!(
        "`{wanted}` {what} task {task_id}: its processes are {} (--process NAME)",
        names.join(", ")
    )
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
pub async fn agent(master: &Endpoint, command: AgentCommand) -> anyhow::Result<bool> {
    let client = master.client()?;
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
        AgentCommand::Forbid { agent_id } => {
            let answer = client.set_agent_forbidden(&agent_id, true).await?;
            println!(
                "agent {agent_id} is forbidden; revoked tokens: {}",
                serde_json::to_string(&answer.revoked_tokens)?
            );
            Ok(true)
        }
        AgentCommand::Allow { agent_id } => {
            client.set_agent_forbidden(&agent_id, false).await?;
            println!("agent {agent_id} is allowed again; it needs a new agent token (`drover token create --role agent`)");
            Ok(true)
        }
    }
}

/// The body of POST /v1/tokens for `drover token create --role ...`.
pub fn token_request(
    roles: &[String],
    agent_id: Option<&str>,
    description: &str,
) -> anyhow::Result<CreateTokenRequest> {
    let special = ["admin", "operator", "agent", "discovery"];
    let kind = match roles {
        [one] if special.contains(&one.as_str()) => one.as_str(),
        _ if roles.iter().any(|r| special.contains(&r.as_str())) => bail!(
            "--role admin, operator, agent or discovery stands alone; job roles may be combined (--role www-data --role db)"
        ),
        _ => "roles",
    };
    if agent_id.is_some() && kind != "agent" {
        bail!("--agent-id goes with --role agent");
    }
    Ok(CreateTokenRequest {
        kind: kind.to_string(),
        roles: if kind == "roles" {
            roles.to_vec()
        } else {
            Vec::new()
        },
        agent_id: agent_id.map(str::to_string),
        description: description.to_string(),
    })
}

/// Runs a `drover token ...` command.
pub async fn token(master: &Endpoint, command: TokenCommand) -> anyhow::Result<bool> {
    let client = master.client()?;
    match command {
        TokenCommand::Create {
            roles,
            agent_id,
            description,
        } => {
            let body = token_request(&roles, agent_id.as_deref(), &description)?;
            let created = client.create_token(&body).await?;
            eprintln!(
                "created token {} ({}); it is shown only now:",
                created.info.id,
                created.info.grant.describe()
            );
            println!("{}", created.token);
            Ok(true)
        }
        TokenCommand::List { json } => {
            let tokens = client.tokens().await?;
            if json {
                print_json(&tokens)?;
            } else {
                let mut table = crate::table::Table::new(&["ID", "GRANTS", "STATE", "DESCRIPTION"]);
                for t in &tokens {
                    let state = if t.revoked_ms.is_some() {
                        "revoked"
                    } else {
                        "live"
                    };
                    table.row(vec![
                        t.id.clone(),
                        t.grant.describe(),
                        state.to_string(),
                        t.description.clone(),
                    ]);
                }
                print!("{}", table.render());
            }
            Ok(true)
        }
        TokenCommand::Revoke { token_id } => {
            client.revoke_token(&token_id).await?;
            println!("revoked token {token_id}");
            Ok(true)
        }
    }
}

/// Runs a `drover tls ...` command (no master needed).
pub fn tls(command: TlsCommand) -> anyhow::Result<bool> {
    match command {
        TlsCommand::Init { dir } => {
            let (cert, key) = crate::tls::init_ca(&dir)?;
            println!(
                "created the cluster CA: {} (give to masters and agents) and {} (keep it offline)",
                cert.display(),
                key.display()
            );
        }
        TlsCommand::Issue {
            kind,
            name,
            dir,
            extra,
        } => {
            let (cert, key) = crate::tls::issue(&dir, kind, &name, &extra)?;
            println!(
                "issued {} and {} (mode 0600)",
                cert.display(),
                key.display()
            );
        }
    }
    Ok(true)
}

/// Runs a `drover cluster ...` command. `status` fails (exit 1) while the eviction
/// guard is engaged, so scripts notice.
pub async fn cluster(master: &Endpoint, command: ClusterCommand) -> anyhow::Result<bool> {
    let client = master.client()?;
    let (view, json) = match command {
        ClusterCommand::Status { json } => (client.cluster().await?, json),
        ClusterCommand::ReleaseGuard => (client.release_guard().await?, false),
    };
    if json {
        print_json(&view)?;
    } else {
        print!("{}", render::cluster(&view));
    }
    Ok(!view.eviction_guard.engaged)
}

/// Runs a `drover quota ...` command.
pub async fn quota(master: &Endpoint, command: QuotaCommand) -> anyhow::Result<bool> {
    let client = master.client()?;
    match command {
        QuotaCommand::Set {
            role,
            cpu,
            ram,
            disk,
        } => {
            if !cpu.is_finite() || cpu < 0.0 {
                bail!("--cpu is {cpu}; use 0 or more cores, e.g. 8 or 0.5");
            }
            let q = drover_common::wire::QuotaResources {
                cpu,
                ram_bytes: ram.0,
                disk_bytes: disk.0,
            };
            let view = client.set_quota(&role, Some(q)).await?;
            print!("{}", render::quota_list(&[view]));
        }
        QuotaCommand::Remove { role } => {
            let view = client.set_quota(&role, None).await?;
            print!("{}", render::quota_list(&[view]));
        }
        QuotaCommand::Show { role, json } => {
            let quotas = client.quotas(role.as_deref()).await?;
            if json {
                print_json(&quotas)?;
            } else {
                print!("{}", render::quota_list(&quotas));
            }
        }
    }
    Ok(true)
}

/// Runs a `drover cron ...` command.
pub async fn cron(master: &Endpoint, command: CronCommand) -> anyhow::Result<bool> {
    let client = master.client()?;
    match command {
        CronCommand::List { json } => {
            let jobs = client.cron_jobs().await?;
            if json {
                print_json(&jobs)?;
            } else {
                print!("{}", render::cron_list(&jobs));
            }
        }
        CronCommand::Start { key } => {
            let key = drover_common::spec::JobKey::parse(&key)
                .map_err(|e| anyhow!("{e}; a job key is role/env/name"))?;
            let done = client.cron_action(&key, "start").await?;
            if done.tasks.is_empty() {
                println!("{key}: a run is active and the policy is CANCEL_NEW: nothing started");
            } else {
                println!("{key}: started {}", done.tasks.join(", "));
            }
        }
        CronCommand::Deschedule { key } => {
            let key = drover_common::spec::JobKey::parse(&key)
                .map_err(|e| anyhow!("{e}; a job key is role/env/name"))?;
            client.cron_action(&key, "deschedule").await?;
            println!("{key}: descheduled");
        }
    }
    Ok(true)
}

fn print_json<T: Serialize>(value: &T) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    println!("{text}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_process_is_refused_with_the_task_processes() {
        let names = ["web", "sidecar"];
        assert_eq!(pick_process(&names, None, "t1").unwrap(), "web");
        assert_eq!(
            pick_process(&names, Some("sidecar"), "t1").unwrap(),
            "sidecar"
        );
        let err = pick_process(&names, Some("nope"), "t1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("`nope` is not a process of task t1"), "{err}");
        assert!(err.contains("web, sidecar"), "{err}");
        let err = pick_process(&names, Some("../x"), "t1")
            .unwrap_err()
            .to_string();
        assert!(err.contains("web, sidecar"), "{err}");
        assert!(pick_process(&[], None, "t1").is_err());
    }
}
