//! References to inodes held from outside the engine: the handles of in-process callers
//! (`FileSystem::open`) and the FUSE kernel's lookup counts (`FileSystem::hold`). An inode
//! that loses its last name while held stays, on the orphan list, until its last reference
//! goes (docs/DESIGN.md, "Lifetime of an unlinked inode").
//!
//! A side table, not a field of the cached inode: the kernel may hold references to every
//! inode it caches, millions of them, and pinning each whole inode in the engine's cache would
//! leave its budget meaningless. An entry is an inode number and one word (count and flags) in
//! a hash map, about 20 bytes.

use crate::lockstat::{LockClass, Mutex};
use crossbeam_utils::CachePadded;
use rustc_hash::FxHashMap;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::time::{Duration, Instant};

/// A leaf: taken under inode locks, never while waiting for another lock.
static HOLDS: LockClass = LockClass::ranked("holds", 90);

/// Shards of the table, each behind its own lock: concurrent lookups of different inodes
/// rarely meet.
const SHARDS: usize = 64;
/// The inode lost its last name while held: the last reference frees it.
const UNLINKED: u64 = 1 << 63;
/// An unnamed file (O_TMPFILE without O_EXCL) that `link` may name: Linux's I_LINKABLE.
const LINKABLE: u64 = 1 << 62;
/// The reference count, below the flags.
const COUNT: u64 = LINKABLE - 1;
/// How long an allocation that finds no space waits for inodes about to be freed (`wait_for_frees`).
const FREES_WAIT: Duration = Duration::from_millis(200);

/// Inode number to its word: the count, and the flags above it.
type Shard = Mutex<FxHashMap<u64, u64>>;

pub(crate) struct Holds {
    shards: Box<[CachePadded<Shard>]>,
    /// Inodes that lost their last name while held and are not freed yet (flagged UNLINKED,
    /// or dropped and being freed until `freed`).
    pending_frees: AtomicU64,
}

impl Holds {
    pub(crate) fn new() -> Holds {
        Holds {
            shards: (0..SHARDS).map(|_| CachePadded::new(Mutex::new(&HOLDS, FxHashMap::default()))).collect(),
            pending_frees: AtomicU64::new(0),
        }
    }

    fn shard(&self, ino: u64) -> &Shard {
        &self.shards[ino as usize % SHARDS]
    }

    /// Take `n` references to `ino`.
    pub(crate) fn take(&self, ino: u64, n: u64) {
        let mut shard = self.shard(ino).lock();
        let word = shard.entry(ino).or_insert(0);
        debug_assert!(
            (*word & COUNT).checked_add(n).is_some_and(|c| c <= COUNT),
            "hold count of inode {ino} overflows"
        );
        *word += n;
    }

    /// Take the one reference of the caller that made `ino` without a name (a tmpfile).
    pub(crate) fn take_unnamed(&self, ino: u64, linkable: bool) {
        let flags = UNLINKED | if linkable { LINKABLE } else { 0 };
        let previous = self.shard(ino).lock().insert(ino, flags | 1);
        debug_assert!(previous.is_none(), "new inode {ino} was already held");
        self.pending_frees.fetch_add(1, Relaxed);
    }

    /// Drop `n` references to `ino`. Returns whether they were the last ones of an inode that
    /// lost its last name meanwhile: the caller frees it, then calls `freed`. Dropping more references than were
    /// taken is a caller's bug; the count stops at zero.
    pub(crate) fn drop(&self, ino: u64, n: u64) -> bool {
        let mut shard = self.shard(ino).lock();
        let Some(word) = shard.get_mut(&ino) else {
            debug_assert!(false, "{n} references to inode {ino} dropped, none held");
            return false;
        };
        debug_assert!(*word & COUNT >= n, "{n} references to inode {ino} dropped, {} held", *word & COUNT);
        if *word & COUNT > n {
            *word -= n;
            return false;
        }
        let unlinked = *word & UNLINKED != 0;
        shard.remove(&ino);
        unlinked
    }

    /// Whether `ino` is held.
    pub(crate) fn is_held(&self, ino: u64) -> bool {
        self.shard(ino).lock().contains_key(&ino)
    }

