//! Benchmark results: one structure, printed as a table or written as JSON.

use super::phase::Timing;
use super::Layout;
use crate::units::{grouped, human_bytes};
use ferrofs_lockstat::{self as lockstat, ClassStats};
use serde::Serialize;

/// Lock classes shown in the table (the JSON has them all).
const LOCK_TABLE_ROWS: usize = 10;

#[derive(Serialize)]
pub struct Report {
    pub mode: &'static str,
    pub image: ImageReport,
    pub files: usize,
    /// Names taken in a random order (`--shuffle`), not in sequence.
    pub shuffled_names: bool,
    pub runs: usize,
    pub lock_timing: bool,
    pub cycles: Vec<Cycle>,
    pub big_dir: Option<Cycle>,
    pub memory: MemoryReport,
    pub journal: JournalReport,
    pub ag_alloc_retries: u64,
    pub unmount_seconds: f64,
    pub locks: Vec<ClassStats>,
}

#[derive(Serialize)]
pub struct ImageReport {
    pub path: Option<String>,
    pub size_bytes: u64,
    pub ag_count: u32,
    pub inodes: u64,
    pub log_bytes: u64,
}

/// One layout and thread count: every phase over all runs.
#[derive(Serialize)]
pub struct Cycle {
    pub layout: Layout,
    pub threads: usize,
    pub files: usize,
    pub phases: Vec<PhaseStats>,
    /// Memory growth over the first run's create phase (the report uses the first cycle's).
    #[serde(skip)]
    pub first_growth: Growth,
}

#[derive(Clone, Serialize)]
pub struct PhaseStats {
    pub phase: &'static str,
    /// Per run, wall clock.
    pub ops_per_sec: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// CPU time of the whole process per operation, per run (microseconds).
    pub cpu_us_per_op: Vec<f64>,
    pub cpu_us_per_op_median: f64,
}

/// RSS, heap in use and cached inodes added by a create phase.
#[derive(Clone, Copy, Debug, Default)]
pub struct Growth {
    pub rss_bytes: u64,
    pub heap_bytes: u64,
    pub inodes: u64,
}

#[derive(Serialize)]
pub struct MemoryReport {
    pub peak_rss_bytes: u64,
    pub measured_over: String,
    pub rss_growth_bytes: u64,
    pub inodes_cached: u64,
    pub rss_per_cached_inode: f64,
    pub heap_growth_bytes: u64,
    /// Heap bytes in use per cached inode: what the caches hold, without the allocator's
    /// fragmentation that RSS also counts.
    pub heap_per_cached_inode: f64,
    /// `size_of` the engine's in-memory inode (`ferrofs::INODE_STRUCT_BYTES`), which embeds the decoded `DiskInode`.
    pub inode_struct_bytes: usize,
    pub disk_inode_struct_bytes: usize,
}

/// The engine's journal counters as the report gives them: every counter under its own name,
/// and the throttled commits' wait in seconds beside the nanoseconds.
#[derive(Serialize)]
pub struct JournalReport {
    #[serde(flatten)]
    pub counters: ferrofs::JournalCounters,
    /// Time throttled commits waited for the CIL to empty, in all (not a lock wait).
    pub throttle_wait_seconds: f64,
}

