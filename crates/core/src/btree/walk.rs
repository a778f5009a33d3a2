//! Descent: root-to-leaf paths, routing a key to its leaf, and the whole-tree walks of
//! [`check`](super::check) and [`destroy`](super::destroy).

use std::collections::HashSet;

use super::node::*;
use super::{CheckStats, NodeStore, MAX_DEPTH};
use crate::buf::BufRef;
use crate::error::Result;

/// A validated node on a root-to-leaf path. For an interior node, also the child the descent
/// took, as read under the same lock: its index, block and key range.
pub(super) struct Step {
    pub(super) buf: BufRef,
    pub(super) level: u8,
    pub(super) nkeys: usize,
    pub(super) bounds: Bounds,
    pub(super) idx: usize,
    pub(super) child: u64,
    pub(super) child_bounds: Bounds,
}

/// A root-to-leaf path, held in place (no heap): a descent is at most MAX_DEPTH nodes long,
/// since every step goes exactly one level down from a root level below MAX_DEPTH.
pub(super) struct Path {
    steps: [Option<Step>; MAX_DEPTH],
    len: usize,
}

impl Path {
    pub(super) fn new() -> Path {
        Path { steps: [const { None }; MAX_DEPTH], len: 0 }
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn push(&mut self, step: Step) {
        // Unreachable: the level checks bound every path (see above).
        assert!(self.len < MAX_DEPTH, "btree path deeper than MAX_DEPTH");
        self.steps[self.len] = Some(step);
        self.len += 1;
    }

    pub(super) fn pop(&mut self) {
        self.len -= 1;
        self.steps[self.len] = None;
    }

    pub(super) fn get(&self, i: usize) -> &Step {
        assert!(i < self.len);
        self.steps[i].as_ref().expect("steps below len are set")
    }

    pub(super) fn last(&self) -> Option<&Step> {
        self.len.checked_sub(1).map(|i| self.get(i))
    }

    pub(super) fn last_mut(&mut self) -> Option<&mut Step> {
        let i = self.len.checked_sub(1)?;
        self.steps[i].as_mut()
    }

    pub(super) fn leaf(&self) -> &Step {
        self.last().expect("a path ends at a leaf")
    }
}

/// Read node `blkno` (at the level and inside the key range its parent implies; None for the
/// root), check it, and under the same read lock either route `key` through it (interior) or
/// run the leaf action on it (leaf; `at_leaf` is taken, a descent reaches one leaf).
pub(super) fn visit<R, F>(
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
pub(super) fn find_leaf<R>(
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
pub(super) fn descend<R>(
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
pub(super) fn load(
    store: &mut dyn NodeStore,
    blkno: u64,
    level: Option<u8>,
    bounds: Bounds,
    full: bool,
) -> Result<Step> {
    let owner = store.owner();
    let buf = store.read_node(blkno)?;
    let (level, nkeys) = check_node(&buf, &buf.read()[..], owner, level, bounds, full)?;
    Ok(Step { buf, level, nkeys, bounds, idx: 0, child: 0, child_bounds: bounds })
}

/// Drop the finished leaf and every ancestor whose last child it finished; move the deepest
/// remaining ancestor on to its next child, whose separator is where the next leaf starts.
pub(super) fn next_separator(path: &mut Path) -> Option<u64> {
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

pub(super) fn leaf_entry(b: &[u8], i: usize) -> (u64, Vec<u8>) {
    (leaf_key(b, i), leaf_value(b, i).to_vec())
}

// ---------------------------------------------------------------------------------------------
// Whole-tree walks

pub(super) fn walk_tree(
    store: &mut dyn NodeStore,
    root: u64,
    full: bool,
    visit_block: &mut dyn FnMut(u64),
) -> Result<CheckStats> {
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

pub(super) fn walk(
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
