//! The synchronisation primitives under the structures that the model checker explores: the
//! raw locks inside `lockstat`'s locks, the atomics of the CIL, the caches and the lock
//! counters, and their thread-locals.
//!
//! The locks are `std::sync`'s, not `parking_lot`'s: both park on a futex, but a contended
//! `parking_lot` lock first spins with `sched_yield`, which with many more threads than CPUs
//! hands the CPU to other waiters instead of the lock holder (with 48 threads on 2 CPUs, 15%
//! of the CPU time of `ferrofs bench scale` went to `sched_yield` and its context switches,
//! and a shared-directory create ran at 45% of its best rate, against 96% with `std`'s locks,
//! which spin briefly without yielding). Their
//! poisoning is ignored: a panic while a lock is held is a bug, not a state to report.
//! The atomics and thread-locals are `std`'s, so the indirection costs nothing.
//! With the `shuttle` feature all of them are the [shuttle](https://docs.rs/shuttle) model checker's
//! (`tests/model_check.rs`): every lock operation and atomic access then becomes a point where
//! the checker may switch threads, and the thread-locals are per checker thread (shuttle runs
//! its threads as coroutines on one OS thread, so `std`'s would be shared by all of them).
//! Such a build runs only under the checker: outside `shuttle::check_*` its primitives panic.
//!
//! Why shuttle and not loom: loom explores exhaustively, which cannot finish for a CIL switch
//! that visits every shard, or a cache with eight shards per AG, and it needs every primitive
//! of the code under test swapped, including `Arc` and the `parking_lot` locks' API. Shuttle's
//! randomized and PCT schedulers find bugs of small depth (a missing lock, a check made outside
//! the lock) with high probability in thousands of schedules, and only these few types change.
//! Shuttle treats every atomic as `SeqCst`, so it cannot find a missing `Acquire`/`Release`:
//! the orderings stay a matter for review.

pub use unpoisoned::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, WaitTimeoutResult};
#[cfg(not(feature = "shuttle"))]
pub use std::sync::atomic;
#[cfg(not(feature = "shuttle"))]
pub use std::thread_local;
#[cfg(feature = "shuttle")]
pub use shuttle::sync::atomic;
#[cfg(feature = "shuttle")]
pub use shuttle::thread_local;

/// `std::sync`'s (or shuttle's, which copy their API) locks behind the small API that
/// `lockstat` uses: no poisoning, `try_*` returning `Option`, a condition variable that waits
/// on `&mut` guards.
mod unpoisoned {
    #[cfg(not(feature = "shuttle"))]
    use std::sync as s;
    #[cfg(feature = "shuttle")]
    use shuttle::sync as s;
    use std::fmt;
    use std::ops::{Deref, DerefMut};
    #[cfg(not(feature = "shuttle"))]
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::{PoisonError, TryLockError, TryLockResult};
    use std::time::Duration;

    pub use s::{RwLockReadGuard, RwLockWriteGuard};

