//! File systems to measure side by side, each set up and torn down on this machine: ferrofs
//! through FUSE (this binary's `mount`, a separate process), fuse2fs, kernel ext4, XFS and
//! btrfs on loop images, tmpfs, minifuse (the FUSE ceiling from the shared peers
//! directory) and libfuse's passthrough_ll over tmpfs (the FUSE ceiling for data).
//!
//! Every FUSE daemon runs the same way, a child of the benchmark in the foreground, so that
//! the scheduler treats them alike: in the benchmark's session, beside the workload's
//! processes, by default; each in a session of its own with [`Env::detached`]. The two
//! differ where the kernel groups each session's threads for fair CPU shares (autogroup):
//! a detached daemon gets about half of the machine against the workload's processes,
//! whatever its thread count; an attached one competes thread by thread. minifuse removes
//! files a third faster attached, ferrofs at the same rate either way, so a daemon started
//! one way never stands against a peer started the other.
//!
//! A workload is a function over a mounted directory ([`Mounted::root`]); a benchmark walks
//! a list of [`Kind`]s, asks each whether it can run here ([`Kind::unavailable`]: a reason to
//! skip, never a failure), mounts it ([`Kind::mount`]) and unmounts it ([`Mounted::unmount`]).
//! Everything a set-up creates — image files, loop devices, mounts, daemons, directories — is
//! pushed on an undo stack as it is made; the stack unwinds in reverse on unmount, on any
//! error half-way through a set-up, on a panic and (with [`super::shell::catch_interrupts`])
//! on Ctrl-C.

use super::scratch;
use super::shell::{self, check_interrupt, describe, run};
use super::undo::{is_mounted, undo_all, unescape, Undo};
use crate::failure::{CliResult, Context, Failure};
use clap::{Args, ValueEnum};
use ferrofs::BLOCK_SIZE;
use ferrofs_cli::programs::FERROFS;
use serde::Serialize;
use std::cell::OnceCell;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How long a FUSE daemon may take to mount, and to exit (or let go of its image) after
/// its unmount.
pub(super) const DAEMON_WAIT: Duration = Duration::from_secs(60);
/// Between polls of /proc while waiting for a mount to appear or a lock to go.
const POLL: Duration = Duration::from_millis(10);
/// Loop images (kernel file systems, fuse2fs) are sparse files in /dev/shm: only what a file
/// system writes takes memory. At least this big (XFS and btrfs have minimum sizes) ...
const MIN_IMAGE_BYTES: u64 = 2 << 30;
/// ... and this much space per file of the workload.
const IMAGE_BYTES_PER_FILE: u64 = 16 << 10;
/// ext4 (kernel and fuse2fs) makes its inode table at mkfs time: this many inodes per file
/// of the workload (plus directories), so the table never limits a run.
const EXT4_INODES_PER_FILE: u64 = 2;
const EXT4_MIN_INODES: u64 = 65_536;
/// Environment variable naming the directory that holds `minifuse.c`.
pub const PEERS_ENV: &str = "FERROFS_PEERS";
const MINIFUSE_SOURCE: &str = "minifuse.c";
/// libfuse's own example server, as the distribution ships it (libfuse3-dev).
const PASSTHROUGH_SOURCE: &str = "/usr/share/doc/libfuse3-dev/examples/passthrough_ll.c";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// `ferrofs mount` on a fresh image in /dev/shm.
    Ferrofs,
    /// As `ferrofs`, served through FUSE-over-io_uring rings (`-o uring`); needs the fuse
    /// module's `enable_uring` on.
    #[value(name = "ferrofs-uring")]
    #[serde(rename = "ferrofs-uring")]
    FerrofsUring,
    /// minifuse.c: in-memory libfuse3 low-level server, the FUSE ceiling.
    Minifuse,
    /// ferrofs-nullfs: names in memory, no engine, through /dev/fuse (fuser's loops).
    Null,
    /// ferrofs-nullfs through FUSE-over-io_uring rings: the ceiling of that transport.
    #[value(name = "null-uring")]
    #[serde(rename = "null-uring")]
    NullUring,
    /// fuse2fs on an ext4 image in /dev/shm.
    Fuse2fs,
    /// Kernel ext4 on a loop image in /dev/shm.
    Ext4,
    /// Kernel XFS on a loop image in /dev/shm.
    Xfs,
    /// Kernel btrfs on a loop image in /dev/shm.
    Btrfs,
    Tmpfs,
    /// libfuse's passthrough_ll example over a tmpfs: the FUSE ceiling for data.
    #[value(name = "passthrough_ll")]
    #[serde(rename = "passthrough_ll")]
    Passthrough,
}

