//! The control socket of a mount: lock statistics of a running daemon, read by
//! `ferrofs lockstat MOUNTPOINT`.
//!
//! Each mount listens on a Unix socket named after its mount point, in `/run/ferrofs` (or
//! `$XDG_RUNTIME_DIR/ferrofs` for a user's mount), mode 0600: only the user who mounted may
//! read or reset the statistics. A client sends one command line and reads the answer until
//! the daemon closes the connection:
//!
//! | command        | answer |
//! |----------------|--------|
//! | `table N`      | the top N lock classes by wait time, as a lockstat-like table |
//! | `json`         | every class's counters as JSON |
//! | `journal`      | this mount's journal counters as JSON (commits, checkpoints, bytes logged, items written home, ...), its cache budget's (`cache_`: reclaim, stalls, throttled transactions) and its FUSE workers' (`workers_`: in all, always reading, parked now, woken, parks) |
//! | `memory`       | the daemon's memory as JSON: its cache budget's limit, estimated use and, for a budget that bounds the process, the rest of the process's memory as last sampled (`cache_`), the heap in use (allocations counted whole, touched or not: each worker's 16 MiB request buffer is in it; and of it, chunks malloc mapped on their own) and held free by malloc (`heap_`), RSS and peak RSS |
//! | `transport`    | how requests reach the daemon: `io_uring` or `/dev/fuse` (`ferrofs mounts`) |
//! | `reset`        | zero the counters (to measure one workload); answers `ok` |
//! | `timing on`/`timing off` | switch hold-time measurement at run time; answers `ok` |
//! | `trim MIN`     | give the free space of the durable state back to the host (`ferrofs trim`): punch every free run of at least MIN bytes; answers `{"bytes": B, "extents": N, "unsupported": false}` |
//! | `source`       | a published image's device counters as JSON (generation, cache hits and misses, bytes fetched and read); an error for an image file |
//! | `remount ro`/`remount rw` | refuse every change (EROFS) after writing the log home, or accept changes again (what `mount -o remount,ro` asks for after the kernel's own remount); answers `ok` |
//! | `freeze`       | freeze the file system (`FileSystem::freeze`, FIFREEZE): answers `frozen` once the image is a clean checkpoint that nothing writes, and holds it so for as long as the connection stays open; the next line (`thaw`) or the connection's end, a killed client's included, thaws it, answered by `ok`. Changes wait meanwhile, reads go on |

use crate::workers::Workers;
use ferrofs::FileSystem;
use ferrofs_lockstat as lockstat;
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::*};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

/// Longest command line a client may send.
const COMMAND_MAX: u64 = 64;

/// The directory of this user's ferrofs sockets (and image locks).
pub use ferrofs::dev::runtime_dir;

