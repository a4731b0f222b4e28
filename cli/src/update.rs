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
                    let show = |v: &Option<serde_json::Value>| {
                        v.as_ref()
                            .map_or_else(|| "(absent)".to_string(), |v| v.to_string())
                    };
                    let _ = writeln!(
                        out,
                        "  {}: {} -> {}",
                        change.field,
                        show(&change.old),
                        show(&change.new)
                    );
                }
            }
            None => out.push_str("  (the master did not send this config)\n"),
        }
    }
    if plan.is_empty() {
        out.push_str("nothing would change\n");
    }
    out
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
        user: Some(std::env::var("USER").unwrap_or_else(|_| "unknown".to_string())),
    };
    let view = client.start_update(&key, &request).await?;
    println!(
        "update {} of {key} started: {} instance(s) to change, batch size {}, watch {}",
        view.id,
        view.instances.len(),
        view.settings.batch_size,
        view.settings.watch
    );
    if !args.wait {
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
        for e in view.events.iter().skip(shown_events) {
            println!(
                "  {elapsed:>6.1}s  {}  {}  [{}]",
                view.state,
                e.message,
                progress(&view)
            );
        }
        shown_events = shown_events.max(view.events.len());
        if view.waiting.is_some() && view.waiting != shown_waiting {
            println!(
                "  {elapsed:>6.1}s  {}  waiting: {}",
                view.state,
                view.waiting.as_deref().unwrap_or_default()
            );
        }
        shown_waiting = view.waiting.clone();
        if view.state.is_terminal() {
            println!("update {} of {key}: {}", view.id, view.state);
            return Ok(view.state == UpdateState::RolledForward);
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
        }
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
