//! `ferrofs bench workloads`: real work on ferrofs through the mount beside its peers
//! ([`super::targets`]: kernel ext4 and XFS on loop images, tmpfs, fuse2fs, libfuse's
//! passthrough_ll over tmpfs), each mounted afresh for every workload and repetition, in turn:
//!
//! - a tree (default /usr/share, as a tarball): `tar -xf` + syncfs, `cp -a` of it out to a
//!   tmpfs after dropping the page cache, `rm -rf`;
//! - `git clone` of a local repository, `git status`, `git log -p`;
//! - dbench with 8 and 64 clients;
//! - 4 KiB appending and overwriting `pwrite`s, each timed, with and without an fsync each;
//!
//! and of every FUSE server its peak RSS and CPU time per operation over each workload.
//! ferrofs is measured once per `--ferrofs-options` variant, so options compare side by side.

use super::seeds::{dbench, dbench_loadfile, json, write};
use super::seeds_probe::loadavg;
use super::seeds_results::{Machine, Sample, Skipped};
use super::shell::{self, check_interrupt, run};
use super::targets::{passthrough_open_files, Env, Kind, Mounted, Size};
use super::workloads_tree::{self as tree, Census, Tarball};
use super::write::{time_writes, Pattern, WRITE_BYTES};
use super::{report, BenchArgs};
use crate::failure::{CliResult, Context, Failure};
use crate::units::parse_size;
use clap::Args;
use serde::Serialize;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The targets measured unless `--targets` says otherwise.
const DEFAULT_TARGETS: [Kind; 6] =
    [Kind::Ferrofs, Kind::Passthrough, Kind::Fuse2fs, Kind::Ext4, Kind::Xfs, Kind::Tmpfs];
const GENERATED: &str = "generated";
/// dbench data per client at most, to size images.
const DBENCH_BYTES_PER_CLIENT: u64 = 64 << 20;

#[derive(Args, Debug)]
pub struct WorkloadsArgs {
    /// workloads: also measure ferrofs mounted with these options (comma-separated, as for
    /// `-o`), as a target of its own; repeat for more variants (e.g. writeback_cache).
    #[arg(long = "ferrofs-options")]
    pub ferrofs_options: Vec<String>,
    /// workloads: the tree to unpack, copy and remove: a directory (e.g. /usr/share, the
    /// whole of it), or `generated` (the default) for a tree with /usr/share's file and
    /// directory sizes.
    #[arg(long)]
    pub tree: Option<String>,
    /// workloads: bytes of file data in the generated tree (default 128M: about 12,000
    /// entries, a quarter of /usr/share).
    #[arg(long, value_parser = parse_size)]
    pub tree_size: Option<u64>,
    /// workloads: the git repository to clone (default: the one holding the current directory).
    #[arg(long)]
    pub repo: Option<PathBuf>,
    /// workloads: dbench's client counts.
    #[arg(long, value_delimiter = ',', default_value = "8,64", value_parser = clap::value_parser!(u64).range(1..=1024))]
    pub dbench_clients: Vec<u64>,
    /// workloads: seconds of each dbench run.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(1..=3600))]
    pub dbench_seconds: u32,
    /// workloads: 4 KiB writes per latency measurement.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    pub writes: u64,
    /// workloads: write workloads.md, workloads.json and the PNG charts into this directory.
    /// published: write published.md and published.json into it.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// One column of the report: a kind of file system, mounted with extra options.
#[derive(Clone, Debug)]
pub struct Target {
    kind: Kind,
    options: String,
    /// `ferrofs`, `ferrofs -o writeback_cache`: report names live as long as the run.
    name: &'static str,
}

/// Workloads that share a mount: each group is measured on a fresh one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    Tree,
    Git,
    Dbench(u64),
    Latency,
}

impl Group {
    fn name(self) -> String {
        match self {
            Group::Tree => "tar, cp -a, rm -rf".into(),
            Group::Git => "git".into(),
            Group::Dbench(c) => format!("dbench {c}"),
            Group::Latency => "4 KiB write latency".into(),
        }
    }

