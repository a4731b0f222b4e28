//! Turning the API's views into text for people: job status, job list, task details
//! and the agent list. Pure: views in, strings out.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use drover_common::state::{TaskState, UnixMillis};
use drover_common::wire::{
    AgentResources, AgentVersions, AgentView, ClusterView, CronView, JobSummary, JobView,
    QuotaView, TaskView,
};

use crate::table::Table;

/// `RUNNING 2, PENDING 1` (in lifecycle order), or `no tasks`.
pub fn state_counts(counts: &BTreeMap<TaskState, u32>) -> String {
    let parts: Vec<String> = counts
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(state, n)| format!("{state} {n}"))
        .collect();
    if parts.is_empty() {
        "no tasks".to_string()
    } else {
        parts.join(", ")
    }
}

/// `http=31001 admin=31002`, or `-`.
pub fn ports(ports: &BTreeMap<String, u16>) -> String {
    if ports.is_empty() {
        return "-".to_string();
    }
    ports
        .iter()
        .map(|(name, port)| format!("{name}={port}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Why a task is where it is: its exit reason, else why it is pending, else the last
/// event's message.
pub fn task_reason(task: &TaskView) -> String {
    if let Some(reason) = &task.exit_reason {
        return reason.to_string();
    }
    if let Some(pending) = task.pending_reason.as_deref().filter(|r| !r.is_empty()) {
        return pending.to_string();
    }
    task.events
        .last()
        .map(|e| e.message.clone())
        .filter(|m| !m.is_empty())
        .unwrap_or_else(|| "-".to_string())
}

/// A `--wait` progress line: the state counts, and why PENDING tasks wait, e.g.
/// `PENDING 1, RUNNING 1; pending: host limit reached on 1 agent (1)`.
pub fn progress(view: &JobView) -> String {
    let mut reasons: BTreeMap<&str, u32> = BTreeMap::new();
    for task in view.instances.iter().filter_map(|i| i.current.as_ref()) {
        if let Some(reason) = task.pending_reason.as_deref().filter(|r| !r.is_empty()) {
            *reasons.entry(reason).or_insert(0) += 1;
        }
    }
    let mut line = state_counts(&view.state_counts);
    if !reasons.is_empty() {
        let why: Vec<String> = reasons
            .iter()
            .map(|(reason, n)| format!("{reason} ({n})"))
            .collect();
        line.push_str("; pending: ");
        line.push_str(&why.join("; "));
    }
    line
}

/// `drover job status`: a header (the whole job's counts) and one row per instance
/// the view holds (only `only`'s instances when given); when the view is one page
/// of a bigger job, a line saying so. Agents go by their id, as in task events,
/// `drover agent list` and `drover agent forbid`.
pub fn job_status(view: &JobView, only: Option<&[u32]>) -> String {
    let kind = if view.spec.service {
        "service"
    } else {
        "batch"
    };
    // A master older than paging sends no instance_count: it sent every instance.
    let count = (view.instance_count as usize).max(view.instances.len());
    let mut out = format!(
        "{}: {} instance(s), {kind}; {}; tier {}, priority {}\n",
        view.key,
        count,
        state_counts(&view.state_counts),
        view.spec.tier,
        view.spec.priority
    );
    if let Some(cron) = &view.cron {
        out.push_str(&format!("{}\n", cron_line(cron)));
    }
    if let Some(user) = &view.ungranted_user {
        out.push_str(&ungranted_line(&view.spec.role, user));
    }
    // Which config each instance runs, as hash and ranges when every instance is
    // here, else as hash and count (the summary's).
    let mut by_config: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for instance in &view.instances {
        if let Some(config) = &instance.config {
            by_config.entry(config).or_default().push(instance.instance);
        }
    }
    let whole = view.instances.len() >= count;
    if !whole && !view.config_counts.is_empty() {
        let configs: Vec<String> = view
            .config_counts
            .iter()
            .map(|(hash, n)| format!("{hash} ({n} instance(s))"))
            .collect();
        let _ = writeln!(out, "configs: {}", configs.join(", "));
    } else if !by_config.is_empty() {
        let configs: Vec<String> = by_config
            .iter()
            .map(|(hash, list)| format!("{hash} ({})", drover_common::configs::format_ranges(list)))
            .collect();
        let _ = writeln!(out, "configs: {}", configs.join(", "));
    }
    if let Some(u) = view.update.as_ref().filter(|u| !u.state.is_terminal()) {
        let _ = writeln!(
            out,
            "update {}: {} (`drover job update status {}`)",
            u.id, u.state, view.key
        );
    }
    let mut table = Table::new(&[
        "INSTANCE", "CONFIG", "TASK", "STATE", "AGENT", "PORTS", "HISTORY", "REASON",
    ]);
    let shown = view
        .instances
        .iter()
        .filter(|i| only.is_none_or(|only| only.contains(&i.instance)));
    for instance in shown {
        let history = instance.history.len().to_string();
        let config = instance.config.clone().unwrap_or_else(|| "-".into());
        match &instance.current {
            Some(task) => {
                let agent = task.agent_id.clone().unwrap_or_else(|| "-".to_string());
                table.row(vec![
                    instance.instance.to_string(),
                    config,
                    task.task_id.clone(),
                    task.state.to_string(),
                    agent,
                    ports(&task.ports),
                    history,
                    task_reason(task),
                ]);
            }
            None => {
                let last = instance.history.first();
                table.row(vec![
                    instance.instance.to_string(),
                    config,
                    last.map(|t| t.task_id.clone())
                        .unwrap_or_else(|| "-".into()),
                    last.map(|t| t.state.to_string())
                        .unwrap_or_else(|| "-".into()),
                    "-".into(),
                    "-".into(),
                    history,
                    last.map(task_reason).unwrap_or_else(|| "no task".into()),
                ]);
            }
        }
    }
    out.push_str(&table.render());
    if !whole && only.is_none() && !view.instances.is_empty() {
        let first = view.instances.first().map_or(0, |i| i.instance);
        let last = view.instances.last().map_or(0, |i| i.instance);
        let _ = writeln!(
            out,
            "instances {first}-{last} shown of {count}: `drover job status {} --all` shows every one",
            view.key
        );
    }
    out
}

/// `drover job list`.
pub fn job_list(jobs: &[JobSummary]) -> String {
    if jobs.is_empty() {
        return "no jobs\n".to_string();
    }
    let mut table = Table::new(&["JOB", "TYPE", "TIER", "PRIORITY", "INSTANCES", "STATES"]);
    for job in jobs {
        let kind = match (&job.cron, job.service) {
            (Some(_), _) => "cron",
            (None, true) => "service",
            (None, false) => "batch",
        };
        table.row(vec![
            job.key.clone(),
            kind.to_string(),
            job.tier.to_string(),
            job.priority.to_string(),
            job.instances.to_string(),
            state_counts(&job.state_counts),
        ]);
    }
    table.render()
}

/// "cron `*/5 * * * *` (UTC), KILL_EXISTING; next 2026-...; last -".
pub fn cron_line(c: &CronView) -> String {
    let when = |ms: Option<UnixMillis>| ms.map(timestamp).unwrap_or_else(|| "-".to_string());
    format!(
        "cron `{}` ({}), {}; next {}; last fired {}",
        c.schedule,
        c.timezone,
        c.collision_policy,
        when(c.next_fire_ms),
        when(c.last_fired_ms)
    )
}

/// `drover cron list`.
pub fn cron_list(jobs: &[CronView]) -> String {
    if jobs.is_empty() {
        return "no cron jobs\n".to_string();
    }
    let mut table = Table::new(&[
        "JOB",
        "SCHEDULE",
        "TIME ZONE",
        "POLICY",
        "NEXT",
        "LAST",
        "ACTIVE",
    ]);
    let when = |ms: Option<UnixMillis>| ms.map(timestamp).unwrap_or_else(|| "-".to_string());
    for c in jobs {
        table.row(vec![
            c.job.clone(),
            c.schedule.clone(),
            c.timezone.clone(),
            c.collision_policy.to_string(),
            when(c.next_fire_ms),
            when(c.last_fired_ms),
            c.active_tasks.to_string(),
        ]);
    }
    table.render()
}

/// `drover quota show`.
pub fn quota_list(quotas: &[QuotaView]) -> String {
    if quotas.is_empty() {
        return "no quotas and no production jobs\n".to_string();
    }
    let mut table = Table::new(&["ROLE", "CPU", "RAM", "DISK"]);
    let mib = |b: u64| format!("{} MiB", b / (1024 * 1024));
    for q in quotas {
        let of = |used: String, limit: Option<String>| match limit {
            Some(l) => format!("{used} of {l}"),
            None => format!("{used} (no quota)"),
        };
        let l = q.quota.as_ref();
        table.row(vec![
            q.role.clone(),
            of(q.in_use.cpu.to_string(), l.map(|l| l.cpu.to_string())),
            of(mib(q.in_use.ram_bytes), l.map(|l| mib(l.ram_bytes))),
            of(mib(q.in_use.disk_bytes), l.map(|l| mib(l.disk_bytes))),
        ]);
    }
    table.render()
}

/// The line under a process list the agent capped: "… and N more (R running, F
/// failed)", the states with none left out.
pub fn omitted_line(o: &drover_common::wire::OmittedProcesses) -> String {
    let states = [
        (o.running, "running"),
        (o.waiting, "waiting"),
        (o.succeeded, "succeeded"),
        (o.failed, "failed"),
        (o.killed, "killed"),
    ];
    let by_state: Vec<String> = states
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
    if by_state.is_empty() {
        format!("… and {} more", o.count)
    } else {
        format!("… and {} more ({})", o.count, by_state.join(", "))
    }
}

/// `drover task show`: the task, its processes and its events.
pub fn task_details(task: &TaskView, agent: Option<&AgentView>) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "Task:     {}", task.task_id);
    let _ = writeln!(out, "Job:      {} instance {}", task.job, task.instance);
    let desired = match task.desired {
        drover_common::DesiredState::Running => "RUNNING",
        drover_common::DesiredState::Shutdown => "SHUTDOWN",
    };
    let _ = writeln!(out, "State:    {} (desired {desired})", task.state);
    let agent_text = match (&task.agent_id, agent) {
        (Some(_), Some(a)) => format!("{} ({}, {})", a.agent_id, a.hostname, a.address),
        (Some(id), None) => id.clone(),
        (None, _) => "-".to_string(),
    };
    let _ = writeln!(out, "Agent:    {agent_text}");
    let _ = writeln!(out, "Ports:    {}", ports(&task.ports));
    let exit = task
        .exit_reason
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_else(|| "-".to_string());
    let _ = writeln!(out, "Exit:     {exit}");
    if let Some(pending) = &task.pending_reason {
        let _ = writeln!(out, "Pending:  {pending}");
    }
    out.push_str("\nProcesses:\n");
    if task.processes.is_empty() {
        out.push_str("  none reported\n");
    } else {
        let mut table = Table::new(&["NAME", "STATE", "PID", "RUNS", "FAILURES", "LAST EXIT"]);
        for p in &task.processes {
            let state = serde_json::to_value(p.state)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_else(|| format!("{:?}", p.state));
            table.row(vec![
                p.name.clone(),
                state,
                p.pid
                    .map(|pid| pid.to_string())
                    .unwrap_or_else(|| "-".into()),
                p.runs.to_string(),
                p.failures.to_string(),
                p.last_exit
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_else(|| "-".into()),
            ]);
        }
        indent(&mut out, &table.render());
        if let Some(o) = &task.processes_omitted {
            let _ = writeln!(out, "  {}", omitted_line(o));
        }
    }
    out.push_str("\nEvents:\n");
    let mut table = Table::new(&["TIME (UTC)", "STATE", "SOURCE", "MESSAGE"]);
    for event in &task.events {
        let source = serde_json::to_value(event.source)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        table.row(vec![
            timestamp(event.timestamp_ms),
            event.state.to_string(),
            source,
            event.message.clone(),
        ]);
    }
    indent(&mut out, &table.render());
    out
}

/// `drover cluster status`: agents reachable and the eviction guard.
pub fn cluster(view: &ClusterView) -> String {
    let g = &view.eviction_guard;
    let mut out = format!(
        "agents: {} reachable of {}\n",
        view.reachable_agents, view.agents
    );
    if g.engaged {
        let since = g.since_ms.map(timestamp).unwrap_or_default();
        out.push_str(&format!(
            "EVICTION GUARD ENGAGED since {since}: {}\n  {} task(s) held; release with `drover cluster release-guard`\n",
            g.message, g.held_tasks
        ));
    } else {
        out.push_str(&format!("eviction guard: {}\n", g.message));
    }
    out
}

/// `drover agent list`.
pub fn agent_list(agents: &[AgentView]) -> String {
    if agents.is_empty() {
        return "no agents\n".to_string();
    }
    let mut table = Table::new(&[
        "AGENT",
        "HOSTNAME",
        "ADDRESS",
        "UP",
        "MAINTENANCE",
        "CPU FREE/TOTAL",
        "RAM FREE/TOTAL",
        "DISK FREE/TOTAL",
        "TASKS",
        "VERSION",
        "ATTRIBUTES",
    ]);
    for agent in agents {
        let attributes = agent
            .attributes
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let (cpu, ram, disk) = free_total(&agent.free, &agent.resources);
        table.row(vec![
            agent.agent_id.clone(),
            agent.hostname.clone(),
            agent.address.clone(),
            if agent.reachable { "yes" } else { "NO" }.to_string(),
            agent.maintenance.to_string(),
            cpu,
            ram,
            disk,
            agent.tasks.len().to_string(),
            versions(agent.versions.as_ref()),
            attributes,
        ]);
    }
    table.render()
}

/// One version when the agent and its executor agree, both when they differ (an
/// upgrade in progress or a mismatched install), `-` for an agent too old to say.
fn versions(v: Option<&AgentVersions>) -> String {
    match v {
        None => "-".to_string(),
        Some(v) if v.agent == v.executor => v.agent.clone(),
        Some(v) => format!("agent {}, executor {}", v.agent, v.executor),
    }
}

fn free_total(free: &AgentResources, total: &AgentResources) -> (String, String, String) {
    (
        format!("{}/{}", trim_float(free.cpu), trim_float(total.cpu)),
        format!("{}/{}", bytes(free.ram_bytes), bytes(total.ram_bytes)),
        format!("{}/{}", bytes(free.disk_bytes), bytes(total.disk_bytes)),
    )
}

/// A size for people (`64MiB`, `23.1GiB`): the one formatter the CLI and the web page
/// share.
pub fn bytes(n: u64) -> String {
    drover_common::units::human_bytes(n)
}

fn trim_float(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn indent(out: &mut String, text: &str) {
    for line in text.lines() {
        let _ = writeln!(out, "  {line}");
    }
}

/// What `job create` prints for a cron job: it has no task until it fires.
pub fn cron_created(key: &str, cron: &drover_common::wire::CronView, instances: u32) -> String {
    let next = match cron.next_fire_ms {
        Some(ms) => format!("first firing {} (UTC)", timestamp(ms)),
        None => "the schedule never fires".to_string(),
    };
    format!(
        "created cron job {key}: schedule `{}` in {}, {next}; each firing starts {instances} \
         task(s) (`drover cron start {key}` runs it now)\n",
        cron.schedule, cron.timezone
    )
}

/// `2026-11-21 08:30:00.123` in UTC.
pub fn timestamp(ms: UnixMillis) -> String {
    let secs = ms / 1000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02}.{:03}",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60,
        ms % 1000
    )
}

