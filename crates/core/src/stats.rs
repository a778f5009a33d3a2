//! What a mounted file system is and has done, as plain values: one [`Stats`] snapshot of its
//! counters (journal, caches, allocation groups, the process's memory) and one [`Info`]
//! report of its image (superblock, per-AG layout and usage). The CLI's `info`, a mount's
//! control socket and the benchmarks read these; the structures they are taken from stay
//! inside the engine, so their layout can change without breaking a caller.

use crate::cache::{CacheBudget, CacheOwner, BUF_COST};
use crate::error::Result;
use crate::format::{DiskInode, Superblock};
use crate::fs::FileSystem;
use crate::inode::{Inode, INODE_COST};
use serde::Serialize;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Bytes the cache budget counts for one cached inode: the inode, its reference count and
/// its map entry (what a budget must hold per file to keep a working set cached).
pub const INODE_CACHE_BYTES: u64 = INODE_COST;
/// Bytes the cache budget counts for one cached metadata block.
pub const BLOCK_CACHE_BYTES: u64 = BUF_COST;
/// `size_of` the in-memory inode, most of [`INODE_CACHE_BYTES`].
pub const INODE_STRUCT_BYTES: usize = std::mem::size_of::<Inode>();
/// `size_of` the decoded on-disk inode the in-memory inode embeds.
pub const DISK_INODE_STRUCT_BYTES: usize = std::mem::size_of::<DiskInode>();

/// A snapshot of a mounted file system's counters ([`FileSystem::stats`]). Counters count
/// from the mount on; figures (bytes held, entries cached) are as of the call.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// The journal's counters.
    pub journal: JournalCounters,
    /// What the cache budget did. A budget shared by several file systems counts for all.
    pub cache: CacheCounters,
    /// What the caches hold now.
    pub cache_usage: CacheUsage,
    /// Per allocation group, in AG order.
    pub ags: Vec<AgCounters>,
    /// The whole process's memory.
    pub memory: MemoryUsage,
}

/// The journal's counters: transactions committed, checkpoints written, throttling.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct JournalCounters {
    /// Transactions committed.
    pub commits: u64,
    /// Of `commits`, those routed into a shared directory's CIL shard.
    pub routed_commits: u64,
    /// Checkpoints written to the log, for any reason.
    pub checkpoints: u64,
    /// Of `checkpoints`, those the background worker started (the CIL grew large).
    pub background_checkpoints: u64,
    /// Of `checkpoints`, those an fsync or sync forced.
    pub forced_checkpoints: u64,
    /// Items (blocks, inodes) logged.
    pub items_logged: u64,
    /// Bytes written to the log.
    pub log_bytes: u64,
    /// Checkpoints that waited for log space.
    pub log_space_waits: u64,
    /// Commits throttled because the CIL was over its limit.
    pub commit_throttles: u64,
    /// Nanoseconds throttled commits waited, in all (a wait for log progress, not a lock).
    pub throttle_wait_ns: u64,
    /// Pushes of the AIL (logged items written home).
    pub ail_pushes: u64,
    /// Items written home.
    pub items_written_home: u64,
    /// fsyncs whose change was already durable: no log write.
    pub fsyncs_durable: u64,
    /// Forces that joined another thread's checkpoint (group commit).
    pub forces_joined: u64,
}

/// What the cache budget did: reclaim passes and the transactions it throttled.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheCounters {
    /// Reclaim passes over the budget's members.
    pub reclaim_passes: u64,
    /// Bytes those passes freed.
    pub reclaimed_bytes: u64,
    /// Passes that could not get under the target: the budget stalled.
    pub stalls: u64,
    /// Checks over the limit that did not sweep: the budget was stalled.
    pub stalled_checks: u64,
    /// Transactions that began on a budget over its limit.
    pub throttles: u64,
    /// Nanoseconds those transactions waited, in all.
    pub throttle_wait_ns: u64,
}

/// What the inode and metadata block caches hold now, against their budget.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct CacheUsage {
    /// The budget's limit.
    pub limit_bytes: u64,
    /// Bytes counted against it, by every file system sharing it.
    pub used_bytes: u64,
    /// For a budget that bounds its process: what the process holds besides the caches.
    pub process_other_bytes: u64,
    /// Bytes this file system's own caches hold.
    pub own_bytes: u64,
    /// Inodes cached by this file system.
    pub inodes: u64,
    /// Metadata blocks cached by this file system.
    pub blocks: u64,
}

