//! rename(2) and renameat2(2): the fast path under the parents' locks, the slow path
//! in lock order, and the entry and link-count changes they share.

use super::*;

/// The inode a `RENAME_WHITEOUT` leaves at the source name: claimed before any lock.
struct Whiteout {
    ino: u64,
    gen: u32,
    log_version: u64,
    cred: Cred,
}

/// The inodes a rename changes, all locked.
#[derive(Clone, Copy)]
struct RenameInodes<'a> {
    old_dir: &'a InodeRef,
    new_dir: &'a InodeRef,
    src: &'a InodeRef,
    /// What the new name held, if anything: replaced, or exchanged with `src`.
    dst: Option<&'a InodeRef>,
}

/// The two names of a rename, and what they were found to hold under the parents' locks.
struct RenameNames<'a> {
    old_name: &'a [u8],
    old_entry: dir::Entry,
    new_name: &'a [u8],
    new_entry: Option<dir::Entry>,
}

/// A rename's working copies of the inodes it changes, stored back once it committed.
struct RenameCopies {
    old_dir: DiskInode,
    /// None when both names are in one directory.
    new_dir: Option<DiskInode>,
    src: DiskInode,
    dst: Option<DiskInode>,
}

impl FileSystem {
    /// rename(2)/renameat2(2); a whiteout left by `RENAME_WHITEOUT` belongs to root (see
    /// `rename_as`).
    pub fn rename(&self, oldparent: u64, oldname: &[u8], newparent: u64, newname: &[u8], flags: u32) -> Result<()> {
        self.rename_as(oldparent, oldname, newparent, newname, flags, Cred::default())
    }

    /// rename, with `cred` owning the whiteout `RENAME_WHITEOUT` leaves (the caller, as on
    /// Linux).
    pub fn rename_as(
        &self,
        oldparent: u64,
        oldname: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
        cred: Cred,
    ) -> Result<()> {
        let exchange = flags & RENAME_EXCHANGE != 0;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0
            || (exchange && flags != RENAME_EXCHANGE)
        {
            return Err(Error::Invalid("rename flags"));
        }
        dir::check_name(newname)?;
        let _changing = self.m.start_change();
        // Begin (which may wait for CIL space) and reserve for the insertion before any
        // directory lock: threads renaming in one directory then meet only for the entry
        // changes and the commit. A whiteout's inode is claimed here too, as a create's is.
        let mut tx = Tx::new(&self.m)?;
        let claim_error = |error| self.early_claim_error(error, oldparent, oldname, true);
        tx.reserve(ino_ag(newparent), dir::INSERT_RESERVE).map_err(claim_error)?;
        let whiteout = match flags & RENAME_WHITEOUT {
            0 => None,
            _ => {
                let (ino, gen, log_version) = tx.alloc_inode(ino_ag(oldparent), 0).map_err(claim_error)?;
                Some(Whiteout { ino, gen, log_version, cred })
            }
        };
        let whiteout = whiteout.as_ref();
        let Some(tx) = self.rename_under_parent_locks(tx, oldparent, oldname, newparent, newname, flags, whiteout)?
        else {
            return Ok(());
        };
        self.rename_in_lock_order(tx, (oldparent, oldname), (newparent, newname), flags, whiteout)
    }

