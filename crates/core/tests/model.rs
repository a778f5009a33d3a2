//! Model-based test: random sequences of API operations run against ferrofs on a MemDevice
//! and against a small in-memory reference model written from POSIX/Linux semantics. Every
//! result is compared (values, and errors by errno), and after every step the whole visible
//! state is compared too: the tree (readdir, lookup of ".."), attributes, file bytes,
//! symlink targets and xattrs; across a remount, every attribute must come back exactly. fsck
//! must find nothing after every unmount and on every crash image. A case ends by deleting
//! everything and checking that the free block and inode counts are back to those of a
//! fresh file system (no leaks), before and after a remount.
//!
//! Where POSIX allows several errors for one call (two conditions hold at once, e.g. link(2)
//! of a directory to a name that exists: EPERM and EEXIST), the model accepts any of them.
//!
//! Engine bugs found so far are kept as `regression_*` tests: the sequence that found each,
//! run exactly.
//!
//! `PROPTEST_CASES` overrides the number of cases (default: [`DEFAULT_CASES`]).

use ferrofs::dev::{BlockDevice, MemDevice};
use ferrofs::format::XATTR_VALUE_MAX;
use ferrofs::journal::JournalConfig;
use ferrofs::xattr::{XATTR_CREATE, XATTR_REPLACE};
use ferrofs::*;
use proptest::prelude::*;
use proptest::sample::select;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::result::Result;
use std::sync::{Arc, OnceLock};

const DEFAULT_CASES: u32 = 5000;
const ROOT_INO: u64 = 1;
const CRED: Cred = Cred { uid: 1000, gid: 1000, umask: 0 };
const DEV_SIZE: u64 = 64 << 20;
const PAGE: u64 = 4096;
/// The largest file size ferrofs supports (2^44 blocks).
const MAX_BYTES: u64 = 1 << 56;

// ---------------------------------------------------------------------------------------
// Operations
// ---------------------------------------------------------------------------------------

/// Directory paths the operations name (resolved by lookups from the root, "." and ".."
/// included, symlinks not followed). A handful of names at two levels make operations collide.
const DIRS: &[&str] = &["/", "/", "/a", "/b", "/a/b", "/b/a", "/a/b/c", "/a/..", "/b/a/..", "/a/."];
const NAMES: &[&str] = &["a", "b", "c", "d"];
const XATTR_NAMES: &[&str] = &["user.a", "user.b", "trusted.a-much-longer-attribute-name-0123"];
const XATTR_LENS: &[usize] = &[0, 5, 40, 255, 256, 1024, 1025, 9000, 65536, 65537];
const OFFSETS: &[u64] = &[
    0,
    0,
    1,
    100,
    4095,
    4096,
    4097,
    8192,
    12000,
    65536,
    1 << 20,
    (1 << 20) + 4000,
    (1 << 30) + 1,
    (1 << 40) - 7,
    MAX_BYTES - 1,
    u64::MAX - 1,
];
const WRITE_LENS: &[usize] = &[1, 10, 511, 4096, 4097, 9000, 40000];
const READ_LENS: &[usize] = &[0, 1, 100, 4096, 10000, 70000];
const SIZES: &[u64] = &[0, 0, 1, 100, 4095, 4096, 5000, 8192, 70000, 1 << 20, (1 << 30) + 3, MAX_BYTES, MAX_BYTES + 1];
const FALLOC_LENS: &[u64] = &[0, 1, 100, 4096, 8192, 9000, 70000, 1 << 20];
/// Mode 0, KEEP_SIZE, punch hole, zero range with and without KEEP_SIZE, collapse and insert
/// range; punch hole without KEEP_SIZE (ferrofs refuses it) and collapse with KEEP_SIZE
/// (EINVAL).
const FALLOC_MODES: &[u32] = &[
    0,
    FALLOC_FL_KEEP_SIZE,
    FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
    FALLOC_FL_PUNCH_HOLE,
    FALLOC_FL_ZERO_RANGE,
    FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
    FALLOC_FL_COLLAPSE_RANGE,
    FALLOC_FL_INSERT_RANGE,
    // Twice as often: they succeed only with whole blocks inside the file.
    FALLOC_FL_COLLAPSE_RANGE,
    FALLOC_FL_INSERT_RANGE,
    FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_KEEP_SIZE,
];
const SYMLINK_LENS: &[usize] = &[1, 10, 64, 65, 300, 4095, 4096];
const PERMS: &[u16] = &[0o644, 0o600, 0o4755, 0o2775, 0o1777, 0];
const IDS: &[u32] = &[0, 1000, 4242];

/// A directory an operation works in: a fixed path, the k-th directory of the current tree
/// (depth first, root first), or an open handle (index modulo the open handles). Indices are
/// taken modulo what exists, so most steps hit something real; a step whose reference
/// names nothing (no handle open) is skipped.
#[derive(Clone, Copy, Debug)]
enum Dir {
    D(&'static str),
    Nth(usize),
    DH(usize),
}

/// What an operation names: `In(dir, name)` (which may or may not exist), the k-th existing
/// entry of the current tree, or (for operations on an object, not a name) an open handle.
#[derive(Clone, Copy, Debug)]
enum Ent {
    In(Dir, &'static str),
    Any(usize),
    H(usize),
}

#[derive(Clone, Debug)]
enum Op {
    Create {
        at: Ent,
    },
    Mkdir {
        at: Ent,
    },
    /// A FIFO, or a character device when `chr`.
    Mknod {
        at: Ent,
        chr: bool,
    },
    Symlink {
        at: Ent,
        len: usize,
    },
    Unlink {
        at: Ent,
    },
    Rmdir {
        at: Ent,
    },
    Rename {
        from: Ent,
        to: Ent,
        flags: u32,
    },
    Link {
        obj: Ent,
        to: Ent,
    },
    Write {
        obj: Ent,
        off: u64,
        len: usize,
        seed: u8,
    },
    Truncate {
        obj: Ent,
        size: u64,
    },
    Fallocate {
        obj: Ent,
        off: u64,
        len: u64,
        mode: u32,
    },
    Read {
        obj: Ent,
        off: u64,
        len: usize,
    },
    Readlink {
        obj: Ent,
    },
    Chmod {
        obj: Ent,
        perm: u16,
    },
    Chown {
        obj: Ent,
        uid: u32,
        gid: u32,
    },
    SetXattr {
        obj: Ent,
        name: &'static str,
        len: usize,
        seed: u8,
        flags: u32,
    },
    GetXattr {
        obj: Ent,
        name: &'static str,
    },
    RemoveXattr {
        obj: Ent,
        name: &'static str,
    },
    Fsync {
        obj: Ent,
        datasync: bool,
    },
    Open {
        obj: Ent,
    },
    Release {
        h: usize,
    },
    Sync,
    /// Unmount and mount again; open handles are dropped (unlinked inodes freed at mount).
    Remount,
    /// sync, then mount a snapshot of the device taken while still mounted: log recovery and
    /// orphan processing must bring back exactly the synced state.
    CrashAfterSync,
    /// Write one byte into every other block of the first `2n` blocks: `n` extents (a
    /// multi-level extent B+tree; freeing or truncating it takes several transactions).
    Fragment {
        obj: Ent,
        n: u64,
    },
    /// Create `n` extra entries "p000".. in a directory (multi-level directory B+tree).
    Populate {
        dir: Dir,
        n: usize,
    },
    /// Unlink every "p..." entry of a directory.
    Depopulate {
        dir: Dir,
    },
}
use Dir::*;
use Ent::*;
use Op::*;

fn dir_s() -> impl Strategy<Value = Dir> {
    prop_oneof![4 => select(DIRS).prop_map(D), 5 => (0..32usize).prop_map(Nth), 2 => (0..4usize).prop_map(DH)]
}

/// A name to create: mostly a fixed name in some directory.
fn new_s() -> impl Strategy<Value = Ent> {
    prop_oneof![8 => (dir_s(), select(NAMES)).prop_map(|(d, n)| In(d, n)), 1 => (0..64usize).prop_map(Any)]
}

/// A name to remove or rename: mostly an existing entry.
fn old_s() -> impl Strategy<Value = Ent> {
    prop_oneof![3 => (dir_s(), select(NAMES)).prop_map(|(d, n)| In(d, n)), 6 => (0..64usize).prop_map(Any)]
}

/// A rename or link target: a name (new or existing) or an existing entry.
fn to_s() -> impl Strategy<Value = Ent> {
    prop_oneof![5 => (dir_s(), select(NAMES)).prop_map(|(d, n)| In(d, n)), 4 => (0..64usize).prop_map(Any)]
}

/// An object to work on: an existing entry, a name, or an open handle.
fn obj_s() -> impl Strategy<Value = Ent> {
    prop_oneof![6 => (0..64usize).prop_map(Any), 2 => (dir_s(), select(NAMES)).prop_map(|(d, n)| In(d, n)), 3 => (0..4usize).prop_map(H)]
}

fn op_s() -> impl Strategy<Value = Op> {
    let flags = select(&[0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE, RENAME_NOREPLACE | RENAME_EXCHANGE][..]);
    let xflags = select(&[0, 0, XATTR_CREATE, XATTR_REPLACE][..]);
    prop_oneof![
        6 => new_s().prop_map(|at| Create { at }),
        5 => new_s().prop_map(|at| Mkdir { at }),
        1 => (new_s(), any::<bool>()).prop_map(|(at, chr)| Mknod { at, chr }),
        2 => (new_s(), select(SYMLINK_LENS)).prop_map(|(at, len)| Symlink { at, len }),
        3 => old_s().prop_map(|at| Unlink { at }),
        3 => old_s().prop_map(|at| Rmdir { at }),
        8 => (old_s(), to_s(), flags).prop_map(|(from, to, flags)| Rename { from, to, flags }),
        3 => (obj_s(), to_s()).prop_map(|(obj, to)| Link { obj, to }),
        7 => (obj_s(), select(OFFSETS), select(WRITE_LENS), any::<u8>()).prop_map(|(obj, off, len, seed)| Write { obj, off, len, seed }),
        3 => (obj_s(), select(SIZES)).prop_map(|(obj, size)| Truncate { obj, size }),
        3 => (obj_s(), select(OFFSETS), select(FALLOC_LENS), select(FALLOC_MODES)).prop_map(|(obj, off, len, mode)| Fallocate { obj, off, len, mode }),
        3 => (obj_s(), select(OFFSETS), select(READ_LENS)).prop_map(|(obj, off, len)| Read { obj, off, len }),
        1 => obj_s().prop_map(|obj| Readlink { obj }),
        1 => (obj_s(), select(PERMS)).prop_map(|(obj, perm)| Chmod { obj, perm }),
        1 => (obj_s(), select(IDS), select(IDS)).prop_map(|(obj, uid, gid)| Chown { obj, uid, gid }),
        1 => (obj_s(), select(&[100u64, 300, 600][..])).prop_map(|(obj, n)| Fragment { obj, n }),
        3 => (obj_s(), select(XATTR_NAMES), select(XATTR_LENS), any::<u8>(), xflags).prop_map(|(obj, name, len, seed, flags)| SetXattr { obj, name, len, seed, flags }),
        1 => (obj_s(), select(XATTR_NAMES)).prop_map(|(obj, name)| GetXattr { obj, name }),
        2 => (obj_s(), select(XATTR_NAMES)).prop_map(|(obj, name)| RemoveXattr { obj, name }),
        2 => (obj_s(), any::<bool>()).prop_map(|(obj, datasync)| Fsync { obj, datasync }),
        4 => obj_s().prop_map(|obj| Open { obj }),
        3 => (0..4usize).prop_map(|h| Release { h }),
        1 => Just(Sync),
        1 => Just(Remount),
        1 => Just(CrashAfterSync),
        1 => (dir_s(), select(&[40usize, 200, 400][..])).prop_map(|(dir, n)| Populate { dir, n }),
        1 => dir_s().prop_map(|dir| Depopulate { dir }),
    ]
}

/// Deterministic non-zero-ish bytes for writes, xattr values and symlink targets.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

fn symlink_target(len: usize) -> Vec<u8> {
    (0..len).map(|i| b"abcdefghijklmnopqrstuvwxyz/"[i % 27]).collect()
}

// ---------------------------------------------------------------------------------------
// The reference model
// ---------------------------------------------------------------------------------------

/// Errnos the model accepts for a failing call (all conditions that hold; never empty).
type Errs = Vec<i32>;
type Mid = usize;
const ROOT: Mid = 0;

/// Sparse file contents in 4 KiB pages. `touched` remembers every page ever written, so the
/// state check also reads regions that a shrinking truncate must have zeroed. `alloc` holds
/// the pages fallocate allocated (they read as zeros until written; a file owns the union
/// of `pages` and `alloc`).
#[derive(Clone, Debug, Default)]
struct Bytes {
    size: u64,
    pages: BTreeMap<u64, Box<[u8; PAGE as usize]>>,
    touched: BTreeSet<u64>,
    alloc: BTreeSet<u64>,
}

impl Bytes {
    fn write(&mut self, off: u64, data: &[u8]) {
        let (mut pos, mut rest) = (off, data);
        while !rest.is_empty() {
            let (pg, at) = (pos / PAGE, (pos % PAGE) as usize);
            let n = rest.len().min(PAGE as usize - at);
            self.pages.entry(pg).or_insert_with(|| Box::new([0; PAGE as usize]))[at..at + n]
                .copy_from_slice(&rest[..n]);
            self.touched.insert(pg);
            pos += n as u64;
            rest = &rest[n..];
        }
        self.size = self.size.max(off + data.len() as u64);
    }

