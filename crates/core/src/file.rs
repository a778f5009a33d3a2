//! File block maps: up to four extents inline in the inode, a B+tree (key: file block,
//! value: packed extent) beyond that. Everything here runs under the inode's lock.

use crate::btree::{self, NodeStore};
use crate::error::{Error, Result};
use crate::format::inode::{EXTENT_LEN_MAX, INLINE_EXTENTS, MAX_FILE_BLOCKS};
use crate::format::{get_u64, DiskInode, Extent, Fork};
use crate::mount::Mount;
use crate::store::{ReadStore, TxStore};

/// Worst-case blocks one extent insert or split can allocate for B+tree nodes.
pub const MAP_RESERVE: u64 = 8;

fn decode_value(m: &Mount, ino: u64, lblk: u64, v: &[u8]) -> Result<Extent> {
    if v.len() != 8 {
        return Err(Error::corrupt("extent", ino, format!("value of {} bytes", v.len())));
    }
    let e = Extent::unpack(lblk, get_u64(v, 0));
    // `lblk` is a key from disk: compare without computing `end()`, which could overflow.
    if e.len == 0 || !m.geo.is_data_range(e.pblk, e.len as u64) || e.lblk > MAX_FILE_BLOCKS - e.len as u64 {
        return Err(Error::corrupt("extent", ino, format!("{:?} outside the data area", e)));
    }
    Ok(e)
}

/// Extents overlapping file blocks `[from, to)`, in order.
pub fn extents_in(
    store: &mut dyn NodeStore,
    m: &Mount,
    ino: u64,
    di: &DiskInode,
    from: u64,
    to: u64,
) -> Result<Vec<Extent>> {
    match &di.fork {
        Fork::Extents { n, ext } => {
            Ok(ext[..*n as usize].iter().filter(|e| e.end() > from && e.lblk < to).copied().collect())
        }
        Fork::Btree(root) if di.is_reg() || di.is_symlink() => {
            let mut out = Vec::new();
            let start = match btree::floor(store, *root, from)? {
                Some((k, v)) if decode_value(m, ino, k, &v)?.end() > from => k,
                _ => from,
            };
            btree::range(store, *root, start, &mut |k, v| {
                if k >= to {
                    return Ok(false);
                }
                let e = decode_value(m, ino, k, v)?;
                if e.unwritten && !di.is_reg() {
                    return Err(Error::corrupt("extent", ino, format!("{:?} unwritten in a non-regular file", e)));
                }
                out.push(e);
                Ok(out.len() < 1 << 20)
            })?;
            Ok(out)
        }
        _ => Ok(Vec::new()),
    }
}

/// The runs of file blocks in `[from, to)` that no extent maps (written or unwritten), in
/// order. Streams the map, so its size bounds the answer, not a cap on extents read.
pub fn holes(m: &Mount, ino: u64, di: &DiskInode, from: u64, to: u64) -> Result<Vec<(u64, u64)>> {
    let mut out = Vec::new();
    let mut pos = from;
    // Returns whether extents further on can still matter.
    let mut visit = |e: &Extent| {
        if e.lblk > pos {
            out.push((pos, e.lblk.min(to)));
        }
        pos = pos.max(e.end());
        pos < to
    };
    match &di.fork {
        Fork::Extents { n, ext } => {
            for e in ext[..*n as usize].iter().filter(|e| e.end() > from && e.lblk < to) {
                if !visit(e) {
                    break;
                }
            }
        }
        Fork::Btree(root) if di.is_reg() => {
            let store = &mut ReadStore::new(m, ino);
            let start = match btree::floor(store, *root, from)? {
                Some((k, v)) if decode_value(m, ino, k, &v)?.end() > from => k,
                _ => from,
            };
            btree::range(store, *root, start, &mut |k, v| Ok(k < to && visit(&decode_value(m, ino, k, v)?)))?;
        }
        _ => {}
    }
    if pos < to {
        out.push((pos, to));
    }
    Ok(out)
}

pub fn read_extents(m: &Mount, ino: u64, di: &DiskInode, from: u64, to: u64) -> Result<Vec<Extent>> {
    extents_in(&mut ReadStore::new(m, ino), m, ino, di, from, to)
}

fn inline_vec(di: &DiskInode) -> Option<Vec<Extent>> {
    match &di.fork {
        Fork::Extents { n, ext } => Some(ext[..*n as usize].to_vec()),
        Fork::Empty => Some(Vec::new()),
        _ => None,
    }
}

/// Store `exts` inline if they fit, else build a B+tree from them.
fn set_inline_or_tree(s: &mut TxStore, di: &mut DiskInode, exts: Vec<Extent>) -> Result<()> {
    if exts.is_empty() {
        di.fork = Fork::Empty;
    } else if exts.len() <= INLINE_EXTENTS {
        let mut ext = [Extent::default(); INLINE_EXTENTS];
        ext[..exts.len()].copy_from_slice(&exts);
        di.fork = Fork::Extents { n: exts.len() as u8, ext };
    } else {
        let mut root = 0;
        for e in &exts {
            btree::insert(s, &mut root, e.lblk, &e.pack_value().to_le_bytes())?;
        }
        di.fork = Fork::Btree(root);
    }
    Ok(())
}

