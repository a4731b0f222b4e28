//! The pure part of systemd's service notification protocol (sd_notify(3)): when
//! the next `WATCHDOG=1` is due, and a `STATUS=` text made safe for the one-line
//! datagram field. The daemons' `systemd` modules do the sending.

use std::time::Duration;

/// Paces `WATCHDOG=1` pings: one every half of the service's `WatchdogSec=`
/// (WATCHDOG_USEC), as sd_watchdog_enabled(3) advises, counted on a monotonic
/// clock in milliseconds the caller reads. The caller asks from its main loop, so
/// a loop that stops turning stops the pings and systemd restarts the daemon.
#[derive(Clone, Debug)]
pub struct WatchdogPacer {
    every_ms: u64,
    next_ms: u64,
}

impl WatchdogPacer {
    /// A pacer for a watchdog of `timeout` (WATCHDOG_USEC), started (READY=1 or
    /// the last ping) at `now_ms`: the first ping is due one interval later. A
    /// timeout under 2 ms is treated as 2 ms.
    pub fn new(timeout: Duration, now_ms: u64) -> WatchdogPacer {
        let every_ms = (timeout.as_millis() as u64 / 2).max(1);
        WatchdogPacer {
            every_ms,
            next_ms: now_ms + every_ms,
        }
    }

    /// The interval between pings.
    pub fn every(&self) -> Duration {
        Duration::from_millis(self.every_ms)
    }

    /// Milliseconds from `now_ms` until the next ping is due (0: due now).
    pub fn until_due_ms(&self, now_ms: u64) -> u64 {
        self.next_ms.saturating_sub(now_ms)
    }

    /// True when a ping is due at `now_ms`; the next is then due one interval later.
    pub fn due(&mut self, now_ms: u64) -> bool {
        if now_ms < self.next_ms {
            return false;
        }
        self.next_ms = now_ms + self.every_ms;
        true
    }
}

/// `text` as one `STATUS=` value: control characters (a newline would start
/// another field of the datagram) become spaces, and it is cut to 200 bytes at a
/// character boundary (systemctl shows one line).
pub fn status_line(text: &str) -> String {
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if out.len() > 200 {
        let mut cut = 200;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out.truncate(cut);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_at_half_the_timeout() {
        let mut p = WatchdogPacer::new(Duration::from_secs(10), 1_000);
        assert_eq!(p.every(), Duration::from_secs(5));
        assert!(!p.due(1_000));
        assert_eq!(p.until_due_ms(2_000), 4_000);
        assert!(!p.due(5_999));
        assert!(p.due(6_000));
        assert!(!p.due(6_001));
        // A late loop pings once, then paces from then on.
        assert!(p.due(20_000));
        assert!(!p.due(20_001));
        assert_eq!(p.until_due_ms(20_000), 5_000);
    }

    #[test]
    fn a_tiny_timeout_still_paces() {
        let mut p = WatchdogPacer::new(Duration::from_micros(1), 0);
        assert!(!p.due(0));
        assert!(p.due(1));
        assert!(!p.due(1));
        assert!(p.due(2));
    }

    #[test]
    fn status_is_one_bounded_line() {
        assert_eq!(status_line("a\nb\tc"), "a b c");
        let long = "é".repeat(150);
        let s = status_line(&long);
        assert!(s.len() <= 200 && s.chars().all(|c| c == 'é'));
    }
}
