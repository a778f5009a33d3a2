//! Block devices. The engine sees storage only through [`BlockDevice`]: byte-addressed reads
//! and writes plus a flush barrier. Media assumptions (docs/DESIGN.md): a write that returned
//! is durable only after a later `flush` returned; writes between two flushes may reach the
//! media in any order, and a write may tear at 512-byte sector boundaries.

use std::io;

pub trait BlockDevice: Send + Sync {
    /// Read exactly `buf.len()` bytes at byte offset `off`.
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()>;
    /// Write all of `buf` at byte offset `off`. Not durable until `flush`.
    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()>;
    /// Make every write that returned before this call durable.
    fn flush(&self) -> io::Result<()>;
    /// Size in bytes.
    fn size(&self) -> u64;
}
