//! fsck on images built through the public API: clean images (fresh, populated, crashed) are
//! clean; injected damage is found as exactly the kind of finding it is; repair fixes what it
//! claims (a second check is clean and the image mounts); `-n` never writes; and random damage
//! never panics the checker.

use ferrofs::dev::{
    crash_image, crash_image_torn, crash_points, keep_sets, unflushed_epoch, BlockDevice, CrashDevice, MemDevice,
    Op as DevOp, Tear,
};
use ferrofs::format::{
    self, DiskInode, Fork, Geometry, BITMAP_BITS, BLOCK_SIZE, HDR_SIZE, INODE_SIZE, MAGIC_AGH, MAGIC_BITMAP,
    MAGIC_BTREE, MAGIC_ORPHAN, ORPHAN_SLOTS_PER_BLOCK,
};
use ferrofs::fsck::{check, FsckOptions, FsckReport};
use ferrofs::journal::JournalConfig;
use ferrofs::*;
use std::collections::BTreeMap;
use std::sync::Arc;

const ROOT: u64 = 1;
const C: Cred = Cred { uid: 1000, gid: 1000, umask: 0 };
const BS: u64 = BLOCK_SIZE as u64;
const SIZE: u64 = 64 << 20;

// ---- images ---------------------------------------------------------------------------------

fn new_image() -> Arc<MemDevice> {
    let dev = Arc::new(MemDevice::new(SIZE));
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    dev
}

fn mount(dev: &Arc<MemDevice>) -> FileSystem {
    FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap()
}

fn unmount(fs: FileSystem) {
    fs.unmount().unwrap();
}

/// Inode numbers of interest in a populated image.
struct Populated {
    /// A regular file with data and two names: /a/f and /b/g.
    linked: u64,
    /// /a, a directory holding `linked` and a subdirectory.
    a: u64,
    /// /big: enough entries for a multi-level directory tree.
    big: u64,
    /// /sparse: hundreds of extents, so an extent tree.
    sparse: u64,
}

/// A bit of everything: nested directories, a big directory, a file with data and hard links,
/// a sparse file with an extent tree, short and long symlinks, devices, a fifo, xattrs inline
/// and in a tree, renames (also exchanging), removals and truncates.
fn populate(fs: &FileSystem) -> Populated {
    let a = fs.mkdir(ROOT, b"a", 0o755, C).unwrap().ino;
    let b = fs.mkdir(ROOT, b"b", 0o755, C).unwrap().ino;
    fs.mkdir(a, b"sub", 0o755, C).unwrap();
    let linked = fs.create(a, b"f", 0o644, C).unwrap().ino;
    fs.write(linked, 0, &vec![7u8; 200_000]).unwrap();
    fs.link(linked, b, b"g").unwrap();
    let big = fs.mkdir(ROOT, b"big", 0o755, C).unwrap().ino;
    for i in 0..1000 {
        fs.create(big, format!("entry-with-a-longish-name-{i:05}").as_bytes(), 0o644, C).unwrap();
    }
    for i in (0..1000).step_by(3) {
        fs.unlink(big, format!("entry-with-a-longish-name-{i:05}").as_bytes()).unwrap();
    }
    let sparse = fs.create(ROOT, b"sparse", 0o644, C).unwrap().ino;
    for i in 0..300u64 {
        fs.write(sparse, i * 65536, b"island").unwrap();
    }
    fs.write(sparse, 3 << 30, b"far away").unwrap();
    fs.symlink(ROOT, b"short", b"a/f", C).unwrap();
    fs.symlink(a, b"long", &[b'x'; 1000], C).unwrap();
    fs.mknod(b, b"tty", format::inode::S_IFCHR | 0o600, 0x0401, C).unwrap();
    fs.mknod(b, b"fifo", format::inode::S_IFIFO | 0o600, 0, C).unwrap();
    fs.setxattr(linked, b"user.small", b"v", 0).unwrap();
    fs.setxattr(linked, b"user.large", &[3u8; 900], 0).unwrap();
    fs.setxattr(a, b"user.dir", &[4u8; 1000], 0).unwrap();
    let moved = fs.mkdir(b, b"moved", 0o755, C).unwrap().ino;
    fs.create(moved, b"inside", 0o644, C).unwrap();
    fs.rename(b, b"moved", big, b"moved-here", 0).unwrap();
    fs.rename(ROOT, b"short", b, b"fifo", RENAME_EXCHANGE).unwrap();
    let x = fs.mkdir(ROOT, b"x", 0o755, C).unwrap().ino;
    let y = fs.mkdir(ROOT, b"y", 0o755, C).unwrap().ino;
    fs.mkdir(x, b"d1", 0o755, C).unwrap();
    fs.mknod(y, b"dev", format::inode::S_IFBLK | 0o600, 0x0801, C).unwrap();
    fs.rename(x, b"d1", y, b"dev", RENAME_EXCHANGE).unwrap();
    fs.mkdir(x, b"d2", 0o755, C).unwrap();
    fs.mkdir(y, b"empty", 0o755, C).unwrap();
    fs.rename(x, b"d2", y, b"empty", 0).unwrap();
    fs.mkdir(y, b"d3", 0o755, C).unwrap();
    fs.mkdir(y, b"d4", 0o755, C).unwrap();
    fs.rename(y, b"d3", y, b"d4", 0).unwrap();
    fs.rename(y, b"d3", y, b"d4", 0).unwrap_err();
    let t = fs.create(ROOT, b"truncated", 0o644, C).unwrap().ino;
    fs.write(t, 0, &vec![1u8; 500_000]).unwrap();
    fs.setattr(t, &SetAttr { size: Some(5000), ..Default::default() }).unwrap();
    let gone = fs.mkdir(ROOT, b"gone", 0o755, C).unwrap().ino;
    fs.create(gone, b"x", 0o644, C).unwrap();
    fs.unlink(gone, b"x").unwrap();
    fs.rmdir(ROOT, b"gone").unwrap();
    Populated { linked, a, big, sparse }
}

fn populated_image() -> (Arc<MemDevice>, Populated) {
    let dev = new_image();
    let fs = mount(&dev);
    let p = populate(&fs);
    unmount(fs);
    (dev, p)
}

/// A file unlinked while open, then unmounted: unmount leaves it on the orphan list for the
/// next mount to free. Returns its inode number.
fn image_with_orphan() -> (Arc<MemDevice>, u64) {
    let dev = new_image();
    let fs = mount(&dev);
    let f = fs.create(ROOT, b"doomed", 0o644, C).unwrap().ino;
    fs.write(f, 0, &[5u8; 10_000]).unwrap();
    fs.open(f).unwrap();
    fs.unlink(ROOT, b"doomed").unwrap();
    unmount(fs);
    (dev, f)
}

// ---- running fsck ---------------------------------------------------------------------------

/// Fails every write and flush, so each `-n` run below also proves that it writes nothing.
struct WriteProtected<'a>(&'a MemDevice);

impl BlockDevice for WriteProtected<'_> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> std::io::Result<()> {
        self.0.read_at(buf, off)
    }
    fn write_at(&self, _buf: &[u8], off: u64) -> std::io::Result<()> {
        Err(std::io::Error::other(format!("fsck -n wrote at offset {off}")))
    }
    fn flush(&self) -> std::io::Result<()> {
        Err(std::io::Error::other("fsck -n flushed"))
    }
    fn size(&self) -> u64 {
        self.0.size()
    }
}

