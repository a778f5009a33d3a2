//! Access times through the API: the kernel's rules for each mode (relatime by default,
//! strictatime, noatime, nodiratime), on reads and directory listings, kept across a
//! remount, never on a read-only mount.

use ferrofs::dev::{BlockDevice, MemDevice};
use ferrofs::format::inode::Timespec;
use ferrofs::*;
use std::sync::Arc;

mod common;

use common::{C, ROOT};

const DAY: i64 = 24 * 60 * 60;

fn mount(dev: &Arc<MemDevice>, atime: AtimeMode, nodiratime: bool) -> FileSystem {
    FileSystem::mount_device(
        dev.clone() as Arc<dyn BlockDevice>,
        &MountOptions { atime, nodiratime, ..MountOptions::default() },
    )
    .unwrap()
}

fn fresh(atime: AtimeMode, nodiratime: bool) -> (Arc<MemDevice>, FileSystem) {
    let dev = Arc::new(MemDevice::new(64 << 20));
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    let fs = mount(&dev, atime, nodiratime);
    (dev, fs)
}

/// A fresh file system with a file /f holding "data": (device, file system, inode of /f).
fn with_file(atime: AtimeMode) -> (Arc<MemDevice>, FileSystem, u64) {
    let (dev, fs) = fresh(atime, false);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    fs.write(f, 0, b"data").unwrap();
    (dev, fs, f)
}

fn key(t: Timespec) -> (i64, u32) {
    (t.sec, t.nsec)
}

fn atime(fs: &FileSystem, ino: u64) -> (i64, u32) {
    key(fs.getattr(ino).unwrap().atime)
}

/// Past the clock's resolution, so that "now" differs from the last time set.
fn tick() {
    std::thread::sleep(std::time::Duration::from_millis(5));
}

fn ago(secs: i64) -> Timespec {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    Timespec { sec: now.as_secs() as i64 - secs, nsec: 0 }
}

/// Set all three times (ctime too, so that the change itself does not make atime due).
fn set_times(fs: &FileSystem, ino: u64, a: i64, m: i64, c: i64) {
    let sa = SetAttr {
        atime: Some(TimeOrNow::Time(ago(a))),
        mtime: Some(TimeOrNow::Time(ago(m))),
        ctime: Some(ago(c)),
        ..SetAttr::default()
    };
    fs.setattr(ino, &sa).unwrap();
}

fn listing(fs: &FileSystem, dir: u64) -> usize {
    let mut n = 0;
    fs.readdir(dir, 0, &mut |_| {
        n += 1;
        true
    })
    .unwrap();
    n
}

#[test]
fn relatime_updates_once_after_each_change_and_daily() {
    let (dev, fs) = fresh(AtimeMode::default(), false);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    fs.write(f, 0, b"data").unwrap();
    let written = fs.getattr(f).unwrap();
    tick();
    assert_eq!(fs.read(f, 0, 4).unwrap(), b"data");
    let first = atime(&fs, f);
    assert!(first > key(written.mtime), "a read after a write sets atime");
    assert!(!fs.atime_update_due(&fs.getattr(f).unwrap()));
    tick();
    fs.read(f, 0, 4).unwrap();
    assert_eq!(atime(&fs, f), first, "a second read changes nothing");
    // A write makes the next read update again.
    tick();
    fs.write(f, 4, b"more").unwrap();
    assert!(fs.atime_update_due(&fs.getattr(f).unwrap()));
    tick();
    fs.read(f, 0, 8).unwrap();
    let second = atime(&fs, f);
    assert!(second > first && second > key(fs.getattr(f).unwrap().mtime));
    // A day-old atime is updated although nothing changed since; an hour-old one is not.
    set_times(&fs, f, 2 * DAY, 3 * DAY, 3 * DAY);
    fs.read(f, 0, 1).unwrap();
    assert!(atime(&fs, f).0 > ago(60).sec, "a day-old atime is refreshed");
    set_times(&fs, f, 3600, 3 * DAY, 3 * DAY);
    fs.read(f, 0, 1).unwrap();
    assert_eq!(atime(&fs, f), key(ago(3600)), "an hour-old atime later than mtime and ctime stays");
    // A listing updates the directory's atime the same way (its last create changed it).
    let d = fs.mkdir(ROOT, b"d", 0o755, C).unwrap().ino;
    fs.create(d, b"x", 0o644, C).unwrap();
    tick();
    let before = atime(&fs, d);
    assert_eq!(listing(&fs, d), 3);
    let listed = atime(&fs, d);
    assert!(listed > before);
    // Kept across a remount: the update is logged like any inode change.
    fs.read(f, 0, 1).unwrap();
    let kept = (atime(&fs, f), listed);
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, AtimeMode::default(), false);
    assert_eq!((atime(&fs, f), atime(&fs, d)), kept);
}

