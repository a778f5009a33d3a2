//! The shared daemon: one process serving several images, mounts added and removed at run
//! time, all sharing one cache budget (seed 004). `ferrofs mount --shared` and
//! `ferrofs mounts` talk to it.
//!
//! The daemon listens on `daemon.sock` in the user's runtime directory (`/run/ferrofs` for
//! root, `$XDG_RUNTIME_DIR/ferrofs` otherwise; `$FERROFS_DAEMON_SOCKET` overrides it), mode
//! 0600, and holds an exclusive `flock` on `daemon.sock.lock` for its whole life. A client
//! connects; if nobody answers it takes that lock itself, which proves no daemon lives (or is
//! starting), binds the socket and forks the daemon while still single-threaded, exactly as
//! `--daemon` does. Two clients racing to start one therefore start one: the loser finds the
//! lock taken and retries the socket until the winner's daemon answers.
//!
//! A client sends one JSON request and closes its writing side; the daemon answers one JSON
//! reply and closes. Requests are served one at a time on the daemon's main thread; each mount
//! is its own `spawn_mount` session (own FUSE connection, workers and control socket), so a
//! mount that fails is reported to its requester and touches no other. The daemon exits once
//! its last mount has ended; SIGTERM or SIGINT unmounts them all (each checkpoints) first.

use crate::daemon;
use crate::failure::{CliResult, Context};
use crate::mount_config::{self, MountArgs, LOCK_WAIT};
use crate::units::human_bytes;
use clap::Args;
use ferrofs::{CacheBudget, DEFAULT_CACHE_BYTES};
use ferrofs_fuse::{MountConfig, MountHandle};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Longest request a client may send (paths and options).
const REQUEST_MAX: u64 = 64 << 10;
/// How long the daemon waits for a connected client to send its request: requests are served
/// one at a time, so a silent client must not stall the others for long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the idle daemon looks for ended sessions and signals. A session ending has no
/// descriptor to wait on, so the accept loop polls with this timeout.
const TICK_MS: i32 = 200;

#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(tag = "op", rename_all = "snake_case")]
enum Request {
    /// Mount `image` on `mountpoint` (both canonical: the daemon's working directory is not
    /// the client's) with these `-o` options.
    Mount {
        image: PathBuf,
        mountpoint: PathBuf,
        options: Vec<String>,
    },
    Status,
}

#[derive(Serialize, Deserialize, Debug)]
#[serde(tag = "reply", rename_all = "snake_case")]
enum Reply {
    Mounted { cache_limit: u64 },
    Status(Status),
    Error { message: String },
}

#[derive(Serialize, Deserialize, Debug)]
struct Status {
    pid: u32,
    cache_limit: u64,
    cache_used: u64,
    mounts: Vec<MountStatus>,
}

#[derive(Serialize, Deserialize, Debug)]
struct MountStatus {
    image: PathBuf,
    mountpoint: PathBuf,
    cache_bytes: u64,
    /// The image's label and UUID ("" if unreadable, or from a daemon that did not say).
    #[serde(default)]
    label: String,
    #[serde(default)]
    uuid: String,
    /// How requests reach it: "/dev/fuse" or "io_uring" (`-o uring`).
    #[serde(default)]
    transport: String,
}

/// Where the shared daemon of this user listens.
fn socket_path() -> PathBuf {
    match std::env::var_os("FERROFS_DAEMON_SOCKET") {
        // Absolute: the daemon removes it from another working directory when it exits.
        Some(p) => std::path::absolute(&p).unwrap_or_else(|_| PathBuf::from(p)),
        None => ferrofs_fuse::runtime_dir().join("daemon.sock"),
    }
}

fn lock_path(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// Why a request got no reply.
enum Unanswered {
    /// Nothing listens: no daemon runs (or a killed one left its socket behind).
    NoDaemon,
    /// The daemon closed the connection without answering: it was exiting (its last mount
    /// had ended) when we connected.
    Gone,
    Failed(io::Error),
}

fn ask(socket: &Path, request: &Request) -> Result<Reply, Unanswered> {
    let mut conn = match UnixStream::connect(socket) {
        Ok(c) => c,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ECONNREFUSED)) => {
            return Err(Unanswered::NoDaemon)
        }
        Err(e) => {
            return Err(Unanswered::Failed(io::Error::new(
                e.kind(),
                format!("cannot reach the shared daemon at {}: {e}", socket.display()),
            )))
        }
    };
    let text = serde_json::to_vec(request).map_err(|e| Unanswered::Failed(io::Error::other(e)))?;
    match send_all(&conn, &text).and_then(|()| conn.shutdown(std::net::Shutdown::Write)) {
        Ok(()) => {}
        Err(e) if matches!(e.raw_os_error(), Some(libc::EPIPE | libc::ECONNRESET)) => return Err(Unanswered::Gone),
        Err(e) => return Err(Unanswered::Failed(e)),
    }
    let mut answer = Vec::new();
    match conn.read_to_end(&mut answer) {
        Ok(0) => Err(Unanswered::Gone),
        Ok(_) => serde_json::from_slice(&answer).map_err(|e| {
            Unanswered::Failed(io::Error::other(format!(
                "the shared daemon at {} sent an unreadable reply: {e}",
                socket.display()
            )))
        }),
        Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => Err(Unanswered::Gone),
        Err(e) => Err(Unanswered::Failed(e)),
    }
}

