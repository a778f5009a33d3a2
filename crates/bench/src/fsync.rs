//! `ferrofs bench fsync`: latency of fsync on small files. One thread creates a file,
//! writes 4 KiB and fsyncs it, again and again; only the fsync is timed. Each run measures
//! it twice: alone, then while other threads create (and remove) files as fast as they can
//! and one more thread writes checkpoints back to back. Reports p50/p99/max per setting and
//! how each fsync was satisfied: by a checkpoint it wrote, by a concurrent checkpoint it
//! waited for (group commit), or because its change was already durable. With `--targets`,
//! the same workload runs through system calls on mounted file systems too (kernel ext4,
//! XFS, btrfs, tmpfs, ferrofs through FUSE ...), their checkpoints being syncfs(2) (on a FUSE
//! mount, which syncfs does not reach, a file's mode changed and fsynced), so the engine's
//! figures stand next to the kernel's on the same machine. Every run starts settled: the
//! engine's log written home, a mount checkpointed.

use super::dirops::{on_fuse, syncfs};
use super::names::NameTable;
use super::process;
use super::report::{quantile, Figures, Spread};
use super::session::Session;
use super::targets::{on_each, Env, Kind, Size};
use super::{scratch, BenchArgs, CRED, DIR_MODE, FILE_MODE};
use crate::failure::{CliResult, Context, Failure};
use crate::units::grouped;
use ferrofs::FileSystem;
use ferrofs::{BLOCK_SIZE, ROOT_INO};
use serde::Serialize;
use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Instant;

/// The checkpoint thread's pause between checkpoints (at least: a loaded machine wakes it later),
/// without a spinning thread taking a CPU from the two this machine may have.
const CHECKPOINT_PAUSE: std::time::Duration = std::time::Duration::from_micros(100);

/// A loading thread removes its files after creating this many (keeps the image small).
const LOAD_BATCH: usize = 1000;

#[derive(Serialize)]
pub struct FsyncFigures {
    pub fsyncs_per_run: usize,
    pub load_creators: usize,
    /// The engine in this process.
    #[serde(flatten)]
    pub engine: Comparison,
    /// The same workload on mounted file systems (`--targets`).
    pub mounted: Vec<MountedFigures>,
}

#[derive(Serialize)]
pub struct MountedFigures {
    pub target: Kind,
    #[serde(flatten)]
    pub figures: Comparison,
}

/// One file system, idle against loaded.
#[derive(Serialize)]
pub struct Comparison {
    pub unloaded: Latency,
    pub loaded: Latency,
    /// Median loaded p99 over median unloaded p99.
    pub p99_ratio: f64,
    /// The same ratio of the p99s of latency minus the fsync thread's run-queue wait: what
    /// the load added beyond the thread waiting for a CPU (the load keeps both CPUs of a
    /// 2-CPU machine busy).
    pub p99_ratio_without_run_queue: f64,
}

/// One setting over all runs; latencies in microseconds.
#[derive(Serialize)]
pub struct Latency {
    pub p50_us: Spread,
    pub p99_us: Spread,
    pub max_us: Spread,
    pub mean_us: Spread,
    /// The slowest 1% of each run's fsyncs: their mean latency, and the part of it the
    /// thread spent runnable but waiting for a CPU (scheduler run queue, not the engine).
    pub slowest_1pct_mean_us: Spread,
    pub slowest_1pct_run_queue_us: Spread,
    /// p99 of each fsync's latency minus its run-queue wait: what the engine (its I/O and
    /// lock waits) cost, without the scheduler.
    pub p99_without_run_queue_us: Spread,
    /// How the fsyncs were satisfied (all runs; the engine only): wrote a checkpoint of the
    /// whole CIL...
    pub wrote_checkpoint: u64,
    /// ...waited for a concurrent checkpoint that covered it (group commit)...
    pub joined_checkpoint: u64,
    /// ...or found its change already durable (no log write).
    pub already_durable: u64,
    /// Files the loading threads created, and checkpoints the checkpoint thread wrote.
    pub load_creates: u64,
    pub load_checkpoints: u64,
}

