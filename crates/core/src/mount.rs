//! A mounted image: geometry, caches, allocation groups and the journal, and the rules for
//! bringing them up (recovery, then orphan processing) and down (checkpoint, clean log).

use crate::ag::Ag;
use crate::cache::{BufCache, CacheBudget, CacheOwner, BUF_COST, DEFAULT_CACHE_BYTES};
use crate::dev::{BlockDevice, OverlayDevice};
use crate::discard::{self, Discarder, TrimReport};
use crate::error::{Error, Result};
use crate::format::sb::MAGIC_SB;
use crate::format::{ino_ag, ino_index, Geometry, Superblock, BLOCK_SIZE};
use crate::holds::Holds;
use crate::inode::{InodeCache, InodeRef, INODE_COST};
use crate::journal::{recover, BusyExtent, Journal, JournalConfig, RecoveryReport};
use crate::lockstat::{LockClass, RwLock, RwLockReadGuard, RwLockWriteGuard};
use crate::sync::StripedRwLock;
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Weak};

/// The freeze gate (`Mount::start_change`, `Mount::freeze`): taken before anything else, so
/// it ranks below every lock.
static FREEZE: LockClass = LockClass::ranked("freeze", 1);

/// Shared by every change in progress, exclusive while frozen. Striped per CPU: a change
/// takes only its CPU's stripe, so changes on different CPUs write no cache line in common
/// (Linux's per-CPU `sb_start_write`); only a freeze takes every stripe.
type FreezeGate = RwLock<(), StripedRwLock<()>>;

/// A change in progress ([`Mount::start_change`]): a freeze waits until it is dropped.
pub(crate) type Changing<'a> = RwLockReadGuard<'a, (), StripedRwLock<()>>;

/// A frozen file system ([`FileSystem::freeze`](crate::FileSystem::freeze)): its image on
/// disk is a clean checkpoint, with an empty log, that nothing writes until this is dropped.
pub struct Frozen<'a> {
    _gate: RwLockWriteGuard<'a, (), StripedRwLock<()>>,
}

/// How to mount a file system ([`FileSystem::mount_device`](crate::FileSystem::mount_device)).
#[derive(Clone, Debug, Default)]
pub struct MountOptions {
    /// Change nothing on the device: a log left by a crash is replayed in memory, and every
    /// change fails with [`Error::ReadOnly`].
    pub read_only: bool,
    /// Override journal tunables (tests use tiny CILs to exercise wrap-around).
    pub journal: Option<JournalConfig>,
    /// The memory budget of the inode and buffer caches, possibly shared with other mounted
    /// file systems; default: a budget of this mount's own of `DEFAULT_CACHE_BYTES`.
    pub cache: Option<Arc<CacheBudget>>,
    /// When reads and directory listings update access times (`relatime` by default).
    pub atime: AtimeMode,
    /// No access time updates on directories (`nodiratime`), whatever `atime` says.
    pub nodiratime: bool,
    /// Punch the blocks each checkpoint frees once it is durable (`-o discard`), so the
    /// image's host gets them back; ignored read-only.
    pub discard: bool,
    /// Ignore POSIX ACLs (`noacl`): no inheritance of default ACLs, no mode/ACL sync, and
    /// the `system.posix_acl_*` attributes refused (EOPNOTSUPP) as ext4 refuses them.
    pub noacl: bool,
}

/// When an access (a read of a file, a listing of a directory) updates the inode's atime:
/// the kernel's mount flags of the same names (mount(8)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AtimeMode {
    /// `relatime`: only if atime is not later than mtime or ctime, or is a day old or more —
    /// enough for programs that ask "read since last modified?", at one update a day at most
    /// for a file that is only read.
    #[default]
    Relative,
    /// `strictatime`: every access.
    Strict,
    /// `noatime`: never.
    Never,
}

pub struct Mount {
    pub sb: Superblock,
    pub geo: Geometry,
    pub dev: Arc<dyn BlockDevice>,
    pub bufs: BufCache,
    pub ags: Arc<[Ag]>,
    pub journal: Arc<Journal>,
    pub icache: InodeCache,
    pub recovery: RecoveryReport,
    /// Orphans on disk in each AG when the image was opened, before processing (which a
    /// read-only mount does in memory): what `ferrofs info` reports as pending.
    pub orphans_found: Box<[usize]>,
    /// Set once the mount is up: a read-only mount writes into its in-memory overlay until
    /// then, so that orphan processing finishes there what a read-write mount would finish
    /// on disk (`seal_read_only`).
    read_only: AtomicBool,
    /// A read-write mount remounted read-only ([`Mount::remount`]): changes fail with EROFS,
    /// while the journal, its log written home, stays up for a remount read-write.
    writes_refused: AtomicBool,
    dead: AtomicBool,
    /// Benchmark-only switch (see [`Mount::set_orphan_tracking_unsafe`]).
    orphan_tracking: AtomicBool,
    /// References to inodes from outside the engine (`FileSystem::open`, `FileSystem::hold`).
    pub(crate) holds: Holds,
    pub atime: AtimeMode,
    pub nodiratime: bool,
    /// `-o discard`'s thread; freed blocks reach the allocator through it.
    discarder: Option<Discarder>,
    /// Held shared by every change from before its first lock to its last commit, exclusive
    /// by a freeze.
    freeze: FreezeGate,
    /// POSIX ACLs are honoured (no `noacl`).
    pub acl: bool,
}

