//! Named, instrumented locks: "every shared lock is named and measured".
//!
//! In the spirit of Linux lockstat, every lock belongs to a static
//! [`LockClass`] and counts its acquisitions, contentions (the fast
//! `try_lock` failed, so we had to block), wait time and hold time. The
//! counters live in each lock instance, so the lock path never touches a
//! global cache line; [`snapshot`] aggregates them per class on demand.
//!
//! Debug builds also check lock ordering: classes made with
//! [`LockClass::ranked`] must be acquired in ascending rank, and instances of
//! one class in ascending index (e.g. AGs in AG-number order).

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use serde::Serialize;

/// Whether wait and hold times are measured (two clock reads per lock).
static TIMING: AtomicBool = AtomicBool::new(true);

/// Every class that ever had an instance, so [`snapshot`] can find it.
static CLASSES: parking_lot::Mutex<Vec<&'static LockClass>> = parking_lot::const_mutex(Vec::new());

/// Registry length below which dead entries are never pruned.
const MIN_PRUNE: usize = 64;

/// Class of the locks built by `Default`: they still get measured, and the
/// name shows up in reports as a prompt to give them a real class.
pub static UNNAMED: LockClass = LockClass::new("unnamed");

/// Turns wait/hold timing on or off at run time (default on), so production
/// can keep the cheap counts and only pay for the clock when investigating.
pub fn set_timing(on: bool) {
    TIMING.store(on, Relaxed);
}

/// Whether timing is on; lets callers save and restore the setting.
#[inline]
pub fn timing() -> bool {
    TIMING.load(Relaxed)
}

/// A named class of locks, declared as a static, e.g.
/// `pub static AG_LOCK: LockClass = LockClass::new("ag");`.
///
/// The class is the unit of reporting: it aggregates all its instances
/// (including ones already dropped) and keeps a per-index breakdown.
pub struct LockClass {
    name: &'static str,
    rank: Option<u32>,
    registry: parking_lot::Mutex<Registry>,
    retired: Sides,
}

/// Weak references to a class's live instances (construction path only).
struct Registry {
    live: Vec<Weak<Counters>>,
    prune_at: usize,
    listed: bool,
}

impl LockClass {
    /// An unranked class: measured, but exempt from lock-order checking.
    pub const fn new(name: &'static str) -> Self {
        Self::build(name, None)
    }

    /// A ranked class: in debug builds it may only be acquired while every
    /// ranked lock held by the thread has a lower rank (or is an instance
    /// of the same class with a lower index), catching ABBA deadlocks early.
    pub const fn ranked(name: &'static str, rank: u32) -> Self {
        Self::build(name, Some(rank))
    }

    const fn build(name: &'static str, rank: Option<u32>) -> Self {
        let registry = Registry {
            live: Vec::new(),
            prune_at: MIN_PRUNE,
            listed: false,
        };
        Self {
            name,
            rank,
            registry: parking_lot::const_mutex(registry),
            retired: Sides::new(),
        }
    }

    /// The class name used in reports and lock-order panics.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The lock-order rank, if the class is ranked.
    pub fn rank(&self) -> Option<u32> {
        self.rank
    }

    /// Creates the counters of a new instance and registers them.
    fn register(&'static self, idx: Option<u64>) -> Arc<Counters> {
        let counters = Arc::new(Counters {
            class: self,
            idx,
            sides: Sides::new(),
        });
        let mut registry = self.registry.lock();
        if !registry.listed {
            CLASSES.lock().push(self);
            registry.listed = true;
        }
        registry.push(Arc::downgrade(&counters));
        counters
    }

    /// Aggregates retired and live instances. Not atomic: an instance
    /// dropped during the scan may be missed.
    fn stats(&self) -> ClassStats {
        let mut total = self.retired.load();
        let mut per_index = BTreeMap::<u64, Stats>::new();
        let mut live_instances = 0;
        for counters in self.registry.lock().live.iter().filter_map(Weak::upgrade) {
            let stats = counters.sides.load();
            total.merge(&stats);
            live_instances += 1;
            if let Some(idx) = counters.idx {
                per_index.entry(idx).or_default().merge(&stats);
            }
        }
        let per_instance = per_index.into_iter().collect();
        ClassStats {
            name: self.name,
            rank: self.rank,
            live_instances,
            total,
            per_instance,
        }
    }

    fn reset(&self) {
        self.retired.reset();
        for counters in self.registry.lock().live.iter().filter_map(Weak::upgrade) {
            counters.sides.reset();
        }
    }
}

