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

/// A block is logged in chunks of this many bytes: after the first image of a block, the log
/// carries only the chunks that changed since its previous image there (as XFS logs a
/// buffer's dirty regions), so one changed directory entry costs a few hundred bytes of log,
/// not a whole block.
pub const CHUNK: usize = 128;
/// Which chunks of a block changed: bit *i* covers bytes `[i * CHUNK, (i + 1) * CHUNK)`.
pub type ChunkMask = u32;
pub const ALL_CHUNKS: ChunkMask = ChunkMask::MAX;
const _: () = assert!(BLOCK_SIZE / CHUNK == ChunkMask::BITS as usize);

/// The chunk numbers set in `changed`, ascending (the order a chunks item stores them in).
pub fn chunk_indices(changed: ChunkMask) -> impl Iterator<Item = usize> {
    (0..ChunkMask::BITS as usize).filter(move |i| changed & (1 << i) != 0)
}

/// Whether a record carries this item as chunks (kind 4) rather than whole.
fn in_chunks(key: ItemKey, changed: ChunkMask) -> bool {
    matches!(key, ItemKey::Block(_)) && changed != ALL_CHUNKS
}

/// The chunks that bytes `range` of a block touch.
pub fn chunks_of(range: std::ops::Range<usize>) -> ChunkMask {
    debug_assert!(range.end <= BLOCK_SIZE, "{range:?} outside a block");
    if range.is_empty() {
        return 0;
    }
    let (first, last) = (range.start / CHUNK, (range.end - 1) / CHUNK);
    let upto_last = if last + 1 == ChunkMask::BITS as usize { ALL_CHUNKS } else { (1 << (last + 1)) - 1 };
    upto_last & !((1 << first) - 1)
}

/// A decoded record item: where it goes home and what to put there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogItem<'a> {
    /// A whole block image.
    Block(u64, &'a [u8]),
    /// Some chunks of a block (ascending, as the mask lists them), to be laid over its home
    /// contents.
    Chunks(u64, ChunkMask, &'a [u8]),
    Inode(u64, &'a [u8]),
    Revoke(u64),
}

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

/// The record item kind of a block's changed chunks; the other kinds are `ItemKey::kind`'s.
const KIND_CHUNKS: u8 = 4;

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
        // Any ring size: the tail's bound is the reader's to check, not the encoding's.
        debug_assert_eq!(
            LogHeader::decode(&b[..], blkno, u64::MAX).ok().as_ref(),
            Some(self),
            "log header changed in its encoding"
        );
        b
    }

    pub fn decode(b: &[u8], blkno: u64, ring_blocks: u64) -> Result<LogHeader> {
        verify_block(b, "log header", MAGIC_LOG_HEADER, blkno, Some(0))?;
        let h = LogHeader {
            gen: get_u64(b, 32),
            epoch: get_u64(b, 40),
            tail_off: get_u64(b, 48),
            tail_seq: get_u64(b, 56),
        };
        if h.tail_off >= ring_blocks {
            return Err(Error::corrupt("log header", blkno, format!("tail {} outside the log", h.tail_off)));
        }
        Ok(h)
    }
}

/// Bytes an item's whole image takes in a record.
pub fn item_bytes(key: ItemKey) -> usize {
    logged_bytes(key, ALL_CHUNKS)
}

/// Bytes an item takes in a record when only the `changed` chunks of a block are logged.
pub fn logged_bytes(key: ItemKey, changed: ChunkMask) -> usize {
    if in_chunks(key, changed) {
        ITEM_HDR + 4 + CHUNK * changed.count_ones() as usize
    } else {
        ITEM_HDR + key.image_len()
    }
}

/// Bytes of a record built in memory at a time: a larger record is written in pieces of about
/// this size from one buffer, as XFS writes a checkpoint through in-core log buffers of at most
/// 256 KiB.
pub const RECORD_PIECE: usize = 256 << 10;