/// One run of one setting.
#[derive(Default)]
struct RunResult {
    /// Sorted fsync latencies, microseconds.
    latencies: Vec<f64>,
    /// Mean latency and mean run-queue wait of the slowest 1%, microseconds.
    slowest: (f64, f64),
    /// Sorted latencies minus their run-queue waits.
    without_run_queue: Vec<f64>,
    counts: [u64; 3],
    load_creates: u64,
    load_checkpoints: u64,
}

pub fn run(args: &BenchArgs) -> CliResult<()> {
    let files = args.files_or(2000);
    let creators = args.threads_or(&[1])?[0];
    let session = Session::open(args, (files + creators * LOAD_BATCH) as u64 * 2, scratch::mkfs_options(creators + 1))?;
    let names = NameTable::new(files.max(LOAD_BATCH));
    let engine = compare(&Engine(&session.fs), &names, files, creators, args.runs)?;
    let mounted = mounted(args, &names, files, creators)?;
    let figures = FsyncFigures { fsyncs_per_run: files, load_creators: creators, engine, mounted };
    session.finish("fsync", args, figures)
}

/// `runs` runs of each setting on `fs`.
fn compare<T: Target>(fs: &T, names: &NameTable, files: usize, creators: usize, runs: u64) -> CliResult<Comparison> {
    let (mut unloaded, mut loaded) = (Vec::new(), Vec::new());
    for run in 0..runs {
        unloaded.push(one_run(fs, names, files, 0, run)?);
        loaded.push(one_run(fs, names, files, creators, run)?);
    }
    let (unloaded, loaded) = (Latency::of(&unloaded), Latency::of(&loaded));
    Ok(Comparison {
        p99_ratio: loaded.p99_us.median / unloaded.p99_us.median,
        p99_ratio_without_run_queue: loaded.p99_without_run_queue_us.median / unloaded.p99_without_run_queue_us.median,
        unloaded,
        loaded,
    })
}

/// The workload on each `--targets` file system, mounted afresh (none by default).
fn mounted(args: &BenchArgs, names: &NameTable, files: usize, creators: usize) -> CliResult<Vec<MountedFigures>> {
    let f = &args.fsmark;
    if f.targets.is_empty() {
        return Ok(Vec::new());
    }
    let env = Env::new(f)?;
    let size = Size {
        files: (files + creators * LOAD_BATCH) as u64,
        dirs: creators as u64 + 1,
        threads: creators + 1,
        data_bytes: (files * BLOCK_SIZE) as u64,
    };
    let measured = on_each(&f.targets, &env, &size, "fsync", |root| {
        Mounted::open(root).and_then(|fs| compare(&fs, names, files, creators, args.runs))
    })?;
    Ok(measured.into_iter().map(|(target, figures)| MountedFigures { target, figures }).collect())
}

/// What the workload needs of a file system.
trait Target: Sync {
    type Dir: Sync;
    type File;
    fn mkdir(&self, name: &str) -> CliResult<Self::Dir>;
    /// Remove what is left of `names` in `dir` (called `name`), then `dir` itself.
    fn remove_dir(&self, name: &str, dir: &Self::Dir, names: &NameTable) -> CliResult<()>;
    fn create(&self, dir: &Self::Dir, name: &[u8]) -> CliResult<Self::File>;
    fn write(&self, file: &Self::File, data: &[u8]) -> CliResult<()>;
    fn fsync(&self, file: &Self::File) -> CliResult<()>;
    fn unlink(&self, dir: &Self::Dir, name: &[u8]) -> CliResult<()>;
    /// Make everything durable now: a checkpoint of the journal, syncfs(2) on a mount.
    fn checkpoint(&self) -> CliResult<()>;
    /// Before a run, untimed: the engine writes its log home, a mount checkpoints, so that
    /// one run's writeback does not fall into the next run's timed fsyncs.
    fn settle(&self) -> CliResult<()>;
    /// How the fsyncs so far were satisfied (wrote a checkpoint, joined one, already
    /// durable); known of the engine only.
    fn counts(&self) -> [u64; 3];
}

