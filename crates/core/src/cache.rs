//! Caches keyed by number, grouped by allocation group, and the memory budget they share.
//!
//! The metadata buffer cache and the inode cache are both an [`AgCache`]: per AG a few hash
//! map shards. Lookups take only a shard's read lock (never an exclusive lock), and that
//! lock is striped per CPU (`sync::StripedRwLock`): a lookup writes only its own CPU's lock
//! word, so CPUs looking up keys of one shard do not bounce a line between them; shards are
//! cache-line padded for the same reason.
//!
//! Reclaim (seed 003) works one AG at a time. Each AG has a reclaim lock and a cursor: a
//! reclaimer *tries* the lock and goes to the next AG when another reclaimer is there, so
//! reclaimers never pile onto one AG; it scans one shard, giving every referenced object a
//! second chance (clock), with no lock held across the scan: it copies the shard's keys out,
//! checks them a batch at a time under short read locks and removes candidates under short
//! write locks, so neither lookups nor inserts wait for a whole scan.
//! An object is dropped only when nobody else holds it and its newest logged image is at its
//! home location (`Reclaimable::is_clean`): a later miss then reads exactly what was cached.
//!
//! A [`CacheBudget`] may be shared by several mounted file systems (seed 004: each keeps its
//! own caches, so unmounting one walks only its objects); reclaim visits their AGs in one
//! round-robin order, so the file system that grows pays no more than the others.

use crate::buf::{Buf, BufRef};
use crate::dev::BlockDevice;
use crate::error::Result;
use crate::format::log::ALL_CHUNKS;
use crate::format::{verify_block, BLOCK_SIZE};
use crate::lockstat::{LockClass, Mutex, RwLock};
use crate::reclaim::Reclaimable;
use crate::sync::{RawRwLock, StripedRwLock};
use crossbeam_utils::CachePadded;
use rustc_hash::FxHashMap;
use smallvec::SmallVec;
// The counters from `crate::sync`, so the model checker (`tests/model_check.rs`) interleaves
// their updates too. The referenced bit stays `std`: it is part of `Reclaimable`, which the
// cached types implement, and it is only a hint; what makes eviction safe is the strong
// count, read under the shard locks.
use crate::sync::atomic::{AtomicU64, AtomicUsize};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Weak};

/// Hash map shards per AG.
const SHARDS_PER_AG: usize = 8;
/// Objects removed per write-lock hold.
const EVICT_BATCH: usize = 64;
/// An AG's cache checks the budget each time it grows by this many objects (fewer for a
/// budget so small that this many would overrun it).
const CHECK_EVERY: u64 = 256;

static RECLAIM: LockClass = LockClass::ranked("cache-reclaim", 55);
static BUDGET: LockClass = LockClass::ranked("cache-budget", 80);

struct AgPart {
    /// Objects cached for this AG (changed under a shard write lock).
    len: AtomicU64,
    /// The next shard of this AG to scan.
    reclaim: Mutex<usize>,
}

/// One hash map shard: every CPU's lookups read it, so its lock is striped per CPU.
type Shard<V> = RwLock<FxHashMap<u64, Arc<V>>, StripedRwLock<FxHashMap<u64, Arc<V>>>>;

pub struct AgCache<V> {
    shards: Box<[CachePadded<Shard<V>>]>,
    ags: Box<[CachePadded<AgPart>]>,
    /// `key >> ag_shift` is a key's AG for inode numbers; `key / ag_div` for block numbers.
    ag_of: fn(u64, u64) -> u64,
    ag_param: u64,
    budget: Arc<CacheBudget>,
    check_every: u64,
}

/// Keys are inode numbers: the AG is in the high 32 bits.
pub fn inode_ag(ino: u64, _: u64) -> u64 {
    ino >> 32
}

/// Keys are block numbers: the AG is the block number divided by the AG size.
pub fn block_ag(blkno: u64, ag_blocks: u64) -> u64 {
    blkno / ag_blocks
}