fn fsck(dev: &MemDevice, repair: bool) -> FsckReport {
    let opts = FsckOptions { repair };
    let report =
        if repair { check(dev, &opts, &|_, _, _| {}) } else { check(&WriteProtected(dev), &opts, &|_, _, _| {}) };
    report.unwrap()
}

fn assert_clean(dev: &MemDevice) -> FsckReport {
    let r = fsck(dev, false);
    assert!(r.is_clean(), "expected a clean image: {:#?}", r.messages);
    assert_eq!(r.exit_code(), 0);
    r
}

fn assert_finds(r: &FsckReport, needle: &str) {
    assert!(r.messages.iter().any(|m| m.contains(needle)), "no message contains {needle:?}: {:#?}", r.messages);
}

/// `-n` finds errors (without writing: see `fsck`); repair fixes every one of them; a second
/// check is clean and the image mounts. Returns the `-n` report.
fn find_then_repair(dev: &Arc<MemDevice>) -> FsckReport {
    let dry = fsck(dev, false);
    assert!(dry.errors_found > 0, "damage went unnoticed");
    assert_eq!(dry.errors_fixed, 0);
    assert_eq!(dry.exit_code(), 4);
    let fixed = fsck(dev, true);
    assert_eq!(
        fixed.errors_found, dry.errors_found,
        "-n and repair disagree: {:#?} vs {:#?}",
        dry.messages, fixed.messages
    );
    assert_eq!(fixed.errors_fixed, fixed.errors_found, "{:#?}", fixed.messages);
    assert_eq!(fixed.exit_code(), 1);
    assert_clean(dev);
    unmount(mount(dev));
    assert_clean(dev);
    dry
}

// ---- damaging an image ----------------------------------------------------------------------

fn geo(dev: &MemDevice) -> Geometry {
    ferrofs::read_superblock(dev).unwrap().geo
}

fn read_block(dev: &MemDevice, blkno: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    dev.read_at(&mut b, blkno * BS).unwrap();
    b
}

fn write_block(dev: &MemDevice, blkno: u64, b: &[u8]) {
    dev.write_at(b, blkno * BS).unwrap();
}

/// Change a metadata block and reseal it, so only semantic checks can notice.
fn edit_block(dev: &MemDevice, blkno: u64, f: impl FnOnce(&mut [u8])) {
    let mut b = read_block(dev, blkno);
    f(&mut b);
    let lsn = format::header_lsn(&b);
    format::seal_block(&mut b, lsn);
    write_block(dev, blkno, &b);
}

/// Flip one bit of a block without resealing it: its checksum no longer matches.
fn corrupt_block(dev: &MemDevice, blkno: u64, byte: usize) {
    let mut b = read_block(dev, blkno);
    b[byte] ^= 0x10;
    write_block(dev, blkno, &b);
}

fn inode(dev: &MemDevice, ino: u64) -> DiskInode {
    let mut img = [0u8; INODE_SIZE];
    dev.read_at(&mut img, geo(dev).inode_offset(ino).unwrap()).unwrap();
    DiskInode::decode(&img, ino, &geo(dev)).unwrap()
}

/// Decode, change and re-encode an inode: a valid image with a semantic error.
fn edit_inode(dev: &MemDevice, ino: u64, f: impl FnOnce(&mut DiskInode)) {
    let mut di = inode(dev, ino);
    f(&mut di);
    let mut img = [0u8; INODE_SIZE];
    di.encode(ino, 0, &mut img);
    dev.write_at(&img, geo(dev).inode_offset(ino).unwrap()).unwrap();
}

/// Set or clear a bit of an AG bitmap starting at block `first` (resealed).
fn set_bit(dev: &MemDevice, first: u64, i: u64, used: bool) {
    edit_block(dev, first + i / BITMAP_BITS, |b| {
        let (byte, mask) = (HDR_SIZE + (i % BITMAP_BITS / 8) as usize, 1u8 << (i % 8));
        if used {
            b[byte] |= mask;
        } else {
            b[byte] &= !mask;
        }
    });
}

fn bit(dev: &MemDevice, first: u64, i: u64) -> bool {
    read_block(dev, first + i / BITMAP_BITS)[HDR_SIZE + (i % BITMAP_BITS / 8) as usize] & (1 << (i % 8)) != 0
}

fn set_block_bit(dev: &MemDevice, blkno: u64, used: bool) {
    let g = geo(dev);
    let l = g.ag_layout(g.block_ag(blkno));
    set_bit(dev, l.block_bitmap, blkno - l.start, used);
}

fn set_inode_bit(dev: &MemDevice, ino: u64, used: bool) {
    let l = geo(dev).ag_layout(format::ino_ag(ino));
    set_bit(dev, l.inode_bitmap, format::ino_index(ino) as u64, used);
}

/// Write `ino` into orphan slot `slot` of AG `agno` (resealed).
fn set_orphan_slot(dev: &MemDevice, agno: u32, slot: u32, ino: u64) {
    let l = geo(dev).ag_layout(agno);
    let slot = slot as u64;
    edit_block(dev, l.orphan_table + slot / ORPHAN_SLOTS_PER_BLOCK, |b| {
        format::put_u64(b, HDR_SIZE + 8 * (slot % ORPHAN_SLOTS_PER_BLOCK) as usize, ino);
    });
}

fn first_extent_block(dev: &MemDevice, ino: u64) -> u64 {
    match inode(dev, ino).fork {
        Fork::Extents { ext, .. } => ext[0].pblk,
        other => panic!("inode {ino} has no inline extents: {other:?}"),
    }
}

fn tree_root(dev: &MemDevice, ino: u64) -> u64 {
    match inode(dev, ino).fork {
        Fork::Btree(root) => root,
        other => panic!("inode {ino} has no B+tree: {other:?}"),
    }
}

/// Let `f` edit the value (`ino u64 | file type u8 | name`) of entry `name` of a directory
/// whose tree is a single leaf (node layout: see `btree`).
fn edit_entry(dev: &MemDevice, dir: u64, name: &[u8], f: impl FnOnce(&mut [u8])) {
    edit_block(dev, tree_root(dev, dir), |b| {
        assert_eq!(b[32], 0, "directory {dir} is a single leaf");
        let span = |i: usize| {
            let s = 48 + 12 * i;
            let off = u16::from_le_bytes([b[s + 8], b[s + 9]]) as usize;
            off..off + u16::from_le_bytes([b[s + 10], b[s + 11]]) as usize
        };
        let n = u16::from_le_bytes([b[34], b[35]]) as usize;
        let value = (0..n).map(span).find(|v| &b[v.start + 9..v.end] == name).expect("entry present");
        f(&mut b[value]);
    });
}

// ---- clean images ---------------------------------------------------------------------------

#[test]
fn fresh_image_is_clean() {
    let dev = new_image();
    let r = assert_clean(&dev);
    assert_eq!((r.inodes, r.dirs, r.log_records_replayed), (1, 1, 0));
    let g = geo(&dev);
    let metadata: u64 = (0..g.ag_count).map(|a| g.ag_layout(a)).map(|l| l.data_start - l.start).sum();
    assert_eq!(r.blocks_used, metadata);
    assert!(r.messages.is_empty(), "{:#?}", r.messages);
}