/// `08:30:00.123` in UTC.
pub fn time_of_day(ms: UnixMillis) -> String {
    timestamp(ms)[11..].to_string()
}

/// The line of `drover job status` for a job running as `user`, which `role` is
/// not granted (any longer).
pub fn ungranted_line(role: &str, user: &str) -> String {
    format!(
        "FLAGGED: runs as user {user}, which role {role} is not granted: it runs on, but its next update, restart or rollback is refused (an admin grants it with `drover role grant-user {role} {user}`)\n"
    )
}

/// A `--start-at` time: absolute, or relative to when the command runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StartAt {
    At(UnixMillis),
    In(std::time::Duration),
}

impl StartAt {
    /// The wall clock time it names, `now` being the current one.
    pub fn unix_ms(self, now: UnixMillis) -> UnixMillis {
        match self {
            StartAt::At(ms) => ms,
            StartAt::In(d) => now.saturating_add(d.as_millis() as u64),
        }
    }
}

/// Parses `--start-at`: `+DURATION` (e.g. `+2h`) or a UTC time
/// `YYYY-MM-DDTHH:MM[:SS]Z`, also written `YYYY-MM-DD HH:MM[:SS]`.
pub fn parse_start_at(text: &str) -> Result<StartAt, String> {
    let bad = || {
        format!(
            "--start-at {text:?}: give a UTC time like 2026-11-25T02:00:00Z or \
             \"2026-11-25 02:00\", or +DURATION from now like +2h"
        )
    };
    if let Some(rel) = text.strip_prefix('+') {
        return rel
            .parse::<drover_common::units::Duration>()
            .map(|d| StartAt::In(d.get()))
            .map_err(|e| format!("--start-at {text:?}: {e}"));
    }
    let t = text.trim_end_matches('Z');
    let (date, time) = t.split_once(['T', ' ']).ok_or_else(bad)?;
    let num = |s: &str| s.parse::<u32>().map_err(|_| bad());
    let d: Vec<&str> = date.split('-').collect();
    let h: Vec<&str> = time.split(':').collect();
    let ([y, mo, da], [hh, mi, rest @ ..]) = (d.as_slice(), h.as_slice()) else {
        return Err(bad());
    };
    let ss = match rest {
        [] => 0,
        [s] => num(s)?,
        _ => return Err(bad()),
    };
    let (y, mo, da, hh, mi) = (num(y)?, num(mo)?, num(da)?, num(hh)?, num(mi)?);
    if !(1970..=9999).contains(&y)
        || !(1..=12).contains(&mo)
        || da == 0
        || da > days_in_month(y, mo)
        || hh > 23
        || mi > 59
        || ss > 59
    {
        return Err(bad());
    }
    let days = days_from_civil(i64::from(y), mo, da);
    let secs = days as u64 * 86_400 + u64::from(hh * 3600 + mi * 60 + ss);
    Ok(StartAt::At(secs * 1000))
}

