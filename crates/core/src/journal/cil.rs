//! The committed item list (CIL): per-thread shards that a commit copies its items into,
//! the accounting of their bytes, and the recycled image buffers the copies are made in.

use super::Journal;
use crate::error::Result;
use crate::format::log::{chunks_of, item_bytes, ChunkMask, ItemKey, ALL_CHUNKS, CHUNK};
use crate::format::{BLOCK_SIZE, INODE_SIZE};
use crate::lockstat::Mutex;
use crate::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use crate::sync::{thread_local, RawRwLock};
use rustc_hash::FxHashMap;
use std::cell::Cell;
use std::time::Instant;

/// A freed extent that may not be reused until the checkpoint that freed it is durable:
/// otherwise a crash could leave the old owner pointing at someone else's new data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BusyExtent {
    /// The extent's first block.
    pub blkno: u64,
    /// Its length in blocks.
    pub len: u32,
}

pub(super) struct CilItem {
    pub(super) version: u64,
    /// `None`: the block was freed in this sequence (logged as a revoke).
    pub(super) image: Option<Box<[u8]>>,
    /// A block's chunks changed since its image in an earlier sequence (all of them for an
    /// inode): what the record must carry.
    pub(super) changed: ChunkMask,
}

/// What one shard holds of one CIL sequence.
#[derive(Default)]
pub(super) struct CilBatch {
    pub(super) items: FxHashMap<ItemKey, CilItem>,
    pub(super) busy: Vec<BusyExtent>,
    /// Log bytes these items take.
    pub(super) bytes: u64,
    /// The part of `bytes` not yet added to `Journal::cil_bytes` (`Journal::publish_bytes`).
    pub(super) unpublished: u64,
    /// Images this batch copied into buffers of its own, by kind: the shard's demand for
    /// recycled ones at the next switch.
    pub(super) copies: [usize; IMAGE_KINDS],
}

impl CilBatch {
    pub(super) fn is_empty(&self) -> bool {
        self.items.is_empty() && self.busy.is_empty()
    }
}

/// Kinds of image buffer, by size: a block's and an inode's.
pub(super) const IMAGE_KINDS: usize = 2;

pub(super) fn image_kind(len: usize) -> usize {
    debug_assert!(len == BLOCK_SIZE || len == INODE_SIZE, "an image of {len} bytes");
    usize::from(len != BLOCK_SIZE)
}

pub(super) fn image_bytes(kind: usize) -> usize {
    [BLOCK_SIZE, INODE_SIZE][kind]
}

/// Image buffers of records written home, by kind, for the next copies into the CIL: a
/// commit then copies into memory the log is done with instead of allocating what another
/// thread frees. Every copy into the CIL is made by a committing thread and freed by
/// writeback's; through malloc, that cross-thread pair was 8% of the FUSE daemon's CPU in a
/// 400,000-file `rm -rf` for the blocks, and then 6% for the inodes (their malloc waiting on
/// the one arena's lock that the daemon's allocator is held to).
#[derive(Default)]
pub(super) struct Buffers {
    pub(super) kinds: [Vec<Box<[u8]>>; IMAGE_KINDS],
}

