//! The figures of `ferrofs bench scale` and how they read: its rows, the PASS/MISS checks
//! and the tables. `scale.rs` measures them.

use super::names;
use super::report::{rate_cell, Figures, PhaseStats, Spread};
use super::targets::Kind;
use super::Layout;
use crate::units::{grouped, human_bytes};
use serde::Serialize;
use std::collections::HashMap;

/// A lock whose waits take more of a private-directory phase's thread time than this misses
/// the target: threads in directories of their own should not meet.
const WAIT_SHARE_LIMIT: f64 = 0.05;
/// Throughput at the largest thread count must be at least this share of the best.
const OVERSUBSCRIBED_FLOOR: f64 = 0.90;

#[derive(Serialize)]
pub struct ScaleFigures {
    /// Files per run in the main phases, split over the threads.
    pub files: usize,
    /// Files each thread creates in the mdtest pattern.
    pub mdtest_files_per_thread: usize,
    /// Minimum wall time of a read-only phase (it repeats passes over its files).
    pub min_phase_ms: u64,
    /// Names taken in a random order (`--shuffle`), not in sequence.
    pub shuffled_names: bool,
    pub threads: Vec<usize>,
    pub rows: Vec<ScaleRow>,
    pub mdtest: Vec<ScaleRow>,
    pub targets: Vec<Target>,
    /// The same phases through system calls on mounted file systems (`--targets`).
    pub mounted: Vec<MountedScale>,
    /// The process's peak RSS once the engine's phases are done, and the cache budget the
    /// engine ran under (it covers the caches and the journal).
    pub peak_rss_bytes: u64,
    /// The budget's own count (caches and journal) at its highest, sampled every 10 ms.
    pub peak_budget_bytes: u64,
    pub cache_budget_bytes: u64,
}

#[derive(Serialize)]
pub struct MountedScale {
    pub target: Kind,
    pub rows: Vec<ScaleRow>,
    pub mdtest: Vec<ScaleRow>,
    /// The oversubscription check only: lock waits and retries are the engine's.
    pub targets: Vec<Target>,
}

/// One phase at one layout and thread count, over all runs.
#[derive(Serialize)]
pub struct ScaleRow {
    pub layout: Layout,
    pub threads: usize,
    /// Operations done in each run (readdir: entries returned).
    pub ops: Vec<u64>,
    /// Wall time of each run, seconds.
    pub wall_seconds: Vec<f64>,
    #[serde(flatten)]
    pub stats: PhaseStats,
    /// Median ops/s over the median at the smallest thread count measured.
    pub scaling: f64,
    pub scaling_base_threads: usize,
    /// AG allocation retries over all runs of the phase.
    pub ag_alloc_retries: u64,
    /// Commits' waits for a full CIL to empty, as a share of threads x wall time (not a
    /// lock wait: shown beside the locks, not checked against their limit).
    pub throttle_wait_share: f64,
    /// The classes with the most wait time, over all runs of the phase.
    pub locks: Vec<LockWait>,
}

#[derive(Clone, Serialize)]
pub struct LockWait {
    pub class: &'static str,
    pub acquisitions: u64,
    pub contentions: u64,
    pub wait_total_ns: u64,
    /// wait_total / (threads x wall time), summed over the runs.
    pub wait_share: f64,
}

#[derive(Serialize)]
pub struct Target {
    pub name: String,
    pub met: bool,
    pub detail: String,
}

/// The main phases, in the order they run.
pub const PHASES: [&str; 7] = ["create", "stat", "open/close", "readdir", "rename in dir", "rename across", "unlink"];
pub const MDTEST_PHASES: [&str; 3] = ["create", "stat", "remove"];

/// Fill in each row's scaling against the same phase at the smallest thread count.
pub fn with_scaling(mut rows: Vec<ScaleRow>) -> Vec<ScaleRow> {
    let mut base: HashMap<&str, (usize, f64)> = HashMap::new();
    for r in &rows {
        let e = base.entry(r.stats.phase).or_insert((r.threads, r.stats.median));
        if r.threads < e.0 {
            *e = (r.threads, r.stats.median);
        }
    }
    for r in &mut rows {
        let (t, m) = base[r.stats.phase];
        r.scaling = r.stats.median / m.max(1e-9);
        r.scaling_base_threads = t;
    }
    rows
}

fn group_name(layout: Layout, mdtest: bool) -> &'static str {
    match (mdtest, layout) {
        (true, _) => "mdtest",
        (false, Layout::Private) => "private",
        (false, Layout::Shared) => "shared",
    }
}

/// A phase at the largest thread count against its best: (share, the largest count's row,
/// the best row), if both were measured.
fn oversubscribed<'a>(
    group: &'a [ScaleRow],
    phase: &str,
    layout: Layout,
    max_threads: usize,
) -> Option<(f64, &'a ScaleRow, &'a ScaleRow)> {
    let of = || group.iter().filter(move |r| r.stats.phase == phase && r.layout == layout);
    let best = of().max_by(|a, b| a.stats.median.total_cmp(&b.stats.median))?;
    let last = of().find(|r| r.threads == max_threads)?;
    Some((last.stats.median / best.stats.median.max(1e-9), last, best))
}

