//! API behaviour on an in-memory device: every operation, its errors, and persistence
//! across unmount and remount.

use ferrofs::dev::MemDevice;
use ferrofs::*;
use std::sync::Arc;

mod common;

use common::{fresh, remount, C, ROOT};

fn names(fs: &FileSystem, dir: u64) -> Vec<Vec<u8>> {
    let mut v = Vec::new();
    fs.readdir(dir, 0, &mut |e| {
        v.push(e.name.to_vec());
        true
    })
    .unwrap();
    v.sort();
    v
}

#[test]
fn create_write_read_remount() {
    let (dev, fs) = fresh(64 << 20);
    let d = fs.mkdir(ROOT, b"dir", 0o755, C).unwrap();
    let f = fs.create(d.ino, b"file", 0o644, C).unwrap();
    assert_eq!(f.uid, 1000);
    let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
    assert_eq!(fs.write(f.ino, 10, &data).unwrap(), data.len());
    assert_eq!(fs.read(f.ino, 10, data.len()).unwrap(), data);
    assert_eq!(fs.read(f.ino, 0, 10).unwrap(), vec![0u8; 10]);
    assert_eq!(fs.getattr(f.ino).unwrap().size, 100_010);
    let fs = remount(&dev, fs);
    let f2 = fs.resolve("/dir/file").unwrap();
    assert_eq!(f2.ino, f.ino);
    assert_eq!(fs.read(f.ino, 10, data.len()).unwrap(), data);
    assert_eq!(names(&fs, d.ino), vec![b".".to_vec(), b"..".to_vec(), b"file".to_vec()]);
    assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3);
}

#[test]
fn many_entries_and_errors() {
    let (dev, fs) = fresh(128 << 20);
    let d = fs.mkdir(ROOT, b"big", 0o755, C).unwrap();
    for i in 0..5000 {
        fs.create(d.ino, format!("f{:05}", i).as_bytes(), 0o644, C).unwrap();
    }
    assert!(matches!(fs.create(d.ino, b"f00042", 0o644, C), Err(Error::Exists)));
    assert!(matches!(fs.rmdir(ROOT, b"big"), Err(Error::NotEmpty)));
    assert!(matches!(fs.create(d.ino, &[b'x'; 256], 0o644, C), Err(Error::NameTooLong)));
    assert!(matches!(fs.lookup(d.ino, b"nope"), Err(Error::NotFound)));
    for i in (0..5000).step_by(2) {
        fs.unlink(d.ino, format!("f{:05}", i).as_bytes()).unwrap();
    }
    let fs = remount(&dev, fs);
    assert_eq!(names(&fs, d.ino).len(), 2 + 2500);
    for i in (1..5000).step_by(2) {
        fs.unlink(d.ino, format!("f{:05}", i).as_bytes()).unwrap();
    }
    fs.rmdir(ROOT, b"big").unwrap();
    assert_eq!(names(&fs, ROOT), vec![b".".to_vec(), b"..".to_vec()]);
}

#[test]
fn rename_link_symlink_xattr() {
    let (dev, fs) = fresh(64 << 20);
    let a = fs.mkdir(ROOT, b"a", 0o755, C).unwrap();
    let b = fs.mkdir(ROOT, b"b", 0o755, C).unwrap();
    let f = fs.create(a.ino, b"f", 0o644, C).unwrap();
    fs.rename(a.ino, b"f", b.ino, b"g", 0).unwrap();
    assert!(matches!(fs.lookup(a.ino, b"f"), Err(Error::NotFound)));
    assert_eq!(fs.lookup(b.ino, b"g").unwrap().ino, f.ino);
    fs.link(f.ino, a.ino, b"h").unwrap();
    assert_eq!(fs.getattr(f.ino).unwrap().nlink, 2);
    assert!(matches!(fs.rename(ROOT, b"a", a.ino, b"x", 0), Err(Error::Invalid(_))));
    fs.rename(ROOT, b"a", b.ino, b"a2", 0).unwrap();
    assert_eq!(fs.getattr(ROOT).unwrap().nlink, 3);
    assert_eq!(fs.getattr(b.ino).unwrap().nlink, 3);
    let long = vec![b'y'; 300];
    let s = fs.symlink(ROOT, b"s", &long, C).unwrap();
    let s2 = fs.symlink(ROOT, b"t", b"short", C).unwrap();
    fs.setxattr(f.ino, b"user.small", b"v", 0).unwrap();
    fs.setxattr(f.ino, b"user.large", &[7u8; 900], 0).unwrap();
    assert!(matches!(fs.setxattr(f.ino, b"user.small", b"v", ferrofs::xattr::XATTR_CREATE), Err(Error::Exists)));
    let fs = remount(&dev, fs);
    assert_eq!(fs.readlink(s.ino).unwrap(), long);
    assert_eq!(fs.readlink(s2.ino).unwrap(), b"short");
    assert_eq!(fs.getxattr(f.ino, b"user.large").unwrap(), vec![7u8; 900]);
    let mut l = fs.listxattr(f.ino).unwrap();
    l.sort();
    assert_eq!(l, vec![b"user.large".to_vec(), b"user.small".to_vec()]);
    fs.removexattr(f.ino, b"user.large").unwrap();
    assert!(matches!(fs.getxattr(f.ino, b"user.large"), Err(Error::NoAttr)));
    fs.rename(b.ino, b"g", ROOT, b"t", RENAME_EXCHANGE).unwrap();
    assert_eq!(fs.lookup(ROOT, b"t").unwrap().ino, f.ino);
}