fn failed<E: std::fmt::Display>(what: &str, name: &[u8]) -> impl FnOnce(E) -> Failure {
    let what = format!("{what} {}", String::from_utf8_lossy(name));
    move |e| Failure::new(what, e)
}

/// The engine in this process.
struct Engine<'a>(&'a FileSystem);

impl Target for Engine<'_> {
    type Dir = u64;
    type File = u64;

    fn mkdir(&self, name: &str) -> CliResult<u64> {
        let attr = self.0.mkdir(ROOT_INO, name.as_bytes(), DIR_MODE, CRED);
        Ok(attr.context(|| format!("mkdir {name}"))?.ino)
    }

    fn remove_dir(&self, name: &str, &dir: &u64, names: &NameTable) -> CliResult<()> {
        for i in 0..names.len() {
            match self.0.unlink(dir, names.get(i)) {
                Ok(()) | Err(ferrofs::Error::NotFound) => {}
                Err(e) => return Err(Failure::new(format!("unlink in {name}"), e)),
            }
        }
        self.0.rmdir(ROOT_INO, name.as_bytes()).context(|| format!("rmdir {name}"))
    }

    fn create(&self, &dir: &u64, name: &[u8]) -> CliResult<u64> {
        let attr = self.0.create(dir, name, FILE_MODE, CRED).map_err(failed("create", name))?;
        Ok(attr.ino)
    }

    fn write(&self, &ino: &u64, data: &[u8]) -> CliResult<()> {
        let written = self.0.write(ino, 0, data);
        written.map(drop).map_err(|e| Failure::new(format!("write inode {ino}"), e))
    }

    fn fsync(&self, &ino: &u64) -> CliResult<()> {
        self.0.fsync(ino, false).map_err(|e| Failure::new(format!("fsync inode {ino}"), e))
    }

    fn unlink(&self, &dir: &u64, name: &[u8]) -> CliResult<()> {
        self.0.unlink(dir, name).map_err(failed("unlink", name))
    }

    fn checkpoint(&self) -> CliResult<()> {
        self.0.checkpoint().map_err(|e| Failure::new("checkpoint", e))
    }

    fn settle(&self) -> CliResult<()> {
        self.0.write_home().map_err(|e| Failure::new("write the log home", e))
    }

    fn counts(&self) -> [u64; 3] {
        let s = self.0.stats().journal;
        [s.forced_checkpoints, s.forces_joined, s.fsyncs_durable]
    }
}

/// A file system mounted at `root`, through system calls.
struct Mounted<'a> {
    root: &'a Path,
    /// Its root directory, open for syncfs(2).
    handle: File,
    /// On a FUSE mount, a file whose mode a checkpoint changes and fsyncs: syncfs(2) does not
    /// reach a FUSE daemon (the kernel sends FUSE_SYNCFS to virtiofs only), and an fsync forces
    /// everything the daemon's log holds, as a checkpoint does.
    marker: Option<File>,
    /// Which of `MARKER_MODES` the marker has now; only the thread checkpointing flips it.
    marker_mode: AtomicBool,
}

/// The marker's two modes, alternated so that every checkpoint has a change to force.
const MARKER_MODES: [u32; 2] = [0o600, 0o700];

impl Mounted<'_> {
    fn open(root: &Path) -> CliResult<Mounted<'_>> {
        let handle = File::open(root).context(|| format!("open {}", root.display()))?;
        let marker = if on_fuse(&handle).context(|| format!("statfs {}", root.display()))? {
            let path = root.join("fsync.checkpoint");
            let marker = File::create(&path).context(|| format!("create {}", path.display()))?;
            let mode = std::fs::Permissions::from_mode(MARKER_MODES[0]);
            marker.set_permissions(mode).context(|| format!("chmod {}", path.display()))?;
            Some(marker)
        } else {
            None
        };
        Ok(Mounted { root, handle, marker, marker_mode: AtomicBool::new(false) })
    }
}