impl Buffers {
    pub(super) fn put(&mut self, image: Box<[u8]>) {
        if !image.is_empty() {
            self.kinds[image_kind(image.len())].push(image);
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.kinds.iter().enumerate().map(|(kind, list)| list.len() * image_bytes(kind)).sum()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.kinds.iter().all(Vec::is_empty)
    }

    pub(super) fn append(&mut self, other: &mut Buffers) {
        for (list, more) in self.kinds.iter_mut().zip(other.kinds.iter_mut()) {
            if list.is_empty() {
                std::mem::swap(list, more);
            } else {
                list.append(more);
            }
        }
    }

    /// Keep `want` buffers of each kind, taking them from `spare` while it has some; returns
    /// the surplus, to be freed outside the caller's lock.
    pub(super) fn fit(&mut self, want: [usize; IMAGE_KINDS], spare: &mut Buffers) -> Buffers {
        let mut surplus = Buffers::default();
        for (kind, list) in self.kinds.iter_mut().enumerate() {
            let want = want[kind];
            if list.len() > want {
                surplus.kinds[kind] = list.split_off(want);
            } else {
                let from = &mut spare.kinds[kind];
                let give = (want - list.len()).min(from.len());
                list.extend(from.drain(from.len() - give..));
            }
        }
        surplus
    }
}

/// Recycled images between switches (`Journal::spare`). Writeback hands them back in bursts,
/// a pass every few checkpoints, so what the shards do not take at one switch is kept for
/// the next ones, up to `spare_max_bytes` shared between the kinds as the shards' demand
/// is: blocks alone filled it, and every inode copy went to malloc.
#[derive(Default)]
pub(super) struct Spare {
    pub(super) buffers: Buffers,
    /// Copies of each kind the batches of the last switch made.
    pub(super) demand: [usize; IMAGE_KINDS],
}

impl Spare {
    /// How many more buffers of `kind` to keep within `max_bytes`.
    pub(super) fn room(&self, kind: usize, max_bytes: usize) -> usize {
        let wanted: [usize; IMAGE_KINDS] = std::array::from_fn(|k| self.demand[k] * image_bytes(k));
        let total: usize = wanted.iter().sum();
        let share = if total == 0 {
            max_bytes / IMAGE_KINDS
        } else {
            (max_bytes as u128 * wanted[kind] as u128 / total as u128) as usize
        };
        (share / image_bytes(kind)).saturating_sub(self.buffers.kinds[kind].len())
    }
}

/// A shard holds at most two sequences: a switch closes the open sequence first and then
/// visits the shards one at a time, so a commit can meet a shard the switch has not reached
/// yet. Its changes belong to the new sequence and wait in `next`.
pub(super) struct CilShard {
    /// The sequence of `open`; the switch moves it on when it takes `open`.
    pub(super) seq: u64,
    pub(super) open: CilBatch,
    pub(super) next: CilBatch,
    /// Buffers for this shard's next copies (as many of each kind as its last batch used;
    /// none once the CIL is idle).
    pub(super) free: Buffers,
}

/// A CIL shard and whether a switch must visit it.
///
/// A switch used to lock every shard, busy or not: under `ferrofs bench fsync` load, 2.2
/// million of the 2.6 million `cil-shard` acquisitions of a set were switches visiting shards
/// that no thread used (64 per checkpoint, with 3 threads committing), all of it under the push
/// lock that fsyncs wait for. `active` is set by a committer (under the shard lock, before it
/// reads the open sequence) and cleared by a switch that found the shard empty (under the
/// lock): a switch skips a shard whose flag it reads clear after closing its sequence. Both
/// sides write, then read, with `SeqCst` (the store-load pattern of Dekker's algorithm), so a
/// committer the switch did not see reads the new sequence and its changes belong to it.
///
/// `commits` counts the commits into this shard and `routed` those of them routed here
/// (`Journal::commits` and `Journal::routed_commits` sum them): one count for the whole
/// journal, added by every commit from both CPUs, made that line move between them at each
/// commit (see `Journal::commit`).
pub(super) struct ShardSlot {
    pub(super) active: AtomicBool,
    pub(super) commits: AtomicU64,
    pub(super) routed: AtomicU64,
    pub(super) shard: Mutex<CilShard>,
}

/// What a committing transaction sees of the CIL: its sequence's batch in the locked shard.
pub struct CilWriter<'a> {
    batch: &'a mut CilBatch,
    free: &'a mut Buffers,
    added_bytes: u64,
}