/// Build a record in `buf` (emptied first; its capacity is reused) and hand it to `write` as
/// (offset in the record, bytes): header, then `ITEM_HDR`-prefixed images, zero-padded to
/// whole blocks; a block whose mask is not `ALL_CHUNKS` is logged as its changed chunks (kind
/// 4). A record of at most `piece` bytes goes in one write. A larger one goes in block-aligned
/// pieces of about `piece` bytes, its first block with a zero crc, then that block again with
/// the crc of the whole: until the device is flushed it is valid entirely or not at all, as a
/// torn single write is, and the buffer stays near `piece` bytes however large the record.
/// Returns the record's length in bytes.
pub fn write_record<'a, E>(
    buf: &mut Vec<u8>,
    piece: usize,
    seq: u64,
    epoch: u64,
    items: impl Iterator<Item = (ItemKey, &'a [u8], ChunkMask)> + Clone,
    mut write: impl FnMut(u64, &[u8]) -> std::result::Result<(), E>,
) -> std::result::Result<u64, E> {
    debug_assert!(piece >= BLOCK_SIZE && piece.is_multiple_of(BLOCK_SIZE), "record piece of {piece} bytes");
    let len = RECORD_HDR + items.clone().map(|(k, _, changed)| logged_bytes(k, changed)).sum::<usize>();
    let total = len.next_multiple_of(BLOCK_SIZE);
    let split = total > piece;
    buf.clear();
    // Room for the whole record, or for a piece and the item that crosses its end.
    buf.reserve(if split { piece + BLOCK_SIZE + ITEM_HDR + 4 } else { total });
    buf.resize(RECORD_HDR, 0);
    put_u32(buf, 0, MAGIC_RECORD);
    put_u64(buf, 8, seq);
    put_u64(buf, 16, epoch);
    put_u32(buf, 24, (total / BLOCK_SIZE) as u32);
    put_u32(buf, 28, items.clone().count() as u32);
    // The crc (bytes 4..8) stays zero until the end, so the running crc is that of the record
    // with its crc field taken as zero (`crc_with_hole`).
    let (mut crc, mut done) = (0u32, 0usize);
    let mut head = [0u8; BLOCK_SIZE];
    for (key, img, changed) in items.clone() {
        debug_assert_eq!(img.len(), key.image_len());
        let at = buf.len();
        buf.resize(at + ITEM_HDR, 0);
        buf[at] = key.kind();
        put_u64(buf, at + 8, key.key());
        if in_chunks(key, changed) {
            buf[at] = KIND_CHUNKS;
            buf.extend_from_slice(&changed.to_le_bytes());
            for i in chunk_indices(changed) {
                buf.extend_from_slice(&img[i * CHUNK..(i + 1) * CHUNK]);
            }
        } else {
            buf.extend_from_slice(img);
        }
        let image_len = (buf.len() - at - ITEM_HDR) as u32;
        put_u32(buf, at + 4, image_len);
        if split && buf.len() >= piece {
            if done == 0 {
                head.copy_from_slice(&buf[..BLOCK_SIZE]);
            }
            let cut = buf.len() / BLOCK_SIZE * BLOCK_SIZE;
            crc = crc32c::crc32c_append(crc, &buf[..cut]);
            write(done as u64, &buf[..cut])?;
            buf.drain(..cut);
            done += cut;
        }
    }
    debug_assert_eq!(done + buf.len(), len);
    buf.resize(total - done, 0);
    crc = crc32c::crc32c_append(crc, buf);
    if done == 0 {
        put_u32(buf, 4, crc);
        // A record written in pieces is not whole in memory; one in one write is checked.
        debug_assert!(decodes_to(buf, items), "log record {seq} does not decode to its items");
        write(0, buf)?;
    } else {
        write(done as u64, buf)?;
        put_u32(&mut head, 4, crc);
        write(0, &head)?;
    }
    Ok(total as u64)
}

/// Whether `rec` decodes to exactly `items`, each as [`write_record`] lays it out.
fn decodes_to<'a>(rec: &[u8], mut items: impl Iterator<Item = (ItemKey, &'a [u8], ChunkMask)>) -> bool {
    let Some(Ok(decoded)) = decode_record(rec) else { return false };
    let mut decoded = decoded.into_iter();
    let same = items.all(|(key, img, changed)| match (key, decoded.next()) {
        (ItemKey::Block(b), Some(LogItem::Block(k, d))) => k == b && changed == ALL_CHUNKS && d == img,
        (ItemKey::Block(b), Some(LogItem::Chunks(k, mask, d))) => {
            k == b
                && mask == changed
                && chunk_indices(changed).zip(d.chunks(CHUNK)).all(|(i, c)| c == &img[i * CHUNK..(i + 1) * CHUNK])
        }
        (ItemKey::Inode(i), Some(LogItem::Inode(k, d))) => k == i && d == img,
        (ItemKey::Revoke(b), Some(LogItem::Revoke(k))) => k == b,
        _ => false,
    });
    same && decoded.next().is_none()
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
pub fn decode_record(rec: &[u8]) -> Option<Result<Vec<LogItem<'_>>>> {
    if crc_with_hole(rec, 4) != get_u32(rec, 4) {
        return None;
    }
    Some(parse_items(rec))
}

