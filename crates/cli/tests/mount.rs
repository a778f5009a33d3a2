//! `ferrofs mount` as a user and mount(8) run it: daemon mode, the mount helper's command
//! line, one writer per image, a mount right after an unmount, recovery after SIGKILL, and a
//! damaged image refused without leaving a stale mount. Skips where /dev/fuse or root is
//! missing.

use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;

use common::{
    daemon_pid, damaged_image, is_mounted, run, served_through_uring, stderr, transport_options, unavailable, uring,
    BIN,
};

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
        let o = run(Command::new(BIN)
            .arg("mount")
            .arg("--daemon")
            .args(transport_options())
            .args(extra)
            .arg(&self.image)
            .arg(&self.mnt));
        if uring() && o.status.success() && is_mounted(&self.mnt) {
            assert!(served_through_uring(&self.mnt), "{} is not served through io_uring", self.mnt.display());
        }
        o
    }

    fn mkfs(&self) {
        let o = run(Command::new(BIN).args(["mkfs", "--size", "128M"]).arg(&self.image));
        assert!(o.status.success(), "{}", stderr(&o));
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
    assert!(
        String::from_utf8_lossy(&o.stdout).lines().any(|l| l.starts_with("checkpoints ")),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // Unmount and mount again at once: the new daemon waits for the old one's lock.
    s.umount();
    let o = s.mount(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(std::fs::read(s.mnt.join("f")).unwrap(), b"daemon");
    s.umount();
    s.wait_released();
    s.fsck_clean();
    let o = run(Command::new(BIN).arg("lockstat").arg(&s.mnt));
    assert!(
        !o.status.success() && stderr(&o).contains("is") && stderr(&o).contains("a ferrofs mount?"),
        "{}",
        stderr(&o)
    );
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
    // mount(8) passes an fstab line's options as one -o list, the transport's among them.
    let options = if uring() { "rw,noatime,defaults,_netdev,uring" } else { "rw,noatime,defaults,_netdev" };
    let o = run(Command::new(&helper).arg(&s.image).arg(&s.mnt).args(["-n", "-o", options]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(served_through_uring(&s.mnt), uring(), "{options}");
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

/// A file unlinked while open, its unlink made durable, then the daemon killed: the next
/// mount frees it from the orphan list, and nothing leaks. With `noatime` the kernel opens
/// files without asking the daemon, so only the kernel's lookup count kept the file.
#[test]
fn unlinked_open_file_is_freed_after_sigkill() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED unlinked_open_file_is_freed_after_sigkill: {why}");
    }
    let s = Scratch::new("sigkill-orphan");
    let o = s.mount(&["--mkfs", "128M", "-o", "noatime"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let free = || {
        let st = statvfs(&s.mnt);
        (st.f_bfree, st.f_ffree)
    };
    let base = free();
    let f = s.mnt.join("orphan");
    let data = vec![0x3cu8; 4 << 20];
    std::fs::write(&f, &data).unwrap();
    let open = std::fs::File::open(&f).unwrap();
    std::fs::remove_file(&f).unwrap();
    open.sync_all().unwrap();
    // SAFETY: syncfs of a descriptor we own.
    assert_eq!(unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&open)) }, 0);
    let mut back = Vec::new();
    std::io::Read::read_to_end(&mut &open, &mut back).unwrap();
    assert!(back == data, "the unlinked file reads back through its descriptor");
    let during = free();
    assert!(during.0 < base.0 && during.1 < base.1, "freed while open: {during:?}, {base:?} before");
    let pid = daemon_pid(&s.image);
    // SAFETY: plain kill(2) of the daemon we started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    drop(open);
    let _ = Command::new("umount").arg("-l").arg(&s.mnt).status();
    s.wait_released();
    let o = s.mount(&["-o", "noatime"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(free(), base, "the orphan freed by the mount");
    s.umount();
    s.wait_released();
    s.fsck_clean();
}

fn statvfs(p: &std::path::Path) -> libc::statvfs {
    let c = std::ffi::CString::new(std::os::unix::ffi::OsStrExt::as_bytes(p.as_os_str())).unwrap();
    // SAFETY: statvfs fills the zeroed struct we pass; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs {}", p.display());
    st
}

#[test]
fn damaged_image_is_refused_without_a_stale_mount() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED damaged_image: {why}");
    }
    let s = Scratch::new("damaged");
    std::fs::write(&s.image, damaged_image()).unwrap();
    let o = s.mount(&[]);
    assert!(!o.status.success());
    let err = stderr(&o);
    assert!(err.starts_with("ferrofs: ") && err.contains("superblock"), "{err}");
    assert!(!is_mounted(&s.mnt));
}

/// The mountinfo line of the top mount on `dir`, if any.
fn top_mount_line(dir: &std::path::Path) -> Option<String> {
    let canon = dir.canonicalize().unwrap();
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().rfind(|l| l.split(' ').nth(4).is_some_and(|m| std::path::Path::new(m) == canon)).map(str::to_string)
}

/// The fstype and source of the top mount on `dir`, if any.
fn top_mount(dir: &std::path::Path) -> Option<(String, String)> {
    let line = top_mount_line(dir)?;
    let mut right = line.split_once(" - ")?.1.split(' ');
    Some((right.next()?.to_string(), right.next()?.to_string()))
}

/// The per-mount options of the top mount on `dir` (`rw,nosuid,...`).
fn mount_options(dir: &std::path::Path) -> String {
    top_mount_line(dir).expect("mounted").split(' ').nth(5).unwrap().to_string()
}

fn write_files(dir: &std::path::Path, n: usize) {
    for i in 0..n {
        std::fs::write(dir.join(format!("f{i}")), i.to_string()).unwrap();
    }
}

#[test]
fn exiting_daemon_leaves_what_was_mounted_after_it_alone() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED exiting_daemon_leaves: {why}");
    }
    let s = Scratch::new("replaced");
    s.mkfs();
    for round in 0..3 {
        let o = s.mount(&[]);
        assert!(o.status.success(), "{}", stderr(&o));
        write_files(&s.mnt, 300);
        s.umount();
        assert!(Command::new("mount").args(["-t", "tmpfs", "tmpfs"]).arg(&s.mnt).status().unwrap().success());
        // The daemon has exited once it lets go of the image: whatever it did on its way out
        // is done.
        s.wait_released();
        assert_eq!(top_mount(&s.mnt).map(|m| m.0).as_deref(), Some("tmpfs"), "round {round}: the tmpfs was unmounted");
        s.umount();
    }
    s.fsck_clean();
}

