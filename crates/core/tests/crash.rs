//! Crash harness. A workload runs on a `CrashDevice` (background journal threads off, so the
//! recorded write/flush sequence is deterministic, except in
//! `crash_random_workload_with_background_checkpoints`); after every API call the harness records
//! the file system's logical state, and after every fsync/fdatasync/sync what was
//! acknowledged as durable. Then, for each crash point (every flush, and the end) and several
//! subsets of the unflushed writes (plus torn writes), it builds the crash image, mounts it
//! (recovery and orphan processing must succeed) and checks it against the history:
//!
//! 1. Metadata is atomic and ordered: the recovered tree (names, inode numbers, attributes
//!    including sizes and times, symlink targets, xattrs) equals the state after some call
//!    `k` that had started before the crash, and `k` is not older than the last completed
//!    sync.
//! 2. fsync(F) is durable: F's metadata (for fdatasync, its size) equals F's metadata in some
//!    state at or after that fsync.
//! 3. File data: data is not journaled and an in-place overwrite may reach the disk before
//!    (or without) the transaction that follows it, and may tear, so each byte of a file
//!    must equal that byte in one of the states from `k` on; for a file fsynced at state
//!    `i`, from `max(k, i)` on (so fsynced data never goes back to older contents).
//! 4. fsck finds nothing wrong, both on the raw crash image and after recovery.
//! 5. For the "keep everything" and "keep nothing" images of each point: deleting
//!    everything gives back exactly the free blocks and inodes of a fresh file system (no
//!    leaks), a second crash anywhere during the recovery mount changes nothing, and a
//!    read-only mount (log replayed in memory) shows the same tree as the recovered one.

use ferrofs::dev::{
    crash_image_torn, crash_points, keep_sets, unflushed_epoch, BlockDevice, CrashDevice, MemDevice, Op as DevOp, Tear,
};
use ferrofs::format::BLOCK_SIZE;
use ferrofs::journal::JournalConfig;
use ferrofs::xattr::XATTR_CREATE;
use ferrofs::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex, OnceLock};

const ROOT: u64 = 1;
const CRED: Cred = Cred { uid: 1000, gid: 1000, umask: 0 };
const IMAGE_SIZE: u64 = 16 << 20;
const LOG_BLOCKS: u64 = 64;

/// The outcome of a check: a message saying what is wrong.
type Checked = std::result::Result<(), String>;

fn mkfs_options() -> MkfsOptions {
    MkfsOptions { log_blocks: Some(LOG_BLOCKS), ..MkfsOptions::default() }
}

/// The journal config a mount of these images gets by default (before a budget shrinks it).
fn stock_journal() -> JournalConfig {
    JournalConfig::for_log(LOG_BLOCKS - ferrofs::format::log::LOG_HEADER_BLOCKS)
}

fn mount_options() -> MountOptions {
    let mut cfg = stock_journal();
    // Without background threads the recorded write/flush sequence is deterministic: the
    // workload's own syncs, and the throttle when the CIL is full, write the checkpoints.
    cfg.background = false;
    // Every record of more than a block is then written in pieces, its first block last.
    cfg.record_piece_bytes = BLOCK_SIZE;
    MountOptions { read_only: false, journal: Some(cfg), ..MountOptions::default() }
}

/// A checkpoint before every transaction: with a CIL limit of one byte, each transaction
/// that begins writes the items of the one before it (the throttle of a full CIL). Crash
/// points then fall between the transactions of one call, deterministically, where the
/// stock options put them only at the workload's syncs. (The exhaustive runs gain little
/// from it: each of their steps ends in a sync or fsync, and few take more than one
/// transaction; two steps gave 64,831 crash states instead of 63,589.)
fn checkpoint_every_transaction() -> MountOptions {
    let mut opts = mount_options();
    opts.journal.as_mut().expect("mount_options sets a journal").cil_max_bytes = 1;
    opts
}

fn mount(dev: Arc<dyn BlockDevice>) -> Result<FileSystem> {
    FileSystem::mount_device(dev, &mount_options())
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1).collect()
}

// ---------------------------------------------------------------------------------------
// Logical state
// ---------------------------------------------------------------------------------------

/// Everything the metadata journal must restore atomically about one reachable inode.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Meta {
    kind: FileType,
    perm: u16,
    nlink: u32,
    size: u64,
    blocks: u64,
    uid: u32,
    gid: u32,
    mtime: (i64, u32),
    ctime: (i64, u32),
    entries: Vec<(Vec<u8>, u64)>,
    target: Vec<u8>,
    xattrs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The whole visible state: metadata of every reachable inode, and the contents of every
/// reachable or open file (an in-place write to an unlinked-but-open file may reach the
/// disk while the recovered metadata still has the file's name).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct State {
    meta: BTreeMap<u64, Meta>,
    data: BTreeMap<u64, Arc<Vec<u8>>>,
}

impl State {
    /// Share the contents that did not change with `prev`: a workload on large files keeps
    /// one copy of each version of a file, not one per call.
    fn share_unchanged(&mut self, prev: &State) {
        for (ino, data) in self.data.iter_mut() {
            if let Some(p) = prev.data.get(ino).filter(|p| *p == data) {
                *data = p.clone();
            }
        }
    }
}

fn readdir(fs: &FileSystem, ino: u64) -> Result<Vec<DirEntry>> {
    let mut v = Vec::new();
    fs.readdir(ino, 0, &mut |e| {
        v.push(e.owned());
        true
    })?;
    Ok(v)
}

/// Walk the tree from the root and record everything, plus the data of the `open` files.
fn snapshot(fs: &FileSystem, open: &[u64]) -> Result<State> {
    let mut st = State::default();
    let mut todo = vec![ROOT];
    while let Some(ino) = todo.pop() {
        if st.meta.contains_key(&ino) {
            continue;
        }
        let a = fs.getattr(ino)?;
        let mut m = Meta {
            kind: a.kind,
            perm: a.perm,
            nlink: a.nlink,
            size: a.size,
            blocks: a.blocks,
            uid: a.uid,
            gid: a.gid,
            mtime: (a.mtime.sec, a.mtime.nsec),
            ctime: (a.ctime.sec, a.ctime.nsec),
            entries: Vec::new(),
            target: Vec::new(),
            xattrs: Vec::new(),
        };
        match a.kind {
            FileType::Directory => {
                for e in readdir(fs, ino)? {
                    if e.name != b"." && e.name != b".." {
                        todo.push(e.ino);
                        m.entries.push((e.name, e.ino));
                    }
                }
                m.entries.sort();
            }
            FileType::Symlink => m.target = fs.readlink(ino)?,
            FileType::RegularFile => {
                st.data.insert(ino, Arc::new(fs.read(ino, 0, a.size as usize)?));
            }
            _ => {}
        }
        let mut names = fs.listxattr(ino)?;
        names.sort();
        for n in names {
            let v = fs.getxattr(ino, &n)?;
            m.xattrs.push((n, v));
        }
        st.meta.insert(ino, m);
    }
    for &ino in open {
        let a = fs.getattr(ino)?;
        if a.kind == FileType::RegularFile && !st.data.contains_key(&ino) {
            st.data.insert(ino, Arc::new(fs.read(ino, 0, a.size as usize)?));
        }
    }
    Ok(st)
}

// ---------------------------------------------------------------------------------------
// Recording a workload
// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug)]
enum Durable {
    /// fsync (`datasync == false`) or fdatasync of one inode.
    File {
        ino: u64,
        datasync: bool,
    },
    Sync,
}

/// What a workload did: the state after every call, and the durability acknowledgements.
struct History {
    /// (device ops logged when the call started, state after it). `states[0]` is the
    /// state at mount, which is durable.
    states: Vec<(usize, State)>,
    /// (device ops logged when the call returned, index of the state it made durable, what).
    durable: Vec<(usize, usize, Durable)>,
    /// Workload calls and their results, for failure messages.
    calls: Vec<String>,
}

/// A mounted file system on a recording device, plus the history of what ran on it.
struct Run {
    dev: Arc<CrashDevice>,
    fs: FileSystem,
    hist: History,
    /// Open handles (inode numbers, one per handle).
    open: Vec<u64>,
}

impl Run {
    fn start(base: &MemDevice) -> Run {
        Run::start_with(base, &mount_options())
    }

    fn start_with(base: &MemDevice, opts: &MountOptions) -> Run {
        let dev = Arc::new(CrashDevice::new(base.snapshot()));
        let fs = FileSystem::mount_device(dev.clone(), opts).expect("mounting the base image");
        let first = snapshot(&fs, &[]).unwrap();
        let hist = History { states: vec![(dev.op_count(), first)], durable: Vec::new(), calls: Vec::new() };
        Run { dev, fs, hist, open: Vec::new() }
    }

    /// Run one API call and record the state after it.
    fn call<T: std::fmt::Debug>(&mut self, what: &str, f: impl FnOnce(&FileSystem) -> Result<T>) -> Result<T> {
        let start = self.dev.op_count();
        let r = f(&self.fs);
        self.hist.calls.push(format!(
            "[ops {start}..{}] {what} -> {}",
            self.dev.op_count(),
            match &r {
                Ok(v) => format!("{v:?}"),
                Err(e) => format!("error {e}"),
            }
        ));
        let mut st =
            snapshot(&self.fs, &self.open).unwrap_or_else(|e| panic!("walking the live file system after {what}: {e}"));
        if let Some((_, prev)) = self.hist.states.last() {
            st.share_unchanged(prev);
        }
        self.hist.states.push((start, st));
        r
    }

