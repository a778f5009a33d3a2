//! ferrofs-fuse: serve a ferrofs image through the kernel's FUSE driver.
//!
//! [`mount`] opens the image (exclusive `flock`; shared when read-only), mounts the engine
//! (log recovery, orphan processing), mounts FUSE at the mount point and serves requests until
//! the file system is unmounted (`umount`, `fusermount3 -u`) or the process gets SIGTERM or
//! SIGINT; then it checkpoints the engine (`FileSystem::unmount`: clean log) and returns.
//! [`spawn_mount`] does the same in background threads and hands back a [`MountHandle`]; a
//! process may hold several, each its own FUSE session and engine, and may have them share
//! one cache budget ([`MountConfig::cache`]).
//!
//! # Threads and descriptors: why `fuser` 0.18
//!
//! Each worker thread reads requests from its own `/dev/fuse` descriptor, cloned from the
//! session's with `FUSE_DEV_IOC_CLONE`, like libfuse's `clone_fd=1` loop that `minifuse.c`
//! (the FUSE ceiling we measure against) runs. The clones share the connection's one input
//! queue (each has its own list of requests being processed), so every worker reading is one
//! more reader for the kernel to wake: one worker per CPU reads always, the others only while
//! many clients are active (`workers.rs`), and fsync and fsyncdir, which wait on the device,
//! run on a pool of their own (`sync_pool.rs`) so that the workers are never all stuck in a
//! flush.
//! `fuser` 0.16 had a single-threaded loop and a `&mut self` trait, so multi-threading would
//! have meant our own read loop over a cloned descriptor plus a copy of fuser's request
//! parser. From 0.17 on, fuser does exactly what we need itself: `Config::n_threads` event
//! loops, `Config::clone_fd` giving each its own cloned descriptor, and a `Filesystem` trait
//! taking `&self` (`Send + Sync`). So the adapter is plain fuser — no unsafe code, no private
//! protocol code to keep in step with the kernel — and the engine (thread-safe, every method
//! `&self`) is called straight from the worker that read the request.
//!
//! Every engine call returns owned values and releases its locks before returning; the
//! adapter replies to the kernel only after that, so no engine lock is ever held while a
//! reply is written to `/dev/fuse`.
//!
//! # What the mount negotiates
//!
//! Entry and attribute timeouts ([`DEFAULT_TIMEOUT`]; negative lookups are cached for the
//! entry timeout), `FUSE_DO_READDIRPLUS` + `FUSE_READDIRPLUS_AUTO`, `FUSE_PARALLEL_DIROPS`,
//! `FUSE_ASYNC_READ`, `max_write` of 1 MiB (`FUSE_MAX_PAGES`), `FUSE_CACHE_SYMLINKS`, and
//! `FUSE_WRITEBACK_CACHE` only when [`MountConfig::writeback_cache`] asks for it (the kernel
//! then owns mtime/ctime and flushes dirty pages at close, fsync or its own writeback, so a
//! crash can lose writes to open files that `write(2)` already returned, and SEEK_DATA,
//! `st_blocks` and `statfs` miss dirty pages: docs/DESIGN.md, "The writeback cache"). `FUSE_ATOMIC_O_TRUNC` stays off: `O_TRUNC` arrives as a
//! `setattr(size = 0)`. FLUSH is answered ENOSYS, so the kernel stops sending it (see
//! `flush` in `ops.rs`): a close costs RELEASE alone.
//!
//! # Permissions
//!
//! The engine checks no permissions. By default the kernel does (`default_permissions`,
//! [`MountConfig::default_permissions`]): it opens FIFOs, sockets and device nodes itself,
//! without a request to the daemon, so only its own check can refuse a user without read or
//! write permission there, and FUSE has no per-inode way to ask for it (`FUSE_ACCESS` serves
//! access(2) and chdir only; without `default_permissions` the kernel's `fuse_permission`
//! checks nothing for special files, whatever their attributes). The price is a GETATTR per
//! create and unlink (below): `ferrofs bench fsmark --targets ferrofs,minifuse --runs 3
//! --threads 1,8` (40,000 files, 2 shared CPUs), the daemon's checks against the kernel's:
//! creates 18,782 / 28,976 files/s against 19,889 / 28,391 (1 / 8 threads; no change),
//! removal 56,610 / 70,211 against 38,058 / 41,644 (-33% / -41%); a second pair at 8
//! threads: removal 66,209 against 46,826 (-29%).
//!
//! With `daemon_permissions` ([`MountConfig::default_permissions`] false) the adapter checks
//! instead (`access.rs`), before each request reaches the engine, with the kernel's rules
//! (and FIFOs, sockets and device nodes open unchecked): `generic_permission` (owner, group — the
//! caller's primary and supplementary groups — or other, exclusively), `may_create`/
//! `may_delete` (write and search on the parent; in a sticky directory only the entry's or
//! the directory's owner removes or replaces an entry), `vfs_rename` (a directory moving to
//! another parent needs write on itself), `may_open` (the access mode; execve's open, marked
//! `__FMODE_EXEC` in the OPEN request's flags, needs execute alone, as `open_exec` asks), `setattr_prepare`/`may_setattr` (chmod by the owner, S_ISGID dropped for an
//! owner outside the group; chown by root only; chgrp by the owner to one of its groups;
//! truncate needs write unless through an open file; times to a chosen value need
//! ownership, to "now" ownership or write), `may_linkat` with `protected_hardlinks`, and
//! `xattr_permission` (user.* by read/write permission, only on files and directories;
//! trusted.* root only; security.* written by root only; POSIX ACLs set by the owner or root
//! only), POSIX ACLs as `acl_permission_check` consults them (docs/DESIGN.md, "POSIX ACLs";
//! the kernel's own checks need `FUSE_POSIX_ACL`, negotiated only with
//! `default_permissions`). `access(2)` and `chdir` arrive as
//! FUSE ACCESS requests and get the same answer. FUSE gives a request's uid, gid and pid
//! but not its capabilities, so uid 0 is taken as privileged (CAP_DAC_OVERRIDE: read and
//! write anything, execute what has an x bit, search any directory; CAP_FOWNER, CAP_CHOWN,
//! CAP_FSETID, CAP_SYS_ADMIN) and no other uid is. Supplementary groups are read from
//! `/proc/<pid>/status` only when an answer depends on them (caller not the owner, not in
//! the file's group by its gid, and the group and other bits disagree); a caller that has
//! exited (or that the mount's pid namespace cannot see) counts with its primary group only.
//!
//! Setuid and setgid bits: without `FUSE_HANDLE_KILLPRIV` the kernel clears them itself, by
//! a setattr after a write or truncate by someone other than the owner (allowed here for a
//! mode change that only drops those bits, by a caller who may write the file) and within
//! the setattr of a chown.
//!
//! What the adapter's checks save: after each create or unlink the kernel forgets the
//! parent's attributes and, with `default_permissions`, must fetch them again (a GETATTR
//! round trip) before its next permission check. Measured with 8 clients creating then
//! unlinking 40,000 files on a 2-CPU VM: unlink 19-22k files/s with `default_permissions`,
//! 33-35k without — minifuse's settings, and its 31-40k files/s. `ferrofs bench fsmark` with
//! the kernel's fuse tracepoints shows the requests per removed file: UNLINK + GETATTR with
//! it, UNLINK alone without; minifuse mounted with `default_permissions` also sends both,
//! and loses about a third of its removal rate. With the checks here, `ferrofs bench fsmark`
//! removal went from 0.47x to 0.63x minifuse (8 threads, 8 workers), and to 0.97x with one
//! worker per CPU (`docs/bench-fsmark.md`).
//!
//! What the kernel caches is not checked again: a path walk through names it holds sends no
//! LOOKUP. So names in a directory that some class may not search are given entry timeout 0
//! (each walk through them comes here as a LOOKUP by the walking process), and when a
//! directory stops being searchable by everyone, the names the kernel cached with the long
//! timeout must go before the chmod returns: else a walk that starts right after it (a
//! `chown -1 GID` of a file below, in pjdfstest chown/05.t) passes through a cached name, and
//! its request arrives here as one the caller may make (1 to 500 rounds of 3,000 in the
//! conformance test). The kernel holds the directory's lock until it has the chmod's reply,
//! and `FUSE_NOTIFY_INVAL_ENTRY` waits for that lock, so names cannot be invalidated one by
//! one before the reply. `FUSE_NOTIFY_INC_EPOCH` (Linux 6.16) takes no lock: the adapter
//! sends it before the reply (`epoch.rs`), and every name the kernel holds, on the whole
//! mount, is looked up again at its next use. That costs a LOOKUP per name once after such a
//! chmod, which is rare (a directory everyone could search closed to some). On older
//! kernels the directory's names are invalidated one by one right after the reply (listed
//! before it, so the invalidations follow it at once), and a walk in that short window may
//! still pass. Names in directories everyone may search keep the long timeout, so the
//! common case costs nothing.
//!
//! # Why the timeouts are long
//!
//! The daemon holds the image's lock, so every change reaches the engine through this kernel
//! mount, and the kernel drops what it cached for whatever a request changes (the parent
//! directory after create, unlink, rename; the inode after link, unlink, setattr, write).
//! Nothing else can make its entries or attributes stale, so they can be trusted for long, as
//! minifuse does. With the former 1 s default, `rm -rf` of files created more than a second
//! earlier sent a LOOKUP for ~94% of them on top of UNLINK and GETATTR.