/// RENAME_WHITEOUT leaves a character device 0/0 owned by the caller at the source name,
/// for files and directories alike; it cannot be combined with RENAME_EXCHANGE.
#[test]
fn rename_with_whiteout() {
    let (dev, fs) = fresh(64 << 20);
    let a = fs.mkdir(ROOT, b"a", 0o755, C).unwrap();
    let f = fs.create(a.ino, b"f", 0o644, C).unwrap();
    let sub = fs.mkdir(a.ino, b"sub", 0o755, C).unwrap();
    let owner = Cred { uid: 0, gid: 7, umask: 0 };
    fs.rename_as(a.ino, b"f", ROOT, b"g", RENAME_WHITEOUT, owner).unwrap();
    fs.rename_as(a.ino, b"sub", ROOT, b"sub2", RENAME_WHITEOUT | RENAME_NOREPLACE, owner).unwrap();
    assert!(matches!(fs.rename(ROOT, b"g", ROOT, b"sub2", RENAME_WHITEOUT | RENAME_EXCHANGE), Err(Error::Invalid(_))));
    assert!(matches!(fs.rename(ROOT, b"g", ROOT, b"sub2", RENAME_WHITEOUT | RENAME_NOREPLACE), Err(Error::Exists)));
    let fs = remount(&dev, fs);
    assert_eq!(fs.lookup(ROOT, b"g").unwrap().ino, f.ino);
    assert_eq!(fs.lookup(ROOT, b"sub2").unwrap().ino, sub.ino);
    for name in [&b"f"[..], b"sub"] {
        let w = fs.lookup(a.ino, name).unwrap();
        assert_eq!((w.kind, w.rdev, w.perm, w.nlink, w.uid, w.gid), (FileType::CharDevice, 0, 0, 1, 0, 7));
    }
    // The directory moved out: `a` has lost its link from sub/.. and holds two whiteouts.
    assert_eq!(fs.getattr(a.ino).unwrap().nlink, 2);
    assert_eq!(names(&fs, a.ino), vec![b".".to_vec(), b"..".to_vec(), b"f".to_vec(), b"sub".to_vec()]);
    fs.unlink(a.ino, b"f").unwrap();
    fs.unlink(a.ino, b"sub").unwrap();
    fs.rmdir(ROOT, b"a").unwrap();
}

/// An O_TMPFILE file: no name and no link from birth, readable and writable while open,
/// freed at its last close unless `link` names it; a file made not linkable (O_EXCL) or
/// one whose last name was removed cannot be named again.
#[test]
fn tmpfile_link_and_release() {
    let (dev, fs) = fresh(64 << 20);
    let free0 = (fs.statfs().bfree, fs.statfs().ffree);
    let d = fs.mkdir(ROOT, b"d", 0o2775, Cred { uid: 5, gid: 6, umask: 0 }).unwrap();
    let t = fs.tmpfile(d.ino, 0o640, C, true).unwrap();
    assert_eq!((t.nlink, t.perm, t.uid, t.gid, t.kind), (0, 0o640, 1000, 6, FileType::RegularFile));
    assert_eq!(names(&fs, d.ino).len(), 2, "a tmpfile has no name");
    fs.write(t.ino, 0, &[9u8; 20_000]).unwrap();
    let l = fs.link(t.ino, d.ino, b"named").unwrap();
    assert_eq!(l.nlink, 1);
    fs.release(t.ino).unwrap();
    assert_eq!(fs.read(t.ino, 0, 20_000).unwrap(), vec![9u8; 20_000]);
    // Unlinked while open, it cannot come back: only a tmpfile is linkable, and only once.
    fs.open(t.ino).unwrap();
    fs.unlink(d.ino, b"named").unwrap();
    assert!(matches!(fs.link(t.ino, d.ino, b"again"), Err(Error::NotFound)));
    fs.release(t.ino).unwrap();
    let excl = fs.tmpfile(d.ino, 0o600, C, false).unwrap();
    assert!(matches!(fs.link(excl.ino, d.ino, b"x"), Err(Error::NotFound)));
    fs.write(excl.ino, 0, b"gone").unwrap();
    fs.release(excl.ino).unwrap();
    assert!(fs.getattr(excl.ino).is_err(), "freed at its last close");
    let plain = fs.create(d.ino, b"plain", 0o600, C).unwrap();
    assert!(matches!(fs.tmpfile(plain.ino, 0o600, C, true), Err(Error::NotDir)));
    fs.unlink(d.ino, b"plain").unwrap();
    fs.rmdir(ROOT, b"d").unwrap();
    let fs = remount(&dev, fs);
    assert_eq!((fs.statfs().bfree, fs.statfs().ffree), free0, "everything freed");
}

