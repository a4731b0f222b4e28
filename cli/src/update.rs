//! `drover job diff` and `drover job update`: what a new spec would change (planned
//! here with the master's own rules, drover_common::configs), starting an update
//! and following it, and steering a running one (status, pause, resume, abort,
//! rollback). The text renderers are pure functions, tested below.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail};
use drover_common::configs::{config_hash, field_diff, format_ranges, plan_update, UpdatePlan};
use drover_common::spec::JobSpec;
use drover_common::wire::{
    self, InstanceUpdateState, JobView, UpdateRequest, UpdateState, UpdateView,
};

use crate::args::{UpdateArgs, UpdateCommand};
use crate::client::Client;
use crate::specfile;
use crate::table::Table;
use crate::target::parse_job_target;

fn load(file: &Path) -> anyhow::Result<Option<JobSpec>> {
    match specfile::load(file) {
        Ok(spec) => Ok(Some(spec)),
        Err(errors) => {
            eprintln!("{errors}");
            Ok(None)
        }
    }
}

fn instances_arg(text: Option<&str>) -> anyhow::Result<Option<Vec<u32>>> {
    text.map(|t| wire::parse_instance_set(t).map_err(|e| anyhow!("--instances: {e}")))
        .transpose()
}

/// The config hash each instance of the job runs.
fn instance_configs(view: &JobView) -> Vec<String> {
    let fallback = config_hash(&view.spec);
    view.instances
        .iter()
        .map(|i| i.config.clone().unwrap_or_else(|| fallback.clone()))
        .collect()
}

/// `drover job diff FILE [--instances R]`: Ok(false) (exit 1) when something would
/// change.
pub async fn diff(client: &Client, file: &Path, instances: Option<&str>) -> anyhow::Result<bool> {
    let Some(spec) = load(file)? else {
        return Ok(false);
    };
    let only = instances_arg(instances)?;
    let key = spec.key();
    let view = match client.job(&key).await {
        Ok(view) => view,
        Err(e) if e.api_code() == Some("not_found") => {
            println!(
                "{key} does not exist: `drover job create {}` would add instances {}",
                file.display(),
                format_ranges(&(0..spec.instances).collect::<Vec<_>>())
            );
            return Ok(false);
        }
        Err(e) => return Err(e.into()),
    };
    let current = instance_configs(&view);
    let plan = plan_update(
        &current,
        &config_hash(&spec),
        spec.instances,
        only.as_deref(),
    )
    .map_err(|e| anyhow!("{key}: {e}"))?;
    print!("{}", render_diff(&view, &spec, &plan));
    Ok(plan.is_empty())
}

/// The text of `drover job diff`.
pub fn render_diff(view: &JobView, spec: &JobSpec, plan: &UpdatePlan) -> String {
    let new_hash = config_hash(spec);
    let mut out = format!(
        "{}: {} instance(s) -> {}; new config {new_hash}\n",
        view.key,
        view.instances.len(),
        plan.instances_after
    );
    let line = |name: &str, list: &[u32]| {
        let text = if list.is_empty() {
            "-".to_string()
        } else {
            format_ranges(list)
        };
        format!("{name:<10} {text}\n")
    };
    let replaced: Vec<u32> = plan.replace.iter().map(|(i, _)| *i).collect();
    out.push_str(&line("add:", &plan.add));
    out.push_str(&line("remove:", &plan.remove));
    out.push_str(&line("replace:", &replaced));
    out.push_str(&line("unchanged:", &plan.unchanged));
    let mut froms: Vec<&String> = plan.replace.iter().map(|(_, h)| h).collect();
    froms.sort();
    froms.dedup();
    for from in froms {
        let on: Vec<u32> = plan
            .replace
            .iter()
            .filter(|(_, h)| h == from)
            .map(|(i, _)| *i)
            .collect();
        let _ = writeln!(
            out,
            "config {from} -> {new_hash} (instances {}):",
            format_ranges(&on)
        );
        match view.configs.get(from) {
            Some(old) => {
                for change in field_diff(old, spec) {
                    out.push_str(&render_change(&change.field, &change.old, &change.new));
                }
            }
            None => out.push_str("  (the master did not send this config)\n"),
        }
    }
    if plan.is_empty() {
        out.push_str("nothing would change\n");
    }
    if let Some(note) = pending_note(view) {
        let _ = writeln!(out, "{note}");
    }
    out
}

