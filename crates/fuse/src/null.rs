//! The null server: a FUSE file system that keeps names and nothing else in memory, served
//! through `/dev/fuse` or through the io_uring rings of `uring.rs`. With no engine behind it,
//! what it sustains is the ceiling of the transport itself, as minifuse (libfuse) is for
//! `/dev/fuse`; `ferrofs bench` mounts it as the targets `null` and `null-uring`
//! (program `ferrofs-nullfs`). It answers what fs_mark, `rm -rf`, the mdtest-style workload
//! and dbench ask: lookups, attributes, creates, removals, renames and listings, and reads
//! and writes that cross the transport whole. A file keeps its size and no data (it reads
//! back as zeros): dbench needs sizes (its reads expect what its writes made), never data.

use crate::kernel_mount::{KernelMount, KernelOptions};
use crate::uring::{self, QueueConfig};
use crate::workers::{self, Workers};
use crate::MAX_WRITE;
use ferrofs_lockstat::{LockClass, Mutex};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig,
    LockOwner, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, Session, SessionACL, WriteFlags,
};
use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

static NULL_TREE: LockClass = LockClass::new("null-tree");

const TTL: Duration = Duration::from_secs(3600);
const ROOT: u64 = 1;

struct Node {
    dir: bool,
    mode: u16,
    /// A file's size: what its writes and truncations made it.
    size: u64,
    /// Names in a directory, in creation order of their cookies (the listing's offsets).
    children: BTreeMap<OsString, u64>,
}

struct Tree {
    nodes: HashMap<u64, Node>,
    next: u64,
}

struct NullFs {
    tree: Mutex<Tree>,
    workers: Arc<Workers>,
    uid: u32,
    gid: u32,
    /// What every read returns (`MAX_WRITE` bytes, the most a read asks for).
    zeros: Vec<u8>,
}

