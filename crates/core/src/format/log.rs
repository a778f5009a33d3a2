//! Log framing: the two ping-pong log header blocks and checkpoint records.
//!
//! A checkpoint record is one contiguous run of blocks in the log ring, checksummed as a
//! whole, so it is either entirely valid after a crash or ignored: there is no separate
//! commit block and no second flush per checkpoint.

use super::*;
use crate::error::{Error, Result};

pub const MAGIC_LOG_HEADER: u32 = 0x4646_4c48; // "FFLH"
pub const MAGIC_RECORD: u32 = 0x4646_4c52; // "FFLR"
pub const LOG_HEADER_BLOCKS: u64 = 2;
pub const RECORD_HDR: usize = 32;
pub const ITEM_HDR: usize = 16;

/// What a logged item is and where it goes home.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ItemKey {
    /// A whole metadata block image, home at this block number.
    Block(u64),
    /// A 256-byte inode image, home in the inode table slot of this inode number.
    Inode(u64),
    /// The metadata block was freed: older images of it in the log must never be written
    /// home, because the block may now hold file data (jbd2's revoke records).
    Revoke(u64),
}

impl ItemKey {
    fn kind(self) -> u8 {
        match self {
            ItemKey::Block(_) => 1,
            ItemKey::Inode(_) => 2,
            ItemKey::Revoke(_) => 3,
        }
    }
    fn key(self) -> u64 {
        match self {
            ItemKey::Block(b) | ItemKey::Inode(b) | ItemKey::Revoke(b) => b,
        }
    }
    pub fn image_len(self) -> usize {
        match self {
            ItemKey::Block(_) => BLOCK_SIZE,
            ItemKey::Inode(_) => INODE_SIZE,
            ItemKey::Revoke(_) => 0,
        }
    }
}

/// The durable position of the log tail. Two copies are written alternately; the valid one
/// with the higher `gen` wins, so a torn header write loses at most the newest update.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogHeader {
    pub gen: u64,
    /// Incremented at every mount: records of an older epoch are never replayed, so stale
    /// records left beyond the head by a crash cannot be mistaken for new ones.
    pub epoch: u64,
    pub tail_off: u64,
    pub tail_seq: u64,
}

impl LogHeader {
    pub fn encode(&self, blkno: u64) -> Box<[u8; BLOCK_SIZE]> {
        let mut b = Box::new([0u8; BLOCK_SIZE]);
        init_header(&mut b[..], MAGIC_LOG_HEADER, blkno, 0);
        put_u64(&mut b[..], 32, self.gen);
        put_u64(&mut b[..], 40, self.epoch);
        put_u64(&mut b[..], 48, self.tail_off);
        put_u64(&mut b[..], 56, self.tail_seq);
        seal_block(&mut b[..], self.gen);
        b
    }

    pub fn decode(b: &[u8], blkno: u64, ring_blocks: u64) -> Result<LogHeader> {
        verify_block(b, "log header", MAGIC_LOG_HEADER, blkno, Some(0))?;
        let h = LogHeader { gen: get_u64(b, 32), epoch: get_u64(b, 40), tail_off: get_u64(b, 48), tail_seq: get_u64(b, 56) };
        if h.tail_off >= ring_blocks {
            return Err(Error::corrupt("log header", blkno, format!("tail {} outside the log", h.tail_off)));
        }
        Ok(h)
    }
}

/// Bytes an item takes in a record.
pub fn item_bytes(key: ItemKey) -> usize {
    ITEM_HDR + key.image_len()
}

