//! Transactions. A transaction collects what an operation changed — metadata buffers,
//! inode images, and allocation-group operations — and commits them atomically into the
//! CIL. It writes nothing to disk.
//!
//! Rules (docs/DESIGN.md, "Locking"):
//! - A transaction begins (and may wait for CIL space) holding no AG lock; directory
//!   operations begin before their inode locks, so no waiter blocks a directory. AG locks
//!   are taken only inside `commit`, in AG order, around the on-disk bitmap updates and the
//!   CIL insert. So a bitmap block that two transactions share never carries one
//!   transaction's uncommitted bits into another's commit, and AG locks are held for
//!   microseconds.
//! - Space is claimed before anything is modified (claims and reservations can fail with
//!   ENOSPC; B+tree splits then draw on the reservation and cannot). A transaction dropped
//!   after it modified shared state shuts the file system down, as XFS does: the on-disk
//!   image stays consistent because nothing uncommitted reaches the log.

use crate::ag::AgState;
use crate::buf::BufRef;
use crate::error::{Error, Result};
use crate::format::log::{ItemKey, ALL_CHUNKS};
use crate::format::{ino_ag, ino_index, make_ino, DiskInode, INODE_SIZE};
use crate::inode::{Inode, InodeRef};
use crate::journal::{BusyExtent, CilWriter, Route};
use crate::lockstat::MutexGuard;
use crate::mount::Mount;
use smallvec::SmallVec;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AgOp {
    InodeAlloc {
        ino: u64,
    },
    /// `log_version`: the freed inode's last log version (the number's next owner counts on).
    InodeFree {
        ino: u64,
        log_version: u64,
    },
    BlockAlloc {
        start: u64,
        len: u64,
    },
    BlockFree {
        start: u64,
        len: u64,
        meta: bool,
    },
    OrphanSet {
        ino: u64,
        slot: u32,
    },
    OrphanClear {
        ino: u64,
        slot: u32,
    },
}

impl AgOp {
    fn agno(&self, m: &Mount) -> u32 {
        match *self {
            AgOp::InodeAlloc { ino }
            | AgOp::InodeFree { ino, .. }
            | AgOp::OrphanSet { ino, .. }
            | AgOp::OrphanClear { ino, .. } => ino_ag(ino),
            AgOp::BlockAlloc { start, .. } | AgOp::BlockFree { start, .. } => m.geo.block_ag(start),
        }
    }
}

/// What a commit's AG operations changed (`Tx::apply_ops`).
struct AgChanges {
    bufs: SmallVec<[BufRef; 4]>,
    busy: SmallVec<[BusyExtent; 2]>,
    /// Metadata blocks freed: revoked in the log rather than logged.
    revoked: SmallVec<[u64; 2]>,
}

struct LoggedInode {
    inode: InodeRef,
    image: [u8; INODE_SIZE],
    version: u64,
    data: bool,
}

/// Inline capacities cover a create or unlink without touching the heap.
pub struct Tx<'m> {
    m: &'m Mount,
    bufs: SmallVec<[BufRef; 4]>,
    inodes: SmallVec<[LoggedInode; 2]>,
    ops: SmallVec<[AgOp; 4]>,
    /// Blocks still reserved per AG (returned at commit or drop).
    reserved: SmallVec<[(u32, u64); 2]>,
    modified: bool,
    done: bool,
    /// The CIL shard the commit goes to (`route_by`).
    route: Route,
}

impl<'m> Tx<'m> {
    /// Begin a transaction, waiting first (holding no lock) while the caches or the CIL are
    /// over their bounds.
    pub fn new(m: &'m Mount) -> Result<Tx<'m>> {
        m.check_writable()?;
        m.icache.budget().throttle();
        m.journal.throttle()?;
        Ok(Tx {
            m,
            bufs: SmallVec::new(),
            inodes: SmallVec::new(),
            ops: SmallVec::new(),
            reserved: SmallVec::new(),
            modified: false,
            done: false,
            route: Route::Thread,
        })
    }

    /// This transaction changes directory `dir`, whose lock the caller holds. If other
    /// threads are changing it too, commit into the directory's CIL shard rather than this
    /// thread's: each of its blocks then has one copy there, relogged in place with only the
    /// chunks that changed. Committed from each thread's own shard, a block that the threads
    /// take turns on is copied whole into every one of their shards and merged at the
    /// checkpoint. A directory that one thread changes keeps that thread's shard, which it
    /// shares with no other thread.
    pub fn route_by(&mut self, dir: &Inode) {
        let j = &self.m.journal;
        if dir.note_dir_change(j.thread_shard(), j.open_seq()) && self.route == Route::Thread {
            self.route = Route::Object(dir.ino);
        }
    }

    /// The mount the transaction changes.
    pub fn mount(&self) -> &'m Mount {
        self.m
    }