#[test]
fn populated_image_is_clean_and_counts_match_statfs() {
    let (dev, _) = populated_image();
    let r = assert_clean(&dev);
    let fs = mount(&dev);
    let st = fs.statfs();
    assert_eq!(r.inodes, st.files - st.ffree - 1, "live inodes = allocated minus the reserved inode 0");
    let pool: u64 = fs.mount().ags.iter().map(|ag| ag.pool()).sum();
    assert_eq!(r.blocks_used + pool, st.blocks - st.bfree, "statfs counts the AGs' pools as used");
    assert_eq!(
        r.dirs, 11,
        "/, a, a/sub, b, big, big/moved-here, x, y, y/dev (was d1), y/empty (was d2), y/d4 (was d3)"
    );
    unmount(fs);
}

/// statfs agrees with fsck after random workloads, also while blocks freed by the workload
/// are busy (their checkpoint not yet durable): they count as free, as they are once it is.
#[test]
fn statfs_counts_match_fsck_after_random_workloads() {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    for seed in 0..6u64 {
        let mut rng = StdRng::seed_from_u64(seed);
        let dev = new_image();
        let fs = mount(&dev);
        let mut files: Vec<(Vec<u8>, u64)> = Vec::new();
        for n in 0..300 {
            let name = format!("n{n}").into_bytes();
            let pick = (!files.is_empty()).then(|| rng.gen_range(0..files.len()));
            match (rng.gen_range(0..8), pick) {
                (0, _) | (_, None) => files.push((name.clone(), fs.create(ROOT, &name, 0o644, C).unwrap().ino)),
                (1, _) => drop(fs.mkdir(ROOT, &name, 0o755, C).unwrap()),
                (2, Some(p)) => drop(
                    fs.write(files[p].1, rng.gen_range(0..4u64 << 20), &vec![1u8; rng.gen_range(1..300_000)]).unwrap(),
                ),
                (3, Some(p)) => {
                    fs.fallocate(files[p].1, rng.gen_range(0..1u64 << 20), rng.gen_range(1..2u64 << 20), 0).unwrap()
                }
                (4, Some(p)) => fs
                    .fallocate(
                        files[p].1,
                        rng.gen_range(0..2u64 << 20),
                        rng.gen_range(1..1u64 << 20),
                        FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    )
                    .unwrap(),
                (5, Some(p)) => drop(
                    fs.setattr(files[p].1, &SetAttr { size: Some(rng.gen_range(0..1u64 << 20)), ..SetAttr::default() })
                        .unwrap(),
                ),
                (6, Some(p)) => fs
                    .setxattr(files[p].1, format!("user.{n}").as_bytes(), &vec![2u8; rng.gen_range(1..1000)], 0)
                    .unwrap(),
                (_, Some(p)) => fs.unlink(ROOT, &files.swap_remove(p).0).unwrap(),
            }
        }
        let st = fs.statfs();
        let pool: u64 = fs.mount().ags.iter().map(|ag| ag.pool()).sum();
        unmount(fs);
        let r = assert_clean(&dev);
        assert_eq!(
            st.blocks - st.bfree,
            r.blocks_used + pool,
            "seed {seed}: blocks in use (statfs counts the pools as used)"
        );
        assert_eq!(st.bavail, st.bfree, "seed {seed}");
        assert_eq!(st.files - st.ffree - 1, r.inodes, "seed {seed}: live inodes (inode 0 is reserved)");
    }
}

#[test]
fn repair_of_a_clean_image_writes_nothing() {
    let (dev, _) = populated_image();
    let before = dev.to_bytes();
    let r = fsck(&dev, true);
    assert!(r.is_clean(), "{:#?}", r.messages);
    assert_eq!(r.exit_code(), 0);
    assert!(dev.to_bytes() == before, "repair rewrote a clean image");
}

#[test]
fn progress_reports_every_phase() {
    let (dev, _) = populated_image();
    let phases = std::sync::Mutex::new(Vec::<String>::new());
    check(&*dev, &FsckOptions { repair: true }, &|phase, done, total| {
        assert!(done <= total || phase == "inodes", "{phase}: {done} of {total}");
        let mut p = phases.lock().unwrap();
        if p.last().is_none_or(|last| last != phase) {
            p.push(phase.to_string());
        }
    })
    .unwrap();
    assert_eq!(*phases.lock().unwrap(), ["log", "allocation groups", "inodes", "block map", "repair"]);
}

// ---- crashes --------------------------------------------------------------------------------

/// Journal threads off: nothing reaches home locations except through explicit checkpoints
/// and unmount, so a snapshot holds records the check must replay.
fn manual_journal() -> MountOptions {
    MountOptions {
        journal: Some(JournalConfig { background: false, ..JournalConfig::for_log(510) }),
        ..Default::default()
    }
}

#[test]
fn crashed_image_is_clean_after_log_replay() {
    let dev = new_image();
    let fs = FileSystem::mount_device(dev.clone(), &manual_journal()).unwrap();
    let d = fs.mkdir(ROOT, b"d", 0o755, C).unwrap().ino;
    for i in 0..50 {
        let f = fs.create(d, format!("file{i}").as_bytes(), 0o644, C).unwrap().ino;
        fs.write(f, 0, &vec![i as u8; 5000]).unwrap();
    }
    fs.mount().journal.checkpoint().unwrap();
    let open = fs.create(ROOT, b"open", 0o644, C).unwrap().ino;
    fs.write(open, 0, &[1u8; 70_000]).unwrap();
    fs.open(open).unwrap();
    fs.unlink(ROOT, b"open").unwrap();
    fs.unlink(d, b"file7").unwrap();
    fs.rename(d, b"file8", ROOT, b"eight", 0).unwrap();
    fs.mount().journal.checkpoint().unwrap();
    let crashed = dev.snapshot();
    drop(fs);

    let before = crashed.to_bytes();
    let dry = assert_clean(&crashed);
    assert!(dry.log_records_replayed >= 2, "{dry:?}");
    assert_finds(&dry, "unlinked while open");
    assert!(crashed.to_bytes() == before, "-n wrote to the device");
    let fixed = fsck(&crashed, true);
    assert!(fixed.is_clean(), "{:#?}", fixed.messages);
    assert_eq!(fixed.log_records_replayed, dry.log_records_replayed);
    let again = assert_clean(&crashed);
    assert_eq!(again.log_records_replayed, 0, "repair replayed the log onto the device");
    assert_eq!((again.inodes, again.blocks_used), (dry.inodes, dry.blocks_used));
    let crashed = Arc::new(crashed);
    let fs = mount(&crashed);
    assert!(fs.getattr(open).is_err(), "the mount freed the pending orphan");
    assert_eq!(fs.read(fs.resolve("/eight").unwrap().ino, 0, 10).unwrap(), vec![8u8; 10]);
    unmount(fs);
    assert_clean(&crashed);
}

