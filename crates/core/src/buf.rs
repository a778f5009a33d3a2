//! A cached metadata block. Who may change a buffer is decided by its owner's lock (the AG
//! lock for AG headers and bitmaps, the inode lock for an inode's B+tree blocks); the buffer's
//! own lock only keeps readers from seeing a half-copied block.

use crate::format::log::ChunkMask;
#[cfg(debug_assertions)]
use crate::format::log::CHUNK;
use crate::format::BLOCK_SIZE;
use crate::reclaim::Reclaimable;
use parking_lot::{RwLock, RwLockReadGuard};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

pub type Block = [u8; BLOCK_SIZE];

/// Laid out (`repr(C)`) with what a cache hit and a node check touch first, so that behind
/// `Arc`'s counts they share its first cache line (as for `Inode`).
#[repr(C)]
pub struct Buf {
    /// Looked up since the last reclaim scan.
    referenced: AtomicBool,
    /// The block's structure (not just its checksum) was validated since it was read or
    /// reinitialised. Later changes keep it valid (asserted where they are made), so a
    /// structure is validated once, not on every access.
    verified: AtomicBool,
    /// Chunks changed since the last commit logged this buffer: what the log must carry of
    /// it. Whoever changes the buffer says what it changed (`change`), under the owner's
    /// lock that the committing transaction holds too.
    changed: AtomicU32,
    pub blkno: u64,
    data: RwLock<Box<Block>>,
    /// Bumped each time a transaction formats this buffer into the CIL; a checkpoint that
    /// finds the same buffer in two per-CPU CIL shards keeps the higher version.
    pub log_version: AtomicU64,
    /// CIL sequence of the last commit that logged this block (0: never logged since read).
    pub last_seq: AtomicU64,
    /// Debug builds: the block as last logged (or read), to check at each commit that every
    /// change was marked. An unmarked change would be lost by a crash.
    #[cfg(debug_assertions)]
    logged: parking_lot::Mutex<Box<Block>>,
}

// Right behind `Arc`'s two counts, in the line a hit increments.
const _: () = assert!(std::mem::offset_of!(Buf, referenced) == 0);

pub type BufRef = Arc<Buf>;

impl Buf {
    pub fn new(blkno: u64, data: Box<Block>) -> BufRef {
        Arc::new(Buf {
            blkno,
            #[cfg(debug_assertions)]
            logged: parking_lot::Mutex::new(data.clone()),
            data: RwLock::new(data),
            log_version: AtomicU64::new(0),
            verified: AtomicBool::new(false),
            last_seq: AtomicU64::new(0),
            referenced: AtomicBool::new(true),
            changed: AtomicU32::new(0),
        })
    }

    pub fn zeroed(blkno: u64) -> BufRef {
        Buf::new(blkno, Box::new([0u8; BLOCK_SIZE]))
    }

    pub fn read(&self) -> RwLockReadGuard<'_, Box<Block>> {
        self.data.read()
    }

    /// Change the block. `f` returns the chunks it changed (`chunks_of`, or `ALL_CHUNKS`),
    /// which the next commit that logs the buffer takes (`take_changed`).
    pub fn change(&self, f: impl FnOnce(&mut [u8]) -> ChunkMask) {
        let changed = f(&mut self.data.write()[..]);
        self.changed.fetch_or(changed, Ordering::Relaxed);
    }

    pub fn is_verified(&self) -> bool {
        self.verified.load(Ordering::Acquire)
    }

    pub fn set_verified(&self, v: bool) {
        self.verified.store(v, Ordering::Release);
    }

    /// The chunks changed since the last call, for the commit that logs `image` (the block's
    /// contents now); the next change starts a new mask.
    pub fn take_changed(&self, image: &Block) -> ChunkMask {
        let changed = self.changed.swap(0, Ordering::Relaxed);
        #[cfg(debug_assertions)]
        {
            let mut logged = self.logged.lock();
            let unmarked = (0..ChunkMask::BITS as usize).find(|&i| {
                changed & (1 << i) == 0 && image[i * CHUNK..(i + 1) * CHUNK] != logged[i * CHUNK..(i + 1) * CHUNK]
            });
            debug_assert!(
                unmarked.is_none(),
                "block {}: chunk {:?} changed but was not marked (mask {changed:#x})",
                self.blkno,
                unmarked
            );
            logged.copy_from_slice(image);
        }
        #[cfg(not(debug_assertions))]
        let _ = image;
        changed
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
