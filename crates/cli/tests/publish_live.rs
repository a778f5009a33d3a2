//! `ferrofs publish` of a live mount (frozen at a checkpoint while its image is read), of a
//! read-only image whose log needs replay (replayed in memory, the image never written),
//! and `ferrofs mount s3://` refusing a generation whose log needs replay; against a real
//! S3-compatible server (versitygw, started by scripts/s3-server.sh). Skips where /dev/fuse,
//! root, or the server is missing. Runs in both permission modes
//! (FERROFS_TEST_DEFAULT_PERMISSIONS=1: the kernel's).

use ferrofs::dev::{BlockDevice, FileDevice, MemDevice};
use ferrofs::fsck::{check, FsckOptions};
use ferrofs::{FileSystem, MountOptions};
use ferrofs_remote::delay_proxy::DelayProxy;
use ferrofs_remote::{ChunkRef, Remote, RemoteOptions};
use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::{daemon_pid, is_mounted, mount_daemon, run, stderr, unavailable, Mounts, BIN};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/s3-server.sh");

/// A scratch directory with a versitygw serving part of it; on drop, what was mounted is
/// unmounted, the server stopped and the directory removed.
struct Setup {
    dir: PathBuf,
    env: BTreeMap<String, String>,
    mounts: Mounts,
}

