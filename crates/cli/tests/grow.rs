//! `ferrofs grow` as a user runs it: a file system with files grown and used through a mount
//! (statfs, files in the new AGs, a fill past the old size, fsck clean, remount), and every
//! argument that cannot grow refused with a message naming why. The mount test skips where
//! /dev/fuse or root is missing.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;

use common::{is_mounted, run, stderr, unavailable, BIN};

const MIB: u64 = 1 << 20;

fn ferrofs(args: &[&str], image: &Path) -> Output {
    run(Command::new(BIN).args(&args[..1]).arg(image).args(&args[1..]))
}

fn succeeds(args: &[&str], image: &Path) -> String {
    let o = ferrofs(args, image);
    assert!(o.status.success(), "ferrofs {args:?}: {}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The failure message of a command that must fail with exit status 1.
fn refused(args: &[&str], image: &Path) -> String {
    let o = ferrofs(args, image);
    assert_eq!(o.status.code(), Some(1), "ferrofs {args:?} should fail: {}", stderr(&o));
    stderr(&o)
}

/// A mount point unmounted on drop, even when the test fails.
struct Mounted(PathBuf);

impl Mounted {
    fn new(image: &Path, mnt: &Path) -> Mounted {
        let o = run(Command::new(BIN).arg("mount").arg("--daemon").arg(image).arg(mnt));
        assert!(o.status.success(), "mount: {}", stderr(&o));
        Mounted(mnt.to_path_buf())
    }

    /// Unmount and wait for the daemon to let go of the image.
    fn unmount(self, image: &Path) {
        assert!(Command::new("umount").arg(&self.0).status().unwrap().success());
        let deadline = Instant::now() + Duration::from_secs(30);
        while ferrofs::dev::FileDevice::open(image, false).is_err() {
            assert!(Instant::now() < deadline, "the daemon kept the image locked");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if is_mounted(&self.0) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }
}

fn statvfs(dir: &Path) -> libc::statvfs {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: `path` is a NUL-terminated string and `st` a plain struct statvfs fills in.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        assert_eq!(libc::statvfs(path.as_ptr(), &mut st), 0, "statvfs {}", dir.display());
        st
    }
}

fn contents(i: u64) -> Vec<u8> {
    (0..100_000 + i * 7919).map(|b| (b * 13 + i) as u8).collect()
}

fn assert_files(mnt: &Path, n: u64) {
    for i in 0..n {
        assert_eq!(std::fs::read(mnt.join(format!("d{i}/f"))).unwrap(), contents(i), "d{i}/f");
    }
}

#[test]
fn a_grown_file_system_keeps_its_files_and_uses_the_new_space() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED grow through a mount: {why}");
    }
    let dir = tempfile::tempdir().unwrap();
    let (image, mnt) = (dir.path().join("fs.img"), dir.path().join("mnt"));
    std::fs::create_dir(&mnt).unwrap();
    succeeds(&["mkfs", "--size", "64M"], &image);
    let m = Mounted::new(&image, &mnt);
    for i in 0..8 {
        std::fs::create_dir(mnt.join(format!("d{i}"))).unwrap();
        std::fs::write(mnt.join(format!("d{i}/f")), contents(i)).unwrap();
    }
    let before = statvfs(&mnt);
    assert!(refused(&["grow", "160M"], &image).contains("unmount it first"));
    assert!(refused(&["grow", "160M"], &mnt).contains("unmount it"));
    m.unmount(&image);

    let out = succeeds(&["grow", "160M"], &image);
    assert!(out.contains("from 64.0 MiB to 160.0 MiB (6 new allocation groups)"), "{out}");
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 160 * MIB, "the image file grew");
    succeeds(&["fsck", "-n"], &image);

    let m = Mounted::new(&image, &mnt);
    assert_files(&mnt, 8);
    let after = statvfs(&mnt);
    assert_eq!(after.f_blocks * after.f_frsize, 160 * MIB);
    assert!(after.f_bfree > before.f_bfree + (90 * MIB) / after.f_frsize, "{} free blocks", after.f_bfree);
    // New directories rotate over the AGs: filling them reaches the new AGs (4..10) and
    // writes more than the whole old file system held.
    let chunk = vec![0xa5u8; MIB as usize];
    let (mut written, mut top_ag) = (0u64, 0u64);
    'fill: for d in 0..100 {
        let sub = mnt.join(format!("fill{d}"));
        std::fs::create_dir(&sub).unwrap();
        top_ag = top_ag.max(std::fs::metadata(&sub).unwrap().ino() >> 32);
        let mut f = std::fs::File::create(sub.join("data")).unwrap();
        for _ in 0..4 {
            match std::io::Write::write_all(&mut f, &chunk).and_then(|()| f.sync_all()) {
                Ok(()) => written += MIB,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break 'fill,
                Err(e) => panic!("fill: {e}"),
            }
        }
    }
    assert!(top_ag >= 4, "no directory in a new AG (highest AG {top_ag})");
    assert!(written > 64 * MIB, "wrote {written} bytes");
    m.unmount(&image);
    succeeds(&["fsck", "-n"], &image);
    let m = Mounted::new(&image, &mnt);
    assert_files(&mnt, 8);
    m.unmount(&image);
}

#[test]
fn bad_grow_arguments_are_refused_with_a_reason() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("fs.img");
    succeeds(&["mkfs", "--size", "64M"], &image);
    assert!(refused(&["grow", "32M"], &image).contains("cannot shrink"));
    assert!(refused(&["grow", "64M"], &image).contains("nothing to grow"));
    assert!(refused(&["grow"], &image).contains("nothing to grow"), "default: the file's own size");
    assert!(refused(&["grow", "+64K"], &image).contains("adds no usable space"));
    assert!(refused(&["grow", "+0"], &image).contains("nothing to grow"));
    assert!(refused(&["grow", "+16000000T"], &image).contains("more than the file system can grow to"));
    let o = ferrofs(&["grow", "100001"], &image);
    assert_eq!(o.status.code(), Some(2), "a usage error");
    assert!(stderr(&o).contains("not a whole number of 4096-byte blocks"), "{}", stderr(&o));
    assert_eq!(std::fs::metadata(&image).unwrap().len(), 64 * MIB, "nothing refused grew the file");

    let junk = dir.path().join("junk.img");
    std::fs::write(&junk, vec![0x5au8; MIB as usize]).unwrap();
    assert!(refused(&["grow", "2M"], &junk).contains("not a ferrofs image"));
    assert!(refused(&["grow", "1G"], &dir.path().join("missing.img")).contains("No such file"));

    // `+SIZE` adds to the file system, and the default takes a file lengthened by hand.
    assert!(succeeds(&["grow", "+16M"], &image).contains("to 80.0 MiB"));
    std::fs::OpenOptions::new().write(true).open(&image).unwrap().set_len(96 * MIB).unwrap();
    assert!(succeeds(&["grow"], &image).contains("to 96.0 MiB"));
    succeeds(&["fsck", "-n"], &image);
}
