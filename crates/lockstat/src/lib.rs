//! Named, measured locks: "every shared lock is named and measured".
//!
//! In the spirit of Linux lockstat, every lock belongs to a static
//! [`LockClass`] and counts its acquisitions, contentions (the fast
//! `try_lock` failed, so we had to block), wait time and hold time;
//! [`snapshot`] aggregates them per class on demand. The lock path never
//! touches a cache line shared by all threads.
//!
//! The crate knows no lock of its users: a program declares its classes (their names and, for
//! the lock-order check, their ranks) beside the code that takes them. Besides the measured
//! [`Mutex`], [`RwLock`] and [`Condvar`], it has the raw primitives under them, which the
//! `shuttle` feature swaps for the model checker's ([`sync`]), and the process's memory figures
//! that lock reports are shown with ([`memory`]).
//!
//! ```
//! use ferrofs_lockstat::{snapshot, LockClass, Mutex};
//!
//! static QUEUE: LockClass = LockClass::new("example-queue");
//!
//! let queue = Mutex::new(&QUEUE, Vec::new());
//! queue.lock().push(1);
//! queue.lock().push(2);
//! assert_eq!(queue.stats().exclusive.acquisitions, 2);
//! let class = snapshot().into_iter().find(|c| c.name == "example-queue").unwrap();
//! assert_eq!((class.live_instances, class.total.exclusive.acquisitions), (1, 2));
//! ```
//!
//! # What is measured, and what it costs
//!
//! - **Acquisitions and contentions** are always counted: one uncontended
//!   atomic add per acquisition, one more per contention.
//! - **Wait time** is always measured, but only on the contended (slow)
//!   path: the clock is read around the blocking call once the fast `try`
//!   has failed, so an uncontended acquisition never reads the clock.
//! - **Hold time** needs a clock read at both ends of every hold (about
//!   60 ns per lock/unlock pair), so it is only measured while
//!   [`set_timing`]`(true)` is in effect. **The default is off**; turn it on
//!   while investigating, and `hold_*` statistics stay 0 otherwise.
//!
//! With timing off an uncontended lock/unlock pair costs about 1.5 ns more
//! than the bare lock (numbers on [`RwLock::new_pooled`]).
//!
//! - **Everything** can be switched off at run time with
//!   [`set_counting`]`(false)`: an acquisition then does one relaxed load of
//!   the mode word (the same load that reads the timing switch) and counts
//!   nothing, not even contended waits: for measuring what counting costs.
//!
//! # Where the counters live
//!
//! - [`Mutex::new`] / [`RwLock::new`] (and `new_indexed`): the instance owns
//!   its counters, a heap block registered with the class, so it has its own
//!   [`Mutex::stats`], is listed per index in the snapshot, and folds its
//!   counts into the class when dropped. Its acquisition counts are split
//!   into eight (`OWN_SHARDS`) per-thread shares, like the pool's, so threads
//!   taking one lock do not fight over a counter line. About 1.2 KiB of
//!   heap per instance: meant for the long-lived locks (per allocation group,
//!   per log, per cache shard).
//! - [`Mutex::new_pooled`] / [`RwLock::new_pooled`]: the instance holds only
//!   a pointer to its class and counts into counters the class owns,
//!   sharded per thread ([`POOL_SHARDS`] cache-line-padded sets, allocated
//!   on first use) so threads do not fight over a cache line. No
//!   allocation, no registration, one word per lock: meant for per-object
//!   locks there are millions of (one per cached object). Such instances count in
//!   the class totals and live count only.
//!
//! # Lock order
//!
//! Debug builds also check lock ordering: classes made with
//! [`LockClass::ranked`] must be acquired in ascending rank, and instances of
//! one class in ascending index (e.g. allocation groups in number order).

#![deny(missing_docs)]

pub mod memory;
pub mod sync;

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::fmt;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock, Weak};

