//! fallocate through the API: preallocation (mode 0, KEEP_SIZE), punched holes, collapsed
//! and inserted ranges, refused modes and arguments, ENOSPC, preallocated space on a full file system, multi-transaction
//! ranges; each across a remount and with fsck clean at the end.

use ferrofs::dev::MemDevice;
use ferrofs::*;

mod common;

use common::{fresh, remount, C, ROOT};

fn fsck_clean(dev: &MemDevice) {
    let report = ferrofs::fsck::check(dev, &ferrofs::fsck::FsckOptions::default(), &|_, _, _| {}).unwrap();
    assert!(report.is_clean(), "fsck found errors:\n{}", report.messages.join("\n"));
}

/// Compare file contents without printing megabytes: the first differing offset.
fn same(got: Vec<u8>, want: &[u8]) {
    let first = got.iter().zip(want).position(|(a, b)| a != b);
    assert!(
        got.len() == want.len() && first.is_none(),
        "read {} bytes, want {}; first difference at {first:?}",
        got.len(),
        want.len()
    );
}

/// Data blocks (4 KiB) an inode owns, from st_blocks (512-byte units).
fn blocks(fs: &FileSystem, ino: u64) -> u64 {
    fs.getattr(ino).unwrap().blocks / 8
}

/// Write `g` until the file system is full; returns the file's size.
fn fill(fs: &FileSystem, g: u64) -> u64 {
    let mut off = 0;
    for chunk in [vec![7u8; 1 << 16], vec![7u8; 4096]] {
        loop {
            match fs.write(g, off, &chunk) {
                Ok(_) => off += chunk.len() as u64,
                Err(Error::NoSpace) => break,
                Err(e) => panic!("{e}"),
            }
        }
    }
    assert!(matches!(fs.write(g, off, &[1; 4096]), Err(Error::NoSpace)));
    off
}

#[test]
fn fallocate_maps_unwritten_space() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    fs.write(f, 0, b"abc").unwrap();
    fs.fallocate(f, 0, 1 << 20, 0).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 1 << 20);
    // Block 0 was already written and stays; the other 255 are new and read as zeros.
    assert_eq!(blocks(&fs, f), 256);
    let mut want = vec![0u8; 1 << 20];
    want[..3].copy_from_slice(b"abc");
    same(fs.read(f, 0, 1 << 20).unwrap(), &want);
    // Unwritten extents are holes to SEEK_DATA/SEEK_HOLE.
    assert_eq!(fs.seek(f, 0, true).unwrap(), 4096);
    assert!(matches!(fs.seek(f, 4096, false), Err(Error::NoData)));

    // A write into the preallocated range converts the blocks it covers and allocates none.
    let data: Vec<u8> = (0..5000u32).map(|i| (i % 251) as u8 + 1).collect();
    fs.write(f, 100_000, &data).unwrap();
    want[100_000..105_000].copy_from_slice(&data);
    assert_eq!(blocks(&fs, f), 256);
    same(fs.read(f, 0, 1 << 20).unwrap(), &want);
    assert_eq!(fs.seek(f, 4096, false).unwrap(), 24 * 4096);
    assert_eq!(fs.seek(f, 24 * 4096, true).unwrap(), 26 * 4096);

    // KEEP_SIZE past the end: blocks, no size.
    fs.fallocate(f, 1 << 20, 1 << 20, FALLOC_FL_KEEP_SIZE).unwrap();
    assert_eq!((fs.getattr(f).unwrap().size, blocks(&fs, f)), (1 << 20, 512));
    assert_eq!(fs.read(f, 1 << 20, 4096).unwrap(), b"");
    // Growing the size keeps them (and they read as zeros); a write there converts them.
    fs.setattr(f, &SetAttr { size: Some((1 << 20) + 8192), ..Default::default() }).unwrap();
    assert_eq!(blocks(&fs, f), 512);
    want.resize((1 << 20) + 8192, 0);
    fs.write(f, (1 << 20) + 10, b"past").unwrap();
    want[(1 << 20) + 10..(1 << 20) + 14].copy_from_slice(b"past");
    same(fs.read(f, 0, 3 << 20).unwrap(), &want);
    // Six extents now: the map moved into a B+tree of one node.
    assert_eq!(blocks(&fs, f), 513);

    let fs = remount(&dev, fs);
    same(fs.read(f, 0, 3 << 20).unwrap(), &want);
    assert_eq!(blocks(&fs, f), 513);
    // A truncate to the same size drops what lies past the end (blocks 258..512).
    let size = fs.getattr(f).unwrap().size;
    fs.setattr(f, &SetAttr { size: Some(size), ..Default::default() }).unwrap();
    assert!((258..=259).contains(&blocks(&fs, f)), "{} blocks", blocks(&fs, f));
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev);
}