    fn truncate(&mut self, size: u64) {
        // As on ext4 and XFS: only a truncate that does not grow the file drops the
        // preallocated pages past the new end.
        if size <= self.size {
            self.alloc.split_off(&size.div_ceil(PAGE));
        }
        if size < self.size {
            self.pages.split_off(&size.div_ceil(PAGE));
            if let Some(p) = self.pages.get_mut(&(size / PAGE)) {
                p[(size % PAGE) as usize..].fill(0);
            }
        }
        self.size = size;
    }

    /// fallocate: allocate the unallocated pages of `[off, end)`; grow the size unless `keep`.
    fn fallocate(&mut self, off: u64, end: u64, keep: bool) {
        for pg in off / PAGE..end.div_ceil(PAGE) {
            if !self.pages.contains_key(&pg) {
                self.alloc.insert(pg);
            }
            self.touched.insert(pg);
        }
        if !keep {
            self.size = self.size.max(end);
        }
    }

    /// Punch a hole: whole pages go, the bytes of partial ones are zeroed; the size stays.
    fn punch(&mut self, off: u64, end: u64) {
        for pg in off.div_ceil(PAGE)..end / PAGE {
            self.pages.remove(&pg);
            self.alloc.remove(&pg);
        }
        for pg in [off / PAGE, (end - 1) / PAGE] {
            if let Some(p) = self.pages.get_mut(&pg) {
                let (lo, hi) = (off.max(pg * PAGE), end.min((pg + 1) * PAGE));
                if lo < hi {
                    p[(lo - pg * PAGE) as usize..(hi - pg * PAGE) as usize].fill(0);
                }
            }
        }
    }

    /// COLLAPSE_RANGE (`insert` false) or INSERT_RANGE of whole pages `[off, off + len)`:
    /// the range goes and the pages after it move left, or the pages from `off` on move
    /// right, leaving a hole. The size follows.
    fn shift(&mut self, off: u64, len: u64, insert: bool) {
        let (at, by) = (off / PAGE, len / PAGE);
        let moved = |pg: u64| match (insert, pg >= at) {
            (_, false) => Some(pg),
            (true, true) => Some(pg + by),
            (false, true) => pg.checked_sub(by).filter(|&to| to >= at),
        };
        self.pages = std::mem::take(&mut self.pages).into_iter().filter_map(|(pg, p)| Some((moved(pg)?, p))).collect();
        self.alloc = self.alloc.iter().filter_map(|&pg| moved(pg)).collect();
        // The old places stay touched: the state check reads them too.
        let touched: Vec<u64> = self.touched.iter().filter_map(|&pg| moved(pg)).collect();
        self.touched.extend(touched);
        self.size = if insert { self.size + len } else { self.size - len };
    }

    /// Pages the file owns blocks for.
    fn blocks(&self) -> u64 {
        self.pages.len() as u64 + self.alloc.iter().filter(|p| !self.pages.contains_key(p)).count() as u64
    }

    fn read(&self, off: u64, len: usize) -> Vec<u8> {
        if off >= self.size {
            return Vec::new();
        }
        let end = (off + len as u64).min(self.size);
        let mut out = vec![0u8; (end - off) as usize];
        for (&pg, data) in self.pages.range(off / PAGE..end.div_ceil(PAGE)) {
            let (lo, hi) = ((pg * PAGE).max(off), ((pg + 1) * PAGE).min(end));
            out[(lo - off) as usize..(hi - off) as usize]
                .copy_from_slice(&data[(lo - pg * PAGE) as usize..(hi - pg * PAGE) as usize]);
        }
        out
    }

    /// Ranges worth comparing: the start, every run of touched pages (gaps of up to 16
    /// pages bridged) with a byte either side, and the region around EOF.
    fn probes(&self) -> Vec<(u64, usize)> {
        let mut out = vec![(0, 9000), (self.size.saturating_sub(5000), 5010)];
        let mut pages = self.touched.iter().copied().peekable();
        while let Some(first) = pages.next() {
            let mut last = first;
            while pages.peek().is_some_and(|&p| p <= last + 16) {
                last = pages.next().unwrap();
            }
            out.push(((first * PAGE).saturating_sub(1), ((last - first + 1) * PAGE + 2) as usize));
        }
        out
    }
}

#[derive(Clone, Debug)]
struct Node {
    /// The ferrofs inode number (known once ferrofs created the node).
    ino: u64,
    kind: FileType,
    perm: u16,
    uid: u32,
    gid: u32,
    rdev: u64,
    /// Names pointing here; a directory has 1 while linked and 0 after rmdir.
    links: u32,
    open: u32,
    /// Directories: the parent (".."); the root is its own parent.
    parent: Mid,
    entries: BTreeMap<Vec<u8>, Mid>,
    data: Bytes,
    target: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    live: bool,
}

impl Node {
    fn new(kind: FileType, perm: u16, parent: Mid) -> Node {
        Node {
            ino: 0,
            kind,
            perm,
            uid: CRED.uid,
            gid: CRED.gid,
            rdev: 0,
            links: 1,
            open: 0,
            parent,
            entries: BTreeMap::new(),
            data: Bytes::default(),
            target: Vec::new(),
            xattrs: BTreeMap::new(),
            live: true,
        }
    }
    fn is_dir(&self) -> bool {
        self.kind == FileType::Directory
    }
}

#[derive(Clone, Debug)]
struct Model {
    nodes: Vec<Node>,
    /// Open handles: the node each one holds.
    handles: Vec<Mid>,
    /// Inode numbers freed since they were last handed out: getattr must say ESTALE.
    dead: BTreeSet<u64>,
}

fn fail<T>(errs: Errs) -> Result<T, Errs> {
    debug_assert!(!errs.is_empty());
    Err(errs)
}

/// `Err(errs)` if any condition collected in `errs` holds.
fn check(errs: Errs) -> Result<(), Errs> {
    if errs.is_empty() {
        Ok(())
    } else {
        Err(errs)
    }
}

impl Model {
    fn new() -> Model {
        let mut root = Node::new(FileType::Directory, 0o755, ROOT);
        root.ino = ROOT_INO;
        (root.uid, root.gid) = (0, 0);
        Model { nodes: vec![root], handles: Vec::new(), dead: BTreeSet::new() }
    }

