//! `ferrofs bench fsmark`: fs_mark creating zero-length files with 1, 2, 8 ... threads, then
//! as many parallel `rm -rf`, on every target ([`super::targets`]) in one run. Each run mounts
//! each target afresh and visits the targets in turn (round-robin), so drift in the machine's
//! speed hits all of them alike. Reports files/s (median [min-max]), ferrofs-through-FUSE
//! against minifuse and fuse2fs, and the ferrofs daemon's peak RSS.

use super::phase::Timing;
use super::report::{median, rate_cell, sorted, PhaseStats};
use super::shell::{self, check_interrupt, run_timed};
use super::targets::{daemons_ran, Env, Kind, Mounted, Size};
use super::BenchArgs;
use crate::failure::{CliResult, Context, Failure};
use crate::units::{grouped, human_bytes};
use serde::Serialize;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// fs_mark's subdirectories per thread directory (`-D`): names hash over them.
const FSMARK_SUBDIRS: u64 = 100;
/// The issue's goals for ferrofs through FUSE, with the largest thread count measured.
const GOAL_VS_MINIFUSE: f64 = 0.9;
const GOAL_VS_FUSE2FS: f64 = 10.0;
/// Files per run and thread count, unless --files says otherwise.
const DEFAULT_FILES: u64 = 40_000;
const DEFAULT_THREADS: &[usize] = &[1, 2, 8];
/// Default file count of slow targets: --files divided by this.
const SLOW_DIVISOR: u64 = 10;

/// Every figure of one target, one run, one thread count.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    pub target: Kind,
    pub run: usize,
    pub threads: usize,
    pub files: u64,
    pub create_seconds: f64,
    /// fs_mark's own Files/sec figure.
    pub fsmark_files_per_sec: f64,
    /// CPU time of the fs_mark process (system time includes the kernel file system's work).
    pub create_client_cpu_seconds: f64,
    /// CPU time of the FUSE daemon over the create (0 for kernel targets).
    pub create_daemon_cpu_seconds: f64,
    pub remove_seconds: f64,
    pub remove_client_cpu_seconds: f64,
    pub remove_daemon_cpu_seconds: f64,
}

#[derive(Serialize)]
pub struct Report {
    pub files: u64,
    pub slow_files: u64,
    pub slow_targets: Vec<Kind>,
    pub runs: usize,
    pub threads: Vec<usize>,
    pub create_command: String,
    pub remove_command: String,
    /// Extra mount options given per target.
    pub mount_options: Vec<(Kind, String)>,
    /// FUSE daemons ran in sessions of their own (`--detached`), else in the benchmark's.
    pub detached: bool,
    pub targets: Vec<TargetReport>,
    pub ratios: Vec<Ratio>,
    pub skipped: Vec<Skipped>,
    /// Every measurement, in the order taken.
    pub samples: Vec<Sample>,
}

#[derive(Serialize)]
pub struct TargetReport {
    pub target: Kind,
    pub description: &'static str,
    pub files: u64,
    pub cells: Vec<Cell>,
    /// Peak RSS (VmHWM) of the FUSE daemon, per run, read just before unmount.
    pub daemon_peak_rss_bytes: Vec<u64>,
}

/// One target and thread count over all runs.
#[derive(Serialize)]
pub struct Cell {
    pub threads: usize,
    pub create: PhaseStats,
    pub remove: PhaseStats,
    pub fsmark_files_per_sec_median: f64,
}

/// ferrofs's rate over a peer's, per run (same run, so same machine conditions).
#[derive(Serialize)]
pub struct Ratio {
    pub peer: Kind,
    pub phase: &'static str,
    pub threads: usize,
    pub per_run: Vec<f64>,
    pub median: f64,
    pub goal: f64,
    /// Files per run of ferrofs and of the peer: a goal is judged only at equal counts.
    pub files: u64,
    pub peer_files: u64,
}

