//! A device that fails on demand, for the engine's error paths.

use std::collections::HashSet;
use std::io;

use parking_lot::Mutex;

use super::{eio, BlockDevice, PAGE_SIZE};

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
        Self { inner, state: Mutex::new(FaultState::default()) }
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
        *state = FaultState { writes: state.writes, flushes: state.flushes, ..FaultState::default() };
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
        state.fail_write.is_some_and(|at| index == at || (state.sticky && index > at))
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
        self.state.lock().bad_blocks.iter().any(|b| blocks.contains(b))
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