impl<V: Reclaimable> AgCache<V> {
    pub fn new(
        class: &'static LockClass,
        ag_count: u32,
        ag_of: fn(u64, u64) -> u64,
        ag_param: u64,
        budget: Arc<CacheBudget>,
    ) -> Self {
        let n = ag_count.max(1) as usize;
        AgCache {
            shards: (0..n * SHARDS_PER_AG)
                .map(|i| {
                    CachePadded::new(RwLock::striped_indexed(class, (i / SHARDS_PER_AG) as u64, FxHashMap::default()))
                })
                .collect(),
            ags: (0..n)
                .map(|i| {
                    CachePadded::new(AgPart {
                        len: AtomicU64::new(0),
                        reclaim: Mutex::new_indexed(&RECLAIM, i as u64, 0),
                    })
                })
                .collect(),
            ag_of,
            ag_param,
            check_every: (budget.limit / (n as u64 * BLOCK_SIZE as u64 * 4)).clamp(1, CHECK_EVERY),
            budget,
        }
    }

    fn ag(&self, k: u64) -> usize {
        // A key outside the geometry (a corrupt number that got this far) still lands in a
        // valid AG; its lookup then simply misses.
        ((self.ag_of)(k, self.ag_param) as usize).min(self.ags.len() - 1)
    }

    fn shard(&self, k: u64) -> &Shard<V> {
        &self.shards[self.ag(k) * SHARDS_PER_AG + crate::sync::shard_of(k, SHARDS_PER_AG)]
    }

    pub fn get(&self, k: u64) -> Option<Arc<V>> {
        let v = self.shard(k).read().get(&k).cloned()?;
        // Only write the line when the bit changes: hot objects stay shared-clean.
        if !v.referenced().load(Relaxed) {
            v.referenced().store(true, Relaxed);
        }
        Some(v)
    }

    /// Insert unless present; returns the value in the map afterwards. Every
    /// `check_every` objects an AG's cache grows by, the inserting thread checks the budget
    /// (and reclaims, if it is exceeded) once it holds no cache lock.
    pub fn get_or_insert(&self, k: u64, v: Arc<V>) -> Arc<V> {
        self.get_or_insert_if(k, v, || true).expect("inserted unconditionally")
    }

    /// As `get_or_insert`, but `v` goes in only if `current()` holds when checked under the
    /// shard's write lock, which eviction takes too; None if it does not and nothing is cached.
    pub fn get_or_insert_if(&self, k: u64, v: Arc<V>, current: impl FnOnce() -> bool) -> Option<Arc<V>> {
        let mut s = self.shard(k).write();
        if let Some(cached) = s.get(&k) {
            return Some(cached.clone());
        }
        if !current() {
            return None;
        }
        s.insert(k, v.clone());
        drop(s);
        if (self.ags[self.ag(k)].len.fetch_add(1, Relaxed) + 1).is_multiple_of(self.check_every) {
            self.budget.check();
        }
        Some(v)
    }

    /// Insert, replacing whatever is cached under `k` (which is returned).
    pub fn replace(&self, k: u64, v: Arc<V>) -> Option<Arc<V>> {
        let old = self.shard(k).write().insert(k, v);
        if old.is_none() && (self.ags[self.ag(k)].len.fetch_add(1, Relaxed) + 1).is_multiple_of(self.check_every) {
            self.budget.check();
        }
        old
    }

    /// Remove `k` if it still maps to `v` (and not to something inserted since).
    pub fn remove_if(&self, k: u64, v: &Arc<V>) {
        let mut s = self.shard(k).write();
        if s.get(&k).is_some_and(|cur| Arc::ptr_eq(cur, v)) {
            s.remove(&k);
            drop(s);
            self.ags[self.ag(k)].len.fetch_sub(1, Relaxed);
        }
    }

    pub fn len(&self) -> u64 {
        self.ags.iter().map(|a| a.len.load(Relaxed)).sum()
    }

    #[cfg(feature = "testing")]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The budget this cache shares.
    pub fn budget(&self) -> &Arc<CacheBudget> {
        &self.budget
    }

