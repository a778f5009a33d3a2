//! Test harness: a fresh image mounted on a temporary mount point, always unmounted and
//! removed again (even when the test fails), and a clean skip where FUSE is unavailable.

#![allow(dead_code)]

use ferrofs::dev::FileDevice;
use ferrofs::{FileSystem, MkfsOptions, MountOptions};
use ferrofs_fuse::{spawn_mount, MountConfig, MountError, MountHandle};
use std::ffi::CString;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const IMAGE_SIZE: u64 = 512 << 20;

/// Why FUSE cannot be used here, if it cannot.
pub fn fuse_unavailable() -> Option<String> {
    match std::fs::OpenOptions::new().read(true).write(true).open("/dev/fuse") {
        Ok(_) => None,
        Err(e) => Some(format!("/dev/fuse cannot be opened ({e})")),
    }
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

pub fn skip(test: &str, why: &str) {
    eprintln!("SKIPPED {test}: {why}");
}

/// Whether mounting failed because this machine does not allow it (not a ferrofs bug).
fn not_permitted(e: &MountError) -> bool {
    matches!(e, MountError::Fuse { .. })
        && matches!(e.raw_os_error(), Some(libc::EPERM | libc::EACCES | libc::ENODEV | libc::ENOENT))
}

pub fn is_mounted(path: &Path) -> bool {
    let Ok(canon) = path.canonicalize() else { return false };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    info.lines().any(|l| l.split(' ').nth(4).is_some_and(|m| Path::new(m) == canon))
}

pub fn mkfs(image: &Path, size: u64) {
    let dev = FileDevice::create(image, size).expect("create image");
    FileSystem::mkfs(&dev, &MkfsOptions::default()).expect("mkfs");
}

/// Whether this run's mounts leave permission checks to the kernel (`default_permissions`,
/// with FERROFS_TEST_DEFAULT_PERMISSIONS=1) instead of the adapter (the default). Every suite
/// must pass both ways.
pub fn kernel_checks_permissions() -> bool {
    std::env::var_os("FERROFS_TEST_DEFAULT_PERMISSIONS").is_some_and(|v| v == "1")
}

/// Whether this run's mounts negotiate the kernel's writeback cache: as
/// FERROFS_TEST_WRITEBACK_CACHE says (`1` on, `0` off), else the mount's default. Every suite
/// must pass both ways, but for the tests of what the cache cannot give, which
/// scripts/test.sh names and skips in its runs with the cache.
pub fn writeback_cache() -> bool {
    match std::env::var("FERROFS_TEST_WRITEBACK_CACHE").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        Ok(v) => panic!("FERROFS_TEST_WRITEBACK_CACHE={v}: 0 or 1"),
        Err(_) => MountConfig::new("", "").writeback_cache,
    }
}

/// Whether this run's mounts punch the blocks each checkpoint frees (`-o discard`, with
/// FERROFS_TEST_DISCARD=1; off by default, as the mount's default).
pub fn discard() -> bool {
    std::env::var_os("FERROFS_TEST_DISCARD").is_some_and(|v| v == "1")
}

/// Whether this run's mounts serve through FUSE over io_uring (FERROFS_TEST_TRANSPORT=uring)
/// instead of reads of /dev/fuse (`devfuse`, the default). Every suite must pass both ways.
pub fn uring() -> bool {
    match std::env::var("FERROFS_TEST_TRANSPORT").as_deref() {
        Ok("uring") => true,
        Ok("devfuse") | Err(_) => false,
        Ok(v) => panic!("FERROFS_TEST_TRANSPORT={v}: uring or devfuse"),
    }
}

/// Why the kernel will not offer FUSE over io_uring now, if it will not. The fuse module's
/// `enable_uring` is system-wide: scripts/test.sh switches it on for its io_uring runs (as
/// root) and back afterwards; a test never changes it.
pub fn uring_unavailable() -> Option<String> {
    match std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring") {
        Err(_) => Some("this kernel has no FUSE over io_uring (no fuse parameter enable_uring)".into()),
        Ok(v) if v.trim() != "Y" => {
            Some("FUSE over io_uring is off (/sys/module/fuse/parameters/enable_uring is N)".into())
        }
        Ok(_) => None,
    }
}

/// The mount's transport counters (`transport_uring`, `transport_ring_requests`) from its
/// control socket.
pub fn transport_counters(mnt: &Path) -> (u64, u64) {
    let journal: serde_json::Value =
        serde_json::from_str(&ferrofs_fuse::control_request(mnt, "journal").expect("control socket")).unwrap();
    (journal["transport_uring"].as_u64().unwrap(), journal["transport_ring_requests"].as_u64().unwrap())
}

fn give_root_directory_to_caller(image: &Path) {
    let dev = FileDevice::open_wait(image, false, Duration::from_secs(10)).expect("open image");
    let fs = FileSystem::mount_device(Arc::new(dev), &MountOptions::default()).expect("engine mount");
    // SAFETY: getuid and getgid have no preconditions.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    fs.setattr(1, &ferrofs::SetAttr { uid: Some(uid), gid: Some(gid), ..Default::default() }).expect("chown /");
    fs.unmount().expect("engine unmount");
}

