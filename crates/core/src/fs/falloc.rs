//! fallocate(2): preallocation, punching and zeroing ranges, and the shifts of
//! `FALLOC_FL_COLLAPSE_RANGE` and `FALLOC_FL_INSERT_RANGE` (docs/DESIGN.md,
//! "Preallocation (fallocate)").

use super::data::{stamp_modified, Step};
use super::*;

/// The holes `preallocate` has still to fill, in file order.
struct Unfilled {
    holes: std::iter::Peekable<std::vec::IntoIter<(u64, u64)>>,
    /// Data blocks the holes still need.
    blocks: u64,
    /// Where the next data block should go: after the last one allocated.
    goal: u64,
}

impl FileSystem {
    /// fallocate(2). Supported modes: 0 (allocate, and grow the size to `off + len`),
    /// `FALLOC_FL_KEEP_SIZE` (allocate only), `FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE`
    /// (deallocate; the range reads as zeros), and `FALLOC_FL_ZERO_RANGE` with or without
    /// `FALLOC_FL_KEEP_SIZE` (the range reads as zeros and its space is allocated),
    /// `FALLOC_FL_COLLAPSE_RANGE` and `FALLOC_FL_INSERT_RANGE` (see `collapse_range` and
    /// `insert_range`; each alone, else EINVAL). Anything else is `NotSupported` (EOPNOTSUPP).
    ///
    /// Allocation maps *unwritten* extents over the holes of the range (blocks already
    /// mapped are left as they are): they own their blocks but read as zeros, and a write
    /// converts the blocks it covers to written in the transaction that writes them. The
    /// space is checked before anything changes, so a request larger than the free space
    /// fails with ENOSPC and the file as it was. A large range takes several transactions
    /// (`FALLOC_BATCH`); should one of the later ones still find no space (other writers
    /// took it meanwhile, or no AG can hold a batch and its tree blocks), the call fails
    /// with ENOSPC and keeps the extents already mapped, with the size unchanged: a
    /// consistent state, as after a crash between two batches — the same partial result
    /// ext4 and XFS give.
    pub fn fallocate(&self, ino: u64, off: u64, len: u64, mode: u32) -> Result<()> {
        const KEEP: u32 = FALLOC_FL_KEEP_SIZE;
        const SHIFTS: u32 = FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE;
        if mode & SHIFTS != 0 && mode != FALLOC_FL_COLLAPSE_RANGE && mode != FALLOC_FL_INSERT_RANGE {
            return Err(Error::Invalid("fallocate: collapse or insert range combined with other flags"));
        }
        if ![
            0,
            KEEP,
            FALLOC_FL_PUNCH_HOLE | KEEP,
            FALLOC_FL_ZERO_RANGE,
            FALLOC_FL_ZERO_RANGE | KEEP,
            FALLOC_FL_COLLAPSE_RANGE,
            FALLOC_FL_INSERT_RANGE,
        ]
        .contains(&mode)
        {
            return Err(Error::NotSupported);
        }
        if len == 0 {
            return Err(Error::Invalid("fallocate of length 0"));
        }
        let end = off.checked_add(len).filter(|&end| end <= MAX_FILE_BLOCKS * BS).ok_or(Error::FileTooBig)?;
        let _changing = self.m.start_change();
        let i = self.m.iget(ino)?;
        let mut g = i.core.write();
        if g.is_dir() {
            return Err(Error::IsDir);
        }
        if !g.is_reg() {
            return Err(Error::Invalid("fallocate of a non-regular file"));
        }
        let extend = mode & FALLOC_FL_KEEP_SIZE == 0;
        match mode & !FALLOC_FL_KEEP_SIZE {
            FALLOC_FL_PUNCH_HOLE => self.punch_hole(&i, &mut g, off, end),
            FALLOC_FL_ZERO_RANGE => self.zero_range(&i, &mut g, off, end, extend),
            FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE => {
                let shifted = if mode == FALLOC_FL_COLLAPSE_RANGE {
                    self.collapse_range(&i, &mut g, off, len)
                } else {
                    self.insert_range(&i, &mut g, off, len)
                };
                // Data is overwritten in place: a write into a moved block before the move
                // is durable would show at the block's old offset after a crash that lost
                // the move. So the move is made durable before the inode is let go, even
                // after a failed step (the steps before it moved extents too).
                let forced = self.m.journal.force(i.last_seq.load(Acquire));
                shifted.and(forced)
            }
            _ => self.preallocate(&i, &mut g, off, end, extend, false),
        }
    }