#[derive(Serialize)]
pub struct Skipped {
    pub target: Kind,
    pub reason: String,
}

pub fn run(args: &BenchArgs) -> CliResult<()> {
    let report = measure(args)?;
    report.print();
    if let Some(path) = &args.json {
        let what = || format!("write {}", path.display());
        let text = serde_json::to_string_pretty(&report).context(what)?;
        std::fs::write(path, text + "\n").context(what)?;
    }
    Ok(())
}

fn measure(args: &BenchArgs) -> CliResult<Report> {
    let f = &args.fsmark;
    if !shell::have("fs_mark") {
        return Err(Failure::new(
            "bench fsmark",
            "fs_mark not found (Debian package fsmark; scripts/install-bench-deps.sh)",
        ));
    }
    let threads = args.threads_or(DEFAULT_THREADS)?;
    let files = args.files.unwrap_or(DEFAULT_FILES);
    let slow_files = f.slow_files.unwrap_or((files / SLOW_DIVISOR).max(1));
    let env = Env::new(f)?;
    let mut wanted: Vec<Kind> = if f.targets.is_empty() { Kind::ALL.to_vec() } else { f.targets.clone() };
    wanted.dedup();
    let mut skipped = Vec::new();
    let mut active = Vec::new();
    for k in wanted {
        match k.unavailable(&env) {
            Some(reason) => skip(&mut skipped, k, reason),
            None => active.push(k),
        }
    }
    let files_of = |k: Kind| {
        if f.slow.contains(&k) {
            slow_files
        } else {
            files
        }
    };
    let mut samples = Vec::new();
    let mut rss: Vec<(Kind, u64)> = Vec::new();
    let runs = args.runs as usize;
    for run in 0..runs {
        for k in active.clone() {
            let files = files_of(k);
            let size = Size {
                files,
                dirs: threads.iter().map(|&t| t as u64 * (FSMARK_SUBDIRS + 1) + 1).max().unwrap_or(1),
                threads: threads.iter().copied().max().unwrap_or(1),
                data_bytes: 0,
            };
            eprintln!("run {}/{runs}: {}, {} files per thread count", run + 1, k.name(), grouped(files));
            let m = match k.mount(&env, &size) {
                Ok(m) => m,
                Err(e) if run == 0 && !shell::interrupted() => {
                    skip(&mut skipped, k, format!("set-up failed: {e}"));
                    active.retain(|a| *a != k);
                    continue;
                }
                Err(e) => return Err(e),
            };
            for &t in &threads {
                samples.push(one(&env, &m, run, t, files)?);
            }
            if let Some(b) = m.daemon_peak_rss() {
                rss.push((k, b));
            }
            m.unmount()?;
        }
    }
    check_interrupt()?;
    let targets: Vec<TargetReport> = active
        .iter()
        .map(|&k| TargetReport {
            target: k,
            description: k.description(),
            files: files_of(k),
            cells: threads.iter().map(|&t| cell(&samples, k, t)).collect(),
            daemon_peak_rss_bytes: rss.iter().filter(|r| r.0 == k).map(|r| r.1).collect(),
        })
        .collect();
    let top = threads.iter().copied().max().unwrap_or(1);
    let mut ratios = Vec::new();
    for (peer, goal) in [(Kind::Minifuse, GOAL_VS_MINIFUSE), (Kind::Fuse2fs, GOAL_VS_FUSE2FS)] {
        if !(active.contains(&Kind::Ferrofs) && active.contains(&peer)) {
            continue;
        }
        let files = (files_of(Kind::Ferrofs), files_of(peer));
        for phase in ["create", "remove"] {
            ratios.push(ratio(&samples, peer, phase, top, goal, runs, files));
        }
    }
    Ok(Report {
        files,
        slow_files,
        slow_targets: f.slow.clone(),
        runs,
        threads,
        create_command: format!("fs_mark -S0 -s0 -k -L1 -D {FSMARK_SUBDIRS} -n FILES/T -t 1 -d DIR/0 ... -d DIR/T-1"),
        remove_command: "rm -rf DIR/0 & ... & rm -rf DIR/T-1 (T processes at once)".into(),
        mount_options: f.mount_options.clone(),
        detached: f.detached,
        targets,
        ratios,
        skipped,
        samples,
    })
}

