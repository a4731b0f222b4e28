//! The assignment sets agents are served.

use super::*;

#[test]
fn assignments_say_whether_the_task_was_started_so_a_lost_sandbox_never_reruns_it() {
    let mut w = World::new();
    w.register("a1", 4.0, 8, &[]);
    let tasks = w.create(spec("hello", 1, true, ""));
    let started = |w: &World| w.core.assignment_set("a1").unwrap().assignments[0].started;
    assert!(!started(&w), "a fresh assignment may be started");
    w.report(&tasks[0], TaskState::Starting, None);
    assert!(
        started(&w),
        "once reported, the agent must not start it again"
    );
}
