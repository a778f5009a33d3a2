//! `ferrofs bench scale`: metadata scalability by thread count. For each thread count and
//! layout (each thread in directories of its own, or all threads in one shared directory),
//! threads create their share of N empty files, stat them, open and close them, list the
//! directories, rename each file within its directory, rename it into a second directory,
//! and unlink it. Then seed 001's mdtest pattern (`mdtest -F -C -T -r -u -n N`): each thread
//! creates N files in a directory of its own, stats them and removes them.
//!
//! The mutating phases do each file once and end with sync(). The read-only ones (stat,
//! open/close, readdir) repeat passes over the files for at least `--min-phase-ms`, every
//! operation counted: a single pass lasts milliseconds, and would measure thread release and
//! scheduling more than the engine.
//!
//! Every phase reports ops/s, its wall time, its scaling against one thread, the AG allocation retries it
//! caused, and the lock classes its threads waited on most, each as a share of the phase's
//! thread time (wait total / (threads x wall time)). The lock figures of a phase are the
//! difference of two lockstat snapshots around it, so they cover exactly that phase (the
//! journal's own threads included) and the session's lock table still covers the whole run.
//! Three targets are checked and printed as PASS/MISS lines.
//!
//! With `--targets`, the same phases then run through system calls on mounted file systems
//! (`dirops.rs`), each checked for collapse at the largest thread count, and a last
//! table puts every file system's rate there side by side.

use super::dirops::{DirOps, EngineCounters, Syscalls};
use super::names::{self, NameTable};
use super::phase::{repeat, timed, Deadline, Phase, Share, Timing, STOP_CHECK};
use super::report::PhaseStats;
use super::scale_report::{
    check_targets, with_scaling, LockWait, MountedScale, ScaleFigures, ScaleRow, MDTEST_PHASES, PHASES,
};
use super::session::Session;
use super::targets::{on_each, Env, Size};
use super::{process, scratch, BenchArgs, Layout};
use crate::failure::{CliResult, Failure};
use crate::progress;
use ferrofs_lockstat as lockstat;
use indicatif::ProgressBar;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Lock classes reported per phase.
const TOP_LOCKS: usize = 5;
/// One phase of one run: its time and what it did to the counters.
struct Sample {
    timing: Timing,
    ops: u64,
    counters: EngineCounters,
    /// Per class: (acquisitions, contentions, wait ns) during the phase.
    locks: HashMap<&'static str, [u64; 3]>,
}

impl Sample {
    /// Add `other`, a later iteration of the same phase.
    fn add(&mut self, other: Sample) {
        self.timing.wall += other.timing.wall;
        self.timing.cpu += other.timing.cpu;
        self.ops += other.ops;
        self.counters = self.counters + other.counters;
        add_waits(&mut self.locks, &other.locks);
    }
}

/// Add `other`'s per-class (acquisitions, contentions, wait ns) to `sum`.
fn add_waits(sum: &mut HashMap<&'static str, [u64; 3]>, other: &HashMap<&'static str, [u64; 3]>) {
    for (&class, v) in other {
        let e = sum.entry(class).or_default();
        for (x, y) in e.iter_mut().zip(v) {
            *x += y;
        }
    }
}

pub fn run(args: &BenchArgs) -> CliResult<()> {
    let files = args.files_or(100_000);
    let per_thread = args.mdtest_files as usize;
    let threads = args.threads_or(&[1, 2, 4, 8, 16, 48])?;
    let max_threads = threads.iter().copied().max().unwrap_or(1);
    let live = files.max(per_thread * max_threads);
    let names = names::table(files.max(per_thread), args.shuffle);
    let session = Session::open(args, (live + 4 * max_threads) as u64, scratch::mkfs_options(max_threads))?;
    let plan = Plan {
        files,
        per_thread,
        threads: &threads,
        runs: args.runs,
        min: Duration::from_millis(args.min_phase_ms),
        names: &names,
    };
    let budget = session.fs.cache_budget();
    let (measured, peak_budget_bytes) = sample_peak(|| budget.used(), || plan.measure(&session.fs));
    let (rows, mdtest) = measured?;
    let peak_rss_bytes = process::peak_rss_bytes();
    let cache_budget_bytes = budget.limit();
    let targets = check_targets(&rows, &mdtest, max_threads, true);
    let mounted = mounted(args, &plan, live)?;
    session.finish(
        "scale",
        args,
        ScaleFigures {
            files,
            mdtest_files_per_thread: per_thread,
            min_phase_ms: args.min_phase_ms,
            shuffled_names: args.shuffle,
            threads,
            rows,
            mdtest,
            targets,
            mounted,
            peak_rss_bytes,
            peak_budget_bytes,
            cache_budget_bytes,
        },
    )
}

