//! POSIX semantics through a real FUSE mount, beyond what `mount.rs` covers: permission checks
//! (the adapter's; with FERROFS_TEST_DEFAULT_PERMISSIONS=1 the kernel's `default_permissions`
//! against the attributes ferrofs returns) with other users and supplementary groups,
//! access(2), chdir and execve, names cached before a directory turned private,
//! setuid/setgid clearing, sticky directories, open flags,
//! link counts, symlinks, every rename case, timestamps, xattr namespaces, SEEK_DATA/HOLE,
//! statfs accounting, files past 4 GiB, readdir under concurrent change, and mmap.
//!
//! Acting as another user: a thread changes only its own credentials with the raw
//! `setgroups`/`setfsgid`/`setfsuid` system calls. glibc's `setgroups`/`setresuid` wrappers
//! would change every thread of the process — including the FUSE workers serving the mount
//! in this same process — and a forked child of a multi-threaded test binary may not safely
//! allocate. The kernel takes the request's uid/gid and its permission checks from the
//! calling thread's fsuid/fsgid and groups, so this is exactly another user's process.

mod common;

use common::*;
use std::collections::HashMap;
use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{symlink, FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const GIB: u64 = 1 << 30;

/// Run `f` in a thread whose file system identity is `uid`/`gid` with supplementary
/// `groups` and umask 022 (see the module comment for why a thread and raw system calls).
/// The thread's effective capabilities are dropped too, so it is checked like any user.
fn as_user<T: Send>(uid: u32, gid: u32, groups: &[u32], f: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|s| {
        s.spawn(|| {
            check(unsafe { libc::unshare(libc::CLONE_FS) }).unwrap();
            unsafe { libc::umask(0o022) };
            let groups: Vec<libc::gid_t> = groups.to_vec();
            // Before setfsuid: setgroups needs CAP_SETGID (not a file system capability, but
            // keep the order obvious).
            let rc = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
            assert_eq!(rc, 0, "setgroups: {}", io::Error::last_os_error());
            unsafe {
                libc::syscall(libc::SYS_setfsgid, gid);
                libc::syscall(libc::SYS_setfsuid, uid);
                // Called with an invalid id, they return the current one: check they took.
                assert_eq!(libc::syscall(libc::SYS_setfsuid, u32::MAX) as u32, uid);
                assert_eq!(libc::syscall(libc::SYS_setfsgid, u32::MAX) as u32, gid);
            }
            drop_effective_capabilities();
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Empty this thread's effective capability set (capabilities are per thread in the
/// kernel). setfsuid drops only the file system ones; CAP_SYS_ADMIN would still let the
/// "other user" into trusted.* and security.* xattrs.
fn drop_effective_capabilities() {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Clone, Copy, Default)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const VERSION_3: u32 = 0x2008_0522;
    let mut h = Header { version: VERSION_3, pid: 0 };
    let mut d = [Data::default(); 2];
    unsafe {
        assert_eq!(
            libc::syscall(libc::SYS_capget, &mut h as *mut Header, d.as_mut_ptr()),
            0,
            "capget: {}",
            io::Error::last_os_error()
        );
        d[0].effective = 0;
        d[1].effective = 0;
        assert_eq!(
            libc::syscall(libc::SYS_capset, &mut h as *mut Header, d.as_ptr()),
            0,
            "capset: {}",
            io::Error::last_os_error()
        );
    }
}

/// A fixture other users may use (allow_other), or `None` with a skip message when not root
/// (acting as another user needs root) or FUSE is unavailable.
fn multi_user_fixture(name: &str) -> Option<Fixture> {
    if !is_root() {
        skip(name, "acting as other users needs root");
        return None;
    }
    Fixture::new(name, |c| c.allow_other = true)
}

fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn chown(p: &Path, uid: u32, gid: u32) -> io::Result<()> {
    std::os::unix::fs::chown(p, Some(uid), Some(gid))
}

fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

/// access(2) checks with the real uid, which `as_user` does not change: AT_EACCESS makes
/// faccessat use the thread's file system ids and capabilities as they are.
fn access(p: &Path, how: i32) -> io::Result<i32> {
    check(unsafe { libc::faccessat(libc::AT_FDCWD, cpath(p).as_ptr(), how, libc::AT_EACCESS) })
}

fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<i32> {
    let (f, t) = (cpath(from), cpath(to));
    // Through syscall(2): the libc wrapper may be missing on older C libraries.
    let rc =
        unsafe { libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), flags) };
    check(rc as i32)
}

fn statvfs(p: &Path) -> libc::statvfs {
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statvfs(cpath(p).as_ptr(), &mut st) }).unwrap();
    st
}

fn setxattr(p: &Path, name: &str, value: &[u8], flags: i32) -> io::Result<i32> {
    let n = CString::new(name).unwrap();
    check(unsafe { libc::lsetxattr(cpath(p).as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), flags) })
}

