//! Model checking of the concurrent fast paths with shuttle (see `crates/lockstat/src/sync.rs`
//! for the choice and the shim): the real CIL commit/switch, `AgCache`
//! lookup/insert/remove/reclaim, the AG's orphan slot claim/release, `lockstat`'s counters, AIL
//! writeback against a free and checkpoints in flight run on shuttle's threads, locks and
//! atomics, under its randomized and PCT schedulers.
//!
//! `cargo test -p ferrofs --features shuttle --test model_check` (what `scripts/test.sh` runs).
//! `MODEL_CHECK_ITERATIONS` sets the schedules per scheduler and test (default 5000). A failure
//! prints the schedule; `shuttle::replay` with it reproduces the run.
#![cfg(feature = "shuttle")]

use ferrofs::ag::Ag;
use ferrofs::cache::{inode_ag, AgCache, BufCache, CacheBudget, CacheOwner};
use ferrofs::dev::BlockDevice;
use ferrofs::dev::MemDevice;
use ferrofs::format::log::{ItemKey, LogHeader, ALL_CHUNKS};
use ferrofs::format::INODE_SIZE;
use ferrofs::format::{init_header, seal_block, BLOCK_SIZE, HDR_SIZE, MAGIC_BITMAP};
use ferrofs::journal::{recover, BusyExtent, Journal, JournalConfig, Route};
use ferrofs::mkfs::{self, MkfsOptions};
use ferrofs::reclaim::Reclaimable;
use ferrofs_lockstat::{self as lockstat, LockClass, Mutex, RwLock, POOL_SHARDS};
use shuttle::scheduler::{PctScheduler, RandomScheduler};
use shuttle::sync::Mutex as CheckedMutex;
use shuttle::{thread, Config, Runner};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;

/// The checker's statics (lock classes' counters) are not meant for two OS threads at once,
/// so the tests of this binary take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn iterations() -> usize {
    std::env::var("MODEL_CHECK_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000)
}

/// Each property under both schedulers: random walks find shallow bugs in many places, PCT
/// (depth 3) is good at the rare orders of a few preemptions.
fn check(f: impl Fn() + Send + Sync + 'static) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // The code under test uses relaxed atomics, which shuttle runs as SeqCst
    // (`ferrofs_lockstat::sync` says so once); its warning about that would only repeat it.
    let mut config = Config::new();
    config.silence_warnings = true;
    let f = Arc::new(f);
    let g = Arc::clone(&f);
    Runner::new(RandomScheduler::new(iterations()), config.clone()).run(move || g());
    Runner::new(PctScheduler::new(3, iterations()), config).run(move || f());
}

/// A metadata block as the engine logs one: a sealed header (the journal verifies what it
/// seals into the log and writes home, in debug builds), then `fill` to the end.
fn sealed_block(blkno: u64, fill: u8) -> Vec<u8> {
    let mut b = vec![fill; BLOCK_SIZE];
    init_header(&mut b, MAGIC_BITMAP, blkno, 0);
    seal_block(&mut b, 1);
    b
}

// ---- (1) CIL: commit and switch -------------------------------------------------------------

const DEV_BYTES: u64 = 4 << 20;

fn journal() -> Arc<Journal> {
    journal_on(Arc::new(MemDevice::new(DEV_BYTES)), Box::new(|_| {}))
}

/// A journal without background threads on `dev`, whose log header it writes first (so a copy
/// of the device can be recovered); `reuse` gets the freed extents as they become reusable.
fn journal_on(dev: Arc<MemDevice>, reuse: Box<dyn Fn(Vec<BusyExtent>) + Send + Sync>) -> Arc<Journal> {
    let opts = MkfsOptions { ag_count: Some(1), ..MkfsOptions::default() };
    let geo = mkfs::plan(DEV_BYTES, &opts).expect("geometry");
    let cfg = JournalConfig {
        cil_push_bytes: u64::MAX,
        cil_max_bytes: u64::MAX,
        background: false,
        ..JournalConfig::for_log(geo.log_blocks)
    };
    let header = LogHeader { gen: 0, epoch: 1, tail_off: 0, tail_seq: 1 };
    let log = geo.ag_layout(0).log;
    dev.write_at(&header.encode(log)[..], log * BLOCK_SIZE as u64).expect("log header");
    Journal::start(dev, geo, header, cfg, reuse)
}

