//! Deciding, from a job's view, whether a wait is over (`job create --wait`,
//! `drover dev --exit-when-running`), and which task events are new since the last
//! look (`drover dev --job` follows a job by printing each one). Pure.

use std::collections::BTreeMap;

use drover_common::state::TaskState;
use drover_common::wire::{JobView, TaskView};

use crate::render::{task_reason, time_of_day};

/// Where a job stands for someone waiting on it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not there yet.
    Waiting,
    /// Every instance is RUNNING (a service) or FINISHED (a batch job).
    Done,
    /// It will not get there; says why.
    Failed(String),
}

/// Whether every instance reached its goal (RUNNING for services, FINISHED for batch
/// jobs), or a task failed on the way.
pub fn wait_outcome(view: &JobView) -> Outcome {
    let goal = if view.spec.service {
        TaskState::Running
    } else {
        TaskState::Finished
    };
    if view.instances.is_empty() {
        return Outcome::Waiting;
    }
    let mut all_done = true;
    for instance in &view.instances {
        // A service that failed once is crash-looping or unhealthy: say so rather
        // than wait for a replacement that may fail the same way.
        if view.spec.service {
            if let Some(failed) = instance
                .history
                .iter()
                .find(|t| t.state == TaskState::Failed)
            {
                return Outcome::Failed(failure(instance.instance, failed));
            }
        }
        // `current` is the latest task (it may be terminal); history is newest first.
        let effective = instance.current.as_ref().or(instance.history.first());
        match effective {
            Some(task) if task.state == goal => {}
            Some(task)
                if matches!(
                    task.state,
                    TaskState::Failed | TaskState::Killed | TaskState::Killing
                ) || (task.state == TaskState::Lost && instance.current.is_none()) =>
            {
                return Outcome::Failed(failure(instance.instance, task));
            }
            _ => all_done = false,
        }
    }
    if all_done {
        Outcome::Done
    } else {
        Outcome::Waiting
    }
}

fn failure(instance: u32, task: &TaskView) -> String {
    format!(
        "instance {instance}: task {} is {} ({}); see `drover task show {}`",
        task.task_id,
        task.state,
        task_reason(task),
        task.task_id
    )
}

/// Remembers how many events of each task were already printed.
#[derive(Clone, Debug, Default)]
pub struct EventFollower {
    seen: BTreeMap<String, usize>,
}

impl EventFollower {
    /// A follower that has printed nothing yet.
    pub fn new() -> EventFollower {
        EventFollower::default()
    }