fn fsck_clean(dev: &MemDevice) {
    let r = ferrofs::fsck::check(dev, &ferrofs::fsck::FsckOptions::default(), &|_, _, _| {}).unwrap();
    assert!(r.is_clean(), "fsck: {:#?}", r.messages);
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

/// Deleting /f gives back every block its attributes took: `free0` were free before.
fn assert_deleting_frees(dev: &std::sync::Arc<MemDevice>, fs: FileSystem, free0: u64) {
    fs.unlink(ROOT, b"f").unwrap();
    fs.sync().unwrap();
    let fs = remount(dev, fs);
    fsck_clean(dev);
    assert!(fs.statfs().bfree >= free0, "value blocks leaked: {} free, {free0} before", fs.statfs().bfree);
}

/// Values up to Linux's XATTR_SIZE_MAX (64 KiB) are stored: past 1024 bytes in value blocks,
/// which a replace, a remove and the file's deletion give back, and fsck accounts for.
#[test]
fn xattr_values_up_to_64k() {
    use ferrofs::format::XATTR_VALUE_MAX;
    use ferrofs::xattr::{LOCAL_VALUE_MAX, VALUE_BLOCK_BYTES, XATTR_REPLACE};
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap();
    fs.sync().unwrap();
    let free0 = fs.statfs().bfree;
    let sizes =
        [LOCAL_VALUE_MAX, LOCAL_VALUE_MAX + 1, VALUE_BLOCK_BYTES, VALUE_BLOCK_BYTES + 1, 30_000, XATTR_VALUE_MAX];
    for (i, &len) in sizes.iter().enumerate() {
        fs.setxattr(f.ino, format!("user.v{len}").as_bytes(), &pattern(len, i as u8), 0).unwrap();
    }
    assert!(matches!(fs.setxattr(f.ino, b"user.over", &[0; XATTR_VALUE_MAX + 1], 0), Err(Error::TooBig)));
    // 17 value blocks for 64 KiB, 1 for 1025 bytes...
    let value_blocks: u64 = sizes.iter().map(|&l| ferrofs::xattr::value_blocks(l)).sum();
    assert_eq!(value_blocks, 1 + 1 + 2 + 8 + 17);
    assert!(fs.getattr(f.ino).unwrap().blocks * 512 / 4096 > value_blocks, "value blocks count in the file's blocks");
    let fs = remount(&dev, fs);
    fsck_clean(&dev);
    for (i, &len) in sizes.iter().enumerate() {
        assert_eq!(
            fs.getxattr(f.ino, format!("user.v{len}").as_bytes()).unwrap(),
            pattern(len, i as u8),
            "{len} bytes"
        );
    }
    // Replace large by large, large by small, small by large; remove one.
    fs.setxattr(f.ino, b"user.v65536", &pattern(50_000, 9), XATTR_REPLACE).unwrap();
    fs.setxattr(f.ino, b"user.v30000", b"short", XATTR_REPLACE).unwrap();
    fs.setxattr(f.ino, b"user.v1024", &pattern(20_000, 8), XATTR_REPLACE).unwrap();
    fs.removexattr(f.ino, b"user.v4064").unwrap();
    let fs = remount(&dev, fs);
    fsck_clean(&dev);
    assert_eq!(fs.getxattr(f.ino, b"user.v65536").unwrap(), pattern(50_000, 9));
    assert_eq!(fs.getxattr(f.ino, b"user.v30000").unwrap(), b"short");
    assert_eq!(fs.getxattr(f.ino, b"user.v1024").unwrap(), pattern(20_000, 8));
    assert!(matches!(fs.getxattr(f.ino, b"user.v4064"), Err(Error::NoAttr)));
    assert_deleting_frees(&dev, fs, free0);
}

/// Deleting a file whose values take more blocks than one transaction frees (several
/// batches, on the orphan list meanwhile) leaks nothing.
#[test]
fn xattr_values_freed_in_batches() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap();
    fs.sync().unwrap();
    let free0 = fs.statfs().bfree;
    let n = ferrofs::xattr::FREE_BATCH_BLOCKS / 17 * 2 + 3;
    for i in 0..n {
        fs.setxattr(f.ino, format!("user.{i}").as_bytes(), &pattern(65536, i as u8), 0).unwrap();
    }
    assert_deleting_frees(&dev, fs, free0);
}

/// A damaged value block is a corruption error for getxattr and an fsck finding naming the
/// block, never a panic or wrong bytes.
#[test]
fn damaged_xattr_value_block_is_found() {
    use ferrofs::dev::BlockDevice;
    use ferrofs::format::{header_magic, header_owner, BLOCK_SIZE, MAGIC_DATA_META};
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap();
    fs.setxattr(f.ino, b"user.big", &pattern(10_000, 1), 0).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    let bs = BLOCK_SIZE as u64;
    let mut b = vec![0u8; BLOCK_SIZE];
    let value_block = (0..dev.size() / bs)
        .find(|&n| {
            dev.read_at(&mut b, n * bs).unwrap();
            header_magic(&b) == MAGIC_DATA_META && header_owner(&b) == f.ino
        })
        .expect("a value block");
    dev.read_at(&mut b, value_block * bs).unwrap();
    b[100] ^= 0xff;
    dev.write_at(&b, value_block * bs).unwrap();
    let r = ferrofs::fsck::check(&*dev, &ferrofs::fsck::FsckOptions::default(), &|_, _, _| {}).unwrap();
    assert!(r.messages.iter().any(|m| m.contains(&format!("xattr value block {value_block}"))), "{:#?}", r.messages);
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
    assert!(matches!(fs.getxattr(f.ino, b"user.big"), Err(Error::Corrupt { .. })));
}

/// 5,000 attributes (75,000 bytes of names, more than the kernel's XATTR_LIST_MAX) are all
/// listed by the engine; the 64 KiB bound of a listxattr(2) is the kernel's.
#[test]
fn five_thousand_xattrs_are_listed() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap();
    for i in 0..5000 {
        fs.setxattr(f.ino, format!("user.attr_{i:04}").as_bytes(), b"v", 0).unwrap();
    }
    let fs = remount(&dev, fs);
    fsck_clean(&dev);
    let mut l = fs.listxattr(f.ino).unwrap();
    l.sort();
    let want: Vec<Vec<u8>> = (0..5000).map(|i| format!("user.attr_{i:04}").into_bytes()).collect();
    assert_eq!(l, want);
    assert_eq!(l.iter().map(|n| n.len() + 1).sum::<usize>(), 75_000);
}

#[test]
fn truncate_sparse_and_unlinked_open() {
    let (dev, fs) = fresh(256 << 20);
    let f = fs.create(ROOT, b"sparse", 0o644, C).unwrap();
    fs.write(f.ino, 5 << 30, b"far").unwrap();
    for i in 0..20u64 {
        fs.write(f.ino, i << 20, b"x").unwrap();
    }
    assert_eq!(fs.getattr(f.ino).unwrap().size, (5 << 30) + 3);
    assert_eq!(fs.read(f.ino, 5 << 30, 10).unwrap(), b"far");
    let free0 = fs.statfs().bfree;
    fs.setattr(f.ino, &SetAttr { size: Some(100), ..Default::default() }).unwrap();
    fs.setattr(f.ino, &SetAttr { size: Some(8192), ..Default::default() }).unwrap();
    assert_eq!(fs.read(f.ino, 0, 8192).unwrap()[..1], *b"x");
    assert_eq!(fs.read(f.ino, 1, 8191).unwrap(), vec![0u8; 8191]);
    fs.open(f.ino).unwrap();
    fs.unlink(ROOT, b"sparse").unwrap();
    assert_eq!(fs.read(f.ino, 0, 1).unwrap(), b"x");
    fs.sync().unwrap();
    assert!(fs.statfs().bfree >= free0);
    let fs = remount(&dev, fs);
    assert!(fs.getattr(f.ino).is_err(), "orphan freed at mount");
}

