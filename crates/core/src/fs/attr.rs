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
        let changing = self.m.start_change();
        let i = self.m.iget(ino)?;
        let mut g = i.core.write();
        if changes.mode.is_some() && self.m.acl && stored_acl(&self.m, ino, &g, ACCESS_XATTR)?.is_some() {
            // Its steps start changes of their own.
            drop((g, changing));
            return self.chmod_with_acl(ino, changes);
        }
        let time = now();
        let apply = |updated: &mut DiskInode| changes.apply(updated, time);
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

    /// A setattr that changes the mode of an inode with an access ACL: `posix_acl_chmod`,
    /// the new permission bits written into the ACL in the same transaction. A size change
    /// with it (rare: FUSE sends chmod alone) follows in transactions of its own.
    fn chmod_with_acl(&self, ino: u64, changes: &SetAttr) -> Result<Attr> {
        let attrs = SetAttr { size: None, ..changes.clone() };
        let time = now();
        self.change_xattrs(ino, xattr::set_reserve(crate::acl::ENTRIES_MAX * 8 + 4), |store, inode| {
            let acl = stored_acl(&self.m, ino, inode, ACCESS_XATTR)?;
            attrs.apply(inode, time);
            match acl {
                Some(mut acl) => {
                    acl.chmod(inode.mode);
                    xattr::set(store, ino, inode, ACCESS_XATTR, &acl.encode(), 0)
                }
                None => Ok(()),
            }
        })?;
        match changes.size {
            Some(size) => self.setattr(ino, &SetAttr { size: Some(size), ..SetAttr::default() }),
            None => self.getattr(ino),
        }
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

    /// The value of extended attribute `name`: ENODATA if there is none, EOPNOTSUPP for an
    /// ACL on a `noacl` mount.
    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        self.acl_name_allowed(name)?;
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        xattr::get(&self.m, ino, &g, name)
    }

    /// The inode's access ACL, for permission checks: None when it has none (its mode says
    /// everything) or the mount ignores ACLs.
    pub fn access_acl(&self, ino: u64) -> Result<Option<Acl>> {
        if !self.m.acl {
            return Ok(None);
        }
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        stored_acl(&self.m, ino, &g, ACCESS_XATTR)
    }

    /// The names of the inode's extended attributes (its ACLs' only if the mount honours
    /// ACLs, as ext4 lists them only with `acl`).
    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        let mut names = xattr::list(&self.m, ino, &g)?;
        if !self.m.acl {
            names.retain(|name| AclKind::of(name).is_none());
        }
        Ok(names)
    }

    /// Set extended attribute `name` (setxattr(2), `flags` as XATTR_CREATE/XATTR_REPLACE):
    /// EEXIST or ENODATA as the flags demand, E2BIG past `XATTR_VALUE_MAX`, ENOSPC. An ACL
    /// is set as by [`FileSystem::set_acl`], by a caller who may keep the setgid bit (the
    /// flags do not apply to it, as to none of the kernel's ACLs).
    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        if let Some(kind) = AclKind::of(name) {
            return self.set_acl(ino, kind, value, true);
        }
        self.change_xattrs(ino, xattr::set_reserve(value.len()), |store, inode| {
            xattr::set(store, ino, inode, name, value, flags)
        })
    }

    /// Set an ACL from its xattr value (setfacl; `posix_acl_update_mode` for the access
    /// ACL): EINVAL for a malformed value, EACCES for a default ACL on a non-directory,
    /// EOPNOTSUPP on a symlink or a `noacl` mount. An access ACL sets the mode's permission
    /// bits and is stored only if the mode cannot say it all; the setgid bit goes unless
    /// `keeps_setgid` (the caller is in the file's group, or privileged). A value without
    /// entries removes the ACL.
    pub fn set_acl(&self, ino: u64, kind: AclKind, value: &[u8], keeps_setgid: bool) -> Result<()> {
        self.acl_name_allowed(ACCESS_XATTR)?;
        let acl = Acl::decode(value)?;
        let name = acl_name(kind);
        let reserve = xattr::set_reserve(value.len());
        self.change_xattrs(ino, reserve, |store, inode| {
            if inode.mode & S_IFMT == S_IFLNK {
                return Err(Error::NotSupported);
            }
            let Some(acl) = acl else { return remove_if_present(store, ino, inode, name) };
            match kind {
                AclKind::Default if !inode.is_dir() => Err(Error::Denied),
                AclKind::Default => xattr::set(store, ino, inode, name, &acl.encode(), 0),
                AclKind::Access => {
                    let (mode, minimal) = acl.equiv_mode(inode.mode);
                    inode.mode = if keeps_setgid { mode } else { mode & !S_ISGID };
                    if minimal {
                        remove_if_present(store, ino, inode, name)
                    } else {
                        xattr::set(store, ino, inode, name, &acl.encode(), 0)
                    }
                }
            }
        })
    }

    /// Remove extended attribute `name`: ENODATA if there is none. Removing the access ACL
    /// leaves the mode as it is (the mode is already its owner, mask and other entries).
    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.acl_name_allowed(name)?;
        self.change_xattrs(ino, MAP_RESERVE, |store, inode| xattr::remove(store, ino, inode, name))
    }

    /// EOPNOTSUPP for an ACL's name on a mount that ignores ACLs.
    fn acl_name_allowed(&self, name: &[u8]) -> Result<()> {
        if !self.m.acl && AclKind::of(name).is_some() {
            return Err(Error::NotSupported);
        }
        Ok(())
    }

    fn change_xattrs(
        &self,
        ino: u64,
        reserve: u64,
        change: impl FnOnce(&mut TxStore, &mut DiskInode) -> Result<()>,
    ) -> Result<()> {
        let _changing = self.m.start_change();
        let i = self.m.iget(ino)?;
        let mut g = i.core.write();
        let mut updated = g.clone();
        let mut tx = Tx::new(&self.m)?;
        tx.reserve(ino_ag(ino), reserve)?;
        let goal =
            if updated.xattr_root != 0 { updated.xattr_root } else { self.m.geo.ag_layout(ino_ag(ino)).data_start };
        let mut store = TxStore::new(&mut tx, ino, goal);
        // Before the change, which may set a time of its own (setattr).
        updated.ctime = now();
        change(&mut store, &mut updated)?;
        updated.add_blocks(ino, store.blocks)?;
        tx.log_inode(&i, &updated, false);
        tx.commit()?;
        *g = updated;
        Ok(())
    }
}

