//! Node layout: the on-disk encoding of leaves and interior nodes, their validation, and the
//! accessors and mutators of a node's bytes.

use super::{MAX_DEPTH, MAX_VALUE};
use crate::buf::BufRef;
use crate::error::{Error, Result};
use crate::format::log::{chunks_of, ChunkMask, ALL_CHUNKS};
use crate::format::{
    get_u16, get_u64, header_magic, header_owner, put_u16, put_u64, BLOCK_SIZE, HDR_SIZE, MAGIC_BTREE,
};

pub(super) const OFF_LEVEL: usize = HDR_SIZE;
pub(super) const OFF_RESERVED_A: usize = HDR_SIZE + 1;
pub(super) const OFF_NKEYS: usize = HDR_SIZE + 2;
pub(super) const OFF_VALUE_START: usize = HDR_SIZE + 4;
pub(super) const OFF_RESERVED_B: usize = HDR_SIZE + 6;
/// First byte after the node header: where slots / interior entries start.
pub const NODE_HDR_END: usize = HDR_SIZE + 16;

pub(super) const LEAF_SLOT: usize = 12;
pub(super) const INTERIOR_ENTRY: usize = 16;
/// Bytes a leaf has for slots and values together.
pub(super) const LEAF_SPACE: usize = BLOCK_SIZE - NODE_HDR_END;
/// Most entries a leaf can hold (all values empty).
pub const LEAF_MAX_ENTRIES: usize = LEAF_SPACE / LEAF_SLOT;
/// Most children an interior node can hold.
pub const INTERIOR_MAX_CHILDREN: usize = (BLOCK_SIZE - NODE_HDR_END) / INTERIOR_ENTRY;

// A leaf split must always leave both halves fitting: that needs room for two largest entries.
const _: () = assert!(2 * (LEAF_SLOT + MAX_VALUE) <= LEAF_SPACE);
// Value offsets (up to and including BLOCK_SIZE) are stored as u16.
const _: () = assert!(BLOCK_SIZE <= u16::MAX as usize);

/// Key range `[lo, hi)` a node must lie in; `hi == None` is unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Bounds {
    pub(super) lo: u64,
    pub(super) hi: Option<u64>,
}

pub(super) const ALL_KEYS: Bounds = Bounds { lo: 0, hi: None };

// ---------------------------------------------------------------------------------------------
// Validation

pub(super) fn corrupt(blkno: u64, detail: impl Into<String>) -> Error {
    Error::corrupt("btree node", blkno, detail)
}

/// The checks of a node read at `buf.blkno`, before any other code here looks at it: its own
/// structure if the buffer is not marked verified yet (or `full`), then marks it; its place in
/// the tree every time. Returns (level, nkeys).
pub(super) fn check_node(
    buf: &BufRef,
    b: &[u8],
    owner: u64,
    level: Option<u8>,
    bounds: Bounds,
    full: bool,
) -> Result<(u8, usize)> {
    check_header(b, buf.blkno, owner)?;
    if full || !buf.is_verified() {
        check_structure(b, buf.blkno).map_err(|detail| corrupt(buf.blkno, detail))?;
        buf.set_verified(true);
    }
    check_place(b, level, bounds).map_err(|detail| corrupt(buf.blkno, detail))?;
    Ok((b[OFF_LEVEL], nkeys_of(b)))
}

/// Everything a node must satisfy. `level` is what the parent implies (None for a root),
/// `bounds` the key range the parent gives it.
pub(super) fn validate(b: &[u8], blkno: u64, owner: u64, level: Option<u8>, bounds: Bounds) -> Result<()> {
    check_header(b, blkno, owner)?;
    check_structure(b, blkno).map_err(|detail| corrupt(blkno, detail))?;
    check_place(b, level, bounds).map_err(|detail| corrupt(blkno, detail))
}

/// The store checks the block header when it reads a block from disk; a cached block reached
/// through another tree's (corrupt) pointer must not pass for one of this tree's nodes.
pub(super) fn check_header(b: &[u8], blkno: u64, owner: u64) -> Result<()> {
    if header_magic(b) != MAGIC_BTREE || header_owner(b) != owner {
        return Err(corrupt(blkno, format!("not a btree node of owner {owner}")));
    }
    Ok(())
}

/// What a node must satisfy on its own, whatever its parent: validated once per buffer.
pub(super) fn check_structure(b: &[u8], blkno: u64) -> std::result::Result<(), String> {
    let level = b[OFF_LEVEL];
    if usize::from(level) >= MAX_DEPTH {
        return Err(format!("level {level} beyond the depth limit"));
    }
    if b[OFF_RESERVED_A] != 0 || b[OFF_RESERVED_B..NODE_HDR_END].iter().any(|&x| x != 0) {
        return Err("reserved header bytes set".into());
    }
    let n = nkeys_of(b);
    if level == 0 {
        check_leaf(b, n)
    } else {
        check_interior(b, blkno, n)
    }
}

