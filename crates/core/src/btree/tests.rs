//! The B+tree against a model (a BTreeMap) and against damage: unit tests, as they reach the
//! node layout and the crate-internal buffers that no public API exposes.

use super::*;
use crate::buf::{Block, Buf};
use crate::format::log::ALL_CHUNKS;
use crate::format::{
    get_u16, get_u64, header_magic, header_owner, put_u16, put_u64, BLOCK_SIZE, HDR_SIZE, MAGIC_BTREE,
};
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

    /// Change a block behind the tree's back, as a bad disk would. Like a block read
    /// afresh, it is handed out unverified, so the tree validates it again.
    fn tamper(&self, blkno: u64, change: impl FnOnce(&mut [u8])) {
        let buf = &self.blocks[&blkno];
        buf.change(|b| {
            change(b);
            ALL_CHUNKS
        });
        buf.set_verified(false);
    }

    fn corrupt_byte(&self, blkno: u64, off: usize, xor: u8) {
        self.tamper(blkno, |b| b[off] ^= xor);
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
        // As a commit would: debug builds check that the changes were all marked.
        buf.take_changed(&buf.read());
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
        assert_eq!(insert(&mut store, &mut root, key, &v).unwrap(), model.insert(key, v).is_some());
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
    assert!(!remove(&mut store, &mut root, 5).unwrap());
    assert!(collect_range(&mut store, root, 0, 10).unwrap().is_empty());
    assert_eq!(check(&mut store, root, &mut |_| panic!("no nodes")).unwrap(), CheckStats::default());
    destroy(&mut store, root).unwrap();
    assert_eq!((root, store.live()), (0, 0));
}

#[test]
fn single_entry_round_trip() {
    let mut store = MemStore::default();
    let mut root = 0;
    assert!(!insert(&mut store, &mut root, 42, b"hello").unwrap());
    assert_ne!(root, 0);
    assert!(insert(&mut store, &mut root, 42, b"world").unwrap());
    assert_eq!(lookup(&mut store, root, 42).unwrap(), Some(b"world".to_vec()));
    assert_eq!(lookup(&mut store, root, 41).unwrap(), None);
    assert!(remove(&mut store, &mut root, 42).unwrap());
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
    assert_eq!(insert(&mut store, &mut root, 1, &big).unwrap(), model.insert(1, big).is_some());
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
        assert_eq!(remove(&mut store, &mut root, key).unwrap(), model.remove(&key).is_some());
        assert!(!remove(&mut store, &mut root, key).unwrap());
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
                assert_eq!(insert(&mut store, &mut root, k, &v).unwrap(), model.insert(k, v).is_some());
                assert!(store.allocs <= (levels + 1).min(MAX_NEW_NODES_PER_INSERT));
            }
            Op::Remove(k) => assert_eq!(remove(&mut store, &mut root, k).unwrap(), model.remove(&k).is_some()),
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

fn set_u8(store: &MemStore, blkno: u64, off: usize, v: u8) {
    store.tamper(blkno, |b| b[off] = v);
}

fn set_u16(store: &MemStore, blkno: u64, off: usize, v: u16) {
    store.tamper(blkno, |b| put_u16(b, off, v));
}

