//! The counters of one lock and the fast path that feeds them: the run-time switches, one
//! side's counts and times, and the one-word [`Meter`] a lock carries to reach them.

use std::ptr::NonNull;
use std::sync::Arc;

use crate::class::{shard_index, LockClass};
use crate::order;
use crate::stats::{SideStats, Stats};
// The raw locks, the counters and the thread-locals come from `crate::sync`, so the model
// checker can run these locks (and count through them); the global switches and the shard
// rotor below stay `std`: they are settings, not state a schedule can break.
use crate::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::atomic::AtomicU8;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

/// The run-time switches, in one word so an acquisition reads both with one
/// relaxed load: [`COUNTING`] (acquisitions, contentions and wait times; on
/// by default) and [`TIMING`] (hold times too: two clock reads per lock; off
/// by default, and only effective while counting is on).
static MODE: AtomicU8 = AtomicU8::new(COUNTING);
const COUNTING: u8 = 1;
const TIMING: u8 = 2;

/// Per-thread shares of a registered instance's acquisition counts (threads beyond this many
/// share them, as for the pool). Every acquisition writes its count, so a single counter made
/// the instance's counter line bounce between CPUs that take one lock for reading, as every
/// lookup does with a cache shard: with 2 threads stating names of one directory, that
/// `lock incq` was 16% of the samples.
pub(crate) const OWN_SHARDS: usize = 8;

/// Turns hold-time measurement on or off at run time (default off), so
/// production keeps the cheap counts and contended wait times and only pays
/// for the clock on every acquisition when investigating.
pub fn set_timing(on: bool) {
    set_mode_bit(TIMING, on);
}

/// Whether hold timing is on; lets callers save and restore the setting.
#[inline]
pub fn timing() -> bool {
    MODE.load(Relaxed) & TIMING != 0
}

/// Turns all counting on or off at run time (default on). Off, locks count
/// nothing (no acquisitions, contentions, wait or hold times): for measuring
/// what the statistics cost. Holds that began while counting was on are still
/// recorded when they end.
pub fn set_counting(on: bool) {
    set_mode_bit(COUNTING, on);
}

/// Whether locks are counted.
#[inline]
pub fn counting() -> bool {
    MODE.load(Relaxed) & COUNTING != 0
}

fn set_mode_bit(bit: u8, on: bool) {
    if on {
        MODE.fetch_or(bit, Relaxed);
    } else {
        MODE.fetch_and(!bit, Relaxed);
    }
}

/// Which side of a lock an acquisition took.
#[derive(Clone, Copy)]
pub(crate) enum Access {
    Exclusive = 0,
    Shared = 1,
}