#[test]
fn fallocate_punch_hole() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    let data: Vec<u8> = (0..40_000u32).map(|i| (i % 253) as u8 + 1).collect();
    fs.write(f, 0, &data).unwrap();
    assert_eq!(blocks(&fs, f), 10);
    let keep = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    // Bytes 5000..20000: block 1 is partly zeroed, blocks 2..4 freed, block 4 partly zeroed.
    fs.fallocate(f, 5000, 15_000, keep).unwrap();
    let mut want = data.clone();
    want[5000..20_000].fill(0);
    same(fs.read(f, 0, 50_000).unwrap(), &want);
    assert_eq!((fs.getattr(f).unwrap().size, blocks(&fs, f)), (40_000, 8));
    assert_eq!(fs.seek(f, 4096, true).unwrap(), 8192);
    // Within one block, and past the end (nothing there): the size stays.
    fs.fallocate(f, 30_001, 2, keep).unwrap();
    want[30_001..30_003].fill(0);
    fs.fallocate(f, 1 << 20, 1 << 20, keep).unwrap();
    same(fs.read(f, 0, 50_000).unwrap(), &want);
    assert_eq!(fs.getattr(f).unwrap().size, 40_000);
    // Preallocated blocks are punched too.
    fs.fallocate(f, 1 << 20, 1 << 20, FALLOC_FL_KEEP_SIZE).unwrap();
    assert_eq!(blocks(&fs, f), 8 + 256);
    fs.fallocate(f, (1 << 20) + 4096, 8192, keep).unwrap();
    assert_eq!(blocks(&fs, f), 8 + 254);
    let fs = remount(&dev, fs);
    same(fs.read(f, 0, 50_000).unwrap(), &want);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev);
}