    /// The slow path: look the names up, then lock every inode in ascending order (and the
    /// rename lock first when a directory changes parent), retrying if a name changed while
    /// nothing was locked.
    fn rename_in_lock_order(
        &self,
        tx: Tx,
        (oldparent, oldname): (u64, &[u8]),
        (newparent, newname): (u64, &[u8]),
        flags: u32,
        whiteout: Option<&Whiteout>,
    ) -> Result<()> {
        // No computed bound: a retry means another operation changed one of the names
        // between the lookup and the locks, and each such change completed (as the VFS's
        // lookup retries).
        loop {
            let (old_dir, src) = self.lookup_child(oldparent, oldname)?;
            let new_dir = self.m.iget(newparent)?;
            let dst = {
                let new_dir_inode = new_dir.core.read();
                if !new_dir_inode.is_dir() {
                    return Err(Error::NotDir);
                }
                // A removed directory that is still open takes no new entries (Linux:
                // IS_DEADDIR); an entry there would leak with the directory.
                if new_dir_inode.nlink == 0 {
                    return Err(Error::NotFound);
                }
                match dir::lookup(&self.m, newparent, &new_dir_inode, newname)? {
                    Some(entry) => Some(self.m.iget(entry.ino)?),
                    None => None,
                }
            };
            if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
                return Err(Error::Exists);
            }
            if flags & RENAME_EXCHANGE != 0 && dst.is_none() {
                return Err(Error::NotFound);
            }
            if dst.as_ref().is_some_and(|dst| dst.ino == src.ino) {
                return Ok(());
            }
            let moves_dir = oldparent != newparent
                && (src.core.read().is_dir() || dst.as_ref().is_some_and(|dst| dst.core.read().is_dir()));
            let _rename = moves_dir.then(|| self.rename_lock.lock());
            if moves_dir {
                self.check_not_ancestor(src.ino, newparent)?;
                if flags & RENAME_EXCHANGE != 0 {
                    self.check_not_ancestor(dst.as_ref().unwrap().ino, oldparent)?;
                }
            }
            let mut set = vec![&old_dir, &new_dir, &src];
            set.extend(dst.as_ref());
            let mut locked = Locked::new(&set);
            // Retry if a name changed or the new parent was removed meanwhile (the retry
            // then reports ENOENT for it).
            let old_entry = dir::lookup(&self.m, oldparent, locked.get(oldparent), oldname)?;
            let new_entry = dir::lookup(&self.m, newparent, locked.get(newparent), newname)?;
            let old_entry = match old_entry {
                Some(entry) if entry.ino == src.ino => entry,
                _ => continue,
            };
            if new_entry.map(|entry| entry.ino) != dst.as_ref().map(|dst| dst.ino) || locked.get(newparent).nlink == 0 {
                continue;
            }
            let inodes = RenameInodes { old_dir: &old_dir, new_dir: &new_dir, src: &src, dst: dst.as_ref() };
            let names = RenameNames { old_name: oldname, old_entry, new_name: newname, new_entry };
            self.rename_locked(&mut locked, tx, inodes, &names, flags, whiteout)?;
            drop(locked);
            // A replaced target that is open or large is freed now that the locks are gone.
            return match dst.filter(|_| flags & RENAME_EXCHANGE == 0) {
                Some(replaced) => self.reap_if_unused(&replaced),
                None => Ok(()),
            };
        }
    }

    /// The common rename: lock both parents, look both names up under those locks and lock
    /// the inodes they name beside them (`Locked::add`), so a busy directory's lock is taken
    /// once per rename. Gives `tx` back, with nothing changed, if that cannot keep the lock
    /// order: an inode's lock was busy, or a directory moves to another parent (the rename
    /// lock, taken before any inode lock, guards the loop check). The checks and errors are
    /// the slow path's, in its order.
    #[allow(clippy::too_many_arguments)]
    fn rename_under_parent_locks<'m>(
        &'m self,
        tx: Tx<'m>,
        oldparent: u64,
        oldname: &[u8],
        newparent: u64,
        newname: &[u8],
        flags: u32,
        whiteout: Option<&Whiteout>,
    ) -> Result<Option<Tx<'m>>> {
        dir::check_name(oldname)?;
        let (old_dir, new_dir) = (self.m.iget(oldparent)?, self.m.iget(newparent)?);
        let src: InodeRef;
        let dst: Option<InodeRef>;
        let mut locked = Locked::new(&[&old_dir, &new_dir]);
        if !locked.get(oldparent).is_dir() {
            return Err(Error::NotDir);
        }
        let old_entry = dir::lookup(&self.m, oldparent, locked.get(oldparent), oldname)?.ok_or(Error::NotFound)?;
        let src_ino = old_entry.ino;
        let new_dir_inode = locked.get(newparent);
        if !new_dir_inode.is_dir() {
            return Err(Error::NotDir);
        }
        if new_dir_inode.nlink == 0 {
            return Err(Error::NotFound);
        }
        let new_entry = dir::lookup(&self.m, newparent, new_dir_inode, newname)?;
        let dst_ino = new_entry.map(|entry| entry.ino);
        src = self.m.iget(src_ino)?;
        dst = dst_ino.map(|ino| self.m.iget(ino)).transpose()?;
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            return Err(Error::Exists);
        }
        if flags & RENAME_EXCHANGE != 0 && dst.is_none() {
            return Err(Error::NotFound);
        }
        if dst_ino == Some(src_ino) {
            return Ok(None);
        }
        let children: &[&InodeRef] = match &dst {
            Some(dst) => &[&src, dst],
            None => &[&src],
        };
        if !locked.add(children) {
            return Ok(Some(tx));
        }
        if oldparent != newparent
            && (locked.get(src_ino).is_dir() || dst_ino.is_some_and(|ino| locked.get(ino).is_dir()))
        {
            return Ok(Some(tx));
        }
        let inodes = RenameInodes { old_dir: &old_dir, new_dir: &new_dir, src: &src, dst: dst.as_ref() };
        let names = RenameNames { old_name: oldname, old_entry, new_name: newname, new_entry };
        self.rename_locked(&mut locked, tx, inodes, &names, flags, whiteout)?;
        drop(locked);
        // A replaced target that is open or large is freed now that the locks are gone.
        if let Some(replaced) = dst.filter(|_| flags & RENAME_EXCHANGE == 0) {
            self.reap_if_unused(&replaced)?;
        }
        Ok(None)
    }

    /// EINVAL if `dir` is `ancestor` or lies below it (moving a directory into itself).
    fn check_not_ancestor(&self, ancestor: u64, dir: u64) -> Result<()> {
        let mut cur = dir;
        for _ in 0..4096 {
            if cur == ancestor {
                return Err(Error::Invalid("rename into own subdirectory"));
            }
            if cur == ROOT_INO {
                return Ok(());
            }
            cur = self.m.iget(cur)?.core.read().parent;
        }
        Err(Error::corrupt("directory", dir, "parent chain does not reach the root"))
    }

    /// Make the rename in `tx` and commit it: every inode in `inodes` is locked in `locked`,
    /// and `names` says what the names held under those locks.
    fn rename_locked(
        &self,
        locked: &mut Locked,
        mut tx: Tx,
        inodes: RenameInodes,
        names: &RenameNames,
        flags: u32,
        whiteout: Option<&Whiteout>,
    ) -> Result<()> {
        let RenameInodes { old_dir, new_dir, src, dst } = inodes;
        debug_assert!(locked.holds(&[old_dir.ino, new_dir.ino, src.ino]), "rename: inodes not locked");
        debug_assert!(dst.is_none_or(|dst| locked.holds(&[dst.ino])), "rename: target not locked");
        let exchange = flags & RENAME_EXCHANGE != 0;
        let same_dir = old_dir.ino == new_dir.ino;
        let mut copies = RenameCopies {
            old_dir: locked.get(old_dir.ino).clone(),
            new_dir: (!same_dir).then(|| locked.get(new_dir.ino).clone()),
            src: locked.get(src.ino).clone(),
            dst: dst.map(|dst| locked.get(dst.ino).clone()),
        };
        check_rename_kinds(&copies, exchange)?;
        tx.route_by(old_dir);
        if !same_dir {
            tx.route_by(new_dir);
        }
        let time = now();
        self.rename_entries(&mut tx, inodes, names, &mut copies, exchange, whiteout)?;
        move_dir_links(inodes, &mut copies, exchange)?;
        let mut freed = false;
        if let (Some(dst), Some(dst_copy)) = (dst, copies.dst.as_mut()) {
            if exchange {
                if dst_copy.is_dir() && !same_dir {
                    dst_copy.parent = old_dir.ino;
                }
                dst_copy.ctime = time;
                tx.log_inode(dst, dst_copy, false);
            } else {
                if dst_copy.is_dir() && same_dir {
                    copies.old_dir.drop_dir_link(old_dir.ino)?;
                }
                freed = self.drop_link(&mut tx, dst, dst_copy, time)?;
            }
        }
        copies.src.ctime = time;
        copies.old_dir.mtime = time;
        copies.old_dir.ctime = time;
        tx.log_inode(src, &copies.src, false);
        tx.log_inode(old_dir, &copies.old_dir, false);
        if let Some(new_dir_copy) = copies.new_dir.as_mut() {
            new_dir_copy.mtime = time;
            new_dir_copy.ctime = time;
            tx.log_inode(new_dir, new_dir_copy, false);
        }
        let whiteout = whiteout.map(|whiteout| log_whiteout(&mut tx, whiteout, &copies.old_dir, time));
        self.commit_with_new_inode(tx, whiteout)?;
        locked.set(src.ino, copies.src);
        locked.set(old_dir.ino, copies.old_dir);
        if let Some(new_dir_copy) = copies.new_dir {
            locked.set(new_dir.ino, new_dir_copy);
        }
        if let (Some(dst), Some(dst_copy)) = (dst, copies.dst) {
            locked.set(dst.ino, dst_copy);
        }
        if let (true, Some(replaced)) = (freed, dst) {
            // Only if still ours: a create may have claimed the number since the commit.
            self.m.icache.remove_if(replaced);
        }
        Ok(())
    }

    /// The entry changes: the old name goes (or names the exchanged inode, or the
    /// whiteout), and the new name names the source.
    fn rename_entries(
        &self,
        tx: &mut Tx,
        inodes: RenameInodes,
        names: &RenameNames,
        copies: &mut RenameCopies,
        exchange: bool,
        whiteout: Option<&Whiteout>,
    ) -> Result<()> {
        let (old_dir_ino, new_dir_ino) = (inodes.old_dir.ino, inodes.new_dir.ino);
        let goal = self.dir_goal(old_dir_ino, &copies.old_dir);
        let mut store = TxStore::new(tx, old_dir_ino, goal);
        match (inodes.dst, copies.dst.as_ref(), whiteout) {
            (Some(dst), Some(dst_copy), _) if exchange => dir::retarget(
                &mut store,
                &mut copies.old_dir,
                &names.old_entry,
                names.old_name,
                dst.ino,
                ftype_of(dst_copy.mode),
            )?,
            (_, _, Some(whiteout)) => dir::retarget(
                &mut store,
                &mut copies.old_dir,
                &names.old_entry,
                names.old_name,
                whiteout.ino,
                ftype_of(S_IFCHR),
            )?,
            _ => dir::remove(&mut store, &mut copies.old_dir, &names.old_entry)?,
        }
        let tree_delta = store.blocks;
        copies.old_dir.add_blocks(old_dir_ino, tree_delta)?;
        let target = copies.new_dir.as_mut().unwrap_or(&mut copies.old_dir);
        let goal = self.dir_goal(new_dir_ino, target);
        let mut store = TxStore::new(tx, new_dir_ino, goal);
        let (src_ino, src_ftype) = (inodes.src.ino, ftype_of(copies.src.mode));
        // Entries are keyed by their name's hash: removing the old name moved no other.
        match names.new_entry {
            Some(entry) => dir::retarget(&mut store, target, &entry, names.new_name, src_ino, src_ftype)?,
            None => dir::insert(&mut store, new_dir_ino, target, names.new_name, src_ino, src_ftype)?,
        }
        let tree_delta = store.blocks;
        target.add_blocks(new_dir_ino, tree_delta)
    }
}

