//! Corrupted images and failing devices. Every byte read from the device is untrusted: for
//! each kind of metadata block of a populated image, random byte flips (plain, and re-sealed
//! with a valid checksum so the structural checks behind it are reached too) and whole-block
//! zeroing must lead to clean errors, never a panic or a hang. Each case runs on its own
//! thread under a watchdog, with panics caught; the sweep prints its seed (`CORRUPT_SEED`
//! replays it, `CORRUPT_TRIALS` sets the trials per block and kind of damage). Every damaged
//! image is then repaired by `fsck -y`, must check clean afterwards, and must still hold every
//! file whose own blocks were not damaged, with its contents.
//!
//! Then devices that fail: unreadable blocks (EIO) and a write that fails in the middle of
//! an operation. The file system must report an error, and the image it leaves behind
//! must mount and be consistent (fsck clean).

use ferrofs::dev::{BlockDevice, FaultDevice, MemDevice};
use ferrofs::format::{
    self, inode::MAGIC_INODE, DiskInode, Fork, Geometry, BLOCK_SIZE, HDR_SIZE, INODE_SIZE, MAGIC_BTREE,
};
use ferrofs::fsck::{self, FsckOptions};
use ferrofs::journal::JournalConfig;
use ferrofs::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

const ROOT: u64 = 1;
const CRED: Cred = Cred { uid: 1000, gid: 1000, umask: 0 };
const IMAGE_SIZE: u64 = 64 << 20;
const BS: u64 = BLOCK_SIZE as u64;
/// A case takes milliseconds; the watchdog only tells a hang from a slow machine, so it is
/// generous (10 s was suspected of one failure on a saturated 2-core machine).
const WATCHDOG: Duration = Duration::from_secs(60);

type Checked = std::result::Result<(), String>;

fn mount_options() -> MountOptions {
    let mut cfg =
        JournalConfig::for_log(ferrofs::mkfs::plan(IMAGE_SIZE, &MkfsOptions::default()).unwrap().log_blocks - 2);
    cfg.background = false;
    cfg.cil_max_bytes = u64::MAX; // nothing drains the CIL but our syncs (see crash.rs)
    MountOptions { read_only: false, journal: Some(cfg), ..MountOptions::default() }
}

fn mount(dev: Arc<dyn BlockDevice>) -> Result<FileSystem> {
    FileSystem::mount_device(dev, &mount_options())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

fn readdir(fs: &FileSystem, ino: u64) -> Result<Vec<DirEntry>> {
    let mut v = Vec::new();
    fs.readdir(ino, 0, &mut |e| {
        v.push(e.owned());
        true
    })?;
    Ok(v)
}

fn fsck_report(dev: &dyn BlockDevice) -> Result<fsck::FsckReport> {
    fsck::check(dev, &FsckOptions { repair: false }, &|_, _, _| {})
}

fn fsck_clean(dev: &dyn BlockDevice) -> Checked {
    let r = fsck_report(dev).map_err(|e| format!("fsck failed: {e}"))?;
    if r.is_clean() {
        Ok(())
    } else {
        Err(format!("fsck: {} errors: {:?}", r.errors_found, r.messages))
    }
}

// ---------------------------------------------------------------------------------------
// Panics and hangs become failures
// ---------------------------------------------------------------------------------------

thread_local! {
    /// Where and why the current thread last panicked, recorded by the hook below.
    static LAST_PANIC: RefCell<Option<String>> = const { RefCell::new(None) };
}

/// Record panics of guarded threads instead of printing them (a sweep may see many).
fn install_panic_hook() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let guarded = std::thread::current().name() == Some("guarded");
            if !guarded {
                return default(info);
            }
            let msg = info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| info.payload().downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            let at = info.location().map(|l| format!("{}:{}", l.file(), l.line())).unwrap_or_default();
            LAST_PANIC.with(|p| *p.borrow_mut() = Some(format!("panic at {at}: {msg}")));
        }));
    });
}

/// Run `f` on a thread of its own: a panic (with its location) or not finishing within the
/// watchdog time is an `Err`. A hung thread is left behind.
fn guarded<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> std::result::Result<T, String> {
    install_panic_hook();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("guarded".into())
        .spawn(move || {
            let r = catch_unwind(AssertUnwindSafe(f))
                .map_err(|_| LAST_PANIC.with(|p| p.borrow_mut().take()).unwrap_or_else(|| "panic".into()));
            let _ = tx.send(r);
        })
        .unwrap();
    match rx.recv_timeout(WATCHDOG) {
        Ok(r) => r,
        Err(_) => Err(format!("hang: no result after {WATCHDOG:?}")),
    }
}

// ---------------------------------------------------------------------------------------
// The populated images
// ---------------------------------------------------------------------------------------

/// Paths of the populated image (see [`images`]).
const BIG_DIR: &str = "/big";
const FRAG: &str = "/a/frag";
const XATTRS: &str = "/a/mid";

struct Images {
    /// Unmounted cleanly: an empty log, and an orphan (an unlinked file that was still open)
    /// whose extent map is a B+tree.
    clean: MemDevice,
    /// The same file system a moment earlier: synced but not unmounted, so the log holds
    /// records that a mount replays.
    logged: MemDevice,
    orphan: u64,
}

/// Build the populated images once:
/// ```text
/// /a/small (100 B, inline xattr)  /a/one (4 KiB)  /a/mid (50 KiB, 10 xattrs of 900 B: B+tree)
/// /a/frag (500 one-byte extents: extent B+tree)   /a/b/sparse (bytes at 0 and 4 GiB)
/// /big (600 entries: multi-level directory B+tree)  /s -> a/small  /a/long (400-byte target)
/// orphan: 400 extents (extent B+tree), unlinked while open
/// ```
fn images() -> &'static Images {
    static I: OnceLock<Images> = OnceLock::new();
    I.get_or_init(|| {
        let dev = Arc::new(MemDevice::new(IMAGE_SIZE));
        FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
        let fs = mount(dev.clone()).unwrap();
        fs.create_dir_all("/a/b", 0o755, CRED).unwrap();
        let small = fs.write_file("/a/small", &pattern(100, 1), CRED).unwrap().ino;
        fs.setxattr(small, b"user.s", b"inline", 0).unwrap();
        fs.write_file("/a/one", &pattern(4096, 2), CRED).unwrap();
        let mid = fs.write_file(XATTRS, &pattern(50_000, 3), CRED).unwrap().ino;
        for i in 0..10 {
            fs.setxattr(mid, format!("user.x{i}").as_bytes(), &pattern(900, i), 0).unwrap();
        }
        let frag = fs.write_file(FRAG, b"", CRED).unwrap().ino;
        for k in 0..500u64 {
            fs.write(frag, 2 * k * BS, &[k as u8 | 1]).unwrap();
        }
        let sparse = fs.write_file("/a/b/sparse", b"head", CRED).unwrap().ino;
        fs.write(sparse, 4 << 30, b"tail").unwrap();
        let big = fs.mkdir(ROOT, &BIG_DIR.as_bytes()[1..], 0o755, CRED).unwrap().ino;
        for i in 0..600 {
            fs.create(big, format!("entry-{i:03}").as_bytes(), 0o644, CRED).unwrap();
            if i % 100 == 99 {
                fs.sync().unwrap();
            }
        }
        fs.symlink(ROOT, b"s", b"a/small", CRED).unwrap();
        let a = fs.resolve("/a").unwrap().ino;
        fs.symlink(a, b"long", &[b'l'; 400], CRED).unwrap();
        let orphan = fs.write_file("/a/orphan", b"", CRED).unwrap().ino;
        for k in 0..400u64 {
            fs.write(orphan, 2 * k * BS, b"o").unwrap();
        }
        fs.sync().unwrap();
        fs.open(orphan).unwrap();
        fs.unlink(a, b"orphan").unwrap();
        fs.sync().unwrap();
        let logged = dev.snapshot();
        fs.unmount().unwrap();
        std::mem::forget(fs); // keep the orphan open: dropping would only unmount again
        Images { clean: dev.snapshot(), logged, orphan }
    })
}