    fn nlink(&self, m: Mid) -> u32 {
        let n = &self.nodes[m];
        match (n.is_dir(), n.links) {
            (true, 0) => 0,
            (true, _) => 2 + n.entries.values().filter(|&&c| self.nodes[c].is_dir()).count() as u32,
            (false, l) => l,
        }
    }

    fn size(&self, m: Mid) -> u64 {
        let n = &self.nodes[m];
        match n.kind {
            FileType::Directory => n.entries.len() as u64,
            FileType::Symlink => n.target.len() as u64,
            _ => n.data.size,
        }
    }

    fn lookup(&self, dir: Mid, name: &str) -> Result<Mid, i32> {
        let d = &self.nodes[dir];
        if !d.is_dir() {
            return Err(libc::ENOTDIR);
        }
        match name {
            "." => Ok(dir),
            ".." => Ok(d.parent),
            _ => d.entries.get(name.as_bytes()).copied().ok_or(libc::ENOENT),
        }
    }

    fn resolve(&self, path: &str) -> Result<Mid, i32> {
        path.split('/').filter(|c| !c.is_empty()).try_fold(ROOT, |cur, c| self.lookup(cur, c))
    }

    /// Is `m` the directory `anc` or below it?
    fn is_within(&self, mut m: Mid, anc: Mid) -> bool {
        loop {
            if m == anc {
                return true;
            }
            if m == ROOT {
                return false;
            }
            m = self.nodes[m].parent;
        }
    }

    fn dir_errs(&self, dir: Mid) -> Errs {
        let d = &self.nodes[dir];
        if !d.is_dir() {
            vec![libc::ENOTDIR]
        } else if d.links == 0 {
            vec![libc::ENOENT]
        } else {
            vec![]
        }
    }

    fn maybe_free(&mut self, m: Mid) {
        let n = &mut self.nodes[m];
        if n.live && n.links == 0 && n.open == 0 {
            n.live = false;
            self.dead.insert(n.ino);
        }
    }

    fn drop_link(&mut self, m: Mid) {
        let n = &mut self.nodes[m];
        n.links = if n.is_dir() { 0 } else { n.links - 1 };
        self.maybe_free(m);
    }

    fn make(&mut self, dir: Mid, name: &str, kind: FileType, perm: u16) -> Result<Mid, Errs> {
        let mut errs = self.dir_errs(dir);
        if self.nodes[dir].entries.contains_key(name.as_bytes()) {
            errs.push(libc::EEXIST);
        }
        check(errs)?;
        let m = self.nodes.len();
        let mut node = Node::new(kind, perm, dir);
        // A set-group-ID directory hands its group down, and its bit to subdirectories.
        if self.nodes[dir].perm & 0o2000 != 0 {
            node.gid = self.nodes[dir].gid;
            if kind == FileType::Directory {
                node.perm |= 0o2000;
            }
        }
        self.nodes.push(node);
        self.nodes[dir].entries.insert(name.as_bytes().to_vec(), m);
        Ok(m)
    }

    fn symlink(&mut self, dir: Mid, name: &str, target: &[u8]) -> Result<Mid, Errs> {
        if target.len() > 4095 {
            return fail(vec![libc::ENAMETOOLONG]);
        }
        let m = self.make(dir, name, FileType::Symlink, 0o777)?;
        self.nodes[m].target = target.to_vec();
        Ok(m)
    }

    fn remove(&mut self, dir: Mid, name: &str, want_dir: bool) -> Result<(), Errs> {
        let errs = self.dir_errs(dir);
        if errs.contains(&libc::ENOTDIR) {
            return fail(errs);
        }
        let Some(&m) = self.nodes[dir].entries.get(name.as_bytes()) else { return fail(vec![libc::ENOENT]) };
        let n = &self.nodes[m];
        match (want_dir, n.is_dir()) {
            (true, false) => return fail(vec![libc::ENOTDIR]),
            (false, true) => return fail(vec![libc::EISDIR]),
            (true, true) if !n.entries.is_empty() => return fail(vec![libc::ENOTEMPTY]),
            _ => {}
        }
        self.nodes[dir].entries.remove(name.as_bytes());
        self.drop_link(m);
        Ok(())
    }

    fn link(&mut self, m: Mid, dir: Mid, name: &str) -> Result<(), Errs> {
        let mut errs = self.dir_errs(dir);
        if self.nodes[m].is_dir() {
            errs.push(libc::EPERM);
        } else if self.nodes[m].links == 0 {
            errs.push(libc::ENOENT);
        }
        if self.nodes[dir].entries.contains_key(name.as_bytes()) {
            errs.push(libc::EEXIST);
        }
        check(errs)?;
        self.nodes[dir].entries.insert(name.as_bytes().to_vec(), m);
        self.nodes[m].links += 1;
        Ok(())
    }

    /// renameat2(2), with Linux's checks (the "trap" ancestor checks included).
    fn rename(&mut self, od: Mid, old: &str, nd: Mid, new: &str, flags: u32) -> Result<(), Errs> {
        let exchange = flags & RENAME_EXCHANGE != 0;
        if flags == RENAME_EXCHANGE | RENAME_NOREPLACE {
            return fail(vec![libc::EINVAL]);
        }
        let mut errs: Errs = [od, nd].iter().filter(|&&d| !self.nodes[d].is_dir()).map(|_| libc::ENOTDIR).collect();
        let Some(&src) = self.nodes[od].entries.get(old.as_bytes()) else {
            errs.push(libc::ENOENT);
            return fail(errs);
        };
        let dst = self.nodes[nd].entries.get(new.as_bytes()).copied();
        if flags & RENAME_NOREPLACE != 0 && dst.is_some() {
            errs.push(libc::EEXIST);
        }
        if exchange && dst.is_none() {
            errs.push(libc::ENOENT);
        }
        if dst.is_none() && self.nodes[nd].links == 0 {
            errs.push(libc::ENOENT); // the new parent was removed (may_create: IS_DEADDIR)
        }
        check(std::mem::take(&mut errs))?;
        if dst == Some(src) {
            return Ok(());
        }
        let (sdir, ddir) = (self.nodes[src].is_dir(), dst.is_some_and(|d| self.nodes[d].is_dir()));
        if sdir && self.is_within(nd, src) {
            errs.push(libc::EINVAL);
        }
        // The target is the source's old parent or above it (Linux's "trap").
        if dst.is_some_and(|d| ddir && self.is_within(od, d)) {
            errs.push(if exchange { libc::EINVAL } else { libc::ENOTEMPTY });
        }
        if let (Some(d), false) = (dst, exchange) {
            match (sdir, ddir) {
                (true, false) => errs.push(libc::ENOTDIR),
                (false, true) => errs.push(libc::EISDIR),
                (true, true) if !self.nodes[d].entries.is_empty() => errs.push(libc::ENOTEMPTY),
                _ => {}
            }
        }
        check(errs)?;
        match dst {
            Some(d) if exchange => {
                self.nodes[od].entries.insert(old.as_bytes().to_vec(), d);
                self.nodes[nd].entries.insert(new.as_bytes().to_vec(), src);
                if ddir {
                    self.nodes[d].parent = od;
                }
            }
            _ => {
                self.nodes[od].entries.remove(old.as_bytes());
                self.nodes[nd].entries.insert(new.as_bytes().to_vec(), src);
                if let Some(d) = dst {
                    self.drop_link(d);
                }
            }
        }
        if sdir {
            self.nodes[src].parent = nd;
        }
        Ok(())
    }

    /// Errors of a call that needs a regular file (write, truncate) and of its size limit:
    /// both are collected, since POSIX does not order them.
    fn regular_errs(&self, m: Mid, end: Option<u64>) -> Errs {
        let mut errs = match self.nodes[m].kind {
            FileType::Directory => vec![libc::EISDIR],
            FileType::RegularFile => vec![],
            _ => vec![libc::EINVAL],
        };
        match end {
            None => errs.extend([libc::EFBIG, libc::EINVAL]),
            Some(end) if end > MAX_BYTES => errs.push(libc::EFBIG),
            Some(_) => {}
        }
        errs
    }