impl Target for Mounted<'_> {
    type Dir = PathBuf;
    type File = File;

    fn mkdir(&self, name: &str) -> CliResult<PathBuf> {
        let dir = self.root.join(name);
        std::fs::create_dir(&dir).context(|| format!("mkdir {}", dir.display()))?;
        Ok(dir)
    }

    fn remove_dir(&self, _name: &str, dir: &PathBuf, _names: &NameTable) -> CliResult<()> {
        std::fs::remove_dir_all(dir).context(|| format!("rm -r {}", dir.display()))
    }

    fn create(&self, dir: &PathBuf, name: &[u8]) -> CliResult<File> {
        File::create(dir.join(OsStr::from_bytes(name))).map_err(failed("create", name))
    }

    fn write(&self, file: &File, data: &[u8]) -> CliResult<()> {
        file.write_all_at(data, 0).map_err(|e| Failure::new("write", e))
    }

    fn fsync(&self, file: &File) -> CliResult<()> {
        file.sync_all().map_err(|e| Failure::new("fsync", e))
    }

    fn unlink(&self, dir: &PathBuf, name: &[u8]) -> CliResult<()> {
        std::fs::remove_file(dir.join(OsStr::from_bytes(name))).map_err(failed("unlink", name))
    }

    fn checkpoint(&self) -> CliResult<()> {
        let Some(marker) = &self.marker else {
            return syncfs(&self.handle).map_err(|e| Failure::new("syncfs", e));
        };
        let next = !self.marker_mode.fetch_xor(true, Relaxed);
        let toggled = std::fs::Permissions::from_mode(MARKER_MODES[usize::from(next)]);
        marker.set_permissions(toggled).map_err(|e| Failure::new("chmod fsync.checkpoint", e))?;
        marker.sync_all().map_err(|e| Failure::new("fsync fsync.checkpoint", e))
    }

    fn settle(&self) -> CliResult<()> {
        self.checkpoint()
    }

    fn counts(&self) -> [u64; 3] {
        [0; 3]
    }
}

/// `files` fsyncs, with `creators` creating threads and a checkpoint thread if not 0.
fn one_run<T: Target>(fs: &T, names: &NameTable, files: usize, creators: usize, run: u64) -> CliResult<RunResult> {
    let tag = if creators == 0 { "idle" } else { "loaded" };
    let dir_name = |d: usize| format!("fsync.{run}.{tag}.{d}");
    let dirs: Vec<T::Dir> = (0..=creators).map(|d| fs.mkdir(&dir_name(d))).collect::<CliResult<_>>()?;
    fs.settle()?;
    let stop = AtomicBool::new(false);
    let (creates, checkpoints) = (AtomicU64::new(0), AtomicU64::new(0));
    let mut result = std::thread::scope(|s| -> CliResult<RunResult> {
        let (stop, creates) = (&stop, &creates);
        let loaders: Vec<_> =
            dirs[1..].iter().map(|dir| s.spawn(move || create_load(fs, dir, names, stop, creates))).collect();
        let checkpointer = (creators > 0).then(|| {
            s.spawn(|| {
                while !stop.load(Relaxed) {
                    fs.checkpoint()?;
                    checkpoints.fetch_add(1, Relaxed);
                    std::thread::sleep(CHECKPOINT_PAUSE);
                }
                Ok(())
            })
        });
        // The timed fsyncs start once the load runs: a thread spawned on a busy machine may
        // not have created a file yet when a short run of fast fsyncs is over. A load thread
        // that stopped early (an error) ends the wait; its join reports it.
        let load_started = || creates.load(Relaxed) > 0 && checkpoints.load(Relaxed) > 0;
        while creators > 0 && !load_started() && !loaders.iter().chain(&checkpointer).any(|h| h.is_finished()) {
            std::thread::sleep(CHECKPOINT_PAUSE);
        }
        let before = fs.counts();
        let samples = fsync_loop(fs, &dirs[0], names, files);
        let after = fs.counts();
        stop.store(true, Relaxed);
        for h in loaders.into_iter().chain(checkpointer) {
            h.join().map_err(|_| Failure::new("fsync load", "a benchmark thread panicked"))??;
        }
        let mut samples = samples?;
        samples.sort_by(|a, b| a.0.total_cmp(&b.0));
        let tail = &samples[samples.len() - samples.len().div_ceil(100)..];
        let mean = |f: fn(&(f64, f64)) -> f64| tail.iter().map(f).sum::<f64>() / tail.len() as f64;
        let mut without_run_queue: Vec<f64> = samples.iter().map(|s| (s.0 - s.1).max(0.0)).collect();
        without_run_queue.sort_by(f64::total_cmp);
        Ok(RunResult {
            without_run_queue,
            latencies: samples.iter().map(|s| s.0).collect(),
            slowest: (mean(|s| s.0), mean(|s| s.1)),
            counts: [0, 1, 2].map(|i| after[i] - before[i]),
            ..RunResult::default()
        })
    })?;
    result.load_creates = creates.load(Relaxed);
    result.load_checkpoints = checkpoints.load(Relaxed);
    for (d, dir) in dirs.iter().enumerate() {
        fs.remove_dir(&dir_name(d), dir, names)?;
    }
    Ok(result)
}

