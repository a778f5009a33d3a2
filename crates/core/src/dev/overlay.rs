//! A copy-on-write layer over a device, for read-only mounts.

use std::io;

use parking_lot::Mutex;

use super::{check_range, BlockDevice, PAGE_SIZE};

/// A copy-on-write layer over a device: writes stay in memory, reads see them. A read-only
/// mount replays the log into one, so it sees the recovered image without writing a byte.
pub struct OverlayDevice {
    inner: std::sync::Arc<dyn BlockDevice>,
    pages: Mutex<std::collections::HashMap<u64, Box<[u8; PAGE_SIZE]>>>,
}

impl OverlayDevice {
    /// An empty layer over `inner`: reads see `inner` until a write covers them.
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
