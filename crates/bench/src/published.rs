//! `ferrofs bench published`: reading a published image from 4 read-only mounts, as 4
//! machines would (issue 44). One image of `--files` files of 1-16 KiB in `--dirs`
//! directories is filled here with the engine, published to a local S3-compatible server
//! (scripts/s3-server.sh) with `ferrofs publish`, and read back:
//!
//! - from the image on local disk (one read-only mount, the same 4 readers);
//! - published: 4 mounts of `s3://...` with a chunk cache each, cold (empty caches) and warm
//!   (the same caches, fresh mounts), with each `--delay-ms` added to every GET by a delaying
//!   proxy ([`ferrofs_remote::delay_proxy`]);
//! - the baseline, s3backer + squashfuse over the same server ([`super::published_baseline`]).
//!
//! Each mount reads the files of a disjoint quarter of the directories and checks their
//! SHA-256; a `find` stat walk of the first mount runs beside them. The page cache is dropped
//! before every case. Files/s, the walk's time, bytes fetched against bytes read and the
//! caches' size go to a Markdown table and JSON ([`super::published_report`]).

use super::published_baseline as baseline;
use super::published_report::{self as report, Case, Results, Sample, Source};
use super::seeds::{json, write};
use super::seeds_probe::loadavg;
use super::seeds_results::{Machine, Skipped};
use super::shell::{self, check_interrupt};
use super::targets::start_daemon;
use super::undo::{Stack, Undo};
use super::BenchArgs;
use crate::failure::{CliResult, Context, Failure};
use crate::units::human_bytes;
use clap::Args;
use ferrofs::dev::FileDevice;
use ferrofs::{Cred, FileSystem, MkfsOptions, MountOptions, ROOT_INO};
use ferrofs_cli::programs::FERROFS;
use ferrofs_remote::delay_proxy::DelayProxy;
use ferrofs_remote::store::chunk_hash;
use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};
use std::net::SocketAddr;
use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Read-only mounts of the published image: machines, each reading its quarter.
pub(super) const MOUNTS: usize = 4;
/// File sizes, bytes.
const FILE_BYTES: Range<usize> = 1024..16 * 1024 + 1;
/// Seeds every file's size and content: the same tree on every run and machine.
const SEED: u64 = 44;
/// Reader threads per mount unless `--threads` says otherwise.
const READERS_PER_MOUNT: usize = 4;
/// Threads that fill the image.
const FILL_THREADS: usize = 4;
/// Where the image is published in the server's bucket.
const PREFIX: &str = "bench";
const CRED: Cred = Cred { uid: 0, gid: 0, umask: 0o022 };

#[derive(Args, Debug)]
pub struct PublishedArgs {
    /// published: directories the files are spread over (`--files` gives the files,
    /// default 1,000,000).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub dirs: u64,
    /// published: milliseconds added to every GET from the store, comma-separated; each
    /// delay is a cold and a warm case of the published image and of the baseline.
    #[arg(long, value_delimiter = ',', default_value = "0,20", value_parser = clap::value_parser!(u64).range(0..=10_000))]
    pub delay_ms: Vec<u64>,
}

/// The files: where each is, its size and its SHA-256 (the readers check every one).
pub(super) struct Tree {
    pub files: u64,
    pub dirs: u64,
    sizes: Vec<u32>,
    hashes: Vec<[u8; 32]>,
}

impl Tree {
    fn dir_files(&self, d: u64) -> Range<u64> {
        dir_files(self.files, self.dirs, d)
    }

    fn dir_name(d: u64) -> String {
        format!("d{d}")
    }

    fn file_name(i: u64) -> String {
        format!("f{i}")
    }

