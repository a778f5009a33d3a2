//! The locks' counts, times, switches and order checks.

use super::*;
use crate::meter::OWN_SHARDS;
use crate::stats::fmt_ns;
use crate::sync as raw;
use serde::Serialize;
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

/// Tests that read counters, or flip `reset`/`set_timing`, run one at a
/// time: those are process-wide.
static SERIAL: parking_lot::Mutex<()> = parking_lot::const_mutex(());

/// Sets hold timing for one test, restoring the previous setting.
struct Timing(bool);

impl Timing {
    fn set(on: bool) -> Self {
        let previous = timing();
        set_timing(on);
        Self(previous)
    }
}

impl Drop for Timing {
    fn drop(&mut self) {
        set_timing(self.0);
    }
}

fn class_stats(name: &str) -> ClassStats {
    snapshot().into_iter().find(|c| c.name == name).expect("class listed")
}

#[test]
fn acquisitions_are_exact_across_threads() {
    static CLASS: LockClass = LockClass::new("test-exact");
    let _serial = SERIAL.lock();
    let lock = Mutex::new(&CLASS, 0u64);
    thread::scope(|s| {
        // More threads than an instance has shares of its counts.
        for _ in 0..2 * OWN_SHARDS {
            s.spawn(|| (0..10_000).for_each(|_| *lock.lock() += 1));
        }
    });
    let n = 2 * OWN_SHARDS as u64 * 10_000;
    assert_eq!(*lock.lock(), n);
    assert_eq!(lock.stats().exclusive.acquisitions, n + 1);
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
    let _timing = Timing::set(true);
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
    let timing = Timing::set(false);
    for _ in 0..100 {
        drop(lock.write());
        drop(lock.read());
    }
    drop(timing);
    let stats = lock.stats();
    assert_eq!(stats.combined().acquisitions, 200);
    assert_eq!((stats.combined().hold_total_ns, stats.combined().hold_max_ns), (0, 0));
}

#[test]
fn counting_off_counts_nothing_and_back_on_counts_again() {
    static CLASS: LockClass = LockClass::new("test-uncounted");
    let _serial = SERIAL.lock();
    let own = RwLock::new(&CLASS, ());
    let pooled = Mutex::new_pooled(&CLASS, ());
    let _timing = Timing::set(true);
    set_counting(false);
    let held = pooled.lock();
    for _ in 0..100 {
        drop(own.write());
        drop(own.read());
        drop(own.try_read());
    }
    set_counting(true);
    // A hold begun uncounted stays uncounted when it ends.
    drop(held);
    assert_eq!(own.stats(), Stats::default());
    assert_eq!(class_stats("test-uncounted").total, Stats::default());
    drop(own.write());
    drop(pooled.lock());
    assert_eq!(own.stats().exclusive.acquisitions, 1);
    assert_eq!(class_stats("test-uncounted").total.exclusive.acquisitions, 2);
}

/// Blocks one `lock()` of `lock` for about 20 ms, then hammers it from
/// two threads; returns the number of acquisitions made.
fn contend_on(lock: &Mutex<u64>) -> u64 {
    let (started, ready) = mpsc::channel();
    thread::scope(|s| {
        let guard = lock.lock();
        s.spawn(|| {
            started.send(()).expect("main waits");
            *lock.lock() += 1;
        });
        ready.recv().expect("thread started");
        thread::sleep(Duration::from_millis(20));
        drop(guard);
        s.spawn(|| (0..10_000).for_each(|_| *lock.lock() += 1));
        (0..10_000).for_each(|_| *lock.lock() += 1);
    });
    20_002
}

#[test]
fn waits_are_timed_by_default_but_holds_are_not() {
    static CLASS: LockClass = LockClass::new("test-default-timing");
    let _serial = SERIAL.lock();
    let _timing = Timing::set(false);
    let lock = Mutex::new(&CLASS, 0);
    let acquisitions = contend_on(&lock);
    let stats = lock.stats().exclusive;
    assert_eq!(stats.acquisitions, acquisitions);
    assert!(stats.contentions > 0);
    assert!(stats.wait_max_ns > 0, "{stats:?}");
    assert!(stats.wait_total_ns >= stats.wait_max_ns && stats.wait_avg_ns > 0);
    assert_eq!((stats.hold_total_ns, stats.hold_max_ns), (0, 0));
}

#[test]
fn timing_is_off_by_default() {
    // Nothing in the crate turns it on except tests, which restore it.
    let _serial = SERIAL.lock();
    assert!(!timing());
}

