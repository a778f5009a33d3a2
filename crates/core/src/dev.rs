//! Block devices. The engine sees storage only through [`BlockDevice`]: byte-addressed reads
//! and writes plus a flush barrier. Media assumptions (docs/DESIGN.md): a write that returned
//! is durable only after a later `flush` returned; writes between two flushes may reach the
//! media in any order, and a write may tear at 512-byte sector boundaries.

use std::collections::{BTreeSet, HashSet};
use std::fs::{File, OpenOptions};
use std::io;
use std::io::{Seek, SeekFrom};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub trait BlockDevice: Send + Sync {
    /// Read exactly `buf.len()` bytes at byte offset `off`.
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// Write all of `buf` at byte offset `off`. Not durable until `flush`.
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// Make every write that returned before this call durable.
    fn flush(&self) -> io::Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Give `off..off + len` backing storage now, so later writes there need not allocate
    /// (a sparse image's log would otherwise allocate on every record's first pass). A hint:
    /// devices with nothing to allocate do nothing.
    fn preallocate(&self, _off: u64, _len: u64) -> io::Result<()> {
        Ok(())
    }
}

/// The unit a write may tear at (see the module docs).
pub const SECTOR_SIZE: u64 = 512;
/// Page size of [`MemDevice`] storage and the block unit of [`FaultDevice::fail_read_block`].
pub const PAGE_SIZE: usize = 4096;

/// Reject I/O that does not lie entirely inside `0..size` (including offset overflow).
fn check_range(off: u64, len: usize, size: u64) -> io::Result<()> {
    match off.checked_add(len as u64) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{len} bytes at offset {off} exceed the device size {size}"),
        )),
    }
}

fn eio() -> io::Error {
    io::Error::from_raw_os_error(libc::EIO)
}

/// Split the byte range `off..off + len` at multiples of `unit`; yields buffer index ranges.
fn split_at_units(off: u64, len: usize, unit: u64) -> impl Iterator<Item = Range<usize>> {
    debug_assert!(unit > 0);
    let mut at = 0usize;
    std::iter::from_fn(move || {
        if at == len {
            return None;
        }
        let pos = off + at as u64;
        let n = ((unit - pos % unit) as usize).min(len - at);
        debug_assert!(n > 0);
        let piece = at..at + n;
        at += n;
        Some(piece)
    })
}

// ---------------------------------------------------------------------------------------------
// FileDevice
// ---------------------------------------------------------------------------------------------

/// How often [`FileDevice::open_wait`] retries a lock held elsewhere.
const LOCK_RETRY: Duration = Duration::from_millis(20);

/// A device backed by an image file or a block-device node: what real mounts run on.
/// It holds advisory `flock`s for its whole lifetime (exclusive when writable, shared when
/// read-only) so two processes can never mount the same image and corrupt it: one on the file
/// it opened, and one on a lock file named after what the image *is* ([`identity`]), so that
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
}

