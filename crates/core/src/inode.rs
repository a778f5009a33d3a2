//! In-memory inodes and the per-file-system inode cache.
//!
//! Each file system keeps its own cache (seed 004: unmount walks only its own inodes). The
//! decoded inode is the authoritative copy while cached; it is encoded into the journal when
//! a transaction changes it and written home by the AIL.

use crate::cache::{inode_ag, AgCache, CacheBudget};
use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::{ino_ag, DiskInode, Geometry, BLOCK_SIZE, INODE_SIZE};
use crate::lockstat::{LockClass, Mutex, RwLock};
use crate::reclaim::Reclaimable;
use crossbeam_utils::CachePadded;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;

pub static INODE_LOCK: LockClass = LockClass::new("inode");
static ICACHE: LockClass = LockClass::ranked("icache", 70);
static INODE_TABLE: LockClass = LockClass::ranked("inode-table", 75);

/// Laid out (`repr(C)`) with the flags a cache hit touches first, so that behind `Arc`'s
/// counts they share its first cache line: a lookup of a cold inode misses one line less.
#[repr(C)]
pub struct Inode {
    /// Looked up since the last reclaim scan.
    referenced: AtomicBool,
    /// File data was written in place since the last fsync.
    pub data_dirty: AtomicBool,
    pub ino: u64,
    log_version: AtomicU64,
    /// CIL sequence of the last committed change (fsync forces the log up to it).
    pub last_seq: AtomicU64,
    /// CIL sequence of the last change fdatasync must make durable (size, extents).
    pub last_data_seq: AtomicU64,
    /// For a directory: the CIL shard of the thread that changed it last (plus one; 0 for
    /// none) in the low 8 bits, and above them the open CIL sequence when two threads last
    /// changed it in one sequence (`Tx::route_by`). Changed under the lock.
    sharing: AtomicU64,
    pub core: RwLock<DiskInode>,
}

// Right behind `Arc`'s two counts, in the line a hit increments.
const _: () = assert!(std::mem::offset_of!(Inode, referenced) == 0);

pub type InodeRef = Arc<Inode>;

const SHARING_SHARD_BITS: u32 = 8;
const SHARING_SHARD_MASK: u64 = (1 << SHARING_SHARD_BITS) - 1;

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
            sharing: AtomicU64::new(0),
            data_dirty: AtomicBool::new(false),
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

    /// Note that the thread committing to CIL shard `shard` is changing this directory (its
    /// lock held) in open CIL sequence `open`; returns whether two threads changed it in
    /// this sequence or the one before: whether it is shared now. A directory handed from one
    /// thread to another across a checkpoint (a phase of work ending with a sync) is not.
    pub fn note_dir_change(&self, shard: usize, open: u64) -> bool {
        debug_assert!((shard as u64) < SHARING_SHARD_MASK, "shard {shard} does not fit the sharing word");
        let me = shard as u64 + 1;
        let s = self.sharing.load(Relaxed);
        let (last, mut shared_seq) = (s & SHARING_SHARD_MASK, s >> SHARING_SHARD_BITS);
        if last != 0 && last != me && self.last_seq.load(Relaxed) >= open {
            shared_seq = open;
        }
        self.sharing.store(shared_seq << SHARING_SHARD_BITS | me, Relaxed);
        shared_seq != 0 && shared_seq + 1 >= open
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

    /// Its last change is home and no data written in place awaits an fsync (the flag would
    /// be lost). Held inodes need not stay: their references are counted apart (`Holds`),
    /// and an unlinked one is on the orphan list, from where it loads again.
    fn is_clean(&self, home_seq: u64) -> bool {
        self.last_seq.load(Relaxed) <= home_seq && !self.data_dirty.load(Relaxed)
    }
}

/// Bytes one cached inode costs: the inode, its reference count and its map entry.
pub const INODE_COST: u64 = (std::mem::size_of::<Inode>() + 16 + 32) as u64;

pub struct InodeCache {
    map: AgCache<Inode>,
    /// Per AG, the inode table blocks its last loads read (`load`).
    tables: Box<[CachePadded<Mutex<TableBlocks>>]>,
}

/// Inode table blocks kept per AG, direct-mapped by block number.
const TABLE_SLOTS: usize = 4;

/// Inode table blocks that loads read whole: the 15 other inodes of a block are then
/// loaded without a read of their own. Inodes of one directory are mostly allocated in a
/// run, and `rm -rf` and `find` visit them in inode order (a 400,000-file parallel `rm -rf`
/// through FUSE read each from the image on its own, 4% of the daemon's CPU).
///
/// A block read is current, for every inode not in the cache, until writeback next writes
/// home: an inode leaves the cache only once its last change is home, so the block holds
/// its newest image unless writeback wrote it after the read. A block is therefore used only
/// while the journal's `home_seq` is what it was before the block was read.
#[derive(Default)]
struct TableBlocks {
    slots: [Option<TableBlock>; TABLE_SLOTS],
}

