//! The namespace: looking names up, creating and removing them, linking, listing
//! directories.

use super::*;

thread_local! {
    /// Per-thread rotor spreading new directories over AGs without a shared counter.
    static DIR_ROTOR: Cell<u32> = Cell::new(std::process::id().wrapping_mul(2_654_435_761) ^ thread_seed());
}

fn thread_seed() -> u32 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&std::thread::current().id(), &mut h);
    std::hash::Hasher::finish(&h) as u32
}

impl FileSystem {
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let p = self.m.iget(parent)?;
        let target = {
            let pd = p.core.read();
            if !pd.is_dir() {
                return Err(Error::NotDir);
            }
            match name {
                b"." => parent,
                b".." => pd.parent,
                _ => {
                    dir::check_name(name)?;
                    dir::lookup(&self.m, parent, &pd, name)?.ok_or(Error::NotFound)?.ino
                }
            }
        };
        self.getattr(target).map_err(|e| if matches!(e, Error::Stale) { Error::corrupt("directory entry", parent, "points at a free inode") } else { e })
    }

    // ---- creating names ---------------------------------------------------------------

    /// Create a regular file, device, FIFO or socket (mknod(2)); `rdev` for devices.
    pub fn mknod(&self, parent: u64, name: &[u8], mode: u16, rdev: u64, cred: Cred) -> Result<Attr> {
        let kind = mode & S_IFMT;
        let kind = if kind == 0 { S_IFREG } else { kind };
        if kind == S_IFDIR || kind == S_IFLNK || !crate::format::inode::valid_file_type(kind) {
            return Err(Error::Invalid("mknod file type"));
        }
        self.make_node(parent, name, kind | (mode & 0o7777), cred, |_, _, di| {
            if matches!(kind, crate::format::inode::S_IFCHR | crate::format::inode::S_IFBLK) {
                di.fork = Fork::Device(rdev);
            }
            Ok(())
        })
    }

    pub fn create(&self, parent: u64, name: &[u8], mode: u16, cred: Cred) -> Result<Attr> {
        self.mknod(parent, name, S_IFREG | (mode & 0o7777), 0, cred)
    }

    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u16, cred: Cred) -> Result<Attr> {
        self.make_node(parent, name, S_IFDIR | (mode & 0o7777), cred, |_, _, _| Ok(()))
    }

    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], cred: Cred) -> Result<Attr> {
        if target.is_empty() || target.contains(&0) {
            return Err(Error::Invalid("symlink target"));
        }
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        self.make_node(parent, name, S_IFLNK | 0o777, cred, |tx, ino, di| {
            di.size = target.len() as u64;
            if target.len() <= crate::format::inode::FORK_SIZE {
                let mut bytes = [0u8; crate::format::inode::FORK_SIZE];
                bytes[..target.len()].copy_from_slice(target);
                di.fork = Fork::Inline { len: target.len() as u8, bytes };
                return Ok(());
            }
            tx.reserve(ino_ag(ino), 1)?;
            let (pblk, _) = tx.alloc_blocks(tx.mount().geo.ag_layout(ino_ag(ino)).data_start, 1)?;
            let mut block = vec![0u8; BLOCK_SIZE];
            block[..target.len()].copy_from_slice(target);
            tx.mount().dev.write_at(&block, pblk * BS)?;
            tx.mount().journal.note_data_write();
            let mut ext = [Extent::default(); crate::format::inode::INLINE_EXTENTS];
            ext[0] = Extent { lblk: 0, pblk, len: 1, unwritten: false };
            di.fork = Fork::Extents { n: 1, ext };
            di.blocks = 1;
            Ok(())
        })
    }

    /// An open regular file without a name (O_TMPFILE) for a file system user in `parent`:
    /// unlinked from birth and on the orphan list, so that its last close or a crash frees
    /// it, unless `link` names it first — which only a `linkable` one allows (O_TMPFILE
    /// without O_EXCL). The caller holds the one open handle and releases it as for `open`.
    pub fn tmpfile(&self, parent: u64, mode: u16, cred: Cred, linkable: bool) -> Result<Attr> {
        let p = self.m.iget(parent)?;
        let mut tx = Tx::new(&self.m)?;
        let (ino, gen, log_version) = tx.alloc_inode(ino_ag(parent), 0)?;
        let mut di = DiskInode::new(S_IFREG | (mode & 0o7777), cred.uid, cred.gid, now(), gen);
        {
            let pg = p.core.read();
            if !pg.is_dir() {
                return Err(Error::NotDir);
            }
            if pg.nlink == 0 {
                return Err(Error::NotFound);
            }
            inherit_setgid(&pg, &mut di);
        }
        di.nlink = 0;
        tx.orphan_add(ino, &mut di)?;
        let inode = Inode::new(ino, di.clone(), log_version);
        inode.open_count.store(1, Release);
        inode.linkable.store(linkable, Release);
        tx.log_inode(&inode, &di, true);
        self.commit_with_new_inode(tx, Some(inode))?;
        Ok(Attr::from_inode(ino, &di))
    }

    /// Commit `tx`, which made `inode`: cached before the commit, as a lookup right after
    /// it must find the inode; uncached again if the commit fails.
    pub(super) fn commit_with_new_inode(&self, tx: Tx, inode: Option<InodeRef>) -> Result<()> {
        let ino = inode.as_ref().map(|i| i.ino);
        if let Some(i) = inode {
            self.m.icache.insert_new(i);
        }
        tx.commit().map(|_| ()).inspect_err(|_| {
            if let Some(ino) = ino {
                self.m.icache.remove(ino);
            }
        })
    }

    fn make_node(&self, parent: u64, name: &[u8], mode: u16, cred: Cred, init: impl FnOnce(&mut Tx, u64, &mut DiskInode) -> Result<()>) -> Result<Attr> {
        dir::check_name(name)?;
        let p = self.m.iget(parent)?;
        let is_dir = mode & S_IFMT == S_IFDIR;
        // Begin (which may wait for CIL space) and allocate before taking the directory's
        // lock: threads creating in one directory then meet only for the name insertion and
        // the commit. A creation refused below gives its claims back when `tx` drops.
        let mut tx = Tx::new(&self.m)?;
        let pref = if is_dir { self.next_dir_ag() } else { ino_ag(parent) };
        let claim_error = |e| self.early_claim_error(e, parent, name, false);
        let (ino, gen, log_version) = tx.alloc_inode(pref, if is_dir { 0 } else { dir::INSERT_RESERVE }).map_err(claim_error)?;
        if is_dir {
            tx.reserve(ino_ag(parent), dir::INSERT_RESERVE).map_err(claim_error)?;
        }
        let mut pg = p.core.write();
        if !pg.is_dir() {
            return Err(Error::NotDir);
        }
        if pg.nlink == 0 {
            return Err(Error::NotFound);
        }
        tx.route_by(&p);
        if is_dir && pg.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        let mut di = DiskInode::new(mode, cred.uid, cred.gid, now(), gen);
        inherit_setgid(&pg, &mut di);
        init(&mut tx, ino, &mut di)?;
        let mut pd = pg.clone();
        let goal = self.dir_goal(parent, &pd);
        let mut s = TxStore::new(&mut tx, parent, goal);
        dir::insert(&mut s, parent, &mut pd, name, ino, ftype_of(mode))?;
        pd.add_blocks(parent, s.blocks)?;
        if is_dir {
            di.nlink = 2;
            di.parent = parent;
            pd.nlink += 1;
        }
        pd.mtime = di.ctime;
        pd.ctime = di.ctime;
        let inode = Inode::new(ino, di.clone(), log_version);
        tx.log_inode(&inode, &di, true);
        tx.log_inode(&p, &pd, false);
        self.commit_with_new_inode(tx, Some(inode))?;
        *pg = pd;
        Ok(Attr::from_inode(ino, &di))
    }

    /// An operation claims space before it locks the directory, so ENOSPC would come before
    /// the name's own error: report EEXIST (a new name taken), ENOENT (an old name missing)
    /// or ENOTDIR instead, as the order of a kernel file system does (`mkdir -p` counts on
    /// EEXIST on a full file system).
    pub(super) fn early_claim_error(&self, e: Error, parent: u64, name: &[u8], must_exist: bool) -> Error {
        if !matches!(e, Error::NoSpace) {
            return e;
        }
        match (self.lookup(parent, name), must_exist) {
            (Ok(_), false) => Error::Exists,
            (Err(Error::NotFound), true) => Error::NotFound,
            (Err(l), _) if !matches!(l, Error::NotFound) => l,
            _ => e,
        }
    }

    fn next_dir_ag(&self) -> u32 {
        DIR_ROTOR.with(|r| {
            let v = r.get().wrapping_add(1);
            r.set(v);
            v % self.m.geo.ag_count
        })
    }

    /// Where a directory's new B+tree nodes go: next to its root, else at its AG's data.
    pub(super) fn dir_goal(&self, dir: u64, di: &DiskInode) -> u64 {
        match dir::root_of(di) {
            0 => self.m.geo.ag_layout(ino_ag(dir)).data_start,
            r => r,
        }
    }

    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        dir::check_name(newname)?;
        let (i, p) = (self.m.iget(ino)?, self.m.iget(newparent)?);
        let mut l = Locked::new(&[&i, &p]);
        let (di, pd) = (l.get(ino).clone(), l.get(newparent).clone());
        if di.is_dir() {
            return Err(Error::NotPermitted);
        }
        if !pd.is_dir() {
            return Err(Error::NotDir);
        }
        // A file without names comes back only as a linkable tmpfile (Linux: I_LINKABLE),
        // and only while open: at its last close it is freed.
        if pd.nlink == 0 || (di.nlink == 0 && !(i.linkable.load(Acquire) && i.open_count.load(Acquire) > 0)) {
            return Err(Error::NotFound);
        }
        if di.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        let (mut nd, mut npd) = (di, pd);
        let mut tx = Tx::new(&self.m)?;
        if nd.nlink == 0 && nd.orphan_slot != 0 {
            tx.orphan_remove(ino, &mut nd);
        }
        tx.route_by(&p);
        tx.reserve(ino_ag(newparent), dir::INSERT_RESERVE)?;
        let goal = self.dir_goal(newparent, &npd);
        let mut s = TxStore::new(&mut tx, newparent, goal);
        dir::insert(&mut s, newparent, &mut npd, newname, ino, ftype_of(nd.mode))?;
        npd.add_blocks(newparent, s.blocks)?;
        let t = now();
        nd.nlink += 1;
        nd.ctime = t;
        npd.mtime = t;
        npd.ctime = t;
        tx.log_inode(&i, &nd, false);
        tx.log_inode(&p, &npd, false);
        tx.commit()?;
        i.linkable.store(false, Release);
        let attr = Attr::from_inode(ino, &nd);
        l.set(ino, nd);
        l.set(newparent, npd);
        Ok(attr)
    }

    // ---- removing names ---------------------------------------------------------------

    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, false)
    }

    pub fn rmdir(&self, parent: u64, name: &[u8]) -> Result<()> {
        if name == b"." {
            return Err(Error::Invalid("rmdir of ."));
        }
        if name == b".." {
            return Err(Error::NotEmpty);
        }
        self.remove_name(parent, name, true)
    }

    /// Look `name` up and lock parent and child in inode order, retrying if the name changed
    /// meanwhile (the entry is re-checked under the locks).
    pub(super) fn lookup_child(&self, parent: u64, name: &[u8]) -> Result<(InodeRef, InodeRef)> {
        dir::check_name(name)?;
        let p = self.m.iget(parent)?;
        let pd = p.core.read();
        if !pd.is_dir() {
            return Err(Error::NotDir);
        }
        let e = dir::lookup(&self.m, parent, &pd, name)?.ok_or(Error::NotFound)?;
        drop(pd);
        Ok((p, self.m.iget(e.ino)?))
    }

    fn remove_name(&self, parent: u64, name: &[u8], want_dir: bool) -> Result<()> {
        dir::check_name(name)?;
        let p = self.m.iget(parent)?;
        // Begun (which may wait for CIL space) before the directory's lock, as for a create.
        let mut tx = Tx::new(&self.m)?;
        loop {
            let c: InodeRef;
            let mut l = Locked::new(&[&p]);
            if !l.get(parent).is_dir() {
                return Err(Error::NotDir);
            }
            let mut e = dir::lookup(&self.m, parent, l.get(parent), name)?.ok_or(Error::NotFound)?;
            c = self.m.iget(e.ino)?;
            if !l.add(&[&c]) {
                drop(l);
                l = Locked::new(&[&p, &c]);
                // Unlocked meanwhile: the name may be gone, or linked again under another key.
                match dir::lookup(&self.m, parent, l.get(parent), name)? {
                    Some(now) if now.ino == c.ino => e = now,
                    _ => continue,
                }
            }
            let (mut pd, mut cd) = (l.get(parent).clone(), l.get(c.ino).clone());
            match (want_dir, cd.is_dir()) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                (true, true) if dir::root_of(&cd) != 0 => return Err(Error::NotEmpty),
                _ => {}
            }
            tx.route_by(&p);
            let t = now();
            let freed = self.drop_link(&mut tx, &c, &mut cd, t)?;
            let mut s = TxStore::new(&mut tx, parent, 0);
            dir::remove(&mut s, &mut pd, &e)?;
            pd.add_blocks(parent, s.blocks)?;
            if want_dir {
                pd.drop_dir_link(parent)?;
            }
            pd.mtime = t;
            pd.ctime = t;
            tx.log_inode(&p, &pd, false);
            tx.commit()?;
            l.set(parent, pd);
            l.set(c.ino, cd);
            drop(l);
            if freed {
                // Freed in the transaction: nothing is left to reap, and looking would lock
                // the inode and its AG once more per unlink.
                self.m.icache.remove(c.ino);
                return Ok(());
            }
            return self.reap_if_unused(&c);
        }
    }

    /// One name of `cd` is going away in `tx`. When it was the last: free the inode in the
    /// same transaction if it is small and not open, else put it on the orphan list (freed
    /// on last close, or in batches right after). Returns whether it was freed here.
    pub(super) fn drop_link(&self, tx: &mut Tx, c: &InodeRef, cd: &mut DiskInode, t: Timespec) -> Result<bool> {
        cd.nlink = if cd.is_dir() { 0 } else { cd.nlink.saturating_sub(1) };
        cd.ctime = t;
        if cd.nlink > 0 {
            tx.log_inode(c, cd, false);
            return Ok(false);
        }
        let small = matches!(cd.fork, Fork::Empty | Fork::Inline { .. } | Fork::Device(_) | Fork::Extents { .. }) && cd.xattr_root == 0;
        if c.open_count.load(Acquire) == 0 && small {
            self.free_small(tx, c, cd)?;
            return Ok(true);
        }
        if cd.orphan_slot == 0 {
            tx.orphan_add(c.ino, cd)?;
        }
        tx.log_inode(c, cd, true);
        Ok(false)
    }

    /// Free an inode whose blocks fit one transaction (inline extents, no xattr tree).
    fn free_small(&self, tx: &mut Tx, c: &InodeRef, cd: &mut DiskInode) -> Result<()> {
        if let Fork::Extents { n, ext } = cd.fork {
            for e in &ext[..n as usize] {
                tx.free_blocks(e.pblk, e.len as u64, false);
            }
        }
        if cd.orphan_slot != 0 {
            tx.orphan_remove(c.ino, cd);
        }
        tx.free_inode(c);
        Ok(())
    }

    // ---- directories ------------------------------------------------------------------

    /// Entries after `cookie` (0 = from the start), "." and ".." first; `f` returns false to
    /// stop. Each entry's `cookie` resumes right after it. An access, which may set the
    /// directory's atime (`MountOptions::atime`, `nodiratime`).
    pub fn readdir(&self, ino: u64, cookie: u64, f: &mut dyn FnMut(DirEntry<&[u8]>) -> bool) -> Result<()> {
        let i = self.m.iget(ino)?;
        self.list_dir(&i, cookie, f)?;
        self.touch_atime(&i);
        Ok(())
    }

    fn list_dir(&self, i: &InodeRef, cookie: u64, f: &mut dyn FnMut(DirEntry<&[u8]>) -> bool) -> Result<()> {
        let (ino, g) = (i.ino, i.core.read());
        if !g.is_dir() {
            return Err(Error::NotDir);
        }
        if cookie < dir::COOKIE_DOT && !f(DirEntry { ino, cookie: dir::COOKIE_DOT, kind: FileType::Directory, name: b"." }) {
            return Ok(());
        }
        if cookie < dir::COOKIE_DOTDOT && !f(DirEntry { ino: g.parent, cookie: dir::COOKIE_DOTDOT, kind: FileType::Directory, name: b".." }) {
            return Ok(());
        }
        dir::read(&self.m, ino, &g, cookie, &mut |e, name| f(DirEntry { ino: e.ino, cookie: dir::cookie_of(&e), kind: FileType::from_ftype(e.ftype), name }))
    }
}