impl FileDevice {
    /// Create (or truncate) a sparse image of `size` bytes at `path`, locked exclusively.
    pub fn create(path: impl AsRef<Path>, size: u64) -> io::Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(path)?;
        // Lock before truncating, so an image in use elsewhere is never clobbered.
        let identity_lock = lock_image(&file, path, false)?;
        file.set_len(0)?;
        file.set_len(size)?;
        Ok(Self {
            file,
            _identity_lock: identity_lock,
            path: path.to_path_buf(),
            size,
            read_only: false,
        })
    }

    /// Open an existing image or block device; fails with `WouldBlock` if it is locked elsewhere.
    pub fn open(path: impl AsRef<Path>, read_only: bool) -> io::Result<Self> {
        Self::open_wait(path, read_only, Duration::ZERO)
    }

    /// Like [`FileDevice::open`], but retries a lock held elsewhere every 20 ms until `timeout`
    /// (a mount that follows right after an unmount may race the previous holder's close).
    pub fn open_wait(
        path: impl AsRef<Path>,
        read_only: bool,
        timeout: Duration,
    ) -> io::Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new().read(true).write(!read_only).open(path)?;
        let deadline = Instant::now().checked_add(timeout);
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
        Ok(Self {
            file,
            _identity_lock: identity_lock,
            path: path.to_path_buf(),
            size,
            read_only,
        })
    }

    /// The path this device was opened from.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

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
fn lock_image(file: &File, path: &Path, read_only: bool) -> io::Result<Option<IdentityLock>> {
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
struct IdentityLock {
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
            let file = OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(&path)?;
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
    let mode = if read_only {
        libc::LOCK_SH
    } else {
        libc::LOCK_EX
    };
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
        if self.read_only {
            let msg = format!("image {} is open read-only", self.path.display());
            return Err(io::Error::new(io::ErrorKind::PermissionDenied, msg));
        }
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

    fn size(&self) -> u64 {
        self.size
    }
}

// ---------------------------------------------------------------------------------------------
// MemDevice
// ---------------------------------------------------------------------------------------------

type Page = Box<[u8; PAGE_SIZE]>;

/// An in-memory device for tests: fast, deterministic and sparse (a page that never received
/// non-zero data takes no memory), so a 1 GiB test device costs almost nothing. One lock guards
/// all pages, which makes [`MemDevice::snapshot`] an atomic point-in-time copy.
pub struct MemDevice {
    size: u64,
    pages: Mutex<Vec<Option<Page>>>,
}

impl MemDevice {
    /// A zero-filled device of `size` bytes.
    pub fn new(size: u64) -> Self {
        let count = usize::try_from(size.div_ceil(PAGE_SIZE as u64)).expect("device too large");
        Self {
            size,
            pages: Mutex::new(vec![None; count]),
        }
    }

    /// A device whose contents (and size) are `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let dev = Self::new(bytes.len() as u64);
        dev.store(bytes, 0);
        dev
    }

    /// A deep, point-in-time copy.
    pub fn snapshot(&self) -> MemDevice {
        Self {
            size: self.size,
            pages: Mutex::new(self.pages.lock().clone()),
        }
    }

    /// The whole contents as one buffer (for comparing images in tests).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0; usize::try_from(self.size).expect("device too large")];
        self.load(&mut out, 0);
        out
    }

    /// Number of 4 KiB pages that hold memory.
    pub fn allocated_pages(&self) -> usize {
        self.pages
            .lock()
            .iter()
            .filter(|page| page.is_some())
            .count()
    }

    /// Read without a range check; the caller has checked.
    fn load(&self, buf: &mut [u8], off: u64) {
        let pages = self.pages.lock();
        for piece in split_at_units(off, buf.len(), PAGE_SIZE as u64) {
            let (page, at) = page_pos(off + piece.start as u64);
            let dst = &mut buf[piece.clone()];
            match &pages[page] {
                Some(data) => dst.copy_from_slice(&data[at..at + piece.len()]),
                None => dst.fill(0),
            }
        }
    }

    /// Write without a range check; the caller has checked. Zeros never allocate a page.
    fn store(&self, buf: &[u8], off: u64) {
        let mut pages = self.pages.lock();
        for piece in split_at_units(off, buf.len(), PAGE_SIZE as u64) {
            let (page, at) = page_pos(off + piece.start as u64);
            let src = &buf[piece];
            let slot = &mut pages[page];
            if slot.is_none() && src.iter().all(|&b| b == 0) {
                continue;
            }
            let data = slot.get_or_insert_with(|| Box::new([0; PAGE_SIZE]));
            data[at..at + src.len()].copy_from_slice(src);
        }
    }
}

/// Page index and offset within the page of byte `pos`.
fn page_pos(pos: u64) -> (usize, usize) {
    (
        (pos / PAGE_SIZE as u64) as usize,
        (pos % PAGE_SIZE as u64) as usize,
    )
}

impl BlockDevice for MemDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        check_range(off, buf.len(), self.size)?;
        self.load(buf, off);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        check_range(off, buf.len(), self.size)?;
        self.store(buf, off);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.size
    }
}

// ---------------------------------------------------------------------------------------------
// FaultDevice
// ---------------------------------------------------------------------------------------------

/// Wraps a device and injects EIO on demand, so tests can drive the engine's error paths
/// (a failed journal write, a failed flush barrier, an unreadable metadata block). Faults are
/// set at run time through `&self`; a failed operation never reaches the inner device.
pub struct FaultDevice<D: BlockDevice> {
    inner: D,
    state: Mutex<FaultState>,
}

/// Counters and armed faults; one lock keeps "the Nth write from now" exact under concurrency.
#[derive(Default)]
struct FaultState {
    writes: u64,
    flushes: u64,
    /// Index (in `writes` numbering) of the write that fails.
    fail_write: Option<u64>,
    /// Keep failing every write after `fail_write`.
    sticky: bool,
    fail_flush: bool,
    bad_blocks: HashSet<u64>,
}

impl<D: BlockDevice> FaultDevice<D> {
    /// Wrap `inner` with no faults armed.
    pub fn new(inner: D) -> Self {
        Self {
            inner,
            state: Mutex::new(FaultState::default()),
        }
    }

    /// The wrapped device (reads and writes through it bypass fault injection).
    pub fn inner(&self) -> &D {
        &self.inner
    }