// ---------------------------------------------------------------------------------------
// Finding the blocks to damage
// ---------------------------------------------------------------------------------------

/// How a damaged block can be given a valid checksum again.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Seal {
    /// The common 32-byte block header.
    Header,
    /// An inode table block: every inode carries its own checksum.
    Inodes,
    /// A log record: one checksum over all its blocks.
    Record,
}

#[derive(Clone, Debug)]
struct Target {
    name: String,
    /// First block and number of blocks (more than one only for a log record).
    block: u64,
    blocks: u64,
    seal: Seal,
    /// The log image (records present) rather than the cleanly unmounted one.
    logged: bool,
    /// Damage here leaves a redundant copy: after zeroing or plain flips, mount and the walk
    /// must still fully succeed (a re-sealed copy is believed, so anything may happen).
    redundant: bool,
}

fn read_block(dev: &MemDevice, blkno: u64) -> Vec<u8> {
    let mut b = vec![0u8; BLOCK_SIZE];
    dev.read_at(&mut b, blkno * BS).unwrap();
    b
}

fn inode_of(dev: &MemDevice, geo: &Geometry, ino: u64) -> DiskInode {
    let mut img = [0u8; INODE_SIZE];
    dev.read_at(&mut img, geo.inode_offset(ino).unwrap()).unwrap();
    DiskInode::decode(&img, ino, geo).unwrap()
}

/// A B+tree's root and its first child (a leaf, or an interior node of a deeper tree).
fn tree_root_and_child(dev: &MemDevice, root: u64) -> (u64, u64) {
    let b = read_block(dev, root);
    assert!(b[HDR_SIZE] > 0, "the tree at {root} should have more than one level");
    (root, format::get_u64(&b, HDR_SIZE + 16 + 8))
}

/// The inode at `path` (a read-only mount of a copy: the image is not changed).
fn ino_at(dev: &MemDevice, path: &str) -> u64 {
    let fs = FileSystem::mount_device(
        Arc::new(dev.snapshot()),
        &MountOptions { read_only: true, ..MountOptions::default() },
    )
    .unwrap();
    fs.resolve(path).unwrap().ino
}

fn targets() -> Vec<Target> {
    let img = images();
    let dev = &img.clean;
    let geo = ferrofs::read_superblock(dev).unwrap().geo;
    let (l0, l2) = (geo.ag_layout(0), geo.ag_layout(2));
    let t = |name: &str, block: u64, seal: Seal| Target {
        name: name.into(),
        block,
        blocks: 1,
        seal,
        logged: false,
        redundant: false,
    };
    let mut v = vec![
        Target { redundant: true, ..t("superblock (primary)", 0, Seal::Header) },
        Target { redundant: true, ..t("superblock (backup, AG 1)", geo.ag_blocks, Seal::Header) },
        t("AG header (AG 0)", l0.header, Seal::Header),
        t("AG header (AG 2)", l2.header, Seal::Header),
        t("block bitmap (AG 0)", l0.block_bitmap, Seal::Header),
        t("inode bitmap (AG 0)", l0.inode_bitmap, Seal::Header),
        t("orphan table", geo.ag_layout(format::ino_ag(img.orphan)).orphan_table, Seal::Header),
        t("inode table (root)", geo.inode_offset(ROOT).unwrap() / BS, Seal::Inodes),
        t("inode table (orphan)", geo.inode_offset(img.orphan).unwrap() / BS, Seal::Inodes),
        Target { redundant: true, ..t("log header 0", l0.log, Seal::Header) },
        Target { redundant: true, ..t("log header 1", l0.log + 1, Seal::Header) },
    ];
    let paths = [(BIG_DIR, "directory"), (FRAG, "extent")];
    for (path, what) in paths {
        let ino = ino_at(dev, path);
        v.push(t(&format!("inode table ({path})"), geo.inode_offset(ino).unwrap() / BS, Seal::Inodes));
        let Fork::Btree(root) = inode_of(dev, &geo, ino).fork else { panic!("{path} has no B+tree") };
        let (root, child) = tree_root_and_child(dev, root);
        v.push(t(&format!("{what} B+tree root ({path})"), root, Seal::Header));
        v.push(t(&format!("{what} B+tree node ({path})"), child, Seal::Header));
    }
    let Fork::Btree(oroot) = inode_of(dev, &geo, img.orphan).fork else { panic!("the orphan has no B+tree") };
    v.push(t("extent B+tree node (orphan)", tree_root_and_child(dev, oroot).1, Seal::Header));
    let xroot = inode_of(dev, &geo, ino_at(dev, XATTRS)).xattr_root;
    let (xroot, xchild) = tree_root_and_child(dev, xroot);
    v.push(t(&format!("xattr B+tree root ({XATTRS})"), xroot, Seal::Header));
    v.push(t(&format!("xattr B+tree node ({XATTRS})"), xchild, Seal::Header));
    // The log image: its header and its first and last records.
    let logged = |name: &str, block: u64, blocks: u64, seal: Seal| Target {
        name: name.into(),
        block,
        blocks,
        seal,
        logged: true,
        redundant: false,
    };
    v.push(logged("log header 0 (log not empty)", l0.log, 1, Seal::Header));
    v.push(logged("log header 1 (log not empty)", l0.log + 1, 1, Seal::Header));
    let records = log_records(&img.logged, &geo);
    assert!(records.len() >= 2, "the logged image should hold records, has {records:?}");
    for (name, (start, len)) in [("log record (first)", records[0]), ("log record (last)", *records.last().unwrap())] {
        v.push(logged(name, start, len, Seal::Record));
    }
    v
}

/// (first block, blocks) of every record a mount would replay, from the newest header's
/// tail on.
fn log_records(dev: &MemDevice, geo: &Geometry) -> Vec<(u64, u64)> {
    use format::log::{record_head, LogHeader};
    let l0 = geo.ag_layout(0);
    let (ring_start, ring) = (l0.log + 2, geo.log_blocks - 2);
    let header = (0..2)
        .filter_map(|i| LogHeader::decode(&read_block(dev, l0.log + i), l0.log + i, ring).ok())
        .max_by_key(|h| h.gen)
        .unwrap();
    let (mut off, mut seq) = (header.tail_off, header.tail_seq);
    let mut out = Vec::new();
    loop {
        let head = record_head(&read_block(dev, ring_start + off), ring - off)
            .filter(|h| h.seq == seq && h.epoch == header.epoch);
        let head = match head {
            Some(h) => h,
            None if off != 0 => match record_head(&read_block(dev, ring_start), ring)
                .filter(|h| h.seq == seq && h.epoch == header.epoch)
            {
                Some(h) => {
                    off = 0;
                    h
                }
                None => return out,
            },
            None => return out,
        };
        out.push((ring_start + off, head.len_blocks));
        off = (off + head.len_blocks) % ring;
        seq += 1;
    }
}

// ---------------------------------------------------------------------------------------
// Damage
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Damage {
    /// Flip `n` random bytes (half of them in the first 128 bytes of a block, where headers
    /// and inode cores live); re-seal afterwards when `reseal`.
    Flip {
        n: usize,
        reseal: bool,
    },
    Zero,
}