    /// File `i`'s bytes: its own seeded generator, so any file can be made again alone.
    fn content(i: u64) -> Vec<u8> {
        let mut rng = StdRng::seed_from_u64(SEED ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let mut data = vec![0u8; rng.gen_range(FILE_BYTES)];
        rng.fill_bytes(&mut data);
        data
    }

    /// Bytes of all files.
    pub fn bytes(&self) -> u64 {
        self.sizes.iter().map(|&s| s as u64).sum()
    }

    /// The directories mount `m` reads, split over `threads` readers: reader `t`'s. A mount
    /// reads a consecutive quarter of the directories, as a node reads its shard of a
    /// dataset; the fill writes neighbouring directories at once, so a quarter's files share
    /// chunks with few of another quarter's.
    fn share(&self, m: usize, t: usize, threads: usize) -> impl Iterator<Item = u64> + '_ {
        crate::names::share(self.dirs as usize, MOUNTS, m).filter(move |d| d % threads == t).map(|d| d as u64)
    }

    /// Read and hash-check the files of `dirs` under `root`; the bytes read.
    fn read_dirs(&self, root: &Path, dirs: impl Iterator<Item = u64>) -> CliResult<u64> {
        let mut bytes = 0;
        for d in dirs {
            check_interrupt()?;
            let dir = root.join(Tree::dir_name(d));
            for i in self.dir_files(d) {
                let path = dir.join(Tree::file_name(i));
                let data = std::fs::read(&path).context(|| format!("read {}", path.display()))?;
                if data.len() != self.sizes[i as usize] as usize || chunk_hash(&data) != self.hashes[i as usize] {
                    return Err(Failure::new(
                        path.display().to_string(),
                        "hash check failed: its content differs from what was written",
                    ));
                }
                bytes += data.len() as u64;
            }
        }
        Ok(bytes)
    }
}

/// A file's size and SHA-256.
type FileSum = (u32, [u8; 32]);
/// A directory's number and its files' sizes and SHA-256.
type DirSums = (u64, Vec<FileSum>);

/// Make the image at `path` and fill it with the engine in this process, `FILL_THREADS`
/// threads taking directories in turn; the tree written. The image is unmounted (its log
/// written home) when this returns.
fn fill(path: &Path, files: u64, dirs: u64) -> CliResult<Tree> {
    let what = || format!("fill {}", path.display());
    // Room for the largest files with 50% to spare (the file is sparse: it costs what is
    // written), and an inode per 8 KiB.
    let size = (files * FILE_BYTES.end as u64 * 3 / 2 + (256 << 20)).div_ceil(1 << 20) << 20;
    let dev = Arc::new(FileDevice::create(path, size).context(what)?);
    ferrofs::mkfs::mkfs(&*dev, &MkfsOptions::default(), &|_, _| {}).context(what)?;
    let fs = FileSystem::mount_device(dev, &MountOptions::default()).context(what)?;
    let next = AtomicU64::new(0);
    let bar = crate::progress::counter(true, files, "filling the image");
    let made: Vec<CliResult<Vec<DirSums>>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..FILL_THREADS)
            .map(|_| {
                s.spawn(|| {
                    let mut out = Vec::new();
                    loop {
                        let d = next.fetch_add(1, Relaxed);
                        if d >= dirs {
                            return Ok(out);
                        }
                        check_interrupt()?;
                        out.push((d, fill_dir(&fs, files, dirs, d).context(what)?));
                        bar.inc(dir_files(files, dirs, d).count() as u64);
                    }
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().expect("a fill thread panicked")).collect()
    });
    bar.finish_and_clear();
    let mut by_dir = Vec::with_capacity(dirs as usize);
    for m in made {
        by_dir.extend(m?);
    }
    fs.unmount().context(what)?;
    by_dir.sort_by_key(|(d, _)| *d);
    let (sizes, hashes) = by_dir.into_iter().flat_map(|(_, f)| f).unzip();
    Ok(Tree { files, dirs, sizes, hashes })
}

/// The files of directory `d` of `dirs`: consecutive numbers, as even a share as can be.
fn dir_files(files: u64, dirs: u64, d: u64) -> Range<u64> {
    (d * files).div_ceil(dirs)..((d + 1) * files).div_ceil(dirs)
}

