//! Crash recovery: find the newest valid log header, walk the records from its tail while
//! each is valid and next in sequence, and write their images home — except block images
//! that a later record revoked, and images older than the home copy (its lsn says which
//! record it came from, as XFS compares a buffer's LSN). Two passes, as in jbd2: scan
//! (collect revokes, read the home copies' lsns), then replay.

use crate::dev::BlockDevice;
use crate::error::{Error, Result};
use crate::format::log::{
    chunk_indices, decode_record, record_head, ItemKey, LogHeader, LogItem, RecordHead, CHUNK, LOG_HEADER_BLOCKS,
};
use crate::format::{Geometry, BLOCK_SIZE, INODE_SIZE};
use rustc_hash::{FxHashMap, FxHashSet};
use std::collections::hash_map;

/// What recovery found in the log at mount.
#[derive(Debug, Clone)]
pub struct RecoveryReport {
    /// Intact records replayed.
    pub records: u64,
    /// Items in those records (revokes and skipped images included).
    pub items: u64,
    /// Block images skipped because a later record revoked (freed) the block.
    pub revoked: u64,
    /// The header the log now has (or would have, read-only): empty, in a new epoch.
    pub header: LogHeader,
}

struct Record {
    seq: u64,
    bytes: Vec<u8>,
}

/// The newer valid copy of the log header (it is kept in two blocks, written alternately).
///
/// Every writer puts generation `gen` in slot `gen & 1`, one past the other slot's, with a tail
/// no older than the other's (§15.2 of the SPEC). A checksum-valid header that breaks this was
/// not written by us: in the wrong slot it is ignored like a torn one; two valid headers that
/// no sequence of writes leaves are corruption, because trusting either could replay records
/// already written home over newer blocks (a tail behind the real one) or skip records.
pub fn read_log_header(dev: &dyn BlockDevice, geo: &Geometry) -> Result<LogHeader> {
    let log = geo.ag_layout(0).log;
    let ring = geo.log_ring_blocks();
    let mut valid: Vec<LogHeader> = Vec::with_capacity(LOG_HEADER_BLOCKS as usize);
    let mut last_err = None;
    for slot in 0..LOG_HEADER_BLOCKS {
        let mut b = vec![0u8; BLOCK_SIZE];
        dev.read_at(&mut b, (log + slot) * BLOCK_SIZE as u64)?;
        match LogHeader::decode(&b, log + slot, ring) {
            Ok(h) if h.gen & 1 != slot => {
                last_err =
                    Some(Error::corrupt("log header", log + slot, format!("generation {} in slot {slot}", h.gen)))
            }
            // The next header write bumps gen and epoch, and a ring of records the sequence.
            Ok(h) if h.gen == u64::MAX || h.epoch == u64::MAX || h.tail_seq > u64::MAX - ring => {
                last_err = Some(Error::corrupt("log header", log + slot, format!("{h:?}: counters at their end")))
            }
            Ok(h) => valid.push(h),
            Err(e) => last_err = Some(e),
        }
    }
    match valid[..] {
        [] => Err(last_err.expect("a header that is not valid has an error")),
        [h] => Ok(h),
        [a, b] => {
            let (old, new) = if a.gen < b.gen { (a, b) } else { (b, a) };
            let follows = old.gen.checked_add(1) == Some(new.gen)
                && matches!(new.epoch.checked_sub(old.epoch), Some(0 | 1))
                && new.tail_seq >= old.tail_seq;
            if !follows {
                return Err(Error::corrupt(
                    "log header",
                    log + (new.gen & 1),
                    format!("{new:?} cannot follow {old:?} in the other slot"),
                ));
            }
            Ok(new)
        }
        _ => unreachable!("two header slots"),
    }
}

