//! `ferrofs-bench` (also run as `ferrofs bench`): benchmarks of the engine, run in this
//! process on a scratch image, and of ferrofs beside its peers through FUSE and the kernel.
//!
//! The default workload (`embedded`) is the metadata benchmark: for each thread count,
//! threads create, stat and remove their share of N empty files, each in its own directory
//! (and, with --shared-dir, all in one); then one directory grows to a million entries.
//! Reports ops/s, memory per cached inode, journal and lock statistics.
//!
//! The journal workloads (`commit`, `orphan`, `unlinked`, `fsync`) each live in a module of
//! their own and share the image, timing, median and report code here.

mod commit;
mod dirops;
mod fsmark;
mod fsync;
mod names;
mod orphan;
mod phase;
mod plot;
mod process;
mod published;
mod published_baseline;
mod published_report;
mod report;
mod scale;
mod scale_report;
mod scratch;
mod seeds;
mod seeds_probe;
mod seeds_report;
mod seeds_results;
mod session;
mod shell;
mod targets;
mod undo;
mod unlinked;
mod unmount;
mod workloads;
mod workloads_report;
mod workloads_tree;
mod write;

use crate::failure::{CliResult, Context, Failure};
use clap::{Args, Parser, ValueEnum};
use ferrofs::{Cred, FileSystem, ROOT_INO};
use ferrofs_lockstat as lockstat;
use indicatif::ProgressBar;
use names::NameTable;
use phase::{Phase, Share, Timing};
use report::{Cycle, Growth, MemoryReport, PhaseStats, Report};
use serde::Serialize;
use session::Session;
use std::path::PathBuf;
use std::process::ExitCode;

// The command line's shared modules, named as the benchmarks always named them
// (`crate::failure`, `crate::units`, ...).
use ferrofs_cli::{daemon, failure, logging, progress, units};

const CRED: Cred = Cred { uid: 0, gid: 0, umask: 0 };
const FILE_MODE: u16 = 0o644;
const DIR_MODE: u16 = 0o755;

#[derive(Parser, Debug)]
#[command(name = "ferrofs-bench", version, about = "ferrofs benchmarks (also run as `ferrofs bench`)", long_about = None)]
struct Cli {
    #[command(flatten)]
    args: BenchArgs,
}

