//! Linux semantics beyond POSIX that programs rely on, through a real FUSE mount: what
//! overlayfs and container tools ask of an upper file system (renameat2 with
//! RENAME_WHITEOUT, O_TMPFILE and linkat of such a file, an overlayfs mount on ferrofs), and
//! copy_file_range served by the engine.

mod common;

use common::*;
use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<i32> {
    let (f, t) = (cpath(from), cpath(to));
    // Through syscall(2): the libc wrapper may be missing on older C libraries.
    let rc =
        unsafe { libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), flags) };
    check(rc as i32)
}

/// Whether `p` is a whiteout: a character device 0/0.
fn is_whiteout(p: &Path) -> bool {
    fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_char_device() && m.rdev() == 0)
}

/// RENAME_WHITEOUT moves the file or directory and leaves a whiteout at the source name,
/// surviving a remount; it is EINVAL with RENAME_EXCHANGE and keeps RENAME_NOREPLACE's
/// EEXIST.
#[test]
fn rename_whiteout() {
    let Some(mut fx) = Fixture::new("whiteout", |_| {}) else { return };
    let mnt = fx.mnt.clone();
    let p = |s: &str| mnt.join(s);
    fs::create_dir_all(p("dir/sub")).unwrap();
    fs::write(p("f"), b"data").unwrap();
    fs::write(p("other"), b"").unwrap();
    let ino = fs::metadata(p("f")).unwrap().ino();
    renameat2(&p("f"), &p("dir/g"), libc::RENAME_WHITEOUT).unwrap();
    assert!(is_whiteout(&p("f")));
    assert_eq!((fs::metadata(p("dir/g")).unwrap().ino(), fs::read(p("dir/g")).unwrap()), (ino, b"data".to_vec()));
    renameat2(&p("dir/sub"), &p("sub2"), libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE).unwrap();
    assert!(is_whiteout(&p("dir/sub")) && p("sub2").is_dir());
    assert_eq!(fs::metadata(p("dir")).unwrap().nlink(), 2, "the moved directory's link left with it");
    assert_eq!(
        errno(renameat2(&p("dir/g"), &p("other"), libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE)),
        libc::EEXIST
    );
    assert_eq!(errno(renameat2(&p("dir/g"), &p("other"), libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE)), libc::EINVAL);
    fx.remount();
    assert!(is_whiteout(&p("f")) && is_whiteout(&p("dir/sub")));
    assert_eq!(fs::read(p("dir/g")).unwrap(), b"data");
    fs::remove_file(p("f")).unwrap();
    fx.unmount();
    assert_fsck_clean(&fx.image);
}

/// open(2) of `dir` with O_TMPFILE and `flags`.
fn open_tmpfile(dir: &Path, flags: i32) -> io::Result<File> {
    let fd = check(unsafe { libc::open(cpath(dir).as_ptr(), libc::O_TMPFILE | libc::O_RDWR | flags, 0o640) })?;
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// linkat(2) of an open file to `to`: through /proc/self/fd (any user), or with
/// AT_EMPTY_PATH on the descriptor itself (CAP_DAC_READ_SEARCH).
fn link_open_file(f: &File, to: &Path, empty_path: bool) -> io::Result<i32> {
    let to = cpath(to);
    let rc = if empty_path {
        unsafe { libc::linkat(f.as_raw_fd(), c"".as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_EMPTY_PATH) }
    } else {
        let proc_path = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
        unsafe {
            libc::linkat(libc::AT_FDCWD, proc_path.as_ptr(), libc::AT_FDCWD, to.as_ptr(), libc::AT_SYMLINK_FOLLOW)
        }
    };
    check(rc)
}

fn free_inodes(p: &Path) -> u64 {
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statvfs(cpath(p).as_ptr(), &mut st) }).unwrap();
    st.f_ffree
}

