//! Two clocks: steps of the wall clock change timestamps, never a decision; every
//! timeout runs on the monotonic clock.

use super::*;

const MIN10: i64 = 10 * 60_000;

/// Two agents with a RUNNING service task each.
fn two_running(w: &mut World) -> Vec<String> {
    w.register("a1", 8.0, 16, &[]);
    w.register("a2", 8.0, 16, &[]);
    let ids = w.create(spec("svc", 2, true, ""));
    for id in &ids {
        w.run(id);
    }
    ids
}

fn none_lost(w: &World) -> bool {
    w.core
        .tasks
        .values()
        .all(|t| t.status.state != TaskState::Lost)
}

#[test]
fn wall_clock_steps_forward_and_back_lose_nothing() {
    for step in [MIN10, -MIN10] {
        let mut w = World::new();
        let ids = two_running(&mut w);
        w.pass(2_000);
        w.wall_skew += step;
        w.pass(60_000);
        assert!(none_lost(&w), "step {step}");
        assert_eq!(w.core.task_count(), 2, "step {step}: a replacement");
        for id in &ids {
            assert_eq!(w.state(id), TaskState::Running);
        }
        // Timestamps follow the wall clock.
        let a = w.core.agent_views();
        assert_eq!(a[0].last_heartbeat_ms, w.at().wall, "step {step}");
    }
}

#[test]
fn an_agent_killed_after_a_backward_step_is_found_within_the_agent_timeout() {
    let mut w = World::new();
    let ids = two_running(&mut w);
    let mut c = cfg();
    c.eviction_guard_share_permille = 1000; // two agents: one lost is half
    w.core.cfg = c;
    w.pass(2_000);
    w.wall_skew -= MIN10;
    w.pass(1_000);
    // a1 stops; a2 keeps heartbeating.
    let on_a1 = ids
        .iter()
        .find(|id| w.core.task(id).unwrap().agent.as_deref() == Some("a1"))
        .unwrap()
        .clone();
    let silent_from = w.now;
    while w.state(&on_a1) != TaskState::Lost {
        assert!(
            w.now - silent_from <= 3_000 + 500 + 1_000 + 500,
            "not lost within timeout + sweep + settle"
        );
        w.advance(100);
        if w.now.is_multiple_of(500) {
            w.heartbeat("a2", None);
        }
    }
}

#[test]
fn a_throttled_penalty_and_a_transient_timeout_ignore_wall_steps() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("flap", 1, true, ""));
    w.run(&t[0]);
    w.report(&t[0], TaskState::Failed, None);
    let next = w.current(JOB_FLAP, 0);
    assert_eq!(w.state(&next), TaskState::Throttled);
    // A backward step does not stretch the 1 s penalty.
    w.wall_skew -= MIN10;
    w.pass(1_000);
    assert_ne!(w.state(&next), TaskState::Throttled);
    // A forward step does not end a 20 s transient timeout early.
    assert_eq!(w.state(&next), TaskState::Assigned);
    w.wall_skew += 2 * MIN10;
    w.pass(10_000);
    assert_eq!(w.state(&next), TaskState::Assigned);
}

const JOB_FLAP: &str = "www/prod/flap";

#[derive(Clone, Debug)]
enum Step {
    /// Monotonic time passes, every agent heartbeating each half agent timeout.
    Pass(u64),
    /// The wall clock steps.
    Jump(i64),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        (1u64..20_000).prop_map(Step::Pass),
        (-3_600_000i64..3_600_000).prop_map(Step::Jump),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// However the wall clock jumps, no task is LOST (nor replaced) while its agent
    /// heartbeats within the agent timeout on the monotonic clock.
    #[test]
    fn no_task_lost_while_its_agent_heartbeats(steps in prop::collection::vec(step(), 1..30)) {
        let mut w = World::new();
        let ids = two_running(&mut w);
        for s in steps {
            match s {
                Step::Pass(ms) => {
                    let mut left = ms;
                    while left > 0 {
                        let d = left.min(1_400);
                        w.advance(d);
                        left -= d;
                        w.heartbeat("a1", None);
                        w.heartbeat("a2", None);
                    }
                }
                Step::Jump(by) => w.wall_skew += by,
            }
            prop_assert!(none_lost(&w));
            prop_assert_eq!(w.core.task_count(), 2);
        }
        for id in &ids {
            prop_assert_eq!(w.state(id), TaskState::Running);
        }
    }
}
