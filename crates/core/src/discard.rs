//! Giving free space back to the host (docs/DESIGN.md, "Trim and discard"): `trim` punches
//! every free run of the durable state (fstrim); with `-o discard`, the [`Discarder`] punches
//! the blocks each checkpoint freed once that checkpoint is durable (ext4's discard after
//! commit, XFS's online discard after the CIL push).
//!
//! Both punch only what is free in the durable state, and nothing can be handed out while it
//! is being punched: `trim` punches under the AG lock (`Ag::punch_free_run`); the discarder
//! punches blocks that are still busy (claimed in the AG's in-memory map, which is what the
//! allocator searches) and lets them go only once the punch has returned, as XFS keeps a
//! discarded extent busy until its discard completes.

use crate::ag::Ag;
use crate::dev::BlockDevice;
use crate::error::Result;
use crate::format::{Geometry, BLOCK_SIZE};
use crate::journal::BusyExtent;
use crate::lockstat::{Condvar, LockClass, Mutex};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Ranked after the log's `log-done` (the checkpoint that queues holds it) and the AG lock.
static DISCARD_QUEUE: LockClass = LockClass::ranked("discard-queue", 27);

/// Longest run one punch of `trim` covers (4 MiB): bounds how long it holds an AG lock
/// (punching 4 MiB of written data took 0.2-0.4 ms on tmpfs and 4-14 ms on ext4 on a busy
/// machine, 64 MiB 35-80 ms on either; docs/MEASURED.md).
const TRIM_RUN_MAX_BLOCKS: u64 = 1024;

const BS: u64 = BLOCK_SIZE as u64;

/// What [`FileSystem::trim`](crate::FileSystem::trim) gave back.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrimReport {
    /// Bytes punched: free runs of at least the minimum length.
    pub bytes: u64,
    /// Free runs punched (a run longer than one punch counts once).
    pub extents: u64,
    /// The device cannot punch (a block device without discard, a file system without hole
    /// punching): nothing was given back.
    pub unsupported: bool,
}

/// Punch every free run of at least `minimum_bytes` (one block at least) in every AG. The
/// caller has made every completed free durable and reusable first (`Mount::release_busy`).
pub(crate) fn trim(dev: &dyn BlockDevice, ags: &[Ag], minimum_bytes: u64) -> Result<TrimReport> {
    let min_len = minimum_bytes.div_ceil(BS).max(1);
    let mut report = TrimReport::default();
    for ag in ags {
        // `before`: the blocks of the run being punched in pieces that end at `from`.
        let (mut from, mut before) = (0, 0);
        // Bounded: every turn moves `from` past a run of at least one block of the AG.
        while let Some((start, len, punched)) = ag.punch_free_run(dev, from, min_len, TRIM_RUN_MAX_BLOCKS, before)? {
            if !punched {
                return Ok(TrimReport { unsupported: true, ..report });
            }
            let continues = before > 0 && start == from;
            report.bytes += len * BS;
            report.extents += u64::from(!continues);
            before = if len < TRIM_RUN_MAX_BLOCKS {
                0
            } else if continues {
                before + len
            } else {
                len
            };
            from = start + len;
        }
    }
    // What was punched stays given back across a crash of the host.
    dev.flush()?;
    Ok(report)
}

/// `-o discard`: a thread that punches the extents of each durable checkpoint's frees, then
/// hands them to the allocator (`Ag::release_busy`). Stopped and drained when dropped.
pub(crate) struct Discarder {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Work queued, or stop.
    work_cv: Condvar,
    /// The queue drained and no batch being punched.
    idle_cv: Condvar,
    dev: Arc<dyn BlockDevice>,
    ags: Arc<[Ag]>,
    geo: Geometry,
    /// The device said it cannot punch: said once, not asked again.
    cannot_punch: AtomicBool,
}

#[derive(Default)]
struct Queue {
    extents: Vec<BusyExtent>,
    /// A batch has been taken and is being punched: its blocks are still busy.
    punching: bool,
    stop: bool,
}

impl Discarder {
    pub(crate) fn start(dev: Arc<dyn BlockDevice>, ags: Arc<[Ag]>, geo: Geometry) -> Discarder {
        let shared = Arc::new(Shared {
            queue: Mutex::new(&DISCARD_QUEUE, Queue::default()),
            work_cv: Condvar::new(),
            idle_cv: Condvar::new(),
            dev,
            ags,
            geo,
            cannot_punch: AtomicBool::new(false),
        });
        let worker = shared.clone();
        let thread = std::thread::Builder::new()
            .name("ferrofs-discard".into())
            .spawn(move || worker.run())
            .expect("spawn discard thread");
        Discarder { shared, thread: Some(thread) }
    }

    /// Where a durable checkpoint's frees go instead of straight to the allocator.
    pub(crate) fn queue_fn(&self) -> impl Fn(Vec<BusyExtent>) + Send + Sync + 'static {
        let shared = self.shared.clone();
        move |busy| shared.queue(busy)
    }

    /// Wait until every extent queued so far is punched and back in the allocator.
    pub(crate) fn wait_idle(&self) {
        let mut q = self.shared.queue.lock();
        // Bounded: the thread empties the queue, and each wake re-checks.
        while q.punching || !q.extents.is_empty() {
            self.shared.idle_cv.wait(&mut q);
        }
    }
}

impl Drop for Discarder {
    fn drop(&mut self) {
        self.shared.queue.lock().stop = true;
        self.shared.work_cv.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn queue(&self, busy: Vec<BusyExtent>) {
        if busy.is_empty() {
            return;
        }
        self.queue.lock().extents.extend(busy);
        self.work_cv.notify_one();
    }

    /// Until stopped with nothing queued: take everything queued (the frees of every
    /// checkpoint completed since the last turn: one batch), punch it, release it.
    fn run(&self) {
        loop {
            let batch = {
                let mut q = self.queue.lock();
                while q.extents.is_empty() && !q.stop {
                    self.work_cv.wait(&mut q);
                }
                if q.extents.is_empty() {
                    return;
                }
                q.punching = true;
                std::mem::take(&mut q.extents)
            };
            self.punch(&batch);
            for e in &batch {
                self.ags[self.geo.block_ag(e.blkno) as usize].release_busy(e.blkno, e.len as u64);
            }
            self.queue.lock().punching = false;
            self.idle_cv.notify_all();
        }
    }

    /// Punch a batch, neighbours merged into one hole. A failed punch loses nothing (the
    /// blocks are free either way), so it is reported and the batch goes on.
    fn punch(&self, batch: &[BusyExtent]) {
        let mut runs: Vec<(u64, u64)> = batch.iter().map(|e| (e.blkno, e.len as u64)).collect();
        runs.sort_unstable();
        runs.dedup_by(|next, run| {
            debug_assert!(run.0 + run.1 <= next.0, "busy extents never overlap");
            let adjacent = run.0 + run.1 == next.0;
            if adjacent {
                run.1 += next.1;
            }
            adjacent
        });
        for (blkno, len) in runs {
            if self.cannot_punch.load(Relaxed) {
                return;
            }
            match self.dev.punch(blkno * BS, len * BS) {
                Ok(true) => {}
                Ok(false) => {
                    log::warn!("discard: the device cannot punch holes; freed blocks stay allocated on it");
                    self.cannot_punch.store(true, Relaxed);
                }
                Err(e) => log::warn!("discard of blocks {blkno}..{}: {e}", blkno + len),
            }
        }
    }
}
