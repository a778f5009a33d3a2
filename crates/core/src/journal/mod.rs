//! The journal: delayed logging with a sharded committed item list (CIL), checkpoints written
//! as single checksummed log records, the active item list (AIL) that writes metadata home
//! in log order to move the tail, and crash recovery.
//!
//! Commit path (seed 003): a transaction copies each changed item into its thread's CIL
//! shard under that shard's lock only; an item relogged before the next checkpoint overwrites
//! its previous copy, so it is logged once. No global lock is taken and nothing is written.
//!
//! Checkpoint: close the open sequence, then take each shard's items of it under that shard's
//! lock alone, merge the shards and claim log space (under the push lock), then write one
//! record and one flush with no lock held: several checkpoints may be in flight, and they
//! become durable in sequence order. fsync forces the log only up to the CIL sequence that
//! holds the inode's last change; it never waits for home-location writeback or a superblock
//! write (seed 002).

mod ail;
mod recover;

pub use recover::{recover, RecoveryReport};

use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::log::{chunks_of, item_bytes, logged_bytes, write_record, ChunkMask, ItemKey, LogHeader, ALL_CHUNKS, CHUNK, RECORD_HDR, RECORD_PIECE};
use crate::format::{seal_block, DiskInode, Geometry, BLOCK_SIZE, INODE_SIZE};
use crate::lockstat::{Condvar, LockClass, Mutex, MutexGuard};
use ail::{Ail, SealedImages};
use crossbeam_utils::CachePadded;
use rustc_hash::FxHashMap;
// From `crate::sync` so that the model checker (`tests/model_check.rs`) can drive the CIL.
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use crate::sync::{RawRwLock, RwLock, RwLockWriteGuard};
use crate::sync::thread_local;
use std::cell::Cell;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

static CIL_SHARD: LockClass = LockClass::ranked("cil-shard", 30);
static LOG_PUSH: LockClass = LockClass::ranked("log-push", 10);
static CIL_SPARE: LockClass = LockClass::ranked("cil-spare", 15);
static LOG_RECORD_BUF: LockClass = LockClass::ranked("log-record-buf", 16);
static LOG_DONE: LockClass = LockClass::ranked("log-done", 22);
static LOG_WORKER: LockClass = LockClass::ranked("log-worker", 40);
/// CIL shards (`cil-shard` locks): see `Journal::start`.
const CIL_SHARDS: usize = 64;

/// A freed extent that may not be reused until the checkpoint that freed it is durable:
/// otherwise a crash could leave the old owner pointing at someone else's new data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusyExtent {
    pub blkno: u64,
    pub len: u32,
}

struct CilItem {
    version: u64,
    /// `None`: the block was freed in this sequence (logged as a revoke).
    image: Option<Box<[u8]>>,
    /// A block's chunks changed since its image in an earlier sequence (all of them for an
    /// inode): what the record must carry.
    changed: ChunkMask,
}

/// What one shard holds of one CIL sequence.
#[derive(Default)]
struct CilBatch {
    items: FxHashMap<ItemKey, CilItem>,
    busy: Vec<BusyExtent>,
    /// Log bytes these items take.
    bytes: u64,
    /// The part of `bytes` not yet added to `Journal::cil_bytes` (`Journal::publish_bytes`).
    unpublished: u64,
    /// Images this batch copied into buffers of its own, by kind: the shard's demand for
    /// recycled ones at the next switch.
    copies: [usize; IMAGE_KINDS],
}

impl CilBatch {
    fn is_empty(&self) -> bool {
        self.items.is_empty() && self.busy.is_empty()
    }
}

/// What the push lock keeps from one switch to the next, emptied with its capacity kept: the
/// merged batches' item maps (a shard's new batch starts at the size its last one grew to
/// instead of rehashing its way up again), and the map a switch merges them into (megabytes
/// for a busy checkpoint: allocated afresh by whichever thread checkpointed, it left holes of
/// that size in every thread's malloc arena). Freed when the journal goes idle.
#[derive(Default)]
struct PushState {
    maps: Vec<FxHashMap<ItemKey, CilItem>>,
    merged: FxHashMap<ItemKey, CilItem>,
}

/// One item of a checkpoint: its newest image (`None`: the block was freed, logged as a
/// revoke) and the chunks of it that changed since its previous image in the log.
struct Checkpointed {
    key: ItemKey,
    image: Option<Box<[u8]>>,
    changed: ChunkMask,
}

impl Checkpointed {
    /// How the record carries the item: a freed block as its revoke, a block with its header
    /// chunk among its changes (the seal writes the lsn and crc there).
    fn logged(&self) -> (ItemKey, ChunkMask) {
        debug_assert!(self.image.is_some() || matches!(self.key, ItemKey::Block(_)), "{:?}: only blocks are revoked", self.key);
        match (self.key, &self.image) {
            (ItemKey::Block(b), None) => (ItemKey::Revoke(b), ALL_CHUNKS),
            (k, _) => (k, self.changed | 1),
        }
    }
}

/// What a switch took out of the CIL: one sequence's merged items, sorted by home, its freed
/// extents, and what it added to `Journal::in_flight_bytes` (given back once the checkpoint
/// completes).
struct Switched {
    seq: u64,
    items: Vec<Checkpointed>,
    busy: Vec<BusyExtent>,
    in_flight: u64,
}

/// Kinds of image buffer, by size: a block's and an inode's.
const IMAGE_KINDS: usize = 2;

fn image_kind(len: usize) -> usize {
    debug_assert!(len == BLOCK_SIZE || len == INODE_SIZE, "an image of {len} bytes");
    usize::from(len != BLOCK_SIZE)
}

fn image_bytes(kind: usize) -> usize {
    [BLOCK_SIZE, INODE_SIZE][kind]
}

/// Image buffers of records written home, by kind, for the next copies into the CIL: a
/// commit then copies into memory the log is done with instead of allocating what another
/// thread frees. Every copy into the CIL is made by a committing thread and freed by
/// writeback's; through malloc, that cross-thread pair was 8% of the FUSE daemon's CPU in a
/// 400,000-file `rm -rf` for the blocks, and then 6% for the inodes (their malloc waiting on
/// the one arena's lock that the daemon's allocator is held to).
#[derive(Default)]
struct Buffers {
    kinds: [Vec<Box<[u8]>>; IMAGE_KINDS],
}

impl Buffers {
    fn put(&mut self, image: Box<[u8]>) {
        if !image.is_empty() {
            self.kinds[image_kind(image.len())].push(image);
        }
    }

    fn bytes(&self) -> usize {
        self.kinds.iter().enumerate().map(|(kind, list)| list.len() * image_bytes(kind)).sum()
    }

    fn is_empty(&self) -> bool {
        self.kinds.iter().all(Vec::is_empty)
    }

    fn append(&mut self, other: &mut Buffers) {
        for (list, more) in self.kinds.iter_mut().zip(other.kinds.iter_mut()) {
            if list.is_empty() {
                std::mem::swap(list, more);
            } else {
                list.append(more);
            }
        }
    }

    /// Keep `want` buffers of each kind, taking them from `spare` while it has some; returns
    /// the surplus, to be freed outside the caller's lock.
    fn fit(&mut self, want: [usize; IMAGE_KINDS], spare: &mut Buffers) -> Buffers {
        let mut surplus = Buffers::default();
        for (kind, list) in self.kinds.iter_mut().enumerate() {
            let want = want[kind];
            if list.len() > want {
                surplus.kinds[kind] = list.split_off(want);
            } else {
                let from = &mut spare.kinds[kind];
                let give = (want - list.len()).min(from.len());
                list.extend(from.drain(from.len() - give..));
            }
        }
        surplus
    }
}