/// The budget covers a journal's memory as well as the caches: a member whose log alone is
/// over the limit, with nothing in its caches to reclaim, is asked to write it home; one
/// under the limit is left alone.
#[test]
fn the_budget_counts_the_log() {
    use ferrofs::cache::{CacheBudget, CacheOwner};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    struct LogOnly {
        log: u64,
        pushes: AtomicU64,
    }
    impl CacheOwner for LogOnly {
        fn cache_bytes(&self) -> u64 {
            0
        }
        fn log_bytes(&self) -> u64 {
            self.log
        }
        fn ag_count(&self) -> u32 {
            1
        }
        fn reclaim_ag(&self, _ag: u32) -> Option<u64> {
            Some(0)
        }
        fn push_dirty(&self) {
            self.pushes.fetch_add(1, Relaxed);
        }
        fn write_home(&self) {}
        fn home_seq(&self) -> u64 {
            0
        }
    }
    const LIMIT: u64 = 1 << 20;
    let over = Arc::new(LogOnly { log: 2 * LIMIT, pushes: AtomicU64::new(0) });
    let under = Arc::new(LogOnly { log: LIMIT / 2, pushes: AtomicU64::new(0) });
    for owner in [&over, &under] {
        let b = CacheBudget::new(LIMIT);
        b.join(Arc::downgrade(owner) as std::sync::Weak<dyn CacheOwner>);
        assert_eq!(b.used(), owner.log);
        b.check();
    }
    assert_eq!(over.pushes.load(Relaxed), 1, "a log over the budget is written home");
    assert_eq!(under.pushes.load(Relaxed), 0, "a log under the budget is left alone");
}

/// A sweep that cannot get under the limit (everything dirty) stalls the budget: the checks
/// after it do not sweep again until writeback moves on or usage grows by an eighth of the
/// limit (each check used to sweep every AG twice again), but they still mark it over, for
/// the next transaction to be throttled.
#[test]
fn a_futile_sweep_waits_for_writeback() {
    use ferrofs::cache::{CacheBudget, CacheOwner};
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    #[derive(Default)]
    struct AllDirty {
        bytes: AtomicU64,
        home: AtomicU64,
        scans: AtomicU64,
        pushes: AtomicU64,
    }
    impl CacheOwner for AllDirty {
        fn cache_bytes(&self) -> u64 {
            self.bytes.load(Relaxed)
        }
        fn log_bytes(&self) -> u64 {
            0
        }
        fn ag_count(&self) -> u32 {
            4
        }
        fn reclaim_ag(&self, _ag: u32) -> Option<u64> {
            self.scans.fetch_add(1, Relaxed);
            Some(0)
        }
        fn push_dirty(&self) {
            self.pushes.fetch_add(1, Relaxed);
        }
        fn write_home(&self) {}
        fn home_seq(&self) -> u64 {
            self.home.load(Relaxed)
        }
    }
    const LIMIT: u64 = 8 << 20;
    let owner = Arc::new(AllDirty::default());
    owner.bytes.store(LIMIT + 1, Relaxed);
    let b = CacheBudget::new(LIMIT);
    b.join(Arc::downgrade(&owner) as std::sync::Weak<dyn CacheOwner>);
    let counts = || (owner.scans.load(Relaxed), owner.pushes.load(Relaxed), b.stats.stalled_checks.load(Relaxed));
    b.check();
    let (sweep, ..) = counts();
    assert!(sweep > 0);
    assert_eq!(counts(), (sweep, 1, 0), "one sweep, then writeback asked for");
    for _ in 0..100 {
        b.check();
    }
    assert_eq!(counts(), (sweep, 1, 100), "nothing changed: no more sweeps");
    assert!(b.is_over(), "the next transaction is throttled");
    owner.home.store(1, Relaxed);
    b.check();
    assert_eq!(counts(), (2 * sweep, 2, 100), "writeback moved on: swept again");
    owner.bytes.fetch_add(LIMIT / 8, Relaxed);
    b.check();
    assert_eq!(counts(), (3 * sweep, 3, 100), "usage grew by an eighth: swept again");
    owner.bytes.store(LIMIT, Relaxed);
    b.check();
    assert_eq!(counts(), (3 * sweep, 3, 100), "under the limit: nothing to do");
}

/// A small budget shrinks the journal to leave the caches room (the CIL pushes at a
/// sixteenth of it and holds commits at a quarter, recycled images keep an eighth at most,
/// writeback starts at a quarter), and the default budget keeps a 128 MiB log's own
/// thresholds.
#[test]
fn the_journal_fits_its_budget() {
    use ferrofs::journal::JournalConfig;
    let ring = (128 << 20) / 4096 - ferrofs::format::log::LOG_HEADER_BLOCKS;
    let own = JournalConfig::for_log(ring);
    let small = own.clone().within_budget(ring, 64 << 20);
    let thresholds = |c: &JournalConfig| (c.cil_push_bytes, c.cil_max_bytes, c.ail_push_percent, c.spare_max_bytes);
    assert_eq!(thresholds(&small), (4 << 20, 16 << 20, 12, 8 << 20));
    let default = own.clone().within_budget(ring, ferrofs::cache::DEFAULT_CACHE_BYTES);
    assert_eq!(thresholds(&default), thresholds(&own));
    let tiny = own.within_budget(ring, 1 << 20);
    assert_eq!(thresholds(&tiny), (1 << 20, 2 << 20, 4, 128 << 10), "floors");
}

