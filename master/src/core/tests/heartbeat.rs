//! Heartbeat scaling in the core: the interval each answer tells follows the cell's
//! size, and loss detection and exclusive leases follow what each agent was told.

use drover_common::wire::RegisterResponse;

use super::*;

/// The defaults' timing (1 s interval, 15 s agent timeout, 10 s lease) at `rate`.
fn scaled(rate: u32) -> CoreConfig {
    CoreConfig {
        heartbeat_interval_ms: 1_000,
        agent_timeout_ms: 15_000,
        exclusive_lease_ms: 10_000,
        max_heartbeat_rate: rate,
        ..cfg()
    }
}

fn register(w: &mut World, id: &str) -> RegisterResponse {
    let req = agent_req(id, 8.0, 16, &[]);
    match w.handle(Event::Register(Box::new(req))).reply.unwrap() {
        Reply::Registered(r) => r,
        r => panic!("{r:?}"),
    }
}

fn told(r: &HeartbeatResponse) -> (Option<u64>, Option<u64>) {
    (r.heartbeat_interval_ms, r.exclusive_lease_ms)
}

fn reachable(w: &World, id: &str) -> bool {
    w.core.agents[w.core.agent_idx[id] as usize].reachable
}

/// Lets `ms` pass in steps of `step` while the agents `alive` heartbeat after each.
fn heartbeating(w: &mut World, alive: &[String], ms: u64, step: u64) {
    for _ in 0..ms / step {
        w.advance(step);
        for a in alive {
            w.heartbeat(a, None);
        }
    }
}

fn ids(n: usize) -> Vec<String> {
    (0..n).map(|k| format!("a{k}")).collect()
}

#[test]
fn ten_agents_are_told_the_configured_interval() {
    let mut w = World::with(scaled(100));
    let mut last = None;
    for id in ids(10) {
        last = Some(register(&mut w, &id));
    }
    let r = last.unwrap();
    assert_eq!(
        (r.heartbeat_interval_ms, r.exclusive_lease_ms),
        (1_000, Some(10_000))
    );
    assert_eq!(told(&w.heartbeat("a3", None)), (Some(1_000), Some(10_000)));
    assert_eq!(w.core.agents[3].lost_after, w.now + 15_000);
}

#[test]
fn ten_thousand_agents_at_rate_100_are_told_100_s() {
    let mut w = World::with(scaled(100));
    for id in ids(10_000) {
        // Straight to the core: the World's per-event checks walk every agent.
        let req = agent_req(&id, 8.0, 16, &[]);
        w.core.handle(Event::Register(Box::new(req)), w.at());
    }
    assert_eq!(w.core.live_agents, 10_000);
    let r = register(&mut w, "a0");
    assert_eq!(
        (r.heartbeat_interval_ms, r.exclusive_lease_ms),
        (100_000, Some(208_000))
    );
    assert_eq!(
        told(&w.heartbeat("a9999", None)),
        (Some(100_000), Some(208_000))
    );
    // Lost 15 s + twice the interval's growth (99 s) after the heartbeat.
    assert_eq!(w.core.agents[9_999].lost_after, w.now + 213_000);
}

#[test]
fn an_agent_told_a_long_interval_is_lost_after_its_timeout_not_before() {
    // 10 agents at 2 heartbeats a second: 5 s interval, loss timeout 15 + 8 s.
    let mut w = World::with(scaled(2));
    let all = ids(10);
    for id in &all {
        register(&mut w, id);
    }
    let r = w.heartbeat("a0", None);
    assert_eq!(told(&r), (Some(5_000), Some(18_000)));
    let silent_from = w.now;
    // The others heartbeat every told interval; a0 stops. Its heartbeats came
    // at most every 5 s, well within the old fixed agent timeout (15 s) twice.
    let others = &all[1..];
    heartbeating(&mut w, others, 23_000, 500);
    assert_eq!(w.now, silent_from + 23_000);
    assert!(reachable(&w, "a0"), "lost before its told timeout (23 s)");
    // Found by the next sweep (every 1 s here).
    heartbeating(&mut w, others, 1_000, 500);
    assert!(!reachable(&w, "a0"), "not lost within timeout + one sweep");
    // The cell has 9 live agents now: 4.5 s.
    assert_eq!(told(&w.heartbeat("a1", None)).0, Some(4_500));
}

