//! The device real mounts run on: an image file or a block-device node.

use std::fs::{File, OpenOptions};
use std::io;
use std::io::{Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::lock::{lock_image, IdentityLock};
use super::{check_range, eio, BlockDevice};

/// How often [`FileDevice::open_wait`] retries a lock held elsewhere.
const LOCK_RETRY: Duration = Duration::from_millis(20);

/// A device backed by an image file or a block-device node: what real mounts run on.
/// It holds advisory `flock`s for its whole lifetime (exclusive when writable, shared when
/// read-only) so two processes can never mount the same image and corrupt it: one on the file
/// it opened, and one on a lock file named after what the image *is* ([`identity`](super::identity)), so that
/// the same image reached through a loop device, or a loop device through its backing file, is
/// locked as well.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    /// The lock on the image's identity; `None` where no runtime directory can be made.
    _identity_lock: Option<IdentityLock>,
    path: PathBuf,
    size: u64,
    read_only: bool,
    /// A block-device node: punched by BLKDISCARD, not fallocate.
    block_device: bool,
}

/// `BLKDISCARD` of linux/fs.h (`_IO(0x12, 119)`), which the libc crate does not define.
const BLKDISCARD: libc::c_ulong = 0x1277;

impl FileDevice {
    /// Create (or truncate) a sparse image of `size` bytes at `path`, locked exclusively.
    pub fn create(path: impl AsRef<Path>, size: u64) -> io::Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path)?;
        // Lock before truncating, so an image in use elsewhere is never clobbered.
        let identity_lock = lock_image(&file, path, false)?;
        file.set_len(0)?;
        file.set_len(size)?;
        let block_device = file.metadata()?.file_type().is_block_device();
        Ok(Self { file, _identity_lock: identity_lock, path: path.to_path_buf(), size, read_only: false, block_device })
    }

    /// Open an existing image or block device; fails with `WouldBlock` if it is locked elsewhere.
    pub fn open(path: impl AsRef<Path>, read_only: bool) -> io::Result<Self> {
        Self::open_wait(path, read_only, Duration::ZERO)
    }

    /// Like [`FileDevice::open`], but retries a lock held elsewhere every 20 ms until `timeout`
    /// (a mount that follows right after an unmount may race the previous holder's close).
    pub fn open_wait(path: impl AsRef<Path>, read_only: bool, timeout: Duration) -> io::Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new().read(true).write(!read_only).open(path)?;
        let deadline = Instant::now().checked_add(timeout);
        // Bounded by `timeout`; one too long for a deadline (Duration::MAX) waits, as asked,
        // until the holder lets go.
        let identity_lock = loop {
            let err = match lock_image(&file, path, read_only) {
                Ok(identity_lock) => break identity_lock,
                Err(err) => err,
            };
            let left = deadline.map_or(LOCK_RETRY, |d| d.saturating_duration_since(Instant::now()));
            if err.kind() != io::ErrorKind::WouldBlock || left.is_zero() {
                return Err(err);
            }
            std::thread::sleep(left.min(LOCK_RETRY));
        };
        let size = device_size(&file)?;
        let block_device = file.metadata()?.file_type().is_block_device();
        Ok(Self { file, _identity_lock: identity_lock, path: path.to_path_buf(), size, read_only, block_device })
    }

    /// Open an image read-only without any lock, even one another process has mounted: for
    /// tools that only look (`ferrofs info`, like dumpe2fs), which then see what the writer
    /// has made durable so far, not its latest changes.
    pub fn open_unlocked(path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref();
        let file = File::open(path)?;
        let size = device_size(&file)?;
        let block_device = file.metadata()?.file_type().is_block_device();
        Ok(Self { file, _identity_lock: None, path: path.to_path_buf(), size, read_only: true, block_device })
    }

    /// The path this device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Lengthen an image file to `size` bytes, sparse (the new bytes read as zeros and take no
    /// space until written; the next flush makes the length durable). Never shortens. A block
    /// device keeps its size: one smaller than `size` fails.
    pub fn extend(&mut self, size: u64) -> io::Result<()> {
        if size <= self.size {
            return Ok(());
        }
        if self.block_device {
            let msg = format!("a block device of {} bytes cannot hold {size}", self.size);
            return Err(io::Error::new(io::ErrorKind::InvalidInput, msg));
        }
        self.check_writable()?;
        self.file.set_len(size)?;
        self.size = size;
        Ok(())
    }

    fn check_writable(&self) -> io::Result<()> {
        if self.read_only {
            let msg = format!("image {} is open read-only", self.path.display());
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, msg));
        }
        Ok(())
    }
}

/// Regular files report their length in metadata; block devices only by seeking to the end.
pub fn device_size(file: &File) -> io::Result<u64> {
    let meta = file.metadata()?;
    if meta.file_type().is_block_device() {
        // pread/pwrite ignore the file position, so moving it is harmless.
        let mut file = file;
        return file.seek(SeekFrom::End(0));
    }
    Ok(meta.len())
}

impl BlockDevice for FileDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        check_range(off, buf.len(), self.size)?;
        self.file.read_exact_at(buf, off)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        check_range(off, buf.len(), self.size)?;
        self.check_writable()?;
        self.file.write_all_at(buf, off)
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn preallocate(&self, off: u64, len: u64) -> io::Result<()> {
        check_range(off, len.try_into().map_err(|_| eio())?, self.size)?;
        let (off, len) = (off as libc::off_t, len as libc::off_t);
        // SAFETY: `file` owns an open descriptor for the whole call; fallocate takes no pointers.
        if unsafe { libc::fallocate(self.file.as_raw_fd(), 0, off, len) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // Block devices and file systems without fallocate: nothing to do.
            Some(libc::EOPNOTSUPP | libc::ENODEV) => Ok(()),
            _ => Err(err),
        }
    }

    fn punch(&self, off: u64, len: u64) -> io::Result<bool> {
        check_range(off, len.try_into().map_err(|_| eio())?, self.size)?;
        self.check_writable()?;
        let fd = self.file.as_raw_fd();
        let done = if self.block_device {
            let range = [off, len];
            // SAFETY: `fd` is open for the whole call; BLKDISCARD reads two u64s (start,
            // length) from the pointer, which points at `range`, alive until the call returns.
            unsafe { libc::ioctl(fd, BLKDISCARD as _, range.as_ptr()) }
        } else {
            let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
            // SAFETY: `fd` is open for the whole call; fallocate takes no pointers.
            unsafe { libc::fallocate(fd, mode, off as libc::off_t, len as libc::off_t) }
        };
        if done == 0 {
            return Ok(true);
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // A file system without hole punching, a device without discard.
            Some(libc::EOPNOTSUPP | libc::ENOTTY) => Ok(false),
            _ => Err(err),
        }
    }

    fn size(&self) -> u64 {
        self.size
    }
}