/// Recycled images between switches (`Journal::spare`). Writeback hands them back in bursts,
/// a pass every few checkpoints, so what the shards do not take at one switch is kept for
/// the next ones, up to `spare_max_bytes` shared between the kinds as the shards' demand
/// is: blocks alone filled it, and every inode copy went to malloc.
#[derive(Default)]
struct Spare {
    buffers: Buffers,
    /// Copies of each kind the batches of the last switch made.
    demand: [usize; IMAGE_KINDS],
}

impl Spare {
    /// How many more buffers of `kind` to keep within `max_bytes`.
    fn room(&self, kind: usize, max_bytes: usize) -> usize {
        let wanted: [usize; IMAGE_KINDS] = std::array::from_fn(|k| self.demand[k] * image_bytes(k));
        let total: usize = wanted.iter().sum();
        let share = if total == 0 { max_bytes / IMAGE_KINDS } else { (max_bytes as u128 * wanted[kind] as u128 / total as u128) as usize };
        (share / image_bytes(kind)).saturating_sub(self.buffers.kinds[kind].len())
    }
}

/// A shard holds at most two sequences: a switch closes the open sequence first and then
/// visits the shards one at a time, so a commit can meet a shard the switch has not reached
/// yet. Its changes belong to the new sequence and wait in `next`.
struct CilShard {
    /// The sequence of `open`; the switch moves it on when it takes `open`.
    seq: u64,
    open: CilBatch,
    next: CilBatch,
    /// Buffers for this shard's next copies (as many of each kind as its last batch used;
    /// none once the CIL is idle).
    free: Buffers,
}

/// A CIL shard and whether a switch must visit it.
///
/// A switch used to lock every shard, busy or not: under `ferrofs bench fsync` load, 2.2
/// million of the 2.6 million `cil-shard` acquisitions of a set were switches visiting shards
/// that no thread used (64 per checkpoint, with 3 threads committing), all of it under the push
/// lock that fsyncs wait for. `active` is set by a committer (under the shard lock, before it
/// reads the open sequence) and cleared by a switch that found the shard empty (under the
/// lock): a switch skips a shard whose flag it reads clear after closing its sequence. Both
/// sides write, then read, with `SeqCst` (the store-load pattern of Dekker's algorithm), so a
/// committer the switch did not see reads the new sequence and its changes belong to it.
///
/// `commits` counts the commits into this shard and `routed` those of them routed here
/// (`Journal::commits` and `Journal::routed_commits` sum them): one count for the whole
/// journal, added by every commit from both CPUs, made that line move between them at each
/// commit (see `Journal::commit`).
struct ShardSlot {
    active: AtomicBool,
    commits: AtomicU64,
    routed: AtomicU64,
    shard: Mutex<CilShard>,
}

/// What a committing transaction sees of the CIL: its sequence's batch in the locked shard.
pub struct CilWriter<'a> {
    batch: &'a mut CilBatch,
    free: &'a mut Buffers,
    added_bytes: u64,
}

impl CilWriter<'_> {
    /// Copy an item's current image into the CIL (replacing an older copy in this shard).
    /// `changed`: the chunks of a block that this commit changed (`Buf::take_changed`);
    /// `ALL_CHUNKS` for an inode.
    pub fn log(&mut self, key: ItemKey, version: u64, image: &[u8], changed: ChunkMask) {
        debug_assert!(!matches!(key, ItemKey::Revoke(_)));
        debug_assert_eq!(image.len(), key.image_len());
        debug_assert!(matches!(key, ItemKey::Block(_)) || changed == ALL_CHUNKS, "{key:?}: only blocks are logged in chunks");
        match self.batch.items.get_mut(&key) {
            Some(it) => {
                // An item's versions are taken under its owner's lock, which is held through
                // the commit, and never restart (a reused inode number continues its AG's
                // floor; cached buffers live as long as the mount): they reach a shard in
                // increasing order. A lower one would lose this change at the checkpoint.
                debug_assert!(it.version < version, "{key:?}: version {version} logged after {}", it.version);
                // This shard holds the version just before, so only the chunks this commit
                // changed differ from its copy (`Buf::take_changed` checks the mask against
                // the last logged image in debug builds): copy those, not the whole block.
                let relogged = it.version + 1 == version;
                it.version = version;
                it.changed |= changed;
                match &mut it.image {
                    Some(img) if relogged && img.len() == BLOCK_SIZE => {
                        copy_chunks(img, image, changed);
                        debug_assert!(img[..] == image[..], "{key:?}: version {version} differs outside its changed chunks {changed:#x}");
                    }
                    Some(img) => img.copy_from_slice(image),
                    None => it.image = Some(copy_of(image, self.free, &mut self.batch.copies)),
                }
            }
            None => {
                self.added_bytes += item_bytes(key) as u64;
                let image = Some(copy_of(image, self.free, &mut self.batch.copies));
                self.batch.items.insert(key, CilItem { version, image, changed });
            }
        }
    }


    /// The metadata block was freed: drop any logged image and revoke older ones.
    pub fn revoke(&mut self, blkno: u64, version: u64) {
        let old = self.batch.items.insert(ItemKey::Block(blkno), CilItem { version, image: None, changed: 0 });
        debug_assert!(old.as_ref().is_none_or(|o| o.version < version), "block {blkno}: revoke version {version} not above the logged one");
        if let Some(image) = old.and_then(|o| o.image) {
            self.free.put(image);
        }
        self.added_bytes += item_bytes(ItemKey::Revoke(blkno)) as u64;
    }

    pub fn busy(&mut self, e: BusyExtent) {
        self.batch.busy.push(e);
    }
}

/// Copy the chunks of `changed` from `image` into `img`, each run of adjacent chunks at once.
fn copy_chunks(img: &mut [u8], image: &[u8], mut changed: ChunkMask) {
    while changed != 0 {
        let first = changed.trailing_zeros() as usize;
        let run = (changed >> first).trailing_ones() as usize;
        let (lo, hi) = (first * CHUNK, (first + run) * CHUNK);
        img[lo..hi].copy_from_slice(&image[lo..hi]);
        changed &= !chunks_of(lo..hi);
    }
}

/// A copy of `image`, in one of the shard's `free` buffers of its kind when there is one;
/// counted in `copies`.
fn copy_of(image: &[u8], free: &mut Buffers, copies: &mut [usize; IMAGE_KINDS]) -> Box<[u8]> {
    let kind = image_kind(image.len());
    copies[kind] += 1;
    match free.kinds[kind].pop() {
        Some(mut b) => {
            b.copy_from_slice(image);
            b
        }
        None => image.into(),
    }
}