impl Registry {
    /// Appends, pruning dead entries whenever the list has doubled since the
    /// last prune: amortised O(1), so building many locks stays linear.
    fn push(&mut self, counters: Weak<Counters>) {
        if self.live.len() >= self.prune_at {
            self.live.retain(|w| w.strong_count() > 0);
            self.prune_at = (2 * self.live.len()).max(MIN_PRUNE);
        }
        self.live.push(counters);
    }
}

/// Which side of a lock an acquisition took.
#[derive(Clone, Copy)]
enum Access {
    Exclusive,
    Shared,
}

/// Counters for one side (exclusive or shared) of one lock.
struct Side {
    acquisitions: AtomicU64,
    contentions: AtomicU64,
    wait_total: AtomicU64,
    wait_max: AtomicU64,
    hold_total: AtomicU64,
    hold_max: AtomicU64,
}

impl Side {
    const fn new() -> Self {
        Self {
            acquisitions: AtomicU64::new(0),
            contentions: AtomicU64::new(0),
            wait_total: AtomicU64::new(0),
            wait_max: AtomicU64::new(0),
            hold_total: AtomicU64::new(0),
            hold_max: AtomicU64::new(0),
        }
    }

    #[inline]
    fn record_contention(&self, wait_ns: Option<u64>) {
        self.contentions.fetch_add(1, Relaxed);
        if let Some(ns) = wait_ns {
            self.wait_total.fetch_add(ns, Relaxed);
            raise(&self.wait_max, ns);
        }
    }

    #[inline]
    fn record_hold(&self, ns: u64) {
        self.hold_total.fetch_add(ns, Relaxed);
        raise(&self.hold_max, ns);
    }

    fn load(&self) -> SideStats {
        SideStats {
            acquisitions: self.acquisitions.load(Relaxed),
            contentions: self.contentions.load(Relaxed),
            wait_total_ns: self.wait_total.load(Relaxed),
            wait_max_ns: self.wait_max.load(Relaxed),
            hold_total_ns: self.hold_total.load(Relaxed),
            hold_max_ns: self.hold_max.load(Relaxed),
            ..SideStats::default()
        }
        .derive()
    }

    fn absorb(&self, s: &SideStats) {
        self.acquisitions.fetch_add(s.acquisitions, Relaxed);
        self.contentions.fetch_add(s.contentions, Relaxed);
        self.wait_total.fetch_add(s.wait_total_ns, Relaxed);
        self.hold_total.fetch_add(s.hold_total_ns, Relaxed);
        self.wait_max.fetch_max(s.wait_max_ns, Relaxed);
        self.hold_max.fetch_max(s.hold_max_ns, Relaxed);
    }

    fn reset(&self) {
        for counter in [
            &self.acquisitions,
            &self.contentions,
            &self.wait_total,
            &self.wait_max,
            &self.hold_total,
            &self.hold_max,
        ] {
            counter.store(0, Relaxed);
        }
    }
}

/// Raises a maximum, skipping the read-modify-write in the common case.
#[inline]
fn raise(max: &AtomicU64, value: u64) {
    if value > max.load(Relaxed) {
        max.fetch_max(value, Relaxed);
    }
}

#[inline]
fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Both sides of a lock (a `Mutex` only uses the exclusive one).
struct Sides {
    exclusive: Side,
    shared: Side,
}

impl Sides {
    const fn new() -> Self {
        Self {
            exclusive: Side::new(),
            shared: Side::new(),
        }
    }

    #[inline]
    fn get(&self, access: Access) -> &Side {
        match access {
            Access::Exclusive => &self.exclusive,
            Access::Shared => &self.shared,
        }
    }

    fn load(&self) -> Stats {
        Stats {
            exclusive: self.exclusive.load(),
            shared: self.shared.load(),
        }
    }

    fn absorb(&self, s: &Stats) {
        self.exclusive.absorb(&s.exclusive);
        self.shared.absorb(&s.shared);
    }

    fn reset(&self) {
        self.exclusive.reset();
        self.shared.reset();
    }
}

/// The statistics of one lock instance, shared with its class registry.
struct Counters {
    class: &'static LockClass,
    idx: Option<u64>,
    sides: Sides,
}

impl Drop for Counters {
    /// Folds a dying instance into its class so short-lived locks (e.g.
    /// per-inode) still count in the class totals.
    fn drop(&mut self) {
        self.class.retired.absorb(&self.sides.load());
    }
}

impl Counters {
    /// Blocking acquisition: fast `try` first; only on failure read the
    /// clock, block, and read it again.
    fn acquire<G>(
        &self,
        access: Access,
        fast: impl FnOnce() -> Option<G>,
        slow: impl FnOnce() -> G,
    ) -> (G, Hold<'_>) {
        order::check(self);
        let timing = timing();
        if let Some(guard) = fast() {
            return (guard, self.hold(access, timing.then(Instant::now)));
        }
        let (guard, start) = self.contend(access, timing, slow);
        (guard, self.hold(access, start))
    }

