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
//! garbage; the leaf is compacted only when a new value does not fit the gap between the two.
//! Capacity: [`LEAF_MAX_ENTRIES`] slots (zero-length values) and at least two entries of
//! [`MAX_VALUE`] bytes; [`INTERIOR_MAX_CHILDREN`] children.
//!
//! # Invariants (checked on every read, and in debug builds on every write)
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
//! [`check`] additionally proves that no block is reached twice and that an interior root has
//! at least two children.
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

use std::collections::HashSet;
use std::ops::Range;

use crate::buf::{Block, BufRef};
use crate::error::{Error, Result};
use crate::format::{get_u16, get_u64, init_header, put_u16, put_u64, BLOCK_SIZE, HDR_SIZE, MAGIC_BTREE};

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

const OFF_LEVEL: usize = HDR_SIZE;
const OFF_RESERVED_A: usize = HDR_SIZE + 1;
const OFF_NKEYS: usize = HDR_SIZE + 2;
const OFF_VALUE_START: usize = HDR_SIZE + 4;
const OFF_RESERVED_B: usize = HDR_SIZE + 6;
/// First byte after the node header: where slots / interior entries start.
pub const NODE_HDR_END: usize = HDR_SIZE + 16;

const LEAF_SLOT: usize = 12;
const INTERIOR_ENTRY: usize = 16;
/// Bytes a leaf has for slots and values together.
const LEAF_SPACE: usize = BLOCK_SIZE - NODE_HDR_END;
/// Most entries a leaf can hold (all values empty).
pub const LEAF_MAX_ENTRIES: usize = LEAF_SPACE / LEAF_SLOT;
/// Most children an interior node can hold.
pub const INTERIOR_MAX_CHILDREN: usize = (BLOCK_SIZE - NODE_HDR_END) / INTERIOR_ENTRY;

// A leaf split must always leave both halves fitting: that needs room for two largest entries.
const _: () = assert!(2 * (LEAF_SLOT + MAX_VALUE) <= LEAF_SPACE);
// Value offsets (up to and including BLOCK_SIZE) are stored as u16.
const _: () = assert!(BLOCK_SIZE <= u16::MAX as usize);

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
pub fn lookup(store: &mut dyn NodeStore, root: u64, key: u64) -> Result<Option<Vec<u8>>> {
    if root == 0 {
        return Ok(None);
    }
    let path = path_to(store, root, key)?;
    let leaf = leaf_of(&path);
    let b = leaf.buf.read();
    Ok(leaf_search(&b[..], leaf.nkeys, key).ok().map(|i| leaf_value(&b[..], i).to_vec()))
}

/// The entry with the greatest key `<= key` (extent maps look up the extent covering an offset).
pub fn floor(store: &mut dyn NodeStore, root: u64, key: u64) -> Result<Option<(u64, Vec<u8>)>> {
    if root == 0 {
        return Ok(None);
    }
    let path = path_to(store, root, key)?;
    let leaf = leaf_of(&path);
    let below = {
        let b = leaf.buf.read();
        partition_point(0, leaf.nkeys, |i| leaf_key(&b[..], i) <= key)
    };
    if below > 0 {
        return Ok(Some(leaf_entry(leaf, below - 1)));
    }
    // Every key of this leaf is above `key`, so the floor is the last entry of the leaf just
    // before it, which is the leaf holding `lo - 1` (its upper bound is this leaf's `lo`).
    let Some(before) = leaf.bounds.lo.checked_sub(1) else {
        return Ok(None);
    };
    let path = path_to(store, root, before)?;
    let prev = leaf_of(&path);
    Ok(Some(leaf_entry(prev, prev.nkeys - 1)))
}

/// Insert `key` or replace its value; returns the value it replaced.
pub fn insert(store: &mut dyn NodeStore, root: &mut u64, key: u64, value: &[u8]) -> Result<Option<Vec<u8>>> {
    if value.len() > MAX_VALUE {
        return Err(Error::Invalid("btree value longer than MAX_VALUE"));
    }
    if *root == 0 {
        let leaf = alloc_nodes(store, 1)?.remove(0);
        build_leaf(&mut leaf.write()[..], [(key, value)]);
        finish(store, &leaf, 0, ALL_KEYS);
        *root = leaf.blkno;
        return Ok(None);
    }
    let path = path_to(store, *root, key)?;
    let leaf = leaf_of(&path);
    let (pos, old, room) = {
        let b = leaf.buf.read();
        let room = leaf_room(&b[..], leaf.nkeys);
        match leaf_search(&b[..], leaf.nkeys, key) {
            Ok(i) => (i, Some(leaf_value(&b[..], i).to_vec()), room),
            Err(i) => (i, None, room),
        }
    };
    let freed_by_old = old.as_ref().map_or(0, |v| LEAF_SLOT + v.len());
    if room + freed_by_old >= LEAF_SLOT + value.len() {
        {
            let mut b = leaf.buf.write();
            let mut n = leaf.nkeys;
            if old.is_some() {
                leaf_delete(&mut b[..], n, pos);
                n -= 1;
            }
            leaf_put(&mut b[..], n, pos, key, value);
        }
        finish(store, &leaf.buf, 0, leaf.bounds);
    } else {
        insert_splitting(store, root, &path, Placement { pos, replace: old.is_some(), key, value })?;
    }
    Ok(old)
}

/// Remove `key`; returns its value. See the module doc for what happens to emptied nodes.
pub fn remove(store: &mut dyn NodeStore, root: &mut u64, key: u64) -> Result<Option<Vec<u8>>> {
    if *root == 0 {
        return Ok(None);
    }
    let path = path_to(store, *root, key)?;
    let leaf = leaf_of(&path);
    let (pos, old) = {
        let b = leaf.buf.read();
        match leaf_search(&b[..], leaf.nkeys, key) {
            Ok(i) => (i, leaf_value(&b[..], i).to_vec()),
            Err(_) => return Ok(None),
        }
    };
    if leaf.nkeys > 1 {
        leaf_delete(&mut leaf.buf.write()[..], leaf.nkeys, pos);
        finish(store, &leaf.buf, 0, leaf.bounds);
    } else {
        unlink_empty_leaf(store, root, &path)?;
    }
    Ok(Some(old))
}

/// Call `f` on every entry with key `>= from`, in ascending key order, until it returns false.
/// Costs one descent plus, per further leaf, a climb to the first ancestor with a next child
/// and a descent from it: O(log n + entries visited) node reads.
pub fn range(
    store: &mut dyn NodeStore,
    root: u64,
    from: u64,
    f: &mut dyn FnMut(u64, &[u8]) -> Result<bool>,
) -> Result<()> {
    if root == 0 {
        return Ok(());
    }
    let mut path = vec![load(store, root, None, ALL_KEYS)?];
    let mut cursor = from;
    let mut entries = Vec::new();
    let mut bytes = Vec::new();
    loop {
        descend(store, &mut path, cursor)?;
        copy_entries_from(leaf_of(&path), cursor, &mut entries, &mut bytes);
        for (key, span) in &entries {
            if !f(*key, &bytes[span.clone()])? {
                return Ok(());
            }
        }
        // Separators strictly increase, so the cursor does too and the walk ends.
        match next_separator(&mut path) {
            Some(sep) => cursor = sep,
            None => return Ok(()),
        }
    }
}

