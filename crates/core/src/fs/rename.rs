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

impl FileSystem {
    /// rename(2)/renameat2(2); a whiteout left by `RENAME_WHITEOUT` belongs to root (see
    /// `rename_as`).
    pub fn rename(&self, oldparent: u64, oldname: &[u8], newparent: u64, newname: &[u8], flags: u32) -> Result<()> {
        self.rename_as(oldparent, oldname, newparent, newname, flags, Cred::default())
    }

    /// rename, with `cred` owning the whiteout `RENAME_WHITEOUT` leaves (the caller, as on
    /// Linux).
    pub fn rename_as(&self, oldparent: u64, oldname: &[u8], newparent: u64, newname: &[u8], flags: u32, cred: Cred) -> Result<()> {
        let exchange = flags & RENAME_EXCHANGE != 0;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE | RENAME_WHITEOUT) != 0 || (exchange && flags != RENAME_EXCHANGE) {
            return Err(Error::Invalid("rename flags"));
        }
        dir::check_name(newname)?;
        // Begin (which may wait for CIL space) and reserve for the insertion before any
        // directory lock: threads renaming in one directory then meet only for the entry
        // changes and the commit. A whiteout's inode is claimed here too, as a create's is.
        let mut tx = Tx::new(&self.m)?;
        let claim_error = |e| self.early_claim_error(e, oldparent, oldname, true);
        tx.reserve(ino_ag(newparent), dir::INSERT_RESERVE).map_err(claim_error)?;
        let whiteout = match flags & RENAME_WHITEOUT {
            0 => None,
            _ => {
                let (ino, gen, log_version) = tx.alloc_inode(ino_ag(oldparent), 0).map_err(claim_error)?;
                Some(Whiteout { ino, gen, log_version, cred })
            }
        };
        let whiteout = whiteout.as_ref();
        let Some(tx) = self.rename_under_parent_locks(tx, oldparent, oldname, newparent, newname, flags, whiteout)? else {
            return Ok(());
        };
        loop {
            let (op, src) = self.lookup_child(oldparent, oldname)?;
            let np = self.m.iget(newparent)?;
            let dst = {
                let npd = np.core.read();
                if !npd.is_dir() {
                    return Err(Error::NotDir);
                }
                // A removed directory that is still open takes no new entries (Linux:
                // IS_DEADDIR); an entry there would leak with the directory.
                if npd.nlink == 0 {
                    return Err(Error::NotFound);
                }
                match dir::lookup(&self.m, newparent, &npd, newname)? {
                    Some(e) => Some(self.m.iget(e.ino)?),
                    None => None,
                }
            };
            if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
                return Err(Error::Exists);
            }
            if flags & RENAME_EXCHANGE != 0 && dst.is_none() {
                return Err(Error::NotFound);
            }
            if dst.as_ref().is_some_and(|d| d.ino == src.ino) {
                return Ok(());
            }
            let moves_dir = oldparent != newparent && (src.core.read().is_dir() || dst.as_ref().is_some_and(|d| d.core.read().is_dir()));
            let _rename = moves_dir.then(|| self.rename_lock.lock());
            if moves_dir {
                self.check_not_ancestor(src.ino, newparent)?;
                if flags & RENAME_EXCHANGE != 0 {
                    self.check_not_ancestor(dst.as_ref().unwrap().ino, oldparent)?;
                }
            }
            let mut set = vec![&op, &np, &src];
            set.extend(dst.as_ref());
            let mut l = Locked::new(&set);
            // Retry if a name changed or the new parent was removed meanwhile (the retry
            // then reports ENOENT for it).
            let old_e = dir::lookup(&self.m, oldparent, l.get(oldparent), oldname)?;
            let new_e = dir::lookup(&self.m, newparent, l.get(newparent), newname)?;
            let old_e = match old_e {
                Some(e) if e.ino == src.ino => e,
                _ => continue,
            };
            if new_e.map(|e| e.ino) != dst.as_ref().map(|d| d.ino) || l.get(newparent).nlink == 0 {
                continue;
            }
            self.rename_locked(&mut l, tx, [&op, &np, &src], dst.as_ref(), (old_e, oldname), (new_e, newname), flags, whiteout)?;
            drop(l);
            // A replaced target that is open or large is freed now that the locks are gone.
            return match dst.filter(|_| flags & RENAME_EXCHANGE == 0) {
                Some(d) => self.reap_if_unused(&d),
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
    fn rename_under_parent_locks<'m>(&'m self, tx: Tx<'m>, oldparent: u64, oldname: &[u8], newparent: u64, newname: &[u8], flags: u32, whiteout: Option<&Whiteout>) -> Result<Option<Tx<'m>>> {
        dir::check_name(oldname)?;
        let (op, np) = (self.m.iget(oldparent)?, self.m.iget(newparent)?);
        let src: InodeRef;
        let dst: Option<InodeRef>;
        let mut l = Locked::new(&[&op, &np]);
        if !l.get(oldparent).is_dir() {
            return Err(Error::NotDir);
        }
        let old_e = dir::lookup(&self.m, oldparent, l.get(oldparent), oldname)?.ok_or(Error::NotFound)?;
        let src_ino = old_e.ino;
        let npd = l.get(newparent);
        if !npd.is_dir() {
            return Err(Error::NotDir);
        }
        if npd.nlink == 0 {
            return Err(Error::NotFound);
        }
        let new_e = dir::lookup(&self.m, newparent, npd, newname)?;
        let dst_ino = new_e.map(|e| e.ino);
        src = self.m.iget(src_ino)?;
        dst = dst_ino.map(|i| self.m.iget(i)).transpose()?;
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
            Some(d) => &[&src, d],
            None => &[&src],
        };
        if !l.add(children) {
            return Ok(Some(tx));
        }
        if oldparent != newparent && (l.get(src_ino).is_dir() || dst_ino.is_some_and(|d| l.get(d).is_dir())) {
            return Ok(Some(tx));
        }
        self.rename_locked(&mut l, tx, [&op, &np, &src], dst.as_ref(), (old_e, oldname), (new_e, newname), flags, whiteout)?;
        drop(l);
        // A replaced target that is open or large is freed now that the locks are gone.
        if let Some(d) = dst.filter(|_| flags & RENAME_EXCHANGE == 0) {
            self.reap_if_unused(&d)?;
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

    /// `old` and `new`: the names and what they were found to hold under the parents' locks.
    #[allow(clippy::too_many_arguments)]
    fn rename_locked(&self, l: &mut Locked, mut tx: Tx, [op, np, src]: [&InodeRef; 3], dst: Option<&InodeRef>, (old_e, oldname): (dir::Entry, &[u8]), (new_e, newname): (Option<dir::Entry>, &[u8]), flags: u32, whiteout: Option<&Whiteout>) -> Result<()> {
        let (opi, npi) = (op.ino, np.ino);
        let mut sd = l.get(src.ino).clone();
        let mut dd = dst.map(|d| l.get(d.ino).clone());
        let exchange = flags & RENAME_EXCHANGE != 0;
        if let (Some(d), false) = (&dd, exchange) {
            match (sd.is_dir(), d.is_dir()) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                (true, true) if dir::root_of(d) != 0 => return Err(Error::NotEmpty),
                _ => {}
            }
        }
        // A directory moving to another parent adds a link there (and, exchanged with a
        // file, to the old parent): refuse past the limit before anything changes.
        let dst_dir = dd.as_ref().is_some_and(DiskInode::is_dir);
        let new_gains = sd.is_dir() && !dst_dir;
        let old_gains = exchange && dst_dir && !sd.is_dir();
        if opi != npi && ((new_gains && l.get(npi).nlink >= LINK_MAX) || (old_gains && l.get(opi).nlink >= LINK_MAX)) {
            return Err(Error::TooManyLinks);
        }
        tx.route_by(op);
        if opi != npi {
            tx.route_by(np);
        }
        let t = now();
        let mut opd = l.get(opi).clone();
        let mut npd = if opi == npi { None } else { Some(l.get(npi).clone()) };
        let mut freed = false;
        {
            let goal = self.dir_goal(opi, &opd);
            let mut s = TxStore::new(&mut tx, opi, goal);
            if exchange {
                let d = dd.as_ref().unwrap();
                dir::retarget(&mut s, &mut opd, &old_e, oldname, dst.unwrap().ino, ftype_of(d.mode))?;
            } else if let Some(w) = whiteout {
                dir::retarget(&mut s, &mut opd, &old_e, oldname, w.ino, ftype_of(S_IFCHR))?;
            } else {
                dir::remove(&mut s, &mut opd, &old_e)?;
            }
            opd.add_blocks(opi, s.blocks)?;
        }
        {
            let target = npd.as_mut().unwrap_or(&mut opd);
            let goal = self.dir_goal(npi, target);
            let mut s = TxStore::new(&mut tx, npi, goal);
            // Entries are keyed by their name's hash: removing the old name moved no other.
            match new_e {
                Some(e) => dir::retarget(&mut s, target, &e, newname, src.ino, ftype_of(sd.mode))?,
                None => dir::insert(&mut s, npi, target, newname, src.ino, ftype_of(sd.mode))?,
            }
            target.add_blocks(npi, s.blocks)?;
        }
        if let (Some(d), Some(npd)) = (dd.as_mut(), npd.as_mut()) {
            if exchange && d.is_dir() != sd.is_dir() {
                // A directory moved each way: parent link counts follow it (the gaining
                // parent's limit was checked before the transaction).
                if sd.is_dir() {
                    npd.nlink += 1;
                    opd.drop_dir_link(opi)?;
                } else {
                    opd.nlink += 1;
                    npd.drop_dir_link(npi)?;
                }
            }
        }
        if sd.is_dir() && opi != npi {
            sd.parent = npi;
            let replaced_dir = dd.as_ref().is_some_and(|d| d.is_dir() && !exchange);
            if !exchange {
                opd.drop_dir_link(opi)?;
                if !replaced_dir {
                    npd.as_mut().unwrap().nlink += 1;
                }
            }
        }
        if let Some(d) = dd.as_mut() {
            if exchange {
                if d.is_dir() && opi != npi {
                    d.parent = opi;
                }
                d.ctime = t;
                tx.log_inode(dst.unwrap(), d, false);
            } else {
                if d.is_dir() && opi == npi {
                    opd.drop_dir_link(opi)?;
                }
                freed = self.drop_link(&mut tx, dst.unwrap(), d, t)?;
            }
        }
        sd.ctime = t;
        opd.mtime = t;
        opd.ctime = t;
        tx.log_inode(src, &sd, false);
        tx.log_inode(op, &opd, false);
        if let Some(npd) = npd.as_mut() {
            npd.mtime = t;
            npd.ctime = t;
            tx.log_inode(np, npd, false);
        }
        let whiteout = whiteout.map(|w| {
            let mut di = DiskInode::new(S_IFCHR, w.cred.uid, w.cred.gid, t, w.gen);
            inherit_setgid(&opd, &mut di);
            di.fork = Fork::Device(0);
            let inode = Inode::new(w.ino, di.clone(), w.log_version);
            tx.log_inode(&inode, &di, true);
            inode
        });
        self.commit_with_new_inode(tx, whiteout)?;
        l.set(src.ino, sd);
        l.set(opi, opd);
        if let Some(npd) = npd {
            l.set(npi, npd);
        }
        if let (Some(d), Some(dd)) = (dst, dd) {
            l.set(d.ino, dd);
        }
        if let Some(d) = dst.filter(|_| !exchange) {
            if freed {
                self.m.icache.remove(d.ino);
            }
        }
        Ok(())
    }
}
