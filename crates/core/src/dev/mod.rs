//! Block devices. The engine sees storage only through [`BlockDevice`]: byte-addressed reads
//! and writes plus a flush barrier. Media assumptions (docs/DESIGN.md): a write that returned
//! is durable only after a later `flush` returned; writes between two flushes may reach the
//! media in any order, and a write may tear at 512-byte sector boundaries.

use std::io;
use std::ops::Range;

#[cfg(any(test, feature = "testing"))]
mod crash;
#[cfg(any(test, feature = "testing"))]
mod fault;
mod file;
mod lock;
mod mem;
mod overlay;
#[cfg(test)]
mod tests;

#[cfg(any(test, feature = "testing"))]
pub use self::crash::{crash_image, crash_image_torn, crash_points, keep_sets, unflushed_epoch, CrashDevice, Op, Tear};
#[cfg(any(test, feature = "testing"))]
pub use self::fault::FaultDevice;
pub use self::file::{device_size, FileDevice};
pub use self::lock::{identity, identity_of_path, runtime_dir};
pub use self::mem::MemDevice;
pub use self::overlay::OverlayDevice;

/// Storage as the engine sees it: byte-addressed reads and writes of a fixed-size device and a
/// flush barrier, with the media assumptions of the module docs. Shared between threads.
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
    /// Give the storage of `off..off + len` back to the host (a hole punched in an image
    /// file, a discard on a block device): the engine calls it only on free blocks, whose
    /// contents it never reads, so what reads return afterwards is unspecified (zeros on an
    /// image file). Like a write, not durable until `flush`. `Ok(false)`: this device cannot.
    fn punch(&self, _off: u64, _len: u64) -> io::Result<bool> {
        Ok(false)
    }
}

/// The unit a write may tear at (see the module docs).
pub const SECTOR_SIZE: u64 = 512;

/// Page size of [`MemDevice`] storage and the block unit of `FaultDevice::fail_read_block`.
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
