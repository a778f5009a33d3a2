//! Differential test: the same seeded random sequences of system calls run on ext4 (a loop
//! device) and on ferrofs (FUSE), side by side. Every call's result — return value or
//! errno, and the data it returned — must match, and at the end of each sequence the two
//! trees must match in everything POSIX specifies.
//!
//! What is deliberately not compared (POSIX leaves it unspecified, or it cannot match):
//! - readdir order: POSIX specifies none; listings are compared as sorted sets.
//! - st_blocks: allocation granularity, preallocation and metadata blocks are the file
//!   system's own business.
//! - st_size of directories: unspecified (ext4 reports allocated bytes, ferrofs 0-ish).
//! - timestamps and inode numbers: the two file systems run at different instants and number
//!   their inodes differently; time semantics are checked in conformance.rs.
//! - the ext4 root's lost+found: each sequence runs in its own subdirectory on both sides.
//!
//! Directory link counts *are* compared: both follow the classic 2 + subdirectories rule.
//!
//! Needs root, /dev/fuse, losetup and mkfs.ext4; skips with a message otherwise. The ext4
//! image, loop device and both mounts are removed by Drop guards even when a check fails.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const NAME: &str = "differential";
/// Operations per seed; FERROFS_DIFF_OPS changes it.
const OPS: usize = 1500;
/// The suite's seeds; FERROFS_DIFF_SEED and FERROFS_DIFF_RUNS pick that many consecutive
/// seeds from that one instead, for longer hunts.
const SEEDS: [u64; 4] = [1, 2, 3, 0x0fe7_70f5];
const SLOTS: usize = 4;

/// Whether `tool` is found on PATH (or the sbin directories, which root's PATH may lack).
fn tool_missing(tool: &str) -> bool {
    let path = std::env::var("PATH").unwrap_or_default();
    let found =
        path.split(':').chain(["/sbin", "/usr/sbin"]).any(|d| !d.is_empty() && Path::new(d).join(tool).is_file());
    !found
}

fn run(cmd: &mut Command) -> io::Result<String> {
    let out = cmd.stderr(Stdio::piped()).output()?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(io::Error::other(format!("{:?}: {} {}", cmd, out.status, String::from_utf8_lossy(&out.stderr))))
    }
}

/// A kernel file system image on a loop device, mounted. Drop undoes each step that
/// was done.
struct LoopMount {
    dir: PathBuf,
    image: PathBuf,
    mnt: PathBuf,
    loopdev: Option<String>,
    mounted: bool,
}

impl LoopMount {
    fn ext4() -> io::Result<LoopMount> {
        LoopMount::new("ext4", &["mkfs.ext4", "-q", "-F"], 256 << 20)
    }

