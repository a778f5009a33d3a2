//! Directories: a B+tree per directory keyed by name hash, so lookup, insert and remove are
//! O(log n) however many entries a directory holds.
//!
//! Key: `hash46(name) << 16 | c`, where `c` is the lowest collision index free for that hash
//! when the entry was inserted. An entry keeps its key for life, so the readdir cookie
//! `key + 3` is stable under concurrent inserts and removes ("." and ".." are cookies 1, 2).
//! Value: `ino u64 | file type u8 | name`.

use crate::btree::{self, NodeStore};
use crate::error::{Error, Result};
use crate::format::{get_u64, DiskInode, Fork, NAME_MAX};
use crate::mount::Mount;
use crate::store::{ReadStore, TxStore};
use smallvec::SmallVec;

/// Worst-case blocks an insert can allocate (a split at every level plus a new root).
pub const INSERT_RESERVE: u64 = 8;
const COLLISIONS_MAX: u64 = 1 << 16;
pub const COOKIE_DOT: u64 = 1;
pub const COOKIE_DOTDOT: u64 = 2;

/// FNV-1a, 64-bit; the top 46 bits. Part of the on-disk format: never change it.
pub fn name_hash(name: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in name {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h >> 18
}

pub fn check_name(name: &[u8]) -> Result<()> {
    // One pass over the name (a name is short: two memchr calls cost more).
    if name.is_empty() || name == b"." || name == b".." || name.iter().any(|&c| c == b'/' || c == 0) {
        return Err(Error::Invalid("file name"));
    }
    if name.len() > NAME_MAX {
        return Err(Error::NameTooLong);
    }
    Ok(())
}

pub fn root_of(di: &DiskInode) -> u64 {
    match di.fork {
        Fork::Btree(r) => r,
        _ => 0,
    }
}

pub fn set_root(di: &mut DiskInode, root: u64) {
    di.fork = if root == 0 { Fork::Empty } else { Fork::Btree(root) };
}

/// A directory entry without its name: lookups know the name already, and readdir hands it
/// out borrowed from the node, so neither allocates per entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub key: u64,
    pub ino: u64,
    pub ftype: u8,
}

fn decode(key: u64, v: &[u8], dir: u64) -> Result<(Entry, &[u8])> {
    let name = entry_name(v).ok_or_else(|| {
        Error::corrupt(
            "directory entry",
            dir,
            format!("key {key:#x}: value of {} bytes or a name no caller could give", v.len()),
        )
    })?;
    Ok((Entry { key, ino: get_u64(v, 0), ftype: v[8] }, name))
}

/// An entry's value, on the stack: a create or rename encodes one.
fn encode(ino: u64, ftype: u8, name: &[u8]) -> SmallVec<[u8; 9 + NAME_MAX]> {
    let mut v = SmallVec::new();
    v.extend_from_slice(&ino.to_le_bytes());
    v.push(ftype);
    v.extend_from_slice(name);
    v
}

/// The hashed-name index shared by directories and xattrs: scan the collision range of
/// `name` for the record whose name (`name_of` extracts it) matches, and find the lowest free
/// collision index. Returns what `found` makes of the match's key and value, and the free key.
pub(crate) fn probe_hashed<T>(
    store: &mut dyn NodeStore,
    root: u64,
    name: &[u8],
    name_of: &dyn Fn(&[u8]) -> Option<&[u8]>,
    owner: u64,
    found_as: &dyn Fn(u64, &[u8]) -> Result<T>,
) -> Result<(Option<T>, Option<u64>)> {
    let base = name_hash(name) << 16;
    let (mut found, mut next_free) = (None, Some(base));
    if root == 0 {
        return Ok((None, next_free));
    }
    btree::range(store, root, base, &mut |k, v| {
        if k >= base + COLLISIONS_MAX {
            return Ok(false);
        }
        if next_free == Some(k) {
            next_free = if k + 1 < base + COLLISIONS_MAX { Some(k + 1) } else { None };
        }
        match name_of(v) {
            Some(n) if n == name => {
                found = Some(found_as(k, v)?);
                Ok(false)
            }
            Some(_) => Ok(true),
            None => Err(Error::corrupt("hashed name record", owner, format!("key {:#x}: malformed value", k))),
        }
    })?;
    Ok((found, next_free))
}

