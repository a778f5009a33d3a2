//! `ferrofs mount s3://...` against a real S3-compatible server (versitygw, started by
//! scripts/s3-server.sh) after `ferrofs publish`: every file read back with its hash, the
//! generation pinned across a publish of the next one, the chunk cache shared by two mounts,
//! the server stopped mid-read (EIO in bounded time, and the mount still unmounts), a server
//! gone silent (EIO within `fetch_timeout`), a cache directory on a file system that fills,
//! responses slowed by a proxy, and the errors a user meets. Skips where /dev/fuse, root, or the server
//! (no Go to build it) is missing. Runs in both permission modes (FERROFS_TEST_DEFAULT_PERMISSIONS=1: the kernel's).

use ferrofs_remote::store::chunk_hash;
use ferrofs_remote::{Remote, RemoteOptions};
use object_store::PutMode;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod common;

use common::{is_mounted, mount_daemon_with_env, run, stderr, unavailable, Mounts, BIN};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/s3-server.sh");

/// A versitygw serving a scratch directory; stopped and removed on drop.
struct Server {
    state: PathBuf,
    env: BTreeMap<String, String>,
    /// The server process, killed on drop even if its state directory has gone.
    pid: std::cell::Cell<i32>,
}

impl Server {
    /// The server, or why there is none (the test then skips).
    fn start(state: &Path) -> Result<Server, String> {
        let o = run(Command::new(SCRIPT).arg("start").arg(state));
        match o.status.code() {
            Some(0) => {}
            Some(2) => return Err(stderr(&o).trim().to_string()),
            _ => panic!("s3-server.sh start: {}", stderr(&o)),
        }
        let env = parse_env(&o);
        let pid = std::cell::Cell::new(pid_of(&env));
        Ok(Server { state: state.to_owned(), env, pid })
    }

    fn endpoint(&self) -> &str {
        &self.env["S3_ENDPOINT"]
    }

    fn url(&self, prefix: &str) -> String {
        format!("s3://{}/{prefix}", self.env["S3_BUCKET"])
    }

    /// Stop the server, keeping its objects; `restart` brings it back on the same port.
    fn kill(&self) {
        assert!(run(Command::new(SCRIPT).arg("kill").arg(&self.state)).status.success());
    }

    fn restart(&self) {
        let o = run(Command::new(SCRIPT).arg("start").arg(&self.state));
        assert!(o.status.success(), "{}", stderr(&o));
        self.pid.set(pid_of(&parse_env(&o)));
    }

