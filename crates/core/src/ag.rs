//! Allocation groups: each AG allocates its own inodes, blocks and orphan slots under its
//! own lock, so creators in different AGs never meet (seed 001, seed 003's per-AG design).
//!
//! Two views of each bitmap: the in-memory map says what may be handed out (it includes
//! claims of transactions still running and blocks freed by checkpoints not yet durable);
//! the on-disk bitmap blocks say what is committed and change only at transaction commit.
//! A claim finds a free bit and sets it in one pass under the AG lock — never the
//! test/lock/retest loop seed 001 removed — so allocation never retries.

use crate::buf::BufRef;
use crate::cache::BufCache;
use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::log::chunks_of;
use crate::format::{
    self, AgLayout, Geometry, BITMAP_BITS, HDR_SIZE, MAGIC_AGH, MAGIC_BITMAP, MAGIC_ORPHAN, ORPHAN_SLOTS_PER_BLOCK,
    ROOT_INO,
};
use crate::lockstat::{LockClass, Mutex, MutexGuard};
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

pub static AG_LOCK: LockClass = LockClass::ranked("ag", 25);

/// The pooled blocks of an AG (`Ag::reserve`): 1/64 of it, at most 1,024 blocks (4 MiB),
/// enough for the tree blocks of thousands of extent splits.
const POOL_FRACTION: u64 = 64;
const POOL_MAX: u64 = 1024;

/// In-memory allocation state of one AG, protected by the AG lock.
pub struct AgState {
    blocks: Bitmap,
    inodes: Bitmap,
    orphan_free: Vec<u32>,
    reserved_blocks: u64,
    /// Blocks freed by committed transactions whose checkpoint is not yet durable: still
    /// set in `blocks`, but free on disk once it is (`release_busy`), so statfs counts them
    /// free and a reservation that finds no space forces the log (`Tx::reserve`).
    busy_blocks: u64,
    block_cursor: u64,
    inode_cursor: u64,
    next_generation: u32,
}

pub struct Ag {
    pub layout: AgLayout,
    state: Mutex<AgState>,
    block_bitmap: Vec<BufRef>,
    inode_bitmap: Vec<BufRef>,
    orphan_table: Vec<BufRef>,
    /// Blocks ordinary reservations leave free (`reserve`): the pool from which writes into
    /// preallocated space and operations that free space get their B+tree blocks on a full
    /// file system.
    pool: u64,
    /// Mirrors of the free counts for statfs, which must not take AG locks (blocks: busy
    /// ones included, reserved ones and the pool, which no program can fill, left out).
    free_blocks: AtomicU64,
    free_inodes: AtomicU64,
    /// A mirror of the in-memory inode bitmap, changed under the lock with it, read without
    /// it: a lookup that misses the inode cache checks its number here (`inode_in_use`,
    /// `inode_log_version_base`). Read under the lock, two acquisitions per miss made the AG
    /// lock a lock of the lookup path (48 threads stating 1.44 million files through a cache
    /// that holds half of them waited there 2.6% of their time).
    inodes_in_use: Box<[AtomicU64]>,
    /// The highest log version any inode of this AG had when it was freed. A new in-memory
    /// inode counts its log versions on from here, never from 0: the CIL keeps the highest
    /// version of an item, so a reused inode number's images must outrank the ones the freed
    /// inode may have left in the same checkpoint.
    /// Written under the lock, read without it by lookups.
    inode_log_version_floor: AtomicU64,
    pub alloc_retries: AtomicU64,
    /// Inodes put on this AG's orphan table (committed adds), for the benchmarks.
    #[cfg(feature = "bench-internals")]
    pub orphan_adds: AtomicU64,
}

/// A plain bitmap with a free count, one bit per block or inode of the AG.
pub struct Bitmap {
    words: Vec<u64>,
    len: u64,
    free: u64,
}

