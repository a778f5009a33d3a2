//! The FUSE request handlers: each one calls the engine, then replies with what it returned.
//!
//! Inode numbers pass through unchanged (the engine's root is 1 = FUSE_ROOT_ID). File handles
//! carry nothing: the engine keeps one open count per inode, taken by `open`/`opendir`/
//! `create` and dropped by `release`/`releasedir`, so an unlinked file lives until its last
//! close. `forget` is a no-op: the engine keeps its own inode cache.
//!
//! Unless the kernel checks permissions (`default_permissions`), each request is checked
//! against the engine's attributes with [`crate::access`] before the engine changes anything.

mod copy;
mod tmpfile;

use crate::access::{searchable_by_all, Caller, MAY_EXEC, MAY_READ, MAY_WRITE};
use crate::epoch::NameEpoch;
use crate::sync_pool::{SyncPool, SYNC_QUEUE_MAX, SYNC_THREADS};
use crate::workers::Workers;
use crate::{MountConfig, MAX_WRITE};
use ferrofs::Timespec;
use ferrofs::{Attr, Cred, DirEntry, FileSystem, SetAttr};
use fuser::{
    AccessFlags, Errno, FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, InitFlags, KernelConfig, Notifier, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyLseek, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow,
};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Directory entries fetched from the engine per call while filling one readdir reply.
const READDIR_BATCH: usize = 256;

/// Directory entries read under the directory's lock, each name a range of the second part.
type DirBatch = (Vec<DirEntry<Range<usize>>>, Vec<u8>);

pub struct FerroFuse {
    fs: Arc<FileSystem>,
    /// The image served, which every logged line names (one daemon may serve several).
    image: Arc<str>,
    entry_ttl: Duration,
    attr_ttl: Duration,
    writeback_cache: bool,
    /// Check permissions here: the kernel does not (no `default_permissions`).
    checks: bool,
    /// Set once the session exists: drops names the kernel may no longer cache.
    notifier: Arc<OnceLock<Notifier>>,
    /// Expires every cached name at once, where the kernel can.
    name_epoch: Arc<NameEpoch>,
    /// Runs fsync and fsyncdir, which wait on the device, off the workers.
    syncs: SyncPool,
    /// How many workers read `/dev/fuse`, and where they run.
    workers: Arc<Workers>,
}

type Res<T> = std::result::Result<T, Errno>;

