//! Pass 2: the log, replayed as a mount would (into memory under `-n`), or reset when it cannot
//! be replayed.

use std::collections::{hash_map, HashMap};
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use parking_lot::Mutex;

use crate::buf::Block;
use crate::dev::BlockDevice;
use crate::error::Result;
use crate::format::log::{record_head, LogHeader, LOG_HEADER_BLOCKS};
use crate::format::{Geometry, BLOCK_SIZE};
use crate::{format, journal};

use super::{count, finding, Checker, BS};

/// The highest record sequence a reset log goes on from (a record a second for 100,000 years
/// is far below it).
const SEQ_MAX: u64 = 1 << 48;

/// Where `-n` replays the log: recovery's writes land in memory and reads see them, so the
/// check sees the recovered image while the device is never written.
pub(super) struct ReplayOverlay<'a> {
    dev: &'a dyn BlockDevice,
    blocks: Mutex<HashMap<u64, Box<Block>>>,
}

impl<'a> ReplayOverlay<'a> {
    pub(super) fn new(dev: &'a dyn BlockDevice) -> Self {
        ReplayOverlay { dev, blocks: Mutex::new(HashMap::new()) }
    }
}

/// The per-block pieces of a byte range: (block, offset in the block, range in the buffer).
fn block_pieces(off: u64, len: usize) -> impl Iterator<Item = (u64, usize, Range<usize>)> {
    let mut at = 0;
    std::iter::from_fn(move || {
        (at < len).then(|| {
            let pos = off + at as u64;
            let in_block = (pos % BS) as usize;
            let n = (BLOCK_SIZE - in_block).min(len - at);
            let piece = (pos / BS, in_block, at..at + n);
            at += n;
            piece
        })
    })
}

impl BlockDevice for ReplayOverlay<'_> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.dev.read_at(buf, off)?;
        let blocks = self.blocks.lock();
        for (blkno, in_block, piece) in block_pieces(off, buf.len()) {
            if let Some(b) = blocks.get(&blkno) {
                let n = piece.len();
                buf[piece].copy_from_slice(&b[in_block..in_block + n]);
            }
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        if off.checked_add(buf.len() as u64).is_none_or(|end| end > self.size()) {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "write past the end of the device"));
        }
        let mut blocks = self.blocks.lock();
        for (blkno, in_block, piece) in block_pieces(off, buf.len()) {
            let b = match blocks.entry(blkno) {
                hash_map::Entry::Occupied(e) => e.into_mut(),
                hash_map::Entry::Vacant(e) => {
                    let mut b = Box::new([0u8; BLOCK_SIZE]);
                    self.dev.read_at(&mut b[..], blkno * BS)?;
                    e.insert(b)
                }
            };
            b[in_block..in_block + piece.len()].copy_from_slice(&buf[piece]);
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn size(&self) -> u64 {
        self.dev.size()
    }
}

/// The device as the check reads it, noting the highest lsn of the verified home copies of
/// logged items among its reads: the check reads every metadata block and inode in use, so
/// at its end that is the image's highest home lsn (`check_log_sequence`).
pub(super) struct HomeLsns<'a> {
    dev: &'a dyn BlockDevice,
    geo: Geometry,
    highest: AtomicU64,
}

impl<'a> HomeLsns<'a> {
    pub(super) fn new(dev: &'a dyn BlockDevice, geo: Geometry) -> Self {
        HomeLsns { dev, geo, highest: AtomicU64::new(0) }
    }

    /// The highest home lsn read so far, garbage (at or past `SEQ_MAX`) left out.
    pub(super) fn highest(&self) -> u64 {
        self.highest.load(Relaxed)
    }
}

impl BlockDevice for HomeLsns<'_> {
    fn read_at(&self, buf: &mut [u8], off: u64) -> io::Result<()> {
        self.dev.read_at(buf, off)?;
        if let Some(lsn) = journal::verified_lsn_at(buf, off, &self.geo).filter(|&lsn| lsn < SEQ_MAX) {
            self.highest.fetch_max(lsn, Relaxed);
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], off: u64) -> io::Result<()> {
        self.dev.write_at(buf, off)
    }

    fn flush(&self) -> io::Result<()> {
        self.dev.flush()
    }

    fn size(&self) -> u64 {
        self.dev.size()
    }

    fn preallocate(&self, off: u64, len: u64) -> io::Result<()> {
        self.dev.preallocate(off, len)
    }

    fn punch(&self, off: u64, len: u64) -> io::Result<bool> {
        self.dev.punch(off, len)
    }
}

