//! Checkpoints: the switch that closes a CIL sequence and merges its shards, the record's
//! log space (head) and its write, completion in sequence order, and the AIL pushes that move
//! the tail.

use super::ail::{self, SealedImages};
use super::cil::{Buffers, BusyExtent, CilBatch, CilItem, ShardSlot, IMAGE_KINDS};
use super::{debug_assert_verified, Journal};
use crate::error::{Error, Result};
use crate::format::log::{logged_bytes, write_record, ChunkMask, ItemKey, ALL_CHUNKS, RECORD_HDR};
use crate::format::{seal_block, DiskInode, BLOCK_SIZE};
use crate::lockstat::MutexGuard;
use crate::sync::atomic::Ordering::*;
use crate::sync::RwLockWriteGuard;
use rustc_hash::FxHashMap;

/// What the push lock keeps from one switch to the next, emptied with its capacity kept: the
/// merged batches' item maps (a shard's new batch starts at the size its last one grew to
/// instead of rehashing its way up again), and the map a switch merges them into (megabytes
/// for a busy checkpoint: allocated afresh by whichever thread checkpointed, it left holes of
/// that size in every thread's malloc arena). Freed when the journal goes idle.
#[derive(Default)]
pub(super) struct PushState {
    pub(super) maps: Vec<FxHashMap<ItemKey, CilItem>>,
    pub(super) merged: FxHashMap<ItemKey, CilItem>,
}

/// One item of a checkpoint: its newest image (`None`: the block was freed, logged as a
/// revoke) and the chunks of it that changed since its previous image in the log.
pub(super) struct Checkpointed {
    pub(super) key: ItemKey,
    pub(super) image: Option<Box<[u8]>>,
    pub(super) changed: ChunkMask,
}

impl Checkpointed {
    /// How the record carries the item: a freed block as its revoke, a block with its header
    /// chunk among its changes (the seal writes the lsn and crc there).
    pub(super) fn logged(&self) -> (ItemKey, ChunkMask) {
        debug_assert!(
            self.image.is_some() || matches!(self.key, ItemKey::Block(_)),
            "{:?}: only blocks are revoked",
            self.key
        );
        match (self.key, &self.image) {
            (ItemKey::Block(b), None) => (ItemKey::Revoke(b), ALL_CHUNKS),
            (k, _) => (k, self.changed | 1),
        }
    }
}

/// What a switch took out of the CIL: one sequence's merged items, sorted by home, its freed
/// extents, and what it added to `Journal::in_flight_bytes` (given back once the checkpoint
/// completes).
pub(super) struct Switched {
    pub(super) seq: u64,
    pub(super) items: Vec<Checkpointed>,
    pub(super) busy: Vec<BusyExtent>,
    pub(super) in_flight: u64,
}

/// What a switch counts over the shards it visits (`Journal::take_shard`).
#[derive(Default)]
struct SwitchTally {
    /// Images of each kind the batches taken copied: the spare's demand until the next switch.
    demand: [usize; IMAGE_KINDS],
    /// Bytes of recycled buffers the shards keep.
    kept: usize,
    /// What the batches taken added to `Journal::in_flight_bytes`.
    in_flight: u64,
}

/// Merge one sequence's batches into `merged` and drain it, sorted by home: the items of the
/// checkpoint, and the extents it frees. The batches' emptied maps go to `maps` for the
/// shards' next batches.
fn merge_batches(
    taken: Vec<CilBatch>,
    merged: &mut FxHashMap<ItemKey, CilItem>,
    maps: &mut Vec<FxHashMap<ItemKey, CilItem>>,
) -> (Vec<Checkpointed>, Vec<BusyExtent>) {
    let total = taken.iter().map(|b| b.items.len()).sum();
    debug_assert!(merged.is_empty());
    merged.reserve(total);
    let mut busy = Vec::new();
    for mut shard in taken {
        busy.extend(shard.busy);
        for (k, mut it) in shard.items.drain() {
            // The newest image wins, carrying the changes of both shards' commits: all
            // of them happened since the block's previous image in the log.
            match merged.get_mut(&k) {
                Some(old) if old.version >= it.version => {
                    debug_assert_ne!(old.version, it.version, "{:?}: one version logged twice", k);
                    old.changed |= it.changed;
                }
                Some(old) => {
                    it.changed |= old.changed;
                    *old = it;
                }
                None => {
                    merged.insert(k, it);
                }
            }
        }
        if shard.items.capacity() > 0 {
            maps.push(shard.items);
        }
    }
    let mut items: Vec<_> =
        merged.drain().map(|(key, it)| Checkpointed { key, image: it.image, changed: it.changed }).collect();
    items.sort_unstable_by_key(|it| it.key);
    (items, busy)
}

