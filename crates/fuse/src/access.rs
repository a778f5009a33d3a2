//! Permission checks of the adapter: the kernel's own rules (`generic_permission`,
//! `may_delete`, `may_create`, `setattr_prepare`, `xattr_permission`, `may_linkat`), applied to
//! the attributes the engine holds and the caller a request names.
//!
//! Used unless the mount asks the kernel to check (`default_permissions`); see "Permissions"
//! in the crate docs for why. Simplifications, each documented there too:
//! - uid 0 is privileged (CAP_DAC_OVERRIDE, CAP_FOWNER, CAP_CHOWN, CAP_FSETID, CAP_SYS_ADMIN)
//!   and no other uid is: FUSE tells us the caller's ids, not its capabilities;
//! - `fs.protected_hardlinks` is taken as 1 (the default of every distribution);
//! - no immutable or append-only flags (ferrofs stores none).
//!
//! POSIX ACLs are the kernel's `acl_permission_check`: the owner by the mode's owner bits,
//! anyone else by the access ACL (`posix_acl_permission`, [`ferrofs::Acl::permits`]) when
//! the inode has one and its group class grants anything, else by the mode.

use ferrofs::{Attr, FileSystem, FileType, SetAttr, TimeOrNow};
use fuser::Errno;
use std::cell::OnceCell;

/// `MAY_READ`, `MAY_WRITE`, `MAY_EXEC`: the kernel's (and access(2)'s `R_OK`, `W_OK`, `X_OK`)
/// values, which are also the bit positions of one permission class in a mode.
pub const MAY_READ: u32 = 4;
pub const MAY_WRITE: u32 = 2;
pub const MAY_EXEC: u32 = 1;

/// The open flag the kernel adds when it opens a file to execute it (`__FMODE_EXEC`).
const FMODE_EXEC: i32 = 0x20;

const S_ISUID: u16 = 0o4000;
const S_ISGID: u16 = 0o2000;
const S_ISVTX: u16 = 0o1000;

/// Who is asking: the ids the kernel put in the request, and the pid whose supplementary
/// groups are read from /proc only if an answer depends on them.
pub struct Caller<'a> {
    pub uid: u32,
    pub gid: u32,
    pid: u32,
    groups: OnceCell<Vec<u32>>,
    /// Where the access ACLs of the inodes asked about are read: None when the mount
    /// ignores ACLs (`noacl`).
    acls: Option<&'a FileSystem>,
}

impl<'a> Caller<'a> {
    pub fn new(uid: u32, gid: u32, pid: u32, acls: Option<&'a FileSystem>) -> Caller<'a> {
        Caller { uid, gid, pid, groups: OnceCell::new(), acls }
    }

    /// A caller whose supplementary groups are known (tests, or a process already read).
    #[cfg(test)]
    fn with_groups(uid: u32, gid: u32, groups: &[u32]) -> Caller<'static> {
        Caller { uid, gid, pid: 0, groups: OnceCell::from(groups.to_vec()), acls: None }
    }

    /// Whether the caller may keep an inode's setgid bit through a change of its ACL
    /// (`posix_acl_update_mode`): a member of its group, or privileged (CAP_FSETID).
    pub fn keeps_setgid(&self, a: &Attr) -> bool {
        self.is_privileged() || self.in_group(a.gid)
    }

    fn is_privileged(&self) -> bool {
        self.uid == 0
    }

    fn owns(&self, a: &Attr) -> bool {
        self.uid == a.uid
    }

    fn owns_or_privileged(&self, a: &Attr) -> bool {
        self.owns(a) || self.is_privileged()
    }

    /// `in_group_p`: the primary group or a supplementary one.
    fn in_group(&self, gid: u32) -> bool {
        gid == self.gid || self.groups.get_or_init(|| supplementary_groups(self.pid)).contains(&gid)
    }