/// Free every node of the tree. The whole tree is walked and verified first (as [`check`]
/// does), so a corrupt tree frees nothing rather than a block it does not own.
pub fn destroy(store: &mut dyn NodeStore, root: u64) -> Result<()> {
    let mut blocks = Vec::new();
    check(store, root, &mut |blkno| blocks.push(blkno))?;
    blocks.into_iter().try_for_each(|blkno| store.free_node(blkno))
}

/// fsck's full verification: every node valid and inside its parent's key range, all leaves at
/// one depth, no block reached twice, an interior root with at least two children.
/// `visit_block` sees every node's block number so fsck can cross-check block ownership.
pub fn check(store: &mut dyn NodeStore, root: u64, visit_block: &mut dyn FnMut(u64)) -> Result<CheckStats> {
    let mut stats = CheckStats::default();
    if root == 0 {
        return Ok(stats);
    }
    let top = load(store, root, None, ALL_KEYS)?;
    if top.level > 0 && top.nkeys < 2 {
        return Err(corrupt(root, "interior root with a single child"));
    }
    stats.depth = u32::from(top.level) + 1;
    let mut seen = HashSet::from([root]);
    walk(store, top, &mut seen, &mut stats, visit_block)?;
    Ok(stats)
}

fn walk(
    store: &mut dyn NodeStore,
    node: Step,
    seen: &mut HashSet<u64>,
    stats: &mut CheckStats,
    visit_block: &mut dyn FnMut(u64),
) -> Result<()> {
    visit_block(node.buf.blkno);
    stats.nodes += 1;
    if node.level == 0 {
        stats.entries += node.nkeys as u64;
        return Ok(());
    }
    let children: Vec<(u64, Bounds)> = {
        let b = node.buf.read();
        (0..node.nkeys).map(|i| (interior_child(&b[..], i), child_bounds(&b[..], node.nkeys, i, node.bounds))).collect()
    };
    for (child, bounds) in children {
        // Levels only fall, so a repeat here is a block shared by two parents, not a cycle (the
        // key ranges would also catch it, as sibling ranges are disjoint; this names the fault).
        if !seen.insert(child) {
            return Err(corrupt(node.buf.blkno, format!("child {child} is reached twice")));
        }
        let step = load(store, child, Some(node.level - 1), bounds)?;
        walk(store, step, seen, stats, visit_block)?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Descent

/// Key range `[lo, hi)` a node must lie in; `hi == None` is unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Bounds {
    lo: u64,
    hi: Option<u64>,
}

const ALL_KEYS: Bounds = Bounds { lo: 0, hi: None };

/// A validated node on a root-to-leaf path, and (for interior nodes) the child taken.
struct Step {
    buf: BufRef,
    level: u8,
    nkeys: usize,
    bounds: Bounds,
    idx: usize,
}

/// Read and validate a node. `level` is the level its parent implies (None for the root).
fn load(store: &mut dyn NodeStore, blkno: u64, level: Option<u8>, bounds: Bounds) -> Result<Step> {
    let buf = store.read_node(blkno)?;
    let (level, nkeys) = {
        let b = buf.read();
        validate(&b[..], blkno, level, bounds)?;
        (b[OFF_LEVEL], nkeys_of(&b[..]))
    };
    Ok(Step { buf, level, nkeys, bounds, idx: 0 })
}

/// The path from the root to the leaf whose key range holds `key`.
fn path_to(store: &mut dyn NodeStore, root: u64, key: u64) -> Result<Vec<Step>> {
    let mut path = Vec::with_capacity(MAX_DEPTH);
    path.push(load(store, root, None, ALL_KEYS)?);
    descend(store, &mut path, key)?;
    Ok(path)
}

/// Route `key` from the last node of `path` down to a leaf, pushing every node on the way.
/// Bounded: each step goes one level down and the root level is below MAX_DEPTH.
fn descend(store: &mut dyn NodeStore, path: &mut Vec<Step>, key: u64) -> Result<()> {
    loop {
        let top = path.last_mut().expect("a path starts at the root");
        if top.level == 0 {
            return Ok(());
        }
        let (child, bounds) = {
            let b = top.buf.read();
            top.idx = route(&b[..], top.nkeys, key);
            (interior_child(&b[..], top.idx), child_bounds(&b[..], top.nkeys, top.idx, top.bounds))
        };
        let level = top.level - 1;
        path.push(load(store, child, Some(level), bounds)?);
    }
}

fn leaf_of(path: &[Step]) -> &Step {
    path.last().expect("a path ends at a leaf")
}

/// Drop the finished leaf and every ancestor whose last child it finished; the separator of the
/// next child of the deepest remaining ancestor is where the next leaf starts.
fn next_separator(path: &mut Vec<Step>) -> Option<u64> {
    path.pop();
    while let Some(top) = path.last() {
        if top.idx + 1 < top.nkeys {
            return Some(interior_key(&top.buf.read()[..], top.idx + 1));
        }
        path.pop();
    }
    None
}

/// Copy out the leaf's entries with key >= `from`, so the range callback runs with no buffer
/// lock held (it may well go through the buffer cache itself).
fn copy_entries_from(leaf: &Step, from: u64, entries: &mut Vec<(u64, Range<usize>)>, bytes: &mut Vec<u8>) {
    entries.clear();
    bytes.clear();
    let b = leaf.buf.read();
    let first = partition_point(0, leaf.nkeys, |i| leaf_key(&b[..], i) < from);
    for i in first..leaf.nkeys {
        let start = bytes.len();
        bytes.extend_from_slice(leaf_value(&b[..], i));
        entries.push((leaf_key(&b[..], i), start..bytes.len()));
    }
}

fn leaf_entry(leaf: &Step, i: usize) -> (u64, Vec<u8>) {
    let b = leaf.buf.read();
    (leaf_key(&b[..], i), leaf_value(&b[..], i).to_vec())
}

// ---------------------------------------------------------------------------------------------
// Structural changes

/// Where a new entry goes in the leaf at the end of a path.
struct Placement<'v> {
    pos: usize,
    replace: bool,
    key: u64,
    value: &'v [u8],
}

/// Insert into a leaf that has no room: split it, push the new separator up, split every full
/// ancestor on the way, and grow a new root if the old one split.
fn insert_splitting(store: &mut dyn NodeStore, root: &mut u64, path: &[Step], new: Placement) -> Result<()> {
    let (leaf, ancestors) = path.split_last().expect("a path ends at a leaf");
    let full = ancestors.iter().rev().take_while(|s| s.nkeys == INTERIOR_MAX_CHILDREN).count();
    let grows = full == ancestors.len();
    if grows && usize::from(path[0].level) + 1 >= MAX_DEPTH {
        // Unreachable in practice: ~126^15 splits are needed to get here.
        return Err(Error::NoSpace);
    }
    let mut fresh = alloc_nodes(store, 1 + full + usize::from(grows))?;
    let mut carry = split_leaf(store, leaf, fresh.pop().expect("allocated"), new);
    for parent in ancestors.iter().rev() {
        match add_child(store, parent, carry, &mut fresh) {
            Some(up) => carry = up,
            None => return Ok(()),
        }
    }
    let new_root = fresh.pop().expect("allocated");
    let level = path[0].level + 1;
    build_interior(&mut new_root.write()[..], level, &[(0, *root), carry]);
    finish(store, &new_root, level, ALL_KEYS);
    *root = new_root.blkno;
    Ok(())
}