/// The checks made before anything changes: a replaced target must be of the source's
/// kind (and empty, for a directory), and a directory moving to another parent adds a link
/// there (and, exchanged with a file, to the old parent), so refuse past the limit.
fn check_rename_kinds(copies: &RenameCopies, exchange: bool) -> Result<()> {
    let src_is_dir = copies.src.is_dir();
    if let (Some(dst), false) = (&copies.dst, exchange) {
        match (src_is_dir, dst.is_dir()) {
            (true, false) => return Err(Error::NotDir),
            (false, true) => return Err(Error::IsDir),
            (true, true) if dir::root_of(dst) != 0 => return Err(Error::NotEmpty),
            _ => {}
        }
    }
    let dst_is_dir = copies.dst.as_ref().is_some_and(DiskInode::is_dir);
    let new_gains = src_is_dir && !dst_is_dir;
    let old_gains = exchange && dst_is_dir && !src_is_dir;
    if let Some(new_dir) = &copies.new_dir {
        if (new_gains && new_dir.nlink >= LINK_MAX) || (old_gains && copies.old_dir.nlink >= LINK_MAX) {
            return Err(Error::TooManyLinks);
        }
    }
    Ok(())
}

/// A directory that changes parent takes a link from the old parent to the new one (and,
/// exchanged with a file, the file's parent gains the link the directory's loses); its
/// `..` follows it. The gaining parent's limit was checked before the transaction.
fn move_dir_links(inodes: RenameInodes, copies: &mut RenameCopies, exchange: bool) -> Result<()> {
    let (old_dir_ino, new_dir_ino) = (inodes.old_dir.ino, inodes.new_dir.ino);
    let src_is_dir = copies.src.is_dir();
    if let (Some(dst_copy), Some(new_dir_copy)) = (copies.dst.as_ref(), copies.new_dir.as_mut()) {
        if exchange && dst_copy.is_dir() != src_is_dir {
            if src_is_dir {
                debug_assert!(new_dir_copy.nlink < LINK_MAX, "rename: inode {new_dir_ino} nlink past LINK_MAX");
                new_dir_copy.nlink += 1;
                copies.old_dir.drop_dir_link(old_dir_ino)?;
            } else {
                debug_assert!(copies.old_dir.nlink < LINK_MAX, "rename: inode {old_dir_ino} nlink past LINK_MAX");
                copies.old_dir.nlink += 1;
                new_dir_copy.drop_dir_link(new_dir_ino)?;
            }
        }
    }
    if src_is_dir && old_dir_ino != new_dir_ino {
        copies.src.parent = new_dir_ino;
        let replaced_dir = copies.dst.as_ref().is_some_and(|dst| dst.is_dir() && !exchange);
        if !exchange {
            copies.old_dir.drop_dir_link(old_dir_ino)?;
            if !replaced_dir {
                let new_dir_copy = copies.new_dir.as_mut().expect("two parents have two copies");
                debug_assert!(new_dir_copy.nlink < LINK_MAX, "rename: inode {new_dir_ino} nlink past LINK_MAX");
                new_dir_copy.nlink += 1;
            }
        }
    }
    Ok(())
}

/// Log the whiteout left at the old name: a character device 0:0 in the old parent.
fn log_whiteout(tx: &mut Tx, whiteout: &Whiteout, old_dir: &DiskInode, time: Timespec) -> InodeRef {
    let mut disk_inode = DiskInode::new(S_IFCHR, whiteout.cred.uid, whiteout.cred.gid, time, whiteout.gen);
    inherit_setgid(old_dir, &mut disk_inode);
    disk_inode.fork = Fork::Device(0);
    let inode = Inode::new(whiteout.ino, disk_inode.clone(), whiteout.log_version);
    tx.log_inode(&inode, &disk_inode, true);
    inode
}