/// One allocation group's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct AgCounters {
    /// Allocations that found the group's free space taken by a concurrent allocator and
    /// searched again.
    pub alloc_retries: u64,
    /// Inodes on the group's orphan table now (unlinked while open, or being truncated).
    pub orphans: u64,
}

/// The process's memory as the kernel and the allocator count it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryUsage {
    /// Resident set size (0 where /proc is unavailable).
    pub rss_bytes: u64,
    /// Peak resident set size (0 where /proc is unavailable).
    pub peak_rss_bytes: u64,
    /// Heap allocated and not yet freed, over all of malloc's arenas.
    pub heap_bytes: u64,
    /// Of `heap_bytes`, the chunks malloc mapped on their own.
    pub heap_mapped_bytes: u64,
    /// Heap freed by the program but kept by the allocator.
    pub heap_free_bytes: u64,
}

/// The image a file system was mounted from ([`FileSystem::info`]): what `ferrofs info`
/// prints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// The superblock: geometry, UUID, creation time.
    pub superblock: Superblock,
    /// Log records the mount replayed (0: the image was cleanly unmounted). A read-only
    /// mount replays in memory: these are what a read-write mount would write home.
    pub log_records_replayed: u64,
    /// Per allocation group, in AG order.
    pub ags: Vec<AgInfo>,
}

/// One allocation group's layout (absolute block numbers) and usage.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct AgInfo {
    /// The group's number.
    pub agno: u32,
    /// Its first block (holding a copy of the superblock).
    pub start: u64,
    /// Its length in blocks (the last group may be shorter).
    pub blocks: u64,
    /// Free blocks now.
    pub free_blocks: u64,
    /// Free inodes now.
    pub free_inodes: u64,
    /// Inodes on its orphan table when the image was opened, before they were processed.
    pub orphans: usize,
    /// First block of its block bitmap.
    pub block_bitmap: u64,
    /// First block of its inode bitmap.
    pub inode_bitmap: u64,
    /// First block of its orphan table.
    pub orphan_table: u64,
    /// First block of its inode table.
    pub inode_table: u64,
    /// First block of the log (AG 0 only).
    pub log: Option<u64>,
    /// First block for data and B+tree nodes.
    pub data_start: u64,
    /// Blocks kept back for pooled reservations, which statfs counts as used.
    #[serde(skip)]
    pub pool_blocks: u64,
}

impl FileSystem {
    /// A snapshot of this file system's counters and memory.
    pub fn stats(&self) -> Stats {
        let m = self.mount();
        let (journal, budget) = (&m.journal, m.icache.budget());
        let (j, c) = (&journal.stats, &budget.stats);
        let heap = crate::memory::heap();
        Stats {
            journal: JournalCounters {
                commits: journal.commits(),
                routed_commits: journal.routed_commits(),
                checkpoints: j.checkpoints.load(Relaxed),
                background_checkpoints: j.background_checkpoints.load(Relaxed),
                forced_checkpoints: j.forced_checkpoints.load(Relaxed),
                items_logged: j.items_logged.load(Relaxed),
                log_bytes: j.log_bytes.load(Relaxed),
                log_space_waits: j.log_space_waits.load(Relaxed),
                commit_throttles: j.commit_throttles.load(Relaxed),
                throttle_wait_ns: j.throttle_wait_ns.load(Relaxed),
                ail_pushes: j.ail_pushes.load(Relaxed),
                items_written_home: j.items_written_home.load(Relaxed),
                fsyncs_durable: j.fsyncs_durable.load(Relaxed),
                forces_joined: j.forces_joined.load(Relaxed),
            },
            cache: CacheCounters {
                reclaim_passes: c.reclaim_passes.load(Relaxed),
                reclaimed_bytes: c.reclaimed_bytes.load(Relaxed),
                stalls: c.stalls.load(Relaxed),
                stalled_checks: c.stalled_checks.load(Relaxed),
                throttles: c.throttles.load(Relaxed),
                throttle_wait_ns: c.throttle_wait_ns.load(Relaxed),
            },
            cache_usage: CacheUsage {
                limit_bytes: budget.limit(),
                used_bytes: budget.used(),
                process_other_bytes: budget.process_other_bytes(),
                own_bytes: m.cache_bytes(),
                inodes: m.icache.len(),
                blocks: m.bufs.len(),
            },
            ags: m
                .ags
                .iter()
                .map(|ag| AgCounters {
                    alloc_retries: ag.alloc_retries.load(Relaxed),
                    orphans: ag.orphans().len() as u64,
                })
                .collect(),
            memory: MemoryUsage {
                rss_bytes: crate::memory::rss_bytes(),
                peak_rss_bytes: crate::memory::peak_rss_bytes(),
                heap_bytes: heap.in_use,
                heap_mapped_bytes: heap.mapped,
                heap_free_bytes: heap.free,
            },
        }
    }