    /// `mkfs` is the command that formats the image (its path is appended).
    fn new(fstype: &str, mkfs: &[&str], bytes: u64) -> io::Result<LoopMount> {
        // tmpfs when there is one: the image then costs no disk I/O.
        let base = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
        // Tests run in parallel: each mount gets a directory of its own.
        static MOUNTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = MOUNTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = base.join(format!("ferrofs-diff-{fstype}-{}-{n}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("mnt"))?;
        let mut e = LoopMount { image: dir.join("fs.img"), mnt: dir.join("mnt"), dir, loopdev: None, mounted: false };
        fs::File::create(&e.image)?.set_len(bytes)?;
        run(Command::new(mkfs[0]).args(&mkfs[1..]).arg(&e.image))?;
        e.loopdev = Some(run(Command::new("losetup").args(["-f", "--show"]).arg(&e.image))?);
        run(Command::new("mount").args(["-t", fstype]).arg(e.loopdev.as_ref().unwrap()).arg(&e.mnt))?;
        e.mounted = true;
        Ok(e)
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if self.mounted && run(Command::new("umount").arg(&self.mnt)).is_err() {
            let _ = run(Command::new("umount").arg("-l").arg(&self.mnt));
        }
        if let Some(dev) = &self.loopdev {
            if let Err(e) = run(Command::new("losetup").arg("-d").arg(dev)) {
                eprintln!("{NAME}: could not detach {dev}: {e}");
            }
        }
        let _ = fs::remove_dir_all(&self.dir);
    }
}

/// One system call, generated once and applied to both file systems.
#[derive(Clone, Debug)]
enum Op {
    Open { slot: usize, path: String, flags: i32, mode: u32 },
    Close { slot: usize },
    Pwrite { slot: usize, off: u64, data: Vec<u8> },
    Pread { slot: usize, off: u64, len: usize },
    CopyFileRange { from: usize, off_in: u64, to: usize, off_out: u64, len: usize },
    Ftruncate { slot: usize, len: u64 },
    Fallocate { slot: usize, mode: i32, off: u64, len: u64 },
    Fstat { slot: usize },
    WriteFile { path: String, off: u64, data: Vec<u8> },
    Truncate { path: String, len: u64 },
    ReadFile { path: String },
    Mkdir { path: String, mode: u32 },
    Rmdir { path: String },
    Unlink { path: String },
    Rename { from: String, to: String, flags: u32 },
    Link { from: String, to: String },
    Symlink { target: String, path: String },
    Readlink { path: String },
    Chmod { path: String, mode: u32 },
    Setxattr { path: String, name: String, value: Vec<u8>, flags: i32 },
    Getxattr { path: String, name: String },
    Removexattr { path: String, name: String },
    Listxattr { path: String },
    Readdir { path: String },
    Lstat { path: String },
}

/// What a call returned: its value and any data it produced, or the errno.
type Outcome = Result<String, i32>;

/// The part of a stat that both sides must agree on (see the module comment).
fn stat_summary(m: &fs::Metadata) -> String {
    let ft = m.file_type();
    let kind = if ft.is_dir() {
        "dir"
    } else if ft.is_file() {
        "file"
    } else if ft.is_symlink() {
        "symlink"
    } else if ft.is_fifo() {
        "fifo"
    } else {
        "other"
    };
    let size = if ft.is_dir() { String::from("-") } else { m.len().to_string() };
    format!("{kind} mode={:o} nlink={} size={size} uid={} gid={}", m.mode() & 0o7777, m.nlink(), m.uid(), m.gid())
}

struct Side {
    root: PathBuf,
    fds: [Option<i32>; SLOTS],
}

fn errno_of<T>(r: io::Result<T>) -> Result<T, i32> {
    r.map_err(|e| e.raw_os_error().unwrap_or(-1))
}

impl Side {
    fn c(&self, rel: &str) -> CString {
        CString::new(self.root.join(rel).as_os_str().as_bytes()).unwrap()
    }

    fn fd(&self, slot: usize) -> Result<i32, i32> {
        self.fds[slot].ok_or(libc::EBADF)
    }

    fn close_all(&mut self) {
        for fd in self.fds.iter_mut().filter_map(Option::take) {
            unsafe { libc::close(fd) };
        }
    }

    fn apply(&mut self, op: &Op) -> Outcome {
        let rc = |r: libc::c_int| errno_of(check(r)).map(|v| v.to_string());
        match op {
            Op::Open { slot, path, flags, mode } => {
                if let Some(fd) = self.fds[*slot].take() {
                    unsafe { libc::close(fd) };
                }
                let fd =
                    errno_of(check(unsafe { libc::open(self.c(path).as_ptr(), *flags | libc::O_CLOEXEC, *mode) }))?;
                self.fds[*slot] = Some(fd);
                Ok("opened".into())
            }
            Op::Close { slot } => {
                let fd = self.fd(*slot)?;
                self.fds[*slot] = None;
                rc(unsafe { libc::close(fd) })
            }
            Op::Pwrite { slot, off, data } => {
                let fd = self.fd(*slot)?;
                errno_of(check_size(unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), *off as i64) }))
                    .map(|n| n.to_string())
            }
            Op::Pread { slot, off, len } => {
                let fd = self.fd(*slot)?;
                let mut buf = vec![0u8; *len];
                let n = errno_of(check_size(unsafe { libc::pread(fd, buf.as_mut_ptr().cast(), *len, *off as i64) }))?;
                Ok(format!("{n} bytes {:?}", digest(&buf[..n])))
            }
            Op::CopyFileRange { from, off_in, to, off_out, len } => {
                let (mut off_in, mut off_out) = (*off_in as i64, *off_out as i64);
                let n = unsafe {
                    libc::copy_file_range(self.fd(*from)?, &mut off_in, self.fd(*to)?, &mut off_out, *len, 0)
                };
                errno_of(check_size(n)).map(|n| n.to_string())
            }
            Op::Ftruncate { slot, len } => rc(unsafe { libc::ftruncate(self.fd(*slot)?, *len as i64) }),
            Op::Fallocate { slot, mode, off, len } => {
                rc(unsafe { libc::fallocate(self.fd(*slot)?, *mode, *off as i64, *len as i64) })
            }
            Op::Fstat { slot } => {
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                check(unsafe { libc::fstat(self.fd(*slot)?, &mut st) }).map_err(|e| e.raw_os_error().unwrap())?;
                let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
                Ok(format!("mode={:o} nlink={} size={}", st.st_mode, st.st_nlink, if is_dir { -1 } else { st.st_size }))
            }
            Op::WriteFile { path, off, data } => {
                let fd = errno_of(check(unsafe {
                    libc::open(self.c(path).as_ptr(), libc::O_WRONLY | libc::O_CREAT | libc::O_CLOEXEC, 0o644)
                }))?;
                let r =
                    errno_of(check_size(unsafe { libc::pwrite(fd, data.as_ptr().cast(), data.len(), *off as i64) }));
                unsafe { libc::close(fd) };
                r.map(|n| n.to_string())
            }
            Op::Truncate { path, len } => rc(unsafe { libc::truncate(self.c(path).as_ptr(), *len as i64) }),
            Op::ReadFile { path } => {
                errno_of(fs::read(self.root.join(path))).map(|d| format!("{} bytes {:?}", d.len(), digest(&d)))
            }
            Op::Mkdir { path, mode } => rc(unsafe { libc::mkdir(self.c(path).as_ptr(), *mode) }),
            Op::Rmdir { path } => rc(unsafe { libc::rmdir(self.c(path).as_ptr()) }),
            Op::Unlink { path } => rc(unsafe { libc::unlink(self.c(path).as_ptr()) }),
            Op::Rename { from, to, flags } => {
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_renameat2,
                        libc::AT_FDCWD,
                        self.c(from).as_ptr(),
                        libc::AT_FDCWD,
                        self.c(to).as_ptr(),
                        *flags,
                    )
                };
                rc(r as i32)
            }
            Op::Link { from, to } => rc(unsafe { libc::link(self.c(from).as_ptr(), self.c(to).as_ptr()) }),
            Op::Symlink { target, path } => {
                let t = CString::new(target.as_str()).unwrap();
                rc(unsafe { libc::symlink(t.as_ptr(), self.c(path).as_ptr()) })
            }
            Op::Readlink { path } => errno_of(fs::read_link(self.root.join(path))).map(|t| t.display().to_string()),
            Op::Chmod { path, mode } => rc(unsafe { libc::chmod(self.c(path).as_ptr(), *mode) }),
            Op::Setxattr { path, name, value, flags } => {
                let n = CString::new(name.as_str()).unwrap();
                rc(unsafe {
                    libc::lsetxattr(self.c(path).as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), *flags)
                })
            }
            Op::Getxattr { path, name } => {
                let n = CString::new(name.as_str()).unwrap();
                let mut buf = vec![0u8; 1024];
                let len = errno_of(check_size(unsafe {
                    libc::lgetxattr(self.c(path).as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len())
                }))?;
                Ok(format!("{:?}", &buf[..len]))
            }
            Op::Removexattr { path, name } => {
                let n = CString::new(name.as_str()).unwrap();
                rc(unsafe { libc::lremovexattr(self.c(path).as_ptr(), n.as_ptr()) })
            }
            Op::Listxattr { path } => errno_of(list_xattrs(&self.root.join(path))).map(|v| format!("{v:?}")),
            Op::Readdir { path } => {
                let mut names: Vec<String> = errno_of(fs::read_dir(self.root.join(path)))?
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect();
                // Order is unspecified by POSIX: compare the set.
                names.sort();
                Ok(names.join(","))
            }
            Op::Lstat { path } => errno_of(fs::symlink_metadata(self.root.join(path))).map(|m| stat_summary(&m)),
        }
    }
}