    /// Non-blocking acquisition; exempt from the order check since a
    /// failed `try` cannot deadlock.
    fn try_acquire<G>(
        &self,
        access: Access,
        fast: impl FnOnce() -> Option<G>,
    ) -> Option<(G, Hold<'_>)> {
        let guard = fast()?;
        Some((guard, self.hold(access, timing().then(Instant::now))))
    }

    fn contend<G>(
        &self,
        access: Access,
        timing: bool,
        slow: impl FnOnce() -> G,
    ) -> (G, Option<Instant>) {
        let side = self.sides.get(access);
        if !timing {
            let guard = slow();
            side.record_contention(None);
            return (guard, None);
        }
        let before = Instant::now();
        let guard = slow();
        let after = Instant::now();
        side.record_contention(Some(nanos(after - before)));
        (guard, Some(after))
    }

    #[inline]
    fn hold(&self, access: Access, start: Option<Instant>) -> Hold<'_> {
        self.sides.get(access).acquisitions.fetch_add(1, Relaxed);
        order::push(self);
        Hold {
            counters: self,
            access,
            start,
        }
    }
}

/// Accounting half of a guard: records the hold time when dropped.
struct Hold<'a> {
    counters: &'a Counters,
    access: Access,
    start: Option<Instant>,
}

impl Hold<'_> {
    /// Ends the current hold period (the lock is about to be released).
    #[inline]
    fn pause(&mut self) {
        if let Some(start) = self.start.take() {
            self.counters
                .sides
                .get(self.access)
                .record_hold(nanos(start.elapsed()));
        }
    }

    /// Starts a new hold period after the lock was re-acquired.
    fn resume(&mut self) {
        self.counters
            .sides
            .get(self.access)
            .acquisitions
            .fetch_add(1, Relaxed);
        self.start = timing().then(Instant::now);
    }
}

impl Drop for Hold<'_> {
    #[inline]
    fn drop(&mut self) {
        self.pause();
        order::pop(self.counters);
    }
}

/// Debug-build lock-order checking over a thread-local stack of held
/// ranked locks. Every entry point is a no-op when `debug_assertions` is off.
mod order {
    use super::{Counters, LockClass, RefCell};

    struct Held {
        key: usize,
        rank: u32,
        class: &'static LockClass,
        idx: Option<u64>,
    }

    thread_local! {
        static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
    }

    fn key(c: &Counters) -> usize {
        std::ptr::from_ref(c) as usize
    }

    fn label(class: &LockClass, idx: Option<u64>) -> String {
        match idx {
            Some(idx) => format!("{}[{idx}]", class.name),
            None => class.name.to_string(),
        }
    }

    /// Whether `c` (of rank `rank`) may be acquired while `held` is held.
    fn may_follow(held: &Held, rank: u32, c: &Counters) -> bool {
        held.rank < rank
            || (held.rank == rank
                && std::ptr::eq(held.class, c.class)
                && matches!((held.idx, c.idx), (Some(h), Some(n)) if h < n))
    }

    /// Panics if acquiring `c` now would break the declared order.
    #[inline]
    pub(super) fn check(c: &Counters) {
        let Some(rank) = c.class.rank.filter(|_| cfg!(debug_assertions)) else {
            return;
        };
        let clash = HELD
            .try_with(|held| {
                let held = held.borrow();
                let bad = held.iter().find(|h| !may_follow(h, rank, c))?;
                Some(format!("{} (rank {})", label(bad.class, bad.idx), bad.rank))
            })
            .ok()
            .flatten();
        if let Some(held) = clash {
            panic!(
                "lock order violation: acquiring {} (rank {rank}) while holding {held}",
                label(c.class, c.idx)
            );
        }
    }

    #[inline]
    pub(super) fn push(c: &Counters) {
        let Some(rank) = c.class.rank.filter(|_| cfg!(debug_assertions)) else {
            return;
        };
        let entry = Held {
            key: key(c),
            rank,
            class: c.class,
            idx: c.idx,
        };
        // Fails only during thread teardown, when there is nothing to check.
        let _ = HELD.try_with(|held| held.borrow_mut().push(entry));
    }

    /// Removes the newest entry for `c`; guards may be dropped out of order.
    #[inline]
    pub(super) fn pop(c: &Counters) {
        if !cfg!(debug_assertions) || c.class.rank.is_none() {
            return;
        }
        let _ = HELD.try_with(|held| {
            let mut held = held.borrow_mut();
            if let Some(pos) = held.iter().rposition(|h| h.key == key(c)) {
                held.remove(pos);
            }
        });
    }
}