    /// Whether `s` is a figure of this group.
    fn owns(self, s: &Sample) -> bool {
        match self {
            Group::Tree => [TAR, CP, RM].contains(&s.workload),
            Group::Git => [CLONE, STATUS, LOG].contains(&s.workload),
            Group::Dbench(c) => s.workload == DBENCH && s.x == c,
            Group::Latency => LATENCIES.iter().any(|l| l.0 == s.workload),
        }
    }

    /// The workload names skips are recorded under.
    fn workload(self) -> &'static str {
        match self {
            Group::Tree => "tree",
            Group::Git => "git",
            Group::Dbench(_) => DBENCH,
            Group::Latency => "latency",
        }
    }
}

const TAR: &str = "tar -xf + sync";
const CP: &str = "cp -a out";
const RM: &str = "rm -rf";
const CLONE: &str = "git clone";
const STATUS: &str = "git status";
const LOG: &str = "git log -p";
const DBENCH: &str = "dbench";
/// (workload, fdatasync after each write, where the writes go).
const LATENCIES: [(&str, bool, Pattern); 4] = [
    ("append 4 KiB", false, Pattern::Append),
    ("append 4 KiB + fdatasync", true, Pattern::Append),
    ("overwrite 4 KiB", false, Pattern::Overwrite),
    ("overwrite 4 KiB + fdatasync", true, Pattern::Overwrite),
];

/// The repository `git clone` copies.
#[derive(Debug, Serialize)]
pub struct Repo {
    pub path: PathBuf,
    pub tracked_files: u64,
    pub commits: u64,
    /// Bytes of its object store (sizes the images).
    pub git_bytes: u64,
}

/// Everything a run measured.
#[derive(Serialize)]
pub struct Results {
    pub command: String,
    pub machine: Machine,
    pub wall_seconds: f64,
    pub runs: usize,
    /// Where the targets' images were.
    pub images: String,
    pub tree_source: String,
    pub tree: Census,
    pub repo: Option<Repo>,
    pub dbench_seconds: u32,
    pub writes: u64,
    /// Report names and descriptions, in column order.
    pub targets: Vec<(&'static str, String)>,
    pub skipped: Vec<Skipped>,
    /// Every figure: workload, target, repetition, x (dbench's clients, else 0), metric, value.
    pub samples: Vec<Sample>,
}

struct Ctx<'a> {
    args: &'a WorkloadsArgs,
    env: Env,
    tarball: Tarball,
    repo: Option<Repo>,
    samples: Vec<Sample>,
    skipped: Vec<Skipped>,
}