impl Kind {
    /// The peers of `fsmark` and `seeds` (`workloads` picks its own).
    pub const ALL: [Kind; 7] =
        [Kind::Ferrofs, Kind::Minifuse, Kind::Fuse2fs, Kind::Ext4, Kind::Xfs, Kind::Btrfs, Kind::Tmpfs];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Ferrofs => "ferrofs",
            Kind::FerrofsUring => "ferrofs-uring",
            Kind::Minifuse => "minifuse",
            Kind::Null => "null",
            Kind::NullUring => "null-uring",
            Kind::Fuse2fs => "fuse2fs",
            Kind::Ext4 => "ext4",
            Kind::Xfs => "xfs",
            Kind::Btrfs => "btrfs",
            Kind::Tmpfs => "tmpfs",
            Kind::Passthrough => "passthrough_ll",
        }
    }

    /// What it is, for report headers.
    pub fn description(self) -> &'static str {
        match self {
            Kind::Ferrofs => "ferrofs through FUSE (ferrofs mount), image in /dev/shm",
            Kind::FerrofsUring => "ferrofs through FUSE over io_uring (ferrofs mount -o uring), image in /dev/shm",
            Kind::Minifuse => "minifuse, in-memory libfuse3 server (FUSE ceiling)",
            Kind::Null => "ferrofs-nullfs through /dev/fuse: names in memory, no engine (ceiling of /dev/fuse)",
            Kind::NullUring => {
                "ferrofs-nullfs through io_uring rings: names in memory, no engine (ceiling of the rings)"
            }
            Kind::Fuse2fs => "fuse2fs, user-space ext4, image in /dev/shm",
            Kind::Ext4 => "kernel ext4, loop image in /dev/shm",
            Kind::Xfs => "kernel XFS, loop image in /dev/shm",
            Kind::Btrfs => "kernel btrfs, loop image in /dev/shm",
            Kind::Tmpfs => "tmpfs",
            Kind::Passthrough => "libfuse passthrough_ll over tmpfs (FUSE ceiling for data)",
        }
    }

    /// Whether it is served by a user-space daemon through /dev/fuse.
    pub fn is_fuse(self) -> bool {
        matches!(
            self,
            Kind::Ferrofs
                | Kind::FerrofsUring
                | Kind::Minifuse
                | Kind::Null
                | Kind::NullUring
                | Kind::Fuse2fs
                | Kind::Passthrough
        )
    }

    /// Whether it is a ferrofs mount (with a control socket to ask).
    pub fn is_ferrofs(self) -> bool {
        matches!(self, Kind::Ferrofs | Kind::FerrofsUring)
    }

    /// Programs its set-up runs.
    fn programs(self) -> &'static [&'static str] {
        match self {
            Kind::Ferrofs | Kind::FerrofsUring | Kind::Null | Kind::NullUring => &["umount"],
            Kind::Minifuse => &["gcc", "pkg-config", "umount"],
            Kind::Fuse2fs => &["fuse2fs", "mkfs.ext4", "umount"],
            Kind::Ext4 => &["losetup", "mkfs.ext4", "mount", "umount"],
            Kind::Xfs => &["losetup", "mkfs.xfs", "mount", "umount"],
            Kind::Btrfs => &["losetup", "mkfs.btrfs", "mount", "umount"],
            Kind::Tmpfs => &["mount", "umount"],
            Kind::Passthrough => &["cc", "pkg-config", "mount", "umount"],
        }
    }

    /// Why it cannot be set up on this machine, if it cannot (checked before any set-up).
    pub fn unavailable(self, env: &Env) -> Option<String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Some("needs root (mount, loop devices)".into());
        }
        if let Some(p) = self.programs().iter().find(|p| !shell::have(p)) {
            return Some(format!("{p} not found"));
        }
        if self.is_fuse() && !Path::new("/dev/fuse").exists() {
            return Some("no /dev/fuse".into());
        }
        match self {
            Kind::Ext4 | Kind::Xfs | Kind::Btrfs => {
                if !Path::new("/dev/loop-control").exists() {
                    return Some("no loop devices (/dev/loop-control)".into());
                }
                if !kernel_has(self.name()) {
                    return Some(format!("the kernel has no {} support", self.name()));
                }
            }
            Kind::Ferrofs | Kind::FerrofsUring | Kind::Null | Kind::NullUring => {
                let program = if self.is_ferrofs() { &env.ferrofs } else { &env.nullfs };
                if let Err(why) = program {
                    return Some(why.clone());
                }
                // The parameter is system-wide: a benchmark does not switch it.
                let uring = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring");
                if matches!(self, Kind::FerrofsUring | Kind::NullUring) && uring.map_or(true, |v| v.trim() != "Y") {
                    return Some("FUSE over io_uring is off (as root: echo Y > /sys/module/fuse/parameters/enable_uring, a system-wide setting)".into());
                }
            }
            Kind::Minifuse => {
                if let Err(why) = env.minifuse_source() {
                    return Some(why);
                }
                return fuse3_missing();
            }
            Kind::Passthrough => {
                if !Path::new(PASSTHROUGH_SOURCE).is_file() {
                    return Some(format!("{PASSTHROUGH_SOURCE} not found (libfuse3-dev)"));
                }
                return fuse3_missing();
            }
            _ => {}
        }
        None
    }

    /// Make, mount and return it, ready for `size`'s workload. On failure everything made so
    /// far is undone.
    pub fn mount(self, env: &Env, size: &Size) -> CliResult<Mounted> {
        self.mount_with(env, size, "")
    }

    /// As [`Kind::mount`], with `extra` mount options (comma-separated) after those the
    /// environment gives this kind.
    pub fn mount_with(self, env: &Env, size: &Size, extra: &str) -> CliResult<Mounted> {
        check_interrupt()?;
        let mut m = Mounted { kind: self, root: env.unique_dir(self.name()), daemon: None, undo: Vec::new() };
        std::fs::create_dir(&m.root).context(|| format!("mkdir {}", m.root.display()))?;
        m.undo.push(Undo::Dir(m.root.clone()));
        match self {
            Kind::Ferrofs => m.mount_ferrofs(env, size, extra)?,
            Kind::FerrofsUring => {
                let extra = if extra.is_empty() { "uring".to_string() } else { format!("{extra},uring") };
                m.mount_ferrofs(env, size, &extra)?
            }
            Kind::Null | Kind::NullUring => {
                let exe = env.nullfs.as_deref().map_err(|why| Failure::new("ferrofs-nullfs", why))?;
                let mut cmd = Command::new(exe);
                cmd.arg(&m.root);
                if self == Kind::NullUring {
                    cmd.arg("uring");
                }
                m.start_daemon(env, cmd)?;
            }
            Kind::Minifuse => {
                let exe = env.minifuse()?;
                let mut cmd = Command::new(exe);
                cmd.arg(&m.root).arg("-f");
                env.push_options(self, &mut cmd, extra);
                m.start_daemon(env, cmd)?;
            }
            Kind::Fuse2fs => {
                let image = m.new_image(env, size.image_bytes())?;
                run(Command::new("mkfs.ext4")
                    .args(["-q", "-F", "-N"])
                    .arg(size.ext4_inodes().to_string())
                    .arg(&image))?;
                let mut cmd = Command::new("fuse2fs");
                cmd.arg(&image).arg(&m.root).args(["-f", "-o", "fakeroot"]);
                env.push_options(self, &mut cmd, extra);
                m.start_daemon(env, cmd)?;
            }
            Kind::Ext4 | Kind::Xfs | Kind::Btrfs => {
                let image = m.new_image(env, size.image_bytes())?;
                let out = run(Command::new("losetup").args(["-f", "--show"]).arg(&image))?;
                let dev = out.trim().to_string();
                m.undo.push(Undo::Loop(dev.clone()));
                let mut mkfs = match self {
                    Kind::Ext4 => {
                        let mut c = Command::new("mkfs.ext4");
                        c.args(["-q", "-F", "-N", &size.ext4_inodes().to_string()]);
                        c
                    }
                    Kind::Xfs => {
                        let mut c = Command::new("mkfs.xfs");
                        c.args(["-q", "-f"]);
                        c
                    }
                    _ => {
                        let mut c = Command::new("mkfs.btrfs");
                        c.args(["-q", "-f"]);
                        c
                    }
                };
                run(mkfs.arg(&dev))?;
                let mut mount = Command::new("mount");
                mount.args(["-t", self.name()]);
                env.push_options(self, &mut mount, extra);
                run(mount.arg(&dev).arg(&m.root))?;
                m.undo.push(Undo::Mount(m.root.clone()));
            }
            Kind::Tmpfs => {
                let mut mount = Command::new("mount");
                mount.args(["-t", "tmpfs"]);
                env.push_options(self, &mut mount, extra);
                run(mount.arg("ferrofs-bench").arg(&m.root))?;
                m.undo.push(Undo::Mount(m.root.clone()));
            }
            Kind::Passthrough => {
                let exe = env.passthrough()?;
                let source = env.unique_dir("ptsrc");
                std::fs::create_dir(&source).context(|| format!("mkdir {}", source.display()))?;
                m.undo.push(Undo::Dir(source.clone()));
                run(Command::new("mount").args(["-t", "tmpfs", "ferrofs-bench"]).arg(&source))?;
                m.undo.push(Undo::Mount(source.clone()));
                let mut cmd = Command::new(exe);
                cmd.arg("-f").arg("-o").arg(format!("source={}", source.display())).arg(&m.root);
                env.push_options(self, &mut cmd, extra);
                let limit = libc::rlimit { rlim_cur: passthrough_open_files(), rlim_max: passthrough_open_files() };
                // SAFETY: setrlimit is async-signal-safe and touches only the child's limits.
                unsafe {
                    cmd.pre_exec(move || match libc::setrlimit(libc::RLIMIT_NOFILE, &limit) {
                        0 => Ok(()),
                        _ => Err(std::io::Error::last_os_error()),
                    });
                }
                m.start_daemon(env, cmd)?;
            }
        }
        Ok(m)
    }
}

