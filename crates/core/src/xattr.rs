//! Extended attributes: small ones inline in the inode's 48-byte xattr area, the rest in a
//! per-inode B+tree keyed by name hash (the same hashed-name index as directories).
//!
//! Inline area: entries `name_len u8 | value_len u8 | name | value`, packed from the start;
//! a zero `name_len` ends the list. B+tree value: `name_len u8 | name | value`.

use crate::btree;
use crate::dir::probe_hashed;
use crate::error::{Error, Result};
use crate::format::inode::XATTR_INLINE_SIZE;
use crate::format::DiskInode;
use crate::mount::Mount;
use crate::store::{ReadStore, TxStore};

pub const XATTR_NAME_MAX: usize = 255;
pub const XATTR_VALUE_MAX: usize = 1024;
pub const XATTR_CREATE: u32 = 1;
pub const XATTR_REPLACE: u32 = 2;

fn inline_entries(di: &DiskInode) -> Vec<(Vec<u8>, Vec<u8>)> {
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

/// The name of a tree record; None for a record no valid name fits (damage).
fn tree_name(v: &[u8]) -> Option<&[u8]> {
    let nl = *v.first()? as usize;
    (nl > 0 && v.len() > nl && !v[1..1 + nl].contains(&0)).then(|| &v[1..1 + nl])
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

pub fn get(m: &Mount, ino: u64, di: &DiskInode, name: &[u8]) -> Result<Vec<u8>> {
    check(name, 0)?;
    if let Some((_, v)) = inline_entries(di).into_iter().find(|(n, _)| n == name) {
        return Ok(v);
    }
    let (found, _) = probe_hashed(&mut ReadStore::new(m, ino), di.xattr_root, name, &tree_name, ino, &|k, v| Ok((k, v.to_vec())))?;
    found.map(|(_, v)| v[1 + name.len()..].to_vec()).ok_or(Error::NoAttr)
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

/// Set `name`; `flags` are XATTR_CREATE / XATTR_REPLACE. Reserve `btree` blocks first.
pub fn set(s: &mut TxStore, ino: u64, di: &mut DiskInode, name: &[u8], value: &[u8], flags: u32) -> Result<()> {
    check(name, value.len())?;
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
    if let Some((k, _)) = &in_tree {
        btree::remove(s, &mut root, *k)?;
    }
    let fits_inline = value.len() < 256 && inline_bytes(&inline) + 2 + name.len() + value.len() <= XATTR_INLINE_SIZE;
    if fits_inline {
        inline.push((name.to_vec(), value.to_vec()));
    } else {
        let key = in_tree.map(|(k, _)| k).or(free).ok_or(Error::NoSpace)?;
        let mut rec = Vec::with_capacity(1 + name.len() + value.len());
        rec.push(name.len() as u8);
        rec.extend_from_slice(name);
        rec.extend_from_slice(value);
        btree::insert(s, &mut root, key, &rec)?;
    }
    store_inline(di, &inline);
    di.xattr_root = root;
    Ok(())
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
    let (k, _) = found.ok_or(Error::NoAttr)?;
    let mut root = di.xattr_root;
    btree::remove(s, &mut root, k)?;
    di.xattr_root = root;
    Ok(())
}

/// Free the xattr B+tree (the inode is being freed).
pub fn destroy(s: &mut TxStore, di: &mut DiskInode) -> Result<()> {
    if di.xattr_root != 0 {
        btree::destroy(s, di.xattr_root)?;
        di.xattr_root = 0;
    }
    di.xattr_inline.clear();
    Ok(())
}