struct TableBlock {
    blkno: u64,
    home_seq: u64,
    data: Box<[u8; BLOCK_SIZE]>,
}

impl TableBlocks {
    fn slot(&mut self, blkno: u64) -> &mut Option<TableBlock> {
        &mut self.slots[(blkno % TABLE_SLOTS as u64) as usize]
    }
}

impl InodeCache {
    pub fn new(ag_count: u32, budget: Arc<CacheBudget>) -> InodeCache {
        let tables = (0..ag_count)
            .map(|ag| CachePadded::new(Mutex::new_indexed(&INODE_TABLE, ag.into(), TableBlocks::default())))
            .collect();
        InodeCache { map: AgCache::new(&ICACHE, ag_count, inode_ag, 0, budget), tables }
    }

    pub fn get(&self, ino: u64) -> Option<InodeRef> {
        self.map.get(ino)
    }

    /// The cached inode, reading and verifying it on a miss (the caller has checked that the
    /// number is allocated; `log_version` is where its log versions continue from).
    /// `home_seq`: the journal's, as it is now.
    ///
    /// A copy of the inode may be cached, changed, written home and evicted while we read:
    /// then we would insert an image older than its home, and its change would be lost. Every
    /// such eviction follows a writeback that moved `home_seq` past the change, so the read is
    /// inserted only if `home_seq` is where it was before the read (checked under the lock
    /// eviction takes); otherwise it is read again. A read with `home_seq` unchanged saw every
    /// change of every copy evicted before it (a copy is evicted only once its last change is
    /// home), and a copy evicted after it would have had to be cached, and we return that one.
    pub fn load(
        &self,
        dev: &dyn BlockDevice,
        geo: &Geometry,
        ino: u64,
        log_version: u64,
        home_seq: &dyn Fn() -> u64,
    ) -> Result<InodeRef> {
        loop {
            if let Some(i) = self.map.get(ino) {
                return Ok(i);
            }
            let read_at = home_seq();
            let di = self.read(dev, geo, ino, read_at)?;
            let inode = Inode::new(ino, di, log_version);
            if let Some(i) = self.map.get_or_insert_if(ino, inode, || home_seq() == read_at) {
                return Ok(i);
            }
        }
    }