    fn write(&mut self, m: Mid, off: u64, data: &[u8]) -> Result<usize, Errs> {
        if data.is_empty() {
            return Ok(0);
        }
        check(self.regular_errs(m, off.checked_add(data.len() as u64)))?;
        self.nodes[m].data.write(off, data);
        Ok(data.len())
    }

    fn truncate(&mut self, m: Mid, size: u64) -> Result<(), Errs> {
        check(self.regular_errs(m, Some(size)))?;
        self.nodes[m].data.truncate(size);
        Ok(())
    }

    fn fallocate(&mut self, m: Mid, off: u64, len: u64, mode: u32) -> Result<(), Errs> {
        let mut errs = self.regular_errs(m, off.checked_add(len));
        if len == 0 {
            errs.push(libc::EINVAL);
        }
        let keep = FALLOC_FL_KEEP_SIZE;
        let (collapse, insert) = (FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE);
        if mode & (collapse | insert) != 0 && mode != collapse && mode != insert {
            errs.push(libc::EINVAL);
        } else if ![
            0,
            keep,
            FALLOC_FL_PUNCH_HOLE | keep,
            FALLOC_FL_ZERO_RANGE,
            FALLOC_FL_ZERO_RANGE | keep,
            collapse,
            insert,
        ]
        .contains(&mode)
        {
            errs.push(libc::EOPNOTSUPP);
        }
        let data = &mut self.nodes[m].data;
        if mode == collapse || mode == insert {
            if !off.is_multiple_of(PAGE) || !len.is_multiple_of(PAGE) {
                errs.push(libc::EINVAL);
            }
            // Collapse: the range must end inside the file; insert: start inside it, and the
            // size and the last allocated page stay within the largest file.
            let last = data.alloc.last().map_or(0, |pg| (pg + 1) * PAGE);
            if mode == collapse && off.saturating_add(len) >= data.size || mode == insert && off >= data.size {
                errs.push(libc::EINVAL);
            }
            if mode == insert && (data.size.saturating_add(len) > MAX_BYTES || last.saturating_add(len) > MAX_BYTES) {
                errs.push(libc::EFBIG);
            }
            check(errs)?;
            data.shift(off, len, mode == insert);
            return Ok(());
        }
        check(errs)?;
        // ZERO_RANGE: zeros, with the space allocated.
        if mode & (FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE) != 0 {
            data.punch(off, off + len);
        }
        if mode & FALLOC_FL_PUNCH_HOLE == 0 {
            data.fallocate(off, off + len, mode & keep != 0);
        }
        Ok(())
    }

    fn setxattr(&mut self, m: Mid, name: &str, value: &[u8], flags: u32) -> Result<(), Errs> {
        if value.len() > XATTR_VALUE_MAX {
            return fail(vec![libc::E2BIG]);
        }
        let exists = self.nodes[m].xattrs.contains_key(name.as_bytes());
        if exists && flags & XATTR_CREATE != 0 {
            return fail(vec![libc::EEXIST]);
        }
        if !exists && flags & XATTR_REPLACE != 0 {
            return fail(vec![libc::ENODATA]);
        }
        self.nodes[m].xattrs.insert(name.as_bytes().to_vec(), value.to_vec());
        Ok(())
    }

    fn open(&mut self, m: Mid) {
        self.nodes[m].open += 1;
        self.handles.push(m);
    }

    fn release(&mut self, h: usize) -> Mid {
        let m = self.handles.remove(h);
        self.nodes[m].open -= 1;
        self.maybe_free(m);
        m
    }

    fn release_all(&mut self) {
        while !self.handles.is_empty() {
            self.release(0);
        }
    }

    /// The directory's extra "p..." entries (Populate/Depopulate).
    fn populated(&self, dir: Mid) -> Vec<Vec<u8>> {
        self.nodes[dir].entries.keys().filter(|k| is_populated(k)).cloned().collect()
    }

    /// Every entry of the tree (but the "p..." ones), depth first in name order.
    fn all_entries(&self) -> Vec<(Mid, Vec<u8>)> {
        let mut out = Vec::new();
        let mut stack = vec![ROOT];
        while let Some(d) = stack.pop() {
            for (name, &c) in self.nodes[d].entries.iter().rev().filter(|(k, _)| !is_populated(k)) {
                out.push((d, name.clone()));
                if self.nodes[c].is_dir() {
                    stack.push(c);
                }
            }
        }
        out
    }

    fn all_dirs(&self) -> Vec<Mid> {
        let mut out = vec![ROOT];
        out.extend(
            self.all_entries().into_iter().map(|(d, n)| self.nodes[d].entries[&n]).filter(|&c| self.nodes[c].is_dir()),
        );
        out
    }
}

fn is_populated(name: &[u8]) -> bool {
    name.len() == 4 && name[0] == b'p'
}

// ---------------------------------------------------------------------------------------
// The system under test
// ---------------------------------------------------------------------------------------

fn errno(e: Error) -> i32 {
    e.errno()
}

fn errname(e: i32) -> String {
    let names = [
        (libc::ENOENT, "ENOENT"),
        (libc::EEXIST, "EEXIST"),
        (libc::ENOTDIR, "ENOTDIR"),
        (libc::EISDIR, "EISDIR"),
        (libc::EOPNOTSUPP, "EOPNOTSUPP"),
        (libc::ENOTEMPTY, "ENOTEMPTY"),
        (libc::EINVAL, "EINVAL"),
        (libc::EPERM, "EPERM"),
        (libc::EFBIG, "EFBIG"),
        (libc::ENODATA, "ENODATA"),
        (libc::E2BIG, "E2BIG"),
        (libc::ENOSPC, "ENOSPC"),
        (libc::ERANGE, "ERANGE"),
        (libc::ESTALE, "ESTALE"),
        (libc::EIO, "EIO"),
        (libc::EUCLEAN, "EUCLEAN"),
        (libc::ENAMETOOLONG, "ENAMETOOLONG"),
    ];
    names.iter().find(|(n, _)| *n == e).map_or_else(|| format!("errno {e}"), |(_, s)| s.to_string())
}

/// The pristine image every case starts from (mkfs once, then copy).
fn template() -> &'static MemDevice {
    static T: OnceLock<MemDevice> = OnceLock::new();
    T.get_or_init(|| {
        let dev = MemDevice::new(DEV_SIZE);
        FileSystem::mkfs(&dev, &MkfsOptions::default()).unwrap();
        dev
    })
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Counts {
    bfree: u64,
    ffree: u64,
}

fn counts(fs: &FileSystem) -> Counts {
    let s = fs.statfs();
    Counts { bfree: s.bfree, ffree: s.ffree }
}

/// The offline checker (read-only; it replays a non-empty log in memory) finds nothing.
fn fsck_clean(dev: &dyn BlockDevice, when: &str) {
    let r = ferrofs::fsck::check(dev, &ferrofs::fsck::FsckOptions { repair: false }, &|_, _, _| {})
        .unwrap_or_else(|e| panic!("fsck {when} failed: {e}"));
    assert!(r.is_clean(), "fsck {when}: {} errors: {:?}", r.errors_found, r.messages);
}

struct Sut {
    dev: Arc<MemDevice>,
    fs: Option<FileSystem>,
    opts: MountOptions,
}

/// How the system under test runs its journal and caches.
#[derive(Clone, Copy, PartialEq)]
enum Setup {
    /// No background threads: checkpoints happen only when operations force them.
    Manual,
    /// Background checkpoints and writeback (a 16 KiB CIL push threshold, a 5 ms interval).
    Background,
    /// Background journal and a cache budget of a few dozen objects: inodes and blocks are
    /// dropped and read back from home all the time.
    TinyCache,
}

impl Sut {
    fn new(setup: Setup) -> Sut {
        let dev = Arc::new(template().snapshot());
        let ring = ferrofs::mkfs::plan(DEV_SIZE, &MkfsOptions::default()).unwrap().log_blocks - 2;
        let mut cfg = JournalConfig::for_log(ring);
        cfg.background = setup != Setup::Manual;
        if cfg.background {
            cfg.cil_push_bytes = 16 << 10;
            cfg.push_interval = std::time::Duration::from_millis(5);
        }
        let cache = (setup == Setup::TinyCache).then(|| ferrofs::cache::CacheBudget::new(48 << 10));
        let opts = MountOptions { read_only: false, journal: Some(cfg), cache, ..MountOptions::default() };
        let mut s = Sut { dev, fs: None, opts };
        s.mount();
        s
    }

    fn mount(&mut self) {
        let fs = FileSystem::mount_device(self.dev.clone() as Arc<dyn BlockDevice>, &self.opts)
            .unwrap_or_else(|e| panic!("mount failed: {e}"));
        self.fs = Some(fs);
    }

    fn fs(&self) -> &FileSystem {
        self.fs.as_ref().unwrap()
    }

    fn remount(&mut self) {
        let fs = self.fs.take().unwrap();
        fs.unmount().unwrap_or_else(|e| panic!("unmount failed: {e}"));
        drop(fs);
        fsck_clean(&*self.dev, "after unmount");
        self.mount();
    }

    fn crash_after_sync(&mut self) {
        let fs = self.fs.take().unwrap();
        fs.sync().unwrap_or_else(|e| panic!("sync failed: {e}"));
        let image = Arc::new(self.dev.snapshot());
        drop(fs); // its unmount writes to the old device, which is discarded
        fsck_clean(&*image, "after sync and a crash");
        self.dev = image;
        self.mount();
    }