/// Mount the image with the engine alone: how many log records the mount had to replay
/// (0 after a clean unmount).
pub fn replayed_records(image: &Path) -> u64 {
    let dev = FileDevice::open_wait(image, true, Duration::from_secs(10)).expect("open image");
    let fs = FileSystem::mount_device(Arc::new(dev), &MountOptions { read_only: true, ..MountOptions::default() })
        .expect("engine mount");
    fs.info().log_records_replayed
}

/// Run the engine's fsck (read-only) on an unmounted image; panics with its findings,
/// returns its counts.
pub fn assert_fsck_clean(image: &Path) -> ferrofs::fsck::FsckReport {
    let dev = FileDevice::open_wait(image, true, Duration::from_secs(10)).expect("open image");
    let report = ferrofs::fsck::check(&dev, &ferrofs::fsck::FsckOptions::default(), &|_, _, _| {}).expect("fsck");
    assert!(report.is_clean(), "fsck found errors:\n{}", report.messages.join("\n"));
    report
}

pub struct Fixture {
    pub name: String,
    pub dir: PathBuf,
    pub image: PathBuf,
    pub mnt: PathBuf,
    pub cfg: MountConfig,
    handle: Option<MountHandle>,
}

impl Fixture {
    /// A fresh image, mounted with `tweak` applied to the default configuration. `None`
    /// (after printing why) when FUSE is unavailable or mounting is not permitted here.
    pub fn new(name: &str, tweak: impl FnOnce(&mut MountConfig)) -> Option<Fixture> {
        Fixture::with_size(name, IMAGE_SIZE, tweak)
    }

    pub fn with_size(name: &str, size: u64, tweak: impl FnOnce(&mut MountConfig)) -> Option<Fixture> {
        if let Some(why) = fuse_unavailable().or_else(|| uring().then(uring_unavailable).flatten()) {
            skip(name, &why);
            return None;
        }
        let dir = std::env::temp_dir().join(format!("ferrofs-fuse-{}-{}", std::process::id(), name));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("mnt")).expect("create test dir");
        let image = dir.join("image");
        mkfs(&image, size);
        if !is_root() {
            // mkfs makes the root directory root's: a user mounting through fusermount3
            // could not write into it.
            give_root_directory_to_caller(&image);
        }
        let mnt = dir.join("mnt");
        let mut cfg = MountConfig::new(&image, &mnt);
        cfg.lock_timeout = Duration::from_secs(10);
        cfg.default_permissions = kernel_checks_permissions();
        cfg.writeback_cache = writeback_cache();
        cfg.discard = discard();
        if uring() {
            cfg.uring = ferrofs_fuse::Uring::On;
        }
        tweak(&mut cfg);
        let mut fx = Fixture { name: name.to_string(), dir, image, mnt, cfg, handle: None };
        match fx.mount() {
            Ok(()) => Some(fx),
            Err(e) if not_permitted(&e) => {
                skip(name, &format!("mounting is not permitted here: {e}"));
                None
            }
            Err(e) => panic!("mount failed: {e}"),
        }
    }

    pub fn mount(&mut self) -> Result<(), MountError> {
        assert!(self.handle.is_none(), "already mounted");
        self.handle = Some(spawn_mount(&self.cfg)?);
        assert!(is_mounted(&self.mnt), "spawn_mount returned but {} is not mounted", self.mnt.display());
        if self.cfg.uring != ferrofs_fuse::Uring::Off {
            // A run on io_uring that quietly served through /dev/fuse would test nothing new.
            assert_eq!(transport_counters(&self.mnt).0, 1, "{} is not served through io_uring", self.mnt.display());
        }
        Ok(())
    }

    /// Unmount through the API and require a clean end (session and checkpoint).
    pub fn unmount(&mut self) {
        let h = self.handle.take().expect("not mounted");
        h.unmount().expect("unmount");
        assert!(!is_mounted(&self.mnt));
    }

    /// Hand the session over (e.g. to wait for an unmount done from outside).
    pub fn take_handle(&mut self) -> MountHandle {
        self.handle.take().expect("not mounted")
    }

    pub fn remount(&mut self) {
        self.unmount();
        self.mount().expect("remount");
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.mnt.join(rel)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if is_mounted(&self.mnt) {
            // The test failed with the file system mounted: take it down from outside, the
            // way an operator would, so the session thread ends.
            let quiet =
                |cmd: &mut Command| cmd.stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok_and(|s| s.success());
            if !quiet(Command::new("fusermount3").arg("-u").arg(&self.mnt)) {
                quiet(Command::new("umount").arg("-l").arg(&self.mnt));
            }
        }
        if let Some(h) = self.handle.take() {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if h.is_finished() {
                drop(h);
            } else {
                eprintln!("{}: session did not end; leaving it behind", self.name);
                std::mem::forget(h);
                return;
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The errno of a failed call (panics if it succeeded).
pub fn errno<T: std::fmt::Debug>(r: io::Result<T>) -> i32 {
    r.expect_err("expected an error").raw_os_error().expect("an OS error")
}

pub fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

pub fn check(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

pub fn check_size(rc: libc::ssize_t) -> io::Result<usize> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}