    /// `FALLOC_FL_ZERO_RANGE`: `[off, end)` reads as zeros and its space is allocated, as
    /// on ext4: the written parts of partial edge blocks are zeroed in place (as a punch
    /// does), the whole blocks are unmapped and mapped again as unwritten extents in the
    /// transaction that maps the range's holes, and the size grows to `end` unless `extend`
    /// is false. A range of up to `FALLOC_BATCH` blocks over up to `UNMAP_BATCH` extents
    /// takes one transaction, so a crash shows it zeroed or untouched; a larger one is
    /// punched first, then preallocated, and a crash in between leaves it punched (zeros, not
    /// yet allocated).
    fn zero_range(&self, i: &InodeRef, g: &mut DiskInode, off: u64, end: u64, extend: bool) -> Result<()> {
        let (from, to) = (off.div_ceil(BS), end / BS);
        if to.saturating_sub(from) <= FALLOC_BATCH
            && file::read_extents(&self.m, i.ino, g, from, to)?.len() <= UNMAP_BATCH
        {
            return self.preallocate(i, g, off, end, extend, true);
        }
        self.punch_hole(i, g, off, end)?;
        self.preallocate(i, g, off, end, extend, false)
    }

    /// Map unwritten extents over the holes in file bytes `[off, end)`, a batch per
    /// transaction; with `extend`, the last transaction grows the size to `end`. The inode
    /// stays locked throughout, so the holes found at the start are the holes to fill.
    /// With `zero` (`zero_range`, for a range whose whole blocks span at most `UNMAP_BATCH`
    /// extents), the written parts of the partial edge blocks are zeroed in place and the
    /// whole blocks are unmapped in the first transaction and count as holes.
    fn preallocate(&self, i: &InodeRef, g: &mut DiskInode, off: u64, end: u64, extend: bool, zero: bool) -> Result<()> {
        let mut holes = file::holes(&self.m, i.ino, g, off / BS, end.div_ceil(BS))?;
        let (from, to) = (off.div_ceil(BS), end / BS);
        let mut remap = (zero && from < to).then_some((from, to));
        if let Some((from, to)) = remap {
            holes = holes
                .into_iter()
                .flat_map(|(lo, hi)| [(lo, hi.min(from)), (lo.max(to), hi)])
                .filter(|(lo, hi)| lo < hi)
                .chain([(from, to)])
                .collect();
            holes.sort_unstable();
        }
        let need: u64 = holes.iter().map(|(lo, hi)| hi - lo).sum();
        // Blocks `remap` frees are not counted: freed space may be reused only after the
        // transaction that freed it is durable.
        let fits = || need + MAP_RESERVE <= self.statfs().bfree;
        // Files just unlinked while the FUSE kernel held them come back once it forgets them.
        if need > 0 && !fits() && !(self.m.holds.wait_for_frees() && fits()) {
            return Err(Error::NoSpace);
        }
        let size = if extend { g.size.max(end) } else { g.size };
        self.zero_tail(i, g, size)?;
        if zero {
            self.zero_edges(i, g, off, end)?;
        }
        let goal = self.alloc_goal(i.ino, g, holes.first().map_or(off / BS, |hole| hole.0))?;
        let mut unfilled = Unfilled { holes: holes.into_iter().peekable(), blocks: need, goal };
        self.in_steps(i, g, |tx, updated| {
            if unfilled.blocks > 0 {
                self.fill_batch(tx, i.ino, updated, &mut unfilled, &mut remap)?;
            }
            let done = unfilled.holes.peek().is_none();
            let time = now();
            if done && size != updated.size {
                updated.size = size;
                updated.mtime = time;
            }
            if zero {
                updated.mtime = time;
            }
            updated.ctime = time;
            Ok(Step::done_if(done))
        })
    }

    /// One transaction's batch of `preallocate`: reserve for it, unmap `remap` if that is
    /// still to do, then map unwritten extents over the next holes, as many as the
    /// reservation covers.
    fn fill_batch(
        &self,
        tx: &mut Tx,
        ino: u64,
        updated: &mut DiskInode,
        unfilled: &mut Unfilled,
        remap: &mut Option<(u64, u64)>,
    ) -> Result<()> {
        let (mut budget, mut extents) = self.reserve_falloc_batch(tx, ino_ag(ino), unfilled.blocks)?;
        // After the reservation, which may fail: nothing is changed before it.
        if let Some((from, to)) = remap.take() {
            let unmapped = self.unmap_range(tx, ino, updated, from, to)?;
            debug_assert!(unmapped, "more than UNMAP_BATCH extents to remap");
        }
        // Data blocks come out of `budget` only: the rest of the reservation is for the tree
        // blocks of at most `extents` inserts.
        while budget > 0 && extents > 0 {
            let Some(&(lo, hi)) = unfilled.holes.peek() else { break };
            let want = (hi - lo).min(budget).min(crate::format::inode::EXTENT_LEN_MAX as u64);
            let (pblk, len) = tx.alloc_blocks(unfilled.goal, want)?;
            self.map_extent(tx, ino, updated, Extent { lblk: lo, pblk, len: len as u32, unwritten: true })?;
            updated.blocks += len;
            unfilled.goal = pblk + len;
            unfilled.blocks -= len;
            budget -= len;
            extents -= 1;
            match lo + len {
                next if next < hi => *unfilled.holes.peek_mut().expect("peeked") = (next, hi),
                _ => drop(unfilled.holes.next()),
            }
        }
        Ok(())
    }