/// `count` new nodes with their block header written; on failure none stay allocated.
fn alloc_nodes(store: &mut dyn NodeStore, count: usize) -> Result<Vec<BufRef>> {
    let mut nodes: Vec<BufRef> = Vec::with_capacity(count);
    for _ in 0..count {
        match store.new_node() {
            Ok(buf) => {
                init_header(&mut buf.write()[..], MAGIC_BTREE, buf.blkno, store.owner());
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

/// Split a full leaf while placing `new`; returns (separator, new right node) for the parent.
fn split_leaf(store: &mut dyn NodeStore, leaf: &Step, right: BufRef, new: Placement) -> (u64, u64) {
    let old: Block = **leaf.buf.read();
    let mut entries: Vec<(u64, &[u8])> = (0..leaf.nkeys).map(|i| (leaf_key(&old, i), leaf_value(&old, i))).collect();
    if new.replace {
        entries[new.pos] = (new.key, new.value);
    } else {
        entries.insert(new.pos, (new.key, new.value));
    }
    let sizes: Vec<usize> = entries.iter().map(|(_, v)| LEAF_SLOT + v.len()).collect();
    // Appending past the last key of the whole tree is how extent maps grow: keep the old leaf
    // full and start a new one, instead of leaving a trail of half-empty leaves.
    let appending = leaf.bounds.hi.is_none() && !new.replace && new.pos == leaf.nkeys;
    let cut = if appending { entries.len() - 1 } else { balanced_cut(&sizes) };
    let sep = entries[cut].0;
    build_leaf(&mut leaf.buf.write()[..], entries[..cut].iter().copied());
    build_leaf(&mut right.write()[..], entries[cut..].iter().copied());
    finish(store, &leaf.buf, 0, Bounds { lo: leaf.bounds.lo, hi: Some(sep) });
    finish(store, &right, 0, Bounds { lo: sep, hi: leaf.bounds.hi });
    (sep, right.blkno)
}

/// The cut (1..len) minimising the larger half. `sizes` holds at most one leaf's worth of
/// bytes plus one entry of at most LEAF_SLOT + MAX_VALUE, so the longest prefix that fits a
/// leaf leaves less than two max entries behind: a cut where both halves fit always exists.
fn balanced_cut(sizes: &[usize]) -> usize {
    let total: usize = sizes.iter().sum();
    let mut left = 0;
    let mut best = (usize::MAX, 1);
    for cut in 1..sizes.len() {
        left += sizes[cut - 1];
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
fn add_child(store: &mut dyn NodeStore, parent: &Step, carry: (u64, u64), fresh: &mut Vec<BufRef>) -> Option<(u64, u64)> {
    let mut entries = interior_entries(&parent.buf.read()[..], parent.nkeys);
    entries.insert(parent.idx + 1, carry);
    if entries.len() <= INTERIOR_MAX_CHILDREN {
        build_interior(&mut parent.buf.write()[..], parent.level, &entries);
        finish(store, &parent.buf, parent.level, parent.bounds);
        return None;
    }
    // Same append rule as leaves: the rightmost node growing at its end keeps itself full.
    let appending = parent.bounds.hi.is_none() && parent.idx + 1 == parent.nkeys;
    let cut = if appending { parent.nkeys } else { entries.len() / 2 };
    let sep = entries[cut].0;
    let right = fresh.pop().expect("allocated");
    build_interior(&mut parent.buf.write()[..], parent.level, &entries[..cut]);
    build_interior(&mut right.write()[..], parent.level, &entries[cut..]);
    finish(store, &parent.buf, parent.level, Bounds { lo: parent.bounds.lo, hi: Some(sep) });
    finish(store, &right, parent.level, Bounds { lo: sep, hi: parent.bounds.hi });
    Some((sep, right.blkno))
}

/// The leaf at the end of `path` lost its last entry: free it and every ancestor it leaves
/// childless, remove the link from the first ancestor that keeps children, and collapse a
/// root left with one child.
fn unlink_empty_leaf(store: &mut dyn NodeStore, root: &mut u64, path: &[Step]) -> Result<()> {
    let ancestors = &path[..path.len() - 1];
    let mut doomed: Vec<u64> = Vec::with_capacity(MAX_DEPTH);
    let Some(keep) = ancestors.iter().rposition(|s| s.nkeys > 1) else {
        doomed.extend(path.iter().map(|s| s.buf.blkno));
        *root = 0;
        return doomed.into_iter().try_for_each(|blkno| store.free_node(blkno));
    };
    doomed.extend(path[keep + 1..].iter().map(|s| s.buf.blkno));
    let parent = &path[keep];
    if keep == 0 && parent.nkeys == 2 {
        let (new_root, skipped) = surviving_root(store, parent)?;
        doomed.push(parent.buf.blkno);
        doomed.extend(skipped);
        *root = new_root;
    } else {
        let mut entries = interior_entries(&parent.buf.read()[..], parent.nkeys);
        entries.remove(parent.idx);
        build_interior(&mut parent.buf.write()[..], parent.level, &entries);
        finish(store, &parent.buf, parent.level, parent.bounds);
    }
    doomed.into_iter().try_for_each(|blkno| store.free_node(blkno))
}

/// The root keeps only the child it did not route through: that child becomes the root, or
/// rather the first node below it that is a leaf or has two children. Returns the new root and
/// the one-child interiors skipped on the way (to be freed). Only reads.
fn surviving_root(store: &mut dyn NodeStore, root: &Step) -> Result<(u64, Vec<u64>)> {
    let (mut blkno, bounds) = {
        let b = root.buf.read();
        let other = 1 - root.idx;
        (interior_child(&b[..], other), child_bounds(&b[..], root.nkeys, other, root.bounds))
    };
    let mut skipped = Vec::new();
    let mut level = root.level - 1;
    loop {
        // A one-child node's child has the same key range, so `bounds` carries down unchanged.
        let node = load(store, blkno, Some(level), bounds)?;
        if node.level == 0 || node.nkeys > 1 {
            return Ok((blkno, skipped));
        }
        skipped.push(blkno);
        blkno = interior_child(&node.buf.read()[..], 0);
        level -= 1;
    }
}

/// Record a node the tree just wrote. Debug builds first hold it to the rules a read enforces.
fn finish(store: &mut dyn NodeStore, buf: &BufRef, level: u8, bounds: Bounds) {
    if cfg!(debug_assertions) {
        if let Err(e) = validate(&buf.read()[..], buf.blkno, Some(level), bounds) {
            panic!("btree wrote an invalid node: {e}");
        }
    }
    store.dirty(buf);
}

// ---------------------------------------------------------------------------------------------
// Validation

fn corrupt(blkno: u64, detail: impl Into<String>) -> Error {
    Error::corrupt("btree node", blkno, detail)
}

/// Everything a node must satisfy before any other code here looks at it. `level` is what the
/// parent implies (None for a root), `bounds` the key range the parent gives it.
fn validate(b: &[u8], blkno: u64, level: Option<u8>, bounds: Bounds) -> Result<()> {
    let found = b[OFF_LEVEL];
    if usize::from(found) >= MAX_DEPTH || level.is_some_and(|l| l != found) {
        return Err(corrupt(blkno, format!("level {found}, expected {level:?}")));
    }
    if b[OFF_RESERVED_A] != 0 || b[OFF_RESERVED_B..NODE_HDR_END].iter().any(|&x| x != 0) {
        return Err(corrupt(blkno, "reserved header bytes set"));
    }
    let n = nkeys_of(b);
    let checked = if found == 0 { check_leaf(b, n, bounds) } else { check_interior(b, blkno, n, bounds) };
    checked.map_err(|detail| corrupt(blkno, detail))
}

fn check_leaf(b: &[u8], n: usize, bounds: Bounds) -> std::result::Result<(), String> {
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
    check_keys((0..n).map(|i| leaf_key(b, i)), bounds, false)
}

fn check_interior(b: &[u8], blkno: u64, n: usize, bounds: Bounds) -> std::result::Result<(), String> {
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
    check_keys((1..n).map(|i| interior_key(b, i)), bounds, true)
}

/// Keys strictly ascending, inside `bounds`; `lo_exclusive` for interior separators, which must
/// leave the child before them a non-empty range.
fn check_keys(keys: impl Iterator<Item = u64>, bounds: Bounds, lo_exclusive: bool) -> std::result::Result<(), String> {
    let mut prev: Option<u64> = None;
    for key in keys {
        let above_prev = match prev {
            Some(p) => key > p,
            None if lo_exclusive => key > bounds.lo,
            None => key >= bounds.lo,
        };
        if !above_prev || bounds.hi.is_some_and(|hi| key >= hi) {
            return Err(format!("key {key} out of order or outside {bounds:?}"));
        }
        prev = Some(key);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Node access. Readers assume a node that passed `validate`.

fn nkeys_of(b: &[u8]) -> usize {
    usize::from(get_u16(b, OFF_NKEYS))
}

fn value_start_of(b: &[u8]) -> usize {
    usize::from(get_u16(b, OFF_VALUE_START))
}

/// Write the node header; leaves the common block header (crc, lsn) to the journal.
fn write_node_header(b: &mut [u8], level: u8, nkeys: usize, value_start: usize) {
    b[HDR_SIZE..NODE_HDR_END].fill(0);
    b[OFF_LEVEL] = level;
    put_u16(b, OFF_NKEYS, nkeys as u16);
    put_u16(b, OFF_VALUE_START, value_start as u16);
}

/// First index in `lo..hi` where `below` turns false (`below` holds on a prefix).
fn partition_point(mut lo: usize, mut hi: usize, below: impl Fn(usize) -> bool) -> usize {
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

fn slot(i: usize) -> usize {
    NODE_HDR_END + i * LEAF_SLOT
}

fn leaf_key(b: &[u8], i: usize) -> u64 {
    get_u64(b, slot(i))
}

fn value_span(b: &[u8], i: usize) -> (usize, usize) {
    (usize::from(get_u16(b, slot(i) + 8)), usize::from(get_u16(b, slot(i) + 10)))
}

fn leaf_value(b: &[u8], i: usize) -> &[u8] {
    let (off, len) = value_span(b, i);
    &b[off..off + len]
}

fn write_slot(b: &mut [u8], i: usize, key: u64, off: usize, len: usize) {
    put_u64(b, slot(i), key);
    put_u16(b, slot(i) + 8, off as u16);
    put_u16(b, slot(i) + 10, len as u16);
}

/// Index of `key`, or the index it would be inserted at.
fn leaf_search(b: &[u8], n: usize, key: u64) -> std::result::Result<usize, usize> {
    let i = partition_point(0, n, |i| leaf_key(b, i) < key);
    if i < n && leaf_key(b, i) == key {
        Ok(i)
    } else {
        Err(i)
    }
}

/// Bytes still free for slots and values once dead value bytes are compacted away.
fn leaf_room(b: &[u8], n: usize) -> usize {
    let live: usize = (0..n).map(|i| LEAF_SLOT + value_span(b, i).1).sum();
    LEAF_SPACE - live
}

/// Drop slot `i`; its value bytes become garbage until the next compaction.
fn leaf_delete(b: &mut [u8], n: usize, i: usize) {
    b.copy_within(slot(i + 1)..slot(n), slot(i));
    b[slot(n - 1)..slot(n)].fill(0);
    put_u16(b, OFF_NKEYS, (n - 1) as u16);
}

/// Insert a slot at `i`; the caller has checked `leaf_room >= LEAF_SLOT + value.len()`.
fn leaf_put(b: &mut [u8], n: usize, i: usize, key: u64, value: &[u8]) {
    if value_start_of(b) < slot(n + 1) + value.len() {
        compact_leaf(b, n);
    }
    let off = value_start_of(b) - value.len();
    b[off..off + value.len()].copy_from_slice(value);
    b.copy_within(slot(i)..slot(n), slot(i + 1));
    write_slot(b, i, key, off, value.len());
    put_u16(b, OFF_NKEYS, (n + 1) as u16);
    put_u16(b, OFF_VALUE_START, off as u16);
}

fn compact_leaf(b: &mut [u8], n: usize) {
    let mut old = [0u8; BLOCK_SIZE];
    old.copy_from_slice(b);
    build_leaf(b, (0..n).map(|i| (leaf_key(&old, i), leaf_value(&old, i))));
}

/// Write a leaf holding `entries` (sorted, known to fit) with its values packed, no garbage.
fn build_leaf<'v>(b: &mut [u8], entries: impl IntoIterator<Item = (u64, &'v [u8])>) {
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
}

fn entry(i: usize) -> usize {
    NODE_HDR_END + i * INTERIOR_ENTRY
}

fn interior_key(b: &[u8], i: usize) -> u64 {
    get_u64(b, entry(i))
}

fn interior_child(b: &[u8], i: usize) -> u64 {
    get_u64(b, entry(i) + 8)
}

/// Child `i`'s key range inside its parent's range `bounds`.
fn child_bounds(b: &[u8], n: usize, i: usize, bounds: Bounds) -> Bounds {
    Bounds {
        lo: if i == 0 { bounds.lo } else { interior_key(b, i) },
        hi: if i + 1 < n { Some(interior_key(b, i + 1)) } else { bounds.hi },
    }
}

/// The child whose range holds `key`: the last one whose separator is <= key (child 0 if none).
fn route(b: &[u8], n: usize, key: u64) -> usize {
    partition_point(1, n, |i| interior_key(b, i) <= key) - 1
}

fn interior_entries(b: &[u8], n: usize) -> Vec<(u64, u64)> {
    (0..n).map(|i| (interior_key(b, i), interior_child(b, i))).collect()
}

/// Write an interior node; the first key is stored as 0 whatever `entries` says, since it
/// stands for the lower bound the parent gives.
fn build_interior(b: &mut [u8], level: u8, entries: &[(u64, u64)]) {
    for (i, &(key, child)) in entries.iter().enumerate() {
        put_u64(b, entry(i), if i == 0 { 0 } else { key });
        put_u64(b, entry(i) + 8, child);
    }
    b[entry(entries.len())..].fill(0);
    write_node_header(b, level, entries.len(), 0);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::buf::Buf;
    use crate::format::{header_magic, header_owner};
    use proptest::prelude::*;
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};
    use std::collections::{BTreeMap, HashMap};

    const OWNER: u64 = 77;
    /// Node reads one operation may make before the test calls it a runaway loop.
    const READ_LIMIT: u64 = 100_000;

    /// Blocks in a HashMap. Checks the block header like the engine's store but not the crc,
    /// so corruption tests exercise the tree's own validation.
    #[derive(Default)]
    struct MemStore {
        blocks: HashMap<u64, BufRef>,
        next: u64,
        free: Vec<u64>,
        dirtied: HashSet<u64>,
        reads: u64,
        allocs: usize,
        /// New nodes still allowed before new_node fails with NoSpace (None: unlimited).
        alloc_budget: Option<usize>,
    }

    impl MemStore {
        fn live(&self) -> usize {
            self.blocks.len()
        }

        fn deep_clone(&self) -> MemStore {
            let blocks = self.blocks.iter().map(|(&n, b)| (n, Buf::new(n, Box::new(**b.read())))).collect();
            MemStore { blocks, next: self.next, free: self.free.clone(), ..MemStore::default() }
        }

        fn snapshot(&self) -> HashMap<u64, Block> {
            self.blocks.iter().map(|(&n, b)| (n, **b.read())).collect()
        }

        /// Blocks that differ from `before` (or are new) but were not reported dirty.
        fn undirtied_changes(&self, before: &HashMap<u64, Block>) -> Vec<u64> {
            let changed = self.blocks.iter().filter(|(n, b)| before.get(n).is_none_or(|old| **b.read() != *old));
            changed.map(|(&n, _)| n).filter(|n| !self.dirtied.contains(n)).collect()
        }

        fn corrupt_byte(&self, blkno: u64, off: usize, xor: u8) {
            self.blocks[&blkno].write()[off] ^= xor;
        }
    }

    impl NodeStore for MemStore {
        fn read_node(&mut self, blkno: u64) -> Result<BufRef> {
            self.reads += 1;
            assert!(self.reads < READ_LIMIT, "runaway: {} node reads in one operation", self.reads);
            let buf = self.blocks.get(&blkno).cloned().ok_or_else(|| corrupt(blkno, "not allocated"))?;
            let header_ok = {
                let b = buf.read();
                header_magic(&b[..]) == MAGIC_BTREE && get_u64(&b[..], 8) == blkno && header_owner(&b[..]) == OWNER
            };
            if header_ok {
                Ok(buf)
            } else {
                Err(corrupt(blkno, "bad block header"))
            }
        }

        fn new_node(&mut self) -> Result<BufRef> {
            if let Some(budget) = &mut self.alloc_budget {
                if *budget == 0 {
                    return Err(Error::NoSpace);
                }
                *budget -= 1;
            }
            self.allocs += 1;
            let blkno = self.free.pop().unwrap_or_else(|| {
                self.next += 1;
                self.next
            });
            let buf = Buf::zeroed(blkno);
            self.blocks.insert(blkno, buf.clone());
            Ok(buf)
        }

        fn free_node(&mut self, blkno: u64) -> Result<()> {
            assert!(self.blocks.remove(&blkno).is_some(), "double free of block {blkno}");
            self.dirtied.remove(&blkno);
            self.free.push(blkno);
            Ok(())
        }

        fn dirty(&mut self, buf: &BufRef) {
            assert!(self.blocks.contains_key(&buf.blkno), "dirtied freed block {}", buf.blkno);
            self.dirtied.insert(buf.blkno);
        }

        fn owner(&self) -> u64 {
            OWNER
        }
    }

    /// A value whose bytes depend on key and seed, so a stale or misplaced value shows.
    fn value(key: u64, seed: u8, len: usize) -> Vec<u8> {
        (0..len).map(|i| (key as u8).wrapping_mul(31).wrapping_add(seed).wrapping_add(i as u8)).collect()
    }

    fn collect_range(store: &mut MemStore, root: u64, from: u64, limit: usize) -> Result<Vec<(u64, Vec<u8>)>> {
        let mut out = Vec::new();
        range(store, root, from, &mut |k, v| {
            assert!(out.len() < limit, "callback called after it returned false");
            out.push((k, v.to_vec()));
            Ok(out.len() < limit)
        })?;
        Ok(out)
    }

    /// Full check plus: the tree owns exactly the store's live blocks and holds the model.
    fn assert_matches(store: &mut MemStore, root: u64, model: &BTreeMap<u64, Vec<u8>>) -> CheckStats {
        let mut owned = HashSet::new();
        let stats = check(store, root, &mut |b| assert!(owned.insert(b))).expect("tree checks clean");
        assert_eq!(stats.entries, model.len() as u64);
        assert_eq!(owned, store.blocks.keys().copied().collect::<HashSet<_>>(), "leaked or foreign blocks");
        let all = collect_range(store, root, 0, usize::MAX).unwrap();
        assert!(all.iter().map(|(k, v)| (k, v)).eq(model.iter()));
        stats
    }

    /// A tree of `n` entries with random keys and value sizes.
    fn build(n: usize, seed: u64, max_len: usize) -> (MemStore, u64, BTreeMap<u64, Vec<u8>>) {
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut store, mut root, mut model) = (MemStore::default(), 0, BTreeMap::new());
        for _ in 0..n {
            let key = rng.gen_range(0..1_000_000);
            let v = value(key, 1, rng.gen_range(0..=max_len));
            assert_eq!(insert(&mut store, &mut root, key, &v).unwrap(), model.insert(key, v));
        }
        (store, root, model)
    }

    fn root_level(store: &mut MemStore, root: u64) -> u8 {
        store.read_node(root).unwrap().read()[OFF_LEVEL]
    }

    #[test]
    fn empty_tree() {
        let mut store = MemStore::default();
        let mut root = 0;
        assert_eq!(lookup(&mut store, root, 5).unwrap(), None);
        assert_eq!(floor(&mut store, root, u64::MAX).unwrap(), None);
        assert_eq!(remove(&mut store, &mut root, 5).unwrap(), None);
        assert!(collect_range(&mut store, root, 0, 10).unwrap().is_empty());
        assert_eq!(check(&mut store, root, &mut |_| panic!("no nodes")).unwrap(), CheckStats::default());
        destroy(&mut store, root).unwrap();
        assert_eq!((root, store.live()), (0, 0));
    }

    #[test]
    fn single_entry_round_trip() {
        let mut store = MemStore::default();
        let mut root = 0;
        assert_eq!(insert(&mut store, &mut root, 42, b"hello").unwrap(), None);
        assert_ne!(root, 0);
        assert_eq!(insert(&mut store, &mut root, 42, b"world").unwrap(), Some(b"hello".to_vec()));
        assert_eq!(lookup(&mut store, root, 42).unwrap(), Some(b"world".to_vec()));
        assert_eq!(lookup(&mut store, root, 41).unwrap(), None);
        assert_eq!(remove(&mut store, &mut root, 42).unwrap(), Some(b"world".to_vec()));
        assert_eq!((root, store.live()), (0, 0));
    }

    #[test]
    fn extreme_keys_and_empty_values() {
        let mut store = MemStore::default();
        let mut root = 0;
        let mut model = BTreeMap::new();
        for key in (0..LEAF_MAX_ENTRIES as u64 * 3).chain([u64::MAX, u64::MAX - 1]) {
            insert(&mut store, &mut root, key, b"").unwrap();
            model.insert(key, Vec::new());
        }
        assert!(root_level(&mut store, root) >= 1);
        assert_eq!(floor(&mut store, root, u64::MAX).unwrap(), Some((u64::MAX, vec![])));
        assert_eq!(floor(&mut store, root, u64::MAX - 2).unwrap().unwrap().0, LEAF_MAX_ENTRIES as u64 * 3 - 1);
        assert_matches(&mut store, root, &model);
    }

    #[test]
    fn oversized_value_is_rejected() {
        let mut store = MemStore::default();
        let mut root = 0;
        assert!(matches!(insert(&mut store, &mut root, 1, &[0; MAX_VALUE + 1]), Err(Error::Invalid(_))));
        assert_eq!((root, store.live()), (0, 0));
    }

    #[test]
    fn leaf_split_grows_root() {
        let mut store = MemStore::default();
        let mut root = 0;
        let mut model = BTreeMap::new();
        // Two max entries fill a leaf: the third splits it and grows a root above.
        for key in [30, 10, 20] {
            insert(&mut store, &mut root, key, &value(key, 0, MAX_VALUE)).unwrap();
            model.insert(key, value(key, 0, MAX_VALUE));
        }
        let stats = assert_matches(&mut store, root, &model);
        assert_eq!((stats.depth, stats.nodes), (2, 3));
    }

    #[test]
    fn interior_splits_grow_a_third_level() {
        let mut store = MemStore::default();
        let mut root = 0;
        let mut model = BTreeMap::new();
        let mut rng = StdRng::seed_from_u64(3);
        while model.len() < 3 * INTERIOR_MAX_CHILDREN {
            let key = rng.gen();
            insert(&mut store, &mut root, key, &value(key, 0, MAX_VALUE)).unwrap();
            model.insert(key, value(key, 0, MAX_VALUE));
        }
        let stats = assert_matches(&mut store, root, &model);
        assert_eq!(stats.depth, 3);
        for (k, v) in &model {
            assert_eq!(lookup(&mut store, root, *k).unwrap().as_ref(), Some(v));
        }
    }

    #[test]
    fn appending_keeps_leaves_full() {
        let mut store = MemStore::default();
        let mut root = 0;
        let n = 20 * LEAF_MAX_ENTRIES as u64;
        for key in 0..n {
            insert(&mut store, &mut root, key, b"").unwrap();
        }
        let stats = check(&mut store, root, &mut |_| ()).unwrap();
        // 20 full leaves plus one root: a balanced split would leave ~40 half-full leaves.
        assert_eq!((stats.entries, stats.nodes, stats.depth), (n, 21, 2));
    }

    #[test]
    fn appending_keeps_interior_nodes_full() {
        let mut store = MemStore::default();
        let mut root = 0;
        // Two max values per leaf: enough leaves to split the root interior by appending.
        let leaves = INTERIOR_MAX_CHILDREN as u64 + 10;
        for key in 0..2 * leaves {
            insert(&mut store, &mut root, key, &value(key, 0, MAX_VALUE)).unwrap();
        }
        let stats = check(&mut store, root, &mut |_| ()).unwrap();
        // Full leaves, one full level-1 node plus one holding the rest, and the new root.
        assert_eq!((stats.nodes, stats.depth), (leaves + 3, 3));
        let first = interior_child(&store.read_node(root).unwrap().read()[..], 0);
        assert_eq!(nkeys_of(&store.read_node(first).unwrap().read()[..]), INTERIOR_MAX_CHILDREN);
    }

    #[test]
    fn replace_with_larger_value_splits() {
        let (mut store, mut root, mut model) = (MemStore::default(), 0, BTreeMap::new());
        for key in 0..4 {
            insert(&mut store, &mut root, key, &value(key, 0, 900)).unwrap();
            model.insert(key, value(key, 0, 900));
        }
        assert_eq!(check(&mut store, root, &mut |_| ()).unwrap().depth, 1);
        let big = value(1, 9, MAX_VALUE);
        assert_eq!(insert(&mut store, &mut root, 1, &big).unwrap(), model.insert(1, big));
        assert_eq!(assert_matches(&mut store, root, &model).depth, 2);
    }

    #[test]
    fn compaction_reclaims_dead_value_bytes() {
        let (mut store, mut root, mut model) = (MemStore::default(), 0, BTreeMap::new());
        // Rewriting values in place leaves garbage; the leaf must compact rather than split.
        for round in 0..50u8 {
            for key in 0..2 {
                let v = value(key, round, MAX_VALUE - usize::from(round));
                insert(&mut store, &mut root, key, &v).unwrap();
                model.insert(key, v);
            }
        }
        assert_eq!(assert_matches(&mut store, root, &model).nodes, 1);
    }

    #[test]
    fn removing_everything_collapses_to_empty() {
        let (mut store, mut root, mut model) = build(3000, 7, MAX_VALUE);
        assert_eq!(check(&mut store, root, &mut |_| ()).unwrap().depth, 3);
        let mut keys: Vec<u64> = model.keys().copied().collect();
        keys.sort_by_key(|k| k.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        for (i, key) in keys.into_iter().enumerate() {
            assert_eq!(remove(&mut store, &mut root, key).unwrap(), model.remove(&key));
            assert_eq!(remove(&mut store, &mut root, key).unwrap(), None);
            if i % 200 == 0 {
                assert_matches(&mut store, root, &model);
            }
        }
        assert_eq!((root, store.live()), (0, 0));
    }

    #[test]
    fn root_collapses_when_left_with_one_child() {
        let mut store = MemStore::default();
        let mut root = 0;
        for key in [1, 2, 3] {
            insert(&mut store, &mut root, key, &value(key, 0, MAX_VALUE)).unwrap();
        }
        let grown = root;
        assert_eq!(check(&mut store, root, &mut |_| ()).unwrap().nodes, 3);
        // Appending 3 split [1, 2] off as a full leaf; emptying the right leaf [3] leaves the
        // root with one child, and that leaf takes the root's place.
        remove(&mut store, &mut root, 3).unwrap();
        assert_ne!(root, grown);
        let stats = check(&mut store, root, &mut |_| ()).unwrap();
        assert_eq!((stats.depth, stats.nodes, stats.entries), (1, 1, 2));
        assert_eq!(store.live(), 1);
    }

    #[test]
    fn collapse_skips_one_child_interiors() {
        // Three levels; then empty the left half of the tree so that the root's surviving child
        // is itself reduced to one child before the last left entry goes.
        let (mut store, mut root, mut model) = build(2000, 11, MAX_VALUE);
        assert_eq!(check(&mut store, root, &mut |_| ()).unwrap().depth, 3);
        let mut keys: Vec<u64> = model.keys().copied().collect();
        // Remove from both ends inward, keeping a single entry in the middle.
        while keys.len() > 1 {
            let key = if keys.len().is_multiple_of(2) { keys.remove(0) } else { keys.pop().unwrap() };
            remove(&mut store, &mut root, key).unwrap();
            model.remove(&key);
        }
        let stats = assert_matches(&mut store, root, &model);
        assert_eq!((stats.depth, stats.nodes, stats.entries), (1, 1, 1));
    }

    #[test]
    fn floor_across_leaves() {
        let (mut store, root, model) = build(2000, 5, 600);
        let mut rng = StdRng::seed_from_u64(9);
        let probes = model.keys().flat_map(|&k| [k, k.saturating_sub(1), k + 1]).chain((0..2000).map(|_| rng.gen()));
        for probe in probes.chain([0, u64::MAX]) {
            let want = model.range(..=probe).next_back().map(|(k, v)| (*k, v.clone()));
            assert_eq!(floor(&mut store, root, probe).unwrap(), want, "floor({probe})");
        }
    }

    #[test]
    fn range_from_the_middle() {
        let (mut store, root, model) = build(3000, 6, 300);
        let depth = check(&mut store, root, &mut |_| ()).unwrap().depth;
        let keys: Vec<u64> = model.keys().copied().collect();
        for &from in &[keys[1500], keys[1500] + 1, keys[0], 0, keys[keys.len() - 1], u64::MAX] {
            let want: Vec<(u64, Vec<u8>)> = model.range(from..).map(|(k, v)| (*k, v.clone())).collect();
            assert_eq!(collect_range(&mut store, root, from, usize::MAX).unwrap(), want);
            store.reads = 0;
            let first = collect_range(&mut store, root, from, 1).unwrap();
            assert_eq!(first, want.into_iter().take(1).collect::<Vec<_>>());
            // One descent, plus at most one more when `from` lies past its leaf's last key.
            assert!(store.reads <= 2 * u64::from(depth), "{} reads for one entry", store.reads);
        }
        // Climbing the saved path instead of re-descending: a full scan reads each node once.
        store.reads = 0;
        collect_range(&mut store, root, 0, usize::MAX).unwrap();
        let reads = store.reads;
        assert_eq!(reads, check(&mut store, root, &mut |_| ()).unwrap().nodes);
    }

    #[test]
    fn range_callback_error_stops_the_walk() {
        let (mut store, root, _) = build(500, 8, 100);
        let mut calls = 0;
        let r = range(&mut store, root, 0, &mut |_, _| {
            calls += 1;
            Err(Error::Range)
        });
        assert!(matches!(r, Err(Error::Range)));
        assert_eq!(calls, 1);
    }

    #[test]
    fn destroy_frees_every_node() {
        let (mut store, root, _) = build(3000, 4, MAX_VALUE);
        assert!(store.live() > 100);
        destroy(&mut store, root).unwrap();
        assert_eq!(store.live(), 0);
    }

    #[test]
    fn allocation_failure_changes_nothing() {
        let (mut store, mut root, model) = build(2000, 12, MAX_VALUE);
        let mut rng = StdRng::seed_from_u64(13);
        for _ in 0..300 {
            let before = store.snapshot();
            let old_root = root;
            store.alloc_budget = Some(rng.gen_range(0..2));
            let key = rng.gen();
            match insert(&mut store, &mut root, key, &value(key, 0, MAX_VALUE)) {
                Err(Error::NoSpace) => {
                    assert_eq!(root, old_root);
                    assert_eq!(store.snapshot(), before, "failed insert modified the tree");
                }
                Ok(_) => {
                    remove(&mut store, &mut root, key).unwrap();
                }
                Err(e) => panic!("{e}"),
            }
        }
        store.alloc_budget = None;
        assert_matches(&mut store, root, &model);
    }

    #[test]
    fn allocation_failure_mid_split_returns_what_it_took() {
        let mut store = MemStore::default();
        let mut root = 0;
        for key in [10, 20] {
            insert(&mut store, &mut root, key, &value(key, 0, MAX_VALUE)).unwrap();
        }
        // A third max entry needs two nodes (right leaf, new root); only one is available.
        let before = store.snapshot();
        store.alloc_budget = Some(1);
        assert!(matches!(insert(&mut store, &mut root, 15, &value(15, 0, MAX_VALUE)), Err(Error::NoSpace)));
        assert_eq!(store.snapshot(), before);
        assert_eq!(store.free.len(), 1, "the node taken before the failure was given back");
        store.alloc_budget = None;
        insert(&mut store, &mut root, 15, &value(15, 0, MAX_VALUE)).unwrap();
        assert_eq!(check(&mut store, root, &mut |_| ()).unwrap().entries, 3);
    }

    #[test]
    fn every_changed_node_is_dirtied() {
        let mut rng = StdRng::seed_from_u64(21);
        let (mut store, mut root) = (MemStore::default(), 0);
        for _ in 0..4000 {
            let before = store.snapshot();
            store.dirtied.clear();
            let key = rng.gen_range(0..1500);
            if rng.gen_bool(0.6) {
                insert(&mut store, &mut root, key, &value(key, 2, rng.gen_range(0..=MAX_VALUE))).unwrap();
            } else {
                remove(&mut store, &mut root, key).unwrap();
            }
            assert_eq!(store.undirtied_changes(&before), Vec::<u64>::new());
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64, usize, u8),
        Remove(u64),
        Lookup(u64),
        Floor(u64),
        Range(u64, usize),
    }

    fn key_in(space: u64) -> impl Strategy<Value = u64> {
        prop_oneof![4 => 0..space, 1 => any::<u64>(), 1 => Just(0u64), 1 => Just(u64::MAX)]
    }

    fn len_for(profile: u8) -> BoxedStrategy<usize> {
        match profile {
            0 => (0usize..24).boxed(),
            1 => (0..=MAX_VALUE).boxed(),
            _ => (MAX_VALUE - 64..=MAX_VALUE).boxed(),
        }
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        // A small key space forces replaces and hits on remove; any::<u64> spreads keys wide.
        (prop_oneof![Just(64u64), Just(2_000), Just(1 << 40)], 0u8..3).prop_flat_map(|(space, profile)| {
            let op = prop_oneof![
                6 => (key_in(space), len_for(profile), any::<u8>()).prop_map(|(k, l, s)| Op::Insert(k, l, s)),
                3 => key_in(space).prop_map(Op::Remove),
                1 => key_in(space).prop_map(Op::Lookup),
                1 => key_in(space).prop_map(Op::Floor),
                1 => (key_in(space), 1usize..400).prop_map(|(k, n)| Op::Range(k, n)),
            ];
            proptest::collection::vec(op, 1..2000)
        })
    }

    fn run_model(ops: &[Op]) {
        let (mut store, mut root, mut model) = (MemStore::default(), 0, BTreeMap::new());
        for op in ops {
            store.reads = 0;
            match *op {
                Op::Insert(k, len, seed) => {
                    let v = value(k, seed, len);
                    let levels = if root == 0 { 0 } else { usize::from(root_level(&mut store, root)) + 1 };
                    store.allocs = 0;
                    assert_eq!(insert(&mut store, &mut root, k, &v).unwrap(), model.insert(k, v));
                    assert!(store.allocs <= (levels + 1).min(MAX_NEW_NODES_PER_INSERT));
                }
                Op::Remove(k) => assert_eq!(remove(&mut store, &mut root, k).unwrap(), model.remove(&k)),
                Op::Lookup(k) => assert_eq!(lookup(&mut store, root, k).unwrap().as_ref(), model.get(&k)),
                Op::Floor(k) => {
                    let want = model.range(..=k).next_back().map(|(k, v)| (*k, v.clone()));
                    assert_eq!(floor(&mut store, root, k).unwrap(), want);
                }
                Op::Range(from, n) => {
                    let want: Vec<_> = model.range(from..).take(n).map(|(k, v)| (*k, v.clone())).collect();
                    assert_eq!(collect_range(&mut store, root, from, n).unwrap(), want);
                }
            }
        }
        assert_matches(&mut store, root, &model);
        destroy(&mut store, root).unwrap();
        assert_eq!(store.live(), 0);
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]
        #[test]
        fn behaves_like_btreemap(ops in ops()) {
            run_model(&ops);
        }
    }

    /// Run every operation against a damaged store; each may fail but none may panic or loop.
    fn exercise(store: &mut MemStore, mut root: u64, rng: &mut StdRng) {
        for _ in 0..40 {
            store.reads = 0;
            let key = rng.gen_range(0..1_000_000);
            let _ = match rng.gen_range(0..7) {
                0 => lookup(store, root, key).map(drop),
                1 => floor(store, root, key).map(drop),
                2 => collect_range(store, root, key, rng.gen_range(1..5000)).map(drop),
                3 => insert(store, &mut root, key, &value(key, 3, rng.gen_range(0..=MAX_VALUE))).map(drop),
                4 => remove(store, &mut root, key).map(drop),
                5 => check(store, root, &mut |_| ()).map(drop),
                _ => destroy(store, root).map(|()| root = 0),
            };
        }
    }

    #[test]
    fn random_corruption_never_panics() {
        let (pristine, root, _) = build(1500, 31, 700);
        let blocks: Vec<u64> = pristine.blocks.keys().copied().collect();
        let mut rng = StdRng::seed_from_u64(32);
        let mut detected = 0;
        for _ in 0..3000 {
            let mut store = pristine.deep_clone();
            for _ in 0..rng.gen_range(1..4) {
                let blkno = blocks[rng.gen_range(0..blocks.len())];
                // Mostly the node header and the slot area, where a flip changes structure.
                let off = if rng.gen_bool(0.8) { rng.gen_range(HDR_SIZE..512) } else { rng.gen_range(0..BLOCK_SIZE) };
                store.corrupt_byte(blkno, off, 1 << rng.gen_range(0..8));
            }
            detected += usize::from(check(&mut store, root, &mut |_| ()).is_err());
            exercise(&mut store, root, &mut rng);
        }
        // Flips inside value bytes are invisible without the crc; the rest should be caught.
        assert!(detected > 500, "check caught only {detected} corruptions");
    }

    /// A pristine multi-level tree and the block numbers of its root and first child.
    fn two_levels() -> (MemStore, u64, u64) {
        let (mut store, root, _) = build(1500, 41, 700);
        let child = interior_child(&store.read_node(root).unwrap().read()[..], 0);
        (store, root, child)
    }

    fn expect_corrupt(store: &mut MemStore, root: u64) {
        assert!(matches!(check(store, root, &mut |_| ()), Err(Error::Corrupt { .. })));
        let mut rng = StdRng::seed_from_u64(42);
        exercise(store, root, &mut rng);
    }

    fn set_u16(store: &MemStore, blkno: u64, off: usize, v: u16) {
        put_u16(&mut store.blocks[&blkno].write()[..], off, v);
    }

    fn set_u64(store: &MemStore, blkno: u64, off: usize, v: u64) {
        put_u64(&mut store.blocks[&blkno].write()[..], off, v);
    }

    #[test]
    fn targeted_corruption_is_reported() {
        type Damage = fn(&MemStore, u64, u64);
        let cases: [(&str, Damage); 12] = [
            ("child pointer 0", |s, r, _| set_u64(s, r, entry(1) + 8, 0)),
            ("child points to itself", |s, r, _| set_u64(s, r, entry(1) + 8, r)),
            ("child points to its parent", |s, r, c| set_u64(s, c, entry(0) + 8, r)),
            ("two parents share a child", |s, r, _| {
                let other = get_u64(&s.blocks[&r].read()[..], entry(0) + 8);
                set_u64(s, r, entry(1) + 8, other)
            }),
            ("huge nkeys", |s, r, _| set_u16(s, r, OFF_NKEYS, u16::MAX)),
            ("zero nkeys", |s, _, c| set_u16(s, c, OFF_NKEYS, 0)),
            ("leaf nkeys over capacity", |s, _, c| set_u16(s, c, OFF_NKEYS, LEAF_MAX_ENTRIES as u16 + 1)),
            ("value past the block end", |s, _, c| set_u16(s, c, slot(0) + 8, BLOCK_SIZE as u16 - 1)),
            ("value start inside the slots", |s, _, c| set_u16(s, c, OFF_VALUE_START, NODE_HDR_END as u16)),
            ("level mismatch", |s, _, c| s.blocks[&c].write()[OFF_LEVEL] = 3),
            ("root level too deep", |s, r, _| s.blocks[&r].write()[OFF_LEVEL] = MAX_DEPTH as u8),
            ("separator out of order", |s, r, _| set_u64(s, r, entry(1), u64::MAX)),
        ];
        for (what, damage) in cases {
            let (mut store, root, child) = two_levels();
            damage(&store, root, child);
            assert!(check(&mut store, root, &mut |_| ()).is_err(), "{what} not detected");
            expect_corrupt(&mut store, root);
        }
    }

    #[test]
    fn damage_only_one_rule_catches_is_reported() {
        type Damage = fn(&MemStore, u64, u64);
        let cases: [(&str, Damage); 4] = [
            ("leaf keys swapped", |s, _, c| {
                let (k0, k1) = (get_u64(&s.blocks[&c].read()[..], slot(0)), get_u64(&s.blocks[&c].read()[..], slot(1)));
                set_u64(s, c, slot(0), k1);
                set_u64(s, c, slot(1), k0);
            }),
            ("leaf key at its upper bound", |s, r, c| {
                let hi = interior_key(&s.blocks[&r].read()[..], 1);
                let last = nkeys_of(&s.blocks[&c].read()[..]) - 1;
                set_u64(s, c, slot(last), hi);
            }),
            ("reserved byte set", |s, _, c| s.blocks[&c].write()[OFF_RESERVED_B + 3] = 1),
            ("interior value_start set", |s, r, _| set_u16(s, r, OFF_VALUE_START, 100)),
        ];
        for (what, damage) in cases {
            let (mut store, root, child) = two_levels();
            damage(&store, root, child);
            assert!(check(&mut store, root, &mut |_| ()).is_err(), "{what} not detected");
            expect_corrupt(&mut store, root);
        }
    }

    #[test]
    fn leaf_at_the_wrong_depth_is_reported() {
        let (mut store, root, _) = build(3000, 7, MAX_VALUE);
        let level1 = interior_child(&store.read_node(root).unwrap().read()[..], 0);
        let leaf = interior_child(&store.read_node(level1).unwrap().read()[..], 0);
        // Same key range, one level too high: only the level rule objects.
        set_u64(&store, root, entry(0) + 8, leaf);
        expect_corrupt(&mut store, root);
    }

    #[test]
    fn overlapping_values_are_reported() {
        let (mut store, root, child) = two_levels();
        let second = get_u16(&store.blocks[&child].read()[..], slot(1) + 8);
        set_u16(&store, child, slot(0) + 8, second);
        expect_corrupt(&mut store, root);
    }

    #[test]
    fn key_outside_parent_range_is_reported() {
        let (mut store, root, _) = two_levels();
        let right = interior_child(&store.read_node(root).unwrap().read()[..], 1);
        set_u64(&store, right, slot(0), 0);
        expect_corrupt(&mut store, root);
    }
}