fn put(s: &mut TxStore, di: &mut DiskInode, e: Extent) -> Result<()> {
    debug_assert!(e.len >= 1 && e.len <= EXTENT_LEN_MAX);
    if let Some(mut v) = inline_vec(di) {
        let at = v.partition_point(|x| x.lblk < e.lblk);
        debug_assert!(v.get(at).is_none_or(|x| x.lblk >= e.end()), "overlapping extent insert");
        v.insert(at, e);
        return set_inline_or_tree(s, di, v);
    }
    let Fork::Btree(mut root) = di.fork else { unreachable!("file fork is extents or btree") };
    btree::insert(s, &mut root, e.lblk, &e.pack_value().to_le_bytes())?;
    di.fork = Fork::Btree(root);
    Ok(())
}

fn remove(s: &mut TxStore, di: &mut DiskInode, lblk: u64) -> Result<()> {
    if let Some(mut v) = inline_vec(di) {
        v.retain(|x| x.lblk != lblk);
        return set_inline_or_tree(s, di, v);
    }
    let Fork::Btree(mut root) = di.fork else { unreachable!("file fork is extents or btree") };
    btree::remove(s, &mut root, lblk)?;
    di.fork = if root == 0 { Fork::Empty } else { Fork::Btree(root) };
    Ok(())
}

/// Map `e` (not overlapping anything), merging it into its predecessor when contiguous.
pub fn map(s: &mut TxStore, m: &Mount, ino: u64, di: &mut DiskInode, e: Extent) -> Result<()> {
    if e.lblk > 0 {
        let prev = extents_in(s, m, ino, di, e.lblk - 1, e.lblk)?;
        if let Some(p) = prev.first() {
            if p.end() == e.lblk
                && p.pblk + p.len as u64 == e.pblk
                && p.unwritten == e.unwritten
                && p.len + e.len <= EXTENT_LEN_MAX
            {
                let merged = Extent { len: p.len + e.len, ..*p };
                remove(s, di, p.lblk)?;
                return put(s, di, merged);
            }
        }
    }
    put(s, di, e)
}

/// Unmap file blocks `[from, to)`, splitting extents at the edges; at most `max` extents
/// are touched. Returns the unmapped pieces (the caller frees or remaps them) and whether
/// the whole range is done.
pub fn unmap(
    s: &mut TxStore,
    m: &Mount,
    ino: u64,
    di: &mut DiskInode,
    from: u64,
    to: u64,
    max: usize,
) -> Result<(Vec<Extent>, bool)> {
    let all = extents_in(s, m, ino, di, from, to)?;
    let done = all.len() <= max;
    let mut out = Vec::new();
    for e in all.into_iter().take(max) {
        remove(s, di, e.lblk)?;
        if e.lblk < from {
            put(s, di, Extent { len: (from - e.lblk) as u32, ..e })?;
        }
        if e.end() > to {
            let skip = to - e.lblk;
            put(s, di, Extent { lblk: to, pblk: e.pblk + skip, len: (e.end() - to) as u32, unwritten: e.unwritten })?;
        }
        let (lo, hi) = (e.lblk.max(from), e.end().min(to));
        out.push(Extent { lblk: lo, pblk: e.pblk + (lo - e.lblk), len: (hi - lo) as u32, unwritten: e.unwritten });
    }
    Ok((out, done))
}

/// Split the extent that straddles file block `at`, if any, into two extents meeting there.
pub fn split_at(s: &mut TxStore, m: &Mount, ino: u64, di: &mut DiskInode, at: u64) -> Result<()> {
    if at == 0 {
        return Ok(());
    }
    if let Some(e) = extents_in(s, m, ino, di, at - 1, at)?.into_iter().find(|e| e.end() > at) {
        remove(s, di, e.lblk)?;
        put(s, di, Extent { len: (at - e.lblk) as u32, ..e })?;
        put(
            s,
            di,
            Extent { lblk: at, pblk: e.pblk + (at - e.lblk), len: (e.end() - at) as u32, unwritten: e.unwritten },
        )?;
    }
    Ok(())
}

/// Move up to `max` of the extents that start in `[from, to)` by `by` blocks: left when
/// negative (the first ones, lowest first), else right (the last ones, highest first), so
/// that each lands on blocks nothing maps. No extent may straddle `from` or `to`. Returns
/// the bound of the extents still to move — the new `from` going left, the new `to` going
/// right — or `None` when all have moved.
pub fn shift(
    s: &mut TxStore,
    m: &Mount,
    ino: u64,
    di: &mut DiskInode,
    (from, to): (u64, u64),
    by: i64,
    max: usize,
) -> Result<Option<u64>> {
    let right = by > 0;
    let all = extents_in(s, m, ino, di, from, to)?;
    debug_assert!(all.iter().all(|e| e.lblk >= from && e.end() <= to), "an extent straddles the shifted range");
    let (batch, next) = match (right, all.len() > max) {
        (_, false) => (&all[..], None),
        (false, true) => (&all[..max], Some(all[max].lblk)),
        (true, true) => (&all[all.len() - max..], Some(all[all.len() - max].lblk)),
    };
    let moves: Box<dyn Iterator<Item = &Extent>> =
        if right { Box::new(batch.iter().rev()) } else { Box::new(batch.iter()) };
    for e in moves {
        remove(s, di, e.lblk)?;
        // The caller checked that the moved map stays within the file's blocks.
        put(s, di, Extent { lblk: e.lblk.wrapping_add_signed(by), ..*e })?;
    }
    Ok(next)
}
