//! `ferrofs bench seeds`: the five seed experiments (../shared/seeds/README.md) on every
//! target of [`super::targets`] and on ferrofs embedded (the engine in this process), in one
//! run. Each workload repeats `--runs` times; within a repetition it visits the targets in
//! turn (round-robin), each mounted afresh, so drift in the machine's load hits all alike.
//! Every raw figure is kept ([`Sample`]); the report gives median and min-max per target.
//!
//! Mounted targets run the workloads with threads of this process (the seeds used
//! processes); fs_mark, `rm -rf` and dbench are the real programs.

use super::fsmark::{create_files, remove_trees};
use super::names::NameTable;
use super::seeds_probe::{loadavg, parse_dbench, parse_mdtest, Dbench};
use super::seeds_results::{LockRow, LockSet, Machine, Results, Sample, Sizes, Skipped};
use super::session::Session;
use super::shell::{self, check_interrupt};
use super::targets::{Env, Kind, Mounted, Size};
use super::{orphan, phase, scratch, unmount, Bench, BenchArgs, Layout};
use crate::failure::{CliResult, Context, Failure};
use clap::{Args, ValueEnum};
use ferrofs_lockstat as lockstat;
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Where Debian and others put dbench's load file.
const DBENCH_LOADFILES: &[&str] =
    &["/usr/share/dbench/client.txt", "/usr/share/dbench4/client.txt", "/usr/local/share/dbench/client.txt"];
/// dbench data per client at most, to size images (its load file writes a few MB each).
const DBENCH_BYTES_PER_CLIENT: u64 = 64 << 20;
/// Targets that get fewer files in the rate workloads (mdtest, fs_mark): this divisor.
const SLOW: &[Kind] = &[Kind::Fuse2fs];
const SLOW_DIVISOR: u64 = 4;
const ORPHAN_FILE_BYTES: u64 = 4096;
/// Lock classes kept per workload and ferrofs target.
const LOCK_ROWS: usize = 5;

#[derive(Args, Debug)]
pub struct SeedsArgs {
    /// seeds: run only this workload (default: all five).
    #[arg(value_enum)]
    pub workload: Option<Workload>,
    /// seeds: sizes closer to the seeds' own (hours, not minutes).
    #[arg(long, conflicts_with = "tiny")]
    pub full: bool,
    /// seeds: smallest sizes, for tests.
    #[arg(long, hide = true)]
    pub tiny: bool,
    /// seeds: write the Markdown report here; plots and the raw JSON go to `results/`
    /// beside it.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// seeds: leave out the ferrofs-embedded rows.
    #[arg(long)]
    pub no_embedded: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    /// Seed 000: P threads truncating their own 4 KiB file by one byte and back.
    Orphan,
    /// Seed 001: mdtest-style create/stat/remove, P workers in directories of their own.
    Mdtest,
    /// Seed 003: fs_mark zero-length creates with 8 threads, then 8 parallel rm -rf.
    Fsmark,
    /// Seed 002: dbench with 8 and 64 clients.
    Dbench,
    /// Seed 004: unmount of a small file system beside one with many cached inodes.
    Unmount,
}

impl Workload {
    pub const ALL: [Workload; 5] =
        [Workload::Orphan, Workload::Mdtest, Workload::Fsmark, Workload::Dbench, Workload::Unmount];

    pub fn name(self) -> &'static str {
        match self {
            Workload::Orphan => "orphan",
            Workload::Mdtest => "mdtest",
            Workload::Fsmark => "fsmark",
            Workload::Dbench => "dbench",
            Workload::Unmount => "unmount",
        }
    }
}

impl Sizes {
    fn pick(a: &SeedsArgs) -> Sizes {
        let slow_targets = SLOW.iter().map(|k| k.name()).collect();
        if a.tiny {
            return Sizes {
                preset: "tiny",
                orphan_threads: vec![1, 2],
                orphan_rounds: 1,
                mdtest_workers: vec![1, 2],
                mdtest_files: 40,
                fsmark_threads: 8,
                fsmark_files: 160,
                dbench_clients: vec![2],
                dbench_seconds: 2,
                unmount_a_files: 2_000,
                unmount_b_files: 20,
                slow_divisor: SLOW_DIVISOR,
                slow_targets,
            };
        }
        let full = a.full;
        Sizes {
            preset: if full { "full" } else { "default" },
            orphan_threads: vec![1, 2, 4, 10, 20, 40],
            orphan_rounds: if full { 10 } else { 1 },
            mdtest_workers: vec![1, 2, 8, 48],
            mdtest_files: if full { 10_000 } else { 400 },
            fsmark_threads: 8,
            fsmark_files: if full { 400_000 } else { 16_000 },
            dbench_clients: vec![8, 64],
            dbench_seconds: if full { 120 } else { 6 },
            unmount_a_files: if full { 1_000_000 } else { 200_000 },
            unmount_b_files: 300,
            slow_divisor: SLOW_DIVISOR,
            slow_targets,
        }
    }

