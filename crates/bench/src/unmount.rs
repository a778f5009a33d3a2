//! `ferrofs bench unmount`: seed 004. The unmount of a small file system B must not grow with
//! the inodes another file system A of the same process has cached: each mount walks only
//! its own caches. B's unmount is timed run by run (mount B, touch each of its files, unmount)
//! first with no A, then again while A holds N cached inodes; the report gives both and
//! their ratio. A's cache budget is sized so that it keeps all N: the default budget
//! (256 MiB) would hold about two thirds of a million.

use super::phase::{Phase, Share};
use super::report::{Figures, Spread};
use super::session::Session;
use super::{names, scratch, BenchArgs, CRED, DIR_MODE, FILE_MODE};
use crate::failure::{CliResult, Context, Failure};
use crate::progress;
use crate::units::grouped;
use ferrofs::{CacheBudget, BLOCK_CACHE_BYTES, DEFAULT_CACHE_BYTES, INODE_CACHE_BYTES, ROOT_INO};
use ferrofs::{FileSystem, MountOptions, SetAttr, TimeOrNow};
use names::NameTable;
use serde::Serialize;
use std::time::Instant;

/// The target: B's unmount with A present takes at most this many times as long as without.
const TARGET_RATIO: f64 = 1.2;
/// Threads that create A's files (each in a directory of its own).
const BUILD_THREADS: usize = 2;

#[derive(Serialize)]
pub struct UnmountFigures {
    /// Files created in A, and the inodes A had cached while B was unmounted (A's inode
    /// cache size: the files, their directories and the root).
    pub a_files: usize,
    pub a_cached_inodes: u64,
    pub a_cache_budget_bytes: u64,
    pub a_build_seconds: f64,
    /// Files in B, and the inodes B had cached at each unmount.
    pub b_files: usize,
    pub b_cached_inodes: u64,
    pub seconds_without_a: Spread,
    pub seconds_with_a: Spread,
    /// Median with A over median without.
    pub ratio: f64,
    pub target_ratio: f64,
    pub met: bool,
}

pub fn run(args: &BenchArgs) -> CliResult<()> {
    let (a_files, b_files) = (args.files_or(1_000_000), args.small_files as usize);
    let (session, figures) = measure(args, a_files, b_files, args.runs)?;
    session.finish("unmount", args, figures)
}

/// B's unmount `runs` times without A, then `runs` times while A holds `a_files` cached
/// inodes; returns A's session (still mounted, for its counters) and the figures.
pub(super) fn measure(
    args: &BenchArgs,
    a_files: usize,
    b_files: usize,
    runs: u64,
) -> CliResult<(Session, UnmountFigures)> {
    // Seed 004's case is the shared daemon's, so the process allocates as the daemon does (in
    // `bench seeds`, arenas that earlier workloads made stay). Uncapped, B's journal threads
    // (new at every mount) were handed the malloc arenas of A's exited build threads, and
    // their exit took 1.7-3.3 ms there in B's first cycles, against 0.1 ms.
    crate::daemon::cap_malloc_arenas();
    let names = NameTable::new(a_files.max(b_files));
    let b = Small::make(args, &names, b_files)?;
    let mut b_cached = 0;
    let without: Vec<f64> = (0..runs).map(|_| b.cycle(&names, &mut b_cached)).collect::<CliResult<_>>()?;
    let a_cache_budget_bytes = a_budget(a_files);
    let session = Session::open_with(
        args,
        a_files as u64 + 16,
        scratch::mkfs_options(BUILD_THREADS),
        &MountOptions { cache: Some(CacheBudget::new(a_cache_budget_bytes)), ..MountOptions::default() },
    )?;
    let started = Instant::now();
    build(&session.fs, &names, a_files)?;
    let a_build_seconds = started.elapsed().as_secs_f64();
    // A holds its inodes idle: its log written home, so its background writeback does not
    // run during B's measurements.
    session.fs.write_home().context(|| "write A's log home".to_string())?;
    let a_cached_inodes = session.fs.stats().cache_usage.inodes;
    let with: Vec<f64> = (0..runs).map(|_| b.cycle(&names, &mut b_cached)).collect::<CliResult<_>>()?;
    let (without, with) = (Spread::of(&without), Spread::of(&with));
    let ratio = with.median / without.median.max(1e-12);
    Ok((
        session,
        UnmountFigures {
            a_files,
            a_cached_inodes,
            a_cache_budget_bytes,
            a_build_seconds,
            b_files,
            b_cached_inodes: b_cached,
            seconds_without_a: without,
            seconds_with_a: with,
            ratio,
            target_ratio: TARGET_RATIO,
            met: ratio <= TARGET_RATIO,
        },
    ))
}