/// Where the control socket of the mount on `mountpoint` lives.
pub fn socket_path(mountpoint: &Path) -> io::Result<PathBuf> {
    let canon = mountpoint.canonicalize()?;
    let dir = runtime_dir();
    // A hash keeps the name short and free of slashes; the canonical path makes it unique.
    let crc = crc32c::crc32c(canon.as_os_str().as_encoded_bytes());
    let base = canon
        .file_name()
        .map_or("root".into(), |n| n.to_string_lossy().replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
    Ok(dir.join(format!("{base}-{crc:08x}.sock")))
}

/// The `source` command's answer of a mount of a provided device (`MountConfig::device`).
pub(crate) type SourceStatus = Box<dyn Fn() -> String + Send + Sync>;

/// A listening control socket; dropping it stops the listener and removes the socket.
pub(crate) struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    pub(crate) fn start(
        mountpoint: &Path,
        engine: Weak<FileSystem>,
        workers: Arc<Workers>,
        source: Option<SourceStatus>,
    ) -> io::Result<ControlServer> {
        let path = socket_path(mountpoint)?;
        let dir = path.parent().expect("socket path has a directory");
        std::fs::create_dir_all(dir)?;
        // A socket left by a daemon that was killed: nobody answers on it any more.
        if path.exists() && UnixStream::connect(&path).is_err() {
            std::fs::remove_file(&path)?;
        }
        let listener = UnixListener::bind(&path)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new().name("ferrofs-control".into()).spawn(move || {
            for conn in listener.incoming() {
                if flag.load(Acquire) {
                    return;
                }
                if let Ok(conn) = conn {
                    // A misbehaving client only gets its own connection closed.
                    let _ = serve(conn, &engine, &workers, source.as_deref());
                }
            }
        })?;
        Ok(ControlServer { path, stop, thread: Some(thread) })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Release);
        // Wake the blocking accept so the thread sees the flag.
        let _ = UnixStream::connect(&self.path);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(
    conn: UnixStream,
    engine: &Weak<FileSystem>,
    workers: &Workers,
    source: Option<&(dyn Fn() -> String + Send + Sync)>,
) -> io::Result<()> {
    conn.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(io::Read::take(&conn, COMMAND_MAX)).read_line(&mut line)?;
    let answer = match (line.trim(), source) {
        ("freeze", _) => {
            // Held on a thread of its own, so that the other commands are answered meanwhile.
            let engine = engine.clone();
            std::thread::Builder::new().name("ferrofs-freeze".into()).spawn(move || hold_freeze(conn, &engine))?;
            return Ok(());
        }
        ("source", Some(status)) => status() + "\n",
        ("source", None) => "error: this mount serves an image file, not a published image\n".into(),
        (command, _) => answer(command, engine, workers),
    };
    (&conn).write_all(answer.as_bytes())
}

/// The `freeze` command: freeze, answer, and thaw when the client says so or goes away.
fn hold_freeze(conn: UnixStream, engine: &Weak<FileSystem>) -> io::Result<()> {
    let Some(fs) = engine.upgrade() else {
        return (&conn).write_all(b"error: the file system is being unmounted\n");
    };
    let frozen = match fs.freeze() {
        Ok(frozen) => frozen,
        Err(e) => return (&conn).write_all(format!("error: freeze: {e}\n").as_bytes()),
    };
    log::info!("frozen for a client of the control socket");
    let answered = (&conn).write_all(b"frozen\n");
    // No timeout: the freeze lasts as long as the client wants it, and its end (a line, end
    // of file, or a reset when it dies) is what thaws.
    conn.set_read_timeout(None)?;
    let mut line = String::new();
    if answered.is_ok() {
        let _ = BufReader::new(io::Read::take(&conn, COMMAND_MAX)).read_line(&mut line);
    }
    drop(frozen);
    log::info!("thawed ({})", if line.trim() == "thaw" { "asked to" } else { "its client went away" });
    (&conn).write_all(b"ok\n")
}

fn answer(command: &str, engine: &Weak<FileSystem>, workers: &Workers) -> String {
    let mut words = command.split_whitespace();
    match (words.next(), words.next(), words.next()) {
        (Some("table"), n, None) => match n.map_or(Ok(10), str::parse::<usize>) {
            Ok(n) => lockstat::report_table(&lockstat::snapshot(), n),
            Err(_) => format!("error: 'table' takes a row count, not '{}'\n", n.unwrap_or("")),
        },
        (Some("json"), None, None) => serde_json::to_string_pretty(&lockstat::snapshot()).unwrap_or_else(|e| format!("error: {e}\n")) + "\n",
        (Some("journal"), None, None) => match engine.upgrade() {
            Some(fs) => {
                let stats = fs.stats();
                let counters: std::collections::BTreeMap<_, _> = named_fields(serde_json::to_value(&stats.journal), "")
                    .chain(named_fields(serde_json::to_value(&stats.cache), "cache_"))
                    .chain(workers.stats().counters().map(|(name, value)| (name.to_string(), value)))
                    .collect();
                serde_json::to_string_pretty(&counters).unwrap_or_else(|e| format!("error: {e}\n")) + "\n"
            }
            None => "error: the file system is being unmounted\n".into(),
        },
        (Some("memory"), None, None) => match engine.upgrade() {
            Some(fs) => {
                let ferrofs::Stats { cache_usage: cache, memory, .. } = fs.stats();
                let figures = std::collections::BTreeMap::from([
                    ("cache_limit_bytes", cache.limit_bytes),
                    ("cache_used_bytes", cache.used_bytes),
                    ("cache_process_other_bytes", cache.process_other_bytes),
                    ("heap_bytes", memory.heap_bytes),
                    ("heap_free_bytes", memory.heap_free_bytes),
                    ("heap_mapped_bytes", memory.heap_mapped_bytes),
                    ("rss_bytes", memory.rss_bytes),
                    ("peak_rss_bytes", memory.peak_rss_bytes),
                ]);
                serde_json::to_string_pretty(&figures).unwrap_or_else(|e| format!("error: {e}\n")) + "\n"
            }
            None => "error: the file system is being unmounted\n".into(),
        },
        (Some("transport"), None, None) => format!("{}\n", workers.stats().transport()),
        (Some("reset"), None, None) => {
            lockstat::reset();
            "ok\n".into()
        }
        (Some("remount"), Some(mode @ ("ro" | "rw")), None) => match engine.upgrade().map(|fs| fs.remount(mode == "ro")) {
            Some(Ok(())) => "ok\n".into(),
            Some(Err(e)) => format!("error: remount {mode}: {e}\n"),
            None => "error: the file system is being unmounted\n".into(),
        },
        (Some("trim"), minimum, None) => match (engine.upgrade(), minimum.map_or(Ok(0), str::parse::<u64>)) {
            (_, Err(_)) => format!("error: 'trim' takes a minimum run length in bytes, not '{}'\n", minimum.unwrap_or("")),
            (Some(fs), Ok(minimum)) => match fs.trim(minimum) {
                Ok(r) => {
                    serde_json::json!({"bytes": r.bytes, "extents": r.extents, "unsupported": r.unsupported})
                        .to_string()
                        + "\n"
                }
                Err(e) => format!("error: trim: {e}\n"),
            },
            (None, Ok(_)) => "error: the file system is being unmounted\n".into(),
        },
        (Some("timing"), Some(on @ ("on" | "off")), None) => {
            lockstat::set_timing(on == "on");
            "ok\n".into()
        }
        _ => format!("error: unknown command '{command}' (table N, json, journal, memory, transport, reset, timing on|off, remount ro|rw, trim MIN, freeze)\n"),
    }
}

/// The counters of one of the engine's counter structures (as JSON), by field name after
/// `prefix`.
fn named_fields(counters: serde_json::Result<serde_json::Value>, prefix: &str) -> impl Iterator<Item = (String, u64)> {
    let fields = match counters {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => serde_json::Map::new(),
    };
    let prefix = prefix.to_string();
    fields.into_iter().filter_map(move |(name, value)| Some((format!("{prefix}{name}"), value.as_u64()?)))
}

/// Send one command to the mount on `mountpoint` and return its answer.
pub fn request(mountpoint: &Path, command: &str) -> io::Result<String> {
    let path = socket_path(mountpoint)?;
    let mut conn = UnixStream::connect(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!(
                "no ferrofs mount answers at {} ({e}); is {} a ferrofs mount?",
                path.display(),
                mountpoint.display()
            ),
        )
    })?;
    writeln!(conn, "{command}")?;
    conn.shutdown(std::net::Shutdown::Write)?;
    let mut out = String::new();
    io::Read::read_to_string(&mut conn, &mut out)?;
    match out.strip_prefix("error: ") {
        Some(e) => Err(io::Error::new(io::ErrorKind::InvalidInput, e.trim_end().to_string())),
        None => Ok(out),
    }
}

