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

/// One malloc arena for the whole executor: it is one thread but for the moment the
/// cgroup prewarm thread runs, and glibc would give that thread an arena of its own
/// (64 MiB reserved, about 20 KiB touched, kept).
#[allow(unsafe_code)]
pub fn single_malloc_arena() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a malloc parameter; no thread exists yet.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Returns the heap's free pages to the kernel (glibc keeps them otherwise).
#[allow(unsafe_code)]
fn release_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases memory that malloc considers free.
    unsafe {
        libc::malloc_trim(0);
    }
}

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
    release_free_heap();
    read_only_segments()
        .into_iter()
        .map(|(start, len)| if dont_need(start, len) { len } else { 0 })
        .sum()
}

/// The page-aligned (address, length) of every loaded segment of the executor's
/// own binary that is mapped without write permission. The RELRO part of the data
/// (relocated, then made read-only) lies inside the writable segment, so it is never
/// among them: unmapping it would bring back unrelocated pointers.
#[allow(unsafe_code)]
fn read_only_segments() -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    // SAFETY: the callback only reads the program headers the loader passes it, for
    // the duration of the call, and writes to `out` through the pointer it is given.
    unsafe {
        libc::dl_iterate_phdr(Some(collect), (&raw mut out).cast());
    }
    out
}

/// `dl_iterate_phdr` callback: the first object is the main program; stop after it.
#[allow(unsafe_code)]
unsafe extern "C" fn collect(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: the loader passes a valid `dl_phdr_info` whose `dlpi_phdr` points at
    // `dlpi_phnum` headers, and `data` is the Vec given to `dl_iterate_phdr`.
    let (info, out) = unsafe { (&*info, &mut *data.cast::<Vec<(usize, usize)>>()) };
    let headers = if info.dlpi_phdr.is_null() {
        &[][..]
    } else {
        // SAFETY: as above.
        unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
    };
    let page = page_size();
    for h in headers {
        if h.p_type == libc::PT_LOAD && h.p_flags & libc::PF_W == 0 {
            let start = (info.dlpi_addr as usize + h.p_vaddr as usize) & !(page - 1);
            let end =
                (info.dlpi_addr as usize + (h.p_vaddr + h.p_memsz) as usize).div_ceil(page) * page;
            out.push((start, end - start));
        }
    }
    1
}

fn page_size() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as usize)
}

/// `madvise(MADV_DONTNEED)`: drops the range's page table entries; for a private
/// file mapping that was never written, the next access maps the file page again.
#[allow(unsafe_code)]
fn dont_need(start: usize, len: usize) -> bool {
    // SAFETY: the range is a read-only, never-written mapping of our own binary
    // (`read_only_segments`), so dropping its pages changes no memory contents.
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_DONTNEED) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

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