impl Journal {
    /// Make every change of CIL sequence `seq` (and before) durable. Concurrent callers share
    /// one record (group commit): a force whose sequence a checkpoint in flight has already
    /// closed waits for that record instead of writing one.
    pub fn force(&self, seq: u64) -> Result<()> {
        if self.durable_seq() >= seq {
            return Ok(());
        }
        if self.open_seq() <= seq {
            let push = self.push.lock();
            if self.open_seq() <= seq {
                self.stats.forced_checkpoints.fetch_add(1, Relaxed);
                return self.checkpoint_locked(push, None);
            }
        }
        self.stats.forces_joined.fetch_add(1, Relaxed);
        self.wait_durable(seq)
    }

    /// Make every freed extent reusable: force the log, then wait for a writeback that held
    /// some back (before ENOSPC is reported for space a program has just freed).
    pub fn release_busy(&self) -> Result<()> {
        self.force(self.open_seq())?;
        self.ail.wait_writeback();
        Ok(())
    }

    /// Checkpoint whatever the CIL holds now; returns once it is durable.
    pub fn checkpoint(&self) -> Result<()> {
        self.checkpoint_locked(self.push.lock(), None)
    }

    /// Flush data written in place (fsync of a file whose metadata is already durable).
    /// The note of unflushed data stays for the next checkpoint: a record written while this
    /// flush is in progress may map data written before it, and must not pass it.
    pub fn flush_data(&self) -> Result<()> {
        self.dev.flush().or_else(|e| self.fail(e))
    }

    /// Wait until every CIL sequence up to `seq` is durable.
    pub(super) fn wait_durable(&self, seq: u64) -> Result<()> {
        if self.durable_seq() >= seq {
            return Ok(());
        }
        self.wait_durable_locked(&mut self.done.lock(), seq)
    }

    /// `wait_durable` with `done` held.
    pub(super) fn wait_durable_locked(&self, done: &mut MutexGuard<'_, ()>, seq: u64) -> Result<()> {
        while self.durable_seq() < seq {
            self.alive()?;
            self.done_cv.wait(done);
        }
        Ok(())
    }

    /// Switch the CIL and claim the record's log space under the push lock, then let the lock
    /// go: the next checkpoint may switch and write while this one builds and writes its
    /// record. Records complete in sequence order (`complete`), so a later record is never
    /// acknowledged, or written home, before an earlier one is durable; recovery replays a
    /// record only if every earlier one is intact, so a later record that reaches the disk
    /// first is never replayed without them. `cil_full` (a throttled committer's) is let go
    /// once the switch has emptied the CIL.
    pub(super) fn checkpoint_locked(
        &self,
        mut push: MutexGuard<'_, PushState>,
        cil_full: Option<RwLockWriteGuard<'_, ()>>,
    ) -> Result<()> {
        self.alive()?;
        let Switched { seq, items, busy, in_flight } = self.switch(&mut push);
        drop(cil_full);
        let written = if items.is_empty() {
            drop(push);
            Ok(None)
        } else {
            self.write_checkpoint(seq, items, push).map(Some)
        };
        let completed = written.and_then(|record| self.complete(seq, record, busy));
        self.in_flight_bytes.fetch_sub(in_flight, Relaxed);
        if let Err(e) = completed {
            // The items have left the CIL and are lost: nothing committed later may reach
            // the log either (it may depend on them), so the journal stops here and the
            // image stays at its last durable checkpoint.
            self.set_failed();
            return Err(e);
        }
        if self.ail.used_percent() >= self.cfg.ail_push_percent {
            self.request_ail();
        }
        Ok(())
    }

