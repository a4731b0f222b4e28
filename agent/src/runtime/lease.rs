//! The exclusive lease and the last contact with the master, kept in files of the data
//! dir across restarts: what a restarted agent that cannot reach the master counts
//! the lease from.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::time::Duration;

use drover_common::state::now_ms;
use tokio::time::Instant;

use super::{lock, Shared};
use crate::outbox::write_atomic;

/// File in the data dir with the master's exclusive lease in ms, as last learned.
const MASTER_LEASE: &str = "master-lease";

pub(super) fn restore_last_contact(data_dir: &Path) -> Instant {
    let now = Instant::now();
    let saved: Option<u64> = std::fs::read_to_string(data_dir.join("last-contact"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    match saved {
        Some(ms) => {
            let ago = Duration::from_millis(now_ms().saturating_sub(ms));
            now.checked_sub(ago).unwrap_or(now)
        }
        None => now,
    }
}

/// The master's lease as last learned, if one was recorded.
pub(super) fn restore_lease(data_dir: &Path) -> Option<Duration> {
    std::fs::read_to_string(data_dir.join(MASTER_LEASE))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// The exclusive lease in force now.
pub(super) fn lease(shared: &Shared) -> Duration {
    Duration::from_millis(shared.lease_ms.load(Ordering::SeqCst))
}

/// Adopts the lease a registration answer carries (`None`: a master that does not
/// send one, so the configured `lease` applies) and records it for the next start,
/// so a restarted agent that cannot reach the master still counts the master's lease.
pub(super) fn learn_lease(shared: &Shared, from_master: Option<u64>) {
    let path = shared.cfg.data_dir.join(MASTER_LEASE);
    let saved = match from_master.filter(|ms| *ms > 0) {
        Some(ms) => {
            shared.lease_ms.store(ms, Ordering::SeqCst);
            write_atomic(&path, ms.to_string().as_bytes(), false)
        }
        None => {
            let ms = shared.cfg.lease.as_millis() as u64;
            shared.lease_ms.store(ms, Ordering::SeqCst);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    };
    if let Err(e) = saved {
        tracing::warn!(path = %path.display(), error = %e, "could not record the master's lease; a restart uses the configured lease until the master answers");
    }
}

/// Records a contact with the master as of `sent`, when the answered request left:
/// the master heard the agent no earlier than that, so the exclusive lease never
/// counts from later than the master's own clock does, even when a partition held
/// the answer back. The in-memory contact is exact; the file is rewritten only when
/// `contact_needs_recording` says so (see there for why a stale file is safe).
pub(super) fn record_contact(shared: &Shared, sent: Instant) {
    *lock(&shared.last_contact) = sent;
    let sent_ms = now_ms().saturating_sub(sent.elapsed().as_millis() as u64);
    {
        let mut recorded = lock(&shared.contact_recorded_ms);
        if !contact_needs_recording(*recorded, sent_ms) {
            return;
        }
        *recorded = sent_ms;
    }
    let path = shared.cfg.data_dir.join("last-contact");
    if let Err(e) = write_atomic(&path, sent_ms.to_string().as_bytes(), false) {
        tracing::warn!(error = %e, "could not record the last master contact");
    }
}

/// Most the recorded `last-contact` may lag behind the real last contact.
const CONTACT_RECORD_EVERY_MS: u64 = 1000;

/// Whether a contact at `sent_ms` must be written to `last-contact` when the file
/// holds `recorded_ms` (pure). Each rewrite is a temp file + rename, which creates
/// one inode and frees another, and answered requests come every heartbeat; so the
/// file is rewritten only once the contact moved on by `CONTACT_RECORD_EVERY_MS`.
/// The file is read only by a restarted agent, to keep counting the exclusive lease;
/// a recorded time that is older than the real one makes that agent count the
/// master as silent for longer, so it kills exclusive tasks at most that much
/// EARLIER, never later than the master replaces them: the safe side. A contact
/// that goes backwards (a clock step) is recorded at once, for the same reason.
fn contact_needs_recording(recorded_ms: u64, sent_ms: u64) -> bool {
    sent_ms < recorded_ms || sent_ms - recorded_ms >= CONTACT_RECORD_EVERY_MS
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_contact_is_rewritten_only_once_it_moved_on_or_went_back() {
        assert!(contact_needs_recording(0, 5_000));
        assert!(!contact_needs_recording(5_000, 5_000));
        assert!(!contact_needs_recording(5_000, 5_999));
        assert!(contact_needs_recording(5_000, 6_000));
        assert!(contact_needs_recording(5_000, 4_999), "a clock step back");
    }
}