/// What every file system measured in one invocation runs.
struct Plan<'a> {
    files: usize,
    per_thread: usize,
    threads: &'a [usize],
    runs: u64,
    /// Minimum wall time of a read-only phase.
    min: Duration,
    names: &'a NameTable,
}

impl Plan<'_> {
    /// The main phases in both layouts, then the mdtest pattern, on `ops`: (main rows, mdtest rows).
    fn measure<O: DirOps + ?Sized>(&self, ops: &O) -> CliResult<(Vec<ScaleRow>, Vec<ScaleRow>)> {
        let bar = progress::counter(true, 0, "");
        let bench = Scale { ops, names: self.names, bar: &bar, min: self.min };
        let threads = self.threads;
        let mut rows = Vec::new();
        for layout in [Layout::Private, Layout::Shared] {
            let runs = interleaved(threads, self.runs, |t, r| {
                bench.main_run(layout, t, self.files, &run_label(layout.name(), t, r, self.runs))
            })?;
            let group = threads.iter().zip(&runs);
            rows.extend(with_scaling(group.flat_map(|(&t, runs)| rows_of(layout, t, &PHASES, runs)).collect()));
        }
        let runs = interleaved(threads, self.runs, |t, r| {
            bench.mdtest_run(t, self.per_thread, self.files, &run_label("mdtest", t, r, self.runs))
        })?;
        let mdtest = with_scaling(
            threads
                .iter()
                .zip(&runs)
                .flat_map(|(&t, runs)| rows_of(Layout::Private, t, &MDTEST_PHASES, runs))
                .collect(),
        );
        bar.finish_and_clear();
        Ok((rows, mdtest))
    }
}

/// The same phases through system calls on each `--targets` file system, mounted afresh
/// (none by default).
fn mounted(args: &BenchArgs, plan: &Plan, live: usize) -> CliResult<Vec<MountedScale>> {
    let f = &args.fsmark;
    if f.targets.is_empty() {
        return Ok(Vec::new());
    }
    let env = Env::new(f)?;
    let max_threads = plan.threads.iter().copied().max().unwrap_or(1);
    let size = Size { files: live as u64, dirs: 2 * max_threads as u64 + 2, threads: max_threads, data_bytes: 0 };
    // The directories and the root are closed (the file system dropped) before unmounting.
    let measured =
        on_each(&f.targets, &env, &size, "scale", |root| Syscalls::open(root).and_then(|fs| plan.measure(&fs)))?;
    Ok(measured
        .into_iter()
        .map(|(target, (rows, mdtest))| MountedScale {
            targets: check_targets(&rows, &mdtest, max_threads, false),
            target,
            rows,
            mdtest,
        })
        .collect())
}

/// `runs` runs of `run` at every thread count, one pass over the thread counts per run,
/// ascending on even passes and descending on odd ones: every thread count meets the image
/// and the machine at each age, so drift over the benchmark (an image aged by earlier runs,
/// other load) does not favour the counts measured first. Samples per thread count.
fn interleaved<S>(
    threads: &[usize],
    runs: u64,
    mut run: impl FnMut(usize, u64) -> CliResult<S>,
) -> CliResult<Vec<Vec<S>>> {
    let mut samples: Vec<Vec<S>> = threads.iter().map(|_| Vec::new()).collect();
    for r in 0..runs {
        let order: Vec<usize> =
            if r % 2 == 0 { (0..threads.len()).collect() } else { (0..threads.len()).rev().collect() };
        for i in order {
            samples[i].push(run(threads[i], r)?);
        }
    }
    Ok(samples)
}

