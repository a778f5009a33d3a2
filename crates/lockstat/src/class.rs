//! Lock classes: the unit of reporting, each with the registry of its live instances and the
//! per-thread counter pool of its pooled ones.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock, Weak};

use crate::meter::{Counters, Sides};
use crate::stats::{ClassStats, Stats};
use crate::sync::atomic::{AtomicU64, Ordering::Relaxed};
use crate::sync::thread_local;
use std::sync::atomic::AtomicUsize;

use crossbeam_utils::CachePadded;

/// Every class that ever had an instance, so [`snapshot`](crate::snapshot) can find it. This
/// and the class registries stay `parking_lot` under the model checker too: nothing inside
/// their critical sections can switch checker threads, so no checker thread can block on them.
pub(crate) static CLASSES: parking_lot::Mutex<Vec<&'static LockClass>> = parking_lot::const_mutex(Vec::new());

/// Registry length below which dead entries are never pruned.
const MIN_PRUNE: usize = 64;

/// Number of per-thread counter sets a class keeps for its pooled
/// instances; threads beyond this many share sets (still exact, since the
/// counters are atomic, just no longer uncontended).
pub const POOL_SHARDS: usize = 32;

/// Class of the locks built by `Default`: they still get measured, and the
/// name shows up in reports as a prompt to give them a real class.
pub static UNNAMED: LockClass = LockClass::new("unnamed");

/// A named class of locks, declared as a static, e.g.
/// `pub static QUEUE_LOCK: LockClass = LockClass::new("queue");`.
///
/// The class is the unit of reporting: it aggregates all its instances
/// (including ones already dropped) and keeps a per-index breakdown.
pub struct LockClass {
    pub(crate) name: &'static str,
    pub(crate) rank: Option<u32>,
    pub(crate) registry: parking_lot::Mutex<Registry>,
    pub(crate) retired: Sides,
    /// Counters of the pooled instances, allocated by the first one.
    pool: OnceLock<Box<Pool>>,
}

/// Weak references to a class's live instances (construction path only).
pub(crate) struct Registry {
    pub(crate) live: Vec<Weak<Counters>>,
    prune_at: usize,
    listed: bool,
}

/// The per-thread counter sets of a class's pooled instances.
type Pool = [CachePadded<Shard>; POOL_SHARDS];

/// One thread's share of a class's pooled counters.
pub(crate) struct Shard {
    pub(crate) sides: Sides,
    /// Pooled instances created minus dropped by the threads of this shard
    /// (wrapping: an instance may be dropped on another shard).
    pub(crate) live: AtomicU64,
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
        let registry = Registry { live: Vec::new(), prune_at: MIN_PRUNE, listed: false };
        Self { name, rank, registry: parking_lot::const_mutex(registry), retired: Sides::new(), pool: OnceLock::new() }
    }

    /// The class name used in reports and lock-order panics.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The lock-order rank, if the class is ranked.
    pub fn rank(&self) -> Option<u32> {
        self.rank
    }

    /// Lists the class for [`snapshot`](crate::snapshot) (once).
    fn list(&'static self, registry: &mut Registry) {
        if !registry.listed {
            CLASSES.lock().push(self);
            registry.listed = true;
        }
    }

    /// Creates the counters of a new instance and registers them.
    pub(crate) fn register(&'static self, idx: Option<u64>) -> Arc<Counters> {
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
            .map(|_| CachePadded::new(Shard { sides: Sides::new(), live: AtomicU64::new(0) }))
            .collect();
        shards.try_into().unwrap_or_else(|_| unreachable!())
    }

    /// The calling thread's share of the pooled counters.
    #[inline]
    pub(crate) fn shard(&'static self) -> &'static Shard {
        &self.pool()[shard_index()]
    }

    /// Aggregates retired, live and pooled instances. Not atomic: an
    /// instance dropped during the scan may be missed.
    pub(crate) fn stats(&self) -> ClassStats {
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
        ClassStats { name: self.name, rank: self.rank, live_instances, total, per_instance }
    }

    pub(crate) fn reset(&self) {
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
pub(crate) fn shard_index() -> usize {
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