/// Build a record: header, then `ITEM_HDR`-prefixed images, zero-padded to whole blocks.
pub fn encode_record<'a>(seq: u64, epoch: u64, items: impl Iterator<Item = (ItemKey, &'a [u8])> + Clone) -> Vec<u8> {
    // One allocation of the final size: a record of a busy checkpoint is hundreds of KiB,
    // and growing it by doubling copied it several times inside fsync's latency.
    let len = items.clone().map(|(_, img)| ITEM_HDR + img.len()).sum::<usize>();
    let mut out = Vec::with_capacity((RECORD_HDR + len).next_multiple_of(BLOCK_SIZE));
    out.resize(RECORD_HDR, 0);
    let mut n = 0u32;
    for (key, img) in items {
        debug_assert_eq!(img.len(), key.image_len());
        let at = out.len();
        out.resize(at + ITEM_HDR, 0);
        out[at] = key.kind();
        put_u32(&mut out, at + 4, img.len() as u32);
        put_u64(&mut out, at + 8, key.key());
        out.extend_from_slice(img);
        n += 1;
    }
    out.resize(out.len().next_multiple_of(BLOCK_SIZE), 0);
    put_u32(&mut out, 0, MAGIC_RECORD);
    put_u64(&mut out, 8, seq);
    put_u64(&mut out, 16, epoch);
    let len_blocks = (out.len() / BLOCK_SIZE) as u32;
    put_u32(&mut out, 24, len_blocks);
    put_u32(&mut out, 28, n);
    let crc = crc_with_hole(&out, 4);
    put_u32(&mut out, 4, crc);
    out
}

/// The fields of a record's first block, read before the rest of the record.
pub struct RecordHead {
    pub seq: u64,
    pub epoch: u64,
    pub len_blocks: u64,
}

/// Parse the first block of a candidate record. `None` means "no record here" (end of log).
pub fn record_head(first: &[u8], max_blocks: u64) -> Option<RecordHead> {
    if get_u32(first, 0) != MAGIC_RECORD {
        return None;
    }
    let len_blocks = get_u32(first, 24) as u64;
    if len_blocks == 0 || len_blocks > max_blocks {
        return None;
    }
    Some(RecordHead { seq: get_u64(first, 8), epoch: get_u64(first, 16), len_blocks })
}

/// Validate a whole record and return its items. A checksum failure means the record was
/// torn or never completed, which ends replay; it is not an error.
pub fn decode_record(rec: &[u8]) -> Option<Result<Vec<(ItemKey, &[u8])>>> {
    if crc_with_hole(rec, 4) != get_u32(rec, 4) {
        return None;
    }
    Some(parse_items(rec))
}

/// The items of a record this process built (`encode_record`), with each image's byte
/// offset in the record.
pub fn item_offsets(rec: &[u8]) -> Result<Vec<(ItemKey, usize)>> {
    let base = rec.as_ptr() as usize;
    Ok(parse_items(rec)?.into_iter().map(|(k, img)| (k, img.as_ptr() as usize - base)).collect())
}

fn parse_items(rec: &[u8]) -> Result<Vec<(ItemKey, &[u8])>> {
    let n = get_u32(rec, 28) as usize;
    let bad = |d: String| Error::corrupt("log record", get_u64(rec, 8), d);
    if n > rec.len() / ITEM_HDR {
        return Err(bad(format!("{} items cannot fit", n)));
    }
    let mut items = Vec::with_capacity(n);
    let mut at = RECORD_HDR;
    for _ in 0..n {
        if at + ITEM_HDR > rec.len() {
            return Err(bad("item header past the end".into()));
        }
        let (kind, len, key) = (rec[at], get_u32(rec, at + 4) as usize, get_u64(rec, at + 8));
        let key = match kind {
            1 => ItemKey::Block(key),
            2 => ItemKey::Inode(key),
            3 => ItemKey::Revoke(key),
            _ => return Err(bad(format!("unknown item kind {}", kind))),
        };
        if len != key.image_len() || at + ITEM_HDR + len > rec.len() {
            return Err(bad(format!("item of {} bytes does not fit", len)));
        }
        items.push((key, &rec[at + ITEM_HDR..at + ITEM_HDR + len]));
        at += ITEM_HDR + len;
    }
    Ok(items)
}