    fn fsync(&mut self, ino: u64, datasync: bool) {
        let start = self.dev.op_count();
        let r = self.fs.fsync(ino, datasync);
        self.hist.calls.push(format!(
            "[ops {start}..{}] {}({ino}) -> {r:?}",
            self.dev.op_count(),
            if datasync { "fdatasync" } else { "fsync" }
        ));
        match r {
            Ok(()) => self.hist.durable.push((
                self.dev.op_count(),
                self.hist.states.len() - 1,
                Durable::File { ino, datasync },
            )),
            Err(e) => self.durability_failed(e),
        }
    }

    fn sync(&mut self) {
        let start = self.dev.op_count();
        let r = self.fs.sync();
        self.hist.calls.push(format!("[ops {start}..{}] sync -> {r:?}", self.dev.op_count()));
        match r {
            Ok(()) => self.hist.durable.push((self.dev.op_count(), self.hist.states.len() - 1, Durable::Sync)),
            Err(e) => self.durability_failed(e),
        }
    }

    /// A sync, fsync or unmount failed, which nothing in these workloads should make happen.
    fn durability_failed(&self, e: Error) -> ! {
        panic!("a durability call failed: {e}; calls {:#?}", self.hist.calls);
    }

    fn lookup(&self, path: &str) -> Option<u64> {
        self.fs.resolve(path).ok().map(|a| a.ino)
    }

    /// Unmount (its checkpoint and write-back are crash points too) and hand back the log.
    fn finish(self) -> (Vec<DevOp>, History) {
        if let Err(e) = self.fs.unmount() {
            self.durability_failed(e);
        }
        (self.dev.ops(), self.hist)
    }
}

// ---------------------------------------------------------------------------------------
// Checking crash images
// ---------------------------------------------------------------------------------------

/// How a crash image was made, for messages.
#[derive(Clone, Debug)]
struct CrashCase {
    point: usize,
    keep: BTreeSet<usize>,
    tear: Option<Tear>,
}

/// The free block and inode counts of an empty file system of the test geometry.
fn fresh_counts() -> (u64, u64) {
    static C: OnceLock<(u64, u64)> = OnceLock::new();
    *C.get_or_init(|| {
        let dev = Arc::new(MemDevice::new(IMAGE_SIZE));
        FileSystem::mkfs(&*dev, &mkfs_options()).unwrap();
        let fs = mount(dev).unwrap();
        let s = fs.statfs();
        (s.bfree, s.ffree)
    })
}

/// Is `got` some state's file data, byte by byte, over the states in `window`?
fn data_from_states(hist: &History, ino: u64, got: &[u8], window: std::ops::RangeInclusive<usize>) -> Checked {
    let candidates: Vec<&Arc<Vec<u8>>> =
        hist.states[window.clone()].iter().filter_map(|(_, s)| s.data.get(&ino)).collect();
    for (b, byte) in got.iter().enumerate() {
        if !candidates.iter().any(|c| c.get(b) == Some(byte)) {
            let seen: Vec<Option<&u8>> = candidates.iter().map(|c| c.get(b)).collect();
            return Err(format!("inode {ino} byte {b} is {byte:#x}; states {window:?} have {seen:?} there"));
        }
    }
    Ok(())
}

/// Mount a crash image and check it against the history (see the module docs).
fn check_crash(image: MemDevice, case: &CrashCase, hist: &History, thorough: bool) -> Checked {
    let c = case.point;
    // Durability acknowledged before the crash: (state index, what).
    let acked: Vec<(usize, Durable)> =
        hist.durable.iter().filter(|(done, _, _)| *done <= c).map(|&(_, i, d)| (i, d)).collect();
    // A call that started at or after the crash point issued none of the writes the image
    // holds, so the candidate states are those of calls that started before it, and any
    // state a durability call acknowledged by then (an fsync with nothing to write returns
    // without touching the device). State 0, the base image, is always one.
    let last = hist
        .states
        .iter()
        .rposition(|(start, _)| *start < c)
        .unwrap_or(0)
        .max(acked.iter().map(|(i, _)| *i).max().unwrap_or(0));
    let synced = acked.iter().filter(|(_, d)| matches!(d, Durable::Sync)).map(|(i, _)| *i).max().unwrap_or(0);

    fsck_clean(&image).map_err(|e| format!("before recovery: {e}"))?;
    let read_only = if thorough { Some(read_only_view(&image)?) } else { None };
    let dev = Arc::new(image);
    let fs = mount(dev.clone()).map_err(|e| format!("mount after crash failed: {e}"))?;
    let got = snapshot(&fs, &[]).map_err(|e| format!("walking the recovered tree: {e}"))?;
    if let Some(ro) = read_only.filter(|ro| *ro != got) {
        return Err(format!(
            "a read-only mount (log replayed in memory) sees another tree: {}",
            describe_diff(&ro, &got)
        ));
    }

    // 1. Metadata is exactly some state from the last sync on.
    let matching: Vec<usize> = (0..=last).filter(|&k| hist.states[k].1.meta == got.meta).collect();
    let Some(&k) = matching.iter().find(|&&k| k >= synced) else {
        let nearest = (0..=last).min_by_key(|&k| meta_distance(&hist.states[k].1, &got)).unwrap();
        let want = &hist.states[nearest].1;
        let inos: BTreeSet<&u64> =
            want.meta.keys().chain(got.meta.keys()).filter(|i| want.meta.get(i) != got.meta.get(i)).collect();
        let seen: Vec<String> = inos
            .iter()
            .map(|i| {
                format!(
                    "inode {i} as recovered is in states {:?}",
                    (0..hist.states.len())
                        .filter(|&j| hist.states[j].1.meta.get(i) == got.meta.get(i))
                        .collect::<Vec<_>>()
                )
            })
            .collect();
        return Err(format!(
            "recovered metadata matches {} (need one at or after {synced}, the last sync; states 0..={last} possible); closest is state {nearest}: {}; {}",
            if matching.is_empty() { "no state".to_string() } else { format!("states {matching:?}") },
            describe_diff(want, &got),
            seen.join("; ")
        ));
    };

    // 2. fsync/fdatasync durability.
    for &(i, d) in &acked {
        let Durable::File { ino, datasync } = d else { continue };
        let view = |s: &State| {
            s.meta.get(&ino).map(|m| if datasync { (m.kind, m.size, None) } else { (m.kind, m.size, Some(m.clone())) })
        };
        let now = view(&got);
        if !(i..=last).any(|j| view(&hist.states[j].1) == now) {
            return Err(format!(
                "inode {ino} was {} at state {i} (call started at device op {}) but came back as {now:?}, which no state in {i}..={last} had",
                if datasync { "fdatasynced" } else { "fsynced" },
                hist.states[i].0
            ));
        }
    }

    // 3. File data.
    for (&ino, data) in &got.data {
        let fsynced = acked
            .iter()
            .filter(|(_, d)| matches!(d, Durable::File { ino: f, .. } if *f == ino))
            .map(|(i, _)| *i)
            .max()
            .unwrap_or(0);
        data_from_states(hist, ino, data, k.max(fsynced)..=last)?;
    }

    // 5. No leaks.
    if thorough {
        remove_tree(&fs, ROOT).map_err(|e| format!("deleting everything after recovery: {e}"))?;
        for name in fs.listxattr(ROOT).map_err(|e| format!("listxattr of the root: {e}"))? {
            fs.removexattr(ROOT, &name).map_err(|e| format!("removexattr of the root: {e}"))?;
        }
        fs.sync().map_err(|e| format!("sync: {e}"))?;
        let s = fs.statfs();
        if (s.bfree, s.ffree) != fresh_counts() {
            return Err(format!(
                "after deleting everything: {} free blocks and {} free inodes, a fresh file system has {:?}",
                s.bfree,
                s.ffree,
                fresh_counts()
            ));
        }
    }
    fs.unmount().map_err(|e| format!("unmount after the checks: {e}"))?;
    drop(fs);
    fsck_clean(&*dev).map_err(|e| format!("after recovery and unmount: {e}"))
}

/// What a read-only mount of `image` shows (it replays the log into memory, writes nothing
/// and leaves orphans alone, which are unreachable anyway).
fn read_only_view(image: &MemDevice) -> std::result::Result<State, String> {
    let opts = MountOptions { read_only: true, ..mount_options() };
    let fs = FileSystem::mount_device(Arc::new(image.snapshot()), &opts)
        .map_err(|e| format!("read-only mount after crash failed: {e}"))?;
    snapshot(&fs, &[]).map_err(|e| format!("walking the read-only mount: {e}"))
}

/// Crash while mounting `image` (log replay, orphan processing) at every flush of the
/// mount, with all and with none of the unflushed writes: mounting again must give the
/// same tree and data as the uninterrupted mount.
fn check_recovery_crashes(image: &MemDevice) -> Checked {
    let dev = Arc::new(CrashDevice::new(image.snapshot()));
    let fs = mount(dev.clone()).map_err(|e| format!("mount after crash failed: {e}"))?;
    let want = snapshot(&fs, &[]).map_err(|e| format!("walking the recovered tree: {e}"))?;
    let ops = dev.ops();
    drop(fs);
    for c in crash_points(&ops) {
        for keep_all in [true, false] {
            let again = crash_image_torn(image, &ops, c, &|_| keep_all, None);
            let fs = mount(Arc::new(again))
                .map_err(|e| format!("mount after a crash at op {c} of recovery (keep all: {keep_all}) failed: {e}"))?;
            let got =
                snapshot(&fs, &[]).map_err(|e| format!("walking the tree after a crash at op {c} of recovery: {e}"))?;
            if got != want {
                return Err(format!(
                    "a crash at op {c} of {} of recovery (keep all: {keep_all}) changes the result: {}",
                    ops.len(),
                    describe_diff(&want, &got)
                ));
            }
        }
    }
    Ok(())
}