/// One changed field: `field: old -> new`, or for a text of several lines (a
/// script), the lines that changed.
fn render_change(
    field: &str,
    old: &Option<serde_json::Value>,
    new: &Option<serde_json::Value>,
) -> String {
    if let (Some(serde_json::Value::String(a)), Some(serde_json::Value::String(b))) = (old, new) {
        if a.contains('\n') || b.contains('\n') {
            if let Some(lines) = crate::linediff::diff(a, b) {
                return format!("  {field}:\n{}", crate::linediff::render(&lines, "    "));
            }
        }
    }
    let show = |v: &Option<serde_json::Value>| {
        v.as_ref()
            .map_or_else(|| "(absent)".to_string(), |v| v.to_string())
    };
    format!("  {field}: {} -> {}\n", show(old), show(new))
}

/// When instances of the job wait for a place now, why (the scheduler's reason):
/// an update waits for them too.
pub fn pending_note(view: &JobView) -> Option<String> {
    let pending: Vec<(u32, &str)> = view
        .instances
        .iter()
        .filter_map(|i| {
            let t = i.current.as_ref()?;
            (t.state == drover_common::TaskState::Pending).then(|| {
                (
                    i.instance,
                    t.pending_reason.as_deref().unwrap_or("not placed yet"),
                )
            })
        })
        .collect();
    let (_, reason) = pending.first()?;
    let list: Vec<u32> = pending.iter().map(|(i, _)| *i).collect();
    Some(format!(
        "note: instance(s) {} of {} are PENDING now: {reason}; an update waits for a place \
         for them too",
        format_ranges(&list),
        view.key
    ))
}

/// `drover job update ...`.
pub async fn update(client: &Client, args: UpdateArgs) -> anyhow::Result<bool> {
    if let Some(action) = args.action {
        return steer(client, action).await;
    }
    let Some(file) = args.file else {
        bail!(
            "drover job update needs a spec file, or one of status|pause|resume|abort|rollback KEY"
        );
    };
    let Some(spec) = load(&file)? else {
        return Ok(false);
    };
    // Checked here so a bad range is named before anything is sent.
    instances_arg(args.instances.as_deref())?;
    let key = spec.key();
    let request = UpdateRequest {
        spec,
        instances: args.instances,
        // No name rather than `unknown`: the master names the token's description.
        user: std::env::var("USER").ok().filter(|u| !u.trim().is_empty()),
    };
    let view = client.start_update(&key, &request).await?;
    println!(
        "update {} of {key} started: {} instance(s) to change, batch size {}, each must \
         stay RUNNING {}",
        view.id,
        view.instances.len(),
        view.settings.batch_size,
        view.settings.watch
    );
    if !args.wait {
        // The scheduler has run since the start: say if the batch waits for a place.
        if let Ok(now) = client.update(&key).await {
            if let Some(line) =
                cannot_finish(&now).or(now.waiting.filter(|w| w.contains("PENDING")))
            {
                println!("  waiting: {line}");
            }
        }
        return Ok(true);
    }
    let started = Instant::now();
    let mut shown_events = 0;
    let mut shown_waiting = None;
    // Started before the first read: a change committed in between wakes `next`.
    let mut changes = crate::follow::Changes::start(client, Some(&key)).await?;
    loop {
        let view = client.update(&key).await?;
        let elapsed = started.elapsed().as_secs_f64();
        for line in event_lines(&view, shown_events) {
            println!("{line}");
        }
        shown_events = shown_events.max(view.events.len());
        if view.waiting.is_some() && view.waiting != shown_waiting && !view.state.is_terminal() {
            println!(
                "  {elapsed:>6.1}s  waiting: {}",
                view.waiting.as_deref().unwrap_or_default()
            );
        }
        shown_waiting = view.waiting.clone();
        if view.state.is_terminal() {
            println!("update {} of {key}: {}", view.id, view.state);
            return Ok(view.state == UpdateState::RolledForward);
        }
        if let Some(why) = cannot_finish(&view) {
            eprintln!(
                "error: update {} of {key} cannot finish as things stand: {why}\n  it goes on \
                 in the master (`drover job update status {key}`); `drover job update abort \
                 {key}` stops it",
                view.id
            );
            return Ok(false);
        }
        let left = args.timeout.saturating_sub(started.elapsed());
        if left.is_zero() || !changes.next(left).await? {
            bail!(
                "update {} of {key} is still {} after {}s; `drover job update status {key}` \
                 follows it, --timeout waits longer",
                view.id,
                view.state,
                args.timeout.as_secs()
            );
        }
    }
}

