//! `ferrofs mount` as a user and mount(8) run it: daemon mode, the mount helper's command
//! line, one writer per image, a mount right after an unmount, recovery after SIGKILL, and a
//! damaged image refused without leaving a stale mount. Skips where /dev/fuse or root is
//! missing.

use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;

use common::{daemon_pid, is_mounted, run, stderr, unavailable, BIN};





/// An image and a mount point, unmounted and removed on drop even when the test fails.
struct Scratch {
    dir: PathBuf,
    image: PathBuf,
    mnt: PathBuf,
}

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ferrofs-mount-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("mnt")).unwrap();
        Scratch { image: dir.join("fs.img"), mnt: dir.join("mnt"), dir }
    }

    fn mount(&self, extra: &[&str]) -> Output {
        run(Command::new(BIN).arg("mount").arg("--daemon").args(extra).arg(&self.image).arg(&self.mnt))
    }

    fn umount(&self) {
        assert!(Command::new("umount").arg(&self.mnt).status().unwrap().success());
    }

    /// Wait until the daemon has released the image (its lock) after an unmount.
    fn wait_released(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while ferrofs::dev::FileDevice::open(&self.image, false).is_err() {
            assert!(Instant::now() < deadline, "daemon kept the image locked");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn fsck_clean(&self) {
        let o = run(Command::new(BIN).arg("fsck").arg("-n").arg(&self.image));
        assert!(o.status.success(), "fsck: {}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn daemon_mount_serves_until_umount_and_one_writer_per_image() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED daemon_mount: {why}");
    }
    let s = Scratch::new("daemon");
    let o = s.mount(&["--mkfs", "128M", "-o", "noatime,threads=4,cache_size=32M"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(is_mounted(&s.mnt), "ready when the command returns");
    std::fs::write(s.mnt.join("f"), b"daemon").unwrap();
    // The cache size bounds the daemon's memory: once the caches have grown enough to check
    // the budget, the rest of the process has been sampled and leaves them less room.
    std::fs::create_dir(s.mnt.join("many")).unwrap();
    for i in 0..3000 {
        std::fs::File::create(s.mnt.join("many").join(i.to_string())).unwrap();
    }
    let o = run(Command::new(BIN).arg("lockstat").arg(&s.mnt).args(["--memory", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("lockstat --memory --json is JSON");
    assert_eq!(json["cache_limit_bytes"].as_u64(), Some(32 << 20), "{json}");
    assert!(json["cache_process_other_bytes"].as_u64().is_some_and(|b| b > 0 && b <= 16 << 20), "{json}");
    // The image's path is the mount's source, as df and mount show it.
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let canon = s.image.canonicalize().unwrap();
    assert!(info.lines().any(|l| l.contains(&format!(" - fuse.ferrofs {} ", canon.display()))), "{info}");
    // A second mount of the same image fails at once, naming the reason.
    let second_dir = s.dir.join("second");
    std::fs::create_dir(&second_dir).unwrap();
    let o = run(Command::new(BIN).args(["mount", "--daemon"]).arg(&s.image).arg(&second_dir));
    assert!(!o.status.success());
    assert!(stderr(&o).contains("already mounted on"), "{}", stderr(&o));
    assert!(!is_mounted(&second_dir));
    // Lock statistics of the running daemon, through its control socket.
    let o = run(Command::new(BIN).arg("lockstat").arg(&s.mnt).args(["--top", "50"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(table.starts_with("class") && table.lines().any(|l| l.starts_with("cil-shard")), "{table}");
    let o = run(Command::new(BIN).arg("lockstat").arg(&s.mnt).args(["--json", "--reset"]));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("lockstat --json is JSON");
    assert!(json.as_array().is_some_and(|a| a.iter().any(|c| c["name"] == "ag")), "{json}");
    // And this mount's journal counters: at least the write above committed.
    let o = run(Command::new(BIN).arg("lockstat").arg(&s.mnt).args(["--journal", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&o.stdout).expect("lockstat --journal --json is JSON");
    assert!(json["commits"].as_u64().is_some_and(|n| n >= 1), "{json}");
    let o = run(Command::new(BIN).arg("lockstat").arg(&s.mnt).arg("--journal"));
    assert!(String::from_utf8_lossy(&o.stdout).lines().any(|l| l.starts_with("checkpoints ")), "{}", String::from_utf8_lossy(&o.stdout));
    // Unmount and mount again at once: the new daemon waits for the old one's lock.
    s.umount();
    let o = s.mount(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(s.mnt.join("f")).unwrap(), b"daemon");
    s.umount();
    s.wait_released();
    s.fsck_clean();
    let o = run(Command::new(BIN).arg("lockstat").arg(&s.mnt));
    assert!(!o.status.success() && stderr(&o).contains("is") && stderr(&o).contains("a ferrofs mount?"), "{}", stderr(&o));
}

#[test]
fn mount_helper_command_line_as_mount8_runs_it() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED mount_helper: {why}");
    }
    let s = Scratch::new("helper");
    let o = run(Command::new(BIN).args(["mkfs", "--size", "128M"]).arg(&s.image));
    assert!(o.status.success(), "{}", stderr(&o));
    let helper = s.dir.join("mount.fuse.ferrofs");
    symlink(BIN, &helper).unwrap();
    let o = run(Command::new(&helper).arg(&s.image).arg(&s.mnt).args(["-n", "-o", "rw,noatime,defaults,_netdev"]));
    assert!(o.status.success(), "{}", stderr(&o));
    std::fs::write(s.mnt.join("via-helper"), b"x").unwrap();
    s.umount();
    s.wait_released();
    s.fsck_clean();
    let o = run(Command::new(&helper).arg(&s.image));
    assert!(!o.status.success() && stderr(&o).contains("usage"), "{}", stderr(&o));
}

#[test]
fn sigkill_then_mount_recovers_the_log() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED sigkill_recovery: {why}");
    }
    let s = Scratch::new("sigkill");
    let o = s.mount(&["--mkfs", "128M"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let f = s.mnt.join("durable");
    std::fs::write(&f, b"fsynced").unwrap();
    std::fs::File::open(&f).unwrap().sync_all().unwrap();
    let pid = daemon_pid(&s.image);
    // SAFETY: plain kill(2) of the daemon we started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let _ = Command::new("umount").arg("-l").arg(&s.mnt).status();
    s.wait_released();
    let o = s.mount(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(&f).unwrap(), b"fsynced");
    s.umount();
    s.wait_released();
    s.fsck_clean();
}

#[test]
fn damaged_image_is_refused_without_a_stale_mount() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED damaged_image: {why}");
    }
    let s = Scratch::new("damaged");
    std::fs::write(&s.image, vec![0xa5u8; 64 << 20]).unwrap();
    let o = s.mount(&[]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.starts_with("ferrofs: ") && err.contains("superblock"), "{err}");
    assert!(!is_mounted(&s.mnt));
}

/// The access time options of mount(8) are accepted with their meaning (they used to reach
/// the kernel as FUSE options, which refused the mount with EINVAL): `strictatime` makes
/// every read set a file's atime, `nodiratime` leaves directories' alone.
#[test]
fn atime_options_are_accepted() {
    use std::os::unix::fs::MetadataExt;
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED atime_options: {why}");
    }
    let s = Scratch::new("atime");
    let atime = |p: &std::path::Path| std::fs::metadata(p).map(|m| (m.atime(), m.atime_nsec())).unwrap();
    for options in ["relatime", "strictatime,nodiratime", "noatime"] {
        let o = s.mount(&["--mkfs", "64M", "-o", options]);
        assert!(o.status.success(), "-o {options}: {}", stderr(&o));
        let (f, d) = (s.mnt.join(format!("f-{options}")), s.mnt.join(format!("d-{options}")));
        std::fs::write(&f, b"x").unwrap();
        std::fs::create_dir(&d).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        let before = (atime(&f), atime(&d));
        std::fs::read(&f).unwrap();
        std::fs::read_dir(&d).unwrap().count();
        let after = (atime(&f), atime(&d));
        assert_eq!(after.0 > before.0, options != "noatime", "-o {options}: file atime {before:?} -> {after:?}");
        assert_eq!(after.1 > before.1, options == "relatime", "-o {options}: directory atime {before:?} -> {after:?}");
        s.umount();
        s.wait_released();
    }
    s.fsck_clean();
}
