//! The time an event happens at, on the two clocks the core keeps apart: the
//! monotonic one for every timeout and deadline, the wall clock for what people read
//! (event timestamps, `created_ms`, last heartbeat shown by the API).

use drover_common::state::{MonoMillis, UnixMillis};

/// When an event happens. `mono` measures every duration (agent timeout, grace
/// periods, transient-state timeout, THROTTLED penalties, leases, backoff) and
/// orders the timers; `wall` is only stamped on what people read. A wall clock step
/// therefore changes timestamps, never a decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Now {
    /// The monotonic clock ([`drover_common::state::mono_ms`] in the runtime).
    pub mono: MonoMillis,
    /// The wall clock ([`drover_common::state::now_ms`] in the runtime).
    pub wall: UnixMillis,
}

impl Now {
    /// Both clocks reading `ms` (benches and tests that need no clock step).
    pub fn both(ms: u64) -> Now {
        Now { mono: ms, wall: ms }
    }

    /// The wall clock time of monotonic instant `mono`, as the wall clock reads now
    /// (for showing a deadline or a past instant to people).
    pub fn wall_of(&self, mono: MonoMillis) -> UnixMillis {
        if mono >= self.mono {
            self.wall.saturating_add(mono - self.mono)
        } else {
            self.wall.saturating_sub(self.mono - mono)
        }
    }

    /// The monotonic instant that the wall clock time `wall` corresponds to, as the
    /// wall clock reads now, with the distance from now capped at `cap` either way
    /// (stored wall times re-derived at load: a step of the wall clock while the
    /// master was down moves them by at most `cap`).
    pub fn mono_of(&self, wall: UnixMillis, cap: u64) -> MonoMillis {
        if wall >= self.wall {
            self.mono.saturating_add((wall - self.wall).min(cap))
        } else {
            self.mono.saturating_sub((self.wall - wall).min(cap))
        }
    }
}
