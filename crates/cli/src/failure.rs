//! How the command line reports a failure: `ferrofs: <what>: <why>` and a non-zero exit.

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
        Failure {
            what: what.into(),
            why: why.to_string(),
        }
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