/// What depends on the parent: the level it implies and the key range it gives. O(1): the
/// structure check proved the keys ascend, so the first and the last bound them all.
pub(super) fn check_place(b: &[u8], level: Option<u8>, bounds: Bounds) -> std::result::Result<(), String> {
    let found = b[OFF_LEVEL];
    if level.is_some_and(|l| l != found) {
        return Err(format!("level {found}, expected {level:?}"));
    }
    let n = nkeys_of(b);
    let (first, last) = if found == 0 {
        // Leaf keys may equal the lower bound.
        (leaf_key(b, 0), leaf_key(b, n - 1))
    } else if n >= 2 {
        // Separators must leave the child before them a non-empty range.
        let first = interior_key(b, 1);
        if first == bounds.lo {
            return Err(format!("separator {first} at the lower bound of {bounds:?}"));
        }
        (first, interior_key(b, n - 1))
    } else {
        return Ok(());
    };
    if first < bounds.lo || bounds.hi.is_some_and(|hi| last >= hi) {
        return Err(format!("keys {first}..={last} outside {bounds:?}"));
    }
    Ok(())
}

pub(super) fn check_leaf(b: &[u8], n: usize) -> std::result::Result<(), String> {
    if n == 0 || n > LEAF_MAX_ENTRIES {
        return Err(format!("leaf with {n} entries"));
    }
    let value_start = value_start_of(b);
    if value_start < slot(n) || value_start > BLOCK_SIZE {
        return Err(format!("value area starts at {value_start} with {n} slots"));
    }
    // (offset, len) packed so that sorting orders by offset, then length.
    let mut spans = [0u32; LEAF_MAX_ENTRIES];
    for (i, span) in spans.iter_mut().enumerate().take(n) {
        let (off, len) = value_span(b, i);
        if len > MAX_VALUE || off < value_start || off + len > BLOCK_SIZE {
            return Err(format!("slot {i}: value {off}+{len} outside [{value_start}, {BLOCK_SIZE})"));
        }
        *span = ((off as u32) << 16) | len as u32;
    }
    let spans = &mut spans[..n];
    spans.sort_unstable();
    let mut end = value_start;
    for span in spans.iter() {
        let (off, len) = ((span >> 16) as usize, (span & 0xffff) as usize);
        if off < end {
            return Err(format!("value at {off} overlaps the one ending at {end}"));
        }
        end = off + len;
    }
    check_ascending((0..n).map(|i| leaf_key(b, i)))
}

pub(super) fn check_interior(b: &[u8], blkno: u64, n: usize) -> std::result::Result<(), String> {
    if n == 0 || n > INTERIOR_MAX_CHILDREN {
        return Err(format!("interior node with {n} children"));
    }
    if value_start_of(b) != 0 {
        return Err("interior node with a value area".into());
    }
    if interior_key(b, 0) != 0 {
        return Err("interior node whose first key is not 0".into());
    }
    // (A child equal to the node would also fail the level rule; this names the fault.)
    if let Some(i) = (0..n).find(|&i| interior_child(b, i) == 0 || interior_child(b, i) == blkno) {
        return Err(format!("child {i} points to block {}", interior_child(b, i)));
    }
    check_ascending((1..n).map(|i| interior_key(b, i)))
}