    /// Read and verify inode `ino` as its home was once everything up to `home_seq` was
    /// written there: from the table block an earlier load read at that `home_seq`, or from
    /// the device.
    fn read(&self, dev: &dyn BlockDevice, geo: &Geometry, ino: u64, home_seq: u64) -> Result<DiskInode> {
        let offset = geo.inode_offset(ino)?;
        let (blkno, at) = (offset / BLOCK_SIZE as u64, offset as usize % BLOCK_SIZE);
        let mut img = [0u8; INODE_SIZE];
        let tables = &self.tables[ino_ag(ino) as usize];
        let kept = match tables.lock().slot(blkno) {
            Some(t) if t.blkno == blkno && t.home_seq == home_seq => {
                img.copy_from_slice(&t.data[at..at + INODE_SIZE]);
                true
            }
            _ => false,
        };
        if !kept {
            let mut data = Box::new([0u8; BLOCK_SIZE]);
            dev.read_at(&mut data[..], blkno * BLOCK_SIZE as u64)?;
            img.copy_from_slice(&data[at..at + INODE_SIZE]);
            // Replaced outside the lock: the old block is freed after it.
            let old = tables.lock().slot(blkno).replace(TableBlock { blkno, home_seq, data });
            drop(old);
        }
        let di = DiskInode::decode(&img, ino, geo)?;
        di.check_counts(geo).map_err(|d| Error::corrupt("inode", ino, d))?;
        Ok(di)
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

    pub fn len(&self) -> u64 {
        self.map.len()
    }

    /// The budget this cache (and the mount's other caches and journal) counts against.
    pub fn budget(&self) -> &Arc<CacheBudget> {
        self.map.budget()
    }

    pub fn reclaim_ag(&self, ag: u32, home_seq: u64) -> Option<u64> {
        self.map.reclaim_ag(ag, home_seq)
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;
    use crate::dev::MemDevice;
    use crate::format::ROOT_INO;
    use crate::mkfs::{mkfs, MkfsOptions};

    /// Write an image of `ino` home, as writeback does: the root's, with `nlink` links.
    fn write_home(dev: &MemDevice, geo: &Geometry, root: &DiskInode, ino: u64, nlink: u32) {
        let mut img = [0u8; INODE_SIZE];
        DiskInode { nlink, ..root.clone() }.encode(ino, 0, &mut img);
        dev.write_at(&img, geo.inode_offset(ino).unwrap()).unwrap();
    }

    /// A fresh image, an empty inode cache, and the root's image as mkfs wrote it.
    fn fresh() -> (MemDevice, Geometry, InodeCache, DiskInode) {
        let dev = MemDevice::new(64 << 20);
        let geo = mkfs(&dev, &MkfsOptions::default(), &|_, _| {}).unwrap().geo;
        let cache = InodeCache::new(geo.ag_count, CacheBudget::new(1 << 30));
        let mut img = [0u8; INODE_SIZE];
        dev.read_at(&mut img, geo.inode_offset(ROOT_INO).unwrap()).unwrap();
        let root = DiskInode::decode(&img, ROOT_INO, &geo).unwrap();
        (dev, geo, cache, root)
    }

    #[test]
    fn a_table_block_read_is_used_until_writeback_writes_home() {
        let (dev, geo, cache, root) = fresh();
        let other = ROOT_INO + 1;
        assert_eq!(
            geo.inode_offset(other).unwrap() / BLOCK_SIZE as u64,
            geo.inode_offset(ROOT_INO).unwrap() / BLOCK_SIZE as u64
        );
        write_home(&dev, &geo, &root, other, 3);
        // Reads the block, `other`'s image with it.
        cache.load(&dev, &geo, ROOT_INO, 0, &|| 5).unwrap();
        write_home(&dev, &geo, &root, other, 4);
        // No writeback since the read: the block is used, not read again.
        let loaded = cache.load(&dev, &geo, other, 0, &|| 5).unwrap();
        assert_eq!(loaded.core.read().nlink, 3);
        cache.remove_if(&loaded);
        // Writeback wrote home since: the block is read again.
        assert_eq!(cache.load(&dev, &geo, other, 0, &|| 6).unwrap().core.read().nlink, 4);
    }

    /// A device that runs `after_read` once, after a read of block `blkno`: another thread's
    /// work landing between a load's read and its insert.
    struct AfterRead<'a> {
        dev: &'a MemDevice,
        blkno: u64,
        after_read: std::sync::Mutex<Option<Box<dyn FnOnce() + Send + 'a>>>,
    }

    impl BlockDevice for AfterRead<'_> {
        fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
            self.dev.read_at(buf, off)?;
            if off / BLOCK_SIZE as u64 == self.blkno {
                let after_read = self.after_read.lock().unwrap().take();
                after_read.into_iter().for_each(|f| f());
            }
            Ok(())
        }
        fn write_at(&self, buf: &[u8], off: u64) -> std::io::Result<()> {
            self.dev.write_at(buf, off)
        }
        fn flush(&self) -> std::io::Result<()> {
            self.dev.flush()
        }
        fn size(&self) -> u64 {
            self.dev.size()
        }
    }

    /// While a load reads an inode's old image, another thread loads it too, changes it,
    /// and writeback writes the change home, after which reclaim evicts that copy. The first
    /// load must not then cache its older image: the change would be lost.
    #[test]
    fn a_load_never_caches_an_image_older_than_a_copy_evicted_meanwhile() {
        let (dev, geo, cache, root) = fresh();
        let ino = ROOT_INO + 1;
        write_home(&dev, &geo, &root, ino, 3);
        let home_seq = AtomicU64::new(5);
        let other_thread = || {
            let copy = Inode::new(ino, DiskInode { nlink: 4, ..root.clone() }, 0);
            cache.insert_new(copy.clone());
            write_home(&dev, &geo, &root, ino, 4);
            home_seq.store(6, Relaxed);
            cache.remove_if(&copy);
        };
        let hooked = AfterRead {
            dev: &dev,
            blkno: geo.inode_offset(ino).unwrap() / BLOCK_SIZE as u64,
            after_read: std::sync::Mutex::new(Some(Box::new(other_thread))),
        };
        let loaded = cache.load(&hooked, &geo, ino, 0, &|| home_seq.load(Relaxed)).unwrap();
        assert_eq!(loaded.core.read().nlink, 4, "cached an image older than the copy evicted during its read");
    }

    fn dir() -> InodeRef {
        Inode::new(
            7,
            DiskInode::new(crate::format::inode::S_IFDIR | 0o755, 0, 0, crate::format::inode::Timespec::default(), 1),
            0,
        )
    }

    /// A directory changed by one thread keeps that thread's shard. Changed by two threads
    /// in one CIL sequence it is shared for the rest of that sequence and the next; handed
    /// from one thread to another across a checkpoint, it is not.
    #[test]
    fn a_directory_is_shared_while_two_threads_change_it() {
        let d = dir();
        let change = |shard, seq| {
            let shared = d.note_dir_change(shard, seq);
            d.note_commit(seq, false);
            shared
        };
        assert!(!change(3, 10));
        assert!(!change(3, 10), "one thread: not shared");
        assert!(!change(5, 11), "another thread after a checkpoint: handed over");
        assert!(change(3, 11), "two threads in one sequence");
        assert!(change(3, 11), "shared for the rest of the sequence");
        assert!(change(3, 12), "and in the next");
        assert!(!change(3, 13), "one thread for a whole sequence: its own shard again");
        assert!(change(63, 13), "the highest shard is a thread too");
    }
}