/// Whether `block` (the start of a device) begins with a ferrofs superblock's magic number,
/// whether or not the rest verifies: what tells a damaged ferrofs image from another format.
pub fn has_superblock_magic(block: &[u8]) -> bool {
    block.len() >= 4 && crate::format::get_u32(block, 0) == MAGIC_SB
}

/// Read the primary superblock, falling back to the copy in AG 1 when the primary is bad.
pub fn read_superblock(dev: &dyn BlockDevice) -> Result<Superblock> {
    let mut b = vec![0u8; BLOCK_SIZE];
    if dev.size() < BLOCK_SIZE as u64 {
        return Err(Error::corrupt("superblock", 0, "device smaller than one block"));
    }
    dev.read_at(&mut b, 0)?;
    let primary = Superblock::decode(&b, 0);
    let sb = match primary {
        Ok(sb) => sb,
        Err(e) => backup_superblock(dev, &b).ok_or(e)?,
    };
    if sb.geo.block_count * BLOCK_SIZE as u64 > dev.size() {
        return Err(Error::corrupt(
            "superblock",
            0,
            format!("image is {} bytes, superblock says {}", dev.size(), sb.geo.block_count * BLOCK_SIZE as u64),
        ));
    }
    Ok(sb)
}

/// The image on `dev` as a read-write mount would find it once its log is replayed and
/// emptied, in memory: `dev` is only read. Returns that view and the log records replayed
/// into it. What a copy of an image that is not to be written is taken from (`ferrofs
/// publish`): the copy needs no replay.
pub fn replayed_in_memory(dev: Arc<dyn BlockDevice>) -> Result<(Arc<dyn BlockDevice>, u64)> {
    let geo = read_superblock(&*dev)?.geo;
    let view: Arc<dyn BlockDevice> = Arc::new(OverlayDevice::new(dev));
    let report = recover(&*view, &geo, false)?;
    if report.records > 0 {
        // Again, writing the emptied log's header this time (the replay is idempotent): a
        // clean log's header stays as it is, so an image without a log to replay reads the
        // same through the view as it is.
        recover(&*view, &geo, true)?;
    }
    Ok((view, report.records))
}

/// The primary is damaged: its AG size may be too, so probe the backup (block 0 of AG 1) at
/// plausible AG sizes: the one the primary records, the one a default mkfs picks for a device
/// of this size, and powers of two.
pub(crate) fn backup_superblock(dev: &dyn BlockDevice, primary: &[u8]) -> Option<Superblock> {
    let hinted = crate::format::get_u64(primary, 56);
    let default = crate::mkfs::plan(dev.size(), &crate::mkfs::MkfsOptions::default()).map_or(0, |g| g.ag_blocks);
    let candidates = [hinted, default].into_iter().chain((8..=24).map(|s| 1u64 << s));
    let mut b = vec![0u8; BLOCK_SIZE];
    for ag_blocks in candidates {
        if ag_blocks == 0 || ag_blocks.checked_mul(BLOCK_SIZE as u64 * 2).is_none_or(|e| e > dev.size()) {
            continue;
        }
        if dev.read_at(&mut b, ag_blocks * BLOCK_SIZE as u64).is_ok() && has_superblock_magic(&b) {
            if let Ok(sb) = Superblock::decode(&b, ag_blocks) {
                if sb.geo.ag_blocks == ag_blocks {
                    return Some(sb);
                }
            }
        }
    }
    None
}