/// `work` on each of `targets` in turn, mounted afresh at `size` and unmounted after it (also
/// when it failed: the failure is returned once the target is unmounted); a target that
/// cannot be set up here is skipped with the reason. `what` names the workload in progress.
pub fn on_each<R>(
    targets: &[Kind],
    env: &Env,
    size: &Size,
    what: &str,
    mut work: impl FnMut(&Path) -> CliResult<R>,
) -> CliResult<Vec<(Kind, R)>> {
    let mut out = Vec::new();
    for &target in targets {
        if let Some(reason) = target.unavailable(env) {
            eprintln!("skipping {}: {reason}", target.name());
            continue;
        }
        eprintln!("{what} on {}", target.name());
        let m = target.mount(env, size)?;
        let result = work(m.root());
        m.unmount()?;
        out.push((target, result?));
    }
    Ok(out)
}

/// What the workload will hold at most, to size images.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    /// Files alive at once.
    pub files: u64,
    /// Directories alive at once.
    pub dirs: u64,
    /// Threads working at once (ferrofs: one allocation group each).
    pub threads: usize,
    /// File data written at most (0 for metadata-only workloads): images get twice this.
    pub data_bytes: u64,
}

impl Size {
    fn image_bytes(&self) -> u64 {
        (self.files + self.dirs)
            .saturating_mul(IMAGE_BYTES_PER_FILE)
            .max(MIN_IMAGE_BYTES)
            .max(self.data_bytes.saturating_mul(2))
    }