/// Why a running update cannot finish as things stand (the master's `stuck`).
pub fn cannot_finish(view: &UpdateView) -> Option<String> {
    view.stuck.clone().filter(|_| !view.state.is_terminal())
}

/// The events of `view` from the `from`-th on, one line each with its time since
/// the update started and the progress now; the final event (the end state) is
/// left to the line that reports the end, so it shows once.
pub fn event_lines(view: &UpdateView, from: usize) -> Vec<String> {
    let end = view.state.to_string();
    view.events
        .iter()
        .skip(from)
        .filter(|e| !(view.state.is_terminal() && e.message == end))
        .map(|e| {
            format!(
                "  {:>6.1}s  {}  [{}]",
                e.at_ms.saturating_sub(view.created_ms) as f64 / 1000.0,
                e.message,
                progress(view)
            )
        })
        .collect()
}

/// `batch 2/3: 3/9 updated, 3 updating, 0 failed`.
pub fn progress(view: &UpdateView) -> String {
    let count = |s: InstanceUpdateState| view.instances.iter().filter(|p| p.state == s).count();
    let total = view.instances.len();
    let mut out = String::new();
    if view.batches > 0 {
        let _ = write!(out, "batch {}/{}: ", view.batch, view.batches);
    }
    let _ = write!(
        out,
        "{}/{total} updated, {} updating, {} failed",
        count(InstanceUpdateState::Updated),
        count(InstanceUpdateState::Updating),
        count(InstanceUpdateState::Failed)
    );
    let back = count(InstanceUpdateState::RollingBack) + count(InstanceUpdateState::RolledBack);
    if back > 0 {
        let _ = write!(
            out,
            ", {}/{back} rolled back",
            count(InstanceUpdateState::RolledBack)
        );
    }
    out
}

async fn steer(client: &Client, action: UpdateCommand) -> anyhow::Result<bool> {
    let (key, verb) = match &action {
        UpdateCommand::Status { key, json } => {
            let target = parse_job_target(key)?;
            let view = client.update(&target.key).await?;
            if *json {
                println!("{}", serde_json::to_string_pretty(&view)?);
            } else {
                print!("{}", render_status(&view));
            }
            return Ok(true);
        }
        UpdateCommand::Pause { key } => (key, "pause"),
        UpdateCommand::Resume { key } => (key, "resume"),
        UpdateCommand::Abort { key } => (key, "abort"),
        UpdateCommand::Rollback { key } => (key, "rollback"),
    };
    let target = parse_job_target(key)?;
    let view = client.update_action(&target.key, verb).await?;
    println!("update {} of {}: {}", view.id, view.job, view.state);
    Ok(true)
}

