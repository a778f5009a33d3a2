//! `ferrofs bench commit`: how many transactions per second commit into the CIL. Each
//! thread changes the mode of its own files, round robin: one small inode change per
//! transaction, nothing written to the device (the CIL relogs each inode in place; the
//! background checkpoint runs on its timer as usual).

use super::phase::{timed, Timing};
use super::report::{Figures, Spread};
use super::session::Session;
use super::{scratch, BenchArgs, CRED, DIR_MODE, FILE_MODE};
use crate::failure::{CliResult, Context, Failure};
use crate::units::grouped;
use ferrofs::ROOT_INO;
use ferrofs::{FileSystem, SetAttr};
use serde::Serialize;

#[derive(Serialize)]
pub struct CommitFigures {
    pub files_per_thread: usize,
    pub commits_per_thread: u64,
    pub rows: Vec<CommitRow>,
}

#[derive(Serialize)]
pub struct CommitRow {
    pub threads: usize,
    /// Journal commits counted by the engine over each run, per second of wall time.
    pub commits_per_sec: Spread,
    /// CPU time of the whole process per commit (microseconds).
    pub cpu_us_per_commit: Spread,
}

pub fn run(args: &BenchArgs) -> CliResult<()> {
    let threads = args.threads_or(&[1, 2])?;
    let files = args.files_or(16);
    let max_threads = threads.iter().copied().max().unwrap_or(1);
    let session = Session::open(args, (files * max_threads) as u64, scratch::mkfs_options(max_threads))?;
    let inos = make_files(&session.fs, max_threads, files)?;
    let mut rows = Vec::new();
    for &t in &threads {
        let (mut rates, mut cpu) = (Vec::new(), Vec::new());
        for _ in 0..args.runs {
            let before = session.fs.stats().journal.commits;
            let time = one_run(&session.fs, &inos[..t], args.commits)?;
            let commits = session.fs.stats().journal.commits - before;
            rates.push(commits as f64 / time.wall.as_secs_f64());
            cpu.push(time.cpu.as_secs_f64() * 1e6 / commits.max(1) as f64);
        }
        rows.push(CommitRow { threads: t, commits_per_sec: Spread::of(&rates), cpu_us_per_commit: Spread::of(&cpu) });
    }
    session.finish("commit", args, CommitFigures { files_per_thread: files, commits_per_thread: args.commits, rows })
}

/// A directory per thread with `files` files in it; their inode numbers, per thread.
fn make_files(fs: &FileSystem, threads: usize, files: usize) -> CliResult<Vec<Vec<u64>>> {
    (0..threads)
        .map(|t| {
            let dir = fs
                .mkdir(ROOT_INO, format!("commit.{t}").as_bytes(), DIR_MODE, CRED)
                .context(|| format!("mkdir commit.{t}"))?
                .ino;
            (0..files)
                .map(|f| {
                    fs.create(dir, format!("f{f}").as_bytes(), FILE_MODE, CRED)
                        .map(|a| a.ino)
                        .context(|| format!("create commit.{t}/f{f}"))
                })
                .collect()
        })
        .collect()
}

/// Each thread commits `commits` mode changes to its files, round robin.
fn one_run(fs: &FileSystem, inos: &[Vec<u64>], commits: u64) -> CliResult<Timing> {
    let modes =
        [SetAttr { mode: Some(0o600), ..SetAttr::default() }, SetAttr { mode: Some(FILE_MODE), ..SetAttr::default() }];
    timed(
        "commit",
        inos.len(),
        |t| {
            let mine = &inos[t];
            for i in 0..commits as usize {
                let ino = mine[i % mine.len()];
                fs.setattr(ino, &modes[(i / mine.len()) % 2])
                    .map_err(|e| Failure::new(format!("setattr of inode {ino}"), e))?;
            }
            Ok(())
        },
        || Ok(()),
    )
}

impl Figures for CommitFigures {
    fn print(&self) {
        println!(
            "commit: each thread changes the mode of its own {} files, {} commits per thread per run",
            self.files_per_thread,
            grouped(self.commits_per_thread)
        );
        println!("{:>7} {:>36} {:>24}", "threads", "commits/s", "CPU us/commit");
        for r in &self.rows {
            println!(
                "{:>7} {:>36} {:>24}",
                r.threads,
                r.commits_per_sec.cell(|v| grouped(v as u64)),
                r.cpu_us_per_commit.cell(|v| format!("{v:.2}"))
            );
        }
    }
}