    /// The guard if the lock was free, poisoned or not; `None` if it was held.
    fn untried<G>(r: TryLockResult<G>) -> Option<G> {
        match r {
            Ok(g) => Some(g),
            Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    #[derive(Default)]
    pub struct Mutex<T>(s::Mutex<T>);

    /// The guard in an `Option` so that [`Condvar::wait`] can hand it to the condition
    /// variable (which takes guards by value) and put the returned one back.
    pub struct MutexGuard<'a, T>(Option<s::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        pub const fn new(value: T) -> Self {
            Mutex(s::Mutex::new(value))
        }
        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
        }
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            untried(self.0.try_lock()).map(|g| MutexGuard(Some(g)))
        }
        pub fn into_inner(self) -> T {
            self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
        }
        pub fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
        }
    }

    impl<T: fmt::Debug> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("Mutex { .. }")
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.0.as_ref().expect("guard is only empty inside Condvar::wait")
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.0.as_mut().expect("guard is only empty inside Condvar::wait")
        }
    }

    #[derive(Default)]
    pub struct RwLock<T>(s::RwLock<T>);

    impl<T> RwLock<T> {
        pub const fn new(value: T) -> Self {
            RwLock(s::RwLock::new(value))
        }
        pub fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(PoisonError::into_inner)
        }
        /// Exclusive access. The first writer to wait for a lock spins for it briefly
        /// before it sleeps: see [`write_spin`].
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
            #[cfg(not(feature = "shuttle"))]
            {
                // Counted on the contended path only, whoever calls.
                if let Some(g) = self.try_write() {
                    return g;
                }
                let waiting = write_spin::waiting_writers(self);
                let g = match waiting.fetch_add(1, Relaxed) {
                    0 => write_spin::spin(|| self.try_write()),
                    _ => None,
                };
                let g = g.unwrap_or_else(|| self.0.write().unwrap_or_else(PoisonError::into_inner));
                waiting.fetch_sub(1, Relaxed);
                g
            }
            #[cfg(feature = "shuttle")]
            self.0.write().unwrap_or_else(PoisonError::into_inner)
        }
        pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
            untried(self.0.try_read())
        }
        pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
            untried(self.0.try_write())
        }
        pub fn into_inner(self) -> T {
            self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
        }
        pub fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
        }
    }

    impl<T: fmt::Debug> fmt::Debug for RwLock<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("RwLock { .. }")
        }
    }

    /// Brief spinning for a held write lock, for the first writer that waits on it.
    ///
    /// Two threads mutating one directory take turns on its inode lock. `std`'s lock spins
    /// about a hundred loads before it sleeps on the futex, shorter than the holder's
    /// critical section (2-4 us for a create, unlink or rename), so on 2 CPUs nearly every
    /// turn cost a sleep, a wake and a context switch: one shared directory did 0.53-0.69 of
    /// its 1-thread rate with 2 threads in `ferrofs bench scale`. Spinning up to
    /// [`SPIN_LIMIT`] takes the lock as the holder lets it go: 0.82-0.97 of the 1-thread
    /// rate. But every waiter spinning burns the CPU the holder needs when threads outnumber
    /// CPUs (all waiters spinning cost 48 threads 2-12%), so only the first writer to
    /// wait spins: the rest sleep at once, as before. Waiters are counted per stripe of lock
    /// addresses, on the contended path only; locks that share a stripe only spin less.
    #[cfg(not(feature = "shuttle"))]
    pub(super) mod write_spin {
        use crossbeam_utils::CachePadded;
        use std::sync::atomic::AtomicU32;
        use std::time::{Duration, Instant};

        /// Longer than the directory operations' critical sections, short against a time
        /// slice: a holder that was preempted costs a spinner this much.
        pub const SPIN_LIMIT: Duration = Duration::from_micros(10);
        /// Pauses between tries: a try is a load while the lock is held, so a short gap
        /// takes the lock soon after the holder lets it go.
        const SPIN_PAUSES: u32 = 4;
        const STRIPES: usize = 64;
        static WAITING_WRITERS: [CachePadded<AtomicU32>; STRIPES] = [const { CachePadded::new(AtomicU32::new(0)) }; STRIPES];

        /// The count of writers waiting for `lock` or for a lock that shares its stripe.
        pub fn waiting_writers<T>(lock: &T) -> &'static AtomicU32 {
            // By cache line: the locks that meet on hot paths (inodes, padded cache shards)
            // are lines apart.
            &WAITING_WRITERS[(lock as *const T as usize >> 6) % STRIPES]
        }

        /// `try_lock` until it succeeds or [`SPIN_LIMIT`] has passed.
        pub fn spin<G>(try_lock: impl Fn() -> Option<G>) -> Option<G> {
            let start = Instant::now();
            loop {
                if let Some(g) = try_lock() {
                    return Some(g);
                }
                if start.elapsed() >= SPIN_LIMIT {
                    return None;
                }
                for _ in 0..SPIN_PAUSES {
                    std::hint::spin_loop();
                }
            }
        }
    }

    #[derive(Debug, Default)]
    pub struct Condvar(s::Condvar);

    #[derive(Debug)]
    pub struct WaitTimeoutResult(bool);

    impl WaitTimeoutResult {
        pub fn timed_out(&self) -> bool {
            self.0
        }
    }

    impl Condvar {
        pub const fn new() -> Self {
            Condvar(s::Condvar::new())
        }
        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let g = guard.0.take().expect("guard held");
            guard.0 = Some(self.0.wait(g).unwrap_or_else(PoisonError::into_inner));
        }
        pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) -> WaitTimeoutResult {
            let g = guard.0.take().expect("guard held");
            let (g, r) = self.0.wait_timeout(g, timeout).unwrap_or_else(PoisonError::into_inner);
            guard.0 = Some(g);
            WaitTimeoutResult(r.timed_out())
        }
        pub fn notify_one(&self) {
            self.0.notify_one();
        }
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::unpoisoned::{write_spin, RwLock};
    use std::sync::atomic::Ordering::Relaxed;

    /// Every waiter that counted itself uncounts itself, spinner or sleeper: a count left
    /// behind would stop that stripe's locks from ever spinning again.
    #[test]
    fn contended_writers_leave_no_waiter_counted() {
        let lock = RwLock::new(0u64);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    for _ in 0..5_000 {
                        let mut g = lock.write();
                        // Held long enough that the others wait: some spin, some sleep.
                        for _ in 0..200 {
                            std::hint::spin_loop();
                        }
                        *g += 1;
                    }
                });
            }
        });
        assert_eq!(*lock.read(), 20_000);
        assert_eq!(write_spin::waiting_writers(&lock).load(Relaxed), 0);
    }
}
