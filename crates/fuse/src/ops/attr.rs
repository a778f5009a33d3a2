//! Attributes from the engine's types to fuser's and back: times, file types, `FileAttr`.

use super::{FerroFuse, Res};
use crate::access::searchable_by_all;
use ferrofs::{Attr, SetAttr, Timespec};
use fuser::{
    FileAttr, FileHandle, FileType, FopenFlags, Generation, INodeNo, ReplyAttr, ReplyCreate, Request, TimeOrNow,
};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

impl FerroFuse {
    /// setattr (chmod, chown, truncate, utimens): checked against the attributes before the
    /// change (when the adapter checks), which may also drop set-id bits from `sa`.
    /// `kill_suidgid`: the kernel asks us to drop the set-id bits (a chown, or a truncate by a
    /// caller without CAP_FSETID); a truncate or chown drops the capabilities whatever it says.
    pub(super) fn set_attr(
        &self,
        req: &Request,
        ino: u64,
        mut sa: SetAttr,
        has_handle: bool,
        kill_suidgid: bool,
        reply: ReplyAttr,
    ) {
        let before = match self.checks.then(|| self.getattr("setattr", ino)).transpose() {
            Ok(b) => b,
            Err(e) => return reply.error(e),
        };
        if let Some(b) = &before {
            if let Err(e) = self.caller(req).may_setattr(b, &mut sa, has_handle) {
                return reply.error(e);
            }
        }
        let drop = self.privileges_to_drop(kill_suidgid).filter(|_| changes_content_or_owner(&sa));
        match self.call_dropping("setattr", ino, drop, |fs| fs.setattr(ino, &sa)) {
            Ok(a) => {
                // Names cached with the long timeout while everyone could search here: expired
                // before the reply where the kernel can, so none is walked through once the
                // chmod has returned; else invalidated one by one after it.
                let cached = before.is_some_and(|b| {
                    b.kind == ferrofs::FileType::Directory && searchable_by_all(b.perm) && !searchable_by_all(a.perm)
                });
                let names = if cached && !self.name_epoch.expire_all_names() { self.names_in(ino) } else { Vec::new() };
                reply.attr(&self.attr_ttl, &file_attr(&a));
                self.forget_names(ino, names);
            }
            Err(e) => reply.error(e),
        }
    }
}

/// Whether a setattr truncates (`truncate`, `O_TRUNC`) or gives the file away (`chown`):
/// the changes that drop its privileges.
fn changes_content_or_owner(sa: &SetAttr) -> bool {
    sa.size.is_some() || sa.uid.is_some() || sa.gid.is_some()
}

pub(super) fn system_time(t: Timespec) -> SystemTime {
    let nsec = Duration::from_nanos(t.nsec.min(999_999_999) as u64);
    let at = if t.sec >= 0 {
        UNIX_EPOCH.checked_add(Duration::from_secs(t.sec as u64))
    } else {
        UNIX_EPOCH.checked_sub(Duration::from_secs(t.sec.unsigned_abs()))
    };
    at.and_then(|a| a.checked_add(nsec)).unwrap_or(UNIX_EPOCH)
}

pub(super) fn timespec(t: SystemTime) -> Timespec {
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
pub(super) fn request_time(t: SystemTime) -> Timespec {
    match t.duration_since(UNIX_EPOCH) {
        Ok(_) => timespec(t),
        Err(e) => {
            let d = e.duration();
            Timespec { sec: -i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() }
        }
    }
}

pub(super) fn time_or_now(t: TimeOrNow) -> ferrofs::TimeOrNow {
    match t {
        TimeOrNow::SpecificTime(t) => ferrofs::TimeOrNow::Time(request_time(t)),
        TimeOrNow::Now => ferrofs::TimeOrNow::Now,
    }
}

pub(super) fn file_type(k: ferrofs::FileType) -> FileType {
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

/// Answer a CREATE or TMPFILE: the new file, open once (handles are not tracked, so 0), its
/// cached pages kept across opens.
pub(super) fn reply_created(reply: ReplyCreate, ttl: &Duration, created: Res<Attr>) {
    match created {
        Ok(a) => reply.created(
            ttl,
            &file_attr(&a),
            Generation(a.generation as u64),
            FileHandle(0),
            FopenFlags::FOPEN_KEEP_CACHE,
        ),
        Err(e) => reply.error(e),
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
pub(super) fn negative_attr() -> FileAttr {
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