/// ZERO_RANGE over a file of 300 extents with holes between them (a B+tree), across
/// written, unwritten and unmapped blocks, with partial edge blocks, past the end with and
/// without KEEP_SIZE.
#[test]
fn fallocate_zero_range() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    // Blocks 0, 2, ..., 598 written: the size ends with block 598.
    let mut want = vec![0u8; 599 * 4096];
    for b in (0..600).step_by(2) {
        let block: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8 + (b % 3) as u8 + 1).collect();
        fs.write(f, b * 4096, &block).unwrap();
        want[b as usize * 4096..(b as usize + 1) * 4096].copy_from_slice(&block);
    }
    fs.fallocate(f, 700 * 4096, 10 * 4096, FALLOC_FL_KEEP_SIZE).unwrap();
    // st_blocks counts the B+tree's nodes too: a root and a few leaves for 300 extents.
    let holds = |fs: &FileSystem, data: u64| {
        let b = blocks(fs, f);
        assert!((data + 1..=data + 4).contains(&b), "{b} blocks for {data} data blocks and a B+tree");
    };
    holds(&fs, 300 + 10);
    // Blocks 11..=510 and parts of 10 and 511: every hole in the range is allocated too.
    let (off, len) = (10 * 4096 + 1000, 501 * 4096);
    fs.fallocate(f, off, len, FALLOC_FL_ZERO_RANGE).unwrap();
    want[off as usize..(off + len) as usize].fill(0);
    same(fs.read(f, 0, 1 << 30).unwrap(), &want);
    let mapped = 300 - 250 + 501 + 1 + 10;
    holds(&fs, mapped);
    // Over the preallocated tail, keeping the size; then past it, growing the size.
    fs.fallocate(f, 705 * 4096, 20 * 4096, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE).unwrap();
    assert_eq!(fs.getattr(f).unwrap().size, 599 * 4096);
    holds(&fs, mapped + 15);
    fs.fallocate(f, 800 * 4096 + 5, 10, FALLOC_FL_ZERO_RANGE).unwrap();
    want.resize(800 * 4096 + 15, 0);
    same(fs.read(f, 0, 1 << 30).unwrap(), &want);
    // A range of written data inside one block, with the size unchanged.
    fs.fallocate(f, 598 * 4096 + 7, 100, FALLOC_FL_ZERO_RANGE).unwrap();
    want[598 * 4096 + 7..598 * 4096 + 107].fill(0);
    let fs = remount(&dev, fs);
    same(fs.read(f, 0, 1 << 30).unwrap(), &want);
    // More than the free space: refused before anything changes.
    let free = fs.statfs().bfree;
    assert!(matches!(fs.fallocate(f, 0, 1 << 30, FALLOC_FL_ZERO_RANGE), Err(Error::NoSpace)));
    assert_eq!(fs.statfs().bfree, free);
    same(fs.read(f, 0, 1 << 30).unwrap(), &want);
    // Over more extents than one transaction unmaps (300 written blocks between holes):
    // punched first, then preallocated.
    let g = fs.create(ROOT, b"g", 0o644, C).unwrap().ino;
    for b in (0..600).step_by(2) {
        fs.write(g, b * 4096, &[9u8; 4096]).unwrap();
    }
    fs.fallocate(g, 0, 599 * 4096, FALLOC_FL_ZERO_RANGE).unwrap();
    same(fs.read(g, 0, 1 << 30).unwrap(), &vec![0u8; 599 * 4096]);
    let b = blocks(&fs, g);
    assert!((599..=603).contains(&b), "{b} blocks for 599 data blocks and a B+tree");
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev);
}

/// A file and what it should hold: its bytes, and which blocks are mapped (past the end too).
struct Shifted {
    want: Vec<u8>,
    mapped: Vec<bool>,
}

impl Shifted {
    fn collapse(&mut self, fs: &FileSystem, f: u64, (from, by): (usize, usize)) {
        fs.fallocate(f, from as u64 * 4096, by as u64 * 4096, FALLOC_FL_COLLAPSE_RANGE).unwrap();
        self.want.drain(from * 4096..(from + by) * 4096);
        self.mapped.drain(from..from + by);
        self.check(fs, f);
    }

    fn insert(&mut self, fs: &FileSystem, f: u64, (from, by): (usize, usize)) {
        fs.fallocate(f, from as u64 * 4096, by as u64 * 4096, FALLOC_FL_INSERT_RANGE).unwrap();
        self.want.splice(from * 4096..from * 4096, vec![0; by * 4096]);
        self.mapped.splice(from..from, vec![false; by]);
        self.check(fs, f);
    }

    /// Contents, size, and st_blocks: the mapped blocks and a B+tree of a few nodes.
    fn check(&self, fs: &FileSystem, f: u64) {
        same(fs.read(f, 0, 1 << 30).unwrap(), &self.want);
        assert_eq!(fs.getattr(f).unwrap().size, self.want.len() as u64);
        let data = self.mapped.iter().filter(|&&m| m).count() as u64;
        let b = blocks(fs, f);
        assert!((data + 1..=data + 4).contains(&b), "{b} blocks for {data} data blocks and a B+tree");
    }
}

