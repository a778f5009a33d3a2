//! What overlayfs and container tools ask of an upper file system, through a real FUSE
//! mount: renameat2 with RENAME_WHITEOUT.

mod common;

use common::*;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

fn renameat2(from: &Path, to: &Path, flags: u32) -> io::Result<i32> {
    let (f, t) = (cpath(from), cpath(to));
    // Through syscall(2): the libc wrapper may be missing on older C libraries.
    let rc = unsafe { libc::syscall(libc::SYS_renameat2, libc::AT_FDCWD, f.as_ptr(), libc::AT_FDCWD, t.as_ptr(), flags) };
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
    if !is_root() {
        // The kernel asks for CAP_MKNOD: a whiteout is a device node.
        return skip("rename_whiteout", "RENAME_WHITEOUT needs CAP_MKNOD");
    }
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
    assert_eq!(errno(renameat2(&p("dir/g"), &p("other"), libc::RENAME_WHITEOUT | libc::RENAME_NOREPLACE)), libc::EEXIST);
    assert_eq!(errno(renameat2(&p("dir/g"), &p("other"), libc::RENAME_WHITEOUT | libc::RENAME_EXCHANGE)), libc::EINVAL);
    fx.remount();
    assert!(is_whiteout(&p("f")) && is_whiteout(&p("dir/sub")));
    assert_eq!(fs::read(p("dir/g")).unwrap(), b"data");
    fs::remove_file(p("f")).unwrap();
    fx.unmount();
    assert_fsck_clean(&fx.image);
}