    /// The image's superblock and per-AG layout and usage.
    pub fn info(&self) -> Info {
        let m = self.mount();
        let ags = m
            .ags
            .iter()
            .map(|ag| {
                let l = &ag.layout;
                AgInfo {
                    agno: l.agno,
                    start: l.start,
                    blocks: l.blocks,
                    free_blocks: ag.free_blocks(),
                    free_inodes: ag.free_inodes(),
                    orphans: m.orphans_found[l.agno as usize],
                    block_bitmap: l.block_bitmap,
                    inode_bitmap: l.inode_bitmap,
                    orphan_table: l.orphan_table,
                    inode_table: l.inode_table,
                    log: (l.log_blocks > 0).then_some(l.log),
                    data_start: l.data_start,
                    pool_blocks: ag.pool(),
                }
            })
            .collect();
        Info { superblock: m.sb.clone(), log_records_replayed: m.recovery.records, ags }
    }

    /// The budget the inode and metadata block caches are held to (the one
    /// [`MountOptions::cache`](crate::MountOptions::cache) gave, or the mount's own).
    pub fn cache_budget(&self) -> &Arc<CacheBudget> {
        self.mount().icache.budget()
    }

    /// Write every committed change to the log (a checkpoint), without waiting for it to be
    /// written home. `sync` does as much and also makes freed space reusable.
    pub fn checkpoint(&self) -> Result<()> {
        self.mount().journal.checkpoint()
    }

    /// Checkpoint, then write every logged block home: afterwards the log holds nothing a
    /// mount would replay, and this file system's background writeback is idle.
    pub fn write_home(&self) -> Result<()> {
        self.mount().journal.quiesce()
    }

    /// Remount read-only (`true`) or read-write again (`false`). Read-only: every later
    /// change fails with [`Error::ReadOnly`](crate::Error::ReadOnly) and the log is written
    /// home, so the image is clean while this lasts. A file system mounted read-only cannot
    /// turn read-write.
    pub fn remount(&self, read_only: bool) -> Result<()> {
        self.mount().remount(read_only)
    }

    /// Stop all further changes (every later call fails with EIO), logging `why`; the image
    /// stays at its last durable checkpoint. For a caller that found the engine in a state
    /// it cannot trust (a panic inside it).
    pub fn shut_down(&self, why: &str) {
        self.mount().shutdown(why)
    }

    /// **Benchmarks only** (the `bench-internals` feature). Inode additions to orphan tables
    /// committed so far.
    #[cfg(feature = "bench-internals")]
    pub fn orphan_adds(&self) -> u64 {
        self.mount().ags.iter().map(|ag| ag.orphan_adds.load(Relaxed)).sum()
    }

    /// **Unsafe for real use; benchmarks only** (the `bench-internals` feature; see
    /// `Mount::set_orphan_tracking_unsafe`).
    #[cfg(feature = "bench-internals")]
    pub fn set_orphan_tracking_unsafe(&self, on: bool) {
        self.mount().set_orphan_tracking_unsafe(on)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheStats;
    use crate::journal::JournalStats;
    use std::mem::size_of;

    /// Every journal and cache counter reaches the snapshot: one `u64` per atomic counter,
    /// plus the journal's commit counts (kept in its CIL shards, not in `JournalStats`).
    #[test]
    fn snapshot_has_every_counter() {
        assert_eq!(
            size_of::<JournalCounters>(),
            size_of::<JournalStats>() + 2 * size_of::<u64>(),
            "a JournalStats field is missing from JournalCounters"
        );
        assert_eq!(
            size_of::<CacheCounters>(),
            size_of::<CacheStats>(),
            "a CacheStats field is missing from CacheCounters"
        );
    }
}