/// COLLAPSE_RANGE and INSERT_RANGE over a file of 300 one-block extents with holes between
/// them, a 20-block extent, and preallocated blocks past the end: ranges moving more
/// extents than one transaction moves and fewer, at the start, inside the long extent and
/// near the end; the collapsed blocks are freed; remount, fsck.
#[test]
fn fallocate_collapse_and_insert_range() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    let mut file = Shifted { want: vec![0u8; 620 * 4096 - 100], mapped: vec![false; 710] };
    // Blocks 0, 2, ..., 598 and 600..620 written, each block's bytes telling it apart; the
    // last one partial. Blocks 700..710 preallocated past the end.
    for b in (0..600).step_by(2).chain(600..620) {
        let block: Vec<u8> = (0..4096u32).map(|i| ((i + 7 * b) % 251) as u8 + 1).collect();
        let at = b as usize * 4096;
        let n = block.len().min(file.want.len() - at);
        fs.write(f, at as u64, &block[..n]).unwrap();
        file.want[at..at + n].copy_from_slice(&block[..n]);
        file.mapped[b as usize] = true;
    }
    fs.fallocate(f, 700 * 4096, 10 * 4096, FALLOC_FL_KEEP_SIZE).unwrap();
    file.mapped[700..].fill(true);
    file.check(&fs, f);

    let (free, owned) = (fs.statfs().bfree, blocks(&fs, f));
    // Near the start: about 300 extents move, more than one transaction moves.
    file.collapse(&fs, f, (10, 5));
    // Inside the 20-block extent (now at 595..615), and from block 0.
    file.collapse(&fs, f, (600, 3));
    file.collapse(&fs, f, (0, 1));
    // Near the end: a few extents, one transaction.
    file.collapse(&fs, f, (605, 2));
    let fs = remount(&dev, fs);
    // 3 + 2 + 1 + 2 written blocks freed (and B+tree nodes if the tree shrank), usable
    // again.
    let freed = owned - blocks(&fs, f);
    assert!((8..=10).contains(&freed), "{freed} blocks freed");
    assert_eq!(fs.statfs().bfree, free + freed);
    file.check(&fs, f);

    // At block 0 (everything moves), inside the long extent, at the last block.
    file.insert(&fs, f, (0, 7));
    file.insert(&fs, f, (603, 2));
    let last = file.want.len() / 4096;
    file.insert(&fs, f, (last, 1));
    file.insert(&fs, f, (300, 300));
    // The inserted holes take writes like any hole.
    fs.write(f, 3 * 4096 + 5, b"hole").unwrap();
    file.want[3 * 4096 + 5..3 * 4096 + 9].copy_from_slice(b"hole");
    file.mapped[3] = true;
    file.check(&fs, f);
    // Collapsing what was inserted gives the file back.
    file.collapse(&fs, f, (300, 300));
    let fs = remount(&dev, fs);
    file.check(&fs, f);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev);
}