/// Create, write 4 KiB, fsync (timed), `files` times; each fsync's latency and the time the
/// thread waited for a CPU meanwhile, in us.
fn fsync_loop<T: Target>(fs: &T, dir: &T::Dir, names: &NameTable, files: usize) -> CliResult<Vec<(f64, f64)>> {
    let data = vec![0xa5u8; BLOCK_SIZE];
    let mut lat = Vec::with_capacity(files);
    for i in 0..files {
        let file = fs.create(dir, names.get(i))?;
        fs.write(&file, &data)?;
        let queued = process::thread_run_delay();
        let t = Instant::now();
        fs.fsync(&file)?;
        let took = t.elapsed();
        let queued = process::thread_run_delay().saturating_sub(queued);
        lat.push((took.as_secs_f64() * 1e6, queued.as_secs_f64() * 1e6));
    }
    Ok(lat)
}

/// Create files in `dir` until `stop`, removing them every `LOAD_BATCH`.
fn create_load<T: Target>(
    fs: &T,
    dir: &T::Dir,
    names: &NameTable,
    stop: &AtomicBool,
    creates: &AtomicU64,
) -> CliResult<()> {
    while !stop.load(Relaxed) {
        for i in 0..LOAD_BATCH {
            fs.create(dir, names.get(i))?;
            creates.fetch_add(1, Relaxed);
            if stop.load(Relaxed) {
                return Ok(());
            }
        }
        for i in 0..LOAD_BATCH {
            fs.unlink(dir, names.get(i))?;
        }
    }
    Ok(())
}

impl Latency {
    fn of(runs: &[RunResult]) -> Latency {
        let per_run = |f: &dyn Fn(&[f64]) -> f64| Spread::of(&runs.iter().map(|r| f(&r.latencies)).collect::<Vec<_>>());
        let sum = |f: &dyn Fn(&RunResult) -> u64| runs.iter().map(f).sum();
        Latency {
            p50_us: per_run(&|l| quantile(l, 0.50)),
            p99_us: per_run(&|l| quantile(l, 0.99)),
            max_us: per_run(&|l| l[l.len() - 1]),
            mean_us: per_run(&|l| l.iter().sum::<f64>() / l.len() as f64),
            p99_without_run_queue_us: Spread::of(
                &runs.iter().map(|r| quantile(&r.without_run_queue, 0.99)).collect::<Vec<_>>(),
            ),
            slowest_1pct_mean_us: Spread::of(&runs.iter().map(|r| r.slowest.0).collect::<Vec<_>>()),
            slowest_1pct_run_queue_us: Spread::of(&runs.iter().map(|r| r.slowest.1).collect::<Vec<_>>()),
            wrote_checkpoint: sum(&|r| r.counts[0]),
            joined_checkpoint: sum(&|r| r.counts[1]),
            already_durable: sum(&|r| r.counts[2]),
            load_creates: sum(&|r| r.load_creates),
            load_checkpoints: sum(&|r| r.load_checkpoints),
        }
    }
}

