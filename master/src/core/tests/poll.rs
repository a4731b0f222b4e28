//! The assignment long poll's step: answer only what is committed, wait otherwise.

use super::*;

#[test]
fn a_poll_with_an_uncommitted_change_to_answer_waits_for_the_commit() {
    // The agent is at version 5; version 6 (batch 10) wakes it, then a task it
    // reported ending made version 7 (batch 11) without waking it.
    let step = |committed, timed_out| poll_step(Some(5), 7, 6, 11, committed, timed_out);
    assert_eq!(step(10, false), PollStep::Wait { on_commit: true });
    assert_eq!(step(11, false), PollStep::Answer);
    assert_eq!(step(10, true), PollStep::Wait { on_commit: true });
}

#[test]
fn a_poll_that_saw_every_waking_change_waits_for_the_next_or_its_deadline() {
    // At the notified version; only an ending left the set since.
    assert_eq!(
        poll_step(Some(6), 7, 6, 11, 11, false),
        PollStep::Wait { on_commit: false }
    );
    assert_eq!(poll_step(Some(6), 7, 6, 11, 11, true), PollStep::Answer);
    assert_eq!(poll_step(None, 7, 6, 11, 11, false), PollStep::Answer);
    // A version from the future (a restarted master) is answered at once.
    assert_eq!(poll_step(Some(9), 7, 6, 11, 11, false), PollStep::Answer);
}
