//! The change stream's read of the core: what changed after an index, filtered by
//! job and role, and batch numbers that go on after a reload.

use super::*;
use crate::core::{ChangeFilter, ChangesPage};
use drover_common::wire::UpdateState;

fn all() -> ChangeFilter {
    ChangeFilter {
        job: None,
        roles: None,
        agents: true,
    }
}

#[test]
fn only_what_was_written_after_the_index_and_up_to_the_commit_is_reported() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let registered = w.core.seq();
    let t = w.create(spec("c", 2, true, ""));
    let created = w.core.seq();
    assert!(created > registered);

    let first = w.core.changes_since(0, created, &all());
    assert_eq!(first.index, created);
    assert_eq!(first.tasks.len(), 2);
    assert_eq!(first.jobs.len(), 1);
    assert_eq!(first.jobs[0].key, "www/prod/c");
    assert_eq!(
        first.agents.len(),
        1,
        "the registration (and placements) wrote a1"
    );

    w.run(&t[0]);
    let now = w.core.seq();
    let next = w.core.changes_since(created, now, &all());
    let ids: Vec<&str> = next.tasks.iter().map(|t| t.task_id.as_str()).collect();
    assert_eq!(ids, vec![t[0].as_str()], "only the task that changed");
    assert_eq!(next.tasks[0].state, TaskState::Running);
    // Nothing past the committed batch is shown: the caller asks again from `upto`.
    let uncommitted = w.core.changes_since(created, created, &all());
    assert!(uncommitted.tasks.is_empty() && uncommitted.agents.is_empty());
    assert!(w.core.changes_since(now, now, &all()).tasks.is_empty());
}

#[test]
fn filters_keep_one_job_or_the_token_roles_and_agents_only_for_readers_of_all() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.create(spec("one", 1, true, ""));
    w.create(spec("two", 1, true, ""));
    let upto = w.core.seq();
    let job = ChangeFilter {
        job: Some("www/prod/two".to_string()),
        ..all()
    };
    let view = w.core.changes_since(0, upto, &job);
    assert!(view.tasks.iter().all(|t| t.job == "www/prod/two"));
    assert_eq!(view.tasks.len(), 1);
    let other_role = ChangeFilter {
        job: None,
        roles: Some(vec!["db".to_string()]),
        agents: false,
    };
    let view = w.core.changes_since(0, upto, &other_role);
    assert!(view.tasks.is_empty() && view.jobs.is_empty() && view.agents.is_empty());
    let own_role = ChangeFilter {
        roles: Some(vec!["www".to_string()]),
        ..other_role
    };
    assert_eq!(w.core.changes_since(0, upto, &own_role).tasks.len(), 2);
}

#[test]
fn a_reloaded_core_numbers_its_batches_after_the_last_one_stored() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let t = w.create(spec("r", 1, true, ""));
    w.run(&t[0]);
    let before = w.core.seq();
    let snap = w.snapshot();
    w.core = Core::load(cfg(), snap, w.at(), 5);
    assert_eq!(w.core.seq(), before, "the index goes on from the store");
    w.create(spec("after", 1, true, ""));
    let view = w.core.changes_since(before, w.core.seq(), &all());
    assert!(view.tasks.iter().any(|t| t.job == "www/prod/after"));
    assert!(view.tasks.iter().all(|t| t.job != "www/prod/r"), "{view:?}");
}

