//! The failover rules of masters on etcd, pure: what a master sees (is its lease
//! surely alive, does it lead, who leads, is a copy of the state loaded, what a
//! request asks) in, what it does (serve, forward to the leader, answer from the
//! copy, refuse, step down) out. No etcd, no HTTP, no clock: the callers read
//! those and carry the decision out (`leader`: election, lease and the gate;
//! `proxy`: forwarding; `standby`: the copy). The table tests below are the
//! rules' specification.

use std::time::Duration;

use crate::runtime::RunError;
use crate::store::StoreError;

/// The election's name (its keys are `/drover-election/<lease id>`).
pub const ELECTION: &str = "/drover-election/";
/// The response header naming the leader's URL on a standby's refusals.
pub use drover_common::wire::LEADER_HEADER;

/// How often a standby looks whether the store moved (at the most).
pub const FOLLOW_INTERVAL: Duration = Duration::from_millis(500);
/// How long a forwarded request may take (long polls: their wait on top).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a forwarded long poll (a query with `wait_ms`) may take.
pub const LONG_POLL_TIMEOUT: Duration = Duration::from_secs(130);

// ---- the lease ----

/// A keep-alive sent at `sent` (monotonic ms) was answered: the lease lives at
/// least until `sent + ttl` at etcd; a leader serves until three quarters of
/// that, so a paused master that wakes up refuses before etcd lets it go.
pub fn serve_until(sent: u64, ttl_ms: u64) -> u64 {
    sent + ttl_ms * 3 / 4
}

/// Whether a master serves now: it leads, and its lease is surely alive.
pub fn may_serve(leading: bool, now: u64, valid_until: u64) -> bool {
    leading && now < valid_until
}

/// How often the lease is kept alive: every third of its TTL (at least 100 ms).
pub fn keep_alive_period(ttl_ms: u64) -> Duration {
    Duration::from_millis((ttl_ms / 3).max(100))
}

/// How one keep-alive round went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    /// etcd answered with a TTL left.
    Answered,
    /// etcd answered that the lease expired.
    Expired,
    /// No answer in time (or the stream broke).
    NoAnswer,
}

/// What the keeper does after a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Move the serving deadline on (`serve_until` of the round's send time).
    Renew,
    /// Keep trying: the lease may still be alive.
    Retry,
    /// The lease expired at etcd: stop leading.
    Expired,
    /// Not renewed before it may have expired: stop leading.
    TooLate,
}

/// The keeper's decision after `round`, at `now`, with the serving deadline
/// `valid_until`.
pub fn after_round(round: Round, now: u64, valid_until: u64) -> Keep {
    match round {
        Round::Answered => Keep::Renew,
        Round::Expired => Keep::Expired,
        Round::NoAnswer if now >= valid_until => Keep::TooLate,
        Round::NoAnswer => Keep::Retry,
    }
}

// ---- the gate in front of every request ----

/// The first decision on a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gate {
    /// `/health`: answered from the election by every master.
    Health,
    /// This master leads with a live lease: its own router answers.
    Serve,
    /// Not serving: see `standby_route`.
    Standby,
}

/// Whether a request to `path` is answered from the election, served, or left to
/// the standby's rules.
pub fn gate(path: &str, may_serve: bool) -> Gate {
    if path == "/health" {
        Gate::Health
    } else if may_serve {
        Gate::Serve
    } else {
        Gate::Standby
    }
}

/// What a master that does not serve sees of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing<'a> {
    /// The leader's URL when known and not this master's own.
    pub leader: Option<&'a str>,
    /// The request may be forwarded (`forwardable`).
    pub forwardable: bool,
    /// A copy is loaded and the request is a read it may answer (`copy_may_answer`).
    pub copy_answers: bool,
}

/// What a master that does not serve does with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standby<'a> {
    /// Forward to `leader`; should it give no answer, answer from the copy when
    /// `then_copy`, else with the forwarding's failure.
    Forward { leader: &'a str, then_copy: bool },
    /// Answer from the copy (refuse should it have gone meanwhile).
    FromCopy,
    /// 503 `not_leader` with the leader's URL when known.
    Refuse,
}

