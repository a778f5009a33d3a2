//! Structural changes: leaf and interior splits on insert, unlinking emptied nodes on removal,
//! the root's surviving step, and recording what the tree wrote.

use super::node::*;
use super::walk::{load, Path, Step};
use super::{NodeStore, MAX_DEPTH, MAX_NEW_NODES_PER_INSERT};
use crate::buf::{Block, BufRef};
use crate::error::{Error, Result};
use crate::format::log::chunks_of;
use crate::format::{init_header, HDR_SIZE, MAGIC_BTREE};

// ---------------------------------------------------------------------------------------------
// Structural changes

/// A few values on the stack (fresh nodes of one insert, blocks one removal frees).
pub(super) struct Few<T, const N: usize> {
    items: [Option<T>; N],
    len: usize,
}

impl<T, const N: usize> Few<T, N> {
    pub(super) fn new() -> Self {
        Few { items: [const { None }; N], len: 0 }
    }

    pub(super) fn push(&mut self, item: T) {
        assert!(self.len < N, "more than {N} items");
        self.items[self.len] = Some(item);
        self.len += 1;
    }

    pub(super) fn pop(&mut self) -> T {
        self.len -= 1;
        self.items[self.len].take().expect("items below len are set")
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.items[..self.len].iter().map(|i| i.as_ref().expect("items below len are set"))
    }
}

/// Where a new entry goes in the leaf at the end of a path.
pub(super) struct Placement<'v> {
    pub(super) pos: usize,
    pub(super) replace: bool,
    pub(super) key: u64,
    pub(super) value: &'v [u8],
}

/// New nodes of one insert.
pub(super) type Fresh = Few<BufRef, MAX_NEW_NODES_PER_INSERT>;

/// Insert into a leaf that has no room: split it, push the new separator up, split every full
/// ancestor on the way, and grow a new root if the old one split.
pub(super) fn insert_splitting(store: &mut dyn NodeStore, root: &mut u64, path: &Path, new: Placement) -> Result<()> {
    let depth = path.len();
    let full = (0..depth - 1).rev().take_while(|&i| path.get(i).nkeys == INTERIOR_MAX_CHILDREN).count();
    let grows = full == depth - 1;
    if grows && usize::from(path.get(0).level) + 1 >= MAX_DEPTH {
        // Unreachable in practice: ~126^15 splits are needed to get here.
        return Err(Error::NoSpace);
    }
    let mut fresh = alloc_nodes(store, 1 + full + usize::from(grows))?;
    let mut carry = split_leaf(store, path.leaf(), fresh.pop(), new);
    for i in (0..depth - 1).rev() {
        match add_child(store, path.get(i), carry, &mut fresh) {
            Some(up) => carry = up,
            None => return Ok(()),
        }
    }
    let new_root = fresh.pop();
    let level = path.get(0).level + 1;
    new_root.change(|b| build_interior(b, level, &[(0, *root), carry]));
    finish(store, &new_root, level, ALL_KEYS);
    *root = new_root.blkno;
    Ok(())
}

/// `count` new nodes with their block header written; on failure none stay allocated.
pub(super) fn alloc_nodes(store: &mut dyn NodeStore, count: usize) -> Result<Fresh> {
    let mut nodes = Fresh::new();
    for _ in 0..count {
        match store.new_node() {
            Ok(buf) => {
                buf.change(|b| {
                    init_header(b, MAGIC_BTREE, buf.blkno, store.owner());
                    chunks_of(0..HDR_SIZE)
                });
                nodes.push(buf);
            }
            Err(e) => {
                nodes.iter().try_for_each(|n| store.free_node(n.blkno))?;
                return Err(e);
            }
        }
    }
    Ok(nodes)
}

/// The entries of a leaf with one entry placed (inserted or replacing), read by index.
pub(super) struct Merged<'a> {
    old: &'a [u8],
    pos: usize,
    replace: bool,
    key: u64,
    value: &'a [u8],
}

impl<'a> Merged<'a> {
    pub(super) fn get(&self, j: usize) -> (u64, &'a [u8]) {
        if j == self.pos {
            return (self.key, self.value);
        }
        let i = if j < self.pos || self.replace { j } else { j - 1 };
        (leaf_key(self.old, i), leaf_value(self.old, i))
    }
}

/// Split a full leaf while placing `new`; returns (separator, new right node) for the parent.
pub(super) fn split_leaf(store: &mut dyn NodeStore, leaf: &Step, right: BufRef, new: Placement) -> (u64, u64) {
    let old: Block = **leaf.buf.read();
    let merged = Merged { old: &old, pos: new.pos, replace: new.replace, key: new.key, value: new.value };
    let total = if new.replace { leaf.nkeys } else { leaf.nkeys + 1 };
    // Appending past the last key of the whole tree is how extent maps grow: keep the old leaf
    // full and start a new one, instead of leaving a trail of half-empty leaves.
    let appending = leaf.bounds.hi.is_none() && !new.replace && new.pos == leaf.nkeys;
    let cut = if appending { total - 1 } else { balanced_cut(total, |j| LEAF_SLOT + merged.get(j).1.len()) };
    let sep = merged.get(cut).0;
    leaf.buf.change(|b| build_leaf(b, (0..cut).map(|j| merged.get(j))));
    right.change(|b| build_leaf(b, (cut..total).map(|j| merged.get(j))));
    finish(store, &leaf.buf, 0, Bounds { lo: leaf.bounds.lo, hi: Some(sep) });
    finish(store, &right, 0, Bounds { lo: sep, hi: leaf.bounds.hi });
    (sep, right.blkno)
}

