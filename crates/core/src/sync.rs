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

/// Which of `shards` (at most 64) holds `key`: the top six bits of a Fibonacci hash, so that
/// consecutive numbers (inodes, blocks, directories) land on different shards.
pub fn shard_of(key: u64, shards: usize) -> usize {
    debug_assert!((1..=64).contains(&shards), "{shards} shards: six bits of hash address 64");
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % shards
}

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
        pub fn write(&self) -> RwLockWriteGuard<'_, T> {
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