/// Collapse and insert refuse what ext4 and XFS refuse, and change nothing then.
#[test]
fn fallocate_collapse_and_insert_errors() {
    let (_dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    fs.write(f, 0, &[5u8; 5 * 4096]).unwrap();
    let before = fs.getattr(f).unwrap();
    let (collapse, insert) = (FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE);
    let einval = [
        // Combined with other flags, or with each other.
        (collapse | FALLOC_FL_KEEP_SIZE, 0, 4096),
        (insert | FALLOC_FL_KEEP_SIZE, 0, 4096),
        (collapse | insert, 0, 4096),
        (collapse | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0, 4096),
        // Not block aligned.
        (collapse, 100, 4096),
        (collapse, 0, 4000),
        (insert, 4096, 100),
        (insert, 1, 4096),
        // A collapse reaching the end of the file, or an insert at or past it.
        (collapse, 4096, 4 * 4096),
        (collapse, 0, 8 * 4096),
        (insert, 5 * 4096, 4096),
        (insert, 8 * 4096, 4096),
    ];
    for (mode, off, len) in einval {
        assert!(matches!(fs.fallocate(f, off, len, mode), Err(Error::Invalid(_))), "mode {mode:#x} {len} at {off}");
    }
    // Growing past the largest file: the size, or the last (preallocated) extent.
    assert!(matches!(fs.fallocate(f, 0, 1 << 56, insert), Err(Error::FileTooBig)));
    fs.fallocate(f, (1 << 56) - 4096, 4096, FALLOC_FL_KEEP_SIZE).unwrap();
    let before_blocks = fs.getattr(f).unwrap().blocks;
    assert!(matches!(fs.fallocate(f, 0, 4096, insert), Err(Error::FileTooBig)));
    assert_eq!((fs.getattr(f).unwrap().size, fs.getattr(f).unwrap().blocks), (before.size, before_blocks));
    same(fs.read(f, 0, 1 << 20).unwrap(), &[5u8; 5 * 4096]);
    // Only regular files.
    assert!(matches!(fs.fallocate(ROOT, 0, 4096, collapse), Err(Error::IsDir)));
    let l = fs.symlink(ROOT, b"l", b"f", C).unwrap().ino;
    assert!(matches!(fs.fallocate(l, 0, 4096, insert), Err(Error::Invalid(_))));
}

#[test]
fn fallocate_errors() {
    let (_dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    fs.write(f, 0, b"x").unwrap();
    let before = fs.getattr(f).unwrap();
    // A punch that may change the size, a punch that also zeroes, and unknown bits are not
    // supported; nothing changes.
    let zero_and_punch = FALLOC_FL_ZERO_RANGE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    for mode in [FALLOC_FL_PUNCH_HOLE, zero_and_punch, 0x40, 0x80] {
        assert!(matches!(fs.fallocate(f, 0, 4096, mode), Err(Error::NotSupported)), "mode {mode:#x}");
    }
    assert!(matches!(fs.fallocate(f, 0, 0, 0), Err(Error::Invalid(_))));
    assert!(matches!(fs.fallocate(f, u64::MAX - 10, 100, 0), Err(Error::FileTooBig)));
    assert!(matches!(fs.fallocate(f, 1 << 56, 1, 0), Err(Error::FileTooBig)));
    assert!(matches!(fs.fallocate(ROOT, 0, 4096, 0), Err(Error::IsDir)));
    let l = fs.symlink(ROOT, b"l", b"f", C).unwrap().ino;
    assert!(matches!(fs.fallocate(l, 0, 4096, 0), Err(Error::Invalid(_))));
    // More than the free space: refused before anything changes.
    let free = fs.statfs().bfree;
    assert!(matches!(fs.fallocate(f, 0, 1 << 30, 0), Err(Error::NoSpace)));
    assert_eq!(fs.statfs().bfree, free);
    assert_eq!(fs.getattr(f).unwrap(), before);
}

#[test]
fn preallocated_space_is_there_when_the_file_system_is_full() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    fs.fallocate(f, 0, 4 << 20, FALLOC_FL_KEEP_SIZE).unwrap();
    // Fill everything else.
    let g = fs.create(ROOT, b"g", 0o644, C).unwrap().ino;
    fill(&fs, g);
    // The preallocated file can still be written in full.
    let data: Vec<u8> = (0..4 << 20).map(|i: u32| (i % 249) as u8).collect();
    for (n, piece) in data.chunks(100_000).enumerate() {
        fs.write(f, n as u64 * 100_000, piece).unwrap();
    }
    same(fs.read(f, 0, 4 << 20).unwrap(), &data);
    assert_eq!(blocks(&fs, f), 1024);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev);
}

#[test]
fn fallocate_of_gigabytes_takes_several_transactions() {
    let (dev, fs) = fresh(4 << 30);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    // 2.5 GiB: more than one transaction maps (1 GiB), and more than one 1 GiB AG holds.
    let len = (5u64 << 30) / 2;
    fs.fallocate(f, 4096, len, 0).unwrap();
    assert_eq!((fs.getattr(f).unwrap().size, blocks(&fs, f) >= len / 4096), (4096 + len, true));
    fs.write(f, len, b"end").unwrap();
    assert_eq!(fs.read(f, len - 2, 10).unwrap(), b"\0\0end\0\0\0\0\0");
    assert_eq!(fs.read(f, 0, 8192).unwrap(), vec![0; 8192]);
    let fs = remount(&dev, fs);
    assert_eq!(fs.read(f, len - 2, 10).unwrap(), b"\0\0end\0\0\0\0\0");
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev);
}