fn run_label(what: &str, t: usize, run: u64, runs: u64) -> String {
    format!("{what} {t}t run {}/{runs}", run + 1)
}

struct Scale<'a, O: ?Sized> {
    ops: &'a O,
    names: &'a NameTable,
    bar: &'a ProgressBar,
    /// Minimum wall time of a read-only phase.
    min: Duration,
}

impl<O: DirOps + ?Sized> Scale<'_, O> {
    /// One run of every main phase; returns one sample per phase, in `PHASES` order.
    fn main_run(&self, layout: Layout, threads: usize, files: usize, label: &str) -> CliResult<Vec<Sample>> {
        let fs = self.ops;
        // Two directories per thread (private) or two in all (shared): `a` for every phase,
        // `b` as the target of the cross-directory rename.
        let count = if layout == Layout::Private { threads } else { 1 };
        let a = self.make_dirs(&format!("{label} a"), count)?;
        let b = self.make_dirs(&format!("{label} b"), count)?;
        let other: HashMap<u64, u64> = a.iter().copied().zip(b.iter().copied()).collect();
        let other = |d: u64| other[&d];
        let shares: Vec<Share> =
            (0..threads).map(|t| Share { dir: a[t % count], names: names::share(files, threads, t) }).collect();
        let sync = || fs.sync();
        // The mutating phases do each file once.
        let once = |t: Timing| (t, files as u64);
        let mut samples = Vec::with_capacity(PHASES.len());
        samples.push(measured(fs, || {
            self.phase(label, "create", files, |d, n| fs.create(d, n)).run(&shares, sync).map(once)
        })?);
        samples
            .push(measured(fs, || self.phase(label, "stat", files, |d, n| fs.stat(d, n)).run_for(&shares, self.min))?);
        samples.push(measured(fs, || {
            self.phase(label, "open/close", files, |d, n| fs.open_close(d, n)).run_for(&shares, self.min)
        })?);
        // Every thread lists its whole directory: in the shared layout, all of it.
        let per_listing = if layout == Layout::Private { None } else { Some(files) };
        samples.push(measured(fs, || self.readdir(label, &shares, per_listing))?);
        samples.push(measured(fs, || {
            self.phase(label, "rename in dir", files, |d, n| fs.rename(d, n, d, renamed(n).as_slice()))
                .run(&shares, sync)
                .map(once)
        })?);
        samples.push(measured(fs, || {
            self.phase(label, "rename across", files, |d, n| {
                let r = renamed(n);
                fs.rename(d, r.as_slice(), other(d), r.as_slice())
            })
            .run(&shares, sync)
            .map(once)
        })?);
        samples.push(measured(fs, || {
            self.phase(label, "unlink", files, |d, n| fs.unlink(other(d), renamed(n).as_slice()))
                .run(&shares, sync)
                .map(once)
        })?);
        self.remove_dirs(&format!("{label} a"), &a)?;
        self.remove_dirs(&format!("{label} b"), &b)?;
        Ok(samples)
    }

    /// Seed 001's mdtest pattern, repeated as mdtest's `-i` does until each phase has
    /// handled at least `files` files (the main phases' count; once at least): one sample
    /// per phase, the sum of its iterations. A single cycle of a few threads lasted 3-7 ms:
    /// it measured thread release and left out the journal's background work, which a
    /// longer phase pays for (removes of 4 threads ran at 1.17-1.29M/s in 6-7 ms phases,
    /// of 48 threads at 1.01-1.11M/s in 90 ms).
    fn mdtest_run(&self, threads: usize, per_thread: usize, files: usize, label: &str) -> CliResult<Vec<Sample>> {
        let iterations = files.div_ceil(per_thread * threads).max(1);
        // The read-only phase's minimum time is spread over the iterations.
        let min = self.min / iterations as u32;
        let mut sums = self.mdtest_cycle(threads, per_thread, min, label)?;
        for i in 1..iterations {
            let one = self.mdtest_cycle(threads, per_thread, min, &format!("{label} iteration {}", i + 1))?;
            for (sum, s) in sums.iter_mut().zip(one) {
                sum.add(s);
            }
        }
        Ok(sums)
    }

    /// One cycle of the mdtest pattern: each thread creates `per_thread` files in a directory
    /// of its own (a new one each cycle), stats them for at least `min`, removes them.
    fn mdtest_cycle(&self, threads: usize, per_thread: usize, min: Duration, label: &str) -> CliResult<Vec<Sample>> {
        let fs = self.ops;
        let dirs = self.make_dirs(label, threads)?;
        let shares: Vec<Share> = dirs.iter().map(|&dir| Share { dir, names: 0..per_thread }).collect();
        let total = per_thread * threads;
        let once = |t: Timing| (t, total as u64);
        let samples = vec![
            measured(fs, || {
                self.phase(label, "create", total, |d, n| fs.create(d, n)).run(&shares, || fs.sync()).map(once)
            })?,
            measured(fs, || self.phase(label, "stat", total, |d, n| fs.stat(d, n)).run_for(&shares, min))?,
            measured(fs, || {
                self.phase(label, "remove", total, |d, n| fs.unlink(d, n)).run(&shares, || fs.sync()).map(once)
            })?,
        ];
        self.remove_dirs(label, &dirs)?;
        Ok(samples)
    }

    /// Each thread lists its share's directory again and again for at least the minimum
    /// phase time (see `phase::repeat`); returns the entries listed in all ("." and ".." not
    /// counted). A full listing must return the thread's share of names, or all `shared`
    /// names when the threads share the directory.
    fn readdir(&self, label: &str, shares: &[Share], shared: Option<usize>) -> CliResult<(Timing, u64)> {
        let pass = shares.iter().map(|s| shared.unwrap_or(s.names.len())).sum();
        self.point_bar(label, "readdir", pass);
        let deadline = Deadline::new(self.min);
        let listed = AtomicU64::new(0);
        let timing = timed(
            "readdir",
            shares.len(),
            |t| {
                let share = &shares[t];
                let expect = shared.unwrap_or(share.names.len()) as u64;
                let n = repeat(&deadline, |until| {
                    let (n, whole) = self.list(share.dir, until)?;
                    if whole && n != expect {
                        return Err(Failure::new(
                            "readdir",
                            format!("directory inode {} listed {n} entries, expected {expect}", share.dir),
                        ));
                    }
                    Ok(n)
                })?;
                listed.fetch_add(n, Relaxed);
                Ok(())
            },
            || Ok(()),
        )?;
        Ok((timing, listed.into_inner()))
    }

    /// One listing of `dir`, cut short at `until` if given: (entries, whether it was whole).
    fn list(&self, dir: u64, until: Option<Instant>) -> CliResult<(u64, bool)> {
        let (mut n, mut whole) = (0u64, true);
        self.ops
            .list(dir, &mut |name| {
                if n % STOP_CHECK as u64 == 0 && until.is_some_and(|u| Instant::now() >= u) {
                    whole = false;
                    return false;
                }
                n += u64::from(name != b"." && name != b"..");
                true
            })
            .map_err(|e| Failure::new(format!("readdir of directory inode {dir}"), e))?;
        self.bar.inc(n);
        Ok((n, whole))
    }

    fn point_bar(&self, label: &str, what: &str, len: usize) {
        self.bar.reset();
        self.bar.set_length(len as u64);
        self.bar.set_message(format!("{label}: {what}"));
    }

    /// Point the progress bar at a phase and bind its operation.
    fn phase<F>(&self, label: &str, what: &'static str, ops: usize, op: F) -> Phase<'_, F>
    where
        F: Fn(u64, &[u8]) -> ferrofs::Result<()> + Sync,
    {
        self.point_bar(label, what, ops);
        Phase { what, names: self.names, bar: self.bar, op }
    }

    fn make_dirs(&self, label: &str, count: usize) -> CliResult<Vec<u64>> {
        (0..count).map(|t| self.ops.mkdir(&super::dir_name(label, t))).collect()
    }

    fn remove_dirs(&self, label: &str, dirs: &[u64]) -> CliResult<()> {
        for (t, &dir) in dirs.iter().enumerate() {
            self.ops.rmdir(&super::dir_name(label, t), dir)?;
        }
        Ok(())
    }
}