/// Per inode: its owner lock, holding the next version and every (version, sequence) committed.
type Owners = Vec<CheckedMutex<(u64, Vec<(u64, u64)>)>>;
/// Per switched sequence: its merged items.
type Switched = BTreeMap<u64, HashMap<ItemKey, Option<Box<[u8]>>>>;

fn image(key: u64, version: u64) -> Vec<u8> {
    let mut img = vec![0u8; INODE_SIZE];
    img[..8].copy_from_slice(&key.to_le_bytes());
    img[8..16].copy_from_slice(&version.to_le_bytes());
    img
}

/// Three threads commit changes to two shared inodes (each change under the inode's owner
/// lock, which is where versions come from in the file system; inode 0's changes all go to
/// its own shard, as a shared directory's do, inode 1's to each thread's), a fourth switches
/// concurrently, and a final switch closes everything. Every sequence's merged items must hold,
/// for each inode, the image of the highest version whose commit returned that sequence: no
/// change is lost, none lands in a later sequence than the one its commit returned (what fsync
/// forces), and the merge across shards keeps the newest. An inode's later commits never
/// return an earlier sequence (a checkpoint holds what its changes depend on, although the
/// switch visits the shards one at a time). The CIL's byte count returns to 0, and the six
/// commits are counted exactly.
#[test]
fn cil_commit_and_switch_lose_nothing() {
    check(|| {
        let j = journal();
        let owners: Arc<Owners> = Arc::new((0..2).map(|_| CheckedMutex::new((0, Vec::new()))).collect());
        let committers: Vec<_> = (0..3u64)
            .map(|t| {
                let (j, owners) = (Arc::clone(&j), Arc::clone(&owners));
                thread::spawn(move || {
                    for n in 0..2u64 {
                        let ino = (t + n) % 2;
                        let mut o = owners[ino as usize].lock().unwrap();
                        o.0 += 1;
                        let v = o.0;
                        let route = if ino == 0 { Route::Object(ino) } else { Route::Thread };
                        let seq = j.commit(route, |w| w.log(ItemKey::Inode(ino), v, &image(ino, v), ALL_CHUNKS));
                        o.1.push((v, seq));
                    }
                })
            })
            .collect();
        let switcher = {
            let j = Arc::clone(&j);
            thread::spawn(move || j.switch_for_model())
        };
        committers.into_iter().for_each(|h| h.join().unwrap());
        let mut switched = vec![switcher.join().unwrap(), j.switch_for_model()];
        switched.sort_by_key(|(seq, _)| *seq);
        assert!(switched[0].0 < switched[1].0, "two switches closed sequence {}", switched[0].0);
        assert_eq!(j.cil_bytes(), 0, "CIL bytes left after the final switch");
        assert_eq!(j.commits(), 6, "a commit not counted, or counted twice");
        let by_seq: Switched = switched.into_iter().map(|(seq, items)| (seq, items.into_iter().collect())).collect();
        for (ino, owner) in owners.iter().enumerate() {
            let ino = ino as u64;
            let mut want: BTreeMap<u64, u64> = BTreeMap::new();
            for &(v, seq) in &owner.lock().unwrap().1 {
                let w = want.entry(seq).or_default();
                *w = (*w).max(v);
            }
            let seqs: Vec<u64> = owner.lock().unwrap().1.iter().map(|&(_, seq)| seq).collect();
            assert!(
                seqs.windows(2).all(|w| w[0] <= w[1]),
                "inode {ino}: a later commit returned an earlier sequence: {seqs:?}"
            );
            for (seq, items) in &by_seq {
                let got = items.get(&ItemKey::Inode(ino)).map(|img| img.as_deref().expect("inodes are never revoked"));
                match want.get(seq) {
                    Some(&v) => {
                        assert_eq!(got, Some(&image(ino, v)[..]), "inode {ino}, sequence {seq}: want version {v}")
                    }
                    None => assert!(got.is_none(), "inode {ino} in sequence {seq}, which no commit of it returned"),
                }
            }
        }
    });
}

