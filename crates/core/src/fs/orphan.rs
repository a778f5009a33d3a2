//! Freeing inodes that lost their last name: at their last reference (a close, the kernel's
//! forget), after an unlink or a rename replaced them, and at mount for those the orphan
//! lists say were in flight.

use super::data::Step;
use super::*;

impl FileSystem {
    /// Open a handle: the inode stays allocated until the last handle is released, even if
    /// it is unlinked meanwhile.
    pub fn open(&self, ino: u64) -> Result<Attr> {
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        if g.nlink == 0 && g.orphan_slot == 0 {
            return Err(Error::Stale);
        }
        // Under the inode's lock: an unlink either sees this handle or freed the inode first.
        self.m.holds.take(ino, 1);
        Ok(Attr::from_inode(ino, &g))
    }

    /// Close a handle `open` gave; the last close of an unlinked inode frees it.
    pub fn release(&self, ino: u64) -> Result<()> {
        self.forget(ino, 1)
    }

    /// Take a reference to `ino` for a client that was just given its number and keeps it
    /// (the FUSE kernel's lookup count: each entry it is sent counts one): the inode stays
    /// allocated, even unlinked, until `forget` drops every reference. Costs no inode load:
    /// the references live in a table apart from the inode cache.
    pub fn hold(&self, ino: u64) {
        self.m.holds.take(ino, 1);
    }

    /// Drop `n` references that `hold` or `open` took; the last one of an unlinked inode
    /// frees it. Loads the inode only then.
    pub fn forget(&self, ino: u64, n: u64) -> Result<()> {
        if !self.m.holds.drop(ino, n) {
            return Ok(());
        }
        // A change waiting here for a thaw keeps an allocation's `wait_for_frees` waiting
        // only for its bounded time.
        let _changing = self.m.start_change();
        let reaped = self.m.iget(ino).and_then(|i| self.reap_if_unused(&i));
        self.m.holds.freed();
        reaped
    }

    /// Drop every reference (the client that held them is gone, as at unmount: the kernel
    /// forgets nothing then) and free the unlinked inodes they kept. Those that cannot be
    /// freed now (the file system is read-only or failed) stay on the orphan list, which the
    /// next mount processes.
    pub fn forget_all(&self) -> Result<()> {
        let mut result = Ok(());
        let _changing = self.m.start_change();
        for ino in self.m.holds.drain() {
            let reaped = self.m.iget(ino).and_then(|i| self.reap_if_unused(&i));
            self.m.holds.freed();
            result = result.and(reaped);
        }
        result
    }

    /// If the inode has no links and no references, free it (in batches, on the orphan
    /// list until done). Only while `i` itself is the cached inode of its number: once it
    /// was freed, a create may have reused the number for a new inode, which is not ours to
    /// free.
    pub(super) fn reap_if_unused(&self, i: &InodeRef) -> Result<()> {
        let mut g = i.core.write();
        if g.nlink > 0
            || self.m.holds.is_held(i.ino)
            || !self.m.ags[ino_ag(i.ino) as usize].inode_in_use(crate::format::ino_index(i.ino))
            || !self.m.icache.get(i.ino).is_some_and(|cached| Arc::ptr_eq(&cached, i))
        {
            return Ok(());
        }
        self.reap(i, &mut g)
    }

    fn reap(&self, i: &InodeRef, g: &mut DiskInode) -> Result<()> {
        debug_assert_eq!(g.nlink, 0, "reap of inode {} that has names", i.ino);
        self.in_steps(i, g, |tx, updated| {
            let done = self.unmap_from(tx, i.ino, updated, 0)? && self.free_xattr_values(tx, i.ino, updated)?;
            if done {
                xattr::destroy(&mut TxStore::new(tx, i.ino, 0), updated)?;
                if updated.orphan_slot != 0 {
                    tx.orphan_remove(i.ino, updated);
                }
                tx.free_inode(i);
                return Ok(Step::Freed);
            }
            if updated.orphan_slot == 0 {
                tx.orphan_add(i.ino, updated)?;
            }
            Ok(Step::More)
        })?;
        // Only if still ours: a create may have claimed the freed number already.
        self.m.icache.remove_if(i);
        Ok(())
    }

    /// Free up to one batch of the value blocks of the inode's xattrs. Returns whether none is
    /// left.
    fn free_xattr_values(&self, tx: &mut Tx, ino: u64, updated: &mut DiskInode) -> Result<bool> {
        let mut store = TxStore::new(tx, ino, 0);
        let done = xattr::free_values(&mut store, updated, xattr::FREE_BATCH_BLOCKS)?;
        updated.add_blocks(ino, store.blocks)?;
        Ok(done)
    }

    /// Mount-time: every inode on an orphan list is either unlinked (free it) or was being
    /// truncated (finish cutting it to its size).
    pub(super) fn process_orphans(&self) -> Result<()> {
        for ag in self.m.ags.iter() {
            for (_, ino) in ag.orphans() {
                let i = self.m.iget(ino).map_err(|_| {
                    Error::corrupt(
                        "orphan table",
                        ag.layout.orphan_table,
                        format!("entry {} is not an allocated inode", ino),
                    )
                })?;
                let mut g = i.core.write();
                if g.nlink == 0 {
                    self.reap(&i, &mut g)?;
                } else {
                    let size = g.size;
                    self.truncate(&i, &mut g, size, &|_| {})?;
                }
            }
        }
        Ok(())
    }
}