    /// Let the next `n` writes succeed and fail the one after (`n == 0` fails the very next
    /// write). With `sticky`, every later write fails too until [`FaultDevice::clear`].
    pub fn fail_write_after(&self, n: u64, sticky: bool) {
        let mut state = self.state.lock();
        state.fail_write = Some(state.writes.saturating_add(n));
        state.sticky = sticky;
    }

    /// Make every flush fail (`true`) or pass through again (`false`).
    pub fn fail_flushes(&self, fail: bool) {
        self.state.lock().fail_flush = fail;
    }

    /// Make every read touching 4 KiB block `blkno` fail.
    pub fn fail_read_block(&self, blkno: u64) {
        self.state.lock().bad_blocks.insert(blkno);
    }

    /// Disarm every fault; the counters keep counting.
    pub fn clear(&self) {
        let mut state = self.state.lock();
        *state = FaultState {
            writes: state.writes,
            flushes: state.flushes,
            ..FaultState::default()
        };
    }

    /// Writes issued so far, failed ones included.
    pub fn writes(&self) -> u64 {
        self.state.lock().writes
    }

    /// Flushes issued so far, failed ones included.
    pub fn flushes(&self) -> u64 {
        self.state.lock().flushes
    }

    /// Count one write and decide whether it fails.
    fn write_fails(&self) -> bool {
        let mut state = self.state.lock();
        let index = state.writes;
        state.writes += 1;
        state
            .fail_write
            .is_some_and(|at| index == at || (state.sticky && index > at))
    }

    /// Count one flush and decide whether it fails.
    fn flush_fails(&self) -> bool {
        let mut state = self.state.lock();
        state.flushes += 1;
        state.fail_flush
    }

    /// Whether `off..off + len` touches a block armed by `fail_read_block`.
    fn read_fails(&self, off: u64, len: usize) -> bool {
        if len == 0 {
            return false;
        }
        let block = PAGE_SIZE as u64;
        let blocks = off / block..=off.saturating_add(len as u64 - 1) / block;
        self.state
            .lock()
            .bad_blocks
            .iter()
            .any(|b| blocks.contains(b))
    }
}

impl<D: BlockDevice> BlockDevice for FaultDevice<D> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        if self.read_fails(off, buf.len()) {
            return Err(eio());
        }
        self.inner.read_at(buf, off)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        if self.write_fails() {
            return Err(eio());
        }
        self.inner.write_at(buf, off)
    }

    fn flush(&self) -> io::Result<()> {
        if self.flush_fails() {
            return Err(eio());
        }
        self.inner.flush()
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn preallocate(&self, off: u64, len: u64) -> io::Result<()> {
        self.inner.preallocate(off, len)
    }
}

// ---------------------------------------------------------------------------------------------
// CrashDevice and crash images
// ---------------------------------------------------------------------------------------------

/// One recorded device operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Write { off: u64, data: Vec<u8> },
    Flush,
}

/// The crash harness's recording device. It behaves like a normal device to the workload
/// (reads see the latest writes) while logging every write and flush in order, so that
/// [`crash_image`] can later rebuild any state the media may legally hold after a power cut.
pub struct CrashDevice {
    /// The durable image before any op; never modified.
    base: MemDevice,
    /// `base` with every logged write applied: what reads see.
    current: MemDevice,
    log: Mutex<Log>,
}

struct Log {
    ops: Vec<Op>,
    /// Power is cut once `ops` holds this many entries.
    cut: Option<usize>,
}

impl Log {
    fn dead(&self) -> bool {
        self.cut.is_some_and(|n| self.ops.len() >= n)
    }
}

impl CrashDevice {
    /// Record on top of `base`, the durable image at the start of the workload.
    pub fn new(base: MemDevice) -> Self {
        let current = base.snapshot();
        Self {
            base,
            current,
            log: Mutex::new(Log {
                ops: Vec::new(),
                cut: None,
            }),
        }
    }

    /// A copy of the operation log.
    pub fn ops(&self) -> Vec<Op> {
        self.log.lock().ops.clone()
    }

    /// Number of logged operations.
    pub fn op_count(&self) -> usize {
        self.log.lock().ops.len()
    }

    /// A snapshot of the image before any op.
    pub fn base(&self) -> MemDevice {
        self.base.snapshot()
    }

    /// A snapshot of what reads currently see (every logged write applied).
    pub fn current(&self) -> MemDevice {
        self.current.snapshot()
    }

    /// Cut the power once `n` ops are logged: from then on every read, write and flush fails
    /// with EIO and nothing more is logged, so the workload sees the device die.
    pub fn cut_after(&self, n: usize) {
        self.log.lock().cut = Some(n);
    }
}