    fn ext4_inodes(&self) -> u64 {
        ((self.files + self.dirs) * EXT4_INODES_PER_FILE).max(EXT4_MIN_INODES)
    }
}

#[derive(Args, Debug)]
pub struct FsmarkArgs {
    /// fsmark: file systems to measure, comma-separated (default: all of them; one that
    /// cannot be set up here is skipped with the reason). fsync and scale: mounted file
    /// systems to run the same workload on after the engine (default: none). write: ferrofs
    /// (through FUSE) or nothing.
    #[arg(long, value_enum, value_delimiter = ',')]
    pub targets: Vec<Kind>,
    /// fsmark: targets that get --slow-files files per run instead of --files.
    #[arg(long, value_enum, value_delimiter = ',', default_value = "fuse2fs")]
    pub slow: Vec<Kind>,
    /// fsmark: files per run on the --slow targets (default: --files / 10).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub slow_files: Option<u64>,
    /// fsmark and seeds: the directory holding minifuse.c, the FUSE ceiling the minifuse target
    /// compiles and mounts (default: $FERROFS_PEERS; without either, minifuse is skipped).
    #[arg(long)]
    pub peers: Option<PathBuf>,
    /// fsmark, seeds, workloads: where the targets' images go (default: /dev/shm, else the
    /// temporary directory); a directory on disk measures the write-back to a real device.
    #[arg(long)]
    pub image_dir: Option<PathBuf>,
    /// fsmark: extra mount options of one target, as TARGET:OPTS (OPTS comma-separated, as
    /// for its `-o`); may be repeated. E.g. ferrofs:entry_timeout=60 or minifuse:default_permissions.
    #[arg(long = "mount-options", value_parser = parse_target_options)]
    pub mount_options: Vec<(Kind, String)>,
    /// fsmark, fsync, scale, seeds: run every FUSE daemon in a session of its own, as mount(8)
    /// and `ferrofs mount --daemon` start them, instead of in the benchmark's session beside
    /// the workload. The kernel gives each session's threads a fair share as a group
    /// (autogroup), which changes how the CPUs are split between a daemon and the workload.
    #[arg(long)]
    pub detached: bool,
}