/// A burst of creates makes everything it caches dirty, and reclaim can drop nothing until
/// the log is written home: transactions are throttled to write it home, and the budget's
/// count (caches and journal) stays near its limit throughout, with no explicit writeback;
/// with the journal's background threads off too, when only the throttle writes home.
#[test]
fn a_create_burst_is_throttled_to_its_budget() {
    use ferrofs::journal::JournalConfig;
    use std::sync::atomic::Ordering::Relaxed;
    const FILES: u32 = 100_000;
    const LIMIT: u64 = 16 << 20;
    for background in [true, false] {
        let budget = ferrofs::cache::CacheBudget::new(LIMIT);
        let mkfs = MkfsOptions { bytes_per_inode: 2048, ..MkfsOptions::default() };
        let ring = ferrofs::mkfs::plan(256 << 20, &mkfs).unwrap().log_ring_blocks();
        let journal = JournalConfig { background, ..JournalConfig::for_log(ring).within_budget(ring, LIMIT) };
        let dev = Arc::new(MemDevice::new(256 << 20));
        FileSystem::mkfs(&*dev, &mkfs).unwrap();
        let fs = FileSystem::mount_device(
            dev,
            &MountOptions { cache: Some(budget.clone()), journal: Some(journal), ..MountOptions::default() },
        )
        .unwrap();
        let dir = fs.mkdir(ROOT, b"d", 0o755, C).unwrap().ino;
        let mut peak = 0;
        for i in 0..FILES {
            fs.create(dir, format!("f{i}").as_bytes(), 0o644, C).unwrap();
            peak = peak.max(budget.used());
        }
        let throttles = budget.stats.throttles.load(Relaxed);
        println!("background {background}: peak {peak} bytes against {LIMIT}, {throttles} transactions throttled");
        assert!(throttles > 0, "no transaction was throttled");
        assert!(peak <= LIMIT + LIMIT / 8, "the budget counted {peak} bytes against a limit of {LIMIT}");
        assert_eq!(names(&fs, dir).len(), FILES as usize + 2, "the files and . and ..");
        fs.unmount().unwrap();
    }
}

/// A file system whose caches are far smaller than its tree keeps them within the budget
/// once the log is home, and reads back exactly what it dropped. Two file systems sharing a
/// budget are reclaimed together.
#[test]
fn caches_respect_a_shared_budget() {
    use ferrofs::cache::{CacheBudget, CacheOwner};
    let budget = CacheBudget::new(2 << 20);
    let opts = MountOptions { cache: Some(budget.clone()), ..MountOptions::default() };
    let mount = |size| {
        let dev = Arc::new(MemDevice::new(size));
        FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
        FileSystem::mount_device(dev, &opts).unwrap()
    };
    let (a, b) = (mount(256 << 20), mount(64 << 20));
    let dirs: Vec<u64> = (0..4).map(|d| a.mkdir(ROOT, format!("d{d}").as_bytes(), 0o755, C).unwrap().ino).collect();
    for i in 0..20_000u32 {
        let f = a.create(dirs[i as usize % 4], format!("f{i}").as_bytes(), 0o644, C).unwrap();
        if i % 1000 == 0 {
            a.write(f.ino, 0, &i.to_le_bytes()).unwrap();
        }
    }
    for i in 0..2_000u32 {
        b.create(ROOT, format!("g{i}").as_bytes(), 0o644, C).unwrap();
    }
    // Everything written home is clean: a pass over the whole tree must now stay in budget.
    a.mount().journal.quiesce().unwrap();
    b.mount().journal.quiesce().unwrap();
    for i in 0..20_000u32 {
        let f = a.lookup(dirs[i as usize % 4], format!("f{i}").as_bytes()).unwrap();
        if i % 1000 == 0 {
            assert_eq!(a.read(f.ino, 0, 4).unwrap(), i.to_le_bytes(), "file f{i} after its inode was dropped");
        }
    }
    let used = a.mount().cache_bytes() + b.mount().cache_bytes();
    assert!(used <= budget.limit() + budget.limit() / 4, "caches hold {used} bytes, budget {}", budget.limit());
    assert!(budget.stats.reclaimed_bytes.load(std::sync::atomic::Ordering::Relaxed) > 0);
    assert_eq!(names(&b, ROOT).iter().filter(|n| n.starts_with(b"g")).count(), 2_000);
    a.unmount().unwrap();
    b.unmount().unwrap();
}

/// A budget that bounds its process leaves the caches only what the rest of the process
/// does not hold: here the test process's RSS is far over half the limit, so the caches get
/// half of it, no more.
#[test]
fn a_budget_for_the_process_leaves_room_for_the_rest_of_it() {
    use ferrofs::cache::{CacheBudget, CacheOwner};
    const LIMIT: u64 = 4 << 20;
    let budget = CacheBudget::for_process(LIMIT);
    let dev = Arc::new(MemDevice::new(256 << 20));
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    let fs = FileSystem::mount_device(dev, &MountOptions { cache: Some(budget.clone()), ..MountOptions::default() })
        .unwrap();
    assert!(ferrofs_lockstat::memory::rss_bytes() > LIMIT / 2, "the test needs a process larger than half the limit");
    let files: Vec<Vec<u8>> = (0..20_000u32).map(|i| format!("f{i}").into_bytes()).collect();
    for f in &files {
        fs.create(ROOT, f, 0o644, C).unwrap();
    }
    fs.mount().journal.quiesce().unwrap();
    for f in &files {
        fs.lookup(ROOT, f).unwrap();
    }
    assert_eq!(budget.process_other_bytes(), LIMIT / 2, "the rest of the process, as sampled, at most half the limit");
    let used = fs.mount().cache_bytes();
    assert!(used <= LIMIT / 2 + LIMIT / 8, "caches hold {used} bytes; the room left them is {}", LIMIT / 2);
    fs.unmount().unwrap();
}