/// Sorted names and values of a node's xattrs (not following symlinks).
fn list_xattrs(p: &Path) -> io::Result<Vec<(String, Vec<u8>)>> {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut buf = vec![0u8; 4096];
    let len = check_size(unsafe { libc::llistxattr(c.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
    let mut out = Vec::new();
    for name in buf[..len].split(|&b| b == 0).filter(|s| !s.is_empty()) {
        let n = CString::new(name).unwrap();
        let mut v = vec![0u8; 1024];
        let vl = check_size(unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), v.as_mut_ptr().cast(), v.len()) })?;
        v.truncate(vl);
        out.push((String::from_utf8_lossy(name).into_owned(), v));
    }
    out.sort();
    Ok(out)
}

/// A short fingerprint of data (FNV-1a), so mismatches print compactly.
fn digest(d: &[u8]) -> u64 {
    d.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
}

/// Everything POSIX specifies about the tree below `root`, keyed by relative path.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let p = root.join(&rel);
        let m = fs::symlink_metadata(&p).unwrap();
        let mut desc = stat_summary(&m);
        if m.is_file() {
            let d = fs::read(&p).unwrap();
            desc += &format!(" content={:016x}", digest(&d));
        } else if m.file_type().is_symlink() {
            desc += &format!(" target={}", fs::read_link(&p).unwrap().display());
        } else if m.is_dir() {
            let mut names: Vec<_> = fs::read_dir(&p).unwrap().map(|e| e.unwrap().file_name()).collect();
            names.sort();
            for n in names {
                stack.push(rel.join(n));
            }
        }
        desc += &format!(" xattrs={:?}", list_xattrs(&p).unwrap());
        out.insert(rel.display().to_string(), desc);
    }
    out
}

