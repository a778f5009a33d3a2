//! Caches keyed by number: the metadata buffer cache and the inode cache share one sharded
//! hash map. Lookups take only a shard's read lock (never an exclusive lock); shards are
//! cache-line padded so two CPUs looking up different keys do not bounce one line.

use crate::buf::{Buf, BufRef};
use crate::dev::BlockDevice;
use crate::error::Result;
use crate::format::{verify_block, BLOCK_SIZE};
use crate::lockstat::{LockClass, RwLock};
use crossbeam_utils::CachePadded;
use rustc_hash::FxHashMap;
use std::sync::Arc;

const SHARDS: usize = 64;

pub struct ShardedMap<V: Clone> {
    shards: Box<[CachePadded<RwLock<FxHashMap<u64, V>>>]>,
}

impl<V: Clone> ShardedMap<V> {
    pub fn new(class: &'static LockClass) -> Self {
        ShardedMap { shards: (0..SHARDS).map(|i| CachePadded::new(RwLock::new_indexed(class, i as u64, FxHashMap::default()))).collect() }
    }

    fn shard(&self, k: u64) -> &RwLock<FxHashMap<u64, V>> {
        // Fibonacci hashing spreads sequential inode and block numbers over the shards.
        &self.shards[(k.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 58) as usize % SHARDS]
    }

    pub fn get(&self, k: u64) -> Option<V> {
        self.shard(k).read().get(&k).cloned()
    }

    /// Insert unless present; returns the value that is in the map afterwards.
    pub fn get_or_insert(&self, k: u64, v: V) -> V {
        self.shard(k).write().entry(k).or_insert(v).clone()
    }

    pub fn insert(&self, k: u64, v: V) {
        self.shard(k).write().insert(k, v);
    }

    pub fn remove(&self, k: u64) -> Option<V> {
        self.shard(k).write().remove(&k)
    }

    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Visit every value, one shard at a time, without holding a lock while `f` runs: a
    /// shard's values are copied out in a batch first (seed 003: batched cache walks).
    pub fn for_each(&self, mut f: impl FnMut(u64, &V)) {
        for s in self.shards.iter() {
            let batch: Vec<(u64, V)> = s.read().iter().map(|(k, v)| (*k, v.clone())).collect();
            for (k, v) in &batch {
                f(*k, v);
            }
        }
    }
}

static BUF_CACHE: LockClass = LockClass::ranked("buf-cache", 60);

/// Verified metadata blocks. A block is checked once, when it is first read; from then on
/// the in-memory copy is authoritative (every change to it goes through the journal).
pub struct BufCache {
    dev: Arc<dyn BlockDevice>,
    map: ShardedMap<BufRef>,
}

impl BufCache {
    pub fn new(dev: Arc<dyn BlockDevice>) -> BufCache {
        BufCache { dev, map: ShardedMap::new(&BUF_CACHE) }
    }

    /// The cached block, reading and verifying it on a miss.
    pub fn read(&self, blkno: u64, what: &'static str, magic: u32, owner: Option<u64>) -> Result<BufRef> {
        if let Some(b) = self.map.get(blkno) {
            return Ok(b);
        }
        let mut data = Box::new([0u8; BLOCK_SIZE]);
        self.dev.read_at(&mut data[..], blkno * BLOCK_SIZE as u64)?;
        verify_block(&data[..], what, magic, blkno, owner)?;
        Ok(self.map.get_or_insert(blkno, Buf::new(blkno, data)))
    }

    /// A buffer for a block being (re)initialised as metadata, zeroed. A cached buffer for
    /// the same block is reused, so its log version keeps rising across free and reuse.
    pub fn get_new(&self, blkno: u64) -> BufRef {
        let b = self.map.get_or_insert(blkno, Buf::zeroed(blkno));
        b.write().fill(0);
        b.set_verified(false);
        b
    }

    pub fn get(&self, blkno: u64) -> Option<BufRef> {
        self.map.get(blkno)
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}