/// Write all of `buf` without raising SIGPIPE: `main` restores its default action, and a
/// daemon that closes the connection while exiting must make the client retry, not die.
fn send_all(conn: &UnixStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        // SAFETY: `buf` is valid for `buf.len()` bytes and the descriptor is open.
        let n = unsafe { libc::send(conn.as_raw_fd(), buf.as_ptr().cast(), buf.len(), libc::MSG_NOSIGNAL) };
        match n {
            n if n > 0 => buf = &buf[n as usize..],
            0 => return Err(io::ErrorKind::WriteZero.into()),
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(())
}

/// `ferrofs mount --shared`: have the shared daemon mount `cfg` (starting one if none runs)
/// and return once the mount is usable, or with the daemon's reason it is not.
pub fn mount(args: &MountArgs, cfg: &MountConfig) -> Result<(), String> {
    let mountpoint =
        args.mountpoint.canonicalize().map_err(|e| format!("mount point {}: {e}", args.mountpoint.display()))?;
    let mut options = args.options.clone();
    if let Some(t) = args.threads {
        options.push(format!("threads={t}"));
    }
    let request = Request::Mount { image: cfg.image.clone(), mountpoint: mountpoint.clone(), options };
    let socket = socket_path();
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        match ask(&socket, &request) {
            Ok(Reply::Mounted { cache_limit }) => {
                if let Some(asked) = cfg.cache_bytes.filter(|b| *b != cache_limit) {
                    eprintln!(
                        "ferrofs: warning: cache_size={} ignored: the shared daemon's cache budget is {}, set by the mount that started it",
                        human_bytes(asked),
                        human_bytes(cache_limit)
                    );
                }
                return Ok(());
            }
            Ok(Reply::Error { message }) => return Err(message),
            Ok(other) => {
                return Err(format!("the shared daemon at {} answered a mount with {other:?}", socket.display()))
            }
            Err(Unanswered::Failed(e)) => return Err(e.to_string()),
            Err(Unanswered::Gone) => {}
            Err(Unanswered::NoDaemon) => {
                if let Some(lock) = try_lock(&socket).map_err(|e| e.to_string())? {
                    let mut cfg = cfg.clone();
                    cfg.mountpoint = mountpoint;
                    return start_daemon(&cfg, &socket, lock).map_err(|e| e.to_string());
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!(
                "a shared daemon holds {} but does not answer on {}",
                lock_path(&socket).display(),
                socket.display()
            ));
        }
        // A daemon is starting (its first mount is in progress) or exiting: ask again.
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The daemon lock, if no daemon holds it.
fn try_lock(socket: &Path) -> io::Result<Option<File>> {
    let dir = socket.parent().unwrap_or(Path::new("/"));
    std::fs::create_dir_all(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot make {}: {e}", dir.display())))?;
    let path = lock_path(socket);
    // 0600: flock needs no write permission, so a lock file others could open would let them
    // keep this user's daemon from starting.
    let lock = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("daemon lock {}: {e}", path.display())))?;
    // SAFETY: flock on a descriptor we own.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(Some(lock));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EWOULDBLOCK) => Ok(None),
        _ => Err(io::Error::new(e.kind(), format!("daemon lock {}: {e}", path.display()))),
    }
}

/// Bind the daemon socket and fork the daemon, which mounts `cfg` first; return once it says
/// the mount is ready. Called holding the daemon lock, while still single-threaded.
fn start_daemon(cfg: &MountConfig, socket: &Path, lock: File) -> io::Result<()> {
    // Holding the lock proves that whatever socket is there belongs to a dead daemon.
    match std::fs::remove_file(socket) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => {
            return Err(io::Error::new(e.kind(), format!("stale daemon socket {}: {e}", socket.display())))
        }
        _ => {}
    }
    // Created 0600 in one step: a socket that anyone could reach even briefly would let them
    // ask this user's daemon to mount things. (No thread runs yet to see the umask.)
    // SAFETY: umask has no preconditions.
    let old = unsafe { libc::umask(0o177) };
    let bound = UnixListener::bind(socket);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let listener =
        bound.map_err(|e| io::Error::new(e.kind(), format!("cannot listen on {}: {e}", socket.display())))?;
    let (mut from_daemon, to_parent) = daemon::pipe()?;
    // SAFETY: the process is single-threaded here (nothing has spawned a thread yet), so the
    // child may go on running arbitrary code after fork.
    match unsafe { libc::fork() } {
        -1 => Err(io::Error::last_os_error()),
        0 => {
            drop(from_daemon);
            std::process::exit(daemon_main(cfg, Daemon::new(listener, socket, lock, cfg), to_parent))
        }
        _ => {
            // The child's copies keep the socket open and the lock held (a flock belongs to
            // the open file, which both processes share).
            drop((to_parent, listener, lock));
            let mut said = String::new();
            from_daemon.read_to_string(&mut said)?;
            match said.strip_prefix("ok") {
                Some(_) => Ok(()),
                None if said.is_empty() => Err(io::Error::other("the shared daemon exited before mounting")),
                None => Err(io::Error::other(said)),
            }
        }
    }
}