struct Gen {
    rng: StdRng,
    /// Paths that some earlier operation created (they may be gone again): reusing them
    /// makes most operations act on something real instead of failing with ENOENT.
    known: Vec<String>,
    /// Which descriptor slots are open (on ext4; ferrofs must agree), so descriptor
    /// operations mostly use a real one.
    open: [bool; SLOTS],
}

const NAMES: [&str; 5] = ["a", "b", "c", "dd", "e"];
const MODES: [u32; 8] = [0o644, 0o755, 0o600, 0o2775, 0o1777, 0o4755, 0o000, 0o444];
const XNAMES: [&str; 3] = ["user.a", "user.bb", "user.third-attribute"];
const FALLOC_MODES: [i32; 5] = [
    0,
    libc::FALLOC_FL_KEEP_SIZE,
    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
    libc::FALLOC_FL_ZERO_RANGE,
    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
];

impl Gen {
    /// A path of up to three components from a small pool, so that names collide often
    /// (files become directories' rivals, renames land on existing names).
    fn path(&mut self) -> String {
        if !self.known.is_empty() && self.rng.gen_bool(0.6) {
            return self.known[self.rng.gen_range(0..self.known.len())].clone();
        }
        let depth = [1, 1, 1, 2, 2, 3][self.rng.gen_range(0..6)];
        (0..depth).map(|_| NAMES[self.rng.gen_range(0..NAMES.len())]).collect::<Vec<_>>().join("/")
    }

    fn data(&mut self) -> Vec<u8> {
        let len = if self.rng.gen_bool(0.2) { self.rng.gen_range(4096..40_000) } else { self.rng.gen_range(1..600) };
        let fill = self.rng.gen::<u8>();
        (0..len).map(|i| fill.wrapping_add((i % 253) as u8)).collect()
    }

    fn offset(&mut self) -> u64 {
        match self.rng.gen_range(0..4) {
            0 => 0,
            1 => self.rng.gen_range(0..5000),
            2 => self.rng.gen_range(0..70_000),
            _ => self.rng.gen_range(0..2 << 20),
        }
    }