mod access;
mod control;
mod epoch;
mod kernel_mount;
pub mod null;
mod ops;
mod options;
mod sync_pool;
mod uring;
mod workers;

use ferrofs::dev::FileDevice;
use ferrofs::CacheBudget;
use ferrofs::{FileSystem, MountOptions};
use fuser::{Config, MountOption, Session, SessionACL};
use kernel_mount::{Detach, KernelMount, KernelOptions};
use std::io;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

pub use control::{freeze, request as control_request, runtime_dir, socket_path as control_socket_path, Freeze};
pub use options::parse_option;

/// Default entry and attribute timeouts: see "Why the timeouts are long" above.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);

/// Largest write request the kernel sends (and the read-ahead window it may use).
pub const MAX_WRITE: u32 = 1 << 20;
/// Default worker threads per CPU, at most (`MountConfig::threads`): on 2 CPUs, 8 fixed
/// workers served 8 fs_mark clients best (6 and 12 were slower).
pub const WORKERS_PER_CPU: usize = 4;
/// Upper bound on worker threads. Each has its own request buffer (fuser allocates 16 MiB of
/// address space; with `max_write` = 1 MiB at most 1 MiB + a page of it is ever touched).
pub const THREADS_MAX: usize = 64;

/// How to mount an image. Build it with [`MountConfig::new`] and change the fields you need.
#[derive(Clone, Debug)]
pub struct MountConfig {
    /// The ferrofs image file or block device.
    pub image: PathBuf,
    /// An existing directory to mount on.
    pub mountpoint: PathBuf,
    /// Mount read-only: the image is opened read-only (shared lock), the log is replayed in
    /// memory only, and the kernel mount is `ro`.
    pub read_only: bool,
    /// Let users other than the one mounting use the mount (`allow_other`; a non-root user
    /// needs `user_allow_other` in /etc/fuse.conf).
    pub allow_other: bool,
    /// Let the kernel check permissions (`default_permissions`), the default. Off, the
    /// adapter checks with the same rules and saves a GETATTR per create and unlink, but the
    /// opens the kernel does without asking the daemon (FIFOs, sockets, device nodes) are
    /// then not checked (see "Permissions" in the crate docs). Either way a fresh image's
    /// root directory is root's, 0755: a user mounting one through fusermount3 cannot write
    /// into it until root gives it away.
    pub default_permissions: bool,
    /// Source name shown in /proc/mounts; default `ferrofs:<image path>`.
    pub fs_name: Option<String>,
    /// Worker threads at most, each with its own cloned /dev/fuse descriptor; 0 =
    /// [`WORKERS_PER_CPU`] per CPU. All descriptors share the connection's one request
    /// queue. One worker per CPU (at least 2) always reads, each kept on a CPU of its own;
    /// the others read only while requests queue in the kernel behind busy workers
    /// (`workers.rs`): idle readers cost every request a colder thread to wake, while many
    /// clients are served faster by more workers (DESIGN, "Mounting through FUSE"). fsync and
    /// fsyncdir, which wait on the device, run on a pool of their own.
    pub threads: usize,
    /// How long the kernel may trust a name lookup (positive or negative).
    pub entry_timeout: Duration,
    /// How long the kernel may trust attributes.
    pub attr_timeout: Duration,
    /// Negotiate the kernel's writeback cache (faster small writes; the kernel owns mtime and
    /// writes dirty pages back later, at the latest at close or fsync, so data of open files
    /// not yet fsync'ed is less durable, and what the daemon reports of dirty pages
    /// (SEEK_DATA, `st_blocks`, `statfs`) is behind until then).
    pub writeback_cache: bool,
    /// `-o discard`: punch the blocks each checkpoint frees in the image once it is durable
    /// (`ferrofs::MountOptions::discard`), so the host gets them back without a trim.
    pub discard: bool,
    /// Generic mount options passed through (`noatime`, `nodev`, `dirsync`, `subtype=...`,
    /// anything else goes to the kernel as is); the access time ones (`relatime`, the
    /// default, `strictatime`, `noatime`, `nodiratime`) also set the engine's mode. Each string
    /// may hold several, comma separated.
    pub options: Vec<String>,
    /// Memory budget of the engine's inode and buffer caches, in bytes; `None`: the
    /// engine's default (`ferrofs::DEFAULT_CACHE_BYTES`). Ignored when
    /// [`MountConfig::cache`] is set.
    pub cache_bytes: Option<u64>,
    /// A cache budget shared with other file systems of this process (a daemon serving
    /// several images): reclaim then runs over all of them in one round-robin order, while
    /// each keeps its own caches. Also how a process that does nothing else bounds all of
    /// its memory with the budget (`CacheBudget::for_process`, as `ferrofs mount` does).
    /// `None`: a budget of this mount's caches and journal only, of `cache_bytes`.
    pub cache: Option<Arc<CacheBudget>>,
    /// Serve requests through FUSE-over-io_uring rings (`-o uring`) when the kernel offers
    /// them: see [`Uring`].
    pub uring: Uring,
    /// How long to wait for an image lock held by another process (e.g. a daemon that is just
    /// finishing its unmount) before failing with [`MountError::ImageInUse`].
    pub lock_timeout: Duration,
    /// Serve the device this opens instead of the file `image` (which then only names the
    /// mount's source): a published image's chunk device, opened in the serving process.
    pub device: Option<DeviceSource>,
}