/// A named, measured mutual-exclusion lock over `parking_lot::Mutex`.
pub struct Mutex<T> {
    counters: Arc<Counters>,
    raw: parking_lot::Mutex<T>,
}

impl<T> Mutex<T> {
    /// A lock of `class`, counted in the class totals only.
    pub fn new(class: &'static LockClass, value: T) -> Self {
        Self {
            counters: class.register(None),
            raw: parking_lot::Mutex::new(value),
        }
    }

    /// A lock of `class` that is also reported under index `idx` (e.g. the
    /// AG number) and ordered by it against its siblings.
    pub fn new_indexed(class: &'static LockClass, idx: u64, value: T) -> Self {
        Self {
            counters: class.register(Some(idx)),
            raw: parking_lot::Mutex::new(value),
        }
    }

    /// Blocks until the lock is held, counting contention and wait time.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let (raw, hold) = self.counters.acquire(
            Access::Exclusive,
            || self.raw.try_lock(),
            || self.raw.lock(),
        );
        MutexGuard { hold, raw }
    }

    /// Takes the lock if it is free; a failure is not a contention since
    /// nobody waited.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let (raw, hold) = self
            .counters
            .try_acquire(Access::Exclusive, || self.raw.try_lock())?;
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
    pub fn stats(&self) -> Stats {
        self.counters.sides.load()
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
            .field("class", &self.counters.class.name)
            .field("idx", &self.counters.idx)
            .field("raw", &self.raw)
            .finish()
    }
}

/// Guard of a [`Mutex`]; records the hold time when dropped.
pub struct MutexGuard<'a, T> {
    // Declared before `raw` so the hold is recorded before the unlock.
    hold: Hold<'a>,
    raw: parking_lot::MutexGuard<'a, T>,
}

impl<'a, T> MutexGuard<'a, T> {
    /// The underlying `parking_lot` guard, for APIs that need it. Time spent
    /// unlocked through it (e.g. `parking_lot::Condvar::wait`) counts as
    /// hold time; [`Condvar`] avoids that.
    pub fn inner_mut(&mut self) -> &mut parking_lot::MutexGuard<'a, T> {
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

/// A named, measured reader-writer lock over `parking_lot::RwLock`; reads
/// and writes are counted separately.
pub struct RwLock<T> {
    counters: Arc<Counters>,
    raw: parking_lot::RwLock<T>,
}

impl<T> RwLock<T> {
    /// A lock of `class`, counted in the class totals only.
    pub fn new(class: &'static LockClass, value: T) -> Self {
        Self {
            counters: class.register(None),
            raw: parking_lot::RwLock::new(value),
        }
    }

    /// A lock of `class` that is also reported and ordered by `idx`.
    pub fn new_indexed(class: &'static LockClass, idx: u64, value: T) -> Self {
        Self {
            counters: class.register(Some(idx)),
            raw: parking_lot::RwLock::new(value),
        }
    }

    /// Blocks for shared access, counted on the shared side.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        let (raw, hold) =
            self.counters
                .acquire(Access::Shared, || self.raw.try_read(), || self.raw.read());
        RwLockReadGuard { _hold: hold, raw }
    }

    /// Blocks for exclusive access, counted on the exclusive side.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        let (raw, hold) = self.counters.acquire(
            Access::Exclusive,
            || self.raw.try_write(),
            || self.raw.write(),
        );
        RwLockWriteGuard { _hold: hold, raw }
    }

    /// Shared access if immediately available.
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        let (raw, hold) = self
            .counters
            .try_acquire(Access::Shared, || self.raw.try_read())?;
        Some(RwLockReadGuard { _hold: hold, raw })
    }

    /// Exclusive access if immediately available.
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        let (raw, hold) = self
            .counters
            .try_acquire(Access::Exclusive, || self.raw.try_write())?;
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
    pub fn stats(&self) -> Stats {
        self.counters.sides.load()
    }
}

impl<T: Default> Default for RwLock<T> {
    /// Measured under [`UNNAMED`]; prefer [`RwLock::new`] with a real class.
    fn default() -> Self {
        Self::new(&UNNAMED, T::default())
    }
}

impl<T: fmt::Debug> fmt::Debug for RwLock<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("class", &self.counters.class.name)
            .field("idx", &self.counters.idx)
            .field("raw", &self.raw)
            .finish()
    }
}

/// Shared guard of an [`RwLock`]; records the hold time when dropped.
pub struct RwLockReadGuard<'a, T> {
    // Only its drop matters; declared before `raw` so the hold is
    // recorded before the unlock.
    _hold: Hold<'a>,
    raw: parking_lot::RwLockReadGuard<'a, T>,
}

