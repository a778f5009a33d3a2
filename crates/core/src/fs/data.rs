//! File data: open and release, read, write, truncate, readlink and fsync.

use super::*;

/// What one step of a job run by `FileSystem::in_steps` left behind.
pub(super) enum Step {
    /// More steps follow.
    More,
    /// The job is done; the inode is logged with the last step.
    Done,
    /// The job is done and the step freed the inode, which is therefore not logged.
    Freed,
}

impl Step {
    pub(super) fn done_if(done: bool) -> Step {
        if done {
            Step::Done
        } else {
            Step::More
        }
    }
}

/// Device blocks given backing storage at a time when file data first enters them
/// (`FileSystem::back_blocks`): 1 MiB.
const BACKING_CHUNK_BLOCKS: u64 = 256;

/// Stamp a change of the file's contents (mtime and ctime).
pub(super) fn stamp_modified(inode: &mut DiskInode) {
    let time = now();
    inode.mtime = time;
    inode.ctime = time;
}

impl FileSystem {
    /// Run a job on locked inode `i` (whose state is `g`) as a series of transactions, one
    /// step each: `step` changes a copy of the inode in a new transaction, which logs the
    /// copy (with its data, ordered) and commits; only then is the copy stored into `g`, so
    /// a failed step leaves `g` as the last committed step left it. Truncate, fallocate's
    /// batches and the freeing of unlinked inodes all run this way.
    pub(super) fn in_steps(
        &self,
        i: &InodeRef,
        g: &mut DiskInode,
        mut step: impl FnMut(&mut Tx, &mut DiskInode) -> Result<Step>,
    ) -> Result<()> {
        // No computed bound: every step either ends the job or commits one batch of it
        // (unmaps, maps or shifts up to a batch of extents), so the job's size bounds the
        // number of steps.
        loop {
            let mut updated = g.clone();
            let mut tx = Tx::new(&self.m)?;
            let outcome = step(&mut tx, &mut updated)?;
            if !matches!(outcome, Step::Freed) {
                tx.log_inode(i, &updated, true);
            }
            tx.commit()?;
            *g = updated;
            if !matches!(outcome, Step::More) {
                return Ok(());
            }
        }
    }

    // ---- file data --------------------------------------------------------------------

    /// Read up to `len` bytes at `off`; an access, which may set atime (`MountOptions::atime`).
    pub fn read(&self, ino: u64, off: u64, len: usize) -> Result<Vec<u8>> {
        let i = self.m.iget(ino)?;
        let out = self.read_data(&i, off, len)?;
        self.touch_atime(&i);
        Ok(out)
    }

    fn read_data(&self, i: &InodeRef, off: u64, len: usize) -> Result<Vec<u8>> {
        let (ino, g) = (i.ino, i.core.read());
        if g.is_dir() {
            return Err(Error::IsDir);
        }
        if off >= g.size {
            return Ok(Vec::new());
        }
        let end = (off + len as u64).min(g.size);
        let mut out = vec![0u8; (end - off) as usize];
        for extent in file::read_extents(&self.m, ino, &g, off / BS, end.div_ceil(BS))? {
            if extent.unwritten {
                continue;
            }
            let (lo, hi) = ((extent.lblk * BS).max(off), (extent.end() * BS).min(end));
            let dev_off = extent.pblk * BS + (lo - extent.lblk * BS);
            self.m.dev.read_at(&mut out[(lo - off) as usize..(hi - off) as usize], dev_off)?;
        }
        Ok(out)
    }

    /// Write `data` at `off`, growing the file if it ends past the size; returns the bytes
    /// written (all of them). EISDIR/EINVAL for a non-regular file, EFBIG past the largest
    /// file, ENOSPC.
    pub fn write(&self, ino: u64, off: u64, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let end = off.checked_add(data.len() as u64).ok_or(Error::FileTooBig)?;
        if end > MAX_FILE_BLOCKS * BS {
            return Err(Error::FileTooBig);
        }
        let _changing = self.m.start_change();
        let i = self.m.iget(ino)?;
        let mut g = i.core.write();
        if g.is_dir() {
            return Err(Error::IsDir);
        }
        if !g.is_reg() {
            return Err(Error::Invalid("write to a non-regular file"));
        }
        let mut updated = g.clone();
        let mut tx = Tx::new(&self.m)?;
        self.zero_tail(&i, &updated, off)?;
        let maps_changed = self.write_blocks(&mut tx, &i, &mut updated, off, data)?;
        let grew = end > updated.size;
        updated.size = updated.size.max(end);
        stamp_modified(&mut updated);
        tx.log_inode(&i, &updated, maps_changed || grew);
        tx.commit()?;
        *g = updated;
        Ok(data.len())
    }