/// A device the mounting program makes, for [`MountConfig::device`].
#[derive(Clone)]
pub struct DeviceSource {
    /// Opens the device, once, in the process that serves the mount (after a daemon's fork:
    /// it may start threads). Its image must be clean (a log to replay is refused).
    pub open: Arc<dyn Fn() -> io::Result<OpenedDevice> + Send + Sync>,
}

/// What [`DeviceSource::open`] returns.
pub struct OpenedDevice {
    /// The device, served read-only.
    pub device: Arc<dyn ferrofs::dev::BlockDevice>,
    /// Its counters as JSON, the control socket's `source` answer (`ferrofs mounts` shows them).
    pub status: Box<dyn Fn() -> String + Send + Sync>,
}

impl std::fmt::Debug for DeviceSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DeviceSource")
    }
}

impl MountConfig {
    pub fn new(image: impl Into<PathBuf>, mountpoint: impl Into<PathBuf>) -> MountConfig {
        MountConfig {
            image: image.into(),
            mountpoint: mountpoint.into(),
            read_only: false,
            allow_other: false,
            default_permissions: true,
            fs_name: None,
            threads: 0,
            entry_timeout: DEFAULT_TIMEOUT,
            attr_timeout: DEFAULT_TIMEOUT,
            writeback_cache: false,
            discard: false,
            options: Vec::new(),
            cache_bytes: None,
            cache: None,
            lock_timeout: Duration::ZERO,
            uring: Uring::Off,
            device: None,
        }
    }