#[test]
fn pooled_locks_cost_one_word() {
    use std::mem::size_of;
    fn check<T>() {
        let bare = size_of::<raw::RwLock<T>>();
        assert!(size_of::<RwLock<T>>() <= bare + 8, "RwLock<{}>", std::any::type_name::<T>());
        let bare = size_of::<raw::Mutex<T>>();
        assert!(size_of::<Mutex<T>>() <= bare + 8, "Mutex<{}>", std::any::type_name::<T>());
    }
    check::<()>();
    check::<u8>();
    check::<u32>();
    check::<u64>();
    check::<[u8; 250]>();
    check::<(u64, [u8; 3])>();
    assert_eq!(size_of::<RwLock<u64>>(), size_of::<raw::RwLock<u64>>() + 8);
}

#[test]
fn pooled_counts_are_exact_in_class_totals() {
    static CLASS: LockClass = LockClass::new("test-pooled-exact");
    let _serial = SERIAL.lock();
    let shared = RwLock::new_pooled(&CLASS, 0u64);
    thread::scope(|s| {
        for t in 0..4 {
            let shared = &shared;
            s.spawn(move || {
                // Short-lived per-object locks, as in an inode cache.
                let mine: Vec<_> = (0..100).map(|i| Mutex::new_pooled(&CLASS, i)).collect();
                for i in 0..10_000 {
                    if t % 2 == 0 {
                        *shared.write() += 1;
                    } else {
                        assert!(*shared.read() <= 20_000);
                    }
                    *mine[i % 100].lock() += 1;
                }
                assert!(mine[7].try_lock().is_some());
            });
        }
    });
    assert_eq!(*shared.try_read().expect("free"), 20_000);
    let stats = class_stats("test-pooled-exact");
    assert_eq!(stats.total.exclusive.acquisitions, 20_000 + 40_000 + 4);
    assert_eq!(stats.total.shared.acquisitions, 20_001);
    assert_eq!(stats.live_instances, 1);
    assert!(stats.per_instance.is_empty());
    assert_eq!(shared.stats(), Stats::default());
}

#[test]
fn pooled_counts_survive_more_threads_than_shards() {
    static CLASS: LockClass = LockClass::new("test-pooled-many-threads");
    let _serial = SERIAL.lock();
    let lock = Mutex::new_pooled(&CLASS, 0u64);
    let threads = 2 * POOL_SHARDS as u64 + 3;
    thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| (0..1_000).for_each(|_| *lock.lock() += 1));
        }
    });
    assert_eq!(lock.into_inner(), threads * 1_000);
    let stats = class_stats("test-pooled-many-threads");
    assert_eq!(stats.total.exclusive.acquisitions, threads * 1_000);
    assert_eq!(stats.live_instances, 0);
}

#[test]
fn pooled_contention_is_seen() {
    static CLASS: LockClass = LockClass::new("test-pooled-contended");
    let _serial = SERIAL.lock();
    let _timing = Timing::set(false);
    let lock = Mutex::new_pooled(&CLASS, 0);
    let acquisitions = contend_on(&lock);
    let stats = class_stats("test-pooled-contended").total.exclusive;
    assert_eq!(stats.acquisitions, acquisitions);
    assert!(stats.contentions > 0);
    assert!(stats.wait_max_ns > 0, "{stats:?}");
    assert_eq!(stats.hold_total_ns, 0);
    assert_eq!(lock.stats(), Stats::default());

    let _timing = Timing::set(true);
    let rw = RwLock::new_pooled(&CLASS, ());
    drop(rw.write());
    let _r = rw.read();
    assert!(rw.try_write().is_none());
    let stats = class_stats("test-pooled-contended").total;
    assert!(stats.exclusive.hold_total_ns > 0);
    assert_eq!(stats.shared.acquisitions, 1);
}

#[test]
fn pooled_live_count_and_reset() {
    static CLASS: LockClass = LockClass::new("test-pooled-live");
    let _serial = SERIAL.lock();
    let locks: Vec<_> = (0..1_000).map(|i| RwLock::new_pooled(&CLASS, i)).collect();
    locks.iter().for_each(|l| drop(l.read()));
    assert_eq!(class_stats("test-pooled-live").live_instances, 1_000);
    // Dropped on another thread, i.e. on another shard.
    thread::spawn(move || drop(locks)).join().expect("dropped");
    let stats = class_stats("test-pooled-live");
    assert_eq!(stats.live_instances, 0);
    assert_eq!(stats.total.shared.acquisitions, 1_000);
    let live = Mutex::new_pooled(&CLASS, ());
    reset();
    let stats = class_stats("test-pooled-live");
    assert_eq!((stats.live_instances, stats.total), (1, Stats::default()));
    assert!(format!("{live:?}").contains("test-pooled-live"));
}

