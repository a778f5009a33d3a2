//! The namespace: looking names up, creating and removing them, linking, listing
//! directories.

use super::*;

thread_local! {
    /// Per-thread rotor spreading new directories over AGs without a shared counter.
    static DIR_ROTOR: Cell<u32> = Cell::new(std::process::id().wrapping_mul(2_654_435_761) ^ thread_seed());
}

fn thread_seed() -> u32 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&std::thread::current().id(), &mut hasher);
    std::hash::Hasher::finish(&hasher) as u32
}

impl FileSystem {
    /// The attributes of `name` in directory `parent` ("." and ".." included): ENOENT if
    /// there is no such name, ENOTDIR if `parent` is not a directory, ENAMETOOLONG/EINVAL
    /// for a bad name.
    pub fn lookup(&self, parent: u64, name: &[u8]) -> Result<Attr> {
        let parent_dir = self.m.iget(parent)?;
        let target = {
            let parent_inode = parent_dir.core.read();
            if !parent_inode.is_dir() {
                return Err(Error::NotDir);
            }
            match name {
                b"." => parent,
                b".." => parent_inode.parent,
                _ => {
                    dir::check_name(name)?;
                    dir::lookup(&self.m, parent, &parent_inode, name)?.ok_or(Error::NotFound)?.ino
                }
            }
        };
        self.getattr(target).map_err(|error| {
            if matches!(error, Error::Stale) {
                Error::corrupt("directory entry", parent, "points at a free inode")
            } else {
                error
            }
        })
    }

    // ---- creating names ---------------------------------------------------------------

    /// Create a regular file, device, FIFO or socket (mknod(2)); `rdev` for devices.
    pub fn mknod(&self, parent: u64, name: &[u8], mode: u16, rdev: u64, cred: Cred) -> Result<Attr> {
        let kind = mode & S_IFMT;
        let kind = if kind == 0 { S_IFREG } else { kind };
        if kind == S_IFDIR || kind == S_IFLNK || !crate::format::inode::valid_file_type(kind) {
            return Err(Error::Invalid("mknod file type"));
        }
        self.make_node(parent, name, kind | (mode & 0o7777), cred, |_, _, new_inode| {
            if matches!(kind, crate::format::inode::S_IFCHR | crate::format::inode::S_IFBLK) {
                new_inode.fork = Fork::Device(rdev);
            }
            Ok(())
        })
    }

    /// Create a regular file `name` in `parent` (mknod with `S_IFREG`): EEXIST if the name
    /// is taken, ENOSPC when no inode or block is free.
    pub fn create(&self, parent: u64, name: &[u8], mode: u16, cred: Cred) -> Result<Attr> {
        self.mknod(parent, name, S_IFREG | (mode & 0o7777), 0, cred)
    }

    /// Create directory `name` in `parent`: EEXIST if the name is taken, EMLINK when
    /// `parent` has `LINK_MAX` links, ENOSPC when no inode or block is free.
    pub fn mkdir(&self, parent: u64, name: &[u8], mode: u16, cred: Cred) -> Result<Attr> {
        self.make_node(parent, name, S_IFDIR | (mode & 0o7777), cred, |_, _, _| Ok(()))
    }