struct Daemon {
    listener: UnixListener,
    socket: PathBuf,
    /// Held for the daemon's whole life: while it is, no other daemon starts.
    _lock: File,
    budget: Arc<CacheBudget>,
    mounts: Vec<MountHandle>,
}

/// The forked daemon: mount `cfg`, tell the parent through `report`, then serve requests
/// until the last mount has ended or a signal has unmounted them all.
fn daemon_main(cfg: &MountConfig, mut daemon: Daemon, report: OwnedFd) -> i32 {
    daemon::become_daemon();
    crate::logging::init(Some(crate::logging::SHARED_DAEMON), None);
    let mut report = File::from(report);
    let stop = Arc::new(AtomicBool::new(false));
    // Registered before the first mount: a signal arriving during it then unmounts cleanly
    // once it is up instead of killing the process mid-mount.
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            let _ = write!(report, "cannot catch signal {sig}: {e}");
            daemon.remove_socket();
            return 1;
        }
    }
    if let Err(e) = daemon.mount(cfg.clone()) {
        let _ = write!(report, "{e}");
        daemon.remove_socket();
        return 1;
    }
    let _ = report.write_all(b"ok");
    drop(report);
    daemon::detach_stdio();
    crate::logging::detached();
    // Mount points and images are absolute; do not keep the starter's directory busy.
    let _ = std::env::set_current_dir("/");
    daemon.serve(&stop);
    0
}

impl Daemon {
    fn new(listener: UnixListener, socket: &Path, lock: File, cfg: &MountConfig) -> Daemon {
        let limit = cfg.cache_bytes.unwrap_or(DEFAULT_CACHE_BYTES);
        Daemon {
            listener,
            socket: socket.to_path_buf(),
            _lock: lock,
            budget: CacheBudget::for_process(limit),
            mounts: Vec::new(),
        }
    }

    fn mount(&mut self, mut cfg: MountConfig) -> Result<(), String> {
        cfg.cache = Some(self.budget.clone());
        let handle = ferrofs_fuse::spawn_mount(&cfg).map_err(|e| e.to_string())?;
        self.mounts.push(handle);
        Ok(())
    }

    fn serve(mut self, stop: &AtomicBool) {
        loop {
            if stop.load(Ordering::Relaxed) {
                return self.shut_down();
            }
            self.reap();
            if self.mounts.is_empty() {
                // Unlink first: from now on clients find no daemon and start a new one (after
                // this process has exited and dropped the lock); one already queued on the
                // socket sees it closed unanswered and does the same.
                return self.remove_socket();
            }
            let mut fd = libc::pollfd { fd: self.listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(&mut fd, 1, TICK_MS) } == 1 {
                if let Ok((conn, _)) = self.listener.accept() {
                    // A client that misbehaves only loses its own connection.
                    let _ = self.answer(conn);
                }
            }
        }
    }

    /// Forget sessions that have ended (unmounted from outside), logging any failure.
    fn reap(&mut self) {
        let (ended, live): (Vec<_>, Vec<_>) =
            std::mem::take(&mut self.mounts).into_iter().partition(MountHandle::is_finished);
        self.mounts = live;
        for m in ended {
            if let Err(e) = m.join() {
                log::error!("{e}");
            }
        }
    }