impl<T> Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.raw
    }
}

impl<T: fmt::Debug> fmt::Debug for RwLockReadGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// Exclusive guard of an [`RwLock`]; records the hold time when dropped.
pub struct RwLockWriteGuard<'a, T> {
    // Only its drop matters; declared before `raw` so the hold is
    // recorded before the unlock.
    _hold: Hold<'a>,
    raw: parking_lot::RwLockWriteGuard<'a, T>,
}

impl<T> Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.raw
    }
}

impl<T> DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.raw
    }
}

impl<T: fmt::Debug> fmt::Debug for RwLockWriteGuard<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

/// A condition variable for [`MutexGuard`]. Waiting ends the current hold
/// period and re-acquiring starts a new one (counted as an acquisition), so
/// sleeping on the condition is not reported as hold time.
#[derive(Debug, Default)]
pub struct Condvar {
    raw: parking_lot::Condvar,
}

impl Condvar {
    /// A condition variable with no waiters; const so it can be a static.
    pub const fn new() -> Self {
        Self {
            raw: parking_lot::Condvar::new(),
        }
    }

    /// Releases the guard's lock, sleeps until notified, and re-locks.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        guard.hold.pause();
        self.raw.wait(&mut guard.raw);
        guard.hold.resume();
    }

    /// Like [`Condvar::wait`], but gives up after `timeout`.
    pub fn wait_for<T>(
        &self,
        guard: &mut MutexGuard<'_, T>,
        timeout: Duration,
    ) -> parking_lot::WaitTimeoutResult {
        guard.hold.pause();
        let result = self.raw.wait_for(&mut guard.raw, timeout);
        guard.hold.resume();
        result
    }

    /// Wakes one waiter; returns whether one was woken.
    pub fn notify_one(&self) -> bool {
        self.raw.notify_one()
    }

    /// Wakes all waiters; returns how many were woken.
    pub fn notify_all(&self) -> usize {
        self.raw.notify_all()
    }
}

/// Counts and times for one side (exclusive or shared) of a lock or class.
/// Averages are derived: wait per contention (as in Linux lockstat), hold
/// per acquisition. Times are 0 while timing is off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct SideStats {
    /// Successful acquisitions (blocking or `try`).
    pub acquisitions: u64,
    /// Acquisitions whose fast `try` failed, so the caller had to block.
    pub contentions: u64,
    /// Total time spent blocked.
    pub wait_total_ns: u64,
    /// Longest single block.
    pub wait_max_ns: u64,
    /// `wait_total_ns / contentions`.
    pub wait_avg_ns: u64,
    /// Total time the lock was held.
    pub hold_total_ns: u64,
    /// Longest single hold.
    pub hold_max_ns: u64,
    /// `hold_total_ns / acquisitions`.
    pub hold_avg_ns: u64,
}

impl SideStats {
    fn merge(&mut self, o: &SideStats) {
        self.acquisitions += o.acquisitions;
        self.contentions += o.contentions;
        self.wait_total_ns += o.wait_total_ns;
        self.hold_total_ns += o.hold_total_ns;
        self.wait_max_ns = self.wait_max_ns.max(o.wait_max_ns);
        self.hold_max_ns = self.hold_max_ns.max(o.hold_max_ns);
        *self = self.derive();
    }

    fn derive(self) -> Self {
        let avg = |total: u64, n: u64| total.checked_div(n).unwrap_or(0);
        Self {
            wait_avg_ns: avg(self.wait_total_ns, self.contentions),
            hold_avg_ns: avg(self.hold_total_ns, self.acquisitions),
            ..self
        }
    }
}

/// Statistics of one lock, index or class, split by access side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// `Mutex` locks and `RwLock` writes.
    pub exclusive: SideStats,
    /// `RwLock` reads.
    pub shared: SideStats,
}

impl Stats {
    /// Both sides summed, for one-line reports.
    pub fn combined(&self) -> SideStats {
        let mut sum = self.exclusive;
        sum.merge(&self.shared);
        sum
    }

    fn merge(&mut self, o: &Stats) {
        self.exclusive.merge(&o.exclusive);
        self.shared.merge(&o.shared);
    }
}

/// One class in a [`snapshot`]: totals over all its instances, live or
/// dropped, plus a breakdown by instance index.
#[derive(Clone, Debug, Serialize)]
pub struct ClassStats {
    /// The class name.
    pub name: &'static str,
    /// The lock-order rank, if any.
    pub rank: Option<u32>,
    /// Instances alive at snapshot time.
    pub live_instances: usize,
    /// Totals over every instance ever created (since the last [`reset`]).
    pub total: Stats,
    /// Live indexed instances by index, ascending; instances sharing an
    /// index (e.g. AG 0 of two mounts) are merged.
    pub per_instance: Vec<(u64, Stats)>,
}