/// Median and range of one figure over the runs.
#[derive(Clone, Debug, Serialize)]
pub struct Spread {
    pub runs: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Spread {
    /// Of one value per run (at least one).
    pub fn of(runs: &[f64]) -> Spread {
        let s = sorted(runs);
        Spread { runs: runs.to_vec(), median: median(&s), min: s[0], max: s[s.len() - 1] }
    }

    /// `median [min-max]`, each value formatted by `f`.
    pub fn cell(&self, f: impl Fn(f64) -> String) -> String {
        format!("{} [{}-{}]", f(self.median), f(self.min), f(self.max))
    }
}

/// What every workload reports around its own figures.
#[derive(Serialize)]
pub struct WorkloadReport<T> {
    pub mode: &'static str,
    pub image: ImageReport,
    pub runs: usize,
    pub lock_timing: bool,
    pub results: T,
    pub journal: JournalReport,
    pub ag_alloc_retries: u64,
    pub orphan_adds: u64,
    pub unmount_seconds: f64,
    pub locks: Vec<ClassStats>,
}

/// A workload's own figures, printed between the header and the journal and lock tables.
pub trait Figures {
    fn print(&self);
}

impl<T: Figures> WorkloadReport<T> {
    pub fn print(&self) {
        println!(
            "ferrofs bench {}: image {}, {} runs: median [min-max]\n",
            self.mode,
            self.image.describe(),
            self.runs
        );
        self.results.print();
        self.journal.print(self.unmount_seconds);
        println!(
            "allocation: {} AG allocation retries; orphan tables: {} adds",
            grouped(self.ag_alloc_retries),
            grouped(self.orphan_adds)
        );
        print_locks(&self.locks, self.lock_timing);
    }
}

impl ImageReport {
    fn describe(&self) -> String {
        format!(
            "{}, {}, {} AGs, {} inodes, log {}",
            self.path.as_deref().unwrap_or("in memory"),
            human_bytes(self.size_bytes),
            self.ag_count,
            grouped(self.inodes),
            human_bytes(self.log_bytes)
        )
    }
}

/// The lockstat table: top classes by wait time.
pub fn print_locks(locks: &[ClassStats], lock_timing: bool) {
    println!(
        "\nlocks, top {LOCK_TABLE_ROWS} by wait time{}:",
        if lock_timing { "" } else { " (wait times of contended acquisitions; hold times need --lock-timing)" }
    );
    print!("{}", lockstat::report_table(locks, LOCK_TABLE_ROWS));
}

impl PhaseStats {
    /// Rates of `ops` operations done in each run's `times` (at least one run).
    pub fn new(phase: &'static str, ops: usize, times: &[Timing]) -> PhaseStats {
        let runs: Vec<(u64, Timing)> = times.iter().map(|&t| (ops as u64, t)).collect();
        PhaseStats::counted(phase, &runs)
    }

    /// Rates of runs that each did their own number of operations: (ops, time) per run.
    pub fn counted(phase: &'static str, runs: &[(u64, Timing)]) -> PhaseStats {
        let ops_per_sec: Vec<f64> = runs.iter().map(|(ops, t)| *ops as f64 / t.wall.as_secs_f64().max(1e-9)).collect();
        let cpu_us_per_op: Vec<f64> =
            runs.iter().map(|(ops, t)| t.cpu.as_secs_f64() * 1e6 / (*ops).max(1) as f64).collect();
        let rates = Spread::of(&ops_per_sec);
        PhaseStats {
            phase,
            median: rates.median,
            min: rates.min,
            max: rates.max,
            cpu_us_per_op_median: Spread::of(&cpu_us_per_op).median,
            ops_per_sec,
            cpu_us_per_op,
        }
    }
}

impl MemoryReport {
    pub fn new(measured_over: String, g: Growth) -> MemoryReport {
        MemoryReport {
            peak_rss_bytes: super::process::peak_rss_bytes(),
            measured_over,
            rss_growth_bytes: g.rss_bytes,
            inodes_cached: g.inodes,
            rss_per_cached_inode: g.rss_bytes as f64 / g.inodes.max(1) as f64,
            heap_growth_bytes: g.heap_bytes,
            heap_per_cached_inode: g.heap_bytes as f64 / g.inodes.max(1) as f64,
            inode_struct_bytes: ferrofs::INODE_STRUCT_BYTES,
            disk_inode_struct_bytes: ferrofs::DISK_INODE_STRUCT_BYTES,
        }
    }
}

impl From<&ferrofs::JournalCounters> for JournalReport {
    fn from(counters: &ferrofs::JournalCounters) -> JournalReport {
        JournalReport { counters: counters.clone(), throttle_wait_seconds: counters.throttle_wait_ns as f64 / 1e9 }
    }
}

impl Report {
    pub fn print(&self) {
        self.print_header();
        self.print_cycles();
        if let Some(b) = &self.big_dir {
            let phases: Vec<String> = b
                .phases
                .iter()
                .map(|p| {
                    format!("{} {}/s ({:.2} CPU us/op)", p.phase, grouped(p.median as u64), p.cpu_us_per_op_median)
                })
                .collect();
            println!("\none directory, {} files, {} thread: {}", grouped(b.files as u64), b.threads, phases.join(", "));
        }
        self.print_memory();
        self.journal.print(self.unmount_seconds);
        println!("allocation: {} AG allocation retries", grouped(self.ag_alloc_retries));
        print_locks(&self.locks, self.lock_timing);
    }

    fn print_header(&self) {
        println!("ferrofs bench ({}): image {}", self.mode, self.image.describe());
        println!(
            "{} files per run{}, {} runs: median ops/s [min-max]; create and remove end with sync() (durable)\n",
            grouped(self.files as u64),
            super::names::order_note(self.shuffled_names),
            self.runs
        );
    }