/// `TARGET:OPTS` of --mount-options.
fn skip(skipped: &mut Vec<Skipped>, k: Kind, reason: String) {
    eprintln!("skipping {}: {reason}", k.name());
    skipped.push(Skipped { target: k, reason });
}

/// One create + remove cycle with `threads` threads on a mounted target.
fn one(env: &Env, m: &Mounted, run: usize, threads: usize, files: u64) -> CliResult<Sample> {
    let per_thread = (files / threads as u64).max(1);
    let base = m.root().join(format!("t{threads}"));
    let dirs: Vec<PathBuf> = (0..threads).map(|i| base.join(i.to_string())).collect();
    for d in &dirs {
        std::fs::create_dir_all(d).context(|| format!("mkdir {}", d.display()))?;
    }
    let (create, fsmark) = create_files(env, m, &dirs, per_thread)?;
    let total = per_thread * threads as u64;
    let remove = remove_trees(m, &dirs)?;
    std::fs::remove_dir(&base).context(|| format!("rmdir {}", base.display()))?;
    Ok(Sample {
        target: m.kind,
        run,
        threads,
        files: total,
        create_seconds: create.wall.as_secs_f64(),
        fsmark_files_per_sec: fsmark,
        create_client_cpu_seconds: create.client.as_secs_f64(),
        create_daemon_cpu_seconds: create.daemon.as_secs_f64(),
        remove_seconds: remove.wall.as_secs_f64(),
        remove_client_cpu_seconds: remove.client.as_secs_f64(),
        remove_daemon_cpu_seconds: remove.daemon.as_secs_f64(),
    })
}

/// What a workload step took: wall clock, its processes' CPU, the FUSE daemon's CPU.
pub struct Took {
    pub wall: Duration,
    pub client: Duration,
    pub daemon: Duration,
}

/// Time a group of processes on `m`, with the daemon's CPU time over the same span.
fn timed(m: &Mounted, cmds: Vec<Command>) -> CliResult<(Took, Vec<String>)> {
    let before = m.daemon_cpu();
    let t = run_timed(cmds)?;
    let daemon = match (before, m.daemon_cpu()) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => Duration::ZERO,
    };
    Ok((Took { wall: t.wall, client: t.cpu, daemon }, t.stdout))
}

/// fs_mark, one thread per directory, `per_thread` files each; checks the count it reports
/// and returns its own Files/sec too.
pub fn create_files(env: &Env, m: &Mounted, dirs: &[PathBuf], per_thread: u64) -> CliResult<(Took, f64)> {
    let mut cmd = Command::new("fs_mark");
    cmd.current_dir(env.work_dir())
        .args(["-S0", "-s0", "-k", "-L1", "-D"])
        .arg(FSMARK_SUBDIRS.to_string())
        .arg("-n")
        .arg(per_thread.to_string())
        .args(["-t", "1"]);
    for d in dirs {
        cmd.arg("-d").arg(d);
    }
    let line = shell::describe(&cmd);
    let (took, out) = timed(m, vec![cmd])?;
    let (count, rate) = parse_fsmark(&out[0]).ok_or_else(|| {
        Failure::new(format!("`{line}`"), format!("no result line in its output: {}", shell::last_lines(&out[0])))
    })?;
    let want = per_thread * dirs.len() as u64;
    if count != want {
        return Err(Failure::new(format!("`{line}`"), format!("created {count} files, not {want}")));
    }
    Ok((took, rate))
}

