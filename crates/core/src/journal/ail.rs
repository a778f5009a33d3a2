//! The active item list: checkpoints that are in the log but not yet written home, in log
//! order, plus the log ring's space accounting. Writeback goes oldest first and writes each
//! item's newest durable image: an inode relogged by a later checkpoint is skipped (that
//! one's whole image will be written instead), a block is written from the later checkpoint
//! at once, since the log may hold only its changed chunks there. Either way each image is
//! written home once however often it was relogged; then the tail moves past what was
//! written.

use super::{debug_assert_verified, BusyExtent};
use crate::dev::BlockDevice;
use crate::format::log::{ItemKey, LogHeader, LOG_HEADER_BLOCKS};
use crate::format::{Geometry, BLOCK_SIZE};
use crate::lockstat::{LockClass, Mutex};
use rustc_hash::FxHashMap;
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering::*};

static AIL: LockClass = LockClass::ranked("ail", 50);
static AIL_IO: LockClass = LockClass::ranked("ail-io", 20);

struct Entry {
    rec_seq: u64,
    /// The CIL sequence this record checkpoints.
    cil_seq: u64,
    off: u64,
    /// Ring blocks this record accounts for, including any wasted run before a wrap.
    span: u64,
    durable: Durability,
}

enum Durability {
    /// The record is being written.
    Writing,
    /// Durable, with its images, which writeback has not taken in yet.
    Durable(Written),
    /// Durable and taken in: writeback holds its images (`Writeback::records`).
    TakenIn,
}

/// What a push did.
pub struct Pushed {
    /// Items written home.
    pub written: u64,
    /// Ring blocks freed.
    pub freed: u64,
    /// The images of the records retired and of those superseded, for reuse.
    pub images: Vec<Box<[u8]>>,
}

/// Items with their whole sealed images (a revoke's is empty), sorted by home.
pub type SealedImages = Vec<(ItemKey, Box<[u8]>)>;

/// A durable record's items and images: writeback writes them home from here (the record
/// itself may hold only chunks).
struct Written {
    items: SealedImages,
}

impl Written {
    fn bytes(&self) -> u64 {
        self.items.iter().map(|(_, img)| img.len() as u64).sum()
    }

    /// Give up the image of `home_key`, which a newer durable record has superseded.
    fn take_image(&mut self, home_key: ItemKey) -> Option<(ItemKey, Box<[u8]>)> {
        let at = self.items.binary_search_by_key(&home_key, |(k, _)| home(*k)).ok()?;
        let (k, img) = &mut self.items[at];
        (!img.is_empty()).then(|| (*k, std::mem::take(img)))
    }

    /// The image this record holds for home location `home` (`None`: it revokes it).
    fn image_of(&self, home_key: ItemKey) -> Option<&[u8]> {
        let at = self
            .items
            .binary_search_by_key(&home_key, |(k, _)| home(*k))
            .expect("the record that logged an item holds it");
        match self.items[at] {
            (ItemKey::Revoke(_), _) => None,
            (_, ref img) => Some(img),
        }
    }
}

/// The list and the ring, under the AIL lock, which an fsync's reservation and completion
/// take: nothing here costs more than O(1) per record.
struct Inner {
    entries: VecDeque<Entry>,
    head: u64,
    next_rec_seq: u64,
    epoch: u64,
    gen: u64,
    /// A writeback is between choosing its items and having written them.
    writing_back: bool,
    /// Freed extents whose checkpoint became durable during that writeback: it may have
    /// chosen an older image of one of their blocks before the free was logged, so they are
    /// reused only once it has written (else a stale tree node could land on new file data).
    held: Vec<BusyExtent>,
}

/// What a writeback takes from the list (`Ail::take_batch`).
struct Taken {
    /// The oldest durable records, to write home.
    batch: Vec<Entry>,
    /// Ring blocks they free.
    freed: u64,
    /// The records durable since the last writeback, numbered, for its map.
    new: Vec<(u64, Written)>,
}