/// Scattered writes into preallocated space split its unwritten extent into many, so the
/// block map becomes a B+tree that grows with the writes: on a full file system those tree
/// blocks come from the pool kept back for conversions, and no write fails.
#[test]
fn scattered_writes_into_preallocated_space_succeed_on_a_full_file_system() {
    let (dev, fs) = fresh(64 << 20);
    let f = fs.create(ROOT, b"f", 0o644, C).unwrap().ino;
    let len: u64 = 8 << 20;
    fs.fallocate(f, 0, len, 0).unwrap();
    let g = fs.create(ROOT, b"g", 0o644, C).unwrap().ino;
    fill(&fs, g);
    // Every other block: each write splits an unwritten extent.
    let mut want = vec![0u8; len as usize];
    for b in (0..len / 4096).step_by(2) {
        let piece = vec![(b % 251) as u8 + 1; 4096];
        fs.write(f, b * 4096, &piece).unwrap_or_else(|e| panic!("write of block {b}: {e}"));
        want[(b * 4096) as usize..][..4096].copy_from_slice(&piece);
    }
    same(fs.read(f, 0, len as usize).unwrap(), &want);
    let fs = remount(&dev, fs);
    same(fs.read(f, 0, len as usize).unwrap(), &want);
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev);
}

/// Freeing space must work when there is none: punches that split extents (the map grows
/// into a B+tree), a shrinking truncate and an unlink, on a full file system. (A regression
/// test: it passes without the pool too, since every reservation leaves a margin.)
#[test]
fn space_is_freed_on_a_full_file_system() {
    let (dev, fs) = fresh(64 << 20);
    let g = fs.create(ROOT, b"g", 0o644, C).unwrap().ino;
    let off = fill(&fs, g);
    let keep = FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE;
    // One block out of the middle of each 64 KiB: every punch splits an extent.
    for n in 0..200u64 {
        fs.fallocate(g, n * (1 << 16) + 4096, 4096, keep).unwrap_or_else(|e| panic!("punch {n} of g: {e}"));
    }
    fs.setattr(g, &SetAttr { size: Some(off / 2), ..SetAttr::default() }).unwrap();
    fs.unlink(ROOT, b"g").unwrap();
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev);
}

/// The space statfs reports available is allocatable, also right after it was freed: an
/// unlink's blocks are busy until its checkpoint is durable, and a fallocate that finds no
/// other space forces the log and retries. Each round takes all but 1 MiB of what statfs
/// offers, then frees it; a freed file counts as available at once.
#[test]
fn freed_space_is_allocatable_at_once() {
    let (dev, fs) = fresh(256 << 20);
    for round in 0..4 {
        let name = format!("f{round}");
        let avail = fs.statfs().bavail * 4096;
        let f = fs.create(ROOT, name.as_bytes(), 0o644, C).unwrap().ino;
        fs.fallocate(f, 0, avail - (1 << 20), 0)
            .unwrap_or_else(|e| panic!("round {round}: fallocate of {avail} bytes less 1 MiB: {e}"));
        fs.unlink(ROOT, name.as_bytes()).unwrap();
        assert_eq!(fs.statfs().bavail * 4096, avail, "round {round}: what the unlink freed counts as available");
    }
    // The same for writes (1 MiB each, as through a mount).
    let f = fs.create(ROOT, b"w", 0o644, C).unwrap().ino;
    let avail = fs.statfs().bavail * 4096;
    fs.fallocate(f, 0, avail - (1 << 20), 0).unwrap();
    fs.unlink(ROOT, b"w").unwrap();
    let g = fs.create(ROOT, b"g", 0o644, C).unwrap().ino;
    let chunk = vec![5u8; 1 << 20];
    for n in 0..(avail / 2) >> 20 {
        fs.write(g, n << 20, &chunk).unwrap_or_else(|e| panic!("write of MiB {n}: {e}"));
    }
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&dev);
}