    fn slow(&self, t: Target, n: u64) -> u64 {
        match t {
            Target::Fs(k) if SLOW.contains(&k) => (n / self.slow_divisor).max(1),
            _ => n,
        }
    }
}

/// A row of the report: a file system set up by [`super::targets`], or the engine here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Embedded,
    Fs(Kind),
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Embedded => "ferrofs-embedded",
            Target::Fs(k) => k.name(),
        }
    }

    pub fn description(self) -> &'static str {
        match self {
            Target::Embedded => "ferrofs engine in the benchmark process (no FUSE), image in /dev/shm",
            Target::Fs(k) => k.description(),
        }
    }
}

struct Ctx<'a> {
    args: &'a BenchArgs,
    env: Env,
    sizes: Sizes,
    bar: ProgressBar,
    samples: Vec<Sample>,
    skipped: Vec<Skipped>,
    notes: Vec<(&'static str, String)>,
    locks: Vec<LockSet>,
}

pub fn run(args: &BenchArgs) -> CliResult<()> {
    let started = Instant::now();
    let sizes = Sizes::pick(&args.seeds);
    let loadavg_start = loadavg();
    let env = Env::new(&args.fsmark)?;
    let mut wanted: Vec<Kind> =
        if args.fsmark.targets.is_empty() { Kind::ALL.to_vec() } else { args.fsmark.targets.clone() };
    wanted.dedup();
    let mut targets = Vec::new();
    if !args.seeds.no_embedded {
        targets.push(Target::Embedded);
    }
    let mut skipped = Vec::new();
    for k in wanted {
        match k.unavailable(&env) {
            Some(reason) => {
                eprintln!("skipping {}: {reason}", k.name());
                skipped.push(Skipped { workload: "all", target: k.name().into(), reason });
            }
            None => targets.push(Target::Fs(k)),
        }
    }
    let workloads: Vec<Workload> = match args.seeds.workload {
        Some(w) => vec![w],
        None => Workload::ALL.to_vec(),
    };
    let runs = args.runs as usize;
    let bar = ProgressBar::new((workloads.len() * runs * targets.len()) as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:<48} [{bar:30}] {pos}/{len} {elapsed:>5}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(200));
    let mut cx = Ctx { args, env, sizes, bar, samples: Vec::new(), skipped, notes: Vec::new(), locks: Vec::new() };
    for &w in &workloads {
        let here: Vec<Target> = targets.iter().copied().filter(|t| applies(w, *t, &mut cx)).collect();
        // Steps of targets that do not apply still count on the bar.
        cx.bar.inc(((targets.len() - here.len()) * runs) as u64);
        cx.round_robin(w, &here)?;
        if w == Workload::Mdtest {
            cx.real_mdtest(&here);
        }
    }
    cx.bar.finish_and_clear();
    check_interrupt()?;
    let results = Results {
        // The program by its name, not the path it was built at.
        command: std::iter::once("ferrofs bench".to_string())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" "),
        sizes: cx.sizes.clone(),
        runs,
        detached: args.fsmark.detached,
        machine: Machine::now(loadavg_start)?,
        wall_seconds: started.elapsed().as_secs_f64(),
        targets: targets.iter().map(|t| (t.name(), t.description())).collect(),
        workloads: workloads.iter().map(|w| w.name()).collect(),
        notes: cx.notes,
        skipped: cx.skipped,
        locks: cx.locks,
        samples: cx.samples,
    };
    let markdown = super::seeds_report::markdown(&results, args.seeds.report.is_some());
    print!("{markdown}");
    if let Some(path) = &args.json {
        write(path, &json(&results)?)?;
    }
    if let Some(path) = &args.seeds.report {
        let dir = path.parent().unwrap_or(Path::new(".")).join("results");
        std::fs::create_dir_all(&dir).context(|| format!("mkdir {}", dir.display()))?;
        write(&dir.join("seeds.json"), &json(&results)?)?;
        for plot in super::seeds_report::plots(&results) {
            super::plot::line_chart(&dir.join(&plot.file), &plot)?;
        }
        write(path, &markdown)?;
        eprintln!("wrote {} and {}/", path.display(), dir.display());
    }
    Ok(())
}