    /// Create symlink `name` in `parent` pointing at `target`: EINVAL for an empty target or
    /// one with a NUL, ENAMETOOLONG past `SYMLINK_MAX` bytes, EEXIST if the name is taken.
    pub fn symlink(&self, parent: u64, name: &[u8], target: &[u8], cred: Cred) -> Result<Attr> {
        if target.is_empty() || target.contains(&0) {
            return Err(Error::Invalid("symlink target"));
        }
        if target.len() > SYMLINK_MAX {
            return Err(Error::NameTooLong);
        }
        self.make_node(parent, name, S_IFLNK | 0o777, cred, |tx, ino, new_inode| {
            new_inode.size = target.len() as u64;
            if target.len() <= crate::format::inode::FORK_SIZE {
                let mut bytes = [0u8; crate::format::inode::FORK_SIZE];
                bytes[..target.len()].copy_from_slice(target);
                new_inode.fork = Fork::Inline { len: target.len() as u8, bytes };
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
            new_inode.fork = Fork::Extents { n: 1, ext };
            new_inode.blocks = 1;
            Ok(())
        })
    }

    /// An open regular file without a name (O_TMPFILE) for a file system user in `parent`:
    /// unlinked from birth and on the orphan list, so that its last close or a crash frees
    /// it, unless `link` names it first — which only a `linkable` one allows (O_TMPFILE
    /// without O_EXCL). The caller holds the one open handle and releases it as for `open`.
    pub fn tmpfile(&self, parent: u64, mode: u16, cred: Cred, linkable: bool) -> Result<Attr> {
        let _changing = self.m.start_change();
        let parent_dir = self.m.iget(parent)?;
        let mut tx = Tx::new(&self.m)?;
        let (ino, gen, log_version) = tx.alloc_inode(ino_ag(parent), 0)?;
        let mut new_inode = DiskInode::new(S_IFREG | (mode & 0o7777), cred.uid, cred.gid, now(), gen);
        {
            let parent_guard = parent_dir.core.read();
            if !parent_guard.is_dir() {
                return Err(Error::NotDir);
            }
            if parent_guard.nlink == 0 {
                return Err(Error::NotFound);
            }
            inherit_setgid(&parent_guard, &mut new_inode);
            self.inherit_acls(&mut tx, parent, &parent_guard, ino, &mut new_inode, cred.umask)?;
        }
        new_inode.nlink = 0;
        tx.orphan_add(ino, &mut new_inode)?;
        let inode = Inode::new(ino, new_inode.clone(), log_version);
        tx.log_inode(&inode, &new_inode, true);
        // Held before anyone can see the number, and not past a failed commit.
        self.m.holds.take_unnamed(ino, linkable);
        self.commit_with_new_inode(tx, Some(inode)).inspect_err(|_| {
            if self.m.holds.drop(ino, 1) {
                self.m.holds.freed();
            }
        })?;
        Ok(Attr::from_inode(ino, &new_inode))
    }

    /// Commit `tx`, which made `inode`: cached before the commit, as a lookup right after
    /// it must find the inode; uncached again if the commit fails.
    pub(super) fn commit_with_new_inode(&self, tx: Tx, inode: Option<InodeRef>) -> Result<()> {
        if let Some(i) = &inode {
            self.m.icache.insert_new(i.clone());
        }
        // The failed transaction gave the number back: another create may own it already.
        tx.commit().map(|_| ()).inspect_err(|_| {
            if let Some(i) = &inode {
                self.m.icache.remove_if(i);
            }
        })
    }

    fn make_node(
        &self,
        parent: u64,
        name: &[u8],
        mode: u16,
        cred: Cred,
        init: impl FnOnce(&mut Tx, u64, &mut DiskInode) -> Result<()>,
    ) -> Result<Attr> {
        dir::check_name(name)?;
        let _changing = self.m.start_change();
        let parent_dir = self.m.iget(parent)?;
        let is_dir = mode & S_IFMT == S_IFDIR;
        // Begin (which may wait for CIL space) and allocate before taking the directory's
        // lock: threads creating in one directory then meet only for the name insertion and
        // the commit. A creation refused below gives its claims back when `tx` drops.
        let mut tx = Tx::new(&self.m)?;
        let pref = if is_dir { self.next_dir_ag() } else { ino_ag(parent) };
        let claim_error = |error| self.early_claim_error(error, parent, name, false);
        let (ino, gen, log_version) =
            tx.alloc_inode(pref, if is_dir { 0 } else { dir::INSERT_RESERVE }).map_err(claim_error)?;
        if is_dir {
            tx.reserve(ino_ag(parent), dir::INSERT_RESERVE).map_err(claim_error)?;
        }
        let mut parent_guard = parent_dir.core.write();
        if !parent_guard.is_dir() {
            return Err(Error::NotDir);
        }
        if parent_guard.nlink == 0 {
            return Err(Error::NotFound);
        }
        tx.route_by(&parent_dir);
        if is_dir && parent_guard.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        let mut new_inode = DiskInode::new(mode, cred.uid, cred.gid, now(), gen);
        inherit_setgid(&parent_guard, &mut new_inode);
        init(&mut tx, ino, &mut new_inode)?;
        self.inherit_acls(&mut tx, parent, &parent_guard, ino, &mut new_inode, cred.umask)?;
        let mut parent_inode = parent_guard.clone();
        let goal = self.dir_goal(parent, &parent_inode);
        let mut store = TxStore::new(&mut tx, parent, goal);
        dir::insert(&mut store, parent, &mut parent_inode, name, ino, ftype_of(mode))?;
        parent_inode.add_blocks(parent, store.blocks)?;
        if is_dir {
            new_inode.nlink = 2;
            new_inode.parent = parent;
            debug_assert!(parent_inode.nlink < LINK_MAX, "mkdir: inode {parent} nlink past LINK_MAX");
            parent_inode.nlink += 1;
        }
        parent_inode.mtime = new_inode.ctime;
        parent_inode.ctime = new_inode.ctime;
        let inode = Inode::new(ino, new_inode.clone(), log_version);
        tx.log_inode(&inode, &new_inode, true);
        tx.log_inode(&parent_dir, &parent_inode, false);
        self.commit_with_new_inode(tx, Some(inode))?;
        *parent_guard = parent_inode;
        Ok(Attr::from_inode(ino, &new_inode))
    }

    /// `posix_acl_create`: a new inode in a directory with a default ACL takes that ACL as
    /// its access ACL, each class limited by the mode asked for and the mode by each class,
    /// and the umask is not applied; a new directory takes it as its default ACL too. Without
    /// one, the umask is applied. Symlinks take neither. Space for the attributes is reserved
    /// here, on this rare path only. The caller holds the directory's lock: the ACL read here
    /// is the one that decides, and no other read of it is made.
    fn inherit_acls(
        &self,
        tx: &mut Tx,
        parent: u64,
        parent_inode: &DiskInode,
        ino: u64,
        new_inode: &mut DiskInode,
        umask: u16,
    ) -> Result<()> {
        if new_inode.mode & S_IFMT == S_IFLNK {
            return Ok(());
        }
        let default =
            if self.m.acl { super::attr::stored_acl(&self.m, parent, parent_inode, DEFAULT_XATTR)? } else { None };
        let Some(default) = default else {
            new_inode.mode &= !(umask & 0o777);
            return Ok(());
        };
        let mut access = default.clone();
        new_inode.mode = access.create_masq(new_inode.mode);
        let (_, minimal) = access.equiv_mode(new_inode.mode);
        tx.reserve(ino_ag(ino), 2 * xattr::set_reserve(crate::acl::ENTRIES_MAX * 8 + 4))?;
        let mut store = TxStore::new(tx, ino, self.m.geo.ag_layout(ino_ag(ino)).data_start);
        if !minimal {
            xattr::set(&mut store, ino, new_inode, ACCESS_XATTR, &access.encode(), 0)?;
        }
        if new_inode.is_dir() {
            xattr::set(&mut store, ino, new_inode, DEFAULT_XATTR, &default.encode(), 0)?;
        }
        let blocks = store.blocks;
        new_inode.add_blocks(ino, blocks)
    }

    /// An operation claims space before it locks the directory, so ENOSPC would come before
    /// the name's own error: report EEXIST (a new name taken), ENOENT (an old name missing)
    /// or ENOTDIR instead, as the order of a kernel file system does (`mkdir -p` counts on
    /// EEXIST on a full file system).
    pub(super) fn early_claim_error(&self, claim_error: Error, parent: u64, name: &[u8], must_exist: bool) -> Error {
        if !matches!(claim_error, Error::NoSpace) {
            return claim_error;
        }
        match (self.lookup(parent, name), must_exist) {
            (Ok(_), false) => Error::Exists,
            (Err(Error::NotFound), true) => Error::NotFound,
            (Err(lookup_error), _) if !matches!(lookup_error, Error::NotFound) => lookup_error,
            _ => claim_error,
        }
    }

    fn next_dir_ag(&self) -> u32 {
        DIR_ROTOR.with(|rotor| {
            let next = rotor.get().wrapping_add(1);
            rotor.set(next);
            next % self.m.geo.ag_count
        })
    }

    /// Where a directory's new B+tree nodes go: next to its root, else in its AG's index zone.
    pub(super) fn dir_goal(&self, dir: u64, dir_inode: &DiskInode) -> u64 {
        match dir::root_of(dir_inode) {
            0 => crate::ag::index_goal(&self.m.geo.ag_layout(ino_ag(dir))),
            root => root,
        }
    }

    /// Give inode `ino` the new name `newname` in `newparent` (link(2)): EPERM for a
    /// directory, EMLINK at `LINK_MAX` links, ENOENT for an unlinked inode (unless a
    /// linkable tmpfile), EEXIST if the name is taken.
    pub fn link(&self, ino: u64, newparent: u64, newname: &[u8]) -> Result<Attr> {
        dir::check_name(newname)?;
        let _changing = self.m.start_change();
        let (i, parent_dir) = (self.m.iget(ino)?, self.m.iget(newparent)?);
        let mut locked = Locked::new(&[&i, &parent_dir]);
        debug_assert!(locked.holds(&[ino, newparent]));
        let (mut inode_copy, mut parent_inode) = (locked.get(ino).clone(), locked.get(newparent).clone());
        if inode_copy.is_dir() {
            return Err(Error::NotPermitted);
        }
        if !parent_inode.is_dir() {
            return Err(Error::NotDir);
        }
        // A file without names comes back only as a linkable tmpfile (Linux: I_LINKABLE),
        // and only while open: at its last close it is freed.
        if parent_inode.nlink == 0 || (inode_copy.nlink == 0 && !self.m.holds.is_linkable(ino)) {
            return Err(Error::NotFound);
        }
        if inode_copy.nlink >= LINK_MAX {
            return Err(Error::TooManyLinks);
        }
        let mut tx = Tx::new(&self.m)?;
        if inode_copy.nlink == 0 && inode_copy.orphan_slot != 0 {
            tx.orphan_remove(ino, &mut inode_copy);
        }
        tx.route_by(&parent_dir);
        tx.reserve(ino_ag(newparent), dir::INSERT_RESERVE)?;
        let goal = self.dir_goal(newparent, &parent_inode);
        let mut store = TxStore::new(&mut tx, newparent, goal);
        dir::insert(&mut store, newparent, &mut parent_inode, newname, ino, ftype_of(inode_copy.mode))?;
        parent_inode.add_blocks(newparent, store.blocks)?;
        let time = now();
        debug_assert!(inode_copy.nlink < LINK_MAX, "link: inode {ino} nlink past LINK_MAX");
        inode_copy.nlink += 1;
        inode_copy.ctime = time;
        parent_inode.mtime = time;
        parent_inode.ctime = time;
        tx.log_inode(&i, &inode_copy, false);
        tx.log_inode(&parent_dir, &parent_inode, false);
        tx.commit()?;
        self.m.holds.named(ino);
        let attr = Attr::from_inode(ino, &inode_copy);
        locked.set(ino, inode_copy);
        locked.set(newparent, parent_inode);
        Ok(attr)
    }

    // ---- removing names ---------------------------------------------------------------

    /// Remove `name` from `parent` (unlink(2)); the inode is freed with its last name and
    /// last handle. EISDIR for a directory, ENOENT if there is no such name.
    pub fn unlink(&self, parent: u64, name: &[u8]) -> Result<()> {
        self.remove_name(parent, name, false)
    }

    /// Remove the empty directory `name` from `parent` (rmdir(2)): ENOTEMPTY if it has
    /// entries (or for ".."), EINVAL for ".", ENOTDIR if it is not a directory.
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
        let parent_dir = self.m.iget(parent)?;
        let parent_inode = parent_dir.core.read();
        if !parent_inode.is_dir() {
            return Err(Error::NotDir);
        }
        let entry = dir::lookup(&self.m, parent, &parent_inode, name)?.ok_or(Error::NotFound)?;
        drop(parent_inode);
        Ok((parent_dir, self.m.iget(entry.ino)?))
    }

