//! `ferrofs bench write`: the latency of one 4 KiB `pwrite` appending to a new file against
//! one overwriting blocks already written, each alone and each followed by an fdatasync,
//! through the engine in this process and through a FUSE mount (`--targets ferrofs`), the
//! image in /dev/shm and on disk (`--disk-dir`). Appending allocates (and grows the size),
//! overwriting does neither: the difference is the cost of the allocating write path.
//!
//! [`time_writes`] is the measurement itself, over anything that can write at an offset and
//! fdatasync ([`WriteTarget`]), for other benchmarks to reuse.

use super::report::{quantile, Figures, Spread};
use super::scratch;
use super::targets::{on_each, Env, Kind, Size};
use super::{BenchArgs, CRED, FILE_MODE};
use crate::failure::{CliResult, Context, Failure};
use ferrofs::{FileSystem, MountOptions, BLOCK_SIZE, ROOT_INO};
use serde::Serialize;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Bytes of each timed write.
pub const WRITE_BYTES: usize = 4096;
/// Writes per case and run without fdatasync (`--files` overrides); a quarter of that with
/// one, which on disk waits for the device each time.
const DEFAULT_WRITES: u64 = 4000;
const SYNCED_SHARE: usize = 4;

/// What is written where.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Block after block from offset 0 of a new, empty file.
    Append,
    /// The same blocks of a file whose blocks were written (and made durable) beforehand.
    Overwrite,
}

/// Something 4 KiB writes can go to: an open file through system calls, or an engine's file.
pub trait WriteTarget {
    fn write_at(&self, data: &[u8], off: u64) -> io::Result<()>;
    fn datasync(&self) -> io::Result<()>;
}

impl WriteTarget for File {
    fn write_at(&self, data: &[u8], off: u64) -> io::Result<()> {
        self.write_all_at(data, off)
    }

    fn datasync(&self) -> io::Result<()> {
        self.sync_data()
    }
}

/// File `ino` of an engine in this process.
pub struct EngineFile<'a> {
    pub fs: &'a FileSystem,
    pub ino: u64,
}

fn to_io(e: ferrofs::Error) -> io::Error {
    io::Error::from_raw_os_error(e.errno())
}

impl WriteTarget for EngineFile<'_> {
    fn write_at(&self, data: &[u8], off: u64) -> io::Result<()> {
        self.fs.write(self.ino, off, data).map(drop).map_err(to_io)
    }

    fn datasync(&self) -> io::Result<()> {
        self.fs.fsync(self.ino, true).map_err(to_io)
    }
}

/// Time `count` writes of [`WRITE_BYTES`] at offsets 0, 4 KiB, 8 KiB ... of `file`, which
/// must be empty: for `Overwrite` those blocks are written and fdatasync'd first, untimed.
/// `datasync`: each timed write is followed by an fdatasync, timed with it. Returns the
/// latencies in microseconds, sorted.
pub fn time_writes(file: &dyn WriteTarget, pattern: Pattern, count: usize, datasync: bool) -> io::Result<Vec<f64>> {
    let data = vec![0x5au8; WRITE_BYTES];
    let offset = |i: usize| (i * WRITE_BYTES) as u64;
    if pattern == Pattern::Overwrite {
        for i in 0..count {
            file.write_at(&data, offset(i))?;
        }
        file.datasync()?;
    }
    let mut latencies = Vec::with_capacity(count);
    for i in 0..count {
        let started = Instant::now();
        file.write_at(&data, offset(i))?;
        if datasync {
            file.datasync()?;
        }
        latencies.push(started.elapsed().as_secs_f64() * 1e6);
    }
    latencies.sort_by(f64::total_cmp);
    Ok(latencies)
}

#[derive(Serialize)]
pub struct WriteFigures {
    pub writes_per_case: usize,
    pub synced_writes_per_case: usize,
    pub cases: Vec<Case>,
}

/// One setting over all runs.
#[derive(Serialize)]
pub struct Case {
    /// `engine` (in this process) or `mount` (ferrofs through FUSE).
    pub through: &'static str,
    /// Where the image file was.
    pub image_dir: PathBuf,
    pub fdatasync: bool,
    pub append: Latency,
    pub overwrite: Latency,
    /// Median append p50 over median overwrite p50.
    pub p50_ratio: f64,
}

/// Microseconds per write (with its fdatasync, if any), per run.
#[derive(Serialize)]
pub struct Latency {
    pub p50_us: Spread,
    pub p99_us: Spread,
}

impl Latency {
    fn of(runs: &[Vec<f64>]) -> Latency {
        let at = |q: f64| Spread::of(&runs.iter().map(|r| quantile(r, q)).collect::<Vec<_>>());
        Latency { p50_us: at(0.5), p99_us: at(0.99) }
    }
}

impl Figures for WriteFigures {
    fn print(&self) {
        println!(
            "4 KiB pwrite, {} writes per case and run ({} with fdatasync), microseconds:",
            self.writes_per_case, self.synced_writes_per_case
        );
        let us = |v: f64| format!("{v:.1}");
        for c in &self.cases {
            println!(
                "  {:<6} {:<12} {:<10} append p50 {} p99 {} | overwrite p50 {} p99 {} | append/overwrite p50 {:.2}",
                c.through,
                c.image_dir.display(),
                if c.fdatasync { "fdatasync" } else { "no sync" },
                c.append.p50_us.cell(us),
                c.append.p99_us.cell(us),
                c.overwrite.p50_us.cell(us),
                c.overwrite.p99_us.cell(us),
                c.p50_ratio
            );
        }
        println!();
    }
}