/// A mount frozen by [`freeze`]: thawed by [`Freeze::thaw`], or when dropped (the connection
/// closes), or when this process dies.
pub struct Freeze {
    conn: UnixStream,
}

/// Freeze the mount on `mountpoint` (the `freeze` command); returns once its image is a clean
/// checkpoint that nothing writes.
pub fn freeze(mountpoint: &Path) -> io::Result<Freeze> {
    let path = socket_path(mountpoint)?;
    let mut conn = UnixStream::connect(&path).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{} is not a ferrofs mount (no daemon answers at {}: {e})", mountpoint.display(), path.display()),
        )
    })?;
    writeln!(conn, "freeze")?;
    let mut answer = String::new();
    BufReader::new(&conn).read_line(&mut answer)?;
    match answer.trim_end() {
        "frozen" => Ok(Freeze { conn }),
        other => Err(io::Error::other(other.strip_prefix("error: ").unwrap_or(other).to_string())),
    }
}

impl Freeze {
    /// Thaw the mount, and wait until it is.
    pub fn thaw(mut self) -> io::Result<()> {
        writeln!(self.conn, "thaw")?;
        let mut answer = String::new();
        BufReader::new(&self.conn).read_line(&mut answer)?;
        match answer.trim_end() {
            "ok" => Ok(()),
            other => Err(io::Error::other(format!("thaw: {other}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands() {
        let (gone, w) = (Weak::new(), Workers::new(4));
        assert!(answer("table 3", &gone, &w).starts_with("class"));
        assert!(answer("json", &gone, &w).trim_start().starts_with('['));
        assert_eq!(answer("timing off", &gone, &w), "ok\n");
        assert!(answer("table many", &gone, &w).starts_with("error: "));
        assert!(answer("frobnicate", &gone, &w).starts_with("error: unknown command"));
        assert!(answer("journal", &gone, &w).starts_with("error: "));
        assert_eq!(answer("transport", &gone, &w), "/dev/fuse\n");
        w.set_uring(crate::workers::URING_ON);
        assert_eq!(answer("transport", &gone, &w), "io_uring\n");
        assert!(answer("memory", &gone, &w).starts_with("error: "));
        assert!(answer("remount ro", &gone, &w).starts_with("error: "));
        assert!(answer("remount sideways", &gone, &w).starts_with("error: unknown command"));
        assert!(answer("trim", &gone, &w).starts_with("error: "));
        assert!(answer("trim lots", &gone, &w).starts_with("error: 'trim' takes a minimum"));
    }

    #[test]
    fn journal_counters_are_the_mounts() {
        let dev = Arc::new(ferrofs::dev::MemDevice::new(64 << 20));
        FileSystem::mkfs(&*dev, &ferrofs::MkfsOptions::default()).unwrap();
        let fs = Arc::new(FileSystem::mount_device(dev, &ferrofs::MountOptions::default()).unwrap());
        fs.create(1, b"f", 0o644, ferrofs::Cred { uid: 0, gid: 0, umask: 0 }).unwrap();
        let j: serde_json::Value =
            serde_json::from_str(&answer("journal", &Arc::downgrade(&fs), &Workers::new(5))).unwrap();
        let commits = fs.stats().journal.commits;
        assert!(commits >= 1);
        assert_eq!(j["commits"].as_u64(), Some(commits));
        assert_eq!(j["cache_throttles"].as_u64(), Some(0), "the cache budget's counters are there too");
        assert_eq!(j["workers_total"].as_u64(), Some(5), "and the FUSE workers'");
        let m: serde_json::Value =
            serde_json::from_str(&answer("memory", &Arc::downgrade(&fs), &Workers::new(5))).unwrap();
        assert_eq!(m["cache_limit_bytes"].as_u64(), Some(fs.cache_budget().limit()));
        assert!(m["cache_used_bytes"].as_u64().unwrap() > 0 && m["peak_rss_bytes"].as_u64().unwrap() > 0);
    }

    #[test]
    fn trim_punches_the_mounts_free_space() {
        let dev = Arc::new(ferrofs::dev::MemDevice::new(64 << 20));
        FileSystem::mkfs(&*dev, &ferrofs::MkfsOptions::default()).unwrap();
        let fs = Arc::new(FileSystem::mount_device(dev.clone(), &ferrofs::MountOptions::default()).unwrap());
        let me = ferrofs::Cred { uid: 0, gid: 0, umask: 0 };
        fs.write_file("/f", &vec![7u8; 1 << 20], me).unwrap();
        fs.unlink(ferrofs::ROOT_INO, b"f").unwrap();
        let pages = dev.allocated_pages();
        let r: serde_json::Value =
            serde_json::from_str(&answer("trim 4096", &Arc::downgrade(&fs), &Workers::new(1))).unwrap();
        assert!(r["bytes"].as_u64().unwrap() >= 1 << 20 && r["unsupported"] == false, "{r}");
        assert!(pages - dev.allocated_pages() >= 250, "the unlinked file's 256 pages went back");
    }

    #[test]
    fn socket_names_are_per_mount_point() {
        let a = socket_path(Path::new("/tmp")).unwrap();
        let b = socket_path(Path::new("/")).unwrap();
        assert_ne!(a, b);
        assert!(a.file_name().unwrap().to_str().unwrap().starts_with("tmp-"));
    }
}
