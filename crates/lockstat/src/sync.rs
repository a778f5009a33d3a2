//! The synchronisation primitives under the structures that the model checker explores: the
//! raw locks inside the measured locks, the lock counters, and the atomics and thread-locals
//! of the code that uses them (in ferrofs: the CIL's and the caches').
//!
//! The locks are `std::sync`'s, not `parking_lot`'s: both park on a futex, but a contended
//! `parking_lot` lock first spins with `sched_yield`, which with many more threads than CPUs
//! hands the CPU to other waiters instead of the lock holder (with 48 threads on 2 CPUs, 15%
//! of the CPU time of `ferrofs bench scale` went to `sched_yield` and its context switches,
//! and a shared-directory create ran at 45% of its best rate, against 96% with `std`'s locks,
//! which spin briefly without yielding). Their
//! poisoning is ignored: a panic while a lock is held is a bug, not a state to report.
//! [`StripedRwLock`] is built of them: one per CPU, for the cache shards that every CPU reads.
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

#[cfg(feature = "shuttle")]
pub use shuttle::sync::atomic;
#[cfg(feature = "shuttle")]
pub use shuttle::thread_local;
#[cfg(not(feature = "shuttle"))]
pub use std::sync::atomic;
#[cfg(not(feature = "shuttle"))]
pub use std::thread_local;
pub use striped::StripedRwLock;
pub use unpoisoned::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, WaitTimeoutResult};

/// Which of `shards` (at most 64) holds `key`: the top six bits of a Fibonacci hash, so that
/// consecutive numbers (inodes, blocks, directories) land on different shards.
#[inline]
pub fn shard_of(key: u64, shards: usize) -> usize {
    debug_assert!((1..=64).contains(&shards), "{shards} shards: six bits of hash address 64");
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % shards
}

/// The raw reader-writer locks' API, and what `lockstat::RwLock` needs of the one it
/// measures: [`RwLock`] for most, [`StripedRwLock`] for data that every CPU reads and few write.
pub trait RawRwLock {
    /// The protected value.
    type Target;
    /// Shared access while it lives.
    type ReadGuard<'a>: std::ops::Deref<Target = Self::Target>
    where
        Self: 'a;
    /// Exclusive access while it lives.
    type WriteGuard<'a>: std::ops::DerefMut<Target = Self::Target>
    where
        Self: 'a;
    /// An unlocked lock over `value`.
    fn new(value: Self::Target) -> Self;
    /// Blocks for shared access.
    fn read(&self) -> Self::ReadGuard<'_>;
    /// Blocks for exclusive access.
    fn write(&self) -> Self::WriteGuard<'_>;
    /// Shared access if no writer holds the lock.
    fn try_read(&self) -> Option<Self::ReadGuard<'_>>;
    /// Exclusive access if nobody holds the lock.
    fn try_write(&self) -> Option<Self::WriteGuard<'_>>;
    /// Consumes the lock, returning the value.
    fn into_inner(self) -> Self::Target;
    /// The value through `&mut self`, which proves exclusivity: no locking.
    fn get_mut(&mut self) -> &mut Self::Target;
}

/// A reader-writer lock for data that all CPUs read and few write (the cache shards): one
/// `RwLock<()>` per CPU (up to [`striped::MAX_STRIPES`]), each on a cache line of its own. A
/// reader takes only its CPU's stripe, so readers on different CPUs write no line in common;
/// a writer takes every stripe, in order. (Linux had this as the big-reader lock.)
mod striped {
    use super::{RawRwLock, RwLock, RwLockReadGuard, RwLockWriteGuard};
    use crossbeam_utils::CachePadded;
    use smallvec::SmallVec;
    use std::cell::UnsafeCell;
    use std::fmt;
    use std::ops::{Deref, DerefMut};
    use std::sync::OnceLock;

    /// Beyond this many CPUs, CPUs share stripes: a writer's cost grows with the stripes.
    pub const MAX_STRIPES: usize = 8;

    /// The lock: see the module's description above.
    pub struct StripedRwLock<T> {
        stripes: Box<[CachePadded<RwLock<()>>]>,
        value: UnsafeCell<T>,
    }

    // SAFETY: the value is reached only through the guards: shared (`&T`) under one stripe's
    // read lock, exclusive (`&mut T`) under every stripe's write lock. So, as for `RwLock<T>`,
    // readers on several threads need `T: Sync` and a writer on another thread `T: Send`.
    unsafe impl<T: Send + Sync> Sync for StripedRwLock<T> {}

