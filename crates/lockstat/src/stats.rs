//! What the locks report: the statistics types, [`snapshot`] and [`reset`] over every
//! class, and the lockstat-like table.

use std::fmt;

use crate::class::{LockClass, CLASSES};
use crate::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

/// Counts and times for one side (exclusive or shared) of a lock or class.
/// Averages are derived: wait per contention (as in Linux lockstat), hold
/// per acquisition. Wait times are measured on every contention; hold
/// times are 0 unless [`set_timing`](crate::set_timing) was on.
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
    /// Total time the lock was held (while [`set_timing`](crate::set_timing) is on).
    pub hold_total_ns: u64,
    /// Longest single hold.
    pub hold_max_ns: u64,
    /// `hold_total_ns / acquisitions`.
    pub hold_avg_ns: u64,
}

impl SideStats {
    pub(crate) fn merge(&mut self, o: &SideStats) {
        self.acquisitions += o.acquisitions;
        self.contentions += o.contentions;
        self.wait_total_ns += o.wait_total_ns;
        self.hold_total_ns += o.hold_total_ns;
        self.wait_max_ns = self.wait_max_ns.max(o.wait_max_ns);
        self.hold_max_ns = self.hold_max_ns.max(o.hold_max_ns);
        *self = self.derive();
    }

    pub(crate) fn derive(self) -> Self {
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

    pub(crate) fn merge(&mut self, o: &Stats) {
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
    std::iter::once(header).chain(rows).map(|row| row + "\n").collect()
}

fn class_row(c: &ClassStats) -> String {
    let s = c.total.combined();
    let times =
        [s.wait_total_ns, s.wait_max_ns, s.wait_avg_ns, s.hold_total_ns, s.hold_max_ns, s.hold_avg_ns].map(fmt_ns);
    let [wt, wm, wa, ht, hm, ha] = times;
    table_row([c.name.to_string(), s.acquisitions.to_string(), s.contentions.to_string(), wt, wm, wa, ht, hm, ha])
}

fn table_row<S: fmt::Display>(cols: [S; 9]) -> String {
    let [name, acq, cont, wt, wm, wa, ht, hm, ha] = cols;
    format!("{name:<24} {acq:>12} {cont:>10} {wt:>9} {wm:>9} {wa:>9} {ht:>9} {hm:>9} {ha:>9}")
}

/// Human-readable duration with one decimal: `950ns`, `1.2us`, `3.4ms`, `5.6s`.
pub(crate) fn fmt_ns(ns: u64) -> String {
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