impl FerroFuse {
    pub fn new(fs: Arc<FileSystem>, opts: &MountConfig) -> std::io::Result<FerroFuse> {
        Ok(FerroFuse {
            fs,
            image: opts.image.display().to_string().into(),
            entry_ttl: opts.entry_timeout,
            attr_ttl: opts.attr_timeout,
            writeback_cache: opts.writeback_cache,
            checks: !opts.default_permissions,
            notifier: Arc::new(OnceLock::new()),
            name_epoch: Arc::default(),
            syncs: SyncPool::start(SYNC_THREADS, SYNC_QUEUE_MAX)?,
            workers: Arc::new(Workers::new(opts.thread_count())),
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

    fn reply_entry(&self, reply: ReplyEntry, entry_ttl: Duration, res: Res<Attr>) {
        match res {
            Ok(a) => reply.entry_with_ttls(&self.attr_ttl, &entry_ttl, &file_attr(&a), Generation(a.generation as u64)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, op: &'static str, ino: u64) -> Res<Attr> {
        self.call(op, |fs| fs.getattr(ino))
    }

    /// How long the kernel may cache names in a directory of this mode. Path walks through
    /// cached names reach no server, so where some class may not search the directory every
    /// walk must come back here (a LOOKUP as the walking process) to be checked.
    fn entry_ttl_in(&self, dir: &Attr) -> Duration {
        if self.checks && !searchable_by_all(dir.perm) {
            Duration::ZERO
        } else {
            self.entry_ttl
        }
    }

    /// Check `mask` on directory `dir` for the caller (when the adapter checks); the entry
    /// timeout for names in it.
    fn enter_dir(&self, req: &Request, op: &'static str, dir: u64, mask: u32) -> Res<Duration> {
        if !self.checks {
            return Ok(self.entry_ttl);
        }
        let d = self.getattr(op, dir)?;
        caller(req).check(&d, mask)?;
        Ok(self.entry_ttl_in(&d))
    }

    /// A new name in `dir` (mknod, mkdir, symlink, link): write and search on it first.
    fn make_entry(&self, req: &Request, op: &'static str, dir: u64, reply: ReplyEntry, make: impl FnOnce(&FileSystem) -> ferrofs::Result<Attr>) {
        match self.enter_dir(req, op, dir, MAY_WRITE | MAY_EXEC) {
            Ok(ttl) => {
                let res = self.call(op, make);
                self.reply_entry(reply, ttl, res);
            }
            Err(e) => reply.error(e),
        }
    }

    /// `may_delete` for unlink and rmdir: write and search on the directory, and the sticky
    /// rule.
    fn may_remove(&self, req: &Request, op: &'static str, dir: u64, name: &[u8]) -> Res<()> {
        if !self.checks {
            return Ok(());
        }
        let c = caller(req);
        let d = self.getattr(op, dir)?;
        c.may_create(&d)?;
        if d.perm & libc::S_ISVTX as u16 != 0 {
            let victim = self.call(op, |fs| fs.lookup(dir, name))?;
            c.may_delete_from_sticky(&d, &victim)?;
        }
        Ok(())
    }

    /// `vfs_rename`'s checks: write and search on both directories, the sticky rule for the
    /// source and a replaced or exchanged target, and write on a directory that moves to
    /// another parent (its ".." changes).
    fn may_rename(&self, req: &Request, from: (u64, &[u8]), to: (u64, &[u8]), flags: u32) -> Res<()> {
        if !self.checks {
            return Ok(());
        }
        let c = caller(req);
        let sticky = |d: &Attr| d.perm & libc::S_ISVTX as u16 != 0;
        let exchange = flags & libc::RENAME_EXCHANGE != 0;
        let moves = from.0 != to.0;
        let from_dir = self.getattr("rename", from.0)?;
        c.may_create(&from_dir)?;
        let to_dir = if moves { self.getattr("rename", to.0)? } else { from_dir.clone() };
        if moves {
            c.may_create(&to_dir)?;
        }
        if sticky(&from_dir) || moves {
            let source = self.call("rename", |fs| fs.lookup(from.0, from.1))?;
            if sticky(&from_dir) {
                c.may_delete_from_sticky(&from_dir, &source)?;
            }
            if moves && source.kind == ferrofs::FileType::Directory {
                c.check(&source, MAY_WRITE)?;
            }
        }
        if sticky(&to_dir) || (moves && exchange) {
            let target = match self.call("rename", |fs| fs.lookup(to.0, to.1)) {
                Ok(t) => t,
                Err(Errno::ENOENT) => return Ok(()),
                Err(e) => return Err(e),
            };
            if sticky(&to_dir) {
                c.may_delete_from_sticky(&to_dir, &target)?;
            }
            if moves && exchange && target.kind == ferrofs::FileType::Directory {
                c.check(&target, MAY_WRITE)?;
            }
        }
        Ok(())
    }

    /// Check an xattr request on `ino` (when the adapter checks).
    fn may_xattr(&self, req: &Request, op: &'static str, ino: u64, name: &[u8], mask: u32) -> Res<()> {
        if !self.checks {
            return Ok(());
        }
        caller(req).may_xattr(&self.getattr(op, ino)?, name, mask)
    }

    /// The names the kernel may have cached in `dir` (with the long timeout of a directory
    /// everyone could search), listed before the reply so that the invalidations after it
    /// (`forget_names`) follow it as closely as they can.
    fn names_in(&self, dir: u64) -> Vec<Vec<u8>> {
        let mut names = Vec::new();
        let res = self.fill_dir(dir, 0, |e| {
            if e.name != b"." && e.name != b".." {
                names.push(e.name.to_vec());
            }
            false
        });
        if let Err(e) = res {
            log::error!(image = &*self.image; "cannot list directory {dir} to drop its cached names: {e:?}");
        }
        names
    }

    /// Make the kernel forget `names` in `dir`, so the next walk through each is checked.
    /// Call only after replying: the kernel holds the directory's lock until the reply, and
    /// the invalidation waits for that lock.
    fn forget_names(&self, dir: u64, names: Vec<Vec<u8>>) {
        let Some(notifier) = self.notifier.get() else { return };
        for name in names {
            // ENOENT: the kernel had not cached that name.
            let _ = notifier.inval_entry(INodeNo(dir), OsStr::from_bytes(&name));
        }
    }

    /// Up to `READDIR_BATCH` entries after `cookie`, their names in one buffer (each entry's
    /// `name` is its range there): one allocation per batch, where a name each was 2% of the
    /// daemon's CPU in a 400,000-file parallel `rm -rf`.
    fn readdir_batch(&self, ino: u64, cookie: u64) -> Res<DirBatch> {
        self.call("readdir", |fs| {
            let (mut v, mut names) = (Vec::with_capacity(READDIR_BATCH), Vec::new());
            fs.readdir(ino, cookie, &mut |e| {
                v.push(e.with_name(names.len()..names.len() + e.name.len()));
                names.extend_from_slice(e.name);
                v.len() < READDIR_BATCH
            })?;
            Ok((v, names))
        })
    }

    /// Feed directory entries after `cookie` to `add` (which returns true once the reply is
    /// full) a batch at a time. The engine's lock on the directory is held only while a batch
    /// is read, never while `add` runs. Returns whether anything was added, or the error if
    /// the first batch failed.
    fn fill_dir(&self, ino: u64, mut cookie: u64, mut add: impl FnMut(DirEntry<&[u8]>) -> bool) -> Res<()> {
        let mut added = false;
        loop {
            let (batch, names) = match self.readdir_batch(ino, cookie) {
                Ok(b) => b,
                Err(e) if !added => return Err(e),
                // Part of the listing is already in the reply: hand that out; the next
                // readdir from the last cookie reports the error.
                Err(_) => return Ok(()),
            };
            let n = batch.len();
            for e in batch {
                let c = e.cookie;
                if add(e.with_name(&names[e.name.clone()])) {
                    return Ok(());
                }
                added = true;
                cookie = c;
            }
            if n < READDIR_BATCH {
                return Ok(());
            }
        }
    }
}

fn cred(req: &Request) -> Cred {
    Cred { uid: req.uid(), gid: req.gid() }
}

fn caller(req: &Request) -> Caller {
    Caller::new(req.uid(), req.gid(), req.pid())
}

/// Call the engine. An error becomes its errno; a panic (an engine bug) is contained:
/// the engine is shut down — no further changes, so nothing half-done reaches the disk —
/// and the request fails with EIO. The calling thread lives on.
fn call_engine<T>(fs: &FileSystem, image: &str, op: &'static str, f: impl FnOnce(&FileSystem) -> ferrofs::Result<T>) -> Res<T> {
    match catch_unwind(AssertUnwindSafe(|| f(fs))) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => {
            if matches!(e, ferrofs::Error::Io(_) | ferrofs::Error::Corrupt { .. }) {
                log::error!(image; "{op}: {e}");
            }
            Err(Errno::from_i32(e.errno()))
        }
        Err(panic) => {
            let msg = panic.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| panic.downcast_ref::<String>().cloned()).unwrap_or_default();
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

/// The permission bits of a new inode: the caller's umask applied. Without FUSE_DONT_MASK
/// the kernel has already applied it; applying it again changes nothing.
fn masked(mode: u32, umask: u32) -> u16 {
    ((mode & libc::S_IFMT) | (mode & 0o7777 & !umask)) as u16
}

fn system_time(t: Timespec) -> SystemTime {
    let nsec = Duration::from_nanos(t.nsec.min(999_999_999) as u64);
    let at = if t.sec >= 0 { UNIX_EPOCH.checked_add(Duration::from_secs(t.sec as u64)) } else { UNIX_EPOCH.checked_sub(Duration::from_secs(t.sec.unsigned_abs())) };
    at.and_then(|a| a.checked_add(nsec)).unwrap_or(UNIX_EPOCH)
}

fn timespec(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => Timespec { sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() },
        Err(e) => {
            let d = e.duration();
            let sec = -i64::try_from(d.as_secs()).unwrap_or(i64::MAX);
            match d.subsec_nanos() {
                0 => Timespec { sec, nsec: 0 },
                n => Timespec { sec: sec.saturating_sub(1), nsec: 1_000_000_000 - n },
            }
        }
    }
}

/// A time from a request. fuser 0.18 decodes the kernel's (sec, nsec) before 1970 as
/// `UNIX_EPOCH - Duration::new(-sec, nsec)`, i.e. with the nanoseconds pointing the wrong way
/// (`utimensat` to -86400 s + 999999999 ns would land on -86401 s + 1 ns). That encoding is
/// one-to-one, so undo it exactly: `sec = -whole seconds`, `nsec = the fraction`.
fn request_time(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(_) => timespec(t),
        Err(e) => {
            let d = e.duration();
            Timespec { sec: -i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() }
        }
    }
}

fn time_or_now(t: TimeOrNow) -> ferrofs::TimeOrNow {
    match t {
        TimeOrNow::SpecificTime(t) => ferrofs::TimeOrNow::Time(request_time(t)),
        TimeOrNow::Now => ferrofs::TimeOrNow::Now,
    }
}

fn file_type(k: ferrofs::FileType) -> FileType {
    match k {
        ferrofs::FileType::RegularFile => FileType::RegularFile,
        ferrofs::FileType::Directory => FileType::Directory,
        ferrofs::FileType::Symlink => FileType::Symlink,
        ferrofs::FileType::CharDevice => FileType::CharDevice,
        ferrofs::FileType::BlockDevice => FileType::BlockDevice,
        ferrofs::FileType::NamedPipe => FileType::NamedPipe,
        ferrofs::FileType::Socket => FileType::Socket,
    }
}

pub(crate) fn file_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: system_time(a.atime),
        mtime: system_time(a.mtime),
        ctime: system_time(a.ctime),
        crtime: system_time(a.btime),
        kind: file_type(a.kind),
        perm: a.perm,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        // The kernel's new_encode_dev() form fits 32 bits for every major/minor it makes.
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

/// A negative entry: node id 0, cached by the kernel for the entry timeout.
fn negative_attr() -> FileAttr {
    FileAttr {
        ino: INodeNo(0),
        size: 0,
        blocks: 0,
        atime: UNIX_EPOCH,
        mtime: UNIX_EPOCH,
        ctime: UNIX_EPOCH,
        crtime: UNIX_EPOCH,
        kind: FileType::RegularFile,
        perm: 0,
        nlink: 0,
        uid: 0,
        gid: 0,
        rdev: 0,
        blksize: 0,
        flags: 0,
    }
}

/// The xattr namespaces ferrofs stores. The kernel hands a FUSE server every name, whatever
/// its prefix (it checks trusted.* privileges and user.* file types itself); a name outside
/// these is EOPNOTSUPP and a bare prefix EINVAL, as on Linux's local file systems. Without
/// this check any string became a stored name ("system.foo", "bogus.x").
fn check_xattr_name(name: &[u8]) -> Res<()> {
    for prefix in [&b"user."[..], b"trusted.", b"security."] {
        if name.starts_with(prefix) {
            return if name.len() > prefix.len() { Ok(()) } else { Err(Errno::EINVAL) };
        }
    }
    Err(Errno::EOPNOTSUPP)
}

/// Reply to a getxattr/listxattr: size 0 asks for the length, a short buffer is ERANGE.
fn reply_xattr(reply: ReplyXattr, size: u32, data: Res<Vec<u8>>) {
    match data {
        Err(e) => reply.error(e),
        Ok(d) if size == 0 => match u32::try_from(d.len()) {
            Ok(n) => reply.size(n),
            Err(_) => reply.error(Errno::E2BIG),
        },
        Ok(d) if d.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(d) => reply.data(&d),
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
        // Ask only for what this kernel offers; the rest silently stays off.
        let _ = config.add_capabilities(want & config.capabilities());
        if self.writeback_cache && !config.capabilities().contains(InitFlags::FUSE_WRITEBACK_CACHE) {
            log::warn!(image = &*self.image; "the kernel offers no writeback cache; mounting without it");
        }
        let _ = config.set_max_write(MAX_WRITE);
        let _ = config.set_max_readahead(MAX_WRITE).or_else(|max| config.set_max_readahead(max));
        // Room for the async reads and writeback the kernel may keep in flight.
        let _ = config.set_max_background(64);
        Ok(())
    }

    fn lookup(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let _serving = self.workers.serving(req.pid());
        let ttl = match self.enter_dir(req, "lookup", parent.0, MAY_EXEC) {
            Ok(ttl) => ttl,
            Err(e) => return reply.error(e),
        };
        match self.call("lookup", |fs| fs.lookup(parent.0, name.as_bytes())) {
            Err(Errno::ENOENT) if !ttl.is_zero() => reply.entry_with_ttls(&Duration::ZERO, &ttl, &negative_attr(), Generation(0)),
            res => self.reply_entry(reply, ttl, res),
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
        reply: ReplyAttr,
    ) {
        let _serving = self.workers.serving(req.pid());
        let mut sa = SetAttr {
            mode: mode.map(|m| (m & 0o7777) as u16),
            uid,
            gid,
            size,
            atime: atime.map(time_or_now),
            mtime: mtime.map(time_or_now),
            ctime: ctime.map(request_time),
        };
        let before = match self.checks.then(|| self.getattr("setattr", ino.0)).transpose() {
            Ok(b) => b,
            Err(e) => return reply.error(e),
        };
        if let Some(b) = &before {
            if let Err(e) = caller(req).may_setattr(b, &mut sa, fh.is_some()) {
                return reply.error(e);
            }
        }
        match self.call("setattr", |fs| fs.setattr(ino.0, &sa)) {
            Ok(a) => {
                // Names cached with the long timeout while everyone could search here: expired
                // before the reply where the kernel can, so none is walked through once the
                // chmod has returned; else invalidated one by one after it.
                let cached = before.is_some_and(|b| b.kind == ferrofs::FileType::Directory && searchable_by_all(b.perm) && !searchable_by_all(a.perm));
                let names = if cached && !self.name_epoch.expire_all_names() { self.names_in(ino.0) } else { Vec::new() };
                reply.attr(&self.attr_ttl, &file_attr(&a));
                self.forget_names(ino.0, names);
            }
            Err(e) => reply.error(e),
        }
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
        self.make_entry(req, "mknod", parent.0, reply, |fs| fs.mknod(parent.0, name.as_bytes(), masked(mode, umask), rdev as u64, cred(req)));
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let _serving = self.workers.serving(req.pid());
        self.make_entry(req, "mkdir", parent.0, reply, |fs| fs.mkdir(parent.0, name.as_bytes(), masked(mode & 0o7777, umask), cred(req)));
    }

    fn unlink(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        let res = self.may_remove(req, "unlink", parent.0, name.as_bytes()).and_then(|()| self.call("unlink", |fs| fs.unlink(parent.0, name.as_bytes())));
        reply_empty(reply, res);
    }

    fn rmdir(&self, req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        let res = self.may_remove(req, "rmdir", parent.0, name.as_bytes()).and_then(|()| self.call("rmdir", |fs| fs.rmdir(parent.0, name.as_bytes())));
        reply_empty(reply, res);
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let _serving = self.workers.serving(req.pid());
        self.make_entry(req, "symlink", parent.0, reply, |fs| fs.symlink(parent.0, link_name.as_bytes(), target.as_os_str().as_bytes(), cred(req)));
    }

    fn rename(&self, req: &Request, parent: INodeNo, name: &OsStr, newparent: INodeNo, newname: &OsStr, flags: RenameFlags, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        let (from, to) = ((parent.0, name.as_bytes()), (newparent.0, newname.as_bytes()));
        let res = self.may_rename(req, from, to, flags.bits()).and_then(|()| self.call("rename", |fs| fs.rename_as(from.0, from.1, to.0, to.1, flags.bits(), cred(req))));
        reply_empty(reply, res);
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let _serving = self.workers.serving(req.pid());
        if self.checks {
            if let Err(e) = self.getattr("link", ino.0).and_then(|a| caller(req).may_link(&a)) {
                return reply.error(e);
            }
        }
        self.make_entry(req, "link", newparent.0, reply, |fs| fs.link(ino.0, newparent.0, newname.as_bytes()));
    }

    fn open(&self, req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let _serving = self.workers.serving(req.pid());
        if self.checks {
            if let Err(e) = self.getattr("open", ino.0).and_then(|a| caller(req).may_open(&a, flags.0)) {
                return reply.error(e);
            }
        }
        // The kernel is the only writer, so its page cache stays valid across opens. But
        // reads it serves from there never reach the engine, which keeps atime (the kernel
        // keeps none for FUSE): when a read would set it (by relatime, after a change), the
        // cache is dropped so that the next read comes to `read`, and the kernel then asks
        // for atime again (fuse_invalidate_atime).
        match self.call("open", |fs| fs.open(ino.0)) {
            Ok(a) if flags.0 & libc::O_ACCMODE != libc::O_WRONLY && self.fs.atime_update_due(&a) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn read(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, size: u32, _flags: OpenFlags, _lock: Option<fuser::LockOwner>, reply: ReplyData) {
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
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let _serving = self.workers.serving(req.pid());
        match self.call("write", |fs| fs.write(ino.0, offset, data)) {
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

    fn release(&self, req: &Request, ino: INodeNo, _fh: FileHandle, _flags: OpenFlags, _lock: Option<fuser::LockOwner>, _flush: bool, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        match self.call("release", |fs| fs.release(ino.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn fsync(&self, req: &Request, ino: INodeNo, _fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        self.sync("fsync", ino.0, datasync, reply);
    }

    fn opendir(&self, req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let _serving = self.workers.serving(req.pid());
        if self.checks {
            if let Err(e) = self.getattr("opendir", ino.0).and_then(|a| caller(req).check(&a, MAY_READ)) {
                return reply.error(e);
            }
        }
        match self.call("opendir", |fs| fs.open(ino.0)) {
            Ok(_) => reply.opened(FileHandle(0), FopenFlags::empty()),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let _serving = self.workers.serving(req.pid());
        let res = self.fill_dir(ino.0, offset, |e| reply.add(INodeNo(e.ino), e.cookie, file_type(e.kind), OsStr::from_bytes(e.name)));
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdirplus(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectoryPlus) {
        let _serving = self.workers.serving(req.pid());
        // Opening the directory was the check; the mode decides how long names may be cached.
        let ttl = match self.checks.then(|| self.getattr("readdirplus", ino.0)).transpose() {
            Ok(dir) => dir.map_or(self.entry_ttl, |d| self.entry_ttl_in(&d)),
            Err(e) => return reply.error(e),
        };
        let res = self.fill_dir(ino.0, offset, |e| {
            // Attributes are read after the batch, without the directory's lock. An entry
            // removed meanwhile is left out, as if the listing had been taken a moment later.
            match self.call("readdirplus", |fs| fs.getattr(e.ino)) {
                Ok(a) => reply.add(INodeNo(e.ino), e.cookie, OsStr::from_bytes(e.name), &ttl, &file_attr(&a), Generation(a.generation as u64)),
                Err(_) => false,
            }
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn releasedir(&self, req: &Request, ino: INodeNo, _fh: FileHandle, _flags: OpenFlags, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        match self.call("releasedir", |fs| fs.release(ino.0)) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
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

    fn setxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, value: &[u8], flags: i32, _position: u32, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        let name = name.as_bytes();
        let res = check_xattr_name(name)
            .and_then(|()| self.may_xattr(req, "setxattr", ino.0, name, MAY_WRITE))
            .and_then(|()| self.call("setxattr", |fs| fs.setxattr(ino.0, name, value, flags as u32)));
        reply_empty(reply, res);
    }

    fn getxattr(&self, req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let _serving = self.workers.serving(req.pid());
        let name = name.as_bytes();
        let res = check_xattr_name(name).and_then(|()| self.may_xattr(req, "getxattr", ino.0, name, MAY_READ)).and_then(|()| self.call("getxattr", |fs| fs.getxattr(ino.0, name)));
        reply_xattr(reply, size, res);
    }

    fn listxattr(&self, req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let _serving = self.workers.serving(req.pid());
        // trusted.* names are listed to the privileged only, as local file systems list them
        // to CAP_SYS_ADMIN (uid 0 stands for it; the kernel's FUSE client filters nothing).
        let privileged = req.uid() == 0;
        let names = self.call("listxattr", |fs| fs.listxattr(ino.0)).map(|names| {
            names.into_iter().filter(|n| privileged || !n.starts_with(b"trusted.")).flat_map(|mut n| {
                n.push(0);
                n
            })
            .collect::<Vec<u8>>()
        });
        reply_xattr(reply, size, names);
    }

    fn removexattr(&self, req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        let name = name.as_bytes();
        let res = check_xattr_name(name)
            .and_then(|()| self.may_xattr(req, "removexattr", ino.0, name, MAY_WRITE))
            .and_then(|()| self.call("removexattr", |fs| fs.removexattr(ino.0, name)));
        reply_empty(reply, res);
    }

    fn access(&self, req: &Request, ino: INodeNo, mask: AccessFlags, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        // F_OK: the inode exists, or the kernel would not have asked.
        let res = self.getattr("access", ino.0).and_then(|a| match (mask & (AccessFlags::R_OK | AccessFlags::W_OK | AccessFlags::X_OK)).bits() {
            0 => Ok(()),
            m => caller(req).check(&a, m as u32),
        });
        reply_empty(reply, res);
    }

    fn create(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let _serving = self.workers.serving(req.pid());
        let ttl = match self.enter_dir(req, "create", parent.0, MAY_WRITE | MAY_EXEC) {
            Ok(ttl) => ttl,
            Err(e) => return reply.error(e),
        };
        let res = self
            .call("create", |fs| match fs.create(parent.0, name.as_bytes(), masked(mode, umask), cred(req)) {
                Ok(a) => Ok((a, true)),
                // Without O_EXCL an existing regular file is opened (another creator won).
                Err(ferrofs::Error::Exists) if flags & libc::O_EXCL == 0 => match fs.lookup(parent.0, name.as_bytes())? {
                    a if a.kind == ferrofs::FileType::RegularFile => Ok((a, false)),
                    _ => Err(ferrofs::Error::Exists),
                },
                Err(e) => Err(e),
            })
            // A file the caller did not create opens only as its mode allows.
            .and_then(|(a, created)| if created || !self.checks { Ok(a) } else { caller(req).may_open(&a, flags).map(|()| a) })
            .and_then(|a| self.call("create", |fs| fs.open(a.ino)));
        match res {
            Ok(a) => reply.created(&ttl, &file_attr(&a), Generation(a.generation as u64), FileHandle(0), FopenFlags::FOPEN_KEEP_CACHE),
            Err(e) => reply.error(e),
        }
    }

    fn tmpfile(&self, req: &Request, parent: INodeNo, mode: u32, umask: u32, flags: i32, reply: ReplyCreate) {
        let _serving = self.workers.serving(req.pid());
        self.open_tmpfile(req, parent.0, masked(mode, umask), flags, reply);
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
        self.copy_range((ino_in.0, offset_in), (ino_out.0, offset_out), len, reply);
    }

    fn fallocate(&self, req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        let _serving = self.workers.serving(req.pid());
        // The kernel has checked the arguments (EINVAL, EFBIG, file type); the engine refuses
        // the modes it does not implement with EOPNOTSUPP. Linux's mode bits are the engine's.
        match self.call("fallocate", |fs| fs.fallocate(ino.0, offset, length, mode as u32)) {
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
mod tests {
    use super::*;
    use ferrofs::dev::MemDevice;
    use ferrofs::{MkfsOptions, MountOptions};

    fn adapter() -> FerroFuse {
        let dev = Arc::new(MemDevice::new(64 << 20));
        FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
        let fs = FileSystem::mount_device(dev, &MountOptions::default()).unwrap();
        FerroFuse::new(Arc::new(fs), &MountConfig::new("image", "mnt")).unwrap()
    }

    #[test]
    fn engine_errors_become_errnos() {
        let a = adapter();
        assert_eq!(a.call("lookup", |fs| fs.lookup(1, b"missing")).unwrap_err(), Errno::ENOENT);
        assert_eq!(a.call("lookup", |fs| fs.lookup(1, &[b'n'; 256])).unwrap_err(), Errno::ENAMETOOLONG);
        assert_eq!(a.call("getattr", |fs| fs.getattr(999_999)).unwrap_err(), Errno::ESTALE);
    }

    #[test]
    fn a_panicking_engine_call_fails_with_eio_and_stops_changes() {
        let a = adapter();
        let res: Res<()> = a.call("test", |_| panic!("engine bug"));
        assert_eq!(res.unwrap_err(), Errno::EIO);
        // Reads still work; changes are refused from now on.
        assert!(a.call("getattr", |fs| fs.getattr(1)).is_ok());
        assert_eq!(a.call("mkdir", |fs| fs.mkdir(1, b"d", 0o755, Cred::default())).unwrap_err(), Errno::EIO);
    }

    #[test]
    fn times_round_trip_including_before_1970() {
        for t in [Timespec { sec: 0, nsec: 0 }, Timespec { sec: 1_700_000_000, nsec: 999_999_999 }, Timespec { sec: -1, nsec: 500_000_000 }, Timespec { sec: -86_400, nsec: 0 }] {
            assert_eq!(timespec(system_time(t)), t);
        }
        // Out of range for SystemTime: clamped, not a panic.
        let _ = system_time(Timespec { sec: i64::MAX, nsec: u32::MAX });
        let _ = system_time(Timespec { sec: i64::MIN, nsec: 0 });
    }

    #[test]
    fn request_times_before_1970_keep_their_nanoseconds() {
        // What fuser 0.18 hands us for the kernel's (sec, nsec): see `request_time`.
        let fuser_decoded = |sec: i64, nsec: u32| {
            if sec >= 0 {
                UNIX_EPOCH + Duration::new(sec as u64, nsec)
            } else {
                UNIX_EPOCH - Duration::new(sec.unsigned_abs(), nsec)
            }
        };
        for (sec, nsec) in [(-86_400i64, 999_999_999u32), (-1, 1), (-1, 0), (-5, 500_000_000), (0, 7), (1_700_000_000, 123)] {
            assert_eq!(request_time(fuser_decoded(sec, nsec)), Timespec { sec, nsec });
        }
    }

    #[test]
    fn umask_applies_to_permission_bits_only() {
        assert_eq!(masked(libc::S_IFREG | 0o666, 0o022), (libc::S_IFREG | 0o644) as u16);
        assert_eq!(masked(libc::S_IFCHR | 0o4777, 0o077), (libc::S_IFCHR | 0o4700) as u16);
        assert_eq!(masked(0o2777, 0o002), 0o2775);
    }
}