// ---- (2) AgCache ----------------------------------------------------------------------------

static MODEL_CACHE: LockClass = LockClass::ranked("model-cache", 70);

struct Obj {
    referenced: AtomicBool,
}

impl Reclaimable for Obj {
    fn referenced(&self) -> &AtomicBool {
        &self.referenced
    }
    fn is_clean(&self, _home_seq: u64) -> bool {
        true
    }
}

/// Who holds which object of each key right now. A thread registers the object it got and
/// must find no other object registered for the key while anyone holds that one.
type Holders = CheckedMutex<HashMap<u64, (usize, u32)>>;

fn hold(holders: &Holders, k: u64, v: &Arc<Obj>) {
    let mut h = holders.lock().unwrap();
    let e = h.entry(k).or_insert((Arc::as_ptr(v) as usize, 0));
    assert!(e.1 == 0 || e.0 == Arc::as_ptr(v) as usize, "key {k}: two different objects held at once");
    *e = (Arc::as_ptr(v) as usize, e.1 + 1);
}

fn unhold(holders: &Holders, k: u64, v: Arc<Obj>) {
    // Unregistered before the reference goes: once it is gone the object may be evicted and
    // a new one loaded, which is fine.
    holders.lock().unwrap().get_mut(&k).expect("registered").1 -= 1;
    drop(v);
}

/// Two threads look up or insert the same keys, holding and dropping their objects (and
/// checking that what they hold stays cached); one
/// inserts, removes and drops a key of its own; two reclaim the AG (one sweep of its shards
/// each, contending for its cursor). Nobody may see an object evicted under it (which shows
/// as a second object for its key), and the AG's length counter must match the maps.
#[test]
fn ag_cache_never_evicts_a_held_object() {
    const SHARED: [u64; 2] = [1, 2];
    const OWN: u64 = 3;
    check(|| {
        let cache = Arc::new(AgCache::<Obj>::new(&MODEL_CACHE, 1, inode_ag, 0, CacheBudget::new(u64::MAX)));
        let holders = Arc::new(Holders::new(HashMap::new()));
        let mut threads = Vec::new();
        for t in 0..2 {
            let (cache, holders) = (Arc::clone(&cache), Arc::clone(&holders));
            threads.push(thread::spawn(move || {
                for k in [SHARED[t], SHARED[1 - t], SHARED[t]] {
                    let v = cache.get(k).unwrap_or_else(|| {
                        cache.get_or_insert(k, Arc::new(Obj { referenced: AtomicBool::new(false) }))
                    });
                    hold(&holders, k, &v);
                    thread::yield_now();
                    // Nobody removes the shared keys, so what is held must still be cached.
                    assert!(cache.get(k).is_some_and(|c| Arc::ptr_eq(&c, &v)), "key {k}: evicted while held");
                    unhold(&holders, k, v);
                }
            }));
        }
        {
            let cache = Arc::clone(&cache);
            threads.push(thread::spawn(move || {
                let own = cache.get_or_insert(OWN, Arc::new(Obj { referenced: AtomicBool::new(false) }));
                cache.remove_if(OWN, &own);
                drop(own);
                drop(cache.get_or_insert(OWN, Arc::new(Obj { referenced: AtomicBool::new(false) })));
            }));
        }
        for _ in 0..2 {
            let cache = Arc::clone(&cache);
            threads.push(thread::spawn(move || {
                for _ in 0..8 {
                    cache.reclaim_ag(0, u64::MAX);
                }
            }));
        }
        threads.into_iter().for_each(|h| h.join().unwrap());
        let present = SHARED.iter().chain([&OWN]).filter(|&&k| cache.get(k).is_some()).count() as u64;
        assert_eq!(cache.len(), present, "the AG's length counter disagrees with its maps");
    });
}

