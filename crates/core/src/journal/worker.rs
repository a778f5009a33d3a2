//! The journal's background threads: the CIL worker, which checkpoints on the push
//! threshold and the timer, and the AIL writer, which writes the log home.

use super::checkpoint::PushState;
use super::Journal;
use crate::error::Result;
use crate::lockstat::MutexGuard;
use crate::sync::atomic::Ordering::*;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Default)]
pub(super) struct WorkerState {
    pub(super) push_requested: bool,
    pub(super) ail_requested: bool,
    /// Write the whole log home, not just enough to make room.
    pub(super) ail_all_requested: bool,
    /// A CIL push was requested: the writer takes in the records durable since its last
    /// wake (dropping the images they supersede) and writes only if memory asks for it.
    pub(super) ail_take_in_requested: bool,
    pub(super) stop: bool,
}

impl Journal {
    pub(super) fn spawn(self: &Arc<Self>, name: &str, f: fn(&Journal)) {
        let j = Arc::clone(self);
        let h = std::thread::Builder::new().name(name.into()).spawn(move || f(&j)).expect("spawn journal thread");
        self.threads.lock().push(h);
    }

    /// Wake the background checkpoint. Every commit past the push threshold asks until the
    /// worker has switched the CIL, so the flag keeps all but the first of them off the
    /// worker's lock (which would otherwise be a global lock on the commit path).
    pub(super) fn request_push(&self) {
        if self.push_pending.load(Relaxed) || self.push_pending.swap(true, AcqRel) {
            return;
        }
        let mut w = self.worker.lock();
        if !w.push_requested {
            w.push_requested = true;
            self.worker_cv.notify_one();
            // The writer too, to take in what the last checkpoints made durable (`ail_worker`).
            w.ail_take_in_requested = true;
            self.ail_cv.notify_one();
        }
    }

    pub(super) fn request_ail(&self) {
        if self.ail_pending.load(Relaxed) || self.ail_pending.swap(true, AcqRel) {
            return;
        }
        let mut w = self.worker.lock();
        w.ail_requested = true;
        self.ail_cv.notify_one();
    }

    /// The CIL worker's wait: until a push is requested or stop, or `interval` has passed. A
    /// spurious wake is neither a request nor the timer.
    pub(super) fn wait_push_request(&self, w: &mut MutexGuard<'_, WorkerState>, interval: Duration) {
        let deadline = Instant::now() + interval;
        while !w.push_requested && !w.stop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            self.worker_cv.wait_for(w, left);
        }
    }

    pub(super) fn cil_worker(&self) {
        // No bound: the worker lives as long as the mount. Each turn waits on `worker_cv` for
        // a push request or the timer; it ends when `shutdown` sets `stop`.
        loop {
            {
                let mut w = self.worker.lock();
                self.wait_push_request(&mut w, self.cfg.push_interval);
                if w.stop {
                    return;
                }
                w.push_requested = false;
            }
            // Cleared before the switch: a commit that crosses the threshold after it asks
            // again, and the loop comes round for it.
            self.push_pending.store(false, Release);
            if self.cil_bytes.load(Relaxed) > 0 {
                if self.checkpoint().is_ok() {
                    self.stats.background_checkpoints.fetch_add(1, Relaxed);
                }
            } else if let Some(mut state) = self.push.try_lock() {
                // Idle: no switch will come to hand the memory out or trim the shards' buffers.
                *state = PushState::default();
                let spare = std::mem::take(&mut self.spare.lock().buffers);
                drop(spare);
                drop(self.take_record_buf());
                for s in self.shards.iter() {
                    // Taken under the lock, freed after it.
                    let free = std::mem::take(&mut s.shard.lock().free);
                    drop(free);
                }
                self.recycled_bytes.store(0, Relaxed);
            }
        }
    }

    pub(super) fn ail_worker(&self) {
        // No bound: the writer lives as long as the mount. Each turn waits on `ail_cv` for a
        // request or the timer; it ends when `shutdown` sets `stop`, or at a failed writeback
        // (the journal has failed).
        loop {
            let (asked, all) = {
                let mut w = self.worker.lock();
                let mut timer = false;
                if !w.ail_requested && !w.ail_take_in_requested && !w.stop {
                    timer = self.ail_cv.wait_for(&mut w, self.cfg.push_interval * 5).timed_out();
                }
                if w.stop {
                    return;
                }
                let (asked, all) = (std::mem::take(&mut w.ail_requested), std::mem::take(&mut w.ail_all_requested));
                w.ail_take_in_requested = false;
                // Taken: a checkpoint past the trigger from now on asks again (one that asked
                // between the take and this store is served by the writeback about to run).
                self.ail_pending.store(false, Release);
                (asked, all || timer)
            };
            // Everything on the timer, so a crash after a quiet period replays almost
            // nothing, and for a cache that wants to drop objects. Asked because the log
            // passed its trigger: back to half the trigger level. Woken by a CIL push: take
            // in the new records only, which drops the images they supersede, and write
            // everything only once the newest images held pass their bound.
            let target = if all {
                self.ail.ring_blocks()
            } else if asked {
                self.ail.ring_blocks() * (100 - self.cfg.ail_push_percent / 2) / 100
            } else {
                0
            };
            if self.push_ail(target).is_err() {
                return;
            }
            if !all
                && self.ail.held_bytes() >= self.cfg.ail_held_max_bytes
                && self.push_ail(self.ail.ring_blocks()).is_err()
            {
                return;
            }
        }
    }

    /// Stop background work, checkpoint everything and write it all home, leaving an empty
    /// log: the next mount replays nothing.
    pub fn shutdown(&self) -> Result<()> {
        {
            let mut w = self.worker.lock();
            w.stop = true;
            self.worker_cv.notify_all();
            self.ail_cv.notify_all();
        }
        for h in self.threads.lock().drain(..) {
            let _ = h.join();
        }
        self.alive()?;
        self.quiesce()
    }

    /// Ask the background writer to write the whole log home (caches want to drop objects
    /// that are only dirty because their images are still in the log).
    pub fn request_writeback(&self) {
        let mut w = self.worker.lock();
        (w.push_requested, w.ail_requested, w.ail_all_requested) = (true, true, true);
        self.worker_cv.notify_one();
        self.ail_cv.notify_one();
    }
}