    fn print_cycles(&self) {
        let Some(first) = self.cycles.first() else {
            return;
        };
        let names: Vec<&str> = first.phases.iter().map(|p| p.phase).collect();
        self.print_phase_table(names.iter().map(|n| format!("{:>27}", format!("{n} ops/s"))), |p| {
            format!("{:>27}", rate_cell(p))
        });
        println!("\nCPU time per operation, us (median; whole process, engine threads included):");
        self.print_phase_table(names.iter().map(|n| format!("{n:>8}")), |p| format!("{:>8.2}", p.cpu_us_per_op_median));
    }

    /// One row per cycle (layout, threads), one column per phase.
    fn print_phase_table(&self, heads: impl Iterator<Item = String>, cell: impl Fn(&PhaseStats) -> String) {
        println!("{:<8} {:>7} {}", "layout", "threads", heads.collect::<Vec<_>>().join(" "));
        for c in &self.cycles {
            let cells: Vec<String> = c.phases.iter().map(&cell).collect();
            println!("{:<8} {:>7} {}", c.layout.name(), c.threads, cells.join(" "));
        }
    }

    fn print_memory(&self) {
        let m = &self.memory;
        println!("\nmemory: peak RSS {}", human_bytes(m.peak_rss_bytes));
        println!(
            "  per cached inode, {} inodes ({}; log written home first; directory blocks included):",
            grouped(m.inodes_cached),
            m.measured_over
        );
        println!(
            "    {:.0} bytes of heap in use ({} grown), {:.0} bytes of RSS ({} grown)",
            m.heap_per_cached_inode,
            human_bytes(m.heap_growth_bytes),
            m.rss_per_cached_inode,
            human_bytes(m.rss_growth_bytes)
        );
        println!(
            "  size_of: Inode {} bytes (embeds DiskInode {} bytes)",
            m.inode_struct_bytes, m.disk_inode_struct_bytes
        );
    }
}

impl JournalReport {
    fn print(&self, unmount_seconds: f64) {
        let c = &self.counters;
        println!(
            "\njournal: {} commits ({} into shared directories' shards), {} checkpoints ({} background, {} forced)",
            grouped(c.commits),
            grouped(c.routed_commits),
            grouped(c.checkpoints),
            grouped(c.background_checkpoints),
            grouped(c.forced_checkpoints)
        );
        println!(
            "  {} logged in {} items; {} log-space waits, {} commit throttles (waited {:.2} s in all)",
            human_bytes(c.log_bytes),
            grouped(c.items_logged),
            grouped(c.log_space_waits),
            grouped(c.commit_throttles),
            self.throttle_wait_seconds
        );
        println!(
            "  {} AIL pushes wrote {} items home; unmount took {:.2} s",
            grouped(c.ail_pushes),
            grouped(c.items_written_home),
            unmount_seconds
        );
    }
}

pub(super) fn sorted(v: &[f64]) -> Vec<f64> {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    s
}

pub(super) fn median(sorted: &[f64]) -> f64 {
    let mid = sorted.len() / 2;
    if sorted.len().is_multiple_of(2) {
        (sorted[mid - 1] + sorted[mid]) / 2.0
    } else {
        sorted[mid]
    }
}

/// The value at quantile `q` of sorted samples (nearest rank).
pub(super) fn quantile(sorted: &[f64], q: f64) -> f64 {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// This run's command line, as `ferrofs bench ...` (what a report says was run).
pub fn command_line() -> String {
    std::iter::once("ferrofs bench".to_string()).chain(std::env::args().skip(1)).collect::<Vec<_>>().join(" ")
}

/// `312,456 [301,000-320,000]`
pub fn rate_cell(p: &PhaseStats) -> String {
    format!("{} [{}-{}]", grouped(p.median as u64), grouped(p.min as u64), grouped(p.max as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn median_min_max() {
        let secs = |s: &[u64]| {
            s.iter().map(|&s| Timing { wall: Duration::from_secs(s), cpu: Duration::from_secs(s) }).collect::<Vec<_>>()
        };
        let p = PhaseStats::new("create", 100, &secs(&[1, 4, 2]));
        assert_eq!((p.median, p.min, p.max), (50.0, 25.0, 100.0));
        assert_eq!(p.cpu_us_per_op_median, 20_000.0);
        let p = PhaseStats::new("create", 100, &secs(&[1, 2]));
        assert_eq!(p.median, 75.0);
    }
}