    /// Scan the next shard of AG `ag` and drop what is unreferenced and clean. Returns the
    /// objects dropped, or `None` when another reclaimer is working on this AG.
    ///
    /// No lock is held across the whole scan: the shard's keys are copied out under one read
    /// lock (the map's own memory, read in order; no object is touched), then checked
    /// `EVICT_BATCH` at a time under short read locks and removed under short write locks.
    /// Checking every object of a shard under one read lock, a cache over its budget with
    /// 48 threads missing into it made their inserts, and the lookups queued behind those,
    /// wait for whole scans: `icache` waits of 7-12% of thread time at 1,000,000 files.
    pub fn reclaim_ag(&self, ag: u32, home_seq: u64) -> Option<u64> {
        let part = &self.ags[ag as usize];
        let mut cursor = part.reclaim.try_lock()?;
        let shard = &self.shards[ag as usize * SHARDS_PER_AG + *cursor];
        *cursor = (*cursor + 1) % SHARDS_PER_AG;
        let keys: Vec<u64> = shard.read().keys().copied().collect();
        let evictable = |v: &Arc<V>| Arc::strong_count(v) == 1 && !v.referenced().load(Relaxed) && v.is_clean(home_seq);
        let mut dropped = 0;
        for batch in keys.chunks(EVICT_BATCH) {
            let candidates: SmallVec<[u64; EVICT_BATCH]> = {
                let s = shard.read();
                batch
                    .iter()
                    .copied()
                    .filter(|k| s.get(k).is_some_and(|v| !second_chance(v.referenced()) && evictable(v)))
                    .collect()
            };
            if candidates.is_empty() {
                continue;
            }
            // Freed after the write lock is released: an object's drop is not free.
            let mut gone: SmallVec<[Arc<V>; EVICT_BATCH]> = SmallVec::new();
            let mut s = shard.write();
            for k in &candidates {
                // Re-checked under the write lock: nobody can take a new reference now.
                if s.get(k).is_some_and(evictable) {
                    gone.extend(s.remove(k));
                }
            }
            drop(s);
            part.len.fetch_sub(gone.len() as u64, Relaxed);
            dropped += gone.len() as u64;
        }
        Some(dropped)
    }
}

/// Clear a referenced bit; whether it was set. Written only when set: a scan then leaves the
/// lines of objects nobody touched clean in the CPU caches.
fn second_chance(referenced: &AtomicBool) -> bool {
    referenced.load(Relaxed) && referenced.swap(false, Relaxed)
}

/// One file system's caches as the budget sees them.
pub trait CacheOwner: Send + Sync {
    /// Bytes its caches hold (estimated from object counts).
    fn cache_bytes(&self) -> u64;
    /// Bytes its journal holds besides: changes committed but not logged yet, and logged
    /// records not yet written home. Only writeback frees them (`push_dirty`), but they are
    /// memory of the process as much as the caches are, so the budget counts them.
    fn log_bytes(&self) -> u64;
    fn ag_count(&self) -> u32;
    /// Reclaim a batch from AG `ag`: bytes freed, `None` if another reclaimer is there.
    fn reclaim_ag(&self, ag: u32) -> Option<u64>;
    /// Nothing more is clean: ask for the log to be written home so more becomes clean.
    fn push_dirty(&self);
    /// Checkpoint the log and write all of it home now, in the calling thread (a throttled
    /// transaction's, which holds no lock). A failure fails the member's journal: its own
    /// operations report it.
    fn write_home(&self);
    /// How far writeback has come (the journal's home sequence): it rises whenever objects
    /// that were dirty may have become clean.
    fn home_seq(&self) -> u64;
}