/// The offline checker (read-only: it replays the log into memory) finds nothing wrong.
fn fsck_clean(dev: &dyn BlockDevice) -> Checked {
    let report = ferrofs::fsck::check(dev, &ferrofs::fsck::FsckOptions { repair: false }, &|_, _, _| {})
        .map_err(|e| format!("fsck failed: {e}"))?;
    if report.is_clean() {
        Ok(())
    } else {
        Err(format!("fsck: {} errors: {:?}", report.errors_found, report.messages))
    }
}

fn meta_distance(a: &State, b: &State) -> usize {
    let inos: BTreeSet<&u64> = a.meta.keys().chain(b.meta.keys()).collect();
    inos.into_iter().filter(|i| a.meta.get(i) != b.meta.get(i)).count()
}

fn describe_diff(want: &State, got: &State) -> String {
    let inos: BTreeSet<&u64> = want.meta.keys().chain(got.meta.keys()).collect();
    let diffs: Vec<String> = inos
        .into_iter()
        .filter(|i| want.meta.get(i) != got.meta.get(i))
        .take(3)
        .map(|i| format!("inode {i}: state {:?} / recovered {:?}", want.meta.get(i), got.meta.get(i)))
        .collect();
    diffs.join("; ")
}

fn remove_tree(fs: &FileSystem, dir: u64) -> Result<()> {
    for e in readdir(fs, dir)? {
        if e.name == b"." || e.name == b".." {
            continue;
        }
        if e.kind == FileType::Directory {
            remove_tree(fs, e.ino)?;
            fs.rmdir(dir, &e.name)?;
        } else {
            fs.unlink(dir, &e.name)?;
        }
    }
    Ok(())
}

/// How many crash images to try per crash point.
#[derive(Clone, Copy)]
struct Budget {
    /// Random keep-subsets per point.
    random: usize,
    /// Also every single-write keep-set when the epoch has at most this many writes.
    singles_up_to: usize,
    /// Torn variants per point.
    torn: usize,
}

/// Check every crash image the budget allows for one recorded workload. Returns the number
/// of crash states checked and the failures (with everything needed to replay them).
fn check_all_points(
    base: &MemDevice,
    ops: &[DevOp],
    hist: &History,
    seed: u64,
    budget: Budget,
) -> (usize, Vec<String>) {
    let mut checked = 0;
    let mut failures = Vec::new();
    let mut rng = StdRng::seed_from_u64(seed);
    for c in crash_points(ops) {
        let epoch = unflushed_epoch(ops, c);
        let mut cases: Vec<CrashCase> = keep_sets(ops, c, seed ^ c as u64, budget.random)
            .into_iter()
            .enumerate()
            .filter(|(i, s)| *i < 2 || epoch.len() <= budget.singles_up_to || s.len() != 1)
            .map(|(_, keep)| CrashCase { point: c, keep, tear: None })
            .collect();
        let writes: Vec<usize> = epoch.clone().filter(|&i| matches!(ops[i], DevOp::Write { .. })).collect();
        for t in 0..budget.torn.min(writes.len()) {
            // The last write of the epoch (a log record or a header, typically), then random ones.
            let op = if t == 0 { *writes.last().unwrap() } else { writes[rng.gen_range(0..writes.len())] };
            let keep = epoch.clone().filter(|_| t == 0 || rng.gen_bool(0.5)).collect();
            cases.push(CrashCase { point: c, keep, tear: Some(Tear { op, sectors: rng.gen() }) });
        }
        for (n, case) in cases.iter().enumerate() {
            let image = crash_image_torn(base, ops, c, &|i| case.keep.contains(&i), case.tear);
            let thorough = n < 2 && case.tear.is_none();
            let r = catch_unwind(AssertUnwindSafe(|| {
                if thorough {
                    check_recovery_crashes(&image)?;
                }
                check_crash(image, case, hist, thorough)
            }))
            .unwrap_or_else(|p| Err(format!("panic: {}", panic_message(&p))));
            checked += 1;
            if let Err(e) = r {
                failures.push(format!(
                    "crash at op {} of {} (keep {:?}, tear {:?}): {e}",
                    c,
                    ops.len(),
                    case.keep,
                    case.tear
                ));
            }
        }
    }
    (checked, failures)
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

// ---------------------------------------------------------------------------------------
// The operation vocabulary of the exhaustive workloads
// ---------------------------------------------------------------------------------------

/// The image every short workload starts from (made once, unmounted cleanly):
/// ```text
/// /d1/f   8192 bytes, xattr user.x      /d1/g  100 bytes       /d2/h  3000 bytes
/// /d3/    empty                          /d4/   empty           /d5/x  (non-empty dir)
/// /s -> d1/f
/// ```
fn base_image() -> &'static MemDevice {
    static B: OnceLock<MemDevice> = OnceLock::new();
    B.get_or_init(|| {
        let dev = Arc::new(MemDevice::new(IMAGE_SIZE));
        FileSystem::mkfs(&*dev, &mkfs_options()).unwrap();
        let fs = mount(dev.clone()).unwrap();
        for d in ["/d1", "/d2", "/d3", "/d4", "/d5"] {
            fs.create_dir_all(d, 0o755, CRED).unwrap();
        }
        fs.write_file("/d1/f", &pattern(8192, 1), CRED).unwrap();
        fs.write_file("/d1/g", &pattern(100, 2), CRED).unwrap();
        fs.write_file("/d2/h", &pattern(3000, 3), CRED).unwrap();
        fs.write_file("/d5/x", b"x", CRED).unwrap();
        fs.symlink(ROOT, b"s", b"d1/f", CRED).unwrap();
        let f = fs.resolve("/d1/f").unwrap().ino;
        fs.setxattr(f, b"user.x", b"small", 0).unwrap();
        fs.unmount().unwrap();
        drop(fs);
        Arc::try_unwrap(dev).ok().unwrap()
    })
}

/// One API call on the base tree; returns the inode to fsync afterwards.
struct Step {
    name: &'static str,
    run: fn(&mut Run) -> u64,
}

/// The inode at `path`, or the root when an earlier step removed or renamed it (the step
/// then works on the root, or fails: both are recorded like any other call).
fn ino_of(r: &Run, path: &str) -> u64 {
    r.lookup(path).unwrap_or(ROOT)
}

