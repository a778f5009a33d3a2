//! What the kernel accounts to this process: memory (/proc/self/status) for the per-inode
//! cost, and CPU time, which other load on the machine does not inflate as it does wall time.

use std::time::Duration;

pub use ferrofs_lockstat::memory::{heap, peak_rss_bytes, rss_bytes};

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
    fn counts_cpu_time() {
        assert!(super::cpu_time() > std::time::Duration::ZERO);
    }
}