    /// `generic_permission`: may the caller do `mask` (MAY_* bits) to an inode with these
    /// attributes? The owner class, else the group class, else other; exclusive, so a
    /// group member gets the group bits even where "other" grants more.
    pub fn permits(&self, a: &Attr, mask: u32) -> bool {
        debug_assert!(mask & !(MAY_READ | MAY_WRITE | MAY_EXEC) == 0, "mask {mask:#o}");
        let perm = u32::from(a.perm);
        if self.is_privileged() {
            // Read and write always; execute only if someone may (search: always).
            return mask & MAY_EXEC == 0 || a.kind == FileType::Directory || perm & 0o111 != 0;
        }
        if !self.owns(a) && perm & 0o070 != 0 {
            if let Some(acl) = self.acls.map(|fs| fs.access_acl(a.ino)) {
                match acl {
                    Ok(Some(acl)) => return acl.permits(self.uid, &|gid| self.in_group(gid), a.gid, mask as u16),
                    Ok(None) => {}
                    // A damaged ACL grants nothing (the request's own engine call, or fsck,
                    // reports the damage).
                    Err(_) => return false,
                }
            }
        }
        let class = if self.owns(a) {
            perm >> 6
        } else {
            let (group, other) = ((perm >> 3) & 7, perm & 7);
            // /proc is read only when the answer depends on the supplementary groups.
            let grants = |bits: u32| bits & mask == mask;
            if a.gid == self.gid || (grants(group) != grants(other) && self.in_group(a.gid)) {
                group
            } else {
                other
            }
        };
        class & mask == mask
    }

    /// `permits`, as the errno a refused request gets.
    pub fn check(&self, a: &Attr, mask: u32) -> Result<(), Errno> {
        if self.permits(a, mask) {
            Ok(())
        } else {
            Err(Errno::EACCES)
        }
    }

    /// `may_create`: a new name in `dir` (create, mknod, mkdir, symlink, link, rename target).
    pub fn may_create(&self, dir: &Attr) -> Result<(), Errno> {
        self.check(dir, MAY_WRITE | MAY_EXEC)
    }

    /// `may_delete` after the write check: in a sticky directory only the owner of the entry,
    /// the owner of the directory, or a privileged caller may remove or replace it.
    pub fn may_delete_from_sticky(&self, dir: &Attr, victim: &Attr) -> Result<(), Errno> {
        debug_assert!(dir.perm & S_ISVTX != 0);
        if self.owns(victim) || self.owns_or_privileged(dir) {
            Ok(())
        } else {
            Err(Errno::EPERM)
        }
    }

    /// Opening with these flags (the access mode; `__FMODE_EXEC` for execve). An exec needs
    /// execute permission only, as the kernel's `open_exec` asks `MAY_EXEC` alone: its
    /// read-only access mode is what the kernel itself reads the program with, and a program
    /// mode 0711 runs for anyone. No program can open with `__FMODE_EXEC` (open(2) drops it).
    /// `O_TRUNC` needs no check of its own: it comes with write access, and the kernel sends
    /// it as a setattr carrying the new file handle.
    pub fn may_open(&self, a: &Attr, flags: i32) -> Result<(), Errno> {
        let mask = match flags & libc::O_ACCMODE {
            _ if flags & FMODE_EXEC != 0 => MAY_EXEC,
            libc::O_WRONLY => MAY_WRITE,
            libc::O_RDWR => MAY_READ | MAY_WRITE,
            _ => MAY_READ,
        };
        self.check(a, mask)
    }

    /// `may_linkat` with `fs.protected_hardlinks = 1`: a hard link to someone else's file
    /// only if it is a regular file the caller may read and write and that carries no
    /// privilege (setuid, or setgid with group execute).
    pub fn may_link(&self, a: &Attr) -> Result<(), Errno> {
        let privileged_file = a.perm & S_ISUID != 0 || a.perm & (S_ISGID | 0o010) == S_ISGID | 0o010;
        if self.owns_or_privileged(a)
            || (a.kind == FileType::RegularFile && !privileged_file && self.permits(a, MAY_READ | MAY_WRITE))
        {
            Ok(())
        } else {
            Err(Errno::EPERM)
        }
    }

