//! Following the master's change stream (`GET /v1/changes`, a long poll from an
//! index): `job create --wait`, `job status --watch` and `host drain --wait` wake
//! when a change commits instead of polling on a timer.

use std::time::{Duration, Instant};

use drover_common::spec::JobKey;

use crate::client::Client;

/// The longest single long poll (the master's own cap is 120 s).
const MAX_WAIT: Duration = Duration::from_secs(30);

/// A position in the change stream, of one job's changes or of everything the token
/// may see.
pub struct Changes<'a> {
    client: &'a Client,
    job: Option<&'a JobKey>,
    /// The last index seen.
    index: u64,
}

impl<'a> Changes<'a> {
    /// Learns the master's current index (answered at once). Read the state after
    /// this: a change committed in between wakes the first `next` rather than being
    /// missed.
    pub async fn start(client: &'a Client, job: Option<&'a JobKey>) -> anyhow::Result<Changes<'a>> {
        let answer = client.changes(0, job, Duration::ZERO).await?;
        Ok(Changes {
            client,
            job,
            index: answer.index,
        })
    }

    /// True once something was committed after the last index seen; false when
    /// `within` passed without a change.
    pub async fn next(&mut self, within: Duration) -> anyhow::Result<bool> {
        let deadline = Instant::now() + within;
        loop {
            let wait = deadline.saturating_duration_since(Instant::now());
            let answer = self
                .client
                .changes(self.index, self.job, wait.min(MAX_WAIT))
                .await?;
            self.index = answer.index;
            if !answer.tasks.is_empty()
                || !answer.agents.is_empty()
                || !answer.updates.is_empty()
                || answer.reset
            {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
        }
    }
}
