//! `ferrofs mount --shared`: several images served by one daemon process with one cache
//! budget, mounts added and removed at run time, a failed mount that leaves the others alone,
//! the daemon ending with its last mount, and SIGTERM unmounting everything cleanly. Each test
//! has its own daemon (`FERROFS_DAEMON_SOCKET` in its scratch directory), so tests running
//! side by side, or a shared daemon of the machine, never meet. Skips where /dev/fuse or root
//! is missing.

use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;

use common::{daemon_pid, damaged_image, is_mounted, stderr, unavailable, BIN};

/// Images `a`, `b` and `c` with a mount point each, and the daemon socket of this test;
/// everything still mounted is detached and the directory removed on drop, even when the
/// test fails (the daemon then ends with its last mount).
struct Scratch {
    dir: PathBuf,
    socket: PathBuf,
}

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ferrofs-shared-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for m in ["a", "b", "c"] {
            std::fs::create_dir_all(dir.join(m)).unwrap();
        }
        Scratch { socket: dir.join("daemon.sock"), dir }
    }

    fn image(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.img"))
    }

    fn mnt(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn ferrofs(&self) -> Command {
        let mut c = Command::new(BIN);
        c.env("FERROFS_DAEMON_SOCKET", &self.socket);
        c
    }

    /// `ferrofs mount --shared` of image `name` on its mount point.
    fn mount(&self, name: &str, extra: &[&str]) -> Output {
        self.ferrofs()
            .args(["mount", "--shared"])
            .args(extra)
            .arg(self.image(name))
            .arg(self.mnt(name))
            .output()
            .unwrap()
    }

    fn mounts_json(&self) -> serde_json::Value {
        let o = self.ferrofs().args(["mounts", "--json"]).output().unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        // The daemon's status is the first document; an array of the machine's mounts with a
        // daemon of their own may follow.
        serde_json::Deserializer::from_slice(&o.stdout)
            .into_iter::<serde_json::Value>()
            .next()
            .and_then(Result::ok)
            .unwrap_or_else(|| panic!("ferrofs mounts --json: {}", String::from_utf8_lossy(&o.stdout)))
    }

    fn umount(&self, name: &str) {
        assert!(Command::new("umount").arg(self.mnt(name)).status().unwrap().success());
    }

    /// Wait until the daemon has released image `name` (its lock) after an unmount.
    fn wait_released(&self, name: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while ferrofs::dev::FileDevice::open(self.image(name), false).is_err() {
            assert!(Instant::now() < deadline, "daemon kept {name} locked");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn fsck_clean(&self, name: &str) {
        let o = Command::new(BIN).args(["fsck", "-n"]).arg(self.image(name)).output().unwrap();
        assert!(o.status.success(), "fsck {name}: {}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        for m in ["a", "b", "c"] {
            if is_mounted(&self.mnt(m)) {
                let _ = Command::new("umount").arg("-l").arg(self.mnt(m)).status();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Whether `pid` still runs (a zombie has ended: its parent merely has not reaped it).
fn running(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, rest)| !rest.starts_with('Z')))
}

fn wait_exit(pid: i32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while running(pid) {
        assert!(Instant::now() < deadline, "daemon {pid} still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn shared_daemon_serves_several_images_in_one_process() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED shared_daemon: {why}");
    }
    let s = Scratch::new("several");
    let o = s.mount("a", &["--mkfs", "128M", "-o", "cache_size=64M,noatime"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // The budget is the first mount's; a later mount asking for another one is told so.
    // b through the io_uring rings where the kernel offers them (`ferrofs mounts` names each
    // mount's transport).
    let uring = std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|v| v.trim() == "Y");
    let b_options = if uring { "cache_size=32M,uring" } else { "cache_size=32M" };
    let o = s.mount("b", &["--mkfs", "128M", "-o", b_options]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("cache_size=32.0 MiB ignored"), "{}", stderr(&o));
    let pid = daemon_pid(&s.image("a"));
    assert_eq!(daemon_pid(&s.image("b")), pid, "one process serves both images");
    std::fs::write(s.mnt("a").join("fa"), b"served by one").unwrap();
    std::fs::write(s.mnt("b").join("fb"), b"daemon").unwrap();
    assert_eq!(std::fs::read(s.mnt("a").join("fa")).unwrap(), b"served by one");
    assert_eq!(std::fs::read(s.mnt("b").join("fb")).unwrap(), b"daemon");

    let status = s.mounts_json();
    assert_eq!(status["pid"], pid);
    assert_eq!(status["cache_limit"], 64u64 << 20);
    let mounts = status["mounts"].as_array().unwrap();
    assert_eq!(mounts.len(), 2, "{status}");
    assert!(mounts.iter().all(|m| m["cache_bytes"].as_u64().is_some_and(|b| b > 0)), "{status}");
    let mut transports: Vec<&str> = mounts.iter().map(|m| m["transport"].as_str().unwrap()).collect();
    transports.sort();
    assert_eq!(transports, ["/dev/fuse", if uring { "io_uring" } else { "/dev/fuse" }], "{status}");
    let table = s.ferrofs().arg("mounts").output().unwrap();
    assert!(String::from_utf8_lossy(&table.stdout).contains(&s.mnt("b").canonicalize().unwrap().display().to_string()));

    // A damaged image: its requester gets the reason, the running mounts do not notice.
    std::fs::write(s.image("c"), damaged_image()).unwrap();
    let o = s.mount("c", &[]);
    assert!(!o.status.success());
    assert!(stderr(&o).starts_with("ferrofs: ") && stderr(&o).contains("superblock"), "{}", stderr(&o));
    assert!(!is_mounted(&s.mnt("c")));
    // So does a second mount of an image the daemon already serves.
    let o = s.ferrofs().args(["mount", "--shared"]).arg(s.image("a")).arg(s.mnt("c")).output().unwrap();
    assert!(!o.status.success() && stderr(&o).contains("already mounted on"), "{}", stderr(&o));
    assert_eq!(daemon_pid(&s.image("a")), pid);
    std::fs::write(s.mnt("a").join("after"), b"still here").unwrap();
    assert_eq!(std::fs::read(s.mnt("b").join("fb")).unwrap(), b"daemon");

    // Unmounting one leaves the other served by the same daemon.
    s.umount("a");
    s.wait_released("a");
    assert!(running(pid));
    std::fs::write(s.mnt("b").join("fb2"), b"alone").unwrap();
    assert_eq!(std::fs::read(s.mnt("b").join("fb2")).unwrap(), b"alone");
    assert_eq!(s.mounts_json()["mounts"].as_array().unwrap().len(), 1);
    s.fsck_clean("a");

    // A mount added at run time joins the same daemon.
    let o = s.mount("a", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(daemon_pid(&s.image("a")), pid);
    assert_eq!(std::fs::read(s.mnt("a").join("after")).unwrap(), b"still here");

    // The daemon ends with its last mount, and takes its socket with it.
    s.umount("a");
    s.umount("b");
    wait_exit(pid);
    assert!(!s.socket.exists());
    let o = s.ferrofs().arg("mounts").output().unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("no shared ferrofs daemon"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    s.fsck_clean("a");
    s.fsck_clean("b");
}

#[test]
fn sigterm_unmounts_every_shared_mount_cleanly() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED shared_sigterm: {why}");
    }
    let s = Scratch::new("sigterm");
    for m in ["a", "b"] {
        let o = s.mount(m, &["--mkfs", "128M"]);
        assert!(o.status.success(), "{}", stderr(&o));
        std::fs::write(s.mnt(m).join("f"), m.as_bytes()).unwrap();
    }
    let pid = daemon_pid(&s.image("a"));
    // SAFETY: plain kill(2) of the daemon this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    wait_exit(pid);
    assert!(!is_mounted(&s.mnt("a")) && !is_mounted(&s.mnt("b")));
    s.fsck_clean("a");
    s.fsck_clean("b");
    // A new shared mount after the old daemon has gone starts a new one.
    let o = s.mount("b", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(s.mnt("b").join("f")).unwrap(), b"b");
    assert_ne!(daemon_pid(&s.image("b")), pid);
    s.umount("b");
    s.wait_released("b");
    s.fsck_clean("b");
}

#[test]
fn mounts_lists_each_images_label_and_uuid() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED mounts_label: {why}");
    }
    let s = Scratch::new("label");
    let uuid = "6f1c9a52-3b7e-4d08-8c21-5e9f0a7b3d64";
    let o = Command::new(BIN).args(["mkfs", "--size", "128M", "-L", "photos", "-U", uuid]).arg(s.image("a")).output();
    assert!(o.as_ref().unwrap().status.success(), "{}", stderr(&o.unwrap()));
    let o = s.mount("a", &[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let status = s.mounts_json();
    let m = &status["mounts"][0];
    assert_eq!((&m["label"], &m["uuid"]), (&serde_json::json!("photos"), &serde_json::json!(uuid)), "{status}");
    let table = String::from_utf8_lossy(&s.ferrofs().arg("mounts").output().unwrap().stdout).into_owned();
    let line = table.lines().find(|l| l.contains("a.img")).unwrap_or_else(|| panic!("{table}"));
    assert!(line.contains("photos") && line.contains(uuid), "{table}");
    s.umount("a");
    s.wait_released("a");
    s.fsck_clean("a");
}