impl Setup {
    /// None (said on stderr) when the test must skip.
    fn new(test: &str) -> Option<Setup> {
        if let Some(why) = unavailable() {
            eprintln!("SKIPPED {test}: {why}");
            return None;
        }
        let dir = std::env::temp_dir().join(format!("ferrofs-publish-live-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let o = run(Command::new(SCRIPT).arg("start").arg(dir.join("s3")));
        match o.status.code() {
            Some(0) => {}
            Some(2) => {
                eprintln!("SKIPPED {test}: {}", stderr(&o).trim());
                return None;
            }
            _ => panic!("s3-server.sh start: {}", stderr(&o)),
        }
        let env: BTreeMap<String, String> = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
            .collect();
        for k in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"] {
            std::env::set_var(k, &env[k]);
        }
        Some(Setup { dir, env, mounts: Default::default() })
    }

    fn endpoint(&self) -> &str {
        &self.env["S3_ENDPOINT"]
    }

    fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.env["S3_BUCKET"])
    }

    fn remote(&self, prefix: &str) -> Remote {
        Remote::open(&self.url(prefix), &RemoteOptions { endpoint: Some(self.endpoint().to_string()) }).unwrap()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// A new 64 MiB image.
    fn image(&self, name: &str) -> PathBuf {
        let image = self.path(name);
        let o = run(Command::new(BIN).args(["mkfs", "--size", "64M"]).arg(&image));
        assert!(o.status.success(), "{}", stderr(&o));
        image
    }

    /// A new image `name`, mounted read-write on `name.mnt`.
    fn mounted_image(&self, name: &str) -> (PathBuf, PathBuf) {
        let (image, mnt) = (self.image(name), self.path(&format!("{name}.mnt")));
        let o = self.mount(image.to_str().unwrap(), &mnt, "rw");
        assert!(o.status.success(), "{}", stderr(&o));
        (image, mnt)
    }

    /// `ferrofs mount --daemon SOURCE DIR -o OPTIONS` in this run's permission mode.
    fn mount(&self, source: &str, mnt: &Path, options: &str) -> Output {
        std::fs::create_dir_all(mnt).unwrap();
        self.mounts.track(mnt, mount_daemon(source, mnt, options))
    }

    fn umount(&self, mnt: &Path) {
        self.mounts.umount(mnt);
    }

    /// `ferrofs publish SOURCE URL` to `prefix`, through `endpoint`.
    fn publish_command(&self, source: &Path, prefix: &str, endpoint: &str) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.arg("publish").arg(source).arg(self.url(prefix)).args(["--endpoint", endpoint]);
        cmd
    }

    /// Publish `source` to `prefix`, which must become `generation`.
    fn publish(&self, source: &Path, prefix: &str, generation: u64) {
        let o = run(&mut self.publish_command(source, prefix, self.endpoint()));
        assert!(o.status.success(), "publish: {}", stderr(&o));
        let said = String::from_utf8_lossy(&o.stdout);
        assert!(said.contains(&format!("generation {generation} ")), "{said}");
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        self.mounts.release();
        let _ = run(Command::new(SCRIPT).arg("stop").arg(self.dir.join("s3")));
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The bytes of a published generation, put together from its chunks.
fn published_bytes(remote: &Remote, generation: u64) -> Vec<u8> {
    let manifest = remote.manifest(generation).unwrap();
    let mut image = vec![0u8; manifest.image_size as usize];
    for (index, chunk) in manifest.chunks.iter().enumerate() {
        if let ChunkRef::Stored(hash) = chunk {
            let at = index * manifest.chunk_size as usize;
            let bytes = remote.get_chunk(hash).unwrap();
            image[at..at + bytes.len()].copy_from_slice(&bytes);
        }
    }
    image
}

/// A published generation checked as its readers will take it: fsck-clean, no log to
/// replay; mounted read-only by the engine.
fn published_fs(remote: &Remote, generation: u64) -> FileSystem {
    let dev: Arc<dyn BlockDevice> = Arc::new(MemDevice::from_bytes(&published_bytes(remote, generation)));
    let report = check(&*dev, &FsckOptions { repair: false }, &|_, _, _| {}).unwrap();
    assert!(report.is_clean(), "generation {generation}: {report:?}");
    let fs = FileSystem::mount_device(dev, &MountOptions { read_only: true, ..MountOptions::default() }).unwrap();
    assert_eq!(fs.info().log_records_replayed, 0, "generation {generation} has no log to replay");
    fs
}

/// The contents of the writer's file after its `n`th replacement.
fn contents(n: u64) -> Vec<u8> {
    let len = 3000 + (n * 7919 % 60_000) as usize;
    (0..len as u64).map(|i| (i.wrapping_mul(31) ^ n) as u8).collect()
}

/// Replace `mnt/cur` by a new file renamed over it until `stop`, counting in `done`.
fn write_until(mnt: &Path, done: &AtomicU64, stop: &AtomicBool) -> std::io::Result<()> {
    while !stop.load(Relaxed) {
        let n = done.load(Relaxed) + 1;
        let tmp = mnt.join(format!("tmp{n}"));
        std::fs::write(&tmp, contents(n))?;
        std::fs::rename(&tmp, mnt.join("cur"))?;
        done.store(n, Relaxed);
    }
    Ok(())
}

fn wait_for(what: &str, bound: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + bound;
    while !ready() {
        assert!(Instant::now() < deadline, "{what}: not within {bound:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_live_mount_publishes_a_state_its_writer_went_through() {
    let Some(s) = Setup::new("live") else { return };
    let (_, mnt) = s.mounted_image("live.img");
    let (done, stop) = (AtomicU64::new(0), AtomicBool::new(false));
    std::thread::scope(|scope| {
        let writer = scope.spawn(|| write_until(&mnt, &done, &stop));
        wait_for("the writer's first files", Duration::from_secs(30), || done.load(Relaxed) >= 5);
        let before = done.load(Relaxed);
        s.publish(&mnt, "live", 1);
        let after = done.load(Relaxed);
        wait_for("the writer going on after the publish", Duration::from_secs(30), || done.load(Relaxed) >= after + 5);
        stop.store(true, Relaxed);
        writer.join().unwrap().expect("the writer never failed");

        let published = published_fs(&s.remote("live"), 1);
        let cur = published.read_file("/cur").unwrap();
        // The replacement in flight when the freeze came may have finished before it.
        let n = (before..=after + 1).find(|&n| cur == contents(n));
        assert!(n.is_some(), "/cur ({} bytes) is none of replacements {before}..={}", cur.len(), after + 1);
        // Readers mount it.
        let (reader, cache) = (s.path("reader"), s.path("cache"));
        let options = format!("ro,cache={},endpoint={}", cache.display(), s.endpoint());
        let o = s.mount(&s.url("live"), &reader, &options);
        assert!(o.status.success(), "{}", stderr(&o));
        assert!(std::fs::read(reader.join("cur")).unwrap() == cur);
        s.umount(&reader);
    });
    s.umount(&mnt);
}

#[test]
fn a_killed_publisher_leaves_the_mount_thawed() {
    let Some(s) = Setup::new("killed") else { return };
    let (_, mnt) = s.mounted_image("killed.img");
    std::fs::write(mnt.join("before"), b"1").unwrap();
    // Every GET slowed: the publisher reads HEAD and lists the manifests while it holds the
    // freeze, long enough to be killed then.
    let target = s.endpoint().trim_start_matches("http://").parse().unwrap();
    let proxy = DelayProxy::start(target, Duration::from_secs(4)).unwrap();
    let mut publisher = s
        .publish_command(&mnt, "killed", &proxy.endpoint())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Frozen once a write waits: one that returns at once was before the freeze.
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut waiting = None;
    while waiting.is_none() {
        assert!(Instant::now() < deadline, "the mount was never frozen");
        let (flag, path) = (Arc::new(AtomicBool::new(false)), mnt.join("during"));
        let write = std::thread::spawn({
            let flag = flag.clone();
            move || {
                let result = std::fs::write(path, b"2");
                flag.store(true, Relaxed);
                result
            }
        });
        std::thread::sleep(Duration::from_millis(700));
        if flag.load(Relaxed) {
            write.join().unwrap().unwrap();
        } else {
            waiting = Some((write, flag));
        }
    }
    // Reads go on while frozen.
    assert_eq!(std::fs::read(mnt.join("before")).unwrap(), b"1");
    assert!(publisher.try_wait().unwrap().is_none(), "the publisher is still in its freeze");
    publisher.kill().unwrap();
    publisher.wait().unwrap();
    let (write, flag) = waiting.unwrap();
    wait_for("the waiting write, after the publisher died", Duration::from_secs(10), || flag.load(Relaxed));
    write.join().unwrap().unwrap();
    std::fs::write(mnt.join("after"), b"3").unwrap();
    assert_eq!(s.remote("killed").head().unwrap(), None, "nothing was published");
    s.umount(&mnt);
}

#[test]
fn a_read_only_mount_publishes_as_it_is() {
    let Some(s) = Setup::new("romount") else { return };
    let (image, mnt) = s.mounted_image("ro.img");
    std::fs::write(mnt.join("kept"), contents(7)).unwrap();
    s.umount(&mnt);
    wait_for("the daemon letting the image go", Duration::from_secs(30), || FileDevice::open(&image, false).is_ok());
    let o = s.mount(image.to_str().unwrap(), &mnt, "ro");
    assert!(o.status.success(), "{}", stderr(&o));
    let bytes = std::fs::read(&image).unwrap();
    s.publish(&mnt, "ro", 1);
    assert_eq!(std::fs::read(mnt.join("kept")).unwrap(), contents(7), "the mount serves on");
    assert!(published_bytes(&s.remote("ro"), 1) == bytes, "the image as it is");
    assert!(std::fs::read(&image).unwrap() == bytes, "not written");
    s.umount(&mnt);
}

/// An image whose log holds records not yet written home: written through a mount whose
/// daemon is then killed, its writes made durable by an fsync first. Returns its contents.
fn crashed_image(s: &Setup, name: &str) -> PathBuf {
    let (image, mnt) = s.mounted_image(name);
    let file = std::fs::File::create(mnt.join("logged")).unwrap();
    std::io::Write::write_all(&mut &file, &contents(3)).unwrap();
    file.sync_all().unwrap();
    drop(file);
    // SAFETY: kill has no memory preconditions; the pid is the daemon serving our image.
    assert_eq!(unsafe { libc::kill(daemon_pid(&image), libc::SIGKILL) }, 0);
    wait_for("the killed daemon letting the image go", Duration::from_secs(30), || {
        FileDevice::open(&image, false).is_ok()
    });
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    let o = run(Command::new(BIN).args(["info", "--json"]).arg(&image));
    let info: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(info["log_records_pending"].as_u64().unwrap() > 0, "the log needs replay: {info}");
    image
}

#[test]
fn a_read_only_image_publishes_with_its_log_replayed_in_memory() {
    let Some(s) = Setup::new("roimage") else { return };
    let image = crashed_image(&s, "crashed.img");
    std::fs::set_permissions(&image, std::fs::Permissions::from_mode(0o444)).unwrap();
    let bytes = std::fs::read(&image).unwrap();
    s.publish(&image, "replayed", 1);
    assert!(std::fs::read(&image).unwrap() == bytes, "the source image is unchanged");
    let published = published_fs(&s.remote("replayed"), 1);
    assert_eq!(published.read_file("/logged").unwrap(), contents(3));
}

#[test]
fn a_generation_whose_log_needs_replay_is_refused_by_mount() {
    let Some(s) = Setup::new("unreplayed") else { return };
    let image = crashed_image(&s, "unreplayed.img");
    // Uploaded as it is, which `ferrofs publish` never does.
    let dev = FileDevice::open(&image, true).unwrap();
    ferrofs_remote::publish::publish(&s.remote("raw"), &dev, 1 << 20).unwrap();
    drop(dev);
    let reader = s.path("reader");
    let options = format!("ro,cache={},endpoint={}", s.path("cache").display(), s.endpoint());
    let o = s.mount(&s.url("raw"), &reader, &options);
    let message = stderr(&o);
    assert!(!o.status.success(), "{message}");
    // One line says why; the only other is the daemon's note of what it was about to serve.
    let (why, others): (Vec<&str>, Vec<&str>) = message.lines().partition(|l| l.contains("records to replay"));
    assert_eq!(why.len(), 1, "{message}");
    assert!(why[0].contains("it was not checkpointed"), "{message}");
    assert!(others.iter().all(|l| l.contains("serving generation 1")), "{message}");
    assert!(!is_mounted(&reader));
}