    /// `ino` loses its last name. Returns whether it is held, and then notes that its last
    /// reference must free it; taken under the inode's lock, so that a concurrent last drop
    /// either sees the note or happened before (and the caller frees the inode itself).
    pub(crate) fn unlinked(&self, ino: u64) -> bool {
        match self.shard(ino).lock().get_mut(&ino) {
            Some(word) => {
                if *word & UNLINKED == 0 {
                    *word |= UNLINKED;
                    self.pending_frees.fetch_add(1, Relaxed);
                }
                true
            }
            None => false,
        }
    }

    /// Whether `ino` is a held unnamed file that `link` may name.
    pub(crate) fn is_linkable(&self, ino: u64) -> bool {
        self.shard(ino).lock().get(&ino).is_some_and(|word| word & LINKABLE != 0)
    }

    /// `ino` got a name: no longer freed by its last reference, and never linkable again.
    pub(crate) fn named(&self, ino: u64) {
        if let Some(word) = self.shard(ino).lock().get_mut(&ino) {
            if *word & UNLINKED != 0 {
                self.pending_frees.fetch_sub(1, Relaxed);
            }
            *word &= !(UNLINKED | LINKABLE);
        }
    }

    /// An inode `drop` or `drain` returned was freed (or could not be: it stays on the orphan
    /// list for the next mount).
    pub(crate) fn freed(&self) {
        let before = self.pending_frees.fetch_sub(1, Relaxed);
        debug_assert!(before > 0, "more inodes freed than were pending");
    }

    /// For an allocation that found no space: wait, briefly, until one of the inodes that
    /// lost their last name while held is freed. The kernel forgets a file `rm` unlinked as
    /// the unlink returns, but the daemon frees it when that FORGET is served, which may be
    /// after the program's next request: without the wait, space just freed would fail it
    /// with ENOSPC. An inode still open keeps its space, and the wait ends at its bound.
    /// Returns whether one was freed.
    pub(crate) fn wait_for_frees(&self) -> bool {
        let pending = self.pending_frees.load(Relaxed);
        let deadline = Instant::now() + FREES_WAIT;
        while pending > 0 && Instant::now() < deadline {
            if self.pending_frees.load(Relaxed) < pending {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    /// Drop every reference (the client is gone); returns the inodes that lost their last
    /// name while held, which the caller frees.
    pub(crate) fn drain(&self) -> Vec<u64> {
        let mut unlinked = Vec::new();
        for shard in self.shards.iter() {
            let mut shard = shard.lock();
            unlinked.extend(shard.iter().filter(|(_, word)| *word & UNLINKED != 0).map(|(ino, _)| *ino));
            shard.clear();
            shard.shrink_to_fit();
        }
        unlinked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_drop_of_an_unlinked_inode_frees_it() {
        let holds = Holds::new();
        holds.take(7, 2);
        assert!(holds.unlinked(7));
        assert!(!holds.drop(7, 1));
        assert!(holds.is_held(7));
        assert_eq!(holds.pending_frees.load(Relaxed), 1);
        assert!(holds.drop(7, 1));
        assert!(!holds.is_held(7));
        holds.freed();
        assert_eq!(holds.pending_frees.load(Relaxed), 0);
        // Nothing pending: no wait.
        let start = Instant::now();
        assert!(!holds.wait_for_frees());
        assert!(start.elapsed() < FREES_WAIT);
        // Not held: the caller frees it at once.
        assert!(!holds.unlinked(7));
    }

    #[test]
    fn a_named_tmpfile_is_not_freed_and_not_linkable() {
        let holds = Holds::new();
        holds.take_unnamed(9, true);
        assert!(holds.is_linkable(9));
        holds.named(9);
        assert!(!holds.is_linkable(9));
        assert_eq!(holds.pending_frees.load(Relaxed), 0);
        holds.take(9, 3);
        assert!(!holds.drop(9, 4));
    }

    #[test]
    fn drain_returns_the_unlinked() {
        let holds = Holds::new();
        holds.take(1, 5);
        holds.take_unnamed(2, false);
        holds.take(3, 1);
        assert!(holds.unlinked(3));
        let mut unlinked = holds.drain();
        unlinked.sort();
        assert_eq!(unlinked, [2, 3]);
        assert!(!holds.is_held(1));
    }
}