    /// Stop (SIGSTOP) or resume (SIGCONT) the server: stopped, it accepts connections (the
    /// kernel does) and answers nothing, a server gone silent.
    fn set_silent(&self, silent: bool) {
        let signal = if silent { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: kill has no memory preconditions; the pid is our server's.
        assert_eq!(unsafe { libc::kill(self.pid.get(), signal) }, 0, "signal the server");
    }

    fn remote(&self, prefix: &str) -> Remote {
        self.set_env();
        Remote::open(&self.url(prefix), &RemoteOptions { endpoint: Some(self.endpoint().to_string()) }).unwrap()
    }

    /// The credentials, for this process's store clients and the commands it runs.
    fn set_env(&self) {
        for k in ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"] {
            std::env::set_var(k, &self.env[k]);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: as in `set_silent`; a stopped server must run to take the stop script's TERM.
        unsafe { libc::kill(self.pid.get(), libc::SIGCONT) };
        let _ = run(Command::new(SCRIPT).arg("stop").arg(&self.state));
        // SAFETY: kill has no memory preconditions; the pid is our server's (or gone: ESRCH).
        unsafe { libc::kill(self.pid.get(), libc::SIGKILL) };
    }
}

/// The `KEY=value` lines the script prints.
fn parse_env(o: &Output) -> BTreeMap<String, String> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

fn pid_of(env: &BTreeMap<String, String>) -> i32 {
    env["S3_PID"].parse().expect("S3_PID is a process id")
}

/// Scratch space: images, mount points, cache; unmounted and removed on drop.
struct Scratch {
    dir: PathBuf,
    mounts: Mounts,
}

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ferrofs-remote-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch { dir, mounts: Default::default() }
    }

    fn dir(&self, name: &str) -> PathBuf {
        let d = self.dir.join(name);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    /// `ferrofs mount --daemon SOURCE DIR -o OPTIONS` in this run's permission mode.
    fn mount(&self, source: &str, mnt: &Path, options: &str) -> Output {
        self.mount_with_env(source, mnt, options, &[])
    }

    /// [`Scratch::mount`], which must succeed.
    fn mount_ok(&self, source: &str, mnt: &Path, options: &str) {
        let o = self.mount(source, mnt, options);
        assert!(o.status.success(), "mount {source} on {}: {}", mnt.display(), stderr(&o));
    }

    /// [`Scratch::mount`] with these environment variables changed for the command.
    fn mount_with_env(&self, source: &str, mnt: &Path, options: &str, env: &[(&str, &str)]) -> Output {
        self.mounts.track(mnt, mount_daemon_with_env(source, mnt, options, env))
    }

    fn umount(&self, mnt: &Path) {
        self.mounts.umount(mnt);
    }

    /// An image of `files` files of 1-40 KiB (seeded by `seed`) in a few directories, written
    /// through a local mount and cleanly unmounted; their contents by path.
    fn image(&self, name: &str, files: usize, seed: u64) -> (PathBuf, BTreeMap<String, Vec<u8>>) {
        let image = self.dir.join(name);
        let o = run(Command::new(BIN).args(["mkfs", "--size", "64M"]).arg(&image));
        assert!(o.status.success(), "{}", stderr(&o));
        let mnt = self.dir(&format!("{name}.mnt"));
        self.mount_ok(image.to_str().unwrap(), &mnt, "rw");
        let mut contents = BTreeMap::new();
        let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..files {
            let path = format!("d{}/f{i}", i % 7);
            let len = 1024 + (next() % (39 * 1024)) as usize;
            let bytes: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            std::fs::create_dir_all(mnt.join(format!("d{}", i % 7))).unwrap();
            std::fs::write(mnt.join(&path), &bytes).unwrap();
            contents.insert(path, bytes);
        }
        self.umount(&mnt);
        wait_released(&image);
        (image, contents)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        self.mounts.release();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A small tmpfs mounted on a directory, lazily unmounted on drop (a daemon that has just
/// unmounted may still hold its files open for a moment).
struct SmallFs(PathBuf);

impl SmallFs {
    /// `None` (said on stderr) where no tmpfs can be mounted.
    fn mount(dir: &Path, size: &str) -> Option<SmallFs> {
        let o = run(Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(dir));
        if !o.status.success() {
            eprintln!("cannot mount a tmpfs on {}: {}", dir.display(), stderr(&o));
            return None;
        }
        Some(SmallFs(dir.to_owned()))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn wait_released(image: &Path) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while ferrofs::dev::FileDevice::open(image, false).is_err() {
        assert!(Instant::now() < deadline, "daemon kept the image locked");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ferrofs publish IMAGE URL`: the image becomes generation `generation` of `prefix`.
fn publish(server: &Server, prefix: &str, image: &Path, generation: u64) {
    let o = run(Command::new(BIN)
        .arg("publish")
        .arg(image)
        .arg(server.url(prefix))
        .args(["--endpoint", server.endpoint()]));
    assert!(o.status.success(), "publish: {}", stderr(&o));
    let said = String::from_utf8_lossy(&o.stdout);
    assert!(said.contains(&format!("generation {generation} ")), "{said}");
}

/// Reads the files (last first) until one fails, which must be with EIO: how long that took.
/// Some file's data is in a chunk no read has fetched yet.
fn first_read_fails_with_eio(mnt: &Path, files: &BTreeMap<String, Vec<u8>>) -> Duration {
    let start = Instant::now();
    let failed = files.keys().rev().find_map(|path| std::fs::read(mnt.join(path)).err());
    let err = failed.expect("no read failed with the server unreachable");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    start.elapsed()
}

/// [`Scratch::image`] of `files` files published as generation 1 of `img`; their contents.
fn publish_one(server: &Server, s: &Scratch, files: usize, seed: u64) -> BTreeMap<String, Vec<u8>> {
    let (image, files) = s.image("one.img", files, seed);
    publish(server, "img", &image, 1);
    files
}

fn check_files(mnt: &Path, files: &BTreeMap<String, Vec<u8>>) {
    for (path, bytes) in files {
        let read = std::fs::read(mnt.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(chunk_hash(&read) == chunk_hash(bytes), "{path} differs from what was published");
    }
}

/// The server and scratch space, or None when the test must skip (said on stderr).
fn setup(test: &str) -> Option<(Server, Scratch)> {
    if let Some(why) = unavailable() {
        eprintln!("SKIPPED {test}: {why}");
        return None;
    }
    let scratch = Scratch::new(test);
    match Server::start(&scratch.dir.join("s3")) {
        Ok(server) => {
            server.set_env();
            Some((server, scratch))
        }
        Err(why) => {
            eprintln!("SKIPPED {test}: {why}");
            None
        }
    }
}

fn remote_options(server: &Server, cache: &Path, extra: &str) -> String {
    format!("ro,cache={},endpoint={}{extra}", cache.display(), server.endpoint())
}

#[test]
fn published_image_reads_back_and_its_generation_stays_pinned() {
    let Some((server, s)) = setup("roundtrip") else { return };
    let (image1, files1) = s.image("one.img", 120, 1);
    let (image2, files2) = s.image("two.img", 80, 2);
    publish(&server, "img", &image1, 1);
    let cache = s.dir("cache");
    let mnt = s.dir("mnt");
    s.mount_ok(&server.url("img"), &mnt, &remote_options(&server, &cache, ""));
    check_files(&mnt, &files1);
    // Read-only: the kernel refuses changes.
    let err = std::fs::write(mnt.join("new"), b"x").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{err}");
    // The next generation is published: this mount keeps the one it pinned.
    publish(&server, "img", &image2, 2);
    check_files(&mnt, &files1);
    assert!(!mnt.join("d0/f100").exists() || files1.contains_key("d0/f100"));
    // A second mount sees generation 2, and `ferrofs mounts` shows both.
    let mnt2 = s.dir("mnt2");
    s.mount_ok(&server.url("img"), &mnt2, &remote_options(&server, &cache, ""));
    check_files(&mnt2, &files2);
    let o = run(Command::new(BIN).args(["mounts", "--json"]));
    let out = String::from_utf8_lossy(&o.stdout);
    let listed: Vec<serde_json::Value> =
        serde_json::from_str(&out[out.find('[').unwrap_or(0)..]).unwrap_or_else(|e| panic!("{e}: {out}"));
    let generation_of = |m: &Path| {
        let m = m.canonicalize().unwrap();
        listed.iter().find(|v| v["mountpoint"].as_str() == m.to_str()).map(|v| v["generation"].as_u64().unwrap())
    };
    assert_eq!(generation_of(&mnt), Some(1), "{out}");
    assert_eq!(generation_of(&mnt2), Some(2), "{out}");
    let first = listed.iter().find(|v| v["generation"] == 1).unwrap();
    assert!(first["bytes_fetched"].as_u64().unwrap() > 0, "{first}");
    assert!(first["bytes_read"].as_u64().unwrap() > 0, "{first}");
    // The chunk device's locks are named and measured, as the engine's are.
    let o = run(Command::new(BIN).args(["lockstat", "--json"]).arg(&mnt));
    assert!(o.status.success(), "lockstat: {}", stderr(&o));
    let classes: Vec<serde_json::Value> = serde_json::from_slice(&o.stdout).unwrap();
    let acquired = |name: &str| {
        let class = classes.iter().find(|c| c["name"] == name);
        class.map(|c| c["total"]["exclusive"]["acquisitions"].as_u64().unwrap())
    };
    assert!(acquired("remote-resident") > Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(acquired("remote-inflight") > Some(0), "{}", String::from_utf8_lossy(&o.stdout));
    // generation=1 pins the older one explicitly.
    s.umount(&mnt2);
    s.mount_ok(&server.url("img"), &mnt2, &remote_options(&server, &cache, ",generation=1"));
    check_files(&mnt2, &files1);
    s.umount(&mnt2);
    s.umount(&mnt);
}

#[test]
fn two_mounts_share_the_chunk_cache() {
    let Some((server, s)) = setup("shared-cache") else { return };
    let files = publish_one(&server, &s, 60, 3);
    let cache = s.dir("cache");
    let (a, b) = (s.dir("a"), s.dir("b"));
    s.mount_ok(&server.url("img"), &a, &remote_options(&server, &cache, ""));
    check_files(&a, &files);
    s.mount_ok(&server.url("img"), &b, &remote_options(&server, &cache, ""));
    // The server is gone: the second mount reads everything from the shared cache.
    server.kill();
    check_files(&b, &files);
    s.umount(&b);
    s.umount(&a);
}

#[test]
fn a_server_stopped_mid_read_gives_eio_in_bounded_time_and_the_mount_unmounts() {
    let Some((server, s)) = setup("fault") else { return };
    let files = publish_one(&server, &s, 200, 4);
    let mnt = s.dir("mnt");
    s.mount_ok(&server.url("img"), &mnt, &remote_options(&server, &s.dir("cache"), ""));
    server.kill();
    // Some file's data is in a chunk no read has fetched yet: it fails with EIO, in bounded
    // time (4 tries, each refused at once by the closed port, with 0.2 + 0.4 + 0.8 s between).
    let waited = first_read_fails_with_eio(&mnt, &files);
    assert!(waited < Duration::from_secs(60), "{waited:?}");
    // The server is back: the same reads succeed.
    server.restart();
    check_files(&mnt, &files);
    s.umount(&mnt);
    server.kill();
    assert!(!is_mounted(&mnt));
}

#[test]
fn a_silent_server_gives_eio_within_fetch_timeout_and_the_mount_unmounts() {
    let Some((server, s)) = setup("silent") else { return };
    let files = publish_one(&server, &s, 200, 7);
    let mnt = s.dir("mnt");
    s.mount_ok(&server.url("img"), &mnt, &remote_options(&server, &s.dir("cache"), ",fetch_tries=2,fetch_timeout=1"));
    server.set_silent(true);
    // 2 tries of 1 s with 0.2 s between: 2.2 s (the defaults, 4 tries of 10 s, would take 41 s).
    let waited = first_read_fails_with_eio(&mnt, &files);
    assert!(waited < Duration::from_secs(15), "{waited:?}");
    // The server is still silent: the mount unmounts all the same.
    s.umount(&mnt);
    assert!(!is_mounted(&mnt));
    server.set_silent(false);
}

#[test]
fn a_cache_on_a_full_file_system_reads_on_from_the_network() {
    let Some((server, s)) = setup("full-cache") else { return };
    let files = publish_one(&server, &s, 120, 8);
    let cache = s.dir("cache");
    // Room for one 1 MiB chunk file: the cache is full long before the image is read.
    let Some(_small) = SmallFs::mount(&cache, "1500k") else {
        return eprintln!("SKIPPED a_cache_on_a_full_file_system_reads_on_from_the_network: no tmpfs");
    };
    let log = s.dir.join("mount.log");
    let mnt = s.dir("mnt");
    s.mount_ok(&server.url("img"), &mnt, &remote_options(&server, &cache, &format!(",log={}", log.display())));
    check_files(&mnt, &files);
    s.umount(&mnt);
    let logged = std::fs::read_to_string(&log).unwrap();
    let full: Vec<&str> = logged.lines().filter(|l| l.contains("cannot take more chunks")).collect();
    assert_eq!(full.len(), 1, "one line says the cache is full: {logged}");
    assert!(full[0].contains("No space left on device"), "{logged}");
    let cached = std::fs::read_dir(cache.join("chunks")).unwrap().count();
    assert!(cached <= 1, "{cached} chunk files in a cache with room for one");
}

#[test]
fn errors_a_user_meets_are_one_clear_line() {
    let Some((server, s)) = setup("errors") else { return };
    let mnt = s.dir("mnt");
    let cache = s.dir("cache");
    let fails_with_env = |source: &str, options: &str, env: &[(&str, &str)], expected: &str| {
        let o = s.mount_with_env(source, &mnt, options, env);
        assert!(!o.status.success(), "{source} -o {options} mounted");
        let said = stderr(&o);
        assert!(said.contains(expected), "{source}: {said}");
        assert_eq!(said.trim_end().lines().count(), 1, "one line: {said}");
        assert!(!is_mounted(&mnt));
    };
    let fails_with = |source: &str, options: &str, expected: &str| fails_with_env(source, options, &[], expected);
    let url = server.url("nothing");
    fails_with(&url, &format!("cache={}", cache.display()), "read-only: add -o ro");
    fails_with(&url, &remote_options(&server, &cache, ""), "nothing is published");
    fails_with("s3://no-such-bucket/x", &remote_options(&server, &cache, ""), "no-such-bucket");
    let (image, _) = s.image("one.img", 5, 5);
    let remote = server.remote("img");
    publish(&server, "img", &image, 1);
    fails_with(&server.url("img"), &remote_options(&server, &cache, ",generation=9"), "missing");
    // A damaged manifest.
    let key = remote.manifest_key(1);
    let mut bytes = remote.get(&key).unwrap().to_vec();
    bytes[40] ^= 1;
    remote.put(&key, bytes.into(), PutMode::Overwrite).unwrap();
    fails_with(&server.url("img"), &remote_options(&server, &cache, ""), "checksum");
    let wrong = [("AWS_SECRET_ACCESS_KEY", "wrong")];
    fails_with_env(&server.url("img"), &remote_options(&server, &cache, ""), &wrong, "refused the credentials");
    server.kill();
    fails_with(&server.url("img"), &remote_options(&server, &cache, ""), "cannot reach");
}

#[test]
fn slow_responses_still_read_correctly() {
    let Some((server, s)) = setup("slow") else { return };
    let files = publish_one(&server, &s, 60, 6);
    let target = server.endpoint().trim_start_matches("http://").parse().unwrap();
    let proxy = ferrofs_remote::delay_proxy::DelayProxy::start(target, Duration::from_millis(150)).unwrap();
    let mnt = s.dir("mnt");
    let options = format!("ro,cache={},endpoint={}", s.dir("cache").display(), proxy.endpoint());
    s.mount_ok(&server.url("img"), &mnt, &options);
    check_files(&mnt, &files);
    s.umount(&mnt);
}