    fn op(&mut self) -> Op {
        let open: Vec<usize> = (0..SLOTS).filter(|&s| self.open[s]).collect();
        let slot = if !open.is_empty() && self.rng.gen_bool(0.9) {
            open[self.rng.gen_range(0..open.len())]
        } else {
            self.rng.gen_range(0..SLOTS)
        };
        let r = &mut self.rng;
        match r.gen_range(0..104) {
            0..=9 => {
                let acc = [libc::O_RDONLY, libc::O_WRONLY, libc::O_RDWR][r.gen_range(0..3)];
                let mut flags = acc;
                for (f, p) in [
                    (libc::O_CREAT, 0.8),
                    (libc::O_EXCL, 0.1),
                    (libc::O_TRUNC, 0.1),
                    (libc::O_APPEND, 0.2),
                    (libc::O_DIRECTORY, 0.03),
                    (libc::O_NOFOLLOW, 0.03),
                ] {
                    if r.gen_bool(p) {
                        flags |= f;
                    }
                }
                let mode = MODES[r.gen_range(0..MODES.len())];
                Op::Open { slot, path: self.path(), flags, mode }
            }
            10..=13 => Op::Close { slot },
            14..=25 => Op::Pwrite { slot, off: self.offset(), data: self.data() },
            26..=29 => Op::Pread { slot, off: self.offset(), len: self.rng.gen_range(1..50_000) },
            30..=32 => {
                // Between two open descriptors, sometimes one (overlapping ranges: EINVAL);
                // from near the start, where most files have data.
                let to = if self.rng.gen_bool(0.2) || open.is_empty() {
                    slot
                } else {
                    open[self.rng.gen_range(0..open.len())]
                };
                let off_in = self.rng.gen_range(0..20_000);
                Op::CopyFileRange {
                    from: slot,
                    off_in,
                    to,
                    off_out: self.offset(),
                    len: self.rng.gen_range(1..100_000),
                }
            }
            33..=34 => Op::Ftruncate { slot, len: self.offset() },
            35..=36 => Op::Fstat { slot },
            37..=44 => Op::WriteFile { path: self.path(), off: self.offset(), data: self.data() },
            45..=47 => Op::Truncate { path: self.path(), len: self.offset() },
            48..=50 => Op::ReadFile { path: self.path() },
            51..=55 => Op::Mkdir { path: self.path(), mode: [0o755, 0o700, 0o2775, 0o1777][self.rng.gen_range(0..4)] },
            56..=61 => Op::Rmdir { path: self.path() },
            62..=65 => Op::Unlink { path: self.path() },
            66..=73 => {
                let flags = [0, 0, 0, libc::RENAME_NOREPLACE, libc::RENAME_EXCHANGE][self.rng.gen_range(0..5)];
                Op::Rename { from: self.path(), to: self.path(), flags }
            }
            74..=76 => Op::Link { from: self.path(), to: self.path() },
            77..=79 => {
                // Relative targets only: the two trees live under different absolute paths.
                let target = match self.rng.gen_range(0..3) {
                    0 => self.path(),
                    1 => format!("../{}", self.path()),
                    _ => "t".repeat(self.rng.gen_range(1..300)),
                };
                Op::Symlink { target, path: self.path() }
            }
            80..=81 => Op::Readlink { path: self.path() },
            82..=84 => Op::Chmod { path: self.path(), mode: MODES[self.rng.gen_range(0..MODES.len())] },
            85..=88 => {
                let value = (0..self.rng.gen_range(0..80)).map(|_| self.rng.gen()).collect();
                let flags = [0, 0, libc::XATTR_CREATE, libc::XATTR_REPLACE][self.rng.gen_range(0..4)];
                Op::Setxattr { path: self.path(), name: XNAMES[self.rng.gen_range(0..3)].into(), value, flags }
            }
            89..=90 => Op::Getxattr { path: self.path(), name: XNAMES[self.rng.gen_range(0..3)].into() },
            91 => Op::Removexattr { path: self.path(), name: XNAMES[self.rng.gen_range(0..3)].into() },
            92 => Op::Listxattr { path: self.path() },
            93..=95 => Op::Readdir { path: if self.rng.gen_bool(0.3) { String::new() } else { self.path() } },
            96..=99 => Op::Lstat { path: self.path() },
            _ => {
                // The modes FUSE passes on (the kernel refuses COLLAPSE_RANGE and INSERT_RANGE
                // on a FUSE file itself).
                let mode = FALLOC_MODES[self.rng.gen_range(0..FALLOC_MODES.len())];
                Op::Fallocate { slot, mode, off: self.offset(), len: self.rng.gen_range(1..70_000) }
            }
        }
    }
}