impl CilWriter<'_> {
    /// Copy an item's current image into the CIL (replacing an older copy in this shard).
    /// `changed`: the chunks of a block that this commit changed (`Buf::take_changed`);
    /// `ALL_CHUNKS` for an inode.
    pub fn log(&mut self, key: ItemKey, version: u64, image: &[u8], changed: ChunkMask) {
        debug_assert!(!matches!(key, ItemKey::Revoke(_)));
        debug_assert_eq!(image.len(), key.image_len());
        debug_assert!(
            matches!(key, ItemKey::Block(_)) || changed == ALL_CHUNKS,
            "{key:?}: only blocks are logged in chunks"
        );
        match self.batch.items.get_mut(&key) {
            Some(it) => {
                // An item's versions are taken under its owner's lock, which is held through
                // the commit, and never restart (a reused inode number continues its AG's
                // floor; cached buffers live as long as the mount): they reach a shard in
                // increasing order. A lower one would lose this change at the checkpoint.
                debug_assert!(it.version < version, "{key:?}: version {version} logged after {}", it.version);
                // This shard holds the version just before, so only the chunks this commit
                // changed differ from its copy (`Buf::take_changed` checks the mask against
                // the last logged image in debug builds): copy those, not the whole block.
                let relogged = it.version + 1 == version;
                it.version = version;
                it.changed |= changed;
                match &mut it.image {
                    Some(img) if relogged && img.len() == BLOCK_SIZE => {
                        copy_chunks(img, image, changed);
                        debug_assert!(
                            img[..] == image[..],
                            "{key:?}: version {version} differs outside its changed chunks {changed:#x}"
                        );
                    }
                    Some(img) => img.copy_from_slice(image),
                    None => it.image = Some(copy_of(image, self.free, &mut self.batch.copies)),
                }
            }
            None => {
                self.added_bytes += item_bytes(key) as u64;
                let image = Some(copy_of(image, self.free, &mut self.batch.copies));
                self.batch.items.insert(key, CilItem { version, image, changed });
            }
        }
    }

    /// The metadata block was freed: drop any logged image and revoke older ones.
    pub fn revoke(&mut self, blkno: u64, version: u64) {
        let old = self.batch.items.insert(ItemKey::Block(blkno), CilItem { version, image: None, changed: 0 });
        debug_assert!(
            old.as_ref().is_none_or(|o| o.version < version),
            "block {blkno}: revoke version {version} not above the logged one"
        );
        if let Some(image) = old.and_then(|o| o.image) {
            self.free.put(image);
        }
        self.added_bytes += item_bytes(ItemKey::Revoke(blkno)) as u64;
    }

    /// The extent was freed: it is reused only once this sequence is durable.
    pub fn busy(&mut self, e: BusyExtent) {
        self.batch.busy.push(e);
    }
}

/// Copy the chunks of `changed` from `image` into `img`, each run of adjacent chunks at once.
pub(super) fn copy_chunks(img: &mut [u8], image: &[u8], mut changed: ChunkMask) {
    while changed != 0 {
        let first = changed.trailing_zeros() as usize;
        let run = (changed >> first).trailing_ones() as usize;
        let (lo, hi) = (first * CHUNK, (first + run) * CHUNK);
        img[lo..hi].copy_from_slice(&image[lo..hi]);
        changed &= !chunks_of(lo..hi);
    }
}

/// A copy of `image`, in one of the shard's `free` buffers of its kind when there is one;
/// counted in `copies`.
pub(super) fn copy_of(image: &[u8], free: &mut Buffers, copies: &mut [usize; IMAGE_KINDS]) -> Box<[u8]> {
    let kind = image_kind(image.len());
    copies[kind] += 1;
    match free.kinds[kind].pop() {
        Some(mut b) => {
            b.copy_from_slice(image);
            b
        }
        None => image.into(),
    }
}

/// Which CIL shard a commit goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The committing thread's own: commits of different threads share nothing.
    Thread,
    /// The shard of an object that several threads are changing (a shared directory, by
    /// inode number): each of its blocks then has one copy in the CIL, relogged in place,
    /// rather than a whole copy in the shard of every thread that changed it.
    Object(u64),
}

thread_local! {
    static SHARD_INDEX: Cell<usize> = const { Cell::new(usize::MAX) };
}
/// Only spreads threads over shards, so it stays `std` under the model checker.
static NEXT_SHARD: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub(super) fn my_shard(n: usize) -> usize {
    SHARD_INDEX.with(|s| {
        if s.get() == usize::MAX {
            s.set(NEXT_SHARD.fetch_add(1, Relaxed));
        }
        s.get() % n
    })
}

impl Journal {
    /// The CIL shard this thread commits to unless routed elsewhere.
    pub fn thread_shard(&self) -> usize {
        my_shard(self.shards.len())
    }

