//! Attributes: the inode's stat fields, size changes through setattr, and extended
//! attributes.

use super::*;

impl FileSystem {
    /// The attributes of inode `ino` (stat(2)): ESTALE if it is not allocated.
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let i = self.m.iget(ino)?;
        let inode = i.core.read();
        Ok(Attr::from_inode(ino, &inode))
    }

    /// Change what `changes` names (mode bits, owner, times, size) in one transaction, or a
    /// series for a large shrink (see `truncate`). EISDIR or EINVAL for a size change of a
    /// directory or other non-regular file, EFBIG past the largest file.
    pub fn setattr(&self, ino: u64, changes: &SetAttr) -> Result<Attr> {
        let i = self.m.iget(ino)?;
        let mut g = i.core.write();
        let time = now();
        let apply = |updated: &mut DiskInode| {
            if let Some(mode) = changes.mode {
                updated.mode = (updated.mode & S_IFMT) | (mode & 0o7777);
            }
            if let Some(uid) = changes.uid {
                updated.uid = uid;
            }
            if let Some(gid) = changes.gid {
                updated.gid = gid;
            }
            if let Some(atime) = changes.atime {
                updated.atime = atime.resolve(time);
            }
            if let Some(mtime) = changes.mtime {
                updated.mtime = mtime.resolve(time);
            } else if changes.size.is_some() {
                // truncate(2) marks mtime even when the size does not change (as Linux's
                // local file systems do), and open(O_TRUNC) of an existing file must: FUSE
                // sends that as a bare size change and leaves the time to us.
                updated.mtime = time;
            }
            updated.ctime = changes.ctime.unwrap_or(time);
        };
        match changes.size {
            Some(size) => {
                if g.is_dir() {
                    return Err(Error::IsDir);
                }
                if !g.is_reg() {
                    return Err(Error::Invalid("size of a non-regular file"));
                }
                self.truncate(&i, &mut g, size, &apply)?;
            }
            None => {
                let mut updated = g.clone();
                apply(&mut updated);
                let mut tx = Tx::new(&self.m)?;
                tx.log_inode(&i, &updated, false);
                tx.commit()?;
                *g = updated;
            }
        }
        Ok(Attr::from_inode(ino, &g))
    }

    /// Take from inode `ino` the privileges `drop` names, in one transaction, before a change
    /// that must not keep them (write, truncate, chown). Nothing is written when the inode
    /// holds none of them, the common case, or is a directory. Returns whether any was taken.
    ///
    /// Called before the change rather than with it: a crash in between leaves the privileges
    /// dropped and the change undone (as a failed write leaves them), never the changed file
    /// still privileged; the journal makes the drop durable no later than what follows it.
    pub fn drop_privileges(&self, ino: u64, drop: PrivDrop) -> Result<bool> {
        let dropped = |mode: u16| match drop {
            PrivDrop::Capabilities => mode,
            PrivDrop::CapabilitiesAndSetId => without_set_id(mode),
        };
        {
            let i = self.m.iget(ino)?;
            let g = i.core.read();
            if g.is_dir() || (dropped(g.mode) == g.mode && !has_xattr(&self.m, ino, &g, FILE_CAPABILITIES)?) {
                return Ok(false);
            }
        }
        // Decided again under the write lock: the inode may have changed in between.
        self.change_xattrs(ino, MAP_RESERVE, |store, inode| {
            inode.mode = dropped(inode.mode);
            match xattr::remove(store, ino, inode, FILE_CAPABILITIES) {
                Ok(()) | Err(Error::NoAttr) => Ok(()),
                Err(e) => Err(e),
            }
        })?;
        Ok(true)
    }

    /// The value of extended attribute `name`: ENODATA if there is none.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        xattr::get(&self.m, ino, &g, name)
    }

    /// The names of the inode's extended attributes.
    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        xattr::list(&self.m, ino, &g)
    }

    /// Set extended attribute `name` (setxattr(2), `flags` as XATTR_CREATE/XATTR_REPLACE):
    /// EEXIST or ENODATA as the flags demand, E2BIG past `XATTR_VALUE_MAX`, ENOSPC.
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        self.change_xattrs(ino, xattr::set_reserve(value.len()), |store, inode| {
            xattr::set(store, ino, inode, name, value, flags)
        })
    }

    /// Remove extended attribute `name`: ENODATA if there is none.
    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.change_xattrs(ino, MAP_RESERVE, |store, inode| xattr::remove(store, ino, inode, name))
    }

    fn change_xattrs(
        &self,
        ino: u64,
        reserve: u64,
        change: impl FnOnce(&mut TxStore, &mut DiskInode) -> Result<()>,
    ) -> Result<()> {
        let i = self.m.iget(ino)?;
        let mut g = i.core.write();
        let mut updated = g.clone();
        let mut tx = Tx::new(&self.m)?;
        tx.reserve(ino_ag(ino), reserve)?;
        let goal =
            if updated.xattr_root != 0 { updated.xattr_root } else { self.m.geo.ag_layout(ino_ag(ino)).data_start };
        let mut store = TxStore::new(&mut tx, ino, goal);
        change(&mut store, &mut updated)?;
        updated.add_blocks(ino, store.blocks)?;
        updated.ctime = now();
        tx.log_inode(&i, &updated, false);
        tx.commit()?;
        *g = updated;
        Ok(())
    }
}

/// The extended attribute holding a file's capabilities, which a change by anyone drops.
const FILE_CAPABILITIES: &[u8] = b"security.capability";

fn has_xattr(m: &Mount, ino: u64, inode: &DiskInode, name: &[u8]) -> Result<bool> {
    match xattr::get(m, ino, inode, name) {
        Ok(_) => Ok(true),
        Err(Error::NoAttr) => Ok(false),
        Err(e) => Err(e),
    }
}

/// `mode` without setuid, and without setgid where group execute is set.
fn without_set_id(mode: u16) -> u16 {
    const S_ISUID: u16 = 0o4000;
    const S_IXGRP: u16 = 0o010;
    let setgid_privileged = mode & (S_ISGID | S_IXGRP) == S_ISGID | S_IXGRP;
    mode & !S_ISUID & !if setgid_privileged { S_ISGID } else { 0 }
}