fn parse_target_options(text: &str) -> Result<(Kind, String), String> {
    let (name, opts) = text.split_once(':').ok_or("expected TARGET:OPTIONS, e.g. ferrofs:entry_timeout=60")?;
    let kind = Kind::from_str(name, true)?;
    Ok((kind, opts.to_string()))
}

/// How the FUSE daemons of a run were started, for report headers.
pub fn daemons_ran(detached: bool) -> &'static str {
    match detached {
        true => "each in a session of its own (--detached)",
        false => "in the benchmark's session, beside the workload",
    }
}

/// What all targets of one benchmark run share: a work directory (mount points, the
/// compiled minifuse, daemon logs), where images go, how ferrofs is mounted, how daemons run.
pub struct Env {
    /// FUSE daemons run in sessions of their own (as mount(8) starts them), not in the
    /// benchmark's.
    detached: bool,
    work: PathBuf,
    images: PathBuf,
    /// The `ferrofs` program (next to this one, else on PATH), or why there is none.
    ferrofs: Result<PathBuf, String>,
    /// The `ferrofs-nullfs` program, or why there is none.
    nullfs: Result<PathBuf, String>,
    /// Extra mount options per target, comma-separated as for `-o`.
    mount_options: Vec<(Kind, String)>,
    peers: Option<PathBuf>,
    minifuse: OnceCell<PathBuf>,
    passthrough: OnceCell<PathBuf>,
    counter: std::cell::Cell<u32>,
}