/// A file system as the budget sees it: `dirty` bytes only `write_home` makes reclaimable,
/// `clean` bytes any sweep drops.
struct FakeOwner {
    dirty: shuttle::sync::atomic::AtomicU64,
    clean: shuttle::sync::atomic::AtomicU64,
    homes: shuttle::sync::atomic::AtomicU64,
}

impl CacheOwner for FakeOwner {
    fn cache_bytes(&self) -> u64 {
        self.dirty.load(SeqCst) + self.clean.load(SeqCst)
    }
    fn log_bytes(&self) -> u64 {
        0
    }
    fn ag_count(&self) -> u32 {
        1
    }
    fn reclaim_ag(&self, _ag: u32) -> Option<u64> {
        Some(self.clean.swap(0, SeqCst))
    }
    fn push_dirty(&self) {}
    fn write_home(&self) {
        self.clean.fetch_add(self.dirty.swap(0, SeqCst), SeqCst);
        self.homes.fetch_add(1, SeqCst);
    }
    fn home_seq(&self) -> u64 {
        self.homes.load(SeqCst)
    }
}

/// The dirty throttle: two transactions begin (`throttle`) and dirty bytes, checking the
/// budget as inserts do; a lookup adds clean bytes and checks. Everyone finishes (the
/// throttled wait for the one that writes home), and afterwards one more transaction begins
/// alone: it must find the budget under its limit or bring it under, with nothing left
/// flagged.
#[test]
fn the_dirty_throttle_writes_home_and_lets_everyone_through() {
    const LIMIT: u64 = 800;
    check(|| {
        let owner = Arc::new(FakeOwner { dirty: 900.into(), clean: 0.into(), homes: 0.into() });
        let budget = CacheBudget::new(LIMIT);
        budget.join(Arc::downgrade(&owner) as std::sync::Weak<dyn CacheOwner>);
        budget.check();
        assert!(budget.is_over(), "900 dirty bytes are over a limit of {LIMIT}");
        let mut threads: Vec<_> = (0..2)
            .map(|_| {
                let (owner, budget) = (Arc::clone(&owner), Arc::clone(&budget));
                thread::spawn(move || {
                    for _ in 0..2 {
                        budget.throttle();
                        owner.dirty.fetch_add(100, SeqCst);
                        budget.check();
                    }
                })
            })
            .collect();
        {
            let (owner, budget) = (Arc::clone(&owner), Arc::clone(&budget));
            threads.push(thread::spawn(move || {
                owner.clean.fetch_add(100, SeqCst);
                budget.check();
            }));
        }
        threads.into_iter().for_each(|h| h.join().unwrap());
        assert!(owner.homes.load(SeqCst) > 0, "a throttled transaction wrote home");
        budget.throttle();
        assert!(!budget.is_over(), "the budget stays flagged over");
        let used = budget.used();
        assert!(used <= LIMIT, "{used} bytes left over a limit of {LIMIT} after a lone throttle");
    });
}

// ---- (3) Orphan slots -----------------------------------------------------------------------