/// A file's name after its rename: `f0000123` becomes `r0000123` (no allocation).
struct Renamed {
    bytes: [u8; 32],
    len: usize,
}

impl Renamed {
    fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

fn renamed(name: &[u8]) -> Renamed {
    let mut bytes = [0u8; 32];
    bytes[..name.len()].copy_from_slice(name);
    bytes[0] = b'r';
    Renamed { bytes, len: name.len() }
}

/// Run one phase (it returns its time and the operations it did) and take what it did to
/// the lock and allocation counters. The log is written home first, untimed: otherwise the
/// journal's threads would write the previous phase's changes home during this one, at a
/// point that varies from run to run.
fn measured<O: DirOps + ?Sized>(fs: &O, phase: impl FnOnce() -> CliResult<(Timing, u64)>) -> CliResult<Sample> {
    fs.settle()?;
    let waits = || if fs.shows_locks() { lock_waits() } else { HashMap::new() };
    let (locks, counters) = (waits(), fs.counters());
    let (timing, ops) = phase()?;
    let mut after = waits();
    for (class, before) in locks {
        if let Some(a) = after.get_mut(class) {
            for (x, b) in a.iter_mut().zip(before) {
                *x = x.saturating_sub(b);
            }
        }
    }
    Ok(Sample { timing, ops, counters: fs.counters() - counters, locks: after })
}

fn lock_waits() -> HashMap<&'static str, [u64; 3]> {
    let mut m = HashMap::new();
    for c in lockstat::snapshot() {
        let s = c.total.combined();
        let e: &mut [u64; 3] = m.entry(c.name).or_default();
        e[0] += s.acquisitions;
        e[1] += s.contentions;
        e[2] += s.wait_total_ns;
    }
    m
}