    /// Whether POSIX ACLs are honoured: `options` hold no `noacl` (or a later `acl`).
    pub fn acl(&self) -> bool {
        options::acl_option(self.options.iter().flat_map(|s| s.split(',')))
    }

    /// The worker count [`MountConfig::threads`] resolves to.
    pub fn thread_count(&self) -> usize {
        match self.threads {
            0 => (WORKERS_PER_CPU * std::thread::available_parallelism().map_or(2, |n| n.get())).clamp(2, THREADS_MAX),
            n => n.min(THREADS_MAX),
        }
    }

    fn fuser_config(&self) -> Config {
        let mut cfg = Config::default();
        let mut acl = if self.allow_other { SessionACL::All } else { SessionACL::Owner };
        for o in self.options.iter().flat_map(|s| s.split(',')).filter(|s| !s.is_empty()) {
            match o {
                "allow_other" => acl = SessionACL::All,
                "allow_root" if acl == SessionACL::Owner => acl = SessionACL::RootAndOwner,
                "allow_root" => {}
                // The engine's (`MountConfig::acl`), not the kernel's.
                "acl" | "noacl" => {}
                _ => cfg.mount_options.push(parse_option(o)),
            }
        }
        if !cfg.mount_options.iter().any(|o| matches!(o, MountOption::FSName(_))) {
            let name = self.fs_name.clone().unwrap_or_else(|| format!("ferrofs:{}", self.image.display()));
            cfg.mount_options.push(MountOption::FSName(name));
        }
        if !cfg.mount_options.iter().any(|o| matches!(o, MountOption::CUSTOM(c) if c.starts_with("subtype="))) {
            cfg.mount_options.push(MountOption::CUSTOM("subtype=ferrofs".into()));
        }
        if self.default_permissions {
            cfg.mount_options.push(MountOption::DefaultPermissions);
        }
        if self.read_only {
            cfg.mount_options.retain(|o| *o != MountOption::RW);
            cfg.mount_options.push(MountOption::RO);
        }
        cfg.mount_options.dedup();
        cfg.acl = acl;
        cfg.n_threads = Some(self.thread_count());
        cfg.clone_fd = true;
        cfg
    }
}