    /// Before the size grows past `new_end`: zero the stale bytes after the old EOF in the
    /// old last block (they may hold data from before a shrinking truncate).
    pub(super) fn zero_tail(&self, i: &InodeRef, state: &DiskInode, new_end: u64) -> Result<()> {
        let size = state.size;
        if new_end <= size || size.is_multiple_of(BS) {
            return Ok(());
        }
        let blk = size / BS;
        if let Some(extent) =
            file::read_extents(&self.m, i.ino, state, blk, blk + 1)?.first().filter(|extent| !extent.unwritten)
        {
            let n = (BS - size % BS).min(new_end - size) as usize;
            self.m.dev.write_at(&vec![0u8; n], (extent.pblk + (blk - extent.lblk)) * BS + size % BS)?;
            self.note_data(i);
        }
        Ok(())
    }

    pub(super) fn note_data(&self, i: &InodeRef) {
        self.m.journal.note_data_write();
        i.data_dirty.store(true, Relaxed);
    }

    /// Write `data` at `off`: in place over written extents; into new blocks (zero padded)
    /// over holes and unwritten extents, which are then mapped. Data reaches the device
    /// before the transaction that maps it commits (ordered data). Returns whether the block
    /// map changed.
    fn write_blocks(&self, tx: &mut Tx, i: &InodeRef, updated: &mut DiskInode, off: u64, data: &[u8]) -> Result<bool> {
        let (first, last) = (off / BS, (off + data.len() as u64 - 1) / BS);
        let mapped = file::read_extents(&self.m, i.ino, updated, first, last + 1)?;
        let mut cur = first;
        let mut new_maps: Vec<Extent> = Vec::new();
        let mut to_convert: Vec<(u64, u64)> = Vec::new();
        for extent in
            mapped.iter().chain(std::iter::once(&Extent { lblk: last + 1, pblk: 0, len: 0, unwritten: false }))
        {
            if extent.lblk > cur {
                new_maps.push(Extent {
                    lblk: cur,
                    pblk: 0,
                    len: (extent.lblk.min(last + 1) - cur) as u32,
                    unwritten: false,
                });
            }
            if extent.len == 0 {
                break;
            }
            let (lo, hi) = (extent.lblk.max(first), extent.end().min(last + 1));
            if extent.unwritten {
                to_convert.push((lo, hi));
            } else {
                self.write_span(data, off, lo, hi, extent.pblk + (lo - extent.lblk), false)?;
            }
            cur = hi;
        }
        if new_maps.is_empty() && to_convert.is_empty() {
            self.note_data(i);
            return Ok(false);
        }
        self.reserve_for_write(tx, i.ino, updated, &new_maps, &to_convert)?;
        let mut goal = match mapped.last() {
            Some(extent) => extent.pblk + extent.len as u64,
            None => self.alloc_goal(i.ino, updated, first)?,
        };
        for (lo, hi) in to_convert {
            let mut store = TxStore::new(tx, i.ino, 0);
            let (pieces, _) = file::unmap(&mut store, &self.m, i.ino, updated, lo, hi, usize::MAX)?;
            updated.add_blocks(i.ino, store.blocks)?;
            for piece in pieces {
                self.write_span(data, off, piece.lblk, piece.end(), piece.pblk, true)?;
                updated.add_blocks(i.ino, -(piece.len as i64))?;
                new_maps.push(Extent { unwritten: false, ..piece });
            }
        }
        for hole in new_maps.iter().filter(|extent| extent.pblk == 0).copied().collect::<Vec<_>>() {
            let mut lblk = hole.lblk;
            while lblk < hole.end() {
                let want = (hole.end() - lblk).min(crate::format::inode::EXTENT_LEN_MAX as u64);
                let (pblk, len) = tx.alloc_blocks(goal, want)?;
                self.back_blocks(pblk, len);
                self.write_span(data, off, lblk, lblk + len, pblk, true)?;
                self.map_extent(tx, i.ino, updated, Extent { lblk, pblk, len: len as u32, unwritten: false })?;
                updated.blocks += len;
                goal = pblk + len;
                lblk += len;
            }
        }
        for extent in new_maps.into_iter().filter(|extent| extent.pblk != 0) {
            self.map_extent(tx, i.ino, updated, extent)?;
            updated.blocks += extent.len as u64;
        }
        self.note_data(i);
        Ok(true)
    }

    /// Where the blocks of file block `lblk` and on should go, when none of them is mapped:
    /// right after the block mapping `lblk - 1`, so that a file written in order (an
    /// append) stays one extent; else (a new file, a write after a hole) where the inode's AG
    /// last allocated. Never the AG's first data block: the bitmap is searched from the goal,
    /// and from there every appending write scanned all the blocks in use before it.
    pub(super) fn alloc_goal(&self, ino: u64, state: &DiskInode, lblk: u64) -> Result<u64> {
        let before = match lblk.checked_sub(1) {
            Some(prev) => file::read_extents(&self.m, ino, state, prev, lblk)?.pop(),
            None => None,
        };
        Ok(match before {
            Some(extent) => extent.pblk + extent.len as u64,
            None => self.m.ags[ino_ag(ino) as usize].block_goal(),
        })
    }

