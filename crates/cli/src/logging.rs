//! Where a mount's messages go: the `log` facade (the engine adapter, fuser and the daemons
//! log through it) written to stderr in the foreground, to syslog once a daemon has left its
//! terminal (its stderr is then /dev/null), or to the file `-o log=FILE` names. Every line
//! names the image it is about: a record's `image` key when it has one (the shared daemon
//! serves several), else the image of the mount that installed the logger.

use crate::units::utc_time;
use log::{kv::Key, Level, LevelFilter, Log, Metadata, Record};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard, OnceLock, PoisonError};
use syslog::{Facility, Formatter3164, LoggerBackend};

/// The syslog socket: where syslogd, rsyslogd and journald (`systemd-journald-dev-log`)
/// listen. `FERROFS_SYSLOG_SOCKET` names another (a container's, or a test's).
const SYSLOG_SOCKET: &str = "/dev/log";

/// The name lines about no particular image carry, in the shared daemon.
pub const SHARED_DAEMON: &str = "shared daemon";

type Syslog = syslog::Logger<LoggerBackend, Formatter3164>;

enum Sink {
    Stderr,
    /// Connected at the first line, and again after a failed send (syslogd restarted).
    Syslog(Option<Syslog>),
    File(File),
}

struct MountLog {
    /// None in the commands that serve no mount (fsck, info, bench): they name their image
    /// in their own output.
    image: Option<String>,
    sink: Mutex<Sink>,
}

/// `-o log=FILE`, opened (append, created 0640) before the daemon forks, so that a path it
/// cannot write is reported by the command that asked for it.
pub fn open_log_file(options: &[String]) -> Result<Option<File>, String> {
    let Some(path) = options.iter().rev().find_map(|o| o.trim().strip_prefix("log=")) else { return Ok(None) };
    if path.is_empty() {
        return Err("bad option 'log=': log takes a file name".into());
    }
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new().append(true).create(true).mode(0o640).open(path);
    file.map(Some).map_err(|e| format!("log file {path}: {e}"))
}

/// The logger [`init`] installed, for [`detached`] to redirect.
static LOGGER: OnceLock<&'static MountLog> = OnceLock::new();

/// Send the messages of this process, about `image`, to `file`, else to stderr until
/// [`detached`]. Only the first call installs a logger (a process sets up one mount before
/// it serves).
pub fn init(image: Option<&str>, file: Option<File>) {
    let sink = file.map_or(Sink::Stderr, Sink::File);
    LOGGER.get_or_init(|| {
        let logger: &'static MountLog =
            Box::leak(Box::new(MountLog { image: image.map(str::to_string), sink: Mutex::new(sink) }));
        if log::set_logger(logger).is_ok() {
            log::set_max_level(LevelFilter::Info);
        }
        logger
    });
}

/// The process has left its terminal: lines go to syslog from now on, unless to a file.
pub fn detached() {
    if let Some(logger) = LOGGER.get() {
        let mut sink = logger.sink();
        if matches!(*sink, Sink::Stderr) {
            *sink = Sink::Syslog(None);
        }
    }
}

impl MountLog {
    /// A panic while one line was written leaves the sink usable for the next.
    fn sink(&self) -> MutexGuard<'_, Sink> {
        self.sink.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Log for MountLog {
    fn enabled(&self, metadata: &Metadata) -> bool {
        // fuser's notices ("Mounting DIR") would reach the terminal `--daemon` returns to.
        let quiet = metadata.target().starts_with("fuser") && metadata.level() > Level::Warn;
        metadata.level() <= log::max_level() && !quiet
    }

    fn log(&self, record: &Record) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let image = record.key_values().get(Key::from("image")).map(|v| v.to_string()).or_else(|| self.image.clone());
        let message = match image {
            Some(image) => format!("{image}: {}", record.args()),
            None => record.args().to_string(),
        };
        let mut sink = self.sink();
        match &mut *sink {
            Sink::Stderr => eprintln!("ferrofs: {message}"),
            Sink::File(f) => {
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
                let _ = writeln!(f, "{} {} {message}", utc_time(now as i64), record.level());
            }
            Sink::Syslog(socket) => {
                if socket.is_none() {
                    *socket = connect();
                }
                let Some(syslog) = socket.as_mut() else { return };
                let sent = match record.level() {
                    Level::Error => syslog.err(&message),
                    Level::Warn => syslog.warning(&message),
                    Level::Info => syslog.info(&message),
                    Level::Debug | Level::Trace => syslog.debug(&message),
                };
                if sent.is_err() {
                    *socket = None;
                }
            }
        }
    }

    fn flush(&self) {}
}

fn connect() -> Option<Syslog> {
    let path = std::env::var_os("FERROFS_SYSLOG_SOCKET").map_or_else(|| PathBuf::from(SYSLOG_SOCKET), PathBuf::from);
    let formatter = Formatter3164 {
        facility: Facility::LOG_DAEMON,
        hostname: None,
        process: "ferrofs".into(),
        pid: std::process::id(),
    };
    syslog::unix_custom(formatter, path).ok()
}
