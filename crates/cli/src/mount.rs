//! `ferrofs mount`: serve an image through FUSE, in the foreground or as a daemon, and the
//! mount helper that `mount -t fuse.ferrofs IMAGE DIR` and `/etc/fstab` run.
//!
//! mount(8) runs `/sbin/mount.fuse.ferrofs IMAGE DIR [-sfnv] [-o OPTS]` for type
//! `fuse.ferrofs`; that name is a link to this binary, which then behaves as
//! `ferrofs mount --daemon`: it returns once the file system is ready to use (or failed, with
//! the reason on stderr and a non-zero exit), and the daemon serves until unmounted.
//!
//! `--shared` hands the mount to the user's shared daemon instead (see `shared.rs`), which
//! serves several images in one process with one cache budget.

use crate::failure::{CliResult, Context, Failure};
use crate::mkfs::{self, MkfsArgs};
use crate::units::parse_size;
use clap::Args;
use ferrofs::{CacheBudget, DEFAULT_CACHE_BYTES};
use ferrofs_fuse::MountConfig;
use std::cell::RefCell;
use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::Duration;

/// How long a mount waits for the image lock of a daemon that is still finishing the
/// previous unmount of the same image (the kernel lets `umount` return before it has).
pub(crate) const LOCK_WAIT: Duration = Duration::from_secs(30);

/// The names this binary answers to as a mount helper.
pub const HELPER_NAMES: [&str; 2] = ["mount.fuse.ferrofs", "mount.ferrofs"];

#[derive(Args, Debug)]
pub struct MountArgs {
    /// The image file or block device.
    pub image: PathBuf,
    /// An existing directory to mount on.
    pub mountpoint: PathBuf,
    /// Mount options, comma separated: ro, rw, allow_other, allow_root, default_permissions
    /// (the kernel checks permissions: the default), daemon_permissions (ferrofs checks them
    /// itself: faster removal, but FIFOs, sockets and device nodes open unchecked),
    /// threads=N, cache_size=SIZE, writeback_cache, entry_timeout=SECS, attr_timeout=SECS
    /// (default 3600), fsname=NAME, relatime (default), strictatime, noatime, nodiratime,
    /// and the generic ones (nosuid, nodev, noexec, ...), which go to the kernel.
    #[arg(short = 'o', value_delimiter = ',')]
    pub options: Vec<String>,
    /// FUSE worker threads at most, each with its own /dev/fuse descriptor (default: 4 per
    /// CPU). One per CPU always reads; the others only while many clients are active. fsyncs
    /// run on a separate pool and do not occupy them.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Make a file system of this size first if the image does not exist (e.g. 1G).
    #[arg(long, value_parser = parse_size)]
    pub mkfs: Option<u64>,
    /// Detach once the file system is mounted; the daemon serves until unmounted.
    #[arg(long, short = 'd')]
    pub daemon: bool,
    /// Serve this mount from the shared daemon (started if none runs), which serves several
    /// images in one process, all sharing the cache budget set by the mount that started it.
    /// Implies --daemon.
    #[arg(long)]
    pub shared: bool,
}

pub fn run(args: &MountArgs) -> CliResult<()> {
    cap_malloc_arenas();
    let what = || format!("mount {} on {}", args.image.display(), args.mountpoint.display());
    if args.options.iter().any(|o| o.trim() == "remount") {
        return remount(args);
    }
    if let (Some(size), false) = (args.mkfs, args.image.exists()) {
        mkfs::run(&MkfsArgs::for_new_image(args.image.clone(), size))?;
    }
    crate::image::require_ferrofs(&args.image)?;
    let mut cfg = config(args).map_err(|why| Failure::new(what(), why))?;
    // Before forking: a bad mount point or option is reported by this command, not lost.
    ferrofs_fuse::check(&cfg).context(what)?;
    if let Some(dir) = mounted_on(&cfg.image) {
        return Err(Failure::new(what(), format!("the image is already mounted on {dir}")));
    }
    // `-o shared` is how mount(8) and fstab ask for it.
    if args.shared || args.options.iter().any(|o| o.trim() == "shared") {
        return crate::shared::mount(args, &cfg).map_err(|why| Failure::new(what(), why));
    }
    let log_file = crate::logging::open_log_file(&args.options).map_err(|why| Failure::new(what(), why))?;
    crate::logging::init(Some(&cfg.image.display().to_string()), log_file);
    // The daemon serves this one image: its cache size bounds all of its memory.
    cfg.cache = Some(CacheBudget::for_process(cfg.cache_bytes.unwrap_or(DEFAULT_CACHE_BYTES)));
    if args.daemon {
        return daemonize(&cfg).context(what);
    }
    ferrofs_fuse::mount(&cfg, || {
        eprintln!(
            "ferrofs: {} mounted on {}; unmount with umount, fusermount3 -u or Ctrl-C",
            cfg.image.display(),
            cfg.mountpoint.display()
        )
    })
    .context(what)
}

