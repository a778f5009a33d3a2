//! Where a detached daemon's messages go: `-o log=FILE`, else syslog. Each test damages a
//! directory's B+tree node, mounts with `--daemon` (stderr is then /dev/null) and reads the
//! damaged directory: the corruption must reach the log with the image's name.

mod common;

use common::{is_mounted, run, stderr, unavailable, BIN};
use ferrofs::dev::{BlockDevice, FileDevice};
use ferrofs::format::{DiskInode, Fork, INODE_SIZE};
use ferrofs::{Cred, FileSystem, MkfsOptions, MountOptions};
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

/// A test's directory (removed on drop) with the image and the mount point, which is
/// unmounted on drop even when the test fails.
struct Scratch {
    dir: tempfile::TempDir,
    image: PathBuf,
    mnt: PathBuf,
    /// The block of /d's B+tree root, overwritten with junk.
    damaged: u64,
}

impl Scratch {
    /// None (the test is skipped) where mounting is not possible.
    fn with_damaged_directory(test: &str) -> Option<Scratch> {
        if let Some(why) = unavailable() {
            eprintln!("SKIPPED {test}: {why}");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let (image, mnt) = (dir.path().join("fs.img"), dir.path().join("mnt"));
        std::fs::create_dir(&mnt).unwrap();
        let damaged = image_with_damaged_directory(&image);
        Some(Scratch { dir, image, mnt, damaged })
    }

    /// Mount as a daemon, list the damaged directory (which must fail with EUCLEAN), unmount.
    fn read_damaged_directory(&self, mut ferrofs: Command, options: &[&str]) {
        let o = run(ferrofs.args(["mount", "--daemon"]).args(options).arg(&self.image).arg(&self.mnt));
        assert!(o.status.success(), "{}", stderr(&o));
        let listed = std::fs::read_dir(self.mnt.join("d")).and_then(|d| d.collect::<Result<Vec<_>, _>>());
        assert_eq!(listed.err().and_then(|e| e.raw_os_error()), Some(libc::EUCLEAN));
        assert!(Command::new("umount").arg(&self.mnt).status().unwrap().success());
    }

    /// A logged line must name the image (its canonical path) and the damaged block.
    fn assert_names_the_corruption(&self, line: &str) {
        let image = self.image.canonicalize().unwrap().display().to_string();
        assert!(
            line.contains(&image) && line.contains("corrupt") && line.contains(&format!("at block {}", self.damaged)),
            "{line}"
        );
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
    }
}

/// An image whose directory /d (600 entries: a B+tree of more than one block) has its root
/// node overwritten with junk; returns that block's number.
fn image_with_damaged_directory(image: &Path) -> u64 {
    let dev = Arc::new(FileDevice::create(image, 64 << 20).unwrap());
    FileSystem::mkfs(&*dev, &MkfsOptions::default()).unwrap();
    let fs = FileSystem::mount_device(dev.clone(), &MountOptions::default()).unwrap();
    let cred = Cred { uid: 0, gid: 0, umask: 0 };
    let d = fs.mkdir(1, b"d", 0o755, cred).unwrap().ino;
    for i in 0..600 {
        fs.create(d, format!("entry-{i:03}").as_bytes(), 0o644, cred).unwrap();
    }
    fs.unmount().unwrap();
    drop(fs);
    let geo = ferrofs::read_superblock(&*dev).unwrap().geo;
    let mut inode = [0u8; INODE_SIZE];
    dev.read_at(&mut inode, geo.inode_offset(d).unwrap()).unwrap();
    let Fork::Btree(root) = DiskInode::decode(&inode, d, &geo).unwrap().fork else { panic!("/d has no B+tree") };
    drop(dev);
    let junk: Vec<u8> = (0..4096u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    std::fs::OpenOptions::new().write(true).open(image).unwrap().write_all_at(&junk, root * 4096).unwrap();
    root
}

#[test]
fn a_daemon_logs_corruption_with_the_image_name_to_its_log_file() {
    let Some(s) = Scratch::with_damaged_directory("log_file") else { return };
    let log = s.dir.path().join("daemon.log");
    std::fs::write(&log, "a line from before\n").unwrap();
    s.read_damaged_directory(Command::new(BIN), &["-o", &format!("log={}", log.display())]);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.starts_with("a line from before\n"), "the log is appended to: {text}");
    let line = text.lines().find(|l| l.contains("corrupt")).unwrap_or_else(|| panic!("no corruption logged: {text}"));
    s.assert_names_the_corruption(line);
    assert!(line.contains("ERROR") && line.contains(" UTC "), "{line}");
}

#[test]
fn a_detached_daemon_logs_to_syslog() {
    let Some(s) = Scratch::with_damaged_directory("syslog") else { return };
    // A datagram socket stands in for /dev/log.
    let socket = s.dir.path().join("log.sock");
    let syslog = UnixDatagram::bind(&socket).unwrap();
    syslog.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut ferrofs = Command::new(BIN);
    ferrofs.env("FERROFS_SYSLOG_SOCKET", &socket);
    s.read_damaged_directory(ferrofs, &[]);
    let mut buf = vec![0u8; 4096];
    let line = loop {
        let n = syslog.recv(&mut buf).expect("a line on the syslog socket");
        let line = String::from_utf8_lossy(&buf[..n]).into_owned();
        if line.contains("corrupt") {
            break line;
        }
    };
    // <facility daemon (3) * 8 + severity err (3)>, then the program's name and pid.
    assert!(line.starts_with("<27>") && line.contains(" ferrofs["), "{line}");
    s.assert_names_the_corruption(&line);
}