/// Directory `d` and its files: (size, SHA-256) of each, in order.
fn fill_dir(fs: &FileSystem, files: u64, dirs: u64, d: u64) -> ferrofs::Result<Vec<FileSum>> {
    let dir = fs.mkdir(ROOT_INO, Tree::dir_name(d).as_bytes(), 0o755, CRED)?.ino;
    dir_files(files, dirs, d)
        .map(|i| {
            let data = Tree::content(i);
            let ino = fs.create(dir, Tree::file_name(i).as_bytes(), 0o644, CRED)?.ino;
            fs.write(ino, 0, &data)?;
            Ok((data.len() as u32, chunk_hash(&data)))
        })
        .collect()
}

/// The local S3-compatible server: what its clients need to know.
pub(super) struct Server {
    pub endpoint: String,
    pub bucket: String,
    pub access_key: String,
    pub secret_key: String,
    /// KEY=value lines of `s3-server.sh start`, passed to every `ferrofs` we run.
    env: Vec<(String, String)>,
}

/// scripts/s3-server.sh: from the current directory (a checkout), else from the checkout
/// this program was built in.
fn server_script() -> CliResult<PathBuf> {
    let relative = Path::new("scripts/s3-server.sh");
    let built = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(relative);
    [relative.to_path_buf(), built].into_iter().find(|p| p.is_file()).ok_or_else(|| {
        Failure::new("the S3 test server", "scripts/s3-server.sh not found: run the benchmark from a ferrofs checkout")
    })
}

/// Start the server with its files under `state`; stopped (and its objects deleted) by `stack`.
fn start_server(state: &Path, stack: &mut Stack) -> CliResult<Server> {
    let script = server_script()?;
    let out = shell::run(Command::new(&script).arg("start").arg(state))?;
    stack.push(Undo::Run(vec![script.into(), "stop".into(), state.into()]));
    let env: Vec<(String, String)> =
        out.lines().filter_map(|l| l.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let get = |key: &str| {
        env.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .ok_or_else(|| Failure::new("scripts/s3-server.sh start", format!("printed no {key}")))
    };
    Ok(Server {
        endpoint: get("S3_ENDPOINT")?,
        bucket: get("S3_BUCKET")?,
        access_key: get("AWS_ACCESS_KEY_ID")?,
        secret_key: get("AWS_SECRET_ACCESS_KEY")?,
        env: env.into_iter().filter(|(k, _)| k.starts_with("AWS_")).collect(),
    })
}

impl Server {
    fn address(&self) -> CliResult<SocketAddr> {
        let host = self.endpoint.trim_start_matches("http://").trim_end_matches('/');
        host.parse().map_err(|e| Failure::new(format!("server endpoint {}", self.endpoint), e))
    }
}

/// What every case needs.
pub(super) struct Ctx {
    pub tree: Tree,
    pub work: PathBuf,
    pub image: PathBuf,
    pub server: Server,
    ferrofs: PathBuf,
    readers: usize,
    /// The endpoint for each delay: the server itself, or a proxy in front of it.
    endpoints: Vec<(u64, String)>,
}

impl Ctx {
    pub fn endpoint(&self, delay_ms: u64) -> &str {
        &self.endpoints.iter().find(|(d, _)| *d == delay_ms).expect("a proxy per delay").1
    }

    pub fn mount_dir(&self, m: usize) -> PathBuf {
        self.work.join(format!("m{m}"))
    }

    /// Start `cmd`, a FUSE daemon in the foreground, and wait for its mount on `dir` (made
    /// here); all of it is taken back by `stack`.
    pub fn start_mount(&self, stack: &mut Stack, cmd: Command, dir: &Path, name: &str) -> CliResult<()> {
        std::fs::create_dir_all(dir).context(|| format!("mkdir {}", dir.display()))?;
        stack.push(Undo::Dir(dir.to_path_buf()));
        let log = self.work.join(format!("{name}.log"));
        start_daemon(stack.undos(), cmd, dir, &log, false).map(drop)
    }

    /// `ferrofs mount -o ro[,...] SOURCE DIR`.
    pub fn mount_ferrofs(&self, stack: &mut Stack, source: &Path, options: &str, dir: &Path) -> CliResult<()> {
        let mut cmd = Command::new(&self.ferrofs);
        cmd.arg("mount").arg("-o").arg(options).arg(source).arg(dir).envs(self.server.env.iter().cloned());
        let name = dir.file_name().map_or("mount".into(), |n| n.to_string_lossy().into_owned());
        self.start_mount(stack, cmd, dir, &format!("ferrofs-{name}"))
    }

    fn cache_dir(&self, m: usize) -> PathBuf {
        self.work.join(format!("cache{m}"))
    }

    fn url(&self) -> String {
        format!("s3://{}/{PREFIX}", self.server.bucket)
    }
}

/// Bytes allocated to `path` and everything under it.
pub(super) fn allocated_bytes(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return 0 };
    let own = meta.blocks() * 512;
    if !meta.is_dir() {
        return own;
    }
    let entries = std::fs::read_dir(path).into_iter().flatten().flatten();
    own + entries.map(|e| allocated_bytes(&e.path())).sum::<u64>()
}

