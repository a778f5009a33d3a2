//! The one on-disk B+tree of the engine: directories (entries keyed by name hash), file extent
//! maps and xattrs. Keys are `u64`, values are byte strings of at most [`MAX_VALUE`] bytes.
//! A tree is named by its root block number; 0 is the empty tree.
//!
//! # Node layout
//! One node per 4096-byte block, little-endian:
//! ```text
//!   0..32  common block header (format::init_header): magic MAGIC_BTREE | crc | blkno | owner | lsn
//!  32      u8   level        0 = leaf; a child is always exactly one level below its parent
//!  33      u8   reserved     0
//!  34..36  u16  nkeys        leaf: entries, interior: children; 1..=capacity, never 0 on disk
//!  36..38  u16  value_start  leaf: start of the value area [value_start, 4096); interior: 0
//!  38..48  reserved          0
//!  48..    leaf:     nkeys slots of 12 bytes   key u64 | value_off u16 | value_len u16
//!          interior: nkeys entries of 16 bytes key u64 | child u64
//! ```
//! A leaf keeps its slots sorted by key and growing up from byte 48, and its values packed
//! down from the block end. Replacing or removing an entry leaves its old value bytes as
//! garbage (a replacement no longer than the old value is written over it in place); the leaf
//! is compacted only when a new value does not fit the gap between the two.
//! Capacity: [`LEAF_MAX_ENTRIES`] slots (zero-length values) and at least two entries of
//! [`MAX_VALUE`] bytes; [`INTERIOR_MAX_CHILDREN`] children.
//!
//! # Invariants
//! - Keys strictly ascend inside a node. Every node lies inside the key range `[lo, hi)` its
//!   parent gives it: child `i` covers `[key i, key i+1)`, child 0 starts at the parent's own
//!   lower bound and the last child ends at the parent's upper bound. Key 0 of an interior node
//!   is therefore never compared and is stored as 0; keys 1.. lie strictly inside `(lo, hi)`.
//! - Leaf slots end at or before `value_start`; every value lies in `[value_start, 4096)`, is at
//!   most [`MAX_VALUE`] long and overlaps no other value.
//! - A child pointer is neither 0 nor the node's own block. Levels fall by one per step down,
//!   so every leaf sits at the same depth and no descent is longer than [`MAX_DEPTH`] nodes.
//! - There are no sibling pointers, so no ordering between nodes has to be kept in sync;
//!   in-order iteration climbs and re-descends its saved path.
//!
//! # When they are checked
//! A node's own structure (everything above that does not depend on its parent: header
//! fields, slot and value layout, key order, child pointers) is validated once per buffer:
//! the first time the tree reads a buffer that is not marked verified
//! ([`Buf::is_verified`](crate::buf::Buf::is_verified)), after which it is marked. The buffer
//! cache clears the mark when it reinitialises a block, the tree marks every node it writes,
//! and every write keeps a node valid (debug builds validate each node the tree writes).
//! What depends on the path is checked on every access, in O(1): the block header's magic and
//! owner, the level the parent implies, and the first and last key against the range the
//! parent gives (the keys between are ordered by the structure check). [`check`] (fsck)
//! validates every node in full whatever its mark, and additionally proves that no block is
//! reached twice and that an interior root has at least two children.
//!
//! # Costs
//! Lookups, floors and range scans make one descent of binary searches done in place, keep
//! their path in a fixed array, and allocate nothing but the value they return ([`range`]
//! hands its callback slices of the leaf itself). Inserts and removals allocate only the value
//! they return (a replaced or removed value); splits work on stack copies.
//!
//! # Removal policy
//! Nodes are never merged or rebalanced, so they may be underfull: rebalancing would touch and
//! journal siblings on every delete, while an underfull node only costs space (and trees that
//! shrink a lot usually belong to files and directories that are then deleted whole). A leaf
//! that loses its last entry is freed and unlinked from its parent, and so is every ancestor
//! left without children. A root interior left with one child is replaced by that child (and
//! by the child's child while that is a one-child interior); a tree that loses its last entry
//! has root 0.
//!
//! # Failure atomicity
//! Every node is read and validated, and every new node allocated, before the first node is
//! written, so a mutation that returns an error has changed nothing. The one exception is
//! `free_node` failing after the tree was updated: the error is returned with the tree already
//! consistent, and the block it could not free leaks until fsck.
//!
//! # Where the code lives
//! This file holds the entry points; `node` the node layout, its validation and the accessors
//! of a node's bytes; `walk` the descents and whole-tree walks; `modify` splits, unlinking
//! emptied nodes and the surviving root.

mod modify;
mod node;
mod walk;

use std::collections::HashSet;

use crate::buf::BufRef;
use crate::error::{Error, Result};
use modify::{alloc_nodes, finish, insert_splitting, unlink_empty_leaf, Placement};
use node::*;
use walk::{descend, find_leaf, leaf_entry, load, next_separator, walk_tree, Path};