const STEPS: &[Step] = &[
    Step {
        name: "create",
        run: |r| {
            let d = ino_of(r, "/d1");
            r.call("create /d1/new", |fs| fs.create(d, b"new", 0o644, CRED).map(|a| a.ino)).unwrap_or(ROOT)
        },
    },
    Step {
        name: "append",
        run: |r| {
            let f = ino_of(r, "/d1/f");
            let _ = r.call("append 5000 to /d1/f", |fs| {
                let size = fs.getattr(f)?.size;
                fs.write(f, size, &pattern(5000, 11))
            });
            f
        },
    },
    Step {
        name: "overwrite",
        run: |r| {
            let f = ino_of(r, "/d1/f");
            let _ = r.call("write 100 at 10 in /d1/f", |fs| fs.write(f, 10, &pattern(100, 12)));
            f
        },
    },
    Step {
        name: "overwrite-extend",
        run: |r| {
            let f = ino_of(r, "/d2/h");
            let _ = r.call("write 8192 at 0 in /d2/h", |fs| fs.write(f, 0, &pattern(8192, 13)));
            f
        },
    },
    Step {
        name: "truncate-grow",
        run: |r| {
            let f = ino_of(r, "/d1/g");
            let _ = r.call("truncate /d1/g to 20000", |fs| {
                fs.setattr(f, &SetAttr { size: Some(20000), ..Default::default() }).map(|a| a.size)
            });
            f
        },
    },
    Step {
        name: "truncate-shrink",
        run: |r| {
            let f = ino_of(r, "/d1/f");
            let _ = r.call("truncate /d1/f to 100", |fs| {
                fs.setattr(f, &SetAttr { size: Some(100), ..Default::default() }).map(|a| a.size)
            });
            f
        },
    },
    Step {
        name: "link",
        run: |r| {
            let (f, d) = (ino_of(r, "/d1/f"), ino_of(r, "/d2"));
            let _ = r.call("link /d1/f /d2/f2", |fs| fs.link(f, d, b"f2").map(|a| a.nlink));
            f
        },
    },
    Step {
        name: "unlink",
        run: |r| {
            let d = ino_of(r, "/d1");
            let _ = r.call("unlink /d1/g", |fs| fs.unlink(d, b"g"));
            d
        },
    },
    Step {
        name: "rename",
        run: |r| {
            let (f, a, b) = (ino_of(r, "/d1/f"), ino_of(r, "/d1"), ino_of(r, "/d2"));
            let _ = r.call("rename /d1/f /d2/f", |fs| fs.rename(a, b"f", b, b"f", 0));
            f
        },
    },
    Step {
        name: "rename-replace",
        run: |r| {
            let (f, a, b) = (ino_of(r, "/d1/g"), ino_of(r, "/d1"), ino_of(r, "/d2"));
            let _ = r.call("rename /d1/g /d2/h", |fs| fs.rename(a, b"g", b, b"h", 0));
            f
        },
    },
    Step {
        name: "rename-exchange",
        run: |r| {
            let (f, a, b) = (ino_of(r, "/d1/f"), ino_of(r, "/d1"), ino_of(r, "/d2"));
            let _ = r.call("exchange /d1/f /d2/h", |fs| fs.rename(a, b"f", b, b"h", RENAME_EXCHANGE));
            f
        },
    },
    Step {
        name: "rename-dir",
        run: |r| {
            let (d, a) = (ino_of(r, "/d3"), ino_of(r, "/d1"));
            let _ = r.call("rename /d3 /d1/d3", |fs| fs.rename(ROOT, b"d3", a, b"d3", 0));
            d
        },
    },
    Step {
        name: "rename-dir-replace",
        run: |r| {
            let d = ino_of(r, "/d4");
            let _ = r.call("rename /d4 /d3", |fs| fs.rename(ROOT, b"d4", ROOT, b"d3", 0));
            d
        },
    },
    Step {
        name: "mkdir",
        run: |r| {
            let d = ino_of(r, "/d2");
            r.call("mkdir /d2/sub", |fs| fs.mkdir(d, b"sub", 0o755, CRED).map(|a| a.ino)).unwrap_or(d)
        },
    },
    Step {
        name: "rmdir",
        run: |r| {
            let _ = r.call("rmdir /d3", |fs| fs.rmdir(ROOT, b"d3"));
            ROOT
        },
    },
    Step {
        name: "symlink",
        run: |r| {
            let d = ino_of(r, "/d2");
            r.call("symlink /d2/s2", |fs| fs.symlink(d, b"s2", &[b'z'; 200], CRED).map(|a| a.ino)).unwrap_or(d)
        },
    },
    Step {
        name: "setxattr-tree",
        run: |r| {
            let f = ino_of(r, "/d1/f");
            let _ =
                r.call("setxattr /d1/f user.big", |fs| fs.setxattr(f, b"user.big", &pattern(900, 14), XATTR_CREATE));
            f
        },
    },
    Step {
        name: "setxattr-inline",
        run: |r| {
            let f = ino_of(r, "/d2/h");
            let _ = r.call("setxattr /d2/h user.y", |fs| fs.setxattr(f, b"user.y", b"v", 0));
            f
        },
    },
    Step {
        name: "setxattr-remote",
        run: |r| {
            let f = ino_of(r, "/d1/f");
            let _ = r.call("setxattr /d1/f user.x 9000", |fs| fs.setxattr(f, b"user.x", &pattern(9000, 15), 0));
            f
        },
    },
    Step {
        // A file made privileged, then written by someone who may not keep that: the drop
        // and the write are two transactions, and no state may show the write without it.
        name: "write-dropping-privileges",
        run: |r| {
            let f = ino_of(r, "/d2/h");
            let caps = [1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            let _ = r.call("chmod 6755 /d2/h", |fs| {
                fs.setattr(f, &SetAttr { mode: Some(0o6755), ..Default::default() }).map(|a| a.perm)
            });
            let _ = r.call("setxattr /d2/h security.capability", |fs| fs.setxattr(f, b"security.capability", &caps, 0));
            let _ = r.call("drop privileges of /d2/h", |fs| fs.drop_privileges(f, PrivDrop::CapabilitiesAndSetId));
            let _ = r.call("append 5000 to /d2/h", |fs| fs.write(f, 3000, &pattern(5000, 16)));
            f
        },
    },
    Step {
        name: "removexattr",
        run: |r| {
            let f = ino_of(r, "/d1/f");
            let _ = r.call("removexattr /d1/f user.x", |fs| fs.removexattr(f, b"user.x"));
            f
        },
    },
];

#[derive(Clone, Copy, Debug)]
enum After {
    Fsync,
    Fdatasync,
    Sync,
}
const AFTERS: [After; 3] = [After::Fsync, After::Fdatasync, After::Sync];

/// Run `steps` (each followed by its durability call) from the base image.
fn run_steps(steps: &[(usize, After)]) -> (Vec<DevOp>, History) {
    let mut r = Run::start(base_image());
    for &(s, after) in steps {
        let target = (STEPS[s].run)(&mut r);
        match after {
            After::Fsync => r.fsync(target, false),
            After::Fdatasync => r.fsync(target, true),
            After::Sync => r.sync(),
        }
    }
    r.finish()
}

fn describe(steps: &[(usize, After)]) -> String {
    steps.iter().map(|&(s, a)| format!("{}+{a:?}", STEPS[s].name)).collect::<Vec<_>>().join(", ")
}

/// Every sequence of `len` steps, spread over the available cores. `CRASH_SLICE=k/n` runs
/// only the workloads whose number is k modulo n, so a long run can be split over machines
/// or sessions (the n slices together are the whole run).
fn exhaustive(len: u32, budget: Budget) {
    let per = STEPS.len() * AFTERS.len();
    let (slice, slices) = std::env::var("CRASH_SLICE")
        .ok()
        .map(|v| {
            let (k, n) = v
                .split_once('/')
                .and_then(|(k, n)| Some((k.parse::<usize>().ok()?, n.parse::<usize>().ok()?)))
                .filter(|&(k, n)| k < n)
                .unwrap_or_else(|| panic!("CRASH_SLICE={v}: want k/n with k < n"));
            (k, n)
        })
        .unwrap_or((0, 1));
    let total = per.pow(len);
    let checked = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let n = next.fetch_add(1, Ordering::Relaxed) * slices + slice;
                if n >= total {
                    return;
                }
                let steps: Vec<(usize, After)> = (0..len)
                    .map(|i| (n / per.pow(i)) % per)
                    .map(|x| (x / AFTERS.len(), AFTERS[x % AFTERS.len()]))
                    .collect();
                let (ops, hist) = run_steps(&steps);
                let (c, f) = check_all_points(base_image(), &ops, &hist, n as u64, budget);
                checked.fetch_add(c, Ordering::Relaxed);
                if !f.is_empty() {
                    let mut all = failures.lock().unwrap();
                    all.push(format!("[{}] calls {:?}:\n    {}", describe(&steps), hist.calls, f.join("\n    ")));
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    let ran = (total + slices - 1 - slice) / slices;
    println!("{ran} of {total} workloads of {len} steps (slice {slice}/{slices}), {} crash states checked, {} workloads failed", checked.load(Ordering::Relaxed), failures.len());
    assert!(
        failures.is_empty(),
        "{} of {ran} workloads failed; first ones:\n{}",
        failures.len(),
        failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
}

#[test]
fn crash_every_sequence_of_up_to_two_steps() {
    let budget = Budget { random: 2, singles_up_to: 3, torn: 1 };
    exhaustive(1, Budget { random: 6, singles_up_to: 64, torn: 3 });
    exhaustive(2, budget);
}

#[test]
#[ignore = "long: every sequence of three steps (run with --ignored --nocapture)"]
fn crash_every_sequence_of_three_steps() {
    exhaustive(3, Budget { random: 2, singles_up_to: 3, torn: 1 });
}

/// Fail with the workload's calls and its first failures, if it has any.
fn assert_no_failures(what: &str, failures: &[String], hist: &History) {
    assert!(
        failures.is_empty(),
        "{what}: {} failures; calls {:#?}\nfirst: {}",
        failures.len(),
        hist.calls,
        failures.iter().take(5).cloned().collect::<Vec<_>>().join("\n")
    );
}

/// The base image plus two files of 300 one-byte extents (every other block), /d5/a and
/// /d5/b (names the random workload uses): truncating or reaping either frees its blocks in
/// two transactions (`UNMAP_BATCH` extents each), which the other workloads never do.
fn fragmented_image() -> &'static MemDevice {
    static B: OnceLock<MemDevice> = OnceLock::new();
    B.get_or_init(|| {
        let dev = Arc::new(base_image().snapshot());
        let fs = mount(dev.clone()).unwrap();
        let d5 = fs.resolve("/d5").unwrap().ino;
        for name in [&b"a"[..], b"b"] {
            let f = fs.create(d5, name, 0o644, CRED).unwrap().ino;
            for k in 0..300u64 {
                fs.write(f, 2 * k * 4096, &[k as u8 | 1]).unwrap();
            }
        }
        fs.unmount().unwrap();
        drop(fs);
        Arc::try_unwrap(dev).ok().unwrap()
    })
}

/// Multi-transaction truncate and reap, with a checkpoint before every transaction so that
/// crash points fall between the batches: recovery must finish the truncate (orphan
/// processing) to exactly the state the call produced, mode change included, and free an
/// unlinked file whose reaping a crash cut short, leaking nothing.
#[test]
fn crash_between_the_batches_of_a_truncate_and_of_a_reap() {
    let base = fragmented_image();
    let mut r = Run::start_with(base, &checkpoint_every_transaction());
    let (d5, f, g) = (r.lookup("/d5").unwrap(), r.lookup("/d5/a").unwrap(), r.lookup("/d5/b").unwrap());
    let commits = |r: &Run| r.fs.mount().journal.commits();
    let before = commits(&r);
    r.call("truncate /d5/a to 50, mode 600", |fs| {
        fs.setattr(f, &SetAttr { size: Some(50), mode: Some(0o600), ..Default::default() }).map(|a| a.size)
    })
    .unwrap();
    assert!(commits(&r) - before >= 2, "the truncate took one transaction: the test no longer crosses a batch");
    r.fsync(f, false);
    r.fs.open(g).unwrap();
    r.open.push(g);
    r.call("unlink /d5/b (open)", |fs| fs.unlink(d5, b"b")).unwrap();
    r.fsync(d5, false);
    r.open.clear();
    let before = commits(&r);
    r.call("release /d5/b", |fs| fs.release(g)).unwrap();
    assert!(commits(&r) - before >= 2, "the reap took one transaction: the test no longer crosses a batch");
    r.sync();
    let (ops, hist) = r.finish();
    let (checked, failures) =
        check_all_points(base, &ops, &hist, 0xba7c, Budget { random: 6, singles_up_to: 64, torn: 3 });
    println!("{} device ops, {checked} crash states checked", ops.len());
    assert_no_failures("crash_between_the_batches_of_a_truncate_and_of_a_reap", &failures, &hist);
}

/// What overlayfs asks of its upper file system: an O_TMPFILE file that is never named
/// (a crash must free it, or the leak check fails), one named by `link` and fsynced (a
/// crash after the fsync must keep it, with its data), and a rename that leaves a
/// whiteout at the source name in the same transaction. Every crash point is checked.
#[test]
fn crash_tmpfiles_and_a_rename_with_whiteout() {
    let base = base_image();
    let mut r = Run::start_with(base, &checkpoint_every_transaction());
    let (d1, d2) = (r.lookup("/d1").unwrap(), r.lookup("/d2").unwrap());
    let unnamed = r.call("tmpfile in /d1", |fs| fs.tmpfile(d1, 0o600, CRED, true).map(|a| a.ino)).unwrap();
    r.open.push(unnamed);
    r.call("write 6000 to the unnamed tmpfile", |fs| fs.write(unnamed, 0, &pattern(6000, 21))).unwrap();
    r.fsync(unnamed, false);
    let named = r.call("tmpfile in /d2", |fs| fs.tmpfile(d2, 0o644, CRED, true).map(|a| a.ino)).unwrap();
    r.open.push(named);
    r.call("write 5000 to the named tmpfile", |fs| fs.write(named, 0, &pattern(5000, 22))).unwrap();
    r.call("link it as /d2/t", |fs| fs.link(named, d2, b"t").map(|a| a.nlink)).unwrap();
    r.fsync(named, false);
    r.call("rename /d1/g /d2/g with a whiteout", |fs| fs.rename(d1, b"g", d2, b"g", RENAME_WHITEOUT)).unwrap();
    r.fsync(d1, false);
    r.open.clear();
    r.call("release the unnamed tmpfile", |fs| fs.release(unnamed)).unwrap();
    r.call("release /d2/t", |fs| fs.release(named)).unwrap();
    r.sync();
    let (ops, hist) = r.finish();
    let (checked, failures) =
        check_all_points(base, &ops, &hist, 0x7e4f, Budget { random: 4, singles_up_to: 32, torn: 2 });
    println!("{} device ops, {checked} crash states checked", ops.len());
    assert_no_failures("crash_tmpfiles_and_a_rename_with_whiteout", &failures, &hist);
}

/// The same promises stated directly: after a crash (the device as it was, nothing
/// unmounted) the fsynced-and-linked tmpfile is at its name with its data, the other one
/// is gone and its inode and blocks are free again.
#[test]
fn a_crash_frees_an_unnamed_tmpfile_and_keeps_a_linked_one() {
    let dev = Arc::new(MemDevice::new(IMAGE_SIZE));
    FileSystem::mkfs(&*dev, &mkfs_options()).unwrap();
    let fs = mount(dev.clone()).unwrap();
    let (before, root_before) = (fs.statfs(), fs.getattr(ROOT).unwrap());
    let unnamed = fs.tmpfile(ROOT, 0o600, CRED, true).unwrap().ino;
    fs.write(unnamed, 0, &pattern(40_000, 5)).unwrap();
    fs.fsync(unnamed, false).unwrap();
    let named = fs.tmpfile(ROOT, 0o600, CRED, true).unwrap().ino;
    fs.write(named, 0, &pattern(9000, 6)).unwrap();
    fs.link(named, ROOT, b"kept").unwrap();
    fs.fsync(named, false).unwrap();
    let crashed = mount(Arc::new(dev.snapshot())).unwrap();
    assert!(crashed.getattr(unnamed).is_err(), "the unnamed tmpfile outlived the crash");
    let kept = crashed.lookup(ROOT, b"kept").unwrap();
    assert_eq!((kept.ino, kept.nlink), (named, 1));
    assert_eq!(crashed.read(named, 0, 9000).unwrap(), pattern(9000, 6));
    // Blocks freed by the recovery count as free once that is durable.
    crashed.sync().unwrap();
    let after = crashed.statfs();
    assert_eq!(after.ffree, before.ffree - 1, "only the linked tmpfile holds an inode");
    // stat's blocks are 512-byte units.
    let grown = (kept.blocks + crashed.getattr(ROOT).unwrap().blocks - root_before.blocks) / 8;
    assert_eq!(grown, 4, "the kept file's 3 blocks and a directory block");
    assert_eq!(after.bfree, before.bfree - grown, "only the linked tmpfile and its name hold blocks");
    crashed.unmount().unwrap();
    drop(crashed);
    let image = dev.snapshot();
    fsck_clean(&image).unwrap();
}

/// Collapse and insert ranges of a 300-extent file (a B+tree), each moving up to a hundred
/// extents in one transaction, with a checkpoint before every transaction: every crash
/// point must show the file shifted or untouched, the collapsed blocks freed or still owned.
#[test]
fn crash_during_collapse_and_insert_range() {
    let base = fragmented_image();
    let mut r = Run::start_with(base, &checkpoint_every_transaction());
    let f = r.lookup("/d5/a").unwrap();
    let shifts = [
        (FALLOC_FL_COLLAPSE_RANGE, 500, 3),
        (FALLOC_FL_INSERT_RANGE, 401, 2),
        (FALLOC_FL_COLLAPSE_RANGE, 398, 6),
        (FALLOC_FL_INSERT_RANGE, 450, 1),
    ];
    for (mode, at, blocks) in shifts {
        let (off, len) = (at * 4096, blocks * 4096);
        // Counted inside the call: the harness's walk after it reads files, which sets atimes.
        let commits = r.call(&format!("fallocate /d5/a mode {mode} {len} at {off}"), |fs| {
            let before = fs.mount().journal.commits();
            fs.fallocate(f, off, len, mode)?;
            Ok(fs.mount().journal.commits() - before)
        });
        assert_eq!(commits.unwrap(), 1, "the shift took more than one transaction");
        r.fsync(f, false);
    }
    let (ops, hist) = r.finish();
    let (checked, failures) =
        check_all_points(base, &ops, &hist, 0x5817, Budget { random: 6, singles_up_to: 64, torn: 3 });
    println!("{} device ops, {checked} crash states checked", ops.len());
    assert_no_failures("crash_during_collapse_and_insert_range", &failures, &hist);
}

/// A write in place over blocks that a collapse or insert range has just moved, with no
/// fsync between: every crash point must show the write at the offset it was made at, or
/// not at all. Written before the shift was durable, it would show at the blocks' old
/// offsets after a crash that lost the shift, a state the file never had (found by the
/// random workload with background checkpoints: a collapse, then a write at 0).
#[test]
fn crash_after_writes_over_blocks_a_shift_moved() {
    let base = base_image();
    let mut r = Run::start(base);
    let d3 = r.lookup("/d3").unwrap();
    let f = r.call("create /d3/s", |fs| fs.create(d3, b"s", 0o644, CRED).map(|a| a.ino)).unwrap();
    r.call("write 16384 at 0", |fs| fs.write(f, 0, &pattern(16384, 10))).unwrap();
    r.fsync(f, false);
    r.call("collapse 4096 at 0", |fs| fs.fallocate(f, 0, 4096, FALLOC_FL_COLLAPSE_RANGE)).unwrap();
    r.call("write 3000 at 0", |fs| fs.write(f, 0, &pattern(3000, 20))).unwrap();
    r.call("insert 4096 at 4096", |fs| fs.fallocate(f, 4096, 4096, FALLOC_FL_INSERT_RANGE)).unwrap();
    r.call("write 3000 at 8192", |fs| fs.write(f, 8192, &pattern(3000, 30))).unwrap();
    let (ops, hist) = r.finish();
    let (checked, failures) =
        check_all_points(base, &ops, &hist, 0x5818, Budget { random: 6, singles_up_to: 64, torn: 3 });
    println!("{} device ops, {checked} crash states checked", ops.len());
    assert_no_failures("crash_after_writes_over_blocks_a_shift_moved", &failures, &hist);
}

/// `-o discard`: `rm -rf` of /d5/* (two files of 300 extents) and /d1/*, synced, so the
/// discards of their blocks are punched; then new files take the freed space and are fsynced,
/// and /d2/h is unlinked and synced. At every crash point, the punches that persisted
/// included, recovery is clean and no surviving file reads back zeros where it had data.
#[test]
fn crash_after_a_discard_mounted_rm_rf() {
    let base = fragmented_image();
    let mut r = Run::start_with(base, &MountOptions { discard: true, ..checkpoint_every_transaction() });
    let (d1, d3, d5) = (r.lookup("/d1").unwrap(), r.lookup("/d3").unwrap(), r.lookup("/d5").unwrap());
    // One call per unlink: the harness knows the states between calls, and a checkpoint
    // before every transaction makes each of them durable on its own.
    for (dir, name) in [(d5, &b"a"[..]), (d5, b"b"), (d5, b"x"), (d1, b"f"), (d1, b"g")] {
        r.call(&format!("unlink {}", String::from_utf8_lossy(name)), |fs| fs.unlink(dir, name)).unwrap();
    }
    r.sync();
    let punched = |r: &Run| r.dev.ops().iter().filter(|op| matches!(op, DevOp::Punch { .. })).count();
    assert!(punched(&r) > 0, "the sync after rm -rf punched nothing");
    for (i, name) in [&b"n0"[..], b"n1", b"n2"].into_iter().enumerate() {
        let f = r.call("create in /d3", |fs| fs.create(d3, name, 0o644, CRED).map(|a| a.ino)).unwrap();
        r.call("write 40000", |fs| fs.write(f, 0, &pattern(40000, 40 + i as u8))).unwrap();
        r.fsync(f, false);
    }
    let d2 = r.lookup("/d2").unwrap();
    r.call("unlink /d2/h", |fs| fs.unlink(d2, b"h")).unwrap();
    r.sync();
    let (ops, hist) = r.finish();
    let (checked, failures) =
        check_all_points(base, &ops, &hist, 0xd15c, Budget { random: 4, singles_up_to: 32, torn: 2 });
    println!("{} device ops, {checked} crash states checked", ops.len());
    assert_no_failures("crash_after_a_discard_mounted_rm_rf", &failures, &hist);
}

/// The random workloads under `-o discard`, with a checkpoint before every transaction: the
/// discard thread punches beside the calls. Environment as above.
#[test]
fn crash_random_workload_with_discard() {
    random_workloads(base_image(), 0xd5_0001, || MountOptions { discard: true, ..checkpoint_every_transaction() });
}

// ---------------------------------------------------------------------------------------
// A longer random workload with unlinked-open files
// ---------------------------------------------------------------------------------------

/// `calls` random calls on a small namespace, with open handles kept across unlinks,
/// fsyncs and syncs mixed in; deterministic per seed.
fn random_workload(base: &MemDevice, seed: u64, calls: usize, opts: &MountOptions) -> (Vec<DevOp>, History) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut r = Run::start_with(base, opts);
    let names: [&[u8]; 4] = [b"a", b"b", b"c", b"d"];
    for i in 0..calls {
        let dirs: Vec<u64> = ["/", "/d1", "/d2", "/d5"].iter().filter_map(|p| r.lookup(p)).collect();
        let d = dirs[rng.gen_range(0..dirs.len())];
        let d2 = dirs[rng.gen_range(0..dirs.len())];
        let name = names[rng.gen_range(0..names.len())];
        let name2 = names[rng.gen_range(0..names.len())];
        let target = r.fs.lookup(d, name).ok().map(|a| a.ino);
        let file =
            if !r.open.is_empty() && rng.gen_bool(0.4) { Some(r.open[rng.gen_range(0..r.open.len())]) } else { target };
        let seed8 = i as u8;
        match rng.gen_range(0..16) {
            0 | 1 => drop(r.call("create", |fs| fs.create(d, name, 0o644, CRED).map(|a| a.ino))),
            2 => drop(r.call("mkdir", |fs| fs.mkdir(d, name, 0o755, CRED).map(|a| a.ino))),
            3 | 4 => {
                if let Some(f) = file {
                    let (off, len) =
                        ([0u64, 100, 4096, 20000][rng.gen_range(0..4)], [10usize, 3000, 9000][rng.gen_range(0..3)]);
                    let _ =
                        r.call(&format!("write {len} at {off} to {f}"), |fs| fs.write(f, off, &pattern(len, seed8)));
                }
            }
            5 => {
                if let Some(f) = file {
                    let size = [0u64, 50, 5000, 30000][rng.gen_range(0..4)];
                    let _ = r.call(&format!("truncate {f} to {size}"), |fs| {
                        fs.setattr(f, &SetAttr { size: Some(size), ..Default::default() }).map(|a| a.size)
                    });
                }
            }
            6 => drop(r.call("unlink", |fs| fs.unlink(d, name))),
            7 => drop(r.call("rmdir", |fs| fs.rmdir(d, name))),
            8 => {
                let flags = [0, 0, RENAME_NOREPLACE, RENAME_EXCHANGE][rng.gen_range(0..4)];
                let _ = r.call("rename", |fs| fs.rename(d, name, d2, name2, flags));
            }
            9 => {
                if let Some(f) = file {
                    let _ = r.call("link", |fs| fs.link(f, d2, name2).map(|a| a.nlink));
                }
            }
            10 => {
                if let Some(f) = target {
                    if r.fs.open(f).is_ok() {
                        r.open.push(f);
                    }
                }
            }
            11 => {
                if !r.open.is_empty() {
                    let f = r.open.swap_remove(rng.gen_range(0..r.open.len()));
                    let _ = r.call(&format!("release {f}"), |fs| fs.release(f));
                }
            }
            12 => {
                if let Some(f) = file {
                    let len = [3usize, 300, 1000, 9000][rng.gen_range(0..4)];
                    let _ = r.call("setxattr", |fs| fs.setxattr(f, b"user.r", &pattern(len, seed8), 0));
                }
            }
            14 => {
                if let Some(f) = file {
                    // Preallocate (within or past the end, or growing the file), punch a
                    // hole, zero a range: a crash must show the range as unwritten zeros or
                    // not at all. Or collapse or insert a range.
                    let zero = FALLOC_FL_ZERO_RANGE;
                    let (collapse, insert) = (FALLOC_FL_COLLAPSE_RANGE, FALLOC_FL_INSERT_RANGE);
                    let mode = [
                        0,
                        FALLOC_FL_KEEP_SIZE,
                        FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                        zero,
                        zero | FALLOC_FL_KEEP_SIZE,
                        collapse,
                        insert,
                    ][rng.gen_range(0..7)];
                    let (off, len) = if mode == collapse || mode == insert {
                        // Whole blocks; a crash must show the file shifted or not at all,
                        // which holds for a file that shifts in one transaction (up to 256
                        // extents to move): not the fragmented files of 300 extents.
                        // A block inside the file, so that most succeed (a collapse must end
                        // before EOF).
                        let Some(attr) = r.fs.getattr(f).ok().filter(|a| a.blocks / 8 < 200) else { continue };
                        let inside = if mode == collapse { attr.size / 4096 } else { attr.size.div_ceil(4096) };
                        (
                            rng.gen_range(0..inside.max(1)) * 4096,
                            if mode == collapse { 4096 } else { [4096u64, 8192][rng.gen_range(0..2)] },
                        )
                    } else {
                        ([0u64, 3000, 16384][rng.gen_range(0..3)], [5000u64, 40000][rng.gen_range(0..2)])
                    };
                    let _ = r.call(&format!("fallocate {f} mode {mode} {len} at {off}"), |fs| {
                        fs.fallocate(f, off, len, mode)
                    });
                }
            }
            _ => {
                if let Some(f) = file {
                    r.fsync(f, rng.gen_bool(0.3));
                }
            }
        }
        if rng.gen_ratio(1, 25) {
            r.sync();
        }
    }
    r.finish()
}

/// Random workloads: `CRASH_SEED` picks the first seed (printed), `CRASH_RUNS` how many
/// consecutive seeds run (default 4), `CRASH_CALLS` the calls per workload (default 400).
#[test]
fn crash_random_workload_with_unlinked_open_files() {
    random_workloads(base_image(), 0x5eed_0001, mount_options);
}

/// The random workloads with the journal's background threads on and pushed hard: a
/// checkpoint requested by every commit that logs a block and at least every 2 ms,
/// writeback from 5% of the log or once 16 KiB of newest images are held. Checkpoints and
/// writeback then run beside the calls, at points the calls do not choose (the other crash tests run without those threads, for a
/// recorded order that a seed replays exactly; here the order is the scheduler's, so a
/// failing seed may not fail again: its message has the calls and the crash point).
/// Environment as above.
#[test]
fn crash_random_workload_with_background_checkpoints() {
    fn background_pushed_hard() -> MountOptions {
        let mut cfg = stock_journal();
        cfg.cil_push_bytes = 4 << 10;
        cfg.push_interval = std::time::Duration::from_millis(2);
        cfg.ail_push_percent = 5;
        cfg.ail_held_max_bytes = 16 << 10;
        cfg.record_piece_bytes = BLOCK_SIZE;
        MountOptions { read_only: false, journal: Some(cfg), ..MountOptions::default() }
    }
    random_workloads(base_image(), 0xb9_0001, background_pushed_hard);
}

/// The random workloads with a checkpoint before every transaction
/// ([`checkpoint_every_transaction`]): deterministically, the check the background test
/// makes by chance. Environment as above.
#[test]
fn crash_random_workload_checkpointing_every_transaction() {
    random_workloads(base_image(), 0xc7_0001, checkpoint_every_transaction);
}

/// The same, from an image where two of the names the workload uses are files of 300
/// extents ([`fragmented_image`]): its truncates, unlinks and renames over them free blocks
/// in several transactions, with a checkpoint before each. Environment as above.
#[test]
fn crash_random_workload_on_fragmented_files() {
    random_workloads(fragmented_image(), 0xf7_0001, checkpoint_every_transaction);
}

/// The same with caches far too small for the tree (a 48 KiB budget): inodes and blocks
/// written home are dropped and read back between the calls, and relogged with log versions
/// that restart, all with a checkpoint before every transaction, and transactions throttled
/// to write the whole log home (the budget is over its limit nearly always).
/// Environment as above.
#[test]
fn crash_random_workload_with_tiny_cache() {
    use ferrofs::cache::CacheBudget;
    static BUDGETS: Mutex<Vec<Arc<CacheBudget>>> = Mutex::new(Vec::new());
    fn tiny_cache() -> MountOptions {
        let budget = CacheBudget::new(48 << 10);
        BUDGETS.lock().unwrap().push(budget.clone());
        MountOptions { cache: Some(budget), ..checkpoint_every_transaction() }
    }
    random_workloads(base_image(), 0x7c_0001, tiny_cache);
    let sum = |f: fn(&CacheBudget) -> &std::sync::atomic::AtomicU64| -> u64 {
        BUDGETS.lock().unwrap().iter().map(|b| f(b).load(Ordering::Relaxed)).sum()
    };
    let (reclaimed, throttles) = (sum(|b| &b.stats.reclaimed_bytes), sum(|b| &b.stats.throttles));
    println!("{reclaimed} bytes reclaimed, {throttles} transactions throttled");
    assert!(reclaimed > 0, "the workloads never reclaimed anything");
    assert!(throttles > 0, "no transaction was throttled to write the log home");
}

/// `opts` gives every workload options of its own (a cache budget is not shared).
fn random_workloads(base: &MemDevice, default_seed: u64, opts: fn() -> MountOptions) {
    let env = |k: &str, d: u64| std::env::var(k).ok().and_then(|s| s.parse().ok()).unwrap_or(d);
    let (first, runs, calls) = (env("CRASH_SEED", default_seed), env("CRASH_RUNS", 4), env("CRASH_CALLS", 400));
    let total = AtomicUsize::new(0);
    std::thread::scope(|s| {
        let handles: Vec<_> = (first..first + runs)
            .map(|seed| {
                let total = &total;
                s.spawn(move || {
                    let (ops, hist) = random_workload(base, seed, calls as usize, &opts());
                    let (checked, failures) =
                        check_all_points(base, &ops, &hist, seed, Budget { random: 2, singles_up_to: 3, torn: 1 });
                    println!("CRASH_SEED={seed}: {} device ops, {checked} crash states checked", ops.len());
                    total.fetch_add(checked, Ordering::Relaxed);
                    assert_no_failures(&format!("CRASH_SEED={seed}"), &failures, &hist);
                })
            })
            .collect();
        for h in handles {
            if let Err(p) = h.join() {
                std::panic::resume_unwind(p);
            }
        }
    });
    println!("{} crash states checked in all", total.load(Ordering::Relaxed));
}

// ---------------------------------------------------------------------------------------
// Regressions
// ---------------------------------------------------------------------------------------

/// Unlink /d1/g, fdatasync /d1, crash right after (only flushed writes survive): returns
/// whether /d1/g is back.
fn fdatasync_dir_repro() -> bool {
    let mut r = Run::start(base_image());
    let d1 = r.lookup("/d1").unwrap();
    r.call("unlink /d1/g", |fs| fs.unlink(d1, b"g")).unwrap();
    r.fs.fsync(d1, true).unwrap();
    let ops = r.dev.ops();
    let image = crash_image_torn(base_image(), &ops, ops.len(), &|_| false, None);
    let fs = mount(Arc::new(image)).unwrap();
    fs.lookup(d1, b"g").is_ok()
}

/// fdatasync(2) of a directory must make its entries durable: they are the directory's
/// data, and the engine even counts them in the directory's size. The engine used to log
/// directory changes as non-data changes (`log_inode(.., false)`), so fdatasync of the
/// directory forced nothing and the unlinked name was back after a crash.
#[test]
fn regression_fdatasync_of_directory_persists_entries() {
    assert!(!fdatasync_dir_repro(), "/d1/g came back after unlink + fdatasync(/d1) + crash");
}

/// A file shrunk by a truncate that is not durable yet, then punched past its new EOF:
/// the punch zeroed the written tail of the EOF block in place, so a crash that undid the
/// truncate showed zeros inside the old size (`CRASH_SEED=2046821030`, byte 3000 of a
/// 9,100-byte file). Returns the offsets whose bytes changed after the crash.
fn punch_past_eof_repro() -> Vec<u64> {
    let dev = Arc::new(MemDevice::new(IMAGE_SIZE));
    FileSystem::mkfs(&*dev, &mkfs_options()).unwrap();
    let fs = mount(dev.clone()).unwrap();
    let f = fs.create(ROOT, b"f", 0o644, CRED).unwrap().ino;
    let data = pattern(9000, 7);
    fs.write(f, 100, &data).unwrap();
    fs.sync().unwrap();
    fs.setattr(f, &SetAttr { size: Some(50), ..Default::default() }).unwrap();
    fs.fallocate(f, 3000, 40000, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE).unwrap();
    // Crash: the device as it is, the truncate and the punch still in the CIL.
    let crashed = mount(Arc::new(dev.snapshot())).unwrap();
    assert_eq!(crashed.getattr(f).unwrap().size, 9100, "the truncate was not durable");
    let back = crashed.read(f, 100, 9000).unwrap();
    (0..9000u64).filter(|&k| back[k as usize] != data[k as usize]).map(|k| k + 100).collect()
}

#[test]
fn regression_punch_past_eof_after_truncate() {
    let wrong = punch_past_eof_repro();
    assert!(
        wrong.is_empty(),
        "{} bytes of the old size changed after a crash, first at {:?}",
        wrong.len(),
        wrong.first()
    );
}

/// setattr of a size used to commit the size change (the truncate's transaction) and then
/// the times and other attributes in a transaction of their own: a background checkpoint
/// between the two (`crash_random_workload_with_background_checkpoints` found it) brought
/// back a file of the new size with a time the call never showed. Every transaction of a
/// truncate now carries the call's attributes, so a small one is a single commit.
#[test]
fn regression_truncate_commits_size_and_attributes_together() {
    let fs = fresh_fs(|cfg| cfg.background = false);
    let f = fs.create(ROOT, b"f", 0o644, CRED).unwrap().ino;
    fs.write(f, 0, &pattern(7096, 3)).unwrap();
    fs.sync().unwrap();
    let commits = || fs.mount().journal.commits();
    let before = commits();
    let a = fs.setattr(f, &SetAttr { size: Some(50), mode: Some(0o600), ..Default::default() }).unwrap();
    assert_eq!(commits() - before, 1, "a truncate within one batch, with a mode change, is one transaction");
    assert_eq!((a.size, a.perm), (50, 0o600));
    assert_eq!(a.mtime, a.ctime, "truncate(2) sets both times to the same now");
}

/// Creates a file in each of `k` directories per round and syncs, with `k` varying so the
/// checkpoint records vary in size and the log wraps at many offsets. Returns what went
/// wrong: a failed sync, or a corrupt image after a clean unmount.
fn log_wrap_repro() -> Checked {
    let dev = Arc::new(MemDevice::new(IMAGE_SIZE));
    FileSystem::mkfs(&*dev, &mkfs_options()).unwrap();
    let fs = mount(dev.clone()).unwrap();
    let dirs: Vec<u64> =
        (0..12).map(|i| fs.mkdir(ROOT, format!("d{i}").as_bytes(), 0o755, CRED).unwrap().ino).collect();
    fs.sync().unwrap();
    let mut failed = Vec::new();
    for (round, k) in [3usize, 9, 2, 12, 5, 1, 11, 7, 4, 10, 6, 8].into_iter().cycle().take(24).enumerate() {
        for d in &dirs[..k] {
            fs.create(*d, format!("f{round}").as_bytes(), 0o644, CRED).unwrap();
        }
        if let Err(e) = fs.sync() {
            failed.push(format!("round {round} ({k} directories): sync failed: {e}"));
        }
    }
    fs.unmount().unwrap();
    drop(fs);
    let fsck = fsck_clean(&*dev);
    if failed.is_empty() && fsck.is_ok() {
        return Ok(());
    }
    Err(format!("{}; after a clean unmount: {:?}", failed.join("; "), fsck))
}

/// Two bugs together, both fixed. (1) `Journal::reserve_log` at the ring's wrap: when the
/// record does not fit between the head and the ring's end, the blocks skipped there
/// ("waste") are needed too, but `push_ail(blocks)` was asked only for `blocks`; when that
/// much was free in total, it wrote nothing back and the reservation failed with EBUSY "log
/// full and nothing to write back" although the AIL held durable records. (2) The failed
/// checkpoint had already taken the CIL's items out (`switch`), and they were dropped: the
/// changes never reached the log or their home, durable_seq and the busy extents were left
/// behind, and the file system carried on. Later checkpoints relogged whole directory
/// blocks whose new entries pointed at inodes that were never written: after a clean
/// unmount fsck found "inode N: bad magic or version" for every file created in the lost
/// checkpoint.
#[test]
fn regression_log_wrap_checkpoint() {
    log_wrap_repro().unwrap();
}

/// Run `f` on its own thread; `None` if it has not finished after `secs` seconds (the
/// thread is left behind, blocked).
fn within<T: Send + 'static>(secs: u64, f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(std::time::Duration::from_secs(secs)).ok()
}