/// `rm -rf` of each directory, all at once.
pub fn remove_trees(m: &Mounted, dirs: &[PathBuf]) -> CliResult<Took> {
    let cmds = dirs
        .iter()
        .map(|d| {
            let mut c = Command::new("rm");
            c.arg("-rf").arg(d);
            c
        })
        .collect();
    let (took, _) = timed(m, cmds)?;
    if let Some(d) = dirs.iter().find(|d| d.exists()) {
        return Err(Failure::new(format!("rm -rf {}", d.display()), "the directory is still there"));
    }
    Ok(took)
}

/// fs_mark's result line: `FSUse% Count Size Files/sec App-Overhead` -> (Count, Files/sec).
fn parse_fsmark(out: &str) -> Option<(u64, f64)> {
    out.lines().rev().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() != 5 || l.trim_start().starts_with('#') {
            return None;
        }
        Some((f[1].parse().ok()?, f[3].parse().ok()?))
    })
}

fn cell(samples: &[Sample], k: Kind, threads: usize) -> Cell {
    let mine: Vec<&Sample> = samples.iter().filter(|s| s.target == k && s.threads == threads).collect();
    let files = mine.first().map_or(0, |s| s.files) as usize;
    let timing =
        |wall: f64, cpu: f64| Timing { wall: Duration::from_secs_f64(wall), cpu: Duration::from_secs_f64(cpu) };
    let create: Vec<Timing> = mine
        .iter()
        .map(|s| timing(s.create_seconds, s.create_client_cpu_seconds + s.create_daemon_cpu_seconds))
        .collect();
    let remove: Vec<Timing> = mine
        .iter()
        .map(|s| timing(s.remove_seconds, s.remove_client_cpu_seconds + s.remove_daemon_cpu_seconds))
        .collect();
    let fsm: Vec<f64> = mine.iter().map(|s| s.fsmark_files_per_sec).collect();
    Cell {
        threads,
        create: PhaseStats::new("create", files, &create),
        remove: PhaseStats::new("remove", files, &remove),
        fsmark_files_per_sec_median: median(&sorted(&fsm)),
    }
}

fn rate(s: &Sample, phase: &str) -> f64 {
    let secs = if phase == "create" { s.create_seconds } else { s.remove_seconds };
    s.files as f64 / secs.max(1e-9)
}

fn ratio(
    samples: &[Sample],
    peer: Kind,
    phase: &'static str,
    threads: usize,
    goal: f64,
    runs: usize,
    (files, peer_files): (u64, u64),
) -> Ratio {
    let pick = |k: Kind, run: usize| samples.iter().find(|s| s.target == k && s.threads == threads && s.run == run);
    let per_run: Vec<f64> =
        (0..runs).filter_map(|r| Some(rate(pick(Kind::Ferrofs, r)?, phase) / rate(pick(peer, r)?, phase))).collect();
    Ratio { peer, phase, threads, median: median(&sorted(&per_run)), per_run, goal, files, peer_files }
}

impl Ratio {
    /// Whether the goal is met, or why it is not judged: a peer that ran fewer files ran in
    /// smaller directories, which favours it when its rate falls as they grow (fuse2fs's does).
    fn verdict(&self) -> String {
        match (self.median >= self.goal, self.files == self.peer_files) {
            (true, true) => "met".into(),
            (false, true) => "MISSED".into(),
            (true, false) => format!("met, with the peer at {} files", grouped(self.peer_files)),
            (false, false) => format!(
                "not judged: the peer ran {} files, ferrofs {} (--slow-files {} compares them)",
                grouped(self.peer_files),
                grouped(self.files),
                grouped(self.files)
            ),
        }
    }
}