/// A's cache budget: room for each file's inode and a whole metadata block per file besides
/// (far more than its share of directory, inode-table and bitmap blocks), so that A keeps
/// every inode cached. A budget is a limit, not an allocation: A uses what it caches.
fn a_budget(files: usize) -> u64 {
    DEFAULT_CACHE_BYTES.max(files as u64 * (INODE_CACHE_BYTES + BLOCK_CACHE_BYTES))
}

/// File system A: `files` empty files over `BUILD_THREADS` directories, all left cached
/// (created inodes stay in the cache; each is then statted, so every one is looked up too).
fn build(fs: &FileSystem, names: &NameTable, files: usize) -> CliResult<()> {
    let shares: Vec<Share> = (0..BUILD_THREADS)
        .map(|t| {
            let name = format!("a.{t}");
            let dir = fs.mkdir(ROOT_INO, name.as_bytes(), DIR_MODE, CRED).context(|| format!("mkdir {name}"))?.ino;
            Ok(Share { dir, names: names::share(files, BUILD_THREADS, t) })
        })
        .collect::<CliResult<_>>()?;
    let bar = progress::counter(true, files as u64, "file system A: create");
    Phase { what: "create", names, bar: &bar, op: |d: u64, n: &[u8]| fs.create(d, n, FILE_MODE, CRED).map(drop) }
        .run(&shares, || fs.sync())?;
    bar.reset();
    bar.set_message("file system A: stat");
    Phase { what: "stat", names, bar: &bar, op: |d: u64, n: &[u8]| fs.lookup(d, n).map(drop) }
        .run(&shares, || Ok(()))?;
    bar.finish_and_clear();
    Ok(())
}

/// File system B: its image, and the directory inode its files live in.
struct Small {
    image: scratch::Scratch,
    dir: u64,
    files: usize,
}

impl Small {
    fn make(args: &BenchArgs, names: &NameTable, files: usize) -> CliResult<Small> {
        let path = args.image.as_ref().map(|p| p.with_extension("small.img"));
        let image = scratch::create_tagged(
            path.as_deref(),
            args.mem,
            "small",
            scratch::image_size(files as u64 + 16),
            scratch::mkfs_options(1),
        )?;
        let fs = mount(&image)?;
        let dir = fs.mkdir(ROOT_INO, b"b", DIR_MODE, CRED).context(|| "mkdir b".to_string())?.ino;
        for i in 0..files {
            fs.create(dir, names.get(i), FILE_MODE, CRED).context(|| "create a file of B".to_string())?;
        }
        fs.unmount().context(|| "unmount B".to_string())?;
        Ok(Small { image, dir, files })
    }

    /// Mount B, touch every file (lookup and a new mtime: cached and dirty), then time the
    /// unmount. Stores the inodes B had cached in `cached`.
    fn cycle(&self, names: &NameTable, cached: &mut u64) -> CliResult<f64> {
        let fs = mount(&self.image)?;
        let now = SetAttr { mtime: Some(TimeOrNow::Now), ..SetAttr::default() };
        for i in 0..self.files {
            let name = names.get(i);
            let touch = fs.lookup(self.dir, name).and_then(|a| fs.setattr(a.ino, &now));
            touch.map_err(|e| Failure::new(format!("touch {} in B", String::from_utf8_lossy(name)), e))?;
        }
        *cached = fs.stats().cache_usage.inodes;
        let started = Instant::now();
        fs.unmount().context(|| "unmount B".to_string())?;
        Ok(started.elapsed().as_secs_f64())
    }
}

fn mount(image: &scratch::Scratch) -> CliResult<FileSystem> {
    FileSystem::mount_device(image.dev.clone(), &MountOptions::default()).context(|| "mount B".to_string())
}

impl Figures for UnmountFigures {
    fn print(&self) {
        println!(
            "unmount (seed 004): file system B, {} files touched (lookup + mtime; {} inodes cached), mounted and unmounted in the same process as file system A (malloc arenas capped as in the daemon)",
            grouped(self.b_files as u64),
            grouped(self.b_cached_inodes)
        );
        println!(
            "A: {} files created, {} inodes cached (cache budget {} MiB; built in {:.1} s); B's unmount, median [min-max] of {} runs:",
            grouped(self.a_files as u64),
            grouped(self.a_cached_inodes),
            self.a_cache_budget_bytes >> 20,
            self.a_build_seconds,
            self.seconds_with_a.runs.len()
        );
        let ms = |v: f64| format!("{:.3}ms", v * 1e3);
        println!("  without A: {}", self.seconds_without_a.cell(ms));
        println!("  with A:    {}", self.seconds_with_a.cell(ms));
        println!(
            "  {} ratio with/without {:.2} (target <= {:.1})",
            if self.met { "PASS" } else { "MISS" },
            self.ratio,
            self.target_ratio
        );
    }
}