    /// Shared access: the calling thread's CPU's stripe, read-locked.
    pub struct StripedReadGuard<'a, T> {
        _stripe: RwLockReadGuard<'a, ()>,
        value: &'a T,
    }

    /// Exclusive access: every stripe, write-locked.
    pub struct StripedWriteGuard<'a, T> {
        _stripes: SmallVec<[RwLockWriteGuard<'a, ()>; MAX_STRIPES]>,
        value: &'a mut T,
    }

    impl<T> StripedRwLock<T> {
        /// The stripe of the calling thread's CPU.
        fn stripe(&self) -> &RwLock<()> {
            &self.stripes[super::cpu() % self.stripes.len()]
        }

        fn read_guard<'a>(&'a self, stripe: RwLockReadGuard<'a, ()>) -> StripedReadGuard<'a, T> {
            // SAFETY: a stripe's read lock is held, so no writer holds them all.
            StripedReadGuard { _stripe: stripe, value: unsafe { &*self.value.get() } }
        }

        fn write_guard<'a>(
            &'a self,
            stripes: SmallVec<[RwLockWriteGuard<'a, ()>; MAX_STRIPES]>,
        ) -> StripedWriteGuard<'a, T> {
            debug_assert_eq!(stripes.len(), self.stripes.len(), "a writer holds every stripe");
            // SAFETY: every stripe's write lock is held: no reader, no other writer.
            StripedWriteGuard { _stripes: stripes, value: unsafe { &mut *self.value.get() } }
        }
    }

    impl<T> RawRwLock for StripedRwLock<T> {
        type Target = T;
        type ReadGuard<'a>
            = StripedReadGuard<'a, T>
        where
            T: 'a;
        type WriteGuard<'a>
            = StripedWriteGuard<'a, T>
        where
            T: 'a;

        fn new(value: T) -> Self {
            StripedRwLock {
                stripes: (0..stripes()).map(|_| CachePadded::new(RwLock::new(()))).collect(),
                value: UnsafeCell::new(value),
            }
        }
        fn read(&self) -> StripedReadGuard<'_, T> {
            self.read_guard(self.stripe().read())
        }
        fn write(&self) -> StripedWriteGuard<'_, T> {
            self.write_guard(self.stripes.iter().map(|s| s.write()).collect())
        }
        fn try_read(&self) -> Option<StripedReadGuard<'_, T>> {
            Some(self.read_guard(self.stripe().try_read()?))
        }
        fn try_write(&self) -> Option<StripedWriteGuard<'_, T>> {
            let stripes: Option<SmallVec<_>> = self.stripes.iter().map(|s| s.try_write()).collect();
            Some(self.write_guard(stripes?))
        }
        fn into_inner(self) -> T {
            self.value.into_inner()
        }
        fn get_mut(&mut self) -> &mut T {
            self.value.get_mut()
        }
    }

    /// Stripes per lock: the CPUs this process may use, read once (a mount makes hundreds of
    /// these locks, and `available_parallelism` reads the cgroup's limits: 9 us a call).
    fn stripes() -> usize {
        static STRIPES: OnceLock<usize> = OnceLock::new();
        *STRIPES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()).min(MAX_STRIPES))
    }

    impl<T> fmt::Debug for StripedRwLock<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "StripedRwLock {{ stripes: {}, .. }}", self.stripes.len())
        }
    }

    impl<T> Deref for StripedReadGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.value
        }
    }

    impl<T> Deref for StripedWriteGuard<'_, T> {
        type Target = T;
        fn deref(&self) -> &T {
            self.value
        }
    }

    impl<T> DerefMut for StripedWriteGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            self.value
        }
    }
}

/// The CPU the calling thread runs on (a hint: it may move at once). Under the model
/// checker, whose threads all run on one OS thread, a number per checker thread instead, so
/// that its threads take different stripes.
#[cfg(not(feature = "shuttle"))]
#[inline]
fn cpu() -> usize {
    // SAFETY: no arguments; glibc reads the CPU from the thread's rseq area.
    unsafe { libc::sched_getcpu() }.max(0) as usize
}

#[cfg(feature = "shuttle")]
fn cpu() -> usize {
    // `std`'s counter: numbering the threads is not part of what is checked.
    use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    thread_local!(static CPU: usize = NEXT.fetch_add(1, Relaxed));
    CPU.with(|c| *c)
}

/// `std::sync`'s (or shuttle's, which copy their API) locks behind the small API that
/// `lockstat` uses: no poisoning, `try_*` returning `Option`, a condition variable that waits
/// on `&mut` guards.
mod unpoisoned {
    #[cfg(feature = "shuttle")]
    use shuttle::sync as s;
    use std::fmt;
    use std::ops::{Deref, DerefMut};
    #[cfg(not(feature = "shuttle"))]
    use std::sync as s;
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

    /// A mutual-exclusion lock whose poisoning is ignored.
    #[derive(Default)]
    pub struct Mutex<T>(s::Mutex<T>);

