//! `drover host ...`: list hosts with their maintenance mode, show one host's
//! maintenance, cordon, drain (with `--wait` progress per host) and activate. The
//! rendering is pure (views in, strings out) and tested here.

use std::time::{Duration, Instant};

use anyhow::bail;
use drover_common::spec::is_valid_name;
use drover_common::state::{now_ms, UnixMillis};
use drover_common::wire::{HostProbe, HostView, HostsRequest, MaintenanceMode};

use crate::args::HostCommand;
use crate::client::Client;
use crate::render::timestamp;
use crate::table::Table;
use crate::Endpoint;

/// Runs a `drover host ...` command.
pub async fn run(master: &Endpoint, command: HostCommand) -> anyhow::Result<bool> {
    let client = master.client()?;
    match command {
        HostCommand::List { json } => {
            let hosts = client.hosts().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&hosts)?);
            } else {
                print!("{}", host_list(&hosts));
            }
        }
        HostCommand::Status { hosts, json } => {
            check_names(&hosts)?;
            let mut views = Vec::new();
            for h in &hosts {
                views.push(client.host(h).await?);
            }
            if json {
                println!("{}", serde_json::to_string_pretty(&views)?);
            } else {
                for v in &views {
                    print!("{}", host_status(v));
                }
            }
        }
        HostCommand::Cordon { hosts } => {
            maintain(&client, "cordon", hosts, None, None).await?;
        }
        HostCommand::Activate { hosts } => {
            maintain(&client, "activate", hosts, None, None).await?;
        }
        HostCommand::Drain {
            hosts,
            deadline,
            start_at,
            wait,
            timeout,
            dry_run,
        } => {
            if dry_run {
                check_names(&hosts)?;
                let probe = client.probe_drain(hosts).await?;
                print!("{}", probe_text(&probe));
                return Ok(probe.iter().all(|h| h.within_policy));
            }
            let deadline_ms = deadline.map(|d| d.as_millis() as u64);
            let start_at_ms = start_at.map(|s| s.unix_ms(now_ms()));
            let views = maintain(&client, "drain", hosts, deadline_ms, start_at_ms).await?;
            if wait {
                let names: Vec<String> = views.into_iter().map(|v| v.agent_id).collect();
                return wait_drained(&client, &names, timeout).await;
            }
        }
    }
    Ok(true)
}

/// Refuses names that cannot be hosts before anything is sent.
fn check_names(hosts: &[String]) -> anyhow::Result<()> {
    let bad: Vec<&str> = hosts
        .iter()
        .filter(|h| !is_valid_name(h))
        .map(String::as_str)
        .collect();
    if !bad.is_empty() {
        bail!(
            "not a host name or agent id: {}; `drover host list` lists them",
            bad.join(", ")
        );
    }
    Ok(())
}

async fn maintain(
    client: &Client,
    op: &str,
    hosts: Vec<String>,
    deadline_ms: Option<u64>,
    start_at_ms: Option<UnixMillis>,
) -> anyhow::Result<Vec<HostView>> {
    check_names(&hosts)?;
    let views = client
        .maintain(
            op,
            &HostsRequest {
                hosts,
                deadline_ms,
                start_at_ms,
                dry_run: false,
            },
        )
        .await?;
    print!("{}", host_list(&views));
    Ok(views)
}

/// Waits until every host is DRAINED, printing a line per host whenever its
/// progress changes; wakes on the master's change stream (task and host changes).
async fn wait_drained(
    client: &Client,
    hosts: &[String],
    timeout: Duration,
) -> anyhow::Result<bool> {
    let start = Instant::now();
    let mut last: Vec<String> = vec![String::new(); hosts.len()];
    let mut changes = crate::follow::Changes::start(client, None).await?;
    loop {
        let mut done = true;
        for (i, h) in hosts.iter().enumerate() {
            let v = client.host(h).await?;
            let line = progress_line(&v);
            if line != last[i] {
                println!("{line}");
                last[i] = line;
            }
            if let Some(why) = drain_cannot_finish(&v) {
                eprintln!(
                    "error: the drain of host {} cannot finish as things stand: {why}\n  it \
                     goes on in the master (`drover host status {}`); `drover host activate {}` \
                     ends it",
                    v.hostname, v.hostname, v.hostname
                );
                return Ok(false);
            }
            match v.mode {
                MaintenanceMode::Drained => {}
                MaintenanceMode::Draining => done = false,
                other => {
                    eprintln!("host {}: is {other} now: the drain was ended", v.hostname);
                    return Ok(false);
                }
            }
        }
        if done {
            return Ok(true);
        }
        let left = timeout.saturating_sub(start.elapsed());
        if left.is_zero() || !changes.next(left).await? {
            eprintln!("timed out after {timeout:?}; the drain goes on (`drover host status`)");
            return Ok(false);
        }
    }
}

/// Why a draining host's drain cannot go on as things stand (the master's `stuck`).
pub fn drain_cannot_finish(v: &HostView) -> Option<String> {
    v.stuck
        .clone()
        .filter(|_| v.mode == MaintenanceMode::Draining)
}

/// `dev-agent-1: DRAINING, 2 tasks left; blocked: www/prod/x: ...`
pub fn progress_line(v: &HostView) -> String {
    let mut line = format!(
        "{}: {}, {} task{} left",
        v.hostname,
        v.mode,
        v.tasks_left,
        if v.tasks_left == 1 { "" } else { "s" }
    );
    if !v.blocked.is_empty() {
        line.push_str("; blocked: ");
        line.push_str(&v.blocked.join("; "));
    }
    line
}

