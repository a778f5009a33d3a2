//! Extended attributes: small ones inline in the inode's 48-byte xattr area, the rest in a
//! per-inode B+tree keyed by name hash (the same hashed-name index as directories). A value
//! longer than [`LOCAL_VALUE_MAX`] lives out of line in value blocks of its own (SPEC §14.3);
//! its tree record names them.
//!
//! Inline area: entries `name_len u8 | value_len u8 | name | value`, packed from the start;
//! a zero `name_len` ends the list. B+tree record, local value: `name_len u8 | name | value`;
//! remote value: `0 u8 | name_len u8 | name | value_len u32 | block u64 × value_blocks`.

use crate::btree::{self, NodeStore};
use crate::dir::probe_hashed;
use crate::error::{Error, Result};
use crate::format::inode::XATTR_INLINE_SIZE;
use crate::format::log::ALL_CHUNKS;
use crate::format::{
    get_u32, header_magic, header_owner, init_header, DiskInode, BLOCK_SIZE, HDR_SIZE, MAGIC_DATA_META, XATTR_VALUE_MAX,
};
use crate::mount::Mount;
use crate::store::{ReadStore, TxStore};

pub const XATTR_NAME_MAX: usize = 255;
/// The largest value kept in its tree record; a longer one goes to value blocks. Values up
/// to this size are stored exactly as before value blocks existed.
pub const LOCAL_VALUE_MAX: usize = 1024;
/// Value bytes one value block holds (after its common header).
pub const VALUE_BLOCK_BYTES: usize = BLOCK_SIZE - HDR_SIZE;
/// setxattr(2)'s flag: fail with EEXIST if the attribute exists.
pub const XATTR_CREATE: u32 = 1;
/// setxattr(2)'s flag: fail with ENODATA if the attribute does not exist.
pub const XATTR_REPLACE: u32 = 2;

/// Value blocks a value of `len` bytes takes (0 for a local value).
pub fn value_blocks(len: usize) -> u64 {
    if len > LOCAL_VALUE_MAX {
        len.div_ceil(VALUE_BLOCK_BYTES) as u64
    } else {
        0
    }
}
/// Value blocks one transaction may free while an inode's attributes are being freed
/// ([`free_values`]): each is a revoke record in the log.
pub const FREE_BATCH_BLOCKS: u64 = 1024;

const _: () = assert!(2 + XATTR_NAME_MAX + 4 + 8 * XATTR_VALUE_MAX.div_ceil(VALUE_BLOCK_BYTES) <= btree::MAX_VALUE);

/// The value part of a tree record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Value<'a> {
    Local(&'a [u8]),
    /// Out of line: the value's length and its value blocks' numbers (u64 each, in order).
    Remote {
        len: usize,
        blocks: &'a [u8],
    },
}

impl Value<'_> {
    pub fn size(&self) -> usize {
        match *self {
            Value::Local(v) => v.len(),
            Value::Remote { len, .. } => len,
        }
    }
    /// The value blocks (none for a local value).
    pub fn blocks(&self) -> impl Iterator<Item = u64> + '_ {
        let raw: &[u8] = match self {
            Value::Local(_) => &[],
            Value::Remote { blocks, .. } => blocks,
        };
        raw.chunks_exact(8).map(|b| u64::from_le_bytes(b.try_into().unwrap()))
    }
}

/// A decoded xattr tree record.
#[derive(Debug)]
pub struct Record<'a> {
    pub name: &'a [u8],
    pub value: Value<'a>,
}

/// Decode a tree record; None if it is malformed (damage).
pub fn decode_record(v: &[u8]) -> Option<Record<'_>> {
    let remote = *v.first()? == 0;
    let at = usize::from(remote);
    let nl = usize::from(*v.get(at)?);
    let name = v.get(at + 1..at + 1 + nl)?;
    if nl == 0 || name.contains(&0) {
        return None;
    }
    let rest = &v[at + 1 + nl..];
    let value = if remote {
        let len = get_u32(rest.get(..4)?, 0) as usize;
        let blocks = &rest[4..];
        let valid = len > LOCAL_VALUE_MAX && len <= XATTR_VALUE_MAX && blocks.len() as u64 == 8 * value_blocks(len);
        valid.then_some(Value::Remote { len, blocks })?
    } else {
        (rest.len() <= LOCAL_VALUE_MAX).then_some(Value::Local(rest))?
    };
    Some(Record { name, value })
}