/// `-o remount,ro` or `-o remount,rw` (the last of the two counts; without either nothing
/// changes): switch the mount on the mount point. The other options are those mount(8) passes
/// along from fstab; a FUSE mount cannot change them on a remount, so they are ignored.
fn remount(args: &MountArgs) -> CliResult<()> {
    let what = || format!("remount {}", args.mountpoint.display());
    let read_only = args.options.iter().rev().find_map(|o| match o.trim() {
        "ro" => Some(true),
        "rw" => Some(false),
        _ => None,
    });
    match read_only {
        Some(read_only) => ferrofs_fuse::remount(&args.mountpoint, read_only).context(what),
        None => Ok(()),
    }
}

/// Build the mount configuration from the arguments and `-o` options.
pub(crate) fn config(args: &MountArgs) -> Result<MountConfig, String> {
    // The canonical image path is the mount's source, as `mount` and `df` show it, and how
    // a second mount of the same image is recognised.
    let image = args.image.canonicalize().map_err(|e| format!("image {}: {e}", args.image.display()))?;
    let mut cfg = MountConfig::new(&image, &args.mountpoint);
    cfg.fs_name = Some(image.display().to_string());
    cfg.lock_timeout = LOCK_WAIT;
    for o in args.options.iter().map(|o| o.trim()).filter(|o| !o.is_empty()) {
        let (key, value) = o.split_once('=').map_or((o, None), |(k, v)| (k, Some(v)));
        let number = |v: Option<&str>| v.and_then(|v| v.parse::<f64>().ok()).filter(|n| n.is_finite() && *n >= 0.0);
        match key {
            "ro" => cfg.read_only = true,
            "rw" => cfg.read_only = false,
            "allow_other" => cfg.allow_other = true,
            "default_permissions" => cfg.default_permissions = true,
            "daemon_permissions" => cfg.default_permissions = false,
            "writeback_cache" => cfg.writeback_cache = true,
            "threads" => cfg.threads = value.and_then(|v| v.parse().ok()).filter(|n| *n > 0).ok_or(format!("bad option '{o}': threads takes a whole number above 0"))?,
            "entry_timeout" => cfg.entry_timeout = Duration::from_secs_f64(number(value).ok_or(format!("bad option '{o}': a number of seconds"))?),
            "attr_timeout" => cfg.attr_timeout = Duration::from_secs_f64(number(value).ok_or(format!("bad option '{o}': a number of seconds"))?),
            "fsname" => cfg.fs_name = value.map(str::to_string),
            "cache_size" => cfg.cache_bytes = Some(value.ok_or(format!("bad option '{o}': cache_size takes a size (e.g. 512M)")).and_then(parse_size).map_err(|e| format!("bad option '{o}': {e}"))?),
            // Options for mount(8) and fstab only, not for the file system.
            // Handled by `run`: which daemon serves the mount, and where it logs.
            "shared" | "log" => {}
            "defaults" | "auto" | "noauto" | "user" | "nouser" | "users" | "_netdev" | "nofail" | "owner" | "group" | "comment" => {}
            _ if key.starts_with("x-") => {}
            _ => cfg.options.push(o.to_string()),
        }
    }
    if let Some(t) = args.threads {
        cfg.threads = t;
    }
    if cfg.threads > ferrofs_fuse::THREADS_MAX {
        return Err(format!("{} threads requested, at most {} allowed", cfg.threads, ferrofs_fuse::THREADS_MAX));
    }
    Ok(cfg)
}

/// Where `image` is mounted through FUSE now, if it is: by whatever name (the image file, a
/// loop device of it) it was mounted, the same image ([`ferrofs::dev::identity`]). A mount of
/// an image that is merely locked (its daemon is finishing an unmount) waits for the lock
/// instead.
pub(crate) fn mounted_on(image: &std::path::Path) -> Option<String> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let identity = ferrofs::dev::identity_of_path(image).ok()?;
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut r = right.split(' ');
        let (fstype, source) = (r.next()?, r.next()?);
        let same = |source: &str| std::path::Path::new(source) == image || ferrofs::dev::identity_of_path(source).is_ok_and(|i| i == identity);
        (fstype.starts_with("fuse") && same(source)).then(|| left.split(' ').nth(4).unwrap_or("?").to_string())
    })
}