#[test]
fn one_umount_of_stacked_mounts_ends_only_the_top_one() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED stacked_mounts: {why}");
    }
    let s = Scratch::new("stacked");
    let upper = Scratch { image: s.dir.join("upper.img"), mnt: s.mnt.clone(), dir: s.dir.join("upper") };
    s.mkfs();
    upper.mkfs();
    assert!(s.mount(&[]).status.success());
    std::fs::write(s.mnt.join("lower-file"), b"lower").unwrap();
    let o = upper.mount(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    write_files(&s.mnt, 100);
    // A remount would reach one daemon by the mount point's control socket, maybe not the top's.
    let o = upper.mount(&["-o", "remount,ro"]);
    assert!(!o.status.success() && stderr(&o).contains("stacked"), "{}", stderr(&o));
    s.umount();
    upper.wait_released();
    let canon = s.image.canonicalize().unwrap();
    assert_eq!(
        top_mount(&s.mnt),
        Some(("fuse.ferrofs".to_string(), canon.display().to_string())),
        "the lower mount was unmounted too"
    );
    assert_eq!(std::fs::read(s.mnt.join("lower-file")).unwrap(), b"lower");
    s.umount();
    s.wait_released();
    s.fsck_clean();
    upper.fsck_clean();
}

#[test]
fn mount_point_that_is_not_a_directory_is_refused_before_forking() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED mount_point_not_a_directory: {why}");
    }
    let s = Scratch::new("notdir");
    s.mkfs();
    let file = s.dir.join("a-file");
    std::fs::write(&file, b"").unwrap();
    for (target, why) in [(&file, "is not a directory"), (&s.dir.join("missing"), "does not exist")] {
        let o = run(Command::new(BIN).args(["mount", "--daemon"]).arg(&s.image).arg(target));
        assert!(!o.status.success());
        assert!(stderr(&o).contains(&format!("mount point {} {why}", target.display())), "{}", stderr(&o));
    }
    assert!(!is_mounted(&file));
    // Nothing was left holding the image.
    ferrofs::dev::FileDevice::open(&s.image, false).unwrap();
}

