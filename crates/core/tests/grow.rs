//! Growing an unmounted file system (`grow::grow`): the new space is used, the files written
//! before are intact, fsck is clean, and a crash at any write or flush of a grow leaves the old
//! or the new file system, each one that mounts and checks clean.

use ferrofs::dev::{crash_image_torn, keep_sets, unflushed_epoch, BlockDevice, CrashDevice, MemDevice, Op, Tear};
use ferrofs::format::{self, BLOCK_SIZE};
use ferrofs::fsck::{self, FsckOptions, FsckReport};
use ferrofs::*;
use std::collections::BTreeSet;
use std::sync::Arc;

const ROOT: u64 = 1;
const CRED: Cred = Cred { uid: 1000, gid: 1000, umask: 0 };
const MIB: u64 = 1 << 20;
/// 4 AGs of 1024 blocks.
const SMALL: u64 = 16 * MIB;
/// SMALL plus a short fifth AG of 640 blocks.
const PARTIAL: u64 = SMALL + 5 * MIB / 2;
/// 6 full AGs: the fifth grown to full, and a sixth.
const LARGE: u64 = 24 * MIB;

/// (path under the root, contents) of the files a test writes before growing.
type Files = Vec<(String, Vec<u8>)>;

fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (seed.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8).collect()
}

/// A file system of `size` bytes holding a few files in directories spread over its AGs,
/// unmounted cleanly, on a device of `device_size` bytes (the rest zeros: an extended file).
fn image(size: u64, device_size: u64) -> (MemDevice, Files) {
    let dev = Arc::new(MemDevice::new(size));
    let opts = MkfsOptions { ag_count: Some(4), ..MkfsOptions::default() };
    FileSystem::mkfs(&*dev, &opts).unwrap();
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
    let mut files = Files::new();
    for d in 0..4u64 {
        let dir = fs.mkdir(ROOT, format!("d{d}").as_bytes(), 0o755, CRED).unwrap();
        for f in 0..3u64 {
            let data = pattern(d * 10 + f, 5000 + (d * 3 + f) as usize * 20_000);
            let file = fs.create(dir.ino, format!("f{f}").as_bytes(), 0o644, CRED).unwrap();
            fs.write(file.ino, 0, &data).unwrap();
            files.push((format!("d{d}/f{f}"), data));
        }
    }
    fs.unmount().unwrap();
    drop(fs);
    let mut bytes = dev.to_bytes();
    bytes.resize(device_size as usize, 0);
    (MemDevice::from_bytes(&bytes), files)
}

fn assert_files(fs: &FileSystem, files: &Files) {
    for (path, data) in files {
        let (dir, name) = path.split_once('/').unwrap();
        let dir = fs.lookup(ROOT, dir.as_bytes()).unwrap();
        let file = fs.lookup(dir.ino, name.as_bytes()).unwrap();
        assert_eq!(fs.read(file.ino, 0, data.len() + 1).unwrap(), *data, "{path}");
    }
}

fn fsck(dev: &dyn BlockDevice, repair: bool) -> FsckReport {
    fsck::check(dev, &FsckOptions { repair }, &|_, _, _| {}).unwrap()
}

fn assert_clean(dev: &dyn BlockDevice, why: &str) -> FsckReport {
    let report = fsck(dev, false);
    assert!(report.is_clean(), "{why}: {:#?}", report.messages);
    report
}

fn mount(dev: MemDevice) -> FileSystem {
    FileSystem::mount_device(Arc::new(dev), &MountOptions::default()).unwrap()
}

