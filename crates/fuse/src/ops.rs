//! The FUSE request handlers: each one calls the engine, then replies with what it returned.
//!
//! Inode numbers pass through unchanged (the engine's root is 1 = FUSE_ROOT_ID). File handles
//! carry nothing. An inode lives as long as the kernel may use its number: every reply that
//! gives the kernel a reference (an entry: lookup, create, mknod, mkdir, symlink, link,
//! tmpfile, each readdirplus entry but `.` and `..`) takes one in the engine (`hold`), and
//! FORGET drops what the kernel says it dropped. The kernel forgets an unlinked inode only
//! after its last open file closed, so an unlinked file lives until its last close without
//! OPEN or RELEASE, which the kernel is then told it need not send (docs/DESIGN.md, "Lifetime
//! of an inode: the kernel's lookup count").
//!
//! Unless the kernel checks permissions (`default_permissions`), each request is checked
//! against the engine's attributes with [`crate::access`] before the engine changes anything.

mod attr;
mod checks;
mod copy;
mod dir;
mod tmpfile;
mod xattr;

use crate::access::{Caller, MAY_EXEC, MAY_READ, MAY_WRITE};
use crate::epoch::NameEpoch;
use crate::sync_pool::{SyncPool, SYNC_QUEUE_MAX, SYNC_THREADS};
use crate::workers::{self, Workers};
use crate::{MountConfig, MAX_WRITE};
use attr::{file_attr, negative_attr, reply_created, request_time, time_or_now};
use ferrofs::{Attr, Cred, FileSystem, PrivDrop, SetAttr};
use fuser::{
    AccessFlags, Errno, FileHandle, FopenFlags, ForgetOne, Generation, INodeNo, InitFlags, KernelConfig, Notifier,
    OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty,
    ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime};
use xattr::reply_xattr;

pub struct FerroFuse {
    fs: Arc<FileSystem>,
    /// The image served, which every logged line names (one daemon may serve several).
    image: Arc<str>,
    entry_ttl: Duration,
    attr_ttl: Duration,
    writeback_cache: bool,
    /// Check permissions here: the kernel does not (no `default_permissions`).
    checks: bool,
    /// POSIX ACLs are honoured (no `noacl`).
    acl: bool,
    /// Writes, truncates and chowns drop set-id bits and capabilities here, not in the kernel
    /// (`FUSE_HANDLE_KILLPRIV_V2`, set at init if the kernel offers it).
    drops_privileges: bool,
    /// Answer OPEN and OPENDIR with ENOSYS, so that the kernel sends neither again, nor
    /// RELEASE and RELEASEDIR: set when an open has nothing to check (see `open`).
    no_open: bool,
    no_opendir: bool,
    /// Set once the session exists: drops names the kernel may no longer cache.
    notifier: Arc<OnceLock<Notifier>>,
    /// Expires every cached name at once, where the kernel can.
    name_epoch: Arc<NameEpoch>,
    /// Runs fsync and fsyncdir, which wait on the device, off the workers.
    syncs: Arc<SyncPool>,
    /// How many workers read `/dev/fuse`, and where they run.
    workers: Arc<Workers>,
}

type Res<T> = std::result::Result<T, Errno>;

impl FerroFuse {
    pub fn new(fs: Arc<FileSystem>, opts: &MountConfig) -> std::io::Result<FerroFuse> {
        Ok(FerroFuse {
            image: opts.image.display().to_string().into(),
            entry_ttl: opts.entry_timeout,
            attr_ttl: opts.attr_timeout,
            writeback_cache: opts.writeback_cache,
            checks: !opts.default_permissions,
            acl: opts.acl(),
            drops_privileges: false,
            no_open: opts.default_permissions && !fs.accesses_set_atime(false),
            no_opendir: opts.default_permissions && !fs.accesses_set_atime(true),
            notifier: Arc::new(OnceLock::new()),
            name_epoch: Arc::default(),
            syncs: Arc::new(SyncPool::start(SYNC_THREADS, SYNC_QUEUE_MAX)?),
            workers: Arc::new(Workers::new(opts.thread_count())),
            fs,
        })
    }

    /// Where the session's notifier goes once the session exists.
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    /// What expires cached names, which needs the session's descriptor once the session
    /// exists.
    pub fn name_epoch(&self) -> Arc<NameEpoch> {
        self.name_epoch.clone()
    }