#[test]
fn unknown_mount_option_is_named() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED unknown_mount_option: {why}");
    }
    let s = Scratch::new("bogus");
    s.mkfs();
    let o = s.mount(&["-o", "noatime,bogus"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("unknown mount option 'bogus'") && !stderr(&o).contains("MsFlags"), "{}", stderr(&o));
    assert!(!is_mounted(&s.mnt));
    ferrofs::dev::FileDevice::open(&s.image, false).unwrap();
}

#[test]
fn fsck_right_after_umount_waits_for_the_daemon() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED fsck_after_umount: {why}");
    }
    let s = Scratch::new("umount-fsck");
    s.mkfs();
    for round in 0..10 {
        let o = s.mount(&[]);
        assert!(o.status.success(), "{}", stderr(&o));
        std::fs::create_dir(s.mnt.join(format!("d{round}"))).unwrap();
        write_files(&s.mnt.join(format!("d{round}")), 300);
        // While mounted, the tools refuse at once and say where.
        let started = Instant::now();
        let o = run(Command::new(BIN).arg("fsck").arg("-n").arg(&s.image));
        assert!(
            !o.status.success()
                && stderr(&o).contains(&format!("mounted on {}", s.mnt.canonicalize().unwrap().display())),
            "{}",
            stderr(&o)
        );
        assert!(started.elapsed() < Duration::from_secs(5), "a mounted image must not be waited for");
        // `umount DIR && fsck IMG`, as scripts do.
        s.umount();
        let o = run(Command::new(BIN).arg("fsck").arg("-n").arg(&s.image));
        assert!(o.status.success(), "round {round}: {}{}", String::from_utf8_lossy(&o.stdout), stderr(&o));
    }
}

/// A loop device bound to a file, detached on drop.
struct Loop(PathBuf);