/// Every state the media may hold after a power cut at a flush (all, none or some of the
/// unflushed writes persisted) checks clean once the log is replayed.
#[test]
fn every_crash_state_is_clean() {
    assert_every_crash_state_clean(|fs| {
        let d = fs.mkdir(ROOT, b"d", 0o755, C).unwrap().ino;
        for i in 0..12u64 {
            let f = fs.create(d, format!("f{i}").as_bytes(), 0o644, C).unwrap().ino;
            fs.write(f, i * 10_000, &vec![i as u8; 20_000]).unwrap();
            if i % 3 == 2 {
                fs.unlink(d, format!("f{}", i - 1).as_bytes()).unwrap();
            }
            if i % 4 == 0 {
                fs.setattr(f, &SetAttr { size: Some(100), ..Default::default() }).unwrap();
            }
            fs.sync().unwrap();
        }
    });
}

/// ACLs set, inherited, changed by chmod and removed: every crash state holds well-formed
/// ACLs (fsck decodes each one) and a consistent image.
#[test]
fn acl_changes_are_clean_in_every_crash_state() {
    assert_every_crash_state_clean(|fs| {
        let d = fs.mkdir(ROOT, b"d", 0o755, C).unwrap().ino;
        fs.set_acl(d, AclKind::Default, &acl_value(&[(1, 7), (4, 5), (0x10, 7), (0x20, 0)], 3000), true).unwrap();
        fs.sync().unwrap();
        let mut parent = d;
        for i in 0..4u32 {
            parent = fs.mkdir(parent, format!("sub{i}").as_bytes(), 0o777, C).unwrap().ino;
            let f = fs.create(parent, b"f", 0o666, C).unwrap().ino;
            fs.setattr(f, &SetAttr { mode: Some(0o640 + i as u16), ..Default::default() }).unwrap();
            if i % 2 == 1 {
                fs.removexattr(f, ACCESS_XATTR).unwrap();
            }
            fs.sync().unwrap();
        }
    });
}

/// An ACL naming user `named` (with the given perms) besides the (tag, perm) entries.
fn acl_value(entries: &[(u16, u16)], named: u32) -> Vec<u8> {
    let mut v = 2u32.to_le_bytes().to_vec();
    for &(tag, perm) in entries {
        if tag == 4 {
            v.extend([2u8, 0, 6, 0].iter().chain(&named.to_le_bytes()));
        }
        v.extend(tag.to_le_bytes().iter().chain(&perm.to_le_bytes()).chain(&u32::MAX.to_le_bytes()));
    }
    v
}

/// A malformed ACL on disk (resealed: only its meaning is wrong) is reported and dropped with
/// the xattr tree that holds it, as other xattr damage is; until then the engine refuses it
/// with EUCLEAN, and never panics.
#[test]
fn malformed_acl_is_found_and_dropped() {
    let dev = new_image();
    let fs = mount(&dev);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    let value = acl_value(&[(1, 6), (4, 4), (0x10, 6), (0x20, 4)], 3000);
    fs.setxattr(f, ACCESS_XATTR, &value, 0).unwrap();
    assert_eq!(fs.getxattr(f, ACCESS_XATTR).unwrap(), value);
    unmount(fs);
    let leaf = inode(&dev, f).xattr_root;
    edit_block(&dev, leaf, |b| {
        let at = b.windows(value.len()).position(|w| w == value).expect("the ACL in its leaf");
        b[at + 6] = 8; // The first entry's permissions: a bit no ACL has.
    });
    let fs = mount(&dev);
    assert!(matches!(fs.access_acl(f), Err(Error::Corrupt { .. })));
    unmount(fs);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("inode {f}: system.posix_acl_access malformed"));
    let fs = mount(&dev);
    assert!(fs.access_acl(f).unwrap().is_none());
    unmount(fs);
}

/// An ACL in the inline area, where no valid one fits: reported, and the inline xattrs
/// dropped.
#[test]
fn inline_acl_is_found_and_dropped() {
    let dev = new_image();
    let fs = mount(&dev);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    unmount(fs);
    edit_inode(&dev, f, |d| {
        let a = d.xattr_inline.bytes_mut();
        let (name, value) = (ACCESS_XATTR, 2u32.to_le_bytes());
        a[..2].copy_from_slice(&[name.len() as u8, value.len() as u8]);
        a[2..2 + name.len()].copy_from_slice(name);
        a[2 + name.len()..2 + name.len() + 4].copy_from_slice(&value);
    });
    let fs = mount(&dev);
    assert!(matches!(fs.access_acl(f), Err(Error::Corrupt { .. })));
    unmount(fs);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("inode {f}: inline system.posix_acl_access with no entries"));
}

/// Run `work` on a fresh image on a crash-recording device, then check every state the media
/// may hold after a power cut at a flush (all, none or some of the unflushed writes).
fn assert_every_crash_state_clean(work: impl FnOnce(&FileSystem)) {
    let base = MemDevice::new(SIZE);
    FileSystem::mkfs(&base, &MkfsOptions::default()).unwrap();
    let dev = Arc::new(CrashDevice::new(base));
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
    work(&fs);
    unmount(fs);
    let ops = dev.ops();
    let base = dev.base();
    for upto in crash_points(&ops) {
        for keep in keep_sets(&ops, upto, upto as u64, 2) {
            let image = crash_image(&base, &ops, upto, &|i| keep.contains(&i));
            let r = fsck(&image, false);
            assert!(r.is_clean(), "crash before op {upto} keeping {keep:?}: {:#?}", r.messages);
        }
    }
}

// ---- allocation maps ------------------------------------------------------------------------

#[test]
fn leaked_block_is_found_and_freed() {
    let (dev, _) = populated_image();
    let g = geo(&dev);
    let l = g.ag_layout(g.ag_count - 1);
    let free = l.start + l.blocks - 1;
    assert!(!bit(&dev, l.block_bitmap, free - l.start));
    set_block_bit(&dev, free, true);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("AG {} block bitmap: block {free} used but not referenced (leaked)", l.agno));
    assert_eq!(r.errors_found, 1);
}

#[test]
fn block_in_use_but_marked_free_is_found_and_marked() {
    let (dev, p) = populated_image();
    let data = first_extent_block(&dev, p.linked);
    set_block_bit(&dev, data, false);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("block {data} in use by inode {} but marked free", p.linked));
    assert_eq!(r.errors_found, 1);
}

/// The long symlink's extent moved onto a block of /a/f: either may be the damaged one, so
/// both keep what they hold, as e2fsck does. Whichever the walk reaches second gets a copy.
#[test]
fn cross_linked_blocks_are_copied() {
    let (dev, p) = populated_image();
    let shared = first_extent_block(&dev, p.linked);
    let long = fs_lookup(&dev, p.a, b"long");
    let own = first_extent_block(&dev, long);
    let fs = mount(&dev);
    let data = fs.read(p.linked, 0, 200_000).unwrap();
    let target = fs.read(p.linked, 0, 1000).unwrap();
    unmount(fs);
    edit_inode(&dev, long, |d| {
        if let Fork::Extents { ext, .. } = &mut d.fork {
            ext[0].pblk = shared;
        }
    });
    let r = find_then_repair(&dev);
    let copied =
        r.messages.iter().find(|m| m.contains("shares blocks with inode") && m.contains("given a copy of its own"));
    let copied = copied.unwrap_or_else(|| panic!("no copy made: {:#?}", r.messages));
    // The symlink's own block is referenced by nothing now: reported leaked, unless the copy
    // was placed in it (a block nothing claims, so the repair may take it; where it lands
    // depends on the layout, which access-time updates while the image was built can move).
    let copy_owner = if copied.starts_with(&format!("inode {long}:")) { long } else { p.linked };
    let leaked = r.messages.iter().any(|m| m.contains(&format!("block {own} used but not referenced (leaked)")));
    assert!(
        leaked || first_extent_block(&dev, copy_owner) == own,
        "block {own} neither reported leaked nor reused: {:#?}",
        r.messages
    );
    let fs = mount(&dev);
    assert_eq!(fs.read(p.linked, 0, 200_000).unwrap(), data, "/a/f keeps its contents");
    assert_eq!(fs.readlink(long).unwrap(), target, "the symlink keeps what it pointed at, in blocks of its own");
    unmount(fs);
}

