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

/// 64 MiB of junk behind the ferrofs magic: a ferrofs image whose superblock does not verify
/// (the engine refuses it; without the magic, the command would refuse it before mounting).
pub fn damaged_image() -> Vec<u8> {
    let mut image = vec![0xa5u8; 64 << 20];
    image[..4].copy_from_slice(&ferrofs::format::sb::MAGIC_SB.to_le_bytes());
    image
}

/// Why mounting cannot be tested here, if it cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .err()
        .map(|e| format!("/dev/fuse cannot be opened ({e})"))
}

pub fn is_mounted(dir: &Path) -> bool {
    let canon = dir.canonicalize().unwrap();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(4).is_some_and(|m| Path::new(m) == canon))
}

/// The daemon (any other process) holding `image` open (found through /proc, as `fuser` would).
pub fn daemon_pid(image: &Path) -> i32 {
    let canon = image.canonicalize().unwrap();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
        let Ok(fds) = std::fs::read_dir(e.path().join("fd")) else { continue };
        if fds.flatten().any(|fd| std::fs::read_link(fd.path()).is_ok_and(|t| t == canon))
            && pid != std::process::id() as i32
        {
            return pid;
        }
    }
    panic!("no process holds {}", image.display());
}
