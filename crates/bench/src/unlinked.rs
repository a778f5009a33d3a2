//! `ferrofs bench unlinked`: open N files, unlink them all while open (each goes on its AG's
//! orphan table), then close them all: each last close frees the inode and takes it off the
//! orphan table. The close phase is the figure; create and unlink are reported too.

use super::names::{self, NameTable};
use super::phase::timed;
use super::report::{Figures, Spread};
use super::session::Session;
use super::{scratch, BenchArgs, CRED, DIR_MODE, FILE_MODE};
use crate::failure::{CliResult, Context, Failure};
use crate::units::grouped;
use ferrofs::{FileSystem, ROOT_INO};
use serde::Serialize;
use std::time::Instant;

#[derive(Serialize)]
pub struct UnlinkedFigures {
    pub files: usize,
    pub create_seconds: Spread,
    pub unlink_seconds: Spread,
    pub close_seconds: Spread,
    /// Orphan-table adds committed per run (one per unlinked open file).
    pub orphan_adds_per_run: Vec<u64>,
}

pub fn run(args: &BenchArgs) -> CliResult<()> {
    let files = args.files_or(200_000);
    let mut opts = scratch::mkfs_options(1);
    // Every file may be an open orphan at once: one orphan slot per inode.
    opts.inodes_per_orphan_slot = 1;
    let session = Session::open(args, files as u64, opts)?;
    let names = NameTable::new(files);
    let (mut create, mut unlink, mut close, mut adds) = (vec![], vec![], vec![], vec![]);
    for run in 0..args.runs {
        let before = session.orphan_adds();
        let [c, u, r] = one_run(&session.fs, &names, run)?;
        adds.push(session.orphan_adds() - before);
        create.push(c);
        unlink.push(u);
        close.push(r);
    }
    let figures = UnlinkedFigures {
        files,
        create_seconds: Spread::of(&create),
        unlink_seconds: Spread::of(&unlink),
        close_seconds: Spread::of(&close),
        orphan_adds_per_run: adds,
    };
    session.finish("unlinked", args, figures)
}

/// Seconds to create and open, unlink, and close every file. The files are spread over one
/// directory per AG (new directories rotate over the AGs), so every AG's orphan table works.
fn one_run(fs: &FileSystem, names: &NameTable, run: u64) -> CliResult<[f64; 3]> {
    let ags = fs.info().superblock.geo.ag_count as usize;
    let dir_name = |d: usize| format!("unlinked.{run}.{d}");
    let dirs: Vec<u64> = (0..ags)
        .map(|d| {
            fs.mkdir(ROOT_INO, dir_name(d).as_bytes(), DIR_MODE, CRED)
                .map(|a| a.ino)
                .context(|| format!("mkdir {}", dir_name(d)))
        })
        .collect::<CliResult<_>>()?;
    let shares =
        || dirs.iter().enumerate().flat_map(|(d, &dir)| names::share(names.len(), ags, d).map(move |i| (dir, i)));
    let fail = |what: &'static str, i: usize| {
        let name = String::from_utf8_lossy(names.get(i)).into_owned();
        move |e| Failure::new(format!("{what} {name}"), e)
    };
    let free_before = fs.statfs().ffree;
    let started = Instant::now();
    let mut inos = Vec::with_capacity(names.len());
    for (dir, i) in shares() {
        let ino = fs.create(dir, names.get(i), FILE_MODE, CRED).map_err(fail("create", i))?.ino;
        fs.open(ino).map_err(fail("open", i))?;
        inos.push(ino);
    }
    let create = started.elapsed().as_secs_f64();
    let started = Instant::now();
    for (dir, i) in shares() {
        fs.unlink(dir, names.get(i)).map_err(fail("unlink", i))?;
    }
    let unlink = started.elapsed().as_secs_f64();
    let close = timed(
        "close",
        1,
        |_| {
            for &ino in &inos {
                fs.release(ino).map_err(|e| Failure::new(format!("close inode {ino}"), e))?;
            }
            Ok(())
        },
        || Ok(()),
    )?;
    check_all_freed(fs, free_before)?;
    for d in 0..ags {
        fs.rmdir(ROOT_INO, dir_name(d).as_bytes()).context(|| format!("rmdir {}", dir_name(d)))?;
    }
    Ok([create, unlink, close.wall.as_secs_f64()])
}

/// The closes really freed every inode and emptied every orphan table.
fn check_all_freed(fs: &FileSystem, free_before: u64) -> CliResult<()> {
    let (free, orphans) = (fs.statfs().ffree, fs.stats().ags.iter().map(|ag| ag.orphans).sum::<u64>());
    if free != free_before || orphans != 0 {
        return Err(Failure::new(
            "unlinked",
            format!(
                "after the closes {free} inodes are free (before: {free_before}) and {orphans} remain on orphan tables"
            ),
        ));
    }
    Ok(())
}

impl Figures for UnlinkedFigures {
    fn print(&self) {
        let secs = |v: f64| format!("{v:.3}");
        println!("unlinked: {} files, one thread: seconds", grouped(self.files as u64));
        println!("  create and open:      {}", self.create_seconds.cell(secs));
        println!("  unlink while open:    {}", self.unlink_seconds.cell(secs));
        println!(
            "  close (frees inodes): {}  ({:.2} us per file, median)",
            self.close_seconds.cell(secs),
            self.close_seconds.median * 1e6 / self.files as f64
        );
        let adds: Vec<String> = self.orphan_adds_per_run.iter().map(|&a| grouped(a)).collect();
        println!("  orphan-table adds per run: {}", adds.join(", "));
    }
}