/// Three threads take orphan slots in one AG as transactions do: claim, then either commit the
/// orphan (written into the table, later cleared, which frees the slot) or abort (unclaim).
/// No slot may be handed to two inodes at once, a committed slot must be empty on disk, and
/// the slots given back must come out again once each.
#[test]
fn orphan_slots_are_never_shared() {
    check(|| {
        let dev = Arc::new(MemDevice::new(DEV_BYTES));
        let opts = MkfsOptions { ag_count: Some(1), ..MkfsOptions::default() };
        let geo = mkfs::mkfs(&*dev, &opts, &|_, _| {}).expect("mkfs").geo;
        let bufs = BufCache::new(dev, geo.ag_count, geo.ag_blocks, CacheBudget::new(u64::MAX));
        let ag = Arc::new(Ag::load(&bufs, &geo, 0).expect("load AG 0"));
        let owned = Arc::new(CheckedMutex::new(HashSet::new()));
        let threads: Vec<_> = (0..3u64)
            .map(|t| {
                let (ag, owned) = (Arc::clone(&ag), Arc::clone(&owned));
                thread::spawn(move || {
                    let ino = 100 + t;
                    let slot = ag.claim_orphan_slot().expect("a free slot");
                    assert!(owned.lock().unwrap().insert(slot), "slot {slot} handed out twice");
                    if t == 0 {
                        owned.lock().unwrap().remove(&slot);
                        ag.unclaim_orphan_slot(&mut ag.lock(), slot);
                        return;
                    }
                    {
                        let mut s = ag.lock();
                        assert!(!ag.orphans().iter().any(|&(sl, _)| sl == slot), "slot {slot} already holds an orphan");
                        ag.set_disk_orphan(&mut s, slot, ino);
                    }
                    owned.lock().unwrap().remove(&slot);
                    ag.set_disk_orphan(&mut ag.lock(), slot, 0);
                })
            })
            .collect();
        threads.into_iter().for_each(|h| h.join().unwrap());
        assert!(ag.orphans().is_empty(), "orphans left: {:?}", ag.orphans());
        let again: HashSet<u32> = (0..4).map(|_| ag.claim_orphan_slot().expect("a free slot")).collect();
        assert_eq!(again.len(), 4, "a released slot is free twice");
    });
}

// ---- (4) lockstat counters ------------------------------------------------------------------

static MODEL_POOLED: LockClass = LockClass::new("model-pooled");
static MODEL_OWN: LockClass = LockClass::new("model-own");

fn acquisitions(class: &LockClass) -> u64 {
    lockstat::snapshot()
        .into_iter()
        .find(|c| c.name == class.name())
        .map_or(0, |c| c.total.exclusive.acquisitions + c.total.shared.acquisitions)
}

/// More threads than a class has pool shards, so some share one, each lock a pooled mutex, a
/// pooled rwlock (both sides) and a registered mutex: the class totals and the registered
/// lock's own counters must grow by exactly the acquisitions made.
#[test]
fn lock_counters_add_up() {
    const THREADS: u64 = POOL_SHARDS as u64 + 1;
    check(|| {
        let (pooled0, own0) = (acquisitions(&MODEL_POOLED), acquisitions(&MODEL_OWN));
        let locks = Arc::new((
            Mutex::new_pooled(&MODEL_POOLED, 0u64),
            RwLock::new_pooled(&MODEL_POOLED, 0u64),
            Mutex::new(&MODEL_OWN, 0u64),
        ));
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let locks = Arc::clone(&locks);
                thread::spawn(move || {
                    *locks.0.lock() += 1;
                    if t % 2 == 0 {
                        *locks.1.write() += 1;
                    } else {
                        drop(locks.1.read());
                    }
                    *locks.2.lock() += 1;
                })
            })
            .collect();
        threads.into_iter().for_each(|h| h.join().unwrap());
        let own = locks.2.stats();
        assert_eq!(own.exclusive.acquisitions, THREADS, "registered mutex counted {own:?}");
        assert_eq!(acquisitions(&MODEL_POOLED) - pooled0, 2 * THREADS, "pooled acquisitions");
        assert_eq!(acquisitions(&MODEL_OWN) - own0, THREADS, "registered acquisitions in the class");
    });
}

// ---- (5) AIL writeback and freed blocks -----------------------------------------------------