// The raw locks, the counters and the thread-locals come from `crate::sync`, so the model
// checker can run these locks (and count through them); the global switches and the shard
// rotor below stay `std`: they are settings, not state a schedule can break.
use crate::sync::atomic::{AtomicU64, Ordering::Relaxed};
use crate::sync::{self as raw, thread_local, RawRwLock};
use std::sync::atomic::{AtomicU8, AtomicUsize};
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;
use serde::Serialize;

/// The run-time switches, in one word so an acquisition reads both with one
/// relaxed load: [`COUNTING`] (acquisitions, contentions and wait times; on
/// by default) and [`TIMING`] (hold times too: two clock reads per lock; off
/// by default, and only effective while counting is on).
static MODE: AtomicU8 = AtomicU8::new(COUNTING);
const COUNTING: u8 = 1;
const TIMING: u8 = 2;

/// Every class that ever had an instance, so [`snapshot`] can find it. This and the class
/// registries stay `parking_lot` under the model checker too: nothing inside their critical
/// sections can switch checker threads, so no checker thread can block on them.
static CLASSES: parking_lot::Mutex<Vec<&'static LockClass>> = parking_lot::const_mutex(Vec::new());

/// Registry length below which dead entries are never pruned.
const MIN_PRUNE: usize = 64;

/// Number of per-thread counter sets a class keeps for its pooled
/// instances; threads beyond this many share sets (still exact, since the
/// counters are atomic, just no longer uncontended).
pub const POOL_SHARDS: usize = 32;

/// Per-thread shares of a registered instance's acquisition counts (threads beyond this many
/// share them, as for the pool). Every acquisition writes its count, so a single counter made
/// the instance's counter line bounce between CPUs that take one lock for reading, as every
/// lookup does with a cache shard: with 2 threads stating names of one directory, that
/// `lock incq` was 16% of the samples.
const OWN_SHARDS: usize = 8;

/// Class of the locks built by `Default`: they still get measured, and the
/// name shows up in reports as a prompt to give them a real class.
pub static UNNAMED: LockClass = LockClass::new("unnamed");

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

/// A named class of locks, declared as a static, e.g.
/// `pub static QUEUE_LOCK: LockClass = LockClass::new("queue");`.
///
/// The class is the unit of reporting: it aggregates all its instances
/// (including ones already dropped) and keeps a per-index breakdown.
pub struct LockClass {
    name: &'static str,
    rank: Option<u32>,
    registry: parking_lot::Mutex<Registry>,
    retired: Sides,
    /// Counters of the pooled instances, allocated by the first one.
    pool: OnceLock<Box<Pool>>,
}

/// Weak references to a class's live instances (construction path only).
struct Registry {
    live: Vec<Weak<Counters>>,
    prune_at: usize,
    listed: bool,
}

/// The per-thread counter sets of a class's pooled instances.
type Pool = [CachePadded<Shard>; POOL_SHARDS];

/// One thread's share of a class's pooled counters.
struct Shard {
    sides: Sides,
    /// Pooled instances created minus dropped by the threads of this shard
    /// (wrapping: an instance may be dropped on another shard).
    live: AtomicU64,
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
            pool: OnceLock::new(),
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

    /// Lists the class for [`snapshot`] (once).
    fn list(&'static self, registry: &mut Registry) {
        if !registry.listed {
            CLASSES.lock().push(self);
            registry.listed = true;
        }
    }

    /// Creates the counters of a new instance and registers them.
    fn register(&'static self, idx: Option<u64>) -> Arc<Counters> {
        let counters = Arc::new(Counters {
            class: self,
            idx,
            sides: Sides::new(),
            acquired: std::array::from_fn(|_| CachePadded::new([AtomicU64::new(0), AtomicU64::new(0)])),
        });
        let mut registry = self.registry.lock();
        self.list(&mut registry);
        registry.push(Arc::downgrade(&counters));
        counters
    }