#[test]
fn dropped_instances_stay_in_class_totals() {
    static CLASS: LockClass = LockClass::new("test-retired");
    let _serial = SERIAL.lock();
    let lock = Mutex::new(&CLASS, 7);
    drop(lock.lock());
    assert_eq!(lock.into_inner(), 7);
    let stats = class_stats("test-retired");
    assert_eq!((stats.live_instances, stats.total.exclusive.acquisitions), (0, 1));
}

#[test]
fn indexed_instances_are_reported_per_index() {
    static CLASS: LockClass = LockClass::ranked("test-ag", 10);
    let _serial = SERIAL.lock();
    let ags: Vec<_> = (0..4).map(|agno| Mutex::new_indexed(&CLASS, agno, agno)).collect();
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
    assert!(registered <= 200_000, "dead entries not pruned: {registered}");
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
    assert!(pair.1.wait_for(&mut guard, Duration::from_millis(1)).timed_out());
    drop(guard);
    assert!(pair.0.stats().exclusive.acquisitions >= 3);
}

#[test]
fn report_sorts_by_wait() {
    let quiet =
        ClassStats { name: "quiet", rank: None, live_instances: 1, total: Stats::default(), per_instance: vec![] };
    let mut busy = quiet.clone();
    busy.name = "busy";
    busy.total.shared =
        SideStats { acquisitions: 9, contentions: 2, wait_total_ns: 3_500_000, ..SideStats::default() }.derive();
    let stats = [quiet, busy];
    assert_eq!(top_by_wait(&stats, 1)[0].name, "busy");
    let table = report_table(&stats, 2);
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines.len(), 3);
    assert!(lines[0].starts_with("class") && lines[1].starts_with("busy") && lines[2].starts_with("quiet"));
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
    let (low, high, free) = (Mutex::new(&LOW, ()), RwLock::new(&HIGH, ()), Mutex::new(&FREE, ()));
    let ags: Vec<_> = (0..3).map(|agno| Mutex::new_indexed(&LOW, agno, ())).collect();
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
#[should_panic(expected = "acquiring test-inv-low (rank 1) while holding test-inv-high (rank 2)")]
fn inverted_ranks_panic() {
    static LOW: LockClass = LockClass::ranked("test-inv-low", 1);
    static HIGH: LockClass = LockClass::ranked("test-inv-high", 2);
    let (low, high) = (Mutex::new(&LOW, ()), RwLock::new(&HIGH, ()));
    let _h = high.read();
    let _l = low.lock();
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "acquiring test-inv-ag[1] (rank 5) while holding test-inv-ag[2] (rank 5)")]
fn descending_indices_panic() {
    static AG: LockClass = LockClass::ranked("test-inv-ag", 5);
    let ags: Vec<_> = (0..3).map(|agno| RwLock::new_indexed(&AG, agno, ())).collect();
    let _two = ags[2].write();
    let _one = ags[1].write();
}

#[test]
fn pooled_locks_are_ordered_by_rank() {
    static LOW: LockClass = LockClass::ranked("test-pooled-order-low", 1);
    static HIGH: LockClass = LockClass::ranked("test-pooled-order-high", 2);
    let low = Mutex::new_pooled(&LOW, ());
    let high: Vec<_> = (0..2).map(|_| RwLock::new_pooled(&HIGH, ())).collect();
    let l = low.lock();
    let h = high[0].write();
    drop(l);
    drop(h);
    let _h = high[1].read();
    assert!(low.try_lock().is_some());
}

#[cfg(debug_assertions)]
#[test]
#[should_panic(expected = "acquiring test-pooled-inv-low (rank 1) while holding test-pooled-inv-high (rank 2)")]
fn pooled_inverted_ranks_panic() {
    static LOW: LockClass = LockClass::ranked("test-pooled-inv-low", 1);
    static HIGH: LockClass = LockClass::ranked("test-pooled-inv-high", 2);
    let (low, high) = (Mutex::new(&LOW, ()), RwLock::new_pooled(&HIGH, ()));
    let _h = high.read();
    let _l = low.lock();
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
