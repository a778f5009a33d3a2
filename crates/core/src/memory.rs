//! The process's memory as the kernel and the allocator count it: what the cache budget's
//! estimate (`cache::CacheBudget::used`) is checked against, by a running mount's control
//! socket and by the benchmarks.

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

/// Heap bytes in use: allocated and not yet freed, over all of malloc's arenas (what the
/// program holds, without the allocator's free lists or fragmentation that RSS includes).
/// Allocations count whole, touched or not: a FUSE worker's 16 MiB request buffer counts in
/// full though metadata requests touch a page or two of it, so this can exceed RSS. It takes
/// every arena's lock in turn: not for a hot path.
pub fn heap_bytes() -> u64 {
    // SAFETY: mallinfo2 only reads the allocator's statistics and returns them by value.
    let m = unsafe { libc::mallinfo2() };
    (m.uordblks + m.hblkhd) as u64
}

/// Of `heap_bytes`, those in chunks malloc mapped on their own: allocations above its mmap
/// threshold, which starts at 128 KiB and rises (up to 32 MiB) to the size of a mapped chunk
/// freed, so a large buffer may be mapped in one process and in the heap in the next.
pub fn heap_mapped_bytes() -> u64 {
    // SAFETY: as in `heap_bytes`.
    let m = unsafe { libc::mallinfo2() };
    m.hblkhd as u64
}

/// Heap bytes the allocator holds free: freed by the program but kept in its arenas.
pub fn heap_free_bytes() -> u64 {
    // SAFETY: as in `heap_bytes`.
    let m = unsafe { libc::mallinfo2() };
    m.fordblks as u64
}

#[cfg(test)]
mod tests {
    #[test]
    fn reads_own_status() {
        // Each field is read on its own, and the kernel's per-thread RSS counters are folded
        // in lazily, so no order between the two readings is asserted: only that both parse.
        assert!(super::rss_bytes() > 0);
        assert!(super::peak_rss_bytes() > 0);
        let held = std::hint::black_box(vec![1u8; 1 << 20]);
        assert!(super::heap_bytes() >= held.len() as u64);
        // Past glibc's largest mmap threshold (32 MiB), an allocation is always mapped.
        let mapped = std::hint::black_box(vec![0u8; 64 << 20]);
        assert!(super::heap_mapped_bytes() >= mapped.len() as u64);
    }
}