/// A memory budget shared by the caches of one or more file systems. When they together
/// pass the limit, reclaim brings them down to 7/8 of it, visiting (file system, AG) pairs in
/// one round-robin order.
///
/// What is dirty cannot be dropped, and a burst of creates makes everything dirty. So an
/// insert that finds the budget over its limit marks it over and sweeps only while sweeps
/// can succeed: one that cannot get under the target marks the budget stalled, and none is
/// repeated until writeback has moved on or usage has grown (with everything dirty, every
/// check swept every AG twice over the same objects: 25% of the CPU of seed 001's mdtest at
/// its own size). A transaction that begins on a budget over its limit is throttled instead:
/// it reclaims, writing every member's log home first if the budget is stalled, while the
/// others that begin meanwhile wait for it (the kernel's `balance_dirty_pages` makes a writer
/// that dirties too much wait in the same way). Transactions begin holding no lock, so the
/// throttle can write home there even with the journal's background threads off; inserts
/// may hold locks, so they never wait.
///
/// A budget made with [`CacheBudget::for_process`] bounds its whole process (a mount
/// daemon's), not only the caches: what the process holds besides what the budget counts
/// (code, stacks, request buffers, and memory the allocator keeps free but has not handed
/// back) is sampled from its RSS and leaves the caches that much less room.
pub struct CacheBudget {
    limit: u64,
    /// Set for a budget that bounds its process.
    process: Option<ProcessMemory>,
    members: RwLock<Vec<Weak<dyn CacheOwner>>>,
    /// Position in the round-robin order over every member's AGs.
    cursor: AtomicUsize,
    /// A check found usage over the limit: the next transaction to begin is throttled, and
    /// its reclaim clears this. An insert's sweep does not, even when it gets under the
    /// target: cleared there too, a 100,000-file burst under a 16 MiB budget with background
    /// writeback went unthrottled and peaked at 17.4 MB, against 17.0-17.3 MB.
    over: AtomicBool,
    /// `NOT_STALLED`, or the members' summed home sequences when a sweep last failed to get
    /// under the target; `stalled_used`, the bytes used then.
    stalled_home: AtomicU64,
    stalled_used: AtomicU64,
    /// Held for writing by the throttled transaction that reclaims; the others wait as
    /// readers. Not a lockstat lock: its waits are throttle waits (`CacheStats`).
    throttling: crate::sync::RwLock<()>,
    /// How often transactions were throttled, and for how long, over the budget's life.
    pub stats: CacheStats,
}

const NOT_STALLED: u64 = u64::MAX;

/// How a budget that bounds its process sees the memory it does not count.
struct ProcessMemory {
    /// RSS minus the budget's count at the last sample, at most half the limit: the
    /// caches always keep half of it, however fragmented the heap is.
    other: AtomicU64,
    /// When to sample next, in nanoseconds from `epoch`.
    next_sample: AtomicU64,
    epoch: std::time::Instant,
}

/// A budget that bounds its process samples the RSS at most this often. Between samples the
/// process is taken to grow as the count does: at 100,000 creates a second the caches grow
/// by about 1 MiB in this time.
const PROCESS_SAMPLE_NS: u64 = 10_000_000;

impl ProcessMemory {
    /// The process's memory besides `used` bytes counted, sampled again if that is due.
    fn other(&self, used: u64, limit: u64) -> u64 {
        let now = self.epoch.elapsed().as_nanos() as u64;
        let due = self.next_sample.load(Relaxed);
        if now >= due && self.next_sample.compare_exchange(due, now + PROCESS_SAMPLE_NS, Relaxed, Relaxed).is_ok() {
            let rss = crate::memory::rss_bytes();
            // Without /proc there is nothing to go on: the budget then counts the caches only.
            self.other.store(rss.saturating_sub(used).min(limit / 2), Relaxed);
        }
        self.other.load(Relaxed)
    }
}

/// A budget that bounds its process leaves this share of the limit unused: RSS can jump
/// between samples by more than the count grows. When an 8-client fs_mark's removal follows
/// its 400,000 creates, glibc's free memory rose from 14 to 46 MiB and RSS by 16 MiB within
/// 200 ms while the count stood still; without the margin every run under a 64 MiB limit
/// peaked over it (64.2-68.9 MiB), and one in six under 256 MiB (by 2.8 MiB).
const PROCESS_MARGIN: u64 = 16;

/// A stalled budget sweeps again at an insert once usage has grown by this share of the
/// limit: objects also become clean without writeback (a file closed, a lookup's reference
/// dropped), and lookups alone, which begin no transaction, are never throttled.
const RESWEEP_GROWTH: u64 = 8;