/// The name of a tree record; None for a record no valid name fits (damage).
fn tree_name(v: &[u8]) -> Option<&[u8]> {
    decode_record(v).map(|r| r.name)
}

pub(crate) fn inline_entries(di: &DiskInode) -> Vec<(Vec<u8>, Vec<u8>)> {
    let a = di.xattr_inline.bytes();
    let mut out = Vec::new();
    let mut at = 0;
    while at + 2 <= a.len() && a[at] != 0 {
        let (nl, vl) = (a[at] as usize, a[at + 1] as usize);
        if at + 2 + nl + vl > a.len() {
            break; // decode() rejects an overrunning list; stop defensively all the same.
        }
        out.push((a[at + 2..at + 2 + nl].to_vec(), a[at + 2 + nl..at + 2 + nl + vl].to_vec()));
        at += 2 + nl + vl;
    }
    out
}

fn inline_bytes(entries: &[(Vec<u8>, Vec<u8>)]) -> usize {
    entries.iter().map(|(n, v)| 2 + n.len() + v.len()).sum()
}

fn store_inline(di: &mut DiskInode, entries: &[(Vec<u8>, Vec<u8>)]) {
    debug_assert!(inline_bytes(entries) <= XATTR_INLINE_SIZE);
    if entries.is_empty() {
        di.xattr_inline.clear();
        return;
    }
    let a = di.xattr_inline.bytes_mut();
    a.fill(0);
    let mut at = 0;
    for (n, v) in entries {
        a[at] = n.len() as u8;
        a[at + 1] = v.len() as u8;
        a[at + 2..at + 2 + n.len()].copy_from_slice(n);
        a[at + 2 + n.len()..at + 2 + n.len() + v.len()].copy_from_slice(v);
        at += 2 + n.len() + v.len();
    }
}

fn check(name: &[u8], value_len: usize) -> Result<()> {
    if name.is_empty() || name.contains(&0) {
        return Err(Error::Invalid("xattr name"));
    }
    if name.len() > XATTR_NAME_MAX {
        return Err(Error::Range);
    }
    if value_len > XATTR_VALUE_MAX {
        return Err(Error::TooBig);
    }
    Ok(())
}

/// Most value blocks one value may take on this file system. A transaction must fit a
/// quarter of the log's ring (the CIL's bound), with room for the tree nodes, bitmap blocks
/// and inode it logs besides; only logs far below mkfs's 512-block minimum default lower it
/// under a 64 KiB value's 17 blocks.
fn max_value_blocks(m: &Mount) -> u64 {
    (m.geo.log_ring_blocks() / 4).saturating_sub(crate::file::MAP_RESERVE + 2)
}

const VALUE_BLOCK: &str = "xattr value block";

fn check_value_pointer(m: &Mount, blkno: u64) -> Result<()> {
    if m.geo.is_data_range(blkno, 1) {
        Ok(())
    } else {
        Err(Error::corrupt(VALUE_BLOCK, blkno, "pointer outside the data area"))
    }
}

fn read_remote(m: &Mount, ino: u64, value: Value) -> Result<Vec<u8>> {
    let mut out = Vec::with_capacity(value.size());
    for blkno in value.blocks() {
        check_value_pointer(m, blkno)?;
        let b = m.bufs.read(blkno, VALUE_BLOCK, MAGIC_DATA_META, Some(ino))?;
        let d = b.read();
        // A cache hit skips read's header check: the pointer may name a block cached as
        // another structure.
        if header_magic(&d[..]) != MAGIC_DATA_META || header_owner(&d[..]) != ino {
            return Err(Error::corrupt(VALUE_BLOCK, blkno, format!("not a value block of inode {ino}")));
        }
        let take = (value.size() - out.len()).min(VALUE_BLOCK_BYTES);
        out.extend_from_slice(&d[HDR_SIZE..HDR_SIZE + take]);
    }
    debug_assert_eq!(out.len(), value.size());
    Ok(out)
}