impl<'a> Checker<'a> {
    /// Replay the log as a mount would. A repair first replays into memory (`recover` writes
    /// the items it replays to whatever device it is given) to learn whether there is anything
    /// to replay, so that repairing a cleanly unmounted image writes nothing, not even a new
    /// log header.
    pub(super) fn replay_log(&mut self) -> Result<()> {
        (self.progress)("log", 0, 1);
        let probe = ReplayOverlay::new(self.dev);
        let target: &dyn BlockDevice = if self.out.repair { &probe } else { self.dev };
        match journal::recover(target, &self.geo, false) {
            Ok(r) if r.records > 0 => {
                let records = count(r.records, "record", "records");
                if self.out.repair {
                    self.log_header = Some(journal::recover(self.dev, &self.geo, true)?.header);
                    self.out.note(format!("log: replayed {records}"));
                } else {
                    self.log_header = Some(r.header);
                    self.out
                        .note(format!("log: replayed {records} in memory only; the next mount replays them on disk"));
                }
                self.log_records = r.records;
            }
            // Nothing to replay: the header stays as it is.
            Ok(_) => self.log_header = Some(journal::read_log_header(self.dev, &self.geo)?),
            Err(e) => {
                let e = finding(e)?;
                self.out.fixable(format!("log: cannot be replayed ({e}); resetting it loses the changes it held"));
                self.reset_log()?;
            }
        }
        (self.progress)("log", 1, 1);
        Ok(())
    }

    /// Empty log headers, as mkfs writes them, in an epoch after any the old headers name (so
    /// no stale record can replay), and an empty first ring block. The record sequence goes
    /// on past every record left in the ring: recovery skips an image older than the lsn of
    /// its home copy, and refuses a home newer than the log, so sequences never restart.
    fn reset_log(&mut self) -> Result<()> {
        let log = self.geo.ag_layout(0).log;
        let ring = self.geo.log_ring_blocks();
        let (mut epoch, mut seqs) = (0u64, Vec::new());
        for blkno in log..log + LOG_HEADER_BLOCKS {
            // The headers failed verification: read their fields raw, best effort.
            let b = self.read_block(blkno)?;
            epoch = epoch.max(format::get_u64(&b[..], 40));
            seqs.push(format::get_u64(&b[..], 56));
        }
        for off in 0..ring {
            // An unreadable ring block must not keep the log from being reset.
            let Ok(b) = self.read_block(log + LOG_HEADER_BLOCKS + off) else { continue };
            seqs.extend(record_head(&b[..], ring - off).map(|head| head.seq));
        }
        // Garbage this large is no sequence a writer reached; it would only overflow.
        let tail_seq = seqs.into_iter().filter(|&seq| seq < SEQ_MAX).max().unwrap_or(0) + 1;
        for gen in 0..LOG_HEADER_BLOCKS {
            let h = LogHeader { gen, epoch: epoch.wrapping_add(1), tail_off: 0, tail_seq };
            self.block_writes.insert(log + gen, h.encode(log + gen));
            self.log_header = Some(h);
        }
        self.block_writes.insert(log + LOG_HEADER_BLOCKS, Box::new([0u8; BLOCK_SIZE]));
        Ok(())
    }

    /// The log's sequence must be past every home lsn (`highest`): a record of a crash to
    /// come, with an image of a home stamped at or past its own sequence, is refused by
    /// recovery (or, if the tail is found stale, the log is reset and its changes lost). An
    /// fsck that reset the log to sequence 1 left such images; moved past them now, as
    /// xfs_repair formats the log past the highest metadata LSN it found, nothing later
    /// meets them. After pass 2 the log is empty (replayed or reset), so a new header in
    /// the next epoch can take the sequence on from anywhere.
    pub(super) fn check_log_sequence(&mut self, highest: u64) {
        let Some(h) = self.log_header.filter(|h| highest >= h.tail_seq) else { return };
        self.out.fixable(format!(
            "log: its sequence goes on from {}, but a home has lsn {highest} (the log was reset to sequence 1 \
             by an older fsck); moving it on to {}",
            h.tail_seq,
            highest + 1
        ));
        let next = LogHeader { gen: h.gen + 1, epoch: h.epoch + 1, tail_off: h.tail_off, tail_seq: highest + 1 };
        let blkno = self.geo.ag_layout(0).log + (next.gen & 1);
        self.block_writes.insert(blkno, next.encode(blkno));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dev::MemDevice;

    #[test]
    fn block_pieces_split_at_block_boundaries() {
        let pieces: Vec<_> = block_pieces(4090, 10_000).collect();
        assert_eq!(pieces, [(0, 4090, 0..6), (1, 0, 6..4102), (2, 0, 4102..8198), (3, 0, 8198..10_000)]);
        assert_eq!(block_pieces(BS, 0).count(), 0);
    }

    #[test]
    fn overlay_shows_its_writes_and_never_writes_through() {
        let dev = MemDevice::new(4 * BS);
        dev.write_at(&[1u8; 100], 5000).unwrap();
        let before = dev.to_bytes();
        let overlay = ReplayOverlay::new(&dev);
        overlay.write_at(&[2u8; 10], 5005).unwrap();
        overlay.write_at(&[3u8; 2], BS - 1).unwrap();
        let mut b = [0u8; 20];
        overlay.read_at(&mut b, 4995).unwrap();
        assert_eq!(b, [0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2]);
        let mut edge = [0u8; 4];
        overlay.read_at(&mut edge, BS - 2).unwrap();
        assert_eq!(edge, [0, 3, 3, 0]);
        assert!(overlay.write_at(&[0; 2], 4 * BS - 1).is_err(), "writes past the end fail");
        assert!(dev.to_bytes() == before, "the device was written");
    }
}
