//! What the tests that mount through the `ferrofs` binary share.

#![allow(dead_code)]

use std::path::Path;
use std::process::{Command, Output};

pub const BIN: &str = env!("CARGO_BIN_EXE_ferrofs");

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("run ferrofs")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Why mounting cannot be tested here, if it cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse").err().map(|e| format!("/dev/fuse cannot be opened ({e})"))
}

pub fn is_mounted(dir: &Path) -> bool {
    let canon = dir.canonicalize().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().any(|l| l.split(' ').nth(4).is_some_and(|m| Path::new(m) == canon))
}