#[derive(Default, Debug)]
pub struct CacheStats {
    pub reclaim_passes: AtomicU64,
    pub reclaimed_bytes: AtomicU64,
    /// Sweeps that could not get under the target: the budget stalled.
    pub stalls: AtomicU64,
    /// Checks over the limit that did not sweep: the budget was stalled.
    pub stalled_checks: AtomicU64,
    /// Transactions that began on a budget over its limit, and the nanoseconds they waited in
    /// all (reclaiming and writing home, or for the one that did).
    pub throttles: AtomicU64,
    pub throttle_wait_ns: AtomicU64,
}

impl CacheStats {
    /// Every counter by name, read now (a mount's control socket reports them beside the
    /// journal's, prefixed `cache_`: a shared budget's are those of every file system in it).
    pub fn counters(&self) -> Vec<(&'static str, u64)> {
        crate::lockstat::read_counters(&[
            ("cache_reclaim_passes", &self.reclaim_passes),
            ("cache_reclaimed_bytes", &self.reclaimed_bytes),
            ("cache_stalls", &self.stalls),
            ("cache_stalled_checks", &self.stalled_checks),
            ("cache_throttles", &self.throttles),
            ("cache_throttle_wait_ns", &self.throttle_wait_ns),
        ])
    }
}

impl std::fmt::Debug for CacheBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CacheBudget").field("limit", &self.limit).field("members", &self.members.read().len()).finish()
    }
}

/// The default budget of a file system that is not given one.
pub const DEFAULT_CACHE_BYTES: u64 = 256 << 20;

impl CacheBudget {
    /// A budget for the caches and journals of the file systems that join it.
    pub fn new(limit: u64) -> Arc<CacheBudget> {
        Self::with_process(limit, None)
    }

    /// A budget that bounds its whole process: the caches get `limit` less whatever else the
    /// process's RSS holds and a margin (`PROCESS_MARGIN`), but at least half of `limit`.
    /// For a process that does little besides serving its file systems, such as a mount
    /// daemon; an application that embeds ferrofs would squeeze the caches with its own memory.
    pub fn for_process(limit: u64) -> Arc<CacheBudget> {
        let process = ProcessMemory {
            other: AtomicU64::new(0),
            next_sample: AtomicU64::new(0),
            epoch: std::time::Instant::now(),
        };
        Self::with_process(limit, Some(process))
    }

    fn with_process(limit: u64, process: Option<ProcessMemory>) -> Arc<CacheBudget> {
        Arc::new(CacheBudget {
            limit,
            process,
            members: RwLock::new(&BUDGET, Vec::new()),
            cursor: AtomicUsize::new(0),
            over: AtomicBool::new(false),
            stalled_home: AtomicU64::new(NOT_STALLED),
            stalled_used: AtomicU64::new(0),
            throttling: crate::sync::RwLock::new(()),
            stats: CacheStats::default(),
        })
    }

    /// Bytes the budget holds its members' caches to.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Count a cache (one mounted file system's) against this budget from now on.
    pub fn join(&self, owner: Weak<dyn CacheOwner>) {
        let mut m = self.members.write();
        m.retain(|w| w.strong_count() > 0);
        m.push(owner);
    }

    fn live_members(&self) -> Vec<Arc<dyn CacheOwner>> {
        self.members.read().iter().filter_map(Weak::upgrade).collect()
    }

    /// Bytes the budget covers: every member's caches and journal.
    pub fn used(&self) -> u64 {
        covered(&self.live_members())
    }

    /// Bytes of the process besides those the budget covers, as last sampled (RSS less the
    /// count, at most half the limit): 0 unless the budget bounds its process.
    pub fn process_other_bytes(&self) -> u64 {
        self.process.as_ref().map_or(0, |p| p.other.load(Relaxed))
    }

    /// The bytes the caches and journals may hold now: the limit, less the rest of the
    /// process if the budget bounds it (sampled again if that is due) and a margin for what
    /// the allocator takes before the next sample shows it, but at least half of the limit.
    fn room(&self, used: u64) -> u64 {
        let Some(p) = &self.process else { return self.limit };
        let withheld = p.other(used, self.limit) + self.limit / PROCESS_MARGIN;
        self.limit - withheld.min(self.limit / 2)
    }