    fn resolve(&self, path: &str) -> Result<u64, i32> {
        path.split('/')
            .filter(|c| !c.is_empty())
            .try_fold(ROOT_INO, |cur, c| self.fs().lookup(cur, c.as_bytes()).map(|a| a.ino).map_err(errno))
    }
}

// ---------------------------------------------------------------------------------------
// Running a sequence
// ---------------------------------------------------------------------------------------

struct Harness {
    model: Model,
    sut: Sut,
    fresh: Counts,
    /// Handles opened on the ferrofs side, parallel to `model.handles`.
    fs_handles: Vec<u64>,
    step: usize,
    op: Op,
    /// What the current step's references resolved to, for messages.
    op_note: String,
    /// (mtime, ctime) of every inode at the last state check: times never go backwards.
    times: std::cell::RefCell<BTreeMap<u64, (Time, Time)>>,
    /// Nodes whose ctime (and mtime, when `true`) the current step must have advanced.
    must_change: Vec<(Mid, bool)>,
}

type Time = (i64, u32);

fn time(t: ferrofs::format::inode::Timespec) -> Time {
    (t.sec, t.nsec)
}

/// Compare a model expectation with a ferrofs result; panics on any disagreement.
/// Returns the value when both succeeded.
fn agree<T: PartialEq + Debug>(what: &dyn Debug, exp: Result<T, Errs>, got: Result<T, i32>) -> Option<T> {
    note_outcome(&exp);
    match (exp, got) {
        (Ok(a), Ok(b)) => {
            assert!(a == b, "{what:?}: ferrofs returned {b:?}, the model {a:?}");
            Some(b)
        }
        (Err(errs), Err(e)) => {
            assert!(
                errs.contains(&e),
                "{what:?}: ferrofs failed with {}, the model expects {}",
                errname(e),
                errs.iter().map(|&e| errname(e)).collect::<Vec<_>>().join(" or ")
            );
            None
        }
        (Ok(a), Err(e)) => panic!("{what:?}: ferrofs failed with {}, the model succeeds with {a:?}", errname(e)),
        (Err(errs), Ok(b)) => panic!(
            "{what:?}: ferrofs returned {b:?}, the model expects {}",
            errs.iter().map(|&e| errname(e)).collect::<Vec<_>>().join(" or ")
        ),
    }
}

thread_local! {
    /// Outcome counts per operation kind ("Create ok", "Create ENOENT", ...).
    static STATS: std::cell::RefCell<BTreeMap<String, u64>> = const { std::cell::RefCell::new(BTreeMap::new()) };
    static CURRENT: std::cell::RefCell<String> = const { std::cell::RefCell::new(String::new()) };
}

fn note_outcome<T>(exp: &Result<T, Errs>) {
    let what = CURRENT.with(|c| c.borrow().clone());
    let outcome = match exp {
        Ok(_) => "ok".to_string(),
        Err(e) => errname(e[0]),
    };
    STATS.with(|s| *s.borrow_mut().entry(format!("{what} {outcome}")).or_default() += 1);
}

fn print_stats() {
    STATS.with(|s| {
        for (k, v) in s.borrow().iter() {
            println!("{v:8} {k}");
        }
    });
}

fn same_bytes(what: &dyn Debug, off: u64, exp: &[u8], got: &[u8]) {
    if exp != got {
        let at = exp.iter().zip(got).position(|(a, b)| a != b).unwrap_or(exp.len().min(got.len()));
        panic!(
            "{what:?}: {} bytes read at {off}, expected {}; first difference at offset {} (ferrofs {:?}, model {:?})",
            got.len(),
            exp.len(),
            off + at as u64,
            got.get(at),
            exp.get(at)
        );
    }
}

impl Harness {
    fn new(setup: Setup) -> Harness {
        let sut = Sut::new(setup);
        let fresh = counts(sut.fs());
        Harness {
            model: Model::new(),
            sut,
            fresh,
            fs_handles: Vec::new(),
            step: 0,
            op: Sync,
            op_note: String::new(),
            times: Default::default(),
            must_change: Vec::new(),
        }
    }

    fn ctx(&self) -> String {
        format!("step {} {:?} {}", self.step, self.op, self.op_note)
    }

    /// Resolve a directory reference on both sides. `None` when both failed alike (the
    /// failure was compared) or the reference names nothing.
    fn dir(&self, d: Dir) -> Option<(Mid, u64)> {
        match d {
            D(path) => {
                let m = self.model.resolve(path).map_err(|e| vec![e]);
                let f = self.sut.resolve(path);
                let ctx = format!("{}: resolving {path}", self.ctx());
                let ino = agree(&ctx, m.clone().map(|m| self.model.nodes[m].ino), f)?;
                Some((m.unwrap(), ino))
            }
            Nth(k) => {
                let dirs = self.model.all_dirs();
                let m = dirs[k % dirs.len()];
                Some((m, self.model.nodes[m].ino))
            }
            DH(h) => self.handle(h),
        }
    }

    fn handle(&self, h: usize) -> Option<(Mid, u64)> {
        (!self.model.handles.is_empty()).then(|| {
            let i = h % self.model.handles.len();
            (self.model.handles[i], self.fs_handles[i])
        })
    }

    /// The (directory, name) an entry reference names, on both sides.
    fn entry(&self, e: Ent) -> Option<(Mid, u64, String)> {
        match e {
            In(dir, name) => self.dir(dir).map(|(m, ino)| (m, ino, name.to_string())),
            Any(k) => {
                let all = self.model.all_entries();
                let (d, name) = all.get(k % all.len().max(1))?.clone();
                Some((d, self.model.nodes[d].ino, String::from_utf8(name).unwrap()))
            }
            H(_) => None,
        }
    }

    /// The object a reference names: looked up on both sides (results compared).
    fn obj(&self, e: Ent) -> Option<(Mid, u64)> {
        if let H(h) = e {
            return self.handle(h);
        }
        let (dm, dino, name) = self.entry(e)?;
        let m = self.model.lookup(dm, &name).map_err(|e| vec![e]);
        let f = self.sut.fs().lookup(dino, name.as_bytes()).map(|a| a.ino).map_err(errno);
        let ctx = format!("{}: looking up {name} in inode {dino}", self.ctx());
        let ino = agree(&ctx, m.clone().map(|m| self.model.nodes[m].ino), f)?;
        Some((m.unwrap(), ino))
    }

    /// A node-creating call in directory `dir`: on success, record the new ferrofs inode
    /// number in the model.
    fn made(&mut self, dir: Mid, exp: Result<Mid, Errs>, got: ferrofs::Result<Attr>) {
        let ctx = self.ctx();
        let got = got.map_err(errno);
        let ino = got.as_ref().map(|a| a.ino).unwrap_or(0);
        if let (Ok(m), Ok(_)) = (&exp, &got) {
            self.model.nodes[*m].ino = ino;
            self.model.dead.remove(&ino);
            self.times.borrow_mut().remove(&ino);
            self.must_change.push((dir, true));
        }
        agree(&ctx, exp.map(|_| ()), got.map(|_| ()));
    }

    /// The step succeeded: these nodes' times must have moved.
    fn changed(&mut self, ok: bool, nodes: &[(Mid, bool)]) {
        if ok {
            self.must_change.extend_from_slice(nodes);
        }
    }

    /// Every attribute of every reachable node (what a remount must preserve exactly).
    fn all_attrs(&self) -> Vec<Attr> {
        let mut mids = vec![ROOT];
        mids.extend(self.model.all_entries().into_iter().map(|(d, n)| self.model.nodes[d].entries[&n]));
        mids.extend(
            self.model
                .all_dirs()
                .into_iter()
                .flat_map(|d| self.model.populated(d).into_iter().map(move |n| (d, n)))
                .map(|(d, n)| self.model.nodes[d].entries[&n]),
        );
        mids.sort();
        mids.dedup();
        mids.into_iter().map(|m| self.sut.fs().getattr(self.model.nodes[m].ino).unwrap()).collect()
    }