#[test]
fn intervals_grow_with_the_cell_and_shrink_at_the_next_heartbeat() {
    let mut w = World::with(scaled(2));
    let all = ids(10);
    register(&mut w, "a0");
    register(&mut w, "a1");
    assert_eq!(told(&w.heartbeat("a0", None)).0, Some(1_000));
    for id in &all[2..] {
        register(&mut w, id);
    }
    assert_eq!(told(&w.heartbeat("a0", None)), (Some(5_000), Some(18_000)));
    // Eight agents go silent; a0 and a1 heartbeat every second (as a shrunk cell
    // would have them) until the sweep finds the eight lost.
    let survivors = &all[..2];
    heartbeating(&mut w, survivors, 24_000, 1_000);
    for id in &all[2..] {
        assert!(!reachable(&w, id), "{id}");
    }
    // The next heartbeat tells the smaller cell's interval.
    assert_eq!(told(&w.heartbeat("a0", None)), (Some(1_000), Some(10_000)));
    // Back: the cell grows, and so does the interval.
    for id in &all[2..] {
        w.heartbeat(id, None);
    }
    assert_eq!(told(&w.heartbeat("a0", None)).0, Some(5_000));
}

#[test]
fn after_a_shrink_an_agent_keeps_the_longer_timeout_it_may_not_have_heard_end() {
    let mut w = World::with(scaled(2));
    let all = ids(10);
    for id in &all {
        register(&mut w, id);
    }
    // All are told 5 s (timeout 23 s); a0 last at 20 s ...
    for id in &all {
        w.heartbeat(id, None);
    }
    heartbeating(&mut w, &all[..2], 20_000, 1_000);
    let long_deadline = w.now + 23_000;
    // ... then the sweep at 24 s finds the eight silent ones lost.
    heartbeating(&mut w, &all[1..2], 4_000, 1_000);
    assert!(all[2..].iter().all(|a| !reachable(&w, a)));
    // This answer (1 s, timeout 15 s) may be lost on its way: a0 is still lost
    // no earlier than the longest timeout an answer told it.
    assert_eq!(told(&w.heartbeat("a0", None)).0, Some(1_000));
    assert!(long_deadline > w.now + 15_000);
    assert_eq!(w.core.agents[0].lost_after, long_deadline);
    heartbeating(&mut w, &all[1..2], 19_000, 1_000);
    assert!(reachable(&w, "a0"), "lost before the longer timeout");
    heartbeating(&mut w, &all[1..2], 1_000, 1_000);
    assert!(!reachable(&w, "a0"));
}

#[test]
fn an_exclusive_task_is_replaced_only_after_the_lease_its_agent_was_told() {
    let mut c = scaled(2);
    c.eviction_guard_share_permille = 1000;
    let mut w = World::with(c);
    let all = ids(10);
    for id in &all {
        register(&mut w, id);
    }
    let ids = w.create(spec(
        "ex",
        1,
        true,
        r#","partition_policy":{"exclusive":true}"#,
    ));
    w.run(&ids[0]);
    let agent = w.core.task(&ids[0]).unwrap().agent.clone().unwrap();
    // Its agent's last answer: 5 s, lease 18 s (not the configured 10 s); then
    // silence.
    assert_eq!(told(&w.heartbeat(&agent, None)).1, Some(18_000));
    let silent_from = w.now;
    let kill = super::super::agents::kill_time_ms(&w.core.jobs["www/prod/ex"].spec);
    let others: Vec<String> = all.iter().filter(|a| **a != agent).cloned().collect();
    while w.state(&ids[0]) != TaskState::Lost {
        assert!(
            w.now - silent_from <= 18_000 + kill + 1_000,
            "never replaced"
        );
        heartbeating(&mut w, &others, 500, 500);
    }
    assert!(
        w.now - silent_from >= 18_000 + kill,
        "replaced {} ms after the last answer, before the told lease and kill time",
        w.now - silent_from
    );
}

#[test]
fn a_restarted_master_gives_every_agent_the_timeout_of_its_cell() {
    let mut w = World::with(scaled(2));
    let all = ids(10);
    for id in &all {
        register(&mut w, id);
    }
    w.core = Core::load(scaled(2), w.snapshot(), w.at(), 5);
    let restarted = w.now;
    // Agents told 5 s heartbeat at most that often: none is lost at 15 s.
    heartbeating(&mut w, &[], 16_000, 1_000);
    assert!(all.iter().all(|a| reachable(&w, a)));
    heartbeating(&mut w, &[], 8_000, 1_000);
    assert!(all.iter().all(|a| !reachable(&w, a)));
    assert!(w.now - restarted <= 23_000 + 1_000);
}
