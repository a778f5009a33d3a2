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

use std::collections::HashSet;

use crate::buf::{Block, BufRef};
use crate::error::{Error, Result};
use crate::format::log::{chunks_of, ChunkMask, ALL_CHUNKS};
use crate::format::{
    get_u16, get_u64, header_magic, header_owner, init_header, put_u16, put_u64, BLOCK_SIZE, HDR_SIZE, MAGIC_BTREE,
};

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
        leaf.buf.change(|b| if replace { leaf_replace(b, leaf.nkeys, pos, value) } else { leaf_put(b, leaf.nkeys, pos, key, value) });
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
                todo.push((interior_child(&b[..], i), Some(step.level - 1), child_bounds(&b[..], step.nkeys, i, step.bounds)));
            }
        }
    }
    Ok(skipped)
}

fn walk_tree(store: &mut dyn NodeStore, root: u64, full: bool, visit_block: &mut dyn FnMut(u64)) -> Result<CheckStats> {
    let mut stats = CheckStats::default();
    if root == 0 {
        return Ok(stats);
    }
    let top = load(store, root, None, ALL_KEYS, full)?;
    if top.level > 0 && top.nkeys < 2 {
        return Err(corrupt(root, "interior root with a single child"));
    }
    stats.depth = u32::from(top.level) + 1;
    let mut seen = HashSet::from([root]);
    walk(store, top, full, &mut seen, &mut stats, visit_block)?;
    Ok(stats)
}