/// Counters shown by the benchmarks and `ferrofs lockstat --journal`, with the commit counts
/// that the CIL shards keep (`Journal::counters`).
#[derive(Default, Debug)]
pub struct JournalStats {
    pub checkpoints: AtomicU64,
    pub background_checkpoints: AtomicU64,
    pub forced_checkpoints: AtomicU64,
    pub items_logged: AtomicU64,
    pub log_bytes: AtomicU64,
    pub log_space_waits: AtomicU64,
    pub commit_throttles: AtomicU64,
    /// Nanoseconds throttled commits waited, in all (a wait for log progress, not for a lock:
    /// lockstat does not see it).
    pub throttle_wait_ns: AtomicU64,
    pub ail_pushes: AtomicU64,
    pub items_written_home: AtomicU64,
    /// fsyncs whose change was already durable: no log write (at most a data flush).
    pub fsyncs_durable: AtomicU64,
    /// Forces whose sequence another thread's checkpoint had already closed: they waited
    /// for that record (group commit). The others wrote a checkpoint (`forced_checkpoints`).
    pub forces_joined: AtomicU64,
}

/// Tunables; defaults suit the benchmarks, tests shrink them to exercise wrap-around.
#[derive(Clone, Debug)]
pub struct JournalConfig {
    /// Background checkpoint when the CIL holds this many bytes (seed 003, patch 1).
    pub cil_push_bytes: u64,
    /// Commits wait when the CIL holds this many bytes (bounded memory, bounded record).
    /// At most a quarter of the ring (a larger value is lowered to that): a checkpoint is
    /// one record of at most half the ring, and the rest is headroom for the transactions
    /// that began just below the bound.
    pub cil_max_bytes: u64,
    /// Background checkpoint at least this often while the CIL is not empty.
    pub push_interval: Duration,
    /// Start background writeback when the log is this full (fraction in percent).
    pub ail_push_percent: u64,
    /// Write everything home when the durable records' images held for writeback pass this
    /// many bytes (a block relogged by many records is held once: the newest image).
    pub ail_held_max_bytes: u64,
    /// Most bytes of images written records keep for the shards' next copies: what reuse
    /// may hold back from the allocator.
    pub spare_max_bytes: u64,
    /// A record larger than this is built and written in pieces of about this size (a
    /// multiple of the block size; crash tests make it one block).
    pub record_piece_bytes: usize,
    /// Run background threads (tests that drive checkpoints by hand turn them off).
    pub background: bool,
}

impl JournalConfig {
    pub fn for_log(ring_blocks: u64) -> JournalConfig {
        let ring_bytes = ring_blocks * BLOCK_SIZE as u64;
        JournalConfig {
            cil_push_bytes: (ring_bytes / 16).min(32 << 20),
            cil_max_bytes: (ring_bytes / 4).min(128 << 20),
            push_interval: Duration::from_secs(1),
            ail_push_percent: 50,
            ail_held_max_bytes: (ring_bytes / 4).min(64 << 20),
            spare_max_bytes: 32 << 20,
            record_piece_bytes: RECORD_PIECE,
            background: true,
        }
    }

    /// Fit the journal's memory into the cache budget that counts it (`limit` bytes): the
    /// CIL pushes at a sixteenth of the budget and holds commits at a quarter, recycled
    /// images take at most an eighth, writeback starts once the log in use passes a quarter
    /// and writes everything once the newest images it holds pass an eighth (a sixteenth
    /// wrote each leaf of a 400,000-file `rm -rf` home 70 times). The default budget
    /// keeps a 128 MiB log's own thresholds; with them a 64 MiB budget was overrun by the
    /// journal alone, and reclaim emptied the caches around it. (Holding commits at an
    /// eighth halved a 256 MiB log's limit under the default budget and multiplied commit
    /// throttles and checkpoints in `bench scale` for no memory saved.) Floors keep a small
    /// budget from turning every few commits into a checkpoint.
    pub fn within_budget(mut self, ring_blocks: u64, limit: u64) -> JournalConfig {
        let ring_bytes = ring_blocks * BLOCK_SIZE as u64;
        self.cil_push_bytes = self.cil_push_bytes.min((limit / 16).max(JOURNAL_MIN_BYTES));
        self.cil_max_bytes = self.cil_max_bytes.min((limit / 4).max(2 * JOURNAL_MIN_BYTES));
        self.ail_push_percent = self.ail_push_percent.min((limit / 4 * 100 / ring_bytes.max(1)).max(AIL_PUSH_PERCENT_MIN));
        self.ail_held_max_bytes = self.ail_held_max_bytes.min((limit / 8).max(JOURNAL_MIN_BYTES));
        self.spare_max_bytes = self.spare_max_bytes.min(limit / 8);
        self
    }
}

/// The least CIL push threshold a budget brings (the hard limit is twice that).
const JOURNAL_MIN_BYTES: u64 = 1 << 20;
/// The least log fill that starts writeback under a small budget.
const AIL_PUSH_PERCENT_MIN: u64 = 4;

type DurableHook = Box<dyn Fn(Vec<BusyExtent>) + Send + Sync>;

pub struct Journal {
    dev: Arc<dyn BlockDevice>,
    geo: Geometry,
    cfg: JournalConfig,
    shards: Box<[CachePadded<ShardSlot>]>,
    /// The open CIL sequence. A commit reads it under its shard's lock, so along any chain of
    /// commits ordered by a lock the sequences never go down: a checkpoint that holds a change
    /// holds everything it depends on.
    open_seq: AtomicU64,
    /// Every CIL sequence up to this one is durable in the log. Advanced in sequence order
    /// under `done`.
    durable_seq: AtomicU64,
    /// Bytes of the CIL's items as the shards published them (`CilBatch::unpublished`);
    /// above zero whenever the CIL holds an item.
    cil_bytes: AtomicU64,
    /// How many bytes a shard's batch gathers before it adds them to `cil_bytes`: at most
    /// 16 KiB, and with every shard holding that much unpublished the CIL is still within a
    /// quarter of its bound above `cil_max_bytes` (a record stays within half the ring).
    publish_bytes: u64,
    /// Bytes of recycled images: the shards' `free` buffers as the last switch left
    /// them, and `spare` since. An estimate for the cache budget (a commit taking a buffer
    /// leaves it counted here as well as in `cil_bytes` until the next switch).
    recycled_bytes: AtomicU64,
    /// Twice the CIL bytes of the checkpoints between their switch and their completion: their
    /// items, and then their sealed images and record; the AIL counts the images once durable.
    in_flight_bytes: AtomicU64,
    /// A background checkpoint was requested and has not started yet.
    push_pending: AtomicBool,
    /// Serialises switches and log space claims, so records are numbered and placed in CIL
    /// sequence order; not held while a record is built or written.
    push: Mutex<PushState>,
    /// Images of records written home (`recycle`), which the next switch hands back to the
    /// shards (`CilShard::free`).
    spare: Mutex<Spare>,
    /// The buffer the last record was built in, for the next one (empty: none). A record is
    /// built and written a piece at a time (`record_piece_bytes`): a busy checkpoint's record
    /// is megabytes, and allocated whole and afresh by whichever thread checkpointed (the
    /// CIL worker, an fsync, a throttled committer) it left holes of that size in every
    /// thread's malloc arena.
    record_buf: Mutex<Vec<u8>>,
    /// The capacity of `record_buf`, for the cache budget.
    record_buf_bytes: AtomicU64,
    /// Taken to complete a checkpoint (in sequence order) and to wait for one; `done_cv` is
    /// signalled when `durable_seq` moves or the journal fails.
    done: Mutex<()>,
    done_cv: Condvar,
    /// Data blocks were written since the last flush: ordered mode flushes them before a
    /// record that may point at them.
    data_dirty: AtomicBool,
    ail: Ail,
    on_durable: DurableHook,
    failed: AtomicBool,
    worker: Mutex<WorkerState>,
    /// The CIL worker waits here, the AIL writer on `ail_cv`: a writeback request, which
    /// every checkpoint past the log's trigger makes, does not wake the CIL worker.
    worker_cv: Condvar,
    ail_cv: Condvar,
    /// A writeback request is pending and the writer has not taken it yet: the checkpoints
    /// that pass the trigger meanwhile (an fsync's among them) leave the worker's lock
    /// alone. Under `ferrofs bench fsync` load they met 19-50 contentions there per set, of
    /// 0.1-0.6 ms on average.
    ail_pending: AtomicBool,
    /// Held for writing by the throttled committer that checkpoints a full CIL; the other
    /// throttled committers wait as readers (`throttle`). Not a lockstat lock: its waits are
    /// throttle waits, counted in `JournalStats`.
    cil_full: RwLock<()>,
    threads: parking_lot::Mutex<Vec<JoinHandle<()>>>,
    pub stats: JournalStats,
}