impl BlockDevice for CrashDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        if self.log.lock().dead() {
            return Err(eio());
        }
        self.current.read_at(buf, off)
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        let mut log = self.log.lock();
        if log.dead() {
            return Err(eio());
        }
        // Applied under the log lock, so log order is the order `current` saw the writes.
        self.current.write_at(buf, off)?;
        log.ops.push(Op::Write {
            off,
            data: buf.to_vec(),
        });
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        let mut log = self.log.lock();
        if log.dead() {
            return Err(eio());
        }
        log.ops.push(Op::Flush);
        Ok(())
    }

    fn size(&self) -> u64 {
        self.current.size()
    }
}

/// A write that persisted only in part: bit `i % 64` of `sectors` keeps the write's `i`-th
/// 512-byte piece (pieces are split at absolute sector boundaries, so an unaligned write's
/// first and last pieces are partial sectors). `op` is the write's index in the op log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tear {
    pub op: usize,
    pub sectors: u64,
}

/// Op indices of the unflushed epoch of a crash before op `upto`: the writes after the last
/// Flush that precedes `upto`. Everything before that Flush is durable.
pub fn unflushed_epoch(ops: &[Op], upto: usize) -> Range<usize> {
    assert!(
        upto <= ops.len(),
        "crash point {upto} is past the end of {} ops",
        ops.len()
    );
    let start = ops[..upto]
        .iter()
        .rposition(|op| *op == Op::Flush)
        .map_or(0, |f| f + 1);
    start..upto
}

/// The media image after a crash just before op `upto`: every op up to the last Flush before
/// `upto` is applied; of the unflushed epoch only the writes `i` with `keep(i)` persisted
/// (applied in log order, so the newer of two overlapping kept writes wins).
pub fn crash_image(
    base: &MemDevice,
    ops: &[Op],
    upto: usize,
    keep: &dyn Fn(usize) -> bool,
) -> MemDevice {
    crash_image_torn(base, ops, upto, keep, None)
}

/// [`crash_image`] where one write of the unflushed epoch may be torn: `tear` decides which of
/// its sectors persisted, overriding `keep` for that write. Panics if `tear` names anything but
/// a write of the unflushed epoch (a harness bug).
pub fn crash_image_torn(
    base: &MemDevice,
    ops: &[Op],
    upto: usize,
    keep: &dyn Fn(usize) -> bool,
    tear: Option<Tear>,
) -> MemDevice {
    let epoch = unflushed_epoch(ops, upto);
    if let Some(t) = tear {
        let is_write = matches!(ops.get(t.op), Some(Op::Write { .. }));
        assert!(
            is_write && epoch.contains(&t.op),
            "{t:?} is not a write of epoch {epoch:?}"
        );
    }
    let image = base.snapshot();
    for (i, op) in ops[..upto].iter().enumerate() {
        let Op::Write { off, data } = op else {
            continue;
        };
        match tear {
            Some(t) if t.op == i => apply_torn(&image, *off, data, t.sectors),
            _ if i < epoch.start || keep(i) => apply(&image, *off, data),
            _ => {}
        }
    }
    image
}

fn apply(image: &MemDevice, off: u64, data: &[u8]) {
    image
        .write_at(data, off)
        .expect("logged write lies outside the base image");
}

fn apply_torn(image: &MemDevice, off: u64, data: &[u8], sectors: u64) {
    for (i, piece) in split_at_units(off, data.len(), SECTOR_SIZE).enumerate() {
        if sectors >> (i % 64) & 1 == 1 {
            apply(image, off + piece.start as u64, &data[piece]);
        }
    }
}

/// Crash points worth testing: the index of every Flush (the crash hits while that flush is
/// in flight, so any subset of its epoch may have persisted; every earlier point of the epoch
/// is one of those subsets, and keep-all is the state right after the flush) plus the end.
pub fn crash_points(ops: &[Op]) -> Vec<usize> {
    let flushes = ops
        .iter()
        .enumerate()
        .filter(|(_, op)| **op == Op::Flush)
        .map(|(i, _)| i);
    flushes.chain([ops.len()]).collect()
}