/// Whether to serve through FUSE-over-io_uring rings (`uring.rs`) beside `/dev/fuse`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Uring {
    /// `/dev/fuse` only.
    Off,
    /// Rings if the kernel offers them now; else `/dev/fuse`, with a one-line notice.
    On,
    /// Rings, first switching the fuse module's `enable_uring` parameter on if it is off (a
    /// system-wide setting; root only).
    Force,
}

/// Whether the kernel will offer FUSE over io_uring to the next mount, after switching it on
/// for `Uring::Force`. One line on stderr says why not, or that the setting was changed.
fn uring_available(mode: Uring) -> bool {
    match (mode, uring::parameter()) {
        (Uring::Off, _) => false,
        (_, None) => {
            eprintln!(
                "ferrofs: this kernel has no FUSE over io_uring (CONFIG_FUSE_IO_URING); serving through /dev/fuse"
            );
            false
        }
        (_, Some(true)) => true,
        (Uring::On, Some(false)) => {
            eprintln!(
                "ferrofs: FUSE over io_uring is off ({} is N); serving through /dev/fuse \
                 (as root, -o uring=force switches it on, system-wide)",
                uring::ENABLE_PARAMETER
            );
            false
        }
        (Uring::Force, Some(false)) => match uring::set_parameter(true) {
            Ok(()) => {
                eprintln!(
                    "ferrofs: switched FUSE over io_uring on ({}=Y): a system-wide setting, for every FUSE server",
                    uring::ENABLE_PARAMETER
                );
                true
            }
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                eprintln!(
                    "ferrofs: only root can switch FUSE over io_uring on (-o uring=force sets {}, \
                     system-wide); serving through /dev/fuse",
                    uring::ENABLE_PARAMETER
                );
                false
            }
            Err(e) => {
                eprintln!("ferrofs: cannot switch FUSE over io_uring on ({e}); serving through /dev/fuse");
                false
            }
        },
    }
}

#[derive(Debug, thiserror::Error)]
pub enum MountError {
    #[error("invalid mount configuration: {0}")]
    Config(String),
    /// A mount point or an option that mount(8) would refuse as well.
    #[error("{0}")]
    Refused(String),
    #[error("image {path} is in use by another process (another ferrofs mount or tool holds its lock)")]
    ImageInUse { path: PathBuf },
    #[error("cannot open image {path}: {source}")]
    Image { path: PathBuf, source: io::Error },
    #[error("cannot mount the file system in {path}: {source}")]
    Engine { path: PathBuf, source: ferrofs::Error },
    #[error("FUSE mount on {path} failed: {source}")]
    Fuse { path: PathBuf, source: io::Error },
    #[error("FUSE session on {path} ended with an error: {source}")]
    Session { path: PathBuf, source: io::Error },
    #[error("final checkpoint of {path} failed (the log will be replayed at the next mount): {source}")]
    Unmount { path: PathBuf, source: ferrofs::Error },
}

impl MountError {
    /// The errno behind the failure, when there is one (e.g. EPERM or ENODEV from mount(2)).
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            MountError::Image { source, .. } | MountError::Fuse { source, .. } | MountError::Session { source, .. } => {
                source.raw_os_error()
            }
            MountError::Engine { source, .. } | MountError::Unmount { source, .. } => Some(source.errno()),
            MountError::ImageInUse { .. } => Some(libc::EWOULDBLOCK),
            MountError::Config(_) | MountError::Refused(_) => Some(libc::EINVAL),
        }
    }
}

/// Mount and serve until unmounted or SIGTERM/SIGINT, then checkpoint the engine. `ready`
/// runs once the mount point is usable (a daemonising caller tells its parent there).
///
/// On a signal the mount is detached, if the mount point still shows this mount (never
/// another one mounted there since); it is served until the last file open on it is closed
/// (`kernel_mount.rs`). Installing the signal handlers is
/// process-wide and lasts past the return (the signals are then ignored, not fatal).
pub fn mount(opts: &MountConfig, ready: impl FnOnce()) -> Result<(), MountError> {
    // Catch the signals before mounting: one arriving mid-mount then unmounts cleanly
    // instead of killing the process and leaving a dead mount behind.
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT])
        .map_err(|source| MountError::Session { path: opts.mountpoint.clone(), source })?;
    let signal_handle = signals.handle();
    let handle = spawn_mount(opts)?;
    ready();
    let kernel = handle.kernel.clone();
    let watcher = std::thread::Builder::new()
        .name("ferrofs-signals".into())
        .spawn(move || {
            // Every signal until the session ends: one that finds the mount covered by another
            // leaves it served, and the next may come after that one is gone.
            for sig in signals.forever() {
                log::info!("signal {} received: unmounting {}", sig, kernel.mountpoint().display());
                if let Err(e) = request_unmount(&kernel) {
                    log::error!("{e}");
                }
            }
        })
        .map_err(|source| MountError::Session { path: opts.mountpoint.clone(), source })?;
    let res = handle.join();
    signal_handle.close();
    let _ = watcher.join();
    res
}

