//! What `ferrofs bench seeds` measured: every raw figure, the sizes and the machine it ran
//! with. `seeds.rs` fills it in, `seeds_report.rs` writes it out; neither imports the other
//! for it.

use super::report::{median, sorted};
use serde::Serialize;

/// Sizes of one run.
#[derive(Clone, Debug, Serialize)]
pub struct Sizes {
    pub preset: &'static str,
    pub orphan_threads: Vec<usize>,
    pub orphan_rounds: u64,
    pub mdtest_workers: Vec<usize>,
    /// Files per worker (slow targets: / SLOW_DIVISOR).
    pub mdtest_files: u64,
    pub fsmark_threads: usize,
    /// Files per run, all threads (slow targets: / SLOW_DIVISOR).
    pub fsmark_files: u64,
    pub dbench_clients: Vec<usize>,
    pub dbench_seconds: u32,
    /// Cached inodes of file system A, and files of B.
    pub unmount_a_files: u64,
    pub unmount_b_files: u64,
    pub slow_divisor: u64,
    pub slow_targets: Vec<&'static str>,
}

/// One raw figure.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub workload: &'static str,
    pub target: &'static str,
    /// Repetition, from 0.
    pub rep: usize,
    /// Threads, workers, clients, or (unmount) A's inodes.
    pub x: u64,
    pub metric: &'static str,
    pub value: f64,
}

/// One lock class's counters, summed over a workload's repetitions.
#[derive(Clone, Debug, Default, Serialize)]
pub struct LockRow {
    pub name: String,
    pub acquisitions: u64,
    pub contentions: u64,
    pub wait_total_ns: u64,
    pub wait_max_ns: u64,
}

#[derive(Clone, Debug, Serialize)]
pub struct LockSet {
    pub workload: &'static str,
    pub target: &'static str,
    /// Top classes by wait time.
    pub rows: Vec<LockRow>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub workload: &'static str,
    pub target: String,
    pub reason: String,
}

#[derive(Clone, Debug, Serialize)]
pub struct Machine {
    pub cores: usize,
    pub memory_bytes: u64,
    pub kernel: String,
    pub loadavg_start: String,
    pub loadavg_end: String,
}

/// Everything a run measured.
#[derive(Serialize)]
pub struct Results {
    pub command: String,
    pub sizes: Sizes,
    pub runs: usize,
    /// FUSE daemons ran each in a session of its own (`--detached`), else in the benchmark's.
    pub detached: bool,
    pub machine: Machine,
    pub wall_seconds: f64,
    /// Targets in report order.
    pub targets: Vec<(&'static str, &'static str)>,
    pub workloads: Vec<&'static str>,
    pub notes: Vec<(&'static str, String)>,
    pub skipped: Vec<Skipped>,
    pub locks: Vec<LockSet>,
    pub samples: Vec<Sample>,
}

impl Results {
    /// Median, min and max of one cell, if measured.
    pub fn stats(&self, w: &str, t: &str, x: u64, metric: &str) -> Option<(f64, f64, f64)> {
        stats(&self.samples, w, t, x, metric)
    }
}

/// Median, min and max of one workload, target, x and metric over `samples`, if measured.
pub fn stats(samples: &[Sample], w: &str, t: &str, x: u64, metric: &str) -> Option<(f64, f64, f64)> {
    let v: Vec<f64> = samples
        .iter()
        .filter(|s| s.workload == w && s.target == t && s.x == x && s.metric == metric)
        .map(|s| s.value)
        .collect();
    if v.is_empty() {
        return None;
    }
    let s = sorted(&v);
    Some((median(&s), s[0], s[s.len() - 1]))
}