pub(super) fn json(r: &impl Serialize) -> CliResult<String> {
    serde_json::to_string_pretty(r).map(|s| s + "\n").map_err(|e| Failure::new("encode the JSON report", e))
}

pub(super) fn write(path: &Path, text: &str) -> CliResult<()> {
    std::fs::write(path, text).context(|| format!("write {}", path.display()))
}

/// Whether workload `w` has a row for target `t`; a reason is noted if not.
fn applies(w: Workload, t: Target, cx: &mut Ctx) -> bool {
    let why = match (w, t) {
        (Workload::Fsmark | Workload::Dbench, Target::Embedded) => Some("runs programs over a mounted directory"),
        (Workload::Fsmark, _) if !shell::have("fs_mark") => {
            Some("fs_mark not installed (scripts/install-bench-deps.sh)")
        }
        (Workload::Dbench, _) if !shell::have("dbench") => Some("dbench not installed (scripts/install-bench-deps.sh)"),
        (Workload::Dbench, _) if dbench_loadfile().is_none() => Some("dbench's client.txt load file not found"),
        // The kernel side of seed 004 is one tmpfs row (see `unmount_kernel`).
        (Workload::Unmount, Target::Fs(Kind::Tmpfs) | Target::Embedded) => None,
        (Workload::Unmount, _) => return false,
        _ => None,
    };
    match why {
        Some(reason) => {
            cx.skipped.push(Skipped { workload: w.name(), target: t.name().into(), reason: reason.into() });
            false
        }
        None => true,
    }
}

pub(super) fn dbench_loadfile() -> Option<&'static str> {
    DBENCH_LOADFILES.iter().copied().find(|p| Path::new(p).is_file())
}

/// `dbench -t SECONDS -c client.txt -D ROOT/dbenchCLIENTS CLIENTS`, run in `work` (where it
/// writes its log); the directory is removed afterwards.
pub(super) fn dbench(work: &Path, root: &Path, clients: usize, seconds: u32) -> CliResult<Dbench> {
    let loadfile = dbench_loadfile().ok_or_else(|| Failure::new("dbench", "no client.txt"))?;
    let dir = root.join(format!("dbench{clients}"));
    std::fs::create_dir(&dir).context(|| format!("mkdir {}", dir.display()))?;
    let mut cmd = Command::new("dbench");
    cmd.current_dir(work)
        .arg("-t")
        .arg(seconds.to_string())
        .arg("-c")
        .arg(loadfile)
        .arg("-D")
        .arg(&dir)
        .arg(clients.to_string());
    let line = shell::describe(&cmd);
    let out = shell::run(&mut cmd)?;
    let d = parse_dbench(&out)
        .ok_or_else(|| Failure::new(format!("`{line}`"), format!("no Throughput line: {}", shell::last_lines(&out))))?;
    std::fs::remove_dir_all(&dir).context(|| format!("rm -r {}", dir.display()))?;
    Ok(d)
}

