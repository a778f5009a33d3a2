//! The FUSE adapter end to end: a fresh image mounted in the test process, used through
//! std::fs and libc as any program would. Every test skips (with a message) where /dev/fuse
//! is missing or mounting is not permitted.

mod common;

use common::*;
use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{symlink, DirEntryExt, MetadataExt, PermissionsExt};
use std::time::{Duration, Instant};

const GIB: u64 = 1 << 30;

#[test]
fn files_links_and_attributes() {
    let Some(fx) = Fixture::new("files", |_| {}) else { return };
    let a = fx.path("a");
    fs::write(&a, b"hello ferrofs").unwrap();
    assert_eq!(fs::read(&a).unwrap(), b"hello ferrofs");
    let md = fs::metadata(&a).unwrap();
    let me = unsafe { (libc::geteuid(), libc::getegid()) };
    assert_eq!((md.len(), md.nlink(), md.uid(), md.gid()), (13, 1, me.0, me.1));
    assert!(md.ino() > 1);

    // Overwrite in the middle, append, read at an offset.
    let mut f = OpenOptions::new().read(true).write(true).open(&a).unwrap();
    f.seek(SeekFrom::Start(6)).unwrap();
    f.write_all(b"FERRO").unwrap();
    f.seek(SeekFrom::End(0)).unwrap();
    f.write_all(b"!!").unwrap();
    drop(f);
    assert_eq!(fs::read(&a).unwrap(), b"hello FERROfs!!");

    // A write spanning several max_write requests.
    let big: Vec<u8> = (0..3_000_000u32).map(|i| (i * 31 % 251) as u8).collect();
    fs::write(fx.path("big"), &big).unwrap();
    assert_eq!(fs::read(fx.path("big")).unwrap(), big);

    // Truncate (O_TRUNC and set_len), down and up.
    fs::write(&a, b"0123456789").unwrap();
    assert_eq!(fs::read(&a).unwrap(), b"0123456789");
    let f = OpenOptions::new().write(true).open(&a).unwrap();
    f.set_len(4).unwrap();
    f.set_len(8).unwrap();
    drop(f);
    assert_eq!(fs::read(&a).unwrap(), b"0123\0\0\0\0");

    // rename within and across directories, over an existing file.
    fs::create_dir(fx.path("d")).unwrap();
    fs::rename(&a, fx.path("d/b")).unwrap();
    assert!(!a.exists());
    fs::write(fx.path("c"), b"c").unwrap();
    fs::rename(fx.path("c"), fx.path("d/b")).unwrap();
    assert_eq!(fs::read(fx.path("d/b")).unwrap(), b"c");
    fs::rename(fx.path("d"), fx.path("e")).unwrap();
    assert_eq!(fs::read(fx.path("e/b")).unwrap(), b"c");

    // Hard links share the inode and count.
    fs::hard_link(fx.path("e/b"), fx.path("link")).unwrap();
    let (m1, m2) = (fs::metadata(fx.path("e/b")).unwrap(), fs::metadata(fx.path("link")).unwrap());
    assert_eq!((m1.ino(), m1.nlink(), m2.nlink()), (m2.ino(), 2, 2));
    fs::remove_file(fx.path("e/b")).unwrap();
    assert_eq!(fs::metadata(fx.path("link")).unwrap().nlink(), 1);
    assert_eq!(errno(fs::hard_link(fx.path("e"), fx.path("dirlink"))), libc::EPERM);

    // Symlinks: short (inline) and long targets; relative resolution through the mount.
    symlink("link", fx.path("sym")).unwrap();
    assert_eq!(fs::read_link(fx.path("sym")).unwrap().to_str().unwrap(), "link");
    assert_eq!(fs::read(fx.path("sym")).unwrap(), b"c");
    assert!(fs::symlink_metadata(fx.path("sym")).unwrap().file_type().is_symlink());
    let long = "x/".repeat(1000) + "end";
    symlink(&long, fx.path("longsym")).unwrap();
    assert_eq!(fs::read_link(fx.path("longsym")).unwrap().to_str().unwrap(), long);

    // chmod, chown (as root), utimes.
    fs::set_permissions(fx.path("link"), fs::Permissions::from_mode(0o4751)).unwrap();
    assert_eq!(fs::metadata(fx.path("link")).unwrap().mode() & 0o7777, 0o4751);
    if is_root() {
        std::os::unix::fs::chown(fx.path("link"), Some(1234), Some(5678)).unwrap();
        let md = fs::metadata(fx.path("link")).unwrap();
        assert_eq!((md.uid(), md.gid()), (1234, 5678));
        std::os::unix::fs::lchown(fx.path("sym"), Some(42), Some(43)).unwrap();
        assert_eq!(fs::symlink_metadata(fx.path("sym")).unwrap().uid(), 42);
    } else {
        skip("files_links_and_attributes (chown part)", "not root");
    }
    let t = std::time::UNIX_EPOCH + Duration::new(1_000_000_000, 123_456_789);
    File::options().write(true).open(fx.path("link")).unwrap().set_modified(t).unwrap();
    let md = fs::metadata(fx.path("link")).unwrap();
    assert_eq!((md.mtime(), md.mtime_nsec()), (1_000_000_000, 123_456_789));

    // A FIFO through mknod.
    let fifo = cpath(&fx.path("fifo"));
    check(unsafe { libc::mknod(fifo.as_ptr(), libc::S_IFIFO | 0o600, 0) }).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_fifo(&fs::metadata(fx.path("fifo")).unwrap().file_type()));

    // statfs reports the engine's numbers.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statvfs(cpath(&fx.mnt).as_ptr(), &mut st) }).unwrap();
    assert_eq!((st.f_bsize, st.f_namemax), (4096, 255));
    assert!(st.f_blocks > 0 && st.f_bfree > 0 && st.f_bfree <= st.f_blocks && st.f_ffree > 0);
}

