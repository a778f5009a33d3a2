//! The measured locks: [`Mutex`], [`RwLock`] and their guards, and the [`Condvar`] that
//! waits on a [`MutexGuard`] without counting the sleep as hold time.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use crate::class::{LockClass, UNNAMED};
use crate::meter::{Access, Hold, Meter};
use crate::stats::Stats;
use crate::sync::{self as raw, RawRwLock};

/// A named, measured mutual-exclusion lock over `std::sync::Mutex` (the model checker's
/// under the `shuttle` feature: [`crate::sync`]).
pub struct Mutex<T> {
    meter: Meter,
    raw: raw::Mutex<T>,
}

impl<T> Mutex<T> {
    /// A lock of `class`, counted in the class totals only.
    pub fn new(class: &'static LockClass, value: T) -> Self {
        Self { meter: Meter::own(class.register(None)), raw: raw::Mutex::new(value) }
    }

    /// A lock of `class` that is also reported under index `idx` (e.g. the
    /// AG number) and ordered by it against its siblings.
    pub fn new_indexed(class: &'static LockClass, idx: u64, value: T) -> Self {
        Self { meter: Meter::own(class.register(Some(idx))), raw: raw::Mutex::new(value) }
    }

    /// A lock of `class` with no counters of its own: see
    /// [`RwLock::new_pooled`]. For per-object locks there are millions of.
    pub fn new_pooled(class: &'static LockClass, value: T) -> Self {
        Self { meter: Meter::pooled(class), raw: raw::Mutex::new(value) }
    }

    /// Blocks until the lock is held, counting contention and wait time.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let (raw, hold) = self.meter.acquire(Access::Exclusive, || self.raw.try_lock(), || self.raw.lock());
        MutexGuard { hold, raw }
    }

    /// Takes the lock if it is free; a failure is not a contention since
    /// nobody waited.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let (raw, hold) = self.meter.try_acquire(Access::Exclusive, || self.raw.try_lock())?;
        Some(MutexGuard { hold, raw })
    }

    /// Consumes the lock; its counts move to the class totals.
    pub fn into_inner(self) -> T {
        self.raw.into_inner()
    }

    /// Borrowing `&mut self` proves exclusivity, so nothing is counted.
    pub fn get_mut(&mut self) -> &mut T {
        self.raw.get_mut()
    }

    /// This instance's counters, for subsystems that report their own locks.
    /// Always zero for a pooled instance, which has none of its own: see
    /// its class in [`snapshot`](crate::snapshot).
    pub fn stats(&self) -> Stats {
        self.meter.stats()
    }
}

impl<T: Default> Default for Mutex<T> {
    /// Measured under [`UNNAMED`]; prefer [`Mutex::new`] with a real class.
    fn default() -> Self {
        Self::new(&UNNAMED, T::default())
    }
}

impl<T: fmt::Debug> fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mutex")
            .field("class", &self.meter.class().name)
            .field("idx", &self.meter.idx())
            .field("raw", &self.raw)
            .finish()
    }
}

/// Guard of a [`Mutex`]; records the hold time when dropped.
pub struct MutexGuard<'a, T> {
    // Declared before `raw` so the hold is recorded before the unlock.
    hold: Hold<'a>,
    raw: raw::MutexGuard<'a, T>,
}

impl<'a, T> MutexGuard<'a, T> {
    /// The underlying guard ([`crate::sync`]), for APIs that need it. Time spent
    /// unlocked through it (e.g. a raw condition variable's wait) counts as
    /// hold time; [`Condvar`] avoids that.
    pub fn inner_mut(&mut self) -> &mut raw::MutexGuard<'a, T> {
        &mut self.raw
    }
}

impl<T> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.raw
    }
}

impl<T> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.raw
    }
}

impl<T: fmt::Debug> fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// A named, measured reader-writer lock over `std::sync::RwLock` (or the model checker's,
/// [`crate::sync`]), or over another [`RawRwLock`] such as the per-CPU
/// [`raw::StripedRwLock`]; reads and writes are counted separately.
pub struct RwLock<T, R: RawRwLock<Target = T> = raw::RwLock<T>> {
    meter: Meter,
    raw: R,
}

impl<T> RwLock<T> {
    /// A lock of `class`, counted in the class totals only.
    pub fn new(class: &'static LockClass, value: T) -> Self {
        Self::with_meter(Meter::own(class.register(None)), value)
    }

    /// A lock of `class` that is also reported and ordered by `idx`.
    pub fn new_indexed(class: &'static LockClass, idx: u64, value: T) -> Self {
        Self::with_meter(Meter::own(class.register(Some(idx))), value)
    }

    /// A lock of `class` with no counters of its own, for per-object locks
    /// there are millions of (e.g. one per cached inode). It counts into
    /// per-thread counters owned by the class, so it costs no allocation
    /// and no registration, only one word next to the raw lock.
    /// It appears in the class totals and live count of [`snapshot`](crate::snapshot), but
    /// not in `per_instance`, and its [`RwLock::stats`] are zero. Lock
    /// order is checked as for an unindexed instance: two pooled locks of
    /// one ranked class cannot be nested (use an unranked class for those).
    ///
    /// Costs (x86-64): `RwLock<u64>` is 32 bytes, pooled or registered,
    /// against 24 for the bare `std::sync::RwLock<u64>`; a registered
    /// lock also has a ~140-byte heap block and a registry slot, a pooled
    /// one nothing else (the class allocates its 32 counter sets, 4 KiB,
    /// once). With hold timing off, an uncontended lock/unlock pair of
    /// either kind measured about 1.5 ns over the bare lock (~5 ns): one
    /// atomic add on a line only this thread writes.
    pub fn new_pooled(class: &'static LockClass, value: T) -> Self {
        Self::with_meter(Meter::pooled(class), value)
    }
}