impl Bitmap {
    fn new(len: u64) -> Bitmap {
        let mut words = vec![0; len.div_ceil(64) as usize];
        if !len.is_multiple_of(64) {
            // Bits past the end read as used, so searches never return them.
            *words.last_mut().unwrap() = !0u64 << (len % 64);
        }
        Bitmap { words, len, free: len }
    }
    pub fn get(&self, i: u64) -> bool {
        self.words[(i / 64) as usize] >> (i % 64) & 1 == 1
    }
    fn set(&mut self, i: u64) {
        debug_assert!(!self.get(i), "bit {} already set", i);
        self.words[(i / 64) as usize] |= 1 << (i % 64);
        self.free -= 1;
    }
    fn clear(&mut self, i: u64) {
        debug_assert!(self.get(i), "bit {} already clear", i);
        self.words[(i / 64) as usize] &= !(1 << (i % 64));
        self.free += 1;
    }
    /// First clear bit at or after `from`, wrapping once; a word at a time.
    fn find_clear(&self, from: u64) -> Option<u64> {
        if self.free == 0 {
            return None;
        }
        self.next_clear(from).or_else(|| self.next_clear(0))
    }
    /// First clear bit at or after `from`, without wrapping; a word at a time.
    fn next_clear(&self, from: u64) -> Option<u64> {
        if from >= self.len {
            return None;
        }
        let first = (from / 64) as usize;
        let masked = self.words[first] | ((1u64 << (from % 64)) - 1);
        let rest = (first + 1..self.words.len()).map(|w| (w, self.words[w]));
        std::iter::once((first, masked))
            .chain(rest)
            .find(|(_, word)| *word != u64::MAX)
            .map(|(w, word)| w as u64 * 64 + (!word).trailing_zeros() as u64)
    }
    fn run_len(&self, start: u64, max: u64) -> u64 {
        let mut n = 0;
        while n < max && start + n < self.len && !self.get(start + n) {
            n += 1;
        }
        n
    }
    pub fn free(&self) -> u64 {
        self.free
    }
}

fn disk_bit(bufs: &[BufRef], i: u64) -> (usize, usize, u8) {
    debug_assert!(((i / BITMAP_BITS) as usize) < bufs.len());
    let rem = i % BITMAP_BITS;
    ((i / BITMAP_BITS) as usize, HDR_SIZE + (rem / 8) as usize, 1 << (rem % 8))
}

/// Load a bitmap's blocks and build its in-memory copy.
fn load_bitmap(cache: &BufCache, start: u64, nblocks: u64, len: u64, owner: u64) -> Result<(Vec<BufRef>, Bitmap)> {
    let bufs: Vec<BufRef> =
        (start..start + nblocks).map(|b| cache.read(b, "bitmap", MAGIC_BITMAP, Some(owner))).collect::<Result<_>>()?;
    let mut map = Bitmap::new(len);
    for i in 0..len {
        let (b, byte, mask) = disk_bit(&bufs, i);
        if bufs[b].read()[byte] & mask != 0 {
            map.set(i);
        }
    }
    Ok((bufs, map))
}

/// Where an AG's directory blocks go: its last sixteenth, apart from file data, which fills
/// the AG from its start. A directory read then touches few regions of the image, and a
/// published image's metadata sits in few chunks (btrfs keeps metadata in block groups of
/// its own for the same reason). A zone that fills spills over to wherever blocks are free.
pub fn index_goal(l: &AgLayout) -> u64 {
    (l.start + l.blocks - l.blocks / 16).max(l.data_start)
}