    fn add_reserved(&mut self, agno: u32, n: u64) {
        match self.reserved.iter_mut().find(|(a, _)| *a == agno) {
            Some((_, r)) => *r += n,
            None => self.reserved.push((agno, n)),
        }
    }

    /// Reserve `n` blocks, preferring AG `pref`; returns the AG that granted them.
    pub fn reserve(&mut self, pref: u32, n: u64) -> Result<u32> {
        self.reserve_in(pref, n, false)
    }

    /// Reserve `n` blocks for B+tree changes that must not fail for lack of space: those may
    /// take the AGs' pools (`Ag::reserve`).
    pub fn reserve_pooled(&mut self, pref: u32, n: u64) -> Result<u32> {
        self.reserve_in(pref, n, true)
    }

    fn reserve_in(&mut self, pref: u32, n: u64, pooled: bool) -> Result<u32> {
        let count = self.m.geo.ag_count;
        for attempt in 0..2 {
            for i in 0..count {
                let agno = (pref + i) % count;
                if self.m.ags[agno as usize].reserve(n, pooled) {
                    self.add_reserved(agno, n);
                    return Ok(agno);
                }
            }
            if attempt == 0 {
                // Blocks freed by changes not yet durable are busy (held back from reuse
                // until the checkpoint that frees them is on disk), so a program that just
                // deleted files would see ENOSPC for space it has freed: make them reusable,
                // as XFS flushes its busy extents. Nothing of this transaction is in the log.
                // Files unlinked while the FUSE kernel held them are freed once it forgets
                // them: those about to be freed first.
                self.m.holds.wait_for_frees();
                self.m.release_busy()?;
            }
        }
        Err(Error::NoSpace)
    }

    /// Claim a new inode number, preferring AG `pref`, and reserve `blocks` in that AG in
    /// the same critical section. Returns (ino, generation, the log version the new
    /// in-memory inode starts from).
    pub fn alloc_inode(&mut self, pref: u32, blocks: u64) -> Result<(u64, u32, u64)> {
        let count = self.m.geo.ag_count;
        for attempt in 0..2 {
            for i in 0..count {
                let agno = (pref + i) % count;
                if let Some((idx, gen, log_version)) = self.m.ags[agno as usize].claim_inode(blocks) {
                    let ino = make_ino(agno, idx);
                    debug_assert_ne!(ino, 0, "mkfs marks inode 0 used");
                    self.add_reserved(agno, blocks);
                    self.ops.push(AgOp::InodeAlloc { ino });
                    return Ok((ino, gen, log_version));
                }
            }
            if attempt == 0 {
                self.m.holds.wait_for_frees();
                self.m.release_busy()?;
            }
        }
        Err(Error::NoSpace)
    }

    /// Claim up to `max_len` contiguous reserved blocks for file data near `goal`. Returns
    /// (start, len).
    pub fn alloc_blocks(&mut self, goal: u64, max_len: u64) -> Result<(u64, u64)> {
        self.claim_blocks(goal, max_len, true)
    }

    /// [`Tx::alloc_blocks`], for file data (`data`) or B+tree nodes (`Ag::claim_blocks`).
    fn claim_blocks(&mut self, goal: u64, max_len: u64, data: bool) -> Result<(u64, u64)> {
        let goal_ag = self.m.geo.block_ag(goal.min(self.m.geo.block_count - 1));
        let mut order: SmallVec<[usize; 4]> = (0..self.reserved.len()).filter(|&i| self.reserved[i].1 > 0).collect();
        order.sort_by_key(|&i| self.reserved[i].0 != goal_ag);
        for i in order {
            let (agno, avail) = self.reserved[i];
            if let Some((start, len)) = self.m.ags[agno as usize].claim_blocks(goal, max_len.min(avail), data) {
                // The reservation covers the claim: data blocks of the AG that reserved them,
                // no more than is left of it (the AG counted them out of its free space then).
                debug_assert!(
                    len > 0
                        && len <= avail
                        && self.m.geo.block_ag(start) == agno
                        && self.m.geo.is_data_range(start, len),
                    "claimed {len} blocks at {start} from {avail} reserved in AG {agno}"
                );
                self.reserved[i].1 -= len;
                self.ops.push(AgOp::BlockAlloc { start, len });
                return Ok((start, len));
            }
        }
        Err(Error::NoSpace)
    }