impl Loop {
    /// `None` where loop devices cannot be set up here.
    fn attach(file: &std::path::Path) -> Option<Loop> {
        let o = Command::new("losetup").args(["-f", "--show"]).arg(file).output().ok()?;
        o.status.success().then(|| Loop(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

#[test]
fn an_image_and_its_loop_device_are_one_image() {
    use ferrofs::dev::FileDevice;
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED image_through_loop_device: {why}");
    }
    let s = Scratch::new("loop");
    s.mkfs();
    let Some(dev) = Loop::attach(&s.image) else {
        return eprintln!("SKIPPED image_through_loop_device: losetup cannot attach a loop device here");
    };
    // The lock itself, by either name.
    let held = FileDevice::open(&s.image, false).unwrap();
    assert_eq!(FileDevice::open(&dev.0, true).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    drop(held);
    let held = FileDevice::open(&dev.0, false).unwrap();
    assert_eq!(FileDevice::open(&s.image, true).unwrap_err().kind(), std::io::ErrorKind::WouldBlock);
    drop(held);
    // Mounted by one name, refused at once by the other, and the tools say where it is mounted.
    let second = s.dir.join("second");
    std::fs::create_dir(&second).unwrap();
    assert!(s.mount(&[]).status.success());
    let mnt = s.mnt.canonicalize().unwrap();
    let o = run(Command::new(BIN).args(["mount", "--daemon"]).arg(&dev.0).arg(&second));
    assert!(
        !o.status.success() && stderr(&o).contains(&format!("already mounted on {}", mnt.display())),
        "{}",
        stderr(&o)
    );
    assert!(!is_mounted(&second));
    let o = run(Command::new(BIN).arg("fsck").arg("-n").arg(&dev.0));
    assert!(!o.status.success() && stderr(&o).contains(&format!("mounted on {}", mnt.display())), "{}", stderr(&o));
    s.umount();
    let o = run(Command::new(BIN).args(["mount", "--daemon"]).arg(&dev.0).arg(&second));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = s.mount(&[]);
    assert!(!o.status.success() && stderr(&o).contains("already mounted on"), "{}", stderr(&o));
    assert!(Command::new("umount").arg(&second).status().unwrap().success());
    s.wait_released();
    drop(dev);
    s.fsck_clean();
}

#[test]
fn remount_read_only_and_back_through_the_helper() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED remount: {why}");
    }
    let s = Scratch::new("remount");
    s.mkfs();
    assert!(s.mount(&[]).status.success());
    write_files(&s.mnt, 200);
    let helper = s.dir.join("mount.fuse.ferrofs");
    symlink(BIN, &helper).unwrap();
    // A copy of the image as it is on disk now, checked while the mount goes on: consistent,
    // its log empty, and the last file written is in it.
    let image_is_clean = || {
        let copy = s.dir.join("copy.img");
        assert!(Command::new("cp").arg("--sparse=always").arg(&s.image).arg(&copy).status().unwrap().success());
        let fsck = run(Command::new(BIN).arg("fsck").arg("-n").arg(&copy));
        let info = String::from_utf8_lossy(&run(Command::new(BIN).arg("info").arg(&copy)).stdout).into_owned();
        let dev = std::sync::Arc::new(ferrofs::dev::FileDevice::open(&copy, true).unwrap());
        let fs =
            ferrofs::FileSystem::mount_device(dev, &ferrofs::MountOptions { read_only: true, ..Default::default() })
                .unwrap();
        let last = fs.lookup(1, b"f199").and_then(|a| fs.read(a.ino, 0, 8));
        drop(fs);
        std::fs::remove_file(&copy).unwrap();
        fsck.status.success()
            && info.lines().any(|l| l.split_whitespace().eq(["log", "clean"]))
            && last.is_ok_and(|d| d == b"199")
    };
    // As mount(8) runs the helper for `mount -o remount,ro DIR`.
    let o = run(Command::new(&helper).arg(&s.image).arg(&s.mnt).args(["-o", "remount,ro"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(mount_options(&s.mnt).starts_with("ro,"), "{}", mount_options(&s.mnt));
    let erofs = |r: std::io::Result<()>| r.unwrap_err().raw_os_error() == Some(libc::EROFS);
    assert!(erofs(std::fs::write(s.mnt.join("new"), b"x")));
    assert!(erofs(std::fs::write(s.mnt.join("f1"), b"x")));
    assert!(erofs(std::fs::create_dir(s.mnt.join("dir"))));
    assert_eq!(std::fs::read(s.mnt.join("f7")).unwrap(), b"7");
    assert!(image_is_clean(), "remount ro writes the log home");
    let o = run(Command::new(&helper).arg(&s.image).arg(&s.mnt).args(["-o", "remount,rw"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(mount_options(&s.mnt).starts_with("rw,"), "{}", mount_options(&s.mnt));
    std::fs::write(s.mnt.join("new"), b"after").unwrap();
    std::fs::create_dir(s.mnt.join("dir")).unwrap();
    s.umount();
    s.wait_released();
    s.fsck_clean();
    assert!(s.mount(&[]).status.success());
    assert_eq!(std::fs::read(s.mnt.join("new")).unwrap(), b"after");
    s.umount();
    s.wait_released();
}

#[test]
fn suid_and_dev_are_honoured_for_root_and_off_by_default() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED suid_dev: {why}");
    }
    let s = Scratch::new("suid-dev");
    s.mkfs();
    let helper = s.dir.join("mount.fuse.ferrofs");
    symlink(BIN, &helper).unwrap();
    let null = s.mnt.join("null");
    // `ferrofs mount` keeps FUSE's safe default; mount(8) passes no `suid,dev` (they are its
    // default) but does pass `nosuid,nodev`, and the helper reads it as mount.fuse3 does.
    let cases: [(&std::path::Path, &str, bool); 4] = [
        (BIN.as_ref(), "rw", true),
        (BIN.as_ref(), "suid,dev", false),
        (&helper, "rw", false),
        (&helper, "rw,nosuid,nodev", true),
    ];
    for (command, options, nosuid_nodev) in cases {
        let o = if command == helper {
            run(Command::new(command).arg(&s.image).arg(&s.mnt).args(["-o", options]))
        } else {
            s.mount(&["-o", options])
        };
        assert!(o.status.success(), "{}", stderr(&o));
        let flags = mount_options(&s.mnt);
        let flags: Vec<&str> = flags.split(',').collect();
        assert_eq!(
            (flags.contains(&"nosuid"), flags.contains(&"nodev")),
            (nosuid_nodev, nosuid_nodev),
            "{command:?} -o {options}: {flags:?}"
        );
        // The kernel opens device nodes itself: a node of /dev/null works only with `dev`.
        if !null.exists() {
            assert!(Command::new("mknod").arg(&null).args(["c", "1", "3"]).status().unwrap().success());
        }
        let opened = std::fs::OpenOptions::new().write(true).open(&null);
        assert_eq!(opened.is_ok(), !nosuid_nodev, "{command:?} -o {options}: {opened:?}");
        drop(opened);
        s.umount();
        s.wait_released();
    }
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

/// `info` on a mounted image (as dumpe2fs on a mounted ext4): it takes no lock and writes
/// nothing, so it succeeds and the mount goes on serving; its figures are the image's as the
/// mount has written it so far, and it says so. `tune`, which writes, is refused.
#[test]
fn info_reads_a_mounted_image_and_leaves_the_mount_alone() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED info_on_mounted: {why}");
    }
    let s = Scratch::new("info-mounted");
    let o = run(Command::new(BIN).args(["mkfs", "--size", "128M", "-L", "live"]).arg(&s.image));
    assert!(o.status.success(), "{}", stderr(&o));
    let info_json = || {
        let o = run(Command::new(BIN).args(["info", "--json"]).arg(&s.image));
        assert!(o.status.success(), "info: {}", stderr(&o));
        serde_json::from_slice::<serde_json::Value>(&o.stdout).unwrap()
    };
    let fresh = info_json();
    assert_eq!((&fresh["label"], &fresh["mounted_on"]), (&serde_json::json!("live"), &serde_json::Value::Null));
    let o = s.mount(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let pid = daemon_pid(&s.image);
    write_files(&s.mnt, 50);
    // FUSE does not pass syncfs on; an fsync makes the files' creation durable in the log.
    std::fs::File::open(s.mnt.join("f49")).unwrap().sync_all().unwrap();
    let mnt = s.mnt.canonicalize().unwrap().display().to_string();
    for round in 0..3 {
        let live = info_json();
        assert_eq!(live["mounted_on"], serde_json::json!(mnt));
        assert_eq!((&live["uuid"], &live["label"]), (&fresh["uuid"], &fresh["label"]));
        let used = fresh["free_inodes"].as_u64().unwrap() - live["free_inodes"].as_u64().unwrap();
        assert!(used >= 50, "the fsynced files are in the figures: {used} inodes used");
        std::fs::create_dir(s.mnt.join(format!("d{round}"))).unwrap();
        write_files(&s.mnt.join(format!("d{round}")), 10);
    }
    let o = run(Command::new(BIN).arg("info").arg(&s.image));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!("mounted on {mnt}: figures as of its last checkpoint"))
    );
    let o = run(Command::new(BIN).args(["tune", "-L", "other"]).arg(&s.image));
    assert!(!o.status.success() && stderr(&o).contains(&format!("mounted on {mnt}")), "{}", stderr(&o));
    // The mount is as it was: same daemon, still writable, its files intact.
    assert_eq!(daemon_pid(&s.image), pid);
    std::fs::write(s.mnt.join("after-info"), b"still here").unwrap();
    assert_eq!(std::fs::read(s.mnt.join("after-info")).unwrap(), b"still here");
    s.umount();
    s.wait_released();
    s.fsck_clean();
    assert_eq!(info_json()["label"], serde_json::json!("live"));
}

/// `ferrofs mount LABEL=x DIR` and `UUID=x`: the block device holding that file system (here a
/// loop device of the image) is found and mounted; an unknown label is named.
#[test]
fn mount_by_label_or_uuid_finds_the_block_device() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED mount_by_label: {why}");
    }
    let s = Scratch::new("by-label");
    // Unique to this run: other images may be on loop devices of this machine.
    let label = format!("tag-{}", std::process::id());
    let uuid = format!("{:08x}-5d1e-4c3b-8a29-7f6e5d4c3b2a", std::process::id());
    let o = run(Command::new(BIN).args(["mkfs", "--size", "128M", "-L", &label, "-U", &uuid]).arg(&s.image));
    assert!(o.status.success(), "{}", stderr(&o));
    let Some(dev) = Loop::attach(&s.image) else {
        return eprintln!("SKIPPED mount_by_label: losetup cannot attach a loop device here");
    };
    let canonical = dev.0.canonicalize().unwrap();
    for tag in [format!("LABEL={label}"), format!("UUID={uuid}")] {
        let o = run(Command::new(BIN).args(["mount", "--daemon", &tag]).arg(&s.mnt));
        assert!(o.status.success(), "{tag}: {}", stderr(&o));
        let (_, source) = top_mount(&s.mnt).unwrap();
        assert_eq!(std::path::Path::new(&source), canonical, "{tag}");
        std::fs::write(s.mnt.join("f"), &tag).unwrap();
        s.umount();
        s.wait_released();
    }
    let o = run(Command::new(BIN).args(["mount", "--daemon", &format!("LABEL={label}-none")]).arg(&s.mnt));
    assert!(
        !o.status.success() && stderr(&o).contains("no block device holds a ferrofs file system"),
        "{}",
        stderr(&o)
    );
    let o = run(Command::new(BIN).args(["mount", "--daemon", "UUID=not-a-uuid"]).arg(&s.mnt));
    assert!(!o.status.success() && stderr(&o).contains("UUID=not-a-uuid"), "{}", stderr(&o));
    assert!(!is_mounted(&s.mnt));
    drop(dev);
    s.fsck_clean();
}

/// Sectors (512 bytes) the image takes on its host, as `du` counts them.
fn image_sectors(image: &std::path::Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(image).unwrap().blocks()
}

fn pattern(len: usize, seed: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed as u8) | 1).collect()
}