impl Ctx<'_> {
    /// `--runs` repetitions, each over all targets in turn. A target that fails is dropped
    /// from this workload (its figures too) with the reason, unless it was an interrupt.
    fn round_robin(&mut self, w: Workload, targets: &[Target]) -> CliResult<()> {
        let runs = self.args.runs as usize;
        let mut active = targets.to_vec();
        let mut locks: Vec<(Target, Vec<LockRow>)> = Vec::new();
        for rep in 0..runs {
            for t in active.clone() {
                self.bar.set_message(format!("{} {}/{runs}: {}", w.name(), rep + 1, t.name()));
                let got = self.one(w, t, rep);
                self.bar.inc(1);
                match got {
                    Ok(Some(rows)) => match locks.iter_mut().find(|l| l.0 == t) {
                        Some(l) => merge(&mut l.1, rows),
                        None => locks.push((t, rows)),
                    },
                    Ok(None) => {}
                    Err(e) => {
                        check_interrupt()?;
                        self.bar.println(format!("{}: dropping {}: {e}", w.name(), t.name()));
                        self.samples.retain(|s| !(s.workload == w.name() && s.target == t.name()));
                        locks.retain(|l| l.0 != t);
                        self.skipped.push(Skipped {
                            workload: w.name(),
                            target: t.name().into(),
                            reason: format!("failed in repetition {}: {e}", rep + 1),
                        });
                        active.retain(|a| *a != t);
                        self.bar.inc((runs - rep - 1) as u64);
                    }
                }
            }
        }
        for (t, mut rows) in locks {
            rows.retain(|r| r.acquisitions > 0);
            rows.sort_by_key(|r| std::cmp::Reverse((r.wait_total_ns, r.contentions, r.acquisitions)));
            rows.truncate(LOCK_ROWS);
            self.locks.push(LockSet { workload: w.name(), target: t.name(), rows });
        }
        Ok(())
    }

    /// One repetition of `w` on `t`; the lock counters of a ferrofs target.
    fn one(&mut self, w: Workload, t: Target, rep: usize) -> CliResult<Option<Vec<LockRow>>> {
        check_interrupt()?;
        match t {
            Target::Embedded => self.embedded(w, rep).map(Some),
            Target::Fs(k) => {
                if w == Workload::Unmount {
                    self.unmount_kernel(rep)?;
                    return Ok(None);
                }
                let m = k.mount(&self.env, &self.size(w, t))?;
                if k.is_ferrofs() {
                    // Zero the daemon's counters: its mount and root lookup are not the workload.
                    self.fuse_locks(&m)?;
                }
                match w {
                    Workload::Orphan => self.orphan_mounted(&m, rep)?,
                    Workload::Mdtest => self.mdtest_mounted(&m, rep)?,
                    Workload::Fsmark => self.fsmark(&m, rep)?,
                    Workload::Dbench => self.dbench(&m, rep)?,
                    Workload::Unmount => unreachable!("handled above"),
                }
                let locks = if k.is_ferrofs() { Some(self.fuse_locks(&m)?) } else { None };
                m.unmount()?;
                Ok(locks)
            }
        }
    }

    fn size(&self, w: Workload, t: Target) -> Size {
        let s = &self.sizes;
        let (files, dirs, threads, data_bytes) = match w {
            Workload::Orphan => {
                let p = s.orphan_threads.iter().copied().max().unwrap_or(1);
                (p as u64, p as u64, p, p as u64 * ORPHAN_FILE_BYTES)
            }
            Workload::Mdtest => {
                let p = s.mdtest_workers.iter().copied().max().unwrap_or(1);
                (s.slow(t, s.mdtest_files) * p as u64, p as u64, p, 0)
            }
            Workload::Fsmark => (s.slow(t, s.fsmark_files), s.fsmark_threads as u64 * 101 + 1, s.fsmark_threads, 0),
            Workload::Dbench => {
                let c = s.dbench_clients.iter().copied().max().unwrap_or(1);
                (c as u64 * 1000, c as u64 * 50, c.min(16), c as u64 * DBENCH_BYTES_PER_CLIENT)
            }
            Workload::Unmount => (s.unmount_b_files, 1, 1, 0),
        };
        Size { files, dirs, threads, data_bytes }
    }

    fn push(&mut self, w: Workload, t: Target, rep: usize, x: u64, metric: &'static str, value: f64) {
        self.samples.push(Sample { workload: w.name(), target: t.name(), rep, x, metric, value });
    }

    /// `ferrofs lockstat MOUNT --json --reset` against the daemon's control socket.
    fn fuse_locks(&self, m: &Mounted) -> CliResult<Vec<LockRow>> {
        let out =
            shell::run(Command::new(self.env.ferrofs()?).arg("lockstat").arg(m.root()).args(["--json", "--reset"]))?;
        let v: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| Failure::new("ferrofs lockstat --json", format!("not JSON: {e}")))?;
        let classes = v.as_array().ok_or_else(|| Failure::new("ferrofs lockstat --json", "not a list of classes"))?;
        Ok(classes
            .iter()
            .map(|c| {
                let side = |s: &str, f: &str| c["total"][s][f].as_u64().unwrap_or(0);
                let both = |f: &str| side("exclusive", f) + side("shared", f);
                LockRow {
                    name: c["name"].as_str().unwrap_or("?").to_string(),
                    acquisitions: both("acquisitions"),
                    contentions: both("contentions"),
                    wait_total_ns: both("wait_total_ns"),
                    wait_max_ns: side("exclusive", "wait_max_ns").max(side("shared", "wait_max_ns")),
                }
            })
            .collect())
    }

    // ---- the embedded target ----

    fn embedded(&mut self, w: Workload, rep: usize) -> CliResult<Vec<LockRow>> {
        let t = Target::Embedded;
        let s = self.sizes.clone();
        let session = match w {
            Workload::Orphan => {
                let max = s.orphan_threads.iter().copied().max().unwrap_or(1);
                let session = Session::open(self.args, 2 * max as u64, scratch::mkfs_options(max))?;
                let inos = orphan::make_files(&session.fs, max)?;
                lockstat::reset();
                for &p in &s.orphan_threads {
                    let secs = orphan::one_run(&session.fs, &inos[..p], s.orphan_rounds)?;
                    self.push(w, t, rep, p as u64, "seconds", secs);
                }
                session
            }
            Workload::Mdtest => {
                let max = s.mdtest_workers.iter().copied().max().unwrap_or(1);
                let most = s.mdtest_files as usize * max;
                let names = NameTable::new(most);
                let session = Session::open(self.args, (most + 2 * max) as u64, scratch::mkfs_options(max))?;
                let bar = ProgressBar::hidden();
                let bench = Bench { fs: &session.fs, names: &names, bar: &bar };
                for &p in &s.mdtest_workers {
                    let files = s.mdtest_files as usize * p;
                    let label = format!("mdtest {p}w rep {rep}");
                    let r = bench.one_run(Layout::Private, p, files, &label)?;
                    for (metric, timing) in [("create", r.create), ("stat", r.stat), ("remove", r.remove)] {
                        let rate = files as f64 / timing.wall.as_secs_f64().max(1e-9);
                        self.push(w, t, rep, p as u64, metric, rate);
                    }
                }
                session
            }
            Workload::Unmount => {
                let (session, f) =
                    unmount::measure(self.args, s.unmount_a_files as usize, s.unmount_b_files as usize, 1)?;
                let x = s.unmount_a_files;
                self.push(w, t, rep, x, "without_a_ms", f.seconds_without_a.median * 1e3);
                self.push(w, t, rep, x, "with_a_ms", f.seconds_with_a.median * 1e3);
                self.push(w, t, rep, x, "ratio", f.ratio);
                self.push(w, t, rep, x, "a_cached_inodes", f.a_cached_inodes as f64);
                session
            }
            Workload::Fsmark | Workload::Dbench => unreachable!("filtered by applies()"),
        };
        let locks = lockstat::snapshot();
        session.close()?;
        Ok(locks
            .iter()
            .map(|c| {
                let s = c.total.combined();
                LockRow {
                    name: c.name.to_string(),
                    acquisitions: s.acquisitions,
                    contentions: s.contentions,
                    wait_total_ns: s.wait_total_ns,
                    wait_max_ns: s.wait_max_ns,
                }
            })
            .collect())
    }

    // ---- mounted targets ----

    /// Seed 000 with threads: each its own 4 KiB file, truncated by one byte down to 1 byte
    /// and extended back to 4096, `orphan_rounds` times.
    fn orphan_mounted(&mut self, m: &Mounted, rep: usize) -> CliResult<()> {
        let t = Target::Fs(m.kind);
        let max = self.sizes.orphan_threads.iter().copied().max().unwrap_or(1);
        let data = vec![0x5a_u8; ORPHAN_FILE_BYTES as usize];
        let mut files = Vec::new();
        for i in 0..max {
            let dir = m.root().join(format!("orphan.{i}"));
            std::fs::create_dir(&dir).context(|| format!("mkdir {}", dir.display()))?;
            let path = dir.join("file");
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .context(|| format!("create {}", path.display()))?;
            f.write_all_at(&data, 0).context(|| format!("write {}", path.display()))?;
            files.push((path, f));
        }
        let rounds = self.sizes.orphan_rounds;
        for &p in &self.sizes.orphan_threads.clone() {
            let files = &files[..p];
            let time = phase::timed(
                "orphan",
                p,
                |i| {
                    let (path, f) = &files[i];
                    let set = |size| f.set_len(size).context(|| format!("truncate {} to {size}", path.display()));
                    for _ in 0..rounds {
                        for size in (1..ORPHAN_FILE_BYTES).rev() {
                            set(size)?;
                        }
                        set(ORPHAN_FILE_BYTES)?;
                    }
                    Ok(())
                },
                || Ok(()),
            )?;
            self.push(Workload::Orphan, t, rep, p as u64, "seconds", time.wall.as_secs_f64());
        }
        Ok(())
    }

    /// Seed 001's pattern (`mdtest -F -C -T -r`, one directory per worker) with threads:
    /// create (open O_CREAT + close), stat, remove; ops/s of each phase.
    fn mdtest_mounted(&mut self, m: &Mounted, rep: usize) -> CliResult<()> {
        let t = Target::Fs(m.kind);
        let n = self.sizes.slow(t, self.sizes.mdtest_files);
        for &p in &self.sizes.mdtest_workers.clone() {
            let dirs: Vec<PathBuf> = (0..p).map(|i| m.root().join(format!("md{p}.{i}"))).collect();
            for d in &dirs {
                std::fs::create_dir(d).context(|| format!("mkdir {}", d.display()))?;
            }
            let name = |d: &Path, i: u64| d.join(format!("file.mdtest.{i}"));
            type Op = fn(&Path) -> std::io::Result<()>;
            let ops: [(&'static str, Op); 3] = [
                ("create", |f| std::fs::File::create(f).map(drop)),
                ("stat", |f| std::fs::metadata(f).map(drop)),
                ("remove", |f| std::fs::remove_file(f)),
            ];
            for (metric, op) in ops {
                let time = phase::timed(
                    metric,
                    p,
                    |w| {
                        for i in 0..n {
                            let f = name(&dirs[w], i);
                            op(&f).context(|| format!("{metric} {}", f.display()))?;
                        }
                        Ok(())
                    },
                    || Ok(()),
                )?;
                let rate = (n * p as u64) as f64 / time.wall.as_secs_f64().max(1e-9);
                self.push(Workload::Mdtest, t, rep, p as u64, metric, rate);
            }
            for d in &dirs {
                std::fs::remove_dir(d).context(|| format!("rmdir {}", d.display()))?;
            }
        }
        Ok(())
    }

    /// Seed 003: fs_mark with 8 threads (one directory each), then 8 `rm -rf` at once.
    fn fsmark(&mut self, m: &Mounted, rep: usize) -> CliResult<()> {
        let t = Target::Fs(m.kind);
        let threads = self.sizes.fsmark_threads;
        let files = self.sizes.slow(t, self.sizes.fsmark_files);
        let per_thread = (files / threads as u64).max(1);
        let base = m.root().join("fsmark");
        let dirs: Vec<PathBuf> = (0..threads).map(|i| base.join(i.to_string())).collect();
        for d in &dirs {
            std::fs::create_dir_all(d).context(|| format!("mkdir {}", d.display()))?;
        }
        let (create, fsm) = create_files(&self.env, m, &dirs, per_thread)?;
        let remove = remove_trees(m, &dirs)?;
        std::fs::remove_dir(&base).context(|| format!("rmdir {}", base.display()))?;
        let total = (per_thread * threads as u64) as f64;
        let x = threads as u64;
        self.push(Workload::Fsmark, t, rep, x, "create", total / create.wall.as_secs_f64().max(1e-9));
        self.push(Workload::Fsmark, t, rep, x, "remove", total / remove.wall.as_secs_f64().max(1e-9));
        self.push(Workload::Fsmark, t, rep, x, "fsmark_files_per_sec", fsm);
        self.push(Workload::Fsmark, t, rep, x, "files", total);
        Ok(())
    }

    /// Seed 002: `dbench -t SECONDS -c client.txt -D DIR CLIENTS` for each client count.
    fn dbench(&mut self, m: &Mounted, rep: usize) -> CliResult<()> {
        let t = Target::Fs(m.kind);
        for &c in &self.sizes.dbench_clients.clone() {
            let d = dbench(self.env.work_dir(), m.root(), c, self.sizes.dbench_seconds)?;
            let x = c as u64;
            self.push(Workload::Dbench, t, rep, x, "mb_per_s", d.mb_per_s);
            self.push(Workload::Dbench, t, rep, x, "max_latency_ms", d.max_latency_ms);
            if let Some((avg, max)) = d.flush_ms {
                self.push(Workload::Dbench, t, rep, x, "flush_avg_ms", avg);
                self.push(Workload::Dbench, t, rep, x, "flush_max_ms", max);
            }
        }
        Ok(())
    }

    /// Seed 004's shape on the kernel: time umount(2) of a small tmpfs B (its files created
    /// and statted) with no other mount of ours, then while tmpfs A holds many inodes.
    fn unmount_kernel(&mut self, rep: usize) -> CliResult<()> {
        let t = Target::Fs(Kind::Tmpfs);
        let (a_files, b_files) = (self.sizes.unmount_a_files, self.sizes.unmount_b_files);
        let b_size = Size { files: b_files, dirs: 1, threads: 1, data_bytes: 0 };
        let without = self.time_small_umount(&b_size)?;
        let a = Kind::Tmpfs
            .mount(&self.env, &Size { files: a_files, dirs: a_files / 1000 + 1, threads: 1, data_bytes: 0 })?;
        fill(a.root(), a_files)?;
        let with = self.time_small_umount(&b_size)?;
        a.unmount()?;
        let x = a_files;
        self.push(Workload::Unmount, t, rep, x, "without_a_ms", without * 1e3);
        self.push(Workload::Unmount, t, rep, x, "with_a_ms", with * 1e3);
        self.push(Workload::Unmount, t, rep, x, "ratio", with / without.max(1e-12));
        self.push(Workload::Unmount, t, rep, x, "a_cached_inodes", a_files as f64);
        Ok(())
    }

    fn time_small_umount(&self, size: &Size) -> CliResult<f64> {
        let b = Kind::Tmpfs.mount(&self.env, size)?;
        fill(b.root(), size.files)?;
        let c =
            std::ffi::CString::new(b.root().as_os_str().as_encoded_bytes()).map_err(|e| Failure::new("umount", e))?;
        let started = Instant::now();
        // SAFETY: a NUL-terminated path; umount2 keeps no pointer to it.
        let rc = unsafe { libc::umount2(c.as_ptr(), 0) };
        let secs = started.elapsed().as_secs_f64();
        if rc != 0 {
            return Err(Failure::new(format!("umount {}", b.root().display()), std::io::Error::last_os_error()));
        }
        // Its teardown finds it unmounted and removes the mount point.
        b.unmount()?;
        Ok(secs)
    }

    /// Real mdtest, once per target at 1 process (no MPI launcher), if installed.
    fn real_mdtest(&mut self, targets: &[Target]) {
        if !shell::have("mdtest") {
            self.notes.push((
                "mdtest",
                "real mdtest: skipped, not installed (Debian has no mdtest package); the table is this program's mdtest-style workload".into(),
            ));
            return;
        }
        for &t in targets {
            let Target::Fs(k) = t else { continue };
            let got = (|| -> CliResult<Vec<(String, f64)>> {
                let m = k.mount(&self.env, &self.size(Workload::Mdtest, t))?;
                let n = self.sizes.slow(t, self.sizes.mdtest_files);
                let dir = m.root().join("mdtest");
                let out = shell::run(
                    Command::new("mdtest")
                        .args(["-F", "-C", "-T", "-r", "-u", "-n"])
                        .arg(n.to_string())
                        .arg("-d")
                        .arg(&dir),
                )?;
                m.unmount()?;
                Ok(parse_mdtest(&out))
            })();
            match got {
                Ok(rates) => {
                    let text: Vec<String> = rates.iter().map(|(op, r)| format!("{op} {r:.0}/s")).collect();
                    self.notes.push(("mdtest", format!("real mdtest, 1 process, {}: {}", t.name(), text.join(", "))));
                }
                Err(e) => self.notes.push(("mdtest", format!("real mdtest on {} failed: {e}", t.name()))),
            }
        }
    }
}

/// `files` empty files in directories of 1000, each created and statted.
fn fill(root: &Path, files: u64) -> CliResult<()> {
    for i in 0..files {
        let dir = root.join(format!("d{}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir(&dir).context(|| format!("mkdir {}", dir.display()))?;
        }
        let f = dir.join(format!("f{i}"));
        std::fs::File::create(&f).context(|| format!("create {}", f.display()))?;
        std::fs::metadata(&f).context(|| format!("stat {}", f.display()))?;
    }
    Ok(())
}

fn merge(into: &mut Vec<LockRow>, rows: Vec<LockRow>) {
    for r in rows {
        match into.iter_mut().find(|i| i.name == r.name) {
            Some(i) => {
                i.acquisitions += r.acquisitions;
                i.contentions += r.contentions;
                i.wait_total_ns += r.wait_total_ns;
                i.wait_max_ns = i.wait_max_ns.max(r.wait_max_ns);
            }
            None => into.push(r),
        }
    }
}