pub fn get(m: &Mount, ino: u64, di: &DiskInode, name: &[u8]) -> Result<Vec<u8>> {
    check(name, 0)?;
    if let Some((_, v)) = inline_entries(di).into_iter().find(|(n, _)| n == name) {
        return Ok(v);
    }
    let (found, _) =
        probe_hashed(&mut ReadStore::new(m, ino), di.xattr_root, name, &tree_name, ino, &|_, v| Ok(v.to_vec()))?;
    let rec = found.ok_or(Error::NoAttr)?;
    match decode_record(&rec).map(|r| r.value) {
        Some(Value::Local(v)) => Ok(v.to_vec()),
        Some(remote) => read_remote(m, ino, remote),
        None => Err(Error::corrupt("xattr", ino, "malformed record")),
    }
}

pub fn list(m: &Mount, ino: u64, di: &DiskInode) -> Result<Vec<Vec<u8>>> {
    let mut names: Vec<Vec<u8>> = inline_entries(di).into_iter().map(|(n, _)| n).collect();
    if di.xattr_root != 0 {
        btree::range(&mut ReadStore::new(m, ino), di.xattr_root, 0, &mut |k, v| {
            names.push(tree_name(v).ok_or_else(|| Error::corrupt("xattr", ino, format!("key {:#x}", k)))?.to_vec());
            Ok(names.len() < 1 << 20)
        })?;
    }
    Ok(names)
}

/// The tree record for `name` = `value`; a value longer than LOCAL_VALUE_MAX is written to
/// new value blocks here, logged whole in the same transaction as the record.
fn encode_record(s: &mut TxStore, name: &[u8], value: &[u8]) -> Result<Vec<u8>> {
    let mut rec = Vec::with_capacity(2 + name.len() + value.len().min(LOCAL_VALUE_MAX + 1));
    if value.len() <= LOCAL_VALUE_MAX {
        rec.push(name.len() as u8);
        rec.extend_from_slice(name);
        rec.extend_from_slice(value);
    } else {
        rec.extend_from_slice(&[0, name.len() as u8]);
        rec.extend_from_slice(name);
        rec.extend_from_slice(&(value.len() as u32).to_le_bytes());
        let owner = s.owner();
        for part in value.chunks(VALUE_BLOCK_BYTES) {
            // Allocated and counted in the inode's blocks as the tree's nodes are.
            let b = s.new_node()?;
            let blkno = b.blkno;
            b.change(|d| {
                init_header(d, MAGIC_DATA_META, blkno, owner);
                d[HDR_SIZE..HDR_SIZE + part.len()].copy_from_slice(part);
                ALL_CHUNKS
            });
            s.dirty(&b);
            rec.extend_from_slice(&blkno.to_le_bytes());
        }
    }
    debug_assert!(decode_record(&rec).is_some_and(|r| r.name == name && r.value.size() == value.len()));
    Ok(rec)
}

/// Free the value blocks of a record that left the tree (none for a local value).
fn free_value(s: &mut TxStore, rec: &[u8]) -> Result<()> {
    let Some(r) = decode_record(rec) else { return Ok(()) };
    for blkno in r.value.blocks() {
        check_value_pointer(s.tx.mount(), blkno)?;
        s.free_node(blkno)?;
    }
    Ok(())
}

/// Set `name`; `flags` are XATTR_CREATE / XATTR_REPLACE. Reserve [`set_reserve`] blocks
/// first.
pub fn set(s: &mut TxStore, ino: u64, di: &mut DiskInode, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
    check(name, value.len())?;
    if value_blocks(value.len()) > max_value_blocks(s.tx.mount()) {
        return Err(Error::NoSpace);
    }
    let mut inline = inline_entries(di);
    let in_inline = inline.iter().position(|(n, _)| n == name);
    let (in_tree, free) = probe_hashed(s, di.xattr_root, name, &tree_name, ino, &|k, v| Ok((k, v.to_vec())))?;
    let exists = in_inline.is_some() || in_tree.is_some();
    if exists && flags & XATTR_CREATE != 0 {
        return Err(Error::Exists);
    }
    if !exists && flags & XATTR_REPLACE != 0 {
        return Err(Error::NoAttr);
    }
    if let Some(i) = in_inline {
        inline.remove(i);
    }
    let mut root = di.xattr_root;
    if let Some((k, old)) = &in_tree {
        btree::remove(s, &mut root, *k)?;
        free_value(s, old)?;
    }
    let fits_inline = value.len() < 256 && inline_bytes(&inline) + 2 + name.len() + value.len() <= XATTR_INLINE_SIZE;
    if fits_inline {
        inline.push((name.to_vec(), value.to_vec()));
    } else {
        let key = in_tree.map(|(k, _)| k).or(free).ok_or(Error::NoSpace)?;
        let rec = encode_record(s, name, value)?;
        btree::insert(s, &mut root, key, &rec)?;
    }
    store_inline(di, &inline);
    di.xattr_root = root;
    Ok(())
}