/// Grow a file system with files twice (a new short AG, then that AG grown to full and one
/// more); after each: fsck clean, the files intact, statfs the new size, and a fill of the
/// new space lands in the new AGs and writes more than the old file system could hold.
#[test]
fn grown_file_system_uses_the_new_space() {
    let (dev, files) = image(SMALL, LARGE);
    let old_free = {
        let fs = mount(dev.snapshot());
        let st = fs.statfs();
        fs.unmount().unwrap();
        st.bfree
    };
    let sb = grow::grow(&dev, PARTIAL, &|_, _| {}).unwrap();
    assert_eq!((sb.geo.ag_count, sb.geo.block_count), (5, PARTIAL / 4096));
    assert_eq!(read_superblock(&dev).unwrap(), sb);
    assert!(assert_clean(&dev, "after the first grow").messages.is_empty());
    let sb = grow::grow(&dev, LARGE, &|_, _| {}).unwrap();
    assert_eq!((sb.geo.ag_count, sb.geo.block_count), (6, LARGE / 4096));
    assert!(assert_clean(&dev, "after the second grow").messages.is_empty());

    let fs = mount(dev.snapshot());
    assert_files(&fs, &files);
    let st = fs.statfs();
    assert_eq!(st.blocks, LARGE / 4096);
    assert_eq!(st.files, 6 * sb.geo.inodes_per_ag as u64);
    assert!(st.bfree > old_free + 2 * 1024 * 9 / 10, "{} free blocks, {} before growing", st.bfree, old_free);
    // New directories rotate over the AGs: their files fill every AG, the new ones too.
    let chunk = vec![0x5a; 256 << 10];
    let mut written = 0u64;
    let mut ags_used = std::collections::BTreeSet::new();
    'fill: for d in 0.. {
        let dir = fs.mkdir(ROOT, format!("fill{d}").as_bytes(), 0o755, CRED).unwrap();
        ags_used.insert(dir.ino >> 32);
        let file = fs.create(dir.ino, b"data", 0o644, CRED).unwrap();
        for off in (0..MIB).step_by(chunk.len()) {
            match fs.write(file.ino, off, &chunk) {
                Ok(n) => written += n as u64,
                Err(Error::NoSpace) => break 'fill,
                Err(e) => panic!("fill: {e}"),
            }
        }
    }
    assert!(ags_used.contains(&4) && ags_used.contains(&5), "AGs used: {ags_used:?}");
    assert!(written > old_free * 4096, "wrote {written} bytes into {} free before growing", old_free * 4096);
    fs.unmount().unwrap();
    drop(fs);
    let dev = Arc::new(dev);
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    assert_clean(&*dev, "after filling the grown file system");
}

/// Every argument that cannot grow says so, and the image is not touched.
#[test]
fn bad_sizes_and_dirty_logs_are_refused() {
    let (dev, _) = image(SMALL, LARGE);
    let before = dev.to_bytes();
    let refused = |size: u64| grow::grow(&dev, size, &|_, _| {}).unwrap_err().to_string();
    assert!(refused(SMALL - 4096).contains("cannot shrink"), "{}", refused(SMALL - 4096));
    assert!(refused(SMALL).contains("nothing to grow"));
    assert!(refused(SMALL + 4096 * 10).contains("adds no usable space"));
    assert!(refused(LARGE + 4096).contains("asked of a device"));
    assert_eq!(dev.to_bytes(), before, "a refused grow writes nothing");

    // A block bitmap that marks blocks past the end of the last AG (damage fsck repairs) would
    // leave those blocks in use by nothing once they are in the AG.
    let partial = image(SMALL, LARGE).0;
    grow::grow(&partial, PARTIAL, &|_, _| {}).unwrap();
    let last = read_superblock(&partial).unwrap().geo.ag_layout(4);
    let mut bitmap = vec![0u8; BLOCK_SIZE];
    partial.read_at(&mut bitmap, last.block_bitmap * 4096).unwrap();
    let past_end = format::HDR_SIZE + last.blocks as usize / 8 + 1;
    bitmap[past_end] = 1;
    format::seal_block(&mut bitmap, 0);
    partial.write_at(&bitmap, last.block_bitmap * 4096).unwrap();
    let err = grow::grow(&partial, LARGE, &|_, _| {}).unwrap_err().to_string();
    assert!(err.contains("past the end of the last AG"), "{err}");
    assert!(fsck(&partial, true).errors_fixed > 0);
    grow::grow(&partial, LARGE, &|_, _| {}).unwrap();
    assert_clean(&partial, "grown after the repair");

    // A log a crash left (a mount that synced, never unmounted) must be replayed first.
    let crash = Arc::new(CrashDevice::new(dev.snapshot()));
    let fs = FileSystem::mount_device(crash.clone(), &MountOptions::default()).unwrap();
    fs.create(ROOT, b"late", 0o644, CRED).unwrap();
    fs.sync().unwrap();
    let dirty = crash.current();
    drop(fs);
    let err = grow::grow(&dirty, LARGE, &|_, _| {}).unwrap_err();
    assert_eq!(err.errno(), libc::EBUSY, "{err}");
    assert!(err.to_string().contains("not unmounted cleanly"), "{err}");
    fsck(&dirty, true);
    grow::grow(&dirty, LARGE, &|_, _| {}).unwrap();
    assert_clean(&dirty, "grown after fsck replayed the log");
}