impl Mount {
    /// Mount: verify the superblock, replay the log, load every AG, start the journal.
    /// Orphans are processed by the caller (the file system layer owns inode teardown).
    pub fn open(dev: Arc<dyn BlockDevice>, opts: &MountOptions) -> Result<Arc<Mount>> {
        let sb = read_superblock(&*dev)?;
        let geo = sb.geo;
        let (dev, recovery) = if opts.read_only {
            // Replay into memory so a read-only mount sees the recovered state without writing.
            let overlay: Arc<dyn BlockDevice> = Arc::new(OverlayDevice::new(dev));
            let r = recover(&*overlay, &geo, false)?;
            (overlay, r)
        } else {
            let r = recover(&*dev, &geo, true)?;
            (dev, r)
        };
        let budget = opts.cache.clone().unwrap_or_else(|| CacheBudget::new(DEFAULT_CACHE_BYTES));
        let bufs = BufCache::new(dev.clone(), geo.ag_count, geo.ag_blocks, budget.clone());
        let ags: Arc<[Ag]> = (0..geo.ag_count).map(|a| Ag::load(&bufs, &geo, a)).collect::<Result<Vec<_>>>()?.into();
        let ring_blocks = geo.log_ring_blocks();
        let mut cfg = opts
            .journal
            .clone()
            .unwrap_or_else(|| JournalConfig::for_log(ring_blocks).within_budget(ring_blocks, budget.limit()));
        cfg.background &= !opts.read_only;
        let discarder = (opts.discard && !opts.read_only).then(|| Discarder::start(dev.clone(), ags.clone(), geo));
        let on_durable: Box<dyn Fn(Vec<BusyExtent>) + Send + Sync> = match &discarder {
            Some(d) => Box::new(d.queue_fn()),
            None => {
                let busy_ags = ags.clone();
                Box::new(move |busy: Vec<BusyExtent>| {
                    for e in busy {
                        busy_ags[geo.block_ag(e.blkno) as usize].release_busy(e.blkno, e.len as u64);
                    }
                })
            }
        };
        let journal = Journal::start(dev.clone(), geo, recovery.header, cfg, on_durable);
        let orphans_found = ags.iter().map(|ag| ag.orphans().len()).collect();
        let m = Arc::new(Mount {
            sb,
            geo,
            dev,
            bufs,
            ags,
            journal,
            icache: InodeCache::new(geo.ag_count, budget.clone()),
            recovery,
            orphans_found,
            read_only: AtomicBool::new(false),
            writes_refused: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            orphan_tracking: AtomicBool::new(true),
            holds: Holds::new(),
            atime: opts.atime,
            nodiratime: opts.nodiratime,
            discarder,
            freeze: RwLock::striped_indexed(&FREEZE, 0, ()),
            acl: !opts.noacl,
        });
        budget.join(Arc::downgrade(&m) as Weak<dyn CacheOwner>);
        Ok(m)
    }

    pub fn is_read_only(&self) -> bool {
        self.read_only.load(Relaxed)
    }

    /// **Unsafe for real use; benchmarks only.** With tracking off, no inode is ever added
    /// to an orphan table: a crash during a multi-transaction truncate or while an unlinked
    /// file is open leaks its space (fsck finds it). `ferrofs bench orphan` compares the two
    /// settings to show what orphan tracking costs. On by default.
    #[cfg(feature = "bench-internals")]
    pub fn set_orphan_tracking_unsafe(&self, on: bool) {
        self.orphan_tracking.store(on, Relaxed);
    }

    pub fn orphan_tracking(&self) -> bool {
        self.orphan_tracking.load(Relaxed)
    }

    /// A read-only mount is up (its orphans finished in its overlay, or left as they are):
    /// from now on every change fails with EROFS.
    pub(crate) fn seal_read_only(&self) {
        self.read_only.store(true, Relaxed);
    }

    pub fn check_alive(&self) -> Result<()> {
        if self.dead.load(Relaxed) || self.journal.is_failed() {
            return Err(Error::Io(std::io::Error::from_raw_os_error(libc::EIO)));
        }
        Ok(())
    }

    pub fn check_writable(&self) -> Result<()> {
        if self.refuses_writes() {
            return Err(Error::ReadOnly);
        }
        self.check_alive()
    }

    /// Remount read-only (`true`): from now on every transaction fails with EROFS as it
    /// begins, and the log is checkpointed and written home, so that the image on disk is
    /// clean for as long as this lasts. A transaction that began before the switch may still
    /// commit; the caller (a kernel remount, which waits for no writer and fails while one is
    /// busy) makes sure none is left. `false`: accept changes again. A file system mounted
    /// read-only (its image opened read-only, its log replayed in memory) cannot turn
    /// read-write.
    pub fn remount(&self, read_only: bool) -> Result<()> {
        if self.is_read_only() {
            return if read_only { Ok(()) } else { Err(Error::ReadOnly) };
        }
        self.check_alive()?;
        self.writes_refused.store(read_only, Release);
        if read_only {
            self.journal.quiesce()?;
        }
        Ok(())
    }

