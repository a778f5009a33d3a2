//! Threads for the requests that wait on the device: fsync and fsyncdir force the log and
//! flush, which on a disk takes milliseconds. They run here, not on a worker reading
//! `/dev/fuse`, so the workers reading can stay few (one per CPU while few clients are active:
//! fewer idle readers for the kernel to wake per request) and never all sit in a flush while
//! other requests queue in the kernel.
//! Concurrent fsyncs here still share one log write (the journal's group commit). The reply
//! travels with the job: fuser's replies may be sent from any thread.

use ferrofs_lockstat::{Condvar, LockClass, Mutex};
use std::collections::VecDeque;
use std::io;
use std::sync::Arc;
use std::thread::JoinHandle;

/// Threads of the pool: how many device waits may be in flight at once. Idle ones cost a
/// stack's address space and nothing else.
pub const SYNC_THREADS: usize = 16;

static SYNC_QUEUE: LockClass = LockClass::new("fuse-sync-queue");

type Job = Box<dyn FnOnce() + Send>;

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    closed: bool,
}

struct Shared {
    queue: Mutex<Queue>,
    queued: Condvar,
}

pub struct SyncPool {
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl SyncPool {
    pub fn start(threads: usize) -> io::Result<SyncPool> {
        debug_assert!(threads > 0);
        let shared = Arc::new(Shared { queue: Mutex::new(&SYNC_QUEUE, Queue::default()), queued: Condvar::new() });
        let mut pool = SyncPool { shared, threads: Vec::with_capacity(threads) };
        for _ in 0..threads {
            let shared = Arc::clone(&pool.shared);
            // On failure `pool` is dropped, which stops the threads already started.
            pool.threads.push(std::thread::Builder::new().name("ferrofs-sync".into()).spawn(move || serve(&shared))?);
        }
        Ok(pool)
    }

    pub fn submit(&self, job: impl FnOnce() + Send + 'static) {
        let mut q = self.shared.queue.lock();
        debug_assert!(!q.closed);
        q.jobs.push_back(Box::new(job));
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
        let pool = SyncPool::start(3).unwrap();
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
}
