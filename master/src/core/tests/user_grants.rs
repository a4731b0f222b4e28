//! Who a role's tasks may run as: the rule, every operator path refusing an
//! ungranted user, a revoked user's job running on flagged, grants across a restart.

use std::collections::BTreeSet;

use super::*;

const KEY: &str = "www/prod/app";

fn as_user(name: &str, instances: u32, user: Option<&str>, extra: &str) -> JobSpec {
    let mut s = spec(name, instances, true, extra);
    s.task.user = user.map(str::to_string);
    s
}

fn cron_as(name: &str, user: &str) -> JobSpec {
    let mut s = spec(name, 1, false, r#","cron_schedule":"0 0 1 1 *""#);
    s.task.user = Some(user.to_string());
    s
}

fn grant(w: &mut World, user: &str, granted: bool) -> wire::RoleView {
    let r = w
        .handle(Event::SetUserGrant {
            role: "www".into(),
            user: user.into(),
            granted,
        })
        .reply
        .unwrap();
    match r {
        Reply::Role(v) => v,
        r => panic!("{r:?}"),
    }
}

fn refused(out: Output) -> String {
    let err = out.reply.unwrap_err();
    assert!(
        matches!(&err, CoreError::UserNotGranted { role, user } if role == "www" && user == "daemon"),
        "{err:?}"
    );
    err.to_string()
}

fn update_to(w: &mut World, s: JobSpec) -> Output {
    w.handle(Event::StartUpdate {
        job: KEY.into(),
        spec: Box::new(s),
        instances: None,
        user: "alice".into(),
    })
}

#[test]
fn a_role_runs_as_its_own_user_and_as_granted_users_only() {
    let granted: BTreeSet<String> = ["backup".to_string()].into();
    assert!(may_run_as("www", "www", None));
    assert!(!may_run_as("www", "daemon", None));
    assert!(!may_run_as("www", "daemon", Some(&granted)));
    assert!(may_run_as("www", "backup", Some(&granted)));
    // Root is a user like any other here (its own gates are elsewhere).
    assert!(!may_run_as("www", "root", Some(&granted)));
    let mut grants = UserGrants::new();
    let s = as_user("app", 1, Some("daemon"), "");
    let msg = check_user(&s, &grants).unwrap_err().to_string();
    for part in [
        "task.user `daemon`",
        "role www",
        "drover role grant-user www daemon",
    ] {
        assert!(msg.contains(part), "{msg}");
    }
    assert!(check_user(&as_user("app", 1, None, ""), &grants).is_ok());
    assert!(check_user(&as_user("app", 1, Some("www"), ""), &grants).is_ok());
    grants.insert("www".into(), ["daemon".to_string()].into());
    assert!(check_user(&s, &grants).is_ok());
    // A grant is the role's: another role's job is not helped by it.
    let mut other = s.clone();
    other.role = "db".into();
    assert!(check_user(&other, &grants).is_err());
}

#[test]
fn create_update_and_cron_templates_need_the_user_granted() {
    let mut w = World::new();
    w.register("a1", 16.0, 64, &[]);
    let daemon = as_user("app", 1, Some("daemon"), "");
    refused(w.handle(Event::CreateJob(Box::new(daemon.clone()))));
    let cron = cron_as("tick", "daemon");
    refused(w.handle(Event::CreateJob(Box::new(cron.clone()))));
    assert!(w.core.jobs.is_empty(), "nothing was created");
    // An update of a job of the role's own user onto another user.
    let t = w.create(as_user("app", 1, None, ""));
    w.run(&t[0]);
    refused(update_to(&mut w, daemon.clone()));
    let v = grant(&mut w, "daemon", true);
    assert_eq!(v.granted_users, vec!["daemon".to_string()]);
    assert!(update_to(&mut w, daemon).reply.is_ok());
    w.create(cron);
    assert!(w
        .persisted
        .iter()
        .any(|c| matches!(c, Change::PutUserGrants(r, u) if r == "www" && u.contains("daemon"))));
}

#[test]
fn a_revoked_users_job_runs_on_flagged_and_operator_paths_are_refused() {
    let mut w = World::new();
    w.register("a1", 16.0, 64, &[]);
    w.register("a2", 16.0, 64, &[]);
    grant(&mut w, "daemon", true);
    let t = w.create(as_user("app", 2, Some("daemon"), ""));
    for id in &t {
        w.run(id);
    }
    w.create(cron_as("tick", "daemon"));
    assert_eq!(w.core.ungranted_user(KEY), None);
    assert_eq!(w.core.metrics_state().jobs_ungranted_user, 0);

    let v = grant(&mut w, "daemon", false);
    assert!(v.granted_users.is_empty());
    assert_eq!(
        v.ungranted_jobs,
        vec![KEY.to_string(), "www/prod/tick".into()]
    );
    assert!(w
        .persisted
        .iter()
        .any(|c| matches!(c, Change::PutUserGrants(r, u) if r == "www" && u.is_empty())));
    // Not killed: running, desired running, and replaced after a failure.
    w.pass(2_000);
    for id in &t {
        assert_eq!(w.state(id), TaskState::Running);
    }
    assert_eq!(w.core.ungranted_user(KEY).as_deref(), Some("daemon"));
    assert_eq!(
        w.core.job_view(KEY).unwrap().ungranted_user.as_deref(),
        Some("daemon")
    );
    assert_eq!(w.core.metrics_state().jobs_ungranted_user, 2);

    // Its next update is refused, even onto the role's own user: a rollback would
    // put the revoked user's config back.
    let msg = refused(update_to(&mut w, as_user("app", 2, None, "")));
    assert!(msg.contains("drover role grant-user www daemon"), "{msg}");
    refused(w.handle(Event::Restart {
        job: KEY.into(),
        instances: None,
    }));
    refused(w.handle(Event::CronStart {
        job: "www/prod/tick".into(),
    }));
    for id in &t {
        assert_eq!(w.state(id), TaskState::Running, "a refusal changes nothing");
    }
    // A kill is not refused; a job whose tasks all ended is no longer flagged.
    w.handle(Event::Kill {
        job: KEY.into(),
        instances: None,
    })
    .reply
    .unwrap();
    for id in &t {
        w.report(id, TaskState::Killed, None);
    }
    assert_eq!(w.core.ungranted_user(KEY), None);
    assert_eq!(
        w.core.metrics_state().jobs_ungranted_user,
        1,
        "the cron template"
    );
}

#[test]
fn a_rollback_or_resume_onto_a_revoked_user_is_refused() {
    let mut w = World::new();
    w.register("a1", 16.0, 64, &[]);
    w.register("a2", 16.0, 64, &[]);
    grant(&mut w, "daemon", true);
    let t = w.create(as_user("app", 2, Some("daemon"), ""));
    for id in &t {
        w.run(id);
    }
    let mut next = as_user("app", 2, None, "");
    next.task.processes[0].cmdline = "sleep 200".into();
    update_to(&mut w, next).reply.unwrap();
    w.handle(Event::UpdateAction {
        job: KEY.into(),
        action: UpdateAction::Pause,
    })
    .reply
    .unwrap();
    grant(&mut w, "daemon", false);
    refused(w.handle(Event::UpdateAction {
        job: KEY.into(),
        action: UpdateAction::Rollback,
    }));
    // Resuming forward goes onto the role's own user: allowed.
    w.handle(Event::UpdateAction {
        job: KEY.into(),
        action: UpdateAction::Resume,
    })
    .reply
    .unwrap();
}

#[test]
fn grants_survive_a_master_restart() {
    let mut w = World::new();
    grant(&mut w, "daemon", true);
    grant(&mut w, "backup", true);
    grant(&mut w, "backup", false);
    let snap = w.snapshot();
    w.core = Core::load(cfg(), snap, w.at(), 3);
    assert_eq!(
        w.core.role_view("www").granted_users,
        vec!["daemon".to_string()]
    );
    assert!(w.core.role_view("db").granted_users.is_empty());
}