/// Replay the log. With `write == false` the device is only read (and the caller must give
/// an overlay if it wants to see the replayed state).
pub fn recover(dev: &dyn BlockDevice, geo: &Geometry, write: bool) -> Result<RecoveryReport> {
    let h = read_log_header(dev, geo)?;
    let ring_start = geo.ag_layout(0).log + LOG_HEADER_BLOCKS;
    let ring = geo.log_ring_blocks();
    let (records, end) = scan(dev, ring_start, ring, &h)?;
    let next_seq = records.last().map_or(h.tail_seq, |r| r.seq + 1);
    let mut revoke: FxHashMap<u64, u64> = FxHashMap::default();
    // Every (home, record) pair the walk logs: a home copy's lsn is believed only if it names
    // a record of the walk that logged that very home.
    let mut logged: FxHashSet<(ItemKey, u64)> = FxHashSet::default();
    for r in &records {
        for item in decode_record(&r.bytes).expect("checked in scan")? {
            match item {
                LogItem::Revoke(b) => _ = revoke.insert(b, r.seq),
                LogItem::Block(b, _) | LogItem::Chunks(b, ..) => _ = logged.insert((ItemKey::Block(b), r.seq)),
                LogItem::Inode(ino, _) => _ = logged.insert((ItemKey::Inode(ino), r.seq)),
            }
        }
    }
    // The lsn of each home copy that verifies, read before anything is written. Writeback
    // may have put a newer record's image home already (the tail waits for the oldest), so
    // an image older than its home is skipped.
    let mut home_lsn: FxHashMap<ItemKey, Option<u64>> = FxHashMap::default();
    // Homes stamped at or past the walk's head, by a record the walk does not reach.
    let mut ahead: Vec<(ItemKey, u64)> = Vec::new();
    for &(key, seq) in &logged {
        // A block freed in the walk may hold file data at home now: its bytes say nothing.
        let freed = matches!(key, ItemKey::Block(b) if revoke.contains_key(&b));
        if freed {
            continue;
        }
        if let hash_map::Entry::Vacant(e) = home_lsn.entry(key) {
            let lsn = e.insert(verified_home_lsn(dev, geo, key, seq)?);
            ahead.extend(lsn.filter(|&lsn| lsn >= next_seq).map(|lsn| (key, lsn)));
        }
    }
    let tail_seq = sequence_after(dev, ring_start, ring, &h, (end, next_seq), &ahead)?;
    let older_than_home = |key: ItemKey, seq: u64| {
        home_lsn.get(&key).copied().flatten().is_some_and(|lsn| lsn > seq && logged.contains(&(key, lsn)))
    };
    let mut report = RecoveryReport { records: records.len() as u64, items: 0, revoked: 0, header: h };
    let mut block = vec![0u8; BLOCK_SIZE];
    for r in &records {
        for item in decode_record(&r.bytes).expect("checked in scan")? {
            report.items += 1;
            match item {
                LogItem::Block(b, _) | LogItem::Chunks(b, ..) if revoke.get(&b).is_some_and(|&s| s > r.seq) => {
                    report.revoked += 1
                }
                LogItem::Block(b, _) | LogItem::Chunks(b, ..) if older_than_home(ItemKey::Block(b), r.seq) => {}
                LogItem::Inode(ino, _) if older_than_home(ItemKey::Inode(ino), r.seq) => {}
                LogItem::Block(b, img) => dev.write_at(img, checked_block(geo, b, r.seq)? * BLOCK_SIZE as u64)?,
                LogItem::Chunks(b, changed, chunks) => {
                    // Laid over what is home: the block as an earlier record of this replay
                    // left it, or as writeback last wrote it. Every byte that differs from
                    // this record's image is in one of the chunks replayed from here on.
                    let at = checked_block(geo, b, r.seq)? * BLOCK_SIZE as u64;
                    dev.read_at(&mut block, at)?;
                    for (i, chunk) in chunk_indices(changed).zip(chunks.chunks_exact(CHUNK)) {
                        block[i * CHUNK..(i + 1) * CHUNK].copy_from_slice(chunk);
                    }
                    dev.write_at(&block, at)?;
                }
                LogItem::Inode(ino, img) => dev.write_at(img, geo.inode_offset(ino)?)?,
                LogItem::Revoke(_) => {}
            }
        }
    }
    report.header = LogHeader { gen: h.gen + 1, epoch: h.epoch + 1, tail_off: end, tail_seq };
    if write {
        dev.flush()?;
        let blkno = geo.ag_layout(0).log + (report.header.gen & 1);
        dev.write_at(&report.header.encode(blkno)[..], blkno * BLOCK_SIZE as u64)?;
        dev.flush()?;
    }
    Ok(report)
}