/// The sparse file's first two extents moved onto the blocks of its third and fourth: those
/// two get their copies, in one edit of its extent tree (each in an edit of its own, the last
/// one written undid the first).
#[test]
fn cross_linked_extents_of_one_tree_are_all_copied() {
    let (dev, p) = populated_image();
    let root = read_block(&dev, tree_root(&dev, p.sparse));
    let leaf = format::get_u64(&root, 48 + 8);
    edit_block(&dev, leaf, |b| {
        let value_at = |b: &[u8], k: usize| u16::from_le_bytes([b[48 + 12 * k + 8], b[48 + 12 * k + 9]]) as usize;
        for k in 0..2 {
            let later = format::get_u64(b, value_at(b, k + 2));
            let at = value_at(b, k);
            format::put_u64(b, at, later);
        }
    });
    let r = find_then_repair(&dev);
    assert_eq!(
        r.messages
            .iter()
            .filter(|m| m.contains(&format!("shares blocks with inode {}; given a copy", p.sparse)))
            .count(),
        2,
        "{:#?}",
        r.messages
    );
    let fs = mount(&dev);
    for k in 0..4 {
        assert_eq!(fs.read(p.sparse, k * 65536, 6).unwrap(), b"island");
    }
    unmount(fs);
}

/// An extent moved onto another file's xattr tree node: the node verifies, so it is the
/// extent that gets a copy, whichever the walk reaches first.
#[test]
fn extent_over_a_tree_node_gets_a_copy() {
    let (dev, p) = populated_image();
    let node = inode(&dev, p.linked).xattr_root;
    assert_ne!(node, 0, "/a/f keeps its large xattr in a tree");
    let long = fs_lookup(&dev, p.a, b"long");
    edit_inode(&dev, long, |d| {
        if let Fork::Extents { ext, .. } = &mut d.fork {
            ext[0].pblk = node;
        }
    });
    let r = find_then_repair(&dev);
    assert!(
        r.messages.iter().any(|m| m.starts_with(&format!("inode {long}: extent at file block 0"))
            && m.contains("given a copy of its own")),
        "{:#?}",
        r.messages
    );
    let fs = mount(&dev);
    assert_eq!(fs.getxattr(p.linked, b"user.large").unwrap(), vec![3u8; 900], "the tree node is intact");
    fs.readlink(long).unwrap();
    unmount(fs);
}

fn fs_lookup(dev: &Arc<MemDevice>, dir: u64, name: &[u8]) -> u64 {
    let fs = mount(dev);
    let ino = fs.lookup(dir, name).unwrap().ino;
    unmount(fs);
    ino
}

#[test]
fn inode_bitmap_damage_is_rebuilt() {
    let (dev, p) = populated_image();
    set_inode_bit(&dev, p.sparse, false);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("inode {} is in use but marked free", p.sparse));

    let g = geo(&dev);
    let l = g.ag_layout(1);
    corrupt_block(&dev, l.inode_bitmap, 2000);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("AG 1 inode bitmap block {}: checksum mismatch", l.inode_bitmap));
    assert_eq!(r.errors_found, 1, "a rebuilt block's bits are not findings: {:#?}", r.messages);
}

// ---- inodes and directories -----------------------------------------------------------------

#[test]
fn wrong_link_count_is_found_and_fixed() {
    let (dev, p) = populated_image();
    edit_inode(&dev, p.linked, |d| d.nlink = 3);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("inode {}: nlink 3 but 2 names", p.linked));
    let fs = mount(&dev);
    assert_eq!(fs.getattr(p.linked).unwrap().nlink, 2);
    unmount(fs);
}

#[test]
fn wrong_directory_counts_are_found_and_fixed() {
    let (dev, p) = populated_image();
    edit_inode(&dev, p.a, |d| {
        d.nlink = 7;
        d.size = 9;
        d.blocks += 1;
    });
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("inode {}: nlink 7 but expected 3 (2 + 1 subdirectory)", p.a));
    assert_finds(&r, &format!("directory {}: size 9 but 3 entries", p.a));
    assert_finds(&r, &format!("inode {}: blocks", p.a));
    edit_inode(&dev, p.sparse, |d| d.blocks -= 1);
    assert_finds(&find_then_repair(&dev), &format!("inode {}: blocks", p.sparse));
}

#[test]
fn wrong_parent_pointer_is_found_and_fixed() {
    let (dev, p) = populated_image();
    let sub = fs_lookup(&dev, p.a, b"sub");
    edit_inode(&dev, sub, |d| d.parent = p.big);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("directory {sub}: '..' is {}, but it is named in directory {}", p.big, p.a));
    assert_eq!(inode(&dev, sub).parent, p.a);
}

#[test]
fn entry_naming_a_free_but_intact_inode_marks_it_used() {
    let (dev, p) = populated_image();
    set_inode_bit(&dev, p.linked, false);
    assert_finds(&find_then_repair(&dev), &format!("inode {} is in use but marked free", p.linked));
}

#[test]
fn dangling_entry_is_removed() {
    let (dev, p) = populated_image();
    let target = fs_lookup(&dev, p.a, b"sub");
    dev.write_at(&[0xa5; INODE_SIZE], geo(&dev).inode_offset(target).unwrap()).unwrap();
    set_inode_bit(&dev, target, false);
    let r = find_then_repair(&dev);
    assert_finds(
        &r,
        &format!("directory {} entry \"sub\": inode {target} is free and does not decode (bad magic or version)", p.a),
    );
    let fs = mount(&dev);
    assert!(matches!(fs.lookup(p.a, b"sub"), Err(Error::NotFound)));
    assert_eq!(fs.getattr(p.a).unwrap().nlink, 2);
    unmount(fs);
}

/// What a lost checkpoint leaves: an entry and a bitmap bit for an inode whose image never
/// reached the disk. Its slot is empty, so there is nothing to lose by dropping both.
#[test]
fn entry_naming_a_never_written_inode_is_removed() {
    let (dev, p) = populated_image();
    dev.write_at(&[0u8; INODE_SIZE], geo(&dev).inode_offset(p.linked).unwrap()).unwrap();
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("directory {} entry \"f\": inode {} was never written", p.a, p.linked));
    assert_finds(
        &r,
        &format!(
            "inode {} is allocated but neither reachable nor on an orphan list (leaked inode that does not decode",
            p.linked
        ),
    );
    assert_finds(&r, "used but not referenced (leaked)");
    let fs = mount(&dev);
    assert!(matches!(fs.lookup(p.a, b"f"), Err(Error::NotFound)));
    unmount(fs);
}