/// Counters for one side (exclusive or shared) of one lock.
pub(crate) struct Side {
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
    fn record_contention(&self, wait_ns: u64) {
        self.contentions.fetch_add(1, Relaxed);
        self.wait_total.fetch_add(wait_ns, Relaxed);
        raise(&self.wait_max, wait_ns);
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
        for counter in
            [&self.acquisitions, &self.contentions, &self.wait_total, &self.wait_max, &self.hold_total, &self.hold_max]
        {
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
pub(crate) struct Sides {
    exclusive: Side,
    shared: Side,
}

impl Sides {
    pub(crate) const fn new() -> Self {
        Self { exclusive: Side::new(), shared: Side::new() }
    }

    #[inline]
    fn get(&self, access: Access) -> &Side {
        match access {
            Access::Exclusive => &self.exclusive,
            Access::Shared => &self.shared,
        }
    }

    pub(crate) fn load(&self) -> Stats {
        Stats { exclusive: self.exclusive.load(), shared: self.shared.load() }
    }

    pub(crate) fn absorb(&self, s: &Stats) {
        self.exclusive.absorb(&s.exclusive);
        self.shared.absorb(&s.shared);
    }

    pub(crate) fn reset(&self) {
        self.exclusive.reset();
        self.shared.reset();
    }
}

/// The statistics of one registered lock instance, shared with its class
/// registry.
pub(crate) struct Counters {
    pub(crate) class: &'static LockClass,
    pub(crate) idx: Option<u64>,
    /// Everything but the acquisitions, which are in `acquired`.
    pub(crate) sides: Sides,
    /// Acquisitions by thread share, each `[exclusive, shared]`.
    pub(crate) acquired: [CachePadded<[AtomicU64; 2]>; OWN_SHARDS],
}

impl Counters {
    #[inline]
    fn count_acquisition(&self, access: Access) {
        self.acquired[shard_index() % OWN_SHARDS][access as usize].fetch_add(1, Relaxed);
    }

    pub(crate) fn load(&self) -> Stats {
        let mut stats = self.sides.load();
        let sum =
            |side: Access| self.acquired.iter().map(|a| a[side as usize].load(Relaxed)).fold(0u64, u64::wrapping_add);
        stats.exclusive = SideStats { acquisitions: sum(Access::Exclusive), ..stats.exclusive }.derive();
        stats.shared = SideStats { acquisitions: sum(Access::Shared), ..stats.shared }.derive();
        stats
    }

    pub(crate) fn reset(&self) {
        self.sides.reset();
        for a in &self.acquired {
            a[0].store(0, Relaxed);
            a[1].store(0, Relaxed);
        }
    }
}

impl Drop for Counters {
    /// Folds a dying instance into its class so short-lived locks still
    /// count in the class totals.
    fn drop(&mut self) {
        self.class.retired.absorb(&self.load());
    }
}

/// Where a lock's statistics go, in one word: either its own registered
/// [`Counters`] (from `Arc::into_raw`, low bit clear) or its class's pool
/// (a `&'static LockClass`, low bit set). An enum would take two words, and
/// this one is in every cached inode. Packed (align 1) so that a lock over
/// a small `T` grows by exactly 8 bytes, not 8 plus padding.
#[repr(C, packed)]
pub(crate) struct Meter(NonNull<u8>);

/// The decoded [`Meter`].
#[derive(Clone, Copy)]
enum Sink<'a> {
    Own(&'a Counters),
    Pool(&'static LockClass),
}

/// Low bit of a [`Meter`] marking a pooled instance.
const POOLED: usize = 1;

// Both pointees must leave the tag bit free.
const _: () = assert!(align_of::<Counters>() > POOLED && align_of::<LockClass>() > POOLED);

// SAFETY: a `Meter` is an `Arc<Counters>` or a `&'static LockClass`, both
// `Send + Sync` (checked below); it only hands out shared references.
unsafe impl Send for Meter {}
// SAFETY: as above.
unsafe impl Sync for Meter {}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Arc<Counters>>();
    send_sync::<&'static LockClass>();
};

impl Meter {
    /// A registered instance with its own counters.
    pub(crate) fn own(counters: Arc<Counters>) -> Self {
        let ptr = Arc::into_raw(counters).cast_mut().cast::<u8>();
        Self(NonNull::new(ptr).expect("Arc pointers are non-null"))
    }

    /// A pooled instance of `class`, counted in its live instances.
    pub(crate) fn pooled(class: &'static LockClass) -> Self {
        class.shard().live.fetch_add(1, Relaxed);
        let ptr = std::ptr::from_ref(class).cast::<u8>().cast_mut();
        Self(NonNull::new(ptr.map_addr(|addr| addr | POOLED)).expect("tagged reference"))
    }

    #[inline]
    #[allow(clippy::cast_ptr_alignment)] // both pointees' addresses are aligned
    fn sink(&self) -> Sink<'_> {
        let ptr = self.0;
        if ptr.addr().get() & POOLED == 0 {
            // SAFETY: untagged, so `own` made it with `Arc::into_raw`, and
            // that strong count is only given back in `drop`.
            Sink::Own(unsafe { ptr.cast::<Counters>().as_ref() })
        } else {
            let ptr = ptr.as_ptr().map_addr(|addr| addr & !POOLED);
            // SAFETY: tagged, so `pooled` made it from a `&'static LockClass`.
            Sink::Pool(unsafe { &*ptr.cast::<LockClass>() })
        }
    }

    pub(crate) fn class(&self) -> &'static LockClass {
        match self.sink() {
            Sink::Own(counters) => counters.class,
            Sink::Pool(class) => class,
        }
    }

    pub(crate) fn idx(&self) -> Option<u64> {
        match self.sink() {
            Sink::Own(counters) => counters.idx,
            Sink::Pool(_) => None,
        }
    }

    /// Count an acquisition by the calling thread; returns the counters of `access` that
    /// its contention and hold time go to.
    #[inline]
    fn count_acquisition(&self, access: Access) -> &Side {
        match self.sink() {
            Sink::Own(counters) => {
                counters.count_acquisition(access);
                counters.sides.get(access)
            }
            Sink::Pool(class) => {
                let side = class.shard().sides.get(access);
                side.acquisitions.fetch_add(1, Relaxed);
                side
            }
        }
    }

    /// This instance's own statistics; zero for a pooled instance.
    pub(crate) fn stats(&self) -> Stats {
        match self.sink() {
            Sink::Own(counters) => counters.load(),
            Sink::Pool(_) => Stats::default(),
        }
    }

    /// Blocking acquisition: fast `try` first; only on failure read the
    /// clock, block, and read it again.
    #[inline]
    pub(crate) fn acquire<G>(
        &self,
        access: Access,
        fast: impl FnOnce() -> Option<G>,
        slow: impl FnOnce() -> G,
    ) -> (G, Hold<'_>) {
        order::check(self);
        let mode = MODE.load(Relaxed);
        if mode & COUNTING == 0 {
            return (fast().unwrap_or_else(slow), self.uncounted());
        }
        let timing = mode & TIMING != 0;
        if let Some(guard) = fast() {
            return (guard, self.hold(access, timing.then(Instant::now)));
        }
        self.contend(access, timing, slow)
    }

    /// Non-blocking acquisition; exempt from the order check since a
    /// failed `try` cannot deadlock.
    #[inline]
    pub(crate) fn try_acquire<G>(&self, access: Access, fast: impl FnOnce() -> Option<G>) -> Option<(G, Hold<'_>)> {
        let guard = fast()?;
        let mode = MODE.load(Relaxed);
        if mode & COUNTING == 0 {
            return Some((guard, self.uncounted()));
        }
        Some((guard, self.hold(access, (mode & TIMING != 0).then(Instant::now))))
    }

    /// The slow path: always timed, since blocking dwarfs two clock reads.
    #[inline(never)]
    fn contend<G>(&self, access: Access, timing: bool, slow: impl FnOnce() -> G) -> (G, Hold<'_>) {
        let before = Instant::now();
        let guard = slow();
        let after = Instant::now();
        let hold = self.hold(access, timing.then_some(after));
        if let Some(side) = hold.side {
            side.record_contention(nanos(after - before));
        }
        (guard, hold)
    }

    #[inline]
    fn hold(&self, access: Access, start: Option<Instant>) -> Hold<'_> {
        let side = self.count_acquisition(access);
        order::push(self);
        Hold { meter: self, side: Some(side), start }
    }

