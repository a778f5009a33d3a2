//! Debug-build lock-order checking over a thread-local stack of held
//! ranked locks. Every entry point is a no-op when `debug_assertions` is off.

use std::cell::RefCell;

use crate::class::LockClass;
use crate::meter::Meter;
use crate::sync::thread_local;

struct Held {
    key: usize,
    rank: u32,
    class: &'static LockClass,
    idx: Option<u64>,
}

thread_local! {
    static HELD: RefCell<Vec<Held>> = const { RefCell::new(Vec::new()) };
}

/// Identifies the lock instance (its meter is part of it).
fn key(m: &Meter) -> usize {
    std::ptr::from_ref(m).addr()
}

/// The rank of `m`'s class, if ranked and checking is compiled in.
#[inline]
fn rank(m: &Meter) -> Option<u32> {
    if cfg!(debug_assertions) {
        m.class().rank
    } else {
        None
    }
}

fn label(class: &LockClass, idx: Option<u64>) -> String {
    match idx {
        Some(idx) => format!("{}[{idx}]", class.name),
        None => class.name.to_string(),
    }
}

/// Whether `m` (of rank `rank`) may be acquired while `held` is held.
fn may_follow(held: &Held, rank: u32, m: &Meter) -> bool {
    held.rank < rank
        || (held.rank == rank
            && std::ptr::eq(held.class, m.class())
            && matches!((held.idx, m.idx()), (Some(h), Some(n)) if h < n))
}

/// Panics if acquiring `m` now would break the declared order.
#[inline]
pub(super) fn check(m: &Meter) {
    let Some(rank) = rank(m) else {
        return;
    };
    let clash = HELD
        .try_with(|held| {
            let held = held.borrow();
            let bad = held.iter().find(|h| !may_follow(h, rank, m))?;
            Some(format!("{} (rank {})", label(bad.class, bad.idx), bad.rank))
        })
        .ok()
        .flatten();
    if let Some(held) = clash {
        panic!("lock order violation: acquiring {} (rank {rank}) while holding {held}", label(m.class(), m.idx()));
    }
}

#[inline]
pub(super) fn push(m: &Meter) {
    let Some(rank) = rank(m) else {
        return;
    };
    let entry = Held { key: key(m), rank, class: m.class(), idx: m.idx() };
    // Fails only during thread teardown, when there is nothing to check.
    let _ = HELD.try_with(|held| held.borrow_mut().push(entry));
}

/// Removes the newest entry for `m`; guards may be dropped out of order.
#[inline]
pub(super) fn pop(m: &Meter) {
    if rank(m).is_none() {
        return;
    }
    let _ = HELD.try_with(|held| {
        let mut held = held.borrow_mut();
        if let Some(pos) = held.iter().rposition(|h| h.key == key(m)) {
            held.remove(pos);
        }
    });
}