/// O_TMPFILE gives an open file with no name and no link, which linkat names (through
/// /proc/self/fd, and with AT_EMPTY_PATH as root) and keeps across a remount; one never
/// named is freed at its close; O_TMPFILE|O_EXCL cannot be named.
#[test]
fn tmpfile_and_linkat() {
    let Some(mut fx) = Fixture::new("tmpfile", |_| {}) else { return };
    let mnt = fx.mnt.clone();
    let p = |s: &str| mnt.join(s);
    fs::create_dir(p("dir")).unwrap();
    let free = free_inodes(&mnt);
    let ways: &[bool] = if is_root() { &[false, true] } else { &[false] };
    for &empty_path in ways {
        let name = format!("dir/named-{empty_path}");
        let mut f = open_tmpfile(&p("dir"), 0).unwrap();
        let md = f.metadata().unwrap();
        assert_eq!((md.nlink(), md.mode() & 0o7777, md.is_file()), (0, 0o640 & !0o022 & 0o640, true));
        f.write_all(&[7u8; 70_000]).unwrap();
        assert_eq!(fs::read_dir(p("dir")).unwrap().count(), usize::from(empty_path), "the tmpfile has no name");
        link_open_file(&f, &p(&name), empty_path).unwrap();
        assert_eq!((f.metadata().unwrap().nlink(), fs::metadata(p(&name)).unwrap().ino()), (1, md.ino()));
        f.write_all(b"tail").unwrap();
        drop(f);
        let back = fs::read(p(&name)).unwrap();
        assert_eq!((back.len(), &back[70_000..]), (70_004, &b"tail"[..]));
    }
    // Never named: freed at its close.
    let mut f = open_tmpfile(&p("dir"), 0).unwrap();
    f.write_all(&[1u8; 8192]).unwrap();
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert_eq!(back, vec![1u8; 8192]);
    drop(f);
    // O_EXCL: never linkable.
    let f = open_tmpfile(&p("dir"), libc::O_EXCL).unwrap();
    assert_eq!(errno(link_open_file(&f, &p("dir/excl"), false)), libc::ENOENT);
    drop(f);
    assert_eq!(errno(open_tmpfile(&p("dir/named-false"), 0)), libc::ENOTDIR);
    fx.remount();
    assert_eq!(free_inodes(&mnt), free - ways.len() as u64, "only the named tmpfiles hold inodes");
    for &empty_path in ways {
        assert_eq!(fs::metadata(p(&format!("dir/named-{empty_path}"))).unwrap().len(), 70_004);
    }
    fx.unmount();
    assert_fsck_clean(&fx.image);
}

/// An overlayfs mount, detached again when dropped (also when the test fails).
struct Overlay {
    merged: std::path::PathBuf,
}

impl Overlay {
    fn mount(lower: &Path, upper: &Path, work: &Path, merged: &Path) -> io::Result<Overlay> {
        fs::create_dir_all(merged)?;
        // redirect_dir=on: a lower directory renames in place (the kernel records where it
        // came from in trusted.overlay.redirect) instead of failing with EXDEV.
        let opts = format!(
            "lowerdir={},upperdir={},workdir={},redirect_dir=on",
            lower.display(),
            upper.display(),
            work.display()
        );
        let (src, target, kind, data) = (c"overlay", cpath(merged), c"overlay", CString::new(opts).unwrap());
        check(unsafe { libc::mount(src.as_ptr(), target.as_ptr(), kind.as_ptr(), 0, data.as_ptr().cast()) })?;
        Ok(Overlay { merged: merged.to_path_buf() })
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        unsafe { libc::umount2(cpath(&self.merged).as_ptr(), libc::MNT_DETACH) };
    }
}

/// The kernel log's overlayfs lines (empty where the log cannot be read).
fn overlayfs_messages() -> Vec<String> {
    let out = std::process::Command::new("dmesg").output();
    let text = out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default();
    text.lines().filter(|l| l.contains("overlayfs")).map(str::to_string).collect()
}

fn overlay_supported() -> bool {
    fs::read_to_string("/proc/filesystems").is_ok_and(|f| f.lines().any(|l| l.ends_with("\toverlay")))
}

