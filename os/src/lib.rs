//! drover-os: the few operating-system calls that more than one Drover process
//! makes, written once. `drover-common` does no I/O (a test checks its dependency
//! tree), so what the master, the agent and the CLI share beyond vocabulary lives
//! here, kept small: a file only its owner reads, and systemd's notifications.

pub mod fs;
pub mod systemd;