    fn remove_name(&self, parent: u64, name: &[u8], want_dir: bool) -> Result<()> {
        dir::check_name(name)?;
        let _changing = self.m.start_change();
        let parent_dir = self.m.iget(parent)?;
        // Begun (which may wait for CIL space) before the directory's lock, as for a create.
        let mut tx = Tx::new(&self.m)?;
        // No computed bound: a retry means the name changed while it was unlocked, each
        // such change a completed operation of another thread (as the VFS's lookup retries).
        loop {
            let child: InodeRef;
            let mut locked = Locked::new(&[&parent_dir]);
            if !locked.get(parent).is_dir() {
                return Err(Error::NotDir);
            }
            let mut entry = dir::lookup(&self.m, parent, locked.get(parent), name)?.ok_or(Error::NotFound)?;
            child = self.m.iget(entry.ino)?;
            if !locked.add(&[&child]) {
                drop(locked);
                locked = Locked::new(&[&parent_dir, &child]);
                // Unlocked meanwhile: the name may be gone, or linked again under another key.
                match dir::lookup(&self.m, parent, locked.get(parent), name)? {
                    Some(current) if current.ino == child.ino => entry = current,
                    _ => continue,
                }
            }
            let (mut parent_inode, mut child_inode) = (locked.get(parent).clone(), locked.get(child.ino).clone());
            match (want_dir, child_inode.is_dir()) {
                (true, false) => return Err(Error::NotDir),
                (false, true) => return Err(Error::IsDir),
                (true, true) if dir::root_of(&child_inode) != 0 => return Err(Error::NotEmpty),
                _ => {}
            }
            tx.route_by(&parent_dir);
            let time = now();
            let freed = self.drop_link(&mut tx, &child, &mut child_inode, time)?;
            let mut store = TxStore::new(&mut tx, parent, 0);
            dir::remove(&mut store, &mut parent_inode, &entry)?;
            parent_inode.add_blocks(parent, store.blocks)?;
            if want_dir {
                parent_inode.drop_dir_link(parent)?;
            }
            parent_inode.mtime = time;
            parent_inode.ctime = time;
            tx.log_inode(&parent_dir, &parent_inode, false);
            tx.commit()?;
            locked.set(parent, parent_inode);
            locked.set(child.ino, child_inode);
            drop(locked);
            if freed {
                // Freed in the transaction: nothing is left to reap, and looking would lock
                // the inode and its AG once more per unlink. Uncached only if still ours:
                // a create may have claimed the number since the commit.
                self.m.icache.remove_if(&child);
                return Ok(());
            }
            return self.reap_if_unused(&child);
        }
    }