    /// Whether the next transaction to begin will be throttled.
    pub fn is_over(&self) -> bool {
        self.over.load(Relaxed)
    }

    /// Called by an insert at a check point (it may hold locks, so it never waits): mark the
    /// budget over if it is, and sweep unless the budget is stalled. Every insert over the
    /// limit sweeps: a single sweeper among 48 threads on 2 CPUs got a CPU too rarely to keep
    /// up with lookups that missed (the inode cache grew to twice the budget while one
    /// sweep ran).
    pub fn check(&self) {
        let members = self.live_members();
        let used = covered(&members);
        let room = self.room(used);
        if used <= room {
            return;
        }
        if !self.over.load(Relaxed) {
            self.over.store(true, Relaxed);
        }
        let home = home_sum(&members);
        if self.stalled_home.load(Relaxed) == home
            && used < self.stalled_used.load(Relaxed) + self.limit / RESWEEP_GROWTH
        {
            self.stats.stalled_checks.fetch_add(1, Relaxed);
        } else if self.sweep(&members, used, room) {
            self.stalled_home.store(NOT_STALLED, Relaxed);
        } else {
            self.stall(&members, home);
            members.iter().for_each(|m| m.push_dirty());
        }
    }

    /// Called when a transaction begins, holding no lock: on a budget over its limit, reclaim
    /// (or wait for the transaction that does). One load when the budget is not over.
    pub fn throttle(&self) {
        if !self.is_over() {
            return;
        }
        self.stats.throttles.fetch_add(1, Relaxed);
        let start = std::time::Instant::now();
        // No count bounds this wait, by design: whoever holds `throttling` clears `over`
        // before letting go, so it repeats only while inserts keep pushing the budget over
        // again, and then this transaction should keep waiting (it would add to the excess).
        while self.is_over() {
            match self.throttling.try_write() {
                Some(_reclaimer) if self.is_over() => self.reclaim_throttled(),
                Some(_) => {}
                None => drop(self.throttling.read()),
            }
        }
        self.stats.throttle_wait_ns.fetch_add(start.elapsed().as_nanos() as u64, Relaxed);
    }

    /// The throttled transaction's reclaim: sweep, unless the budget is stalled; if that
    /// cannot get under the target, write every member's log home and sweep again. The
    /// budget is no longer over afterwards whatever the sweep found: what is still over then
    /// is held (open files, references), and throttling again would not free it; it stays
    /// stalled until writeback or growth, as after an insert's failed sweep.
    fn reclaim_throttled(&self) {
        let members = self.live_members();
        let used = covered(&members);
        let room = self.room(used);
        let stalled = self.stalled_home.load(Relaxed) == home_sum(&members);
        if used > room && (stalled || !self.sweep(&members, used, room)) {
            members.iter().for_each(|m| m.write_home());
            if self.sweep(&members, covered(&members), room) {
                self.stalled_home.store(NOT_STALLED, Relaxed);
            } else {
                self.stall(&members, home_sum(&members));
            }
        }
        self.over.store(false, Relaxed);
    }

    fn stall(&self, members: &[Arc<dyn CacheOwner>], home: u64) {
        self.stats.stalls.fetch_add(1, Relaxed);
        self.stalled_used.store(covered(members), Relaxed);
        self.stalled_home.store(home, Relaxed);
    }

    /// Reclaim `members` from `used` bytes down to 7/8 of `room`; whether it got there.
    fn sweep(&self, members: &[Arc<dyn CacheOwner>], mut used: u64, room: u64) -> bool {
        let target = room / 8 * 7;
        if used <= target {
            return true;
        }
        self.stats.reclaim_passes.fetch_add(1, Relaxed);
        let slots: Vec<(usize, u32)> =
            members.iter().enumerate().flat_map(|(i, m)| (0..m.ag_count()).map(move |a| (i, a))).collect();
        // Two sweeps over every AG at most: the second catches what the first's scans marked
        // unreferenced. Whatever is still over then is dirty or held.
        for _ in 0..2 * slots.len() * SHARDS_PER_AG {
            let (m, ag) = slots[self.cursor.fetch_add(1, Relaxed) % slots.len()];
            if let Some(freed) = members[m].reclaim_ag(ag) {
                self.stats.reclaimed_bytes.fetch_add(freed, Relaxed);
                used = used.saturating_sub(freed);
                if used <= target {
                    return true;
                }
            }
        }
        false
    }
}