/// overlayfs with its lower, upper and work directories on ferrofs (what container tools
/// do): the mount succeeds without a complaint in the kernel log, and a create, a write to a
/// lower file (copy-up), a delete of a lower file (a whiteout in the upper directory) and a
/// rename of a lower directory (a redirect) read back through the overlay, also after it is
/// mounted again.
#[test]
fn overlayfs_with_upper_and_work_on_ferrofs() {
    if !is_root() {
        return skip("overlayfs_with_upper_and_work_on_ferrofs", "mounting overlayfs needs root");
    }
    if !overlay_supported() {
        return skip("overlayfs_with_upper_and_work_on_ferrofs", "the kernel has no overlay file system");
    }
    let Some(mut fx) = Fixture::new("overlay", |_| {}) else { return };
    let mnt = fx.mnt.clone();
    let p = |s: &str| mnt.join(s);
    for d in ["lower/ldir/sub", "upper", "work"] {
        fs::create_dir_all(p(d)).unwrap();
    }
    fs::write(p("lower/gone"), b"deleted through the overlay").unwrap();
    fs::write(p("lower/grow"), b"lower ").unwrap();
    fs::write(p("lower/ldir/sub/deep"), b"deep").unwrap();
    let merged = fx.dir.join("merged");
    let m = |s: &str| merged.join(s);
    let before = overlayfs_messages();
    let ov = Overlay::mount(&p("lower"), &p("upper"), &p("work"), &merged)
        .unwrap_or_else(|e| panic!("overlayfs refused ferrofs: {e}; kernel log: {:?}", overlayfs_messages()));
    let complaints: Vec<String> = overlayfs_messages().into_iter().filter(|l| !before.contains(l)).collect();
    assert!(complaints.is_empty(), "overlayfs complained: {complaints:?}");

    fs::write(m("new"), b"created").unwrap();
    fs::OpenOptions::new().append(true).open(m("grow")).unwrap().write_all(b"and upper").unwrap();
    fs::remove_file(m("gone")).unwrap();
    fs::rename(m("ldir"), m("moved")).unwrap();
    let check_merged = || {
        assert_eq!(fs::read(m("new")).unwrap(), b"created");
        assert_eq!(fs::read(m("grow")).unwrap(), b"lower and upper");
        assert_eq!(errno(fs::metadata(m("gone"))), libc::ENOENT);
        assert_eq!(errno(fs::metadata(m("ldir"))), libc::ENOENT);
        assert_eq!(fs::read(m("moved/sub/deep")).unwrap(), b"deep");
        let mut names: Vec<String> =
            fs::read_dir(&merged).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        assert_eq!(names, ["grow", "moved", "new"]);
    };
    check_merged();
    // What overlayfs left on ferrofs: the new and copied-up files, whiteouts for the deleted
    // file and the moved directory's old name, and the lower layer untouched.
    assert_eq!(fs::read(p("upper/new")).unwrap(), b"created");
    assert_eq!(fs::read(p("upper/grow")).unwrap(), b"lower and upper");
    assert!(is_whiteout(&p("upper/gone")) && is_whiteout(&p("upper/ldir")));
    assert!(p("upper/moved").is_dir());
    // overlayfs's own records are trusted.* xattrs on ferrofs: where the moved directory
    // came from.
    let mut redirect = [0u8; 256];
    let n = check_size(unsafe {
        libc::lgetxattr(
            cpath(&p("upper/moved")).as_ptr(),
            c"trusted.overlay.redirect".as_ptr(),
            redirect.as_mut_ptr().cast(),
            redirect.len(),
        )
    })
    .unwrap();
    assert!(
        redirect[..n].ends_with(b"ldir"),
        "trusted.overlay.redirect is {:?}",
        String::from_utf8_lossy(&redirect[..n])
    );
    assert_eq!(fs::read(p("lower/gone")).unwrap(), b"deleted through the overlay");
    assert_eq!(fs::read(p("lower/grow")).unwrap(), b"lower ");

    drop(ov);
    let ov = Overlay::mount(&p("lower"), &p("upper"), &p("work"), &merged).unwrap();
    check_merged();
    drop(ov);
    fx.remount();
    let ov = Overlay::mount(&p("lower"), &p("upper"), &p("work"), &merged).unwrap();
    check_merged();
    drop(ov);
    let complaints: Vec<String> = overlayfs_messages().into_iter().filter(|l| !before.contains(l)).collect();
    assert!(complaints.is_empty(), "overlayfs complained: {complaints:?}");
    fx.unmount();
    assert_fsck_clean(&fx.image);
}