#[test]
fn directory_errors() {
    let Some(fx) = Fixture::new("direrr", |_| {}) else { return };
    fs::create_dir(fx.path("d")).unwrap();
    fs::write(fx.path("d/f"), b"x").unwrap();
    assert_eq!(errno(fs::create_dir(fx.path("d"))), libc::EEXIST);
    assert_eq!(errno(fs::remove_dir(fx.path("d"))), libc::ENOTEMPTY);
    assert_eq!(errno(fs::remove_dir(fx.path("nope"))), libc::ENOENT);
    assert_eq!(errno(fs::remove_dir(fx.path("d/f"))), libc::ENOTDIR);
    assert_eq!(errno(fs::remove_file(fx.path("d"))), libc::EISDIR);
    assert_eq!(errno(fs::create_dir(fx.path("nope/sub"))), libc::ENOENT);
    assert_eq!(errno(fs::rename(fx.path("d"), fx.path("d/inside"))), libc::EINVAL);
    assert_eq!(errno(OpenOptions::new().write(true).create_new(true).open(fx.path("d/f"))), libc::EEXIST);

    // 255 bytes is the limit; 256 reaches the engine and comes back ENAMETOOLONG.
    let n255 = "n".repeat(255);
    let n256 = "n".repeat(256);
    fs::create_dir(fx.path(&n255)).unwrap();
    fs::write(fx.path(&format!("d/{n255}")), b"").unwrap();
    assert_eq!(errno(fs::create_dir(fx.path(&n256))), libc::ENAMETOOLONG);
    assert_eq!(errno(File::create(fx.path(&n256))), libc::ENAMETOOLONG);
    assert_eq!(errno(fs::metadata(fx.path(&n256))), libc::ENAMETOOLONG);
    assert_eq!(errno(fs::rename(fx.path("d/f"), fx.path(&n256))), libc::ENAMETOOLONG);

    fs::remove_file(fx.path("d/f")).unwrap();
    fs::remove_file(fx.path(&format!("d/{n255}"))).unwrap();
    fs::remove_dir(fx.path("d")).unwrap();
    fs::remove_dir(fx.path(&n255)).unwrap();
    assert_eq!(errno(fs::metadata(fx.path("d"))), libc::ENOENT);
    // The negative entry cached for "d" must not hide a new one.
    fs::create_dir(fx.path("d")).unwrap();
    assert!(fx.path("d").is_dir());
    assert_eq!(fs::metadata(&fx.mnt).unwrap().nlink(), 3);
}

#[test]
fn xattrs() {
    let Some(fx) = Fixture::new("xattr", |_| {}) else { return };
    let f = fx.path("f");
    fs::write(&f, b"").unwrap();
    let p = cpath(&f);
    let set = |name: &str, v: &[u8], flags: i32| {
        let n = std::ffi::CString::new(name).unwrap();
        check(unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), v.as_ptr().cast(), v.len(), flags) })
    };
    let get = |name: &str, cap: usize| {
        let n = std::ffi::CString::new(name).unwrap();
        let mut buf = vec![0u8; cap];
        check_size(unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), cap) }).map(|len| {
            buf.truncate(len.min(cap));
            (len, buf)
        })
    };
    let list = |cap: usize| {
        let mut buf = vec![0u8; cap];
        check_size(unsafe { libc::listxattr(p.as_ptr(), buf.as_mut_ptr().cast(), cap) }).map(|len| {
            buf.truncate(len.min(cap));
            (len, buf)
        })
    };
    set("user.color", b"blue", 0).unwrap();
    set("user.size", b"", 0).unwrap();
    let value = vec![7u8; 1000];
    set("user.big", &value, 0).unwrap();
    // Size probe, exact buffer, short buffer.
    assert_eq!(get("user.color", 0).unwrap().0, 4);
    assert_eq!(get("user.color", 4).unwrap().1, b"blue");
    assert_eq!(errno(get("user.color", 3)), libc::ERANGE);
    assert_eq!(get("user.big", 2000).unwrap().1, value);
    assert_eq!(get("user.size", 10).unwrap().0, 0);
    assert_eq!(errno(get("user.none", 10)), libc::ENODATA);
    // CREATE / REPLACE.
    assert_eq!(errno(set("user.color", b"red", libc::XATTR_CREATE)), libc::EEXIST);
    assert_eq!(errno(set("user.none", b"red", libc::XATTR_REPLACE)), libc::ENODATA);
    set("user.color", b"red", libc::XATTR_REPLACE).unwrap();
    assert_eq!(get("user.color", 10).unwrap().1, b"red");
    // list: size probe, ERANGE, the names NUL terminated.
    let (len, _) = list(0).unwrap();
    assert_eq!(errno(list(len - 1)), libc::ERANGE);
    let (_, names) = list(len).unwrap();
    let mut names: Vec<&[u8]> = names.split(|b| *b == 0).filter(|n| !n.is_empty()).collect();
    names.sort();
    assert_eq!(names, vec![&b"user.big"[..], b"user.color", b"user.size"]);
    // remove.
    let n = std::ffi::CString::new("user.color").unwrap();
    check(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) }).unwrap();
    assert_eq!(errno(get("user.color", 10)), libc::ENODATA);
    assert_eq!(errno(check(unsafe { libc::removexattr(p.as_ptr(), n.as_ptr()) })), libc::ENODATA);
    // xattrs on a directory too.
    let d = cpath(&fx.mnt);
    let dn = std::ffi::CString::new("user.dir").unwrap();
    check(unsafe { libc::setxattr(d.as_ptr(), dn.as_ptr(), b"1".as_ptr().cast(), 1, 0) }).unwrap();
}

#[test]
fn readdir_of_10000_entries() {
    let Some(fx) = Fixture::new("readdir", |_| {}) else { return };
    let dir = fx.path("many");
    fs::create_dir(&dir).unwrap();
    let names: Vec<String> = (0..10_000).map(|i| format!("file-{i:05}-{}", "x".repeat(i % 40))).collect();
    let t = Instant::now();
    for n in &names {
        File::create(dir.join(n)).unwrap();
    }
    let created = t.elapsed();
    let t = Instant::now();
    let listed: Vec<String> =
        fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    let listing = t.elapsed();
    assert_eq!(listed.len(), names.len(), "every entry exactly once");
    let set: HashSet<&String> = listed.iter().collect();
    assert_eq!(set.len(), names.len(), "no duplicates");
    assert!(names.iter().all(|n| set.contains(n)));
    // Listing with attributes (readdirplus) agrees with stat of each.
    let t = Instant::now();
    for e in fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        let md = e.metadata().unwrap();
        assert!(md.is_file() && md.len() == 0 && md.ino() == e.ino());
    }
    let statting = t.elapsed();
    let t = Instant::now();
    for n in &names {
        fs::remove_file(dir.join(n)).unwrap();
    }
    let removed = t.elapsed();
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    fs::remove_dir(&dir).unwrap();
    eprintln!(
        "readdir_of_10000_entries: create {:.0} files/s, list {:?}, list+stat {:?}, unlink {:.0} files/s",
        10_000.0 / created.as_secs_f64(),
        listing,
        statting,
        10_000.0 / removed.as_secs_f64()
    );
}

#[test]
fn unlinked_file_lives_until_last_close() {
    unlinked_file_lives_until_last_close_with("unlinkopen", &[]);
}

/// As above with `noatime`: the kernel opens and closes files without asking the daemon, and
/// the inode lives by the kernel's lookup count; the image is consistent afterwards.
#[test]
fn unlinked_file_lives_until_last_close_without_open() {
    unlinked_file_lives_until_last_close_with("unlinkopen-noopen", &["noatime"]);
}