/// Where a tree's nodes live. The engine's transaction implements it: it reads and verifies
/// blocks through the buffer cache, allocates from the owner's allocation group, and records
/// every node it is told is dirty so the journal logs it.
pub trait NodeStore {
    /// Read a node block; the store verifies checksum/magic(MAGIC_BTREE)/blkno/owner before returning.
    fn read_node(&mut self, blkno: u64) -> Result<BufRef>;
    /// A fresh block for a new node, contents zeroed; the tree writes the header (init_header with MAGIC_BTREE, blkno, owner).
    fn new_node(&mut self) -> Result<BufRef>;
    /// Give a node's block back (tree shrank).
    fn free_node(&mut self, blkno: u64) -> Result<()>;
    /// The tree changed this node; call after every modification of a node (idempotent).
    fn dirty(&mut self, buf: &BufRef);
    /// Owner written into node headers (inode number).
    fn owner(&self) -> u64;
}

/// Longest value a tree stores.
pub const MAX_VALUE: usize = 1536;
/// Most levels a tree may have (leaf level 0 up to root level `MAX_DEPTH - 1`).
pub const MAX_DEPTH: usize = 16;
/// Most nodes one [`insert`] allocates: the leaf's new sibling, one per full ancestor and a
/// new root, i.e. (levels + 1); a root at the depth limit cannot grow, so never above this.
/// Callers size their block reservations from it (or from levels + 1 of the actual tree).
pub const MAX_NEW_NODES_PER_INSERT: usize = MAX_DEPTH;

/// What fsck learns from a full walk of a tree.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckStats {
    /// Key/value entries in all leaves.
    pub entries: u64,
    /// Nodes (blocks) the tree owns.
    pub nodes: u64,
    /// Levels: 0 for the empty tree, 1 for a lone leaf.
    pub depth: u32,
}

/// Value of the key stored at `key`, if any.
#[cfg(test)]
pub fn lookup(store: &mut dyn NodeStore, root: u64, key: u64) -> Result<Option<Vec<u8>>> {
    if root == 0 {
        return Ok(None);
    }
    find_leaf(store, root, key, |b, n, _| Ok(leaf_search(b, n, key).ok().map(|i| leaf_value(b, i).to_vec())))
}

/// The entry with the greatest key `<= key` (extent maps look up the extent covering an offset).
pub fn floor(store: &mut dyn NodeStore, root: u64, key: u64) -> Result<Option<(u64, Vec<u8>)>> {
    if root == 0 {
        return Ok(None);
    }
    let found = find_leaf(store, root, key, |b, n, bounds| {
        let below = partition_point(0, n, |i| leaf_key(b, i) <= key);
        Ok(if below > 0 { Ok(leaf_entry(b, below - 1)) } else { Err(bounds.lo) })
    })?;
    // Every key of that leaf is above `key`, so the floor is the last entry of the leaf just
    // before it, which is the leaf holding `lo - 1` (its upper bound is that leaf's `lo`).
    let lo = match found {
        Ok(entry) => return Ok(Some(entry)),
        Err(lo) => lo,
    };
    let Some(before) = lo.checked_sub(1) else {
        return Ok(None);
    };
    find_leaf(store, root, before, |b, n, _| Ok(Some(leaf_entry(b, n - 1))))
}

/// Insert `key` or replace its value; returns whether it replaced one.
pub fn insert(store: &mut dyn NodeStore, root: &mut u64, key: u64, value: &[u8]) -> Result<bool> {
    if value.len() > MAX_VALUE {
        return Err(Error::Invalid("btree value longer than MAX_VALUE"));
    }
    if *root == 0 {
        let leaf = alloc_nodes(store, 1)?.pop();
        leaf.change(|b| build_leaf(b, [(key, value)]));
        finish(store, &leaf, 0, ALL_KEYS);
        *root = leaf.blkno;
        return Ok(false);
    }
    let mut path = Path::new();
    let (pos, replace, fits) = descend(store, &mut path, *root, key, |b, n, _| {
        Ok(match leaf_search(b, n, key) {
            Ok(i) => (i, true, replace_fits(b, n, i, value.len())),
            Err(i) => (i, false, put_fits(b, n, value.len())),
        })
    })?;
    if fits {
        let leaf = path.leaf();
        leaf.buf.change(|b| {
            if replace {
                leaf_replace(b, leaf.nkeys, pos, value)
            } else {
                leaf_put(b, leaf.nkeys, pos, key, value)
            }
        });
        finish(store, &leaf.buf, 0, leaf.bounds);
    } else {
        insert_splitting(store, root, &path, Placement { pos, replace, key, value })?;
    }
    Ok(replace)
}