    /// The pooled counters, allocated (and the class listed) on first use.
    #[inline]
    fn pool(&'static self) -> &'static Pool {
        self.pool.get_or_init(|| self.new_pool())
    }

    #[cold]
    fn new_pool(&'static self) -> Box<Pool> {
        self.list(&mut self.registry.lock());
        let shards: Box<[CachePadded<Shard>]> = (0..POOL_SHARDS)
            .map(|_| {
                CachePadded::new(Shard {
                    sides: Sides::new(),
                    live: AtomicU64::new(0),
                })
            })
            .collect();
        shards.try_into().unwrap_or_else(|_| unreachable!())
    }

    /// The calling thread's share of the pooled counters.
    #[inline]
    fn shard(&'static self) -> &'static Shard {
        &self.pool()[shard_index()]
    }

    /// Aggregates retired, live and pooled instances. Not atomic: an
    /// instance dropped during the scan may be missed.
    fn stats(&self) -> ClassStats {
        let mut total = self.retired.load();
        let mut per_index = BTreeMap::<u64, Stats>::new();
        let mut live_instances = 0;
        for counters in self.registry.lock().live.iter().filter_map(Weak::upgrade) {
            let stats = counters.load();
            total.merge(&stats);
            live_instances += 1;
            if let Some(idx) = counters.idx {
                per_index.entry(idx).or_default().merge(&stats);
            }
        }
        if let Some(pool) = self.pool.get() {
            let mut pooled = 0u64;
            for shard in pool.iter() {
                total.merge(&shard.sides.load());
                pooled = pooled.wrapping_add(shard.live.load(Relaxed));
            }
            // Transiently "negative" if a drop was seen but not its creation.
            let pooled = i64::try_from(pooled).unwrap_or(0);
            live_instances += usize::try_from(pooled).unwrap_or(usize::MAX);
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
            counters.reset();
        }
        for shard in self.pool.get().into_iter().flat_map(|pool| pool.iter()) {
            shard.sides.reset();
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

/// Hands out pool shard indices to threads, round robin.
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// This thread's pool shard; `POOL_SHARDS` until first needed.
    static SHARD: Cell<usize> = const { Cell::new(POOL_SHARDS) };
}

/// The calling thread's pool shard index, always `< POOL_SHARDS`.
#[inline]
fn shard_index() -> usize {
    let idx = SHARD
        .try_with(|shard| match shard.get() {
            idx if idx < POOL_SHARDS => idx,
            _ => assign_shard(shard),
        })
        .unwrap_or(0);
    // Free for the compiler to prove, so indexing needs no bounds check.
    idx % POOL_SHARDS
}

#[cold]
fn assign_shard(shard: &Cell<usize>) -> usize {
    let idx = NEXT_SHARD.fetch_add(1, Relaxed) % POOL_SHARDS;
    shard.set(idx);
    idx
}

/// Which side of a lock an acquisition took.
#[derive(Clone, Copy)]
enum Access {
    Exclusive = 0,
    Shared = 1,
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

/// The statistics of one registered lock instance, shared with its class
/// registry.
struct Counters {
    class: &'static LockClass,
    idx: Option<u64>,
    /// Everything but the acquisitions, which are in `acquired`.
    sides: Sides,
    /// Acquisitions by thread share, each `[exclusive, shared]`.
    acquired: [CachePadded<[AtomicU64; 2]>; OWN_SHARDS],
}

impl Counters {
    #[inline]
    fn count_acquisition(&self, access: Access) {
        self.acquired[shard_index() % OWN_SHARDS][access as usize].fetch_add(1, Relaxed);
    }

    fn load(&self) -> Stats {
        let mut stats = self.sides.load();
        let sum = |side: Access| self.acquired.iter().map(|a| a[side as usize].load(Relaxed)).fold(0u64, u64::wrapping_add);
        stats.exclusive = SideStats { acquisitions: sum(Access::Exclusive), ..stats.exclusive }.derive();
        stats.shared = SideStats { acquisitions: sum(Access::Shared), ..stats.shared }.derive();
        stats
    }

    fn reset(&self) {
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
struct Meter(NonNull<u8>);

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
    fn own(counters: Arc<Counters>) -> Self {
        let ptr = Arc::into_raw(counters).cast_mut().cast::<u8>();
        Self(NonNull::new(ptr).expect("Arc pointers are non-null"))
    }

    /// A pooled instance of `class`, counted in its live instances.
    fn pooled(class: &'static LockClass) -> Self {
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

    fn class(&self) -> &'static LockClass {
        match self.sink() {
            Sink::Own(counters) => counters.class,
            Sink::Pool(class) => class,
        }
    }

    fn idx(&self) -> Option<u64> {
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
    fn stats(&self) -> Stats {
        match self.sink() {
            Sink::Own(counters) => counters.load(),
            Sink::Pool(_) => Stats::default(),
        }
    }

    /// Blocking acquisition: fast `try` first; only on failure read the
    /// clock, block, and read it again.
    #[inline]
    fn acquire<G>(
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
    fn try_acquire<G>(
        &self,
        access: Access,
        fast: impl FnOnce() -> Option<G>,
    ) -> Option<(G, Hold<'_>)> {
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
        Hold {
            meter: self,
            side: Some(side),
            start,
        }
    }

    /// A hold that records nothing (counting is off).
    #[inline]
    fn uncounted(&self) -> Hold<'_> {
        order::push(self);
        Hold {
            meter: self,
            side: None,
            start: None,
        }
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
struct Hold<'a> {
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
    fn pause(&mut self) {
        if let (Some(start), Some(side)) = (self.start.take(), self.side) {
            side.record_hold(nanos(start.elapsed()));
        }
    }

    /// Starts a new hold period after the lock was re-acquired.
    fn resume(&mut self) {
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

/// Debug-build lock-order checking over a thread-local stack of held
/// ranked locks. Every entry point is a no-op when `debug_assertions` is off.
mod order {
    use super::{thread_local, LockClass, Meter, RefCell};

    struct Held {
        key: usize,
        rank: u32,
        class: &'static LockClass,
        idx: Option<u64>,
    }

    thread_local! {
        static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
    }

    /// Identifies the lock instance (its meter is part of it).
    fn key(m: &Meter) -> usize {
        std::ptr::from_ref(m).addr()
    }

    /// The rank of `m`'s class, if ranked and checking is compiled in.
    #[inline]
    fn rank(m: &Meter) -> Option<u32> {
        if cfg!(debug_assertions) {
            m.class().rank
        } else {
            None
        }
    }

    fn label(class: &LockClass, idx: Option<u64>) -> String {
        match idx {
            Some(idx) => format!("{}[{idx}]", class.name),
            None => class.name.to_string(),
        }
    }

    /// Whether `m` (of rank `rank`) may be acquired while `held` is held.
    fn may_follow(held: &Held, rank: u32, m: &Meter) -> bool {
        held.rank < rank
            || (held.rank == rank
                && std::ptr::eq(held.class, m.class())
                && matches!((held.idx, m.idx()), (Some(h), Some(n)) if h < n))
    }

    /// Panics if acquiring `m` now would break the declared order.
    #[inline]
    pub(super) fn check(m: &Meter) {
        let Some(rank) = rank(m) else {
            return;
        };
        let clash = HELD
            .try_with(|held| {
                let held = held.borrow();
                let bad = held.iter().find(|h| !may_follow(h, rank, m))?;
                Some(format!("{} (rank {})", label(bad.class, bad.idx), bad.rank))
            })
            .ok()
            .flatten();
        if let Some(held) = clash {
            panic!(
                "lock order violation: acquiring {} (rank {rank}) while holding {held}",
                label(m.class(), m.idx())
            );
        }
    }

    #[inline]
    pub(super) fn push(m: &Meter) {
        let Some(rank) = rank(m) else {
            return;
        };
        let entry = Held {
            key: key(m),
            rank,
            class: m.class(),
            idx: m.idx(),
        };
        // Fails only during thread teardown, when there is nothing to check.
        let _ = HELD.try_with(|held| held.borrow_mut().push(entry));
    }

    /// Removes the newest entry for `m`; guards may be dropped out of order.
    #[inline]
    pub(super) fn pop(m: &Meter) {
        if rank(m).is_none() {
            return;
        }
        let _ = HELD.try_with(|held| {
            let mut held = held.borrow_mut();
            if let Some(pos) = held.iter().rposition(|h| h.key == key(m)) {
                held.remove(pos);
            }
        });
    }
}

/// A named, measured mutual-exclusion lock over `std::sync::Mutex` (the model checker's
/// under the `shuttle` feature: [`crate::sync`]).
pub struct Mutex<T> {
    meter: Meter,
    raw: raw::Mutex<T>,
}

impl<T> Mutex<T> {
    /// A lock of `class`, counted in the class totals only.
    pub fn new(class: &'static LockClass, value: T) -> Self {
        Self {
            meter: Meter::own(class.register(None)),
            raw: raw::Mutex::new(value),
        }
    }

    /// A lock of `class` that is also reported under index `idx` (e.g. the
    /// AG number) and ordered by it against its siblings.
    pub fn new_indexed(class: &'static LockClass, idx: u64, value: T) -> Self {
        Self {
            meter: Meter::own(class.register(Some(idx))),
            raw: raw::Mutex::new(value),
        }
    }

    /// A lock of `class` with no counters of its own: see
    /// [`RwLock::new_pooled`]. For per-object locks there are millions of.
    pub fn new_pooled(class: &'static LockClass, value: T) -> Self {
        Self {
            meter: Meter::pooled(class),
            raw: raw::Mutex::new(value),
        }
    }

    /// Blocks until the lock is held, counting contention and wait time.
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let (raw, hold) = self.meter.acquire(
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
            .meter
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
    /// Always zero for a pooled instance, which has none of its own: see
    /// its class in [`snapshot`].
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
    /// It appears in the class totals and live count of [`snapshot`], but
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
        let (raw, hold) =
            self.meter
                .acquire(Access::Shared, || self.raw.try_read(), || self.raw.read());
        RwLockReadGuard { _hold: hold, raw }
    }

    /// Blocks for exclusive access, counted on the exclusive side.
    pub fn write(&self) -> RwLockWriteGuard<'_, T, R> {
        let (raw, hold) = self.meter.acquire(
            Access::Exclusive,
            || self.raw.try_write(),
            || self.raw.write(),
        );
        RwLockWriteGuard { _hold: hold, raw }
    }

    /// Shared access if immediately available.
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T, R>> {
        let (raw, hold) = self
            .meter
            .try_acquire(Access::Shared, || self.raw.try_read())?;
        Some(RwLockReadGuard { _hold: hold, raw })
    }

    /// Exclusive access if immediately available.
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T, R>> {
        let (raw, hold) = self
            .meter
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
    /// Always zero for a pooled instance, which has none of its own: see
    /// its class in [`snapshot`].
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
        Self {
            raw: raw::Condvar::new(),
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
    ) -> raw::WaitTimeoutResult {
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

/// Counts and times for one side (exclusive or shared) of a lock or class.
/// Averages are derived: wait per contention (as in Linux lockstat), hold
/// per acquisition. Wait times are measured on every contention; hold
/// times are 0 unless [`set_timing`] was on.
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
    /// Total time the lock was held (while [`set_timing`] is on).
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
    /// Instances alive at snapshot time, pooled ones included (their count
    /// is only approximate while they are being created or dropped).
    pub live_instances: usize,
    /// Totals over every instance ever created, pooled or registered
    /// (since the last [`reset`]).
    pub total: Stats,
    /// Live indexed instances by index, ascending; instances sharing an
    /// index (e.g. AG 0 of two mounts) are merged. Pooled instances have
    /// no entries.
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

/// Named counters read now, as (name, value) pairs, for the reports of a subsystem's own
/// counters beside its locks'.
pub fn read_counters(named: &[(&'static str, &AtomicU64)]) -> Vec<(&'static str, u64)> {
    named.iter().map(|&(name, v)| (name, v.load(Relaxed))).collect()
}

#[cfg(test)]
mod tests;