/// Keys strictly ascending.
pub(super) fn check_ascending(mut keys: impl Iterator<Item = u64>) -> std::result::Result<(), String> {
    let Some(mut prev) = keys.next() else {
        return Ok(());
    };
    for key in keys {
        if key <= prev {
            return Err(format!("key {key} after {prev}"));
        }
        prev = key;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Node access. Readers assume a node that passed `check_node`.

pub(super) fn nkeys_of(b: &[u8]) -> usize {
    usize::from(get_u16(b, OFF_NKEYS))
}

pub(super) fn value_start_of(b: &[u8]) -> usize {
    usize::from(get_u16(b, OFF_VALUE_START))
}

/// Write the node header; leaves the common block header (crc, lsn) to the journal.
pub(super) fn write_node_header(b: &mut [u8], level: u8, nkeys: usize, value_start: usize) {
    b[HDR_SIZE..NODE_HDR_END].fill(0);
    b[OFF_LEVEL] = level;
    put_u16(b, OFF_NKEYS, nkeys as u16);
    put_u16(b, OFF_VALUE_START, value_start as u16);
}

/// First index in `lo..hi` where `below` turns false (`below` holds on a prefix).
pub(super) fn partition_point(mut lo: usize, mut hi: usize, below: impl Fn(usize) -> bool) -> usize {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if below(mid) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo
}

pub(super) fn slot(i: usize) -> usize {
    NODE_HDR_END + i * LEAF_SLOT
}

pub(super) fn leaf_key(b: &[u8], i: usize) -> u64 {
    get_u64(b, slot(i))
}

pub(super) fn value_span(b: &[u8], i: usize) -> (usize, usize) {
    (usize::from(get_u16(b, slot(i) + 8)), usize::from(get_u16(b, slot(i) + 10)))
}

pub(super) fn leaf_value(b: &[u8], i: usize) -> &[u8] {
    let (off, len) = value_span(b, i);
    &b[off..off + len]
}

pub(super) fn write_slot(b: &mut [u8], i: usize, key: u64, off: usize, len: usize) {
    put_u64(b, slot(i), key);
    put_u16(b, slot(i) + 8, off as u16);
    put_u16(b, slot(i) + 10, len as u16);
}

/// Index of `key`, or the index it would be inserted at.
pub(super) fn leaf_search(b: &[u8], n: usize, key: u64) -> std::result::Result<usize, usize> {
    let i = partition_point(0, n, |i| leaf_key(b, i) < key);
    if i < n && leaf_key(b, i) == key {
        Ok(i)
    } else {
        Err(i)
    }
}

/// Bytes still free for slots and values once dead value bytes are compacted away.
pub(super) fn leaf_room(b: &[u8], n: usize) -> usize {
    let live: usize = (0..n).map(|i| LEAF_SLOT + value_span(b, i).1).sum();
    LEAF_SPACE - live
}

/// Whether a new entry with a `len`-byte value fits (`leaf_room >= LEAF_SLOT + len`): at once
/// if it fits the gap between slots and values, else counting the garbage compaction frees.
pub(super) fn put_fits(b: &[u8], n: usize, len: usize) -> bool {
    value_start_of(b) >= slot(n + 1) + len || leaf_room(b, n) >= LEAF_SLOT + len
}

/// Whether entry `i`'s value can be replaced by a `len`-byte one (`leaf_room` plus the old
/// value `>= len`): at once if it is no longer or fits the gap, else counting the garbage.
pub(super) fn replace_fits(b: &[u8], n: usize, i: usize, len: usize) -> bool {
    let old = value_span(b, i).1;
    len <= old || value_start_of(b) >= slot(n) + len || leaf_room(b, n) + old >= len
}

/// The chunks of the node header (`nkeys`, `value_start`, and interior entry 0's key).
pub(super) fn header_chunks() -> ChunkMask {
    chunks_of(0..NODE_HDR_END)
}

// The mutators below return the chunks they changed, for the log (`Buf::change`).

/// Drop slot `i`; its value bytes become garbage until the next compaction.
pub(super) fn leaf_delete(b: &mut [u8], n: usize, i: usize) -> ChunkMask {
    b.copy_within(slot(i + 1)..slot(n), slot(i));
    b[slot(n - 1)..slot(n)].fill(0);
    put_u16(b, OFF_NKEYS, (n - 1) as u16);
    header_chunks() | chunks_of(slot(i)..slot(n))
}

/// Insert a slot at `i`; the caller has checked `put_fits`.
pub(super) fn leaf_put(b: &mut [u8], n: usize, i: usize, key: u64, value: &[u8]) -> ChunkMask {
    let compacted = if value_start_of(b) < slot(n + 1) + value.len() { compact_leaf(b, n) } else { 0 };
    let off = value_start_of(b) - value.len();
    b[off..off + value.len()].copy_from_slice(value);
    b.copy_within(slot(i)..slot(n), slot(i + 1));
    write_slot(b, i, key, off, value.len());
    put_u16(b, OFF_NKEYS, (n + 1) as u16);
    put_u16(b, OFF_VALUE_START, off as u16);
    compacted | header_chunks() | chunks_of(off..off + value.len()) | chunks_of(slot(i)..slot(n + 1))
}

/// Replace slot `i`'s value; the caller has checked `replace_fits`. A value no longer than the
/// old one is written over it (the old one's tail becomes garbage); a longer one goes below
/// the value area, which is compacted first (without the old value) if it has no room.
pub(super) fn leaf_replace(b: &mut [u8], n: usize, i: usize, value: &[u8]) -> ChunkMask {
    let (off, len) = value_span(b, i);
    let key = leaf_key(b, i);
    if value.len() <= len {
        b[off..off + value.len()].copy_from_slice(value);
        write_slot(b, i, key, off, value.len());
        return chunks_of(off..off + value.len()) | chunks_of(slot(i)..slot(i + 1));
    }
    let compacted = if value_start_of(b) - slot(n) < value.len() {
        // The old value is dead: an empty value at the same offset drops it from compaction.
        write_slot(b, i, key, off, 0);
        compact_leaf(b, n)
    } else {
        0
    };
    let off = value_start_of(b) - value.len();
    b[off..off + value.len()].copy_from_slice(value);
    write_slot(b, i, key, off, value.len());
    put_u16(b, OFF_VALUE_START, off as u16);
    compacted | header_chunks() | chunks_of(off..off + value.len()) | chunks_of(slot(i)..slot(i + 1))
}

pub(super) fn compact_leaf(b: &mut [u8], n: usize) -> ChunkMask {
    let mut old = [0u8; BLOCK_SIZE];
    old.copy_from_slice(b);
    build_leaf(b, (0..n).map(|i| (leaf_key(&old, i), leaf_value(&old, i))))
}

/// Write a leaf holding `entries` (sorted, known to fit) with its values packed, no garbage.
pub(super) fn build_leaf<'v>(b: &mut [u8], entries: impl IntoIterator<Item = (u64, &'v [u8])>) -> ChunkMask {
    let mut end = BLOCK_SIZE;
    let mut n = 0;
    for (key, value) in entries {
        end -= value.len();
        b[end..end + value.len()].copy_from_slice(value);
        write_slot(b, n, key, end, value.len());
        n += 1;
    }
    b[slot(n)..end].fill(0);
    write_node_header(b, 0, n, end);
    ALL_CHUNKS
}