    /// Make sequence `seq` durable once every earlier one is: its record (`rec_seq`, bytes)
    /// joins the AIL as durable, its freed extents become reusable, and fsyncs waiting for it
    /// are woken. Whoever sees `durable_seq` past a checkpoint (a force, an ENOSPC retry)
    /// therefore finds its freed space back in the allocator.
    pub(super) fn complete(&self, seq: u64, record: Option<(u64, SealedImages)>, busy: Vec<BusyExtent>) -> Result<()> {
        let mut done = self.done.lock();
        self.wait_durable_locked(&mut done, seq - 1)?;
        debug_assert_eq!(self.durable_seq() + 1, seq, "CIL sequences complete in order");
        if let Some((rec_seq, record)) = record {
            self.ail.mark_durable(rec_seq, seq, record);
        }
        (self.on_durable)(self.ail.reusable(busy));
        self.durable_seq.store(seq, Release);
        self.done_cv.notify_all();
        Ok(())
    }

    /// Close the open sequence and take its items out of every shard in use, one shard lock at a
    /// time: a committer preempted while it holds one shard delays that shard's switch only,
    /// never commits to the others (holding all the locks at once, a switch waiting for a
    /// preempted committer's shard stalled every shard it already held: with 48 threads on 2
    /// CPUs that was most of the `cil-shard` wait). Commits that read the sequence before the
    /// close finish under their shard's lock before the switch takes that shard; later ones
    /// read the next sequence. Called under the push lock, so switches never overlap.
    /// Each shard gets back as many recycled images of each kind as it copied in the batch
    /// taken (what is left over is freed) and an emptied map for its new batch; this switch's maps
    /// are recycled in turn.
    pub(super) fn switch(&self, state: &mut PushState) -> Switched {
        let PushState { maps, merged } = state;
        let mut spare = std::mem::take(&mut self.spare.lock().buffers);
        let seq = self.open_seq.fetch_add(1, SeqCst);
        let mut tally = SwitchTally::default();
        let taken: Vec<CilBatch> = self
            .shards
            .iter()
            .filter(|slot| slot.active.load(SeqCst))
            .filter_map(|slot| self.take_shard(slot, seq, maps, &mut spare, &mut tally))
            .collect();
        let mut parked = self.spare.lock();
        parked.buffers.append(&mut spare);
        parked.demand = tally.demand;
        self.recycled_bytes.store((tally.kept + parked.buffers.bytes()) as u64, Relaxed);
        drop(parked);
        let (items, busy) = merge_batches(taken, merged, maps);
        Switched { seq, items, busy, in_flight: tally.in_flight }
    }