impl Env {
    /// `args.peers`: the directory holding minifuse.c (else $FERROFS_PEERS).
    pub fn new(args: &FsmarkArgs) -> CliResult<Env> {
        let ferrofs = FERROFS.find();
        let nullfs = ferrofs_cli::programs::FERROFS_NULLFS.find();
        // Short: fs_mark takes directory names of under 40 bytes only.
        let work = std::env::temp_dir().join(format!("ffb.{}", std::process::id()));
        std::fs::create_dir_all(&work).context(|| format!("mkdir {}", work.display()))?;
        let shm = Path::new("/dev/shm");
        let images = match &args.image_dir {
            Some(dir) if !dir.is_dir() => {
                return Err(Failure::new("--image-dir", format!("{} is no directory", dir.display())))
            }
            Some(dir) => dir.clone(),
            None if shm.is_dir() => shm.to_path_buf(),
            None => work.clone(),
        };
        Ok(Env {
            detached: args.detached,
            work,
            images,
            ferrofs,
            nullfs,
            mount_options: args.mount_options.clone(),
            peers: args.peers.clone().or_else(|| std::env::var_os(PEERS_ENV).map(PathBuf::from)),
            minifuse: OnceCell::new(),
            passthrough: OnceCell::new(),
            counter: std::cell::Cell::new(0),
        })
    }

    /// The extra mount options given for `kind`, comma-separated; empty if none.
    pub fn options(&self, kind: Kind) -> String {
        let given: Vec<&str> = self.mount_options.iter().filter(|(k, _)| *k == kind).map(|(_, o)| o.as_str()).collect();
        given.join(",")
    }

    /// `-o OPTS` for `kind`'s mount command: those given for it, then `extra`; nothing if
    /// there are none.
    fn push_options(&self, kind: Kind, cmd: &mut Command, extra: &str) {
        let o = [self.options(kind), extra.to_string()].into_iter().filter(|o| !o.is_empty()).collect::<Vec<_>>();
        if !o.is_empty() {
            cmd.arg("-o").arg(o.join(","));
        }
    }

    /// The work directory: programs that write files into their current directory (fs_mark's
    /// log) run here.
    pub fn work_dir(&self) -> &Path {
        &self.work
    }

    /// Put the images in `dir` rather than /dev/shm (a benchmark of an image on disk).
    pub fn set_image_dir(&mut self, dir: &Path) {
        self.images = dir.to_path_buf();
    }

    /// Where images go.
    pub fn image_dir(&self) -> &Path {
        &self.images
    }

    fn unique(&self, dir: &Path, what: &str, suffix: &str) -> PathBuf {
        let n = self.counter.get() + 1;
        self.counter.set(n);
        dir.join(format!("ferrofs-bench-{}-{what}-{n}{suffix}", std::process::id()))
    }

    /// A mount point in the work directory, named short (see [`Env::new`]).
    fn unique_dir(&self, what: &str) -> PathBuf {
        let n = self.counter.get() + 1;
        self.counter.set(n);
        self.work.join(format!("{what}{n}"))
    }

    /// The `ferrofs` program that makes, mounts and queries the ferrofs target's images.
    pub fn ferrofs(&self) -> CliResult<&Path> {
        self.ferrofs.as_deref().map_err(|why| Failure::new("ferrofs", why))
    }

    fn minifuse_source(&self) -> Result<PathBuf, String> {
        let Some(peers) = &self.peers else {
            return Err(format!("no {MINIFUSE_SOURCE} given (--peers DIR or ${PEERS_ENV} names its directory)"));
        };
        let source = peers.join(MINIFUSE_SOURCE);
        match source.is_file() {
            true => Ok(source),
            false => Err(format!("{} not found (--peers DIR or ${PEERS_ENV} names its directory)", source.display())),
        }
    }

    /// minifuse, compiled into the work directory on first use.
    fn minifuse(&self) -> CliResult<&Path> {
        let src = || self.minifuse_source().map_err(|why| Failure::new("minifuse", why));
        self.compiled(&self.minifuse, "gcc", "minifuse", src)
    }

    /// passthrough_ll, compiled into the work directory on first use.
    fn passthrough(&self) -> CliResult<&Path> {
        self.compiled(&self.passthrough, "cc", "passthrough_ll", || Ok(PathBuf::from(PASSTHROUGH_SOURCE)))
    }