    /// Unmount everything (each engine checkpoints) and stop listening.
    fn shut_down(mut self) {
        self.remove_socket();
        // Ask for every unmount before waiting for any: a busy mount is detached lazily and
        // may take until its last file is closed, which must not hold up the others.
        for m in &self.mounts {
            if let Err(e) = m.request_unmount() {
                log::error!("{e}");
            }
        }
        for m in std::mem::take(&mut self.mounts) {
            if let Err(e) = m.join() {
                log::error!("{e}");
            }
        }
    }

    fn remove_socket(&self) {
        let _ = std::fs::remove_file(&self.socket);
    }

    fn answer(&mut self, conn: UnixStream) -> io::Result<()> {
        // Accepted sockets do not inherit the listener's flags on Linux; say so anyway.
        conn.set_nonblocking(false)?;
        conn.set_read_timeout(Some(REQUEST_TIMEOUT))?;
        let mut text = Vec::new();
        (&conn).take(REQUEST_MAX).read_to_end(&mut text)?;
        let reply = match serde_json::from_slice::<Request>(&text) {
            Ok(request) => self.handle(request),
            Err(e) => Reply::Error { message: format!("bad request to the shared daemon: {e}") },
        };
        let text = serde_json::to_vec(&reply).map_err(io::Error::other)?;
        (&conn).write_all(&text)
    }

    fn handle(&mut self, request: Request) -> Reply {
        match request {
            Request::Mount { image, mountpoint, .. } if !image.is_absolute() || !mountpoint.is_absolute() => {
                Reply::Error {
                    message: format!(
                        "the shared daemon needs absolute paths, not {} and {}",
                        image.display(),
                        mountpoint.display()
                    ),
                }
            }
            Request::Mount { image, mountpoint, options } => {
                let args =
                    MountArgs { image, mountpoint, options, threads: None, mkfs: None, daemon: false, shared: true };
                let res = mount_config::config(&args).and_then(|cfg| match mount_config::mounted_on(&cfg.image) {
                    Some(dir) => Err(format!("the image is already mounted on {dir}")),
                    None => self.mount(cfg),
                });
                match res {
                    Ok(()) => Reply::Mounted { cache_limit: self.budget.limit() },
                    Err(message) => Reply::Error { message },
                }
            }
            Request::Status => Reply::Status(Status {
                pid: std::process::id(),
                cache_limit: self.budget.limit(),
                cache_used: self.budget.used(),
                mounts: self
                    .mounts
                    .iter()
                    .filter(|m| !m.is_finished())
                    .map(|m| {
                        let (label, uuid) = crate::image::identity(m.image()).unwrap_or_default();
                        MountStatus {
                            image: m.image().to_path_buf(),
                            mountpoint: m.mountpoint().to_path_buf(),
                            cache_bytes: m.cache_bytes(),
                            label,
                            uuid,
                            transport: m.transport().to_string(),
                        }
                    })
                    .collect(),
            }),
        }
    }
}

#[derive(Args, Debug)]
pub struct MountsArgs {
    /// Print JSON: the shared daemon's status as one object (if it runs), then one array of
    /// the mounts with a daemon of their own.
    #[arg(long)]
    pub json: bool,
}

/// A mount served by a daemon of its own (`ferrofs mount`, `--daemon`, mount(8)) of an image
/// file, as `ferrofs mounts` shows it.
#[derive(Serialize, Debug)]
struct OwnMount {
    image: PathBuf,
    mountpoint: PathBuf,
    /// "io_uring", "/dev/fuse", or "unknown" when its control socket does not answer (another
    /// user's mount, or a daemon older than the `transport` command).
    transport: String,
}