/// Every (phase, layout) of `group`, in the order they first appear.
fn phases_of(group: &[ScaleRow]) -> Vec<(&'static str, Layout)> {
    let mut phases = Vec::new();
    for r in group {
        if !phases.contains(&(r.stats.phase, r.layout)) {
            phases.push((r.stats.phase, r.layout));
        }
    }
    phases
}

/// The PASS/MISS checks. `engine`: all three; for a mounted file system only the first, since
/// the lock waits and allocation retries are the engine's own counters.
pub fn check_targets(rows: &[ScaleRow], mdtest: &[ScaleRow], max_threads: usize, engine: bool) -> Vec<Target> {
    let mut targets = Vec::new();
    // 1. No collapse under oversubscription: every phase at the largest thread count keeps
    //    90% of its best throughput.
    for (group, is_mdtest) in [(rows, false), (mdtest, true)] {
        for (phase, layout) in phases_of(group) {
            let Some((share, last, best)) = oversubscribed(group, phase, layout, max_threads) else {
                continue;
            };
            targets.push(Target {
                name: format!("{} {phase}: {max_threads} threads >= 90% of best", group_name(layout, is_mdtest)),
                met: share >= OVERSUBSCRIBED_FLOOR,
                detail: format!(
                    "{} ops/s at {max_threads} threads = {:.0}% of {} ops/s at {} threads",
                    grouped(last.stats.median as u64),
                    share * 100.0,
                    grouped(best.stats.median as u64),
                    best.threads
                ),
            });
        }
    }
    if !engine {
        return targets;
    }
    // 2. Private directories meet on no lock: no class waits more than 5% of a phase's
    //    thread time.
    let private = rows
        .iter()
        .filter(|r| r.layout == Layout::Private)
        .map(|r| (r, "private"))
        .chain(mdtest.iter().map(|r| (r, "mdtest")));
    let mut over = Vec::new();
    let mut worst: Option<(f64, String)> = None;
    for (r, group) in private {
        for l in &r.locks {
            let at = format!("{} at {group} {} {}t", l.class, r.stats.phase, r.threads);
            if worst.as_ref().is_none_or(|w| l.wait_share > w.0) {
                worst = Some((l.wait_share, at.clone()));
            }
            if l.wait_share > WAIT_SHARE_LIMIT {
                over.push(format!("{} {:.1}%", at, l.wait_share * 100.0));
            }
        }
    }
    targets.push(Target {
        name: "no lock waits above 5% of thread time in private-directory phases".to_string(),
        met: over.is_empty(),
        detail: if over.is_empty() {
            match worst {
                Some((s, at)) => format!("highest: {at}, {:.2}%", s * 100.0),
                None => "no lock waits".to_string(),
            }
        } else {
            over.join("; ")
        },
    });
    // 3. The allocator never retries (seed 001), measured where contention is highest.
    let retries: u64 = rows.iter().chain(mdtest).filter(|r| r.threads == max_threads).map(|r| r.ag_alloc_retries).sum();
    targets.push(Target {
        name: format!("0 AG allocation retries at {max_threads} threads"),
        met: retries == 0,
        detail: format!("{} retries", grouped(retries)),
    });
    targets
}

impl ScaleFigures {
    fn print_rows(&self, title: &str, rows: &[&ScaleRow], flag: bool) {
        println!("{title}");
        println!(
            "{:<14} {:>7} {:>29} {:>7} {:>6} {:>9}  top locks by wait (share of threads x wall time{}), then commit throttle waits",
            "phase",
            "threads",
            "ops/s median [min-max]",
            "wall ms",
            "scale",
            "CPU us/op",
            if flag { "; ! above 5%" } else { "" }
        );
        for r in rows {
            let mut locks: Vec<String> = r
                .locks
                .iter()
                .filter(|l| l.contentions > 0)
                .map(|l| {
                    let mark = if flag && l.wait_share > WAIT_SHARE_LIMIT { "!" } else { "" };
                    format!("{} {:.2}%{mark}", l.class, l.wait_share * 100.0)
                })
                .collect();
            if r.throttle_wait_share > 0.0 {
                locks.push(format!("throttled {:.2}%", r.throttle_wait_share * 100.0));
            }
            println!(
                "{:<14} {:>7} {:>29} {:>7.0} {:>6.2} {:>9.2}  {}",
                r.stats.phase,
                r.threads,
                rate_cell(&r.stats),
                Spread::of(&r.wall_seconds).median * 1e3,
                r.scaling,
                r.stats.cpu_us_per_op_median,
                if locks.is_empty() { "-".to_string() } else { locks.join(", ") }
            );
        }
        println!();
    }

