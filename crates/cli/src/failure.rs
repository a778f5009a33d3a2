//! How the command line reports a failure: `ferrofs: <what>: <why>` and a non-zero exit; a bug
//! as one line too; a closed pipe quietly.

use std::fmt;

/// A failed step: what the command was doing, and why it failed.
#[derive(Debug)]
pub struct Failure {
    pub what: String,
    pub why: String,
}

pub type CliResult<T> = Result<T, Failure>;

impl Failure {
    pub fn new(what: impl Into<String>, why: impl fmt::Display) -> Failure {
        Failure { what: what.into(), why: why.to_string() }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.what, self.why)
    }
}

/// Attach "what we were doing" to any error that can be displayed.
pub trait Context<T> {
    fn context(self, what: impl FnOnce() -> String) -> CliResult<T>;
}

impl<T, E: fmt::Display> Context<T> for Result<T, E> {
    fn context(self, what: impl FnOnce() -> String) -> CliResult<T> {
        self.map_err(|e| Failure::new(what(), e))
    }
}

/// `ferrofs info img | head -1` should end quietly, as other Unix tools do, rather than
/// report a failed write (Rust ignores SIGPIPE by default).
pub fn die_quietly_on_closed_pipe() {
    // SAFETY: restoring the default disposition of a signal; no handler code is involved.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// A bug must still read as one line, not a backtrace.
pub fn install_panic_report() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("unknown cause");
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("ferrofs: internal error: {msg}{at} (please report this)");
    }));
}