/// Writeback's own state, under the `ail-io` lock that one writeback at a time holds; the
/// fsync path never takes it.
struct Writeback {
    /// For each home location, the newest durable record writeback has taken in that
    /// mentions it: what decides that an older image is superseded.
    latest: FxHashMap<ItemKey, Newest>,
    /// Records numbered below this one are in `latest`.
    indexed_below: u64,
    /// The records taken in and not yet retired, by number: where a superseded block's newest
    /// image is found. A superseded image itself is dropped when the record that supersedes
    /// it is taken in: nothing reads it again (`live_items`), and a block relogged at every
    /// checkpoint would otherwise be held once per record until writeback.
    records: FxHashMap<u64, Written>,
    /// Scratch kept from one writeback to the next (empty between them), sized by the
    /// largest: what to write home, and the run of contiguous images being gathered. A busy
    /// log's writeback needs megabytes of both; allocated afresh by whichever thread wrote
    /// back (the writer, a checkpoint short of log space, a throttled committer), they left
    /// holes of that size in every thread's malloc arena.
    homed: Vec<(u64, &'static [u8])>,
    run: Vec<u8>,
}

/// The newest record that logged a home location, and whether that image is home already.
#[derive(Clone, Copy)]
struct Newest {
    rec_seq: u64,
    homed: bool,
}

pub(super) struct Ail {
    log_start: u64,
    ring_blocks: u64,
    inner: Mutex<Inner>,
    io: Mutex<Writeback>,
    /// Every change of this CIL sequence and before is at its home location.
    home_seq: AtomicU64,
    /// Ring blocks between the tail and the head. Changed only under the AIL lock; an atomic
    /// so that readers of the fill level (every checkpoint asks) need not take the lock.
    used_blocks: AtomicU64,
    /// Bytes of the durable records in memory (not yet written home), for the cache budget.
    held_bytes: AtomicU64,
}

fn home(k: ItemKey) -> ItemKey {
    match k {
        ItemKey::Revoke(b) => ItemKey::Block(b),
        k => k,
    }
}

impl Ail {
    pub fn new(log_start: u64, ring_blocks: u64, h: LogHeader) -> Ail {
        let inner = Inner {
            entries: VecDeque::new(),
            head: h.tail_off,
            next_rec_seq: h.tail_seq,
            epoch: h.epoch,
            gen: h.gen,
            writing_back: false,
            held: Vec::new(),
        };
        let writeback = Writeback {
            latest: FxHashMap::default(),
            indexed_below: h.tail_seq,
            records: FxHashMap::default(),
            homed: Vec::new(),
            run: Vec::new(),
        };
        Ail {
            log_start,
            ring_blocks,
            inner: Mutex::new(&AIL, inner),
            io: Mutex::new(&AIL_IO, writeback),
            home_seq: AtomicU64::new(0),
            used_blocks: AtomicU64::new(0),
            held_bytes: AtomicU64::new(0),
        }
    }

    pub fn ring_start(&self) -> u64 {
        self.log_start + LOG_HEADER_BLOCKS
    }

    pub fn ring_blocks(&self) -> u64 {
        self.ring_blocks
    }

    pub fn used_percent(&self) -> u64 {
        self.used_blocks.load(Relaxed) * 100 / self.ring_blocks
    }

    /// Claim ring space for the next record: `(rec_seq, ring offset, epoch)`, or, when the
    /// tail must move first, how many ring blocks must be free for it to fit: the record's
    /// own and, when it does not fit before the ring's end, the run skipped there. The record
    /// joins the AIL at once (not yet durable) so the tail can never be moved past it.
    pub fn reserve(&self, blocks: u64) -> Result<(u64, u64, u64), u64> {
        let mut g = self.inner.lock();
        let waste = if g.head + blocks > self.ring_blocks { self.ring_blocks - g.head } else { 0 };
        let used = self.used_blocks.load(Relaxed);
        if used + waste + blocks > self.ring_blocks {
            return Err(waste + blocks);
        }
        let off = if waste > 0 { 0 } else { g.head };
        let rec_seq = g.next_rec_seq;
        g.next_rec_seq += 1;
        self.used_blocks.store(used + waste + blocks, Relaxed);
        g.head = (off + blocks) % self.ring_blocks;
        g.entries.push_back(Entry { rec_seq, cil_seq: 0, off, span: waste + blocks, durable: Durability::Writing });
        Ok((rec_seq, off, g.epoch))
    }

    pub fn home_seq(&self) -> u64 {
        self.home_seq.load(Acquire)
    }

