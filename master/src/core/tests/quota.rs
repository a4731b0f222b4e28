//! Role quotas: production jobs past their role's quota are refused with the
//! numbers; preemptible jobs are not counted; a property over random requests.

use super::*;

fn quota(cpu: u64, ram_gib: u64) -> Usage {
    Usage {
        cpu_milli: cpu * 1000,
        ram_bytes: ram_gib * GIB,
        disk_bytes: 100 * GIB,
    }
}

fn set(w: &mut World, role: &str, q: Option<Usage>) {
    w.handle(Event::SetQuota {
        role: role.to_string(),
        quota: q,
    })
    .reply
    .unwrap();
}

#[test]
fn a_production_job_over_quota_is_refused_with_quota_use_and_ask() {
    let mut w = World::new();
    w.register("a1", 16.0, 64, &[]);
    set(&mut w, "www", Some(quota(3, 64)));
    w.create(spec("a", 2, true, ""));
    let err = w
        .handle(Event::CreateJob(Box::new(spec("b", 2, true, ""))))
        .reply
        .unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, CoreError::QuotaExceeded { .. }), "{msg}");
    assert!(msg.contains("quota cpu 3"), "{msg}");
    assert!(msg.contains("in use cpu 2"), "{msg}");
    assert!(msg.contains("asked cpu 2"), "{msg}");
    // Preemptible work is not bounded.
    w.create(spec("c", 4, false, r#","tier":"preemptible""#));
    // Raised: accepted.
    set(&mut w, "www", Some(quota(4, 64)));
    w.create(spec("b", 2, true, ""));
    let view = w.core.quota_view("www");
    assert_eq!(view.in_use.cpu, 4.0);
    // Another role has no quota: not bounded.
    let mut other = spec("x", 10, false, "");
    other.role = "db".into();
    w.create(other);
    // Removed: not bounded.
    set(&mut w, "www", None);
    w.create(spec("d", 3, true, ""));
    assert!(w
        .persisted
        .iter()
        .any(|c| matches!(c, Change::PutQuota(r, None) if r == "www")));
}

#[test]
fn a_job_whose_tasks_ended_no_longer_counts_and_may_be_recreated() {
    let mut w = World::new();
    w.register("a1", 16.0, 64, &[]);
    set(&mut w, "www", Some(quota(2, 64)));
    let t = w.create(spec("a", 2, false, ""));
    for id in &t {
        w.run(id);
    }
    // Re-creating a job replaces it: its own use is not counted twice.
    for id in &t {
        w.report(id, TaskState::Finished, None);
    }
    assert_eq!(w.core.quota_view("www").in_use.cpu, 0.0);
    w.create(spec("a", 2, false, ""));
}

proptest! {
    /// Whatever is asked, the production use of the role never exceeds its quota
    /// after an accepted request, and a refused one changes nothing.
    #[test]
    fn quotas_are_never_exceeded_by_an_accepted_request(
        q in (0u64..8, 0u64..8),
        asks in proptest::collection::vec((any::<bool>(), 1u32..4, 0u32..3), 1..12),
    ) {
        let mut w = World::new();
        w.register("a1", 64.0, 256, &[]);
        let limit = quota(q.0, q.1);
        set(&mut w, "www", Some(limit));
        for (i, (prod, n, kill)) in asks.iter().enumerate() {
            let tier = if *prod { "" } else { r#","tier":"preemptible""# };
            let before = w.core.quota_usage("www", None);
            let r = w.handle(Event::CreateJob(Box::new(spec(&format!("j{i}"), *n, false, tier)))).reply;
            let after = w.core.quota_usage("www", None);
            prop_assert!(after.within(&limit) || (r.is_err() && after == before), "{after:?} past {limit:?}");
            if r.is_err() {
                prop_assert_eq!(before, after);
            }
            if *kill == 0 && r.is_ok() {
                w.handle(Event::Kill { job: format!("www/prod/j{i}"), instances: None }).reply.unwrap();
            }
        }
    }
}

#[test]
fn an_update_past_the_quota_is_refused_like_a_create_and_changes_nothing() {
    let mut w = World::new();
    w.register("a1", 16.0, 64, &[]);
    w.register("a2", 16.0, 64, &[]);
    set(&mut w, "www", Some(quota(3, 64)));
    let tasks = w.create(spec("a", 2, true, ""));
    for id in &tasks {
        w.run(id);
    }
    let bigger = |cpu: f64, cmd: &str| {
        let mut v = serde_json::to_value(spec("a", 2, true, "")).unwrap();
        v["task"]["resources"]["cpu"] = serde_json::json!(cpu);
        v["task"]["processes"][0]["cmdline"] = serde_json::json!(cmd);
        serde_json::from_value::<JobSpec>(v).unwrap()
    };
    let start = |w: &mut World, spec: JobSpec, instances: Option<Vec<u32>>| {
        w.handle(Event::StartUpdate {
            job: "www/prod/a".to_string(),
            spec: Box::new(spec),
            instances,
            user: "alice".to_string(),
        })
        .reply
    };
    // Two instances of 2 cpus: 4 asked against a quota of 3, as a create would be.
    let err = start(&mut w, bigger(2.0, "sleep 200"), None).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, CoreError::QuotaExceeded { .. }), "{msg}");
    assert!(msg.contains("quota cpu 3"), "{msg}");
    assert!(msg.contains("in use cpu 0"), "{msg}");
    assert!(msg.contains("asked cpu 4"), "{msg}");
    // A create of the same spec under another name asks the same.
    let mut other = bigger(2.0, "sleep 200");
    other.name = "z".into();
    let err = w
        .handle(Event::CreateJob(Box::new(other)))
        .reply
        .unwrap_err();
    let asked = |m: &str| m[m.find("asked").unwrap()..].to_string();
    assert_eq!(asked(&err.to_string()), asked(&msg), "as a create asks");
    // Refused: nothing changed.
    assert!(w.core.update_view("www/prod/a").is_none());
    assert_eq!(w.core.quota_view("www").in_use.cpu, 2.0);
    assert!(tasks.iter().all(|t| w.state(t) == TaskState::Running));
    // A canary of instance 0 only asks 2 + 1: within the quota, accepted, and
    // counted by the config each instance runs.
    start(&mut w, bigger(2.0, "sleep 200"), Some(vec![0])).unwrap();
    assert_eq!(w.core.quota_view("www").in_use.cpu, 3.0);
    // Another production job no longer fits beside it.
    let err = w
        .handle(Event::CreateJob(Box::new(spec("b", 1, true, ""))))
        .reply
        .unwrap_err();
    assert!(err.to_string().contains("in use cpu 3"), "{err}");
}