/// Statistics of every class that ever had an instance, in first-use order.
pub fn snapshot() -> Vec<ClassStats> {
    classes().into_iter().map(LockClass::stats).collect()
}

/// Zeroes all counters, to measure one workload in isolation.
pub fn reset() {
    classes().into_iter().for_each(LockClass::reset);
}

/// Copies the class list so no class registry is locked under `CLASSES`.
fn classes() -> Vec<&'static LockClass> {
    CLASSES.lock().clone()
}

/// The `n` classes with the most total wait time (then contentions), i.e.
/// the locks worth looking at first.
pub fn top_by_wait(stats: &[ClassStats], n: usize) -> Vec<&ClassStats> {
    let mut sorted: Vec<&ClassStats> = stats.iter().collect();
    sorted.sort_by_key(|c| {
        let s = c.total.combined();
        std::cmp::Reverse((s.wait_total_ns, s.contentions))
    });
    sorted.truncate(n);
    sorted
}

/// A fixed-width, lockstat-like table of the `top` classes by wait time.
pub fn report_table(stats: &[ClassStats], top: usize) -> String {
    let header = table_row([
        "class",
        "acq",
        "contended",
        "wait-tot",
        "wait-max",
        "wait-avg",
        "hold-tot",
        "hold-max",
        "hold-avg",
    ]);
    let rows = top_by_wait(stats, top).into_iter().map(class_row);
    std::iter::once(header)
        .chain(rows)
        .map(|row| row + "\n")
        .collect()
}

fn class_row(c: &ClassStats) -> String {
    let s = c.total.combined();
    let times = [
        s.wait_total_ns,
        s.wait_max_ns,
        s.wait_avg_ns,
        s.hold_total_ns,
        s.hold_max_ns,
        s.hold_avg_ns,
    ]
    .map(fmt_ns);
    let [wt, wm, wa, ht, hm, ha] = times;
    table_row([
        c.name.to_string(),
        s.acquisitions.to_string(),
        s.contentions.to_string(),
        wt,
        wm,
        wa,
        ht,
        hm,
        ha,
    ])
}

fn table_row<S: fmt::Display>(cols: [S; 9]) -> String {
    let [name, acq, cont, wt, wm, wa, ht, hm, ha] = cols;
    format!("{name:<24} {acq:>12} {cont:>10} {wt:>9} {wm:>9} {wa:>9} {ht:>9} {hm:>9} {ha:>9}")
}

