//! Keeping two processes off one image: what an image is, whichever name reaches it (its
//! identity), and the `flock`ed lock files named after it in the runtime directory.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// The directory of ferrofs's runtime files (image locks, control sockets): `/run/ferrofs`
/// for root (and for a user without `$XDG_RUNTIME_DIR`), else `$XDG_RUNTIME_DIR/ferrofs`.
pub fn runtime_dir() -> PathBuf {
    // SAFETY: geteuid has no preconditions.
    match (unsafe { libc::geteuid() }, std::env::var_os("XDG_RUNTIME_DIR")) {
        (0, _) | (_, None) => PathBuf::from("/run/ferrofs"),
        (_, Some(d)) => Path::new(&d).join("ferrofs"),
    }
}

/// What the image at `path` is, whichever name it is reached by: see [`identity`]. Only a
/// block device is opened (read-only, to ask a loop device for its backing file).
pub fn identity_of_path(path: impl AsRef<Path>) -> io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&path)?;
    match meta.file_type() {
        t if t.is_block_device() => identity(&File::open(path)?),
        t if t.is_file() => Ok(file_identity(meta.dev(), meta.ino(), 0)),
        _ => Err(io::Error::new(io::ErrorKind::InvalidInput, "neither a file nor a block device")),
    }
}

/// What an open image is, independent of the path that opened it: a regular file's
/// `(st_dev, st_ino)`; for a loop device, the same of its backing file (and the offset into
/// it, when not 0), as `LOOP_GET_STATUS64` reports them; for another block device, its device
/// number.
pub fn identity(file: &File) -> io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let meta = file.metadata()?;
    if !meta.file_type().is_block_device() {
        return Ok(file_identity(meta.dev(), meta.ino(), 0));
    }
    Ok(match loop_backing_file(file, meta.rdev())? {
        Some((dev, ino, offset)) => file_identity(dev, ino, offset),
        None => format!("bdev-{:x}", meta.rdev()),
    })
}

/// The identity of the bytes of file `(dev, ino)` from `offset` on.
fn file_identity(dev: u64, ino: u64, offset: u64) -> String {
    match offset {
        0 => format!("file-{dev:x}-{ino}"),
        _ => format!("file-{dev:x}-{ino}-at-{offset}"),
    }
}

/// `struct loop_info64` of `<linux/loop.h>`.
#[repr(C)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232, "the kernel's struct loop_info64");

const LOOP_MAJOR: u32 = 7;

const LOOP_GET_STATUS64: libc::c_ulong = 0x4C05;

/// The backing file of a bound loop device: its `(st_dev, st_ino)` and the offset into it.
fn loop_backing_file(file: &File, rdev: u64) -> io::Result<Option<(u64, u64, u64)>> {
    if libc::major(rdev) != LOOP_MAJOR {
        return Ok(None);
    }
    // SAFETY: LoopInfo64 is plain old data; all zeroes is a valid value.
    let mut info: LoopInfo64 = unsafe { std::mem::zeroed() };
    // SAFETY: `file` owns an open descriptor; LOOP_GET_STATUS64 writes one `loop_info64`,
    // which `info` is, and keeps no pointer to it.
    if unsafe { libc::ioctl(file.as_raw_fd(), LOOP_GET_STATUS64 as _, &mut info as *mut LoopInfo64) } != 0 {
        let err = io::Error::last_os_error();
        // ENXIO: a loop device bound to nothing is a device of its own.
        return if err.raw_os_error() == Some(libc::ENXIO) { Ok(None) } else { Err(err) };
    }
    Ok(Some((info.lo_device, info.lo_inode, info.lo_offset)))
}

/// Lock the opened image and then its identity's lock file (in [`runtime_dir`]), both
/// non-blocking and of the same kind. The identity lock is skipped where its file cannot be
/// made (a user without `$XDG_RUNTIME_DIR`, a read-only `/run`): the lock on the opened file
/// still keeps out every open by the same name.
pub(super) fn lock_image(file: &File, path: &Path, read_only: bool) -> io::Result<Option<IdentityLock>> {
    lock(file, path, read_only)?;
    let lock_path = runtime_dir().join(format!("image-{}.lock", identity(file)?));
    match IdentityLock::take(lock_path, path, read_only) {
        Err(e) if matches!(e.kind(), io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem) => Ok(None),
        r => r.map(Some),
    }
}

/// A `flock`ed lock file named after an image's identity. The last holder removes it, so they
/// do not pile up; a taker therefore checks, once it holds the lock, that the name still
/// leads to the file it locked (a holder may have removed it in between), and else starts over.
#[derive(Debug)]
pub(super) struct IdentityLock {
    file: File,
    path: PathBuf,
}

impl IdentityLock {
    /// How often a taker starts over because the lock file was removed under it.
    const RETRIES_MAX: usize = 8;

    fn take(path: PathBuf, image: &Path, read_only: bool) -> io::Result<IdentityLock> {
        use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
        let dir = path.parent().expect("a lock file has a directory");
        std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir)?;
        for _ in 0..Self::RETRIES_MAX {
            let file =
                OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(&path)?;
            lock(&file, image, read_only)?;
            let (held, named) = (file.metadata()?, std::fs::metadata(&path));
            if named.is_ok_and(|n| (n.dev(), n.ino()) == (held.dev(), held.ino())) {
                return Ok(IdentityLock { file, path });
            }
        }
        Err(io::Error::other(format!("lock file {} keeps being removed", path.display())))
    }
}

impl Drop for IdentityLock {
    fn drop(&mut self) {
        // Exclusive now means no one else holds it: remove the name while still holding it.
        // SAFETY: `file` owns an open descriptor for the whole call; flock takes no pointers.
        if unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Take a non-blocking `flock` (shared for read-only opens); the lock dies with the descriptor.
fn lock(file: &File, path: &Path, read_only: bool) -> io::Result<()> {
    let mode = if read_only { libc::LOCK_SH } else { libc::LOCK_EX };
    // Repeats only a call a signal interrupted: a non-blocking flock otherwise returns at once.
    loop {
        // SAFETY: `file` owns an open descriptor for the whole call; flock takes no pointers.
        if unsafe { libc::flock(file.as_raw_fd(), mode | libc::LOCK_NB) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.kind() {
            io::ErrorKind::Interrupted => continue,
            io::ErrorKind::WouldBlock => {
                let msg = format!("image {} is in use by another process", path.display());
                return Err(io::Error::new(io::ErrorKind::WouldBlock, msg));
            }
            _ => return Err(err),
        }
    }
}