/// A tree node logged in one checkpoint is freed in the next while a writeback of the first
/// runs. The freed block may be reused (here: file data written in place, as a write to a new
/// extent does) only once that writeback can no longer write the node's stale image over it.
/// The free's checkpoint logs 70 other blocks with it, and each must reach home: the
/// writeback may take the record in before or after its revoke becomes durable, and skips as
/// superseded only what a record it took in logged again.
#[test]
fn a_freed_block_is_reused_only_after_the_writeback_that_may_hold_it() {
    const NODE: u64 = 600;
    const DATA: u8 = 0xd5;
    const OTHERS: u64 = 70;
    check(|| {
        let dev = Arc::new(MemDevice::new(DEV_BYTES));
        let disk = Arc::clone(&dev);
        let j = journal_on(
            Arc::clone(&dev),
            Box::new(move |freed| {
                if freed.iter().any(|e| (e.blkno..e.blkno + e.len as u64).contains(&NODE)) {
                    disk.write_at(&[DATA; BLOCK_SIZE], NODE * BLOCK_SIZE as u64).expect("data write");
                }
            }),
        );
        j.commit(Route::Thread, |w| w.log(ItemKey::Block(NODE), 1, &sealed_block(NODE, 0x54), ALL_CHUNKS));
        j.checkpoint().expect("checkpoint of the node");
        let writer = {
            let j = Arc::clone(&j);
            thread::spawn(move || j.quiesce().expect("writeback"))
        };
        let seq = j.commit(Route::Thread, |w| {
            for b in NODE + 1..=NODE + OTHERS {
                w.log(ItemKey::Block(b), 1, &sealed_block(b, 0x0b), ALL_CHUNKS);
            }
            w.revoke(NODE, 2);
            w.busy(BusyExtent { blkno: NODE, len: 1 });
        });
        j.force(seq).expect("checkpoint of the free");
        writer.join().unwrap();
        j.quiesce().expect("final writeback");
        let mut home = vec![0u8; BLOCK_SIZE];
        dev.read_at(&mut home, NODE * BLOCK_SIZE as u64).unwrap();
        assert!(
            home.iter().all(|&b| b == DATA),
            "the data written into the reused block was overwritten (first byte {:#x})",
            home[0]
        );
        for b in NODE + 1..=NODE + OTHERS {
            dev.read_at(&mut home, b * BLOCK_SIZE as u64).unwrap();
            // Past the header, which sealing fills in (crc, lsn).
            assert!(home[HDR_SIZE..].iter().all(|&x| x == 0x0b), "block {b}, logged with the free, never written home");
        }
    });
}

// ---- (6) Checkpoints in flight ----------------------------------------------------------------

/// Three threads each commit a block of their own and force it, so several checkpoints are in
/// flight at once (a record is built and written with no lock held). Whenever a force returns,
/// a crash at that moment keeps its change: recovery of a copy of the device as it is then
/// replays the block. A record acknowledged before an earlier one was written would be lost
/// (recovery stops at the first missing record), as would one whose space was claimed out of
/// sequence order.
#[test]
fn a_forced_change_survives_a_crash_while_other_checkpoints_are_in_flight() {
    const THREADS: u64 = 3;
    const FIRST: u64 = 600;
    check(|| {
        let dev = Arc::new(MemDevice::new(DEV_BYTES));
        let j = journal_on(Arc::clone(&dev), Box::new(|_| {}));
        let geo = *j.geometry();
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                let (j, dev) = (Arc::clone(&j), Arc::clone(&dev));
                thread::spawn(move || {
                    let blkno = FIRST + t;
                    let fill = t as u8 + 1;
                    let seq = j.commit(Route::Thread, |w| {
                        w.log(ItemKey::Block(blkno), 1, &sealed_block(blkno, fill), ALL_CHUNKS)
                    });
                    j.force(seq).expect("force");
                    let crashed = dev.snapshot();
                    recover(&crashed, &geo, true).expect("recovery");
                    let mut home = vec![0u8; BLOCK_SIZE];
                    crashed.read_at(&mut home, blkno * BLOCK_SIZE as u64).unwrap();
                    // Past the common header, which the checkpoint seals.
                    assert!(
                        home[64..].iter().all(|&b| b == fill),
                        "thread {t}: a crash right after its force lost block {blkno}"
                    );
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    });
}