impl Report {
    pub fn print(&self) {
        println!("ferrofs bench fsmark: {} runs; each run mounts every target afresh, targets in turn", self.runs);
        println!("  create: {}", self.create_command);
        println!("  remove: {}", self.remove_command);
        let slow: Vec<&str> =
            self.targets.iter().filter(|t| self.slow_targets.contains(&t.target)).map(|t| t.target.name()).collect();
        match slow.is_empty() {
            true => println!("  files per run and thread count: {}", grouped(self.files)),
            false => {
                println!(
                    "  files per run and thread count: {}; {}: {} (slow: fewer files, rates in files/s)",
                    grouped(self.files),
                    slow.join(", "),
                    grouped(self.slow_files)
                );
                if self.slow_files < self.files {
                    println!("  (fewer files favour a target whose rate falls as directories grow, as fuse2fs's does: ratios over it are then conservative; --slow-files sets the count)");
                }
            }
        }
        for (k, o) in &self.mount_options {
            println!("  {} mounted with -o {o}", k.name());
        }
        println!("  FUSE daemons: {}", daemons_ran(self.detached));
        println!(
            "  files/s = files / wall clock from the first process's start to the last one's exit: median [min-max]\n"
        );
        println!(
            "{:<13} {:>7} {:>27} {:>27} {:>12} {:>17}",
            "target", "threads", "create files/s", "remove files/s", "fs_mark f/s", "CPU us/file c/r"
        );
        for t in &self.targets {
            for c in &t.cells {
                println!(
                    "{:<13} {:>7} {:>27} {:>27} {:>12} {:>17}",
                    t.target.name(),
                    c.threads,
                    rate_cell(&c.create),
                    rate_cell(&c.remove),
                    grouped(c.fsmark_files_per_sec_median as u64),
                    format!("{:.1} / {:.1}", c.create.cpu_us_per_op_median, c.remove.cpu_us_per_op_median)
                );
            }
        }
        println!("\nCPU us/file: the workload processes' CPU (their system time includes a kernel file system's work) plus the FUSE daemon's, median");
        if !self.ratios.is_empty() {
            println!("\nferrofs through FUSE / peer, same run (median of per-run ratios [min-max]):");
            for r in &self.ratios {
                let s = sorted(&r.per_run);
                let (lo, hi) = (s.first().copied().unwrap_or(0.0), s.last().copied().unwrap_or(0.0));
                println!(
                    "  / {:<9} {:<6} {} threads: {:>6.2}x [{:.2}-{:.2}]  goal >= {}x: {}",
                    r.peer.name(),
                    r.phase,
                    r.threads,
                    r.median,
                    lo,
                    hi,
                    r.goal,
                    r.verdict()
                );
            }
        }
        for t in self.targets.iter().filter(|t| !t.daemon_peak_rss_bytes.is_empty()) {
            let mut v = t.daemon_peak_rss_bytes.clone();
            v.sort_unstable();
            println!(
                "{} daemon peak RSS (VmHWM before unmount): {} [{}-{}]",
                t.target.name(),
                human_bytes(v[v.len() / 2]),
                human_bytes(v[0]),
                human_bytes(v[v.len() - 1])
            );
        }
        for s in &self.skipped {
            println!("skipped {}: {}", s.target.name(), s.reason);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fsmark_result() {
        let out = "#  fs_mark  -S0\n#\tVersion 3.3\n\nFSUse%        Count         Size    Files/sec     App Overhead\n     0         4000            0      31501.7            79454\n";
        assert_eq!(parse_fsmark(out), Some((4000, 31501.7)));
        assert_eq!(parse_fsmark("# nothing\n"), None);
    }

    #[test]
    fn goals_are_judged_at_equal_sizes_only() {
        let r = |median, peer_files| Ratio {
            peer: Kind::Fuse2fs,
            phase: "create",
            threads: 8,
            per_run: vec![median],
            median,
            goal: 10.0,
            files: 40_000,
            peer_files,
        };
        assert_eq!(r(12.0, 40_000).verdict(), "met");
        assert_eq!(r(8.0, 40_000).verdict(), "MISSED");
        assert!(r(12.0, 4_000).verdict().starts_with("met, with the peer at 4,000 files"));
        assert!(r(8.0, 4_000).verdict().starts_with("not judged"));
    }
}