    /// One name of `cd` is going away in `tx`. When it was the last: free the inode in the
    /// same transaction if it is small and not open, else put it on the orphan list (freed
    /// on last close, or in batches right after). Returns whether it was freed here.
    pub(super) fn drop_link(
        &self,
        tx: &mut Tx,
        child: &InodeRef,
        child_inode: &mut DiskInode,
        time: Timespec,
    ) -> Result<bool> {
        child_inode.nlink = if child_inode.is_dir() { 0 } else { child_inode.nlink.saturating_sub(1) };
        child_inode.ctime = time;
        if child_inode.nlink > 0 {
            tx.log_inode(child, child_inode, false);
            return Ok(false);
        }
        let small =
            matches!(child_inode.fork, Fork::Empty | Fork::Inline { .. } | Fork::Device(_) | Fork::Extents { .. })
                && child_inode.xattr_root == 0;
        if !self.m.holds.unlinked(child.ino) && small {
            self.free_small(tx, child, child_inode)?;
            return Ok(true);
        }
        if child_inode.orphan_slot == 0 {
            tx.orphan_add(child.ino, child_inode)?;
        }
        tx.log_inode(child, child_inode, true);
        Ok(false)
    }

    /// Free an inode whose blocks fit one transaction (inline extents, no xattr tree).
    fn free_small(&self, tx: &mut Tx, child: &InodeRef, child_inode: &mut DiskInode) -> Result<()> {
        debug_assert!(
            child_inode.xattr_root == 0 && !matches!(child_inode.fork, Fork::Btree(_)),
            "inode {} too large to free in one transaction",
            child.ino
        );
        if let Fork::Extents { n, ext } = child_inode.fork {
            for extent in &ext[..n as usize] {
                tx.free_blocks(extent.pblk, extent.len as u64, false);
            }
        }
        if child_inode.orphan_slot != 0 {
            tx.orphan_remove(child.ino, child_inode);
        }
        tx.free_inode(child);
        Ok(())
    }