fn unlinked_file_lives_until_last_close_with(name: &str, options: &[&str]) {
    let Some(mut fx) = Fixture::new(name, |c| c.options = options.iter().map(|o| o.to_string()).collect()) else {
        return;
    };
    let statvfs = || {
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        check(unsafe { libc::statvfs(cpath(&fx.mnt).as_ptr(), &mut st) }).unwrap();
        st
    };
    let before = statvfs();
    let path = fx.path("victim");
    let data = vec![0x5au8; 1 << 20];
    let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    f.write_all(&data).unwrap();
    fs::remove_file(&path).unwrap();
    assert_eq!(errno(fs::metadata(&path)), libc::ENOENT);
    // Still readable and writable through the descriptor.
    f.write_all(b"tail").unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(&back[..data.len()], &data[..]);
    assert_eq!(&back[data.len()..], b"tail");
    let md = f.metadata().unwrap();
    assert_eq!(md.nlink(), 0);
    // A file replaced by rename while open lives on the same way.
    fs::write(fx.path("old"), b"old contents").unwrap();
    let mut old = File::open(fx.path("old")).unwrap();
    fs::write(fx.path("new"), b"new").unwrap();
    fs::rename(fx.path("new"), fx.path("old")).unwrap();
    let mut s = String::new();
    old.read_to_string(&mut s).unwrap();
    assert_eq!(s, "old contents");
    assert_eq!(fs::read(fx.path("old")).unwrap(), b"new");
    drop(old);
    fs::remove_file(fx.path("old")).unwrap();
    let during = statvfs();
    assert!(during.f_ffree < before.f_ffree && during.f_bfree < before.f_bfree);
    drop(f);
    // Release is asynchronous to close(2); the engine frees the inode when it arrives.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let after = statvfs();
        if after.f_ffree == before.f_ffree && after.f_bfree == before.f_bfree {
            break;
        }
        assert!(Instant::now() < deadline, "inode and blocks not freed after last close");
        std::thread::sleep(Duration::from_millis(10));
    }
    fx.unmount();
    assert_fsck_clean(&fx.image);
}