    /// Reserve what `write_blocks` maps: the blocks of `new_maps` (holes to fill) and the
    /// tree blocks of those inserts and of converting the unwritten ranges `to_convert`.
    fn reserve_for_write(
        &self,
        tx: &mut Tx,
        ino: u64,
        updated: &DiskInode,
        new_maps: &[Extent],
        to_convert: &[(u64, u64)],
    ) -> Result<()> {
        // Converting unwritten blocks allocates no data blocks, only tree nodes: a conversion
        // in the middle of an unwritten extent removes it and inserts up to three pieces
        // (net two more extents). A conversion that keeps the map inline needs none. With a
        // B+tree map the worst case is reserved from the AGs' pools, which ordinary
        // allocations leave alone, so a write into preallocated space gets its tree blocks
        // on a full file system too (until the pools run dry: thousands of splits).
        let fresh: u64 = new_maps.iter().map(|extent| extent.len as u64).sum::<u64>();
        let inline = match updated.fork {
            Fork::Empty => Some(0),
            Fork::Extents { n, .. } => Some(n as usize),
            _ => None,
        };
        let stays_inline = new_maps.is_empty()
            && inline.is_some_and(|n| n + 2 * to_convert.len() <= crate::format::inode::INLINE_EXTENTS);
        let (tree_fresh, tree_convert) = if stays_inline {
            (0, 0)
        } else {
            (MAP_RESERVE * new_maps.len() as u64, MAP_RESERVE * 3 * to_convert.len() as u64)
        };
        if fresh + tree_fresh > 0 {
            tx.reserve(ino_ag(ino), fresh + tree_fresh)?;
        }
        if tree_convert > 0 {
            tx.reserve_pooled(ino_ag(ino), tree_convert)?;
        }
        Ok(())
    }

    pub(super) fn map_extent(&self, tx: &mut Tx, ino: u64, updated: &mut DiskInode, extent: Extent) -> Result<()> {
        let mut store = TxStore::new(tx, ino, extent.pblk);
        file::map(&mut store, &self.m, ino, updated, extent)?;
        updated.add_blocks(ino, store.blocks)?;
        Ok(())
    }

    /// Data is about to go to the newly allocated device blocks `[pblk, pblk + len)`: if
    /// they begin a chunk of `BACKING_CHUNK_BLOCKS` or cross into one, give that chunk (and any
    /// other they enter) backing storage now (`BlockDevice::preallocate`). On a sparse image
    /// file every first write of a block made the host allocate (tmpfs a page, ext4 a
    /// delayed block, and a journal commit at the next flush); an append then cost more than
    /// an overwrite of written blocks. A file written in order enters a new chunk once per
    /// 256 blocks, so the rest of its appends land on backed space, as speculative
    /// preallocation gives XFS's appends space allocated ahead of them. Only the host's
    /// storage changes, never what the image holds: blocks of the chunk that other files own
    /// keep their data, free ones stay free. A hint: a device that cannot preallocate (or
    /// has no room to) leaves the write to allocate as before, which reports any error.
    fn back_blocks(&self, pblk: u64, len: u64) {
        debug_assert!(len > 0, "no blocks to back at {pblk}");
        let (first, last) = (pblk / BACKING_CHUNK_BLOCKS, (pblk + len - 1) / BACKING_CHUNK_BLOCKS);
        let entered = if pblk.is_multiple_of(BACKING_CHUNK_BLOCKS) { first } else { first + 1 };
        if entered > last {
            return;
        }
        let start = entered * BACKING_CHUNK_BLOCKS * BS;
        let bytes = ((last + 1 - entered) * BACKING_CHUNK_BLOCKS * BS).min(self.m.dev.size() - start);
        // Best effort: the write that follows allocates whatever this could not.
        let _ = self.m.dev.preallocate(start, bytes);
    }

    /// Write the part of `data` (which starts at file offset `off`) that falls in file
    /// blocks `[lo, hi)`, at device block `pblk`. `fresh` blocks get zeros around the data.
    fn write_span(&self, data: &[u8], off: u64, lo: u64, hi: u64, pblk: u64, fresh: bool) -> Result<()> {
        let (start, end) = ((lo * BS).max(off), (hi * BS).min(off + data.len() as u64));
        debug_assert!(start < end, "blocks [{lo}, {hi}) hold none of the data at {off}");
        let piece = &data[(start - off) as usize..(end - off) as usize];
        // Fresh blocks the data fills whole need no zeros: written as they are, no copy.
        if !fresh || (start == lo * BS && end == hi * BS) {
            self.m.dev.write_at(piece, pblk * BS + (start - lo * BS))?;
            return Ok(());
        }
        let mut buf = vec![0u8; ((hi - lo) * BS) as usize];
        buf[(start - lo * BS) as usize..(end - lo * BS) as usize].copy_from_slice(piece);
        self.m.dev.write_at(&buf, pblk * BS)?;
        Ok(())
    }