    /// `FALLOC_FL_COLLAPSE_RANGE`, with ext4's and XFS's rules: `off` and `len` whole
    /// blocks, the range ending before EOF (else EINVAL). The range's blocks are unmapped and
    /// freed (as a punch does, a batch per transaction), every extent after it moves left by
    /// `len`, lowest first, and the size shrinks by `len`. When the range spans at most
    /// `UNMAP_BATCH` extents and at most `SHIFT_BATCH` follow it, all of that is one
    /// transaction: a crash shows the file collapsed or untouched. A larger job takes several,
    /// the size changing in the last, and a crash in between leaves the range punched and
    /// the extents after it partly moved, as XFS does (docs/DESIGN.md).
    fn collapse_range(&self, i: &InodeRef, g: &mut DiskInode, off: u64, len: u64) -> Result<()> {
        if !off.is_multiple_of(BS) || !len.is_multiple_of(BS) {
            return Err(Error::Invalid("fallocate: collapse range not block aligned"));
        }
        if off + len >= g.size {
            return Err(Error::Invalid("fallocate: collapse range reaches the end of the file"));
        }
        let (from, by) = (off / BS, len / BS);
        // Those after the range, and the piece of one the range's end splits.
        let moving = file::read_extents(&self.m, i.ino, g, from + by, MAX_FILE_BLOCKS)?.len() + 1;
        let (mut punched, mut rest) = (false, Some(from + by));
        self.in_steps(i, g, |tx, updated| {
            let batch = self.reserve_shift(tx, i.ino, moving)?;
            if !punched {
                punched = self.unmap_range(tx, i.ino, updated, from, from + by)?;
            }
            if let (true, Some(start)) = (punched, rest) {
                rest = self.shift_batch(tx, i.ino, updated, (start, MAX_FILE_BLOCKS), -(by as i64), batch)?;
            }
            let done = punched && rest.is_none();
            if done {
                updated.size -= len;
            }
            // The data moved: mtime and ctime change in every step.
            stamp_modified(updated);
            Ok(Step::done_if(done))
        })
    }

    /// `FALLOC_FL_INSERT_RANGE`, with ext4's and XFS's rules: `off` and `len` whole blocks
    /// (else EINVAL), `off` inside the file (else EINVAL), the grown size and the last
    /// extent within the largest file (else EFBIG). The extent across `off` is split there,
    /// every extent from `off` on moves right by `len`, highest first, leaving a hole, and
    /// the size grows by `len`. With at most `SHIFT_BATCH` extents to move that is one
    /// transaction; a larger job grows the size in the first, and a crash in between leaves
    /// the extents partly moved, as XFS does (docs/DESIGN.md).
    fn insert_range(&self, i: &InodeRef, g: &mut DiskInode, off: u64, len: u64) -> Result<()> {
        if !off.is_multiple_of(BS) || !len.is_multiple_of(BS) {
            return Err(Error::Invalid("fallocate: insert range not block aligned"));
        }
        let (from, by) = (off / BS, len / BS);
        let moving = file::read_extents(&self.m, i.ino, g, from, MAX_FILE_BLOCKS)?;
        let last = moving.last().map_or(0, |extent| extent.end());
        if g.size.checked_add(len).is_none_or(|size| size > MAX_FILE_BLOCKS * BS) || last + by > MAX_FILE_BLOCKS {
            return Err(Error::FileTooBig);
        }
        if off >= g.size {
            return Err(Error::Invalid("fallocate: insert range at or past the end of the file"));
        }
        // Extents in `[from, end)` are still to move; the highest move first.
        let mut end = MAX_FILE_BLOCKS;
        let mut split = false;
        self.in_steps(i, g, |tx, updated| {
            let batch = self.reserve_shift(tx, i.ino, moving.len() + 1)?;
            if !split {
                tx.reserve_pooled(ino_ag(i.ino), 2 * MAP_RESERVE)?;
                let mut store = TxStore::new(tx, i.ino, 0);
                file::split_at(&mut store, &self.m, i.ino, updated, from)?;
                let tree_delta = store.blocks;
                updated.add_blocks(i.ino, tree_delta)?;
                updated.size += len;
                split = true;
            }
            let rest = self.shift_batch(tx, i.ino, updated, (from, end), by as i64, batch)?;
            // The data moved: mtime and ctime change in every step.
            stamp_modified(updated);
            end = rest.unwrap_or(from);
            Ok(Step::done_if(rest.is_none()))
        })
    }