fn parse_items(rec: &[u8]) -> Result<Vec<LogItem<'_>>> {
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
        if at + ITEM_HDR + len > rec.len() {
            return Err(bad(format!("item of {} bytes does not fit", len)));
        }
        let img = &rec[at + ITEM_HDR..at + ITEM_HDR + len];
        let (item, expected) = match kind {
            1 => (LogItem::Block(key, img), BLOCK_SIZE),
            2 => (LogItem::Inode(key, img), INODE_SIZE),
            3 => (LogItem::Revoke(key), 0),
            KIND_CHUNKS if len >= 4 => {
                let changed = get_u32(img, 0);
                // A whole block is logged as kind 1, and a logged block always has its header
                // chunk (the seal's lsn and crc) among its changes.
                if changed == ALL_CHUNKS || changed & 1 == 0 {
                    return Err(bad(format!("block {key}: chunk mask {changed:#x}")));
                }
                (LogItem::Chunks(key, changed, &img[4..]), 4 + CHUNK * changed.count_ones() as usize)
            }
            _ => return Err(bad(format!("item of kind {kind}, {len} bytes"))),
        };
        if len != expected {
            return Err(bad(format!("item of kind {kind}: {len} bytes, not {expected}")));
        }
        items.push(item);
        at += ITEM_HDR + len;
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunk_masks_cover_exactly_the_touched_chunks() {
        assert_eq!(chunks_of(0..0), 0);
        assert_eq!(chunks_of(0..1), 1);
        assert_eq!(chunks_of(127..129), 0b11);
        assert_eq!(chunks_of(128..256), 0b10);
        assert_eq!(chunks_of(0..BLOCK_SIZE), ALL_CHUNKS);
        assert_eq!(chunks_of(BLOCK_SIZE - 1..BLOCK_SIZE), 1 << 31);
        assert_eq!(chunks_of(300..BLOCK_SIZE), ALL_CHUNKS & !0b11);
    }

    /// The record `write_record` writes with pieces of `piece` bytes (record number 5, epoch
    /// 2), built in a buffer that held other bytes, and the (offset, length) of its writes.
    fn encode(piece: usize, items: &[(ItemKey, &[u8], ChunkMask)]) -> (Vec<u8>, Vec<(u64, usize)>) {
        let mut buf = vec![0xa5; BLOCK_SIZE + 100];
        let (mut rec, mut writes) = (Vec::new(), Vec::new());
        let len = write_record(&mut buf, piece, 5, 2, items.iter().copied(), |off, bytes| {
            let end = off as usize + bytes.len();
            rec.resize(rec.len().max(end), 0);
            rec[off as usize..end].copy_from_slice(bytes);
            writes.push((off, bytes.len()));
            Ok::<(), ()>(())
        })
        .unwrap();
        assert_eq!(len as usize, rec.len());
        assert!(
            buf.capacity() < piece + 2 * BLOCK_SIZE || writes.len() == 1,
            "a buffer of {} bytes for pieces of {piece}",
            buf.capacity()
        );
        (rec, writes)
    }

    #[test]
    fn a_record_is_checked_against_the_items_it_was_built_from() {
        let block: Vec<u8> = (0..BLOCK_SIZE).map(|i| (i % 251) as u8).collect();
        let inode = [3u8; INODE_SIZE];
        let items = [
            (ItemKey::Block(100), &block[..], ALL_CHUNKS),
            (ItemKey::Block(101), &block[..], 0b101),
            (ItemKey::Inode(7), &inode[..], ALL_CHUNKS),
            (ItemKey::Revoke(102), &[][..], ALL_CHUNKS),
        ];
        let (rec, _) = encode(RECORD_PIECE, &items);
        assert!(decodes_to(&rec, items.iter().copied()));
        let other = [9u8; INODE_SIZE];
        let mut changed = items;
        changed[2].1 = &other[..];
        assert!(!decodes_to(&rec, changed.iter().copied()), "another inode image");
        changed = items;
        changed[1].2 = 0b111;
        assert!(!decodes_to(&rec, changed.iter().copied()), "another chunk mask");
        assert!(!decodes_to(&rec, items[..3].iter().copied()), "an item too many");
    }

    #[test]
    fn a_record_in_pieces_is_the_same_record_valid_only_once_its_first_block_is_rewritten() {
        let block: Vec<u8> = (0..BLOCK_SIZE).map(|i| (i % 253) as u8).collect();
        let inode = [3u8; INODE_SIZE];
        let items: Vec<(ItemKey, &[u8], ChunkMask)> = (0..9u64)
            .flat_map(|b| {
                [
                    (ItemKey::Block(100 + b), &block[..], if b % 2 == 0 { ALL_CHUNKS } else { 0b1001 }),
                    (ItemKey::Inode(b + 1), &inode[..], ALL_CHUNKS),
                ]
            })
            .collect();
        let (whole, one) = encode(RECORD_PIECE, &items);
        assert_eq!(one, vec![(0, whole.len())], "a record that fits a piece is one write");
        for piece in [BLOCK_SIZE, 2 * BLOCK_SIZE, 3 * BLOCK_SIZE] {
            let (rec, writes) = encode(piece, &items);
            assert_eq!(rec, whole, "pieces of {piece} bytes");
            assert!(writes.len() > 2, "pieces of {piece} bytes: {writes:?}");
            assert_eq!(*writes.last().unwrap(), (0, BLOCK_SIZE), "the first block goes last");
            // Every write but the last, in order: the pieces cover the record contiguously.
            let mut at = 0;
            for &(off, len) in &writes[..writes.len() - 1] {
                assert_eq!(
                    (off as usize, off as usize % BLOCK_SIZE, len % BLOCK_SIZE),
                    (at, 0, 0),
                    "pieces of {piece} bytes: {writes:?}"
                );
                at += len;
            }
            assert_eq!(at, whole.len());
            // Until the first block is written again, its crc is zero: the record is invalid.
            let mut torn = rec.clone();
            put_u32(&mut torn, 4, 0);
            assert!(decode_record(&torn).is_none());
        }
        assert!(decode_record(&whole).expect("crc").is_ok());
    }

    #[test]
    fn a_record_round_trips_whole_and_chunked_blocks() {
        let block: Vec<u8> = (0..BLOCK_SIZE).map(|i| (i / CHUNK) as u8).collect();
        let inode = [7u8; INODE_SIZE];
        let changed = 0b1000_0000_0000_0000_0000_0000_0000_0101;
        let items = [
            (ItemKey::Block(10), &block[..], ALL_CHUNKS),
            (ItemKey::Block(11), &block[..], changed),
            (ItemKey::Inode(3), &inode[..], ALL_CHUNKS),
            (ItemKey::Revoke(12), &[][..], ALL_CHUNKS),
        ];
        let rec = encode(RECORD_PIECE, &items).0;
        assert_eq!(
            rec.len(),
            (RECORD_HDR + items.iter().map(|&(k, _, c)| logged_bytes(k, c)).sum::<usize>())
                .next_multiple_of(BLOCK_SIZE)
        );
        let got = decode_record(&rec).expect("crc").expect("items");
        let chunks: Vec<u8> =
            [0usize, 2, 31].iter().flat_map(|&i| block[i * CHUNK..(i + 1) * CHUNK].to_vec()).collect();
        assert_eq!(
            got,
            vec![
                LogItem::Block(10, &block[..]),
                LogItem::Chunks(11, changed, &chunks[..]),
                LogItem::Inode(3, &inode[..]),
                LogItem::Revoke(12)
            ]
        );
    }

    #[test]
    fn a_chunk_item_without_its_header_chunk_is_corrupt() {
        let block = [0u8; BLOCK_SIZE];
        let mut rec = encode(RECORD_PIECE, &[(ItemKey::Block(10), &block[..], 0b11)]).0;
        put_u32(&mut rec, RECORD_HDR + ITEM_HDR, 0b10);
        let crc = crc_with_hole(&rec, 4);
        put_u32(&mut rec, 4, crc);
        assert!(decode_record(&rec).expect("crc").is_err());
    }
}