/// glibc gives threads that meet in malloc arenas of their own (up to 8 per CPU), and memory
/// freed into one arena is not reused by threads of another. A daemon's FUSE workers grow with
/// its clients (`ferrofs_fuse::MountConfig::threads`), so the daemon keeps one arena per two
/// CPUs. On 2 CPUs, in a 400,000-file, 8-client fs_mark under the default 256 MiB cache
/// budget, its peak RSS was 268-272 MiB with glibc's default, 250-262 with 2 arenas per CPU and
/// 235-249 with one arena, which created files as fast but removed them at 0.88-0.96x minifuse
/// against 0.96-0.98x (DESIGN, "A daemon's budget bounds its process"). Set before any thread
/// starts; a forked daemon inherits it. `ferrofs bench unmount`, which measures the shared
/// daemon's case (several file systems in one process), runs under it too.
pub(crate) fn cap_malloc_arenas() {
    let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
    // SAFETY: mallopt only sets a tunable of the allocator; it reads and writes no memory of
    // ours.
    unsafe { libc::mallopt(libc::M_ARENA_MAX, cpus.div_ceil(2).min(i32::MAX as usize) as i32) };
}

/// Fork a daemon that mounts and serves; return once it says the mount is ready, or fail
/// with the reason it gives. Called while this process is still single-threaded.
fn daemonize(cfg: &MountConfig) -> std::io::Result<()> {
    let (mut from_daemon, to_parent) = pipe()?;
    // SAFETY: the process is single-threaded here (nothing has spawned a thread yet), so the
    // child may go on running arbitrary code after fork.
    match unsafe { libc::fork() } {
        -1 => Err(std::io::Error::last_os_error()),
        0 => {
            drop(from_daemon);
            std::process::exit(daemon_main(cfg, std::fs::File::from(to_parent)))
        }
        _ => {
            drop(to_parent);
            let mut said = String::new();
            from_daemon.read_to_string(&mut said)?;
            match said.strip_prefix("ok") {
                Some(_) => Ok(()),
                None if said.is_empty() => Err(std::io::Error::other("the daemon exited before mounting")),
                None => Err(std::io::Error::other(said)),
            }
        }
    }
}

/// The daemon: a new session, no terminal; report to the parent through `report`: "ok" once
/// the mount is ready, else why it failed.
fn daemon_main(cfg: &MountConfig, report: std::fs::File) -> i32 {
    become_daemon();
    let report = RefCell::new(Some(report));
    let res = ferrofs_fuse::mount(cfg, || {
        if let Some(mut r) = report.borrow_mut().take() {
            let _ = r.write_all(b"ok");
        }
        detach_stdio();
        crate::logging::detached();
    });
    let Err(e) = res else { return 0 };
    match report.borrow_mut().take() {
        Some(mut r) => drop(write!(r, "{e}")),
        None => log::error!("{e}"),
    }
    1
}

