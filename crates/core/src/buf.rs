//! A cached metadata block. Who may change a buffer is decided by its owner's lock (the AG
//! lock for AG headers and bitmaps, the inode lock for an inode's B+tree blocks); the buffer's
//! own lock only keeps readers from seeing a half-copied block.

use crate::cache::Reclaimable;
use crate::format::BLOCK_SIZE;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

pub type Block = [u8; BLOCK_SIZE];

pub struct Buf {
    pub blkno: u64,
    data: RwLock<Box<Block>>,
    /// Bumped each time a transaction formats this buffer into the CIL; a checkpoint that
    /// finds the same buffer in two per-CPU CIL shards keeps the higher version.
    pub log_version: AtomicU64,
    /// The block's structure (not just its checksum) was validated since it was read or
    /// reinitialised. Later changes keep it valid (asserted where they are made), so a
    /// structure is validated once, not on every access.
    verified: AtomicBool,
    /// CIL sequence of the last commit that logged this block (0: never logged since read).
    pub last_seq: AtomicU64,
    /// Looked up since the last reclaim scan.
    referenced: AtomicBool,
}

pub type BufRef = Arc<Buf>;

impl Buf {
    pub fn new(blkno: u64, data: Box<Block>) -> BufRef {
        Arc::new(Buf {
            blkno,
            data: RwLock::new(data),
            log_version: AtomicU64::new(0),
            verified: AtomicBool::new(false),
            last_seq: AtomicU64::new(0),
            referenced: AtomicBool::new(true),
        })
    }

    pub fn zeroed(blkno: u64) -> BufRef {
        Buf::new(blkno, Box::new([0u8; BLOCK_SIZE]))
    }

    pub fn read(&self) -> RwLockReadGuard<'_, Box<Block>> {
        self.data.read()
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, Box<Block>> {
        self.data.write()
    }

    pub fn is_verified(&self) -> bool {
        self.verified.load(Ordering::Acquire)
    }

    pub fn set_verified(&self, v: bool) {
        self.verified.store(v, Ordering::Release);
    }

    pub fn next_log_version(&self) -> u64 {
        self.log_version.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn note_commit(&self, seq: u64) {
        self.last_seq.fetch_max(seq, Ordering::Relaxed);
    }
}

impl Reclaimable for Buf {
    fn referenced(&self) -> &AtomicBool {
        &self.referenced
    }

    /// Written home: a reload reads exactly this block. (Its log version may then restart,
    /// which is safe: no image of it is left in the log to outrank.)
    fn is_clean(&self, home_seq: u64) -> bool {
        self.last_seq.load(Ordering::Relaxed) <= home_seq
    }
}