    fn run(&mut self, op: &Op) {
        self.op = op.clone();
        self.op_note.clear();
        self.must_change.clear();
        let kind = format!("{op:?}");
        CURRENT.with(|c| *c.borrow_mut() = kind[..kind.find([' ', '{']).unwrap_or(kind.len())].to_string());
        let ctx = self.ctx();
        let fs = self.sut.fs.as_ref().unwrap();
        match *op {
            Create { at } | Mkdir { at } | Mknod { at, .. } | Symlink { at, .. } => {
                let Some((dm, dino, name)) = self.entry(at) else { return };
                let (name, n) = (name.as_str(), name.as_bytes());
                self.op_note = format!("{name:?} in inode {dino}");
                let (exp, got) = match *op {
                    Create { .. } => {
                        (self.model.make(dm, name, FileType::RegularFile, 0o644), fs.create(dino, n, 0o644, CRED))
                    }
                    Mkdir { .. } => {
                        (self.model.make(dm, name, FileType::Directory, 0o755), fs.mkdir(dino, n, 0o755, CRED))
                    }
                    Mknod { chr, .. } => {
                        let (kind, mode, rdev) = if chr {
                            (FileType::CharDevice, libc::S_IFCHR as u16, 0x0801)
                        } else {
                            (FileType::NamedPipe, libc::S_IFIFO as u16, 0)
                        };
                        let exp = self.model.make(dm, name, kind, 0o600);
                        if let Ok(m) = exp {
                            self.model.nodes[m].rdev = rdev;
                        }
                        (exp, fs.mknod(dino, n, mode | 0o600, rdev, CRED))
                    }
                    Symlink { len, .. } => {
                        let target = symlink_target(len);
                        (self.model.symlink(dm, name, &target), fs.symlink(dino, n, &target, CRED))
                    }
                    _ => unreachable!(),
                };
                self.made(dm, exp, got);
            }
            Unlink { at } | Rmdir { at } => {
                let Some((dm, dino, name)) = self.entry(at) else { return };
                let want_dir = matches!(op, Rmdir { .. });
                let victim = self.model.nodes[dm].entries.get(name.as_bytes()).copied();
                let exp = self.model.remove(dm, &name, want_dir);
                let got = if want_dir { fs.rmdir(dino, name.as_bytes()) } else { fs.unlink(dino, name.as_bytes()) };
                let ok = agree(&format!("{ctx} [{name:?} in inode {dino}]"), exp, got.map_err(errno)).is_some();
                self.changed(ok, &[(dm, true)]);
                if let Some(v) = victim.filter(|&v| !want_dir && self.model.nodes[v].live) {
                    self.changed(ok, &[(v, false)]);
                }
            }
            Rename { from, to, flags } => {
                let (Some((om, oino, old)), Some((nm, nino, new))) = (self.entry(from), self.entry(to)) else { return };
                let src = self.model.nodes[om].entries.get(old.as_bytes());
                let noop = src.is_some() && src == self.model.nodes[nm].entries.get(new.as_bytes());
                let exp = self.model.rename(om, &old, nm, &new, flags);
                let ctx = format!("{ctx} [{old:?} in inode {oino} -> {new:?} in inode {nino}]");
                let ok = agree(&ctx, exp, fs.rename(oino, old.as_bytes(), nino, new.as_bytes(), flags).map_err(errno))
                    .is_some();
                self.changed(ok && !noop, &[(om, true), (nm, true)]);
            }
            Link { obj, to } => {
                let (Some((m, ino)), Some((dm, dino, name))) = (self.obj(obj), self.entry(to)) else { return };
                let exp = self.model.link(m, dm, &name);
                let ctx = format!("{ctx} [inode {ino} -> {name:?} in inode {dino}]");
                let ok = agree(&ctx, exp, fs.link(ino, dino, name.as_bytes()).map(|_| ()).map_err(errno)).is_some();
                self.changed(ok, &[(m, false), (dm, true)]);
            }
            Write { obj, off, len, seed } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                let data = pattern(len, seed);
                let ok =
                    agree(&ctx, self.model.write(m, off, &data), fs.write(ino, off, &data).map_err(errno)).is_some();
                self.changed(ok, &[(m, true)]);
            }
            Truncate { obj, size } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                let resized = self.model.nodes[m].data.size != size;
                let exp = self.model.truncate(m, size).map(|_| size);
                let ok = agree(
                    &ctx,
                    exp,
                    fs.setattr(ino, &SetAttr { size: Some(size), ..Default::default() }).map(|a| a.size).map_err(errno),
                )
                .is_some();
                self.changed(ok, &[(m, resized)]);
            }
            Fallocate { obj, off, len, mode } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                // mtime moves when the size grows or data is punched, zeroed or moved; ctime
                // always.
                let grows = mode == 0 && off.saturating_add(len) > self.model.nodes[m].data.size;
                let exp = self.model.fallocate(m, off, len, mode);
                let ok = agree(&ctx, exp, fs.fallocate(ino, off, len, mode).map_err(errno)).is_some();
                let rewrites =
                    FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE | FALLOC_FL_COLLAPSE_RANGE | FALLOC_FL_INSERT_RANGE;
                self.changed(ok, &[(m, grows || mode & rewrites != 0)]);
            }
            Read { obj, off, len } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                let node = &self.model.nodes[m];
                let exp = match node.kind {
                    FileType::Directory => fail(vec![libc::EISDIR]),
                    FileType::RegularFile => Ok(node.data.read(off, len)),
                    _ => return, // reading a symlink or device node through read(2) is not a VFS path
                };
                let got = fs.read(ino, off, len).map_err(errno);
                if let (Ok(e), Ok(g)) = (&exp, &got) {
                    same_bytes(&ctx, off, e, g);
                }
                agree(&ctx, exp.map(|_| ()), got.map(|_| ()));
            }
            Readlink { obj } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                let node = &self.model.nodes[m];
                let exp =
                    if node.kind == FileType::Symlink { Ok(node.target.clone()) } else { fail(vec![libc::EINVAL]) };
                agree(&ctx, exp, fs.readlink(ino).map_err(errno));
            }
            Chmod { obj, perm } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                self.model.nodes[m].perm = perm;
                agree(
                    &ctx,
                    Ok(perm),
                    fs.setattr(ino, &SetAttr { mode: Some(perm), ..Default::default() }).map(|a| a.perm).map_err(errno),
                );
                self.changed(true, &[(m, false)]);
            }
            Chown { obj, uid, gid } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                (self.model.nodes[m].uid, self.model.nodes[m].gid) = (uid, gid);
                let got = fs.setattr(ino, &SetAttr { uid: Some(uid), gid: Some(gid), ..Default::default() });
                agree(&ctx, Ok((uid, gid)), got.map(|a| (a.uid, a.gid)).map_err(errno));
                self.changed(true, &[(m, false)]);
            }
            Fragment { obj, n } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                for k in 0..n {
                    let data = pattern(1, k as u8);
                    let exp = self.model.write(m, 2 * k * PAGE, &data);
                    let ok = agree(&ctx, exp, self.sut.fs().write(ino, 2 * k * PAGE, &data).map_err(errno)).is_some();
                    if !ok {
                        return;
                    }
                }
            }
            SetXattr { obj, name, len, seed, flags } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                let value = pattern(len, seed);
                let exp = self.model.setxattr(m, name, &value, flags);
                let ok = agree(&ctx, exp, fs.setxattr(ino, name.as_bytes(), &value, flags).map_err(errno)).is_some();
                self.changed(ok, &[(m, false)]);
            }
            GetXattr { obj, name } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                let exp = self.model.nodes[m].xattrs.get(name.as_bytes()).cloned().ok_or_else(|| vec![libc::ENODATA]);
                agree(&ctx, exp, fs.getxattr(ino, name.as_bytes()).map_err(errno));
            }
            RemoveXattr { obj, name } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                let exp =
                    self.model.nodes[m].xattrs.remove(name.as_bytes()).map(|_| ()).ok_or_else(|| vec![libc::ENODATA]);
                let ok = agree(&ctx, exp, fs.removexattr(ino, name.as_bytes()).map_err(errno)).is_some();
                self.changed(ok, &[(m, false)]);
            }
            Fsync { obj, datasync } => {
                let Some((_, ino)) = self.obj(obj) else { return };
                agree(&ctx, Ok(()), fs.fsync(ino, datasync).map_err(errno));
            }
            Open { obj } => {
                let Some((m, ino)) = self.obj(obj) else { return };
                if agree(&ctx, Ok(ino), fs.open(ino).map(|a| a.ino).map_err(errno)).is_some() {
                    self.model.open(m);
                    self.fs_handles.push(ino);
                }
            }
            Release { h } => {
                if self.model.handles.is_empty() {
                    return;
                }
                let i = h % self.model.handles.len();
                self.model.release(i);
                let ino = self.fs_handles.remove(i);
                agree(&ctx, Ok(()), fs.release(ino).map_err(errno));
            }
            Sync => agree(&ctx, Ok(()), fs.sync().map_err(errno)).unwrap(),
            Remount | CrashAfterSync => {
                self.model.release_all();
                self.fs_handles.clear();
                let before = self.all_attrs();
                if matches!(op, Remount) {
                    self.sut.remount();
                } else {
                    self.sut.crash_after_sync();
                }
                for (b, a) in before.iter().zip(self.all_attrs()) {
                    assert_eq!(*b, a, "{ctx}: attributes of inode {} changed", b.ino);
                }
            }
            Populate { dir, n } => {
                let Some((dm, dino)) = self.dir(dir) else { return };
                for i in 0..n {
                    let name = format!("p{i:03}");
                    let fs = self.sut.fs();
                    let got = fs.create(dino, name.as_bytes(), 0o644, CRED);
                    // Without background threads nothing bounds the CIL but our own syncs.
                    if i % 64 == 63 {
                        fs.sync().unwrap();
                    }
                    let exp = self.model.make(dm, &name, FileType::RegularFile, 0o644);
                    self.made(dm, exp, got);
                }
            }
            Depopulate { dir } => {
                let Some((dm, dino)) = self.dir(dir) else { return };
                for name in self.model.populated(dm) {
                    let name = String::from_utf8(name).unwrap();
                    let exp = self.model.remove(dm, &name, false);
                    agree(&ctx, exp, self.sut.fs().unlink(dino, name.as_bytes()).map_err(errno));
                }
            }
        }
    }

    // ---- the state check -------------------------------------------------------------

    /// Compare everything visible: the tree from the root, every reachable and every open
    /// node, and that freed inode numbers are stale.
    fn check_state(&self) {
        let ctx = format!("after {}", self.ctx());
        let mut seen = BTreeSet::new();
        let mut stack = vec![ROOT];
        stack.extend(self.model.handles.iter().copied());
        while let Some(m) = stack.pop() {
            if !seen.insert(m) {
                continue;
            }
            self.check_node(&ctx, m);
            let n = &self.model.nodes[m];
            if n.is_dir() && n.links > 0 {
                self.check_dir(&ctx, m);
                stack.extend(n.entries.values().copied());
            }
        }
        for &ino in &self.model.dead {
            let got = self.sut.fs().getattr(ino).map(|a| a.ino).map_err(errno);
            assert_eq!(got, Err(libc::ESTALE), "{ctx}: freed inode {ino} is still there");
        }
    }

    fn check_node(&self, ctx: &str, m: Mid) {
        let fs = self.sut.fs();
        let n = &self.model.nodes[m];
        let a = fs.getattr(n.ino).unwrap_or_else(|e| panic!("{ctx}: getattr of inode {}: {e}", n.ino));
        let exp = (n.kind, n.perm, self.model.nlink(m), self.model.size(m), n.uid, n.gid);
        assert_eq!(
            (a.kind, a.perm, a.nlink, a.size, a.uid, a.gid),
            exp,
            "{ctx}: inode {} (kind, perm, nlink, size, uid, gid)",
            n.ino
        );
        self.check_blocks(ctx, m, &a);
        self.check_times(ctx, m, &a);
        if n.kind == FileType::CharDevice {
            assert_eq!(a.rdev, n.rdev, "{ctx}: inode {} rdev", n.ino);
        }
        match n.kind {
            FileType::RegularFile => {
                for (off, len) in n.data.probes() {
                    let got = fs
                        .read(n.ino, off, len)
                        .unwrap_or_else(|e| panic!("{ctx}: read of inode {} at {off}: {e}", n.ino));
                    same_bytes(&format!("{ctx}: inode {}", n.ino), off, &n.data.read(off, len), &got);
                }
            }
            FileType::Symlink => {
                assert_eq!(fs.readlink(n.ino).ok().as_ref(), Some(&n.target), "{ctx}: symlink {} target", n.ino)
            }
            _ => {}
        }
        let mut names = fs.listxattr(n.ino).unwrap_or_else(|e| panic!("{ctx}: listxattr of inode {}: {e}", n.ino));
        names.sort();
        assert_eq!(names, n.xattrs.keys().cloned().collect::<Vec<_>>(), "{ctx}: inode {} xattr names", n.ino);
        for (k, v) in &n.xattrs {
            assert_eq!(
                fs.getxattr(n.ino, k).ok().as_ref(),
                Some(v),
                "{ctx}: inode {} xattr {}",
                n.ino,
                String::from_utf8_lossy(k)
            );
        }
    }

    /// Data blocks are exactly the pages written (and not truncated away), plus the value
    /// blocks of xattr values over 1 KiB; B+tree nodes (extents, xattrs) come on top.
    fn check_blocks(&self, ctx: &str, m: Mid, a: &Attr) {
        const TREE_SLACK: u64 = 16;
        let n = &self.model.nodes[m];
        let values: u64 = n.xattrs.values().map(|v| ferrofs::xattr::value_blocks(v.len())).sum();
        let data = values
            + match n.kind {
                FileType::RegularFile => n.data.blocks(),
                FileType::Symlink => (n.target.len() > 64) as u64,
                FileType::Directory => return,
                _ => 0,
            };
        let blocks = a.blocks / (PAGE / 512);
        assert!(
            (data..=data + TREE_SLACK).contains(&blocks),
            "{ctx}: inode {} has {blocks} blocks for {data} data blocks",
            n.ino
        );
    }

    fn check_times(&self, ctx: &str, m: Mid, a: &Attr) {
        let now = (time(a.mtime), time(a.ctime));
        let Some(before) = self.times.borrow_mut().insert(a.ino, now) else { return };
        assert!(
            now.0 >= before.0 && now.1 >= before.1,
            "{ctx}: inode {} times went back from {before:?} to {now:?}",
            a.ino
        );
        for &(_, mtime) in self.must_change.iter().filter(|(c, _)| *c == m) {
            assert!(now.1 > before.1, "{ctx}: inode {} ctime did not change", a.ino);
            assert!(!mtime || now.0 > before.0, "{ctx}: inode {} mtime did not change", a.ino);
        }
    }

    fn check_dir(&self, ctx: &str, m: Mid) {
        let fs = self.sut.fs();
        let n = &self.model.nodes[m];
        let parent_ino = self.model.nodes[n.parent].ino;
        let all = readdir(fs, n.ino, 0).unwrap_or_else(|e| panic!("{ctx}: readdir of inode {}: {e}", n.ino));
        let entry = |name: &[u8], ino: u64, kind: FileType| {
            (String::from_utf8_lossy(name).into_owned(), ino, format!("{kind:?}"))
        };
        let mut got: Vec<_> = all.iter().map(|e| entry(&e.name, e.ino, e.kind)).collect();
        got.sort();
        let mut exp = vec![entry(b".", n.ino, FileType::Directory), entry(b"..", parent_ino, FileType::Directory)];
        exp.extend(n.entries.iter().map(|(k, &c)| entry(k, self.model.nodes[c].ino, self.model.nodes[c].kind)));
        exp.sort();
        if got != exp {
            let g: BTreeSet<_> = got.iter().collect();
            let e: BTreeSet<_> = exp.iter().collect();
            panic!(
                "{ctx}: readdir of inode {}: unexpected {:?}, missing {:?}",
                n.ino,
                g.difference(&e).collect::<Vec<_>>(),
                e.difference(&g).collect::<Vec<_>>()
            );
        }
        // Resuming from an entry's cookie yields exactly the entries after it.
        for k in [0, all.len() / 2, all.len() - 1] {
            let rest = readdir(fs, n.ino, all[k].cookie).unwrap();
            assert_eq!(rest, all[k + 1..], "{ctx}: readdir of inode {} resumed after entry {k}", n.ino);
        }
        let dotdot = fs.lookup(n.ino, b"..").map(|a| a.ino).map_err(errno);
        assert_eq!(dotdot, Ok(parent_ino), "{ctx}: lookup of .. in inode {}", n.ino);
    }

    // ---- the end of a case -------------------------------------------------------------

    /// Close everything, delete the whole tree, and check that the space and inode counts
    /// are back to those of a fresh file system, now and after a remount.
    fn teardown(&mut self) {
        self.op = Sync;
        self.step += 1;
        for ino in self.fs_handles.drain(..) {
            self.sut.fs().release(ino).unwrap();
        }
        self.model.release_all();
        remove_tree(self.sut.fs(), ROOT_INO);
        self.sut.fs().sync().unwrap();
        assert_eq!(counts(self.sut.fs()), self.fresh, "free blocks/inodes after deleting everything");
        self.sut.remount();
        assert_eq!(counts(self.sut.fs()), self.fresh, "free blocks/inodes after deleting everything and remounting");
        if let Some(budget) = &self.sut.opts.cache {
            CACHE_RECLAIMED.fetch_add(
                budget.stats.reclaimed_bytes.load(std::sync::atomic::Ordering::Relaxed),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }
}

/// Bytes the tiny-cache runs reclaimed: proof that they did drop and reload objects.
static CACHE_RECLAIMED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn readdir(fs: &FileSystem, ino: u64, cookie: u64) -> ferrofs::Result<Vec<DirEntry>> {
    let mut v = Vec::new();
    fs.readdir(ino, cookie, &mut |e| {
        v.push(e.owned());
        true
    })?;
    Ok(v)
}

/// rm -rf of a directory's contents.
fn remove_tree(fs: &FileSystem, dir: u64) {
    for e in readdir(fs, dir, 0).unwrap() {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        if e.kind == FileType::Directory {
            remove_tree(fs, e.ino);
            fs.rmdir(dir, &e.name).unwrap();
        } else {
            fs.unlink(dir, &e.name).unwrap();
        }
    }
}

/// Run a sequence, checking the whole state after every step.
fn run_ops(ops: &[Op], setup: Setup) {
    let mut h = Harness::new(setup);
    for (i, op) in ops.iter().enumerate() {
        h.step = i;
        h.run(op);
        h.check_state();
    }
    h.teardown();
}

thread_local! {
    /// Set while proptest runs (and shrinks) cases: it reports the failing case's panic
    /// message itself, so the hook need not print every intermediate panic.
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn quiet_panics() {
    static HOOK: std::sync::Once = std::sync::Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(|q| q.get()) {
                default(info);
            }
        }));
    });
    QUIET.with(|q| q.set(true));
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(DEFAULT_CASES)
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig { cases, failure_persistence: None, max_shrink_iters: 20_000, ..ProptestConfig::default() }
}