    /// A libfuse3 server compiled by `compiler` from `source` into the work directory as
    /// `name`, once (`cell` keeps it).
    fn compiled<'a>(
        &self,
        cell: &'a OnceCell<PathBuf>,
        compiler: &str,
        name: &str,
        source: impl FnOnce() -> CliResult<PathBuf>,
    ) -> CliResult<&'a Path> {
        if let Some(p) = cell.get() {
            return Ok(p);
        }
        let src = source()?;
        let flags = run(Command::new("pkg-config").args(["--cflags", "--libs", "fuse3"]))?;
        let exe = self.work.join(name);
        run(Command::new(compiler)
            .args(["-O2", "-Wall"])
            .arg(&src)
            .args(flags.split_whitespace())
            .arg("-lpthread")
            .arg("-o")
            .arg(&exe))?;
        Ok(cell.get_or_init(|| exe))
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        // Never delete through a mount point that outlived its teardown.
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let work = self.work.to_string_lossy();
        if info.lines().any(|l| l.split(' ').nth(4).is_some_and(|m| unescape(m).starts_with(&*work))) {
            eprintln!("ferrofs: {} still has mounts in it; left in place", self.work.display());
            return;
        }
        if let Err(e) = std::fs::remove_dir_all(&self.work) {
            eprintln!("ferrofs: remove {}: {e}", self.work.display());
        }
    }
}

/// The files passthrough_ll may hold open: the hard limit of this process (raising it needs
/// CAP_SYS_RESOURCE). It keeps one open per inode the kernel knows, so a tree with more
/// entries than this fails on it with EMFILE.
pub fn passthrough_open_files() -> u64 {
    // SAFETY: rlimit is plain integers, for which all-zero bytes are a valid value.
    let mut limit: libc::rlimit = unsafe { std::mem::zeroed() };
    // SAFETY: getrlimit fills the struct it is given and keeps no pointer to it.
    match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
        0 => limit.rlim_max,
        _ => 1024,
    }
}

/// Why libfuse3 servers cannot be compiled here, if they cannot.
fn fuse3_missing() -> Option<String> {
    run(Command::new("pkg-config").args(["--exists", "fuse3"]))
        .err()
        .map(|e| format!("no fuse3 development files (libfuse3-dev): {}", e.why))
}

fn kernel_has(fs: &str) -> bool {
    let listed = |t: &str| {
        std::fs::read_to_string("/proc/filesystems")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split_whitespace().last() == Some(t))
    };
    // A module not loaded yet is not listed: try loading it (mount would do the same).
    listed(fs) || (shell::have("modprobe") && run(Command::new("modprobe").arg(fs)).is_ok() && listed(fs))
}

/// A mounted target. Unmount with [`Mounted::unmount`] to see teardown errors; dropping it
/// tears down too, reporting errors on stderr.
pub struct Mounted {
    pub kind: Kind,
    root: PathBuf,
    daemon: Option<u32>,
    undo: Vec<Undo>,
}