    pub fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Relaxed)
    }

    /// The record joins writeback with its sealed images (sorted by home): one short hold of
    /// the AIL lock, whatever its size. Its items enter writeback's map of the newest image
    /// of each home location only when a writeback takes it in (`take_batch`), so a
    /// completing checkpoint (an fsync) never waits behind per-item work.
    pub fn mark_durable(&self, rec_seq: u64, cil_seq: u64, items: SealedImages) {
        debug_assert!(items.windows(2).all(|w| home(w[0].0) < home(w[1].0)), "record items sorted by home");
        let written = Written { items };
        self.held_bytes.fetch_add(written.bytes(), Relaxed);
        let mut g = self.inner.lock();
        let e = g.entries.iter_mut().rev().find(|e| e.rec_seq == rec_seq).expect("reserved record is in the AIL");
        debug_assert!(matches!(e.durable, Durability::Writing));
        e.cil_seq = cil_seq;
        e.durable = Durability::Durable(written);
    }

    /// Freed extents of a checkpoint that has just become durable: those that may be reused
    /// now. While a writeback runs they wait for it (`held`): it chose its images before this
    /// record's revokes reached its map; one that starts later takes the revokes in with its
    /// batch and writes none of their blocks.
    pub fn reusable(&self, busy: Vec<BusyExtent>) -> Vec<BusyExtent> {
        // Most checkpoints free nothing (every fsync writes one): leave the AIL lock alone.
        if busy.is_empty() {
            return busy;
        }
        let mut g = self.inner.lock();
        if g.writing_back {
            g.held.extend(busy);
            return Vec::new();
        }
        busy
    }

    /// Wait for the writeback in progress, if any: afterwards every extent it held back has
    /// been handed to `reuse`.
    pub fn wait_writeback(&self) {
        drop(self.io.lock());
    }

    /// Take in the records durable since the last call, then write back oldest-first until
    /// `need_free` ring blocks are free (or nothing durable is left; 0: take in only), then
    /// move the tail. The freed extents held back during the writeback go to `reuse` once it
    /// has written, before the next writeback can start; after an I/O error they stay held:
    /// the journal has failed.
    pub fn push(
        &self,
        dev: &dyn BlockDevice,
        geo: &Geometry,
        need_free: u64,
        reuse: &dyn Fn(Vec<BusyExtent>),
    ) -> io::Result<Pushed> {
        let mut wb = self.io.lock();
        let Taken { batch, freed, new } = self.take_batch(need_free, wb.indexed_below);
        if let Some((last, _)) = new.last() {
            wb.indexed_below = last + 1;
        }
        let Writeback { latest, records, homed: homed_kept, run, .. } = &mut *wb;
        let mut superseded = Vec::new();
        for (rec_seq, w) in new {
            for (k, _) in &w.items {
                let Some(old) = latest.insert(home(*k), Newest { rec_seq, homed: false }) else { continue };
                superseded.extend(records.get_mut(&old.rec_seq).and_then(|o| o.take_image(home(*k))));
            }
            records.insert(rec_seq, w);
        }
        self.held_bytes.fetch_sub(superseded.iter().map(|(_, img)| img.len() as u64).sum(), Relaxed);
        let mut images: Vec<Box<[u8]>> =
            superseded.into_iter().map(|(_, img)| img).filter(|img| !img.is_empty()).collect();
        if batch.is_empty() {
            return Ok(Pushed { written: 0, freed: 0, images });
        }
        let homed_seq = batch.iter().map(|e| e.cil_seq).max().unwrap_or(0);
        let mut homed = reuse_empty(std::mem::take(homed_kept));
        live_items(latest, records, &batch, geo, &mut homed)?;
        homed.sort_unstable_by_key(|(off, _)| *off);
        write_coalesced(dev, &homed, run)?;
        dev.flush()?;
        let held = {
            let mut g = self.inner.lock();
            g.writing_back = false;
            std::mem::take(&mut g.held)
        };
        if !held.is_empty() {
            reuse(held);
        }
        // Records are written home in sequence order, so everything up to here is home: a
        // cache may now drop what these records logged and read it back from home.
        self.home_seq.fetch_max(homed_seq, Release);
        let (hdr, blkno) = self.advance_tail();
        dev.write_at(&hdr.encode(blkno)[..], blkno * BLOCK_SIZE as u64)?;
        dev.flush()?;
        self.release_ring(freed);
        let written = homed.len() as u64;
        *homed_kept = reuse_empty(homed);
        let retired: Vec<Written> =
            batch.iter().map(|e| records.remove(&e.rec_seq).expect("a record in the batch was taken in")).collect();
        self.held_bytes.fetch_sub(retired.iter().map(Written::bytes).sum(), Relaxed);
        images.extend(retired.into_iter().flat_map(|w| w.items).map(|(_, img)| img).filter(|img| !img.is_empty()));
        Ok(Pushed { written, freed, images })
    }

    /// Under one hold of the AIL lock: the durable records numbered from `indexed_below` on
    /// (for writeback's map, which so takes in every record durable before this hold), then
    /// the oldest durable records until `need_free` ring blocks would be free (the batch, and
    /// the ring blocks it frees). Marked as writing back in the same hold: a revoke made
    /// durable after it is not in the map, and `reusable` then holds its extents back.
    fn take_batch(&self, need_free: u64, indexed_below: u64) -> Taken {
        let mut g = self.inner.lock();
        // The list is numbered consecutively, and records leave it only once taken in.
        let taken_in = indexed_below.saturating_sub(g.entries.front().map_or(indexed_below, |e| e.rec_seq)) as usize;
        debug_assert!(
            g.entries.iter().take(taken_in).all(|e| matches!(e.durable, Durability::TakenIn)),
            "a record below the index is not taken in"
        );
        let mut new: Vec<(u64, Written)> = Vec::new();
        for e in g.entries.iter_mut().skip(taken_in) {
            match std::mem::replace(&mut e.durable, Durability::TakenIn) {
                Durability::Durable(w) => new.push((e.rec_seq, w)),
                other => {
                    e.durable = other;
                    break;
                }
            }
        }
        let free = self.ring_blocks - self.used_blocks.load(Relaxed);
        let (mut n, mut freed) = (0, 0);
        for e in &g.entries {
            if matches!(e.durable, Durability::Writing) || free + freed >= need_free {
                break;
            }
            n += 1;
            freed += e.span;
        }
        g.writing_back = n > 0;
        Taken { batch: g.entries.drain(..n).collect(), freed, new }
    }

    /// Give the ring blocks behind a tail whose header is durable back to `reserve`. Only
    /// then: until that header is durable a crash recovers from the old tail, whose records
    /// must still be in place for the scan to reach the records after them. Under the AIL
    /// lock, as `reserve`'s read-modify-write of `used_blocks` is.
    fn release_ring(&self, freed: u64) {
        let _g = self.inner.lock();
        let used = self.used_blocks.fetch_sub(freed, Relaxed);
        debug_assert!(freed <= used, "writeback freed {freed} ring blocks of {used} in use");
    }

    fn advance_tail(&self) -> (LogHeader, u64) {
        let mut g = self.inner.lock();
        let (tail_off, tail_seq) = g.entries.front().map_or((g.head, g.next_rec_seq), |e| (e.off, e.rec_seq));
        g.gen += 1;
        let h = LogHeader { gen: g.gen, epoch: g.epoch, tail_off, tail_seq };
        (h, self.log_start + (g.gen & 1))
    }
}