/// Blocks to reserve for setting a value of `value_len` bytes: its value blocks and the
/// tree's splits.
pub fn set_reserve(value_len: usize) -> u64 {
    crate::file::MAP_RESERVE + value_blocks(value_len)
}

pub fn remove(s: &mut TxStore, ino: u64, di: &mut DiskInode, name: &[u8]) -> Result<()> {
    check(name, 0)?;
    let mut inline = inline_entries(di);
    if let Some(i) = inline.iter().position(|(n, _)| n == name) {
        inline.remove(i);
        store_inline(di, &inline);
        return Ok(());
    }
    let (found, _) = probe_hashed(s, di.xattr_root, name, &tree_name, ino, &|k, v| Ok((k, v.to_vec())))?;
    let (k, old) = found.ok_or(Error::NoAttr)?;
    let mut root = di.xattr_root;
    btree::remove(s, &mut root, k)?;
    free_value(s, &old)?;
    di.xattr_root = root;
    Ok(())
}

/// Remove attributes that have value blocks until about `max_blocks` value blocks are freed
/// (the inode is being freed, a batch per transaction). Returns whether none is left.
pub fn free_values(s: &mut TxStore, di: &mut DiskInode, max_blocks: u64) -> Result<bool> {
    if di.xattr_root == 0 {
        return Ok(true);
    }
    let mut remote = Vec::new();
    let mut blocks = 0;
    let mut done = true;
    btree::range(s, di.xattr_root, 0, &mut |k, v| {
        let n = decode_record(v).map_or(0, |r| value_blocks(r.value.size()));
        if n > 0 && blocks + n > max_blocks && !remote.is_empty() {
            done = false;
            return Ok(false);
        }
        if n > 0 {
            blocks += n;
            remote.push((k, v.to_vec()));
        }
        Ok(true)
    })?;
    let mut root = di.xattr_root;
    for (k, rec) in remote {
        btree::remove(s, &mut root, k)?;
        free_value(s, &rec)?;
    }
    di.xattr_root = root;
    Ok(done)
}

/// Free the xattr B+tree and the value blocks still in it (the inode is being freed; a
/// large set of value blocks is freed in batches by [`free_values`] first).
pub fn destroy(s: &mut TxStore, di: &mut DiskInode) -> Result<()> {
    if di.xattr_root != 0 {
        free_values(s, di, u64::MAX)?;
    }
    if di.xattr_root != 0 {
        btree::destroy(s, di.xattr_root)?;
        di.xattr_root = 0;
    }
    di.xattr_inline.clear();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_refused() {
        let local = [&[3u8][..], b"abc", b"value"].concat();
        let r = decode_record(&local).unwrap();
        assert_eq!((r.name, r.value), (&b"abc"[..], Value::Local(b"value")));
        let mut remote = [&[0u8, 3][..], b"abc", &5000u32.to_le_bytes()].concat();
        remote.extend([7u64, 9].iter().flat_map(|b| b.to_le_bytes()));
        let r = decode_record(&remote).unwrap();
        assert_eq!((r.name, r.value.size(), r.value.blocks().collect::<Vec<_>>()), (&b"abc"[..], 5000, vec![7, 9]));
        assert!(decode_record(&remote[..remote.len() - 8]).is_none(), "a block missing");
        let mut small = remote.clone();
        small[5..9].copy_from_slice(&1024u32.to_le_bytes());
        assert!(decode_record(&small).is_none(), "a remote value short enough to be local");
        assert!(decode_record(&[0, 0, 1, 2]).is_none(), "an empty name");
        assert!(decode_record(&[2, b'a', 0]).is_none(), "a NUL in the name");
        assert!(decode_record(&[5, b'a']).is_none(), "a name past the record");
        assert!(
            decode_record(&[[1u8, b'a'].as_slice(), &[0; LOCAL_VALUE_MAX + 1]].concat()).is_none(),
            "a local value too long"
        );
        assert_eq!(value_blocks(LOCAL_VALUE_MAX), 0);
        assert_eq!(value_blocks(XATTR_VALUE_MAX), 17);
    }
}