impl SetAttr {
    /// Write these changes into `updated`, `time` being now.
    fn apply(&self, updated: &mut DiskInode, time: Timespec) {
        if let Some(mode) = self.mode {
            updated.mode = (updated.mode & S_IFMT) | (mode & 0o7777);
        }
        if let Some(uid) = self.uid {
            updated.uid = uid;
        }
        if let Some(gid) = self.gid {
            updated.gid = gid;
        }
        if let Some(atime) = self.atime {
            updated.atime = atime.resolve(time);
        }
        if let Some(mtime) = self.mtime {
            updated.mtime = mtime.resolve(time);
        } else if self.size.is_some() {
            // truncate(2) marks mtime even when the size does not change (as Linux's
            // local file systems do), and open(O_TRUNC) of an existing file must: FUSE
            // sends that as a bare size change and leaves the time to us.
            updated.mtime = time;
        }
        updated.ctime = self.ctime.unwrap_or(time);
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

fn acl_name(kind: AclKind) -> &'static [u8] {
    match kind {
        AclKind::Access => ACCESS_XATTR,
        AclKind::Default => DEFAULT_XATTR,
    }
}

fn remove_if_present(store: &mut TxStore, ino: u64, inode: &mut DiskInode, name: &[u8]) -> Result<()> {
    match xattr::remove(store, ino, inode, name) {
        Ok(()) | Err(Error::NoAttr) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The ACL stored under `name`, None if there is none. A malformed one is damage (fsck
/// reports it): EUCLEAN, never a guess at what it meant.
pub(super) fn stored_acl(m: &Mount, ino: u64, inode: &DiskInode, name: &[u8]) -> Result<Option<Acl>> {
    match xattr::get(m, ino, inode, name) {
        Ok(value) => match Acl::decode(&value) {
            Ok(Some(acl)) => Ok(Some(acl)),
            _ => Err(Error::corrupt("ACL", ino, "malformed posix_acl xattr")),
        },
        Err(Error::NoAttr) => Ok(None),
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