/// The images to write home for `batch`, as (home offset, image) into `out`; revokes write
/// nothing.
///
/// An item whose newest record is in the batch is written from it and leaves `latest`. A
/// block that a later record (in `records`) logged again is written from that record now,
/// once: that record may carry only the chunks changed since the batch's image, so the tail
/// may pass the batch only once the block at home is at least as new (the rule that lets
/// recovery lay chunks over the home block). An inode relogged later is skipped: its later
/// image is whole. A record that became durable after the batch was taken is in neither map:
/// the batch may then write an older image home, which that record's own writeback
/// overwrites later (and a revoke among them is covered by `reusable`).
fn live_items<'b>(
    latest: &mut FxHashMap<ItemKey, Newest>,
    records: &'b FxHashMap<u64, Written>,
    batch: &[Entry],
    geo: &Geometry,
    out: &mut Vec<(u64, &'b [u8])>,
) -> io::Result<()> {
    // Verified as its reads will verify it, in debug builds, before it is written home.
    let homed_at = |k: ItemKey, img: &'b [u8]| -> io::Result<(u64, &'b [u8])> {
        debug_assert_verified(k, img, geo, "written home");
        let off = match k {
            ItemKey::Block(b) => b * BLOCK_SIZE as u64,
            ItemKey::Inode(ino) => geo.inode_offset(ino).map_err(io::Error::other)?,
            ItemKey::Revoke(_) => unreachable!("revokes are never written home"),
        };
        Ok((off, img))
    };
    for e in batch {
        let w = &records[&e.rec_seq];
        for (k, img) in &w.items {
            let home_key = home(*k);
            let Some(newest) = latest.get_mut(&home_key) else { continue };
            if newest.rec_seq == e.rec_seq {
                let homed = newest.homed;
                latest.remove(&home_key);
                if !homed && !matches!(k, ItemKey::Revoke(_)) {
                    out.push(homed_at(*k, img)?);
                }
            } else if matches!(home_key, ItemKey::Block(_)) && !newest.homed {
                debug_assert!(
                    newest.rec_seq > e.rec_seq,
                    "{home_key:?}: newest record {} before {}",
                    newest.rec_seq,
                    e.rec_seq
                );
                newest.homed = true;
                if let Some(img) = records[&newest.rec_seq].image_of(home_key) {
                    out.push(homed_at(home_key, img)?);
                }
            }
        }
    }
    // A burst of checkpoints grows the map; give the memory back once writeback drained it
    // (rarely: only when it is four times larger than it needs to be).
    if latest.capacity() > 4 * latest.len().max(1024) {
        latest.shrink_to_fit();
    }
    Ok(())
}