pub fn run_all(args: &BenchArgs) -> CliResult<()> {
    let started = Instant::now();
    let loadavg_start = loadavg();
    let w = &args.workloads;
    let env = Env::new(&args.fsmark)?;
    let mut skipped = Vec::new();
    let targets = targets(&args.fsmark.targets, &w.ferrofs_options, &env, &mut skipped);
    let tarball = make_tarball(w, &env)?;
    let repo = match find_repo(w) {
        Ok(r) => Some(r),
        Err(why) => {
            eprintln!("skipping git: {why}");
            skipped.push(Skipped { workload: "git", target: "all".into(), reason: why });
            None
        }
    };
    let mut cx = Ctx { args: w, env, tarball, repo, samples: Vec::new(), skipped };
    let mut groups = vec![Group::Tree, Group::Git];
    groups.extend(w.dbench_clients.iter().map(|&c| Group::Dbench(c)));
    groups.push(Group::Latency);
    for g in groups {
        if let Some(why) = cx.unavailable(g) {
            eprintln!("skipping {}: {why}", g.name());
            cx.skipped.push(Skipped { workload: g.workload(), target: "all".into(), reason: why });
            continue;
        }
        cx.round_robin(g, &targets, args.runs as usize)?;
    }
    let results = Results {
        command: report::command_line(),
        machine: Machine::now(loadavg_start)?,
        wall_seconds: started.elapsed().as_secs_f64(),
        runs: args.runs as usize,
        images: cx.env.image_dir().display().to_string(),
        tree_source: cx.tarball.source.clone(),
        tree: cx.tarball.census,
        repo: cx.repo,
        dbench_seconds: w.dbench_seconds,
        writes: w.writes,
        targets: targets.iter().map(|t| (t.name, t.description())).collect(),
        skipped: cx.skipped,
        samples: cx.samples,
    };
    let markdown = super::workloads_report::markdown(&results);
    print!("{markdown}");
    if let Some(path) = &args.json {
        write(path, &json(&results)?)?;
    }
    if let Some(dir) = &w.out {
        std::fs::create_dir_all(dir).context(|| format!("mkdir {}", dir.display()))?;
        write(&dir.join("workloads.json"), &json(&results)?)?;
        for (file, chart) in super::workloads_report::charts(&results) {
            super::plot::bar_chart(&dir.join(file), &chart)?;
        }
        write(&dir.join("workloads.md"), &markdown)?;
        eprintln!("wrote {}/workloads.md, workloads.json and the charts", dir.display());
    }
    Ok(())
}

/// The targets to measure: `--targets` (default [`DEFAULT_TARGETS`]), ferrofs once plainly
/// and once per `--ferrofs-options`; those that cannot run here go to `skipped`.
fn targets(wanted: &[Kind], variants: &[String], env: &Env, skipped: &mut Vec<Skipped>) -> Vec<Target> {
    let mut kinds = if wanted.is_empty() { DEFAULT_TARGETS.to_vec() } else { wanted.to_vec() };
    kinds.dedup();
    let mut out = Vec::new();
    for kind in kinds {
        let mut options = vec![String::new()];
        if kind == Kind::Ferrofs {
            options.extend(variants.iter().cloned());
        }
        for o in options {
            let name = match o.is_empty() {
                true => kind.name().to_string(),
                false => format!("{} -o {o}", kind.name()),
            };
            let name: &'static str = Box::leak(name.into_boxed_str());
            match kind.unavailable(env) {
                Some(reason) => {
                    eprintln!("skipping {name}: {reason}");
                    skipped.push(Skipped { workload: "all", target: name.into(), reason });
                }
                None => out.push(Target { kind, options: o, name }),
            }
        }
    }
    out
}

impl Target {
    fn description(&self) -> String {
        match self.options.is_empty() {
            true => self.kind.description().to_string(),
            false => format!("{}, mounted with -o {}", self.kind.description(), self.options),
        }
    }
}

/// The tree's tarball, made in the image directory (memory, with /dev/shm).
fn make_tarball(w: &WorkloadsArgs, env: &Env) -> CliResult<Tarball> {
    let into = env.image_dir().join(format!("ferrofs-bench-{}-tree.tar", std::process::id()));
    let generate = |bytes: u64| -> CliResult<Tarball> {
        let dir = env.image_dir().join(format!("ferrofs-bench-{}-gen", std::process::id()));
        let root = dir.join("tree");
        std::fs::create_dir(&dir).context(|| format!("mkdir {}", dir.display()))?;
        eprintln!("generating a tree of {} with /usr/share's shape", crate::units::human_bytes(bytes));
        let made = tree::generate(&root, bytes).and_then(|_| {
            tree::tar_of(&root, into.clone(), format!("{GENERATED}, {}", crate::units::human_bytes(bytes)))
        });
        let cleaned = std::fs::remove_dir_all(&dir).context(|| format!("rm -r {}", dir.display()));
        let tarball = made?;
        cleaned.map(|()| tarball)
    };
    match w.tree.as_deref() {
        None | Some(GENERATED) => generate(w.tree_size.unwrap_or(tree::DEFAULT_GENERATED_BYTES)),
        Some(dir) => {
            eprintln!("packing {dir}");
            tree::tar_of(Path::new(dir), into, dir.to_string())
        }
    }
}