/// `rm -rf` of 32 MiB through a mount gives the space back to the image's host only with
/// `-o discard` (punched once its checkpoint is durable) or after `ferrofs trim MOUNTPOINT`;
/// the files kept read back intact and the image is clean afterwards. Both permission modes.
#[test]
fn trim_and_discard_give_what_rm_freed_back_to_the_host() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED trim_and_discard: {why}");
    }
    const MIB: usize = 1 << 20;
    let freed_sectors = 28 * MIB as u64 / 512;
    for perms in ["default_permissions", "daemon_permissions"] {
        for discard in [false, true] {
            let s = Scratch::new(&format!("trim-{perms}-{discard}"));
            s.mkfs();
            let opts = if discard { format!("{perms},discard") } else { perms.to_string() };
            let o = s.mount(&["-o", &opts]);
            assert!(o.status.success(), "{}", stderr(&o));
            let (keep, gone) = (s.mnt.join("keep"), s.mnt.join("gone"));
            std::fs::create_dir(&keep).unwrap();
            std::fs::create_dir(&gone).unwrap();
            for i in 0..32 {
                std::fs::write(gone.join(i.to_string()), pattern(MIB, i)).unwrap();
            }
            for i in 0..8 {
                std::fs::write(keep.join(i.to_string()), pattern(MIB, 100 + i)).unwrap();
            }
            let fsync_keep = || std::fs::File::open(keep.join("0")).unwrap().sync_all().unwrap();
            fsync_keep();
            let full = image_sectors(&s.image);
            std::fs::remove_dir_all(&gone).unwrap();
            fsync_keep(); // the unlinks' checkpoint is durable: discard may punch now
            let deadline = Instant::now() + Duration::from_secs(if discard { 20 } else { 2 });
            while full - image_sectors(&s.image).min(full) < freed_sectors && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let after_rm = image_sectors(&s.image);
            if discard {
                assert!(
                    full.saturating_sub(after_rm) >= freed_sectors,
                    "{opts}: {full} sectors before rm, {after_rm} after"
                );
            } else {
                assert!(
                    after_rm + 2048 > full,
                    "{opts}: without discard rm gave {} sectors back",
                    full.saturating_sub(after_rm)
                );
            }
            let o = run(Command::new(BIN).args(["trim", "-v"]).arg(&s.mnt));
            assert!(o.status.success(), "{opts}: {}", stderr(&o));
            assert!(String::from_utf8_lossy(&o.stdout).contains("trimmed"), "{}", String::from_utf8_lossy(&o.stdout));
            let after_trim = image_sectors(&s.image);
            assert!(
                full.saturating_sub(after_trim) >= freed_sectors,
                "{opts}: {full} sectors before rm, {after_trim} after trim"
            );
            for i in 0..8 {
                assert!(std::fs::read(keep.join(i.to_string())).unwrap() == pattern(MIB, 100 + i), "{opts}: keep/{i}");
            }
            s.umount();
            s.wait_released();
            s.fsck_clean();
        }
    }
}