/// The standby's decision: forward when a leader is known and the request may go
/// there, else the copy for a read that accepts it, else refuse.
pub fn standby_route(seen: Standing<'_>) -> Standby<'_> {
    match seen.leader {
        Some(leader) if seen.forwardable => Standby::Forward {
            leader,
            then_copy: seen.copy_answers,
        },
        _ if seen.copy_answers => Standby::FromCopy,
        _ => Standby::Refuse,
    }
}

/// The leader a standby names: the one it saw, unless that is itself (its own
/// lease not yet surely alive, or already lost).
pub fn other_leader<'a>(leader: Option<&'a str>, me: &str) -> Option<&'a str> {
    leader.filter(|l| *l != me)
}

/// The message of a standby's 503 `not_leader`.
pub fn refusal_message(leader: Option<&str>) -> String {
    match leader {
        Some(l) => format!(
            "this master does not lead; the leader is {l}: send writes and agent traffic there"
        ),
        None => {
            "this master does not lead and no leader is elected yet; retry in a moment".to_string()
        }
    }
}

// ---- which requests go where ----

/// The agent API's paths (register, heartbeat, assignments, updates, drain).
pub fn is_agent_traffic(path: &str) -> bool {
    if path == "/v1/agents/register" {
        return true;
    }
    let Some(rest) = path.strip_prefix("/v1/agents/") else {
        return false;
    };
    matches!(
        rest.split_once('/'),
        Some((_, "heartbeat" | "assignments" | "updates" | "drain"))
    )
}

/// Whether `path` is of the admin API or the web UI (not agent traffic, not
/// `/metrics`).
pub fn forwardable_path(path: &str) -> bool {
    !(is_agent_traffic(path) || path == "/metrics")
}

/// Whether a standby forwards a request to `path` to the leader: the admin API
/// and the web UI, unless another master forwarded it already (`proxied`: two
/// standbys with stale views never bounce a request between them).
pub fn forwardable(path: &str, proxied: bool) -> bool {
    forwardable_path(path) && !proxied
}

/// `/v1/tasks/{id}/logs/...`: a task's logs, read from its agent.
pub fn is_task_log(path: &str) -> bool {
    path.strip_prefix("/v1/tasks/")
        .and_then(|rest| rest.split('/').nth(1))
        == Some("logs")
}

/// Whether the copy may answer a request: a read (`GET`/`HEAD`: `read`) of the
/// admin API or the web UI that accepts a stale answer (`stale_ok`), not agent
/// traffic, not `/metrics` (each master's own) and not a task's logs (read from
/// the agent with keys the leader holds).
pub fn copy_may_answer(read: bool, path: &str, stale_ok: bool) -> bool {
    stale_ok && read && forwardable_path(path) && !is_task_log(path)
}

/// How long a forwarded request may take: a long poll (`wait_ms` in the query)
/// its wait on top.
pub fn forward_timeout(query: Option<&str>) -> Duration {
    if query.is_some_and(|q| q.contains("wait_ms")) {
        LONG_POLL_TIMEOUT
    } else {
        REQUEST_TIMEOUT
    }
}

/// How forwarding to the leader failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Failure {
    /// The leader could not be reached: nothing was sent.
    Unreachable,
    /// The leader took the request and gave no answer.
    NoAnswer,
    /// The leader began answering and stopped.
    StoppedAnswering,
}

/// What a standby tells the client when forwarding failed: whether it is safe
/// to retry (503 `not_leader`: nothing was sent) or the request may or may not
/// have been done (502 `leader_lost`). `(status, code, message)`.
pub fn failure_answer(
    failure: Failure,
    leader: &str,
    error: &str,
) -> (axum::http::StatusCode, &'static str, String) {
    use axum::http::StatusCode;
    match failure {
        Failure::Unreachable => (
            StatusCode::SERVICE_UNAVAILABLE,
            "not_leader",
            format!("this master does not lead and cannot reach the leader {leader} ({error}); retry in a moment"),
        ),
        Failure::NoAnswer => (
            StatusCode::BAD_GATEWAY,
            "leader_lost",
            format!("the leader {leader} took the request but did not answer ({error}): it may or may not have been done; check before retrying"),
        ),
        Failure::StoppedAnswering => (
            StatusCode::BAD_GATEWAY,
            "leader_lost",
            format!("the leader {leader} stopped answering ({error}): the request may or may not have been done; check before retrying"),
        ),
    }
}

// ---- the copy ----

/// Whether the copy read at etcd revision `have` is still current at `now`
/// (then it is not read again).
pub fn copy_is_current(have: Option<i64>, now: i64) -> bool {
    have == Some(now)
}