    /// Take sequence `seq`'s batch out of one shard (`None`: the shard was idle, and holds
    /// nothing of it), under that shard's lock alone; `switch` visits the shards in use with
    /// it. The shard moves on to the next sequence, with a recycled map for its new batch and
    /// its buffers fitted to what the batch taken copied (from `spare`, or back to it).
    fn take_shard(
        &self,
        slot: &ShardSlot,
        seq: u64,
        maps: &mut Vec<FxHashMap<ItemKey, CilItem>>,
        spare: &mut Buffers,
        tally: &mut SwitchTally,
    ) -> Option<CilBatch> {
        let mut g = slot.shard.lock();
        if g.seq != seq {
            // Idle until a committer that read the new sequence brought it up to
            // that: nothing in it belongs to `seq`.
            debug_assert!(
                g.seq > seq || (g.open.is_empty() && g.next.is_empty()),
                "shard at {} skipped by switch {seq}",
                g.seq
            );
            tally.kept += g.free.bytes();
            return None;
        }
        g.seq = seq + 1;
        let next = std::mem::take(&mut g.next);
        let batch = std::mem::replace(&mut g.open, next);
        // A shard in use (its new batch usually empty yet) starts from a recycled map.
        if !batch.items.is_empty() && g.open.items.capacity() == 0 {
            g.open.items = maps.pop().unwrap_or_default();
        }
        // Moved, not dropped: the budget counts the items and then their record
        // until the record is in the AIL.
        // Most of the 64 shards are idle: no atomics on the committers' counters for them.
        if batch.bytes > 0 {
            let counted = 2 * batch.bytes;
            self.in_flight_bytes.fetch_add(counted, Relaxed);
            debug_assert!(batch.unpublished <= batch.bytes);
            self.cil_bytes.fetch_sub(batch.bytes - batch.unpublished, Relaxed);
            tally.in_flight += counted;
        }
        // Top the shard's buffers up to what this batch used, or trim them to it: a
        // shard that went quiet keeps none. Surplus is freed after the lock.
        let surplus = g.free.fit(batch.copies, spare);
        for (d, c) in tally.demand.iter_mut().zip(batch.copies) {
            *d += c;
        }
        tally.kept += g.free.bytes();
        if batch.is_empty() && g.open.is_empty() {
            // Nothing in it and no buffers kept: later switches skip it until a
            // committer sets the flag again.
            debug_assert!(g.free.is_empty());
            slot.active.store(false, SeqCst);
        }
        drop(g);
        drop(surplus);
        Some(batch)
    }

    /// Claim log space for the record of CIL sequence `seq` under the push lock, then build
    /// and write it without the lock. A block is logged as the chunks that changed since its
    /// previous image in the log, and its header chunk (the seal's lsn and crc), unless all
    /// of it changed. Returns the record's number and its sealed whole images, sorted by home,
    /// for the AIL to write home.
    pub(super) fn write_checkpoint(
        &self,
        seq: u64,
        items: Vec<Checkpointed>,
        push: MutexGuard<'_, PushState>,
    ) -> Result<(u64, SealedImages)> {
        let bytes: usize = items.iter().map(|it| it.logged()).map(|(k, changed)| logged_bytes(k, changed)).sum();
        let blocks = (RECORD_HDR + bytes).div_ceil(BLOCK_SIZE) as u64;
        let (rec_seq, off, epoch) = self.reserve_log(seq, blocks)?;
        drop(push);
        let sealed: Vec<(ItemKey, Box<[u8]>, ChunkMask)> = items
            .into_iter()
            .map(|it| {
                let (k, changed) = it.logged();
                let mut img = it.image.unwrap_or_default();
                match k {
                    ItemKey::Block(_) => seal_block(&mut img, rec_seq),
                    ItemKey::Inode(_) => DiskInode::seal(&mut img, rec_seq),
                    ItemKey::Revoke(_) => {}
                }
                debug_assert_verified(k, &img, &self.geo, "sealed into the log");
                (k, img, changed)
            })
            .collect();
        // Data noted before the switch is flushed before this record, or before an earlier
        // one (whichever took the note), without which this record is never replayed.
        if self.data_dirty.swap(false, Relaxed) {
            self.dev.flush().or_else(|e| self.fail(e))?;
        }
        let at = (self.ail.ring_start() + off) * BLOCK_SIZE as u64;
        let mut buf = self.take_record_buf();
        let logged = sealed.iter().map(|(k, img, changed)| (*k, &img[..], *changed));
        let written = write_record(&mut buf, self.cfg.record_piece_bytes, rec_seq, epoch, logged, |pos, bytes| {
            self.dev.write_at(bytes, at + pos)
        });
        self.give_record_buf(buf);
        let record_bytes = written.or_else(|e| self.fail(e))?;
        debug_assert_eq!(record_bytes, blocks * BLOCK_SIZE as u64);
        self.dev.flush().or_else(|e| self.fail(e))?;
        self.stats.checkpoints.fetch_add(1, Relaxed);
        self.stats.items_logged.fetch_add(sealed.len() as u64, Relaxed);
        self.stats.log_bytes.fetch_add(record_bytes, Relaxed);
        Ok((rec_seq, sealed.into_iter().map(|(k, img, _)| (k, img)).collect()))
    }