/// The cut (1..len) minimising the larger half of entries `0..len` sized by `size`. They hold
/// at most one leaf's worth of bytes plus one entry of at most LEAF_SLOT + MAX_VALUE, so the
/// longest prefix that fits a leaf leaves less than two max entries behind: a cut where both
/// halves fit always exists.
pub(super) fn balanced_cut(len: usize, size: impl Fn(usize) -> usize) -> usize {
    let total: usize = (0..len).map(&size).sum();
    let mut left = 0;
    let mut best = (usize::MAX, 1);
    for cut in 1..len {
        left += size(cut - 1);
        let larger = left.max(total - left);
        if larger < best.0 {
            best = (larger, cut);
        }
    }
    debug_assert!(best.0 <= LEAF_SPACE, "leaf split leaves an overfull half");
    best.1
}

/// Add `(sep, child)` right after the child `parent` routed through. Returns what the parent's
/// own parent must add if `parent` had to split.
pub(super) fn add_child(
    store: &mut dyn NodeStore,
    parent: &Step,
    carry: (u64, u64),
    fresh: &mut Fresh,
) -> Option<(u64, u64)> {
    let (n, at) = (parent.nkeys, parent.idx + 1);
    if n < INTERIOR_MAX_CHILDREN {
        parent.buf.change(|b| interior_insert(b, n, at, carry));
        finish(store, &parent.buf, parent.level, parent.bounds);
        return None;
    }
    let mut all = [(0u64, 0u64); INTERIOR_MAX_CHILDREN + 1];
    {
        let b = parent.buf.read();
        for (i, e) in all[..n].iter_mut().enumerate() {
            *e = (interior_key(&b[..], i), interior_child(&b[..], i));
        }
    }
    all.copy_within(at..n, at + 1);
    all[at] = carry;
    let entries = &all[..n + 1];
    // Same append rule as leaves: the rightmost node growing at its end keeps itself full.
    let appending = parent.bounds.hi.is_none() && at == n;
    let cut = if appending { n } else { entries.len() / 2 };
    let sep = entries[cut].0;
    let right = fresh.pop();
    parent.buf.change(|b| build_interior(b, parent.level, &entries[..cut]));
    right.change(|b| build_interior(b, parent.level, &entries[cut..]));
    finish(store, &parent.buf, parent.level, Bounds { lo: parent.bounds.lo, hi: Some(sep) });
    finish(store, &right, parent.level, Bounds { lo: sep, hi: parent.bounds.hi });
    Some((sep, right.blkno))
}

/// Blocks one removal frees.
pub(super) type Doomed = Few<u64, { 2 * MAX_DEPTH }>;

/// The leaf at the end of `path` lost its last entry: free it and every ancestor it leaves
/// childless, remove the link from the first ancestor that keeps children, and collapse a
/// root left with one child.
pub(super) fn unlink_empty_leaf(store: &mut dyn NodeStore, root: &mut u64, path: &Path) -> Result<()> {
    let depth = path.len();
    let mut doomed = Doomed::new();
    let Some(keep) = (0..depth - 1).rev().find(|&i| path.get(i).nkeys > 1) else {
        (0..depth).for_each(|i| doomed.push(path.get(i).buf.blkno));
        *root = 0;
        return free_all(store, &doomed);
    };
    (keep + 1..depth).for_each(|i| doomed.push(path.get(i).buf.blkno));
    let parent = path.get(keep);
    if keep == 0 && parent.nkeys == 2 {
        let new_root = surviving_root(store, parent, &mut doomed)?;
        *root = new_root;
    } else {
        parent.buf.change(|b| interior_remove(b, parent.nkeys, parent.idx));
        finish(store, &parent.buf, parent.level, parent.bounds);
    }
    free_all(store, &doomed)
}

pub(super) fn free_all(store: &mut dyn NodeStore, doomed: &Doomed) -> Result<()> {
    doomed.iter().try_for_each(|&blkno| store.free_node(blkno))
}

/// The root keeps only the child it did not route through: that child becomes the root, or
/// rather the first node below it that is a leaf or has two children. Returns the new root
/// and adds the old root and the one-child interiors skipped on the way to `doomed`. Only
/// reads (so on error nothing has changed; `doomed` is then dropped).
pub(super) fn surviving_root(store: &mut dyn NodeStore, root: &Step, doomed: &mut Doomed) -> Result<u64> {
    let (mut blkno, bounds) = {
        let b = root.buf.read();
        let other = 1 - root.idx;
        (interior_child(&b[..], other), child_bounds(&b[..], root.nkeys, other, root.bounds))
    };
    doomed.push(root.buf.blkno);
    let mut level = root.level - 1;
    // One level down per pass (`load` checks each node is at `level`), so it ends at the
    // leaf level at the latest: at most `root.level` passes.
    loop {
        // A one-child node's child has the same key range, so `bounds` carries down unchanged.
        let node = load(store, blkno, Some(level), bounds, false)?;
        if node.level == 0 || node.nkeys > 1 {
            return Ok(blkno);
        }
        doomed.push(blkno);
        blkno = interior_child(&node.buf.read()[..], 0);
        level -= 1;
    }
}

/// Record a node the tree just wrote, and mark it verified: the tree only writes valid nodes.
/// Debug builds first hold it to every rule a read enforces.
pub(super) fn finish(store: &mut dyn NodeStore, buf: &BufRef, level: u8, bounds: Bounds) {
    if cfg!(debug_assertions) {
        let owner = store.owner();
        if let Err(e) = validate(&buf.read()[..], buf.blkno, owner, Some(level), bounds) {
            panic!("btree wrote an invalid node: {e}");
        }
    }
    buf.set_verified(true);
    store.dirty(buf);
}