impl Mounted {
    /// The mounted directory, where workloads run.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The daemon's peak resident set size so far (VmHWM), bytes.
    pub fn daemon_peak_rss(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.daemon?)).ok()?;
        let kib: u64 =
            status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?.trim().strip_suffix("kB")?.trim().parse().ok()?;
        Some(kib * 1024)
    }

    /// User + system CPU time of all the daemon's threads so far.
    pub fn daemon_cpu(&self) -> Option<Duration> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.daemon?)).ok()?;
        // Fields after the parenthesised command name: state is field 3, utime 14, stime 15.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        let ticks = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
    }

    /// Unmount and take back everything the set-up made; the first error, if any, after
    /// trying every step.
    pub fn unmount(mut self) -> CliResult<()> {
        self.teardown()
    }

    fn teardown(&mut self) -> CliResult<()> {
        undo_all(&mut self.undo)
    }

    /// A new sparse image file of `bytes`, deleted on teardown.
    fn new_image(&mut self, env: &Env, bytes: u64) -> CliResult<PathBuf> {
        let path = env.unique(env.image_dir(), self.kind.name(), ".img");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .context(|| format!("create {}", path.display()))?;
        self.undo.push(Undo::File(path.clone()));
        f.set_len(bytes).context(|| format!("size {}", path.display()))?;
        Ok(path)
    }

    fn mount_ferrofs(&mut self, env: &Env, size: &Size, extra: &str) -> CliResult<()> {
        // The embedded benchmark's image geometry: one AG per thread, a large log.
        let bytes = scratch::image_size(size.files + size.dirs + 2 * size.threads as u64)
            .max(size.data_bytes.saturating_mul(2));
        let opts = scratch::mkfs_options(size.threads);
        let image = env.unique(env.image_dir(), "ferrofs", ".img");
        self.undo.push(Undo::File(image.clone()));
        let mut mkfs = Command::new(env.ferrofs()?);
        mkfs.arg("mkfs").arg(&image).arg("--size").arg(bytes.to_string());
        if let Some(ags) = opts.ag_count {
            mkfs.arg("--ags").arg(ags.to_string());
        }
        mkfs.arg("--bytes-per-inode").arg(opts.bytes_per_inode.to_string());
        if let Some(log) = opts.log_blocks {
            mkfs.arg("--log-size").arg((log * BLOCK_SIZE as u64).to_string());
        }
        run(&mut mkfs)?;
        let mut mount = Command::new(env.ferrofs()?);
        mount.arg("mount").arg(&image).arg(&self.root);
        env.push_options(self.kind, &mut mount, extra);
        self.start_daemon(env, mount)
    }

    /// Start a FUSE daemon in the foreground and wait until its mount is there. It runs in a
    /// process group of its own (a Ctrl-C at the terminal reaches us, not it: we unmount it),
    /// and in a session of its own if the daemons are [`Env::detached`].
    fn start_daemon(&mut self, env: &Env, cmd: Command) -> CliResult<()> {
        let log = env.unique(&env.work, self.kind.name(), ".log");
        self.daemon = Some(start_daemon(&mut self.undo, cmd, &self.root, &log, env.detached)?);
        Ok(())
    }
}

/// Start a FUSE daemon in the foreground, its output going to `log`, and wait until it has
/// mounted on `root`; its process id. What it made is pushed on `undo` (the daemon, then the
/// mount). It runs in a process group of its own (a Ctrl-C at the terminal reaches us, not
/// it: we unmount it), and in a session of its own if `detached`.
pub(super) fn start_daemon(
    undo: &mut Vec<Undo>,
    mut cmd: Command,
    root: &Path,
    log: &Path,
    detached: bool,
) -> CliResult<u32> {
    let line = describe(&cmd);
    let log_file = std::fs::File::create(log).context(|| format!("create {}", log.display()))?;
    let err_file = log_file.try_clone().context(|| format!("open {}", log.display()))?;
    cmd.stdin(Stdio::null()).stdout(log_file).stderr(err_file);
    if detached {
        // SAFETY: setsid is async-signal-safe, touches no memory of the parent, and
        // cannot fail in a freshly forked child (it is no process group leader yet).
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                Ok(())
            });
        }
    } else {
        cmd.process_group(0);
    }
    let child = cmd.spawn().context(|| format!("run `{line}`"))?;
    let pid = child.id();
    undo.push(Undo::Child { child, what: line.clone(), log: log.to_path_buf() });
    let started = Instant::now();
    loop {
        if is_mounted(root) {
            undo.push(Undo::Mount(root.to_path_buf()));
            return Ok(pid);
        }
        if let Some(Undo::Child { child, .. }) = undo.last_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                return Err(Failure::new(
                    format!("`{line}`"),
                    format!("exited before mounting ({status}): {}", shell::last_lines(&text)),
                ));
            }
        }
        check_interrupt()?;
        if started.elapsed() > DAEMON_WAIT {
            return Err(Failure::new(format!("`{line}`"), format!("not mounted after {} s", DAEMON_WAIT.as_secs())));
        }
        std::thread::sleep(POLL);
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = self.teardown() {
            eprintln!("ferrofs: tear down {}: {e}", self.kind.name());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_grow_with_the_workload() {
        let s = |files| Size { files, dirs: 0, threads: 1, data_bytes: 0 };
        assert_eq!(s(10).image_bytes(), MIN_IMAGE_BYTES);
        assert!(s(10_000_000).image_bytes() > MIN_IMAGE_BYTES);
        assert_eq!(s(10).ext4_inodes(), EXT4_MIN_INODES);
        assert_eq!(s(1_000_000).ext4_inodes(), 2_000_000);
    }
}