impl NullFs {
    fn attr(&self, ino: u64, node: &Node) -> FileAttr {
        let now = SystemTime::UNIX_EPOCH;
        FileAttr {
            ino: INodeNo(ino),
            size: node.size,
            blocks: node.size.div_ceil(512),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind: if node.dir { FileType::Directory } else { FileType::RegularFile },
            perm: node.mode,
            nlink: if node.dir { 2 } else { 1 },
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    /// Make `name` in `parent`: its attributes, or the errno.
    fn make(&self, parent: INodeNo, name: &OsStr, mode: u32, dir: bool) -> Result<FileAttr, Errno> {
        let mut t = self.tree.lock();
        let ino = t.next;
        let node = Node { dir, mode: (mode & 0o7777) as u16, size: 0, children: BTreeMap::new() };
        let attr = self.attr(ino, &node);
        let p = t.nodes.get_mut(&parent.0).filter(|p| p.dir).ok_or(Errno::ENOTDIR)?;
        if p.children.contains_key(name) {
            return Err(Errno::EEXIST);
        }
        p.children.insert(name.to_owned(), ino);
        t.nodes.insert(ino, node);
        t.next += 1;
        Ok(attr)
    }

    fn remove(&self, parent: INodeNo, name: &OsStr, dir: bool) -> Result<(), Errno> {
        let mut t = self.tree.lock();
        let p = t.nodes.get(&parent.0).ok_or(Errno::ENOENT)?;
        let &ino = p.children.get(name).ok_or(Errno::ENOENT)?;
        Self::removable(&t.nodes[&ino], dir)?;
        t.nodes.remove(&ino);
        t.nodes.get_mut(&parent.0).expect("parent").children.remove(name);
        Ok(())
    }

    /// Whether `node` may go as a directory (`dir`) or as a file.
    fn removable(node: &Node, dir: bool) -> Result<(), Errno> {
        match (node.dir, dir) {
            (true, false) => Err(Errno::EISDIR),
            (false, true) => Err(Errno::ENOTDIR),
            (true, true) if !node.children.is_empty() => Err(Errno::ENOTEMPTY),
            _ => Ok(()),
        }
    }

    /// rename(2) without flags: `to` is replaced if it is of the same kind (and empty, for a
    /// directory).
    fn rename(&self, from: (INodeNo, &OsStr), to: (INodeNo, &OsStr)) -> Result<(), Errno> {
        let mut t = self.tree.lock();
        let &ino = t.nodes.get(&from.0 .0).and_then(|p| p.children.get(from.1)).ok_or(Errno::ENOENT)?;
        let dir = t.nodes[&ino].dir;
        let target = t.nodes.get(&to.0 .0).filter(|p| p.dir).ok_or(Errno::ENOTDIR)?;
        if let Some(&old) = target.children.get(to.1) {
            if old == ino {
                return Ok(());
            }
            Self::removable(&t.nodes[&old], dir)?;
            t.nodes.remove(&old);
        }
        t.nodes.get_mut(&from.0 .0).expect("parent").children.remove(from.1);
        t.nodes.get_mut(&to.0 .0).expect("new parent").children.insert(to.1.to_owned(), ino);
        Ok(())
    }
}

impl Filesystem for NullFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        let mut want = InitFlags::FUSE_ASYNC_READ | InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_MAX_PAGES;
        if self.workers.uring() == workers::URING_ASKED {
            want |= InitFlags::FUSE_OVER_IO_URING;
        }
        let _ = config.add_capabilities(want & config.capabilities());
        let got = config.capabilities().contains(InitFlags::FUSE_OVER_IO_URING);
        if self.workers.uring() == workers::URING_ASKED {
            self.workers.set_uring(if got { workers::URING_ON } else { workers::URING_OFF });
        }
        let _ = config.set_max_write(MAX_WRITE);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let t = self.tree.lock();
        match t.nodes.get(&parent.0).and_then(|p| p.children.get(name)) {
            Some(&ino) => reply.entry(&TTL, &self.attr(ino, &t.nodes[&ino]), Generation(0)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let t = self.tree.lock();
        match t.nodes.get(&ino.0) {
            Some(n) => reply.attr(&TTL, &self.attr(ino.0, n)),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        _kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        if let (Some(size), Some(node)) = (size, self.tree.lock().nodes.get_mut(&ino.0)) {
            node.size = size;
        }
        self.getattr(req, ino, fh, reply)
    }

    fn mknod(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _rdev: u32,
        reply: ReplyEntry,
    ) {
        match self.make(parent, name, mode, false) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, mode: u32, _umask: u32, reply: ReplyEntry) {
        match self.make(parent, name, mode, true) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        _flags: i32,
        reply: ReplyCreate,
    ) {
        match self.make(parent, name, mode, false) {
            Ok(a) => reply.created(&TTL, &a, Generation(0), FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, false) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        match self.remove(parent, name, true) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        if !flags.is_empty() {
            return reply.error(Errno::EINVAL);
        }
        match self.rename((parent, name), (newparent, newname)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    /// Zeros, up to the file's size.
    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let Some(file_size) = self.tree.lock().nodes.get(&ino.0).map(|n| n.size) else {
            return reply.error(Errno::ENOENT);
        };
        let n = file_size.saturating_sub(offset).min(u64::from(size)).min(self.zeros.len() as u64);
        reply.data(&self.zeros[..n as usize])
    }

    /// Takes every byte and keeps only the size it makes.
    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let mut t = self.tree.lock();
        let Some(node) = t.nodes.get_mut(&ino.0) else { return reply.error(Errno::ENOENT) };
        node.size = node.size.max(offset + data.len() as u64);
        // At most max_write (1 MiB) bytes arrive at once, so the count fits.
        reply.written(data.len() as u32)
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        reply.ok()
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        reply.ok()
    }

    /// ENOSYS, as ferrofs answers when it has nothing to check: the kernel then sends no
    /// OPEN (nor RELEASE) again and keeps the page cache across opens, so dbench's reads and
    /// opens cost the null server what they cost ferrofs.
    fn open(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        reply.error(Errno::ENOSYS)
    }

    // release, opendir and releasedir: fuser's defaults (handle 0, success).

    /// Offsets are positions in the name order (2 and up; 1 is `..`): a listing while names
    /// are removed (`rm -rf`) may skip some, and `rm -rf` lists again until the directory is
    /// empty.
    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let t = self.tree.lock();
        let Some(dir) = t.nodes.get(&ino.0) else { return reply.error(Errno::ENOENT) };
        let dots = [(ino.0, FileType::Directory, OsStr::new(".")), (ino.0, FileType::Directory, OsStr::new(".."))];
        let names = dir.children.iter().map(|(name, &child)| {
            let kind = if t.nodes[&child].dir { FileType::Directory } else { FileType::RegularFile };
            (child, kind, name.as_os_str())
        });
        for (i, (child, kind, name)) in dots.into_iter().chain(names).enumerate().skip(offset as usize) {
            if reply.add(INodeNo(child), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok()
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let files = self.tree.lock().nodes.len() as u64;
        reply.statfs(1 << 24, 1 << 24, 1 << 24, 1 << 26, (1 << 26) - files, 4096, 255, 4096)
    }
}

/// Mount the null server on `mountpoint` and serve until it is unmounted, through io_uring
/// rings if `uring` (the fuse module's `enable_uring` must be on), else through `/dev/fuse`
/// with `threads` readers.
pub fn serve(mountpoint: &Path, uring: bool, threads: usize) -> io::Result<()> {
    let workers = Arc::new(Workers::new(threads.max(1)));
    if uring {
        workers.set_uring(workers::URING_ASKED);
    }
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let root = Node { dir: true, mode: 0o777, size: 0, children: BTreeMap::new() };
    let tree = Tree { nodes: HashMap::from([(ROOT, root)]), next: ROOT + 1 };
    let fs = NullFs {
        tree: Mutex::new(&NULL_TREE, tree),
        workers: workers.clone(),
        uid,
        gid,
        zeros: vec![0; MAX_WRITE as usize],
    };
    let mut config = fuser::Config::default();
    config.mount_options =
        vec![MountOption::FSName("ferrofs-null".into()), MountOption::CUSTOM("subtype=ferrofs-null".into())];
    config.acl = SessionACL::All;
    config.n_threads = Some(threads.max(1));
    config.clone_fd = true;
    let options = KernelOptions::new(&config.mount_options, config.acl).map_err(io::Error::other)?;
    let (fuse, _kernel) = KernelMount::mount(mountpoint, &options)?;
    let session = Session::from_fd(fs, fuse, config.acl, config)?;
    if uring && workers.uring() != workers::URING_ON {
        return Err(io::Error::other("the kernel did not offer FUSE over io_uring"));
    }
    let conn = session.as_fd().try_clone_to_owned()?;
    session.run_with(|dispatcher| {
        if !uring {
            return Ok(Vec::new());
        }
        uring::start(
            &conn,
            dispatcher,
            QueueConfig { depth: uring::depth(), payload: MAX_WRITE as usize },
            &workers,
            None,
        )
    })
}