/// Where the sequence goes on after recovery (`end`: the ring offset past the walk), given
/// the homes `ahead` of the walk (stamped at or past `next_seq`, the sequence after its
/// last record).
///
/// Such a home was written by a record the walk does not reach. Either the tail is in an
/// older lap of the ring (a crafted or stale header pair, consistent as it may be): the
/// walk's images are older than those homes, and replaying would roll them back. Or the
/// sequence was restarted under homes stamped before (an fsck before the one that keeps
/// sequences going reset the log to sequence 1): the walk's records are newer than those
/// homes, and refusing them would lose what they hold. A record newer than a stale tail's
/// is still in the ring: sequences and epochs only grow, and the ring always holds the
/// records up to the real head, whose sequence is past every home lsn. After a restart, the
/// only records of that sequence are from before it, in an older epoch (the reset went past
/// every epoch its headers named). So a record of the header's epoch or a later one, with a
/// sequence at or past the lowest home lsn ahead, makes the tail stale (corruption); with
/// none, the walk replays whole (no home ahead names a record of it, so none of its images
/// is skipped) and the sequence goes on past the highest home lsn, so that a later crash
/// does not meet those homes again.
///
/// A whole record of the header's epoch or a later one where the walk ended, not taken, also
/// shows a tail that is not the real one (a writer's next record goes right there, and one
/// torn by the crash is not whole): the sequence then goes on past every such record in the
/// ring, and with it past the homes they stamped.
fn sequence_after(
    dev: &dyn BlockDevice,
    ring_start: u64,
    ring: u64,
    h: &LogHeader,
    (end, next_seq): (u64, u64),
    ahead: &[(ItemKey, u64)],
) -> Result<u64> {
    let newest = || newest_record(dev, ring_start, ring, h.epoch);
    let (Some(&(key, lowest)), Some(highest)) =
        (ahead.iter().min_by_key(|(_, lsn)| lsn), ahead.iter().map(|&(_, lsn)| lsn).max())
    else {
        let mut passed = whole_record_at(dev, ring_start, ring, end, h.epoch)?;
        if end != 0 {
            passed = passed.or(whole_record_at(dev, ring_start, ring, 0, h.epoch)?);
        }
        if passed.is_some() {
            let newest = newest()?.expect("a whole record was found");
            // Sequences past the next header's limit were not written by us.
            return Ok(next_seq.max(newest.saturating_add(1).min(u64::MAX - ring)));
        }
        return Ok(next_seq);
    };
    let stale = |why: String| {
        Err(Error::corrupt(
            "log tail",
            h.tail_seq,
            format!("{key:?} at home has lsn {lowest}, newer than the log's last record {}, {why}", next_seq - 1),
        ))
    };
    // The next header's limit, which the following ring of records must not pass.
    if highest >= u64::MAX - ring {
        return stale(format!("and a home has lsn {highest}, past any sequence"));
    }
    if let Some(newest) = newest()?.filter(|&seq| seq >= lowest) {
        return stale(format!("and record {newest} of this epoch or a later one is in the ring: the tail is stale"));
    }
    log::warn!(
        "log: {} home(s) have lsns up to {highest}, past the log's last record {}, and no record in the ring is that \
         new: the sequence was restarted under them (a log reset by an older fsck); replaying, and going on from {}",
        ahead.len(),
        next_seq - 1,
        highest + 1
    );
    Ok(highest + 1)
}

/// The highest sequence of a whole record in the ring of epoch `epoch` or a later one.
fn newest_record(dev: &dyn BlockDevice, ring_start: u64, ring: u64, epoch: u64) -> Result<Option<u64>> {
    let mut newest = None;
    for off in 0..ring {
        if let Some(r) = whole_record_at(dev, ring_start, ring, off, epoch)? {
            newest = newest.max(Some(r.seq));
        }
    }
    Ok(newest)
}

