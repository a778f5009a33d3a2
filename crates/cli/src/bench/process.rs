//! What the kernel accounts to this process: memory (/proc/self/status) for the per-inode
//! cost, and CPU time, which other load on the machine does not inflate as it does wall time.

use std::time::Duration;

/// Resident set size now, in bytes (0 where /proc is unavailable).
pub fn rss_bytes() -> u64 {
    status_kib("VmRSS:") * 1024
}

/// Peak resident set size of the process, in bytes.
pub fn peak_rss_bytes() -> u64 {
    status_kib("VmHWM:") * 1024
}

fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// User plus system CPU time of all the process's threads so far.
pub fn cpu_time() -> Duration {
    // SAFETY: rusage is plain integers, for which all-zero bytes are a valid value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given and keeps no pointer to it.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Duration::ZERO;
    }
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

/// Heap bytes in use: allocated and not yet freed, over all of malloc's arenas (what the
/// program holds, without the allocator's free lists or fragmentation that RSS includes).
pub fn heap_bytes() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's statistics and returns them by value.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) as u64
}

/// Time the calling thread has spent runnable but waiting for a CPU (the scheduler's run
/// queue), from /proc/thread-self/schedstat; zero where that is unavailable.
pub fn thread_run_delay() -> Duration {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let ns = text.split_whitespace().nth(1).and_then(|v| v.parse().ok());
    Duration::from_nanos(ns.unwrap_or(0))
}

/// Hand freed heap back to the kernel, so RSS growth measured next counts new memory only
/// (not memory that earlier phases freed and the allocator kept).
pub fn release_free_heap() {
    // SAFETY: malloc_trim only walks the allocator's own free lists.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_status() {
        // Each field is read on its own, and the kernel's per-thread RSS counters are folded
        // in lazily, so no order between the two readings is asserted: only that both parse.
        assert!(super::rss_bytes() > 0);
        assert!(super::peak_rss_bytes() > 0);
        assert!(super::cpu_time() > std::time::Duration::ZERO);
    }
}