/// Files unlinked while open, then closed together: the kernel forgets them as their last
/// references go, several at a time in one BATCH_FORGET when they queue up faster than the
/// workers read them. Every one is freed, however the forgets are batched and whichever worker
/// reads them (an extra worker that parked after the first of a batch once left the rest held
/// until unmount; on io_uring, where the workers read nothing but forgets, 3-4 mounts in 40).
#[test]
fn files_closed_together_are_all_freed() {
    let Some(fx) = Fixture::new("closedtogether", |_| {}) else { return };
    let free_inodes = || {
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        check(unsafe { libc::statvfs(cpath(&fx.mnt).as_ptr(), &mut st) }).unwrap();
        st.f_ffree
    };
    let before = free_inodes();
    // Rounds of files, each closed at once: a round whose forgets all come singly proves
    // nothing, and the next one gets another chance to batch them.
    for round in 0..20 {
        let files: Vec<File> = (0..64)
            .map(|i| {
                let path = fx.path(&format!("open-{round}-{i}"));
                let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
                fs::remove_file(&path).unwrap();
                f
            })
            .collect();
        drop(files);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while free_inodes() != before {
        assert!(Instant::now() < deadline, "{} inodes not freed after their last close", before - free_inodes());
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// With a cache budget too small for the work, transactions often wait for reclaim. On io_uring
/// a change that would wait is served by the sync pool rather than on its ring queue's thread
/// (counted as `transport_ring_offloads`), and the files come out whole either way.
#[test]
fn changes_that_would_wait_leave_the_ring() {
    let Some(mut fx) = Fixture::new("offload", |c| c.cache_bytes = Some(4096)) else { return };
    let data: Vec<u8> = (0..64 * 1024u32).map(|i| (i % 251) as u8).collect();
    for i in 0..200 {
        fs::write(fx.path(&format!("f{i}")), &data[..(i * 97) % data.len()]).unwrap();
    }
    for i in 0..200 {
        assert_eq!(fs::read(fx.path(&format!("f{i}"))).unwrap(), &data[..(i * 97) % data.len()]);
    }
    let journal: serde_json::Value =
        serde_json::from_str(&ferrofs_fuse::control_request(&fx.mnt, "journal").expect("control socket")).unwrap();
    let offloads = journal["transport_ring_offloads"].as_u64().unwrap();
    if uring() {
        assert!(offloads > 0, "no change left its ring queue under a 4 KiB cache budget");
    } else {
        assert_eq!(offloads, 0, "requests from /dev/fuse counted as leaving a ring");
    }
    fx.unmount();
    assert_fsck_clean(&fx.image);
}

#[test]
fn sparse_file_beyond_4_gib() {
    let Some(fx) = Fixture::new("sparse", |_| {}) else { return };
    let path = fx.path("sparse");
    let mut f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&path).unwrap();
    f.write_all(b"head").unwrap();
    f.seek(SeekFrom::Start(5 * GIB)).unwrap();
    f.write_all(b"five gib").unwrap();
    f.sync_all().unwrap();
    let md = f.metadata().unwrap();
    assert_eq!(md.len(), 5 * GIB + 8);
    assert!(md.blocks() <= 64, "sparse: {} blocks allocated", md.blocks());
    let mut buf = [1u8; 8];
    f.seek(SeekFrom::Start(5 * GIB)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"five gib");
    f.seek(SeekFrom::Start(3 * GIB)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert_eq!(buf, [0u8; 8], "a hole reads as zeros");

    // SEEK_DATA / SEEK_HOLE.
    let fd = f.as_raw_fd();
    let lseek = |off: i64, whence| {
        let r = unsafe { libc::lseek(fd, off, whence) };
        if r < 0 {
            Err(std::io::Error::last_os_error())
        } else {
            Ok(r as u64)
        }
    };
    assert_eq!(lseek(0, libc::SEEK_DATA).unwrap(), 0);
    assert_eq!(lseek(0, libc::SEEK_HOLE).unwrap(), 4096);
    assert_eq!(lseek(4096, libc::SEEK_DATA).unwrap(), 5 * GIB);
    assert_eq!(lseek((5 * GIB) as i64 + 3, libc::SEEK_DATA).unwrap(), 5 * GIB + 3);
    assert_eq!(lseek((5 * GIB) as i64, libc::SEEK_HOLE).unwrap(), 5 * GIB + 8);
    assert_eq!(errno(lseek((5 * GIB + 8) as i64, libc::SEEK_DATA)), libc::ENXIO);

    // Cut back below 4 GiB and grow again: the tail reads as zeros.
    f.set_len(2).unwrap();
    f.set_len(5 * GIB).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_exact(&mut buf[..4]).unwrap();
    assert_eq!(&buf[..4], b"he\0\0");
    f.seek(SeekFrom::Start(5 * GIB - 8)).unwrap();
    f.read_exact(&mut buf).unwrap();
    assert_eq!(buf, [0u8; 8]);
}

#[test]
fn new_files_belong_to_the_caller() {
    if !is_root() {
        return skip("new_files_belong_to_the_caller", "acting as another user needs root");
    }
    let Some(fx) = Fixture::new("owner", |c| c.allow_other = true) else { return };
    let open = fx.path("open");
    fs::create_dir(&open).unwrap();
    fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
    let sgid = fx.path("sgid");
    fs::create_dir(&sgid).unwrap();
    std::os::unix::fs::chown(&sgid, Some(0), Some(4242)).unwrap();
    fs::set_permissions(&sgid, fs::Permissions::from_mode(0o2777)).unwrap();
    let (open2, sgid2) = (open.clone(), sgid.clone());
    // A thread with its own umask and file system uid/gid, as another user's process.
    std::thread::spawn(move || {
        check(unsafe { libc::unshare(libc::CLONE_FS) }).unwrap();
        unsafe {
            libc::umask(0o027);
            libc::setfsgid(2000);
            libc::setfsuid(1000);
        }
        fs::write(open2.join("mine"), b"x").unwrap();
        fs::create_dir(open2.join("mydir")).unwrap();
        symlink("mine", open2.join("mylink")).unwrap();
        fs::write(sgid2.join("inherited"), b"x").unwrap();
        fs::create_dir(sgid2.join("subdir")).unwrap();
        // The caller may not write into root's directory.
        assert_eq!(errno(fs::write(open2.parent().unwrap().join("rootonly"), b"x")), libc::EACCES);
    })
    .join()
    .unwrap();
    let md = fs::metadata(open.join("mine")).unwrap();
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o777), (1000, 2000, 0o640));
    let md = fs::metadata(open.join("mydir")).unwrap();
    assert_eq!((md.uid(), md.gid(), md.mode() & 0o777), (1000, 2000, 0o750));
    assert_eq!(fs::symlink_metadata(open.join("mylink")).unwrap().uid(), 1000);
    let md = fs::metadata(sgid.join("inherited")).unwrap();
    assert_eq!((md.uid(), md.gid()), (1000, 4242));
    let md = fs::metadata(sgid.join("subdir")).unwrap();
    assert_eq!((md.gid(), md.mode() & 0o2000), (4242, 0o2000));
}

#[test]
fn remount_keeps_everything() {
    let Some(mut fx) = Fixture::new("persist", |_| {}) else { return };
    fs::create_dir_all(fx.path("a/b/c")).unwrap();
    let data: Vec<u8> = (0..200_000u32).map(|i| (i % 253) as u8).collect();
    fs::write(fx.path("a/b/c/data"), &data).unwrap();
    for i in 0..500 {
        fs::write(fx.path(&format!("a/f{i}")), i.to_string()).unwrap();
    }
    symlink("b/c/data", fx.path("a/sym")).unwrap();
    fs::hard_link(fx.path("a/f1"), fx.path("a/b/hard")).unwrap();
    let x = std::ffi::CString::new("user.k").unwrap();
    check(unsafe { libc::setxattr(cpath(&fx.path("a")).as_ptr(), x.as_ptr(), b"v".as_ptr().cast(), 1, 0) }).unwrap();
    fs::set_permissions(fx.path("a/f2"), fs::Permissions::from_mode(0o600)).unwrap();
    let before = fs::metadata(fx.path("a/b/c/data")).unwrap();

    fx.unmount();
    assert_eq!(replayed_records(&fx.image), 0, "unmount must leave a clean log");
    assert_fsck_clean(&fx.image);
    fx.mount().unwrap();

    assert_eq!(fs::read(fx.path("a/b/c/data")).unwrap(), data);
    for i in 0..500 {
        assert_eq!(fs::read_to_string(fx.path(&format!("a/f{i}"))).unwrap(), i.to_string());
    }
    assert_eq!(fs::read(fx.path("a/sym")).unwrap(), data);
    assert_eq!(fs::metadata(fx.path("a/b/hard")).unwrap().nlink(), 2);
    assert_eq!(fs::metadata(fx.path("a/f2")).unwrap().mode() & 0o777, 0o600);
    let mut v = [0u8; 4];
    let n = check_size(unsafe { libc::getxattr(cpath(&fx.path("a")).as_ptr(), x.as_ptr(), v.as_mut_ptr().cast(), 4) })
        .unwrap();
    assert_eq!(&v[..n], b"v");
    let after = fs::metadata(fx.path("a/b/c/data")).unwrap();
    assert_eq!(
        (after.ino(), after.mtime(), after.mtime_nsec(), after.len()),
        (before.ino(), before.mtime(), before.mtime_nsec(), before.len())
    );
    assert_eq!(fs::read_dir(fx.path("a")).unwrap().count(), 502, "b, f0..f499, sym");
}

#[test]
fn second_mount_of_an_image_in_use_fails() {
    let Some(fx) = Fixture::new("inuse", |_| {}) else { return };
    let other = fx.dir.join("mnt2");
    fs::create_dir(&other).unwrap();
    let mut cfg = ferrofs_fuse::MountConfig::new(&fx.image, &other);
    cfg.lock_timeout = Duration::ZERO;
    match ferrofs_fuse::spawn_mount(&cfg) {
        Err(e @ ferrofs_fuse::MountError::ImageInUse { .. }) => assert!(e.to_string().contains("in use"), "{e}"),
        Err(e) => panic!("expected ImageInUse, got {e}"),
        Ok(_) => panic!("second mount of a locked image succeeded"),
    }
    assert!(!is_mounted(&other));
    // A missing image is a clear error too.
    let cfg = ferrofs_fuse::MountConfig::new(fx.dir.join("no-such-image"), &other);
    assert!(matches!(ferrofs_fuse::spawn_mount(&cfg), Err(ferrofs_fuse::MountError::Image { .. })));
    // The first mount is unaffected.
    fs::write(fx.path("still"), b"ok").unwrap();
}

#[test]
fn read_only_mount() {
    let Some(mut fx) = Fixture::new("ro", |_| {}) else { return };
    fs::write(fx.path("f"), b"data").unwrap();
    fx.unmount();
    fx.cfg.read_only = true;
    fx.mount().unwrap();
    assert_eq!(fs::read(fx.path("f")).unwrap(), b"data");
    assert_eq!(errno(fs::write(fx.path("g"), b"x")), libc::EROFS);
    assert_eq!(errno(OpenOptions::new().write(true).open(fx.path("f"))), libc::EROFS);
    assert_eq!(errno(fs::create_dir(fx.path("d"))), libc::EROFS);
}

#[test]
fn rename_flags() {
    let Some(fx) = Fixture::new("renameflags", |_| {}) else { return };
    fs::write(fx.path("a"), b"A").unwrap();
    fs::create_dir(fx.path("d")).unwrap();
    fs::write(fx.path("d/b"), b"B").unwrap();
    let renameat2 = |from: &str, to: &str, flags: libc::c_uint| {
        let (f, t) = (cpath(&fx.path(from)), cpath(&fx.path(to)));
        check(unsafe { libc::renameat2(libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), flags) })
    };
    assert_eq!(errno(renameat2("a", "d/b", libc::RENAME_NOREPLACE)), libc::EEXIST);
    renameat2("a", "d/b", libc::RENAME_EXCHANGE).unwrap();
    assert_eq!((fs::read(fx.path("a")).unwrap(), fs::read(fx.path("d/b")).unwrap()), (b"B".to_vec(), b"A".to_vec()));
    assert_eq!(errno(renameat2("a", "nothing", libc::RENAME_EXCHANGE)), libc::ENOENT);
    renameat2("a", "c", libc::RENAME_NOREPLACE).unwrap();
    assert_eq!(fs::read(fx.path("c")).unwrap(), b"B");
}