/// The text of `drover job update status KEY`.
pub fn render_status(view: &UpdateView) -> String {
    let s = &view.settings;
    let mut out = format!(
        "update {} of {} by {}, started {}: {}\n",
        view.id,
        view.job,
        view.user,
        crate::render::timestamp(view.created_ms),
        view.state
    );
    let _ = writeln!(
        out,
        "to config {}, instances {} -> {}; batch size {}, watch {}, \
         max failures per instance {}, in total {}, rollback on failure {}",
        view.to_config,
        view.instances_before,
        view.instances_after,
        s.batch_size,
        s.watch,
        s.max_per_instance_failures,
        s.max_total_failures,
        s.rollback_on_failure
    );
    let _ = writeln!(out, "{}", progress(view));
    let mut table = Table::new(&["INSTANCE", "FROM", "TO", "STATE", "FAILURES"]);
    for p in &view.instances {
        table.row(vec![
            p.instance.to_string(),
            p.from.clone().unwrap_or_else(|| "(added)".into()),
            p.to.clone().unwrap_or_else(|| "(removed)".into()),
            format!("{:?}", p.state).to_uppercase(),
            p.failures.to_string(),
        ]);
    }
    out.push_str(&table.render());
    out.push_str("events:\n");
    for e in &view.events {
        let _ = writeln!(
            out,
            "  {:>7.1}s  {}",
            e.at_ms.saturating_sub(view.created_ms) as f64 / 1000.0,
            e.message
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn spec(cmd: &str, instances: u32) -> JobSpec {
        serde_json::from_str(&format!(
            r#"{{"role":"www","environment":"prod","name":"web","instances":{instances},
            "task":{{"processes":[{{"name":"main","cmdline":"{cmd}"}}],
                    "resources":{{"cpu":1,"ram":"1GiB","disk":"1GiB"}}}}}}"#
        ))
        .unwrap()
    }

    fn job(old: &JobSpec) -> JobView {
        let hash = config_hash(old);
        JobView {
            key: "www/prod/web".into(),
            spec: old.clone(),
            created_ms: 0,
            state_counts: BTreeMap::new(),
            instances: (0..old.instances)
                .map(|i| wire::InstanceView {
                    instance: i,
                    config: Some(hash.clone()),
                    current: None,
                    history: vec![],
                })
                .collect(),
            configs: [(hash, old.clone())].into(),
            update: None,
            ungranted_user: None,
            cron: None,
            instance_count: 0,
            config_counts: BTreeMap::new(),
            next_after: None,
            recent_events: Vec::new(),
        }
    }

    #[test]
    fn a_multi_line_cmdline_diff_shows_the_lines_that_changed() {
        let old = spec("set -e\\necho a\\nsleep 100\\necho b", 1);
        let new = spec("set -e\\necho a\\nsleep 200\\necho b", 1);
        let view = job(&old);
        let plan = plan_update(&instance_configs(&view), &config_hash(&new), 1, None).unwrap();
        let text = render_diff(&view, &new, &plan);
        assert!(
            text.contains(
                "  task.processes[0].cmdline:\n      set -e\n      echo a\n    - sleep 100\n    \
                 + sleep 200\n      echo b\n"
            ),
            "{text}"
        );
        assert!(!text.contains("\\n"), "no escaped string: {text}");
    }

    #[test]
    fn a_diff_says_why_instances_wait_for_a_place() {
        let old = spec("sleep 100", 3);
        let mut view = job(&old);
        let pending: wire::TaskView = serde_json::from_value(serde_json::json!({
            "task_id": "t1", "job": "www/prod/web", "instance": 1, "state": "PENDING",
            "desired": "RUNNING", "exit_reason": null, "agent_id": null, "ports": {},
            "pending_reason": "host limit reached on 1 agent", "events": []
        }))
        .unwrap();
        view.instances[1].current = Some(pending.clone());
        view.instances[2].current = Some(pending);
        let plan = plan_update(&instance_configs(&view), &config_hash(&old), 3, None).unwrap();
        let text = render_diff(&view, &old, &plan);
        assert!(
            text.contains(
                "note: instance(s) 1-2 of www/prod/web are PENDING now: host limit reached on 1 agent"
            ),
            "{text}"
        );
    }

    #[test]
    fn update_events_show_the_end_state_once_and_label_no_batch_with_it() {
        let old = spec("sleep 100", 3);
        let update: UpdateView = serde_json::from_value(serde_json::json!({
            "id": "u1", "job": "www/prod/web", "user": "me", "created_ms": 1000,
            "state": "ROLLED_FORWARD", "settings": old.update, "to_config": "abc",
            "instances_before": 3, "instances_after": 1, "instances": [],
            "events": [
                {"at_ms": 1000, "message": "started by me"},
                {"at_ms": 1500, "message": "batch: instances 1-2"},
                {"at_ms": 3000, "message": "ROLLED_FORWARD"}
            ],
            "stuck": "never shown once it ended"
        }))
        .unwrap();
        let lines = event_lines(&update, 1);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with("     0.5s  batch: instances 1-2  ["),
            "{lines:?}"
        );
        assert!(!lines.concat().contains("ROLLED_FORWARD"), "{lines:?}");
        assert_eq!(cannot_finish(&update), None);
    }

    #[test]
    fn a_diff_names_instances_and_each_changed_field() {
        let old = spec("sleep 100", 3);
        let new = spec("sleep 200", 4);
        let view = job(&old);
        let plan = plan_update(&instance_configs(&view), &config_hash(&new), 4, None).unwrap();
        let text = render_diff(&view, &new, &plan);
        assert!(text.contains("add:       3\n"), "{text}");
        assert!(text.contains("replace:   0-2\n"), "{text}");
        assert!(
            text.contains(r#"  task.processes[0].cmdline: "sleep 100" -> "sleep 200""#),
            "{text}"
        );
        let same = plan_update(&instance_configs(&view), &config_hash(&old), 2, None).unwrap();
        let text = render_diff(&view, &old, &same);
        assert!(text.contains("remove:    2\n"), "{text}");
        assert!(!same.is_empty());
        let none = plan_update(&instance_configs(&view), &config_hash(&old), 3, None).unwrap();
        assert!(render_diff(&view, &old, &none).contains("nothing would change"));
    }
}
