//! The process's memory as the kernel and the allocator count it: what a program's own
//! estimate of its caches is checked against (in ferrofs: the cache budget, by a running
//! mount's control socket and by the benchmarks).

/// Resident set size now, in bytes, from `/proc/self/statm` (one short line: cheap enough
/// for a budget that bounds its process to sample); 0 where /proc is unavailable.
pub fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm.split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    // SAFETY: sysconf only reads a constant of the system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page).unwrap_or(0)
}

/// Peak resident set size of the process, in bytes (`VmHWM`, which only `/proc/self/status`
/// has); 0 where /proc is unavailable.
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// What malloc holds, over all of its arenas, in bytes.
#[derive(Clone, Copy, Debug)]
pub struct Heap {
    /// Allocated and not yet freed: what the program holds, without the allocator's free
    /// lists or fragmentation that RSS includes. Allocations count whole, touched or not: a
    /// FUSE worker's 16 MiB request buffer counts in full though metadata requests touch a
    /// page or two of it, so this can exceed RSS.
    pub in_use: u64,
    /// Of `in_use`, the chunks mapped on their own: allocations above malloc's mmap
    /// threshold, which starts at 128 KiB and rises (up to 32 MiB) to the size of a mapped
    /// chunk freed, so a large buffer may be mapped in one process and in the heap in the next.
    pub mapped: u64,
    /// Freed by the program but kept in the arenas.
    pub free: u64,
}

/// One reading of malloc's statistics. It takes every arena's lock in turn and walks their
/// free lists: not for a hot path.
pub fn heap() -> Heap {
    // SAFETY: mallinfo2 only reads the allocator's statistics and returns them by value.
    let m = unsafe { libc::mallinfo2() };
    Heap { in_use: (m.uordblks + m.hblkhd) as u64, mapped: m.hblkhd as u64, free: m.fordblks as u64 }
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_memory() {
        // Each figure is read on its own, and the kernel's per-thread RSS counters are folded
        // in lazily, so no order between the two readings is asserted: only that both parse.
        assert!(super::rss_bytes() > 0);
        assert!(super::peak_rss_bytes() > 0);
        let held = std::hint::black_box(vec![1u8; 1 << 20]);
        assert!(super::heap().in_use >= held.len() as u64);
        // Past glibc's largest mmap threshold (32 MiB), an allocation is always mapped.
        let mapped = std::hint::black_box(vec![0u8; 64 << 20]);
        let heap = super::heap();
        assert!(heap.mapped >= mapped.len() as u64 && heap.in_use >= heap.mapped);
    }
}