#[test]
fn strictatime_updates_on_every_access() {
    let (_dev, fs, f) = with_file(AtimeMode::Strict);
    let mut last = atime(&fs, f);
    for _ in 0..3 {
        tick();
        fs.read(f, 0, 4).unwrap();
        assert!(atime(&fs, f) > last, "each read sets atime");
        last = atime(&fs, f);
        assert!(fs.atime_update_due(&fs.getattr(f).unwrap()), "due again once the clock moved on");
    }
    let before = atime(&fs, ROOT);
    tick();
    listing(&fs, ROOT);
    assert!(atime(&fs, ROOT) > before, "and each listing");
}

#[test]
fn noatime_never_updates() {
    let (dev, fs, f) = with_file(AtimeMode::Never);
    set_times(&fs, f, 2 * DAY, DAY, DAY);
    let (a, root) = (atime(&fs, f), atime(&fs, ROOT));
    assert!(!fs.atime_update_due(&fs.getattr(f).unwrap()));
    tick();
    fs.read(f, 0, 4).unwrap();
    listing(&fs, ROOT);
    assert_eq!((atime(&fs, f), atime(&fs, ROOT)), (a, root));
    fs.unmount().unwrap();
    drop(fs);
    let fs = mount(&dev, AtimeMode::Never, false);
    assert_eq!((atime(&fs, f), atime(&fs, ROOT)), (a, root));
}

#[test]
fn nodiratime_spares_directories_only() {
    for mode in [AtimeMode::Relative, AtimeMode::Strict] {
        let (_dev, fs) = fresh(mode, true);
        let d = fs.mkdir(ROOT, b"d", 0o755, C).unwrap().ino;
        let f = fs.create(d, b"f", 0o644, C).unwrap().ino;
        fs.write(f, 0, b"data").unwrap();
        let (dir_before, file_before) = (atime(&fs, d), atime(&fs, f));
        assert!(!fs.atime_update_due(&fs.getattr(d).unwrap()));
        tick();
        listing(&fs, d);
        fs.read(f, 0, 4).unwrap();
        assert_eq!(atime(&fs, d), dir_before, "{mode:?}: a listing leaves the directory's atime");
        assert!(atime(&fs, f) > file_before, "{mode:?}: a read still sets the file's");
    }
}

#[test]
fn a_read_only_mount_never_updates() {
    let (dev, fs, f) = with_file(AtimeMode::Strict);
    fs.unmount().unwrap();
    drop(fs);
    let image = dev.to_bytes();
    let opts = MountOptions { read_only: true, atime: AtimeMode::Strict, ..MountOptions::default() };
    let fs = FileSystem::mount_device(dev.clone() as Arc<dyn BlockDevice>, &opts).unwrap();
    let a = atime(&fs, f);
    assert!(!fs.atime_update_due(&fs.getattr(f).unwrap()));
    tick();
    fs.read(f, 0, 4).unwrap();
    listing(&fs, ROOT);
    assert_eq!(atime(&fs, f), a);
    drop(fs);
    assert!(dev.to_bytes() == image, "a read-only mount wrote to the image");
}