#[test]
fn fallocate_preallocates() {
    let Some(fx) = Fixture::new("fallocate", |_| {}) else { return };
    let f = File::create(fx.path("f")).unwrap();
    check(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 1 << 20) }).unwrap();
    let m = f.metadata().unwrap();
    assert_eq!((m.len(), m.blocks()), (1 << 20, 2048));
    check(unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, 4096) })
        .unwrap();
    assert_eq!(f.metadata().unwrap().blocks(), 2040);
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096) };
    assert_eq!(errno(check(rc)), libc::EOPNOTSUPP);
}

#[test]
fn parallel_clients() {
    let Some(fx) = Fixture::new("parallel", |c| c.threads = 4) else { return };
    let dirs: Vec<_> = (0..6).map(|t| fx.path(&format!("t{t}"))).collect();
    let t = Instant::now();
    std::thread::scope(|s| {
        for d in &dirs {
            s.spawn(move || {
                fs::create_dir(d).unwrap();
                for i in 0..500 {
                    let p = d.join(format!("f{i}"));
                    fs::write(&p, i.to_string()).unwrap();
                    if i % 3 == 0 {
                        fs::rename(&p, d.join(format!("r{i}"))).unwrap();
                    }
                }
                // A shared directory too: parallel dirops on one parent.
                for i in 0..200 {
                    fs::write(
                        d.parent().unwrap().join(format!("shared-{}-{i}", d.file_name().unwrap().to_str().unwrap())),
                        b"",
                    )
                    .unwrap();
                }
            });
        }
    });
    let elapsed = t.elapsed();
    for d in &dirs {
        assert_eq!(fs::read_dir(d).unwrap().count(), 500);
        assert_eq!(fs::read_to_string(d.join("r3")).unwrap(), "3");
        assert_eq!(fs::read_to_string(d.join("f4")).unwrap(), "4");
    }
    assert_eq!(fs::read_dir(&fx.mnt).unwrap().count(), 6 + 6 * 200);
    eprintln!("parallel_clients: 6 threads, {} operations in {:?}", 6 * (500 * 2 + 167 + 200), elapsed);
}

