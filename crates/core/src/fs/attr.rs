//! Attributes: the inode's stat fields, size changes through setattr, and extended
//! attributes.

use super::*;

impl FileSystem {
    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let i = self.m.iget(ino)?;
        let di = i.core.read();
        Ok(Attr::from_inode(ino, &di))
    }

    pub fn setattr(&self, ino: u64, sa: &SetAttr) -> Result<Attr> {
        let i = self.m.iget(ino)?;
        let mut g = i.core.write();
        let t = now();
        let apply = |nd: &mut DiskInode| {
            if let Some(mode) = sa.mode {
                nd.mode = (nd.mode & S_IFMT) | (mode & 0o7777);
            }
            if let Some(uid) = sa.uid {
                nd.uid = uid;
            }
            if let Some(gid) = sa.gid {
                nd.gid = gid;
            }
            if let Some(a) = sa.atime {
                nd.atime = a.resolve(t);
            }
            if let Some(m) = sa.mtime {
                nd.mtime = m.resolve(t);
            } else if sa.size.is_some() {
                // truncate(2) marks mtime even when the size does not change (as Linux's
                // local file systems do), and open(O_TRUNC) of an existing file must: FUSE
                // sends that as a bare size change and leaves the time to us.
                nd.mtime = t;
            }
            nd.ctime = sa.ctime.unwrap_or(t);
        };
        match sa.size {
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
                let mut nd = g.clone();
                apply(&mut nd);
                let mut tx = Tx::new(&self.m)?;
                tx.log_inode(&i, &nd, false);
                tx.commit()?;
                *g = nd;
            }
        }
        Ok(Attr::from_inode(ino, &g))
    }

    pub fn getxattr(&self, ino: u64, name: &[u8]) -> Result<Vec<u8>> {
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        xattr::get(&self.m, ino, &g, name)
    }

    pub fn listxattr(&self, ino: u64) -> Result<Vec<Vec<u8>>> {
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        xattr::list(&self.m, ino, &g)
    }

    pub fn setxattr(&self, ino: u64, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
        self.change_xattrs(ino, xattr::set_reserve(value.len()), |s, di| xattr::set(s, ino, di, name, value, flags))
    }

    pub fn removexattr(&self, ino: u64, name: &[u8]) -> Result<()> {
        self.change_xattrs(ino, MAP_RESERVE, |s, di| xattr::remove(s, ino, di, name))
    }

    fn change_xattrs(&self, ino: u64, reserve: u64, f: impl FnOnce(&mut TxStore, &mut DiskInode) -> Result<()>) -> Result<()> {
        let i = self.m.iget(ino)?;
        let mut g = i.core.write();
        let mut nd = g.clone();
        let mut tx = Tx::new(&self.m)?;
        tx.reserve(ino_ag(ino), reserve)?;
        let goal = if nd.xattr_root != 0 { nd.xattr_root } else { self.m.geo.ag_layout(ino_ag(ino)).data_start };
        let mut s = TxStore::new(&mut tx, ino, goal);
        f(&mut s, &mut nd)?;
        nd.add_blocks(ino, s.blocks)?;
        nd.ctime = now();
        tx.log_inode(&i, &nd, false);
        tx.commit()?;
        *g = nd;
        Ok(())
    }
}
