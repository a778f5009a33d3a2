//! `ferrofs bench orphan`: seed 000's workload. P threads each truncate their own 4 KiB file
//! by one byte at a time down to 1 byte, then extend it back to 4096, for R rounds; the wall
//! time per P, with orphan tracking on and off (off is a benchmark-only switch that keeps
//! every inode off the orphan tables: unsafe for real use). The two settings alternate run
//! by run on the same mount, so drift in the machine's load hits both alike.

use super::phase::timed;
use super::report::{Figures, Spread};
use super::session::Session;
use super::{scratch, BenchArgs, CRED, DIR_MODE, FILE_MODE};
use crate::failure::{CliResult, Context, Failure};
use crate::units::grouped;
use ferrofs::{FileSystem, SetAttr};
use ferrofs::{BLOCK_SIZE, ROOT_INO};
use serde::Serialize;

const FILE_BYTES: u64 = BLOCK_SIZE as u64;

#[derive(Serialize)]
pub struct OrphanFigures {
    pub rounds: u64,
    pub rows: Vec<OrphanRow>,
}

#[derive(Serialize)]
pub struct OrphanRow {
    pub threads: usize,
    /// setattr(size) calls per run, all threads.
    pub truncates: u64,
    pub seconds_tracking_on: Spread,
    pub seconds_tracking_off: Spread,
    /// Median time with tracking on over median time with it off.
    pub on_off_ratio: f64,
    /// Orphan-table adds committed over all runs of each setting.
    pub orphan_adds_on: u64,
    pub orphan_adds_off: u64,
}

pub fn run(args: &BenchArgs) -> CliResult<()> {
    let threads = args.threads_or(&[1, 2, 4, 10, 20, 40])?;
    let max_threads = threads.iter().copied().max().unwrap_or(1);
    let session = Session::open(args, 2 * max_threads as u64, scratch::mkfs_options(max_threads))?;
    let fs = &session.fs;
    let inos = make_files(fs, max_threads)?;
    let mut rows = Vec::new();
    for &p in &threads {
        let (mut on, mut off) = (Vec::new(), Vec::new());
        let (mut adds_on, mut adds_off) = (0, 0);
        for run in 0..args.runs {
            // Alternate which setting goes first.
            for tracking in [run % 2 == 0, run % 2 != 0] {
                fs.set_orphan_tracking_unsafe(tracking);
                let adds = session.orphan_adds();
                let secs = one_run(fs, &inos[..p], args.rounds)?;
                let adds = session.orphan_adds() - adds;
                if tracking {
                    on.push(secs);
                    adds_on += adds;
                } else {
                    off.push(secs);
                    adds_off += adds;
                }
            }
        }
        fs.set_orphan_tracking_unsafe(true);
        let (on, off) = (Spread::of(&on), Spread::of(&off));
        rows.push(OrphanRow {
            threads: p,
            truncates: p as u64 * args.rounds * FILE_BYTES,
            on_off_ratio: on.median / off.median,
            seconds_tracking_on: on,
            seconds_tracking_off: off,
            orphan_adds_on: adds_on,
            orphan_adds_off: adds_off,
        });
    }
    session.finish("orphan", args, OrphanFigures { rounds: args.rounds, rows })
}

/// One file of 4096 written bytes per thread, each in a directory of its own.
pub(super) fn make_files(fs: &FileSystem, threads: usize) -> CliResult<Vec<u64>> {
    let data = vec![0x5a; FILE_BYTES as usize];
    (0..threads)
        .map(|t| {
            let what = || format!("make orphan.{t}/file");
            let dir = fs.mkdir(ROOT_INO, format!("orphan.{t}").as_bytes(), DIR_MODE, CRED).context(what)?.ino;
            let ino = fs.create(dir, b"file", FILE_MODE, CRED).context(what)?.ino;
            fs.write(ino, 0, &data).context(what)?;
            Ok(ino)
        })
        .collect()
}

/// Wall seconds for every thread to do `rounds` rounds on its file.
pub(super) fn one_run(fs: &FileSystem, inos: &[u64], rounds: u64) -> CliResult<f64> {
    let time = timed(
        "orphan",
        inos.len(),
        |t| {
            let ino = inos[t];
            let truncate = |size| {
                fs.setattr(ino, &SetAttr { size: Some(size), ..SetAttr::default() })
                    .map_err(|e| Failure::new(format!("truncate inode {ino} to {size}"), e))
            };
            for _ in 0..rounds {
                for size in (1..FILE_BYTES).rev() {
                    truncate(size)?;
                }
                truncate(FILE_BYTES)?;
            }
            Ok(())
        },
        || Ok(()),
    )?;
    Ok(time.wall.as_secs_f64())
}

impl Figures for OrphanFigures {
    fn print(&self) {
        println!("orphan: each thread truncates its own 4 KiB file by one byte down to 1, then back to 4096; {} rounds; wall seconds", self.rounds);
        println!(
            "{:>7} {:>12} {:>26} {:>26} {:>8} {:>12} {:>12}",
            "threads", "truncates", "tracking on", "tracking off", "on/off", "adds (on)", "adds (off)"
        );
        for r in &self.rows {
            let secs = |v: f64| format!("{v:.3}");
            println!(
                "{:>7} {:>12} {:>26} {:>26} {:>8.3} {:>12} {:>12}",
                r.threads,
                grouped(r.truncates),
                r.seconds_tracking_on.cell(secs),
                r.seconds_tracking_off.cell(secs),
                r.on_off_ratio,
                grouped(r.orphan_adds_on),
                grouped(r.orphan_adds_off)
            );
        }
    }
}