/// copy_file_range(2) of `len` bytes, looping as its callers do; the total copied.
fn copy_range(from: &File, off_in: u64, to: &File, off_out: u64, len: usize) -> io::Result<usize> {
    let (mut off_in, mut off_out) = (off_in as i64, off_out as i64);
    let mut total = 0;
    while total < len {
        let n = check_size(unsafe {
            libc::copy_file_range(from.as_raw_fd(), &mut off_in, to.as_raw_fd(), &mut off_out, len - total, 0)
        })?;
        if n == 0 {
            break;
        }
        total += n;
    }
    Ok(total)
}

/// copy_file_range through the mount: data, holes and the source's end come out as in the
/// source, a hole copied past the destination's end allocates nothing (the kernel's own
/// fallback, a read and a write through the page cache, would write zeros: so the engine
/// served it), non-overlapping ranges of one file copy, overlapping ones are EINVAL, and
/// `cp --reflink=never` (which uses copy_file_range) makes an identical sparse copy.
#[test]
fn copy_file_range_in_the_engine() {
    let Some(mut fx) = Fixture::new("copy-range", |_| {}) else { return };
    let mnt = fx.mnt.clone();
    let p = |s: &str| mnt.join(s);
    let pattern: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8 + 1).collect();
    {
        let src = File::create(p("src")).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&src, &pattern, 0).unwrap();
        std::os::unix::fs::FileExt::write_all_at(&src, &pattern[..5000], 64 << 20).unwrap();
    }
    let size = (64 << 20) + 5000;
    let src = File::open(p("src")).unwrap();
    let dst = fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(p("dst")).unwrap();
    assert_eq!(copy_range(&src, 0, &dst, 0, 1 << 30).unwrap(), size, "stops at the source's end");
    let md = dst.metadata().unwrap();
    assert_eq!(md.len(), size as u64);
    assert!(md.blocks() * 512 < 1 << 20, "the 64 MiB hole was written: {} blocks", md.blocks());
    let back = fs::read(p("dst")).unwrap();
    assert!(
        back[..300_000] == pattern[..]
            && back[300_000..64 << 20].iter().all(|&b| b == 0)
            && back[64 << 20..] == pattern[..5000]
    );
    // Over the destination's data: the source's hole becomes zeros there; past the source's
    // end nothing is copied.
    let over = fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(p("over")).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&over, &[0xee; 400_000], 0).unwrap();
    assert_eq!(copy_range(&src, 290_000, &over, 10, 100_000).unwrap(), 100_000);
    let back = fs::read(p("over")).unwrap();
    assert!(
        back[..10].iter().all(|&b| b == 0xee)
            && back[10..10_010] == pattern[290_000..]
            && back[10_010..100_010].iter().all(|&b| b == 0)
            && back[100_010..].iter().all(|&b| b == 0xee)
    );
    assert_eq!(copy_range(&src, size as u64, &over, 0, 100).unwrap(), 0);
    // Within one file: apart, copied; overlapping, EINVAL.
    let same = fs::OpenOptions::new().read(true).write(true).open(p("over")).unwrap();
    assert_eq!(copy_range(&same, 10, &same, 200_000, 1000).unwrap(), 1000);
    assert_eq!(fs::read(p("over")).unwrap()[200_000..201_000], pattern[290_000..291_000]);
    assert_eq!(errno(copy_range(&same, 0, &same, 500, 1000)), libc::EINVAL);
    drop((src, dst, over, same));
    let cp = std::process::Command::new("cp").arg("--reflink=never").arg(p("src")).arg(p("cp")).status();
    if cp.is_ok_and(|s| s.success()) {
        assert!(fs::read(p("cp")).unwrap() == fs::read(p("src")).unwrap(), "cp's copy differs");
    } else {
        skip("copy_file_range_in_the_engine (cp part)", "cp --reflink=never is not available");
    }
    fx.remount();
    let back = fs::read(p("dst")).unwrap();
    assert!(back[..300_000] == pattern[..] && back[64 << 20..] == pattern[..5000]);
    fx.unmount();
    assert_fsck_clean(&fx.image);
}