fn main() -> ExitCode {
    failure::install_panic_report();
    failure::die_quietly_on_closed_pipe();
    let cli = Cli::parse();
    logging::init(None, None);
    match run(&cli.args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("ferrofs: {f}");
            ExitCode::from(1)
        }
    }
}

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// What to measure: `embedded` (default) creates, stats and removes files; `commit`,
    /// `orphan`, `unlinked` and `fsync` measure the journal (see the README).
    #[arg(value_enum, default_value_t = Mode::Embedded)]
    pub mode: Mode,
    /// Put the benchmark image here (a new file; deleted afterwards). Default: a sparse
    /// file in /dev/shm, or the temporary directory if there is no /dev/shm.
    #[arg(long, conflicts_with = "mem")]
    pub image: Option<PathBuf>,
    /// Keep the image in process memory (RSS figures then include the image's pages).
    #[arg(long)]
    pub mem: bool,
    /// embedded and scale: files each run creates, split over the threads (default 100,000).
    /// commit: files per thread (default 16). unlinked: files opened, unlinked and closed
    /// (default 200,000). fsync: files the fsync thread writes and syncs per run and load
    /// (default 2,000). unmount: cached inodes of file system A (default 1,000,000).
    /// fsmark: files per run and thread count (default 40,000). write: 4 KiB writes per
    /// case and run (default 4,000; a quarter of that with fdatasync). published: files of
    /// the image (default 1,000,000).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub files: Option<u64>,
    /// Thread counts to measure, comma-separated. embedded: default 1,2,8,48. commit:
    /// committing threads, default 1,2. orphan: truncating threads, default 1,2,4,10,20,40.
    /// fsync: file-creating threads beside the fsync thread and the checkpoint thread in
    /// the loaded measurement, default 1 (the first value is used). scale: default
    /// 1,2,4,8,16,48. fsmark: fs_mark threads and rm -rf processes, default 1,2,8.
    /// published: reader threads per mount, default 4 (the first value is used).
    #[arg(long, value_delimiter = ',', value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub threads: Vec<u64>,
    /// Also run every thread count with all threads in one shared directory (embedded).
    #[arg(long)]
    pub shared_dir: bool,
    /// embedded and scale: take the names in a random order rather than in sequence, so
    /// that threads sharing a directory take turns on its leaves (as with hashed names).
    #[arg(long)]
    pub shuffle: bool,
    /// Files in the one-big-directory phase (single thread; embedded); 0 skips it.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(0..=100_000_000))]
    pub big_dir: u64,
    /// scale: the read-only phases (stat, open/close, readdir) repeat passes over their
    /// files until this many milliseconds have passed, each thread at least one full pass;
    /// every operation done is counted.
    #[arg(long, default_value_t = 500, value_parser = clap::value_parser!(u64).range(0..=600_000))]
    pub min_phase_ms: u64,
    /// scale: files each thread creates, stats and removes in the mdtest pattern.
    #[arg(long, default_value_t = 2_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub mdtest_files: u64,
    /// unmount: files in the small file system B (touched and unmounted each run).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub small_files: u64,
    /// commit: commits per thread per run.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub commits: u64,
    /// orphan: rounds per thread (truncate from 4096 down to 1 byte by one byte, then
    /// back to 4096).
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub rounds: u64,
    /// write: the directory on disk (not tmpfs) that holds the images of the on-disk cases.
    /// published: where the image, the server's objects and the caches go.
    #[arg(long, default_value = "/var/tmp")]
    pub disk_dir: PathBuf,
    /// Runs per measurement; the report gives the median and the min-max range.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=100))]
    pub runs: u64,
    /// Also write every figure as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Measure lock hold times too (two clock reads per lock acquisition: slows the
    /// engine a little). Counts, contentions and wait times are always measured.
    #[arg(long)]
    pub lock_timing: bool,
    /// Count lock acquisitions, contentions and wait times (`on`, the default) or count
    /// nothing (`off`: to measure what the counting costs; the lock table is then empty).
    #[arg(long, value_enum, default_value_t = Switch::On)]
    pub lock_counting: Switch,
    #[command(flatten)]
    pub fsmark: targets::FsmarkArgs,
    #[command(flatten)]
    pub seeds: seeds::SeedsArgs,
    #[command(flatten)]
    pub workloads: workloads::WorkloadsArgs,
    #[command(flatten)]
    pub published: published::PublishedArgs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Switch {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// Create, stat and remove many files (the engine inside this process).
    Embedded,
    /// Commit rate of small metadata changes (setattr) into the in-memory CIL.
    Commit,
    /// Truncate-by-one-byte storm (seed 000) with orphan tracking on and off.
    Orphan,
    /// Close many open, unlinked files (each close frees an orphaned inode).
    Unlinked,
    /// fsync latency of small files, idle and under create and checkpoint load.
    Fsync,
    /// Metadata scalability by thread count: create, stat, open/close, readdir, renames,
    /// unlink, in private and shared directories, plus seed 001's mdtest pattern.
    Scale,
    /// Unmount time of a small file system beside one holding a million cached inodes
    /// (seed 004).
    Unmount,
    /// fs_mark creates and parallel rm -rf on ferrofs through FUSE and its peers
    /// (minifuse, fuse2fs, kernel ext4/XFS/btrfs, tmpfs), mounted here (needs root).
    Fsmark,
    /// The five seed experiments (orphan, mdtest, fsmark, dbench, unmount) on every target
    /// and ferrofs embedded; writes a Markdown report with plots (needs root).
    Seeds,
    /// Real work through the mount beside kernel and FUSE peers: tar, cp -a, rm -rf of a
    /// tree, git clone/status/log, dbench, 4 KiB write latency; the FUSE servers' RSS and
    /// CPU per operation (needs root).
    Workloads,
    /// 4 KiB write latency, appending against overwriting, with and without fdatasync, the
    /// image in /dev/shm and on disk (the engine; through FUSE too with --targets ferrofs).
    Write,
    /// A published image read from 4 read-only mounts (cold and warm chunk caches, GETs
    /// delayed or not) beside the image on local disk and s3backer + squashfuse on the
    /// same S3 server (needs root).
    Published,
}