/// Keep-sets (op indices that persisted) for a crash before `upto`: all, none, each single
/// write, then `random` random subsets, each with its own density so near-empty and near-full
/// sets both occur. Deterministic per `seed`, so a failing case replays; duplicates dropped.
/// Use as `crash_image(base, ops, upto, &|i| set.contains(&i))`.
pub fn keep_sets(ops: &[Op], upto: usize, seed: u64, random: usize) -> Vec<BTreeSet<usize>> {
    let epoch = unflushed_epoch(ops, upto);
    debug_assert!(ops[epoch.clone()].iter().all(|op| *op != Op::Flush));
    let mut rng = SplitMix64(seed);
    let fixed = [epoch.clone().collect(), BTreeSet::new()].into_iter();
    let singles = epoch.clone().map(|i| BTreeSet::from([i]));
    let randoms = (0..random)
        .map(|_| random_subset(&mut rng, epoch.clone()))
        .collect::<Vec<_>>();
    let mut seen = HashSet::new();
    fixed
        .chain(singles)
        .chain(randoms)
        .filter(|set| seen.insert(set.clone()))
        .collect()
}

fn random_subset(rng: &mut SplitMix64, epoch: Range<usize>) -> BTreeSet<usize> {
    let density = rng.next();
    epoch.filter(|_| rng.next() < density).collect()
}

/// SplitMix64: a tiny PRNG whose sequence never changes between versions, so a crash case
/// stays replayable from its seed.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// A copy-on-write layer over a device: writes stay in memory, reads see them. A read-only
/// mount replays the log into one, so it sees the recovered image without writing a byte.
pub struct OverlayDevice {
    inner: std::sync::Arc<dyn BlockDevice>,
    pages: Mutex<std::collections::HashMap<u64, Box<[u8; PAGE_SIZE]>>>,
}

impl OverlayDevice {
    pub fn new(inner: std::sync::Arc<dyn BlockDevice>) -> OverlayDevice {
        OverlayDevice { inner, pages: Mutex::new(std::collections::HashMap::new()) }
    }
}

impl BlockDevice for OverlayDevice {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.inner.read_at(buf, off)?;
        let pages = self.pages.lock();
        for_each_page(off, buf.len(), |page, in_page, at, n| {
            if let Some(p) = pages.get(&page) {
                buf[at..at + n].copy_from_slice(&p[in_page..in_page + n]);
            }
        });
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        check_range(off, buf.len(), self.size())?;
        let mut pages = self.pages.lock();
        let mut result: io::Result<()> = Ok(());
        for_each_page(off, buf.len(), |page, in_page, at, n| {
            let p = pages.entry(page).or_insert_with(|| {
                let mut p = Box::new([0u8; PAGE_SIZE]);
                if let Err(e) = self.inner.read_at(&mut p[..], page * PAGE_SIZE as u64) {
                    result = Err(e);
                }
                p
            });
            p[in_page..in_page + n].copy_from_slice(&buf[at..at + n]);
        });
        result
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.inner.size()
    }
}