#[test]
fn wrong_entry_file_type_is_rewritten() {
    let (dev, p) = populated_image();
    edit_entry(&dev, p.a, b"f", |v| v[8] = 4);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("directory {} entry \"f\": file type 4 but inode {} is a regular file", p.a, p.linked));
}

#[test]
fn misplaced_and_invalid_names_are_removed() {
    let (dev, p) = populated_image();
    edit_entry(&dev, p.a, b"f", |v| v[9] = b'/');
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("directory {} entry \"/\": invalid name; removed", p.a));
    assert_finds(&r, &format!("inode {}: nlink 2 but 1 name", p.linked));
    let (dev2, p2) = populated_image();
    edit_entry(&dev2, p2.a, b"f", |v| v[9] = b'g');
    let r = find_then_repair(&dev2);
    assert_finds(&r, &format!("directory {} entry \"g\": key", p2.a));
    assert_finds(&r, "is outside its name's hash range (lookups cannot find it); removed");
    let fs = mount(&dev2);
    assert_eq!(fs.resolve("/b/g").unwrap().ino, p2.linked, "the file keeps its other name");
    unmount(fs);
}

#[test]
fn symlink_size_follows_its_inline_target() {
    let dev = new_image();
    let fs = mount(&dev);
    let link = fs.symlink(ROOT, b"l", b"target", C).unwrap().ino;
    unmount(fs);
    edit_inode(&dev, link, |d| d.size = 60);
    assert_finds(&find_then_repair(&dev), &format!("inode {link}: symlink size 60 but its inline target has 6 bytes"));
    let fs = mount(&dev);
    assert_eq!(fs.readlink(link).unwrap(), b"target");
    assert_eq!(fs.getattr(link).unwrap().size, 6);
    unmount(fs);
}

#[test]
fn directory_cycle_is_found_without_hanging_and_cut() {
    let (dev, p) = populated_image();
    let sub = fs_lookup(&dev, p.a, b"sub");
    let fs = mount(&dev);
    let victim = fs.create(sub, b"loop", 0o644, C).unwrap().ino;
    unmount(fs);
    // /a/sub/loop now names /a: a cycle, and a second name for a directory.
    edit_entry(&dev, sub, b"loop", |v| {
        format::put_u64(v, 0, p.a);
        v[8] = 4;
    });
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("directory {sub} entry \"loop\": directory {} already has a name", p.a));
    assert_finds(
        &r,
        &format!("inode {victim}: a regular file (nlink 1) that no name reaches; reconnected as /lost+found/#{victim}"),
    );
    let fs = mount(&dev);
    assert_eq!(fs.resolve(&format!("/lost+found/#{victim}")).unwrap().ino, victim);
    let mut names = 0;
    fs.readdir(sub, 0, &mut |_| {
        names += 1;
        true
    })
    .unwrap();
    assert_eq!(names, 2, "only . and .. are left");
    unmount(fs);
}

#[test]
fn damaged_extent_tree_clears_its_file() {
    let (dev, p) = populated_image();
    let root = tree_root(&dev, p.sparse);
    corrupt_block(&dev, root, 100);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("inode {}: extent map B+tree node {root}: checksum mismatch; inode cleared", p.sparse));
    assert_finds(&r, "used but not referenced (leaked)");
    let fs = mount(&dev);
    assert!(matches!(fs.lookup(ROOT, b"sparse"), Err(Error::NotFound)), "the cleared file's entry is gone");
    assert_eq!(fs.getattr(p.linked).unwrap().size, 200_000, "the other files are intact");
    unmount(fs);
}

/// Move the last extent of a two-level extent tree to file block `u64::MAX - 1`: a valid
/// node, but `lblk + len` overflows. Returns the leaf.
fn extent_near_the_end_of_u64(dev: &MemDevice, ino: u64) -> u64 {
    let root = read_block(dev, tree_root(dev, ino));
    assert_eq!(root[32], 1, "two levels");
    let children = u16::from_le_bytes([root[34], root[35]]) as usize;
    let leaf = format::get_u64(&root, 48 + 16 * (children - 1) + 8);
    edit_block(dev, leaf, |b| {
        let n = u16::from_le_bytes([b[34], b[35]]) as usize;
        format::put_u64(b, 48 + 12 * (n - 1), u64::MAX - 1);
    });
    leaf
}

#[test]
fn extent_past_the_largest_file_is_reported_not_overflowed() {
    let (dev, p) = populated_image();
    extent_near_the_end_of_u64(&dev, p.sparse);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("inode {}: extent at file block {} (1 block at block", p.sparse, u64::MAX - 1));
    assert_finds(&r, "ends past the largest file; inode cleared");
}

// ---- damage with random bytes: what is left is repaired, what is intact is kept ----------

/// /d holds 400 files (a multi-level directory tree) and /t/u/v, /top a few more; every file
/// has contents of its own. Returns the image and /d.
fn image_with_contents() -> (Arc<MemDevice>, u64) {
    let dev = new_image();
    let fs = mount(&dev);
    let d = fs.mkdir(ROOT, b"d", 0o755, C).unwrap().ino;
    for i in 0..400 {
        let f = fs.create(d, format!("file-with-a-longish-name-{i:04}").as_bytes(), 0o644, C).unwrap().ino;
        fs.write(f, 0, format!("contents of file {i}").repeat(i + 1).as_bytes()).unwrap();
    }
    fs.create_dir_all("/t/u/v", 0o755, C).unwrap();
    fs.write_file("/t/u/v/deep", b"deep down", C).unwrap();
    fs.write_file("/t/u/mid", &[9u8; 70_000], C).unwrap();
    fs.write_file("/top", b"at the top", C).unwrap();
    unmount(fs);
    (dev, d)
}

/// The contents of every regular file reachable from the root, by inode.
fn contents(dev: &Arc<MemDevice>) -> BTreeMap<u64, Vec<u8>> {
    let fs = mount(dev);
    let mut files = Vec::new();
    fs.walk("/", &mut |_, a| {
        if a.kind == FileType::RegularFile {
            files.push((a.ino, a.size));
        }
    })
    .unwrap();
    let found = files.into_iter().map(|(ino, size)| (ino, fs.read(ino, 0, size as usize).unwrap())).collect();
    unmount(fs);
    found
}

fn entry_count(dev: &Arc<MemDevice>, path: &str) -> usize {
    let fs = mount(dev);
    let mut n = 0;
    fs.readdir(fs.resolve(path).unwrap().ino, 0, &mut |_| {
        n += 1;
        true
    })
    .unwrap();
    unmount(fs);
    n - 2
}

/// `-n` finds unfixed errors; repair fixes them all (exit 1); `-n` is then clean, and every
/// file of `before` that `lost` does not name has its contents, wherever it is now.
fn repair_keeps(dev: &Arc<MemDevice>, before: &BTreeMap<u64, Vec<u8>>, lost: impl Fn(u64) -> bool) -> FsckReport {
    let dry = fsck(dev, false);
    assert_eq!(dry.exit_code(), 4, "{:#?}", dry.messages);
    let r = fsck(dev, true);
    assert_eq!((r.exit_code(), r.errors_found), (1, dry.errors_found), "{:#?}", r.messages);
    assert_clean(dev);
    let after = contents(dev);
    let kept = before.iter().filter(|(ino, _)| !lost(**ino));
    for (ino, data) in kept {
        assert!(after.get(ino) == Some(data), "inode {ino} lost its contents: {:#?}", r.messages);
    }
    assert_clean(dev);
    r
}