impl Figures for FsyncFigures {
    fn print(&self) {
        println!(
            "fsync: one thread creates a file, writes 4 KiB, fsyncs (timed); {} fsyncs per run; loaded = {} creating thread(s) + 1 thread writing checkpoints, sleeping {} us between them",
            grouped(self.fsyncs_per_run as u64),
            self.load_creators,
            CHECKPOINT_PAUSE.as_micros()
        );
        let e = &self.engine;
        println!("{:<9} {:>26} {:>26} {:>30} {:>26}", "load", "p50 us", "p99 us", "max us", "mean us");
        for (name, l) in [("idle", &e.unloaded), ("loaded", &e.loaded)] {
            println!(
                "{:<9} {:>26} {:>26} {:>30} {:>26}",
                name,
                l.p50_us.cell(us),
                l.p99_us.cell(us),
                l.max_us.cell(us),
                l.mean_us.cell(us)
            );
        }
        println!("p99 loaded/idle: {:.2}", e.p99_ratio);
        for (name, l) in [("idle", &e.unloaded), ("loaded", &e.loaded)] {
            println!("{name}: p99 of latency minus run-queue wait: {} us", l.p99_without_run_queue_us.cell(us));
        }
        println!("p99 loaded/idle without run-queue waits: {:.2}", e.p99_ratio_without_run_queue);
        for (name, l) in [("idle", &e.unloaded), ("loaded", &e.loaded)] {
            println!(
                "{name}: slowest 1% of fsyncs: mean {} us, of which {} us waiting for a CPU (run queue)",
                l.slowest_1pct_mean_us.cell(us),
                l.slowest_1pct_run_queue_us.cell(us)
            );
        }
        for (name, l) in [("idle", &e.unloaded), ("loaded", &e.loaded)] {
            println!(
                "{name}: fsyncs that wrote a checkpoint {}, joined a concurrent checkpoint {}, already durable {}; load: {} creates, {} checkpoints",
                grouped(l.wrote_checkpoint),
                grouped(l.joined_checkpoint),
                grouped(l.already_durable),
                grouped(l.load_creates),
                grouped(l.load_checkpoints)
            );
        }
        if self.mounted.is_empty() {
            return;
        }
        println!(
            "\nthe same workload through system calls on mounted file systems (checkpoints: syncfs(2), on a FUSE mount a chmod and fsync; every run starts checkpointed); the engine first"
        );
        println!(
            "{:<9} {:>22} {:>22} {:>22} {:>22} {:>7} {:>12} {:>14}",
            "target",
            "idle p50 us",
            "idle p99 us",
            "loaded p50 us",
            "loaded p99 us",
            "ratio",
            "w/o run q.",
            "load creates"
        );
        let engine = [("embedded", e)];
        let mounted = self.mounted.iter().map(|m| (m.target.name(), &m.figures));
        for (name, c) in engine.into_iter().chain(mounted) {
            println!(
                "{:<9} {:>22} {:>22} {:>22} {:>22} {:>7.2} {:>12.2} {:>14}",
                name,
                c.unloaded.p50_us.cell(us),
                c.unloaded.p99_us.cell(us),
                c.loaded.p50_us.cell(us),
                c.loaded.p99_us.cell(us),
                c.p99_ratio,
                c.p99_ratio_without_run_queue,
                grouped(c.loaded.load_creates)
            );
        }
    }
}

fn us(v: f64) -> String {
    format!("{v:.0}")
}