/// Write back and drop the page cache, so that every case starts from the device.
fn drop_page_cache() -> CliResult<()> {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
    std::fs::write("/proc/sys/vm/drop_caches", "3").context(|| "drop caches (/proc/sys/vm/drop_caches)".to_string())
}

/// What the readers and the walk of one case did.
pub(super) struct Pass {
    pub seconds: f64,
    pub find_seconds: f64,
    pub bytes_read: u64,
}

impl Ctx {
    /// The 4 quarters read from `roots` (each mount its own; one root serves all 4), every
    /// file's hash checked, beside a `find` stat walk of the first; the walk's entries are
    /// counted.
    pub fn pass(&self, roots: &[PathBuf]) -> CliResult<Pass> {
        check_interrupt()?;
        let started = Instant::now();
        let mut find = Command::new("find");
        find.arg(&roots[0]).args(["-printf", "%s\n"]);
        let (reads, walk) = std::thread::scope(|s| {
            let walk = s.spawn(|| shell::run_timed(vec![find]));
            let readers: Vec<_> = (0..MOUNTS)
                .flat_map(|m| (0..self.readers).map(move |t| (m, t)))
                .map(|(m, t)| {
                    let root = &roots[m % roots.len()];
                    s.spawn(move || self.tree.read_dirs(root, self.tree.share(m, t, self.readers)))
                })
                .collect();
            let reads: Vec<CliResult<u64>> =
                readers.into_iter().map(|r| r.join().expect("a reader panicked")).collect();
            (reads, walk.join().expect("the find thread panicked"))
        });
        let seconds = started.elapsed().as_secs_f64();
        let bytes_read = reads.into_iter().sum::<CliResult<u64>>()?;
        let walk = walk?;
        let entries = walk.stdout[0].lines().count() as u64;
        let want = self.tree.files + self.tree.dirs + 1;
        if entries != want {
            return Err(Failure::new(
                format!("find {}", roots[0].display()),
                format!("walked {entries} entries, not the {want} the tree has"),
            ));
        }
        Ok(Pass { seconds, find_seconds: walk.wall.as_secs_f64(), bytes_read })
    }
}

impl Ctx {
    /// The rest of a case whose mounts `stack` holds: the pass over `roots`, the bytes the
    /// mounts fetched (`fetched`, asked before they go), the caches' size; after a warm case
    /// the caches are removed, their room needed by what follows.
    pub fn finish_case(
        &self,
        stack: Stack,
        roots: &[PathBuf],
        caches: &[PathBuf],
        warm: bool,
        fetched: impl FnOnce() -> CliResult<u64>,
    ) -> CliResult<Sample> {
        let pass = self.pass(roots);
        let fetched = fetched();
        let closed = stack.close();
        let pass = pass?;
        closed?;
        let cache_bytes = caches.iter().map(|c| allocated_bytes(c)).sum();
        if warm {
            remove_caches(caches)?;
        }
        Ok(Sample::new(pass, Some(fetched?), Some(cache_bytes)))
    }
}