    // ---- directories ------------------------------------------------------------------

    /// Entries after `cookie` (0 = from the start), "." and ".." first; `f` returns false to
    /// stop. Each entry's `cookie` resumes right after it. An access, which may set the
    /// directory's atime (`MountOptions::atime`, `nodiratime`).
    pub fn readdir(&self, ino: u64, cookie: u64, visit: &mut dyn FnMut(DirEntry<&[u8]>) -> bool) -> Result<()> {
        let i = self.m.iget(ino)?;
        self.list_dir(&i, cookie, visit)?;
        self.touch_atime(&i);
        Ok(())
    }

    fn list_dir(&self, i: &InodeRef, cookie: u64, visit: &mut dyn FnMut(DirEntry<&[u8]>) -> bool) -> Result<()> {
        let (ino, g) = (i.ino, i.core.read());
        if !g.is_dir() {
            return Err(Error::NotDir);
        }
        if cookie < dir::COOKIE_DOT
            && !visit(DirEntry { ino, cookie: dir::COOKIE_DOT, kind: FileType::Directory, name: b"." })
        {
            return Ok(());
        }
        if cookie < dir::COOKIE_DOTDOT
            && !visit(DirEntry { ino: g.parent, cookie: dir::COOKIE_DOTDOT, kind: FileType::Directory, name: b".." })
        {
            return Ok(());
        }
        dir::read(&self.m, ino, &g, cookie, &mut |entry, name| {
            visit(DirEntry {
                ino: entry.ino,
                cookie: dir::cookie_of(&entry),
                kind: FileType::from_ftype(entry.ftype),
                name,
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use crate::dev::MemDevice;
    use crate::format::{ino_ag, Fork, ROOT_INO};
    use crate::mkfs::{mkfs, MkfsOptions};
    use crate::{Cred, FileSystem, MountOptions};
    use std::sync::Arc;

    /// A directory grown among its files keeps its blocks in its AG's index zone, and the
    /// files' data stays below the zone (DESIGN, "Allocation"): a walk of the tree, or a
    /// published image's metadata, touches few regions of the image.
    #[test]
    fn directory_blocks_go_to_the_index_zone_and_file_data_stays_below_it() {
        let dev = Arc::new(MemDevice::new(64 << 20));
        mkfs(&*dev, &MkfsOptions::default(), &|_, _| {}).unwrap();
        let fs = FileSystem::mount_device(dev, &MountOptions::default()).unwrap();
        let cred = Cred { uid: 0, gid: 0, umask: 0o022 };
        let dir = fs.mkdir(ROOT_INO, b"d", 0o755, cred).unwrap().ino;
        let mut files = Vec::new();
        for i in 0..400 {
            let ino = fs.create(dir, format!("a-file-with-a-longer-name-{i:04}").as_bytes(), 0o644, cred).unwrap().ino;
            fs.write(ino, 0, &[7; 8192]).unwrap();
            files.push(ino);
        }
        let layout = fs.m.geo.ag_layout(ino_ag(dir));
        let (zone, end) = (crate::ag::index_goal(&layout), layout.start + layout.blocks);
        let Fork::Btree(root) = fs.m.iget(dir).unwrap().core.read().fork else {
            panic!("400 entries need a directory tree");
        };
        assert!((zone..end).contains(&root), "directory root {root} outside the zone {zone}..{end}");
        for ino in files {
            let Fork::Extents { n, ext } = fs.m.iget(ino).unwrap().core.read().fork else {
                panic!("an 8 KiB file has inline extents");
            };
            for e in &ext[..n as usize] {
                assert!(e.pblk + e.len as u64 <= zone, "inode {ino}'s data at {} is in the zone from {zone}", e.pblk);
            }
        }
        fs.unmount().unwrap();
    }
}