impl BenchArgs {
    /// `--threads`, or the workload's default. A count given twice is refused: results are
    /// kept per thread count, and `--runs` is how a measurement is repeated (runs interleave
    /// the thread counts against drift).
    fn threads_or(&self, default: &[usize]) -> CliResult<Vec<usize>> {
        if let Some((i, t)) = self.threads.iter().enumerate().find(|&(i, t)| self.threads[..i].contains(t)) {
            return Err(Failure::new(
                "--threads",
                format!("{t} is listed twice (entry {}); repeat a measurement with --runs", i + 1),
            ));
        }
        Ok(if self.threads.is_empty() { default.to_vec() } else { self.threads.iter().map(|&t| t as usize).collect() })
    }

    /// `--files`, or the workload's default.
    fn files_or(&self, default: u64) -> usize {
        self.files.unwrap_or(default) as usize
    }
}

/// Where a run's threads put their files.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Each thread in a directory of its own.
    Private,
    /// All threads in one directory.
    Shared,
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Private => "private",
            Layout::Shared => "shared",
        }
    }
}

/// Times of one create/stat/remove run, and the memory its create phase added.
struct RunTimes {
    create: Timing,
    stat: Timing,
    remove: Timing,
    growth: Growth,
}

/// The mounted benchmark file system and what every run needs.
struct Bench<'a> {
    fs: &'a FileSystem,
    names: &'a NameTable,
    bar: &'a ProgressBar,
}

pub fn run(args: &BenchArgs) -> CliResult<()> {
    // Every workload: an embedded one's scratch image in /dev/shm is memory until deleted.
    shell::catch_interrupts()?;
    lockstat::set_timing(args.lock_timing);
    lockstat::set_counting(args.lock_counting == Switch::On);
    match args.mode {
        Mode::Embedded => {
            let report = measure(args)?;
            report.print();
            write_json(args, &report)
        }
        Mode::Commit => commit::run(args),
        Mode::Orphan => orphan::run(args),
        Mode::Unlinked => unlinked::run(args),
        Mode::Fsync => fsync::run(args),
        Mode::Scale => scale::run(args),
        Mode::Unmount => unmount::run(args),
        Mode::Fsmark => fsmark::run(args),
        Mode::Seeds => seeds::run(args),
        Mode::Workloads => workloads::run_all(args),
        Mode::Write => write::run(args),
        Mode::Published => published::run(args),
    }
}

/// Make the image, run every phase, unmount; the image is gone when this returns.
fn measure(args: &BenchArgs) -> CliResult<Report> {
    let (files, big_dir, runs) = (args.files_or(100_000), args.big_dir as usize, args.runs as usize);
    let threads = args.threads_or(&[1, 2, 8, 48])?;
    let max_threads = threads.iter().copied().max().unwrap_or(1);
    let names = names::table(files.max(big_dir), args.shuffle);
    let session = Session::open(args, (names.len() + 2 * max_threads) as u64, scratch::mkfs_options(max_threads))?;
    let bar = progress::counter(true, 0, "");
    let bench = Bench { fs: &session.fs, names: &names, bar: &bar };
    let mut cycles = Vec::new();
    for layout in layouts(args.shared_dir) {
        for &t in &threads {
            cycles.push(bench.cycle(&format!("{} {t}t", layout.name()), layout, t, files, runs)?);
        }
    }
    let big = if big_dir > 0 { Some(bench.cycle("one directory", Layout::Shared, 1, big_dir, 1)?) } else { None };
    bar.finish_and_clear();
    gather(session, args, files, cycles, big)
}

fn layouts(shared_dir: bool) -> Vec<Layout> {
    if shared_dir {
        vec![Layout::Private, Layout::Shared]
    } else {
        vec![Layout::Private]
    }
}

/// Collect the counters, then unmount (timed: the final checkpoint and write-back).
fn gather(
    session: Session,
    args: &BenchArgs,
    files: usize,
    cycles: Vec<Cycle>,
    big_dir: Option<Cycle>,
) -> CliResult<Report> {
    // The first create run is the only one on a heap that never held inodes: later runs
    // reuse memory their predecessors freed, which would hide part of the growth.
    let memory = match cycles.first() {
        Some(c) => MemoryReport::new(format!("first create run, {} files", c.files), c.first_growth),
        None => MemoryReport::new("nothing created".to_string(), Growth::default()),
    };
    let end = session.close()?;
    Ok(Report {
        mode: "embedded",
        image: end.image,
        files,
        shuffled_names: args.shuffle,
        runs: args.runs as usize,
        lock_timing: args.lock_timing,
        cycles,
        big_dir,
        memory,
        journal: end.journal,
        ag_alloc_retries: end.ag_alloc_retries,
        unmount_seconds: end.unmount_seconds,
        locks: end.locks,
    })
}