/// Damage `t` on a copy of its image; `rng` picks the bytes.
fn damaged(t: &Target, damage: Damage, rng: &mut StdRng) -> MemDevice {
    let img = images();
    let dev = if t.logged { img.logged.snapshot() } else { img.clean.snapshot() };
    let mut buf = vec![0u8; (t.blocks * BS) as usize];
    dev.read_at(&mut buf, t.block * BS).unwrap();
    let before = buf.clone();
    match damage {
        Damage::Zero => buf.fill(0),
        Damage::Flip { n, reseal } => {
            for i in 0..n {
                let at = if i % 2 == 0 {
                    rng.gen_range(0..128) + BLOCK_SIZE * rng.gen_range(0..t.blocks as usize)
                } else {
                    rng.gen_range(0..buf.len())
                };
                buf[at] ^= rng.gen_range(1..=255u8);
            }
            if reseal {
                seal(t.seal, &mut buf, &before);
            }
        }
    }
    dev.write_at(&buf, t.block * BS).unwrap();
    dev
}

/// Give damaged metadata valid checksums again (keeping each structure's lsn).
fn seal(kind: Seal, buf: &mut [u8], before: &[u8]) {
    match kind {
        Seal::Header => {
            let lsn = format::header_lsn(buf);
            format::seal_block(buf, lsn);
        }
        Seal::Inodes => {
            for (slot, old) in buf.chunks_mut(INODE_SIZE).zip(before.chunks(INODE_SIZE)) {
                if format::get_u16(old, 0) == MAGIC_INODE {
                    let lsn = format::get_u64(slot, 16);
                    DiskInode::seal(slot, lsn);
                }
            }
        }
        Seal::Record => {
            let crc = format::crc_with_hole(buf, 4);
            format::put_u32(buf, 4, crc);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Using a damaged image
// ---------------------------------------------------------------------------------------

/// Errors a damaged image may produce. Anything else (EINVAL from a read, ENOSPC, ...) is
/// reported: it means a bad value got past the checks and was mistaken for a request error.
/// ENOENT and ENODATA are accepted because a damaged name in a (re-sealed) directory or
/// xattr leaf is listed by readdir/listxattr but not found by its hash: the engine does not
/// check names against their keys when listing (fsck does).
fn clean_error(e: &Error) -> bool {
    match e {
        Error::Corrupt { what, .. } => !what.is_empty(),
        Error::Io(_) | Error::Stale | Error::NotFound | Error::NoAttr | Error::NotDir | Error::IsDir => true,
        _ => false,
    }
}

/// What using an image found.
#[derive(Debug, Default)]
struct Use {
    mounted: bool,
    /// Clean errors from mounting and reading.
    errors: Vec<String>,
    /// Errors from mounting and reading that are not [`clean_error`]s.
    unclean: Vec<String>,
    /// Errors from changing the image: any kind is fine on a damaged image.
    mutation: Vec<String>,
}

impl Use {
    fn note<T>(&mut self, what: &str, r: Result<T>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                let line = format!("{what}: {e}");
                if clean_error(&e) {
                    self.errors.push(line);
                } else {
                    self.unclean.push(line);
                }
                None
            }
        }
    }
}

/// Visit everything reachable: readdir, lookup of every name, getattr, whole files (for
/// sparse files, both ends), symlinks, xattrs.
fn walk(fs: &FileSystem, u: &mut Use) {
    let mut todo = vec![(ROOT, "/".to_string())];
    let mut seen = std::collections::HashSet::new();
    while let Some((dir, path)) = todo.pop() {
        if !seen.insert(dir) {
            continue;
        }
        let Some(entries) = u.note(&format!("readdir {path}"), readdir(fs, dir)) else { continue };
        for e in entries.into_iter().filter(|e| e.name != b"." && e.name != b"..") {
            let p = format!("{path}{}", String::from_utf8_lossy(&e.name));
            u.note(&format!("lookup {p}"), fs.lookup(dir, &e.name));
            let Some(a) = u.note(&format!("getattr {p}"), fs.getattr(e.ino)) else { continue };
            match a.kind {
                FileType::Directory => todo.push((e.ino, format!("{p}/"))),
                FileType::Symlink => drop(u.note(&format!("readlink {p}"), fs.readlink(e.ino))),
                FileType::RegularFile => {
                    let ends = [(0, a.size.min(1 << 20)), (a.size.saturating_sub(1 << 16), a.size)];
                    for (from, to) in ends {
                        u.note(&format!("read {p}"), fs.read(e.ino, from, (to - from) as usize));
                    }
                }
                _ => {}
            }
            if let Some(names) = u.note(&format!("listxattr {p}"), fs.listxattr(e.ino)) {
                for n in names {
                    u.note(&format!("getxattr {p}"), fs.getxattr(e.ino, &n));
                }
            }
        }
    }
}

/// Change things on the image: new files, writes, removals, a rename, sync, unmount.
fn mutate(fs: &FileSystem, u: &mut Use) {
    let mut any = |what: &str, r: Result<()>| {
        if let Err(e) = r {
            u.mutation.push(format!("{what}: {e}"));
        }
    };
    any(
        "create",
        fs.create(ROOT, b"new", 0o644, CRED).and_then(|a| fs.write(a.ino, 0, &pattern(10_000, 9)).map(|_| ())),
    );
    any("write to the fragmented file", fs.resolve(FRAG).and_then(|a| fs.write(a.ino, 5, b"xyz").map(|_| ())));
    any(
        "create in the big directory",
        fs.resolve(BIG_DIR).and_then(|a| fs.create(a.ino, b"entry-new", 0o644, CRED).map(|_| ())),
    );
    any("unlink from the big directory", fs.resolve(BIG_DIR).and_then(|a| fs.unlink(a.ino, b"entry-007")));
    any("setxattr", fs.resolve(XATTRS).and_then(|a| fs.setxattr(a.ino, b"user.new", &[5; 700], 0)));
    any(
        "truncate the fragmented file",
        fs.resolve(FRAG)
            .and_then(|a| fs.setattr(a.ino, &SetAttr { size: Some(3 * BS), ..Default::default() }).map(|_| ())),
    );
    any("rename", fs.resolve("/a").and_then(|a| fs.rename(a.ino, b"one", ROOT, b"one", 0)));
    any("mkdir and rmdir", fs.mkdir(ROOT, b"empty", 0o755, CRED).and_then(|_| fs.rmdir(ROOT, b"empty")));
    any("sync", fs.sync());
    any("unmount", fs.unmount());
}

/// Mount a (damaged) image, walk it, change it; then fsck what is left (read-only).
fn use_image(dev: MemDevice) -> Use {
    let mut u = Use::default();
    let dev = Arc::new(dev);
    if let Some(fs) = u.note("mount", mount(dev.clone())) {
        u.mounted = true;
        walk(&fs, &mut u);
        mutate(&fs, &mut u);
        drop(fs);
    }
    // fsck must survive anything too (Err only for device errors or no superblock).
    if let Err(e) = fsck_report(&*dev) {
        u.errors.push(format!("fsck: {e}"));
    }
    u
}

// ---------------------------------------------------------------------------------------
// Repairing a damaged image
// ---------------------------------------------------------------------------------------

/// A file's size and the bytes at both of its ends (the sparse file is 4 GiB long).
type Contents = (u64, Vec<u8>, Vec<u8>);

/// Every regular file reachable in the clean image, by inode: its contents.
fn manifest() -> &'static BTreeMap<u64, Contents> {
    static M: OnceLock<BTreeMap<u64, Contents>> = OnceLock::new();
    M.get_or_init(|| files_by_inode(Arc::new(images().clean.snapshot())).unwrap())
}