/// Split a byte range into per-page pieces: (page, offset in page, offset in buf, length).
fn for_each_page(off: u64, len: usize, mut f: impl FnMut(u64, usize, usize, usize)) {
    let mut at = 0;
    while at < len {
        let pos = off + at as u64;
        let (page, in_page) = (pos / PAGE_SIZE as u64, (pos % PAGE_SIZE as u64) as usize);
        let n = (PAGE_SIZE - in_page).min(len - at);
        f(page, in_page, at, n);
        at += n;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// A unique path under the temp dir, removed on drop.
    struct TempPath(PathBuf);

    impl TempPath {
        fn new(tag: &str) -> Self {
            static NEXT: AtomicUsize = AtomicUsize::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let name = format!("ferrofs-dev-{}-{n}-{tag}.img", std::process::id());
            Self(std::env::temp_dir().join(name))
        }
    }

    impl Drop for TempPath {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
            .collect()
    }

    fn read(dev: &dyn BlockDevice, off: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0; len];
        dev.read_at(&mut buf, off).unwrap();
        buf
    }

    /// Unaligned writes across page boundaries and at the very end read back; the rest is zero.
    fn round_trip(dev: &dyn BlockDevice) {
        let size = dev.size();
        let data = pattern(5000, 7);
        dev.write_at(&data, 4000).unwrap();
        dev.write_at(b"tail", size - 4).unwrap();
        dev.flush().unwrap();
        assert_eq!(read(dev, 4000, data.len()), data);
        assert_eq!(read(dev, size - 4, 4), b"tail");
        assert_eq!(read(dev, 0, 4000), vec![0; 4000]);
        assert_eq!(read(dev, 9000, 10), vec![0; 10]);
    }

    /// I/O past the end is an InvalidInput error, never a panic; empty I/O at the end is fine.
    fn out_of_range(dev: &dyn BlockDevice) {
        let size = dev.size();
        let invalid =
            |r: io::Result<()>| assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        invalid(dev.read_at(&mut [0; 1], size));
        invalid(dev.read_at(&mut [0; 2], size - 1));
        invalid(dev.write_at(&[1; 2], size - 1));
        invalid(dev.write_at(&[1], u64::MAX));
        invalid(dev.read_at(&mut [0; 8], u64::MAX - 3));
        dev.read_at(&mut [], size).unwrap();
        dev.write_at(&[], size).unwrap();
    }

    fn is_eio(r: io::Result<()>) -> bool {
        r.is_err_and(|e| e.raw_os_error() == Some(libc::EIO))
    }

    #[test]
    fn mem_round_trip_and_range() {
        let dev = MemDevice::new(64 * 1024 + 100);
        round_trip(&dev);
        out_of_range(&dev);
    }

    #[test]
    fn mem_is_sparse() {
        let dev = MemDevice::new(1 << 30);
        assert_eq!(dev.allocated_pages(), 0);
        dev.write_at(&[0; 3 * PAGE_SIZE], 12345).unwrap();
        assert_eq!(dev.allocated_pages(), 0);
        dev.write_at(&[9], 1 << 29).unwrap();
        assert_eq!(dev.allocated_pages(), 1);
        assert_eq!(read(&dev, (1 << 29) - 1, 3), [0, 9, 0]);
    }

    #[test]
    fn mem_snapshot_is_deep_and_bytes_round_trip() {
        let bytes = pattern(5000, 3);
        let dev = MemDevice::from_bytes(&bytes);
        assert_eq!(dev.size(), 5000);
        let snap = dev.snapshot();
        dev.write_at(&[0; 100], 4090).unwrap();
        assert_eq!(snap.to_bytes(), bytes);
        assert_ne!(dev.to_bytes(), bytes);
    }

    #[test]
    fn file_round_trip_range_and_reopen() {
        let path = TempPath::new("rt");
        let dev = FileDevice::create(&path.0, 64 * 1024 + 100).unwrap();
        assert_eq!(dev.path(), path.0);
        round_trip(&dev);
        out_of_range(&dev);
        drop(dev);
        let dev = FileDevice::open(&path.0, true).unwrap();
        assert_eq!(dev.size(), 64 * 1024 + 100);
        assert_eq!(read(&dev, dev.size() - 4, 4), b"tail");
        let err = dev.write_at(b"x", 0).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
    }

    #[test]
    fn file_create_is_sparse_and_truncates() {
        use std::os::unix::fs::MetadataExt;
        let path = TempPath::new("sparse");
        let dev = FileDevice::create(&path.0, 1 << 30).unwrap();
        dev.write_at(b"old", 0).unwrap();
        drop(dev);
        assert!(std::fs::metadata(&path.0).unwrap().blocks() < 1024);
        let dev = FileDevice::create(&path.0, 4096).unwrap();
        assert_eq!(dev.size(), 4096);
        assert_eq!(read(&dev, 0, 3), [0; 3]);
    }

    #[test]
    fn file_preallocate_allocates_the_range_only() {
        use std::os::unix::fs::MetadataExt;
        let path = TempPath::new("prealloc");
        let dev = FileDevice::create(&path.0, 1 << 30).unwrap();
        dev.preallocate(1 << 20, 1 << 20).unwrap();
        // 512-byte units; a host file system without fallocate allocates nothing (a hint).
        let blocks = std::fs::metadata(&path.0).unwrap().blocks();
        assert!(blocks == 0 || (2048..4096).contains(&blocks), "{blocks} sectors allocated");
        assert_eq!(read(&dev, 1 << 20, 4096), [0; 4096]);
        assert!(dev.preallocate((1 << 30) - 4096, 8192).is_err(), "past the end");
    }

    #[test]
    fn file_lock_excludes_other_opens() {
        let path = TempPath::new("lock");
        let writer = FileDevice::create(&path.0, 8192).unwrap();
        for read_only in [false, true] {
            let err = FileDevice::open(&path.0, read_only).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
            assert!(
                err.to_string().contains("is in use by another process"),
                "{err}"
            );
        }
        assert_eq!(
            FileDevice::create(&path.0, 1).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        assert_eq!(writer.size(), 8192, "a refused create must not truncate");
        drop(writer);
        let r1 = FileDevice::open(&path.0, true).unwrap();
        let _r2 = FileDevice::open(&path.0, true).unwrap();
        assert_eq!(
            FileDevice::open(&path.0, false).unwrap_err().kind(),
            io::ErrorKind::WouldBlock
        );
        drop(r1);
    }

    #[test]
    fn file_open_wait_retries_until_released_or_timeout() {
        let path = TempPath::new("wait");
        let holder = FileDevice::create(&path.0, 8192).unwrap();
        let start = Instant::now();
        let err = FileDevice::open_wait(&path.0, false, Duration::from_millis(60)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
        assert!(start.elapsed() >= Duration::from_millis(60));
        let release = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(100));
            drop(holder);
        });
        let dev = FileDevice::open_wait(&path.0, false, Duration::from_secs(10)).unwrap();
        release.join().unwrap();
        assert_eq!(dev.size(), 8192);
    }

    #[test]
    fn fault_round_trip_and_range() {
        let dev = FaultDevice::new(MemDevice::new(64 * 1024 + 100));
        round_trip(&dev);
        out_of_range(&dev);
    }

    #[test]
    fn fault_fails_exactly_the_chosen_write() {
        let dev = FaultDevice::new(MemDevice::new(1 << 20));
        dev.write_at(b"a", 0).unwrap();
        dev.fail_write_after(3, false);
        for i in 0..3 {
            dev.write_at(b"b", i).unwrap();
        }
        assert!(is_eio(dev.write_at(b"c", 100)));
        assert_eq!(
            read(dev.inner(), 100, 1),
            [0],
            "a failed write must not reach the device"
        );
        dev.write_at(b"d", 200).unwrap();
        assert_eq!(dev.writes(), 6);
    }

    #[test]
    fn fault_sticky_write_failure_lasts_until_clear() {
        let dev = FaultDevice::new(MemDevice::new(1 << 20));
        dev.fail_write_after(0, true);
        assert!(is_eio(dev.write_at(b"x", 0)));
        assert!(is_eio(dev.write_at(b"x", 0)));
        dev.clear();
        dev.write_at(b"x", 0).unwrap();
        assert_eq!(dev.writes(), 3);
    }

    #[test]
    fn fault_flushes_and_read_blocks() {
        let dev = FaultDevice::new(MemDevice::new(1 << 20));
        dev.fail_flushes(true);
        assert!(is_eio(dev.flush()));
        dev.fail_flushes(false);
        dev.flush().unwrap();
        assert_eq!(dev.flushes(), 2);
        dev.fail_read_block(2);
        assert!(is_eio(dev.read_at(&mut [0; 1], 2 * 4096 + 17)));
        assert!(is_eio(dev.read_at(&mut [0; 2], 2 * 4096 - 1)));
        dev.read_at(&mut [0; 4096], 4096).unwrap();
        dev.read_at(&mut [0; 4096], 3 * 4096).unwrap();
        dev.clear();
        dev.read_at(&mut [0; 1], 2 * 4096).unwrap();
    }

    #[test]
    fn crash_round_trip_and_range() {
        let dev = CrashDevice::new(MemDevice::new(64 * 1024 + 100));
        round_trip(&dev);
        let logged = dev.op_count();
        out_of_range(&dev);
        assert_eq!(
            dev.op_count(),
            logged + 1,
            "only the empty in-range write is logged"
        );
    }

    /// w0 w1 F w3 w4 F w6 w7, with overlapping writes in each epoch. Returns the device and the
    /// image right after the second flush.
    fn workload() -> (CrashDevice, MemDevice) {
        let dev = CrashDevice::new(MemDevice::from_bytes(&pattern(64 * 1024, 1)));
        dev.write_at(&pattern(5000, 2), 100).unwrap();
        dev.write_at(&pattern(300, 3), 4000).unwrap();
        dev.flush().unwrap();
        dev.write_at(&pattern(8192, 4), 8192).unwrap();
        dev.write_at(&pattern(10, 5), 8200).unwrap();
        dev.flush().unwrap();
        let durable = dev.current();
        dev.write_at(&pattern(4096, 6), 0).unwrap();
        dev.write_at(&pattern(600, 7), 4000).unwrap();
        (dev, durable)
    }

    #[test]
    fn crash_image_keep_all_is_final_and_keep_none_is_last_flush() {
        let (dev, durable) = workload();
        let (base, ops) = (dev.base(), dev.ops());
        assert_eq!(ops.len(), 8);
        let all = crash_image(&base, &ops, ops.len(), &|_| true);
        assert_eq!(all.to_bytes(), dev.current().to_bytes());
        let none = crash_image(&base, &ops, ops.len(), &|_| false);
        assert_eq!(none.to_bytes(), durable.to_bytes());
        let at_flush = crash_image(&base, &ops, 5, &|_| true);
        assert_eq!(at_flush.to_bytes(), durable.to_bytes());
        assert_eq!(
            crash_image(&base, &ops, 0, &|_| true).to_bytes(),
            base.to_bytes()
        );
    }

    #[test]
    fn crash_image_keeps_exactly_the_chosen_writes() {
        let (dev, durable) = workload();
        let (base, ops) = (dev.base(), dev.ops());
        let only7 = crash_image(&base, &ops, ops.len(), &|i| i == 7);
        let expected = durable.snapshot();
        expected.write_at(&pattern(600, 7), 4000).unwrap();
        assert_eq!(only7.to_bytes(), expected.to_bytes());
    }

    #[test]
    fn torn_write_keeps_exactly_the_chosen_sectors() {
        let (dev, durable) = workload();
        let (base, ops) = (dev.base(), dev.ops());
        let Op::Write { off, data } = &ops[7] else {
            panic!("op 7 is a write")
        };
        let mask = 0b101;
        let image = crash_image_torn(
            &base,
            &ops,
            ops.len(),
            &|_| false,
            Some(Tear {
                op: 7,
                sectors: mask,
            }),
        );
        let got = image.to_bytes();
        let old = durable.to_bytes();
        for (i, &byte) in data.iter().enumerate() {
            let pos = *off as usize + i;
            let sector = (pos as u64 / SECTOR_SIZE - off / SECTOR_SIZE) % 64;
            let want = if mask >> sector & 1 == 1 {
                byte
            } else {
                old[pos]
            };
            assert_eq!(got[pos], want, "byte {pos}");
        }
        let outside = |v: &[u8]| {
            [
                v[..*off as usize].to_vec(),
                v[*off as usize + data.len()..].to_vec(),
            ]
        };
        assert_eq!(outside(&got), outside(&old));
    }

    #[test]
    #[should_panic(expected = "is not a write of epoch")]
    fn tear_outside_the_epoch_is_rejected() {
        let (dev, _) = workload();
        let ops = dev.ops();
        crash_image_torn(
            &dev.base(),
            &ops,
            ops.len(),
            &|_| true,
            Some(Tear { op: 3, sectors: 1 }),
        );
    }

    #[test]
    fn crash_points_and_keep_sets() {
        let (dev, _) = workload();
        let ops = dev.ops();
        assert_eq!(crash_points(&ops), [2, 5, 8]);
        assert_eq!(unflushed_epoch(&ops, 8), 6..8);
        assert_eq!(unflushed_epoch(&ops, 6), 6..6);
        let sets = keep_sets(&ops, 5, 42, 20);
        assert_eq!(sets, keep_sets(&ops, 5, 42, 20), "deterministic per seed");
        for want in [
            BTreeSet::from([3, 4]),
            BTreeSet::new(),
            BTreeSet::from([3]),
            BTreeSet::from([4]),
        ] {
            assert!(sets.contains(&want), "{want:?} missing");
        }
        assert_eq!(sets.len(), 4, "only four subsets of two writes exist");
        assert!(sets.iter().flatten().all(|i| (3..5).contains(i)));
        let empty = keep_sets(&ops, 6, 1, 5);
        assert_eq!(empty, [BTreeSet::new()]);
    }

    #[test]
    fn keep_sets_vary_density() {
        let ops = vec![
            Op::Write {
                off: 0,
                data: vec![1]
            };
            64
        ];
        let sets = keep_sets(&ops, 64, 7, 200);
        let sizes: BTreeSet<usize> = sets[2 + 64..].iter().map(BTreeSet::len).collect();
        assert!(
            sizes.len() > 20,
            "random subsets should span many sizes: {sizes:?}"
        );
    }

    #[test]
    fn cut_after_kills_the_device() {
        let dev = CrashDevice::new(MemDevice::new(1 << 20));
        dev.write_at(b"a", 0).unwrap();
        dev.cut_after(3);
        dev.flush().unwrap();
        dev.write_at(b"b", 1).unwrap();
        assert!(is_eio(dev.write_at(b"c", 2)));
        assert!(is_eio(dev.flush()));
        assert!(is_eio(dev.read_at(&mut [0; 1], 0)));
        assert_eq!(dev.op_count(), 3);
        assert_eq!(dev.current().to_bytes()[..3], *b"ab\0");
    }

    #[test]
    fn concurrent_writes_log_in_apply_order() {
        let dev = Arc::new(CrashDevice::new(MemDevice::new(64 * 1024)));
        let threads: Vec<_> = (0..4u8)
            .map(|t| {
                let dev = Arc::clone(&dev);
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        dev.write_at(&pattern(700, t), (i * 97 + u64::from(t) * 13) % 60_000)
                            .unwrap();
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        let ops = dev.ops();
        let replay = crash_image(&dev.base(), &ops, ops.len(), &|_| true);
        assert_eq!(replay.to_bytes(), dev.current().to_bytes());
    }
}
