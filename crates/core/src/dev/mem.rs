//! A sparse in-memory device.

use std::io;

use parking_lot::Mutex;

use super::{check_range, split_at_units, BlockDevice, PAGE_SIZE};

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
        Self { size, pages: Mutex::new(vec![None; count]) }
    }

    /// A device whose contents (and size) are `bytes`.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        let dev = Self::new(bytes.len() as u64);
        dev.store(bytes, 0);
        dev
    }

    /// A deep, point-in-time copy.
    pub fn snapshot(&self) -> MemDevice {
        Self { size: self.size, pages: Mutex::new(self.pages.lock().clone()) }
    }

    /// The whole contents as one buffer (for comparing images in tests).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = vec![0; usize::try_from(self.size).expect("device too large")];
        self.load(&mut out, 0);
        out
    }

    /// Number of 4 KiB pages that hold memory.
    pub fn allocated_pages(&self) -> usize {
        self.pages.lock().iter().filter(|page| page.is_some()).count()
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
    ((pos / PAGE_SIZE as u64) as usize, (pos % PAGE_SIZE as u64) as usize)
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

    /// Zeros the range and frees its whole pages, as a hole punched in a sparse file would.
    fn punch(&self, off: u64, len: u64) -> io::Result<bool> {
        check_range(off, len.try_into().map_err(|_| super::eio())?, self.size)?;
        let mut pages = self.pages.lock();
        for piece in split_at_units(off, len as usize, PAGE_SIZE as u64) {
            let (page, at) = page_pos(off + piece.start as u64);
            match &mut pages[page] {
                slot @ Some(_) if piece.len() == PAGE_SIZE => *slot = None,
                Some(data) => data[at..at + piece.len()].fill(0),
                None => {}
            }
        }
        Ok(true)
    }

    fn size(&self) -> u64 {
        self.size
    }
}