    /// A new metadata block (B+tree node) from the reservation, zeroed and cached.
    pub fn alloc_meta_block(&mut self, goal: u64) -> Result<BufRef> {
        let (b, _) = self.claim_blocks(goal, 1, false)?;
        self.modified = true;
        Ok(self.m.bufs.get_new(b))
    }

    /// Free `len` blocks from `start` at commit (`meta`: metadata blocks, revoked in the log);
    /// they are reused once the checkpoint that frees them is durable.
    pub fn free_blocks(&mut self, start: u64, len: u64, meta: bool) {
        debug_assert!(self.m.geo.is_data_range(start, len));
        self.modified = true;
        self.ops.push(AgOp::BlockFree { start, len, meta });
    }

    /// Free the inode; it must not be logged again in this transaction.
    pub fn free_inode(&mut self, inode: &InodeRef) {
        self.modified = true;
        self.ops.push(AgOp::InodeFree { ino: inode.ino, log_version: inode.log_version() });
    }

    /// Put an inode on its AG's on-disk orphan list (O(1): one slot in one block).
    pub fn orphan_add(&mut self, ino: u64, di: &mut DiskInode) -> Result<()> {
        debug_assert_eq!(di.orphan_slot, 0);
        if !self.m.orphan_tracking() {
            return Ok(());
        }
        let slot = self.m.ags[ino_ag(ino) as usize].claim_orphan_slot().ok_or(Error::NoSpace)?;
        di.orphan_slot = slot + 1;
        self.ops.push(AgOp::OrphanSet { ino, slot });
        Ok(())
    }

    /// Take an inode off its AG's on-disk orphan list.
    pub fn orphan_remove(&mut self, ino: u64, di: &mut DiskInode) {
        debug_assert_ne!(di.orphan_slot, 0);
        self.ops.push(AgOp::OrphanClear { ino, slot: di.orphan_slot - 1 });
        di.orphan_slot = 0;
    }

    /// The buffer was changed; log it at commit.
    pub fn log_buf(&mut self, b: &BufRef) {
        self.modified = true;
        if !self.bufs.iter().any(|x| x.blkno == b.blkno) {
            self.bufs.push(b.clone());
        }
    }

    /// Snapshot the inode's current state for the log. Call after the last change; `data`
    /// marks a change fdatasync must cover (size or block map). Every change of a directory
    /// counts: its entries and its parent link are its data, and a change that touches
    /// neither (chmod, xattrs) is rare enough not to be worth telling apart.
    pub fn log_inode(&mut self, inode: &InodeRef, di: &DiskInode, data: bool) {
        let data = data || di.is_dir();
        debug_assert!(
            di.check_shape(&self.m.geo).is_ok(),
            "inode {} shape: {:?}",
            inode.ino,
            di.check_shape(&self.m.geo)
        );
        debug_assert!(
            !self.ops.iter().any(|o| matches!(o, AgOp::InodeFree { ino, .. } if *ino == inode.ino)),
            "inode {} logged after it was freed",
            inode.ino
        );
        self.modified = true;
        let mut image = [0u8; INODE_SIZE];
        di.encode(inode.ino, 0, &mut image);
        let version = inode.next_log_version();
        match self.inodes.iter_mut().find(|l| l.inode.ino == inode.ino) {
            Some(l) => {
                l.image = image;
                l.version = version;
                l.data |= data;
            }
            None => self.inodes.push(LoggedInode { inode: inode.clone(), image, version, data }),
        }
    }