#[derive(Default)]
struct WorkerState {
    push_requested: bool,
    ail_requested: bool,
    /// Write the whole log home, not just enough to make room.
    ail_all_requested: bool,
    /// A CIL push was requested: the writer takes in the records durable since its last
    /// wake (dropping the images they supersede) and writes only if memory asks for it.
    ail_take_in_requested: bool,
    stop: bool,
}

/// Which CIL shard a commit goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The committing thread's own: commits of different threads share nothing.
    Thread,
    /// The shard of an object that several threads are changing (a shared directory, by
    /// inode number): each of its blocks then has one copy in the CIL, relogged in place,
    /// rather than a whole copy in the shard of every thread that changed it.
    Object(u64),
}

thread_local! {
    static SHARD_INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
}
/// Only spreads threads over shards, so it stays `std` under the model checker.
static NEXT_SHARD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

fn my_shard(n: usize) -> usize {
    SHARD_INDEX.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT_SHARD.fetch_add(1, Relaxed));
        }
        s.get() % n
    })
}

impl Journal {
    /// Start the journal on an image whose log has been recovered (it is empty: `header`
    /// points its tail at its head).
    pub fn start(dev: Arc<dyn BlockDevice>, geo: Geometry, header: LogHeader, mut cfg: JournalConfig, on_durable: DurableHook) -> Arc<Journal> {
        let ring_blocks = geo.log_ring_blocks();
        cfg.cil_max_bytes = cfg.cil_max_bytes.min(ring_blocks * BLOCK_SIZE as u64 / 4);
        let publish_bytes = (cfg.cil_max_bytes / (4 * CIL_SHARDS as u64)).min(16 << 10);
        // As many shards whatever the CPUs: threads are mapped to shards by their index, so
        // threads, not CPUs, share a shard. (Eight per CPU, 16 on 2 CPUs, had 48 threads share
        // each three ways: a holder preempted there held up its sharers and the AG lock they
        // held, and `ferrofs bench scale` counted ten times the shard contentions and twice
        // the AG wait of 64 shards.) A switch visits those in use, a lock each (`ShardSlot`).
        let shard = || CilShard { seq: 1, open: CilBatch::default(), next: CilBatch::default(), free: Buffers::default() };
        let shards = (0..CIL_SHARDS)
            .map(|i| CachePadded::new(ShardSlot { active: AtomicBool::new(false), commits: AtomicU64::new(0), routed: AtomicU64::new(0), shard: Mutex::new_indexed(&CIL_SHARD, i as u64, shard()) }))
            .collect();
        let log_start = geo.ag_layout(0).log;
        let j = Arc::new(Journal {
            ail: Ail::new(log_start, ring_blocks, header),
            dev,
            geo,
            cfg,
            shards,
            open_seq: AtomicU64::new(1),
            durable_seq: AtomicU64::new(0),
            cil_bytes: AtomicU64::new(0),
            publish_bytes,
            recycled_bytes: AtomicU64::new(0),
            in_flight_bytes: AtomicU64::new(0),
            push_pending: AtomicBool::new(false),
            push: Mutex::new(&LOG_PUSH, PushState::default()),
            spare: Mutex::new(&CIL_SPARE, Spare::default()),
            record_buf: Mutex::new(&LOG_RECORD_BUF, Vec::new()),
            record_buf_bytes: AtomicU64::new(0),
            done: Mutex::new(&LOG_DONE, ()),
            done_cv: Condvar::new(),
            data_dirty: AtomicBool::new(false),
            on_durable,
            failed: AtomicBool::new(false),
            worker: Mutex::new(&LOG_WORKER, WorkerState::default()),
            worker_cv: Condvar::new(),
            ail_cv: Condvar::new(),
            ail_pending: AtomicBool::new(false),
            cil_full: RwLock::new(()),
            threads: parking_lot::Mutex::new(Vec::new()),
            stats: JournalStats::default(),
        });
        if j.cfg.background {
            j.spawn("ferrofs-cil", Journal::cil_worker);
            j.spawn("ferrofs-ail", Journal::ail_worker);
        }
        j
    }

    fn spawn(self: &Arc<Self>, name: &str, f: fn(&Journal)) {
        let j = Arc::clone(self);
        let h = std::thread::Builder::new().name(name.into()).spawn(move || f(&j)).expect("spawn journal thread");
        self.threads.lock().push(h);
    }

    #[cfg(feature = "testing")]
    pub fn geometry(&self) -> &Geometry {
        &self.geo
    }

    /// The journal hit an I/O error writing the log: the file system must stop changing.
    pub fn is_failed(&self) -> bool {
        self.failed.load(Relaxed)
    }

