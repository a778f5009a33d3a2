//! The crash harness's recording device, and the images a power cut may leave behind.

use std::collections::{BTreeSet, HashSet};
use std::io;
use std::ops::Range;

use parking_lot::Mutex;

use super::mem::MemDevice;
use super::{eio, split_at_units, BlockDevice, SECTOR_SIZE};

/// One recorded device operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// A write of `data` at byte offset `off`.
    Write {
        /// Byte offset of the write.
        off: u64,
        /// The bytes written.
        data: Vec<u8>,
    },
    /// A flush barrier: every write logged before it is durable once it returns.
    Flush,
    /// A hole punched at `off..off + len`: in a crash image, zeros where it persisted (the
    /// harshest of what a punched range may read back as).
    Punch {
        /// Byte offset of the hole.
        off: u64,
        /// Its length in bytes.
        len: u64,
    },
}

/// The crash harness's recording device. It behaves like a normal device to the workload
/// (reads see the latest writes) while logging every write and flush in order, so that
/// [`crash_image`] can later rebuild any state the media may legally hold after a power cut.
pub struct CrashDevice {
    /// The durable image before any op; never modified.
    base: MemDevice,
    /// `base` with every logged write applied: what reads see.
    current: MemDevice,
    log: Mutex<Log>,
}

struct Log {
    ops: Vec<Op>,
    /// Power is cut once `ops` holds this many entries.
    cut: Option<usize>,
}

impl Log {
    fn dead(&self) -> bool {
        self.cut.is_some_and(|n| self.ops.len() >= n)
    }
}

impl CrashDevice {
    /// Record on top of `base`, the durable image at the start of the workload.
    pub fn new(base: MemDevice) -> Self {
        let current = base.snapshot();
        Self { base, current, log: Mutex::new(Log { ops: Vec::new(), cut: None }) }
    }

    /// A copy of the operation log.
    pub fn ops(&self) -> Vec<Op> {
        self.log.lock().ops.clone()
    }

    /// Number of logged operations.
    pub fn op_count(&self) -> usize {
        self.log.lock().ops.len()
    }

    /// A snapshot of the image before any op.
    pub fn base(&self) -> MemDevice {
        self.base.snapshot()
    }

    /// A snapshot of what reads currently see (every logged write applied).
    pub fn current(&self) -> MemDevice {
        self.current.snapshot()
    }

    /// Cut the power once `n` ops are logged: from then on every read, write and flush fails
    /// with EIO and nothing more is logged, so the workload sees the device die.
    pub fn cut_after(&self, n: usize) {
        self.log.lock().cut = Some(n);
    }
}

impl BlockDevice for CrashDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        if self.log.lock().dead() {
            return Err(eio());
        }
        self.current.read_at(buf, off)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let mut log = self.log.lock();
        if log.dead() {
            return Err(eio());
        }
        // Applied under the log lock, so log order is the order `current` saw the writes.
        self.current.write_at(buf, off)?;
        log.ops.push(Op::Write { off, data: buf.to_vec() });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut log = self.log.lock();
        if log.dead() {
            return Err(eio());
        }
        log.ops.push(Op::Flush);
        Ok(())
    }

    fn punch(&self, off: u64, len: u64) -> io::Result<bool> {
        let mut log = self.log.lock();
        if log.dead() {
            return Err(eio());
        }
        self.current.punch(off, len)?;
        log.ops.push(Op::Punch { off, len });
        Ok(true)
    }

    fn size(&self) -> u64 {
        self.current.size()
    }
}

/// A write that persisted only in part: bit `i % 64` of `sectors` keeps the write's `i`-th
/// 512-byte piece (pieces are split at absolute sector boundaries, so an unaligned write's
/// first and last pieces are partial sectors). `op` is the write's index in the op log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tear {
    /// Index of the torn write in the op log.
    pub op: usize,
    /// Bit `i % 64` set: the write's `i`-th piece persisted.
    pub sectors: u64,
}

/// Op indices of the unflushed epoch of a crash before op `upto`: the writes after the last
/// Flush that precedes `upto`. Everything before that Flush is durable.
pub fn unflushed_epoch(ops: &[Op], upto: usize) -> Range<usize> {
    assert!(upto <= ops.len(), "crash point {upto} is past the end of {} ops", ops.len());
    let start = ops[..upto].iter().rposition(|op| *op == Op::Flush).map_or(0, |f| f + 1);
    start..upto
}

