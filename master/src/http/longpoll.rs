//! The wait every long poll of the admin API shares (`/v1/changes`,
//! `/v1/services`): read after each commit until the read says it has news, the
//! deadline passes, the master stops or its store fails.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::time::Duration;

use super::body::{query_u64, DEFAULT_WAIT_MS, MAX_WAIT_MS};
use super::error::{shutting_down, ApiErr};
use crate::runtime::{ApplyError, Master};

/// The `wait_ms` query parameter, defaulted and capped.
pub(super) fn wait_ms(q: &HashMap<String, String>) -> Result<u64, ApiErr> {
    Ok(query_u64(q, "wait_ms")?
        .unwrap_or(DEFAULT_WAIT_MS)
        .min(MAX_WAIT_MS))
}

/// Calls `read` with the committed index at once and after every commit:
/// `Break(answer)` answers now, `Continue(answer)` is answered only once
/// `wait_ms` has passed.
pub(super) async fn until_news<T>(
    m: &Master,
    wait_ms: u64,
    mut read: impl FnMut(u64) -> ControlFlow<T, T>,
) -> Result<T, ApiErr> {
    let deadline = tokio::time::Instant::now() + Duration::from_millis(wait_ms);
    let mut commits = m.commit_state().subscribe();
    let mut stopping = m.stopping();
    loop {
        if *stopping.borrow_and_update() {
            return Err(shutting_down(
                "ask again with the same index after it restarted",
            ));
        }
        if m.commit_state().failed() {
            return Err(ApplyError::StoreFailed.into());
        }
        commits.borrow_and_update();
        match read(m.commit_state().committed()) {
            ControlFlow::Break(answer) => return Ok(answer),
            ControlFlow::Continue(answer) if tokio::time::Instant::now() >= deadline => {
                return Ok(answer)
            }
            ControlFlow::Continue(_) => {}
        }
        tokio::select! {
            r = commits.changed() => {
                if r.is_err() {
                    return Err(ApplyError::StoreFailed.into());
                }
            }
            _ = tokio::time::sleep_until(deadline) => {}
            _ = stopping.changed() => {}
        }
    }
}