    /// Every block this transaction frees must be in use at that point: allocated earlier in
    /// the transaction, or else marked used on disk. A block the disk already calls free is
    /// referenced by a corrupt structure or lost from a corrupt bitmap; freeing it again
    /// would let the allocator hand it to two owners. Checked under the AG locks before any
    /// bit changes, so a failing commit changes no bitmap (and, having changed other
    /// metadata, shuts the file system down when dropped, as XFS does on corruption).
    fn check_frees(&self, guards: &[(u32, MutexGuard<'_, AgState>)]) -> Result<()> {
        let m = self.m;
        for (at, op) in self.ops.iter().enumerate() {
            let AgOp::BlockFree { start, len, .. } = *op else { continue };
            // The state of each block as the ops before this one left it: the last of them
            // that touched it decides, the on-disk bit otherwise.
            let earlier = &self.ops[..at];
            let touched = |b: u64| {
                earlier.iter().rev().find_map(|o| match *o {
                    AgOp::BlockAlloc { start, len } if (start..start + len).contains(&b) => Some(true),
                    AgOp::BlockFree { start, len, .. } if (start..start + len).contains(&b) => Some(false),
                    _ => None,
                })
            };
            let overlaps = earlier.iter().any(|o| match *o {
                AgOp::BlockAlloc { start: s, len: l } | AgOp::BlockFree { start: s, len: l, .. } => {
                    s < start + len && start < s + l
                }
                _ => false,
            });
            let ag = &m.ags[op.agno(m) as usize];
            let g = &guards.iter().find(|(a, _)| *a == op.agno(m)).unwrap().1;
            let free = if overlaps {
                (start..start + len).find(|&b| !touched(b).unwrap_or_else(|| ag.first_disk_free(g, b, 1).is_none()))
            } else {
                ag.first_disk_free(g, start, len)
            };
            if let Some(b) = free {
                return Err(Error::corrupt(
                    "block bitmap",
                    ag.block_bitmap_blkno(b),
                    format!("block {b} is being freed but is marked free"),
                ));
            }
        }
        Ok(())
    }

    /// Apply the AG operations to the on-disk bitmaps and insert everything into the CIL,
    /// atomically. Returns the CIL sequence that holds the change.
    pub fn commit(mut self) -> Result<u64> {
        self.m.check_alive()?;
        let m = self.m;
        // Only the AGs whose bitmaps or orphan tables change are locked through the CIL
        // insertion (another transaction's change to the same block must not reach the log
        // before this one). An AG that only lent a reservation gives back what is left after
        // the commit: holding its lock through the insertion would make every rename and
        // create meet the other threads of the AG there.
        let mut agnos: SmallVec<[u32; 4]> = self.ops.iter().map(|o| o.agno(m)).collect();
        agnos.sort_unstable();
        agnos.dedup();
        let mut guards: SmallVec<[_; 4]> = agnos.iter().map(|&a| (a, m.ags[a as usize].lock())).collect();
        self.check_frees(&guards)?;
        let AgChanges { bufs, busy, revoked } = self.apply_ops(&mut guards);
        // Reservations of locked AGs go back now; the others after the guards drop.
        self.reserved.retain(|&mut (agno, n)| match guards.iter_mut().find(|(a, _)| *a == agno) {
            Some((_, g)) => {
                m.ags[agno as usize].unreserve(g, n);
                false
            }
            None => true,
        });
        let own = self.own_bufs(&revoked);
        debug_assert!(
            own.iter().all(|b| bufs.binary_search_by_key(&b.blkno, |a| a.blkno).is_err()),
            "an AG block changed outside its AG's lock"
        );
        let inodes = std::mem::take(&mut self.inodes);
        let revoked_bufs: Vec<Option<BufRef>> = revoked.iter().map(|&blkno| m.bufs.get(blkno)).collect();
        let log_block = |cil: &mut CilWriter<'_>, b: &BufRef| {
            let v = b.next_log_version();
            let image = b.read();
            cil.log(ItemKey::Block(b.blkno), v, &image[..], b.take_changed(&image));
        };
        let seq = m.journal.commit(self.route, |cil| {
            // What the AG locks guard goes in first; the locks go as soon as it is in (the
            // rest cannot leave this shard's sequence: its lock is held to the end). Copying
            // the directory blocks and inodes under them made threads of one AG wait there.
            for b in &bufs {
                log_block(cil, b);
            }
            for (&blkno, b) in revoked.iter().zip(&revoked_bufs) {
                cil.revoke(blkno, b.as_ref().map_or(0, |b| b.next_log_version()));
            }
            for e in busy {
                cil.busy(e);
            }
            drop(guards);
            for b in &own {
                log_block(cil, b);
            }
            for l in &inodes {
                cil.log(ItemKey::Inode(l.inode.ino), l.version, &l.image[..], ALL_CHUNKS);
            }
        });
        self.release_reservations();
        for l in &inodes {
            l.inode.note_commit(seq, l.data);
        }
        // Until `seq` is home, reclaim must keep these buffers: a reloaded buffer's log
        // version would restart below the images (or revokes) the log still holds. Holding
        // them here (strong references) keeps them cached until their sequence is noted.
        for b in bufs.iter().chain(&own).chain(revoked_bufs.iter().flatten()) {
            b.note_commit(seq);
        }
        self.done = true;
        Ok(seq)
    }

    /// The AG operations applied to the AGs' blocks (bitmaps, orphan tables), under the AG
    /// locks `guards` of `commit`: the blocks changed, sorted, the extents freed, and the
    /// metadata blocks among them (revoked rather than logged).
    fn apply_ops(&self, guards: &mut [(u32, MutexGuard<'_, AgState>)]) -> AgChanges {
        let m = self.m;
        let mut changes = AgChanges { bufs: SmallVec::new(), busy: SmallVec::new(), revoked: SmallVec::new() };
        let AgChanges { bufs, busy, revoked } = &mut changes;
        for op in &self.ops {
            let agno = op.agno(m);
            let ag = &m.ags[agno as usize];
            let g = &mut guards.iter_mut().find(|(a, _)| *a == agno).unwrap().1;
            match *op {
                AgOp::InodeAlloc { ino } => bufs.push(ag.alloc_disk_inode(ino_index(ino))),
                AgOp::InodeFree { ino, log_version } => bufs.push(ag.free_disk_inode(g, ino_index(ino), log_version)),
                AgOp::BlockAlloc { start, len } => bufs.extend(ag.set_disk_blocks(start, len, true)),
                AgOp::BlockFree { start, len, meta } => {
                    bufs.extend(ag.free_disk_blocks(g, start, len));
                    busy.push(BusyExtent { blkno: start, len: len as u32 });
                    if meta {
                        revoked.extend(start..start + len);
                    }
                }
                AgOp::OrphanSet { ino, slot } => bufs.push(ag.set_disk_orphan(g, slot, ino)),
                AgOp::OrphanClear { slot, .. } => bufs.push(ag.set_disk_orphan(g, slot, 0)),
            }
        }
        bufs.sort_unstable_by_key(|b| b.blkno);
        bufs.dedup_by_key(|b| b.blkno);
        changes
    }

    /// The transaction's own blocks (directory and tree nodes), changed under the inode
    /// locks its caller holds, sorted; a node it freed is revoked instead.
    fn own_bufs(&mut self, revoked: &[u64]) -> SmallVec<[BufRef; 4]> {
        let mut own = std::mem::take(&mut self.bufs);
        own.sort_unstable_by_key(|b| b.blkno);
        own.dedup_by_key(|b| b.blkno);
        own.retain(|b| !revoked.contains(&b.blkno));
        own
    }
}

impl Tx<'_> {
    /// Give back the unused block reservations still held, each under its AG's lock.
    fn release_reservations(&mut self) {
        for (agno, n) in self.reserved.drain(..) {
            let ag = &self.m.ags[agno as usize];
            ag.unreserve(&mut ag.lock(), n);
        }
    }
}

impl Drop for Tx<'_> {
    /// An abandoned transaction gives back its claims. If it had already changed shared
    /// in-memory metadata, that state can no longer be trusted: shut down.
    fn drop(&mut self) {
        if self.done {
            return;
        }
        self.release_reservations();
        for op in &self.ops {
            let ag = &self.m.ags[op.agno(self.m) as usize];
            match *op {
                AgOp::InodeAlloc { ino } => ag.unclaim_inode(&mut ag.lock(), ino_index(ino)),
                AgOp::BlockAlloc { start, len } => ag.unclaim_blocks(&mut ag.lock(), start, len),
                AgOp::OrphanSet { slot, .. } => ag.unclaim_orphan_slot(&mut ag.lock(), slot),
                _ => {}
            }
        }
        if self.modified {
            self.m.shutdown("transaction cancelled after it changed metadata");
        }
    }
}