/// Run `cases` random sequences; on a failure, panic with proptest's report (the reason and
/// the shrunk sequence), which the quiet hook must not swallow.
fn check_sequences(cases: u32, setup: Setup) {
    let mut runner = proptest::test_runner::TestRunner::new(config(cases));
    quiet_panics();
    let result = runner.run(&prop::collection::vec(op_s(), 1..60), |ops| {
        run_ops(&ops, setup);
        Ok(())
    });
    QUIET.with(|q| q.set(false));
    if let Err(e) = result {
        panic!("{e}");
    }
}

#[test]
fn model_matches() {
    check_sequences(cases(), Setup::Manual);
}

/// Background checkpoints and AIL writeback run concurrently with the operations (a 16 KiB
/// CIL push threshold and a 5 ms interval): results must not change. More cases than the
/// other setups: a race shows on a few seeds only (the stale-writeback bug failed one case in
/// 500 to 2,000), and each suite run draws new ones; 2,000 take about 20 s.
#[test]
fn model_matches_with_background_journal() {
    check_sequences((cases() * 2 / 5).max(1), Setup::Background);
}

/// The caches are far too small for the workload: results must not change when inodes and
/// blocks are dropped and read back.
#[test]
fn model_matches_with_tiny_cache() {
    check_sequences((cases() / 10).max(1), Setup::TinyCache);
    assert!(CACHE_RECLAIMED.load(std::sync::atomic::Ordering::Relaxed) > 0, "the cache never reclaimed anything");
}