/// Remove `key`; returns whether it was there. See the module doc for what happens to
/// emptied nodes.
pub fn remove(store: &mut dyn NodeStore, root: &mut u64, key: u64) -> Result<bool> {
    if *root == 0 {
        return Ok(false);
    }
    let mut path = Path::new();
    let found = descend(store, &mut path, *root, key, |b, n, _| Ok(leaf_search(b, n, key).ok()))?;
    let Some(pos) = found else {
        return Ok(false);
    };
    let leaf = path.leaf();
    if leaf.nkeys > 1 {
        leaf.buf.change(|b| leaf_delete(b, leaf.nkeys, pos));
        finish(store, &leaf.buf, 0, leaf.bounds);
    } else {
        unlink_empty_leaf(store, root, &path)?;
    }
    Ok(true)
}

/// Call `f` on every entry with key `>= from`, in ascending key order, until it returns false
/// (or an error, which `range` returns). Costs one descent plus, per further leaf, a climb to
/// the first ancestor with a next child and a descent from it: O(log n + entries visited)
/// node reads, and no heap allocation.
///
/// `f` is handed the value as a slice of the leaf's own bytes and runs while that leaf's
/// buffer is read-locked (the lock is dropped only to move on to the next leaf). So `f` must
/// not call back into this tree, nor into anything that may lock the store's buffers (another
/// tree walk or a transaction through the engine's buffer cache): a buffer's read lock is not
/// reentrant once a writer waits, and a writer of the leaf would wait for `f`. It should do
/// pure work on the entry, e.g. decode or copy it, as the directory, extent-map and xattr
/// callers do.
pub fn range(
    store: &mut dyn NodeStore,
    root: u64,
    from: u64,
    f: &mut dyn FnMut(u64, &[u8]) -> Result<bool>,
) -> Result<()> {
    if root == 0 {
        return Ok(());
    }
    let mut path = Path::new();
    let mut cursor = from;
    // One pass per leaf at most: the cursor strictly increases (below).
    loop {
        let more = descend(store, &mut path, root, cursor, |b, n, _| {
            let first = partition_point(0, n, |i| leaf_key(b, i) < cursor);
            for i in first..n {
                if !f(leaf_key(b, i), leaf_value(b, i))? {
                    return Ok(false);
                }
            }
            Ok(true)
        })?;
        if !more {
            return Ok(());
        }
        // Separators strictly increase (node validation checks each node's keys and their
        // bounds), so the cursor does too: the walk ends after at most one pass per leaf.
        match next_separator(&mut path) {
            Some(sep) => cursor = sep,
            None => return Ok(()),
        }
    }
}

/// Free every node of the tree. The whole tree is walked and verified first (as [`check`]
/// does, though trusting nodes already validated in memory), so a corrupt tree frees nothing
/// rather than a block it does not own.
pub fn destroy(store: &mut dyn NodeStore, root: u64) -> Result<()> {
    let mut blocks = Vec::new();
    walk_tree(store, root, false, &mut |blkno| blocks.push(blkno))?;
    blocks.into_iter().try_for_each(|blkno| store.free_node(blkno))
}

/// fsck's full verification: every node valid (validated afresh, whether or not its buffer is
/// marked verified) and inside its parent's key range, all leaves at one depth, no block
/// reached twice, an interior root with at least two children.
/// `visit_block` sees every node's block number so fsck can cross-check block ownership.
pub fn check(store: &mut dyn NodeStore, root: u64, visit_block: &mut dyn FnMut(u64)) -> Result<CheckStats> {
    walk_tree(store, root, true, visit_block)
}

/// fsck's salvage of a tree that fails [`check`]: hands `f` every entry of every leaf still
/// reached through nodes that pass the full check inside the key range their parent gives, in
/// key order (sibling ranges are disjoint). A node that fails is skipped with all below it.
/// Returns how many nodes were skipped. Bounded: no block is read twice, and levels fall by
/// one per step. Only device errors are errors.
pub fn salvage(store: &mut dyn NodeStore, root: u64, f: &mut dyn FnMut(u64, &[u8])) -> Result<u64> {
    let mut skipped = 0;
    let mut seen = HashSet::new();
    let mut todo = vec![(root, None, ALL_KEYS)];
    while let Some((blkno, level, bounds)) = todo.pop().filter(|_| root != 0) {
        let step = match seen.insert(blkno).then(|| load(store, blkno, level, bounds, true)) {
            Some(Ok(step)) => step,
            Some(Err(Error::Io(e))) => return Err(Error::Io(e)),
            Some(Err(_)) | None => {
                skipped += 1;
                continue;
            }
        };
        let b = step.buf.read();
        if step.level == 0 {
            (0..step.nkeys).for_each(|i| f(leaf_key(&b[..], i), leaf_value(&b[..], i)));
        } else {
            // Pushed last to first, so the leftmost child is taken next: keys come in order.
            for i in (0..step.nkeys).rev() {
                todo.push((
                    interior_child(&b[..], i),
                    Some(step.level - 1),
                    child_bounds(&b[..], step.nkeys, i, step.bounds),
                ));
            }
        }
    }
    Ok(skipped)
}

#[cfg(test)]
mod tests;