    /// Begin a change (an operation that may write the image): held until its last
    /// transaction commits, and taken before any inode lock, so that a change waiting here
    /// for a thaw holds nothing a change in progress may wait for. Waits while frozen.
    pub(crate) fn start_change(&self) -> Changing<'_> {
        self.freeze.read()
    }

    /// [`Mount::start_change`] unless that would wait: for a change that may be skipped (an
    /// atime update), so that a reader never waits for a thaw.
    pub(crate) fn try_start_change(&self) -> Option<Changing<'_>> {
        self.freeze.try_read()
    }

    /// Freeze (Linux's FIFREEZE): wait for every change in progress to finish while new ones
    /// wait to start, then checkpoint, write everything home and flush, so that the image on
    /// disk is a clean checkpoint with an empty log, which stays as it is until the returned
    /// guard is dropped (the thaw). Reads go on. A read-only mount writes nothing: its image
    /// is frozen as it is (a log left by a crash included).
    pub fn freeze(&self) -> Result<Frozen<'_>> {
        let gate = self.freeze.write();
        if !self.is_read_only() {
            self.check_alive()?;
            self.journal.quiesce()?;
            if let Some(d) = &self.discarder {
                d.wait_idle();
            }
            self.dev.flush()?;
        }
        Ok(Frozen { _gate: gate })
    }

    /// Whether changes are refused now: mounted or remounted read-only.
    pub fn refuses_writes(&self) -> bool {
        self.is_read_only() || self.writes_refused.load(Acquire)
    }

    /// Stop all further changes. The on-disk image stays at its last durable checkpoint.
    pub fn shutdown(&self, why: &str) {
        if !self.dead.swap(true, Relaxed) {
            log::error!("shutting down: {}", why);
        }
    }

    /// The inode, if the number is allocated.
    pub fn iget(&self, ino: u64) -> Result<InodeRef> {
        if let Some(i) = self.icache.get(ino) {
            return Ok(i);
        }
        let (agno, idx) = (ino_ag(ino), ino_index(ino));
        if ino == 0 || agno >= self.geo.ag_count || idx >= self.geo.inodes_per_ag {
            return Err(Error::Stale);
        }
        let ag = &self.ags[agno as usize];
        let log_version = ag.inode_log_version_base(idx).ok_or(Error::Stale)?;
        let inode = self.icache.load(&*self.dev, &self.geo, ino, log_version, &|| self.journal.home_seq())?;
        // A free of this number may have run between the check and the insert: then what we
        // loaded is a dead copy and must not stay cached (a create of the number replaces it
        // anyway, see `InodeCache::insert_new`).
        if !ag.inode_in_use(idx) {
            self.icache.remove_if(&inode);
            return Err(Error::Stale);
        }
        Ok(inode)
    }

    /// Checkpoint everything and write it home: the log is empty afterwards. Every later
    /// operation fails with EIO, so nothing can be acknowledged that will not be logged.
    pub fn unmount(&self) -> Result<()> {
        if self.is_read_only() {
            self.dead.store(true, Relaxed);
            return Ok(());
        }
        self.check_alive()?;
        let r = self.journal.shutdown();
        self.dead.store(true, Relaxed);
        r?;
        // The last checkpoints' frees: punched before the device is let go.
        if let Some(d) = &self.discarder {
            d.wait_idle();
            self.dev.flush()?;
        }
        Ok(())
    }

    /// Make every freed extent reusable: force the log, wait for a writeback that held some
    /// back and, under `-o discard`, for their punches.
    pub fn release_busy(&self) -> Result<()> {
        self.journal.release_busy()?;
        if let Some(d) = &self.discarder {
            d.wait_idle();
        }
        Ok(())
    }

    /// Give the free space of the durable state back to the host (`FileSystem::trim`).
    pub fn trim(&self, minimum_bytes: u64) -> Result<TrimReport> {
        self.check_writable()?;
        let _changing = self.start_change();
        self.release_busy()?;
        discard::trim(&*self.dev, &self.ags, minimum_bytes)
    }
}

/// What the shared cache budget sees of this file system: its own caches only (seed 004).
impl CacheOwner for Mount {
    fn cache_bytes(&self) -> u64 {
        self.icache.len() * INODE_COST + self.bufs.len() * BUF_COST
    }

    fn log_bytes(&self) -> u64 {
        self.journal.memory_bytes()
    }

    fn ag_count(&self) -> u32 {
        self.geo.ag_count
    }

    fn reclaim_ag(&self, ag: u32) -> Option<u64> {
        let home = self.journal.home_seq();
        let inodes = self.icache.reclaim_ag(ag, home)?;
        let bufs = self.bufs.reclaim_ag(ag, home).unwrap_or(0);
        Some(inodes * INODE_COST + bufs * BUF_COST)
    }

    fn push_dirty(&self) {
        if !self.is_read_only() {
            self.journal.request_writeback();
        }
    }

    fn write_home(&self) {
        if !self.is_read_only() && self.check_alive().is_ok() {
            // An error has failed the journal: this file system's operations report it.
            let _ = self.journal.quiesce();
        }
    }

    fn home_seq(&self) -> u64 {
        self.journal.home_seq()
    }
}