fn random_bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng(seed);
    (0..len).map(|_| rng.next() as u8).collect()
}

#[test]
fn random_inode_table_block_is_cleared_and_the_rest_kept() {
    let (dev, d) = image_with_contents();
    let before = contents(&dev);
    let g = geo(&dev);
    let victim = *before.keys().nth(200).unwrap();
    let blkno = g.inode_offset(victim).unwrap() / BS;
    let in_block = |ino: u64| g.inode_offset(ino).unwrap() / BS == blkno;
    let lost = before.keys().filter(|&&ino| in_block(ino)).count();
    assert!(lost > 1 && !in_block(d) && !in_block(ROOT));
    write_block(&dev, blkno, &random_bytes(BLOCK_SIZE, 0x39));
    let r = repair_keeps(&dev, &before, in_block);
    assert_finds(&r, &format!("inode {victim}: bad magic or version; inode cleared, entry removed"));
    assert_eq!(contents(&dev).len(), before.len() - lost);
    assert_eq!(entry_count(&dev, "/d"), 400 - lost, "exactly the entries of the cleared inodes went");
    let r = assert_clean(&dev);
    assert!(r.inodes < 410, "the cleared inodes are free");
}

#[test]
fn random_directory_node_is_rebuilt_from_the_other_leaves() {
    let (dev, d) = image_with_contents();
    let before = contents(&dev);
    let root = read_block(&dev, tree_root(&dev, d));
    assert!(root[32] >= 1 && u16::from_le_bytes([root[34], root[35]]) >= 3, "/d has a multi-level tree");
    let node = format::get_u64(&root, 48 + 16 + 8); // the second child
    write_block(&dev, node, &random_bytes(BLOCK_SIZE, 0x3900));
    let r = repair_keeps(&dev, &before, |_| false);
    assert_finds(&r, &format!("inode {d}: directory B+tree node {node}: "));
    assert_finds(&r, "rebuilt from its readable leaves");
    assert_finds(&r, "note: created /lost+found");
    let (in_d, in_lost) = (entry_count(&dev, "/d"), entry_count(&dev, "/lost+found"));
    assert!(in_d < 400 && in_d + in_lost == 400, "{in_d} entries kept, {in_lost} reconnected");
    assert_eq!(contents(&dev).len(), before.len(), "every file is still there");
}

#[test]
fn random_root_inode_is_recreated_and_its_contents_reconnected() {
    let (dev, d) = image_with_contents();
    let before = contents(&dev);
    let at = geo(&dev).inode_offset(ROOT).unwrap();
    dev.write_at(&random_bytes(INODE_SIZE, 0x39_0000), at).unwrap();
    let r = repair_keeps(&dev, &before, |_| false);
    assert_finds(&r, &format!("root inode {ROOT}: "));
    assert_finds(&r, "recreated empty");
    let fs = mount(&dev);
    assert_eq!(fs.resolve(&format!("/lost+found/#{d}")).unwrap().ino, d, "/d is reconnected whole");
    assert_eq!(
        fs.resolve(&format!("/lost+found/#{d}/file-with-a-longish-name-0007")).unwrap().kind,
        FileType::RegularFile
    );
    unmount(fs);
    assert_eq!(entry_count(&dev, "/"), 1, "the new root holds lost+found");
    assert_eq!(entry_count(&dev, "/lost+found"), 3, "d, t and top");
}

/// A crash anywhere in a repair (at each flush, keeping all, none, each single one or random
/// subsets of the unflushed writes, or all of them with one torn: only its odd sectors kept)
/// leaves an image that a second repair brings to clean.
#[test]
fn crash_during_repair_leaves_a_repairable_image() {
    let (dev, d) = image_with_contents();
    let root = read_block(&dev, tree_root(&dev, d));
    write_block(&dev, format::get_u64(&root, 48 + 16 + 8), &random_bytes(BLOCK_SIZE, 0x39_01));
    let victim = fs_lookup(&dev, ROOT, b"top");
    write_block(&dev, geo(&dev).inode_offset(victim).unwrap() / BS, &random_bytes(BLOCK_SIZE, 0x39_02));
    let crashing = CrashDevice::new(dev.snapshot());
    assert_eq!(check(&crashing, &FsckOptions { repair: true }, &|_, _, _| {}).unwrap().exit_code(), 1);
    let (ops, base) = (crashing.ops(), crashing.base());
    let points = crash_points(&ops);
    assert!(points.len() >= 3, "the repair writes in flushed steps");
    let mut images = 0;
    let mut repair_clean = |image: MemDevice, what: String| {
        let r = fsck(&image, true);
        assert_eq!(r.exit_code() & 4, 0, "{what}: {:#?}", r.messages);
        assert_clean(&image);
        images += 1;
    };
    for upto in points {
        for keep in keep_sets(&ops, upto, upto as u64, 4) {
            repair_clean(
                crash_image(&base, &ops, upto, &|i| keep.contains(&i)),
                format!("crash before op {upto} keeping {keep:?}"),
            );
        }
        for op in unflushed_epoch(&ops, upto).filter(|&i| matches!(ops[i], DevOp::Write { .. })) {
            let tear = Tear { op, sectors: 0xaaaa_aaaa_aaaa_aaaa };
            repair_clean(
                crash_image_torn(&base, &ops, upto, &|_| true, Some(tear)),
                format!("crash before op {upto}, op {op} torn"),
            );
        }
    }
    assert!(images > 20, "only {images} crash images of {} writes", ops.len());
}

// ---- orphans --------------------------------------------------------------------------------

#[test]
fn pending_orphan_is_a_note_not_an_error() {
    let (dev, ino) = image_with_orphan();
    let r = assert_clean(&dev);
    assert_finds(&r, &format!("note: AG 0 orphan slot 0: inode {ino}: unlinked while open"));
    assert_eq!(r.inodes, 2);
    let before = dev.to_bytes();
    assert!(fsck(&dev, true).is_clean());
    assert!(dev.to_bytes() == before, "repair leaves pending orphans to the mount");
    unmount(mount(&dev));
    let r = assert_clean(&dev);
    assert_eq!(r.inodes, 1, "the mount freed the orphan");
}

#[test]
fn orphan_missing_from_its_slot_is_a_leak() {
    let (dev, ino) = image_with_orphan();
    let slot = inode(&dev, ino).orphan_slot - 1;
    set_orphan_slot(&dev, 0, slot, 0);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("inode {ino} is allocated but neither reachable nor on an orphan list (leaked regular file, nlink 0, 3 blocks)"));
    assert_finds(&r, "used but not referenced (leaked)");
    assert_eq!(assert_clean(&dev).inodes, 1);
}

#[test]
fn bogus_orphan_slots_are_cleared() {
    let (dev, p) = populated_image();
    let agno = format::ino_ag(p.linked);
    set_orphan_slot(&dev, agno, 7, p.linked);
    set_orphan_slot(&dev, agno, 8, format::make_ino(agno, 2000));
    set_orphan_slot(&dev, 0, 9, format::make_ino(1, 5));
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("AG {agno} orphan slot 7: inode {} does not point back at it", p.linked));
    assert_finds(&r, &format!("AG {agno} orphan slot 8: names free inode {}", format::make_ino(agno, 2000)));
    assert_finds(&r, &format!("AG 0 orphan slot 9: inode {} is not an inode of this AG", format::make_ino(1, 5)));
    assert_eq!(r.errors_found, 3);
}