/// Several clients at once on shared directories: creates, writes, truncates, links,
/// renames (files and directories, across parents), unlinks and listings with attributes.
/// Whatever interleaving happens, every call must return (no deadlock), and the image must
/// be consistent afterwards.
#[test]
fn mixed_operations_under_concurrency() {
    let Some(mut fx) = Fixture::new("mixed", |c| c.threads = 8) else { return };
    for d in 0..4 {
        fs::create_dir(fx.path(&format!("d{d}"))).unwrap();
    }
    // FERROFS_STRESS_SECS runs it longer (hunting rare interleavings).
    let secs: u64 = std::env::var("FERROFS_STRESS_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(3);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let ops = [std::sync::atomic::AtomicU64::new(0), std::sync::atomic::AtomicU64::new(0)];
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let (fx, ops) = (&fx, &ops);
            s.spawn(move || {
                let mut rng = t.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
                let mut next = |n: u64| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    rng % n
                };
                while Instant::now() < deadline {
                    let (a, b) = (
                        fx.path(&format!("d{}/n{}", next(4), next(40))),
                        fx.path(&format!("d{}/n{}", next(4), next(40))),
                    );
                    // Errors are expected (a name raced away, a target is a directory, ...);
                    // only hangs, crashes and corruption are failures.
                    let res = match next(9) {
                        0 => fs::write(&a, vec![t as u8; next(20_000) as usize]).map(|_| ()),
                        1 => OpenOptions::new().write(true).open(&a).and_then(|f| f.set_len(next(10_000))),
                        2 => fs::hard_link(&a, &b),
                        3 => fs::rename(&a, &b),
                        4 => fs::remove_file(&a),
                        5 => fs::create_dir(&a),
                        6 => fs::remove_dir(&a),
                        // Into a directory that may sit below the source: the loop check.
                        7 => fs::rename(&a, b.join(format!("n{}", next(40)))),
                        _ => fs::read_dir(a.parent().unwrap()).map(|rd| rd.flatten().for_each(|e| drop(e.metadata()))),
                    };
                    ops[res.is_ok() as usize].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    let [failed, done] = ops.map(|o| o.into_inner());
    eprintln!("mixed_operations_under_concurrency: {done} operations succeeded, {failed} failed, in {secs} s");
    assert!(done > 1000, "too little real work: {done} operations succeeded");
    fs::write(fx.path("after"), b"ok").unwrap();
    fx.unmount();
    assert_eq!(replayed_records(&fx.image), 0);
    assert_fsck_clean(&fx.image);
}

#[test]
fn writeback_cache_mount() {
    let Some(mut fx) = Fixture::new("writeback", |c| c.writeback_cache = true) else { return };
    let mut f = File::create(fx.path("wb")).unwrap();
    for i in 0..1000u32 {
        f.write_all(&i.to_le_bytes()).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    let mut a = OpenOptions::new().append(true).open(fx.path("wb")).unwrap();
    a.write_all(b"end").unwrap();
    drop(a);
    fx.remount();
    let back = fs::read(fx.path("wb")).unwrap();
    assert_eq!(back.len(), 4003);
    assert_eq!(&back[4000..], b"end");
    assert!((0..1000u32).all(|i| back[i as usize * 4..i as usize * 4 + 4] == i.to_le_bytes()));
}

#[test]
fn mount_options_reach_the_kernel() {
    let Some(fx) = Fixture::new("options", |c| c.options = vec!["noatime,fsname=ferro-test".into(), "nodev".into()])
    else {
        return;
    };
    let canon = fx.mnt.canonicalize().unwrap();
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info.lines().find(|l| l.split(' ').nth(4).is_some_and(|m| std::path::Path::new(m) == canon)).unwrap();
    // mountinfo: ... mount point, per-mount options, ... " - " type source super options
    let (mount_part, super_part) = line.split_once(" - ").unwrap();
    let mount_opts = mount_part.split(' ').nth(5).unwrap();
    assert!(mount_opts.split(',').any(|o| o == "noatime") && mount_opts.split(',').any(|o| o == "nodev"), "{line}");
    let mut sup = super_part.split(' ');
    let (fstype, source, super_opts) = (sup.next().unwrap(), sup.next().unwrap(), sup.next().unwrap());
    assert_eq!(fstype, "fuse.ferrofs", "{line}");
    assert_eq!(source, "ferro-test", "{line}");
    assert_eq!(super_opts.contains("default_permissions"), kernel_checks_permissions(), "{line}");
    assert!(!super_opts.contains("allow_other"), "{line}");
}

/// A mount's core workers (here its only one) each keep to one CPU once they have served a
/// request (the adapter's `workers.rs`, which recognises fuser's workers by their thread
/// names).
#[test]
fn workers_keep_to_one_cpu_each() {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus < 2 {
        return skip("workers_keep_to_one_cpu_each", "one CPU: every thread keeps to it anyway");
    }
    // The /dev/fuse workers' pinning: with the rings they would serve no request to pin at.
    let Some(fx) = Fixture::new("pinning", |c| {
        c.threads = 1;
        c.uring = ferrofs_fuse::Uring::Off;
    }) else {
        return;
    };
    for i in 0..20 {
        fs::write(fx.path(&format!("f{i}")), b"x").unwrap();
    }
    // The test process's fuser threads (those of other tests' mounts among them) and their
    // allowed CPUs; at least this mount's one worker is down to a single CPU.
    let mut pinned = 0;
    for task in fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("fuser-") {
            continue;
        }
        let status = fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let allowed =
            status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).unwrap_or("").trim().to_string();
        if !allowed.is_empty() && !allowed.contains([',', '-']) {
            pinned += 1;
        }
    }
    assert!(pinned >= 1, "no fuser worker keeps to one CPU");
}

/// The mount's journal counters (its control socket's `journal` answer).
fn mount_counters(fx: &Fixture) -> serde_json::Value {
    serde_json::from_str(&ferrofs_fuse::control_request(&fx.mnt, "journal").expect("control socket")).unwrap()
}

/// Workers beyond one per CPU read only while many clients are active: they wake for many
/// client threads and park again once one is left (`workers.rs`).
#[test]
fn extra_workers_follow_the_clients() {
    // The /dev/fuse workers: with the rings they would see no client.
    let Some(fx) = Fixture::new("workers", |c| {
        c.threads = ferrofs_fuse::THREADS_MAX;
        c.uring = ferrofs_fuse::Uring::Off;
    }) else {
        return;
    };
    let c = mount_counters(&fx);
    let (total, core) = (c["workers_total"].as_u64().unwrap(), c["workers_core"].as_u64().unwrap());
    // One client: each extra serves a request or so, then parks.
    let mut n = 0;
    let deadline = Instant::now() + Duration::from_secs(20);
    while mount_counters(&fx)["workers_parked"].as_u64() != Some(total - core) {
        assert!(Instant::now() < deadline, "extras still reading with one client: {}", mount_counters(&fx));
        fs::write(fx.path(&format!("one{n}")), b"").unwrap();
        n += 1;
    }
    assert_eq!(mount_counters(&fx)["workers_woken"].as_u64(), Some(0), "one client woke extras");
    // Many clients (a thread each; 4 per CPU is more than the core workers serve alone).
    let clients = 4 * core as usize + 2;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let woken = std::thread::scope(|s| {
        for t in 0..clients {
            let (fx, stop) = (&fx, &stop);
            // Each a thousand files at most: the image has room for all of them.
            s.spawn(move || {
                for i in 0..1000 {
                    if stop.load(std::sync::atomic::Ordering::Relaxed) {
                        break;
                    }
                    fs::write(fx.path(&format!("c{t}-{i}")), b"").unwrap();
                }
            });
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let woken = loop {
            let c = mount_counters(&fx);
            if c["workers_woken"].as_u64().unwrap() > 0 || Instant::now() > deadline {
                break c;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        woken
    });
    assert!(woken["workers_woken"].as_u64().unwrap() > 0, "{clients} clients woke no extra: {woken}");
    // One client again: past the clients' window, the extras park as their requests end.
    let deadline = Instant::now() + Duration::from_secs(20);
    while mount_counters(&fx)["workers_parked"].as_u64() != Some(total - core) {
        assert!(Instant::now() < deadline, "extras still reading after the clients left: {}", mount_counters(&fx));
        fs::write(fx.path(&format!("one{n}")), b"").unwrap();
        n += 1;
    }
}

#[test]
fn external_unmount_ends_the_session_cleanly() {
    let Some(mut fx) = Fixture::new("extumount", |_| {}) else { return };
    fs::write(fx.path("f"), b"persisted").unwrap();
    let handle = fx.take_handle();
    let out = std::process::Command::new("fusermount3").arg("-u").arg(&fx.mnt).output();
    if !out.as_ref().is_ok_and(|o| o.status.success()) {
        // No fusermount3 here: the plain umount(8) is the same request to the kernel.
        let st = std::process::Command::new("umount").arg(&fx.mnt).status().unwrap();
        assert!(st.success(), "umount failed: {st}; fusermount3: {out:?}");
    }
    handle.join().expect("session after external unmount");
    assert_eq!(replayed_records(&fx.image), 0, "external unmount must leave a clean log");
    fx.mount().unwrap();
    assert_eq!(fs::read(fx.path("f")).unwrap(), b"persisted");
}

#[test]
fn hostile_requests_get_errors_not_crashes() {
    let Some(fx) = Fixture::new("hostile", |_| {}) else { return };
    fs::create_dir(fx.path("d")).unwrap();
    for i in 0..300 {
        fs::write(fx.path(&format!("d/{i}")), b"").unwrap();
    }
    // readdir resumed from cookies the engine never handed out.
    let d = cpath(&fx.path("d"));
    for cookie in [1i64, 2, 3, 7, 1 << 20, i64::MAX, -1, 0x1234_5678_9abc_def0] {
        let dir = unsafe { libc::opendir(d.as_ptr()) };
        assert!(!dir.is_null());
        unsafe { libc::seekdir(dir, cookie as libc::c_long) };
        let mut n = 0;
        while !unsafe { libc::readdir(dir) }.is_null() {
            n += 1;
            assert!(n <= 302, "readdir from cookie {cookie} does not end");
        }
        unsafe { libc::closedir(dir) };
    }
    let f = OpenOptions::new().read(true).write(true).create(true).truncate(true).open(fx.path("f")).unwrap();
    // Offsets and sizes past the engine's limits.
    let rc = unsafe { libc::pwrite(f.as_raw_fd(), b"x".as_ptr().cast(), 1, i64::MAX - 1) };
    assert!(matches!(errno(check_size(rc)), libc::EFBIG | libc::EINVAL));
    assert_eq!(errno(f.set_len(u64::MAX >> 1)), libc::EFBIG);
    let mut buf = [0u8; 16];
    let rc = unsafe { libc::pread(f.as_raw_fd(), buf.as_mut_ptr().cast(), 16, 1 << 62) };
    assert_eq!(check_size(rc).unwrap(), 0);
    // xattrs at and past the limits.
    let p = cpath(&fx.path("f"));
    let long_name = std::ffi::CString::new(format!("user.{}", "n".repeat(250))).unwrap();
    check(unsafe { libc::setxattr(p.as_ptr(), long_name.as_ptr(), b"v".as_ptr().cast(), 1, 0) }).unwrap();
    let big = vec![1u8; (64 << 10) + 1];
    let n = std::ffi::CString::new("user.big").unwrap();
    check(unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), big.as_ptr().cast(), big.len() - 1, 0) }).unwrap();
    let rc = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), big.as_ptr().cast(), big.len(), 0) };
    assert_eq!(errno(check(rc)), libc::E2BIG, "one byte past XATTR_SIZE_MAX");
    let flags_bad = unsafe { libc::setxattr(p.as_ptr(), n.as_ptr(), b"v".as_ptr().cast(), 1, 0x40) };
    let _ = check(flags_bad); // any answer but a crash
                              // Symlink targets at and past PATH_MAX; device nodes (nodev keeps them unopenable).
    symlink("t".repeat(4095), fx.path("maxlink")).unwrap();
    assert_eq!(fs::read_link(fx.path("maxlink")).unwrap().as_os_str().len(), 4095);
    assert_eq!(errno(symlink("t".repeat(4096), fx.path("toolong"))), libc::ENAMETOOLONG);
    if is_root() {
        let dev = cpath(&fx.path("null"));
        check(unsafe { libc::mknod(dev.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) }).unwrap();
        let md = fs::metadata(fx.path("null")).unwrap();
        assert_eq!(md.rdev(), libc::makedev(1, 3));
        assert!(OpenOptions::new().write(true).open(fx.path("null")).is_err());
    }
    // Renames that must fail.
    assert_eq!(errno(fs::rename(fx.path("d"), fx.path("f"))), libc::ENOTDIR);
    assert_eq!(errno(fs::rename(fx.path("f"), fx.path("d"))), libc::EISDIR);
    // The mount still works.
    fs::write(fx.path("after"), b"fine").unwrap();
    assert_eq!(fs::read(fx.path("after")).unwrap(), b"fine");
}

