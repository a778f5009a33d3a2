//! Threads for the requests that wait on the device: fsync and fsyncdir force the log and
//! flush, which on a disk takes milliseconds. They run here, not on a worker reading
//! `/dev/fuse`, so the workers reading can stay few (one per CPU while few clients are active:
//! fewer idle readers for the kernel to wake per request) and never all sit in a flush while
//! other requests queue in the kernel.
//! Concurrent fsyncs here still share one log write (the journal's group commit). The reply
//! travels with the job: fuser's replies may be sent from any thread.
//!
//! The queue is bounded ([`SYNC_QUEUE_MAX`]): a worker that finds it full waits for room
//! rather than reading more requests, so a stalled device holds requests back in the kernel
//! instead of growing the daemon's memory; no request is ever dropped.

use ferrofs_lockstat::{Condvar, LockClass, Mutex};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Threads of the pool: how many device waits may be in flight at once. Idle ones cost a
/// stack's address space and nothing else.
pub const SYNC_THREADS: usize = 16;
/// Jobs waiting for a sync thread, at most. A job is a boxed closure holding its reply (well
/// under a KiB), so a full queue costs little; normally it is near empty, since the threads
/// take jobs as fast as the journal's group commit answers them. More waiting than this means
/// the device is far behind, and then the submitting worker waiting is the backpressure wanted.
pub const SYNC_QUEUE_MAX: usize = 256;

static SYNC_QUEUE: LockClass = LockClass::new("fuse-sync-queue");

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    /// Signalled when a job is queued or the pool closes.
    queued: Condvar,
    /// Signalled when a job leaves a full queue.
    room: Condvar,
    capacity: usize,
}

pub struct SyncPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl SyncPool {
    /// `threads` sync threads sharing a queue of at most `capacity` waiting jobs.
    pub fn start(threads: usize, capacity: usize) -> io::Result<SyncPool> {
        debug_assert!(threads > 0 && capacity > 0);
        let queue = Queue { jobs: VecDeque::with_capacity(capacity), closed: false };
        let shared = Arc::new(Shared {
            queue: Mutex::new(&SYNC_QUEUE, queue),
            queued: Condvar::new(),
            room: Condvar::new(),
            capacity,
        });
        let mut pool = SyncPool { shared, threads: Vec::with_capacity(threads) };
        for _ in 0..threads {
            let shared = Arc::clone(&pool.shared);
            // On failure `pool` is dropped, which stops the threads already started.
            pool.threads.push(std::thread::Builder::new().name("ferrofs-sync".into()).spawn(move || serve(&shared))?);
        }
        Ok(pool)
    }

    /// Queue `job`, waiting first while the queue is full. The wait ends: the sync threads
    /// take jobs until the pool closes, and it closes only when dropped, which cannot happen
    /// while this call borrows it.
    pub fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let mut q = self.shared.queue.lock();
        while q.jobs.len() >= self.shared.capacity {
            self.shared.room.wait(&mut q);
        }
        debug_assert!(!q.closed);
        q.jobs.push_back(Box::new(job));
        debug_assert!(q.jobs.len() <= self.shared.capacity);
        drop(q);
        self.shared.queued.notify_one();
    }
}

/// Run jobs until the pool closes and its queue is empty: every submitted request is
/// answered before the engine is unmounted.
fn serve(shared: &Shared) {
    loop {
        let job = {
            let mut q = shared.queue.lock();
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    shared.room.notify_one();
                    break job;
                }
                if q.closed {
                    return;
                }
                shared.queued.wait(&mut q);
            }
        };
        job();
    }
}

impl Drop for SyncPool {
    fn drop(&mut self) {
        self.shared.queue.lock().closed = true;
        self.shared.queued.notify_all();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

    #[test]
    fn every_job_runs_before_the_pool_is_gone() {
        let done = Arc::new(AtomicUsize::new(0));
        let pool = SyncPool::start(3, 8).unwrap();
        for _ in 0..100 {
            let done = Arc::clone(&done);
            pool.submit(move || {
                std::thread::sleep(std::time::Duration::from_micros(50));
                done.fetch_add(1, Relaxed);
            });
        }
        drop(pool);
        assert_eq!(done.load(Relaxed), 100);
    }

    #[test]
    fn a_full_queue_holds_the_submitter_back_and_drops_nothing() {
        const CAPACITY: usize = 2;
        let pool = Arc::new(SyncPool::start(1, CAPACITY).unwrap());
        let done = Arc::new(AtomicUsize::new(0));
        let job = |done: &Arc<AtomicUsize>| {
            let done = Arc::clone(done);
            move || {
                done.fetch_add(1, Relaxed);
            }
        };
        // The one thread takes a job that waits for the gate; then two more fill the queue.
        let (started_tx, started) = std::sync::mpsc::channel();
        let (open, gate) = std::sync::mpsc::channel::<()>();
        pool.submit(move || {
            started_tx.send(()).unwrap();
            gate.recv().unwrap();
        });
        started.recv().unwrap();
        for _ in 0..CAPACITY {
            pool.submit(job(&done));
        }
        let submitted = Arc::new(AtomicUsize::new(0));
        let submitter = {
            let (pool, submitted, job) = (Arc::clone(&pool), Arc::clone(&submitted), job(&done));
            std::thread::spawn(move || {
                pool.submit(job);
                submitted.fetch_add(1, Relaxed);
            })
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert_eq!(submitted.load(Relaxed), 0, "a submit into a full queue returned");
        assert_eq!(pool.shared.queue.lock().jobs.len(), CAPACITY);
        open.send(()).unwrap();
        submitter.join().unwrap();
        assert_eq!(submitted.load(Relaxed), 1);
        drop(Arc::into_inner(pool).expect("the submitter is gone"));
        assert_eq!(done.load(Relaxed), CAPACITY + 1, "every job ran");
    }
}