    /// The sync pool, which also serves the rings' requests that would wait.
    pub fn sync_pool(&self) -> Arc<SyncPool> {
        self.syncs.clone()
    }

    /// The worker pool, which needs the session's descriptor once the session exists.
    pub fn workers(&self) -> Arc<Workers> {
        self.workers.clone()
    }

    fn call<T>(&self, op: &'static str, f: impl FnOnce(&FileSystem) -> ferrofs::Result<T>) -> Res<T> {
        call_engine(&self.fs, &self.image, op, f)
    }

    /// fsync or fsyncdir, on the sync pool: the reply goes once the change is durable.
    fn sync(&self, op: &'static str, ino: u64, datasync: bool, reply: ReplyEmpty) {
        let (fs, image) = (Arc::clone(&self.fs), Arc::clone(&self.image));
        self.syncs.submit(move || reply_empty(reply, call_engine(&fs, &image, op, |fs| fs.fsync(ino, datasync))));
    }

    /// Reply with an entry, which the kernel counts as a reference to the inode: held first,
    /// as a FORGET of it may follow the reply at once.
    fn reply_entry(&self, reply: ReplyEntry, entry_ttl: Duration, res: Res<Attr>) {
        match res {
            Ok(a) => {
                self.fs.hold(a.ino);
                reply.entry_with_ttls(&self.attr_ttl, &entry_ttl, &file_attr(&a), Generation(a.generation as u64))
            }
            Err(e) => reply.error(e),
        }
    }

    /// Drop `nlookup` of the kernel's references to `ino`. No reply to fail; the engine has
    /// logged what matters.
    fn forget_one(&self, ino: u64, nlookup: u64) {
        let _ = self.call("forget", |fs| fs.forget(ino, nlookup));
    }

    /// Who sent `req`, with the mount's ACLs when it honours them.
    fn caller(&self, req: &Request) -> Caller<'_> {
        Caller::new(req.uid(), req.gid(), req.pid(), self.acl.then_some(&*self.fs))
    }

    fn getattr(&self, op: &'static str, ino: u64) -> Res<Attr> {
        self.call(op, |fs| fs.getattr(ino))
    }

    /// What a write or truncate must take from the file, if the kernel left that to us: the
    /// capabilities always, the set-id bits too when the changer may not keep them.
    fn privileges_to_drop(&self, set_id: bool) -> Option<PrivDrop> {
        let drop = if set_id { PrivDrop::CapabilitiesAndSetId } else { PrivDrop::Capabilities };
        self.drops_privileges.then_some(drop)
    }

    /// What copy_file_range and fallocate must take from the file they change. For those the
    /// kernel drops privileges through a setattr of its own, which it leaves out once we
    /// handle them, and sends no flag: the set-id bits go unless the caller may keep them
    /// (CAP_FSETID, which FUSE does not report: uid 0 stands for it).
    fn privileges_dropped_by(&self, req: &Request) -> Option<PrivDrop> {
        self.privileges_to_drop(req.uid() != 0)
    }

    /// Call the engine for a change of `ino` that takes `drop` from it first.
    fn call_dropping<T>(
        &self,
        op: &'static str,
        ino: u64,
        drop: Option<PrivDrop>,
        change: impl FnOnce(&FileSystem) -> ferrofs::Result<T>,
    ) -> Res<T> {
        self.call(op, |fs| {
            if let Some(drop) = drop {
                fs.drop_privileges(ino, drop)?;
            }
            change(fs)
        })
    }
}

fn cred(req: &Request) -> Cred {
    Cred { uid: req.uid(), gid: req.gid(), umask: 0 }
}

/// The creator of a new inode: the caller, with its request's umask, which the engine applies
/// unless the directory's default ACL stands in for it (deciding under the directory's lock).
/// Without FUSE_DONT_MASK the kernel has already applied it; applying it again changes nothing.
fn creator(req: &Request, umask: u32) -> Cred {
    Cred { umask: (umask & 0o777) as u16, ..cred(req) }
}

/// The file type and permission bits of a mode the kernel sends.
fn mode_bits(mode: u32) -> u16 {
    (mode & (libc::S_IFMT | 0o7777)) as u16
}