fn getxattr(p: &Path, name: &str) -> io::Result<Vec<u8>> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    let len =
        check_size(unsafe { libc::lgetxattr(cpath(p).as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    buf.truncate(len);
    Ok(buf)
}

fn removexattr(p: &Path, name: &str) -> io::Result<i32> {
    let n = CString::new(name).unwrap();
    check(unsafe { libc::lremovexattr(cpath(p).as_ptr(), n.as_ptr()) })
}

fn listxattr(p: &Path) -> Vec<String> {
    let mut buf = vec![0u8; 8192];
    let len = check_size(unsafe { libc::llistxattr(cpath(p).as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }).unwrap();
    let mut v: Vec<String> = buf[..len]
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8(s.to_vec()).unwrap())
        .collect();
    v.sort();
    v
}

#[test]
fn permission_bits_and_supplementary_groups() {
    let Some(fx) = multi_user_fixture("perms") else { return };
    // A directory 0750 owned by 1000:2000 holding a file 0640 of the same owner.
    let d = fx.path("d");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("f"), b"secret").unwrap();
    chown(&d, 1000, 2000).unwrap();
    chown(&d.join("f"), 1000, 2000).unwrap();
    chmod(&d, 0o750);
    chmod(&d.join("f"), 0o640);

    // The owner: full access to the directory, read+write to the file.
    as_user(1000, 1000, &[], || {
        assert_eq!(fs::read(d.join("f")).unwrap(), b"secret");
        OpenOptions::new().write(true).open(d.join("f")).unwrap().write_all(b"SECRET").unwrap();
        fs::write(d.join("owners"), b"").unwrap();
        fs::remove_file(d.join("owners")).unwrap();
        // The owner may chmod, and chgrp to a group it is in...
        chmod(&d.join("f"), 0o640);
    });
    as_user(1000, 1000, &[2000, 3000], || {
        chown(&d.join("f"), 1000, 3000).unwrap();
        chown(&d.join("f"), 1000, 2000).unwrap();
        // ...but not to one it is not in, and never give the file away.
        assert_eq!(errno(chown(&d.join("f"), 1000, 4000)), libc::EPERM);
        assert_eq!(errno(chown(&d.join("f"), 1001, 2000)), libc::EPERM);
    });
    // A member of the group through a supplementary group only: read, list, no write.
    as_user(3000, 3000, &[2000], || {
        assert_eq!(fs::read(d.join("f")).unwrap(), b"SECRET");
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
        assert_eq!(errno(OpenOptions::new().write(true).open(d.join("f"))), libc::EACCES);
        assert_eq!(errno(fs::write(d.join("new"), b"")), libc::EACCES);
        assert_eq!(errno(fs::remove_file(d.join("f"))), libc::EACCES);
        assert_eq!(errno(access(&d.join("f"), libc::W_OK)), libc::EACCES);
        access(&d.join("f"), libc::R_OK).unwrap();
        // Not the owner: no chmod, no chown.
        assert_eq!(errno(fs::set_permissions(d.join("f"), fs::Permissions::from_mode(0o666))), libc::EPERM);
        assert_eq!(errno(chown(&d.join("f"), 3000, 2000)), libc::EPERM);
    });
    // Neither owner nor group: the directory cannot even be searched.
    as_user(3000, 3000, &[4000], || {
        assert_eq!(errno(fs::read_dir(&d)), libc::EACCES);
        assert_eq!(errno(fs::metadata(d.join("f"))), libc::EACCES);
        assert_eq!(errno(fs::read(d.join("f"))), libc::EACCES);
    });
    // The group bits apply to a group member even when "other" would allow more
    // (permission classes are exclusive).
    chmod(&d, 0o705);
    as_user(3000, 3000, &[2000], || assert_eq!(errno(fs::read_dir(&d)), libc::EACCES));
    as_user(5000, 5000, &[], || assert_eq!(fs::read_dir(&d).unwrap().count(), 1));
    // Mode 000: the owner is refused too; root is not (CAP_DAC_OVERRIDE).
    chmod(&d, 0o755);
    chmod(&d.join("f"), 0);
    as_user(1000, 2000, &[], || assert_eq!(errno(fs::read(d.join("f"))), libc::EACCES));
    assert_eq!(fs::read(d.join("f")).unwrap(), b"SECRET");
    // Execute permission on a file.
    chmod(&d.join("f"), 0o754);
    as_user(1000, 1000, &[], || access(&d.join("f"), libc::X_OK).unwrap());
    as_user(3000, 3000, &[2000], || access(&d.join("f"), libc::X_OK).unwrap());
    as_user(3000, 3000, &[], || assert_eq!(errno(access(&d.join("f"), libc::X_OK)), libc::EACCES));
}

#[test]
fn ownership_of_new_files_and_setgid_directories() {
    let Some(fx) = multi_user_fixture("newowner") else { return };
    let open = fx.path("open");
    fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    let sg = fx.path("sg");
    fs::create_dir(&sg).unwrap();
    chown(&sg, 0, 4242).unwrap();
    chmod(&sg, 0o2777);
    as_user(1000, 2000, &[], || {
        fs::write(open.join("f"), b"").unwrap();
        fs::create_dir(open.join("d")).unwrap();
        // Not a member of 4242, yet the setgid directory's group wins.
        fs::write(sg.join("f"), b"").unwrap();
        fs::create_dir(sg.join("d")).unwrap();
        let fifo = cpath(&sg.join("p"));
        check(unsafe { libc::mknod(fifo.as_ptr(), libc::S_IFIFO | 0o644, 0) }).unwrap();
        // Two levels down: the inherited S_ISGID propagates again.
        fs::write(sg.join("d/g"), b"").unwrap();
    });
    let owner = |p: &Path| {
        let m = fs::symlink_metadata(p).unwrap();
        (m.uid(), m.gid())
    };
    assert_eq!(owner(&open.join("f")), (1000, 2000));
    assert_eq!(owner(&open.join("d")), (1000, 2000));
    assert_eq!(mode(&open.join("d")) & 0o2000, 0);
    assert_eq!(owner(&sg.join("f")), (1000, 4242));
    assert_eq!(owner(&sg.join("p")), (1000, 4242));
    assert_eq!(owner(&sg.join("d")), (1000, 4242));
    assert_eq!(mode(&sg.join("d")), 0o2755, "a subdirectory inherits S_ISGID");
    assert_eq!(owner(&sg.join("d/g")), (1000, 4242));
    // A plain file in a setgid directory does not get S_ISGID.
    assert_eq!(mode(&sg.join("f")), 0o644);

    // chmod g+s by an owner who is not in the file's group: the kernel drops S_ISGID.
    as_user(1000, 1000, &[], || {
        fs::set_permissions(sg.join("f"), fs::Permissions::from_mode(0o2755)).unwrap();
    });
    assert_eq!(mode(&sg.join("f")), 0o755);
    as_user(1000, 1000, &[4242], || {
        fs::set_permissions(sg.join("f"), fs::Permissions::from_mode(0o2755)).unwrap();
    });
    assert_eq!(mode(&sg.join("f")), 0o2755);
}

/// A directory anyone may write, `d`, holding a program `d/prog` of 1000:2000.
fn program_of_another_user(fx: &Fixture) -> (PathBuf, PathBuf) {
    let d = fx.path("d");
    fs::create_dir(&d).unwrap();
    chmod(&d, 0o777);
    let f = d.join("prog");
    fs::write(&f, b"#!/bin/true\n").unwrap();
    chown(&f, 1000, 2000).unwrap();
    (d, f)
}

#[test]
fn setuid_and_setgid_cleared_on_write_and_chown() {
    let Some(fx) = multi_user_fixture("killsuid") else { return };
    let (d, f) = program_of_another_user(&fx);
    chmod(&f, 0o6775);
    assert_eq!(mode(&f), 0o6775);

    // Root (CAP_FSETID) writing keeps the bits.
    OpenOptions::new().append(true).open(&f).unwrap().write_all(b"# root\n").unwrap();
    assert_eq!(mode(&f), 0o6775);

    // A group member who is not the owner writes: both bits go (S_ISGID because the file is
    // group-executable; a group-nonexecutable S_ISGID marks mandatory locking instead).
    as_user(3000, 3000, &[2000], || {
        OpenOptions::new().append(true).open(&f).unwrap().write_all(b"# other\n").unwrap();
    });
    assert_eq!(mode(&f), 0o775);
    assert_eq!(fs::read_to_string(&f).unwrap(), "#!/bin/true\n# root\n# other\n");

    // Truncation by a non-owner clears them too.
    chmod(&f, 0o6775);
    as_user(3000, 3000, &[2000], || OpenOptions::new().write(true).open(&f).unwrap().set_len(3).unwrap());
    assert_eq!((mode(&f), fs::metadata(&f).unwrap().len()), (0o775, 3));

    // chown clears them, even done by root, even to the same owner.
    chmod(&f, 0o6775);
    chown(&f, 1000, 2000).unwrap();
    assert_eq!(mode(&f), 0o775);
    chmod(&f, 0o6775);
    chown(&f, 1001, 2001).unwrap();
    assert_eq!(mode(&f), 0o775);
    let m = fs::metadata(&f).unwrap();
    assert_eq!((m.uid(), m.gid()), (1001, 2001));

    // The owner's own chgrp clears them as well.
    chown(&f, 1000, 2000).unwrap();
    chmod(&f, 0o6775);
    as_user(1000, 2000, &[3000], || chown(&f, 1000, 3000).unwrap());
    assert_eq!(mode(&f), 0o775);

    // A directory's S_ISGID is not touched by chown.
    let sub = d.join("sub");
    fs::create_dir(&sub).unwrap();
    chmod(&sub, 0o2775);
    chown(&sub, 1000, 2000).unwrap();
    assert_eq!(mode(&sub), 0o2775);
}

/// A file capability set (revision 2: CAP_NET_BIND_SERVICE permitted and effective), which
/// the kernel validates before it stores `security.capability`.
const FILE_CAPABILITY: [u8; 20] = [1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];

/// Whether `f` still carries a file capability.
fn has_capability(f: &Path) -> bool {
    match getxattr(f, "security.capability") {
        Ok(v) => v == FILE_CAPABILITY,
        Err(e) if e.raw_os_error() == Some(libc::ENODATA) => false,
        Err(e) => panic!("getxattr security.capability: {e}"),
    }
}

/// What write, truncate, open(O_TRUNC), copy_file_range, fallocate and chown take from a
/// file, as on Linux's local file systems (ext4 compared): file capabilities always; setuid,
/// and setgid with group execute, unless the changer has CAP_FSETID (root), always on chown.
/// A group member who is not the owner changes the file, so the owner-only and group rules
/// cannot hide a miss.
#[test]
fn privileges_dropped_by_write_truncate_open_and_chown() {
    let Some(fx) = multi_user_fixture("killpriv") else { return };
    let (d, f) = program_of_another_user(&fx);
    let privileged = |bits: u32| {
        chmod(&f, bits);
        setxattr(&f, "security.capability", &FILE_CAPABILITY, 0).unwrap();
        assert_eq!((mode(&f), has_capability(&f)), (bits, true));
    };
    let member = |change: &(dyn Fn() + Sync)| as_user(3000, 3000, &[2000], change);
    let append = || OpenOptions::new().append(true).open(&f).unwrap().write_all(b"#\n").unwrap();
    let truncate = || OpenOptions::new().write(true).open(&f).unwrap().set_len(1).unwrap();
    let open_truncating = || drop(OpenOptions::new().write(true).truncate(true).open(&f).unwrap());

    // A write by someone else: all of it.
    privileged(0o6775);
    member(&append);
    assert_eq!((mode(&f), has_capability(&f)), (0o775, false), "write");
    // Root's write keeps the set-id bits (CAP_FSETID) but not the capability.
    privileged(0o6775);
    append();
    assert_eq!((mode(&f), has_capability(&f)), (0o6775, false), "root's write");
    // setgid without group execute marks mandatory locking, not a privilege: kept.
    privileged(0o2765);
    member(&append);
    assert_eq!((mode(&f), has_capability(&f)), (0o2765, false), "write, setgid without group execute");

    let src = d.join("src");
    fs::write(&src, b"abc").unwrap();
    let copy = || {
        let (from, to) = (File::open(&src).unwrap(), OpenOptions::new().write(true).open(&f).unwrap());
        let null = std::ptr::null_mut();
        let n = unsafe { libc::copy_file_range(from.as_raw_fd(), null, to.as_raw_fd(), null, 3, 0) };
        assert_eq!(check_size(n).unwrap(), 3);
    };
    let allocate = || {
        let to = OpenOptions::new().write(true).open(&f).unwrap();
        check(unsafe { libc::fallocate(to.as_raw_fd(), 0, 0, 8192) }).unwrap();
    };

    // ftruncate, copy_file_range, fallocate and open(O_TRUNC) by someone else, then root's.
    let changes: [(&str, &(dyn Fn() + Sync)); 4] =
        [("truncate", &truncate), ("copy_file_range", &copy), ("fallocate", &allocate), ("O_TRUNC", &open_truncating)];
    for (what, change) in changes {
        privileged(0o6775);
        member(change);
        assert_eq!((mode(&f), has_capability(&f)), (0o775, false), "{what}");
        privileged(0o6775);
        change();
        assert_eq!((mode(&f), has_capability(&f)), (0o6775, false), "root's {what}");
    }

    // uid 0 without CAP_FSETID (`as_user` drops the thread's capabilities) keeps nothing: the
    // kernel asks for the set-id bits to go (copy_file_range and fallocate carry no such
    // word: there the daemon takes uid 0 for CAP_FSETID).
    let uid0_changes: [(&str, &(dyn Fn() + Sync)); 3] =
        [("write", &append), ("truncate", &truncate), ("O_TRUNC", &open_truncating)];
    for (what, change) in uid0_changes {
        privileged(0o6775);
        as_user(0, 2000, &[], change);
        assert_eq!((mode(&f), has_capability(&f)), (0o775, false), "{what} by uid 0 without CAP_FSETID");
    }

    // chown, by root to the same owner, and the owner's chgrp.
    privileged(0o6775);
    chown(&f, 1000, 2000).unwrap();
    assert_eq!((mode(&f), has_capability(&f)), (0o775, false), "chown");
    privileged(0o6775);
    as_user(1000, 2000, &[3000], || chown(&f, 1000, 3000).unwrap());
    assert_eq!((mode(&f), has_capability(&f)), (0o775, false), "chgrp");

    // A chmod or a change of times takes nothing.
    privileged(0o6775);
    chmod(&f, 0o4755);
    File::options().write(true).open(&f).unwrap().set_modified(SystemTime::now()).unwrap();
    assert_eq!((mode(&f), has_capability(&f)), (0o4755, true), "chmod, utimens");
    assert_eq!(fs::read(&f).unwrap(), b"", "the last change was an open(O_TRUNC)");
}

#[test]
fn sticky_directories() {
    let Some(fx) = multi_user_fixture("sticky") else { return };
    let t = fx.path("tmp");
    fs::create_dir(&t).unwrap();
    chmod(&t, 0o1777);
    as_user(1000, 1000, &[], || {
        fs::write(t.join("a"), b"a").unwrap();
        fs::write(t.join("a2"), b"a2").unwrap();
        fs::create_dir(t.join("adir")).unwrap();
        chmod(&t.join("a"), 0o666);
    });
    as_user(2000, 2000, &[], || {
        fs::write(t.join("b"), b"b").unwrap();
        // Someone else's entries: no unlink, rmdir, rename away, or rename over -- even though
        // the directory is world-writable and "a" itself is writable.
        assert_eq!(errno(fs::remove_file(t.join("a"))), libc::EPERM);
        assert_eq!(errno(fs::remove_dir(t.join("adir"))), libc::EPERM);
        assert_eq!(errno(fs::rename(t.join("a"), t.join("mine"))), libc::EPERM);
        assert_eq!(errno(fs::rename(t.join("b"), t.join("a"))), libc::EPERM);
        assert_eq!(errno(renameat2(&t.join("b"), &t.join("a2"), libc::RENAME_EXCHANGE)), libc::EPERM);
        // Writing the file's contents is governed by its mode, not by the sticky bit.
        OpenOptions::new().write(true).open(t.join("a")).unwrap().write_all(b"A").unwrap();
        // Its own entries are fine.
        fs::rename(t.join("b"), t.join("b2")).unwrap();
        fs::remove_file(t.join("b2")).unwrap();
    });
    assert_eq!(fs::read(t.join("a")).unwrap(), b"A");
    // The owner of the entry may remove it...
    as_user(1000, 1000, &[], || fs::rename(t.join("a2"), t.join("a3")).unwrap());
    // ...and so may the owner of the directory.
    chown(&t, 3000, 3000).unwrap();
    as_user(3000, 3000, &[], || {
        fs::remove_file(t.join("a3")).unwrap();
        fs::remove_dir(t.join("adir")).unwrap();
    });
    // Without the sticky bit, anyone who may write the directory may remove.
    chmod(&t, 0o777);
    as_user(2000, 2000, &[], || fs::remove_file(t.join("a")).unwrap());
    assert_eq!(fs::read_dir(&t).unwrap().count(), 0);
}

#[test]
fn open_flags_excl_trunc_append() {
    let Some(fx) = Fixture::new("openflags", |_| {}) else { return };
    let f = fx.path("f");
    fs::write(&f, b"0123456789").unwrap();

    // O_EXCL: an existing file, directory or symlink (even a dangling one) is EEXIST.
    assert_eq!(errno(OpenOptions::new().write(true).create_new(true).open(&f)), libc::EEXIST);
    fs::create_dir(fx.path("d")).unwrap();
    assert_eq!(errno(OpenOptions::new().write(true).create_new(true).open(fx.path("d"))), libc::EEXIST);
    symlink("nowhere", fx.path("dangling")).unwrap();
    assert_eq!(errno(OpenOptions::new().write(true).create_new(true).open(fx.path("dangling"))), libc::EEXIST);
    assert!(!fx.path("nowhere").exists(), "O_EXCL must not follow the symlink");
    // Without O_EXCL, O_CREAT through a dangling symlink creates its target.
    OpenOptions::new().write(true).create(true).truncate(false).open(fx.path("dangling")).unwrap();
    assert!(fx.path("nowhere").is_file());
    // Racing O_CREAT|O_EXCL creators: exactly one wins.
    let wins: usize = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|i| {
                let p = fx.path("race");
                s.spawn(move || match OpenOptions::new().write(true).create_new(true).open(&p) {
                    Ok(mut file) => {
                        file.write_all(format!("{i}").as_bytes()).unwrap();
                        1
                    }
                    Err(e) => {
                        assert_eq!(e.raw_os_error(), Some(libc::EEXIST));
                        0
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    assert_eq!(wins, 1);
    assert_eq!(fs::read(fx.path("race")).unwrap().len(), 1);

    // O_TRUNC: size 0 and, as POSIX requires for an existing file, new mtime and ctime
    // even when the file was already empty.
    let old = UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    File::options().write(true).open(&f).unwrap().set_modified(old).unwrap();
    let before = fs::metadata(&f).unwrap();
    OpenOptions::new().write(true).truncate(true).open(&f).unwrap();
    let after = fs::metadata(&f).unwrap();
    assert_eq!(after.len(), 0);
    assert!(after.mtime() > before.mtime(), "O_TRUNC must update mtime");
    File::options().write(true).open(&f).unwrap().set_modified(old).unwrap();
    OpenOptions::new().write(true).truncate(true).open(&f).unwrap();
    assert!(fs::metadata(&f).unwrap().mtime() > 1_000_000_000, "O_TRUNC of an empty file must update mtime");
    // O_TRUNC with a read-write open keeps the descriptor usable.
    fs::write(&f, b"longer contents").unwrap();
    let mut rw = OpenOptions::new().read(true).write(true).truncate(true).open(&f).unwrap();
    rw.write_all(b"ab").unwrap();
    rw.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    rw.read_to_string(&mut s).unwrap();
    assert_eq!(s, "ab");

    // O_APPEND: every write goes to the current end, whatever the offset, through any
    // number of descriptors.
    fs::write(&f, b"base").unwrap();
    let mut a1 = OpenOptions::new().read(true).append(true).open(&f).unwrap();
    let mut a2 = OpenOptions::new().append(true).open(&f).unwrap();
    a1.seek(SeekFrom::Start(0)).unwrap();
    a1.write_all(b"-one").unwrap();
    a2.write_all(b"-two").unwrap();
    a1.write_all(b"-three").unwrap();
    assert_eq!(a1.stream_position().unwrap(), 18);
    // A plain descriptor writing at offset 0 overwrites in place.
    let mut plain = OpenOptions::new().write(true).open(&f).unwrap();
    plain.write_all(b"B").unwrap();
    a1.seek(SeekFrom::Start(0)).unwrap();
    let mut s = String::new();
    a1.read_to_string(&mut s).unwrap();
    assert_eq!(s, "Base-one-two-three");
    // Appenders in parallel: no write lost or overlapped.
    fs::write(&f, b"").unwrap();
    std::thread::scope(|s| {
        for t in 0..4u8 {
            let p = f.clone();
            s.spawn(move || {
                let mut a = OpenOptions::new().append(true).open(&p).unwrap();
                for _ in 0..100 {
                    a.write_all(&[b'a' + t; 10]).unwrap();
                }
            });
        }
    });
    let data = fs::read(&f).unwrap();
    assert_eq!(data.len(), 4000);
    for chunk in data.chunks(10) {
        assert!(chunk.iter().all(|&c| c == chunk[0]), "interleaved append: {chunk:?}");
    }
    // O_DIRECTORY on a file, writing a directory.
    assert_eq!(errno(OpenOptions::new().read(true).custom_flags(libc::O_DIRECTORY).open(&f)), libc::ENOTDIR);
    assert_eq!(errno(OpenOptions::new().write(true).open(fx.path("d"))), libc::EISDIR);
}

#[test]
fn names_longer_than_255_bytes() {
    let Some(fx) = Fixture::new("longnames", |_| {}) else { return };
    let n255 = "é".repeat(127) + "x"; // 255 bytes of UTF-8
    assert_eq!(n255.len(), 255);
    let n256 = "n".repeat(256);
    fs::write(fx.path(&n255), b"ok").unwrap();
    fs::write(fx.path("t"), b"").unwrap();
    fs::create_dir(fx.path("d")).unwrap();
    assert_eq!(fs::read_dir(&fx.mnt).unwrap().filter(|e| e.as_ref().unwrap().file_name().len() == 255).count(), 1);
    assert_eq!(errno(symlink("t", fx.path(&n256))), libc::ENAMETOOLONG);
    assert_eq!(errno(fs::hard_link(fx.path("t"), fx.path(&n256))), libc::ENAMETOOLONG);
    assert_eq!(errno(fs::remove_file(fx.path(&n256))), libc::ENAMETOOLONG);
    assert_eq!(errno(fs::remove_dir(fx.path(&n256))), libc::ENAMETOOLONG);
    assert_eq!(errno(fs::read_link(fx.path(&n256))), libc::ENAMETOOLONG);
    // A long component in the middle of a path.
    assert_eq!(errno(fs::write(fx.path(&format!("{n256}/f")), b"")), libc::ENAMETOOLONG);
    let mk = cpath(&fx.path(&format!("d/{n256}")));
    assert_eq!(errno(check(unsafe { libc::mknod(mk.as_ptr(), libc::S_IFIFO | 0o644, 0) })), libc::ENAMETOOLONG);
    // The 255-byte name works everywhere.
    fs::rename(fx.path(&n255), fx.path(&format!("d/{n255}"))).unwrap();
    assert_eq!(fs::read(fx.path(&format!("d/{n255}"))).unwrap(), b"ok");
    // A symlink target is a path, not a name: longer than 255 is fine.
    symlink("y".repeat(1000), fx.path("ls")).unwrap();
}

#[test]
fn fallocate_modes() {
    let Some(mut fx) = Fixture::new("falloc", |_| {}) else { return };
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(fx.path("f")).unwrap();
    let fd = f.as_raw_fd();
    f.set_len(8192).unwrap();
    let falloc = |mode: i32, off: i64, len: i64| check(unsafe { libc::fallocate(fd, mode, off, len) });
    // Modes refused (a punch must keep the size; FUSE passes no collapse or insert on), and
    // the file is untouched.
    for mode in [libc::FALLOC_FL_PUNCH_HOLE, libc::FALLOC_FL_COLLAPSE_RANGE, libc::FALLOC_FL_INSERT_RANGE] {
        assert_eq!(errno(falloc(mode, 0, 4096)), libc::EOPNOTSUPP, "mode {mode:#x}");
    }
    assert_eq!((f.metadata().unwrap().len(), f.metadata().unwrap().blocks()), (8192, 0));
    // Invalid arguments are caught before the file system sees them.
    assert_eq!(errno(falloc(0, 0, 0)), libc::EINVAL);
    assert_eq!(errno(falloc(0, -1, 10)), libc::EINVAL);
    let d = File::open(&fx.mnt).unwrap();
    assert!(check(unsafe { libc::fallocate(d.as_raw_fd(), 0, 0, 4096) }).is_err());
    drop(d);

    // Mode 0: the size grows to the end of the range and every block is allocated.
    falloc(0, 4096, (1 << 20) - 4096).unwrap();
    let m = f.metadata().unwrap();
    assert_eq!((m.len(), m.blocks()), (1 << 20, 2048 - 8), "block 0 is still a hole");
    let mut want = vec![0u8; 1 << 20];
    assert!(fs::read(fx.path("f")).unwrap() == want, "preallocated space reads as zeros");
    // KEEP_SIZE: blocks past the end, no size change.
    falloc(libc::FALLOC_FL_KEEP_SIZE, 1 << 20, 1 << 20).unwrap();
    let m = f.metadata().unwrap();
    assert_eq!((m.len(), m.blocks()), (1 << 20, 4096 - 8));
    // Data written into preallocated blocks reads back, zeros around it; no block is added.
    let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8 + 1).collect();
    f.write_all_at(&data, 300_000).unwrap();
    want[300_000..310_000].copy_from_slice(&data);
    assert!(fs::read(fx.path("f")).unwrap() == want);
    assert_eq!(f.metadata().unwrap().blocks(), 4096 - 8);
    // Preallocated blocks are holes to SEEK_DATA: the first data is the written block.
    let seek = |off: i64, whence: i32| unsafe { libc::lseek(fd, off, whence) };
    assert_eq!(seek(0, libc::SEEK_DATA), 73 * 4096);
    assert_eq!(seek(73 * 4096, libc::SEEK_HOLE), 76 * 4096);
    // PUNCH_HOLE | KEEP_SIZE: the block at 73 is freed, the partial edges are zeroed.
    falloc(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 73 * 4096 - 10, 4096 + 20).unwrap();
    want[73 * 4096 - 10..74 * 4096 + 10].fill(0);
    assert!(fs::read(fx.path("f")).unwrap() == want);
    assert_eq!((f.metadata().unwrap().len(), f.metadata().unwrap().blocks()), (1 << 20, 4096 - 16));
    // ZERO_RANGE: written data in the range reads as zeros at once (the kernel drops its
    // cached pages), the punched block 73 is allocated again; then past the end with and
    // without KEEP_SIZE.
    falloc(libc::FALLOC_FL_ZERO_RANGE, 300_100, 20_000).unwrap();
    want[300_100..310_000].fill(0);
    assert!(fs::read(fx.path("f")).unwrap() == want);
    assert_eq!((f.metadata().unwrap().len(), f.metadata().unwrap().blocks()), (1 << 20, 4096 - 8));
    falloc(libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE, 2 << 20, 8192).unwrap();
    assert_eq!((f.metadata().unwrap().len(), f.metadata().unwrap().blocks()), (1 << 20, 4096 + 8));
    falloc(libc::FALLOC_FL_ZERO_RANGE, (1 << 20) + 100, 50).unwrap();
    want.resize((1 << 20) + 150, 0);
    assert!(fs::read(fx.path("f")).unwrap() == want);

    // Everything survives a remount, and the image checks clean.
    drop(f);
    fx.remount();
    let m = fs::metadata(fx.path("f")).unwrap();
    assert_eq!((m.len(), m.blocks()), ((1 << 20) + 150, 4096 + 8));
    assert!(fs::read(fx.path("f")).unwrap() == want);
    fx.unmount();
    assert_fsck_clean(&fx.image);
}

#[test]
fn hard_links_and_link_counts() {
    let Some(fx) = Fixture::new("links", |_| {}) else { return };
    let nlink = |p: &str| fs::symlink_metadata(fx.path(p)).unwrap().nlink();
    assert_eq!(nlink(""), 2);
    fs::create_dir_all(fx.path("a/b")).unwrap();
    fs::create_dir(fx.path("c")).unwrap();
    // A directory's count: its entry in the parent, its ".", and each subdirectory's "..".
    assert_eq!((nlink(""), nlink("a"), nlink("a/b"), nlink("c")), (4, 3, 2, 2));
    fs::write(fx.path("a/f"), b"data").unwrap();
    assert_eq!(nlink("a"), 3, "files do not count");
    let ctime0 = fs::metadata(fx.path("a/f")).unwrap().ctime_nsec() as i128
        + fs::metadata(fx.path("a/f")).unwrap().ctime() as i128 * 1_000_000_000;
    std::thread::sleep(Duration::from_millis(20));
    fs::hard_link(fx.path("a/f"), fx.path("c/g")).unwrap();
    fs::hard_link(fx.path("a/f"), fx.path("a/b/h")).unwrap();
    let m = fs::metadata(fx.path("c/g")).unwrap();
    assert_eq!((m.nlink(), m.ino()), (3, fs::metadata(fx.path("a/f")).unwrap().ino()));
    assert!(m.ctime() as i128 * 1_000_000_000 + m.ctime_nsec() as i128 > ctime0, "link must update ctime");
    // One inode: a write through one name is seen through the others.
    OpenOptions::new().write(true).open(fx.path("c/g")).unwrap().write_all(b"DA").unwrap();
    assert_eq!(fs::read(fx.path("a/b/h")).unwrap(), b"DAta");
    // Failures.
    assert_eq!(errno(fs::hard_link(fx.path("a/f"), fx.path("c/g"))), libc::EEXIST);
    assert_eq!(errno(fs::hard_link(fx.path("nope"), fx.path("c/x"))), libc::ENOENT);
    assert_eq!(errno(fs::hard_link(fx.path("a"), fx.path("c/dirlink"))), libc::EPERM);
    assert_eq!(errno(fs::hard_link(fx.path("a/f"), fx.path("nodir/x"))), libc::ENOENT);
    // Dropping names.
    fs::remove_file(fx.path("a/f")).unwrap();
    assert_eq!(nlink("c/g"), 2);
    // Renaming one link over another name of the same inode does nothing (POSIX).
    fs::rename(fx.path("c/g"), fx.path("a/b/h")).unwrap();
    assert!(fx.path("c/g").exists() && fx.path("a/b/h").exists());
    assert_eq!(nlink("c/g"), 2);
    fs::remove_file(fx.path("a/b/h")).unwrap();
    assert_eq!((nlink("c/g"), fs::read(fx.path("c/g")).unwrap()), (1, b"DAta".to_vec()));
    // Directory moves carry their ".." count from one parent to the other.
    fs::rename(fx.path("a/b"), fx.path("c/b")).unwrap();
    assert_eq!((nlink("a"), nlink("c"), nlink("c/b")), (2, 3, 2));
    fs::remove_dir(fx.path("c/b")).unwrap();
    assert_eq!((nlink(""), nlink("c")), (4, 2));
    // An open file whose last name goes shows nlink 0 through the descriptor.
    let open = File::open(fx.path("c/g")).unwrap();
    fs::remove_file(fx.path("c/g")).unwrap();
    assert_eq!(open.metadata().unwrap().nlink(), 0);
}

#[test]
fn symlinks() {
    let Some(fx) = Fixture::new("symlinks", |_| {}) else { return };
    fs::create_dir(fx.path("dir")).unwrap();
    fs::write(fx.path("dir/file"), b"through").unwrap();
    symlink("dir", fx.path("ld")).unwrap();
    symlink("dir/file", fx.path("lf")).unwrap();
    symlink("../dir/file", fx.path("dir/up")).unwrap();
    symlink("missing", fx.path("dangling")).unwrap();
    symlink("loop2", fx.path("loop1")).unwrap();
    symlink("loop1", fx.path("loop2")).unwrap();
    let target = "/".to_string() + &"abc/".repeat(200);
    symlink(&target, fx.path("abs")).unwrap();

    assert_eq!(fs::read(fx.path("ld/file")).unwrap(), b"through");
    assert_eq!(fs::read(fx.path("dir/up")).unwrap(), b"through");
    assert_eq!(fs::read(fx.path("lf")).unwrap(), b"through");
    let m = fs::symlink_metadata(fx.path("lf")).unwrap();
    // lstat: the link itself, its size the length of the target.
    assert!(m.file_type().is_symlink());
    assert_eq!((m.len(), m.mode() & 0o777, m.nlink()), (8, 0o777, 1));
    assert_eq!(fs::symlink_metadata(fx.path("abs")).unwrap().len(), target.len() as u64);
    assert_eq!(fs::read_link(fx.path("abs")).unwrap().to_str().unwrap(), target);
    assert_eq!(errno(fs::read(fx.path("dangling"))), libc::ENOENT);
    assert_eq!(errno(fs::read(fx.path("loop1"))), libc::ELOOP);
    assert_eq!(errno(OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW).open(fx.path("lf"))), libc::ELOOP);
    assert_eq!(errno(fs::read_link(fx.path("dir/file"))), libc::EINVAL);
    // Symlink creation over an existing name, and an empty target.
    assert_eq!(errno(symlink("x", fx.path("lf"))), libc::EEXIST);
    assert_eq!(errno(symlink("", fx.path("empty"))), libc::ENOENT);
    // Removing or renaming a link leaves its target alone.
    fs::rename(fx.path("lf"), fx.path("dir/lf2")).unwrap();
    assert_eq!(fs::read_link(fx.path("dir/lf2")).unwrap().to_str().unwrap(), "dir/file");
    assert_eq!(
        errno(fs::read(fx.path("dir/lf2"))),
        libc::ENOENT,
        "a relative target resolves from the link's new directory"
    );
    fs::remove_file(fx.path("dir/lf2")).unwrap();
    fs::remove_file(fx.path("ld")).unwrap();
    assert_eq!(fs::read(fx.path("dir/file")).unwrap(), b"through");
    // rmdir through a symlink to a directory: ENOTDIR.
    symlink("dir", fx.path("ld")).unwrap();
    assert_eq!(errno(fs::remove_dir(fx.path("ld"))), libc::ENOTDIR);
    // chown of the link itself (lchown) vs. its target.
    if is_root() {
        std::os::unix::fs::lchown(fx.path("ld"), Some(7), Some(8)).unwrap();
        let (l, t) = (fs::symlink_metadata(fx.path("ld")).unwrap(), fs::metadata(fx.path("dir")).unwrap());
        assert_eq!((l.uid(), l.gid()), (7, 8));
        assert_eq!(t.uid(), 0);
    }
}

#[test]
fn rename_cases() {
    let Some(fx) = Fixture::new("renames", |_| {}) else { return };
    let p = |s: &str| fx.path(s);
    let ino = |s: &str| fs::symlink_metadata(fx.path(s)).unwrap().ino();
    let nlink = |s: &str| fs::symlink_metadata(fx.path(s)).unwrap().nlink();
    fs::create_dir_all(p("a/sub/deeper")).unwrap();
    fs::create_dir(p("empty")).unwrap();
    fs::create_dir(p("full")).unwrap();
    fs::write(p("full/x"), b"x").unwrap();
    fs::write(p("f1"), b"one").unwrap();
    fs::write(p("f2"), b"two").unwrap();

    // A file over a file: the target's inode is gone, the source's takes its name.
    let i1 = ino("f1");
    fs::rename(p("f1"), p("f2")).unwrap();
    assert_eq!((ino("f2"), fs::read(p("f2")).unwrap()), (i1, b"one".to_vec()));
    assert_eq!(errno(fs::metadata(p("f1"))), libc::ENOENT);
    // A directory over an empty directory: replaced; the parent loses one link.
    let (ia, root_links) = (ino("a"), nlink(""));
    fs::rename(p("a"), p("empty")).unwrap();
    assert_eq!((ino("empty"), nlink("")), (ia, root_links - 1));
    assert!(p("empty/sub/deeper").is_dir());
    // The error cases.
    assert_eq!(errno(fs::rename(p("empty"), p("full"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::rename(p("f2"), p("full"))), libc::EISDIR);
    assert_eq!(errno(fs::rename(p("full"), p("f2"))), libc::ENOTDIR);
    assert_eq!(errno(fs::rename(p("empty"), p("empty/sub/deeper/x"))), libc::EINVAL);
    assert_eq!(errno(fs::rename(p("empty"), p("empty/sub"))), libc::EINVAL);
    assert_eq!(errno(fs::rename(p("nope"), p("x"))), libc::ENOENT);
    assert_eq!(errno(fs::rename(p("f2"), p("nodir/x"))), libc::ENOENT);
    assert_eq!(errno(fs::rename(p("f2"), p("f2/x"))), libc::ENOTDIR);
    assert_eq!(errno(fs::rename(p("empty/."), p("x"))), libc::EBUSY);
    // Nothing changed on the failed attempts.
    assert_eq!(fs::read(p("full/x")).unwrap(), b"x");
    assert_eq!(fs::read(p("f2")).unwrap(), b"one");
    // Renaming onto itself succeeds and changes nothing.
    fs::rename(p("f2"), p("f2")).unwrap();
    assert_eq!(fs::read(p("f2")).unwrap(), b"one");
    // Across directories, over a file there; ".." follows a moved directory.
    fs::write(p("full/y"), b"y").unwrap();
    fs::rename(p("f2"), p("full/y")).unwrap();
    assert_eq!(fs::read(p("full/y")).unwrap(), b"one");
    fs::rename(p("empty/sub"), p("full/sub")).unwrap();
    assert_eq!(ino("full/sub/.."), ino("full"));
    assert_eq!((nlink("empty"), nlink("full")), (2, 3));

    // renameat2: RENAME_NOREPLACE.
    fs::write(p("n1"), b"n1").unwrap();
    fs::write(p("n2"), b"n2").unwrap();
    assert_eq!(errno(renameat2(&p("n1"), &p("n2"), libc::RENAME_NOREPLACE)), libc::EEXIST);
    assert_eq!(errno(renameat2(&p("n1"), &p("full"), libc::RENAME_NOREPLACE)), libc::EEXIST);
    renameat2(&p("n1"), &p("n3"), libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(fs::read(p("n3")).unwrap(), b"n1");
    // RENAME_EXCHANGE: two files; a file and a directory in different parents (link counts
    // and ".." follow); into its own subdirectory is EINVAL; a missing side is ENOENT.
    renameat2(&p("n2"), &p("n3"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!((fs::read(p("n2")).unwrap(), fs::read(p("n3")).unwrap()), (b"n1".to_vec(), b"n2".to_vec()));
    let (iff, isub) = (ino("n2"), ino("full/sub"));
    let (root_links, full_links) = (nlink(""), nlink("full"));
    renameat2(&p("n2"), &p("full/sub"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!((ino("n2"), ino("full/sub")), (isub, iff));
    assert!(p("n2").is_dir() && p("full/sub").is_file());
    assert_eq!((nlink(""), nlink("full")), (root_links + 1, full_links - 1));
    assert_eq!(ino("n2/.."), ino(""));
    assert_eq!(errno(renameat2(&p("full"), &p("full/sub"), libc::RENAME_EXCHANGE)), libc::EINVAL);
    assert_eq!(errno(renameat2(&p("n3"), &p("absent"), libc::RENAME_EXCHANGE)), libc::ENOENT);
    assert_eq!(errno(renameat2(&p("n3"), &p("full/y"), libc::RENAME_EXCHANGE | libc::RENAME_NOREPLACE)), libc::EINVAL);
    // Two directories with contents swap.
    fs::create_dir(p("x1")).unwrap();
    fs::write(p("x1/in1"), b"").unwrap();
    renameat2(&p("x1"), &p("full"), libc::RENAME_EXCHANGE).unwrap();
    assert!(p("x1/x").is_file() && p("full/in1").is_file());
}

#[test]
fn utimensat_now_and_omit() {
    let Some(fx) = multi_user_fixture("utimens") else { return };
    let f = fx.path("f");
    fs::write(&f, b"").unwrap();
    let set = |path: &Path, at: (i64, i64), mt: (i64, i64)| {
        let ts = [libc::timespec { tv_sec: at.0, tv_nsec: at.1 }, libc::timespec { tv_sec: mt.0, tv_nsec: mt.1 }];
        check(unsafe { libc::utimensat(libc::AT_FDCWD, cpath(path).as_ptr(), ts.as_ptr(), 0) })
    };
    let times = |path: &Path| {
        let m = fs::metadata(path).unwrap();
        ((m.atime(), m.atime_nsec()), (m.mtime(), m.mtime_nsec()), (m.ctime(), m.ctime_nsec()))
    };
    set(&f, (1_000, 1), (2_000, 2)).unwrap();
    let (a, m, c0) = times(&f);
    assert_eq!((a, m), ((1_000, 1), (2_000, 2)));
    std::thread::sleep(Duration::from_millis(20));
    // UTIME_OMIT leaves that time alone; the other is set; ctime moves.
    set(&f, (3_000, 3), (0, libc::UTIME_OMIT)).unwrap();
    let (a, m, c1) = times(&f);
    assert_eq!((a, m), ((3_000, 3), (2_000, 2)));
    assert!(c1 > c0, "ctime must change");
    set(&f, (0, libc::UTIME_OMIT), (4_000, 4)).unwrap();
    assert_eq!(times(&f).0, (3_000, 3));
    assert_eq!(times(&f).1, (4_000, 4));
    // UTIME_NOW: the current time, to within a few seconds, the other one omitted.
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    set(&f, (0, libc::UTIME_OMIT), (0, libc::UTIME_NOW)).unwrap();
    let (a, m, _) = times(&f);
    assert_eq!(a, (3_000, 3));
    assert!((m.0 - now).abs() <= 5, "mtime {m:?} is not now ({now})");
    set(&f, (0, libc::UTIME_NOW), (0, libc::UTIME_OMIT)).unwrap();
    assert!((times(&f).0 .0 - now).abs() <= 5);
    // Times before 1970 and with nanoseconds survive.
    set(&f, (-86_400, 999_999_999), (-1, 0)).unwrap();
    assert_eq!((times(&f).0, times(&f).1), ((-86_400, 999_999_999), (-1, 0)));
    // A non-owner with write permission may set both to now, but not to a chosen time;
    // without write permission, not even to now.
    chmod(&f, 0o666);
    as_user(1000, 1000, &[], || {
        set(&f, (0, libc::UTIME_NOW), (0, libc::UTIME_NOW)).unwrap();
        assert_eq!(errno(set(&f, (5, 0), (5, 0))), libc::EPERM);
    });
    assert!((times(&f).1 .0 - now).abs() <= 5);
    chmod(&f, 0o644);
    as_user(1000, 1000, &[], || assert_eq!(errno(set(&f, (0, libc::UTIME_NOW), (0, libc::UTIME_NOW))), libc::EACCES));
    // The times persist.
    set(&f, (11, 12), (13, 14)).unwrap();
    drop(fx_remount_check(fx, &f, ((11, 12), (13, 14))));
}

/// With the writeback cache, written data reaches the daemon after `write(2)` has returned
/// (at close, fsync or the kernel's writeback), and the kernel keeps mtime, ctime and the
/// size meanwhile. Times set while the pages are dirty (as `tar` and `cp -p` do right after
/// writing) must survive their writeback; a write's own mtime (the kernel's, at `write(2)`)
/// must be the one kept; sizes the kernel reports are the written ones throughout.
#[test]
fn times_and_size_survive_delayed_writeback() {
    let Some(fx) = Fixture::new("wbtimes", |_| {}) else { return };
    let (f, g) = (fx.path("f"), fx.path("g"));
    let mut file = File::create(&f).unwrap();
    file.write_all(&[7; 10_000]).unwrap();
    assert_eq!(file.metadata().unwrap().len(), 10_000, "size while the pages are dirty");
    let ts = [libc::timespec { tv_sec: 1_000, tv_nsec: 1 }, libc::timespec { tv_sec: 2_000, tv_nsec: 2 }];
    check(unsafe { libc::futimens(file.as_raw_fd(), ts.as_ptr()) }).unwrap();
    drop(file);
    let m = fs::metadata(&f).unwrap();
    assert_eq!(((m.mtime(), m.mtime_nsec()), m.len()), ((2_000, 2), 10_000), "after close");
    let mut file = File::create(&g).unwrap();
    file.write_all(b"data").unwrap();
    let written = fs::metadata(&g).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    drop(file);
    let closed = fs::metadata(&g).unwrap();
    assert_eq!((closed.mtime(), closed.mtime_nsec()), (written.mtime(), written.mtime_nsec()), "close moved mtime");
    let fx = fx_remount_check(fx, &f, ((1_000, 1), (2_000, 2)));
    assert_eq!(fs::metadata(&f).unwrap().len(), 10_000);
    let m = fs::metadata(&g).unwrap();
    assert_eq!((m.mtime(), m.mtime_nsec(), m.len()), (written.mtime(), written.mtime_nsec(), 4), "after remount");
    drop(fx);
}

/// Unlinking a closed file (and renaming over one) with the writeback cache: the kernel
/// stamps the file's ctime and at once sends its times (`fuse_update_ctime`, a SETATTR of
/// mtime and ctime) for an inode the daemon has just freed; an error there is recorded
/// against the mount and `syncfs` reports it later, so a plain `rm` or `mv`, or `tar`
/// replacing its placeholder files, made `sync -f` fail with ESTALE.
#[test]
fn unlinked_closed_files_leave_no_writeback_error() {
    let Some(fx) = Fixture::new("wbunlink", |_| {}) else { return };
    let (f, g) = (fx.path("f"), fx.path("g"));
    fs::write(&f, b"data").unwrap();
    fs::write(&g, b"other").unwrap();
    fs::rename(&g, &f).unwrap();
    fs::remove_file(&f).unwrap();
    fs::write(&g, b"").unwrap();
    fs::remove_file(&g).unwrap();
    let dir = File::open(fx.path("")).unwrap();
    check(unsafe { libc::syncfs(dir.as_raw_fd()) }).expect("syncfs after unlinks");
    assert!(fx.path("").read_dir().unwrap().next().is_none());
}

fn fx_remount_check(mut fx: Fixture, f: &Path, want: ((i64, i64), (i64, i64))) -> Fixture {
    fx.remount();
    let m = fs::metadata(f).unwrap();
    assert_eq!(((m.atime(), m.atime_nsec()), (m.mtime(), m.mtime_nsec())), want);
    fx
}

fn fixture_with_options(name: &str, options: &[&str]) -> Option<Fixture> {
    Fixture::new(name, |c| c.options = options.iter().map(|o| o.to_string()).collect())
}

/// Wait until the free block and inode counts are `base`'s again (the kernel forgets an
/// evicted inode asynchronously).
fn wait_freed(mnt: &Path, base: &libc::statvfs, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = statvfs(mnt);
        if (now.f_bfree, now.f_ffree) == (base.f_bfree, base.f_ffree) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: {} of {} inodes free", now.f_ffree, base.f_ffree);
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A directory removed while open: its descriptor still works (fstat shows no links, a
/// listing finds it dead, ENOENT, as the VFS says of every removed directory), it is freed
/// at the last close, not before, and the image stays consistent; with and without OPENDIR.
#[test]
fn directory_removed_while_open() {
    for options in [&[][..], &["noatime"]] {
        let name = format!("rmdir-open{}", options.join(""));
        let Some(mut fx) = fixture_with_options(&name, options) else { return };
        let base = statvfs(&fx.mnt);
        fs::create_dir(fx.path("d")).unwrap();
        fs::write(fx.path("d/f"), b"x").unwrap();
        let dir = File::open(fx.path("d")).unwrap();
        fs::remove_file(fx.path("d/f")).unwrap();
        fs::remove_dir(fx.path("d")).unwrap();
        assert_eq!(errno(fs::metadata(fx.path("d"))), libc::ENOENT);
        let md = dir.metadata().unwrap();
        assert!(md.is_dir() && md.nlink() == 0, "{options:?}: fstat of the removed directory: {md:?}");
        let mut buf = [0u8; 4096];
        let rc = unsafe { libc::syscall(libc::SYS_getdents64, dir.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
        assert_eq!(errno(check(rc as i32)), libc::ENOENT, "{options:?}: getdents on a removed directory");
        // Still held: its inode stays in use until the close.
        std::thread::sleep(Duration::from_millis(100));
        assert!(statvfs(&fx.mnt).f_ffree < base.f_ffree, "{options:?}: freed while open");
        drop(dir);
        wait_freed(&fx.mnt, &base, &format!("{options:?}: directory not freed after its last close"));
        fx.unmount();
        assert_fsck_clean(&fx.image);
    }
}

/// A directory of 5,000 entries listed whole, again (from the kernel's cache when OPENDIR is
/// skipped), and after changes made in it, which the next listing must show; with and
/// without OPENDIR.
#[test]
fn large_directory_listed_again_after_changes() {
    for options in [&[][..], &["noatime"]] {
        let name = format!("bigdir{}", options.join(""));
        let Some(fx) = fixture_with_options(&name, options) else { return };
        let d = fx.path("d");
        fs::create_dir(&d).unwrap();
        let mut expected: Vec<String> = (0..5000).map(|i| format!("entry-with-a-longish-name-{i:05}")).collect();
        for n in &expected {
            File::create(d.join(n)).unwrap();
        }
        let list = || {
            let mut names: Vec<String> =
                fs::read_dir(&d).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
            names.sort();
            names
        };
        assert_eq!(list(), expected, "{options:?}: first listing");
        assert_eq!(list(), expected, "{options:?}: second listing");
        fs::remove_file(d.join(&expected[17])).unwrap();
        fs::rename(d.join(&expected[42]), d.join("renamed")).unwrap();
        File::create(d.join("added")).unwrap();
        expected.retain(|n| n != "entry-with-a-longish-name-00017" && n != "entry-with-a-longish-name-00042");
        expected.extend(["added".to_string(), "renamed".to_string()]);
        expected.sort();
        assert_eq!(list(), expected, "{options:?}: listing after changes");
    }
}

/// (seconds, nanoseconds) of a file's atime and mtime, as `stat` shows them.
fn atime_mtime(p: &Path) -> ((i64, i64), (i64, i64)) {
    let m = fs::metadata(p).unwrap();
    ((m.atime(), m.atime_nsec()), (m.mtime(), m.mtime_nsec()))
}

/// A file of whole pages (a write leaves them in the kernel's page cache, whence a read
/// would be served without the daemon) and a directory with an entry, both just changed;
/// then a moment, so that "now" is past their times.
fn atime_files(fx: &Fixture) -> (PathBuf, PathBuf) {
    let (f, d) = (fx.path("f"), fx.path("d"));
    fs::write(&f, ATIME_DATA).unwrap();
    fs::create_dir(&d).unwrap();
    fs::write(d.join("x"), b"").unwrap();
    std::thread::sleep(Duration::from_millis(20));
    (f, d)
}

const ATIME_DATA: &[u8] = &[7; 8192];

fn atime_fixture(name: &str, options: &str) -> Option<Fixture> {
    Fixture::new(name, |c| c.options = vec![options.to_string()])
}

/// relatime, the default and `-o relatime`: a read after a write sets atime, and `stat`
/// shows it at once (the attribute cache must not hide it); a second read changes nothing;
/// a listing sets a directory's atime after a change in it; all kept across a remount.
#[test]
fn atime_relatime_by_default_and_as_an_option() {
    for options in ["", "relatime"] {
        let Some(mut fx) = atime_fixture(&format!("atime-rel{options}"), options) else { return };
        let (f, d) = atime_files(&fx);
        let (before, _) = atime_mtime(&f);
        assert_eq!(fs::read(&f).unwrap(), ATIME_DATA);
        let (read, mtime) = atime_mtime(&f);
        assert!(
            read > mtime && read > before,
            "-o {options:?}: a read after a write sets atime ({read:?}, mtime {mtime:?})"
        );
        std::thread::sleep(Duration::from_millis(20));
        fs::read(&f).unwrap();
        assert_eq!(atime_mtime(&f).0, read, "-o {options:?}: a second read leaves atime");
        let (dir_before, _) = atime_mtime(&d);
        assert_eq!(fs::read_dir(&d).unwrap().count(), 1);
        let (listed, dir_mtime) = atime_mtime(&d);
        assert!(listed > dir_mtime && listed > dir_before, "-o {options:?}: a listing sets the directory's atime");
        // Written again, then read after a remount: the new atime was logged and is kept.
        fs::write(&f, [8; 8192]).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        fs::read(&f).unwrap();
        let again = atime_mtime(&f).0;
        assert!(again > read);
        fx.remount();
        assert_eq!((atime_mtime(&f).0, atime_mtime(&d).0), (again, listed), "-o {options:?}: kept across a remount");
    }
}

#[test]
fn atime_strictatime_updates_on_every_read() {
    let Some(fx) = atime_fixture("atime-strict", "strictatime") else { return };
    let (f, d) = atime_files(&fx);
    let (mut file, mut dir) = (atime_mtime(&f).0, atime_mtime(&d).0);
    for n in 0..3 {
        std::thread::sleep(Duration::from_millis(20));
        fs::read(&f).unwrap();
        fs::read_dir(&d).unwrap().count();
        let now = (atime_mtime(&f).0, atime_mtime(&d).0);
        assert!(now.0 > file && now.1 > dir, "read {n}: {now:?} after {:?}", (file, dir));
        (file, dir) = now;
    }
}

#[test]
fn atime_noatime_and_nodiratime() {
    let Some(mut fx) = atime_fixture("atime-noatime", "noatime") else { return };
    let (f, d) = atime_files(&fx);
    let before = (atime_mtime(&f).0, atime_mtime(&d).0);
    fs::read(&f).unwrap();
    fs::read_dir(&d).unwrap().count();
    assert_eq!((atime_mtime(&f).0, atime_mtime(&d).0), before, "noatime");
    fx.remount();
    assert_eq!((atime_mtime(&f).0, atime_mtime(&d).0), before, "noatime, remounted");
    drop(fx);

    let Some(fx) = atime_fixture("atime-nodiratime", "nodiratime") else { return };
    let (f, d) = atime_files(&fx);
    let before = (atime_mtime(&f).0, atime_mtime(&d).0);
    fs::read(&f).unwrap();
    fs::read_dir(&d).unwrap().count();
    let after = (atime_mtime(&f).0, atime_mtime(&d).0);
    assert!(after.0 > before.0, "nodiratime: a file's read still sets its atime");
    assert_eq!(after.1, before.1, "nodiratime: a listing leaves the directory's atime");
}

#[test]
fn atime_read_only_mount_never_updates() {
    let Some(mut fx) = atime_fixture("atime-ro", "strictatime") else { return };
    let (f, d) = atime_files(&fx);
    fx.unmount();
    fx.cfg.read_only = true;
    fx.mount().unwrap();
    let before = (atime_mtime(&f).0, atime_mtime(&d).0);
    fs::read(&f).unwrap();
    fs::read_dir(&d).unwrap().count();
    assert_eq!((atime_mtime(&f).0, atime_mtime(&d).0), before);
}

#[test]
fn xattr_namespaces() {
    let Some(mut fx) = multi_user_fixture("xattrns") else { return };
    let f = fx.path("f");
    fs::write(&f, b"").unwrap();
    chmod(&f, 0o644);
    for (name, value) in [("user.u", &b"U"[..]), ("trusted.t", b"T"), ("security.s", b"S"), ("user.empty", b"")] {
        setxattr(&f, name, value, 0).unwrap();
        assert_eq!(getxattr(&f, name).unwrap(), value);
    }
    assert_eq!(listxattr(&f), ["security.s", "trusted.t", "user.empty", "user.u"]);
    // Flags: XATTR_CREATE on an existing name, XATTR_REPLACE on a missing one.
    assert_eq!(errno(setxattr(&f, "user.u", b"x", libc::XATTR_CREATE)), libc::EEXIST);
    assert_eq!(errno(setxattr(&f, "user.none", b"x", libc::XATTR_REPLACE)), libc::ENODATA);
    setxattr(&f, "trusted.t", b"T2", libc::XATTR_REPLACE).unwrap();
    assert_eq!(getxattr(&f, "trusted.t").unwrap(), b"T2");
    assert_eq!(errno(getxattr(&f, "user.none")), libc::ENODATA);
    assert_eq!(errno(removexattr(&f, "user.none")), libc::ENODATA);
    // Names outside the stored namespaces, and a bare prefix.
    assert_eq!(errno(setxattr(&f, "bogus.x", b"x", 0)), libc::EOPNOTSUPP);
    assert_eq!(errno(setxattr(&f, "system.x", b"x", 0)), libc::EOPNOTSUPP);
    assert_eq!(errno(getxattr(&f, "bogus.x")), libc::EOPNOTSUPP);
    assert_eq!(errno(removexattr(&f, "bogus.x")), libc::EOPNOTSUPP);
    assert_eq!(errno(setxattr(&f, "user.", b"x", 0)), libc::EINVAL);
    // Names are case-sensitive and values binary.
    setxattr(&f, "user.U", &[0, 255, 0], 0).unwrap();
    assert_eq!(getxattr(&f, "user.U").unwrap(), [0, 255, 0]);
    assert_eq!(getxattr(&f, "user.u").unwrap(), b"U");

    // Another user: may read user.*, not write it without write permission on the file;
    // trusted.* and security.* writes need privileges.
    as_user(1000, 1000, &[], || {
        assert_eq!(getxattr(&f, "user.u").unwrap(), b"U");
        assert_eq!(errno(setxattr(&f, "user.u", b"x", 0)), libc::EACCES);
        assert_eq!(errno(removexattr(&f, "user.u")), libc::EACCES);
        assert_eq!(errno(setxattr(&f, "trusted.t", b"x", 0)), libc::EPERM);
        assert_eq!(errno(getxattr(&f, "trusted.t")), libc::ENODATA, "trusted.* is invisible without CAP_SYS_ADMIN");
        assert_eq!(
            listxattr(&f),
            ["security.s", "user.U", "user.empty", "user.u"],
            "trusted.* is not listed without CAP_SYS_ADMIN"
        );
        assert_eq!(errno(setxattr(&f, "security.s", b"x", 0)), libc::EPERM);
    });
    chmod(&f, 0o666);
    as_user(1000, 1000, &[], || setxattr(&f, "user.u", b"by 1000", 0).unwrap());
    assert_eq!(getxattr(&f, "user.u").unwrap(), b"by 1000");
    // user.* on a symlink is not allowed (only files and directories carry them); trusted.*
    // is, and lsetxattr sets it on the link itself.
    symlink("f", fx.path("l")).unwrap();
    assert_eq!(errno(setxattr(&fx.path("l"), "user.x", b"x", 0)), libc::EPERM);
    setxattr(&fx.path("l"), "trusted.onlink", b"L", 0).unwrap();
    assert_eq!(listxattr(&fx.path("l")), ["trusted.onlink"]);
    // On a directory.
    fs::create_dir(fx.path("d")).unwrap();
    setxattr(&fx.path("d"), "user.dir", b"D", 0).unwrap();
    removexattr(&f, "user.U").unwrap();
    removexattr(&f, "security.s").unwrap();

    fx.remount();
    let f = fx.path("f");
    assert_eq!(listxattr(&f), ["trusted.t", "user.empty", "user.u"]);
    assert_eq!(getxattr(&f, "trusted.t").unwrap(), b"T2");
    assert_eq!(getxattr(&fx.path("l"), "trusted.onlink").unwrap(), b"L");
    assert_eq!(getxattr(&fx.path("d"), "user.dir").unwrap(), b"D");
}

#[test]
fn sparse_files_seek_data_and_hole() {
    let Some(fx) = Fixture::new("seekhole", |_| {}) else { return };
    const BS: u64 = 4096;
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(fx.path("s")).unwrap();
    let fd = f.as_raw_fd();
    let lseek = |off: u64, whence| {
        let r = unsafe { libc::lseek(fd, off as i64, whence) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r as u64)
        }
    };
    // An empty file: no data, and no hole at or past the end either.
    assert_eq!(errno(lseek(0, libc::SEEK_DATA)), libc::ENXIO);
    assert_eq!(errno(lseek(0, libc::SEEK_HOLE)), libc::ENXIO);
    // A file that is all hole.
    f.set_len(10 * BS).unwrap();
    assert_eq!(errno(lseek(0, libc::SEEK_DATA)), libc::ENXIO);
    assert_eq!(lseek(0, libc::SEEK_HOLE).unwrap(), 0);
    assert_eq!(lseek(5 * BS + 1, libc::SEEK_HOLE).unwrap(), 5 * BS + 1);
    // Data in blocks 1, 3..=5, 9 (the last, partly).
    let data_blocks = [1u64, 3, 4, 5, 9];
    for b in data_blocks {
        let rc = unsafe { libc::pwrite(fd, [b as u8 + 1; 100].as_ptr().cast(), 100, (b * BS + 7) as i64) };
        assert_eq!(check_size(rc).unwrap(), 100);
    }
    assert_eq!(f.metadata().unwrap().len(), 10 * BS);
    // Every offset: SEEK_DATA is the start of the next data block (or the offset itself
    // inside one), SEEK_HOLE the start of the next hole (the end of the file counts as one).
    for off in (0..10 * BS).step_by(512) {
        let b = off / BS;
        let next_data = data_blocks.iter().find(|&&d| d >= b).map(|&d| (d * BS).max(off));
        match next_data {
            Some(d) => assert_eq!(lseek(off, libc::SEEK_DATA).unwrap(), d, "SEEK_DATA from {off}"),
            None => assert_eq!(errno(lseek(off, libc::SEEK_DATA)), libc::ENXIO, "SEEK_DATA from {off}"),
        }
        let next_hole = (b..10).find(|x| !data_blocks.contains(x)).map_or(10 * BS, |h| (h * BS).max(off));
        assert_eq!(lseek(off, libc::SEEK_HOLE).unwrap(), next_hole, "SEEK_HOLE from {off}");
    }
    assert_eq!(errno(lseek(10 * BS, libc::SEEK_DATA)), libc::ENXIO);
    assert_eq!(errno(lseek(10 * BS, libc::SEEK_HOLE)), libc::ENXIO);
    // Holes read as zeros; st_blocks counts only what is allocated.
    let mut buf = vec![1u8; (10 * BS) as usize];
    let rc = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    assert_eq!(check_size(rc).unwrap(), buf.len());
    for (i, &byte) in buf.iter().enumerate() {
        let (b, o) = (i as u64 / BS, i as u64 % BS);
        let want = if data_blocks.contains(&b) && (7..107).contains(&o) { b as u8 + 1 } else { 0 };
        assert_eq!(byte, want, "byte {i}");
    }
    assert_eq!(f.metadata().unwrap().blocks(), 5 * BS / 512);
    // Truncating into the data and extending again leaves a hole behind.
    f.set_len(4 * BS + 50).unwrap();
    f.set_len(20 * BS).unwrap();
    assert_eq!(lseek(4 * BS, libc::SEEK_HOLE).unwrap(), 5 * BS);
    assert_eq!(errno(lseek(5 * BS, libc::SEEK_DATA)), libc::ENXIO);
    let rc = unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), 100, (4 * BS) as i64) };
    assert_eq!(check_size(rc).unwrap(), 100);
    assert_eq!(&buf[..7], &[0; 7]);
    assert_eq!(&buf[7..50], &[5u8; 43]);
    assert!(buf[50..100].iter().all(|&b| b == 0), "bytes cut by the truncate must read as zeros");
}

#[test]
fn statfs_and_open_unlinked_files() {
    statfs_and_open_unlinked_files_with("statfs", &[]);
}

/// As above with `noatime`, where the kernel opens files and directories without asking the
/// daemon (no OPEN, no RELEASE): the kernel's lookup count alone keeps unlinked files.
#[test]
fn statfs_and_open_unlinked_files_without_open() {
    statfs_and_open_unlinked_files_with("statfs-noopen", &["noatime"]);
}

fn statfs_and_open_unlinked_files_with(name: &str, options: &[&str]) {
    let Some(mut fx) = fixture_with_options(name, options) else { return };
    let st = statvfs(&fx.mnt);
    assert_eq!((st.f_bsize, st.f_frsize, st.f_namemax), (4096, 4096, 255));
    assert!(st.f_blocks * st.f_frsize <= IMAGE_SIZE && st.f_blocks * st.f_frsize > IMAGE_SIZE / 2);
    assert!(st.f_bavail <= st.f_bfree && st.f_bfree < st.f_blocks && st.f_ffree < st.f_files);
    // fstatfs on a file agrees.
    fs::write(fx.path("small"), b"").unwrap();
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::fstatfs(File::open(fx.path("small")).unwrap().as_raw_fd(), &mut sf) }).unwrap();
    assert_eq!(sf.f_blocks as u64, st.f_blocks);
    assert_eq!(sf.f_type, 0x6573_5546, "FUSE_SUPER_MAGIC");

    // 16 MiB of data: at least that many blocks leave the free count, one inode per file.
    let base = statvfs(&fx.mnt);
    let data = vec![0xa5u8; 16 << 20];
    let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(fx.path("big")).unwrap();
    f.write_all(&data).unwrap();
    fs::hard_link(fx.path("big"), fx.path("big2")).unwrap();
    let full = statvfs(&fx.mnt);
    assert!(base.f_bfree - full.f_bfree >= 4096, "16 MiB used {} blocks", base.f_bfree - full.f_bfree);
    assert!(base.f_bfree - full.f_bfree < 4096 + 64, "16 MiB used {} blocks", base.f_bfree - full.f_bfree);
    assert_eq!(base.f_ffree - full.f_ffree, 1);
    assert_eq!(full.f_files, base.f_files);
    // Both names gone, two descriptors open: the space stays in use until the last close.
    let second = File::open(fx.path("big2")).unwrap();
    fs::remove_file(fx.path("big")).unwrap();
    fs::remove_file(fx.path("big2")).unwrap();
    assert_eq!(fs::read_dir(&fx.mnt).unwrap().count(), 1);
    f.seek(SeekFrom::Start(1 << 20)).unwrap();
    f.write_all(b"still writable").unwrap();
    drop(f);
    let mut back = vec![0u8; 14];
    let rc = unsafe { libc::pread(second.as_raw_fd(), back.as_mut_ptr().cast(), 14, 1 << 20) };
    assert_eq!(check_size(rc).unwrap(), 14);
    assert_eq!(back, b"still writable");
    // The release of the first descriptor must not free it: wait for it to be processed.
    std::thread::sleep(Duration::from_millis(200));
    let during = statvfs(&fx.mnt);
    assert_eq!((during.f_bfree, during.f_ffree), (full.f_bfree, full.f_ffree), "freed while a descriptor is open");
    drop(second);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = statvfs(&fx.mnt);
        if (now.f_bfree, now.f_ffree) == (base.f_bfree, base.f_ffree) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "space not returned after last close: {} of {} blocks",
            now.f_bfree,
            base.f_bfree
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // And it stays returned across a remount (nothing left on the orphan table).
    fx.remount();
    let again = statvfs(&fx.mnt);
    assert_eq!((again.f_bfree, again.f_ffree), (base.f_bfree, base.f_ffree));
}

/// Space df reports available can be allocated, also right after `rm` freed it (its blocks
/// are busy until the checkpoint of the unlink is durable: an allocation that finds no other
/// space forces the log and retries). What `fallocate -l <available - 1 MiB>; rm;
/// fallocate -l <the same>` does, in several rounds; then fsck agrees with the last statfs.
#[test]
fn freed_space_is_allocatable_at_once() {
    let Some(mut fx) = Fixture::new("freed-space", |_| {}) else { return };
    let base = statvfs(&fx.mnt);
    let len = (base.f_bavail * 4096 - (1 << 20)) as i64;
    for round in 0..3 {
        let f = File::create(fx.path("big")).unwrap();
        check(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) })
            .unwrap_or_else(|e| panic!("round {round}: fallocate of {len} bytes: {e}"));
        drop(f);
        fs::remove_file(fx.path("big")).unwrap();
    }
    // The last close's release may still be on its way: the space comes back within moments.
    let deadline = Instant::now() + Duration::from_secs(5);
    while statvfs(&fx.mnt).f_bavail != base.f_bavail {
        assert!(
            Instant::now() < deadline,
            "freed space not reported available: {} of {} blocks",
            statvfs(&fx.mnt).f_bavail,
            base.f_bavail
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let end = statvfs(&fx.mnt);
    fx.unmount();
    let report = assert_fsck_clean(&fx.image);
    let dev = ferrofs::dev::FileDevice::open(&fx.image, true).unwrap();
    let engine = ferrofs::FileSystem::mount_device(
        std::sync::Arc::new(dev),
        &ferrofs::MountOptions { read_only: true, ..Default::default() },
    )
    .unwrap();
    let pool: u64 = engine.info().ags.iter().map(|ag| ag.pool_blocks).sum();
    assert_eq!(
        end.f_blocks - end.f_bfree,
        report.blocks_used + pool,
        "blocks in use: statfs (the pools counted used) against fsck"
    );
    assert_eq!(end.f_files - end.f_ffree - 1, report.inodes, "inodes in use: statfs against fsck");
}

#[test]
fn files_over_4_gib() {
    let Some(mut fx) = Fixture::new("big4g", |_| {}) else { return };
    let path = fx.path("huge");
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    let fd = f.as_raw_fd();
    let pwrite = |data: &[u8], off: u64| {
        check_size(unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), off as i64) }).unwrap()
    };
    let pread = |len: usize, off: u64| {
        let mut b = vec![0xeeu8; len];
        let n = check_size(unsafe { libc::pread(fd, b.as_mut_ptr().cast(), len, off as i64) }).unwrap();
        b.truncate(n);
        b
    };
    // At 5 GiB, straddling 4 GiB (where a 32-bit offset or block number would wrap), and
    // a block-sized pattern across a block boundary past 4 GiB.
    let pattern: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(pwrite(b"at five", 5 * GIB), 7);
    assert_eq!(pwrite(b"across4G", 4 * GIB - 4), 8);
    assert_eq!(pwrite(&pattern, 4 * GIB + 3 * 4096 - 17), pattern.len());
    assert_eq!(f.metadata().unwrap().len(), 5 * GIB + 7);
    let check_all = |pread: &dyn Fn(usize, u64) -> Vec<u8>| {
        assert_eq!(pread(7, 5 * GIB), b"at five");
        assert_eq!(pread(8, 4 * GIB - 4), b"across4G");
        assert_eq!(pread(pattern.len(), 4 * GIB + 3 * 4096 - 17), pattern);
        // What wraps to low offsets must still be hole.
        assert_eq!(pread(16, 4), vec![0; 16]);
        assert_eq!(pread(16, GIB - 4), vec![0; 16]);
        assert_eq!(pread(100, 5 * GIB - 50), [vec![0; 50], b"at five".to_vec()].concat());
        assert!(pread(100, 5 * GIB + 7).is_empty(), "read at EOF");
    };
    check_all(&pread);
    // The metadata-only size change: truncate to just past 4 GiB and back.
    f.set_len(4 * GIB + 2).unwrap();
    assert_eq!(pread(10, 4 * GIB - 4), b"across");
    f.set_len(5 * GIB + 7).unwrap();
    assert_eq!(pread(8, 4 * GIB - 4), b"across\0\0");
    assert_eq!(pread(7, 5 * GIB), vec![0; 7]);
    assert_eq!(pwrite(b"across4G", 4 * GIB - 4), 8);
    assert_eq!(pwrite(b"at five", 5 * GIB), 7);
    assert_eq!(pwrite(&pattern, 4 * GIB + 3 * 4096 - 17), pattern.len());
    f.sync_all().unwrap();
    drop(f);
    fx.remount();
    let f = File::open(&path).unwrap();
    let fd = f.as_raw_fd();
    let pread = |len: usize, off: u64| {
        let mut b = vec![0xeeu8; len];
        let n = check_size(unsafe { libc::pread(fd, b.as_mut_ptr().cast(), len, off as i64) }).unwrap();
        b.truncate(n);
        b
    };
    check_all(&pread);
    assert!(f.metadata().unwrap().blocks() < 64);
}

/// Parse a getdents64 buffer into (name, d_off) pairs.
fn parse_dirents(buf: &[u8]) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let off = i64::from_ne_bytes(buf[pos + 8..pos + 16].try_into().unwrap());
        let reclen = u16::from_ne_bytes(buf[pos + 16..pos + 18].try_into().unwrap()) as usize;
        let name = &buf[pos + 19..pos + reclen];
        let name = &name[..name.iter().position(|&b| b == 0).unwrap()];
        out.push((String::from_utf8(name.to_vec()).unwrap(), off));
        pos += reclen;
    }
    out
}

#[test]
fn readdir_while_the_directory_changes() {
    let Some(fx) = Fixture::new("readdirchg", |_| {}) else { return };
    let dir = fx.path("d");
    fs::create_dir(&dir).unwrap();
    let stable: Vec<String> = (0..1500).map(|i| format!("stable-{i}")).collect();
    for n in &stable {
        File::create(dir.join(n)).unwrap();
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let churned = std::sync::atomic::AtomicU64::new(0);
    std::thread::scope(|s| {
        // Churn: names come and go (so directory leaves split and empty) while we list.
        let churn = s.spawn(|| {
            let mut i = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                for k in 0..50 {
                    File::create(dir.join(format!("churn-{}-{k}", i % 7))).unwrap();
                }
                for k in 0..50 {
                    fs::remove_file(dir.join(format!("churn-{}-{k}", i % 7))).unwrap();
                }
                i += 1;
                churned.fetch_add(100, std::sync::atomic::Ordering::Relaxed);
            }
        });
        // The churn must overlap the listings: wait for its first round, then list (six
        // times at least) until it has done another. On a busy machine six listings could
        // otherwise end before the churn thread first ran.
        while churned.load(std::sync::atomic::Ordering::Relaxed) == 0 {
            assert!(!churn.is_finished(), "the churn thread stopped before its first round");
            std::thread::yield_now();
        }
        let before = churned.load(std::sync::atomic::Ordering::Relaxed);
        let mut pass = 0;
        while pass < 6 || churned.load(std::sync::atomic::Ordering::Relaxed) == before {
            if pass == 10_000 || churn.is_finished() {
                stop.store(true, std::sync::atomic::Ordering::Relaxed);
                panic!("the churn thread made no progress in {pass} listings");
            }
            pass += 1;
            // A small buffer: many getdents64 calls, each resuming from the last cookie
            // while the churn goes on in between.
            let d = File::open(&dir).unwrap();
            let mut counts: HashMap<String, usize> = HashMap::new();
            let mut buf = vec![0u8; 1024];
            loop {
                let n = unsafe { libc::syscall(libc::SYS_getdents64, d.as_raw_fd(), buf.as_mut_ptr(), buf.len()) };
                assert!(n >= 0, "getdents64: {}", io::Error::last_os_error());
                if n == 0 {
                    break;
                }
                for (name, _) in parse_dirents(&buf[..n as usize]) {
                    *counts.entry(name).or_default() += 1;
                }
                std::thread::yield_now();
            }
            for n in stable.iter().map(String::as_str).chain([".", ".."]) {
                assert_eq!(counts.get(n).copied(), Some(1), "pass {pass}: {n} listed {:?} times", counts.get(n));
            }
            let dups: Vec<_> = counts.iter().filter(|(_, &c)| c > 1).collect();
            assert!(dups.is_empty(), "pass {pass}: entries listed twice: {dups:?}");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    // seekdir/telldir: resuming from a remembered position gives the rest exactly once.
    let c = cpath(&dir);
    let dp = unsafe { libc::opendir(c.as_ptr()) };
    assert!(!dp.is_null());
    let mut first = Vec::new();
    let mut pos = 0;
    for i in 0..700 {
        let e = unsafe { libc::readdir(dp) };
        assert!(!e.is_null());
        first.push(unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }.to_string_lossy().into_owned());
        if i == 499 {
            pos = unsafe { libc::telldir(dp) };
        }
    }
    unsafe { libc::seekdir(dp, pos) };
    let mut rest = Vec::new();
    loop {
        let e = unsafe { libc::readdir(dp) };
        if e.is_null() {
            break;
        }
        rest.push(unsafe { std::ffi::CStr::from_ptr((*e).d_name.as_ptr()) }.to_string_lossy().into_owned());
    }
    unsafe { libc::closedir(dp) };
    assert_eq!(&rest[..200], &first[500..]);
    assert_eq!(500 + rest.len(), stable.len() + 2);
}

#[test]
fn mmap_reads_and_writes() {
    let Some(mut fx) = Fixture::new("mmap", |_| {}) else { return };
    let path = fx.path("m");
    const LEN: usize = 3 * 4096 + 100;
    let initial: Vec<u8> = (0..LEN).map(|i| (i % 241) as u8).collect();
    fs::write(&path, &initial).unwrap();
    let f = OpenOptions::new().read(true).write(true).open(&path).unwrap();
    unsafe {
        // A shared read-write mapping: reads see the file, writes reach it.
        let p = libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", io::Error::last_os_error());
        let map = std::slice::from_raw_parts_mut(p.cast::<u8>(), LEN);
        assert_eq!(&map[..], &initial[..]);
        map[10..20].copy_from_slice(b"MAPPED-ONE");
        map[4096 * 3..4096 * 3 + 7].copy_from_slice(b"LASTPG!");
        check(libc::msync(p, LEN, libc::MS_SYNC)).unwrap();
        // A write(2) is visible in the mapping (one page cache).
        let rc = libc::pwrite(f.as_raw_fd(), b"WRITTEN".as_ptr().cast(), 7, 5000);
        assert_eq!(check_size(rc).unwrap(), 7);
        assert_eq!(&map[5000..5007], b"WRITTEN");
        check(libc::munmap(p, LEN)).unwrap();
        // A private mapping's writes stay private.
        let q = libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(q, libc::MAP_FAILED);
        std::slice::from_raw_parts_mut(q.cast::<u8>(), LEN)[0..7].copy_from_slice(b"PRIVATE");
        check(libc::munmap(q, LEN)).unwrap();
    }
    let mut expect = initial.clone();
    expect[10..20].copy_from_slice(b"MAPPED-ONE");
    expect[4096 * 3..4096 * 3 + 7].copy_from_slice(b"LASTPG!");
    expect[5000..5007].copy_from_slice(b"WRITTEN");
    let mut back = Vec::new();
    File::open(&path).unwrap().read_to_end(&mut back).unwrap();
    assert!(back == expect, "read() after msync differs from what was written through the mapping");
    // Grow with ftruncate, then write the new pages through a fresh mapping.
    f.set_len(8 * 4096).unwrap();
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            8 * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let map = std::slice::from_raw_parts_mut(p.cast::<u8>(), 8 * 4096);
        assert!(map[LEN..].iter().all(|&b| b == 0), "the grown part reads as zeros");
        map[7 * 4096..8 * 4096].fill(0x77);
        check(libc::msync(p, 8 * 4096, libc::MS_SYNC)).unwrap();
        check(libc::munmap(p, 8 * 4096)).unwrap();
    }
    drop(f);
    expect.resize(8 * 4096, 0);
    expect[7 * 4096..].fill(0x77);
    // After a remount nothing can come from the kernel's page cache: the mapping's writes
    // reached ferrofs.
    fx.remount();
    assert!(fs::read(&path).unwrap() == expect, "mapped writes lost across remount");
    // A read-only mapping of the remounted file.
    let f = File::open(&path).unwrap();
    unsafe {
        let p = libc::mmap(std::ptr::null_mut(), 8 * 4096, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0);
        assert_ne!(p, libc::MAP_FAILED);
        assert!(std::slice::from_raw_parts(p.cast::<u8>(), 8 * 4096) == &expect[..]);
        check(libc::munmap(p, 8 * 4096)).unwrap();
    }
}

/// The running kernel's (major, minor) version.
fn kernel_release() -> (u32, u32) {
    // SAFETY: uname fills the struct it is given.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    check(unsafe { libc::uname(&mut u) }).unwrap();
    let release = unsafe { std::ffi::CStr::from_ptr(u.release.as_ptr()) }.to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit()).map(|p| p.parse().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Run `path` (a script) with execve in a child forked from an `as_user` thread, which
/// inherits that thread's identity: 0 if it ran, else the errno execve failed with.
fn exec_status(path: &Path) -> i32 {
    let prog = cpath(path);
    let argv = [prog.as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null()];
    // SAFETY: the child calls only execve and _exit (async-signal-safe), on memory prepared
    // before the fork.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            libc::execve(prog.as_ptr(), argv.as_ptr(), envp.as_ptr());
            libc::_exit(*libc::__errno_location());
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        libc::WEXITSTATUS(status)
    }
}

#[test]
fn access_chdir_and_exec_follow_the_mode() {
    let Some(fx) = multi_user_fixture("accessx") else { return };
    let d = fx.path("d");
    fs::create_dir(&d).unwrap();
    let f = d.join("f");
    fs::write(&f, b"#!/bin/sh\nexit 0\n").unwrap();
    chown(&f, 1000, 2000).unwrap();
    chmod(&f, 0o654);
    for (uid, gid, groups, want) in [
        (1000, 1, &[][..], [true, true, false]),
        (3000, 2000, &[], [true, false, true]),
        (3000, 3000, &[2000], [true, false, true]),
        (3000, 3000, &[], [true, false, false]),
    ] {
        as_user(uid, gid, groups, || {
            for (how, ok) in [libc::R_OK, libc::W_OK, libc::X_OK].into_iter().zip(want) {
                assert_eq!(access(&f, how).is_ok(), ok, "uid {uid} groups {groups:?} access {how}");
            }
            access(&f, libc::F_OK).unwrap();
        });
    }
    // Root: read and write anything, execute only what has an x bit.
    chmod(&f, 0o444);
    access(&f, libc::W_OK).unwrap();
    assert_eq!(errno(access(&f, libc::X_OK)), libc::EACCES);
    // execve: the group may run it, "other" may not, though the file has x bits.
    chmod(&f, 0o754);
    as_user(3000, 3000, &[2000], || assert_eq!(exec_status(&f), 0));
    as_user(3000, 3000, &[], || assert_eq!(exec_status(&f), libc::EACCES));
    // chdir asks for search permission.
    chmod(&d, 0o750);
    chown(&d, 1000, 2000).unwrap();
    as_user(3000, 3000, &[], || assert_eq!(errno(std::env::set_current_dir(&d)), libc::EACCES));
    as_user(3000, 3000, &[2000], || std::env::set_current_dir(&d).unwrap());
}

/// execve needs execute permission only (the kernel's open_exec asks for MAY_EXEC alone): a
/// program its runner may execute but not read runs, while opening it to read is refused.
#[test]
fn programs_run_with_execute_permission_alone() {
    let Some(fx) = multi_user_fixture("execonly") else { return };
    let Ok(program) = fs::read("/bin/true") else { return skip("execonly", "no /bin/true to copy") };
    for (mode, owner) in [(0o711, 0), (0o701, 0), (0o111, 0), (0o001, 0), (0o100, 1000)] {
        let f = fx.path(&format!("true-{mode:04o}"));
        fs::write(&f, &program).unwrap();
        chown(&f, owner, 0).unwrap();
        chmod(&f, mode);
        as_user(1000, 1000, &[], || {
            assert_eq!(exec_status(&f), 0, "mode {mode:04o} owner {owner}: exec");
            assert_eq!(errno(fs::read(&f)), libc::EACCES, "mode {mode:04o} owner {owner}: read");
        });
        // No execute bit for the runner's class: refused, whatever "other" or the owner get.
        chmod(&f, if owner == 0 { 0o776 } else { 0o677 });
        as_user(1000, 1000, &[], || assert_eq!(exec_status(&f), libc::EACCES, "mode {mode:04o} owner {owner}: no x"));
    }
}

#[test]
fn names_in_a_directory_that_stops_being_searchable_are_checked_again() {
    let Some(fx) = multi_user_fixture("searchable") else { return };
    let d = fx.path("d");
    fs::create_dir_all(d.join("sub")).unwrap();
    fs::write(d.join("f"), b"data").unwrap();
    // Another user walks through the directory while everyone may: the kernel caches the names.
    as_user(1000, 1000, &[], || {
        assert_eq!(fs::read(d.join("f")).unwrap(), b"data");
        fs::metadata(d.join("sub")).unwrap();
    });
    // Taking search away takes effect for those cached names and below them: at once from
    // Linux 6.16 (the adapter expires every cached name before answering the chmod; see
    // search_permission_taken_away_holds_when_chmod_returns), else as soon as the
    // invalidations sent right after the answer have reached the kernel, so wait for the
    // refusal, boundedly; from then on every walk is refused...
    chmod(&d, 0o700);
    let deadline = Instant::now() + Duration::from_secs(2);
    while as_user(1000, 1000, &[], || fs::metadata(d.join("f")).is_ok()) {
        assert!(Instant::now() < deadline, "a cached name still passes 2 s after its directory lost search permission");
        std::thread::sleep(Duration::from_millis(1));
    }
    as_user(1000, 1000, &[], || {
        assert_eq!(errno(fs::metadata(d.join("f"))), libc::EACCES);
        assert_eq!(errno(fs::read(d.join("f"))), libc::EACCES);
        assert_eq!(errno(fs::metadata(d.join("sub/."))), libc::EACCES);
    });
    // ...while the owner and root still get through, again and again, and what their walks
    // bring into the kernel's cache lets no one else through.
    for _ in 0..3 {
        assert_eq!(fs::read(d.join("f")).unwrap(), b"data");
        fs::metadata(d.join("sub")).unwrap();
        as_user(1000, 1000, &[], || assert_eq!(errno(fs::metadata(d.join("f"))), libc::EACCES));
    }
    // Search without read: known names resolve, the listing is refused.
    chmod(&d, 0o711);
    as_user(1000, 1000, &[], || {
        assert_eq!(fs::read(d.join("f")).unwrap(), b"data");
        assert_eq!(errno(fs::read_dir(&d)), libc::EACCES);
    });
    chmod(&d, 0o755);
    as_user(1000, 1000, &[], || assert_eq!(fs::read_dir(&d).unwrap().count(), 2));
}

/// A chmod that takes search permission away holds from the moment it returns: a walk
/// through a name the kernel cached while the directory was searchable is refused at once
/// (pjdfstest chown/05.t: `chown -1 GID` right after the chmod, by a user in GID through a
/// supplementary group, which the adapter would allow if the request reached it).
#[test]
fn search_permission_taken_away_holds_when_chmod_returns() {
    if !kernel_checks_permissions() && kernel_release() < (6, 16) {
        // The adapter then invalidates the names one by one after the chmod's reply.
        return skip("searchrace", "the kernel expires cached names at once from Linux 6.16 (FUSE_NOTIFY_INC_EPOCH)");
    }
    let Some(fx) = multi_user_fixture("searchrace") else { return };
    let (dir, f) = (fx.path("d"), fx.path("d/f"));
    fs::create_dir(&dir).unwrap();
    fs::write(&f, b"").unwrap();
    chown(&dir, 1000, 1000).unwrap();
    chown(&f, 1000, 1000).unwrap();
    as_user(1000, 3000, &[3000, 2000], || {
        for round in 0..3000 {
            chmod(&dir, 0o755);
            chown(&f, u32::MAX, 2000).unwrap();
            chmod(&dir, 0o644);
            let refused = chown(&f, u32::MAX, 3000).map_err(|e| e.raw_os_error());
            assert_eq!(
                refused,
                Err(Some(libc::EACCES)),
                "round {round}: chown through a directory without search permission"
            );
        }
    });
}

/// The kernel opens FIFOs and sockets without a request to the daemon, so under the mount's
/// default options (the kernel checks permissions) a user without read or write permission
/// is refused there as on any file.
#[test]
fn special_files_open_by_the_mode_under_the_default_options() {
    if !is_root() {
        return skip("specialopen", "acting as other users needs root");
    }
    let Some(fx) = Fixture::new("specialopen", |c| {
        c.allow_other = true;
        c.default_permissions = ferrofs_fuse::MountConfig::new("", "").default_permissions;
    }) else {
        return;
    };
    let (fifo, sock) = (fx.path("fifo"), fx.path("sock"));
    check(unsafe { libc::mkfifo(cpath(&fifo).as_ptr(), 0o600) }).unwrap();
    let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    chmod(&sock, 0o600);
    let open_fifo = |flags: i32| {
        check(unsafe { libc::open(cpath(&fifo).as_ptr(), flags | libc::O_NONBLOCK) }).map(|fd| {
            unsafe { libc::close(fd) };
        })
    };
    let os_errno = |r: io::Result<()>| r.map_err(|e| e.raw_os_error());
    as_user(1000, 1000, &[], || {
        assert_eq!(
            os_errno(open_fifo(libc::O_RDONLY)),
            Err(Some(libc::EACCES)),
            "FIFO 0600 opened for reading by another user"
        );
        assert_eq!(
            os_errno(open_fifo(libc::O_WRONLY)),
            Err(Some(libc::EACCES)),
            "FIFO 0600 opened for writing by another user"
        );
        assert_eq!(
            os_errno(std::os::unix::net::UnixStream::connect(&sock).map(drop)),
            Err(Some(libc::EACCES)),
            "socket 0600 connected to by another user"
        );
    });
    // With the permission, the same opens work (a FIFO's writer needs a reader: ENXIO).
    chmod(&fifo, 0o606);
    chmod(&sock, 0o606);
    as_user(1000, 1000, &[], || {
        open_fifo(libc::O_RDONLY).unwrap();
        assert_eq!(errno(open_fifo(libc::O_WRONLY)), libc::ENXIO);
        std::os::unix::net::UnixStream::connect(&sock).unwrap();
    });
}

#[test]
fn changes_need_their_permissions() {
    let Some(fx) = multi_user_fixture("changes") else { return };
    let shared = fx.path("shared");
    fs::create_dir(&shared).unwrap();
    chown(&shared, 0, 2000).unwrap();
    chmod(&shared, 0o775);
    // Creating and removing in a directory writable through a supplementary group only.
    as_user(3000, 3000, &[], || {
        assert_eq!(errno(fs::write(shared.join("x"), b"")), libc::EACCES);
        assert_eq!(errno(fs::create_dir(shared.join("x"))), libc::EACCES);
        assert_eq!(errno(symlink("t", shared.join("x"))), libc::EACCES);
    });
    as_user(3000, 3000, &[2000], || {
        fs::write(shared.join("x"), b"x").unwrap();
        fs::create_dir(shared.join("xd")).unwrap();
    });
    as_user(4000, 4000, &[], || {
        assert_eq!(errno(fs::remove_file(shared.join("x"))), libc::EACCES);
        assert_eq!(errno(fs::remove_dir(shared.join("xd"))), libc::EACCES);
        assert_eq!(errno(fs::rename(shared.join("x"), shared.join("y"))), libc::EACCES);
        // truncate(2) and open(O_TRUNC) without write permission, and chmod by a non-owner.
        assert_eq!(errno(OpenOptions::new().write(true).truncate(true).open(shared.join("x"))), libc::EACCES);
        let p = cpath(&shared.join("x"));
        assert_eq!(errno(check(unsafe { libc::truncate(p.as_ptr(), 0) })), libc::EACCES);
        assert_eq!(errno(fs::set_permissions(shared.join("x"), fs::Permissions::from_mode(0o777))), libc::EPERM);
    });
    assert_eq!(fs::read(shared.join("x")).unwrap(), b"x");
    // A file opened for writing may be truncated through its descriptor after it is made
    // read-only: the check was at open.
    as_user(3000, 3000, &[], || {
        let w = OpenOptions::new().write(true).open(shared.join("x")).unwrap();
        chmod(&shared.join("x"), 0o444);
        w.set_len(0).unwrap();
    });
    assert_eq!(fs::metadata(shared.join("x")).unwrap().len(), 0);
    // Hard links to someone else's file need read and write permission on it.
    let open = fx.path("open");
    fs::create_dir(&open).unwrap();
    chmod(&open, 0o777);
    fs::write(open.join("roots"), b"").unwrap();
    as_user(4000, 4000, &[], || assert_eq!(errno(fs::hard_link(open.join("roots"), open.join("l"))), libc::EPERM));
    chmod(&open.join("roots"), 0o666);
    as_user(4000, 4000, &[], || fs::hard_link(open.join("roots"), open.join("l")).unwrap());
    // A directory moving to another parent needs write permission on itself (its "..").
    fs::create_dir(open.join("rootdir")).unwrap();
    fs::create_dir(open.join("other")).unwrap();
    chmod(&open.join("other"), 0o777);
    as_user(4000, 4000, &[], || {
        assert_eq!(errno(fs::rename(open.join("rootdir"), open.join("other/rootdir"))), libc::EACCES);
        // Within the same directory its ".." stays: allowed.
        fs::rename(open.join("rootdir"), open.join("rootdir2")).unwrap();
    });
    // user.* xattrs of a sticky directory: only its owner writes them.
    chmod(&open, 0o1777);
    as_user(4000, 4000, &[], || {
        assert_eq!(errno(setxattr(&open, "user.a", b"x", 0)), libc::EPERM);
        assert_eq!(errno(getxattr(&open, "user.a")), libc::ENODATA);
    });
    setxattr(&open, "user.a", b"x", 0).unwrap();
}

// ---- POSIX ACLs ---------------------------------------------------------------------------

/// setfacl/getfacl (the acl package) on `p`; panics with their message on failure.
fn facl(tool: &str, args: &[&str], p: &Path) -> String {
    let out = std::process::Command::new(tool).args(args).arg(p).output().expect(tool);
    assert!(out.status.success(), "{tool} {args:?} {}: {}", p.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn getfacl(p: &Path) -> String {
    facl("getfacl", &["-n", "--omit-header"], p)
}

/// An access ACL in the kernel's xattr form: (tag, id, perm) entries after version 2.
fn acl_xattr(entries: &[(u16, u32, u16)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, id, perm) in entries {
        v.extend(tag.to_le_bytes().iter().chain(&perm.to_le_bytes()).chain(&id.to_le_bytes()));
    }
    v
}

/// What `root` shows of the ACL rules, as lines to compare between file systems: run on a
/// ferrofs mount and on tmpfs (the kernel's own ACLs), the two must agree line for line.
fn acl_observations(root: &Path) -> Vec<String> {
    let mut seen = Vec::new();
    let mut note = |what: &str, value: String| seen.push(format!("{what}: {value}"));
    let may = |uid, groups: &[u32], p: &Path, how| as_user(uid, uid, groups, || access(p, how).is_ok());
    // A named user, allowed and then denied by the mask.
    let f = root.join("f");
    fs::write(&f, b"x").unwrap();
    chown(&f, 1000, 2000).unwrap();
    chmod(&f, 0o640);
    facl("setfacl", &["-m", "u:3000:rw"], &f);
    note("named user", format!("{:o} {}", mode(&f), getfacl(&f)));
    note("3000 rw", format!("{} {}", may(3000, &[], &f, libc::R_OK), may(3000, &[], &f, libc::W_OK)));
    facl("setfacl", &["-m", "m::r"], &f);
    note("mask r", format!("{:o} {}", mode(&f), getfacl(&f)));
    note("3000 rw", format!("{} {}", may(3000, &[], &f, libc::R_OK), may(3000, &[], &f, libc::W_OK)));
    note("group member w", format!("{}", may(4000, &[2000], &f, libc::R_OK)));
    // chmod sets the mask, not the owning group's entry.
    chmod(&f, 0o604);
    note("chmod 604", format!("{:o} {}", mode(&f), getfacl(&f)));
    note("3000 r, mask ---", format!("{}", may(3000, &[], &f, libc::R_OK)));
    chmod(&f, 0o674);
    note("chmod 674", getfacl(&f));
    note("3000 w", format!("{}", may(3000, &[], &f, libc::W_OK)));
    // An ACL the mode can say is stored as the mode alone.
    let g = root.join("g");
    fs::write(&g, b"").unwrap();
    facl("setfacl", &["--set", "u::rw,g::r,o::-"], &g);
    note("minimal", format!("{:o} {}", mode(&g), errno(getxattr(&g, "system.posix_acl_access"))));
    // Raw setxattr of the binary form; then malformed values.
    let named = acl_xattr(&[(1, 0, 7), (2, 5000, 5), (4, 0, 5), (0x10, 0, 7), (0x20, 0, 1)]);
    setxattr(&g, "system.posix_acl_access", &named, 0).unwrap();
    note("raw", format!("{:o} {}", mode(&g), getfacl(&g)));
    let torn = &named[..named.len() - 2];
    note("torn", format!("{}", errno(setxattr(&g, "system.posix_acl_access", torn, 0))));
    let no_mask = acl_xattr(&[(1, 0, 7), (2, 5000, 5), (4, 0, 5), (0x20, 0, 1)]);
    note("no mask", format!("{}", errno(setxattr(&g, "system.posix_acl_access", &no_mask, 0))));
    let bad_perm = acl_xattr(&[(1, 0, 8), (4, 0, 5), (0x20, 0, 1)]);
    note("perm 8", format!("{}", errno(setxattr(&g, "system.posix_acl_access", &bad_perm, 0))));
    note("file default", format!("{}", errno(setxattr(&g, "system.posix_acl_default", &named, 0))));
    note("after", format!("{:o} {}", mode(&g), getfacl(&g)));
    // Default ACLs: inherited through mkdir -p, the umask not applied under them.
    let d = root.join("d");
    fs::create_dir(&d).unwrap();
    facl("setfacl", &["-d", "-m", "u:3000:rwx,g::rx,o::-"], &d);
    let sh = format!("umask 077 && mkdir -p {0}/a/b/c && touch {0}/a/b/c/f && mkdir {0}/plain", d.display());
    assert!(std::process::Command::new("sh").args(["-c", &sh]).status().unwrap().success());
    for p in ["d", "d/a", "d/a/b/c", "d/a/b/c/f", "d/plain"] {
        let p = root.join(p);
        note("inherited", format!("{:o} {}", mode(&p), facl("getfacl", &["-n", "--omit-header", "-a", "-d"], &p)));
    }
    note("3000 in c", format!("{}", may(3000, &[], &d.join("a/b/c/f"), libc::W_OK)));
    facl("setfacl", &["-k"], &d);
    let sh = format!("umask 077 && touch {}/masked", d.display());
    assert!(std::process::Command::new("sh").args(["-c", &sh]).status().unwrap().success());
    note("after -k", format!("{:o}", mode(&d.join("masked"))));
    // setgid goes when the owner setting an ACL is outside the file's group.
    let s = root.join("s");
    fs::write(&s, b"").unwrap();
    chown(&s, 1000, 2000).unwrap();
    chmod(&s, 0o2770);
    let minimal = acl_xattr(&[(1, 0, 7), (4, 0, 7), (0x20, 0, 0)]);
    as_user(1000, 1000, &[2000], || setxattr(&s, "system.posix_acl_access", &minimal, 0).unwrap());
    note("setgid, in group", format!("{:o}", mode(&s)));
    as_user(1000, 1000, &[], || setxattr(&s, "system.posix_acl_access", &minimal, 0).unwrap());
    note("setgid, outside", format!("{:o}", mode(&s)));
    note(
        "not owner",
        format!("{}", as_user(3000, 3000, &[], || errno(setxattr(&s, "system.posix_acl_access", &minimal, 0)))),
    );
    seen
}

/// The kernel's own answers for [`acl_observations`]: tmpfs mounted under `dir`, or None
/// where tmpfs cannot be mounted.
fn tmpfs_acl_observations(dir: &Path) -> Option<Vec<String>> {
    let t = dir.join("tmpfs");
    fs::create_dir_all(&t).unwrap();
    let mounted = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "mode=755", "none"]).arg(&t).status();
    if !mounted.is_ok_and(|s| s.success()) {
        return None;
    }
    let seen = std::panic::catch_unwind(|| acl_observations(&t));
    assert!(std::process::Command::new("umount").arg(&t).status().unwrap().success());
    Some(seen.unwrap_or_else(|p| std::panic::resume_unwind(p)))
}

#[test]
fn posix_acls_as_the_kernel_keeps_them() {
    let Some(fx) = multi_user_fixture("acl") else { return };
    let ours = acl_observations(&fx.mnt);
    let text = ours.join("\n");
    // What must hold whatever tmpfs says: the mask limits the named user, chmod moves the
    // mask, a default ACL is inherited without the umask, a bad value is EINVAL.
    assert!(text.contains("named user: 660 user::rw-\nuser:3000:rw-\ngroup::r--\nmask::rw-\nother::---"), "{text}");
    assert!(text.contains("3000 rw: true false"), "{text}");
    assert!(text.contains("mask::---"), "{text}");
    assert!(text.contains(&format!("minimal: 640 {}", libc::ENODATA)), "{text}");
    assert!(text.contains(&format!("torn: {}", libc::EINVAL)), "{text}");
    assert!(text.contains(&format!("file default: {}", libc::EACCES)), "{text}");
    assert!(text.contains("inherited: 770 user::rwx\nuser:3000:rwx"), "{text}");
    assert!(text.contains("3000 in c: true"), "{text}");
    assert!(text.contains("after -k: 600"), "{text}");
    assert!(text.contains("setgid, in group: 2770\nsetgid, outside: 770"), "{text}");
    match tmpfs_acl_observations(&fx.dir) {
        Some(kernel) => {
            for (i, (k, o)) in kernel.iter().zip(&ours).enumerate() {
                assert_eq!(o, k, "observation {i} differs from tmpfs");
            }
            assert_eq!(ours.len(), kernel.len());
        }
        None => skip("acl (tmpfs comparison)", "tmpfs cannot be mounted here"),
    }
}

#[test]
fn acls_survive_cp_a_tar_and_remount() {
    let Some(mut fx) = multi_user_fixture("acl_copy") else { return };
    let d = fx.path("d");
    fs::create_dir(&d).unwrap();
    fs::write(d.join("f"), b"data").unwrap();
    facl("setfacl", &["-m", "u:3000:r,g:4000:rw", "-d", "-m", "u:5000:rx"], &d);
    facl("setfacl", &["-m", "u:3000:rwx,m::rx"], &d.join("f"));
    let want = (getfacl(&d), getfacl(&d.join("f")));
    let run = |args: &[&str]| assert!(std::process::Command::new(args[0]).args(&args[1..]).status().unwrap().success());
    let (mnt, copy, tar) = (fx.mnt.display().to_string(), fx.path("copy"), fx.dir.join("t.tar"));
    run(&["cp", "-a", &d.display().to_string(), &copy.display().to_string()]);
    assert_eq!((getfacl(&copy), getfacl(&copy.join("f"))), want);
    run(&["tar", "--acls", "-C", &mnt, "-cf", &tar.display().to_string(), "d"]);
    fs::create_dir(fx.path("x")).unwrap();
    run(&["tar", "--acls", "-C", &fx.path("x").display().to_string(), "-xf", &tar.display().to_string()]);
    assert_eq!((getfacl(&fx.path("x/d")), getfacl(&fx.path("x/d/f"))), want);
    fx.remount();
    assert_eq!((getfacl(&d), getfacl(&d.join("f"))), want);
    // The stored form is the kernel's xattr, byte for byte.
    let raw = getxattr(&d.join("f"), "system.posix_acl_access").unwrap();
    assert_eq!(
        raw,
        acl_xattr(&[(1, u32::MAX, 6), (2, 3000, 7), (4, u32::MAX, 4), (0x10, u32::MAX, 5), (0x20, u32::MAX, 4)])
    );
}

#[test]
fn noacl_refuses_acls() {
    let Some(fx) = fixture_with_options("noacl", &["noacl"]) else { return };
    let d = fx.path("d");
    fs::create_dir(&d).unwrap();
    let minimal = acl_xattr(&[(1, 0, 7), (4, 0, 5), (0x20, 0, 5)]);
    assert_eq!(errno(setxattr(&d, "system.posix_acl_default", &minimal, 0)), libc::EOPNOTSUPP);
    assert_eq!(errno(setxattr(&d, "system.posix_acl_access", &minimal, 0)), libc::EOPNOTSUPP);
    assert_eq!(errno(getxattr(&d, "system.posix_acl_access")), libc::EOPNOTSUPP);
    let out = std::process::Command::new("setfacl").args(["-m", "u:3000:r"]).arg(&d).output().unwrap();
    assert!(!out.status.success());
}