/// Human-readable duration with one decimal: `950ns`, `1.2us`, `3.4ms`, `5.6s`.
fn fmt_ns(ns: u64) -> String {
    let units = [(1_000_000_000, "s"), (1_000_000, "ms"), (1_000, "us")];
    match units.into_iter().find(|&(scale, _)| ns >= scale) {
        Some((scale, unit)) => format!("{}.{}{unit}", ns / scale, ns % scale * 10 / scale),
        None => format!("{ns}ns"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::thread;

    /// Tests that read counters, or flip `reset`/`set_timing`, run one at a
    /// time: those are process-wide.
    static SERIAL: parking_lot::Mutex<()> = parking_lot::const_mutex(());

    fn class_stats(name: &str) -> ClassStats {
        snapshot()
            .into_iter()
            .find(|c| c.name == name)
            .expect("class listed")
    }

    #[test]
    fn acquisitions_are_exact_across_threads() {
        static CLASS: LockClass = LockClass::new("test-exact");
        let _serial = SERIAL.lock();
        let lock = Mutex::new(&CLASS, 0u64);
        thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| (0..10_000).for_each(|_| *lock.lock() += 1));
            }
        });
        assert_eq!(*lock.lock(), 40_000);
        assert_eq!(lock.stats().exclusive.acquisitions, 40_001);
        assert_eq!(lock.stats().shared, SideStats::default());
    }

    #[test]
    fn rwlock_splits_reads_and_writes() {
        static CLASS: LockClass = LockClass::new("test-rw");
        let _serial = SERIAL.lock();
        let lock = RwLock::new(&CLASS, 0u64);
        thread::scope(|s| {
            for t in 0..4 {
                let lock = &lock;
                s.spawn(move || {
                    for _ in 0..10_000 {
                        if t % 2 == 0 {
                            *lock.write() += 1;
                        } else {
                            assert!(*lock.read() <= 20_000);
                        }
                    }
                });
            }
        });
        assert_eq!(*lock.try_read().expect("free"), 20_000);
        *lock.try_write().expect("free") += 1;
        let stats = lock.stats();
        assert_eq!(stats.exclusive.acquisitions, 20_001);
        assert_eq!(stats.shared.acquisitions, 20_001);
        assert_eq!(stats.combined().acquisitions, 40_002);
    }

    #[test]
    fn contention_is_counted_and_timed() {
        static CLASS: LockClass = LockClass::new("test-contended");
        let _serial = SERIAL.lock();
        let lock = Mutex::new(&CLASS, 0u64);
        let (started, ready) = mpsc::channel();
        thread::scope(|s| {
            let guard = lock.lock();
            s.spawn(|| {
                started.send(()).expect("main waits");
                *lock.lock() += 1;
            });
            ready.recv().expect("thread started");
            thread::sleep(Duration::from_millis(50));
            drop(guard);
            s.spawn(|| (0..10_000).for_each(|_| *lock.lock() += 1));
            (0..10_000).for_each(|_| *lock.lock() += 1);
        });
        let stats = class_stats("test-contended").total.exclusive;
        assert_eq!(stats.acquisitions, 20_002);
        assert!(stats.contentions > 0);
        assert!(stats.wait_total_ns > 0 && stats.wait_max_ns > 0);
        assert!(stats.wait_avg_ns > 0 && stats.hold_total_ns > 0);
    }

    #[test]
    fn reset_zeroes_live_and_retired() {
        static CLASS: LockClass = LockClass::new("test-reset");
        let _serial = SERIAL.lock();
        let live = Mutex::new(&CLASS, ());
        drop(Mutex::new(&CLASS, ()).lock());
        drop(live.lock());
        assert_eq!(class_stats("test-reset").total.exclusive.acquisitions, 2);
        reset();
        assert_eq!(class_stats("test-reset").total, Stats::default());
        assert_eq!(live.stats(), Stats::default());
    }

    #[test]
    fn timing_off_keeps_counts_but_no_times() {
        static CLASS: LockClass = LockClass::new("test-untimed");
        let _serial = SERIAL.lock();
        let lock = RwLock::new(&CLASS, ());
        set_timing(false);
        for _ in 0..100 {
            drop(lock.write());
            drop(lock.read());
        }
        set_timing(true);
        let stats = lock.stats();
        assert_eq!(stats.combined().acquisitions, 200);
        assert_eq!(
            (stats.combined().hold_total_ns, stats.combined().hold_max_ns),
            (0, 0)
        );
    }

    #[test]
    fn dropped_instances_stay_in_class_totals() {
        static CLASS: LockClass = LockClass::new("test-retired");
        let _serial = SERIAL.lock();
        let lock = Mutex::new(&CLASS, 7);
        drop(lock.lock());
        assert_eq!(lock.into_inner(), 7);
        let stats = class_stats("test-retired");
        assert_eq!(
            (stats.live_instances, stats.total.exclusive.acquisitions),
            (0, 1)
        );
    }

    #[test]
    fn indexed_instances_are_reported_per_index() {
        static CLASS: LockClass = LockClass::ranked("test-ag", 10);
        let _serial = SERIAL.lock();
        let ags: Vec<_> = (0..4)
            .map(|agno| Mutex::new_indexed(&CLASS, agno, agno))
            .collect();
        (0..3).for_each(|_| drop(ags[2].lock()));
        let stats = class_stats("test-ag");
        assert_eq!(stats.rank, Some(10));
        assert_eq!(stats.live_instances, 4);
        let indices: Vec<u64> = stats.per_instance.iter().map(|(idx, _)| *idx).collect();
        assert_eq!(indices, [0, 1, 2, 3]);
        assert_eq!(stats.per_instance[2].1.exclusive.acquisitions, 3);
        assert_eq!(stats.per_instance[1].1.exclusive.acquisitions, 0);
    }

    #[test]
    fn many_instances_register_linearly_and_prune() {
        static CLASS: LockClass = LockClass::new("test-many");
        let _serial = SERIAL.lock();
        for _ in 0..3 {
            let locks: Vec<Mutex<u8>> = (0..100_000).map(|_| Mutex::new(&CLASS, 0)).collect();
            assert_eq!(class_stats("test-many").live_instances, locks.len());
        }
        let registered = CLASS.registry.lock().live.len();
        assert!(
            registered <= 200_000,
            "dead entries not pruned: {registered}"
        );
    }

    #[test]
    fn default_locks_are_unnamed() {
        let _serial = SERIAL.lock();
        let lock: RwLock<Vec<u8>> = RwLock::default();
        lock.write().push(1);
        assert_eq!(*Mutex::<u8>::default().lock(), 0);
        assert!(class_stats("unnamed").live_instances >= 1);
        assert!(format!("{lock:?}").contains("unnamed"));
    }

    #[test]
    fn condvar_waits_on_instrumented_guard() {
        static CLASS: LockClass = LockClass::new("test-condvar");
        let _serial = SERIAL.lock();
        let pair = (Mutex::new(&CLASS, false), Condvar::new());
        thread::scope(|s| {
            s.spawn(|| {
                *pair.0.lock() = true;
                pair.1.notify_all();
            });
            let mut ready = pair.0.lock();
            while !*ready {
                pair.1.wait(&mut ready);
            }
        });
        let mut guard = pair.0.lock();
        assert!(pair
            .1
            .wait_for(&mut guard, Duration::from_millis(1))
            .timed_out());
        assert!(!pair.1.notify_one());
        drop(guard);
        assert!(pair.0.stats().exclusive.acquisitions >= 3);
    }

    #[test]
    fn report_sorts_by_wait() {
        let quiet = ClassStats {
            name: "quiet",
            rank: None,
            live_instances: 1,
            total: Stats::default(),
            per_instance: vec![],
        };
        let mut busy = quiet.clone();
        busy.name = "busy";
        busy.total.shared = SideStats {
            acquisitions: 9,
            contentions: 2,
            wait_total_ns: 3_500_000,
            ..SideStats::default()
        }
        .derive();
        let stats = [quiet, busy];
        assert_eq!(top_by_wait(&stats, 1)[0].name, "busy");
        let table = report_table(&stats, 2);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[0].starts_with("class")
                && lines[1].starts_with("busy")
                && lines[2].starts_with("quiet")
        );
        assert!(lines[1].contains("3.5ms") && lines[1].contains("1.7ms"));
        assert!(lines.iter().all(|l| l.len() == lines[0].len()));
    }

    #[test]
    fn formats_durations() {
        let shown = [999, 1_000, 1_250_000, 61_000_000_000].map(fmt_ns);
        assert_eq!(shown, ["999ns", "1.0us", "1.2ms", "61.0s"]);
    }

    #[test]
    fn stats_are_serializable() {
        fn serializable<S: Serialize>(_: &S) {}
        serializable(&snapshot());
    }

    #[test]
    fn ordered_acquisition_is_allowed() {
        static LOW: LockClass = LockClass::ranked("test-order-low", 1);
        static HIGH: LockClass = LockClass::ranked("test-order-high", 2);
        static FREE: LockClass = LockClass::new("test-order-free");
        let (low, high, free) = (
            Mutex::new(&LOW, ()),
            RwLock::new(&HIGH, ()),
            Mutex::new(&FREE, ()),
        );
        let ags: Vec<_> = (0..3)
            .map(|agno| Mutex::new_indexed(&LOW, agno, ()))
            .collect();
        let _free = free.lock();
        let l = low.lock();
        let h = high.read();
        drop(l); // out-of-order release pops the right entry
        drop(h);
        let h = high.write();
        let backwards = low.try_lock().expect("try never deadlocks");
        drop(backwards);
        drop(h);
        let _ag: Vec<_> = ags.iter().map(Mutex::lock).collect();
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(
        expected = "acquiring test-inv-low (rank 1) while holding test-inv-high (rank 2)"
    )]
    fn inverted_ranks_panic() {
        static LOW: LockClass = LockClass::ranked("test-inv-low", 1);
        static HIGH: LockClass = LockClass::ranked("test-inv-high", 2);
        let (low, high) = (Mutex::new(&LOW, ()), RwLock::new(&HIGH, ()));
        let _h = high.read();
        let _l = low.lock();
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(
        expected = "acquiring test-inv-ag[1] (rank 5) while holding test-inv-ag[2] (rank 5)"
    )]
    fn descending_indices_panic() {
        static AG: LockClass = LockClass::ranked("test-inv-ag", 5);
        let ags: Vec<_> = (0..3)
            .map(|agno| RwLock::new_indexed(&AG, agno, ()))
            .collect();
        let _two = ags[2].write();
        let _one = ags[1].write();
    }

    #[cfg(debug_assertions)]
    #[test]
    #[should_panic(expected = "lock order violation")]
    fn equal_rank_of_other_class_panics() {
        static A: LockClass = LockClass::ranked("test-eq-a", 3);
        static B: LockClass = LockClass::ranked("test-eq-b", 3);
        let (a, b) = (Mutex::new(&A, ()), Mutex::new(&B, ()));
        let _a = a.lock();
        let _b = b.lock();
    }
}