/// The media image after a crash just before op `upto`: every op up to the last Flush before
/// `upto` is applied; of the unflushed epoch only the writes `i` with `keep(i)` persisted
/// (applied in log order, so the newer of two overlapping kept writes wins).
pub fn crash_image(base: &MemDevice, ops: &[Op], upto: usize, keep: &dyn Fn(usize) -> bool) -> MemDevice {
    crash_image_torn(base, ops, upto, keep, None)
}

/// [`crash_image`] where one write of the unflushed epoch may be torn: `tear` decides which of
/// its sectors persisted, overriding `keep` for that write. Panics if `tear` names anything but
/// a write of the unflushed epoch (a harness bug).
pub fn crash_image_torn(
    base: &MemDevice,
    ops: &[Op],
    upto: usize,
    keep: &dyn Fn(usize) -> bool,
    tear: Option<Tear>,
) -> MemDevice {
    let epoch = unflushed_epoch(ops, upto);
    if let Some(t) = tear {
        let is_write = matches!(ops.get(t.op), Some(Op::Write { .. }));
        assert!(is_write && epoch.contains(&t.op), "{t:?} is not a write of epoch {epoch:?}");
    }
    let image = base.snapshot();
    for (i, op) in ops[..upto].iter().enumerate() {
        let persisted = i < epoch.start || keep(i);
        match (op, tear) {
            (Op::Write { off, data }, Some(t)) if t.op == i => apply_torn(&image, *off, data, t.sectors),
            (Op::Write { off, data }, _) if persisted => apply(&image, *off, data),
            (Op::Punch { off, len }, _) if persisted => {
                image.punch(*off, *len).expect("logged punch lies outside the base image");
            }
            _ => {}
        }
    }
    image
}

fn apply(image: &MemDevice, off: u64, data: &[u8]) {
    image.write_at(data, off).expect("logged write lies outside the base image");
}

fn apply_torn(image: &MemDevice, off: u64, data: &[u8], sectors: u64) {
    for (i, piece) in split_at_units(off, data.len(), SECTOR_SIZE).enumerate() {
        if sectors >> (i % 64) & 1 == 1 {
            apply(image, off + piece.start as u64, &data[piece]);
        }
    }
}

/// Crash points worth testing: the index of every Flush (the crash hits while that flush is
/// in flight, so any subset of its epoch may have persisted; every earlier point of the epoch
/// is one of those subsets, and keep-all is the state right after the flush) plus the end.
pub fn crash_points(ops: &[Op]) -> Vec<usize> {
    let flushes = ops.iter().enumerate().filter(|(_, op)| **op == Op::Flush).map(|(i, _)| i);
    flushes.chain([ops.len()]).collect()
}

/// Keep-sets (op indices that persisted) for a crash before `upto`: all, none, each single
/// write, then `random` random subsets, each with its own density so near-empty and near-full
/// sets both occur. Deterministic per `seed`, so a failing case replays; duplicates dropped.
/// Use as `crash_image(base, ops, upto, &|i| set.contains(&i))`.
pub fn keep_sets(ops: &[Op], upto: usize, seed: u64, random: usize) -> Vec<BTreeSet<usize>> {
    let epoch = unflushed_epoch(ops, upto);
    debug_assert!(ops[epoch.clone()].iter().all(|op| *op != Op::Flush));
    let mut rng = SplitMix64(seed);
    let fixed = [epoch.clone().collect(), BTreeSet::new()].into_iter();
    let singles = epoch.clone().map(|i| BTreeSet::from([i]));
    let randoms = (0..random).map(|_| random_subset(&mut rng, epoch.clone())).collect::<Vec<_>>();
    let mut seen = HashSet::new();
    fixed.chain(singles).chain(randoms).filter(|set| seen.insert(set.clone())).collect()
}

fn random_subset(rng: &mut SplitMix64, epoch: Range<usize>) -> BTreeSet<usize> {
    let density = rng.next();
    epoch.filter(|_| rng.next() < density).collect()
}

/// SplitMix64: a tiny PRNG whose sequence never changes between versions, so a crash case
/// stays replayable from its seed.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}
