//! The operations `bench scale` times, on either kind of file system: the engine's API in
//! this process, or system calls on a mounted one (`--targets`), so that kernel file systems
//! run the very same phases side by side with the engine. A directory is named by a number:
//! the engine's inode number, or a descriptor of the directory open in this process. The
//! system calls are the `*at` forms on that descriptor, one path component each, as the
//! engine's calls take a directory and a name.

use super::{CRED, DIR_MODE, FILE_MODE};
use crate::failure::{CliResult, Context, Failure};
use ferrofs::FileSystem;
use ferrofs::ROOT_INO;
use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

pub trait DirOps: Sync {
    /// Make directory `name` at the top of the file system.
    fn mkdir(&self, name: &str) -> CliResult<u64>;
    /// Remove the (empty) directory `dir`, made by `mkdir(name)`.
    fn rmdir(&self, name: &str, dir: u64) -> CliResult<()>;
    fn create(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()>;
    /// stat(2) of a name: lookup, then the attributes of what it found.
    fn stat(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()>;
    fn open_close(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()>;
    fn rename(&self, from: u64, name: &[u8], to: u64, new_name: &[u8]) -> ferrofs::Result<()>;
    fn unlink(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()>;
    /// Call `visit` with each name in `dir` ("." and ".." may come too) until it returns false.
    fn list(&self, dir: u64, visit: &mut dyn FnMut(&[u8]) -> bool) -> ferrofs::Result<()>;
    /// Make every change durable (ends each mutating phase, timed).
    fn sync(&self) -> ferrofs::Result<()>;
    /// Before a phase, untimed: the engine writes its log home (otherwise its threads would
    /// write the previous phase's changes home during this one); a mount syncs.
    fn settle(&self) -> CliResult<()>;
    /// The engine's counters so far (zero for a mount: not visible).
    fn counters(&self) -> EngineCounters;
    /// Whether this process's lock statistics are this file system's: the engine's are not a
    /// mount's (whose engine, if any, runs in its daemon), and an engine of this process may
    /// still take its locks (a checkpoint on its timer) while a mount's phase runs.
    fn shows_locks(&self) -> bool;
}

/// What the engine counts that a phase reports besides lock waits.
#[derive(Clone, Copy, Default)]
pub struct EngineCounters {
    pub alloc_retries: u64,
    /// Time transactions waited for the log (not for a lock): for a full CIL to empty, or
    /// for a stalled cache budget's dirty objects to be written home.
    pub throttle_wait_ns: u64,
}

impl std::ops::Add for EngineCounters {
    type Output = EngineCounters;
    fn add(self, other: EngineCounters) -> EngineCounters {
        EngineCounters {
            alloc_retries: self.alloc_retries + other.alloc_retries,
            throttle_wait_ns: self.throttle_wait_ns + other.throttle_wait_ns,
        }
    }
}

impl std::ops::Sub for EngineCounters {
    type Output = EngineCounters;
    fn sub(self, before: EngineCounters) -> EngineCounters {
        EngineCounters {
            alloc_retries: self.alloc_retries - before.alloc_retries,
            throttle_wait_ns: self.throttle_wait_ns - before.throttle_wait_ns,
        }
    }
}

impl DirOps for FileSystem {
    fn mkdir(&self, name: &str) -> CliResult<u64> {
        FileSystem::mkdir(self, ROOT_INO, name.as_bytes(), DIR_MODE, CRED)
            .map(|a| a.ino)
            .context(|| format!("mkdir {name}"))
    }

    fn rmdir(&self, name: &str, _dir: u64) -> CliResult<()> {
        FileSystem::rmdir(self, ROOT_INO, name.as_bytes()).context(|| format!("rmdir {name}"))
    }

    fn create(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()> {
        FileSystem::create(self, dir, name, FILE_MODE, CRED).map(drop)
    }

    fn stat(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()> {
        let ino = self.lookup(dir, name)?.ino;
        self.getattr(ino).map(drop)
    }

    fn open_close(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()> {
        let ino = self.lookup(dir, name)?.ino;
        self.open(ino)?;
        self.release(ino)
    }

    fn rename(&self, from: u64, name: &[u8], to: u64, new_name: &[u8]) -> ferrofs::Result<()> {
        FileSystem::rename(self, from, name, to, new_name, 0)
    }

    fn unlink(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()> {
        FileSystem::unlink(self, dir, name)
    }

    fn list(&self, dir: u64, visit: &mut dyn FnMut(&[u8]) -> bool) -> ferrofs::Result<()> {
        self.readdir(dir, 0, &mut |e| visit(e.name))
    }

    fn sync(&self) -> ferrofs::Result<()> {
        FileSystem::sync(self)
    }

    fn settle(&self) -> CliResult<()> {
        self.write_home().context(|| "write the log home".to_string())
    }

    fn counters(&self) -> EngineCounters {
        let stats = self.stats();
        EngineCounters {
            alloc_retries: stats.ags.iter().map(|ag| ag.alloc_retries).sum(),
            throttle_wait_ns: stats.journal.throttle_wait_ns + stats.cache.throttle_wait_ns,
        }
    }

    fn shows_locks(&self) -> bool {
        true
    }
}

/// A file system mounted at `root`, through system calls.
pub struct Syscalls {
    root: PathBuf,
    /// The root, open for syncfs(2).
    root_dir: File,
    /// The directories made by `mkdir`, by descriptor; closed by `rmdir`. Only `list` and
    /// the untimed `mkdir`/`rmdir` take the lock: the timed calls use the descriptor alone.
    dirs: Mutex<HashMap<u64, (PathBuf, File)>>,
}

impl Syscalls {
    pub fn open(root: &Path) -> CliResult<Syscalls> {
        Ok(Syscalls {
            root: root.to_path_buf(),
            root_dir: File::open(root).context(|| format!("open {}", root.display()))?,
            dirs: Mutex::new(HashMap::new()),
        })
    }

    fn path_of(&self, dir: u64) -> ferrofs::Result<PathBuf> {
        let dirs = self.dirs.lock().unwrap_or_else(|p| p.into_inner());
        dirs.get(&dir).map(|(p, _)| p.clone()).ok_or(ferrofs::Error::Invalid("not a directory made by the benchmark"))
    }
}

/// `name` as the C string the system calls take.
fn c_name(name: &[u8]) -> ferrofs::Result<CString> {
    CString::new(name).map_err(|_| ferrofs::Error::Invalid("a name with a NUL byte"))
}

/// A system call's result: the error of the calling thread if it returned -1.
fn checked(r: libc::c_int) -> ferrofs::Result<libc::c_int> {
    if r < 0 {
        Err(ferrofs::Error::Io(io::Error::last_os_error()))
    } else {
        Ok(r)
    }
}

/// syncfs(2): everything on the file system that holds `file` reaches its device.
pub fn syncfs(file: &File) -> io::Result<()> {
    // SAFETY: `file` owns an open descriptor for the whole call; syncfs takes no pointers.
    if unsafe { libc::syncfs(file.as_raw_fd()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// `f_type` of a FUSE mount in statfs(2).
const FUSE_SUPER_MAGIC: libc::c_long = 0x6573_5546;

/// Whether `file` is on a FUSE mount.
pub fn on_fuse(file: &File) -> io::Result<bool> {
    // SAFETY: an all-zero statfs is a valid value of the plain C struct that fstatfs fills.
    let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: `file` owns an open descriptor for the whole call, and `sf` outlives it.
    if unsafe { libc::fstatfs(file.as_raw_fd(), &mut sf) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(sf.f_type == FUSE_SUPER_MAGIC)
}

/// The descriptor that names `dir`: set by `mkdir`, open until `rmdir`.
fn fd(dir: u64) -> RawFd {
    dir as RawFd
}

/// Open `name` in `dir` with `flags` and close it again.
fn open_and_close(dir: u64, name: &[u8], flags: libc::c_int) -> ferrofs::Result<()> {
    let c = c_name(name)?;
    // SAFETY: `c` is a NUL-terminated string that outlives the call; the directory
    // descriptor stays open until `rmdir`, after the phases that use it.
    let file = checked(unsafe { libc::openat(fd(dir), c.as_ptr(), flags | libc::O_CLOEXEC, 0o644) })?;
    // SAFETY: `file` was just opened here and is closed once.
    checked(unsafe { libc::close(file) }).map(drop)
}

impl DirOps for Syscalls {
    fn mkdir(&self, name: &str) -> CliResult<u64> {
        let path = self.root.join(name);
        std::fs::create_dir(&path).context(|| format!("mkdir {}", path.display()))?;
        let dir = File::open(&path).context(|| format!("open {}", path.display()))?;
        let key = dir.as_raw_fd() as u64;
        self.dirs.lock().unwrap_or_else(|p| p.into_inner()).insert(key, (path, dir));
        Ok(key)
    }

    fn rmdir(&self, name: &str, dir: u64) -> CliResult<()> {
        let entry = self.dirs.lock().unwrap_or_else(|p| p.into_inner()).remove(&dir);
        let Some((path, _closed)) = entry else {
            return Err(Failure::new(format!("rmdir {name}"), "not a directory made here"));
        };
        std::fs::remove_dir(&path).context(|| format!("rmdir {}", path.display()))
    }

    fn create(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()> {
        open_and_close(dir, name, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY)
    }

    fn stat(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()> {
        let c = c_name(name)?;
        // SAFETY: an all-zero `stat` is a valid value of the plain C struct.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `c` and `st` outlive the call; the descriptor is open (see `open_and_close`).
        checked(unsafe { libc::fstatat(fd(dir), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) }).map(drop)
    }

    fn open_close(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()> {
        open_and_close(dir, name, libc::O_RDONLY)
    }

    fn rename(&self, from: u64, name: &[u8], to: u64, new_name: &[u8]) -> ferrofs::Result<()> {
        let (a, b) = (c_name(name)?, c_name(new_name)?);
        // SAFETY: both strings outlive the call; the descriptors are open (see `open_and_close`).
        checked(unsafe { libc::renameat(fd(from), a.as_ptr(), fd(to), b.as_ptr()) }).map(drop)
    }

    fn unlink(&self, dir: u64, name: &[u8]) -> ferrofs::Result<()> {
        let c = c_name(name)?;
        // SAFETY: `c` outlives the call; the descriptor is open (see `open_and_close`).
        checked(unsafe { libc::unlinkat(fd(dir), c.as_ptr(), 0) }).map(drop)
    }

    fn list(&self, dir: u64, visit: &mut dyn FnMut(&[u8]) -> bool) -> ferrofs::Result<()> {
        for entry in std::fs::read_dir(self.path_of(dir)?)? {
            if !visit(OsStr::as_bytes(&entry?.file_name())) {
                break;
            }
        }
        Ok(())
    }

    fn sync(&self) -> ferrofs::Result<()> {
        Ok(syncfs(&self.root_dir)?)
    }

    fn settle(&self) -> CliResult<()> {
        DirOps::sync(self).map_err(|e| Failure::new(format!("syncfs {}", self.root.display()), e))
    }

    fn counters(&self) -> EngineCounters {
        EngineCounters::default()
    }

    fn shows_locks(&self) -> bool {
        false
    }
}