/// Call the engine. An error becomes its errno; a panic (an engine bug) is contained:
/// the engine is shut down — no further changes, so nothing half-done reaches the disk —
/// and the request fails with EIO. The calling thread lives on.
fn call_engine<T>(
    fs: &FileSystem,
    image: &str,
    op: &'static str,
    f: impl FnOnce(&FileSystem) -> ferrofs::Result<T>,
) -> Res<T> {
    match catch_unwind(AssertUnwindSafe(|| f(fs))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            if matches!(e, ferrofs::Error::Io(_) | ferrofs::Error::Corrupt { .. }) {
                log::error!(image; "{op}: {e}");
            }
            Err(Errno::from_i32(e.errno()))
        }
        Err(panic) => {
            let msg = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            fs.shut_down(&format!("engine panicked in {}: {}", op, msg));
            Err(Errno::EIO)
        }
    }
}

fn reply_empty(reply: ReplyEmpty, res: Res<()>) {
    match res {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

impl fuser::Filesystem for FerroFuse {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let mut want = InitFlags::FUSE_ASYNC_READ
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_DO_READDIRPLUS
            | InitFlags::FUSE_READDIRPLUS_AUTO
            | InitFlags::FUSE_PARALLEL_DIROPS
            | InitFlags::FUSE_MAX_PAGES
            | InitFlags::FUSE_CACHE_SYMLINKS;
        if self.writeback_cache {
            want |= InitFlags::FUSE_WRITEBACK_CACHE;
        }
        // Dropping set-id bits and capabilities ourselves spares the kernel a GETXATTR of
        // security.capability before every write and a GETATTR before every chown.
        want |= InitFlags::FUSE_HANDLE_KILLPRIV_V2;
        if self.acl {
            // The umask is ours to apply: not where a default ACL stands in for it.
            want |= InitFlags::FUSE_DONT_MASK;
            // The kernel checks ACLs only with this flag, which also makes it check
            // permissions (default_permissions): asked only when the kernel checks anyway.
            if !self.checks {
                want |= InitFlags::FUSE_POSIX_ACL;
            }
        }
        if self.workers.uring() == workers::URING_ASKED {
            want |= InitFlags::FUSE_OVER_IO_URING;
        }
        // Ask only for what this kernel offers; the rest silently stays off.
        let _ = config.add_capabilities(want & config.capabilities());
        if !config.capabilities().contains(InitFlags::FUSE_OVER_IO_URING) {
            self.workers.set_uring(workers::URING_OFF);
        } else if self.workers.uring() == workers::URING_ASKED {
            self.workers.set_uring(workers::URING_ON);
        }
        self.drops_privileges = config.capabilities().contains(InitFlags::FUSE_HANDLE_KILLPRIV_V2);
        if self.writeback_cache && !config.capabilities().contains(InitFlags::FUSE_WRITEBACK_CACHE) {
            log::warn!(image = &*self.image; "the kernel offers no writeback cache; mounting without it");
        }
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE).or_else(|max| config.set_max_readahead(max));
        // Room for the async reads and writeback the kernel may keep in flight.
        let _ = config.set_max_background(64);
        Ok(())
    }

    /// The connection is over: the kernel forgets nothing at unmount, so every reference it
    /// held goes now, and the unlinked inodes they kept are freed before the checkpoint.
    fn destroy(&mut self) {
        if let Err(e) = self.call("destroy", |fs| fs.forget_all()) {
            log::error!(image = &*self.image; "unlinked inodes left on the orphan list for the next mount: {e:?}");
        }
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _serving = self.workers.serving(req.pid());
        let ttl = match self.enter_dir(req, "lookup", parent.0, MAY_EXEC) {
            Ok(ttl) => ttl,
            Err(e) => return reply.error(e),
        };
        match self.call("lookup", |fs| fs.lookup(parent.0, name.as_bytes())) {
            Err(Errno::ENOENT) if !ttl.is_zero() => {
                reply.entry_with_ttls(&Duration::ZERO, &ttl, &negative_attr(), Generation(0))
            }
            res => self.reply_entry(reply, ttl, res),
        }
    }

    /// The kernel dropped `nlookup` references (it evicted the inode): the last reference to
    /// an unlinked inode frees it.
    fn forget(&self, req: &Request, ino: INodeNo, nlookup: u64) {
        let _serving = self.workers.serving(req.pid());
        self.forget_one(ino.0, nlookup);
    }

    /// Several FORGETs in one request, served under one `serving`: fuser's default calls
    /// `forget` per node, and an extra worker that parks as the first one's ends would leave
    /// the rest held (unlinked files never freed) until a recount woke it or the unmount.
    fn batch_forget(&self, req: &Request, nodes: &[ForgetOne]) {
        let _serving = self.workers.serving(req.pid());
        for node in nodes {
            self.forget_one(node.nodeid().0, node.nlookup());
        }
    }

    fn getattr(&self, req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let _serving = self.workers.serving(req.pid());
        match self.call("getattr", |fs| fs.getattr(ino.0)) {
            Ok(a) => reply.attr(&self.attr_ttl, &file_attr(&a)),
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        let _serving = self.workers.serving(req.pid());
        let sa = SetAttr {
            mode: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
            ctime: ctime.map(request_time),
        };
        self.set_attr(req, ino.0, sa, fh.is_some(), kill_suidgid, reply);
    }

    fn readlink(&self, req: &Request, ino: INodeNo, reply: ReplyData) {
        let _serving = self.workers.serving(req.pid());
        match self.call("readlink", |fs| fs.readlink(ino.0)) {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, rdev: u32, reply: ReplyEntry) {
        let _serving = self.workers.serving(req.pid());
        self.make_entry(req, "mknod", parent.0, reply, |fs| {
            fs.mknod(parent.0, name.as_bytes(), mode_bits(mode), rdev as u64, creator(req, umask))
        });
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let _serving = self.workers.serving(req.pid());
        self.make_entry(req, "mkdir", parent.0, reply, |fs| {
            fs.mkdir(parent.0, name.as_bytes(), mode_bits(mode & 0o7777), creator(req, umask))
        });
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        let res = self
            .may_remove(req, "unlink", parent.0, name.as_bytes())
            .and_then(|()| self.call("unlink", |fs| fs.unlink(parent.0, name.as_bytes())));
        reply_empty(reply, res);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        let res = self
            .may_remove(req, "rmdir", parent.0, name.as_bytes())
            .and_then(|()| self.call("rmdir", |fs| fs.rmdir(parent.0, name.as_bytes())));
        reply_empty(reply, res);
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let _serving = self.workers.serving(req.pid());
        self.make_entry(req, "symlink", parent.0, reply, |fs| {
            fs.symlink(parent.0, link_name.as_bytes(), target.as_os_str().as_bytes(), cred(req))
        });
    }

    fn rename(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let _serving = self.workers.serving(req.pid());
        let (from, to) = ((parent.0, name.as_bytes()), (newparent.0, newname.as_bytes()));
        let res = self
            .may_rename(req, from, to, flags.bits())
            .and_then(|()| self.call("rename", |fs| fs.rename_as(from.0, from.1, to.0, to.1, flags.bits(), cred(req))));
        reply_empty(reply, res);
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _serving = self.workers.serving(req.pid());
        if self.checks {
            if let Err(e) = self.getattr("link", ino.0).and_then(|a| self.caller(req).may_link(&a)) {
                return reply.error(e);
            }
        }
        self.make_entry(req, "link", newparent.0, reply, |fs| fs.link(ino.0, newparent.0, newname.as_bytes()));
    }

    /// An open is needed for two things only, as the inode lives by the kernel's lookup
    /// count: the permission check when the kernel does not check (no `default_permissions`),
    /// and atime. When neither applies, ENOSYS: the kernel then never sends OPEN (nor RELEASE)
    /// again on this mount and opens with the page cache kept (FOPEN_KEEP_CACHE).
    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _serving = self.workers.serving(req.pid());
        if self.no_open {
            return reply.error(Errno::ENOSYS);
        }
        let a = match self.getattr("open", ino.0) {
            Ok(a) => a,
            Err(e) => return reply.error(e),
        };
        if self.checks {
            if let Err(e) = self.caller(req).may_open(&a, flags.0) {
                return reply.error(e);
            }
        }
        // The kernel is the only writer, so its page cache stays valid across opens. But
        // reads it serves from there never reach the engine, which keeps atime (the kernel
        // keeps none for FUSE): when a read would set it (by relatime, after a change), the
        // cache is dropped so that the next read comes to `read`, and the kernel then asks
        // for atime again (fuse_invalidate_atime). No other hook sees every read: without
        // OPEN, the first read after a change could come from the cache.
        if flags.0 & libc::O_ACCMODE != libc::O_WRONLY && self.fs.atime_update_due(&a) {
            reply.opened(FileHandle(0), FopenFlags::empty())
        } else {
            reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE)
        }
    }

    fn read(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let _serving = self.workers.serving(req.pid());
        match self.call("read", |fs| fs.read(ino.0, offset, size as usize)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let _serving = self.workers.serving(req.pid());
        // The kernel sets the flag when the writer lacks CAP_FSETID.
        let drop = self.privileges_to_drop(write_flags.contains(fuser::WriteFlags::FUSE_WRITE_KILL_SUIDGID));
        match self.call_dropping("write", ino.0, drop, |fs| fs.write(ino.0, offset, data)) {
            // At most max_write (1 MiB) bytes arrive at once, so the count fits.
            Ok(n) => reply.written(n as u32),
            Err(e) => reply.error(e),
        }
    }

    /// Nothing to do at close: writes reach the engine as they are made (with the writeback
    /// cache, the kernel writes its dirty pages back before it would send FLUSH, and still
    /// does without it), and POSIX locks stay the kernel's (`FUSE_POSIX_LOCKS` is not
    /// negotiated). ENOSYS tells the kernel so, and it sends no FLUSH again on this mount:
    /// a close costs one request (RELEASE) instead of two, a fifth of an fs_mark create's.
    fn flush(&self, req: &Request, _ino: INodeNo, _fh: FileHandle, _lock: fuser::LockOwner, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        reply.error(Errno::ENOSYS);
    }

    /// Nothing to do: an open holds nothing (the kernel's lookup count keeps the inode).
    /// Still sent for a file made by CREATE, and for every file while OPEN is answered.
    fn release(
        &self,
        req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let _serving = self.workers.serving(req.pid());
        reply.ok();
    }

    fn fsync(&self, req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        self.sync("fsync", ino.0, datasync, reply);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _serving = self.workers.serving(req.pid());
        // As for `open`: without OPENDIR the kernel also caches listings (FOPEN_CACHE_DIR),
        // which it drops itself on every change it makes in the directory.
        if self.no_opendir {
            return reply.error(Errno::ENOSYS);
        }
        match self.getattr("opendir", ino.0) {
            Ok(a) if self.checks => match self.caller(req).check(&a, MAY_READ) {
                Ok(()) => reply.opened(FileHandle(0), FopenFlags::empty()),
                Err(e) => reply.error(e),
            },
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, reply: ReplyDirectory) {
        let _serving = self.workers.serving(req.pid());
        self.list_dir(ino.0, offset, reply);
    }

    fn readdirplus(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, reply: ReplyDirectoryPlus) {
        let _serving = self.workers.serving(req.pid());
        self.list_dir_plus(ino.0, offset, reply);
    }

    /// As `release`: nothing held.
    fn releasedir(&self, req: &Request, _ino: INodeNo, _fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        reply.ok();
    }

    fn fsyncdir(&self, req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        self.sync("fsyncdir", ino.0, datasync, reply);
    }

    fn statfs(&self, req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let _serving = self.workers.serving(req.pid());
        match self.call("statfs", |fs| Ok(fs.statfs())) {
            Ok(s) => reply.statfs(s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize),
            Err(e) => reply.error(e),
        }
    }

    fn setxattr(
        &self,
        req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let _serving = self.workers.serving(req.pid());
        reply_empty(reply, self.set_xattr(req, ino.0, name.as_bytes(), value, flags));
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _serving = self.workers.serving(req.pid());
        let name = name.as_bytes();
        let res = self.call_xattr(req, "getxattr", ino.0, name, MAY_READ, |fs| fs.getxattr(ino.0, name));
        reply_xattr(reply, size, res);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _serving = self.workers.serving(req.pid());
        reply_xattr(reply, size, self.list_xattr(req, ino.0));
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        let name = name.as_bytes();
        // The kernel removes a file's capabilities itself when anyone writes or chowns it
        // (`cap_inode_killpriv`, as the caller and unchecked), and refuses a removal by
        // anyone without CAP_SETFCAP before it asks: no check of ours may refuse it.
        let mask = if name == b"security.capability" { 0 } else { MAY_WRITE };
        let res = self.call_xattr(req, "removexattr", ino.0, name, mask, |fs| fs.removexattr(ino.0, name));
        reply_empty(reply, res);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        // F_OK: the inode exists, or the kernel would not have asked.
        let res = self.getattr("access", ino.0).and_then(|a| {
            match (mask & (AccessFlags::R_OK | AccessFlags::W_OK | AccessFlags::X_OK)).bits() {
                0 => Ok(()),
                m => self.caller(req).check(&a, m as u32),
            }
        });
        reply_empty(reply, res);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let _serving = self.workers.serving(req.pid());
        // Without OPEN a created file would still cost its RELEASE (the kernel sends one for
        // every handle CREATE returns). ENOSYS makes the kernel create by MKNOD from now on,
        // then open without asking: one request per file instead of two.
        if self.no_open {
            return reply.error(Errno::ENOSYS);
        }
        let ttl = match self.enter_dir(req, "create", parent.0, MAY_WRITE | MAY_EXEC) {
            Ok(ttl) => ttl,
            Err(e) => return reply.error(e),
        };
        let res = self
            .call("create", |fs| {
                match fs.create(parent.0, name.as_bytes(), mode_bits(mode), creator(req, umask)) {
                    Ok(a) => Ok((a, true)),
                    // Without O_EXCL an existing regular file is opened (another creator won).
                    Err(ferrofs::Error::Exists) if flags & libc::O_EXCL == 0 => {
                        match fs.lookup(parent.0, name.as_bytes())? {
                            a if a.kind == ferrofs::FileType::RegularFile => Ok((a, false)),
                            _ => Err(ferrofs::Error::Exists),
                        }
                    }
                    Err(e) => Err(e),
                }
            })
            // A file the caller did not create opens only as its mode allows.
            .and_then(
                |(a, created)| {
                    if created || !self.checks {
                        Ok(a)
                    } else {
                        self.caller(req).may_open(&a, flags).map(|()| a)
                    }
                },
            )
            // The reply is an entry for the kernel: a reference, held before it goes.
            .inspect(|a| self.fs.hold(a.ino));
        reply_created(reply, &ttl, res)
    }

    fn tmpfile(&self, req: &Request, parent: INodeNo, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let _serving = self.workers.serving(req.pid());
        self.open_tmpfile(req, parent.0, mode, umask, flags, reply);
    }

    fn copy_file_range(
        &self,
        req: &Request,
        ino_in: INodeNo,
        _fh_in: FileHandle,
        offset_in: u64,
        ino_out: INodeNo,
        _fh_out: FileHandle,
        offset_out: u64,
        len: u64,
        _flags: fuser::CopyFileRangeFlags,
        reply: ReplyWrite,
    ) {
        let _serving = self.workers.serving(req.pid());
        self.copy_range((ino_in.0, offset_in), (ino_out.0, offset_out), len, self.privileges_dropped_by(req), reply);
    }

    fn fallocate(
        &self,
        req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let _serving = self.workers.serving(req.pid());
        // The kernel has checked the arguments (EINVAL, EFBIG, file type); the engine refuses
        // the modes it does not implement with EOPNOTSUPP. Linux's mode bits are the engine's.
        let drop = self.privileges_dropped_by(req);
        match self.call_dropping("fallocate", ino.0, drop, |fs| fs.fallocate(ino.0, offset, length, mode as u32)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn lseek(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        let _serving = self.workers.serving(req.pid());
        let hole = match whence {
            libc::SEEK_DATA => false,
            libc::SEEK_HOLE => true,
            // The kernel resolves SEEK_SET/CUR/END itself and never sends them.
            _ => return reply.error(Errno::EINVAL),
        };
        let Ok(off) = u64::try_from(offset) else { return reply.error(Errno::ENXIO) };
        // ENXIO (`Error::NoData`) at or past the end or with no data after `off`; EINVAL
        // for a file that is not regular.
        match self.call("lseek", |fs| fs.seek(ino.0, off, hole)) {
            Ok(o) => reply.offset(o as i64),
            Err(e) => reply.error(e),
        }
    }
}

#[cfg(test)]
mod tests;
