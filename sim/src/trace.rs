//! The trace of a run: every line hashed (a seed replays to the same hash) and the
//! last lines kept for a failure report.

use std::collections::VecDeque;

/// Lines of trace kept for a failure report.
const TAIL: usize = 40;

/// The trace of a run: a hash of every line and the last lines.
#[derive(Debug, Default)]
pub struct Trace {
    hash: u64,
    tail: VecDeque<String>,
    /// Print every line as it happens (`--trace`).
    pub print: bool,
}

impl Trace {
    /// Adds a line at true time `t`.
    pub fn line(&mut self, t: u64, text: String) {
        let line = format!("{t:>9} {text}");
        let mut h = if self.hash == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.hash
        };
        for b in line.bytes().chain(std::iter::once(b'\n')) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.hash = h;
        if self.print {
            println!("{line}");
        }
        if self.tail.len() == TAIL {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    /// The hash of every line so far.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The last lines, oldest first.
    pub fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }
}