    /// EIO once the journal has failed.
    fn alive(&self) -> Result<()> {
        if self.is_failed() {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        Ok(())
    }

    fn fail<T>(&self, e: std::io::Error) -> Result<T> {
        self.set_failed();
        Err(Error::Io(e))
    }

    /// Stop the journal, and wake whoever waits for a checkpoint that will now never
    /// complete.
    fn set_failed(&self) {
        let _done = self.done.lock();
        self.failed.store(true, Relaxed);
        self.done_cv.notify_all();
    }

    /// Note that file data was written in place; the next checkpoint flushes it first.
    pub fn note_data_write(&self) {
        if !self.data_dirty.load(Relaxed) {
            self.data_dirty.store(true, Relaxed);
        }
    }

    /// The CIL shard this thread commits to unless routed elsewhere.
    pub fn thread_shard(&self) -> usize {
        my_shard(self.shards.len())
    }

    /// Make an item change durable-in-order: run `f` with the CIL shard of `route` locked and
    /// return the CIL sequence the changes belong to (what fsync must force).
    /// The caller holds AG locks here, so it must have called `throttle` before taking them.
    pub fn commit(&self, route: Route, f: impl FnOnce(&mut CilWriter<'_>)) -> u64 {
        let shard = match route {
            Route::Thread => self.thread_shard(),
            Route::Object(key) => crate::sync::shard_of(key, self.shards.len()),
        };
        let slot = &self.shards[shard];
        let mut g = slot.shard.lock();
        // Changed only under the shard lock: the relaxed load is exact.
        if !slot.active.load(Relaxed) {
            slot.active.store(true, SeqCst);
        }
        let seq = self.open_seq.load(SeqCst);
        let CilShard { seq: shard_seq, open, next, free } = &mut *g;
        if *shard_seq < seq && open.is_empty() && next.is_empty() {
            // Idle while switches skipped it: nothing here belongs to an older sequence.
            *shard_seq = seq;
        }
        let batch = if seq == *shard_seq {
            open
        } else {
            debug_assert_eq!(seq, *shard_seq + 1, "a switch visits every shard before the next one");
            next
        };
        let mut w = CilWriter { batch, free, added_bytes: 0 };
        f(&mut w);
        let added = w.added_bytes;
        // Counted under the shard lock, so the switch takes out exactly the bytes of the
        // items it takes. A batch's bytes reach `cil_bytes` when it gets its first and then
        // once per `publish_bytes`: one count that every commit added to moved between the
        // CPUs at each commit, under this lock (2 threads changing modes: 4.6M commits/s,
        // 5.3-5.8M without it).
        let first = batch.bytes == 0;
        batch.bytes += added;
        batch.unpublished += added;
        let total = (first || batch.unpublished >= self.publish_bytes).then(|| {
            let p = std::mem::take(&mut batch.unpublished);
            self.cil_bytes.fetch_add(p, Relaxed) + p
        });
        // Only ever written under this lock: a load and a store keep them exact.
        slot.commits.store(slot.commits.load(Relaxed) + 1, Relaxed);
        if matches!(route, Route::Object(_)) {
            slot.routed.store(slot.routed.load(Relaxed) + 1, Relaxed);
        }
        drop(g);
        if total.is_some_and(|t| t >= self.cfg.cil_push_bytes) {
            self.request_push();
        }
        seq
    }

    /// Bounded CIL: wait while it is over its hard limit. Called when a transaction begins,
    /// before it takes any lock.
    ///
    /// One throttled committer checkpoints the CIL itself, holding `cil_full` for writing
    /// until its switch has emptied the CIL; the others wait as readers and are let in
    /// together by one wake. Not the background worker: the push threshold asked it long
    /// before, and when threads outnumber CPUs it waits long for a CPU that the committers
    /// have. And not a mutex with a condvar: the woken retake the mutex one after another,
    /// each only once it has a CPU (48 threads on 2 CPUs queued up to 12.8% of a phase's
    /// thread time on the worker's lock that way in `ferrofs bench scale`).
    pub fn throttle(&self) -> Result<()> {
        if !self.cil_at_max() {
            return Ok(());
        }
        self.stats.commit_throttles.fetch_add(1, Relaxed);
        let start = Instant::now();
        let mut result = Ok(());
        while result.is_ok() && self.cil_at_max() {
            result = match self.cil_full.try_write() {
                // Another's checkpoint may have emptied the CIL since.
                Some(full) if self.cil_at_max() => {
                    self.checkpoint_locked(self.push.lock(), Some(full))
                }
                Some(_) => Ok(()),
                None => {
                    drop(self.cil_full.read());
                    self.alive()
                }
            };
        }
        self.stats.throttle_wait_ns.fetch_add(start.elapsed().as_nanos() as u64, Relaxed);
        result
    }

    fn cil_at_max(&self) -> bool {
        self.cil_bytes() >= self.cfg.cil_max_bytes
    }

    /// Wake the background checkpoint. Every commit past the push threshold asks until the
    /// worker has switched the CIL, so the flag keeps all but the first of them off the
    /// worker's lock (which would otherwise be a global lock on the commit path).
    fn request_push(&self) {
        if self.push_pending.load(Relaxed) || self.push_pending.swap(true, AcqRel) {
            return;
        }
        let mut w = self.worker.lock();
        if !w.push_requested {
            w.push_requested = true;
            self.worker_cv.notify_one();
            // The writer too, to take in what the last checkpoints made durable (`ail_worker`).
            w.ail_take_in_requested = true;
            self.ail_cv.notify_one();
        }
    }

    pub fn open_seq(&self) -> u64 {
        self.open_seq.load(Acquire)
    }

    pub fn durable_seq(&self) -> u64 {
        self.durable_seq.load(Acquire)
    }

    /// Make every change of CIL sequence `seq` (and before) durable. Concurrent callers share
    /// one record (group commit): a force whose sequence a checkpoint in flight has already
    /// closed waits for that record instead of writing one.
    pub fn force(&self, seq: u64) -> Result<()> {
        if self.durable_seq() >= seq {
            return Ok(());
        }
        if self.open_seq() <= seq {
            let push = self.push.lock();
            if self.open_seq() <= seq {
                self.stats.forced_checkpoints.fetch_add(1, Relaxed);
                return self.checkpoint_locked(push, None);
            }
        }
        self.stats.forces_joined.fetch_add(1, Relaxed);
        self.wait_durable(seq)
    }

    /// Make every freed extent reusable: force the log, then wait for a writeback that held
    /// some back (before ENOSPC is reported for space a program has just freed).
    pub fn release_busy(&self) -> Result<()> {
        self.force(self.open_seq())?;
        self.ail.wait_writeback();
        Ok(())
    }

    /// Checkpoint whatever the CIL holds now; returns once it is durable.
    pub fn checkpoint(&self) -> Result<()> {
        self.checkpoint_locked(self.push.lock(), None)
    }

    /// Flush data written in place (fsync of a file whose metadata is already durable).
    /// The note of unflushed data stays for the next checkpoint: a record written while this
    /// flush is in progress may map data written before it, and must not pass it.
    pub fn flush_data(&self) -> Result<()> {
        self.dev.flush().or_else(|e| self.fail(e))
    }

    /// Wait until every CIL sequence up to `seq` is durable.
    fn wait_durable(&self, seq: u64) -> Result<()> {
        if self.durable_seq() >= seq {
            return Ok(());
        }
        self.wait_durable_locked(&mut self.done.lock(), seq)
    }

    /// `wait_durable` with `done` held.
    fn wait_durable_locked(&self, done: &mut MutexGuard<'_, ()>, seq: u64) -> Result<()> {
        while self.durable_seq() < seq {
            self.alive()?;
            self.done_cv.wait(done);
        }
        Ok(())
    }

    /// Switch the CIL and claim the record's log space under the push lock, then let the lock
    /// go: the next checkpoint may switch and write while this one builds and writes its
    /// record. Records complete in sequence order (`complete`), so a later record is never
    /// acknowledged, or written home, before an earlier one is durable; recovery replays a
    /// record only if every earlier one is intact, so a later record that reaches the disk
    /// first is never replayed without them. `cil_full` (a throttled committer's) is let go
    /// once the switch has emptied the CIL.
    fn checkpoint_locked(&self, mut push: MutexGuard<'_, PushState>, cil_full: Option<RwLockWriteGuard<'_, ()>>) -> Result<()> {
        self.alive()?;
        let Switched { seq, items, busy, in_flight } = self.switch(&mut push);
        drop(cil_full);
        let written = if items.is_empty() {
            drop(push);
            Ok(None)
        } else {
            self.write_checkpoint(seq, items, push).map(Some)
        };
        let completed = written.and_then(|record| self.complete(seq, record, busy));
        self.in_flight_bytes.fetch_sub(in_flight, Relaxed);
        if let Err(e) = completed {
            // The items have left the CIL and are lost: nothing committed later may reach
            // the log either (it may depend on them), so the journal stops here and the
            // image stays at its last durable checkpoint.
            self.set_failed();
            return Err(e);
        }
        if self.ail.used_percent() >= self.cfg.ail_push_percent {
            self.request_ail();
        }
        Ok(())
    }

    /// Make sequence `seq` durable once every earlier one is: its record (`rec_seq`, bytes)
    /// joins the AIL as durable, its freed extents become reusable, and fsyncs waiting for it
    /// are woken. Whoever sees `durable_seq` past a checkpoint (a force, an ENOSPC retry)
    /// therefore finds its freed space back in the allocator.
    fn complete(&self, seq: u64, record: Option<(u64, SealedImages)>, busy: Vec<BusyExtent>) -> Result<()> {
        let mut done = self.done.lock();
        self.wait_durable_locked(&mut done, seq - 1)?;
        debug_assert_eq!(self.durable_seq() + 1, seq, "CIL sequences complete in order");
        if let Some((rec_seq, record)) = record {
            self.ail.mark_durable(rec_seq, seq, record);
        }
        (self.on_durable)(self.ail.reusable(busy));
        self.durable_seq.store(seq, Release);
        self.done_cv.notify_all();
        Ok(())
    }

    /// Close the open sequence and take its items out of every shard in use, one shard lock at a
    /// time: a committer preempted while it holds one shard delays that shard's switch only,
    /// never commits to the others (holding all the locks at once, a switch waiting for a
    /// preempted committer's shard stalled every shard it already held: with 48 threads on 2
    /// CPUs that was most of the `cil-shard` wait). Commits that read the sequence before the
    /// close finish under their shard's lock before the switch takes that shard; later ones
    /// read the next sequence. Called under the push lock, so switches never overlap.
    /// Each shard gets back as many recycled images of each kind as it copied in the batch
    /// taken (what is left over is freed) and an emptied map for its new batch; this switch's maps
    /// are recycled in turn.
    fn switch(&self, state: &mut PushState) -> Switched {
        let PushState { maps, merged } = state;
        let mut spare = std::mem::take(&mut self.spare.lock().buffers);
        let mut demand = [0; IMAGE_KINDS];
        let seq = self.open_seq.fetch_add(1, SeqCst);
        let mut kept = 0;
        let mut in_flight = 0;
        let taken: Vec<CilBatch> = self
            .shards
            .iter()
            .filter(|slot| slot.active.load(SeqCst))
            .filter_map(|slot| {
                let mut g = slot.shard.lock();
                if g.seq != seq {
                    // Idle until a committer that read the new sequence brought it up to
                    // that: nothing in it belongs to `seq`.
                    debug_assert!(g.seq > seq || (g.open.is_empty() && g.next.is_empty()), "shard at {} skipped by switch {seq}", g.seq);
                    kept += g.free.bytes();
                    return None;
                }
                g.seq = seq + 1;
                let next = std::mem::take(&mut g.next);
                let batch = std::mem::replace(&mut g.open, next);
                // A shard in use (its new batch usually empty yet) starts from a recycled map.
                if !batch.items.is_empty() && g.open.items.capacity() == 0 {
                    g.open.items = maps.pop().unwrap_or_default();
                }
                // Moved, not dropped: the budget counts the items and then their record
                // until the record is in the AIL.
                // Most of the 64 shards are idle: no atomics on the committers' counters for them.
                if batch.bytes > 0 {
                    let counted = 2 * batch.bytes;
                    self.in_flight_bytes.fetch_add(counted, Relaxed);
                    debug_assert!(batch.unpublished <= batch.bytes);
                    self.cil_bytes.fetch_sub(batch.bytes - batch.unpublished, Relaxed);
                    in_flight += counted;
                }
                // Top the shard's buffers up to what this batch used, or trim them to it: a
                // shard that went quiet keeps none. Surplus is freed after the lock.
                let surplus = g.free.fit(batch.copies, &mut spare);
                for (d, c) in demand.iter_mut().zip(batch.copies) {
                    *d += c;
                }
                kept += g.free.bytes();
                if batch.is_empty() && g.open.is_empty() {
                    // Nothing in it and no buffers kept: later switches skip it until a
                    // committer sets the flag again.
                    debug_assert!(g.free.is_empty());
                    slot.active.store(false, SeqCst);
                }
                drop(g);
                drop(surplus);
                Some(batch)
            })
            .collect();
        let mut parked = self.spare.lock();
        parked.buffers.append(&mut spare);
        parked.demand = demand;
        self.recycled_bytes.store((kept + parked.buffers.bytes()) as u64, Relaxed);
        drop(parked);
        let total = taken.iter().map(|b| b.items.len()).sum();
        debug_assert!(merged.is_empty());
        merged.reserve(total);
        let mut busy = Vec::new();
        for mut shard in taken {
            busy.extend(shard.busy);
            for (k, mut it) in shard.items.drain() {
                // The newest image wins, carrying the changes of both shards' commits: all
                // of them happened since the block's previous image in the log.
                match merged.get_mut(&k) {
                    Some(old) if old.version >= it.version => {
                        debug_assert_ne!(old.version, it.version, "{:?}: one version logged twice", k);
                        old.changed |= it.changed;
                    }
                    Some(old) => {
                        it.changed |= old.changed;
                        *old = it;
                    }
                    None => {
                        merged.insert(k, it);
                    }
                }
            }
            if shard.items.capacity() > 0 {
                maps.push(shard.items);
            }
        }
        let mut items: Vec<_> = merged.drain().map(|(key, it)| Checkpointed { key, image: it.image, changed: it.changed }).collect();
        items.sort_unstable_by_key(|it| it.key);
        Switched { seq, items, busy, in_flight }
    }

    /// Claim log space for the record of CIL sequence `seq` under the push lock, then build
    /// and write it without the lock. A block is logged as the chunks that changed since its
    /// previous image in the log, and its header chunk (the seal's lsn and crc), unless all
    /// of it changed. Returns the record's number and its sealed whole images, sorted by home,
    /// for the AIL to write home.
    fn write_checkpoint(&self, seq: u64, items: Vec<Checkpointed>, push: MutexGuard<'_, PushState>) -> Result<(u64, SealedImages)> {
        let bytes: usize = items.iter().map(|it| it.logged()).map(|(k, changed)| logged_bytes(k, changed)).sum();
        let blocks = (RECORD_HDR + bytes).div_ceil(BLOCK_SIZE) as u64;
        let (rec_seq, off, epoch) = self.reserve_log(seq, blocks)?;
        drop(push);
        let sealed: Vec<(ItemKey, Box<[u8]>, ChunkMask)> = items
            .into_iter()
            .map(|it| {
                let (k, changed) = it.logged();
                let mut img = it.image.unwrap_or_default();
                match k {
                    ItemKey::Block(_) => seal_block(&mut img, rec_seq),
                    ItemKey::Inode(_) => DiskInode::seal(&mut img, rec_seq),
                    ItemKey::Revoke(_) => {}
                }
                (k, img, changed)
            })
            .collect();
        // Data noted before the switch is flushed before this record, or before an earlier
        // one (whichever took the note), without which this record is never replayed.
        if self.data_dirty.swap(false, Relaxed) {
            self.dev.flush().or_else(|e| self.fail(e))?;
        }
        let at = (self.ail.ring_start() + off) * BLOCK_SIZE as u64;
        let mut buf = self.take_record_buf();
        let logged = sealed.iter().map(|(k, img, changed)| (*k, &img[..], *changed));
        let written = write_record(&mut buf, self.cfg.record_piece_bytes, rec_seq, epoch, logged, |pos, bytes| self.dev.write_at(bytes, at + pos));
        self.give_record_buf(buf);
        let record_bytes = written.or_else(|e| self.fail(e))?;
        debug_assert_eq!(record_bytes, blocks * BLOCK_SIZE as u64);
        self.dev.flush().or_else(|e| self.fail(e))?;
        self.stats.checkpoints.fetch_add(1, Relaxed);
        self.stats.items_logged.fetch_add(sealed.len() as u64, Relaxed);
        self.stats.log_bytes.fetch_add(record_bytes, Relaxed);
        Ok((rec_seq, sealed.into_iter().map(|(k, img, _)| (k, img)).collect()))
    }

    fn take_record_buf(&self) -> Vec<u8> {
        let mut kept = self.record_buf.lock();
        self.record_buf_bytes.store(0, Relaxed);
        std::mem::take(&mut *kept)
    }

    /// Keep the larger of `buf` and the buffer kept (a record of one piece sizes its buffer
    /// to fit); the other is freed outside the lock.
    fn give_record_buf(&self, mut buf: Vec<u8>) {
        let mut kept = self.record_buf.lock();
        if buf.capacity() > kept.capacity() {
            std::mem::swap(&mut *kept, &mut buf);
            self.record_buf_bytes.store(kept.capacity() as u64, Relaxed);
        }
        drop(kept);
        drop(buf);
    }

    /// Images of records written home, for the shards' next copies (handed out at the next
    /// switch); what does not fit under `spare_max_bytes` is freed, outside the lock.
    fn recycle(&self, images: Vec<Box<[u8]>>) {
        let mut given = Buffers::default();
        for image in images {
            given.put(image);
        }
        let mut surplus = Buffers::default();
        let mut spare = self.spare.lock();
        for (kind, list) in given.kinds.iter_mut().enumerate() {
            let fits = list.len().min(spare.room(kind, self.cfg.spare_max_bytes as usize));
            surplus.kinds[kind] = list.split_off(fits);
            self.recycled_bytes.fetch_add((fits * image_bytes(kind)) as u64, Relaxed);
        }
        spare.buffers.append(&mut given);
        drop(spare);
        drop(surplus);
    }

    /// Space for the record of CIL sequence `seq`, of `blocks`; when the log is full, write
    /// back the oldest checkpoints right here (the tail must move before the head can).
    /// Called under the push lock.
    fn reserve_log(&self, seq: u64, blocks: u64) -> Result<(u64, u64, u64)> {
        if blocks > self.ail.ring_blocks() / 2 {
            return Err(Error::Invalid("checkpoint larger than half the log"));
        }
        let need_free = match self.ail.reserve(blocks) {
            Ok(r) => return Ok(r),
            Err(need_free) => need_free,
        };
        self.stats.log_space_waits.fetch_add(1, Relaxed);
        // Records still in flight hold ring space that writeback cannot free before they are
        // durable: wait for them first.
        self.wait_durable(seq - 1)?;
        self.push_ail(need_free)?;
        // No record is claimed while the push lock is held, and every earlier one is durable:
        // the writeback freed `need_free` blocks, or emptied the AIL, and a record of at most
        // half the ring fits in an empty one wherever the head is.
        let r = self.ail.reserve(blocks);
        debug_assert!(r.is_ok(), "a record of {blocks} blocks does not fit after writeback to {need_free} free blocks");
        r.map_err(|_| Error::Busy("log full after writeback".into()))
    }

    fn request_ail(&self) {
        if self.ail_pending.load(Relaxed) || self.ail_pending.swap(true, AcqRel) {
            return;
        }
        let mut w = self.worker.lock();
        w.ail_requested = true;
        self.ail_cv.notify_one();
    }

    /// Take in the records durable since the last call, then write back the oldest durable
    /// checkpoints until `need_free` blocks of log are free (0: take in only), then move the
    /// tail.
    /// Returns the ring blocks freed.
    fn push_ail(&self, need_free: u64) -> Result<u64> {
        if need_free > 0 {
            self.stats.ail_pushes.fetch_add(1, Relaxed);
        }
        let ail::Pushed { written, freed, images } = self.ail.push(&*self.dev, &self.geo, need_free, &*self.on_durable).or_else(|e| self.fail(e))?;
        self.stats.items_written_home.fetch_add(written, Relaxed);
        self.recycle(images);
        Ok(freed)
    }

    /// The CIL worker's wait: until a push is requested or stop, or `interval` has passed. A
    /// spurious wake is neither a request nor the timer.
    fn wait_push_request(&self, w: &mut MutexGuard<'_, WorkerState>, interval: Duration) {
        let deadline = Instant::now() + interval;
        while !w.push_requested && !w.stop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            self.worker_cv.wait_for(w, left);
        }
    }

    fn cil_worker(&self) {
        loop {
            {
                let mut w = self.worker.lock();
                self.wait_push_request(&mut w, self.cfg.push_interval);
                if w.stop {
                    return;
                }
                w.push_requested = false;
            }
            // Cleared before the switch: a commit that crosses the threshold after it asks
            // again, and the loop comes round for it.
            self.push_pending.store(false, Release);
            if self.cil_bytes.load(Relaxed) > 0 {
                if self.checkpoint().is_ok() {
                    self.stats.background_checkpoints.fetch_add(1, Relaxed);
                }
            } else if let Some(mut state) = self.push.try_lock() {
                // Idle: no switch will come to hand the memory out or trim the shards' buffers.
                *state = PushState::default();
                let spare = std::mem::take(&mut self.spare.lock().buffers);
                drop(spare);
                drop(self.take_record_buf());
                for s in self.shards.iter() {
                    // Taken under the lock, freed after it.
                    let free = std::mem::take(&mut s.shard.lock().free);
                    drop(free);
                }
                self.recycled_bytes.store(0, Relaxed);
            }
        }
    }

    fn ail_worker(&self) {
        loop {
            let (asked, all) = {
                let mut w = self.worker.lock();
                let mut timer = false;
                if !w.ail_requested && !w.ail_take_in_requested && !w.stop {
                    timer = self.ail_cv.wait_for(&mut w, self.cfg.push_interval * 5).timed_out();
                }
                if w.stop {
                    return;
                }
                let (asked, all) = (std::mem::take(&mut w.ail_requested), std::mem::take(&mut w.ail_all_requested));
                w.ail_take_in_requested = false;
                // Taken: a checkpoint past the trigger from now on asks again (one that asked
                // between the take and this store is served by the writeback about to run).
                self.ail_pending.store(false, Release);
                (asked, all || timer)
            };
            // Everything on the timer, so a crash after a quiet period replays almost
            // nothing, and for a cache that wants to drop objects. Asked because the log
            // passed its trigger: back to half the trigger level. Woken by a CIL push: take
            // in the new records only, which drops the images they supersede, and write
            // everything only once the newest images held pass their bound.
            let target = if all {
                self.ail.ring_blocks()
            } else if asked {
                self.ail.ring_blocks() * (100 - self.cfg.ail_push_percent / 2) / 100
            } else {
                0
            };
            if self.push_ail(target).is_err() {
                return;
            }
            if !all && self.ail.held_bytes() >= self.cfg.ail_held_max_bytes && self.push_ail(self.ail.ring_blocks()).is_err() {
                return;
            }
        }
    }

    /// Stop background work, checkpoint everything and write it all home, leaving an empty
    /// log: the next mount replays nothing.
    pub fn shutdown(&self) -> Result<()> {
        {
            let mut w = self.worker.lock();
            w.stop = true;
            self.worker_cv.notify_all();
            self.ail_cv.notify_all();
        }
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
        self.alive()?;
        self.quiesce()
    }

    /// Checkpoint everything and write it all home: the log is empty afterwards and holds no
    /// memory (what unmount, freeze and the memory benchmark want).
    /// Every change of this CIL sequence and before is at its home location: a cache may
    /// drop an object whose last change is that old and read it back from home.
    pub fn home_seq(&self) -> u64 {
        self.ail.home_seq()
    }

    /// Ask the background writer to write the whole log home (caches want to drop objects
    /// that are only dirty because their images are still in the log).
    pub fn request_writeback(&self) {
        let mut w = self.worker.lock();
        (w.push_requested, w.ail_requested, w.ail_all_requested) = (true, true, true);
        self.worker_cv.notify_one();
        self.ail_cv.notify_one();
    }

    pub fn quiesce(&self) -> Result<()> {
        self.checkpoint()?;
        self.push_ail(self.ail.ring_blocks()).map(|_| ())
    }

    /// Bytes the journal holds in memory: the CIL's items, the checkpoints in flight, the
    /// recycled block images and record buffer, and the durable records not yet written home.
    pub fn memory_bytes(&self) -> u64 {
        self.cil_bytes.load(Relaxed) + self.in_flight_bytes.load(Relaxed) + self.recycled_bytes.load(Relaxed) + self.record_buf_bytes.load(Relaxed) + self.ail.held_bytes()
    }

    /// Commits so far, exactly.
    pub fn commits(&self) -> u64 {
        self.shards.iter().map(|s| s.commits.load(Relaxed)).sum()
    }

    /// Commits that went to a shared directory's CIL shard rather than the thread's own
    /// (`Route::Object`), exactly.
    pub fn routed_commits(&self) -> u64 {
        self.shards.iter().map(|s| s.routed.load(Relaxed)).sum()
    }

    /// Bytes of the items the CIL holds (what its bounds are measured against), less what
    /// the shards have not published yet: at most `publish_bytes` each.
    pub fn cil_bytes(&self) -> u64 {
        self.cil_bytes.load(Relaxed)
    }
}

#[cfg(feature = "shuttle")]
type MergedItem = (ItemKey, Option<Box<[u8]>>);

/// What the model checker (`tests/model_check.rs`) looks at: the checkpoint's switch and merge
/// without the log write, and the CIL's byte count.
#[cfg(feature = "shuttle")]
impl Journal {
    /// Close the open sequence as a checkpoint would; returns it and its merged items (a
    /// revoke's image is `None`).
    pub fn switch_for_model(&self) -> (u64, Vec<MergedItem>) {
        let Switched { seq, items, in_flight, .. } = self.switch(&mut PushState::default());
        self.in_flight_bytes.fetch_sub(in_flight, Relaxed);
        (seq, items.into_iter().map(|it| (it.key, it.image)).collect())
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;

    /// The CIL's byte count takes a batch's first bytes at once (the timer's checkpoint looks
    /// for a count above zero), then a step of `publish_bytes` at a time; a checkpoint takes
    /// out exactly what was published, and the commits are counted exactly.
    #[test]
    fn the_cil_count_is_published_in_steps_and_the_commits_exactly() {
        const DEV_BYTES: u64 = 64 << 20;
        let dev = Arc::new(crate::dev::MemDevice::new(DEV_BYTES));
        let geo = crate::mkfs::plan(DEV_BYTES, &crate::MkfsOptions { ag_count: Some(1), ..Default::default() }).unwrap();
        let cfg = JournalConfig { background: false, ..JournalConfig::for_log(geo.log_blocks) };
        let header = LogHeader { gen: 0, epoch: 1, tail_off: 0, tail_seq: 1 };
        let log = geo.ag_layout(0).log;
        dev.write_at(&header.encode(log)[..], log * BLOCK_SIZE as u64).unwrap();
        let j = Journal::start(dev, geo, header, cfg, Box::new(|_| {}));
        let item = item_bytes(ItemKey::Inode(1)) as u64;
        assert!(j.publish_bytes >= 4 * item, "a step of {} bytes", j.publish_bytes);
        let image = [0u8; INODE_SIZE];
        let commit = |ino: u64| j.commit(Route::Thread, |w| w.log(ItemKey::Inode(ino), 1, &image, ALL_CHUNKS));
        commit(1);
        assert_eq!(j.cil_bytes(), item, "a batch's first bytes are published at once");
        let mut n = 1;
        while j.cil_bytes() == item && n < 10_000 {
            n += 1;
            commit(n);
        }
        assert_eq!(n - 1, j.publish_bytes.div_ceil(item), "the next publish comes with a step gathered");
        assert_eq!(j.cil_bytes(), n * item, "and takes in everything gathered");
        commit(n + 1);
        assert_eq!(j.cil_bytes(), n * item);
        j.checkpoint().unwrap();
        assert_eq!(j.cil_bytes(), 0, "the checkpoint took out exactly what was published");
        assert_eq!(j.commits(), n + 1);
    }

    #[test]
    fn recycled_images_are_kept_for_each_kind_as_the_shards_use_them() {
        let image = |len: usize| vec![0u8; len].into_boxed_slice();
        // The last switch's batches copied 2 blocks and 32 inodes: 8 KiB of each.
        let mut spare = Spare { demand: [2, 32], ..Spare::default() };
        assert_eq!((spare.room(0, 16 << 10), spare.room(1, 16 << 10)), (2, 32), "the bytes shared as the demand is");
        spare.buffers.put(image(BLOCK_SIZE));
        spare.buffers.put(image(INODE_SIZE));
        assert_eq!((spare.room(0, 16 << 10), spare.room(1, 16 << 10)), (1, 31));
        assert_eq!(Spare::default().room(1, 16 << 10), 32, "no demand yet: half each");
        // A shard that copied a block and three inodes gets what the spare has of them.
        let mut free = Buffers::default();
        assert!(free.fit([1, 3], &mut spare.buffers).is_empty());
        assert_eq!((free.kinds[0].len(), free.kinds[1].len()), (1, 1));
        assert!(spare.buffers.is_empty());
        // One that went quiet gives its buffers up.
        let surplus = free.fit([0, 0], &mut spare.buffers);
        assert_eq!((surplus.bytes(), free.bytes()), (BLOCK_SIZE + INODE_SIZE, 0));
    }

    #[test]
    fn copy_chunks_copies_exactly_the_masked_chunks() {
        let new: Vec<u8> = (0..BLOCK_SIZE).map(|i| (i % 251) as u8 + 1).collect();
        for mask in [0, 1, 1 << 31, ALL_CHUNKS, 0b1011_0110, 0x8000_0001, 0x7fff_fffe, 0x5555_5555] {
            let mut img = vec![0u8; BLOCK_SIZE];
            copy_chunks(&mut img, &new, mask);
            for c in 0..ChunkMask::BITS as usize {
                let r = c * CHUNK..(c + 1) * CHUNK;
                let want: &[u8] = if mask & (1 << c) != 0 { &new[r.clone()] } else { &[0; CHUNK] };
                assert_eq!(&img[r], want, "mask {mask:#x}, chunk {c}");
            }
        }
    }
}