/// A mount served by a child process: this test binary, re-run with FERROFS_FUSE_CHILD set
/// (`child_serves_a_mount`). Dropping it detaches the mount if it is still there, kills the
/// child if it still runs, and removes the image.
struct ChildMount {
    dir: std::path::PathBuf,
    image: std::path::PathBuf,
    mnt: std::path::PathBuf,
    child: std::process::Child,
}

impl ChildMount {
    /// A fresh image mounted by a child; `None` (after saying why) where it cannot mount.
    fn spawn(name: &str) -> Option<ChildMount> {
        if let Some(why) = fuse_unavailable() {
            skip(name, &why);
            return None;
        }
        let dir = std::env::temp_dir().join(format!("ferrofs-fuse-{}-{}", std::process::id(), name));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("mnt")).unwrap();
        let (image, mnt) = (dir.join("image"), dir.join("mnt"));
        mkfs(&image, IMAGE_SIZE);
        let child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_serves_a_mount", "--nocapture", "--test-threads=1"])
            .env("FERROFS_FUSE_CHILD", format!("{}\n{}", image.display(), mnt.display()))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let mut cm = ChildMount { dir, image, mnt, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !is_mounted(&cm.mnt) {
            if let Some(status) = cm.child.try_wait().unwrap() {
                // The child could not mount: it said why on stderr.
                skip(name, &format!("child exited before mounting: {status}"));
                return None;
            }
            assert!(Instant::now() < deadline, "child did not mount");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(cm)
    }

    fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill has no memory preconditions; the pid is our own child's, not yet reaped.
        check(unsafe { libc::kill(self.child.id() as i32, sig) }).unwrap();
    }

