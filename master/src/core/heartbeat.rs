//! Heartbeat scaling (pure): how often each agent is told to heartbeat so the whole
//! cell stays under `max_heartbeat_rate` heartbeats a second (as Nomad scales its
//! heartbeat TTL with the number of clients), and the timeouts that follow from that
//! interval: when a silent agent is declared lost, and how long it keeps its
//! `partition_policy.exclusive` tasks without reaching the master.
//!
//! With `n` live agents, rate `r` and the configured (minimum) interval `m`:
//!
//! - interval `I = max(m, ceil(n * 1000 / r))` ms;
//! - loss timeout `T(I) = agent_timeout + 2 * (I - m)`;
//! - exclusive lease `L(I) = exclusive_lease + 2 * (I - m)`.
//!
//! A small cell (`n <= r * m / 1000`, e.g. up to 100 agents at 100/s and 1 s) gets
//! exactly the configured interval and timeouts. A larger one stretches both
//! timeouts by twice the interval's growth: the configuration requires
//! `agent_timeout >= 2 * m`, so `T(I) >= 2 * I` and an agent still survives a lost
//! heartbeat, with the same absolute slack (`agent_timeout - 2 * m`) for delays as
//! the small cell; its exclusive lease keeps its margin to the loss timeout.

/// What one heartbeat answer tells an agent, durations in milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Told {
    /// How often the agent heartbeats.
    pub interval_ms: u64,
    /// Silent this long after a heartbeat, the agent is declared lost.
    pub loss_timeout_ms: u64,
    /// How long the agent keeps its exclusive tasks without reaching the master.
    pub exclusive_lease_ms: u64,
}

/// The configured values the scaling starts from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Base {
    /// Heartbeats a second for the whole cell, at most (0 is taken as 1).
    pub max_rate: u32,
    /// The configured `heartbeat_interval`: the shortest interval told.
    pub min_interval_ms: u64,
    /// The configured `agent_timeout`: the loss timeout at the shortest interval.
    pub agent_timeout_ms: u64,
    /// The configured `exclusive_lease`: the lease at the shortest interval.
    pub exclusive_lease_ms: u64,
}

/// What an agent is told when `live_agents` agents heartbeat.
pub fn told(base: Base, live_agents: usize) -> Told {
    let rate = u64::from(base.max_rate.max(1));
    let spread = (live_agents as u64).saturating_mul(1000).div_ceil(rate);
    let interval_ms = spread.max(base.min_interval_ms);
    let stretch = 2 * (interval_ms - base.min_interval_ms);
    Told {
        interval_ms,
        loss_timeout_ms: base.agent_timeout_ms.saturating_add(stretch),
        exclusive_lease_ms: base.exclusive_lease_ms.saturating_add(stretch),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Base = Base {
        max_rate: 100,
        min_interval_ms: 1_000,
        agent_timeout_ms: 15_000,
        exclusive_lease_ms: 10_000,
    };

    #[test]
    fn the_interval_spreads_the_cell_over_the_rate_and_timeouts_follow() {
        // (rate, live agents) -> (interval, loss timeout, exclusive lease)
        let table: &[(u32, usize, u64, u64, u64)] = &[
            (100, 0, 1_000, 15_000, 10_000),
            (100, 1, 1_000, 15_000, 10_000),
            (100, 10, 1_000, 15_000, 10_000),
            (100, 100, 1_000, 15_000, 10_000),
            (100, 101, 1_010, 15_020, 10_020),
            (100, 1_000, 10_000, 33_000, 28_000),
            (100, 10_000, 100_000, 213_000, 208_000),
            (1_000, 10_000, 10_000, 33_000, 28_000),
            (50, 10_000, 200_000, 413_000, 408_000),
            (3, 10, 3_334, 19_668, 14_668),
            (0, 2, 2_000, 17_000, 12_000),
        ];
        for &(max_rate, n, interval, loss, lease) in table {
            let got = told(Base { max_rate, ..BASE }, n);
            assert_eq!(
                got,
                Told {
                    interval_ms: interval,
                    loss_timeout_ms: loss,
                    exclusive_lease_ms: lease,
                },
                "rate {max_rate}, {n} agents"
            );
        }
    }

    #[test]
    fn the_cell_never_heartbeats_faster_than_the_rate_and_survives_a_lost_heartbeat() {
        for n in [1usize, 99, 100, 101, 777, 5_000, 10_000, 123_456] {
            let t = told(BASE, n);
            assert!(t.interval_ms >= BASE.min_interval_ms);
            // n agents, one heartbeat each per interval: at most the rate.
            assert!(
                n as u64 * 1000 <= u64::from(BASE.max_rate) * t.interval_ms,
                "{n}"
            );
            assert!(t.loss_timeout_ms >= 2 * t.interval_ms, "{n}");
            assert!(t.exclusive_lease_ms > t.interval_ms, "{n}");
        }
    }
}