/// Rows of one layout and thread count: `runs[r][p]` is phase `p` of run `r`.
fn rows_of(layout: Layout, threads: usize, phases: &[&'static str], runs: &[Vec<Sample>]) -> Vec<ScaleRow> {
    phases
        .iter()
        .enumerate()
        .map(|(p, &phase)| {
            let samples: Vec<&Sample> = runs.iter().map(|r| &r[p]).collect();
            let thread_ns: f64 = samples.iter().map(|s| s.timing.wall.as_nanos() as f64 * threads as f64).sum();
            let mut sums = HashMap::new();
            for s in &samples {
                add_waits(&mut sums, &s.locks);
            }
            let mut locks: Vec<LockWait> = sums
                .into_iter()
                .filter(|(_, [acquisitions, ..])| *acquisitions > 0)
                .map(|(class, [acquisitions, contentions, wait])| LockWait {
                    class,
                    acquisitions,
                    contentions,
                    wait_total_ns: wait,
                    wait_share: wait as f64 / thread_ns.max(1.0),
                })
                .collect();
            locks.sort_by_key(|l| std::cmp::Reverse((l.wait_total_ns, l.contentions, l.acquisitions)));
            locks.truncate(TOP_LOCKS);
            ScaleRow {
                layout,
                threads,
                ops: samples.iter().map(|s| s.ops).collect(),
                wall_seconds: samples.iter().map(|s| s.timing.wall.as_secs_f64()).collect(),
                stats: PhaseStats::counted(phase, &samples.iter().map(|s| (s.ops, s.timing)).collect::<Vec<_>>()),
                scaling: 1.0,
                scaling_base_threads: threads,
                ag_alloc_retries: samples.iter().map(|s| s.counters.alloc_retries).sum(),
                throttle_wait_share: samples.iter().map(|s| s.counters.throttle_wait_ns as f64).sum::<f64>()
                    / thread_ns.max(1.0),
                locks,
            }
        })
        .collect()
}

/// Run `work`, sampling `gauge` every 10 ms meanwhile; its result and the largest sample.
fn sample_peak<T>(gauge: impl Fn() -> u64 + Sync, work: impl FnOnce() -> T) -> (T, u64) {
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let sampler = s.spawn(|| {
            let mut peak = gauge();
            while !done.load(Relaxed) {
                std::thread::sleep(Duration::from_millis(10));
                peak = peak.max(gauge());
            }
            peak
        });
        let out = work();
        done.store(true, Relaxed);
        (out, sampler.join().expect("the budget sampler does not panic"))
    })
}