/// Mount and serve in background threads. Returns once the kernel has initialised the
/// connection: the mount point is usable when this returns.
pub fn spawn_mount(opts: &MountConfig) -> Result<MountHandle, MountError> {
    let (config, kernel_options) = checked(opts)?;
    let (fs, source_status) = open_engine(opts)?;
    let fs = Arc::new(fs);
    // Until the session exists, a failure leaves the image as clean as we found it.
    let abandon = |err: MountError| {
        if let Err(e) = fs.unmount() {
            log::error!("checkpoint after failed FUSE mount: {}", e);
        }
        err
    };
    let adapter = ops::FerroFuse::new(fs.clone(), opts)
        .map_err(|source| abandon(MountError::Session { path: opts.mountpoint.clone(), source }))?;
    let notifier = adapter.notifier_slot();
    let name_epoch = adapter.name_epoch();
    let workers = adapter.workers();
    let syncs = adapter.sync_pool();
    if uring_available(opts.uring) {
        workers.set_uring(workers::URING_ASKED);
        // Read now, while stderr is still the caller's: a bad value is named there.
        let _ = uring::depth();
    }
    let (fuse, kernel) = KernelMount::mount(&opts.mountpoint, &kernel_options)
        .map_err(|source| abandon(MountError::Fuse { path: opts.mountpoint.clone(), source }))?;
    let session = Session::from_fd(adapter, fuse, config.acl, config).map_err(|source| {
        if let Err(e) = kernel.detach() {
            log::error!("detaching the failed mount on {}: {e}", opts.mountpoint.display());
        }
        abandon(MountError::Fuse { path: opts.mountpoint.clone(), source })
    })?;
    // INIT has been answered: the rings are registered as the session starts, if INIT got them.
    let rings = match (workers.uring(), session.as_fd().try_clone_to_owned()) {
        (workers::URING_ON, Ok(conn)) => Some(conn),
        (workers::URING_ON, Err(e)) => {
            return Err(abandon(MountError::Fuse { path: opts.mountpoint.clone(), source: e }))
        }
        _ => None,
    };
    // Before any request is served: the session's threads start only in `run`.
    let _ = notifier.set(session.notifier());
    match session.as_fd().try_clone_to_owned() {
        Ok(conn) => name_epoch.attach(conn),
        Err(e) => log::warn!(
            "cannot expire cached names on {} at once (they are invalidated one by one): {e}",
            opts.mountpoint.display()
        ),
    }
    // Without it a parked worker could not tell that the connection has ended, so none parks.
    match session.as_fd().try_clone_to_owned() {
        Ok(conn) => workers.attach(conn),
        Err(e) => log::warn!(
            "cannot watch the connection of {} (its extra workers will not park): {e}",
            opts.mountpoint.display()
        ),
    }
    let mountpoint = opts.mountpoint.clone();
    let workers_for_rings = workers.clone();
    let handle_workers = workers.clone();
    // Weak: the handle reads the cache usage while the session lives, but must not keep the
    // engine (and its caches, counted against a shared budget) alive after it has ended.
    let engine = Arc::downgrade(&fs);
    // Statistics are a diagnostic: a mount without its control socket still serves files.
    let control = control::ControlServer::start(&opts.mountpoint, engine.clone(), workers, source_status)
        .inspect_err(|e| {
            log::warn!("no control socket for {} (ferrofs lockstat will not reach it): {e}", opts.mountpoint.display())
        })
        .ok();
    let thread = std::thread::Builder::new()
        .name("ferrofs-session".into())
        .spawn(move || {
            let _control = control;
            serve(session, rings, &workers_for_rings, syncs, fs, mountpoint)
        })
        .map_err(|source| MountError::Session { path: opts.mountpoint.clone(), source })?;
    Ok(MountHandle {
        mountpoint: opts.mountpoint.clone(),
        image: opts.image.clone(),
        engine,
        kernel: Arc::new(kernel),
        thread: Some(thread),
        workers: handle_workers,
    })
}