/// Threads taking turns on one directory commit its blocks into the directory's CIL shard
/// (`Tx::route_by`), each thread's private directory into the thread's own, while another
/// thread checkpoints: after a remount every directory holds exactly the names it should.
#[test]
fn threads_sharing_a_directory_lose_nothing() {
    const THREADS: usize = 4;
    const NAMES: usize = 2000;
    let (dev, fs) = fresh(256 << 20);
    let shared = fs.mkdir(ROOT, b"shared", 0o755, C).unwrap().ino;
    let private: Vec<u64> =
        (0..THREADS).map(|t| fs.mkdir(ROOT, format!("p{t}").as_bytes(), 0o755, C).unwrap().ino).collect();
    let done = std::sync::atomic::AtomicBool::new(false);
    // Released together, so that their changes to the directory meet in one CIL sequence.
    let start = std::sync::Barrier::new(THREADS);
    let name = |prefix: &str, i: usize| format!("{prefix}{i}").into_bytes();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..THREADS)
            .map(|t| {
                let (fs, own, start) = (&fs, private[t], &start);
                s.spawn(move || {
                    start.wait();
                    // Interleaved: neighbouring names, on the same leaves, come from different threads.
                    for i in (t..NAMES).step_by(THREADS) {
                        fs.create(shared, &name("f", i), 0o644, C).unwrap();
                        fs.create(own, &name("f", i), 0o644, C).unwrap();
                        if i % 3 == 0 {
                            fs.rename(shared, &name("f", i), shared, &name("r", i), 0).unwrap();
                            fs.rename(own, &name("f", i), shared, &name("m", i), 0).unwrap();
                        }
                        if i % 5 == 0 {
                            fs.unlink(shared, &name(if i % 3 == 0 { "r" } else { "f" }, i)).unwrap();
                        }
                    }
                })
            })
            .collect();
        s.spawn(|| {
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                fs.sync().unwrap();
            }
        });
        workers.into_iter().for_each(|w| w.join().unwrap());
        done.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    let routed = fs.mount().journal.routed_commits();
    assert!(routed > 0, "no commit went to the shared directory's shard");
    let fs = remount(&dev, fs);
    let mut want_shared: Vec<Vec<u8>> = vec![b".".to_vec(), b"..".to_vec()];
    let mut want_private: Vec<Vec<Vec<u8>>> = vec![vec![b".".to_vec(), b"..".to_vec()]; THREADS];
    for i in 0..NAMES {
        if i % 3 == 0 {
            want_shared.push(name("m", i));
        } else {
            want_private[i % THREADS].push(name("f", i));
        }
        if i % 5 != 0 {
            want_shared.push(name(if i % 3 == 0 { "r" } else { "f" }, i));
        }
    }
    want_shared.sort();
    assert_eq!(names(&fs, shared), want_shared);
    for (t, want) in want_private.iter_mut().enumerate() {
        want.sort();
        assert_eq!(&names(&fs, private[t]), want, "private directory {t}");
    }
}

#[test]
fn remount_read_only_refuses_changes_and_leaves_the_image_clean() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"before", 0o644, C).unwrap();
    fs.write(f.ino, 0, b"kept").unwrap();
    fs.mount().remount(true).unwrap();
    assert_eq!(fs.create(ROOT, b"refused", 0o644, C).unwrap_err().errno(), libc::EROFS);
    assert_eq!(fs.write(f.ino, 0, b"x").unwrap_err().errno(), libc::EROFS);
    assert_eq!(fs.read(f.ino, 0, 4).unwrap(), b"kept");
    // The image as it is on disk now: nothing left in the log, and consistent.
    let copy = Arc::new(dev.snapshot());
    let ro =
        FileSystem::mount_device(copy.clone(), &MountOptions { read_only: true, ..MountOptions::default() }).unwrap();
    assert_eq!(ro.mount().recovery.records, 0, "the log was written home");
    let report = ferrofs::fsck::check(&*copy, &ferrofs::fsck::FsckOptions { repair: false }, &|_, _, _| {}).unwrap();
    assert!(report.is_clean(), "{:?}", report.messages);
    fs.mount().remount(false).unwrap();
    fs.create(ROOT, b"after", 0o644, C).unwrap();
    let fs = remount(&dev, fs);
    assert_eq!(names(&fs, ROOT), [b".".to_vec(), b"..".to_vec(), b"after".to_vec(), b"before".to_vec()]);
    // A read-only mount stays so.
    fs.unmount().unwrap();
    drop(fs);
    let ro =
        FileSystem::mount_device(dev.clone(), &MountOptions { read_only: true, ..MountOptions::default() }).unwrap();
    assert!(ro.mount().remount(true).is_ok() && ro.mount().remount(false).is_err());
}

#[test]
fn privileges_dropped_before_a_change() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"prog", 0o6755, C).unwrap();
    let d = fs.mkdir(ROOT, b"dir", 0o2775, C).unwrap();
    let caps = b"security.capability";
    fs.setxattr(f.ino, caps, &[1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0], 0).unwrap();
    fs.setxattr(f.ino, b"user.kept", b"v", 0).unwrap();
    let before = fs.getattr(f.ino).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(2));

    // CAP_FSETID's holder keeps the set-id bits; the capabilities go all the same.
    assert!(fs.drop_privileges(f.ino, PrivDrop::Capabilities).unwrap());
    let a = fs.getattr(f.ino).unwrap();
    assert_eq!(a.perm, 0o6755);
    assert_ne!(a.ctime, before.ctime, "dropping privileges is a change");
    assert!(matches!(fs.getxattr(f.ino, caps), Err(Error::NoAttr)));
    assert_eq!(fs.getxattr(f.ino, b"user.kept").unwrap(), b"v");
    // Nothing left to drop: nothing written.
    assert!(!fs.drop_privileges(f.ino, PrivDrop::Capabilities).unwrap());
    assert_eq!(fs.getattr(f.ino).unwrap().ctime, a.ctime);

    assert!(fs.drop_privileges(f.ino, PrivDrop::CapabilitiesAndSetId).unwrap());
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o755);
    // setgid without group execute (mandatory locking) is no privilege.
    fs.setattr(f.ino, &SetAttr { mode: Some(0o6745), ..SetAttr::default() }).unwrap();
    assert!(fs.drop_privileges(f.ino, PrivDrop::CapabilitiesAndSetId).unwrap());
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o2745);
    // A directory's setgid is inheritance, not privilege.
    assert!(!fs.drop_privileges(d.ino, PrivDrop::CapabilitiesAndSetId).unwrap());
    assert_eq!(fs.getattr(d.ino).unwrap().perm, 0o2775);

    let fs = remount(&dev, fs);
    assert_eq!(fs.getattr(f.ino).unwrap().perm, 0o2745);
    assert!(matches!(fs.getxattr(f.ino, caps), Err(Error::NoAttr)));
    drop(fs);
    fsck_clean(&dev);
}