/// A new file system on a memory device, mounted with the stock journal config of its log
/// as `tune` changes it.
fn fresh_fs(tune: impl FnOnce(&mut JournalConfig)) -> FileSystem {
    let dev = Arc::new(MemDevice::new(IMAGE_SIZE));
    FileSystem::mkfs(&*dev, &mkfs_options()).unwrap();
    let mut cfg = stock_journal();
    tune(&mut cfg);
    FileSystem::mount_device(dev, &MountOptions { read_only: false, journal: Some(cfg), ..MountOptions::default() })
        .unwrap()
}

/// With `JournalConfig::background == false` (what tests use for determinism), the first
/// transaction that found the CIL over `cil_max_bytes` used to wait in `Journal::throttle`
/// for a background push that never came: the call never returned. 16 creates in 16
/// directories (about 70 KiB of CIL, the stock bound of a 64-block log is 63 KiB) are enough.
#[test]
fn regression_throttle_without_background_threads() {
    let finished = within(10, || {
        let fs = fresh_fs(|cfg| cfg.background = false);
        let dirs: Vec<u64> =
            (0..16).map(|i| fs.mkdir(ROOT, format!("d{i}").as_bytes(), 0o755, CRED).unwrap().ino).collect();
        fs.sync().unwrap();
        for d in dirs {
            fs.create(d, b"f", 0o644, CRED).unwrap();
        }
        fs.sync().unwrap();
    });
    assert!(finished.is_some(), "creates with background threads off did not return within 10 s");
}