impl<T> RwLock<T, raw::StripedRwLock<T>> {
    /// A lock of `class`, reported and ordered by `idx`, striped per CPU: for data that
    /// every CPU reads and few write (see [`raw::StripedRwLock`]).
    pub fn striped_indexed(class: &'static LockClass, idx: u64, value: T) -> Self {
        Self::with_meter(Meter::own(class.register(Some(idx))), value)
    }
}

impl<T, R: RawRwLock<Target = T>> RwLock<T, R> {
    fn with_meter(meter: Meter, value: T) -> Self {
        Self { meter, raw: R::new(value) }
    }

    /// Blocks for shared access, counted on the shared side.
    pub fn read(&self) -> RwLockReadGuard<'_, T, R> {
        let (raw, hold) = self.meter.acquire(Access::Shared, || self.raw.try_read(), || self.raw.read());
        RwLockReadGuard { _hold: hold, raw }
    }

    /// Blocks for exclusive access, counted on the exclusive side.
    pub fn write(&self) -> RwLockWriteGuard<'_, T, R> {
        let (raw, hold) = self.meter.acquire(Access::Exclusive, || self.raw.try_write(), || self.raw.write());
        RwLockWriteGuard { _hold: hold, raw }
    }

    /// Shared access if immediately available.
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T, R>> {
        let (raw, hold) = self.meter.try_acquire(Access::Shared, || self.raw.try_read())?;
        Some(RwLockReadGuard { _hold: hold, raw })
    }

    /// Exclusive access if immediately available.
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T, R>> {
        let (raw, hold) = self.meter.try_acquire(Access::Exclusive, || self.raw.try_write())?;
        Some(RwLockWriteGuard { _hold: hold, raw })
    }

    /// Consumes the lock; its counts move to the class totals.
    pub fn into_inner(self) -> T {
        self.raw.into_inner()
    }

    /// Borrowing `&mut self` proves exclusivity, so nothing is counted.
    pub fn get_mut(&mut self) -> &mut T {
        self.raw.get_mut()
    }

    /// This instance's counters, for subsystems that report their own locks.
    /// Always zero for a pooled instance, which has none of its own: see
    /// its class in [`snapshot`](crate::snapshot).
    pub fn stats(&self) -> Stats {
        self.meter.stats()
    }
}

impl<T: Default> Default for RwLock<T> {
    /// Measured under [`UNNAMED`]; prefer [`RwLock::new`] with a real class.
    fn default() -> Self {
        Self::new(&UNNAMED, T::default())
    }
}

impl<T, R: RawRwLock<Target = T> + fmt::Debug> fmt::Debug for RwLock<T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("class", &self.meter.class().name)
            .field("idx", &self.meter.idx())
            .field("raw", &self.raw)
            .finish()
    }
}

/// Shared guard of an [`RwLock`]; records the hold time when dropped.
pub struct RwLockReadGuard<'a, T, R: RawRwLock<Target = T> + 'a = raw::RwLock<T>> {
    // Only its drop matters; declared before `raw` so the hold is
    // recorded before the unlock.
    _hold: Hold<'a>,
    raw: R::ReadGuard<'a>,
}

impl<T, R: RawRwLock<Target = T>> Deref for RwLockReadGuard<'_, T, R> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.raw
    }
}

impl<T: fmt::Debug, R: RawRwLock<Target = T>> fmt::Debug for RwLockReadGuard<'_, T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// Exclusive guard of an [`RwLock`]; records the hold time when dropped.
pub struct RwLockWriteGuard<'a, T, R: RawRwLock<Target = T> + 'a = raw::RwLock<T>> {
    // Only its drop matters; declared before `raw` so the hold is
    // recorded before the unlock.
    _hold: Hold<'a>,
    raw: R::WriteGuard<'a>,
}

impl<T, R: RawRwLock<Target = T>> Deref for RwLockWriteGuard<'_, T, R> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.raw
    }
}

impl<T, R: RawRwLock<Target = T>> DerefMut for RwLockWriteGuard<'_, T, R> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.raw
    }
}

impl<T: fmt::Debug, R: RawRwLock<Target = T>> fmt::Debug for RwLockWriteGuard<'_, T, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// A condition variable for [`MutexGuard`]. Waiting ends the current hold
/// period and re-acquiring starts a new one (counted as an acquisition), so
/// sleeping on the condition is not reported as hold time.
#[derive(Debug, Default)]
pub struct Condvar {
    raw: raw::Condvar,
}

impl Condvar {
    /// A condition variable with no waiters; const so it can be a static.
    pub const fn new() -> Self {
        Self { raw: raw::Condvar::new() }
    }

    /// Releases the guard's lock, sleeps until notified, and re-locks.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        guard.hold.pause();
        self.raw.wait(&mut guard.raw);
        guard.hold.resume();
    }

    /// Like [`Condvar::wait`], but gives up after `timeout`.
    pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) -> raw::WaitTimeoutResult {
        guard.hold.pause();
        let result = self.raw.wait_for(&mut guard.raw, timeout);
        guard.hold.resume();
        result
    }

    /// Wakes one waiter.
    #[inline]
    pub fn notify_one(&self) {
        self.raw.notify_one()
    }

    /// Wakes all waiters.
    #[inline]
    pub fn notify_all(&self) {
        self.raw.notify_all()
    }
}
