//! What a cached object tells the cache that reclaims it. A module of its own so that the
//! cached types (`buf::Buf`, `inode::Inode`) and the cache that holds them (`cache`) both
//! depend on it and not on each other.

use std::sync::atomic::AtomicBool;

/// What a cached object tells reclaim.
pub trait Reclaimable {
    /// Set on lookup, cleared by a reclaim scan: an object is dropped only if no lookup
    /// touched it since the last scan.
    fn referenced(&self) -> &AtomicBool;
    /// Its newest image is at home (nothing in the log is newer) and it holds no state the
    /// disk does not (dirty data, open handles): dropping it loses nothing.
    fn is_clean(&self, home_seq: u64) -> bool;
}