    /// The guard in an `Option` so that [`Condvar::wait`] can hand it to the condition
    /// variable (which takes guards by value) and put the returned one back.
    pub struct MutexGuard<'a, T>(Option<s::MutexGuard<'a, T>>);

    impl<T> Mutex<T> {
        /// An unlocked mutex over `value`; const so it can be a static.
        pub const fn new(value: T) -> Self {
            Mutex(s::Mutex::new(value))
        }
        /// Blocks until the lock is held.
        pub fn lock(&self) -> MutexGuard<'_, T> {
            MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
        }
        /// The lock if it is free.
        pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
            untried(self.0.try_lock()).map(|g| MutexGuard(Some(g)))
        }
        /// Consumes the mutex, returning the value.
        pub fn into_inner(self) -> T {
            self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
        }
        /// The value through `&mut self`, which proves exclusivity: no locking.
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

    /// A reader-writer lock whose poisoning is ignored; its API is [`super::RawRwLock`].
    #[derive(Default)]
    pub struct RwLock<T>(s::RwLock<T>);

    impl<T> super::RawRwLock for RwLock<T> {
        type Target = T;
        type ReadGuard<'a>
            = RwLockReadGuard<'a, T>
        where
            T: 'a;
        type WriteGuard<'a>
            = RwLockWriteGuard<'a, T>
        where
            T: 'a;

        fn new(value: T) -> Self {
            RwLock(s::RwLock::new(value))
        }
        fn read(&self) -> RwLockReadGuard<'_, T> {
            self.0.read().unwrap_or_else(PoisonError::into_inner)
        }
        fn write(&self) -> RwLockWriteGuard<'_, T> {
            self.0.write().unwrap_or_else(PoisonError::into_inner)
        }
        fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
            untried(self.0.try_read())
        }
        fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
            untried(self.0.try_write())
        }
        fn into_inner(self) -> T {
            self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
        }
        fn get_mut(&mut self) -> &mut T {
            self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
        }
    }

    impl<T: fmt::Debug> fmt::Debug for RwLock<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("RwLock { .. }")
        }
    }

    /// A condition variable that waits on a [`MutexGuard`] it borrows.
    #[derive(Debug, Default)]
    pub struct Condvar(s::Condvar);

    /// How a [`Condvar::wait_for`] ended.
    #[derive(Debug)]
    pub struct WaitTimeoutResult(bool);

    impl WaitTimeoutResult {
        /// Whether the wait ended because its time ran out (rather than by a notification).
        #[inline]
        pub fn timed_out(&self) -> bool {
            self.0
        }
    }

    impl Condvar {
        /// A condition variable with no waiters; const so it can be a static.
        pub const fn new() -> Self {
            Condvar(s::Condvar::new())
        }
        /// Releases the guard's lock, sleeps until notified (or woken spuriously), re-locks.
        pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
            let g = guard.0.take().expect("guard held");
            guard.0 = Some(self.0.wait(g).unwrap_or_else(PoisonError::into_inner));
        }
        /// Like [`Condvar::wait`], but gives up after `timeout`.
        pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) -> WaitTimeoutResult {
            let g = guard.0.take().expect("guard held");
            let (g, r) = self.0.wait_timeout(g, timeout).unwrap_or_else(PoisonError::into_inner);
            guard.0 = Some(g);
            WaitTimeoutResult(r.timed_out())
        }
        /// Wakes one waiter.
        #[inline]
        pub fn notify_one(&self) {
            self.0.notify_one();
        }
        /// Wakes every waiter.
        #[inline]
        pub fn notify_all(&self) {
            self.0.notify_all();
        }
    }
}

#[cfg(all(test, not(feature = "shuttle")))]
mod tests {
    use super::{RawRwLock, StripedRwLock};
    use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

    /// Writers change a pair that readers must only ever see equal, while all of them move
    /// between CPUs: a reader on one stripe must still exclude a writer.
    #[test]
    fn striped_readers_exclude_writers() {
        let lock = StripedRwLock::new((0u64, 0u64));
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    while !stop.load(Relaxed) {
                        let g = lock.try_read().unwrap_or_else(|| lock.read());
                        assert_eq!(g.0, g.1, "a reader saw a write half done");
                    }
                });
            }
            let writers: Vec<_> = (0..3)
                .map(|_| {
                    s.spawn(|| {
                        for i in 0..20_000u64 {
                            // Half blocking, half trying (and yielding until it succeeds).
                            let mut g = match i % 2 {
                                0 => lock.write(),
                                _ => loop {
                                    match lock.try_write() {
                                        Some(g) => break g,
                                        None => std::thread::yield_now(),
                                    }
                                },
                            };
                            g.0 += 1;
                            std::hint::black_box(&mut *g);
                            g.1 += 1;
                        }
                    })
                })
                .collect();
            writers.into_iter().for_each(|w| w.join().unwrap());
            stop.store(true, Relaxed);
        });
        assert_eq!(lock.into_inner(), (60_000, 60_000));
    }
}
