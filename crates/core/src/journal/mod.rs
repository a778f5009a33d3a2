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
mod checkpoint;
mod cil;
mod recover;
mod worker;

pub use cil::{BusyExtent, CilWriter, Route};
pub(crate) use recover::read_log_header;
pub use recover::{recover, RecoveryReport};

use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::log::{ItemKey, LogHeader, RECORD_PIECE};
use crate::format::{
    header_lsn, header_magic, verify_block, DiskInode, Geometry, BLOCK_SIZE, INODE_SIZE, MAGIC_AGH, MAGIC_BITMAP,
    MAGIC_BTREE, MAGIC_DATA_META, MAGIC_ORPHAN,
};
use crate::lockstat::{Condvar, LockClass, Mutex};
use ail::Ail;
use checkpoint::PushState;
use cil::{Buffers, CilBatch, CilShard, ShardSlot, Spare};
use crossbeam_utils::CachePadded;
use worker::WorkerState;
// From `crate::sync` so that the model checker (`tests/model_check.rs`) can drive the CIL.
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use crate::sync::{RawRwLock, RwLock};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

static CIL_SHARD: LockClass = LockClass::ranked("cil-shard", 30);
static LOG_PUSH: LockClass = LockClass::ranked("log-push", 10);
static CIL_SPARE: LockClass = LockClass::ranked("cil-spare", 15);
static LOG_RECORD_BUF: LockClass = LockClass::ranked("log-record-buf", 16);
static LOG_DONE: LockClass = LockClass::ranked("log-done", 22);
static LOG_WORKER: LockClass = LockClass::ranked("log-worker", 40);
/// CIL shards (`cil-shard` locks): see `Journal::start`.
const CIL_SHARDS: usize = 64;

/// Counters shown by the benchmarks and `ferrofs lockstat --journal`, with the commit counts
/// that the CIL shards keep (`Journal::counters`).
#[derive(Default, Debug)]
pub struct JournalStats {
    /// Checkpoint records written.
    pub checkpoints: AtomicU64,
    /// Checkpoints the CIL worker made (push threshold or timer) that succeeded.
    pub background_checkpoints: AtomicU64,
    /// Checkpoints an fsync (a force) wrote itself.
    pub forced_checkpoints: AtomicU64,
    /// Items (blocks, inodes, revokes) in the records written.
    pub items_logged: AtomicU64,
    /// Bytes of the records written.
    pub log_bytes: AtomicU64,
    /// Checkpoints that found the log full and wrote back to make room.
    pub log_space_waits: AtomicU64,
    /// Transactions that waited at `throttle` for a full CIL.
    pub commit_throttles: AtomicU64,
    /// Nanoseconds throttled commits waited, in all (a wait for log progress, not for a lock:
    /// lockstat does not see it).
    pub throttle_wait_ns: AtomicU64,
    /// Writebacks asked to free log space (not those that only took records in).
    pub ail_pushes: AtomicU64,
    /// Images written to their home locations.
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
    /// The defaults for a log ring of `ring_blocks` blocks: thresholds in proportion to it,
    /// capped for large logs.
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
        self.ail_push_percent =
            self.ail_push_percent.min((limit / 4 * 100 / ring_bytes.max(1)).max(AIL_PUSH_PERCENT_MIN));
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

/// The magics of the metadata blocks the journal carries. The read path checks a block
/// against the magic its caller expects; the journal knows no block types, so any of these.
const METADATA_MAGICS: [u32; 5] = [MAGIC_AGH, MAGIC_BITMAP, MAGIC_ORPHAN, MAGIC_BTREE, MAGIC_DATA_META];

/// Check a sealed image with the verifiers its reads use (`verify_block`,
/// `DiskInode::decode`): what is sealed into the log, or written home, must read back.
fn verify_sealed(key: ItemKey, image: &[u8], geo: &Geometry) -> Result<()> {
    match key {
        ItemKey::Block(blkno) => {
            let magic = if image.len() == BLOCK_SIZE { header_magic(image) } else { 0 };
            let magic = METADATA_MAGICS
                .into_iter()
                .find(|&m| m == magic)
                .ok_or_else(|| Error::corrupt("logged block", blkno, format!("bad magic {magic:#x}")))?;
            verify_block(image, "logged block", magic, blkno, None)
        }
        ItemKey::Inode(ino) => {
            let image: &[u8; INODE_SIZE] = image
                .try_into()
                .map_err(|_| Error::corrupt("logged inode", ino, format!("an image of {} bytes", image.len())))?;
            DiskInode::decode(image, ino, geo).map(drop)
        }
        ItemKey::Revoke(_) => Ok(()),
    }
}

/// The lsn of `image`, read from byte `off` of the device, if it is the home copy of a
/// logged item and passes its readers' checks: a metadata block, or an inode in its slot.
pub(crate) fn verified_lsn_at(image: &[u8], off: u64, geo: &Geometry) -> Option<u64> {
    type LsnOf = fn(&[u8]) -> u64;
    let (key, lsn_of) = match image.len() {
        BLOCK_SIZE if off.is_multiple_of(BLOCK_SIZE as u64) => {
            (ItemKey::Block(off / BLOCK_SIZE as u64), header_lsn as LsnOf)
        }
        INODE_SIZE => {
            // Its own number, which decoding checks too: the image must be in that slot.
            let ino = crate::format::get_u64(image, 8);
            (geo.inode_offset(ino).ok() == Some(off))
                .then_some((ItemKey::Inode(ino), DiskInode::sealed_lsn as LsnOf))?
        }
        _ => return None,
    };
    verify_sealed(key, image, geo).is_ok().then(|| lsn_of(image))
}

/// In debug builds, panic unless `image` passes `verify_sealed` (`when`: what is about to
/// be done with it). Verified when read, and again before it is sealed or written home, a
/// block damaged in memory is caught where it was damaged, not by the next mount.
#[track_caller]
fn debug_assert_verified(key: ItemKey, image: &[u8], geo: &Geometry, when: &str) {
    if cfg!(debug_assertions) {
        let verified = verify_sealed(key, image, geo);
        debug_assert!(verified.is_ok(), "{key:?} {when}: {verified:?}");
    }
}

/// A mount's journal: the CIL that commits go into, the checkpoints that write it to the log,
/// the AIL that writes the log home, and the background threads that drive them.
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
    /// Counters for the benchmarks and `ferrofs lockstat --journal`.
    pub stats: JournalStats,
}