    /// Make an item change durable-in-order: run `f` with the CIL shard of `route` locked and
    /// return the CIL sequence the changes belong to (what fsync must force).
    /// The caller holds AG locks here, so it must have called `throttle` before taking them.
    pub fn commit(&self, route: Route, f: impl FnOnce(&mut CilWriter<'_>)) -> u64 {
        let shard = match route {
            Route::Thread => self.thread_shard(),
            Route::Object(key) => crate::sync::shard_of(key, self.shards.len()),
        };
        let slot = &self.shards[shard];
        let mut g = slot.shard.lock();
        // Changed only under the shard lock: the relaxed load is exact.
        if !slot.active.load(Relaxed) {
            slot.active.store(true, SeqCst);
        }
        let seq = self.open_seq.load(SeqCst);
        let CilShard { seq: shard_seq, open, next, free } = &mut *g;
        if *shard_seq < seq && open.is_empty() && next.is_empty() {
            // Idle while switches skipped it: nothing here belongs to an older sequence.
            *shard_seq = seq;
        }
        let batch = if seq == *shard_seq {
            open
        } else {
            debug_assert_eq!(seq, *shard_seq + 1, "a switch visits every shard before the next one");
            next
        };
        let mut w = CilWriter { batch, free, added_bytes: 0 };
        f(&mut w);
        let added = w.added_bytes;
        // Counted under the shard lock, so the switch takes out exactly the bytes of the
        // items it takes. A batch's bytes reach `cil_bytes` when it gets its first and then
        // once per `publish_bytes`: one count that every commit added to moved between the
        // CPUs at each commit, under this lock (2 threads changing modes: 4.6M commits/s,
        // 5.3-5.8M without it).
        let first = batch.bytes == 0;
        batch.bytes += added;
        batch.unpublished += added;
        let total = (first || batch.unpublished >= self.publish_bytes).then(|| {
            let p = std::mem::take(&mut batch.unpublished);
            self.cil_bytes.fetch_add(p, Relaxed) + p
        });
        // Only ever written under this lock: a load and a store keep them exact.
        slot.commits.store(slot.commits.load(Relaxed) + 1, Relaxed);
        if matches!(route, Route::Object(_)) {
            slot.routed.store(slot.routed.load(Relaxed) + 1, Relaxed);
        }
        drop(g);
        if total.is_some_and(|t| t >= self.cfg.cil_push_bytes) {
            self.request_push();
        }
        seq
    }

    /// Bounded CIL: wait while it is over its hard limit. Called when a transaction begins,
    /// before it takes any lock.
    ///
    /// One throttled committer checkpoints the CIL itself, holding `cil_full` for writing
    /// until its switch has emptied the CIL; the others wait as readers and are let in
    /// together by one wake. Not the background worker: the push threshold asked it long
    /// before, and when threads outnumber CPUs it waits long for a CPU that the committers
    /// have. And not a mutex with a condvar: the woken retake the mutex one after another,
    /// each only once it has a CPU (48 threads on 2 CPUs queued up to 12.8% of a phase's
    /// thread time on the worker's lock that way in `ferrofs bench scale`).
    pub fn throttle(&self) -> Result<()> {
        if !self.cil_at_max() {
            return Ok(());
        }
        self.stats.commit_throttles.fetch_add(1, Relaxed);
        let start = Instant::now();
        let mut result = Ok(());
        while result.is_ok() && self.cil_at_max() {
            result = match self.cil_full.try_write() {
                // Another's checkpoint may have emptied the CIL since.
                Some(full) if self.cil_at_max() => self.checkpoint_locked(self.push.lock(), Some(full)),
                Some(_) => Ok(()),
                None => {
                    drop(self.cil_full.read());
                    self.alive()
                }
            };
        }
        self.stats.throttle_wait_ns.fetch_add(start.elapsed().as_nanos() as u64, Relaxed);
        result
    }

    pub(crate) fn cil_at_max(&self) -> bool {
        self.cil_bytes() >= self.cfg.cil_max_bytes
    }

    /// Images of records written home, for the shards' next copies (handed out at the next
    /// switch); what does not fit under `spare_max_bytes` is freed, outside the lock.
    pub(super) fn recycle(&self, images: Vec<Box<[u8]>>) {
        let mut given = Buffers::default();
        for image in images {
            given.put(image);
        }
        let mut surplus = Buffers::default();
        let mut spare = self.spare.lock();
        for (kind, list) in given.kinds.iter_mut().enumerate() {
            let fits = list.len().min(spare.room(kind, self.cfg.spare_max_bytes as usize));
            surplus.kinds[kind] = list.split_off(fits);
            self.recycled_bytes.fetch_add((fits * image_bytes(kind)) as u64, Relaxed);
        }
        spare.buffers.append(&mut given);
        drop(spare);
        drop(surplus);
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;
    use crate::dev::BlockDevice;
    use crate::format::inode::{Timespec, S_IFREG};
    use crate::format::log::LogHeader;
    use crate::format::DiskInode;
    use crate::journal::JournalConfig;
    use std::sync::Arc;

    /// The CIL's byte count takes a batch's first bytes at once (the timer's checkpoint looks
    /// for a count above zero), then a step of `publish_bytes` at a time; a checkpoint takes
    /// out exactly what was published, and the commits are counted exactly.
    #[test]
    fn the_cil_count_is_published_in_steps_and_the_commits_exactly() {
        const DEV_BYTES: u64 = 64 << 20;
        let dev = Arc::new(crate::dev::MemDevice::new(DEV_BYTES));
        let geo =
            crate::mkfs::plan(DEV_BYTES, &crate::MkfsOptions { ag_count: Some(1), ..Default::default() }).unwrap();
        let cfg = JournalConfig { background: false, ..JournalConfig::for_log(geo.log_blocks) };
        let header = LogHeader { gen: 0, epoch: 1, tail_off: 0, tail_seq: 1 };
        let log = geo.ag_layout(0).log;
        dev.write_at(&header.encode(log)[..], log * BLOCK_SIZE as u64).unwrap();
        let j = Journal::start(dev, geo, header, cfg, Box::new(|_| {}));
        let item = item_bytes(ItemKey::Inode(1)) as u64;
        assert!(j.publish_bytes >= 4 * item, "a step of {} bytes", j.publish_bytes);
        // A valid image: the checkpoint verifies what it seals in debug builds.
        let commit = |ino: u64| {
            let mut image = [0u8; INODE_SIZE];
            DiskInode::new(S_IFREG | 0o644, 0, 0, Timespec::default(), 1).encode(ino, 0, &mut image);
            j.commit(Route::Thread, |w| w.log(ItemKey::Inode(ino), 1, &image, ALL_CHUNKS))
        };
        commit(1);
        assert_eq!(j.cil_bytes(), item, "a batch's first bytes are published at once");
        let mut n = 1;
        while j.cil_bytes() == item && n < 10_000 {
            n += 1;
            commit(n);
        }
        assert_eq!(n - 1, j.publish_bytes.div_ceil(item), "the next publish comes with a step gathered");
        assert_eq!(j.cil_bytes(), n * item, "and takes in everything gathered");
        commit(n + 1);
        assert_eq!(j.cil_bytes(), n * item);
        j.checkpoint().unwrap();
        assert_eq!(j.cil_bytes(), 0, "the checkpoint took out exactly what was published");
        assert_eq!(j.commits(), n + 1);
    }

    #[test]
    fn recycled_images_are_kept_for_each_kind_as_the_shards_use_them() {
        let image = |len: usize| vec![0u8; len].into_boxed_slice();
        // The last switch's batches copied 2 blocks and 32 inodes: 8 KiB of each.
        let mut spare = Spare { demand: [2, 32], ..Spare::default() };
        assert_eq!((spare.room(0, 16 << 10), spare.room(1, 16 << 10)), (2, 32), "the bytes shared as the demand is");
        spare.buffers.put(image(BLOCK_SIZE));
        spare.buffers.put(image(INODE_SIZE));
        assert_eq!((spare.room(0, 16 << 10), spare.room(1, 16 << 10)), (1, 31));
        assert_eq!(Spare::default().room(1, 16 << 10), 32, "no demand yet: half each");
        // A shard that copied a block and three inodes gets what the spare has of them.
        let mut free = Buffers::default();
        assert!(free.fit([1, 3], &mut spare.buffers).is_empty());
        assert_eq!((free.kinds[0].len(), free.kinds[1].len()), (1, 1));
        assert!(spare.buffers.is_empty());
        // One that went quiet gives its buffers up.
        let surplus = free.fit([0, 0], &mut spare.buffers);
        assert_eq!((surplus.bytes(), free.bytes()), (BLOCK_SIZE + INODE_SIZE, 0));
    }

    #[test]
    fn copy_chunks_copies_exactly_the_masked_chunks() {
        let new: Vec<u8> = (0..BLOCK_SIZE).map(|i| (i % 251) as u8 + 1).collect();
        for mask in [0, 1, 1 << 31, ALL_CHUNKS, 0b1011_0110, 0x8000_0001, 0x7fff_fffe, 0x5555_5555] {
            let mut img = vec![0u8; BLOCK_SIZE];
            copy_chunks(&mut img, &new, mask);
            for c in 0..ChunkMask::BITS as usize {
                let r = c * CHUNK..(c + 1) * CHUNK;
                let want: &[u8] = if mask & (1 << c) != 0 { &new[r.clone()] } else { &[0; CHUNK] };
                assert_eq!(&img[r], want, "mask {mask:#x}, chunk {c}");
            }
        }
    }
}