/// Latencies of one run: [datasync][pattern].
type RunLatencies = [[Vec<f64>; 2]; 2];

const PATTERNS: [Pattern; 2] = [Pattern::Append, Pattern::Overwrite];

/// Each case on one file system: `create(name)` makes an empty file there.
fn one_run<F: WriteTarget>(writes: usize, mut create: impl FnMut(&str) -> CliResult<F>) -> CliResult<RunLatencies> {
    let mut out = RunLatencies::default();
    for (synced, row) in out.iter_mut().enumerate() {
        let count = if synced == 1 { writes / SYNCED_SHARE } else { writes };
        for (pattern, cell) in PATTERNS.iter().zip(row.iter_mut()) {
            let name = format!("write.{pattern:?}.{synced}");
            let file = create(&name)?;
            *cell = time_writes(&file, *pattern, count, synced == 1).context(|| format!("write {name}"))?;
        }
    }
    Ok(out)
}

fn case(through: &'static str, image_dir: &Path, runs: &[RunLatencies]) -> Vec<Case> {
    (0..2)
        .map(|synced| {
            let of = |p: usize| Latency::of(&runs.iter().map(|r| r[synced][p].clone()).collect::<Vec<_>>());
            let (append, overwrite) = (of(0), of(1));
            Case {
                through,
                image_dir: image_dir.to_path_buf(),
                fdatasync: synced == 1,
                p50_ratio: append.p50_us.median / overwrite.p50_us.median,
                append,
                overwrite,
            }
        })
        .collect()
}

/// A fresh image in `dir`, mounted in this process, with every case run on it.
fn engine_run(dir: &Path, writes: usize) -> CliResult<RunLatencies> {
    let bytes = scratch::image_size(0).max((writes * WRITE_BYTES * 8) as u64);
    let path = dir.join(format!("ferrofs-bench-write-{}.img", std::process::id()));
    let image = scratch::create(Some(&path), false, bytes, scratch::mkfs_options(1))?;
    let fs = FileSystem::mount_device(image.dev.clone(), &MountOptions::default())
        .context(|| "mount the benchmark image".to_string())?;
    let result = one_run(writes, |name| {
        let attr = fs.create(ROOT_INO, name.as_bytes(), FILE_MODE, CRED).context(|| format!("create {name}"))?;
        Ok(EngineFile { fs: &fs, ino: attr.ino })
    });
    fs.unmount().context(|| "unmount the benchmark image".to_string())?;
    result
}

pub fn run(args: &BenchArgs) -> CliResult<()> {
    let writes = args.files.unwrap_or(DEFAULT_WRITES) as usize;
    if writes < SYNCED_SHARE {
        return Err(Failure::new("--files", format!("at least {SYNCED_SHARE} writes per case")));
    }
    if let Some(other) = args.fsmark.targets.iter().find(|&&t| t != Kind::Ferrofs) {
        return Err(Failure::new("--targets", format!("write measures ferrofs only, not {}", other.name())));
    }
    let dirs = [PathBuf::from("/dev/shm"), args.disk_dir.clone()];
    let mounted = !args.fsmark.targets.is_empty();
    let (mut engine, mut mount): (Vec<Vec<RunLatencies>>, Vec<Vec<RunLatencies>>) = Default::default();
    engine.resize_with(dirs.len(), Vec::new);
    mount.resize_with(dirs.len(), Vec::new);
    // Runs alternate the settings, so that a change in the machine's load spreads over all.
    for run in 0..args.runs {
        for (d, dir) in dirs.iter().enumerate() {
            eprintln!("write: run {} of {}, engine, image in {}", run + 1, args.runs, dir.display());
            engine[d].push(engine_run(dir, writes)?);
            if mounted {
                let mut env = Env::new(&args.fsmark)?;
                env.set_image_dir(dir);
                let size = Size { files: 4, dirs: 1, threads: 1, data_bytes: (writes * WRITE_BYTES * 4) as u64 };
                let measured = on_each(&[Kind::Ferrofs], &env, &size, "write", |root| {
                    one_run(writes, |name| {
                        let path = root.join(name);
                        File::create(&path).context(|| format!("create {}", path.display()))
                    })
                })?;
                mount[d].extend(measured.into_iter().map(|(_, r)| r));
            }
        }
    }
    let mut cases = Vec::new();
    for (d, dir) in dirs.iter().enumerate() {
        cases.extend(case("engine", dir, &engine[d]));
        if !mount[d].is_empty() {
            cases.extend(case("mount", dir, &mount[d]));
        }
    }
    let figures = WriteFigures { writes_per_case: writes, synced_writes_per_case: writes / SYNCED_SHARE, cases };
    println!("ferrofs bench write: {} runs, {} bytes per block: median [min-max]\n", args.runs, BLOCK_SIZE);
    figures.print();
    super::write_json(args, &figures)
}