/// What every daemon does first after the fork: a session of its own (no controlling
/// terminal), and SIGPIPE ignored — `main` restores its default for the command-line tools,
/// but a control-socket client that hangs up before reading its answer must not kill the
/// daemon and every mount it serves.
pub(crate) fn become_daemon() {
    // SAFETY: setsid has no preconditions (in a freshly forked child it cannot fail with
    // EPERM), and ignoring a signal involves no handler code.
    unsafe {
        libc::setsid();
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

pub(crate) fn pipe() -> std::io::Result<(std::fs::File, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: pipe2 succeeded, so both descriptors are open and owned by nobody else.
    Ok(unsafe { (std::fs::File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Point stdin, stdout and stderr at /dev/null: the daemon outlives the terminal.
pub(crate) fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new().read(true).write(true).open("/dev/null") {
        for fd in 0..3 {
            // SAFETY: dup2 onto a standard descriptor; `null` stays open for the call.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

/// Translate a mount helper's command line (`IMAGE DIR [-sfnv] [-o OPTS]`, as mount(8) runs
/// it) into `ferrofs mount --daemon IMAGE DIR -o OPTS`.
///
/// mount(8) passes `nosuid` and `nodev` on when they are given, but never `suid` or `dev`:
/// their absence is its default, suid and dev, as ext4 gets. So for `root`, as mount.fuse3
/// does for every FUSE file system, the helper adds `suid` and `dev` unless `nosuid` or
/// `nodev` was given; `ferrofs mount` run directly keeps FUSE's `nosuid,nodev` default.
pub fn helper_argv(args: Vec<OsString>, root: bool) -> Result<Vec<OsString>, String> {
    let mut out: Vec<OsString> = vec!["ferrofs".into(), "mount".into(), "--daemon".into()];
    let mut positional = Vec::new();
    let mut it = args.into_iter().skip(1);
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => {
                out.push("-o".into());
                out.push(it.next().ok_or("-o needs a value")?);
            }
            Some(flags) if flags.starts_with("-o") => {
                out.push("-o".into());
                out.push(flags[2..].into());
            }
            // -s (sloppy), -f (fake), -n (no mtab), -v (verbose): nothing to do for FUSE.
            Some(flags) if flags.starts_with('-') && flags[1..].chars().all(|c| "sfnv".contains(c)) => {}
            Some(flag) if flag.starts_with('-') => return Err(format!("unknown flag '{flag}'")),
            _ => positional.push(a),
        }
    }
    if positional.len() != 2 {
        return Err("usage: mount.fuse.ferrofs IMAGE MOUNTPOINT [-o OPTIONS]".into());
    }
    if root {
        let given = |flag: &str| out.iter().filter_map(|a| a.to_str()).any(|a| a.split(',').any(|o| o == flag));
        let implied: Vec<&str> = [("nosuid", "suid"), ("nodev", "dev")].into_iter().filter(|(no, _)| !given(no)).map(|(_, yes)| yes).collect();
        if !implied.is_empty() {
            out.extend(["-o".into(), implied.join(",").into()]);
        }
    }
    out.extend(positional);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        mount: MountArgs,
    }

    fn parse(line: &[&str]) -> Result<MountConfig, String> {
        let cli = Cli::try_parse_from(std::iter::once("mount").chain(line.iter().copied())).map_err(|e| e.to_string())?;
        config(&cli.mount)
    }

    #[test]
    fn options_set_the_config_and_pass_generic_ones_through() {
        let c = parse(&["/", "dir", "-o", "ro,noatime,threads=4,x-systemd.automount,defaults,allow_other,cache_size=64M"]).unwrap();
        assert!(c.read_only && c.allow_other);
        assert_eq!(c.cache_bytes, Some(64 << 20));
        assert_eq!(c.threads, 4);
        assert_eq!(c.options, vec!["noatime".to_string()]);
        assert_eq!(c.fs_name.as_deref(), Some("/"));
    }

    #[test]
    fn bad_options_are_named() {
        assert!(parse(&["/", "dir", "-o", "threads=lots"]).unwrap_err().contains("threads=lots"));
        assert!(parse(&["/", "dir", "-o", "cache_size=big"]).unwrap_err().contains("cache_size=big"));
        assert!(parse(&["/", "dir", "-o", "entry_timeout=-1"]).unwrap_err().contains("entry_timeout=-1"));
        assert!(parse(&["/", "dir", "--threads", "100000"]).unwrap_err().contains("at most"));
    }

    #[test]
    fn helper_command_lines() {
        let argv = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            helper_argv(argv(&["mount.fuse.ferrofs", "/i.img", "/mnt", "-n", "-o", "rw,noatime"]), false).unwrap(),
            argv(&["ferrofs", "mount", "--daemon", "-o", "rw,noatime", "/i.img", "/mnt"])
        );
        assert_eq!(
            helper_argv(argv(&["mount.fuse.ferrofs", "/i.img", "/mnt", "-o", "rw"]), true).unwrap(),
            argv(&["ferrofs", "mount", "--daemon", "-o", "rw", "-o", "suid,dev", "/i.img", "/mnt"])
        );
        assert_eq!(
            helper_argv(argv(&["mount.fuse.ferrofs", "/i.img", "/mnt", "-o", "rw,nosuid"]), true).unwrap(),
            argv(&["ferrofs", "mount", "--daemon", "-o", "rw,nosuid", "-o", "dev", "/i.img", "/mnt"])
        );
        assert!(helper_argv(argv(&["mount.fuse.ferrofs", "/i.img"]), false).is_err());
        assert!(helper_argv(argv(&["mount.fuse.ferrofs", "/i.img", "/mnt", "-x"]), false).unwrap_err().contains("-x"));
    }
}