/// Remount the ferrofs mount on `mountpoint` read-only or read-write, as `mount -o
/// remount,ro` asks through the mount helper. To read-only: the kernel first (it refuses while
/// a file is open for writing, and from then on fails every change with EROFS itself), then the
/// daemon, through its control socket, which writes its log home (the image on disk is clean
/// while it stays so) and refuses changes too. To read-write: the daemon first, then the
/// kernel; if the kernel refuses, the daemon goes back to read-only.
pub fn remount(mountpoint: &Path, read_only: bool) -> io::Result<()> {
    // The control socket is named after the mount point, so with mounts stacked there it
    // reaches the daemon of one of them only, not necessarily the top one the kernel remounts.
    if kernel_mount::mounts_on(mountpoint)? > 1 {
        return Err(io::Error::other(format!(
            "several mounts are stacked on {}: unmount the others first",
            mountpoint.display()
        )));
    }
    let tell_daemon =
        |read_only: bool| control::request(mountpoint, if read_only { "remount ro" } else { "remount rw" }).map(drop);
    if read_only {
        kernel_mount::remount_kernel(mountpoint, true)?;
        return tell_daemon(true);
    }
    tell_daemon(false)?;
    kernel_mount::remount_kernel(mountpoint, false).inspect_err(|_| {
        if let Err(e) = tell_daemon(true) {
            log::error!(
                "{} stays read-only in the kernel, but its daemon could not go back to read-only: {e}",
                mountpoint.display()
            );
        }
    })
}

/// What mount(8) would refuse, refused before the image is opened: a mount point that is not
/// a directory, an unknown option, too many threads. A daemonising caller checks before it
/// forks, so that the user sees the reason at once.
pub fn check(opts: &MountConfig) -> Result<(), MountError> {
    checked(opts).map(drop)
}

/// [`check`], returning fuser's configuration and the kernel's options.
fn checked(opts: &MountConfig) -> Result<(Config, KernelOptions), MountError> {
    if opts.threads > THREADS_MAX {
        return Err(MountError::Config(format!("{} threads requested, at most {} allowed", opts.threads, THREADS_MAX)));
    }
    kernel_mount::check_mountpoint(&opts.mountpoint).map_err(MountError::Refused)?;
    let config = opts.fuser_config();
    let kernel_options = KernelOptions::new(&config.mount_options, config.acl).map_err(MountError::Refused)?;
    Ok((config, kernel_options))
}

/// The engine over the image, and the status of a [`MountConfig::device`].
fn open_engine(opts: &MountConfig) -> Result<(FileSystem, Option<control::SourceStatus>), MountError> {
    let path = opts.image.clone();
    let Some(source) = &opts.device else { return Ok((open_image(opts)?, None)) };
    let opened = (source.open)().map_err(|source| MountError::Image { path: path.clone(), source })?;
    let mopts = engine_options(opts);
    let fs = FileSystem::mount_device(opened.device, &MountOptions { read_only: true, ..mopts })
        .map_err(|source| MountError::Engine { path: path.clone(), source })?;
    // Nothing may be written to it, so a log to replay would be replayed by every mount.
    let replayed = fs.info().log_records_replayed;
    if replayed > 0 {
        return Err(MountError::Refused(format!(
            "{}: the image's log holds {replayed} records to replay: it was not checkpointed (publish it again: `ferrofs publish` replays the log first)",
            path.display()
        )));
    }
    Ok((fs, Some(opened.status)))
}

fn open_image(opts: &MountConfig) -> Result<FileSystem, MountError> {
    let path = opts.image.clone();
    let dev = FileDevice::open(&opts.image, opts.read_only).or_else(|e| match e.kind() {
        io::ErrorKind::WouldBlock if !opts.lock_timeout.is_zero() => {
            eprintln!(
                "ferrofs: {} is locked by another process; waiting up to {} s for it to let go",
                path.display(),
                opts.lock_timeout.as_secs()
            );
            FileDevice::open_wait(&opts.image, opts.read_only, opts.lock_timeout)
        }
        _ => Err(e),
    });
    let dev = dev.map_err(|source| {
        if source.kind() == io::ErrorKind::WouldBlock {
            MountError::ImageInUse { path: path.clone() }
        } else {
            MountError::Image { path: path.clone(), source }
        }
    })?;
    FileSystem::mount_device(Arc::new(dev), &engine_options(opts)).map_err(|source| MountError::Engine { path, source })
}

fn engine_options(opts: &MountConfig) -> MountOptions {
    let cache = opts.cache.clone().or_else(|| opts.cache_bytes.map(CacheBudget::new));
    let (atime, nodiratime) = options::atime_options(opts.options.iter().flat_map(|s| s.split(',')));
    let noacl = !opts.acl();
    MountOptions {
        read_only: opts.read_only,
        cache,
        atime,
        nodiratime,
        discard: opts.discard,
        noacl,
        ..MountOptions::default()
    }
}