    /// Reserve the B+tree blocks for moving up to `moving` extents, at most `SHIFT_BATCH`,
    /// or a single one near a full file system. Returns how many extents it covers.
    fn reserve_shift(&self, tx: &mut Tx, ino: u64, moving: usize) -> Result<usize> {
        for extents in [moving.min(SHIFT_BATCH), 1] {
            if tx.reserve_pooled(ino_ag(ino), MAP_RESERVE * extents as u64).is_ok() {
                return Ok(extents);
            }
        }
        Err(Error::NoSpace)
    }

    /// One batch of `file::shift`, counting the B+tree blocks it adds or frees.
    fn shift_batch(
        &self,
        tx: &mut Tx,
        ino: u64,
        updated: &mut DiskInode,
        range: (u64, u64),
        by: i64,
        max: usize,
    ) -> Result<Option<u64>> {
        let mut store = TxStore::new(tx, ino, 0);
        let rest = file::shift(&mut store, &self.m, ino, updated, range, by, max)?;
        let tree_delta = store.blocks;
        updated.add_blocks(ino, tree_delta)?;
        Ok(rest)
    }

    /// Reserve one fallocate batch of up to `rest` data blocks plus the tree blocks its
    /// extent inserts may need. Returns (data blocks, extents) the reservation covers; near
    /// a full file system a batch shrinks to what one AG holds, down to a single extent.
    fn reserve_falloc_batch(&self, tx: &mut Tx, pref: u32, rest: u64) -> Result<(u64, u64)> {
        let room = self.m.ags.iter().map(|ag| ag.free_blocks()).max().unwrap_or(0);
        for extents in [FALLOC_EXTENTS, 1] {
            let tree = MAP_RESERVE * extents;
            let data = rest.min(FALLOC_BATCH).min(room.saturating_sub(tree));
            if data > 0 && tx.reserve(pref, data + tree).is_ok() {
                return Ok((data, extents));
            }
        }
        Err(Error::NoSpace)
    }

    /// Deallocate file bytes `[off, end)`: whole blocks are unmapped and freed, a batch per
    /// transaction (each state in between reads correctly: a block is either punched or
    /// not), and the written parts of partial blocks at the edges are zeroed in place, up to
    /// EOF only. The size never changes.
    ///
    /// Not past EOF: those bytes are not part of the file (`zero_tail` zeroes them if it
    /// grows), and a shrinking truncate before the punch may not be durable yet. Zeroed in
    /// place, they would read as zeros inside the old size after a crash that undid the
    /// truncate, a state the file never had (found by the random crash workload).
    fn punch_hole(&self, i: &InodeRef, g: &mut DiskInode, off: u64, end: u64) -> Result<()> {
        let (from, to) = (off.div_ceil(BS), end / BS);
        self.zero_edges(i, g, off, end)?;
        self.in_steps(i, g, |tx, updated| {
            let done = from >= to || self.unmap_range(tx, i.ino, updated, from, to)?;
            stamp_modified(updated);
            Ok(Step::done_if(done))
        })
    }

    /// Zero in place the written parts of the partial blocks at the edges of `[off, end)`,
    /// up to EOF only (see `punch_hole`).
    fn zero_edges(&self, i: &InodeRef, g: &DiskInode, off: u64, end: u64) -> Result<()> {
        let (from, to) = (off.div_ceil(BS), end / BS);
        let head = (!off.is_multiple_of(BS)).then(|| (off, end.min(from * BS)));
        let tail = (!end.is_multiple_of(BS) && to >= from).then(|| (to * BS, end));
        for (lo, hi) in head.into_iter().chain(tail).map(|(lo, hi)| (lo, hi.min(g.size))).filter(|(lo, hi)| lo < hi) {
            let blk = lo / BS;
            if let Some(extent) =
                file::read_extents(&self.m, i.ino, g, blk, blk + 1)?.first().filter(|extent| !extent.unwritten)
            {
                self.m
                    .dev
                    .write_at(&vec![0u8; (hi - lo) as usize], (extent.pblk + (blk - extent.lblk)) * BS + lo % BS)?;
                self.note_data(i);
            }
        }
        Ok(())
    }
}