    fn print_tables(&self, rows: &[ScaleRow], mdtest: &[ScaleRow]) {
        self.print_rows(
            "private directories (two per thread: renames across go between them)",
            &by_phase(rows, Layout::Private, &PHASES),
            true,
        );
        self.print_rows(
            "one shared directory (and a second one as the target of renames across; every thread lists the whole directory)",
            &by_phase(rows, Layout::Shared, &PHASES),
            false,
        );
        self.print_mdtest(mdtest);
        self.print_rows("mdtest pattern, per phase", &by_phase(mdtest, Layout::Private, &MDTEST_PHASES), true);
    }

    /// Per phase, each file system's rate at the largest thread count and its share of that
    /// file system's best rate.
    fn print_comparison(&self) {
        let max_threads = self.threads.iter().copied().max().unwrap_or(1);
        let mut systems: Vec<(&str, &[ScaleRow], &[ScaleRow])> = vec![("ferrofs", &self.rows, &self.mdtest)];
        systems.extend(self.mounted.iter().map(|m| (m.target.name(), &m.rows[..], &m.mdtest[..])));
        println!(
            "\nside by side: ops/s at {max_threads} threads (share of the file system's best thread count; the target is >= 90%)"
        );
        print!("{:<22}", "phase");
        for (name, ..) in &systems {
            print!(" {name:>20}");
        }
        println!();
        for (group, is_mdtest) in [(&self.rows, false), (&self.mdtest, true)] {
            for (phase, layout) in phases_of(group) {
                print!("{:<22}", format!("{} {phase}", group_name(layout, is_mdtest)));
                for (_, rows, mdtest) in &systems {
                    let of = if is_mdtest { mdtest } else { rows };
                    let cell = oversubscribed(of, phase, layout, max_threads)
                        .map_or("-".to_string(), |(share, last, _)| {
                            format!("{} ({:.0}%)", grouped(last.stats.median as u64), share * 100.0)
                        });
                    print!(" {cell:>20}");
                }
                println!();
            }
        }
    }

    fn print_mdtest(&self, mdtest: &[ScaleRow]) {
        println!(
            "mdtest pattern (seed 001: -F -C -T -r -u -n {}): each thread creates, stats and removes {} files in a directory of its own; the cycle repeats (mdtest's -i) until each phase has handled at least {} files per run",
            self.mdtest_files_per_thread,
            grouped(self.mdtest_files_per_thread as u64),
            grouped(self.files as u64)
        );
        println!("{:>7} {:>10} {:>29} {:>29} {:>29}", "threads", "files", "create ops/s", "stat ops/s", "remove ops/s");
        for t in &self.threads {
            let of: Vec<&ScaleRow> = mdtest.iter().filter(|r| r.threads == *t).collect();
            let cell =
                |phase| of.iter().find(|r| r.stats.phase == phase).map_or(String::new(), |r| rate_cell(&r.stats));
            println!(
                "{:>7} {:>10} {:>29} {:>29} {:>29}",
                t,
                grouped((self.mdtest_files_per_thread * t) as u64),
                cell("create"),
                cell("stat"),
                cell("remove")
            );
        }
        println!();
    }
}

impl Figures for ScaleFigures {
    fn print(&self) {
        println!(
            "scale: {} files per run split over the threads{}, threads released together by a start gate (all let through by one wake); create, renames and unlink do each file once and end with sync(); stat, open/close and readdir repeat passes over the files for at least {} ms (each thread one full pass at least), every operation counted; readdir counts entries listed; runs interleave the thread counts (ascending, then descending); wall ms = median time of the phase; scale = median / median at the fewest threads\n",
            grouped(self.files as u64),
            names::order_note(self.shuffled_names),
            self.min_phase_ms
        );
        self.print_tables(&self.rows, &self.mdtest);
        print_targets(&self.targets);
        println!(
            "memory: peak RSS {}, the budget's count at its peak {} (sampled every 10 ms), with a cache budget of {} (the budget covers the caches and the journal; RSS adds allocator slack, code and the threads' stacks)",
            human_bytes(self.peak_rss_bytes),
            human_bytes(self.peak_budget_bytes),
            human_bytes(self.cache_budget_bytes)
        );
        for m in &self.mounted {
            println!(
                "\n{} through system calls (the *at calls on an open directory; sync = syncfs(2)); lock waits are not visible there",
                m.target.name()
            );
            self.print_tables(&m.rows, &m.mdtest);
            print_targets(&m.targets);
        }
        if !self.mounted.is_empty() {
            self.print_comparison();
        }
    }
}

fn print_targets(targets: &[Target]) {
    println!("targets:");
    for t in targets {
        println!("  {} {}: {}", if t.met { "PASS" } else { "MISS" }, t.name, t.detail);
    }
}

/// `layout`'s rows grouped by phase, thread counts ascending within each.
fn by_phase<'a>(rows: &'a [ScaleRow], layout: Layout, phases: &[&str]) -> Vec<&'a ScaleRow> {
    let mut v: Vec<&ScaleRow> = Vec::new();
    for &phase in phases {
        v.extend(rows.iter().filter(|r| r.stats.phase == phase && r.layout == layout));
    }
    v
}
