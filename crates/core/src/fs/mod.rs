//! The embedded file system API: inode-number based, like the kernel's VFS and FUSE's
//! low-level protocol, thread-safe (`Send + Sync`, every method takes `&self`).
//!
//! Locking (docs/DESIGN.md): an operation locks the inodes it changes — in ascending inode
//! number when it needs several — then begins a transaction; AG and CIL locks are taken only
//! inside commit. Inode changes are made on a copy of the inode and stored back only once the
//! transaction committed, so an error leaves the cached inode as it was.

mod atime;
mod copy;
mod falloc;
mod path;
mod types;

pub use types::*;

use crate::dev::BlockDevice;
use crate::dir;
use crate::error::{Error, Result};
use crate::file::{self, MAP_RESERVE, MAX_FILE_BLOCKS};
use crate::format::inode::{Timespec, S_IFCHR, S_IFDIR, S_IFLNK, S_IFMT, S_IFREG, S_ISGID};
use crate::format::{ino_ag, DiskInode, Extent, Fork, BLOCK_SIZE, ROOT_INO};
use crate::inode::{Inode, InodeRef};
use crate::lockstat::{LockClass, Mutex};
use crate::mkfs::{self, MkfsOptions};
use crate::mount::{Mount, MountOptions};
use crate::store::TxStore;
use crate::trans::Tx;
use crate::xattr;
use smallvec::SmallVec;
use std::cell::Cell;
use std::sync::atomic::Ordering::*;
use std::sync::Arc;

static RENAME_LOCK: LockClass = LockClass::ranked("rename", 5);

/// Extents unmapped per transaction when truncating or freeing a file; a larger job runs as
/// several transactions with the inode on the orphan list meanwhile.
const UNMAP_BATCH: usize = 256;
/// Most blocks one fallocate transaction maps (1 GiB); a larger range takes several.
const FALLOC_BATCH: u64 = 1 << 18;
/// Most extents one fallocate transaction maps: bounds the B+tree blocks it must reserve.
const FALLOC_EXTENTS: u64 = 64;
/// Most extents one collapse or insert transaction moves: bounds its B+tree reservation.
/// A file with no more extents past the range than this shifts in one transaction.
const SHIFT_BATCH: usize = 256;
/// Hard links per inode.
pub const LINK_MAX: u32 = 65_000;
pub const SYMLINK_MAX: usize = 4095;
const BS: u64 = BLOCK_SIZE as u64;

pub struct FileSystem {
    m: Arc<Mount>,
    /// Serialises directory renames across directories, so the loop check (is the target
    /// inside the source?) sees a stable tree — the VFS's s_vfs_rename_mutex. Renames of
    /// files and renames within one directory never take it.
    rename_lock: Mutex<()>,
}

thread_local! {
    /// Per-thread rotor spreading new directories over AGs without a shared counter.
    static DIR_ROTOR: Cell<u32> = Cell::new(std::process::id().wrapping_mul(2_654_435_761) ^ thread_seed());
}

fn thread_seed() -> u32 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::hash::Hash::hash(&std::thread::current().id(), &mut h);
    std::hash::Hasher::finish(&h) as u32
}

fn now() -> Timespec {
    mkfs::now()
}

fn ftype_of(mode: u16) -> u8 {
    ((mode & S_IFMT) >> 12) as u8
}

/// The inode a `RENAME_WHITEOUT` leaves at the source name: claimed before any lock.
struct Whiteout {
    ino: u64,
    gen: u32,
    log_version: u64,
    cred: Cred,
}

/// A setgid directory's new entries take its group, and new directories its setgid bit.
fn inherit_setgid(parent: &DiskInode, di: &mut DiskInode) {
    if parent.mode & S_ISGID != 0 {
        di.gid = parent.gid;
        if di.is_dir() {
            di.mode |= S_ISGID;
        }
    }
}