impl Ag {
    pub fn load(cache: &BufCache, geo: &Geometry, agno: u32) -> Result<Ag> {
        let l = geo.ag_layout(agno);
        let hdr = cache.read(l.header, "AG header", MAGIC_AGH, Some(agno as u64))?;
        {
            let h = hdr.read();
            let (blocks, inodes) =
                (format::get_u64(&h[..], format::agh::BLOCKS), format::get_u32(&h[..], format::agh::INODES));
            if !format::agh::blocks_fit(blocks, l.blocks)
                || inodes != geo.inodes_per_ag
                || format::get_u32(&h[..], format::agh::AGNO) != agno
            {
                return Err(Error::corrupt("AG header", l.header, "geometry disagrees with the superblock"));
            }
        }
        let (block_bitmap, blocks) = load_bitmap(cache, l.block_bitmap, l.block_bitmap_blocks, l.blocks, agno as u64)?;
        let (inode_bitmap, mut inodes) =
            load_bitmap(cache, l.inode_bitmap, l.inode_bitmap_blocks, geo.inodes_per_ag as u64, agno as u64)?;
        if agno == 0 {
            // Inode 0 ("no inode") and the root are never handed out, whatever the on-disk
            // bitmap says: trusting a bitmap that marks them free would give a new file the
            // number 0 or the root's number. The bad bits stay for fsck to report.
            for idx in [0, format::ino_index(ROOT_INO) as u64] {
                if !inodes.get(idx) {
                    inodes.set(idx);
                }
            }
        }
        if (0..l.data_start - l.start).any(|i| !blocks.get(i)) {
            return Err(Error::corrupt("bitmap", l.block_bitmap, "AG metadata blocks marked free"));
        }
        let orphan_table: Vec<BufRef> = (l.orphan_table..l.orphan_table + l.orphan_blocks)
            .map(|b| cache.read(b, "orphan table", MAGIC_ORPHAN, Some(agno as u64)))
            .collect::<Result<_>>()?;
        let mut orphan_free = Vec::new();
        for (bi, b) in orphan_table.iter().enumerate().rev() {
            let d = b.read();
            for s in (0..ORPHAN_SLOTS_PER_BLOCK as usize).rev() {
                if format::get_u64(&d[..], HDR_SIZE + 8 * s) == 0 {
                    orphan_free.push((bi as u64 * ORPHAN_SLOTS_PER_BLOCK + s as u64) as u32);
                }
            }
        }
        let state = AgState {
            reserved_blocks: 0,
            busy_blocks: 0,
            block_cursor: l.data_start - l.start,
            inode_cursor: 0,
            next_generation: (l.start as u32).wrapping_mul(2_654_435_761) ^ std::process::id(),
            orphan_free,
            blocks,
            inodes,
        };
        let pool = (l.blocks / POOL_FRACTION).min(POOL_MAX);
        let inodes_in_use = state.inodes.words.iter().map(|&w| AtomicU64::new(w)).collect();
        let ag = Ag {
            inodes_in_use,
            inode_log_version_floor: AtomicU64::new(0),
            free_blocks: AtomicU64::new(0),
            pool,
            free_inodes: AtomicU64::new(0),
            layout: l,
            state: Mutex::new_indexed(&AG_LOCK, agno as u64, state),
            block_bitmap,
            inode_bitmap,
            orphan_table,
            alloc_retries: AtomicU64::new(0),
            #[cfg(feature = "bench-internals")]
            orphan_adds: AtomicU64::new(0),
        };
        ag.sync_counts(&ag.lock());
        Ok(ag)
    }