/// An update's record is in the stream whenever it is written, also when nothing
/// else changes (a pause), so `job update --wait` can follow it.
#[test]
fn update_records_written_after_the_index_are_in_the_stream() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    w.register("a2", 8.0, 16, &[]);
    let t = w.create(spec("c", 2, true, ""));
    for id in &t {
        w.run(id);
    }
    w.create(spec("other", 1, true, ""));
    let before = w.core.seq();
    let mut new = spec("c", 2, true, "");
    new.task.processes[0].cmdline = "sleep 200".to_string();
    w.handle(Event::StartUpdate {
        job: "www/prod/c".to_string(),
        spec: Box::new(new),
        instances: None,
        user: "alice".to_string(),
    })
    .reply
    .unwrap();
    let started = w.core.seq();
    let view = w.core.changes_since(before, started, &all());
    assert_eq!(view.updates.len(), 1);
    assert_eq!(view.updates[0].job, "www/prod/c");
    w.handle(Event::UpdateAction {
        job: "www/prod/c".to_string(),
        action: UpdateAction::Pause,
    })
    .reply
    .unwrap();
    let paused = w.core.seq();
    assert!(paused > started);
    let view = w.core.changes_since(started, paused, &all());
    assert!(view.tasks.is_empty(), "a pause changes no task");
    assert_eq!(view.updates.len(), 1);
    assert_eq!(view.updates[0].state, UpdateState::Paused);
    let other = ChangeFilter {
        job: Some("www/prod/other".to_string()),
        ..all()
    };
    assert!(w
        .core
        .changes_since(started, paused, &other)
        .updates
        .is_empty());
    let role = ChangeFilter {
        roles: Some(vec!["ads".to_string()]),
        ..all()
    };
    assert!(w
        .core
        .changes_since(started, paused, &role)
        .updates
        .is_empty());
    assert!(w
        .core
        .changes_since(paused, paused, &all())
        .updates
        .is_empty());
}

/// Pages of the stream (`limit`) hold every task exactly once, also when a task of
/// a later page is written again between two pages (it comes with its new batch),
/// and the last page's index is the committed one.
#[test]
fn pages_of_the_stream_hold_every_task_once_in_batch_order() {
    let mut w = World::new();
    w.register("a1", 8.0, 16, &[]);
    let first = w.create(spec("p", 7, false, ""));
    w.create(spec("q", 5, false, ""));
    let page = |after_task: Option<String>| ChangesPage {
        after_task,
        limit: Some(3),
    };
    let mut seen: Vec<String> = Vec::new();
    let (mut index, mut after) = (0, None);
    let mut rewritten = false;
    for _ in 0..20 {
        let upto = w.core.seq();
        let view = w
            .core
            .changes_page(index, upto, &all(), &page(after.clone()));
        assert!(view.tasks.len() <= 3, "{view:?}");
        assert_eq!(view.head, upto);
        seen.extend(view.tasks.iter().map(|t| t.task_id.clone()));
        if !view.more {
            assert_eq!(view.index, upto);
            assert!(view.after.is_none());
            break;
        }
        assert!(view.index < upto);
        (index, after) = (view.index, view.after.clone());
        if !rewritten {
            // A task already shown is written again: it comes once more, later.
            w.run(&first[0]);
            rewritten = true;
        }
    }
    let mut unique = seen.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 12, "{seen:?}");
    assert_eq!(seen.len(), 13, "only the rewritten task twice: {seen:?}");
    assert_eq!(seen.iter().filter(|id| **id == first[0]).count(), 2);
    // The instance pages of a job walk it once, and filter by state.
    let job = "www/prod/p";
    let mut instances = Vec::new();
    let mut after = None;
    loop {
        let page = crate::core::InstancePage {
            after,
            limit: Some(2),
            state: None,
        };
        let view = w.core.job_view_page(job, &page).unwrap();
        assert_eq!(view.instance_count, 7);
        assert_eq!(view.config_counts.values().sum::<u32>(), 7);
        instances.extend(view.instances.iter().map(|i| i.instance));
        match view.next_after {
            Some(n) => after = Some(n),
            None => break,
        }
    }
    assert_eq!(instances, (0..7).collect::<Vec<u32>>());
    let running = crate::core::InstancePage {
        state: Some(TaskState::Running),
        ..Default::default()
    };
    let view = w.core.job_view_page(job, &running).unwrap();
    let numbers: Vec<u32> = view.instances.iter().map(|i| i.instance).collect();
    assert_eq!(numbers, vec![0]);
    assert!(!view.recent_events.is_empty() && view.recent_events.len() <= 50);
    let newest = view.recent_events[0].event.timestamp_ms;
    assert!(view
        .recent_events
        .iter()
        .all(|e| e.event.timestamp_ms <= newest));
}
