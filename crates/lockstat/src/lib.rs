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

mod class;
mod lock;
mod meter;
mod order;
mod stats;

pub use class::{LockClass, POOL_SHARDS, UNNAMED};
pub use lock::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use meter::{counting, set_counting, set_timing, timing};
pub use stats::{read_counters, report_table, reset, snapshot, top_by_wait, ClassStats, SideStats, Stats};

#[cfg(test)]
mod tests;