/// Remove cache directories or files (a cold case starts without).
pub(super) fn remove_caches(caches: &[PathBuf]) -> CliResult<()> {
    for c in caches {
        let undo = if c.is_dir() { Undo::Tree(c.clone()) } else { Undo::File(c.clone()) };
        undo.undo()?;
    }
    Ok(())
}

pub fn run(args: &BenchArgs) -> CliResult<()> {
    let started = Instant::now();
    let loadavg_start = loadavg();
    let p = &args.published;
    let files = args.files_or(1_000_000);
    if (files as u64) < p.dirs {
        return Err(Failure::new("--files", format!("{files} is fewer than --dirs {}", p.dirs)));
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err(Failure::new("bench published", "needs root (it mounts file systems and drops caches)"));
    }
    let mut delays = p.delay_ms.clone();
    delays.sort_unstable();
    delays.dedup();
    let readers = args.threads_or(&[READERS_PER_MOUNT])?[0];
    let ferrofs = FERROFS.find().map_err(|why| Failure::new("ferrofs", why))?;
    let work = args.disk_dir.join(format!("ferrofs-bench-published-{}", std::process::id()));
    let mut stack = Stack::default();
    std::fs::create_dir(&work).context(|| format!("mkdir {} (--disk-dir)", work.display()))?;
    stack.push(Undo::Tree(work.clone()));
    let server = start_server(&work.join("s3"), &mut stack)?;
    eprintln!("filling {} with {files} files in {} directories", work.join("image").display(), p.dirs);
    let image = work.join("image");
    stack.push(Undo::File(image.clone()));
    let fill_started = Instant::now();
    let tree = fill(&image, files as u64, p.dirs)?;
    let fill_seconds = fill_started.elapsed().as_secs_f64();
    let image_bytes = allocated_bytes(&image);
    // Proxies live as long as the run, each in front of the server.
    let mut proxies = Vec::new();
    let mut endpoints = Vec::new();
    for &d in &delays {
        if d == 0 {
            endpoints.push((0, server.endpoint.clone()));
        } else {
            let proxy = DelayProxy::start(server.address()?, Duration::from_millis(d))
                .context(|| format!("start a proxy delaying GETs by {d} ms"))?;
            endpoints.push((d, proxy.endpoint()));
            proxies.push(proxy);
        }
    }
    let cx = Ctx { tree, work, image, server, ferrofs, readers, endpoints };
    eprintln!("publishing to {}", cx.url());
    let publish_started = Instant::now();
    shell::run(
        Command::new(&cx.ferrofs)
            .arg("publish")
            .arg(&cx.image)
            .arg(cx.url())
            .arg("--endpoint")
            .arg(&cx.server.endpoint)
            .envs(cx.server.env.iter().cloned()),
    )?;
    let publish_seconds = publish_started.elapsed().as_secs_f64();
    let published_bytes = allocated_bytes(&cx.work.join("s3"));
    let mut skipped = Vec::new();
    let squashfs = match baseline::unavailable() {
        Some(why) => {
            eprintln!("skipping the s3backer + squashfuse baseline: {why}");
            skipped.push(Skipped { workload: "baseline", target: baseline::NAME.into(), reason: why });
            None
        }
        None => {
            eprintln!("building the baseline: mksquashfs of the tree into an s3backer-backed file");
            Some(baseline::build(&cx, &mut stack)?)
        }
    };
    let mut cases: Vec<Case> = vec![Case { source: Source::Local, delay_ms: 0, warm: false }];
    let mut sources = vec![Source::Published];
    sources.extend(squashfs.as_ref().map(|_| Source::Squashfs));
    for source in sources {
        for &delay_ms in &delays {
            for warm in [false, true] {
                cases.push(Case { source, delay_ms, warm });
            }
        }
    }
    let mut samples = Vec::new();
    for rep in 0..args.runs as usize {
        for case in &cases {
            eprintln!("run {}/{}: {}", rep + 1, args.runs, case.name());
            drop_page_cache()?;
            let sample = match case.source {
                Source::Local => local(&cx),
                Source::Published => published(&cx, case),
                Source::Squashfs => baseline::measure(&cx, squashfs.as_ref().expect("built above"), case),
            }?;
            eprintln!("  {:.0} files/s, find {:.2} s", cx.tree.files as f64 / sample.seconds, sample.find_seconds);
            samples.push(Sample { case: case.name(), rep, ..sample });
        }
    }
    drop(proxies);
    let results = Results {
        command: super::report::command_line(),
        machine: Machine::now(loadavg_start)?,
        wall_seconds: started.elapsed().as_secs_f64(),
        runs: args.runs as usize,
        files: cx.tree.files,
        dirs: cx.tree.dirs,
        file_bytes: cx.tree.bytes(),
        readers_per_mount: readers,
        image_bytes,
        published_bytes,
        fill_seconds,
        publish_seconds,
        squashfs_bytes: squashfs.as_ref().map(|s| s.bytes),
        cases: cases.iter().map(Case::name).collect(),
        delays_ms: delays,
        skipped,
        samples,
    };
    drop(cx);
    let torn_down = stack.close();
    let markdown = report::markdown(&results);
    print!("{markdown}");
    if let Some(path) = &args.json {
        write(path, &json(&results)?)?;
    }
    if let Some(dir) = &args.workloads.out {
        std::fs::create_dir_all(dir).context(|| format!("mkdir {}", dir.display()))?;
        write(&dir.join("published.json"), &json(&results)?)?;
        write(&dir.join("published.md"), &markdown)?;
        eprintln!("wrote {}/published.md and published.json", dir.display());
    }
    eprintln!("image {}, published {}", human_bytes(results.image_bytes), human_bytes(results.published_bytes));
    torn_down
}