/// A full CIL is emptied by a throttled committer, not by the background worker: when
/// threads outnumber CPUs the worker waits long for a CPU, and the committers that waited
/// for it queued on its lock. Here the worker is never asked (no push threshold, an hour's
/// timer), so 8 threads creating past the CIL's bound finish only if they checkpoint
/// themselves; and the CIL stays within its bound plus what the threads had begun.
#[test]
fn throttled_commits_checkpoint_the_full_cil_themselves() {
    let finished = within(60, || {
        let fs = fresh_fs(|cfg| {
            cfg.cil_push_bytes = u64::MAX;
            cfg.push_interval = std::time::Duration::from_secs(3600);
        });
        let bound = stock_journal().cil_max_bytes;
        let dirs: Vec<u64> =
            (0..8).map(|i| fs.mkdir(ROOT, format!("d{i}").as_bytes(), 0o755, CRED).unwrap().ino).collect();
        let most = AtomicUsize::new(0);
        std::thread::scope(|s| {
            for &d in &dirs {
                let (fs, most) = (&fs, &most);
                s.spawn(move || {
                    for i in 0..200 {
                        fs.create(d, format!("f{i}").as_bytes(), 0o644, CRED).unwrap();
                        most.fetch_max(fs.mount().journal.cil_bytes() as usize, Ordering::Relaxed);
                    }
                });
            }
        });
        let stats = &fs.mount().journal.stats;
        let got = (
            stats.commit_throttles.load(Ordering::Relaxed),
            stats.checkpoints.load(Ordering::Relaxed),
            stats.background_checkpoints.load(Ordering::Relaxed),
        );
        fs.unmount().unwrap();
        (got, most.into_inner() as u64, bound)
    });
    let ((throttles, checkpoints, background), most, bound) =
        finished.expect("throttled creates did not return within 60 s");
    assert!(
        throttles > 0 && checkpoints > 0,
        "{throttles} throttles, {checkpoints} checkpoints: the bound was never reached"
    );
    assert_eq!(background, 0, "the worker checkpointed, though never asked");
    // Each of the 8 threads may have begun a transaction just below the bound.
    assert!(most < bound + 8 * 16 * 1024, "the CIL held {most} bytes against a bound of {bound}");
}