/// The umask takes permission bits only: the set-id and sticky bits a creation asks for stay.
#[test]
fn umask_applies_to_permission_bits_only() {
    let (_dev, fs) = fresh(64 << 20);
    let umask = |umask| Cred { umask, ..C };
    assert_eq!(fs.create(ROOT, b"f", 0o666, umask(0o022)).unwrap().perm, 0o644);
    assert_eq!(fs.mknod(ROOT, b"c", libc::S_IFCHR as u16 | 0o4777, 0, umask(0o077)).unwrap().perm, 0o4700);
    assert_eq!(fs.mkdir(ROOT, b"d", 0o2777, umask(0o002)).unwrap().perm, 0o2775);
    assert_eq!(fs.tmpfile(ROOT, 0o1666, umask(0o066), true).unwrap().perm, 0o1600);
}

/// Which of the umask and the directory's default ACL limits a new inode is decided by the
/// create itself, under the directory's lock, from the ACL it inherits: there is no earlier
/// read that a default ACL set (or removed) in between could contradict.
#[test]
fn a_create_decides_its_umask_from_the_acl_it_inherits() {
    let (_dev, fs) = fresh(64 << 20);
    let d = fs.mkdir(ROOT, b"d", 0o755, C).unwrap().ino;
    let umask_077 = Cred { umask: 0o077, ..C };
    assert_eq!(fs.create(d, b"before", 0o666, umask_077).unwrap().perm, 0o600);
    let default = acl(&[(1, 7, NOBODY), (4, 7, NOBODY), (0x20, 5, NOBODY)]);
    fs.set_acl(d, AclKind::Default, &default, true).unwrap();
    let after = fs.create(d, b"after", 0o666, umask_077).unwrap();
    assert_eq!(after.perm, 0o664, "the umask was applied under a default ACL");
    assert!(fs.access_acl(after.ino).unwrap().is_none(), "a minimal inherited ACL stores nothing");
    let sub = fs.mknod(d, b"fifo", libc::S_IFIFO as u16 | 0o666, 0, umask_077).unwrap();
    assert_eq!(sub.perm, 0o664);
    fs.removexattr(d, DEFAULT_XATTR).unwrap();
    assert_eq!(fs.mkdir(d, b"removed", 0o777, umask_077).unwrap().perm, 0o700);
}

/// An ACL in the kernel's xattr form: version 2, then (tag, perm, id) entries.
fn acl(entries: &[(u16, u16, u32)]) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm, id) in entries {
        v.extend(tag.to_le_bytes().iter().chain(&perm.to_le_bytes()).chain(&id.to_le_bytes()));
    }
    v
}

const NOBODY: u32 = u32::MAX;

/// POSIX ACLs through the library: mode/ACL sync, default ACL inheritance without the
/// umask, chmod moving the mask, setgid clearing, the errors, and `noacl`.
#[test]
fn posix_acls() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o2764, C).unwrap().ino;
    // An ACL the mode can say: no xattr, just the mode.
    fs.set_acl(f, AclKind::Access, &acl(&[(1, 6, 0), (4, 4, 0), (0x20, 0, 0)]), true).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o2640);
    assert!(matches!(fs.getxattr(f, ACCESS_XATTR), Err(Error::NoAttr)));
    // A named user: stored in canonical form; the mask is the group class; setgid goes for
    // a setter outside the group.
    let named = acl(&[(1, 7, NOBODY), (2, 6, 3000), (4, 4, NOBODY), (0x10, 6, NOBODY), (0x20, 1, NOBODY)]);
    fs.set_acl(f, AclKind::Access, &named, false).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o761);
    assert_eq!(fs.getxattr(f, ACCESS_XATTR).unwrap(), named);
    // chmod rewrites owner, mask and other; the owning group's entry stays.
    fs.setattr(f, &SetAttr { mode: Some(0o604), ..SetAttr::default() }).unwrap();
    let chmodded = acl(&[(1, 6, NOBODY), (2, 6, 3000), (4, 4, NOBODY), (0x10, 0, NOBODY), (0x20, 4, NOBODY)]);
    assert_eq!(fs.getxattr(f, ACCESS_XATTR).unwrap(), chmodded);
    let a = fs.access_acl(f).unwrap().unwrap();
    assert!(!a.permits(3000, &|_| false, 1000, 4), "the mask takes the named user's read");
    assert!(a.permits(4000, &|_| false, 1000, 4), "other may read");
    // Errors: malformed (EINVAL), another version (EOPNOTSUPP), default ACL on a file
    // (EACCES), any ACL on a symlink (EOPNOTSUPP). Nothing changed by them.
    let mut torn = named.clone();
    torn.pop();
    assert_eq!(fs.set_acl(f, AclKind::Access, &torn, true).unwrap_err().errno(), libc::EINVAL);
    assert_eq!(fs.setxattr(f, ACCESS_XATTR, &[1, 0, 0, 0], 0).unwrap_err().errno(), libc::EOPNOTSUPP);
    assert_eq!(fs.set_acl(f, AclKind::Default, &named, true).unwrap_err().errno(), libc::EACCES);
    let l = fs.symlink(ROOT, b"l", b"f", C).unwrap().ino;
    assert_eq!(fs.set_acl(l, AclKind::Access, &named, true).unwrap_err().errno(), libc::EOPNOTSUPP);
    assert_eq!(fs.getxattr(f, ACCESS_XATTR).unwrap(), chmodded);

    // A default ACL: inherited by files (access ACL) and directories (both), through levels.
    let d = fs.mkdir(ROOT, b"d", 0o755, C).unwrap().ino;
    let default = acl(&[(1, 7, NOBODY), (2, 7, 3000), (4, 5, NOBODY), (0x10, 7, NOBODY), (0x20, 0, NOBODY)]);
    fs.set_acl(d, AclKind::Default, &default, true).unwrap();
    let umask_077 = Cred { umask: 0o077, ..C };
    let in_d = fs.create(d, b"umasked", 0o666, umask_077).unwrap();
    assert_eq!(in_d.perm, 0o660, "the default ACL stands in for the umask");
    assert_eq!(fs.create(ROOT, b"umasked", 0o666, umask_077).unwrap().perm, 0o600);
    let sub = fs.mkdir(d, b"sub", 0o777, C).unwrap();
    assert_eq!(sub.perm, 0o770);
    assert_eq!(fs.getxattr(sub.ino, DEFAULT_XATTR).unwrap(), default);
    assert_eq!(fs.getxattr(sub.ino, ACCESS_XATTR).unwrap(), default);
    let inner = fs.create(sub.ino, b"inner", 0o644, C).unwrap();
    assert_eq!(inner.perm, 0o640);
    let inherited = acl(&[(1, 6, NOBODY), (2, 7, 3000), (4, 5, NOBODY), (0x10, 4, NOBODY), (0x20, 0, NOBODY)]);
    assert_eq!(fs.getxattr(inner.ino, ACCESS_XATTR).unwrap(), inherited);
    assert!(matches!(fs.getxattr(inner.ino, DEFAULT_XATTR), Err(Error::NoAttr)), "files get no default ACL");
    let t = fs.tmpfile(sub.ino, 0o600, C, true).unwrap();
    assert_eq!(t.perm, 0o600);
    assert!(fs.access_acl(t.ino).unwrap().is_some());
    fs.release(t.ino).unwrap();
    let link = fs.symlink(sub.ino, b"link", b"inner", C).unwrap().ino;
    assert!(fs.listxattr(link).unwrap().is_empty(), "symlinks take no ACL");
    // Removing the access ACL leaves the mode.
    fs.removexattr(f, ACCESS_XATTR).unwrap();
    assert_eq!(fs.getattr(f).unwrap().perm, 0o604);

    // Kept across a remount; ignored under noacl.
    let fs = remount(&dev, fs);
    assert_eq!(fs.getxattr(inner.ino, ACCESS_XATTR).unwrap(), inherited);
    fs.unmount().unwrap();
    drop(fs);
    let opts = MountOptions { noacl: true, ..MountOptions::default() };
    let fs = FileSystem::mount_device(dev.clone(), &opts).unwrap();
    assert_eq!(fs.getxattr(sub.ino, DEFAULT_XATTR).unwrap_err().errno(), libc::EOPNOTSUPP);
    assert_eq!(fs.set_acl(f, AclKind::Access, &named, true).unwrap_err().errno(), libc::EOPNOTSUPP);
    let umask_022 = Cred { umask: 0o022, ..C };
    assert_eq!(fs.create(sub.ino, b"umasked", 0o666, umask_022).unwrap().perm, 0o644);
    let plain = fs.create(sub.ino, b"plain", 0o666, C).unwrap();
    assert_eq!(plain.perm, 0o666, "no inheritance under noacl");
    assert!(fs.listxattr(plain.ino).unwrap().is_empty());
    assert!(fs.access_acl(inner.ino).unwrap().is_none());
}

