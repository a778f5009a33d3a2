//! Limits through a real mount: a full file system and a very large directory.
//!
//! `FERROFS_BIG_DIR` sets the number of files in the large directory (default 100,000;
//! `FERROFS_BIG_DIR=1000000` for the full-size run).

mod common;

use common::*;
use std::collections::HashSet;
use std::fs::{self, File};
use std::io::{ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;
use std::time::Instant;

/// The bytes of file `i`: different per file, so a mixed-up block shows.
fn content(i: usize, len: usize) -> Vec<u8> {
    (0..len).map(|b| (b as u32).wrapping_mul(2_654_435_761).wrapping_add(i as u32).to_le_bytes()[3] | 1).collect()
}

/// Write `len` bytes of file `i` in 64 KiB pieces; the error that stopped it, if any.
fn write_file(path: &std::path::Path, i: usize, len: usize) -> std::io::Result<()> {
    let mut f = File::create(path)?;
    for piece in content(i, len).chunks(64 << 10) {
        f.write_all(piece)?;
    }
    f.sync_all()
}

#[test]
fn full_file_system_returns_enospc_and_stays_consistent() {
    let Some(mut fx) = Fixture::with_size("enospc", 48 << 20, |_| {}) else { return };
    const LEN: usize = 1 << 20;
    // Fill it: the program sees ENOSPC, not a crash, a hang or EIO.
    let mut written = Vec::new();
    let err = loop {
        let i = written.len();
        match write_file(&fx.path(&format!("f{i}")), i, LEN) {
            Ok(()) => written.push(i),
            Err(e) => break e,
        }
        assert!(i < 100, "48 MiB took more than 100 files of 1 MiB");
    };
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err}");
    assert!(written.len() >= 30, "only {} MiB fit in 48 MiB", written.len());
    let st = statvfs(&fx.mnt);
    assert!(st.f_bfree < 256, "{} blocks still free at ENOSPC", st.f_bfree);
    // Everything acknowledged is intact.
    for &i in &written {
        assert!(fs::read(fx.path(&format!("f{i}"))).unwrap() == content(i, LEN), "file f{i} changed");
    }
    // Free some space and write again: the space comes back at once.
    let partial = written.len();
    let _ = fs::remove_file(fx.path(&format!("f{partial}")));
    for &i in written.iter().step_by(2) {
        fs::remove_file(fx.path(&format!("f{i}"))).unwrap();
    }
    let freed = written.len().div_ceil(2);
    for j in 0..freed - 1 {
        let i = 1000 + j;
        write_file(&fx.path(&format!("f{i}")), i, LEN)
            .unwrap_or_else(|e| panic!("rewrite {j} of {freed} after freeing: {e}"));
    }
    fx.unmount();
    assert_fsck_clean(&fx.image);
    fx.mount().unwrap();
    for i in written.iter().skip(1).step_by(2).copied().chain(1000..1000 + freed - 1) {
        assert!(fs::read(fx.path(&format!("f{i}"))).unwrap() == content(i, LEN), "file f{i} after remount");
    }
}

fn statvfs(path: &std::path::Path) -> libc::statvfs {
    let p = cpath(path);
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    check(unsafe { libc::statvfs(p.as_ptr(), &mut st) }).unwrap();
    st
}

#[test]
fn directory_with_many_entries() {
    let n: usize = std::env::var("FERROFS_BIG_DIR").ok().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    // Inodes: mkfs gives one per 16 KiB by default; leave room.
    let size = (((n as u64 * 24) << 10) + (256 << 20)).max(512 << 20);
    let Some(mut fx) = Fixture::with_size("bigdir", size, |_| {}) else { return };
    let dir = fx.path("d");
    fs::create_dir(&dir).unwrap();
    let name = |i: usize| format!("entry-{i:07}");
    let t = Instant::now();
    for i in 0..n {
        // mknod: one request per file (create + release would be three).
        let p = cpath(&dir.join(name(i)));
        check(unsafe { libc::mknod(p.as_ptr(), libc::S_IFREG | 0o644, 0) })
            .unwrap_or_else(|e| panic!("mknod {}: {e}", name(i)));
    }
    let created = t.elapsed();
    // readdir returns every entry exactly once.
    let t = Instant::now();
    let mut seen = HashSet::with_capacity(n);
    for e in fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        assert!(seen.insert(e.file_name().as_bytes().to_vec()), "{:?} returned twice", e.file_name());
    }
    assert_eq!(seen.len(), n);
    assert!((0..n).all(|i| seen.contains(name(i).as_bytes())), "an entry is missing");
    assert_eq!(fs::metadata(&dir).unwrap().len(), n as u64, "directory size is its entry count");
    let listed = t.elapsed();
    // After a remount (nothing cached in the kernel), lookups find every name.
    fx.remount();
    let t = Instant::now();
    let mut inos = HashSet::with_capacity(n);
    for i in 0..n {
        let m = fs::symlink_metadata(dir.join(name(i))).unwrap_or_else(|e| panic!("lookup {}: {e}", name(i)));
        assert!(m.is_file() && inos.insert(std::os::unix::fs::MetadataExt::ino(&m)), "{}", name(i));
    }
    assert_eq!(fs::symlink_metadata(dir.join("entry-missing")).unwrap_err().kind(), ErrorKind::NotFound);
    let looked_up = t.elapsed();
    let t = Instant::now();
    for i in 0..n {
        fs::remove_file(dir.join(name(i))).unwrap_or_else(|e| panic!("unlink {}: {e}", name(i)));
    }
    assert_eq!(fs::read_dir(&dir).unwrap().count(), 0);
    fs::remove_dir(&dir).unwrap();
    let removed = t.elapsed();
    eprintln!("{n} entries: create {created:?}, readdir {listed:?}, lookup {looked_up:?}, unlink {removed:?}");
    fx.unmount();
    assert_fsck_clean(&fx.image);
}