/// Write the report as JSON if --json asked for it.
fn write_json(args: &BenchArgs, report: &impl Serialize) -> CliResult<()> {
    let Some(path) = &args.json else {
        return Ok(());
    };
    let what = || format!("write {}", path.display());
    let text = serde_json::to_string_pretty(report).context(what)?;
    std::fs::write(path, text + "\n").context(what)
}

impl Bench<'_> {
    /// `runs` create/stat/remove runs of `files` files over `threads` threads; `title`
    /// names them on the progress bar and in directory names.
    fn cycle(&self, title: &str, layout: Layout, threads: usize, files: usize, runs: usize) -> CliResult<Cycle> {
        let mut times = Vec::with_capacity(runs);
        for run in 0..runs {
            let label = format!("{title} run {}/{runs}", run + 1);
            times.push(self.one_run(layout, threads, files, &label)?);
        }
        let phase = |name, pick: fn(&RunTimes) -> Timing| {
            PhaseStats::new(name, files, &times.iter().map(pick).collect::<Vec<_>>())
        };
        Ok(Cycle {
            layout,
            threads,
            files,
            phases: vec![phase("create", |r| r.create), phase("stat", |r| r.stat), phase("remove", |r| r.remove)],
            first_growth: times[0].growth,
        })
    }

    fn one_run(&self, layout: Layout, threads: usize, files: usize, label: &str) -> CliResult<RunTimes> {
        let fs = self.fs;
        let dirs = self.make_dirs(layout, threads, label)?;
        let shares: Vec<Share> =
            (0..threads).map(|t| Share { dir: dirs[t % dirs.len()], names: names::share(files, threads, t) }).collect();
        let before = self.memory_sample()?;
        let create = self
            .phase(label, "create", files, |d, n| fs.create(d, n, FILE_MODE, CRED).map(drop))
            .run(&shares, || fs.sync())?;
        let after = self.memory_sample()?;
        let stat = self.phase(label, "stat", files, |d, n| fs.lookup(d, n).map(drop)).run(&shares, || Ok(()))?;
        let remove = self.phase(label, "remove", files, |d, n| fs.unlink(d, n)).run(&shares, || fs.sync())?;
        self.remove_dirs(&dirs, label)?;
        let growth = Growth {
            rss_bytes: after.0.saturating_sub(before.0),
            heap_bytes: after.1.saturating_sub(before.1),
            inodes: after.2.saturating_sub(before.2),
        };
        Ok(RunTimes { create, stat, remove, growth })
    }

    /// Point the progress bar at a phase and bind its operation.
    fn phase<F>(&self, label: &str, what: &'static str, files: usize, op: F) -> Phase<'_, F>
    where
        F: Fn(u64, &[u8]) -> ferrofs::Result<()> + Sync,
    {
        self.bar.reset();
        self.bar.set_length(files as u64);
        self.bar.set_message(format!("{label}: {what}"));
        Phase { what, names: self.names, bar: self.bar, op }
    }

    /// (RSS bytes, heap bytes, cached inodes), once the log is written home (its buffers are bounded by
    /// the log size, not by the cache) and freed heap is handed back, so growth is the
    /// caches' own memory.
    fn memory_sample(&self) -> CliResult<(u64, u64, u64)> {
        self.fs.write_home().context(|| "write the log home".into())?;
        process::release_free_heap();
        Ok((process::rss_bytes(), process::heap().in_use, self.fs.stats().cache_usage.inodes))
    }

    fn make_dirs(&self, layout: Layout, threads: usize, label: &str) -> CliResult<Vec<u64>> {
        let count = if layout == Layout::Private { threads } else { 1 };
        (0..count)
            .map(|t| {
                let name = dir_name(label, t);
                self.fs
                    .mkdir(ROOT_INO, name.as_bytes(), DIR_MODE, CRED)
                    .map(|a| a.ino)
                    .context(|| format!("mkdir {name}"))
            })
            .collect()
    }

    fn remove_dirs(&self, dirs: &[u64], label: &str) -> CliResult<()> {
        for t in 0..dirs.len() {
            let name = dir_name(label, t);
            self.fs.rmdir(ROOT_INO, name.as_bytes()).context(|| format!("rmdir {name}"))?;
        }
        Ok(())
    }
}

fn dir_name(label: &str, t: usize) -> String {
    format!("{}.{t}", label.replace([' ', '/'], "-"))
}