/// The members' home sequences summed: it changes whenever any of them has written home.
fn home_sum(members: &[Arc<dyn CacheOwner>]) -> u64 {
    members.iter().map(|m| m.home_seq()).fold(0, u64::wrapping_add)
}

/// Bytes of `members` that a budget covers: their caches and their journals.
fn covered(members: &[Arc<dyn CacheOwner>]) -> u64 {
    members.iter().map(|m| m.cache_bytes() + m.log_bytes()).sum()
}

static BUF_CACHE: LockClass = LockClass::ranked("buf-cache", 60);

/// Bytes one cached metadata block costs: the block, its header and its map entry.
pub const BUF_COST: u64 = (BLOCK_SIZE + std::mem::size_of::<Buf>() + 48) as u64;

/// Verified metadata blocks. A block is checked once, when it is first read; from then on
/// the in-memory copy is authoritative (every change to it goes through the journal).
pub struct BufCache {
    dev: Arc<dyn BlockDevice>,
    map: AgCache<Buf>,
}

impl BufCache {
    pub fn new(dev: Arc<dyn BlockDevice>, ag_count: u32, ag_blocks: u64, budget: Arc<CacheBudget>) -> BufCache {
        BufCache { dev, map: AgCache::new(&BUF_CACHE, ag_count, block_ag, ag_blocks.max(1), budget) }
    }

    /// The cached block, reading and verifying it on a miss.
    pub fn read(&self, blkno: u64, what: &'static str, magic: u32, owner: Option<u64>) -> Result<BufRef> {
        if let Some(b) = self.map.get(blkno) {
            return Ok(b);
        }
        let mut data = Box::new([0u8; BLOCK_SIZE]);
        self.dev.read_at(&mut data[..], blkno * BLOCK_SIZE as u64)?;
        verify_block(&data[..], what, magic, blkno, owner)?;
        Ok(self.map.get_or_insert(blkno, Buf::new(blkno, data)))
    }

    /// A buffer for a block being (re)initialised as metadata, zeroed. A cached buffer for
    /// the same block is reused, so its log version keeps rising across free and reuse.
    pub fn get_new(&self, blkno: u64) -> BufRef {
        let b = self.map.get_or_insert(blkno, Buf::zeroed(blkno));
        // Whatever the block held before counts for nothing: the first image logged is whole.
        b.change(|d| {
            d.fill(0);
            ALL_CHUNKS
        });
        b.set_verified(false);
        b
    }

    pub fn get(&self, blkno: u64) -> Option<BufRef> {
        self.map.get(blkno)
    }

    pub fn len(&self) -> u64 {
        self.map.len()
    }

    #[cfg(feature = "testing")]
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn reclaim_ag(&self, ag: u32, home_seq: u64) -> Option<u64> {
        self.map.reclaim_ag(ag, home_seq)
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    #[test]
    fn a_process_budget_keeps_a_margin_and_half_the_limit() {
        // Far above this process's RSS: the room is the limit less the sample and the margin.
        const LARGE: u64 = 1 << 40;
        let b = CacheBudget::for_process(LARGE);
        let room = b.room(0);
        let other = b.process_other_bytes();
        assert!(other > 0, "the first check samples the process");
        assert_eq!(room, LARGE - other - LARGE / PROCESS_MARGIN);
        // Below it: the caches still keep half.
        const SMALL: u64 = 64 << 10;
        assert_eq!(CacheBudget::for_process(SMALL).room(0), SMALL / 2);
        // An embedded budget counts its objects only.
        assert_eq!(CacheBudget::new(LARGE).room(0), LARGE);
    }

    #[test]
    fn counters_lists_every_counter() {
        let n = CacheStats::default().counters().len();
        assert_eq!(
            n * std::mem::size_of::<AtomicU64>(),
            std::mem::size_of::<CacheStats>(),
            "a CacheStats field is missing from counters()"
        );
    }
}