fn walk(
    store: &mut dyn NodeStore,
    node: Step,
    full: bool,
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
        let step = load(store, child, Some(node.level - 1), bounds, full)?;
        walk(store, step, full, seen, stats, visit_block)?;
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

/// A validated node on a root-to-leaf path. For an interior node, also the child the descent
/// took, as read under the same lock: its index, block and key range.
struct Step {
    buf: BufRef,
    level: u8,
    nkeys: usize,
    bounds: Bounds,
    idx: usize,
    child: u64,
    child_bounds: Bounds,
}

/// A root-to-leaf path, held in place (no heap): a descent is at most MAX_DEPTH nodes long,
/// since every step goes exactly one level down from a root level below MAX_DEPTH.
struct Path {
    steps: [Option<Step>; MAX_DEPTH],
    len: usize,
}

impl Path {
    fn new() -> Path {
        Path { steps: [const { None }; MAX_DEPTH], len: 0 }
    }

    fn len(&self) -> usize {
        self.len
    }

    fn push(&mut self, step: Step) {
        // Unreachable: the level checks bound every path (see above).
        assert!(self.len < MAX_DEPTH, "btree path deeper than MAX_DEPTH");
        self.steps[self.len] = Some(step);
        self.len += 1;
    }

    fn pop(&mut self) {
        self.len -= 1;
        self.steps[self.len] = None;
    }

    fn get(&self, i: usize) -> &Step {
        assert!(i < self.len);
        self.steps[i].as_ref().expect("steps below len are set")
    }

    fn last(&self) -> Option<&Step> {
        self.len.checked_sub(1).map(|i| self.get(i))
    }

    fn last_mut(&mut self) -> Option<&mut Step> {
        let i = self.len.checked_sub(1)?;
        self.steps[i].as_mut()
    }

    fn leaf(&self) -> &Step {
        self.last().expect("a path ends at a leaf")
    }
}

/// A few values on the stack (fresh nodes of one insert, blocks one removal frees).
struct Few<T, const N: usize> {
    items: [Option<T>; N],
    len: usize,
}

impl<T, const N: usize> Few<T, N> {
    fn new() -> Self {
        Few { items: [const { None }; N], len: 0 }
    }

    fn push(&mut self, item: T) {
        assert!(self.len < N, "more than {N} items");
        self.items[self.len] = Some(item);
        self.len += 1;
    }

    fn pop(&mut self) -> T {
        self.len -= 1;
        self.items[self.len].take().expect("items below len are set")
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.items[..self.len].iter().map(|i| i.as_ref().expect("items below len are set"))
    }
}

/// Read node `blkno` (at the level and inside the key range its parent implies; None for the
/// root), check it, and under the same read lock either route `key` through it (interior) or
/// run the leaf action on it (leaf; `at_leaf` is taken, a descent reaches one leaf).
fn visit<R, F>(
    store: &mut dyn NodeStore,
    blkno: u64,
    level: Option<u8>,
    bounds: Bounds,
    key: u64,
    at_leaf: &mut Option<F>,
) -> Result<(Step, Option<R>)>
where
    F: FnOnce(&[u8], usize, Bounds) -> Result<R>,
{
    let owner = store.owner();
    let buf = store.read_node(blkno)?;
    let (level, nkeys, idx, child, child_bounds, done) = {
        let b = buf.read();
        let (level, n) = check_node(&buf, &b[..], owner, level, bounds, false)?;
        if level == 0 {
            let f = at_leaf.take().expect("a descent reaches one leaf");
            (0, n, 0, 0, bounds, Some(f(&b[..], n, bounds)?))
        } else {
            let idx = route(&b[..], n, key);
            (level, n, idx, interior_child(&b[..], idx), child_bounds(&b[..], n, idx, bounds), None)
        }
    };
    Ok((Step { buf, level, nkeys, bounds, idx, child, child_bounds }, done))
}

/// Route `key` from the root down to its leaf without keeping the path, and return what
/// `at_leaf(leaf bytes, nkeys, leaf bounds)` makes of the leaf (run under its read lock).
/// Bounded: each step goes one level down and the root level is below MAX_DEPTH.
fn find_leaf<R>(
    store: &mut dyn NodeStore,
    root: u64,
    key: u64,
    at_leaf: impl FnOnce(&[u8], usize, Bounds) -> Result<R>,
) -> Result<R> {
    let mut at_leaf = Some(at_leaf);
    let (mut blkno, mut level, mut bounds) = (root, None, ALL_KEYS);
    // One level down per pass (`visit` checks each node is at the level expected): at most
    // the root's level + 1 passes, and that level is below MAX_DEPTH.
    loop {
        let (step, done) = visit(store, blkno, level, bounds, key, &mut at_leaf)?;
        if let Some(r) = done {
            return Ok(r);
        }
        (blkno, level, bounds) = (step.child, Some(step.level - 1), step.child_bounds);
    }
}

/// Route `key` from the last node of `path` (already routed; from the root if `path` is
/// empty) down to a leaf, pushing every node on the way, and return what `at_leaf` makes of
/// the leaf (run under its read lock). Bounded like [`find_leaf`].
fn descend<R>(
    store: &mut dyn NodeStore,
    path: &mut Path,
    root: u64,
    key: u64,
    at_leaf: impl FnOnce(&[u8], usize, Bounds) -> Result<R>,
) -> Result<R> {
    let mut at_leaf = Some(at_leaf);
    // One level down per pass, as in `find_leaf`.
    loop {
        let (blkno, level, bounds) = match path.last() {
            None => (root, None, ALL_KEYS),
            Some(top) => {
                debug_assert!(top.level > 0, "descending from a leaf");
                (top.child, Some(top.level - 1), top.child_bounds)
            }
        };
        let (step, done) = visit(store, blkno, level, bounds, key, &mut at_leaf)?;
        path.push(step);
        if let Some(r) = done {
            return Ok(r);
        }
    }
}

/// Read and check a node without routing through it.
fn load(store: &mut dyn NodeStore, blkno: u64, level: Option<u8>, bounds: Bounds, full: bool) -> Result<Step> {
    let owner = store.owner();
    let buf = store.read_node(blkno)?;
    let (level, nkeys) = check_node(&buf, &buf.read()[..], owner, level, bounds, full)?;
    Ok(Step { buf, level, nkeys, bounds, idx: 0, child: 0, child_bounds: bounds })
}

/// Drop the finished leaf and every ancestor whose last child it finished; move the deepest
/// remaining ancestor on to its next child, whose separator is where the next leaf starts.
fn next_separator(path: &mut Path) -> Option<u64> {
    path.pop();
    while let Some(top) = path.last_mut() {
        if top.idx + 1 < top.nkeys {
            top.idx += 1;
            let b = top.buf.read();
            top.child = interior_child(&b[..], top.idx);
            top.child_bounds = child_bounds(&b[..], top.nkeys, top.idx, top.bounds);
            return Some(top.child_bounds.lo);
        }
        path.pop();
    }
    None
}

fn leaf_entry(b: &[u8], i: usize) -> (u64, Vec<u8>) {
    (leaf_key(b, i), leaf_value(b, i).to_vec())
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

/// New nodes of one insert.
type Fresh = Few<BufRef, MAX_NEW_NODES_PER_INSERT>;

/// Insert into a leaf that has no room: split it, push the new separator up, split every full
/// ancestor on the way, and grow a new root if the old one split.
fn insert_splitting(store: &mut dyn NodeStore, root: &mut u64, path: &Path, new: Placement) -> Result<()> {
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
fn alloc_nodes(store: &mut dyn NodeStore, count: usize) -> Result<Fresh> {
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
struct Merged<'a> {
    old: &'a [u8],
    pos: usize,
    replace: bool,
    key: u64,
    value: &'a [u8],
}

impl<'a> Merged<'a> {
    fn get(&self, j: usize) -> (u64, &'a [u8]) {
        if j == self.pos {
            return (self.key, self.value);
        }
        let i = if j < self.pos || self.replace { j } else { j - 1 };
        (leaf_key(self.old, i), leaf_value(self.old, i))
    }
}

/// Split a full leaf while placing `new`; returns (separator, new right node) for the parent.
fn split_leaf(store: &mut dyn NodeStore, leaf: &Step, right: BufRef, new: Placement) -> (u64, u64) {
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
fn balanced_cut(len: usize, size: impl Fn(usize) -> usize) -> usize {
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
fn add_child(store: &mut dyn NodeStore, parent: &Step, carry: (u64, u64), fresh: &mut Fresh) -> Option<(u64, u64)> {
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
type Doomed = Few<u64, { 2 * MAX_DEPTH }>;

/// The leaf at the end of `path` lost its last entry: free it and every ancestor it leaves
/// childless, remove the link from the first ancestor that keeps children, and collapse a
/// root left with one child.
fn unlink_empty_leaf(store: &mut dyn NodeStore, root: &mut u64, path: &Path) -> Result<()> {
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

fn free_all(store: &mut dyn NodeStore, doomed: &Doomed) -> Result<()> {
    doomed.iter().try_for_each(|&blkno| store.free_node(blkno))
}

/// The root keeps only the child it did not route through: that child becomes the root, or
/// rather the first node below it that is a leaf or has two children. Returns the new root
/// and adds the old root and the one-child interiors skipped on the way to `doomed`. Only
/// reads (so on error nothing has changed; `doomed` is then dropped).
fn surviving_root(store: &mut dyn NodeStore, root: &Step, doomed: &mut Doomed) -> Result<u64> {
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
fn finish(store: &mut dyn NodeStore, buf: &BufRef, level: u8, bounds: Bounds) {
    if cfg!(debug_assertions) {
        let owner = store.owner();
        if let Err(e) = validate(&buf.read()[..], buf.blkno, owner, Some(level), bounds) {
            panic!("btree wrote an invalid node: {e}");
        }
    }
    buf.set_verified(true);
    store.dirty(buf);
}

// ---------------------------------------------------------------------------------------------
// Validation

fn corrupt(blkno: u64, detail: impl Into<String>) -> Error {
    Error::corrupt("btree node", blkno, detail)
}

/// The checks of a node read at `buf.blkno`, before any other code here looks at it: its own
/// structure if the buffer is not marked verified yet (or `full`), then marks it; its place in
/// the tree every time. Returns (level, nkeys).
fn check_node(buf: &BufRef, b: &[u8], owner: u64, level: Option<u8>, bounds: Bounds, full: bool) -> Result<(u8, usize)> {
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
fn validate(b: &[u8], blkno: u64, owner: u64, level: Option<u8>, bounds: Bounds) -> Result<()> {
    check_header(b, blkno, owner)?;
    check_structure(b, blkno).map_err(|detail| corrupt(blkno, detail))?;
    check_place(b, level, bounds).map_err(|detail| corrupt(blkno, detail))
}

/// The store checks the block header when it reads a block from disk; a cached block reached
/// through another tree's (corrupt) pointer must not pass for one of this tree's nodes.
fn check_header(b: &[u8], blkno: u64, owner: u64) -> Result<()> {
    if header_magic(b) != MAGIC_BTREE || header_owner(b) != owner {
        return Err(corrupt(blkno, format!("not a btree node of owner {owner}")));
    }
    Ok(())
}

/// What a node must satisfy on its own, whatever its parent: validated once per buffer.
fn check_structure(b: &[u8], blkno: u64) -> std::result::Result<(), String> {
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
fn check_place(b: &[u8], level: Option<u8>, bounds: Bounds) -> std::result::Result<(), String> {
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

fn check_leaf(b: &[u8], n: usize) -> std::result::Result<(), String> {
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

fn check_interior(b: &[u8], blkno: u64, n: usize) -> std::result::Result<(), String> {
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
fn check_ascending(mut keys: impl Iterator<Item = u64>) -> std::result::Result<(), String> {
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

/// Whether a new entry with a `len`-byte value fits (`leaf_room >= LEAF_SLOT + len`): at once
/// if it fits the gap between slots and values, else counting the garbage compaction frees.
fn put_fits(b: &[u8], n: usize, len: usize) -> bool {
    value_start_of(b) >= slot(n + 1) + len || leaf_room(b, n) >= LEAF_SLOT + len
}

/// Whether entry `i`'s value can be replaced by a `len`-byte one (`leaf_room` plus the old
/// value `>= len`): at once if it is no longer or fits the gap, else counting the garbage.
fn replace_fits(b: &[u8], n: usize, i: usize, len: usize) -> bool {
    let old = value_span(b, i).1;
    len <= old || value_start_of(b) >= slot(n) + len || leaf_room(b, n) + old >= len
}

/// The chunks of the node header (`nkeys`, `value_start`, and interior entry 0's key).
fn header_chunks() -> ChunkMask {
    chunks_of(0..NODE_HDR_END)
}

// The mutators below return the chunks they changed, for the log (`Buf::change`).

/// Drop slot `i`; its value bytes become garbage until the next compaction.
fn leaf_delete(b: &mut [u8], n: usize, i: usize) -> ChunkMask {
    b.copy_within(slot(i + 1)..slot(n), slot(i));
    b[slot(n - 1)..slot(n)].fill(0);
    put_u16(b, OFF_NKEYS, (n - 1) as u16);
    header_chunks() | chunks_of(slot(i)..slot(n))
}

/// Insert a slot at `i`; the caller has checked `put_fits`.
fn leaf_put(b: &mut [u8], n: usize, i: usize, key: u64, value: &[u8]) -> ChunkMask {
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
fn leaf_replace(b: &mut [u8], n: usize, i: usize, value: &[u8]) -> ChunkMask {
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

fn compact_leaf(b: &mut [u8], n: usize) -> ChunkMask {
    let mut old = [0u8; BLOCK_SIZE];
    old.copy_from_slice(b);
    build_leaf(b, (0..n).map(|i| (leaf_key(&old, i), leaf_value(&old, i))))
}

/// Write a leaf holding `entries` (sorted, known to fit) with its values packed, no garbage.
fn build_leaf<'v>(b: &mut [u8], entries: impl IntoIterator<Item = (u64, &'v [u8])>) -> ChunkMask {
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

/// Insert `(sep, child)` as entry `at` (>= 1) of an interior node with `n` < capacity entries.
fn interior_insert(b: &mut [u8], n: usize, at: usize, (sep, child): (u64, u64)) -> ChunkMask {
    debug_assert!(at >= 1 && n < INTERIOR_MAX_CHILDREN);
    b.copy_within(entry(at)..entry(n), entry(at + 1));
    put_u64(b, entry(at), sep);
    put_u64(b, entry(at) + 8, child);
    put_u16(b, OFF_NKEYS, (n + 1) as u16);
    header_chunks() | chunks_of(entry(at)..entry(n + 1))
}

/// Remove entry `i` of an interior node with `n` > 1 entries; the first key stays 0.
fn interior_remove(b: &mut [u8], n: usize, i: usize) -> ChunkMask {
    b.copy_within(entry(i + 1)..entry(n), entry(i));
    b[entry(n - 1)..entry(n)].fill(0);
    put_u64(b, entry(0), 0);
    put_u16(b, OFF_NKEYS, (n - 1) as u16);
    header_chunks() | chunks_of(entry(0)..entry(1)) | chunks_of(entry(i)..entry(n))
}

/// Write an interior node; the first key is stored as 0 whatever `entries` says, since it
/// stands for the lower bound the parent gives.
fn build_interior(b: &mut [u8], level: u8, entries: &[(u64, u64)]) -> ChunkMask {
    for (i, &(key, child)) in entries.iter().enumerate() {
        put_u64(b, entry(i), if i == 0 { 0 } else { key });
        put_u64(b, entry(i) + 8, child);
    }
    b[entry(entries.len())..].fill(0);
    write_node_header(b, level, entries.len(), 0);
    ALL_CHUNKS
}

#[cfg(test)]
mod tests;