/// An inode freed (by an unlink, a rename over it, the release of an unlinked open file) may
/// be claimed again at once by another thread's create; uncaching the freed number must not
/// drop the new inode from the cache. A later lookup would load a second, stale copy of it
/// from home (corrupt if the number was never written home; else an older inode's image,
/// with its own lock and the same log versions as the new one: changes lost, and one
/// version of the inode in two CIL shards). One allocation group of 64 inodes, nearly full,
/// so every free is reused within a few creates; a first short round and a remount put
/// images of the reused numbers at home.
#[test]
fn a_number_reused_at_once_keeps_its_new_inode_cached() {
    let dev = Arc::new(MemDevice::new(64 << 20));
    let opts = MkfsOptions { ag_count: Some(1), bytes_per_inode: 1 << 20, ..MkfsOptions::default() };
    FileSystem::mkfs(&*dev, &opts).unwrap();
    let mut fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
    let dirs: Vec<u64> = (0..3).map(|t| fs.mkdir(ROOT, format!("d{t}").as_bytes(), 0o755, C).unwrap().ino).collect();
    let mut fill = 0;
    while fs.statfs().ffree > 6 {
        fs.create(ROOT, format!("fill{fill}").as_bytes(), 0o644, C).unwrap();
        fill += 1;
    }
    // Each thread makes a file, checks it, and frees it its own way.
    let make = |fs: &FileSystem, t: usize, dir: u64| match t {
        1 => fs.tmpfile(dir, 0o600, C, false).unwrap(),
        _ => fs.create(dir, b"f", 0o600, C).unwrap(),
    };
    let free = |fs: &FileSystem, t: usize, dir: u64, ino: u64| match t {
        0 => fs.unlink(dir, b"f").unwrap(),
        1 => fs.release(ino).unwrap(),
        _ => {
            fs.create(dir, b"g", 0o600, C).unwrap();
            fs.rename(dir, b"g", dir, b"f", 0).unwrap();
            fs.unlink(dir, b"f").unwrap();
        }
    };
    for rounds in [100, 20_000u32] {
        std::thread::scope(|s| {
            for (t, &dir) in dirs.iter().enumerate() {
                let fs = &fs;
                s.spawn(move || {
                    for i in 0..rounds {
                        let f = make(fs, t, dir);
                        let data = i.to_le_bytes();
                        fs.write(f.ino, 0, &data).unwrap_or_else(|e| panic!("thread {t}, round {i}: write: {e}"));
                        let a = fs.getattr(f.ino).unwrap_or_else(|e| panic!("thread {t}, round {i}: getattr: {e}"));
                        let nlink = u32::from(t != 1);
                        assert_eq!(
                            (a.size, a.nlink, a.perm),
                            (4, nlink, 0o600),
                            "thread {t}, round {i}: inode {}",
                            f.ino
                        );
                        assert_eq!(fs.read(f.ino, 0, 4).unwrap(), data, "thread {t}, round {i}");
                        free(fs, t, dir, f.ino);
                        if i % 2000 == 0 {
                            fs.sync().unwrap();
                        }
                    }
                });
            }
        });
        fs = remount(&dev, fs);
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev);
}