/// `drover host drain --dry-run`: per host and job, within policy or not, and how
/// long it would take.
pub fn probe_text(probe: &[HostProbe]) -> String {
    let mut table = Table::new(&[
        "HOST",
        "JOB",
        "TASKS",
        "AT ONCE",
        "WAVES",
        "ESTIMATE",
        "WITHIN POLICY",
    ]);
    for h in probe {
        table.row(vec![
            h.hostname.clone(),
            "(host)".to_string(),
            h.tasks.to_string(),
            "-".to_string(),
            "-".to_string(),
            seconds(h.estimate_ms),
            yes_no(h.within_policy).to_string(),
        ]);
        for j in &h.jobs {
            table.row(vec![
                String::new(),
                j.job.clone(),
                format!("{} ({} on all hosts)", j.tasks_on_host, j.tasks_on_hosts),
                j.at_once.to_string(),
                j.waves.to_string(),
                seconds(j.estimate_ms),
                match &j.reason {
                    Some(r) => format!("{}: {r}", yes_no(j.within_policy)),
                    None => yes_no(j.within_policy).to_string(),
                },
            ]);
        }
    }
    table.render()
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "NO"
    }
}

fn seconds(ms: u64) -> String {
    format!("~{}s", ms.div_ceil(1000))
}

/// The host table of `drover host list`.
pub fn host_list(hosts: &[HostView]) -> String {
    if hosts.is_empty() {
        return "no hosts\n".to_string();
    }
    let mut table = Table::new(&["HOST", "AGENT", "UP", "MODE", "REASON", "TASKS LEFT"]);
    for h in hosts {
        table.row(vec![
            h.hostname.clone(),
            h.agent_id.clone(),
            if h.reachable { "yes" } else { "NO" }.to_string(),
            h.mode.to_string(),
            h.reason.clone().unwrap_or_else(|| "-".to_string()),
            h.tasks_left.to_string(),
        ]);
    }
    table.render()
}

/// One host's maintenance in full, for `drover host status`.
pub fn host_status(h: &HostView) -> String {
    let mut out = format!(
        "host {} (agent {}): {}{}\n  reachable: {}\n  tasks left: {}\n",
        h.hostname,
        h.agent_id,
        h.mode,
        h.reason
            .as_ref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default(),
        if h.reachable { "yes" } else { "NO" },
        h.tasks_left,
    );
    if let Some(at) = h.drain_at_ms {
        out.push_str(&format!("  drain starts: {} UTC\n", timestamp(at)));
    }
    if let Some(d) = h.deadline_ms {
        out.push_str(&format!("  deadline: {} UTC\n", timestamp(d)));
    }
    for b in &h.blocked {
        out.push_str(&format!("  blocked: {b}\n"));
    }
    if !h.events.is_empty() {
        out.push_str("  events:\n");
        for e in &h.events {
            out.push_str(&format!(
                "    {} {}\n",
                timestamp(e.timestamp_ms),
                e.message
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(mode: MaintenanceMode, left: u32, blocked: &[&str]) -> HostView {
        HostView {
            agent_id: "h1-abc".into(),
            hostname: "h1".into(),
            reachable: true,
            mode,
            reason: Some("maintenance".into()),
            since_ms: 5,
            deadline_ms: None,
            drain_at_ms: None,
            tasks_left: left,
            blocked: blocked.iter().map(|s| s.to_string()).collect(),
            stuck: None,
            events: Vec::new(),
        }
    }

    #[test]
    fn a_stuck_drain_cannot_finish_while_it_drains() {
        let mut v = view(MaintenanceMode::Draining, 1, &["www/prod/a: waiting"]);
        assert_eq!(drain_cannot_finish(&v), None);
        v.stuck = Some("www/prod/a: 1 instance(s) PENDING: host limit reached".into());
        assert!(drain_cannot_finish(&v)
            .unwrap()
            .contains("host limit reached"));
        v.mode = MaintenanceMode::Drained;
        assert_eq!(drain_cannot_finish(&v), None);
    }

    #[test]
    fn progress_says_what_is_left_and_what_blocks_it() {
        let v = view(MaintenanceMode::Draining, 2, &["www/prod/a: waiting"]);
        assert_eq!(
            progress_line(&v),
            "h1: DRAINING, 2 tasks left; blocked: www/prod/a: waiting"
        );
        let v = view(MaintenanceMode::Drained, 0, &[]);
        assert_eq!(progress_line(&v), "h1: DRAINED, 0 tasks left");
    }

    #[test]
    fn the_list_shows_mode_and_reason() {
        let text = host_list(&[view(MaintenanceMode::Scheduled, 1, &[])]);
        assert!(text.contains("SCHEDULED"), "{text}");
        assert!(text.contains("maintenance"), "{text}");
        assert!(host_status(&view(MaintenanceMode::Draining, 1, &["x"])).contains("blocked: x"));
    }

    #[test]
    fn names_that_cannot_be_hosts_are_refused_before_sending() {
        let err = check_names(&["ok".into(), "a/b".into()]).unwrap_err();
        assert!(err.to_string().contains("a/b"), "{err}");
    }
}