/// The pause before a standby looks at the store again, after a read that took
/// `took`: a slow read (a large store) is not repeated back to back.
pub fn follow_pause(took: Duration) -> Duration {
    FOLLOW_INTERVAL.max(took * 4)
}

// ---- terms ----

/// How one term of a master ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Term {
    /// Asked to stop.
    Shutdown,
    /// No longer leading (or never elected): a standby again, campaigning.
    SteppedDown,
}

/// What an elected master was loading when it failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Loading {
    /// The store (jobs, tasks, agents).
    Store,
    /// The token registry and the audit log's writer.
    Tokens,
}

/// Whether an elected master that failed to load steps down and campaigns again
/// (deposed meanwhile, or etcd unavailable) rather than exit.
pub fn steps_down_on(loading: Loading, error: &RunError) -> bool {
    match loading {
        Loading::Store => matches!(
            error,
            RunError::Store(StoreError::Fenced | StoreError::Etcd { .. })
        ),
        Loading::Tokens => matches!(error, RunError::Tokens(_)),
    }
}

/// How a term ended without an election (`stopped`: asked to stop).
pub fn unelected(stopped: bool) -> Term {
    if stopped {
        Term::Shutdown
    } else {
        Term::SteppedDown
    }
}

/// How a leader's term ended once it stopped serving: asked to stop, it reports
/// how serving went; otherwise (the lease lost, a fenced write failed) it steps
/// down, unless serving failed for another cause.
pub fn after_leading(stopped: bool, served: Result<(), RunError>) -> Result<Term, RunError> {
    if stopped {
        return served.map(|()| Term::Shutdown);
    }
    match served {
        Ok(()) | Err(RunError::StoreFailed) => Ok(Term::SteppedDown),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_serves_only_while_its_lease_is_surely_alive() {
        // (leading, now, valid_until, serves)
        let table = [
            (true, 0, 7_500, true),
            (true, 7_499, 7_500, true),
            (true, 7_500, 7_500, false),
            (true, 9_000, 7_500, false),
            (false, 0, 7_500, false),
            (true, 0, 0, false),
        ];
        for (leading, now, until, serves) in table {
            assert_eq!(
                may_serve(leading, now, until),
                serves,
                "{leading} {now} {until}"
            );
        }
        assert_eq!(serve_until(1_000, 10_000), 8_500);
        assert_eq!(keep_alive_period(9_000), Duration::from_millis(3_000));
        assert_eq!(keep_alive_period(120), Duration::from_millis(100));
    }

    #[test]
    fn the_keeper_gives_up_when_the_lease_expired_or_may_have() {
        // (round, now, valid_until, decision)
        let table = [
            (Round::Answered, 100, 50, Keep::Renew),
            (Round::Expired, 10, 50, Keep::Expired),
            (Round::NoAnswer, 10, 50, Keep::Retry),
            (Round::NoAnswer, 50, 50, Keep::TooLate),
            (Round::NoAnswer, 90, 50, Keep::TooLate),
        ];
        for (round, now, until, keep) in table {
            assert_eq!(after_round(round, now, until), keep, "{round:?} {now}");
        }
    }

    #[test]
    fn health_is_always_answered_and_a_live_leader_serves_the_rest() {
        // (path, may_serve, gate)
        let table = [
            ("/health", true, Gate::Health),
            ("/health", false, Gate::Health),
            ("/v1/jobs", true, Gate::Serve),
            ("/v1/agents/register", true, Gate::Serve),
            ("/v1/jobs", false, Gate::Standby),
            ("/metrics", false, Gate::Standby),
        ];
        for (path, serving, decision) in table {
            assert_eq!(gate(path, serving), decision, "{path} {serving}");
        }
    }

    #[test]
    fn a_standby_forwards_then_answers_from_its_copy_then_refuses() {
        let l = Some("http://m1");
        // (leader, forwardable, copy answers, decision)
        let table = [
            (
                l,
                true,
                true,
                Standby::Forward {
                    leader: "http://m1",
                    then_copy: true,
                },
            ),
            (
                l,
                true,
                false,
                Standby::Forward {
                    leader: "http://m1",
                    then_copy: false,
                },
            ),
            (l, false, true, Standby::FromCopy),
            (l, false, false, Standby::Refuse),
            (None, true, true, Standby::FromCopy),
            (None, true, false, Standby::Refuse),
            (None, false, false, Standby::Refuse),
        ];
        for (leader, forwardable, copy_answers, decision) in table {
            let seen = Standing {
                leader,
                forwardable,
                copy_answers,
            };
            assert_eq!(standby_route(seen), decision, "{seen:?}");
        }
        assert_eq!(other_leader(Some("http://me"), "http://me"), None);
        assert_eq!(other_leader(Some("http://m1"), "http://me"), l);
        assert!(refusal_message(l).contains("the leader is http://m1"));
        assert!(refusal_message(None).contains("no leader is elected yet"));
    }

    #[test]
    fn requests_are_sorted_into_admin_agent_and_copy_readable() {
        // (path, agent traffic, forwardable, readable from the copy as a stale GET)
        let table = [
            ("/v1/jobs", false, true, true),
            ("/v1/agents", false, true, true),
            ("/v1/agents/a1/forbid", false, true, true),
            ("/ui/", false, true, true),
            ("/v1/agents/register", true, false, false),
            ("/v1/agents/a1/heartbeat", true, false, false),
            ("/v1/agents/a1/assignments", true, false, false),
            ("/v1/agents/a1/updates", true, false, false),
            ("/v1/agents/a1/drain", true, false, false),
            ("/metrics", false, false, false),
            ("/v1/tasks/t1/logs", false, true, false),
            ("/v1/tasks/t1/logs/main/stdout", false, true, false),
        ];
        for (path, agent, forward, readable) in table {
            assert_eq!(is_agent_traffic(path), agent, "{path}");
            assert_eq!(forwardable(path, false), forward, "{path}");
            assert!(!forwardable(path, true), "{path}: forwarded once already");
            assert_eq!(copy_may_answer(true, path, true), readable, "{path}");
            assert!(!copy_may_answer(false, path, true), "{path}: a write");
            assert!(!copy_may_answer(true, path, false), "{path}: consistent");
        }
    }

    #[test]
    fn forwarding_failures_say_whether_a_retry_is_safe() {
        let table = [
            (Failure::Unreachable, 503, "not_leader"),
            (Failure::NoAnswer, 502, "leader_lost"),
            (Failure::StoppedAnswering, 502, "leader_lost"),
        ];
        for (failure, status, code) in table {
            let (s, c, message) = failure_answer(failure, "http://m1", "reset");
            assert_eq!((s.as_u16(), c), (status, code), "{failure:?}");
            assert!(message.contains("http://m1") && message.contains("reset"));
        }
        assert_eq!(forward_timeout(None), REQUEST_TIMEOUT);
        assert_eq!(forward_timeout(Some("role=www")), REQUEST_TIMEOUT);
        assert_eq!(
            forward_timeout(Some("after=3&wait_ms=60000")),
            LONG_POLL_TIMEOUT
        );
    }

    #[test]
    fn the_copy_is_read_again_only_when_the_store_moved() {
        assert!(copy_is_current(Some(7), 7));
        assert!(!copy_is_current(Some(7), 8));
        assert!(!copy_is_current(None, 7));
        assert_eq!(follow_pause(Duration::from_millis(10)), FOLLOW_INTERVAL);
        assert_eq!(
            follow_pause(Duration::from_millis(300)),
            Duration::from_millis(1_200)
        );
    }

    #[test]
    fn a_term_steps_down_on_what_a_new_election_may_cure() {
        let fenced = || RunError::Store(StoreError::Fenced);
        let etcd = || {
            RunError::Store(StoreError::Etcd {
                op: "load",
                message: "unavailable".into(),
            })
        };
        // (loading, error, steps down)
        let table = [
            (Loading::Store, fenced(), true),
            (Loading::Store, etcd(), true),
            (Loading::Store, RunError::StoreFailed, false),
            (Loading::Tokens, fenced(), false),
            (Loading::Tokens, RunError::StoreFailed, false),
        ];
        for (loading, error, down) in table {
            assert_eq!(steps_down_on(loading, &error), down, "{loading:?} {error}");
        }
        assert_eq!(unelected(true), Term::Shutdown);
        assert_eq!(unelected(false), Term::SteppedDown);
        // (stopped, served, term)
        assert_eq!(after_leading(true, Ok(())).ok(), Some(Term::Shutdown));
        assert!(after_leading(true, Err(RunError::StoreFailed)).is_err());
        assert_eq!(after_leading(false, Ok(())).ok(), Some(Term::SteppedDown));
        assert_eq!(
            after_leading(false, Err(RunError::StoreFailed)).ok(),
            Some(Term::SteppedDown)
        );
        assert!(after_leading(false, Err(fenced())).is_err());
    }
}