/// The session thread: run the workers until the connection ends, then checkpoint.
/// `rings`: the connection's descriptor, when INIT negotiated FUSE over io_uring.
fn serve(
    session: Session<ops::FerroFuse>,
    rings: Option<std::os::fd::OwnedFd>,
    workers: &Arc<workers::Workers>,
    syncs: Arc<sync_pool::SyncPool>,
    fs: Arc<FileSystem>,
    mountpoint: PathBuf,
) -> Result<(), MountError> {
    // fuser ends a worker's loop quietly when its read finds the connection gone (ENODEV). On
    // this kernel (6.18) a reader can instead get ECONNABORTED as a lazily detached mount is
    // torn down: with 8 workers, in about one SIGTERM-while-busy unmount in five (the mount
    // test `sigterm_unmounts_and_checkpoints`), never with 2. Either way the connection is
    // over and every request was answered or failed by the kernel, so it is an end, not an
    // error.
    let start_rings = |dispatcher| match &rings {
        Some(conn) => {
            let config = uring::QueueConfig { depth: uring::depth(), payload: MAX_WRITE as usize };
            let offload = uring::Offload { fs: fs.clone(), pool: syncs.clone() };
            uring::start(conn, dispatcher, config, workers, Some(&offload))
        }
        None => Ok(Vec::new()),
    };
    let served = session.run_with(start_rings).or_else(|e| match e.raw_os_error() {
        Some(libc::ECONNABORTED) => {
            log::warn!("the kernel aborted the connection of {}", mountpoint.display());
            Ok(())
        }
        _ => Err(e),
    });
    // The workers have all returned and dropped the adapter: no request is in flight.
    let checkpoint = fs.unmount();
    served.map_err(|source| MountError::Session { path: mountpoint.clone(), source })?;
    checkpoint.map_err(|source| MountError::Unmount { path: mountpoint, source })
}

/// Detach our mount (lazily: the kernel ends the connection once the last open file on it is
/// closed) if the mount point still shows it; an error if another mount covers it.
fn request_unmount(kernel: &KernelMount) -> io::Result<()> {
    match kernel.detach()? {
        Detach::Detached | Detach::Gone => Ok(()),
        Detach::Covered => Err(io::Error::other(format!(
            "not unmounting {}: another mount now covers this one there (unmount that one first)",
            kernel.mountpoint().display()
        ))),
    }
}

/// A mount served by background threads. Dropping it detaches the mount (if it is still there)
/// and waits for the session to end.
pub struct MountHandle {
    mountpoint: PathBuf,
    image: PathBuf,
    engine: Weak<FileSystem>,
    kernel: Arc<KernelMount>,
    thread: Option<JoinHandle<Result<(), MountError>>>,
    workers: Arc<workers::Workers>,
}

impl MountHandle {
    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    pub fn image(&self) -> &Path {
        &self.image
    }

    /// Bytes this file system's inode and buffer caches hold (0 once the session has ended).
    pub fn cache_bytes(&self) -> u64 {
        self.engine.upgrade().map_or(0, |fs| fs.stats().cache_usage.own_bytes)
    }

    /// How requests reach the daemon: `"io_uring"` (rings negotiated and started) or
    /// `"/dev/fuse"`.
    pub fn transport(&self) -> &'static str {
        self.workers.stats().transport()
    }

    /// Whether the session has ended (unmounted from outside, or failed).
    pub fn is_finished(&self) -> bool {
        self.thread.as_ref().is_none_or(|t| t.is_finished())
    }

    /// Unmount (lazily if files are still open), wait for the session to end and the engine
    /// to checkpoint.
    pub fn unmount(mut self) -> Result<(), MountError> {
        self.request_unmount()?;
        self.wait()
    }

    /// Ask for the unmount (lazily if files are still open) without waiting for it, so that
    /// a process serving several mounts can detach them all before it waits for any.
    pub fn request_unmount(&self) -> Result<(), MountError> {
        if self.is_finished() {
            return Ok(());
        }
        request_unmount(&self.kernel).map_err(|source| MountError::Session { path: self.mountpoint.clone(), source })
    }

    /// Wait until the file system is unmounted from outside (`umount`, `fusermount3 -u`).
    pub fn join(mut self) -> Result<(), MountError> {
        self.wait()
    }

    fn wait(&mut self) -> Result<(), MountError> {
        match self.thread.take() {
            Some(t) => t.join().unwrap_or_else(|_| {
                Err(MountError::Session {
                    path: self.mountpoint.clone(),
                    source: io::Error::other("session thread panicked"),
                })
            }),
            None => Ok(()),
        }
    }
}

impl Drop for MountHandle {
    fn drop(&mut self) {
        if self.thread.is_some() {
            if !self.is_finished() {
                if let Err(e) = request_unmount(&self.kernel) {
                    // Waiting would wait for an unmount that will not come.
                    return log::error!("unmount of {} failed: {}", self.mountpoint.display(), e);
                }
            }
            if let Err(e) = self.wait() {
                log::error!("{}", e);
            }
        }
    }
}