/// Locks on several inodes, taken in ascending inode number (the lock order rule).
/// Inline capacities cover every operation (rename: two parents, source, target): taking
/// the locks allocates nothing.
struct Locked<'a> {
    guards: SmallVec<[(u64, crate::lockstat::RwLockWriteGuard<'a, DiskInode>); 4]>,
}

impl<'a> Locked<'a> {
    fn new(inodes: &[&'a InodeRef]) -> Locked<'a> {
        let mut v: SmallVec<[&InodeRef; 4]> = SmallVec::from_slice(inodes);
        v.sort_by_key(|i| i.ino);
        v.dedup_by_key(|i| i.ino);
        Locked { guards: v.into_iter().map(|i| (i.ino, i.core.write())).collect() }
    }
    fn get(&self, ino: u64) -> &DiskInode {
        &self.guards.iter().find(|(i, _)| *i == ino).expect("inode locked").1
    }
    fn set(&mut self, ino: u64, di: DiskInode) {
        *self.guards.iter_mut().find(|(i, _)| *i == ino).expect("inode locked").1 = di;
    }

    /// Lock `more` as well, keeping the order rule: an inode numbered above every one held is
    /// waited for, a lower one only tried (waiting could close a cycle with a thread that
    /// holds it and waits for one of ours). False if a try failed: the caller then drops
    /// everything and locks in order. This lets an operation look names up under the
    /// directory lock it needs anyway, rather than under a shared hold first: in a busy
    /// directory every extra acquisition is another wait behind its writers.
    fn add(&mut self, more: &[&'a InodeRef]) -> bool {
        let mut v: SmallVec<[&InodeRef; 4]> = SmallVec::from_slice(more);
        v.sort_by_key(|i| i.ino);
        for i in v {
            if self.guards.iter().any(|(ino, _)| *ino == i.ino) {
                continue;
            }
            let guard = if self.guards.iter().all(|(ino, _)| *ino < i.ino) {
                i.core.write()
            } else {
                match i.core.try_write() {
                    Some(g) => g,
                    None => return false,
                }
            };
            self.guards.push((i.ino, guard));
        }
        true
    }
}

impl FileSystem {
    /// Write a new file system on `dev`.
    pub fn mkfs(dev: &dyn BlockDevice, opts: &MkfsOptions) -> Result<()> {
        mkfs::mkfs(dev, opts, &|_, _| {}).map(|_| ())
    }

    /// Mount: recover the log, load the AGs, finish what the orphan list says was in flight.
    /// A read-only mount does it all in memory (its device is an overlay), so it shows
    /// exactly what a read-write mount would; when its orphans cannot be processed it shows
    /// them as they are on disk instead.
    pub fn mount_device(dev: Arc<dyn BlockDevice>, opts: &MountOptions) -> Result<FileSystem> {
        let fs = Self::open_device(dev.clone(), opts)?;
        match fs.process_orphans() {
            Ok(()) => {}
            Err(e) if opts.read_only => {
                eprintln!("ferrofs: read-only mount: orphans left as they are on disk ({e}); their space counts as used");
                fs.m.seal_read_only(); // dropped without a final checkpoint
                drop(fs);
                let fs = Self::open_device(dev, opts)?;
                fs.m.seal_read_only();
                return Ok(fs);
            }
            Err(e) => return Err(e),
        }
        if opts.read_only {
            fs.m.seal_read_only();
        }
        Ok(fs)
    }

    /// The mount before orphan processing, writable even when read-only (see `seal_read_only`).
    fn open_device(dev: Arc<dyn BlockDevice>, opts: &MountOptions) -> Result<FileSystem> {
        let m = Mount::open(dev, opts)?;
        let fs = FileSystem { m, rename_lock: Mutex::new(&RENAME_LOCK, ()) };
        let root = fs.m.iget(ROOT_INO)?;
        if !root.core.read().is_dir() {
            return Err(Error::corrupt("inode", ROOT_INO, "root is not a directory"));
        }
        Ok(fs)
    }

    /// The mounted image's internals: the engine's integration tests watch its journal and
    /// allocation groups (the `testing` feature); everyone else reads [`FileSystem::stats`].
    #[cfg(feature = "testing")]
    pub fn mount(&self) -> &Arc<Mount> {
        &self.m
    }

    #[cfg(not(feature = "testing"))]
    pub(crate) fn mount(&self) -> &Arc<Mount> {
        &self.m
    }

    /// Checkpoint everything, write it home and leave the log empty.
    pub fn unmount(&self) -> Result<()> {
        self.m.unmount()
    }

    /// Make every completed operation durable (sync(2)), and the space it freed reusable.
    pub fn sync(&self) -> Result<()> {
        self.m.check_alive()?;
        self.m.journal.release_busy()
    }

    // ---- attributes -------------------------------------------------------------------

    pub fn getattr(&self, ino: u64) -> Result<Attr> {
        let i = self.m.iget(ino)?;
        let di = i.core.read();
        Ok(Attr::from_inode(ino, &di))
    }

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
    fn commit_with_new_inode(&self, tx: Tx, inode: Option<InodeRef>) -> Result<()> {
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
    fn early_claim_error(&self, e: Error, parent: u64, name: &[u8], must_exist: bool) -> Error {
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
    fn dir_goal(&self, dir: u64, di: &DiskInode) -> u64 {
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
    fn lookup_child(&self, parent: u64, name: &[u8]) -> Result<(InodeRef, InodeRef)> {
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
    fn drop_link(&self, tx: &mut Tx, c: &InodeRef, cd: &mut DiskInode, t: Timespec) -> Result<bool> {
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

    /// If the inode has no links and no open handles, free it (in batches, on the orphan
    /// list until done). Only while `i` itself is the cached inode of its number: once it
    /// was freed, a create may have reused the number for a new inode, which is not ours to
    /// free.
    fn reap_if_unused(&self, i: &InodeRef) -> Result<()> {
        let mut g = i.core.write();
        if g.nlink > 0 || i.open_count.load(Acquire) > 0 || !self.m.ags[ino_ag(i.ino) as usize].inode_in_use(crate::format::ino_index(i.ino)) || !self.m.icache.get(i.ino).is_some_and(|c| Arc::ptr_eq(&c, i)) {
            return Ok(());
        }
        self.reap(i, &mut g)
    }

    fn reap(&self, i: &InodeRef, g: &mut DiskInode) -> Result<()> {
        loop {
            let mut tx = Tx::new(&self.m)?;
            let mut nd = g.clone();
            let done = self.unmap_from(&mut tx, i.ino, &mut nd, 0)? && self.free_xattr_values(&mut tx, i.ino, &mut nd)?;
            if done {
                xattr::destroy(&mut TxStore::new(&mut tx, i.ino, 0), &mut nd)?;
                if nd.orphan_slot != 0 {
                    tx.orphan_remove(i.ino, &mut nd);
                }
                tx.free_inode(i);
                tx.commit()?;
                *g = nd;
                self.m.icache.remove(i.ino);
                return Ok(());
            }
            if nd.orphan_slot == 0 {
                tx.orphan_add(i.ino, &mut nd)?;
            }
            tx.log_inode(i, &nd, true);
            tx.commit()?;
            *g = nd;
        }
    }

    /// Free up to one batch of the value blocks of the inode's xattrs. Returns whether none is
    /// left.
    fn free_xattr_values(&self, tx: &mut Tx, ino: u64, nd: &mut DiskInode) -> Result<bool> {
        let mut s = TxStore::new(tx, ino, 0);
        let done = xattr::free_values(&mut s, nd, xattr::FREE_BATCH_BLOCKS)?;
        nd.add_blocks(ino, s.blocks)?;
        Ok(done)
    }

    /// Unmap and free up to one batch of the file's blocks at or after block `from`.
    /// Returns whether nothing is left to unmap there.
    fn unmap_from(&self, tx: &mut Tx, ino: u64, nd: &mut DiskInode, from: u64) -> Result<bool> {
        self.unmap_range(tx, ino, nd, from, MAX_FILE_BLOCKS)
    }

    /// Unmap and free up to one batch of the file's blocks in `[from, to)`. Returns whether
    /// nothing is left to unmap there.
    fn unmap_range(&self, tx: &mut Tx, ino: u64, nd: &mut DiskInode, from: u64, to: u64) -> Result<bool> {
        if !(nd.is_reg() || nd.is_symlink()) || matches!(nd.fork, Fork::Inline { .. }) {
            return Ok(true);
        }
        // A punch may split an extent: freeing space must work on a full file system.
        tx.reserve_pooled(ino_ag(ino), MAP_RESERVE)?;
        let mut s = TxStore::new(tx, ino, 0);
        let (pieces, done) = file::unmap(&mut s, &self.m, ino, nd, from, to, UNMAP_BATCH)?;
        let tree_delta = s.blocks;
        for p in &pieces {
            tx.free_blocks(p.pblk, p.len as u64, false);
        }
        let unmapped: i64 = pieces.iter().map(|p| p.len as i64).sum();
        nd.add_blocks(ino, tree_delta - unmapped)?;
        Ok(done)
    }

    /// Mount-time: every inode on an orphan list is either unlinked (free it) or was being
    /// truncated (finish cutting it to its size).
    fn process_orphans(&self) -> Result<()> {
        for ag in self.m.ags.iter() {
            for (_, ino) in ag.orphans() {
                let i = self.m.iget(ino).map_err(|_| Error::corrupt("orphan table", ag.layout.orphan_table, format!("entry {} is not an allocated inode", ino)))?;
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

    // ---- rename -----------------------------------------------------------------------

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

    // ---- file data --------------------------------------------------------------------

    /// Open a handle: the inode stays allocated until the last handle is released, even if
    /// it is unlinked meanwhile.
    pub fn open(&self, ino: u64) -> Result<Attr> {
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        if g.nlink == 0 && g.orphan_slot == 0 {
            return Err(Error::Stale);
        }
        i.open_count.fetch_add(1, AcqRel);
        Ok(Attr::from_inode(ino, &g))
    }

    pub fn release(&self, ino: u64) -> Result<()> {
        let Some(i) = self.m.icache.get(ino) else { return Ok(()) };
        let prev = i.open_count.fetch_sub(1, AcqRel);
        debug_assert!(prev > 0, "release without open on inode {}", ino);
        if prev == 1 {
            return self.reap_if_unused(&i);
        }
        Ok(())
    }

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
        for e in file::read_extents(&self.m, ino, &g, off / BS, end.div_ceil(BS))? {
            if e.unwritten {
                continue;
            }
            let (lo, hi) = ((e.lblk * BS).max(off), (e.end() * BS).min(end));
            let dev_off = e.pblk * BS + (lo - e.lblk * BS);
            self.m.dev.read_at(&mut out[(lo - off) as usize..(hi - off) as usize], dev_off)?;
        }
        Ok(out)
    }

    pub fn write(&self, ino: u64, off: u64, data: &[u8]) -> Result<usize> {
        if data.is_empty() {
            return Ok(0);
        }
        let end = off.checked_add(data.len() as u64).ok_or(Error::FileTooBig)?;
        if end > MAX_FILE_BLOCKS * BS {
            return Err(Error::FileTooBig);
        }
        let i = self.m.iget(ino)?;
        let mut g = i.core.write();
        if g.is_dir() {
            return Err(Error::IsDir);
        }
        if !g.is_reg() {
            return Err(Error::Invalid("write to a non-regular file"));
        }
        let mut nd = g.clone();
        let mut tx = Tx::new(&self.m)?;
        self.zero_tail(&i, &nd, off)?;
        let maps_changed = self.write_blocks(&mut tx, &i, &mut nd, off, data)?;
        let t = now();
        let grew = end > nd.size;
        nd.size = nd.size.max(end);
        nd.mtime = t;
        nd.ctime = t;
        tx.log_inode(&i, &nd, maps_changed || grew);
        tx.commit()?;
        *g = nd;
        Ok(data.len())
    }

    /// Before the size grows past `new_end`: zero the stale bytes after the old EOF in the
    /// old last block (they may hold data from before a shrinking truncate).
    fn zero_tail(&self, i: &InodeRef, di: &DiskInode, new_end: u64) -> Result<()> {
        let size = di.size;
        if new_end <= size || size.is_multiple_of(BS) {
            return Ok(());
        }
        let blk = size / BS;
        if let Some(e) = file::read_extents(&self.m, i.ino, di, blk, blk + 1)?.first().filter(|e| !e.unwritten) {
            let n = (BS - size % BS).min(new_end - size) as usize;
            self.m.dev.write_at(&vec![0u8; n], (e.pblk + (blk - e.lblk)) * BS + size % BS)?;
            self.note_data(i);
        }
        Ok(())
    }

    fn note_data(&self, i: &InodeRef) {
        self.m.journal.note_data_write();
        i.data_dirty.store(true, Relaxed);
    }

    /// Write `data` at `off`: in place over written extents; into new blocks (zero padded)
    /// over holes and unwritten extents, which are then mapped. Data reaches the device
    /// before the transaction that maps it commits (ordered data). Returns whether the block
    /// map changed.
    fn write_blocks(&self, tx: &mut Tx, i: &InodeRef, nd: &mut DiskInode, off: u64, data: &[u8]) -> Result<bool> {
        let (first, last) = (off / BS, (off + data.len() as u64 - 1) / BS);
        let mapped = file::read_extents(&self.m, i.ino, nd, first, last + 1)?;
        let mut cur = first;
        let mut new_maps: Vec<Extent> = Vec::new();
        let mut to_convert: Vec<(u64, u64)> = Vec::new();
        for e in mapped.iter().chain(std::iter::once(&Extent { lblk: last + 1, pblk: 0, len: 0, unwritten: false })) {
            if e.lblk > cur {
                new_maps.push(Extent { lblk: cur, pblk: 0, len: (e.lblk.min(last + 1) - cur) as u32, unwritten: false });
            }
            if e.len == 0 {
                break;
            }
            let (lo, hi) = (e.lblk.max(first), e.end().min(last + 1));
            if e.unwritten {
                to_convert.push((lo, hi));
            } else {
                self.write_span(data, off, lo, hi, e.pblk + (lo - e.lblk), false)?;
            }
            cur = hi;
        }
        if new_maps.is_empty() && to_convert.is_empty() {
            self.note_data(i);
            return Ok(false);
        }
        // Converting unwritten blocks allocates no data blocks, only tree nodes: a conversion
        // in the middle of an unwritten extent removes it and inserts up to three pieces
        // (net two more extents). A conversion that keeps the map inline needs none. With a
        // B+tree map the worst case is reserved from the AGs' pools, which ordinary
        // allocations leave alone, so a write into preallocated space gets its tree blocks
        // on a full file system too (until the pools run dry: thousands of splits).
        let fresh: u64 = new_maps.iter().map(|e| e.len as u64).sum::<u64>();
        let inline = match nd.fork {
            Fork::Empty => Some(0),
            Fork::Extents { n, .. } => Some(n as usize),
            _ => None,
        };
        let stays_inline = new_maps.is_empty() && inline.is_some_and(|n| n + 2 * to_convert.len() <= crate::format::inode::INLINE_EXTENTS);
        let (tree_fresh, tree_convert) = if stays_inline { (0, 0) } else { (MAP_RESERVE * new_maps.len() as u64, MAP_RESERVE * 3 * to_convert.len() as u64) };
        let goal = mapped.last().map_or(self.m.geo.ag_layout(ino_ag(i.ino)).data_start, |e| e.pblk + e.len as u64);
        if fresh + tree_fresh > 0 {
            tx.reserve(ino_ag(i.ino), fresh + tree_fresh)?;
        }
        if tree_convert > 0 {
            tx.reserve_pooled(ino_ag(i.ino), tree_convert)?;
        }
        let mut goal = goal;
        for (lo, hi) in to_convert {
            let mut s = TxStore::new(tx, i.ino, 0);
            let (pieces, _) = file::unmap(&mut s, &self.m, i.ino, nd, lo, hi, usize::MAX)?;
            nd.add_blocks(i.ino, s.blocks)?;
            for p in pieces {
                self.write_span(data, off, p.lblk, p.end(), p.pblk, true)?;
                nd.add_blocks(i.ino, -(p.len as i64))?;
                new_maps.push(Extent { unwritten: false, ..p });
            }
        }
        for hole in new_maps.iter().filter(|e| e.pblk == 0).copied().collect::<Vec<_>>() {
            let mut lblk = hole.lblk;
            while lblk < hole.end() {
                let want = (hole.end() - lblk).min(crate::format::inode::EXTENT_LEN_MAX as u64);
                let (pblk, len) = tx.alloc_blocks(goal, want)?;
                self.write_span(data, off, lblk, lblk + len, pblk, true)?;
                self.map_extent(tx, i.ino, nd, Extent { lblk, pblk, len: len as u32, unwritten: false })?;
                nd.blocks += len;
                goal = pblk + len;
                lblk += len;
            }
        }
        for e in new_maps.into_iter().filter(|e| e.pblk != 0) {
            self.map_extent(tx, i.ino, nd, e)?;
            nd.blocks += e.len as u64;
        }
        self.note_data(i);
        Ok(true)
    }

    fn map_extent(&self, tx: &mut Tx, ino: u64, nd: &mut DiskInode, e: Extent) -> Result<()> {
        let mut s = TxStore::new(tx, ino, e.pblk);
        file::map(&mut s, &self.m, ino, nd, e)?;
        nd.add_blocks(ino, s.blocks)?;
        Ok(())
    }

    /// Write the part of `data` (which starts at file offset `off`) that falls in file
    /// blocks `[lo, hi)`, at device block `pblk`. `fresh` blocks get zeros around the data.
    fn write_span(&self, data: &[u8], off: u64, lo: u64, hi: u64, pblk: u64, fresh: bool) -> Result<()> {
        let (start, end) = ((lo * BS).max(off), (hi * BS).min(off + data.len() as u64));
        let piece = &data[(start - off) as usize..(end - off) as usize];
        if !fresh {
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
    fn truncate(&self, i: &InodeRef, g: &mut DiskInode, size: u64, attrs: &dyn Fn(&mut DiskInode)) -> Result<()> {
        if size > MAX_FILE_BLOCKS * BS {
            return Err(Error::FileTooBig);
        }
        self.zero_tail(i, g, size)?;
        let from = size.div_ceil(BS);
        // Only unwritten (preallocated) blocks can lie past the old end: growing keeps them,
        // as ext4 and XFS do; a truncate to the same size or smaller drops them.
        let grow = size > g.size;
        loop {
            let mut nd = g.clone();
            let mut tx = Tx::new(&self.m)?;
            let done = grow || self.unmap_from(&mut tx, i.ino, &mut nd, from)?;
            nd.size = size;
            if !done && nd.orphan_slot == 0 {
                tx.orphan_add(i.ino, &mut nd)?;
            }
            if done && nd.orphan_slot != 0 && nd.nlink > 0 {
                tx.orphan_remove(i.ino, &mut nd);
            }
            attrs(&mut nd);
            tx.log_inode(i, &nd, true);
            tx.commit()?;
            *g = nd;
            if done {
                return Ok(());
            }
        }
    }

    // ---- preallocation ----------------------------------------------------------------

    /// lseek(2) SEEK_DATA (`hole == false`) or SEEK_HOLE from `off`: the offset, or ENXIO
    /// (`Error::NoData`) past the end. Unwritten extents read as zeros, so they count as holes.
    pub fn seek(&self, ino: u64, off: u64, hole: bool) -> Result<u64> {
        let i = self.m.iget(ino)?;
        let g = i.core.read();
        if off >= g.size {
            return Err(Error::NoData);
        }
        let mut pos = off;
        for e in file::read_extents(&self.m, ino, &g, off / BS, g.size.div_ceil(BS))?.iter().filter(|e| !e.unwritten) {
            let (start, end) = (e.lblk * BS, e.end() * BS);
            if end <= pos {
                continue;
            }
            if hole {
                if start > pos {
                    return Ok(pos);
                }
                pos = end;
            } else {
                return Ok(start.max(pos));
            }
        }
        if hole {
            Ok(pos.min(g.size))
        } else {
            Err(Error::NoData)
        }
    }

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

    pub fn statfs(&self) -> StatFs {
        let geo = &self.m.geo;
        let (bfree, ffree) = self.m.ags.iter().fold((0, 0), |(b, f), ag| (b + ag.free_blocks(), f + ag.free_inodes()));
        StatFs { blocks: geo.block_count, bfree, bavail: bfree, files: geo.total_inodes(), ffree, bsize: BLOCK_SIZE as u32, namelen: crate::format::NAME_MAX as u32 }
    }

    // ---- xattrs -----------------------------------------------------------------------

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

impl Drop for FileSystem {
    fn drop(&mut self) {
        // An embedded user that forgets to unmount still gets a clean log (best effort).
        if !self.m.is_read_only() && self.m.check_alive().is_ok() {
            let _ = self.m.unmount();
        }
    }
}