    /// Change the size. Shrinking frees whole blocks past the new end, a batch per
    /// transaction; a job of more than one batch keeps the inode on the orphan list so a
    /// crash cannot leave it half done (seed 000: the common small truncate never touches
    /// the orphan list). `attrs` makes the caller's other changes (times, mode, owner) in
    /// every one of those transactions: a crash between two of them, or just after the
    /// first, then leaves the size and the attributes the call set together (orphan
    /// processing finishes the freeing), never the new size with the old times.
    pub(super) fn truncate(
        &self,
        i: &InodeRef,
        g: &mut DiskInode,
        size: u64,
        attrs: &dyn Fn(&mut DiskInode),
    ) -> Result<()> {
        if size > MAX_FILE_BLOCKS * BS {
            return Err(Error::FileTooBig);
        }
        self.zero_tail(i, g, size)?;
        let from = size.div_ceil(BS);
        // Only unwritten (preallocated) blocks can lie past the old end: growing keeps them,
        // as ext4 and XFS do; a truncate to the same size or smaller drops them.
        let grow = size > g.size;
        self.in_steps(i, g, |tx, updated| {
            let done = grow || self.unmap_from(tx, i.ino, updated, from)?;
            updated.size = size;
            if !done && updated.orphan_slot == 0 {
                tx.orphan_add(i.ino, updated)?;
            }
            if done && updated.orphan_slot != 0 && updated.nlink > 0 {
                tx.orphan_remove(i.ino, updated);
            }
            attrs(updated);
            Ok(Step::done_if(done))
        })
    }

    /// Unmap and free up to one batch of the file's blocks at or after block `from`.
    /// Returns whether nothing is left to unmap there.
    pub(super) fn unmap_from(&self, tx: &mut Tx, ino: u64, updated: &mut DiskInode, from: u64) -> Result<bool> {
        self.unmap_range(tx, ino, updated, from, MAX_FILE_BLOCKS)
    }

    /// Unmap and free up to one batch of the file's blocks in `[from, to)`. Returns whether
    /// nothing is left to unmap there.
    pub(super) fn unmap_range(
        &self,
        tx: &mut Tx,
        ino: u64,
        updated: &mut DiskInode,
        from: u64,
        to: u64,
    ) -> Result<bool> {
        debug_assert!(from <= to, "unmap of a reversed range [{from}, {to}) in inode {ino}");
        if !(updated.is_reg() || updated.is_symlink()) || matches!(updated.fork, Fork::Inline { .. }) {
            return Ok(true);
        }
        // A punch may split an extent: freeing space must work on a full file system.
        tx.reserve_pooled(ino_ag(ino), MAP_RESERVE)?;
        let mut store = TxStore::new(tx, ino, 0);
        let (pieces, done) = file::unmap(&mut store, &self.m, ino, updated, from, to, UNMAP_BATCH)?;
        let tree_delta = store.blocks;
        for piece in &pieces {
            tx.free_blocks(piece.pblk, piece.len as u64, false);
        }
        let unmapped: i64 = pieces.iter().map(|piece| piece.len as i64).sum();
        updated.add_blocks(ino, tree_delta - unmapped)?;
        Ok(done)
    }

    /// The target of symlink `ino`: EINVAL if it is not a symlink.
    pub fn readlink(&self, ino: u64) -> Result<Vec<u8>> {
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        if !g.is_symlink() {
            return Err(Error::Invalid("not a symlink"));
        }
        match &g.fork {
            Fork::Inline { len, bytes } => Ok(bytes[..*len as usize].to_vec()),
            _ => {
                let len = (g.size as usize).min(SYMLINK_MAX);
                drop(g);
                self.read_data(&i, 0, len)
            }
        }
    }

    /// fsync(2)/fdatasync(2): force the log only up to this inode's last change (group
    /// commit with concurrent callers); with nothing to log, just flush the data written.
    pub fn fsync(&self, ino: u64, datasync: bool) -> Result<()> {
        let i = self.m.iget(ino)?;
        let seq = if datasync { i.last_data_seq.load(Acquire) } else { i.last_seq.load(Acquire) };
        let had_data = i.data_dirty.swap(false, AcqRel);
        if seq > self.m.journal.durable_seq() {
            return self.m.journal.force(seq);
        }
        self.m.journal.stats.fsyncs_durable.fetch_add(1, Relaxed);
        if had_data {
            return self.m.journal.flush_data();
        }
        Ok(())
    }
}