/// The head of the record at ring offset `off` if it is whole (its crc matches), of any
/// sequence, and of epoch `epoch` or a later one.
fn whole_record_at(
    dev: &dyn BlockDevice,
    ring_start: u64,
    ring: u64,
    off: u64,
    epoch: u64,
) -> Result<Option<RecordHead>> {
    let mut first = vec![0u8; BLOCK_SIZE];
    dev.read_at(&mut first, (ring_start + off) * BLOCK_SIZE as u64)?;
    let Some(head) = record_head(&first, ring - off).filter(|head| head.epoch >= epoch) else { return Ok(None) };
    let mut bytes = vec![0u8; head.len_blocks as usize * BLOCK_SIZE];
    dev.read_at(&mut bytes, (ring_start + off) * BLOCK_SIZE as u64)?;
    Ok(decode_record(&bytes).is_some().then_some(head))
}

/// The lsn stamped in `key`'s home copy (logged in record `seq`), if that copy passes the
/// checks its readers make: a torn or never-written home says nothing about its age.
fn verified_home_lsn(dev: &dyn BlockDevice, geo: &Geometry, key: ItemKey, seq: u64) -> Result<Option<u64>> {
    let (at, len) = match key {
        ItemKey::Block(b) => (checked_block(geo, b, seq)? * BLOCK_SIZE as u64, BLOCK_SIZE),
        ItemKey::Inode(ino) => (geo.inode_offset(ino)?, INODE_SIZE),
        ItemKey::Revoke(_) => unreachable!("a revoke has no home copy"),
    };
    let mut home = vec![0u8; len];
    dev.read_at(&mut home, at)?;
    Ok(super::verified_lsn_at(&home, at, geo))
}

/// A logged block image must go to a metadata location: inside the image and not into the
/// log itself. Anything else is a hostile or corrupt record.
fn checked_block(geo: &Geometry, b: u64, seq: u64) -> Result<u64> {
    let l = geo.ag_layout(0);
    if b >= geo.block_count || (b >= l.log && b < l.log + l.log_blocks) {
        return Err(Error::corrupt("log record", seq, format!("item for block {} outside the metadata area", b)));
    }
    Ok(b)
}

/// Walk valid records from the tail. Returns them and the ring offset just past the last.
fn scan(dev: &dyn BlockDevice, ring_start: u64, ring: u64, h: &LogHeader) -> Result<(Vec<Record>, u64)> {
    let mut out = Vec::new();
    let (mut off, mut seq, mut used) = (h.tail_off, h.tail_seq, 0u64);
    while used < ring {
        let found = match read_record(dev, ring_start, ring, off, seq, h.epoch)? {
            Some(r) => Some((off, r)),
            // A record starts at the ring's start only when it does not fit before the end
            // (`Ail::reserve`): one there that would have fit at `off` is an older record, and
            // replaying it would roll newer home blocks back.
            None if off != 0 => read_record(dev, ring_start, ring, 0, seq, h.epoch)?
                .filter(|r| (r.len() / BLOCK_SIZE) as u64 > ring - off)
                .map(|r| (0, r)),
            None => None,
        };
        let Some((at, bytes)) = found else { break };
        let len = (bytes.len() / BLOCK_SIZE) as u64;
        used += len + if at == 0 && off != 0 { ring - off } else { 0 };
        out.push(Record { seq, bytes });
        off = (at + len) % ring;
        seq += 1;
    }
    Ok((out, off))
}

fn read_record(
    dev: &dyn BlockDevice,
    ring_start: u64,
    ring: u64,
    off: u64,
    seq: u64,
    epoch: u64,
) -> Result<Option<Vec<u8>>> {
    let mut first = vec![0u8; BLOCK_SIZE];
    dev.read_at(&mut first, (ring_start + off) * BLOCK_SIZE as u64)?;
    let Some(head) = record_head(&first, ring - off) else { return Ok(None) };
    if head.seq != seq || head.epoch != epoch {
        return Ok(None);
    }
    let mut bytes = vec![0u8; head.len_blocks as usize * BLOCK_SIZE];
    dev.read_at(&mut bytes, (ring_start + off) * BLOCK_SIZE as u64)?;
    match decode_record(&bytes) {
        None => Ok(None),
        Some(Err(e)) => Err(e),
        Some(Ok(_)) => Ok(Some(bytes)),
    }
}