/// The contents of every regular file reachable from the root (a read-only mount).
fn files_by_inode(dev: Arc<MemDevice>) -> Result<BTreeMap<u64, Contents>> {
    let fs = FileSystem::mount_device(dev, &MountOptions { read_only: true, ..mount_options() })?;
    let mut files = Vec::new();
    fs.walk("/", &mut |_, a| {
        if a.kind == FileType::RegularFile {
            files.push((a.ino, a.size));
        }
    })?;
    let ends = |ino: u64, size: u64| -> Result<Contents> {
        let tail_from = size.saturating_sub(1 << 16).max(1 << 20);
        Ok((
            size,
            fs.read(ino, 0, size.min(1 << 20) as usize)?,
            fs.read(ino, tail_from, size.saturating_sub(tail_from) as usize)?,
        ))
    };
    files.into_iter().map(|(ino, size)| Ok((ino, ends(ino, size)?))).collect()
}

/// Files of the manifest whose own metadata lies in the damaged blocks: their inode, or a
/// node of their extent tree (a B+tree node names its owner). A damaged log may have held the
/// last change of any file, so for the logged image this is every file.
fn damaged_files(t: &Target) -> BTreeSet<u64> {
    let clean = &images().clean;
    let geo = ferrofs::read_superblock(clean).unwrap().geo;
    let blocks = t.block..t.block + t.blocks;
    let owners: Vec<u64> = blocks
        .clone()
        .map(|b| read_block(clean, b))
        .filter(|b| format::header_magic(b) == MAGIC_BTREE)
        .map(|b| format::header_owner(&b))
        .collect();
    let hit = |ino: &u64| t.logged || blocks.contains(&(geo.inode_offset(*ino).unwrap() / BS)) || owners.contains(ino);
    manifest().keys().copied().filter(hit).collect()
}

/// `fsck -y`, then `fsck -n` must be clean; returns the files of the manifest that are gone
/// or changed (searched by inode: a reconnected file is in /lost+found).
fn repair(dev: MemDevice) -> std::result::Result<Vec<u64>, String> {
    let fixed =
        fsck::check(&dev, &FsckOptions { repair: true }, &|_, _, _| {}).map_err(|e| format!("fsck -y failed: {e}"))?;
    if fixed.exit_code() & fsck::EXIT_UNCORRECTED != 0 {
        return Err(format!("fsck -y left errors (exit {}): {:?}", fixed.exit_code(), fixed.messages));
    }
    fsck_clean(&dev).map_err(|e| format!("after fsck -y {:?}: {e}", fixed.messages))?;
    let found = files_by_inode(Arc::new(dev)).map_err(|e| format!("reading the repaired image: {e}"))?;
    Ok(manifest().iter().filter(|(ino, data)| found.get(ino) != Some(*data)).map(|(ino, _)| *ino).collect())
}

/// The repair figures of a sweep.
#[derive(Debug, Default)]
struct RepairTally {
    damaged: usize,
    repaired_clean: usize,
    /// Files lost although none of their own blocks was damaged (must stay 0).
    lost_beyond: usize,
    /// Files lost with their own damaged inode or extent tree.
    lost_with_own_blocks: usize,
    /// Files lost with a damaged log, which a repair resets (the logged image was never
    /// checkpointed: its log holds every file).
    lost_with_log: usize,
}

// ---------------------------------------------------------------------------------------
// The sweep
// ---------------------------------------------------------------------------------------