/// How often each operation succeeds or fails how: a check that the generator reaches the
/// interesting cases (run with `--ignored --nocapture`).
#[test]
#[ignore = "prints statistics"]
fn model_outcome_stats() {
    proptest::test_runner::TestRunner::new(config(cases()))
        .run(&prop::collection::vec(op_s(), 1..60), |ops| {
            run_ops(&ops, Setup::Manual);
            Ok(())
        })
        .unwrap();
    print_stats();
}

// ---------------------------------------------------------------------------------------
// Regressions: sequences proptest found, kept exactly.
// ---------------------------------------------------------------------------------------

/// rename(2) into a directory that was removed while open must fail with ENOENT, as
/// Linux does (may_create: IS_DEADDIR) and as create and link there do. The engine used to
/// let it succeed: the entry landed in the dead directory, and when its last handle went,
/// fsck found the file's inode and data and the directory's B+tree block leaked.
const RENAME_INTO_REMOVED_DIR: &[Op] = &[
    Mkdir { at: In(D("/"), "d") },
    Create { at: In(D("/"), "f") },
    Open { obj: In(D("/"), "d") },
    Rmdir { at: In(D("/"), "d") },
    Rename { from: In(D("/"), "f"), to: In(DH(0), "f"), flags: 0 },
];

#[test]
fn regression_rename_into_removed_dir() {
    run_ops(RENAME_INTO_REMOVED_DIR, Setup::Manual);
}

/// An inode number freed and handed out again before the next checkpoint: the new inode's
/// log image must win over the freed inode's. The engine used to drop it, because the CIL
/// keeps the copy with the higher per-object log version and a new in-memory `Inode`
/// counted from 0 again (the freed one had logged at least as many versions): after a
/// remount the new file "b" had the old file's size (10) and block map.
const INODE_REUSE_IN_ONE_CHECKPOINT: &[Op] = &[
    Create { at: In(D("/"), "a") },
    Remount,
    Write { obj: In(D("/"), "a"), off: 0, len: 10, seed: 0 },
    Unlink { at: In(D("/"), "a") },
    Create { at: In(D("/"), "b") },
    Remount,
];

#[test]
fn regression_inode_reuse_in_one_checkpoint() {
    run_ops(INODE_REUSE_IN_ONE_CHECKPOINT, Setup::Manual);
}

// ---------------------------------------------------------------------------------------
// Running out of space
// ---------------------------------------------------------------------------------------

/// Fill a small file system (blocks, or inodes with `few_inodes`) until calls fail, then
/// try every kind of call: each must succeed or fail with ENOSPC and change nothing; the
/// file system must stay usable, the image consistent, and deleting everything must give
/// back every block and inode.
fn fill_up(few_inodes: bool) {
    let size = 16 << 20;
    let mkfs = MkfsOptions { bytes_per_inode: if few_inodes { 1 << 20 } else { 8192 }, ..MkfsOptions::default() };
    let dev = Arc::new(MemDevice::new(size));
    FileSystem::mkfs(&*dev, &mkfs).unwrap();
    let mut cfg = JournalConfig::for_log(ferrofs::mkfs::plan(size, &mkfs).unwrap().log_blocks - 2);
    cfg.background = false;
    cfg.cil_max_bytes = u64::MAX; // we sync often enough
    let opts = MountOptions { read_only: false, journal: Some(cfg), ..MountOptions::default() };
    let fs = FileSystem::mount_device(dev.clone(), &opts).unwrap();
    let fresh = counts(&fs);
    let enospc = |what: &str, r: ferrofs::Result<()>| match r {
        Ok(()) => true,
        Err(e) if e.errno() == libc::ENOSPC => false,
        Err(e) => panic!("{what}: {e} (expected success or ENOSPC)"),
    };
    let d = fs.mkdir(ROOT_INO, b"d", 0o755, CRED).unwrap().ino;
    let mut files: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for i in 0.. {
        let name = format!("f{i:05}").into_bytes();
        let data = pattern(if few_inodes { 10 } else { 64 << 10 }, i as u8);
        let Ok(a) = fs.create(d, &name, 0o644, CRED).map_err(|e| assert_eq!(e.errno(), libc::ENOSPC, "create: {e}"))
        else {
            break;
        };
        if !enospc("write", fs.write(a.ino, 0, &data).map(|_| ())) {
            let got = fs.getattr(a.ino).unwrap().size;
            assert!(got == 0 || got == data.len() as u64, "a failed write left size {got}");
            files.push((name, fs.read(a.ino, 0, got as usize).unwrap()));
            break;
        }
        files.push((name, data));
        if i % 16 == 15 {
            fs.sync().unwrap();
        }
    }
    let full = counts(&fs);
    assert!(
        if few_inodes { full.ffree == 0 } else { full.bfree < 64 },
        "{} files written, still {full:?} free",
        files.len()
    );
    // A name's own error comes before ENOSPC, as on a kernel file system (`mkdir -p` of a
    // directory that exists must see EEXIST on a full one).
    let errno_of = |r: ferrofs::Result<Attr>| r.map(drop).map_err(|e| e.errno());
    assert_eq!(
        errno_of(fs.create(d, &files[0].0, 0o644, CRED)),
        Err(libc::EEXIST),
        "create of a taken name on a full file system"
    );
    assert_eq!(
        errno_of(fs.mkdir(ROOT_INO, b"d", 0o755, CRED)),
        Err(libc::EEXIST),
        "mkdir of a taken name on a full file system"
    );
    assert_eq!(
        fs.rename(d, b"missing", ROOT_INO, b"moved", 0).map_err(|e| e.errno()),
        Err(libc::ENOENT),
        "rename of a missing name on a full file system"
    );
    // Everything else, on the full file system.
    let f0 = fs.lookup(d, &files[0].0).unwrap().ino;
    let attempts: Vec<(&str, ferrofs::Result<()>)> = vec![
        ("create", fs.create(ROOT_INO, b"more", 0o644, CRED).map(|_| ())),
        ("mkdir", fs.mkdir(ROOT_INO, b"moredir", 0o755, CRED).map(|_| ())),
        ("symlink", fs.symlink(ROOT_INO, b"sl", &[b'x'; 300], CRED).map(|_| ())),
        ("link", fs.link(f0, ROOT_INO, b"hard").map(|_| ())),
        ("setxattr", fs.setxattr(f0, b"user.big", &[1; 1000], 0)),
        ("write", fs.write(f0, 1 << 30, b"far").map(|_| ())),
        ("truncate", fs.setattr(f0, &SetAttr { size: Some(1 << 40), ..Default::default() }).map(|_| ())),
        ("rename", fs.rename(d, &files[1].0, ROOT_INO, b"moved", 0)),
    ];
    let mut moved = false;
    for (what, r) in attempts {
        let ok = enospc(what, r);
        moved |= what == "rename" && ok;
    }
    fs.sync().unwrap_or_else(|e| panic!("sync on a full file system: {e}"));
    // Still usable: delete a file and create another in its space.
    let (victim, _) = files.pop().unwrap();
    fs.unlink(d, &victim).unwrap();
    fs.sync().unwrap();
    fs.create(ROOT_INO, b"after", 0o644, CRED).unwrap();
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&*dev, "after filling up");
    let fs = FileSystem::mount_device(dev.clone(), &opts).unwrap();
    for (i, (name, data)) in files.iter().enumerate() {
        let dir = if i == 1 && moved { ROOT_INO } else { d };
        let name = if i == 1 && moved { b"moved".to_vec() } else { name.clone() };
        let a = fs.lookup(dir, &name).unwrap_or_else(|e| panic!("{}: {e}", String::from_utf8_lossy(&name)));
        // (files[0] may have grown by the write or truncate attempts: compare its start.)
        assert_eq!(&fs.read(a.ino, 0, data.len()).unwrap(), data, "{}", String::from_utf8_lossy(&name));
    }
    remove_tree(&fs, ROOT_INO);
    for name in fs.listxattr(ROOT_INO).unwrap() {
        fs.removexattr(ROOT_INO, &name).unwrap();
    }
    fs.sync().unwrap();
    assert_eq!(counts(&fs), fresh, "free blocks/inodes after deleting everything");
}

#[test]
fn running_out_of_blocks_is_clean() {
    fill_up(false);
}

#[test]
fn running_out_of_inodes_is_clean() {
    fill_up(true);
}