/// `ferrofs trim` names what is wrong with its argument: a mounted image (trim the mount
/// point), a directory no ferrofs daemon serves.
#[test]
fn trim_refuses_a_mounted_image_and_a_plain_directory() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED trim_refuses: {why}");
    }
    let s = Scratch::new("trim-args");
    let o = run(Command::new(BIN).arg("trim").arg(&s.mnt));
    assert!(!o.status.success() && stderr(&o).contains("a ferrofs mount?"), "{}", stderr(&o));
    s.mkfs();
    let o = s.mount(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(Command::new(BIN).arg("trim").arg(&s.image));
    assert!(!o.status.success() && stderr(&o).contains("trim the mount point instead"), "{}", stderr(&o));
    s.umount();
    s.wait_released();
}

const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// Held by the tests that switch the system-wide enable_uring, so that they take turns.
static ENABLE_URING_SWITCH: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Sets the fuse module's enable_uring back to what it was, even when the test fails, then
/// lets the next test switch it.
struct RestoreEnableUring(String, #[allow(dead_code)] std::sync::MutexGuard<'static, ()>);

impl RestoreEnableUring {
    /// Take the switch and remember the parameter; None where the kernel has no such parameter.
    fn take() -> Option<RestoreEnableUring> {
        let turn = ENABLE_URING_SWITCH.lock().unwrap_or_else(|e| e.into_inner());
        Some(RestoreEnableUring(std::fs::read_to_string(ENABLE_URING).ok()?.trim().to_string(), turn))
    }
}

impl Drop for RestoreEnableUring {
    fn drop(&mut self) {
        std::fs::write(ENABLE_URING, &self.0).expect("restore enable_uring");
    }
}

/// The lines ferrofs itself wrote to stderr.
fn notices(o: &Output) -> Vec<String> {
    stderr(o).lines().filter(|l| l.starts_with("ferrofs:")).map(str::to_string).collect()
}

#[test]
fn uring_off_falls_back_in_one_line_and_uring_force_is_for_root() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED uring_force: {why}");
    }
    // The test switches the system-wide parameter: on the io_uring runs the other tests of
    // this binary need it on throughout.
    if uring() {
        return eprintln!("SKIPPED uring_force: runs on the /dev/fuse runs, where no other test needs enable_uring");
    }
    let s = Scratch::new("uring-force");
    s.mkfs();
    let Some(_restore) = RestoreEnableUring::take() else {
        // A kernel without FUSE over io_uring: the mount says so and serves through /dev/fuse.
        let o = s.mount(&["-o", "uring"]);
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(notices(&o).len(), 1, "{}", stderr(&o));
        assert!(notices(&o)[0].contains("has no FUSE over io_uring"), "{}", stderr(&o));
        assert!(!served_through_uring(&s.mnt));
        return s.umount();
    };
    std::fs::write(ENABLE_URING, "N").unwrap();

    // Off: one line says so and how to switch it on, and the mount serves through /dev/fuse.
    let o = s.mount(&["-o", "uring"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let said = notices(&o);
    assert_eq!(said.len(), 1, "{}", stderr(&o));
    assert!(said[0].contains("is N") && said[0].contains("uring=force") && said[0].contains("system-wide"), "{said:?}");
    assert!(!served_through_uring(&s.mnt));
    std::fs::write(s.mnt.join("through-dev-fuse"), b"x").unwrap();
    s.umount();
    s.wait_released();

    // A user may not switch it: a clear line, and the parameter stays off.
    let nobody = 65534;
    std::os::unix::fs::chown(&s.image, Some(nobody), Some(nobody)).unwrap();
    std::os::unix::fs::chown(&s.mnt, Some(nobody), Some(nobody)).unwrap();
    let o = run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN, "mount", "--daemon", "-o", "uring=force"])
        .arg(&s.image)
        .arg(&s.mnt));
    assert!(notices(&o).iter().any(|l| l.contains("only root can switch FUSE over io_uring on")), "{}", stderr(&o));
    assert_eq!(std::fs::read_to_string(ENABLE_URING).unwrap().trim(), "N");
    if is_mounted(&s.mnt) {
        assert!(!served_through_uring(&s.mnt));
        s.umount();
    }
    s.wait_released();

    // Root: switched on, in one line that says it is system-wide, and served through the rings.
    let o = s.mount(&["-o", "uring=force"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let said = notices(&o);
    assert_eq!(said.len(), 1, "{}", stderr(&o));
    assert!(said[0].contains("switched FUSE over io_uring on") && said[0].contains("system-wide"), "{said:?}");
    assert_eq!(std::fs::read_to_string(ENABLE_URING).unwrap().trim(), "Y");
    assert!(served_through_uring(&s.mnt));
    assert_eq!(std::fs::read(s.mnt.join("through-dev-fuse")).unwrap(), b"x");
    s.umount();
    s.wait_released();
    s.fsck_clean();
}

/// What `ferrofs mounts` (table and `--json`) and `lockstat --journal` say serves `mnt`, a
/// mount with a daemon of its own.
fn transport_listed(s: &Scratch) -> [String; 3] {
    let mnt = s.mnt.canonicalize().unwrap();
    // A daemon socket of this test's own, so the machine's shared daemon stays out of it.
    let mounts = |json: &[&str]| {
        let o = run(Command::new(BIN).env("FERROFS_DAEMON_SOCKET", s.dir.join("daemon.sock")).arg("mounts").args(json));
        assert!(o.status.success(), "{}", stderr(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let out = mounts(&["--json"]);
    let listed: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let ours = listed.iter().find(|m| m["mountpoint"].as_str() == mnt.to_str()).unwrap_or_else(|| panic!("{out}"));
    assert_eq!(ours["image"].as_str(), s.image.canonicalize().unwrap().to_str(), "{out}");
    let table = mounts(&[]);
    let row = table.lines().find(|l| l.contains(&format!(" {} ", mnt.display()))).unwrap_or_else(|| panic!("{table}"));
    let o = run(Command::new(BIN).args(["lockstat", "--journal"]).arg(&s.mnt));
    assert!(o.status.success(), "{}", stderr(&o));
    let journal = String::from_utf8_lossy(&o.stdout).into_owned();
    let named = journal.lines().find_map(|l| l.strip_prefix("transport ")).unwrap_or_else(|| panic!("{journal}"));
    [ours["transport"].as_str().unwrap().to_string(), row.rsplit("  ").next().unwrap().to_string(), named.trim().into()]
}

#[test]
fn mounts_and_lockstat_name_the_transport_of_a_mount_with_its_own_daemon() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED mounts_transport: {why}");
    }
    if uring() {
        return eprintln!(
            "SKIPPED mounts_transport: runs on the /dev/fuse runs, where no other test needs enable_uring"
        );
    }
    let s = Scratch::new("mounts-transport");
    s.mkfs();
    let o = s.mount(&[]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(transport_listed(&s), ["/dev/fuse"; 3]);
    s.umount();
    s.wait_released();
    let Some(_restore) = RestoreEnableUring::take() else {
        return eprintln!("SKIPPED mounts_transport on io_uring: the kernel has no FUSE over io_uring");
    };
    std::fs::write(ENABLE_URING, "Y").unwrap();
    let o = s.mount(&["-o", "uring"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(transport_listed(&s), ["io_uring"; 3]);
    s.umount();
    s.wait_released();
}

#[test]
fn uring_queue_depth_comes_from_the_environment() {
    if let Some(why) = unavailable() {
        return eprintln!("SKIPPED uring_depth: {why}");
    }
    if !uring() {
        return eprintln!("SKIPPED uring_depth: FERROFS_URING_DEPTH sets the depth of the io_uring rings only");
    }
    let s = Scratch::new("uring-depth");
    s.mkfs();
    // 1 entry per queue serves (every request of a CPU's callers waits for that one entry);
    // a depth out of range is named in one line and the default serves.
    for (depth, refused) in [("1", false), ("0", true), ("65", true), ("x", true)] {
        let o = run(Command::new(BIN)
            .env("FERROFS_URING_DEPTH", depth)
            .args(["mount", "--daemon", "-o", "uring"])
            .arg(&s.image)
            .arg(&s.mnt));
        assert!(o.status.success(), "{}", stderr(&o));
        assert_eq!(notices(&o).len(), refused as usize, "{depth}: {}", stderr(&o));
        assert!(!refused || notices(&o)[0].contains("FERROFS_URING_DEPTH"), "{}", stderr(&o));
        assert!(served_through_uring(&s.mnt));
        std::fs::create_dir(s.mnt.join(depth)).unwrap();
        write_files(&s.mnt.join(depth), 200);
        s.umount();
        s.wait_released();
    }
    s.fsck_clean();
}