    /// `setattr_prepare` and `may_setattr`. May clear S_ISGID from a new mode, as the kernel
    /// does for a caller outside the file's group. `by_handle`: the kernel acts for an open
    /// file (ftruncate, `O_TRUNC`, or the writeback cache flushing times), whose opening it
    /// has already checked.
    pub fn may_setattr(&self, a: &Attr, sa: &mut SetAttr, by_handle: bool) -> Result<(), Errno> {
        if let Some(uid) = sa.uid {
            // chown: only privileged callers give a file away (the owner may "change" to itself).
            if !(self.is_privileged() || (self.owns(a) && uid == a.uid)) {
                return Err(Errno::EPERM);
            }
        }
        if let Some(gid) = sa.gid {
            // chgrp: the owner, to a group it is in.
            if !(self.is_privileged() || (self.owns(a) && (gid == a.gid || self.in_group(gid)))) {
                return Err(Errno::EPERM);
            }
        }
        if let Some(mode) = sa.mode.as_mut() {
            let kept = !(S_ISUID | S_ISGID);
            // Only S_ISUID/S_ISGID removed: the kernel dropping privileges after a write or
            // truncate by someone other than the owner (no FUSE_HANDLE_KILLPRIV).
            let drops_privileges_only = *mode & kept == a.perm & kept && *mode & !a.perm == 0;
            if self.owns_or_privileged(a) {
                if *mode & S_ISGID != 0 && !self.is_privileged() && !self.in_group(sa.gid.unwrap_or(a.gid)) {
                    *mode &= !S_ISGID;
                }
            } else if !(drops_privileges_only && (by_handle || self.permits(a, MAY_WRITE))) {
                return Err(Errno::EPERM);
            }
        }
        if sa.size.is_some() && !by_handle {
            self.check(a, MAY_WRITE)?;
        }
        let times = [sa.atime, sa.mtime];
        let chosen = times.iter().any(|t| matches!(t, Some(TimeOrNow::Time(_)))) || sa.ctime.is_some();
        let now = times.iter().any(|t| matches!(t, Some(TimeOrNow::Now)));
        // Times sent with a size are the truncate's own stamps (the writeback cache sends them
        // as chosen times, and open(O_TRUNC) comes without a handle): the write permission
        // checked above is what a truncate needs.
        let truncating = sa.size.is_some();
        if !by_handle && !truncating && !self.owns_or_privileged(a) {
            if chosen {
                return Err(Errno::EPERM);
            }
            if now {
                // utimes(2) to "now": the owner, or anyone who may write the file.
                self.check(a, MAY_WRITE)?;
            }
        }
        Ok(())
    }

    /// `xattr_permission` (no LSM): user.* by the file's read/write permission and only on
    /// regular files and directories (a sticky directory's only by its owner); trusted.* for
    /// privileged callers only (invisible to others); security.* readable by anyone, written
    /// by privileged callers only (commoncap's rule). The kernel makes most of these checks
    /// itself before it sends the request; making them here keeps them true without it.
    pub fn may_xattr(&self, a: &Attr, name: &[u8], mask: u32) -> Result<(), Errno> {
        let write = mask & MAY_WRITE != 0;
        let refused = if write { Errno::EPERM } else { Errno::ENODATA };
        if name.starts_with(b"trusted.") {
            return if self.is_privileged() { Ok(()) } else { Err(refused) };
        }
        if name.starts_with(b"system.posix_acl_") {
            // Anyone may read an ACL; only the owner may set one (`inode_owner_or_capable`).
            return if !write || self.owns_or_privileged(a) { Ok(()) } else { Err(Errno::EPERM) };
        }
        if name.starts_with(b"security.") {
            return if !write || self.is_privileged() { Ok(()) } else { Err(Errno::EPERM) };
        }
        match a.kind {
            FileType::RegularFile => {}
            FileType::Directory if write && a.perm & S_ISVTX != 0 && !self.owns_or_privileged(a) => {
                return Err(Errno::EPERM)
            }
            FileType::Directory => {}
            _ => return Err(refused),
        }
        self.check(a, mask)
    }
}

/// The supplementary groups of process (or thread) `pid`: the `Groups:` line of
/// /proc/<pid>/status. Empty if the process has gone (the primary group still counts).
fn supplementary_groups(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/status")).map_or_else(|_| Vec::new(), |status| parse_groups(&status))
}

fn parse_groups(status: &str) -> Vec<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Groups:"))
        .map_or_else(Vec::new, |g| g.split_whitespace().filter_map(|n| n.parse().ok()).collect())
}

