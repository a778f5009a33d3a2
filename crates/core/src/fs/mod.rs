//! The embedded file system API: inode-number based, like the kernel's VFS and FUSE's
//! low-level protocol, thread-safe (`Send + Sync`, every method takes `&self`).
//!
//! Locking (docs/DESIGN.md): an operation locks the inodes it changes — in ascending inode
//! number when it needs several — then begins a transaction; AG and CIL locks are taken only
//! inside commit. Inode changes are made on a copy of the inode and stored back only once the
//! transaction committed, so an error leaves the cached inode as it was.

mod atime;
mod attr;
mod copy;
mod data;
mod falloc;
mod namespace;
mod orphan;
mod path;
mod rename;
mod seek;
mod types;

pub use types::*;

use crate::acl::{Acl, AclKind, ACCESS_XATTR, DEFAULT_XATTR};
use crate::dev::BlockDevice;
use crate::dir;
use crate::error::{Error, Result};
use crate::file::{self, MAP_RESERVE};
use crate::format::inode::{
    Timespec, LINK_MAX, MAX_FILE_BLOCKS, SYMLINK_MAX, S_IFCHR, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, S_ISGID,
};
use crate::format::{ino_ag, DiskInode, Extent, Fork, BLOCK_SIZE, ROOT_INO};
use crate::inode::{Inode, InodeRef};
use crate::lockstat::{LockClass, Mutex};
use crate::mkfs::{self, MkfsOptions};
use crate::mount::{Mount, MountOptions};
use crate::store::TxStore;
use crate::trans::Tx;
use crate::xattr;
use smallvec::SmallVec;
use std::cell::Cell;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

static RENAME_LOCK: LockClass = LockClass::ranked("rename", 5);

/// Extents unmapped per transaction when truncating or freeing a file; a larger job runs as
/// several transactions with the inode on the orphan list meanwhile.
const UNMAP_BATCH: usize = 256;
/// Most blocks one fallocate transaction maps (1 GiB); a larger range takes several.
const FALLOC_BATCH: u64 = 1 << 18;
/// Most extents one fallocate transaction maps: bounds the B+tree blocks it must reserve.
const FALLOC_EXTENTS: u64 = 64;
/// Most extents one collapse or insert transaction moves: bounds its B+tree reservation.
/// A file with no more extents past the range than this shifts in one transaction.
const SHIFT_BATCH: usize = 256;
const BS: u64 = BLOCK_SIZE as u64;

/// A mounted ferrofs: every file system operation, addressed by inode number. Made by
/// `mount_device`; `unmount` (or dropping it) leaves a clean log.
pub struct FileSystem {
    m: Arc<Mount>,
    /// Serialises directory renames across directories, so the loop check (is the target
    /// inside the source?) sees a stable tree — the VFS's s_vfs_rename_mutex. Renames of
    /// files and renames within one directory never take it.
    rename_lock: Mutex<()>,
}

fn now() -> Timespec {
    mkfs::now()
}

fn ftype_of(mode: u16) -> u8 {
    ((mode & S_IFMT) >> 12) as u8
}

/// A setgid directory's new entries take its group, and new directories its setgid bit.
fn inherit_setgid(parent: &DiskInode, child: &mut DiskInode) {
    if parent.mode & S_ISGID != 0 {
        child.gid = parent.gid;
        if child.is_dir() {
            child.mode |= S_ISGID;
        }
    }
}