#[test]
fn ext4_and_ferrofs_agree() {
    if !is_root() {
        return skip(NAME, "needs root (loop devices and mount)");
    }
    if let Some(why) = fuse_unavailable() {
        return skip(NAME, &why);
    }
    for tool in ["losetup", "mkfs.ext4", "mount", "umount"] {
        if tool_missing(tool) {
            return skip(NAME, &format!("{tool} is not installed"));
        }
    }
    let ext4 = match LoopMount::ext4() {
        Ok(e) => e,
        Err(e) => return skip(NAME, &format!("cannot set up the ext4 loop mount: {e}")),
    };
    let Some(mut fx) = Fixture::new(NAME, |_| {}) else { return };
    let env = |k: &str| std::env::var(k).ok().and_then(|s| s.parse::<u64>().ok());
    let ops = env("FERROFS_DIFF_OPS").map_or(OPS, |n| n as usize);
    let seeds: Vec<u64> = match env("FERROFS_DIFF_SEED") {
        Some(first) => (first..first + env("FERROFS_DIFF_RUNS").unwrap_or(4)).collect(),
        None => SEEDS.to_vec(),
    };
    let started = Instant::now();
    let mut total = 0;
    for &seed in &seeds {
        let sub = format!("seed-{seed}");
        let mut sides = [
            Side { root: ext4.mnt.join(&sub), fds: [None; SLOTS] },
            Side { root: fx.mnt.join(&sub), fds: [None; SLOTS] },
        ];
        for s in &sides {
            fs::create_dir(&s.root).unwrap();
        }
        let mut g = Gen { rng: StdRng::seed_from_u64(seed), known: Vec::new(), open: [false; SLOTS] };
        let mut log: Vec<String> = Vec::new();
        let mut succeeded = 0;
        for step in 0..ops {
            let op = g.op();
            let want = sides[0].apply(&op);
            let got = sides[1].apply(&op);
            succeeded += want.is_ok() as usize;
            match &op {
                Op::Open { slot, .. } => g.open[*slot] = want.is_ok(),
                Op::Close { slot } => g.open[*slot] = false,
                _ => {}
            }
            if want.is_ok() {
                match &op {
                    Op::Open { path, .. }
                    | Op::WriteFile { path, .. }
                    | Op::Mkdir { path, .. }
                    | Op::Symlink { path, .. } => g.known.push(path.clone()),
                    Op::Rename { to, .. } | Op::Link { to, .. } => g.known.push(to.clone()),
                    _ => {}
                }
            }
            log.push(format!("{step}: {op:?} -> {want:?}"));
            let recent = || {
                log[log.len().saturating_sub(15)..]
                    .iter()
                    .map(|l| l.chars().take(300).collect::<String>())
                    .collect::<Vec<_>>()
                    .join("\n")
            };
            assert_eq!(
                got,
                want,
                "seed {seed} step {step}: {op:?}\next4 returned {want:?}, ferrofs {got:?}\nlast operations:\n{}",
                recent()
            );
            // After every change, the names it touched look the same on both sides.
            if let Op::Rename { from: a, to: b, .. } | Op::Link { from: a, to: b } = &op {
                for p in [a, b] {
                    let l = Op::Lstat { path: p.clone() };
                    assert_eq!(
                        sides[1].apply(&l),
                        sides[0].apply(&l),
                        "seed {seed} step {step}: {op:?}: lstat {p}\n{}",
                        recent()
                    );
                }
            }
        }
        for s in &mut sides {
            s.close_all();
        }
        let (a, b) = (snapshot(&sides[0].root), snapshot(&sides[1].root));
        for (path, desc) in &a {
            assert_eq!(b.get(path), Some(desc), "seed {seed}: {path} differs at the end (ext4: {desc})");
        }
        assert_eq!(
            a.len(),
            b.len(),
            "seed {seed}: ferrofs has extra entries: {:?}",
            b.keys().filter(|k| !a.contains_key(*k)).collect::<Vec<_>>()
        );
        eprintln!(
            "{NAME}: seed {seed}: {ops} operations ({succeeded} succeeded), {} names at the end, trees identical",
            a.len()
        );
        // A sequence in which almost everything fails would compare only error paths. (Many
        // failures are intended: names collide on purpose, so EEXIST, ENOTDIR, EISDIR,
        // ENOTEMPTY and EBADF cases come up all the time; about 30% succeed.)
        assert!(succeeded * 5 > ops, "seed {seed}: only {succeeded} of {ops} operations succeeded");
        total += ops;
    }
    // Across a remount ferrofs still holds the same trees, and the image checks clean.
    fx.unmount();
    assert_fsck_clean(&fx.image);
    fx.mount().unwrap();
    for &seed in &seeds {
        let sub = format!("seed-{seed}");
        assert_eq!(snapshot(&fx.mnt.join(&sub)), snapshot(&ext4.mnt.join(&sub)), "seed {seed}: differs after remount");
    }
    eprintln!("{NAME}: {total} operations compared in {:?}", started.elapsed());
}