fn days_in_month(y: u32, m: u32) -> u32 {
    match m {
        2 if (y.is_multiple_of(4) && !y.is_multiple_of(100)) || y.is_multiple_of(400) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Howard Hinnant's (year, month, day) to days since the epoch.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Howard Hinnant's days-since-epoch to (year, month, day).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_at_takes_utc_times_and_offsets_from_now() {
        let at = parse_start_at("2026-11-25T02:00:00Z").unwrap();
        assert_eq!(timestamp(at.unix_ms(0)), "2026-11-25 02:00:00.000");
        assert_eq!(parse_start_at("2026-11-25 02:00").unwrap(), at);
        assert_eq!(
            parse_start_at("2024-02-29 23:59:59").unwrap().unix_ms(0) / 1000 % 86_400,
            86_399
        );
        assert_eq!(parse_start_at("+2h").unwrap().unix_ms(1_000), 7_201_000);
        for bad in [
            "tomorrow",
            "2026-13-01 00:00",
            "2026-02-30 00:00",
            "2026-11-25",
            "+2x",
        ] {
            let e = parse_start_at(bad).unwrap_err();
            assert!(e.contains("--start-at"), "{bad}: {e}");
        }
    }
    use drover_common::state::{EventSource, ExitReason, TaskEvent};
    use drover_common::DesiredState;

    fn task(state: TaskState) -> TaskView {
        TaskView {
            task_id: "hello-0-abc".into(),
            job: "www-data/devel/hello".into(),
            instance: 0,
            state,
            desired: DesiredState::Running,
            exit_reason: None,
            agent_id: None,
            ports: BTreeMap::new(),
            pending_reason: None,
            preempted_by: None,
            events: vec![TaskEvent {
                timestamp_ms: 0,
                state,
                source: EventSource::Master,
                message: "created".into(),
            }],
            processes: vec![],
            processes_omitted: None,
        }
    }

    #[test]
    fn timestamps_are_utc_calendar_dates() {
        assert_eq!(timestamp(0), "1970-01-01 00:00:00.000");
        assert_eq!(timestamp(1_795_250_096_789), "2026-11-21 08:34:56.789");
        assert_eq!(time_of_day(1_795_250_096_789), "08:34:56.789");
        assert_eq!(timestamp(951_782_400_000), "2000-02-29 00:00:00.000");
    }

    #[test]
    fn reason_prefers_exit_then_pending_then_last_event() {
        let mut t = task(TaskState::Pending);
        assert_eq!(task_reason(&t), "created");
        t.pending_reason = Some("insufficient ram on 3 agents".into());
        assert_eq!(task_reason(&t), "insufficient ram on 3 agents");
        t.exit_reason = Some(ExitReason::ExitCode { code: 3 });
        assert_eq!(task_reason(&t), "exit code 3");
    }

    #[test]
    fn state_counts_skip_zeroes() {
        let counts = BTreeMap::from([
            (TaskState::Running, 2),
            (TaskState::Pending, 1),
            (TaskState::Failed, 0),
        ]);
        assert_eq!(state_counts(&counts), "PENDING 1, RUNNING 2");
        assert_eq!(state_counts(&BTreeMap::new()), "no tasks");
    }

    #[test]
    fn a_capped_process_list_ends_with_what_it_left_out() {
        let mut t = task(TaskState::Running);
        t.processes = vec![drover_common::wire::ProcessStatus {
            name: "p0".into(),
            state: drover_common::wire::ProcessState::Running,
            pid: Some(7),
            runs: 1,
            failures: 0,
            last_exit: None,
        }];
        t.processes_omitted = Some(drover_common::wire::OmittedProcesses {
            count: 12,
            running: 9,
            failed: 3,
            ..Default::default()
        });
        let text = task_details(&t, None);
        assert!(
            text.contains("  … and 12 more (9 running, 3 failed)\n"),
            "{text}"
        );
        t.processes_omitted = None;
        assert!(!task_details(&t, None).contains("more"));
    }

    #[test]
    fn task_details_list_events() {
        let text = task_details(&task(TaskState::Pending), None);
        assert!(
            text.contains("State:    PENDING (desired RUNNING)"),
            "{text}"
        );
        assert!(
            text.contains("1970-01-01 00:00:00.000  PENDING  master  created"),
            "{text}"
        );
    }

    #[test]
    fn sizes_are_rounded_to_the_largest_unit() {
        assert_eq!(bytes(64 << 20), "64MiB");
        assert_eq!(bytes(24_094_272 * 1024), "23GiB");
        assert_eq!(bytes(1536), "1.5KiB");
        assert_eq!(bytes(12), "12B");
    }

    #[test]
    fn cpu_is_printed_without_trailing_zeroes() {
        assert_eq!(trim_float(2.0), "2");
        assert_eq!(trim_float(1.5), "1.5");
        assert_eq!(trim_float(0.25), "0.25");
    }

    #[test]
    fn agent_list_shows_version_skew() {
        let v = |agent: &str, executor: &str| AgentVersions {
            agent: agent.into(),
            executor: executor.into(),
        };
        assert_eq!(versions(None), "-");
        assert_eq!(versions(Some(&v("0.2.0", "0.2.0"))), "0.2.0");
        assert_eq!(
            versions(Some(&v("0.2.0", "0.1.0"))),
            "agent 0.2.0, executor 0.1.0"
        );
        let view: AgentView = serde_json::from_value(serde_json::json!({
            "agent_id": "h-1", "hostname": "h", "address": "http://h:7071",
            "reachable": true, "last_heartbeat_ms": 0, "attributes": {},
            "resources": {"cpu": 1.0, "ram_bytes": 1, "disk_bytes": 1, "port_range": [1, 2]},
            "free": {"cpu": 1.0, "ram_bytes": 1, "disk_bytes": 1, "port_range": [1, 2]},
            "tasks": [],
            "versions": {"agent": "0.2.0", "executor": "0.1.0"}
        }))
        .unwrap();
        let table = agent_list(&[view]);
        assert!(table.contains("VERSION"), "{table}");
        assert!(table.contains("agent 0.2.0, executor 0.1.0"), "{table}");
    }

    #[test]
    fn a_created_cron_job_says_so_and_when_it_first_fires() {
        let cron: drover_common::wire::CronView = serde_json::from_value(serde_json::json!({
            "job": "www/prod/nightly", "schedule": "0 3 * * *", "timezone": "UTC",
            "collision_policy": "KILL_EXISTING", "next_fire_ms": 1_764_212_400_000u64,
            "last_fired_ms": null, "active_tasks": 0
        }))
        .unwrap();
        let text = cron_created("www/prod/nightly", &cron, 2);
        assert!(
            text.starts_with(
                "created cron job www/prod/nightly: schedule `0 3 * * *` in UTC, first firing \
                 2025-11-27 03:00:00.000 (UTC); each firing starts 2 task(s)"
            ),
            "{text}"
        );
        assert!(!text.contains("0 task(s)"), "{text}");
    }
}