    /// The child's exit status, waiting for it until `deadline`.
    fn exit_status(&mut self, deadline: Instant) -> std::process::ExitStatus {
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "child did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildMount {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = std::process::Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        if self.child.try_wait().is_ok_and(|s| s.is_none()) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// Signals: SIGTERM to the process serving a mount (`ferrofs_fuse::mount`) must unmount it
/// and checkpoint the image.
#[test]
fn sigterm_unmounts_and_checkpoints() {
    let Some(mut cm) = ChildMount::spawn("sigterm") else { return };
    let mnt = cm.mnt.clone();
    fs::write(mnt.join("before-signal"), b"kept").unwrap();
    let keep_open = File::open(mnt.join("before-signal")).unwrap();
    cm.signal(libc::SIGTERM);
    // Busy (a file is open): detached lazily, served until the file is closed.
    let deadline = Instant::now() + Duration::from_secs(20);
    while is_mounted(&mnt) {
        assert!(Instant::now() < deadline, "SIGTERM did not unmount");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(keep_open);
    let status = cm.exit_status(deadline);
    assert!(status.success(), "child: {status}");
    assert_eq!(replayed_records(&cm.image), 0, "SIGTERM must leave a clean log");
    let fs = engine_read_only(&cm.image);
    let a = fs.lookup(1, b"before-signal").unwrap();
    assert_eq!(fs.read(a.ino, 0, 100).unwrap(), b"kept");
}

/// The engine on the image, read-only, as the next mount sees it (the log replayed in memory).
fn engine_read_only(image: &std::path::Path) -> ferrofs::FileSystem {
    let dev = ferrofs::dev::FileDevice::open_wait(image, true, Duration::from_secs(10)).unwrap();
    ferrofs::FileSystem::mount_device(
        std::sync::Arc::new(dev),
        &ferrofs::MountOptions { read_only: true, ..Default::default() },
    )
    .unwrap()
}

/// The daemon killed (SIGKILL) with the kernel's writeback cache on or off (the suites run
/// both ways): what fsync returned for is in the image, whole, and no file shows another
/// file's old data, neither a file closed without fsync (its pages were written back to the
/// daemon at close) nor one still open with dirty pages in the kernel. The old data is that
/// of a file deleted before, whose blocks the new files may reuse: ordered mode writes a
/// file's data before the records that map it, as ext4's `data=ordered` does.
#[test]
fn killed_daemon_keeps_fsynced_data_and_shows_no_stale_data() {
    const LEN: usize = 4 << 20;
    let Some(mut cm) = ChildMount::spawn("sigkill") else { return };
    let mnt = cm.mnt.clone();
    let write = |name: &str, byte: u8, fsync: bool| {
        let mut f = File::create(mnt.join(name)).unwrap();
        // In pieces, as programs write: the writeback cache gathers them.
        for chunk in vec![byte; LEN].chunks(10_000) {
            f.write_all(chunk).unwrap();
        }
        if fsync {
            f.sync_all().unwrap();
        }
        f
    };
    drop(write("old", 0xAA, true));
    fs::remove_file(mnt.join("old")).unwrap();
    File::open(&mnt).unwrap().sync_all().unwrap();
    drop(write("closed", 0xBB, false));
    let dirty = write("open", 0xDD, false);
    drop(write("synced", 0xCC, true));
    cm.signal(libc::SIGKILL);
    assert!(!cm.exit_status(Instant::now() + Duration::from_secs(20)).success());
    // The connection is gone: closing fails or not, the dirty pages are lost either way.
    drop(dirty);
    assert!(std::process::Command::new("umount").arg("-l").arg(&mnt).status().unwrap().success());

    let fs = engine_read_only(&cm.image);
    let synced = fs.lookup(1, b"synced").expect("fsync'd file lost");
    assert_eq!(synced.size, LEN as u64);
    assert!(fs.read(synced.ino, 0, LEN).unwrap().iter().all(|&b| b == 0xCC), "fsync'd data lost");
    for (name, byte) in [(&b"closed"[..], 0xBB), (b"open", 0xDD)] {
        let Ok(a) = fs.lookup(1, name) else { continue };
        let data = fs.read(a.ino, 0, a.size as usize).unwrap();
        assert_eq!(data.len() as u64, a.size);
        let foreign = data.iter().position(|&b| b != byte && b != 0);
        assert_eq!(foreign, None, "{}: byte not its own (0xAA: a deleted file's)", String::from_utf8_lossy(name));
    }
}

/// Not a test: the child half of `sigterm_unmounts_and_checkpoints` (does nothing unless
/// FERROFS_FUSE_CHILD is set).
#[test]
fn child_serves_a_mount() {
    let Ok(spec) = std::env::var("FERROFS_FUSE_CHILD") else { return };
    let (image, mnt) = spec.split_once('\n').unwrap();
    let mut cfg = ferrofs_fuse::MountConfig::new(image, mnt);
    cfg.default_permissions = kernel_checks_permissions();
    cfg.writeback_cache = writeback_cache();
    if let Err(e) = ferrofs_fuse::mount(&cfg, || {}) {
        eprintln!("child mount: {e}");
        std::process::exit(2);
    }
}

/// With `-o uring` and the kernel offering it, requests are served from the io_uring rings
/// (`uring.rs`), one per possible CPU: every CPU's callers are answered (a queue without
/// entries would hang them), and the mount says which transport it uses. Without it, none
/// is.
#[test]
fn uring_rings_serve_the_requests() {
    if let Some(why) = common::uring_unavailable() {
        return common::skip("uring_rings_serve_the_requests", &why);
    }
    let Some(fx) = Fixture::new("uring", |c| c.uring = ferrofs_fuse::Uring::On) else { return };
    let (uring, before) = common::transport_counters(&fx.mnt);
    assert_eq!(uring, 1);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // From each CPU this process may run on: each is served by that CPU's queue.
    for cpu in 0..cpus {
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: cpu_set_t is a plain bit set; all zeroes is the empty set.
                let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
                // SAFETY: `set` is a valid cpu_set_t and `cpu` below CPU_SETSIZE.
                unsafe { libc::CPU_SET(cpu, &mut set) };
                // SAFETY: `set` is valid for the size passed; 0 is the calling thread.
                unsafe { libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) };
                for i in 0..50 {
                    let p = fx.path(&format!("cpu{cpu}-{i}"));
                    fs::write(&p, format!("{cpu} {i}")).unwrap();
                    assert_eq!(fs::read_to_string(&p).unwrap(), format!("{cpu} {i}"));
                }
            });
        });
    }
    let (_, after) = common::transport_counters(&fx.mnt);
    assert!(after >= before + 50 * 4 * cpus as u64, "{} requests through the rings, {before} before", after);
    drop(fx);
    let Some(plain) = Fixture::new("uring-off", |c| c.uring = ferrofs_fuse::Uring::Off) else { return };
    fs::write(plain.path("f"), b"x").unwrap();
    assert_eq!(common::transport_counters(&plain.mnt), (0, 0), "no ring without -o uring");
}

/// The null server (`ferrofs-nullfs`, the transports' ceiling in `bench`) keeps names: what
/// fs_mark and `rm -rf` do works on it through /dev/fuse and, where the kernel offers it,
/// through the rings; it ends when unmounted.
#[test]
fn null_server_keeps_names_on_both_transports() {
    if let Some(why) = common::fuse_unavailable() {
        return common::skip("null_server_keeps_names_on_both_transports", &why);
    }
    if !common::is_root() {
        return common::skip("null_server_keeps_names_on_both_transports", "mounting it needs root");
    }
    for uring in [false, true] {
        if uring && common::uring_unavailable().is_some() {
            continue;
        }
        let mnt = std::env::temp_dir().join(format!("ferrofs-null-{}-{uring}", std::process::id()));
        fs::create_dir_all(&mnt).unwrap();
        let server = std::thread::spawn({
            let mnt = mnt.clone();
            move || ferrofs_fuse::null::serve(&mnt, uring, 2)
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !common::is_mounted(&mnt) {
            assert!(Instant::now() < deadline && !server.is_finished(), "null server did not mount");
            std::thread::sleep(Duration::from_millis(10));
        }
        let dir = mnt.join("d");
        fs::create_dir(&dir).unwrap();
        for i in 0..300 {
            File::create(dir.join(format!("f{i}"))).unwrap();
        }
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 300);
        assert_eq!(errno(fs::create_dir(&dir)), libc::EEXIST);
        assert_eq!(errno(fs::remove_dir(&dir)), libc::ENOTEMPTY);
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(errno(fs::metadata(&dir)), libc::ENOENT);
        assert!(std::process::Command::new("umount").arg(&mnt).status().unwrap().success());
        server.join().unwrap().unwrap_or_else(|e| panic!("null server (uring {uring}): {e}"));
        fs::remove_dir(&mnt).unwrap();
    }
}