/// A crash just before every write and flush of a grow (with all, none, each one and random
/// subsets of the writes not yet flushed, and with the superblock's write torn at every
/// sector) leaves the old or the new geometry, fsck clean without repair, the files intact
/// after a mount, and an image the same grow then finishes.
#[test]
fn a_crash_anywhere_in_a_grow_leaves_the_old_or_the_new_file_system() {
    for (from, to) in [(SMALL, PARTIAL), (PARTIAL, LARGE)] {
        let (base, files) = image(SMALL, LARGE);
        if from == PARTIAL {
            grow::grow(&base, PARTIAL, &|_, _| {}).unwrap();
        }
        let old = read_superblock(&base).unwrap();
        let crash = CrashDevice::new(base.snapshot());
        let new = grow::grow(&crash, to, &|_, _| {}).unwrap();
        let ops = crash.ops();
        let (mut states, mut grown) = (0, 0);
        for upto in 0..=ops.len() {
            // Every write of the epoch torn (the rest of the epoch kept): its first sectors
            // new and the others old, or the other way round.
            let epoch = unflushed_epoch(&ops, upto);
            let all: BTreeSet<usize> = epoch.clone().collect();
            let heads = [1, 4, 7].map(|n| (1u64 << n) - 1);
            let sectors = heads.into_iter().flat_map(|head| [head, 0xff ^ head]);
            let writes = epoch.filter(|&i| matches!(ops[i], Op::Write { .. }));
            let torn: Vec<_> = writes
                .flat_map(|op| sectors.clone().map(move |sectors| Tear { op, sectors }))
                .map(|tear| (all.clone(), Some(tear)))
                .collect();
            let whole = keep_sets(&ops, upto, upto as u64, 4).into_iter().map(|keep| (keep, None));
            for (keep, tear) in whole.chain(torn) {
                {
                    let image = crash_image_torn(&base, &ops, upto, &|i| keep.contains(&i), tear);
                    let why = format!("{from} -> {to}, crash before op {upto}, kept {keep:?}, {tear:?}");
                    let sb = read_superblock(&image).unwrap();
                    assert!(sb == old || sb == new, "{why}: {sb:?}");
                    grown += usize::from(sb == new);
                    states += 1;
                    check_crash_image(image, &files, &new, &why);
                }
            }
        }
        eprintln!("{from} -> {to}: {} ops, {states} crash states, {grown} of them grown", ops.len());
        assert!(states > 50 && grown > 0 && grown < states, "{states} states, {grown} grown");
    }
}

fn check_crash_image(image: MemDevice, files: &Files, new: &Superblock, why: &str) {
    let report = assert_clean(&image, why);
    let grown = read_superblock(&image).unwrap() == *new;
    let fs = FileSystem::mount_device(Arc::new(image.snapshot()), &MountOptions::default())
        .unwrap_or_else(|e| panic!("{why}: mount: {e}"));
    assert_files(&fs, files);
    assert_eq!(fs.statfs().blocks, read_superblock(&image).unwrap().geo.block_count, "{why}");
    fs.unmount().unwrap();
    if grown {
        // Whatever the grow had yet to rewrite, a repair rewrites without calling it an error.
        let repaired = fsck(&image, true);
        assert_eq!(repaired.exit_code(), fsck::EXIT_CLEAN, "{why}: {:#?}", repaired.messages);
        let again = assert_clean(&image, why);
        assert!(again.messages.is_empty(), "{why}: left {:#?} (first check: {:#?})", again.messages, report.messages);
    } else {
        // The same grow, run again, finishes the job.
        assert_eq!(grow::grow(&image, new.geo.block_count * 4096, &|_, _| {}).unwrap(), *new, "{why}");
        assert!(assert_clean(&image, why).messages.is_empty(), "{why}");
    }
}