/// Locks on several inodes, taken in ascending inode number (the lock order rule).
/// Inline capacities cover every operation (rename: two parents, source, target): taking
/// the locks allocates nothing.
struct Locked<'a> {
    guards: SmallVec<[(u64, crate::lockstat::RwLockWriteGuard<'a, DiskInode>); 4]>,
}

impl<'a> Locked<'a> {
    fn new(inodes: &[&'a InodeRef]) -> Locked<'a> {
        let mut sorted: SmallVec<[&InodeRef; 4]> = SmallVec::from_slice(inodes);
        sorted.sort_by_key(|inode| inode.ino);
        sorted.dedup_by_key(|inode| inode.ino);
        let locked = Locked { guards: sorted.into_iter().map(|inode| (inode.ino, inode.core.write())).collect() };
        debug_assert!(
            locked.guards.windows(2).all(|pair| pair[0].0 < pair[1].0),
            "inodes locked out of ascending order"
        );
        locked
    }
    fn get(&self, ino: u64) -> &DiskInode {
        &self.guards.iter().find(|(held, _)| *held == ino).expect("inode locked").1
    }
    fn set(&mut self, ino: u64, updated: DiskInode) {
        *self.guards.iter_mut().find(|(held, _)| *held == ino).expect("inode locked").1 = updated;
    }
    /// Whether every one of `inos` is locked here (for the callers' assertions).
    fn holds(&self, inos: &[u64]) -> bool {
        inos.iter().all(|ino| self.guards.iter().any(|(held, _)| held == ino))
    }

    /// Lock `more` as well, keeping the order rule: an inode numbered above every one held is
    /// waited for, a lower one only tried (waiting could close a cycle with a thread that
    /// holds it and waits for one of ours). False if a try failed: the caller then drops
    /// everything and locks in order. This lets an operation look names up under the
    /// directory lock it needs anyway, rather than under a shared hold first: in a busy
    /// directory every extra acquisition is another wait behind its writers.
    fn add(&mut self, more: &[&'a InodeRef]) -> bool {
        let mut sorted: SmallVec<[&InodeRef; 4]> = SmallVec::from_slice(more);
        sorted.sort_by_key(|inode| inode.ino);
        for inode in sorted {
            if self.holds(&[inode.ino]) {
                continue;
            }
            let guard = if self.guards.iter().all(|(held, _)| *held < inode.ino) {
                inode.core.write()
            } else {
                match inode.core.try_write() {
                    Some(guard) => guard,
                    None => return false,
                }
            };
            self.guards.push((inode.ino, guard));
        }
        true
    }
}

impl FileSystem {
    /// Write a new file system on `dev`.
    pub fn mkfs(dev: &dyn BlockDevice, opts: &MkfsOptions) -> Result<()> {
        mkfs::mkfs(dev, opts, &|_, _| {}).map(|_| ())
    }

    /// Mount: recover the log, load the AGs, finish what the orphan list says was in flight.
    /// A read-only mount does it all in memory (its device is an overlay), so it shows
    /// exactly what a read-write mount would; when its orphans cannot be processed it shows
    /// them as they are on disk instead.
    pub fn mount_device(dev: Arc<dyn BlockDevice>, opts: &MountOptions) -> Result<FileSystem> {
        let fs = Self::open_device(dev.clone(), opts)?;
        match fs.process_orphans() {
            Ok(()) => {}
            Err(error) if opts.read_only => {
                eprintln!(
                    "ferrofs: read-only mount: orphans left as they are on disk ({error}); their space counts as used"
                );
                fs.m.seal_read_only(); // dropped without a final checkpoint
                drop(fs);
                let fs = Self::open_device(dev, opts)?;
                fs.m.seal_read_only();
                return Ok(fs);
            }
            Err(error) => return Err(error),
        }
        if opts.read_only {
            fs.m.seal_read_only();
        }
        Ok(fs)
    }

    /// The mount before orphan processing, writable even when read-only (see `seal_read_only`).
    fn open_device(dev: Arc<dyn BlockDevice>, opts: &MountOptions) -> Result<FileSystem> {
        let m = Mount::open(dev, opts)?;
        let fs = FileSystem { m, rename_lock: Mutex::new(&RENAME_LOCK, ()) };
        let root = fs.m.iget(ROOT_INO)?;
        if !root.core.read().is_dir() {
            return Err(Error::corrupt("inode", ROOT_INO, "root is not a directory"));
        }
        Ok(fs)
    }

    /// The mounted image's internals: the engine's integration tests watch its journal and
    /// allocation groups (the `testing` feature); everyone else reads [`FileSystem::stats`].
    #[cfg(feature = "testing")]
    pub fn mount(&self) -> &Arc<Mount> {
        &self.m
    }

    #[cfg(not(feature = "testing"))]
    pub(crate) fn mount(&self) -> &Arc<Mount> {
        &self.m
    }

    /// Checkpoint everything, write it home and leave the log empty.
    pub fn unmount(&self) -> Result<()> {
        self.m.unmount()
    }

    /// Whether an operation that changes the file system would wait before starting now: the
    /// log's in-memory part (CIL) or the caches are over their bounds, and the next
    /// transaction to begin checkpoints or reclaims first, or the file system is frozen. A
    /// hint, true or false a moment later: for a caller that would rather not wait on a
    /// thread that serves others.
    pub fn changes_would_wait(&self) -> bool {
        self.m.journal.cil_at_max() || self.m.icache.budget().is_over() || self.m.try_start_change().is_none()
    }

    /// Freeze the file system (FIFREEZE) until the guard is dropped: changes in progress
    /// finish, new ones wait (they do not fail), and the image on disk becomes a clean
    /// checkpoint with an empty log that nothing writes meanwhile, for a copy of it to be
    /// taken (`ferrofs publish` of a mount). Reads go on; an atime update is skipped.
    pub fn freeze(&self) -> Result<crate::Frozen<'_>> {
        self.m.freeze()
    }

    /// Make every completed operation durable (sync(2)), and the space it freed reusable.
    pub fn sync(&self) -> Result<()> {
        self.m.check_alive()?;
        self.m.release_busy()
    }

    /// Give the free space of the durable state back to the host, as fstrim does: make every
    /// completed free durable and reusable, then punch every free run of at least
    /// `minimum_bytes` (a hole in an image file, a discard on a block device).
    pub fn trim(&self, minimum_bytes: u64) -> Result<crate::discard::TrimReport> {
        self.m.trim(minimum_bytes)
    }

    /// Space and inode counts for statfs(2); cannot fail.
    pub fn statfs(&self) -> StatFs {
        let geo = &self.m.geo;
        let (bfree, ffree) = self.m.ags.iter().fold((0, 0), |(b, f), ag| (b + ag.free_blocks(), f + ag.free_inodes()));
        StatFs {
            blocks: geo.block_count,
            bfree,
            bavail: bfree,
            files: geo.total_inodes(),
            ffree,
            bsize: BLOCK_SIZE as u32,
            namelen: crate::format::NAME_MAX as u32,
        }
    }
}

impl Drop for FileSystem {
    fn drop(&mut self) {
        // An embedded user that forgets to unmount still gets a clean log (best effort).
        if !self.m.is_read_only() && self.m.check_alive().is_ok() {
            let _ = self.m.unmount();
        }
    }
}