/// Whether every class may search a directory of this mode: if not, the kernel must not
/// cache names in it for long (see "Permissions" in the crate docs).
pub fn searchable_by_all(perm: u16) -> bool {
    perm & 0o111 == 0o111
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrofs::Timespec;

    fn attr(kind: FileType, perm: u16, uid: u32, gid: u32) -> Attr {
        let t = Timespec { sec: 0, nsec: 0 };
        Attr {
            ino: 2,
            size: 0,
            blocks: 0,
            atime: t,
            mtime: t,
            ctime: t,
            btime: t,
            kind,
            perm,
            nlink: 1,
            uid,
            gid,
            rdev: 0,
            generation: 0,
            blksize: 4096,
        }
    }

    fn file(perm: u16) -> Attr {
        attr(FileType::RegularFile, perm, 1000, 2000)
    }

    #[test]
    fn classes_are_exclusive() {
        let f = file(0o604);
        assert!(Caller::with_groups(1000, 1, &[]).permits(&f, MAY_READ | MAY_WRITE));
        // A group member gets the group's (no) bits even though "other" may read.
        assert!(!Caller::with_groups(3000, 2000, &[]).permits(&f, MAY_READ));
        assert!(!Caller::with_groups(3000, 3000, &[2000]).permits(&f, MAY_READ));
        assert!(Caller::with_groups(3000, 3000, &[4000]).permits(&f, MAY_READ));
        // The owner gets the owner's bits only.
        assert!(!Caller::with_groups(1000, 2000, &[]).permits(&file(0o077), MAY_READ));
    }

    #[test]
    fn supplementary_groups_are_read_only_when_they_matter() {
        // pid 0 has no /proc entry: were the groups read, they would be empty.
        let unread = || Caller::new(3000, 3000, 0, None);
        let c = unread();
        // Group and other bits agree on reading: no need to know the groups.
        assert!(c.permits(&file(0o644), MAY_READ));
        assert!(c.groups.get().is_none());
        // They differ on writing: the groups decide.
        assert!(!c.permits(&file(0o664), MAY_WRITE));
        assert_eq!(c.groups.get(), Some(&Vec::new()));
        // The owner and the primary group never need them.
        let c = Caller::new(1000, 1, 0, None);
        assert!(c.permits(&file(0o600), MAY_WRITE));
        let c = Caller::new(3000, 2000, 0, None);
        assert!(c.permits(&file(0o660), MAY_WRITE));
        assert!(c.groups.get().is_none());
    }

    #[test]
    fn groups_line_of_proc_status() {
        assert_eq!(parse_groups("Name:\tx\nGid:\t0\t0\t0\t0\nGroups:\t4 24 1000 \nNgid:\t0\n"), [4, 24, 1000]);
        assert_eq!(parse_groups("Groups:\t\n"), Vec::<u32>::new());
        assert_eq!(parse_groups("Name:\tx\n"), Vec::<u32>::new());
        // This process's own line parses (whatever its groups are).
        let own = std::fs::read_to_string(format!("/proc/{}/status", std::process::id())).unwrap();
        assert!(own.contains("Groups:"));
        assert_eq!(supplementary_groups(std::process::id()), parse_groups(&own));
    }

    #[test]
    fn root_reads_and_writes_anything_but_executes_only_what_someone_may() {
        let root = Caller::with_groups(0, 0, &[]);
        assert!(root.permits(&file(0), MAY_READ | MAY_WRITE));
        assert!(!root.permits(&file(0o666), MAY_EXEC));
        assert!(root.permits(&file(0o001), MAY_EXEC));
        assert!(root.permits(&attr(FileType::Directory, 0, 5, 5), MAY_EXEC | MAY_WRITE));
    }

    #[test]
    fn sticky_directories_protect_other_users_entries() {
        let dir = attr(FileType::Directory, 0o1777, 3000, 3000);
        let victim = file(0o666);
        assert_eq!(Caller::with_groups(2000, 2000, &[]).may_delete_from_sticky(&dir, &victim), Err(Errno::EPERM));
        assert_eq!(Caller::with_groups(1000, 2000, &[]).may_delete_from_sticky(&dir, &victim), Ok(()));
        assert_eq!(Caller::with_groups(3000, 1, &[]).may_delete_from_sticky(&dir, &victim), Ok(()));
        assert_eq!(Caller::with_groups(0, 0, &[]).may_delete_from_sticky(&dir, &victim), Ok(()));
    }

    #[test]
    fn open_modes() {
        let c = Caller::with_groups(5000, 5000, &[]);
        assert_eq!(c.may_open(&file(0o644), libc::O_RDONLY), Ok(()));
        assert_eq!(c.may_open(&file(0o644), libc::O_WRONLY | libc::O_TRUNC), Err(Errno::EACCES));
        assert_eq!(c.may_open(&file(0o646), libc::O_RDWR), Ok(()));
        assert_eq!(c.may_open(&file(0o642), libc::O_RDWR), Err(Errno::EACCES));
        assert_eq!(c.may_open(&file(0o644), libc::O_RDONLY | FMODE_EXEC), Err(Errno::EACCES));
        assert_eq!(c.may_open(&file(0o645), libc::O_RDONLY | FMODE_EXEC), Ok(()));
        for exec_only in [0o711, 0o701, 0o111, 0o001] {
            assert_eq!(c.may_open(&file(exec_only), libc::O_RDONLY | FMODE_EXEC), Ok(()), "mode {exec_only:o}");
            assert_eq!(c.may_open(&file(exec_only), libc::O_RDONLY), Err(Errno::EACCES), "mode {exec_only:o}");
        }
    }

    #[test]
    fn hard_links_to_other_users_files() {
        let c = Caller::with_groups(5000, 5000, &[]);
        assert_eq!(c.may_link(&file(0o644)), Err(Errno::EPERM));
        assert_eq!(c.may_link(&file(0o666)), Ok(()));
        assert_eq!(c.may_link(&file(0o4777)), Err(Errno::EPERM));
        assert_eq!(c.may_link(&file(0o2777)), Err(Errno::EPERM));
        assert_eq!(c.may_link(&file(0o2767)), Ok(()), "setgid without group execute is a locking mark");
        assert_eq!(Caller::with_groups(1000, 1, &[]).may_link(&file(0)), Ok(()));
    }

    fn setattr(c: &Caller, a: &Attr, sa: SetAttr, by_handle: bool) -> Result<SetAttr, Errno> {
        let mut sa = sa;
        c.may_setattr(a, &mut sa, by_handle).map(|()| sa)
    }

    #[test]
    fn chmod_and_chown() {
        let (owner, other, root) = (
            Caller::with_groups(1000, 1000, &[3000]),
            Caller::with_groups(5000, 5000, &[]),
            Caller::with_groups(0, 0, &[]),
        );
        let f = file(0o644);
        let mode = |m| SetAttr { mode: Some(m), ..SetAttr::default() };
        assert_eq!(setattr(&owner, &f, mode(0o600), false).unwrap().mode, Some(0o600));
        assert_eq!(setattr(&other, &f, mode(0o600), false), Err(Errno::EPERM));
        assert_eq!(setattr(&root, &f, mode(0o2600), false).unwrap().mode, Some(0o2600));
        // S_ISGID from an owner outside the file's group is dropped; inside it, kept.
        assert_eq!(setattr(&owner, &f, mode(0o2755), false).unwrap().mode, Some(0o755));
        let g = SetAttr { gid: Some(3000), ..mode(0o2755) };
        assert_eq!(setattr(&owner, &f, g, false).unwrap().mode, Some(0o2755));
        // The kernel clearing setuid/setgid after a non-owner's write.
        let suid = file(0o6775);
        assert_eq!(
            setattr(&Caller::with_groups(3000, 2000, &[]), &suid, mode(0o775), false).unwrap().mode,
            Some(0o775)
        );
        assert_eq!(setattr(&other, &suid, mode(0o775), false), Err(Errno::EPERM), "no write permission");
        assert_eq!(setattr(&other, &suid, mode(0o775), true).unwrap().mode, Some(0o775));
        assert_eq!(
            setattr(&Caller::with_groups(3000, 2000, &[]), &suid, mode(0o777), false),
            Err(Errno::EPERM),
            "not only clearing"
        );
        // chown: privileged only; chgrp: the owner, to its own groups.
        let own = |uid, gid| SetAttr { uid, gid, ..SetAttr::default() };
        assert_eq!(setattr(&owner, &f, own(Some(1001), None), false), Err(Errno::EPERM));
        assert!(setattr(&owner, &f, own(Some(1000), Some(3000)), false).is_ok());
        assert_eq!(setattr(&owner, &f, own(None, Some(4000)), false), Err(Errno::EPERM));
        assert_eq!(setattr(&other, &f, own(None, Some(2000)), false), Err(Errno::EPERM));
        assert!(setattr(&root, &f, own(Some(7), Some(8)), false).is_ok());
    }

    #[test]
    fn truncate_and_times() {
        let other = Caller::with_groups(5000, 5000, &[]);
        let size = SetAttr { size: Some(0), ..SetAttr::default() };
        assert_eq!(setattr(&other, &file(0o644), size.clone(), false), Err(Errno::EACCES));
        assert!(setattr(&other, &file(0o646), size.clone(), false).is_ok());
        assert!(setattr(&other, &file(0o644), size, true).is_ok(), "ftruncate: checked at open");
        let now = SetAttr { atime: Some(TimeOrNow::Now), mtime: Some(TimeOrNow::Now), ..SetAttr::default() };
        let chosen = SetAttr { mtime: Some(TimeOrNow::Time(Timespec { sec: 5, nsec: 0 })), ..SetAttr::default() };
        assert_eq!(setattr(&other, &file(0o644), now.clone(), false), Err(Errno::EACCES));
        assert!(setattr(&other, &file(0o646), now.clone(), false).is_ok());
        assert_eq!(setattr(&other, &file(0o646), chosen.clone(), false), Err(Errno::EPERM));
        assert!(setattr(&Caller::with_groups(1000, 1, &[]), &file(0), chosen, false).is_ok());
    }

    #[test]
    fn xattr_namespaces() {
        let other = Caller::with_groups(5000, 5000, &[]);
        let root = Caller::with_groups(0, 0, &[]);
        assert_eq!(other.may_xattr(&file(0o644), b"user.a", MAY_READ), Ok(()));
        assert_eq!(other.may_xattr(&file(0o644), b"user.a", MAY_WRITE), Err(Errno::EACCES));
        assert_eq!(other.may_xattr(&file(0o646), b"user.a", MAY_WRITE), Ok(()));
        assert_eq!(other.may_xattr(&file(0o644), b"trusted.a", MAY_READ), Err(Errno::ENODATA));
        assert_eq!(other.may_xattr(&file(0o646), b"trusted.a", MAY_WRITE), Err(Errno::EPERM));
        assert_eq!(root.may_xattr(&file(0), b"trusted.a", MAY_WRITE), Ok(()));
        assert_eq!(other.may_xattr(&file(0), b"security.a", MAY_READ), Ok(()));
        assert_eq!(other.may_xattr(&file(0o666), b"security.a", MAY_WRITE), Err(Errno::EPERM));
        let link = attr(FileType::Symlink, 0o777, 5000, 5000);
        assert_eq!(other.may_xattr(&link, b"user.a", MAY_WRITE), Err(Errno::EPERM));
        assert_eq!(other.may_xattr(&link, b"user.a", MAY_READ), Err(Errno::ENODATA));
        let sticky = attr(FileType::Directory, 0o1777, 1000, 1000);
        assert_eq!(other.may_xattr(&sticky, b"user.a", MAY_WRITE), Err(Errno::EPERM));
        assert_eq!(other.may_xattr(&sticky, b"user.a", MAY_READ), Ok(()));
    }

    #[test]
    fn acls_are_read_by_anyone_and_set_by_the_owner() {
        let (owner, other, root) = (
            Caller::with_groups(1000, 1, &[]),
            Caller::with_groups(5000, 5000, &[2000]),
            Caller::with_groups(0, 0, &[]),
        );
        let acl = b"system.posix_acl_access";
        assert_eq!(other.may_xattr(&file(0), acl, MAY_READ), Ok(()));
        assert_eq!(other.may_xattr(&file(0o666), acl, MAY_WRITE), Err(Errno::EPERM));
        assert_eq!(owner.may_xattr(&file(0), acl, MAY_WRITE), Ok(()));
        assert_eq!(root.may_xattr(&file(0), b"system.posix_acl_default", MAY_WRITE), Ok(()));
        // Setting an ACL keeps setgid for a member of the file's group, or root.
        assert!(!owner.keeps_setgid(&file(0o2770)));
        assert!(other.keeps_setgid(&file(0o2770)));
        assert!(root.keeps_setgid(&file(0o2770)));
    }

    #[test]
    fn search_by_all() {
        assert!(searchable_by_all(0o755));
        assert!(searchable_by_all(0o1711));
        assert!(!searchable_by_all(0o750));
        assert!(!searchable_by_all(0o700));
    }
}