/// A crash leaves an unlinked-but-open file with a large extent map (an orphan); the next
/// mount frees it in several transactions (logging the inode), and the first create after
/// the mount gets the freed inode number. Returns what fsck says after an unmount.
fn orphan_reuse_repro() -> Checked {
    let dev = Arc::new(MemDevice::new(IMAGE_SIZE));
    FileSystem::mkfs(&*dev, &mkfs_options()).unwrap();
    let fs = mount(dev.clone()).unwrap();
    let o = fs.create(ROOT, b"orphan", 0o644, CRED).unwrap().ino;
    for k in 0..300u64 {
        fs.write(o, 2 * k * 4096, b"o").unwrap(); // 300 extents: freed in two batches
    }
    fs.open(o).unwrap();
    fs.unlink(ROOT, b"orphan").unwrap();
    fs.sync().unwrap();
    let crashed = Arc::new(dev.snapshot());
    std::mem::forget(fs); // the crash
    let fs = mount(crashed.clone()).unwrap();
    let new = fs.create(ROOT, b"new", 0o644, CRED).unwrap().ino;
    fs.unmount().unwrap();
    drop(fs);
    fsck_clean(&*crashed).map_err(|e| format!("orphan was inode {o}, the new file is inode {new}; {e}"))
}

/// The same root cause as model.rs's `regression_inode_reuse_in_one_checkpoint` (a new
/// in-memory inode's log version starts at 0, so its image loses to the freed inode's
/// image in the CIL), reached the most natural way: recovery of an unlinked-open file.
/// After the unmount the new file's name points at the orphan's stale image (nlink 0,
/// orphan slot set, extents in freed blocks).
#[test]
fn regression_create_after_orphan_reap() {
    orphan_reuse_repro().unwrap();
}