/// `--repo`, else the repository holding the current directory; why not, if there is none.
fn find_repo(w: &WorkloadsArgs) -> Result<Repo, String> {
    if !shell::have("git") {
        return Err("git not installed".into());
    }
    let git = |dir: &Path, args: &[&str]| {
        run(Command::new("git").arg("-c").arg("safe.directory=*").arg("-C").arg(dir).args(args))
            .map(|s| s.trim().to_string())
            .map_err(|e| e.to_string())
    };
    let here = w.repo.clone().unwrap_or_else(|| PathBuf::from("."));
    let top = PathBuf::from(
        git(&here, &["rev-parse", "--show-toplevel"]).map_err(|e| format!("no repository to clone (--repo): {e}"))?,
    );
    let common = top.join(git(&top, &["rev-parse", "--git-common-dir"])?);
    let git_bytes = tree::census(&common).map_err(|e| e.to_string())?.bytes;
    let count = |text: String| text.lines().count() as u64;
    Ok(Repo {
        tracked_files: count(git(&top, &["ls-files"])?),
        commits: git(&top, &["rev-list", "--count", "HEAD"])?
            .parse()
            .map_err(|e| format!("git rev-list --count: {e}"))?,
        git_bytes,
        path: top,
    })
}

/// Run `cmd` to its end (killed on an interrupt); its wall time.
fn timed(cmd: &mut Command) -> CliResult<f64> {
    let cmd = std::mem::replace(cmd, Command::new("true"));
    Ok(shell::run_timed(vec![cmd])?.wall.as_secs_f64())
}