/// The name of a stored entry; None when the value is malformed or the name breaks the
/// rules `check_name` enforces on the way in (damage: readdir must not hand out a name that
/// lookup would refuse).
fn entry_name(v: &[u8]) -> Option<&[u8]> {
    let name = v.get(9..)?;
    check_name(name).is_ok().then_some(name)
}

fn probe(store: &mut dyn NodeStore, root: u64, dir: u64, name: &[u8]) -> Result<(Option<Entry>, Option<u64>)> {
    probe_hashed(store, root, name, &entry_name, dir, &|k, v| Ok(decode(k, v, dir)?.0))
}

pub fn lookup(m: &Mount, dir: u64, di: &DiskInode, name: &[u8]) -> Result<Option<Entry>> {
    let root = root_of(di);
    if root == 0 {
        return Ok(None);
    }
    Ok(probe(&mut ReadStore::new(m, dir), root, dir, name)?.0)
}

/// Add `name -> ino`; EEXIST if present. The caller has reserved INSERT_RESERVE blocks.
pub fn insert(s: &mut TxStore, dir: u64, di: &mut DiskInode, name: &[u8], ino: u64, ftype: u8) -> Result<()> {
    let mut root = root_of(di);
    let (found, free) = probe(s, root, dir, name)?;
    if found.is_some() {
        return Err(Error::Exists);
    }
    let key = free.ok_or(Error::NoSpace)?;
    btree::insert(s, &mut root, key, &encode(ino, ftype, name))?;
    set_root(di, root);
    di.size += 1;
    Ok(())
}

/// Remove the entry `e`, found by a lookup in `di` under the directory's lock: its key
/// still holds, so the name's collision range is not probed a second time.
pub fn remove(s: &mut TxStore, di: &mut DiskInode, e: &Entry) -> Result<()> {
    let mut root = root_of(di);
    if !btree::remove(s, &mut root, e.key)? {
        return Err(Error::NotFound);
    }
    set_root(di, root);
    di.size = di.size.saturating_sub(1);
    Ok(())
}

/// Point the existing entry `e`, named `name`, at another inode (rename over an existing
/// name); keeps its key.
pub fn retarget(s: &mut TxStore, di: &mut DiskInode, e: &Entry, name: &[u8], ino: u64, ftype: u8) -> Result<()> {
    let mut root = root_of(di);
    btree::insert(s, &mut root, e.key, &encode(ino, ftype, name))?;
    set_root(di, root);
    Ok(())
}

/// Entries after `cookie` in cookie order, until `f` returns false. Does not emit "." or
/// "..": the caller does (it knows the inode numbers).
pub fn read(m: &Mount, dir: u64, di: &DiskInode, cookie: u64, f: &mut dyn FnMut(Entry, &[u8]) -> bool) -> Result<()> {
    let root = root_of(di);
    if root == 0 {
        return Ok(());
    }
    let from = cookie.saturating_sub(COOKIE_DOTDOT);
    btree::range(&mut ReadStore::new(m, dir), root, from, &mut |k, v| {
        let (e, name) = decode(k, v, dir)?;
        Ok(f(e, name))
    })
}

pub fn cookie_of(e: &Entry) -> u64 {
    e.key + 3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_names_follow_the_rules_for_given_ones() {
        assert_eq!(decode(7, &encode(12, 8, b"entry"), 2).unwrap().1, b"entry");
        // Damage the corruption sweep found: names readdir would list and lookup refuse.
        for bad in [&b"en/ry"[..], b"a\0b", b".", b"..", b""] {
            assert!(matches!(decode(7, &encode(12, 8, bad), 2), Err(Error::Corrupt { .. })), "{bad:?}");
        }
        assert!(matches!(decode(7, &encode(12, 8, &[b'x'; NAME_MAX + 1]), 2), Err(Error::Corrupt { .. })));
    }
}