#[test]
fn orphan_slot_field_without_its_slot_is_cleared() {
    let (dev, p) = populated_image();
    edit_inode(&dev, p.linked, |d| d.orphan_slot = 4);
    let r = find_then_repair(&dev);
    assert_finds(
        &r,
        &format!(
            "inode {}: says it is on AG {} orphan slot 3, which does not name it",
            p.linked,
            format::ino_ag(p.linked)
        ),
    );
    assert_eq!(inode(&dev, p.linked).orphan_slot, 0);
}

/// A reconnected inode's orphan slot field is checked too (it was checked before the inodes
/// that only reconnection reaches were found).
#[test]
fn reconnected_inode_gets_its_orphan_slot_field_checked() {
    let (dev, p) = populated_image();
    let long = fs_lookup(&dev, p.a, b"long");
    edit_inode(&dev, long, |d| d.orphan_slot = 4);
    edit_entry(&dev, p.a, b"long", |v| v[9] = b'/');
    let r = find_then_repair(&dev);
    assert_finds(
        &r,
        &format!("inode {long}: a symlink (nlink 1) that no name reaches; reconnected as /lost+found/#{long}"),
    );
    assert_finds(
        &r,
        &format!("inode {long}: says it is on AG {} orphan slot 3, which does not name it", format::ino_ag(long)),
    );
}

// ---- static metadata and the log ------------------------------------------------------------

#[test]
fn damaged_superblocks_and_ag_headers_are_rewritten() {
    let (dev, _) = populated_image();
    let g = geo(&dev);
    corrupt_block(&dev, 0, 200);
    corrupt_block(&dev, g.ag_layout(2).start, 60);
    corrupt_block(&dev, g.ag_layout(1).header, 40);
    edit_block(&dev, g.ag_layout(3).header, |b| format::put_u64(b, format::agh::BLOCKS, 12345));
    let r = find_then_repair(&dev);
    assert_finds(&r, "superblock (block 0): checksum mismatch; using the copy in AG 1");
    assert_finds(&r, &format!("AG 2 superblock copy (block {}): checksum mismatch", g.ag_layout(2).start));
    assert_finds(&r, &format!("AG 1 header (block {}): checksum mismatch", g.ag_layout(1).header));
    assert_finds(&r, &format!("AG 3 header (block {}): geometry disagrees with the superblock", g.ag_layout(3).header));
    assert_eq!(r.errors_found, 4);
}

#[test]
fn corrupt_orphan_table_block_is_rebuilt_empty() {
    let (dev, ino) = image_with_orphan();
    let table = geo(&dev).ag_layout(0).orphan_table;
    corrupt_block(&dev, table, 500);
    let r = find_then_repair(&dev);
    assert_finds(&r, &format!("AG 0 orphan table block {table}: checksum mismatch"));
    assert_finds(&r, &format!("inode {ino} is allocated but neither reachable nor on an orphan list"));
}

#[test]
fn unreplayable_log_is_reset() {
    let (dev, _) = populated_image();
    let log = geo(&dev).ag_layout(0).log;
    corrupt_block(&dev, log, 100);
    corrupt_block(&dev, log + 1, 100);
    assert!(FileSystem::mount_device(dev.clone(), &MountOptions::default()).is_err());
    let r = find_then_repair(&dev);
    assert_finds(&r, "log: cannot be replayed");
}

#[test]
fn operational_errors_are_errors_not_findings() {
    let dev = MemDevice::new(SIZE);
    assert!(check(&dev, &FsckOptions::default(), &|_, _, _| {}).is_err(), "no superblock anywhere");
}

// ---- robustness -----------------------------------------------------------------------------

/// SplitMix64: a fixed sequence, so a failing case replays from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Blocks worth damaging: every block that carries a metadata magic, and the inode table
/// blocks that hold inodes.
fn metadata_blocks(dev: &MemDevice) -> (Vec<u64>, Vec<u64>) {
    let g = geo(dev);
    let magics = [MAGIC_AGH, MAGIC_BITMAP, MAGIC_ORPHAN, MAGIC_BTREE];
    let tagged = (0..g.block_count).filter(|&b| magics.contains(&format::header_magic(&read_block(dev, b)))).collect();
    let inodes = (0..g.ag_count)
        .map(|a| g.ag_layout(a))
        .flat_map(|l| l.inode_table..l.inode_table + l.inode_table_blocks)
        .filter(|&b| read_block(dev, b).iter().any(|&x| x != 0))
        .collect();
    (tagged, inodes)
}

/// Random bit flips in metadata, sealed or not: the checker never panics, `-n` agrees with repair on what is wrong, and a repair that claims to have fixed everything
/// leaves an image that checks clean and mounts.
#[test]
fn random_damage_never_panics_and_full_repairs_converge() {
    let (pristine, _) = populated_image();
    let (tagged, inode_blocks) = metadata_blocks(&pristine);
    let mut rng = Rng(0xf5c4);
    for case in 0..300 {
        let dev = Arc::new(pristine.snapshot());
        for _ in 0..1 + rng.below(3) {
            let reseal = rng.below(2) == 0;
            if rng.below(3) == 0 {
                let blkno = inode_blocks[rng.below(inode_blocks.len() as u64) as usize];
                let slot = rng.below(16) as usize * INODE_SIZE;
                let mut b = read_block(&dev, blkno);
                b[slot + rng.below(INODE_SIZE as u64) as usize] ^= 1 << rng.below(8);
                if reseal {
                    let lsn = format::get_u64(&b, slot + 16);
                    DiskInode::seal(&mut b[slot..slot + INODE_SIZE], lsn);
                }
                write_block(&dev, blkno, &b);
            } else {
                let blkno = tagged[rng.below(tagged.len() as u64) as usize];
                let byte = HDR_SIZE + rng.below((BLOCK_SIZE - HDR_SIZE) as u64) as usize;
                let mask = 1u8 << rng.below(8);
                if reseal {
                    edit_block(&dev, blkno, |b| b[byte] ^= mask);
                } else {
                    corrupt_block(&dev, blkno, byte);
                }
            }
        }
        let dry = fsck(&dev, false);
        let fixed = fsck(&dev, true);
        assert_eq!(dry.errors_found, fixed.errors_found, "case {case}: {:#?} vs {:#?}", dry.messages, fixed.messages);
        if fixed.exit_code() != 1 {
            continue;
        }
        let again = fsck(&dev, false);
        assert!(
            again.is_clean(),
            "case {case}: repair claimed a full fix: {:#?}\nsecond check: {:#?}",
            fixed.messages,
            again.messages
        );
        let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default())
            .unwrap_or_else(|e| panic!("case {case}: {e}: {:#?}", fixed.messages));
        fs.walk("/", &mut |_, _| {}).unwrap_or_else(|e| panic!("case {case}: {e}: {:#?}", fixed.messages));
        unmount(fs);
        assert!(fsck(&dev, false).is_clean(), "case {case}: unclean after a mount");
    }
}