fn value_pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) -> Outcome {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    errno_of(check(unsafe { libc::lsetxattr(c.as_ptr(), n.as_ptr(), value.as_ptr().cast(), value.len(), 0) }))
        .map(|v| v.to_string())
}

/// getxattr with a buffer of XATTR_SIZE_MAX: the value's length and a digest of its bytes.
fn get_xattr(p: &Path, name: &str) -> Outcome {
    let (c, n) = (cpath(p), CString::new(name).unwrap());
    let mut buf = vec![0u8; 65536];
    let len =
        errno_of(check_size(unsafe { libc::lgetxattr(c.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) }))?;
    let sum = buf[..len]
        .iter()
        .enumerate()
        .fold(0u64, |h, (i, &b)| h.wrapping_mul(1_000_003).wrapping_add(b as u64 ^ i as u64));
    Ok(format!("{len} bytes, digest {sum:x}"))
}

/// What a listxattr returned: its length and the sorted names, or the errno.
type Listing = Result<(usize, Vec<String>), i32>;

/// listxattr with a buffer of `size` bytes (0: the size query).
fn list_xattr_names(p: &Path, size: usize) -> Listing {
    let c = cpath(p);
    let mut buf = vec![0u8; size.max(1)];
    let len = errno_of(check_size(unsafe {
        libc::llistxattr(c.as_ptr(), if size == 0 { std::ptr::null_mut() } else { buf.as_mut_ptr().cast() }, size)
    }))?;
    let mut names: Vec<String> = if size == 0 {
        Vec::new()
    } else {
        buf[..len]
            .split(|&b| b == 0)
            .filter(|s| !s.is_empty())
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .collect()
    };
    names.sort();
    Ok((len, names))
}

/// A 64 KiB (XATTR_SIZE_MAX) value: set, read, replaced, removed; one byte more is E2BIG.
fn large_value_calls(dir: &Path) -> Vec<Outcome> {
    let f = dir.join("large");
    fs::write(&f, b"").unwrap();
    vec![
        set_xattr(&f, "user.big", &value_pattern(65536, 1)),
        get_xattr(&f, "user.big"),
        set_xattr(&f, "user.over", &value_pattern(65537, 2)),
        set_xattr(&f, "user.big", &value_pattern(30000, 3)),
        get_xattr(&f, "user.big"),
        set_xattr(&f, "user.two", &value_pattern(65536, 4)),
        errno_of(list_xattrs_sizes(&f)),
        errno_of(check(unsafe { libc::lremovexattr(cpath(&f).as_ptr(), c"user.big".as_ptr()) })).map(|v| v.to_string()),
        get_xattr(&f, "user.big"),
        get_xattr(&f, "user.two"),
    ]
}

fn list_xattrs_sizes(p: &Path) -> io::Result<String> {
    list_xattr_names(p, 65536).map(|(len, names)| format!("{len}: {names:?}")).map_err(io::Error::from_raw_os_error)
}