/// What one run of `crash_while_threads_share_a_directory`'s workload leaves to check.
struct SharedDirRun {
    dev: Arc<CrashDevice>,
    shared: u64,
    setup_ops: usize,
    /// Per file: the tick of its create and of its rename, if it was renamed.
    files: BTreeMap<usize, (usize, Option<usize>)>,
    /// Per sync: the tick it began at, and the device ops done when it returned.
    syncs: Vec<(usize, usize)>,
}

/// File `i`'s name in `crash_while_threads_share_a_directory`: "f" as created, "r" renamed,
/// "g" in a thread's own directory.
fn numbered(prefix: &str, i: usize) -> Vec<u8> {
    format!("{prefix}{i}").into_bytes()
}

/// Three threads interleave creates and renames in one directory and create in directories
/// of their own, while a fourth syncs. `None` if none of the commits was routed to the
/// shared directory's CIL shard.
fn shared_dir_run() -> Option<SharedDirRun> {
    const THREADS: usize = 3;
    const FILES: usize = 240;
    let dev = Arc::new(CrashDevice::new(base_image().snapshot()));
    let fs = mount(dev.clone()).unwrap();
    let shared = fs.mkdir(ROOT, b"shared", 0o755, CRED).unwrap().ino;
    let own: Vec<u64> =
        (0..THREADS).map(|t| fs.mkdir(ROOT, format!("own{t}").as_bytes(), 0o755, CRED).unwrap().ino).collect();
    fs.sync().unwrap();
    let setup_ops = dev.op_count();
    // Logical time: a call that returned took a tick; a sync notes the time it began.
    let clock = AtomicUsize::new(0);
    let files: Mutex<BTreeMap<usize, (usize, Option<usize>)>> = Mutex::new(BTreeMap::new());
    let syncs: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());
    let working = AtomicUsize::new(THREADS);
    // Released together, so that their changes to the directory meet in one sequence.
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        for (t, &own) in own.iter().enumerate() {
            let (fs, clock, files, working, start) = (&fs, &clock, &files, &working, &start);
            s.spawn(move || {
                start.wait();
                // Interleaved: neighbouring names, on one leaf, come from different threads.
                for i in (t..FILES).step_by(THREADS) {
                    fs.create(shared, &numbered("f", i), 0o644, CRED).unwrap();
                    fs.create(own, &numbered("g", i), 0o644, CRED).unwrap();
                    let created = clock.fetch_add(1, Ordering::SeqCst);
                    files.lock().unwrap().insert(i, (created, None));
                    if i % 3 == 0 {
                        fs.rename(shared, &numbered("f", i), shared, &numbered("r", i), 0).unwrap();
                        let renamed = clock.fetch_add(1, Ordering::SeqCst);
                        files.lock().unwrap().get_mut(&i).unwrap().1 = Some(renamed);
                    }
                }
                working.fetch_sub(1, Ordering::SeqCst);
            });
        }
        s.spawn(|| {
            while working.load(Ordering::SeqCst) > 0 {
                let began = clock.load(Ordering::SeqCst);
                fs.sync().unwrap();
                syncs.lock().unwrap().push((began, dev.op_count()));
            }
        });
    });
    let routed = fs.mount().journal.routed_commits();
    drop(fs);
    (routed > 0).then(|| SharedDirRun {
        dev,
        shared,
        setup_ops,
        files: files.into_inner().unwrap(),
        syncs: syncs.into_inner().unwrap(),
    })
}

/// Threads taking turns on one directory, so that its commits go to its own CIL shard
/// (`Tx::route_by`), each also creating in a directory of its own, while another thread
/// syncs. At every flush of the run, with all and with none of the unflushed writes
/// persisted: the image recovers and fsck finds it clean, and a file created before a sync
/// that had returned by the crash is there under exactly one of its names, the new one if
/// its rename returned before that sync began.
#[test]
fn crash_while_threads_share_a_directory() {
    // Routing needs two threads to change the directory in one CIL sequence. On a busy
    // machine the threads can happen to run one after another, so the workload runs again
    // (at most five times) until some of its commits were routed; that run is checked.
    let SharedDirRun { dev, shared, setup_ops, files, syncs } =
        (0..5).find_map(|_| shared_dir_run()).expect("in 5 runs, no commit went to the shared directory's shard");
    let (ops, base) = (dev.ops(), dev.base());
    let points: Vec<usize> = crash_points(&ops).into_iter().filter(|&c| c >= setup_ops).collect();
    let mut failures = Vec::new();
    for &c in &points {
        // What every file must show: the latest sync durable by the crash began after it.
        let began = syncs.iter().filter(|&&(_, end)| end <= c).map(|&(b, _)| b).max().unwrap_or(0);
        for keep_all in [true, false] {
            let image = crash_image_torn(&base, &ops, c, &|_| keep_all, None);
            let r = catch_unwind(AssertUnwindSafe(|| -> Checked {
                fsck_clean(&image)?;
                let fs = mount(Arc::new(image)).map_err(|e| format!("mount failed: {e}"))?;
                let names: BTreeSet<Vec<u8>> = readdir(&fs, shared).map_err(|e| format!("readdir: {e}"))?.into_iter().map(|e| e.name).collect();
                for (&i, &(created, renamed)) in files.iter().filter(|(_, &(created, _))| created < began) {
                    let (old, new) = (names.contains(&numbered("f", i)), names.contains(&numbered("r", i)));
                    if old == new || (renamed.is_some_and(|r| r < began) && !new) {
                        return Err(format!("file {i} (created at {created}, renamed at {renamed:?}, sync began at {began}): old name {old}, new name {new}"));
                    }
                }
                Ok(())
            }))
            .unwrap_or_else(|p| Err(format!("panic: {}", panic_message(&p))));
            if let Err(e) = r {
                failures.push(format!("crash at op {c} of {} (keep all: {keep_all}): {e}", ops.len()));
            }
        }
    }
    assert!(failures.is_empty(), "{} of the crash states failed:\n{}", failures.len(), failures.join("\n"));
}