pub(super) fn entry(i: usize) -> usize {
    NODE_HDR_END + i * INTERIOR_ENTRY
}

pub(super) fn interior_key(b: &[u8], i: usize) -> u64 {
    get_u64(b, entry(i))
}

pub(super) fn interior_child(b: &[u8], i: usize) -> u64 {
    get_u64(b, entry(i) + 8)
}

/// Child `i`'s key range inside its parent's range `bounds`.
pub(super) fn child_bounds(b: &[u8], n: usize, i: usize, bounds: Bounds) -> Bounds {
    Bounds {
        lo: if i == 0 { bounds.lo } else { interior_key(b, i) },
        hi: if i + 1 < n { Some(interior_key(b, i + 1)) } else { bounds.hi },
    }
}

/// The child whose range holds `key`: the last one whose separator is <= key (child 0 if none).
pub(super) fn route(b: &[u8], n: usize, key: u64) -> usize {
    partition_point(1, n, |i| interior_key(b, i) <= key) - 1
}

/// Insert `(sep, child)` as entry `at` (>= 1) of an interior node with `n` < capacity entries.
pub(super) fn interior_insert(b: &mut [u8], n: usize, at: usize, (sep, child): (u64, u64)) -> ChunkMask {
    debug_assert!(at >= 1 && n < INTERIOR_MAX_CHILDREN);
    b.copy_within(entry(at)..entry(n), entry(at + 1));
    put_u64(b, entry(at), sep);
    put_u64(b, entry(at) + 8, child);
    put_u16(b, OFF_NKEYS, (n + 1) as u16);
    header_chunks() | chunks_of(entry(at)..entry(n + 1))
}

/// Remove entry `i` of an interior node with `n` > 1 entries; the first key stays 0.
pub(super) fn interior_remove(b: &mut [u8], n: usize, i: usize) -> ChunkMask {
    b.copy_within(entry(i + 1)..entry(n), entry(i));
    b[entry(n - 1)..entry(n)].fill(0);
    put_u64(b, entry(0), 0);
    put_u16(b, OFF_NKEYS, (n - 1) as u16);
    header_chunks() | chunks_of(entry(0)..entry(1)) | chunks_of(entry(i)..entry(n))
}

/// Write an interior node; the first key is stored as 0 whatever `entries` says, since it
/// stands for the lower bound the parent gives.
pub(super) fn build_interior(b: &mut [u8], level: u8, entries: &[(u64, u64)]) -> ChunkMask {
    for (i, &(key, child)) in entries.iter().enumerate() {
        put_u64(b, entry(i), if i == 0 { 0 } else { key });
        put_u64(b, entry(i) + 8, child);
    }
    b[entry(entries.len())..].fill(0);
    write_node_header(b, level, entries.len(), 0);
    ALL_CHUNKS
}