/// `ferrofs mounts`: what the shared daemon serves and how much of its cache budget it uses,
/// then the mounts served by daemons of their own; each with its transport.
pub fn list(args: &MountsArgs) -> CliResult<()> {
    let socket = socket_path();
    let what = || format!("mounts (shared daemon at {})", socket.display());
    let status = match ask(&socket, &Request::Status) {
        Ok(Reply::Status(s)) => Some(s),
        Ok(other) => return Err(io::Error::other(format!("unexpected reply {other:?}"))).context(what),
        Err(Unanswered::NoDaemon | Unanswered::Gone) => None,
        Err(Unanswered::Failed(e)) => return Err(e).context(what),
    };
    match &status {
        // In JSON, its absence is the answer: what follows stays one JSON document.
        None if args.json => {}
        None => println!("no shared ferrofs daemon is running"),
        Some(status) if args.json => println!("{}", serde_json::to_string_pretty(status).context(what)?),
        Some(status) => print_shared(status),
    }
    let served: Vec<&Path> = status.iter().flat_map(|s| &s.mounts).map(|m| m.mountpoint.as_path()).collect();
    let own: Vec<OwnMount> = ferrofs_mounts()
        .into_iter()
        .filter(|(source, mountpoint)| !source.starts_with("s3://") && !served.contains(&mountpoint.as_path()))
        .map(|(source, mountpoint)| OwnMount { image: source.into(), transport: transport_of(&mountpoint), mountpoint })
        .collect();
    let published = crate::mount_remote::statuses();
    if !args.json {
        print_own(&own);
        crate::mount_remote::print(&published);
        return Ok(());
    }
    // One array of every mount with a daemon of its own: image files, then published images.
    let listed = own
        .iter()
        .map(serde_json::to_value)
        .chain(published.iter().map(serde_json::to_value))
        .collect::<Result<Vec<_>, _>>()
        .context(what)?;
    if !listed.is_empty() {
        println!("{}", serde_json::to_string_pretty(&listed).context(what)?);
    }
    Ok(())
}

fn print_shared(status: &Status) {
    println!(
        "shared daemon pid {}: caches hold {} of {}",
        status.pid,
        human_bytes(status.cache_used),
        human_bytes(status.cache_limit)
    );
    let column =
        |title: &str, len: fn(&MountStatus) -> usize| status.mounts.iter().map(len).max().unwrap_or(0).max(title.len());
    let width = column("IMAGE", |m| m.image.as_os_str().len());
    let mwidth = column("MOUNT POINT", |m| m.mountpoint.as_os_str().len());
    let lwidth = column("LABEL", |m| m.label.len());
    println!(
        "{:width$}  {:mwidth$}  {:lwidth$}  {:36}  {:9}  CACHE",
        "IMAGE", "MOUNT POINT", "LABEL", "UUID", "TRANSPORT"
    );
    for m in &status.mounts {
        println!(
            "{:width$}  {:mwidth$}  {:lwidth$}  {:36}  {:9}  {}",
            m.image.display().to_string(),
            m.mountpoint.display().to_string(),
            m.label,
            m.uuid,
            m.transport,
            human_bytes(m.cache_bytes)
        );
    }
}

fn print_own(mounts: &[OwnMount]) {
    if mounts.is_empty() {
        return;
    }
    let width = mounts.iter().map(|m| m.image.as_os_str().len()).max().unwrap_or(0).max("IMAGE".len());
    let mwidth = mounts.iter().map(|m| m.mountpoint.as_os_str().len()).max().unwrap_or(0).max("MOUNT POINT".len());
    println!("mounts with a daemon of their own:");
    println!("{:width$}  {:mwidth$}  TRANSPORT", "IMAGE", "MOUNT POINT");
    for m in mounts {
        println!(
            "{:width$}  {:mwidth$}  {}",
            m.image.display().to_string(),
            m.mountpoint.display().to_string(),
            m.transport
        );
    }
}

/// How requests reach the daemon of the mount on `mountpoint`, as its control socket says.
pub(crate) fn transport_of(mountpoint: &Path) -> String {
    ferrofs_fuse::control_request(mountpoint, "transport").map_or_else(|_| "unknown".into(), |t| t.trim().to_string())
}

/// Every ferrofs mount of this machine (image file or published image): source and mount
/// point, from mountinfo.
pub(crate) fn ferrofs_mounts() -> Vec<(String, PathBuf)> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    info.lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let mut r = right.split(' ');
            let (fstype, source) = (r.next()?, r.next()?);
            let mountpoint = PathBuf::from(unescape(left.split(' ').nth(4)?));
            (fstype == "fuse.ferrofs").then(|| (unescape(source), mountpoint))
        })
        .collect()
}

/// mountinfo escapes space, tab, newline and backslash as octal.
fn unescape(field: &str) -> String {
    field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip() {
        let r = Request::Mount { image: "/i.img".into(), mountpoint: "/mnt".into(), options: vec!["ro".into()] };
        let text = serde_json::to_string(&r).unwrap();
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), r);
        assert!(serde_json::from_str::<Request>(r#"{"op":"format"}"#).is_err());
    }

    #[test]
    fn the_lock_sits_beside_the_socket() {
        assert_eq!(lock_path(Path::new("/run/ferrofs/daemon.sock")), Path::new("/run/ferrofs/daemon.sock.lock"));
    }
}