/// `v` emptied, as a vector of another element type of the same size and alignment with its
/// allocation kept (the standard library collects in place then): writeback's scratch holds
/// slices of one writeback's records, and is kept between writebacks without them.
fn reuse_empty<T, U>(mut v: Vec<T>) -> Vec<U> {
    v.clear();
    v.into_iter().map(|_| -> U { unreachable!("emptied") }).collect()
}

/// Largest single write writeback issues.
const COALESCE_MAX: usize = 1 << 20;

/// Write sorted `(offset, bytes)` pieces, merging runs that are contiguous on disk (inodes of
/// one table block, neighbouring bitmap blocks) into one write each, gathered in `run`.
fn write_coalesced(dev: &dyn BlockDevice, pieces: &[(u64, &[u8])], run: &mut Vec<u8>) -> io::Result<()> {
    run.clear();
    let mut run_off = 0;
    for &(off, bytes) in pieces {
        if !run.is_empty() && (run_off + run.len() as u64 != off || run.len() + bytes.len() > COALESCE_MAX) {
            dev.write_at(run, run_off)?;
            run.clear();
        }
        if run.is_empty() {
            run_off = off;
        }
        run.extend_from_slice(bytes);
    }
    if !run.is_empty() {
        dev.write_at(run, run_off)?;
    }
    run.clear();
    Ok(())
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::*;
    use crate::dev::MemDevice;
    use crate::format::{init_header, seal_block, MAGIC_BITMAP};
    use crate::mkfs::{self, MkfsOptions};

    const DEV_BYTES: u64 = 64 << 20;

    /// Three records log block 100 (versions 1-3) and the first also block 101. Taking them
    /// in keeps only the newest image of 100; writing back writes each block once, newest.
    #[test]
    fn superseded_images_are_dropped_when_taken_in_and_never_written() {
        let geo =
            mkfs::plan(DEV_BYTES, &MkfsOptions { ag_count: Some(1), ..MkfsOptions::default() }).expect("geometry");
        let dev = MemDevice::new(DEV_BYTES);
        let ail = Ail::new(geo.ag_layout(0).log, 64, LogHeader { gen: 0, epoch: 1, tail_off: 0, tail_seq: 1 });
        // Sealed blocks (writeback verifies what it writes home in debug builds), filled
        // with `v` after the header.
        let block = |blkno: u64, v: u8| {
            let mut b = vec![v; BLOCK_SIZE];
            init_header(&mut b, MAGIC_BITMAP, blkno, 0);
            seal_block(&mut b, 1);
            b.into_boxed_slice()
        };
        for v in 1..=3u8 {
            let (rec_seq, _, _) = ail.reserve(2).expect("room");
            let mut items = vec![(ItemKey::Block(100), block(100, v))];
            if v == 1 {
                items.push((ItemKey::Block(101), block(101, 9)));
            }
            ail.mark_durable(rec_seq, u64::from(v), items);
        }
        assert_eq!(ail.held_bytes(), 4 * BLOCK_SIZE as u64);
        let Pushed { written, freed, images } = ail.push(&dev, &geo, 0, &|_| {}).expect("take in");
        assert_eq!((written, freed), (0, 0), "taking in writes nothing");
        assert_eq!(images.len(), 2, "the two older images of block 100 are handed back");
        assert_eq!(ail.held_bytes(), 2 * BLOCK_SIZE as u64);
        let Pushed { written, freed, .. } = ail.push(&dev, &geo, 64, &|_| {}).expect("writeback");
        assert_eq!((written, freed), (2, 6));
        assert_eq!(ail.held_bytes(), 0);
        let mut home = vec![0u8; 2 * BLOCK_SIZE];
        dev.read_at(&mut home, 100 * BLOCK_SIZE as u64).expect("read home");
        assert_eq!(home[..BLOCK_SIZE], block(100, 3)[..], "block 100 holds the newest image");
        assert_eq!(home[BLOCK_SIZE..], block(101, 9)[..]);
    }

    /// Ring blocks a writeback frees are not claimed before the header naming the new tail is
    /// durable: a crash in between recovers from the old tail, and a record written over it
    /// would end the scan there, before the durable records that follow.
    #[test]
    fn freed_ring_blocks_wait_for_the_new_tail_to_be_durable() {
        /// Tries a reservation while the header of the new tail is being written.
        struct HeaderProbe<'a> {
            dev: MemDevice,
            headers: std::ops::Range<u64>,
            ail: &'a Ail,
            claimed: std::sync::Mutex<Vec<bool>>,
        }
        impl BlockDevice for HeaderProbe<'_> {
            fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
                self.dev.read_at(buf, off)
            }
            fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
                if self.headers.contains(&off) {
                    self.claimed.lock().unwrap().push(self.ail.reserve(8).is_ok());
                }
                self.dev.write_at(buf, off)
            }
            fn flush(&self) -> io::Result<()> {
                self.dev.flush()
            }
            fn size(&self) -> u64 {
                self.dev.size()
            }
        }
        let geo =
            mkfs::plan(DEV_BYTES, &MkfsOptions { ag_count: Some(1), ..MkfsOptions::default() }).expect("geometry");
        let log = geo.ag_layout(0).log;
        let ail = Ail::new(log, 64, LogHeader { gen: 0, epoch: 1, tail_off: 0, tail_seq: 1 });
        for i in 0..8u64 {
            let (rec_seq, _, _) = ail.reserve(8).expect("room");
            let mut b = vec![1u8; BLOCK_SIZE];
            init_header(&mut b, MAGIC_BITMAP, 100 + i, 0);
            seal_block(&mut b, 1);
            ail.mark_durable(rec_seq, i + 1, vec![(ItemKey::Block(100 + i), b.into_boxed_slice())]);
        }
        assert!(ail.reserve(8).is_err(), "the ring is full");
        let block = BLOCK_SIZE as u64;
        let dev = HeaderProbe {
            dev: MemDevice::new(DEV_BYTES),
            headers: log * block..(log + 2) * block,
            ail: &ail,
            claimed: Default::default(),
        };
        let Pushed { freed, .. } = ail.push(&dev, &geo, 64, &|_| {}).expect("writeback");
        assert_eq!(freed, 64);
        assert_eq!(*dev.claimed.lock().unwrap(), [false], "ring space claimed before the new tail was durable");
        assert!(ail.reserve(8).is_ok(), "the freed ring is claimable once the tail is durable");
    }

    /// Writeback's scratch outlives the records its slices point into only through
    /// `reuse_empty`, which must keep the allocation (or the scratch is new memory each time).
    #[test]
    fn writeback_scratch_keeps_its_allocation_between_writebacks() {
        let image = [7u8; 16];
        let mut homed: Vec<(u64, &[u8])> = Vec::with_capacity(1000);
        homed.push((0, &image[..]));
        let kept: Vec<(u64, &'static [u8])> = reuse_empty(homed);
        assert!(kept.is_empty());
        assert_eq!(kept.capacity(), 1000);
        let again: Vec<(u64, &[u8])> = reuse_empty(kept);
        assert_eq!(again.capacity(), 1000);
    }
}