    /// A hold that records nothing (counting is off).
    #[inline]
    fn uncounted(&self) -> Hold<'_> {
        order::push(self);
        Hold { meter: self, side: None, start: None }
    }
}

impl Drop for Meter {
    fn drop(&mut self) {
        match self.sink() {
            Sink::Own(_) => {
                // The pointer from `Arc::into_raw` itself, not the `&Counters`
                // of `sink`: only it may reach the reference counts.
                let raw = self.0.as_ptr().cast_const().cast::<Counters>();
                // SAFETY: untagged, so `own` made it with `Arc::into_raw`;
                // this gives that strong count back, and `self` is dead.
                drop(unsafe { Arc::from_raw(raw) });
            }
            Sink::Pool(class) => {
                class.shard().live.fetch_sub(1, Relaxed);
            }
        }
    }
}

/// Accounting half of a guard: records the hold time when dropped.
pub(crate) struct Hold<'a> {
    meter: &'a Meter,
    /// Where the acquisition was counted (for a pooled lock, the shard of
    /// the acquiring thread), so the release need not look it up again;
    /// `None` if it was taken while counting was off.
    side: Option<&'a Side>,
    start: Option<Instant>,
}

impl Hold<'_> {
    /// Ends the current hold period (the lock is about to be released).
    #[inline]
    pub(crate) fn pause(&mut self) {
        if let (Some(start), Some(side)) = (self.start.take(), self.side) {
            side.record_hold(nanos(start.elapsed()));
        }
    }

    /// Starts a new hold period after the lock was re-acquired.
    pub(crate) fn resume(&mut self) {
        if let Some(side) = self.side {
            side.acquisitions.fetch_add(1, Relaxed);
            self.start = timing().then(Instant::now);
        }
    }
}

impl Drop for Hold<'_> {
    #[inline]
    fn drop(&mut self) {
        self.pause();
        order::pop(self.meter);
    }
}