impl Ctx<'_> {
    fn unavailable(&self, g: Group) -> Option<String> {
        match g {
            Group::Git if self.repo.is_none() => Some("no repository (see above)".into()),
            Group::Dbench(_) if !shell::have("dbench") => {
                Some("dbench not installed (scripts/install-bench-deps.sh)".into())
            }
            Group::Dbench(_) if dbench_loadfile().is_none() => Some("dbench's client.txt load file not found".into()),
            _ => None,
        }
    }

    /// Why group `g` cannot run on target `t`, if it cannot.
    fn cannot(&self, g: Group, t: &Target) -> Option<String> {
        let (entries, limit) = (self.tarball.census.entries(), passthrough_open_files());
        (g == Group::Tree && t.kind == Kind::Passthrough && entries + 1000 > limit).then(|| {
            format!(
                "the tree's {entries} entries exceed its open-file limit ({limit}: it holds a descriptor per inode; \
                 a smaller --tree fits)"
            )
        })
    }

    /// `runs` repetitions of group `g`, each over all targets in turn; a target that fails is
    /// dropped from the group (its figures too) with the reason, unless it was an interrupt.
    fn round_robin(&mut self, g: Group, targets: &[Target], runs: usize) -> CliResult<()> {
        let mut active = targets.to_vec();
        for rep in 0..runs {
            for t in active.clone() {
                if let (0, Some(why)) = (rep, self.cannot(g, &t)) {
                    eprintln!("skipping {} on {}: {why}", g.name(), t.name);
                    self.skipped.push(Skipped { workload: g.workload(), target: t.name.into(), reason: why });
                    active.retain(|a| a.name != t.name);
                    continue;
                }
                eprintln!("{} {}/{runs}: {}", g.name(), rep + 1, t.name);
                if let Err(e) = self.one(g, &t, rep) {
                    check_interrupt()?;
                    eprintln!("{}: dropping {}: {e}", g.name(), t.name);
                    self.samples.retain(|s| !(s.target == t.name && g.owns(s)));
                    self.skipped.push(Skipped {
                        workload: g.workload(),
                        target: t.name.into(),
                        reason: format!("failed in repetition {}: {e}", rep + 1),
                    });
                    active.retain(|a| a.name != t.name);
                }
            }
        }
        Ok(())
    }

    /// An error if ferrofs was asked for io_uring (`-o uring`) but served through /dev/fuse:
    /// the fuse module's `enable_uring` is system-wide, a program that switches it off during
    /// the run makes the next such mount fall back with only a notice in its log, and its
    /// figures would then be /dev/fuse's under the io_uring target's name.
    fn check_rings(&self, m: &Mounted, t: &Target) -> CliResult<()> {
        let asked = t.kind == Kind::FerrofsUring
            || (t.kind == Kind::Ferrofs && t.options.split(',').any(|o| o.split('=').next() == Some("uring")));
        if !asked {
            return Ok(());
        }
        let out = run(Command::new(self.env.ferrofs()?).args(["lockstat", "--journal", "--json"]).arg(m.root()))?;
        let counters: serde_json::Value =
            serde_json::from_str(&out).map_err(|e| Failure::new("ferrofs lockstat --journal --json", e))?;
        match counters["transport_uring"].as_u64() {
            Some(1) => Ok(()),
            _ => Err(Failure::new(
                t.name,
                "served through /dev/fuse, not io_uring (the fuse module's enable_uring was N at mount)",
            )),
        }
    }

    fn size(&self, g: Group) -> Size {
        match g {
            Group::Tree => {
                let c = self.tarball.census;
                Size { files: c.files + c.symlinks, dirs: c.dirs, threads: 1, data_bytes: c.bytes }
            }
            Group::Git => {
                let r = self.repo.as_ref().map_or((0, 0), |r| (r.tracked_files, r.git_bytes));
                Size { files: r.0 * 4, dirs: r.0 / 4, threads: 1, data_bytes: 4 * r.1 }
            }
            Group::Dbench(c) => Size {
                files: c * 1000,
                dirs: c * 50,
                threads: c.min(16) as usize,
                data_bytes: c * DBENCH_BYTES_PER_CLIENT,
            },
            Group::Latency => {
                Size { files: 8, dirs: 1, threads: 1, data_bytes: self.args.writes * WRITE_BYTES as u64 * 4 }
            }
        }
    }

    /// One repetition of group `g` on target `t`, on a fresh mount.
    fn one(&mut self, g: Group, t: &Target, rep: usize) -> CliResult<()> {
        check_interrupt()?;
        let m = t.kind.mount_with(&self.env, &self.size(g), &t.options)?;
        let done = match g {
            Group::Tree => self.tree(&m, t, rep),
            Group::Git => self.git(&m, t, rep),
            Group::Dbench(c) => self.step(&m, t, rep, DBENCH, c, |cx| {
                let d = dbench(cx.env.work_dir(), m.root(), c as usize, cx.args.dbench_seconds)?;
                Ok((d.operations, vec![("mb_per_s", d.mb_per_s), ("max_latency_ms", d.max_latency_ms)]))
            }),
            Group::Latency => self.latency(&m, t, rep),
        };
        let done = done.and_then(|()| self.check_rings(&m, t));
        let unmounted = m.unmount();
        done.and(unmounted)
    }

    /// Run one workload on `m`: `work` returns its operation count and figures; the daemon's
    /// CPU time per operation over it, and its peak RSS so far, are added for FUSE servers.
    fn step(
        &mut self,
        m: &Mounted,
        t: &Target,
        rep: usize,
        workload: &'static str,
        x: u64,
        work: impl FnOnce(&Self) -> CliResult<(u64, Vec<(&'static str, f64)>)>,
    ) -> CliResult<()> {
        let cpu_before = m.daemon_cpu();
        let (ops, mut figures) = work(self)?;
        if let (Some(before), Some(after)) = (cpu_before, m.daemon_cpu()) {
            figures.push(("daemon_cpu_us_per_op", (after - before).as_secs_f64() * 1e6 / ops.max(1) as f64));
        }
        if let Some(rss) = m.daemon_peak_rss() {
            figures.push(("daemon_peak_rss_mib", rss as f64 / (1 << 20) as f64));
        }
        for (metric, value) in figures {
            self.samples.push(Sample { workload, target: t.name, rep, x, metric, value });
        }
        Ok(())
    }

    /// `tar -xf` + syncfs; `cp -a` of the tree to a fresh tmpfs after dropping the page
    /// cache; `rm -rf`.
    fn tree(&mut self, m: &Mounted, t: &Target, rep: usize) -> CliResult<()> {
        let root = m.root();
        let entries = self.tarball.census.entries();
        let tree = root.join(&self.tarball.top);
        self.step(m, t, rep, TAR, 0, |cx| {
            let secs = timed(Command::new("tar").arg("-xf").arg(&cx.tarball.path).arg("-C").arg(root))?
                + timed(Command::new("sync").arg("-f").arg(root))?;
            Ok((entries, vec![("seconds", secs)]))
        })?;
        std::fs::write("/proc/sys/vm/drop_caches", "3")
            .context(|| "drop caches (/proc/sys/vm/drop_caches)".to_string())?;
        let out = Kind::Tmpfs.mount(&self.env, &self.size(Group::Tree))?;
        let copied = self.step(m, t, rep, CP, 0, |_| {
            let secs = timed(Command::new("cp").arg("-a").arg(&tree).arg(out.root()))?;
            Ok((entries, vec![("seconds", secs)]))
        });
        out.unmount()?;
        copied?;
        self.step(m, t, rep, RM, 0, |_| {
            Ok((entries, vec![("seconds", timed(Command::new("rm").arg("-rf").arg(&tree))?)]))
        })
    }

    /// `git clone --no-hardlinks` of the repository, then `git status` and `git log -p` in
    /// the clone.
    fn git(&mut self, m: &Mounted, t: &Target, rep: usize) -> CliResult<()> {
        let Some(repo) = &self.repo else { return Ok(()) };
        let (source, files, commits) = (repo.path.clone(), repo.tracked_files, repo.commits);
        let clone = m.root().join("repo");
        let git = || {
            let mut c = Command::new("git");
            c.args(["-c", "safe.directory=*"]);
            c
        };
        self.step(m, t, rep, CLONE, 0, |_| {
            let secs = timed(git().args(["clone", "-q", "--no-hardlinks"]).arg(&source).arg(&clone))?;
            Ok((files, vec![("seconds", secs)]))
        })?;
        self.step(m, t, rep, STATUS, 0, |_| {
            Ok((files, vec![("seconds", timed(git().arg("-C").arg(&clone).arg("status"))?)]))
        })?;
        self.step(m, t, rep, LOG, 0, |_| {
            Ok((
                commits,
                vec![("seconds", timed(git().arg("-C").arg(&clone).args(["log", "-p", "--output=/dev/null"]))?)],
            ))
        })
    }

    /// 4 KiB `pwrite`s, each timed (with its fdatasync when asked): appending to a new file,
    /// and overwriting the blocks of a file written and synced beforehand (untimed).
    fn latency(&mut self, m: &Mounted, t: &Target, rep: usize) -> CliResult<()> {
        let n = self.args.writes;
        for (i, (workload, datasync, pattern)) in LATENCIES.into_iter().enumerate() {
            let path = m.root().join(format!("latency{i}"));
            self.step(m, t, rep, workload, 0, |_| {
                let what = || path.display().to_string();
                let file = OpenOptions::new().read(true).write(true).create_new(true).open(&path).context(what)?;
                let s = time_writes(&file, pattern, n as usize, datasync).context(what)?;
                Ok((n, vec![("p50_us", report::quantile(&s, 0.5)), ("p99_us", report::quantile(&s, 0.99))]))
            })?;
            std::fs::remove_file(&path).context(|| format!("rm {}", path.display()))?;
        }
        Ok(())
    }
}
