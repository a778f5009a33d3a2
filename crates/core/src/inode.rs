//! In-memory inodes and the per-file-system inode cache.
//!
//! Each file system keeps its own cache (seed 004: unmount walks only its own inodes). The
//! decoded inode is the authoritative copy while cached; it is encoded into the journal when
//! a transaction changes it and written home by the AIL.

use crate::cache::{inode_ag, AgCache, CacheBudget, Reclaimable};
use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::{DiskInode, Geometry, INODE_SIZE};
use crate::lockstat::{LockClass, RwLock};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Arc;

pub static INODE_LOCK: LockClass = LockClass::new("inode");
static ICACHE: LockClass = LockClass::ranked("icache", 70);

/// Laid out (`repr(C)`) with the flags a cache hit touches first, so that behind `Arc`'s
/// counts they share its first cache line: a lookup of a cold inode misses one line less.
#[repr(C)]
pub struct Inode {
    /// Looked up since the last reclaim scan.
    referenced: AtomicBool,
    /// File data was written in place since the last fsync.
    pub data_dirty: AtomicBool,
    /// Open handles; an unlinked inode is freed when the last one closes.
    pub open_count: AtomicU32,
    pub ino: u64,
    log_version: AtomicU64,
    /// CIL sequence of the last committed change (fsync forces the log up to it).
    pub last_seq: AtomicU64,
    /// CIL sequence of the last change fdatasync must make durable (size, extents).
    pub last_data_seq: AtomicU64,
    pub core: RwLock<DiskInode>,
}

// Right behind `Arc`'s two counts, in the line a hit increments.
const _: () = assert!(std::mem::offset_of!(Inode, referenced) == 0);

pub type InodeRef = Arc<Inode>;

impl Inode {
    /// `log_version`: the last log version issued for this inode number (its AG's floor):
    /// this inode's versions continue from there.
    pub fn new(ino: u64, di: DiskInode, log_version: u64) -> InodeRef {
        Arc::new(Inode {
            ino,
            core: RwLock::new_pooled(&INODE_LOCK, di),
            log_version: AtomicU64::new(log_version),
            last_seq: AtomicU64::new(0),
            last_data_seq: AtomicU64::new(0),
            data_dirty: AtomicBool::new(false),
            open_count: AtomicU32::new(0),
            referenced: AtomicBool::new(true),
        })
    }

    /// Next log version; called with the inode lock held, so versions follow commit order.
    pub fn next_log_version(&self) -> u64 {
        self.log_version.fetch_add(1, Relaxed) + 1
    }

    /// The last log version issued (the inode lock is held, so it is stable).
    pub fn log_version(&self) -> u64 {
        self.log_version.load(Relaxed)
    }

    pub fn note_commit(&self, seq: u64, data: bool) {
        self.last_seq.fetch_max(seq, Relaxed);
        if data {
            self.last_data_seq.fetch_max(seq, Relaxed);
        }
    }
}

impl Reclaimable for Inode {
    fn referenced(&self) -> &AtomicBool {
        &self.referenced
    }

    /// Its last change is home, no data written in place awaits an fsync (the flag would
    /// be lost), and no handle is open (an unlinked open inode exists only here).
    fn is_clean(&self, home_seq: u64) -> bool {
        self.last_seq.load(Relaxed) <= home_seq && !self.data_dirty.load(Relaxed) && self.open_count.load(Relaxed) == 0
    }
}

/// Bytes one cached inode costs: the inode, its reference count and its map entry.
pub const INODE_COST: u64 = (std::mem::size_of::<Inode>() + 16 + 32) as u64;

pub struct InodeCache {
    map: AgCache<Inode>,
}

impl InodeCache {
    pub fn new(ag_count: u32, budget: Arc<CacheBudget>) -> InodeCache {
        InodeCache { map: AgCache::new(&ICACHE, ag_count, inode_ag, 0, budget) }
    }

    pub fn get(&self, ino: u64) -> Option<InodeRef> {
        self.map.get(ino)
    }

    /// The cached inode, reading and verifying it on a miss (the caller has checked that the
    /// number is allocated; `log_version` is where its log versions continue from).
    pub fn load(&self, dev: &dyn BlockDevice, geo: &Geometry, ino: u64, log_version: u64) -> Result<InodeRef> {
        if let Some(i) = self.map.get(ino) {
            return Ok(i);
        }
        let mut img = [0u8; INODE_SIZE];
        dev.read_at(&mut img, geo.inode_offset(ino)?)?;
        let di = DiskInode::decode(&img, ino, geo)?;
        di.check_counts(geo).map_err(|d| Error::corrupt("inode", ino, d))?;
        Ok(self.map.get_or_insert(ino, Inode::new(ino, di, log_version)))
    }

    /// A just-allocated inode. It replaces anything cached under its number: only a stale
    /// copy of a freed inode, loaded by a lookup that raced with the free, can be there.
    pub fn insert_new(&self, inode: InodeRef) {
        self.map.replace(inode.ino, inode);
    }

    /// Drop `inode` from the cache unless something else has replaced it there.
    pub fn remove_if(&self, inode: &InodeRef) {
        self.map.remove_if(inode.ino, inode);
    }

    pub fn remove(&self, ino: u64) {
        self.map.remove(ino);
    }

    pub fn len(&self) -> u64 {
        self.map.len()
    }

    /// The budget this cache (and the mount's other caches and journal) counts against.
    pub fn budget(&self) -> &Arc<CacheBudget> {
        self.map.budget()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    pub fn reclaim_ag(&self, ag: u32, home_seq: u64) -> Option<u64> {
        self.map.reclaim_ag(ag, home_seq)
    }
}