fn set_u64(store: &MemStore, blkno: u64, off: usize, v: u64) {
    store.tamper(blkno, |b| put_u64(b, off, v));
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
        ("level mismatch", |s, _, c| set_u8(s, c, OFF_LEVEL, 3)),
        ("root level too deep", |s, r, _| set_u8(s, r, OFF_LEVEL, MAX_DEPTH as u8)),
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
        ("reserved byte set", |s, _, c| set_u8(s, c, OFF_RESERVED_B + 3, 1)),
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

fn verified_blocks(store: &MemStore) -> HashSet<u64> {
    store.blocks.iter().filter(|(_, b)| b.is_verified()).map(|(&n, _)| n).collect()
}

#[test]
fn nodes_the_tree_writes_are_marked_verified() {
    let (mut store, mut root, _) = build(3000, 61, 600);
    let all: HashSet<u64> = store.blocks.keys().copied().collect();
    assert_eq!(verified_blocks(&store), all);
    // Splits, in-place changes and a collapse keep every node marked.
    let mut rng = StdRng::seed_from_u64(62);
    for _ in 0..2000 {
        let key = rng.gen_range(0..1_000_000);
        if rng.gen_bool(0.5) {
            insert(&mut store, &mut root, key, &value(key, 4, rng.gen_range(0..=MAX_VALUE))).unwrap();
        } else {
            remove(&mut store, &mut root, key).unwrap();
        }
    }
    let all: HashSet<u64> = store.blocks.keys().copied().collect();
    assert_eq!(verified_blocks(&store), all);
}

#[test]
fn structure_is_validated_once_per_buffer() {
    let (pristine, root, model) = build(1500, 51, 700);
    // As if every block had just been read from disk: nothing is marked.
    let mut store = pristine.deep_clone();
    assert!(verified_blocks(&store).is_empty());
    let key = *model.keys().next().unwrap();
    assert_eq!(lookup(&mut store, root, key).unwrap().as_ref(), model.get(&key));
    let depth = check(&mut pristine.deep_clone(), root, &mut |_| ()).unwrap().depth;
    let leaf = interior_child(&store.blocks[&root].read()[..], 0);
    assert_eq!(verified_blocks(&store), HashSet::from([root, leaf]), "only the path was validated");
    assert_eq!(depth, 2);
    // A marked node is trusted: structure damage that bypasses the mark (a bad disk cannot,
    // a block read afresh is unmarked) goes unseen by lookups, which check only placement,
    // while fsck's check validates every node afresh.
    store.blocks[&leaf].change(|b| {
        b[OFF_RESERVED_B] = 1;
        ALL_CHUNKS
    });
    assert_eq!(lookup(&mut store, root, key).unwrap().as_ref(), model.get(&key));
    assert!(matches!(check(&mut store, root, &mut |_| ()), Err(Error::Corrupt { .. })));
}

#[test]
fn placement_is_checked_on_every_access() {
    let (store, root, child) = two_levels();
    assert_eq!(check(&mut store.deep_clone(), root, &mut |_| ()).unwrap().depth, 2);
    let right = interior_child(&store.blocks[&root].read()[..], 1);
    let in_right = get_u64(&store.blocks[&right].read()[..], slot(1));
    // Damage that only the parent can see, kept marked verified: every access catches it.
    let cases: [(&str, u64, usize, u64); 2] = [("level", child, OFF_LEVEL, 1), ("key below range", right, slot(0), 0)];
    for (what, blkno, off, v) in cases {
        let (mut store, _, _) = two_levels();
        assert!(store.blocks[&blkno].is_verified());
        let key = if blkno == child { 0 } else { in_right };
        assert!(lookup(&mut store, root, key).is_ok());
        store.blocks[&blkno].change(|b| {
            if off == OFF_LEVEL {
                b[off] = v as u8;
            } else {
                put_u64(b, off, v);
            }
            ALL_CHUNKS
        });
        assert!(store.blocks[&blkno].is_verified());
        for _ in 0..2 {
            assert!(matches!(lookup(&mut store, root, key), Err(Error::Corrupt { .. })), "{what}: lookup");
            assert!(matches!(floor(&mut store, root, key), Err(Error::Corrupt { .. })), "{what}: floor");
            assert!(matches!(collect_range(&mut store, root, key, 1), Err(Error::Corrupt { .. })), "{what}: range");
            assert!(
                matches!(insert(&mut store, &mut { root }, key, b"x"), Err(Error::Corrupt { .. })),
                "{what}: insert"
            );
            assert!(matches!(remove(&mut store, &mut { root }, key), Err(Error::Corrupt { .. })), "{what}: remove");
        }
    }
}
