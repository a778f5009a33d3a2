//! What the tests that mount through the `ferrofs` binary share.

#![allow(dead_code)]

use std::cell::RefCell;
use std::path::{Path, PathBuf};
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

/// Whether this run's mounts serve through FUSE over io_uring (FERROFS_TEST_TRANSPORT=uring)
/// instead of reads of /dev/fuse (`devfuse`, the default).
pub fn uring() -> bool {
    match std::env::var("FERROFS_TEST_TRANSPORT").as_deref() {
        Ok("uring") => true,
        Ok("devfuse") | Err(_) => false,
        Ok(v) => panic!("FERROFS_TEST_TRANSPORT={v}: uring or devfuse"),
    }
}

/// The `-o` options that choose this run's transport.
pub fn transport_options() -> &'static [&'static str] {
    if uring() {
        &["-o", "uring"]
    } else {
        &[]
    }
}

/// Whether the mount on `mnt` serves through io_uring, as `ferrofs lockstat --journal` says.
pub fn served_through_uring(mnt: &Path) -> bool {
    let o = run(Command::new(BIN).args(["lockstat", "--journal"]).arg(mnt));
    assert!(o.status.success(), "lockstat --journal: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["transport_uring", "1"])
}

/// Why mounting cannot be tested here, if it cannot.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root".into());
    }
    // The parameter is system-wide: scripts/test.sh switches it on for its io_uring runs.
    if uring() && std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").map_or(true, |v| v.trim() != "Y")
    {
        return Some("FUSE over io_uring is unavailable (no fuse parameter enable_uring, or it is N)".into());
    }
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .err()
        .map(|e| format!("/dev/fuse cannot be opened ({e})"))
}

/// `ferrofs mount --daemon -o OPTIONS SOURCE DIR` in this run's permission mode: the kernel's
/// with FERROFS_TEST_DEFAULT_PERMISSIONS=1, else the daemon's.
pub fn mount_daemon(source: &str, mnt: &Path, options: &str) -> Output {
    mount_daemon_with_env(source, mnt, options, &[])
}

/// [`mount_daemon`] with these environment variables changed for the command.
pub fn mount_daemon_with_env(source: &str, mnt: &Path, options: &str, env: &[(&str, &str)]) -> Output {
    let kernel_checks = std::env::var("FERROFS_TEST_DEFAULT_PERMISSIONS").as_deref() == Ok("1");
    let options = if kernel_checks { options.to_string() } else { format!("{options},daemon_permissions") };
    run(Command::new(BIN).args(["mount", "--daemon", "-o", &options, source]).arg(mnt).envs(env.iter().copied()))
}

/// The mount points a test made, so that a failing test still leaves none behind.
#[derive(Default)]
pub struct Mounts(RefCell<Vec<PathBuf>>);

impl Mounts {
    /// `o`, the output of mounting on `mnt`; `mnt` is tracked if it succeeded.
    pub fn track(&self, mnt: &Path, o: Output) -> Output {
        if o.status.success() {
            self.0.borrow_mut().push(mnt.to_owned());
        }
        o
    }

    /// `umount MNT`, which must succeed.
    pub fn umount(&self, mnt: &Path) {
        let o = run(Command::new("umount").arg(mnt));
        assert!(o.status.success(), "umount {}: {}", mnt.display(), stderr(&o));
        self.0.borrow_mut().retain(|m| m != mnt);
    }

    /// Lazily unmount whatever is still mounted: for the owner's `Drop`, before it removes
    /// the directories.
    pub fn release(&self) {
        for m in self.0.borrow_mut().drain(..) {
            if is_mounted(&m) {
                let _ = Command::new("umount").arg("-l").arg(&m).status();
            }
        }
    }
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