/// The image from local disk: one read-only mount, the 4 quarters' readers all on it.
fn local(cx: &Ctx) -> CliResult<Sample> {
    let mut stack = Stack::default();
    let dir = cx.mount_dir(0);
    cx.mount_ferrofs(&mut stack, &cx.image, "ro", &dir)?;
    let pass = cx.pass(&[dir]);
    stack.close()?;
    Ok(Sample::new(pass?, None, None))
}

/// The published image, 4 mounts with a chunk cache each (emptied first when cold).
fn published(cx: &Ctx, case: &Case) -> CliResult<Sample> {
    let caches: Vec<PathBuf> = (0..MOUNTS).map(|m| cx.cache_dir(m)).collect();
    if !case.warm {
        remove_caches(&caches)?;
    }
    let mut stack = Stack::default();
    let mut roots = Vec::new();
    for (m, cache) in caches.iter().enumerate() {
        let dir = cx.mount_dir(m);
        let options = format!("ro,cache={},endpoint={}", cache.display(), cx.endpoint(case.delay_ms));
        cx.mount_ferrofs(&mut stack, Path::new(&cx.url()), &options, &dir)?;
        roots.push(dir);
    }
    cx.finish_case(stack, &roots, &caches, case.warm, || roots.iter().map(|r| source_counter(r, "bytes_fetched")).sum())
}

/// A counter of a published-image mount, from its control socket's `source` command.
fn source_counter(mountpoint: &Path, name: &str) -> CliResult<u64> {
    let what = || format!("the `source` counters of {}", mountpoint.display());
    let answer = ferrofs_fuse::control_request(mountpoint, "source").context(what)?;
    let v: serde_json::Value = serde_json::from_str(&answer).context(what)?;
    v[name].as_u64().ok_or_else(|| Failure::new(what(), format!("no {name} in {answer}")))
}