fn env(k: &str, default: u64) -> u64 {
    std::env::var(k).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

#[test]
fn damaged_metadata_gives_clean_errors() {
    let seed = env("CORRUPT_SEED", rand::random::<u32>() as u64);
    // 30 by default: each image is also repaired and read back, which doubles a trial's cost.
    let trials = env("CORRUPT_TRIALS", 30) as usize;
    println!("CORRUPT_SEED={seed} CORRUPT_TRIALS={trials}");
    // The undamaged images themselves are fine.
    for (name, img) in [("clean", &images().clean), ("logged", &images().logged)] {
        let u = use_image(img.snapshot());
        assert!(
            u.mounted && u.errors.is_empty() && u.unclean.is_empty() && u.mutation.is_empty(),
            "the {name} image: {u:?}"
        );
    }
    let mut failures = Vec::new();
    let mut cases = 0;
    let mut mounts = 0;
    let mut tally = RepairTally::default();
    for (ti, t) in targets().into_iter().enumerate() {
        let own_damage = damaged_files(&t);
        let mut damages = vec![Damage::Zero];
        for i in 0..trials {
            damages.push(Damage::Flip { n: 1 + i % 8, reseal: false });
            damages.push(Damage::Flip { n: 1 + i % 8, reseal: true });
        }
        for (di, damage) in damages.into_iter().enumerate() {
            let case_seed = seed ^ ((ti as u64) << 32 | di as u64);
            let t2 = t.clone();
            let r = guarded(move || {
                let used = use_image(damaged(&t2, damage, &mut StdRng::seed_from_u64(case_seed)));
                (used, repair(damaged(&t2, damage, &mut StdRng::seed_from_u64(case_seed))))
            });
            cases += 1;
            let what = format!("{} ({damage:?}, case seed {case_seed})", t.name);
            match r {
                Err(e) => failures.push(format!("{what}: {e}")),
                Ok((u, repaired)) => {
                    tally.damaged += 1;
                    match repaired {
                        Err(e) => failures.push(format!("{what}: not repaired: {e}")),
                        Ok(lost) => {
                            tally.repaired_clean += 1;
                            let (with, beyond): (Vec<u64>, Vec<u64>) =
                                lost.into_iter().partition(|ino| own_damage.contains(ino));
                            *if t.logged { &mut tally.lost_with_log } else { &mut tally.lost_with_own_blocks } +=
                                with.len();
                            tally.lost_beyond += beyond.len();
                            if !beyond.is_empty() {
                                failures.push(format!(
                                    "{what}: files lost whose blocks were not damaged: inodes {beyond:?}"
                                ));
                            }
                        }
                    }
                    mounts += u.mounted as usize;
                    if !u.unclean.is_empty() {
                        failures.push(format!("{what}: errors that are not corruption or I/O errors: {:?}", u.unclean));
                    }
                    let reseal = matches!(damage, Damage::Flip { reseal: true, .. });
                    if t.redundant && !reseal && (!u.mounted || !u.errors.is_empty()) {
                        failures.push(format!(
                            "{what}: a redundant copy exists, yet: mounted {}, errors {:?}",
                            u.mounted, u.errors
                        ));
                    }
                }
            }
        }
    }
    println!("{cases} damaged images, {mounts} mounted; {} failures", failures.len());
    println!(
        "fsck -y: {} images damaged / {} repaired clean / {} files lost beyond the damaged blocks ({} lost with their own inode or extent tree, {} with a damaged log)",
        tally.damaged, tally.repaired_clean, tally.lost_beyond, tally.lost_with_own_blocks, tally.lost_with_log
    );
    assert!(failures.is_empty(), "CORRUPT_SEED={seed}: {} failures:\n{}", failures.len(), failures.join("\n"));
    assert_eq!(tally.repaired_clean, tally.damaged, "every damaged image is repaired to clean");
    assert_eq!(tally.lost_beyond, 0, "no file whose blocks were not damaged is lost");
}

/// fsck must notice damage to each kind of block (read-only, so the image is untouched).
#[test]
fn fsck_reports_zeroed_metadata() {
    let mut missed = Vec::new();
    // A log header may legitimately be garbage (a torn header write leaves the other one).
    for t in targets().into_iter().filter(|t| !t.logged && !t.name.starts_with("log header")) {
        let dev = damaged(&t, Damage::Zero, &mut StdRng::seed_from_u64(0));
        let t2 = t.clone();
        match guarded(move || fsck_report(&dev).map(|r| r.errors_found)) {
            Ok(Ok(0)) => missed.push(format!("{}: no errors found", t2.name)),
            Ok(_) => {}
            Err(e) => missed.push(format!("{}: {e}", t.name)),
        }
    }
    assert!(missed.is_empty(), "fsck missed zeroed blocks:\n{}", missed.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Failing devices
// ---------------------------------------------------------------------------------------

/// Unreadable metadata blocks: mounting and walking report errors (no panic, no hang), and
/// the image underneath, read again without the fault, is intact.
#[test]
fn unreadable_blocks_give_io_errors() {
    let mut failures = Vec::new();
    for t in targets().into_iter().filter(|t| !t.logged) {
        let base = images().clean.snapshot();
        let name = t.name.clone();
        let r = guarded(move || {
            let dev = Arc::new(FaultDevice::new(base));
            for b in t.block..t.block + t.blocks {
                dev.fail_read_block(b);
            }
            let mut u = Use::default();
            if let Some(fs) = u.note("mount", mount(dev.clone())) {
                u.mounted = true;
                walk(&fs, &mut u);
                drop(fs);
            }
            let _ = fsck_report(&*dev); // must not panic; an Err is fine
            let after = dev.inner().snapshot();
            (u, t.redundant, fsck_clean(&after))
        });
        match r {
            Err(e) => failures.push(format!("{name}: {e}")),
            Ok((u, redundant, fsck)) => {
                if !u.unclean.is_empty() {
                    failures.push(format!("{name}: errors that are not corruption or I/O errors: {:?}", u.unclean));
                }
                if !redundant && u.mounted && u.errors.is_empty() {
                    failures.push(format!("{name}: unreadable, yet mount and walk saw no error"));
                }
                if let Err(e) = fsck {
                    failures.push(format!("{name}: the image underneath is not clean afterwards: {e}"));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A workload whose every call must succeed on a healthy device; returns the first error.
fn workload(fs: &FileSystem) -> Result<()> {
    let a = fs.resolve("/a")?.ino;
    let f = fs.create(a, b"w", 0o644, CRED)?.ino;
    fs.write(f, 0, &pattern(20_000, 4))?;
    fs.fsync(f, false)?;
    fs.write(f, 100, &pattern(300, 5))?;
    fs.fsync(f, true)?;
    fs.setxattr(f, b"user.w", &[1; 600], 0)?;
    fs.rename(a, b"w", ROOT, b"w2", 0)?;
    fs.fsync(f, false)?;
    fs.unlink(a, b"small")?;
    let big = fs.resolve(BIG_DIR)?.ino;
    for i in 0..50 {
        fs.create(big, format!("more-{i}").as_bytes(), 0o644, CRED)?;
        if i % 10 == 9 {
            fs.sync()?;
        }
    }
    fs.setattr(fs.resolve(FRAG)?.ino, &SetAttr { size: Some(10 * BS), ..Default::default() })?;
    fs.sync()?;
    fs.unmount()
}

/// Checkpoint what the mount did (freeing the image's orphan) before the workload: a
/// create that reuses the orphan's inode number in the same checkpoint hits a known engine
/// bug (crash.rs, `regression_create_after_orphan_reap`), which is not what this tests.
fn settle(fs: &FileSystem) {
    fs.sync().unwrap();
}

/// Fail the n-th write of the workload (once, or every write from then on): some call must
/// report an error, and what reached the device must mount and be consistent, as after a
/// crash at that moment.
#[test]
fn failed_writes_are_reported_and_leave_a_consistent_image() {
    // How many writes the workload issues on a healthy device.
    let probe = Arc::new(FaultDevice::new(images().clean.snapshot()));
    let fs = mount(probe.clone()).unwrap();
    settle(&fs);
    let before = probe.writes();
    workload(&fs).unwrap();
    let writes = probe.writes() - before;
    drop(fs);
    let mut failures = Vec::new();
    let mut cases = 0;
    for n in 0..writes {
        for sticky in [false, true] {
            cases += 1;
            let r = guarded(move || {
                let dev = Arc::new(FaultDevice::new(images().clean.snapshot()));
                let fs = mount(dev.clone()).unwrap();
                settle(&fs);
                dev.fail_write_after(n, sticky);
                let result = workload(&fs);
                drop(fs);
                dev.clear();
                let image = dev.inner().snapshot();
                (result.map_err(|e| e.to_string()), check_remount(image))
            });
            let what = format!("write {n} of {writes} fails{}", if sticky { " (and all after it)" } else { "" });
            match r {
                Err(e) => failures.push(format!("{what}: {e}")),
                Ok((Ok(()), _)) => failures.push(format!("{what}: every call succeeded")),
                Ok((Err(_), Err(e))) => failures.push(format!("{what}: {e}")),
                Ok((Err(_), Ok(()))) => {}
            }
        }
    }
    println!("{cases} failed-write cases over {writes} writes");
    assert!(failures.is_empty(), "{} failures:\n{}", failures.len(), failures.join("\n"));
}

/// Flushes that fail: fsync and sync must say so, and the image must stay consistent.
#[test]
fn failed_flushes_are_reported() {
    let r = guarded(|| {
        let dev = Arc::new(FaultDevice::new(images().clean.snapshot()));
        let fs = mount(dev.clone()).unwrap();
        let f = fs.create(ROOT, b"f", 0o644, CRED).unwrap().ino;
        fs.write(f, 0, &pattern(5000, 1)).unwrap();
        dev.fail_flushes(true);
        let fsync = fs.fsync(f, false).map_err(|e| e.to_string());
        let sync = fs.sync().map_err(|e| e.to_string());
        let write_after = fs.write(f, 0, b"x").map(|_| ()).map_err(|e| e.to_string());
        drop(fs);
        dev.clear();
        (fsync, sync, write_after, check_remount(dev.inner().snapshot()))
    });
    let (fsync, sync, write_after, remount) = r.unwrap();
    assert!(fsync.is_err(), "fsync succeeded although the flush failed");
    assert!(sync.is_err(), "sync succeeded although the journal failed");
    assert!(write_after.is_err(), "a write after a failed log flush succeeded: the file system should have shut down");
    remount.unwrap();
}

/// Mount the image left behind (recovery and orphan processing), walk it, unmount, fsck.
fn check_remount(image: MemDevice) -> Checked {
    fsck_clean(&image).map_err(|e| format!("before recovery: {e}"))?;
    let dev = Arc::new(image);
    let fs = mount(dev.clone()).map_err(|e| format!("remount failed: {e}"))?;
    let mut u = Use::default();
    walk(&fs, &mut u);
    if !u.errors.is_empty() || !u.unclean.is_empty() {
        return Err(format!("after remount: {:?} {:?}", u.errors, u.unclean));
    }
    fs.unmount().map_err(|e| format!("unmount: {e}"))?;
    drop(fs);
    fsck_clean(&*dev).map_err(|e| format!("after remount and unmount: {e}"))
}

/// Fail the n-th write of a mount that replays a log (and processes an orphan): the mount
/// fails cleanly, and the image can still be recovered afterwards.
#[test]
fn failed_writes_during_recovery_leave_a_recoverable_image() {
    let probe = Arc::new(FaultDevice::new(images().logged.snapshot()));
    drop(mount(probe.clone()).unwrap());
    let writes = probe.writes();
    let mut failures = Vec::new();
    for n in 0..writes {
        let r = guarded(move || {
            let dev = Arc::new(FaultDevice::new(images().logged.snapshot()));
            dev.fail_write_after(n, true);
            let mounted = mount(dev.clone()).map(drop).map_err(|e| e.to_string());
            dev.clear();
            (mounted, check_remount(dev.inner().snapshot()))
        });
        match r {
            Err(e) => failures.push(format!("write {n} of {writes}: {e}")),
            Ok((_, Err(e))) => failures.push(format!("write {n} of {writes}: {e}")),
            Ok(_) => {}
        }
    }
    println!("{writes} failed-write cases during recovery");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------
// Regressions
// ---------------------------------------------------------------------------------------

/// The clean image with one field of the on-disk inode of `path` set to `value` (the inode's
/// checksum made valid again), then mounted, walked, and `path` truncated to 0.
fn with_inode_field(path: &'static str, off: usize, value: u64) -> std::result::Result<Use, String> {
    let dev = images().clean.snapshot();
    let geo = ferrofs::read_superblock(&dev).unwrap().geo;
    let at = geo.inode_offset(ino_at(&dev, path)).unwrap();
    let mut img = [0u8; INODE_SIZE];
    dev.read_at(&mut img, at).unwrap();
    format::put_u64(&mut img, off, value);
    let lsn = format::get_u64(&img, 16);
    DiskInode::seal(&mut img, lsn);
    dev.write_at(&img, at).unwrap();
    guarded(move || {
        let mut u = Use::default();
        if let Some(fs) = u.note("mount", mount(Arc::new(dev))) {
            u.mounted = true;
            walk(&fs, &mut u);
            let truncated =
                fs.resolve(path).and_then(|a| fs.setattr(a.ino, &SetAttr { size: Some(0), ..Default::default() }));
            if let Err(e) = truncated {
                u.mutation.push(format!("truncate: {e}"));
            }
        }
        u
    })
}

/// `DiskInode::decode` used to accept any `blocks` count (offset 56). Too large, and
/// getattr's `Attr::from_inode` multiplied it by 8: "attempt to multiply with overflow"
/// (fs/types.rs); too small for the file's extents, and freeing them (truncate, unlink) did
/// `nd.blocks -= len`: "attempt to subtract with overflow" (fs/data.rs, `unmap_from`). In
/// release builds both wrapped silently. An extent B+tree's blocks are not counted when the
/// inode is loaded, so /a/frag's count of 1 is found only when truncating.
#[test]
fn regression_corrupt_inode_blocks_count() {
    with_inode_field("/a/small", 56, 1 << 62).unwrap();
    with_inode_field("/a/small", 56, 0).unwrap();
    with_inode_field(FRAG, 56, 1).unwrap();
}

/// The clean image with bit `bit` of AG `agno`'s block (`inode == false`) or inode bitmap
/// cleared, the block re-sealed.
fn with_bit_cleared(inode: bool, agno: u32, bit: u64) -> MemDevice {
    let dev = images().clean.snapshot();
    let geo = ferrofs::read_superblock(&dev).unwrap().geo;
    let l = geo.ag_layout(agno);
    let blkno = if inode { l.inode_bitmap } else { l.block_bitmap };
    let mut b = read_block(&dev, blkno);
    b[HDR_SIZE + (bit / 8) as usize] &= !(1 << (bit % 8));
    let lsn = format::header_lsn(&b);
    format::seal_block(&mut b, lsn);
    dev.write_at(&b, blkno * BS).unwrap();
    dev
}

/// A data block of /a/one marked free in the on-disk bitmap, then /a/one is removed and a
/// new file written. Must not panic; the engine may report corruption.
fn block_bitmap_repro() -> std::result::Result<Vec<String>, String> {
    let clean = &images().clean;
    let geo = ferrofs::read_superblock(clean).unwrap().geo;
    let one = ino_at(clean, "/a/one");
    let Fork::Extents { ext, .. } = inode_of(clean, &geo, one).fork else {
        panic!("/a/one should have inline extents")
    };
    let agno = geo.block_ag(ext[0].pblk);
    let dev = with_bit_cleared(false, agno, ext[0].pblk - geo.ag_layout(agno).start);
    guarded(move || {
        let fs = mount(Arc::new(dev)).map_err(|e| e.to_string())?;
        let a = fs.resolve("/a").map_err(|e| e.to_string())?.ino;
        let mut errors = Vec::new();
        if let Err(e) = fs.unlink(a, b"one") {
            errors.push(format!("unlink: {e}"));
        }
        if let Err(e) = fs.write_file("/a/new", &pattern(8192, 7), CRED) {
            errors.push(format!("write: {e}"));
        }
        Ok(errors)
    })
    .and_then(|r| r)
}

/// AG 0's inode bitmap with bit `bit` cleared (0: the never-used inode 0, 1: the root),
/// then files are created in the root. Must not panic, and never hand out inode 0 or 1.
fn inode_bitmap_repro(bit: u64) -> std::result::Result<Vec<u64>, String> {
    let dev = with_bit_cleared(true, 0, bit);
    guarded(move || {
        let fs = mount(Arc::new(dev)).map_err(|e| e.to_string())?;
        let inos: Vec<u64> = (0..4)
            .filter_map(|i| fs.create(ROOT, format!("n{i}").as_bytes(), 0o644, CRED).ok())
            .map(|a| a.ino)
            .collect();
        if inos.iter().any(|&i| i <= 1) {
            return Err(format!("handed out {inos:?}"));
        }
        Ok(inos)
    })
    .and_then(|r| r)
}

/// Ag::load trusts the block bitmap: a data block marked free (with a valid checksum) used
/// to be freed again when its file went: a debug assertion fired (ag.rs, "on-disk bit N
/// already false"); in release builds the allocator could then hand the block out twice.
/// The commit that frees it reports corruption and the file system shuts down instead.
#[test]
fn regression_block_bitmap_bit_cleared() {
    let errors = block_bitmap_repro().unwrap();
    assert!(
        errors.first().is_some_and(|e| e.starts_with("unlink: corrupt block bitmap")),
        "the double free went unnoticed: {errors:?}"
    );
}

/// An inode bitmap that marks inode 0 (never used) or the root free: create used to hand
/// out inode 0 ("mkfs marks inode 0 used" debug assertion in trans.rs; "no inode" in
/// release) or the root's number (its cached inode was replaced: "allocated while cached").
/// The allocator must treat both as used whatever the bitmap says.
#[test]
fn regression_inode_bitmap_reserved_inodes() {
    inode_bitmap_repro(0).unwrap();
    inode_bitmap_repro(1).unwrap();
}

/// A read-only mount finishes orphans in memory; one whose orphan cannot be processed (its
/// extent B+tree root is zeroed) must still mount, showing the orphan as it is on disk, so
/// that the rest of the image can be copied off. A read-write mount refuses the image.
#[test]
fn read_only_mount_of_an_orphan_it_cannot_process() {
    let img = images();
    let geo = ferrofs::read_superblock(&img.clean).unwrap().geo;
    let Fork::Btree(oroot) = inode_of(&img.clean, &geo, img.orphan).fork else { panic!("the orphan has no B+tree") };
    let dev = img.clean.snapshot();
    dev.write_at(&vec![0u8; BLOCK_SIZE], oroot * BS).unwrap();
    let rw = guarded({
        let dev = dev.snapshot();
        move || mount(Arc::new(dev)).map(drop).map_err(|e| e.to_string())
    });
    assert!(matches!(rw, Ok(Err(_))), "a read-write mount processed an orphan with a zeroed tree root: {rw:?}");
    let ro = guarded(move || {
        let fs = FileSystem::mount_device(Arc::new(dev), &MountOptions { read_only: true, ..mount_options() })
            .map_err(|e| format!("read-only mount: {e}"))?;
        let small = fs.resolve("/a/small").map_err(|e| format!("/a/small: {e}"))?;
        let data = fs.read(small.ino, 0, 100).map_err(|e| format!("reading /a/small: {e}"))?;
        match fs.create(ROOT, b"new", 0o644, CRED) {
            Err(Error::ReadOnly) => Ok(data.len()),
            other => Err(format!("create on a read-only mount: {other:?}")),
        }
    });
    assert_eq!(ro, Ok(Ok(100)));
}

/// The clean image with log header slot `slot` replaced by `h` (a valid checksum) and the
/// other slot kept or zeroed.
fn with_log_header(slot: u64, h: format::log::LogHeader, keep_other: bool) -> MemDevice {
    let dev = images().clean.snapshot();
    let log = ferrofs::read_superblock(&dev).unwrap().geo.ag_layout(0).log;
    dev.write_at(&h.encode(log + slot)[..], (log + slot) * BS).unwrap();
    if !keep_other {
        dev.write_at(&vec![0u8; BLOCK_SIZE], (log + 1 - slot) * BS).unwrap();
    }
    dev
}

/// The damage of `CORRUPT_SEED=3199274852` ("log header 0", six re-sealed flips): slot 0 of the
/// cleanly unmounted image became `{gen 14082, epoch 2, tail_off 9, tail_seq 1}`. Its tail
/// named no record, so recovery wrapped to ring offset 0 and found record 1 of the epoch there
/// (long checkpointed), replayed it over newer home blocks and stopped: 500 files of /big were
/// lost. Now a record is looked for at offset 0 only if it could not have fit at the tail, and
/// a header that cannot follow the other slot's (gen not one past it, tail behind it) is
/// corruption: mount refuses, and `fsck -y` resets the (empty) log, losing nothing.
#[test]
fn regression_log_header_with_a_stale_tail() {
    use format::log::LogHeader;
    let hostile = LogHeader { gen: 14082, epoch: 2, tail_off: 9, tail_seq: 1 };
    // The other slot intact: the pair is contradictory.
    let dev = with_log_header(0, hostile, true);
    let mounted = guarded({
        let dev = dev.snapshot();
        move || mount(Arc::new(dev)).map(drop)
    });
    assert!(
        matches!(mounted, Ok(Err(Error::Corrupt { what: "log header", .. }))),
        "a log header that cannot follow the other one was believed: {mounted:?}"
    );
    assert_eq!(repair(dev), Ok(vec![]), "files lost by repairing a contradictory log header");
    // Alone (the other slot torn), it is believed, but no record before the tail replays.
    let dev = Arc::new(with_log_header(0, hostile, false));
    let fs = mount(dev.clone()).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&*dev).unwrap();
    assert!(files_by_inode(dev).unwrap() == *manifest(), "files lost by replaying a stale record");
}

/// A header in the slot of the other parity was not written by us: it is ignored as a torn
/// one would be, and the other slot's header (gen 3) is used.
#[test]
fn log_header_in_the_wrong_slot_is_ignored() {
    use format::log::LogHeader;
    let dev = with_log_header(0, LogHeader { gen: 14083, epoch: 2, tail_off: 9, tail_seq: 1 }, true);
    let geo = ferrofs::read_superblock(&dev).unwrap().geo;
    let used = ferrofs::journal::recover(&dev.snapshot(), &geo, false).unwrap().header;
    assert_eq!(used.gen, 4, "recovery did not start from slot 1's header: {used:?}");
    let dev = Arc::new(dev);
    let fs = mount(dev.clone()).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&*dev).unwrap();
    assert!(files_by_inode(dev).unwrap() == *manifest(), "files lost by believing a misplaced header");
}

/// A consistent pair of log headers whose tail names a record of an older lap of the ring: one
/// that an earlier mount wrote, in that mount's epoch (so every record on the walk checks:
/// magic, crc, seq, epoch). The walk replays that lap up to where the next mount's records
/// begin, and would write its images over the newer ones that mount left home. Each home copy
/// carries the lsn of the record whose image it is: a home newer than the walk's head shows the
/// tail to be stale, and mount refuses (fsck resets the log) rather than roll anything back.
#[test]
fn consistent_log_headers_with_a_tail_in_an_older_lap() {
    use format::log::{record_head, LogHeader};
    const LOG_BLOCKS: u64 = 64;
    let dev = Arc::new(MemDevice::new(IMAGE_SIZE));
    FileSystem::mkfs(&*dev, &MkfsOptions { log_blocks: Some(LOG_BLOCKS), ..MkfsOptions::default() }).unwrap();
    let mut cfg = JournalConfig::for_log(LOG_BLOCKS - 2);
    cfg.background = false;
    let opts = MountOptions { read_only: false, journal: Some(cfg), ..MountOptions::default() };
    let name = |i: u32| format!("entry-{i:03}");
    // Two mounts (two epochs) of records of varied sizes; the second overwrites part of the
    // first's lap.
    let fs = FileSystem::mount_device(dev.clone(), &opts).unwrap();
    let dir = fs.mkdir(ROOT, b"d", 0o755, CRED).unwrap().ino;
    for i in 0..300 {
        fs.create(dir, name(i).as_bytes(), 0o644, CRED).unwrap();
        if i % 7 == 0 {
            fs.sync().unwrap();
        }
    }
    fs.unmount().unwrap();
    drop(fs);
    let fs = FileSystem::mount_device(dev.clone(), &opts).unwrap();
    for i in 0..100 {
        fs.unlink(dir, name(i).as_bytes()).unwrap();
        if i % 9 == 0 {
            fs.sync().unwrap();
        }
    }
    fs.unmount().unwrap();
    drop(fs);
    let geo = ferrofs::read_superblock(&*dev).unwrap().geo;
    let (log, ring) = (geo.ag_layout(0).log, LOG_BLOCKS - 2);
    let epoch = journal::recover(&dev.snapshot(), &geo, false).unwrap().header.epoch - 1;
    let with_tail = |tail_off: u64, tail_seq: u64, epoch: u64| {
        let img = dev.snapshot();
        for gen in [1000, 1001] {
            let h = LogHeader { gen, epoch, tail_off, tail_seq };
            img.write_at(&h.encode(log + (gen & 1))[..], (log + (gen & 1)) * BS).unwrap();
        }
        img
    };
    // A record of the first mount's lap that the second mount did not overwrite.
    let (tail_off, tail_seq, old_epoch) = (0..ring)
        .filter_map(|off| record_head(&read_block(&dev, log + 2 + off), ring - off).map(|h| (off, h)))
        .find(|(_, h)| h.epoch + 1 == epoch)
        .map(|(off, h)| (off, h.seq, h.epoch))
        .expect("no record of the first mount left in the ring");
    let hostile = Arc::new(with_tail(tail_off, tail_seq, old_epoch));
    let stale = journal::recover(&hostile.snapshot(), &geo, false);
    assert!(
        matches!(stale, Err(Error::Corrupt { .. })),
        "records of an older lap replayed over newer home blocks: {stale:?}"
    );
    let mounted = guarded({
        let (dev, opts) = (hostile.clone(), opts.clone());
        move || FileSystem::mount_device(dev, &opts).map(|fs| fs.unmount())
    });
    assert!(matches!(mounted, Ok(Err(Error::Corrupt { .. }))), "a log tail in an older lap was believed: {mounted:?}");
    // fsck -y resets the (empty) log: every file is there.
    let report = fsck::check(&*hostile, &FsckOptions { repair: true }, &|_, _, _| {}).unwrap();
    assert!(report.errors_found > 0, "{report:?}");
    fsck_clean(&*hostile).unwrap();
    let fs = FileSystem::mount_device(hostile.clone(), &opts).unwrap();
    let names: Vec<_> = readdir(&fs, dir).unwrap().into_iter().map(|e| e.name).collect();
    assert_eq!(names.len(), 2 + 200, "{names:?}");
    // The reset log goes on from the sequences left in the ring, so a crash now replays over
    // homes those stamped (restarted at 1, every record would be older than its home).
    fs.unlink(dir, name(100).as_bytes()).unwrap();
    fs.sync().unwrap();
    let crashed = Arc::new(hostile.snapshot());
    drop(fs);
    let fs = FileSystem::mount_device(crashed, &opts).unwrap();
    assert_eq!(readdir(&fs, dir).unwrap().len(), 2 + 199, "the change made after the reset was not replayed");
}

/// A log header whose counters are at the end of their range cannot be followed by the next
/// header write (or, for `tail_seq`, by a ring of records): it was not written by us, and is
/// refused like a torn one, where advancing it would overflow.
#[test]
fn log_header_counters_at_their_end_are_not_trusted() {
    use format::log::LogHeader;
    for (slot, h) in [
        (1, LogHeader { gen: u64::MAX, epoch: 2, tail_off: 0, tail_seq: 1 }),
        (0, LogHeader { gen: u64::MAX - 1, epoch: u64::MAX, tail_off: 0, tail_seq: 1 }),
        (0, LogHeader { gen: 8, epoch: 2, tail_off: 0, tail_seq: u64::MAX }),
    ] {
        let dev = with_log_header(slot, h, false);
        let mounted = guarded(move || mount(Arc::new(dev)).map(drop));
        assert!(matches!(mounted, Ok(Err(Error::Corrupt { what: "log header", .. }))), "{h:?}: {mounted:?}");
    }
}

/// An image whose log an older fsck reset, as it did then: both headers in a new epoch at
/// sequence 1, ring block 0 zeroed. Its homes keep the lsns of the sequence before, so the
/// records that follow are numbered below them (`older_reset_image`).
fn older_reset_image() -> (MemDevice, u64) {
    use format::log::LogHeader;
    let dev = Arc::new(MemDevice::new(IMAGE_SIZE));
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    let fs = mount(dev.clone()).unwrap();
    let dir = fs.mkdir(ROOT, b"d", 0o755, CRED).unwrap().ino;
    for i in 0..60u32 {
        let f = fs.create(dir, format!("f{i:02}").as_bytes(), 0o644, CRED).unwrap().ino;
        fs.write(f, 0, &pattern(5000, i as u8)).unwrap();
        fs.sync().unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    let dev = Arc::try_unwrap(dev).ok().unwrap();
    let geo = ferrofs::read_superblock(&dev).unwrap().geo;
    let log = geo.ag_layout(0).log;
    let epoch = (0..2).map(|slot| format::get_u64(&read_block(&dev, log + slot), 40)).max().unwrap();
    for gen in 0..2 {
        let h = LogHeader { gen, epoch: epoch + 1, tail_off: 0, tail_seq: 1 };
        dev.write_at(&h.encode(log + gen)[..], (log + gen) * BS).unwrap();
    }
    dev.write_at(&vec![0u8; BLOCK_SIZE], (log + 2) * BS).unwrap();
    (dev, dir)
}

/// After an older fsck's reset, a crash that leaves records for blocks and inodes whose
/// homes carry lsns of the sequence before: the ring holds no record of the current epoch
/// that new, so the homes are older than the records, which replay whole, at mount and
/// under `fsck -y` alike; the sequence then goes on past those homes. Before, mount refused
/// (a tail in an older lap) and `fsck -y` reset the log, losing the files made after the
/// reset. fsck also finds the sequence behind the homes before any crash, and moves it on.
#[test]
fn a_crash_after_a_log_reset_by_an_older_fsck_loses_nothing() {
    let (reset, dir) = older_reset_image();
    // Changes to the directory, its tree and its files, all stamped in the old sequence.
    let crashed = {
        let dev = Arc::new(reset.snapshot());
        let fs = mount(dev.clone()).unwrap();
        for i in 0..20u32 {
            let f = fs.lookup(dir, format!("f{i:02}").as_bytes()).unwrap().ino;
            fs.write(f, 0, &pattern(100, 100 + i as u8)).unwrap();
            fs.create(dir, format!("new{i:02}").as_bytes(), 0o644, CRED).unwrap();
            fs.unlink(dir, format!("f{:02}", 59 - i).as_bytes()).unwrap();
        }
        fs.sync().unwrap();
        let crashed = dev.snapshot();
        drop(fs);
        crashed
    };
    let geo = ferrofs::read_superblock(&crashed).unwrap().geo;
    let report = journal::recover(&crashed.snapshot(), &geo, false).unwrap();
    assert!(report.records > 0, "the crash left nothing to replay");
    let holds_every_change = |dev: Arc<MemDevice>| {
        let fs = mount(dev).unwrap();
        let mut names: Vec<_> = readdir(&fs, dir).unwrap().into_iter().map(|e| e.name).collect();
        names.sort();
        let mut expected: Vec<Vec<u8>> = [&b"."[..], b".."].map(|n| n.to_vec()).into();
        expected.extend((0..40).map(|i| format!("f{i:02}").into_bytes()));
        expected.extend((0..20).map(|i| format!("new{i:02}").into_bytes()));
        expected.sort();
        assert_eq!(names, expected, "the entries made after the reset");
        for i in 0..40u32 {
            let f = fs.lookup(dir, format!("f{i:02}").as_bytes()).unwrap().ino;
            let mut want = pattern(5000, i as u8);
            if i < 20 {
                want[..100].copy_from_slice(&pattern(100, 100 + i as u8));
            }
            assert!(fs.read(f, 0, 5000).unwrap() == want, "f{i:02} lost its contents");
        }
        fs.unmount().unwrap();
    };
    // Mount replays it.
    let mounted = Arc::new(crashed.snapshot());
    holds_every_change(mounted.clone());
    // The homes not in the walk still carry the old sequence: fsck moves the log past them.
    let r = fsck::check(&*mounted, &FsckOptions { repair: true }, &|_, _, _| {}).unwrap();
    assert!(r.messages.iter().all(|m| m.starts_with("log: its sequence goes on")), "{:?}", r.messages);
    fsck_clean(&*mounted).unwrap();
    holds_every_change(mounted);
    // fsck -y replays it too.
    let repaired = Arc::new(crashed.snapshot());
    let r = fsck::check(&*repaired, &FsckOptions { repair: true }, &|_, _, _| {}).unwrap();
    assert_eq!(r.log_records_replayed, report.records, "{:?}", r.messages);
    fsck_clean(&*repaired).unwrap();
    holds_every_change(repaired);
    // Before any crash, fsck finds the sequence behind the homes; once moved on, a crash
    // replays with no home ahead of the log.
    let r = fsck_report(&reset).unwrap();
    assert!(r.messages.iter().any(|m| m.starts_with("log: its sequence goes on")), "{:?}", r.messages);
    fsck::check(&reset, &FsckOptions { repair: true }, &|_, _, _| {}).unwrap();
    fsck_clean(&reset).unwrap();
    let header = journal::recover(&reset.snapshot(), &geo, false).unwrap().header;
    assert!(header.tail_seq > 60, "the sequence was not moved past the homes: {header:?}");
}