impl Journal {
    /// Start the journal on an image whose log has been recovered (it is empty: `header`
    /// points its tail at its head).
    pub fn start(
        dev: Arc<dyn BlockDevice>,
        geo: Geometry,
        header: LogHeader,
        mut cfg: JournalConfig,
        on_durable: DurableHook,
    ) -> Arc<Journal> {
        let ring_blocks = geo.log_ring_blocks();
        cfg.cil_max_bytes = cfg.cil_max_bytes.min(ring_blocks * BLOCK_SIZE as u64 / 4);
        let publish_bytes = (cfg.cil_max_bytes / (4 * CIL_SHARDS as u64)).min(16 << 10);
        // As many shards whatever the CPUs: threads are mapped to shards by their index, so
        // threads, not CPUs, share a shard. (Eight per CPU, 16 on 2 CPUs, had 48 threads share
        // each three ways: a holder preempted there held up its sharers and the AG lock they
        // held, and `ferrofs bench scale` counted ten times the shard contentions and twice
        // the AG wait of 64 shards.) A switch visits those in use, a lock each (`ShardSlot`).
        let shard =
            || CilShard { seq: 1, open: CilBatch::default(), next: CilBatch::default(), free: Buffers::default() };
        let shards = (0..CIL_SHARDS)
            .map(|i| {
                CachePadded::new(ShardSlot {
                    active: AtomicBool::new(false),
                    commits: AtomicU64::new(0),
                    routed: AtomicU64::new(0),
                    shard: Mutex::new_indexed(&CIL_SHARD, i as u64, shard()),
                })
            })
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

    /// The geometry of the file system the journal logs.
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

    /// The open CIL sequence: what a commit made now belongs to.
    pub fn open_seq(&self) -> u64 {
        self.open_seq.load(Acquire)
    }

    /// Every CIL sequence up to this one is durable in the log.
    pub fn durable_seq(&self) -> u64 {
        self.durable_seq.load(Acquire)
    }

    /// Every change of this CIL sequence and before is at its home location: a cache may
    /// drop an object whose last change is that old and read it back from home.
    pub fn home_seq(&self) -> u64 {
        self.ail.home_seq()
    }

    /// Bytes the journal holds in memory: the CIL's items, the checkpoints in flight, the
    /// recycled block images and record buffer, and the durable records not yet written home.
    pub fn memory_bytes(&self) -> u64 {
        self.cil_bytes.load(Relaxed)
            + self.in_flight_bytes.load(Relaxed)
            + self.recycled_bytes.load(Relaxed)
            + self.record_buf_bytes.load(Relaxed)
            + self.ail.held_bytes()
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