    pub(super) fn take_record_buf(&self) -> Vec<u8> {
        let mut kept = self.record_buf.lock();
        self.record_buf_bytes.store(0, Relaxed);
        std::mem::take(&mut *kept)
    }

    /// Keep the larger of `buf` and the buffer kept (a record of one piece sizes its buffer
    /// to fit); the other is freed outside the lock.
    pub(super) fn give_record_buf(&self, mut buf: Vec<u8>) {
        let mut kept = self.record_buf.lock();
        if buf.capacity() > kept.capacity() {
            std::mem::swap(&mut *kept, &mut buf);
            self.record_buf_bytes.store(kept.capacity() as u64, Relaxed);
        }
        drop(kept);
        drop(buf);
    }

    /// Space for the record of CIL sequence `seq`, of `blocks`; when the log is full, write
    /// back the oldest checkpoints right here (the tail must move before the head can).
    /// Called under the push lock.
    pub(super) fn reserve_log(&self, seq: u64, blocks: u64) -> Result<(u64, u64, u64)> {
        if blocks > self.ail.ring_blocks() / 2 {
            return Err(Error::Invalid("checkpoint larger than half the log"));
        }
        let need_free = match self.ail.reserve(blocks) {
            Ok(r) => return Ok(r),
            Err(need_free) => need_free,
        };
        self.stats.log_space_waits.fetch_add(1, Relaxed);
        // Records still in flight hold ring space that writeback cannot free before they are
        // durable: wait for them first.
        self.wait_durable(seq - 1)?;
        self.push_ail(need_free)?;
        // No record is claimed while the push lock is held, and every earlier one is durable:
        // the writeback freed `need_free` blocks, or emptied the AIL, and a record of at most
        // half the ring fits in an empty one wherever the head is.
        let r = self.ail.reserve(blocks);
        debug_assert!(r.is_ok(), "a record of {blocks} blocks does not fit after writeback to {need_free} free blocks");
        r.map_err(|_| Error::Busy("log full after writeback".into()))
    }

    /// Take in the records durable since the last call, then write back the oldest durable
    /// checkpoints until `need_free` blocks of log are free (0: take in only), then move the
    /// tail.
    /// Returns the ring blocks freed.
    pub(super) fn push_ail(&self, need_free: u64) -> Result<u64> {
        if need_free > 0 {
            self.stats.ail_pushes.fetch_add(1, Relaxed);
        }
        let ail::Pushed { written, freed, images } =
            self.ail.push(&*self.dev, &self.geo, need_free, &*self.on_durable).or_else(|e| self.fail(e))?;
        self.stats.items_written_home.fetch_add(written, Relaxed);
        self.recycle(images);
        Ok(freed)
    }

    /// Checkpoint everything and write it all home: the log is empty afterwards and holds no
    /// memory (what unmount, freeze and the memory benchmark want).
    pub fn quiesce(&self) -> Result<()> {
        self.checkpoint()?;
        self.push_ail(self.ail.ring_blocks()).map(|_| ())
    }
}

#[cfg(feature = "shuttle")]
pub(super) type MergedItem = (ItemKey, Option<Box<[u8]>>);

/// What the model checker (`tests/model_check.rs`) looks at: the checkpoint's switch and merge
/// without the log write, and the CIL's byte count.
#[cfg(feature = "shuttle")]
impl Journal {
    /// Close the open sequence as a checkpoint would; returns it and its merged items (a
    /// revoke's image is `None`).
    pub fn switch_for_model(&self) -> (u64, Vec<MergedItem>) {
        let Switched { seq, items, in_flight, .. } = self.switch(&mut PushState::default());
        self.in_flight_bytes.fetch_sub(in_flight, Relaxed);
        (seq, items.into_iter().map(|it| (it.key, it.image)).collect())
    }
}