    /// The lines for every event not printed before, of every task of the job
    /// (history first, then the current task), ordered by time.
    pub fn new_lines(&mut self, view: &JobView) -> Vec<String> {
        let mut lines: Vec<(u64, u32, String)> = Vec::new();
        for instance in &view.instances {
            for task in instance.history.iter().chain(instance.current.iter()) {
                let seen = self.seen.entry(task.task_id.clone()).or_insert(0);
                for event in task.events.iter().skip(*seen) {
                    let mut line = format!(
                        "{}  instance {}  {}  {}",
                        time_of_day(event.timestamp_ms),
                        instance.instance,
                        task.task_id,
                        event.state
                    );
                    if !event.message.is_empty() {
                        line.push_str("  ");
                        line.push_str(&event.message);
                    }
                    if event.state.is_terminal() {
                        if let Some(reason) = &task.exit_reason {
                            let reason = reason.to_string();
                            if reason != event.message {
                                line.push_str(&format!(" [{reason}]"));
                            }
                        }
                    }
                    lines.push((event.timestamp_ms, instance.instance, line));
                }
                *seen = (*seen).max(task.events.len());
            }
        }
        lines.sort_by_key(|(ts, instance, _)| (*ts, *instance));
        lines.into_iter().map(|(_, _, line)| line).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use drover_common::state::{EventSource, ExitReason, TaskEvent};
    use drover_common::wire::InstanceView;
    use drover_common::DesiredState;

    fn spec(service: bool) -> drover_common::JobSpec {
        serde_json::from_value(serde_json::json!({
            "role": "www-data", "environment": "devel", "name": "hello",
            "service": service,
            "task": {
                "processes": [{"name": "main", "cmdline": "true"}],
                "resources": {"cpu": 0.1, "ram": "64MiB", "disk": "64MiB"}
            }
        }))
        .unwrap()
    }

    fn task(id: &str, states: &[TaskState]) -> TaskView {
        TaskView {
            task_id: id.into(),
            job: "www-data/devel/hello".into(),
            instance: 0,
            state: *states.last().unwrap(),
            desired: DesiredState::Running,
            exit_reason: None,
            agent_id: None,
            ports: BTreeMap::new(),
            pending_reason: None,
            preempted_by: None,
            events: states
                .iter()
                .enumerate()
                .map(|(i, s)| TaskEvent {
                    timestamp_ms: 1000 * i as u64,
                    state: *s,
                    source: EventSource::Master,
                    message: String::new(),
                })
                .collect(),
            processes: vec![],
            processes_omitted: None,
        }
    }

    fn view(service: bool, instances: Vec<(Option<TaskView>, Vec<TaskView>)>) -> JobView {
        JobView {
            key: "www-data/devel/hello".into(),
            spec: spec(service),
            created_ms: 0,
            state_counts: BTreeMap::new(),
            instances: instances
                .into_iter()
                .enumerate()
                .map(|(i, (current, history))| InstanceView {
                    instance: i as u32,
                    config: None,
                    current,
                    history,
                })
                .collect(),
            cron: None,
            configs: BTreeMap::new(),
            update: None,
            ungranted_user: None,
            instance_count: 0,
            config_counts: BTreeMap::new(),
            next_after: None,
            recent_events: Vec::new(),
        }
    }

    use TaskState::*;

    #[test]
    fn service_is_done_when_every_instance_runs() {
        let running = task("a", &[Pending, Assigned, Running]);
        let starting = task("b", &[Pending, Assigned, Starting]);
        let v = view(
            true,
            vec![(Some(running.clone()), vec![]), (Some(starting), vec![])],
        );
        assert_eq!(wait_outcome(&v), Outcome::Waiting);
        let v = view(
            true,
            vec![(Some(running.clone()), vec![]), (Some(running), vec![])],
        );
        assert_eq!(wait_outcome(&v), Outcome::Done);
    }

    #[test]
    fn service_with_a_failed_task_fails_the_wait() {
        let mut failed = task("old", &[Pending, Assigned, Running, Failed]);
        failed.exit_reason = Some(ExitReason::ExitCode { code: 1 });
        let throttled = task("new", &[Throttled]);
        let v = view(true, vec![(Some(throttled), vec![failed])]);
        match wait_outcome(&v) {
            Outcome::Failed(why) => {
                assert!(why.contains("task old is FAILED (exit code 1)"), "{why}")
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn batch_is_done_when_every_instance_finished_and_retries_are_waited_for() {
        let finished = task("a", &[Pending, Running, Finished]);
        let failed = task("b", &[Pending, Running, Failed]);
        let retry = task("c", &[Pending]);
        let v = view(
            false,
            vec![
                (None, vec![finished.clone()]),
                (Some(retry), vec![failed.clone()]),
            ],
        );
        assert_eq!(wait_outcome(&v), Outcome::Waiting);
        let v = view(
            false,
            vec![(Some(finished.clone()), vec![]), (None, vec![failed])],
        );
        assert!(matches!(wait_outcome(&v), Outcome::Failed(_)));
        let v = view(false, vec![(None, vec![finished])]);
        assert_eq!(wait_outcome(&v), Outcome::Done);
    }

    #[test]
    fn follower_prints_each_event_once_in_time_order() {
        let mut follower = EventFollower::new();
        let v = view(true, vec![(Some(task("a", &[Pending, Assigned])), vec![])]);
        let lines = follower.new_lines(&v);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].ends_with("instance 0  a  PENDING"), "{lines:?}");
        assert!(lines[1].ends_with("instance 0  a  ASSIGNED"), "{lines:?}");
        assert!(follower.new_lines(&v).is_empty());
        let v = view(
            true,
            vec![(Some(task("a", &[Pending, Assigned, Running])), vec![])],
        );
        let lines = follower.new_lines(&v);
        assert_eq!(lines.len(), 1);
        assert!(lines[0].ends_with("a  RUNNING"), "{lines:?}");
    }
}