    pub fn lock(&self) -> MutexGuard<'_, AgState> {
        self.state.lock()
    }

    /// Blocks kept back for pooled reservations (`reserve`); statfs does not count them free.
    pub fn pool(&self) -> u64 {
        self.pool
    }

    pub fn free_blocks(&self) -> u64 {
        self.free_blocks.load(Relaxed)
    }

    pub fn free_inodes(&self) -> u64 {
        self.free_inodes.load(Relaxed)
    }

    fn sync_counts(&self, s: &AgState) {
        debug_assert!(
            s.blocks.free() + s.busy_blocks <= self.layout.blocks,
            "busy blocks are a part of the claimed ones"
        );
        self.free_blocks
            .store((s.blocks.free() + s.busy_blocks).saturating_sub(s.reserved_blocks + self.pool), Relaxed);
        self.free_inodes.store(s.inodes.free(), Relaxed);
    }

    /// Claim a free inode (one pass under the lock) and reserve `blocks` blocks for the
    /// transaction's B+tree splits in the same critical section. Returns (index, generation,
    /// the log version the new in-memory inode starts counting from).
    pub fn claim_inode(&self, blocks: u64) -> Option<(u32, u32, u64)> {
        let mut s = self.lock();
        if s.blocks.free() < s.reserved_blocks + blocks + self.pool {
            return None;
        }
        let from = s.inode_cursor;
        let idx = s.inodes.find_clear(from)?;
        s.inodes.set(idx);
        self.mirror_inode_bit(&s, idx);
        s.inode_cursor = idx + 1;
        s.reserved_blocks += blocks;
        s.next_generation = s.next_generation.wrapping_add(1);
        let gen = s.next_generation;
        self.sync_counts(&s);
        Some((idx as u32, gen, self.inode_log_version_floor.load(Relaxed)))
    }

    /// Reserve `n` blocks without choosing them (B+tree splits, extent allocation). Only a
    /// `pooled` reservation may take the AG's last `pool` blocks: one for the tree blocks of
    /// a write into preallocated space (fallocate promised that write its space: XFS's
    /// reserved block pool, ext4's reserved clusters) or of an operation that frees space
    /// (a punch or truncate may split an extent; deleting must work on a full file system).
    pub fn reserve(&self, n: u64, pooled: bool) -> bool {
        let mut s = self.lock();
        let keep = if pooled { 0 } else { self.pool };
        if s.blocks.free() < s.reserved_blocks + n + keep {
            return false;
        }
        s.reserved_blocks += n;
        self.sync_counts(&s);
        true
    }

    pub fn unreserve(&self, s: &mut AgState, n: u64) {
        debug_assert!(s.reserved_blocks >= n);
        s.reserved_blocks -= n;
        self.sync_counts(s);
    }

    /// The block after the last one claimed: the goal of an allocation that has no
    /// neighbour to follow (a new file's first blocks).
    pub fn block_goal(&self) -> u64 {
        self.layout.start + self.lock().block_cursor
    }

    /// Claim up to `max_len` contiguous blocks at or after `goal` (absolute), consuming the
    /// same number of reserved blocks. Returns (absolute start, len). A claim for file data
    /// moves the cursor ([`Ag::block_goal`]); a directory block's does not, so that the next
    /// file's data does not follow it into the index zone ([`index_goal`]).
    pub fn claim_blocks(&self, goal: u64, max_len: u64, data: bool) -> Option<(u64, u64)> {
        let mut s = self.lock();
        let rel_goal = if goal >= self.layout.start && goal < self.layout.start + self.layout.blocks {
            goal - self.layout.start
        } else {
            s.block_cursor
        };
        let start = s.blocks.find_clear(rel_goal)?;
        let len = s.blocks.run_len(start, max_len.min(s.reserved_blocks));
        if len == 0 {
            return None;
        }
        for i in start..start + len {
            s.blocks.set(i);
        }
        s.reserved_blocks -= len;
        if data {
            s.block_cursor = start + len;
        }
        self.sync_counts(&s);
        Some((self.layout.start + start, len))
    }

    /// Undo claims of a transaction that did not commit.
    pub fn unclaim_blocks(&self, s: &mut AgState, start: u64, len: u64) {
        for i in start - self.layout.start..start - self.layout.start + len {
            s.blocks.clear(i);
        }
        self.sync_counts(s);
    }

    pub fn unclaim_inode(&self, s: &mut AgState, idx: u32) {
        s.inodes.clear(idx as u64);
        self.mirror_inode_bit(s, idx as u64);
        self.sync_counts(s);
    }

    /// Copy the word of inode bit `idx` to the lock-free mirror (the lock is held: `s`).
    /// Release: a lookup that sees the bit set sees the version floor of its claim.
    fn mirror_inode_bit(&self, s: &AgState, idx: u64) {
        let w = (idx / 64) as usize;
        self.inodes_in_use[w].store(s.inodes.words[w], Release);
    }

    pub fn claim_orphan_slot(&self) -> Option<u32> {
        self.lock().orphan_free.pop()
    }

    pub fn unclaim_orphan_slot(&self, s: &mut AgState, slot: u32) {
        s.orphan_free.push(slot);
    }

    /// Commit-time allocation in the on-disk inode bitmap; returns the block to log.
    pub fn alloc_disk_inode(&self, idx: u32) -> BufRef {
        Self::set_disk_bits(&self.inode_bitmap, idx as u64, 1, true)
    }

    /// Commit-time free of an inode whose last log version was `log_version`; the number may
    /// be claimed again at once, by an inode that counts its versions on from there. Returns
    /// the block to log.
    pub fn free_disk_inode(&self, s: &mut AgState, idx: u32, log_version: u64) -> BufRef {
        self.inode_log_version_floor.fetch_max(log_version, Relaxed);
        self.unclaim_inode(s, idx);
        Self::set_disk_bits(&self.inode_bitmap, idx as u64, 1, false)
    }

    /// Commit-time free of blocks: cleared in the on-disk bitmap, but busy (still claimed in
    /// memory) until the freeing checkpoint is durable (`release_busy`). Returns the blocks
    /// to log.
    pub fn free_disk_blocks(&self, s: &mut AgState, start: u64, len: u64) -> Vec<BufRef> {
        s.busy_blocks += len;
        self.sync_counts(s);
        self.set_disk_blocks(start, len, false)
    }

    /// Commit-time change of the on-disk block bitmap; returns the blocks to log.
    pub fn set_disk_blocks(&self, start: u64, len: u64, used: bool) -> Vec<BufRef> {
        let rel = start - self.layout.start;
        let mut out: Vec<BufRef> = Vec::new();
        let mut i = rel;
        while i < rel + len {
            let n = (BITMAP_BITS - i % BITMAP_BITS).min(rel + len - i);
            let b = Self::set_disk_bits(&self.block_bitmap, i, n, used);
            if !out.iter().any(|o| o.blkno == b.blkno) {
                out.push(b);
            }
            i += n;
        }
        out
    }

    /// The first of `[start, start + len)` (absolute) that the on-disk block bitmap marks
    /// free, if any. Called under the AG lock (`_s`), before a commit frees the range.
    pub fn first_disk_free(&self, _s: &AgState, start: u64, len: u64) -> Option<u64> {
        let rel = start - self.layout.start;
        let mut i = rel;
        while i < rel + len {
            let n = (BITMAP_BITS - i % BITMAP_BITS).min(rel + len - i);
            let (bi, _, _) = disk_bit(&self.block_bitmap, i);
            let d = self.block_bitmap[bi].read();
            if let Some(free) = (i..i + n).find(|&j| {
                let (_, byte, mask) = disk_bit(&self.block_bitmap, j);
                d[byte] & mask == 0
            }) {
                return Some(self.layout.start + free);
            }
            i += n;
        }
        None
    }

    /// The on-disk bitmap block holding absolute block `blkno`'s bit (for error reports).
    pub fn block_bitmap_blkno(&self, blkno: u64) -> u64 {
        self.block_bitmap[disk_bit(&self.block_bitmap, blkno - self.layout.start).0].blkno
    }

    /// Flip bits that are known to hold the opposite value: allocations come from the
    /// in-memory map, which marks everything the disk does, and a commit checks the blocks
    /// it frees first (`Tx::check_frees`).
    fn set_disk_bits(bufs: &[BufRef], first: u64, n: u64, used: bool) -> BufRef {
        let (bi, first_byte, _) = disk_bit(bufs, first);
        let (_, last_byte, _) = disk_bit(bufs, first + n - 1);
        bufs[bi].change(|d| {
            for i in first..first + n {
                let (b, byte, mask) = disk_bit(bufs, i);
                debug_assert_eq!(b, bi);
                debug_assert_eq!(d[byte] & mask != 0, !used, "on-disk bit {} already {}", i, used);
                if used {
                    d[byte] |= mask;
                } else {
                    d[byte] &= !mask;
                }
            }
            chunks_of(first_byte..last_byte + 1)
        });
        bufs[bi].clone()
    }

    /// Commit-time change of an orphan slot; returns the block to log.
    pub fn set_disk_orphan(&self, s: &mut AgState, slot: u32, ino: u64) -> BufRef {
        let b = &self.orphan_table[(slot as u64 / ORPHAN_SLOTS_PER_BLOCK) as usize];
        let off = HDR_SIZE + 8 * (slot as u64 % ORPHAN_SLOTS_PER_BLOCK) as usize;
        b.change(|d| {
            format::put_u64(d, off, ino);
            chunks_of(off..off + 8)
        });
        if ino == 0 {
            s.orphan_free.push(slot);
        } else {
            #[cfg(feature = "bench-internals")]
            self.orphan_adds.fetch_add(1, Relaxed);
        }
        b.clone()
    }

    /// Inode numbers on this AG's orphan list (mount-time processing and fsck).
    pub fn orphans(&self) -> Vec<(u32, u64)> {
        let mut out = Vec::new();
        for (bi, b) in self.orphan_table.iter().enumerate() {
            let d = b.read();
            for s in 0..ORPHAN_SLOTS_PER_BLOCK as usize {
                let ino = format::get_u64(&d[..], HDR_SIZE + 8 * s);
                if ino != 0 {
                    out.push(((bi as u64 * ORPHAN_SLOTS_PER_BLOCK + s as u64) as u32, ino));
                }
            }
        }
        out
    }

    /// A checkpoint that freed these blocks is durable: they may be handed out again.
    pub fn release_busy(&self, start: u64, len: u64) {
        let mut s = self.lock();
        debug_assert!(s.busy_blocks >= len, "released more busy blocks than were freed");
        s.busy_blocks -= len;
        self.unclaim_blocks(&mut s, start, len);
    }

    /// Punch (`dev.punch`) the first run of free blocks at or after `from` (relative to the
    /// AG) that is at least `min_len` long, at most `max_len` of it (the lock's hold bound). Free here is clear in the
    /// in-memory map: neither claimed by a running transaction nor freed by a checkpoint that
    /// is not durable yet (those stay set until `release_busy`), so the run is free in the
    /// durable state and no recovery can need it; and the punch runs under the AG lock, so no
    /// claim can take a block of the run before it is done. `before`: free blocks punched
    /// just before `from` (a long run punched in pieces), which a run starting at `from`
    /// continues and counts towards `min_len`. Returns the run (relative start, length) and
    /// whether the device punched it; `None` past the AG's last free run.
    pub fn punch_free_run(
        &self,
        dev: &dyn BlockDevice,
        from: u64,
        min_len: u64,
        max_len: u64,
        before: u64,
    ) -> std::io::Result<Option<(u64, u64, bool)>> {
        debug_assert!(min_len >= 1 && max_len >= 1);
        let s = self.lock();
        let mut at = from.max(self.layout.data_start - self.layout.start);
        while let Some(start) = s.blocks.next_clear(at) {
            let len = s.blocks.run_len(start, min_len.max(max_len));
            let continued = if start == from { before } else { 0 };
            if len + continued >= min_len {
                debug_assert!(self.layout.start + start >= self.layout.data_start, "AG metadata is never free");
                let (bs, len) = (format::BLOCK_SIZE as u64, len.min(max_len));
                let punched = dev.punch((self.layout.start + start) * bs, len * bs)?;
                return Ok(Some((start, len, punched)));
            }
            at = start + len;
        }
        Ok(None)
    }

    /// Whether inode `idx` is allocated (in memory, claims included), read without the lock:
    /// as of some moment during the call, as a read under the lock would be as of its release.
    pub fn inode_in_use(&self, idx: u32) -> bool {
        let idx = idx as u64;
        self.inodes_in_use[(idx / 64) as usize].load(Acquire) >> (idx % 64) & 1 == 1
    }

    /// For an allocated inode being read into the cache: the log version its in-memory inode
    /// starts counting from (see `Ag::inode_log_version_floor`). The floor is read after
    /// the bit, so it is at least the floor when the bit was set (it only grows, and a base
    /// above the floor only starts the versions higher).
    pub fn inode_log_version_base(&self, idx: u32) -> Option<u64> {
        self.inode_in_use(idx).then(|| self.inode_log_version_floor.load(Relaxed))
    }

    #[cfg(feature = "testing")]
    pub fn block_in_use(&self, blkno: u64) -> bool {
        self.lock().blocks.get(blkno - self.layout.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::CacheBudget;
    use crate::dev::MemDevice;
    use crate::mkfs::{mkfs, MkfsOptions};
    use std::sync::Arc;

    /// The lock-free view a lookup uses follows every claim, free and abandoned claim made
    /// under the lock, and a freed number's log version floor comes with it.
    #[test]
    fn lookups_see_claims_and_frees_without_the_lock() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let geo = mkfs(&*dev, &MkfsOptions { ag_count: Some(1), ..MkfsOptions::default() }, &|_, _| {}).unwrap().geo;
        let bufs = BufCache::new(dev, geo.ag_count, geo.ag_blocks, CacheBudget::new(u64::MAX));
        let ag = Ag::load(&bufs, &geo, 0).unwrap();
        let root = format::ino_index(ROOT_INO);
        assert_eq!(ag.inode_log_version_base(root), Some(0), "the root is in use from the start");
        let (a, _, _) = ag.claim_inode(0).unwrap();
        let (b, _, _) = ag.claim_inode(0).unwrap();
        assert!(ag.inode_in_use(a) && ag.inode_in_use(b));
        ag.alloc_disk_inode(a);
        ag.free_disk_inode(&mut ag.lock(), a, 77);
        assert!(!ag.inode_in_use(a), "freed");
        assert_eq!(ag.inode_log_version_base(a), None);
        assert_eq!(ag.inode_log_version_base(b), Some(77), "versions count on from the floor");
        ag.unclaim_inode(&mut ag.lock(), b);
        assert!(!ag.inode_in_use(b), "a claim given back");
        let s = ag.lock();
        let mirrored: Vec<u64> = ag.inodes_in_use.iter().map(|w| w.load(Relaxed)).collect();
        assert_eq!(mirrored, s.inodes.words, "the mirror is the bitmap");
    }
}
