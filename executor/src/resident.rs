//! What the executor keeps resident while it supervises a task (docs/executor.md,
//! "Memory"): one malloc arena and, once the task has settled, the heap's free pages
//! handed back and the pages of the executor's own binary that only starting needed
//! unmapped again.
//!
//! An executor lives as long as its task, often months, while most of its code runs
//! once: parsing the task, building the sandbox and the cgroup, starting processes.
//! The kernel maps a file 64 KiB around each page fault and never unmaps a page
//! because it went unused, so without this a lone executor carries every page its
//! start touched. Unmapping read-only file pages is always safe: the next touch maps
//! them again from the page cache (or the disk), exactly as the first one did.

use std::sync::atomic::{AtomicBool, Ordering};

/// Environment variable: `0` keeps the startup pages mapped (for debuggers and
/// uprobes, whose breakpoints live in private copies of code pages that unmapping
/// drops; `executor/layout/profile.py` sets it).
pub const RELEASE_ENV: &str = "DROVER_EXECUTOR_RELEASE_STARTUP";

/// Unmaps the executor binary's read-only pages (code, read-only data, the dynamic
/// linker's tables) and trims the heap; what the settled task still runs is mapped
/// again on its first touch. Returns the bytes of address space released, 0 when
/// turned off by [`RELEASE_ENV`] or done before.
pub fn release_startup_pages() -> usize {
    static DONE: AtomicBool = AtomicBool::new(false);
    if std::env::var_os(RELEASE_ENV).is_some_and(|v| v == "0") || DONE.swap(true, Ordering::Relaxed)
    {
        return 0;
    }
    crate::sys::malloc_trim();
    crate::sys::release_read_only_segments()
}

/// One malloc arena for the whole executor: it is one thread but for the moment the
/// cgroup prewarm thread runs, and glibc would give that thread an arena of its own
/// (64 MiB reserved, about 20 KiB touched, kept).
pub fn single_malloc_arena() {
    crate::sys::single_malloc_arena();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{page_size, read_only_segments};

    #[test]
    fn finds_the_binarys_code_and_leaves_it_callable_after_release() {
        let segments = read_only_segments();
        let code =
            finds_the_binarys_code_and_leaves_it_callable_after_release as *const () as usize;
        assert!(
            segments.iter().any(|&(s, l)| (s..s + l).contains(&code)),
            "this test's code at {code:#x} is in none of {segments:x?}"
        );
        assert!(release_startup_pages() > 0);
        // Code, constants and formatting all come back from the file.
        assert_eq!(
            format!("{}-{}", "after", page_size() / page_size()),
            "after-1"
        );
        assert_eq!(release_startup_pages(), 0, "released only once");
    }
}