/// `count` attributes named by `format` on one file: how many were stored, then what
/// listxattr returns with a 64 KiB and a 256 KiB buffer.
fn many_names_calls(dir: &Path, file: &str, count: usize, name: impl Fn(usize) -> String) -> (usize, Vec<Listing>) {
    let f = dir.join(file);
    fs::write(&f, b"").unwrap();
    let stored = (0..count).take_while(|&i| set_xattr(&f, &name(i), b"v").is_ok()).count();
    (stored, vec![list_xattr_names(&f, 65536), list_xattr_names(&f, 256 << 10)])
}

/// Large values and many names, against the kernel file systems that store them: 64 KiB
/// values as ext4 with `ea_inode` and XFS do; 5,000 names as XFS does (ext4 keeps all names
/// in the inode and one block: it stores 33 to 129 of these, ENOSPC after). A list longer than the
/// kernel's XATTR_LIST_MAX (64 KiB) is E2BIG on every file system; the size query is the
/// one difference: XFS reports the whole length, the kernel's FUSE client caps what a
/// daemon reports at 64 KiB.
#[test]
fn xattr_limits_agree_with_ext4_and_xfs() {
    const TEST: &str = "differential-xattr";
    if !is_root() {
        return skip(TEST, "needs root (loop devices and mount)");
    }
    if let Some(why) = fuse_unavailable() {
        return skip(TEST, &why);
    }
    for tool in ["losetup", "mkfs.ext4", "mkfs.xfs", "mount", "umount"] {
        if tool_missing(tool) {
            return skip(TEST, &format!("{tool} is not installed"));
        }
    }
    let (ext4, xfs) = match (
        LoopMount::new("ext4", &["mkfs.ext4", "-q", "-F", "-O", "ea_inode"], 256 << 20),
        LoopMount::new("xfs", &["mkfs.xfs", "-q", "-f"], 512 << 20),
    ) {
        (Ok(e), Ok(x)) => (e, x),
        (Err(e), _) | (_, Err(e)) => return skip(TEST, &format!("cannot set up the kernel loop mounts: {e}")),
    };
    let Some(fx) = Fixture::new(TEST, |_| {}) else { return };
    let ours = large_value_calls(&fx.mnt);
    assert_eq!(ours[0], Ok("0".into()), "a 64 KiB value is stored");
    assert_eq!(ours[2], Err(libc::E2BIG));
    assert_eq!(ours, large_value_calls(&ext4.mnt), "ext4 (ea_inode) and ferrofs differ on large values");
    assert_eq!(ours, large_value_calls(&xfs.mnt), "XFS and ferrofs differ on large values");

    let long = |i: usize| format!("user.attr_{i:04}");
    let (stored, lists) = many_names_calls(&fx.mnt, "many", 5000, long);
    assert_eq!(stored, 5000);
    assert_eq!(lists, [Err(libc::E2BIG), Err(libc::E2BIG)], "75,000 bytes of names are more than XATTR_LIST_MAX");
    assert_eq!(
        (stored, lists),
        many_names_calls(&xfs.mnt, "many", 5000, long),
        "XFS and ferrofs differ on 5,000 names"
    );
    assert!(many_names_calls(&ext4.mnt, "many", 5000, long).0 < 5000, "ext4 stores fewer (one block of names)");
    assert_eq!(list_xattr_names(&xfs.mnt.join("many"), 0).map(|r| r.0), Ok(75_000));
    assert_eq!(
        list_xattr_names(&fx.mnt.join("many"), 0).map(|r| r.0),
        Ok(65_536),
        "the FUSE client caps the size query"
    );

    let short = |i: usize| format!("user.a{i:04}");
    let (stored, lists) = many_names_calls(&fx.mnt, "short", 5000, short);
    assert_eq!(stored, 5000);
    assert_eq!(
        lists[0].as_ref().map(|(len, names)| (*len, names.len())),
        Ok((55_000, 5000)),
        "55,000 bytes of names are listed whole"
    );
    assert_eq!(
        (stored, lists),
        many_names_calls(&xfs.mnt, "short", 5000, short),
        "XFS and ferrofs differ on 5,000 short names"
    );
    eprintln!("{TEST}: 64 KiB values agree with ext4 (ea_inode) and XFS; 5,000 names with XFS");
}
